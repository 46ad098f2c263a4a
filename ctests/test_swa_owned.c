/* Owned mode with an SWA pool (swa_num_token_slots): every page a row maps takes an SWA page
 * until the window passes it, skv_swa_evict gives the window's SWA pages back, every free
 * returns each side a page still holds, the views give the SWA layers their ids, and the
 * stats and the audit see both pools. Refusals change nothing. */
#include <stddef.h>

#include "common.h"

#define PS 4u

static skv_cache *hybrid(uint32_t pages, uint32_t swa_pages) {
  skv_cache_config cfg;
  skv_cache *c = NULL;
  memset(&cfg, 0, sizeof cfg);
  cfg.struct_size = sizeof cfg;
  cfg.page_size = PS;
  cfg.num_token_slots = (uint64_t)pages * PS;
  cfg.num_rows = 4;
  cfg.max_context_len = 256;
  cfg.swa_num_token_slots = (uint64_t)swa_pages * PS;
  CHECK_OK(skv_cache_new(&cfg, &c));
  return c;
}

static skv_stats stats(const skv_cache *c) {
  skv_stats s;
  memset(&s, 0, sizeof s);
  CHECK_OK(skv_cache_stats(c, &s));
  return s;
}

static void audit_clean(const skv_cache *c) {
  skv_check_report rep;
  CHECK_OK(skv_cache_check(c, &rep));
  CHECK_EQ_U64(rep.violations, 0);
  if (rep.violations) fprintf(stderr, "    %s\n", rep.first_violation);
  {
    skv_stats s = stats(c);
    CHECK_EQ_U64(rep.swa_pages_free, s.swa_free_pages);
    CHECK_EQ_U64(rep.swa_pages_in_use, s.swa_used_pages);
  }
}

/* A running turn: a fresh row extended to len tokens, all committed, origin prompt tokens. */
static skv_req turn(skv_cache *c, uint32_t origin, uint32_t len) {
  skv_req r;
  skv_req_init(&r);
  CHECK_OK(skv_alloc_row(c, &r));
  CHECK_OK(skv_alloc_extend(c, &r, len, NULL));
  CHECK_OK(skv_commit(c, &r, len));
  r.origin_input_len = origin;
  r.output_len = len - origin;
  return r;
}

static void config_sizes(void) {
  skv_cache_config cfg;
  skv_cache *c = NULL;
  CHECK_EQ_INT(sizeof(skv_cache_config), 80);
  CHECK_EQ_INT(offsetof(skv_cache_config, swa_num_token_slots), 32);
  CHECK_EQ_INT(offsetof(skv_cache_config, host_num_token_slots), 40);
  CHECK_EQ_INT(offsetof(skv_cache_config, tier_pages_per_step), 76);
  CHECK_EQ_INT(sizeof(skv_stats), 88);
  memset(&cfg, 0, sizeof cfg);
  cfg.struct_size = sizeof cfg;
  cfg.page_size = PS;
  cfg.num_token_slots = 64;
  cfg.num_rows = 2;
  cfg.max_context_len = 32;
  /* not whole pages, a single (padding) page, past int32 indices */
  cfg.swa_num_token_slots = 30;
  CHECK_STATUS(skv_cache_new(&cfg, &c), SKV_ERR_INVALID_ARG);
  CHECK_MSG_HAS("swa_num_token_slots 30");
  cfg.swa_num_token_slots = PS;
  CHECK_STATUS(skv_cache_new(&cfg, &c), SKV_ERR_INVALID_ARG);
  cfg.swa_num_token_slots = (uint64_t)1 << 32;
  CHECK_STATUS(skv_cache_new(&cfg, &c), SKV_ERR_INVALID_ARG);
  CHECK(c == NULL);
  /* a 32-byte config (before swa_num_token_slots) makes a cache without an SWA pool */
  cfg.struct_size = 32;
  CHECK_OK(skv_cache_new(&cfg, &c));
  CHECK_EQ_U64(stats(c).swa_total_pages, 0);
  skv_cache_free(c);
}

