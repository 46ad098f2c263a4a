/* Owned mode through the C ABI: libskv's own paged pool and req_to_token rows. Every
 * owned-pool function, its error paths (status, last-error text naming the function, and
 * nothing observable changed), a full streaming session over owned pools, the rule that a
 * session owns its row, prefix sharing with an engine's tree, the hooks, FlashInfer's
 * page table, determinism across two caches, and the owned-only functions refused on an
 * external handle. `skv_cache_check` runs after every step of every scenario. */
#include "common.h"

#define OT_MAX_ROWS 8
#define OT_MAX_PAGES 64
#define OT_SENTINEL 0x5A5A5A5A

/* ------------------------------------------------------------- helpers */

static skv_cache_config ot_cfg(uint32_t ps, uint32_t pages, uint32_t rows, uint32_t max_ctx,
                               uint32_t flags) {
  skv_cache_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.struct_size = (uint32_t)sizeof cfg;
  cfg.page_size = ps;
  cfg.num_token_slots = (uint64_t)pages * ps;
  cfg.num_rows = rows;
  cfg.max_context_len = max_ctx;
  cfg.flags = flags;
  return cfg;
}

static skv_cache *ot_new(uint32_t ps, uint32_t pages, uint32_t rows, uint32_t max_ctx,
                         uint32_t flags) {
  skv_cache_config cfg = ot_cfg(ps, pages, rows, max_ctx, flags);
  skv_cache *c = NULL;
  CHECK_OK(skv_cache_new(&cfg, &c));
  CHECK(c != NULL);
  return c;
}

/* A req as skv_req_init leaves it, from garbage bytes. */
static skv_req ot_req(void) {
  skv_req r;
  memset(&r, 0xA5, sizeof r);
  CHECK_OK(skv_req_init(&r));
  return r;
}

static skv_req ot_row(skv_cache *c) {
  skv_req r = ot_req();
  CHECK_OK(skv_alloc_row(c, &r));
  return r;
}

static skv_stats ot_stats(skv_cache *c) {
  skv_stats s;
  memset(&s, 0, sizeof s);
  CHECK_OK(skv_cache_stats(c, &s));
  return s;
}

static void ot_fill(int32_t *a, size_t n) {
  size_t i;
  for (i = 0; i < n; i++) a[i] = OT_SENTINEL;
}

static int ot_all_sentinel(const int32_t *a, size_t n) {
  size_t i;
  for (i = 0; i < n; i++)
    if (a[i] != OT_SENTINEL) return 0;
  return 1;
}

/* The last call's message, saved before the snapshot calls replace it. */
static char ot_msg[512];
static void ot_save_msg(void) {
  strncpy(ot_msg, skv_last_error(), sizeof ot_msg - 1);
  ot_msg[sizeof ot_msg - 1] = '\0';
}

