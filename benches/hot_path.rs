//! The per-step hot path at real sizes, through the C ABI as an engine calls it: N live
//! owned-mode sessions of 4,096 tokens (page size 16), each call on the next session in turn,
//! so a call finds its session's state wherever the previous N - 1 calls left the caches.
//!
//! One round of an operation prepares every session (untimed), calls the operation once on
//! each session in order (timed), and puts every session back (untimed). Rounds alternate
//! between timing each call alone (p50 / p99, the clock's own cost subtracted) and timing
//! groups of `GROUP` consecutive calls (the median of the group means, free of clock cost).
//! Batch calls are timed per call and reported per request. `alloc_extend_batch B, per req`
//! has every request take a page (the sessions sit at a page's end: the worst step);
//! `alloc_extend_batch B, 1 in 16 a page` is a decode step, its sessions at every offset in a
//! page, so one request in 16 takes one. `reqs alone B` makes no call: it reads and writes
//! the batch's reqs as the engine does around a commit batch, the floor the engine's own
//! memory sets under every batch figure at this shape.
//!
//! The hybrid ops (`match_hybrid`, `finish_hybrid`, `release_hybrid`, `extend_batch_hybrid`)
//! make the same calls on a
//! second bed whose cache also has an SWA pool (a hybrid model's sliding-window layers): each
//! session's first turn ended with a window step (`skv_swa_evict`, window `WINDOW` = 1,024
//! tokens), so its row keeps the SWA pages of its last 1,024 positions (64 pages) and the
//! window has given the other 192 back. A release then frees `[0, 3072)` full-side only and
//! `[3072, 4096)` to both pools; a finish's or a match's 4-page tail lies inside the window and
//! goes back to both pools, as does a decode step's page (no window step runs during the turn,
//! so the bed's state after a round is the one before it). A hybrid op's grouped rounds alternate with rounds of its
//! full-attention op on a bed of the same size, and `vs full` is the median over those pairs
//! of hybrid median / full median: the machine's speed moves between runs (up to 2x here),
//! hardly within a pair. A filter selecting a hybrid op also runs its full-attention op.
//!
//! The events ops (`decode_step_events`, `finish_events`) run on a third bed whose handle has
//! KV events on (docs/events.md), every session's 4,096 tokens handed over at setup (so the
//! ledger holds all their pages), paired as the hybrid ops are with their events-off op on the
//! plain bed: `decode step` (`skv_alloc_extend_batch` then `skv_commit_batch`, one token a
//! request) and `finish, 8 new pages` (a finish keeping 8 committed pages past the slot; with
//! events on, `skv_events_tokens` of their 128 tokens and then the finish, which store them).
//! The rounds drain the batches between them, untimed. They need the bench built with
//! `--features events` (`cargo bench --features events --bench hot_path`); without it, or
//! above 10,000 sessions, they are left out, and said so.
//!
//! Every call goes through the library's function table (`skv_get_api`), as an engine that
//! loads libskv with `dlopen` calls it. By default the table is this crate's own, linked into
//! the bench; `SKV_BENCH_LIB=target/release/libskv.so` (built by `cargo build --release`)
//! takes it from the shared library instead, whose calls an engine pays (a thread-local there
//! is a `__tls_get_addr` call, a global one more load).
//!
//! `cargo bench --bench hot_path` runs 1,000 and 100,000 sessions (`SKV_BENCH_SESSIONS=1000`
//! chooses; `SKV_BENCH_CALLS` sets the calls per operation, default 400,000).
//!
//! Sessions take their rows in call order by default, so a batch names consecutive rows and
//! the row tables are read as streams. `SKV_BENCH_ROWS=scattered` has them take rows in a
//! fixed random order instead: what an engine sees once sessions have come and gone (its free
//! rows handed out in whatever order they came back), where each request's row records are
//! misses of their own. Without
//! `--bench` (`cargo test --benches`) it runs every operation for a few rounds on 64 sessions
//! and checks both beds' audits.

// As in the library: every unsafe block says why it is sound.
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

use std::ffi::CStr;
use std::hint::black_box;
use std::time::Instant;

mod common;

use common::clock_overhead_ns;
use skv::{
    skv_cache, skv_cache_config, skv_check_report, skv_events_config, skv_match, skv_req, skv_stats, skv_status,
};
use via_table::*;

/// The exports the bench calls, each through the table (see the top of this file).
mod via_table {
    use std::ffi::{c_char, CStr, CString};
    use std::sync::OnceLock;

    use skv::{
        skv_api, skv_cache, skv_cache_config, skv_check_report, skv_events_config, skv_match, skv_req, skv_stats,
        skv_status,
    };

    static TABLE: OnceLock<&'static skv_api> = OnceLock::new();

