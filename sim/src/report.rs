//! The end-of-run summary: a table for people, one flat JSON object for scripts.

use std::fmt::Write;

use crate::cli::Config;
use crate::engine::Metrics;
use crate::ffi::OPS;

/// One run's results: its metrics, latencies and fault.
pub struct Run {
    pub m: Metrics,
    pub lat: Vec<Latency>,
    pub fault: Option<String>,
}

/// Turns whose match reused the session's KV, of all turns started.
pub fn hit_rate(m: &Metrics) -> f64 {
    m.hits as f64 / (m.hits + m.misses).max(1) as f64
}

/// Prompt tokens not recomputed, of all prompt tokens.
pub fn reuse_rate(m: &Metrics) -> f64 {
    1.0 - m.prefilled as f64 / m.prompt_tokens.max(1) as f64
}

/// The run's simulated duration: its steps, `--step-ms` each.
#[cfg(feature = "router")]
pub fn sim_secs(cfg: &Config, m: &Metrics) -> f64 {
    m.router.steps as f64 * cfg.args.step_ms / 1000.0
}

/// Events the router received per simulated second.
#[cfg(feature = "router")]
pub fn events_per_sim_sec(cfg: &Config, m: &Metrics) -> f64 {
    m.router.events as f64 / sim_secs(cfg, m).max(1e-9)
}

/// The multi-instance summary: one row per routing policy, then each run's checks.
#[cfg(feature = "router")]
pub fn fleet_table(cfg: &Config, runs: &[Run]) -> String {
    let a = &cfg.args;
    let mut t = String::new();
    let _ = writeln!(
        t,
        "skv-sim: {} sessions x {} turns, {} open, {} instance(s) of {} pages and batch {} each, page {}, draft {}, accept {}, seed {}",
        a.sessions, a.turns, a.concurrency, a.instances, cfg.instance_pages, cfg.instance_batch, a.page_size, a.draft_len,
        a.accept_rate, a.seed
    );
    let _ = writeln!(
        t,
        "  {:<9}{:>9}{:>9}{:>13}{:>11}{:>9}{:>14}{:>8}   router audit",
        "router", "hit rate", "reused", "prefilled", "imbalance", "sim s", "events/sim s", "moved"
    );
    for r in runs {
        let (m, rm) = (&r.m, &r.m.router);
        let _ = writeln!(
            t,
            "  {:<9}{:>8.2}%{:>8.2}%{:>13}{:>11.3}{:>9.1}{:>14.0}{:>8}   {} of {} differ ({} audits)",
            rm.policy,
            100.0 * hit_rate(m),
            100.0 * reuse_rate(m),
            m.prefilled,
            rm.imbalance(),
            sim_secs(cfg, m),
            events_per_sim_sec(cfg, m),
            m.moved_slots,
            rm.mismatches,
            rm.compared,
            rm.audits
        );
    }
    if let Some(k) = a.drain {
        for r in runs {
            let rm = &r.m.router;
            let _ = writeln!(
                t,
                "  {:<9}drained instance {k} at turn {}: {} turns routed again, {} idle slots released",
                rm.policy, rm.drained_at_turn, rm.drain_rerouted, rm.drain_released_slots
            );
        }
    }
    if a.migrate {
        for r in runs {
            let _ = writeln!(t, "  {:<9}{}", r.m.router.policy, migrate_line(cfg, &r.m));
        }
    }
    for r in runs {
        let m = &r.m;
        let verdict = match &r.fault {
            None => "OK".to_string(),
            Some(f) => format!("FAIL: {f}"),
        };
        let _ = writeln!(
            t,
            "  {:<9}{} turns, {} events in {} batches ({} bytes), {} checks, {} violations; leaked pages {}, rows {}: {verdict}",
            m.router.policy,
            m.turns,
            m.router.events,
            m.router.batches,
            m.router.event_bytes,
            m.audits,
            m.violations,
            m.leaked_pages,
            m.leaked_rows
        );
    }
    t
}

