//! `skv-sim replay`: a simulator run recorded with SKV_TRACE replays call for call, a hybrid
//! one on a cache with its SWA pool; a trace edited to claim another status is caught at its
//! line; an external-mode trace is refused; a line whose lengths exceed what the trace stored
//! or what the replay holds is "cannot replay" (exit 2), never a crash.

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
    // SAFETY: passed on to the caller.
    unsafe { traced_cache_of(name, 4, 256, 64, swa_slots) }
}

/// `traced_cache` of another size: page size, pool slots, max_context_len, SWA slots.
///
/// # Safety
/// The caller frees the handle.
unsafe fn traced_cache_of(
    name: &str,
    page_size: u32,
    slots: u64,
    max_context_len: u32,
    swa_slots: u64,
) -> (*mut skv::skv_cache, PathBuf) {
    use skv::*;
    let path = tmp(name);
    let _ = std::fs::remove_file(&path);
    let cpath = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    let cfg = skv_cache_config {
        struct_size: std::mem::size_of::<skv_cache_config>() as u32,
        page_size,
        num_token_slots: slots,
        num_rows: 4,
        max_context_len,
        flags: 0,
        swa_num_token_slots: swa_slots,
        ..Default::default()
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

/// The opening line of an owned cache of page size 16 and `slots` pool slots.
fn start_line(slots: u64) -> String {
    format!(
        "{{\"h\":1,\"fn\":\"trace_start\",\"mode\":\"owned\",\"page_size\":16,\"num_token_slots\":{slots},\
         \"num_rows\":4,\"max_context_len\":1024,\"aligned_reuse\":false,\"swa_num_token_slots\":0,\
         \"version\":\"{}\"}}",
        env!("CARGO_PKG_VERSION")
    )
}

/// Replays `lines` and asserts "cannot replay" at `line` with `msg`: exit 2, not a signal.
fn assert_cannot(name: &str, lines: &[String], line: usize, msg: &str) {
    let path = tmp(name);
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    let out = replay(&path);
    assert_eq!(out.status.code(), Some(2), "{name}: {:?}: {}", out.status, text(&out));
    let want = format!("skv-sim replay: cannot replay: line {line}: {msg}");
    assert!(text(&out).contains(&want), "{name}: expected {want:?} in {}", text(&out));
}

/// A req as a batch line records it, every field 0 but its row and the two lengths.
fn req_json(committed: u64, allocated: u64) -> String {
    format!(
        "{{\"req_pool_idx\":0,\"row_generation\":1,\"kv_committed_len\":{committed},\"kv_allocated_len\":{allocated},\
         \"cache_protected_len\":0,\"swa_evicted_seqlen\":0,\"origin_input_len\":0,\"output_len\":0,\
         \"finished_len\":-1,\"lock_node\":0,\"lock_receipt\":0,\"aux_state\":-1,\"aux_track\":[-1,-1],\
         \"swa_evict_floor\":0}}"
    )
}

/// skv_pool_alloc of 2^25 tokens on a pool that holds them: the replay's buffers stop at 2^24
/// values, so it cannot replay the call rather than pass the library a length its buffer lacks
/// (which crashed the replay with SIGSEGV).
#[test]
fn a_pool_alloc_beyond_the_replay_buffers_cannot_replay() {
    let lines =
        [start_line(1 << 26), "{\"h\":1,\"fn\":\"skv_pool_alloc\",\"n_tokens\":33554432,\"status\":\"SKV_OK\"}".into()];
    let msg = "skv_pool_alloc: out_indices of 33554432 values: more than the replay holds (16777216)";
    assert_cannot("pool_alloc_2_25.jsonl", &lines, 2, msg);
}

/// skv_row_indices over 2^25 positions of a row that maps them (the row's lines written by
/// libskv): cannot replay, where the replay wrote 2^25 values into a 2^24 buffer (SIGSEGV).
#[test]
fn row_indices_beyond_the_replay_buffers_cannot_replay() {
    use skv::*;
    let n = 1u32 << 25;
    // SAFETY: valid pointers throughout; the handle is freed last.
    let path = unsafe {
        let (c, path) = traced_cache_of("row_indices_2_25.jsonl", 16, 1 << 26, 1 << 26, 0);
        let mut r = std::mem::zeroed::<skv_req>();
        assert_eq!(skv_req_init(&mut r), skv_status::SKV_OK);
        assert_eq!(skv_alloc_row(c, &mut r), skv_status::SKV_OK);
        assert_eq!(skv_alloc_extend(c, &mut r, n, std::ptr::null_mut()), skv_status::SKV_OK);
        skv_cache_free(c);
        path
    };
    let mut lines: Vec<String> = std::fs::read_to_string(&path).unwrap().lines().map(String::from).collect();
    assert_eq!(lines.len(), 3, "trace_start, alloc_row, alloc_extend");
    lines.push(format!(
        "{{\"h\":{},\"fn\":\"skv_row_indices\",\"row\":0,\"start\":0,\"end\":{n},\"status\":\"SKV_OK\"}}",
        handle_of(&lines[0])
    ));
    let msg = "skv_row_indices: out of 33554432 values: more than the replay holds (16777216)";
    assert_cannot("row_indices_2_25.jsonl", &lines, 4, msg);
}

fn handle_of(start: &str) -> u64 {
    serde_json::from_str::<serde_json::Value>(start).unwrap()["h"].as_u64().unwrap()
}

/// skv_build_flashinfer with a cap of 2^40: the replay cannot hold kv_indices of that size, and
/// says so instead of passing the library 2^40 with a buffer of 2^24.
#[test]
fn a_flashinfer_cap_beyond_the_replay_buffers_cannot_replay() {
    for f in ["skv_build_flashinfer", "skv_build_flashinfer_swa"] {
        let lines = [
            start_line(1024),
            format!(
                "{{\"h\":1,\"fn\":\"{f}\",\"rows\":[],\"cap\":1099511627776,\"status\":\"SKV_OK\",\"needed\":0,\
                 \"kv_indptr\":[0],\"kv_indices\":[],\"kv_last_page_len\":[]}}"
            ),
        ];
        let msg = format!("{f}: kv_indices of 1099511627776 values: more than the replay holds (16777216)");
        assert_cannot("flashinfer_cap.jsonl", &lines, 2, &msg);
    }
}

/// skv_alloc_extend_batch whose 16 counts of 2^31 add up to 2^35 slots (the replay aborted
/// allocating 137 GB for out_loc), and one whose count exceeds what its req records (the
/// replay's input length would wrap).
#[test]
fn a_batch_beyond_the_replay_buffers_cannot_replay() {
    let big = 1u64 << 31;
    let batch = |counts: &[u64], reqs: &[String]| {
        let counts: Vec<String> = counts.iter().map(u64::to_string).collect();
        format!(
            "{{\"h\":1,\"fn\":\"skv_alloc_extend_batch\",\"n\":{},\"out_loc\":1,\"out_cap\":{},\"status\":\"SKV_OK\",\
             \"n_tokens\":[{}],\"reqs_out\":[{}]}}",
            reqs.len(),
            16 * big,
            counts.join(","),
            reqs.join(",")
        )
    };
    let lines = [start_line(1024), batch(&[big; 16], &vec![req_json(0, big); 16])];
    let msg = "skv_alloc_extend_batch: out_loc of 34359738368 values: more than the replay holds (16777216)";
    assert_cannot("batch_total.jsonl", &lines, 2, msg);
    let lines = [start_line(1024), batch(&[5], &[req_json(0, 3)])];
    let msg = "skv_alloc_extend_batch: reqs_out[0].kv_allocated_len 3 is less than n_tokens[0] 5";
    assert_cannot("batch_count.jsonl", &lines, 2, msg);
}

/// An output the trace cut (marked) or that holds fewer values than the call writes (a trace
/// from before the mark, or edited) cannot be compared: cannot replay, not a difference.
#[test]
fn an_array_the_trace_cut_cannot_replay() {
    let alloc = |kept: &str, mark: &str| {
        format!("{{\"h\":1,\"fn\":\"skv_pool_alloc\",\"n_tokens\":32,\"status\":\"SKV_OK\",\"out_indices\":[{kept}]{mark}}}")
    };
    let kept = (16..32).map(|i| i.to_string()).collect::<Vec<_>>().join(",");
    let lines = [start_line(1024), alloc(&kept, ",\"out_indices_cut_at\":16,\"out_indices_full_len\":32")];
    assert_cannot("cut.jsonl", &lines, 2, "skv_pool_alloc: out_indices was cut in the trace: 16 of 32 values kept");
    let lines = [start_line(1024), alloc(&kept, "")];
    let msg = "skv_pool_alloc: out_indices: the trace holds 16 values, the call writes 32";
    assert_cannot("short.jsonl", &lines, 2, msg);
}

/// A trace libskv wrote with a list longer than it keeps (skv_pool_alloc of 2^16 + 4 tokens):
/// the line marks the cut, and the replay says it cannot replay that line.
#[test]
fn a_real_trace_with_a_cut_list_cannot_replay() {
    use skv::*;
    let n = (1u32 << 16) + 4;
    // SAFETY: valid pointers throughout; out holds n values; the handle is freed last.
    let path = unsafe {
        let (c, path) = traced_cache_of("real_cut.jsonl", 4, 1 << 18, 64, 0);
        let mut out = vec![0i32; n as usize];
        assert_eq!(skv_pool_alloc(c, n, out.as_mut_ptr()), skv_status::SKV_OK);
        assert_eq!(skv_pool_free(c, out.as_ptr(), out.len()), skv_status::SKV_OK);
        skv_cache_free(c);
        path
    };
    let trace = std::fs::read_to_string(&path).unwrap();
    let alloc: serde_json::Value = serde_json::from_str(trace.lines().nth(1).unwrap()).unwrap();
    assert_eq!(alloc["out_indices"].as_array().unwrap().len(), 1 << 16);
    assert_eq!(alloc["out_indices_full_len"], n);
    let out = replay(&path);
    assert_eq!(out.status.code(), Some(2), "{:?}: {}", out.status, text(&out));
    let want = format!("line 2: skv_pool_alloc: out_indices was cut in the trace: 65536 of {n} values kept");
    assert!(text(&out).contains(&want), "expected {want:?} in {}", text(&out));
}

/// A line longer than any libskv writes is refused before it is read whole.
#[test]
fn an_overlong_line_cannot_replay() {
    let pad = "x".repeat(64 << 20);
    let lines =
        [start_line(1024), format!("{{\"h\":1,\"fn\":\"skv_cache_stats\",\"pad\":\"{pad}\",\"status\":\"SKV_OK\"}}")];
    assert_cannot("overlong.jsonl", &lines, 2, "longer than 67108864 bytes");
}

/// The slots extends wrote (out_loc) are not compared, so a long prefill's, cut in the trace,
/// does not stop the replay; the ids skv_idle_sessions wrote neither. A recorded NULL output
/// replays as NULL, whatever length came with it.
#[test]
fn outputs_not_compared_and_null_outputs_replay() {
    use skv::*;
    let ok = |st: skv_status| assert_eq!(st, skv_status::SKV_OK);
    let long = (1u32 << 16) + 4;
    // SAFETY: valid pointers throughout; every buffer holds the length passed with it; the
    // handle is freed last.
    let path = unsafe {
        let (c, path) = traced_cache_of("outputs.jsonl", 4, 1 << 18, 1 << 17, 0);
        let (mut a, mut b) = (std::mem::zeroed::<skv_req>(), std::mem::zeroed::<skv_req>());
        ok(skv_req_init(&mut a));
        ok(skv_req_init(&mut b));
        ok(skv_alloc_row(c, &mut a));
        ok(skv_alloc_row(c, &mut b));
        let mut loc = vec![0i32; long as usize];
        ok(skv_alloc_extend(c, &mut a, long, loc.as_mut_ptr()));
        let mut reqs = [a, b];
        ok(skv_alloc_extend_batch(c, reqs.as_mut_ptr(), 2, [3u32, 5].as_ptr(), loc.as_mut_ptr(), 8));
        ok(skv_commit_batch(c, reqs.as_mut_ptr(), 2, [long, 5].as_ptr()));
        ok(skv_cache_finished_req(c, 1, 0, &mut reqs[0], 0));
        ok(skv_cache_finished_req(c, 2, 0, &mut reqs[1], 0));
        let (mut s, mut bids, mut n) = ([0u64; 4], [0u64; 4], 0usize);
        ok(skv_idle_sessions(c, s.as_mut_ptr(), bids.as_mut_ptr(), 4, &mut n));
        assert_eq!(n, 2);
        let null = std::ptr::null_mut();
        assert_eq!(skv_row_indices(c, 0, 0, 1 << 30, null), skv_status::SKV_ERR_NULL_ARG);
        let (rows, mut idx, mut last, mut needed) = ([0i32], [0i32; 4], [0i32; 1], 0usize);
        let st = skv_build_flashinfer(c, rows.as_ptr(), 1, null, idx.as_mut_ptr(), last.as_mut_ptr(), 4, &mut needed);
        assert_eq!(st, skv_status::SKV_ERR_NULL_ARG);
        skv_cache_free(c);
        path
    };
    let trace = std::fs::read_to_string(&path).unwrap();
    assert!(trace.contains(&format!("\"out_loc_cut_at\":65536,\"out_loc_full_len\":{long}")), "{}", &trace[..400]);
    let out = replay(&path);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("10 calls"), "{}", text(&out));
}

/// A small trace of one request's life (a row, an extend, a commit, a release), every req
/// line written by libskv.
fn one_req_trace(name: &str) -> (PathBuf, String) {
    use skv::*;
    let ok = |st: skv_status| assert_eq!(st, skv_status::SKV_OK);
    // SAFETY: valid pointers throughout; the handle is freed last.
    let path = unsafe {
        let (c, path) = traced_cache(name, 0);
        let mut r = skv_req::default();
        ok(skv_alloc_row(c, &mut r));
        ok(skv_alloc_extend(c, &mut r, 10, std::ptr::null_mut()));
        ok(skv_commit(c, &mut r, 10));
        ok(skv_free_req(c, &mut r));
        skv_cache_free(c);
        path
    };
    let trace = std::fs::read_to_string(&path).unwrap();
    (path, trace)
}

/// `text` without each `,"<name>":<value>` (a number, or a bracketed pair).
fn without_field(text: &str, name: &str) -> String {
    let key = format!(",\"{name}\":");
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find(&key) {
        out.push_str(&rest[..at]);
        let value = &rest[at + key.len()..];
        let end = if value.starts_with('[') { value.find(']').unwrap() + 1 } else { value.find([',', '}']).unwrap() };
        rest = &value[end..];
    }
    out + rest
}

/// A trace from before ABI 4 records neither `swa_evict_floor` nor `aux_track`: the replay
/// reads them as a fresh req's (0, both -1) and compares the req_out it records with that.
#[test]
fn a_trace_without_the_abi_4_req_fields_replays() {
    let (path, trace) = one_req_trace("before_abi_4.jsonl");
    assert!(trace.contains("\"swa_evict_floor\":0,") && trace.contains("\"aux_track\":[-1,-1]}"), "{trace}");
    let old = without_field(&without_field(&trace, "swa_evict_floor"), "aux_track");
    assert!(!old.contains("aux_track") && !old.contains("swa_evict_floor"), "{old}");
    std::fs::write(&path, &old).unwrap();
    let out = replay(&path);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("4 calls"), "{}", text(&out));
}

