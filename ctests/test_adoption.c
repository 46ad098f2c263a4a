/* What an engine adopting libskv reaches for besides the turn: handing back a matched
 * request that never ran (skv_hand_back), page-granular frees (SKV_FLAG_PAGE_FREES), the
 * scheduler queries (skv_session_usage, skv_branch_usage, skv_idle_sessions,
 * skv_admission_pages, skv_cache_stats in external mode), and the messages of refused calls. */
#include "common.h"

static skv_cache *owned_new(uint32_t ps, uint32_t pages) {
  skv_cache_config cfg;
  skv_cache *c = NULL;
  memset(&cfg, 0, sizeof cfg);
  cfg.struct_size = (uint32_t)sizeof cfg;
  cfg.page_size = ps;
  cfg.num_token_slots = (uint64_t)pages * ps;
  cfg.num_rows = 4;
  cfg.max_context_len = 256;
  CHECK_OK(skv_cache_new(&cfg, &c));
  return c;
}

/* An owned first turn of `len` tokens saved into (sid, 0). */
static void owned_turn(skv_cache *c, uint64_t sid, uint32_t len) {
  skv_req r;
  skv_req_init(&r);
  CHECK_OK(skv_alloc_row(c, &r));
  CHECK_OK(skv_alloc_extend(c, &r, len, NULL));
  CHECK_OK(skv_commit(c, &r, len));
  r.origin_input_len = len;
  CHECK_OK(skv_cache_finished_req(c, sid, 0, &r, 0));
}

static uint64_t free_pages(skv_cache *c) {
  skv_stats s;
  memset(&s, 0xff, sizeof s);
  CHECK_OK(skv_cache_stats(c, &s));
  return s.free_pages;
}

static void hand_back_external(void) {
  fake_engine fe;
  skv_cache *c;
  skv_req r, copy, kept;
  skv_match m;
  skv_usage u;
  static const fe_expect release[] = {FE_KV(2 * 64, 2 * 64 + 20), FE_ROW(2)};

  fe_init(&fe, 8, 64);
  c = fe_cache(&fe, 4, 0);
  fe_save_slot(c, &fe, 1, 0, 2, 0, 20, 0, 0, -1);
  skv_req_init(&r);
  r.origin_input_len = 30;
  CHECK_OK(skv_match_prefix(c, 1, 0, &r, 29, 0, &m));
  CHECK_EQ_INT(m.hit, 1);
  CHECK_EQ_INT(m.prefix_len, 20);
  kept = r;

  /* refusals: nothing changes, no callback runs */
  CHECK_STATUS(skv_hand_back(NULL, 1, 0, &r), SKV_ERR_NULL_ARG);
  CHECK_MSG_HAS("skv_hand_back");
  CHECK_STATUS(skv_hand_back(c, 1, 0, NULL), SKV_ERR_NULL_ARG);
  skv_req_init(&copy);
  CHECK_STATUS(skv_hand_back(c, 1, 0, &copy), SKV_ERR_INVALID_ARG); /* a miss */
  CHECK_MSG_HAS("skv_hand_back: req_pool_idx -1");
  copy = req_make(5, 4, 4);
  CHECK_STATUS(skv_hand_back(c, 9, 0, &copy), SKV_ERR_STATE); /* a first turn */
  CHECK_MSG_HAS("session 9 branch 0 has no slot");
  copy = r;
  copy.kv_allocated_len = 24;
  CHECK_STATUS(skv_hand_back(c, 1, 0, &copy), SKV_ERR_STATE); /* it ran */
  CHECK_MSG_HAS("kv_allocated_len 24 != the 20 the match restored into row 2");
  CHECK_EQ_INT(copy.kv_allocated_len, 24);
  copy = r;
  copy.row_generation = r.row_generation + 1;
  CHECK_STATUS(skv_hand_back(c, 1, 0, &copy), SKV_ERR_STATE);
  CHECK_MSG_HAS("stale copy");
  CHECK_STATUS(skv_hand_back(c, 1, 3, &r), SKV_ERR_STATE); /* another branch */
  CHECK_REQ_SAME(&r, &kept);
  CHECK_NO_CALLS(&fe);

  CHECK_OK(skv_hand_back(c, 1, 0, &r));
  CHECK_NO_CALLS(&fe);
  CHECK(req_is_empty(&r));
  CHECK_EQ_INT(r.row_generation, 0);
  CHECK_EQ_INT(r.origin_input_len, 30);
  memset(&u, 0xff, sizeof u);
  CHECK_OK(skv_branch_usage(c, 1, 0, &u));
  CHECK_EQ_U64(u.slots, 1);
  CHECK_EQ_U64(u.in_flight, 0);
  CHECK_EQ_U64(u.allocated_tokens, 20);
  CHECK_EQ_U64(u.pages, 5);
  /* handed back twice: the slot is idle */
  CHECK_STATUS(skv_hand_back(c, 1, 0, &kept), SKV_ERR_STATE);
  CHECK_MSG_HAS("is idle");
  /* the slot is whole: it matches again and releases what the match left */
  skv_req_init(&r);
  r.origin_input_len = 30;
  CHECK_OK(skv_match_prefix(c, 1, 0, &r, 29, 0, &m));
  CHECK_EQ_INT(m.prefix_len, 20);
  CHECK_OK(skv_hand_back(c, 1, 0, &r));
  CHECK_OK(skv_release_session(c, 1));
  CHECK_FREES(&fe, release);
  skv_cache_free(c);
  fe_free(&fe);
}

