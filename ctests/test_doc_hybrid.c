/* docs/hybrid.md, "The floor on later turns": a prefill-aware sliding-window model over three
 * turns of one session, in external mode, page_size 1 (sglang 0.5.23's prefill-aware backend
 * requires it), window 8. The engine keeps both pools of its one row and flags a slot mapped
 * or handed back twice; every number the page's worked example states is checked here. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "skv.h"

#define WINDOW 8
#define COLS 128
#define MAX_PIECES 32

static int failures;
#define EXPECT(cond)                                                        \
  do {                                                                      \
    if (!(cond)) {                                                          \
      fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #cond);   \
      failures++;                                                           \
    }                                                                       \
  } while (0)
#define TRY(call)                                                            \
  do {                                                                       \
    skv_status s_ = (call);                                                  \
    if (s_ != SKV_OK) {                                                      \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, skv_status_str(s_), \
              skv_last_error());                                             \
      exit(1);                                                               \
    }                                                                        \
  } while (0)

/* One free_kv_segment call: positions [first, first + n) of row 0, back to `pools`. */
typedef struct piece {
  uint32_t first, n, pools;
} piece;

/* Row 0's positions: whether each holds a slot in the full and in the SWA pool. The token
 * index of position p is p. */
typedef struct engine {
  unsigned char full[COLS], swa[COLS];
  int twice; /* a slot mapped while held, or handed back while free */
  piece pieces[MAX_PIECES];
  size_t n_pieces;
} engine;

static int read_row(void *ud, int32_t row, uint32_t start, uint32_t end, int32_t *out) {
  uint32_t p;
  (void)ud, (void)row;
  for (p = start; p < end; p++) out[p - start] = (int32_t)p;
  return 0;
}

static int free_row(void *ud, int32_t row) {
  (void)ud, (void)row;
  return 0;
}

static int free_kv_segment(void *ud, int32_t row, uint32_t first_pos, const int32_t *indices,
                           size_t n, uint32_t pools) {
  engine *e = (engine *)ud;
  size_t k;
  (void)row;
  for (k = 0; k < n; k++) {
    int32_t p = indices[k];
    if (pools & SKV_POOL_FULL) e->twice += !e->full[p], e->full[p] = 0;
    if (pools & SKV_POOL_SWA) e->twice += !e->swa[p], e->swa[p] = 0;
  }
  if (e->n_pieces < MAX_PIECES) {
    e->pieces[e->n_pieces].first = first_pos;
    e->pieces[e->n_pieces].n = (uint32_t)n;
    e->pieces[e->n_pieces].pools = pools;
    e->n_pieces++;
  }
  return 0;
}

/* The engine's allocator: maps [kv_allocated_len, end) in both pools and, the forward pass
 * having run, commits it. */
static void map(engine *e, skv_req *req, uint32_t end) {
  uint32_t p;
  for (p = req->kv_allocated_len; p < end; p++) {
    e->twice += e->full[p] || e->swa[p];
    e->full[p] = e->swa[p] = 1;
  }
  req->kv_allocated_len = req->kv_committed_len = end;
}

static int piece_is(const engine *e, size_t i, uint32_t first, uint32_t n, uint32_t pools) {
  return i < e->n_pieces && e->pieces[i].first == first && e->pieces[i].n == n &&
         e->pieces[i].pools == pools;
}

static uint32_t held(const unsigned char *pool) {
  uint32_t p, n = 0;
  for (p = 0; p < COLS; p++) n += pool[p];
  return n;
}

/* swa_dead_lo as sglang's ReqKvInfo.swa_dead_lo computes it, page_size 1 */
static uint32_t swa_dead_lo(const skv_req *req) {
  return req->cache_protected_len > req->swa_evict_floor ? req->cache_protected_len
                                                         : req->swa_evict_floor;
}

/* doc:floor */
/* Before each prefill (each chunk) of a prefill-aware model, first turn or later: its layers
 * read [0, prefill_end), so the floor rises to prefill_end (sglang: swa_evict_floor =
 * extend_end). A floor rises only while the window has freed nothing: where an earlier
 * turn's window freed [swa_dead_lo, swa_evicted_seqlen), those positions have no SWA KV
 * left, so the turn gives up its prefix from swa_dead_lo and prefills it again. */
