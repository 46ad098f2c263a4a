//! Hybrid pools in external mode: random multi-turn sessions with sliding-window steps over a
//! fake engine that owns two paged pools, full-attention and sliding-window (SWA), with a
//! full-page → SWA-page mapping like sglang's SWA allocator. libskv frees through
//! `free_kv_segment`; after every call the pieces it handed back are compared with what
//! sglang's own functions (ported below: `free_kv_row_segments`, `free_swa_out_of_window_slots`,
//! `swa_dead_lo`, the streaming session's trim, tail free and release) free on a record kept
//! beside it, and the req's lengths and cursor with that record. The engine flags every SWA page
//! freed twice, every full page freed with its SWA peer still live (the peer would leak), every
//! full page freed twice and every misplaced index; at the end, with every session released and
//! the tree's prefix pages freed by the engine, no page of either pool may still be live.

// As in the library: every unsafe block says why it is sound.
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

mod common;

use common::*;
use proptest::prelude::*;
use skv::*;
use std::collections::{HashMap, HashSet};
use std::ffi::{c_int, c_void};

// ---------------------------------------------------------------------------------------------
// The fake engine: two paged pools and a full → SWA page mapping.
// ---------------------------------------------------------------------------------------------

/// One piece handed back: row, first position, end position, pools.
type Piece = (i32, u32, u32, u32);

#[derive(Default)]
struct Engine {
    ps: u32,
    /// Each row's full pages, by page slot.
    pages: Vec<Vec<u32>>,
    full_live: HashSet<u32>,
    /// A full page's live SWA peer.
    swa_peer: HashMap<u32, u32>,
    swa_live: HashSet<u32>,
    next_page: u32,
    /// Pages the prefix tree owns; the engine frees them itself at the end.
    tree: Vec<u32>,
    pieces: Vec<Piece>,
    findings: Vec<String>,
}

impl Engine {
    fn slot(&self, row: usize, pos: u32) -> i32 {
        (self.pages[row][(pos / self.ps) as usize] * self.ps + pos % self.ps) as i32
    }

    /// Maps `[from, to)` of a row, reusing the live page that holds `from` (a kept partial page).
    fn alloc(&mut self, row: usize, from: u32, to: u32) {
        for pos in from..to {
            let s = (pos / self.ps) as usize;
            if s < self.pages[row].len() && self.full_live.contains(&self.pages[row][s]) {
                continue;
            }
            let (full, swa) = (self.next_page, self.next_page + 1_000_000);
            self.next_page += 1;
            self.full_live.insert(full);
            self.swa_live.insert(swa);
            self.swa_peer.insert(full, swa);
            if s < self.pages[row].len() {
                self.pages[row][s] = full;
            } else {
                self.pages[row].push(full);
            }
        }
    }

    fn free_swa(&mut self, page: u32, why: &str) {
        match self.swa_peer.remove(&page) {
            Some(swa) => {
                self.swa_live.remove(&swa);
            }
            None => self.findings.push(format!("{why}: SWA peer of full page {page} freed twice")),
        }
    }

    fn free_full(&mut self, page: u32, why: &str) {
        if self.swa_peer.contains_key(&page) {
            self.findings.push(format!("{why}: full page {page} freed alone while its SWA peer lives (leak)"));
        }
        if !self.full_live.remove(&page) {
            self.findings.push(format!("{why}: full page {page} freed twice"));
        }
    }

    fn segment(&mut self, row: i32, first_pos: u32, idx: &[i32], pools: u32) {
        let why = format!("free_kv_segment(row {row}, {first_pos}+{}, pools {pools})", idx.len());
        if !first_pos.is_multiple_of(self.ps) {
            self.findings.push(format!("{why}: first_pos not page-aligned"));
        }
        for (k, &i) in idx.iter().enumerate() {
            if i != self.slot(row as usize, first_pos + k as u32) {
                self.findings.push(format!("{why}: index {i} is not row position {}", first_pos + k as u32));
            }
        }
        let mut pages: Vec<u32> = idx.iter().map(|&i| i as u32 / self.ps).collect();
        pages.dedup();
        for p in pages {
            match pools {
                SKV_POOL_BOTH => {
                    self.free_swa(p, &why);
                    self.free_full(p, &why);
                }
                SKV_POOL_FULL => self.free_full(p, &why),
                SKV_POOL_SWA => self.free_swa(p, &why),
                _ => self.findings.push(format!("{why}: unknown pools")),
            }
        }
        self.pieces.push((row, first_pos, first_pos + idx.len() as u32, pools));
    }
}

