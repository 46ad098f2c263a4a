/* docs/conventions.md and docs/external-mode.md, claim by claim: each block checks one
 * statement those pages make, through the C ABI. */
#include "common.h"

static fake_engine fe;

/* A session slot on row `row` holding `len` tokens (a first turn that finished exactly). */
static skv_cache *ext_with_slot(uint32_t ps, uint64_t sid, int32_t row, uint32_t len, int64_t aux) {
  skv_cache *c;
  fe_init(&fe, 8, 128);
  c = fe_cache(&fe, ps, 0);
  fe_save_slot(c, &fe, sid, 0, row, 0, len, 0, 0, aux);
  fe_reset_calls(&fe);
  return c;
}

static void done(skv_cache *c) {
  CHECK(fe.bad_args == 0);
  skv_cache_free(c);
  fe_free(&fe);
}

/* "State after a hit": committed == allocated == prefix_len, the slot's row, protected,
 * swa, lock and aux restored; origin_input_len, output_len, finished_len kept. */
static void state_after_hit(void) {
  skv_cache *c;
  skv_req r;
  skv_match m;
  fe_init(&fe, 8, 128);
  c = fe_cache(&fe, 4, 0);
  fe_save_slot(c, &fe, 1, 0, 3, 8, 30, 77, 78, 79);
  fe_reset_calls(&fe);
  CHECK_OK(skv_req_init(&r));
  r.origin_input_len = 27;
  r.output_len = 5; /* whatever the engine put there stays */
  CHECK_OK(skv_match_prefix(c, 1, 0, &r, 26, 0, &m));
  CHECK_EQ_INT(m.hit, 1);
  CHECK_EQ_INT(m.prefix_len, 26);
  CHECK_EQ_INT(r.req_pool_idx, 3);
  CHECK_EQ_INT(r.kv_committed_len, 26);
  CHECK_EQ_INT(r.kv_allocated_len, 26);
  CHECK_EQ_INT(r.cache_protected_len, 8);
  CHECK_EQ_U64(r.lock_node, 77);
  CHECK_EQ_U64(r.lock_receipt, 78);
  CHECK_EQ_INT(r.aux_state, 79);
  CHECK_EQ_INT(r.origin_input_len, 27);
  CHECK_EQ_INT(r.output_len, 5);
  CHECK_EQ_INT(r.finished_len, -1);
  {
    /* positions [26, 28) stay mapped in the partial page; [28, 30) go back */
    const fe_expect want[] = {FE_KV(3 * 128 + 28, 3 * 128 + 30)};
    CHECK_FREES(&fe, want);
  }
  done(c);
}

/* "key_len = prompt_len - 1": a key covering the whole prompt reuses all of it, leaving
 * no token to run for the first output's logits. */
static void key_len(void) {
  skv_cache *c = ext_with_slot(1, 1, 0, 20, -1);
  skv_req r;
  skv_match m;
  CHECK_OK(skv_req_init(&r));
  r.origin_input_len = 20; /* the same prompt sent again */
  CHECK_OK(skv_match_prefix(c, 1, 0, &r, 20, 0, &m));
  CHECK_EQ_INT(m.prefix_len, 20); /* nothing left to prefill */
  CHECK_OK(skv_cache_finished_req(c, 1, 0, &r, 0));
  CHECK_OK(skv_req_init(&r));
  r.origin_input_len = 20;
  CHECK_OK(skv_match_prefix(c, 1, 0, &r, 19, 0, &m));
  CHECK_EQ_INT(m.prefix_len, 19); /* one token to run: position 19 */
  done(c);
}

/* "pre_aborted": nothing changes; the req holds no row and is dropped, not finished. */
static void pre_aborted(void) {
  skv_cache *c = ext_with_slot(4, 1, 0, 20, -1);
  skv_req r, copy;
  skv_match m;
  CHECK_OK(skv_req_init(&r));
  r.origin_input_len = 30;
  CHECK_OK(skv_match_prefix(c, 1, 0, &r, 29, 1, &m));
  CHECK_EQ_INT(m.hit, 0);
  CHECK_EQ_INT(r.req_pool_idx, -1);
  copy = r;
  CHECK_STATUS(skv_cache_finished_req(c, 1, 0, &copy, 1), SKV_ERR_STATE);
  CHECK_STATUS(skv_cache_finished_req(c, 1, 0, &copy, 0), SKV_ERR_INVALID_ARG);
  CHECK_OK(skv_cache_finished_req(c, 99, 0, &copy, 1)); /* no slot, no row: nothing */
  CHECK_NO_CALLS(&fe);
  CHECK_HELD(held_of(c, NULL, 0), 20, 20, 1, 0, 1); /* the slot is still there, idle */
  done(c);
}