static void hand_back_owned(void) {
  skv_cache *c = owned_new(4, 32);
  skv_req r;
  skv_match m;
  skv_check_report rep;
  uint64_t before;

  owned_turn(c, 1, 10);
  before = free_pages(c);
  skv_req_init(&r);
  r.origin_input_len = 14;
  CHECK_OK(skv_match_prefix(c, 1, 0, &r, 13, 0, &m));
  CHECK_EQ_INT(m.prefix_len, 10);
  CHECK_OK(skv_alloc_extend(c, &r, 4, NULL));
  CHECK_STATUS(skv_hand_back(c, 1, 0, &r), SKV_ERR_STATE);
  CHECK_MSG_HAS("kv_allocated_len 14 != the 10");
  CHECK_OK(skv_free_tail(c, &r, 10));
  CHECK_OK(skv_hand_back(c, 1, 0, &r));
  CHECK_EQ_INT(r.req_pool_idx, -1);
  CHECK_EQ_U64(free_pages(c), before);
  CHECK_OK(skv_cache_check(c, &rep));
  CHECK_EQ_U64(rep.violations, 0);
  skv_cache_free(c);
}

/* Owned mode: a copy of a finished turn's req disagrees with the row; it is refused as a
 * stale copy (SKV_ERR_STATE, as in external mode), finish and abort alike. */
static void owned_stale_copy(void) {
  skv_cache *c = owned_new(4, 32);
  skv_req r, stale;
  skv_req_init(&r);
  CHECK_OK(skv_alloc_row(c, &r));
  CHECK_OK(skv_alloc_extend(c, &r, 12, NULL));
  CHECK_OK(skv_commit(c, &r, 12));
  r.origin_input_len = 8;
  r.output_len = 4;
  r.finished_len = 2;
  stale = r;
  CHECK_OK(skv_cache_finished_req(c, 1, 0, &r, 0));
  CHECK_STATUS(skv_cache_finished_req(c, 1, 0, &stale, 0), SKV_ERR_STATE);
  CHECK_MSG_HAS("is a stale copy");
  CHECK_MSG_HAS("kv_allocated_len 12 != 10 tokens mapped by row 0");
  CHECK_STATUS(skv_cache_finished_req(c, 1, 0, &stale, 1), SKV_ERR_STATE);
  CHECK_MSG_HAS("is a stale copy");
  skv_cache_free(c);
}

/* The pages of each free_kv call, deduplicated in order of first appearance. */
static size_t pages_of(const fe_call *call, uint32_t ps, int32_t *out) {
  size_t i, j, n = 0;
  for (i = 0; i < call->n; i++) {
    int32_t p = call->indices[i] / (int32_t)ps;
    for (j = 0; j < n && out[j] != p; j++) {
    }
    if (j == n) out[n++] = p;
  }
  return n;
}

