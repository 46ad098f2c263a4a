//! A seeded fuzzer of libskv's C ABI on stable Rust: it plays an engine against one owned and
//! one external handle at a time, mixing honest turns with hostile arguments, and checks after
//! every call that nothing crashed, the owned audit is clean, the fake engine saw no double
//! free, and that a failed call (other than SKV_ERR_CALLBACK) changed nothing: the req bytes,
//! `skv_cache_stats`, `skv_session_held` and every live row are compared with a snapshot taken
//! before it. At the end of each world everything is released and nothing may leak.
//!
//! External worlds vary the engine's pool ops: ABI 2 (`free_kv` takes every free whole), hybrid
//! (`free_kv_segment`: a full and an SWA pool, every SWA page freed once, no full page freed
//! while its SWA peer lives, `skv_swa_evict` checked against sglang's step) and struct_size 56
//! without `free_kv_segment` (a free with a full-only piece is refused); some set
//! `SKV_FLAG_PAGE_FREES` (one index per page, each page once). Some owned sides have an SWA
//! pool (smaller or larger than the full pool): `skv_swa_evict` is checked against the same
//! step and the SWA pages it gives back, `skv_row_swa_indices` against the cursor of a req that
//! agrees with its row, `skv_build_flashinfer_swa` against `skv_build_flashinfer`; the SWA
//! pool's free and used pages add up after every call and all are free at the end. The
//! scheduler's calls (`skv_hand_back`, the usage and idle-slot queries, `skv_admission_pages`)
//! are checked against each other and against what the calls they describe then do.
//!
//! ABI 3's calls are all driven: the batch calls (`world/batch.rs`, checked against what the
//! single calls say of each request, their arrays laid out apart, touching, misaligned or
//! overlapping at random byte offsets), every caller buffer's alignment and aliasing
//! (`world/buffers.rs`), recurrent handles given twice (`world/handles.rs`), the window step and
//! the frees of a pool without `free_kv_segment` (`world/hybrid.rs`), free callbacks failing
//! midway (`engine.rs`), NULL and re-entrant calls of every export (`every.rs`), and the rest
//! (`world/misc.rs`). Every call's status is counted by function (`coverage.rs`): a run must
//! reach each export's OK and each refusal its header line documents, and nothing else.
//!
//! ABI 4's host tier (`world/tier.rs`): some owned worlds get a host pool and policy, every
//! owned engine a `copy_pages` that queues copies or refuses them (a refusal must change
//! nothing: the snapshot includes `skv_tier_stats` and where every session is); tickets are
//! completed later in random order, ok or failed, and the tier's stats are checked against
//! where each session is after every tier call.
//!
//! Deterministic for a seed. Probe classes of holes earlier versions had are named in `Probes`
//! (see `Probes::parse`); every run includes them all unless told otherwise.

pub mod coverage;
pub mod engine;
pub mod every;
mod probes;
mod world;

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::time::{Duration, Instant};

pub use world::World;

