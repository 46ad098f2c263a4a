//! The per-step hot path at real sizes, through the C ABI as an engine calls it: N live
//! owned-mode sessions of 4,096 tokens (page size 16), each call on the next session in turn,
//! so a call finds its session's state wherever the previous N - 1 calls left the caches.
//!
//! One round of an operation prepares every session (untimed), calls the operation once on
//! each session in order (timed), and puts every session back (untimed). Rounds alternate
//! between timing each call alone (p50 / p99, the clock's own cost subtracted) and timing
//! groups of `GROUP` consecutive calls (the median of the group means, free of clock cost).
//! Batch calls are timed per call and reported per request.
//!
//! `cargo bench --bench hot_path` runs 1,000 and 100,000 sessions (`SKV_BENCH_SESSIONS=1000`
//! chooses; `SKV_BENCH_CALLS` sets the calls per operation, default 400,000). Without
//! `--bench` (`cargo test --benches`) it runs every operation for a few rounds on 64 sessions
//! and checks the pool's audit.

// As in the library: every unsafe block says why it is sound.
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

use std::ffi::CStr;
use std::hint::black_box;
use std::time::Instant;

mod common;

use common::{check, clock_overhead_ns};
use skv::*;

const PS: u32 = 16;
const TOKENS: u32 = 4096;
/// The 4-page tail a retried match frees and a finish trims.
const TAIL: u32 = 4 * PS;
/// Consecutive calls timed together for the median.
const GROUP: usize = 32;

/// The targets at 1,000 sessions, ns per call (per request for batches).
#[derive(Clone, Copy, PartialEq, Debug)]
enum Op {
    MatchTailFree,
    FinishTrim,
    Extend,
    Release,
    Stats,
    ExtendBatch(usize),
    CommitBatch(usize),
}

impl Op {
    fn all(batches: bool) -> Vec<Op> {
        let mut v = vec![Op::MatchTailFree, Op::FinishTrim, Op::Extend, Op::Release, Op::Stats];
        if batches {
            for b in [64, 256] {
                v.extend([Op::ExtendBatch(b), Op::CommitBatch(b)]);
            }
        }
        v
    }

    fn name(self) -> String {
        match self {
            Op::MatchTailFree => "match, hit freeing a 4-page tail".into(),
            Op::FinishTrim => "finish, trimming a 4-page overshoot".into(),
            Op::Extend => "alloc_extend, 1 token (new page)".into(),
            Op::Release => "release, 4096-token session".into(),
            Op::Stats => "skv_cache_stats (boundary)".into(),
            Op::ExtendBatch(b) => format!("alloc_extend_batch {b}, per req"),
            Op::CommitBatch(b) => format!("commit_batch {b}, per req"),
        }
    }

    fn target_ns(self) -> f64 {
        match self {
            Op::MatchTailFree | Op::FinishTrim => 120.0,
            Op::Extend => 40.0,
            Op::Release => 300.0,
            Op::Stats => 12.0,
            Op::ExtendBatch(_) => 15.0,
            Op::CommitBatch(_) => 8.0,
        }
    }

    /// The plain-C column (median of its range), where it has one.
    fn plain_c_ns(self) -> Option<f64> {
        match self {
            Op::MatchTailFree => Some(155.0),
            Op::FinishTrim => Some(137.5),
            Op::Extend => Some(36.5),
            Op::Release => Some(1215.0),
            Op::Stats => Some(18.5),
            _ => None,
        }
    }

    fn batch(self) -> usize {
        match self {
            Op::ExtendBatch(b) | Op::CommitBatch(b) => b,
            _ => 1,
        }
    }
}

/// N idle sessions of `TOKENS` tokens, and one req per session for the running turns.
struct Bed {
    c: *mut skv_cache,
    n: usize,
    reqs: Vec<skv_req>,
    ones: Vec<u32>,
    out_loc: Vec<i32>,
}

