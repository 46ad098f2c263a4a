/* The destination's side of a move (part of test_nixl_move.c): import the unit (reserving
 * pages), READ the source's pages with NIXL, check every byte, commit (the import ticket),
 * then notify. A re-sent unit is answered from skv_session_fence. The step's injected failure
 * is played here. */
#ifndef SKV_NIXL_MOVE_DEST_H
#define SKV_NIXL_MOVE_DEST_H

/* An import whose bytes are on their way. */
typedef struct incoming {
  int open, posted;
  uint64_t ticket;
  uint32_t epoch, committed, cursor, floor, n_full, n_swa, unit_len;
  uint8_t unit[MSG_MAX]; /* the unit: what skv_session_fence is asked about */
  int32_t src[2 * MAX_PAGES], dst[2 * MAX_PAGES]; /* full ids, then SWA ids */
  int32_t row;                                    /* external mode: the engine's row */
  nixl_read rd;
  double t_post;
} incoming;

/* External mode: the engine maps the session's positions to pages of its own first (a row
 * of req_to_token and pages from its free list), then libskv adopts the row. */
static skv_status ext_prepare(engine *e, incoming *in, uint32_t allocated) {
  uint32_t k;
  in->row = ext_take_row(e->x);
  if (in->row < 0) return SKV_ERR_OUT_OF_MEMORY;
  if ((uint32_t)e->x->n_free < in->n_full || ext_extend(e->x, in->row, 0, allocated) != 0) {
    e->x->row_used[in->row] = 0;
    return SKV_ERR_OUT_OF_MEMORY;
  }
  for (k = 0; k < in->n_full; k++) in->dst[k] = e->x->r2t[in->row][k * PS] / PS;
  return SKV_OK;
}

/* A refused import changed nothing in libskv: the external engine takes its row back. */
static void ext_unprepare(engine *e, incoming *in) {
  uint32_t k;
  for (k = 0; k < in->n_full; k++) {
    e->x->owner[in->dst[k]] = 0;
    e->x->free_pages[e->x->n_free++] = in->dst[k];
  }
  e->x->row_used[in->row] = 0;
}

static skv_status import_unit(engine *e, const msg *m, incoming *in) {
  skv_import im;
  size_t n = 0;
  skv_status st;
  memset(in, 0, sizeof *in);
  in->epoch = m->epoch;
  in->unit_len = m->len;
  memcpy(in->unit, m->data, m->len);
  in->committed = u32_at(m->data, 56);
  in->cursor = u32_at(m->data, 68);
  in->floor = u32_at(m->data, 72);
  unit_ids(m->data, in->src, &in->n_full, &in->n_swa);
  memset(&im, 0, sizeof im);
  im.struct_size = (uint32_t)sizeof im;
  im.session_id = m->sid;
  im.row = -1; /* owned: libskv takes a row; no prefix, no lock (protected is 0) */
  im.aux_state = im.aux_track[0] = im.aux_track[1] = -1;
  if (e->kind == K_EXT) {
    st = ext_prepare(e, in, u32_at(m->data, 60));
    if (st != SKV_OK) return st;
    im.row = in->row;
  }
  st = skv_session_import(e->c, &im, m->data, m->len, in->dst, 2 * MAX_PAGES, &n, &in->ticket);
  if (st != SKV_OK) {
    ctest_save_msg(); /* the refusal's text, for the caller's checks */
    if (e->kind == K_EXT) ext_unprepare(e, in);
    return st;
  }
  CHECK_EQ_U64(n, e->kind == K_EXT ? 0 : in->n_full + in->n_swa);
  in->open = 1;
  return SKV_OK;
}

/* One pool's descriptors, appended to `out`: the unit's ids (remote) into ours (local). */
static size_t pool_descs(const skv_kv_layout *local, const int32_t *dst,
                         const skv_kv_layout *remote, const int32_t *src, uint32_t n,
                         skv_xfer_desc *out) {
  size_t need = 0, got = 0;
  if (n == 0) return 0;
  CHECK_STATUS(skv_transfer_descs(local, dst, remote, src, n, NULL, 0, &need), SKV_ERR_BUFFER);
  CHECK_OK(skv_transfer_descs(local, dst, remote, src, n, out, need, &got));
  CHECK_EQ_U64(got, need);
  return got;
}

