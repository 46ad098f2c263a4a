// libskv C++17 wrapper, header-only, over the C API of skv.h.
//
// skv::Cache owns a skv_cache handle (freed by its destructor, move-only), skv::Req is an
// engine's skv_req by value, and every failing call throws skv::Error carrying the
// skv_status and skv_last_error()'s text. Names and argument orders are the C API's,
// without the skv_ prefix; what each operation does is the C API's, see skv.h.
#ifndef SKV_HPP
#define SKV_HPP

#include "skv.h"

#include <cstddef>
#include <cstdint>
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
}  // namespace detail

inline const char *version() noexcept { return skv_version(); }
inline uint32_t abi_version() noexcept { return skv_abi_version(); }

/// A cache configuration with struct_size filled in.
inline skv_cache_config make_config(uint32_t page_size, uint64_t num_token_slots,
                                    uint32_t num_rows, uint32_t max_context_len,
                                    uint32_t flags = 0) noexcept {
  skv_cache_config cfg{};
  cfg.struct_size = sizeof(skv_cache_config);
  cfg.page_size = page_size;
  cfg.num_token_slots = num_token_slots;
  cfg.num_rows = num_rows;
  cfg.max_context_len = max_context_len;
  cfg.flags = flags;
  return cfg;
}

/// One request's KV bookkeeping, as skv_req_init leaves it: no row, lengths 0,
/// finished_len -1, no lock, no aux state.
class Req {
 public:
  Req() { detail::check(skv_req_init(&req_)); }
  explicit Req(const skv_req &raw) noexcept : req_(raw) {}

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
  uint32_t origin_input_len() const noexcept { return req_.origin_input_len; }
  uint32_t output_len() const noexcept { return req_.output_len; }
  int32_t finished_len() const noexcept { return req_.finished_len; }
  uint64_t lock_node() const noexcept { return req_.lock_node; }
  uint64_t lock_receipt() const noexcept { return req_.lock_receipt; }
  int64_t aux_state() const noexcept { return req_.aux_state; }

  // Setters return *this so a turn's fields can be set in one expression. In owned mode
  // libskv maintains the row, committed, allocated and protected fields itself.
  Req &set_req_pool_idx(int32_t v) noexcept { req_.req_pool_idx = v; return *this; }
  Req &set_kv_committed_len(uint32_t v) noexcept { req_.kv_committed_len = v; return *this; }
  Req &set_kv_allocated_len(uint32_t v) noexcept { req_.kv_allocated_len = v; return *this; }
  Req &set_cache_protected_len(uint32_t v) noexcept { req_.cache_protected_len = v; return *this; }
  Req &set_swa_evicted_seqlen(uint32_t v) noexcept { req_.swa_evicted_seqlen = v; return *this; }
  Req &set_origin_input_len(uint32_t v) noexcept { req_.origin_input_len = v; return *this; }
  Req &set_output_len(uint32_t v) noexcept { req_.output_len = v; return *this; }
  Req &set_finished_len(int32_t v) noexcept { req_.finished_len = v; return *this; }
  Req &set_lock(uint64_t node, uint64_t receipt) noexcept {
    req_.lock_node = node;
    req_.lock_receipt = receipt;
    return *this;
  }
  Req &set_aux_state(int64_t v) noexcept { req_.aux_state = v; return *this; }

 private:
  skv_req req_{};
};

/// FlashInfer's paged-KV triple for a batch of rows (see skv_build_flashinfer).
struct FlashInferBatch {
  std::vector<int32_t> kv_indptr;         // rows + 1 prefix sums of page counts
  std::vector<int32_t> kv_indices;        // page ids
  std::vector<int32_t> kv_last_page_len;  // per row, 1..page_size; 0 for an empty row
};

/// Owns one skv_cache handle: one KV pool (per tensor-parallel rank).
class Cache {
 public:
  /// libskv owns the KV pool and the req_to_token rows.
  [[nodiscard]] static Cache owned(const skv_cache_config &cfg) {
    skv_cache *handle = nullptr;
    detail::check(skv_cache_new(&cfg, &handle));
    return Cache(handle);
  }
  /// The engine owns its pools; libskv hands KV slots and rows back through ops.
  [[nodiscard]] static Cache external(const skv_cache_config &cfg, const skv_pool_ops &ops,
                        void *user_data) {
    skv_cache *handle = nullptr;
    detail::check(skv_cache_new_external(&cfg, &ops, user_data, &handle));
    return Cache(handle);
  }
  /// An empty Cache (no handle), e.g. a member assigned later by move.
  Cache() noexcept = default;
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
  ~Cache() { skv_cache_free(handle_); }

