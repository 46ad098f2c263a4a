//! The scheduler's calls: `skv_hand_back` on reqs a hit restored that never ran (the slot goes
//! idle, nothing is freed, nothing else changes) and on reqs it must refuse; the queries, which
//! never change anything and must agree with each other; and `skv_admission_pages`, whose
//! prediction is checked against the match and extension it foresees.

use std::ptr::{null, null_mut};

use skv::skv_status::*;
use skv::*;

use super::{init_req, Expect, FReq, World, HOSTILE_SESSIONS, REQS, SESSIONS};

/// What skv_hand_back compares with the slot's record of the match (docs/operations.md), and
/// the row it must hold.
fn unrun(r: &skv_req, m: &skv_req) -> bool {
    let key = |r: &skv_req| {
        (
            (r.req_pool_idx, r.row_generation),
            (r.kv_allocated_len, r.kv_committed_len, r.cache_protected_len, r.swa_evicted_seqlen),
            (r.aux_state, r.aux_track, r.lock_node, r.lock_receipt),
        )
    };
    key(r) == key(m)
}

/// The slot's record of a running request, as a primitive that shortened its row to `len`
/// leaves it.
pub(super) fn clamp_record(m: &mut skv_req, len: u32) {
    m.kv_allocated_len = m.kv_allocated_len.min(len);
    m.kv_committed_len = m.kv_committed_len.min(len);
    m.swa_evicted_seqlen = m.swa_evicted_seqlen.min(len);
}

/// An out-parameter no call writes: a failing query must leave it so.
const UNWRITTEN: u64 = 0xdead_beef;

fn usage_unwritten() -> skv_usage {
    skv_usage {
        slots: UNWRITTEN,
        in_flight: UNWRITTEN,
        allocated_tokens: UNWRITTEN,
        committed_tokens: UNWRITTEN,
        protected_tokens: UNWRITTEN,
        pages: UNWRITTEN,
        freeable_pages: UNWRITTEN,
    }
}

fn usage_fields(u: &skv_usage) -> [u64; 7] {
    [u.slots, u.in_flight, u.allocated_tokens, u.committed_tokens, u.protected_tokens, u.pages, u.freeable_pages]
}

