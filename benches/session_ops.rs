//! Latency of the streaming-session hot paths, called through the C ABI on an owned
//! pool with page size 16, while 1,000 / 100,000 / 1,000,000 idle sessions are held.
//!
//! Each held session is an idle slot whose row maps `HELD_TOKENS` (3 pages). Every
//! measured iteration is exactly one call of the named function: the state it needs
//! (a re-grown tail, a fresh 4096-token session) is rebuilt outside the timed region,
//! and `CHUNK` calls on distinct sessions are timed together so the clock's own cost
//! is spread thin.
//!
//! After criterion's runs, a second pass times every call on its own and prints p50 /
//! p99 per operation and session count, followed by a table that joins criterion's
//! medians to those percentiles.
//!
//! This machine is shared: a chunk that took far longer than any chunk runs (the thread
//! was descheduled) is timed again, and the count of those is printed.
//!
//! The `_hybrid` groups make the finish, match and release calls on a second bed of the same
//! size whose cache also has an SWA pool (a hybrid model's sliding-window layers), window
//! `WINDOW` = 1,024 tokens: every page a row maps also holds an SWA page until the window
//! passes it. The held sessions (3 pages) lie inside the window, so a finish's or a match's
//! 4-page tail goes back to both pools; a released 4096-token session had its window step
//! (`skv_swa_evict`) at the end of its turn, so its release frees `[0, 3072)` full-side only
//! and `[3072, 4096)` to both. A hybrid row's target is 1.5x its full-attention op's median.
//!
//! `SKV_BENCH_SESSIONS=1000,100000` limits the session counts.

// As in the library: every unsafe block says why it is sound.
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

use std::ffi::CStr;
use std::hint::black_box;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion};
mod common;

use common::{check, clock_overhead_ns};
use skv::*;

const PAGE_SIZE: u32 = 16;
const HELD_TOKENS: u32 = 3 * PAGE_SIZE;
/// Overshoot past the finish boundary, and the prompt a rejected turn extended.
const TAIL_TOKENS: u32 = 4 * PAGE_SIZE;
const RELEASE_TOKENS: u32 = 4096;
const MAX_CONTEXT: u32 = 8192;
/// Calls timed together; also the number of sessions prepared at once.
const CHUNK: usize = 32;
/// Running requests in the decode benchmark; each step extends every one by a token.
const DECODE_BATCH: usize = 64;
// The per-call timing buffer holds a decode batch.
const _: () = assert!(CHUNK <= DECODE_BATCH);
/// Decode steps before the batch is finished (trimmed back) and a new one matched.
const DECODE_STEPS: u32 = 128;
/// Longer than any chunk of calls takes while the thread runs (the slowest, 32 releases
/// of 4096 tokens, takes about 10 µs).
const DESCHEDULED: Duration = Duration::from_micros(250);

const DEFAULT_SIZES: [u64; 3] = [1_000, 100_000, 1_000_000];
/// The hybrid bed's sliding window, in tokens.
const WINDOW: u32 = 1024;
/// libskv's bound on a hybrid op's median, as a multiple of its full-attention op's.
const HYBRID_LIMIT: f64 = 1.5;

#[derive(Clone, Copy, PartialEq)]
enum Op {
    FinishTrim,
    MatchTailFree,
    Release,
    Extend,
    FinishTrimHybrid,
    MatchTailFreeHybrid,
    ReleaseHybrid,
}

impl Op {
    const ALL: [Op; 7] = [
        Op::FinishTrim,
        Op::FinishTrimHybrid,
        Op::MatchTailFree,
        Op::MatchTailFreeHybrid,
        Op::Release,
        Op::ReleaseHybrid,
        Op::Extend,
    ];

