/* Sessions move between two instances, two processes, with NIXL's UCX backend doing the
 * transfer (docs/transfer-nixl.md). Each process holds three libskv handles (owned mode,
 * external mode, a hybrid model in owned mode), each over a host-memory KV arena registered
 * with its NIXL agent. A move is a pull, as vLLM's NixlConnector does it: the source exports
 * the session (SKV_EXPORT_MOVE) and sends the unit over the control channel (chan.h); the
 * destination imports it (reserving pages), builds descriptors with skv_transfer_descs, READs
 * the bytes, checks every one position by position, completes its import ticket (the commit)
 * and sends a NIXL notification; on it the source completes its export ticket, which releases
 * the session there. On a timeout the source re-sends the unit and the destination answers
 * from skv_session_fence. Failures are injected on the destination's side: a transfer that
 * never completes, one that completes late, no room for the pages, a lost notification.
 *   test_nixl_move          (run by ctests/nixl/run.sh: UCX_TLS and NIXL_PLUGIN_DIR set) */
#define _GNU_SOURCE
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "chan.h"
#include "engines.h"
#include "nixl_link.h"

#ifndef TIMEOUT_MS
#define TIMEOUT_MS 400 /* the source's wait for the notification before it asks */
#endif
#define XFER_FAILED 1   /* skv_ticket_done's status for a transfer that did not happen */
#define MAX_PAGES 512
#define MEASURED_LEN 4096 /* session 1's length at its first move */
#define MEASURE_READS 8

enum { A, B };
enum step_op { S_FILL, S_MOVE };
enum inject { I_NONE, I_NEVER_POST, I_LATE, I_DEST_FULL, I_DROP_NOTIF };
static const char *const inject_name[] = {"none", "never completes", "completes late",
                                          "destination full", "notification lost"};

typedef struct step {
  int op, kind;
  uint64_t sid;
  int from;        /* the process that fills, or the move's source */
  uint32_t tokens; /* S_FILL: the session's length */
  int inject;      /* S_MOVE */
  int lands;       /* S_MOVE: 1 when the move must commit, 0 when the session must stay */
} step;

#define FILL(k, s, who, n) {S_FILL, (k), (s), (who), (n), I_NONE, 0}
#define MOVE(k, s, who, inj, ok) {S_MOVE, (k), (s), (who), 0, (inj), (ok)}

/* Session 1 is the 4,096-token one; 2, 3 and 4 and the others end inside a page. */
static const step script[] = {
    FILL(K_OWNED, 1, A, 4096), FILL(K_OWNED, 2, A, 37), FILL(K_OWNED, 3, A, 100),
    FILL(K_OWNED, 4, A, 130),
    MOVE(K_OWNED, 1, A, I_NONE, 1), MOVE(K_OWNED, 1, B, I_NONE, 1),
    MOVE(K_OWNED, 2, A, I_NONE, 1), MOVE(K_OWNED, 2, B, I_NONE, 1),
    FILL(K_EXT, 11, A, 300), FILL(K_EXT, 12, A, 45),
    MOVE(K_EXT, 11, A, I_NONE, 1), MOVE(K_EXT, 11, B, I_NONE, 1),
    MOVE(K_EXT, 12, A, I_NONE, 1), MOVE(K_EXT, 12, B, I_NONE, 1),
    FILL(K_HYB, 21, A, 500), FILL(K_HYB, 22, A, 60),
    MOVE(K_HYB, 21, A, I_NONE, 1), MOVE(K_HYB, 21, B, I_NONE, 1),
    MOVE(K_HYB, 22, A, I_NONE, 1), MOVE(K_HYB, 22, B, I_NONE, 1),
    /* failure injection */
    MOVE(K_OWNED, 3, A, I_NEVER_POST, 0), MOVE(K_OWNED, 2, A, I_LATE, 1),
    MOVE(K_OWNED, 4, A, I_DEST_FULL, 0), MOVE(K_OWNED, 2, B, I_DROP_NOTIF, 1),
    MOVE(K_EXT, 12, A, I_NEVER_POST, 0), MOVE(K_HYB, 21, A, I_LATE, 1),
    /* a session whose move failed moves again, under a new epoch */
    MOVE(K_OWNED, 3, A, I_NONE, 1), MOVE(K_EXT, 12, A, I_NONE, 1),
};

