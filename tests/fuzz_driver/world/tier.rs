//! The host tier's calls (ABI 4): some owned worlds get a host tier (its pools and policy
//! fields random but valid) and every owned engine a `copy_pages` that queues its copies or
//! refuses them (`engine.rs`: a refusal must change nothing, which `World::call` checks with
//! the tier's stats and every session's place in the snapshot). Tickets are completed later in
//! random order, ok or failed; never-issued, done and zero tickets are refused; plain
//! skv_match_prefix on a parked session is SKV_ERR_STATE; the tier's moves on a handle without a
//! tier (or in external mode) are SKV_ERR_UNSUPPORTED; short out-structs and NULLs are refused.

use std::ptr::{null, null_mut};

use skv::skv_status::*;
use skv::*;

use super::{init_req, Expect, Rng, World, BRANCHES, HOSTILE_SESSIONS, SESSIONS};

/// A host tier for `cfg` (owned): pools of 2 pages up, the policy fields anywhere valid.
pub(super) fn host_tier(rng: &mut Rng, cfg: &mut skv_cache_config) {
    let ps = cfg.page_size as u64;
    let pages = cfg.num_token_slots / ps;
    // Some host pools hold a few pages only: parks then evict host copies, or cannot fit.
    let host = |rng: &mut Rng| (2 + if rng.chance(300) { rng.below(5) } else { rng.below(2 * pages) }) * ps;
    cfg.host_num_token_slots = host(rng);
    if cfg.swa_num_token_slots > 0 {
        cfg.host_swa_num_token_slots = host(rng);
    }
    cfg.tier_idle_steps = rng.pick(&[0, 1, 2, 5]);
    cfg.tier_min_tokens = rng.pick(&[0, 0, 1, cfg.page_size, 3 * cfg.page_size]);
    cfg.tier_pages_per_step = rng.pick(&[0, 1, 4, 64, 64]);
}

fn sessions() -> impl Iterator<Item = (u64, u64)> {
    (0..SESSIONS).chain(HOSTILE_SESSIONS).flat_map(|s| (0..BRANCHES).chain([u64::MAX]).map(move |b| (s, b)))
}

/// A pointer 4 bytes into `buf`: misaligned for any struct or u64 (refused before it is read).
fn misaligned<T>(buf: &mut [u64; 24]) -> *mut T {
    // SAFETY: 4 bytes into a 192-byte local, room left for any of the tier's outs.
    unsafe { (buf.as_mut_ptr() as *mut u8).add(4) as *mut T }
}

fn tier_stats0() -> skv_tier_stats {
    skv_tier_stats { struct_size: std::mem::size_of::<skv_tier_stats>() as u32, ..Default::default() }
}

fn where0() -> skv_where {
    skv_where { struct_size: std::mem::size_of::<skv_where>() as u32, ..Default::default() }
}

/// Where (session, branch) is, on a live handle.
pub(super) fn where_of(c: *const skv_cache, sid: u64, b: u64) -> skv_where {
    let mut w = where0();
    // SAFETY: a live handle and a local.
    assert_eq!(unsafe { skv_session_where(c, sid, b, &mut w) }, SKV_OK, "snapshot: skv_session_where");
    w
}

/// The tier's part of a snapshot: its stats and where every session the fuzzer names is.
pub(super) fn snap(c: *const skv_cache) -> (skv_tier_stats, Vec<skv_where>) {
    let mut st = tier_stats0();
    // SAFETY: a live handle and a local.
    assert_eq!(unsafe { skv_cache_tier_stats(c, &mut st) }, SKV_OK, "snapshot: skv_tier_stats");
    (st, sessions().map(|(s, b)| where_of(c, s, b)).collect())
}

impl World {
    fn has_tier(&self, s: usize) -> bool {
        self.sides[s].cfg.host_num_token_slots > 0
    }

