//! Owned-pool operations: libskv's own allocator and rows. Each is SKV_ERR_UNSUPPORTED on
//! an external-mode handle.

use std::ffi::{c_char, c_int, c_void};

use super::cache::{skv_dec_lock_ref_fn, skv_free_aux_fn};
use super::session::{as_core_reqs, on_req, req_export};
use super::{
    aligned, disjoint, lock, nonnull, out_mut, skv_cache, skv_req, skv_status, slice, slice_mut, traced, CallbackScope,
    ExportName, Span,
};
use crate::core::{Cache, EngineHooks, Error, Req, Result, Stats};

/// Assigns a free row to a req that holds none (SKV_ERR_INVALID_ARG if it holds one); the row
/// maps nothing yet, so the req's KV lengths become 0. SKV_ERR_OUT_OF_MEMORY: no free row.
///
/// The caller must pass every pointer as NULL or valid.
///
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG, SKV_ERR_OUT_OF_MEMORY, SKV_ERR_STATE, SKV_ERR_UNSUPPORTED
#[no_mangle]
pub unsafe extern "C" fn skv_alloc_row(c: *mut skv_cache, req: *mut skv_req) -> skv_status {
    // SAFETY: the caller's contract, passed on.
    unsafe { req_export(c, this_export!(), req, &[], |c, r| c.alloc_row(r)) }
}

/// Maps n_tokens more positions of the req's row: the partial last page is filled first,
/// then whole new pages. out_loc, when not NULL, receives the n_tokens new positions' KV slot
/// indices (req_to_token[row, old kv_allocated_len:new)). SKV_ERR_OUT_OF_MEMORY leaves
/// everything unchanged.
///
/// The caller must pass every pointer as NULL or valid, out_loc holding n_tokens values.
///
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG, SKV_ERR_OUT_OF_MEMORY, SKV_ERR_NOT_FOUND, SKV_ERR_STATE, SKV_ERR_UNSUPPORTED
#[no_mangle]
pub unsafe extern "C" fn skv_alloc_extend(
    c: *mut skv_cache,
    req: *mut skv_req,
    n_tokens: u32,
    out_loc: *mut i32,
) -> skv_status {
    traced(
        c,
        this_export!(),
        |t| {
            t.req("req", req).num("n_tokens", n_tokens);
        },
        // SAFETY: c and req are NULL or valid and out_loc NULL or n_tokens values (the contract
        // above); on_req refuses NULL, out_loc is used only when not NULL.
        || unsafe {
            disjoint(&[Span::of(req, 1, "req"), Span::of(out_loc, n_tokens as usize, "out_loc")])?;
            let out = match out_loc.is_null() {
                true => None,
                false => Some(slice_mut(out_loc, n_tokens as usize, "out_loc")?),
            };
            on_req_in_place(c, req, |c, r| c.alloc_extend(r, n_tokens, out))
        },
        |t| {
            t.req("req_out", req);
            if !out_loc.is_null() {
                t.list("out_loc", out_loc.cast_const(), n_tokens as usize);
            }
        },
    )
}

/// kv_committed_len += n_tokens, which must stay <= kv_allocated_len.
///
/// The caller must pass every pointer as NULL or valid.
///
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG, SKV_ERR_NOT_FOUND, SKV_ERR_STATE, SKV_ERR_UNSUPPORTED
#[no_mangle]
pub unsafe extern "C" fn skv_commit(c: *mut skv_cache, req: *mut skv_req, n_tokens: u32) -> skv_status {
    traced(
        c,
        this_export!(),
        |t| {
            t.req("req", req).num("n_tokens", n_tokens);
        },
        // SAFETY: c and req are NULL or valid (the contract above); on_req refuses NULL.
        || unsafe { on_req_in_place(c, req, |c, r| c.commit(r, n_tokens)) },
        |t| {
            t.req("req_out", req);
        },
    )
}

