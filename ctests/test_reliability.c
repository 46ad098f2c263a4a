/* Hostile-input regressions (issue 9): versioned struct sizes, traced calls given arrays no
 * caller could own, calls made from inside callbacks, stale reqs on reused rows, and
 * skv_row_indices on an external handle. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdint.h>
#include <unistd.h>

#include "common.h"

/* The whole file as a string (caller frees). */
static char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  char *buf;
  long n;
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  n = ftell(f);
  fseek(f, 0, SEEK_SET);
  buf = malloc((size_t)n + 1);
  if (fread(buf, 1, (size_t)n, f) != (size_t)n) n = 0;
  buf[n] = '\0';
  fclose(f);
  return buf;
}

static skv_cache_config owned_cfg(void) {
  skv_cache_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.struct_size = (uint32_t)sizeof cfg;
  cfg.page_size = 4;
  cfg.num_token_slots = 64 * 4;
  cfg.num_rows = 8;
  cfg.max_context_len = 64;
  return cfg;
}

static skv_cache *owned_new(void) {
  skv_cache_config cfg = owned_cfg();
  skv_cache *c = NULL;
  CHECK_OK(skv_cache_new(&cfg, &c));
  return c;
}

/* ------------------------------------------------- versioned struct sizes */

/* A struct from some header, in a buffer with room for a longer one. */
#define VERSIONED(type)                                                                \
  union {                                                                              \
    type s;                                                                            \
    unsigned char bytes[64 + sizeof(type)];                                            \
  }

static void versioned_config(void) {
  VERSIONED(skv_cache_config) v;
  skv_cache *c = NULL;
  memset(&v, 0, sizeof v);
  v.s = owned_cfg();
  /* the first published size */
  v.s.struct_size = 32;
  CHECK_OK(skv_cache_new(&v.s, &c));
  skv_cache_free(c);
  c = NULL;
  /* the 0.3 header's size (no host tier) */
  v.s.struct_size = 40;
  CHECK_OK(skv_cache_new(&v.s, &c));
  skv_cache_free(c);
  c = NULL;
  /* this header's size */
  v.s.struct_size = 80;
  CHECK_OK(skv_cache_new(&v.s, &c));
  skv_cache_free(c);
  c = NULL;
  /* a size between two published ones would cut a field in two */
  v.s.struct_size = 36;
  CHECK_STATUS(skv_cache_new(&v.s, &c), SKV_ERR_INVALID_ARG);
  CHECK_MSG_HAS("struct_size 36 is no published sizeof(skv_cache_config) (32, 40, 80)");
  CHECK(c == NULL);
  v.s.struct_size = 48;
  CHECK_STATUS(skv_cache_new(&v.s, &c), SKV_ERR_INVALID_ARG);
  CHECK_MSG_HAS("struct_size 48 is no published sizeof(skv_cache_config)");
  CHECK(c == NULL);
  /* a newer header's longer struct whose unknown tail is zero */
  v.s.struct_size = 88;
  CHECK_OK(skv_cache_new(&v.s, &c));
  skv_cache_free(c);
  c = NULL;
  /* a field this library does not know */
  v.bytes[84] = 1;
  CHECK_STATUS(skv_cache_new(&v.s, &c), SKV_ERR_INVALID_ARG);
  CHECK_MSG_HAS("skv_cache_new");
  CHECK_MSG_HAS("byte 84");
  CHECK(c == NULL);
  v.bytes[84] = 0;
  /* shorter than any published struct */
  v.s.struct_size = 16;
  CHECK_STATUS(skv_cache_new(&v.s, &c), SKV_ERR_INVALID_ARG);
  CHECK_MSG_HAS("struct_size 16");
  CHECK(c == NULL);
}