    /// The tier's moves are UNSUPPORTED here (external mode, or no host tier).
    fn no_tier(&self, s: usize) -> Option<Expect> {
        (!self.has_tier(s)).then_some(Expect::Is(SKV_ERR_UNSUPPORTED))
    }

    pub(super) fn note_ticket(&mut self, s: usize, t: u64) {
        let side = &mut self.sides[s];
        if t != 0 && !side.open.contains(&t) && !side.done.contains(&t) {
            side.open.push(t);
            side.top = side.top.max(t);
        }
    }

    pub(super) fn op_tier(&mut self, s: usize) -> skv_status {
        let st = match self.rng.below(14) {
            0 | 1 => self.tier_done(s),
            2 => self.tier_bad_ticket(s),
            3 | 4 => self.tier_match(s),
            5 => self.tier_park(s),
            6 => self.tier_step(s),
            7 => self.tier_evict(s),
            8 => self.tier_queries(s),
            9 => self.tier_parked_plain_match(s),
            10 => self.tier_hooks(s),
            11 => self.tier_consistent(s),
            _ => self.tier_turn(s),
        };
        self.tier_consistent(s);
        st
    }

    /// Completes a ticket the fuzzer holds, ok (mostly) or failed.
    fn tier_done(&mut self, s: usize) -> skv_status {
        if self.sides[s].open.is_empty() {
            return self.tier_step(s);
        }
        let k = self.rng.below(self.sides[s].open.len() as u64) as usize;
        let t = self.sides[s].open[k];
        let status = if self.rng.chance(200) { self.rng.pick(&[1, -5, i32::MIN]) } else { 0 };
        let c = self.sides[s].c;
        // SAFETY: c is the side's live handle.
        let st = self.call(s, format!("skv_ticket_done({t}, {status})"), null(), Expect::Any, || unsafe {
            skv_ticket_done(c, t, status)
        });
        // A failed import's release may meet a failing hook (SKV_ERR_CALLBACK, done all the same).
        if !self.completed(st) {
            self.fail("an open ticket's completion was refused");
        }
        if self.completed(st) {
            let side = &mut self.sides[s];
            side.open.swap_remove(k);
            side.done.insert(t);
            *self
                .cover
                .entry(if status == 0 { "ticket completed ok" } else { "ticket completed failed" })
                .or_default() += 1;
        }
        st
    }

    /// Tickets no one may complete: 0 and never issued (INVALID_ARG), done (STATE), NULL handle.
    fn tier_bad_ticket(&mut self, s: usize) -> skv_status {
        let c = self.sides[s].c;
        let done: Vec<u64> = self.sides[s].done.iter().copied().collect();
        let top = self.sides[s].top;
        let (t, c, want) = match self.rng.below(4) {
            0 => (0, c, SKV_ERR_INVALID_ARG),
            1 => (self.rng.pick(&[u64::MAX, top + 1_000_000, 1 << 40]), c, SKV_ERR_INVALID_ARG),
            2 if !done.is_empty() => (self.rng.pick(&done), c, SKV_ERR_STATE),
            _ => (1, null_mut(), SKV_ERR_NULL_ARG),
        };
        let status = self.rng.pick(&[0, 1]);
        // SAFETY: c is NULL or the side's live handle.
        self.call(s, format!("skv_ticket_done({t}, {status})"), null(), Expect::Is(want), || unsafe {
            skv_ticket_done(c, t, status)
        })
    }

