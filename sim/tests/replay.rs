//! `skv-sim replay`: a simulator run recorded with SKV_TRACE replays call for call, a hybrid
//! one on a cache with its SWA pool; a trace edited to claim another status is caught at its
//! line; an external-mode trace is refused.

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

/// An owned cache of page size 4 tracing to `name` (an SWA pool of `swa_slots`, 0 for none),
/// and the trace's path.
///
/// # Safety
/// The caller frees the handle.
unsafe fn traced_cache(name: &str, swa_slots: u64) -> (*mut skv::skv_cache, PathBuf) {
    use skv::*;
    let path = tmp(name);
    let _ = std::fs::remove_file(&path);
    let cpath = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    let cfg = skv_cache_config {
        struct_size: std::mem::size_of::<skv_cache_config>() as u32,
        page_size: 4,
        num_token_slots: 256,
        num_rows: 4,
        max_context_len: 64,
        flags: 0,
        swa_num_token_slots: swa_slots,
    };
    let mut c = std::ptr::null_mut();
    // SAFETY: cfg, c and cpath are valid for the calls.
    unsafe {
        assert_eq!(skv_cache_new(&cfg, &mut c), skv_status::SKV_OK);
        assert_eq!(skv_cache_set_trace(c, cpath.as_ptr()), skv_status::SKV_OK);
    }
    (c, path)
}

/// A small simulator run, traced.
fn record(path: &Path) -> String {
    record_with(path, &[])
}

fn record_with(path: &Path, extra: &[&str]) -> String {
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
    let out = sim().args(args).args(extra).env("SKV_TRACE", path).output().expect("skv-sim runs");
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
fn a_hybrid_run_replays_on_a_cache_with_its_swa_pool() {
    let path = tmp("hybrid.jsonl");
    let trace = record_with(&path, &["--swa-window", "16", "--swa-pool-tokens", "4096"]);
    assert!(trace.lines().next().unwrap().contains("\"swa_num_token_slots\":4096"), "{}", &trace[..300]);
    let steps = trace.lines().filter(|l| l.contains("\"fn\":\"skv_swa_evict\"")).count();
    assert!(steps > 50, "window steps traced: {steps}");
    let out = replay(&path);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
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

/// A hand-back and the scheduler queries, traced from the C ABI, replay exactly.
#[test]
fn a_hand_back_and_the_queries_replay() {
    use skv::*;
    let ok = |st: skv_status| assert_eq!(st, skv_status::SKV_OK);
    // SAFETY: valid pointers throughout; the handle is freed last.
    let path = unsafe {
        let (c, path) = traced_cache("hand_back.jsonl", 0);
        let mut r = std::mem::zeroed::<skv_req>();
        ok(skv_req_init(&mut r));
        ok(skv_alloc_row(c, &mut r));
        ok(skv_alloc_extend(c, &mut r, 10, std::ptr::null_mut()));
        ok(skv_commit(c, &mut r, 10));
        r.origin_input_len = 10;
        ok(skv_cache_finished_req(c, 1, 0, &mut r, 0));
        let mut t = std::mem::zeroed::<skv_req>();
        ok(skv_req_init(&mut t));
        t.origin_input_len = 14;
        let mut m = skv_match { hit: 0, prefix_len: 0 };
        ok(skv_match_prefix(c, 1, 0, &mut t, 13, 0, &mut m));
        ok(skv_hand_back(c, 1, 0, &mut t));
        assert_eq!(skv_hand_back(c, 1, 0, &mut t), skv_status::SKV_ERR_INVALID_ARG);
        let mut u = std::mem::zeroed::<skv_usage>();
        ok(skv_session_usage(c, 1, &mut u));
        ok(skv_branch_usage(c, 1, 0, &mut u));
        let (mut s, mut b, mut n) = ([0u64; 2], [0u64; 2], 0usize);
        ok(skv_idle_sessions(c, s.as_mut_ptr(), b.as_mut_ptr(), 2, &mut n));
        let mut a = std::mem::zeroed::<skv_admission>();
        ok(skv_admission_pages(c, 1, 0, 9, 20, &mut a));
        skv_cache_free(c);
        path
    };
    let out = replay(&path);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("11 calls"), "{}", text(&out));
}

/// Owned mode's SWA pool, traced from the C ABI, replays exactly: the window step, both views,
/// the stats and the audit; the trace records the pool's size.
#[test]
fn an_swa_pool_replays() {
    use skv::*;
    let ok = |st: skv_status| assert_eq!(st, skv_status::SKV_OK);
    // SAFETY: valid pointers throughout; the handle is freed last.
    let path = unsafe {
        let (c, path) = traced_cache("swa_pool.jsonl", 64);
        let mut r = std::mem::zeroed::<skv_req>();
        ok(skv_req_init(&mut r));
        ok(skv_alloc_row(c, &mut r));
        ok(skv_alloc_extend(c, &mut r, 22, std::ptr::null_mut()));
        let mut freed = 0u32;
        ok(skv_swa_evict(c, &mut r, 22, 8, 1, -1, SKV_SWA_NO_PREFIX_SHARING, &mut freed));
        assert_eq!(freed, 12);
        let mut ids = [0i32; 22];
        ok(skv_row_swa_indices(c, r.req_pool_idx, 0, 22, ids.as_mut_ptr()));
        let (rows, mut indptr, mut idx, mut last, mut needed) = ([r.req_pool_idx], [0i32; 2], [0i32; 8], [0i32; 1], 0);
        ok(skv_build_flashinfer_swa(
            c,
            rows.as_ptr(),
            1,
            indptr.as_mut_ptr(),
            idx.as_mut_ptr(),
            last.as_mut_ptr(),
            8,
            &mut needed,
        ));
        let mut s = std::mem::zeroed::<skv_stats>();
        ok(skv_cache_stats(c, &mut s));
        assert_eq!(s.swa_used_pages, 3);
        let mut rep = std::mem::zeroed::<skv_check_report>();
        ok(skv_cache_check(c, &mut rep));
        ok(skv_free_req(c, &mut r));
        skv_cache_free(c);
        path
    };
    let trace = std::fs::read_to_string(&path).unwrap();
    assert!(trace.lines().next().unwrap().contains("\"swa_num_token_slots\":64"), "{trace}");
    let out = replay(&path);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("8 calls"), "{}", text(&out));
}
