/* Engine callbacks that fail. A failing read_row leaves everything unchanged; a failing
 * free callback cannot be undone, so the call finishes its other callbacks, libskv's state
 * advances as on success (nothing is handed back twice) and the error names the callback. */
#include "common.h"

#define COLS 64

/* Session 1: branch 0 on row 0 (protected 4, 20 tokens, lock 10/11, aux 12), then branch 1
 * on row 1 (10 tokens, lock 20/21, aux 22). */
static const fe_expect release_both[] = {FE_LOCK(10, 11), FE_KV(4, 20),        FE_ROW(0),
                                         FE_AUX(12),      FE_LOCK(20, 21),     FE_KV(64, 74),
                                         FE_ROW(1),       FE_AUX(22)};

static void save_two_branches(skv_cache *c, fake_engine *fe) {
  fe_save_slot(c, fe, 1, 0, 0, 4, 20, 10, 11, 12);
  fe_save_slot(c, fe, 1, 1, 1, 0, 10, 20, 21, 22);
}

static void read_row_fails(void) {
  fake_engine fe;
  skv_cache *c;
  skv_req r, before;
  skv_match m;
  skv_held held;
  const fe_expect exp_trim[] = {FE_KV(40, 44)};
  const fe_expect exp_finish[] = {FE_KV(64 + 28, 64 + 31)};
  const fe_expect exp_tail[] = {FE_KV(128 + 24, 128 + 26)};
  const fe_expect exp_abort[] = {FE_KV(128, 128 + 30), FE_ROW(2)};
  const fe_expect exp_aligned[] = {FE_KV(192 + 12, 192 + 20)};
  fe_init(&fe, 4, COLS);
  c = fe_cache(&fe, 4, 0);
  fe.fail_all[FE_READ_ROW] = 1;

  /* trim_overshoot */
  r = req_make(0, 40, 44);
  r.origin_input_len = 26;
  r.output_len = 14;
  before = r;
  CHECK_STATUS(skv_trim_overshoot(c, &r, 12), SKV_ERR_CALLBACK);
  CHECK_MSG_HAS("read_row");
  CHECK_REQ_SAME(&r, &before);
  CHECK_NO_FREES(&fe);
  CHECK_EQ_INT(fe_count_kind(&fe, FE_READ_ROW), 1);
  fe_reset_calls(&fe);
  fe.fail_all[FE_READ_ROW] = 0;
  CHECK_OK(skv_trim_overshoot(c, &r, 12));
  CHECK_FREES(&fe, exp_trim);
  fe_reset_calls(&fe);

  /* a first-turn finish with a trim: no slot is created */
  fe.fail_all[FE_READ_ROW] = 1;
  r = req_make(1, 29, 31);
  r.origin_input_len = 20;
  r.output_len = 9;
  r.finished_len = 6;
  before = r;
  CHECK_STATUS(skv_cache_finished_req(c, 1, 0, &r, 0), SKV_ERR_CALLBACK);
  CHECK_MSG_HAS("read_row");
  CHECK_REQ_SAME(&r, &before);
  CHECK_NO_FREES(&fe);
  CHECK_HELD(held_of(c, NULL, 0), 0, 0, 0, 0, 0);
  fe_reset_calls(&fe);
  fe.fail_all[FE_READ_ROW] = 0;
  CHECK_OK(skv_cache_finished_req(c, 1, 0, &r, 0));
  CHECK_FREES(&fe, exp_finish);
  CHECK_HELD(held_of(c, NULL, 0), 28, 28, 1, 0, 1);
  fe_reset_calls(&fe);

  /* a match with a tail free: the slot is neither changed nor in flight */
  fe_save_slot(c, &fe, 2, 0, 2, 0, 26, 0, 0, -1);
  held = held_of(c, NULL, 0);
  fe.fail_all[FE_READ_ROW] = 1;
  CHECK_OK(skv_req_init(&r));
  before = r;
  m.hit = 0xAAAA;
  m.prefix_len = 0xBBBB;
  CHECK_STATUS(skv_match_prefix(c, 2, 0, &r, 22, 0, &m), SKV_ERR_CALLBACK);
  CHECK_MSG_HAS("read_row");
  CHECK_REQ_SAME(&r, &before);
  CHECK_EQ_INT(m.hit, 0xAAAA);
  CHECK_EQ_INT(m.prefix_len, 0xBBBB);
  CHECK_NO_FREES(&fe);
  {
    skv_held now = held_of(c, NULL, 0);
    CHECK(memcmp(&now, &held, sizeof now) == 0);
  }
  fe_reset_calls(&fe);
  fe.fail_all[FE_READ_ROW] = 0;
  CHECK_OK(skv_match_prefix(c, 2, 0, &r, 22, 0, &m));
  CHECK_EQ_INT(m.hit, 1);
  CHECK_EQ_INT(m.prefix_len, 22);
  CHECK_FREES(&fe, exp_tail);
  fe_reset_calls(&fe);

  /* an aborted finish of the running turn: the slot stays */
  r.kv_allocated_len = r.kv_committed_len = 30;
  before = r;
  fe.fail_all[FE_READ_ROW] = 1;
  CHECK_STATUS(skv_cache_finished_req(c, 2, 0, &r, 1), SKV_ERR_CALLBACK);
  CHECK_MSG_HAS("read_row");
  CHECK_REQ_SAME(&r, &before);
  CHECK_NO_FREES(&fe);
  CHECK_EQ_U64(held_of(c, NULL, 0).sessions, 2);
  fe_reset_calls(&fe);
  fe.fail_all[FE_READ_ROW] = 0;
  CHECK_OK(skv_cache_finished_req(c, 2, 0, &r, 1));
  CHECK_FREES(&fe, exp_abort);
  CHECK(req_is_empty(&r));
  fe_reset_calls(&fe);

  /* free_aligned and free_tail */
  fe.fail_all[FE_READ_ROW] = 1;
  CHECK_STATUS(skv_free_aligned(c, 3, 10, 20), SKV_ERR_CALLBACK);
  CHECK_MSG_HAS("read_row");
  CHECK_NO_FREES(&fe);
  r = req_make(3, 12, 20);
  before = r;
  CHECK_STATUS(skv_free_tail(c, &r, 12), SKV_ERR_CALLBACK);
  CHECK_MSG_HAS("read_row");
  CHECK_REQ_SAME(&r, &before);
  CHECK_NO_FREES(&fe);
  fe_reset_calls(&fe);
  fe.fail_all[FE_READ_ROW] = 0;
  CHECK_OK(skv_free_tail(c, &r, 12));
  CHECK_FREES(&fe, exp_aligned);
  CHECK_EQ_INT(r.kv_allocated_len, 12);
  fe_reset_calls(&fe);

  /* a release reads every range before its first free: the second read failing means
   * nothing of the session is released */
  CHECK_OK(skv_release_session(c, 1));
  fe_reset_calls(&fe);
  save_two_branches(c, &fe);
  fe.fail_on[FE_READ_ROW] = 2;
  CHECK_STATUS(skv_release_session(c, 1), SKV_ERR_CALLBACK);
  CHECK_MSG_HAS("read_row");
  CHECK_NO_FREES(&fe);
  CHECK_EQ_INT(fe_count_kind(&fe, FE_READ_ROW), 2);
  CHECK_HELD(held_of(c, NULL, 0), 16 + 12, 16 + 12, 2, 2, 2);
  fe_reset_calls(&fe);
  fe_clear_failures(&fe);
  CHECK_OK(skv_release_session(c, 1));
  CHECK_FREES(&fe, release_both);
  CHECK_HELD(held_of(c, NULL, 0), 0, 0, 0, 0, 0);
  skv_cache_free(c);
  fe_free(&fe);
}

