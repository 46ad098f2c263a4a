//! What a scheduler asks before it acts: what a session holds, which idle sessions to evict
//! first under memory pressure, and what admitting a request would cost. Queries change
//! nothing.

use super::cache::Cache;
use super::error::{bail, Result};
use super::page::pages_for;
use super::records::{Admission, Usage};
use super::slots::{Place, Slot};

impl Cache {
    /// What `(session, branch)` holds (`branch` None: every branch of the session).
    pub fn usage(&self, session: u64, branch: Option<u64>) -> Usage {
        let ps = self.cfg.page_size;
        let mut u = Usage::default();
        for &row in self.slots.rows_of(session) {
            let s = self.slots.of_row(row).expect("rows of live slots");
            if branch.is_some_and(|b| b != s.branch) {
                continue;
            }
            let allocated = self.held_len(row, s);
            let pages = pages_for(allocated, ps) as u64;
            u.slots += 1;
            u.in_flight += s.in_flight as u64;
            u.allocated_tokens += allocated as u64;
            u.committed_tokens += s.committed as u64;
            u.protected_tokens += s.protected as u64;
            u.pages += pages;
            u.freeable_pages += freeable(pages, s.protected, ps);
        }
        u
    }

    /// The tokens a slot's row holds: owned mode, the row's mapped length (a running
    /// request's extension included); external mode, the slot's record.
    fn held_len(&self, row: u32, s: &Slot) -> u32 {
        self.pool.mapped_len(row).unwrap_or(s.allocated)
    }

    /// The idle slots on the device (parked ones hold no device KV to evict), least recently
    /// finished first, into `out` (up to its length); returns how many there are.
    pub fn idle_lru(&self, out: &mut [(u64, u64)]) -> usize {
        let mut idle: Vec<(u64, u64, u64)> = self
            .slots
            .iter()
            .filter(|(_, s)| !s.in_flight && s.place != Place::Parked)
            .map(|(_, s)| (s.finished_at, s.session, s.branch))
            .collect();
        idle.sort_unstable();
        for (o, &(_, session, branch)) in out.iter_mut().zip(&idle) {
            *o = (session, branch);
        }
        idle.len()
    }

    /// What `match_prefix(session, branch, key_len)` followed by growing the row to
    /// `total_len` tokens would take from owned mode's pool.
    pub fn admission(&self, session: u64, branch: u64, key_len: u32, total_len: u32) -> Result<Admission> {
        self.require_owned()?;
        let max = self.cfg.max_context_len;
        if total_len > max {
            bail!(InvalidArg, "total_len {total_len} > max_context_len {max}");
        }
        if key_len > total_len {
            bail!(InvalidArg, "key_len {key_len} > total_len {total_len}: a request reuses at most its own length");
        }
        let ps = self.cfg.page_size;
        let whole = pages_for(total_len, ps) as u64;
        let Some((row, slot)) = self.slots.find(session, branch) else {
            return Ok(Admission { pages_needed: whole, ..Admission::default() });
        };
        if slot.in_flight {
            bail!(
                State,
                "session {session} branch {branch} is in flight (row {row}): its running request holds it; \
                 no other request can be admitted on it"
            );
        }
        let held = pages_for(self.held_len(row, slot), ps) as u64;
        if slot.place == Place::Parked {
            // A restore maps new pages past the prefix that stayed on the device; nothing is freed.
            let hit = self.reusable_prefix(slot, key_len)?;
            let on_device = pages_for(slot.protected, ps) as u64;
            return Ok(match hit {
                None => Admission { pages_needed: whole, ..Admission::default() },
                Some(prefix_len) => Admission { hit: 1, prefix_len, pages_needed: whole - on_device, pages_freed: 0 },
            });
        }
        // A row an open ticket copies frees nothing now: its pages drain until the ticket completes.
        let pinned = self.pool.owned().is_some_and(|p| p.pins.ticket_of(row).is_some());
        match self.reusable_prefix(slot, key_len)? {
            None => Ok(Admission {
                pages_needed: whole,
                pages_freed: if pinned { 0 } else { freeable(held, slot.protected, ps) },
                ..Admission::default()
            }),
            Some(prefix_len) => {
                let kept = pages_for(prefix_len, ps) as u64;
                let freed = if pinned { 0 } else { held.saturating_sub(kept) };
                Ok(Admission { hit: 1, prefix_len, pages_needed: whole - kept, pages_freed: freed })
            }
        }
    }
}

/// Of a slot's `pages`, those releasing it would free: all but its protected prefix's.
fn freeable(pages: u64, protected: u32, ps: u32) -> u64 {
    pages.saturating_sub((protected / ps) as u64)
}
