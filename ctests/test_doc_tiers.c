/* docs/tiers.md, "A session through the tier": an owned-mode engine with a host tier. Its KV
 * is real memory here (a token tag a slot, device and host pools as arrays); copy_pages only
 * queues copies and the engine runs them at its fence. Session 1 finishes a turn, is written
 * back, parked by an eviction; session 2 then takes its device pages and overwrites them; a
 * tiered match restores session 1 into new pages, and its KV is checked slot by slot before
 * its next turn runs and finishes. The audit is clean at the end. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "skv.h"

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

#define PS 16
#define DEV_PAGES 32
#define HOST_PAGES 16
#define SYS_LEN 16   /* a shared system prompt: one page, engine-held */
#define MAX_COPIES 8 /* copies queued at once */

/* doc:engine */
/* The engine's KV: one value a token slot in each pool (a real engine: every layer's K and
 * V of the slot). A queued copy is what copy_pages asked for, not yet run. */
typedef struct copy {
  uint64_t ticket;
  uint32_t direction;
  size_t n;
  int32_t src[DEV_PAGES], dst[DEV_PAGES];
} copy;

typedef struct engine {
  uint32_t dev[DEV_PAGES * PS];
  uint32_t host[HOST_PAGES * PS];
  copy queue[MAX_COPIES];
  size_t queued;
} engine;

/* copy_pages: enqueue only (cudaMemcpyAsync on the copy stream), never wait. This engine has
 * no SWA pool, so n_swa is 0; a full queue enqueues nothing and says so. */
static int copy_pages(void *ud, uint64_t ticket, uint32_t direction, const int32_t *src,
                      const int32_t *dst, size_t n_full, size_t n_swa) {
  engine *e = ud;
  copy *q;
  if (e->queued == MAX_COPIES || n_full > DEV_PAGES || n_swa != 0) return 1;
  q = &e->queue[e->queued++];
  q->ticket = ticket;
  q->direction = direction;
  q->n = n_full;
  memcpy(q->src, src, n_full * sizeof *src); /* the arrays live only during the call */
  memcpy(q->dst, dst, n_full * sizeof *dst);
  return 0;
}

/* The fence: the queued copies run (here, now; a real engine waits on the copy stream's
 * event), then each ticket is completed, outside any libskv call. */
static void run_copies(skv_cache *c, engine *e) {
  size_t i, p;
  for (i = 0; i < e->queued; i++) {
    const copy *q = &e->queue[i];
    for (p = 0; p < q->n; p++) {
      uint32_t *from = q->direction == SKV_COPY_TO_HOST ? e->dev : e->host;
      uint32_t *to = q->direction == SKV_COPY_TO_HOST ? e->host : e->dev;
      memcpy(to + (size_t)q->dst[p] * PS, from + (size_t)q->src[p] * PS, PS * sizeof *to);
    }
  }
  for (i = 0; i < e->queued; i++) TRY(skv_ticket_done(c, e->queue[i].ticket, 0));
  e->queued = 0;
}
/* end */

static uint32_t tag(uint64_t session, uint32_t pos) { return (uint32_t)session * 1000 + pos + 1; }

/* The forward pass of n tokens of a running req: each new slot gets its token's KV. */
static void forward(skv_cache *c, engine *e, skv_req *r, uint64_t session, uint32_t n) {
  int32_t loc[DEV_PAGES * PS];
  uint32_t i, at = r->kv_allocated_len;
  TRY(skv_alloc_extend(c, r, n, loc));
  for (i = 0; i < n; i++) e->dev[loc[i]] = tag(session, at + i);
  TRY(skv_commit(c, r, n));
}