/// Runs a batch operation on reqs[0..n) in place. A failing batch operation undoes what it
/// changed: the caller's reqs are as they were.
///
/// # Safety
/// `c` must be NULL or a live handle, `reqs` NULL or n valid reqs.
unsafe fn on_reqs(
    c: *mut skv_cache,
    reqs: *mut skv_req,
    n: usize,
    op: impl FnOnce(&mut Cache, &mut [Req]) -> Result<()>,
) -> Result<()> {
    // SAFETY: NULL or a live handle, by this function's contract.
    let mut cache = unsafe { lock(c) }?;
    cache.require_owned()?;
    // SAFETY: NULL or n reqs, by this function's contract.
    let reqs = unsafe { slice_mut(reqs, n, "reqs") }?;
    op(&mut cache, as_core_reqs(reqs))
}

/// `on_req` for an operation that changes `*req` only once nothing can fail any more (an
/// extend, a commit): it runs on the caller's req in place, without the copies in and out.
///
/// # Safety
/// `c` must be NULL or a live handle, `req` NULL or a valid skv_req.
#[inline(always)]
unsafe fn on_req_in_place(
    c: *mut skv_cache,
    req: *mut skv_req,
    op: impl FnOnce(&mut Cache, &mut Req) -> Result<()>,
) -> Result<()> {
    // SAFETY: NULL or valid, by this function's contract.
    let req = unsafe { out_mut(req, "req") }?;
    // SAFETY: NULL or a live handle, by this function's contract.
    let mut cache = unsafe { lock(c) }?;
    op(&mut cache, as_core_reqs(std::slice::from_mut(req)).first_mut().expect("one req"))?;
    cache.take_deferred()
}

/// skv_alloc_extend for every request of a running batch in one call: `reqs[i]` gains
/// `n_tokens[i]` positions, and out_loc (when not NULL) receives every newly assigned KV slot
/// index, request after request (sglang's out_cache_loc; the sum of n_tokens values, which
/// must not exceed out_cap). All or nothing: every req is checked as skv_alloc_extend checks
/// it (and no row may appear twice), and the pool must hold the pages of the whole batch; a
/// failing call leaves the cache, the reqs and out_loc as they were, and the error names the
/// request's position (`reqs[17]: ...`).
/// (NULL, 0) is an empty batch.
///
/// The caller must pass reqs and n_tokens holding n values, and out_loc holding out_cap values
/// (or NULL).
///
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG, SKV_ERR_OUT_OF_MEMORY, SKV_ERR_NOT_FOUND, SKV_ERR_STATE, SKV_ERR_UNSUPPORTED
#[no_mangle]
pub unsafe extern "C" fn skv_alloc_extend_batch(
    c: *mut skv_cache,
    reqs: *mut skv_req,
    n: usize,
    n_tokens: *const u32,
    out_loc: *mut i32,
    out_cap: usize,
) -> skv_status {
    // The arrays are traced only after the call succeeded: the reqs as written back (their
    // input lengths are these minus n_tokens), and the slots assigned.
    let total = std::cell::Cell::new(0usize);
    traced(
        c,
        this_export!(),
        |t| {
            t.num("n", n as u64).num("out_loc", !out_loc.is_null() as u8).num("out_cap", out_cap as u64);
        },
        // SAFETY: c is NULL or a live handle, reqs and n_tokens NULL or n values, out_loc NULL
        // or out_cap values (the contract above); nonnull, on_reqs, slice and slice_mut refuse
        // NULL with a length.
        || unsafe {
            nonnull(reqs, n, "reqs")?;
            nonnull(n_tokens, n, "n_tokens")?;
            aligned(out_loc, out_cap, "out_loc")?;
            disjoint(&[
                Span::of(reqs, n, "reqs"),
                Span::of(n_tokens, n, "n_tokens"),
                Span::of(out_loc, out_cap, "out_loc"),
            ])?;
            on_reqs(c, reqs, n, |cache, copies| {
                let counts = slice(n_tokens, n, "n_tokens")?;
                let out = match out_loc.is_null() {
                    true => None,
                    false => Some(slice_mut(out_loc, out_cap, "out_loc")?),
                };
                cache.alloc_extend_batch(copies, counts, out)?;
                total.set(counts.iter().map(|&k| k as usize).sum());
                Ok(())
            })
        },
        |t| {
            t.list("n_tokens", n_tokens, n).reqs("reqs_out", reqs, n);
            if !out_loc.is_null() {
                t.list("out_loc", out_loc.cast_const(), total.get());
            }
        },
    )
}

