//! Coverage as function × status: how often each export returned each status, the statuses
//! each export documents (`DOCUMENTED`), and the checks of one against the other.

use std::collections::{BTreeMap, BTreeSet};

use skv::skv_status;

/// (export, status name as `skv_status_str` gives it) -> calls. Only calls the fuzzer made and
/// checked (`World::call`) count; the helpers' own calls (snapshots, the audit) do not.
pub type Coverage = BTreeMap<(&'static str, &'static str), u64>;

/// Every export of the dlopen table, as `src/capi/api.list` pins them.
fn exports() -> &'static [&'static str] {
    static LIST: std::sync::OnceLock<Vec<&'static str>> = std::sync::OnceLock::new();
    LIST.get_or_init(|| {
        include_str!("../../src/capi/api.list")
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .collect()
    })
}

/// The export a call's description names (`skv_alloc_extend_batch(...)` ->
/// `skv_alloc_extend_batch`); `None` for the fuzzer's own steps (teardown, engine moves).
pub fn export_of(desc: &str) -> Option<&'static str> {
    let name = desc.split('(').next()?.trim();
    exports().iter().copied().find(|&e| e == name)
}

/// The status names, in code order.
pub const STATUSES: [&str; 11] = [
    "SKV_OK",
    "SKV_ERR_NULL_ARG",
    "SKV_ERR_INVALID_ARG",
    "SKV_ERR_OUT_OF_MEMORY",
    "SKV_ERR_NOT_FOUND",
    "SKV_ERR_STATE",
    "SKV_ERR_CALLBACK",
    "SKV_ERR_CUDA",
    "SKV_ERR_UNSUPPORTED",
    "SKV_ERR_INTERNAL",
    "SKV_ERR_BUFFER",
];

pub fn record(cov: &mut Coverage, desc: &str, st: skv_status) {
    if let Some(f) = export_of(desc) {
        *cov.entry((f, st.name())).or_default() += 1;
    }
}

/// The table: one row per export called, one column per status reached by any.
pub fn table(cov: &Coverage) -> String {
    let fns: BTreeSet<&str> = cov.keys().map(|k| k.0).collect();
    let cols: Vec<&str> = STATUSES.iter().copied().filter(|s| cov.keys().any(|k| k.1 == *s)).collect();
    let short = |s: &str| s.trim_start_matches("SKV_ERR_").trim_start_matches("SKV_").to_string();
    let w = fns.iter().map(|f| f.len()).max().unwrap_or(8);
    let mut out = format!("{:w$}", "function");
    for c in &cols {
        out += &format!(" {:>13}", short(c));
    }
    for f in fns {
        out += &format!("\n{f:w$}");
        for c in &cols {
            match cov.get(&(f, *c)) {
                Some(n) => out += &format!(" {n:>13}"),
                None => out += &format!(" {:>13}", "-"),
            }
        }
    }
    out
}

/// The host refusing memory: the fuzzer never exhausts it (a configuration big enough to fail
/// would be allocated for real on a host that has the memory).
const HOST: &str = "the host refusing memory";
/// docs/refusals.md, "The frees" 1 and 2, through a slot's record rather than a req: a slot
/// keeping a window cursor past its own swa_dead_lo without free_kv_segment (a finish now
/// refuses to save one; only an in-flight slot's abort meets it), or one inside a page with
/// free_kv_segment (an engine moving its cursor other than by skv_swa_evict, which the
/// fuzzer's engines never do).
const SLOT_CURSOR: &str = "a slot's record holding a cursor no release can split";

