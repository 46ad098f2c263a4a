//! Concurrency stress: 8 threads on one owned handle with sessions shared between them (so some
//! calls legitimately get SKV_ERR_STATE: another thread's request holds the slot), and 8
//! handles driven in parallel. Afterwards every page and row is accounted for and the audit
//! is clean.
//!
//! The operation count is `SKV_STRESS_OPS` (libskv calls per test, default 1,000,000: about
//! 2 s per test in a debug build on the 2-core dev box, so `make test` runs the full count).
//! ```sh
//! SKV_STRESS_OPS=20000000 cargo test --release --test stress -- --nocapture
//! ```

// As in the library: every unsafe block says why it is sound.
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

mod common;

use std::ptr::null_mut;
use std::sync::atomic::{AtomicU64, Ordering};

use skv::skv_status::*;
use skv::*;

const THREADS: usize = 8;
const SESSIONS: u64 = 24;
const PS: u32 = 4;

fn total_ops() -> u64 {
    std::env::var("SKV_STRESS_OPS").ok().and_then(|v| v.parse().ok()).unwrap_or(1_000_000)
}

#[derive(Clone, Copy)]
struct Handle(*mut skv_cache);
// SAFETY: a libskv handle may be used from any thread.
unsafe impl Send for Handle {}
// SAFETY: libskv serializes the calls on one handle (the threads of a test share it).
unsafe impl Sync for Handle {}

fn new_cache(rows: u32, pages: u64) -> Handle {
    let cfg = skv_cache_config {
        struct_size: std::mem::size_of::<skv_cache_config>() as u32,
        page_size: PS,
        num_token_slots: pages * PS as u64,
        num_rows: rows,
        max_context_len: 256,
        flags: 0,
        swa_num_token_slots: 0,
        ..Default::default()
    };
    let mut c = null_mut();
    // SAFETY: valid pointers.
    assert_eq!(unsafe { skv_cache_new(&cfg, &mut c) }, SKV_OK);
    Handle(c)
}

struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (z ^ (z >> 31)) % n
    }
}

#[derive(Default)]
struct Counts {
    ops: AtomicU64,
    state: AtomicU64,
    oom: AtomicU64,
    hits: AtomicU64,
}

/// Statuses a well-behaved engine may see under contention.
fn expect(st: skv_status, what: &str, allowed: &[skv_status], counts: &Counts) {
    counts.ops.fetch_add(1, Ordering::Relaxed);
    match st {
        SKV_ERR_STATE => {
            counts.state.fetch_add(1, Ordering::Relaxed);
        }
        SKV_ERR_OUT_OF_MEMORY => {
            counts.oom.fetch_add(1, Ordering::Relaxed);
        }
        _ => {}
    }
    assert!(st == SKV_OK || allowed.contains(&st), "{what}: {st:?} ({})", common::last_error());
}

/// One engine thread: turns of shared sessions, each with its own req; first turns allocate a
/// row, later turns come through skv_match_prefix; some turns abort, some sessions are released.
fn worker(c: Handle, seed: u64, ops: u64) -> Counts {
    let counts = &Counts::default();
    let c = c.0;
    let mut rng = Rng(seed);
    let mut tree: Vec<Vec<i32>> = Vec::new();
    while counts.ops.load(Ordering::Relaxed) < ops {
        let session = rng.below(SESSIONS);
        // SAFETY: a live handle and valid pointers throughout.
        unsafe {
            match rng.below(20) {
                0 => {
                    let st = skv_release_session(c, session);
                    expect(st, "release_session", &[SKV_ERR_STATE], counts);
                }
                1 => {
                    let n = PS * (1 + rng.below(2) as u32);
                    let mut out = vec![0i32; n as usize];
                    let st = skv_pool_alloc(c, n, out.as_mut_ptr());
                    expect(st, "pool_alloc", &[SKV_ERR_OUT_OF_MEMORY], counts);
                    if st == SKV_OK {
                        tree.push(out);
                    }
                }
                2 if !tree.is_empty() => {
                    let g = tree.swap_remove(rng.below(tree.len() as u64) as usize);
                    expect(skv_pool_free(c, g.as_ptr(), g.len()), "pool_free", &[], counts);
                }
                3 => {
                    let mut h = std::mem::zeroed::<skv_held>();
                    expect(skv_session_held(c, std::ptr::null(), 0, &mut h), "session_held", &[], counts);
                    let mut s = std::mem::zeroed::<skv_stats>();
                    expect(skv_cache_stats(c, &mut s), "stats", &[], counts);
                }
                _ => turn(c, session, &mut rng, counts),
            }
        }
    }
    for g in tree {
        // SAFETY: as above.
        expect(unsafe { skv_pool_free(c, g.as_ptr(), g.len()) }, "pool_free at the end", &[], counts);
    }
    Counts {
        ops: counts.ops.load(Ordering::Relaxed).into(),
        state: counts.state.load(Ordering::Relaxed).into(),
        oom: counts.oom.load(Ordering::Relaxed).into(),
        hits: counts.hits.load(Ordering::Relaxed).into(),
    }
}