/* A release whose free callbacks fail: every callback still runs in order, the slots are
 * gone, and a second release hands back nothing. */
static void release_with_failing(int kind, unsigned long nth, int all, const char *const *names,
                                 size_t n_names) {
  fake_engine fe;
  skv_cache *c;
  size_t i;
  fe_init(&fe, 4, COLS);
  c = fe_cache(&fe, 4, 0);
  save_two_branches(c, &fe);
  if (all) {
    fe.fail_all[FE_FREE_KV] = fe.fail_all[FE_FREE_ROW] = 1;
    fe.fail_all[FE_DEC_LOCK] = fe.fail_all[FE_FREE_AUX] = 1;
  } else {
    fe.fail_on[kind] = nth;
  }
  CHECK_STATUS(skv_release_session(c, 1), SKV_ERR_CALLBACK);
  for (i = 0; i < n_names; i++) CHECK_MSG_HAS(names[i]);
  CHECK_FREES(&fe, release_both);
  CHECK_HELD(held_of(c, NULL, 0), 0, 0, 0, 0, 0);
  fe_reset_calls(&fe);
  fe_clear_failures(&fe);
  CHECK_OK(skv_release_session(c, 1));
  CHECK_OK(skv_release_branch(c, 1, 0));
  CHECK_OK(skv_release_branch(c, 1, 1));
  CHECK_NO_CALLS(&fe);
  skv_cache_free(c);
  fe_free(&fe);
}

