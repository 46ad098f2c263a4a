//! The checks of the per-step calls (extend, commit). Each check runs on one of two paths: the
//! fast path (`fast_*`) tests every rule at once, one compare each, and only answers whether
//! the request is fine; the slow path (`*_slow`) runs the checks one by one in the documented
//! order of errors, names the first that fails, and handles every case. A call takes the slow
//! path only when the fast one says no.

use super::cache::Cache;
use super::error::{bail, Result};
use super::owned::{OwnedPool, Row, RowRecord};
use super::req::{Config, Req};
use super::row_meta::RowMeta;

impl Cache {
    /// The checks `alloc_extend(req, n)` runs: the row, and the length it will map.
    #[inline(always)]
    pub(super) fn check_extend(&self, cfg: &Config, pool: &OwnedPool, req: &Req, n: u32) -> Result<(u32, u32)> {
        let new_len = req.kv_allocated_len as u64 + n as u64;
        match fast_row(cfg, pool, req, new_len <= cfg.max_context_len as u64) {
            Some(row) => Ok((row, new_len as u32)),
            None => self.check_extend_slow(pool, req, n),
        }
    }

    /// The checks `commit(req, n)` runs: the row, and the committed length after it.
    #[inline(always)]
    pub(super) fn check_commit(&self, cfg: &Config, pool: &OwnedPool, req: &Req, n: u32) -> Result<(u32, u32)> {
        let committed = req.kv_committed_len as u64 + n as u64;
        match fast_row(cfg, pool, req, committed <= req.kv_allocated_len as u64) {
            Some(row) => Ok((row, committed as u32)),
            None => self.check_commit_slow(pool, req, n),
        }
    }

    /// `check_extend`'s slow path.
    #[inline(never)]
    fn check_extend_slow(&self, pool: &OwnedPool, req: &Req, n: u32) -> Result<(u32, u32)> {
        req.validate(&self.cfg)?;
        let row = req.require_row()?;
        let max = self.cfg.max_context_len;
        let new_len = match req.kv_allocated_len.checked_add(n) {
            Some(l) if l <= max => l,
            _ => bail!(InvalidArg, "kv_allocated_len {} + n_tokens {n} > max_context_len {max}", req.kv_allocated_len),
        };
        self.check_record_in(Some(pool), req)?;
        self.guard_idle_session_row(row)?;
        Ok((row, new_len))
    }

    /// `check_commit`'s slow path.
    #[inline(never)]
    fn check_commit_slow(&self, pool: &OwnedPool, req: &Req, n: u32) -> Result<(u32, u32)> {
        req.validate(&self.cfg)?;
        let row = req.require_row()?;
        let committed = match req.kv_committed_len.checked_add(n) {
            Some(c) if c <= req.kv_allocated_len => c,
            _ => bail!(
                InvalidArg,
                "kv_committed_len {} + n_tokens {n} > kv_allocated_len {}",
                req.kv_committed_len,
                req.kv_allocated_len
            ),
        };
        self.check_record_in(Some(pool), req)?;
        self.guard_idle_session_row(row)?;
        Ok((row, committed))
    }
}

/// `req`'s row, when `req` passes every check of an extend or a commit, `fits` being the
/// call's own (the new length): all of them at once, for the rule that a request is fine.
/// `None` when any fails, or the answer needs more than one compare each: the slow path then
/// runs the checks in their documented order, which also says what is wrong. `cfg` is the caller's copy: a batch
/// keeps it in registers, where the cache's own would be read again after every mark.
#[inline(always)]
pub(super) fn fast_row(cfg: &Config, pool: &OwnedPool, req: &Req, fits: bool) -> Option<u32> {
    let row = u32::try_from(req.req_pool_idx).ok()?;
    let RowRecord { meta, in_use: Some(r) } = pool.rows.get(row as usize)? else { return None };
    let has_swa_pool = pool.swa.is_some();
    (fits && fast_matches(cfg, req, r, meta, has_swa_pool)).then_some(row)
}

/// `fast_row`'s checks of `req` against its row's record (`r` and `meta`, its
/// `RowRecord`; the SWA cursor too when there is an SWA pool, `has_swa_pool`), the call's own aside:
/// the one statement of the rule that a request is fine, for the calls that look the records
/// up themselves. (Finding the records, and the protected length equal to the row's, make
/// `fast_valid`'s row and alignment checks hold: `fast_valid_lengths` does the rest.)
#[inline(always)]
pub(super) fn fast_matches(cfg: &Config, req: &Req, r: &Row, meta: &RowMeta, has_swa_pool: bool) -> bool {
    req.fast_valid_lengths(cfg)
        && (req.row_generation == 0 || req.row_generation == meta.generation)
        && req.kv_allocated_len == r.len
        && req.cache_protected_len == r.protected
        && (!has_swa_pool || r.swa_cursor == req.swa_evicted_seqlen)
        && !meta.idle_slot
}