/* "Handing back a request that never ran": skv_hand_back, no callback, the slot idle. */
static void hand_back(void) {
  skv_cache *c = ext_with_slot(4, 1, 0, 20, 5);
  skv_req r;
  skv_match m;
  uint32_t handled = 9;
  CHECK_OK(skv_req_init(&r));
  r.origin_input_len = 30;
  CHECK_OK(skv_match_prefix(c, 1, 0, &r, 29, 0, &m));
  CHECK_OK(skv_checkpoint(c, 1, 0, &r, &handled));
  CHECK_EQ_INT(handled, 1); /* in flight: the session handles it */
  CHECK_OK(skv_hand_back(c, 1, 0, &r));
  CHECK_NO_CALLS(&fe);
  CHECK(req_is_empty(&r));
  CHECK_HELD(held_of(c, NULL, 0), 20, 20, 1, 1, 1);
  CHECK_OK(skv_checkpoint(c, 1, 0, &r, &handled));
  CHECK_EQ_INT(handled, 1); /* idle: still the session's */
  CHECK_OK(skv_checkpoint(c, 2, 0, &r, &handled));
  CHECK_EQ_INT(handled, 0); /* no slot: a first turn, the engine's tree path */
  CHECK_OK(skv_release_session(c, 1)); /* a released slot frees what it held, once */
  {
    const fe_expect want[] = {FE_KV(0, 20), FE_ROW(0), FE_AUX(5)};
    CHECK_FREES(&fe, want);
  }
  done(c);
}

/* "A first-turn abort calls dec_lock_ref"; owned skv_free_req calls no hook. */
static int owned_locks;
static int owned_dec(void *ud, uint64_t n, uint64_t r) {
  (void)ud, (void)n, (void)r;
  owned_locks++;
  return 0;
}
static void first_turn_abort_lock(void) {
  skv_cache *c;
  skv_req r = req_make(2, 10, 14);
  skv_cache_config cfg = {0};
  skv_engine_hooks h;
  const fe_expect want[] = {FE_LOCK(5, 6), FE_KV(2 * 128 + 8, 2 * 128 + 14), FE_ROW(2), FE_AUX(7)};
  fe_init(&fe, 8, 128);
  c = fe_cache(&fe, 4, 0);
  r.cache_protected_len = 8;
  r.lock_node = 5;
  r.lock_receipt = 6;
  r.aux_state = 7;
  CHECK_OK(skv_cache_finished_req(c, 1, 0, &r, 1));
  CHECK_FREES(&fe, want);
  CHECK(req_is_empty(&r));
  done(c);

  cfg.struct_size = sizeof cfg;
  cfg.page_size = 4;
  cfg.num_token_slots = 256;
  cfg.num_rows = 4;
  cfg.max_context_len = 64;
  CHECK_OK(skv_cache_new(&cfg, &c));
  memset(&h, 0, sizeof h);
  h.struct_size = sizeof h;
  h.dec_lock_ref = owned_dec;
  CHECK_OK(skv_cache_set_hooks(c, &h, NULL));
  CHECK_OK(skv_req_init(&r));
  CHECK_OK(skv_alloc_row(c, &r));
  CHECK_OK(skv_alloc_extend(c, &r, 5, NULL));
  r.lock_node = 9;
  CHECK_OK(skv_free_req(c, &r));
  CHECK_EQ_INT(owned_locks, 0);
  CHECK_EQ_U64(r.lock_node, 9); /* still the engine's to release */
  CHECK_OK(skv_alloc_row(c, &r));
  CHECK_OK(skv_alloc_extend(c, &r, 5, NULL));
  CHECK_OK(skv_cache_finished_req(c, 1, 0, &r, 1)); /* the same req aborted as a first turn */
  CHECK_EQ_INT(owned_locks, 1);
  skv_cache_free(c);
}

