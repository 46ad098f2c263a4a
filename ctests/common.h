/* Shared helpers for the libskv C tests: check macros that count failures, and a fake
 * engine for external mode whose callbacks record every call so tests can compare exact
 * call sequences. Plain C99; every function is `static inline` so a test that does not
 * use one gets no unused-function warning. */
#ifndef SKV_CTESTS_COMMON_H
#define SKV_CTESTS_COMMON_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "skv.h"

/* ---------------------------------------------------------------- checks */

static int ctest_passed;
static int ctest_failed;

static inline int ctest_record(int ok, const char *file, int line, const char *expr) {
  if (ok) {
    ctest_passed++;
  } else {
    ctest_failed++;
    fprintf(stderr, "%s:%d: FAILED: %s\n", file, line, expr);
  }
  return ok;
}

/* Prints the closing "N passed, N failed" line; use as `return ctest_summary();`. */
static inline int ctest_summary(void) {
  printf("%d passed, %d failed\n", ctest_passed, ctest_failed);
  fflush(stdout);
  return ctest_failed == 0 ? 0 : 1;
}

#define CHECK(cond) ((void)ctest_record(!!(cond), __FILE__, __LINE__, #cond))

#define CHECK_EQ_INT(a, b)                                                             \
  do {                                                                                 \
    long long ctest_a_ = (long long)(a), ctest_b_ = (long long)(b);                    \
    if (!ctest_record(ctest_a_ == ctest_b_, __FILE__, __LINE__, #a " == " #b))         \
      fprintf(stderr, "    left = %lld, right = %lld\n", ctest_a_, ctest_b_);          \
  } while (0)

#define CHECK_EQ_U64(a, b)                                                             \
  do {                                                                                 \
    unsigned long long ctest_a_ = (unsigned long long)(a);                             \
    unsigned long long ctest_b_ = (unsigned long long)(b);                             \
    if (!ctest_record(ctest_a_ == ctest_b_, __FILE__, __LINE__, #a " == " #b))         \
      fprintf(stderr, "    left = %llu, right = %llu\n", ctest_a_, ctest_b_);          \
  } while (0)

#define CHECK_STR_CONTAINS(hay, needle)                                                \
  do {                                                                                 \
    const char *ctest_h_ = (hay), *ctest_n_ = (needle);                                \
    if (!ctest_record(ctest_h_ != NULL && strstr(ctest_h_, ctest_n_) != NULL,          \
                      __FILE__, __LINE__, #hay " contains " #needle))                  \
      fprintf(stderr, "    \"%s\" lacks \"%s\"\n", ctest_h_ ? ctest_h_ : "(null)",     \
              ctest_n_);                                                               \
  } while (0)

static inline const char *ctest_status_name(int s) {
  const char *str = skv_status_str((skv_status)s);
  return str ? str : "(null)";
}

/* The last error text, copied right after the call CHECK_STATUS checked (a later library
 * call may replace the library's own copy). */
static char ctest_msg[1024];

static inline void ctest_save_msg(void) {
  const char *m = skv_last_error();
  if (m == NULL) {
    strcpy(ctest_msg, "(null)");
  } else {
    strncpy(ctest_msg, m, sizeof ctest_msg - 1);
    ctest_msg[sizeof ctest_msg - 1] = '\0';
  }
}

/* Checks the status of `call` and the last-error contract: "" after SKV_OK, a non-empty
 * message after an error. Evaluates `call` once; the message stays in ctest_msg. */
#define CHECK_STATUS(call, expected)                                                   \
  do {                                                                                 \
    int ctest_got_ = (int)(call), ctest_want_ = (int)(expected);                       \
    int ctest_null_ = skv_last_error() == NULL;                                        \
    ctest_save_msg();                                                                  \
    if (!ctest_record(ctest_got_ == ctest_want_, __FILE__, __LINE__,                   \
                      #call " == " #expected))                                         \
      fprintf(stderr, "    got %d (%s), want %d (%s); last error: \"%s\"\n",           \
              ctest_got_, ctest_status_name(ctest_got_), ctest_want_,                  \
              ctest_status_name(ctest_want_), ctest_msg);                              \
    if (ctest_want_ == SKV_OK) {                                                       \
      if (!ctest_record(!ctest_null_ && ctest_msg[0] == '\0', __FILE__, __LINE__,      \
                        "skv_last_error() == \"\" after " #call))                      \
        fprintf(stderr, "    last error: \"%s\"\n", ctest_msg);                         \
    } else {                                                                           \
      ctest_record(!ctest_null_ && ctest_msg[0] != '\0', __FILE__, __LINE__,           \
                   "skv_last_error() non-empty after " #call);                         \
    }                                                                                  \
  } while (0)

/* The message of the last CHECK_STATUS mentions `needle` (a function or callback name). */
#define CHECK_MSG_HAS(needle) CHECK_STR_CONTAINS(ctest_msg, (needle))

#define CHECK_OK(call) CHECK_STATUS(call, SKV_OK)

/* Two skv_req compare field by field: "unchanged" means no field written. (Not memcmp: the
 * struct has padding bytes after finished_len and swa_evict_floor, which a struct copy need
 * not carry.) */
static inline int req_same(const skv_req *a, const skv_req *b) {
  return a->req_pool_idx == b->req_pool_idx && a->row_generation == b->row_generation &&
         a->kv_committed_len == b->kv_committed_len &&
         a->kv_allocated_len == b->kv_allocated_len &&
         a->cache_protected_len == b->cache_protected_len &&
         a->swa_evicted_seqlen == b->swa_evicted_seqlen &&
         a->origin_input_len == b->origin_input_len && a->output_len == b->output_len &&
         a->finished_len == b->finished_len && a->lock_node == b->lock_node &&
         a->lock_receipt == b->lock_receipt && a->aux_state == b->aux_state &&
         a->aux_track[0] == b->aux_track[0] && a->aux_track[1] == b->aux_track[1] &&
         a->swa_evict_floor == b->swa_evict_floor;
}
#define CHECK_REQ_SAME(a, b) CHECK(req_same((a), (b)))

/* A req with every field set, for tests that fill in only what they care about. */
static inline skv_req req_make(int32_t row, uint32_t committed, uint32_t allocated) {
  skv_req r;
  memset(&r, 0, sizeof r);
  r.req_pool_idx = row;
  r.kv_committed_len = committed;
  r.kv_allocated_len = allocated;
  r.finished_len = -1;
  r.aux_state = -1;
  r.aux_track[0] = r.aux_track[1] = -1;
  return r;
}

/* The req shape cache_finished_req leaves behind. */
static inline int req_is_empty(const skv_req *r) {
  return r->req_pool_idx == -1 && r->kv_committed_len == 0 && r->kv_allocated_len == 0 &&
         r->cache_protected_len == 0 && r->swa_evicted_seqlen == 0 && r->lock_node == 0 &&
         r->lock_receipt == 0 && r->aux_state == -1 && r->aux_track[0] == -1 &&
         r->aux_track[1] == -1 && r->swa_evict_floor == 0;
}

/* ----------------------------------------------------------- fake engine */

enum fe_kind { FE_READ_ROW = 0, FE_FREE_KV, FE_FREE_ROW, FE_DEC_LOCK, FE_FREE_AUX, FE_KINDS };

static inline const char *fe_kind_name(int k) {
  static const char *const names[FE_KINDS] = {"read_row", "free_kv", "free_row",
                                              "dec_lock_ref", "free_aux"};
  return k >= 0 && k < FE_KINDS ? names[k] : "?";
}

/* One recorded callback invocation. */
typedef struct fe_call {
  int kind;
  int rc;                 /* what the callback returned */
  int32_t row;            /* read_row, free_row */
  uint32_t start, end;    /* read_row */
  int32_t *indices;       /* free_kv: a copy, in the order given */
  size_t n;               /* free_kv */
  uint64_t lock_node, lock_receipt;
  int64_t aux;
} fe_call;

typedef struct fake_engine {
  int32_t rows;
  uint32_t cols;
  int32_t *table;         /* rows x cols req_to_token; row r position p = r*cols+p */
  int32_t next_index;     /* fe_alloc hands out fresh indices from here */
  fe_call *calls;
  size_t n_calls, cap_calls;
  unsigned long count[FE_KINDS];    /* calls of each kind since the last reset */
  unsigned long fail_on[FE_KINDS];  /* the Nth call (1-based) of a kind returns -1; 0 never */
  int fail_all[FE_KINDS];           /* every call of a kind returns -1 */
  int bad_args;                     /* a callback saw arguments outside the table */
  /* optional lock around the recorder, for tests that call from several threads */
  void (*lock)(void *);
  void (*unlock)(void *);
  void *lock_arg;
} fake_engine;

static inline void fe_init(fake_engine *fe, int32_t rows, uint32_t cols) {
  size_t i, n = (size_t)rows * cols;
  memset(fe, 0, sizeof *fe);
  fe->rows = rows;
  fe->cols = cols;
  fe->table = (int32_t *)malloc(n * sizeof(int32_t));
  for (i = 0; i < n; i++) fe->table[i] = (int32_t)i;
  fe->next_index = (int32_t)n;
}

/* Forgets the recorded calls and call counts; failure switches stay. */
static inline void fe_reset_calls(fake_engine *fe) {
  size_t i;
  for (i = 0; i < fe->n_calls; i++) free(fe->calls[i].indices);
  fe->n_calls = 0;
  memset(fe->count, 0, sizeof fe->count);
}

static inline void fe_clear_failures(fake_engine *fe) {
  memset(fe->fail_on, 0, sizeof fe->fail_on);
  memset(fe->fail_all, 0, sizeof fe->fail_all);
}

static inline void fe_free(fake_engine *fe) {
  fe_reset_calls(fe);
  free(fe->calls);
  free(fe->table);
  memset(fe, 0, sizeof *fe);
}

/* Maps positions [from, to) of a row to fresh indices never used before, as an engine's
 * allocator would, so a test can tell every index apart across turns. */
static inline void fe_alloc(fake_engine *fe, int32_t row, uint32_t from, uint32_t to) {
  uint32_t p;
  for (p = from; p < to; p++) fe->table[(size_t)row * fe->cols + p] = fe->next_index++;
}

static inline int32_t fe_at(const fake_engine *fe, int32_t row, uint32_t pos) {
  return fe->table[(size_t)row * fe->cols + pos];
}

/* Records a call (under the lock) and decides its return value. */
static inline int fe_record(fake_engine *fe, fe_call *c) {
  unsigned long nth;
  if (fe->lock) fe->lock(fe->lock_arg);
  nth = ++fe->count[c->kind];
  c->rc = (fe->fail_all[c->kind] || fe->fail_on[c->kind] == nth) ? -1 : 0;
  if (fe->n_calls == fe->cap_calls) {
    fe->cap_calls = fe->cap_calls ? fe->cap_calls * 2 : 64;
    fe->calls = (fe_call *)realloc(fe->calls, fe->cap_calls * sizeof(fe_call));
  }
  fe->calls[fe->n_calls++] = *c;
  if (fe->unlock) fe->unlock(fe->lock_arg);
  return c->rc;
}

static inline int fe_cb_read_row(void *ud, int32_t row, uint32_t start, uint32_t end,
                                 int32_t *out) {
  fake_engine *fe = (fake_engine *)ud;
  fe_call c;
  int rc;
  memset(&c, 0, sizeof c);
  c.kind = FE_READ_ROW;
  c.row = row;
  c.start = start;
  c.end = end;
  rc = fe_record(fe, &c);
  if (row < 0 || row >= fe->rows || start > end || end > fe->cols || out == NULL) {
    fe->bad_args++;
    return -1;
  }
  /* a failing read leaves `out` untouched: the library must not use it */
  if (rc == 0 && end > start)
    memcpy(out, fe->table + (size_t)row * fe->cols + start, (end - start) * sizeof(int32_t));
  return rc;
}

static inline int fe_cb_free_kv(void *ud, const int32_t *indices, size_t n) {
  fake_engine *fe = (fake_engine *)ud;
  fe_call c;
  memset(&c, 0, sizeof c);
  c.kind = FE_FREE_KV;
  c.n = n;
  if (n > 0) {
    if (indices == NULL) {
      fe->bad_args++;
    } else {
      c.indices = (int32_t *)malloc(n * sizeof(int32_t));
      memcpy(c.indices, indices, n * sizeof(int32_t));
    }
  }
  return fe_record(fe, &c);
}

static inline int fe_cb_free_row(void *ud, int32_t row) {
  fake_engine *fe = (fake_engine *)ud;
  fe_call c;
  memset(&c, 0, sizeof c);
  c.kind = FE_FREE_ROW;
  c.row = row;
  if (row < 0 || row >= fe->rows) fe->bad_args++;
  return fe_record(fe, &c);
}

static inline int fe_cb_dec_lock(void *ud, uint64_t node, uint64_t receipt) {
  fake_engine *fe = (fake_engine *)ud;
  fe_call c;
  memset(&c, 0, sizeof c);
  c.kind = FE_DEC_LOCK;
  c.lock_node = node;
  c.lock_receipt = receipt;
  return fe_record(fe, &c);
}

static inline int fe_cb_free_aux(void *ud, int64_t aux) {
  fake_engine *fe = (fake_engine *)ud;
  fe_call c;
  memset(&c, 0, sizeof c);
  c.kind = FE_FREE_AUX;
  c.aux = aux;
  return fe_record(fe, &c);
}

/* Every callback set; a test clears the optional ones it wants absent. */
static inline skv_pool_ops fe_ops(void) {
  skv_pool_ops ops;
  memset(&ops, 0, sizeof ops);
  ops.struct_size = (uint32_t)sizeof(skv_pool_ops);
  ops.read_row = fe_cb_read_row;
  ops.free_kv = fe_cb_free_kv;
  ops.free_row = fe_cb_free_row;
  ops.dec_lock_ref = fe_cb_dec_lock;
  ops.free_aux = fe_cb_free_aux;
  return ops;
}

static inline skv_cache_config fe_config(const fake_engine *fe, uint32_t page_size,
                                         uint32_t flags) {
  skv_cache_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.struct_size = (uint32_t)sizeof(skv_cache_config);
  cfg.page_size = page_size;
  cfg.num_rows = (uint32_t)fe->rows;
  cfg.max_context_len = fe->cols;
  cfg.flags = flags;
  return cfg;
}

/* An external-mode cache over the fake engine (rows and max_context_len from its table),
 * its ops struct_size as given; NULL on failure, after counting a failed check. */
static inline skv_cache *fe_cache_sized(fake_engine *fe, uint32_t page_size, uint32_t flags,
                                        uint32_t ops_size) {
  skv_cache_config cfg = fe_config(fe, page_size, flags);
  skv_pool_ops ops = fe_ops();
  skv_cache *c = NULL;
  ops.struct_size = ops_size;
  skv_status s = skv_cache_new_external(&cfg, &ops, fe, &c);
  ctest_record(s == SKV_OK && c != NULL, __FILE__, __LINE__, "fe_cache: skv_cache_new_external");
  if (s != SKV_OK) fprintf(stderr, "    status %d: %s\n", (int)s, skv_last_error());
  return s == SKV_OK ? c : NULL;
}

/* fe_cache_sized at this header's sizeof(skv_pool_ops). */
static inline skv_cache *fe_cache(fake_engine *fe, uint32_t page_size, uint32_t flags) {
  return fe_cache_sized(fe, page_size, flags, (uint32_t)sizeof(skv_pool_ops));
}

/* An ABI 2 caller's cache (ops struct_size 48, no free_kv_segment): free_kv takes every free
 * whole, below the sliding-window cursor too. */
static inline skv_cache *fe_cache_abi2(fake_engine *fe, uint32_t page_size, uint32_t flags) {
  return fe_cache_sized(fe, page_size, flags, 48);
}

/* ------------------------------------------------- expected call sequences */

/* One expected free-side callback: free_kv of the indices [a, b) in order, free_row(a),
 * dec_lock_ref(a, b) or free_aux(a). */
typedef struct fe_expect {
  int kind;
  int64_t a, b;
} fe_expect;

#define FE_KV(lo, hi) {FE_FREE_KV, (lo), (hi)}
#define FE_ROW(r) {FE_FREE_ROW, (r), 0}
#define FE_LOCK(node, receipt) {FE_DEC_LOCK, (int64_t)(node), (int64_t)(receipt)}
#define FE_AUX(aux) {FE_FREE_AUX, (aux), 0}

static inline void fe_print_call(const fe_call *c) {
  fprintf(stderr, "      %s", fe_kind_name(c->kind));
  switch (c->kind) {
  case FE_READ_ROW:
    fprintf(stderr, "(row %d, [%u, %u))", (int)c->row, (unsigned)c->start, (unsigned)c->end);
    break;
  case FE_FREE_KV:
    if (c->n > 0 && c->indices)
      fprintf(stderr, "(%lu indices: %d .. %d)", (unsigned long)c->n, (int)c->indices[0],
              (int)c->indices[c->n - 1]);
    else
      fprintf(stderr, "(%lu indices)", (unsigned long)c->n);
    break;
  case FE_FREE_ROW: fprintf(stderr, "(%d)", (int)c->row); break;
  case FE_DEC_LOCK:
    fprintf(stderr, "(%llu, %llu)", (unsigned long long)c->lock_node,
            (unsigned long long)c->lock_receipt);
    break;
  case FE_FREE_AUX: fprintf(stderr, "(%lld)", (long long)c->aux); break;
  default: break;
  }
  fprintf(stderr, " -> %d\n", c->rc);
}

static inline void fe_dump(const fake_engine *fe) {
  size_t i;
  fprintf(stderr, "    recorded calls (%lu):\n", (unsigned long)fe->n_calls);
  for (i = 0; i < fe->n_calls; i++) fe_print_call(&fe->calls[i]);
}

static inline int fe_match_one(const fe_call *c, const fe_expect *e) {
  size_t k;
  if (c->kind != e->kind) return 0;
  switch (e->kind) {
  case FE_FREE_KV:
    if (e->b < e->a || c->n != (size_t)(e->b - e->a) || (c->n && !c->indices)) return 0;
    for (k = 0; k < c->n; k++)
      if (c->indices[k] != (int32_t)(e->a + (int64_t)k)) return 0;
    return 1;
  case FE_FREE_ROW: return c->row == (int32_t)e->a;
  case FE_DEC_LOCK:
    return c->lock_node == (uint64_t)e->a && c->lock_receipt == (uint64_t)e->b;
  case FE_FREE_AUX: return c->aux == e->a;
  default: return 0;
  }
}

/* Whether a free_kv call's indices are exactly what a read of row[start:end) returned. */
static inline int fe_read_matches(const fake_engine *fe, const fe_call *rd, const fe_call *kv) {
  size_t k;
  if (rd->rc != 0 || rd->end < rd->start || kv->n != (size_t)(rd->end - rd->start)) return 0;
  if (rd->row < 0 || rd->row >= fe->rows || rd->end > fe->cols || !kv->indices) return 0;
  for (k = 0; k < kv->n; k++)
    if (kv->indices[k] != fe_at(fe, rd->row, rd->start + (uint32_t)k)) return 0;
  return 1;
}

/* The exact free-side sequence of the calls recorded since the last reset, and the read
 * contract: every read precedes every free, and each free_kv is fed by exactly one read
 * (one read per freed range, none otherwise). */
static inline int fe_check_frees_at(const fake_engine *fe, const fe_expect *exp, size_t n_exp,
                                    const char *file, int line) {
  size_t i, j, n_free = 0, n_read = 0, first_free = fe->n_calls;
  int ok = 1;
  unsigned char *used = (unsigned char *)calloc(fe->n_calls + 1, 1);
  for (i = 0; i < fe->n_calls; i++) {
    const fe_call *c = &fe->calls[i];
    if (c->kind == FE_READ_ROW) {
      n_read++;
      if (i > first_free) ok = 0; /* a read after a free */
      continue;
    }
    if (first_free == fe->n_calls) first_free = i;
    if (n_free >= n_exp || !fe_match_one(c, &exp[n_free])) ok = 0;
    n_free++;
  }
  if (n_free != n_exp) ok = 0;
  /* pair reads with free_kv calls */
  {
    size_t n_kv = 0;
    for (i = 0; i < fe->n_calls; i++) {
      const fe_call *kv = &fe->calls[i];
      int found = 0;
      if (kv->kind != FE_FREE_KV) continue;
      n_kv++;
      for (j = 0; j < fe->n_calls && !found; j++) {
        if (!used[j] && fe->calls[j].kind == FE_READ_ROW &&
            fe_read_matches(fe, &fe->calls[j], kv)) {
          used[j] = 1;
          found = 1;
        }
      }
      if (!found) ok = 0;
    }
    if (n_kv != n_read) ok = 0;
  }
  free(used);
  if (fe->bad_args) ok = 0;
  if (!ctest_record(ok, file, line, "callback sequence matches")) {
    fprintf(stderr, "    expected (besides reads):\n");
    for (i = 0; i < n_exp; i++) {
      fe_call c;
      memset(&c, 0, sizeof c);
      c.kind = exp[i].kind;
      c.row = (int32_t)exp[i].a;
      c.lock_node = (uint64_t)exp[i].a;
      c.lock_receipt = (uint64_t)exp[i].b;
      c.aux = exp[i].a;
      if (exp[i].kind == FE_FREE_KV) {
        fprintf(stderr, "      free_kv([%lld, %lld))\n", (long long)exp[i].a,
                (long long)exp[i].b);
      } else {
        c.rc = 0;
        fe_print_call(&c);
      }
    }
    if (fe->bad_args) fprintf(stderr, "    callbacks saw %d bad argument(s)\n", fe->bad_args);
    fe_dump(fe);
  }
  return ok;
}

#define CHECK_FREES(fe, exp_array)                                                     \
  fe_check_frees_at((fe), (exp_array), sizeof(exp_array) / sizeof((exp_array)[0]),     \
                    __FILE__, __LINE__)
#define CHECK_NO_CALLS(fe)                                                             \
  do {                                                                                 \
    if (!ctest_record((fe)->n_calls == 0, __FILE__, __LINE__, "no callback ran"))      \
      fe_dump(fe);                                                                     \
  } while (0)

static inline size_t fe_count_kind(const fake_engine *fe, int kind) {
  size_t i, n = 0;
  for (i = 0; i < fe->n_calls; i++) n += fe->calls[i].kind == kind;
  return n;
}

/* no free-side callback ran (reads may have) */
#define CHECK_NO_FREES(fe)                                                             \
  do {                                                                                 \
    if (!ctest_record((fe)->n_calls == fe_count_kind((fe), FE_READ_ROW), __FILE__,     \
                      __LINE__, "no free callback ran"))                               \
      fe_dump(fe);                                                                     \
  } while (0)

/* Saves a session slot as a first turn that finished exactly at its allocation (no trim,
 * no callback): row, committed = allocated = len, the given protected prefix, lock and aux. */
static inline int fe_save_slot_at(skv_cache *c, fake_engine *fe, uint64_t sid, uint64_t bid,
                                  int32_t row, uint32_t protected_len, uint32_t len,
                                  uint64_t lock_node, uint64_t lock_receipt, int64_t aux,
                                  const char *file, int line) {
  skv_req r = req_make(row, len, len);
  size_t before = fe->n_calls;
  skv_status s;
  r.cache_protected_len = protected_len;
  r.origin_input_len = len;
  r.lock_node = lock_node;
  r.lock_receipt = lock_receipt;
  r.aux_state = aux;
  s = skv_cache_finished_req(c, sid, bid, &r, 0);
  if (!ctest_record(s == SKV_OK && fe->n_calls == before && req_is_empty(&r), file, line,
                    "fe_save_slot"))
    fprintf(stderr, "    status %d: %s\n", (int)s, skv_last_error());
  return s == SKV_OK;
}
#define fe_save_slot(c, fe, sid, bid, row, prot, len, node, receipt, aux)                  \
  fe_save_slot_at((c), (fe), (sid), (bid), (row), (prot), (len), (node), (receipt), (aux),  \
                  __FILE__, __LINE__)

/* The held totals, or all-ones when the call fails (so comparisons fail loudly). */
static inline skv_held held_of(skv_cache *c, const int32_t *active, size_t n) {
  skv_held h;
  if (skv_session_held(c, active, n, &h) != SKV_OK) memset(&h, 0xff, sizeof h);
  return h;
}

#define CHECK_HELD(h, full, swa, rows_, aux_, sessions_)                                  \
  do {                                                                                 \
    skv_held ctest_h_ = (h);                                                           \
    CHECK_EQ_U64(ctest_h_.full_tokens, (full));                                        \
    CHECK_EQ_U64(ctest_h_.swa_tokens, (swa));                                          \
    CHECK_EQ_U64(ctest_h_.rows, (rows_));                                              \
    CHECK_EQ_U64(ctest_h_.aux_states, (aux_));                                         \
    CHECK_EQ_U64(ctest_h_.sessions, (sessions_));                                      \
  } while (0)

#endif