/// `--migrate`: the moves, their bytes against the prefill they saved, and the next turns.
#[cfg(feature = "router")]
fn migrate_line(cfg: &Config, m: &Metrics) -> String {
    let (a, mm) = (&cfg.args, &m.migrate);
    format!(
        "migrated {} sessions ({} off the drained instance; refused {} for room): {} pages, {:.3} GB; transfer {:.3} s at {} GB/s vs prefill {:.3} s of {} tokens at {} tokens/s; next turns {} of {} hit where they moved ({:.2}%)",
        mm.migrations,
        mm.drain_migrations,
        mm.refused,
        mm.pages,
        mm.bytes as f64 / 1e9,
        mm.transfer_s,
        a.link_gbps,
        mm.recompute_s,
        mm.saved_tokens,
        a.prefill_tokens_per_s,
        mm.next_hits,
        mm.next_turns,
        100.0 * mm.hit_rate_after()
    )
}

pub struct Latency {
    pub name: &'static str,
    pub calls: usize,
    pub p50: u32,
    pub p99: u32,
    pub max: u32,
}

pub fn latencies(samples: &mut [Vec<u32>]) -> Vec<Latency> {
    OPS.iter()
        .zip(samples.iter_mut())
        .map(|(&(_, name), s)| {
            s.sort_unstable();
            let at = |q: usize| if s.is_empty() { 0 } else { s[(s.len() - 1) * q / 100] };
            Latency { name, calls: s.len(), p50: at(50), p99: at(99), max: s.last().copied().unwrap_or(0) }
        })
        .collect()
}

/// Request operations: a single call serves one request, a batch call every request it names.
fn request_ops(m: &Metrics, lat: &[Latency]) -> u64 {
    let single: usize = lat.iter().filter(|l| !l.name.ends_with("_batch")).map(|l| l.calls).sum();
    single as u64 + m.batched_requests
}

fn calls_per_sec(m: &Metrics, lat: &[Latency]) -> (usize, f64) {
    let calls: usize = lat.iter().map(|l| l.calls).sum();
    (calls, calls as f64 / m.elapsed.as_secs_f64().max(1e-9))
}

pub fn bench_line(m: &Metrics, lat: &[Latency]) -> String {
    let (calls, rate) = calls_per_sec(m, lat);
    let ops = request_ops(m, lat) as f64 / m.elapsed.as_secs_f64().max(1e-9);
    format!(
        "skv-sim: {} turns, {calls} calls in {:.3} s ({rate:.0} calls/s, {ops:.0} request ops/s)",
        m.turns,
        m.elapsed.as_secs_f64()
    )
}