/* "aux_state": a retry restores the slot's value; a finish stores the req's; an in-flight
 * abort frees the req's. */
static void aux_ownership(void) {
  skv_cache *c = ext_with_slot(1, 1, 0, 20, 50);
  skv_req r;
  skv_match m;
  CHECK_OK(skv_req_init(&r));
  r.origin_input_len = 25;
  CHECK_OK(skv_match_prefix(c, 1, 0, &r, 24, 0, &m));
  r.aux_state = 51; /* the engine moved the state; 50 is now its own to free */
  CHECK_OK(skv_match_prefix(c, 1, 0, &r, 24, 0, &m)); /* a retry */
  CHECK_EQ_INT(r.aux_state, 50);                       /* the slot's value is back */
  r.aux_state = 51;
  r.kv_allocated_len = r.kv_committed_len = 25;
  CHECK_OK(skv_cache_finished_req(c, 1, 0, &r, 0));
  CHECK_NO_CALLS(&fe); /* 50 is not freed by libskv */
  CHECK_OK(skv_req_init(&r));
  r.origin_input_len = 30;
  CHECK_OK(skv_match_prefix(c, 1, 0, &r, 29, 0, &m));
  CHECK_EQ_INT(r.aux_state, 51);
  r.aux_state = 52;
  CHECK_OK(skv_cache_finished_req(c, 1, 0, &r, 1));
  {
    const fe_expect want[] = {FE_KV(0, 25), FE_ROW(0), FE_AUX(52)};
    CHECK_FREES(&fe, want);
  }
  done(c);
}

/* "which rows to pass to skv_session_held": an in-flight slot is counted unless listed. */
static void held_rows(void) {
  skv_cache *c = ext_with_slot(4, 1, 3, 20, -1);
  skv_req r;
  skv_match m;
  const int32_t running[1] = {3};
  CHECK_OK(skv_req_init(&r));
  r.origin_input_len = 30;
  CHECK_OK(skv_match_prefix(c, 1, 0, &r, 29, 0, &m));
  CHECK_HELD(held_of(c, NULL, 0), 20, 20, 1, 0, 1);
  CHECK_HELD(held_of(c, running, 1), 0, 0, 0, 0, 1);
  done(c);
}

/* "idle aborts": the slot's own row with stale lengths releases the slot's record; a req
 * holding another row, or none, is refused. */
static void idle_abort(void) {
  skv_cache *c = ext_with_slot(1, 1, 3, 20, -1);
  skv_req r = req_make(4, 1, 1);
  CHECK_STATUS(skv_cache_finished_req(c, 1, 0, &r, 1), SKV_ERR_STATE);
  CHECK_OK(skv_req_init(&r));
  CHECK_STATUS(skv_cache_finished_req(c, 1, 0, &r, 1), SKV_ERR_STATE);
  CHECK_NO_CALLS(&fe);
  r = req_make(3, 0, 0);
  CHECK_OK(skv_cache_finished_req(c, 1, 0, &r, 1));
  {
    const fe_expect want[] = {FE_KV(3 * 128, 3 * 128 + 20), FE_ROW(3)};
    CHECK_FREES(&fe, want);
  }
  done(c);
}

/* "a stale finish": owned mode refuses a stale copy as such, whether or not it agrees
 * with the row. */
static void owned_stale_finish(void) {
  skv_cache_config cfg = {0};
  skv_cache *c;
  skv_req r, stale;
  cfg.struct_size = sizeof cfg;
  cfg.page_size = 4;
  cfg.num_token_slots = 256;
  cfg.num_rows = 4;
  cfg.max_context_len = 64;
  CHECK_OK(skv_cache_new(&cfg, &c));
  CHECK_OK(skv_req_init(&r));
  CHECK_OK(skv_alloc_row(c, &r));
  CHECK_OK(skv_alloc_extend(c, &r, 10, NULL));
  CHECK_OK(skv_commit(c, &r, 10));
  r.origin_input_len = 10;
  stale = r;
  CHECK_OK(skv_cache_finished_req(c, 1, 0, &r, 0));
  r = stale; /* agrees with the row: the idle rule answers */
  CHECK_STATUS(skv_cache_finished_req(c, 1, 0, &r, 0), SKV_ERR_STATE);
  r = stale;
  r.kv_allocated_len = r.kv_committed_len = 12; /* disagrees: still a stale copy */
  CHECK_STATUS(skv_cache_finished_req(c, 1, 0, &r, 0), SKV_ERR_STATE);
  CHECK_MSG_HAS("is a stale copy");
  CHECK_MSG_HAS("kv_allocated_len 12 != 10 tokens mapped by row 0");
  skv_cache_free(c);
}