    fn group(self) -> &'static str {
        match self {
            Op::FinishTrim => "finished_req_trim_4_pages",
            Op::MatchTailFree => "match_prefix_hit_tail_free",
            Op::Release => "release_session_4096_tokens",
            Op::Extend => "alloc_extend_1_token",
            Op::FinishTrimHybrid => "finished_req_trim_4_pages_hybrid",
            Op::MatchTailFreeHybrid => "match_prefix_hit_tail_free_hybrid",
            Op::ReleaseHybrid => "release_session_4096_tokens_hybrid",
        }
    }

    /// The target for a full-attention op; `None` for a hybrid one (see `full`).
    fn target_ns(self) -> Option<f64> {
        match self {
            Op::FinishTrim | Op::MatchTailFree => Some(150.0),
            Op::Release => Some(1000.0),
            Op::Extend => Some(50.0),
            _ => None,
        }
    }

    /// The full-attention op a hybrid op is compared with; `None` for the others.
    fn full(self) -> Option<Op> {
        match self {
            Op::FinishTrimHybrid => Some(Op::FinishTrim),
            Op::MatchTailFreeHybrid => Some(Op::MatchTailFree),
            Op::ReleaseHybrid => Some(Op::Release),
            _ => None,
        }
    }

    /// Calls timed one by one in the percentile pass.
    fn latency_calls(self) -> u64 {
        match self {
            Op::Release | Op::ReleaseHybrid => 20_000,
            Op::Extend => 400_000,
            _ => 200_000,
        }
    }
}

/// A cache holding `sessions` idle slots, plus the in-flight state of the benchmarks.
struct Bed {
    cache: *mut skv_cache,
    sessions: u64,
    /// The cache has an SWA pool, and every turn ends with a window step.
    hybrid: bool,
    /// Round-robin cursor over the held sessions.
    next: u64,
    /// Ids of the sessions the release benchmark creates, past the held ones.
    fresh: u64,
    batch: Vec<(u64, skv_req)>,
    decode: Vec<(u64, skv_req)>,
    decode_pos: usize,
    decode_step: u32,
    /// Chunks timed again because the thread was descheduled during one.
    retimed: u64,
}

impl Bed {
    fn new(sessions: u64, hybrid: bool) -> Bed {
        let held_pages = sessions * u64::from(HELD_TOKENS / PAGE_SIZE);
        let page = |tokens: u32| u64::from(tokens.div_ceil(PAGE_SIZE));
        let spare_pages = CHUNK as u64 * page(RELEASE_TOKENS)
            + DECODE_BATCH as u64 * (page(DECODE_STEPS) + 1)
            + CHUNK as u64 * page(TAIL_TOKENS)
            + 1024;
        // + 1: page 0 is the padding page
        let slots = (1 + held_pages + spare_pages) * u64::from(PAGE_SIZE);
        let cfg = skv_cache_config {
            struct_size: std::mem::size_of::<skv_cache_config>() as u32,
            page_size: PAGE_SIZE,
            num_token_slots: slots,
            num_rows: u32::try_from(sessions).unwrap() + (CHUNK + DECODE_BATCH) as u32 + 16,
            max_context_len: MAX_CONTEXT,
            flags: 0,
            // A turn maps its SWA pages before its window step gives any back: as many as
            // full-side pages.
            swa_num_token_slots: if hybrid { slots } else { 0 },
            ..Default::default()
        };
        let mut cache: *mut skv_cache = std::ptr::null_mut();
        // SAFETY: cfg and cache are locals.
        check(unsafe { skv_cache_new(&cfg, &mut cache) }, "skv_cache_new");
        let mut bed = Bed {
            cache,
            sessions,
            hybrid,
            next: 0,
            fresh: 1 << 40,
            batch: vec![(0, skv_req::default()); CHUNK],
            decode: Vec::with_capacity(DECODE_BATCH),
            decode_pos: 0,
            decode_step: 0,
            retimed: 0,
        };
        let t = Instant::now();
        for id in 0..sessions {
            bed.hold_new(id, HELD_TOKENS);
        }
        eprintln!("setup: {sessions} held sessions of {HELD_TOKENS} tokens in {:.2} s", t.elapsed().as_secs_f64());
        bed.audit();
        bed
    }

    /// A first turn of `tokens` prompt tokens, finished: the session holds its row idle. On
    /// the hybrid bed the turn ends with a window step, which gives back the SWA pages of the
    /// positions before the last `WINDOW`, if any.
    fn hold_new(&mut self, id: u64, tokens: u32) {
        let c = self.cache;
        let mut req = skv_req::default();
        // SAFETY: c is the bed's live handle; req is a local.
        unsafe {
            check(skv_alloc_row(c, &mut req), "skv_alloc_row");
            check(skv_alloc_extend(c, &mut req, tokens, std::ptr::null_mut()), "skv_alloc_extend");
            check(skv_commit(c, &mut req, tokens), "skv_commit");
            if self.hybrid {
                let mut freed = 0;
                check(skv_swa_evict(c, &mut req, tokens, WINDOW, 0, -1, 0, &mut freed), "skv_swa_evict");
                assert_eq!(freed, tokens.saturating_sub(WINDOW));
            }
            req.origin_input_len = tokens;
            check(skv_cache_finished_req(c, id, 0, &mut req, 0), "skv_cache_finished_req");
        }
    }