/// skv_commit for every request of a running batch in one call: `reqs[i].kv_committed_len` +=
/// `n_tokens[i]`. All or nothing, as skv_alloc_extend_batch; errors name the request's position.
///
/// The caller must pass reqs and n_tokens holding n values.
///
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG, SKV_ERR_NOT_FOUND, SKV_ERR_STATE, SKV_ERR_UNSUPPORTED
#[no_mangle]
pub unsafe extern "C" fn skv_commit_batch(
    c: *mut skv_cache,
    reqs: *mut skv_req,
    n: usize,
    n_tokens: *const u32,
) -> skv_status {
    traced(
        c,
        this_export!(),
        |t| {
            t.num("n", n as u64);
        },
        // SAFETY: c is NULL or a live handle, reqs and n_tokens NULL or n values (the contract
        // above); nonnull, on_reqs and slice refuse NULL with a length.
        || unsafe {
            nonnull(reqs, n, "reqs")?;
            nonnull(n_tokens, n, "n_tokens")?;
            disjoint(&[Span::of(reqs, n, "reqs"), Span::of(n_tokens, n, "n_tokens")])?;
            on_reqs(c, reqs, n, |cache, copies| cache.commit_batch(copies, slice(n_tokens, n, "n_tokens")?))
        },
        |t| {
            t.list("n_tokens", n_tokens, n).reqs("reqs_out", reqs, n);
        },
    )
}

/// A non-session finish: frees [protected, allocated) and the row. The req ends with row -1
/// and KV lengths 0; its lock_node, aux_state and aux_track stay the engine's to release.
///
/// The caller must pass every pointer as NULL or valid.
///
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG, SKV_ERR_NOT_FOUND, SKV_ERR_STATE, SKV_ERR_UNSUPPORTED
#[no_mangle]
pub unsafe extern "C" fn skv_free_req(c: *mut skv_cache, req: *mut skv_req) -> skv_status {
    // SAFETY: the caller's contract, passed on.
    unsafe { req_export(c, this_export!(), req, &[], |c, r| c.free_req(r)) }
}

/// Hands the engine's prefix tree n_tokens token slots (a multiple of page_size) in whole
/// pages, page-structured, written to out_indices.
///
/// The caller must pass out_indices holding n_tokens values.
///
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG, SKV_ERR_OUT_OF_MEMORY, SKV_ERR_STATE, SKV_ERR_UNSUPPORTED
#[no_mangle]
pub unsafe extern "C" fn skv_pool_alloc(c: *mut skv_cache, n_tokens: u32, out_indices: *mut i32) -> skv_status {
    traced(
        c,
        this_export!(),
        |t| {
            t.num("n_tokens", n_tokens);
        },
        // SAFETY: c is NULL or a live handle and out_indices NULL or n_tokens values (the contract
        // above); lock and slice_mut refuse NULL.
        || unsafe {
            let out = slice_mut(out_indices, n_tokens as usize, "out_indices")?;
            lock(c)?.pool_alloc(out)
        },
        |t| {
            t.list("out_indices", out_indices.cast_const(), n_tokens as usize);
        },
    )
}

/// Takes back engine-held pages: each index frees the page it falls in. A page already free
/// (double free) or still mapped by a row is SKV_ERR_STATE and nothing is freed.
///
/// The caller must pass indices holding n values.
///
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG, SKV_ERR_STATE, SKV_ERR_UNSUPPORTED
#[no_mangle]
pub unsafe extern "C" fn skv_pool_free(c: *mut skv_cache, indices: *const i32, n: usize) -> skv_status {
    traced(
        c,
        this_export!(),
        |t| {
            t.list("indices", indices, n);
        },
        // SAFETY: c is NULL or a live handle and indices NULL or n values (the contract above);
        // lock and slice refuse NULL.
        || unsafe {
            nonnull(indices, n, "indices")?;
            let mut c = lock(c)?;
            c.require_owned()?;
            c.pool_free(slice(indices, n, "indices")?)
        },
        |_| {},
    )
}

