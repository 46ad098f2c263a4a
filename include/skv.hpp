// libskv C++17 wrapper, header-only, over the C API of skv.h. What each operation does is the
// C API's: see skv.h and docs/operations.md.
//
// Naming rule: the C function skv_[<type>_]<verb> is <verb> on the object it acts on.
// - A function whose first parameter is a skv_cache * is the method <verb> of skv::Cache,
//   a skv_req * the method <verb> of skv::Req; the skv_ prefix and the type's own name go
//   (skv_cache_stats -> Cache::stats, skv_match_prefix -> Cache::match_prefix,
//   skv_device_sync -> Cache::device_sync, skv_req_init -> Req::init).
// - Creating and destroying an object is its constructor and destructor: skv_cache_new ->
//   Cache(cfg), skv_cache_new_external -> Cache(cfg, c_ops, user_data) and
//   Cache(cfg, PoolOps &) and Cache(cfg, HybridPoolOps &), skv_cache_free -> ~Cache.
// - A function acting on no object is the free function skv::<verb> (skv_version ->
//   skv::version, skv_status_str -> skv::status_str).
// Unwrapped: skv_get_api  (the dlopen table; C++ code that links libskv calls the functions)
// ctests/hpp_complete.sh fails when a function of skv.h has no wrapper by this rule.
//
// Errors: every failing call throws skv::Error carrying the skv_status and skv_last_error()'s
// text; as in C, a failed call changed nothing, except SKV_ERR_CALLBACK from a free callback.
// Callbacks: skv::EngineHooks (owned mode) and skv::PoolOps (external mode) are C++
// interfaces whose methods may throw. The C trampolines catch every exception, return
// non-zero (libskv reports SKV_ERR_CALLBACK and, as for any free callback failure, still
// runs the remaining ones), and the wrapper method that made the call rethrows the first
// exception once the C call has returned. skv::TurnGuard aborts a running turn when the
// engine unwinds past it.
#ifndef SKV_HPP
#define SKV_HPP

#include "skv.h"

#include <cstddef>
#include <cstdint>
#include <exception>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace skv {

/// A libskv call failed: status() is its skv_status, what() the skv_last_error() text.
/// As in C, a failed call changed nothing, except SKV_ERR_CALLBACK from an engine free
/// callback failing part-way: that call took effect and its outputs were written.
class Error : public std::runtime_error {
 public:
  Error(skv_status status, const std::string &message)
      : std::runtime_error(message), status_(status) {}
  skv_status status() const noexcept { return status_; }
  /// The status code's own name, e.g. "SKV_ERR_INVALID_ARG".
  const char *status_str() const noexcept { return skv_status_str(status_); }

 private:
  skv_status status_;
};

namespace detail {

// skv_last_error() is only valid until the next call on this thread: copy it right away.
inline void check(skv_status status) {
  if (status == SKV_OK) return;
  const char *message = skv_last_error();
  throw Error(status, message && *message ? std::string(message)
                                          : std::string(skv_status_str(status)));
}

// What a C++ callback threw during the wrapper call running on this thread. Callbacks run
// on the thread that called libskv, so a thread-local slot reaches the right call.
struct Pending {
  bool active = false;  // a wrapper call is running: there is someone to rethrow to
  std::exception_ptr error;
};
inline Pending &pending() noexcept {
  thread_local Pending slot;
  return slot;
}

// Makes one C call that may run C++ callbacks, then rethrows the first exception a callback
// threw (the C call itself returned SKV_ERR_CALLBACK), or throws skv::Error for a failure.
// A callback that calls a wrapper (which libskv refuses with SKV_ERR_STATE) nests a scope.
template <typename CCall>
void call(CCall &&c_call) {
  Pending outer = std::exchange(pending(), Pending{true, nullptr});
  const skv_status status = c_call();
  std::exception_ptr thrown = std::exchange(pending(), std::move(outer)).error;
  if (thrown) std::rethrow_exception(thrown);
  check(status);
}

// The body of every trampoline: no exception crosses into libskv. Outside a wrapper call
// (a C call made directly on a handle) the exception has nowhere to go and only the
// non-zero status remains.
template <typename Body>
int guarded(Body &&body) noexcept {
  try {
    body();
    return 0;
  } catch (...) {
    Pending &slot = pending();
    if (slot.active && !slot.error) slot.error = std::current_exception();
    return 1;
  }
}

}  // namespace detail

/// skv_status_str: the status code's name; never NULL.
inline const char *status_str(skv_status s) noexcept { return skv_status_str(s); }
/// skv_last_error: this thread's last failure text ("" after a success). skv::Error already
/// carries it; this is for code mixing C calls in.
inline const char *last_error() noexcept { return skv_last_error(); }
inline uint32_t abi_version() noexcept { return skv_abi_version(); }
inline const char *version() noexcept { return skv_version(); }