    fn next_session(&mut self) -> u64 {
        let id = self.next;
        self.next = (self.next + 1) % self.sessions;
        id
    }

    /// Restores held session `id` into a fresh req (a hit with nothing to free).
    fn restore(&mut self, id: u64) -> skv_req {
        let mut req = skv_req::default();
        let mut m = skv_match { hit: 0, prefix_len: 0 };
        // SAFETY: the bed's live handle; req and m are locals.
        check(unsafe { skv_match_prefix(self.cache, id, 0, &mut req, HELD_TOKENS, 0, &mut m) }, "skv_match_prefix");
        assert_eq!((m.hit, m.prefix_len), (1, HELD_TOKENS));
        req
    }

    /// Finishes a running turn of a held session so that its slot is back to
    /// `HELD_TOKENS`: the turn's output ends exactly there, whatever was allocated past it.
    fn finish_back(&mut self, id: u64, req: &mut skv_req) {
        let produced = req.kv_allocated_len - HELD_TOKENS;
        req.origin_input_len = HELD_TOKENS;
        req.output_len = produced;
        req.finished_len = 0;
        // SAFETY: the bed's live handle and one of its reqs.
        check(unsafe { skv_cache_finished_req(self.cache, id, 0, req, 0) }, "skv_cache_finished_req");
        assert_eq!(req.req_pool_idx, -1);
    }

    /// Runs `iters` calls of `op`: the sum of their times, and with `lat`, each call's
    /// time in nanoseconds.
    fn run(&mut self, op: Op, iters: u64, mut lat: Option<&mut Vec<u64>>) -> Duration {
        if op == Op::Extend {
            return self.run_extend(iters, lat);
        }
        let mut total = Duration::ZERO;
        let mut left = iters;
        while left > 0 {
            let n = left.min(CHUNK as u64) as usize;
            for k in 0..n {
                self.prepare(op, k);
            }
            let c = self.cache;
            let batch = &mut self.batch[..n];
            let elapsed = match op {
                Op::FinishTrim | Op::FinishTrimHybrid => {
                    // SAFETY: the bed's live handle and one of its reqs.
                    time_calls(batch, lat.as_deref_mut(), |id, req| unsafe { skv_cache_finished_req(c, id, 0, req, 0) })
                }
                Op::MatchTailFree | Op::MatchTailFreeHybrid => {
                    // SAFETY: the bed's live handle and one of its reqs; m is a local.
                    time_calls(batch, lat.as_deref_mut(), |id, req| unsafe {
                        let mut m = skv_match { hit: 0, prefix_len: 0 };
                        let st = skv_match_prefix(c, id, 0, req, HELD_TOKENS, 0, &mut m);
                        if m.hit == 1 && m.prefix_len == HELD_TOKENS {
                            st
                        } else {
                            skv_status::SKV_ERR_INTERNAL
                        }
                    })
                }
                Op::Release | Op::ReleaseHybrid => {
                    // SAFETY: the bed's live handle.
                    time_calls(batch, lat.as_deref_mut(), |id, _| unsafe { skv_release_session(c, id) })
                }
                Op::Extend => unreachable!(),
            };
            for k in 0..n {
                self.after(op, k);
            }
            if self.descheduled(elapsed, &lat) {
                continue;
            }
            total += elapsed;
            left -= n as u64;
        }
        total
    }

    /// A timed chunk takes microseconds; one that took far longer spent most of it with the
    /// thread descheduled (this machine is shared), so criterion's runs time another chunk
    /// instead. The percentile pass keeps every call.
    fn descheduled(&mut self, elapsed: Duration, lat: &Option<&mut Vec<u64>>) -> bool {
        let out = lat.is_none() && elapsed > DESCHEDULED;
        self.retimed += u64::from(out);
        out
    }