/// # Safety
/// `ud` must be the `Engine` this test handed libskv as user_data, alive and not otherwise
/// borrowed while a callback runs.
unsafe fn eng<'a>(ud: *mut c_void) -> &'a mut Engine {
    // SAFETY: the contract above.
    unsafe { &mut *(ud as *mut Engine) }
}

unsafe extern "C" fn cb_read_row(ud: *mut c_void, row: i32, start: u32, end: u32, out: *mut i32) -> c_int {
    // SAFETY: ud is the Engine this test passed as user_data; libskv calls back one at a time.
    let e = unsafe { eng(ud) };
    for p in start..end {
        // SAFETY: libskv hands read_row room for end - start values at out.
        unsafe { *out.add((p - start) as usize) = e.slot(row as usize, p) };
    }
    0
}

unsafe extern "C" fn cb_free_row(ud: *mut c_void, row: i32) -> c_int {
    // SAFETY: ud is the Engine this test passed as user_data; libskv calls back one at a time.
    unsafe { eng(ud) }.pages[row as usize].clear();
    0
}

unsafe extern "C" fn cb_segment(ud: *mut c_void, row: i32, first: u32, idx: *const i32, n: usize, pools: u32) -> c_int {
    // SAFETY: ud is the Engine this test passed as user_data, and libskv hands n readable
    // indices at idx.
    unsafe { eng(ud).segment(row, first, std::slice::from_raw_parts(idx, n), pools) };
    0
}

// ---------------------------------------------------------------------------------------------
// sglang 0.5.23, ported: the record a session keeps and what each step frees.
// ---------------------------------------------------------------------------------------------

/// sglang's ReqKvInfo, as far as the frees read it.
#[derive(Clone, Copy, Debug, Default)]
struct Rec {
    protected: u32,
    floor: u32,
    evicted: u32,
    allocated: u32,
    committed: u32,
}

fn align_up(x: u32, ps: u32) -> u32 {
    x.div_ceil(ps) * ps
}

impl Rec {
    fn swa_dead_lo(&self, ps: u32) -> u32 {
        let lo = self.protected.max(self.floor);
        if ps > 1 && lo > self.protected {
            align_up(lo, ps)
        } else {
            lo
        }
    }

    /// `free_kv_row_segments` for one range (`free_kv_row` of `[(start, end)]`).
    fn free_row(&self, row: i32, start: u32, end: u32, ps: u32) -> Vec<Piece> {
        let (dead_lo, dead_hi) = (self.swa_dead_lo(ps), self.evicted.max(self.swa_dead_lo(ps)));
        let lo = dead_lo.max(start).min(end);
        let hi = dead_hi.max(start).min(end);
        let (mut dead, mut alive) = (vec![], vec![]);
        if hi <= lo {
            alive.push((row, start, end, SKV_POOL_BOTH));
        } else {
            dead.push((row, lo, hi, SKV_POOL_FULL));
            if lo > start {
                alive.push((row, start, lo, SKV_POOL_BOTH));
            }
            if end > hi {
                alive.push((row, hi, end, SKV_POOL_BOTH));
            }
        }
        dead.extend(alive);
        dead.retain(|p| p.1 < p.2);
        dead
    }

    /// `StreamingSession._free_kv_aligned`.
    fn free_aligned(&self, row: i32, target: u32, end: u32, ps: u32) -> Vec<Piece> {
        let start = if ps > 1 { align_up(target, ps) } else { target };
        if end <= start {
            return vec![];
        }
        self.free_row(row, start, end, ps)
    }

    fn clamp(&mut self, len: u32) {
        self.evicted = self.evicted.min(len);
    }

    /// `_trim_overshoot` then the slot's committed length (`try_cache_finished_req`).
    fn finish(&mut self, row: i32, full_target: u32, ps: u32) -> Vec<Piece> {
        let mut target = full_target;
        if ps > 1 && self.evicted > target {
            target = target / ps * ps;
        }
        let freed = self.free_aligned(row, target, self.allocated, ps);
        self.allocated = self.allocated.min(target);
        self.committed = self.committed.min(target);
        self.clamp(target);
        self.committed = full_target.min(self.allocated);
        freed
    }

