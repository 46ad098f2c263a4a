//! Runs the built `skv-sim` with libskv's host tier (`--host-pool-tokens`) on a small
//! workload under memory pressure: the tier must park and restore sessions, every restored
//! position must hold its own KV (the engine's tag mirror), fewer prompt tokens must be
//! recomputed than by the same workload without it, and the run must end clean (no ticket
//! open, every page back, audits clean).

mod common;

use common::{field, num, sim};

/// A pool of 64 pages for 12 open sessions of up to 31 pages: idle sessions must leave it.
const PRESSURE: &[&str] = &[
    "--json",
    "--sessions",
    "60",
    "--turns",
    "3",
    "--concurrency",
    "12",
    "--batch",
    "4",
    "--prompt-max",
    "96",
    "--max-new-tokens",
    "40",
    "--check-every",
    "5",
    "--pool-tokens",
    "1024",
    "--host-pool-tokens",
    "8192",
];

fn run_json(extra: &[&str]) -> String {
    let args: Vec<&str> = PRESSURE.iter().chain(extra).copied().collect();
    let out = sim(&args);
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "skv-sim {args:?} failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(stdout.lines().count(), 1, "--json prints one line: {stdout}");
    stdout
}

fn assert_restores_and_ends_clean(j: &str) {
    assert_eq!(num(j, "failed_copies_with_tier"), 0);
    assert_restores_and_ends_clean_but_failures(j);
}

fn assert_restores_and_ends_clean_but_failures(j: &str) {
    assert_eq!(field(j, "ok_with_tier"), "true", "{j}");
    assert_eq!(field(j, "ok_without_tier"), "true", "{j}");
    assert_eq!(num(j, "turns"), 180);
    assert_eq!((num(j, "audit_violations"), num(j, "leaked_pages"), num(j, "leaked_rows")), (0, 0, 0), "{j}");
    assert!(num(j, "audits") >= 36, "periodic audits ran: {j}");
    assert!(num(j, "parks_with_tier") > 0 && num(j, "unparks_with_tier") > 0, "sessions parked and restored: {j}");
    assert!(num(j, "verified_positions") > 0, "restored KV was checked: {j}");
    assert!(num(j, "bytes_to_host_with_tier") > 0 && num(j, "bytes_to_device_with_tier") > 0, "{j}");
    assert_eq!((num(j, "parks_without_tier"), num(j, "bytes_to_host_without_tier")), (0, 0), "{j}");
    assert!(num(j, "hits_with_tier") > num(j, "hits_without_tier"), "the tier keeps hits: {j}");
    assert!(
        num(j, "prefill_tokens_recomputed_with_tier") < num(j, "prefill_tokens_recomputed_without_tier"),
        "the tier recomputes fewer prompt tokens: {j}"
    );
}

#[test]
fn the_host_tier_restores_sessions_and_recomputes_less() {
    let j = run_json(&[]);
    assert_restores_and_ends_clean(&j);
    assert!(num(&j, "evictions_with_tier") > 0, "the pool was under pressure: {j}");
    let model = |k: &str| field(&j, k).parse::<f64>().unwrap();
    assert!(model("model_s_with_tier") < model("model_s_without_tier"), "restores beat recomputing: {j}");
}

#[test]
fn eviction_waits_for_write_backs_when_nothing_is_written_back_ahead() {
    // No background write-back: every eviction writes its session back, then waits for it.
    let j = run_json(&["--tier-pages-per-step", "0", "--copy-gbps", "1"]);
    assert_restores_and_ends_clean(&j);
    assert!(num(&j, "eviction_waits_with_tier") > 0, "{j}");
    assert!(num(&j, "stalled_steps_with_tier") > 0, "{j}");
}

#[test]
fn a_small_host_pool_drops_parked_sessions_and_stays_exact() {
    // With recurrent state: a parked session keeps its handles, a released one gives them back.
    let j = run_json(&["--host-pool-tokens", "1024", "--tier-idle-steps", "0", "--seed", "3", "--mamba"]);
    assert_restores_and_ends_clean(&j);
    assert!(num(&j, "host_evictions_with_tier") > 0 && num(&j, "released_by_tier_with_tier") > 0, "host full: {j}");
    assert_eq!(num(&j, "mamba_leaked"), 0);
    assert!(num(&j, "mamba_freed_by_libskv") > 0, "{j}");
}

#[test]
fn a_hybrid_model_restores_both_pools() {
    // The sliding-window pages the window still holds move with the full ones; every restored
    // window position is checked in the SWA pool.
    let j = run_json(&["--swa-window", "48"]);
    assert_restores_and_ends_clean(&j);
    assert_eq!(num(&j, "leaked_swa_pages"), 0);
    assert!(num(&j, "swa_window_steps") > 0, "{j}");
}

#[test]
fn failed_copies_lose_nothing() {
    // A failed write-back leaves its session on the device; a failed restore's request is
    // aborted. Every restore that did arrive is still exact, and the run ends clean.
    let j = run_json(&["--copy-fail-rate", "0.3", "--mamba"]);
    assert_restores_and_ends_clean_but_failures(&j);
    assert!(num(&j, "failed_copies_with_tier") > 0 && num(&j, "failed_restores_with_tier") > 0, "{j}");
    assert_eq!(num(&j, "mamba_leaked"), 0);
}

#[test]
fn bad_tier_options_exit_2_with_one_line() {
    for args in [
        &["--host-pool-tokens", "16"][..],
        &["--host-pool-tokens", "4294967296"],
        &["--host-pool-tokens", "48", "--instances", "2"],
        &["--copy-gbps", "0"],
        &["--prefill-tokens-per-s", "-1"],
        &["--kv-bytes-per-token", "0"],
        &["--copy-fail-rate", "1.5"],
    ] {
        let out = sim(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{args:?}: one line expected, got {stderr}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
}
