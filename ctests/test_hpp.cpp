// skv.hpp's C++ side: exceptions thrown by C++ callbacks (skv::PoolOps, skv::EngineHooks)
// stop at the C boundary and reach the wrapper's caller once libskv has returned, with
// libskv's state as the C contract says (a failing read_row changed nothing, a failing free
// completed the call); skv::TurnGuard aborts a turn the engine unwinds out of; the device
// and free-function wrappers; the owned-pool wrappers end to end.
#include "skv.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <unistd.h>
#include <vector>

static_assert(std::is_abstract_v<skv::PoolOps>, "an engine supplies its own pools");
static_assert(!std::is_abstract_v<skv::EngineHooks>, "hooks default to dropping");
static_assert(!std::is_copy_constructible_v<skv::TurnGuard>, "one guard per turn");

namespace {

int passed = 0, failed = 0;

void record(bool ok, int line, const char *expr) {
  if (ok) {
    ++passed;
  } else {
    ++failed;
    std::fprintf(stderr, "%s:%d: FAILED: %s\n", __FILE__, line, expr);
  }
}
#define CHECK(cond) record((cond), __LINE__, #cond)

// What the engine's callbacks throw; `where` says which one.
struct EngineFault : std::runtime_error {
  explicit EngineFault(const std::string &where) : std::runtime_error(where) {}
};

// Runs `body`; true when it threw exactly E.
template <typename E, typename F>
bool throws(F body) {
  try {
    body();
  } catch (const E &) {
    return true;
  } catch (...) {
    return false;
  }
  return false;
}

// Runs `body`; the skv::Error status it threw, SKV_OK when none.
template <typename F>
skv_status error_of(F body) {
  try {
    body();
  } catch (const skv::Error &e) {
    return e.status();
  }
  return SKV_OK;
}

bool same(const skv_req &a, const skv_req &b) {
  return a.req_pool_idx == b.req_pool_idx && a.row_generation == b.row_generation &&
         a.kv_committed_len == b.kv_committed_len && a.kv_allocated_len == b.kv_allocated_len &&
         a.cache_protected_len == b.cache_protected_len &&
         a.swa_evicted_seqlen == b.swa_evicted_seqlen && a.origin_input_len == b.origin_input_len &&
         a.output_len == b.output_len && a.finished_len == b.finished_len &&
         a.lock_node == b.lock_node && a.lock_receipt == b.lock_receipt &&
         a.aux_state == b.aux_state;
}

std::vector<int32_t> range(int32_t lo, int32_t hi) {
  std::vector<int32_t> v;
  for (int32_t i = lo; i < hi; ++i) v.push_back(i);
  return v;
}

constexpr uint32_t kPage = 16;
constexpr uint32_t kRows = 4;
constexpr uint64_t kPages = 32;

// External mode: row r maps position p to slot r * 128 + p. Each callback records its call
// (before throwing, when told to throw) so a test sees which ones ran.
struct Pools : skv::PoolOps {
  enum Callback { kNone, kReadRow, kFreeKv, kFreeRow, kDecLockRef, kFreeAux };
  Callback fail = kNone;        // throws EngineFault
  Callback fail_int = kNone;    // throws an int, not a std::exception
  skv::Cache *reenter = nullptr;  // free_row calls a wrapper on it
  skv_status reenter_status = SKV_OK;
  int reads = 0;
  std::vector<int32_t> freed_kv, freed_rows;
  std::vector<uint64_t> locks;
  std::vector<int64_t> aux;