    /// `try_match_prefix` with `_free_tail`.
    fn matched(&mut self, row: i32, key_len: u32, ps: u32) -> (u32, Vec<Piece>) {
        let mut prefix = self.committed.min(key_len);
        if ps > 1 && self.evicted > prefix {
            prefix = prefix / ps * ps;
            self.committed = self.committed.min(prefix);
        }
        let freed = self.free_aligned(row, prefix, self.allocated, ps);
        self.allocated = prefix;
        self.committed = self.committed.min(prefix);
        self.clamp(prefix);
        (prefix, freed)
    }

    /// `free_swa_out_of_window_slots`.
    fn evict(&mut self, row: i32, pre_len: u32, w: &Win, ps: u32) -> Vec<Piece> {
        let (pre, size) = (pre_len as i64, w.size as i64);
        if pre - size < self.evicted as i64 + w.interval as i64 {
            return vec![];
        }
        let evicted = self.evicted.max(self.swa_dead_lo(ps));
        self.evicted = evicted;
        let mut thr = if !w.sharing { pre - size } else { pre - align_up(w.size.max(ps), ps) as i64 };
        if let (Some(f), true) = (w.retain, w.sharing) {
            thr = thr.min(f as i64);
        }
        let mut new = thr.max(evicted as i64);
        if ps > 1 {
            new = new / ps as i64 * ps as i64;
        }
        if new > evicted as i64 {
            self.evicted = new as u32;
            return vec![(row, evicted, new as u32, SKV_POOL_SWA)];
        }
        vec![]
    }
}

#[derive(Clone, Copy, Debug)]
struct Win {
    size: u32,
    interval: u32,
    sharing: bool,
    retain: Option<u32>,
}

// ---------------------------------------------------------------------------------------------
// The driver.
// ---------------------------------------------------------------------------------------------

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn upto(&mut self, n: u32) -> u32 {
        (self.next() % (n as u64 + 1)) as u32
    }
    fn chance(&mut self, pct: u32) -> bool {
        self.upto(99) < pct
    }
}

#[derive(Clone, Copy)]
enum State {
    None,
    Idle(Rec),
    Running(Rec, skv_req),
}

const ROWS: usize = 4;
const COLS: u32 = 160;

struct Sim {
    ps: u32,
    eng: Box<Engine>,
    cache: *mut skv_cache,
    sessions: [State; ROWS],
    rng: Rng,
    steps: usize,
    seen_pools: HashSet<u32>,
}

impl Drop for Sim {
    fn drop(&mut self) {
        // SAFETY: the handle this Sim created, freed once.
        unsafe { skv_cache_free(self.cache) };
    }
}

impl Sim {
    fn new(ps: u32, seed: u64) -> Sim {
        let mut eng = Box::new(Engine { ps, pages: vec![vec![]; ROWS], ..Engine::default() });
        let cfg = skv_cache_config {
            struct_size: std::mem::size_of::<skv_cache_config>() as u32,
            page_size: ps,
            num_token_slots: 0,
            num_rows: ROWS as u32,
            max_context_len: COLS,
            flags: 0,
            swa_num_token_slots: 0,
            ..Default::default()
        };
        let ops = skv_pool_ops {
            struct_size: std::mem::size_of::<skv_pool_ops>() as u32,
            read_row: Some(cb_read_row),
            free_kv: None,
            free_row: Some(cb_free_row),
            dec_lock_ref: None,
            free_aux: None,
            free_kv_segment: Some(cb_segment),
        };
        let mut cache = std::ptr::null_mut();
        let ud = &mut *eng as *mut Engine as *mut c_void;
        // SAFETY: the handle is this test's live cache; the other pointers are locals.
        let st = unsafe { skv_cache_new_external(&cfg, &ops, ud, &mut cache) };
        assert_eq!(code(st), 0, "{}", last_error());
        Sim { ps, eng, cache, sessions: [State::None; ROWS], rng: Rng(seed | 1), steps: 0, seen_pools: HashSet::new() }
    }

