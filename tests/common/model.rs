//! The reference model of docs/operations.md's session operations and of the rules
//! docs/decisions.md settles, shared by the property tests: slots keyed by
//! (session, branch) with their creation order, and for each operation the status, the effects
//! on the engine in order, the req afterwards and the out-values.
//!
//! Errors follow docs/conventions.md's order: every SKV_ERR_INVALID_ARG the model raises (the arguments
//! alone are bad) comes before any SKV_ERR_STATE, so a caller with checks of its own (owned
//! mode's record of a row: NOT_FOUND, then INVALID_ARG) puts them in between.

use super::*;
use skv::skv_req;
use std::collections::BTreeMap;

pub type Key = (u64, u64);

#[derive(Clone, Debug, PartialEq)]
pub struct Slot {
    pub row: i32,
    pub committed: u32,
    pub allocated: u32,
    pub protected: u32,
    pub swa: u32,
    pub lock: (u64, u64),
    pub aux: i64,
    /// The ping-pong track entries, -1 when empty.
    pub track: [i64; 2],
    pub in_flight: bool,
    pub order: u64,
}

/// An effect on the engine, in the order libskv must produce it.
#[derive(Clone, Debug, PartialEq)]
pub enum Eff {
    FreeKv(i32, u32, u32),
    FreeRow(i32),
    DecLock(u64, u64),
    FreeAux(i64),
}

#[derive(Clone, Debug, PartialEq)]
pub enum Out {
    None,
    Match(u32, u32),
    Handled(u32),
}

pub type Res = Result<(Vec<Eff>, Out), u32>;

#[derive(Clone)]
pub struct Model {
    pub ps: u32,
    pub rows: u32,
    pub max_ctx: u32,
    pub aligned: bool,
    pub slots: BTreeMap<Key, Slot>,
    pub next_order: u64,
}

impl Model {
    pub fn valid(&self, r: &skv_req) -> bool {
        r.kv_committed_len <= r.kv_allocated_len
            && (r.req_pool_idx == -1 || r.cache_protected_len <= r.kv_committed_len)
            && r.cache_protected_len.is_multiple_of(self.ps)
            && r.kv_allocated_len <= self.max_ctx
            && r.swa_evicted_seqlen <= r.kv_allocated_len
            && (r.finished_len == -1 || (r.finished_len >= 0 && r.finished_len as u32 <= r.output_len))
            && (r.req_pool_idx == -1 || (r.req_pool_idx >= 0 && (r.req_pool_idx as u32) < self.rows))
    }

    pub fn check(&self, r: &skv_req) -> Result<(), u32> {
        if self.valid(r) {
            Ok(())
        } else {
            Err(INVALID)
        }
    }

    pub fn slot_holding(&self, row: i32) -> Option<Key> {
        self.slots.iter().find(|(_, s)| s.row == row).map(|(k, _)| *k)
    }

    fn slot_of_row(&self, row: i32) -> Option<&Slot> {
        self.slots.values().find(|s| s.row == row)
    }

    pub fn free_aligned(&self, row: i32, target: u32, end: u32, fx: &mut Vec<Eff>) {
        if end <= target {
            return;
        }
        let start = if self.ps > 1 { ceil_align(target, self.ps) } else { target as u64 };
        if start < end as u64 {
            fx.push(Eff::FreeKv(row, start as u32, end));
        }
    }

    pub fn release(s: &Slot, fx: &mut Vec<Eff>) {
        if s.lock.0 != 0 {
            fx.push(Eff::DecLock(s.lock.0, s.lock.1));
        }
        if s.protected < s.allocated {
            fx.push(Eff::FreeKv(s.row, s.protected, s.allocated));
        }
        fx.push(Eff::FreeRow(s.row));
        // The recurrent-state handles last: the pool slot, then each real track entry.
        for h in [s.aux, s.track[0], s.track[1]] {
            if h != -1 {
                fx.push(Eff::FreeAux(h));
            }
        }
    }

    pub fn reset(r: &mut skv_req) {
        r.req_pool_idx = -1;
        r.kv_committed_len = 0;
        r.kv_allocated_len = 0;
        r.cache_protected_len = 0;
        r.swa_evicted_seqlen = 0;
        r.lock_node = 0;
        r.lock_receipt = 0;
        r.aux_state = -1;
        r.aux_track = [-1, -1];
    }

    // --- a session's row under the primitives ---------------------------------------------

    /// A row an idle slot holds is the session's: no primitive may touch it, not even one that
    /// would free nothing (the req or row number it came with is stale).
    fn guard_idle(&self, row: i32, op: &str) -> Result<(), u32> {
        if self.slot_of_row(row).is_some_and(|s| !s.in_flight) {
            note(&format!("{op}: idle session row"));
            return Err(STATE);
        }
        Ok(())
    }