    /// The table: `SKV_BENCH_LIB`'s, or the linked-in library's.
    fn table() -> &'static skv_api {
        TABLE.get_or_init(|| {
            let api = match std::env::var("SKV_BENCH_LIB").ok().filter(|p| !p.is_empty()) {
                None => skv::skv_get_api(skv::SKV_ABI_VERSION),
                Some(path) => {
                    let name = CString::new(path.clone()).expect("SKV_BENCH_LIB");
                    // SAFETY: name is a NUL-terminated path; the library stays loaded for the
                    // process (never dlclosed), so the table it gives is 'static.
                    unsafe {
                        let lib = libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
                        assert!(!lib.is_null(), "SKV_BENCH_LIB={path}: {:?}", CStr::from_ptr(libc::dlerror()));
                        let sym = libc::dlsym(lib, c"skv_get_api".as_ptr());
                        assert!(!sym.is_null(), "SKV_BENCH_LIB={path}: no skv_get_api");
                        let get: unsafe extern "C" fn(u32) -> *const skv_api = std::mem::transmute(sym);
                        eprintln!("calls through {path}");
                        get(skv::SKV_ABI_VERSION)
                    }
                }
            };
            // SAFETY: a non-NULL table is static in its library, which stays loaded.
            unsafe { api.as_ref() }.expect("skv_get_api(SKV_ABI_VERSION) gave no table")
        })
    }

    macro_rules! via_table {
        ($($export:ident => $field:ident($($arg:ident: $ty:ty),*);)*) => {$(
            #[inline(always)]
            #[allow(clippy::too_many_arguments)] // the export's own arguments
            pub unsafe fn $export($($arg: $ty),*) -> skv_status {
                // SAFETY: the caller's arguments, passed on to the export under its contract.
                unsafe { (table().$field.expect(stringify!($field)))($($arg),*) }
            }
        )*};
    }

    via_table! {
        skv_cache_new => cache_new(cfg: *const skv_cache_config, out: *mut *mut skv_cache);
        skv_alloc_row => alloc_row(c: *mut skv_cache, req: *mut skv_req);
        skv_alloc_extend => alloc_extend(c: *mut skv_cache, req: *mut skv_req, n: u32, out_loc: *mut i32);
        skv_commit => commit(c: *mut skv_cache, req: *mut skv_req, n: u32);
        skv_swa_evict => swa_evict(
            c: *mut skv_cache, req: *mut skv_req, pre_len: u32, window: u32, eviction_interval: u32,
            retain_floor: i64, flags: u32, freed: *mut u32);
        skv_cache_finished_req => cache_finished_req(
            c: *mut skv_cache, session_id: u64, branch_id: u64, req: *mut skv_req, aborted: u32);
        skv_match_prefix => match_prefix(
            c: *mut skv_cache, session_id: u64, branch_id: u64, req: *mut skv_req, key_len: u32, pre_aborted: u32,
            out: *mut skv_match);
        skv_free_tail => free_tail(c: *mut skv_cache, req: *mut skv_req, prefix_len: u32);
        skv_release_session => release_session(c: *mut skv_cache, session_id: u64);
        skv_cache_stats => cache_stats(c: *const skv_cache, out: *mut skv_stats);
        skv_cache_check => cache_check(c: *const skv_cache, out: *mut skv_check_report);
        skv_alloc_extend_batch => alloc_extend_batch(
            c: *mut skv_cache, reqs: *mut skv_req, n: usize, n_tokens: *const u32, out_loc: *mut i32, out_cap: usize);
        skv_commit_batch => commit_batch(c: *mut skv_cache, reqs: *mut skv_req, n: usize, n_tokens: *const u32);
        skv_events_enable => events_enable(c: *mut skv_cache, cfg: *const skv_events_config);
        skv_events_tokens => events_tokens(
            c: *mut skv_cache, session_id: u64, branch_id: u64, req: *const skv_req, first_pos: u32,
            tokens: *const i32, n: usize);
        skv_events_drain => events_drain(c: *mut skv_cache, buf: *mut u8, cap: usize, len: *mut usize, seq: *mut u64);
    }

    /// Whether the library's table reaches `offset`'s entry: an older library's is shorter (its
    /// `struct_size` says how long), and has none of the entries appended after it.
    pub fn has_entry(offset: usize) -> bool {
        table().struct_size as usize >= offset + std::mem::size_of::<usize>()
    }

    /// `skv_cache_free` (it returns nothing).
    pub unsafe fn skv_cache_free(c: *mut skv_cache) {
        // SAFETY: the caller's handle, under the export's contract.
        unsafe { (table().cache_free.expect("cache_free"))(c) }
    }

    /// The calling thread's last error message, from the library the calls went to.
    pub fn last_error() -> String {
        let get: extern "C" fn() -> *const c_char = table().last_error.expect("last_error");
        // SAFETY: skv_last_error returns a NUL-terminated thread-local string.
        unsafe { CStr::from_ptr(get()) }.to_string_lossy().into_owned()
    }

    /// Panics with the status's name and the library's message unless `st` is `SKV_OK` (a
    /// benchmark's setup must not fail).
    pub fn check(st: skv_status, what: &str) {
        if st != skv_status::SKV_OK {
            panic!("{what}: {}: {}", st.name(), last_error());
        }
    }
}

