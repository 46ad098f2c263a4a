//! Owned-pool operations: libskv's own allocator and rows. Each is SKV_ERR_UNSUPPORTED on
//! an external-mode handle.

use super::req::{on_req, req_export};
use super::{aligned, disjoint, lock, nonnull, out_mut, skv_cache, skv_status, slice, slice_mut, traced, Span};
use crate::core::{Cache, Error, Req, Result};

/// Assigns a free row to a req that holds none; the row maps nothing yet, so the req's KV
/// lengths become 0 (docs/operations.md#owned-mode-calls).
///
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG, SKV_ERR_OUT_OF_MEMORY, SKV_ERR_STATE,
///          SKV_ERR_UNSUPPORTED
#[no_mangle]
pub unsafe extern "C" fn skv_alloc_row(c: *mut skv_cache, req: *mut Req) -> skv_status {
    // SAFETY: the caller's contract, passed on.
    export!(skv_alloc_row, |name| unsafe { req_export(c, name, req, &[], |c, r| c.alloc_row(r)) })
}

/// Maps `n_tokens` more positions of the req's row: its partial last page first, then whole new
/// pages. `out_loc` (NULL allowed) receives the new positions' KV slot indices
/// (req_to_token[row, old kv_allocated_len:new)).
///
/// The caller must pass every pointer as NULL or valid, out_loc holding n_tokens values.
///
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG, SKV_ERR_OUT_OF_MEMORY, SKV_ERR_NOT_FOUND,
///          SKV_ERR_STATE, SKV_ERR_UNSUPPORTED
#[no_mangle]
pub unsafe extern "C" fn skv_alloc_extend(
    c: *mut skv_cache,
    req: *mut Req,
    n_tokens: u32,
    out_loc: *mut i32,
) -> skv_status {
    export!(
        skv_alloc_extend,
        c,
        |t| t.req("req", req).num("n_tokens", n_tokens),
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
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG, SKV_ERR_NOT_FOUND, SKV_ERR_STATE,
///          SKV_ERR_UNSUPPORTED
#[no_mangle]
pub unsafe extern "C" fn skv_commit(c: *mut skv_cache, req: *mut Req, n_tokens: u32) -> skv_status {
    export!(
        skv_commit,
        c,
        |t| t.req("req", req).num("n_tokens", n_tokens),
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
    reqs: *mut Req,
    n: usize,
    op: impl FnOnce(&mut Cache, &mut [Req]) -> Result<()>,
) -> Result<()> {
    // SAFETY: NULL or a live handle, by this function's contract.
    let mut cache = unsafe { lock(c) }?;
    cache.require_owned()?;
    // SAFETY: NULL or n reqs, by this function's contract.
    let reqs = unsafe { slice_mut(reqs, n, "reqs") }?;
    op(&mut cache, reqs)
}

/// `on_req` for an operation that changes `*req` only once nothing can fail any more (an
/// extend, a commit): it runs on the caller's req in place, without the copies in and out.
///
/// # Safety
/// `c` must be NULL or a live handle, `req` NULL or a valid skv_req.
#[inline(always)]
unsafe fn on_req_in_place(
    c: *mut skv_cache,
    req: *mut Req,
    op: impl FnOnce(&mut Cache, &mut Req) -> Result<()>,
) -> Result<()> {
    // SAFETY: NULL or valid, by this function's contract.
    let req = unsafe { out_mut(req, "req") }?;
    // SAFETY: NULL or a live handle, by this function's contract.
    let mut cache = unsafe { lock(c) }?;
    op(&mut cache, req)?;
    cache.take_deferred()
}

/// skv_alloc_extend for every request of a running batch: `reqs[i]` gains `n_tokens[i]`
/// positions, and `out_loc` (NULL allowed) receives the new KV slot indices request after
/// request (sglang's out_cache_loc; `out_cap` must hold their sum). All or nothing; an error
/// names the request's position, `reqs[17]: ...` (docs/operations.md#owned-mode-calls).
///
/// The caller must pass reqs and n_tokens holding n values, and out_loc holding out_cap values
/// (or NULL).
///
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG, SKV_ERR_OUT_OF_MEMORY, SKV_ERR_NOT_FOUND,
///          SKV_ERR_STATE, SKV_ERR_UNSUPPORTED
#[no_mangle]
pub unsafe extern "C" fn skv_alloc_extend_batch(
    c: *mut skv_cache,
    reqs: *mut Req,
    n: usize,
    n_tokens: *const u32,
    out_loc: *mut i32,
    out_cap: usize,
) -> skv_status {
    // The arrays are traced only after the call succeeded: the reqs as written back (their
    // input lengths are these minus n_tokens), and the slots assigned.
    let total = std::cell::Cell::new(0usize);
    export!(
        skv_alloc_extend_batch,
        c,
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

/// skv_commit for every request of a running batch: `reqs[i].kv_committed_len` += `n_tokens[i]`.
/// All or nothing, as skv_alloc_extend_batch; errors name the request's position.
///
/// The caller must pass reqs and n_tokens holding n values.
///
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG, SKV_ERR_NOT_FOUND, SKV_ERR_STATE,
///          SKV_ERR_UNSUPPORTED
#[no_mangle]
pub unsafe extern "C" fn skv_commit_batch(
    c: *mut skv_cache,
    reqs: *mut Req,
    n: usize,
    n_tokens: *const u32,
) -> skv_status {
    export!(
        skv_commit_batch,
        c,
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
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG, SKV_ERR_NOT_FOUND, SKV_ERR_STATE,
///          SKV_ERR_UNSUPPORTED
#[no_mangle]
pub unsafe extern "C" fn skv_free_req(c: *mut skv_cache, req: *mut Req) -> skv_status {
    // SAFETY: the caller's contract, passed on.
    export!(skv_free_req, |name| unsafe {
        req_export(c, name, req, &[], |cache, r| super::events_emit::free_req(c, cache, r))
    })
}

/// Hands the engine's prefix tree n_tokens token slots (a multiple of page_size) in whole
/// pages, page-structured, written to out_indices.
///
/// The caller must pass out_indices holding n_tokens values.
///
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG, SKV_ERR_OUT_OF_MEMORY, SKV_ERR_STATE,
///          SKV_ERR_UNSUPPORTED
#[no_mangle]
pub unsafe extern "C" fn skv_pool_alloc(c: *mut skv_cache, n_tokens: u32, out_indices: *mut i32) -> skv_status {
    export!(
        skv_pool_alloc,
        c,
        |t| t.num("n_tokens", n_tokens),
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

/// Takes back engine-held pages: each index frees the page it falls in
/// (docs/operations.md#owned-mode-calls).
///
/// The caller must pass indices holding n values.
///
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG, SKV_ERR_STATE, SKV_ERR_UNSUPPORTED
#[no_mangle]
pub unsafe extern "C" fn skv_pool_free(c: *mut skv_cache, indices: *const i32, n: usize) -> skv_status {
    export!(
        skv_pool_free,
        c,
        |t| t.list("indices", indices, n),
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
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG, SKV_ERR_OUT_OF_MEMORY, SKV_ERR_STATE,
///          SKV_ERR_UNSUPPORTED
#[no_mangle]
pub unsafe extern "C" fn skv_page_refs(
    c: *const skv_cache,
    indices: *const i32,
    n: usize,
    out_counts: *mut u32,
) -> skv_status {
    export!(
        skv_page_refs,
        c,
        |t| t.list("indices", indices, n),
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
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG, SKV_ERR_NOT_FOUND, SKV_ERR_STATE,
///          SKV_ERR_UNSUPPORTED
#[no_mangle]
pub unsafe extern "C" fn skv_map_prefix(
    c: *mut skv_cache,
    req: *mut Req,
    indices: *const i32,
    n_tokens: u32,
) -> skv_status {
    export!(
        skv_map_prefix,
        c,
        |t| t.req("req", req).list("indices", indices, n_tokens as usize),
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
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG, SKV_ERR_NOT_FOUND, SKV_ERR_STATE,
///          SKV_ERR_UNSUPPORTED
#[no_mangle]
pub unsafe extern "C" fn skv_publish_prefix(c: *mut skv_cache, req: *mut Req, new_protected_len: u32) -> skv_status {
    // SAFETY: the caller's contract, passed on.
    export!(skv_publish_prefix, |name| unsafe {
        req_export(c, name, req, &[("new_protected_len", new_protected_len)], |c, r| {
            c.publish_prefix(r, new_protected_len)
        })
    })
}

/// Copies req_to_token[row, start:end) into `out` (end - start values).
///
/// The caller must pass out holding end-start values.
///
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG, SKV_ERR_NOT_FOUND, SKV_ERR_STATE,
///          SKV_ERR_UNSUPPORTED
#[no_mangle]
pub unsafe extern "C" fn skv_row_indices(
    c: *const skv_cache,
    row: i32,
    start: u32,
    end: u32,
    out: *mut i32,
) -> skv_status {
    // SAFETY: this call's contract is row_indices_of's.
    export!(skv_row_indices, |name| unsafe { row_indices_of(name, c, row, start, end, false, out) })
}

/// skv_row_indices for the sliding-window layers: the SWA pool's token slot of each position of
/// req_to_token[row, start:end), 0 where the window has passed
/// (docs/hybrid.md#owned-mode-two-pools).
///
/// The caller must pass out holding end-start values.
///
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG, SKV_ERR_NOT_FOUND, SKV_ERR_STATE,
///          SKV_ERR_UNSUPPORTED
#[no_mangle]
pub unsafe extern "C" fn skv_row_swa_indices(
    c: *const skv_cache,
    row: i32,
    start: u32,
    end: u32,
    out: *mut i32,
) -> skv_status {
    // SAFETY: this call's contract is row_indices_of's.
    export!(skv_row_swa_indices, |name| unsafe { row_indices_of(name, c, row, start, end, true, out) })
}

/// skv_row_indices (`swa` false) and skv_row_swa_indices.
///
/// # Safety
/// `c` must be NULL or a live handle, `out` NULL or hold end-start values.
unsafe fn row_indices_of(
    function: &'static str,
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
