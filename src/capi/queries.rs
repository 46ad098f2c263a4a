//! Scheduler queries: what a session holds, the idle sessions in least-recently-used order,
//! and (owned mode) what admitting a request would take. They change nothing.

use super::{lock, out_mut, skv_cache, skv_status, slice_mut, traced};
use crate::core::{Admission, Usage};

/// What a session's slots (all its branches, or one) hold.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct skv_usage {
    /// Slots counted (branches; 0 when the session has none).
    pub slots: u64,
    /// Of those, in flight (restored into a running request).
    pub in_flight: u64,
    /// Tokens the slots' rows map: owned mode, each row's mapped length (a running request's
    /// extension included); external mode, each slot's record (an in-flight slot's as its
    /// match left it: the running request's extension is in its own req).
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

impl From<Usage> for skv_usage {
    fn from(u: Usage) -> skv_usage {
        skv_usage {
            slots: u.slots,
            in_flight: u.in_flight,
            allocated_tokens: u.allocated_tokens,
            committed_tokens: u.committed_tokens,
            protected_tokens: u.protected_tokens,
            pages: u.pages,
            freeable_pages: u.freeable_pages,
        }
    }
}

/// What admitting a request would take from owned mode's pool (skv_admission_pages).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct skv_admission {
    /// 1: skv_match_prefix would hit (and the request needs no new row).
    pub hit: u32,
    /// Tokens the hit would reuse (0 on a miss).
    pub prefix_len: u32,
    /// Pages skv_alloc_extend would take from the free list to grow the request from
    /// prefix_len to total_len tokens (a miss: all of ceil(total_len / page_size); a
    /// prefix-tree hit through skv_map_prefix, which libskv cannot foresee, needs fewer).
    pub pages_needed: u64,
    /// Pages the match itself would free first: a tail past the reused prefix, or the whole
    /// slot past its protected prefix when SKV_FLAG_ALIGNED_REUSE drops it.
    pub pages_freed: u64,
}

impl From<Admission> for skv_admission {
    fn from(a: Admission) -> skv_admission {
        skv_admission {
            hit: a.hit as u32,
            prefix_len: a.prefix_len,
            pages_needed: a.pages_needed,
            pages_freed: a.pages_freed,
        }
    }
}

/// What every slot of session_id holds, in flight or idle (docs/operations.md). A session
/// without slots gives all zeros. Both modes.
///
/// The caller must pass every pointer as NULL or valid.
///
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG, SKV_ERR_STATE
#[no_mangle]
pub unsafe extern "C" fn skv_session_usage(c: *const skv_cache, session_id: u64, out: *mut skv_usage) -> skv_status {
    // SAFETY: the caller's contract, passed on.
    export!(skv_session_usage, |name| unsafe { usage(c, name, session_id, None, out) })
}

/// skv_session_usage for the one slot of (session_id, branch_id): slots is 1 or 0.
///
/// The caller must pass every pointer as NULL or valid.
///
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG, SKV_ERR_STATE
#[no_mangle]
pub unsafe extern "C" fn skv_branch_usage(
    c: *const skv_cache,
    session_id: u64,
    branch_id: u64,
    out: *mut skv_usage,
) -> skv_status {
    // SAFETY: the caller's contract, passed on.
    export!(skv_branch_usage, |name| unsafe { usage(c, name, session_id, Some(branch_id), out) })
}

/// The usage queries' one body: every branch of the session, or one.
///
/// # Safety
/// `c` and `out` must be NULL or valid.
unsafe fn usage(
    c: *const skv_cache,
    function: &'static str,
    session_id: u64,
    branch_id: Option<u64>,
    out: *mut skv_usage,
) -> skv_status {
    traced(
        c,
        function,
        |t| {
            t.num("session_id", session_id);
            if let Some(b) = branch_id {
                t.num("branch_id", b);
            }
        },
        // SAFETY: c and out are NULL or valid (the contract above); out_mut and lock refuse NULL.
        || unsafe {
            let out = out_mut(out, "out")?;
            *out = lock(c)?.usage(session_id, branch_id).into();
            Ok(())
        },
        |t| {
            // SAFETY: written by the call that just succeeded.
            let u = unsafe { &*out };
            t.num("slots", u.slots).num("allocated_tokens", u.allocated_tokens).num("pages", u.pages);
        },
    )
}