    fn prepare(&mut self, op: Op, k: usize) {
        debug_assert!(op.full().is_none() || self.hybrid, "a hybrid op on the full-attention bed");
        match op {
            // A turn whose speculative rounds ran 4 pages past origin + finished_len.
            Op::FinishTrim | Op::FinishTrimHybrid => {
                let id = self.next_session();
                let mut req = self.restore(id);
                // SAFETY: the bed's live handle; req is a local.
                unsafe {
                    check(skv_alloc_extend(self.cache, &mut req, TAIL_TOKENS, std::ptr::null_mut()), "extend");
                    check(skv_commit(self.cache, &mut req, TAIL_TOKENS), "commit");
                }
                req.origin_input_len = HELD_TOKENS - 8;
                req.output_len = 8 + TAIL_TOKENS;
                req.finished_len = 8;
                self.batch[k] = (id, req);
            }
            // A turn that extended its prompt and was then rejected by the scheduler:
            // its retried match frees the 4 pages the first try extended.
            Op::MatchTailFree | Op::MatchTailFreeHybrid => {
                let id = self.next_session();
                let mut req = self.restore(id);
                // SAFETY: the bed's live handle; req is a local, out_loc NULL.
                check(unsafe { skv_alloc_extend(self.cache, &mut req, TAIL_TOKENS, std::ptr::null_mut()) }, "extend");
                self.batch[k] = (id, req);
            }
            Op::Release | Op::ReleaseHybrid => {
                let id = self.fresh;
                self.fresh += 1;
                self.hold_new(id, RELEASE_TOKENS);
                self.batch[k] = (id, skv_req::default());
            }
            Op::Extend => unreachable!(),
        }
    }

    fn after(&mut self, op: Op, k: usize) {
        let (id, mut req) = self.batch[k];
        match op {
            Op::FinishTrim | Op::FinishTrimHybrid => {
                assert_eq!(req.kv_allocated_len, 0);
                assert_eq!(req.output_len, 8);
            }
            Op::MatchTailFree | Op::MatchTailFreeHybrid => {
                assert_eq!(req.kv_allocated_len, HELD_TOKENS);
                self.finish_back(id, &mut req);
            }
            Op::Release | Op::ReleaseHybrid => {}
            Op::Extend => unreachable!(),
        }
    }

    /// Decode: each step extends every running request of the batch by one token, so
    /// one call in 16 opens a new page.
    fn run_extend(&mut self, iters: u64, mut lat: Option<&mut Vec<u64>>) -> Duration {
        let mut total = Duration::ZERO;
        let mut left = iters;
        while left > 0 {
            if self.decode.is_empty() || self.decode_step == DECODE_STEPS {
                self.drain_decode();
                for _ in 0..DECODE_BATCH {
                    let id = self.next_session();
                    let req = self.restore(id);
                    self.decode.push((id, req));
                }
            }
            let n = (left as usize).min(DECODE_BATCH - self.decode_pos);
            let c = self.cache;
            let batch = &mut self.decode[self.decode_pos..self.decode_pos + n];
            // SAFETY: the bed's live handle and one of its reqs; out_loc is NULL.
            let elapsed = time_calls(batch, lat.as_deref_mut(), |_, req| unsafe {
                skv_alloc_extend(c, req, 1, std::ptr::null_mut())
            });
            self.decode_pos += n;
            if self.decode_pos == DECODE_BATCH {
                self.decode_pos = 0;
                self.decode_step += 1;
            }
            if self.descheduled(elapsed, &lat) {
                continue;
            }
            total += elapsed;
            left -= n as u64;
        }
        total
    }

    /// Finishes the running decode batch, trimming each session back to its held length.
    fn drain_decode(&mut self) {
        let mut decode = std::mem::take(&mut self.decode);
        for (id, req) in &mut decode {
            self.finish_back(*id, req);
        }
        decode.clear();
        self.decode = decode;
        self.decode_pos = 0;
        self.decode_step = 0;
    }