  skv_cache *get() const noexcept { return handle_; }
  /// Gives the handle up: the caller frees it with skv_cache_free.
  [[nodiscard]] skv_cache *release() noexcept { return std::exchange(handle_, nullptr); }
  explicit operator bool() const noexcept { return handle_ != nullptr; }

  // Session operations (both modes)

  skv_match match_prefix(uint64_t session_id, uint64_t branch_id, Req &req,
                         uint32_t key_len, bool pre_aborted = false) {
    skv_match out{};
    detail::check(skv_match_prefix(handle_, session_id, branch_id, req.get(), key_len,
                                   pre_aborted ? 1u : 0u, &out));
    return out;
  }
  void cache_finished_req(uint64_t session_id, uint64_t branch_id, Req &req,
                          bool aborted = false) {
    detail::check(skv_cache_finished_req(handle_, session_id, branch_id, req.get(),
                                         aborted ? 1u : 0u));
  }
  /// True when the session handled the chunk (a later turn), false for a first turn.
  bool checkpoint(uint64_t session_id, uint64_t branch_id, const Req &req) const {
    uint32_t handled = 0;
    detail::check(skv_checkpoint(handle_, session_id, branch_id, req.get(), &handled));
    return handled != 0;
  }
  void release_session(uint64_t session_id) {
    detail::check(skv_release_session(handle_, session_id));
  }
  void release_branch(uint64_t session_id, uint64_t branch_id) {
    detail::check(skv_release_branch(handle_, session_id, branch_id));
  }
  void free_aligned(int32_t row, uint32_t target, uint32_t end) {
    detail::check(skv_free_aligned(handle_, row, target, end));
  }
  void trim_overshoot(Req &req, uint32_t finished_len) {
    detail::check(skv_trim_overshoot(handle_, req.get(), finished_len));
  }
  void free_tail(Req &req, uint32_t prefix_len) {
    detail::check(skv_free_tail(handle_, req.get(), prefix_len));
  }
  skv_held session_held(const int32_t *active_rows, std::size_t n_active) const {
    skv_held out{};
    detail::check(skv_session_held(handle_, active_rows, n_active, &out));
    return out;
  }
  skv_held session_held(const std::vector<int32_t> &active_rows = {}) const {
    return session_held(active_rows.data(), active_rows.size());
  }

  // Owned-pool operations (owned mode; SKV_ERR_UNSUPPORTED in external mode)

