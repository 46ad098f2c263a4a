/* The golden cases of docs/operations.md and a full streaming session through the C ABI, external
 * mode, comparing every callback the fake engine sees. */
#include "common.h"

/* 1. Trim postcondition, ps=1. The SWA cursor cases here are ABI 2 callers (fe_cache_abi2):
 * free_kv takes each free whole; test_swa.c has the free_kv_segment split. */
static void golden_trim_postcondition(void) {
  fake_engine fe;
  skv_cache *c;
  skv_req r = req_make(0, 40, 44);
  const fe_expect exp[] = {FE_KV(38, 44)};
  fe_init(&fe, 4, 128);
  c = fe_cache_abi2(&fe, 1, 0);
  r.origin_input_len = 26;
  r.output_len = 14;
  r.swa_evicted_seqlen = 42;
  CHECK_OK(skv_trim_overshoot(c, &r, 12));
  CHECK_FREES(&fe, exp);
  CHECK_EQ_INT(r.req_pool_idx, 0);
  CHECK_EQ_INT(r.kv_committed_len, 38);
  CHECK_EQ_INT(r.kv_allocated_len, 38);
  CHECK_EQ_INT(r.swa_evicted_seqlen, 38);
  CHECK_EQ_INT(r.output_len, 12);
  CHECK_EQ_INT(r.origin_input_len, 26);
  CHECK_EQ_INT(r.finished_len, -1);
  skv_cache_free(c);
  fe_free(&fe);
}

/* 2. Finish with an over-allocated tail, ps=16: the partial page 16..31 stays. */
static void golden_finish_overallocated(void) {
  fake_engine fe;
  skv_cache *c;
  skv_req r = req_make(0, 17, 40), next;
  skv_match m;
  const fe_expect exp[] = {FE_KV(32, 40)};
  fe_init(&fe, 4, 128);
  c = fe_cache(&fe, 16, 0);
  r.origin_input_len = 17;
  CHECK_OK(skv_cache_finished_req(c, 1, 0, &r, 0));
  CHECK_FREES(&fe, exp);
  CHECK(req_is_empty(&r));
  CHECK_EQ_INT(r.output_len, 0);
  CHECK_EQ_INT(r.origin_input_len, 17);
  CHECK_EQ_INT(r.finished_len, -1);
  /* the slot holds committed = allocated = 17: ceil_align(17) = 32 tokens held */
  CHECK_HELD(held_of(c, NULL, 0), 32, 32, 1, 0, 1);
  fe_reset_calls(&fe);
  CHECK_OK(skv_req_init(&next));
  CHECK_OK(skv_match_prefix(c, 1, 0, &next, 100, 0, &m));
  CHECK_EQ_INT(m.hit, 1);
  CHECK_EQ_INT(m.prefix_len, 17);
  CHECK_EQ_INT(next.req_pool_idx, 0);
  CHECK_EQ_INT(next.kv_committed_len, 17);
  CHECK_EQ_INT(next.kv_allocated_len, 17);
  CHECK_NO_CALLS(&fe);
  skv_cache_free(c);
  fe_free(&fe);
}

/* 3. First-turn mid abort, ps=1. */
static void golden_first_turn_abort(void) {
  fake_engine fe;
  skv_cache *c;
  skv_req r = req_make(0, 0, 20);
  const fe_expect exp[] = {FE_KV(0, 20), FE_ROW(0)};
  fe_init(&fe, 4, 128);
  c = fe_cache(&fe, 1, 0);
  CHECK_OK(skv_cache_finished_req(c, 1, 0, &r, 1));
  CHECK_FREES(&fe, exp);
  CHECK(req_is_empty(&r));
  CHECK_HELD(held_of(c, NULL, 0), 0, 0, 0, 0, 0);
  skv_cache_free(c);
  fe_free(&fe);
}

