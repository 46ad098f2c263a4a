/* Hostile-input regressions (issue 23): caller arrays that overlap or are misaligned,
 * recurrent-state handles named twice, and window cursors a pool without free_kv_segment
 * could never release. Every refusal must leave everything as it was. */
#include <stdint.h>

#include "common.h"

static skv_cache *owned_cache(void) {
  skv_cache_config cfg;
  skv_cache *c = NULL;
  memset(&cfg, 0, sizeof cfg);
  cfg.struct_size = (uint32_t)sizeof cfg;
  cfg.page_size = 4;
  cfg.num_token_slots = 64 * 4;
  cfg.num_rows = 8;
  cfg.max_context_len = 64;
  CHECK_OK(skv_cache_new(&cfg, &c));
  return c;
}

/* A running request on a fresh row holding `len` committed tokens. */
static skv_req running(skv_cache *c, uint32_t len) {
  skv_req r;
  CHECK_OK(skv_req_init(&r));
  CHECK_OK(skv_alloc_row(c, &r));
  CHECK_OK(skv_alloc_extend(c, &r, len, NULL));
  CHECK_OK(skv_commit(c, &r, len));
  r.origin_input_len = len;
  return r;
}

static skv_stats stats_of(skv_cache *c) {
  skv_stats s;
  if (skv_cache_stats(c, &s) != SKV_OK) memset(&s, 0xff, sizeof s);
  return s;
}

static void check_clean(skv_cache *c) {
  skv_check_report rep;
  CHECK_OK(skv_cache_check(c, &rep));
  CHECK_EQ_U64(rep.violations, 0);
}

/* Nothing about the cache changed: its stats, the audit, and every row's indices. */
#define CHECK_STATS_SAME(a, b) CHECK(memcmp(&(a), &(b), sizeof(a)) == 0)

/* ------------------------------------------------------- overlapping arrays */

/* out_loc over reqs[1] (the data loss seen before: a failure at reqs[1] undid reqs[0]
 * from the slot indices written over the reqs), at every byte offset into the array. */
static void extend_batch_out_loc_over_reqs(void) {
  skv_cache *c = owned_cache();
  skv_req reqs[3], before[3];
  uint32_t n_tokens[3] = {4, 4, 4};
  skv_stats s0;
  size_t off;
  reqs[0] = running(c, 6);
  reqs[1] = running(c, 6);
  reqs[2] = running(c, 6);
  reqs[1].kv_committed_len = 7; /* reqs[1] is invalid: the batch fails there */
  memcpy(before, reqs, sizeof reqs);
  s0 = stats_of(c);
  for (off = 0; off < sizeof reqs; off += 3) {
    int32_t *out = (int32_t *)((unsigned char *)reqs + off);
    /* a misaligned out_loc is refused as such, an aligned one as an overlap */
    CHECK_STATUS(skv_alloc_extend_batch(c, reqs, 3, n_tokens, out, 12), SKV_ERR_INVALID_ARG);
    CHECK_MSG_HAS("skv_alloc_extend_batch");
    CHECK_MSG_HAS(off % 4 ? "not aligned" : "overlap");
    CHECK(memcmp(reqs, before, sizeof reqs) == 0);
  }
  { /* an out_loc starting 4 bytes before reqs: only its last value overlaps */
    uint64_t store[(sizeof reqs + 64) / 8];
    unsigned char *buf = (unsigned char *)store;
    skv_req *in = (skv_req *)(buf + 48);
    memcpy(in, before, sizeof reqs);
    in[1].kv_committed_len = 6;
    CHECK_STATUS(skv_alloc_extend_batch(c, in, 3, n_tokens, (int32_t *)(buf + 48 - 11 * 4), 12),
                 SKV_ERR_INVALID_ARG);
    CHECK_MSG_HAS("overlap");
    CHECK_MSG_HAS("out_loc");
    CHECK_MSG_HAS("reqs");
    /* ... and ending right where reqs begins: no byte shared, the call runs */
    CHECK_OK(skv_alloc_extend_batch(c, in, 3, n_tokens, (int32_t *)(buf + 48 - 12 * 4), 12));
    CHECK_EQ_INT(in[0].kv_allocated_len, 10);
  }
  {
    skv_stats s1 = stats_of(c);
    CHECK_EQ_U64(s1.free_pages + 3, s0.free_pages); /* only the good call took pages */
  }
  check_clean(c);
  skv_cache_free(c);
}

