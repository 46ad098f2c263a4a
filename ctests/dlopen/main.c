/* How a serving engine loads libskv at run time: dlopen, one dlsym of skv_get_api, every
 * later call through the returned table. Built without -lskv; skv.h only supplies the
 * types. usage: dlopen_test [library]   (default: SKV_LIBRARY below) */
#include <skv.h>

/* The library to load. A build that knows where libskv is installed passes the directory
 * (CMake: -DSKV_LIBDIR="$<TARGET_FILE_DIR:skv::skv>") and the program loads it by path, from
 * that directory, through the SONAME link that a patch release keeps; otherwise SKV_SONAME
 * alone, found on the loader's search path. */
#ifdef SKV_LIBDIR
#define SKV_LIBRARY SKV_LIBDIR "/" SKV_SONAME
#else
#define SKV_LIBRARY SKV_SONAME
#endif

#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

typedef const skv_api *(*get_api_fn)(uint32_t abi_version);

static int failed;

#define EXPECT(cond)                                                                    \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #cond);               \
      failed++;                                                                         \
    }                                                                                   \
  } while (0)

/* Through the table only: api->f(...) must return SKV_OK. */
#define OK(call)                                                                        \
  do {                                                                                  \
    skv_status s_ = (call);                                                             \
    if (s_ != SKV_OK) {                                                                 \
      fprintf(stderr, "%s:%d: %s: %s: %s\n", __FILE__, __LINE__, #call,                 \
              api->status_str(s_), api->last_error());                                  \
      return 1;                                                                         \
    }                                                                                   \
  } while (0)

/* ISO C has no conversion between object and function pointers; dlsym's result is
 * copied, as POSIX describes. */
static get_api_fn lookup_get_api(void *lib) {
  get_api_fn fn = NULL;
  void *sym = dlsym(lib, "skv_get_api");
  if (sym) memcpy(&fn, &sym, sizeof fn);
  return fn;
}

static int same_fn(const void *table_field, void *lib, const char *name) {
  void *sym = dlsym(lib, name);
  return sym != NULL && memcmp(table_field, &sym, sizeof sym) == 0;
}

/* A session of two turns with speculative overshoot trimmed at each finish. */
static int streaming_session(const skv_api *api) {
  skv_cache_config cfg;
  skv_cache *c = NULL;
  skv_req req;
  skv_match m;
  skv_stats st;
  skv_check_report report;
  int32_t row;

  memset(&cfg, 0, sizeof cfg);
  cfg.struct_size = sizeof cfg;
  cfg.page_size = 16;
  cfg.num_token_slots = 16 * 32;
  cfg.num_rows = 4;
  cfg.max_context_len = 256;
  OK(api->cache_new(&cfg, &c));

  /* Turn 1: prompt 30, 16 draft tokens of which 6 are real: target 36, the page of
   * 32..47 keeps 32..35; allocated was 46, inside that same page. */
  OK(api->req_init(&req));
  req.origin_input_len = 30;
  OK(api->match_prefix(c, 9, 0, &req, 29, 0, &m));
  EXPECT(m.hit == 0);
  OK(api->alloc_row(c, &req));
  row = req.req_pool_idx;
  OK(api->alloc_extend(c, &req, 46, NULL));
  OK(api->commit(c, &req, 46));
  req.output_len = 16;
  req.finished_len = 6;
  OK(api->cache_finished_req(c, 9, 0, &req, 0));
  EXPECT(req.req_pool_idx == -1 && req.output_len == 6);
  OK(api->cache_stats(c, &st));
  EXPECT(st.used_pages == 3 && st.sessions == 1);

  /* Turn 2: the 36 restored tokens plus 10, 20 draft tokens of which 2 are real:
   * target 48, allocated 66; the pages of 48..66 go back. */
  OK(api->req_init(&req));
  req.origin_input_len = 46;
  OK(api->match_prefix(c, 9, 0, &req, 45, 0, &m));
  EXPECT(m.hit == 1 && m.prefix_len == 36 && req.req_pool_idx == row);
  OK(api->alloc_extend(c, &req, 30, NULL));
  OK(api->commit(c, &req, 30));
  OK(api->cache_stats(c, &st));
  EXPECT(st.used_pages == 5);
  req.output_len = 20;
  req.finished_len = 2;
  OK(api->trim_overshoot(c, &req, 2)); /* the primitive, as an engine with its own finish */
  EXPECT(req.kv_allocated_len == 48 && req.kv_committed_len == 48 && req.output_len == 2);
  OK(api->cache_finished_req(c, 9, 0, &req, 0));
  OK(api->cache_stats(c, &st));
  EXPECT(st.used_pages == 3);
  OK(api->cache_check(c, &report));
  EXPECT(report.violations == 0 && report.pages_in_rows == 3);

  OK(api->release_session(c, 9));
  OK(api->cache_stats(c, &st));
  EXPECT(st.used_pages == 0 && st.free_pages == 31 && st.free_rows == 4 && st.sessions == 0);
  EXPECT(api->commit(c, &req, 1) == SKV_ERR_INVALID_ARG); /* req holds no row */
  EXPECT(strlen(api->last_error()) > 0);
  api->cache_free(c);
  return 0;
}

int main(int argc, char **argv) {
  const char *path = argc > 1 ? argv[1] : SKV_LIBRARY;
  const skv_api *api;
  get_api_fn get_api;
  void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);

  if (!lib) {
    fprintf(stderr, "dlopen(%s): %s\n", path, dlerror());
    return 1;
  }
  get_api = lookup_get_api(lib);
  if (!get_api) {
    fprintf(stderr, "dlsym(skv_get_api): %s\n", dlerror());
    return 1;
  }
  EXPECT(get_api(999) == NULL);
  EXPECT(get_api(0) == NULL);
  EXPECT(get_api(SKV_ABI_VERSION - 1) == NULL);
  api = get_api(SKV_ABI_VERSION);
  if (!api) {
    fprintf(stderr, "skv_get_api(%u) returned NULL\n", (unsigned)SKV_ABI_VERSION);
    return 1;
  }
  EXPECT(api->abi_version == SKV_ABI_VERSION);
  /* The table this header describes must fit in what the library gave. */
  EXPECT(api->struct_size >= sizeof(skv_api));
  EXPECT(api->abi_version_fn() == SKV_ABI_VERSION);
  EXPECT(strcmp(api->version(), SKV_VERSION) == 0);
  EXPECT(api->get_api(SKV_ABI_VERSION) == api && api->get_api(SKV_ABI_VERSION + 1) == NULL);
  /* The table points at the library's own exports. */
  EXPECT(same_fn(&api->cache_new, lib, "skv_cache_new"));
  EXPECT(same_fn(&api->match_prefix, lib, "skv_match_prefix"));
  EXPECT(same_fn(&api->cache_free, lib, "skv_cache_free"));

  if (streaming_session(api) != 0) failed++;
  if (dlclose(lib) != 0) {
    fprintf(stderr, "dlclose: %s\n", dlerror());
    failed++;
  }
  if (failed) {
    fprintf(stderr, "dlopen test: %d check(s) failed\n", failed);
    return 1;
  }
  printf("dlopen test: %s through skv_get_api passed\n", path);
  return 0;
}
