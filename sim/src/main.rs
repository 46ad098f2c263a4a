//! skv-sim: libskv doing an engine's work — many multi-turn sessions under speculative
//! decoding, driven through the C ABI, with every page accounted for at the end.

// As in the library: every unsafe block says why it is sound.
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

mod cli;
mod engine;
mod ffi;
mod replay;
mod report;
mod workload;

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::error::ErrorKind;
use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};

use cli::{Args, Config};
use engine::Engine;

/// Bad options: one line on stderr, status 2.
fn usage_error(msg: &str) -> ExitCode {
    eprintln!("skv-sim: {msg}");
    ExitCode::from(2)
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
    let bar = if a.json || a.bench || !std::io::stderr().is_terminal() {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(a.sessions * a.turns as u64).with_style(
            ProgressStyle::with_template("{elapsed_precise} [{wide_bar}] {human_pos}/{human_len} turns, eta {eta}")
                .expect("valid template"),
        )
    };
    let mut engine = match Engine::new(&cfg, bar.clone()) {
        Ok(e) => e,
        Err(msg) => return usage_error(&msg),
    };
    let result = engine.run();
    bar.finish_and_clear();
    let fault = result.err();
    let lat = report::latencies(engine.latency_samples());
    let m = &engine.m;
    if a.json {
        println!("{}", report::json(&cfg, m, &lat, fault.as_deref()));
    } else if a.bench {
        println!("{}", report::bench_line(m, &lat));
    } else {
        print!("{}", report::table(&cfg, m, &lat, fault.as_deref()));
    }
    match fault {
        None => ExitCode::SUCCESS,
        Some(f) => {
            eprintln!("skv-sim: FAIL: {f}");
            ExitCode::from(1)
        }
    }
}