/// The ranges a transfer engine moves `remote_pages` into `local_pages` with, contiguous runs
/// merged (skv_transfer_descs; docs/transfer.md#the-nixl-glue).
inline std::vector<skv_xfer_desc> transfer_descs(const skv_kv_layout &local,
                                                 const std::vector<int32_t> &local_pages,
                                                 const skv_kv_layout &remote,
                                                 const std::vector<int32_t> &remote_pages) {
  if (local_pages.size() != remote_pages.size()) {
    throw std::invalid_argument("transfer_descs: local_pages and remote_pages differ in length");
  }
  size_t n = 0;
  std::vector<skv_xfer_desc> out;
  skv_status s = skv_transfer_descs(&local, local_pages.data(), &remote, remote_pages.data(),
                                    local_pages.size(), nullptr, 0, &n);
  if (s == SKV_ERR_BUFFER) {
    out.resize(n);
    s = skv_transfer_descs(&local, local_pages.data(), &remote, remote_pages.data(),
                           local_pages.size(), out.data(), out.size(), &n);
  }
  detail::check(s);
  out.resize(n);
  return out;
}

/// A cache configuration with struct_size filled in. swa_num_token_slots sizes owned mode's
/// sliding-window pool (0: none; docs/hybrid.md, "Owned mode: two pools").
inline skv_cache_config make_config(uint32_t page_size, uint64_t num_token_slots,
                                    uint32_t num_rows, uint32_t max_context_len,
                                    uint32_t flags = 0,
                                    uint64_t swa_num_token_slots = 0) noexcept {
  skv_cache_config cfg{};
  cfg.struct_size = sizeof(skv_cache_config);
  cfg.page_size = page_size;
  cfg.num_token_slots = num_token_slots;
  cfg.num_rows = num_rows;
  cfg.max_context_len = max_context_len;
  cfg.flags = flags;
  cfg.swa_num_token_slots = swa_num_token_slots;
  return cfg;
}

/// Owned mode's engine callbacks (skv_engine_hooks) as an interface: what a released session
/// hands back to the engine. The defaults drop it, as a NULL hook does. A method fails by
/// throwing; the exception reaches the caller of the libskv call (see the top of this file).
/// No method may call libskv with a handle (libskv answers SKV_ERR_STATE).
class EngineHooks {
 public:
  virtual ~EngineHooks() = default;
  /// Drop the prefix-tree lock a session inherited from its first request.
  virtual void dec_lock_ref(uint64_t /*lock_node*/, uint64_t /*lock_receipt*/) {}
  /// Free one engine auxiliary-state handle (e.g. a mamba pool slot or a track entry; never
  /// -1), in the order aux_state, aux_track[0], aux_track[1].
  virtual void free_aux(int64_t /*aux*/) {}
  /// Enqueue the host tier's copies of `ticket` (skv_copy_pages_fn, docs/tiers.md): src[i] to
  /// dst[i], n_full pairs in the full pools then n_swa in the SWA pools. The default throws: a
  /// handle with a host tier needs an override (the libskv call then reports SKV_ERR_CALLBACK
  /// and changes nothing).
  virtual void copy_pages(uint64_t /*ticket*/, uint32_t /*direction*/, const int32_t * /*src*/,
                          const int32_t * /*dst*/, std::size_t /*n_full*/, std::size_t /*n_swa*/) {
    throw std::logic_error("skv::EngineHooks::copy_pages is not overridden");
  }
};

/// External mode's engine pools (skv_pool_ops) as an interface, with EngineHooks' two
/// methods for the lock and the aux state. Read skv.h's skv_pool_ops and
/// docs/external-mode.md: read_row failing changes nothing; a free method failing leaves
/// the call completed (libskv will never hand those indices back again).
class PoolOps : public EngineHooks {
 public:
  /// Copy req_to_token[row, start:end) into out (end - start values).
  virtual void read_row(int32_t row, uint32_t start, uint32_t end, int32_t *out) = 0;
  /// Return these KV slot indices to the engine's allocator (valid during the call only).
  virtual void free_kv(const int32_t *indices, std::size_t n) = 0;
  /// Return a req_to_token row to the engine's row pool.
  virtual void free_row(int32_t row) = 0;
};

/// A PoolOps for hybrid (full + sliding-window) pools: every KV free arrives split by pools
/// through free_kv_segment (skv_pool_ops.free_kv_segment, docs/hybrid.md), never through
/// free_kv.
class HybridPoolOps : public PoolOps {
 public:
  /// Return the KV slots of row positions [first_pos, first_pos + n) to the pools `pools`
  /// names (SKV_POOL_FULL, SKV_POOL_SWA or SKV_POOL_BOTH).
  virtual void free_kv_segment(int32_t row, uint32_t first_pos, const int32_t *indices,
                               std::size_t n, uint32_t pools) = 0;
  /// Never called: free_kv_segment takes every free.
  void free_kv(const int32_t * /*indices*/, std::size_t /*n*/) final {}
};