static void raise_floor(skv_cache *c, skv_req *req, uint32_t prefill_end) {
  uint32_t dead_lo = swa_dead_lo(req);
  if (req->swa_evicted_seqlen > dead_lo) TRY(skv_free_tail(c, req, dead_lo));
  req->swa_evict_floor = prefill_end;
}

/* `steps` decode steps, each after the window step sglang takes before it, at pre_len = the
 * tokens with KV; returns the positions whose SWA slots the window gave back. */
static uint32_t decode(skv_cache *c, engine *e, skv_req *req, uint32_t steps) {
  uint32_t total = 0, freed, i;
  for (i = 0; i < steps; i++) {
    TRY(skv_swa_evict(c, req, req->kv_committed_len, WINDOW, 1, -1, 0, &freed));
    total += freed;
    map(e, req, req->kv_committed_len + 1); /* the step runs the last sampled token */
    req->output_len++;                      /* and samples the next, which has no KV yet */
  }
  return total;
}
/* end */

int main(void) {
  engine e;
  skv_cache_config cfg;
  skv_pool_ops ops;
  skv_cache *c = NULL;
  skv_req req, before;
  skv_match m;
  skv_stats st;
  uint32_t freed;

  memset(&e, 0, sizeof e);
  memset(&cfg, 0, sizeof cfg);
  cfg.struct_size = sizeof cfg;
  cfg.page_size = 1;
  cfg.num_rows = 1;
  cfg.max_context_len = COLS;
  memset(&ops, 0, sizeof ops);
  ops.struct_size = sizeof ops;
  ops.read_row = read_row;
  ops.free_row = free_row;
  ops.free_kv_segment = free_kv_segment;
  TRY(skv_cache_new_external(&cfg, &ops, &e, &c));

  /* doc:turns */
  /* turn 1: prompt 20, a miss; the prefill samples the 1st token, 7 steps the other 7 */
  TRY(skv_req_init(&req));
  req.origin_input_len = 20;
  TRY(skv_match_prefix(c, 1, 0, &req, 19, 0, &m));
  EXPECT(!m.hit);
  req.req_pool_idx = 0;
  raise_floor(c, &req, 20);
  map(&e, &req, 20);
  req.output_len = 1;
  EXPECT(decode(c, &e, &req, 7) == 0);                /* pre_len 20..26: nothing past 20 */
  EXPECT(req.swa_evicted_seqlen == 20 && req.kv_committed_len == 27);
  TRY(skv_cache_finished_req(c, 1, 0, &req, 0));      /* target 20 + 8 = 28 */

  /* turn 2: prompt 28 + 6 = 34; the window freed nothing, so the floor may rise */
  TRY(skv_req_init(&req));
  req.origin_input_len = 34;
  TRY(skv_match_prefix(c, 1, 0, &req, 33, 0, &m));
  EXPECT(m.hit && m.prefix_len == 27);
  EXPECT(req.swa_evict_floor == 20 && req.swa_evicted_seqlen == 20);
  raise_floor(c, &req, 34);                           /* no free */
  EXPECT(req.kv_allocated_len == 27 && req.swa_evict_floor == 34 && e.n_pieces == 0);
  map(&e, &req, 34);
  req.output_len = 1;
  EXPECT(decode(c, &e, &req, 15) == 6);               /* pre_len 43..48 free 34..39 */
  EXPECT(e.n_pieces == 6 && piece_is(&e, 0, 34, 1, SKV_POOL_SWA) &&
         piece_is(&e, 5, 39, 1, SKV_POOL_SWA));
  EXPECT(req.swa_evicted_seqlen == 40 && req.kv_committed_len == 49);
  TRY(skv_cache_finished_req(c, 1, 0, &req, 0));      /* target 34 + 16 = 50 */

  /* turn 3: prompt 50 + 4 = 54; the window freed [34, 40) */
  TRY(skv_req_init(&req));
  req.origin_input_len = 54;
  TRY(skv_match_prefix(c, 1, 0, &req, 53, 0, &m));
  EXPECT(m.hit && m.prefix_len == 49);
  EXPECT(req.swa_evict_floor == 34 && req.swa_evicted_seqlen == 40);
  e.n_pieces = 0;
  raise_floor(c, &req, 54);                           /* skv_free_tail(req, 34) */
  EXPECT(e.n_pieces == 2 && piece_is(&e, 0, 34, 6, SKV_POOL_FULL) &&
         piece_is(&e, 1, 40, 9, SKV_POOL_BOTH));
  EXPECT(req.kv_allocated_len == 34 && req.swa_evicted_seqlen == 34);
  map(&e, &req, 54);                                  /* prefill [34, 54): 20 tokens */
  req.output_len = 1;
  EXPECT(decode(c, &e, &req, 3) == 0);
  EXPECT(req.swa_evicted_seqlen == 54 && req.kv_committed_len == 57);
  TRY(skv_cache_finished_req(c, 1, 0, &req, 0));      /* target 54 + 4 = 58 */

  /* the slot as a fourth turn finds it */
  TRY(skv_req_init(&req));
  req.origin_input_len = 60;
  TRY(skv_match_prefix(c, 1, 0, &req, 59, 0, &m));
  EXPECT(m.hit && m.prefix_len == 57);
  EXPECT(req.swa_evict_floor == 54 && req.swa_evicted_seqlen == 54);
  TRY(skv_hand_back(c, 1, 0, &req));
  e.n_pieces = 0;
  TRY(skv_release_session(c, 1));
  EXPECT(e.n_pieces == 1 && piece_is(&e, 0, 0, 57, SKV_POOL_BOTH));
  /* end */
  EXPECT(held(e.full) == 0 && held(e.swa) == 0 && e.twice == 0);
  TRY(skv_cache_stats(c, &st));
  EXPECT(st.sessions == 0 && st.finishes_past_committed == 0);

  /* Without the rule: a session whose window freed [34, 40) (a first turn of prompt 34, 16
   * tokens sampled), then a turn that lifts the floor over them: refused, nothing changed. */
  TRY(skv_req_init(&req));
  req.origin_input_len = 34;
  req.req_pool_idx = 0;
  raise_floor(c, &req, 34);
  map(&e, &req, 34);
  req.output_len = 1;
  EXPECT(decode(c, &e, &req, 15) == 6 && req.swa_evicted_seqlen == 40);
  TRY(skv_cache_finished_req(c, 2, 0, &req, 0));
  TRY(skv_req_init(&req));
  req.origin_input_len = 54;
  TRY(skv_match_prefix(c, 2, 0, &req, 53, 0, &m));
  EXPECT(m.hit && m.prefix_len == 49 && req.swa_evict_floor == 34 && req.swa_evicted_seqlen == 40);
  req.swa_evict_floor = 54;
  before = req;
  e.n_pieces = 0;
  EXPECT(skv_swa_evict(c, &req, 49, WINDOW, 1, -1, 0, &freed) == SKV_ERR_INVALID_ARG);
  EXPECT(strstr(skv_last_error(), "lifts swa_dead_lo from 34 to 54") != NULL);
  EXPECT(skv_free_tail(c, &req, 49) == SKV_ERR_INVALID_ARG);
  EXPECT(skv_cache_finished_req(c, 2, 0, &req, 0) == SKV_ERR_INVALID_ARG);
  EXPECT(req.kv_allocated_len == before.kv_allocated_len &&
         req.kv_committed_len == before.kv_committed_len &&
         req.swa_evicted_seqlen == before.swa_evicted_seqlen && req.req_pool_idx == 0 &&
         e.n_pieces == 0);
  req.swa_evict_floor = 34; /* the slot's, as the hit restored it */
  TRY(skv_cache_finished_req(c, 2, 0, &req, 1));
  EXPECT(held(e.full) == 0 && held(e.swa) == 0 && e.twice == 0);

  skv_cache_free(c);
  printf("%d failed\n", failures);
  return failures != 0;
}