static void versioned_pool_ops(void) {
  fake_engine fe;
  VERSIONED(skv_pool_ops) v;
  skv_cache_config cfg;
  skv_cache *c = NULL;
  fe_init(&fe, 4, 32);
  cfg = fe_config(&fe, 1, 0);
  memset(&v, 0, sizeof v);
  v.s = fe_ops();
  v.s.struct_size = 48;
  CHECK_OK(skv_cache_new_external(&cfg, &v.s, &fe, &c));
  skv_cache_free(c);
  c = NULL;
  v.s.struct_size = 64;
  CHECK_OK(skv_cache_new_external(&cfg, &v.s, &fe, &c));
  skv_cache_free(c);
  c = NULL;
  v.bytes[60] = 7;
  CHECK_STATUS(skv_cache_new_external(&cfg, &v.s, &fe, &c), SKV_ERR_INVALID_ARG);
  CHECK_MSG_HAS("byte 60");
  CHECK(c == NULL);
  v.bytes[60] = 0;
  v.s.struct_size = 16;
  CHECK_STATUS(skv_cache_new_external(&cfg, &v.s, &fe, &c), SKV_ERR_INVALID_ARG);
  CHECK_MSG_HAS("struct_size 16");
  CHECK(c == NULL);
  CHECK_NO_CALLS(&fe);
  fe_free(&fe);
}

static void versioned_hooks(void) {
  fake_engine fe;
  VERSIONED(skv_engine_hooks) v;
  skv_cache *c = owned_new();
  fe_init(&fe, 4, 32);
  memset(&v, 0, sizeof v);
  v.s.dec_lock_ref = fe_cb_dec_lock;
  v.s.free_aux = fe_cb_free_aux;
  v.s.struct_size = 24;
  CHECK_OK(skv_cache_set_hooks(c, &v.s, &fe));
  v.s.struct_size = 32;
  CHECK_OK(skv_cache_set_hooks(c, &v.s, &fe));
  /* between the published 24 and 32: it would cut copy_pages in two */
  v.s.struct_size = 28;
  CHECK_STATUS(skv_cache_set_hooks(c, &v.s, &fe), SKV_ERR_INVALID_ARG);
  CHECK_MSG_HAS("struct_size 28");
  v.s.struct_size = 40;
  CHECK_OK(skv_cache_set_hooks(c, &v.s, &fe));
  v.bytes[36] = 1;
  CHECK_STATUS(skv_cache_set_hooks(c, &v.s, &fe), SKV_ERR_INVALID_ARG);
  CHECK_MSG_HAS("byte 36");
  v.bytes[36] = 0;
  v.s.struct_size = 16;
  CHECK_STATUS(skv_cache_set_hooks(c, &v.s, &fe), SKV_ERR_INVALID_ARG);
  CHECK_MSG_HAS("struct_size 16");
  skv_cache_free(c);
  fe_free(&fe);
}

/* ------------------------------------------- traced calls and hostile arrays */

/* A traced handle reads no array before the body's own checks: lengths no array can have
 * are SKV_ERR_INVALID_ARG as untraced, and the trace says the array was invalid. */
static void traced_hostile_arrays(void) {
  char path[] = "/tmp/skv_rel_trace_XXXXXX";
  int fd = mkstemp(path), a[4] = {4, 5, 6, 7}, indptr[2], indices[4], last[1];
  uint32_t counts[4];
  size_t huge = SIZE_MAX / 2, needed = 0;
  skv_held h;
  skv_cache *c = owned_new();
  uint32_t *four;
  char *text;
  CHECK(fd >= 0);
  close(fd);
  CHECK_OK(skv_cache_set_trace(c, path));
  CHECK_STATUS(skv_session_held(c, a, huge, &h), SKV_ERR_INVALID_ARG);
  CHECK_MSG_HAS("skv_session_held");
  CHECK_STATUS(skv_pool_free(c, a, huge), SKV_ERR_INVALID_ARG);
  CHECK_MSG_HAS("skv_pool_free");
  CHECK_STATUS(skv_page_refs(c, a, huge, counts), SKV_ERR_INVALID_ARG);
  CHECK_MSG_HAS("skv_page_refs");
  CHECK_STATUS(skv_build_flashinfer(c, a, huge, indptr, indices, last, 4, &needed),
               SKV_ERR_INVALID_ARG);
  CHECK_MSG_HAS("skv_build_flashinfer");
  /* a hooks struct of 4 bytes, on the heap so a sanitizer sees any read past it */
  four = malloc(sizeof *four);
  *four = 4;
  CHECK_STATUS(skv_cache_set_hooks(c, (const skv_engine_hooks *)(void *)four, NULL),
               SKV_ERR_INVALID_ARG);
  CHECK_MSG_HAS("struct_size 4");
  free(four);
  /* the same arrays with real lengths are traced in full */
  CHECK_OK(skv_session_held(c, a, 4, &h));
  CHECK_OK(skv_cache_set_trace(c, NULL));
  text = slurp(path);
  CHECK(text != NULL);
  if (text) {
    CHECK_STR_CONTAINS(text, "\"fn\":\"skv_session_held\",\"active_rows\":\"invalid\"");
    CHECK_STR_CONTAINS(text, "\"fn\":\"skv_pool_free\",\"indices\":\"invalid\"");
    CHECK_STR_CONTAINS(text, "\"fn\":\"skv_page_refs\",\"indices\":\"invalid\"");
    CHECK_STR_CONTAINS(text, "\"fn\":\"skv_build_flashinfer\",\"rows\":\"invalid\"");
    CHECK_STR_CONTAINS(text, "\"fn\":\"skv_cache_set_hooks\",\"hooks\":\"invalid\"");
    CHECK_STR_CONTAINS(text, "\"active_rows\":[4,5,6,7]");
  }
  free(text);
  unlink(path);
  skv_cache_free(c);
}