/// Documented refusals the fuzzer does not reach, each with why: every other one must be
/// reached by a long run (`check`).
pub const UNREACHABLE: &[(&str, &str, &str)] = &[
    ("skv_cache_new", "SKV_ERR_OUT_OF_MEMORY", HOST),
    ("skv_cache_new_external", "SKV_ERR_OUT_OF_MEMORY", HOST),
    ("skv_match_prefix", "SKV_ERR_OUT_OF_MEMORY", HOST),
    ("skv_cache_finished_req", "SKV_ERR_OUT_OF_MEMORY", HOST),
    ("skv_release_session", "SKV_ERR_OUT_OF_MEMORY", HOST),
    ("skv_release_branch", "SKV_ERR_OUT_OF_MEMORY", HOST),
    ("skv_free_aligned", "SKV_ERR_OUT_OF_MEMORY", HOST),
    ("skv_trim_overshoot", "SKV_ERR_OUT_OF_MEMORY", HOST),
    ("skv_free_tail", "SKV_ERR_OUT_OF_MEMORY", HOST),
    ("skv_swa_evict", "SKV_ERR_OUT_OF_MEMORY", HOST),
    ("skv_page_refs", "SKV_ERR_OUT_OF_MEMORY", HOST),
    ("skv_cache_check", "SKV_ERR_OUT_OF_MEMORY", HOST),
    ("skv_idle_sessions", "SKV_ERR_OUT_OF_MEMORY", HOST),
    ("skv_device_attach", "SKV_ERR_OUT_OF_MEMORY", HOST),
    ("skv_match_prefix_tier", "SKV_ERR_OUT_OF_MEMORY", HOST),
    ("skv_ticket_done", "SKV_ERR_OUT_OF_MEMORY", HOST),
    ("skv_tier_step", "SKV_ERR_OUT_OF_MEMORY", HOST),
    ("skv_tier_evict", "SKV_ERR_OUT_OF_MEMORY", HOST),
    // Completing a ticket frees through callbacks only for a failed import's release; the C
    // API has no import call yet (an owned park frees no engine state).
    ("skv_ticket_done", "SKV_ERR_CALLBACK", IMPORT),
    ("skv_ticket_done", "SKV_ERR_UNSUPPORTED", IMPORT),
    ("skv_match_prefix", "SKV_ERR_UNSUPPORTED", SLOT_CURSOR),
    ("skv_release_session", "SKV_ERR_UNSUPPORTED", SLOT_CURSOR),
    ("skv_release_branch", "SKV_ERR_UNSUPPORTED", SLOT_CURSOR),
    ("skv_free_aligned", "SKV_ERR_UNSUPPORTED", SLOT_CURSOR),
    ("skv_release_session", "SKV_ERR_INVALID_ARG", SLOT_CURSOR),
    ("skv_release_branch", "SKV_ERR_INVALID_ARG", SLOT_CURSOR),
    // The fuzzer attaches no device: without the cuda feature every attach is UNSUPPORTED,
    // with it the host may have no GPU.
    ("skv_device_attach", "SKV_OK", "a device copy"),
    ("skv_device_attach", "SKV_ERR_CUDA", "a device copy"),
    ("skv_device_sync", "SKV_OK", "a device copy"),
    ("skv_device_sync", "SKV_ERR_CUDA", "a device copy"),
    // device_ordinal < 0 is checked after the build's UNSUPPORTED; a misaligned handle is read
    // before it is checked (the trace check every export makes), so it is not probed.
    ("skv_device_attach", "SKV_ERR_INVALID_ARG", "a device copy"),
    // The fuzzer drives the events calls only with a NULL handle and from inside callbacks
    // (`every`), in the default build: EVENTS and WITHOUT_EVENTS say what drives the rest.
    ("skv_events_enable", "SKV_OK", EVENTS),
    ("skv_events_enable", "SKV_ERR_INVALID_ARG", EVENTS),
    ("skv_events_enable", "SKV_ERR_UNSUPPORTED", EVENTS),
    ("skv_events_enable", "SKV_ERR_OUT_OF_MEMORY", HOST),
    ("skv_events_session", "SKV_OK", EVENTS),
    ("skv_events_session", "SKV_ERR_INVALID_ARG", EVENTS),
    ("skv_events_session", "SKV_ERR_UNSUPPORTED", WITHOUT_EVENTS),
    ("skv_events_tokens", "SKV_OK", EVENTS),
    ("skv_events_tokens", "SKV_ERR_INVALID_ARG", EVENTS),
    ("skv_events_tokens", "SKV_ERR_NOT_FOUND", EVENTS),
    ("skv_events_tokens", "SKV_ERR_UNSUPPORTED", WITHOUT_EVENTS),
    ("skv_events_drain", "SKV_OK", EVENTS),
    ("skv_events_drain", "SKV_ERR_INVALID_ARG", EVENTS),
    ("skv_events_drain", "SKV_ERR_UNSUPPORTED", WITHOUT_EVENTS),
    ("skv_events_drain", "SKV_ERR_BUFFER", EVENTS),
];

