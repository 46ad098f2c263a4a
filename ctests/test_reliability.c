/* Hostile-input regressions (issue 9): versioned struct sizes, traced calls given arrays no
 * caller could own, calls made from inside callbacks, stale reqs on reused rows, and
 * skv_row_indices on an external handle. */
#include <pthread.h>

#include "common.h"

static skv_cache_config owned_cfg(void) {
  skv_cache_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.struct_size = (uint32_t)sizeof cfg;
  cfg.page_size = 4;
  cfg.num_token_slots = 64 * 4;
  cfg.num_rows = 8;
  cfg.max_context_len = 64;
  return cfg;
}

static skv_cache *owned_new(void) {
  skv_cache_config cfg = owned_cfg();
  skv_cache *c = NULL;
  CHECK_OK(skv_cache_new(&cfg, &c));
  return c;
}

/* ------------------------------------------------- versioned struct sizes */

/* A struct from some header, in a buffer with room for a longer one. */
#define VERSIONED(type)                                                                \
  union {                                                                              \
    type s;                                                                            \
    unsigned char bytes[64 + sizeof(type)];                                            \
  }

static void versioned_config(void) {
  VERSIONED(skv_cache_config) v;
  skv_cache *c = NULL;
  memset(&v, 0, sizeof v);
  v.s = owned_cfg();
  /* the first published size */
  v.s.struct_size = 32;
  CHECK_OK(skv_cache_new(&v.s, &c));
  skv_cache_free(c);
  c = NULL;
  /* a newer header's longer struct whose unknown tail is zero */
  v.s.struct_size = 40;
  CHECK_OK(skv_cache_new(&v.s, &c));
  skv_cache_free(c);
  c = NULL;
  /* a field this library does not know */
  v.bytes[36] = 1;
  CHECK_STATUS(skv_cache_new(&v.s, &c), SKV_ERR_INVALID_ARG);
  CHECK_MSG_HAS("skv_cache_new");
  CHECK_MSG_HAS("byte 36");
  CHECK(c == NULL);
  v.bytes[36] = 0;
  /* shorter than any published struct */
  v.s.struct_size = 16;
  CHECK_STATUS(skv_cache_new(&v.s, &c), SKV_ERR_INVALID_ARG);
  CHECK_MSG_HAS("struct_size 16");
  CHECK(c == NULL);
}

static void versioned_pool_ops(void) {
  fake_engine fe;
  VERSIONED(skv_pool_ops) v;
  skv_cache_config cfg;
  skv_cache *c = NULL;
  fe_init(&fe, 4, 32);
  cfg = fe_config(&fe, 1, 0);
  memset(&v, 0, sizeof v);
  v.s = fe_ops();
  v.s.struct_size = 48;
  CHECK_OK(skv_cache_new_external(&cfg, &v.s, &fe, &c));
  skv_cache_free(c);
  c = NULL;
  v.s.struct_size = 56;
  CHECK_OK(skv_cache_new_external(&cfg, &v.s, &fe, &c));
  skv_cache_free(c);
  c = NULL;
  v.bytes[52] = 7;
  CHECK_STATUS(skv_cache_new_external(&cfg, &v.s, &fe, &c), SKV_ERR_INVALID_ARG);
  CHECK_MSG_HAS("byte 52");
  CHECK(c == NULL);
  v.bytes[52] = 0;
  v.s.struct_size = 16;
  CHECK_STATUS(skv_cache_new_external(&cfg, &v.s, &fe, &c), SKV_ERR_INVALID_ARG);
  CHECK_MSG_HAS("struct_size 16");
  CHECK(c == NULL);
  CHECK_NO_CALLS(&fe);
  fe_free(&fe);
}

static void versioned_hooks(void) {
  fake_engine fe;
  VERSIONED(skv_engine_hooks) v;
  skv_cache *c = owned_new();
  fe_init(&fe, 4, 32);
  memset(&v, 0, sizeof v);
  v.s.dec_lock_ref = fe_cb_dec_lock;
  v.s.free_aux = fe_cb_free_aux;
  v.s.struct_size = 24;
  CHECK_OK(skv_cache_set_hooks(c, &v.s, &fe));
  v.s.struct_size = 32;
  CHECK_OK(skv_cache_set_hooks(c, &v.s, &fe));
  v.bytes[28] = 1;
  CHECK_STATUS(skv_cache_set_hooks(c, &v.s, &fe), SKV_ERR_INVALID_ARG);
  CHECK_MSG_HAS("byte 28");
  v.bytes[28] = 0;
  v.s.struct_size = 16;
  CHECK_STATUS(skv_cache_set_hooks(c, &v.s, &fe), SKV_ERR_INVALID_ARG);
  CHECK_MSG_HAS("struct_size 16");
  skv_cache_free(c);
  fe_free(&fe);
}

int main(void) {
  versioned_config();
  versioned_pool_ops();
  versioned_hooks();
  return ctest_summary();
}