    /// skv_match_prefix_tier with a req naming an owned row that is not in use (NOT_FOUND).
    fn tier_match_free_row(&mut self, s: usize) -> Option<skv_status> {
        let c = self.sides[s].c;
        let rows = self.sides[s].cfg.num_rows as i32;
        let mut scratch = [0i32; 1];
        // SAFETY: the side's live handle; an empty range writes nothing.
        let free =
            (0..rows).find(|&r| unsafe { skv_row_indices(c, r, 0, 0, scratch.as_mut_ptr()) } == SKV_ERR_NOT_FOUND)?;
        let mut r = skv_req { req_pool_idx: free, ..skv_req::default() };
        let mut m = skv_tier_match { struct_size: 24, ..Default::default() };
        let rp: *mut skv_req = &mut r;
        // SAFETY: the side's live handle, a local req and out.
        Some(self.call(
            s,
            format!("skv_match_prefix_tier(free row {free})"),
            rp,
            Expect::Is(SKV_ERR_NOT_FOUND),
            || unsafe { skv_match_prefix_tier(c, 0, 0, rp, 0, 0, &mut m) },
        ))
    }

    /// skv_match_prefix_tier as op_match makes skv_match_prefix, with short or NULL outs.
    fn tier_match(&mut self, s: usize) -> skv_status {
        if self.sides[s].owned && self.rng.chance(40) {
            if let Some(st) = self.tier_match_free_row(s) {
                return st;
            }
        }
        let (sid, b) = match self.parked(s) {
            Some(k) if self.rng.chance(500) => k,
            _ => (self.session(), self.branch()),
        };
        let i = self.pick_req(s, false);
        let committed = self.sides[s].reqs[i].r.kv_committed_len;
        let key = if self.rng.chance(50) { self.huge_u32(0) } else { self.rng.upto(committed + 8) };
        let pre = self.rng.pick(&[0, 0, 0, 0, 1]);
        let mut m = skv_tier_match { struct_size: 24, hit: 9, prefix_len: 9, restored_pages: 9, ticket: 9 };
        let mut mp: *mut skv_tier_match = &mut m;
        let mut buf = [24u64; 24];
        match self.rng.below(20) {
            2 => {
                mp = misaligned(&mut buf);
                self.want = Some((Expect::Is(SKV_ERR_INVALID_ARG), true));
            }
            0 => {
                m.struct_size = self.rng.pick(&[0, 8, 23]);
                self.want = Some((Expect::Is(SKV_ERR_INVALID_ARG), true));
            }
            1 => {
                mp = null_mut();
                self.want = Some((Expect::Is(SKV_ERR_NULL_ARG), true));
            }
            _ => {}
        }
        let args = format!(", s {sid} b {b}, key {key}, pre {pre}, out size {}", m.struct_size);
        // SAFETY: req_call passes the side's live handle and its local req; mp is NULL or m.
        let (st, mutated) = self.req_call(s, i, "skv_match_prefix_tier", args, |c, r| unsafe {
            skv_match_prefix_tier(c, sid, b, r, key, pre, mp)
        });
        if !self.completed(st) {
            return st;
        }
        if m.hit == 0 && (m.ticket, m.restored_pages, m.prefix_len) != (0, 0, 0) && st == SKV_OK {
            self.fail(&format!("a tiered miss reported {m:?}"));
        }
        if m.hit == 1 {
            let fr = &mut self.sides[s].reqs[i];
            fr.hit = Some((sid, b));
            fr.matched = (st == SKV_OK && !mutated).then_some(fr.r);
        }
        if st == SKV_OK && m.hit == 1 {
            self.note_ticket(s, m.ticket);
            let w = where_of(self.sides[s].c, sid, b);
            // A write-back still open on it keeps its ticket; the hit's own is the restore's.
            if w.state & SKV_WHERE_IN_FLIGHT == 0
                || (m.ticket != 0 && w.ticket != m.ticket)
                || w.place == SKV_PLACE_HOST
            {
                self.fail(&format!("after a tiered hit {m:?}, the session is {w:?}"));
            }
            if m.restored_pages > 0 {
                *self.cover.entry("parked session restored").or_default() += 1;
            }
        }
        st
    }

