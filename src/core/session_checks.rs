//! The checks the session operations run on a session's row before they change it: which
//! request may claim it (a match), finish into it, hand it back, or shorten it.

use super::cache::Cache;
use super::error::{bail, Result};
use super::page::floor_align;
use super::req::Req;
use super::slots::Slot;

impl Cache {
    /// A finishing req's row must be its session's own, and a first turn's row must not
    /// already belong to another slot (that would hand the row back twice).
    pub(super) fn check_row_belongs(&self, row: u32, slot_row: Option<u32>, session: u64, branch: u64) -> Result<()> {
        match slot_row {
            Some(r) if r != row => {
                bail!(State, "req holds row {row} but session {session} branch {branch} holds row {r}")
            }
            Some(_) => Ok(()),
            None => match self.slots.of_row(row) {
                Some(o) => bail!(State, "row {row} already belongs to session {} branch {}", o.session, o.branch),
                None => Ok(()),
            },
        }
    }

    /// A partial page kept where the window passed would be grown into with no SWA slots. A
    /// trim, a tail free and a hit floor their boundary to a page there, so only
    /// `skv_free_aligned`, which has no req to floor, can meet this refusal.
    pub(super) fn check_kept_page(&self, row: u32, len: u32, end: u32, dead: (u32, u32)) -> Result<()> {
        let page = floor_align(len, self.cfg.page_size);
        if len < end && page != len && dead.0 <= page && page < dead.1 && self.pool.frees_swa().is_ok() {
            bail!(
                InvalidArg,
                "target {len} keeps part of a page of row {row} whose SWA slots the window freed \
                 ([{}, {})): free from a page boundary, {page}",
                dead.0,
                dead.1
            );
        }
        Ok(())
    }

    /// A primitive shortening a running session's row from `end` to `len` must start at or
    /// past the end the slot records (else the slot would forget the tail in between) and
    /// stop short of the prefix the slot protects (the engine's req may claim a shorter one).
    pub(super) fn check_slot_floor(&self, row: u32, len: u32, end: u32) -> Result<()> {
        let Some(s) = self.slots.of_row(row).filter(|_| len < end) else { return Ok(()) };
        if end < s.allocated {
            bail!(
                State,
                "end {end} < the {} tokens session {} branch {} records for row {row}",
                s.allocated,
                s.session,
                s.branch
            );
        }
        if len < s.protected {
            bail!(
                State,
                "row {row} would shrink to {len} tokens, below the {} protected by session {} branch {}",
                s.protected,
                s.session,
                s.branch
            );
        }
        Ok(())
    }
}

/// Whether `req` may match the slot in `row`: a req holding a row holds this one, and a
/// running slot is matched again only by its own request's req (a retry).
pub(super) fn check_claim(session: u64, branch: u64, row: u32, slot: &Slot, req: &Req) -> Result<()> {
    if let Some(r) = req.row().filter(|&r| r != row) {
        bail!(State, "req holds row {r} but session {session} branch {branch} is restored into row {row}");
    }
    if slot.in_flight && req.row() != Some(row) {
        bail!(
            State,
            "session {session} branch {branch} is already restored into a running request (row {row}); \
             only that request's req may match it again"
        );
    }
    Ok(())
}

/// A req handed back must be as the match left it: any length it grew (or lost) since means
/// the request ran, and handing it back would forget KV it holds.
pub(super) fn check_unrun(req: &Req, slot: &Slot, row: u32) -> Result<()> {
    let pairs = [
        ("kv_allocated_len", req.kv_allocated_len as i64, slot.allocated as i64),
        ("kv_committed_len", req.kv_committed_len as i64, slot.committed as i64),
        ("cache_protected_len", req.cache_protected_len as i64, slot.protected as i64),
        ("swa_evicted_seqlen", req.swa_evicted_seqlen as i64, slot.swa as i64),
        ("aux_state", req.aux_state, slot.aux),
        ("aux_track[0]", req.aux_track[0], slot.track[0]),
        ("aux_track[1]", req.aux_track[1], slot.track[1]),
    ];
    for (name, got, restored) in pairs {
        if got != restored {
            bail!(
                State,
                "{name} {got} != the {restored} the match restored into row {row}: the request ran \
                 (finish or abort it instead)"
            );
        }
    }
    if (req.lock_node, req.lock_receipt) != (slot.lock_node, slot.lock_receipt) {
        bail!(
            State,
            "lock_node {} / lock_receipt {} != the {} / {} the match restored into row {row}",
            req.lock_node,
            req.lock_receipt,
            slot.lock_node,
            slot.lock_receipt
        );
    }
    Ok(())
}