namespace detail {
// C entry points for an object of type T reached through user_data, which holds a T *
// converted to void * (so the cast back is to the same type).
template <typename T>
struct Trampolines {
  static int read_row(void *self, int32_t row, uint32_t start, uint32_t end,
                      int32_t *out) noexcept {
    return guarded([&] { static_cast<T *>(self)->read_row(row, start, end, out); });
  }
  static int free_kv(void *self, const int32_t *indices, std::size_t n) noexcept {
    return guarded([&] { static_cast<T *>(self)->free_kv(indices, n); });
  }
  static int free_row(void *self, int32_t row) noexcept {
    return guarded([&] { static_cast<T *>(self)->free_row(row); });
  }
  static int dec_lock_ref(void *self, uint64_t lock_node, uint64_t lock_receipt) noexcept {
    return guarded([&] { static_cast<T *>(self)->dec_lock_ref(lock_node, lock_receipt); });
  }
  static int free_aux(void *self, int64_t aux) noexcept {
    return guarded([&] { static_cast<T *>(self)->free_aux(aux); });
  }
  static int copy_pages(void *self, uint64_t ticket, uint32_t direction, const int32_t *src,
                        const int32_t *dst, std::size_t n_full, std::size_t n_swa) noexcept {
    return guarded(
        [&] { static_cast<T *>(self)->copy_pages(ticket, direction, src, dst, n_full, n_swa); });
  }
  static int free_kv_segment(void *self, int32_t row, uint32_t first_pos, const int32_t *indices,
                             std::size_t n, uint32_t pools) noexcept {
    return guarded(
        [&] { static_cast<T *>(self)->free_kv_segment(row, first_pos, indices, n, pools); });
  }
};
}  // namespace detail

namespace detail {
// The callbacks both PoolOps kinds share; the caller adds its KV free.
template <typename T>
skv_pool_ops pool_ops_common() noexcept {
  skv_pool_ops c{};
  c.struct_size = sizeof(skv_pool_ops);
  c.read_row = &Trampolines<T>::read_row;
  c.free_row = &Trampolines<T>::free_row;
  c.dec_lock_ref = &Trampolines<T>::dec_lock_ref;
  c.free_aux = &Trampolines<T>::free_aux;
  return c;
}
}  // namespace detail

/// The skv_pool_ops whose callbacks call `ops`; pass &ops as user_data.
inline skv_pool_ops pool_ops_for(PoolOps & /*ops*/) noexcept {
  skv_pool_ops c = detail::pool_ops_common<PoolOps>();
  c.free_kv = &detail::Trampolines<PoolOps>::free_kv;
  return c;
}

/// The skv_pool_ops whose callbacks call a HybridPoolOps `ops` (free_kv_segment set, free_kv
/// NULL); pass &ops as user_data.
inline skv_pool_ops pool_ops_for(HybridPoolOps & /*ops*/) noexcept {
  skv_pool_ops c = detail::pool_ops_common<HybridPoolOps>();
  c.free_kv_segment = &detail::Trampolines<HybridPoolOps>::free_kv_segment;
  return c;
}

/// The skv_engine_hooks whose callbacks call `hooks`; pass &hooks as user_data.
inline skv_engine_hooks engine_hooks_for(EngineHooks & /*hooks*/) noexcept {
  using T = detail::Trampolines<EngineHooks>;
  skv_engine_hooks c{};
  c.struct_size = sizeof(skv_engine_hooks);
  c.dec_lock_ref = &T::dec_lock_ref;
  c.free_aux = &T::free_aux;
  c.copy_pages = &T::copy_pages;
  return c;
}

/// One request's KV bookkeeping, as skv_req_init leaves it: no row, lengths 0,
/// finished_len -1, no lock, aux_state and both aux_track entries -1.
class Req {
 public:
  Req() { init(); }
  explicit Req(const skv_req &raw) noexcept : req_(raw) {}

  /// skv_req_init: back to holding nothing.
  void init() { detail::check(skv_req_init(&req_)); }

  skv_req &raw() noexcept { return req_; }
  const skv_req &raw() const noexcept { return req_; }
  skv_req *get() noexcept { return &req_; }
  const skv_req *get() const noexcept { return &req_; }

  /// Holds a req_to_token row.
  bool has_row() const noexcept { return req_.req_pool_idx >= 0; }

  int32_t req_pool_idx() const noexcept { return req_.req_pool_idx; }
  /// The row's generation libskv stamped (0 = not stamped); libskv's alone to set.
  uint32_t row_generation() const noexcept { return req_.row_generation; }
  uint32_t kv_committed_len() const noexcept { return req_.kv_committed_len; }
  uint32_t kv_allocated_len() const noexcept { return req_.kv_allocated_len; }
  uint32_t cache_protected_len() const noexcept { return req_.cache_protected_len; }
  uint32_t swa_evicted_seqlen() const noexcept { return req_.swa_evicted_seqlen; }
  uint32_t swa_evict_floor() const noexcept { return req_.swa_evict_floor; }
  uint32_t origin_input_len() const noexcept { return req_.origin_input_len; }
  uint32_t output_len() const noexcept { return req_.output_len; }
  int32_t finished_len() const noexcept { return req_.finished_len; }
  uint64_t lock_node() const noexcept { return req_.lock_node; }
  uint64_t lock_receipt() const noexcept { return req_.lock_receipt; }
  int64_t aux_state() const noexcept { return req_.aux_state; }
  /// Recurrent state's ping-pong track entry i (0 or 1); -1 = empty.
  int64_t aux_track(size_t i) const noexcept { return req_.aux_track[i]; }