/// For each index, how many rows map its page (0: the tree may evict it).
///
/// The caller must pass indices and out_counts holding n values each.
///
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG, SKV_ERR_OUT_OF_MEMORY, SKV_ERR_STATE, SKV_ERR_UNSUPPORTED
#[no_mangle]
pub unsafe extern "C" fn skv_page_refs(
    c: *const skv_cache,
    indices: *const i32,
    n: usize,
    out_counts: *mut u32,
) -> skv_status {
    traced(
        c,
        this_export!(),
        |t| {
            t.list("indices", indices, n);
        },
        // SAFETY: c is NULL or a live handle, indices and out_counts NULL or n values (the contract
        // above); lock, slice and slice_mut refuse NULL.
        || unsafe {
            nonnull(indices, n, "indices")?;
            nonnull(out_counts, n, "out_counts")?;
            disjoint(&[Span::of(indices, n, "indices"), Span::of(out_counts, n, "out_counts")])?;
            let c = lock(c)?;
            c.require_owned()?;
            c.page_refs(slice(indices, n, "indices")?, slice_mut(out_counts, n, "out_counts")?)
        },
        |t| {
            t.list("out_counts", out_counts.cast_const(), n);
        },
    )
}

/// A fresh row (kv_allocated_len 0) adopts engine-held pages as its protected prefix:
/// allocated = committed = protected = n_tokens. Indices must be page-structured.
///
/// The caller must pass every pointer as NULL or valid, indices holding n_tokens values.
///
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG, SKV_ERR_NOT_FOUND, SKV_ERR_STATE, SKV_ERR_UNSUPPORTED
#[no_mangle]
pub unsafe extern "C" fn skv_map_prefix(
    c: *mut skv_cache,
    req: *mut skv_req,
    indices: *const i32,
    n_tokens: u32,
) -> skv_status {
    traced(
        c,
        this_export!(),
        |t| {
            t.req("req", req).list("indices", indices, n_tokens as usize);
        },
        // SAFETY: c and req are NULL or valid and indices NULL or n_tokens values (the contract
        // above); slice and on_req refuse NULL.
        || unsafe {
            disjoint(&[Span::of(req, 1, "req"), Span::of(indices, n_tokens as usize, "indices")])?;
            let indices = slice(indices, n_tokens as usize, "indices")?;
            on_req(c, req, |c, r| c.map_prefix(r, indices), |()| {})
        },
        |t| {
            t.req("req_out", req);
        },
    )
}

/// The row's pages [protected, new_protected_len) become engine-held (inserted in the
/// engine's tree); new_protected_len is a multiple of page_size and <= kv_committed_len.
///
/// The caller must pass every pointer as NULL or valid.
///
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG, SKV_ERR_NOT_FOUND, SKV_ERR_STATE, SKV_ERR_UNSUPPORTED
#[no_mangle]
pub unsafe extern "C" fn skv_publish_prefix(
    c: *mut skv_cache,
    req: *mut skv_req,
    new_protected_len: u32,
) -> skv_status {
    // SAFETY: the caller's contract, passed on.
    unsafe {
        req_export(c, this_export!(), req, &[("new_protected_len", new_protected_len)], |c, r| {
            c.publish_prefix(r, new_protected_len)
        })
    }
}

/// Copies req_to_token[row, start:end) into out (end-start values). External mode:
/// SKV_ERR_UNSUPPORTED whatever the row and range (after the NULL checks).
///
/// The caller must pass out holding end-start values.
///
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG, SKV_ERR_NOT_FOUND, SKV_ERR_STATE, SKV_ERR_UNSUPPORTED
#[no_mangle]
pub unsafe extern "C" fn skv_row_indices(
    c: *const skv_cache,
    row: i32,
    start: u32,
    end: u32,
    out: *mut i32,
) -> skv_status {
    // SAFETY: this call's contract is row_indices_of's.
    unsafe { row_indices_of(this_export!(), c, row, start, end, false, out) }
}

/// skv_row_indices for the sliding-window layers: the SWA pool's token slot of each position
/// of req_to_token[row, start:end) (the slot its page's SWA page holds it at), 0 for a
/// position the window has passed (skv_swa_evict gave its SWA page back; 0 is in the padding
/// page). SKV_ERR_UNSUPPORTED without an SWA pool (swa_num_token_slots 0) and in external
/// mode.
///
/// The caller must pass out holding end-start values.
///
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG, SKV_ERR_NOT_FOUND, SKV_ERR_STATE, SKV_ERR_UNSUPPORTED
#[no_mangle]
pub unsafe extern "C" fn skv_row_swa_indices(
    c: *const skv_cache,
    row: i32,
    start: u32,
    end: u32,
    out: *mut i32,
) -> skv_status {
    // SAFETY: this call's contract is row_indices_of's.
    unsafe { row_indices_of(this_export!(), c, row, start, end, true, out) }
}