static int start_read(inst *I, engine *e, incoming *in) {
  static skv_xfer_desc d[FULL_REGIONS * 2 * MAX_PAGES];
  size_t n = pool_descs(&e->full.layout, in->dst, &I->peer_layout[e->kind][0], in->src,
                        in->n_full, d);
  n += pool_descs(&e->swa.layout, in->dst + in->n_full, &I->peer_layout[e->kind][1],
                  in->src + in->n_full, in->n_swa, d + n);
  return nl_read_prepare(&I->nl, d, n, &in->rd);
}

/* Every byte of every position, found through the two sides' ids: position p is on page
 * p / PS of the session; the SWA ids name only the pages the window holds. */
static size_t check_moved(const engine *e, const incoming *in, uint64_t sid) {
  uint32_t p, i, k = 0, lo = in->floor, hi;
  size_t bad = 0;
  for (p = 0; p < in->committed; p++)
    bad += check_token(&e->full, 0, sid, p, in->dst[p / PS], p % PS);
  if (in->n_swa == 0) return bad;
  if (lo > 0) lo = (lo + PS - 1) / PS * PS; /* the window frees whole pages */
  hi = in->cursor > lo ? in->cursor : lo;
  for (i = 0; i < in->n_full; i++) {
    if (lo <= i * PS && (i + 1) * PS <= hi) continue; /* the window passed it */
    for (p = i * PS; p < (i + 1) * PS && p < in->committed; p++)
      bad += check_token(&e->swa, 1, sid, p, in->dst[in->n_full + k], p % PS);
    k++;
  }
  CHECK_EQ_U64(k, in->n_swa);
  return bad;
}

/* The 4,096-token session's first move: its descriptors coalesce to one a region (both
 * sides' ids ascend), and the same READ is posted again, warm, to time the loopback. */
static int measure_reads(inst *I, incoming *in) {
  double best = 1e30, sum = 0;
  int i, r;
  CHECK_EQ_U64(in->rd.descs, FULL_REGIONS);
  for (i = 0; i < MEASURE_READS; i++) {
    double t0 = now_ms(), ms;
    if (nl_read_post(&I->nl, &in->rd) != 0) return -1;
    while ((r = nl_read_poll(&I->nl, &in->rd)) == 0) {
    }
    if (r < 0) return -1;
    ms = now_ms() - t0;
    sum += ms;
    if (ms < best) best = ms;
  }
  printf("%s: measured: %zu B in %zu descriptors (%u pages x %d regions before coalescing), "
         "%d warm READs over UCX_TLS=%s: best %.3f ms (%.2f GB/s), mean %.3f ms (%.2f GB/s)\n",
         I->name, in->rd.bytes, in->rd.descs, in->n_full, FULL_REGIONS, MEASURE_READS,
         getenv("UCX_TLS"), best, in->rd.bytes / best / 1e6, sum / MEASURE_READS,
         in->rd.bytes / (sum / MEASURE_READS) / 1e6);
  return 0;
}

/* Waits out the READ, checks the bytes, commits, notifies (unless the step loses it). */
static int finish_read(inst *I, engine *e, incoming *in, const step *s) {
  int r, state = -1;
  double ms;
  char note[96];
  while ((r = nl_read_poll(&I->nl, &in->rd)) == 0) {
  }
  ms = now_ms() - in->t_post;
  if (r < 0) return -1;
  if (in->committed == MEASURED_LEN && measure_reads(I, in) != 0) return -1;
  CHECK_EQ_U64(check_moved(e, in, s->sid), 0);
  if (nl_read_release(&I->nl, &in->rd) != 0) return -1;
  CHECK_OK(skv_ticket_done(e->c, in->ticket, SKV_OK)); /* the commit point */
  CHECK_OK(skv_session_fence(e->c, in->unit, in->unit_len, &state));
  CHECK_EQ_INT(state, SKV_FENCE_COMMITTED);
  in->open = 0;
  e->len[s->sid] = in->committed;
  notif_text(note, sizeof note, s->kind, s->sid, in->epoch);
  if (s->inject != I_DROP_NOTIF && nl_notify(&I->nl, note) != 0) return -1;
  printf("%s: %s session %llu: %u tokens, unit %u B, %u pages x %u regions + %u SWA pages x %u"
         " -> %zu NIXL descriptors, %zu B read in %.3f ms%s\n",
         I->name, kind_name[s->kind], (unsigned long long)s->sid, in->committed, in->unit_len,
         in->n_full, e->full.n_regions, in->n_swa, e->swa.n_regions, in->rd.descs, in->rd.bytes,
         ms, s->inject == I_LATE ? " (held until the source asked)" : "");
  return 0;
}