    /// An honest turn of a session: a tiered match (restoring it if parked), a row on a miss,
    /// a few tokens extended and committed, a finish. Gives the policy sessions to move.
    fn tier_turn(&mut self, s: usize) -> skv_status {
        let Some(i) = (0..super::REQS).find(|&i| self.sides[s].reqs[i].r.req_pool_idx < 0) else { return SKV_OK };
        let sid = self.rng.below(SESSIONS);
        let (c, ps, max) = (self.sides[s].c, self.sides[s].ps(), self.sides[s].max_ctx());
        let key = where_of(c, sid, 0).tokens;
        self.sides[s].reqs[i].r = init_req();
        let mut m = skv_tier_match { struct_size: 24, ..Default::default() };
        let mp: *mut skv_tier_match = &mut m;
        self.no_mutate = true;
        let args = format!(", s {sid} b 0, key {key} (a turn)");
        // SAFETY: req_call passes the side's live handle and its local req; mp points at m.
        let (st, _) = self.req_call(s, i, "skv_match_prefix_tier", args, |c, r| unsafe {
            skv_match_prefix_tier(c, sid, 0, r, key, 0, mp)
        });
        if st != SKV_OK {
            return st;
        }
        if m.hit == 1 {
            self.note_ticket(s, m.ticket);
            let fr = &mut self.sides[s].reqs[i];
            (fr.hit, fr.matched) = (Some((sid, 0)), Some(fr.r));
        } else {
            self.no_mutate = true;
            // SAFETY: req_call passes the side's live handle and its local req.
            let (st, _) =
                self.req_call(s, i, "skv_alloc_row", " (a turn)".into(), |c, r| unsafe { skv_alloc_row(c, r) });
            if st != SKV_OK {
                return st;
            }
        }
        let a = self.sides[s].reqs[i].r.kv_allocated_len;
        let n = self.rng.upto((3 * ps).min(max - a));
        self.no_mutate = true;
        // SAFETY: req_call passes the side's live handle and its local req; out_loc is NULL.
        let (st, _) = self.req_call(s, i, "skv_alloc_extend", format!(", {n} (a turn)"), |c, r| unsafe {
            skv_alloc_extend(c, r, n, null_mut())
        });
        if st != SKV_OK {
            return st;
        }
        let r = self.sides[s].reqs[i].r;
        let k = r.kv_allocated_len - r.kv_committed_len;
        self.no_mutate = true;
        // SAFETY: req_call passes the side's live handle and its local req.
        let (st, _) =
            self.req_call(s, i, "skv_commit", format!(", {k} (a turn)"), |c, r| unsafe { skv_commit(c, r, k) });
        if st != SKV_OK {
            return st;
        }
        let r = &mut self.sides[s].reqs[i].r;
        (r.origin_input_len, r.output_len, r.finished_len) = (r.kv_committed_len, 0, 0);
        self.no_mutate = true;
        // SAFETY: req_call passes the side's live handle and its local req.
        self.req_call(s, i, "skv_cache_finished_req", format!(", s {sid} b 0, aborted 0 (a turn)"), |c, r| unsafe {
            skv_cache_finished_req(c, sid, 0, r, 0)
        })
        .0
    }

    /// A (session, branch) the fuzzer names that is parked now.
    fn parked(&mut self, s: usize) -> Option<(u64, u64)> {
        self.slot_where(s, |w| w.place == SKV_PLACE_HOST)
    }

    /// A (session, branch) whose place `pick` accepts.
    pub(super) fn slot_where(&mut self, s: usize, pick: impl Fn(&skv_where) -> bool) -> Option<(u64, u64)> {
        let c = self.sides[s].c;
        let all: Vec<(u64, u64)> = sessions().filter(|&(x, b)| pick(&where_of(c, x, b))).collect();
        (!all.is_empty()).then(|| self.rng.pick(&all))
    }