/* --------------------------------------------- calls from inside callbacks */

#define CHAIN 9

/* One external handle whose free_row calls the next handle of the chain, its own handle,
 * and skv_cache_free of the chain's first (running) handle. */
typedef struct chain_link {
  fake_engine fe; /* first: the fake engine's callbacks see the same pointer */
  skv_cache *self, *next, *first;
  int called;
  skv_status next_status, self_status;
  char next_msg[256];
} chain_link;

static int chained_free_row(void *ud, int32_t row) {
  chain_link *l = (chain_link *)ud;
  skv_held h;
  l->called++;
  if (l->next) {
    l->next_status = skv_release_session(l->next, 1);
    strncpy(l->next_msg, skv_last_error(), sizeof l->next_msg - 1);
  }
  l->self_status = skv_session_held(l->self, NULL, 0, &h);
  skv_cache_free(l->first); /* a running handle: must do nothing */
  return fe_cb_free_row(ud, row);
}

static void callbacks_calling_other_handles(void) {
  chain_link links[CHAIN];
  skv_pool_ops ops = fe_ops();
  skv_cache_config cfg;
  int i;
  ops.free_row = chained_free_row;
  for (i = 0; i < CHAIN; i++) {
    memset(&links[i], 0, sizeof links[i]);
    fe_init(&links[i].fe, 2, 32);
    cfg = fe_config(&links[i].fe, 4, 0);
    CHECK_OK(skv_cache_new_external(&cfg, &ops, &links[i], &links[i].self));
    links[i].next_status = links[i].self_status = SKV_OK;
  }
  for (i = 0; i < CHAIN; i++) {
    links[i].next = i + 1 < CHAIN ? links[i + 1].self : NULL;
    links[i].first = links[0].self;
    fe_save_slot(links[i].self, &links[i].fe, 1, 0, 0, 0, 8, 0, 0, -1);
  }
  /* every call the chain's callbacks make on a handle is refused at once */
  CHECK_OK(skv_release_session(links[0].self, 1));
  CHECK_EQ_INT(links[0].called, 1);
  CHECK_EQ_INT(links[0].next_status, SKV_ERR_STATE);
  CHECK_STR_CONTAINS(links[0].next_msg, "skv_release_session");
  CHECK_STR_CONTAINS(links[0].next_msg, "callback");
  CHECK_EQ_INT(links[0].self_status, SKV_ERR_STATE);
  CHECK_EQ_INT(links[1].called, 0);
  /* the first handle survived its callback's skv_cache_free */
  CHECK_HELD(held_of(links[0].self, NULL, 0), 0, 0, 0, 0, 0);
  /* the others still hold their slots; releasing each from outside runs its callback, whose
   * call on the next handle (the 9th handle last) is refused the same way */
  for (i = 1; i < CHAIN; i++) {
    CHECK_HELD(held_of(links[i].self, NULL, 0), 8, 8, 1, 0, 1);
    CHECK_OK(skv_release_session(links[i].self, 1));
    CHECK_EQ_INT(links[i].called, 1);
    CHECK_EQ_INT(links[i].next_status, i + 1 < CHAIN ? SKV_ERR_STATE : SKV_OK);
    CHECK_EQ_INT(links[i].self_status, SKV_ERR_STATE);
    CHECK_HELD(held_of(links[i].self, NULL, 0), 0, 0, 0, 0, 0);
  }
  /* outside any callback the rule is lifted */
  CHECK_HELD(held_of(links[CHAIN - 1].self, NULL, 0), 0, 0, 0, 0, 0);
  for (i = 0; i < CHAIN; i++) {
    CHECK_EQ_INT(links[i].fe.bad_args, 0);
    skv_cache_free(links[i].self);
    fe_free(&links[i].fe);
  }
}

