//! The session operations (both modes).

use super::req::{on_req, req_export};
use super::{aligned, arg, disjoint, events_emit, lock, out_mut, skv_cache, skv_status, slice, Span};
use crate::core::{Error, Req, Window};

/// The Rust names of the C records (one definition each, in `core`).
pub use crate::core::{Held as skv_held, Match as skv_match};

/// Restores the slot of (session_id, branch_id) into `req` for the request's next turn, or
/// misses. `key_len`: the prompt tokens whose KV may be reused, prompt_len - 1; `pre_aborted` !=
/// 0: the engine will not run the request (a miss, nothing changes). `*out` receives hit and
/// prefix_len. A hit leaves the slot in flight until the request finishes (docs/operations.md,
/// docs/conventions.md#state-after-a-hit).
///
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG, SKV_ERR_OUT_OF_MEMORY, SKV_ERR_NOT_FOUND,
///          SKV_ERR_STATE, SKV_ERR_CALLBACK, SKV_ERR_UNSUPPORTED
#[no_mangle]
pub unsafe extern "C" fn skv_match_prefix(
    c: *mut skv_cache,
    session_id: u64,
    branch_id: u64,
    req: *mut Req,
    key_len: u32,
    pre_aborted: u32,
    out: *mut crate::core::Match,
) -> skv_status {
    export!(
        skv_match_prefix,
        c,
        |t| {
            t.num("session_id", session_id).num("branch_id", branch_id).req("req", req);
            t.num("key_len", key_len).num("pre_aborted", pre_aborted);
        },
        // SAFETY: c, req and out are NULL or valid (the contract above); out_mut and on_req
        // refuse NULL.
        || unsafe {
            disjoint(&[Span::of(req, 1, "req"), Span::of(out, 1, "out")])?;
            let out = out_mut(out, "out")?;
            on_req(
                c,
                req,
                |cache, r| events_emit::match_prefix(c, cache, (session_id, branch_id), r, key_len, pre_aborted != 0),
                |m| *out = m,
            )
        },
        |t| {
            t.req("req_out", req).matched("out", out);
        },
    )
}

/// Ends a turn: saves it into its session slot after trimming its speculative overshoot, or,
/// with `aborted` != 0, releases everything the session holds. The req ends holding nothing. A
/// request that matched but never ran goes back with skv_hand_back instead (docs/operations.md;
/// what an abort releases: docs/conventions.md#aborts-what-is-released).
///
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG, SKV_ERR_OUT_OF_MEMORY, SKV_ERR_NOT_FOUND,
///          SKV_ERR_STATE, SKV_ERR_CALLBACK, SKV_ERR_UNSUPPORTED
#[no_mangle]
pub unsafe extern "C" fn skv_cache_finished_req(
    c: *mut skv_cache,
    session_id: u64,
    branch_id: u64,
    req: *mut Req,
    aborted: u32,
) -> skv_status {
    export!(
        skv_cache_finished_req,
        c,
        |t| t.num("session_id", session_id).num("branch_id", branch_id).req("req", req).num("aborted", aborted),
        // SAFETY: c and req are NULL or valid (the contract above); on_req refuses NULL and
        // holds c's lock while the closure runs.
        || unsafe {
            on_req(
                c,
                req,
                |cache, r| events_emit::finished(c, cache, (session_id, branch_id), r, aborted != 0),
                |()| {},
            )
        },
        |t| {
            t.req("req_out", req);
        },
    )
}

/// Hands back a request a skv_match_prefix hit restored but that never ran (the engine dropped
/// it from its waiting queue): the slot becomes idle exactly as the match left it, in its old
/// place in skv_idle_sessions' order; nothing is freed and no callback runs. The req must be as
/// the hit left it (a request that ran is finished or aborted instead) and ends holding nothing
/// (docs/operations.md).
///
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG, SKV_ERR_NOT_FOUND, SKV_ERR_STATE
#[no_mangle]
pub unsafe extern "C" fn skv_hand_back(
    c: *mut skv_cache,
    session_id: u64,
    branch_id: u64,
    req: *mut Req,
) -> skv_status {
    export!(
        skv_hand_back,
        c,
        |t| t.num("session_id", session_id).num("branch_id", branch_id).req("req", req),
        // SAFETY: c and req are NULL or valid (the contract above); on_req refuses NULL and
        // holds c's lock while the closure runs.
        || unsafe { on_req(c, req, |cache, r| events_emit::hand_back(c, cache, (session_id, branch_id), r), |()| {}) },
        |t| {
            t.req("req_out", req);
        },
    )
}