/* The same calls on two caches, per index and per page: the pages freed are the same. */
static void run_turns(skv_cache *c, fake_engine *fe) {
  skv_req r = req_make(2, 17, 40);
  skv_match m;
  fe_save_slot(c, fe, 1, 0, 1, 16, 48, 7, 8, -1);
  r.origin_input_len = 17;
  CHECK_OK(skv_cache_finished_req(c, 2, 0, &r, 0)); /* frees [32, 40) of row 2 */
  skv_req_init(&r);
  r.origin_input_len = 20;
  CHECK_OK(skv_match_prefix(c, 2, 0, &r, 5, 0, &m)); /* frees [16, 17) of row 2 */
  r.kv_allocated_len = 70;
  CHECK_OK(skv_free_tail(c, &r, 33)); /* frees [48, 70) */
  CHECK_OK(skv_cache_finished_req(c, 2, 0, &r, 1));
  CHECK_OK(skv_free_aligned(c, 3, 5, 64)); /* frees [16, 64) */
  CHECK_OK(skv_release_session(c, 1));
}

static void page_frees(void) {
  fake_engine every, paged;
  skv_cache *a, *b;
  size_t i, k = 0, calls = 0;
  skv_cache_config cfg;
  skv_pool_ops ops = fe_ops();
  skv_cache *none = NULL;

  fe_init(&every, 8, 256);
  fe_init(&paged, 8, 256);
  a = fe_cache(&every, 16, 0);
  b = fe_cache(&paged, 16, SKV_FLAG_PAGE_FREES);
  run_turns(a, &every);
  run_turns(b, &paged);
  for (i = 0; i < every.n_calls; i++) {
    const fe_call *x = &every.calls[i];
    int32_t want[256];
    size_t n, j;
    if (x->kind != FE_FREE_KV) continue;
    n = pages_of(x, 16, want);
    while (k < paged.n_calls && paged.calls[k].kind != FE_FREE_KV) k++;
    if (k >= paged.n_calls) {
      CHECK(!"as many free_kv calls per page as per index");
      break;
    }
    CHECK_EQ_U64(paged.calls[k].n, n);
    for (j = 0; j < n && j < paged.calls[k].n; j++) {
      CHECK_EQ_INT(paged.calls[k].indices[j], want[j] * 16); /* the page's first index */
    }
    k++;
    calls++;
  }
  CHECK(calls >= 5);
  CHECK_EQ_U64(fe_count_kind(&every, FE_FREE_KV), fe_count_kind(&paged, FE_FREE_KV));
  CHECK_EQ_U64(fe_count_kind(&every, FE_FREE_ROW), fe_count_kind(&paged, FE_FREE_ROW));
  CHECK_EQ_INT(paged.bad_args, 0);
  skv_cache_free(a);
  skv_cache_free(b);

  /* an unknown flag bit is refused */
  cfg = fe_config(&every, 16, 0x4);
  CHECK_STATUS(skv_cache_new_external(&cfg, &ops, &every, &none), SKV_ERR_INVALID_ARG);
  CHECK_MSG_HAS("flags 0x4");
  CHECK(none == NULL);
  fe_free(&every);
  fe_free(&paged);
}

