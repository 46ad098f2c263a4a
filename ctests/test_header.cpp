// skv.h consumed from C++17: the header compiles warning-free under -pedantic and a
// streaming turn runs through it (external mode, a miss, a finish with a trim, a release).
#include "skv.h"

#include <cstdio>
#include <cstring>
#include <vector>

namespace {

int passed = 0, failed = 0;

void check(bool ok, int line, const char *expr) {
  if (ok) {
    ++passed;
  } else {
    ++failed;
    std::fprintf(stderr, "%s:%d: FAILED: %s (last error: %s)\n", __FILE__, line, expr,
                 skv_last_error());
  }
}
#define CHECK(cond) check((cond), __LINE__, #cond)

struct Engine {
  std::vector<int32_t> table = std::vector<int32_t>(4 * 64);
  std::vector<int32_t> freed;
  std::vector<int32_t> freed_rows;
  Engine() {
    for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>(i);
  }
};

}  // namespace

// The callbacks have C language linkage, as skv_pool_ops's function pointers do.
extern "C" {
static int engine_read_row(void *ud, int32_t row, uint32_t start, uint32_t end, int32_t *out) {
  auto *e = static_cast<Engine *>(ud);
  std::memcpy(out, e->table.data() + row * 64 + start, (end - start) * sizeof(int32_t));
  return 0;
}
static int engine_free_kv(void *ud, const int32_t *indices, size_t n) {
  auto *e = static_cast<Engine *>(ud);
  e->freed.insert(e->freed.end(), indices, indices + n);
  return 0;
}
static int engine_free_row(void *ud, int32_t row) {
  static_cast<Engine *>(ud)->freed_rows.push_back(row);
  return 0;
}
}

int main() {
  Engine engine;
  skv_cache_config cfg{};
  cfg.struct_size = sizeof cfg;
  cfg.page_size = 4;
  cfg.num_rows = 4;
  cfg.max_context_len = 64;
  skv_pool_ops ops{};
  ops.struct_size = sizeof ops;
  ops.read_row = engine_read_row;
  ops.free_kv = engine_free_kv;
  ops.free_row = engine_free_row;
  skv_cache *cache = nullptr;
  CHECK(skv_cache_new_external(&cfg, &ops, &engine, &cache) == SKV_OK);
  CHECK(cache != nullptr);
  CHECK(skv_abi_version() == SKV_ABI_VERSION);
  CHECK(std::strlen(skv_version()) > 0);
  CHECK(skv_status_str(SKV_ERR_STATE) != nullptr);

  skv_req req;
  CHECK(skv_req_init(&req) == SKV_OK);
  req.origin_input_len = 10;
  skv_match m{};
  CHECK(skv_match_prefix(cache, 7, 0, &req, 9, 0, &m) == SKV_OK);
  CHECK(m.hit == 0 && m.prefix_len == 0);
  CHECK(std::strcmp(skv_last_error(), "") == 0);

  // row 1: 10 prompt tokens, 6 outputs of which 3 are real, 19 slots allocated
  req.req_pool_idx = 1;
  req.kv_committed_len = 15;
  req.kv_allocated_len = 19;
  req.output_len = 6;
  req.finished_len = 3;
  CHECK(skv_cache_finished_req(cache, 7, 0, &req, 0) == SKV_OK);
  CHECK(req.req_pool_idx == -1 && req.output_len == 3);
  // target 13: the page holding 12..15 stays, 16..18 go back
  CHECK((engine.freed == std::vector<int32_t>{64 + 16, 64 + 17, 64 + 18}));

  skv_held held{};
  CHECK(skv_session_held(cache, nullptr, 0, &held) == SKV_OK);
  CHECK(held.full_tokens == 16 && held.rows == 1 && held.sessions == 1);

  CHECK(skv_release_session(nullptr, 7) == SKV_ERR_NULL_ARG);
  CHECK(std::strlen(skv_last_error()) > 0);
  engine.freed.clear();
  CHECK(skv_release_session(cache, 7) == SKV_OK);
  CHECK(engine.freed.size() == 13 && engine.freed.front() == 64 && engine.freed.back() == 76);
  CHECK((engine.freed_rows == std::vector<int32_t>{1}));
  skv_cache_free(cache);
  skv_cache_free(nullptr);

  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