    /// Everything but the held sessions has been handed back, and the audit is clean.
    fn audit(&mut self) {
        // SAFETY: the bed's live handle; report and stats are locals; libskv NUL-terminates
        // first_violation.
        unsafe {
            let mut report: skv_check_report = std::mem::zeroed();
            check(skv_cache_check(self.cache, &mut report), "skv_cache_check");
            let first = CStr::from_ptr(report.first_violation.as_ptr()).to_string_lossy();
            assert_eq!(report.violations, 0, "audit: {first}");
            let mut stats: skv_stats = std::mem::zeroed();
            check(skv_cache_stats(self.cache, &mut stats), "skv_cache_stats");
            let held = self.sessions * u64::from(HELD_TOKENS / PAGE_SIZE);
            assert_eq!(stats.used_pages, held, "pages leaked by the benchmark loop");
            // The held sessions lie inside the window: every page keeps its SWA page.
            let swa_held = if self.hybrid { held } else { 0 };
            assert_eq!(stats.swa_used_pages, swa_held, "SWA pages leaked by the benchmark loop");
            assert_eq!(report.swa_pages_in_use, swa_held);
            assert_eq!(stats.sessions, self.sessions);
        }
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        // SAFETY: the bed's handle, freed once, here.
        unsafe { skv_cache_free(self.cache) };
    }
}