/* n_tokens inside reqs (legal C: n_tokens is const): a failure must not undo reqs[0] from a
 * count it changed while the batch ran. */
static void batch_counts_inside_reqs(void) {
  skv_cache *c = owned_cache();
  skv_req reqs[2], before[2];
  skv_stats s0;
  reqs[0] = running(c, 6);
  reqs[1] = running(c, 6);
  reqs[1].kv_committed_len = 7;
  memcpy(before, reqs, sizeof reqs);
  s0 = stats_of(c);
  CHECK_STATUS(skv_alloc_extend_batch(c, reqs, 2, &reqs[0].kv_allocated_len, NULL, 0),
               SKV_ERR_INVALID_ARG);
  CHECK_MSG_HAS("n_tokens");
  CHECK_MSG_HAS("overlap");
  CHECK(memcmp(reqs, before, sizeof reqs) == 0);
  CHECK_STATUS(skv_commit_batch(c, reqs, 2, &reqs[0].kv_committed_len), SKV_ERR_INVALID_ARG);
  CHECK_MSG_HAS("skv_commit_batch");
  CHECK(memcmp(reqs, before, sizeof reqs) == 0);
  {
    skv_stats s1 = stats_of(c);
    CHECK_STATS_SAME(s0, s1);
  }
  /* misaligned n_tokens and reqs */
  {
    uint32_t counts[3] = {1, 1, 0};
    CHECK_STATUS(skv_commit_batch(c, reqs, 2, (const uint32_t *)((const char *)counts + 2)),
                 SKV_ERR_INVALID_ARG);
    CHECK_MSG_HAS("not aligned");
    CHECK_STATUS(skv_commit_batch(c, (skv_req *)((char *)reqs + 4), 1, counts),
                 SKV_ERR_INVALID_ARG);
    CHECK_MSG_HAS("reqs");
  }
  check_clean(c);
  skv_cache_free(c);
}

/* Every other call that reads caller memory while it writes caller memory. */
static void single_calls_with_overlap(void) {
  skv_cache *c = owned_cache();
  skv_req r = running(c, 6), before;
  skv_stats s0;
  int32_t rows[4] = {0, 0, 0, 0};
  int32_t arr[16];
  size_t needed = 0;
  rows[0] = r.req_pool_idx;
  before = r;
  s0 = stats_of(c);
  /* out_loc over the req it extends */
  CHECK_STATUS(skv_alloc_extend(c, &r, 4, (int32_t *)&r.kv_committed_len), SKV_ERR_INVALID_ARG);
  CHECK_MSG_HAS("skv_alloc_extend");
  CHECK_REQ_SAME(&r, &before);
  /* the match's result over its req */
  CHECK_STATUS(skv_match_prefix(c, 1, 0, &r, 6, 0, (skv_match *)&r.kv_allocated_len),
               SKV_ERR_INVALID_ARG);
  CHECK_REQ_SAME(&r, &before);
  /* handled over the req */
  CHECK_STATUS(skv_checkpoint(c, 1, 0, &r, &r.output_len), SKV_ERR_INVALID_ARG);
  CHECK_REQ_SAME(&r, &before);
  /* the window step's count over the req */
  CHECK_STATUS(skv_swa_evict(c, &r, 6, 4, 1, -1, 0, &r.swa_evict_floor), SKV_ERR_INVALID_ARG);
  CHECK_REQ_SAME(&r, &before);
  /* indices over the req they would map */
  CHECK_STATUS(skv_map_prefix(c, &r, (const int32_t *)&r, 4), SKV_ERR_INVALID_ARG);
  /* counts over the indices */
  CHECK_STATUS(skv_page_refs(c, arr, 4, (uint32_t *)(arr + 3)), SKV_ERR_INVALID_ARG);
  CHECK_MSG_HAS("out_counts");
  /* the held totals over the rows listed */
  CHECK_STATUS(skv_session_held(c, arr, 4, (skv_held *)arr), SKV_ERR_INVALID_ARG);
  /* FlashInfer: each output over the rows, and the outputs over each other */
  CHECK_STATUS(skv_build_flashinfer(c, rows, 1, rows, arr, arr + 8, 4, &needed),
               SKV_ERR_INVALID_ARG);
  CHECK_MSG_HAS("kv_indptr");
  CHECK_STATUS(skv_build_flashinfer(c, rows, 1, arr, arr + 1, arr + 8, 4, &needed),
               SKV_ERR_INVALID_ARG);
  CHECK_STATUS(skv_build_flashinfer(c, rows, 1, arr, arr + 2, arr + 6, 4, (size_t *)(arr + 4)),
               SKV_ERR_INVALID_ARG);
  CHECK_MSG_HAS("needed");
  CHECK_EQ_U64(needed, 0);
  /* disjoint, the same arrays work */
  CHECK_OK(skv_build_flashinfer(c, rows, 1, arr, arr + 2, arr + 10, 4, &needed));
  CHECK_EQ_U64(needed, 2);
  {
    skv_stats s1 = stats_of(c);
    CHECK_STATS_SAME(s0, s1);
  }
  /* a misaligned out-pointer of a single-buffer call */
  {
    uint64_t buf[8];
    CHECK_STATUS(skv_row_indices(c, r.req_pool_idx, 0, 4, (int32_t *)((char *)buf + 1)),
                 SKV_ERR_INVALID_ARG);
    CHECK_MSG_HAS("not aligned to 4 bytes");
    CHECK_STATUS(skv_cache_stats(c, (skv_stats *)((char *)buf + 4)), SKV_ERR_INVALID_ARG);
  }
  check_clean(c);
  skv_cache_free(c);
}