/* A first turn: a row that maps the system prompt, the rest prefilled, `out` tokens decoded. */
static void first_turn(skv_cache *c, engine *e, const int32_t *sys, uint64_t session,
                       uint32_t prompt_len, uint32_t out) {
  skv_req r;
  TRY(skv_req_init(&r));
  r.origin_input_len = prompt_len;
  TRY(skv_alloc_row(c, &r));
  TRY(skv_map_prefix(c, &r, sys, SYS_LEN));
  forward(c, e, &r, session, prompt_len - SYS_LEN);
  forward(c, e, &r, session, out);
  r.output_len = out;
  r.finished_len = (int32_t)out;
  TRY(skv_cache_finished_req(c, session, 0, &r, 0));
}

/* The audit holds in every place: parked sessions and copies in progress included. */
static int audit_clean(const skv_cache *c) {
  skv_check_report rep;
  TRY(skv_cache_check(c, &rep));
  if (rep.violations) fprintf(stderr, "audit: %s\n", rep.first_violation);
  return rep.violations == 0;
}

/* Every slot of the req's row holds its token's KV: the system prompt's, then the session's. */
static int kv_intact(skv_cache *c, engine *e, const skv_req *r, uint64_t session) {
  int32_t idx[DEV_PAGES * PS];
  uint32_t i;
  TRY(skv_row_indices(c, r->req_pool_idx, 0, r->kv_allocated_len, idx));
  for (i = 0; i < r->kv_allocated_len; i++)
    if (e->dev[idx[i]] != (i < SYS_LEN ? tag(0, i) : tag(session, i))) return 0;
  return 1;
}