/// skv_row_indices (`swa` false) and skv_row_swa_indices.
///
/// # Safety
/// `c` must be NULL or a live handle, `out` NULL or hold end-start values.
unsafe fn row_indices_of(
    function: ExportName,
    c: *const skv_cache,
    row: i32,
    start: u32,
    end: u32,
    swa: bool,
    out: *mut i32,
) -> skv_status {
    traced(
        c,
        function,
        |t| {
            t.num("row", row).num("start", start).num("end", end);
        },
        // SAFETY: c is NULL or a live handle and out NULL or end-start values (the contract above);
        // lock and slice_mut refuse NULL.
        || unsafe {
            let n = end.saturating_sub(start) as usize;
            nonnull(out, n, "out")?;
            let c = lock(c)?;
            c.require_owned()?;
            let out = slice_mut(out, n, "out")?;
            let Ok(row) = u32::try_from(row) else {
                return Err(Error::InvalidArg(format!("row {row} out of range [0, {})", c.config().num_rows)));
            };
            c.row_indices(row, start, end, swa, out)
        },
        |t| {
            t.list("out", out.cast_const(), end.saturating_sub(start) as usize);
        },
    )
}

/// Pool occupancy. total_pages = num_token_slots / page_size, the padding page 0 included;
/// free_pages never counts page 0, so an empty cache has free_pages == total_pages - 1 and
/// used_pages == total_pages - 1 - free_pages. The swa_* fields say the same of the SWA pool
/// (swa_total_pages = swa_num_token_slots / page_size), and are 0 without one. External mode
/// (the engine owns the pools): total_rows (num_rows), sessions, trimmed_tokens,
/// tail_freed_tokens and finishes_past_committed are filled; every page count and free_rows
/// are 0.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct skv_stats {
    /// Pages in the pool, page 0 included.
    pub total_pages: u64,
    /// Pages free to allocate.
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
    /// skv_cache_finished_req calls (not aborted) since creation whose target,
    /// origin_input_len + finished_len (output_len when finished_len is -1), was more than
    /// kv_committed_len + 1: the finish claimed tokens whose KV the engine never committed. The
    /// last sampled token has no KV yet, so target = kv_committed_len + 1 is a normal finish.
    /// Counted, not refused (docs/conventions.md, "Finishes past committed").
    pub finishes_past_committed: u64,
}

impl From<Stats> for skv_stats {
    fn from(s: Stats) -> skv_stats {
        let (total_pages, free_pages, used_pages) = (s.total_pages, s.free_pages, s.used_pages);
        let (total_rows, free_rows, sessions) = (s.total_rows, s.free_rows, s.sessions);
        let (trimmed_tokens, tail_freed_tokens) = (s.trimmed_tokens, s.tail_freed_tokens);
        let (swa_total_pages, swa_free_pages, swa_used_pages) = (s.swa_total_pages, s.swa_free_pages, s.swa_used_pages);
        let finishes_past_committed = s.finishes_past_committed;
        skv_stats {
            swa_total_pages,
            swa_free_pages,
            swa_used_pages,
            total_pages,
            free_pages,
            used_pages,
            total_rows,
            free_rows,
            sessions,
            trimmed_tokens,
            tail_freed_tokens,
            finishes_past_committed,
        }
    }
}

/// Reads the pool's occupancy and counters. Both modes; in external mode only what libskv
/// knows there (see skv_stats).
///
/// The caller must pass every pointer as NULL or valid.
///
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG, SKV_ERR_STATE
#[no_mangle]
pub unsafe extern "C" fn skv_cache_stats(c: *const skv_cache, out: *mut skv_stats) -> skv_status {
    traced(
        c,
        this_export!(),
        |_| {},
        // SAFETY: c and out are NULL or valid (the contract above); out_mut and lock refuse NULL.
        || unsafe {
            let out = out_mut(out, "out")?;
            // Written under the lock: the counters then need no registers across the unlock.
            *out = lock(c)?.stats()?.into();
            Ok(())
        },
        |t| {
            // SAFETY: written by the call that just succeeded.
            let s = unsafe { &*out };
            t.num("free_pages", s.free_pages).num("free_rows", s.free_rows).num("sessions", s.sessions);
            t.num("swa_free_pages", s.swa_free_pages);
        },
    )
}