/* 4. Nth-turn mid abort, ps=1: the running request's allocation is what gets freed. */
static void golden_nth_turn_abort(void) {
  fake_engine fe;
  skv_cache *c;
  skv_req r;
  skv_match m;
  const fe_expect exp[] = {FE_KV(0, 65), FE_ROW(0)};
  fe_init(&fe, 4, 128);
  c = fe_cache(&fe, 1, 0);
  fe_save_slot(c, &fe, 1, 0, 0, 0, 50, 0, 0, -1);
  CHECK_OK(skv_req_init(&r));
  r.origin_input_len = 55;
  CHECK_OK(skv_match_prefix(c, 1, 0, &r, 54, 0, &m));
  CHECK_EQ_INT(m.hit, 1);
  CHECK_EQ_INT(m.prefix_len, 50);
  CHECK_NO_CALLS(&fe);
  r.kv_committed_len = 60;
  r.kv_allocated_len = 65;
  CHECK_OK(skv_cache_finished_req(c, 1, 0, &r, 1));
  CHECK_FREES(&fe, exp);
  CHECK(req_is_empty(&r));
  CHECK_HELD(held_of(c, NULL, 0), 0, 0, 0, 0, 0);
  skv_cache_free(c);
  fe_free(&fe);
}

/* 5. Pre-abort, ps=16: hit 0 and the slot stays exactly as it was. */
static void golden_pre_abort(void) {
  fake_engine fe;
  skv_cache *c;
  skv_req r, before;
  skv_match m;
  const fe_expect exp[] = {FE_LOCK(7, 8), FE_KV(16, 48), FE_ROW(0)};
  fe_init(&fe, 4, 128);
  c = fe_cache(&fe, 16, 0);
  fe_save_slot(c, &fe, 1, 0, 0, 16, 48, 7, 8, -1);
  CHECK_OK(skv_req_init(&r));
  before = r;
  m.hit = 99;
  m.prefix_len = 99;
  CHECK_OK(skv_match_prefix(c, 1, 0, &r, 64, 1, &m));
  CHECK_EQ_INT(m.hit, 0);
  CHECK_EQ_INT(m.prefix_len, 0);
  CHECK_REQ_SAME(&r, &before);
  CHECK_NO_CALLS(&fe);
  CHECK_HELD(held_of(c, NULL, 0), 32, 32, 1, 0, 1);
  /* the slot is not in flight: it can be released, and frees exactly what it held */
  CHECK_OK(skv_release_session(c, 1));
  CHECK_FREES(&fe, exp);
  skv_cache_free(c);
  fe_free(&fe);
}

/* 6. Branches, ps=16, rows of 256: released in the order they were saved. */
static void golden_branches(void) {
  fake_engine fe;
  skv_cache *c;
  const uint64_t plan = 11, tool = 3; /* ids need not follow creation order */
  const fe_expect exp[] = {FE_KV(0, 48), FE_ROW(0), FE_KV(256, 320), FE_ROW(1)};
  fe_init(&fe, 4, 256);
  c = fe_cache(&fe, 16, 0);
  fe_save_slot(c, &fe, 9, plan, 0, 0, 48, 0, 0, -1);
  fe_save_slot(c, &fe, 9, tool, 1, 0, 64, 0, 0, -1);
  CHECK_HELD(held_of(c, NULL, 0), 112, 112, 2, 0, 2);
  CHECK_OK(skv_release_session(c, 9));
  CHECK_FREES(&fe, exp);
  CHECK_HELD(held_of(c, NULL, 0), 0, 0, 0, 0, 0);
  skv_cache_free(c);
  fe_free(&fe);
}

/* A branch released and saved again goes last; release_branch touches one branch. */
static void branch_order_after_resave(void) {
  fake_engine fe;
  skv_cache *c;
  const fe_expect exp_b5[] = {FE_KV(0, 16), FE_ROW(0)};
  const fe_expect exp_all[] = {FE_KV(128, 136), FE_ROW(1), FE_KV(256, 260), FE_ROW(2)};
  fe_init(&fe, 4, 128);
  c = fe_cache(&fe, 4, 0);
  fe_save_slot(c, &fe, 1, 5, 0, 0, 16, 0, 0, -1);
  fe_save_slot(c, &fe, 1, 2, 1, 0, 8, 0, 0, -1);
  fe_save_slot(c, &fe, 2, 0, 3, 0, 4, 0, 0, -1);
  CHECK_OK(skv_release_branch(c, 1, 5));
  CHECK_FREES(&fe, exp_b5);
  fe_reset_calls(&fe);
  CHECK_OK(skv_release_branch(c, 1, 5)); /* gone: OK, nothing to do */
  CHECK_NO_CALLS(&fe);
  fe_save_slot(c, &fe, 1, 5, 2, 0, 4, 0, 0, -1);
  CHECK_OK(skv_release_session(c, 1));
  CHECK_FREES(&fe, exp_all);
  /* the other session is untouched */
  CHECK_HELD(held_of(c, NULL, 0), 4, 4, 1, 0, 1);
  fe_reset_calls(&fe);
  CHECK_OK(skv_release_session(c, 1));
  CHECK_OK(skv_release_session(c, 77));
  CHECK_OK(skv_release_branch(c, 77, 3));
  CHECK_NO_CALLS(&fe);
  skv_cache_free(c);
  fe_free(&fe);
}