/* Whether `v` appears in `msg` as a whole number (not inside a longer one). */
static int ot_has_number(const char *msg, unsigned long v) {
  const char *p = msg;
  while (p && *p) {
    if (*p >= '0' && *p <= '9') {
      unsigned long x = 0;
      while (*p >= '0' && *p <= '9') x = x * 10 + (unsigned long)(*p++ - '0');
      if (x == v) return 1;
    } else {
      p++;
    }
  }
  return 0;
}
/* The refused call's message (saved by OT_REFUSED) names the number v. */
#define CHECK_MSG_NUMBER(v)                                                            \
  do {                                                                                 \
    if (!ctest_record(ot_has_number(ot_msg, (v)), __FILE__, __LINE__,                  \
                      "last error names " #v))                                         \
      fprintf(stderr, "    \"%s\" lacks %lu\n", ot_msg, (unsigned long)(v));          \
  } while (0)

/* The audit is clean and agrees with the stats. */
static skv_check_report ot_audit_at(skv_cache *c, const char *file, int line) {
  skv_check_report r;
  skv_stats s;
  int ok;
  memset(&r, 0, sizeof r);
  memset(&s, 0, sizeof s);
  ok = skv_cache_check(c, &r) == SKV_OK && r.violations == 0;
  if (!ctest_record(ok, file, line, "skv_cache_check: no violation"))
    fprintf(stderr, "    %llu violation(s), first: %.255s; last error: %s\n",
            (unsigned long long)r.violations, r.first_violation, skv_last_error());
  ok = skv_cache_stats(c, &s) == SKV_OK && r.pages_free == s.free_pages &&
       r.pages_free + r.pages_in_rows + r.pages_engine_held == s.total_pages - 1 &&
       s.used_pages == s.total_pages - 1 - s.free_pages;
  if (!ctest_record(ok, file, line, "audit counts agree with stats"))
    fprintf(stderr,
            "    check free %llu rows %llu held %llu; stats total %llu free %llu used %llu\n",
            (unsigned long long)r.pages_free, (unsigned long long)r.pages_in_rows,
            (unsigned long long)r.pages_engine_held, (unsigned long long)s.total_pages,
            (unsigned long long)s.free_pages, (unsigned long long)s.used_pages);
  return r;
}
#define OT_AUDIT(c) ((void)ot_audit_at((c), __FILE__, __LINE__))

/* Page counts by state, after a clean audit. */
#define CHECK_PAGES(c, free_, in_rows_, held_)                                         \
  do {                                                                                 \
    skv_check_report ot_r_ = ot_audit_at((c), __FILE__, __LINE__);                     \
    CHECK_EQ_U64(ot_r_.pages_free, (free_));                                           \
    CHECK_EQ_U64(ot_r_.pages_in_rows, (in_rows_));                                     \
    CHECK_EQ_U64(ot_r_.pages_engine_held, (held_));                                    \
  } while (0)

static void ot_indices_at(skv_cache *c, int32_t row, uint32_t start, uint32_t end, int32_t *out,
                          const char *file, int line) {
  skv_status s = skv_row_indices(c, row, start, end, out);
  if (!ctest_record(s == SKV_OK, file, line, "skv_row_indices"))
    fprintf(stderr, "    row %d [%u, %u): %s\n", (int)row, (unsigned)start, (unsigned)end,
            skv_last_error());
}
#define OT_INDICES(c, row, start, end, out)                                            \
  ot_indices_at((c), (row), (start), (end), (out), __FILE__, __LINE__)

/* Indices of positions [0, n) are page-structured over pages 1..total-1: row[p] =
 * page[p/ps]*ps + p%ps. */
static int ot_paged(const int32_t *idx, uint32_t n, uint32_t ps, uint32_t total_pages) {
  uint32_t p;
  for (p = 0; p < n; p++) {
    int32_t page = idx[p - p % ps] / (int32_t)ps;
    if (idx[p] < 0 || page < 1 || (uint32_t)page >= total_pages) return 0;
    if (idx[p] != page * (int32_t)ps + (int32_t)(p % ps)) return 0;
  }
  return 1;
}

/* Everything a caller can observe of an owned cache: stats, audit, session totals, every
 * row's page table and every page's map count. */
typedef struct ot_row_snap {
  int status;
  int32_t indptr[2];
  int32_t last;
  int32_t pages[OT_MAX_PAGES];
  size_t needed;
} ot_row_snap;

typedef struct ot_snap {
  int stats_status, check_status, held_status;
  skv_stats stats;
  skv_check_report check;
  skv_held held;
  ot_row_snap rows[OT_MAX_ROWS];
  int refs_status[OT_MAX_PAGES];
  uint32_t refs[OT_MAX_PAGES];
} ot_snap;

static void ot_take(skv_cache *c, uint32_t ps, ot_snap *s) {
  uint32_t i;
  memset(s, 0, sizeof *s);
  s->stats_status = (int)skv_cache_stats(c, &s->stats);
  s->check_status = (int)skv_cache_check(c, &s->check);
  s->held_status = (int)skv_session_held(c, NULL, 0, &s->held);
  for (i = 0; i < s->stats.total_rows && i < OT_MAX_ROWS; i++) {
    int32_t row = (int32_t)i;
    ot_row_snap *r = &s->rows[i];
    r->status = (int)skv_build_flashinfer(c, &row, 1, r->indptr, r->pages, &r->last,
                                          OT_MAX_PAGES, &r->needed);
  }
  for (i = 1; i < s->stats.total_pages && i < OT_MAX_PAGES; i++) {
    int32_t idx = (int32_t)(i * ps);
    s->refs_status[i] = (int)skv_page_refs(c, &idx, 1, &s->refs[i]);
  }
}

static int ot_same_at(const ot_snap *a, const ot_snap *b, const char *file, int line) {
  int ok = 1;
#define OT_PART(f)                                                                     \
  if (memcmp(&a->f, &b->f, sizeof a->f) != 0) {                                        \
    fprintf(stderr, "%s:%d:     changed: %s\n", file, line, #f);                       \
    ok = 0;                                                                            \
  }
  OT_PART(stats_status) OT_PART(check_status) OT_PART(held_status) OT_PART(stats)
  OT_PART(check) OT_PART(held) OT_PART(rows) OT_PART(refs_status) OT_PART(refs)
#undef OT_PART
  return ctest_record(ok, file, line, "nothing observable changed");
}

/* A refused call: its status, a last error naming the function, the req's bytes and every
 * observable part of the cache unchanged. */
#define OT_REFUSED(c, ps, req, call, want, fname)                                      \
  do {                                                                                 \
    ot_snap ot_b_, ot_a_;                                                              \
    skv_req ot_rb_;                                                                    \
    const skv_req *ot_rp_ = (req);                                                     \
    memset(&ot_rb_, 0, sizeof ot_rb_);                                                 \
    if (ot_rp_) ot_rb_ = *ot_rp_;                                                      \
    ot_take((c), (ps), &ot_b_);                                                        \
    CHECK_STATUS(call, want);                                                          \
    CHECK_STR_CONTAINS(skv_last_error(), fname);                                       \
    ot_save_msg();                                                                     \
    ot_take((c), (ps), &ot_a_);                                                        \
    ot_same_at(&ot_b_, &ot_a_, __FILE__, __LINE__);                                    \
    if (ot_rp_) CHECK_REQ_SAME(&ot_rb_, ot_rp_);                                       \
  } while (0)


/* ------------------------------------------------------ skv_cache_new */

static void test_cache_new(void) {
  skv_cache_config cfg, bad;
  skv_cache *sentinel = (skv_cache *)&cfg; /* any non-NULL value the call must not touch */
  skv_cache *c = sentinel;
  skv_stats s;
  skv_check_report r;

  /* an empty cache: page 0 is neither free nor used */
  cfg = ot_cfg(4, 16, 3, 64, 0);
  CHECK_OK(skv_cache_new(&cfg, &c));
  CHECK(c != NULL && c != sentinel);
  s = ot_stats(c);
  CHECK_EQ_U64(s.total_pages, 16);
  CHECK_EQ_U64(s.free_pages, 15);
  CHECK_EQ_U64(s.used_pages, 0);
  CHECK_EQ_U64(s.total_rows, 3);
  CHECK_EQ_U64(s.free_rows, 3);
  CHECK_EQ_U64(s.sessions, 0);
  CHECK_EQ_U64(s.trimmed_tokens, 0);
  CHECK_EQ_U64(s.tail_freed_tokens, 0);
  memset(&r, 0xEE, sizeof r);
  CHECK_OK(skv_cache_check(c, &r));
  CHECK_EQ_U64(r.violations, 0);
  CHECK_EQ_U64(r.pages_free, 15);
  CHECK_EQ_U64(r.pages_in_rows, 0);
  CHECK_EQ_U64(r.pages_engine_held, 0);
  skv_cache_free(c);

  /* page_size 1: every token slot but slot 0 is a free page */
  cfg = ot_cfg(1, 10, 1, 8, 0);
  c = NULL;
  CHECK_OK(skv_cache_new(&cfg, &c));
  s = ot_stats(c);
  CHECK_EQ_U64(s.total_pages, 10);
  CHECK_EQ_U64(s.free_pages, 9);
  skv_cache_free(c);
  skv_cache_free(NULL);

  /* the smallest pool: page 0 and one page */
  cfg = ot_cfg(16, 2, 1, 16, SKV_FLAG_ALIGNED_REUSE);
  c = NULL;
  CHECK_OK(skv_cache_new(&cfg, &c));
  CHECK_EQ_U64(ot_stats(c).free_pages, 1);
  skv_cache_free(c);

#define OT_BAD_CFG(mutate, want)                                                       \
  do {                                                                                 \
    bad = ot_cfg(4, 16, 3, 64, 0);                                                     \
    mutate;                                                                            \
    c = sentinel;                                                                      \
    CHECK_STATUS(skv_cache_new(&bad, &c), want);                                       \
    CHECK_STR_CONTAINS(skv_last_error(), "skv_cache_new");                             \
    CHECK(c == sentinel);                                                              \
  } while (0)
  bad = ot_cfg(4, 16, 3, 64, 0); /* the baseline the mutations break */
  c = NULL;
  CHECK_OK(skv_cache_new(&bad, &c));
  skv_cache_free(c);
  OT_BAD_CFG(bad.page_size = 0, SKV_ERR_INVALID_ARG);
  OT_BAD_CFG(bad.num_token_slots = 30, SKV_ERR_INVALID_ARG);   /* not whole pages */
  OT_BAD_CFG(bad.num_token_slots = 4, SKV_ERR_INVALID_ARG);    /* page 0 only */
  OT_BAD_CFG(bad.num_token_slots = 0, SKV_ERR_INVALID_ARG);
  OT_BAD_CFG(bad.num_token_slots = 7, SKV_ERR_INVALID_ARG);    /* < 2 pages, ragged */
  OT_BAD_CFG(bad.num_rows = 0, SKV_ERR_INVALID_ARG);
  OT_BAD_CFG(bad.max_context_len = 0, SKV_ERR_INVALID_ARG);
  OT_BAD_CFG(bad.struct_size = 0, SKV_ERR_INVALID_ARG);
  OT_BAD_CFG(bad.struct_size = (uint32_t)sizeof(skv_cache_config) - 1, SKV_ERR_INVALID_ARG);
  OT_BAD_CFG(bad.num_token_slots = (uint64_t)1 << 40, SKV_ERR_INVALID_ARG); /* int32 indices */
#undef OT_BAD_CFG

  c = sentinel;
  CHECK_STATUS(skv_cache_new(NULL, &c), SKV_ERR_NULL_ARG);
  CHECK_STR_CONTAINS(skv_last_error(), "skv_cache_new");
  CHECK(c == sentinel);
  cfg = ot_cfg(4, 16, 3, 64, 0);
  CHECK_STATUS(skv_cache_new(&cfg, NULL), SKV_ERR_NULL_ARG);
  CHECK_STR_CONTAINS(skv_last_error(), "skv_cache_new");
  /* NULL wins over a bad config */
  cfg.page_size = 0;
  CHECK_STATUS(skv_cache_new(&cfg, NULL), SKV_ERR_NULL_ARG);
}

/* ------------------------------------------------------- skv_req_init */

static void test_req_init(void) {
  skv_req r;
  memset(&r, 0x5C, sizeof r);
  CHECK_OK(skv_req_init(&r));
  CHECK_EQ_INT(r.req_pool_idx, -1);
  CHECK_EQ_INT(r.kv_committed_len, 0);
  CHECK_EQ_INT(r.kv_allocated_len, 0);
  CHECK_EQ_INT(r.cache_protected_len, 0);
  CHECK_EQ_INT(r.swa_evicted_seqlen, 0);
  CHECK_EQ_INT(r.origin_input_len, 0);
  CHECK_EQ_INT(r.output_len, 0);
  CHECK_EQ_INT(r.finished_len, -1);
  CHECK_EQ_U64(r.lock_node, 0);
  CHECK_EQ_U64(r.lock_receipt, 0);
  CHECK_EQ_INT(r.aux_state, -1);
  CHECK(req_is_empty(&r));
  CHECK_STATUS(skv_req_init(NULL), SKV_ERR_NULL_ARG);
  CHECK_STR_CONTAINS(skv_last_error(), "skv_req_init");
}

/* ------------------------------------------------------ skv_alloc_row */

static void test_alloc_row(void) {
  const uint32_t ps = 4;
  skv_cache *c = ot_new(ps, 8, 2, 32, 0);
  skv_req a, b, x, bad;
  if (!c) return;

  a = ot_row(c);
  CHECK(a.req_pool_idx >= 0 && a.req_pool_idx < 2);
  CHECK_EQ_INT(a.kv_allocated_len, 0);
  CHECK_EQ_INT(a.kv_committed_len, 0);
  CHECK_EQ_INT(a.finished_len, -1);
  CHECK_EQ_INT(a.aux_state, -1);
  CHECK_EQ_U64(ot_stats(c).free_rows, 1);
  CHECK_EQ_U64(ot_stats(c).used_pages, 0); /* a row costs no page */
  OT_AUDIT(c);

  /* a req that already holds a row */
  OT_REFUSED(c, ps, &a, skv_alloc_row(c, &a), SKV_ERR_INVALID_ARG, "skv_alloc_row");

  b = ot_row(c);
  CHECK(b.req_pool_idx >= 0 && b.req_pool_idx < 2 && b.req_pool_idx != a.req_pool_idx);
  CHECK_EQ_U64(ot_stats(c).free_rows, 0);

  /* every row taken */
  x = ot_req();
  OT_REFUSED(c, ps, &x, skv_alloc_row(c, &x), SKV_ERR_OUT_OF_MEMORY, "skv_alloc_row");

  /* a req with inconsistent fields is refused before any row is looked at */
  bad = ot_req();
  bad.kv_committed_len = 3;
  OT_REFUSED(c, ps, &bad, skv_alloc_row(c, &bad), SKV_ERR_INVALID_ARG, "skv_alloc_row");
  bad = ot_req();
  bad.req_pool_idx = 2; /* out of range */
  OT_REFUSED(c, ps, &bad, skv_alloc_row(c, &bad), SKV_ERR_INVALID_ARG, "skv_alloc_row");

  /* a returned row can be taken again */
  CHECK_OK(skv_free_req(c, &a));
  CHECK_EQ_U64(ot_stats(c).free_rows, 1);
  CHECK_OK(skv_alloc_row(c, &x));
  CHECK(x.req_pool_idx >= 0 && x.req_pool_idx < 2 && x.req_pool_idx != b.req_pool_idx);
  OT_AUDIT(c);

  OT_REFUSED(c, ps, NULL, skv_alloc_row(NULL, &a), SKV_ERR_NULL_ARG, "skv_alloc_row");
  OT_REFUSED(c, ps, NULL, skv_alloc_row(c, NULL), SKV_ERR_NULL_ARG, "skv_alloc_row");

  CHECK_OK(skv_free_req(c, &b));
  CHECK_OK(skv_free_req(c, &x));
  CHECK_EQ_U64(ot_stats(c).free_rows, 2);
  CHECK_PAGES(c, 7, 0, 0);
  skv_cache_free(c);
}

/* --------------------------------------------------- skv_alloc_extend */

static void test_alloc_extend(void) {
  const uint32_t ps = 4;
  skv_cache *c = ot_new(ps, 8, 3, 32, 0); /* 7 usable pages */
  skv_req a, b, saved, none, stale;
  int32_t idx[32], idx2[32];
  if (!c) return;

  a = ot_row(c);
  CHECK_OK(skv_alloc_extend(c, &a, 3, NULL));
  CHECK_EQ_INT(a.kv_allocated_len, 3);
  CHECK_EQ_INT(a.kv_committed_len, 0);
  OT_INDICES(c, a.req_pool_idx, 0, 3, idx);
  CHECK(ot_paged(idx, 3, ps, 8));
  CHECK_PAGES(c, 6, 1, 0);

  /* the partial last page is filled before a new page is taken */
  CHECK_OK(skv_alloc_extend(c, &a, 3, NULL));
  CHECK_EQ_INT(a.kv_allocated_len, 6);
  OT_INDICES(c, a.req_pool_idx, 0, 6, idx2);
  CHECK(memcmp(idx, idx2, 3 * sizeof(int32_t)) == 0); /* earlier positions never move */
  CHECK_EQ_INT(idx2[3], idx2[0] + 3);
  CHECK(idx2[4] / 4 != idx2[0] / 4);
  CHECK(ot_paged(idx2, 6, ps, 8));
  CHECK_PAGES(c, 5, 2, 0);

  /* zero tokens: nothing to do */
  OT_REFUSED(c, ps, &a, skv_alloc_extend(c, &a, 0, NULL), SKV_OK, "");

  CHECK_OK(skv_alloc_extend(c, &a, 10, NULL)); /* 2 in the partial page, then 2 whole pages */
  CHECK_EQ_INT(a.kv_allocated_len, 16);
  OT_INDICES(c, a.req_pool_idx, 0, 16, idx);
  CHECK(memcmp(idx, idx2, 6 * sizeof(int32_t)) == 0);
  CHECK(ot_paged(idx, 16, ps, 8));
  CHECK(idx[8] / 4 != idx[0] / 4 && idx[8] / 4 != idx[4] / 4);
  CHECK(idx[12] / 4 != idx[0] / 4 && idx[12] / 4 != idx[4] / 4 && idx[12] / 4 != idx[8] / 4);
  CHECK_PAGES(c, 3, 4, 0);

  /* 13 tokens need 4 pages, 3 are free: all or nothing */
  OT_REFUSED(c, ps, &a, skv_alloc_extend(c, &a, 13, NULL), SKV_ERR_OUT_OF_MEMORY, "skv_alloc_extend");

  /* a second row takes the last pages; its partial page still grows with none free */
  b = ot_row(c);
  CHECK_OK(skv_alloc_extend(c, &b, 10, NULL));
  CHECK_PAGES(c, 0, 7, 0);
  OT_REFUSED(c, ps, &b, skv_alloc_extend(c, &b, 3, NULL), SKV_ERR_OUT_OF_MEMORY, "skv_alloc_extend");
  CHECK_OK(skv_alloc_extend(c, &b, 2, NULL));
  CHECK_EQ_INT(b.kv_allocated_len, 12);
  CHECK_PAGES(c, 0, 7, 0);
  OT_REFUSED(c, ps, &b, skv_alloc_extend(c, &b, 1, NULL), SKV_ERR_OUT_OF_MEMORY, "skv_alloc_extend");
  OT_INDICES(c, b.req_pool_idx, 0, 12, idx2);
  CHECK(ot_paged(idx2, 12, ps, 8));
  {
    /* no page in both rows */
    int k, j, shared = 0;
    for (k = 0; k < 16; k += 4)
      for (j = 0; j < 12; j += 4) shared += idx[k] / 4 == idx2[j] / 4;
    CHECK_EQ_INT(shared, 0);
  }

  /* past max_context_len is a bad argument, even when memory is also short */
  OT_REFUSED(c, ps, &a, skv_alloc_extend(c, &a, 17, NULL), SKV_ERR_INVALID_ARG, "skv_alloc_extend");
  CHECK_MSG_NUMBER(32);
  OT_REFUSED(c, ps, &a, skv_alloc_extend(c, &a, UINT32_MAX, NULL), SKV_ERR_INVALID_ARG,
             "skv_alloc_extend");

  /* a req holding no row, a row not in use, a req that breaks the field rules */
  none = ot_req();
  OT_REFUSED(c, ps, &none, skv_alloc_extend(c, &none, 1, NULL), SKV_ERR_INVALID_ARG, "skv_alloc_extend");
  stale = req_make(3 - a.req_pool_idx - b.req_pool_idx, 0, 0); /* the row nobody took */
  OT_REFUSED(c, ps, &stale, skv_alloc_extend(c, &stale, 1, NULL), SKV_ERR_NOT_FOUND, "skv_alloc_extend");
  saved = a;
  saved.kv_committed_len = 17; /* > allocated */
  OT_REFUSED(c, ps, &saved, skv_alloc_extend(c, &saved, 1, NULL), SKV_ERR_INVALID_ARG,
             "skv_alloc_extend");
  saved = a;
  saved.req_pool_idx = 3;
  OT_REFUSED(c, ps, &saved, skv_alloc_extend(c, &saved, 1, NULL), SKV_ERR_INVALID_ARG,
             "skv_alloc_extend");

  /* freed pages are reused */
  CHECK_OK(skv_free_req(c, &b));
  CHECK_PAGES(c, 3, 4, 0);
  CHECK_OK(skv_alloc_extend(c, &a, 12, NULL));
  CHECK_EQ_INT(a.kv_allocated_len, 28);
  OT_INDICES(c, a.req_pool_idx, 0, 28, idx);
  CHECK(ot_paged(idx, 28, ps, 8));
  CHECK_PAGES(c, 0, 7, 0);
  CHECK_OK(skv_free_req(c, &a));
  CHECK_PAGES(c, 7, 0, 0);
  skv_cache_free(c);
}

/* --------------------------------------------------------- skv_commit */

static void test_commit(void) {
  const uint32_t ps = 4;
  skv_cache *c = ot_new(ps, 8, 2, 32, 0);
  skv_req a, none;
  if (!c) return;
  a = ot_row(c);
  CHECK_OK(skv_alloc_extend(c, &a, 6, NULL));
  CHECK_OK(skv_commit(c, &a, 4));
  CHECK_EQ_INT(a.kv_committed_len, 4);
  CHECK_EQ_INT(a.kv_allocated_len, 6);
  CHECK_OK(skv_commit(c, &a, 0));
  CHECK_EQ_INT(a.kv_committed_len, 4);
  OT_REFUSED(c, ps, &a, skv_commit(c, &a, 3), SKV_ERR_INVALID_ARG, "skv_commit");
  OT_REFUSED(c, ps, &a, skv_commit(c, &a, UINT32_MAX), SKV_ERR_INVALID_ARG, "skv_commit");
  CHECK_OK(skv_commit(c, &a, 2));
  CHECK_EQ_INT(a.kv_committed_len, 6);
  none = ot_req();
  OT_REFUSED(c, ps, &none, skv_commit(c, &none, 0), SKV_ERR_INVALID_ARG, "skv_commit");
  OT_REFUSED(c, ps, NULL, skv_commit(NULL, &a, 1), SKV_ERR_NULL_ARG, "skv_commit");
  OT_REFUSED(c, ps, NULL, skv_commit(c, NULL, 1), SKV_ERR_NULL_ARG, "skv_commit");
  CHECK_PAGES(c, 5, 2, 0);
  CHECK_OK(skv_free_req(c, &a));
  CHECK_PAGES(c, 7, 0, 0);
  skv_cache_free(c);
}

/* ------------------------------------------------------- skv_free_req */

static void test_free_req(void) {
  const uint32_t ps = 4;
  skv_cache *c = ot_new(ps, 16, 2, 64, 0);
  skv_req a, stale, none;
  int32_t held[8];
  uint32_t refs[2];
  skv_stats s;
  if (!c) return;

  /* a row over a protected prefix: free_req frees the row's own pages only */
  CHECK_OK(skv_pool_alloc(c, 8, held));
  a = ot_row(c);
  CHECK_OK(skv_map_prefix(c, &a, held, 8));
  CHECK_OK(skv_alloc_extend(c, &a, 9, NULL)); /* 17 tokens: 2 shared pages, 3 own */
  CHECK_OK(skv_commit(c, &a, 9));
  CHECK_PAGES(c, 10, 3, 2);
  stale = a;
  CHECK_OK(skv_free_req(c, &a));
  CHECK(req_is_empty(&a));
  s = ot_stats(c);
  CHECK_EQ_U64(s.free_rows, 2);
  CHECK_EQ_U64(s.used_pages, 2);
  CHECK_PAGES(c, 13, 0, 2);
  {
    int32_t q[2];
    q[0] = held[0];
    q[1] = held[7];
    CHECK_OK(skv_page_refs(c, q, 2, refs));
    CHECK_EQ_INT(refs[0], 0);
    CHECK_EQ_INT(refs[1], 0);
  }

  /* a second free through a stale copy: its row is no longer in use */
  OT_REFUSED(c, ps, &stale, skv_free_req(c, &stale), SKV_ERR_NOT_FOUND, "skv_free_req");
  none = ot_req();
  OT_REFUSED(c, ps, &none, skv_free_req(c, &none), SKV_ERR_INVALID_ARG, "skv_free_req");
  OT_REFUSED(c, ps, NULL, skv_free_req(NULL, &none), SKV_ERR_NULL_ARG, "skv_free_req");
  OT_REFUSED(c, ps, NULL, skv_free_req(c, NULL), SKV_ERR_NULL_ARG, "skv_free_req");

  CHECK_OK(skv_pool_free(c, held, 8));
  CHECK_PAGES(c, 15, 0, 0);
  skv_cache_free(c);
}

/* -------------------------------------------- skv_pool_alloc / _free */

static void test_pool(void) {
  const uint32_t ps = 4;
  skv_cache *c = ot_new(ps, 8, 2, 32, 0); /* 7 usable pages */
  int32_t e[8], f[4], out[32], bad[4];
  uint32_t refs[8];
  skv_req a;
  int32_t own[4];
  int i, free_page = -1;
  if (!c) return;

  ot_fill(e, 8);
  CHECK_OK(skv_pool_alloc(c, 8, e));
  CHECK(ot_paged(e, 8, ps, 8));
  CHECK(e[0] / 4 != e[4] / 4);
  CHECK_PAGES(c, 5, 0, 2);
  CHECK_EQ_U64(ot_stats(c).used_pages, 2);
  CHECK_OK(skv_page_refs(c, e, 8, refs));
  for (i = 0; i < 8; i++) CHECK_EQ_INT(refs[i], 0);

  /* a token count that is not whole pages; too many pages */
  ot_fill(out, 32);
  OT_REFUSED(c, ps, NULL, skv_pool_alloc(c, 6, out), SKV_ERR_INVALID_ARG, "skv_pool_alloc");
  CHECK_MSG_NUMBER(6);
  OT_REFUSED(c, ps, NULL, skv_pool_alloc(c, 24, out), SKV_ERR_OUT_OF_MEMORY, "skv_pool_alloc");
  OT_REFUSED(c, ps, NULL, skv_pool_alloc(c, UINT32_MAX - 3, out), SKV_ERR_OUT_OF_MEMORY,
             "skv_pool_alloc");
  CHECK(ot_all_sentinel(out, 32));
  OT_REFUSED(c, ps, NULL, skv_pool_alloc(NULL, 4, out), SKV_ERR_NULL_ARG, "skv_pool_alloc");
  OT_REFUSED(c, ps, NULL, skv_pool_alloc(c, 4, NULL), SKV_ERR_NULL_ARG, "skv_pool_alloc");
  OT_REFUSED(c, ps, NULL, skv_pool_alloc(c, 3, NULL), SKV_ERR_NULL_ARG, "skv_pool_alloc");
  CHECK(ot_all_sentinel(out, 32));

  /* a row owns a page: the engine may not free it */
  a = ot_row(c);
  CHECK_OK(skv_alloc_extend(c, &a, 4, NULL));
  OT_INDICES(c, a.req_pool_idx, 0, 4, own);
  CHECK_PAGES(c, 4, 1, 2);

  for (i = 1; i < 8; i++)
    if (i != e[0] / 4 && i != e[4] / 4 && i != own[0] / 4) free_page = i;
  CHECK(free_page > 0);
  for (i = 0; i < 4; i++) f[i] = free_page * 4 + i;

  /* never handed out */
  OT_REFUSED(c, ps, NULL, skv_pool_free(c, f, 4), SKV_ERR_STATE,
             "skv_pool_free");
  OT_REFUSED(c, ps, NULL, skv_pool_free(c, own, 4), SKV_ERR_STATE, "skv_pool_free");
  /* a call that mixes a good page with a bad one frees neither */
  {
    int32_t mix[8];
    memcpy(mix, e, 4 * sizeof(int32_t));
    memcpy(mix + 4, own, 4 * sizeof(int32_t));
    OT_REFUSED(c, ps, NULL, skv_pool_free(c, mix, 8), SKV_ERR_STATE, "skv_pool_free");
    memcpy(mix + 4, f, 4 * sizeof(int32_t));
    OT_REFUSED(c, ps, NULL, skv_pool_free(c, mix, 8), SKV_ERR_STATE, "skv_pool_free");
  }
  /* the padding page and indices outside the pool */
  for (i = 0; i < 4; i++) bad[i] = i;
  OT_REFUSED(c, ps, NULL, skv_pool_free(c, bad, 4), SKV_ERR_INVALID_ARG, "skv_pool_free");
  for (i = 0; i < 4; i++) bad[i] = 32 + i;
  OT_REFUSED(c, ps, NULL, skv_pool_free(c, bad, 4), SKV_ERR_INVALID_ARG, "skv_pool_free");
  for (i = 0; i < 4; i++) bad[i] = -4 + i;
  OT_REFUSED(c, ps, NULL, skv_pool_free(c, bad, 4), SKV_ERR_INVALID_ARG, "skv_pool_free");
  memcpy(bad, e, sizeof bad);
  bad[3] = 0;
  OT_REFUSED(c, ps, NULL, skv_pool_free(c, bad, 4), SKV_ERR_INVALID_ARG, "skv_pool_free");
  OT_REFUSED(c, ps, NULL, skv_pool_free(NULL, e, 4), SKV_ERR_NULL_ARG, "skv_pool_free");
  OT_REFUSED(c, ps, NULL, skv_pool_free(c, NULL, 4), SKV_ERR_NULL_ARG, "skv_pool_free");
  OT_REFUSED(c, ps, NULL, skv_pool_free(c, NULL, 0), SKV_OK, ""); /* (NULL, 0) is empty */

  /* page refs: padding page, out of range, NULLs */
  {
    int32_t q = 0;
    uint32_t cnt = OT_SENTINEL;
    OT_REFUSED(c, ps, NULL, skv_page_refs(c, &q, 1, &cnt), SKV_ERR_INVALID_ARG, "skv_page_refs");
    q = 32;
    OT_REFUSED(c, ps, NULL, skv_page_refs(c, &q, 1, &cnt), SKV_ERR_INVALID_ARG, "skv_page_refs");
    q = -1;
    OT_REFUSED(c, ps, NULL, skv_page_refs(c, &q, 1, &cnt), SKV_ERR_INVALID_ARG, "skv_page_refs");
    CHECK_EQ_U64(cnt, OT_SENTINEL);
    OT_REFUSED(c, ps, NULL, skv_page_refs(NULL, e, 1, &cnt), SKV_ERR_NULL_ARG, "skv_page_refs");
    OT_REFUSED(c, ps, NULL, skv_page_refs(c, NULL, 1, &cnt), SKV_ERR_NULL_ARG, "skv_page_refs");
    OT_REFUSED(c, ps, NULL, skv_page_refs(c, e, 1, NULL), SKV_ERR_NULL_ARG, "skv_page_refs");
    CHECK_EQ_U64(cnt, OT_SENTINEL);
    OT_REFUSED(c, ps, NULL, skv_page_refs(c, NULL, 0, NULL), SKV_OK, "");
    /* a row-owned page is mapped by its one row */
    CHECK_OK(skv_page_refs(c, own, 1, &cnt));
    CHECK_EQ_U64(cnt, 1);
  }

  /* the engine frees its page once; twice is a double free */
  CHECK_OK(skv_pool_free(c, e, 4));
  CHECK_PAGES(c, 5, 1, 1);
  OT_REFUSED(c, ps, NULL, skv_pool_free(c, e, 4), SKV_ERR_STATE, "skv_pool_free");
  /* the same page twice in one call: refused, or freed exactly once */
  {
    int32_t twice[8];
    skv_status st;
    memcpy(twice, e + 4, 4 * sizeof(int32_t));
    memcpy(twice + 4, e + 4, 4 * sizeof(int32_t));
    st = skv_pool_free(c, twice, 8);
    CHECK(st == SKV_ERR_STATE || st == SKV_OK);
    if (st == SKV_ERR_STATE) {
      CHECK_PAGES(c, 5, 1, 1);
      CHECK_OK(skv_pool_free(c, e + 4, 4));
    }
    CHECK_PAGES(c, 6, 1, 0);
  }

  /* everything comes back: the whole pool can be handed out again */
  CHECK_OK(skv_free_req(c, &a));
  CHECK_PAGES(c, 7, 0, 0);
  CHECK_OK(skv_pool_alloc(c, 28, out));
  CHECK(ot_paged(out, 28, ps, 8));
  CHECK_PAGES(c, 0, 0, 7);
  OT_REFUSED(c, ps, NULL, skv_pool_alloc(c, 4, f), SKV_ERR_OUT_OF_MEMORY, "skv_pool_alloc");
  CHECK_OK(skv_pool_free(c, out, 28));
  CHECK_PAGES(c, 7, 0, 0);

  /* each index frees the page it falls in: one index of a page frees all of it */
  CHECK_OK(skv_pool_alloc(c, 8, e));
  CHECK_PAGES(c, 5, 0, 2);
  CHECK_OK(skv_pool_free(c, e + 2, 3)); /* slots 2, 3 of the first page, 0 of the second */
  CHECK_PAGES(c, 7, 0, 0);
  OT_REFUSED(c, ps, NULL, skv_pool_free(c, e + 7, 1), SKV_ERR_STATE, "skv_pool_free");
  skv_cache_free(c);
}

/* ------------------------------ skv_map_prefix / skv_publish_prefix */

static void test_prefix_sharing(void) {
  const uint32_t ps = 4;
  skv_cache *c = ot_new(ps, 16, 4, 64, 0);
  int32_t e[8], ia[16], ib[16], id[16], bad[8], own[4], fr[4];
  uint32_t refs[16];
  skv_req a, b, d, x, none, too_long;
  int i, free_page = -1;
  if (!c) return;

  CHECK_OK(skv_pool_alloc(c, 8, e));
  a = ot_row(c);
  a.lock_node = 77; /* the engine's own fields ride along untouched */
  CHECK_OK(skv_map_prefix(c, &a, e, 8));
  CHECK_EQ_INT(a.kv_allocated_len, 8);
  CHECK_EQ_INT(a.kv_committed_len, 8);
  CHECK_EQ_INT(a.cache_protected_len, 8);
  CHECK_EQ_U64(a.lock_node, 77);
  OT_INDICES(c, a.req_pool_idx, 0, 8, ia);
  CHECK(memcmp(ia, e, sizeof e) == 0);
  CHECK_OK(skv_page_refs(c, e, 8, refs));
  for (i = 0; i < 8; i++) CHECK_EQ_INT(refs[i], 1);
  CHECK_PAGES(c, 13, 0, 2);

  /* a second row shares the first page */
  b = ot_row(c);
  CHECK_OK(skv_map_prefix(c, &b, e, 4));
  CHECK_EQ_INT(b.cache_protected_len, 4);
  CHECK_OK(skv_page_refs(c, e, 8, refs));
  CHECK_EQ_INT(refs[0], 2);
  CHECK_EQ_INT(refs[3], 2);
  CHECK_EQ_INT(refs[4], 1);
  CHECK_PAGES(c, 13, 0, 2);

  /* a page a row maps cannot go back to the pool */
  OT_REFUSED(c, ps, NULL, skv_pool_free(c, e, 4), SKV_ERR_STATE, "skv_pool_free");

  /* the row grows past its prefix with pages of its own */
  CHECK_OK(skv_alloc_extend(c, &a, 5, NULL));
  CHECK_EQ_INT(a.kv_allocated_len, 13);
  CHECK_EQ_INT(a.cache_protected_len, 8);
  OT_INDICES(c, a.req_pool_idx, 0, 13, ia);
  CHECK(memcmp(ia, e, sizeof e) == 0);
  CHECK(ot_paged(ia, 13, ps, 16));
  memcpy(own, ia + 8, sizeof own);
  CHECK_OK(skv_page_refs(c, own, 1, refs));
  CHECK_EQ_INT(refs[0], 1);
  CHECK_PAGES(c, 11, 2, 2);

  /* map_prefix refusals, on a fresh row */
  x = ot_row(c);
  for (i = 1; i < 16 && free_page < 0; i++)
    if (i != e[0] / 4 && i != e[4] / 4 && i != ia[8] / 4 && i != ia[12] / 4) free_page = i;
  CHECK(free_page > 0);
  for (i = 0; i < 4; i++) fr[i] = free_page * 4 + i;
  OT_REFUSED(c, ps, &x, skv_map_prefix(c, &x, e, 6), SKV_ERR_INVALID_ARG, "skv_map_prefix");
  CHECK_MSG_NUMBER(6);
  memcpy(bad, e, sizeof bad); /* a page's slots out of order */
  bad[1] = e[2];
  bad[2] = e[1];
  OT_REFUSED(c, ps, &x, skv_map_prefix(c, &x, bad, 8), SKV_ERR_INVALID_ARG, "skv_map_prefix");
  memcpy(bad, e, sizeof bad); /* a second page entered mid-way */
  for (i = 4; i < 8; i++) bad[i] = e[4] + ((i - 4 + 1) % 4);
  OT_REFUSED(c, ps, &x, skv_map_prefix(c, &x, bad, 8), SKV_ERR_INVALID_ARG, "skv_map_prefix");
  memcpy(bad, e, 4 * sizeof(int32_t)); /* one page at two places: positions would alias */
  memcpy(bad + 4, e, 4 * sizeof(int32_t));
  OT_REFUSED(c, ps, &x, skv_map_prefix(c, &x, bad, 8), SKV_ERR_INVALID_ARG, "skv_map_prefix");
  for (i = 0; i < 4; i++) bad[i] = e[0] + 1 + i; /* straddles two pages */
  OT_REFUSED(c, ps, &x, skv_map_prefix(c, &x, bad, 4), SKV_ERR_INVALID_ARG, "skv_map_prefix");
  for (i = 0; i < 4; i++) bad[i] = i; /* the padding page */
  OT_REFUSED(c, ps, &x, skv_map_prefix(c, &x, bad, 4), SKV_ERR_INVALID_ARG, "skv_map_prefix");
  for (i = 0; i < 4; i++) bad[i] = 64 + i; /* past the pool */
  OT_REFUSED(c, ps, &x, skv_map_prefix(c, &x, bad, 4), SKV_ERR_INVALID_ARG, "skv_map_prefix");
  OT_REFUSED(c, ps, &x, skv_map_prefix(c, &x, fr, 4), SKV_ERR_STATE, "skv_map_prefix");
  OT_REFUSED(c, ps, &x, skv_map_prefix(c, &x, own, 4), SKV_ERR_STATE, "skv_map_prefix");
  memcpy(bad, e, 4 * sizeof(int32_t)); /* a good page, then a row-owned one */
  memcpy(bad + 4, own, 4 * sizeof(int32_t));
  OT_REFUSED(c, ps, &x, skv_map_prefix(c, &x, bad, 8), SKV_ERR_STATE, "skv_map_prefix");
  none = ot_req();
  OT_REFUSED(c, ps, &none, skv_map_prefix(c, &none, e, 4), SKV_ERR_INVALID_ARG, "skv_map_prefix");
  OT_REFUSED(c, ps, NULL, skv_map_prefix(NULL, &x, e, 4), SKV_ERR_NULL_ARG, "skv_map_prefix");
  OT_REFUSED(c, ps, NULL, skv_map_prefix(c, NULL, e, 4), SKV_ERR_NULL_ARG, "skv_map_prefix");
  OT_REFUSED(c, ps, &x, skv_map_prefix(c, &x, NULL, 4), SKV_ERR_NULL_ARG, "skv_map_prefix");
  {
    /* longer than a row may map */
    skv_cache *small = ot_new(ps, 16, 1, 4, 0);
    int32_t se[8];
    if (small) {
      CHECK_OK(skv_pool_alloc(small, 8, se));
      too_long = ot_row(small);
      OT_REFUSED(small, ps, &too_long, skv_map_prefix(small, &too_long, se, 8),
                 SKV_ERR_INVALID_ARG, "skv_map_prefix");
      CHECK_OK(skv_free_req(small, &too_long));
      CHECK_OK(skv_pool_free(small, se, 8));
      CHECK_PAGES(small, 15, 0, 0);
      skv_cache_free(small);
    }
  }
  /* a row that already maps tokens is not fresh */
  CHECK_OK(skv_alloc_extend(c, &x, 1, NULL));
  {
    ot_snap sb, sa;
    skv_req xb = x;
    skv_status st;
    ot_take(c, ps, &sb);
    st = skv_map_prefix(c, &x, e, 4);
    ot_save_msg();
    ot_take(c, ps, &sa);
    CHECK(st == SKV_ERR_STATE || st == SKV_ERR_INVALID_ARG);
    CHECK(strstr(ot_msg, "skv_map_prefix") != NULL);
    ot_same_at(&sb, &sa, __FILE__, __LINE__);
    CHECK_REQ_SAME(&xb, &x);
  }
  CHECK_OK(skv_free_req(c, &x));
  CHECK_PAGES(c, 11, 2, 2);

  /* publish: the row hands its own full page to the tree */
  CHECK_OK(skv_commit(c, &a, 5));
  CHECK_OK(skv_publish_prefix(c, &a, 12));
  CHECK_EQ_INT(a.cache_protected_len, 12);
  CHECK_EQ_INT(a.kv_allocated_len, 13);
  CHECK_EQ_INT(a.kv_committed_len, 13);
  CHECK_OK(skv_page_refs(c, own, 4, refs));
  for (i = 0; i < 4; i++) CHECK_EQ_INT(refs[i], 1);
  CHECK_PAGES(c, 11, 1, 3);
  OT_REFUSED(c, ps, NULL, skv_pool_free(c, own, 4), SKV_ERR_STATE, "skv_pool_free");
  OT_REFUSED(c, ps, &a, skv_publish_prefix(c, &a, 12), SKV_OK, ""); /* already there */
  OT_REFUSED(c, ps, &a, skv_publish_prefix(c, &a, 14), SKV_ERR_INVALID_ARG, "skv_publish_prefix");
  OT_REFUSED(c, ps, &a, skv_publish_prefix(c, &a, 16), SKV_ERR_INVALID_ARG, "skv_publish_prefix");
  CHECK_MSG_NUMBER(16);
  CHECK_MSG_NUMBER(13);
  OT_REFUSED(c, ps, &a, skv_publish_prefix(c, &a, 8), SKV_ERR_STATE, "skv_publish_prefix");
  OT_REFUSED(c, ps, &a, skv_publish_prefix(c, &a, 0), SKV_ERR_STATE, "skv_publish_prefix");
  OT_REFUSED(c, ps, &none, skv_publish_prefix(c, &none, 0), SKV_ERR_INVALID_ARG,
             "skv_publish_prefix");
  OT_REFUSED(c, ps, NULL, skv_publish_prefix(NULL, &a, 12), SKV_ERR_NULL_ARG, "skv_publish_prefix");
  OT_REFUSED(c, ps, NULL, skv_publish_prefix(c, NULL, 12), SKV_ERR_NULL_ARG, "skv_publish_prefix");
  /* publishing needs committed tokens: b maps 4, commits nothing more */
  CHECK_OK(skv_alloc_extend(c, &b, 4, NULL));
  OT_REFUSED(c, ps, &b, skv_publish_prefix(c, &b, 8), SKV_ERR_INVALID_ARG, "skv_publish_prefix");
  CHECK_OK(skv_commit(c, &b, 4));
  CHECK_PAGES(c, 10, 2, 3);

  /* a third row adopts all three engine-held pages, including the published one */
  d = ot_row(c);
  CHECK_OK(skv_map_prefix(c, &d, ia, 12));
  OT_INDICES(c, d.req_pool_idx, 0, 12, id);
  CHECK(memcmp(id, ia, 12 * sizeof(int32_t)) == 0);
  {
    int32_t q[3];
    q[0] = e[0];
    q[1] = e[5];
    q[2] = own[2];
    CHECK_OK(skv_page_refs(c, q, 3, refs));
    CHECK_EQ_INT(refs[0], 3); /* a, b, d */
    CHECK_EQ_INT(refs[1], 2); /* a, d */
    CHECK_EQ_INT(refs[2], 2); /* a, d */
  }
  CHECK_PAGES(c, 10, 2, 3);

  /* rows leave; the tree keeps its pages until it frees them */
  OT_INDICES(c, b.req_pool_idx, 0, 8, ib);
  CHECK_OK(skv_free_req(c, &a));
  CHECK_EQ_INT(a.req_pool_idx, -1);
  CHECK_EQ_INT(a.kv_allocated_len, 0);
  CHECK_EQ_INT(a.kv_committed_len, 0);
  CHECK_EQ_INT(a.cache_protected_len, 0);
  CHECK_EQ_U64(a.lock_node, 77); /* the engine's lock: its own tree path releases it */
  CHECK_PAGES(c, 11, 1, 3);
  CHECK_OK(skv_page_refs(c, e, 1, refs));
  CHECK_EQ_INT(refs[0], 2);
  CHECK_OK(skv_free_req(c, &b));
  CHECK_PAGES(c, 12, 0, 3);
  OT_REFUSED(c, ps, NULL, skv_pool_free(c, e, 4), SKV_ERR_STATE, "skv_pool_free"); /* d maps it */
  CHECK_OK(skv_free_req(c, &d));
  CHECK_OK(skv_page_refs(c, id, 12, refs));
  for (i = 0; i < 12; i++) CHECK_EQ_INT(refs[i], 0);
  CHECK_PAGES(c, 12, 0, 3);
  CHECK_EQ_U64(ot_stats(c).used_pages, 3);
  CHECK_OK(skv_pool_free(c, id, 12));
  CHECK_PAGES(c, 15, 0, 0);
  OT_REFUSED(c, ps, NULL, skv_pool_free(c, ib + 4, 4), SKV_ERR_STATE, "skv_pool_free");
  skv_cache_free(c);
}

/* ---------------------------------------------------- skv_row_indices */

static void test_row_indices(void) {
  const uint32_t ps = 4;
  skv_cache *c = ot_new(ps, 8, 3, 32, 0);
  skv_req a, b;
  int32_t all[16], part[16], arow, unused;
  if (!c) return;
  a = ot_row(c);
  b = ot_row(c);
  CHECK_OK(skv_alloc_extend(c, &a, 3, NULL));
  CHECK_OK(skv_alloc_extend(c, &b, 5, NULL));
  CHECK_OK(skv_alloc_extend(c, &a, 7, NULL)); /* interleaved growth: a's pages are not adjacent */
  arow = a.req_pool_idx;
  unused = 3 - a.req_pool_idx - b.req_pool_idx;
  OT_INDICES(c, a.req_pool_idx, 0, 10, all);
  CHECK(ot_paged(all, 10, ps, 8));
  ot_fill(part, 16);
  OT_INDICES(c, a.req_pool_idx, 3, 9, part);
  CHECK(memcmp(part, all + 3, 6 * sizeof(int32_t)) == 0);
  CHECK(ot_all_sentinel(part + 6, 10));
  ot_fill(part, 16);
  OT_REFUSED(c, ps, NULL, skv_row_indices(c, a.req_pool_idx, 5, 5, part), SKV_OK, "");
  OT_REFUSED(c, ps, NULL, skv_row_indices(c, a.req_pool_idx, 0, 0, NULL), SKV_OK, "");
  CHECK(ot_all_sentinel(part, 16));

  OT_REFUSED(c, ps, NULL, skv_row_indices(c, a.req_pool_idx, 0, 11, part), SKV_ERR_INVALID_ARG,
             "skv_row_indices");
  CHECK_MSG_NUMBER(11);
  OT_REFUSED(c, ps, NULL, skv_row_indices(c, a.req_pool_idx, 6, 4, part), SKV_ERR_INVALID_ARG,
             "skv_row_indices");
  OT_REFUSED(c, ps, NULL, skv_row_indices(c, 3, 0, 1, part), SKV_ERR_INVALID_ARG,
             "skv_row_indices");
  OT_REFUSED(c, ps, NULL, skv_row_indices(c, -1, 0, 1, part), SKV_ERR_INVALID_ARG,
             "skv_row_indices");
  OT_REFUSED(c, ps, NULL, skv_row_indices(c, unused, 0, 0, part), SKV_ERR_NOT_FOUND,
             "skv_row_indices");
  OT_REFUSED(c, ps, NULL, skv_row_indices(NULL, a.req_pool_idx, 0, 1, part), SKV_ERR_NULL_ARG,
             "skv_row_indices");
  OT_REFUSED(c, ps, NULL, skv_row_indices(c, a.req_pool_idx, 0, 1, NULL), SKV_ERR_NULL_ARG,
             "skv_row_indices");
  CHECK(ot_all_sentinel(part, 16));

  CHECK_OK(skv_free_req(c, &a));
  OT_REFUSED(c, ps, NULL, skv_row_indices(c, arow, 0, 1, part), SKV_ERR_NOT_FOUND,
             "skv_row_indices");
  CHECK_OK(skv_free_req(c, &b));
  CHECK_PAGES(c, 7, 0, 0);
  skv_cache_free(c);
}

/* ----------------------------------------------- skv_build_flashinfer */

static void test_flashinfer(void) {
  const uint32_t ps = 4;
  skv_cache *c = ot_new(ps, 16, 5, 64, 0);
  skv_req r0, r1, r2, r3;
  int32_t i0[16], i2[16], i3[16], e[4];
  int32_t rows[5], indptr[6], indices[16], last[5];
  size_t needed;
  if (!c) return;

  CHECK_OK(skv_pool_alloc(c, 4, e));
  r0 = ot_row(c);
  r1 = ot_row(c); /* stays empty */
  r2 = ot_row(c);
  r3 = ot_row(c);
  CHECK_OK(skv_map_prefix(c, &r2, e, 4)); /* shares the engine's page */
  CHECK_OK(skv_alloc_extend(c, &r0, 9, NULL));
  CHECK_OK(skv_alloc_extend(c, &r2, 4, NULL));
  CHECK_OK(skv_alloc_extend(c, &r3, 3, NULL));
  OT_INDICES(c, r0.req_pool_idx, 0, 9, i0);
  OT_INDICES(c, r2.req_pool_idx, 0, 8, i2);
  OT_INDICES(c, r3.req_pool_idx, 0, 3, i3);

  rows[0] = r0.req_pool_idx;
  rows[1] = r1.req_pool_idx;
  rows[2] = r2.req_pool_idx;
  rows[3] = r3.req_pool_idx;
  ot_fill(indptr, 6);
  ot_fill(indices, 16);
  ot_fill(last, 5);
  needed = 12345;
  CHECK_OK(skv_build_flashinfer(c, rows, 4, indptr, indices, last, 16, &needed));
  CHECK_EQ_U64(needed, 6);
  CHECK_EQ_INT(indptr[0], 0);
  CHECK_EQ_INT(indptr[1], 3);
  CHECK_EQ_INT(indptr[2], 3);
  CHECK_EQ_INT(indptr[3], 5);
  CHECK_EQ_INT(indptr[4], 6);
  CHECK_EQ_INT(indptr[5], OT_SENTINEL);
  CHECK_EQ_INT(indices[0], i0[0] / 4);
  CHECK_EQ_INT(indices[1], i0[4] / 4);
  CHECK_EQ_INT(indices[2], i0[8] / 4);
  CHECK_EQ_INT(indices[3], e[0] / 4);
  CHECK_EQ_INT(indices[4], i2[4] / 4);
  CHECK_EQ_INT(indices[5], i3[0] / 4);
  CHECK(ot_all_sentinel(indices + 6, 10));
  CHECK_EQ_INT(last[0], 1);
  CHECK_EQ_INT(last[1], 0);
  CHECK_EQ_INT(last[2], 4);
  CHECK_EQ_INT(last[3], 3);
  CHECK_EQ_INT(last[4], OT_SENTINEL);

  /* another order, a repeated row, an exactly sized buffer */
  rows[0] = r3.req_pool_idx;
  rows[1] = r0.req_pool_idx;
  rows[2] = r3.req_pool_idx;
  ot_fill(indices, 16);
  CHECK_OK(skv_build_flashinfer(c, rows, 3, indptr, indices, last, 5, &needed));
  CHECK_EQ_U64(needed, 5);
  CHECK_EQ_INT(indptr[0], 0);
  CHECK_EQ_INT(indptr[1], 1);
  CHECK_EQ_INT(indptr[2], 4);
  CHECK_EQ_INT(indptr[3], 5);
  CHECK_EQ_INT(indices[0], i3[0] / 4);
  CHECK_EQ_INT(indices[3], i0[8] / 4);
  CHECK_EQ_INT(indices[4], i3[0] / 4);
  CHECK_EQ_INT(indices[5], OT_SENTINEL);
  CHECK_EQ_INT(last[0], 3);
  CHECK_EQ_INT(last[1], 1);
  CHECK_EQ_INT(last[2], 3);

  /* an empty batch, and a batch of one empty row */
  needed = 7;
  ot_fill(indptr, 6);
  CHECK_OK(skv_build_flashinfer(c, rows, 0, indptr, indices, last, 0, &needed));
  CHECK_EQ_U64(needed, 0);
  CHECK_EQ_INT(indptr[0], 0);
  CHECK_EQ_INT(indptr[1], OT_SENTINEL);
  rows[0] = r1.req_pool_idx;
  CHECK_OK(skv_build_flashinfer(c, rows, 1, indptr, indices, last, 0, &needed));
  CHECK_EQ_U64(needed, 0);
  CHECK_EQ_INT(indptr[1], 0);
  CHECK_EQ_INT(last[0], 0);

  /* too small a buffer: only *needed is written */
  rows[0] = r0.req_pool_idx;
  rows[1] = r2.req_pool_idx;
  ot_fill(indptr, 6);
  ot_fill(indices, 16);
  ot_fill(last, 5);
  needed = 0;
  OT_REFUSED(c, ps, NULL, skv_build_flashinfer(c, rows, 2, indptr, indices, last, 4, &needed),
             SKV_ERR_INVALID_ARG, "skv_build_flashinfer");
  CHECK_EQ_U64(needed, 5);
  needed = 0;
  OT_REFUSED(c, ps, NULL, skv_build_flashinfer(c, rows, 2, indptr, indices, last, 0, &needed),
             SKV_ERR_INVALID_ARG, "skv_build_flashinfer");
  CHECK_EQ_U64(needed, 5);
  CHECK(ot_all_sentinel(indptr, 6) && ot_all_sentinel(indices, 16) && ot_all_sentinel(last, 5));

  /* rows out of range or not in use write nothing, not even *needed */
  needed = 999;
  rows[1] = 5;
  OT_REFUSED(c, ps, NULL, skv_build_flashinfer(c, rows, 2, indptr, indices, last, 16, &needed),
             SKV_ERR_INVALID_ARG, "skv_build_flashinfer");
  rows[1] = -1;
  OT_REFUSED(c, ps, NULL, skv_build_flashinfer(c, rows, 2, indptr, indices, last, 16, &needed),
             SKV_ERR_INVALID_ARG, "skv_build_flashinfer");
  rows[1] = 10 - r0.req_pool_idx - r1.req_pool_idx - r2.req_pool_idx - r3.req_pool_idx; /* unused */
  OT_REFUSED(c, ps, NULL, skv_build_flashinfer(c, rows, 2, indptr, indices, last, 16, &needed),
             SKV_ERR_NOT_FOUND, "skv_build_flashinfer");
  CHECK_EQ_U64(needed, 999);
  OT_REFUSED(c, ps, NULL, skv_build_flashinfer(NULL, rows, 1, indptr, indices, last, 16, &needed),
             SKV_ERR_NULL_ARG, "skv_build_flashinfer");
  OT_REFUSED(c, ps, NULL, skv_build_flashinfer(c, NULL, 1, indptr, indices, last, 16, &needed),
             SKV_ERR_NULL_ARG, "skv_build_flashinfer");
  OT_REFUSED(c, ps, NULL, skv_build_flashinfer(c, rows, 1, NULL, indices, last, 16, &needed),
             SKV_ERR_NULL_ARG, "skv_build_flashinfer");
  OT_REFUSED(c, ps, NULL, skv_build_flashinfer(c, rows, 1, indptr, NULL, last, 16, &needed),
             SKV_ERR_NULL_ARG, "skv_build_flashinfer");
  OT_REFUSED(c, ps, NULL, skv_build_flashinfer(c, rows, 1, indptr, indices, NULL, 16, &needed),
             SKV_ERR_NULL_ARG, "skv_build_flashinfer");
  OT_REFUSED(c, ps, NULL, skv_build_flashinfer(c, rows, 1, indptr, indices, last, 16, NULL),
             SKV_ERR_NULL_ARG, "skv_build_flashinfer");
  CHECK_EQ_U64(needed, 999);
  CHECK(ot_all_sentinel(indptr, 6) && ot_all_sentinel(indices, 16) && ot_all_sentinel(last, 5));

  CHECK_OK(skv_free_req(c, &r0));
  CHECK_OK(skv_free_req(c, &r1));
  CHECK_OK(skv_free_req(c, &r2));
  CHECK_OK(skv_free_req(c, &r3));
  CHECK_OK(skv_pool_free(c, e, 4));
  CHECK_PAGES(c, 15, 0, 0);
  skv_cache_free(c);
}

/* ------------------------------------------- a streaming session, owned */

static void test_streaming_session(void) {
  const uint32_t ps = 4;
  const uint64_t sid = 7;
  skv_cache *c = ot_new(ps, 16, 2, 64, 0);
  skv_req r, retry, none;
  skv_match m;
  skv_stats s;
  skv_held h;
  int32_t t1[32], idx[32];
  int32_t row;
  if (!c) return;

  /* turn 1: no slot yet */
  r = ot_req();
  r.origin_input_len = 10;
  m.hit = 9;
  m.prefix_len = 9;
  CHECK_OK(skv_match_prefix(c, sid, 0, &r, 9, 0, &m));
  CHECK_EQ_INT(m.hit, 0);
  CHECK_EQ_INT(m.prefix_len, 0);
  CHECK_OK(skv_alloc_row(c, &r));
  row = r.req_pool_idx;
  CHECK_OK(skv_alloc_extend(c, &r, 10, NULL)); /* prefill */
  CHECK_OK(skv_commit(c, &r, 10));
  CHECK_OK(skv_alloc_extend(c, &r, 4, NULL)); /* verify round: 3 of 4 drafts accepted */
  CHECK_OK(skv_commit(c, &r, 3));
  r.output_len = 3;
  CHECK_OK(skv_alloc_extend(c, &r, 4, NULL)); /* all 4 accepted, past max_new_tokens 5 */
  CHECK_OK(skv_commit(c, &r, 4));
  r.output_len = 7;
  r.finished_len = 5;
  CHECK_EQ_INT(r.kv_allocated_len, 18);
  CHECK_EQ_INT(r.kv_committed_len, 17);
  CHECK_PAGES(c, 10, 5, 0);
  OT_INDICES(c, row, 0, 18, t1);

  /* finish: target 15; [16, 18) goes, the page holding 12..15 stays */
  CHECK_OK(skv_cache_finished_req(c, sid, 0, &r, 0));
  CHECK(req_is_empty(&r));
  CHECK_EQ_INT(r.output_len, 5);
  CHECK_EQ_INT(r.origin_input_len, 10);
  CHECK_EQ_INT(r.finished_len, 5);
  CHECK_PAGES(c, 11, 4, 0);
  s = ot_stats(c);
  CHECK_EQ_U64(s.sessions, 1);
  CHECK_EQ_U64(s.free_rows, 1);
  CHECK_EQ_U64(s.trimmed_tokens, 3);
  CHECK_EQ_U64(s.tail_freed_tokens, 0);
  OT_INDICES(c, row, 0, 15, idx);
  CHECK(memcmp(idx, t1, 15 * sizeof(int32_t)) == 0);
  OT_REFUSED(c, ps, NULL, skv_row_indices(c, row, 0, 16, idx), SKV_ERR_INVALID_ARG,
             "skv_row_indices");
  CHECK_OK(skv_session_held(c, NULL, 0, &h));
  CHECK_EQ_U64(h.full_tokens, 16);
  CHECK_EQ_U64(h.rows, 1);
  CHECK_EQ_U64(h.sessions, 1);

  /* turn 2: the history (15) plus 5 new prompt tokens */
  r = ot_req();
  r.origin_input_len = 20;
  CHECK_OK(skv_match_prefix(c, sid, 0, &r, 19, 0, &m));
  CHECK_EQ_INT(m.hit, 1);
  CHECK_EQ_INT(m.prefix_len, 15);
  CHECK_EQ_INT(r.req_pool_idx, row);
  CHECK_EQ_INT(r.kv_committed_len, 15);
  CHECK_EQ_INT(r.kv_allocated_len, 15);
  CHECK_EQ_INT(r.cache_protected_len, 0);
  OT_AUDIT(c);
  OT_REFUSED(c, ps, NULL, skv_release_session(c, sid), SKV_ERR_STATE, "skv_release_session");
  CHECK_OK(skv_alloc_extend(c, &r, 5, NULL)); /* position 15 lands in the kept partial page */
  OT_INDICES(c, row, 0, 20, idx);
  CHECK(memcmp(idx, t1, 15 * sizeof(int32_t)) == 0);
  CHECK_EQ_INT(idx[15], t1[12] + 3);
  CHECK(idx[16] / 4 != t1[12] / 4);
  CHECK(ot_paged(idx, 20, ps, 16));
  CHECK_PAGES(c, 10, 5, 0);
  CHECK_OK(skv_commit(c, &r, 5));
  CHECK_OK(skv_alloc_extend(c, &r, 2, NULL));
  CHECK_OK(skv_commit(c, &r, 2));
  r.output_len = 2;
  CHECK_OK(skv_cache_finished_req(c, sid, 0, &r, 0)); /* nothing past 22 to trim */
  CHECK(req_is_empty(&r));
  s = ot_stats(c);
  CHECK_EQ_U64(s.trimmed_tokens, 3);
  CHECK_EQ_U64(s.sessions, 1);
  CHECK_PAGES(c, 9, 6, 0);

  /* turn 3 is matched, extended, then rejected by the scheduler and matched again: the
     retry restores the row's whole mapped length and frees what the first try extended */
  r = ot_req();
  r.origin_input_len = 25;
  CHECK_OK(skv_match_prefix(c, sid, 0, &r, 24, 0, &m));
  CHECK_EQ_INT(m.hit, 1);
  CHECK_EQ_INT(m.prefix_len, 22);
  CHECK_EQ_INT(r.kv_allocated_len, 22);
  CHECK_OK(skv_alloc_extend(c, &r, 3, NULL));
  CHECK_PAGES(c, 8, 7, 0);
  /* a fresh req cannot take over a running slot: only the running request's req may retry */
  retry = ot_req();
  retry.origin_input_len = 25;
  OT_REFUSED(c, ps, &retry, skv_match_prefix(c, sid, 0, &retry, 24, 0, &m), SKV_ERR_STATE,
             "skv_match_prefix");
  retry = r;
  CHECK_OK(skv_match_prefix(c, sid, 0, &retry, 24, 0, &m));
  CHECK_EQ_INT(m.hit, 1);
  CHECK_EQ_INT(m.prefix_len, 22);
  CHECK_EQ_INT(retry.req_pool_idx, row);
  CHECK_EQ_INT(retry.kv_allocated_len, 22);
  CHECK_EQ_INT(retry.kv_committed_len, 22);
  CHECK_PAGES(c, 9, 6, 0);
  CHECK_EQ_U64(ot_stats(c).tail_freed_tokens, 3);
  /* the first try's copy is stale now: its allocated disagrees with the row */
  OT_REFUSED(c, ps, &r, skv_alloc_extend(c, &r, 1, NULL), SKV_ERR_INVALID_ARG, "skv_alloc_extend");
  CHECK_MSG_NUMBER(25);
  CHECK_MSG_NUMBER(22);
  r = retry;
  CHECK_OK(skv_alloc_extend(c, &r, 3, NULL));
  CHECK_OK(skv_commit(c, &r, 3));
  CHECK_OK(skv_alloc_extend(c, &r, 4, NULL));
  CHECK_OK(skv_commit(c, &r, 2));
  r.output_len = 2; /* finished_len -1: the whole output, target 27 */
  CHECK_PAGES(c, 7, 8, 0);
  CHECK_OK(skv_cache_finished_req(c, sid, 0, &r, 0));
  CHECK(req_is_empty(&r));
  CHECK_PAGES(c, 8, 7, 0); /* [28, 29) was in the page 28..31: freed */
  s = ot_stats(c);
  CHECK_EQ_U64(s.trimmed_tokens, 5);
  OT_INDICES(c, row, 0, 27, idx);
  CHECK(ot_paged(idx, 27, ps, 16));

  /* a finish through a req that disagrees with the idle slot's row is refused as a stale
     copy (STATE, as in external mode), naming the disagreement */
  none = req_make(row, 20, 20);
  none.origin_input_len = 20;
  OT_REFUSED(c, ps, &none, skv_cache_finished_req(c, sid, 0, &none, 0), SKV_ERR_STATE,
             "skv_cache_finished_req");
  CHECK_MSG_HAS("stale copy");
  CHECK_MSG_NUMBER(20);
  CHECK_MSG_NUMBER(27);

  /* release gives back everything */
  CHECK_OK(skv_release_session(c, sid));
  s = ot_stats(c);
  CHECK_EQ_U64(s.sessions, 0);
  CHECK_EQ_U64(s.free_rows, 2);
  CHECK_EQ_U64(s.free_pages, s.total_pages - 1);
  CHECK_PAGES(c, 15, 0, 0);
  OT_REFUSED(c, ps, NULL, skv_row_indices(c, row, 0, 1, idx), SKV_ERR_NOT_FOUND, "skv_row_indices");
  CHECK_OK(skv_release_session(c, sid)); /* nothing left: OK */
  skv_cache_free(c);
}

/* ------------------------------------------ a session owns its row */

static void test_session_owns_row(void) {
  const uint32_t ps = 4;
  skv_cache *c = ot_new(ps, 16, 3, 64, 0);
  skv_req r, idle, z, zi, wrong;
  skv_match m;
  int32_t e[4];
  int32_t row, zrow;
  if (!c) return;

  CHECK_OK(skv_pool_alloc(c, 4, e));
  r = ot_row(c);
  r.origin_input_len = 10;
  CHECK_OK(skv_alloc_extend(c, &r, 10, NULL));
  CHECK_OK(skv_commit(c, &r, 10));
  row = r.req_pool_idx;
  CHECK_OK(skv_cache_finished_req(c, 9, 0, &r, 0));
  CHECK_PAGES(c, 11, 3, 1);

  /* a session whose row maps nothing: map_prefix on it is still the session's */
  z = ot_row(c);
  zrow = z.req_pool_idx;
  CHECK_OK(skv_cache_finished_req(c, 10, 0, &z, 0));
  CHECK_EQ_U64(ot_stats(c).sessions, 2);
  zi = req_make(zrow, 0, 0);
  OT_REFUSED(c, ps, &zi, skv_map_prefix(c, &zi, e, 4), SKV_ERR_STATE, "skv_map_prefix");

  /* an idle slot's row: every engine call that reshapes it is refused */
  idle = req_make(row, 8, 10);
  idle.origin_input_len = 6;
  idle.output_len = 4;
  OT_REFUSED(c, ps, &idle, skv_alloc_extend(c, &idle, 1, NULL), SKV_ERR_STATE, "skv_alloc_extend");
  OT_REFUSED(c, ps, &idle, skv_commit(c, &idle, 2), SKV_ERR_STATE, "skv_commit");
  OT_REFUSED(c, ps, &idle, skv_free_req(c, &idle), SKV_ERR_STATE, "skv_free_req");
  OT_REFUSED(c, ps, &idle, skv_publish_prefix(c, &idle, 4), SKV_ERR_STATE, "skv_publish_prefix");
  OT_REFUSED(c, ps, &idle, skv_trim_overshoot(c, &idle, 1), SKV_ERR_STATE, "skv_trim_overshoot");
  OT_REFUSED(c, ps, &idle, skv_free_tail(c, &idle, 5), SKV_ERR_STATE, "skv_free_tail");
  OT_REFUSED(c, ps, NULL, skv_free_aligned(c, row, 5, 10), SKV_ERR_STATE, "skv_free_aligned");
  /* a req that disagrees with the idle slot's row is a stale copy, and says so */
  wrong = req_make(row, 8, 9);
  OT_REFUSED(c, ps, &wrong, skv_alloc_extend(c, &wrong, 1, NULL), SKV_ERR_STATE,
             "skv_alloc_extend");
  CHECK_MSG_HAS("stale copy");
  OT_REFUSED(c, ps, &wrong, skv_free_req(c, &wrong), SKV_ERR_STATE, "skv_free_req");
  OT_REFUSED(c, ps, NULL, skv_free_aligned(c, row, 5, 9), SKV_ERR_INVALID_ARG, "skv_free_aligned");

  /* in flight, the running req extends and commits the row as usual */
  r = ot_req();
  r.origin_input_len = 14;
  CHECK_OK(skv_match_prefix(c, 9, 0, &r, 13, 0, &m));
  CHECK_EQ_INT(m.hit, 1);
  CHECK_EQ_INT(r.req_pool_idx, row);
  CHECK_OK(skv_alloc_extend(c, &r, 4, NULL));
  CHECK_OK(skv_commit(c, &r, 4));
  CHECK_OK(skv_alloc_extend(c, &r, 3, NULL));
  CHECK_PAGES(c, 9, 5, 1);
  /* ... but never frees or publishes it behind the session's back */
  OT_REFUSED(c, ps, &r, skv_free_req(c, &r), SKV_ERR_STATE, "skv_free_req");
  OT_REFUSED(c, ps, &r, skv_publish_prefix(c, &r, 12), SKV_ERR_STATE, "skv_publish_prefix");
  /* the primitives run on a running req */
  CHECK_OK(skv_free_tail(c, &r, 16));
  CHECK_EQ_INT(r.kv_allocated_len, 16);
  CHECK_EQ_U64(ot_stats(c).tail_freed_tokens, 1);
  CHECK_PAGES(c, 10, 4, 1);
  CHECK_OK(skv_alloc_extend(c, &r, 1, NULL));
  CHECK_OK(skv_commit(c, &r, 1));
  r.output_len = 3;
  CHECK_OK(skv_cache_finished_req(c, 9, 0, &r, 0));
  CHECK(req_is_empty(&r));

  /* idle again: refused again */
  idle = req_make(row, 17, 17);
  OT_REFUSED(c, ps, &idle, skv_alloc_extend(c, &idle, 1, NULL), SKV_ERR_STATE, "skv_alloc_extend");

  CHECK_OK(skv_release_branch(c, 9, 0));
  CHECK_OK(skv_release_session(c, 10));
  /* the row is free: a req naming it finds nothing */
  OT_REFUSED(c, ps, &idle, skv_alloc_extend(c, &idle, 1, NULL), SKV_ERR_NOT_FOUND, "skv_alloc_extend");
  CHECK_OK(skv_pool_free(c, e, 4));
  CHECK_PAGES(c, 15, 0, 0);
  CHECK_EQ_U64(ot_stats(c).free_rows, 3);
  skv_cache_free(c);
}

/* ------------------------- a req that disagrees with libskv's record */

static void test_record_mismatch(void) {
  const uint32_t ps = 4;
  skv_cache *c = ot_new(ps, 32, 2, 64, 0);
  skv_req a, w;
  int32_t e[12];
  if (!c) return;
  CHECK_OK(skv_pool_alloc(c, 12, e));
  a = ot_row(c);
  CHECK_OK(skv_map_prefix(c, &a, e, 12));
  CHECK_OK(skv_alloc_extend(c, &a, 9, NULL)); /* allocated 21, protected 12 */
  CHECK_OK(skv_commit(c, &a, 6));       /* committed 18 */

#define OT_MISMATCH(mut, n1, n2)                                                       \
  do {                                                                                 \
    w = a;                                                                             \
    mut;                                                                               \
    OT_REFUSED(c, ps, &w, skv_alloc_extend(c, &w, 1, NULL), SKV_ERR_INVALID_ARG, "skv_alloc_extend"); \
    CHECK_MSG_NUMBER(n1);                                                              \
    CHECK_MSG_NUMBER(n2);                                                              \
    OT_REFUSED(c, ps, &w, skv_commit(c, &w, 0), SKV_ERR_INVALID_ARG, "skv_commit");   \
    CHECK_MSG_NUMBER(n1);                                                              \
    CHECK_MSG_NUMBER(n2);                                                              \
    OT_REFUSED(c, ps, &w, skv_free_req(c, &w), SKV_ERR_INVALID_ARG, "skv_free_req");  \
    CHECK_MSG_NUMBER(n1);                                                              \
    CHECK_MSG_NUMBER(n2);                                                              \
    OT_REFUSED(c, ps, &w, skv_publish_prefix(c, &w, 16), SKV_ERR_INVALID_ARG,         \
               "skv_publish_prefix");                                                  \
    CHECK_MSG_NUMBER(n1);                                                              \
    CHECK_MSG_NUMBER(n2);                                                              \
    OT_REFUSED(c, ps, &w, skv_free_tail(c, &w, 17), SKV_ERR_INVALID_ARG, "skv_free_tail"); \
    CHECK_MSG_NUMBER(n1);                                                              \
    CHECK_MSG_NUMBER(n2);                                                              \
    w.origin_input_len = 17;                                                           \
    w.output_len = 1;                                                                  \
    OT_REFUSED(c, ps, &w, skv_trim_overshoot(c, &w, 1), SKV_ERR_INVALID_ARG,          \
               "skv_trim_overshoot");                                                  \
    CHECK_MSG_NUMBER(n1);                                                              \
    CHECK_MSG_NUMBER(n2);                                                              \
    OT_REFUSED(c, ps, &w, skv_cache_finished_req(c, 3, 0, &w, 0), SKV_ERR_INVALID_ARG, \
               "skv_cache_finished_req");                                              \
    CHECK_MSG_NUMBER(n1);                                                              \
    CHECK_MSG_NUMBER(n2);                                                              \
    OT_REFUSED(c, ps, &w, skv_cache_finished_req(c, 3, 0, &w, 1), SKV_ERR_INVALID_ARG, \
               "skv_cache_finished_req");                                              \
  } while (0)
  OT_MISMATCH(w.kv_allocated_len = 19, 19, 21);                  /* too short */
  OT_MISMATCH((w.kv_allocated_len = 23, w.kv_committed_len = 23), 23, 21); /* too long */
  OT_MISMATCH(w.cache_protected_len = 8, 8, 12);
  OT_MISMATCH(w.cache_protected_len = 16, 16, 12);
#undef OT_MISMATCH
  CHECK_EQ_U64(ot_stats(c).sessions, 0);

  /* the field rules run before the record: protected not whole pages */
  w = a;
  w.cache_protected_len = 10;
  OT_REFUSED(c, ps, &w, skv_alloc_extend(c, &w, 1, NULL), SKV_ERR_INVALID_ARG, "skv_alloc_extend");
  CHECK_MSG_NUMBER(10);

  CHECK_OK(skv_free_req(c, &a));
  CHECK_OK(skv_pool_free(c, e, 12));
  CHECK_PAGES(c, 31, 0, 0);
  skv_cache_free(c);
}

/* ------------------------------------------- primitives over owned rows */

static void test_primitives_owned(void) {
  const uint32_t ps = 4;
  skv_cache *c = ot_new(ps, 16, 2, 64, 0);
  skv_req a;
  int32_t e[8], before[16], after[16];
  skv_stats s;
  if (!c) return;
  CHECK_OK(skv_pool_alloc(c, 8, e));
  a = ot_row(c);
  CHECK_OK(skv_map_prefix(c, &a, e, 8));
  CHECK_OK(skv_alloc_extend(c, &a, 8, NULL)); /* 16 tokens: 2 shared pages, 2 own */
  CHECK_OK(skv_commit(c, &a, 8));
  OT_INDICES(c, a.req_pool_idx, 0, 16, before);

  /* end must be the row's mapped end; the target may not cut into the protected prefix */
  OT_REFUSED(c, ps, NULL, skv_free_aligned(c, a.req_pool_idx, 10, 15), SKV_ERR_INVALID_ARG,
             "skv_free_aligned");
  CHECK_MSG_NUMBER(15);
  CHECK_MSG_NUMBER(16);
  OT_REFUSED(c, ps, NULL, skv_free_aligned(c, a.req_pool_idx, 7, 16), SKV_ERR_STATE,
             "skv_free_aligned");
  OT_REFUSED(c, ps, NULL, skv_free_aligned(c, 1 - a.req_pool_idx, 0, 0), SKV_ERR_NOT_FOUND,
             "skv_free_aligned");
  OT_REFUSED(c, ps, NULL, skv_free_aligned(c, 2, 0, 0), SKV_ERR_INVALID_ARG, "skv_free_aligned");
  OT_REFUSED(c, ps, NULL, skv_free_aligned(c, a.req_pool_idx, 0, 65), SKV_ERR_INVALID_ARG,
             "skv_free_aligned");

  /* trim to a mid-page target: the page holding it stays */
  a.origin_input_len = 6;
  a.output_len = 10;
  /* 7 < protected 8 */
  OT_REFUSED(c, ps, &a, skv_trim_overshoot(c, &a, 1), SKV_ERR_INVALID_ARG,
             "skv_trim_overshoot");
  OT_REFUSED(c, ps, &a, skv_trim_overshoot(c, &a, 11), SKV_ERR_INVALID_ARG, "skv_trim_overshoot");
  CHECK_OK(skv_trim_overshoot(c, &a, 7)); /* target 13 */
  CHECK_EQ_INT(a.kv_allocated_len, 13);
  CHECK_EQ_INT(a.kv_committed_len, 13);
  CHECK_EQ_INT(a.output_len, 7);
  s = ot_stats(c);
  CHECK_EQ_U64(s.trimmed_tokens, 3);
  CHECK_PAGES(c, 11, 2, 2); /* 13 needs the page 12..15: nothing freed */
  OT_INDICES(c, a.req_pool_idx, 0, 13, after);
  CHECK(memcmp(before, after, 13 * sizeof(int32_t)) == 0);
  /* the next extend continues inside the kept page */
  CHECK_OK(skv_alloc_extend(c, &a, 1, NULL));
  OT_INDICES(c, a.req_pool_idx, 0, 14, after);
  CHECK_EQ_INT(after[13], before[13]);

  /* free_tail to a page boundary frees a whole page */
  CHECK_OK(skv_free_tail(c, &a, 12));
  CHECK_EQ_INT(a.kv_allocated_len, 12);
  CHECK_EQ_INT(a.kv_committed_len, 12);
  CHECK_EQ_U64(ot_stats(c).tail_freed_tokens, 2);
  CHECK_PAGES(c, 12, 1, 2);
  OT_REFUSED(c, ps, &a, skv_free_tail(c, &a, 13), SKV_ERR_INVALID_ARG, "skv_free_tail");
  OT_REFUSED(c, ps, &a, skv_free_tail(c, &a, 4), SKV_ERR_STATE, "skv_free_tail");

  /* free_aligned on the row: it then maps the target; a req must follow */
  CHECK_OK(skv_free_aligned(c, a.req_pool_idx, 9, 12));
  CHECK_PAGES(c, 12, 1, 2); /* 9..11 share the page of 8 */
  OT_REFUSED(c, ps, &a, skv_alloc_extend(c, &a, 1, NULL), SKV_ERR_INVALID_ARG, "skv_alloc_extend");
  CHECK_MSG_NUMBER(9);
  CHECK_MSG_NUMBER(12);
  a.kv_allocated_len = 9;
  a.kv_committed_len = 9;
  a.output_len = 0;
  CHECK_OK(skv_free_aligned(c, a.req_pool_idx, 8, 9));
  CHECK_PAGES(c, 13, 0, 2);
  a.kv_allocated_len = 8;
  a.kv_committed_len = 8;
  CHECK_OK(skv_free_aligned(c, a.req_pool_idx, 8, 8)); /* nothing to do */
  CHECK_OK(skv_alloc_extend(c, &a, 1, NULL));
  CHECK_PAGES(c, 12, 1, 2);
  CHECK_OK(skv_free_req(c, &a));
  CHECK_OK(skv_pool_free(c, e, 8));
  CHECK_PAGES(c, 15, 0, 0);
  skv_cache_free(c);
}

/* -------------------------------------------------- skv_cache_set_hooks */

static void ot_turn(skv_cache *c, uint64_t sid, uint64_t bid, uint32_t n, uint64_t lock,
                    int64_t aux) {
  skv_req r = ot_row(c);
  r.origin_input_len = n;
  r.lock_node = lock;
  r.lock_receipt = lock ? lock + 1 : 0;
  r.aux_state = aux;
  CHECK_OK(skv_alloc_extend(c, &r, n, NULL));
  CHECK_OK(skv_commit(c, &r, n));
  CHECK_OK(skv_cache_finished_req(c, sid, bid, &r, 0));
}

static void test_hooks(void) {
  const uint32_t ps = 4;
  skv_cache *c = ot_new(ps, 32, 6, 64, 0);
  skv_cache *al;
  fake_engine fe;
  skv_engine_hooks hooks, none;
  skv_match m;
  skv_req r;
  if (!c) return;
  fe_init(&fe, 1, 1);
  memset(&hooks, 0, sizeof hooks);
  hooks.struct_size = (uint32_t)sizeof hooks;
  hooks.dec_lock_ref = fe_cb_dec_lock;
  hooks.free_aux = fe_cb_free_aux;

  /* without hooks, a release drops the lock and the aux state */
  ot_turn(c, 1, 0, 5, 11, 13);
  CHECK_OK(skv_release_session(c, 1));
  CHECK_PAGES(c, 31, 0, 0);

  CHECK_OK(skv_cache_set_hooks(c, &hooks, &fe));
  OT_AUDIT(c);
  ot_turn(c, 1, 0, 5, 11, 13);   /* lock (11, 12), aux 13 */
  ot_turn(c, 1, 5, 6, 0, 15);    /* no lock */
  ot_turn(c, 1, 2, 7, 31, -1);   /* no aux */
  ot_turn(c, 2, 0, 9, 21, 23);
  CHECK_NO_CALLS(&fe);
  {
    /* branches go in the order their slots were created */
    const fe_expect want[] = {FE_LOCK(11, 12), FE_AUX(13), FE_AUX(15), FE_LOCK(31, 32)};
    CHECK_OK(skv_release_session(c, 1));
    CHECK_FREES(&fe, want);
  }
  fe_reset_calls(&fe);
  CHECK_EQ_U64(ot_stats(c).sessions, 1);

  /* a later turn hands a new aux state; the lock stays the first turn's */
  r = ot_req();
  r.origin_input_len = 12;
  CHECK_OK(skv_match_prefix(c, 2, 0, &r, 11, 0, &m));
  CHECK_EQ_INT(m.hit, 1);
  CHECK_EQ_U64(r.lock_node, 21);
  CHECK_EQ_INT(r.aux_state, 23);
  r.aux_state = 29;
  r.lock_node = 99;
  CHECK_OK(skv_alloc_extend(c, &r, 3, NULL));
  CHECK_OK(skv_commit(c, &r, 3));
  CHECK_OK(skv_cache_finished_req(c, 2, 0, &r, 0));
  CHECK_NO_CALLS(&fe);
  /* an aborted turn releases the slot */
  r = ot_req();
  CHECK_OK(skv_match_prefix(c, 2, 0, &r, 11, 0, &m));
  CHECK_OK(skv_alloc_extend(c, &r, 2, NULL));
  CHECK_OK(skv_cache_finished_req(c, 2, 0, &r, 1));
  CHECK(req_is_empty(&r));
  {
    const fe_expect want[] = {FE_LOCK(21, 22), FE_AUX(29)};
    CHECK_FREES(&fe, want);
  }
  fe_reset_calls(&fe);
  CHECK_PAGES(c, 31, 0, 0);

  /* a first turn aborted mid-way holds its own lock and aux */
  r = ot_row(c);
  r.lock_node = 41;
  r.lock_receipt = 42;
  r.aux_state = 43;
  CHECK_OK(skv_alloc_extend(c, &r, 6, NULL));
  CHECK_OK(skv_cache_finished_req(c, 4, 0, &r, 1));
  {
    const fe_expect want[] = {FE_LOCK(41, 42), FE_AUX(43)};
    CHECK_FREES(&fe, want);
  }
  fe_reset_calls(&fe);
  CHECK_PAGES(c, 31, 0, 0);

  /* a failing hook: the call says so, yet everything is released and the other hook runs */
  ot_turn(c, 5, 0, 8, 51, 53);
  fe.fail_all[FE_DEC_LOCK] = 1;
  CHECK_STATUS(skv_release_session(c, 5), SKV_ERR_CALLBACK);
  CHECK_STR_CONTAINS(skv_last_error(), "skv_release_session");
  CHECK_STR_CONTAINS(skv_last_error(), "dec_lock_ref");
  {
    const fe_expect want[] = {FE_LOCK(51, 52), FE_AUX(53)};
    CHECK_FREES(&fe, want);
  }
  fe_reset_calls(&fe);
  fe_clear_failures(&fe);
  CHECK_EQ_U64(ot_stats(c).sessions, 0);
  CHECK_PAGES(c, 31, 0, 0);
  CHECK_OK(skv_release_session(c, 5)); /* gone: nothing handed back twice */
  CHECK_NO_CALLS(&fe);

  /* NULL hook functions: released state is dropped */
  memset(&none, 0, sizeof none);
  none.struct_size = (uint32_t)sizeof none;
  CHECK_OK(skv_cache_set_hooks(c, &none, &fe));
  ot_turn(c, 6, 0, 4, 61, 63);
  CHECK_OK(skv_release_session(c, 6));
  CHECK_NO_CALLS(&fe);
  CHECK_PAGES(c, 31, 0, 0);

  /* only the free_aux hook */
  none.free_aux = fe_cb_free_aux;
  CHECK_OK(skv_cache_set_hooks(c, &none, &fe));
  ot_turn(c, 6, 0, 4, 61, 63);
  CHECK_OK(skv_release_branch(c, 6, 0));
  {
    const fe_expect want[] = {FE_AUX(63)};
    CHECK_FREES(&fe, want);
  }
  fe_reset_calls(&fe);

  /* NULL hooks remove them */
  CHECK_OK(skv_cache_set_hooks(c, &hooks, &fe));
  CHECK_OK(skv_cache_set_hooks(c, NULL, NULL));
  ot_turn(c, 7, 0, 4, 71, 73);
  CHECK_OK(skv_release_session(c, 7));
  CHECK_NO_CALLS(&fe);
  CHECK_PAGES(c, 31, 0, 0);

  OT_REFUSED(c, ps, NULL, skv_cache_set_hooks(NULL, &hooks, &fe), SKV_ERR_NULL_ARG,
             "skv_cache_set_hooks");
  none.struct_size = 0;
  OT_REFUSED(c, ps, NULL, skv_cache_set_hooks(c, &none, &fe), SKV_ERR_INVALID_ARG,
             "skv_cache_set_hooks");
  skv_cache_free(c);

  /* aligned reuse: a slot with no whole page to reuse is released by the match */
  al = ot_new(ps, 16, 2, 64, SKV_FLAG_ALIGNED_REUSE);
  if (al) {
    CHECK_OK(skv_cache_set_hooks(al, &hooks, &fe));
    ot_turn(al, 8, 0, 3, 81, 83);
    CHECK_NO_CALLS(&fe);
    r = ot_req();
    r.origin_input_len = 6;
    m.hit = 7;
    CHECK_OK(skv_match_prefix(al, 8, 0, &r, 5, 0, &m));
    CHECK_EQ_INT(m.hit, 0);
    CHECK_EQ_INT(r.req_pool_idx, -1);
    {
      const fe_expect want[] = {FE_LOCK(81, 82), FE_AUX(83)};
      CHECK_FREES(&fe, want);
    }
    fe_reset_calls(&fe);
    CHECK_EQ_U64(ot_stats(al).sessions, 0);
    CHECK_PAGES(al, 15, 0, 0);
    skv_cache_free(al);
  }
  fe_free(&fe);
}

/* ------------------------------------------------------- determinism */

typedef struct ot_trace {
  int32_t v[1024];
  size_t n;
} ot_trace;

static void ot_push(ot_trace *t, const int32_t *v, size_t n) {
  size_t i;
  for (i = 0; i < n && t->n < sizeof t->v / sizeof t->v[0]; i++) t->v[t->n++] = v[i];
}

static void ot_push_row(skv_cache *c, ot_trace *t, const skv_req *r) {
  int32_t idx[64];
  ot_push(t, &r->req_pool_idx, 1);
  if (r->req_pool_idx >= 0 && r->kv_allocated_len <= 64) {
    OT_INDICES(c, r->req_pool_idx, 0, r->kv_allocated_len, idx);
    ot_push(t, idx, r->kv_allocated_len);
  }
}

/* The same engine's calls on any cache of config (4, 24 pages, 4 rows, 64). */
static void ot_script(skv_cache *c, ot_trace *t) {
  skv_req a = ot_row(c), b = ot_row(c), d, s;
  int32_t e[20];
  skv_match m;
  CHECK_OK(skv_pool_alloc(c, 16, e));
  ot_push(t, e, 16);
  CHECK_OK(skv_alloc_extend(c, &a, 6, NULL));
  CHECK_OK(skv_alloc_extend(c, &b, 9, NULL));
  CHECK_OK(skv_alloc_extend(c, &a, 7, NULL));
  ot_push_row(c, t, &a);
  ot_push_row(c, t, &b);
  CHECK_OK(skv_pool_free(c, e + 4, 8)); /* two pages back, in a given order */
  CHECK_OK(skv_free_req(c, &a));
  CHECK_OK(skv_alloc_extend(c, &b, 14, NULL));
  ot_push_row(c, t, &b);
  d = ot_row(c);
  CHECK_OK(skv_map_prefix(c, &d, e, 4));
  CHECK_OK(skv_alloc_extend(c, &d, 10, NULL));
  ot_push_row(c, t, &d);
  /* a session turn with a trim, then a match that continues the partial page */
  s = ot_row(c);
  s.origin_input_len = 9;
  CHECK_OK(skv_alloc_extend(c, &s, 14, NULL));
  CHECK_OK(skv_commit(c, &s, 12));
  s.output_len = 3;
  s.finished_len = 2;
  ot_push_row(c, t, &s);
  CHECK_OK(skv_cache_finished_req(c, 3, 1, &s, 0));
  s = ot_req();
  CHECK_OK(skv_match_prefix(c, 3, 1, &s, 20, 0, &m));
  CHECK_OK(skv_alloc_extend(c, &s, 9, NULL));
  ot_push_row(c, t, &s);
  CHECK_OK(skv_free_req(c, &b));
  CHECK_OK(skv_alloc_extend(c, &d, 8, NULL));
  ot_push_row(c, t, &d);
  CHECK_OK(skv_commit(c, &s, s.kv_allocated_len - s.kv_committed_len));
  s.origin_input_len = 20;
  CHECK_OK(skv_cache_finished_req(c, 3, 1, &s, 0));
  CHECK_OK(skv_free_req(c, &d));
  CHECK_OK(skv_release_session(c, 3));
  CHECK_OK(skv_pool_free(c, e, 4));
  CHECK_OK(skv_pool_free(c, e + 12, 4));
  CHECK_OK(skv_pool_alloc(c, 20, e));
  ot_push(t, e, 16);
  CHECK_OK(skv_pool_free(c, e, 20));
  CHECK_PAGES(c, 23, 0, 0);
}

static void test_determinism(void) {
  static ot_trace t1, t2;
  skv_cache *c1 = ot_new(4, 24, 4, 64, 0);
  skv_cache *c2 = ot_new(4, 24, 4, 64, 0);
  skv_cache *noise = ot_new(4, 24, 4, 64, 0); /* interleaved: handles share nothing */
  skv_req n;
  if (!c1 || !c2 || !noise) return;
  n = ot_row(noise);
  CHECK_OK(skv_alloc_extend(noise, &n, 21, NULL));
  ot_script(c1, &t1);
  CHECK_OK(skv_free_req(noise, &n));
  ot_script(c2, &t2);
  CHECK(t1.n > 100);
  CHECK_EQ_U64(t1.n, t2.n);
  CHECK(memcmp(t1.v, t2.v, t1.n * sizeof(int32_t)) == 0);
  skv_cache_free(c1);
  skv_cache_free(c2);
  skv_cache_free(noise);
}

/* ---------------------------------------- owned-only calls, external handle */

static void test_external_unsupported(void) {
  fake_engine fe;
  skv_cache *c;
  skv_req r, fresh;
  int32_t idx[8], out[8], rows[1] = {0}, indptr[2], indices[4], last[1];
  uint32_t cnt[1] = {OT_SENTINEL};
  size_t needed = 4242;
  skv_stats s;
  skv_check_report rep;
  skv_engine_hooks hooks;
  int i;

  fe_init(&fe, 4, 64);
  c = fe_cache(&fe, 4, 0);
  if (!c) {
    fe_free(&fe);
    return;
  }
  /* every argument would be valid in owned mode: only the mode is wrong (UNSUPPORTED comes
     after every other error: docs/conventions.md, precedence) */
  r = req_make(0, 4, 8);
  fresh = req_make(0, 0, 0);
  for (i = 0; i < 8; i++) idx[i] = 4 + i;
  ot_fill(out, 8);
  ot_fill(indptr, 2);
  ot_fill(indices, 4);
  ot_fill(last, 1);
  memset(&s, 0x77, sizeof s);
  memset(&rep, 0x77, sizeof rep);
  memset(&hooks, 0, sizeof hooks);
  hooks.struct_size = (uint32_t)sizeof hooks;
  hooks.dec_lock_ref = fe_cb_dec_lock;
  hooks.free_aux = fe_cb_free_aux;

#define OT_UNSUP(req, call, fname)                                                     \
  do {                                                                                 \
    skv_req ot_before_ = *(req);                                                       \
    CHECK_STATUS(call, SKV_ERR_UNSUPPORTED);                                           \
    CHECK_STR_CONTAINS(skv_last_error(), fname);                                       \
    CHECK_REQ_SAME(&ot_before_, (req));                                                \
  } while (0)
  {
    skv_req rowless = req_make(-1, 0, 0);
    OT_UNSUP(&rowless, skv_alloc_row(c, &rowless), "skv_alloc_row");
  }
  OT_UNSUP(&r, skv_alloc_extend(c, &r, 1, NULL), "skv_alloc_extend");
  OT_UNSUP(&r, skv_commit(c, &r, 1), "skv_commit");
  OT_UNSUP(&r, skv_free_req(c, &r), "skv_free_req");
  OT_UNSUP(&r, skv_pool_alloc(c, 4, out), "skv_pool_alloc");
  OT_UNSUP(&r, skv_pool_free(c, idx, 4), "skv_pool_free");
  OT_UNSUP(&r, skv_page_refs(c, idx, 1, cnt), "skv_page_refs");
  OT_UNSUP(&fresh, skv_map_prefix(c, &fresh, idx, 4), "skv_map_prefix");
  OT_UNSUP(&r, skv_publish_prefix(c, &r, 4), "skv_publish_prefix");
  OT_UNSUP(&r, skv_row_indices(c, 0, 0, 4, out), "skv_row_indices");
  OT_UNSUP(&r, skv_cache_check(c, &rep), "skv_cache_check");
  OT_UNSUP(&r, skv_cache_set_hooks(c, &hooks, &fe), "skv_cache_set_hooks");
  OT_UNSUP(&r, skv_build_flashinfer(c, rows, 1, indptr, indices, last, 4, &needed),
           "skv_build_flashinfer");
#undef OT_UNSUP
  {
    /* the stats answer in external mode too, with the pool's fields 0 */
    skv_stats es;
    memset(&es, 0xff, sizeof es);
    CHECK_OK(skv_cache_stats(c, &es));
    CHECK_EQ_U64(es.total_pages, 0);
    CHECK_EQ_U64(es.free_pages, 0);
    CHECK_EQ_U64(es.used_pages, 0);
    CHECK_EQ_U64(es.free_rows, 0);
    CHECK(es.total_rows > 0);
  }
  CHECK(ot_all_sentinel(out, 8));
  CHECK(ot_all_sentinel(indptr, 2) && ot_all_sentinel(indices, 4) && ot_all_sentinel(last, 1));
  CHECK_EQ_U64(cnt[0], OT_SENTINEL);
  CHECK_EQ_U64(needed, 4242);
  {
    skv_stats s2;
    skv_check_report rep2;
    memset(&s2, 0x77, sizeof s2);
    memset(&rep2, 0x77, sizeof rep2);
    CHECK(memcmp(&s, &s2, sizeof s) == 0);
    CHECK(memcmp(&rep, &rep2, sizeof rep) == 0);
  }
  CHECK_NO_CALLS(&fe);

  /* NULL still wins over the mode */
  CHECK_STATUS(skv_alloc_extend(c, NULL, 1, NULL), SKV_ERR_NULL_ARG);
  CHECK_STATUS(skv_cache_stats(c, NULL), SKV_ERR_NULL_ARG);
  /* the hooks did not take: a release calls only the pool ops' callbacks */
  fe_alloc(&fe, 1, 0, 4);
  r = req_make(1, 4, 4);
  r.origin_input_len = 4;
  r.lock_node = 5;
  r.lock_receipt = 6;
  CHECK_OK(skv_cache_finished_req(c, 1, 0, &r, 0));
  CHECK_OK(skv_release_session(c, 1));
  CHECK_EQ_U64(fe_count_kind(&fe, FE_DEC_LOCK), 1);
  CHECK_EQ_U64(fe_count_kind(&fe, FE_FREE_ROW), 1);
  skv_cache_free(c);
  fe_free(&fe);
}

/* ----------------------------------------------------- NULL handles */

static void test_null_handle(void) {
  skv_req r = req_make(-1, 0, 0);
  int32_t idx[4] = {4, 5, 6, 7}, rows[1] = {0}, indptr[2], indices[4], last[1];
  uint32_t cnt[1];
  size_t needed;
  skv_stats s;
  skv_check_report rep;
  CHECK_STATUS(skv_alloc_row(NULL, &r), SKV_ERR_NULL_ARG);
  CHECK_STATUS(skv_alloc_extend(NULL, &r, 1, NULL), SKV_ERR_NULL_ARG);
  CHECK_STATUS(skv_commit(NULL, &r, 1), SKV_ERR_NULL_ARG);
  CHECK_STATUS(skv_free_req(NULL, &r), SKV_ERR_NULL_ARG);
  CHECK_STATUS(skv_pool_alloc(NULL, 4, idx), SKV_ERR_NULL_ARG);
  CHECK_STATUS(skv_pool_free(NULL, idx, 4), SKV_ERR_NULL_ARG);
  CHECK_STATUS(skv_page_refs(NULL, idx, 1, cnt), SKV_ERR_NULL_ARG);
  CHECK_STATUS(skv_map_prefix(NULL, &r, idx, 4), SKV_ERR_NULL_ARG);
  CHECK_STATUS(skv_publish_prefix(NULL, &r, 0), SKV_ERR_NULL_ARG);
  CHECK_STATUS(skv_row_indices(NULL, 0, 0, 1, idx), SKV_ERR_NULL_ARG);
  CHECK_STATUS(skv_cache_stats(NULL, &s), SKV_ERR_NULL_ARG);
  CHECK_STR_CONTAINS(skv_last_error(), "skv_cache_stats");
  CHECK_STATUS(skv_cache_check(NULL, &rep), SKV_ERR_NULL_ARG);
  CHECK_STR_CONTAINS(skv_last_error(), "skv_cache_check");
  CHECK_STATUS(skv_cache_set_hooks(NULL, NULL, NULL), SKV_ERR_NULL_ARG);
  CHECK_STATUS(skv_build_flashinfer(NULL, rows, 1, indptr, indices, last, 4, &needed),
               SKV_ERR_NULL_ARG);
  {
    const uint32_t ps = 4;
    skv_cache *c = ot_new(ps, 8, 2, 32, 0);
    if (c) {
      OT_REFUSED(c, ps, NULL, skv_cache_stats(c, NULL), SKV_ERR_NULL_ARG, "skv_cache_stats");
      OT_REFUSED(c, ps, NULL, skv_cache_check(c, NULL), SKV_ERR_NULL_ARG, "skv_cache_check");
      skv_cache_free(c);
    }
  }
}

/* ------------------------------------------------ which error wins */

/* Bad arguments are reported before a row that is not in use, a record mismatch before the
   cache's state (docs/conventions.md's precedence). */
static void test_error_priority(void) {
  const uint32_t ps = 4;
  skv_cache *c = ot_new(ps, 16, 3, 64, 0);
  skv_req a, stale, idle, spare;
  int32_t e[8], out[8];
  int32_t unused;
  if (!c) return;
  CHECK_OK(skv_pool_alloc(c, 8, e));
  a = ot_row(c);
  a.origin_input_len = 6;
  CHECK_OK(skv_alloc_extend(c, &a, 6, NULL));
  CHECK_OK(skv_commit(c, &a, 6));
  CHECK_OK(skv_cache_finished_req(c, 1, 0, &a, 0)); /* an idle slot holds the row */
  spare = ot_row(c);
  stale = ot_row(c); /* the third row, given back: not in use */
  unused = stale.req_pool_idx;
  CHECK_OK(skv_free_req(c, &stale));
  stale = req_make(unused, 0, 0);

  /* arguments alone bad, on a row not in use: INVALID_ARG, not NOT_FOUND */
  OT_REFUSED(c, ps, &stale, skv_alloc_extend(c, &stale, 65, NULL), SKV_ERR_INVALID_ARG,
             "skv_alloc_extend");
  OT_REFUSED(c, ps, &stale, skv_commit(c, &stale, 1), SKV_ERR_INVALID_ARG, "skv_commit");
  OT_REFUSED(c, ps, &stale, skv_map_prefix(c, &stale, e, 6), SKV_ERR_INVALID_ARG, "skv_map_prefix");
  OT_REFUSED(c, ps, &stale, skv_publish_prefix(c, &stale, 6), SKV_ERR_INVALID_ARG,
             "skv_publish_prefix");
  OT_REFUSED(c, ps, &stale, skv_publish_prefix(c, &stale, 4), SKV_ERR_INVALID_ARG,
             "skv_publish_prefix"); /* > committed 0 */
  OT_REFUSED(c, ps, &stale, skv_free_tail(c, &stale, 1), SKV_ERR_INVALID_ARG, "skv_free_tail");
  OT_REFUSED(c, ps, NULL, skv_row_indices(c, unused, 5, 4, out), SKV_ERR_INVALID_ARG,
             "skv_row_indices");
  OT_REFUSED(c, ps, NULL, skv_free_aligned(c, unused, 0, 65), SKV_ERR_INVALID_ARG,
             "skv_free_aligned");
  /* then the row not in use */
  OT_REFUSED(c, ps, &stale, skv_alloc_extend(c, &stale, 1, NULL), SKV_ERR_NOT_FOUND, "skv_alloc_extend");
  OT_REFUSED(c, ps, &stale, skv_map_prefix(c, &stale, e, 4), SKV_ERR_NOT_FOUND, "skv_map_prefix");
  OT_REFUSED(c, ps, &stale, skv_free_req(c, &stale), SKV_ERR_NOT_FOUND, "skv_free_req");

  /* arguments alone bad on the idle slot's row: INVALID_ARG, not STATE */
  idle = req_make(a.req_pool_idx, 6, 6);
  OT_REFUSED(c, ps, &idle, skv_alloc_extend(c, &idle, 59, NULL), SKV_ERR_INVALID_ARG, "skv_alloc_extend");
  OT_REFUSED(c, ps, &idle, skv_commit(c, &idle, 1), SKV_ERR_INVALID_ARG, "skv_commit");
  OT_REFUSED(c, ps, &idle, skv_publish_prefix(c, &idle, 2), SKV_ERR_INVALID_ARG,
             "skv_publish_prefix");
  OT_REFUSED(c, ps, &idle, skv_publish_prefix(c, &idle, 8), SKV_ERR_INVALID_ARG,
             "skv_publish_prefix");
  OT_REFUSED(c, ps, &idle, skv_free_tail(c, &idle, 7), SKV_ERR_INVALID_ARG, "skv_free_tail");
  OT_REFUSED(c, ps, &idle, skv_map_prefix(c, &idle, e, 6), SKV_ERR_INVALID_ARG, "skv_map_prefix");
  OT_REFUSED(c, ps, NULL, skv_free_aligned(c, a.req_pool_idx, 0, 65), SKV_ERR_INVALID_ARG,
             "skv_free_aligned");

  CHECK_OK(skv_release_session(c, 1));
  CHECK_OK(skv_free_req(c, &spare));
  CHECK_OK(skv_pool_free(c, e, 8));
  CHECK_PAGES(c, 15, 0, 0);
  CHECK_EQ_U64(ot_stats(c).free_rows, 3);
  skv_cache_free(c);
}

int main(void) {
  test_cache_new();
  test_req_init();
  test_alloc_row();
  test_alloc_extend();
  test_commit();
  test_free_req();
  test_pool();
  test_prefix_sharing();
  test_row_indices();
  test_flashinfer();
  test_streaming_session();
  test_session_owns_row();
  test_record_mismatch();
  test_primitives_owned();
  test_error_priority();
  test_hooks();
  test_determinism();
  test_external_unsupported();
  test_null_handle();
  return ctest_summary();
}