/// The result of an audit.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct skv_check_report {
    /// Pages on the free list.
    pub pages_free: u64,
    /// Pages owned by exactly one row.
    pub pages_in_rows: u64,
    /// Pages held by the engine (from skv_pool_alloc or inside a protected prefix).
    pub pages_engine_held: u64,
    /// SWA pages on the SWA pool's free list (0 without an SWA pool).
    pub swa_pages_free: u64,
    /// SWA pages in use: each named by exactly one page a row owns or the engine holds.
    pub swa_pages_in_use: u64,
    /// 0 when every invariant holds.
    pub violations: u64,
    /// The first violation as text, NUL-terminated ("" when none).
    pub first_violation: [c_char; 256],
}

/// Audits the owned pool, linear in pages plus the rows' page entries: free + row-owned +
/// engine-held == total_pages - 1, no page in two rows' owned ranges, no free page mapped by
/// a row, every engine-held page's map count equal to the rows that map it, idle session
/// slots agreeing with their rows. With an SWA pool, also: every SWA page is free or named by
/// exactly one row-owned or engine-held page (free + in use == swa_total_pages - 1), a row's
/// protected prefix names its held pages' SWA pages, and an idle slot's row has no SWA page
/// where the window passed ([swa_dead_lo, swa_evicted_seqlen)) and one everywhere else.
///
/// The caller must pass every pointer as NULL or valid.
///
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG, SKV_ERR_OUT_OF_MEMORY, SKV_ERR_STATE, SKV_ERR_UNSUPPORTED
#[no_mangle]
pub unsafe extern "C" fn skv_cache_check(c: *const skv_cache, out: *mut skv_check_report) -> skv_status {
    traced(
        c,
        this_export!(),
        |_| {},
        // SAFETY: c and out are NULL or valid (the contract above); out_mut and lock refuse NULL.
        || unsafe {
            let out = out_mut(out, "out")?;
            let r = lock(c)?.check()?;
            let mut text = [0 as c_char; 256];
            for (t, b) in text.iter_mut().zip(r.first_violation.bytes().take(255)) {
                *t = b as c_char;
            }
            *out = skv_check_report {
                pages_free: r.pages_free,
                pages_in_rows: r.pages_in_rows,
                pages_engine_held: r.pages_engine_held,
                swa_pages_free: r.swa_pages_free,
                swa_pages_in_use: r.swa_pages_in_use,
                violations: r.violations,
                first_violation: text,
            };
            Ok(())
        },
        |t| {
            // SAFETY: written by the call that just succeeded.
            t.num("violations", unsafe { (*out).violations });
        },
    )
}

/// Owned mode's engine callbacks: a released session's prefix-tree lock and aux state go
/// here (release, aborted finish, aligned-reuse release). Either may be NULL. They run on the
/// calling thread while the handle is locked; as for skv_pool_ops, a libskv call taking a
/// handle (any handle) made from inside one returns SKV_ERR_STATE, and skv_cache_free does
/// nothing.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct skv_engine_hooks {
    /// sizeof(skv_engine_hooks) of the header the caller was built with: 24 so far (ABI 1
    /// to 3). Accepted from 24 up; see "Versioned structs" at the top of this header.
    pub struct_size: u32,
    /// Drop the prefix-tree lock a session inherited from its first request.
    pub dec_lock_ref: skv_dec_lock_ref_fn,
    /// Free one engine auxiliary-state handle: once per handle that is not -1, in the order
    /// `aux_state`, `aux_track[0]`, `aux_track[1]` (docs/recurrent-state.md).
    pub free_aux: skv_free_aux_fn,
}

/// Every published sizeof(skv_engine_hooks) (`read_versioned`).
pub(crate) const HOOKS_SIZES: [u32; 1] = [24];
const _: () = assert!(std::mem::size_of::<skv_engine_hooks>() as u32 == HOOKS_SIZES[0]);

