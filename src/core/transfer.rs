//! Moving a session between instances (docs/transfer.md). A move is a pull: the source
//! exports the session with `SKV_EXPORT_MOVE`, the destination imports the unit (reserving its
//! pages), reads the bytes with its transfer engine and completes its import ticket: that is
//! the commit point. The source completes its export ticket on the destination's word (its
//! notification, or `skv_session_fence`): success releases the session there, failure lets it
//! serve again. Until then both sides keep every page the transfer may touch.
//!
//! Each move carries an epoch, one more than any its session had on the source, and the
//! session's incarnation (`origin`): a random id the first move of a session born on a handle
//! draws, which every later move of it carries. A session released and begun afresh is another
//! incarnation, whose epochs start again. A handle keeps one `Fence` per incarnation it moved:
//! the highest epoch it wrote, imported or was asked to fence, and the highest it committed. The functions here are the lifecycle's decisions over a
//! fence; `Cache` calls them (`unit_ops`, `tier_ops::ticket_done`, `Cache::fence`), and so does
//! the model checker that explores every interleaving of the two sides, the transfer and the
//! notification (`tests/transfer_model.rs`).
//!
//! The descriptor glue (`descs`) turns two sides' page ids and KV layouts into the address
//! ranges a transfer engine moves, contiguous runs merged.

use std::ops::Range;

use super::error::{bail, Result};
use super::records::XferDesc as Desc;

/// A session key and its incarnation: what a fence is kept for.
pub type Incarnation = (u64, u64, u64);

/// Draws incarnations: 64 random bits each, from a per-handle random key and a counter (the
/// standard library's `RandomState`, seeded from the operating system).
#[derive(Debug)]
pub struct Origins {
    state: std::collections::hash_map::RandomState,
    drawn: u64,
}

impl Default for Origins {
    fn default() -> Self {
        Origins { state: std::collections::hash_map::RandomState::new(), drawn: 0 }
    }
}

impl Origins {
    /// The next incarnation: never 0 (a copy's unit carries 0).
    pub fn draw(&mut self) -> u64 {
        use std::hash::BuildHasher;
        self.drawn += 1;
        self.state.hash_one(self.drawn).max(1)
    }
}

/// What a handle knows of one session incarnation's moves.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Fence {
    /// The highest epoch this handle exported, imported, or was asked about: an import of this
    /// epoch or a lower one is refused.
    pub seen: u32,
    /// The highest epoch an import committed here (0: none).
    pub committed: u32,
}

/// `skv_session_fence`'s answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum Answer {
    /// Never committed here at that epoch; an import of it (or lower) is refused from now on.
    Absent = 0,
    /// An import of that epoch is still open here: ask again once its ticket ends.
    Pending = 1,
    /// Committed here at that epoch or a later one.
    Committed = 2,
}

/// What a move export's completion does to the source's slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SourceEnd {
    /// The destination committed: the session is released here.
    Release,
    /// It did not: the session serves here again, unchanged.
    Serve,
}

/// What an import's completion does to the destination's slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ImportEnd {
    /// The bytes arrived: the session is live here (the commit point).
    Commit,
    /// They did not: the slot and its pages are released.
    Release,
}

/// The epoch a move export of a slot holding `slot_epoch` writes: one past anything this
/// handle has seen for the key. `None` once epochs are spent (2^32 - 1 moves of one session).
pub fn next_epoch(f: Fence, slot_epoch: u32) -> Option<u32> {
    f.seen.max(slot_epoch).checked_add(1)
}

/// The fence after a move export of `epoch`.
pub fn exported(f: Fence, epoch: u32) -> Fence {
    Fence { seen: f.seen.max(epoch), ..f }
}

/// An import of `epoch`: the fence after it, or the epoch that fences it out.
pub fn admit(f: Fence, epoch: u32) -> std::result::Result<Fence, u32> {
    match epoch > f.seen {
        true => Ok(Fence { seen: epoch, ..f }),
        false => Err(f.seen),
    }
}