  void maybe_throw(Callback c) {
    if (fail == c) throw EngineFault(std::to_string(c));
    if (fail_int == c) throw static_cast<int>(c);
  }
  void read_row(int32_t row, uint32_t start, uint32_t end, int32_t *out) override {
    ++reads;
    maybe_throw(kReadRow);
    for (uint32_t p = start; p < end; ++p) *out++ = row * 128 + static_cast<int32_t>(p);
  }
  void free_kv(const int32_t *indices, std::size_t n) override {
    freed_kv.insert(freed_kv.end(), indices, indices + n);
    maybe_throw(kFreeKv);
  }
  void free_row(int32_t row) override {
    freed_rows.push_back(row);
    if (reenter) reenter_status = error_of([&] { reenter->session_held(); });
    maybe_throw(kFreeRow);
  }
  void dec_lock_ref(uint64_t lock_node, uint64_t /*lock_receipt*/) override {
    locks.push_back(lock_node);
    maybe_throw(kDecLockRef);
  }
  void free_aux(int64_t aux_state) override {
    aux.push_back(aux_state);
    maybe_throw(kFreeAux);
  }
  void clear() {
    fail = fail_int = kNone;
    reads = 0;
    freed_kv.clear();
    freed_rows.clear();
    locks.clear();
    aux.clear();
  }
};

// A first turn on row 1: prompt 20, output 20 of which 4 are real, 40 slots allocated.
skv::Req finished_turn_req() {
  skv::Req req;
  req.set_req_pool_idx(1).set_origin_input_len(20).set_output_len(20).set_finished_len(4);
  req.set_kv_allocated_len(40).set_kv_committed_len(40);
  return req;
}

// A read_row that throws fails the call and changes nothing; the caller gets the engine's
// own exception, not skv::Error. Fixed, the same call goes through.
void read_row_throws() {
  Pools pools;
  skv::Cache cache(skv::make_config(kPage, 0, kRows, 128), pools);
  skv::Req req = finished_turn_req();
  const skv_req before = req.raw();
  pools.fail = Pools::kReadRow;
  CHECK(throws<EngineFault>([&] { cache.finished_req(7, 0, req); }));
  CHECK(pools.reads == 1 && pools.freed_kv.empty() && pools.freed_rows.empty());
  CHECK(same(req.raw(), before));
  CHECK(cache.session_held().sessions == 0);
  pools.clear();
  cache.finished_req(7, 0, req);
  CHECK(pools.freed_kv == range(128 + 32, 128 + 40));
  CHECK(!req.has_row() && cache.session_held().sessions == 1);
}

// A free callback that throws: the call completed (every remaining callback ran, the
// session is gone) and the exception arrives after it; repeating the call frees nothing.
void free_callbacks_throw() {
  Pools pools;
  skv::Cache cache(skv::make_config(kPage, 0, kRows, 128), pools);
  skv::Req req = finished_turn_req();
  req.set_lock(5, 6).set_aux_state(9).set_aux_track(1, 11);
  CHECK(req.aux_track(0) == -1 && req.aux_track(1) == 11);
  cache.finished_req(7, 0, req);
  pools.clear();
  pools.fail = Pools::kFreeKv;
  CHECK(throws<EngineFault>([&] { cache.release_session(7); }));
  CHECK(pools.locks == std::vector<uint64_t>{5});
  CHECK(pools.freed_kv == range(128, 128 + 24));
  CHECK(pools.freed_rows == std::vector<int32_t>{1});
  CHECK((pools.aux == std::vector<int64_t>{9, 11}));
  CHECK(cache.session_held().sessions == 0);
  pools.clear();
  cache.release_session(7);
  CHECK(pools.freed_kv.empty() && pools.freed_rows.empty());

  // Two callbacks throw in one call: the first exception wins, whatever its type.
  req = finished_turn_req();
  req.set_lock(5, 6).set_aux_state(9);
  cache.finished_req(8, 0, req);
  pools.clear();
  pools.fail_int = Pools::kDecLockRef;
  pools.fail = Pools::kFreeAux;
  int thrown = 0;
  try {
    cache.release_branch(8, 0);
  } catch (int c) {
    thrown = c;
  }
  CHECK(thrown == Pools::kDecLockRef);
  CHECK(pools.aux == std::vector<int64_t>{9});
  CHECK(cache.session_held().sessions == 0);
}

// A C call made directly on the handle cannot receive the exception: only the status
// remains, and no later wrapper call rethrows it.
void direct_c_call() {
  Pools pools;
  skv::Cache cache(skv::make_config(kPage, 0, kRows, 128), pools);
  skv::Req req = finished_turn_req();
  cache.finished_req(7, 0, req);
  pools.fail = Pools::kFreeRow;
  CHECK(skv_release_session(cache.get(), 7) == SKV_ERR_CALLBACK);
  CHECK(std::strstr(skv::last_error(), "free_row") != nullptr);
  pools.clear();
  CHECK(error_of([&] { cache.session_held(); }) == SKV_OK);
  CHECK(cache.session_held().sessions == 0);
}

// A callback calling a wrapper gets SKV_ERR_STATE as skv::Error; caught there, the outer
// call is unaffected.
void callback_reenters() {
  Pools pools;
  skv::Cache cache(skv::make_config(kPage, 0, kRows, 128), pools);
  skv::Req req = finished_turn_req();
  cache.finished_req(7, 0, req);
  pools.reenter = &cache;
  CHECK(error_of([&] { cache.release_session(7); }) == SKV_OK);
  CHECK(pools.reenter_status == SKV_ERR_STATE);
  CHECK(pools.freed_rows == std::vector<int32_t>{1});
}

// Owned mode's hooks: a throwing dec_lock_ref reaches the caller; the release completed
// (free_aux ran, every page and row is back, the audit is clean).
struct Hooks : skv::EngineHooks {
  std::vector<uint64_t> locks;
  std::vector<int64_t> aux;
  bool fail = false;
  void dec_lock_ref(uint64_t lock_node, uint64_t /*lock_receipt*/) override {
    locks.push_back(lock_node);
    if (fail) throw EngineFault("dec_lock_ref");
  }
  void free_aux(int64_t aux_state) override { aux.push_back(aux_state); }
};

void owned_hooks_throw() {
  skv::Cache cache(skv::make_config(kPage, kPage * kPages, kRows, 256));
  Hooks hooks;
  cache.set_hooks(hooks);
  skv::Req req;
  req.set_origin_input_len(30).set_lock(7, 8).set_aux_state(3);
  CHECK(cache.match_prefix(1, 0, req, 29).hit == 0);
  cache.alloc_row(req);
  cache.alloc_extend(req, 30);
  cache.commit(req, 30);
  cache.finished_req(1, 0, req);
  hooks.fail = true;
  CHECK(throws<EngineFault>([&] { cache.release_session(1); }));
  CHECK(hooks.locks == std::vector<uint64_t>{7} && hooks.aux == std::vector<int64_t>{3});
  const skv_stats st = cache.stats();
  CHECK(st.sessions == 0 && st.used_pages == 0 && st.free_rows == kRows);
  CHECK(cache.check().violations == 0);

  // Removed, they are no longer called.
  cache.set_hooks(nullptr, nullptr);
  skv::Req again;
  again.set_origin_input_len(10).set_lock(9, 9);
  cache.match_prefix(2, 0, again, 9);
  cache.alloc_row(again);
  cache.alloc_extend(again, 10);
  cache.commit(again, 10);
  cache.finished_req(2, 0, again);
  cache.release_session(2);
  CHECK(hooks.locks.size() == 1);
}

// One turn's prefill in owned mode.
void prefill(skv::Cache &cache, skv::Req &req, uint32_t n) {
  cache.alloc_extend(req, n);
  cache.commit(req, n);
}

void turn_guard_owned() {
  skv::Cache cache(skv::make_config(kPage, kPage * kPages, kRows, 256));
  const uint64_t empty_free = kPages - 1;

  // The engine throws mid-turn: the guard aborts the first turn, nothing is held.
  skv::Req req;
  req.set_origin_input_len(40);
  cache.match_prefix(1, 0, req, 39);
  CHECK(throws<EngineFault>([&] {
    skv::TurnGuard guard(cache, 1, 0, req);
    cache.alloc_row(req);
    prefill(cache, req, 40);
    throw EngineFault("scheduler");
  }));
  skv_stats st = cache.stats();
  CHECK(!req.has_row());
  CHECK(st.sessions == 0 && st.free_pages == empty_free && st.free_rows == kRows);
  CHECK(cache.check().violations == 0);

  // finish() saves the turn; the guard is then spent.
  req.init();
  req.set_origin_input_len(40);
  cache.match_prefix(1, 0, req, 39);
  {
    skv::TurnGuard guard(cache, 1, 0, req);
    cache.alloc_row(req);
    prefill(cache, req, 40);
    guard.finish();
    CHECK(!guard.armed());
  }
  st = cache.stats();
  CHECK(st.sessions == 1 && st.used_pages == 3);

  // A later turn aborted by unwinding releases the whole session (its slot in flight).
  skv::Req next;
  next.set_origin_input_len(50);
  CHECK(cache.match_prefix(1, 0, next, 49).hit == 1);
  CHECK(throws<std::runtime_error>([&] {
    skv::TurnGuard guard(cache, 1, 0, next);
    prefill(cache, next, 10);
    throw std::runtime_error("client left");
  }));
  st = cache.stats();
  CHECK(st.sessions == 0 && st.free_pages == empty_free && st.free_rows == kRows);
  CHECK(cache.check().violations == 0);

  // release(): the engine finishes the turn itself, the guard does nothing.
  skv::Req own;
  own.set_origin_input_len(20);
  cache.match_prefix(2, 0, own, 19);
  {
    skv::TurnGuard guard(cache, 2, 0, own);
    cache.alloc_row(own);
    prefill(cache, own, 20);
    guard.release();
  }
  CHECK(own.has_row() && cache.stats().free_rows == kRows - 1);
  cache.finished_req(2, 0, own);
  CHECK(cache.stats().sessions == 1);

  // abort() ends the turn now and reports.
  skv::Req cut;
  cut.set_origin_input_len(24);
  cache.match_prefix(2, 0, cut, 23);
  {
    skv::TurnGuard guard(cache, 2, 0, cut);
    guard.abort();
    CHECK(!guard.armed());
  }
  st = cache.stats();
  CHECK(st.sessions == 0 && st.free_pages == empty_free && cache.check().violations == 0);
}

void turn_guard_external() {
  Pools pools;
  skv::Cache cache(skv::make_config(kPage, 0, kRows, 128), pools);

  // finish() whose read_row throws changed nothing: the guard stays armed and, on the way
  // out, aborts the turn (row and KV handed back).
  skv::Req req = finished_turn_req();
  pools.fail = Pools::kReadRow;
  {
    skv::TurnGuard guard(cache, 7, 0, req);
    CHECK(throws<EngineFault>([&] { guard.finish(); }));
    CHECK(guard.armed() && req.has_row());
    pools.fail = Pools::kNone;
  }
  CHECK(pools.freed_kv == range(128, 128 + 40));
  CHECK(pools.freed_rows == std::vector<int32_t>{1});
  CHECK(!req.has_row() && cache.session_held().sessions == 0);

  // finish() whose free_kv throws took effect: the guard is spent, the slot saved.
  pools.clear();
  req = finished_turn_req();
  {
    skv::TurnGuard guard(cache, 7, 0, req);
    pools.fail = Pools::kFreeKv;
    CHECK(throws<EngineFault>([&] { guard.finish(); }));
    CHECK(!guard.armed());
  }
  CHECK(cache.session_held().sessions == 1 && pools.freed_rows.empty());
  pools.clear();
  cache.release_session(7);

  // Aborting while unwinding, with a free callback throwing too: no std::terminate, the
  // engine's first exception propagates, the session is released.
  pools.clear();
  req = finished_turn_req();
  pools.fail_int = Pools::kFreeRow;
  CHECK(throws<EngineFault>([&] {
    skv::TurnGuard guard(cache, 9, 0, req);
    throw EngineFault("scheduler");
  }));
  CHECK(pools.freed_rows == std::vector<int32_t>{1} && cache.session_held().sessions == 0);
}

// The device copy's wrappers in a build without CUDA: clear refusals, as skv::Error.
void device() {
  skv::Cache cache(skv::make_config(kPage, kPage * kPages, kRows, 256));
  const skv_status attach = error_of([&] { cache.device_attach(0); });
  CHECK(attach == SKV_ERR_UNSUPPORTED || attach == SKV_ERR_CUDA);
  const skv_status sync = error_of([&] { cache.device_sync(); });
  CHECK(sync == SKV_ERR_UNSUPPORTED || sync == SKV_ERR_STATE);
  Pools pools;
  skv::Cache external(skv::make_config(kPage, 0, kRows, 128), pools);
  CHECK(error_of([&] { external.device_attach(0, nullptr); }) == SKV_ERR_UNSUPPORTED);
  CHECK(error_of([&] { external.device_sync(); }) == SKV_ERR_UNSUPPORTED);
  CHECK(pools.reads == 0 && pools.freed_kv.empty());
}

void free_functions() {
  CHECK(std::strcmp(skv::status_str(SKV_ERR_STATE), "SKV_ERR_STATE") == 0);
  CHECK(skv::abi_version() == SKV_ABI_VERSION);
  CHECK(std::strcmp(skv::version(), SKV_VERSION) == 0);
  skv::Cache cache(skv::make_config(kPage, kPage * kPages, kRows, 256));
  skv::Req req;
  CHECK(error_of([&] { cache.commit(req, 1); }) == SKV_ERR_INVALID_ARG);
  CHECK(std::strstr(skv::last_error(), "skv_commit") != nullptr);
  req.set_output_len(5).set_lock(1, 2);
  req.init();
  CHECK(req.output_len() == 0 && req.lock_node() == 0 && req.finished_len() == -1);

  // The C-callback constructor, as a dlopen-free C engine's glue would use it.
  Pools pools;
  const skv_pool_ops ops = skv::pool_ops_for(pools);
  skv::Cache external(skv::make_config(kPage, 0, kRows, 128), ops, &pools);
  skv::Req turn = finished_turn_req();
  external.finished_req(7, 0, turn);
  CHECK(pools.freed_kv == range(128 + 32, 128 + 40));
}

// The owned pool's primitives through the wrapper: a prefix-tree hit mapped into a row, a
// prefix published, the tail and overshoot frees, a branch released, a trace written.
void owned_primitives() {
  skv::Cache cache(skv::make_config(kPage, kPage * kPages, kRows, 256));
  std::vector<int32_t> tree = cache.pool_alloc(32);
  CHECK(tree.size() == 32 && cache.page_refs(tree) == std::vector<uint32_t>(32, 0));
  skv::Req req;
  cache.alloc_row(req);
  cache.map_prefix(req, tree);
  CHECK(req.cache_protected_len() == 32 && req.kv_allocated_len() == 32);
  CHECK(cache.page_refs(tree) == std::vector<uint32_t>(32, 1));
  prefill(cache, req, 16);
  cache.publish_prefix(req, 48);
  CHECK(req.cache_protected_len() == 48);
  const std::vector<int32_t> held = cache.row_indices(req.req_pool_idx(), 0, 48);
  prefill(cache, req, 30);  // 78 tokens
  cache.free_tail(req, 70);
  CHECK(req.kv_allocated_len() == 70 && cache.stats().tail_freed_tokens == 8);
  req.set_origin_input_len(60).set_output_len(10);
  cache.trim_overshoot(req, 4);
  CHECK(req.kv_allocated_len() == 64 && req.output_len() == 4);
  cache.free_aligned(req.req_pool_idx(), 50, 64);
  req.set_kv_allocated_len(50).set_kv_committed_len(50);
  CHECK(cache.row_indices(req.req_pool_idx(), 0, 50).size() == 50);
  cache.free_req(req);
  CHECK(!req.has_row());
  cache.pool_free(held);
  skv_stats st = cache.stats();
  CHECK(st.used_pages == 0 && st.free_rows == kRows && cache.check().violations == 0);

  // A branch of its own, traced to a file.
  char path[] = "/tmp/skv_test_hpp_XXXXXX";
  const int fd = mkstemp(path);
  CHECK(fd >= 0);
  if (fd >= 0) close(fd);
  cache.set_trace(path);
  skv::Req branch;
  branch.set_origin_input_len(20);
  cache.match_prefix(3, 1, branch, 19);
  cache.alloc_row(branch);
  prefill(cache, branch, 20);
  CHECK(!cache.checkpoint(3, 2, branch) && cache.checkpoint(3, 1, branch) == false);
  cache.finished_req(3, 1, branch);
  CHECK(cache.checkpoint(3, 1, branch));
  cache.release_branch(3, 1);
  cache.set_trace(nullptr);
  std::FILE *trace = std::fopen(path, "r");
  std::string text;
  if (trace) {
    char buf[4096];
    std::size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, trace)) > 0) text.append(buf, n);
    std::fclose(trace);
  }
  std::remove(path);
  CHECK(text.find("skv_release_branch") != std::string::npos);
  CHECK(cache.stats().sessions == 0 && cache.check().violations == 0);
}

}  // namespace