pub fn table(cfg: &Config, m: &Metrics, lat: &[Latency], fault: Option<&str>) -> String {
    let a = &cfg.args;
    let (calls, rate) = calls_per_sec(m, lat);
    let pct = |x: u64, of: u64| if of == 0 { 0.0 } else { 100.0 * x as f64 / of as f64 };
    let mut t = String::new();
    let _ = writeln!(
        t,
        "skv-sim: {} sessions x {} turns, {} open, batch {}, page {}, draft {}, accept {}, pool {} pages, seed {}",
        a.sessions, a.turns, a.concurrency, a.batch, a.page_size, a.draft_len, a.accept_rate, cfg.total_pages, a.seed
    );
    if a.swa_window > 0 {
        let _ = writeln!(
            t,
            "  hybrid model: sliding window {} tokens, SWA pool {} pages, eviction interval {}",
            a.swa_window, cfg.swa_total_pages, a.swa_eviction_interval
        );
    }
    let mut row = |k: &str, v: String| {
        let _ = writeln!(t, "  {k:<22}{v}");
    };
    row(
        "turns",
        format!(
            "{:>10}   aborted {}, preempted {}, retried {}, hits {}, misses {}",
            m.turns, m.aborted, m.preempted, m.retried, m.hits, m.misses
        ),
    );
    row(
        "sessions closed",
        format!(
            "{:>10}   branches forked {}, idle branches evicted {}, aligned-reuse releases {}",
            m.sessions_closed, m.branches, m.evictions, m.aligned_releases
        ),
    );
    row(
        "tokens generated",
        format!(
            "{:>10}   kept {} ({} verify rounds, {:.1}% of drafts accepted)",
            m.generated,
            m.kept,
            m.rounds,
            pct(m.accepted, m.drafted)
        ),
    );
    row("tokens prefilled", format!("{:>10}", m.prefilled));
    row("trimmed by overshoot", format!("{:>10}   tokens (skv_cache_stats.trimmed_tokens)", m.trimmed_tokens));
    row("tail-freed", format!("{:>10}   tokens (match after a retry or retraction)", m.tail_freed_tokens));
    row(
        "pages freed",
        format!(
            "{:>10}   trim {}, abort {}, release {}, evict {}, match tail {}",
            m.freed_trim + m.freed_abort + m.freed_release + m.freed_evict + m.freed_tail,
            m.freed_trim,
            m.freed_abort,
            m.freed_release,
            m.freed_evict,
            m.freed_tail
        ),
    );
    row(
        "peak pages held",
        format!(
            "{:>10}   of {} ({:.1}%)",
            m.peak_used_pages,
            cfg.total_pages - 1,
            pct(m.peak_used_pages, cfg.total_pages - 1)
        ),
    );
    if a.swa_window > 0 {
        let swa = cfg.swa_total_pages - 1;
        row(
            "peak SWA pages held",
            format!("{:>10}   of {} ({:.1}%)", m.peak_used_swa_pages, swa, pct(m.peak_used_swa_pages, swa)),
        );
        row(
            "SWA pages freed",
            format!(
                "{:>10}   by {} window steps ({} positions); the rest came back with their full pages",
                m.swa_freed_pages, m.swa_window_steps, m.swa_freed_positions
            ),
        );
    }
    row(
        "session-held peak",
        format!(
            "{:>10}   tokens (swa {}), {} idle rows (skv_session_held at audits)",
            m.peak_held_tokens, m.peak_held_swa_tokens, m.peak_held_rows
        ),
    );
    if a.mamba {
        row(
            "mamba handles",
            format!(
                "{:>10}   allocated; freed by libskv {}, by the engine {}; leaked {}; idle-held peak {}",
                m.mamba_allocated,
                m.mamba_freed_by_libskv,
                m.mamba_freed_by_engine,
                m.mamba_leaked,
                m.peak_held_aux_handles
            ),
        );
    }
    row("calls", format!("{:>10}   in {:.3} s = {:.0} calls/s", calls, m.elapsed.as_secs_f64(), rate));
    let ops = request_ops(m, lat);
    row(
        "request ops",
        format!("{:>10}   = {:.0} ops/s (a batch call counts each request)", ops, ops as f64 / m.elapsed.as_secs_f64()),
    );
    let _ = writeln!(t, "  {:<18}{:>10}{:>9}{:>9}{:>10}", "latency (ns)", "calls", "p50", "p99", "max");
    for l in lat.iter().filter(|l| l.calls > 0) {
        let _ = writeln!(t, "    {:<16}{:>10}{:>9}{:>9}{:>10}", l.name, l.calls, l.p50, l.p99, l.max);
    }
    let verdict = match fault {
        None => "OK".to_string(),
        Some(f) => format!("FAIL: {f}"),
    };
    let swa_leak = if a.swa_window > 0 { format!(", SWA pages {}", m.leaked_swa_pages) } else { String::new() };
    let _ = writeln!(
        t,
        "  {:<22}{} checks, {} violations; prefix locks {}/{} returned; leaked pages {}{swa_leak}, rows {}: {verdict}",
        "audit", m.audits, m.violations, m.locks_returned, m.locks_taken, m.leaked_pages, m.leaked_rows
    );
    t
}