    /// A primitive cutting a running session's row from `end` back to `len` must cover the end
    /// the slot records (else the slot would forget the tail past `end`) and must not reach into
    /// the slot's protected prefix (the req it came with may claim a shorter one).
    fn guard_floor(&self, row: i32, len: u32, end: u32, op: &str) -> Result<(), u32> {
        let Some(s) = self.slot_of_row(row).filter(|_| len < end) else { return Ok(()) };
        if end < s.allocated {
            note(&format!("{op}: end short of the running slot's"));
            return Err(STATE);
        }
        if len < s.protected {
            note(&format!("{op}: into the running slot's protected prefix"));
            return Err(STATE);
        }
        Ok(())
    }

    /// The running session's slot shortens with its row, so a later abort or retry never
    /// hands the same tail back twice; a call that leaves the row as long leaves the slot alone.
    fn clamp(&mut self, row: i32, len: u32, end: u32, op: &str) {
        let Some(k) = self.slot_holding(row).filter(|_| len < end) else { return };
        let s = self.slots.get_mut(&k).unwrap();
        if len < s.allocated {
            note(&format!("{op}: shortens the running slot"));
        }
        s.allocated = s.allocated.min(len);
        s.committed = s.committed.min(len);
        s.swa = s.swa.min(len);
    }

    // --- the primitives ---------------------------------------------------------------------

    /// trim_overshoot's argument checks (all INVALID_ARG) and its boundary: the finished length,
    /// floored to a page when the SWA cursor runs past it.
    fn trim_target(&self, r: &skv_req, fl: u32) -> Result<u32, u32> {
        if r.req_pool_idx == -1 || fl > r.output_len {
            return Err(INVALID);
        }
        let target = r.origin_input_len as u64 + fl as u64;
        if target > u32::MAX as u64 || target < r.cache_protected_len as u64 {
            return Err(INVALID);
        }
        let mut t = target as u32;
        if self.ps > 1 && r.swa_evicted_seqlen > t {
            if !t.is_multiple_of(self.ps) {
                note("trim: swa floors the target");
            }
            t = floor_align(t, self.ps);
        }
        Ok(t)
    }

    fn apply_trim(&self, r: &mut skv_req, t: u32, fl: u32, fx: &mut Vec<Eff>) {
        self.free_aligned(r.req_pool_idx, t, r.kv_allocated_len, fx);
        r.kv_allocated_len = r.kv_allocated_len.min(t);
        r.kv_committed_len = r.kv_committed_len.min(t);
        r.swa_evicted_seqlen = r.swa_evicted_seqlen.min(t);
        r.output_len = r.output_len.min(fl);
        if r.finished_len >= 0 && r.finished_len as u32 > r.output_len {
            r.finished_len = r.output_len as i32;
        }
    }

    fn apply_free_tail(&self, r: &mut skv_req, prefix: u32, fx: &mut Vec<Eff>) {
        self.free_aligned(r.req_pool_idx, prefix, r.kv_allocated_len, fx);
        r.kv_allocated_len = prefix;
        r.kv_committed_len = r.kv_committed_len.min(prefix);
        r.swa_evicted_seqlen = r.swa_evicted_seqlen.min(prefix);
    }

    pub fn op_free_aligned(&mut self, row: i32, target: u32, end: u32) -> Res {
        if row < 0 || row as u32 >= self.rows || end > self.max_ctx || target > end {
            return Err(INVALID);
        }
        self.guard_idle(row, "free_aligned")?;
        self.guard_floor(row, target, end, "free_aligned")?;
        let mut fx = vec![];
        if end <= target {
            if self.slot_of_row(row).is_some() {
                note("free_aligned: nothing to free on a running session row");
            }
            return Ok((fx, Out::None));
        }
        self.free_aligned(row, target, end, &mut fx);
        self.clamp(row, target, end, "free_aligned");
        Ok((fx, Out::None))
    }

    pub fn op_trim(&mut self, r: &mut skv_req, fl: u32) -> Res {
        self.check(r)?;
        let t = self.trim_target(r, fl)?;
        let (row, end) = (r.req_pool_idx, r.kv_allocated_len);
        self.guard_idle(row, "trim")?;
        self.guard_floor(row, t, end, "trim")?;
        let mut fx = vec![];
        self.apply_trim(r, t, fl, &mut fx);
        self.clamp(row, t, end, "trim");
        Ok((fx, Out::None))
    }

