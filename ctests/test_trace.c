/* Call traces: skv_cache_set_trace and SKV_TRACE write one JSON object per call. */
#define _POSIX_C_SOURCE 200809L
#include <stdlib.h>
#include <unistd.h>

#include "common.h"

/* The whole file as a string (caller frees), and its line count. */
static char *slurp(const char *path, int *lines) {
  FILE *f = fopen(path, "rb");
  char *buf;
  long n;
  int i;
  *lines = 0;
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  n = ftell(f);
  fseek(f, 0, SEEK_SET);
  buf = malloc((size_t)n + 1);
  if (fread(buf, 1, (size_t)n, f) != (size_t)n) n = 0;
  buf[n] = '\0';
  fclose(f);
  for (i = 0; i < n; i++) *lines += buf[i] == '\n';
  return buf;
}

static skv_cache_config owned_config(void) {
  skv_cache_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.struct_size = sizeof cfg;
  cfg.page_size = 4;
  cfg.num_token_slots = 256;
  cfg.num_rows = 8;
  cfg.max_context_len = 128;
  return cfg;
}

static skv_cache *owned_cache(void) {
  skv_cache_config cfg = owned_config();
  skv_cache *c = NULL;
  CHECK_OK(skv_cache_new(&cfg, &c));
  return c;
}

int main(void) {
  char path[] = "/tmp/skv_trace_XXXXXX";
  int fd = mkstemp(path), lines;
  char *text;
  skv_cache *c, *d;
  skv_req r;
  skv_match m;
  skv_stats s;
  CHECK(fd >= 0);
  close(fd);

  c = owned_cache();
  CHECK_OK(skv_cache_set_trace(c, path));
  CHECK_OK(skv_req_init(&r));
  r.origin_input_len = 6;
  CHECK_OK(skv_match_prefix(c, 7, 0, &r, 5, 0, &m));                 /* line 1: a miss */
  CHECK_OK(skv_alloc_row(c, &r));                                    /* 2 */
  CHECK_OK(skv_alloc_extend(c, &r, 9));                              /* 3 */
  CHECK_OK(skv_commit(c, &r, 8));                                    /* 4 */
  r.output_len = 3;
  r.finished_len = 0;
  CHECK_OK(skv_cache_finished_req(c, 7, 0, &r, 0));                  /* 5: trims 9 -> 6 */
  CHECK_STATUS(skv_commit(c, &r, 1), SKV_ERR_INVALID_ARG);           /* 6: holds no row */
  CHECK_OK(skv_cache_stats(c, &s));                                  /* 7 */
  CHECK_OK(skv_cache_set_trace(c, NULL));                            /* stops; not traced */
  CHECK_OK(skv_release_session(c, 7));                               /* not traced */

  text = slurp(path, &lines);
  CHECK(text != NULL);
  CHECK_EQ_INT(lines, 7);
  if (text) {
    CHECK_STR_CONTAINS(text, "{\"fn\":\"skv_match_prefix\",\"session_id\":7,\"branch_id\":0,\"req\":{\"req_pool_idx\":-1");
    CHECK_STR_CONTAINS(text, "\"out\":{\"hit\":0,\"prefix_len\":0}");
    CHECK_STR_CONTAINS(text, "{\"fn\":\"skv_alloc_extend\"");
    CHECK_STR_CONTAINS(text, "\"n_tokens\":9,\"status\":\"SKV_OK\",\"req_out\":{\"req_pool_idx\":0,\"kv_committed_len\":0,\"kv_allocated_len\":9");
    CHECK_STR_CONTAINS(text, "{\"fn\":\"skv_cache_finished_req\",\"session_id\":7");
    CHECK_STR_CONTAINS(text, "\"req_out\":{\"req_pool_idx\":-1,\"kv_committed_len\":0,\"kv_allocated_len\":0");
    CHECK_STR_CONTAINS(text, "\"status\":\"SKV_ERR_INVALID_ARG\",\"error\":\"skv_commit: req_pool_idx -1: the req holds no row\"}");
    CHECK(strstr(text, "skv_release_session") == NULL);
    CHECK(strstr(text, "skv_cache_set_trace") == NULL);
  }
  free(text);

  /* a path that cannot be opened is refused and tracing stays as it was */
  CHECK_STATUS(skv_cache_set_trace(c, "/nonexistent-dir/trace.jsonl"), SKV_ERR_INVALID_ARG);
  CHECK_MSG_HAS("skv_cache_set_trace");
  CHECK_MSG_HAS("/nonexistent-dir/trace.jsonl");
  CHECK_STATUS(skv_cache_set_trace(NULL, path), SKV_ERR_NULL_ARG);
  CHECK_OK(skv_cache_stats(c, &s));
  text = slurp(path, &lines);
  CHECK_EQ_INT(lines, 7);
  free(text);
  skv_cache_free(c);

  /* SKV_TRACE traces every new handle; appends to what is there */
  CHECK(setenv("SKV_TRACE", path, 1) == 0);
  d = owned_cache();
  CHECK_OK(skv_cache_stats(d, &s));
  text = slurp(path, &lines);
  CHECK_EQ_INT(lines, 8);
  if (text) CHECK_STR_CONTAINS(text, "{\"fn\":\"skv_cache_stats\",\"status\":\"SKV_OK\"}\n");
  free(text);
  skv_cache_free(d);
  CHECK(setenv("SKV_TRACE", "/nonexistent-dir/trace.jsonl", 1) == 0);
  {
    skv_cache_config cfg = owned_config();
    skv_cache *e = NULL;
    CHECK_STATUS(skv_cache_new(&cfg, &e), SKV_ERR_INVALID_ARG);
    CHECK_MSG_HAS("SKV_TRACE");
    CHECK(e == NULL);
  }
  CHECK(unsetenv("SKV_TRACE") == 0);
  unlink(path);
  return ctest_summary();
}
