/* Every error path of the status, handle (external mode) and session functions: a failing
 * call names itself in skv_last_error(), writes no req byte and no out-parameter, runs no
 * callback and leaves every slot as it was. */
#include "common.h"

#define ROWS 8
#define COLS 128
#define PS 4

/* Both a status and the function named by its message. */
#define CHECK_ERR(call, status, name)                                                  \
  do {                                                                                 \
    CHECK_STATUS(call, status);                                                        \
    CHECK_MSG_HAS(name);                                                               \
  } while (0)

static void status_strings_and_versions(void) {
  int i, j;
  const char *strs[10];
  skv_req r;
  for (i = 0; i <= 9; i++) {
    strs[i] = skv_status_str((skv_status)i);
    CHECK(strs[i] != NULL && strs[i][0] != '\0');
  }
  for (i = 0; i <= 9; i++)
    for (j = i + 1; j <= 9; j++)
      if (strs[i] && strs[j]) CHECK(strcmp(strs[i], strs[j]) != 0);
  CHECK(skv_status_str((skv_status)10) != NULL);
  CHECK(skv_status_str((skv_status)12345) != NULL);
  CHECK(skv_status_str((skv_status)0x7fffffff) != NULL);
  CHECK_EQ_INT(SKV_OK, 0);
  CHECK_EQ_INT(SKV_ERR_NULL_ARG, 1);
  CHECK_EQ_INT(SKV_ERR_INVALID_ARG, 2);
  CHECK_EQ_INT(SKV_ERR_OUT_OF_MEMORY, 3);
  CHECK_EQ_INT(SKV_ERR_NOT_FOUND, 4);
  CHECK_EQ_INT(SKV_ERR_STATE, 5);
  CHECK_EQ_INT(SKV_ERR_CALLBACK, 6);
  CHECK_EQ_INT(SKV_ERR_CUDA, 7);
  CHECK_EQ_INT(SKV_ERR_UNSUPPORTED, 8);
  CHECK_EQ_INT(SKV_ERR_INTERNAL, 9);

  CHECK_EQ_INT(skv_abi_version(), SKV_ABI_VERSION);
  CHECK(skv_version() != NULL && strlen(skv_version()) >= 5 && strchr(skv_version(), '.'));
#ifdef SKV_VERSION
  CHECK(strcmp(skv_version(), SKV_VERSION) == 0);
#endif

  skv_cache_free(NULL);

  /* the message lasts until the next call; a successful call clears it */
  CHECK_ERR(skv_req_init(NULL), SKV_ERR_NULL_ARG, "req_init");
  CHECK(strcmp(skv_last_error(), ctest_msg) == 0);
  CHECK_OK(skv_req_init(&r));
  CHECK_EQ_INT(r.req_pool_idx, -1);
  CHECK_EQ_INT(r.kv_committed_len, 0);
  CHECK_EQ_INT(r.kv_allocated_len, 0);
  CHECK_EQ_INT(r.cache_protected_len, 0);
  CHECK_EQ_INT(r.swa_evicted_seqlen, 0);
  CHECK_EQ_INT(r.origin_input_len, 0);
  CHECK_EQ_INT(r.output_len, 0);
  CHECK_EQ_INT(r.finished_len, -1);
  CHECK_EQ_U64(r.lock_node, 0);
  CHECK_EQ_U64(r.lock_receipt, 0);
  CHECK_EQ_INT(r.aux_state, -1);
}

