//! Sessions that move between instances (`--migrate`, the `router` feature): moves start at
//! the pool-use threshold and off a drained instance, every audit stays clean (libskv's
//! checks, the slot counts against the engine's mirror with imports in flight, the router's
//! view, which must hold a moving session on both sides), the report's figures agree with
//! each other and with the modelled link, a refused move leaves the session where it was, and
//! without `--migrate` nothing moves.

mod common;

use common::{field, num, real, sim};

/// Four instances of 96 pages each: idle sessions fill them past the default threshold.
const FLEET: &[&str] = &[
    "--json",
    "--instances",
    "4",
    "--sessions",
    "80",
    "--turns",
    "4",
    "--concurrency",
    "24",
    "--batch",
    "8",
    "--prompt-max",
    "96",
    "--max-new-tokens",
    "48",
    "--pool-tokens",
    "6144",
    "--check-every",
    "10",
    "--seed",
    "3",
];

/// One JSON line per policy; the run must exit 0.
fn run(fleet: &[&str], extra: &[&str]) -> Vec<String> {
    let args: Vec<&str> = fleet.iter().chain(extra).copied().collect();
    let out = sim(&args);
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "skv-sim {args:?} failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout.lines().map(str::to_string).collect()
}

/// Every check of the run passed: libskv's audits, the router's, nothing leaked.
fn assert_clean(j: &str) {
    assert_eq!(field(j, "ok"), "true", "{j}");
    assert_eq!(num(j, "turns"), 320, "{j}");
    assert!(num(j, "audits") >= 30 && num(j, "router_audits") >= 30, "periodic audits ran: {j}");
    assert_eq!(num(j, "router_mismatches") + num(j, "audit_violations"), 0, "{j}");
    assert_eq!(num(j, "leaked_pages") + num(j, "leaked_rows") + num(j, "leaked_swa_pages"), 0, "{j}");
    assert_eq!(num(j, "mamba_leaked"), 0, "{j}");
}

#[test]
fn moves_start_at_the_threshold_and_the_audits_stay_clean() {
    let lines = run(FLEET, &["--router", "kv,session,random", "--migrate"]);
    assert_eq!(lines.len(), 3, "one line per policy: {lines:?}");
    for j in &lines {
        assert_clean(j);
        assert_eq!(field(j, "migrate"), "true", "{j}");
        assert!(num(j, "migrations") >= 10, "full instances hand sessions over: {j}");
        assert_eq!(num(j, "drain_migrations"), 0, "no drain: {j}");
        // The router saw each moved session on its destination once the import stored it, and
        // again after the source's removal (the sim fails the run at a moment it did not).
        let (moves, seen) = (num(j, "migrations"), num(j, "migrate_event_checks"));
        assert!(seen >= moves && seen <= 2 * moves, "{j}");
        // The moved branch's next turn follows its KV: nearly all hit there (a few are evicted
        // before their turn, on an instance under pressure too).
        assert!(num(j, "hits_after_migration") * 10 >= num(j, "turns_after_migration") * 8, "{j}");
    }
    // A lower threshold moves more; the highest only when an instance is full.
    let low = run(FLEET, &["--router", "session", "--migrate", "--migrate-threshold", "0.5"]);
    let high = run(FLEET, &["--router", "session", "--migrate", "--migrate-threshold", "1"]);
    assert_clean(&low[0]);
    assert_clean(&high[0]);
    let (l, d, h) = (num(&low[0], "migrations"), num(&lines[1], "migrations"), num(&high[0], "migrations"));
    assert!(l > d && d > h, "threshold 0.5: {l}, 0.9: {d}, 1: {h} moves");
}

#[test]
fn the_report_adds_up() {
    let lines = run(FLEET, &["--router", "kv,session,random", "--migrate"]);
    let slow = run(FLEET, &["--router", "kv,session,random", "--migrate", "--link-gbps", "25"]);
    for (j, s) in lines.iter().zip(&slow) {
        let (moves, pages, tokens) = (num(j, "migrations"), num(j, "migrated_pages"), num(j, "migrated_tokens"));
        // A page is 16 tokens of 131,072 bytes (the defaults).
        assert_eq!(num(j, "migrated_bytes"), pages * 16 * 131_072, "{j}");
        // Full attention, a page-aligned prefix: each unit carries its committed tokens past the
        // prefix in whole pages, the last one partial at most.
        assert!(pages * 16 >= tokens && (pages - moves) * 16 < tokens, "{moves} moves, {pages} pages, {tokens} tokens");
        let want_transfer = num(j, "migrated_bytes") as f64 / 50e9;
        assert!((real(j, "migrate_transfer_s") - want_transfer).abs() < 1e-5, "{j}");
        // The prefill saved: the tokens past the shared prompt, which each destination's tree holds.
        let saved = num(j, "migrate_saved_tokens");
        assert!(saved <= tokens && saved + 64 * moves >= tokens, "{j}");
        assert!((real(j, "migrate_recompute_s") - saved as f64 / 20_000.0).abs() < 1e-5, "{j}");
        assert!(real(j, "migrate_transfer_s") < real(j, "migrate_recompute_s"), "moving beats prefilling: {j}");
        let (after, hits) = (num(j, "turns_after_migration"), num(j, "hits_after_migration"));
        assert!(hits <= after && after <= moves, "{j}");
        assert!((real(j, "hit_rate_after_migration") - hits as f64 / after as f64).abs() < 1e-5, "{j}");
        // Half the bandwidth: the same moves (each still within a step), twice the time.
        assert_clean(s);
        assert_eq!(num(s, "migrated_bytes"), num(j, "migrated_bytes"), "{s}");
        assert!((real(s, "migrate_transfer_s") - 2.0 * want_transfer).abs() < 1e-5, "{s}");
    }
}

