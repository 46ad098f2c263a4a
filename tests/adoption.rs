//! Through the C ABI, with a fake engine in Rust: page-granular frees (SKV_FLAG_PAGE_FREES)
//! give exactly the deduplicated pages of the per-index run, and skv_hand_back runs no
//! callback in external mode.

// As in the library: every unsafe block says why it is sound.
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

mod common;

use std::ffi::{c_int, c_void};
use std::ptr;

use common::*;
use skv::*;

const PS: u32 = 16;
const COLS: u32 = 256;
const ROWS: u32 = 8;

/// req_to_token[r][p] = r * COLS + p (page-structured: COLS is a multiple of PS); every
/// free_kv call is recorded with its indices, free_row with its row.
#[derive(Default)]
struct Engine {
    frees: Vec<Vec<i32>>,
    rows_freed: Vec<i32>,
    calls: usize,
}

unsafe extern "C" fn read_row(_ud: *mut c_void, row: i32, start: u32, end: u32, out: *mut i32) -> c_int {
    for (k, p) in (start..end).enumerate() {
        // SAFETY: libskv passes out with room for end - start indices.
        unsafe { *out.add(k) = row * COLS as i32 + p as i32 };
    }
    0
}

unsafe extern "C" fn free_kv(ud: *mut c_void, idx: *const i32, n: usize) -> c_int {
    // SAFETY: ud is the test's Engine, alive while its handle is and not otherwise borrowed
    // during a call; libskv passes n indices at idx.
    let (e, idx) = unsafe { (&mut *(ud as *mut Engine), std::slice::from_raw_parts(idx, n)) };
    e.frees.push(idx.to_vec());
    e.calls += 1;
    0
}

unsafe extern "C" fn free_row(ud: *mut c_void, row: i32) -> c_int {
    // SAFETY: as in free_kv.
    let e = unsafe { &mut *(ud as *mut Engine) };
    e.rows_freed.push(row);
    e.calls += 1;
    0
}

fn cache(engine: &mut Engine, flags: u32) -> *mut skv_cache {
    cache_paged(engine, PS, flags)
}

fn cache_paged(engine: &mut Engine, page_size: u32, flags: u32) -> *mut skv_cache {
    let cfg = skv_cache_config {
        struct_size: std::mem::size_of::<skv_cache_config>() as u32,
        page_size,
        num_token_slots: 0,
        num_rows: ROWS,
        max_context_len: COLS,
        flags,
        swa_num_token_slots: 0,
        ..Default::default()
    };
    let ops = skv_pool_ops {
        struct_size: std::mem::size_of::<skv_pool_ops>() as u32,
        read_row: Some(read_row),
        free_kv: Some(free_kv),
        free_row: Some(free_row),
        dec_lock_ref: None,
        free_aux: None,
        free_kv_segment: None,
    };
    let mut c = ptr::null_mut();
    // SAFETY: valid pointers; the engine outlives the handle in every test.
    let st = unsafe { skv_cache_new_external(&cfg, &ops, engine as *mut Engine as *mut c_void, &mut c) };
    assert_eq!(code(st), OK, "{}", last_error());
    c
}

fn req(row: i32, committed: u32, allocated: u32, origin: u32) -> skv_req {
    let mut r = fresh_req();
    (r.req_pool_idx, r.kv_committed_len, r.kv_allocated_len, r.origin_input_len) = (row, committed, allocated, origin);
    r
}

/// A run touching every freeing path: finish trims, match tails, free_tail, abort, free_aligned,
/// trim_overshoot, release.
fn run(c: *mut skv_cache) {
    let ok = |st: skv_status| assert_eq!(code(st), OK, "{}", last_error());
    let mut m = skv_match { hit: 0, prefix_len: 0 };
    // SAFETY: c is the caller's live handle; every req and m are locals.
    unsafe {
        let mut a = req(1, 48, 61, 48);
        ok(skv_cache_finished_req(c, 1, 0, &mut a, 0));
        let mut b = req(2, 17, 40, 17);
        ok(skv_cache_finished_req(c, 2, 0, &mut b, 0));
        let mut t = req(-1, 0, 0, 20);
        ok(skv_match_prefix(c, 2, 0, &mut t, 5, 0, &mut m));
        t.kv_allocated_len = 70;
        ok(skv_free_tail(c, &mut t, 33));
        ok(skv_cache_finished_req(c, 2, 0, &mut t, 1));
        ok(skv_free_aligned(c, 3, 5, 64));
        let mut o = req(4, 30, 50, 20);
        o.output_len = 10;
        ok(skv_trim_overshoot(c, &mut o, 3));
        ok(skv_release_session(c, 1));
    }
}