/// An import's completion: what happens to the slot, and the fence after it.
pub fn import_done(f: Fence, epoch: u32, ok: bool) -> (ImportEnd, Fence) {
    match ok {
        true => (ImportEnd::Commit, Fence { seen: f.seen.max(epoch), committed: f.committed.max(epoch) }),
        false => (ImportEnd::Release, f),
    }
}

/// A move export's completion.
pub fn export_done(ok: bool) -> SourceEnd {
    match ok {
        true => SourceEnd::Release,
        false => SourceEnd::Serve,
    }
}

/// The source asks whether `epoch` committed here; `pending` says an import of exactly that
/// epoch is open here. An absent epoch is fenced: a late import of it is refused.
pub fn ask(f: Fence, epoch: u32, pending: bool) -> (Answer, Fence) {
    if f.committed >= epoch {
        (Answer::Committed, f)
    } else if pending {
        (Answer::Pending, f)
    } else {
        (Answer::Absent, Fence { seen: f.seen.max(epoch), ..f })
    }
}

/// One side's KV layout in a pool: region `r` of page `p` is `page_bytes` at
/// `region_base[r] + p * page_stride` (a region per layer and K/V, or one for a page-major
/// arena).
#[derive(Debug, Clone, Copy)]
pub struct Layout<'a> {
    pub region_base: &'a [u64],
    pub page_stride: u64,
    pub page_bytes: u64,
}

/// The runs of `local[i]`, `remote[i]` pairs whose ids both go up by one, as index ranges.
fn runs<'a>(local: &'a [i32], remote: &'a [i32], merge: bool) -> impl Iterator<Item = Range<usize>> + 'a {
    let n = local.len();
    let mut at = 0;
    std::iter::from_fn(move || {
        if at == n {
            return None;
        }
        let start = at;
        at += 1;
        while merge
            && at < n
            && local[at] == local[at - 1].wrapping_add(1)
            && remote[at] == remote[at - 1].wrapping_add(1)
        {
            at += 1;
        }
        Some(start..at)
    })
}

/// Checks two layouts and their ids; the number of descriptors `descs` writes.
pub fn descs_len(local: &Layout, local_ids: &[i32], remote: &Layout, remote_ids: &[i32]) -> Result<usize> {
    if local.region_base.len() != remote.region_base.len() {
        bail!(
            InvalidArg,
            "local n_regions {} != remote n_regions {}: the two sides' layouts differ",
            local.region_base.len(),
            remote.region_base.len()
        );
    }
    if local.page_bytes != remote.page_bytes || local.page_bytes == 0 {
        bail!(
            InvalidArg,
            "local page_bytes {} vs remote {}: both sides move the same non-zero bytes per page",
            local.page_bytes,
            remote.page_bytes
        );
    }
    for (side, l) in [("local", local), ("remote", remote)] {
        if l.page_stride < l.page_bytes {
            bail!(
                InvalidArg,
                "{side} page_stride {} < page_bytes {}: pages would overlap",
                l.page_stride,
                l.page_bytes
            );
        }
    }
    for (side, ids, l) in [("local", local_ids, local), ("remote", remote_ids, remote)] {
        if let Some((i, &p)) = ids.iter().enumerate().find(|(_, &p)| p <= 0) {
            bail!(InvalidArg, "{side}_pages[{i}] = {p}: page ids are > 0 (page 0 is padding)");
        }
        // The end of the highest page past any base, computed without wrapping: a wrapped
        // address would be a plausible one.
        let top = ids.iter().map(|&p| p as u64).max().unwrap_or(0);
        let Some(end) = top.checked_mul(l.page_stride).and_then(|o| o.checked_add(l.page_bytes)) else {
            bail!(
                InvalidArg,
                "{side} page {top} at page_stride {} with page_bytes {} ends past the address space",
                l.page_stride,
                l.page_bytes
            );
        };
        if let Some((r, b)) = l.region_base.iter().enumerate().find(|(_, &b)| b.checked_add(end).is_none()) {
            bail!(InvalidArg, "{side} region_base[{r}] = {b:#x}: its last page runs past the address space");
        }
    }
    let merge = local.page_bytes == local.page_stride && remote.page_bytes == remote.page_stride;
    match local.region_base.len().checked_mul(runs(local_ids, remote_ids, merge).count()) {
        Some(n) => Ok(n),
        None => bail!(InvalidArg, "n_regions {} times the page runs overflows a count", local.region_base.len()),
    }
}

