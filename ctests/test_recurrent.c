/* Recurrent-state handles (aux_state and the two aux_track entries): an engine with a fake
 * handle pool checks that libskv frees each handle it was given exactly once, in the order
 * aux_state, aux_track[0], aux_track[1], never passes the -1 sentinel, and leaks none; over
 * finish/match/release, in-flight and idle aborts, an aligned-reuse release, a ping-pong
 * step the engine frees itself, a retried match, owned mode's hooks and skv_free_req. */
#include <stddef.h>

#include "common.h"

#define MAX_HANDLES 64

/* The fake engine first (its callbacks cast user_data to it), then the handle pool. */
typedef struct mamba_engine {
  fake_engine fe;
  unsigned char live[MAX_HANDLES]; /* 1 while the handle is allocated */
  int64_t next;
  int64_t freed[MAX_HANDLES]; /* what free_aux received since the last reset, in order */
  size_t n_freed;
  int bad; /* a sentinel, an unknown handle, or a second free */
} mamba_engine;

static int64_t me_alloc(mamba_engine *m) {
  int64_t h = m->next++;
  if (h >= MAX_HANDLES) return -1;
  m->live[h] = 1;
  return h;
}

/* The engine letting a handle go by itself (a ping-pong entry it replaced). */
static void me_engine_free(mamba_engine *m, int64_t h) {
  if (h < 0 || h >= MAX_HANDLES || !m->live[h]) {
    m->bad++;
    return;
  }
  m->live[h] = 0;
}

static int me_free_aux(void *ud, int64_t aux) {
  mamba_engine *m = (mamba_engine *)ud;
  if (m->n_freed < MAX_HANDLES) m->freed[m->n_freed++] = aux;
  me_engine_free(m, aux);
  return fe_cb_free_aux(ud, aux);
}

static size_t me_live(const mamba_engine *m) {
  size_t i, n = 0;
  for (i = 0; i < MAX_HANDLES; i++) n += m->live[i];
  return n;
}

static void me_reset(mamba_engine *m) {
  m->n_freed = 0;
  fe_reset_calls(&m->fe);
}

/* free_aux received exactly `want`, in order, since the last reset. */
static int me_freed_at(const mamba_engine *m, const int64_t *want, size_t n, const char *file,
                       int line) {
  size_t i;
  int ok = m->n_freed == n && m->bad == 0;
  for (i = 0; ok && i < n; i++) ok = m->freed[i] == want[i];
  if (!ctest_record(ok, file, line, "free_aux order")) {
    fprintf(stderr, "    got (bad %d):", m->bad);
    for (i = 0; i < m->n_freed; i++) fprintf(stderr, " %lld", (long long)m->freed[i]);
    fprintf(stderr, "\n    want:");
    for (i = 0; i < n; i++) fprintf(stderr, " %lld", (long long)want[i]);
    fprintf(stderr, "\n");
  }
  return ok;
}
#define CHECK_FREED(m, arr) me_freed_at((m), (arr), sizeof(arr) / sizeof((arr)[0]), __FILE__, __LINE__)
#define CHECK_NONE_FREED(m) me_freed_at((m), NULL, 0, __FILE__, __LINE__)

static skv_cache *me_cache(mamba_engine *m, uint32_t page_size, uint32_t flags) {
  skv_cache_config cfg;
  skv_pool_ops ops = fe_ops();
  skv_cache *c = NULL;
  memset(m, 0, sizeof *m);
  fe_init(&m->fe, 8, 64);
  cfg = fe_config(&m->fe, page_size, flags);
  ops.free_aux = me_free_aux;
  CHECK_OK(skv_cache_new_external(&cfg, &ops, m, &c));
  return c;
}

static void me_done(mamba_engine *m, skv_cache *c) {
  CHECK_EQ_INT(me_live(m), 0); /* every handle went back */
  CHECK_EQ_INT(m->bad, 0);
  skv_cache_free(c);
  fe_free(&m->fe);
}

