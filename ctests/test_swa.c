/* Hybrid (full + sliding-window) pools in external mode: skv_pool_ops.free_kv_segment gets
 * every free split at the SWA cursor as sglang's free_kv_row_segments splits it, skv_swa_evict
 * takes sglang's window steps, and every refusal (a callback set that cannot express a free,
 * bad arguments, owned mode, an idle session's row) changes nothing. The golden numbers are
 * sglang 0.5.23's own functions run on the same inputs. */
#include "common.h"

#define ROWS 4
#define COLS 128
#define PS 4

typedef struct {
  int32_t row;
  uint32_t first_pos, n, pools;
  int32_t first_index;
} piece;

typedef struct {
  piece pieces[16];
  size_t n_pieces;
  size_t freed_whole; /* indices handed to free_kv */
  int bad;
  int fail; /* free_kv_segment returns -1 */
} engine;

/* req_to_token[row][pos] = 1000 * row + pos */
static int cb_read_row(void *ud, int32_t row, uint32_t start, uint32_t end, int32_t *out) {
  uint32_t p;
  (void)ud;
  for (p = start; p < end; p++) out[p - start] = 1000 * row + (int32_t)p;
  return 0;
}

static int cb_free_kv(void *ud, const int32_t *indices, size_t n) {
  engine *e = (engine *)ud;
  (void)indices;
  e->freed_whole += n;
  return 0;
}

static int cb_free_row(void *ud, int32_t row) {
  (void)ud;
  (void)row;
  return 0;
}

static int cb_segment(void *ud, int32_t row, uint32_t first_pos, const int32_t *indices,
                      size_t n, uint32_t pools) {
  engine *e = (engine *)ud;
  size_t k;
  for (k = 0; k < n; k++)
    if (indices[k] != 1000 * row + (int32_t)(first_pos + k)) e->bad++;
  if (e->n_pieces < 16) {
    piece p;
    p.row = row;
    p.first_pos = first_pos;
    p.n = (uint32_t)n;
    p.pools = pools;
    p.first_index = n ? indices[0] : -1;
    e->pieces[e->n_pieces++] = p;
  }
  return e->fail ? -1 : 0;
}

/* ops with free_kv_segment (segments != 0) or free_kv only, at a given struct_size */
static skv_cache *hybrid_cache(engine *e, int segments, uint32_t struct_size) {
  skv_cache_config cfg;
  skv_pool_ops ops;
  skv_cache *c = NULL;
  memset(e, 0, sizeof *e);
  memset(&cfg, 0, sizeof cfg);
  cfg.struct_size = (uint32_t)sizeof cfg;
  cfg.page_size = PS;
  cfg.num_rows = ROWS;
  cfg.max_context_len = COLS;
  memset(&ops, 0, sizeof ops);
  ops.struct_size = struct_size;
  ops.read_row = cb_read_row;
  ops.free_row = cb_free_row;
  if (segments)
    ops.free_kv_segment = cb_segment;
  else
    ops.free_kv = cb_free_kv;
  CHECK_OK(skv_cache_new_external(&cfg, &ops, e, &c));
  return c;
}

/* protected 4, floor 13 (swa_dead_lo 16), cursor 24, 30 tokens */
static skv_req hybrid_req(void) {
  skv_req r = req_make(0, 30, 30);
  r.cache_protected_len = 4;
  r.swa_evict_floor = 13;
  r.swa_evicted_seqlen = 24;
  r.origin_input_len = 20;
  r.output_len = 10;
  return r;
}

#define CHECK_PIECE(e, i, first, count, pools_)     \
  do {                                              \
    CHECK_EQ_INT((e).pieces[i].first_pos, (first)); \
    CHECK_EQ_INT((e).pieces[i].n, (count));         \
    CHECK_EQ_INT((e).pieces[i].pools, (pools_));    \
  } while (0)

static void layout(void) {
  skv_req r;
  CHECK_OK(skv_req_init(&r));
  CHECK_EQ_INT(r.swa_evict_floor, 0);
  CHECK(sizeof(skv_pool_ops) == 56);
  /* swa_evict_floor fills what was skv_req's padding after finished_len's run of u32s. */
  CHECK(offsetof(skv_req, swa_evict_floor) == 24 && sizeof(skv_req) == 80);
  CHECK_EQ_INT(SKV_POOL_BOTH, SKV_POOL_FULL | SKV_POOL_SWA);
}