// The scheduler's view (usage, idle order, admission) and a matched request handed back.
void scheduler_queries() {
  skv::Cache cache(skv::make_config(kPage, kPage * kPages, kRows, 256));
  for (uint64_t session : {1u, 2u}) {
    skv::Req req;
    req.set_origin_input_len(30);
    cache.match_prefix(session, 0, req, 29);
    cache.alloc_row(req);
    prefill(cache, req, 30);
    cache.finished_req(session, 0, req);
  }
  const auto idle = cache.idle_sessions();
  CHECK((idle == std::vector<std::pair<uint64_t, uint64_t>>{{1, 0}, {2, 0}}));
  const skv_usage u = cache.session_usage(1);
  CHECK(u.slots == 1 && u.in_flight == 0 && u.allocated_tokens == 30 && u.pages == (30 + kPage - 1) / kPage);
  CHECK(cache.branch_usage(1, 5).slots == 0);
  const skv_admission a = cache.admission_pages(1, 0, 39, 40);
  CHECK(a.hit == 1 && a.prefix_len == 30);

  skv::Req next;
  next.set_origin_input_len(40);
  CHECK(cache.match_prefix(1, 0, next, 39).hit == 1);
  CHECK(cache.session_usage(1).in_flight == 1);
  cache.hand_back(1, 0, next);
  CHECK(!next.has_row() && cache.session_usage(1).in_flight == 0);
  CHECK(cache.idle_sessions().front().first == 1);  // handed back: its place is unchanged
  CHECK(throws<skv::Error>([&] { cache.hand_back(1, 0, next); }));
  CHECK(cache.check().violations == 0);
}