typedef struct inst {
  int who, fd;
  char name[8];
  nixl_link nl;
  engine eng[K_KINDS];
  uint64_t peer_base[K_KINDS][2][FULL_REGIONS];
  skv_kv_layout peer_layout[K_KINDS][2];
} inst;

static double now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static uint32_t u32_at(const uint8_t *u, size_t at) {
  uint32_t v;
  memcpy(&v, u + at, sizeof v);
  return v;
}

/* The unit's page ids (docs/tiers.md#export-and-import): n_full then n_swa int32 from
 * header_len. */
static void unit_ids(const uint8_t *u, int32_t *ids, uint32_t *n_full, uint32_t *n_swa) {
  uint16_t hlen;
  memcpy(&hlen, u + 10, sizeof hlen);
  *n_full = u32_at(u, 80);
  *n_swa = u32_at(u, 84);
  memcpy(ids, u + hlen, (*n_full + *n_swa) * sizeof(int32_t));
}

static void notif_text(char *out, size_t cap, int kind, uint64_t sid, uint32_t epoch) {
  snprintf(out, cap, "skv commit %s %llu %u", kind_name[kind], (unsigned long long)sid, epoch);
}

#include "move_source.h"
#include "move_dest.h"

/* -------------------------------------------------------------------- setup */

static int setup(inst *I) {
  arena_info mine[K_KINDS];
  msg m;
  void *md;
  size_t md_len;
  int k, p, got_md = 0, got_layout = 0;
  char hello[32], mine_hello[32];
  double t0;
  if (nl_init(&I->nl, I->name) != 0) return -1;
  memset(mine, 0, sizeof mine);
  for (k = 0; k < K_KINDS; k++) {
    engine_init(&I->eng[k], k);
    if (nl_register(&I->nl, I->eng[k].full.arena, I->eng[k].full.bytes) != 0) return -1;
    if (I->eng[k].swa.n_pages &&
        nl_register(&I->nl, I->eng[k].swa.arena, I->eng[k].swa.bytes) != 0)
      return -1;
    for (p = 0; p < 2; p++) {
      const pool_mem *pm = p ? &I->eng[k].swa : &I->eng[k].full;
      mine[k].n_regions[p] = pm->n_regions;
      memcpy(mine[k].base[p], pm->base, sizeof pm->base);
    }
  }
  /* Metadata: each side's nixl_capi_get_local_md blob (taken after registering, so it names
   * the arenas) goes over the channel and into the other's nixl_capi_load_remote_md. */
  if (nl_local_md(&I->nl, &md, &md_len) != 0) return -1;
  if (chan_send(I->fd, M_MD, 0, 0, 0, 0, md, md_len) != 0) return -1;
  free(md);
  if (chan_send(I->fd, M_LAYOUT, 0, 0, 0, 0, mine, sizeof mine) != 0) return -1;
  while (!got_md || !got_layout) {
    if (chan_recv(I->fd, &m, 10000) != 1) return -1;
    if (m.type == M_MD) {
      if (nl_load_peer(&I->nl, m.data, m.len) != 0) return -1;
      got_md = 1;
    } else if (m.type == M_LAYOUT && m.len == sizeof mine) {
      arena_info peer[K_KINDS];
      memcpy(peer, m.data, sizeof peer);
      for (k = 0; k < K_KINDS; k++)
        for (p = 0; p < 2; p++) {
          memcpy(I->peer_base[k][p], peer[k].base[p], sizeof peer[k].base[p]);
          I->peer_layout[k][p] = p ? I->eng[k].swa.layout : I->eng[k].full.layout;
          I->peer_layout[k][p].region_base = I->peer_base[k][p];
        }
      got_layout = 1;
    }
  }
  /* Both directions of the connection are up before anything is timed. */
  snprintf(hello, sizeof hello, "hello from %s", I->who == A ? "B" : "A");
  snprintf(mine_hello, sizeof mine_hello, "hello from %s", I->name);
  if (nl_notify(&I->nl, mine_hello) != 0) return -1;
  for (t0 = now_ms(); now_ms() - t0 < 20000;) {
    int r = nl_take_notif(&I->nl, hello);
    if (r < 0) return -1;
    if (r == 1) return 0;
  }
  fprintf(stderr, "%s: no hello from the peer agent in 20 s\n", I->name);
  return -1;
}

