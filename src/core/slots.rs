//! The slot table: what a streaming session keeps between turns.
//!
//! A slot always holds exactly one row, and a row belongs to at most one slot, so slots live
//! in a table indexed by row (its size is fixed by `num_rows`). Sessions index their slots'
//! rows in the order the slots were created, which is the order `release_session` frees them.

use std::collections::hash_map::Entry;
use std::collections::HashMap;

use foldhash::fast::RandomState;
use smallvec::SmallVec;

use super::error::{try_vec, Result};

/// The KV fields of a session's last finished turn, plus its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    pub session: u64,
    pub branch: u64,
    /// The generation of the slot's row (stamped into the req a hit restores).
    pub generation: u32,
    pub committed: u32,
    pub allocated: u32,
    pub protected: u32,
    pub swa: u32,
    /// The eviction floor of the last turn (`swa_evict_floor`), restored with `swa`.
    pub swa_floor: u32,
    pub lock_node: u64,
    pub lock_receipt: u64,
    pub aux: i64,
    /// The ping-pong track entries, -1 when empty (see `Req::aux_track`).
    pub track: [i64; 2],
    /// Restored by a `match_prefix` hit and not yet finished: its KV is being read by a
    /// running request, so releasing it would free pages under that request.
    pub in_flight: bool,
    /// When the slot's last turn finished (the cache's turn counter then): orders idle slots
    /// from least to most recently used. A handed-back request leaves it as it was.
    pub finished_at: u64,
    /// The epoch of the move that brought the session here (0: it began here; `transfer`).
    pub epoch: u32,
    /// Where the slot's KV past its protected prefix is (`Place`). (The open ticket copying
    /// its pages, if any, is its row's pin: `Cache::ticket_of`.)
    pub place: Place,
}

// A slot is one and a half cache lines; the epoch fits in its padding.
const _: () = assert!(std::mem::size_of::<Slot>() == 96);

/// Where a slot's session-owned KV is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Place {
    /// In the device pools (a clean host copy may sit beside it).
    #[default]
    Device,
    /// Only in the host pool: the row maps the protected prefix alone (the host tier).
    Parked,
    /// Restored by a match whose copy failed: the running request's pages hold no KV. A
    /// hand-back parks it again; an abort releases it.
    Failed,
}

/// Slots keyed by `(session_id, branch_id)`.
pub struct Slots {
    by_row: Vec<Option<Slot>>,
    sessions: HashMap<u64, SmallVec<[u32; 2]>, RandomState>,
    len: usize,
}

impl Slot {
    /// The recurrent-state handles in free order, as `Req::aux_handles`.
    pub fn aux_handles(&self) -> [i64; 3] {
        [self.aux, self.track[0], self.track[1]]
    }

    /// Bit i set: `aux_handles()[i]` is a handle (not -1): a unit's `aux_mask`.
    pub fn aux_mask(&self) -> u32 {
        self.aux_handles().iter().enumerate().fold(0, |m, (i, &a)| m | ((a != -1) as u32) << i)
    }
}

impl Slots {
    pub fn new(num_rows: u32) -> Result<Self> {
        let by_row = try_vec(num_rows as usize, "session slots", |_| None)?;
        Ok(Slots { by_row, sessions: HashMap::default(), len: 0 })
    }

    /// The row and slot of `(session, branch)`.
    pub fn find(&self, session: u64, branch: u64) -> Option<(u32, &Slot)> {
        let rows = self.sessions.get(&session)?;
        rows.iter().find_map(|&r| {
            let s = self.by_row[r as usize].as_ref()?;
            (s.branch == branch).then_some((r, s))
        })
    }

    /// `find`, looking first at the row the caller's req holds: a finish or a retried match
    /// finds its slot there without hashing the session id.
    pub fn find_near(&self, session: u64, branch: u64, row: Option<u32>) -> Option<(u32, &Slot)> {
        if let Some(s) = row.and_then(|r| self.of_row(r)) {
            if s.session == session && s.branch == branch {
                return Some((row.expect("looked up above"), s));
            }
        }
        self.find(session, branch)
    }

    /// The slot holding `row`, if any.
    #[inline]
    pub fn of_row(&self, row: u32) -> Option<&Slot> {
        self.by_row.get(row as usize)?.as_ref()
    }

    pub fn of_row_mut(&mut self, row: u32) -> Option<&mut Slot> {
        self.by_row.get_mut(row as usize)?.as_mut()
    }

    /// A session's rows, oldest slot first.
    pub fn rows_of(&self, session: u64) -> &[u32] {
        self.sessions.get(&session).map_or(&[], |v| v.as_slice())
    }

    /// Stores a new slot for `row`; the caller has checked the row is free of slots and the
    /// key is new.
    pub fn insert(&mut self, row: u32, slot: Slot) {
        debug_assert!(self.by_row[row as usize].is_none());
        self.sessions.entry(slot.session).or_default().push(row);
        self.by_row[row as usize] = Some(slot);
        self.len += 1;
    }

    /// Drops the slot holding `row` and returns it.
    pub fn remove(&mut self, row: u32) -> Option<Slot> {
        let slot = self.by_row.get_mut(row as usize)?.take()?;
        // One probe of the table, where looking the session up and then removing it took two.
        if let Entry::Occupied(mut rows) = self.sessions.entry(slot.session) {
            rows.get_mut().retain(|r| *r != row);
            if rows.get().is_empty() {
                rows.remove();
            }
        }
        self.len -= 1;
        Some(slot)
    }

    /// Every slot with its row, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &Slot)> {
        self.sessions
            .values()
            .flat_map(|rows| rows.iter())
            .filter_map(|&r| Some((r, self.by_row[r as usize].as_ref()?)))
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(session: u64, branch: u64) -> Slot {
        Slot {
            session,
            branch,
            generation: 1,
            committed: 0,
            allocated: 0,
            protected: 0,
            swa: 0,
            swa_floor: 0,
            lock_node: 0,
            lock_receipt: 0,
            aux: -1,
            track: [-1; 2],
            in_flight: false,
            finished_at: 0,
            epoch: 0,
            place: Place::Device,
        }
    }

    #[test]
    fn branches_keep_creation_order() {
        let mut t = Slots::new(8).unwrap();
        t.insert(5, slot(1, 9));
        t.insert(2, slot(1, 0));
        t.insert(7, slot(2, 0));
        assert_eq!(t.rows_of(1), &[5, 2]);
        assert_eq!(t.find(1, 0).map(|(r, _)| r), Some(2));
        assert_eq!(t.find(2, 9), None);
        assert_eq!(t.find_near(1, 0, Some(5)).map(|(r, _)| r), Some(2), "a wrong hint falls back");
        assert_eq!(t.find_near(1, 0, Some(2)).map(|(r, _)| r), Some(2));
        assert_eq!(t.find_near(1, 0, Some(100)).map(|(r, _)| r), Some(2), "past the table");
        t.remove(5);
        t.insert(3, slot(1, 9));
        assert_eq!(t.rows_of(1), &[2, 3], "a branch saved again goes last");
        assert_eq!(t.len(), 3);
        t.remove(2);
        t.remove(3);
        assert!(t.rows_of(1).is_empty());
        assert_eq!(t.iter().count(), 1);
    }
}
