//! One world: an owned and an external handle fuzzed side by side (each side's callbacks may
//! call the other), with the reqs, stale copies and prefix-tree pages an engine would hold.

use std::collections::VecDeque;
use std::ffi::{c_void, CString};
use std::path::PathBuf;
use std::ptr::{null, null_mut};

use skv::skv_status::*;
use skv::*;

use super::coverage::{self, Coverage};
use super::engine::{self, Engine, Pools};
use super::every::{call_export, HANDLE_EXPORTS};
use super::{tick, Plan, Probes, Rng, Totals};

mod batch;
mod buffers;
mod handles;
mod hybrid;
mod misc;
mod sched;
mod tier;
mod transfer;
mod unit;

use hybrid::dead_lo;

const SESSIONS: u64 = 6;
const BRANCHES: u64 = 2;
const REQS: usize = 6;
const HOSTILE_SESSIONS: [u64; 3] = [u64::MAX, SESSIONS + 3, 1 << 40];

#[derive(Clone, Copy)]
struct FReq {
    r: skv_req,
    /// The lifetime of the row this req was handed (the side's epoch of that row then).
    epoch: u64,
    /// The (session, branch) whose slot restored this req's row.
    hit: Option<(u64, u64)>,
    /// The req as that hit left it: skv_hand_back takes it back while it is unchanged.
    matched: Option<skv_req>,
}

/// A req as skv_req_init leaves it.
fn init_req() -> skv_req {
    skv_req::default()
}

fn held0() -> skv_held {
    skv_held { full_tokens: 0, swa_tokens: 0, rows: 0, aux_states: 0, sessions: 0, aux_handles: 0 }
}

/// Everything a failed call must leave as it was.
#[derive(PartialEq, Debug)]
struct Snap {
    stats: Option<skv_stats>,
    held: skv_held,
    /// Owned mode: each row's pages and last page length, `None` when free.
    rows: Vec<Option<(Vec<i32>, i32)>>,
    engine_events: u64,
    /// The host tier and the tickets, and where each session the fuzzer names is.
    tier: skv_tier_stats,
    wheres: Vec<skv_where>,
}

/// What a call must return.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Expect {
    Any,
    /// Not SKV_OK (hostile arguments).
    Fail,
    Is(skv_status),
}

struct Side {
    owned: bool,
    /// External mode: the pool ops' shape (owned mode: `Plain`, unused).
    pools: Pools,
    /// Live from `World::new` until the end of `teardown`, which frees it last.
    c: *mut skv_cache,
    cfg: skv_cache_config,
    eng: *mut Engine,
    reqs: Vec<FReq>,
    stale: Vec<FReq>,
    epoch: Vec<u64>,
    /// Owned mode: engine-held page groups (from skv_pool_alloc or published), as indices.
    tree: Vec<Vec<i32>>,
    next_lock: u64,
    next_aux: i64,
    trace: Option<PathBuf>,
    traced: bool,
    /// Tickets the fuzzer knows are open (from `copy_pages` and the calls' outs), the ones
    /// it completed, and the highest seen.
    open: Vec<u64>,
    done: std::collections::BTreeSet<u64>,
    top: u64,
    /// Whether the hooks installed last carry `copy_pages`.
    copy_hook: bool,
    /// The last units skv_session_export wrote.
    units: Vec<Vec<u8>>,
}

pub struct World {
    rng: Rng,
    id: u64,
    seed: u64,
    run_seed: u64,
    first_call: u64,
    calls: u64,
    probes: Probes,
    sides: [Side; 2],
    log: VecDeque<String>,
    /// Honest call: an unmapped read by libskv is then a finding.
    honest: bool,
    /// Callback failures injected so far.
    pub injected: u64,
    /// The last call's error message.
    last_msg: String,
    /// The next req call passes the req as it is (the fuzzer must know what it published).
    no_mutate: bool,
    /// What the next req call must return: unless its req was mutated, or always.
    want: Option<(Expect, bool)>,
    /// How often each new call's interesting outcome was reached (`Totals::cover`).
    pub cover: std::collections::BTreeMap<&'static str, u64>,
    /// How often each export returned each status (`Totals::calls_by`).
    pub calls_by: Coverage,
    /// Caller memory the next call reads or writes besides its req (batch arrays, out-buffers,
    /// aliasing layouts): a failed call must leave every byte of it as it was.
    watch: Vec<(*const u8, usize)>,
}

impl Side {
    #[allow(clippy::mut_from_ref)]
    fn eng(&self) -> &mut Engine {
        // SAFETY: the boxed engine lives as long as the side; no libskv call is running.
        unsafe { &mut *self.eng }
    }

    fn ps(&self) -> u32 {
        self.cfg.page_size
    }

    fn max_ctx(&self) -> u32 {
        self.cfg.max_context_len
    }

    /// Owned mode with an SWA pool: libskv runs the window.
    fn swa(&self) -> bool {
        self.owned && self.cfg.swa_num_token_slots > 0
    }

    fn stats(&self) -> skv_stats {
        // SAFETY: skv_stats is plain integers, so all zero is a valid value.
        let mut st = unsafe { std::mem::zeroed::<skv_stats>() };
        // SAFETY: a live handle and a local out-value.
        assert_eq!(unsafe { skv_cache_stats(self.c, &mut st) }, SKV_OK, "skv_cache_stats");
        st
    }

    /// Reqs that may name row `row` mapping `len` tokens, one per protected length (the record
    /// is not observable) and, with an SWA pool, per cursor.
    fn row_reqs(&self, row: i32, len: u32) -> impl Iterator<Item = skv_req> {
        let ps = self.ps();
        let cursors = if self.swa() { len + 1 } else { 1 };
        (0..=len / ps).flat_map(move |k| {
            (0..cursors).map(move |cursor| {
                let mut q = init_req();
                q.req_pool_idx = row;
                (q.kv_allocated_len, q.kv_committed_len, q.cache_protected_len) = (len, len, k * ps);
                q.swa_evicted_seqlen = cursor;
                q
            })
        })
    }

    fn snap(&self) -> Snap {
        let c = self.c;
        let mut held = held0();
        // SAFETY: a live handle and valid out-pointers.
        unsafe {
            assert_eq!(skv_session_held(c, null(), 0, &mut held), SKV_OK, "snapshot: skv_session_held");
            let mut stats = None;
            let mut rows = Vec::new();
            if self.owned {
                let mut s = std::mem::zeroed::<skv_stats>();
                assert_eq!(skv_cache_stats(c, &mut s), SKV_OK, "snapshot: skv_cache_stats");
                stats = Some(s);
                let cap = self.max_ctx().div_ceil(self.ps()) as usize + 1;
                let mut idx = vec![0i32; cap];
                for r in 0..self.cfg.num_rows as i32 {
                    let (mut indptr, mut last, mut needed) = ([0i32; 2], [0i32; 1], 0usize);
                    let st = skv_build_flashinfer(
                        c,
                        &r,
                        1,
                        indptr.as_mut_ptr(),
                        idx.as_mut_ptr(),
                        last.as_mut_ptr(),
                        cap,
                        &mut needed,
                    );
                    rows.push(match st {
                        SKV_OK => Some((idx[..needed].to_vec(), last[0])),
                        SKV_ERR_NOT_FOUND => None,
                        s => panic!("snapshot: skv_build_flashinfer(row {r}) = {s:?}"),
                    });
                }
            }
            let (tier, wheres) = tier::snap(c);
            Snap { stats, held, rows, engine_events: (*self.eng).events, tier, wheres }
        }
    }

    fn audit(&self) -> Option<String> {
        if !self.owned {
            return None;
        }
        // SAFETY: a live handle and a valid out-pointer.
        unsafe {
            let mut rep = std::mem::zeroed::<skv_check_report>();
            let st = skv_cache_check(self.c, &mut rep);
            if st != SKV_OK {
                return Some(format!("skv_cache_check returned {st:?}"));
            }
            if rep.violations != 0 {
                let text = std::ffi::CStr::from_ptr(rep.first_violation.as_ptr()).to_string_lossy().into_owned();
                return Some(format!("audit: {} violations, first: {text}", rep.violations));
            }
            // The SWA pool adds up: every page but the padding page is free or in use, as the
            // audit counted them.
            let s = self.stats();
            let want_total = self.cfg.swa_num_token_slots / self.ps() as u64;
            let adds_up = match want_total {
                0 => (s.swa_total_pages, s.swa_free_pages, s.swa_used_pages) == (0, 0, 0),
                n => s.swa_total_pages == n && s.swa_free_pages + s.swa_used_pages == n - 1,
            };
            // The audit counts a draining page (freed while a ticket copies it) with the free
            // pages; skv_stats with the used ones until the ticket completes.
            let d = tier::snap(self.c).0.swa_draining_pages;
            let (free, used) = (s.swa_free_pages + d, s.swa_used_pages - d);
            (!adds_up || (rep.swa_pages_free, rep.swa_pages_in_use) != (free, used)).then(|| {
                format!(
                    "SWA pool of {want_total} pages: stats (total, free, used) {:?}, audit (free, in use) {:?}",
                    (s.swa_total_pages, s.swa_free_pages, s.swa_used_pages),
                    (rep.swa_pages_free, rep.swa_pages_in_use)
                )
            })
        }
    }

    /// The row's length in owned mode (from the FlashInfer layout), `None` when free.
    fn row_len(&self, row: i32) -> Option<u32> {
        let s = self.snap();
        let (pages, last) = s.rows.get(row as usize)?.clone()?;
        Some(if pages.is_empty() { 0 } else { (pages.len() as u32 - 1) * self.ps() + last as u32 })
    }
}

fn config(rng: &mut Rng) -> skv_cache_config {
    let ps = rng.pick(&[1u32, 2, 4, 4, 16]);
    let pages = 8 + rng.below(120);
    skv_cache_config {
        struct_size: std::mem::size_of::<skv_cache_config>() as u32,
        page_size: ps,
        num_token_slots: pages * ps as u64,
        num_rows: 2 + rng.below(7) as u32,
        max_context_len: ps * (2 + rng.below(12) as u32) + rng.below(ps as u64) as u32,
        flags: rng.pick(&[0, 0, SKV_FLAG_ALIGNED_REUSE]),
        swa_num_token_slots: 0,
        ..Default::default()
    }
}