/* ------------------------------------------------------------------- script */

static int run_step(inst *I, const step *s) {
  engine *e = &I->eng[s->kind];
  if (s->op == S_FILL) {
    if (s->from == I->who) engine_turn(e, s->sid, s->tokens);
    return 0;
  }
  if (s->from == I->who) {
    int landed = move_out(I, s);
    if (landed < 0) return -1;
    CHECK_EQ_INT(landed, s->lands);
    if (!landed) engine_turn(e, s->sid, 5); /* it serves here again, bytes intact */
  } else {
    int landed = move_in(I, s);
    if (landed < 0) return -1;
    CHECK_EQ_INT(landed, s->lands);
    if (landed) engine_turn(e, s->sid, 5); /* the next turn runs here, on the moved bytes */
  }
  return 0;
}

static int run(int who, int fd) {
  inst *I = (inst *)calloc(1, sizeof *I);
  size_t i;
  int k, rc = 0;
  uint64_t sid;
  I->who = who;
  I->fd = fd;
  snprintf(I->name, sizeof I->name, "%s", who == A ? "A" : "B");
  if (setup(I) != 0) {
    ctest_record(0, __FILE__, __LINE__, "setup (NIXL agent, registration, metadata)");
    rc = -1;
  }
  for (i = 0; rc == 0 && i < sizeof script / sizeof script[0]; i++) rc = run_step(I, &script[i]);
  if (rc != 0) ctest_record(0, __FILE__, __LINE__, "the script ran to its end");
  for (k = 0; k < K_KINDS; k++) {
    engine *e = &I->eng[k];
    if (!e->c) continue;
    for (sid = 0; sid < MAX_SID; sid++)
      if (e->len[sid]) CHECK_OK(skv_release_session(e->c, sid));
    if (rc == 0) engine_check_empty(e);
  }
  nl_fini(&I->nl); /* deregisters the arenas before they go */
  for (k = 0; k < K_KINDS; k++)
    if (I->eng[k].c) engine_fini(&I->eng[k]);
  free(I);
  printf("%s: ", who == A ? "A" : "B");
  return ctest_summary();
}

int main(void) {
  int sv[2], status = 0, rc;
  pid_t pid;
  if (!getenv("UCX_TLS") || !getenv("NIXL_PLUGIN_DIR")) {
    fprintf(stderr, "test_nixl_move: set UCX_TLS and NIXL_PLUGIN_DIR (ctests/nixl/run.sh does)\n");
    return 2;
  }
  /* Before any NIXL or UCX state exists: the two instances share nothing but the channel. */
  if (socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv) != 0) {
    perror("socketpair");
    return 2;
  }
  setvbuf(stdout, NULL, _IOLBF, 0); /* the two instances' lines interleave as they happen */
  pid = fork();
  if (pid < 0) {
    perror("fork");
    return 2;
  }
  alarm(120); /* a hung transfer fails the test rather than the CI job's clock */
  if (pid == 0) {
    close(sv[0]);
    _exit(run(B, sv[1]) == 0 ? 0 : 1);
  }
  close(sv[1]);
  rc = run(A, sv[0]);
  close(sv[0]);
  if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    fprintf(stderr, "test_nixl_move: instance B failed (status %#x)\n", status);
    rc = 1;
  }
  return rc;
}