    /// Checks what the last call handed back against sglang's frees, and the req against the
    /// record.
    fn check(&mut self, what: &str, st: skv_status, want: Vec<Piece>, req: Option<(&skv_req, &Rec)>) {
        self.steps += 1;
        assert_eq!(code(st), 0, "step {}: {what}: {}", self.steps, last_error());
        let got = std::mem::take(&mut self.eng.pieces);
        self.seen_pools.extend(got.iter().map(|p| p.3));
        assert_eq!(got, want, "step {}: {what}: frees differ from sglang's", self.steps);
        assert!(self.eng.findings.is_empty(), "step {}: {what}: {:?}", self.steps, self.eng.findings);
        if let Some((r, rec)) = req {
            let got = (r.kv_allocated_len, r.kv_committed_len, r.swa_evicted_seqlen, r.swa_evict_floor);
            assert_eq!(got, (rec.allocated, rec.committed, rec.evicted, rec.floor), "step {}: {what}", self.steps);
        }
    }

    fn step(&mut self, s: usize) {
        let row = s as i32;
        match self.sessions[s] {
            State::None => self.first_turn(s),
            State::Idle(rec) if self.rng.chance(25) => {
                // SAFETY: the handle is this test's live cache; the other pointers are locals.
                let st = unsafe { skv_release_session(self.cache, s as u64) };
                let want = rec.free_row(row, rec.protected, rec.allocated, self.ps);
                self.check("release", st, want, None);
                self.sessions[s] = State::None;
            }
            State::Idle(mut rec) => {
                let key = rec.protected + self.rng.upto(rec.committed + 8 - rec.protected);
                let mut r = skv_req::default();
                let mut m = skv_match { hit: 0, prefix_len: 0 };
                // SAFETY: the handle is this test's live cache; the other pointers are locals.
                let st = unsafe { skv_match_prefix(self.cache, s as u64, 0, &mut r, key, 0, &mut m) };
                let (prefix, want) = rec.matched(row, key, self.ps);
                self.check("match", st, want, Some((&r, &rec)));
                assert_eq!((m.hit, m.prefix_len), (1, prefix));
                let origin = (prefix + 1 + self.rng.upto(12)).min(COLS);
                self.eng.alloc(s, prefix, origin);
                (rec.allocated, rec.committed) = (origin, origin);
                // A prefill raises the floor (sglang: to the prefill's end) only while the window
                // has freed nothing: positions freed below a raised floor would read as live.
                if rec.evicted <= rec.swa_dead_lo(self.ps) && self.rng.chance(60) {
                    rec.floor = origin;
                }
                (r.kv_allocated_len, r.kv_committed_len, r.swa_evict_floor) = (origin, origin, rec.floor);
                (r.origin_input_len, r.output_len) = (origin, 0);
                self.sessions[s] = State::Running(rec, r);
            }
            State::Running(rec, r) => self.run(s, rec, r),
        }
    }

    fn first_turn(&mut self, s: usize) {
        let len = 1 + self.rng.upto(40);
        let protected = self.rng.upto(len) / self.ps * self.ps;
        self.eng.alloc(s, 0, len);
        let tree: Vec<u32> = self.eng.pages[s][..(protected / self.ps) as usize].to_vec();
        self.eng.tree.extend(tree);
        let floor = if self.rng.chance(60) { len } else { 0 };
        let rec = Rec { protected, floor, evicted: 0, allocated: len, committed: len };
        let r = skv_req {
            req_pool_idx: s as i32,
            kv_allocated_len: len,
            kv_committed_len: len,
            cache_protected_len: protected,
            origin_input_len: len,
            swa_evict_floor: floor,
            ..skv_req::default()
        };
        self.sessions[s] = State::Running(rec, r);
    }

