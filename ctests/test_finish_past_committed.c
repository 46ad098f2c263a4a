/* skv_stats.finishes_past_committed (docs/conventions.md, "Finishes past committed"): a
 * finish whose target, origin_input_len + finished_len, lies more than one token past
 * kv_committed_len is counted, in both modes; a normal finish (the last sampled token has no
 * KV yet: target = committed + 1), an overlap finish (target = committed), a stop before the
 * end (target < committed), an abort and a refused finish are not. The field is skv_stats'
 * last, so every earlier offset is 0.3's. */
#include <stddef.h>

#include "common.h"

#define PS 4

static uint64_t past_committed(const skv_cache *c) {
  skv_stats s;
  memset(&s, 0xff, sizeof s);
  if (skv_cache_stats(c, &s) != SKV_OK) return UINT64_MAX;
  return s.finishes_past_committed;
}

static void layout(void) {
  CHECK_EQ_INT(sizeof(skv_stats), 88);
  CHECK_EQ_INT(offsetof(skv_stats, swa_used_pages), 72);
  CHECK_EQ_INT(offsetof(skv_stats, finishes_past_committed), 80);
}

/* A turn of `origin` prompt tokens that sampled `output` tokens, with `committed` of the
 * row's `allocated` positions committed, on row `row` of an external-mode cache. */
static skv_req turn(int32_t row, uint32_t origin, uint32_t output, uint32_t committed,
                    uint32_t allocated) {
  skv_req r = req_make(row, committed, allocated);
  r.origin_input_len = origin;
  r.output_len = output;
  return r;
}

static void external_mode(void) {
  fake_engine fe;
  skv_cache *c;
  skv_req r, before;
  skv_match m;
  fe_init(&fe, 8, 64);
  c = fe_cache(&fe, PS, 0);
  if (!c) return;
  CHECK_EQ_U64(past_committed(c), 0);

  /* prompt 20, 5 sampled: the fifth has no KV yet, 24 committed */
  r = turn(0, 20, 5, 24, 24);
  CHECK_OK(skv_cache_finished_req(c, 1, 0, &r, 0));
  CHECK_EQ_U64(past_committed(c), 0);
  /* sglang's non-speculative overlap: the next step already counted the fifth's KV */
  r = turn(1, 20, 5, 25, 25);
  CHECK_OK(skv_cache_finished_req(c, 2, 0, &r, 0));
  CHECK_EQ_U64(past_committed(c), 0);
  /* a stop string matched at the third token: target 23 < committed */
  r = turn(2, 20, 5, 24, 28);
  r.finished_len = 3;
  CHECK_OK(skv_cache_finished_req(c, 3, 0, &r, 0));
  CHECK_EQ_U64(past_committed(c), 0);

  /* the engine never committed its decode steps: target 25, committed 20 */
  r = turn(3, 20, 5, 20, 24);
  CHECK_OK(skv_cache_finished_req(c, 4, 0, &r, 0));
  CHECK_EQ_U64(past_committed(c), 1);
  /* two past: target 25, committed 23 */
  r = turn(4, 20, 5, 23, 24);
  CHECK_OK(skv_cache_finished_req(c, 5, 0, &r, 0));
  CHECK_EQ_U64(past_committed(c), 2);

  /* an abort releases everything, whatever it claims: not counted */
  r = turn(5, 20, 5, 20, 24);
  CHECK_OK(skv_cache_finished_req(c, 6, 0, &r, 1));
  CHECK_EQ_U64(past_committed(c), 2);
  /* a refused finish changes nothing, the counter included */
  r = turn(6, 20, 5, 20, 24);
  r.finished_len = 6; /* > output_len */
  before = r;
  CHECK_STATUS(skv_cache_finished_req(c, 7, 0, &r, 0), SKV_ERR_INVALID_ARG);
  CHECK_REQ_SAME(&r, &before);
  CHECK_EQ_U64(past_committed(c), 2);

  /* a later turn: the hit restores 25 committed (the finished length); prompt 30 */
  CHECK_OK(skv_req_init(&r));
  r.origin_input_len = 30;
  CHECK_OK(skv_match_prefix(c, 1, 0, &r, 29, 0, &m));
  CHECK(m.hit && m.prefix_len == 24 && r.kv_committed_len == 24);
  /* matched and never run: handed back, nothing counted */
  CHECK_OK(skv_hand_back(c, 1, 0, &r));
  CHECK_EQ_U64(past_committed(c), 2);
  /* finished instead, it claims the prompt's 6 new tokens, never prefilled: counted */
  CHECK_OK(skv_req_init(&r));
  r.origin_input_len = 30;
  CHECK_OK(skv_match_prefix(c, 1, 0, &r, 29, 0, &m));
  CHECK_OK(skv_cache_finished_req(c, 1, 0, &r, 0));
  CHECK_EQ_U64(past_committed(c), 3);
  /* run properly: prefill to 30, 2 sampled, 31 committed */
  CHECK_OK(skv_req_init(&r));
  r.origin_input_len = 30;
  CHECK_OK(skv_match_prefix(c, 1, 0, &r, 29, 0, &m));
  r.kv_allocated_len = r.kv_committed_len = 31;
  r.output_len = 2;
  CHECK_OK(skv_cache_finished_req(c, 1, 0, &r, 0));
  CHECK_EQ_U64(past_committed(c), 3);

  skv_cache_free(c);
  fe_free(&fe);
}

static void owned_mode(void) {
  skv_cache_config cfg;
  skv_cache *c = NULL;
  skv_req r;
  memset(&cfg, 0, sizeof cfg);
  cfg.struct_size = sizeof cfg;
  cfg.page_size = PS;
  cfg.num_token_slots = 64 * PS;
  cfg.num_rows = 4;
  cfg.max_context_len = 128;
  CHECK_OK(skv_cache_new(&cfg, &c));
  if (!c) return;

  /* prompt 20 prefilled, 5 sampled, 4 of them fed back: 24 committed */
  CHECK_OK(skv_req_init(&r));
  CHECK_OK(skv_alloc_row(c, &r));
  CHECK_OK(skv_alloc_extend(c, &r, 24, NULL));
  CHECK_OK(skv_commit(c, &r, 24));
  r.origin_input_len = 20;
  r.output_len = 5;
  CHECK_OK(skv_cache_finished_req(c, 1, 0, &r, 0));
  CHECK_EQ_U64(past_committed(c), 0);

  /* the same turn with its decode steps allocated but never committed */
  CHECK_OK(skv_req_init(&r));
  CHECK_OK(skv_alloc_row(c, &r));
  CHECK_OK(skv_alloc_extend(c, &r, 24, NULL));
  CHECK_OK(skv_commit(c, &r, 20));
  r.origin_input_len = 20;
  r.output_len = 5;
  CHECK_OK(skv_cache_finished_req(c, 2, 0, &r, 0));
  CHECK_EQ_U64(past_committed(c), 1);

  /* aborted: not counted */
  CHECK_OK(skv_req_init(&r));
  CHECK_OK(skv_alloc_row(c, &r));
  CHECK_OK(skv_alloc_extend(c, &r, 24, NULL));
  r.origin_input_len = 20;
  r.output_len = 5;
  CHECK_OK(skv_cache_finished_req(c, 3, 0, &r, 1));
  CHECK_EQ_U64(past_committed(c), 1);

  skv_cache_free(c);
}

int main(void) {
  layout();
  external_mode();
  owned_mode();
  return ctest_summary();
}