/// The descriptors moving `remote_ids`' pages into `local_ids`' (pairwise), region by region
/// in page order; `out` holds `descs_len` of them (checked first).
pub fn descs(local: &Layout, local_ids: &[i32], remote: &Layout, remote_ids: &[i32], out: &mut [Desc]) -> usize {
    let merge = local.page_bytes == local.page_stride && remote.page_bytes == remote.page_stride;
    let mut n = 0;
    for (&lb, &rb) in local.region_base.iter().zip(remote.region_base) {
        for run in runs(local_ids, remote_ids, merge) {
            out[n] = Desc {
                local_addr: lb + local_ids[run.start] as u64 * local.page_stride,
                remote_addr: rb + remote_ids[run.start] as u64 * remote.page_stride,
                len: run.len() as u64 * local.page_bytes,
            };
            n += 1;
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::XferDesc as Desc;

    #[test]
    fn an_epoch_once_seen_is_refused() {
        let f = Fence::default();
        let f = admit(f, 1).expect("a first import");
        assert_eq!(admit(f, 1), Err(1), "a duplicate");
        let (end, f) = import_done(f, 1, true);
        assert_eq!((end, f), (ImportEnd::Commit, Fence { seen: 1, committed: 1 }));
        assert_eq!(ask(f, 1, false).0, Answer::Committed);
        assert_eq!(next_epoch(f, 1), Some(2));
    }

    #[test]
    fn an_absent_answer_fences_the_epoch() {
        let (a, f) = ask(Fence::default(), 3, false);
        assert_eq!(a, Answer::Absent);
        assert_eq!(admit(f, 3), Err(3), "the late import is refused");
        assert!(admit(f, 4).is_ok(), "a later move still lands");
        assert_eq!(ask(Fence { seen: 3, committed: 0 }, 3, true).0, Answer::Pending);
    }

    #[test]
    fn runs_merge_only_where_both_sides_are_consecutive() {
        let (lb, rb) = ([0x1000u64, 0x9000], [0x100000u64, 0x200000]);
        let l = Layout { region_base: &lb, page_stride: 16, page_bytes: 16 };
        let r = Layout { region_base: &rb, page_stride: 16, page_bytes: 16 };
        let (li, ri) = ([1, 2, 3, 7, 8], [5, 6, 9, 10, 11]);
        assert_eq!(descs_len(&l, &li, &r, &ri).unwrap(), 2 * 3);
        let mut out = [Desc::default(); 6];
        assert_eq!(descs(&l, &li, &r, &ri, &mut out), 6);
        assert_eq!(out[0], Desc { local_addr: 0x1000 + 16, remote_addr: 0x100000 + 5 * 16, len: 32 });
        assert_eq!(out[1], Desc { local_addr: 0x1000 + 48, remote_addr: 0x100000 + 9 * 16, len: 16 });
        assert_eq!(out[2], Desc { local_addr: 0x1000 + 7 * 16, remote_addr: 0x100000 + 10 * 16, len: 32 });
        assert_eq!(out[3].local_addr, 0x9000 + 16, "then the second region");
        // A stride wider than the bytes moved: one descriptor a page.
        let r2 = Layout { page_stride: 64, ..r };
        assert_eq!(descs_len(&l, &li, &r2, &ri).unwrap(), 2 * 5);
        assert!(descs_len(&l, &[0], &r, &[1]).is_err(), "page 0 is padding");
        assert!(descs_len(&Layout { page_bytes: 8, ..l }, &li, &r, &ri).is_err());
    }
}