static void creation_needs_a_kv_free(void) {
  engine e;
  skv_cache_config cfg;
  skv_pool_ops ops;
  skv_cache *c = NULL;
  memset(&cfg, 0, sizeof cfg);
  cfg.struct_size = (uint32_t)sizeof cfg;
  cfg.page_size = PS;
  cfg.num_rows = ROWS;
  cfg.max_context_len = COLS;
  memset(&ops, 0, sizeof ops);
  ops.struct_size = (uint32_t)sizeof ops;
  ops.read_row = cb_read_row;
  ops.free_row = cb_free_row;
  CHECK_STATUS(skv_cache_new_external(&cfg, &ops, &e, &c), SKV_ERR_NULL_ARG);
  CHECK_MSG_HAS("free_kv_segment");
  CHECK(c == NULL);
}

static void trim_splits_at_the_cursor(void) {
  engine e;
  skv_cache *c = hybrid_cache(&e, 1, sizeof(skv_pool_ops));
  skv_req r = hybrid_req();
  CHECK_OK(skv_trim_overshoot(c, &r, 0));
  /* sglang: free_full_segments([20, 24)), then free_segments([24, 30)) */
  CHECK_EQ_INT(e.n_pieces, 2);
  CHECK_PIECE(e, 0, 20, 4, SKV_POOL_FULL);
  CHECK_PIECE(e, 1, 24, 6, SKV_POOL_BOTH);
  CHECK_EQ_INT(e.pieces[0].first_index, 20);
  CHECK_EQ_INT(e.bad, 0);
  CHECK_EQ_INT(r.swa_evicted_seqlen, 20);
  CHECK_EQ_INT(r.swa_evict_floor, 13);
  skv_cache_free(c);
}

static void release_and_held(void) {
  engine e;
  skv_cache *c = hybrid_cache(&e, 1, sizeof(skv_pool_ops));
  skv_req r = hybrid_req();
  skv_held h;
  r.origin_input_len = 30;
  r.output_len = 0;
  CHECK_OK(skv_cache_finished_req(c, 7, 0, &r, 0));
  CHECK_EQ_INT(e.n_pieces, 0);
  CHECK_OK(skv_session_held(c, NULL, 0, &h));
  /* sglang's kv_private_swa_tokens: 32 - 4 - (24 - 16) = 20 */
  CHECK_EQ_U64(h.full_tokens, 28);
  CHECK_EQ_U64(h.swa_tokens, 20);
  CHECK_OK(skv_release_session(c, 7));
  CHECK_EQ_INT(e.n_pieces, 3);
  CHECK_PIECE(e, 0, 16, 8, SKV_POOL_FULL);
  CHECK_PIECE(e, 1, 4, 12, SKV_POOL_BOTH);
  CHECK_PIECE(e, 2, 24, 6, SKV_POOL_BOTH);
  skv_cache_free(c);
}

static void window_steps(void) {
  engine e;
  skv_cache *c = hybrid_cache(&e, 1, sizeof(skv_pool_ops));
  skv_req r = req_make(1, 40, 40);
  uint32_t freed = 99;
  r.cache_protected_len = 4;
  r.swa_evict_floor = 13;
  /* below the interval: nothing moves */
  CHECK_OK(skv_swa_evict(c, &r, 40, 8, 33, -1, 0, &freed));
  CHECK_EQ_INT(freed, 0);
  CHECK_EQ_INT(r.swa_evicted_seqlen, 0);
  /* sglang: the cursor rises to swa_dead_lo 16, then to 40 - 8 = 32 */
  CHECK_OK(skv_swa_evict(c, &r, 40, 8, 1, -1, 0, &freed));
  CHECK_EQ_INT(freed, 16);
  CHECK_EQ_INT(r.swa_evicted_seqlen, 32);
  CHECK_EQ_INT(e.n_pieces, 1);
  CHECK_PIECE(e, 0, 16, 16, SKV_POOL_SWA);
  CHECK_EQ_INT(e.pieces[0].first_index, 1016);
  /* retain_floor caps it; without prefix sharing the window is exact */
  r = req_make(1, 40, 40);
  r.swa_evict_floor = 13;
  e.n_pieces = 0;
  CHECK_OK(skv_swa_evict(c, &r, 40, 6, 1, 21, 0, NULL));
  CHECK_EQ_INT(r.swa_evicted_seqlen, 20);
  CHECK_OK(skv_swa_evict(c, &r, 40, 6, 1, 21, SKV_SWA_NO_PREFIX_SHARING, &freed));
  CHECK_EQ_INT(r.swa_evicted_seqlen, 32);
  CHECK_EQ_INT(freed, 12);
  CHECK_EQ_INT(e.n_pieces, 2);
  CHECK_PIECE(e, 1, 20, 12, SKV_POOL_SWA);
  /* no row: nothing to do */
  r = req_make(-1, 0, 0);
  CHECK_OK(skv_swa_evict(c, &r, 0, 8, 1, -1, 0, &freed));
  CHECK_EQ_INT(freed, 0);
  skv_cache_free(c);
}

