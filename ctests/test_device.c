/* The device page table's entry points in a build without the cuda feature (the one this
 * suite links): every refusal is clear and changes nothing. The cuda build's own test is
 * tests/device.rs (`cargo test --features cuda --test device`). */
#include "common.h"

int main(void) {
  skv_cache_config cfg;
  skv_cache *c = NULL, *x = NULL;
  fake_engine fe;
  uint64_t ptr = 7, stride = 9;
  memset(&cfg, 0, sizeof cfg);
  cfg.struct_size = sizeof cfg;
  cfg.page_size = 16;
  cfg.num_token_slots = 1024;
  cfg.num_rows = 4;
  cfg.max_context_len = 256;
  CHECK_OK(skv_cache_new(&cfg, &c));

  CHECK_STATUS(skv_device_attach(NULL, 0, NULL), SKV_ERR_NULL_ARG);
  CHECK_STATUS(skv_device_sync(NULL, &ptr, &stride), SKV_ERR_NULL_ARG);
  CHECK_STATUS(skv_device_sync(c, NULL, &stride), SKV_ERR_NULL_ARG);
  CHECK_STATUS(skv_device_sync(c, &ptr, NULL), SKV_ERR_NULL_ARG);
  CHECK_STATUS(skv_device_attach(c, 0, NULL), SKV_ERR_UNSUPPORTED);
  CHECK_MSG_HAS("skv_device_attach");
  CHECK_MSG_HAS("cuda feature");
  CHECK_STATUS(skv_device_sync(c, &ptr, &stride), SKV_ERR_UNSUPPORTED);
  CHECK_EQ_U64(ptr, 7);
  CHECK_EQ_U64(stride, 9);

  /* external mode: the engine owns its table */
  fe_init(&fe, 4, 64);
  x = fe_cache(&fe, 16, 0);
  CHECK_STATUS(skv_device_attach(x, 0, NULL), SKV_ERR_UNSUPPORTED);
  CHECK_MSG_HAS("external mode"); /* the mode is the reason, whatever the build */
  CHECK_STATUS(skv_device_sync(x, &ptr, &stride), SKV_ERR_UNSUPPORTED);
  CHECK_MSG_HAS("external mode");
  CHECK_NO_CALLS(&fe);

  skv_cache_free(x);
  fe_free(&fe);
  skv_cache_free(c);
  return ctest_summary();
}
