//! Hybrid pools (docs/hybrid.md): `skv_swa_evict` with random windows, intervals, retain floors
//! and flags, checked against sglang's `free_swa_out_of_window_slots` (as `tests/prop_swa.rs`
//! ports it), and the reqs of a `free_kv_segment`-less caller of the hybrid ABI whose window
//! has freed positions, which libskv must refuse.

use std::ptr::null;

use skv::skv_status::*;
use skv::*;

use super::{Expect, FReq, Pools, World, REQS};

fn align_up(x: u64, ps: u32) -> u64 {
    x.div_ceil(ps as u64) * ps as u64
}

/// sglang's `swa_dead_lo`: below it the window never frees.
pub fn dead_lo(r: &skv_req, ps: u32) -> u32 {
    let lo = r.cache_protected_len.max(r.swa_evict_floor);
    if ps > 1 && lo > r.cache_protected_len {
        align_up(lo as u64, ps).min(u32::MAX as u64) as u32
    } else {
        lo
    }
}

/// `free_swa_out_of_window_slots`: the cursor after the step and the positions it frees.
fn evict(r: &skv_req, ps: u32, pre_len: u32, window: u32, interval: u32, retain: i64, flags: u32) -> (u32, u32) {
    let (pre, size, cur) = (pre_len as i64, window as i64, r.swa_evicted_seqlen);
    if pre - size < cur as i64 + interval as i64 {
        return (cur, 0);
    }
    let evicted = cur.max(dead_lo(r, ps));
    let sharing = flags & SKV_SWA_NO_PREFIX_SHARING == 0;
    let mut thr = if sharing { pre - align_up(window.max(ps) as u64, ps) as i64 } else { pre - size };
    if retain >= 0 && sharing {
        thr = thr.min(retain);
    }
    let mut new = thr.max(evicted as i64);
    if ps > 1 {
        new = new / ps as i64 * ps as i64;
    }
    match new > evicted as i64 {
        true => (new as u32, new as u32 - evicted),
        false => (evicted, 0),
    }
}