static void evict_errors(void) {
  engine e;
  skv_cache *c = hybrid_cache(&e, 1, sizeof(skv_pool_ops));
  skv_cache *plain = hybrid_cache(&e, 0, sizeof(skv_pool_ops));
  skv_cache *owned = NULL;
  skv_cache_config cfg;
  skv_req r = req_make(0, 40, 40), before;
  uint32_t freed = 77;
  r.swa_evict_floor = 13;
  before = r;
  CHECK_STATUS(skv_swa_evict(c, &r, 40, 0, 1, -1, 0, &freed), SKV_ERR_INVALID_ARG);
  CHECK_MSG_HAS("skv_swa_evict");
  CHECK_MSG_HAS("window 0");
  CHECK_STATUS(skv_swa_evict(c, &r, 41, 8, 1, -1, 0, &freed), SKV_ERR_INVALID_ARG);
  CHECK_MSG_HAS("pre_len 41");
  CHECK_STATUS(skv_swa_evict(c, &r, 40, 8, 1, -2, 0, &freed), SKV_ERR_INVALID_ARG);
  CHECK_MSG_HAS("retain_floor -2");
  CHECK_STATUS(skv_swa_evict(c, &r, 40, 8, 1, -1, 0x2, &freed), SKV_ERR_INVALID_ARG);
  CHECK_MSG_HAS("flags");
  r.swa_evict_floor = COLS + 1;
  CHECK_STATUS(skv_swa_evict(c, &r, 40, 8, 1, -1, 0, &freed), SKV_ERR_INVALID_ARG);
  CHECK_MSG_HAS("swa_evict_floor 129");
  r.swa_evict_floor = 13;
  r.swa_evicted_seqlen = 41;
  CHECK_STATUS(skv_swa_evict(c, &r, 40, 8, 1, -1, 0, &freed), SKV_ERR_INVALID_ARG);
  CHECK_MSG_HAS("swa_evicted_seqlen 41");
  r.swa_evicted_seqlen = 18;
  CHECK_STATUS(skv_swa_evict(c, &r, 40, 8, 1, -1, 0, &freed), SKV_ERR_INVALID_ARG);
  CHECK_MSG_HAS("18 is not a multiple of page_size 4");
  r.swa_evicted_seqlen = 0;
  CHECK_STATUS(skv_swa_evict(c, NULL, 40, 8, 1, -1, 0, &freed), SKV_ERR_NULL_ARG);
  CHECK_STATUS(skv_swa_evict(NULL, &r, 40, 8, 1, -1, 0, &freed), SKV_ERR_NULL_ARG);
  CHECK_STATUS(skv_swa_evict(plain, &r, 40, 8, 1, -1, 0, &freed), SKV_ERR_UNSUPPORTED);
  CHECK_MSG_HAS("free_kv_segment is NULL");
  memset(&cfg, 0, sizeof cfg);
  cfg.struct_size = (uint32_t)sizeof cfg;
  cfg.page_size = PS;
  cfg.num_token_slots = 64 * PS;
  cfg.num_rows = ROWS;
  cfg.max_context_len = COLS;
  CHECK_OK(skv_cache_new(&cfg, &owned));
  CHECK_STATUS(skv_swa_evict(owned, &r, 40, 8, 1, -1, 0, &freed), SKV_ERR_UNSUPPORTED);
  CHECK_MSG_HAS("owned mode");
  /* the handle's kind decides before the arguments */
  CHECK_STATUS(skv_swa_evict(owned, &r, 40, 0, 1, -5, 0x8, &freed), SKV_ERR_UNSUPPORTED);
  CHECK_STATUS(skv_swa_evict(plain, &r, 41, 0, 1, -1, 0, &freed), SKV_ERR_UNSUPPORTED);
  CHECK_STATUS(skv_swa_evict(owned, NULL, 40, 8, 1, -1, 0, &freed), SKV_ERR_NULL_ARG);
  /* an idle session's row is the session's */
  r.origin_input_len = 40;
  {
    skv_req done = r;
    CHECK_OK(skv_cache_finished_req(c, 1, 0, &done, 0));
  }
  CHECK_STATUS(skv_swa_evict(c, &r, 40, 8, 1, -1, 0, &freed), SKV_ERR_STATE);
  CHECK_MSG_HAS("idle slot");
  r.origin_input_len = 0;
  CHECK_REQ_SAME(&r, &before);
  CHECK_EQ_INT(freed, 77);
  CHECK_EQ_INT(e.n_pieces, 0);
  skv_cache_free(owned);
  skv_cache_free(plain);
  skv_cache_free(c);
}