impl World {
    pub fn new(seed: u64, id: u64, first_call: u64, plan: &Plan) -> World {
        let mut rng = Rng(seed);
        let probes = plan.probes;
        let mk = |rng: &mut Rng, owned: bool| {
            let mut cfg = config(rng);
            let pages = (cfg.num_token_slots / cfg.page_size as u64) as u32;
            let mut pools = Pools::Plain;
            if !owned {
                if rng.chance(333) {
                    cfg.flags |= SKV_FLAG_PAGE_FREES;
                }
                pools = match rng.below(5) {
                    0 | 1 => Pools::Plain,
                    2 | 3 => Pools::Hybrid { free_kv: rng.chance(500) },
                    _ => Pools::NoSegment,
                };
            }
            if owned && rng.chance(400) {
                // An SWA pool smaller or larger than the full pool.
                cfg.swa_num_token_slots = (2 + rng.below(2 * pages as u64)) * cfg.page_size as u64;
            }
            if owned && rng.chance(500) {
                tier::host_tier(rng, &mut cfg);
            }
            let mut e = Engine::new(cfg.page_size, pages, cfg.num_rows, rng.next(), probes);
            (e.pools, e.page_frees) = (pools, cfg.flags & SKV_FLAG_PAGE_FREES != 0);
            let eng = Box::into_raw(Box::new(e));
            let mut c = null_mut();
            // SAFETY: valid pointers; the engine outlives the handle.
            let st = unsafe {
                match owned {
                    true => skv_cache_new(&cfg, &mut c),
                    false => skv_cache_new_external(&cfg, &engine::pool_ops(pools), eng as *mut c_void, &mut c),
                }
            };
            assert_eq!(st, SKV_OK, "creating a handle of {cfg:?}");
            if owned {
                // SAFETY: a live handle; the engine outlives it.
                assert_eq!(unsafe { skv_cache_set_hooks(c, &engine::hooks(), eng as *mut c_void) }, SKV_OK);
            }
            let fr = FReq { r: init_req(), epoch: 0, hit: None, matched: None };
            Side {
                owned,
                pools,
                c,
                cfg,
                eng,
                reqs: vec![fr; REQS],
                stale: Vec::new(),
                epoch: vec![0; cfg.num_rows as usize],
                tree: Vec::new(),
                next_lock: 1,
                next_aux: 0,
                trace: None,
                traced: false,
                open: Vec::new(),
                done: Default::default(),
                top: 0,
                copy_hook: owned,
                units: Vec::new(),
            }
        };
        let sides = [mk(&mut rng, true), mk(&mut rng, false)];
        let mut w = World {
            rng,
            id,
            seed,
            run_seed: plan.seed,
            first_call,
            calls: 0,
            probes,
            sides,
            log: VecDeque::new(),
            honest: true,
            injected: 0,
            last_msg: String::new(),
            no_mutate: false,
            want: None,
            cover: Default::default(),
            calls_by: Default::default(),
            watch: Vec::new(),
        };
        for s in 0..2 {
            let (me, other) = (w.sides[s].c, w.sides[1 - s].c);
            let e = w.sides[s].eng();
            (e.me, e.other) = (me, other);
            e.fail_rate = w.rng.pick(&[0, 0, 5, 30]);
            e.reenter_rate = w.rng.pick(&[0, 10, 50]);
            e.copy_fail_rate =
                w.rng.pick(&[0, 50, 200]).max(if w.sides[s].cfg.host_num_token_slots > 0 { 50 } else { 0 });
            if w.rng.chance(333) {
                w.set_trace(s, true);
            }
        }
        w
    }

    pub fn traced(&self) -> bool {
        self.sides.iter().any(|s| s.traced)
    }

    fn set_trace(&mut self, s: usize, on: bool) {
        let side = &mut self.sides[s];
        let path = side.trace.get_or_insert_with(|| {
            std::env::temp_dir().join(format!("skv-fuzz-{}-{}-{s}.jsonl", std::process::id(), self.id))
        });
        let cpath = CString::new(path.to_str().unwrap()).unwrap();
        // SAFETY: a live handle and a NUL-terminated path.
        let st = unsafe { skv_cache_set_trace(side.c, if on { cpath.as_ptr() } else { null() }) };
        assert_eq!(st, SKV_OK, "skv_cache_set_trace");
        coverage::record(&mut self.calls_by, "skv_cache_set_trace", st);
        side.traced = on;
    }

    fn fail(&self, what: &str) -> ! {
        let recent: Vec<&String> = self.log.iter().collect();
        panic!(
            "skv fuzz finding: {what}\n  run seed {:#x}, world {} (seed {:#x}), call {} of the run ({} in this world)\n  \
             owned cfg {:?}\n  external cfg {:?}\n  recent calls, oldest first:\n    {}",
            self.run_seed,
            self.id,
            self.seed,
            self.first_call + self.calls,
            self.calls,
            self.sides[0].cfg,
            self.sides[1].cfg,
            recent.iter().map(|s| s.as_str()).collect::<Vec<_>>().join("\n    ")
        )
    }

    /// Whether the last call (status `st`) took effect: OK, or a free callback failing after
    /// the state advanced. A failing read_row changes nothing (and is checked as a failure).
    fn completed(&self, st: skv_status) -> bool {
        // copy_pages' refusal ("nothing was copied, nothing changed") changes nothing either.
        st == SKV_OK
            || (st == SKV_ERR_CALLBACK
                && !self.last_msg.contains("nothing was changed")
                && !self.last_msg.contains("nothing changed"))
    }

    /// Makes one call on side `s` and checks everything after it. `req` is the req the call
    /// reads and writes, if any.
    fn call(
        &mut self,
        s: usize,
        desc: String,
        req: *const skv_req,
        expect: Expect,
        f: impl FnOnce() -> skv_status,
    ) -> skv_status {
        self.calls += 1;
        tick(self.first_call + self.calls);
        if self.log.len() >= log_len() {
            self.log.pop_front();
        }
        self.log.push_back(format!("[{}] {} {desc}", s, if self.sides[s].owned { "owned" } else { "external" }));
        super::note_call(&desc);
        let side = &self.sides[s];
        let before = side.snap();
        // SAFETY: req is NULL or points at a live req.
        let req_before = unsafe { req.as_ref().copied() };
        let watch = std::mem::take(&mut self.watch);
        let watched = |w: &[(*const u8, usize)]| -> Vec<Vec<u8>> {
            // SAFETY: each watched range is caller memory the call may use, live through it.
            w.iter().map(|&(p, n)| unsafe { std::slice::from_raw_parts(p, n) }.to_vec()).collect()
        };
        let watch_before = watched(&watch);
        side.eng().injected = 0;
        side.eng().unmapped_reads = 0;
        side.eng().swa_freed = 0;
        side.eng().queued.clear();
        side.eng().copy_refused = false;
        let st = f();
        for (f, st) in std::mem::take(&mut self.sides[s].eng().reentered) {
            *self.calls_by.entry((f, st.name())).or_default() += 1;
        }
        let (kv, seg) = self.sides[s].eng().finish_midway();
        if kv > 0 {
            *self.cover.entry("free_kv failed midway").or_default() += 1;
        }
        if seg > 0 {
            *self.cover.entry("free_kv_segment failed midway").or_default() += 1;
        }
        coverage::record(&mut self.calls_by, &desc, st);
        let st_name = format!("{st:?}");
        let msg = crate::common::last_error();
        let trail = std::mem::take(&mut self.sides[s].eng().trail);
        if let Some(l) = self.log.back_mut() {
            l.push_str(&format!(" -> {st_name} {msg}"));
            if !trail.is_empty() {
                l.push_str(&format!(" [freed: {}]", trail.join(" ")));
            }
        }
        let side = &self.sides[s];
        let e = side.eng();
        self.injected += e.injected;
        if let Some(f) = e.findings.first().cloned() {
            self.fail(&f);
        }
        if st == SKV_ERR_INTERNAL {
            self.fail("SKV_ERR_INTERNAL (a panic or poisoned lock)");
        }
        if let Some(v) = side.audit() {
            self.fail(&v);
        }
        match expect {
            Expect::Any => {}
            Expect::Fail if st == SKV_OK => self.fail("hostile arguments were accepted"),
            Expect::Is(want) if st != want => self.fail(&format!("expected {want:?}")),
            _ => {}
        }
        if st == SKV_ERR_CALLBACK && e.injected == 0 {
            if e.unmapped_reads > 0 && self.honest {
                self.fail("libskv read row positions the engine never mapped");
            } else if e.unmapped_reads == 0 {
                self.fail("SKV_ERR_CALLBACK though no callback failed");
            }
        }
        self.last_msg = msg;
        let queued = std::mem::take(&mut self.sides[s].eng().queued);
        if self.completed(st) {
            let side = &mut self.sides[s];
            for (t, ..) in queued {
                side.top = side.top.max(t);
                side.open.push(t);
            }
        } else if !queued.is_empty() {
            self.fail(&format!("a failed call left copies queued under tickets {queued:?}"));
        }
        if self.sides[s].eng().copy_refused && self.completed(st) {
            self.fail("copy_pages refused, yet the call took effect");
        }
        let side = &self.sides[s];
        if !self.completed(st) {
            // SAFETY: as above.
            let req_after = unsafe { req.as_ref().copied() };
            if req_before != req_after {
                self.fail(&format!("a failed call changed the req: {req_before:?} -> {req_after:?}"));
            }
            if watched(&watch) != watch_before {
                self.fail("a failed call changed caller memory it was given (a batch array or out-buffer)");
            }
            let after = side.snap();
            if before != after {
                self.fail(&format!("a failed call changed the state:\n  before {before:?}\n  after  {after:?}"));
            }
        }
        self.honest = true;
        st
    }

    pub fn run(&mut self, n: u64, t: &mut Totals) {
        if self.probes.deep_reentry && self.id == 0 {
            super::probes::deep_reentry();
        }
        if self.probes.strict_reentry && self.id == 0 {
            super::probes::cross_thread_reentry();
        }
        let start = self.calls;
        while self.calls - start < n {
            let s = self.rng.below(2) as usize;
            let before = self.calls;
            let st = self.step(s);
            if self.calls > before {
                t.by_status[(st as usize).min(9)] += 1;
            }
        }
        t.calls += self.calls - start;
        t.injected_failures += self.injected;
        for (k, v) in std::mem::take(&mut self.cover) {
            *t.cover.entry(k).or_default() += v;
        }
        for (k, v) in std::mem::take(&mut self.calls_by) {
            *t.calls_by.entry(k).or_default() += v;
        }
    }