/// Between prefill chunks: `*handled` = 1 when the session slot handles this request (a later
/// turn), 0 when the engine runs its own prefix-tree path. Changes nothing
/// (docs/conventions.md#skv_checkpoint-and-handled).
///
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG, SKV_ERR_NOT_FOUND, SKV_ERR_STATE
#[no_mangle]
pub unsafe extern "C" fn skv_checkpoint(
    c: *const skv_cache,
    session_id: u64,
    branch_id: u64,
    req: *const Req,
    handled: *mut u32,
) -> skv_status {
    export!(
        skv_checkpoint,
        c,
        |t| t.num("session_id", session_id).num("branch_id", branch_id).req("req", req),
        // SAFETY: c, req and handled are NULL or valid (the contract above); arg, out_mut and
        // lock refuse NULL.
        || unsafe {
            disjoint(&[Span::of(req, 1, "req"), Span::of(handled, 1, "handled")])?;
            let r = *arg(req, "req")?;
            let handled = out_mut(handled, "handled")?;
            let found = lock(c)?.checkpoint(session_id, branch_id, &r)?;
            *handled = found as u32;
            Ok(())
        },
        |t| {
            // SAFETY: written by the call that just succeeded.
            t.num("handled", unsafe { *handled });
        },
    )
}

/// Releases every branch of a session, oldest slot first. No slot: OK. A slot in flight
/// refuses the whole call with SKV_ERR_STATE.
///
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG, SKV_ERR_OUT_OF_MEMORY, SKV_ERR_STATE,
///          SKV_ERR_CALLBACK, SKV_ERR_UNSUPPORTED
#[no_mangle]
pub unsafe extern "C" fn skv_release_session(c: *mut skv_cache, session_id: u64) -> skv_status {
    export!(
        skv_release_session,
        c,
        |t| t.num("session_id", session_id),
        || {
            // SAFETY: c is NULL or a live handle (the contract above).
            let mut cache = unsafe { lock(c) }?;
            // SAFETY: c is live and its lock held (just taken).
            unsafe { events_emit::release_session(c, &mut cache, session_id) }?;
            cache.take_deferred()
        },
        |_| {},
    )
}

/// Releases one branch's slot. No slot: OK. In flight: SKV_ERR_STATE.
///
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG, SKV_ERR_OUT_OF_MEMORY, SKV_ERR_STATE,
///          SKV_ERR_CALLBACK, SKV_ERR_UNSUPPORTED
#[no_mangle]
pub unsafe extern "C" fn skv_release_branch(c: *mut skv_cache, session_id: u64, branch_id: u64) -> skv_status {
    export!(
        skv_release_branch,
        c,
        |t| t.num("session_id", session_id).num("branch_id", branch_id),
        || {
            // SAFETY: c is NULL or a live handle (the contract above).
            let mut cache = unsafe { lock(c) }?;
            // SAFETY: c is live and its lock held (just taken).
            unsafe { events_emit::release_branch(c, &mut cache, (session_id, branch_id)) }?;
            cache.take_deferred()
        },
        |_| {},
    )
}

/// The page-safe tail free: frees row[ceil_align(target), end) of `row` (row[target, end) when
/// page_size is 1), keeping the page that holds target - 1; target == end frees nothing. It
/// takes no req: the engine lowers its req's kv_allocated_len itself. The ranges each mode, a
/// session's row and the SWA cursor allow: docs/operations.md#skv_free_alignedc-row-target-end.
///
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG, SKV_ERR_OUT_OF_MEMORY, SKV_ERR_NOT_FOUND,
///          SKV_ERR_STATE, SKV_ERR_CALLBACK, SKV_ERR_UNSUPPORTED
#[no_mangle]
pub unsafe extern "C" fn skv_free_aligned(c: *mut skv_cache, row: i32, target: u32, end: u32) -> skv_status {
    export!(
        skv_free_aligned,
        c,
        |t| t.num("row", row).num("target", target).num("end", end),
        || {
            // SAFETY: c is NULL or a live handle (the contract above).
            let mut cache = unsafe { lock(c) }?;
            let Ok(row) = u32::try_from(row) else {
                return Err(crate::core::Error::InvalidArg(format!(
                    "row {row} out of range [0, {})",
                    cache.config().num_rows
                )));
            };
            // SAFETY: c is live and its lock held (taken above).
            unsafe { events_emit::free_aligned(c, &mut cache, row, target, end) }?;
            cache.take_deferred()
        },
        |_| {},
    )
}

/// The finish path's trim, without the slot: cuts the req's KV lengths back to the turn's end,
/// origin_input_len + finished_len, freeing only whole pages; output_len becomes min(output_len,
/// finished_len), and the req's finished_len is lowered to it when larger. On a session's row
/// the primitives' rules apply (docs/operations.md#primitives-both-modes).
///
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG, SKV_ERR_OUT_OF_MEMORY, SKV_ERR_NOT_FOUND,
///          SKV_ERR_STATE, SKV_ERR_CALLBACK
#[no_mangle]
pub unsafe extern "C" fn skv_trim_overshoot(c: *mut skv_cache, req: *mut Req, finished_len: u32) -> skv_status {
    // SAFETY: the caller's contract, passed on.
    export!(skv_trim_overshoot, |name| unsafe {
        req_export(c, name, req, &[("finished_len", finished_len)], |cache, r| {
            events_emit::shorten(c, cache, r, |cache, r| cache.trim_overshoot(r, finished_len))
        })
    })
}

