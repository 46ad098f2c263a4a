//! The engine's checks on libskv: the periodic audit, the slot counts against the engine's
//! own mirror, and the end-of-run accounting of every page, row, prefix-tree lock and
//! recurrent-state handle.

use super::mamba::real;
use super::{expect_ok, unexpected, Engine, Fault};

impl Engine<'_> {
    /// skv_cache_check, plus libskv's slot counts against the engine's own, on every
    /// instance (and in a multi-instance run the router's view against every instance).
    pub(super) fn audit(&mut self) -> Result<(), Fault> {
        self.m.audits += 1;
        for k in 0..self.inst.len() {
            self.cur = k;
            self.audit_instance()?;
        }
        #[cfg(feature = "router")]
        if self.fleet.is_some() {
            self.audit_router()?;
        }
        Ok(())
    }

    fn audit_instance(&mut self) -> Result<(), Fault> {
        let k = self.cur;
        let r = self.inst[k].cache.check().map_err(|s| unexpected("skv_cache_check", s))?;
        if r.violations > 0 {
            self.m.violations += r.violations;
            self.m.first_violation = r.first_violation_text();
            return Err(format!("audit: {} violations, first: {}", r.violations, self.m.first_violation));
        }
        let active: Vec<i32> = self
            .open
            .iter()
            .filter_map(|s| s.turn.as_ref())
            .filter(|t| t.inst == k)
            .map(|t| t.req.req_pool_idx)
            .filter(|&r| r >= 0)
            .collect();
        let held = self.inst[k].cache.held(&active).map_err(|s| unexpected("skv_session_held", s))?;
        // A busy branch's slot is in flight on the instance its turn runs on, its own.
        let slot_on = |_: &super::Session, _: usize, br: &super::Branch| br.has_slot && br.inst == k;
        let slots = self
            .open
            .iter()
            .map(|s| s.branches.iter().enumerate().filter(|&(b, br)| slot_on(s, b, br)).count() as u64)
            .sum::<u64>();
        let idle = self
            .open
            .iter()
            .map(|s| {
                s.branches.iter().enumerate().filter(|&(b, br)| slot_on(s, b, br) && s.busy != Some(b)).count() as u64
            })
            .sum::<u64>();
        // sglang's session_held_mamba_slots: every real handle of an idle slot.
        let handles = self
            .open
            .iter()
            .flat_map(|s| s.branches.iter().enumerate().filter(move |&(b, br)| slot_on(s, b, br) && s.busy != Some(b)))
            .map(|(_, br)| real(br.handles).count() as u64)
            .sum::<u64>();
        // Imports in flight (`--migrate`) are idle slots here already.
        #[cfg(feature = "router")]
        let (slots, idle, handles) = {
            let (s, h) = self.moves_into(k);
            (slots + s, idle + s, handles + h)
        };
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
    /// every page and row of every instance must be free and every lock returned.
    pub(super) fn close_out(&mut self) -> Result<(), Fault> {
        self.audit()?;
        for k in 0..self.inst.len() {
            self.cur = k;
            self.free_shared()?;
        }
        self.audit()?;
        for k in 0..self.inst.len() {
            self.cur = k;
            let st = self.inst[k].cache.stats().map_err(|s| unexpected("skv_cache_stats", s))?;
            self.m.trimmed_tokens += st.trimmed_tokens;
            self.m.tail_freed_tokens += st.tail_freed_tokens;
            self.m.leaked_pages += (st.total_pages - 1).saturating_sub(st.free_pages);
            // Every SWA page back too: the window's, the frees', the shared prefix's.
            self.m.leaked_swa_pages += st.swa_used_pages.max(st.swa_total_pages.saturating_sub(1 + st.swa_free_pages));
            self.m.leaked_rows += (st.total_rows - st.free_rows) as u64;
            self.m.locks_returned += self.inst[k].cache.hooks.locks.returned.get();
        }
        self.mamba_close_out()?;
        if self.m.leaked_pages > 0 || self.m.leaked_swa_pages > 0 || self.m.leaked_rows > 0 {
            return Err(format!(
                "leak after every session closed: {} pages, {} SWA pages, {} rows",
                self.m.leaked_pages, self.m.leaked_swa_pages, self.m.leaked_rows
            ));
        }
        for inst in &self.inst {
            let l = &inst.cache.hooks.locks;
            let want_sum = (1..=inst.receipts).fold(0u64, |s, r| s.wrapping_add(r));
            if l.returned.get() != inst.locks_taken || l.receipt_sum.get() != want_sum || l.wrong_node.get() > 0 {
                return Err(format!(
                    "prefix-tree locks: {} taken, {} returned ({} for a wrong node, receipts {})",
                    inst.locks_taken,
                    l.returned.get(),
                    l.wrong_node.get(),
                    if l.receipt_sum.get() == want_sum { "match" } else { "differ" }
                ));
            }
        }
        Ok(())
    }

    /// The current instance holds no session slot; its shared prompt's pages are mapped by no
    /// row and go back to the pool.
    pub(super) fn free_shared(&mut self) -> Result<(), Fault> {
        let k = self.cur;
        let st = self.inst[k].cache.stats().map_err(|s| unexpected("skv_cache_stats", s))?;
        if st.sessions != 0 {
            return Err(format!("{} session slots left after every session closed", st.sessions));
        }
        if !self.inst[k].shared.is_empty() {
            let ps = self.cfg.args.page_size as usize;
            let firsts: Vec<i32> = self.inst[k].shared.iter().step_by(ps).copied().collect();
            let refs = self.inst[k].cache.page_refs(&firsts).map_err(|s| unexpected("skv_page_refs", s))?;
            if refs.iter().any(|&r| r != 0) {
                return Err(format!("shared prefix pages still mapped by rows: {refs:?}"));
            }
            let shared = std::mem::take(&mut self.inst[k].shared);
            expect_ok("skv_pool_free(shared prefix)", self.inst[k].cache.pool_free(&shared))?;
        }
        Ok(())
    }
}
