//! The pool's occupancy and counters (both modes) and the audit of owned mode's pool.

use super::queries::answer;
use super::{skv_cache, skv_status};
use crate::core::Cache;

/// The Rust names of the C records (one definition each, in `core`).
pub use crate::core::{Report as skv_check_report, Stats as skv_stats};

/// Reads the pool's occupancy and counters. Both modes; in external mode only what libskv
/// knows there (see skv_stats).
///
/// The caller must pass every pointer as NULL or valid.
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