static void free_kv_alone_cannot_free_the_full_side(void) {
  engine e;
  skv_cache *c = hybrid_cache(&e, 0, sizeof(skv_pool_ops));
  skv_req r = hybrid_req(), before = r;
  /* the req's cursor passed swa_dead_lo: refused as it arrives, before any free is planned */
  CHECK_STATUS(skv_trim_overshoot(c, &r, 0), SKV_ERR_INVALID_ARG);
  CHECK_MSG_HAS("free_kv_segment is NULL");
  CHECK_REQ_SAME(&r, &before);
  CHECK_EQ_INT(e.freed_whole, 0);
  /* nothing below the cursor: free_kv takes it */
  r.swa_evicted_seqlen = 0;
  CHECK_OK(skv_trim_overshoot(c, &r, 0));
  CHECK_EQ_INT(e.freed_whole, 10);
  skv_cache_free(c);
  /* an ABI 2 caller (struct_size 48) keeps handing every free to free_kv whole */
  c = hybrid_cache(&e, 0, 48);
  r = hybrid_req();
  CHECK_OK(skv_trim_overshoot(c, &r, 0));
  CHECK_EQ_INT(e.freed_whole, 10);
  skv_cache_free(c);
}

static void an_unaligned_cursor_is_refused_at_a_split(void) {
  engine e;
  skv_cache *c = hybrid_cache(&e, 1, sizeof(skv_pool_ops));
  skv_req r = hybrid_req(), before;
  r.swa_evicted_seqlen = 26; /* an abort frees [16, 26) full-only and [26, 30) both */
  before = r;
  /* refused as the req arrives, before any free is planned */
  CHECK_STATUS(skv_cache_finished_req(c, 3, 0, &r, 1), SKV_ERR_INVALID_ARG);
  CHECK_MSG_HAS("26 is not a multiple of page_size 4");
  CHECK_REQ_SAME(&r, &before);
  CHECK_EQ_INT(e.n_pieces, 0);
  r.swa_evicted_seqlen = 28;
  CHECK_OK(skv_cache_finished_req(c, 3, 0, &r, 1));
  CHECK_EQ_INT(e.n_pieces, 3);
  CHECK_PIECE(e, 0, 16, 12, SKV_POOL_FULL);
  CHECK_PIECE(e, 1, 4, 12, SKV_POOL_BOTH);
  CHECK_PIECE(e, 2, 28, 2, SKV_POOL_BOTH);
  CHECK(req_is_empty(&r));
  skv_cache_free(c);
}

/* A finish that frees nothing never reached the split check: it kept a cursor inside a
 * page in the slot, and every later release of it was refused. The finish refuses it now. */
