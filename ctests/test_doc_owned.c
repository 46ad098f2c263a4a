/* docs/recipes.md, "An owned-mode engine": libskv runs the paged KV pool and the rows; the
 * engine keeps a shared system prompt in its own prefix tree (engine-held pages), runs
 * streaming turns with speculative decoding, and audits the pool at the end. */
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
#define SYS_LEN 32 /* the shared system prompt: two pages */

/* doc:hooks */
typedef struct tree {
  int32_t sys[SYS_LEN]; /* the system prompt's token indices, engine-held */
  long locks;           /* sessions holding a lock on the system prompt's node */
} tree;

static int hook_dec_lock_ref(void *ud, uint64_t lock_node, uint64_t lock_receipt) {
  (void)lock_node, (void)lock_receipt;
  ((tree *)ud)->locks--;
  return 0;
}
/* end */

/* doc:owned-turn */
static uint32_t run_turn(skv_cache *c, tree *t, uint64_t session, uint64_t branch,
                         uint32_t prompt_len, uint32_t max_new) {
  const uint32_t k = 4, accepted = 3;
  skv_req req;
  skv_match m;
  TRY(skv_req_init(&req));
  req.origin_input_len = prompt_len;
  TRY(skv_match_prefix(c, session, branch, &req, prompt_len - 1, 0, &m));
  if (!m.hit) {
    /* first turn: a fresh row that starts with the shared system prompt's pages */
    TRY(skv_alloc_row(c, &req));
    TRY(skv_map_prefix(c, &req, t->sys, SYS_LEN)); /* protected = committed = 32 */
    req.lock_node = 1;                              /* the tree node we locked */
    req.lock_receipt = 1;
    t->locks++;
  }
  TRY(skv_alloc_extend(c, &req, prompt_len - req.kv_allocated_len, NULL)); /* prefill the rest */
  TRY(skv_commit(c, &req, prompt_len - req.kv_committed_len));
  while (req.output_len < max_new) {
    TRY(skv_alloc_extend(c, &req, k + 1, NULL));
    TRY(skv_commit(c, &req, accepted + 1));
    req.output_len += accepted + 1;
    TRY(skv_free_tail(c, &req, req.kv_committed_len)); /* drop rejected drafts */
  }
  req.finished_len = (int32_t)max_new;
  TRY(skv_cache_finished_req(c, session, branch, &req, 0));
  return prompt_len + max_new;
}
/* end */

int main(void) {
  skv_cache_config cfg;
  skv_engine_hooks hooks;
  skv_cache *c = NULL;
  tree t;
  skv_stats s;
  skv_check_report rep;
  skv_held held;
  uint32_t a, b;

  /* doc:owned-setup */
  memset(&cfg, 0, sizeof cfg);
  cfg.struct_size = sizeof cfg;
  cfg.page_size = PS;
  cfg.num_token_slots = 1u << 14; /* 1024 pages, page 0 is padding */
  cfg.num_rows = 16;
  cfg.max_context_len = 2048;
  TRY(skv_cache_new(&cfg, &c));

  memset(&t, 0, sizeof t);
  memset(&hooks, 0, sizeof hooks);
  hooks.struct_size = sizeof hooks;
  hooks.dec_lock_ref = hook_dec_lock_ref; /* free_aux stays NULL: no aux state here */
  TRY(skv_cache_set_hooks(c, &hooks, &t));

  /* the prefix tree's pages for the system prompt (prefilled once by the engine) */
  TRY(skv_pool_alloc(c, SYS_LEN, t.sys));
  /* end */

  a = run_turn(c, &t, 1, 0, SYS_LEN + 20, 30);
  b = run_turn(c, &t, 2, 0, SYS_LEN + 7, 12);
  a = run_turn(c, &t, 1, 0, a + 10, 30);
  EXPECT(a == SYS_LEN + 20 + 30 + 10 + 30);
  EXPECT(t.locks == 2);

  /* doc:owned-held */
  /* under memory pressure: what idle sessions hold, the running requests' rows excluded */
  TRY(skv_session_held(c, NULL, 0, &held));
  EXPECT(held.sessions == 2 && held.rows == 2);
  /* tokens past the shared prefix, counted in whole pages */
  EXPECT(held.full_tokens == (uint64_t)((a + PS - 1) / PS * PS - SYS_LEN) +
                                 (uint64_t)((b + PS - 1) / PS * PS - SYS_LEN));
  TRY(skv_cache_stats(c, &s));
  TRY(skv_release_branch(c, 2, 0)); /* evict session 2: its own pages and its lock go back */
  EXPECT(t.locks == 1);
  /* end */
  {
    skv_stats after;
    uint32_t refs[1];
    TRY(skv_cache_stats(c, &after));
    EXPECT(after.free_pages == s.free_pages + (b + PS - 1) / PS - SYS_LEN / PS);
    TRY(skv_page_refs(c, t.sys, 1, refs));
    EXPECT(refs[0] == 1); /* session 1's row still maps the system prompt */
  }

  /* doc:owned-end */
  TRY(skv_release_session(c, 1));
  TRY(skv_pool_free(c, t.sys, SYS_LEN)); /* the tree evicts the system prompt */
  TRY(skv_cache_check(c, &rep));
  EXPECT(rep.violations == 0);
  TRY(skv_cache_stats(c, &s));
  EXPECT(s.free_pages == s.total_pages - 1 && s.free_rows == s.total_rows);
  skv_cache_free(c);
  /* end */
  EXPECT(t.locks == 0);

  printf("%d passed, %d failed\n", failures ? 0 : 1, failures ? 1 : 0);
  return failures != 0;
}
