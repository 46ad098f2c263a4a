/* The serving engines of one instance: three libskv handles, each over its own host-memory KV
 * arena (the bytes NIXL moves): owned mode, external mode (the engine's own req_to_token rows
 * and free list, as docs/external-mode.md), and a hybrid model in owned mode (a full pool and
 * a sliding-window pool). A turn writes each new token's KV, one pattern byte a function of
 * (session, position, pool, region, byte); a hit checks every byte of the history it reuses. */
#ifndef SKV_NIXL_ENGINES_H
#define SKV_NIXL_ENGINES_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

#define PS 16              /* tokens per page */
#define TOK_BYTES 128      /* bytes a token takes in one region */
#define PAGE_BYTES (PS * TOK_BYTES)
#define FULL_REGIONS 4     /* 2 layers x (K, V) */
#define SWA_REGIONS 2      /* 1 sliding-window layer x (K, V) */
#define FULL_PAGES 512     /* page 0 included */
#define SWA_PAGES 160
#define SWA_WINDOW 128
#define ROWS 32
#define MAX_LEN 8192
#define EXT_MAX_LEN 1024   /* the external engine's row width */
#define MAX_SID 64
#define KV_LAYOUT_ID 0x4e49584cULL

enum kind { K_OWNED, K_EXT, K_HYB, K_KINDS };
static const char *const kind_name[K_KINDS] = {"owned", "external", "hybrid"};

/* One pool's bytes: region r of page p at base[r] + p * PAGE_BYTES (page-major within a
 * region, so consecutive page ids are adjacent memory: what lets descriptors coalesce). */
typedef struct pool_mem {
  uint8_t *arena;
  size_t bytes;
  uint32_t n_regions, n_pages;
  uint64_t base[FULL_REGIONS];
  skv_kv_layout layout;
} pool_mem;

/* What the peer needs to address our arenas: sent at setup, one per engine. */
typedef struct arena_info {
  uint32_t n_regions[2];
  uint64_t base[2][FULL_REGIONS];
} arena_info;

/* External mode: the engine owns req_to_token and the page free list (docs/external-mode.md). */
typedef struct ext_pool {
  int32_t r2t[ROWS][EXT_MAX_LEN];
  int32_t owner[FULL_PAGES]; /* row + 1 owning the page, 0 free */
  int32_t free_pages[FULL_PAGES], n_free;
  int row_used[ROWS];
  int double_frees;
} ext_pool;

typedef struct engine {
  int kind;
  skv_cache *c;
  pool_mem full, swa; /* swa.n_pages 0 without an SWA pool */
  ext_pool *x;        /* external mode only */
  uint32_t len[MAX_SID]; /* committed tokens of each session held here; 0 = not here */
} engine;

static inline void pool_mem_init(pool_mem *m, uint32_t n_regions, uint32_t n_pages) {
  uint32_t r;
  memset(m, 0, sizeof *m);
  m->n_regions = n_regions;
  m->n_pages = n_pages;
  m->bytes = (size_t)n_regions * n_pages * PAGE_BYTES;
  m->arena = (uint8_t *)aligned_alloc(4096, m->bytes);
  memset(m->arena, 0, m->bytes);
  for (r = 0; r < n_regions; r++)
    m->base[r] = (uint64_t)(uintptr_t)(m->arena + (size_t)r * n_pages * PAGE_BYTES);
  m->layout.struct_size = (uint32_t)sizeof(skv_kv_layout);
  m->layout.n_regions = n_regions;
  m->layout.region_base = m->base;
  m->layout.page_stride = PAGE_BYTES;
  m->layout.page_bytes = PAGE_BYTES;
}

/* ------------------------------------------------------------------ bytes */

static inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

static inline uint64_t token_hash(uint64_t sid, uint32_t pos, int pool, uint32_t region) {
  return mix64((sid << 40) ^ ((uint64_t)pos << 8) ^ ((uint64_t)pool << 4) ^ region);
}

static inline uint8_t *token_at(const pool_mem *m, uint32_t region, int32_t page, uint32_t off) {
  return m->arena + (size_t)region * m->n_pages * PAGE_BYTES + (size_t)page * PAGE_BYTES +
         (size_t)off * TOK_BYTES;
}

/* The forward pass: token `pos` of `sid`, in every region of the pool, at (page, off). */
static inline void write_token(const pool_mem *m, int pool, uint64_t sid, uint32_t pos,
                               int32_t page, uint32_t off) {
  uint32_t r, i;
  for (r = 0; r < m->n_regions; r++) {
    uint64_t h = token_hash(sid, pos, pool, r);
    uint8_t *d = token_at(m, r, page, off);
    for (i = 0; i < TOK_BYTES; i++) d[i] = (uint8_t)((h >> ((i & 7) * 8)) + i);
  }
}