    fn tier_park(&mut self, s: usize) -> skv_status {
        let idle = |w: &skv_where| matches!(w.place, SKV_PLACE_DEVICE | SKV_PLACE_BOTH) && w.state == 0;
        let (sid, b) = match self.slot_where(s, idle) {
            Some(k) if self.rng.chance(800) => k,
            _ => (self.session(), self.branch()),
        };
        let c = self.sides[s].c;
        let mut t = 77u64;
        let (null_out, odd) = (self.rng.chance(50), self.rng.chance(30));
        let mut buf = [0u64; 24];
        let tp: *mut u64 = match () {
            _ if null_out => null_mut(),
            _ if odd => misaligned(&mut buf),
            _ => &mut t,
        };
        let want = match () {
            _ if null_out => Expect::Is(SKV_ERR_NULL_ARG),
            _ if odd => Expect::Is(SKV_ERR_INVALID_ARG),
            _ => self.no_tier(s).unwrap_or(Expect::Any),
        };
        if !null_out && !odd {
            self.watch.push((tp as *const u8, 8));
        }
        // SAFETY: c is the side's live handle; tp is NULL or t.
        let st = self.call(s, format!("skv_session_park(s {sid} b {b})"), null(), want, || unsafe {
            skv_session_park(c, sid, b, tp)
        });
        if st == SKV_OK {
            self.note_ticket(s, t);
            let w = where_of(c, sid, b);
            let ok = match t {
                0 => w.place == SKV_PLACE_HOST && w.state == 0,
                _ => w.state == SKV_WHERE_COPYING | SKV_WHERE_LEAVING && w.ticket == t,
            };
            if !ok {
                self.fail(&format!("skv_session_park gave ticket {t}; the session is {w:?}"));
            }
            *self.cover.entry(if t == 0 { "parked at once" } else { "park waits for its write-back" }).or_default() +=
                1;
        }
        st
    }

    fn tier_step(&mut self, s: usize) -> skv_status {
        let c = self.sides[s].c;
        let (mut pages, mut t) = (77u64, 77u64);
        let (mut pp, mut tp): (*mut u64, *mut u64) = (&mut pages, &mut t);
        let base = self.no_tier(s).unwrap_or(Expect::Any);
        let mut buf = [0u64; 24];
        let no_copy = self.has_tier(s) && self.sides[s].cfg.tier_pages_per_step > 0 && !self.sides[s].copy_hook;
        let want = match self.rng.below(30) {
            0 => {
                pp = null_mut();
                Expect::Is(SKV_ERR_NULL_ARG)
            }
            1 => {
                tp = null_mut();
                Expect::Is(SKV_ERR_NULL_ARG)
            }
            2 => {
                tp = pp;
                Expect::Is(SKV_ERR_INVALID_ARG)
            }
            3 => {
                pp = misaligned(&mut buf);
                Expect::Is(SKV_ERR_INVALID_ARG)
            }
            _ if no_copy => Expect::Is(SKV_ERR_UNSUPPORTED),
            _ => base,
        };
        let before = snap(c).0;
        // SAFETY: c is the side's live handle; pp and tp are NULL or locals.
        let st = self.call(s, "skv_tier_step".into(), null(), want, || unsafe { skv_tier_step(c, pp, tp) });
        if st == SKV_OK {
            let after = snap(c).0;
            if after.clock != before.clock + 1 || (pages == 0) != (t == 0) {
                self.fail(&format!(
                    "skv_tier_step: pages {pages}, ticket {t}, clock {} -> {}",
                    before.clock, after.clock
                ));
            }
            self.note_ticket(s, t);
            if t != 0 {
                *self.cover.entry("tier step wrote back").or_default() += 1;
            }
        }
        st
    }