/// Frees what lies past `prefix_len` (the match path's tail free; also how rejected drafts are
/// dropped). On a session's row the primitives' rules apply
/// (docs/operations.md#primitives-both-modes).
///
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG, SKV_ERR_OUT_OF_MEMORY, SKV_ERR_NOT_FOUND,
///          SKV_ERR_STATE, SKV_ERR_CALLBACK
#[no_mangle]
pub unsafe extern "C" fn skv_free_tail(c: *mut skv_cache, req: *mut Req, prefix_len: u32) -> skv_status {
    // SAFETY: the caller's contract, passed on.
    export!(skv_free_tail, |name| unsafe {
        req_export(c, name, req, &[("prefix_len", prefix_len)], |cache, r| {
            events_emit::shorten(c, cache, r, |cache, r| cache.free_tail(r, prefix_len))
        })
    })
}

/// What idle session slots hold, written to `*out`. `active_rows` (n_active values) lists the
/// rows of running requests, which are not counted; (NULL, 0) lists none
/// (docs/conventions.md#skv_session_held-which-rows).
///
/// The caller must pass every pointer as NULL or valid, active_rows holding n_active values.
///
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG, SKV_ERR_STATE
#[no_mangle]
pub unsafe extern "C" fn skv_session_held(
    c: *const skv_cache,
    active_rows: *const i32,
    n_active: usize,
    out: *mut crate::core::Held,
) -> skv_status {
    export!(
        skv_session_held,
        c,
        |t| t.list("active_rows", active_rows, n_active),
        // SAFETY: c and out are NULL or valid and active_rows NULL or n_active values (the contract
        // above); slice, out_mut and lock refuse NULL.
        || unsafe {
            disjoint(&[Span::of(active_rows, n_active, "active_rows"), Span::of(out, 1, "out")])?;
            let active = slice(active_rows, n_active, "active_rows")?;
            let out = out_mut(out, "out")?;
            *out = lock(c)?.session_held(active)?;
            Ok(())
        },
        |t| {
            t.held("out", out);
        },
    )
}

/// skv_swa_evict's flags: the engine shares no prefixes (no radix tree), so the window is
/// evicted right up to pre_len - window instead of keeping whole pages of it.
pub const SKV_SWA_NO_PREFIX_SHARING: u32 = 0x1;

/// One sliding-window step of a running request (sglang's free_swa_out_of_window_slots): once
/// the SWA cursor lags `pre_len` (the length before the step) - `window` by `eviction_interval`,
/// it rises to that in whole pages, at most to `retain_floor` (-1 = none), and the SWA side of
/// the positions it passed goes back; `*freed` (NULL allowed) receives how many. `flags`:
/// SKV_SWA_NO_PREFIX_SHARING or 0. Needs free_kv_segment (external mode) or an SWA pool (owned
/// mode). Step by step: docs/hybrid.md#the-window-step.
///
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG, SKV_ERR_OUT_OF_MEMORY, SKV_ERR_NOT_FOUND,
///          SKV_ERR_STATE, SKV_ERR_CALLBACK, SKV_ERR_UNSUPPORTED
#[no_mangle]
pub unsafe extern "C" fn skv_swa_evict(
    c: *mut skv_cache,
    req: *mut Req,
    pre_len: u32,
    window: u32,
    eviction_interval: u32,
    retain_floor: i64,
    flags: u32,
    freed: *mut u32,
) -> skv_status {
    export!(
        skv_swa_evict,
        c,
        |t| {
            t.req("req", req).num("pre_len", pre_len).num("window", window);
            t.num("eviction_interval", eviction_interval).num("retain_floor", retain_floor).num("flags", flags);
        },
        // SAFETY: c and req are NULL or valid and freed NULL or valid (the contract above);
        // on_req refuses NULL, freed is written only when not NULL.
        || unsafe {
            aligned(freed, 1, "freed")?;
            disjoint(&[Span::of(req, 1, "req"), Span::of(freed, 1, "freed")])?;
            on_req(
                c,
                req,
                |c, r| {
                    c.require_swa_free()?;
                    c.swa_evict(r, pre_len, &window_args(window, eviction_interval, retain_floor, flags)?)
                },
                |n| {
                    if let Some(out) = freed.as_mut() {
                        *out = n;
                    }
                },
            )
        },
        |t| {
            t.req("req_out", req);
        },
    )
}

/// skv_swa_evict's window arguments, checked.
fn window_args(size: u32, eviction_interval: u32, retain_floor: i64, flags: u32) -> crate::core::Result<Window> {
    if flags & !SKV_SWA_NO_PREFIX_SHARING != 0 {
        return Err(Error::InvalidArg(format!("flags {flags:#x} has unknown bits")));
    }
    let retain_floor = match retain_floor {
        -1 => None,
        f => Some(
            u32::try_from(f)
                .map_err(|_| Error::InvalidArg(format!("retain_floor {f} out of range -1..={}", u32::MAX)))?,
        ),
    };
    let prefix_sharing = flags & SKV_SWA_NO_PREFIX_SHARING == 0;
    Ok(Window { size, eviction_interval, prefix_sharing, retain_floor })
}
