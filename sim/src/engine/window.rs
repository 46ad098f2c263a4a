//! The hybrid model's sliding window (`--swa-window`): before each decode step every running
//! request takes one window step (`skv_swa_evict`), as sglang's `free_swa_out_of_window_slots`
//! does, and the engine checks each step's cursor and freed positions against the rule, and
//! the SWA pool's free pages against the sum of the step's frees.

use skv::skv_req;

use super::{unexpected, Engine, Fault};

/// The cursor move of one window step with prefix sharing (flags 0) and no retain floor:
/// `Some((from, to))` gives back the SWA side of `[from, to)`; `None` leaves the req as it is.
/// docs/hybrid.md, "The window step".
fn expected_step(r: &skv_req, pre_len: u32, window: u32, interval: u32, ps: u32) -> Option<(u32, u32)> {
    let cursor = r.swa_evicted_seqlen as u64;
    if (pre_len as u64) < window as u64 + cursor + interval as u64 {
        return None;
    }
    let (protected, floor) = (r.cache_protected_len, r.swa_evict_floor);
    let dead_lo = if ps > 1 && floor > protected { floor.div_ceil(ps) * ps } else { protected.max(floor) };
    let from = r.swa_evicted_seqlen.max(dead_lo);
    // Whole pages of window, at least one, so a key ending at a page boundary keeps a full
    // window of live SWA.
    let keep = window.max(ps).div_ceil(ps) * ps;
    let to = pre_len.saturating_sub(keep).max(from) / ps * ps;
    Some((from, to.max(from)))
}

impl Engine<'_> {
    /// One window step per running request; `pre_len` is what the request has committed
    /// before this step's extension (sglang passes the sequence's length).
    pub(super) fn window_steps(&mut self, running: &[usize]) -> Result<(), Fault> {
        let a = &self.cfg.args;
        let (window, interval, ps) = (a.swa_window, a.swa_eviction_interval, a.page_size);
        if window == 0 {
            return Ok(());
        }
        let free_before = self.swa_free_pages()?;
        let mut freed_total = 0u64;
        for &i in running {
            let mut t = self.open[i].turn.take().expect("running");
            let pre_len = t.req.kv_committed_len;
            let want = expected_step(&t.req, pre_len, window, interval, ps);
            let before = t.req.swa_evicted_seqlen;
            // Named only on a fault: a step is a hot call.
            let id = self.open[i].id;
            let what = || format!("skv_swa_evict(session {id}, pre_len {pre_len}, window {window})");
            let freed = self.inst[self.cur]
                .cache
                .swa_evict(&mut t.req, pre_len, window, interval)
                .map_err(|s| unexpected(&what(), s))?;
            let (want_cursor, want_freed) = want.map_or((before, 0), |(from, to)| (to, to - from));
            if t.req.swa_evicted_seqlen != want_cursor || freed != want_freed {
                return Err(format!(
                    "{}: cursor {before} -> {}, {freed} positions freed; expected -> {want_cursor}, {want_freed}",
                    what(),
                    t.req.swa_evicted_seqlen
                ));
            }
            self.m.swa_window_steps += 1;
            freed_total += freed as u64;
            self.open[i].turn = Some(t);
        }
        let pages = self.swa_free_pages()? - free_before;
        // Every step frees from a page boundary, so the pages that came back are exactly the
        // positions over the page size.
        if pages * ps as u64 != freed_total {
            return Err(format!("window steps freed {freed_total} positions but {pages} SWA pages of {ps} came back"));
        }
        self.m.swa_freed_positions += freed_total;
        self.m.swa_freed_pages += pages;
        Ok(())
    }

    /// SWA pages free, and those a ticket's copy still reads (they come back with it).
    fn swa_free_pages(&self) -> Result<u64, Fault> {
        let c = &self.inst[self.cur].cache;
        let free = c.stats().map(|s| s.swa_free_pages).map_err(|s| unexpected("skv_cache_stats", s))?;
        if self.tier.is_empty() {
            return Ok(free);
        }
        let t = c.tier_stats().map_err(|s| unexpected("skv_cache_tier_stats", s))?;
        Ok(free + t.swa_draining_pages)
    }
}