    fn session(&mut self) -> u64 {
        if self.rng.chance(20) {
            self.rng.pick(&HOSTILE_SESSIONS)
        } else {
            self.rng.below(SESSIONS)
        }
    }

    fn branch(&mut self) -> u64 {
        if self.rng.chance(20) {
            u64::MAX
        } else {
            self.rng.below(BRANCHES)
        }
    }

    /// A hostile count near u32::MAX or just past a bound.
    fn huge_u32(&mut self, bound: u32) -> u32 {
        let k = self.rng.below(4) as u32;
        self.rng.pick(&[u32::MAX - k, u32::MAX / 2 + k, bound.wrapping_add(1 + k), i32::MAX as u32 + k])
    }

    /// An impossible array length: n * sizeof(i32) overflows isize.
    fn impossible_len(&mut self) -> usize {
        self.rng.pick(&[usize::MAX, usize::MAX / 2, usize::MAX / 4 + 1, isize::MAX as usize - 1])
    }

    fn bad_row(&mut self, s: usize) -> i32 {
        let rows = self.sides[s].cfg.num_rows as i32;
        self.rng.pick(&[-2, i32::MIN, rows, rows + 1, i32::MAX])
    }

    /// Picks a req index on side s (one holding a row, when asked and one exists).
    fn pick_req(&mut self, s: usize, holding: bool) -> usize {
        let side = &self.sides[s];
        let with: Vec<usize> = (0..REQS).filter(|&i| side.reqs[i].r.req_pool_idx >= 0).collect();
        if holding && !with.is_empty() && !self.rng.chance(100) {
            return self.rng.pick(&with);
        }
        self.rng.below(REQS as u64) as usize
    }

    /// Forgets reqs whose row has since been handed to another request (their copies are stale
    /// on a reused row: a probe class of its own).
    fn settle(&mut self, s: usize) {
        let side = &mut self.sides[s];
        for fr in side.reqs.iter_mut() {
            let row = fr.r.req_pool_idx;
            if row >= 0 && (row as usize) < side.epoch.len() && side.epoch[row as usize] != fr.epoch {
                *fr = FReq { r: init_req(), epoch: 0, hit: None, matched: None };
            }
        }
        if side.stale.len() > 8 {
            side.stale.remove(0);
        }
    }

    fn step(&mut self, s: usize) -> skv_status {
        self.settle(s);
        let owned = self.sides[s].owned;
        if owned && self.rng.chance(25) {
            return self.op_swa_views(s);
        }
        if self.sides[s].swa() && self.rng.chance(80) {
            return self.op_swa_evict(s);
        }
        // The calls and probes issue 23 added: the batches (and their buffers' aliasing),
        // single calls' buffers, recurrent handles given twice, the rarely used exports.
        match self.rng.below(1000) {
            0..=49 if owned => return self.op_batch(s),
            0..=14 => return self.op_batch(s),
            50..=64 => return self.op_buffers(s),
            65..=79 => return self.op_doubled_handles(s),
            80..=84 => return self.op_misc(s),
            85..=264 if self.sides[s].cfg.host_num_token_slots > 0 => return self.op_tier(s),
            85..=94 => return self.op_tier(s),
            265..=289 => return self.op_unit(s),
            290..=304 => return self.op_transfer(s),
            _ => {}
        }
        let k = self.rng.below(1000);
        match (owned, k) {
            (_, 0..=79) => self.op_match(s),
            (_, 80..=159) => self.op_finish(s),
            (_, 160..=189) => self.op_checkpoint(s),
            (_, 190..=214) => self.op_release(s),
            (_, 215..=264) => self.op_trim(s),
            (_, 265..=304) => self.op_free_tail(s),
            (_, 305..=334) => self.op_free_aligned(s),
            (_, 335..=359) => self.op_held(s),
            (_, 360..=379) => self.op_null(s),
            (_, 380..=389) => self.op_trace(s),
            (_, 390..=399) => self.op_new_hostile(s),
            (_, 400..=429) => self.op_progress(s),
            (true, 430..=509) => self.op_alloc_row(s),
            (true, 510..=619) => self.op_extend(s),
            (true, 620..=689) => self.op_commit(s),
            (true, 690..=729) => self.op_free_req(s),
            (true, 730..=759) => self.op_pool_alloc(s),
            (true, 760..=789) => self.op_pool_free(s),
            (true, 790..=809) => self.op_page_refs(s),
            (true, 810..=839) => self.op_map_prefix(s),
            (true, 840..=859) => self.op_publish(s),
            (true, 860..=879) => self.op_row_indices(s),
            (true, 880..=899) => self.op_flashinfer(s),
            (true, 900..=919) => self.op_hooks(s),
            (true, 920..=939) => self.op_copy(s),
            (true, 940..=964) => self.op_stale(s),
            (true, 965..=974) => self.op_hand_back(s),
            (true, 975..=984) => self.op_queries(s),
            (true, 985..=994) => self.op_admission(s),
            (true, _) => self.op_swa_evict(s),
            (false, 430..=529) => self.e_alloc(s),
            (false, 530..=699) => self.e_extend(s),
            (false, 700..=799) => self.e_commit(s),
            (false, 800..=859) => self.e_free_req(s),
            (false, 860..=889) => self.op_unsupported(s),
            (false, 890..=914) => self.op_match(s),
            (false, 915..=939) => self.op_hand_back(s),
            (false, 940..=959) => self.op_queries(s),
            (false, 960..=969) => self.op_swa_evict(s),
            // A window step too where the pool ops have free_kv_segment (or are ABI 2's).
            (false, _) => self.op_no_segment(s),
        }
    }

    // --- the engine's own moves -------------------------------------------------------------

    fn fresh_lock(&mut self, s: usize, r: &mut skv_req) {
        let side = &mut self.sides[s];
        if self.rng.chance(500) {
            r.lock_node = side.next_lock;
            r.lock_receipt = side.next_lock.wrapping_mul(31);
            side.next_lock += 1;
        }
        if self.rng.chance(300) {
            r.aux_state = side.next_aux;
            side.next_aux += 1;
        }
        for t in 0..2 {
            if self.rng.chance(400) {
                r.aux_track[t] = side.next_aux;
                side.next_aux += 1;
            }
        }
    }

    /// Prompt and output lengths as a turn advances (engine fields libskv only reads).
    fn op_progress(&mut self, s: usize) -> skv_status {
        let i = self.pick_req(s, true);
        let (ps, max, swa) = (self.sides[s].ps(), self.sides[s].max_ctx(), self.sides[s].swa());
        let r = &mut self.sides[s].reqs[i].r;
        let c = r.kv_committed_len;
        let origin = self.rng.upto(c);
        r.origin_input_len = origin;
        r.output_len = c - origin + self.rng.upto(5);
        r.finished_len = if self.rng.chance(400) { -1 } else { self.rng.upto(r.output_len) as i32 };
        match self.sides[s].pools {
            // The engine keeps no SWA pool: any cursor is its own business (with an owned SWA
            // pool only skv_swa_evict moves it).
            Pools::Plain if !swa && self.rng.chance(200) => {
                r.swa_evicted_seqlen = (self.rng.upto(c) / ps * ps).min(r.kv_allocated_len);
            }
            // The cursor moves by skv_swa_evict only; the floor is set at a prefill, while the
            // window has freed nothing on either side of the change (docs/hybrid.md).
            Pools::Hybrid { .. } if self.rng.chance(200) => {
                let mut q = *r;
                q.swa_evict_floor = self.rng.upto(r.kv_allocated_len + ps).min(max);
                if r.swa_evicted_seqlen <= dead_lo(r, ps) && q.swa_evicted_seqlen <= dead_lo(&q, ps) {
                    *r = q;
                }
            }
            // A cursor here makes some frees unsupported: set by `op_no_segment` on copies only.
            _ => {}
        }
        SKV_OK
    }

    /// Logs an engine move (no libskv call) among the recent calls.
    fn note(&mut self, s: usize, what: String) {
        if self.log.len() >= log_len() {
            self.log.pop_front();
        }
        self.log.push_back(format!("[{s}] engine: {what}"));
    }

    fn e_alloc(&mut self, s: usize) -> skv_status {
        let i = self.pick_req(s, false);
        let side = &mut self.sides[s];
        if side.reqs[i].r.req_pool_idx >= 0 {
            return SKV_OK;
        }
        let e = side.eng();
        let Some(row) = e.row_free.iter().position(|&f| f) else { return SKV_OK };
        e.row_free[row] = false;
        e.row_map[row].clear();
        side.epoch[row] += 1;
        let mut r = init_req();
        r.req_pool_idx = row as i32;
        let epoch = side.epoch[row];
        self.fresh_lock(s, &mut r);
        self.sides[s].reqs[i] = FReq { r, epoch, hit: None, matched: None };
        self.note(s, format!("req#{i} takes row {row}"));
        SKV_OK
    }

    fn e_extend(&mut self, s: usize) -> skv_status {
        let i = self.pick_req(s, true);
        let side = &mut self.sides[s];
        let (ps, max) = (side.ps(), side.max_ctx());
        let r = &mut side.reqs[i].r;
        if r.req_pool_idx < 0 {
            return SKV_OK;
        }
        let row = r.req_pool_idx;
        let n = self.rng.upto(2 * ps + 3).min(max - r.kv_allocated_len);
        // SAFETY: the boxed engine lives as long as the side, and no libskv call is running.
        let e = unsafe { &mut *side.eng };
        for pos in r.kv_allocated_len..r.kv_allocated_len + n {
            let idx = if pos % ps != 0 {
                e.row_map[row as usize][pos as usize - 1] + 1
            } else {
                match e.take_page(row) {
                    Some(p) => (p * ps) as i32,
                    None => break,
                }
            };
            let map = &mut e.row_map[row as usize];
            map.truncate(pos as usize);
            map.push(idx);
            r.kv_allocated_len = pos + 1;
        }
        let a = r.kv_allocated_len;
        let trail = std::mem::take(&mut e.trail).join(" ");
        self.note(s, format!("req#{i} row {row} extended to {a} {trail}"));
        SKV_OK
    }

    fn e_commit(&mut self, s: usize) -> skv_status {
        let i = self.pick_req(s, true);
        let r = &mut self.sides[s].reqs[i].r;
        let room = r.kv_allocated_len - r.kv_committed_len;
        r.kv_committed_len += self.rng.upto(room);
        SKV_OK
    }