// Hybrid pools: a window step frees the SWA side only; the release then splits at the cursor.
struct HybridPools : skv::HybridPoolOps {
  struct Piece {
    int32_t row;
    uint32_t first_pos, n, pools;
    int32_t first_index;
    bool operator==(const Piece &o) const {
      return row == o.row && first_pos == o.first_pos && n == o.n && pools == o.pools &&
             first_index == o.first_index;
    }
  };
  std::vector<Piece> pieces;
  std::vector<int32_t> freed_rows;
  void read_row(int32_t row, uint32_t start, uint32_t end, int32_t *out) override {
    for (uint32_t p = start; p < end; ++p) out[p - start] = row * 1000 + static_cast<int32_t>(p);
  }
  void free_row(int32_t row) override { freed_rows.push_back(row); }
  void free_kv_segment(int32_t row, uint32_t first_pos, const int32_t *indices, std::size_t n,
                       uint32_t pools) override {
    pieces.push_back({row, first_pos, static_cast<uint32_t>(n), pools, indices[0]});
  }
};

void hybrid_pools() {
  HybridPools pools;
  skv::Cache cache(skv::make_config(kPage, 0, kRows, 128), pools);
  skv::Req req;
  req.set_req_pool_idx(1).set_origin_input_len(64).set_output_len(0);
  req.set_kv_allocated_len(64).set_kv_committed_len(64);
  // window 16 at page 16: the cursor rises to 64 - 16 = 48
  CHECK(cache.swa_evict(req, 64, 16, 1) == 48);
  CHECK(req.swa_evicted_seqlen() == 48 && req.swa_evict_floor() == 0);
  CHECK((pools.pieces == std::vector<HybridPools::Piece>{{1, 0, 48, SKV_POOL_SWA, 1000}}));
  cache.finished_req(7, 0, req);
  pools.pieces.clear();
  cache.release_session(7);
  CHECK((pools.pieces == std::vector<HybridPools::Piece>{{1, 0, 48, SKV_POOL_FULL, 1000},
                                                         {1, 48, 16, SKV_POOL_BOTH, 1048}}));
  CHECK(pools.freed_rows == std::vector<int32_t>{1});
}