static void bad_configs(void) {
  fake_engine fe;
  skv_cache_config cfg;
  skv_pool_ops ops;
  skv_cache *sentinel = (skv_cache *)&fe, *out;
  skv_req r;
  const fe_expect exp[] = {FE_KV(4, 10), FE_ROW(0)};
  fe_init(&fe, ROWS, COLS);

#define EXPECT_NEW_FAILS(status)                                                       \
  do {                                                                                 \
    out = sentinel;                                                                    \
    CHECK_ERR(skv_cache_new_external(&cfg, &ops, &fe, &out), status,                   \
              "cache_new_external");                                                   \
    CHECK(out == sentinel);                                                            \
    cfg = fe_config(&fe, PS, 0);                                                       \
    ops = fe_ops();                                                                    \
  } while (0)

  cfg = fe_config(&fe, PS, 0);
  ops = fe_ops();
  out = sentinel;
  CHECK_ERR(skv_cache_new_external(NULL, &ops, &fe, &out), SKV_ERR_NULL_ARG,
            "cache_new_external");
  CHECK(out == sentinel);
  CHECK_ERR(skv_cache_new_external(&cfg, NULL, &fe, &out), SKV_ERR_NULL_ARG,
            "cache_new_external");
  CHECK(out == sentinel);
  CHECK_ERR(skv_cache_new_external(&cfg, &ops, &fe, NULL), SKV_ERR_NULL_ARG,
            "cache_new_external");

  ops.read_row = NULL;
  EXPECT_NEW_FAILS(SKV_ERR_NULL_ARG);
  ops.free_kv = NULL;
  EXPECT_NEW_FAILS(SKV_ERR_NULL_ARG);
  ops.free_row = NULL;
  EXPECT_NEW_FAILS(SKV_ERR_NULL_ARG);
  /* a NULL pointer outranks a bad number */
  ops.free_row = NULL;
  cfg.page_size = 0;
  EXPECT_NEW_FAILS(SKV_ERR_NULL_ARG);

  cfg.page_size = 0;
  EXPECT_NEW_FAILS(SKV_ERR_INVALID_ARG);
  cfg.num_rows = 0;
  EXPECT_NEW_FAILS(SKV_ERR_INVALID_ARG);
  cfg.struct_size = 0;
  EXPECT_NEW_FAILS(SKV_ERR_INVALID_ARG);
  cfg.struct_size = (uint32_t)sizeof(skv_cache_config) - 4;
  EXPECT_NEW_FAILS(SKV_ERR_INVALID_ARG);
  ops.struct_size = 0;
  EXPECT_NEW_FAILS(SKV_ERR_INVALID_ARG);
  ops.struct_size = (uint32_t)sizeof(uint32_t);
  EXPECT_NEW_FAILS(SKV_ERR_INVALID_ARG);
#undef EXPECT_NEW_FAILS
  CHECK_NO_CALLS(&fe);

  /* user_data is opaque (NULL is fine); the optional callbacks may be absent, and then
   * a release with a lock and an aux state hands back only the KV and the row */
  out = NULL;
  CHECK_OK(skv_cache_new_external(&cfg, &ops, NULL, &out));
  CHECK(out != NULL);
  skv_cache_free(out);
  ops.dec_lock_ref = NULL;
  ops.free_aux = NULL;
  out = NULL;
  CHECK_OK(skv_cache_new_external(&cfg, &ops, &fe, &out));
  CHECK(out != NULL);
  if (out) {
    r = req_make(0, 10, 10);
    r.cache_protected_len = 4;
    r.lock_node = 1;
    r.lock_receipt = 2;
    r.aux_state = 3;
    CHECK_OK(skv_cache_finished_req(out, 1, 0, &r, 1));
    CHECK_FREES(&fe, exp);
    skv_cache_free(out);
  }
  fe_free(&fe);
}

/* A cache holding one idle session (1, 0) on row 0: protected 8, 24 tokens, lock 5/6,
 * aux 9. Tests check it is intact by its held numbers and by releasing it at the end. */
typedef struct world {
  fake_engine fe;
  skv_cache *c;
  skv_held held;
} world;

static void world_init(world *w) {
  fe_init(&w->fe, ROWS, COLS);
  w->c = fe_cache(&w->fe, PS, 0);
  fe_save_slot(w->c, &w->fe, 1, 0, 0, 8, 24, 5, 6, 9);
  w->held = held_of(w->c, NULL, 0);
  CHECK_HELD(w->held, 16, 16, 1, 1, 1);
}

#define CHECK_WORLD_INTACT(w)                                                          \
  do {                                                                                 \
    skv_held ctest_now_ = held_of((w)->c, NULL, 0);                                    \
    CHECK_NO_CALLS(&(w)->fe);                                                          \
    CHECK(memcmp(&ctest_now_, &(w)->held, sizeof ctest_now_) == 0);                    \
  } while (0)