struct Hooks {
    hooks: skv_engine_hooks,
    user_data: *mut c_void,
}

// SAFETY: the engine promises its callbacks (and user_data, which only they use) may run on
// whichever thread calls libskv; the handle's lock keeps the calls one at a time.
unsafe impl Send for Hooks {}

fn rc(code: c_int) -> Result<(), i32> {
    if code == 0 {
        Ok(())
    } else {
        Err(code)
    }
}

impl EngineHooks for Hooks {
    fn dec_lock_ref(&mut self, node: u64, receipt: u64) -> Result<(), i32> {
        let _scope = CallbackScope::enter();
        // SAFETY: the engine's callback, callable while installed (skv_cache_set_hooks).
        self.hooks.dec_lock_ref.map_or(Ok(()), |f| rc(unsafe { f(self.user_data, node, receipt) }))
    }

    fn free_aux(&mut self, aux: i64) -> Result<(), i32> {
        let _scope = CallbackScope::enter();
        // SAFETY: the engine's callback, callable while installed (skv_cache_set_hooks).
        self.hooks.free_aux.map_or(Ok(()), |f| rc(unsafe { f(self.user_data, aux) }))
    }
}

/// Installs owned mode's engine hooks (copied); NULL hooks removes them, after which released
/// locks and aux states are dropped. External mode: SKV_ERR_UNSUPPORTED (skv_pool_ops carries
/// them).
///
/// The caller must pass every pointer as NULL or valid, and keep the callbacks callable while
/// they are installed.
///
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG, SKV_ERR_STATE, SKV_ERR_UNSUPPORTED
#[no_mangle]
pub unsafe extern "C" fn skv_cache_set_hooks(
    c: *mut skv_cache,
    hooks: *const skv_engine_hooks,
    user_data: *mut c_void,
) -> skv_status {
    traced(
        c,
        this_export!(),
        |t| {
            // SAFETY: NULL or a struct of struct_size bytes by the call's contract; read as
            // the body reads it.
            match (!hooks.is_null()).then(|| unsafe { super::read_versioned(hooks, &HOOKS_SIZES, "hooks") }) {
                None => {
                    t.num("hooks", 0);
                }
                Some(Err(_)) => {
                    t.text("hooks", "invalid");
                }
                Some(Ok(h)) => {
                    t.num("hooks", 1);
                    t.num("dec_lock_ref", h.dec_lock_ref.is_some() as u8);
                    t.num("free_aux", h.free_aux.is_some() as u8);
                }
            }
        },
        // SAFETY: c is NULL or a live handle and hooks NULL or a struct of struct_size bytes (the
        // contract above); lock refuses NULL and hooks is read only when not NULL.
        || unsafe {
            let mut c = lock(c)?;
            c.require_owned()?;
            let hooks = match hooks.is_null() {
                true => None,
                false => {
                    let hooks = super::read_versioned(hooks, &HOOKS_SIZES, "hooks")?;
                    Some(Box::new(Hooks { hooks, user_data }) as Box<dyn EngineHooks>)
                }
            };
            c.set_hooks(hooks)
        },
        |_| {},
    )
}

/// FlashInfer's paged-KV triple for a batch of rows: `kv_indptr[n+1]` (prefix sums of page
/// counts), kv_indices (page ids), `kv_last_page_len[n]` (1..page_size; 0 for an empty row).
/// *needed receives the number of page ids, also when it exceeds cap (or INT32_MAX): then
/// SKV_ERR_INVALID_ARG and nothing else is written. This is the one failure that writes an
/// out-parameter; every other failure leaves *needed alone.
///
/// The caller must pass kv_indptr holding n+1 values, kv_last_page_len n and kv_indices cap.
///
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG, SKV_ERR_NOT_FOUND, SKV_ERR_STATE, SKV_ERR_UNSUPPORTED
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn skv_build_flashinfer(
    c: *const skv_cache,
    rows: *const i32,
    n: usize,
    kv_indptr: *mut i32,
    kv_indices: *mut i32,
    kv_last_page_len: *mut i32,
    cap: usize,
    needed: *mut usize,
) -> skv_status {
    // SAFETY: this call's contract is flashinfer_of's.
    unsafe { flashinfer_of(this_export!(), c, rows, n, false, kv_indptr, kv_indices, kv_last_page_len, cap, needed) }
}