/* --------------------------------------------------- recurrent handles twice */

static int aux_freed[64];

static int count_free_aux(void *ud, int64_t aux) {
  (void)ud;
  if (aux >= 0 && aux < 64) aux_freed[aux]++;
  return 0;
}

static void aux_handle_twice(void) {
  skv_cache *c = owned_cache();
  skv_engine_hooks hooks;
  skv_req r, before;
  skv_check_report rep;
  int pairs[3][3] = {{9, 9, -1}, {9, -1, 9}, {-1, 9, 9}}, i;
  memset(&hooks, 0, sizeof hooks);
  memset(aux_freed, 0, sizeof aux_freed);
  hooks.struct_size = (uint32_t)sizeof hooks;
  hooks.free_aux = count_free_aux;
  CHECK_OK(skv_cache_set_hooks(c, &hooks, NULL));
  r = running(c, 6);
  for (i = 0; i < 3; i++) {
    r.aux_state = pairs[i][0];
    r.aux_track[0] = pairs[i][1];
    r.aux_track[1] = pairs[i][2];
    before = r;
    CHECK_STATUS(skv_cache_finished_req(c, 1, 0, &r, 0), SKV_ERR_INVALID_ARG);
    CHECK_MSG_HAS("recurrent-state handle 9");
    CHECK_REQ_SAME(&r, &before);
    CHECK_STATUS(skv_cache_finished_req(c, 1, 0, &r, 1), SKV_ERR_INVALID_ARG);
    CHECK_REQ_SAME(&r, &before);
    CHECK_STATUS(skv_trim_overshoot(c, &r, 0), SKV_ERR_INVALID_ARG);
  }
  CHECK_EQ_INT(aux_freed[9], 0);
  /* distinct handles finish, and a release frees each once */
  r.aux_state = 9;
  r.aux_track[0] = 10;
  r.aux_track[1] = -1;
  CHECK_OK(skv_cache_finished_req(c, 1, 0, &r, 0));
  /* a second session kept with the same handle (a finish does not look at other slots):
   * the audit says so */
  r = running(c, 6);
  r.aux_state = 10;
  CHECK_OK(skv_cache_finished_req(c, 2, 0, &r, 0));
  CHECK_OK(skv_cache_check(c, &rep));
  CHECK_EQ_U64(rep.violations, 1);
  CHECK_STR_CONTAINS(rep.first_violation, "recurrent-state handle 10");
  CHECK_OK(skv_release_session(c, 1));
  CHECK_EQ_INT(aux_freed[9], 1);
  CHECK_EQ_INT(aux_freed[10], 1);
  check_clean(c);
  skv_cache_free(c);
}