int main(void) {
  static engine e;
  skv_cache_config cfg;
  skv_engine_hooks hooks;
  skv_cache *c = NULL;
  int32_t sys[SYS_LEN];
  skv_where w;
  skv_tier_evicted ev;
  skv_tier_match tm;
  skv_tier_stats ts;
  skv_stats s;
  skv_check_report rep;
  skv_match m;
  skv_req req;
  uint64_t pages = 0, ticket = 0;
  uint32_t i;
  int steps = 0;

  /* doc:setup */
  memset(&cfg, 0, sizeof cfg);
  cfg.struct_size = sizeof cfg;
  cfg.page_size = PS;
  cfg.num_token_slots = DEV_PAGES * PS;   /* the device pool (page 0 is padding) */
  cfg.num_rows = 8;
  cfg.max_context_len = 512;
  cfg.host_num_token_slots = HOST_PAGES * PS; /* the host tier's pool */
  cfg.tier_idle_steps = 2;      /* written back once idle 2 skv_tier_step calls */
  cfg.tier_min_tokens = 0;      /* one page: see "Break-even" for a real value */
  cfg.tier_pages_per_step = 64; /* the write-back budget of a step */
  TRY(skv_cache_new(&cfg, &c));

  memset(&hooks, 0, sizeof hooks);
  hooks.struct_size = sizeof hooks;
  hooks.copy_pages = copy_pages;
  TRY(skv_cache_set_hooks(c, &hooks, &e));
  /* end */

  TRY(skv_pool_alloc(c, SYS_LEN, sys)); /* the prefix tree's system prompt, prefilled */
  for (i = 0; i < SYS_LEN; i++) e.dev[sys[i]] = tag(0, i);
  first_turn(c, &e, sys, 1, SYS_LEN + 30, 10); /* session 1 holds 56 tokens: 4 pages */

  /* doc:writeback */
  /* The scheduler ticks the tier once a step. Session 1 finished at clock 0: the second
   * tick starts its write-back, the 3 pages past its protected prefix, under ticket 1. */
  do {
    TRY(skv_tier_step(c, &pages, &ticket));
    steps++;
  } while (ticket == 0 && steps < 10);
  EXPECT(steps == 2 && pages == 3 && ticket == 1);
  run_copies(c, &e); /* the copy ran: skv_ticket_done(c, 1, 0) */
  memset(&w, 0, sizeof w);
  w.struct_size = sizeof w;
  TRY(skv_session_where(c, 1, 0, &w));
  EXPECT(w.place == SKV_PLACE_BOTH && w.host_pages == 3 && w.ticket == 0);
  /* end */
  EXPECT(w.device_pages == 4 && w.tokens == SYS_LEN + 40 && w.state == 0);
  EXPECT(audit_clean(c));
  TRY(skv_cache_stats(c, &s));

  /* doc:park */
  /* Pressure: 3 device pages wanted. Session 1's host copy is clean, so the eviction parks
   * it now, with no copy: its pages past the prefix go free, its row keeps the prefix. */
  memset(&ev, 0, sizeof ev);
  ev.struct_size = sizeof ev;
  TRY(skv_tier_evict(c, 3, 0, &ev));
  EXPECT(ev.parked == 1 && ev.freed_pages == 3 && ev.ticket == 0);
  TRY(skv_session_where(c, 1, 0, &w));
  EXPECT(w.place == SKV_PLACE_HOST && w.device_pages == 1 && w.host_pages == 3);
  /* end */
  {
    skv_stats after;
    TRY(skv_cache_stats(c, &after));
    EXPECT(after.free_pages == s.free_pages + 3 && after.free_rows == s.free_rows);
  }
  EXPECT(audit_clean(c));
  /* the pressure: session 2 takes the freed pages and writes its own KV into them */
  first_turn(c, &e, sys, 2, SYS_LEN + 40, 8);

  /* doc:restore */
  /* Session 1's next turn. A plain match refuses a parked session; the tiered match restores
   * it into new device pages and names the copy the forward pass must wait for. */
  TRY(skv_req_init(&req));
  req.origin_input_len = SYS_LEN + 40 + 12;
  EXPECT(skv_match_prefix(c, 1, 0, &req, req.origin_input_len - 1, 0, &m) == SKV_ERR_STATE);
  memset(&tm, 0, sizeof tm);
  tm.struct_size = sizeof tm;
  TRY(skv_match_prefix_tier(c, 1, 0, &req, req.origin_input_len - 1, 0, &tm));
  EXPECT(tm.hit == 1 && tm.prefix_len == SYS_LEN + 40 && tm.restored_pages == 3 && tm.ticket == 2);
  run_copies(c, &e); /* before the forward pass: the restore's copy ran, ticket 2 done */
  EXPECT(kv_intact(c, &e, &req, 1));
  forward(c, &e, &req, 1, 12); /* the prompt's new tokens */
  forward(c, &e, &req, 1, 8);  /* the answer */
  req.output_len = 8;
  req.finished_len = 8;
  TRY(skv_cache_finished_req(c, 1, 0, &req, 0));
  TRY(skv_session_where(c, 1, 0, &w));
  EXPECT(w.place == SKV_PLACE_DEVICE && w.host_pages == 0); /* the restore dropped it */
  /* end */
  EXPECT(w.tokens == SYS_LEN + 60 && w.device_pages == 5 && w.state == 0);
  EXPECT(audit_clean(c));

  memset(&ts, 0, sizeof ts);
  ts.struct_size = sizeof ts;
  TRY(skv_cache_tier_stats(c, &ts));
  EXPECT(ts.open_tickets == 0 && ts.clock == 2 && ts.parked_sessions == 0);
  EXPECT(ts.parks == 1 && ts.unparks == 1 && ts.writebacks == 1 && ts.failed_copies == 0);
  EXPECT(ts.pages_to_host == 3 && ts.pages_to_device == 3);
  EXPECT(ts.host_total_pages == HOST_PAGES && ts.host_free_pages == HOST_PAGES - 1);
  EXPECT(ts.draining_pages == 0 && ts.host_draining_pages == 0);

  /* doc:end */
  TRY(skv_release_session(c, 1));
  TRY(skv_release_session(c, 2));
  TRY(skv_pool_free(c, sys, SYS_LEN));
  TRY(skv_cache_check(c, &rep));
  EXPECT(rep.violations == 0);
  TRY(skv_cache_stats(c, &s));
  EXPECT(s.free_pages == s.total_pages - 1 && s.free_rows == s.total_rows);
  skv_cache_free(c);
  /* end */

  printf("test_doc_tiers: %d failures\n", failures);
  return failures != 0;
}