static void queries(void) {
  fake_engine fe;
  skv_cache *c, *o;
  uint64_t sids[4] = {77, 77, 77, 77}, bids[4] = {77, 77, 77, 77};
  size_t count = 99;
  skv_usage u;
  skv_admission adm;
  skv_stats s;
  skv_req r, t;
  skv_match m;
  int32_t active[2];

  fe_init(&fe, 8, 128);
  c = fe_cache(&fe, 4, 0);
  fe_save_slot(c, &fe, 1, 0, 0, 4, 10, 0, 0, -1);
  fe_save_slot(c, &fe, 2, 0, 1, 0, 8, 0, 0, -1);
  fe_save_slot(c, &fe, 1, 6, 2, 0, 5, 0, 0, -1);

  /* least recently finished first; *count is every idle slot, cap or not */
  CHECK_OK(skv_idle_sessions(c, sids, bids, 4, &count));
  CHECK_EQ_U64(count, 3);
  CHECK(sids[0] == 1 && bids[0] == 0 && sids[1] == 2 && bids[1] == 0 && sids[2] == 1 &&
        bids[2] == 6);
  CHECK_EQ_U64(sids[3], 77);
  sids[1] = 77;
  CHECK_OK(skv_idle_sessions(c, sids, bids, 1, &count));
  CHECK_EQ_U64(count, 3);
  CHECK_EQ_U64(sids[1], 77);
  CHECK_OK(skv_idle_sessions(c, NULL, NULL, 0, &count));
  CHECK_EQ_U64(count, 3);
  CHECK_STATUS(skv_idle_sessions(c, NULL, bids, 2, &count), SKV_ERR_NULL_ARG);
  CHECK_STATUS(skv_idle_sessions(c, sids, bids, 2, NULL), SKV_ERR_NULL_ARG);
  /* session 1 runs a turn: it leaves the idle list, then comes back most recent */
  skv_req_init(&r);
  r.origin_input_len = 12;
  CHECK_OK(skv_match_prefix(c, 1, 0, &r, 11, 0, &m));
  CHECK_OK(skv_idle_sessions(c, sids, bids, 4, &count));
  CHECK_EQ_U64(count, 2);
  r.kv_allocated_len = r.kv_committed_len = 12;
  CHECK_OK(skv_cache_finished_req(c, 1, 0, &r, 0));
  CHECK_OK(skv_idle_sessions(c, sids, bids, 4, &count));
  CHECK(count == 3 && sids[2] == 1 && bids[2] == 0);

  memset(&u, 0xff, sizeof u);
  CHECK_OK(skv_session_usage(c, 1, &u));
  CHECK_EQ_U64(u.slots, 2);
  CHECK_EQ_U64(u.allocated_tokens, 12 + 5);
  CHECK_EQ_U64(u.protected_tokens, 4);
  CHECK_EQ_U64(u.pages, 3 + 2);
  CHECK_EQ_U64(u.freeable_pages, 2 + 2);
  CHECK_OK(skv_session_usage(c, 42, &u));
  CHECK_EQ_U64(u.slots, 0);
  CHECK_STATUS(skv_session_usage(c, 1, NULL), SKV_ERR_NULL_ARG);
  CHECK_STATUS(skv_branch_usage(NULL, 1, 0, &u), SKV_ERR_NULL_ARG);

  /* external stats: what libskv knows there */
  memset(&s, 0xff, sizeof s);
  CHECK_OK(skv_cache_stats(c, &s));
  CHECK_EQ_U64(s.sessions, 3);
  CHECK_EQ_U64(s.total_rows, 8);
  CHECK_EQ_U64(s.total_pages, 0);
  CHECK_EQ_U64(s.free_rows, 0);
  CHECK_STATUS(skv_admission_pages(c, 1, 0, 4, 8, &adm), SKV_ERR_UNSUPPORTED);

  /* session_held refuses rows outside [0, num_rows) */
  active[0] = 1;
  active[1] = 42;
  CHECK_STATUS(skv_session_held(c, active, 2, &(skv_held){0, 0, 0, 0, 0, 0}), SKV_ERR_INVALID_ARG);
  CHECK_MSG_HAS("active_rows[1] = 42 out of range [0, 8)");
  active[1] = -7;
  CHECK_STATUS(skv_session_held(c, active, 2, &(skv_held){0, 0, 0, 0, 0, 0}), SKV_ERR_INVALID_ARG);
  CHECK_MSG_HAS("-7");
  skv_cache_free(c);
  fe_free(&fe);

  /* owned admission: what the match and the extension then take */
  o = owned_new(4, 64);
  owned_turn(o, 1, 20);
  memset(&adm, 0xff, sizeof adm);
  CHECK_OK(skv_admission_pages(o, 1, 0, 6, 12, &adm));
  CHECK_EQ_INT(adm.hit, 1);
  CHECK_EQ_INT(adm.prefix_len, 6);
  CHECK_EQ_U64(adm.pages_needed, 1);
  CHECK_EQ_U64(adm.pages_freed, 3);
  CHECK_OK(skv_admission_pages(o, 5, 0, 6, 12, &adm));
  CHECK_EQ_INT(adm.hit, 0);
  CHECK_EQ_U64(adm.pages_needed, 3);
  CHECK_STATUS(skv_admission_pages(o, 1, 0, 13, 12, &adm), SKV_ERR_INVALID_ARG);
  CHECK_MSG_HAS("key_len 13 > total_len 12");
  {
    uint64_t before = free_pages(o);
    skv_req_init(&t);
    t.origin_input_len = 12;
    CHECK_OK(skv_admission_pages(o, 1, 0, 6, 12, &adm));
    CHECK_OK(skv_match_prefix(o, 1, 0, &t, 6, 0, &m));
    CHECK_OK(skv_alloc_extend(o, &t, 12 - 6, NULL));
    CHECK_EQ_U64(before + adm.pages_freed - adm.pages_needed, free_pages(o));
  }
  CHECK_STATUS(skv_admission_pages(o, 1, 0, 6, 12, &adm), SKV_ERR_STATE); /* in flight */
  skv_cache_free(o);
}