/* How many bytes of token `pos` differ from what its forward pass wrote. */
static inline size_t check_token(const pool_mem *m, int pool, uint64_t sid, uint32_t pos,
                                 int32_t page, uint32_t off) {
  uint32_t r, i;
  size_t bad = 0;
  for (r = 0; r < m->n_regions; r++) {
    uint64_t h = token_hash(sid, pos, pool, r);
    const uint8_t *d = token_at(m, r, page, off);
    for (i = 0; i < TOK_BYTES; i++) bad += d[i] != (uint8_t)((h >> ((i & 7) * 8)) + i);
  }
  return bad;
}

/* ---------------------------------------------------------- external mode */

static int ext_read_row(void *ud, int32_t row, uint32_t start, uint32_t end, int32_t *out) {
  ext_pool *x = (ext_pool *)ud;
  memcpy(out, &x->r2t[row][start], (end - start) * sizeof(int32_t));
  return 0;
}

/* Ranges start on a page boundary: a page is freed when its first index shows up. */
static int ext_free_kv(void *ud, const int32_t *indices, size_t n) {
  ext_pool *x = (ext_pool *)ud;
  size_t i;
  for (i = 0; i < n; i++) {
    int32_t page = indices[i] / PS;
    if (i > 0 && indices[i - 1] / PS == page) continue;
    if (x->owner[page] == 0) {
      x->double_frees++;
      return -1;
    }
    x->owner[page] = 0;
    x->free_pages[x->n_free++] = page;
  }
  return 0;
}

static int ext_free_row(void *ud, int32_t row) {
  ext_pool *x = (ext_pool *)ud;
  if (!x->row_used[row]) {
    x->double_frees++;
    return -1;
  }
  x->row_used[row] = 0;
  return 0;
}

static inline int32_t ext_take_row(ext_pool *x) {
  int32_t r;
  for (r = 0; r < ROWS; r++)
    if (!x->row_used[r]) {
      x->row_used[r] = 1;
      return r;
    }
  return -1;
}

/* Maps positions [from, to) of `row`: a position inside the row's partial page reuses it. */
static inline int ext_extend(ext_pool *x, int32_t row, uint32_t from, uint32_t to) {
  uint32_t p;
  for (p = from; p < to; p++) {
    if (p % PS == 0) {
      int32_t page;
      if (x->n_free == 0) return -1;
      page = x->free_pages[--x->n_free];
      x->owner[page] = row + 1;
      x->r2t[row][p] = page * PS;
    } else {
      x->r2t[row][p] = x->r2t[row][p - 1] + 1;
    }
  }
  return 0;
}

/* ------------------------------------------------------------ the engines */

static inline void engine_init(engine *e, int kind) {
  skv_cache_config cfg;
  memset(e, 0, sizeof *e);
  e->kind = kind;
  pool_mem_init(&e->full, FULL_REGIONS, FULL_PAGES);
  if (kind == K_HYB) pool_mem_init(&e->swa, SWA_REGIONS, SWA_PAGES);
  memset(&cfg, 0, sizeof cfg);
  cfg.struct_size = (uint32_t)sizeof cfg;
  cfg.page_size = PS;
  cfg.num_rows = ROWS;
  cfg.kv_layout_id = KV_LAYOUT_ID + (uint64_t)kind;
  if (kind == K_EXT) {
    skv_pool_ops ops;
    int32_t p;
    e->x = (ext_pool *)calloc(1, sizeof *e->x);
    for (p = FULL_PAGES - 1; p >= 1; p--) e->x->free_pages[e->x->n_free++] = p;
    cfg.max_context_len = EXT_MAX_LEN;
    memset(&ops, 0, sizeof ops);
    ops.struct_size = (uint32_t)sizeof ops;
    ops.read_row = ext_read_row;
    ops.free_kv = ext_free_kv;
    ops.free_row = ext_free_row;
    CHECK_OK(skv_cache_new_external(&cfg, &ops, e->x, &e->c));
  } else {
    cfg.max_context_len = MAX_LEN;
    cfg.num_token_slots = (uint64_t)FULL_PAGES * PS;
    if (kind == K_HYB) {
      cfg.swa_num_token_slots = (uint64_t)SWA_PAGES * PS;
      cfg.swa_window = SWA_WINDOW;
    }
    CHECK_OK(skv_cache_new(&cfg, &e->c));
  }
}

static inline void engine_fini(engine *e) {
  skv_cache_free(e->c);
  free(e->full.arena);
  free(e->swa.arena);
  free(e->x);
  memset(e, 0, sizeof *e);
}

/* Free pages as the engine's accounting reports them: libskv's stats (owned), the engine's
 * own free list (external). [0] full pool, [1] SWA pool. */
static inline void free_pages(const engine *e, uint64_t out[2]) {
  skv_stats s;
  if (e->kind == K_EXT) {
    out[0] = (uint64_t)e->x->n_free;
    out[1] = 0;
    return;
  }
  memset(&s, 0, sizeof s);
  CHECK_OK(skv_cache_stats(e->c, &s));
  out[0] = s.free_pages;
  out[1] = s.swa_free_pages;
}

