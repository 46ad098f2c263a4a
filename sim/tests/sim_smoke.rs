//! Runs the built `skv-sim` binary on small workloads: a clean run must exit 0 with a clean
//! audit and real trimming, a hybrid run must give back every SWA page; bad options must exit
//! 2 with one line on stderr.

mod common;

use common::{field, num, sim};

const SMALL: &[&str] = &[
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
    "20",
];

fn run_json(extra: &[&str]) -> String {
    let args: Vec<&str> = SMALL.iter().chain(extra).copied().collect();
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

#[test]
fn small_workload_is_clean() {
    let j = run_json(&[]);
    assert_eq!(field(&j, "ok"), "true");
    assert_eq!(num(&j, "turns"), 180);
    assert_eq!(num(&j, "sessions_closed"), 60);
    assert_eq!(num(&j, "audit_violations"), 0);
    assert!(num(&j, "audits") >= 9, "periodic audits ran: {j}");
    assert_eq!(num(&j, "leaked_pages"), 0);
    assert_eq!(num(&j, "leaked_rows"), 0);
    assert!(num(&j, "trimmed_tokens") > 0, "overshoot was trimmed: {j}");
    assert!(num(&j, "tokens_generated") > num(&j, "tokens_kept"), "rounds overshoot: {j}");
    assert!(num(&j, "hits") > 0 && num(&j, "aborted") + num(&j, "retried") > 0, "{j}");
    assert!(num(&j, "pages_freed_release") > 0 && num(&j, "peak_pages") > 0, "{j}");
    assert_eq!(num(&j, "locks_taken"), num(&j, "locks_returned"));
    assert!(num(&j, "finish_calls") >= 180 && num(&j, "match_p50_ns") > 0, "{j}");
}

#[test]
fn same_seed_same_run() {
    let (a, b) = (run_json(&["--seed", "7"]), run_json(&["--seed", "7"]));
    let c = run_json(&["--seed", "8"]);
    for key in ["tokens_generated", "trimmed_tokens", "tail_freed_tokens", "peak_pages", "pages_freed_trim", "hits"] {
        assert_eq!(num(&a, key), num(&b, key), "{key} differs between two runs of seed 7");
    }
    assert_ne!(num(&a, "tokens_generated"), num(&c, "tokens_generated"), "seeds 7 and 8 ran the same workload");
}

#[test]
fn memory_pressure_evicts_preempts_and_stays_clean() {
    // A pool a few sessions fill: idle branches are evicted and growing requests preempted.
    let j = run_json(&[
        "--pool-tokens",
        "1024",
        "--page-size",
        "8",
        "--shared-prefix-pages",
        "2",
        "--swa-window",
        "4",
        "--branch-rate",
        "0.3",
    ]);
    assert_eq!(field(&j, "ok"), "true");
    assert!(num(&j, "evictions") > 0 && num(&j, "pages_freed_evict") > 0, "the small pool forced evictions: {j}");
    assert!(num(&j, "preempted") > 0, "the small pool forced preemptions: {j}");
    assert!(num(&j, "branches") > 0, "{j}");
    assert_eq!(num(&j, "turns"), 180, "every preempted turn ran again: {j}");
    assert_eq!(num(&j, "leaked_pages") + num(&j, "leaked_rows") + num(&j, "audit_violations"), 0);
}

/// A hybrid run's SWA side: window steps made and checked, pages back from the window, none
/// left over.
fn assert_hybrid_clean(j: &str, page_size: u64) {
    assert_eq!(field(j, "ok"), "true", "{j}");
    assert!(num(j, "swa_total_pages") > 0 && num(j, "peak_swa_pages") > 0, "an SWA pool was used: {j}");
    let steps = num(j, "swa_window_steps");
    assert!(steps >= num(j, "rounds") / 2, "every running request took window steps: {j}");
    assert_eq!(num(j, "swa_evict_calls"), steps, "{j}");
    let pages = num(j, "swa_pages_freed_window");
    assert!(pages > 0, "the window gave SWA pages back: {j}");
    assert_eq!(num(j, "swa_freed_positions"), pages * page_size, "windows free whole pages: {j}");
    assert_eq!(num(j, "leaked_swa_pages") + num(j, "leaked_pages") + num(j, "audit_violations"), 0, "{j}");
}

#[test]
fn hybrid_model_frees_every_swa_page() {
    let j = run_json(&["--swa-window", "32"]);
    assert_hybrid_clean(&j, 16);
    assert_eq!(num(&j, "swa_total_pages"), num(&j, "total_pages"), "the SWA pool defaults to --pool-tokens: {j}");
    assert!(num(&j, "peak_swa_pages") < num(&j, "peak_pages"), "the window keeps the SWA pool smaller: {j}");
    let one = run_json(&["--swa-window", "2", "--page-size", "1", "--shared-prefix-pages", "0"]);
    assert_hybrid_clean(&one, 1);
    let full = run_json(&[]);
    assert_eq!(num(&full, "swa_total_pages") + num(&full, "swa_window_steps") + num(&full, "swa_evict_calls"), 0);
}

#[test]
fn a_full_swa_pool_evicts_and_preempts() {
    // A full pool of 1024 pages beside an SWA pool of 40: the SWA pool runs out first.
    let j =
        run_json(&["--swa-window", "64", "--pool-tokens", "16384", "--swa-pool-tokens", "640", "--branch-rate", "0.3"]);
    assert_hybrid_clean(&j, 16);
    assert_eq!(num(&j, "swa_total_pages"), 40);
    assert!(num(&j, "evictions") > 0 && num(&j, "preempted") > 0, "the SWA pool forced both: {j}");
    assert!(num(&j, "peak_pages") < 200, "the full pool never filled: {j}");
    assert_eq!(num(&j, "turns"), 180, "every preempted turn ran again: {j}");
}

#[test]
fn hybrid_model_with_recurrent_state() {
    for extra in [&[][..], &["--pool-tokens", "16384", "--swa-pool-tokens", "640", "--branch-rate", "0.3"]] {
        let args: Vec<&str> = ["--swa-window", "16", "--mamba"].iter().chain(extra).copied().collect();
        let j = run_json(&args);
        assert_hybrid_clean(&j, 16);
        assert!(num(&j, "mamba_freed_by_libskv") > 0 && num(&j, "mamba_freed_by_engine") > 0, "{args:?}: {j}");
        assert_eq!(
            num(&j, "mamba_allocated"),
            num(&j, "mamba_freed_by_libskv") + num(&j, "mamba_freed_by_engine"),
            "{args:?}: {j}"
        );
        assert_eq!(num(&j, "mamba_leaked"), 0, "{j}");
    }
}

#[test]
fn aligned_reuse_releases_short_sessions() {
    // Histories shorter than a page leave no whole page to reuse: the match releases the slot.
    let j = run_json(&[
        "--aligned-reuse",
        "--prompt-min",
        "1",
        "--prompt-max",
        "8",
        "--max-new-tokens",
        "8",
        "--shared-prefix-pages",
        "0",
    ]);
    assert!(num(&j, "aligned_releases") > 0, "{j}");
    assert_eq!(num(&j, "leaked_pages") + num(&j, "audit_violations"), 0);
}

#[test]
fn mamba_handles_come_back_exactly_once() {
    // Every request holds a pool slot and ping-pong track entries; under memory pressure and
    // aligned reuse every path that frees them runs (finish, abort, preempt, evict, release).
    for extra in [
        &[][..],
        &["--pool-tokens", "1024", "--page-size", "8", "--branch-rate", "0.3"],
        &["--aligned-reuse", "--prompt-min", "1", "--prompt-max", "8", "--shared-prefix-pages", "0"],
    ] {
        let args: Vec<&str> = ["--mamba"].iter().chain(extra).copied().collect();
        let j = run_json(&args);
        assert_eq!(field(&j, "ok"), "true", "{args:?}: {j}");
        let (allocated, by_libskv, by_engine) =
            (num(&j, "mamba_allocated"), num(&j, "mamba_freed_by_libskv"), num(&j, "mamba_freed_by_engine"));
        assert!(by_libskv > 0 && by_engine > 0, "both libskv and the ping-pong step freed handles: {args:?} {j}");
        assert_eq!(allocated, by_libskv + by_engine, "{args:?}: {j}");
        assert_eq!(num(&j, "mamba_leaked") + num(&j, "audit_violations") + num(&j, "leaked_pages"), 0, "{j}");
    }
    let plain = run_json(&[]);
    assert_eq!(num(&plain, "mamba_allocated") + num(&plain, "peak_held_aux_handles"), 0, "{plain}");
}

#[test]
fn page_size_one_and_no_drafts() {
    let j = run_json(&["--page-size", "1", "--draft-len", "0", "--shared-prefix-pages", "0"]);
    assert_eq!(num(&j, "drafted"), 0);
    assert_eq!(num(&j, "tokens_generated"), num(&j, "rounds"));
    assert_eq!(num(&j, "leaked_pages"), 0);
}

#[test]
fn bad_options_exit_2_with_one_line() {
    for args in [
        &["--page-size", "0"][..],
        &["--accept-rate", "1.5"],
        &["--abort-rate", "-0.1"],
        &["--pool-tokens", "256"],
        &["--prompt-min", "50", "--prompt-max", "10"],
        &["--sessions", "0"],
        &["--no-such-option"],
        &["--turns", "many"],
        &["--swa-window", "64", "--swa-pool-tokens", "500"],
        &["--swa-window", "64", "--swa-pool-tokens", "4294967296"],
        &["--swa-window", "64", "--swa-pool-tokens", "lots"],
        &["--swa-pool-tokens", "8192"],
        &["--swa-eviction-interval", "4"],
        &["--swa-fraction", "0.5"],
    ] {
        let out = sim(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{args:?}: one line expected, got {stderr}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
}