static void window_frees_the_swa_side(void) {
  skv_cache *c = hybrid(32, 16);
  skv_req r = turn(c, 20, 22);
  uint32_t freed = 99;
  int32_t ids[22], full[22];
  skv_stats s = stats(c);
  CHECK_EQ_U64(s.swa_total_pages, 16);
  CHECK_EQ_U64(s.used_pages, 6);
  CHECK_EQ_U64(s.swa_used_pages, 6);
  /* 22 - 8 = 14, floored to a page: [0, 12) slides out */
  CHECK_OK(skv_swa_evict(c, &r, 22, 8, 1, -1, SKV_SWA_NO_PREFIX_SHARING, &freed));
  CHECK_EQ_INT(freed, 12);
  CHECK_EQ_INT(r.swa_evicted_seqlen, 12);
  s = stats(c);
  CHECK_EQ_U64(s.used_pages, 6);
  CHECK_EQ_U64(s.swa_used_pages, 3);
  CHECK_OK(skv_row_swa_indices(c, r.req_pool_idx, 0, 22, ids));
  CHECK_OK(skv_row_indices(c, r.req_pool_idx, 0, 22, full));
  CHECK(ids[0] == 0 && ids[11] == 0);
  CHECK(ids[12] > 0 && ids[12] % (int32_t)PS == 0 && ids[13] == ids[12] + 1);
  CHECK(full[0] > 0 && full[11] > 0);
  audit_clean(c);
  {
    int32_t rows[1], indptr[2], idx[8], last[1];
    size_t needed = 0;
    rows[0] = r.req_pool_idx;
    CHECK_OK(skv_build_flashinfer_swa(c, rows, 1, indptr, idx, last, 8, &needed));
    CHECK_EQ_U64(needed, 6);
    CHECK_EQ_INT(indptr[1], 6);
    CHECK_EQ_INT(last[0], 2);
    CHECK(idx[0] == 0 && idx[2] == 0 && idx[3] == ids[12] / (int32_t)PS);
    CHECK_OK(skv_build_flashinfer(c, rows, 1, indptr, idx, last, 8, &needed));
    CHECK_EQ_INT(idx[0], full[0] / (int32_t)PS);
  }
  /* the finish keeps the turn, the release gives back both sides */
  CHECK_OK(skv_cache_finished_req(c, 5, 0, &r, 0));
  audit_clean(c);
  CHECK_OK(skv_release_session(c, 5));
  s = stats(c);
  CHECK_EQ_U64(s.used_pages, 0);
  CHECK_EQ_U64(s.swa_used_pages, 0);
  CHECK_EQ_U64(s.swa_free_pages, 15);
  audit_clean(c);
  skv_cache_free(c);
}

static void trim_match_abort(void) {
  skv_cache *c = hybrid(64, 32);
  skv_req r = turn(c, 10, 30), next;
  skv_match m;
  uint32_t freed = 0;
  int32_t ids[40];
  CHECK_OK(skv_swa_evict(c, &r, 30, 6, 1, -1, SKV_SWA_NO_PREFIX_SHARING, &freed));
  CHECK_EQ_INT(r.swa_evicted_seqlen, 24);
  /* the turn ended at 10 + 12 = 22: with the cursor past it the trim floors to 20 */
  r.finished_len = 12;
  CHECK_OK(skv_cache_finished_req(c, 7, 0, &r, 0));
  CHECK_EQ_U64(stats(c).used_pages, 5);
  CHECK_EQ_U64(stats(c).swa_used_pages, 0);
  audit_clean(c);
  skv_req_init(&next);
  next.origin_input_len = 40;
  CHECK_OK(skv_match_prefix(c, 7, 0, &next, 40, 0, &m));
  CHECK_EQ_INT(m.hit, 1);
  CHECK_EQ_INT(m.prefix_len, 20);
  CHECK_EQ_INT(next.swa_evicted_seqlen, 20);
  CHECK_OK(skv_alloc_extend(c, &next, 20, NULL));
  CHECK_EQ_U64(stats(c).swa_used_pages, 5);
  CHECK_OK(skv_row_swa_indices(c, next.req_pool_idx, 0, 40, ids));
  CHECK(ids[19] == 0 && ids[20] > 0);
  audit_clean(c);
  /* a req whose cursor disagrees with the row's record is refused, nothing changed */
  {
    skv_req lie = next;
    lie.swa_evicted_seqlen = 0;
    CHECK_STATUS(skv_alloc_extend(c, &lie, 1, NULL), SKV_ERR_INVALID_ARG);
    CHECK_MSG_HAS("skv_alloc_extend");
    CHECK_MSG_HAS("swa_evicted_seqlen 0 != 20");
    CHECK_EQ_INT(lie.kv_allocated_len, 40);
  }
  CHECK_OK(skv_cache_finished_req(c, 7, 0, &next, 1));
  CHECK_EQ_U64(stats(c).used_pages, 0);
  CHECK_EQ_U64(stats(c).swa_used_pages, 0);
  audit_clean(c);
  skv_cache_free(c);
}