impl World {
    /// A window step on any side: SKV_ERR_UNSUPPORTED unless external with free_kv_segment or
    /// owned with an SWA pool.
    pub(super) fn op_swa_evict(&mut self, s: usize) -> skv_status {
        let i = self.pick_req(s, true);
        let side = &self.sides[s];
        let (ps, hybrid) = (side.ps(), side.swa() || (!side.owned && matches!(side.pools, Pools::Hybrid { .. })));
        // A row a ticket copies drains what the window frees: it counts as freed.
        let swa_free = side.stats().swa_free_pages + super::tier::snap(side.c).0.swa_draining_pages;
        let r = side.reqs[i].r;
        let alloc = r.kv_allocated_len;
        let mut bad = false;
        let pre_len = match self.rng.below(10) {
            0 => {
                bad = true;
                alloc.saturating_add(1 + self.rng.upto(3))
            }
            1..=5 => alloc,
            _ => self.rng.upto(alloc),
        };
        let window = match self.rng.below(12) {
            0 => {
                bad = true;
                0
            }
            1 => u32::MAX,
            _ => 1 + self.rng.upto(3 * ps + 6),
        };
        let interval = match self.rng.below(4) {
            0 => self.rng.upto(2 * ps),
            _ => 0,
        };
        let retain: i64 = match self.rng.below(10) {
            0 => {
                bad = true;
                self.rng.pick(&[-2, i64::MIN])
            }
            1 | 2 => self.rng.upto(alloc) as i64,
            _ => -1,
        };
        let flags = match self.rng.below(10) {
            0 => {
                bad = true;
                self.rng.pick(&[2, u32::MAX])
            }
            1..=3 => SKV_SWA_NO_PREFIX_SHARING,
            _ => 0,
        };
        self.want = Some(match (hybrid, bad) {
            (false, _) => (Expect::Is(SKV_ERR_UNSUPPORTED), true),
            (true, true) => (Expect::Fail, false),
            (true, false) => (Expect::Any, false),
        });
        let mut freed = u32::MAX;
        let fp: *mut u32 = if self.rng.chance(200) { std::ptr::null_mut() } else { &mut freed };
        let args = format!(", pre {pre_len}, window {window}, interval {interval}, retain {retain}, flags {flags}");
        // SAFETY: req_call passes the side's live handle and its local req; fp is NULL or points
        // at the local freed.
        let (st, mutated) = self.req_call(s, i, "skv_swa_evict", args, |c, q| unsafe {
            skv_swa_evict(c, q, pre_len, window, interval, retain, flags, fp)
        });
        if self.completed(st) && !mutated {
            // The in-flight slot's cursor follows the step: skv_hand_back compares with it.
            let fr = &mut self.sides[s].reqs[i];
            if let Some(m) = fr.matched.as_mut() {
                m.swa_evicted_seqlen = fr.r.swa_evicted_seqlen;
            }
        }
        if st != SKV_OK || mutated {
            return st;
        }
        let after = self.sides[s].reqs[i].r;
        if r.req_pool_idx < 0 {
            if after != r || (!fp.is_null() && freed != 0) {
                self.fail("skv_swa_evict on a req holding no row changed something");
            }
            return st;
        }
        let (cursor, n) = evict(&r, ps, pre_len, window, interval, retain, flags);
        // Owned mode: the SWA pages of the positions passed (whole pages) are free again.
        let engine_freed = match self.sides[s].owned {
            true => (self.sides[s].stats().swa_free_pages + super::tier::snap(self.sides[s].c).0.swa_draining_pages)
                .wrapping_sub(swa_free)
                .wrapping_mul(ps as u64),
            false => self.sides[s].eng().swa_freed,
        };
        if after.swa_evicted_seqlen != cursor || (!fp.is_null() && freed != n) || engine_freed != n as u64 {
            self.fail(&format!(
                "skv_swa_evict: cursor {}, freed {freed} (engine saw {engine_freed}); sglang's step: cursor {cursor}, {n} freed",
                after.swa_evicted_seqlen
            ));
        }
        if n > 0 {
            *self.cover.entry("swa_evict freed SWA pages").or_default() += 1;
            if self.sides[s].owned {
                *self.cover.entry("owned swa_evict gave SWA pages back").or_default() += 1;
            }
        }
        st
    }

