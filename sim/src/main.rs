//! skv-sim: libskv doing an engine's work — many multi-turn sessions under speculative
//! decoding, driven through the C ABI, with every page accounted for at the end.

// As in the library: every unsafe block says why it is sound.
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]
// The multi-instance run's state and figures are read only by the `router` feature's code.
#![cfg_attr(not(feature = "router"), allow(dead_code))]

mod cli;
mod engine;
mod ffi;
mod replay;
mod report;
#[cfg(feature = "router")]
mod router;
mod workload;

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::error::ErrorKind;
use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};

use cli::{Args, Config, Policy};
use engine::Engine;

/// Bad options: one line on stderr, status 2.
fn usage_error(msg: &str) -> ExitCode {
    eprintln!("skv-sim: {msg}");
    ExitCode::from(2)
}

/// One run of the workload (with the host tier when `cfg.host_pages` > 0), routed by
/// `policy` in a multi-instance run.
fn run_once(cfg: &Config, policy: Option<Policy>, bar: &ProgressBar) -> Result<report::Run, String> {
    let mut engine = Engine::new(cfg, policy, bar.clone())?;
    let fault = engine.run().err();
    let lat = report::latencies(engine.latency_samples());
    Ok(report::Run { m: std::mem::take(&mut engine.m), lat, fault })
}

/// `--host-pool-tokens`: the same workload without the host tier, then with it (per routing
/// policy in a multi-instance run); the runs with it reported as usual, then each pair side
/// by side.
fn run_tier(cfg: &Config, policies: &[Option<Policy>], bar: ProgressBar) -> ExitCode {
    let a = &cfg.args;
    bar.set_length(2 * a.sessions * a.turns as u64 * policies.len() as u64);
    let base_cfg = Config { host_pages: 0, ..cfg.clone() };
    let (mut without, mut with) = (Vec::new(), Vec::new());
    for &p in policies {
        match (run_once(&base_cfg, p, &bar), run_once(cfg, p, &bar)) {
            (Ok(w), Ok(t)) => {
                without.push(w);
                with.push(t);
            }
            (Err(msg), _) | (_, Err(msg)) => return usage_error(&msg),
        };
    }
    bar.finish_and_clear();
    for ((p, w), t) in policies.iter().zip(&without).zip(&with) {
        if a.json {
            let j = report::json(cfg, &t.m, &t.lat, t.fault.as_deref());
            println!("{},{}}}", j.strip_suffix('}').expect("an object"), report::tier_json(cfg, w, t));
        } else if a.bench {
            println!("{}", report::bench_line(&t.m, &t.lat));
        } else if !cfg.multi {
            print!("{}", report::table(cfg, &t.m, &t.lat, t.fault.as_deref()));
            print!("{}", report::tier_table(cfg, w, t));
        } else if let Some(p) = p {
            print!("router {}: {}", p.name(), report::tier_table(cfg, w, t));
        }
    }
    #[cfg(feature = "router")]
    if cfg.multi && !a.json && !a.bench {
        print!("{}", report::fleet_table(cfg, &with));
    }
    let runs: Vec<(&str, &report::Run)> = without
        .iter()
        .map(|r| ("without the host tier", r))
        .chain(with.iter().map(|r| ("with the host tier", r)))
        .collect();
    verdict(&runs)
}

/// Exit status 1 and one line per failed run, else 0.
fn verdict(runs: &[(&str, &report::Run)]) -> ExitCode {
    let mut code = ExitCode::SUCCESS;
    for (name, r) in runs {
        if let Some(f) = &r.fault {
            eprintln!("skv-sim: FAIL ({name}): {f}");
            code = ExitCode::from(1);
        }
    }
    code
}

fn main() -> ExitCode {
    if let Some(code) = replay::from_args() {
        return code;
    }
    let args = match Args::try_parse() {
        Ok(a) => a,
        Err(e) if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) => e.exit(),
        Err(e) => {
            let text = e.render().to_string();
            let first = text.lines().next().unwrap_or("bad options");
            return usage_error(first.strip_prefix("error: ").unwrap_or(first));
        }
    };
    let cfg = match Config::from_args(args) {
        Ok(c) => c,
        Err(msg) => return usage_error(&msg),
    };
    let a = &cfg.args;
    // A multi-instance run serves the same workload once per policy (all three by default).
    let policies: Vec<Option<Policy>> = match (cfg.multi, a.router.is_empty()) {
        (false, _) => vec![None],
        (true, true) => vec![Some(Policy::Kv), Some(Policy::Session), Some(Policy::Random)],
        (true, false) => a.router.iter().map(|&p| Some(p)).collect(),
    };
    let bar = if a.json || a.bench || !std::io::stderr().is_terminal() {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(a.sessions * a.turns as u64 * policies.len() as u64).with_style(
            ProgressStyle::with_template("{elapsed_precise} [{wide_bar}] {human_pos}/{human_len} turns, eta {eta}")
                .expect("valid template"),
        )
    };
    if cfg.host_pages > 0 {
        return run_tier(&cfg, &policies, bar);
    }
    let mut runs = Vec::new();
    for p in policies {
        let mut engine = match Engine::new(&cfg, p, bar.clone()) {
            Ok(e) => e,
            Err(msg) => return usage_error(&msg),
        };
        let fault = engine.run().err();
        let lat = report::latencies(engine.latency_samples());
        runs.push(report::Run { m: std::mem::take(&mut engine.m), lat, fault });
    }
    bar.finish_and_clear();
    for r in &runs {
        if a.json {
            println!("{}", report::json(&cfg, &r.m, &r.lat, r.fault.as_deref()));
        } else if a.bench {
            println!("{}", report::bench_line(&r.m, &r.lat));
        } else if !cfg.multi {
            print!("{}", report::table(&cfg, &r.m, &r.lat, r.fault.as_deref()));
        }
    }
    #[cfg(feature = "router")]
    if cfg.multi && !a.json && !a.bench {
        print!("{}", report::fleet_table(&cfg, &runs));
    }
    let mut code = ExitCode::SUCCESS;
    for f in runs.iter().filter_map(|r| r.fault.as_deref()) {
        eprintln!("skv-sim: FAIL: {f}");
        code = ExitCode::from(1);
    }
    code
}