static void free_callbacks_fail_in_release(void) {
  static const char *const kv[] = {"free_kv"};
  static const char *const row[] = {"free_row"};
  static const char *const lock[] = {"dec_lock_ref"};
  static const char *const aux[] = {"free_aux"};
  static const char *const every[] = {"free_kv", "free_row", "dec_lock_ref", "free_aux"};
  release_with_failing(FE_FREE_KV, 1, 0, kv, 1);
  release_with_failing(FE_FREE_KV, 2, 0, kv, 1);
  release_with_failing(FE_FREE_ROW, 2, 0, row, 1);
  release_with_failing(FE_DEC_LOCK, 1, 0, lock, 1);
  release_with_failing(FE_FREE_AUX, 2, 0, aux, 1);
  release_with_failing(0, 0, 1, every, 4);
}

/* Trims and tail frees whose free_kv fails still advance the req and the slot. */
static void free_kv_fails_in_trim_and_match(void) {
  fake_engine fe;
  skv_cache *c;
  skv_req r;
  skv_match m;
  const fe_expect exp_trim[] = {FE_KV(7, 44)};
  const fe_expect exp_finish[] = {FE_KV(64 + 28, 64 + 31)};
  const fe_expect exp_tail[] = {FE_KV(64 + 28, 64 + 40)};
  const fe_expect exp_release[] = {FE_KV(64, 64 + 26), FE_ROW(1)};
  fe_init(&fe, 4, COLS);
  c = fe_cache(&fe, 1, 0);

  /* 37 indices handed back through a failing free_kv */
  fe.fail_on[FE_FREE_KV] = 1;
  r = req_make(0, 40, 44);
  r.origin_input_len = 5;
  r.output_len = 14;
  CHECK_STATUS(skv_trim_overshoot(c, &r, 2), SKV_ERR_CALLBACK);
  CHECK_MSG_HAS("free_kv");
  CHECK_MSG_HAS("37");
  CHECK_FREES(&fe, exp_trim);
  CHECK_EQ_INT(r.kv_allocated_len, 7);
  CHECK_EQ_INT(r.kv_committed_len, 7);
  CHECK_EQ_INT(r.output_len, 2);
  fe_reset_calls(&fe);
  CHECK_OK(skv_trim_overshoot(c, &r, 2));
  CHECK_NO_CALLS(&fe);
  skv_cache_free(c);

  c = fe_cache(&fe, 4, 0);
  fe_clear_failures(&fe);
  fe_reset_calls(&fe);
  fe.fail_all[FE_FREE_KV] = 1;
  r = req_make(1, 29, 31);
  r.origin_input_len = 20;
  r.output_len = 9;
  r.finished_len = 6;
  CHECK_STATUS(skv_cache_finished_req(c, 1, 0, &r, 0), SKV_ERR_CALLBACK);
  CHECK_MSG_HAS("free_kv");
  CHECK_FREES(&fe, exp_finish);
  CHECK(req_is_empty(&r));
  CHECK_EQ_INT(r.output_len, 6);
  CHECK_HELD(held_of(c, NULL, 0), 28, 28, 1, 0, 1);
  fe_reset_calls(&fe);

  /* a retried match's tail free fails: the req is restored and the slot is in flight */
  CHECK_OK(skv_req_init(&r));
  CHECK_OK(skv_match_prefix(c, 1, 0, &r, 40, 0, &m));
  CHECK_EQ_INT(m.prefix_len, 26);
  r.kv_allocated_len = 40;
  CHECK_STATUS(skv_match_prefix(c, 1, 0, &r, 40, 0, &m), SKV_ERR_CALLBACK);
  CHECK_MSG_HAS("free_kv");
  CHECK_FREES(&fe, exp_tail);
  CHECK_EQ_INT(r.req_pool_idx, 1);
  CHECK_EQ_INT(r.kv_allocated_len, 26);
  CHECK_EQ_INT(r.kv_committed_len, 26);
  fe_reset_calls(&fe);
  fe_clear_failures(&fe);
  CHECK_STATUS(skv_release_session(c, 1), SKV_ERR_STATE);
  CHECK_OK(skv_match_prefix(c, 1, 0, &r, 40, 0, &m));
  CHECK_EQ_INT(m.hit, 1);
  CHECK_EQ_INT(m.prefix_len, 26);
  CHECK_NO_CALLS(&fe);
  r.origin_input_len = 26;
  CHECK_OK(skv_cache_finished_req(c, 1, 0, &r, 0));
  CHECK_OK(skv_release_session(c, 1));
  CHECK_FREES(&fe, exp_release);
  skv_cache_free(c);
  fe_free(&fe);
}

