//! The owned pool's side of a restore: new pages for a parked slot's row, put back exactly
//! as they were taken when the copy cannot be asked for.

use super::alloc::reserve_pages;
use super::error::{bail, Result};
use super::owned::OwnedPool;

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