    /// The engine's own non-session finish of a request it allocated.
    fn e_free_req(&mut self, s: usize) -> skv_status {
        let i = self.pick_req(s, true);
        let side = &mut self.sides[s];
        let fr = side.reqs[i];
        if fr.r.req_pool_idx < 0 || fr.hit.is_some() {
            return SKV_OK;
        }
        let row = fr.r.req_pool_idx;
        let e = side.eng();
        e.free_positions(row, 0, fr.r.kv_allocated_len);
        e.row_free[row as usize] = true;
        side.reqs[i] = FReq { r: init_req(), epoch: 0, hit: None, matched: None };
        self.note(s, format!("req#{i} frees row {row} and its pages"));
        SKV_OK
    }

    // --- calls on both modes ------------------------------------------------------------------

    /// A req to pass: the live one, or (owned mode) a hostile mutation of it. Returns the value
    /// and whether it was mutated.
    fn maybe_mutate(&mut self, s: usize, r: skv_req) -> (skv_req, bool) {
        let frozen = std::mem::take(&mut self.no_mutate);
        if !self.rng.chance(120) || frozen {
            return (r, false);
        }
        let side = &self.sides[s];
        let (ps, max, rows) = (side.ps(), side.max_ctx(), side.cfg.num_rows as i32);
        let mut m = r;
        // Each of these breaks a rule every function checks (the owned side adds others).
        match self.rng.below(if side.owned { 9 } else { 6 }) {
            0 => m.kv_committed_len = m.kv_allocated_len.wrapping_add(1 + self.rng.upto(3)),
            1 => m.kv_allocated_len = max + 1 + self.rng.upto(u32::MAX - max - 1),
            2 => m.req_pool_idx = self.rng.pick(&[-2, i32::MIN, rows, i32::MAX]),
            3 if self.rng.chance(300) => m.swa_evict_floor = max.saturating_add(1 + self.rng.upto(9)),
            3 => m.swa_evicted_seqlen = m.kv_allocated_len.max(dead_lo(&m, ps)).saturating_add(1 + self.rng.upto(9)),
            4 => m.finished_len = self.rng.pick(&[-2, i32::MIN, m.output_len.saturating_add(1) as i32]),
            5 if ps > 1 => m.cache_protected_len = m.cache_protected_len.wrapping_add(1),
            5 => m.req_pool_idx = -7,
            6 => m.kv_allocated_len = self.rng.upto(max),
            7 => m.cache_protected_len = self.rng.upto(max) / ps * ps,
            _ => {
                // Another row, as a second req on it: without this request's lock and aux
                // state, which belong to one request only.
                m.req_pool_idx = self.rng.below(rows as u64) as i32;
                (m.lock_node, m.lock_receipt, m.aux_state, m.aux_track) = (0, 0, -1, [-1, -1]);
            }
        }
        (m, true)
    }

    /// Runs a req call on req `i` (possibly mutated) and keeps the result when it completes.
    /// `f` gets the side's live handle and a pointer to a local copy of the req.
    fn req_call(
        &mut self,
        s: usize,
        i: usize,
        name: &str,
        args: String,
        f: impl FnOnce(*mut skv_cache, *mut skv_req) -> skv_status,
    ) -> (skv_status, bool) {
        let fr = self.sides[s].reqs[i];
        let (mut r, mutated) = self.maybe_mutate(s, fr.r);
        // External mode: only mutations every function refuses (the engine cannot survive a lie).
        let expect = match std::mem::take(&mut self.want) {
            Some((want, always)) if always || !mutated => want,
            _ if mutated && !self.sides[s].owned => Expect::Fail,
            _ => Expect::Any,
        };
        let c = self.sides[s].c;
        let desc = format!("{name}(req#{i} {}{args})", show(&r));
        self.honest = !mutated;
        // The row the call named: a mutation may have moved the req onto another request's row,
        // and a call that empties the req (a finish) leaves no trace of it in `r`.
        let called_row = r.req_pool_idx;
        let st = self.call(s, desc, &r, expect, || f(c, &mut r));
        if self.completed(st) {
            let side = &mut self.sides[s];
            let row = r.req_pool_idx;
            if mutated && row != fr.r.req_pool_idx {
                // Now a second req on another request's row: keep the locks exact.
                (r.lock_node, r.lock_receipt, r.aux_state, r.aux_track) = (0, 0, -1, [-1, -1]);
            }
            let epoch = if row >= 0 && (row as usize) < side.epoch.len() { side.epoch[row as usize] } else { 0 };
            let (hit, mut matched) = if row >= 0 { (fr.hit, fr.matched) } else { (None, None) };
            if let Some(m) = matched.as_mut().filter(|_| r.kv_allocated_len < fr.r.kv_allocated_len) {
                // A primitive that shortens a running request's row shortens its slot's record
                // with it: that is what skv_hand_back compares with.
                sched::clamp_record(m, r.kv_allocated_len);
            }
            // The mutation moved the req onto another row: the call's req (the callers read it in
            // slot i) is a second req there, with no hit of its own.
            let moved = mutated && fr.r.req_pool_idx >= 0 && called_row != fr.r.req_pool_idx;
            if moved {
                side.reqs[i] = FReq { r, epoch, hit: None, matched: None };
                // The request on the req's own row took no part in the call and runs on: its req
                // is kept where a slot is free (without one, the fuzzer loses track of it).
                if let Some(j) = (0..REQS).find(|&j| j != i && side.reqs[j].r.req_pool_idx < 0) {
                    side.reqs[j] = fr;
                }
            } else {
                side.reqs[i] = FReq { r, epoch, hit, matched };
            }
            // Another req on a row the call acted on (a hostile mutation put it there) may have
            // acted for its request: what skv_hand_back would compare is no longer known.
            for j in (0..REQS).filter(|&j| j != i) {
                let other = side.reqs[j].r.req_pool_idx;
                if other >= 0 && (other == row || other == called_row || (!moved && other == fr.r.req_pool_idx)) {
                    side.reqs[j].matched = None;
                }
            }
        }
        (st, mutated)
    }

    fn op_match(&mut self, s: usize) -> skv_status {
        let (sid, b) = (self.session(), self.branch());
        let i = self.pick_req(s, false);
        let committed = self.sides[s].reqs[i].r.kv_committed_len;
        let key = if self.rng.chance(50) { self.huge_u32(0) } else { self.rng.upto(committed + 8) };
        let pre = self.rng.pick(&[0, 0, 0, 1, 7]);
        let mut m = skv_match { hit: 9, prefix_len: 9 };
        let mp: *mut skv_match = &mut m;
        // SAFETY: req_call passes the side's live handle and its local req; mp points at m.
        let (st, mutated) =
            self.req_call(s, i, "skv_match_prefix", format!(", s {sid} b {b}, key {key}, pre {pre}"), |c, r| unsafe {
                skv_match_prefix(c, sid, b, r, key, pre, mp)
            });
        if self.completed(st) && m.hit == 1 {
            let fr = &mut self.sides[s].reqs[i];
            fr.hit = Some((sid, b));
            // A mutated req's lock and aux state are dropped from the fuzzer's copy (req_call).
            fr.matched = (st == SKV_OK && !mutated).then_some(fr.r);
        }
        st
    }

    fn op_finish(&mut self, s: usize) -> skv_status {
        let i = self.pick_req(s, true);
        let (sid, b) = match self.sides[s].reqs[i].hit {
            Some(k) if self.rng.chance(700) => k,
            _ => (self.session(), self.branch()),
        };
        let aborted = self.rng.pick(&[0, 0, 0, 1, 3]);
        let (r, past) = (self.sides[s].reqs[i].r, self.sides[s].stats().finishes_past_committed);
        let (st, mutated) = self.req_call(
            s,
            i,
            "skv_cache_finished_req",
            format!(", s {sid} b {b}, aborted {aborted}"),
            // SAFETY: req_call passes the side's live handle and its local req.
            |c, r| unsafe { skv_cache_finished_req(c, sid, b, r, aborted) },
        );
        if self.completed(st) && !mutated {
            // A finish claiming more than one token past what was committed is counted: the
            // last sampled token has no KV yet, and no more may lack it (aborts claim nothing).
            let finished = if r.finished_len >= 0 { r.finished_len as u64 } else { r.output_len as u64 };
            let over = aborted == 0 && r.origin_input_len as u64 + finished > r.kv_committed_len as u64 + 1;
            let counted = self.sides[s].stats().finishes_past_committed - past;
            if counted != over as u64 {
                self.fail(&format!("skv_stats.finishes_past_committed rose by {counted} for {}", show(&r)));
            }
            *self
                .cover
                .entry(if over { "finish past committed counted" } else { "finish within committed" })
                .or_default() += 1;
        }
        st
    }

    fn op_checkpoint(&mut self, s: usize) -> skv_status {
        let (sid, b) = (self.session(), self.branch());
        let i = self.pick_req(s, true);
        let mut handled = 9u32;
        let hp: *mut u32 = &mut handled;
        // SAFETY: req_call passes the side's live handle and its local req; hp points at handled.
        self.req_call(s, i, "skv_checkpoint", format!(", s {sid} b {b}"), |c, r| unsafe {
            skv_checkpoint(c, sid, b, r, hp)
        })
        .0
    }

    fn op_release(&mut self, s: usize) -> skv_status {
        let (sid, b) = (self.session(), self.branch());
        let c = self.sides[s].c;
        if self.rng.chance(500) {
            // SAFETY: c is the side's live handle.
            self.call(s, format!("skv_release_session({sid})"), null(), Expect::Any, || unsafe {
                skv_release_session(c, sid)
            })
        } else {
            // SAFETY: c is the side's live handle.
            self.call(s, format!("skv_release_branch({sid}, {b})"), null(), Expect::Any, || unsafe {
                skv_release_branch(c, sid, b)
            })
        }
    }

    fn op_trim(&mut self, s: usize) -> skv_status {
        let i = self.pick_req(s, true);
        let out = self.sides[s].reqs[i].r.output_len;
        let fl = if self.rng.chance(60) { self.huge_u32(out) } else { self.rng.upto(out) };
        // SAFETY: req_call passes the side's live handle and its local req.
        self.req_call(s, i, "skv_trim_overshoot", format!(", finished_len {fl}"), |c, r| unsafe {
            skv_trim_overshoot(c, r, fl)
        })
        .0
    }

