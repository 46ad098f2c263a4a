/* The batch calls of a running batch: skv_alloc_extend_batch and skv_commit_batch against
 * the same single calls on a twin cache (same indices, same reqs), skv_alloc_extend's
 * out_loc, and every error path: NULL arrays, out_cap too small, a bad req at position k
 * (named in the message; every req and the pool unchanged), a row named twice, the row of
 * an idle session, a batch the pool cannot hold, an external handle. */
#include "common.h"

#define PS 4
#define ROWS 6
#define PAGES 40

static skv_cache *new_cache(void) {
  skv_cache_config cfg;
  skv_cache *c = NULL;
  memset(&cfg, 0, sizeof cfg);
  cfg.struct_size = (uint32_t)sizeof cfg;
  cfg.page_size = PS;
  cfg.num_token_slots = (uint64_t)PAGES * PS;
  cfg.num_rows = ROWS;
  cfg.max_context_len = 64;
  CHECK_OK(skv_cache_new(&cfg, &c));
  return c;
}

static skv_req fresh_row(skv_cache *c) {
  skv_req r;
  CHECK_OK(skv_req_init(&r));
  CHECK_OK(skv_alloc_row(c, &r));
  return r;
}

static void audit(skv_cache *c) {
  skv_check_report rep;
  CHECK_OK(skv_cache_check(c, &rep));
  CHECK_EQ_U64(rep.violations, 0);
}

static uint64_t free_pages(skv_cache *c) {
  skv_stats s;
  CHECK_OK(skv_cache_stats(c, &s));
  return s.free_pages;
}

/* A batch of three reqs on fresh rows, extended by 3, 5, 0 tokens. */
static void setup(skv_cache *c, skv_req reqs[3]) {
  int i;
  for (i = 0; i < 3; i++) reqs[i] = fresh_row(c);
  CHECK_OK(skv_alloc_extend(c, &reqs[0], 3, NULL));
  CHECK_OK(skv_alloc_extend(c, &reqs[1], 5, NULL));
}

static void test_batch_equals_single_calls(void) {
  skv_cache *a = new_cache(), *b = new_cache();
  skv_req ra[3], rb[3];
  uint32_t n[3] = {2, 7, 1}, one[3] = {1, 3, 0};
  int32_t loc[16], single[16], row[16];
  int i, at = 0;
  setup(a, ra);
  setup(b, rb);
  memset(loc, 0x5A, sizeof loc);
  CHECK_OK(skv_alloc_extend_batch(a, ra, 3, n, loc, 16));
  for (i = 0; i < 3; i++) {
    CHECK_OK(skv_alloc_extend(b, &rb[i], n[i], single + at));
    CHECK_REQ_SAME(&ra[i], &rb[i]);
    /* out_loc holds req_to_token[row, old allocated:new) */
    CHECK_OK(skv_row_indices(a, ra[i].req_pool_idx, ra[i].kv_allocated_len - n[i],
                             ra[i].kv_allocated_len, row));
    CHECK(memcmp(row, loc + at, n[i] * sizeof(int32_t)) == 0);
    at += (int)n[i];
  }
  CHECK(memcmp(loc, single, (size_t)at * sizeof(int32_t)) == 0);
  CHECK_EQ_INT(loc[at], 0x5A5A5A5A); /* nothing past the batch's slots */
  CHECK_EQ_U64(free_pages(a), free_pages(b));
  /* out_loc NULL: not asked */
  CHECK_OK(skv_alloc_extend_batch(a, ra, 3, one, NULL, 0));
  for (i = 0; i < 3; i++) CHECK_OK(skv_alloc_extend(b, &rb[i], one[i], NULL));
  CHECK_OK(skv_commit_batch(a, ra, 3, n));
  for (i = 0; i < 3; i++) {
    CHECK_OK(skv_commit(b, &rb[i], n[i]));
    CHECK_REQ_SAME(&ra[i], &rb[i]);
  }
  /* (NULL, 0) is an empty batch */
  CHECK_OK(skv_alloc_extend_batch(a, NULL, 0, NULL, NULL, 0));
  CHECK_OK(skv_commit_batch(a, NULL, 0, NULL));
  audit(a);
  audit(b);
  skv_cache_free(a);
  skv_cache_free(b);
}

/* `call` on reqs fails with `want` and a message naming `needle`, and changes nothing. */
#define REFUSED(c, reqs, call, want, needle)                                            \
  do {                                                                                  \
    skv_req before_[3];                                                                 \
    uint64_t pages_ = free_pages(c);                                                    \
    memcpy(before_, (reqs), sizeof before_);                                            \
    CHECK_STATUS(call, want);                                                           \
    CHECK_MSG_HAS(needle);                                                              \
    for (int k_ = 0; k_ < 3; k_++) CHECK_REQ_SAME(&before_[k_], &(reqs)[k_]);              \
    CHECK_EQ_U64(free_pages(c), pages_);                                                \
    audit(c);                                                                           \
  } while (0)