  // Setters return *this so a turn's fields can be set in one expression. In owned mode
  // libskv maintains the row, committed, allocated and protected fields itself.
  Req &set_req_pool_idx(int32_t v) noexcept { req_.req_pool_idx = v; return *this; }
  Req &set_kv_committed_len(uint32_t v) noexcept { req_.kv_committed_len = v; return *this; }
  Req &set_kv_allocated_len(uint32_t v) noexcept { req_.kv_allocated_len = v; return *this; }
  Req &set_cache_protected_len(uint32_t v) noexcept { req_.cache_protected_len = v; return *this; }
  Req &set_swa_evicted_seqlen(uint32_t v) noexcept { req_.swa_evicted_seqlen = v; return *this; }
  Req &set_swa_evict_floor(uint32_t v) noexcept { req_.swa_evict_floor = v; return *this; }
  Req &set_origin_input_len(uint32_t v) noexcept { req_.origin_input_len = v; return *this; }
  Req &set_output_len(uint32_t v) noexcept { req_.output_len = v; return *this; }
  Req &set_finished_len(int32_t v) noexcept { req_.finished_len = v; return *this; }
  Req &set_lock(uint64_t node, uint64_t receipt) noexcept {
    req_.lock_node = node;
    req_.lock_receipt = receipt;
    return *this;
  }
  Req &set_aux_state(int64_t v) noexcept { req_.aux_state = v; return *this; }
  Req &set_aux_track(size_t i, int64_t v) noexcept { req_.aux_track[i] = v; return *this; }

 private:
  skv_req req_{};
};

/// FlashInfer's paged-KV triple for a batch of rows (see skv_build_flashinfer).
struct FlashInferBatch {
  std::vector<int32_t> kv_indptr;         // rows + 1 prefix sums of page counts
  std::vector<int32_t> kv_indices;        // page ids
  std::vector<int32_t> kv_last_page_len;  // per row, 1..page_size; 0 for an empty row
};

/// The device copy of req_to_token after skv_device_sync.
struct DeviceRows {
  uint64_t device_ptr;  // int32 values, num_rows x row_stride
  uint64_t row_stride;  // in int32 values (max_context_len)
};

/// Owns one skv_cache handle: one KV pool (per tensor-parallel rank).
class Cache {
 public:
  /// An empty Cache (no handle), e.g. a member assigned later by move.
  Cache() noexcept = default;
  /// Owned mode (skv_cache_new): libskv owns the KV pool and the req_to_token rows.
  explicit Cache(const skv_cache_config &cfg) {
    detail::call([&] { return skv_cache_new(&cfg, &handle_); });
  }
  /// External mode (skv_cache_new_external) over C callbacks; they must stay callable, and
  /// user_data valid, while the handle lives.
  Cache(const skv_cache_config &cfg, const skv_pool_ops &ops, void *user_data) {
    detail::call([&] { return skv_cache_new_external(&cfg, &ops, user_data, &handle_); });
  }
  /// External mode over a C++ PoolOps, which must outlive the handle (libskv keeps &ops).
  Cache(const skv_cache_config &cfg, PoolOps &ops) : Cache(cfg, pool_ops_for(ops), &ops) {}
  /// External mode over hybrid pools: every free goes to ops.free_kv_segment.
  Cache(const skv_cache_config &cfg, HybridPoolOps &ops) : Cache(cfg, pool_ops_for(ops), &ops) {}
  /// Takes ownership of a handle from skv_cache_new / skv_cache_new_external.
  explicit Cache(skv_cache *handle) noexcept : handle_(handle) {}