impl Bed {
    fn new(n: usize) -> Bed {
        let pages = n as u64 * u64::from(TOKENS / PS + TAIL / PS + 1) + 1024;
        let cfg = skv_cache_config {
            struct_size: std::mem::size_of::<skv_cache_config>() as u32,
            page_size: PS,
            num_token_slots: pages * u64::from(PS),
            num_rows: n as u32 + 16,
            max_context_len: 2 * TOKENS,
            flags: 0,
            swa_num_token_slots: 0,
        };
        let mut c = std::ptr::null_mut();
        // SAFETY: cfg and c are locals.
        check(unsafe { skv_cache_new(&cfg, &mut c) }, "skv_cache_new");
        let mut bed = Bed { c, n, reqs: vec![skv_req::default(); n], ones: vec![1; 256], out_loc: vec![0; 256] };
        let t = Instant::now();
        for id in 0..n {
            bed.hold(id);
        }
        eprintln!("setup: {n} sessions of {TOKENS} tokens in {:.2} s", t.elapsed().as_secs_f64());
        bed
    }

    /// A first turn of `TOKENS` prompt tokens, finished: session `id` holds its row idle.
    fn hold(&mut self, id: usize) {
        let c = self.c;
        let mut req = skv_req::default();
        // SAFETY: c is the bed's live handle; req is a local.
        unsafe {
            check(skv_alloc_row(c, &mut req), "skv_alloc_row");
            check(skv_alloc_extend(c, &mut req, TOKENS, std::ptr::null_mut()), "skv_alloc_extend");
            check(skv_commit(c, &mut req, TOKENS), "skv_commit");
            req.origin_input_len = TOKENS;
            check(skv_cache_finished_req(c, id as u64, 0, &mut req, 0), "skv_cache_finished_req");
        }
    }

    /// Restores session `id` into its req (a hit with nothing to free): the turn runs.
    fn restore(&mut self, id: usize) {
        let mut req = skv_req::default();
        let mut m = skv_match { hit: 0, prefix_len: 0 };
        // SAFETY: the bed's live handle; req and m are locals.
        check(unsafe { skv_match_prefix(self.c, id as u64, 0, &mut req, TOKENS, 0, &mut m) }, "skv_match_prefix");
        assert_eq!((m.hit, m.prefix_len), (1, TOKENS));
        self.reqs[id] = req;
    }

    fn extend(&mut self, id: usize, n: u32) {
        // SAFETY: the bed's live handle and one of its reqs; out_loc is NULL.
        check(unsafe { skv_alloc_extend(self.c, &mut self.reqs[id], n, std::ptr::null_mut()) }, "skv_alloc_extend");
    }

    /// Frees the running turn's tail past `TOKENS` and finishes it: the session is idle again.
    fn finish_back(&mut self, id: usize) {
        let req = &mut self.reqs[id];
        if req.kv_allocated_len > TOKENS {
            // SAFETY: the bed's live handle and one of its reqs.
            check(unsafe { skv_free_tail(self.c, req, TOKENS) }, "skv_free_tail");
        }
        req.origin_input_len = TOKENS;
        req.output_len = 0;
        req.finished_len = -1;
        // SAFETY: the bed's live handle and one of its reqs.
        check(unsafe { skv_cache_finished_req(self.c, id as u64, 0, req, 0) }, "skv_cache_finished_req");
        assert_eq!(req.req_pool_idx, -1);
    }

    fn prepare(&mut self, op: Op, id: usize) {
        match op {
            Op::MatchTailFree => {
                self.restore(id);
                self.extend(id, TAIL);
            }
            Op::FinishTrim => {
                self.restore(id);
                self.extend(id, TAIL);
                let req = &mut self.reqs[id];
                // SAFETY: the bed's live handle and one of its reqs.
                check(unsafe { skv_commit(self.c, req, TAIL) }, "skv_commit");
                req.origin_input_len = TOKENS - 8;
                req.output_len = 8 + TAIL;
                req.finished_len = 8;
            }
            Op::Extend | Op::ExtendBatch(_) => self.restore(id),
            Op::CommitBatch(_) => {
                self.restore(id);
                self.extend(id, 1);
            }
            Op::Release | Op::Stats => {}
        }
    }