static void a_finish_keeps_no_cursor_inside_a_page(void) {
  engine e;
  skv_cache *c = hybrid_cache(&e, 1, sizeof(skv_pool_ops));
  skv_req r = req_make(1, 16, 16), before;
  r.origin_input_len = 16;
  r.swa_evicted_seqlen = 6;
  before = r;
  CHECK_STATUS(skv_cache_finished_req(c, 4, 0, &r, 0), SKV_ERR_INVALID_ARG);
  CHECK_MSG_HAS("6 is not a multiple of page_size 4");
  CHECK_REQ_SAME(&r, &before);
  CHECK_EQ_INT(e.n_pieces, 0);
  r.swa_evicted_seqlen = 8;
  CHECK_OK(skv_cache_finished_req(c, 4, 0, &r, 0));
  CHECK_OK(skv_release_session(c, 4));
  skv_cache_free(c);
}

/* On a running session's row, a floor lifted over what the window freed is refused. */
static void a_lifted_floor_is_refused(void) {
  engine e;
  skv_cache *c = hybrid_cache(&e, 1, sizeof(skv_pool_ops));
  skv_req r = req_make(2, 20, 20), before;
  skv_match m;
  uint32_t freed = 0;
  r.cache_protected_len = 4;
  r.swa_evict_floor = 13;
  r.origin_input_len = 20;
  CHECK_OK(skv_cache_finished_req(c, 5, 0, &r, 0));
  r.origin_input_len = 40;
  CHECK_OK(skv_match_prefix(c, 5, 0, &r, 39, 0, &m));
  CHECK_EQ_INT(r.swa_evict_floor, 13);
  r.kv_allocated_len = r.kv_committed_len = 40;
  CHECK_OK(skv_swa_evict(c, &r, 40, 8, 1, -1, 0, &freed));
  CHECK_EQ_INT(freed, 16);
  r.swa_evict_floor = 40;
  before = r;
  e.n_pieces = 0;
  CHECK_STATUS(skv_cache_finished_req(c, 5, 0, &r, 1), SKV_ERR_INVALID_ARG);
  CHECK_MSG_HAS("lifts swa_dead_lo from 16 to 40");
  CHECK_REQ_SAME(&r, &before);
  CHECK_EQ_INT(e.n_pieces, 0);
  r.swa_evict_floor = 13;
  CHECK_OK(skv_cache_finished_req(c, 5, 0, &r, 1));
  CHECK_EQ_INT(e.n_pieces, 3);
  CHECK_PIECE(e, 0, 16, 16, SKV_POOL_FULL);
  skv_cache_free(c);
}

/* A failing free_kv_segment cannot be undone: every piece still runs, the call reports
 * SKV_ERR_CALLBACK naming the piece, and the req advanced as for a success. */
static void a_failing_segment_callback(void) {
  engine e;
  skv_cache *c = hybrid_cache(&e, 1, sizeof(skv_pool_ops));
  skv_req r = hybrid_req();
  uint32_t freed = 0;
  e.fail = 1;
  CHECK_STATUS(skv_trim_overshoot(c, &r, 0), SKV_ERR_CALLBACK);
  CHECK_MSG_HAS("free_kv_segment(row 0, [20, 24), pools 1) returned -1");
  CHECK_EQ_INT(e.n_pieces, 2);
  CHECK_EQ_INT(r.kv_allocated_len, 20);
  CHECK_EQ_INT(r.swa_evicted_seqlen, 20);
  r = req_make(1, 40, 40);
  CHECK_STATUS(skv_swa_evict(c, &r, 40, 8, 1, -1, 0, &freed), SKV_ERR_CALLBACK);
  CHECK_MSG_HAS("pools 2");
  CHECK_EQ_INT(r.swa_evicted_seqlen, 32);
  CHECK_EQ_INT(freed, 32);
  skv_cache_free(c);
}

int main(void) {
  layout();
  creation_needs_a_kv_free();
  trim_splits_at_the_cursor();
  release_and_held();
  window_steps();
  evict_errors();
  free_kv_alone_cannot_free_the_full_side();
  an_unaligned_cursor_is_refused_at_a_split();
  a_finish_keeps_no_cursor_inside_a_page();
  a_failing_segment_callback();
  a_lifted_floor_is_refused();
  return ctest_summary();
}
