/* docs/transfer.md: a session moves between two instances (two owned-mode handles) with real
 * bytes. Each instance's KV is an arena of two regions (one layer's K and V), page-major
 * within a region; the "transfer engine" is memcpy over the ranges skv_transfer_descs gives.
 * Session 1 (a tree prefix of one page, then its own tokens, a partial last page) moves from A
 * to B and is checked token by token at B; then B's move back fails, A says the epoch is
 * absent, and the session serves at B again. Both audits are clean at the end. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "skv.h"

static int failures;
#define EXPECT(cond)                                                      \
  do {                                                                    \
    if (!(cond)) {                                                        \
      fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #cond); \
      failures++;                                                         \
    }                                                                     \
  } while (0)
#define TRY(call)                                                                 \
  do {                                                                            \
    skv_status s_ = (call);                                                       \
    if (s_ != SKV_OK) {                                                           \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, skv_status_str(s_), \
              skv_last_error());                                                  \
      exit(1);                                                                    \
    }                                                                             \
  } while (0)

#define PS 16
#define PAGES 32
#define TOKEN_BYTES 8 /* one token's bytes in one region */
#define PAGE_BYTES (PS * TOKEN_BYTES)
#define REGIONS 2
#define LEN 57 /* 3 full pages and 9 tokens */

typedef struct instance {
  skv_cache *c;
  uint8_t kv[REGIONS][PAGES * PAGE_BYTES];
  uint64_t base[REGIONS];
  skv_kv_layout layout;
} instance;

static void instance_new(instance *in) {
  skv_cache_config cfg;
  int r;
  memset(&cfg, 0, sizeof cfg);
  cfg.struct_size = sizeof cfg;
  cfg.page_size = PS;
  cfg.num_token_slots = PAGES * PS;
  cfg.num_rows = 4;
  cfg.max_context_len = 256;
  cfg.kv_layout_id = 0x5eed; /* both ends: same model, same layout */
  TRY(skv_cache_new(&cfg, &in->c));
  memset(in->kv, 0, sizeof in->kv);
  for (r = 0; r < REGIONS; r++) in->base[r] = (uint64_t)(uintptr_t)in->kv[r];
  in->layout.struct_size = sizeof in->layout;
  in->layout.n_regions = REGIONS;
  in->layout.region_base = in->base;
  in->layout.page_stride = PAGE_BYTES;
  in->layout.page_bytes = PAGE_BYTES;
}

/* The bytes of token `pos` in region `r`: a function of both. */
static uint8_t tag(uint32_t pos, int r, int byte) { return (uint8_t)(pos * 7 + r * 31 + byte + 1); }

/* Visits every token of the session's row: `write` stamps the tags, else they are checked. */
static int tokens(instance *in, int32_t row, uint32_t len, int write) {
  int32_t slots[LEN];
  uint32_t p;
  int r, b, bad = 0;
  TRY(skv_row_indices(in->c, row, 0, len, slots));
  for (p = 0; p < len; p++) {
    for (r = 0; r < REGIONS; r++) {
      uint8_t *at = in->kv[r] + (size_t)slots[p] * TOKEN_BYTES;
      for (b = 0; b < TOKEN_BYTES; b++) {
        if (write) at[b] = tag(p, r, b);
        else bad += at[b] != tag(p, r, b);
      }
    }
  }
  return bad;
}

static uint64_t free_pages(skv_cache *c) {
  skv_stats st;
  TRY(skv_cache_stats(c, &st));
  return st.free_pages;
}

/* The unit's page ids (the source's), from its header (docs/tiers.md#export-and-import). */
static const int32_t *unit_ids(const uint8_t *unit, uint32_t *n_full) {
  uint16_t header_len;
  memcpy(&header_len, unit + 10, 2);
  memcpy(n_full, unit + 80, 4);
  return (const int32_t *)(unit + header_len);
}

/* The destination's read: the ranges of the source's pages into its own, then memcpy. */
static void read_pages(instance *dst, const int32_t *out_pages, instance *src,
                       const uint8_t *unit) {
  uint32_t n_full;
  const int32_t *ids = unit_ids(unit, &n_full);
  skv_xfer_desc descs[REGIONS * PAGES];
  size_t n = 0, i;
  /* doc:descs */
  TRY(skv_transfer_descs(&dst->layout, out_pages, &src->layout, ids, n_full, descs,
                         REGIONS * PAGES, &n));
  for (i = 0; i < n; i++) /* a transfer engine's READ: one descriptor a range */
    memcpy((void *)(uintptr_t)descs[i].local_addr, (const void *)(uintptr_t)descs[i].remote_addr,
           descs[i].len);
  /* doc:end */
  EXPECT(n <= REGIONS * n_full);
}