/* match miss -> run -> finish with a trim -> match hit with a tail free -> finish ->
 * release, ps=4, row 2 (indices 256 + position). */
static void streaming_session(void) {
  fake_engine fe;
  skv_cache *c;
  skv_req r, before;
  skv_match m;
  uint32_t handled;
  const int32_t active[] = {2};
  const int32_t other_active[] = {0, 1, 3};
  const fe_expect exp_trim1[] = {FE_KV(256 + 28, 256 + 31)};
  const fe_expect exp_tail[] = {FE_KV(256 + 28, 256 + 40)};
  const fe_expect exp_trim2[] = {FE_KV(256 + 36, 256 + 42)};
  const fe_expect exp_release[] = {FE_KV(256, 256 + 35), FE_ROW(2)};
  fe_init(&fe, 4, 128);
  c = fe_cache(&fe, 4, 0);

  /* turn 1: a 20-token prompt, no slot yet */
  CHECK_OK(skv_req_init(&r));
  r.origin_input_len = 20;
  before = r;
  m.hit = 5;
  CHECK_OK(skv_match_prefix(c, 1, 0, &r, 19, 0, &m));
  CHECK_EQ_INT(m.hit, 0);
  CHECK_EQ_INT(m.prefix_len, 0);
  CHECK_REQ_SAME(&r, &before);
  /* the engine takes row 2 and runs: a verify round overshoots a stop token at 6 */
  r.req_pool_idx = 2;
  r.kv_committed_len = 29;
  r.kv_allocated_len = 31;
  handled = 7;
  CHECK_OK(skv_checkpoint(c, 1, 0, &r, &handled));
  CHECK_EQ_INT(handled, 0);
  r.output_len = 9;
  r.finished_len = 6;
  CHECK_OK(skv_cache_finished_req(c, 1, 0, &r, 0));
  /* target 26: positions 26, 27 stay in the page that holds 24, 25 */
  CHECK_FREES(&fe, exp_trim1);
  CHECK(req_is_empty(&r));
  CHECK_EQ_INT(r.output_len, 6);
  CHECK_EQ_INT(r.finished_len, 6);
  CHECK_EQ_INT(r.origin_input_len, 20);
  CHECK_HELD(held_of(c, NULL, 0), 28, 28, 1, 0, 1);
  CHECK_HELD(held_of(c, active, 1), 0, 0, 0, 0, 1);
  CHECK_HELD(held_of(c, other_active, 3), 28, 28, 1, 0, 1);
  fe_reset_calls(&fe);

  /* turn 2: history 26 + 4 new tokens */
  CHECK_OK(skv_req_init(&r));
  r.origin_input_len = 30;
  CHECK_OK(skv_match_prefix(c, 1, 0, &r, 29, 0, &m));
  CHECK_EQ_INT(m.hit, 1);
  CHECK_EQ_INT(m.prefix_len, 26);
  CHECK_EQ_INT(r.req_pool_idx, 2);
  CHECK_EQ_INT(r.kv_committed_len, 26);
  CHECK_EQ_INT(r.kv_allocated_len, 26);
  CHECK_EQ_INT(r.cache_protected_len, 0);
  CHECK_EQ_INT(r.swa_evicted_seqlen, 0);
  CHECK_EQ_INT(r.aux_state, -1);
  CHECK_EQ_INT(r.origin_input_len, 30);
  CHECK_NO_CALLS(&fe);
  CHECK_OK(skv_checkpoint(c, 1, 0, &r, &handled));
  CHECK_EQ_INT(handled, 1);
  /* in flight: releasing would free KV the running request reads */
  before = r;
  CHECK_STATUS(skv_release_session(c, 1), SKV_ERR_STATE);
  CHECK_STATUS(skv_release_branch(c, 1, 0), SKV_ERR_STATE);
  CHECK_NO_CALLS(&fe);
  CHECK_REQ_SAME(&r, &before);
  CHECK_HELD(held_of(c, NULL, 0), 28, 28, 1, 0, 1);
  /* the engine extends, then the scheduler rejects the request; the retried match frees
   * the extension past the page that holds the prefix's end */
  r.kv_allocated_len = 40;
  CHECK_OK(skv_match_prefix(c, 1, 0, &r, 29, 0, &m));
  CHECK_EQ_INT(m.hit, 1);
  CHECK_EQ_INT(m.prefix_len, 26);
  CHECK_FREES(&fe, exp_tail);
  CHECK_EQ_INT(r.req_pool_idx, 2);
  CHECK_EQ_INT(r.kv_committed_len, 26);
  CHECK_EQ_INT(r.kv_allocated_len, 26);
  fe_reset_calls(&fe);
  /* runs: 30 prompt tokens, 12 outputs of which 5 are real */
  r.kv_committed_len = 41;
  r.kv_allocated_len = 42;
  r.output_len = 12;
  r.finished_len = 5;
  CHECK_OK(skv_cache_finished_req(c, 1, 0, &r, 0));
  CHECK_FREES(&fe, exp_trim2);
  CHECK(req_is_empty(&r));
  CHECK_EQ_INT(r.output_len, 5);
  CHECK_HELD(held_of(c, NULL, 0), 36, 36, 1, 0, 1);
  fe_reset_calls(&fe);

  /* the finish ended the flight: the session can be released */
  CHECK_OK(skv_release_session(c, 1));
  CHECK_FREES(&fe, exp_release);
  CHECK_HELD(held_of(c, NULL, 0), 0, 0, 0, 0, 0);
  fe_reset_calls(&fe);
  CHECK_OK(skv_release_session(c, 1));
  CHECK_NO_CALLS(&fe);
  skv_cache_free(c);
  fe_free(&fe);
}