/// splitmix64: small, seedable, good enough to pick operations.
#[derive(Clone)]
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, n)`; 0 when n is 0.
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }

    pub fn upto(&mut self, n: u32) -> u32 {
        self.below(n as u64 + 1) as u32
    }

    pub fn chance(&mut self, per_mille: u64) -> bool {
        self.below(1000) < per_mille
    }

    pub fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len() as u64) as usize]
    }
}

/// Probe classes, each of a hole an earlier libskv had (0.1.0's holes 1-7, 0.3.0's issue 23).
#[derive(Clone, Copy, Default, Debug)]
pub struct Probes {
    /// Array lengths no array can have (SIZE_MAX/2 ...) on traced handles: the trace must
    /// not read the array before the call checks its length (hole 1).
    pub traced_huge_lengths: bool,
    /// `skv_cache_set_hooks` with a struct_size smaller than the struct, at the end of a
    /// readable page, on a traced handle: nothing past struct_size may be read (hole 2).
    pub traced_short_hooks: bool,
    /// A chain of nine handles whose callbacks call the next; the ninth calls the first (hole 3).
    pub deep_reentry: bool,
    /// A callback calling another handle must get SKV_ERR_STATE (the round's rule, holes 3-4).
    pub strict_reentry: bool,
    /// Stale req copies on rows reused by another request: owned mode must refuse them with
    /// SKV_ERR_STATE (hole 5).
    pub stale_reused_rows: bool,
    /// Owned-only calls on an external handle with bad rows: SKV_ERR_UNSUPPORTED wins (hole 6).
    pub external_unsupported: bool,
    /// Config/hooks structs larger than this header's with non-zero unknown tail bytes must be
    /// refused (hole 7).
    pub struct_tails: bool,
    /// Caller buffers misaligned, or overlapping where a call writes one while it reads
    /// another (a batch's out_loc or n_tokens over its reqs): refused before anything is read
    /// (issue 23, item 1).
    pub aliased_buffers: bool,
    /// A req holding one recurrent handle twice, which a release would free twice: refused
    /// (issue 23, item 4).
    pub doubled_handles: bool,
    /// Without free_kv_segment, a req whose window freed positions: refused, so no slot keeps
    /// a cursor that makes every later release unsupported (issue 23, item 5).
    pub no_segment_cursor: bool,
}

impl Probes {
    /// A comma-separated list of probe names, or `all`.
    pub fn parse(s: &str) -> Probes {
        let mut p = Probes::default();
        for name in s.split(',').map(str::trim).filter(|n| !n.is_empty() && *n != "none") {
            let all = name == "all";
            let mut hit = all;
            for (n, f) in [
                ("traced-huge-lengths", &mut p.traced_huge_lengths),
                ("traced-short-hooks", &mut p.traced_short_hooks),
                ("deep-reentry", &mut p.deep_reentry),
                ("strict-reentry", &mut p.strict_reentry),
                ("stale-reused-rows", &mut p.stale_reused_rows),
                ("external-unsupported", &mut p.external_unsupported),
                ("struct-tails", &mut p.struct_tails),
                ("aliased-buffers", &mut p.aliased_buffers),
                ("doubled-handles", &mut p.doubled_handles),
                ("no-segment-cursor", &mut p.no_segment_cursor),
            ] {
                if all || n == name {
                    *f = true;
                    hit = true;
                }
            }
            assert!(hit, "SKV_FUZZ_PROBES: unknown probe {name:?}");
        }
        p
    }
}

/// What one run does.
#[derive(Clone, Debug)]
pub struct Plan {
    pub seed: u64,
    pub calls: u64,
    /// Calls per world (a pair of handles) before it is torn down and audited for leaks.
    pub world_calls: u64,
    /// Skips the worlds before this one (each world's seed comes from the run's seed alone), so
    /// a finding in world N reproduces in seconds.
    pub first_world: u64,
    pub probes: Probes,
}

#[derive(Default, Debug)]
pub struct Totals {
    pub calls: u64,
    pub worlds: u64,
    pub by_status: [u64; 10],
    pub traced_worlds: u64,
    pub injected_failures: u64,
    /// How often each outcome a check needs was reached (a skv_hand_back that succeeded, an
    /// admission prediction followed through, ...).
    pub cover: std::collections::BTreeMap<&'static str, u64>,
    /// How often each export returned each status.
    pub calls_by: coverage::Coverage,
}

/// Progress for the watchdog: a deadlock (a probe of hole 3) ends the process with the seed.
static PROGRESS: AtomicU64 = AtomicU64::new(0);

fn watchdog(seed: u64) {
    std::thread::spawn(move || {
        let (mut last, mut since) = (u64::MAX, Instant::now());
        loop {
            std::thread::sleep(Duration::from_millis(500));
            let now = PROGRESS.load(Ordering::Relaxed);
            if now == u64::MAX {
                return;
            }
            if now != last {
                (last, since) = (now, Instant::now());
            } else if since.elapsed() > Duration::from_secs(30) {
                eprintln!("skv fuzz: no progress for 30 s at call {now} (a deadlock?); seed {seed:#x}");
                std::process::abort();
            }
        }
    });
}

static SEED: AtomicU64 = AtomicU64::new(0);

/// The call in progress (its description's first bytes, NUL-ended), for the crash report.
static CALL: [AtomicU8; 240] = [const { AtomicU8::new(0) }; 240];

/// Notes the call about to be made, for `on_crash`.
pub(crate) fn note_call(desc: &str) {
    let n = desc.len().min(CALL.len() - 1);
    for (slot, &b) in CALL.iter().zip(&desc.as_bytes()[..n]) {
        slot.store(b, Ordering::Relaxed);
    }
    CALL[n].store(0, Ordering::Relaxed);
}

/// A crash (a probe of a hole that reads past a caller's array) still names the seed and call.
extern "C" fn on_crash(sig: libc::c_int) {
    let mut buf = *b"skv fuzz: crashed (signal   ) at call                     , seed 0x                \n";
    let put = |buf: &mut [u8], end: usize, mut v: u64, radix: u64| {
        let mut i = end;
        loop {
            i -= 1;
            buf[i] = b"0123456789abcdef"[(v % radix) as usize];
            v /= radix;
            if v == 0 {
                break;
            }
        }
    };
    put(&mut buf, 28, sig as u64, 10);
    put(&mut buf, 57, PROGRESS.load(Ordering::Relaxed), 10);
    put(&mut buf, 81, SEED.load(Ordering::Relaxed), 16);
    let mut call = [b'\n'; 248];
    call[..6].copy_from_slice(b"  in: ");
    let mut n = 6;
    for slot in &CALL {
        match slot.load(Ordering::Relaxed) {
            0 => break,
            b => (call[n], n) = (b, n + 1),
        }
    }
    // SAFETY: write(2) and signal(2) are async-signal-safe; the default action then ends the
    // process as the signal would have.
    unsafe {
        libc::write(2, buf.as_ptr().cast(), buf.len());
        libc::write(2, call.as_ptr().cast(), n + 1);
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
}

fn crash_report(seed: u64) {
    SEED.store(seed, Ordering::Relaxed);
    // SAFETY: installing a handler that only writes and re-raises.
    unsafe {
        for sig in [libc::SIGSEGV, libc::SIGBUS] {
            libc::signal(sig, on_crash as extern "C" fn(libc::c_int) as libc::sighandler_t);
        }
    }
}

/// Runs the plan; panics with the seed, world, call index and the recent calls on a finding.
pub fn run(plan: &Plan) -> Totals {
    watchdog(plan.seed);
    crash_report(plan.seed);
    let mut rng = Rng(plan.seed);
    let mut t = Totals::default();
    for _ in 0..plan.first_world {
        rng.next();
        t.worlds += 1;
    }
    let mut done = 0;
    while done < plan.calls {
        let n = plan.world_calls.min(plan.calls - done);
        done += n;
        let first = t.worlds * plan.world_calls;
        let mut w = World::new(rng.next(), t.worlds, first, plan);
        t.traced_worlds += w.traced() as u64;
        w.run(n, &mut t);
        w.teardown();
        t.worlds += 1;
    }
    PROGRESS.store(u64::MAX, Ordering::Relaxed);
    t
}

pub(crate) fn tick(call: u64) {
    PROGRESS.store(call, Ordering::Relaxed);
}