    fn op_free_tail(&mut self, s: usize) -> skv_status {
        let i = self.pick_req(s, true);
        let r = self.sides[s].reqs[i].r;
        let p = if self.rng.chance(60) {
            self.huge_u32(r.kv_allocated_len)
        } else {
            r.cache_protected_len + self.rng.upto(r.kv_allocated_len.saturating_sub(r.cache_protected_len))
        };
        // SAFETY: req_call passes the side's live handle and its local req.
        self.req_call(s, i, "skv_free_tail", format!(", prefix_len {p}"), |c, r| unsafe { skv_free_tail(c, r, p) }).0
    }

    fn op_free_aligned(&mut self, s: usize) -> skv_status {
        let i = self.pick_req(s, true);
        let side = &self.sides[s];
        let (owned, max, c) = (side.owned, side.max_ctx(), side.c);
        let r = side.reqs[i].r;
        let (row, target, end, expect) = match self.rng.below(10) {
            0 => (self.bad_row(s), 0, 0, Expect::Fail),
            1 => (r.req_pool_idx.max(0), 0, max + 1 + self.rng.upto(3), Expect::Fail),
            2 if owned => {
                let t = self.rng.upto(max);
                (self.rng.below(side.cfg.num_rows as u64) as i32, t, t + self.rng.upto(max - t), Expect::Any)
            }
            _ => {
                let lo = r.cache_protected_len;
                (
                    r.req_pool_idx,
                    lo + self.rng.upto(r.kv_allocated_len.saturating_sub(lo)),
                    r.kv_allocated_len,
                    Expect::Any,
                )
            }
        };
        if row < 0 && expect == Expect::Any {
            return SKV_OK;
        }
        // The engine lowers its req's cursor to the target itself: below the cursor that would
        // make window-freed SWA pages read as live.
        if matches!(self.sides[s].pools, Pools::Hybrid { .. }) && expect == Expect::Any && target < r.swa_evicted_seqlen
        {
            return SKV_OK;
        }
        // SAFETY: c is the side's live handle.
        let st = self.call(s, format!("skv_free_aligned({row}, {target}, {end})"), null(), expect, || unsafe {
            skv_free_aligned(c, row, target, end)
        });
        if self.completed(st) {
            for fr in self.sides[s].reqs.iter_mut().filter(|f| f.r.req_pool_idx == row) {
                // The engine lowers its own req after a row-level free.
                if let Some(m) = fr.matched.as_mut().filter(|_| target < end) {
                    sched::clamp_record(m, target);
                }
                let r = &mut fr.r;
                r.kv_allocated_len = r.kv_allocated_len.min(target);
                r.kv_committed_len = r.kv_committed_len.min(target);
                r.swa_evicted_seqlen = r.swa_evicted_seqlen.min(target);
            }
        }
        st
    }

    fn op_held(&mut self, s: usize) -> skv_status {
        let side = &self.sides[s];
        let c = side.c;
        let mut rows: Vec<i32> = side.reqs.iter().map(|f| f.r.req_pool_idx).filter(|&r| r >= 0).collect();
        // A row outside [0, num_rows) is refused, naming it.
        let bad = self.rng.chance(300);
        if bad {
            let extra = self.bad_row(s);
            rows.push(extra);
            rows.extend(rows.clone());
        }
        let listed = if bad { Expect::Is(SKV_ERR_INVALID_ARG) } else { Expect::Is(SKV_OK) };
        let mut h = held0();
        let hp: *mut skv_held = &mut h;
        match self.rng.below(10) {
            // SAFETY: c is the side's live handle; rows goes with its length; NULL out is refused.
            0 => self.call(s, "skv_session_held(NULL out)".into(), null(), Expect::Is(SKV_ERR_NULL_ARG), || unsafe {
                skv_session_held(c, rows.as_ptr(), rows.len(), null_mut())
            }),
            // SAFETY: c is the side's live handle; the NULL rows are refused; hp points at h.
            1 => self.call(s, "skv_session_held(NULL, 3)".into(), null(), Expect::Is(SKV_ERR_NULL_ARG), || unsafe {
                skv_session_held(c, null(), 3, hp)
            }),
            2 if !self.sides[s].traced || self.probes.traced_huge_lengths => {
                let n = self.impossible_len();
                self.call(
                    s,
                    format!("skv_session_held(rows, {n})"),
                    null(),
                    Expect::Is(SKV_ERR_INVALID_ARG),
                    // SAFETY: c is the side's live handle; hp points at h; n is impossible on
                    // purpose (its byte size is past isize::MAX), refused before rows is read.
                    || unsafe { skv_session_held(c, rows.as_ptr(), n, hp) },
                )
            }
            // SAFETY: c is the side's live handle; rows goes with its length; hp points at h.
            _ => self.call(s, format!("skv_session_held({rows:?})"), null(), listed, || unsafe {
                skv_session_held(c, rows.as_ptr(), rows.len(), hp)
            }),
        }
    }

    /// A NULL handle, req or out-pointer: SKV_ERR_NULL_ARG, nothing changed.
    fn op_null(&mut self, s: usize) -> skv_status {
        if self.rng.chance(500) {
            let k = self.rng.below(HANDLE_EXPORTS.len() as u64) as usize;
            let desc = format!("{}(NULL handle)", HANDLE_EXPORTS[k]);
            return self.call(s, desc, null(), Expect::Is(SKV_ERR_NULL_ARG), || call_export(k, null_mut()));
        }
        let c = self.sides[s].c;
        let i = self.pick_req(s, true);
        let mut r = self.sides[s].reqs[i].r;
        let rp: *mut skv_req = &mut r;
        let want = Expect::Is(SKV_ERR_NULL_ARG);
        let which = self.rng.below(8);
        let names = [
            "skv_match_prefix(NULL handle)",
            "skv_match_prefix(NULL out)",
            "skv_cache_finished_req(NULL req)",
            "skv_trim_overshoot(NULL req)",
            "skv_release_session(NULL)",
            "skv_checkpoint(NULL handled)",
            "skv_alloc_extend(NULL req)",
            "skv_cache_stats(NULL handle)",
        ];
        // SAFETY: c is the side's live handle; rp, m and stats are locals (skv_stats is plain
        // integers, so all zero is valid); each NULL is refused before use.
        self.call(s, names[which as usize].into(), rp, want, || unsafe {
            let mut m = skv_match { hit: 0, prefix_len: 0 };
            let mut stats = std::mem::zeroed::<skv_stats>();
            match which {
                0 => skv_match_prefix(null_mut(), 0, 0, rp, 0, 0, &mut m),
                1 => skv_match_prefix(c, 0, 0, rp, 0, 0, null_mut()),
                2 => skv_cache_finished_req(c, 0, 0, null_mut(), 1),
                3 => skv_trim_overshoot(c, null_mut(), 0),
                4 => skv_release_session(null_mut(), 0),
                5 => skv_checkpoint(c, 0, 0, rp, null_mut()),
                6 => skv_alloc_extend(c, null_mut(), 1, null_mut()),
                _ => skv_cache_stats(null_mut(), &mut stats),
            }
        })
    }

    fn op_trace(&mut self, s: usize) -> skv_status {
        let c = self.sides[s].c;
        match self.rng.below(4) {
            0 => {
                let bad = CString::new("/nonexistent-skv-dir/x/trace.jsonl").unwrap();
                self.call(
                    s,
                    "skv_cache_set_trace(bad path)".into(),
                    null(),
                    Expect::Is(SKV_ERR_INVALID_ARG),
                    // SAFETY: c is the side's live handle; bad is NUL-terminated.
                    || unsafe { skv_cache_set_trace(c, bad.as_ptr()) },
                )
            }
            1 => {
                let on = !self.sides[s].traced;
                self.log.push_back(format!("[{s}] skv_cache_set_trace({on})"));
                self.set_trace(s, on);
                SKV_OK
            }
            _ => self.call(
                s,
                "skv_cache_set_trace(NULL handle)".into(),
                null(),
                Expect::Is(SKV_ERR_NULL_ARG),
                // SAFETY: the NULL handle is refused before anything is read.
                || unsafe { skv_cache_set_trace(null_mut(), null()) },
            ),
        }
    }

    /// Handle creation with bad configs and struct sizes (the new handle, if any, is freed).
    fn op_new_hostile(&mut self, s: usize) -> skv_status {
        let base = self.sides[s].cfg;
        let size = std::mem::size_of::<skv_cache_config>();
        // A larger struct: this header's fields, then a tail an older library does not know.
        #[repr(C)]
        struct Big {
            cfg: skv_cache_config,
            tail: [u32; 4],
        }
        let mut big = Big { cfg: base, tail: [0; 4] };
        let mut expect = Expect::Fail;
        match self.rng.below(9) {
            0 => big.cfg.page_size = 0,
            1 => big.cfg.num_rows = 0,
            2 => big.cfg.max_context_len = 0,
            3 => big.cfg.flags = self.rng.pick(&[4, 0x8000_0000, u32::MAX]),
            4 | 5 if !self.sides[s].owned => big.cfg.page_size = 0,
            4 if base.page_size > 1 => big.cfg.num_token_slots = base.num_token_slots + 1,
            4 => big.cfg.num_token_slots = 1,
            5 => big.cfg.num_token_slots = (1 << 31) + base.page_size as u64 * 4,
            6 => big.cfg.struct_size = self.rng.pick(&[0, 4, size as u32 - 4]),
            7 => {
                big.cfg.struct_size = std::mem::size_of::<Big>() as u32;
                expect = Expect::Is(SKV_OK);
            }
            _ if self.probes.struct_tails => {
                big.cfg.struct_size = std::mem::size_of::<Big>() as u32;
                big.tail[self.rng.below(4) as usize] = 1;
            }
            _ => big.cfg.num_rows = (i32::MAX as u32) + 1,
        }
        let owned = self.sides[s].owned;
        let (eng, pools) = (self.sides[s].eng, self.sides[s].pools);
        // A NULL cfg, out or ops, or pool ops lacking a callback libskv cannot do without.
        let which = if self.rng.chance(200) { self.rng.below(if owned { 2 } else { 5 }) } else { 5 };
        let mut ops = engine::pool_ops(pools);
        match which {
            3 => ops.read_row = None,
            4 => (ops.free_kv, ops.free_kv_segment) = (None, None),
            _ => {}
        }
        let mut out = null_mut();
        let cfgp: *const skv_cache_config = if which == 0 { null() } else { &big.cfg };
        let outp: *mut *mut skv_cache = if which == 1 { null_mut() } else { &mut out };
        let opsp: *const skv_pool_ops = if which == 2 { null() } else { &ops };
        if which < 5 {
            expect = Expect::Is(SKV_ERR_NULL_ARG);
        }
        let nulls = format!("cfg {}, ops {}, out {}", !cfgp.is_null(), !opsp.is_null(), !outp.is_null());
        let desc = format!(
            "skv_cache_new{}({:?}, tail {:?}, {nulls})",
            if owned { "" } else { "_external" },
            big.cfg,
            big.tail
        );
        // SAFETY: cfgp is NULL or big.cfg, a local whose struct_size never exceeds
        // size_of::<Big>(), the bytes behind it; opsp is NULL or ops, a local; the engine outlives
        // any handle made here; outp is NULL or points at the local out.
        let st = self.call(s, desc, null(), expect, || unsafe {
            match owned {
                true => skv_cache_new(cfgp, outp),
                false => skv_cache_new_external(cfgp, opsp, eng as *mut c_void, outp),
            }
        });
        // SAFETY: out is NULL (a no-op) or the handle just made, freed once.
        unsafe { skv_cache_free(out) };
        st
    }