/* A new prompt that reuses less than the session committed frees the tail past the page
 * holding the reused prefix's end. */
static void match_shorter_key_frees_tail(void) {
  fake_engine fe;
  skv_cache *c;
  skv_req r;
  skv_match m;
  const fe_expect exp[] = {FE_KV(24, 26)};
  fe_init(&fe, 2, 64);
  c = fe_cache(&fe, 4, 0);
  fe_save_slot(c, &fe, 4, 0, 0, 0, 26, 0, 0, -1);
  CHECK_OK(skv_req_init(&r));
  CHECK_OK(skv_match_prefix(c, 4, 0, &r, 22, 0, &m));
  CHECK_EQ_INT(m.hit, 1);
  CHECK_EQ_INT(m.prefix_len, 22);
  CHECK_FREES(&fe, exp);
  CHECK_EQ_INT(r.kv_committed_len, 22);
  CHECK_EQ_INT(r.kv_allocated_len, 22);
  /* the slot mirrors the req: 22 allocated, held as ceil_align(22) = 24 */
  CHECK_HELD(held_of(c, NULL, 0), 24, 24, 1, 0, 1);
  skv_cache_free(c);
  fe_free(&fe);
}

/* With a sliding-window cursor past the boundary, the trim target is floor-aligned. */
static void swa_floor_aligned_trim(void) {
  fake_engine fe;
  skv_cache *c;
  skv_req r = req_make(0, 24, 25);
  const fe_expect exp[] = {FE_KV(20, 25)};
  fe_init(&fe, 2, 64);
  c = fe_cache_abi2(&fe, 4, 0);
  r.origin_input_len = 20;
  r.output_len = 5;
  r.swa_evicted_seqlen = 23;
  CHECK_OK(skv_trim_overshoot(c, &r, 2));
  CHECK_FREES(&fe, exp);
  CHECK_EQ_INT(r.kv_committed_len, 20);
  CHECK_EQ_INT(r.kv_allocated_len, 20);
  CHECK_EQ_INT(r.swa_evicted_seqlen, 20);
  CHECK_EQ_INT(r.output_len, 2);
  skv_cache_free(c);
  fe_free(&fe);
}

/* Held numbers with protected prefixes, SWA cursors and aux states; a release hands back
 * the lock first and the aux state last. */
