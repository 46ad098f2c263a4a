//! The engine's checks on libskv: the periodic audit, the slot counts against the engine's
//! own mirror, and the end-of-run accounting of every page, row, prefix-tree lock and
//! recurrent-state handle.

use super::mamba::real;
use super::{expect_ok, unexpected, Engine, Fault};

impl Engine<'_> {
    /// skv_cache_check, plus libskv's slot counts against the engine's own.
    pub(super) fn audit(&mut self) -> Result<(), Fault> {
        self.m.audits += 1;
        let r = self.cache.check().map_err(|s| unexpected("skv_cache_check", s))?;
        if r.violations > 0 {
            self.m.violations += r.violations;
            self.m.first_violation = r.first_violation_text();
            return Err(format!("audit: {} violations, first: {}", r.violations, self.m.first_violation));
        }
        let active: Vec<i32> =
            self.open.iter().filter_map(|s| s.turn.as_ref()).map(|t| t.req.req_pool_idx).filter(|&r| r >= 0).collect();
        let held = self.cache.held(&active).map_err(|s| unexpected("skv_session_held", s))?;
        let slots = self.open.iter().flat_map(|s| s.branches.iter()).filter(|b| b.has_slot).count() as u64;
        let idle = self
            .open
            .iter()
            .map(|s| s.branches.iter().enumerate().filter(|&(b, br)| br.has_slot && s.busy != Some(b)).count() as u64)
            .sum::<u64>();
        // sglang's session_held_mamba_slots: every real handle of an idle slot.
        let handles = self
            .open
            .iter()
            .flat_map(|s| s.branches.iter().enumerate().filter(move |&(b, br)| br.has_slot && s.busy != Some(b)))
            .map(|(_, br)| real(br.handles).count() as u64)
            .sum::<u64>();
        if held.sessions != slots || held.rows != idle || held.aux_handles != handles {
            return Err(format!(
                "skv_session_held: {} slots / {} idle rows / {} handles, the engine expects {slots} / {idle} / {handles}",
                held.sessions, held.rows, held.aux_handles
            ));
        }
        self.m.peak_held_aux_handles = self.m.peak_held_aux_handles.max(held.aux_handles);
        self.m.peak_held_tokens = self.m.peak_held_tokens.max(held.full_tokens);
        self.m.peak_held_swa_tokens = self.m.peak_held_swa_tokens.max(held.swa_tokens);
        self.m.peak_held_rows = self.m.peak_held_rows.max(held.rows);
        Ok(())
    }

    /// After every session closed: the tree's prefix is unreferenced and goes back, then
    /// every page and row must be free and every lock returned.
    pub(super) fn close_out(&mut self) -> Result<(), Fault> {
        self.audit()?;
        let st = self.cache.stats().map_err(|s| unexpected("skv_cache_stats", s))?;
        if st.sessions != 0 {
            return Err(format!("{} session slots left after every session closed", st.sessions));
        }
        if !self.shared.is_empty() {
            let ps = self.cfg.args.page_size as usize;
            let firsts: Vec<i32> = self.shared.iter().step_by(ps).copied().collect();
            let refs = self.cache.page_refs(&firsts).map_err(|s| unexpected("skv_page_refs", s))?;
            if refs.iter().any(|&r| r != 0) {
                return Err(format!("shared prefix pages still mapped by rows: {refs:?}"));
            }
            let shared = std::mem::take(&mut self.shared);
            expect_ok("skv_pool_free(shared prefix)", self.cache.pool_free(&shared))?;
        }
        let st = self.cache.stats().map_err(|s| unexpected("skv_cache_stats", s))?;
        self.m.trimmed_tokens = st.trimmed_tokens;
        self.m.tail_freed_tokens = st.tail_freed_tokens;
        self.m.leaked_pages = (st.total_pages - 1).saturating_sub(st.free_pages);
        // Every SWA page back too: the window's, the frees', the shared prefix's.
        self.m.leaked_swa_pages = st.swa_used_pages.max(st.swa_total_pages.saturating_sub(1 + st.swa_free_pages));
        self.m.leaked_rows = (st.total_rows - st.free_rows) as u64;
        self.audit()?;
        self.mamba_close_out()?;
        let l = &self.cache.hooks.locks;
        self.m.locks_returned = l.returned.get();
        let want_sum = (1..=self.receipts).fold(0u64, |s, r| s.wrapping_add(r));
        if self.m.leaked_pages > 0 || self.m.leaked_swa_pages > 0 || self.m.leaked_rows > 0 {
            return Err(format!(
                "leak after every session closed: {} pages, {} SWA pages, {} rows",
                self.m.leaked_pages, self.m.leaked_swa_pages, self.m.leaked_rows
            ));
        }
        if l.returned.get() != self.m.locks_taken || l.receipt_sum.get() != want_sum || l.wrong_node.get() > 0 {
            return Err(format!(
                "prefix-tree locks: {} taken, {} returned ({} for a wrong node, receipts {})",
                self.m.locks_taken,
                l.returned.get(),
                l.wrong_node.get(),
                if l.receipt_sum.get() == want_sum { "match" } else { "differ" }
            ));
        }
        Ok(())
    }
}