static void swa_pool_exhaustion(void) {
  skv_cache *c = hybrid(32, 4); /* 3 usable SWA pages */
  skv_req r = turn(c, 4, 8), before;
  uint32_t freed = 0;
  skv_stats s0 = stats(c), s1;
  int32_t tree[8];
  before = r;
  CHECK_STATUS(skv_alloc_extend(c, &r, 8, NULL), SKV_ERR_OUT_OF_MEMORY);
  CHECK_MSG_HAS("SWA pages needed");
  CHECK_REQ_SAME(&r, &before);
  CHECK_STATUS(skv_pool_alloc(c, 8, tree), SKV_ERR_OUT_OF_MEMORY);
  s1 = stats(c);
  CHECK(memcmp(&s0, &s1, sizeof s0) == 0);
  /* the window makes room */
  CHECK_OK(skv_swa_evict(c, &r, 8, 4, 1, -1, SKV_SWA_NO_PREFIX_SHARING, &freed));
  CHECK_EQ_INT(freed, 4);
  CHECK_OK(skv_alloc_extend(c, &r, 4, NULL));
  audit_clean(c);
  CHECK_OK(skv_free_req(c, &r));
  CHECK_EQ_U64(stats(c).swa_free_pages, 3);
  skv_cache_free(c);
}

static void engine_held_prefix(void) {
  skv_cache *c = hybrid(32, 32);
  int32_t tree[8], ids[12], full[12];
  skv_req r;
  CHECK_OK(skv_pool_alloc(c, 8, tree));
  CHECK_EQ_U64(stats(c).swa_used_pages, 2);
  skv_req_init(&r);
  CHECK_OK(skv_alloc_row(c, &r));
  CHECK_OK(skv_map_prefix(c, &r, tree, 8));
  CHECK_OK(skv_alloc_extend(c, &r, 4, NULL));
  CHECK_OK(skv_commit(c, &r, 4));
  CHECK_OK(skv_row_swa_indices(c, r.req_pool_idx, 0, 12, ids));
  CHECK(ids[0] > 0 && ids[8] > 0);
  CHECK_OK(skv_publish_prefix(c, &r, 12));
  CHECK_OK(skv_row_indices(c, r.req_pool_idx, 0, 12, full));
  CHECK_OK(skv_free_req(c, &r));
  /* every page is now the engine's, with its SWA page */
  CHECK_EQ_U64(stats(c).swa_used_pages, 3);
  audit_clean(c);
  CHECK_OK(skv_pool_free(c, full, 12));
  CHECK_EQ_U64(stats(c).swa_used_pages, 0);
  CHECK_EQ_U64(stats(c).used_pages, 0);
  audit_clean(c);
  skv_cache_free(c);
}

static void without_an_swa_pool(void) {
  skv_cache *c = hybrid(32, 0);
  skv_req r = turn(c, 4, 8);
  int32_t ids[8], rows[1], indptr[2], idx[4], last[1];
  size_t needed = 7;
  uint32_t freed = 0;
  CHECK_STATUS(skv_row_swa_indices(c, r.req_pool_idx, 0, 8, ids), SKV_ERR_UNSUPPORTED);
  CHECK_MSG_HAS("skv_row_swa_indices");
  CHECK_MSG_HAS("swa_num_token_slots 0");
  rows[0] = r.req_pool_idx;
  CHECK_STATUS(skv_build_flashinfer_swa(c, rows, 1, indptr, idx, last, 4, &needed),
               SKV_ERR_UNSUPPORTED);
  CHECK_EQ_U64(needed, 7);
  CHECK_STATUS(skv_swa_evict(c, &r, 8, 4, 1, -1, 0, &freed), SKV_ERR_UNSUPPORTED);
  CHECK_MSG_HAS("swa_num_token_slots 0");
  /* without a pool the engine keeps the cursor: libskv does not check it */
  r.swa_evicted_seqlen = 4;
  CHECK_OK(skv_alloc_extend(c, &r, 1, NULL));
  CHECK_OK(skv_free_req(c, &r));
  skv_cache_free(c);
}

int main(void) {
  config_sizes();
  window_frees_the_swa_side();
  trim_match_abort();
  swa_pool_exhaustion();
  engine_held_prefix();
  without_an_swa_pool();
  return ctest_summary();
}
