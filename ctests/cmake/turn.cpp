// Streaming sessions through skv.hpp, as a C++ engine writes them (owned mode, then over
// the engine's own pools): the cache frees itself, failures arrive as skv::Error with the
// status and libskv's message.
#include <skv.hpp>

#include <cstdio>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

static_assert(!std::is_copy_constructible_v<skv::Cache>, "skv::Cache owns its handle");
static_assert(std::is_nothrow_move_constructible_v<skv::Cache>, "skv::Cache moves");
static_assert(std::is_base_of_v<std::runtime_error, skv::Error>, "skv::Error is an exception");

static int failed = 0;

#define EXPECT(cond)                                                            \
  do {                                                                          \
    if (!(cond)) {                                                              \
      std::fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #cond);  \
      ++failed;                                                                 \
    }                                                                           \
  } while (0)

// Runs `body`, which must throw skv::Error with `status` and a message mentioning `word`.
template <typename F>
static void expect_error(skv_status status, const char *word, F body) {
  try {
    body();
    std::fprintf(stderr, "expected skv::Error %s, nothing thrown\n", skv_status_str(status));
    ++failed;
  } catch (const skv::Error &e) {
    if (e.status() != status || std::strstr(e.what(), word) == nullptr) {
      std::fprintf(stderr, "expected %s mentioning '%s', got %s: %s\n",
                   skv_status_str(status), word, e.status_str(), e.what());
      ++failed;
    }
  }
}

constexpr uint32_t kPage = 16;
constexpr uint64_t kPages = 64;
constexpr uint32_t kRows = 8;
constexpr uint64_t kSession = 42;

// Prefill `prompt` tokens, then decode `rounds` verify rounds of `per_round` draft tokens.
static void decode(skv::Cache &cache, skv::Req &req, uint32_t prompt, uint32_t rounds,
                   uint32_t per_round) {
  cache.alloc_extend(req, prompt);
  cache.commit(req, prompt);
  for (uint32_t i = 0; i < rounds; ++i) {
    cache.alloc_extend(req, per_round);
    cache.commit(req, per_round);
  }
  req.set_output_len(rounds * per_round);
}

// External mode: an engine whose req_to_token row r maps position p to slot r*128 + p and
// which records what libskv hands back.
struct Engine {
  std::vector<std::vector<int32_t>> freed_kv;
  std::vector<int32_t> freed_rows;
};

static skv_pool_ops engine_ops() {
  skv_pool_ops ops{};
  ops.struct_size = sizeof ops;
  ops.read_row = [](void *, int32_t row, uint32_t start, uint32_t end, int32_t *out) {
    for (uint32_t p = start; p < end; ++p) *out++ = row * 128 + static_cast<int32_t>(p);
    return 0;
  };
  ops.free_kv = [](void *user_data, const int32_t *indices, size_t n) {
    static_cast<Engine *>(user_data)->freed_kv.emplace_back(indices, indices + n);
    return 0;
  };
  ops.free_row = [](void *user_data, int32_t row) {
    static_cast<Engine *>(user_data)->freed_rows.push_back(row);
    return 0;
  };
  return ops;
}

static std::vector<int32_t> range(int32_t lo, int32_t hi) {
  std::vector<int32_t> v;
  for (int32_t i = lo; i < hi; ++i) v.push_back(i);
  return v;
}

// One turn over the engine's pools: prompt 20, output 20 of which 4 are real (target 24);
// the page 16..31 keeps its committed tokens, 32..39 go back at finish, the rest at release.
static void external_mode() {
  Engine engine;
  skv::Cache cache(skv::make_config(kPage, 0, 4, 128), engine_ops(), &engine);
  skv::Req req;
  req.set_req_pool_idx(1).set_origin_input_len(20).set_output_len(20).set_finished_len(4);
  req.set_kv_allocated_len(40).set_kv_committed_len(40);
  cache.finished_req(kSession, 0, req);
  EXPECT(!req.has_row() && req.output_len() == 4);
  EXPECT(engine.freed_kv.size() == 1 && engine.freed_kv[0] == range(128 + 32, 128 + 40));
  EXPECT(engine.freed_rows.empty());
  EXPECT(cache.stats().sessions == 1 && cache.stats().total_pages == 0);  // external: what libskv knows
  cache.release_session(kSession);
  EXPECT(engine.freed_kv.size() == 2 && engine.freed_kv[1] == range(128, 128 + 24));
  EXPECT(engine.freed_rows == std::vector<int32_t>{1});
}

// A decode step of a running batch: one call extends every request, one commits them.
static void batch_step() {
  skv::Cache cache(skv::make_config(kPage, kPage * kPages, kRows, 512));
  std::vector<skv_req> reqs(3);
  for (skv_req &r : reqs) {
    skv::Req one;
    cache.alloc_row(one);
    r = one.raw();
  }
  std::vector<int32_t> loc = cache.alloc_extend_batch(reqs, {2, 1, 17});
  EXPECT(loc.size() == 20 && reqs[2].kv_allocated_len == 17);
  EXPECT(loc[0] + 1 == loc[1]);  // one page, consecutive slots
  cache.commit_batch(reqs, {2, 1, 17});
  EXPECT(reqs[0].kv_committed_len == 2 && reqs[2].kv_committed_len == 17);
  skv::Req last;
  int32_t one_loc[1] = {-1};
  cache.alloc_row(last);
  cache.alloc_extend(last, 1, one_loc);
  EXPECT(one_loc[0] == cache.row_indices(last.req_pool_idx(), 0, 1)[0]);
  expect_error(SKV_ERR_INVALID_ARG, "reqs[1]", [&] { cache.commit_batch(reqs, {0, 5, 0}); });
  EXPECT(reqs[1].kv_committed_len == 1);
}