    // --- owned mode -----------------------------------------------------------------------------

    fn op_alloc_row(&mut self, s: usize) -> skv_status {
        let i = self.pick_req(s, false);
        self.alloc_row_at(s, i)
    }

    fn alloc_row_at(&mut self, s: usize, i: usize) -> skv_status {
        // SAFETY: req_call passes the side's live handle and its local req.
        let (st, _) = self.req_call(s, i, "skv_alloc_row", String::new(), |c, r| unsafe { skv_alloc_row(c, r) });
        if st == SKV_OK {
            let side = &mut self.sides[s];
            let fr = &mut side.reqs[i];
            let row = fr.r.req_pool_idx as usize;
            side.epoch[row] += 1;
            fr.epoch = side.epoch[row];
            fr.hit = None;
            let mut r = fr.r;
            // A new request: no prefix-tree lock or aux state of an earlier one.
            (r.lock_node, r.lock_receipt, r.aux_state, r.aux_track) = (0, 0, -1, [-1, -1]);
            self.fresh_lock(s, &mut r);
            self.sides[s].reqs[i].r = r;
        }
        st
    }

    fn op_extend(&mut self, s: usize) -> skv_status {
        let i = self.pick_req(s, true);
        let ps = self.sides[s].ps();
        let n = if self.rng.chance(60) { self.huge_u32(self.sides[s].max_ctx()) } else { self.rng.upto(2 * ps + 3) };
        // SAFETY: req_call passes the side's live handle and its local req; out_loc is NULL.
        self.req_call(s, i, "skv_alloc_extend", format!(", {n}"), |c, r| unsafe {
            skv_alloc_extend(c, r, n, std::ptr::null_mut())
        })
        .0
    }

    fn op_commit(&mut self, s: usize) -> skv_status {
        let i = self.pick_req(s, true);
        let r = self.sides[s].reqs[i].r;
        let room = r.kv_allocated_len.saturating_sub(r.kv_committed_len);
        let n = if self.rng.chance(60) { self.huge_u32(room) } else { self.rng.upto(room) };
        // SAFETY: req_call passes the side's live handle and its local req.
        self.req_call(s, i, "skv_commit", format!(", {n}"), |c, r| unsafe { skv_commit(c, r, n) }).0
    }

    fn op_free_req(&mut self, s: usize) -> skv_status {
        let i = self.pick_req(s, true);
        // SAFETY: req_call passes the side's live handle and its local req.
        self.req_call(s, i, "skv_free_req", String::new(), |c, r| unsafe { skv_free_req(c, r) }).0
    }

    fn op_pool_alloc(&mut self, s: usize) -> skv_status {
        let side = &self.sides[s];
        let (ps, c) = (side.ps(), side.c);
        let (n, expect) = match self.rng.below(8) {
            0 if ps > 1 => (ps + 1, Expect::Fail),
            1 => (self.rng.pick(&[u32::MAX, u32::MAX / 2, 1 << 30]) / ps * ps, Expect::Fail),
            _ => (ps * self.rng.upto(3), Expect::Any),
        };
        // A buffer as long as n (a hostile n gets NULL: libskv must refuse before writing).
        let mut out = if expect == Expect::Any { vec![-1i32; n as usize] } else { Vec::new() };
        let p = if expect == Expect::Any { out.as_mut_ptr() } else { null_mut() };
        // SAFETY: c is the side's live handle; p holds n indices, or is NULL for a hostile n.
        let st = self.call(s, format!("skv_pool_alloc({n})"), null(), expect, || unsafe { skv_pool_alloc(c, n, p) });
        if st == SKV_OK && n > 0 {
            self.sides[s].tree.push(out);
        }
        st
    }

    fn op_pool_free(&mut self, s: usize) -> skv_status {
        let side = &self.sides[s];
        let (c, traced) = (side.c, side.traced);
        let ntree = side.tree.len();
        let (mut idx, honest_group) = if ntree > 0 && !self.rng.chance(250) {
            let g = self.rng.below(ntree as u64) as usize;
            (side.tree[g].clone(), Some(g))
        } else {
            let total = side.cfg.num_token_slots as i32;
            ((0..1 + self.rng.below(4)).map(|_| self.rng.below(total as u64 + 4) as i32 - 2).collect(), None)
        };
        if self.rng.chance(100) && !idx.is_empty() {
            idx.push(idx[0]); // a duplicate index frees its page once
        }
        let huge = self.rng.chance(40) && (!traced || self.probes.traced_huge_lengths);
        let n = if huge { self.impossible_len() } else { idx.len() };
        let expect = if huge { Expect::Is(SKV_ERR_INVALID_ARG) } else { Expect::Any };
        // SAFETY: c is the side's live handle; n is idx's length, or impossible on purpose (its
        // byte size is past isize::MAX), refused before idx is read.
        let st = self.call(s, format!("skv_pool_free({idx:?}, n {n})"), null(), expect, || unsafe {
            skv_pool_free(c, idx.as_ptr(), n)
        });
        if st == SKV_OK {
            match honest_group {
                Some(g) => {
                    self.sides[s].tree.remove(g);
                }
                None => {
                    // Random indices that happened to fall on pages the engine holds.
                    let ps = self.sides[s].ps() as i32;
                    let pages: Vec<i32> = idx.iter().map(|i| i / ps).collect();
                    let tree = &mut self.sides[s].tree;
                    for g in tree.iter_mut() {
                        g.retain(|i| !pages.contains(&(i / ps)));
                    }
                    tree.retain(|g| !g.is_empty());
                }
            }
        }
        st
    }

    fn op_page_refs(&mut self, s: usize) -> skv_status {
        let side = &self.sides[s];
        let (c, traced) = (side.c, side.traced);
        let mut idx: Vec<i32> = side.tree.iter().flatten().copied().take(8).collect();
        idx.push(self.rng.below(side.cfg.num_token_slots + 3) as i32 - 1);
        let mut out = vec![0u32; idx.len()];
        let huge = self.rng.chance(60) && (!traced || self.probes.traced_huge_lengths);
        let n = if huge { self.impossible_len() } else { idx.len() };
        let expect = if huge { Expect::Is(SKV_ERR_INVALID_ARG) } else { Expect::Any };
        // SAFETY: c is the side's live handle; out has idx's length; n is that length, or
        // impossible on purpose (its byte size is past isize::MAX), refused before idx is read.
        self.call(s, format!("skv_page_refs({idx:?}, n {n})"), null(), expect, || unsafe {
            skv_page_refs(c, idx.as_ptr(), n, out.as_mut_ptr())
        })
    }

    fn op_map_prefix(&mut self, s: usize) -> skv_status {
        let i = self.pick_req(s, true);
        let side = &self.sides[s];
        let mut idx: Vec<i32> = match side.tree.len() {
            0 => Vec::new(),
            n => side.tree[self.rng.below(n as u64) as usize].clone(),
        };
        match self.rng.below(8) {
            0 if !idx.is_empty() => idx.extend(idx.clone()), // the same pages twice
            1 if !idx.is_empty() => idx[0] += 1,             // not page-structured
            2 => idx.truncate(idx.len().saturating_sub(1)),
            _ => {}
        }
        let n = idx.len() as u32;
        let p = idx.as_ptr();
        // SAFETY: req_call passes the side's live handle and its local req; p is idx (n indices).
        self.req_call(s, i, "skv_map_prefix", format!(", {idx:?}"), |c, r| unsafe { skv_map_prefix(c, r, p, n) }).0
    }

    fn op_publish(&mut self, s: usize) -> skv_status {
        let i = self.pick_req(s, true);
        let ps = self.sides[s].ps();
        let r = self.sides[s].reqs[i].r;
        let old = r.cache_protected_len;
        let newp = match self.rng.below(6) {
            0 => self.huge_u32(r.kv_committed_len),
            1 => old + 1,
            _ => old + self.rng.upto(r.kv_committed_len.saturating_sub(old)) / ps * ps,
        };
        self.no_mutate = true;
        // SAFETY: req_call passes the side's live handle and its local req.
        let (st, mutated) = self.req_call(s, i, "skv_publish_prefix", format!(", {newp}"), |c, r| unsafe {
            skv_publish_prefix(c, r, newp)
        });
        if st == SKV_OK && !mutated && newp > old {
            // The published pages are the engine's now: it hands them back at the end.
            let row = self.sides[s].reqs[i].r.req_pool_idx;
            let mut out = vec![0i32; (newp - old) as usize];
            let c = self.sides[s].c;
            // SAFETY: c is the side's live handle; out holds the newp - old indices asked for.
            assert_eq!(unsafe { skv_row_indices(c, row, old, newp, out.as_mut_ptr()) }, SKV_OK);
            self.sides[s].tree.push(out);
        }
        st
    }

    fn op_row_indices(&mut self, s: usize) -> skv_status {
        let side = &self.sides[s];
        let (c, max) = (side.c, side.max_ctx());
        let mut out = vec![0i32; max as usize + 8];
        let row = if self.rng.chance(200) { self.bad_row(s) } else { self.rng.below(side.cfg.num_rows as u64) as i32 };
        let start = self.rng.upto(max);
        let end = if self.rng.chance(100) { self.rng.upto(start) } else { start + self.rng.upto(max + 4 - start) };
        // SAFETY: c is the side's live handle; out holds max + 8 entries, at least end - start.
        self.call(s, format!("skv_row_indices({row}, {start}, {end})"), null(), Expect::Any, || unsafe {
            skv_row_indices(c, row, start, end, out.as_mut_ptr())
        })
    }

