//! FlashInfer's paged-KV arrays for a batch of owned-mode rows.

use super::{disjoint, lock, nonnull, out_mut, skv_cache, skv_status, slice, slice_mut, traced, Span};
use crate::core::Error;

/// FlashInfer's paged-KV triple for a batch of `rows`: `kv_indptr[n+1]` (prefix sums of page
/// counts), kv_indices (page ids), `kv_last_page_len[n]` (1..page_size; 0 for an empty row).
/// `*needed` receives the number of page ids, also when they do not fit in cap (the one failure
/// that writes an out-parameter: docs/conventions.md).
///
/// The caller must pass kv_indptr holding n+1 values, kv_last_page_len n and kv_indices cap.
///
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG, SKV_ERR_NOT_FOUND, SKV_ERR_STATE,
///          SKV_ERR_UNSUPPORTED
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
    export!(skv_build_flashinfer, |name| unsafe {
        flashinfer_of(name, c, rows, n, false, kv_indptr, kv_indices, kv_last_page_len, cap, needed)
    })
}

/// skv_build_flashinfer for the sliding-window layers: the same kv_indptr and kv_last_page_len,
/// and in kv_indices the SWA pool's page id of each page (0, the padding page, where the window
/// has passed: a sliding-window kernel never reads it).
///
/// The caller must pass kv_indptr holding n+1 values, kv_last_page_len n and kv_indices cap.
///
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG, SKV_ERR_NOT_FOUND, SKV_ERR_STATE,
///          SKV_ERR_UNSUPPORTED
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
    export!(skv_build_flashinfer_swa, |name| unsafe {
        flashinfer_of(name, c, rows, n, true, kv_indptr, kv_indices, kv_last_page_len, cap, needed)
    })
}

/// skv_build_flashinfer (`swa` false) and skv_build_flashinfer_swa.
///
/// # Safety
/// `c` must be NULL or a live handle, `rows` NULL or n values, `kv_indptr` NULL or n+1,
/// `kv_indices` NULL or cap, `kv_last_page_len` NULL or n, `needed` NULL or valid.
#[allow(clippy::too_many_arguments)]
unsafe fn flashinfer_of(
    function: &'static str,
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