const PS: u32 = 16;
const TOKENS: u32 = 4096;
/// The 4-page tail a retried match frees and a finish trims.
const TAIL: u32 = 4 * PS;
/// Consecutive calls timed together for the median.
const GROUP: usize = 32;
/// The hybrid bed's sliding window, in tokens: an idle session keeps the SWA pages of its last
/// `WINDOW` positions.
const WINDOW: u32 = 1024;

/// The calls timed; their targets at 1,000 sessions, ns per call (per request for batches).
#[derive(Clone, Copy, PartialEq, Debug)]
enum Op {
    MatchTailFree,
    FinishTrim,
    Extend,
    Release,
    Stats,
    MatchHybrid,
    FinishHybrid,
    ReleaseHybrid,
    ExtendBatch(usize),
    CommitBatch(usize),
    /// A decode step's extend: one token a request, and one request in `PS` takes a page.
    StepBatch(usize),
    /// `StepBatch` on the hybrid bed: a page taken maps an SWA page too.
    StepBatchHybrid(usize),
    /// The engine's own reads and writes of a commit batch's reqs, no libskv call: the floor
    /// under a batch call at this shape.
    ReqsOnly(usize),
    /// A decode step: `skv_alloc_extend_batch` then `skv_commit_batch`, one token a request.
    DecodeStep(usize),
    /// `DecodeStep` on a handle with KV events on (its sessions' tokens handed over).
    DecodeStepEvents(usize),
    /// A finish whose turn committed `STORED` pages past the slot (no overshoot).
    FinishStore,
    /// `FinishStore` with events on: the output's tokens handed over, then the finish; the
    /// pair stores the `STORED` pages.
    FinishStoreEvents,
}

/// The pages a `FinishStore` turn adds.
const STORED: u32 = 8;

impl Op {
    fn all(batches: bool) -> Vec<Op> {
        // Each hybrid op right after its full-attention op: the two medians are compared.
        let mut v = vec![
            Op::MatchTailFree,
            Op::MatchHybrid,
            Op::FinishTrim,
            Op::FinishHybrid,
            Op::Extend,
            Op::Release,
            Op::ReleaseHybrid,
            Op::Stats,
        ];
        v.extend([Op::FinishStore, Op::FinishStoreEvents]);
        if batches {
            v.extend([Op::DecodeStep(256), Op::DecodeStepEvents(256)]);
            for b in [64, 256] {
                v.extend([
                    Op::ExtendBatch(b),
                    Op::StepBatch(b),
                    Op::StepBatchHybrid(b),
                    Op::CommitBatch(b),
                    Op::ReqsOnly(b),
                ]);
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
            Op::StepBatch(b) => format!("alloc_extend_batch {b}, 1 in {PS} a page"),
            Op::StepBatchHybrid(b) => format!("extend_batch_hybrid {b}, 1 in {PS} a page"),
            Op::ReqsOnly(b) => format!("reqs alone {b} (no call), per req"),
            Op::MatchHybrid => "match_hybrid, hit freeing a 4-page tail".into(),
            Op::FinishHybrid => "finish_hybrid, trimming a 4-page overshoot".into(),
            Op::ReleaseHybrid => "release_hybrid, 4096-token session".into(),
            Op::DecodeStep(b) => format!("decode step {b} (extend+commit), per req"),
            Op::DecodeStepEvents(b) => format!("decode_step_events {b}, per req"),
            Op::FinishStore => format!("finish, {STORED} new pages"),
            Op::FinishStoreEvents => format!("finish_events, storing {STORED} pages"),
        }
    }

    /// The call's target, ns; a hybrid op's is relative (`HYBRID_LIMIT`).
    fn target(self) -> String {
        match self {
            Op::MatchTailFree | Op::FinishTrim => "120".into(),
            Op::Extend => "40".into(),
            Op::Release => "300".into(),
            Op::Stats => "12".into(),
            Op::ExtendBatch(_) | Op::StepBatch(_) => "15".into(),
            Op::CommitBatch(_) => "8".into(),
            Op::ReqsOnly(_) => "-".into(),
            Op::MatchHybrid | Op::FinishHybrid | Op::ReleaseHybrid | Op::StepBatchHybrid(_) => {
                format!("{HYBRID_LIMIT}x full")
            }
            Op::DecodeStep(_) | Op::FinishStore => "-".into(),
            Op::DecodeStepEvents(_) => format!("{EVENTS_STEP_LIMIT}x off"),
            Op::FinishStoreEvents => format!("+{EVENTS_PAGE_LIMIT_NS}/page"),
        }
    }

    /// The full-attention op a hybrid op is compared with; `None` for the others.
    fn full(self) -> Option<Op> {
        match self {
            Op::MatchHybrid => Some(Op::MatchTailFree),
            Op::FinishHybrid => Some(Op::FinishTrim),
            Op::ReleaseHybrid => Some(Op::Release),
            Op::StepBatchHybrid(b) => Some(Op::StepBatch(b)),
            Op::DecodeStepEvents(b) => Some(Op::DecodeStep(b)),
            Op::FinishStoreEvents => Some(Op::FinishStore),
            _ => None,
        }
    }

    /// The bed an op runs on.
    fn kind(self) -> Kind {
        match self {
            Op::MatchHybrid | Op::FinishHybrid | Op::ReleaseHybrid | Op::StepBatchHybrid(_) => Kind::Hybrid,
            Op::DecodeStepEvents(_) | Op::FinishStoreEvents => Kind::Events,
            _ => Kind::Full,
        }
    }

    /// The plain-C reference figure (median of its range), where it has one.
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
            Op::ExtendBatch(b)
            | Op::StepBatch(b)
            | Op::StepBatchHybrid(b)
            | Op::CommitBatch(b)
            | Op::ReqsOnly(b)
            | Op::DecodeStep(b)
            | Op::DecodeStepEvents(b) => b,
            _ => 1,
        }
    }
}