/* A first turn on `row` holding a pool slot and both track entries, finished at 8 tokens. */
static skv_req first_turn(mamba_engine *m, int32_t row) {
  skv_req r = req_make(row, 8, 8);
  r.origin_input_len = 8;
  r.aux_state = me_alloc(m);
  r.aux_track[0] = me_alloc(m);
  r.aux_track[1] = me_alloc(m);
  return r;
}

static void init_sets_sentinels(void) {
  skv_req r;
  memset(&r, 0x5a, sizeof r);
  CHECK_OK(skv_req_init(&r));
  CHECK_EQ_INT(r.aux_state, -1);
  CHECK_EQ_INT(r.aux_track[0], -1);
  CHECK_EQ_INT(r.aux_track[1], -1);
  /* the layout docs/recurrent-state.md gives */
  CHECK_EQ_INT(sizeof(skv_req), 80);
  CHECK_EQ_INT(offsetof(skv_req, aux_state), 56);
  CHECK_EQ_INT(offsetof(skv_req, aux_track), 64);
  CHECK_EQ_INT(sizeof(skv_held), 48);
  CHECK_EQ_INT(offsetof(skv_held, aux_handles), 40);
}

/* Finish keeps the handles, a hit restores them, a release frees them in order. */
static void kept_restored_released_in_order(void) {
  mamba_engine m;
  skv_cache *c = me_cache(&m, 4, 0);
  skv_req r = first_turn(&m, 2);
  skv_match hit;
  skv_held h;
  int64_t want[3];
  CHECK_OK(skv_cache_finished_req(c, 1, 0, &r, 0));
  CHECK(req_is_empty(&r));
  CHECK_NONE_FREED(&m);
  h = held_of(c, NULL, 0);
  CHECK_EQ_U64(h.aux_states, 1);
  CHECK_EQ_U64(h.aux_handles, 3);

  CHECK_OK(skv_req_init(&r));
  r.origin_input_len = 12;
  CHECK_OK(skv_match_prefix(c, 1, 0, &r, 8, 0, &hit));
  CHECK_EQ_INT(hit.hit, 1);
  CHECK_EQ_INT(r.aux_state, 0);
  CHECK_EQ_INT(r.aux_track[0], 1);
  CHECK_EQ_INT(r.aux_track[1], 2);
  {
    int32_t active = r.req_pool_idx;
    CHECK_EQ_U64(held_of(c, &active, 1).aux_handles, 0); /* a running request's are not held */
  }
  CHECK_OK(skv_cache_finished_req(c, 1, 0, &r, 0));
  me_reset(&m);
  CHECK_OK(skv_release_session(c, 1));
  want[0] = 0, want[1] = 1, want[2] = 2;
  CHECK_FREED(&m, want);
  {
    fe_expect exp[] = {FE_KV(2 * 64, 2 * 64 + 8), FE_ROW(2), FE_AUX(0), FE_AUX(1), FE_AUX(2)};
    CHECK_FREES(&m.fe, exp); /* the handles go after the row, as sglang frees mamba state */
  }
  CHECK_EQ_U64(held_of(c, NULL, 0).aux_handles, 0);
  me_done(&m, c);
}

/* sglang's ping-pong: the engine fills the empty entry, later frees the older one itself;
 * libskv frees only what the req holds at the finish, skipping the empty entry. */