static void world_finish(world *w) {
  const fe_expect exp[] = {FE_LOCK(5, 6), FE_KV(8, 24), FE_ROW(0), FE_AUX(9)};
  CHECK_WORLD_INTACT(w);
  /* not left in flight by any failed call */
  CHECK_OK(skv_release_session(w->c, 1));
  CHECK_FREES(&w->fe, exp);
  skv_cache_free(w->c);
  fe_free(&w->fe);
}

static void null_pointers(void) {
  world w;
  skv_req r, before;
  skv_match m;
  skv_held h, hs;
  uint32_t handled = 0xCCCC;
  const int32_t active[] = {0};
  world_init(&w);
  CHECK_OK(skv_req_init(&r));
  before = r;
  m.hit = 0xAAAA;
  m.prefix_len = 0xBBBB;
  memset(&hs, 0x5a, sizeof hs);
  h = hs;

  CHECK_ERR(skv_req_init(NULL), SKV_ERR_NULL_ARG, "req_init");
  CHECK_ERR(skv_match_prefix(NULL, 1, 0, &r, 10, 0, &m), SKV_ERR_NULL_ARG, "match_prefix");
  CHECK_ERR(skv_match_prefix(w.c, 1, 0, NULL, 10, 0, &m), SKV_ERR_NULL_ARG, "match_prefix");
  CHECK_ERR(skv_match_prefix(w.c, 1, 0, &r, 10, 0, NULL), SKV_ERR_NULL_ARG, "match_prefix");
  CHECK_ERR(skv_cache_finished_req(NULL, 1, 0, &r, 0), SKV_ERR_NULL_ARG, "cache_finished_req");
  CHECK_ERR(skv_cache_finished_req(w.c, 1, 0, NULL, 0), SKV_ERR_NULL_ARG, "cache_finished_req");
  CHECK_ERR(skv_cache_finished_req(w.c, 1, 0, NULL, 1), SKV_ERR_NULL_ARG, "cache_finished_req");
  CHECK_ERR(skv_checkpoint(NULL, 1, 0, &r, &handled), SKV_ERR_NULL_ARG, "checkpoint");
  CHECK_ERR(skv_checkpoint(w.c, 1, 0, NULL, &handled), SKV_ERR_NULL_ARG, "checkpoint");
  CHECK_ERR(skv_checkpoint(w.c, 1, 0, &r, NULL), SKV_ERR_NULL_ARG, "checkpoint");
  CHECK_ERR(skv_release_session(NULL, 1), SKV_ERR_NULL_ARG, "release_session");
  CHECK_ERR(skv_release_branch(NULL, 1, 0), SKV_ERR_NULL_ARG, "release_branch");
  CHECK_ERR(skv_free_aligned(NULL, 3, 0, 8), SKV_ERR_NULL_ARG, "free_aligned");
  CHECK_ERR(skv_trim_overshoot(NULL, &r, 0), SKV_ERR_NULL_ARG, "trim_overshoot");
  CHECK_ERR(skv_trim_overshoot(w.c, NULL, 0), SKV_ERR_NULL_ARG, "trim_overshoot");
  CHECK_ERR(skv_free_tail(NULL, &r, 0), SKV_ERR_NULL_ARG, "free_tail");
  CHECK_ERR(skv_free_tail(w.c, NULL, 0), SKV_ERR_NULL_ARG, "free_tail");
  CHECK_ERR(skv_session_held(NULL, NULL, 0, &h), SKV_ERR_NULL_ARG, "session_held");
  CHECK_ERR(skv_session_held(NULL, active, 1, &h), SKV_ERR_NULL_ARG, "session_held");
  CHECK_ERR(skv_session_held(w.c, NULL, 1, &h), SKV_ERR_NULL_ARG, "session_held");
  CHECK_ERR(skv_session_held(w.c, active, 1, NULL), SKV_ERR_NULL_ARG, "session_held");
  CHECK_ERR(skv_session_held(w.c, NULL, 0, NULL), SKV_ERR_NULL_ARG, "session_held");

  /* a NULL pointer outranks an invalid req and a state error */
  r.kv_committed_len = 99;
  before = r;
  CHECK_ERR(skv_match_prefix(w.c, 1, 0, &r, 10, 0, NULL), SKV_ERR_NULL_ARG, "match_prefix");
  CHECK_ERR(skv_checkpoint(w.c, 1, 0, &r, NULL), SKV_ERR_NULL_ARG, "checkpoint");
  CHECK_ERR(skv_checkpoint(NULL, 1, 0, &r, &handled), SKV_ERR_NULL_ARG, "checkpoint");
  CHECK_ERR(skv_trim_overshoot(NULL, &r, 0), SKV_ERR_NULL_ARG, "trim_overshoot");

  CHECK_REQ_SAME(&r, &before);
  CHECK_EQ_INT(m.hit, 0xAAAA);
  CHECK_EQ_INT(m.prefix_len, 0xBBBB);
  CHECK_EQ_INT(handled, 0xCCCC);
  CHECK(memcmp(&h, &hs, sizeof h) == 0);
  /* (NULL, 0) is an empty list */
  CHECK_OK(skv_session_held(w.c, NULL, 0, &h));
  CHECK_EQ_U64(h.sessions, 1);
  world_finish(&w);
}