/// One flat object; numbers only, plus `ok` and the fault text.
pub fn json(cfg: &Config, m: &Metrics, lat: &[Latency], fault: Option<&str>) -> String {
    let (calls, rate) = calls_per_sec(m, lat);
    let mut fields: Vec<(String, String)> = [
        ("sessions", cfg.args.sessions),
        ("turns", m.turns),
        ("aborted", m.aborted),
        ("preempted", m.preempted),
        ("retried", m.retried),
        ("hits", m.hits),
        ("misses", m.misses),
        ("branches", m.branches),
        ("evictions", m.evictions),
        ("aligned_releases", m.aligned_releases),
        ("sessions_closed", m.sessions_closed),
        ("rounds", m.rounds),
        ("drafted", m.drafted),
        ("accepted", m.accepted),
        ("tokens_generated", m.generated),
        ("tokens_kept", m.kept),
        ("tokens_prefilled", m.prefilled),
        ("trimmed_tokens", m.trimmed_tokens),
        ("tail_freed_tokens", m.tail_freed_tokens),
        ("pages_freed_trim", m.freed_trim),
        ("pages_freed_abort", m.freed_abort),
        ("pages_freed_release", m.freed_release),
        ("pages_freed_evict", m.freed_evict),
        ("pages_freed_tail", m.freed_tail),
        ("total_pages", m.total_pages),
        ("peak_pages", m.peak_used_pages),
        ("swa_window", cfg.args.swa_window as u64),
        ("swa_total_pages", m.swa_total_pages),
        ("peak_swa_pages", m.peak_used_swa_pages),
        ("swa_window_steps", m.swa_window_steps),
        ("swa_freed_positions", m.swa_freed_positions),
        ("swa_pages_freed_window", m.swa_freed_pages),
        ("peak_held_tokens", m.peak_held_tokens),
        ("peak_held_swa_tokens", m.peak_held_swa_tokens),
        ("peak_held_rows", m.peak_held_rows),
        ("audits", m.audits),
        ("audit_violations", m.violations),
        ("locks_taken", m.locks_taken),
        ("locks_returned", m.locks_returned),
        ("leaked_pages", m.leaked_pages),
        ("leaked_swa_pages", m.leaked_swa_pages),
        ("leaked_rows", m.leaked_rows),
        ("mamba_allocated", m.mamba_allocated),
        ("mamba_freed_by_libskv", m.mamba_freed_by_libskv),
        ("mamba_freed_by_engine", m.mamba_freed_by_engine),
        ("mamba_leaked", m.mamba_leaked),
        ("peak_held_aux_handles", m.peak_held_aux_handles),
        ("calls", calls as u64),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    fields.push(("elapsed_s".into(), format!("{:.6}", m.elapsed.as_secs_f64())));
    fields.push(("calls_per_sec".into(), format!("{rate:.0}")));
    let ops = request_ops(m, lat);
    fields.push(("request_ops".into(), ops.to_string()));
    fields.push(("request_ops_per_sec".into(), format!("{:.0}", ops as f64 / m.elapsed.as_secs_f64().max(1e-9))));
    for l in lat {
        fields.push((format!("{}_calls", l.name), l.calls.to_string()));
        fields.push((format!("{}_p50_ns", l.name), l.p50.to_string()));
        fields.push((format!("{}_p99_ns", l.name), l.p99.to_string()));
    }
    #[cfg(feature = "router")]
    if cfg.multi {
        let rm = &m.router;
        fields.push(("router".into(), format!("\"{}\"", rm.policy)));
        for (k, v) in [
            ("instances", rm.instances as u64),
            ("instance_pages", cfg.instance_pages),
            ("instance_batch", cfg.instance_batch as u64),
            ("prompt_tokens", m.prompt_tokens),
            ("prefill_tokens_recomputed", m.prefilled),
            ("moved_slots", m.moved_slots),
            ("routed", rm.routed),
            ("steps", rm.steps),
            ("events", rm.events),
            ("events_cpu", rm.cpu_events),
            ("event_batches", rm.batches),
            ("event_bytes", rm.event_bytes),
            ("router_audits", rm.audits),
            ("router_compared", rm.compared),
            ("router_mismatches", rm.mismatches),
            ("drained_at_turn", rm.drained_at_turn),
            ("drain_rerouted", rm.drain_rerouted),
            ("drain_released_slots", rm.drain_released_slots),
        ] {
            fields.push((k.into(), v.to_string()));
        }
        fields.push(("drained".into(), rm.drained.map_or("null".into(), |k| k.to_string())));
        let mm = &m.migrate;
        for (k, v) in [
            ("migrations", mm.migrations),
            ("drain_migrations", mm.drain_migrations),
            ("migrations_refused", mm.refused),
            ("migrated_pages", mm.pages),
            ("migrated_bytes", mm.bytes),
            ("migrated_tokens", mm.tokens),
            ("migrate_saved_tokens", mm.saved_tokens),
            ("turns_after_migration", mm.next_turns),
            ("hits_after_migration", mm.next_hits),
            ("migrate_event_checks", mm.event_checks),
        ] {
            fields.push((k.into(), v.to_string()));
        }
        fields.push(("migrate".into(), cfg.args.migrate.to_string()));
        fields.push(("migrate_threshold".into(), format!("{}", cfg.args.migrate_threshold)));
        fields.push(("link_gbps".into(), format!("{}", cfg.args.link_gbps)));
        fields.push(("migrate_transfer_s".into(), format!("{:.6}", mm.transfer_s)));
        fields.push(("migrate_recompute_s".into(), format!("{:.6}", mm.recompute_s)));
        fields.push(("hit_rate_after_migration".into(), format!("{:.6}", mm.hit_rate_after())));
        fields.push(("hit_rate".into(), format!("{:.6}", hit_rate(m))));
        fields.push(("reuse_rate".into(), format!("{:.6}", reuse_rate(m))));
        fields.push(("imbalance".into(), format!("{:.6}", rm.imbalance())));
        fields.push(("sim_seconds".into(), format!("{:.3}", sim_secs(cfg, m))));
        fields.push(("overlap_credit".into(), format!("{}", cfg.args.overlap_credit)));
        fields.push(("events_per_sim_sec".into(), format!("{:.3}", events_per_sim_sec(cfg, m))));
    }
    fields.push(("ok".into(), fault.is_none().to_string()));
    let escaped: String = fault
        .unwrap_or("")
        .chars()
        .map(|c| match c {
            '"' | '\\' => format!("\\{c}"),
            c if (c as u32) < 0x20 => format!("\\u{:04x}", c as u32),
            c => c.to_string(),
        })
        .collect();
    fields.push(("fault".into(), format!("\"{escaped}\"")));
    let body: Vec<String> = fields.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
    format!("{{{}}}", body.join(","))
}

/// The host tier's comparison (`--host-pool-tokens`): the same workload without and with it.
/// Each row: its table label, its JSON name, and its value in a run.
type Row = (&'static str, &'static str, Box<dyn Fn(&Metrics) -> String>);

fn tier_rows() -> Vec<Row> {
    let gb = |b: u64| format!("{:.1}", b as f64 / 1e9);
    vec![
        ("hits", "hits", Box::new(|m: &Metrics| m.hits.to_string())),
        ("hit rate", "hit_rate", Box::new(|m: &Metrics| format!("{:.2}%", 100.0 * hit_rate(m)))),
        ("prefill recomputed", "prefill_tokens_recomputed", Box::new(|m: &Metrics| m.prefilled.to_string())),
        ("sessions evicted", "evictions", Box::new(|m: &Metrics| m.evictions.to_string())),
        ("sessions parked", "parks", Box::new(|m: &Metrics| m.tier.parks.to_string())),
        ("sessions restored", "unparks", Box::new(|m: &Metrics| m.tier.unparks.to_string())),
        ("restores missed", "restore_misses", Box::new(|m: &Metrics| m.tier.restore_misses.to_string())),
        ("host copies dropped", "host_evictions", Box::new(|m: &Metrics| m.tier.host_evictions.to_string())),
        ("released by the tier", "released_by_tier", Box::new(|m: &Metrics| m.tier.released_by_tier.to_string())),
        ("GB to host", "bytes_to_host", Box::new(move |m: &Metrics| gb(m.tier.bytes_to_host))),
        ("GB to device", "bytes_to_device", Box::new(move |m: &Metrics| gb(m.tier.bytes_to_device))),
        ("write-backs", "writebacks", Box::new(|m: &Metrics| m.tier.writebacks.to_string())),
        ("failed copies", "failed_copies", Box::new(|m: &Metrics| m.tier.failed_copies.to_string())),
        ("failed restores", "failed_restores", Box::new(|m: &Metrics| m.tier.failed_restores.to_string())),
        ("stalled steps", "stalled_steps", Box::new(|m: &Metrics| m.tier.stalled_steps.to_string())),
        ("stalled restores", "stalled_restores", Box::new(|m: &Metrics| m.tier.stalled_restores.to_string())),
        ("eviction waits", "eviction_waits", Box::new(|m: &Metrics| m.tier.eviction_waits.to_string())),
        ("stall time (s)", "stall_s", Box::new(|m: &Metrics| format!("{:.1}", m.tier.stall_s))),
        ("modelled time (s)", "model_s", Box::new(|m: &Metrics| format!("{:.1}", m.tier.model_s))),
    ]
}

/// The comparison table: one row per figure, without and with the tier.
pub fn tier_table(cfg: &Config, without: &Run, with: &Run) -> String {
    let a = &cfg.args;
    let mut t = String::new();
    let split = if cfg.multi { format!(" (split between {} instances)", a.instances) } else { String::new() };
    let _ = writeln!(
        t,
        "host tier: {} pages ({} tokens) beside {} device pages{split}; copies {} GB/s each way at {} KV bytes/token; prefill {} tokens/s, decode {} ms a step",
        cfg.host_pages,
        cfg.host_pages * a.page_size as u64,
        cfg.total_pages,
        a.copy_gbps,
        a.kv_bytes_per_token,
        a.prefill_tokens_per_s,
        a.step_ms
    );
    let _ = writeln!(t, "  {:<24}{:>14}{:>14}", "", "without tier", "with tier");
    for (label, _, v) in tier_rows() {
        let _ = writeln!(t, "  {label:<24}{:>14}{:>14}", v(&without.m), v(&with.m));
    }
    let verdict = |r: &Run| r.fault.as_deref().map_or("OK".to_string(), |f| format!("FAIL: {f}"));
    let _ = writeln!(
        t,
        "  {:<24}{} positions of reused KV checked against the tag mirror; without: {}; with: {}",
        "checks",
        with.m.tier.verified_positions,
        verdict(without),
        verdict(with)
    );
    t
}

/// The comparison's JSON fields: each figure as `<name>_without_tier` and `<name>_with_tier`
/// (numbers; byte counts exact).
pub fn tier_json(cfg: &Config, without: &Run, with: &Run) -> String {
    let mut f: Vec<String> = vec![
        format!("\"host_pages\":{}", cfg.host_pages),
        format!("\"copy_gbps\":{}", cfg.args.copy_gbps),
        format!("\"kv_bytes_per_token\":{}", cfg.args.kv_bytes_per_token),
        format!("\"prefill_tokens_per_s\":{}", cfg.args.prefill_tokens_per_s),
        format!("\"verified_positions\":{}", with.m.tier.verified_positions),
    ];
    let t = &with.m.tier;
    for (k, v) in [
        ("tier_evict_calls", t.evict_calls),
        ("tier_evict_parked", t.evict_parked),
        ("tier_evict_released", t.evict_released),
        ("tier_evict_copying", t.evict_copying),
    ] {
        f.push(format!("\"{k}\":{v}"));
    }
    for (_, name, v) in tier_rows() {
        for (side, r) in [("without_tier", without), ("with_tier", with)] {
            let val = match name {
                "hit_rate" => format!("{:.6}", hit_rate(&r.m)),
                "bytes_to_host" => r.m.tier.bytes_to_host.to_string(),
                "bytes_to_device" => r.m.tier.bytes_to_device.to_string(),
                "stall_s" => format!("{:.6}", r.m.tier.stall_s),
                "model_s" => format!("{:.6}", r.m.tier.model_s),
                _ => v(&r.m),
            };
            f.push(format!("\"{name}_{side}\":{val}"));
        }
    }
    for (side, r) in [("without_tier", without), ("with_tier", with)] {
        f.push(format!("\"ok_{side}\":{}", r.fault.is_none()));
    }
    f.join(",")
}
