//! Host memory of owned mode with 100,000 held sessions, measured by a counting global
//! allocator (every Rust allocation of this binary, the library's included, goes
//! through it). The bound: holding sessions grows host memory by at most 4 bytes per
//! mapped page plus 96 bytes per session slot.
//!
//! `cargo test --release --test memory -- --nocapture` prints the numbers.

// As in the library: every unsafe block says why it is sound.
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::ffi::CStr;
use std::sync::atomic::{AtomicIsize, Ordering::Relaxed};

use skv::*;

struct Counting;

/// Bytes requested and not yet freed.
static LIVE: AtomicIsize = AtomicIsize::new(0);
/// What malloc really set aside for them (its size classes round small requests up).
static USABLE: AtomicIsize = AtomicIsize::new(0);

fn usable(p: *mut u8) -> isize {
    // SAFETY: p is a live block from System, which is malloc on this platform.
    unsafe { libc::malloc_usable_size(p.cast()) as isize }
}

fn count(p: *mut u8, size: usize) {
    if !p.is_null() {
        LIVE.fetch_add(size as isize, Relaxed);
        USABLE.fetch_add(usable(p), Relaxed);
    }
}

// SAFETY: forwards to System unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        // SAFETY: our caller's contract for l is the one System needs.
        let p = unsafe { System.alloc(l) };
        count(p, l.size());
        p
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        // SAFETY: as in alloc.
        let p = unsafe { System.alloc_zeroed(l) };
        count(p, l.size());
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size() as isize, Relaxed);
        USABLE.fetch_sub(usable(p), Relaxed);
        // SAFETY: p came from System (alloc and realloc above forward to it) with layout l.
        unsafe { System.dealloc(p, l) };
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new_size: usize) -> *mut u8 {
        let old = usable(p);
        // SAFETY: as in dealloc, and our caller's contract for new_size is System's.
        let q = unsafe { System.realloc(p, l, new_size) };
        if !q.is_null() {
            LIVE.fetch_add(new_size as isize - l.size() as isize, Relaxed);
            USABLE.fetch_add(usable(q) - old, Relaxed);
        }
        q
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const PAGE_SIZE: u32 = 16;
const SESSIONS: u32 = 100_000;
/// Engine-held pages every session of the shared layout adopts as its protected prefix.
const SHARED_PAGES: u32 = 2;
/// Allocations that may outlive a cache: the calling thread's last-error buffer.
const SLACK: isize = 4096;

fn live() -> isize {
    LIVE.load(Relaxed)
}

fn check(st: skv_status, what: &str) {
    if let Err(e) = st.ok() {
        panic!("{what}: {e}");
    }
}

fn config(rows: u32, pages: u64, max_context_len: u32) -> skv_cache_config {
    skv_cache_config {
        struct_size: std::mem::size_of::<skv_cache_config>() as u32,
        page_size: PAGE_SIZE,
        num_token_slots: pages * u64::from(PAGE_SIZE),
        num_rows: rows,
        max_context_len,
        flags: 0,
        swa_num_token_slots: 0,
        ..Default::default()
    }
}

fn new_cache(cfg: &skv_cache_config) -> *mut skv_cache {
    let mut cache = std::ptr::null_mut();
    // SAFETY: cfg is a reference and cache a local.
    check(unsafe { skv_cache_new(cfg, &mut cache) }, "skv_cache_new");
    cache
}

/// Bytes live while a fresh cache of `cfg` exists; all of them go with skv_cache_free.
fn fixed_cost(cfg: &skv_cache_config) -> isize {
    let before = live();
    let cache = new_cache(cfg);
    let held = live() - before;
    // SAFETY: the handle created above, freed once.
    unsafe { skv_cache_free(cache) };
    let leaked = live() - before;
    assert!(leaked <= SLACK, "skv_cache_free left {leaked} bytes allocated");
    held
}

/// How one run lays out its sessions.
struct SessionLayout {
    name: &'static str,
    shared_prefix: bool,
    own_pages: fn(u32) -> u32,
}

struct Held {
    name: &'static str,
    fixed: isize,
    growth: isize,
    /// The same growth as malloc's blocks hold it.
    growth_usable: isize,
    /// Page entries of all session rows: shared prefix pages count once per row.
    mapped: u64,
    slots: u64,
}

fn hold_sessions(layout: &SessionLayout) -> Held {
    let own: u64 = (0..SESSIONS).map(|i| u64::from((layout.own_pages)(i))).sum();
    let shared = if layout.shared_prefix { SHARED_PAGES } else { 0 };
    let cfg = config(SESSIONS + 16, 1 + own + u64::from(shared) + 64, 4096);

    let before = live();
    let cache = new_cache(&cfg);
    let fixed = live() - before;

    // The engine's prefix tree holds a cached prompt prefix that every session adopts.
    let mut prefix = [0i32; (SHARED_PAGES * PAGE_SIZE) as usize];
    if shared > 0 {
        // SAFETY: a live handle; prefix holds the shared * PAGE_SIZE indices asked for.
        let st = unsafe { skv_pool_alloc(cache, shared * PAGE_SIZE, prefix.as_mut_ptr()) };
        check(st, "skv_pool_alloc");
    }
    let (start, start_usable) = (live(), USABLE.load(Relaxed));
    for i in 0..SESSIONS {
        let mut req = skv_req::default();
        let tokens = (layout.own_pages)(i) * PAGE_SIZE;
        // SAFETY: a live handle; req is a local; prefix holds the shared * PAGE_SIZE indices
        // passed.
        unsafe {
            check(skv_alloc_row(cache, &mut req), "skv_alloc_row");
            if shared > 0 {
                let st = skv_map_prefix(cache, &mut req, prefix.as_ptr(), shared * PAGE_SIZE);
                check(st, "skv_map_prefix");
            }
            check(skv_alloc_extend(cache, &mut req, tokens, std::ptr::null_mut()), "skv_alloc_extend");
            check(skv_commit(cache, &mut req, tokens), "skv_commit");
            req.origin_input_len = req.kv_allocated_len;
            let st = skv_cache_finished_req(cache, u64::from(i), 0, &mut req, 0);
            check(st, "skv_cache_finished_req");
        }
    }
    let (growth, growth_usable) = (live() - start, USABLE.load(Relaxed) - start_usable);

    // The cache agrees on what it holds, and everything goes back.
    // SAFETY: a live handle, freed once at the end; stats and report are plain integers (all
    // zero is valid) written by libskv, which NUL-terminates first_violation; prefix is passed
    // with its length.
    unsafe {
        let mut stats: skv_stats = std::mem::zeroed();
        check(skv_cache_stats(cache, &mut stats), "skv_cache_stats");
        assert_eq!(stats.used_pages, own + u64::from(shared));
        assert_eq!(stats.sessions, u64::from(SESSIONS));
        let mut report: skv_check_report = std::mem::zeroed();
        check(skv_cache_check(cache, &mut report), "skv_cache_check");
        let first = CStr::from_ptr(report.first_violation.as_ptr()).to_string_lossy();
        assert_eq!(report.violations, 0, "audit: {first}");
        assert_eq!(report.pages_in_rows, own);
        assert_eq!(report.pages_engine_held, u64::from(shared));

        for i in 0..SESSIONS {
            check(skv_release_session(cache, u64::from(i)), "skv_release_session");
        }
        if shared > 0 {
            let st = skv_pool_free(cache, prefix.as_ptr(), prefix.len());
            check(st, "skv_pool_free");
        }
        check(skv_cache_stats(cache, &mut stats), "skv_cache_stats");
        assert_eq!(stats.free_pages, stats.total_pages - 1);
        assert_eq!(stats.sessions, 0);
        skv_cache_free(cache);
    }
    let leaked = live() - before;
    assert!(leaked <= SLACK, "{}: {leaked} bytes still allocated after skv_cache_free", layout.name);

    Held {
        name: layout.name,
        fixed,
        growth,
        growth_usable,
        mapped: own + u64::from(shared) * u64::from(SESSIONS),
        slots: u64::from(SESSIONS),
    }
}

#[test]
fn held_sessions_cost_at_most_4_bytes_per_page_and_96_per_slot() {
    // First use of the thread's last-error state happens before any measurement.
    let _ = fixed_cost(&config(8, 64, 64));

    // The handle's fixed cost, split by varying one dimension at a time.
    let (rows, pages) = (SESSIONS + 16, 400_000u64);
    let base = fixed_cost(&config(rows, pages, 4096));
    let more_rows = fixed_cost(&config(2 * rows, pages, 4096));
    let more_pages = fixed_cost(&config(rows, 2 * pages, 4096));
    let longer_rows = fixed_cost(&config(rows, pages, 8 * 4096));
    let per_row = (more_rows - base) as f64 / f64::from(rows);
    let per_pool_page = (more_pages - base) as f64 / pages as f64;
    // Rows are page lists: a longer max_context_len must not cost memory up front.
    assert!(
        (longer_rows - base).abs() <= SLACK,
        "fixed cost grew from {base} to {longer_rows} bytes with max_context_len x8"
    );

    let layouts = [
        SessionLayout { name: "3 own pages each", shared_prefix: false, own_pages: |_| 3 },
        SessionLayout {
            name: "2 shared + 1..8 own pages (64 every 100th)",
            shared_prefix: true,
            own_pages: |i| if i % 100 == 0 { 64 } else { 1 + i % 8 },
        },
    ];
    let held: Vec<Held> = layouts.iter().map(hold_sessions).collect();

    println!("owned mode, page size {PAGE_SIZE}, host bytes counted by the global allocator");
    println!(
        "skv_cache_new, {rows} rows, {pages} pool pages: {base} B = {per_row:.1} B per row \
         + {per_pool_page:.2} B per pool page; with max_context_len x8: {longer_rows} B"
    );
    println!("holding {SESSIONS} sessions grows that by:");
    for h in &held {
        let bound = 4 * h.mapped as isize + 96 * h.slots as isize;
        println!(
            "  {}: {} B over {} mapped pages = {:.1} B per slot ({:.1} in malloc blocks); \
             bound 4 B/page + 96 B/slot = {} B; with the fixed cost {:.1} B per slot",
            h.name,
            h.growth,
            h.mapped,
            h.growth as f64 / h.slots as f64,
            h.growth_usable as f64 / h.slots as f64,
            bound,
            (h.fixed + h.growth) as f64 / h.slots as f64,
        );
    }
    // Two layouts with the same slot count but different page counts split the growth.
    let (a, b) = (&held[0], &held[1]);
    let per_page = (b.growth - a.growth) as f64 / (b.mapped as f64 - a.mapped as f64);
    let per_slot = (a.growth as f64 - per_page * a.mapped as f64) / a.slots as f64;
    println!("  split by the two layouts: {per_page:.2} B per mapped page + {per_slot:.1} B per session slot");

    for h in &held {
        let bound = 4 * h.mapped as isize + 96 * h.slots as isize;
        assert!(
            h.growth <= bound,
            "{}: holding {} sessions over {} mapped pages grew host memory by {} B, bound {} B",
            h.name,
            h.slots,
            h.mapped,
            h.growth,
            bound
        );
    }
}
