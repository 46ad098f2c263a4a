//! The records the C ABI hands out (skv_match, skv_held, skv_usage, skv_admission, skv_stats,
//! skv_check_report), each defined once: the core fills them and the exports write them
//! as they are. cbindgen emits each under its C name (cbindgen.toml's `[export.rename]`),
//! with these doc comments and field names; `capi` names them `skv_*` for Rust callers.
//! Only plain fields: no logic lives here.

use std::ffi::c_char;

/// The result of skv_match_prefix.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Match {
    /// 1: the session slot was restored into the req.
    pub hit: u32,
    /// Reusable prefix length in tokens (0 when hit == 0).
    pub prefix_len: u32,
}

/// What idle session slots hold, for the engine's memory accounting.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Held {
    /// Sum over idle slots of ceil_align(allocated) - protected (a parked slot's are in the host
    /// tier: 0 here).
    pub full_tokens: u64,
    /// Sum over idle slots of ceil_align(allocated) - protected - max(0, swa_evicted_seqlen -
    /// swa_dead_lo): what the window freed lies in [swa_dead_lo, swa_evicted_seqlen) only
    /// (docs/hybrid.md).
    pub swa_tokens: u64,
    /// Idle slots holding a row.
    pub rows: u64,
    /// Idle slots holding aux_state != -1.
    pub aux_states: u64,
    /// (session, branch) slots, idle or not.
    pub sessions: u64,
    /// Recurrent-state handles idle slots hold: aux_state and each aux_track entry that is
    /// not -1 (sglang's session_held_mamba_slots; docs/recurrent-state.md). The last field:
    /// the ones before it keep their offsets.
    pub aux_handles: u64,
}

/// What a session's slots (all its branches, or one) hold.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// Slots counted (branches; 0 when the session has none).
    pub slots: u64,
    /// Of those, in flight (restored into a running request).
    pub in_flight: u64,
    /// Tokens the slots' rows map: owned mode, each row's mapped length (a running request's
    /// extension included; a parked slot's row maps its protected prefix only, so its
    /// committed tokens may exceed it); external mode, each slot's record (an in-flight slot's
    /// as its match left it: the running request's extension is in its own req).
    pub allocated_tokens: u64,
    /// Tokens whose KV is final, as the slots record them.
    pub committed_tokens: u64,
    /// Tokens of the engine's prefix tree (cache_protected_len): never freed by libskv.
    pub protected_tokens: u64,
    /// Pages the rows map: the sum of ceil(allocated / page_size).
    pub pages: u64,
    /// Pages releasing the slots would free: pages minus protected / page_size each.
    pub freeable_pages: u64,
}

/// What admitting a request would take from owned mode's pool (skv_admission_pages).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Admission {
    /// 1: skv_match_prefix would hit (and the request needs no new row).
    pub hit: u32,
    /// Tokens the hit would reuse (0 on a miss).
    pub prefix_len: u32,
    /// Pages skv_alloc_extend would take from the free list to grow the request from
    /// prefix_len to total_len tokens (a miss: all of ceil(total_len / page_size); a
    /// prefix-tree hit through skv_map_prefix, which libskv cannot foresee, needs fewer). A
    /// parked session's hit (skv_match_prefix_tier) also counts the pages its restore maps.
    pub pages_needed: u64,
    /// Pages the match itself would free first: a tail past the reused prefix, or the whole
    /// slot past its protected prefix when SKV_FLAG_ALIGNED_REUSE drops it.
    pub pages_freed: u64,
}

/// Pool occupancy. total_pages = num_token_slots / page_size, the padding page 0 included;
/// free_pages never counts page 0, so an empty cache has free_pages == total_pages - 1 and
/// used_pages == total_pages - 1 - free_pages. The swa_* fields say the same of the SWA pool
/// (swa_total_pages = swa_num_token_slots / page_size), and are 0 without one. External mode
/// (the engine owns the pools): total_rows (num_rows), sessions, trimmed_tokens,
/// tail_freed_tokens and finishes_past_committed are filled; every page count and free_rows
/// are 0.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stats {
    /// Pages in the pool, page 0 included.
    pub total_pages: u64,
    /// Pages free to allocate (draining pages are not: docs/tiers.md#tickets-and-draining).
    pub free_pages: u64,
    /// Pages owned by rows or held by the engine.
    pub used_pages: u64,
    /// req_to_token rows.
    pub total_rows: u32,
    /// Rows free to allocate.
    pub free_rows: u32,
    /// Session slots.
    pub sessions: u64,
    /// Tokens released by trim_overshoot since creation.
    pub trimmed_tokens: u64,
    /// Tokens released by free_tail since creation.
    pub tail_freed_tokens: u64,
    /// Pages in the SWA pool, its page 0 included (0: no SWA pool).
    pub swa_total_pages: u64,
    /// SWA pages free to allocate.
    pub swa_free_pages: u64,
    /// SWA pages mapped by rows or held by the engine.
    pub swa_used_pages: u64,
    /// skv_cache_finished_req calls (not aborted) since creation that claimed tokens whose KV
    /// the engine never committed: origin_input_len + finished_len past kv_committed_len + 1.
    /// Counted, not refused (docs/conventions.md#finishes-past-committed).
    pub finishes_past_committed: u64,
}

