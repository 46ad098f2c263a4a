//! The owned pool's side of the host tier: pinned rows whose frees drain (`Pins`), and new
//! pages for a parked slot's row, put back exactly as they were taken when the copy cannot be
//! asked for.

use super::alloc::reserve_pages;
use super::error::{bail, Result};
use super::owned::OwnedPool;
use super::pool::Effect;

/// What `undo_restore` needs: the row's page count before, and its SWA passed run.
pub(crate) struct Undo {
    keep: usize,
    passed: (u32, u32),
    swa_taken: Vec<u32>,
}

impl OwnedPool {
    /// Maps `live.len()` new pages at the end of `row`, and an SWA page beside each whose
    /// `live` is true (the rest the window had passed: 0, in the passed run); all or nothing.
    /// The row's length is the caller's to set.
    pub(crate) fn restore_pages(&mut self, row: u32, n: u32, live: &[bool]) -> Result<Undo> {
        let n_swa = live.iter().filter(|&&l| l).count();
        if let Some(s) = self.swa.as_ref() {
            s.check_room(n_swa as u64)?;
        }
        let r = self.rows[row as usize].in_use.as_mut().expect("a parked slot's row");
        let keep = r.pages.len();
        r.pages.edit(|v| self.pages.alloc(n, v))?;
        let Some(s) = self.swa.as_mut() else {
            return Ok(Undo { keep, passed: (0, 0), swa_taken: Vec::new() });
        };
        let sr = &mut s.rows[row as usize];
        let passed = sr.passed;
        if !reserve_pages(&mut sr.ids, n as usize) {
            self.pages.unalloc(&r.pages[keep..]);
            r.pages.edit(|v| v.truncate(keep));
            bail!(OutOfMemory, "no host memory for a list of {n} more SWA pages");
        }
        let mut taken = Vec::with_capacity(n_swa);
        s.alloc.alloc(n_swa as u32, &mut taken);
        let mut next = taken.iter();
        sr.ids.truncate(keep);
        sr.ids.extend(live.iter().map(|&l| if l { *next.next().expect("counted") } else { 0 }));
        // The window's passed pages form one run: its entries are 0, so `pass` frees nothing.
        if let (Some(lo), Some(hi)) = (live.iter().position(|&l| !l), live.iter().rposition(|&l| !l)) {
            sr.pass(&mut s.alloc, (keep + lo) as u32, (keep + hi + 1) as u32);
        }
        Ok(Undo { keep, passed, swa_taken: taken })
    }

    /// Orders the pages past `keep` that `restore_pages` just mapped ascending (the full ids,
    /// then the SWA ids among themselves), so that a transfer into them coalesces: a LIFO stack
    /// hands a run a release freed back in descending order.
    pub(crate) fn ascend_from(&mut self, row: u32, keep: usize) {
        let r = self.rows[row as usize].in_use.as_mut().expect("row in use");
        r.pages.edit(|v| ascend(&mut v[keep..]));
        if let Some(s) = self.swa.as_mut() {
            let ids = &mut s.rows[row as usize].ids[keep..];
            let mut taken: Vec<u32> = ids.iter().copied().filter(|&p| p != 0).collect();
            ascend(&mut taken);
            for (slot, p) in ids.iter_mut().filter(|p| **p != 0).zip(taken) {
                *slot = p;
            }
        }
    }

    /// Takes back what `restore_pages` mapped: both free stacks are as before it.
    pub(crate) fn undo_restore(&mut self, row: u32, undo: Undo) {
        let r = self.rows[row as usize].in_use.as_mut().expect("row in use");
        self.pages.unalloc(&r.pages[undo.keep..]);
        r.pages.edit(|v| v.truncate(undo.keep));
        if let Some(s) = self.swa.as_mut() {
            s.alloc.unalloc(&undo.swa_taken);
            let sr = &mut s.rows[row as usize];
            sr.ids.truncate(undo.keep);
            sr.passed = undo.passed;
        }
    }
}

impl OwnedPool {
    /// Pins `row` for `ticket` (one ticket a row: the caller checked none holds it).
    pub(crate) fn pin_row(&mut self, row: u32, ticket: u64) {
        self.pins.pin(row, ticket);
        self.rows[row as usize].meta.pinned = true;
    }

    /// Ends `row`'s pin, if `ticket` holds it.
    pub(crate) fn unpin_row(&mut self, row: u32, ticket: u64) {
        if self.pins.ticket_of(row) == Some(ticket) {
            self.pins.unpin(row);
            self.rows[row as usize].meta.pinned = false;
        }
    }

    /// Host memory for the drains `effects` may fill (before anything changes).
    #[cold]
    pub(crate) fn reserve_drains(&mut self, effects: &[Effect]) -> Result<()> {
        for row in effects.iter().filter_map(Effect::freed_row) {
            let Some(t) = self.pins.ticket_of(row) else { continue };
            let n = self.in_use(row).map_or(0, |r| r.pages.len());
            let d = self.pins.drains.entry(t).or_default();
            if d.full.try_reserve(n).is_err() || d.swa.try_reserve(n).is_err() {
                bail!(OutOfMemory, "no host memory to keep row {row}'s {n} draining pages");
            }
        }
        Ok(())
    }

    /// Applies an effect on a pinned row: what it frees goes to the row's ticket's drain. The
    /// pages are freed as usual and taken straight back off the top of their stacks (the
    /// stacks are LIFO), so a drain returns them later exactly as the free would have.
    #[cold]
    #[inline(never)]
    pub(crate) fn apply_pinned(&mut self, e: &Effect) {
        let row = e.freed_row().expect("a pinned effect names a row");
        let t = self.pins.ticket_of(row).expect("the row is pinned");
        let swa_free = |p: &Self| p.swa.as_ref().map_or(0, |s| s.alloc.free_pages());
        let (full0, swa0) = (self.pages.free_pages(), swa_free(self));
        match *e {
            Effect::FreeKv { row, keep, .. } => self.truncate(row, keep),
            Effect::FreeSwa { row, start, end } => self.free_swa(row, start, end),
            Effect::FreeRow { row } => self.free_row(row),
            Effect::DecLockRef { .. } | Effect::FreeAux { .. } => unreachable!("names no row"),
        }
        let (nf, ns) = (self.pages.free_pages() - full0, swa_free(self) - swa0);
        let d = self.pins.drains.entry(t).or_default();
        let at = d.full.len();
        self.pages.alloc(nf, &mut d.full).expect("the pages were just freed, the room reserved");
        d.full[at..].reverse();
        if let Some(s) = self.swa.as_mut() {
            let at = d.swa.len();
            s.alloc.alloc(ns, &mut d.swa);
            d.swa[at..].reverse();
        }
        if matches!(e, Effect::FreeRow { .. }) {
            self.unpin_row(row, t);
        }
    }

    /// A completed ticket's drained pages go back on their free stacks, in the order they
    /// were freed, and its rows are unpinned.
    pub(crate) fn return_drain(&mut self, ticket: u64, rows: &[u32]) {
        for &row in rows {
            self.unpin_row(row, ticket);
        }
        let Some(d) = self.pins.drains.remove(&ticket) else { return };
        self.pages.free_owned(&d.full);
        if let Some(s) = self.swa.as_mut() {
            s.alloc.free_dropped(&d.swa);
        }
    }
}

/// Sorts `ids` ascending; a run the LIFO stack handed back (descending) is only reversed.
fn ascend(ids: &mut [u32]) {
    if ids.is_sorted() {
        return;
    }
    match ids.is_sorted_by(|a, b| a >= b) {
        true => ids.reverse(),
        false => ids.sort_unstable(),
    }
}