    /// struct_size 56, free_kv_segment NULL: a copy of a req gets a cursor the window moved
    /// (so said; the engine keeps no SWA pool here). Past swa_dead_lo (positions the window
    /// freed, which libskv could only hand back through free_kv, a second time) every call
    /// that checks the req against its row's record refuses it, SKV_ERR_INVALID_ARG (the
    /// window step: SKV_ERR_UNSUPPORTED), nothing changed, so no slot ever keeps such a cursor;
    /// at swa_dead_lo a tail free, a trim or an abort of a first turn runs as it would.
    pub(super) fn op_no_segment(&mut self, s: usize) -> skv_status {
        if self.sides[s].pools != Pools::NoSegment {
            return self.op_swa_evict(s);
        }
        // A later turn, when there is one, half the time.
        let hits: Vec<usize> = (0..REQS).filter(|&i| self.sides[s].reqs[i].hit.is_some()).collect();
        if self.probes.no_segment_cursor && !hits.is_empty() && self.rng.chance(500) {
            let i = self.rng.pick(&hits);
            let key = self.sides[s].reqs[i].hit.expect("a hit");
            return self.grown_protected(s, i, key);
        }
        let i = self.pick_req(s, true);
        let side = &self.sides[s];
        let (c, ps, fr) = (side.c, side.ps(), side.reqs[i]);
        if fr.r.req_pool_idx < 0 {
            return SKV_OK;
        }
        let mut q = fr.r;
        if self.rng.chance(300) {
            q.swa_evict_floor = self.rng.upto(q.kv_allocated_len);
        }
        let (dl, alloc, prot) = (dead_lo(&q, ps), q.kv_allocated_len, q.cache_protected_len);
        let past = self.probes.no_segment_cursor && alloc > dl && (fr.hit.is_some() || self.rng.chance(700));
        if past {
            let k = 1 + self.rng.upto((alloc - dl) / ps);
            q.swa_evicted_seqlen = (dl + k * ps).min(alloc);
            let name = self.rng.pick(&super::handles::CHECKED[..7]);
            let want = self.refusal_of(s, name, SKV_ERR_INVALID_ARG);
            let st = self.checked_call(s, name, q, want, "cursor past swa_dead_lo");
            if st == SKV_ERR_INVALID_ARG {
                *self.cover.entry("cursor past swa_dead_lo refused without free_kv_segment").or_default() += 1;
            }
            return st;
        }
        // A slot in flight would keep the req's state: the model follows only first turns here.
        if fr.hit.is_some() {
            return SKV_OK;
        }
        q.swa_evicted_seqlen = dl.min(alloc);
        let qp: *mut skv_req = &mut q;
        let st = match self.rng.below(3) {
            0 => {
                let p = prot + self.rng.upto(alloc - prot);
                let desc = format!("skv_free_tail(cursor at swa_dead_lo, {}, prefix_len {p})", super::show(&q));
                // SAFETY: c is the side's live handle; qp points at the local q.
                self.call(s, desc, qp, Expect::Any, || unsafe { skv_free_tail(c, qp, p) })
            }
            1 => {
                let fl = self.rng.upto(q.output_len);
                let desc = format!("skv_trim_overshoot(cursor at swa_dead_lo, {}, finished_len {fl})", super::show(&q));
                // SAFETY: c is the side's live handle; qp points at the local q.
                self.call(s, desc, qp, Expect::Any, || unsafe { skv_trim_overshoot(c, qp, fl) })
            }
            _ => {
                let (sid, b) = (self.session(), self.branch());
                // A first turn's abort releases a throwaway slot made from the req: only where
                // the key has no slot.
                if self.usage_slots(s, sid, b) != 0 {
                    return SKV_OK;
                }
                let desc = format!(
                    "skv_cache_finished_req(cursor at swa_dead_lo, {}, s {sid} b {b}, aborted)",
                    super::show(&q)
                );
                // SAFETY: c is the side's live handle; qp points at the local q.
                self.call(s, desc, qp, Expect::Any, || unsafe { skv_cache_finished_req(c, sid, b, qp, 1) })
            }
        };
        if self.completed(st) {
            // The engine keeps no SWA pool: it takes its cursor back.
            (q.swa_evicted_seqlen, q.swa_evict_floor) = (fr.r.swa_evicted_seqlen, fr.r.swa_evict_floor);
            let epoch = if q.req_pool_idx >= 0 { fr.epoch } else { 0 };
            self.sides[s].reqs[i] = FReq { r: q, epoch, hit: None, matched: None };
        }
        st
    }

    /// A later turn (a hit) whose engine raised cache_protected_len above the slot's and moved
    /// its cursor up to its own swa_dead_lo, which lies past the slot's: a finish would save a
    /// cursor the slot's protected length cannot free around, and is refused
    /// (SKV_ERR_INVALID_ARG); an abort releases at the slot's protected length and cannot split
    /// there without free_kv_segment (SKV_ERR_UNSUPPORTED). Nothing changes either way.
    fn grown_protected(&mut self, s: usize, i: usize, (sid, b): (u64, u64)) -> skv_status {
        let side = &self.sides[s];
        let (c, ps, mut q) = (side.c, side.ps(), side.reqs[i].r);
        let slot_dl = dead_lo(&q, ps);
        // A page boundary past the slot's swa_dead_lo, within what was committed.
        let lo = slot_dl / ps + 1;
        let hi = q.kv_committed_len / ps;
        if lo > hi || q.swa_evict_floor > q.cache_protected_len {
            return SKV_OK;
        }
        q.cache_protected_len = (lo + self.rng.upto(hi - lo)) * ps;
        q.swa_evicted_seqlen = dead_lo(&q, ps);
        let aborted = self.rng.chance(400);
        let desc = format!(
            "skv_cache_finished_req(protected grown past the slot's, {}, s {sid} b {b}, aborted {})",
            super::show(&q),
            aborted as u32
        );
        let qp: *mut skv_req = &mut q;
        // SAFETY: c is the side's live handle; qp points at the local q.
        let st =
            self.call(s, desc, qp, Expect::Fail, || unsafe { skv_cache_finished_req(c, sid, b, qp, aborted as u32) });
        let want = if aborted { SKV_ERR_UNSUPPORTED } else { SKV_ERR_INVALID_ARG };
        if st == want {
            *self.cover.entry("a cursor past the slot's swa_dead_lo refused without free_kv_segment").or_default() += 1;
        }
        st
    }

