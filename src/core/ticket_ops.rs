//! Completing a ticket (`skv_ticket_done`) and the pins tickets hold (docs/tiers.md,
//! "Completing a ticket"; docs/transfer.md for a move's and an import's): what each kind's
//! completion does to its slots, and the pins in either mode.

use super::cache::{push_release, Cache, Move};
use super::error::Result;
use super::slots::Place;
use super::tickets::Kind;
use super::transfer::{self, SourceEnd};

impl Cache {
    /// `skv_ticket_done`: the copies of `ticket` ran (`ok`) or failed; its drained pages go
    /// free and each slot it copied moves on (docs/tiers.md, "Completing a ticket").
    pub fn ticket_done(&mut self, ticket: u64, ok: bool) -> Result<()> {
        let p = self.tickets.check(ticket)?;
        let (kind, rows) = (p.kind, p.rows.clone());
        let p_rows = rows.clone();
        let ps = self.cfg.page_size;
        // The rows whose slots the ticket still copies (a slot released since is not).
        let rows: Vec<u32> = rows.into_iter().filter(|&r| self.ticket_of(r) == ticket).collect();
        self.effects.clear();
        let mut parks = Vec::new();
        let mut releases = Vec::new();
        // Failed restores whose request was handed back or aborted already: parked again.
        let mut reparks = Vec::new();
        let mut failed = Vec::new();
        for &row in &rows {
            let s = *self.slots.of_row(row).expect("a pinned row's slot");
            match kind {
                Kind::Unpark if !ok && !s.in_flight => reparks.push(row),
                Kind::WriteBack if ok => {
                    let copy = self.tier.as_deref().map(|t| &t.copies[row as usize]);
                    if copy.is_some_and(|c| c.ticket == ticket && c.leaving) {
                        parks.push(row);
                    }
                }
                // A turn running on it (a tier match hit) ends it: it fails, as a restore does.
                Kind::Import if !ok && s.in_flight => failed.push(row),
                Kind::Import if !ok => releases.push((row, s)),
                Kind::Move if transfer::export_done(ok) == SourceEnd::Release => releases.push((row, s)),
                _ => {}
            }
        }
        // The pins end first, so the parks below free their pages rather than drain them.
        self.unpin_all(ticket, &p_rows);
        for &row in parks.iter().chain(&reparks) {
            let s = *self.slots.of_row(row).expect("slot");
            self.push_park(row, &s);
        }
        for &(row, s) in &releases {
            push_release(&mut self.effects, ps, row, &s);
        }
        self.run_effects(|c| {
            for &row in &rows {
                let Some(tier) = c.tier.as_deref_mut() else { continue };
                let copy = &mut tier.copies[row as usize];
                if copy.ticket != ticket {
                    continue;
                }
                copy.ticket = 0;
                match (kind, ok) {
                    (Kind::WriteBack, true) => {
                        copy.clean = true;
                        tier.counts.writebacks += 1;
                    }
                    (Kind::WriteBack, false) => {
                        tier.drop_copy(row);
                        tier.counts.failed_copies += 1;
                        let fin = c.slots.of_row(row).expect("slot").finished_at;
                        c.tier_mut().writeback.push_back((fin, row));
                    }
                    (Kind::Unpark, true) => tier.drop_copy(row),
                    (Kind::Unpark, false) => {
                        tier.counts.failed_copies += 1;
                        let s = c.slots.of_row_mut(row).expect("slot");
                        // An idle slot (its request gone before the copy ran) parks again: its
                        // device pages were never written, its host copy is intact.
                        s.place = if reparks.contains(&row) { Place::Parked } else { Place::Failed };
                        // Its KV is still only in the host tier.
                        let (key, protected) = ((s.session, s.branch), s.protected);
                        c.moves.push((key.0, key.1, Move::Parked { protected }));
                    }
                    _ => {}
                }
            }
            for &row in &parks {
                c.mark_parked(row);
            }
            for &row in &reparks {
                c.trim_host_copy(row);
                c.sync_idle(row);
            }
            if kind == Kind::Import {
                c.import_done(&rows, ok);
            }
            for &row in &failed {
                c.slots.of_row_mut(row).expect("slot").place = Place::Failed;
            }
            for &(row, _) in &releases {
                c.release_moved(row);
            }
            if matches!(kind, Kind::Export | Kind::Move | Kind::Import) {
                // A write-back walk dropped these idle slots while the ticket pinned them.
                for &row in &rows {
                    if let Some(s) = c.slots.of_row(row).filter(|s| !s.in_flight && s.place == Place::Device) {
                        c.tier_handed_back(row, s.finished_at);
                    }
                }
            }
            if let Some(tier) = c.tier.as_deref_mut() {
                tier.return_drain(ticket);
            }
            c.tickets.close(ticket);
        })
    }

    /// A tier call's release of the slot holding `row` (its effects planned by the caller),
    /// noted for the events.
    pub(super) fn release_moved(&mut self, row: u32) {
        self.log_move(row, Move::Released);
        self.remove_slot(row);
    }

    /// Notes a move of the slot holding `row` (`Cache::moves`).
    pub(super) fn log_move(&mut self, row: u32, m: Move) {
        let s = self.slots.of_row(row).expect("a slot moves");
        self.moves.push((s.session, s.branch, m));
    }

    /// Ends `ticket`'s pins; owned mode's drained device pages go free.
    pub(super) fn unpin_all(&mut self, ticket: u64, rows: &[u32]) {
        match self.pool.owned_mut() {
            Some(p) => p.return_drain(ticket, rows),
            None => {
                for &row in rows {
                    if self.engine_pins.ticket_of(row) == Some(ticket) {
                        self.engine_pins.unpin(row);
                        self.meta_mut(row).pinned = false;
                    }
                }
            }
        }
    }

    /// Pins `row` for `ticket` in either mode (`pins`).
    pub(crate) fn pin(&mut self, row: u32, ticket: u64) {
        match self.pool.owned_mut() {
            Some(p) => p.pin_row(row, ticket),
            None => {
                self.engine_pins.pin(row, ticket);
                self.meta_mut(row).pinned = true;
            }
        }
    }

    /// The open ticket copying `row`'s pages (its pin), 0 when none.
    #[inline]
    pub(crate) fn ticket_of(&self, row: u32) -> u64 {
        if !self.meta(row).is_some_and(|m| m.pinned) {
            return 0;
        }
        let pins = match self.pool.owned() {
            Some(p) => &p.pins,
            None => &self.engine_pins,
        };
        pins.ticket_of(row).unwrap_or(0)
    }

    /// What the open ticket copying `row`'s pages does, if one does.
    pub(crate) fn copy_kind(&self, row: u32) -> Option<Kind> {
        self.tickets.get(self.ticket_of(row)).map(|p| p.kind)
    }

    /// Whether `ticket` is an import's (its slot's KV is still arriving).
    pub(crate) fn arriving(&self, ticket: u64) -> bool {
        self.tickets.get(ticket).is_some_and(|p| p.kind == Kind::Import)
    }
}