/* A valid req for row 1: 20 committed, 24 allocated, protected 8, 4 outputs. */
static skv_req valid_req(void) {
  skv_req r = req_make(1, 20, 24);
  r.cache_protected_len = 8;
  r.origin_input_len = 20;
  r.output_len = 4;
  return r;
}

typedef struct bad_req {
  const char *what;
  skv_req r;
} bad_req;

static size_t make_bad_reqs(bad_req *out) {
  size_t n = 0;
#define BAD(desc, field, value)                                                        \
  do {                                                                                 \
    out[n].what = desc;                                                                \
    out[n].r = valid_req();                                                            \
    out[n].r.field = value;                                                            \
    n++;                                                                               \
  } while (0)
  BAD("committed > allocated", kv_committed_len, 25);
  BAD("protected > committed", cache_protected_len, 24);
  BAD("protected not page-aligned", cache_protected_len, 6);
  BAD("allocated > max_context_len", kv_allocated_len, COLS + 1);
  BAD("swa > allocated", swa_evicted_seqlen, 25);
  BAD("finished_len < -1", finished_len, -2);
  BAD("finished_len > output_len", finished_len, 5);
  BAD("row == num_rows", req_pool_idx, ROWS);
  BAD("row far out of range", req_pool_idx, 0x7fffffff);
  BAD("row < -1", req_pool_idx, -2);
  BAD("row INT32_MIN", req_pool_idx, (-0x7fffffff - 1));
#undef BAD
  /* allocated past max_context_len with committed too: still only the length is wrong */
  out[n].what = "committed = allocated > max_context_len";
  out[n].r = valid_req();
  out[n].r.kv_committed_len = out[n].r.kv_allocated_len = COLS + 4;
  n++;
  return n;
}