/* A callback that calls back into the handle it was called from is refused, not
 * deadlocked; the outer call goes on. */
typedef struct reentrant {
  fake_engine fe; /* first: the fake engine's callbacks see the same pointer */
  skv_cache *c;
  skv_status seen;
  int msg_ok;
} reentrant;

static int reentering_free_row(void *ud, int32_t row) {
  reentrant *re = (reentrant *)ud;
  skv_held h;
  re->seen = skv_session_held(re->c, NULL, 0, &h);
  re->msg_ok = skv_last_error()[0] != '\0';
  return fe_cb_free_row(ud, row);
}

static void callback_reentry(void) {
  reentrant re;
  skv_cache_config cfg;
  skv_pool_ops ops = fe_ops();
  const fe_expect exp[] = {FE_KV(0, 8), FE_ROW(0)};
  memset(&re, 0, sizeof re);
  fe_init(&re.fe, 2, COLS);
  cfg = fe_config(&re.fe, 4, 0);
  ops.free_row = reentering_free_row;
  re.seen = SKV_OK;
  CHECK_OK(skv_cache_new_external(&cfg, &ops, &re, &re.c));
  fe_save_slot(re.c, &re.fe, 1, 0, 0, 0, 8, 0, 0, -1);
  CHECK_OK(skv_release_session(re.c, 1));
  CHECK_EQ_INT(re.seen, SKV_ERR_STATE);
  CHECK(re.msg_ok);
  CHECK_FREES(&re.fe, exp);
  CHECK_HELD(held_of(re.c, NULL, 0), 0, 0, 0, 0, 0);
  skv_cache_free(re.c);
  fe_free(&re.fe);
}

int main(void) {
  read_row_fails();
  free_callbacks_fail_in_release();
  free_kv_fails_in_trim_and_match();
  callback_reentry();
  return ctest_summary();
}