impl World {
    /// A hand-back: of a hit that never ran (must succeed and change nothing but the slot's
    /// state and the req), of a req that ran, a first turn, a finished req or under the wrong key
    /// (must fail, changing nothing); a success is followed by the same req again, now a stale
    /// copy of a request already handed back.
    pub(super) fn op_hand_back(&mut self, s: usize) -> skv_status {
        let side = &self.sides[s];
        let hits: Vec<usize> = (0..REQS).filter(|&i| side.reqs[i].hit.is_some()).collect();
        let i = if !hits.is_empty() && self.rng.chance(700) { self.rng.pick(&hits) } else { self.pick_req(s, true) };
        let fr = self.sides[s].reqs[i];
        let (sid, b) = match fr.hit {
            Some(k) if self.rng.chance(850) => k,
            _ => (self.session(), self.branch()),
        };
        let side = &self.sides[s];
        // Owned mode: a second req on the row (a hostile mutation) may have moved it under this one.
        let shared = side.owned
            && ((0..REQS).any(|j| j != i && side.reqs[j].r.req_pool_idx == fr.r.req_pool_idx)
                || side.row_len(fr.r.req_pool_idx) != Some(fr.r.kv_allocated_len));
        let want = match (fr.hit, fr.matched) {
            _ if fr.r.req_pool_idx < 0 => Expect::Fail,
            (Some(k), _) if k == (sid, b) && shared => Expect::Any,
            (Some(k), Some(m)) if k == (sid, b) && unrun(&fr.r, &m) => Expect::Is(SKV_OK),
            // A hit whose match reported a failing callback after it took effect.
            (Some(k), None) if k == (sid, b) => Expect::Any,
            // Owned mode: a stale copy's match may have put this req on a slot unrecorded.
            (None, _) if side.owned => Expect::Any,
            _ => Expect::Fail,
        };
        let mut before = self.sides[s].snap();
        // A request whose restore failed is parked again (its device pages go); one whose
        // import failed (no host copy) ends its session.
        let w = super::tier::where_of(self.sides[s].c, sid, b);
        let failed = w.state & SKV_WHERE_FAILED != 0;
        let imported = failed && w.host_pages == 0;
        self.want = Some((want, false));
        let (st, mutated) =
            // SAFETY: req_call passes the side's live handle and its local req.
            self.req_call(s, i, "skv_hand_back", format!(", s {sid} b {b}"), |c, r| unsafe {
                skv_hand_back(c, sid, b, r)
            });
        if st != SKV_OK || mutated {
            return st;
        }
        let r = self.sides[s].reqs[i].r;
        let emptied = (r.req_pool_idx, r.row_generation, r.lock_node, r.lock_receipt, r.aux_state) == (-1, 0, 0, 0, -1)
            && (r.kv_allocated_len, r.kv_committed_len, r.cache_protected_len, r.swa_evicted_seqlen) == (0, 0, 0, 0);
        if !emptied {
            self.fail("skv_hand_back left the req holding something");
        }
        let mut after = self.sides[s].snap();
        // The slot's own place changes (in flight no more): the rest may not.
        (before.wheres, after.wheres) = (Vec::new(), Vec::new());
        let place = super::tier::where_of(self.sides[s].c, sid, b).place;
        if failed && !imported && place != SKV_PLACE_HOST {
            self.fail("skv_hand_back of a request whose restore failed did not park its slot again");
        }
        if imported && place != SKV_PLACE_NONE {
            self.fail("skv_hand_back of a request whose import failed did not end its session");
        }
        if !failed && before != after {
            self.fail(&format!("skv_hand_back changed more than the slot:\n  before {before:?}\n  after  {after:?}"));
        }
        *self.cover.entry("hand_back of an unrun hit").or_default() += 1;
        // The same req again: a stale copy of a request already handed back.
        let mut copy = fr.r;
        let cp: *mut skv_req = &mut copy;
        let c = self.sides[s].c;
        // A session that ended with its hand-back left no row for the copy to name.
        let stale = if imported { Expect::Fail } else { Expect::Is(SKV_ERR_STATE) };
        // SAFETY: c is the side's live handle; cp points at the local copy.
        self.call(s, format!("skv_hand_back(stale copy, s {sid} b {b})"), cp, stale, || unsafe {
            skv_hand_back(c, sid, b, cp)
        });
        st
    }

    /// One query; whatever it returns, the state after it is the state before it.
    pub(super) fn op_queries(&mut self, s: usize) -> skv_status {
        let before = self.sides[s].snap();
        let st = match self.rng.below(6) {
            0 => self.q_session_usage(s),
            1 => self.q_branch_usage(s),
            2 | 3 => self.q_idle(s),
            4 => self.q_null(s),
            _ => {
                let c = self.sides[s].c;
                // SAFETY: skv_stats is plain integers, so all zero is a valid value.
                let mut st_ = unsafe { std::mem::zeroed::<skv_stats>() };
                let sp: *mut skv_stats = &mut st_;
                // SAFETY: c is the side's live handle; sp points at the local st_.
                let st = self.call(s, "skv_cache_stats".into(), null(), Expect::Is(SKV_OK), || unsafe {
                    skv_cache_stats(c, sp)
                });
                let side = &self.sides[s];
                if st_.total_rows != side.cfg.num_rows || (!side.owned && st_.sessions != before.held.sessions) {
                    self.fail(&format!("skv_cache_stats: {st_:?} (rows {})", side.cfg.num_rows));
                }
                st
            }
        };
        let after = self.sides[s].snap();
        if before != after {
            self.fail(&format!("a query changed the state:\n  before {before:?}\n  after  {after:?}"));
        }
        st
    }