    pub fn op_free_tail(&mut self, r: &mut skv_req, prefix: u32) -> Res {
        self.check(r)?;
        let (row, end) = (r.req_pool_idx, r.kv_allocated_len);
        if row == -1 || prefix > end {
            return Err(INVALID);
        }
        if prefix < r.cache_protected_len {
            return Err(STATE);
        }
        self.guard_idle(row, "free_tail")?;
        self.guard_floor(row, prefix, end, "free_tail")?;
        let mut fx = vec![];
        self.apply_free_tail(r, prefix, &mut fx);
        self.clamp(row, prefix, end, "free_tail");
        Ok((fx, Out::None))
    }

    // --- the session operations -------------------------------------------------------------

    pub fn op_match(&mut self, key: Key, req: &mut skv_req, key_len: u32, pre_aborted: bool) -> Res {
        self.check(req)?;
        let miss = Ok((vec![], Out::Match(0, 0)));
        let Some(slot) = self.slots.get(&key).cloned() else { return miss };
        if pre_aborted {
            return miss;
        }
        let holds = req.req_pool_idx == slot.row;
        // A req matched against a slot holds no row or the slot's own.
        if req.req_pool_idx != -1 && !holds {
            note("match: req holds another row");
            return Err(STATE);
        }
        // One running request per slot: only its own req (holding the row) matches again.
        if slot.in_flight && !holds {
            note("match: second request on a running session");
            return Err(STATE);
        }
        if self.aligned && self.ps > 1 {
            let a = floor_align(slot.committed.min(key_len), self.ps);
            if a < slot.protected || a == 0 {
                if slot.in_flight {
                    note("match: aligned release of a slot in flight");
                    return Err(STATE);
                }
                note("match: aligned release");
                let mut fx = vec![];
                Self::release(&slot, &mut fx);
                self.slots.remove(&key);
                return Ok((fx, Out::Match(0, 0)));
            }
        }
        let mut r = *req;
        r.req_pool_idx = slot.row;
        r.kv_committed_len = slot.committed;
        // A retry also frees what its first try extended; a req holding an idle slot's row is
        // a stale copy whose lengths count for nothing.
        r.kv_allocated_len = if slot.in_flight {
            note(if req.kv_allocated_len > slot.allocated { "match: retry past the slot" } else { "match: retry" });
            slot.allocated.max(req.kv_allocated_len)
        } else {
            if holds {
                note(if req.kv_allocated_len != slot.allocated {
                    "match: stale copy, lengths ignored"
                } else {
                    "match: stale copy"
                });
            }
            slot.allocated
        };
        r.cache_protected_len = slot.protected;
        r.swa_evicted_seqlen = slot.swa;
        (r.lock_node, r.lock_receipt) = slot.lock;
        r.aux_state = slot.aux;
        r.aux_track = slot.track;
        let mut prefix = slot.committed.min(key_len);
        if prefix < slot.protected {
            note("match: prefix below protected");
            return Err(STATE);
        }
        if self.ps > 1 && r.swa_evicted_seqlen > prefix && !prefix.is_multiple_of(self.ps) {
            note("match: swa floors the prefix");
        }
        if self.ps > 1 && (self.aligned || r.swa_evicted_seqlen > prefix) {
            prefix = floor_align(prefix, self.ps);
            r.kv_committed_len = r.kv_committed_len.min(prefix);
        }
        let mut fx = vec![];
        self.apply_free_tail(&mut r, prefix, &mut fx);
        let s = self.slots.get_mut(&key).unwrap();
        s.committed = r.kv_committed_len;
        s.allocated = r.kv_allocated_len;
        s.swa = r.swa_evicted_seqlen;
        s.in_flight = true;
        *req = r;
        Ok((fx, Out::Match(1, prefix)))
    }