    fn op_flashinfer(&mut self, s: usize) -> skv_status {
        let side = &self.sides[s];
        let (c, traced) = (side.c, side.traced);
        let mut rows: Vec<i32> = side.reqs.iter().map(|f| f.r.req_pool_idx).filter(|&r| r >= 0).collect();
        if self.rng.chance(200) {
            rows.push(self.rng.pick(&[-1, 0, side.cfg.num_rows as i32]));
        }
        let cap = self.rng.upto(64) as usize;
        let (mut indptr, mut idx, mut last, mut needed) =
            (vec![0i32; rows.len() + 1], vec![0i32; cap], vec![0i32; rows.len()], 0usize);
        let huge = self.rng.chance(60) && (!traced || self.probes.traced_huge_lengths);
        let n = if huge { self.impossible_len() } else { rows.len() };
        let expect = if huge { Expect::Is(SKV_ERR_INVALID_ARG) } else { Expect::Any };
        // SAFETY: c is the side's live handle; indptr and last hold rows.len() + 1 and rows.len()
        // entries, idx holds cap; n is rows.len(), or impossible on purpose (its byte size is past
        // isize::MAX), refused before rows is read.
        self.call(s, format!("skv_build_flashinfer({rows:?}, n {n}, cap {cap})"), null(), expect, || unsafe {
            skv_build_flashinfer(
                c,
                rows.as_ptr(),
                n,
                indptr.as_mut_ptr(),
                idx.as_mut_ptr(),
                last.as_mut_ptr(),
                cap,
                &mut needed,
            )
        })
    }

    fn op_hooks(&mut self, s: usize) -> skv_status {
        let side = &self.sides[s];
        let (c, eng, traced) = (side.c, side.eng as *mut c_void, side.traced);
        #[repr(C)]
        struct Big {
            h: skv_engine_hooks,
            tail: [u64; 2],
        }
        let mut big = Big { h: engine::hooks(), tail: [0; 2] };
        let size = std::mem::size_of::<skv_engine_hooks>() as u32;
        let (desc, expect) = match self.rng.below(8) {
            0 => {
                big.h.struct_size = std::mem::size_of::<Big>() as u32;
                ("larger, zero tail", Expect::Is(SKV_OK))
            }
            1 if self.probes.struct_tails => {
                big.h.struct_size = std::mem::size_of::<Big>() as u32;
                big.tail[1] = 5;
                ("larger, non-zero tail", Expect::Is(SKV_ERR_INVALID_ARG))
            }
            2 if !traced || self.probes.traced_short_hooks => {
                return self.short_hooks(s);
            }
            3 => {
                // Below the first published size (24), and between two published sizes.
                big.h.struct_size = if self.rng.below(2) == 0 { 16 } else { size - 4 };
                ("short struct_size", Expect::Is(SKV_ERR_INVALID_ARG))
            }
            _ => ("full", Expect::Is(SKV_OK)),
        };
        // SAFETY: c is the side's live handle; big.h's struct_size never exceeds size_of::<Big>(),
        // the bytes behind it; the engine outlives the handle.
        let st = self.call(s, format!("skv_cache_set_hooks({desc})"), null(), expect, || unsafe {
            skv_cache_set_hooks(c, &big.h, eng)
        });
        if st == SKV_OK {
            self.sides[s].copy_hook = true;
        }
        st
    }