// make_config's last parameter sizes owned mode's sliding-window pool: a window step gives
// its pages back while the row keeps its full-pool pages. Left out, there is none.
void owned_swa_pool() {
  const skv_cache_config plain = skv::make_config(kPage, kPage * kPages, kRows, 256);
  CHECK(plain.struct_size == sizeof(skv_cache_config) && plain.swa_num_token_slots == 0);
  CHECK(skv::Cache(plain).stats().swa_total_pages == 0);
  const skv_cache_config cfg = skv::make_config(kPage, kPage * kPages, kRows, 256, 0, kPage * 8);
  CHECK(cfg.swa_num_token_slots == kPage * 8 && cfg.num_token_slots == kPage * kPages);
  skv::Cache cache(cfg);
  CHECK(cache.stats().swa_total_pages == 8 && cache.stats().swa_free_pages == 7);
  skv::Req req;
  cache.alloc_row(req);
  prefill(cache, req, 64);  // 4 pages in each pool
  CHECK(cache.stats().swa_used_pages == 4 && cache.stats().used_pages == 4);
  // window 16 at page 16: positions [0, 48) slide out, 3 SWA pages back
  CHECK(cache.swa_evict(req, 64, 16, 1) == 48);
  CHECK(cache.stats().swa_used_pages == 1 && cache.stats().used_pages == 4);
  const std::vector<int32_t> swa = cache.row_swa_indices(req.req_pool_idx(), 0, 64);
  CHECK(swa[47] == 0 && swa[48] != 0);
  // more pages than the SWA pool holds: refused, nothing allocated
  skv::Req other;
  cache.alloc_row(other);
  CHECK(error_of([&] { cache.alloc_extend(other, 7 * kPage); }) == SKV_ERR_OUT_OF_MEMORY);
  CHECK(other.kv_allocated_len() == 0 && cache.stats().swa_used_pages == 1);
  cache.free_req(other);
  cache.free_req(req);
  CHECK(cache.stats().swa_free_pages == 7 && cache.stats().free_pages == kPages - 1);
}

