//! Scheduler queries: what a session holds, the idle sessions in least-recently-used order,
//! and (owned mode) what admitting a request would take. They change nothing.

use super::trace::Line;
use super::{lock, out_mut, skv_cache, skv_status, slice_mut, traced};
use crate::core::{Cache, Result};

/// The Rust names of the C records (one definition each, in `core`).
pub use crate::core::{Admission as skv_admission, Usage as skv_usage};

/// What every slot of session_id holds, in flight or idle, written to `*out`; all zeros for a
/// session without slots (docs/operations.md#scheduler-queries).
///
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG, SKV_ERR_STATE
#[no_mangle]
pub unsafe extern "C" fn skv_session_usage(
    c: *const skv_cache,
    session_id: u64,
    out: *mut crate::core::Usage,
) -> skv_status {
    // SAFETY: the caller's contract, passed on.
    export!(skv_session_usage, |name| unsafe { usage(c, name, session_id, None, out) })
}

/// skv_session_usage for the one slot of (session_id, branch_id): slots is 1 or 0.
///
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG, SKV_ERR_STATE
#[no_mangle]
pub unsafe extern "C" fn skv_branch_usage(
    c: *const skv_cache,
    session_id: u64,
    branch_id: u64,
    out: *mut crate::core::Usage,
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
    out: *mut crate::core::Usage,
) -> skv_status {
    let args = |t: &mut Line| {
        t.num("session_id", session_id);
        if let Some(b) = branch_id {
            t.num("branch_id", b);
        }
    };
    // SAFETY: c and out are NULL or valid (the contract above).
    unsafe {
        answer(
            c,
            function,
            args,
            out,
            |c| Ok(c.usage(session_id, branch_id)),
            |t, u| {
                t.num("slots", u.slots).num("allocated_tokens", u.allocated_tokens).num("pages", u.pages);
            },
        )
    }
}

/// An export whose one output is a record the cache answers with: `*out`, written under the
/// handle's lock once `query` succeeded (the usage queries, the stats, the audit).
///
/// # Safety
/// `c` and `out` must be NULL or valid.
pub(crate) unsafe fn answer<T>(
    c: *const skv_cache,
    function: &'static str,
    args: impl FnOnce(&mut Line),
    out: *mut T,
    query: impl FnOnce(&Cache) -> Result<T>,
    results: impl FnOnce(&mut Line, &T),
) -> skv_status {
    traced(
        c,
        function,
        args,
        // SAFETY: c and out are NULL or valid (the contract above); out_mut and lock refuse NULL.
        || unsafe {
            let out = out_mut(out, "out")?;
            // Written under the lock: the answer then needs no registers across the unlock.
            *out = query(&*lock(c)?)?;
            Ok(())
        },
        // SAFETY: written by the call that just succeeded.
        |t| results(t, unsafe { &*out }),
    )
}

/// The idle slots (no running request holds them), least recently used first: the first min(cap,
/// *count) keys go to `session_ids[i]` / `branch_ids[i]`, and `*count` receives how many there
/// are, also past cap. (NULL, NULL, 0) only counts (docs/operations.md#scheduler-queries).
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
        |t| t.num("cap", cap as u64),
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

/// Owned mode: what admitting a request of `total_len` tokens on (session_id, branch_id) would
/// take now, as skv_match_prefix with `key_len` followed by skv_alloc_extend to total_len would
/// do it; written to `*out`. Changes nothing (docs/operations.md#scheduler-queries).
///
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG, SKV_ERR_STATE, SKV_ERR_UNSUPPORTED
#[no_mangle]
pub unsafe extern "C" fn skv_admission_pages(
    c: *const skv_cache,
    session_id: u64,
    branch_id: u64,
    key_len: u32,
    total_len: u32,
    out: *mut crate::core::Admission,
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
            *out = lock(c)?.admission(session_id, branch_id, key_len, total_len)?;
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
