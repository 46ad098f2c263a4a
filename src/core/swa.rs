//! Sliding-window eviction: as a request decodes past its window, the SWA slots behind the
//! window go back to the SWA pool while the full-attention layers keep theirs. The rule is
//! sglang's `free_swa_out_of_window_slots`, step for step.

use super::cache::Cache;
use super::error::{bail, Result};
use super::page::ceil_align;
use super::pool::Effect;
use super::req::{swa_dead, swa_dead_lo, Req};

/// How a window step is taken (the arguments of `free_swa_out_of_window_slots`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// Tokens of sliding window the layers attend to, >= 1.
    pub size: u32,
    /// The cursor moves only once it lags `pre_len - size` by at least this many tokens.
    pub eviction_interval: u32,
    /// The engine shares prefixes (a radix tree): keep whole pages of window, at least one.
    pub prefix_sharing: bool,
    /// Never evict past this position (a checkpoint the engine still matches on); only
    /// honoured with prefix sharing, as sglang does.
    pub retain_floor: Option<u32>,
}

/// The cursor move of one window step: `Some((from, to))` frees the SWA side of
/// `[from, to)` (empty when `from == to`, where only the cursor is raised to `swa_dead_lo`);
/// `None` leaves the req as it is.
fn window_step(req: &Req, pre_len: u32, w: &Window, ps: u32) -> Option<(u32, u32)> {
    let (pre, size) = (pre_len as i64, w.size as i64);
    if pre - size < req.swa_evicted_seqlen as i64 + w.eviction_interval as i64 {
        return None;
    }
    let evicted = req.swa_evicted_seqlen.max(req.swa_dead_lo(ps));
    let mut threshold = if w.prefix_sharing {
        // A key ending at floor_align(pre_len) keeps a full window of live SWA, and the last
        // leaf is never all tombstone.
        pre - ceil_align(w.size.max(ps), ps) as i64
    } else {
        pre - size
    };
    if let (Some(f), true) = (w.retain_floor, w.prefix_sharing) {
        threshold = threshold.min(f as i64);
    }
    let mut next = threshold.max(evicted as i64);
    if ps > 1 {
        next = next.div_euclid(ps as i64) * ps as i64;
    }
    // `next` lies in [0, pre_len]: a threshold past `evicted` is below `pre_len`.
    let next = next as u32;
    Some((evicted, next.max(evicted)))
}

impl Cache {
    /// A window step needs a pool that frees the SWA side alone. Like an owned-mode call on an
    /// external handle, the handle's kind decides before the arguments do.
    pub fn require_swa_free(&self) -> Result<()> {
        match self.pool.frees_swa() {
            Ok(()) => Ok(()),
            Err(why) => bail!(Unsupported, "{why}"),
        }
    }

    /// A running session's slot records which positions the window freed (`[swa_dead_lo,
    /// swa)`). A req whose floor lifts `swa_dead_lo` into them would make them read as live,
    /// and a later free would hand their SWA slots back a second time.
    pub(crate) fn check_floor(&self, req: &Req) -> Result<()> {
        let Some(row) = req.row() else { return Ok(()) };
        let Some(s) = self.slots.of_row(row).filter(|s| s.in_flight) else { return Ok(()) };
        let ps = self.cfg.page_size;
        let (lo, hi) = swa_dead(s.protected, s.swa_floor, s.swa, ps);
        let lifted = swa_dead_lo(s.protected, req.swa_evict_floor, ps);
        if hi > lo && lifted > lo {
            bail!(
                InvalidArg,
                "swa_evict_floor {} lifts swa_dead_lo from {lo} to {lifted}, over positions [{lo}, {}) whose \
                 SWA slots the window already freed: a floor rises only before the window moves",
                req.swa_evict_floor,
                hi.min(lifted)
            );
        }
        Ok(())
    }

    /// `swa_evict(req, pre_len, window)`: one window step of a running request; returns the
    /// positions whose SWA slots went back.
    pub fn swa_evict(&mut self, req: &mut Req, pre_len: u32, w: &Window) -> Result<u32> {
        self.require_swa_free()?;
        req.validate(&self.cfg)?;
        if w.size == 0 {
            bail!(InvalidArg, "window 0: a sliding window is at least 1 token");
        }
        if pre_len > req.kv_allocated_len {
            bail!(InvalidArg, "pre_len {pre_len} > kv_allocated_len {}", req.kv_allocated_len);
        }
        let Some(row) = req.row() else { return Ok(0) };
        self.check_record(req)?;
        self.check_floor(req)?;
        self.guard_idle_session_row(row)?;
        let Some((from, to)) = window_step(req, pre_len, w, self.cfg.page_size) else { return Ok(0) };
        if to > from && !from.is_multiple_of(self.cfg.page_size) {
            // sglang's free_swa_segment asserts the same: the SWA pool frees whole pages.
            bail!(
                InvalidArg,
                "swa_evicted_seqlen {from} is not a multiple of page_size {}: the window frees whole pages",
                self.cfg.page_size
            );
        }
        self.effects.clear();
        if to > from {
            self.effects.push(Effect::FreeSwa { row, start: from, end: to });
        }
        self.run_effects(|c| {
            req.swa_evicted_seqlen = to;
            c.mirror_cursor(row, req);
        })?;
        Ok(to - from)
    }
}
