/* docs/recipes.md, "An external-mode engine": a paged engine that owns its KV pool and its
 * req_to_token table, driving libskv's session calls through a streaming conversation.
 * It checks its own pool after every turn: no page freed twice, none leaked. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "skv.h"

#define PS 4          /* tokens per page */
#define NPAGES 256    /* page 0 is kept as padding, as many engines do */
#define NROWS 8
#define MAXLEN 256

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

/* doc:engine */
typedef struct engine {
  int32_t req_to_token[NROWS][MAXLEN];
  int32_t page_owner[NPAGES];   /* row + 1 that owns the page, 0 = free */
  int32_t free_pages[NPAGES], n_free_pages;
  int row_used[NROWS];
  int double_frees;             /* a page or row handed back twice */
  long lock_refs, aux_freed;
} engine;

static int32_t take_page(engine *e, int32_t row) {
  int32_t p = e->free_pages[--e->n_free_pages];
  e->page_owner[p] = row + 1;
  return p;
}

/* Maps positions [kv_allocated_len, +n) of the req's row: a position inside the row's
 * partial page reuses that page (its slots are the row's already), a position on a page
 * boundary takes a new page. */
static void extend(engine *e, skv_req *req, uint32_t n) {
  int32_t *row = e->req_to_token[req->req_pool_idx];
  uint32_t p;
  for (p = req->kv_allocated_len; p < req->kv_allocated_len + n; p++)
    row[p] = p % PS ? row[p - 1] + 1 : take_page(e, req->req_pool_idx) * PS;
  req->kv_allocated_len += n;
}
/* end */

/* doc:callbacks */
static int cb_read_row(void *ud, int32_t row, uint32_t start, uint32_t end, int32_t *out) {
  engine *e = (engine *)ud;
  memcpy(out, &e->req_to_token[row][start], (end - start) * sizeof(int32_t));
  return 0;
}

/* libskv hands back token indices, in position order. Every range starts on a page
 * boundary, so a page's indices are adjacent: free a page when its first index shows up. */
static int cb_free_kv(void *ud, const int32_t *indices, size_t n) {
  engine *e = (engine *)ud;
  size_t i;
  for (i = 0; i < n; i++) {
    int32_t page = indices[i] / PS;
    if (i > 0 && indices[i - 1] / PS == page) continue; /* same page as the last index */
    if (e->page_owner[page] == 0) {
      e->double_frees++;
      return -1;
    }
    e->page_owner[page] = 0;
    e->free_pages[e->n_free_pages++] = page;
  }
  return 0;
}

static int cb_free_row(void *ud, int32_t row) {
  engine *e = (engine *)ud;
  if (!e->row_used[row]) {
    e->double_frees++;
    return -1;
  }
  e->row_used[row] = 0;
  return 0;
}

static int cb_dec_lock_ref(void *ud, uint64_t lock_node, uint64_t lock_receipt) {
  (void)lock_node, (void)lock_receipt;
  ((engine *)ud)->lock_refs--; /* a real engine unlocks its prefix-tree path here */
  return 0;
}

static int cb_free_aux(void *ud, int64_t aux_state) {
  (void)aux_state;
  ((engine *)ud)->aux_freed++;
  return 0;
}
/* end */

static void engine_init(engine *e) {
  int32_t p;
  memset(e, 0, sizeof *e);
  for (p = NPAGES - 1; p >= 1; p--) e->free_pages[e->n_free_pages++] = p;
}

/* doc:create */
static skv_cache *make_cache(engine *e) {
  skv_cache_config cfg;
  skv_pool_ops ops;
  skv_cache *c = NULL;
  memset(&cfg, 0, sizeof cfg); /* zero what this code does not set: the structs grow */
  cfg.struct_size = sizeof cfg;
  cfg.page_size = PS;
  cfg.num_rows = NROWS;          /* the engine's req_to_token rows */
  cfg.max_context_len = MAXLEN;  /* its row width */
  memset(&ops, 0, sizeof ops);
  ops.struct_size = sizeof ops;
  ops.read_row = cb_read_row;
  ops.free_kv = cb_free_kv;
  ops.free_row = cb_free_row;
  ops.dec_lock_ref = cb_dec_lock_ref;
  ops.free_aux = cb_free_aux;
  TRY(skv_cache_new_external(&cfg, &ops, e, &c));
  return c;
}
/* end */

static int32_t take_row(engine *e) {
  int32_t r;
  for (r = 0; r < NROWS; r++)
    if (!e->row_used[r]) {
      e->row_used[r] = 1;
      return r;
    }
  return -1;
}

/* doc:turn */
/* One turn of (session, branch): the prompt is the whole conversation so far plus the new
 * user tokens. Decodes in verify rounds of k drafts, `accepted` of them accepted per round,
 * until max_new tokens exist; the last round overshoots. Returns the conversation length. */