    fn tier_evict(&mut self, s: usize) -> skv_status {
        let c = self.sides[s].c;
        let mut e = skv_tier_evicted { struct_size: 40, parked: 7, released: 7, copying: 7, ..Default::default() };
        let mut ep: *mut skv_tier_evicted = &mut e;
        let mut buf = [40u64; 24];
        let mut flags = self.rng.pick(&[0, 0, SKV_EVICT_NO_COPY]);
        let pages = self.rng.below(self.sides[s].cfg.num_token_slots / self.sides[s].ps() as u64 + 2);
        let want = match self.rng.below(30) {
            0 => {
                ep = null_mut();
                Expect::Is(SKV_ERR_NULL_ARG)
            }
            1 => {
                e.struct_size = self.rng.pick(&[0, 24, 39]);
                Expect::Is(SKV_ERR_INVALID_ARG)
            }
            2 => {
                flags = self.rng.pick(&[2, 3, 1 << 31]);
                Expect::Is(SKV_ERR_INVALID_ARG)
            }
            3 => {
                ep = misaligned(&mut buf);
                Expect::Is(SKV_ERR_INVALID_ARG)
            }
            _ => self.no_tier(s).unwrap_or(Expect::Any),
        };
        let before = snap(c).0;
        // SAFETY: c is the side's live handle; ep is NULL or e.
        let st = self.call(s, format!("skv_tier_evict({pages}, flags {flags})"), null(), want, || unsafe {
            skv_tier_evict(c, pages, flags, ep)
        });
        if st == SKV_OK {
            let after = snap(c).0;
            let bad =
                (e.ticket != 0 && (e.copying == 0 || flags != 0)) || after.parks != before.parks + e.parked as u64;
            if bad {
                self.fail(&format!(
                    "skv_tier_evict({pages}, {flags}) = {e:?}; parks {} -> {}",
                    before.parks, after.parks
                ));
            }
            self.note_ticket(s, e.ticket);
            *self.cover.entry("tier evict").or_default() += (e.parked + e.released + e.copying > 0) as u64;
        }
        st
    }

    /// skv_session_where and skv_tier_stats: OK in both modes; short and NULL outs refused.
    fn tier_queries(&mut self, s: usize) -> skv_status {
        let c = self.sides[s].c;
        let (sid, b) = (self.session(), self.branch());
        let (mut w, mut ts) = (where0(), tier_stats0());
        let (mut wp, mut tp): (*mut skv_where, *mut skv_tier_stats) = (&mut w, &mut ts);
        let (mut b1, mut b2) = ([40u64; 24], [144u64; 24]);
        let want = match self.rng.below(8) {
            0 => {
                (wp, tp) = (null_mut(), null_mut());
                SKV_ERR_NULL_ARG
            }
            2 => {
                (wp, tp) = (misaligned(&mut b1), misaligned(&mut b2));
                SKV_ERR_INVALID_ARG
            }
            1 => {
                (w.struct_size, ts.struct_size) = (self.rng.pick(&[0, 39]), self.rng.pick(&[0, 40, 143]));
                SKV_ERR_INVALID_ARG
            }
            _ => SKV_OK,
        };
        // SAFETY: c is the side's live handle; wp is NULL or w.
        let st = self.call(s, format!("skv_session_where(s {sid} b {b})"), null(), Expect::Is(want), || unsafe {
            skv_session_where(c, sid, b, wp)
        });
        // SAFETY: c is the side's live handle; tp is NULL or ts.
        let st2 = self.call(s, "skv_cache_tier_stats".into(), null(), Expect::Is(want), || unsafe {
            skv_cache_tier_stats(c, tp)
        });
        if want == SKV_OK {
            let host = ts.host_total_pages + ts.host_swa_total_pages + ts.parks + ts.clock + ts.pages_to_host;
            if w.place > SKV_PLACE_HOST || (!self.has_tier(s) && host != 0) {
                self.fail(&format!("where {w:?}, tier stats {ts:?}"));
            }
        }
        if st != SKV_OK {
            st
        } else {
            st2
        }
    }