/* Two threads, each inside a callback at the same time (a barrier in the callback), each
 * calling the other's handle: both are refused; before, each waited on the lock the other
 * held. */
typedef struct crossing {
  fake_engine fe;
  skv_cache *self, *other;
  pthread_barrier_t *barrier;
  skv_status seen;
} crossing;

static int crossing_free_row(void *ud, int32_t row) {
  crossing *x = (crossing *)ud;
  pthread_barrier_wait(x->barrier);
  x->seen = skv_release_session(x->other, 1);
  return fe_cb_free_row(ud, row);
}

static void *release_one(void *arg) {
  crossing *x = (crossing *)arg;
  return (void *)(intptr_t)skv_release_session(x->self, 1);
}

static void callbacks_crossing_threads(void) {
  crossing x[2];
  pthread_barrier_t barrier;
  pthread_t t[2];
  skv_pool_ops ops = fe_ops();
  skv_cache_config cfg;
  void *rc[2];
  int i;
  ops.free_row = crossing_free_row;
  pthread_barrier_init(&barrier, NULL, 2);
  for (i = 0; i < 2; i++) {
    memset(&x[i], 0, sizeof x[i]);
    fe_init(&x[i].fe, 2, 32);
    cfg = fe_config(&x[i].fe, 4, 0);
    CHECK_OK(skv_cache_new_external(&cfg, &ops, &x[i], &x[i].self));
    x[i].barrier = &barrier;
    x[i].seen = SKV_OK;
  }
  for (i = 0; i < 2; i++) {
    x[i].other = x[1 - i].self;
    fe_save_slot(x[i].self, &x[i].fe, 1, 0, 0, 0, 8, 0, 0, -1);
  }
  for (i = 0; i < 2; i++) CHECK(pthread_create(&t[i], NULL, release_one, &x[i]) == 0);
  for (i = 0; i < 2; i++) {
    CHECK(pthread_join(t[i], &rc[i]) == 0);
    CHECK_EQ_INT((intptr_t)rc[i], SKV_OK);
    CHECK_EQ_INT(x[i].seen, SKV_ERR_STATE);
  }
  for (i = 0; i < 2; i++) {
    CHECK_HELD(held_of(x[i].self, NULL, 0), 0, 0, 0, 0, 0);
    skv_cache_free(x[i].self);
    fe_free(&x[i].fe);
  }
  pthread_barrier_destroy(&barrier);
}

/* Owned mode's hooks fall under the same rule. */
typedef struct hooked {
  fake_engine fe;
  skv_cache *self, *other;
  skv_status self_seen, other_seen;
} hooked;

static int hooked_free_aux(void *ud, int64_t aux) {
  hooked *h = (hooked *)ud;
  skv_stats s;
  h->self_seen = skv_cache_stats(h->self, &s);
  h->other_seen = skv_cache_stats(h->other, &s);
  skv_cache_free(h->self);
  return fe_cb_free_aux(ud, aux);
}

static void hooks_calling_libskv(void) {
  hooked h;
  skv_engine_hooks hooks;
  skv_req r;
  skv_stats s;
  memset(&h, 0, sizeof h);
  fe_init(&h.fe, 2, 32);
  h.self = owned_new();
  h.other = owned_new();
  memset(&hooks, 0, sizeof hooks);
  hooks.struct_size = (uint32_t)sizeof hooks;
  hooks.free_aux = hooked_free_aux;
  CHECK_OK(skv_cache_set_hooks(h.self, &hooks, &h));
  CHECK_OK(skv_req_init(&r));
  CHECK_OK(skv_alloc_row(h.self, &r));
  CHECK_OK(skv_alloc_extend(h.self, &r, 6, NULL));
  CHECK_OK(skv_commit(h.self, &r, 6));
  r.origin_input_len = 6;
  r.aux_state = 5;
  CHECK_OK(skv_cache_finished_req(h.self, 1, 0, &r, 0));
  CHECK_OK(skv_release_session(h.self, 1));
  CHECK_EQ_INT(h.self_seen, SKV_ERR_STATE);
  CHECK_EQ_INT(h.other_seen, SKV_ERR_STATE);
  CHECK_OK(skv_cache_stats(h.self, &s)); /* the free inside the hook did nothing */
  CHECK_EQ_U64(s.free_rows, 8);
  skv_cache_free(h.self);
  skv_cache_free(h.other);
  fe_free(&h.fe);
}