static uint32_t run_turn(skv_cache *c, engine *e, uint64_t session, uint64_t branch,
                         uint32_t prompt_len, uint32_t max_new, int abort_midway) {
  const uint32_t k = 4, accepted = 2;
  skv_req req;
  skv_match m;
  TRY(skv_req_init(&req));
  req.origin_input_len = prompt_len;
  TRY(skv_match_prefix(c, session, branch, &req, prompt_len - 1, /*pre_aborted=*/0, &m));
  if (!m.hit) {
    /* first turn of this branch: a row of our own; a real engine would match its prefix
     * tree here and set cache_protected_len, lock_node and lock_receipt */
    req.req_pool_idx = take_row(e);
    req.aux_state = 1000 + (int64_t)session; /* e.g. a mamba state slot */
  }
  /* prefill [kv_allocated_len, prompt_len): after a hit, kv_allocated_len == prefix_len */
  extend(e, &req, prompt_len - req.kv_allocated_len);
  req.kv_committed_len = prompt_len;
  while (req.output_len < max_new) {
    extend(e, &req, k + 1);                          /* k drafts + the bonus token */
    req.kv_committed_len += accepted + 1;            /* the verify round's verdict */
    req.output_len += accepted + 1;
    TRY(skv_free_tail(c, &req, req.kv_committed_len)); /* drop the rejected drafts */
    if (abort_midway) {                              /* the client went away */
      TRY(skv_cache_finished_req(c, session, branch, &req, /*aborted=*/1));
      return 0;
    }
  }
  req.finished_len = (int32_t)max_new; /* what the turn really produced */
  TRY(skv_cache_finished_req(c, session, branch, &req, /*aborted=*/0));
  /* the req holds nothing now; the slot holds the row, trimmed to prompt_len + max_new */
  return prompt_len + max_new;
}
/* end */

static uint32_t pages_in_use(const engine *e) { return (uint32_t)(NPAGES - 1 - e->n_free_pages); }

int main(void) {
  engine e;
  skv_cache *c;
  uint32_t len, pages_before;
  skv_held held;
  engine_init(&e);
  c = make_cache(&e);

  /* three turns of session 7: each keeps prompt + max_new tokens, nothing more */
  len = run_turn(c, &e, 7, 0, 10, 10, 0); /* the last round overshoots to 12 */
  EXPECT(len == 20);
  EXPECT(pages_in_use(&e) == 20 / PS);
  len = run_turn(c, &e, 7, 0, len + 6, 10, 0);
  EXPECT(len == 36);
  EXPECT(pages_in_use(&e) == 36 / PS);
  TRY(skv_session_held(c, NULL, 0, &held));
  EXPECT(held.sessions == 1 && held.rows == 1 && held.full_tokens == 36);

  /* doc:handback */
  /* matched, then dropped by the scheduler before it ran: hand it back; the slot is idle
   * again exactly as the match left it, no KV freed, no callback run */
  {
    skv_req req;
    skv_match m;
    TRY(skv_req_init(&req));
    req.origin_input_len = len + 5;
    TRY(skv_match_prefix(c, 7, 0, &req, len + 4, 0, &m));
    EXPECT(m.hit && m.prefix_len == len);
    pages_before = pages_in_use(&e);
    TRY(skv_hand_back(c, 7, 0, &req));
    EXPECT(req.req_pool_idx == -1 && pages_in_use(&e) == pages_before);
    /* the next turn finds the slot as it was: the whole conversation is reusable */
    TRY(skv_req_init(&req));
    req.origin_input_len = len + 5;
    TRY(skv_match_prefix(c, 7, 0, &req, len + 4, 0, &m));
    EXPECT(m.hit && m.prefix_len == len);
    TRY(skv_hand_back(c, 7, 0, &req));
  }
  /* end */

  /* doc:preabort */
  /* rejected before it ran (e.g. its prompt is too long): pre_aborted = 1 leaves the slot
   * as it is; the req holds no row, so it is simply dropped, never finished */
  {
    skv_req req;
    skv_match m;
    TRY(skv_req_init(&req));
    req.origin_input_len = 100000;
    TRY(skv_match_prefix(c, 7, 0, &req, 99999, /*pre_aborted=*/1, &m));
    EXPECT(!m.hit && req.req_pool_idx == -1);
  }
  /* end */

  /* a fourth turn aborts mid-way: the whole session goes, its aux state with it */
  run_turn(c, &e, 7, 0, len + 3, 10, 1);
  EXPECT(pages_in_use(&e) == 0 && e.aux_freed == 1);

  /* two branches of session 8: the second is a fork, prefilled from scratch on its own row */
  len = run_turn(c, &e, 8, 0, 12, 5, 0);
  run_turn(c, &e, 8, 1, len + 4, 5, 0);
  run_turn(c, &e, 8, 0, len + 2, 5, 0);
  TRY(skv_session_held(c, NULL, 0, &held));
  EXPECT(held.sessions == 2 && held.rows == 2);
  TRY(skv_release_session(c, 8)); /* the conversation is over: every branch */
  EXPECT(pages_in_use(&e) == 0 && e.aux_freed == 3);

  EXPECT(e.double_frees == 0);
  {
    int r, rows = 0;
    for (r = 0; r < NROWS; r++) rows += e.row_used[r];
    EXPECT(rows == 0);
  }
  skv_cache_free(c);
  printf("%d passed, %d failed\n", failures ? 0 : 1, failures ? 1 : 0);
  return failures != 0;
}
