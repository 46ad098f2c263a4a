//! The pool's occupancy and counters (both modes) and the audit of owned mode's pool.

use std::ffi::c_char;

use super::{lock, out_mut, skv_cache, skv_status};
use crate::core::Stats;

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
    export!(
        skv_cache_stats,
        c,
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
    export!(
        skv_cache_check,
        c,
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