    fn usage_slots(&self, s: usize, sid: u64, b: u64) -> u64 {
        let mut u = skv_usage {
            slots: 0,
            in_flight: 0,
            allocated_tokens: 0,
            committed_tokens: 0,
            protected_tokens: 0,
            pages: 0,
            freeable_pages: 0,
        };
        // SAFETY: a live handle and a local.
        assert_eq!(unsafe { skv_branch_usage(self.sides[s].c, sid, b, &mut u) }, SKV_OK);
        u.slots
    }
}

impl World {
    /// Owned mode's SWA views, with random (sometimes bad) arguments: SKV_ERR_UNSUPPORTED
    /// without an SWA pool.
    pub(super) fn op_swa_views(&mut self, s: usize) -> skv_status {
        match self.rng.chance(500) {
            true => self.op_row_swa_indices(s),
            false => self.op_flashinfer_swa(s),
        }
    }

    /// skv_row_swa_indices; on a req that agrees with its row's record (a `skv_commit` of 0
    /// takes it), every position the window has not passed has an SWA slot, a page the window
    /// passed whole has none, and a page's positions share one SWA page.
    fn op_row_swa_indices(&mut self, s: usize) -> skv_status {
        let i = self.pick_req(s, true);
        let side = &self.sides[s];
        let (c, ps, max, swa, rows) = (side.c, side.ps(), side.max_ctx(), side.swa(), side.cfg.num_rows);
        let r = side.reqs[i].r;
        let honest = r.req_pool_idx >= 0 && swa && !self.rng.chance(200);
        let (row, start, end) = if honest {
            (r.req_pool_idx, 0, r.kv_allocated_len)
        } else {
            let row = if self.rng.chance(300) { self.bad_row(s) } else { self.rng.below(rows as u64) as i32 };
            let start = self.rng.upto(max);
            let end = if self.rng.chance(100) { self.rng.upto(start) } else { start + self.rng.upto(max + 4 - start) };
            (row, start, end)
        };
        let expect = match (swa, row) {
            (false, 0..) => Expect::Is(SKV_ERR_UNSUPPORTED),
            _ => Expect::Any,
        };
        let mut out = vec![-7i32; max as usize + 8];
        let desc = format!("skv_row_swa_indices({row}, {start}, {end})");
        // SAFETY: c is the side's live handle; out holds max + 8 entries, at least end - start.
        let st =
            self.call(s, desc, null(), expect, || unsafe { skv_row_swa_indices(c, row, start, end, out.as_mut_ptr()) });
        if st != SKV_OK || !honest {
            return st;
        }
        let mut q = r;
        // SAFETY: c is the side's live handle; q is a local.
        let agrees = self
            .call(s, format!("skv_commit(req#{i}, 0)"), null(), Expect::Any, || unsafe { skv_commit(c, &mut q, 0) });
        if agrees != SKV_OK {
            return st;
        }
        // A page may lack its SWA page only where the window passed all of it.
        let (lo, cursor) = (dead_lo(&r, ps), r.swa_evicted_seqlen);
        let hi = cursor.max(lo);
        for (p, &x) in (0..end).zip(&out) {
            let page = p / ps;
            let same_page = p % ps == 0 || out[p as usize - 1] == x - 1;
            let slot = x > 0 && x as u32 % ps == p % ps && same_page;
            let ok = match (page * ps >= lo, (page + 1) * ps <= hi) {
                // the protected prefix: the engine-held page's, if it has one
                (false, _) => x == 0 || slot,
                (true, true) => x == 0,
                (true, false) => slot,
            };
            if !ok {
                self.fail(&format!(
                    "row {row} position {p}: SWA slot {x} (swa_dead_lo {lo}, cursor {cursor}): {:?}",
                    &out[..end as usize]
                ));
            }
        }
        *self.cover.entry("swa view of a running row checked").or_default() += 1;
        st
    }

