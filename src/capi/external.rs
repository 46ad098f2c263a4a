//! External mode: the engine's pools behind its callbacks (`skv_pool_ops`), as owned mode's are
//! libskv's own (`core::owned`). Every free is read (`read_row`) before anything changes, then
//! handed to the engine.

use std::ffi::{c_int, c_void};

use super::CallbackScope;
use crate::core::{split, Effect, Error, Pool, Pools, Req, Result, Segment};

/// skv_pool_ops.read_row: copies req_to_token[row, start:end) into `out`, which has room for
/// end - start int32 values. `user_data` is the pointer given to skv_cache_new_external.
/// Returns 0, or non-zero to fail the libskv call with SKV_ERR_CALLBACK, nothing changed.
pub type skv_read_row_fn =
    Option<unsafe extern "C" fn(user_data: *mut c_void, row: i32, start: u32, end: u32, out: *mut i32) -> c_int>;

/// skv_pool_ops.free_kv: returns the `n` KV slot indices at `indices` (readable only during the
/// call) to the engine's allocator. `user_data` is the pointer given to
/// skv_cache_new_external. Returns 0, or non-zero for SKV_ERR_CALLBACK (the call completes).
pub type skv_free_kv_fn = Option<unsafe extern "C" fn(user_data: *mut c_void, indices: *const i32, n: usize) -> c_int>;

/// skv_pool_ops.free_row: returns req_to_token row `row` to the engine's row pool.
/// `user_data` is the pointer given to skv_cache_new_external. Returns 0, or non-zero for
/// SKV_ERR_CALLBACK (the call completes).
pub type skv_free_row_fn = Option<unsafe extern "C" fn(user_data: *mut c_void, row: i32) -> c_int>;

/// skv_pool_ops.dec_lock_ref and skv_engine_hooks.dec_lock_ref: drops the prefix-tree lock a
/// session inherited, given as its req's `lock_node` and `lock_receipt`. `user_data` is the
/// pointer given with the ops or hooks. Returns 0, or non-zero for SKV_ERR_CALLBACK (the call
/// completes).
pub type skv_dec_lock_ref_fn =
    Option<unsafe extern "C" fn(user_data: *mut c_void, lock_node: u64, lock_receipt: u64) -> c_int>;

/// skv_pool_ops.free_aux and skv_engine_hooks.free_aux: frees one engine auxiliary-state
/// handle `aux` (a req's aux_state or one of its aux_track entries, never -1). `user_data` is
/// the pointer given with the ops or hooks. Returns 0, or non-zero for SKV_ERR_CALLBACK (the
/// call completes).
pub type skv_free_aux_fn = Option<unsafe extern "C" fn(user_data: *mut c_void, aux: i64) -> c_int>;

/// skv_pool_ops.free_kv_segment: returns the `n` KV slot indices at `indices` (readable only
/// during the call), those of positions [first_pos, first_pos + n) of row `row`, to the pools
/// `pools` names (SKV_POOL_FULL, SKV_POOL_SWA or SKV_POOL_BOTH). `user_data` is the pointer
/// given to skv_cache_new_external. Returns 0, or non-zero for SKV_ERR_CALLBACK (the call
/// completes).
pub type skv_free_kv_segment_fn = Option<
    unsafe extern "C" fn(
        user_data: *mut c_void,
        row: i32,
        first_pos: u32,
        indices: *const i32,
        n: usize,
        pools: u32,
    ) -> c_int,
>;

/// skv_pool_ops.free_kv_segment's `pools`: the full-attention pool only (the window already
/// gave the SWA slots back).
pub const SKV_POOL_FULL: u32 = 0x1;
/// The sliding-window pool only (a window step, skv_swa_evict).
pub const SKV_POOL_SWA: u32 = 0x2;
/// Both pools (every position the window has not passed).
pub const SKV_POOL_BOTH: u32 = SKV_POOL_FULL | SKV_POOL_SWA;