/// skv_build_flashinfer for the sliding-window layers: the same kv_indptr and
/// kv_last_page_len, and in kv_indices the SWA pool's page id of each page (0, the padding
/// page, where the window has passed: a sliding-window kernel never reads it).
/// SKV_ERR_UNSUPPORTED without an SWA pool (swa_num_token_slots 0) and in external mode.
///
/// The caller must pass kv_indptr holding n+1 values, kv_last_page_len n and kv_indices cap.
///
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG, SKV_ERR_NOT_FOUND, SKV_ERR_STATE, SKV_ERR_UNSUPPORTED
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn skv_build_flashinfer_swa(
    c: *const skv_cache,
    rows: *const i32,
    n: usize,
    kv_indptr: *mut i32,
    kv_indices: *mut i32,
    kv_last_page_len: *mut i32,
    cap: usize,
    needed: *mut usize,
) -> skv_status {
    // SAFETY: this call's contract is flashinfer_of's.
    unsafe { flashinfer_of(this_export!(), c, rows, n, true, kv_indptr, kv_indices, kv_last_page_len, cap, needed) }
}

/// skv_build_flashinfer (`swa` false) and skv_build_flashinfer_swa.
///
/// # Safety
/// `c` must be NULL or a live handle, `rows` NULL or n values, `kv_indptr` NULL or n+1,
/// `kv_indices` NULL or cap, `kv_last_page_len` NULL or n, `needed` NULL or valid.
#[allow(clippy::too_many_arguments)]
unsafe fn flashinfer_of(
    function: ExportName,
    c: *const skv_cache,
    rows: *const i32,
    n: usize,
    swa: bool,
    kv_indptr: *mut i32,
    kv_indices: *mut i32,
    kv_last_page_len: *mut i32,
    cap: usize,
    needed: *mut usize,
) -> skv_status {
    traced(
        c,
        function,
        |t| {
            t.list("rows", rows, n).num("cap", cap as u64);
        },
        // SAFETY: c is NULL or a live handle, rows NULL or n values, kv_indptr n+1, kv_indices cap,
        // kv_last_page_len n, needed NULL or valid (the contract above); nonnull, out_mut, lock,
        // slice and slice_mut refuse NULL with a length.
        || unsafe {
            nonnull(rows, n, "rows")?;
            nonnull(kv_indptr, 1, "kv_indptr")?;
            nonnull(kv_indices, cap, "kv_indices")?;
            nonnull(kv_last_page_len, n, "kv_last_page_len")?;
            disjoint(&[
                Span::of(rows, n, "rows"),
                Span::of(kv_indptr, n.saturating_add(1), "kv_indptr"),
                Span::of(kv_indices, cap, "kv_indices"),
                Span::of(kv_last_page_len, n, "kv_last_page_len"),
                Span::of(needed, 1, "needed"),
            ])?;
            let needed = out_mut(needed, "needed")?;
            let c = lock(c)?;
            c.require_owned()?;
            let rows = slice(rows, n, "rows")?;
            let Some(n_ptr) = n.checked_add(1) else { return Err(Error::InvalidArg(format!("n {n} out of range"))) };
            let indptr = slice_mut(kv_indptr, n_ptr, "kv_indptr")?;
            let indices = slice_mut(kv_indices, cap, "kv_indices")?;
            let last = slice_mut(kv_last_page_len, n, "kv_last_page_len")?;
            let total = c.flashinfer_len(rows, swa)?;
            *needed = total;
            if total > cap || total > i32::MAX as usize {
                return Err(Error::InvalidArg(format!("the rows need {total} page ids, cap is {cap}")));
            }
            c.flashinfer_fill(rows, swa, indptr, &mut indices[..total], last);
            Ok(())
        },
        |t| {
            // SAFETY: written by the call that just succeeded.
            let total = unsafe { *needed };
            t.num("needed", total as u64).list("kv_indptr", kv_indptr.cast_const(), n + 1);
            t.list("kv_indices", kv_indices.cast_const(), total).list(
                "kv_last_page_len",
                kv_last_page_len.cast_const(),
                n,
            );
        },
    )
}
