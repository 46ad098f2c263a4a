//! Recurrent handles given twice in one req (`aux_state`, `aux_track[0]`, `aux_track[1]`):
//! SKV_ERR_INVALID_ARG, nothing changed, at every call that checks a req against its row's
//! record; the per-step calls (`skv_alloc_extend`, `skv_commit`, the batches) never look at
//! them and must answer as for the req without. A release that ran `free_aux` twice for one
//! handle is the engine's finding (`engine::free_aux`).

use std::ptr::null_mut;

use skv::skv_status::*;
use skv::*;

use super::engine::Pools;
use super::{show, Expect, World, REQS, SESSIONS};

/// The calls that check a req against its row's record, as the fuzzer makes them.
pub(super) const CHECKED: [&str; 11] = [
    "skv_match_prefix",
    "skv_cache_finished_req",
    "skv_hand_back",
    "skv_checkpoint",
    "skv_trim_overshoot",
    "skv_free_tail",
    "skv_swa_evict",
    "skv_free_req",
    "skv_alloc_row",
    "skv_map_prefix",
    "skv_publish_prefix",
];

impl World {
    pub(super) fn op_doubled_handles(&mut self, s: usize) -> skv_status {
        let i = self.pick_req(s, true);
        let fr = self.sides[s].reqs[i];
        if fr.r.req_pool_idx < 0 {
            return SKV_OK;
        }
        let q = self.doubled_handle(s, fr.r);
        if self.rng.chance(300) || !self.probes.doubled_handles {
            return self.doubled_per_step(s, i, q);
        }
        let name = self.rng.pick(&CHECKED);
        let want = self.refusal_of(s, name, SKV_ERR_INVALID_ARG);
        let st = self.checked_call(s, name, q, want, "doubled handle");
        if st == SKV_ERR_INVALID_ARG {
            *self.cover.entry("a recurrent handle given twice refused").or_default() += 1;
        }
        st
    }

    /// What a checked call refuses a req with for `why` on this side: SKV_ERR_UNSUPPORTED
    /// first where the call is not available (docs/conventions.md, Precedence).
    pub(super) fn refusal_of(&self, s: usize, name: &str, why: skv_status) -> skv_status {
        let side = &self.sides[s];
        let owned_only = matches!(name, "skv_free_req" | "skv_alloc_row" | "skv_map_prefix" | "skv_publish_prefix");
        let no_window = match side.owned {
            true => !side.swa(),
            false => !matches!(side.pools, Pools::Hybrid { .. }),
        };
        match (owned_only && !side.owned) || (name == "skv_swa_evict" && no_window) {
            true => SKV_ERR_UNSUPPORTED,
            false => why,
        }
    }

    /// One of `CHECKED` on a copy of a req (honest arguments otherwise), which must return
    /// `want`, nothing changed.
    pub(super) fn checked_call(
        &mut self,
        s: usize,
        name: &str,
        mut q: skv_req,
        want: skv_status,
        why: &str,
    ) -> skv_status {
        let c = self.sides[s].c;
        let (sid, b) = (self.rng.below(SESSIONS), self.rng.below(2));
        let (alloc, prot, out) = (q.kv_allocated_len, q.cache_protected_len, q.output_len);
        let arg = match name {
            "skv_match_prefix" => self.rng.upto(q.kv_committed_len),
            "skv_cache_finished_req" => self.rng.below(2) as u32,
            "skv_trim_overshoot" => self.rng.upto(out),
            "skv_free_tail" => prot + self.rng.upto(alloc.saturating_sub(prot)),
            "skv_swa_evict" => 1 + self.rng.upto(8),
            _ => 0,
        };
        let desc = format!("{name}({why}: {}, s {sid} b {b}, arg {arg})", show(&q));
        let qp: *mut skv_req = &mut q;
        self.honest = false;
        // SAFETY: c is the side's live handle; qp points at the local q; the out-values are
        // locals; map_prefix gets the empty array (NULL, 0).
        self.call(s, desc, qp, Expect::Is(want), || unsafe {
            let (mut m, mut h, mut freed) = (skv_match { hit: 0, prefix_len: 0 }, 0u32, 0u32);
            match name {
                "skv_match_prefix" => skv_match_prefix(c, sid, b, qp, arg, 0, &mut m),
                "skv_cache_finished_req" => skv_cache_finished_req(c, sid, b, qp, arg),
                "skv_hand_back" => skv_hand_back(c, sid, b, qp),
                "skv_checkpoint" => skv_checkpoint(c, sid, b, qp, &mut h),
                "skv_trim_overshoot" => skv_trim_overshoot(c, qp, arg),
                "skv_free_tail" => skv_free_tail(c, qp, arg),
                "skv_swa_evict" => skv_swa_evict(c, qp, alloc, arg, 0, -1, 0, &mut freed),
                "skv_free_req" => skv_free_req(c, qp),
                "skv_alloc_row" => skv_alloc_row(c, qp),
                "skv_map_prefix" => skv_map_prefix(c, qp, std::ptr::null(), 0),
                _ => skv_publish_prefix(c, qp, prot),
            }
        })
    }

    /// A per-step call on the req with a handle doubled: it answers as for the req without
    /// (a refusal is checked against that req's own answer, the call made again with it) and
    /// leaves the handles as they were.
    fn doubled_per_step(&mut self, s: usize, i: usize, q: skv_req) -> skv_status {
        let (c, ps) = (self.sides[s].c, self.sides[s].ps());
        let fr = self.sides[s].reqs[i];
        let extend = self.rng.chance(500);
        let n = match extend {
            true => self.rng.upto(2 * ps),
            false => self.rng.upto(fr.r.kv_allocated_len.saturating_sub(fr.r.kv_committed_len)),
        };
        let name = if extend { "skv_alloc_extend" } else { "skv_commit" };
        // SAFETY: c is the side's live handle and r a local req; out_loc is NULL.
        let step = move |r: *mut skv_req| unsafe {
            match extend {
                true => skv_alloc_extend(c, r, n, null_mut()),
                false => skv_commit(c, r, n),
            }
        };
        let mut d = q;
        let dp: *mut skv_req = &mut d;
        let st = self.call(s, format!("{name}(doubled handle: {}, {n})", show(&q)), dp, Expect::Any, || step(dp));
        if st != SKV_OK {
            // Nothing changed: the req without the doubled handle must be refused alike.
            let mut h = fr.r;
            let hp: *mut skv_req = &mut h;
            let desc = format!("{name}(as the req without the doubled handle: {}, {n})", show(&h));
            return self.call(s, desc, hp, Expect::Is(st), || step(hp));
        }
        if (d.aux_state, d.aux_track) != (q.aux_state, q.aux_track) {
            self.fail(&format!("{name} changed the req's recurrent handles: {} -> {}", show(&q), show(&d)));
        }
        let side = &mut self.sides[s];
        (d.aux_state, d.aux_track) = (fr.r.aux_state, fr.r.aux_track);
        side.reqs[i].r = d;
        for j in (0..REQS).filter(|&j| j != i) {
            if side.reqs[j].r.req_pool_idx == d.req_pool_idx {
                side.reqs[j].matched = None;
            }
        }
        *self.cover.entry("a per-step call took a req with a handle given twice").or_default() += 1;
        st
    }
}