/// The engine's pools (external mode). A callback returning non-zero fails the call with
/// SKV_ERR_CALLBACK. Callbacks run on the thread that called libskv, while the handle is
/// locked; they must not throw, nor call libskv with a handle (see "Callbacks" at the top;
/// docs/external-mode.md#what-a-callback-may-call).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct skv_pool_ops {
    /// sizeof(skv_pool_ops) of the header the caller was built with: 48 in ABI 1 and 2, 56
    /// from ABI 3 (free_kv_segment). Accepted from 48 up; see "Versioned structs" at the top
    /// of this header.
    pub struct_size: u32,
    /// Copy req_to_token[row, start:end) into out (end-start int32 values). Required.
    pub read_row: skv_read_row_fn,
    /// Return these KV slot indices to the engine's allocator (a paged allocator frees the
    /// pages they fall in). Required unless free_kv_segment is set, which then takes every
    /// KV free.
    pub free_kv: skv_free_kv_fn,
    /// Return a req_to_token row to the engine's row pool. Required.
    pub free_row: skv_free_row_fn,
    /// Drop the prefix-tree lock a session inherited from its first request; may be NULL.
    pub dec_lock_ref: skv_dec_lock_ref_fn,
    /// Free one engine auxiliary-state handle (e.g. a mamba pool slot); may be NULL. A release
    /// calls it once per handle that is not -1: `aux_state`, then `aux_track[0]`, then
    /// `aux_track[1]` (docs/recurrent-state.md).
    pub free_aux: skv_free_aux_fn,
    /// Positional free for hybrid (full + sliding-window) pools: return the slots `indices`
    /// (n of them) of row positions [first_pos, first_pos + n) of `row` to the pools named by
    /// `pools`. Set, it takes every KV free, split at the row's SWA cursor as sglang's
    /// free_kv_row_segments splits it; NULL: free_kv takes every free whole and skv_swa_evict
    /// is SKV_ERR_UNSUPPORTED (docs/hybrid.md#the-callback).
    pub free_kv_segment: skv_free_kv_segment_fn,
}

/// Every published sizeof(skv_pool_ops), oldest first; the last is this library's
/// (`read_versioned`).
pub(crate) const POOL_OPS_SIZES: [u32; 2] = [48, POOL_OPS_SIZE_SEGMENTS];
/// The first size holding free_kv_segment: a caller built with it knows about hybrid frees.
pub(crate) const POOL_OPS_SIZE_SEGMENTS: u32 = 56;
const _: () = assert!(std::mem::size_of::<skv_pool_ops>() as u32 == POOL_OPS_SIZES[1]);

/// The engine's pools, reached through `skv_pool_ops`.
pub(crate) struct ExternalPool {
    ops: skv_pool_ops,
    user_data: *mut c_void,
    ps: u32,
    /// The indices read for the call in progress, every position of every range, in effect
    /// order.
    staging: Vec<i32>,
    /// `SKV_FLAG_PAGE_FREES`: each free hands one index per page (the page's first position).
    page_frees: bool,
    /// With page frees, the page-start indices of the piece being handed (kept to reuse the
    /// allocation).
    page_starts: Vec<i32>,
}

// SAFETY: the engine promises its callbacks (and user_data, which only they use) may run on
// whichever thread calls libskv; the handle's lock keeps the calls one at a time.
unsafe impl Send for ExternalPool {}

impl ExternalPool {
    pub(crate) fn new(ops: skv_pool_ops, user_data: *mut c_void, ps: u32, page_frees: bool) -> ExternalPool {
        ExternalPool { ops, user_data, ps, staging: Vec::new(), page_frees, page_starts: Vec::new() }
    }

    /// Checks a row free against what the callbacks can express, before anything is read.
    fn check_split(&self, row: u32, start: u32, end: u32, dead_lo: u32, dead_hi: u32) -> Result<()> {
        let pieces = split(start, end, dead_lo, dead_hi);
        let dead = pieces.iter().any(|p| p.pools == Pools::Full);
        if !dead {
            return Ok(());
        }
        if self.ops.free_kv_segment.is_none() {
            // ABI 2 callers hand every free to free_kv whole, as they always did.
            if self.ops.struct_size < POOL_OPS_SIZE_SEGMENTS {
                return Ok(());
            }
            return Err(Error::Unsupported(format!(
                "row {row} positions [{}, {}) already gave their SWA slots back (swa_dead_lo {dead_lo}, \
                 swa_evicted_seqlen {dead_hi}), but ops->free_kv_segment is NULL: free_kv cannot \
                 free the full side alone; nothing was changed",
                dead_lo.max(start),
                dead_hi.min(end)
            )));
        }
        if pieces.len() > 1 && !dead_hi.is_multiple_of(self.ps) {
            return Err(Error::InvalidArg(format!(
                "swa_evicted_seqlen {dead_hi} splits a page (page_size {}) of row {row}: the SWA cursor \
                 must stay page-aligned",
                self.ps
            )));
        }
        Ok(())
    }