static void messages(void) {
  fake_engine fe;
  skv_cache_config cfg;
  skv_pool_ops ops = fe_ops();
  skv_cache *c = NULL, *o;
  skv_req r;
  int32_t out[4], idx[1] = {5};

  fe_init(&fe, 4, 64);
  cfg = fe_config(&fe, 4, 0);
  ops.free_kv = NULL;
  CHECK_STATUS(skv_cache_new_external(&cfg, &ops, &fe, &c), SKV_ERR_NULL_ARG);
  CHECK_MSG_HAS("ops->free_kv is NULL");
  ops = fe_ops();
  ops.read_row = NULL;
  ops.free_row = NULL;
  CHECK_STATUS(skv_cache_new_external(&cfg, &ops, &fe, &c), SKV_ERR_NULL_ARG);
  CHECK_MSG_HAS("ops->read_row, ops->free_row are NULL");
  cfg.num_rows = 0;
  ops = fe_ops();
  CHECK_STATUS(skv_cache_new_external(&cfg, &ops, &fe, &c), SKV_ERR_INVALID_ARG);
  CHECK_MSG_HAS("num_rows 0 out of range [1, 2147483647]");
  CHECK(c == NULL);
  c = fe_cache(&fe, 4, 0);
  r = req_make(9, 0, 0);
  CHECK_STATUS(skv_trim_overshoot(c, &r, 0), SKV_ERR_INVALID_ARG);
  CHECK_MSG_HAS("req_pool_idx 9 out of range [-1, 4)");
  r = req_make(0, 0, 0);
  r.finished_len = 3;
  CHECK_STATUS(skv_trim_overshoot(c, &r, 0), SKV_ERR_INVALID_ARG);
  CHECK_MSG_HAS("finished_len 3 out of range [-1, 0] (output_len)");
  skv_cache_free(c);
  fe_free(&fe);

  o = owned_new(16, 8);
  CHECK_STATUS(skv_pool_free(o, idx, 1), SKV_ERR_INVALID_ARG);
  CHECK_MSG_HAS("token index 5 is not in a usable page: valid indices are [16, 128)");
  skv_req_init(&r);
  CHECK_OK(skv_alloc_row(o, &r));
  CHECK_STATUS(skv_row_indices(o, 0, 3, 2, out), SKV_ERR_INVALID_ARG);
  CHECK_MSG_HAS("range [3, 2) runs backwards");
  CHECK_STATUS(skv_row_indices(o, -2, 0, 0, out), SKV_ERR_INVALID_ARG);
  CHECK_MSG_HAS("row -2 out of range [0, 4)");
  skv_cache_free(o);
}

int main(void) {
  hand_back_external();
  hand_back_owned();
  owned_stale_copy();
  page_frees();
  queries();
  messages();
  return ctest_summary();
}