static void test_errors(void) {
  skv_cache *c = new_cache();
  skv_req r[3], saved, idle;
  uint32_t n[3] = {1, 1, 1}, many[3] = {1, 1, 200};
  int32_t loc[8];
  skv_match m;
  setup(c, r);
  REFUSED(c, r, skv_alloc_extend_batch(c, NULL, 3, n, loc, 8), SKV_ERR_NULL_ARG,
          "skv_alloc_extend_batch: reqs is NULL");
  REFUSED(c, r, skv_alloc_extend_batch(c, r, 3, NULL, loc, 8), SKV_ERR_NULL_ARG, "n_tokens is NULL");
  REFUSED(c, r, skv_alloc_extend_batch(NULL, r, 3, n, loc, 8), SKV_ERR_NULL_ARG, "cache");
  REFUSED(c, r, skv_commit_batch(c, NULL, 3, n), SKV_ERR_NULL_ARG, "skv_commit_batch: reqs is NULL");
  REFUSED(c, r, skv_commit_batch(c, r, 3, NULL), SKV_ERR_NULL_ARG, "n_tokens is NULL");
  /* out_cap below the 3 slots the batch assigns */
  REFUSED(c, r, skv_alloc_extend_batch(c, r, 3, n, loc, 2), SKV_ERR_INVALID_ARG, "out_cap 2 < the 3");
  /* a bad req at position 2: every req and the pool unchanged */
  saved = r[2];
  r[2].kv_allocated_len = 9; /* disagrees with the row's record */
  REFUSED(c, r, skv_alloc_extend_batch(c, r, 3, n, loc, 8), SKV_ERR_INVALID_ARG, "reqs[2]: kv_allocated_len 9");
  REFUSED(c, r, skv_commit_batch(c, r, 3, n), SKV_ERR_INVALID_ARG, "reqs[2]: kv_allocated_len 9");
  r[2] = saved;
  REFUSED(c, r, skv_commit_batch(c, r, 3, n), SKV_ERR_INVALID_ARG,
          "reqs[2]: kv_committed_len 0 + n_tokens 1 > kv_allocated_len 0");
  r[2].req_pool_idx = -1;
  REFUSED(c, r, skv_alloc_extend_batch(c, r, 3, n, loc, 8), SKV_ERR_INVALID_ARG, "reqs[2]: req_pool_idx -1");
  r[2] = saved;
  /* the same row twice */
  r[2] = r[0];
  REFUSED(c, r, skv_alloc_extend_batch(c, r, 3, n, loc, 8), SKV_ERR_INVALID_ARG, "reqs[2]: row");
  REFUSED(c, r, skv_commit_batch(c, r, 3, n), SKV_ERR_INVALID_ARG, "also reqs[0]");
  r[2] = saved;
  /* more pages than the pool holds, counted over the whole batch */
  REFUSED(c, r, skv_alloc_extend_batch(c, r, 3, many, NULL, 0), SKV_ERR_INVALID_ARG, "reqs[2]: kv_allocated_len 0 + n_tokens 200");
  many[0] = many[1] = many[2] = 56; /* 14 pages each, 36 free */
  REFUSED(c, r, skv_alloc_extend_batch(c, r, 3, many, NULL, 0), SKV_ERR_OUT_OF_MEMORY, "reqs[2]");
  /* the row of an idle session belongs to the session */
  idle = r[1];
  CHECK_OK(skv_commit(c, &idle, idle.kv_allocated_len));
  idle.origin_input_len = idle.kv_committed_len;
  CHECK_OK(skv_cache_finished_req(c, 9, 0, &idle, 0));
  saved = r[1];
  r[1].kv_committed_len = 5; /* as the finish left the row */
  REFUSED(c, r, skv_alloc_extend_batch(c, r, 3, n, loc, 8), SKV_ERR_STATE, "reqs[1]: row");
  r[1].kv_committed_len = 4; /* a commit that only the idle slot refuses */
  REFUSED(c, r, skv_commit_batch(c, r, 3, n), SKV_ERR_STATE, "reqs[1]: row");
  /* once restored (in flight), the running request extends it in a batch */
  CHECK_OK(skv_req_init(&r[1]));
  r[1].origin_input_len = 5;
  CHECK_OK(skv_match_prefix(c, 9, 0, &r[1], 5, 0, &m));
  CHECK_EQ_INT(m.hit, 1);
  CHECK_OK(skv_alloc_extend_batch(c, r, 3, n, loc, 8));
  CHECK_OK(skv_commit_batch(c, r, 3, n));
  (void)saved;
  audit(c);
  skv_cache_free(c);
}

static void test_external_unsupported(void) {
  fake_engine fe;
  skv_cache *c;
  skv_req r[1];
  uint32_t n[1] = {1};
  int32_t loc[1];
  fe_init(&fe, 4, 64);
  c = fe_cache(&fe, 4, 0);
  if (!c) {
    fe_free(&fe);
    return;
  }
  r[0] = req_make(0, 4, 8);
  CHECK_STATUS(skv_alloc_extend_batch(c, r, 1, n, loc, 1), SKV_ERR_UNSUPPORTED);
  CHECK_MSG_HAS("skv_alloc_extend_batch");
  CHECK_STATUS(skv_commit_batch(c, r, 1, n), SKV_ERR_UNSUPPORTED);
  CHECK_STATUS(skv_alloc_extend_batch(c, NULL, 1, n, loc, 1), SKV_ERR_NULL_ARG);
  CHECK_STATUS(skv_alloc_extend(c, &r[0], 1, loc), SKV_ERR_UNSUPPORTED);
  skv_cache_free(c);
  fe_free(&fe);
}

int main(void) {
  test_batch_equals_single_calls();
  test_errors();
  test_external_unsupported();
  return ctest_summary();
}