    /// Reads `row[start, end)` into the staging buffer.
    fn stage(&mut self, row: u32, start: u32, end: u32) -> Result<()> {
        let read_row = self.ops.read_row.expect("checked at creation");
        let at = self.staging.len();
        let n = (end - start) as usize;
        if self.staging.try_reserve(n).is_err() {
            return Err(Error::OutOfMemory(format!("cannot stage {n} indices of row {row}")));
        }
        self.staging.resize(at + n, -1);
        // SAFETY: the engine's read_row (checked non-NULL at creation) writes end - start values,
        // for which the staging space has just been resized.
        let rc = unsafe { read_row(self.user_data, row as i32, start, end, self.staging[at..].as_mut_ptr()) };
        if rc != 0 {
            return Err(Error::Callback(format!(
                "read_row(row {row}, [{start}, {end})) returned {rc}; nothing was changed"
            )));
        }
        Ok(())
    }

    /// Hands one staged row range back (positions `start..` of `row`), split by pools when
    /// free_kv_segment is set; returns how many indices the engine received.
    fn free_range(
        &mut self,
        row: u32,
        start: u32,
        idx: &[i32],
        dead: Option<(u32, u32)>,
        failures: &mut Vec<String>,
    ) -> usize {
        let ud = self.user_data;
        let end = start + idx.len() as u32;
        let Some(seg) = self.ops.free_kv_segment else {
            let free_kv = self.ops.free_kv.expect("checked at creation");
            return self.hand(start, idx, |piece| {
                // SAFETY: the engine's free_kv reads piece.len() values at piece, which lives
                // until the call returns.
                let rc = unsafe { free_kv(ud, piece.as_ptr(), piece.len()) };
                if rc != 0 {
                    failures.push(format!("free_kv({} indices of row {row}) returned {rc}", piece.len()));
                }
            });
        };
        let pieces = match dead {
            Some((lo, hi)) => split(start, end, lo, hi),
            None => smallvec::smallvec![Segment { start, end, pools: Pools::Swa }],
        };
        let mut handed = 0;
        for p in pieces {
            let piece = &idx[(p.start - start) as usize..(p.end - start) as usize];
            let pools = match p.pools {
                Pools::Full => SKV_POOL_FULL,
                Pools::Swa => SKV_POOL_SWA,
                Pools::Both => SKV_POOL_BOTH,
            };
            handed += self.hand(p.start, piece, |piece| {
                // SAFETY: the engine's free_kv_segment reads piece.len() values at piece, which
                // lives until the call returns.
                let rc = unsafe { seg(ud, row as i32, p.start, piece.as_ptr(), piece.len(), pools) };
                if rc != 0 {
                    failures.push(format!(
                        "free_kv_segment(row {row}, [{}, {}), pools {pools}) returned {rc}",
                        p.start, p.end
                    ));
                }
            });
        }
        handed
    }

    /// Calls `free` with the indices of positions `start..` (every one, or with page frees the
    /// one at each page's first position); never with an empty list. Returns how many it got.
    fn hand(&mut self, start: u32, idx: &[i32], free: impl FnOnce(&[i32])) -> usize {
        if !self.page_frees {
            free(idx);
            return idx.len();
        }
        let end = start + idx.len() as u32;
        let first = crate::core::ceil_align(start, self.ps).min(end as u64) as u32;
        let pages = &mut self.page_starts;
        pages.clear();
        pages.extend((first..end).step_by(self.ps as usize).map(|p| idx[(p - start) as usize]));
        // A range of only a page's tail has no page start: its page is not freed.
        if !pages.is_empty() {
            free(pages);
        }
        pages.len()
    }
}

impl Pool for ExternalPool {
    fn read_row(&mut self, row: u32, start: u32, end: u32, out: &mut [i32]) -> Result<()> {
        let read_row = self.ops.read_row.expect("checked at creation");
        debug_assert_eq!(out.len(), (end - start) as usize, "the caller sized out");
        let _scope = CallbackScope::enter();
        // SAFETY: the engine's read_row (checked non-NULL at creation) writes end - start values
        // into out, which holds that many.
        let rc = unsafe { read_row(self.user_data, row as i32, start, end, out.as_mut_ptr()) };
        if rc != 0 {
            return Err(Error::Callback(format!(
                "read_row(row {row}, [{start}, {end})) returned {rc}; nothing was changed"
            )));
        }
        Ok(())
    }