int main(void) {
  static instance a, b;
  skv_req r;
  skv_match m;
  skv_import in;
  uint8_t unit[512];
  int32_t prefix[PS], out_pages[PAGES];
  size_t len = 0, n = 0;
  uint64_t t_out = 0, t_in = 0, a_free0;
  uint32_t epoch;
  int32_t state = -1;
  skv_check_report rep;

  instance_new(&a);
  instance_new(&b);
  a_free0 = free_pages(a.c);

  /* Session 1's first turn at A, under a one-page tree prefix. */
  TRY(skv_req_init(&r));
  TRY(skv_alloc_row(a.c, &r));
  TRY(skv_pool_alloc(a.c, PS, prefix));
  TRY(skv_map_prefix(a.c, &r, prefix, PS));
  TRY(skv_alloc_extend(a.c, &r, LEN - PS, NULL));
  TRY(skv_commit(a.c, &r, LEN - PS));
  EXPECT(tokens(&a, r.req_pool_idx, LEN, 1) == 0);
  r.origin_input_len = LEN;
  TRY(skv_cache_finished_req(a.c, 1, 0, &r, 0));

  /* doc:move */
  /* Source: the unit, under a new epoch; its pages stay pinned. */
  TRY(skv_session_export(a.c, 1, 0, SKV_EXPORT_MOVE, unit, sizeof unit, &len, &t_out));
  /* Destination: the session's own pages reserved (no prefix: it travels), then read. */
  memset(&in, 0, sizeof in);
  in.struct_size = sizeof in;
  in.session_id = 1;
  in.row = -1;
  in.aux_state = in.aux_track[0] = in.aux_track[1] = -1;
  TRY(skv_session_import(b.c, &in, unit, len, out_pages, PAGES, &n, &t_in));
  read_pages(&b, out_pages, &a, unit);
  TRY(skv_ticket_done(b.c, t_in, 0)); /* the commit point */
  /* Source, on the destination's notification: released. */
  TRY(skv_ticket_done(a.c, t_out, 0));
  /* doc:end */

  EXPECT(n == 4);
  EXPECT(free_pages(a.c) == a_free0 - 1); /* only the tree's prefix page stays held */
  TRY(skv_release_branch(a.c, 1, 0));     /* gone already: nothing to release */
  TRY(skv_req_init(&r));
  TRY(skv_match_prefix(b.c, 1, 0, &r, LEN, 0, &m));
  EXPECT(m.hit == 1 && r.kv_committed_len == LEN && r.cache_protected_len == 0);
  EXPECT(tokens(&b, r.req_pool_idx, LEN, 0) == 0); /* every byte, token by token */
  TRY(skv_hand_back(b.c, 1, 0, &r));

  /* Back to A, and the read fails: A releases its reservation and says the epoch is absent;
   * B's session serves again. */
  TRY(skv_session_export(b.c, 1, 0, SKV_EXPORT_MOVE, unit, sizeof unit, &len, &t_out));
  memcpy(&epoch, unit + 28, 4);
  EXPECT(epoch == 2);
  EXPECT(skv_release_branch(b.c, 1, 0) == SKV_ERR_STATE); /* the read may still touch it */
  TRY(skv_session_import(a.c, &in, unit, len, out_pages, PAGES, &n, &t_in));
  TRY(skv_ticket_done(a.c, t_in, 1));
  TRY(skv_session_fence(a.c, unit, len, &state)); /* what B asks A: this unit's move */
  EXPECT(state == SKV_FENCE_ABSENT);
  EXPECT(skv_session_import(a.c, &in, unit, len, out_pages, PAGES, &n, &t_in) == SKV_ERR_STATE);
  TRY(skv_ticket_done(b.c, t_out, 1));
  TRY(skv_req_init(&r));
  TRY(skv_match_prefix(b.c, 1, 0, &r, LEN, 0, &m));
  EXPECT(m.hit == 1 && tokens(&b, r.req_pool_idx, LEN, 0) == 0);
  TRY(skv_hand_back(b.c, 1, 0, &r));

  TRY(skv_cache_check(a.c, &rep));
  EXPECT(rep.violations == 0);
  TRY(skv_cache_check(b.c, &rep));
  EXPECT(rep.violations == 0);
  skv_cache_free(a.c);
  skv_cache_free(b.c);
  if (failures) return 1;
  printf("test_doc_transfer: ok\n");
  return 0;
}