/* 1: this side committed the session; 0: it did not; -1: the channel or NIXL broke. */
static int move_in(inst *I, const step *s) {
  engine *e = &I->eng[s->kind];
  static incoming in;
  int32_t *hog = NULL;
  uint32_t n_hog = 0;
  uint64_t f0[2], f[2];
  int landed = 0, state;
  msg *m = (msg *)malloc(sizeof *m);
  memset(&in, 0, sizeof in);
  if (s->inject == I_DEST_FULL) {
    /* the engine's own use leaves 4 pages: fewer than the session needs */
    free_pages(e, f);
    n_hog = (uint32_t)(f[0] - 4) * PS;
    hog = (int32_t *)malloc(n_hog * sizeof(int32_t));
    CHECK_OK(skv_pool_alloc(e->c, n_hog, hog));
  }
  free_pages(e, f0);
  for (;;) {
    if (chan_recv(I->fd, m, 30000) != 1) return -1;
    if (m->type == M_END) break;
    CHECK(m->type == M_UNIT || m->type == M_RETRY);
    if (in.open && m->epoch == in.epoch) {
      /* The source timed out on an import still open here. A READ never posted is cancelled
       * (NIXL releases the request: nothing can touch the pages now), the import fails and
       * its pages go back; a posted one keeps its pages until it completes. */
      if (!in.posted) {
        if (nl_read_release(&I->nl, &in.rd) != 0) return -1;
        CHECK_OK(skv_ticket_done(e->c, in.ticket, XFER_FAILED));
        in.open = 0;
        free_pages(e, f);
        CHECK_EQ_U64(f[0], f0[0]);
        CHECK_EQ_U64(f[1], f0[1]);
      }
      CHECK_OK(skv_session_fence(e->c, m->data, m->len, &state)); /* the re-offered unit */
      CHECK_EQ_INT(state, in.open ? SKV_FENCE_PENDING : SKV_FENCE_ABSENT);
      if (chan_send(I->fd, M_ANSWER, m->kind, s->sid, in.epoch, state, NULL, 0) != 0) return -1;
      if (in.open) { /* the late completion */
        if (finish_read(I, e, &in, s) != 0) return -1;
        landed = 1;
      }
      continue;
    }
    {
      skv_status st = import_unit(e, m, &in);
      if (st == SKV_ERR_STATE) {
        /* an epoch this handle has seen: a duplicate, or a move it answered ABSENT for */
        CHECK_MSG_HAS("fenced");
        CHECK_OK(skv_session_fence(e->c, m->data, m->len, &state));
        if (s->inject == I_DROP_NOTIF) CHECK_EQ_INT(state, SKV_FENCE_COMMITTED);
        if (chan_send(I->fd, M_ANSWER, m->kind, s->sid, m->epoch, state, NULL, 0) != 0) return -1;
        continue;
      }
      if (st != SKV_OK) {
        CHECK_EQ_INT(s->inject, I_DEST_FULL);
        CHECK_EQ_INT(st, SKV_ERR_OUT_OF_MEMORY);
        free_pages(e, f); /* the refusal changed nothing */
        CHECK_EQ_U64(f[0], f0[0]);
        if (chan_send(I->fd, M_REFUSED, m->kind, s->sid, m->epoch, st, NULL, 0) != 0) return -1;
        continue;
      }
    }
    free_pages(e, f); /* reserved for the transfer */
    CHECK_EQ_U64(f[0], f0[0] - in.n_full);
    CHECK_EQ_U64(f[1], f0[1] - in.n_swa);
    if (start_read(I, e, &in) != 0) return -1;
    if (s->inject == I_NEVER_POST) continue; /* stuck before it starts */
    in.t_post = now_ms();
    if (nl_read_post(&I->nl, &in.rd) != 0) return -1;
    in.posted = 1;
    if (s->inject == I_LATE) continue; /* completes only after the source's timeout */
    if (finish_read(I, e, &in, s) != 0) return -1;
    landed = 1;
  }
  CHECK(!in.open);
  if (chan_send(I->fd, M_END, 0, s->sid, 0, 0, NULL, 0) != 0) return -1;
  if (hog) {
    CHECK_OK(skv_pool_free(e->c, hog, n_hog));
    free(hog);
  }
  free(m);
  return landed;
}

#endif
