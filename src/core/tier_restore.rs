//! Restoring a parked session (`skv_match_prefix_tier`): new device pages and a copy from
//! host under a ticket, or a miss when they do not fit; a failed restore parks again at its
//! hand-back (docs/tiers.md, "Matching a parked session").

use super::cache::{Cache, Move};
use super::error::{bail, Result};
use super::page::{ceil_align, pages_for};
use super::records::TierMatch;
use super::req::{swa_dead, Req};
use super::session_checks::check_claim;
use super::slots::{Place, Slot};
use super::tickets::Kind;
use super::tier_ops::{Copies, COPY_TO_DEVICE};

impl Cache {
    /// `skv_match_prefix_tier`: `match_prefix`, where a parked slot is restored (new device
    /// pages, a copy from host under the returned ticket) or, when they do not fit, released
    /// for a miss; a slot an import is still writing hits with the import's ticket.
    pub fn match_prefix_tier(
        &mut self,
        session: u64,
        branch: u64,
        req: &mut Req,
        key_len: u32,
        pre_aborted: bool,
    ) -> Result<TierMatch> {
        self.check_req(req)?;
        let Some((row, slot)) = self.slots.find_near(session, branch, req.row()).map(|(r, s)| (r, *s)) else {
            return Ok(TierMatch::default());
        };
        self.refuse_exporting(session, branch, row, pre_aborted)?;
        if slot.place == Place::Parked && !pre_aborted {
            return self.unpark(session, branch, row, slot, req, key_len);
        }
        // Its KV still arriving (an import, or a restore a retried match finds): the hit names
        // the ticket to wait for, as the first match did.
        let t = self.ticket_of(row);
        let arriving = self.tickets.get(t).is_some_and(|p| matches!(p.kind, Kind::Import | Kind::Unpark));
        let m = self.hit(session, branch, req, key_len, pre_aborted, true)?;
        let ticket = if m.hit == 1 && arriving { t } else { 0 };
        Ok(TierMatch { hit: m.hit, prefix_len: m.prefix_len, ticket, ..TierMatch::default() })
    }

    fn unpark(
        &mut self,
        session: u64,
        branch: u64,
        row: u32,
        slot: Slot,
        req: &mut Req,
        key_len: u32,
    ) -> Result<TierMatch> {
        check_claim(session, branch, row, &slot, req)?;
        if req.row().is_some() {
            // Only a stale copy holds an idle slot's row; refused before anything is copied.
            bail!(
                State,
                "req_pool_idx {row}: session {session} branch {branch} is parked; a req holding its row is a \
                 stale copy (a restore takes a req that holds no row)"
            );
        }
        self.require_copy()?;
        let ps = self.cfg.page_size;
        let Some(prefix_len) = self.reusable_prefix(&slot, key_len)? else {
            self.release_rows(&[row])?;
            self.moves.push((session, branch, Move::Released));
            return Ok(TierMatch::default());
        };
        let first = pages_for(slot.protected, ps);
        let len = slot.allocated.min(ceil_align(prefix_len, ps) as u32);
        let n = pages_for(len, ps) - first;
        let dead = swa_dead(slot.protected, slot.swa_floor, slot.swa, ps);
        let live: Vec<bool> = (first..first + n).map(|i| !(dead.0 <= i * ps && (i + 1) * ps <= dead.1)).collect();
        let p = self.owned_pool()?;
        let swa_short =
            p.swa.as_ref().is_some_and(|s| (s.alloc.free_pages() as usize) < live.iter().filter(|&&l| l).count());
        if (p.allocator().free_pages() as usize) < n as usize || swa_short {
            // No cascade of parks inside a match: the parked slot goes, and the match misses.
            self.release_rows(&[row])?;
            self.moves.push((session, branch, Move::Released));
            return Ok(TierMatch::default());
        }
        let p = self.pool.owned_mut().expect("owned");
        let undo = p.restore_pages(row, n, &live)?;
        let copy = &self.tier_ref()?.copies[row as usize];
        let p = self.owned_pool()?;
        let r = p.in_use(row).expect("row");
        let mut c = Copies {
            full_src: copy.full[..n as usize].iter().map(|&x| x as i32).collect(),
            full_dst: r.pages[first as usize..].iter().map(|&x| x as i32).collect(),
            ..Copies::default()
        };
        if let Some(sw) = p.swa.as_ref() {
            let ids = &sw.rows[row as usize].ids[first as usize..];
            for (&h, &d) in copy.swa[..n as usize].iter().zip(ids) {
                if h != 0 && d != 0 {
                    c.swa_src.push(h as i32);
                    c.swa_dst.push(d as i32);
                }
            }
        }
        let t = self.tickets.next();
        if let Err(e) = self.copy(t, COPY_TO_DEVICE, &c) {
            self.pool.owned_mut().expect("owned").undo_restore(row, undo);
            return Err(e);
        }
        let moved = (c.full_src.len() + c.swa_src.len()) as u64;
        let t = self.tickets.open(Kind::Unpark, vec![row]);
        let p = self.pool.owned_mut().expect("owned");
        p.row_mut(row).len = len;
        p.mapped(row, slot.protected, len);
        p.pin_row(row, t);
        let s = self.slots.of_row_mut(row).expect("slot");
        (s.place, s.allocated, s.committed) = (Place::Device, len, s.committed.min(len));
        self.moves.push((session, branch, Move::Restored));
        let tier = self.tier_mut();
        tier.copies[row as usize].ticket = t;
        tier.counts.unparks += 1;
        tier.counts.pages_to_device += moved;
        let m = self.hit(session, branch, req, key_len, false, true)?;
        Ok(TierMatch { hit: m.hit, prefix_len: m.prefix_len, restored_pages: n, ticket: t, ..TierMatch::default() })
    }

    /// A hand-back of a slot whose restore failed parks it again (its host copy is intact).
    pub(crate) fn repark(&mut self, row: u32, s: &Slot) -> Result<()> {
        self.effects.clear();
        self.push_park(row, s);
        self.run_effects(|c| {
            let slot = c.slots.of_row_mut(row).expect("slot");
            (slot.place, slot.in_flight) = (Place::Parked, false);
            c.trim_host_copy(row);
            c.sync_idle(row);
        })
    }

    /// A slot parked again after its restore failed keeps the host pages of what it still
    /// holds: its request may have shortened it (the record follows the row) before it went.
    pub(super) fn trim_host_copy(&mut self, row: u32) {
        let ps = self.cfg.page_size;
        let s = *self.slots.of_row(row).expect("slot");
        let n = (pages_for(s.allocated, ps) - pages_for(s.protected, ps)) as usize;
        if let Some(t) = self.tier.as_deref_mut() {
            t.trim_copy(row, n);
        }
    }
}