int main() {
  batch_step();
  EXPECT(skv::abi_version() == SKV_ABI_VERSION);
  EXPECT(std::strlen(skv::version()) > 0);

  expect_error(SKV_ERR_INVALID_ARG, "page_size",
               [] { skv::Cache bad(skv::make_config(0, kPage * kPages, kRows, 512)); });

  skv::Cache cache(skv::make_config(kPage, kPage * kPages, kRows, 512));
  EXPECT(cache && cache.get() != nullptr);

  // Turn 1: prompt of 40, three rounds of 4 draft tokens, stop token at output 3: the
  // KV of positions 43..51 is overshoot; the page holding 32..47 keeps 43..47 mapped.
  skv::Req req;
  EXPECT(!req.has_row() && req.finished_len() == -1 && req.aux_state() == -1);
  req.set_origin_input_len(40);
  skv_match m = cache.match_prefix(kSession, 0, req, 39);
  EXPECT(m.hit == 0);
  EXPECT(!cache.checkpoint(kSession, 0, req));  // a first turn: the engine's own path
  cache.alloc_row(req);
  EXPECT(req.has_row());
  const int32_t row = req.req_pool_idx();
  decode(cache, req, 40, 3, 4);
  EXPECT(req.kv_allocated_len() == 52 && req.kv_committed_len() == 52);
  EXPECT(cache.row_indices(row, 0, 52).size() == 52);
  EXPECT(cache.stats().used_pages == 4);
  req.set_finished_len(3);
  cache.finished_req(kSession, 0, req);
  EXPECT(!req.has_row() && req.kv_allocated_len() == 0 && req.output_len() == 3);
  skv_stats st = cache.stats();
  EXPECT(st.used_pages == 3 && st.sessions == 1 && st.free_rows == kRows - 1);
  expect_error(SKV_ERR_INVALID_ARG, "skv_cache_set_trace", [&] { cache.set_trace("/nonexistent-dir/t.jsonl"); });
  cache.set_trace(nullptr);  // not traced: stopping is a no-op
  skv_held held = cache.session_held();
  EXPECT(held.full_tokens == 48 && held.rows == 1);  // ceil_align(43)
  EXPECT(cache.session_held({row}).rows == 0);

  // Turn 2: restores 43 tokens and continues inside the kept page.
  skv::Req next;
  next.set_origin_input_len(43 + 4);
  m = cache.match_prefix(kSession, 0, next, 46);
  EXPECT(m.hit == 1 && m.prefix_len == 43);
  EXPECT(next.req_pool_idx() == row && next.kv_allocated_len() == 43);
  EXPECT(cache.checkpoint(kSession, 0, next));  // a later turn: handled by the session
  decode(cache, next, 4, 1, 1);
  EXPECT(cache.stats().used_pages == 3);  // 48 tokens fill the kept page exactly
  skv::FlashInferBatch fi = cache.build_flashinfer({row});
  EXPECT(fi.kv_indptr.size() == 2 && fi.kv_indptr[0] == 0 && fi.kv_indptr[1] == 3);
  EXPECT(fi.kv_indices.size() == 3 && fi.kv_last_page_len[0] == 16);

  // An error leaves the req as it was and says which call failed.
  const skv_req before = next.raw();
  expect_error(SKV_ERR_INVALID_ARG, "commit", [&] { cache.commit(next, 1); });
  EXPECT(std::memcmp(&before, next.get(), sizeof before) == 0);
  expect_error(SKV_ERR_STATE, "", [&] { cache.release_session(kSession); });  // in flight

  cache.finished_req(kSession, 0, next);
  skv_check_report report = cache.check();
  EXPECT(report.violations == 0);
  EXPECT(report.pages_in_rows == 3 && report.pages_free == kPages - 4);

  // Moving the handle moves ownership; the moved-to cache still sees the session.
  skv::Cache other = std::move(cache);
  EXPECT(!cache && other.stats().sessions == 1);
  other.release_session(kSession);
  st = other.stats();
  EXPECT(st.used_pages == 0 && st.free_pages == kPages - 1 && st.free_rows == kRows);

  // Move-assignment frees the handle it replaces (valgrind and ASan would see a leak).
  other = skv::Cache(skv::make_config(kPage, kPage * kPages, kRows, 512));
  EXPECT(other.stats().sessions == 0);

  external_mode();

  if (failed) {
    std::fprintf(stderr, "turn.cpp: %d check(s) failed\n", failed);
    return 1;
  }
  std::printf("turn.cpp: sessions through skv.hpp passed\n");
  return 0;
}