/// The result of an audit.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Report {
    /// Pages on the free list, and draining ones (free once their ticket completes).
    pub pages_free: u64,
    /// Pages owned by exactly one row.
    pub pages_in_rows: u64,
    /// Pages held by the engine (from skv_pool_alloc or inside a protected prefix).
    pub pages_engine_held: u64,
    /// SWA pages on the SWA pool's free list, and draining ones (0 without an SWA pool).
    pub swa_pages_free: u64,
    /// SWA pages in use: each named by exactly one page a row owns or the engine holds.
    pub swa_pages_in_use: u64,
    /// 0 when every invariant holds.
    pub violations: u64,
    /// The first violation as text, NUL-terminated ("" when none).
    pub first_violation: [c_char; 256],
}

impl Default for Report {
    fn default() -> Report {
        Report {
            pages_free: 0,
            pages_in_rows: 0,
            pages_engine_held: 0,
            swa_pages_free: 0,
            swa_pages_in_use: 0,
            violations: 0,
            first_violation: [0; 256],
        }
    }
}

/// What skv_match_prefix_tier found: skv_match_prefix's answer, and what a parked session's
/// restore (or an arriving import) still copies.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TierMatch {
    /// sizeof(skv_tier_match) of the caller's header: 24 (0.4). Set by the caller.
    pub struct_size: u32,
    /// 1: a session slot was restored into the req (as skv_match_prefix's hit).
    pub hit: u32,
    /// Tokens restored (0 on a miss).
    pub prefix_len: u32,
    /// Device pages the hit took for a parked session's KV (0 for one already on the device).
    pub restored_pages: u32,
    /// The ticket whose copies must run before the forward pass reads the KV: the restore's
    /// (also to a retried match while it is open), or an import's still open; 0 when the KV
    /// is already there.
    pub ticket: u64,
}

/// What skv_tier_evict did.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Evicted {
    /// sizeof(skv_tier_evicted) of the caller's header: 40 (0.4). Set by the caller.
    pub struct_size: u32,
    /// Sessions parked now (their host copy was clean).
    pub parked: u32,
    /// Sessions released (dropped whole: short, or no host room, or SKV_EVICT_NO_COPY).
    pub released: u32,
    /// Sessions whose device pages go when their write-back completes.
    pub copying: u32,
    /// Device pages freed now.
    pub freed_pages: u64,
    /// Device pages that go free when their ticket completes.
    pub draining_pages: u64,
    /// The write-back this call started (0: none).
    pub ticket: u64,
}

/// Where a session's KV is (skv_session_where).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Where {
    /// sizeof(skv_where) of the caller's header: 40 (0.4). Set by the caller.
    pub struct_size: u32,
    /// SKV_PLACE_*: NONE (no slot), DEVICE, BOTH (device, and a clean host copy), HOST
    /// (parked).
    pub place: u32,
    /// SKV_WHERE_* bits: IN_FLIGHT, COPYING (a ticket is open on it), FAILED (its restore
    /// failed), LEAVING (it parks when its write-back completes).
    pub state: u32,
    /// Tokens the slot holds (its kv_allocated_len as last recorded).
    pub tokens: u32,
    /// Device pages its row maps (the protected prefix's included).
    pub device_pages: u64,
    /// Host pages its host copy holds, both pools.
    pub host_pages: u64,
    /// The ticket open on it, 0 when none.
    pub ticket: u64,
}

/// The host tier and the tickets (skv_cache_tier_stats); without a host tier only the ticket
/// fields are filled.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TierStats {
    /// sizeof(skv_tier_stats) of the caller's header: 144 (0.4). Set by the caller.
    pub struct_size: u32,
    /// Tickets issued and not yet done.
    pub open_tickets: u32,
    /// The policy's clock: skv_tier_step calls so far.
    pub clock: u64,
    /// Host pool pages, page 0 included; free; draining (a released slot's, still copied).
    pub host_total_pages: u64,
    pub host_free_pages: u64,
    pub host_draining_pages: u64,
    /// The same of the host SWA pool (0 without one).
    pub host_swa_total_pages: u64,
    pub host_swa_free_pages: u64,
    pub host_swa_draining_pages: u64,
    /// Device pages freed while a ticket copied them, back when it completes (full, SWA).
    pub draining_pages: u64,
    pub swa_draining_pages: u64,
    /// Sessions parked now.
    pub parked_sessions: u64,
    /// Parks, restores, completed write-backs, host copies dropped for room, failed copies.
    pub parks: u64,
    pub unparks: u64,
    pub writebacks: u64,
    pub host_evictions: u64,
    pub failed_copies: u64,
    /// Pages whose copy was asked for, each way (both pools).
    pub pages_to_host: u64,
    pub pages_to_device: u64,
}

/// One contiguous range a transfer engine moves: `len` bytes from the remote side's address to
/// the local side's (`transfer::descs`, skv_transfer_descs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(C)]
pub struct XferDesc {
    pub local_addr: u64,
    pub remote_addr: u64,
    pub len: u64,
}
