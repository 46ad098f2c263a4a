//! Every line of a call trace is one JSON object naming its handle, function and status, with
//! arrays and reqs spelled out, whatever the calls did (successes, errors, a path with quotes).

// As in the library: every unsafe block says why it is sound.
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

use std::ffi::CString;
use std::ptr;

use skv::*;

fn cfg() -> skv_cache_config {
    skv_cache_config {
        struct_size: std::mem::size_of::<skv_cache_config>() as u32,
        page_size: 4,
        num_token_slots: 256,
        num_rows: 4,
        max_context_len: 64,
        flags: 0,
        swa_num_token_slots: 0,
        ..Default::default()
    }
}

#[test]
fn every_trace_line_is_json() {
    let dir = std::env::temp_dir().join(format!("skv-trace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("a \"quoted\" trace.jsonl");
    let cpath = CString::new(path.to_str().unwrap()).unwrap();
    let mut r = skv_req::default();
    // SAFETY: c is created here and freed once at the end; cpath is NUL-terminated; every
    // array is a local as long as its call says (idx's 4 is the cap); skv_held is plain
    // integers, so all-zero is a valid value.
    unsafe {
        let mut c = ptr::null_mut();
        assert_eq!(skv_cache_new(&cfg(), &mut c), skv_status::SKV_OK);
        assert_eq!(skv_cache_set_trace(c, cpath.as_ptr()), skv_status::SKV_OK);
        let mut m = skv_match { hit: 9, prefix_len: 9 };
        assert_eq!(skv_match_prefix(c, 1, 0, &mut r, 3, 0, &mut m), skv_status::SKV_OK);
        assert_eq!(skv_alloc_row(c, &mut r), skv_status::SKV_OK);
        assert_eq!(skv_alloc_extend(c, &mut r, 6, std::ptr::null_mut()), skv_status::SKV_OK);
        assert_eq!(skv_commit(c, &mut r, 99), skv_status::SKV_ERR_INVALID_ARG);
        let mut tree = [0i32; 8];
        assert_eq!(skv_pool_alloc(c, 8, tree.as_mut_ptr()), skv_status::SKV_OK);
        let mut refs = [7u32; 8];
        assert_eq!(skv_page_refs(c, tree.as_ptr(), 8, refs.as_mut_ptr()), skv_status::SKV_OK);
        assert_eq!(skv_pool_free(c, tree.as_ptr(), 8), skv_status::SKV_OK);
        assert_eq!(skv_pool_free(c, tree.as_ptr(), 8), skv_status::SKV_ERR_STATE);
        let rows = [r.req_pool_idx];
        let (mut indptr, mut idx, mut last, mut needed) = ([0i32; 2], [0i32; 4], [0i32; 1], 0usize);
        let st = skv_build_flashinfer(
            c,
            rows.as_ptr(),
            1,
            indptr.as_mut_ptr(),
            idx.as_mut_ptr(),
            last.as_mut_ptr(),
            4,
            &mut needed,
        );
        assert_eq!(st, skv_status::SKV_OK);
        let mut held = std::mem::zeroed::<skv_held>();
        assert_eq!(skv_session_held(c, rows.as_ptr(), 1, &mut held), skv_status::SKV_OK);
        assert_eq!(skv_free_req(c, &mut r), skv_status::SKV_OK);
        skv_cache_free(c);
    }
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<serde_json::Value> =
        text.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"))).collect();
    assert_eq!(lines.len(), 12, "the opening line and 11 calls");
    assert_eq!(lines[0]["fn"], "trace_start");
    assert_eq!(lines[0]["mode"], "owned");
    assert_eq!(lines[0]["swa_num_token_slots"], 0, "the opening line names the SWA pool's size");
    let h = lines[0]["h"].clone();
    assert!(lines.iter().all(|l| l["h"] == h && l["fn"].is_string()));
    assert!(lines[1..].iter().all(|l| l["status"].is_string()));
    let by_fn = |f: &'static str| lines.iter().filter(move |l| l["fn"] == f);
    let commit = by_fn("skv_commit").next().unwrap();
    assert_eq!(commit["status"], "SKV_ERR_INVALID_ARG");
    assert!(commit["error"].as_str().unwrap().starts_with("skv_commit: "));
    let alloc = by_fn("skv_pool_alloc").next().unwrap();
    assert_eq!(alloc["out_indices"].as_array().unwrap().len(), 8);
    let refs = by_fn("skv_page_refs").next().unwrap();
    assert_eq!(refs["out_counts"], serde_json::json!([0, 0, 0, 0, 0, 0, 0, 0]));
    let frees: Vec<_> = by_fn("skv_pool_free").collect();
    assert_eq!(frees[0]["indices"], alloc["out_indices"]);
    assert_eq!(frees[1]["status"], "SKV_ERR_STATE");
    let fi = by_fn("skv_build_flashinfer").next().unwrap();
    assert_eq!(fi["kv_indptr"], serde_json::json!([0, 2]));
    assert_eq!(fi["kv_last_page_len"], serde_json::json!([2]));
    let extend = by_fn("skv_alloc_extend").next().unwrap();
    assert_eq!(extend["req_out"]["kv_allocated_len"], 6);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// An array longer than a line keeps (65,536 values) keeps its first 65,536 and says so: how
/// many it kept and how long it was, so that no reader takes the kept values for the whole.
#[test]
fn a_cut_array_is_marked_with_its_full_length() {
    let dir = std::env::temp_dir().join(format!("skv-trace-cut-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("cut.jsonl");
    let cpath = CString::new(path.to_str().unwrap()).unwrap();
    let n = (1u32 << 16) + 4;
    let cfg = skv_cache_config { num_token_slots: 1 << 18, ..cfg() };
    // SAFETY: c is created here and freed once at the end; cpath is NUL-terminated; tree and
    // refs hold n values each.
    unsafe {
        let mut c = ptr::null_mut();
        assert_eq!(skv_cache_new(&cfg, &mut c), skv_status::SKV_OK);
        assert_eq!(skv_cache_set_trace(c, cpath.as_ptr()), skv_status::SKV_OK);
        let mut tree = vec![0i32; n as usize];
        assert_eq!(skv_pool_alloc(c, n, tree.as_mut_ptr()), skv_status::SKV_OK);
        let mut refs = vec![7u32; n as usize];
        assert_eq!(skv_page_refs(c, tree.as_ptr(), tree.len(), refs.as_mut_ptr()), skv_status::SKV_OK);
        assert_eq!(skv_pool_free(c, tree.as_ptr(), tree.len()), skv_status::SKV_OK);
        assert_eq!(skv_pool_alloc(c, 8, tree.as_mut_ptr()), skv_status::SKV_OK);
        skv_cache_free(c);
    }
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 5, "the opening line and 4 calls");
    for (line, name) in [(1, "out_indices"), (2, "indices"), (2, "out_counts"), (3, "indices")] {
        let l = &lines[line];
        assert_eq!(l[name].as_array().unwrap().len(), 1 << 16, "{name} keeps 65,536 values");
        assert_eq!(l[format!("{name}_cut_at")], 1 << 16, "{name}");
        assert_eq!(l[format!("{name}_full_len")], n, "{name}");
    }
    let whole = &lines[4];
    assert_eq!(whole["out_indices"].as_array().unwrap().len(), 8);
    assert!(whole.get("out_indices_cut_at").is_none() && whole.get("out_indices_full_len").is_none(), "{whole}");
    std::fs::remove_dir_all(&dir).unwrap();
}