#[test]
fn page_frees_are_the_deduplicated_pages_of_the_per_index_run() {
    let (mut every, mut paged) = (Engine::default(), Engine::default());
    let (a, b) = (cache(&mut every, 0), cache(&mut paged, SKV_FLAG_PAGE_FREES));
    run(a);
    run(b);
    assert_eq!(every.frees.len(), paged.frees.len(), "the same free_kv calls");
    assert!(every.frees.len() >= 6);
    for (per_index, per_page) in every.frees.iter().zip(&paged.frees) {
        let mut pages: Vec<i32> = per_index.iter().map(|i| i / PS as i32).collect();
        pages.dedup();
        let got: Vec<i32> = per_page.iter().map(|i| i / PS as i32).collect();
        assert_eq!(got, pages, "per index {per_index:?}");
        assert!(per_page.iter().all(|i| i % PS as i32 == 0), "each page's first token index: {per_page:?}");
    }
    assert_eq!(every.rows_freed, paged.rows_freed);
    // SAFETY: both handles were created above and are freed once, before their engines go.
    unsafe {
        skv_cache_free(a);
        skv_cache_free(b);
    }
}

#[test]
fn page_frees_change_nothing_with_one_token_pages() {
    let mut e = Engine::default();
    let c = cache_paged(&mut e, 1, SKV_FLAG_PAGE_FREES);
    // SAFETY: c is live until freed here, before the engine e goes.
    unsafe {
        assert_eq!(code(skv_free_aligned(c, 0, 3, 7)), OK);
        skv_cache_free(c);
    }
    assert_eq!(e.frees, [vec![3, 4, 5, 6]]);
}

#[test]
fn hand_back_runs_no_callback_and_the_slot_matches_again() {
    let mut e = Engine::default();
    let c = cache(&mut e, 0);
    let mut m = skv_match { hit: 0, prefix_len: 0 };
    // SAFETY: c is live until freed at the end, before the engine e goes; reqs, m and the
    // arrays are locals (s and b hold the 2 entries passed as the cap).
    unsafe {
        let mut a = req(3, 20, 20, 20);
        assert_eq!(code(skv_cache_finished_req(c, 1, 0, &mut a, 0)), OK);
        let mut t = req(-1, 0, 0, 40);
        assert_eq!(code(skv_match_prefix(c, 1, 0, &mut t, 39, 0, &mut m)), OK);
        assert_eq!((m.hit, m.prefix_len), (1, 20));
        let calls = e.calls;
        let mut ran = t;
        ran.kv_allocated_len = 24;
        assert_eq!(code(skv_hand_back(c, 1, 0, &mut ran)), STATE);
        assert!(last_error().starts_with("skv_hand_back: kv_allocated_len 24 != the 20"), "{}", last_error());
        assert_eq!(code(skv_hand_back(c, 1, 0, &mut t)), OK, "{}", last_error());
        assert_eq!(e.calls, calls, "no callback");
        assert_eq!(t.req_pool_idx, -1);
        let mut n = 0usize;
        let (mut s, mut b) = ([0u64; 2], [0u64; 2]);
        assert_eq!(code(skv_idle_sessions(c, s.as_mut_ptr(), b.as_mut_ptr(), 2, &mut n)), OK);
        assert_eq!((n, s[0], b[0]), (1, 1, 0), "idle again");
        let mut again = req(-1, 0, 0, 40);
        assert_eq!(code(skv_match_prefix(c, 1, 0, &mut again, 39, 0, &mut m)), OK);
        assert_eq!((m.hit, m.prefix_len), (1, 20));
        skv_cache_free(c);
    }
}
