//! The C ABI under a seeded fuzzer (see `fuzz_driver`): a short run in every `cargo test`, a
//! long run on demand.
//!
//! Long run (release; prints the seed, call counts and statuses):
//! ```sh
//! SKV_FUZZ_CALLS=10000000 SKV_FUZZ_SEED=0x1234 cargo test --release --test fuzz -- --nocapture
//! ```
//! `SKV_FUZZ_PROBES=name,name` (or `all`, or `none`) sets the probe classes beyond `CI_PROBES`
//! (see `Probes`: each names the hole it probes); `SKV_FUZZ_WORLD_CALLS` sets how many calls a pair of handles lives for. A finding
//! panics with the seed, world and call index: rerun with that seed, or jump to the world with
//! `SKV_FUZZ_FIRST_WORLD=N SKV_FUZZ_CALLS=<calls per world>`; `SKV_FUZZ_LOG=N` prints the last N
//! calls before the finding (default 48).

// As in the library: every unsafe block says why it is sound.
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

mod common;
#[path = "fuzz_driver/mod.rs"]
mod fuzz_driver;

use fuzz_driver::{Plan, Probes};

/// The probe classes every run includes unless `SKV_FUZZ_PROBES` names others: all of them.
/// Each one failed on an earlier libskv (a crash, a deadlock, a wrong status or state no call
/// could release) and is a regression test of its fix since.
const CI_PROBES: &str = "all";

fn env_u64(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => {
            let v = v.trim().replace('_', "");
            let parsed = match v.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => v.parse(),
            };
            parsed.unwrap_or_else(|_| panic!("{name}={v} is not a number"))
        }
        Err(_) => default,
    }
}

#[test]
fn fuzz_c_abi() {
    let plan = Plan {
        seed: env_u64("SKV_FUZZ_SEED", 0x5eed_0001),
        calls: env_u64("SKV_FUZZ_CALLS", 100_000),
        world_calls: env_u64("SKV_FUZZ_WORLD_CALLS", 4_000),
        first_world: env_u64("SKV_FUZZ_FIRST_WORLD", 0),
        probes: Probes::parse(
            &std::env::var("SKV_FUZZ_PROBES").ok().filter(|p| !p.is_empty()).unwrap_or_else(|| CI_PROBES.into()),
        ),
    };
    println!(
        "skv fuzz: seed {:#x}, {} calls, {} per world, probes {:?}",
        plan.seed, plan.calls, plan.world_calls, plan.probes
    );
    let start = std::time::Instant::now();
    let t = fuzz_driver::run(&plan);
    let secs = start.elapsed().as_secs_f64();
    println!(
        "skv fuzz: {} calls in {} worlds ({} traced) in {secs:.1} s ({:.0} calls/s); {} injected callback failures",
        t.calls,
        t.worlds,
        t.traced_worlds,
        t.calls as f64 / secs,
        t.injected_failures
    );
    let names = [
        "OK",
        "NULL_ARG",
        "INVALID_ARG",
        "OUT_OF_MEMORY",
        "NOT_FOUND",
        "STATE",
        "CALLBACK",
        "CUDA",
        "UNSUPPORTED",
        "INTERNAL",
    ];
    let by: Vec<String> = names.iter().zip(t.by_status).map(|(n, c)| format!("{n} {c}")).collect();
    println!("skv fuzz: statuses: {}", by.join(", "));
    println!("skv fuzz: reached: {:?}", t.cover);
    println!("skv fuzz: coverage (calls by function and status):\n{}", fuzz_driver::coverage::table(&t.calls_by));
    assert!(t.calls >= plan.calls);
    // Every status class a hostile caller can reach must have been reached.
    for (i, n) in names.iter().enumerate() {
        if matches!(*n, "CUDA" | "INTERNAL") || (plan.calls < 10_000) {
            continue;
        }
        assert!(t.by_status[i] > 0, "the run never reached {n}");
    }
    // Every check of the scheduler and hybrid calls must have run.
    for what in [
        "hand_back of an unrun hit",
        "idle_sessions cut at cap",
        "admission prediction checked",
        "swa_evict freed SWA pages",
        "owned swa_evict gave SWA pages back",
        "swa view of a running row checked",
        "flashinfer_swa checked against the full layout",
        "extend batch checked",
        "commit batch checked",
        "a per-step call took a req with a handle given twice",
    ]
    .into_iter()
    .chain(plan.probes.aliased_buffers.then_some("batch aliasing or misaligned buffers refused"))
    .chain(plan.probes.aliased_buffers.then_some("single-call misaligned or overlapping buffers refused"))
    .chain(plan.probes.doubled_handles.then_some("a recurrent handle given twice refused"))
    .chain(plan.probes.no_segment_cursor.then_some("cursor past swa_dead_lo refused without free_kv_segment"))
    {
        if plan.calls >= 50_000 {
            assert!(t.cover.get(what).copied().unwrap_or(0) > 0, "the run never reached: {what}");
        }
    }
    // Rarer outcomes: a free callback that fails midway hands back part of its indices.
    for what in ["free_kv_segment failed midway", "free_kv failed midway"] {
        if plan.calls >= 1_000_000 {
            assert!(t.cover.get(what).copied().unwrap_or(0) > 0, "the run never reached: {what}");
        }
    }
    // Every export reached OK and each refusal it documents (a short run: those it reliably
    // reaches), and none returned a status it does not document.
    if plan.calls >= 100_000 {
        let bad = fuzz_driver::coverage::check(&t.calls_by, plan.calls < 10_000_000);
        assert!(bad.is_empty(), "coverage:\n  {}", bad.join("\n  "));
    }
}
