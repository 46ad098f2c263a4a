//! Pins: the rows whose pages an open ticket's copy reads or writes, and the pages freed from
//! them while it runs. Such a page is *draining*: it goes back on its free stack only when the
//! ticket completes, since a copy still queued on the device would otherwise read (or write) a
//! page the next forward pass may already own.

use std::collections::{BTreeMap, HashMap};

use foldhash::fast::RandomState;

use super::pool::Effect;

/// Pinned rows and their tickets' drained pages (owned mode's; external mode keeps only the
/// rows, and refuses a free of one: the engine owns its free list).
#[derive(Default)]
pub(crate) struct Pins {
    by_row: HashMap<u32, u64, RandomState>,
    pub(crate) drains: BTreeMap<u64, Drain>,
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