    /// skv_session_usage or skv_branch_usage, called directly (a helper of the checks).
    fn usage(&self, s: usize, sid: u64, b: Option<u64>) -> skv_usage {
        let c = self.sides[s].c;
        let mut u = usage_unwritten();
        // SAFETY: c is the side's live handle; u is a local.
        let st = unsafe {
            match b {
                None => skv_session_usage(c, sid, &mut u),
                Some(b) => skv_branch_usage(c, sid, b, &mut u),
            }
        };
        if st != SKV_OK {
            self.fail(&format!("usage of session {sid} branch {b:?} returned {st:?}"));
        }
        let ps = self.sides[s].ps() as u64;
        // A parked slot's row maps its protected prefix only; its record keeps what it
        // committed (its KV is on the host).
        let parked = (0..super::BRANCHES)
            .chain([u64::MAX])
            .filter(|&x| b.is_none_or(|b| b == x))
            .any(|x| super::tier::where_of(c, sid, x).place == SKV_PLACE_HOST);
        let sane = u.in_flight <= u.slots
            && (parked || u.committed_tokens <= u.allocated_tokens)
            && u.freeable_pages <= u.pages
            && u.pages <= u.allocated_tokens.div_ceil(ps) + u.slots
            && u.allocated_tokens <= u.pages * ps
            && (u.slots > 0 || usage_fields(&u) == [0; 7]);
        if !sane {
            self.fail(&format!("usage of session {sid} branch {b:?} does not add up: {u:?}"));
        }
        u
    }

    fn q_session_usage(&mut self, s: usize) -> skv_status {
        let (c, sid) = (self.sides[s].c, self.session());
        let mut u = usage_unwritten();
        let up: *mut skv_usage = &mut u;
        // SAFETY: c is the side's live handle; up points at the local u.
        let st = self.call(s, format!("skv_session_usage({sid})"), null(), Expect::Is(SKV_OK), || unsafe {
            skv_session_usage(c, sid, up)
        });
        // The branches the fuzzer uses: the session is their sum.
        let mut sum = [0u64; 7];
        for b in [0, 1, u64::MAX] {
            for (t, v) in sum.iter_mut().zip(usage_fields(&self.usage(s, sid, Some(b)))) {
                *t += v;
            }
        }
        if usage_fields(&u) != sum {
            self.fail(&format!("skv_session_usage({sid}) = {u:?}, its branches sum to {sum:?}"));
        }
        st
    }

    fn q_branch_usage(&mut self, s: usize) -> skv_status {
        let (c, sid, b) = (self.sides[s].c, self.session(), self.branch());
        let mut u = usage_unwritten();
        let up: *mut skv_usage = &mut u;
        // SAFETY: c is the side's live handle; up points at the local u.
        let st = self.call(s, format!("skv_branch_usage({sid}, {b})"), null(), Expect::Is(SKV_OK), || unsafe {
            skv_branch_usage(c, sid, b, up)
        });
        if u.slots > 1 || usage_fields(&u) != usage_fields(&self.usage(s, sid, Some(b))) {
            self.fail(&format!("skv_branch_usage({sid}, {b}) = {u:?}"));
        }
        st
    }