static void invalid_reqs(void) {
  world w;
  bad_req bad[16];
  size_t i, n;
  skv_req r, before;
  skv_match m;
  uint32_t handled;
  world_init(&w);
  n = make_bad_reqs(bad);

  /* the base req is valid: a miss and a checkpoint accept it */
  r = valid_req();
  before = r;
  CHECK_OK(skv_match_prefix(w.c, 2, 0, &r, 20, 0, &m));
  CHECK_EQ_INT(m.hit, 0);
  CHECK_OK(skv_checkpoint(w.c, 1, 0, &r, &handled));
  CHECK_EQ_INT(handled, 1);
  CHECK_REQ_SAME(&r, &before);
  /* with no row, protected may exceed committed (a prefix-tree hit before allocation) */
  r = req_make(-1, 0, 0);
  r.cache_protected_len = 8;
  CHECK_OK(skv_match_prefix(w.c, 2, 0, &r, 20, 0, &m));
  CHECK_EQ_INT(m.hit, 0);
  CHECK_OK(skv_checkpoint(w.c, 2, 0, &r, &handled));
  CHECK_EQ_INT(handled, 0);

  for (i = 0; i < n; i++) {
#define EXPECT_INVALID(call, name)                                                     \
  do {                                                                                 \
    int ctest_f_ = ctest_failed;                                                       \
    r = bad[i].r;                                                                      \
    before = r;                                                                        \
    m.hit = 0xAAAA;                                                                    \
    m.prefix_len = 0xBBBB;                                                             \
    handled = 0xCCCC;                                                                  \
    CHECK_ERR(call, SKV_ERR_INVALID_ARG, name);                                        \
    CHECK_REQ_SAME(&r, &before);                                                       \
    CHECK_EQ_INT(m.hit, 0xAAAA);                                                       \
    CHECK_EQ_INT(m.prefix_len, 0xBBBB);                                                \
    CHECK_EQ_INT(handled, 0xCCCC);                                                     \
    CHECK_WORLD_INTACT(&w);                                                            \
    if (ctest_failed != ctest_f_) fprintf(stderr, "    (req: %s)\n", bad[i].what);     \
    fe_reset_calls(&w.fe);                                                             \
  } while (0)
    EXPECT_INVALID(skv_match_prefix(w.c, 1, 0, &r, 20, 0, &m), "match_prefix");
    EXPECT_INVALID(skv_match_prefix(w.c, 2, 0, &r, 20, 0, &m), "match_prefix");
    EXPECT_INVALID(skv_match_prefix(w.c, 1, 0, &r, 20, 1, &m), "match_prefix");
    EXPECT_INVALID(skv_cache_finished_req(w.c, 1, 0, &r, 0), "cache_finished_req");
    EXPECT_INVALID(skv_cache_finished_req(w.c, 2, 0, &r, 0), "cache_finished_req");
    EXPECT_INVALID(skv_cache_finished_req(w.c, 1, 0, &r, 1), "cache_finished_req");
    EXPECT_INVALID(skv_cache_finished_req(w.c, 2, 0, &r, 1), "cache_finished_req");
    EXPECT_INVALID(skv_checkpoint(w.c, 1, 0, &r, &handled), "checkpoint");
    EXPECT_INVALID(skv_checkpoint(w.c, 2, 0, &r, &handled), "checkpoint");
    EXPECT_INVALID(skv_trim_overshoot(w.c, &r, 0), "trim_overshoot");
    EXPECT_INVALID(skv_free_tail(w.c, &r, 20), "free_tail");
  }
  world_finish(&w);
}

/* Every field at its largest valid value passes validation (no off-by-one). */
static void boundary_values(void) {
  world w;
  skv_req r = req_make(ROWS - 1, COLS, COLS), before;
  skv_match m;
  uint32_t handled = 0xCCCC;
  world_init(&w);
  r.cache_protected_len = COLS;
  r.swa_evicted_seqlen = COLS;
  r.origin_input_len = COLS - 4;
  r.output_len = 4;
  r.finished_len = 4;
  before = r;
  CHECK_OK(skv_checkpoint(w.c, 2, 0, &r, &handled));
  CHECK_EQ_INT(handled, 0);
  CHECK_OK(skv_match_prefix(w.c, 2, 0, &r, COLS, 0, &m));
  CHECK_EQ_INT(m.hit, 0);
  CHECK_OK(skv_free_tail(w.c, &r, COLS));
  CHECK_OK(skv_trim_overshoot(w.c, &r, 4));
  CHECK_REQ_SAME(&r, &before);
  CHECK_OK(skv_free_aligned(w.c, ROWS - 1, COLS, COLS));
  CHECK_STATUS(skv_free_aligned(w.c, 3, 0xFFFFFFFFu, 8), SKV_ERR_INVALID_ARG);
  CHECK_MSG_HAS("target 4294967295 > end 8");
  CHECK_OK(skv_free_aligned(w.c, 3, 0, 0));
  CHECK_WORLD_INTACT(&w);
  /* absurd numbers are refused, never a crash */
  CHECK_STATUS(skv_trim_overshoot(w.c, &r, 0xFFFFFFFFu), SKV_ERR_INVALID_ARG);
  CHECK_STATUS(skv_free_tail(w.c, &r, 0xFFFFFFFFu), SKV_ERR_INVALID_ARG);
  CHECK_STATUS(skv_free_aligned(w.c, 3, 0, 0xFFFFFFFFu), SKV_ERR_INVALID_ARG);
  CHECK_REQ_SAME(&r, &before);
  CHECK_WORLD_INTACT(&w);
  world_finish(&w);
}