fn add(total: &Counts, c: Counts) {
    total.ops.fetch_add(c.ops.into_inner(), Ordering::Relaxed);
    total.state.fetch_add(c.state.into_inner(), Ordering::Relaxed);
    total.oom.fetch_add(c.oom.into_inner(), Ordering::Relaxed);
    total.hits.fetch_add(c.hits.into_inner(), Ordering::Relaxed);
}

/// One turn of `session`, start to finish, on this thread's own req.
///
/// # Safety
/// `c` must be a live handle (as for the two helpers below).
unsafe fn turn(c: *mut skv_cache, session: u64, rng: &mut Rng, counts: &Counts) {
    let mut r = skv_req::default();
    let mut m = skv_match { hit: 0, prefix_len: 0 };
    let history = 8 + rng.below(40) as u32;
    r.origin_input_len = history;
    // SAFETY: c is live by this function's contract; r and m are locals.
    let st = unsafe { skv_match_prefix(c, session, 0, &mut r, history - 1, 0, &mut m) };
    // Another thread's request holds the slot: not this turn's.
    expect(st, "match_prefix", &[SKV_ERR_STATE], counts);
    if st != SKV_OK {
        return;
    }
    if m.hit == 1 {
        counts.hits.fetch_add(1, Ordering::Relaxed);
    } else {
        // SAFETY: as above.
        let st = unsafe { skv_alloc_row(c, &mut r) };
        expect(st, "alloc_row", &[SKV_ERR_OUT_OF_MEMORY], counts);
        if st != SKV_OK {
            return;
        }
    }
    let prompt = history.max(r.kv_allocated_len) - r.kv_allocated_len;
    // SAFETY: c is live by this function's contract.
    let mut ok = unsafe { extend_commit(c, &mut r, prompt, counts) };
    let max_new = 1 + rng.below(12) as u32;
    while ok && r.output_len < max_new {
        let accepted = rng.below(3) as u32;
        // SAFETY: as above.
        ok = unsafe { extend_commit_spec(c, &mut r, accepted, counts) };
    }
    let aborted = !ok || rng.below(10) == 0;
    if !aborted {
        r.finished_len = r.output_len.min(max_new) as i32;
    }
    // SAFETY: as for the match above.
    let st = unsafe { skv_cache_finished_req(c, session, 0, &mut r, aborted as u32) };
    // A first turn finishing into a slot another thread created meanwhile is refused: the
    // engine then frees its request's row itself.
    expect(st, "finished_req", &[SKV_ERR_STATE], counts);
    if st != SKV_OK {
        assert_eq!(m.hit, 0, "a restored turn's finish was refused: {}", common::last_error());
        // SAFETY: as above.
        expect(unsafe { skv_free_req(c, &mut r) }, "free_req after a refused finish", &[], counts);
    }
}

/// # Safety
/// `c` must be a live handle.
unsafe fn extend_commit(c: *mut skv_cache, r: &mut skv_req, n: u32, counts: &Counts) -> bool {
    if r.kv_allocated_len + n > 256 {
        return false;
    }
    // SAFETY: c is live by this function's contract; out_loc is NULL.
    let st = unsafe { skv_alloc_extend(c, r, n, std::ptr::null_mut()) };
    expect(st, "alloc_extend", &[SKV_ERR_OUT_OF_MEMORY], counts);
    if st != SKV_OK {
        return false;
    }
    // SAFETY: as above.
    expect(unsafe { skv_commit(c, r, r.kv_allocated_len - r.kv_committed_len) }, "commit", &[], counts);
    true
}