    /// A plain skv_match_prefix on a parked session: SKV_ERR_STATE, nothing changed.
    fn tier_parked_plain_match(&mut self, s: usize) -> skv_status {
        let Some((sid, b)) = self.parked(s) else { return self.tier_park(s) };
        let Some(i) = (0..super::REQS).find(|&i| self.sides[s].reqs[i].r.req_pool_idx < 0) else { return SKV_OK };
        self.sides[s].reqs[i].r = init_req();
        let mut m = skv_match { hit: 9, prefix_len: 9 };
        let mp: *mut skv_match = &mut m;
        (self.no_mutate, self.want) = (true, Some((Expect::Is(SKV_ERR_STATE), true)));
        // SAFETY: req_call passes the side's live handle and its local req; mp points at m.
        let (st, _) =
            self.req_call(s, i, "skv_match_prefix", format!(", s {sid} b {b} (parked), key 0"), |c, r| unsafe {
                skv_match_prefix(c, sid, b, r, 0, 0, mp)
            });
        *self.cover.entry("plain match of a parked session refused").or_default() += 1;
        st
    }

    /// Hooks without copy_pages (an ABI 3 caller's 24 bytes), or with it again.
    fn tier_hooks(&mut self, s: usize) -> skv_status {
        if !self.sides[s].owned {
            return self.tier_queries(s);
        }
        let (c, eng) = (self.sides[s].c, self.sides[s].eng as *mut std::ffi::c_void);
        let mut h = super::engine::hooks();
        let with = self.rng.chance(600);
        if !with {
            h.struct_size = 24;
        }
        // SAFETY: c is the side's live handle; h lives through the call; the engine outlives it.
        let st =
            self.call(s, format!("skv_cache_set_hooks(copy_pages {with})"), null(), Expect::Is(SKV_OK), || unsafe {
                skv_cache_set_hooks(c, &h, eng)
            });
        if st == SKV_OK {
            self.sides[s].copy_hook = with;
        }
        st
    }

    /// Cross-checks (no call counted): the tier's stats against where each session is, and the
    /// tickets the fuzzer holds against the open ones.
    fn tier_consistent(&mut self, s: usize) -> skv_status {
        let (ts, wheres) = snap(self.sides[s].c);
        let parked = wheres.iter().filter(|w| w.place == SKV_PLACE_HOST).count() as u64;
        let host: u64 = wheres.iter().map(|w| w.host_pages).sum();
        let used = |total: u64, free: u64, draining: u64| total.saturating_sub(1 + free + draining);
        let host_used = used(ts.host_total_pages, ts.host_free_pages, ts.host_draining_pages)
            + used(ts.host_swa_total_pages, ts.host_swa_free_pages, ts.host_swa_draining_pages);
        if parked != ts.parked_sessions
            || host != host_used
            || (self.sides[s].open.len() as u64) > ts.open_tickets as u64
        {
            self.fail(&format!(
                "tier stats {ts:?} against {parked} parked sessions holding {host} host pages, {} tickets held",
                self.sides[s].open.len()
            ));
        }
        SKV_OK
    }

    /// Teardown: every ticket completes (ok), the ones the fuzzer lost track of included.
    pub(super) fn complete_all_tickets(&mut self, s: usize) {
        let c = self.sides[s].c;
        for t in std::mem::take(&mut self.sides[s].open) {
            // SAFETY: c is the side's live handle.
            self.call(s, format!("teardown: skv_ticket_done({t}, 0)"), null(), Expect::Is(SKV_OK), || unsafe {
                skv_ticket_done(c, t, 0)
            });
        }
        let top = self.sides[s].top + 4096;
        for t in 1..=top {
            if snap(c).0.open_tickets == 0 {
                break;
            }
            // SAFETY: c is the side's live handle.
            let st = unsafe { skv_ticket_done(c, t, 0) };
            if ![SKV_OK, SKV_ERR_STATE].contains(&st) {
                self.fail(&format!("teardown: skv_ticket_done({t}) = {st:?}"));
            }
        }
        if snap(c).0.open_tickets != 0 {
            self.fail("teardown: tickets left open");
        }
    }
}
