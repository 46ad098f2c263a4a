//! Tickets: each names the copies one libskv call asked for (`copy_pages`, or the engine's
//! own for an export or import), numbered 1, 2, 3, ... per handle in the order the calls
//! ran. The engine completes a ticket once its copies ran (`skv_ticket_done`); until then the
//! pages they read or write are pinned (`pins`).

use std::collections::BTreeMap;

use super::error::{bail, Result};

/// What a ticket's copies do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Device pages to host pages: idle sessions written back (a step, a park, an eviction).
    WriteBack,
    /// Host pages to new device pages: a parked session a match restored.
    Unpark,
    /// A session's pages read by the engine's own copy (`skv_session_export`).
    Export,
    /// New pages written by the engine's own copy (`skv_session_import`).
    Import,
    /// A session's pages read by a move to another instance (`SKV_EXPORT_MOVE`, `transfer`):
    /// its completion releases the session (success) or lets it serve again (failure).
    Move,
}

/// An open ticket: its kind and the rows whose slots it copies.
#[derive(Debug)]
pub(crate) struct Pending {
    pub(crate) kind: Kind,
    pub(crate) rows: Vec<u32>,
}

/// The tickets of one handle.
#[derive(Default)]
pub(crate) struct Tickets {
    last: u64,
    open: BTreeMap<u64, Pending>,
}

impl Tickets {
    /// The number the next ticket gets.
    pub(crate) fn next(&self) -> u64 {
        self.last + 1
    }

    /// Opens the next ticket.
    pub(crate) fn open(&mut self, kind: Kind, rows: Vec<u32>) -> u64 {
        self.last += 1;
        self.open.insert(self.last, Pending { kind, rows });
        self.last
    }

    pub(crate) fn get(&self, ticket: u64) -> Option<&Pending> {
        self.open.get(&ticket)
    }

    pub(crate) fn count(&self) -> usize {
        self.open.len()
    }

    /// The open ticket `ticket`, or why `skv_ticket_done` refuses it.
    pub(crate) fn check(&self, ticket: u64) -> Result<&Pending> {
        if ticket == 0 || ticket > self.last {
            bail!(InvalidArg, "ticket {ticket} was never issued (the last issued is {})", self.last);
        }
        match self.open.get(&ticket) {
            Some(p) => Ok(p),
            None => bail!(State, "ticket {ticket} is already done"),
        }
    }

    /// Closes an open ticket.
    pub(crate) fn close(&mut self, ticket: u64) -> Pending {
        self.open.remove(&ticket).expect("checked open")
    }
}