/* ------------------------------------------- owned-only calls in external mode */

static void row_indices_external(void) {
  fake_engine fe;
  skv_cache *c;
  int32_t out[4] = {-7, -7, -7, -7};
  int rows[] = {-1, 0, 1, 2, 1000, -1000}, i;
  fe_init(&fe, 2, 32);
  c = fe_cache(&fe, 4, 0);
  for (i = 0; i < (int)(sizeof rows / sizeof rows[0]); i++) {
    CHECK_STATUS(skv_row_indices(c, rows[i], 0, 4, out), SKV_ERR_UNSUPPORTED);
    CHECK_MSG_HAS("skv_row_indices");
    CHECK_STATUS(skv_row_indices(c, rows[i], 9, 4, out), SKV_ERR_UNSUPPORTED);
  }
  CHECK_EQ_INT(out[0], -7);
  /* the NULL checks come first */
  CHECK_STATUS(skv_row_indices(c, 5, 0, 4, NULL), SKV_ERR_NULL_ARG);
  CHECK_STATUS(skv_row_indices(NULL, 0, 0, 4, out), SKV_ERR_NULL_ARG);
  CHECK_NO_CALLS(&fe);
  skv_cache_free(c);
  fe_free(&fe);
}

/* ------------------------------------------------- stale reqs on reused rows */

/* Owned mode: copy a req, free it, let another request take the row and extend it: the
 * stale copy's free is refused and the live request's row stays. */
static void stale_free_req(void) {
  skv_cache *c = owned_new();
  skv_req a, b, stale, before;
  int32_t idx[4];
  skv_check_report rep;
  CHECK_OK(skv_req_init(&a));
  CHECK_OK(skv_alloc_row(c, &a));
  CHECK(a.row_generation != 0);
  CHECK_OK(skv_alloc_extend(c, &a, 8, NULL));
  stale = a;
  CHECK_OK(skv_free_req(c, &a));
  CHECK_EQ_U64(a.row_generation, 0);
  CHECK_OK(skv_req_init(&b));
  CHECK_OK(skv_alloc_row(c, &b));
  CHECK_EQ_INT(b.req_pool_idx, stale.req_pool_idx);
  CHECK(b.row_generation != stale.row_generation);
  CHECK_OK(skv_alloc_extend(c, &b, 8, NULL));
  before = stale;
  CHECK_STATUS(skv_free_req(c, &stale), SKV_ERR_STATE);
  CHECK_MSG_HAS("skv_free_req");
  CHECK_MSG_HAS("stale copy");
  CHECK_REQ_SAME(&stale, &before);
  /* every call taking the stale req says the same */
  CHECK_STATUS(skv_alloc_extend(c, &stale, 1, NULL), SKV_ERR_STATE);
  CHECK_STATUS(skv_commit(c, &stale, 1), SKV_ERR_STATE);
  CHECK_STATUS(skv_trim_overshoot(c, &stale, 0), SKV_ERR_STATE);
  CHECK_STATUS(skv_free_tail(c, &stale, 0), SKV_ERR_STATE);
  CHECK_STATUS(skv_publish_prefix(c, &stale, 0), SKV_ERR_STATE);
  CHECK_REQ_SAME(&stale, &before);
  /* the live request's row is intact */
  CHECK_OK(skv_row_indices(c, b.req_pool_idx, 0, 4, idx));
  CHECK_OK(skv_cache_check(c, &rep));
  CHECK_EQ_U64(rep.violations, 0);
  CHECK_OK(skv_free_req(c, &b));
  skv_cache_free(c);
}

/* A finished session's stale req, after release and row reuse, cannot turn another
 * request's row into that session's slot (owned mode). */
