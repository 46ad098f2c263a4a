//! `skv-sim replay`: a simulator run recorded with SKV_TRACE replays call for call; a trace
//! edited to claim another status is caught at its line; an external-mode trace is refused.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn sim() -> Command {
    Command::new(env!("CARGO_BIN_EXE_skv-sim"))
}

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("skv-replay-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn replay(path: &Path) -> Output {
    sim().arg("replay").arg(path).output().expect("skv-sim runs")
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// A small simulator run, traced.
fn record(path: &Path) -> String {
    let _ = std::fs::remove_file(path);
    let args = [
        "--json",
        "--sessions",
        "12",
        "--turns",
        "3",
        "--concurrency",
        "6",
        "--batch",
        "3",
        "--prompt-max",
        "64",
        "--max-new-tokens",
        "24",
        "--check-every",
        "10",
        "--pool-tokens",
        "8192",
        "--mamba",
    ];
    let out = sim().args(args).env("SKV_TRACE", path).output().expect("skv-sim runs");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    std::fs::read_to_string(path).unwrap()
}

#[test]
fn a_recorded_simulator_run_replays_exactly() {
    let path = tmp("run.jsonl");
    let trace = record(&path);
    let lines = trace.lines().count();
    assert!(lines > 500, "a real run: {lines} lines");
    let out = replay(&path);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains(&format!("{} calls", lines - 1)), "{}", text(&out));
}

#[test]
fn an_edited_status_is_reported_at_its_line() {
    let path = tmp("edited.jsonl");
    let trace = record(&path);
    // The 4th successful single skv_alloc_extend (prefill) now claims the pool ran out.
    let (at, line) = trace
        .lines()
        .enumerate()
        .filter(|(_, l)| l.contains("\"fn\":\"skv_alloc_extend\"") && l.contains("\"status\":\"SKV_OK\""))
        .nth(3)
        .expect("a run with many extends");
    let edited: Vec<String> = trace
        .lines()
        .enumerate()
        .map(|(i, l)| {
            if i == at {
                line.replace("\"status\":\"SKV_OK\"", "\"status\":\"SKV_ERR_OUT_OF_MEMORY\"")
            } else {
                l.into()
            }
        })
        .collect();
    std::fs::write(&path, edited.join("\n") + "\n").unwrap();
    let out = replay(&path);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let want = format!("line {}: skv_alloc_extend: status SKV_OK, recorded SKV_ERR_OUT_OF_MEMORY", at + 1);
    assert!(text(&out).contains(&want), "expected {want:?} in {}", text(&out));
}

#[test]
fn an_external_trace_is_refused() {
    let path = tmp("external.jsonl");
    std::fs::write(
        &path,
        "{\"h\":3,\"fn\":\"trace_start\",\"mode\":\"external\",\"page_size\":4,\"num_token_slots\":0,\
         \"num_rows\":4,\"max_context_len\":64,\"aligned_reuse\":false}\n",
    )
    .unwrap();
    let out = replay(&path);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("line 1: mode \"external\": only owned-mode traces replay"), "{}", text(&out));
}