    /// skv_build_flashinfer_swa: the layout skv_build_flashinfer gives, each full page with
    /// one SWA page (0 where the window passed), no SWA page under two full pages.
    fn op_flashinfer_swa(&mut self, s: usize) -> skv_status {
        let side = &self.sides[s];
        let (c, swa, n_rows) = (side.c, side.swa(), side.cfg.num_rows as i32);
        let mut rows: Vec<i32> = side.reqs.iter().map(|f| f.r.req_pool_idx).filter(|&r| r >= 0).collect();
        let bad = self.rng.chance(100);
        if bad {
            rows.push(self.rng.pick(&[-1, n_rows]));
        } else if self.rng.chance(50) {
            rows.push(self.rng.below(n_rows as u64) as i32); // perhaps not in use
        }
        let cap = if self.rng.chance(200) { self.rng.upto(8) as usize } else { 4096 };
        let layout = |swa: bool, out: &mut [Vec<i32>; 3], needed: &mut usize| {
            // SAFETY: c is the side's live handle; the three vectors hold rows.len() + 1, cap and
            // rows.len() entries.
            unsafe {
                let f = if swa { skv_build_flashinfer_swa } else { skv_build_flashinfer };
                let [indptr, idx, last] = out;
                f(c, rows.as_ptr(), rows.len(), indptr.as_mut_ptr(), idx.as_mut_ptr(), last.as_mut_ptr(), cap, needed)
            }
        };
        let fresh = || [vec![-7i32; rows.len() + 1], vec![-7i32; cap], vec![-7i32; rows.len()]];
        let (mut got, mut needed) = (fresh(), 0usize);
        let expect = match (swa, bad) {
            (false, false) => Expect::Is(SKV_ERR_UNSUPPORTED),
            (true, true) => Expect::Fail,
            _ => Expect::Any,
        };
        let desc = format!("skv_build_flashinfer_swa({rows:?}, cap {cap})");
        let st = self.call(s, desc, null(), expect, || layout(true, &mut got, &mut needed));
        if st != SKV_OK {
            return st;
        }
        let (mut full, mut full_needed) = (fresh(), 0usize);
        if layout(false, &mut full, &mut full_needed) != SKV_OK || full_needed != needed {
            self.fail("skv_build_flashinfer refused the rows skv_build_flashinfer_swa took");
        }
        let mut swa_of = std::collections::HashMap::new();
        let mut full_of = std::collections::HashMap::new();
        for (&f, &w) in full[1][..needed].iter().zip(&got[1][..needed]) {
            let twice = *swa_of.entry(f).or_insert(w) != w || (w != 0 && *full_of.entry(w).or_insert(f) != f);
            if twice {
                self.fail(&format!(
                    "full page {f} / SWA page {w}: the layouts disagree\n  full {full:?}\n  swa {got:?}"
                ));
            }
        }
        if got[0] != full[0] || got[2] != full[2] {
            self.fail(&format!(
                "skv_build_flashinfer_swa's indptr or last page lengths differ\n  full {full:?}\n  swa {got:?}"
            ));
        }
        *self.cover.entry("flashinfer_swa checked against the full layout").or_default() += 1;
        st
    }
}