  Cache(const Cache &) = delete;
  Cache &operator=(const Cache &) = delete;
  Cache(Cache &&other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  Cache &operator=(Cache &&other) noexcept {
    if (this != &other) {
      skv_cache_free(handle_);
      handle_ = std::exchange(other.handle_, nullptr);
    }
    return *this;
  }
  /// skv_cache_free: host memory only; no callback runs, no session is released.
  ~Cache() { skv_cache_free(handle_); }

  skv_cache *get() const noexcept { return handle_; }
  /// Gives the handle up: the caller frees it with skv_cache_free.
  [[nodiscard]] skv_cache *release() noexcept { return std::exchange(handle_, nullptr); }
  explicit operator bool() const noexcept { return handle_ != nullptr; }

  // Session operations (both modes)

  skv_match match_prefix(uint64_t session_id, uint64_t branch_id, Req &req,
                         uint32_t key_len, bool pre_aborted = false) {
    skv_match out{};
    detail::call([&] {
      return skv_match_prefix(handle_, session_id, branch_id, req.get(), key_len,
                              pre_aborted ? 1u : 0u, &out);
    });
    return out;
  }
  /// skv_cache_finished_req. skv::TurnGuard calls it with aborted = true on unwinding.
  void finished_req(uint64_t session_id, uint64_t branch_id, Req &req, bool aborted = false) {
    detail::call([&] {
      return skv_cache_finished_req(handle_, session_id, branch_id, req.get(),
                                    aborted ? 1u : 0u);
    });
  }
  /// True when the session handled the chunk (a later turn), false for a first turn.
  bool checkpoint(uint64_t session_id, uint64_t branch_id, const Req &req) const {
    uint32_t handled = 0;
    detail::call([&] { return skv_checkpoint(handle_, session_id, branch_id, req.get(), &handled); });
    return handled != 0;
  }
  void release_session(uint64_t session_id) {
    detail::call([&] { return skv_release_session(handle_, session_id); });
  }
  void release_branch(uint64_t session_id, uint64_t branch_id) {
    detail::call([&] { return skv_release_branch(handle_, session_id, branch_id); });
  }
  void free_aligned(int32_t row, uint32_t target, uint32_t end) {
    detail::call([&] { return skv_free_aligned(handle_, row, target, end); });
  }
  void trim_overshoot(Req &req, uint32_t finished_len) {
    detail::call([&] { return skv_trim_overshoot(handle_, req.get(), finished_len); });
  }
  void free_tail(Req &req, uint32_t prefix_len) {
    detail::call([&] { return skv_free_tail(handle_, req.get(), prefix_len); });
  }
  skv_held session_held(const int32_t *active_rows, std::size_t n_active) const {
    skv_held out{};
    detail::call([&] { return skv_session_held(handle_, active_rows, n_active, &out); });
    return out;
  }
  skv_held session_held(const std::vector<int32_t> &active_rows = {}) const {
    return session_held(active_rows.data(), active_rows.size());
  }
  /// One sliding-window step of a running request (skv_swa_evict); returns the positions
  /// whose SWA slots went back. retain_floor -1 = none.
  uint32_t swa_evict(Req &req, uint32_t pre_len, uint32_t window, uint32_t eviction_interval,
                     int64_t retain_floor = -1, uint32_t flags = 0) {
    uint32_t freed = 0;
    detail::call([&] {
      return skv_swa_evict(handle_, req.get(), pre_len, window, eviction_interval, retain_floor,
                           flags, &freed);
    });
    return freed;
  }
  /// A matched request that never ran goes back to its idle slot (skv_hand_back).
  void hand_back(uint64_t session_id, uint64_t branch_id, Req &req) {
    detail::call([&] { return skv_hand_back(handle_, session_id, branch_id, req.get()); });
  }

  // The host tier and tickets (docs/tiers.md; owned mode with host_num_token_slots, except
  // ticket_done, session_where and tier_stats)

  /// skv_match_prefix_tier: a parked session is restored; wait for the returned ticket
  /// before the forward pass reads the KV.
  skv_tier_match match_prefix_tier(uint64_t session_id, uint64_t branch_id, Req &req,
                                   uint32_t key_len, bool pre_aborted = false) {
    skv_tier_match out{};
    out.struct_size = sizeof out;
    detail::call([&] {
      return skv_match_prefix_tier(handle_, session_id, branch_id, req.get(), key_len,
                                   pre_aborted ? 1 : 0, &out);
    });
    return out;
  }
  /// The unit of an idle session (skv_session_export), into `unit` (grown to fit); returns
  /// the ticket pinning its pages until the engine's copy of them completes. `flags`:
  /// SKV_EXPORT_MOVE moves the session to another instance (docs/transfer.md).
  uint64_t session_export(uint64_t session_id, uint64_t branch_id, std::vector<uint8_t> &unit,
                          uint32_t flags = 0) {
    size_t len = 0;
    uint64_t ticket = 0;
    skv_status s = skv_session_export(handle_, session_id, branch_id, flags, unit.data(),
                                      unit.size(), &len, &ticket);
    if (s == SKV_ERR_BUFFER) {
      unit.resize(len);
      s = skv_session_export(handle_, session_id, branch_id, flags, unit.data(), unit.size(), &len,
                             &ticket);
    }
    detail::check(s);
    unit.resize(len);
    return ticket;
  }
  /// Records the session a unit describes (skv_session_import); `out_pages` receives the pages
  /// to copy into (owned mode). Returns the ticket its copy completes.
  uint64_t session_import(const skv_import &in, const std::vector<uint8_t> &unit,
                          std::vector<int32_t> &out_pages) {
    size_t n = 0;
    uint64_t ticket = 0;
    detail::call([&] {
      return skv_session_import(handle_, &in, unit.data(), unit.size(), out_pages.data(),
                                out_pages.size(), &n, &ticket);
    });
    out_pages.resize(n);
    return ticket;
  }
  /// Whether the move a source's `unit` describes committed here (skv_session_fence):
  /// SKV_FENCE_ABSENT (and fenced from now on), SKV_FENCE_PENDING or SKV_FENCE_COMMITTED.
  int32_t session_fence(const std::vector<uint8_t> &unit) {
    int32_t state = -1;
    detail::call([&] { return skv_session_fence(handle_, unit.data(), unit.size(), &state); });
    return state;
  }
  /// The copies of `ticket` ran (status 0) or failed (skv_ticket_done).
  void ticket_done(uint64_t ticket, int32_t status = 0) {
    detail::call([&] { return skv_ticket_done(handle_, ticket, status); });
  }
  /// Parks an idle session (skv_session_park); returns the write-back's ticket, 0 if none.
  uint64_t session_park(uint64_t session_id, uint64_t branch_id) {
    uint64_t ticket = 0;
    detail::call([&] { return skv_session_park(handle_, session_id, branch_id, &ticket); });
    return ticket;
  }
  /// One tick of the policy (skv_tier_step): {pages queued, their ticket}.
  std::pair<uint64_t, uint64_t> tier_step() {
    uint64_t pages = 0, ticket = 0;
    detail::call([&] { return skv_tier_step(handle_, &pages, &ticket); });
    return {pages, ticket};
  }
  skv_tier_evicted tier_evict(uint64_t pages, uint32_t flags = 0) {
    skv_tier_evicted out{};
    out.struct_size = sizeof out;
    detail::call([&] { return skv_tier_evict(handle_, pages, flags, &out); });
    return out;
  }
  skv_where session_where(uint64_t session_id, uint64_t branch_id) const {
    skv_where out{};
    out.struct_size = sizeof out;
    detail::call([&] { return skv_session_where(handle_, session_id, branch_id, &out); });
    return out;
  }
  skv_tier_stats tier_stats() const {
    skv_tier_stats out{};
    out.struct_size = sizeof out;
    detail::call([&] { return skv_cache_tier_stats(handle_, &out); });
    return out;
  }

  // KV events (docs/events.md; a libskv built without the `events` feature throws
  // SKV_ERR_UNSUPPORTED)

  /// Turns events on for this handle (skv_events_enable), before its first session call.
  void events_enable(const skv_events_config &cfg) {
    detail::call([&] { return skv_events_enable(handle_, &cfg); });
  }
  /// A session's salt (nullptr: "skv-session:<id>") and the parent of its first published
  /// page (nullptr: none) (skv_events_session).
  void events_session(uint64_t session_id, const char *salt = nullptr,
                      const uint64_t *first_parent = nullptr) {
    detail::call([&] { return skv_events_session(handle_, session_id, salt, first_parent); });
  }
  /// Token ids of positions [first_pos, first_pos + tokens.size()) of the req's sequence
  /// (skv_events_tokens): once per prefill chunk and once before the finish.
  void events_tokens(uint64_t session_id, uint64_t branch_id, const Req &req, uint32_t first_pos,
                     const std::vector<int32_t> &tokens) {
    detail::call([&] {
      return skv_events_tokens(handle_, session_id, branch_id, req.get(), first_pos,
                               tokens.data(), tokens.size());
    });
  }
  /// The oldest closed batch (skv_events_drain) into `batch`, grown to fit; false when none
  /// is pending. `seq` receives its sequence number.
  bool events_drain(std::vector<uint8_t> &batch, uint64_t &seq) {
    size_t len = 0;
    skv_status s = skv_events_drain(handle_, batch.data(), batch.size(), &len, &seq);
    if (s == SKV_ERR_BUFFER) {
      batch.resize(len);
      s = skv_events_drain(handle_, batch.data(), batch.size(), &len, &seq);
    }
    detail::check(s);
    batch.resize(len);
    return len > 0;
  }

  // Scheduler queries (both modes, except admission_pages: owned mode)

  /// skv_cache_stats. External mode fills only what libskv knows there (total_rows,
  /// sessions and the token counters); the pool's fields are 0.
  skv_stats stats() const {
    skv_stats out{};
    detail::call([&] { return skv_cache_stats(handle_, &out); });
    return out;
  }

  skv_usage session_usage(uint64_t session_id) const {
    skv_usage out{};
    detail::call([&] { return skv_session_usage(handle_, session_id, &out); });
    return out;
  }
  skv_usage branch_usage(uint64_t session_id, uint64_t branch_id) const {
    skv_usage out{};
    detail::call([&] { return skv_branch_usage(handle_, session_id, branch_id, &out); });
    return out;
  }
  /// The idle (session, branch) slots, least recently used first: all of them.
  std::vector<std::pair<uint64_t, uint64_t>> idle_sessions() const {
    std::size_t count = 0;
    std::vector<uint64_t> sessions, branches;
    do {
      sessions.resize(count);
      branches.resize(count);
      detail::call([&] {
        return skv_idle_sessions(handle_, sessions.data(), branches.data(), sessions.size(), &count);
      });
    } while (count > sessions.size());
    std::vector<std::pair<uint64_t, uint64_t>> out;
    out.reserve(count);
    for (std::size_t i = 0; i < count; ++i) out.emplace_back(sessions[i], branches[i]);
    return out;
  }
  skv_admission admission_pages(uint64_t session_id, uint64_t branch_id, uint32_t key_len,
                                uint32_t total_len) const {
    skv_admission out{};
    detail::call([&] {
      return skv_admission_pages(handle_, session_id, branch_id, key_len, total_len, &out);
    });
    return out;
  }

  // Owned-pool operations (owned mode; SKV_ERR_UNSUPPORTED in external mode)

  void alloc_row(Req &req) {
    detail::call([&] { return skv_alloc_row(handle_, req.get()); });
  }
  /// out_loc, when not NULL, receives the n_tokens new KV slot indices.
  void alloc_extend(Req &req, uint32_t n_tokens, int32_t *out_loc = nullptr) {
    detail::call([&] { return skv_alloc_extend(handle_, req.get(), n_tokens, out_loc); });
  }
  void commit(Req &req, uint32_t n_tokens) {
    detail::call([&] { return skv_commit(handle_, req.get(), n_tokens); });
  }
  /// Extends reqs[i] by n_tokens[i] for every i, all or nothing; out_loc (NULL: not asked)
  /// receives every new KV slot index, request after request (out_cap values at most).
  void alloc_extend_batch(skv_req *reqs, std::size_t n, const uint32_t *n_tokens,
                          int32_t *out_loc = nullptr, std::size_t out_cap = 0) {
    detail::call([&] {
      return skv_alloc_extend_batch(handle_, reqs, n, n_tokens, out_loc, out_cap);
    });
  }
  /// The batch's new KV slot indices (sglang's out_cache_loc).
  std::vector<int32_t> alloc_extend_batch(std::vector<skv_req> &reqs,
                                          const std::vector<uint32_t> &n_tokens) {
    if (reqs.size() != n_tokens.size()) {
      throw Error(SKV_ERR_INVALID_ARG, "alloc_extend_batch: reqs and n_tokens differ in size");
    }
    std::size_t total = 0;
    for (uint32_t k : n_tokens) total += k;
    std::vector<int32_t> out_loc(total);
    alloc_extend_batch(reqs.data(), reqs.size(), n_tokens.data(), out_loc.data(), total);
    return out_loc;
  }
  /// Commits n_tokens[i] more tokens of reqs[i] for every i, all or nothing.
  void commit_batch(skv_req *reqs, std::size_t n, const uint32_t *n_tokens) {
    detail::call([&] { return skv_commit_batch(handle_, reqs, n, n_tokens); });
  }
  void commit_batch(std::vector<skv_req> &reqs, const std::vector<uint32_t> &n_tokens) {
    if (reqs.size() != n_tokens.size()) {
      throw Error(SKV_ERR_INVALID_ARG, "commit_batch: reqs and n_tokens differ in size");
    }
    commit_batch(reqs.data(), reqs.size(), n_tokens.data());
  }
  void free_req(Req &req) {
    detail::call([&] { return skv_free_req(handle_, req.get()); });
  }
  /// n_tokens KV slot indices (page-structured), engine-held until pool_free.
  std::vector<int32_t> pool_alloc(uint32_t n_tokens) {
    std::vector<int32_t> indices(n_tokens);
    detail::call([&] { return skv_pool_alloc(handle_, n_tokens, indices.data()); });
    return indices;
  }
  void pool_free(const int32_t *indices, std::size_t n) {
    detail::call([&] { return skv_pool_free(handle_, indices, n); });
  }
  void pool_free(const std::vector<int32_t> &indices) {
    pool_free(indices.data(), indices.size());
  }
  /// For each index, how many rows map its page (0: the prefix tree may evict it).
  std::vector<uint32_t> page_refs(const std::vector<int32_t> &indices) const {
    std::vector<uint32_t> counts(indices.size());
    detail::call([&] {
      return skv_page_refs(handle_, indices.data(), indices.size(), counts.data());
    });
    return counts;
  }
  void map_prefix(Req &req, const int32_t *indices, uint32_t n_tokens) {
    detail::call([&] { return skv_map_prefix(handle_, req.get(), indices, n_tokens); });
  }
  /// Every index is one token of the prefix: n_tokens == indices.size().
  void map_prefix(Req &req, const std::vector<int32_t> &indices) {
    if (indices.size() > UINT32_MAX)
      throw Error(SKV_ERR_INVALID_ARG, "skv::Cache::map_prefix: more than 2^32-1 indices");
    map_prefix(req, indices.data(), static_cast<uint32_t>(indices.size()));
  }
  void publish_prefix(Req &req, uint32_t new_protected_len) {
    detail::call([&] { return skv_publish_prefix(handle_, req.get(), new_protected_len); });
  }
  /// req_to_token[row, start:end)
  std::vector<int32_t> row_indices(int32_t row, uint32_t start, uint32_t end) const {
    std::vector<int32_t> out(end > start ? end - start : 0);
    detail::call([&] { return skv_row_indices(handle_, row, start, end, out.data()); });
    return out;
  }
  /// The SWA pool's token slots of req_to_token[row, start:end) (0 where the window passed).
  std::vector<int32_t> row_swa_indices(int32_t row, uint32_t start, uint32_t end) const {
    std::vector<int32_t> out(end > start ? end - start : 0);
    detail::call([&] { return skv_row_swa_indices(handle_, row, start, end, out.data()); });
    return out;
  }
  /// skv_cache_check, the audit; report.violations == 0 when every invariant holds.
  skv_check_report check() const {
    skv_check_report out{};
    detail::call([&] { return skv_cache_check(handle_, &out); });
    return out;
  }
  /// Installs owned mode's hooks from C callbacks (copied); hooks == nullptr removes them.
  void set_hooks(const skv_engine_hooks *hooks, void *user_data) {
    detail::call([&] { return skv_cache_set_hooks(handle_, hooks, user_data); });
  }
  /// Installs a C++ EngineHooks, which must stay alive while installed.
  void set_hooks(EngineHooks &hooks) {
    const skv_engine_hooks c = engine_hooks_for(hooks);
    set_hooks(&c, &hooks);
  }
  /// Writes into caller buffers; `needed` receives the page id count even when it
  /// exceeds cap (then this throws SKV_ERR_INVALID_ARG).
  void build_flashinfer(const int32_t *rows, std::size_t n, int32_t *kv_indptr,
                        int32_t *kv_indices, int32_t *kv_last_page_len, std::size_t cap,
                        std::size_t &needed) const {
    detail::call([&] {
      return skv_build_flashinfer(handle_, rows, n, kv_indptr, kv_indices, kv_last_page_len,
                                  cap, &needed);
    });
  }
  /// Sizes the buffers itself (asking again if another thread grows a row meanwhile).
  FlashInferBatch build_flashinfer(const std::vector<int32_t> &rows) const {
    return flashinfer_batch(rows, skv_build_flashinfer);
  }
  /// build_flashinfer for the sliding-window layers: SWA page ids (0 where the window passed).
  void build_flashinfer_swa(const int32_t *rows, std::size_t n, int32_t *kv_indptr,
                            int32_t *kv_indices, int32_t *kv_last_page_len, std::size_t cap,
                            std::size_t &needed) const {
    detail::call([&] {
      return skv_build_flashinfer_swa(handle_, rows, n, kv_indptr, kv_indices, kv_last_page_len,
                                      cap, &needed);
    });
  }
  FlashInferBatch build_flashinfer_swa(const std::vector<int32_t> &rows) const {
    return flashinfer_batch(rows, skv_build_flashinfer_swa);
  }

 private:
  using FlashInferFn = skv_status (*)(const skv_cache *, const int32_t *, std::size_t, int32_t *,
                                      int32_t *, int32_t *, std::size_t, std::size_t *);
  FlashInferBatch flashinfer_batch(const std::vector<int32_t> &rows, FlashInferFn build) const {
    FlashInferBatch batch;
    batch.kv_indptr.resize(rows.size() + 1);
    batch.kv_last_page_len.resize(rows.size());
    int32_t none = 0;
    for (;;) {
      std::size_t needed = 0;
      int32_t *indices = batch.kv_indices.empty() ? &none : batch.kv_indices.data();
      try {
        detail::call([&] {
          return build(handle_, rows.data(), rows.size(), batch.kv_indptr.data(), indices,
                       batch.kv_last_page_len.data(), batch.kv_indices.size(), &needed);
        });
        batch.kv_indices.resize(needed);
        return batch;
      } catch (const Error &e) {
        // A buffer too small is the one error that reports through `needed`.
        if (e.status() != SKV_ERR_INVALID_ARG || needed <= batch.kv_indices.size()) throw;
      }
      batch.kv_indices.resize(needed);
    }
  }

 public:
  // Handle settings (both modes)

  /// skv_cache_set_trace: appends every later call on this handle to a JSON-lines file;
  /// nullptr stops tracing.
  void set_trace(const char *path) {
    detail::call([&] { return skv_cache_set_trace(handle_, path); });
  }

  // The device copy of req_to_token (owned mode, a build with the cuda feature; elsewhere
  // these throw SKV_ERR_UNSUPPORTED). They only call libskv: no CUDA header needed here.

  /// cu_stream: the engine's CUstream, nullptr for the legacy default stream.
  void device_attach(int device_ordinal, void *cu_stream = nullptr) {
    detail::call([&] { return skv_device_attach(handle_, device_ordinal, cu_stream); });
  }
  /// Queues the copy of the rows mapped anew on the attached stream.
  DeviceRows device_sync() {
    DeviceRows out{0, 0};
    detail::call([&] { return skv_device_sync(handle_, &out.device_ptr, &out.row_stride); });
    return out;
  }

 private:
  skv_cache *handle_ = nullptr;
};

/// Aborts a running turn when the engine unwinds past it: unless finish(), abort() or
/// release() ran, the destructor calls skv_cache_finished_req(..., aborted = 1), which
/// releases everything the session holds (docs/operations.md), and swallows any failure
/// (a destructor cannot report one). Create it once the req belongs to the session: after
/// skv_match_prefix, before the engine extends the row. A matched request the scheduler
/// drops before it runs goes back with release() then Cache::hand_back (skv_hand_back), not
/// with an abort.
class TurnGuard {
 public:
  TurnGuard(Cache &cache, uint64_t session_id, uint64_t branch_id, Req &req) noexcept
      : cache_(cache), session_id_(session_id), branch_id_(branch_id), req_(req) {}
  TurnGuard(const TurnGuard &) = delete;
  TurnGuard &operator=(const TurnGuard &) = delete;
  ~TurnGuard() {
    if (!armed_) return;
    try {
      cache_.finished_req(session_id_, branch_id_, req_, true);
    } catch (...) {
      // Unwinding already carries an exception; the abort's own failure has no reader.
    }
  }

  /// Saves the turn into its slot (finished_req, not aborted).
  void finish() { end(false); }
  /// Releases the session now, reporting a failure.
  void abort() { end(true); }
  /// The engine finishes the turn itself: the destructor does nothing.
  void release() noexcept { armed_ = false; }
  bool armed() const noexcept { return armed_; }

 private:
  // A call that took effect leaves the req holding no row (even when a free callback failed
  // and it throws): from then on there is no turn left to abort. A call that changed nothing
  // leaves the guard armed.
  void end(bool aborted) {
    try {
      cache_.finished_req(session_id_, branch_id_, req_, aborted);
    } catch (...) {
      if (!req_.has_row()) armed_ = false;
      throw;
    }
    armed_ = false;
  }

  Cache &cache_;
  uint64_t session_id_;
  uint64_t branch_id_;
  Req &req_;
  bool armed_ = true;
};

}  // namespace skv

#endif  // SKV_HPP
