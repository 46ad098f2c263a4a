/* The control channel between the two instances: a SOCK_SEQPACKET socketpair made before the
 * fork, so every message arrives whole. It carries what NIXL does not: the agents' metadata
 * blobs and KV layouts at setup, then units, the source's re-offers, the destination's
 * answers and refusals, and the end of each step. */
#ifndef SKV_NIXL_CHAN_H
#define SKV_NIXL_CHAN_H

#include <errno.h>
#include <poll.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>

enum msg_type {
  M_MD = 1,   /* data: the sender agent's nixl_capi_get_local_md blob */
  M_LAYOUT,   /* data: the sender's arenas (struct arena_info, one an engine) */
  M_HELLO,    /* setup done; the NIXL connection is up */
  M_UNIT,     /* data: a move unit; kind names the engine, sid and epoch what it moves */
  M_RETRY,    /* the same unit again, after the source's timeout: answer with your state */
  M_ANSWER,   /* status: skv_session_fence's state for (sid, epoch) */
  M_REFUSED,  /* status: the import's refusal (SKV_ERR_OUT_OF_MEMORY ...) */
  M_END       /* the source is done with this step */
};

#define MSG_MAX 8192

typedef struct msg {
  uint32_t type;
  uint32_t kind;
  uint64_t sid;
  uint32_t epoch;
  int32_t status;
  uint32_t len;
  uint32_t pad;
  uint8_t data[MSG_MAX];
} msg;

static inline int chan_send(int fd, uint32_t type, uint32_t kind, uint64_t sid, uint32_t epoch,
                            int32_t status, const void *data, size_t len) {
  msg m;
  size_t n = offsetof(msg, data) + len;
  if (len > MSG_MAX) {
    fprintf(stderr, "chan_send: %zu bytes exceed MSG_MAX %d\n", len, MSG_MAX);
    return -1;
  }
  memset(&m, 0, offsetof(msg, data));
  m.type = type;
  m.kind = kind;
  m.sid = sid;
  m.epoch = epoch;
  m.status = status;
  m.len = (uint32_t)len;
  if (len) memcpy(m.data, data, len);
  if (send(fd, &m, n, 0) != (ssize_t)n) {
    fprintf(stderr, "chan_send: %s\n", strerror(errno));
    return -1;
  }
  return 0;
}

/* 1: a message in *m; 0: none within timeout_ms; -1: the peer is gone or an error. */
static inline int chan_recv(int fd, msg *m, int timeout_ms) {
  struct pollfd p;
  ssize_t n;
  p.fd = fd;
  p.events = POLLIN;
  p.revents = 0;
  if (poll(&p, 1, timeout_ms) <= 0) return 0;
  n = recv(fd, m, sizeof *m, 0);
  if (n < (ssize_t)offsetof(msg, data) || (size_t)n != offsetof(msg, data) + m->len) {
    fprintf(stderr, "chan_recv: %s\n", n == 0 ? "the peer closed the channel" : "short message");
    return -1;
  }
  return 1;
}

#endif
