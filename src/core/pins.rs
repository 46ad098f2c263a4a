//! Pins: the rows whose pages an open ticket's copy reads or writes, and the pages freed from
//! them while it runs. Such a page is *draining*: it goes back on its free stack only when the
//! ticket completes, since a copy still queued on the device would otherwise read (or write) a
//! page the next forward pass may already own.

use std::collections::{BTreeMap, HashMap};

use foldhash::fast::RandomState;

use super::error::{bail, Result};
use super::owned::OwnedPool;
use super::pool::Effect;

/// Pinned rows and their tickets' drained pages (owned mode's; external mode keeps only the
/// rows, and refuses a free of one: the engine owns its free list).
#[derive(Default)]
pub(crate) struct Pins {
    by_row: HashMap<u32, u64, RandomState>,
    drains: BTreeMap<u64, Drain>,
}

/// The pages a ticket's pinned rows freed, in the order they were freed.
#[derive(Default, Debug)]
pub(crate) struct Drain {
    pub(crate) full: Vec<u32>,
    pub(crate) swa: Vec<u32>,
}

impl Pins {
    #[inline(always)]
    pub(crate) fn is_empty(&self) -> bool {
        self.by_row.is_empty()
    }

    pub(crate) fn ticket_of(&self, row: u32) -> Option<u64> {
        self.by_row.get(&row).copied()
    }

    pub(crate) fn pin(&mut self, row: u32, ticket: u64) {
        self.by_row.insert(row, ticket);
    }

    pub(crate) fn unpin(&mut self, row: u32) {
        self.by_row.remove(&row);
    }

    /// Pages draining in each pool.
    pub(crate) fn draining(&self) -> (u64, u64) {
        self.drains.values().fold((0, 0), |(f, s), d| (f + d.full.len() as u64, s + d.swa.len() as u64))
    }

    /// Every draining page, for the audit: `(full, swa)`.
    pub(crate) fn drained_pages(&self) -> impl Iterator<Item = &Drain> + '_ {
        self.drains.values()
    }

    /// The first pinned row whose free `effects` name, with its ticket (external mode
    /// refuses the call).
    pub(crate) fn first_pinned(&self, effects: &[Effect]) -> Option<(u32, u64)> {
        effects.iter().filter_map(Effect::freed_row).find_map(|r| Some((r, self.ticket_of(r)?)))
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
