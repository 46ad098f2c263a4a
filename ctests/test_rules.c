/* The session rules libskv decides beyond the golden cases (docs/decisions.md), through the
 * C ABI in external mode: each refusal frees nothing and changes nothing, so an engine bug
 * cannot free a page or a row twice. */
#include "common.h"

int main(void) {
  fake_engine fe;
  skv_cache *c;
  skv_req running, fresh, stale, snapshot;
  skv_match m;
  fe_init(&fe, 8, 128);
  c = fe_cache(&fe, 1, 0);

  /* session 1 holds row 0 with 20 tokens; its next turn is running */
  fe_save_slot(c, &fe, 1, 0, 0, 0, 20, 0, 0, -1);
  stale = req_make(0, 20, 20); /* a copy of the finished turn's req the engine kept */
  stale.origin_input_len = 20;
  CHECK_OK(skv_req_init(&running));
  running.origin_input_len = 30;
  CHECK_OK(skv_match_prefix(c, 1, 0, &running, 29, 0, &m));
  CHECK_EQ_INT(m.hit, 1);
  running.kv_allocated_len = 30; /* the engine extended the prompt */

  /* one running request per slot: a second request may not take the row */
  CHECK_OK(skv_req_init(&fresh));
  snapshot = fresh;
  fe_reset_calls(&fe);
  CHECK_STATUS(skv_match_prefix(c, 1, 0, &fresh, 29, 0, &m), SKV_ERR_STATE);
  CHECK_MSG_HAS("running request");
  CHECK_REQ_SAME(&fresh, &snapshot);
  CHECK_NO_CALLS(&fe);

  /* the running request's own retry is fine, and frees what its first try extended */
  CHECK_OK(skv_match_prefix(c, 1, 0, &running, 25, 0, &m));
  CHECK_EQ_INT(m.prefix_len, 20);
  {
    const fe_expect want[] = {FE_KV(20, 30)};
    CHECK_FREES(&fe, want);
  }

  /* a primitive on the running row may not start short of the end the slot records */
  running.kv_allocated_len = 24;
  fe_reset_calls(&fe);
  CHECK_STATUS(skv_free_aligned(c, 0, 10, 15), SKV_ERR_STATE); /* the slot records 20 */
  CHECK_NO_CALLS(&fe);
  CHECK_OK(skv_free_aligned(c, 0, 22, 24));
  running.kv_allocated_len = 22; /* free_aligned takes no req: the engine lowers it */
  running.kv_committed_len = 20;
  running.output_len = 2;
  CHECK_OK(skv_cache_finished_req(c, 1, 0, &running, 0));

  /* a later turn comes through match_prefix: the stale copy cannot finish it again */
  snapshot = stale;
  fe_reset_calls(&fe);
  CHECK_STATUS(skv_cache_finished_req(c, 1, 0, &stale, 0), SKV_ERR_STATE);
  CHECK_MSG_HAS("idle");
  CHECK_REQ_SAME(&stale, &snapshot);
  CHECK_NO_CALLS(&fe);

  /* nor can the engine reshape an idle session's row behind its back */
  CHECK_STATUS(skv_free_aligned(c, 0, 10, 22), SKV_ERR_STATE);
  CHECK_STATUS(skv_trim_overshoot(c, &stale, 0), SKV_ERR_STATE);
  CHECK_STATUS(skv_free_tail(c, &stale, 10), SKV_ERR_STATE);
  CHECK_NO_CALLS(&fe);
  CHECK_HELD(held_of(c, NULL, 0), 22, 22, 1, 0, 1);

  /* a stale copy matching the idle slot counts for nothing: the slot's 22 tokens restore */
  stale.kv_allocated_len = 40;
  CHECK_OK(skv_match_prefix(c, 1, 0, &stale, 100, 0, &m));
  CHECK_EQ_INT(stale.kv_allocated_len, 22);
  CHECK_NO_CALLS(&fe);

  /* a row belongs to one slot: another session's first turn cannot finish on it */
  {
    skv_req thief = req_make(0, 5, 5);
    thief.origin_input_len = 5;
    CHECK_STATUS(skv_cache_finished_req(c, 2, 0, &thief, 0), SKV_ERR_STATE);
    CHECK_STATUS(skv_cache_finished_req(c, 2, 0, &thief, 1), SKV_ERR_STATE);
    CHECK_NO_CALLS(&fe);
  }

  /* the abort releases the row once; everything comes back exactly once */
  CHECK_OK(skv_cache_finished_req(c, 1, 0, &stale, 1));
  {
    const fe_expect want[] = {FE_KV(0, 22), FE_ROW(0)};
    CHECK_FREES(&fe, want);
  }
  CHECK_HELD(held_of(c, NULL, 0), 0, 0, 0, 0, 0);
  CHECK(fe.bad_args == 0);

  skv_cache_free(c);
  fe_free(&fe);
  return ctest_summary();
}
