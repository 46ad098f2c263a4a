/* The source's side of a move (part of test_nixl_move.c): export the session, offer the unit,
 * and complete the export ticket on the destination's word only: its NIXL notification, its
 * answer from skv_session_fence, or its refusal. A timeout frees nothing (the destination may
 * still be reading); it re-sends the unit, which the destination answers with its state. The
 * checks of each injected failure hold however the timeouts fall on a loaded machine. */
#ifndef SKV_NIXL_MOVE_SOURCE_H
#define SKV_NIXL_MOVE_SOURCE_H

/* The step is over on both sides: the destination echoes M_END after answering everything
 * the source sent, so no answer of this step is read in the next one. An answer still on its
 * way (the notification can overtake it) counts in *pending when it says PENDING. */
static int end_step(inst *I, const step *s, uint32_t epoch, int *pending) {
  msg m;
  if (chan_send(I->fd, M_END, s->kind, s->sid, epoch, 0, NULL, 0) != 0) return -1;
  for (;;) {
    if (chan_recv(I->fd, &m, 30000) != 1) return -1;
    if (m.type == M_END) return 0;
    CHECK((m.type == M_ANSWER || m.type == M_REFUSED) && m.sid == s->sid && m.epoch == epoch);
    *pending += m.type == M_ANSWER && m.status == SKV_FENCE_PENDING;
  }
}

/* 1: the destination committed (the session left); 0: it did not (the session serves here);
 * -1: the channel or NIXL broke. */
static int move_out(inst *I, const step *s) {
  engine *e = &I->eng[s->kind];
  static uint8_t unit[MSG_MAX];
  static int32_t ids[2 * MAX_PAGES];
  size_t len = 0;
  uint64_t t = 0, f0[2], f[2];
  uint32_t n_full, n_swa, epoch, had = e->len[s->sid];
  int landed = -1, timeouts = 0, pending = 0, refused = 0, by_notif = 0;
  char note[96];
  double deadline;
  skv_req req;
  skv_match mt;
  msg m;

  free_pages(e, f0);
  CHECK_STATUS(skv_session_export(e->c, s->sid, 0, SKV_EXPORT_MOVE, NULL, 0, &len, &t),
               SKV_ERR_BUFFER);
  CHECK_OK(skv_session_export(e->c, s->sid, 0, SKV_EXPORT_MOVE, unit, sizeof unit, &len, &t));
  if (t == 0) return -1;
  epoch = u32_at(unit, 28);
  unit_ids(unit, ids, &n_full, &n_swa);
  CHECK(epoch > 0);
  CHECK_EQ_U64(u32_at(unit, 56), had); /* committed: its partial last page travels */
  CHECK_EQ_U64(u32_at(unit, 64), 0);   /* protected 0: the whole session is the unit's */
  CHECK_EQ_U64(n_full, (had + PS - 1) / PS);
  /* While the move may read its pages the session neither serves nor goes. */
  CHECK_OK(skv_req_init(&req));
  req.origin_input_len = had + 4;
  CHECK_STATUS(skv_match_prefix(e->c, s->sid, 0, &req, had + 3, 0, &mt), SKV_ERR_STATE);
  CHECK_STATUS(skv_release_session(e->c, s->sid), SKV_ERR_STATE);
  free_pages(e, f);
  CHECK_EQ_U64(f[0], f0[0]);
  if (chan_send(I->fd, M_UNIT, (uint32_t)s->kind, s->sid, epoch, 0, unit, len) != 0) return -1;

  notif_text(note, sizeof note, s->kind, s->sid, epoch);
  deadline = now_ms() + TIMEOUT_MS;
  while (landed < 0) {
    int r = nl_take_notif(&I->nl, note);
    if (r < 0) return -1;
    if (r == 1) {
      landed = 1;
      by_notif = 1;
      break;
    }
    r = chan_recv(I->fd, &m, 1);
    if (r < 0) return -1;
    if (r == 1) {
      CHECK(m.sid == s->sid && m.epoch == epoch);
      if (m.type == M_REFUSED) {
        refused = m.status;
        landed = 0;
      } else if (m.type == M_ANSWER && m.status == SKV_FENCE_COMMITTED) {
        landed = 1;
      } else if (m.type == M_ANSWER && m.status == SKV_FENCE_ABSENT) {
        landed = 0;
      } else if (m.type == M_ANSWER && m.status == SKV_FENCE_PENDING) {
        pending++; /* still reading: wait again, pages still pinned */
        deadline = now_ms() + TIMEOUT_MS;
      } else {
        CHECK(!"a notification, an answer or a refusal");
      }
    }
    if (landed < 0 && now_ms() > deadline) {
      timeouts++;
      free_pages(e, f); /* nothing freed on a timeout */
      CHECK_EQ_U64(f[0], f0[0]);
      CHECK_EQ_U64(f[1], f0[1]);
      if (chan_send(I->fd, M_RETRY, (uint32_t)s->kind, s->sid, epoch, 0, unit, len) != 0)
        return -1;
      deadline = now_ms() + TIMEOUT_MS;
    }
  }

  CHECK_OK(skv_ticket_done(e->c, t, landed ? SKV_OK : XFER_FAILED));
  free_pages(e, f);
  if (landed) {
    /* moved out: released here, every page of it free */
    CHECK_EQ_U64(f[0], f0[0] + n_full);
    CHECK_EQ_U64(f[1], f0[1] + n_swa);
    CHECK_OK(skv_req_init(&req));
    req.origin_input_len = had + 4;
    CHECK_OK(skv_match_prefix(e->c, s->sid, 0, &req, had + 3, 0, &mt));
    CHECK_EQ_INT(mt.hit, 0);
    e->len[s->sid] = 0;
  } else {
    CHECK_EQ_U64(f[0], f0[0]);
    CHECK_EQ_U64(f[1], f0[1]);
  }
  if (end_step(I, s, epoch, &pending) != 0) return -1;
  switch (s->inject) {
  case I_NEVER_POST: CHECK(timeouts >= 1 && !landed && refused == 0); break;
  case I_LATE: CHECK(timeouts >= 1 && pending >= 1 && landed); break;
  case I_DEST_FULL: CHECK_EQ_INT(refused, SKV_ERR_OUT_OF_MEMORY); break;
  case I_DROP_NOTIF: CHECK(timeouts >= 1 && landed && !by_notif); break;
  default: break; /* on a slow machine a timeout and a COMMITTED answer are fine too */
  }
  printf("%s: %s session %llu epoch %u (%s) -> %s by %s; %d timeout(s), %d pending\n", I->name,
         kind_name[s->kind], (unsigned long long)s->sid, epoch, inject_name[s->inject],
         landed ? "moved" : "stays",
         by_notif ? "notification" : refused ? "refusal" : "fence answer", timeouts, pending);
  return landed;
}

#endif
