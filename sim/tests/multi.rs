//! The multi-instance run (`--instances N --router ...`, the `router` feature): small fleets
//! whose router, NVIDIA Dynamo's radix tree fed only by libskv's KV events, must agree with
//! every instance at every audit; the KV-aware policy must reuse at least what sticky
//! routing does; a drained instance must end up holding nothing and receiving nothing; with
//! the host tier, the router's device view must leave parked sessions out.

mod common;

use common::{field, num, real, sim};

/// Four instances, memory tight enough to evict, turns long enough to span pages.
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
    "32768",
    "--check-every",
    "10",
    "--seed",
    "3",
];

/// One JSON line per policy, in the order asked; the run must exit 0.
fn run(extra: &[&str]) -> Vec<String> {
    let args: Vec<&str> = FLEET.iter().chain(extra).copied().collect();
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

/// A clean run's router: audited many times, every pair compared agreeing, events flowing,
/// nothing leaked, the tree empty at the end (else the run fails).
fn assert_clean(j: &str) {
    assert_eq!(field(j, "ok"), "true", "{j}");
    assert_eq!(num(j, "turns"), 320, "{j}");
    assert!(num(j, "router_audits") >= 30, "periodic router audits ran: {j}");
    assert!(num(j, "router_compared") >= num(j, "router_audits") * 4, "{j}");
    assert_eq!(num(j, "router_mismatches"), 0, "{j}");
    assert!(num(j, "events") > 0 && num(j, "event_batches") > 4 && real(j, "events_per_sim_sec") > 0.0, "{j}");
    assert_eq!(num(j, "leaked_pages") + num(j, "leaked_rows") + num(j, "audit_violations"), 0, "{j}");
}

#[test]
fn every_policy_keeps_the_routers_view_exact() {
    let lines = run(&["--router", "kv,session,random"]);
    assert_eq!(lines.len(), 3, "one line per policy: {lines:?}");
    for (line, policy) in lines.iter().zip(["kv", "session", "random"]) {
        assert_eq!(field(line, "router"), format!("\"{policy}\""));
        assert_clean(line);
        assert_eq!(num(line, "instances"), 4);
    }
    // The same workload under each policy: the same turns and prompts.
    assert_eq!(num(&lines[0], "prompt_tokens"), num(&lines[1], "prompt_tokens"));
}

#[test]
fn kv_routing_follows_the_sessions_and_random_routing_loses_them() {
    let lines = run(&["--router", "kv,session,random"]);
    let (kv, session, random) = (&lines[0], &lines[1], &lines[2]);
    let hit = |j: &str| real(j, "hit_rate");
    assert!(hit(kv) > 1.5 * hit(random), "kv {} vs random {}", hit(kv), hit(random));
    assert!(hit(session) > 1.5 * hit(random), "session {} vs random {}", hit(session), hit(random));
    assert!(num(random, "moved_slots") > 2 * num(kv, "moved_slots"), "{random}\n{kv}");
    // Dynamo's default cost trades reuse for balance.
    assert!(real(kv, "imbalance") < real(session, "imbalance"), "{kv}\n{session}");
    assert_eq!(num(session, "moved_slots"), 0, "sticky routing never moves a session: {session}");
}

/// Memory tight enough that instances evict, and an overlap credit that values a session's
/// conversation over a block of load: the kv router keeps at least the sticky hit rate (it
/// evicts less, its memory balanced) with a lower load imbalance, in fewer steps.
#[test]
fn kv_routing_keeps_the_sticky_hit_rate_with_less_imbalance() {
    let args = [
        "--json",
        "--instances",
        "4",
        "--sessions",
        "200",
        "--turns",
        "6",
        "--concurrency",
        "64",
        "--batch",
        "16",
        "--prompt-max",
        "256",
        "--max-new-tokens",
        "128",
        "--pool-tokens",
        "32768",
        "--check-every",
        "50",
        "--seed",
        "3",
        "--overlap-credit",
        "16",
        "--router",
        "kv,session",
    ];
    let out = sim(&args);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    let (kv, session) = (lines[0], lines[1]);
    assert_eq!(num(kv, "router_mismatches") + num(session, "router_mismatches"), 0);
    assert!(num(session, "evictions") > 0, "the pool is tight: {session}");
    assert!(real(kv, "hit_rate") >= real(session, "hit_rate"), "{kv}\n{session}");
    assert!(num(kv, "evictions") < num(session, "evictions"), "{kv}\n{session}");
    assert!(real(kv, "imbalance") < real(session, "imbalance"), "{kv}\n{session}");
    assert!(num(kv, "steps") < num(session, "steps"), "{kv}\n{session}");
}

#[test]
fn a_drained_instance_is_left_and_the_router_learns_it() {
    let lines = run(&["--router", "kv,session", "--drain", "1"]);
    for j in &lines {
        assert_clean(j);
        assert_eq!(field(j, "drained"), "1", "{j}");
        let at = num(j, "drained_at_turn");
        assert!((160..200).contains(&at), "drained halfway: {j}");
        assert!(num(j, "drain_rerouted") + num(j, "drain_released_slots") > 0, "instance 1 had work: {j}");
    }
}

#[test]
fn one_instance_is_the_whole_pool() {
    let j = &run(&["--instances", "1", "--router", "kv"])[0];
    assert_clean(j);
    assert_eq!(num(j, "moved_slots"), 0, "{j}");
}

#[test]
fn the_host_tier_behind_every_router_keeps_the_view_exact() {
    // Each instance parks and restores sessions; the router's device tree must never count a
    // parked session's pages (they move to medium CPU), through a drain too.
    let lines =
        run(&["--router", "kv,session,random", "--pool-tokens", "4096", "--host-pool-tokens", "16384", "--drain", "1"]);
    assert_eq!(lines.len(), 3, "one line per policy: {lines:?}");
    for line in &lines {
        assert_clean(line);
        assert_eq!(field(line, "ok_without_tier"), "true", "{line}");
        assert!(num(line, "unparks_with_tier") > 0, "sessions were restored: {line}");
        assert!(num(line, "hits_with_tier") > num(line, "hits_without_tier"), "{line}");
    }
}

#[test]
fn bad_fleet_options_exit_2() {
    for (args, needle) in [
        (&["--instances", "0"][..], "--instances 0"),
        (&["--instances", "4", "--batch", "2"][..], "--batch 2"),
        (&["--instances", "2", "--drain", "2"][..], "--drain 2"),
        (&["--drain", "0"][..], "--drain 0"),
        (&["--router", "best"][..], "best"),
        (&["--instances", "2", "--step-ms", "0"][..], "--step-ms"),
        (&["--instances", "2", "--overlap-credit=-1"][..], "--overlap-credit"),
    ] {
        let out = sim(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(needle) && err.lines().count() == 1, "{args:?}: {err}");
    }
}
