/* Four threads drive their own sessions (distinct rows) through many turns on one
 * handle: matches, retried matches, trims, aborts, pre-aborts, branches, releases. The
 * fake engine hands out fresh pages, so afterwards the recorded callbacks prove that every
 * page, row, lock and aux state went back exactly once and nothing else did. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>

#include "common.h"

#define THREADS 4
#define SESSIONS 4                 /* per thread, two branches each */
#define UNITS (2 * SESSIONS)       /* (session, branch) slots per thread */
#define STEPS 400
#define PS 4
#define COLS 256
#define ROWS_PER_THREAD (UNITS + STEPS + 8)
#define ROWS (THREADS * ROWS_PER_THREAD)
#define PAGES_PER_THREAD (1 << 17)
#define PAGES (THREADS * PAGES_PER_THREAD)
#define MAX_ISSUED (2 * STEPS + UNITS)

enum { PAGE_UNUSED = 0, PAGE_ROW, PAGE_TREE };

static fake_engine fe;
static skv_cache *cache;
static unsigned char page_state[PAGES];
static uint32_t row_pages[ROWS]; /* pages the engine has mapped into each row */
static unsigned char row_used[ROWS];

typedef struct unit {
  uint64_t sid, bid;
  int live;                /* a slot exists */
  int32_t row;
  uint32_t alloc;          /* the slot's allocated (== committed) */
  uint32_t protected_len;
  uint64_t lock;
  int64_t aux;
} unit;

typedef struct worker {
  int t;
  uint64_t rng;
  unit units[UNITS];
  int32_t next_row;
  int32_t next_page;
  uint64_t locks[MAX_ISSUED];
  int64_t auxes[MAX_ISSUED];
  size_t n_locks, n_auxes;
  int passed, failed;
} worker;

static worker workers[THREADS];

static uint32_t rnd(worker *w, uint32_t n) {
  w->rng ^= w->rng << 13;
  w->rng ^= w->rng >> 7;
  w->rng ^= w->rng << 17;
  return (uint32_t)(w->rng % n);
}

static uint32_t ceil_pages(uint32_t tokens) { return (tokens + PS - 1) / PS; }