static void held_and_release_order(void) {
  fake_engine fe;
  skv_cache *c;
  skv_req r = req_make(0, 21, 21);
  const int32_t a0[] = {0};
  const int32_t a013[] = {0, 1, 3};
  const fe_expect exp[] = {FE_LOCK(70, 71), FE_KV(8, 21), FE_ROW(0), FE_AUX(5)};
  fe_init(&fe, 4, 64);
  c = fe_cache_abi2(&fe, 4, 0);
  r.cache_protected_len = 8;
  r.swa_evicted_seqlen = 12;
  r.origin_input_len = 21;
  r.lock_node = 70;
  r.lock_receipt = 71;
  r.aux_state = 5;
  CHECK_OK(skv_cache_finished_req(c, 1, 0, &r, 0));
  CHECK_NO_CALLS(&fe);
  fe_save_slot(c, &fe, 2, 0, 1, 0, 10, 0, 0, -1);
  /* 24-8 + 12-0 full; 24-max(8,12) + 12 swa */
  CHECK_HELD(held_of(c, NULL, 0), 28, 24, 2, 1, 2);
  CHECK_HELD(held_of(c, a0, 1), 12, 12, 1, 0, 2);
  CHECK_HELD(held_of(c, a013, 3), 0, 0, 0, 0, 2);
  CHECK_OK(skv_release_branch(c, 1, 0));
  CHECK_FREES(&fe, exp);
  CHECK_HELD(held_of(c, NULL, 0), 12, 12, 1, 0, 1);
  skv_cache_free(c);
  fe_free(&fe);
}

/* A later turn keeps the first turn's lock and protected prefix but takes the req's aux;
 * an aborted finish releases the running request's aux and its full allocation. */
static void later_turn_keeps_lock_takes_aux(void) {
  fake_engine fe;
  skv_cache *c;
  skv_req r;
  skv_match m;
  const fe_expect exp_release[] = {FE_LOCK(7, 8), FE_KV(8, 30), FE_ROW(0), FE_AUX(12)};
  const fe_expect exp_abort[] = {FE_LOCK(7, 8), FE_KV(64 + 8, 64 + 40), FE_ROW(1), FE_AUX(13)};
  fe_init(&fe, 4, 64);
  c = fe_cache(&fe, 4, 0);
  fe_save_slot(c, &fe, 3, 0, 0, 8, 16, 7, 8, 11);
  CHECK_OK(skv_req_init(&r));
  CHECK_OK(skv_match_prefix(c, 3, 0, &r, 40, 0, &m));
  CHECK_EQ_INT(m.hit, 1);
  CHECK_EQ_INT(r.cache_protected_len, 8);
  CHECK_EQ_U64(r.lock_node, 7);
  CHECK_EQ_U64(r.lock_receipt, 8);
  CHECK_EQ_INT(r.aux_state, 11);
  r.kv_committed_len = r.kv_allocated_len = 30;
  r.origin_input_len = 30;
  r.lock_node = 99; /* not the session's: the first turn's lock stays */
  r.aux_state = 12;
  CHECK_OK(skv_cache_finished_req(c, 3, 0, &r, 0));
  CHECK_NO_CALLS(&fe);
  CHECK_OK(skv_release_session(c, 3));
  CHECK_FREES(&fe, exp_release);
  fe_reset_calls(&fe);

  fe_save_slot(c, &fe, 3, 0, 1, 8, 16, 7, 8, 11);
  CHECK_OK(skv_req_init(&r));
  CHECK_OK(skv_match_prefix(c, 3, 0, &r, 40, 0, &m));
  CHECK_EQ_INT(m.hit, 1);
  r.kv_allocated_len = 40;
  r.kv_committed_len = 35;
  r.aux_state = 13;
  CHECK_OK(skv_cache_finished_req(c, 3, 0, &r, 1));
  CHECK_FREES(&fe, exp_abort);
  CHECK(req_is_empty(&r));
  CHECK_HELD(held_of(c, NULL, 0), 0, 0, 0, 0, 0);
  skv_cache_free(c);
  fe_free(&fe);
}

/* An aborted finish of a session with no slot and no row frees nothing and writes
 * nothing; a first-turn abort with a lock and aux releases them too. */