    /// The idle slots: as many as the usages say, each idle, none twice, the list cut at `cap`
    /// (a prefix of the whole list) and nothing written past it.
    fn q_idle(&mut self, s: usize) -> skv_status {
        let c = self.sides[s].c;
        let (mut slots, mut idle) = (0u64, 0u64);
        for sid in (0..SESSIONS).chain(HOSTILE_SESSIONS) {
            let u = self.usage(s, sid, None);
            // A parked slot is not on the device: the idle list leaves it out.
            let parked = [0, 1, u64::MAX]
                .into_iter()
                .filter(|&b| super::tier::where_of(c, sid, b).place == SKV_PLACE_HOST)
                .count() as u64;
            (slots, idle) = (slots + u.slots, idle + u.slots - u.in_flight - parked);
        }
        let held = self.sides[s].snap().held;
        if held.sessions != slots {
            self.fail(&format!("skv_session_held counts {} slots, the usages {slots}", held.sessions));
        }
        let mode = self.rng.below(3);
        let cap = match mode {
            0 => 0,
            1 => self.rng.below(idle + 1) as usize,
            _ => idle as usize + self.rng.upto(3) as usize,
        };
        let (mut sids, mut bids) = (vec![UNWRITTEN; cap + 2], vec![UNWRITTEN; cap + 2]);
        let (sp, bp) = match mode {
            0 => (null_mut(), null_mut()),
            _ => (sids.as_mut_ptr(), bids.as_mut_ptr()),
        };
        let mut count = usize::MAX;
        let np: *mut usize = &mut count;
        // SAFETY: c is the side's live handle; sp and bp hold cap + 2 entries (or are NULL with
        // cap 0); np points at the local count.
        let st = self.call(s, format!("skv_idle_sessions(cap {cap})"), null(), Expect::Is(SKV_OK), || unsafe {
            skv_idle_sessions(c, sp, bp, cap, np)
        });
        if count as u64 != idle {
            self.fail(&format!("skv_idle_sessions counts {count}, the usages {idle} idle slots"));
        }
        let n = cap.min(count);
        let mut keys: Vec<(u64, u64)> = sids[..n].iter().copied().zip(bids[..n].iter().copied()).collect();
        if sids[n..].iter().chain(&bids[n..]).any(|&v| v != UNWRITTEN) {
            self.fail(&format!("skv_idle_sessions(cap {cap}) wrote past {n} entries: {sids:?} {bids:?}"));
        }
        for &(sid, b) in &keys {
            let u = self.usage(s, sid, Some(b));
            if (u.slots, u.in_flight) != (1, 0) {
                self.fail(&format!("skv_idle_sessions lists ({sid}, {b}), whose usage is {u:?}"));
            }
        }
        if n < count {
            let (mut all_s, mut all_b, mut all) = (vec![0u64; count], vec![0u64; count], 0usize);
            // SAFETY: c is the side's live handle; both arrays hold count entries.
            let st = unsafe { skv_idle_sessions(c, all_s.as_mut_ptr(), all_b.as_mut_ptr(), count, &mut all) };
            let whole: Vec<(u64, u64)> = all_s.into_iter().zip(all_b).collect();
            if st != SKV_OK || all != count || whole[..n] != keys[..] {
                self.fail(&format!("skv_idle_sessions(cap {cap}) = {keys:?}, not a prefix of {whole:?}"));
            }
            *self.cover.entry("idle_sessions cut at cap").or_default() += 1;
        }
        keys.sort();
        keys.dedup();
        if keys.len() != n {
            self.fail("skv_idle_sessions lists a slot twice");
        }
        st
    }

    /// NULL arguments to the queries: SKV_ERR_NULL_ARG, nothing written.
    fn q_null(&mut self, s: usize) -> skv_status {
        let c = self.sides[s].c;
        let (mut ids, mut count, mut u) = ([UNWRITTEN; 2], 7usize, usage_unwritten());
        let (ip, np, up): (*mut u64, *mut usize, *mut skv_usage) = (ids.as_mut_ptr(), &mut count, &mut u);
        let which = self.rng.below(6);
        let names = [
            "skv_session_usage(NULL out)",
            "skv_branch_usage(NULL handle)",
            "skv_idle_sessions(NULL, NULL, 2)",
            "skv_idle_sessions(ids, NULL, 2)",
            "skv_idle_sessions(NULL count)",
            "skv_session_usage(NULL handle)",
        ];
        // SAFETY: c is the side's live handle; ip holds 2 entries; np and up point at locals;
        // each NULL is refused before use.
        let st = self.call(s, names[which as usize].into(), null(), Expect::Is(SKV_ERR_NULL_ARG), || unsafe {
            match which {
                0 => skv_session_usage(c, 1, null_mut()),
                1 => skv_branch_usage(null(), 1, 0, up),
                2 => skv_idle_sessions(c, null_mut(), null_mut(), 2, np),
                3 => skv_idle_sessions(c, ip, null_mut(), 2, np),
                4 => skv_idle_sessions(c, ip, ip, 1, null_mut()),
                _ => skv_session_usage(null(), 1, up),
            }
        });
        if ids != [UNWRITTEN; 2] || count != 7 || usage_fields(&u) != [UNWRITTEN; 7] {
            self.fail("a query refused with SKV_ERR_NULL_ARG wrote an out-parameter");
        }
        st
    }