static void stale_finish_after_release_owned(void) {
  skv_cache *c = owned_new();
  skv_req r, stale, other, before;
  skv_stats st;
  skv_check_report rep;
  CHECK_OK(skv_req_init(&r));
  r.origin_input_len = 8;
  CHECK_OK(skv_alloc_row(c, &r));
  CHECK_OK(skv_alloc_extend(c, &r, 8, NULL));
  CHECK_OK(skv_commit(c, &r, 8));
  stale = r;
  CHECK_OK(skv_cache_finished_req(c, 1, 0, &r, 0));
  CHECK_OK(skv_release_session(c, 1));
  CHECK_OK(skv_req_init(&other));
  CHECK_OK(skv_alloc_row(c, &other));
  CHECK_EQ_INT(other.req_pool_idx, stale.req_pool_idx);
  CHECK_OK(skv_alloc_extend(c, &other, 12, NULL));
  CHECK_OK(skv_commit(c, &other, 8));
  before = stale;
  /* kv lengths made to agree with the live row: only the generation tells them apart */
  stale.kv_allocated_len = 12;
  before = stale;
  CHECK_STATUS(skv_cache_finished_req(c, 1, 0, &stale, 0), SKV_ERR_STATE);
  CHECK_MSG_HAS("stale copy");
  CHECK_REQ_SAME(&stale, &before);
  CHECK_STATUS(skv_cache_finished_req(c, 1, 0, &stale, 1), SKV_ERR_STATE);
  CHECK_REQ_SAME(&stale, &before);
  CHECK_OK(skv_cache_stats(c, &st));
  CHECK_EQ_U64(st.sessions, 0);
  CHECK_OK(skv_free_req(c, &other));
  CHECK_OK(skv_cache_check(c, &rep));
  CHECK_EQ_U64(rep.violations, 0);
  skv_cache_free(c);
}

/* The same in external mode: a match hit stamps the generation, release hands the row back
 * (its generation moves on), the engine gives the row to another request. */
static void stale_finish_after_release_external(void) {
  fake_engine fe;
  skv_cache *c;
  skv_req r, stale, before, fresh;
  skv_match m;
  fe_init(&fe, 4, 32);
  c = fe_cache(&fe, 4, 0);
  fe_save_slot(c, &fe, 1, 0, 2, 0, 8, 0, 0, -1);
  r = req_make(-1, 0, 0);
  r.origin_input_len = 10;
  CHECK_OK(skv_match_prefix(c, 1, 0, &r, 8, 0, &m));
  CHECK_EQ_INT(m.hit, 1);
  CHECK(r.row_generation != 0);
  r.kv_allocated_len = r.kv_committed_len = 10;
  stale = r;
  CHECK_OK(skv_cache_finished_req(c, 1, 0, &r, 0));
  CHECK_OK(skv_release_session(c, 1));
  fe_reset_calls(&fe);
  before = stale;
  CHECK_STATUS(skv_cache_finished_req(c, 1, 0, &stale, 0), SKV_ERR_STATE);
  CHECK_MSG_HAS("stale copy");
  CHECK_REQ_SAME(&stale, &before);
  CHECK_STATUS(skv_cache_finished_req(c, 1, 0, &stale, 1), SKV_ERR_STATE);
  CHECK_REQ_SAME(&stale, &before);
  CHECK_NO_CALLS(&fe);
  CHECK_HELD(held_of(c, NULL, 0), 0, 0, 0, 0, 0);
  /* the engine's own req on that row (never stamped) is fine */
  fresh = req_make(2, 4, 4);
  fresh.origin_input_len = 4;
  CHECK_OK(skv_cache_finished_req(c, 3, 0, &fresh, 0));
  CHECK_HELD(held_of(c, NULL, 0), 4, 4, 1, 0, 1);
  skv_cache_free(c);
  fe_free(&fe);
}

int main(void) {
  stale_free_req();
  stale_finish_after_release_owned();
  stale_finish_after_release_external();
  row_indices_external();
  callbacks_calling_other_handles();
  callbacks_crossing_threads();
  hooks_calling_libskv();
  traced_hostile_arrays();
  versioned_config();
  versioned_pool_ops();
  versioned_hooks();
  return ctest_summary();
}