    pub fn op_finished(&mut self, key: Key, req: &mut skv_req, aborted: bool) -> Res {
        self.check(req)?;
        let slot = self.slots.get(&key).cloned();
        let mut fx = vec![];
        if aborted {
            match slot {
                None if req.req_pool_idx == -1 => return Ok((fx, Out::None)),
                None => {
                    // A throwaway release never frees a row another slot holds.
                    if self.slot_holding(req.req_pool_idx).is_some() {
                        note("abort: first turn on another slot's row");
                        return Err(STATE);
                    }
                    let t = Slot {
                        row: req.req_pool_idx,
                        committed: req.kv_committed_len,
                        allocated: req.kv_allocated_len,
                        protected: req.cache_protected_len,
                        swa: req.swa_evicted_seqlen,
                        lock: (req.lock_node, req.lock_receipt),
                        aux: req.aux_state,
                        track: req.aux_track,
                        in_flight: false,
                        order: 0,
                    };
                    Self::release(&t, &mut fx);
                }
                Some(mut s) => {
                    if req.req_pool_idx != s.row {
                        return Err(STATE);
                    }
                    if !s.in_flight {
                        // An idle slot's req is a stale copy: release the slot's own record.
                        note("abort: idle slot");
                        if req.kv_allocated_len > s.allocated {
                            note("abort: idle slot, stale req past its end");
                        }
                    } else {
                        if req.kv_allocated_len > s.allocated {
                            note("abort: req past the slot");
                        }
                        // The running request's state: its extension and its handles.
                        s.allocated = s.allocated.max(req.kv_allocated_len);
                        s.aux = req.aux_state;
                        s.track = req.aux_track;
                    }
                    Self::release(&s, &mut fx);
                    self.slots.remove(&key);
                }
            }
            Self::reset(req);
            return Ok((fx, Out::None));
        }
        let fl = if req.finished_len >= 0 { req.finished_len as u32 } else { req.output_len };
        let t = self.trim_target(req, fl)?;
        let target = req.origin_input_len + fl;
        let row = req.req_pool_idx;
        match &slot {
            Some(s) if s.row != row => return Err(STATE),
            // A later turn comes through match_prefix: this req is stale, or already finished.
            Some(s) if !s.in_flight => {
                note("finish: idle slot (stale req)");
                return Err(STATE);
            }
            None if self.slot_holding(row).is_some() => {
                note("finish: first turn on another slot's row");
                return Err(STATE);
            }
            _ => {}
        }
        // The finish trims the running row like trim_overshoot.
        self.guard_floor(row, t, req.kv_allocated_len, "finish")?;
        self.apply_trim(req, t, fl, &mut fx);
        let s = match slot {
            Some(mut s) => {
                s.committed = req.kv_committed_len;
                s.allocated = req.kv_allocated_len;
                s.swa = req.swa_evicted_seqlen;
                s.aux = req.aux_state;
                s.track = req.aux_track;
                s
            }
            None => {
                self.next_order += 1;
                Slot {
                    row,
                    committed: req.kv_committed_len,
                    allocated: req.kv_allocated_len,
                    protected: req.cache_protected_len,
                    swa: req.swa_evicted_seqlen,
                    lock: (req.lock_node, req.lock_receipt),
                    aux: req.aux_state,
                    track: req.aux_track,
                    in_flight: false,
                    order: self.next_order,
                }
            }
        };
        let s = Slot { committed: target.min(s.allocated), in_flight: false, ..s };
        self.slots.insert(key, s);
        Self::reset(req);
        Ok((fx, Out::None))
    }

    pub fn op_checkpoint(&mut self, key: Key, req: &skv_req) -> Res {
        self.check(req)?;
        Ok((vec![], Out::Handled(self.slots.contains_key(&key) as u32)))
    }

    pub fn op_release(&mut self, session: u64, branch: Option<u64>) -> Res {
        let mut keys: Vec<(u64, Key)> = (self.slots.iter())
            .filter(|(k, _)| k.0 == session && branch.is_none_or(|b| k.1 == b))
            .map(|(k, s)| (s.order, *k))
            .collect();
        keys.sort();
        if keys.iter().any(|(_, k)| self.slots[k].in_flight) {
            return Err(STATE);
        }
        let mut fx = vec![];
        for (_, k) in keys {
            Self::release(&self.slots.remove(&k).unwrap(), &mut fx);
        }
        Ok((fx, Out::None))
    }

    /// skv_held's fields in declaration order.
    pub fn held(&self, active: &[i32]) -> [u64; 6] {
        let mut h = [0, 0, 0, 0, self.slots.len() as u64, 0];
        for s in self.slots.values().filter(|s| !active.contains(&s.row)) {
            let end = ceil_align(s.allocated, self.ps);
            h[0] += end - s.protected as u64;
            h[1] += end - s.protected.max(s.swa) as u64;
            h[2] += 1;
            h[3] += (s.aux != -1) as u64;
            h[5] += [s.aux, s.track[0], s.track[1]].iter().filter(|&&a| a != -1).count() as u64;
        }
        h
    }
}

pub fn note(what: &str) {
    COVERAGE.with_borrow_mut(|c| *c.entry(format!("model: {what}")).or_default() += 1);
}

thread_local! {
    pub static COVERAGE: std::cell::RefCell<BTreeMap<String, u64>> = const { std::cell::RefCell::new(BTreeMap::new()) };
}

/// Runs `f` without counting the paths it takes: a prediction the driver may not act on.
pub fn quietly<T>(f: impl FnOnce() -> T) -> T {
    let saved = COVERAGE.with_borrow(|c| c.clone());
    let out = f();
    COVERAGE.with_borrow_mut(|c| *c = saved);
    out
}
