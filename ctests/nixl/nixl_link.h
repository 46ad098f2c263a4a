/* The transfer engine's side of a move, over NIXL's C API (libnixl_capi.so from the PyPI wheel,
 * scripts/nixl_fetch.sh): one agent a process with the UCX backend, host memory registered
 * once, the peer's agent metadata loaded from a blob, reads built from libskv's descriptors,
 * and NIXL notifications as the acknowledgement of a commit. No libskv state here. */
#ifndef SKV_NIXL_LINK_H
#define SKV_NIXL_LINK_H

#include <stddef.h>
#include <stdint.h>

#include "nixl_capi.h"
#include "skv.h"

typedef struct nixl_link {
  nixl_capi_agent_t agent;
  nixl_capi_backend_t ucx;
  nixl_capi_opt_args_t args; /* names the UCX backend on every call */
  nixl_capi_notif_map_t notifs;
  char *peer; /* the peer agent's name, from its metadata */
  /* notifications received and not yet taken, as NUL-terminated strings */
  char queue[64][128];
  int queued;
} nixl_link;

/* One READ of the peer's bytes into ours: its descriptor lists live as long as the request. */
typedef struct nixl_read {
  nixl_capi_xfer_dlist_t local, remote;
  nixl_capi_xfer_req_t req;
  int posted;
  size_t bytes, descs;
} nixl_read;

/* Each returns 0 on success; on failure it prints what failed (function, NIXL status) and
 * returns -1. */
int nl_init(nixl_link *l, const char *name);
void nl_fini(nixl_link *l);
int nl_register(nixl_link *l, void *addr, size_t len);
/* The agent's metadata blob (malloc'ed; the caller frees it). */
int nl_local_md(nixl_link *l, void **blob, size_t *len);
int nl_load_peer(nixl_link *l, const void *blob, size_t len);

/* Builds (does not post) a READ of each descriptor's remote range into its local range. */
int nl_read_prepare(nixl_link *l, const skv_xfer_desc *d, size_t n, nixl_read *r);
/* Posts it, with no notification: the acknowledgement is nl_notify after the commit. */
int nl_read_post(nixl_link *l, nixl_read *r);
/* 1 done, 0 still in flight, -1 failed. */
int nl_read_poll(nixl_link *l, nixl_read *r);
/* Ends the request: cancels it if still in flight (NIXL's releaseXferReq), then frees it.
 * Returns 0 once NIXL says the transfer can no longer touch either side's memory. */
int nl_read_release(nixl_link *l, nixl_read *r);

int nl_notify(nixl_link *l, const char *msg);
/* Progresses the agent and takes the notification equal to `msg` if it arrived: 1, else 0. */
int nl_take_notif(nixl_link *l, const char *msg);

#endif