/* Configurations at the edges of their ranges: accepted or refused, never a crash. */
static void extreme_configs(void) {
  fake_engine fe;
  skv_cache_config cfg;
  skv_pool_ops ops = fe_ops();
  skv_cache *c = NULL;
  skv_status s;
  fe_init(&fe, 1, 1);
  cfg = fe_config(&fe, 0xFFFFFFFFu, 0);
  cfg.num_rows = 0xFFFFFFFFu;
  cfg.max_context_len = 0xFFFFFFFFu;
  cfg.num_token_slots = ~(uint64_t)0;
  cfg.flags = 0xFFFFFFFFu;
  s = skv_cache_new_external(&cfg, &ops, &fe, &c);
  CHECK(s == SKV_OK || s == SKV_ERR_INVALID_ARG || s == SKV_ERR_OUT_OF_MEMORY);
  CHECK((s == SKV_OK) == (c != NULL));
  skv_cache_free(c);
  c = NULL;
  {
    /* from a newer header: a struct 64 bytes longer, its unknown fields zero
     * (test_reliability.c covers the non-zero ones) */
    union {
      skv_cache_config cfg;
      unsigned char bytes[sizeof(skv_cache_config) + 64];
    } newer;
    memset(&newer, 0, sizeof newer);
    newer.cfg = fe_config(&fe, 1, 0);
    newer.cfg.struct_size = (uint32_t)sizeof newer;
    CHECK_OK(skv_cache_new_external(&newer.cfg, &ops, &fe, &c));
    skv_cache_free(c);
  }
  CHECK_NO_CALLS(&fe);
  fe_free(&fe);
}