static void abort_without_row(void) {
  fake_engine fe;
  skv_cache *c;
  skv_req r, before;
  const fe_expect exp[] = {FE_LOCK(3, 4), FE_KV(64 + 4, 64 + 9), FE_ROW(1), FE_AUX(2)};
  fe_init(&fe, 4, 64);
  c = fe_cache(&fe, 4, 0);
  CHECK_OK(skv_req_init(&r));
  r.origin_input_len = 10;
  before = r;
  CHECK_OK(skv_cache_finished_req(c, 1, 0, &r, 1));
  CHECK_REQ_SAME(&r, &before);
  CHECK_NO_CALLS(&fe);
  r = req_make(1, 9, 9);
  r.cache_protected_len = 4;
  r.lock_node = 3;
  r.lock_receipt = 4;
  r.aux_state = 2;
  CHECK_OK(skv_cache_finished_req(c, 1, 0, &r, 1));
  CHECK_FREES(&fe, exp);
  CHECK(req_is_empty(&r));
  CHECK_HELD(held_of(c, NULL, 0), 0, 0, 0, 0, 0);
  skv_cache_free(c);
  fe_free(&fe);
}

/* Aligned reuse: a match whose reusable prefix rounds down below one page releases the
 * slot; otherwise the prefix is floor-aligned. */
static void aligned_reuse(void) {
  fake_engine fe;
  skv_cache *c;
  skv_req r;
  skv_match m;
  const fe_expect exp_tail[] = {FE_KV(16, 21)};
  const fe_expect exp_release[] = {FE_KV(64, 64 + 21), FE_ROW(1)};
  fe_init(&fe, 4, 64);
  c = fe_cache(&fe, 8, SKV_FLAG_ALIGNED_REUSE);
  fe_save_slot(c, &fe, 1, 0, 0, 0, 21, 0, 0, -1);
  CHECK_OK(skv_req_init(&r));
  CHECK_OK(skv_match_prefix(c, 1, 0, &r, 30, 0, &m));
  CHECK_EQ_INT(m.hit, 1);
  CHECK_EQ_INT(m.prefix_len, 16);
  CHECK_EQ_INT(r.kv_committed_len, 16);
  CHECK_EQ_INT(r.kv_allocated_len, 16);
  CHECK_FREES(&fe, exp_tail);
  fe_reset_calls(&fe);

  fe_save_slot(c, &fe, 2, 0, 1, 0, 21, 0, 0, -1);
  CHECK_OK(skv_req_init(&r));
  CHECK_OK(skv_match_prefix(c, 2, 0, &r, 7, 0, &m));
  CHECK_EQ_INT(m.hit, 0);
  CHECK_EQ_INT(m.prefix_len, 0);
  CHECK_EQ_INT(r.req_pool_idx, -1);
  CHECK_FREES(&fe, exp_release);
  CHECK_HELD(held_of(c, NULL, 0), 16, 16, 1, 0, 1);
  skv_cache_free(c);
  fe_free(&fe);
}

/* Session and branch ids are plain keys over their whole range. */
static void extreme_ids(void) {
  fake_engine fe;
  skv_cache *c;
  const uint64_t max = ~(uint64_t)0;
  const fe_expect exp_max[] = {FE_KV(64, 68), FE_ROW(1), FE_KV(128, 136), FE_ROW(2)};
  const fe_expect exp_zero[] = {FE_KV(0, 4), FE_ROW(0)};
  fe_init(&fe, 4, 64);
  c = fe_cache(&fe, 4, 0);
  fe_save_slot(c, &fe, 0, 0, 0, 0, 4, 0, 0, -1);
  fe_save_slot(c, &fe, max, max, 1, 0, 4, 0, 0, -1);
  fe_save_slot(c, &fe, max, 0, 2, 0, 8, 0, 0, -1);
  CHECK_HELD(held_of(c, NULL, 0), 16, 16, 3, 0, 3);
  CHECK_OK(skv_release_session(c, max));
  CHECK_FREES(&fe, exp_max);
  fe_reset_calls(&fe);
  CHECK_OK(skv_release_branch(c, 0, 0));
  CHECK_FREES(&fe, exp_zero);
  skv_cache_free(c);
  fe_free(&fe);
}

int main(void) {
  golden_trim_postcondition();
  golden_finish_overallocated();
  golden_first_turn_abort();
  golden_nth_turn_abort();
  golden_pre_abort();
  golden_branches();
  branch_order_after_resave();
  streaming_session();
  match_shorter_key_frees_tail();
  swa_floor_aligned_trim();
  held_and_release_order();
  later_turn_keeps_lock_takes_aux();
  abort_without_row();
  aligned_reuse();
  extreme_ids();
  return ctest_summary();
}