/// A verify round: KV for 2 drafts + the bonus token, `accepted` + 1 kept.
///
/// # Safety
/// `c` must be a live handle.
unsafe fn extend_commit_spec(c: *mut skv_cache, r: &mut skv_req, accepted: u32, counts: &Counts) -> bool {
    if r.kv_allocated_len + 3 > 256 {
        return false;
    }
    // SAFETY: c is live by this function's contract; out_loc is NULL.
    let st = unsafe { skv_alloc_extend(c, r, 3, std::ptr::null_mut()) };
    expect(st, "alloc_extend", &[SKV_ERR_OUT_OF_MEMORY], counts);
    if st != SKV_OK {
        return false;
    }
    // SAFETY: as above.
    expect(unsafe { skv_commit(c, r, accepted + 1) }, "commit", &[], counts);
    r.output_len += accepted + 1;
    // SAFETY: as above.
    expect(unsafe { skv_free_tail(c, r, r.kv_committed_len) }, "free_tail", &[], counts);
    true
}

/// Releases every session and checks that every page and row is free and the audit clean.
fn audit_empty(c: Handle, sessions: u64) {
    // SAFETY: a live handle, no call in flight.
    unsafe {
        for s in 0..sessions {
            assert_eq!(skv_release_session(c.0, s), SKV_OK, "release_session({s}): {}", common::last_error());
        }
        let mut rep = std::mem::zeroed::<skv_check_report>();
        assert_eq!(skv_cache_check(c.0, &mut rep), SKV_OK);
        assert_eq!(rep.violations, 0, "audit: {:?}", std::ffi::CStr::from_ptr(rep.first_violation.as_ptr()));
        let mut st = std::mem::zeroed::<skv_stats>();
        assert_eq!(skv_cache_stats(c.0, &mut st), SKV_OK);
        assert_eq!(st.free_pages, st.total_pages - 1, "pages left in use: {st:?}");
        assert_eq!(st.free_rows, st.total_rows, "rows left in use: {st:?}");
        assert_eq!(st.sessions, 0);
        assert_eq!(rep.pages_free, st.total_pages - 1);
        skv_cache_free(c.0);
    }
}

fn report(name: &str, counts: &Counts, secs: f64) {
    let ops = counts.ops.load(Ordering::Relaxed);
    println!(
        "{name}: {ops} calls in {secs:.2} s ({:.0}/s); STATE {}, OUT_OF_MEMORY {}, match hits {}",
        ops as f64 / secs,
        counts.state.load(Ordering::Relaxed),
        counts.oom.load(Ordering::Relaxed),
        counts.hits.load(Ordering::Relaxed)
    );
}

#[test]
fn eight_threads_share_one_handle_and_its_sessions() {
    let ops = total_ops();
    // Rows for every session slot plus each thread's running request; pages enough to run
    // out now and then.
    let c = new_cache(SESSIONS as u32 + THREADS as u32, 160);
    let counts = Counts::default();
    let t0 = std::time::Instant::now();
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let counts = &counts;
            s.spawn(move || add(counts, worker(c, 0x5eed + t as u64, ops / THREADS as u64)));
        }
    });
    report("one handle, 8 threads", &counts, t0.elapsed().as_secs_f64());
    assert!(counts.ops.load(Ordering::Relaxed) >= ops);
    assert!(counts.state.load(Ordering::Relaxed) > 0, "sessions shared between threads must collide sometimes");
    assert!(counts.hits.load(Ordering::Relaxed) > 0);
    assert!(counts.oom.load(Ordering::Relaxed) > 0, "the pool must run out now and then");
    audit_empty(c, SESSIONS);
}

#[test]
fn eight_handles_in_parallel() {
    let ops = total_ops();
    let counts = Counts::default();
    let t0 = std::time::Instant::now();
    let handles: Vec<Handle> = (0..THREADS).map(|_| new_cache(SESSIONS as u32 + 1, 120)).collect();
    std::thread::scope(|s| {
        for (t, &c) in handles.iter().enumerate() {
            let counts = &counts;
            s.spawn(move || add(counts, worker(c, 0xbeef + t as u64, ops / THREADS as u64)));
        }
    });
    report("8 handles, a thread each", &counts, t0.elapsed().as_secs_f64());
    assert!(counts.ops.load(Ordering::Relaxed) >= ops);
    for c in handles {
        audit_empty(c, SESSIONS);
    }
}