// The descriptor glue: runs merge where both sides' ids are consecutive; a bad layout throws.
void transfer_glue() {
  const uint64_t mine[2] = {0x1000, 0x9000}, theirs[2] = {0x100000, 0x200000};
  const skv_kv_layout l{sizeof(skv_kv_layout), 2, mine, 64, 64};
  const skv_kv_layout r{sizeof(skv_kv_layout), 2, theirs, 64, 64};
  auto d = skv::transfer_descs(l, {1, 2, 3, 9}, r, {4, 5, 6, 7});
  CHECK(d.size() == 4);
  CHECK(d[0].local_addr == 0x1000 + 64 && d[0].remote_addr == 0x100000 + 4 * 64 && d[0].len == 192);
  CHECK(d[1].local_addr == 0x1000 + 9 * 64 && d[1].len == 64);
  CHECK(d[2].local_addr == 0x9000 + 64);
  CHECK(skv::transfer_descs(l, {}, r, {}).empty());
  const skv_kv_layout bad{sizeof(skv_kv_layout), 2, theirs, 64, 32};
  CHECK(throws<skv::Error>([&] { skv::transfer_descs(l, {1}, bad, {1}); }));

  // A move's unit, and the destination's answer about it.
  skv::Cache a(skv::make_config(kPage, kPage * kPages, kRows, 256));
  skv::Cache b(skv::make_config(kPage, kPage * kPages, kRows, 256));
  skv::Req req;
  a.alloc_row(req);
  prefill(a, req, 20);
  req.set_origin_input_len(20);
  a.finished_req(1, 0, req);
  std::vector<uint8_t> unit;
  const uint64_t t = a.session_export(1, 0, unit, SKV_EXPORT_MOVE);
  CHECK(t != 0 && unit.size() == 104 + 4 * 2);
  CHECK(b.session_fence(unit) == SKV_FENCE_ABSENT);
  CHECK(throws<skv::Error>([&] { b.session_fence(std::vector<uint8_t>(8)); }));
  a.ticket_done(t, 1);
}

int main() {
  read_row_throws();
  free_callbacks_throw();
  direct_c_call();
  callback_reenters();
  owned_hooks_throw();
  turn_guard_owned();
  turn_guard_external();
  device();
  free_functions();
  owned_primitives();
  scheduler_queries();
  hybrid_pools();
  owned_swa_pool();
  transfer_glue();
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