/// Calls `f` once per batch entry; with `lat`, each call is timed alone.
#[inline(always)]
fn time_calls(
    batch: &mut [(u64, skv_req)],
    lat: Option<&mut Vec<u64>>,
    mut f: impl FnMut(u64, &mut skv_req) -> skv_status,
) -> Duration {
    let mut failed = false;
    let elapsed = match lat {
        None => {
            let t = Instant::now();
            for (id, req) in batch.iter_mut() {
                failed |= !matches!(f(black_box(*id), req), skv_status::SKV_OK);
            }
            t.elapsed()
        }
        Some(lat) => {
            // Timings go to a buffer that stays in cache: storing each into a long vector
            // would add a cache miss to every eighth call once the sessions' data has
            // evicted that vector.
            let mut buf = [0u64; DECODE_BATCH];
            let mut sum = Duration::ZERO;
            for ((id, req), slot) in batch.iter_mut().zip(&mut buf) {
                let t = Instant::now();
                let st = f(black_box(*id), req);
                let d = t.elapsed();
                failed |= !matches!(st, skv_status::SKV_OK);
                *slot = d.as_nanos() as u64;
                sum += d;
            }
            lat.extend_from_slice(&buf[..batch.len()]);
            sum
        }
    };
    if failed {
        // SAFETY: thread-local NUL-terminated string.
        let msg = unsafe { CStr::from_ptr(skv_last_error()) }.to_string_lossy();
        panic!("a timed call failed: {msg}");
    }
    elapsed
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Criterion's median estimate for `group/id`, from the estimates.json it writes.
fn criterion_median_ns(group: &str, id: u64) -> Option<f64> {
    let dir = std::env::var_os("CRITERION_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("CARGO_TARGET_DIR").map(|t| PathBuf::from(t).join("criterion")))
        .unwrap_or_else(|| PathBuf::from("target/criterion"));
    let text = std::fs::read_to_string(dir.join(group).join(id.to_string()).join("new/estimates.json")).ok()?;
    let median = &text[text.find("\"median\"")?..];
    let value = &median[median.find("\"point_estimate\":")? + "\"point_estimate\":".len()..];
    let end = value.find([',', '}'])?;
    value[..end].trim().parse().ok()
}

/// Criterion's positional filter argument, which the percentile pass honours too.
fn criterion_filter(args: &[String]) -> Option<String> {
    const TAKES_VALUE: [&str; 19] = [
        "-s",
        "--save-baseline",
        "-b",
        "--baseline",
        "--baseline-lenient",
        "--load-baseline",
        "--format",
        "--profile-time",
        "--sample-size",
        "--warm-up-time",
        "--measurement-time",
        "--nresamples",
        "--noise-threshold",
        "--confidence-level",
        "--significance-level",
        "--plotting-backend",
        "--output-format",
        "-c",
        "--color",
    ];
    let mut it = args.iter().skip(1);
    while let Some(a) = it.next() {
        if TAKES_VALUE.contains(&a.as_str()) {
            it.next();
        } else if !a.starts_with('-') {
            return Some(a.clone());
        }
    }
    None
}

struct Row {
    op: Op,
    sessions: u64,
    p50: u64,
    p99: u64,
    p999: u64,
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let has = |flag: &str| args.iter().any(|a| a == flag);
    let benchmarking = has("--bench") && !has("--test") && !has("--list") && !has("--profile-time");
    let filter = criterion_filter(&args);
    let selected = |op: Op, n: u64| filter.as_deref().is_none_or(|f| format!("{}/{n}", op.group()).contains(f));

    let sizes: Vec<u64> = match std::env::var("SKV_BENCH_SESSIONS") {
        Ok(list) => list.split(',').map(|s| s.trim().parse().expect("SKV_BENCH_SESSIONS")).collect(),
        // `cargo test --benches` runs each benchmark once: the smallest cache will do.
        Err(_) if has("--test") || !has("--bench") => vec![DEFAULT_SIZES[0]],
        Err(_) => DEFAULT_SIZES.to_vec(),
    };

    let mut c = Criterion::default()
        .sample_size(50)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .nresamples(10_000)
        .without_plots()
        .configure_from_args();

    let overhead = clock_overhead_ns();
    let mut rows = Vec::new();
    for &n in &sizes {
        // Built on first use, so listing or filtering out a session count costs nothing.
        let mut beds: [Option<Bed>; 2] = [None, None];
        for op in Op::ALL {
            let hybrid = op.full().is_some();
            let bed = &mut beds[usize::from(hybrid)];
            let mut group = c.benchmark_group(op.group());
            group.bench_function(BenchmarkId::from_parameter(n), |b| {
                let bed = bed.get_or_insert_with(|| Bed::new(n, hybrid));
                b.iter_custom(|iters| bed.run(op, iters, None))
            });
            group.finish();
            if !(benchmarking && selected(op, n)) {
                continue;
            }
            let bed = bed.get_or_insert_with(|| Bed::new(n, hybrid));
            bed.drain_decode();
            let mut lat = Vec::with_capacity(op.latency_calls() as usize);
            bed.run(op, op.latency_calls(), Some(&mut lat));
            bed.drain_decode();
            lat.iter_mut().for_each(|t| *t = t.saturating_sub(overhead));
            lat.sort_unstable();
            rows.push(Row {
                op,
                sessions: n,
                p50: percentile(&lat, 0.50),
                p99: percentile(&lat, 0.99),
                p999: percentile(&lat, 0.999),
            });
        }
        for bed in beds.iter_mut().flatten() {
            bed.drain_decode();
            bed.audit();
            if benchmarking {
                let kind = if bed.hybrid { "hybrid bed" } else { "full-attention bed" };
                eprintln!("{n} sessions, {kind}: {} chunks timed again after a descheduling", bed.retimed);
            }
        }
    }
    c.final_summary();

    if rows.is_empty() {
        return;
    }
    println!();
    println!("per-call latency, ns (clock overhead of {overhead} ns subtracted from p50/p99/p99.9)");
    println!("(a hybrid row's target is {HYBRID_LIMIT}x its full-attention op's median; vs full = the ratio)");
    println!(
        "{:<34} {:>9} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8}  median<=target",
        "operation", "sessions", "median", "p50", "p99", "p99.9", "target", "vs full"
    );
    for r in &rows {
        let median = criterion_median_ns(r.op.group(), r.sessions);
        let full_median = r.op.full().and_then(|f| criterion_median_ns(f.group(), r.sessions));
        let target = r.op.target_ns().or(full_median.map(|f| f * HYBRID_LIMIT));
        let shown = median.map_or("-".to_string(), |m| format!("{m:.1}"));
        let target_shown = target.map_or("-".to_string(), |t| format!("{t:.1}"));
        let vs_full = median.zip(full_median).map_or("-".to_string(), |(m, f)| format!("{:.2}x", m / f));
        let verdict = match median.zip(target) {
            Some((m, t)) if m <= t => "yes",
            Some(_) => "NO",
            None => "-",
        };
        println!(
            "{:<34} {:>9} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8}  {}",
            r.op.group(),
            r.sessions,
            shown,
            r.p50,
            r.p99,
            r.p999,
            target_shown,
            vs_full,
            verdict
        );
    }
    // The p99 claim compares the largest session count against the smallest.
    let (lo, hi) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
    if lo != hi {
        println!();
        for op in Op::ALL {
            let p99 = |n: u64| rows.iter().find(|r| r.op == op && r.sessions == n).map(|r| r.p99);
            if let (Some(a), Some(b)) = (p99(*lo), p99(*hi)) {
                let ratio = b as f64 / a.max(1) as f64;
                println!("{:<34} p99 at {hi} / p99 at {lo} = {ratio:.2} (claim: <= 2)", op.group());
            }
        }
    }
}