    fn prepare(&mut self, effects: &[Effect]) -> Result<()> {
        for e in effects {
            if let Effect::FreeKv { row, start, end, dead_lo, dead_hi, .. } = *e {
                self.check_split(row, start, end, dead_lo, dead_hi)?;
            }
        }
        self.staging.clear();
        let _scope = CallbackScope::enter();
        for e in effects {
            match *e {
                Effect::FreeKv { row, start, end, .. } | Effect::FreeSwa { row, start, end } if start < end => {
                    self.stage(row, start, end)?
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn apply(&mut self, effects: &[Effect]) -> Result<()> {
        let ud = self.user_data;
        let _scope = CallbackScope::enter();
        let mut failures = Vec::new();
        let (mut at, mut handed) = (0usize, 0usize);
        // Taken out for the loop, so handing a range back may use the pool's other buffers.
        let staging = std::mem::take(&mut self.staging);
        for e in effects {
            let rc = match *e {
                Effect::DecLockRef { node, receipt } => match self.ops.dec_lock_ref {
                    // SAFETY: the engine's callback, callable while the handle lives.
                    Some(f) => unsafe { f(ud, node, receipt) },
                    None => continue,
                },
                Effect::FreeKv { row, start, end, .. } | Effect::FreeSwa { row, start, end } => {
                    if start >= end {
                        continue;
                    }
                    let idx = &staging[at..at + (end - start) as usize];
                    at += idx.len();
                    let dead = match *e {
                        Effect::FreeKv { dead_lo, dead_hi, .. } => Some((dead_lo, dead_hi)),
                        _ => None,
                    };
                    handed += self.free_range(row, start, idx, dead, &mut failures);
                    continue;
                }
                Effect::FreeRow { row } => {
                    let free_row = self.ops.free_row.expect("checked at creation");
                    // SAFETY: the engine's callback (checked non-NULL at creation).
                    unsafe { free_row(ud, row as i32) }
                }
                Effect::FreeAux { aux } => match self.ops.free_aux {
                    // SAFETY: the engine's callback, callable while the handle lives.
                    Some(f) => unsafe { f(ud, aux) },
                    None => continue,
                },
            };
            if rc != 0 {
                failures.push(format!("{} returned {rc}", describe(e)));
            }
        }
        self.staging = staging;
        if failures.is_empty() {
            Ok(())
        } else {
            Err(Error::Callback(format!(
                "{}; {handed} indices were handed back and libskv's state advanced as if the call succeeded",
                failures.join(", ")
            )))
        }
    }

    /// Without free_kv_segment (an ABI 3 caller's ops: ABI 2 callers hand every free to
    /// free_kv whole), positions the window freed could only go back through free_kv, which
    /// frees their SWA slots a second time: the row could never be released.
    ///
    /// With free_kv_segment, a free splits at the cursor, which must then be a page boundary
    /// (as sglang asserts): a slot keeping a cursor inside a page could never be released.
    fn check_cursor(&self, req: &Req) -> Result<()> {
        let dead_lo = req.swa_dead_lo(self.ps);
        if req.swa_evicted_seqlen <= dead_lo || self.ops.struct_size < POOL_OPS_SIZE_SEGMENTS {
            return Ok(());
        }
        if self.ops.free_kv_segment.is_some() {
            if req.swa_evicted_seqlen.is_multiple_of(self.ps) {
                return Ok(());
            }
            return Err(Error::InvalidArg(format!(
                "swa_evicted_seqlen {} is not a multiple of page_size {}: past swa_dead_lo {dead_lo} the \
                 row's frees split at the cursor, which must be a page boundary",
                req.swa_evicted_seqlen, self.ps
            )));
        }
        Err(Error::InvalidArg(format!(
            "swa_evicted_seqlen {} > swa_dead_lo {dead_lo}: the window freed positions [{dead_lo}, {}), but \
             ops->free_kv_segment is NULL, so libskv could never free this row's full side alone",
            req.swa_evicted_seqlen, req.swa_evicted_seqlen
        )))
    }

    fn frees_swa(&self) -> std::result::Result<(), String> {
        match self.ops.free_kv_segment {
            Some(_) => Ok(()),
            None => Err("ops->free_kv_segment is NULL: free_kv cannot free the SWA side alone".into()),
        }
    }
}

/// An effect as the callback it became, for error messages (KV frees name themselves).
fn describe(e: &Effect) -> String {
    match *e {
        Effect::DecLockRef { node, receipt } => format!("dec_lock_ref({node}, {receipt})"),
        Effect::FreeKv { row, .. } | Effect::FreeSwa { row, .. } => format!("a free of row {row}"),
        Effect::FreeRow { row } => format!("free_row({row})"),
        Effect::FreeAux { aux } => format!("free_aux({aux})"),
    }
}