    fn free_pages(&self, s: usize) -> u64 {
        // SAFETY: skv_stats is plain integers, so all zero is a valid value.
        let mut st = unsafe { std::mem::zeroed::<skv_stats>() };
        // SAFETY: a live handle and a local.
        assert_eq!(unsafe { skv_cache_stats(self.sides[s].c, &mut st) }, SKV_OK);
        st.free_pages
    }

    /// Owned mode: skv_admission_pages, then (often) the match and extension it predicts; when
    /// they succeed, free_pages moved by exactly pages_freed - pages_needed.
    pub(super) fn op_admission(&mut self, s: usize) -> skv_status {
        let side = &self.sides[s];
        let (c, max) = (side.c, side.max_ctx());
        let (sid, b) = (self.session(), self.branch());
        let total = if self.rng.chance(40) { self.huge_u32(max) } else { self.rng.upto(max) };
        let key = if self.rng.chance(40) { total.saturating_add(1 + self.rng.upto(3)) } else { self.rng.upto(total) };
        let expect = if total > max || key > total { Expect::Fail } else { Expect::Any };
        let mut a = skv_admission { hit: 7, prefix_len: 7, pages_needed: 7, pages_freed: 7 };
        let ap: *mut skv_admission = &mut a;
        let before = self.sides[s].snap();
        let desc = format!("skv_admission_pages(s {sid} b {b}, key {key}, total {total})");
        // SAFETY: c is the side's live handle; ap points at the local a.
        let st = self.call(s, desc, null(), expect, || unsafe { skv_admission_pages(c, sid, b, key, total, ap) });
        if self.sides[s].snap() != before {
            self.fail("skv_admission_pages changed the state");
        }
        if st != SKV_OK {
            if (a.hit, a.prefix_len, a.pages_needed, a.pages_freed) != (7, 7, 7, 7) {
                self.fail(&format!("a failing skv_admission_pages wrote {a:?}"));
            }
            return st;
        }
        let Some(i) = (0..REQS).find(|&i| self.sides[s].reqs[i].r.req_pool_idx < 0) else { return st };
        if self.rng.chance(300) {
            return st;
        }
        let f0 = self.free_pages(s);
        self.sides[s].reqs[i] = FReq { r: init_req(), epoch: 0, hit: None, matched: None };
        let mut m = skv_match { hit: 9, prefix_len: 9 };
        let mp: *mut skv_match = &mut m;
        self.no_mutate = true;
        let (mst, _) = self.req_call(
            s,
            i,
            "skv_match_prefix",
            format!(", s {sid} b {b}, key {key}, pre 0 (as admitted)"),
            // SAFETY: req_call passes the side's live handle and its local req; mp points at m.
            |c, r| unsafe { skv_match_prefix(c, sid, b, r, key, 0, mp) },
        );
        if mst != SKV_OK {
            return mst;
        }
        if m.hit != a.hit || (m.hit == 1 && m.prefix_len != a.prefix_len) {
            self.fail(&format!("skv_admission_pages predicted {a:?}, the match returned {m:?}"));
        }
        if m.hit == 1 {
            let fr = &mut self.sides[s].reqs[i];
            (fr.hit, fr.matched) = (Some((sid, b)), Some(fr.r));
        } else {
            self.no_mutate = true;
            if self.alloc_row_at(s, i) != SKV_OK {
                return SKV_OK;
            }
        }
        let n = total - self.sides[s].reqs[i].r.kv_allocated_len;
        self.no_mutate = true;
        // SAFETY: req_call passes the side's live handle and its local req; out_loc is NULL.
        let (est, _) = self.req_call(s, i, "skv_alloc_extend", format!(", {n} (as admitted)"), |c, r| unsafe {
            skv_alloc_extend(c, r, n, null_mut())
        });
        if est != SKV_OK {
            return est;
        }
        let f1 = self.free_pages(s);
        if f1 as i128 != f0 as i128 + a.pages_freed as i128 - a.pages_needed as i128 {
            self.fail(&format!("skv_admission_pages predicted {a:?}; free_pages went {f0} -> {f1}"));
        }
        *self.cover.entry("admission prediction checked").or_default() += 1;
        est
    }
}