/// libskv's bound on a hybrid op's median, as a multiple of its full-attention op's.
const HYBRID_LIMIT: f64 = 1.5;
/// libskv's bound on a decode step with events on, as a multiple of the step with them off.
const EVENTS_STEP_LIMIT: f64 = 1.3;
/// libskv's bound on a finish with events on: its time with them off plus this much per page it
/// stores, ns (docs/events.md#cost).
const EVENTS_PAGE_LIMIT_NS: f64 = 150.0;
/// Events beds hand every session's tokens over (about 90 bytes a held page): above this many
/// sessions their ops are left out.
const EVENTS_MAX_SESSIONS: usize = 10_000;

/// Which handle a bed is: plain, with an SWA pool, or with KV events on.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Kind {
    Full,
    Hybrid,
    Events,
}

/// N idle sessions of `TOKENS` tokens, and one req per session for the running turns.
struct Bed {
    c: *mut skv_cache,
    n: usize,
    /// The cache has an SWA pool, and every session's window has passed all but its last
    /// `WINDOW` positions.
    hybrid: bool,
    reqs: Vec<skv_req>,
    ones: Vec<u32>,
    out_loc: Vec<i32>,
    /// The order sessions take their rows in (`SKV_BENCH_ROWS`): `0..n`, or a fixed shuffle.
    order: Vec<usize>,
    /// KV events are on: every session's tokens were handed over, and rounds drain the batches.
    events: bool,
    /// The token ids sessions hold (the same for all: each session has its own salt).
    tokens: Vec<i32>,
    drained: Vec<u8>,
}

impl Bed {
    /// A bed of `kind`; `None` for events where the library has none (built without the
    /// feature, or older than the calls).
    fn of(n: usize, kind: Kind) -> Option<Bed> {
        Bed::build(n, kind == Kind::Hybrid, kind == Kind::Events)
    }