/* ------------------------------- a cursor a pool without free_kv_segment cannot free */

/* ABI 3 ops without free_kv_segment: an engine that ran its window itself (libskv's window
 * step needs free_kv_segment) hands a req whose cursor passed swa_dead_lo. Stored in a slot,
 * it made every release SKV_ERR_UNSUPPORTED; now the first call carrying it refuses it. */
static void cursor_without_segment_frees(void) {
  fake_engine fe;
  skv_cache *c;
  skv_pool_ops ops;
  skv_cache_config cfg;
  skv_req r, before;
  fe_init(&fe, 4, 32);
  ops = fe_ops();
  ops.free_kv_segment = NULL; /* struct_size is this header's: an ABI 3 caller */
  cfg = fe_config(&fe, 4, 0);
  c = NULL;
  CHECK_OK(skv_cache_new_external(&cfg, &ops, &fe, &c));
  r = req_make(0, 16, 16);
  r.origin_input_len = 16;
  r.swa_evicted_seqlen = 8; /* the engine freed [0, 8) of its SWA pool itself */
  before = r;
  CHECK_STATUS(skv_cache_finished_req(c, 1, 0, &r, 0), SKV_ERR_INVALID_ARG);
  CHECK_MSG_HAS("free_kv_segment");
  CHECK_REQ_SAME(&r, &before);
  CHECK_STATUS(skv_cache_finished_req(c, 1, 0, &r, 1), SKV_ERR_INVALID_ARG);
  CHECK_STATUS(skv_match_prefix(c, 1, 0, &r, 16, 0, &(skv_match){0, 0}), SKV_ERR_INVALID_ARG);
  CHECK_STATUS(skv_free_tail(c, &r, 8), SKV_ERR_INVALID_ARG);
  CHECK_REQ_SAME(&r, &before);
  CHECK_NO_CALLS(&fe);
  /* a floor shields the window: a cursor up to swa_dead_lo freed nothing */
  r.swa_evict_floor = 8;
  CHECK_OK(skv_cache_finished_req(c, 1, 0, &r, 0));
  CHECK_OK(skv_release_session(c, 1));
  CHECK_EQ_U64(fe_count_kind(&fe, FE_FREE_ROW), 1);
  /* a later turn whose req's protected prefix grew: its cursor is below the req's
   * swa_dead_lo but past the one of the slot, which keeps its first turn's prefix */
  r = req_make(1, 16, 16);
  r.origin_input_len = 16;
  CHECK_OK(skv_cache_finished_req(c, 2, 0, &r, 0));
  {
    skv_match m;
    r = req_make(-1, 0, 0);
    r.origin_input_len = 20;
    CHECK_OK(skv_match_prefix(c, 2, 0, &r, 16, 0, &m));
    CHECK_EQ_INT(m.hit, 1);
  }
  r.kv_allocated_len = r.kv_committed_len = 20;
  r.cache_protected_len = 16;
  r.swa_evicted_seqlen = 8;
  before = r;
  CHECK_STATUS(skv_cache_finished_req(c, 2, 0, &r, 0), SKV_ERR_INVALID_ARG);
  CHECK_MSG_HAS("free_kv_segment");
  CHECK_REQ_SAME(&r, &before);
  r.swa_evicted_seqlen = 0;
  CHECK_OK(skv_cache_finished_req(c, 2, 0, &r, 0));
  CHECK_OK(skv_release_session(c, 2));
  skv_cache_free(c);
  fe_free(&fe);
  /* an ABI 2 caller's free_kv takes every free whole, window included, as it always did */
  fe_init(&fe, 4, 32);
  c = fe_cache_abi2(&fe, 4, 0);
  r = req_make(0, 16, 16);
  r.origin_input_len = 16;
  r.swa_evicted_seqlen = 8;
  CHECK_OK(skv_cache_finished_req(c, 1, 0, &r, 0));
  CHECK_OK(skv_release_session(c, 1));
  skv_cache_free(c);
  fe_free(&fe);
}

int main(void) {
  extend_batch_out_loc_over_reqs();
  batch_counts_inside_reqs();
  single_calls_with_overlap();
  aux_handle_twice();
  cursor_without_segment_frees();
  return ctest_summary();
}