    fn put_back(&mut self, op: Op, id: usize) {
        match op {
            Op::MatchTailFree | Op::Extend | Op::ExtendBatch(_) | Op::CommitBatch(_) => self.finish_back(id),
            Op::FinishTrim => assert_eq!(self.reqs[id].req_pool_idx, -1),
            Op::Release => self.hold(id),
            Op::Stats => {}
        }
    }

    /// The timed call on the sessions `ids` (one, or a batch of consecutive ones).
    #[inline(always)]
    fn call(&mut self, op: Op, lo: usize, hi: usize) -> skv_status {
        let c = self.c;
        // SAFETY: the bed's live handle, its reqs and locals; a batch lo..hi spans at most
        // op.batch() <= 256 sessions, the length of ones.
        unsafe {
            match op {
                Op::MatchTailFree => {
                    let mut m = skv_match { hit: 0, prefix_len: 0 };
                    let st = skv_match_prefix(c, lo as u64, 0, &mut self.reqs[lo], TOKENS, 0, &mut m);
                    if st == skv_status::SKV_OK && m.prefix_len != TOKENS {
                        return skv_status::SKV_ERR_INTERNAL;
                    }
                    st
                }
                Op::FinishTrim => skv_cache_finished_req(c, lo as u64, 0, &mut self.reqs[lo], 0),
                Op::Extend => skv_alloc_extend(c, &mut self.reqs[lo], 1, std::ptr::null_mut()),
                Op::Release => skv_release_session(c, lo as u64),
                Op::Stats => {
                    let mut s = std::mem::MaybeUninit::<skv_stats>::uninit();
                    skv_cache_stats(c, s.as_mut_ptr())
                }
                Op::ExtendBatch(_) | Op::CommitBatch(_) => batch_call(self, op, lo, hi),
            }
        }
    }

    /// One round: every session prepared, called (timed), put back. Appends per-call (or per
    /// batch) nanoseconds to `each`, or per-group means to `groups`.
    fn round(&mut self, op: Op, each: Option<&mut Vec<f64>>, groups: Option<&mut Vec<f64>>, overhead: f64) {
        for id in 0..self.n {
            self.prepare(op, id);
        }
        let b = op.batch();
        let mut failed = false;
        if let Some(each) = each {
            let mut lo = 0;
            while lo < self.n {
                let hi = (lo + b).min(self.n);
                let t = Instant::now();
                let st = black_box(self.call(op, lo, hi));
                let d = t.elapsed().as_nanos() as f64;
                failed |= st != skv_status::SKV_OK;
                each.push(((d - overhead).max(0.0)) / (hi - lo) as f64);
                lo = hi;
            }
        } else if let Some(groups) = groups {
            let per_group = GROUP.max(b);
            let mut lo = 0;
            while lo < self.n {
                let end = (lo + per_group).min(self.n);
                let t = Instant::now();
                let mut at = lo;
                while at < end {
                    let hi = (at + b).min(end);
                    failed |= black_box(self.call(op, at, hi)) != skv_status::SKV_OK;
                    at = hi;
                }
                groups.push(t.elapsed().as_nanos() as f64 / (end - lo) as f64);
                lo = end;
            }
        }
        if failed {
            // SAFETY: thread-local NUL-terminated string.
            panic!("{:?}: a timed call failed: {}", op, unsafe { CStr::from_ptr(skv_last_error()) }.to_string_lossy());
        }
        for id in 0..self.n {
            self.put_back(op, id);
        }
    }