#define TCHECK(w, cond)                                                                \
  do {                                                                                 \
    if (cond) {                                                                        \
      (w)->passed++;                                                                   \
    } else {                                                                           \
      (w)->failed++;                                                                   \
      fprintf(stderr, "%s:%d: thread %d: FAILED: %s\n", __FILE__, __LINE__, (w)->t,    \
              #cond);                                                                  \
    }                                                                                  \
  } while (0)

/* The status and this thread's own last error: other threads' errors never show here. */
#define TSTATUS(w, call, expected)                                                     \
  do {                                                                                 \
    skv_status ts_got_ = (call);                                                       \
    const char *ts_msg_ = skv_last_error();                                            \
    TCHECK(w, ts_got_ == (expected));                                                  \
    if (ts_got_ != (expected)) fprintf(stderr, "    got %d: %s\n", (int)ts_got_, ts_msg_); \
    if ((expected) == SKV_OK)                                                          \
      TCHECK(w, ts_msg_ != NULL && ts_msg_[0] == '\0');                                \
    else                                                                               \
      TCHECK(w, ts_msg_ != NULL && ts_msg_[0] != '\0');                                \
  } while (0)

/* The engine maps positions up to `tokens` of a row, one fresh page at a time. */
static void map_upto(worker *w, int32_t row, uint32_t tokens, int state) {
  uint32_t k, off;
  for (k = row_pages[row]; k < ceil_pages(tokens); k++) {
    int32_t page = w->next_page++;
    page_state[page] = (unsigned char)state;
    for (off = 0; off < PS; off++)
      fe.table[(size_t)row * COLS + k * PS + off] = page * PS + (int32_t)off;
  }
  if (row_pages[row] < ceil_pages(tokens)) row_pages[row] = ceil_pages(tokens);
}

static void release_units(worker *w, uint64_t sid, skv_status expected) {
  size_t i;
  TSTATUS(w, skv_release_session(cache, sid), expected);
  if (expected != SKV_OK) return;
  for (i = 0; i < UNITS; i++)
    if (w->units[i].sid == sid) w->units[i].live = 0;
}

static void turn(worker *w, unit *u) {
  skv_req r, before;
  skv_match m;
  uint32_t handled, new_tokens = 1 + rnd(w, 8), prot = 0, origin, out, extra, fin;
  int32_t row;
  int hit, pre_abort = rnd(w, 20) == 0;

  if (u->live && u->alloc > 200) {
    release_units(w, u->sid, SKV_OK);
    return;
  }
  if (!u->live && rnd(w, 2)) prot = PS * (1 + rnd(w, 2));
  origin = (u->live ? u->alloc : prot) + new_tokens;

  skv_req_init(&r);
  r.origin_input_len = origin;
  before = r;
  TSTATUS(w, skv_match_prefix(cache, u->sid, u->bid, &r, origin - 1, (uint32_t)pre_abort, &m),
          SKV_OK);
  hit = u->live && !pre_abort;
  TCHECK(w, m.hit == (uint32_t)hit);
  TCHECK(w, m.prefix_len == (hit ? u->alloc : 0));
  if (!hit) TCHECK(w, req_same(&r, &before));
  if (pre_abort) return;

  if (hit) {
    TCHECK(w, r.req_pool_idx == u->row && r.kv_allocated_len == u->alloc &&
                  r.kv_committed_len == u->alloc && r.cache_protected_len == u->protected_len &&
                  r.lock_node == u->lock && r.aux_state == u->aux);
    row = u->row;
    if (rnd(w, 10) == 0) release_units(w, u->sid, SKV_ERR_STATE); /* in flight */
  } else {
    row = w->next_row++;
    row_used[row] = 1;
    row_pages[row] = 0;
    r.req_pool_idx = row;
    r.cache_protected_len = r.kv_committed_len = r.kv_allocated_len = prot;
    if (prot) {
      map_upto(w, row, prot, PAGE_TREE); /* a prefix-tree hit: the tree owns these pages */
      r.lock_node = ((uint64_t)w->t << 40) | (w->n_locks + 1);
      r.lock_receipt = r.lock_node + 1;
      w->locks[w->n_locks++] = r.lock_node;
    }
    if (rnd(w, 2)) {
      r.aux_state = (int64_t)w->t * 1000000 + (int64_t)w->n_auxes;
      w->auxes[w->n_auxes++] = r.aux_state;
    }
  }
  TSTATUS(w, skv_checkpoint(cache, u->sid, u->bid, &r, &handled), SKV_OK);
  TCHECK(w, handled == (uint32_t)hit);

  /* prefill; sometimes the scheduler rejects it and the retried match frees the extension */
  r.kv_allocated_len = origin + (hit ? rnd(w, 6) : 0);
  r.kv_committed_len = origin;
  map_upto(w, row, r.kv_allocated_len, PAGE_ROW);
  if (hit && rnd(w, 6) == 0) {
    TSTATUS(w, skv_match_prefix(cache, u->sid, u->bid, &r, origin - 1, 0, &m), SKV_OK);
    TCHECK(w, m.hit == 1 && m.prefix_len == u->alloc && r.kv_allocated_len == u->alloc);
    row_pages[row] = ceil_pages(u->alloc);
    r.kv_allocated_len = r.kv_committed_len = origin;
    map_upto(w, row, origin, PAGE_ROW);
  }

  /* speculative decode: the last verify round overshoots; the committed counter lags */
  out = 1 + rnd(w, 16);
  extra = rnd(w, 4);
  r.output_len = out;
  if (r.kv_allocated_len < origin + out + extra) r.kv_allocated_len = origin + out + extra;
  r.kv_committed_len = origin + out - 1;
  r.finished_len = rnd(w, 3) == 0 ? -1 : (int32_t)rnd(w, out + 1);
  map_upto(w, row, r.kv_allocated_len, PAGE_ROW);

  if (rnd(w, 12) == 0) {
    TSTATUS(w, skv_cache_finished_req(cache, u->sid, u->bid, &r, 1), SKV_OK);
    TCHECK(w, req_is_empty(&r));
    u->live = 0;
    return;
  }
  fin = r.finished_len < 0 ? out : (uint32_t)r.finished_len;
  if (!hit) {
    u->protected_len = prot;
    u->lock = r.lock_node;
    u->aux = r.aux_state;
    u->row = row;
  }
  /* the slot keeps min(allocated, target); the trim leaves its partial page mapped */
  u->alloc = origin + fin < r.kv_allocated_len ? origin + fin : r.kv_allocated_len;
  TSTATUS(w, skv_cache_finished_req(cache, u->sid, u->bid, &r, 0), SKV_OK);
  TCHECK(w, req_is_empty(&r) && r.output_len == fin && r.origin_input_len == origin);
  u->live = 1;
  row_pages[row] = ceil_pages(u->alloc);
}

static void *run_worker(void *arg) {
  worker *w = (worker *)arg;
  int step;
  skv_held h;
  for (step = 0; step < STEPS; step++) {
    unit *u = &w->units[rnd(w, UNITS)];
    turn(w, u);
    if (rnd(w, 30) == 0) {
      /* an error on this thread, then a success that clears it */
      skv_req bad = req_make(-5, 0, 0);
      TSTATUS(w, skv_free_tail(cache, &bad, 0), SKV_ERR_INVALID_ARG);
      TSTATUS(w, skv_session_held(cache, NULL, 0, &h), SKV_OK);
    }
  }
  return NULL;
}

static void lock_mutex(void *m) { pthread_mutex_lock((pthread_mutex_t *)m); }
static void unlock_mutex(void *m) { pthread_mutex_unlock((pthread_mutex_t *)m); }

/* Every page, index, row, lock and aux went back exactly once; tree pages never did. */
static void check_accounting(void) {
  static unsigned char page_freed[PAGES];
  static unsigned char index_freed[PAGES * PS];
  static unsigned char row_freed[ROWS];
  size_t i, k, t, j;
  int bad_index = 0, bad_page = 0, bad_row = 0, bad_lock = 0, bad_aux = 0;
  for (i = 0; i < fe.n_calls; i++) {
    const fe_call *c = &fe.calls[i];
    if (c->kind == FE_FREE_KV) {
      int32_t prev_page = -1;
      for (k = 0; k < c->n; k++) {
        int32_t idx = c->indices[k], page = idx / PS;
        if (idx < 0 || page >= PAGES || page_state[page] != PAGE_ROW ||
            index_freed[idx]++ != 0) {
          bad_index++;
          continue;
        }
        if (page != prev_page && page_freed[page]++ != 0) bad_page++;
        prev_page = page;
      }
    } else if (c->kind == FE_FREE_ROW) {
      if (c->row < 0 || c->row >= ROWS || !row_used[c->row] || row_freed[c->row]++ != 0)
        bad_row++;
    }
  }
  for (i = 0; i < PAGES; i++)
    if (page_state[i] == PAGE_ROW && page_freed[i] != 1) bad_page++;
  for (i = 0; i < ROWS; i++)
    if (row_used[i] && row_freed[i] != 1) bad_row++;
  for (t = 0; t < THREADS; t++) {
    for (j = 0; j < workers[t].n_locks; j++) {
      size_t n = 0;
      for (i = 0; i < fe.n_calls; i++)
        n += fe.calls[i].kind == FE_DEC_LOCK && fe.calls[i].lock_node == workers[t].locks[j] &&
             fe.calls[i].lock_receipt == workers[t].locks[j] + 1;
      bad_lock += n != 1;
    }
    for (j = 0; j < workers[t].n_auxes; j++) {
      size_t n = 0;
      for (i = 0; i < fe.n_calls; i++)
        n += fe.calls[i].kind == FE_FREE_AUX && fe.calls[i].aux == workers[t].auxes[j];
      bad_aux += n != 1;
    }
  }
  CHECK_EQ_INT(bad_index, 0);
  CHECK_EQ_INT(bad_page, 0);
  CHECK_EQ_INT(bad_row, 0);
  CHECK_EQ_INT(bad_lock, 0);
  CHECK_EQ_INT(bad_aux, 0);
  CHECK_EQ_INT(fe_count_kind(&fe, FE_DEC_LOCK), workers[0].n_locks + workers[1].n_locks +
                                                    workers[2].n_locks + workers[3].n_locks);
  CHECK_EQ_INT(fe_count_kind(&fe, FE_FREE_AUX), workers[0].n_auxes + workers[1].n_auxes +
                                                    workers[2].n_auxes + workers[3].n_auxes);
  CHECK_EQ_INT(fe.bad_args, 0);
}

int main(void) {
  pthread_t th[THREADS];
  pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  uint64_t full = 0, rows = 0, aux = 0, sessions = 0;
  size_t i, t;
  int rc_ok = 1;

  fe_init(&fe, ROWS, COLS);
  fe.lock = lock_mutex;
  fe.unlock = unlock_mutex;
  fe.lock_arg = &mu;
  cache = fe_cache(&fe, PS, 0);
  if (!cache) return ctest_summary();

  for (t = 0; t < THREADS; t++) {
    worker *w = &workers[t];
    w->t = (int)t;
    w->rng = 0x9E3779B97F4A7C15ull * (t + 1);
    w->next_row = (int32_t)(t * ROWS_PER_THREAD);
    w->next_page = (int32_t)(t * PAGES_PER_THREAD + 1);
    for (i = 0; i < UNITS; i++) {
      w->units[i].sid = 1000 * (t + 1) + i / 2;
      w->units[i].bid = i % 2;
      w->units[i].aux = -1;
    }
  }
  for (t = 0; t < THREADS; t++)
    rc_ok &= pthread_create(&th[t], NULL, run_worker, &workers[t]) == 0;
  CHECK(rc_ok);
  for (t = 0; t < THREADS; t++) pthread_join(th[t], NULL);
  for (t = 0; t < THREADS; t++) {
    ctest_passed += workers[t].passed;
    ctest_failed += workers[t].failed;
    CHECK(workers[t].next_row <= (int32_t)((t + 1) * ROWS_PER_THREAD));
    CHECK(workers[t].next_page <= (int32_t)((t + 1) * PAGES_PER_THREAD));
  }

  /* what the threads' own records say the sessions hold */
  for (t = 0; t < THREADS; t++)
    for (i = 0; i < UNITS; i++) {
      const unit *u = &workers[t].units[i];
      if (!u->live) continue;
      full += ceil_pages(u->alloc) * PS - u->protected_len;
      rows++;
      aux += u->aux != -1;
      sessions++;
    }
  CHECK(sessions > 0);
  CHECK_HELD(held_of(cache, NULL, 0), full, full, rows, aux, sessions);

  for (t = 0; t < THREADS; t++)
    for (i = 0; i < UNITS; i += 2) CHECK_OK(skv_release_session(cache, workers[t].units[i].sid));
  CHECK_HELD(held_of(cache, NULL, 0), 0, 0, 0, 0, 0);
  check_accounting();

  skv_cache_free(cache);
  fe_free(&fe);
  pthread_mutex_destroy(&mu);
  return ctest_summary();
}