    fn build(n: usize, hybrid: bool, events: bool) -> Option<Bed> {
        // A running session's tail: the 4-page one, or a `FinishStore` turn's pages.
        let pages = n as u64 * u64::from(TOKENS / PS + (TAIL / PS).max(STORED) + 1) + 1024;
        // An idle session holds `WINDOW / PS` SWA pages, a running one a tail's more; the 1,024
        // spare pages also cover a session's first turn, which maps all `TOKENS / PS` before its
        // window step gives most back.
        let swa_pages = if hybrid { n as u64 * u64::from(WINDOW / PS + TAIL / PS + 1) + 1024 } else { 0 };
        let cfg = skv_cache_config {
            struct_size: std::mem::size_of::<skv_cache_config>() as u32,
            page_size: PS,
            num_token_slots: pages * u64::from(PS),
            num_rows: n as u32 + 16,
            max_context_len: 2 * TOKENS,
            flags: 0,
            swa_num_token_slots: swa_pages * u64::from(PS),
            ..Default::default()
        };
        if events && !has_entry(std::mem::offset_of!(skv::skv_api, events_drain)) {
            return None;
        }
        let mut c = std::ptr::null_mut();
        // SAFETY: cfg and c are locals.
        check(unsafe { skv_cache_new(&cfg, &mut c) }, "skv_cache_new");
        if events {
            let ev = skv_events_config {
                struct_size: std::mem::size_of::<skv_events_config>() as u32,
                data_parallel_rank: 0,
                flags: 0,
                // Room for a round's batches (a store and a removal a session): the rounds drain
                // between them, as an engine drains after its steps, and nothing overflows.
                max_batches: (2 * n + 64) as u32,
                endpoint: std::ptr::null(),
                topic: std::ptr::null(),
            };
            // SAFETY: the live handle just made; ev is a local.
            match unsafe { skv_events_enable(c, &ev) } {
                skv_status::SKV_ERR_UNSUPPORTED => {
                    // SAFETY: the handle just made, freed once.
                    unsafe { skv_cache_free(c) };
                    return None;
                }
                st => check(st, "skv_events_enable"),
            }
        }
        let order = row_order(n);
        let tokens = (0..TOKENS + STORED * PS).map(|i| (i * 7919 % 150_000) as i32).collect();
        let mut bed = Bed {
            c,
            n,
            hybrid,
            reqs: vec![skv_req::default(); n],
            ones: vec![1; 256],
            out_loc: vec![0; 256],
            order,
            events,
            tokens,
            drained: vec![0; 1 << 16],
        };
        let t = Instant::now();
        for i in 0..n {
            bed.hold(bed.order[i]);
        }
        bed.drain();
        let window = if hybrid { format!(", SWA window {WINDOW}") } else { String::new() };
        let events = if events { ", KV events on" } else { "" };
        eprintln!("setup: {n} sessions of {TOKENS} tokens{window}{events} in {:.2} s", t.elapsed().as_secs_f64());
        Some(bed)
    }

    /// Hands session `id`'s tokens of positions `[from, to)` over (an events bed only).
    fn hand(&mut self, id: usize, from: u32, to: u32) {
        if self.events {
            let toks = &self.tokens[from as usize..to as usize];
            // SAFETY: the bed's live handle, one of its reqs, toks.len() tokens.
            let st =
                unsafe { skv_events_tokens(self.c, id as u64, 0, &self.reqs[id], from, toks.as_ptr(), toks.len()) };
            check(st, "skv_events_tokens");
        }
    }

    /// Drains every pending batch (an events bed only; untimed, between rounds).
    fn drain(&mut self) {
        while self.events {
            let (mut len, mut seq) = (0usize, 0u64);
            // SAFETY: the bed's live handle; drained holds its length in bytes.
            let st =
                unsafe { skv_events_drain(self.c, self.drained.as_mut_ptr(), self.drained.len(), &mut len, &mut seq) };
            if st == skv_status::SKV_ERR_BUFFER {
                self.drained.resize(len, 0);
                continue;
            }
            check(st, "skv_events_drain");
            if len == 0 {
                return;
            }
        }
    }

    /// A first turn of `TOKENS` prompt tokens, finished: session `id` holds its row idle. On
    /// the hybrid bed the turn's window step first gives back the SWA pages of every position
    /// but the last `WINDOW` (the row records the cursor, `TOKENS - WINDOW`).
    fn hold(&mut self, id: usize) {
        let c = self.c;
        let mut req = skv_req::default();
        // SAFETY: c is the bed's live handle; req is a local (then the bed's).
        unsafe {
            check(skv_alloc_row(c, &mut req), "skv_alloc_row");
            check(skv_alloc_extend(c, &mut req, TOKENS, std::ptr::null_mut()), "skv_alloc_extend");
            check(skv_commit(c, &mut req, TOKENS), "skv_commit");
            if self.hybrid {
                let mut freed = 0;
                check(skv_swa_evict(c, &mut req, TOKENS, WINDOW, 0, -1, 0, &mut freed), "skv_swa_evict");
                assert_eq!((freed, req.swa_evicted_seqlen), (TOKENS - WINDOW, TOKENS - WINDOW));
            }
            req.origin_input_len = TOKENS;
            self.reqs[id] = req;
            self.hand(id, 0, TOKENS);
            check(skv_cache_finished_req(c, id as u64, 0, &mut self.reqs[id], 0), "skv_cache_finished_req");
        }
    }