/// skv_ticket_done's refusals from the frees a failed import's release runs.
const IMPORT: &str = "the release of a failed import (no import call in the C API)";
/// Why the fuzzer reaches only NULL_ARG and STATE of the events calls: the rest need events
/// on, and tests/events_session.rs drives each of them (its refusal tests: tokens' NOT_FOUND
/// and drain's INVALID_ARG among them).
const EVENTS: &str = "the events calls, driven by tests/events_session.rs";
/// UNSUPPORTED of a live handle outside a callback in a build without the `events` feature,
/// the fuzzer's build, whose events calls the handle checks refuse first (enable's also comes
/// from an endpoint without `zmq`: EVENTS). ctests/test_doc_events.c drives all three in
/// the default build.
const WITHOUT_EVENTS: &str = "a build without the events feature, past the handle checks";

/// Pairs a run of 100,000 calls does not reliably reach (a seed in twenty or so misses each;
/// the long runs reach them all): a free callback failing inside a call that frees little
/// (an engine fails 0, 5 or 30 callbacks in 1000), a pool or batch running out of pages, a
/// publish or window step on a row not in use, and an abort whose release cannot split at its cursor without
/// free_kv_segment (`World::grown_protected`). Found by running the short run on 120 seeds.
pub const RARE: &[(&str, &str)] = &[
    ("skv_swa_evict", "SKV_ERR_CALLBACK"),
    ("skv_match_prefix", "SKV_ERR_CALLBACK"),
    ("skv_free_tail", "SKV_ERR_CALLBACK"),
    ("skv_free_aligned", "SKV_ERR_CALLBACK"),
    ("skv_release_branch", "SKV_ERR_CALLBACK"),
    ("skv_release_session", "SKV_ERR_CALLBACK"),
    ("skv_pool_alloc", "SKV_ERR_OUT_OF_MEMORY"),
    ("skv_alloc_extend_batch", "SKV_ERR_OUT_OF_MEMORY"),
    ("skv_publish_prefix", "SKV_ERR_NOT_FOUND"),
    ("skv_swa_evict", "SKV_ERR_NOT_FOUND"),
    ("skv_cache_finished_req", "SKV_ERR_UNSUPPORTED"),
];

/// Exports that return no status (or nothing): the fuzzer calls them outside `World::call`.
pub const NO_STATUS: &[&str] =
    &["skv_status_str", "skv_last_error", "skv_abi_version", "skv_version", "skv_cache_free", "skv_get_api"];

/// What each export documents it refuses with besides SKV_OK: its `refuses:` line in
/// include/skv.h (SKV_ERR_INTERNAL, a libskv bug, is on no line).
pub fn documented(f: &str) -> Option<BTreeSet<String>> {
    static LINES: std::sync::OnceLock<crate::common::refusals::Refusals> = std::sync::OnceLock::new();
    LINES.get_or_init(crate::common::refusals::header_refusals).get(f).cloned()
}

/// Checks the run's coverage: every status an export returned is one it documents (or OK);
/// every export the fuzzer drove reached OK and each documented refusal but those in
/// `UNREACHABLE` (and, for a short run, `RARE`). Returns the failures, one a line.
pub fn check(cov: &Coverage, short: bool) -> Vec<String> {
    let mut bad = Vec::new();
    let fns: BTreeSet<&str> = cov.keys().map(|k| k.0).collect();
    for f in exports().iter().copied().filter(|f| !fns.contains(f) && !NO_STATUS.contains(f)) {
        bad.push(format!("{f} was never called"));
    }
    for (f, st, _) in UNREACHABLE.iter().filter(|u| cov.contains_key(&(u.0, u.1))) {
        bad.push(format!("{f} returned {st}, listed as unreachable"));
    }
    for f in exports().iter().copied().filter(|f| fns.contains(f)) {
        let Some(doc) = documented(f) else {
            bad.push(format!("{f}: called, but no documented refusals are listed for it"));
            continue;
        };
        for (_, st) in cov.keys().filter(|k| k.0 == f) {
            if *st != "SKV_OK" && !doc.contains(*st) {
                bad.push(format!("{f} returned {st}, which it does not document"));
            }
        }
        for st in std::iter::once("SKV_OK").chain(doc.iter().map(String::as_str)) {
            let exempt = UNREACHABLE.iter().any(|u| (u.0, u.1) == (f, st)) || (short && RARE.contains(&(f, st)));
            if !exempt && !cov.contains_key(&(f, st)) {
                bad.push(format!("{f} never returned {st}"));
            }
        }
    }
    bad
}
