/* Call traces: skv_cache_set_trace and SKV_TRACE write one JSON object per call. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
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

/* Two threads allocate and free the only two pages of a pool through one traced handle; the
 * trace, replayed in line order, must never hand out a held page nor free a free one. */
static skv_cache *contended;

static void *churn(void *arg) {
  int i, pages[4];
  (void)arg;
  for (i = 0; i < 2000; i++) {
    if (skv_pool_alloc(contended, 4, pages) == SKV_OK) skv_pool_free(contended, pages, 4);
  }
  return NULL;
}

/* The page ids listed after `key` in one line, or -1 when the key is absent. */
static int pages_after(const char *line, const char *key, int *out, int cap) {
  const char *p = strstr(line, key);
  int n = 0;
  if (!p) return -1;
  p += strlen(key);
  while (*p && *p != ']' && n < cap) {
    out[n++] = (int)strtol(p, (char **)&p, 10) / 4;
    if (*p == ',') p++;
  }
  return n;
}

static void trace_order_under_threads(const char *path) {
  skv_cache_config cfg;
  pthread_t a, b;
  FILE *f;
  char line[4096];
  int held[4] = {0, 0, 0, 0}, bad = 0, replayed = 0;
  memset(&cfg, 0, sizeof cfg);
  cfg.struct_size = sizeof cfg;
  cfg.page_size = 4;
  cfg.num_token_slots = 12; /* pages 1 and 2 usable */
  cfg.num_rows = 1;
  cfg.max_context_len = 8;
  CHECK_OK(skv_cache_new(&cfg, &contended));
  CHECK_OK(skv_cache_set_trace(contended, path));
  pthread_create(&a, NULL, churn, NULL);
  pthread_create(&b, NULL, churn, NULL);
  pthread_join(a, NULL);
  pthread_join(b, NULL);
  skv_cache_free(contended);
  f = fopen(path, "r");
  CHECK(f != NULL);
  while (f && fgets(line, sizeof line, f)) {
    int pages[4], n, i;
    if (!strstr(line, "\"status\":\"SKV_OK\"")) continue;
    /* each call moves one page: its four indices share it */
    if ((n = pages_after(line, "\"out_indices\":[", pages, 4)) > 0) {
      for (i = 1; i < n; i++) bad += pages[i] != pages[0];
      bad += held[pages[0]]++ != 0;
      replayed++;
    } else if (strstr(line, "skv_pool_free") && (n = pages_after(line, "\"indices\":[", pages, 4)) > 0) {
      bad += held[pages[0]]-- != 1;
      replayed++;
    }
  }
  if (f) fclose(f);
  CHECK(replayed > 100);
  CHECK_EQ_INT(bad, 0);
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
  CHECK_OK(skv_alloc_extend(c, &r, 9, NULL));                              /* 3 */
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
  CHECK_EQ_INT(lines, 8);
  if (text) {
    CHECK(strncmp(text, "{\"h\":", 5) == 0);
    CHECK_STR_CONTAINS(text, "\"fn\":\"trace_start\",\"mode\":\"owned\",\"page_size\":4,\"num_token_slots\":256");
    CHECK_STR_CONTAINS(text, "\"fn\":\"skv_match_prefix\",\"session_id\":7,\"branch_id\":0,\"req\":{\"req_pool_idx\":-1");
    CHECK_STR_CONTAINS(text, "\"out\":{\"hit\":0,\"prefix_len\":0}");
    CHECK_STR_CONTAINS(text, "\"fn\":\"skv_alloc_extend\"");
    CHECK_STR_CONTAINS(text, "\"n_tokens\":9,\"status\":\"SKV_OK\",\"req_out\":{\"req_pool_idx\":0,\"row_generation\":1,\"kv_committed_len\":0,\"kv_allocated_len\":9");
    CHECK_STR_CONTAINS(text, "\"fn\":\"skv_cache_finished_req\",\"session_id\":7");
    CHECK_STR_CONTAINS(text, "\"req_out\":{\"req_pool_idx\":-1,\"row_generation\":0,\"kv_committed_len\":0,\"kv_allocated_len\":0");
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
  CHECK_EQ_INT(lines, 8);
  free(text);
  skv_cache_free(c);

  /* SKV_TRACE traces every new handle; appends to what is there */
  CHECK(setenv("SKV_TRACE", path, 1) == 0);
  d = owned_cache();
  CHECK_OK(skv_cache_stats(d, &s));
  text = slurp(path, &lines);
  CHECK_EQ_INT(lines, 10);
  if (text) CHECK_STR_CONTAINS(text, "\"fn\":\"skv_cache_stats\",\"status\":\"SKV_OK\",\"free_pages\":63");
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
  trace_order_under_threads(path);
  unlink(path);
  return ctest_summary();
}