    /// A 4-byte hooks struct whose next byte is unreadable: nothing past struct_size is read.
    fn short_hooks(&mut self, s: usize) -> skv_status {
        let c = self.sides[s].c;
        let eng = self.sides[s].eng as *mut c_void;
        let page = 4096usize;
        // SAFETY: a fresh private mapping of two pages, the second made unreadable.
        unsafe {
            let base = libc::mmap(
                null_mut(),
                2 * page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(base, libc::MAP_FAILED);
            assert_eq!(libc::mprotect((base as *mut u8).add(page) as *mut c_void, page, libc::PROT_NONE), 0);
            let at = (base as *mut u8).add(page - 4) as *mut u32;
            *at = 4;
            let st = self.call(
                s,
                "skv_cache_set_hooks(4-byte struct before a guard page)".into(),
                null(),
                Expect::Is(SKV_ERR_INVALID_ARG),
                || skv_cache_set_hooks(c, at as *const skv_engine_hooks, eng),
            );
            libc::munmap(base, 2 * page);
            st
        }
    }

    fn op_copy(&mut self, s: usize) -> skv_status {
        let i = self.pick_req(s, true);
        let fr = self.sides[s].reqs[i];
        if fr.r.req_pool_idx >= 0 {
            // A copy may act for the live req (libskv cannot tell them apart while the row's
            // lifetime lasts); without the lock and aux state, the engine's lock accounting
            // stays exact whichever of the two finishes.
            let mut copy = fr;
            (copy.r.lock_node, copy.r.lock_receipt, copy.r.aux_state, copy.r.aux_track) = (0, 0, -1, [-1, -1]);
            self.sides[s].stale.push(copy);
        }
        SKV_OK
    }

    /// A stale copy of a req: of the row's current lifetime (libskv checks it against the row's
    /// record), or, as a probe, of a row since handed to another request.
    fn op_stale(&mut self, s: usize) -> skv_status {
        let side = &self.sides[s];
        if side.stale.is_empty() {
            return SKV_OK;
        }
        let k = self.rng.below(side.stale.len() as u64) as usize;
        let fr = side.stale[k];
        let row = fr.r.req_pool_idx as usize;
        let reused = side.epoch[row] != fr.epoch;
        if reused && !self.probes.stale_reused_rows {
            self.sides[s].stale.remove(k);
            return SKV_OK;
        }
        let c = side.c;
        let mut r = fr.r;
        let rp: *mut skv_req = &mut r;
        // libskv recognizes a stale copy by the row generation it stamped: always in owned mode
        // (alloc_row stamps every row), in external mode only where it stamped the copy and
        // itself handed the row back since (the engine frees and reuses rows on its own too).
        let detectable = side.owned && fr.r.row_generation != 0;
        let expect = if reused && detectable { Expect::Fail } else { Expect::Any };
        let tag = if reused { "stale copy, row reused" } else { "stale copy" };
        // A copy of a request since finished or handed back: its slot is idle (or gone), so a
        // hand-back must fail. A copy of a live request may act for it, and so may one libskv
        // cannot tell from the request now on its row (the stamp it would compare is missing).
        let acts_for = |l: &FReq| l.r.req_pool_idx == fr.r.req_pool_idx && (l.epoch == fr.epoch || !detectable);
        let live = side.reqs.iter().any(acts_for);
        // A match hit restores a session into the copy, which then runs: the model keeps it in a
        // free req slot (a live copy frees its live req's), so without one the copy is not used
        // for a match.
        let slot_free = live || side.reqs.iter().any(|l| l.r.req_pool_idx < 0);
        let mut restored = None;
        let mut matched = None;
        let (name, st) = match self.rng.below(7) {
            6 => {
                let (sid, b) = match fr.hit {
                    Some(k) if self.rng.chance(800) => k,
                    _ => (self.session(), self.branch()),
                };
                let expect = if live { expect } else { Expect::Fail };
                (
                    "hand_back",
                    // SAFETY: c is the side's live handle; rp points at the copy r.
                    self.call(s, format!("skv_hand_back({tag} {}, s {sid} b {b})", show(&r)), rp, expect, || unsafe {
                        skv_hand_back(c, sid, b, rp)
                    }),
                )
            }
            0 => (
                "skv_free_req",
                // SAFETY: c is the side's live handle; rp points at the copy r.
                self.call(s, format!("skv_free_req({tag} {})", show(&r)), rp, expect, || unsafe {
                    skv_free_req(c, rp)
                }),
            ),
            1 => (
                "skv_alloc_extend",
                // SAFETY: c is the side's live handle; rp points at the copy r; out_loc is NULL.
                self.call(s, format!("skv_alloc_extend({tag} {}, 1)", show(&r)), rp, expect, || unsafe {
                    skv_alloc_extend(c, rp, 1, std::ptr::null_mut())
                }),
            ),
            2 => (
                "skv_trim_overshoot",
                // SAFETY: c is the side's live handle; rp points at the copy r.
                self.call(s, format!("skv_trim_overshoot({tag} {}, 0)", show(&r)), rp, expect, || unsafe {
                    skv_trim_overshoot(c, rp, 0)
                }),
            ),
            3 => {
                let (sid, b) = (self.session(), self.branch());
                (
                    "finish",
                    self.call(
                        s,
                        format!("skv_cache_finished_req({tag} {}, s {sid} b {b}, aborted 1)", show(&r)),
                        rp,
                        expect,
                        // SAFETY: c is the side's live handle; rp points at the copy r.
                        || unsafe { skv_cache_finished_req(c, sid, b, rp, 1) },
                    ),
                )
            }
            4 => {
                let (sid, b) = (self.session(), self.branch());
                let mut h = 0u32;
                (
                    "checkpoint",
                    // SAFETY: c is the side's live handle; rp points at the copy r; h is a local.
                    self.call(s, format!("skv_checkpoint({tag} {}, s {sid} b {b})", show(&r)), rp, expect, || unsafe {
                        skv_checkpoint(c, sid, b, rp, &mut h)
                    }),
                )
            }
            _ if !slot_free => return SKV_OK,
            _ => {
                let sid = self.session();
                let mut m = skv_match { hit: 0, prefix_len: 0 };
                // SAFETY: c is the side's live handle; rp points at the copy r; m is a local.
                let st =
                    self.call(s, format!("skv_match_prefix({tag} {}, s {sid} b 0)", show(&r)), rp, expect, || unsafe {
                        skv_match_prefix(c, sid, 0, rp, 0, 0, &mut m)
                    });
                if self.completed(st) && m.hit == 1 {
                    restored = Some((sid, 0));
                    matched = (st == SKV_OK).then_some(r);
                }
                ("match", st)
            }
        };
        // A hit leaves the copy's fields as they were when its session's slot held this row.
        if self.completed(st) && name != "checkpoint" && (r != fr.r || restored.is_some()) {
            // The copy acted as the live req: the live one is stale now.
            let side = &mut self.sides[s];
            side.stale.remove(k);
            let mut hit = None;
            for live in side.reqs.iter_mut().filter(|l| acts_for(l)) {
                hit = hit.or(live.hit);
                *live = FReq { r: init_req(), epoch: 0, hit: None, matched: None };
            }
            if r.req_pool_idx >= 0 {
                if let Some(slot) = side.reqs.iter_mut().find(|l| l.r.req_pool_idx < 0) {
                    let row = r.req_pool_idx as usize;
                    *slot = FReq { r, epoch: side.epoch[row], hit: restored.or(hit), matched };
                }
            }
        }
        st
    }

    // --- external mode ------------------------------------------------------------------------

    /// Owned-only calls on an external handle: SKV_ERR_UNSUPPORTED after the NULL checks.
    fn op_unsupported(&mut self, s: usize) -> skv_status {
        let c = self.sides[s].c;
        let mut r = init_req();
        let rp: *mut skv_req = &mut r;
        let mut buf = [0i32; 16];
        let bp = buf.as_mut_ptr();
        let rows = self.sides[s].cfg.num_rows as i32;
        let row = if self.probes.external_unsupported {
            self.rng.pick(&[-5, 0, rows, i32::MAX])
        } else {
            self.rng.below(rows as u64) as i32
        };
        let want = Expect::Is(SKV_ERR_UNSUPPORTED);
        let mut st_ = skv_stats {
            total_pages: 0,
            free_pages: 0,
            used_pages: 0,
            total_rows: 0,
            free_rows: 0,
            sessions: 0,
            trimmed_tokens: 0,
            tail_freed_tokens: 0,
            swa_total_pages: 0,
            swa_free_pages: 0,
            swa_used_pages: 0,
            finishes_past_committed: 0,
        };
        let sp: *mut skv_stats = &mut st_;
        match self.rng.below(8) {
            // SAFETY: c is the side's live handle; rp points at the local r.
            0 => self.call(s, "skv_alloc_row(external)".into(), rp, want, || unsafe { skv_alloc_row(c, rp) }),
            // SAFETY: c is the side's live handle; rp points at the local r; out_loc is NULL.
            1 => self.call(s, "skv_alloc_extend(external)".into(), rp, want, || unsafe {
                skv_alloc_extend(c, rp, 4, std::ptr::null_mut())
            }),
            // SAFETY: c is the side's live handle; bp: buf's 16 entries, 4 asked for.
            2 => self.call(s, "skv_pool_alloc(external)".into(), null(), want, || unsafe { skv_pool_alloc(c, 4, bp) }),
            // SAFETY: c is the side's live handle; bp: buf's 16 entries, 4 passed.
            3 => self.call(s, "skv_pool_free(external)".into(), null(), want, || unsafe { skv_pool_free(c, bp, 4) }),
            // skv_cache_stats answers in external mode (what libskv knows there).
            4 if self.rng.chance(500) => {
                // SAFETY: c is the side's live handle; sp points at the local st_.
                self.call(s, "skv_cache_stats(external)".into(), null(), Expect::Is(SKV_OK), || unsafe {
                    skv_cache_stats(c, sp)
                })
            }
            4 => {
                let mut a = skv_admission { hit: 0, prefix_len: 0, pages_needed: 0, pages_freed: 0 };
                // SAFETY: c is the side's live handle; a is a local.
                self.call(s, "skv_admission_pages(external)".into(), null(), want, || unsafe {
                    skv_admission_pages(c, 1, 0, 0, 4, &mut a)
                })
            }
            // SAFETY: c is the side's live handle; bp: buf's 16 entries, 4 asked for.
            5 => self.call(s, format!("skv_row_indices(external, row {row})"), null(), want, || unsafe {
                skv_row_indices(c, row, 0, 4, bp)
            }),
            // SAFETY: c is the side's live handle; bp: buf's 16 entries, 4 indices and 4 counts.
            6 if self.rng.chance(500) => self.call(s, "skv_page_refs(external)".into(), null(), want, || unsafe {
                skv_page_refs(c, bp, 4, bp.add(8).cast())
            }),
            6 => {
                let mut needed = 0usize;
                let desc = format!("skv_build_flashinfer(external, row {row})");
                // SAFETY: c is the side's live handle; buf holds the row, 2 indptr values, 8
                // indices and 1 last page length, apart; needed is a local.
                self.call(s, desc, null(), want, || unsafe {
                    *bp = row;
                    skv_build_flashinfer(c, bp, 1, bp.add(2), bp.add(4), bp.add(12), 8, &mut needed)
                })
            }
            // SAFETY: c is the side's live handle; the hooks struct lives through the call.
            _ => self.call(s, "skv_cache_set_hooks(external)".into(), null(), want, || unsafe {
                skv_cache_set_hooks(c, &engine::hooks(), null_mut())
            }),
        }
    }

    // --- the end of a world ---------------------------------------------------------------------

    /// Releases everything and checks that nothing leaked, then frees the handles.
    pub fn teardown(mut self) {
        for s in 0..2 {
            let e = self.sides[s].eng();
            (e.fail_rate, e.reenter_rate) = (0, 0);
        }
        for s in 0..2 {
            self.complete_all_tickets(s);
            let c = self.sides[s].c;
            for i in 0..REQS {
                if let Some((sid, b)) = self.sides[s].reqs[i].hit {
                    let mut r = self.sides[s].reqs[i].r;
                    // Engine fields a trim may have left inconsistent (finished_len > output_len).
                    r.finished_len = -1;
                    let rp: *mut skv_req = &mut r;
                    // SAFETY: c is the side's live handle; rp points at the local r.
                    let st = self.call(s, format!("teardown: abort req#{i}"), rp, Expect::Any, || unsafe {
                        skv_cache_finished_req(c, sid, b, rp, 1)
                    });
                    if st == SKV_OK {
                        self.sides[s].reqs[i] = FReq { r, epoch: 0, hit: None, matched: None };
                    }
                }
            }
            for sid in (0..SESSIONS).chain(HOSTILE_SESSIONS) {
                if self.sides[s].owned {
                    self.abort_lost_requests(s, sid);
                }
                // SAFETY: c is the side's live handle.
                self.call(s, format!("teardown: release session {sid}"), null(), Expect::Is(SKV_OK), || unsafe {
                    skv_release_session(c, sid)
                });
            }
            if self.sides[s].owned {
                self.teardown_owned(s);
            } else {
                for i in 0..REQS {
                    self.sides[s].reqs[i].hit = None;
                    let fr = self.sides[s].reqs[i];
                    if fr.r.req_pool_idx >= 0 {
                        let e = self.sides[s].eng();
                        e.free_positions(fr.r.req_pool_idx, 0, fr.r.kv_allocated_len);
                        e.row_free[fr.r.req_pool_idx as usize] = true;
                    }
                }
                if let Some(l) = self.sides[s].eng().leaks() {
                    self.fail(&format!("external mode, after releasing everything: {l}"));
                }
            }
        }
        for side in &self.sides {
            // SAFETY: each handle and engine freed once, the handle first.
            unsafe {
                skv_cache_free(side.c);
                drop(Box::from_raw(side.eng));
            }
            if let Some(p) = &side.trace {
                let _ = std::fs::remove_file(p);
            }
        }
    }

    /// Owned mode: aborts the running requests of session `sid` whose req the fuzzer no longer
    /// holds (a stale copy or an adopted hostile req acted for it), from the rows' records.
    fn abort_lost_requests(&mut self, s: usize, sid: u64) {
        let c = self.sides[s].c;
        // SAFETY: c is the side's live handle.
        if unsafe { skv_release_session(c, sid) } != SKV_ERR_STATE {
            return;
        }
        for r in 0..self.sides[s].cfg.num_rows as i32 {
            let Some(len) = self.sides[s].row_len(r) else { continue };
            for b in [0, 1, u64::MAX] {
                for mut q in self.sides[s].row_reqs(r, len).collect::<Vec<_>>() {
                    // SAFETY: c is the side's live handle; q is a local.
                    if unsafe { skv_cache_finished_req(c, sid, b, &mut q, 1) } == SKV_OK {
                        self.log.push_back(format!("[{s}] teardown: aborted session {sid} branch {b} on row {r}"));
                        break;
                    }
                }
            }
        }
    }

    fn teardown_owned(&mut self, s: usize) {
        let c = self.sides[s].c;
        for r in 0..self.sides[s].cfg.num_rows as i32 {
            let Some(len) = self.sides[s].row_len(r) else { continue };
            let mut reqs = self.sides[s].row_reqs(r, len);
            // SAFETY: c is the side's live handle; q is a local.
            let freed = reqs.any(|mut q| unsafe { skv_free_req(c, &mut q) == SKV_OK });
            if !freed {
                self.fail(&format!("teardown: row {r} ({len} tokens) cannot be freed"));
            }
        }
        for g in std::mem::take(&mut self.sides[s].tree) {
            // SAFETY: c is the side's live handle; g is passed with its length.
            self.call(s, format!("teardown: skv_pool_free({g:?})"), null(), Expect::Is(SKV_OK), || unsafe {
                skv_pool_free(c, g.as_ptr(), g.len())
            });
        }
        // SAFETY: skv_stats is plain integers, so all zero is a valid value.
        let mut st = unsafe { std::mem::zeroed::<skv_stats>() };
        // SAFETY: c is the side's live handle; st is a local.
        assert_eq!(unsafe { skv_cache_stats(c, &mut st) }, SKV_OK);
        if st.free_pages != st.total_pages - 1
            || st.free_rows != st.total_rows
            || st.sessions != 0
            || st.swa_used_pages != 0
            || st.swa_free_pages != st.swa_total_pages.saturating_sub(1)
        {
            self.fail(&format!("owned mode, after releasing everything: {st:?}"));
        }
    }
}

/// How many recent calls a finding prints (`SKV_FUZZ_LOG`, default 48).
fn log_len() -> usize {
    static LEN: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *LEN.get_or_init(|| std::env::var("SKV_FUZZ_LOG").ok().and_then(|v| v.parse().ok()).unwrap_or(48))
}

fn show(r: &skv_req) -> String {
    format!(
        "{{row {} com {} alloc {} prot {} swa {} floor {} origin {} out {} fin {} lock {} aux {} track {}/{}}}",
        r.req_pool_idx,
        r.kv_committed_len,
        r.kv_allocated_len,
        r.cache_protected_len,
        r.swa_evicted_seqlen,
        r.swa_evict_floor,
        r.origin_input_len,
        r.output_len,
        r.finished_len,
        r.lock_node,
        r.aux_state,
        r.aux_track[0],
        r.aux_track[1]
    )
}