static void ping_pong_entries(void) {
  mamba_engine m;
  skv_cache *c = me_cache(&m, 4, 0);
  skv_req r = req_make(0, 8, 8);
  skv_match hit;
  int64_t want[2];
  r.origin_input_len = 8;
  r.aux_state = me_alloc(&m); /* 0 */
  r.aux_track[0] = me_alloc(&m); /* 1; entry 1 empty */
  CHECK_OK(skv_cache_finished_req(c, 1, 0, &r, 0));
  CHECK_EQ_U64(held_of(c, NULL, 0).aux_handles, 2); /* the sentinel is not counted */

  CHECK_OK(skv_req_init(&r));
  r.origin_input_len = 12;
  CHECK_OK(skv_match_prefix(c, 1, 0, &r, 8, 0, &hit));
  r.aux_track[1] = me_alloc(&m); /* 2: the next tracked state */
  me_engine_free(&m, r.aux_track[0]); /* the engine lets 1 go */
  r.aux_track[0] = -1;
  CHECK_OK(skv_cache_finished_req(c, 1, 0, &r, 0));
  CHECK_EQ_U64(held_of(c, NULL, 0).aux_handles, 2);
  me_reset(&m);
  CHECK_OK(skv_release_branch(c, 1, 0));
  want[0] = 0, want[1] = 2;
  CHECK_FREED(&m, want);
  me_done(&m, c);
}

/* An in-flight abort frees the running request's handles; the ones it replaced are the
 * engine's (freed by it here). An abort of an idle slot frees the slot's own record. */
static void aborts(void) {
  mamba_engine m;
  skv_cache *c = me_cache(&m, 4, 0);
  skv_req r = first_turn(&m, 1), stale;
  skv_match hit;
  int64_t want[3];
  CHECK_OK(skv_cache_finished_req(c, 1, 0, &r, 0));
  CHECK_OK(skv_req_init(&r));
  r.origin_input_len = 12;
  CHECK_OK(skv_match_prefix(c, 1, 0, &r, 8, 0, &hit));
  me_engine_free(&m, r.aux_track[1]); /* replaced mid-turn: 2 is the engine's */
  r.aux_track[1] = me_alloc(&m);      /* 3 */
  me_reset(&m);
  CHECK_OK(skv_cache_finished_req(c, 1, 0, &r, 1));
  want[0] = 0, want[1] = 1, want[2] = 3;
  CHECK_FREED(&m, want);
  CHECK(req_is_empty(&r));

  /* idle: a stale req's handles count for nothing */
  r = first_turn(&m, 3); /* 4, 5, 6 */
  CHECK_OK(skv_cache_finished_req(c, 2, 0, &r, 0));
  stale = req_make(3, 8, 8);
  stale.aux_track[0] = 60;
  me_reset(&m);
  CHECK_OK(skv_cache_finished_req(c, 2, 0, &stale, 1));
  want[0] = 4, want[1] = 5, want[2] = 6;
  CHECK_FREED(&m, want);

  /* a first turn's abort (no slot yet) frees the req's handles, sentinels skipped */
  r = req_make(4, 8, 8);
  r.aux_track[1] = me_alloc(&m); /* 7 */
  me_reset(&m);
  CHECK_OK(skv_cache_finished_req(c, 3, 0, &r, 1));
  CHECK_FREED(&m, (int64_t[]){7});
  me_done(&m, c);
}

/* An aligned-reuse match that cannot reuse a whole page releases the slot (its handles,
 * not the req's); a retried match restores the slot's handles over a replacement. */