  void alloc_row(Req &req) { detail::check(skv_alloc_row(handle_, req.get())); }
  /// out_loc, when not NULL, receives the n_tokens new KV slot indices.
  void alloc_extend(Req &req, uint32_t n_tokens, int32_t *out_loc = nullptr) {
    detail::check(skv_alloc_extend(handle_, req.get(), n_tokens, out_loc));
  }
  void commit(Req &req, uint32_t n_tokens) {
    detail::check(skv_commit(handle_, req.get(), n_tokens));
  }
  /// Extends reqs[i] by n_tokens[i] for every i, all or nothing; out_loc (NULL: not asked)
  /// receives every new KV slot index, request after request (out_cap values at most).
  void alloc_extend_batch(skv_req *reqs, std::size_t n, const uint32_t *n_tokens,
                          int32_t *out_loc = nullptr, std::size_t out_cap = 0) {
    detail::check(skv_alloc_extend_batch(handle_, reqs, n, n_tokens, out_loc, out_cap));
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
    detail::check(skv_commit_batch(handle_, reqs, n, n_tokens));
  }
  void commit_batch(std::vector<skv_req> &reqs, const std::vector<uint32_t> &n_tokens) {
    if (reqs.size() != n_tokens.size()) {
      throw Error(SKV_ERR_INVALID_ARG, "commit_batch: reqs and n_tokens differ in size");
    }
    commit_batch(reqs.data(), reqs.size(), n_tokens.data());
  }
  void free_req(Req &req) { detail::check(skv_free_req(handle_, req.get())); }
  /// n_tokens KV slot indices (page-structured), engine-held until pool_free.
  std::vector<int32_t> pool_alloc(uint32_t n_tokens) {
    std::vector<int32_t> indices(n_tokens);
    detail::check(skv_pool_alloc(handle_, n_tokens, indices.data()));
    return indices;
  }
  void pool_free(const int32_t *indices, std::size_t n) {
    detail::check(skv_pool_free(handle_, indices, n));
  }
  void pool_free(const std::vector<int32_t> &indices) {
    pool_free(indices.data(), indices.size());
  }
  /// For each index, how many rows map its page (0: the prefix tree may evict it).
  std::vector<uint32_t> page_refs(const std::vector<int32_t> &indices) const {
    std::vector<uint32_t> counts(indices.size());
    detail::check(skv_page_refs(handle_, indices.data(), indices.size(), counts.data()));
    return counts;
  }
  void map_prefix(Req &req, const int32_t *indices, uint32_t n_tokens) {
    detail::check(skv_map_prefix(handle_, req.get(), indices, n_tokens));
  }
  /// Every index is one token of the prefix: n_tokens == indices.size().
  void map_prefix(Req &req, const std::vector<int32_t> &indices) {
    if (indices.size() > UINT32_MAX)
      throw Error(SKV_ERR_INVALID_ARG, "skv::Cache::map_prefix: more than 2^32-1 indices");
    map_prefix(req, indices.data(), static_cast<uint32_t>(indices.size()));
  }
  void publish_prefix(Req &req, uint32_t new_protected_len) {
    detail::check(skv_publish_prefix(handle_, req.get(), new_protected_len));
  }
  /// req_to_token[row, start:end)
  std::vector<int32_t> row_indices(int32_t row, uint32_t start, uint32_t end) const {
    std::vector<int32_t> out(end > start ? end - start : 0);
    detail::check(skv_row_indices(handle_, row, start, end, out.data()));
    return out;
  }
  skv_stats stats() const {
    skv_stats out{};
    detail::check(skv_cache_stats(handle_, &out));
    return out;
  }
  /// The audit; report.violations == 0 when every invariant holds.
  skv_check_report check() const {
    skv_check_report out{};
    detail::check(skv_cache_check(handle_, &out));
    return out;
  }
  /// Appends every later call on this handle to a JSON-lines file; nullptr stops tracing.
  void set_trace(const char *path) { detail::check(skv_cache_set_trace(handle_, path)); }
  /// hooks == nullptr removes them.
  void set_hooks(const skv_engine_hooks *hooks, void *user_data) {
    detail::check(skv_cache_set_hooks(handle_, hooks, user_data));
  }
  /// Writes into caller buffers; `needed` receives the page id count even when it
  /// exceeds cap (then this throws SKV_ERR_INVALID_ARG).
  void build_flashinfer(const int32_t *rows, std::size_t n, int32_t *kv_indptr,
                        int32_t *kv_indices, int32_t *kv_last_page_len, std::size_t cap,
                        std::size_t &needed) const {
    detail::check(skv_build_flashinfer(handle_, rows, n, kv_indptr, kv_indices,
                                       kv_last_page_len, cap, &needed));
  }
  /// Sizes the buffers itself (asking again if another thread grows a row meanwhile).
  FlashInferBatch build_flashinfer(const std::vector<int32_t> &rows) const {
    FlashInferBatch batch;
    batch.kv_indptr.resize(rows.size() + 1);
    batch.kv_last_page_len.resize(rows.size());
    int32_t none = 0;
    for (;;) {
      std::size_t needed = 0;
      int32_t *indices = batch.kv_indices.empty() ? &none : batch.kv_indices.data();
      skv_status status = skv_build_flashinfer(handle_, rows.data(), rows.size(),
                                               batch.kv_indptr.data(), indices,
                                               batch.kv_last_page_len.data(),
                                               batch.kv_indices.size(), &needed);
      if (status == SKV_OK) {
        batch.kv_indices.resize(needed);
        return batch;
      }
      // A buffer too small is the one error that reports through `needed`.
      if (status != SKV_ERR_INVALID_ARG || needed <= batch.kv_indices.size()) detail::check(status);
      batch.kv_indices.resize(needed);
    }
  }

 private:
  skv_cache *handle_ = nullptr;
};

}  // namespace skv

#endif  // SKV_HPP