    /// Every page is back where the setup left it, and the audit is clean.
    fn audit(&self) {
        // SAFETY: the bed's live handle; report and stats are locals; libskv NUL-terminates
        // first_violation.
        unsafe {
            let mut report: skv_check_report = std::mem::zeroed();
            check(skv_cache_check(self.c, &mut report), "skv_cache_check");
            let first = CStr::from_ptr(report.first_violation.as_ptr()).to_string_lossy();
            assert_eq!(report.violations, 0, "audit: {first}");
            let mut stats: skv_stats = std::mem::zeroed();
            check(skv_cache_stats(self.c, &mut stats), "skv_cache_stats");
            assert_eq!(stats.used_pages, (self.n as u64) * u64::from(TOKENS / PS), "pages leaked");
            assert_eq!(stats.sessions, self.n as u64);
        }
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        // SAFETY: the bed's handle, freed once, here.
        unsafe { skv_cache_free(self.c) };
    }
}

/// The batch calls, on the reqs of sessions `lo..hi`, one token each.
///
/// # Safety
/// `hi - lo` must not exceed `bed.ones.len()` (one count per req).
#[inline(always)]
unsafe fn batch_call(bed: &mut Bed, op: Op, lo: usize, hi: usize) -> skv_status {
    let n = hi - lo;
    let reqs = bed.reqs[lo..hi].as_mut_ptr();
    match op {
        // SAFETY: the bed's live handle; n reqs (the slice above), n counts by this function's
        // contract, out_loc with its own length as the cap.
        Op::ExtendBatch(_) => unsafe {
            skv_alloc_extend_batch(bed.c, reqs, n, bed.ones.as_ptr(), bed.out_loc.as_mut_ptr(), bed.out_loc.len())
        },
        // SAFETY: the bed's live handle; n reqs (the slice above), n counts by this function's
        // contract.
        Op::CommitBatch(_) => unsafe { skv_commit_batch(bed.c, reqs, n, bed.ones.as_ptr()) },
        _ => unreachable!(),
    }
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_unstable_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let bench = args.iter().any(|a| a == "--bench");
    let filter = args.iter().skip(1).find(|a| !a.starts_with('-')).cloned();
    let env = |k: &str| std::env::var(k).ok();
    let sizes: Vec<usize> = match env("SKV_BENCH_SESSIONS") {
        Some(list) => list.split(',').map(|s| s.trim().parse().expect("SKV_BENCH_SESSIONS")).collect(),
        None if bench => vec![1_000, 100_000],
        None => vec![64],
    };
    let calls: usize = env("SKV_BENCH_CALLS").map_or(400_000, |s| s.parse().expect("SKV_BENCH_CALLS"));
    let overhead = clock_overhead_ns() as f64;
    if bench {
        println!("hot path, owned mode, page size {PS}, sessions of {TOKENS} tokens, round-robin");
        println!("clock overhead {overhead} ns (subtracted from p50/p99)");
        println!(
            "{:<38} {:>8} {:>8} {:>8} {:>8} {:>8} {:>9}",
            "call", "sessions", "median", "p50", "p99", "target", "vs C"
        );
    }
    for &n in &sizes {
        let mut bed = Bed::new(n);
        for op in Op::all(true) {
            if filter.as_deref().is_some_and(|f| !op.name().contains(f)) {
                continue;
            }
            let rounds = if bench { (calls / n).max(4) } else { 2 };
            let (mut each, mut groups) = (Vec::new(), Vec::new());
            bed.round(op, None, Some(&mut Vec::new()), overhead); // warm-up
            for r in 0..rounds {
                if r % 2 == 0 {
                    bed.round(op, Some(&mut each), None, overhead);
                } else {
                    bed.round(op, None, Some(&mut groups), overhead);
                }
            }
            if !bench {
                continue;
            }
            let median = percentile(&mut groups, 0.5);
            let (p50, p99) = (percentile(&mut each, 0.5), percentile(&mut each, 0.99));
            let vs_c = op.plain_c_ns().map_or("-".into(), |c| format!("{:.2}x", median / c));
            println!(
                "{:<38} {:>8} {:>8.1} {:>8.1} {:>8.1} {:>8} {:>9}",
                op.name(),
                n,
                median,
                p50,
                p99,
                op.target_ns(),
                vs_c
            );
        }
        bed.audit();
    }
}