/* "out-parameters": skv_build_flashinfer writes *needed when the buffer is too small, and
 * only then among its failures. */
static void flashinfer_needed(void) {
  skv_cache_config cfg = {0};
  skv_cache *c;
  skv_req r;
  int32_t rows[1], indptr[2] = {-5, -5}, idx[1] = {-5}, last[1] = {-5};
  size_t needed = 777;
  cfg.struct_size = sizeof cfg;
  cfg.page_size = 4;
  cfg.num_token_slots = 256;
  cfg.num_rows = 4;
  cfg.max_context_len = 64;
  CHECK_OK(skv_cache_new(&cfg, &c));
  CHECK_OK(skv_req_init(&r));
  CHECK_OK(skv_alloc_row(c, &r));
  CHECK_OK(skv_alloc_extend(c, &r, 9, NULL));
  rows[0] = r.req_pool_idx;
  CHECK_STATUS(skv_build_flashinfer(c, rows, 1, indptr, idx, last, 1, &needed), SKV_ERR_INVALID_ARG);
  CHECK_EQ_U64(needed, 3);
  CHECK(indptr[0] == -5 && indptr[1] == -5 && idx[0] == -5 && last[0] == -5);
  rows[0] = 3; /* not in use */
  needed = 777;
  CHECK_STATUS(skv_build_flashinfer(c, rows, 1, indptr, idx, last, 1, &needed), SKV_ERR_NOT_FOUND);
  CHECK_EQ_U64(needed, 777);
  skv_cache_free(c);
}

/* "SKV_ERR_CALLBACK": a failing free callback completes the call, outputs written. */
static void free_failure_completes(void) {
  skv_cache *c = ext_with_slot(1, 1, 0, 20, -1);
  skv_req r;
  skv_match m;
  CHECK_OK(skv_req_init(&r));
  r.origin_input_len = 15;
  fe.fail_all[FE_FREE_KV] = 1;
  m.hit = 0;
  CHECK_STATUS(skv_match_prefix(c, 1, 0, &r, 14, 0, &m), SKV_ERR_CALLBACK);
  CHECK_MSG_HAS("free_kv");
  CHECK_EQ_INT(m.hit, 1); /* written */
  CHECK_EQ_INT(r.kv_allocated_len, 14);
  fe_clear_failures(&fe);
  done(c);
}

/* "what may be called from a callback": nothing that takes this handle. */
static skv_cache *reentry_cache;
static int reentry_status = -1;
static int reentry_free_row(void *ud, int32_t row) {
  skv_held h;
  reentry_status = (int)skv_session_held(reentry_cache, NULL, 0, &h);
  return fe_cb_free_row(ud, row);
}
static void reentry(void) {
  skv_pool_ops ops;
  skv_cache_config cfg;
  skv_req r = req_make(1, 4, 4);
  fe_init(&fe, 4, 64);
  cfg = fe_config(&fe, 1, 0);
  ops = fe_ops();
  ops.free_row = reentry_free_row;
  CHECK_OK(skv_cache_new_external(&cfg, &ops, &fe, &reentry_cache));
  CHECK_OK(skv_cache_finished_req(reentry_cache, 1, 0, &r, 1));
  CHECK_EQ_INT(reentry_status, SKV_ERR_STATE);
  skv_cache_free(reentry_cache);
  fe_free(&fe);
}

int main(void) {
  state_after_hit();
  key_len();
  pre_aborted();
  hand_back();
  first_turn_abort_lock();
  aux_ownership();
  held_rows();
  idle_abort();
  owned_stale_finish();
  flashinfer_needed();
  free_failure_completes();
  reentry();
  return ctest_summary();
}