/* Arguments each valid alone that the operation's own rules refuse. */
static void invalid_operation_args(void) {
  world w;
  skv_req r;
  skv_match m;
  uint32_t handled;
  world_init(&w);
  m.hit = 0xAAAA;
  m.prefix_len = 0xBBBB;
  handled = 0xCCCC;

  CHECK_ERR(skv_free_aligned(w.c, ROWS, 0, 8), SKV_ERR_INVALID_ARG, "free_aligned");
  CHECK_ERR(skv_free_aligned(w.c, -1, 0, 8), SKV_ERR_INVALID_ARG, "free_aligned");
  CHECK_MSG_HAS("row -1 out of range [0, ");
  CHECK_ERR(skv_free_aligned(w.c, 3, 0, COLS + 1), SKV_ERR_INVALID_ARG, "free_aligned");
  CHECK_WORLD_INTACT(&w);
  /* nothing to free is not an error; a range that runs backwards is */
  CHECK_OK(skv_free_aligned(w.c, 3, 10, 10));
  CHECK_ERR(skv_free_aligned(w.c, 3, 12, 8), SKV_ERR_INVALID_ARG, "free_aligned");
  CHECK_WORLD_INTACT(&w);

#define EXPECT_REQ_ERR(req_init_expr, call, status, name)                              \
  do {                                                                                 \
    skv_req ctest_before_;                                                             \
    r = req_init_expr;                                                                 \
    ctest_before_ = r;                                                                 \
    CHECK_ERR(call, status, name);                                                     \
    CHECK_REQ_SAME(&r, &ctest_before_);                                                \
    CHECK_WORLD_INTACT(&w);                                                            \
  } while (0)

  /* the primitives need a row */
  EXPECT_REQ_ERR(req_make(-1, 0, 0), skv_trim_overshoot(w.c, &r, 0), SKV_ERR_INVALID_ARG,
                 "trim_overshoot");
  EXPECT_REQ_ERR(req_make(-1, 0, 0), skv_free_tail(w.c, &r, 0), SKV_ERR_INVALID_ARG,
                 "free_tail");
  /* a finish (not aborted) needs a row */
  EXPECT_REQ_ERR(req_make(-1, 0, 0), skv_cache_finished_req(w.c, 2, 0, &r, 0),
                 SKV_ERR_INVALID_ARG, "cache_finished_req");
  EXPECT_REQ_ERR(req_make(-1, 0, 0), skv_cache_finished_req(w.c, 1, 0, &r, 0),
                 SKV_ERR_INVALID_ARG, "cache_finished_req");
  /* trims past the outputs, below the protected prefix, or past 32 bits */
  EXPECT_REQ_ERR(valid_req(), skv_trim_overshoot(w.c, &r, 5), SKV_ERR_INVALID_ARG,
                 "trim_overshoot");
  {
    skv_req low = valid_req();
    low.origin_input_len = 4;
    low.finished_len = 2;
    EXPECT_REQ_ERR(low, skv_trim_overshoot(w.c, &r, 2), SKV_ERR_INVALID_ARG,
                   "trim_overshoot");
    EXPECT_REQ_ERR(low, skv_cache_finished_req(w.c, 2, 0, &r, 0), SKV_ERR_INVALID_ARG,
                   "cache_finished_req");
  }
  {
    skv_req big = valid_req();
    big.origin_input_len = 0xFFFFFFF0u;
    big.output_len = 0x20;
    EXPECT_REQ_ERR(big, skv_trim_overshoot(w.c, &r, 0x20), SKV_ERR_INVALID_ARG,
                   "trim_overshoot");
    EXPECT_REQ_ERR(big, skv_cache_finished_req(w.c, 2, 0, &r, 0), SKV_ERR_INVALID_ARG,
                   "cache_finished_req");
  }
  /* free_tail past the allocation; below the protected prefix is a state error */
  EXPECT_REQ_ERR(valid_req(), skv_free_tail(w.c, &r, 25), SKV_ERR_INVALID_ARG, "free_tail");
  EXPECT_REQ_ERR(valid_req(), skv_free_tail(w.c, &r, 4), SKV_ERR_STATE, "free_tail");

  /* state errors: rows that belong to someone else, a prefix below the protected one */
  EXPECT_REQ_ERR(req_make(3, 0, 0), skv_match_prefix(w.c, 1, 0, &r, 20, 0, &m),
                 SKV_ERR_STATE, "match_prefix");
  EXPECT_REQ_ERR(req_make(0, 10, 10), skv_cache_finished_req(w.c, 2, 0, &r, 0),
                 SKV_ERR_STATE, "cache_finished_req");
  EXPECT_REQ_ERR(req_make(3, 10, 10), skv_cache_finished_req(w.c, 1, 0, &r, 0),
                 SKV_ERR_STATE, "cache_finished_req");
  EXPECT_REQ_ERR(req_make(3, 10, 10), skv_cache_finished_req(w.c, 1, 0, &r, 1),
                 SKV_ERR_STATE, "cache_finished_req");
  EXPECT_REQ_ERR(req_make(-1, 0, 0), skv_cache_finished_req(w.c, 1, 0, &r, 1),
                 SKV_ERR_STATE, "cache_finished_req");
  EXPECT_REQ_ERR(req_make(-1, 0, 0), skv_match_prefix(w.c, 1, 0, &r, 4, 0, &m),
                 SKV_ERR_STATE, "match_prefix");
#undef EXPECT_REQ_ERR
  CHECK_EQ_INT(m.hit, 0xAAAA);
  CHECK_EQ_INT(m.prefix_len, 0xBBBB);
  CHECK_EQ_INT(handled, 0xCCCC);
  world_finish(&w);
}

int main(void) {
  status_strings_and_versions();
  bad_configs();
  null_pointers();
  invalid_reqs();
  invalid_operation_args();
  boundary_values();
  extreme_configs();
  return ctest_summary();
}