static void match_paths(void) {
  mamba_engine m;
  skv_cache *c = me_cache(&m, 4, SKV_FLAG_ALIGNED_REUSE);
  skv_req r = first_turn(&m, 0);
  skv_match hit;
  int64_t want[3], mine;
  CHECK_OK(skv_cache_finished_req(c, 1, 0, &r, 0));
  CHECK_OK(skv_req_init(&r));
  mine = me_alloc(&m); /* 3: the new request's own, untouched by the miss */
  r.aux_track[0] = mine;
  r.origin_input_len = 4;
  me_reset(&m);
  CHECK_OK(skv_match_prefix(c, 1, 0, &r, 3, 0, &hit)); /* 3 tokens: no whole page */
  CHECK_EQ_INT(hit.hit, 0);
  want[0] = 0, want[1] = 1, want[2] = 2;
  CHECK_FREED(&m, want);
  CHECK_EQ_INT(r.aux_track[0], mine);
  me_engine_free(&m, mine);

  r = first_turn(&m, 5); /* 4, 5, 6 */
  CHECK_OK(skv_cache_finished_req(c, 2, 0, &r, 0));
  CHECK_OK(skv_req_init(&r));
  r.origin_input_len = 12;
  CHECK_OK(skv_match_prefix(c, 2, 0, &r, 8, 0, &hit));
  r.aux_track[0] = 40; /* a replacement a retry overwrites: re-applied after it */
  CHECK_OK(skv_match_prefix(c, 2, 0, &r, 8, 0, &hit));
  CHECK_EQ_INT(r.aux_track[0], 5);
  CHECK_OK(skv_cache_finished_req(c, 2, 0, &r, 0));
  me_reset(&m);
  CHECK_OK(skv_release_session(c, 2));
  want[0] = 4, want[1] = 5, want[2] = 6;
  CHECK_FREED(&m, want);
  me_done(&m, c);
}

/* Owned mode hands the same handles, in the same order, to its free_aux hook. */
static void owned_hooks(void) {
  mamba_engine m;
  skv_cache_config cfg;
  skv_engine_hooks hooks;
  skv_cache *c = NULL;
  skv_req r;
  int64_t want[2];
  memset(&m, 0, sizeof m);
  fe_init(&m.fe, 8, 64);
  memset(&cfg, 0, sizeof cfg);
  cfg.struct_size = sizeof cfg;
  cfg.page_size = 4;
  cfg.num_token_slots = 256;
  cfg.num_rows = 8;
  cfg.max_context_len = 64;
  CHECK_OK(skv_cache_new(&cfg, &c));
  memset(&hooks, 0, sizeof hooks);
  hooks.struct_size = sizeof hooks;
  hooks.free_aux = me_free_aux;
  CHECK_OK(skv_cache_set_hooks(c, &hooks, &m));
  CHECK_OK(skv_req_init(&r));
  CHECK_OK(skv_alloc_row(c, &r));
  CHECK_OK(skv_alloc_extend(c, &r, 6, NULL));
  CHECK_OK(skv_commit(c, &r, 6));
  r.origin_input_len = 6;
  r.aux_track[0] = me_alloc(&m); /* 0; no pool slot, entry 1 empty */
  r.aux_track[1] = me_alloc(&m); /* 1 */
  CHECK_OK(skv_cache_finished_req(c, 1, 0, &r, 0));
  CHECK_EQ_U64(held_of(c, NULL, 0).aux_handles, 2);
  CHECK_EQ_U64(held_of(c, NULL, 0).aux_states, 0);
  CHECK_OK(skv_release_session(c, 1));
  want[0] = 0, want[1] = 1;
  CHECK_FREED(&m, want);

  /* a request outside sessions: skv_free_req leaves its handles to the engine */
  me_reset(&m);
  CHECK_OK(skv_req_init(&r));
  CHECK_OK(skv_alloc_row(c, &r));
  r.aux_state = me_alloc(&m);    /* 2 */
  r.aux_track[1] = me_alloc(&m); /* 3 */
  CHECK_OK(skv_free_req(c, &r));
  CHECK_EQ_INT(r.req_pool_idx, -1);
  CHECK_EQ_INT(r.aux_state, 2);
  CHECK_EQ_INT(r.aux_track[0], -1);
  CHECK_EQ_INT(r.aux_track[1], 3);
  CHECK_NONE_FREED(&m);
  me_engine_free(&m, 2);
  me_engine_free(&m, 3);
  me_done(&m, c);
}

int main(void) {
  init_sets_sentinels();
  kept_restored_released_in_order();
  ping_pong_entries();
  aborts();
  match_paths();
  owned_hooks();
  return ctest_summary();
}