    /// Restores session `id` into its req (a hit with nothing to free): the turn runs.
    fn restore(&mut self, id: usize) {
        let mut req = skv_req::default();
        let mut m = skv_match { hit: 0, prefix_len: 0 };
        // SAFETY: the bed's live handle; req and m are locals.
        check(unsafe { skv_match_prefix(self.c, id as u64, 0, &mut req, TOKENS, 0, &mut m) }, "skv_match_prefix");
        assert_eq!((m.hit, m.prefix_len), (1, TOKENS));
        // The hit restores the slot's cursor, which only the window step moved.
        assert_eq!(req.swa_evicted_seqlen, if self.hybrid { TOKENS - WINDOW } else { 0 });
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
        debug_assert_eq!((op.kind() == Kind::Hybrid, op.kind() == Kind::Events), (self.hybrid, self.events), "{op:?}");
        match op {
            Op::FinishStore | Op::FinishStoreEvents => {
                self.restore(id);
                self.extend(id, STORED * PS);
                let req = &mut self.reqs[id];
                // SAFETY: the bed's live handle and one of its reqs.
                check(unsafe { skv_commit(self.c, req, STORED * PS) }, "skv_commit");
                req.origin_input_len = TOKENS;
                req.output_len = STORED * PS;
                req.finished_len = (STORED * PS) as i32;
            }
            Op::DecodeStep(_) | Op::DecodeStepEvents(_) => {
                self.restore(id);
                let into_page = id as u32 % PS;
                if into_page > 0 {
                    self.extend(id, into_page);
                    let req = &mut self.reqs[id];
                    // SAFETY: the bed's live handle and one of its reqs.
                    check(unsafe { skv_commit(self.c, req, into_page) }, "skv_commit");
                }
            }
            Op::MatchTailFree | Op::MatchHybrid => {
                self.restore(id);
                self.extend(id, TAIL);
            }
            Op::FinishTrim | Op::FinishHybrid => {
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
            Op::StepBatch(_) | Op::StepBatchHybrid(_) => {
                // Sessions at every offset in a page: the step's token starts a page for one in PS.
                self.restore(id);
                let into_page = id as u32 % PS;
                if into_page > 0 {
                    self.extend(id, into_page);
                }
            }
            Op::CommitBatch(_) | Op::ReqsOnly(_) => {
                self.restore(id);
                self.extend(id, 1);
            }
            Op::Release | Op::ReleaseHybrid | Op::Stats => {}
        }
    }

    fn put_back(&mut self, op: Op, id: usize) {
        match op {
            Op::MatchTailFree
            | Op::MatchHybrid
            | Op::Extend
            | Op::ExtendBatch(_)
            | Op::StepBatch(_)
            | Op::StepBatchHybrid(_)
            | Op::CommitBatch(_)
            | Op::ReqsOnly(_) => self.finish_back(id),
            Op::FinishTrim | Op::FinishHybrid => assert_eq!(self.reqs[id].req_pool_idx, -1),
            Op::DecodeStep(_) | Op::DecodeStepEvents(_) => self.finish_back(id),
            Op::FinishStore | Op::FinishStoreEvents => {
                // Back to TOKENS: the turn's pages go (their removals drained after the round).
                assert_eq!(self.reqs[id].req_pool_idx, -1);
                self.restore(id);
                self.finish_back(id);
            }
            Op::Release | Op::ReleaseHybrid => self.hold(id),
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
                Op::MatchTailFree | Op::MatchHybrid => {
                    let mut m = skv_match { hit: 0, prefix_len: 0 };
                    let st = skv_match_prefix(c, lo as u64, 0, &mut self.reqs[lo], TOKENS, 0, &mut m);
                    if st == skv_status::SKV_OK && m.prefix_len != TOKENS {
                        return skv_status::SKV_ERR_INTERNAL;
                    }
                    st
                }
                Op::FinishTrim | Op::FinishHybrid => skv_cache_finished_req(c, lo as u64, 0, &mut self.reqs[lo], 0),
                Op::Extend => skv_alloc_extend(c, &mut self.reqs[lo], 1, std::ptr::null_mut()),
                Op::Release | Op::ReleaseHybrid => skv_release_session(c, lo as u64),
                Op::Stats => {
                    let mut s = std::mem::MaybeUninit::<skv_stats>::uninit();
                    skv_cache_stats(c, s.as_mut_ptr())
                }
                Op::ExtendBatch(_) | Op::StepBatch(_) | Op::StepBatchHybrid(_) | Op::CommitBatch(_) => {
                    batch_call(self, op, lo, hi)
                }
                Op::DecodeStep(_) | Op::DecodeStepEvents(_) => {
                    let st = batch_call(self, Op::ExtendBatch(0), lo, hi);
                    match st {
                        skv_status::SKV_OK => batch_call(self, Op::CommitBatch(0), lo, hi),
                        _ => st,
                    }
                }
                Op::FinishStore => skv_cache_finished_req(c, lo as u64, 0, &mut self.reqs[lo], 0),
                Op::FinishStoreEvents => {
                    let toks = &self.tokens[TOKENS as usize..(TOKENS + STORED * PS) as usize];
                    let st = skv_events_tokens(c, lo as u64, 0, &self.reqs[lo], TOKENS, toks.as_ptr(), toks.len());
                    match st {
                        skv_status::SKV_OK => skv_cache_finished_req(c, lo as u64, 0, &mut self.reqs[lo], 0),
                        _ => st,
                    }
                }
                Op::ReqsOnly(_) => {
                    for r in &mut self.reqs[lo..hi] {
                        if r.kv_committed_len < r.kv_allocated_len && r.req_pool_idx >= 0 {
                            r.kv_committed_len += 1;
                        }
                    }
                    black_box(&mut self.reqs);
                    skv_status::SKV_OK
                }
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
            panic!("{:?}: a timed call failed: {}", op, last_error());
        }
        // In the rows' order: a release round's sessions take rows again as the setup's did.
        for i in 0..self.n {
            self.put_back(op, self.order[i]);
            if i % 512 == 511 {
                self.drain();
            }
        }
        self.drain();
    }

    /// Every page of both pools is back where the setup left it, and the audit (which checks
    /// both pools) is clean.
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
            let swa_held = if self.hybrid { (self.n as u64) * u64::from(WINDOW / PS) } else { 0 };
            assert_eq!(stats.swa_used_pages, swa_held, "SWA pages leaked");
            assert_eq!(report.swa_pages_in_use, swa_held);
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
        Op::ExtendBatch(_) | Op::StepBatch(_) | Op::StepBatchHybrid(_) => unsafe {
            skv_alloc_extend_batch(bed.c, reqs, n, bed.ones.as_ptr(), bed.out_loc.as_mut_ptr(), bed.out_loc.len())
        },
        // SAFETY: the bed's live handle; n reqs (the slice above), n counts by this function's
        // contract.
        Op::CommitBatch(_) => unsafe { skv_commit_batch(bed.c, reqs, n, bed.ones.as_ptr()) },
        _ => unreachable!(),
    }
}