    fn run(&mut self, s: usize, mut rec: Rec, mut r: skv_req) {
        let row = s as i32;
        let roll = self.rng.upto(99);
        if roll < 45 {
            let w = Win {
                size: [1, 3, 4, 8, 13][self.rng.upto(4) as usize],
                interval: [0, 1, 2, 5][self.rng.upto(3) as usize],
                sharing: self.rng.chance(70),
                retain: if self.rng.chance(20) { Some(self.rng.upto(r.kv_committed_len)) } else { None },
            };
            let pre = r.kv_committed_len - self.rng.upto(3).min(r.kv_committed_len);
            let flags = if w.sharing { 0 } else { SKV_SWA_NO_PREFIX_SHARING };
            let retain = w.retain.map_or(-1, |f| f as i64);
            let mut freed = u32::MAX;
            // SAFETY: the handle is this test's live cache; the other pointers are locals.
            let st = unsafe { skv_swa_evict(self.cache, &mut r, pre, w.size, w.interval, retain, flags, &mut freed) };
            let want = rec.evict(row, pre, &w, self.ps);
            assert_eq!(freed, want.iter().map(|p| p.2 - p.1).sum::<u32>());
            self.check("swa_evict", st, want, Some((&r, &rec)));
        } else if roll < 52 && r.kv_committed_len >= rec.protected {
            // Rejected drafts dropped: sglang's `_free_tail` at the committed length.
            let len = r.kv_committed_len;
            // SAFETY: the handle is this test's live cache; the other pointers are locals.
            let st = unsafe { skv_free_tail(self.cache, &mut r, len) };
            let want = rec.free_aligned(row, len, rec.allocated, self.ps);
            rec.allocated = len;
            rec.committed = rec.committed.min(len);
            rec.clamp(len);
            self.check("free_tail", st, want, Some((&r, &rec)));
        } else if roll < 80 {
            // A decode round: lookahead slots, some of them accepted.
            let k = (1 + self.rng.upto(4)).min(COLS - r.kv_allocated_len);
            self.eng.alloc(s, r.kv_allocated_len, r.kv_allocated_len + k);
            r.kv_allocated_len += k;
            r.kv_committed_len += self.rng.upto(r.kv_allocated_len - r.kv_committed_len);
            (rec.allocated, rec.committed) = (r.kv_allocated_len, r.kv_committed_len);
            r.output_len = r.kv_allocated_len - r.origin_input_len;
        } else if roll < 93 {
            r.output_len = r.kv_allocated_len - r.origin_input_len;
            let fin = self.rng.upto(r.output_len);
            r.finished_len = fin as i32;
            // SAFETY: the handle is this test's live cache; the other pointers are locals.
            let st = unsafe { skv_cache_finished_req(self.cache, s as u64, 0, &mut r, 0) };
            let want = rec.finish(row, r.origin_input_len + fin, self.ps);
            self.check("finish", st, want, None);
            self.sessions[s] = State::Idle(rec);
            return;
        } else {
            self.abort(s, rec, r);
            return;
        }
        self.sessions[s] = State::Running(rec, r);
    }

    fn abort(&mut self, s: usize, rec: Rec, mut r: skv_req) {
        // SAFETY: the handle is this test's live cache; the other pointers are locals.
        let st = unsafe { skv_cache_finished_req(self.cache, s as u64, 0, &mut r, 1) };
        let want = rec.free_row(s as i32, rec.protected, rec.allocated, self.ps);
        self.check("abort", st, want, None);
        self.sessions[s] = State::None;
    }

    /// Ends every session, frees the tree's pages, and finds nothing live.
    fn finish_all(&mut self) {
        for s in 0..ROWS {
            match self.sessions[s] {
                State::None => {}
                State::Idle(rec) => {
                    // SAFETY: the handle is this test's live cache; the other pointers are locals.
                    let st = unsafe { skv_release_session(self.cache, s as u64) };
                    self.check("release", st, rec.free_row(s as i32, rec.protected, rec.allocated, self.ps), None);
                }
                State::Running(rec, r) => self.abort(s, rec, r),
            }
            self.sessions[s] = State::None;
        }
        for p in std::mem::take(&mut self.eng.tree) {
            self.eng.free_swa(p, "the tree's prefix");
            self.eng.free_full(p, "the tree's prefix");
        }
        assert!(self.eng.findings.is_empty(), "{:?}", self.eng.findings);
        assert!(self.eng.full_live.is_empty(), "full pages leaked: {:?}", self.eng.full_live);
        assert!(self.eng.swa_live.is_empty(), "SWA pages leaked: {:?}", self.eng.swa_live);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn hybrid_frees_follow_sglang(ps in prop_oneof![Just(1u32), Just(4), Just(16)], seed in any::<u64>()) {
        let mut sim = Sim::new(ps, seed);
        for _ in 0..400 {
            let s = sim.rng.upto(ROWS as u32 - 1) as usize;
            sim.step(s);
        }
        sim.finish_all();
    }
}

/// The workload meets every kind of piece: full-only, both pools, SWA-only.
#[test]
fn the_workload_reaches_every_piece() {
    let mut sim = Sim::new(4, 12345);
    for _ in 0..2000 {
        let s = sim.rng.upto(ROWS as u32 - 1) as usize;
        sim.step(s);
    }
    sim.finish_all();
    let want: HashSet<u32> = [SKV_POOL_FULL, SKV_POOL_SWA, SKV_POOL_BOTH].into();
    assert_eq!(sim.seen_pools, want);
}
