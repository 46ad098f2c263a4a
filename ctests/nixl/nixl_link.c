/* See nixl_link.h. */
#include "nixl_link.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NL_TRY(call)                                                                   \
  do {                                                                                 \
    nixl_capi_status_t nl_s_ = (call);                                                 \
    if (nl_s_ != NIXL_CAPI_SUCCESS) {                                                  \
      fprintf(stderr, "nixl_link: %s failed: nixl status %d\n", #call, (int)nl_s_);    \
      return -1;                                                                       \
    }                                                                                  \
  } while (0)

int nl_init(nixl_link *l, const char *name) {
  nixl_capi_agent_config_t cfg;
  nixl_capi_mem_list_t mems = NULL;
  nixl_capi_params_t params = NULL;
  int rc;
  memset(l, 0, sizeof *l);
  /* No progress thread and no listener: the test polls (every wait below progresses the
   * worker), and metadata travels over the test's own channel. */
  memset(&cfg, 0, sizeof cfg);
  cfg.thread_sync = NIXL_CAPI_THREAD_SYNC_DEFAULT;
  cfg.num_workers = 1;
  NL_TRY(nixl_capi_create_configured_agent(name, &cfg, &l->agent));
  NL_TRY(nixl_capi_get_plugin_params(l->agent, "UCX", &mems, &params));
  rc = nixl_capi_create_backend(l->agent, "UCX", params, &l->ucx);
  nixl_capi_destroy_mem_list(mems);
  nixl_capi_destroy_params(params);
  if (rc != NIXL_CAPI_SUCCESS) {
    fprintf(stderr, "nixl_link: nixl_capi_create_backend(UCX) failed: nixl status %d\n", rc);
    return -1;
  }
  NL_TRY(nixl_capi_create_opt_args(&l->args));
  NL_TRY(nixl_capi_opt_args_add_backend(l->args, l->ucx));
  NL_TRY(nixl_capi_create_notif_map(&l->notifs));
  return 0;
}

void nl_fini(nixl_link *l) {
  if (l->peer) {
    nixl_capi_invalidate_remote_md(l->agent, l->peer);
    free(l->peer);
  }
  if (l->notifs) nixl_capi_destroy_notif_map(l->notifs);
  if (l->args) nixl_capi_destroy_opt_args(l->args);
  /* the agent owns the backend engine and the registrations: destroying it releases them;
   * the backend handle is only the C API's wrapper */
  if (l->agent) nixl_capi_destroy_agent(l->agent);
  if (l->ucx) nixl_capi_destroy_backend(l->ucx);
  memset(l, 0, sizeof *l);
}

int nl_register(nixl_link *l, void *addr, size_t len) {
  nixl_capi_reg_dlist_t d;
  int rc;
  NL_TRY(nixl_capi_create_reg_dlist(NIXL_CAPI_MEM_DRAM, &d));
  rc = nixl_capi_reg_dlist_add_desc(d, (uintptr_t)addr, len, 0, NULL, 0);
  if (rc == NIXL_CAPI_SUCCESS) rc = nixl_capi_register_mem(l->agent, d, l->args);
  nixl_capi_destroy_reg_dlist(d);
  if (rc != NIXL_CAPI_SUCCESS) {
    fprintf(stderr, "nixl_link: registering %zu bytes failed: nixl status %d\n", len, rc);
    return -1;
  }
  return 0;
}

int nl_local_md(nixl_link *l, void **blob, size_t *len) {
  NL_TRY(nixl_capi_get_local_md(l->agent, blob, len));
  return 0;
}

int nl_load_peer(nixl_link *l, const void *blob, size_t len) {
  NL_TRY(nixl_capi_load_remote_md(l->agent, blob, len, &l->peer));
  return 0;
}

int nl_read_prepare(nixl_link *l, const skv_xfer_desc *d, size_t n, nixl_read *r) {
  size_t i;
  memset(r, 0, sizeof *r);
  NL_TRY(nixl_capi_create_xfer_dlist(NIXL_CAPI_MEM_DRAM, &r->local));
  NL_TRY(nixl_capi_create_xfer_dlist(NIXL_CAPI_MEM_DRAM, &r->remote));
  for (i = 0; i < n; i++) {
    NL_TRY(nixl_capi_xfer_dlist_add_desc(r->local, (uintptr_t)d[i].local_addr, d[i].len, 0));
    NL_TRY(nixl_capi_xfer_dlist_add_desc(r->remote, (uintptr_t)d[i].remote_addr, d[i].len, 0));
    r->bytes += d[i].len;
  }
  r->descs = n;
  NL_TRY(nixl_capi_create_xfer_req(l->agent, NIXL_CAPI_XFER_OP_READ, r->local, r->remote,
                                   l->peer, &r->req, l->args));
  return 0;
}

int nl_read_post(nixl_link *l, nixl_read *r) {
  nixl_capi_status_t s = nixl_capi_post_xfer_req(l->agent, r->req, l->args);
  if (s != NIXL_CAPI_SUCCESS && s != NIXL_CAPI_IN_PROG) {
    fprintf(stderr, "nixl_link: nixl_capi_post_xfer_req failed: nixl status %d\n", (int)s);
    return -1;
  }
  r->posted = 1;
  return 0;
}

int nl_read_poll(nixl_link *l, nixl_read *r) {
  nixl_capi_status_t s = nixl_capi_get_xfer_status(l->agent, r->req);
  if (s == NIXL_CAPI_SUCCESS) return 1;
  if (s == NIXL_CAPI_IN_PROG) return 0;
  fprintf(stderr, "nixl_link: nixl_capi_get_xfer_status: nixl status %d\n", (int)s);
  return -1;
}

int nl_read_release(nixl_link *l, nixl_read *r) {
  if (r->req) {
    NL_TRY(nixl_capi_release_xfer_req(l->agent, r->req));
    NL_TRY(nixl_capi_destroy_xfer_req(r->req));
    r->req = NULL;
  }
  if (r->local) nixl_capi_destroy_xfer_dlist(r->local);
  if (r->remote) nixl_capi_destroy_xfer_dlist(r->remote);
  r->local = r->remote = NULL;
  return 0;
}

int nl_notify(nixl_link *l, const char *msg) {
  NL_TRY(nixl_capi_gen_notif(l->agent, l->peer, msg, strlen(msg), l->args));
  return 0;
}

/* Moves what NIXL delivered into the queue (getNotifs appends to the map; it is cleared
 * after each read). */
static int nl_drain(nixl_link *l) {
  size_t n_agents = 0, a, k, n, len;
  const char *agent;
  const void *data;
  NL_TRY(nixl_capi_get_notifs(l->agent, l->notifs, l->args));
  NL_TRY(nixl_capi_notif_map_size(l->notifs, &n_agents));
  for (a = 0; a < n_agents; a++) {
    NL_TRY(nixl_capi_notif_map_get_agent_at(l->notifs, a, &agent));
    NL_TRY(nixl_capi_notif_map_get_notifs_size(l->notifs, agent, &n));
    for (k = 0; k < n; k++) {
      NL_TRY(nixl_capi_notif_map_get_notif(l->notifs, agent, k, &data, &len));
      if (l->queued == 64 || len >= sizeof l->queue[0]) {
        fprintf(stderr, "nixl_link: notification queue full or message too long (%zu)\n", len);
        return -1;
      }
      memcpy(l->queue[l->queued], data, len);
      l->queue[l->queued][len] = '\0';
      l->queued++;
    }
  }
  NL_TRY(nixl_capi_notif_map_clear(l->notifs));
  return 0;
}

int nl_take_notif(nixl_link *l, const char *msg) {
  int i;
  if (nl_drain(l) != 0) return -1;
  for (i = 0; i < l->queued; i++) {
    if (strcmp(l->queue[i], msg) == 0) {
      memmove(l->queue[i], l->queue[i + 1], (size_t)(l->queued - i - 1) * sizeof l->queue[0]);
      l->queued--;
      return 1;
    }
  }
  return 0;
}