/// Each req field is compared by name: an edited `aux_track` (the pair) or `lock_receipt` in
/// a recorded req_out is a difference at its line; a req field missing from an input req that
/// every trace records cannot replay.
#[test]
fn an_edited_req_field_is_reported_by_name() {
    let (path, trace) = one_req_trace("edited_req.jsonl");
    let lines: Vec<&str> = trace.lines().collect();
    let at = lines.iter().position(|l| l.contains("\"fn\":\"skv_commit\"")).unwrap();
    let edit = |from: &str, to: &str| -> Vec<String> {
        let mut v: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
        let (head, out) = v[at].split_once("\"req_out\":").unwrap();
        v[at] = format!("{head}\"req_out\":{}", out.replacen(from, to, 1));
        v
    };
    for (from, to, want) in [
        ("\"aux_track\":[-1,-1]", "\"aux_track\":[7,-1]", "req_out.aux_track = [-1,-1], recorded [7,-1]"),
        ("\"lock_receipt\":0", "\"lock_receipt\":9", "req_out.lock_receipt = 0, recorded 9"),
    ] {
        std::fs::write(&path, edit(from, to).join("\n") + "\n").unwrap();
        let out = replay(&path);
        assert_eq!(out.status.code(), Some(1), "{}", text(&out));
        let want = format!("line {}: skv_commit: {want}", at + 1);
        assert!(text(&out).contains(&want), "expected {want:?} in {}", text(&out));
    }
    let cut: Vec<String> = lines.iter().map(|l| without_field(l, "row_generation")).collect();
    assert_cannot("edited_req_missing.jsonl", &cut, 2, "skv_alloc_row: req.row_generation missing");
}