#[test]
fn a_drained_instance_hands_its_idle_sessions_over() {
    // The roomy fleet of tests/multi.rs: the drained instance holds idle sessions to hand on.
    let roomy: Vec<&str> = FLEET.iter().map(|&a| if a == "6144" { "32768" } else { a }).collect();
    let moved = run(&roomy, &["--router", "kv,session", "--drain", "1", "--migrate"]);
    let released = run(&roomy, &["--router", "kv,session", "--drain", "1"]);
    for (m, r) in moved.iter().zip(&released) {
        assert_clean(m);
        assert!(num(m, "drain_migrations") > 0, "{m}");
        assert_eq!(num(m, "drain_released_slots"), 0, "moved, not released: {m}");
        assert!(num(r, "drain_released_slots") > 0, "{r}");
        assert_eq!(num(r, "migrations"), 0, "{r}");
    }
}

#[test]
fn a_refused_move_keeps_the_session() {
    // Two instances of 128 pages; the drained one's sessions can only go to the other, full
    // one. At each refusal the sim checks with skv_session_where that the slot is still whole
    // and idle at the source and absent at the destination (the run fails otherwise).
    let pair = [
        "--json",
        "--instances",
        "2",
        "--sessions",
        "60",
        "--turns",
        "4",
        "--concurrency",
        "24",
        "--batch",
        "8",
        "--prompt-max",
        "96",
        "--max-new-tokens",
        "48",
        "--pool-tokens",
        "4096",
        "--check-every",
        "10",
        "--seed",
        "4",
    ];
    let lines = run(&pair, &["--router", "kv,session", "--drain", "1", "--migrate"]);
    for j in &lines {
        assert_eq!(field(j, "ok"), "true", "{j}");
        assert_eq!(num(j, "router_mismatches") + num(j, "leaked_pages") + num(j, "leaked_rows"), 0, "{j}");
        assert!(num(j, "migrations_refused") > 0, "the full instance refused some: {j}");
        assert!(num(j, "migrations") > 0, "{j}");
    }
}

#[test]
fn hybrid_models_and_recurrent_state_move_too() {
    // SWA pages travel beside the full ones; each recurrent-state handle is the destination's
    // own and every one comes back exactly once.
    let lines = run(FLEET, &["--router", "kv,session", "--migrate", "--swa-window", "64", "--mamba", "--drain", "2"]);
    for j in &lines {
        assert_clean(j);
        assert!(num(j, "migrations") > 0, "{j}");
        assert!(
            num(j, "migrated_pages") * 16 > num(j, "migrated_tokens") + 16 * num(j, "migrations"),
            "SWA pages: {j}"
        );
        assert!(num(j, "mamba_allocated") > 0, "{j}");
    }
}

#[test]
fn without_migrate_nothing_moves() {
    for j in &run(FLEET, &["--router", "kv,session,random", "--drain", "1"]) {
        assert_clean(j);
        assert_eq!(field(j, "migrate"), "false", "{j}");
        for key in [
            "migrations",
            "migrations_refused",
            "migrated_pages",
            "migrated_bytes",
            "turns_after_migration",
            "migrate_event_checks",
        ] {
            assert_eq!(num(j, key), 0, "{key}: {j}");
        }
    }
}

#[test]
fn bad_migrate_options_exit_2() {
    for (args, needle) in [
        (&["--migrate"][..], "--migrate"),
        (&["--instances", "1", "--router", "kv", "--migrate"][..], "--instances 1"),
        (&["--instances", "2", "--migrate", "--migrate-threshold", "0"][..], "--migrate-threshold 0"),
        (&["--instances", "2", "--migrate", "--migrate-threshold", "1.5"][..], "--migrate-threshold 1.5"),
        (&["--instances", "2", "--migrate", "--link-gbps", "0"][..], "--link-gbps 0"),
        (&["--instances", "2", "--migrate", "--host-pool-tokens", "8192"][..], "--host-pool-tokens 8192"),
    ] {
        let out = sim(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(needle) && err.lines().count() == 1, "{args:?}: {err}");
    }
}
