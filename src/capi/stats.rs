//! The pool's occupancy and counters (both modes) and the audit of owned mode's pool.

use super::queries::answer;
use super::{skv_cache, skv_status};
use crate::core::Cache;

/// The Rust names of the C records (one definition each, in `core`).
pub use crate::core::{Report as skv_check_report, Stats as skv_stats};

/// Reads the pool's occupancy and counters into `*out`; in external mode only what libskv knows
/// there (see skv_stats).
///
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG, SKV_ERR_STATE
#[no_mangle]
pub unsafe extern "C" fn skv_cache_stats(c: *const skv_cache, out: *mut crate::core::Stats) -> skv_status {
    // SAFETY: c and out are NULL or valid (the contract above), as `answer` needs.
    export!(skv_cache_stats, |name| unsafe {
        answer(
            c,
            name,
            |_| {},
            out,
            Cache::stats,
            |t, s| {
                t.num("free_pages", s.free_pages).num("free_rows", s.free_rows).num("sessions", s.sessions);
                t.num("swa_free_pages", s.swa_free_pages);
            },
        )
    })
}

/// Audits the owned pool, linear in pages plus the rows' page entries, and writes the report to
/// `*out`: violations == 0 when every invariant holds (the list:
/// docs/operations.md#owned-mode-calls).
///
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG, SKV_ERR_OUT_OF_MEMORY, SKV_ERR_STATE,
///          SKV_ERR_UNSUPPORTED
#[no_mangle]
pub unsafe extern "C" fn skv_cache_check(c: *const skv_cache, out: *mut crate::core::Report) -> skv_status {
    // SAFETY: c and out are NULL or valid (the contract above), as `answer` needs.
    export!(skv_cache_check, |name| unsafe {
        answer(
            c,
            name,
            |_| {},
            out,
            Cache::check,
            |t, r| {
                t.num("violations", r.violations);
            },
        )
    })
}