/// The idle slots (those no running request holds), least recently used first: ordered by
/// when each slot's last turn finished (skv_cache_finished_req, not aborted); a handed-back
/// request (skv_hand_back) leaves its slot's place unchanged. The first min(cap, count) are
/// written to `session_ids[i]` / `branch_ids[i]`; *count receives how many idle slots there are
/// (also when it exceeds cap: the call succeeds). (NULL, NULL, 0) only counts. Both modes.
///
/// The caller must pass every pointer as NULL or valid, session_ids and branch_ids holding
/// cap values.
///
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG, SKV_ERR_OUT_OF_MEMORY, SKV_ERR_STATE
#[no_mangle]
pub unsafe extern "C" fn skv_idle_sessions(
    c: *const skv_cache,
    session_ids: *mut u64,
    branch_ids: *mut u64,
    cap: usize,
    count: *mut usize,
) -> skv_status {
    let written = std::cell::Cell::new(0usize);
    export!(
        skv_idle_sessions,
        c,
        |t| {
            t.num("cap", cap as u64);
        },
        // SAFETY: c, count and the arrays are NULL or valid, the arrays holding cap values (the
        // contract above); slice_mut, out_mut and lock refuse NULL and impossible lengths.
        || unsafe {
            let sessions = slice_mut(session_ids, cap, "session_ids")?;
            let branches = slice_mut(branch_ids, cap, "branch_ids")?;
            let count = out_mut(count, "count")?;
            let cache = lock(c)?;
            let mut keys = Vec::new();
            if keys.try_reserve_exact(cap.min(cache.slots().len())).is_err() {
                return Err(crate::core::Error::OutOfMemory(format!("no host memory for {cap} keys")));
            }
            keys.resize(cap.min(cache.slots().len()), (0, 0));
            let n = cache.idle_lru(&mut keys);
            let shown = n.min(keys.len());
            for (i, &(s, b)) in keys[..shown].iter().enumerate() {
                (sessions[i], branches[i]) = (s, b);
            }
            written.set(shown);
            *count = n;
            Ok(())
        },
        |t| {
            t.num("count", written.get() as u64).list("session_ids", session_ids.cast_const(), written.get());
            t.list("branch_ids", branch_ids.cast_const(), written.get());
        },
    )
}

/// Owned mode: what admitting a request of total_len tokens on (session_id, branch_id) would
/// take, given the session's state now: skv_match_prefix with key_len, then growing the row
/// to total_len (docs/operations.md). Changes nothing. total_len <= max_context_len and
/// key_len <= total_len (SKV_ERR_INVALID_ARG); the slot in flight, or a match that would
/// refuse (a reusable prefix below the protected one): SKV_ERR_STATE. External mode:
/// SKV_ERR_UNSUPPORTED.
///
/// The caller must pass every pointer as NULL or valid.
///
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG, SKV_ERR_STATE, SKV_ERR_UNSUPPORTED
#[no_mangle]
pub unsafe extern "C" fn skv_admission_pages(
    c: *const skv_cache,
    session_id: u64,
    branch_id: u64,
    key_len: u32,
    total_len: u32,
    out: *mut skv_admission,
) -> skv_status {
    export!(
        skv_admission_pages,
        c,
        |t| {
            t.num("session_id", session_id).num("branch_id", branch_id);
            t.num("key_len", key_len).num("total_len", total_len);
        },
        // SAFETY: c and out are NULL or valid (the contract above); out_mut and lock refuse NULL.
        || unsafe {
            let out = out_mut(out, "out")?;
            *out = lock(c)?.admission(session_id, branch_id, key_len, total_len)?.into();
            Ok(())
        },
        |t| {
            // SAFETY: written by the call that just succeeded.
            let a = unsafe { &*out };
            t.num("hit", a.hit).num("prefix_len", a.prefix_len);
            t.num("pages_needed", a.pages_needed).num("pages_freed", a.pages_freed);
        },
    )
}