/// How much of the core this thread has now: independent adds per ns (four chains of adds;
/// the core runs up to four a cycle at ~2.85 cycles per ns). This machine's core is shared: a
/// chain of dependent adds runs at the same ~2.85 per ns at every moment, while this figure
/// moves between about 4.5 and 11 from one second to the next, and the calls' times move
/// with it. Printed beside each call's median, it tells a busy moment from a change in the
/// code. 0 where the adds cannot be written (not x86-64).
fn core_adds_per_ns() -> f64 {
    #[cfg(target_arch = "x86_64")]
    {
        const ROUNDS: u64 = 50_000;
        let (mut a, mut b, mut c, mut d) = (0u64, 0u64, 0u64, 0u64);
        let t = Instant::now();
        for _ in 0..ROUNDS {
            // SAFETY: adds on four registers; nothing else is read or written.
            unsafe {
                std::arch::asm!(
                    "add {0}, 1", "add {1}, 1", "add {2}, 1", "add {3}, 1",
                    "add {0}, 1", "add {1}, 1", "add {2}, 1", "add {3}, 1",
                    inout(reg) a, inout(reg) b, inout(reg) c, inout(reg) d,
                    options(nomem, nostack),
                );
            }
        }
        let ns = t.elapsed().as_nanos() as f64;
        assert_eq!(black_box(a + b + c + d), 8 * ROUNDS);
        (8 * ROUNDS) as f64 / ns
    }
    #[cfg(not(target_arch = "x86_64"))]
    0.0
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_unstable_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// The order sessions take their rows in: call order, or with `SKV_BENCH_ROWS=scattered` a
/// fixed shuffle (Fisher-Yates over a xorshift stream, the same every run).
fn row_order(n: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    match std::env::var("SKV_BENCH_ROWS").as_deref() {
        Ok("scattered") => {
            let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
            for i in (1..n).rev() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                order.swap(i, (x % (i as u64 + 1)) as usize);
            }
        }
        Ok("") | Ok("consecutive") | Err(_) => {}
        Ok(other) => panic!("SKV_BENCH_ROWS={other}: consecutive (the default) or scattered"),
    }
    order
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
    let ops = Op::all(true);
    // A hybrid op brings its full-attention op along: its ratio needs both.
    let named = |op: Op| filter.as_deref().is_none_or(|f| op.name().contains(f));
    let selected = |op: Op| named(op) || ops.iter().any(|&h| h.full() == Some(op) && named(h));
    let overhead = clock_overhead_ns() as f64;
    if bench {
        let rows = std::env::var("SKV_BENCH_ROWS").ok().filter(|r| !r.is_empty());
        println!(
            "hot path, owned mode, page size {PS}, sessions of {TOKENS} tokens, round-robin, rows {}",
            rows.as_deref().unwrap_or("consecutive")
        );
        println!("hybrid ops: SWA pool, window {WINDOW} tokens; vs full = median / the full-attention op's");
        println!("clock overhead {overhead} ns (subtracted from p50/p99)");
        println!("core = independent adds per ns around the grouped rounds (the core's share this thread had)");
        println!(
            "{:<42} {:>8} {:>8} {:>8} {:>8} {:>9} {:>9} {:>8} {:>6}",
            "call", "sessions", "median", "p50", "p99", "target", "vs C", "vs full", "core"
        );
    }
    let mut skipped = Vec::new();
    for &n in &sizes {
        // Built on first use, so a filter leaving one bed's ops out costs nothing: full, hybrid,
        // events (`None` inside when the library has no events).
        let mut beds: [Option<Option<Bed>>; 3] = [None, None, None];
        for &op in &ops {
            if !selected(op) {
                continue;
            }
            if op.kind() == Kind::Events && n > EVENTS_MAX_SESSIONS {
                skipped.push(format!("{} at {n} sessions (over {EVENTS_MAX_SESSIONS})", op.name()));
                continue;
            }
            let rounds = if bench { (calls / n).max(4) } else { 2 };
            let (mut each, mut groups) = (Vec::new(), Vec::new());
            // The core's throughput around each grouped round (`core_adds_per_ns`).
            let mut rates = Vec::new();
            // A hybrid or events op's timed rounds alternate with its base op's (events off, full
            // attention), each pair's medians giving one ratio and one difference: the box's
            // speed moves between runs, hardly within a pair.
            let (mut pair_ratios, mut pair_diffs) = (Vec::new(), Vec::new());
            if beds[op.kind() as usize].get_or_insert_with(|| Bed::of(n, op.kind())).is_none() {
                skipped.push(format!(
                    "{}: this library has no KV events (built without the `events` feature, or older)",
                    op.name()
                ));
                continue;
            }
            let mut bed_of = |kind: Kind| -> Bed {
                beds[kind as usize].get_or_insert_with(|| Bed::of(n, kind)).take().expect("a bed")
            };
            if let Some(f) = op.full() {
                let (mut fb, mut hb) = (bed_of(Kind::Full), bed_of(op.kind()));
                hb.round(op, None, Some(&mut Vec::new()), overhead); // warm-up
                for r in 0..rounds {
                    if r % 2 == 0 {
                        hb.round(op, Some(&mut each), None, overhead);
                    } else {
                        let (mut fg, mut hg) = (Vec::new(), Vec::new());
                        fb.round(f, None, Some(&mut fg), overhead);
                        let before = core_adds_per_ns();
                        hb.round(op, None, Some(&mut hg), overhead);
                        rates.push((before + core_adds_per_ns()) / 2.0);
                        let (h, f) = (percentile(&mut hg, 0.5), percentile(&mut fg, 0.5));
                        pair_ratios.push(h / f);
                        pair_diffs.push(h - f);
                        groups.extend(hg);
                    }
                }
                beds[Kind::Full as usize] = Some(Some(fb));
                beds[op.kind() as usize] = Some(Some(hb));
            } else {
                let mut bed = bed_of(Kind::Full);
                bed.round(op, None, Some(&mut Vec::new()), overhead); // warm-up
                for r in 0..rounds {
                    if r % 2 == 0 {
                        bed.round(op, Some(&mut each), None, overhead);
                    } else {
                        let before = core_adds_per_ns();
                        bed.round(op, None, Some(&mut groups), overhead);
                        rates.push((before + core_adds_per_ns()) / 2.0);
                    }
                }
                beds[Kind::Full as usize] = Some(Some(bed));
            }
            if !bench {
                continue;
            }
            let median = percentile(&mut groups, 0.5);
            let (p50, p99) = (percentile(&mut each, 0.5), percentile(&mut each, 0.99));
            let vs_c = op.plain_c_ns().map_or("-".into(), |c| format!("{:.2}x", median / c));
            let vs_full = match pair_ratios.is_empty() {
                true => "-".into(),
                false => format!("{:.2}x", percentile(&mut pair_ratios, 0.5)),
            };
            let core = match rates.is_empty() || rates.contains(&0.0) {
                true => "-".into(),
                false => format!("{:.1}", percentile(&mut rates, 0.5)),
            };
            println!(
                "{:<42} {:>8} {:>8.1} {:>8.1} {:>8.1} {:>9} {:>9} {:>8} {:>6}",
                op.name(),
                n,
                median,
                p50,
                p99,
                op.target(),
                vs_c,
                vs_full,
                core
            );
            if op == Op::FinishStoreEvents {
                let d = percentile(&mut pair_diffs, 0.5);
                println!("  events on - off: {d:.1} ns a finish, {:.1} ns per stored page", d / f64::from(STORED));
            }
        }
        for bed in beds.iter().flatten().flatten() {
            bed.audit();
        }
    }
    for s in skipped {
        eprintln!("left out: {s}");
    }
}
