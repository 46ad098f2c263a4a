/* An owned-mode streaming session through the C API, as a CMake consumer builds it:
 * three turns of one session with speculative-decoding overshoot trimmed at each finish,
 * the last one aborted by its client. Pages are 16 tokens; page 0 is the padding page. */
#include <skv.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failed;

#define OK(call)                                                                        \
  do {                                                                                  \
    skv_status s_ = (call);                                                             \
    if (s_ != SKV_OK) {                                                                 \
      fprintf(stderr, "%s:%d: %s: %s: %s\n", __FILE__, __LINE__, #call,                 \
              skv_status_str(s_), skv_last_error());                                    \
      exit(1);                                                                          \
    }                                                                                   \
  } while (0)

#define EQ(a, b)                                                                        \
  do {                                                                                  \
    long long a_ = (long long)(a), b_ = (long long)(b);                                 \
    if (a_ != b_) {                                                                     \
      fprintf(stderr, "%s:%d: %s == %s: %lld != %lld\n", __FILE__, __LINE__, #a, #b,    \
              a_, b_);                                                                  \
      failed++;                                                                         \
    }                                                                                   \
  } while (0)

enum { PS = 16, PAGES = 64, ROWS = 8, SESSION = 7 };

static skv_stats stats(skv_cache *c) {
  skv_stats s;
  OK(skv_cache_stats(c, &s));
  return s;
}

static void audit(skv_cache *c) {
  skv_check_report r;
  OK(skv_cache_check(c, &r));
  if (r.violations != 0) {
    fprintf(stderr, "audit: %llu violations, first: %s\n", (unsigned long long)r.violations,
            r.first_violation);
    failed++;
  }
  EQ(r.pages_free + r.pages_in_rows + r.pages_engine_held, PAGES - 1);
}

/* Prefill `prompt` tokens past the restored prefix, then `rounds` verify rounds of
 * `per_round` speculative tokens each. */
static void run_turn(skv_cache *c, skv_req *req, uint32_t prompt, uint32_t rounds,
                     uint32_t per_round) {
  uint32_t i;
  OK(skv_alloc_extend(c, req, prompt, NULL));
  OK(skv_commit(c, req, prompt));
  for (i = 0; i < rounds; i++) {
    OK(skv_alloc_extend(c, req, per_round, NULL));
    OK(skv_commit(c, req, per_round));
  }
  req->output_len = rounds * per_round;
}

int main(void) {
  skv_cache_config cfg;
  skv_cache *c = NULL;
  skv_req req;
  skv_match m;
  skv_held held;
  skv_stats st;
  int32_t row;

  memset(&cfg, 0, sizeof cfg);
  cfg.struct_size = sizeof cfg;
  cfg.page_size = PS;
  cfg.num_token_slots = (uint64_t)PS * PAGES;
  cfg.num_rows = ROWS;
  cfg.max_context_len = 512;
  OK(skv_cache_new(&cfg, &c));
  EQ(skv_abi_version(), SKV_ABI_VERSION);
  st = stats(c);
  EQ(st.total_pages, PAGES);
  EQ(st.free_pages, PAGES - 1);
  EQ(st.free_rows, ROWS);

  /* Turn 1: a 40-token prompt, five rounds of 4 draft tokens; the stop token came 8
   * tokens into the output, so KV for 12 tokens past it must go. */
  OK(skv_req_init(&req));
  req.origin_input_len = 40;
  OK(skv_match_prefix(c, SESSION, 0, &req, 39, 0, &m));
  EQ(m.hit, 0);
  OK(skv_alloc_row(c, &req));
  row = req.req_pool_idx;
  EQ(row >= 0, 1);
  run_turn(c, &req, 40, 5, 4);
  EQ(req.kv_allocated_len, 60);
  EQ(stats(c).used_pages, 4);
  req.finished_len = 8;
  OK(skv_cache_finished_req(c, SESSION, 0, &req, 0));
  EQ(req.req_pool_idx, -1);
  EQ(req.kv_allocated_len, 0);
  EQ(req.output_len, 8);
  st = stats(c);
  EQ(st.used_pages, 3); /* positions 0..47: the page of 48..59 went back */
  EQ(st.trimmed_tokens, 12);
  EQ(st.sessions, 1);
  EQ(st.free_rows, ROWS - 1);
  OK(skv_session_held(c, NULL, 0, &held));
  EQ(held.full_tokens, 48);
  EQ(held.rows, 1);
  EQ(held.sessions, 1);
  OK(skv_session_held(c, &row, 1, &held)); /* a running request's row is not held */
  EQ(held.rows, 0);
  audit(c);

  /* Turn 2: the session's 48 tokens plus 6 new ones; the stop token lands inside the
   * last page, which keeps its committed tokens. */
  OK(skv_req_init(&req));
  req.origin_input_len = 54;
  OK(skv_match_prefix(c, SESSION, 0, &req, 53, 0, &m));
  EQ(m.hit, 1);
  EQ(m.prefix_len, 48);
  EQ(req.req_pool_idx, row);
  EQ(req.kv_committed_len, 48);
  run_turn(c, &req, 6, 2, 4);
  EQ(req.kv_allocated_len, 62);
  req.finished_len = 5;
  OK(skv_cache_finished_req(c, SESSION, 0, &req, 0));
  EQ(req.output_len, 5);
  EQ(stats(c).used_pages, 4); /* 59 tokens: the partial page 48..63 stays */
  audit(c);

  /* Turn 3 continues inside that page, then its client goes away: everything goes. */
  OK(skv_req_init(&req));
  req.origin_input_len = 62;
  OK(skv_match_prefix(c, SESSION, 0, &req, 61, 0, &m));
  EQ(m.hit, 1);
  EQ(m.prefix_len, 59);
  run_turn(c, &req, 3, 0, 0);
  EQ(stats(c).used_pages, 4);
  OK(skv_cache_finished_req(c, SESSION, 0, &req, 1));
  EQ(req.req_pool_idx, -1);
  st = stats(c);
  EQ(st.used_pages, 0);
  EQ(st.free_pages, PAGES - 1);
  EQ(st.free_rows, ROWS);
  EQ(st.sessions, 0);
  OK(skv_release_session(c, SESSION)); /* nothing left: still fine */
  audit(c);

  /* A failing call names itself; a successful one clears the message. */
  OK(skv_req_init(&req));
  OK(skv_alloc_row(c, &req));
  EQ(skv_commit(c, &req, 1), SKV_ERR_INVALID_ARG); /* nothing allocated to commit */
  EQ(strstr(skv_last_error(), "commit") != NULL, 1);
  OK(skv_free_req(c, &req));
  EQ(skv_last_error()[0], '\0');
  EQ(stats(c).free_rows, ROWS);

  skv_cache_free(c);
  skv_cache_free(NULL);
  if (failed) fprintf(stderr, "turn.c: %d check(s) failed\n", failed);
  else printf("turn.c: owned-mode session of three turns passed\n");
  return failed ? 1 : 0;
}