/* The full pool's and SWA pool's token slot of each position [0, n) of `row` (SWA: 0 where
 * the window passed, or no SWA pool). */
static inline void row_slots(const engine *e, int32_t row, uint32_t n, int32_t *full,
                             int32_t *swa) {
  if (e->kind == K_EXT) {
    memcpy(full, e->x->r2t[row], n * sizeof(int32_t));
  } else {
    CHECK_OK(skv_row_indices(e->c, row, 0, n, full));
  }
  if (e->kind == K_HYB) {
    CHECK_OK(skv_row_swa_indices(e->c, row, 0, n, swa));
  } else {
    memset(swa, 0, n * sizeof(int32_t));
  }
}

/* Bytes of positions [from, to) that differ from their pattern, read through the row. */
static inline size_t check_row(const engine *e, uint64_t sid, int32_t row, uint32_t from,
                               uint32_t to, int write) {
  int32_t *full = (int32_t *)malloc(to * sizeof(int32_t));
  int32_t *swa = (int32_t *)malloc(to * sizeof(int32_t));
  size_t bad = 0;
  uint32_t p;
  row_slots(e, row, to, full, swa);
  for (p = from; p < to; p++) {
    if (write) {
      write_token(&e->full, 0, sid, p, full[p] / PS, (uint32_t)full[p] % PS);
      if (swa[p] > 0) write_token(&e->swa, 1, sid, p, swa[p] / PS, (uint32_t)swa[p] % PS);
    } else {
      bad += check_token(&e->full, 0, sid, p, full[p] / PS, (uint32_t)full[p] % PS);
      if (swa[p] > 0) bad += check_token(&e->swa, 1, sid, p, swa[p] / PS, (uint32_t)swa[p] % PS);
    }
  }
  free(full);
  free(swa);
  return bad;
}

/* One turn of session `sid`: the history (if any) must hit whole and read back intact; then
 * `add - 1` prompt tokens and one decoded token are written. The hybrid model's first turn
 * slides its window (skv_swa_evict), so its unit names only the window's SWA pages. */
static inline void engine_turn(engine *e, uint64_t sid, uint32_t add) {
  uint32_t have = e->len[sid], prompt = have + add - 1;
  skv_req req;
  skv_match m;
  CHECK_OK(skv_req_init(&req));
  req.origin_input_len = prompt;
  CHECK_OK(skv_match_prefix(e->c, sid, 0, &req, prompt - 1, 0, &m));
  CHECK_EQ_INT(m.hit, have > 0);
  CHECK_EQ_INT(req.kv_committed_len, have);
  if (have > 0 && m.hit) CHECK_EQ_U64(check_row(e, sid, req.req_pool_idx, 0, have, 0), 0);
  if (!m.hit) {
    if (e->kind == K_EXT) {
      req.req_pool_idx = ext_take_row(e->x);
      CHECK(req.req_pool_idx >= 0);
    } else {
      CHECK_OK(skv_alloc_row(e->c, &req));
    }
  }
  if (e->kind == K_EXT) {
    CHECK(ext_extend(e->x, req.req_pool_idx, req.kv_allocated_len, prompt + 1) == 0);
    req.kv_allocated_len = prompt + 1;
    req.kv_committed_len = prompt + 1;
  } else {
    CHECK_OK(skv_alloc_extend(e->c, &req, prompt - req.kv_allocated_len, NULL));
    CHECK_OK(skv_commit(e->c, &req, prompt - req.kv_committed_len));
    CHECK_OK(skv_alloc_extend(e->c, &req, 1, NULL));
    CHECK_OK(skv_commit(e->c, &req, 1));
  }
  req.output_len = 1;
  req.finished_len = 1;
  check_row(e, sid, req.req_pool_idx, have, prompt + 1, 1);
  if (e->kind == K_HYB && have == 0) {
    uint32_t freed = 0;
    CHECK_OK(skv_swa_evict(e->c, &req, prompt + 1, SWA_WINDOW, 1, -1, SKV_SWA_NO_PREFIX_SHARING,
                           &freed));
    CHECK(freed > 0 || prompt + 1 < SWA_WINDOW + PS);
  }
  CHECK_OK(skv_cache_finished_req(e->c, sid, 0, &req, 0));
  e->len[sid] = prompt + 1;
}

/* Every page free again, the audit clean (owned), no double free (external). */
static inline void engine_check_empty(engine *e) {
  uint64_t f[2];
  free_pages(e, f);
  CHECK_EQ_U64(f[0], FULL_PAGES - 1);
  if (e->kind == K_HYB) CHECK_EQ_U64(f[1], SWA_PAGES - 1);
  if (e->kind == K_EXT) {
    CHECK_EQ_INT(e->x->double_frees, 0);
  } else {
    skv_check_report rep;
    CHECK_OK(skv_cache_check(e->c, &rep));
    CHECK_EQ_U64(rep.violations, 0);
  }
}

#endif
