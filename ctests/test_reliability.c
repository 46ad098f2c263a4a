/* Hostile-input regressions (issue 9): versioned struct sizes, traced calls given arrays no
 * caller could own, calls made from inside callbacks, stale reqs on reused rows, and
 * skv_row_indices on an external handle. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdint.h>
#include <unistd.h>

#include "common.h"

/* The whole file as a string (caller frees). */
static char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  char *buf;
  long n;
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  n = ftell(f);
  fseek(f, 0, SEEK_SET);
  buf = malloc((size_t)n + 1);
  if (fread(buf, 1, (size_t)n, f) != (size_t)n) n = 0;
  buf[n] = '\0';
  fclose(f);
  return buf;
}

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

/* ------------------------------------------- traced calls and hostile arrays */

/* A traced handle reads no array before the body's own checks: lengths no array can have
 * are SKV_ERR_INVALID_ARG as untraced, and the trace says the array was invalid. */
static void traced_hostile_arrays(void) {
  char path[] = "/tmp/skv_rel_trace_XXXXXX";
  int fd = mkstemp(path), a[4] = {4, 5, 6, 7}, indptr[2], indices[4], last[1];
  uint32_t counts[4];
  size_t huge = SIZE_MAX / 2, needed = 0;
  skv_held h;
  skv_cache *c = owned_new();
  uint32_t *four;
  char *text;
  CHECK(fd >= 0);
  close(fd);
  CHECK_OK(skv_cache_set_trace(c, path));
  CHECK_STATUS(skv_session_held(c, a, huge, &h), SKV_ERR_INVALID_ARG);
  CHECK_MSG_HAS("skv_session_held");
  CHECK_STATUS(skv_pool_free(c, a, huge), SKV_ERR_INVALID_ARG);
  CHECK_MSG_HAS("skv_pool_free");
  CHECK_STATUS(skv_page_refs(c, a, huge, counts), SKV_ERR_INVALID_ARG);
  CHECK_MSG_HAS("skv_page_refs");
  CHECK_STATUS(skv_build_flashinfer(c, a, huge, indptr, indices, last, 4, &needed),
               SKV_ERR_INVALID_ARG);
  CHECK_MSG_HAS("skv_build_flashinfer");
  /* a hooks struct of 4 bytes, on the heap so a sanitizer sees any read past it */
  four = malloc(sizeof *four);
  *four = 4;
  CHECK_STATUS(skv_cache_set_hooks(c, (const skv_engine_hooks *)(void *)four, NULL),
               SKV_ERR_INVALID_ARG);
  CHECK_MSG_HAS("struct_size 4");
  free(four);
  /* the same arrays with real lengths are traced in full */
  CHECK_OK(skv_session_held(c, a, 4, &h));
  CHECK_OK(skv_cache_set_trace(c, NULL));
  text = slurp(path);
  CHECK(text != NULL);
  if (text) {
    CHECK_STR_CONTAINS(text, "\"fn\":\"skv_session_held\",\"active_rows\":\"invalid\"");
    CHECK_STR_CONTAINS(text, "\"fn\":\"skv_pool_free\",\"indices\":\"invalid\"");
    CHECK_STR_CONTAINS(text, "\"fn\":\"skv_page_refs\",\"indices\":\"invalid\"");
    CHECK_STR_CONTAINS(text, "\"fn\":\"skv_build_flashinfer\",\"rows\":\"invalid\"");
    CHECK_STR_CONTAINS(text, "\"fn\":\"skv_cache_set_hooks\",\"hooks\":\"invalid\"");
    CHECK_STR_CONTAINS(text, "\"active_rows\":[4,5,6,7]");
  }
  free(text);
  unlink(path);
  skv_cache_free(c);
}

int main(void) {
  traced_hostile_arrays();
  versioned_config();
  versioned_pool_ops();
  versioned_hooks();
  return ctest_summary();
}
