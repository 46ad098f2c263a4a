//! The host tier's calls, each timed on its own through the C ABI, the way an engine makes
//! them: round-robin over `N` sessions of 4,096 tokens (page size 16: 256 pages each), owned
//! mode, every pass touching each session once before the next. `copy_pages` only counts what
//! it is asked (the copies themselves are the engine's, and aside here).
//!
//! - `restore`: `skv_match_prefix_tier` of a parked session: 256 device pages taken, mapped
//!   into its row, the copy asked for, the row pinned under a new ticket.
//! - `write-back`: `skv_session_park` of a session on the device without a host copy: 256
//!   host pages taken, the copy asked for, the row pinned.
//! - `park`: `skv_ticket_done` of that write-back: the host copy is clean and the session
//!   parks, its 256 device pages freed.
//! - `export`: `skv_session_export` of a session on the device: its 1,128-byte unit written,
//!   its row pinned under a new ticket.
//! - `import`: `skv_session_import` of that unit into a second handle: a row and 256 pages
//!   taken, their ids written out, the slot recorded under a new ticket.
//!
//! Between passes, untimed: each restore's ticket completes and its request is handed back.
//! `cargo bench --bench tier` runs 1,000 and 100,000 sessions (`SKV_BENCH_SESSIONS` lists
//! others); `cargo test --benches` runs 16 as a smoke test.

#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

use std::ffi::{c_int, c_void};
use std::hint::black_box;
use std::ptr::null_mut;
use std::time::Instant;

mod common;

use common::{check, clock_overhead_ns};
use skv::*;

const PS: u32 = 16;
const TOKENS: u32 = 4096;
const PAGES: u64 = (TOKENS / PS) as u64;

extern "C" fn copy_pages(
    ud: *mut c_void,
    _t: u64,
    _dir: u32,
    _src: *const i32,
    _dst: *const i32,
    n_full: usize,
    n_swa: usize,
) -> c_int {
    // SAFETY: ud is the bench's counter, alive while the handle is.
    unsafe { *(ud as *mut u64) += (n_full + n_swa) as u64 };
    0
}

/// A 4,096-token session's unit: the 104-byte header and 256 page ids.
const UNIT_BYTES: usize = 104 + 4 * PAGES as usize;

/// Room for `n` sessions on the device and in the host tier.
fn config(n: usize) -> skv_cache_config {
    skv_cache_config {
        struct_size: std::mem::size_of::<skv_cache_config>() as u32,
        page_size: PS,
        num_token_slots: (n as u64 * PAGES + 2) * PS as u64,
        num_rows: n as u32,
        max_context_len: TOKENS,
        host_num_token_slots: (n as u64 * PAGES + 2) * PS as u64,
        ..Default::default()
    }
}

struct Bed {
    c: *mut skv_cache,
    copied: Box<u64>,
    reqs: Vec<skv_req>,
}

impl Bed {
    fn new(n: usize) -> Bed {
        let mut c = null_mut();
        // SAFETY: valid pointers.
        check(unsafe { skv_cache_new(&config(n), &mut c) }, "skv_cache_new");
        let mut copied = Box::new(0u64);
        let hooks = skv_engine_hooks {
            struct_size: std::mem::size_of::<skv_engine_hooks>() as u32,
            copy_pages: Some(copy_pages),
            ..Default::default()
        };
        // SAFETY: the counter outlives the handle (both in the Bed; the handle freed first).
        check(unsafe { skv_cache_set_hooks(c, &hooks, &mut *copied as *mut u64 as *mut c_void) }, "hooks");
        let mut bed = Bed { c, copied, reqs: vec![skv_req::default(); n] };
        for s in 0..n {
            let mut r = skv_req::default();
            // SAFETY: a live handle and a local.
            unsafe {
                check(skv_req_init(&mut r), "init");
                check(skv_alloc_row(c, &mut r), "alloc_row");
                check(skv_alloc_extend(c, &mut r, TOKENS, null_mut()), "extend");
                check(skv_commit(c, &mut r, TOKENS), "commit");
                r.origin_input_len = TOKENS;
                check(skv_cache_finished_req(c, s as u64, 0, &mut r, 0), "finish");
            }
        }
        // Every session parked: written back, then its device pages dropped.
        let tickets: Vec<u64> = (0..n).map(|s| bed.park(s)).collect();
        tickets.into_iter().for_each(|t| bed.done(t));
        bed
    }

    /// A handle as `new`'s, with no session.
    fn empty(n: usize) -> Bed {
        let mut c = null_mut();
        // SAFETY: valid pointers.
        check(unsafe { skv_cache_new(&config(n), &mut c) }, "skv_cache_new");
        Bed { c, copied: Box::new(0), reqs: Vec::new() }
    }

    fn export(&mut self, s: usize, unit: &mut Vec<u8>) -> u64 {
        unit.resize(UNIT_BYTES, 0);
        let (mut len, mut t) = (0usize, 0u64);
        // SAFETY: a live handle; unit holds UNIT_BYTES bytes.
        let st = unsafe { skv_session_export(self.c, s as u64, 0, 0, unit.as_mut_ptr(), unit.len(), &mut len, &mut t) };
        check(st, "export");
        assert_eq!(len, UNIT_BYTES);
        t
    }

    fn import(&mut self, s: usize, unit: &[u8]) -> u64 {
        let spec = skv_import {
            struct_size: std::mem::size_of::<skv_import>() as u32,
            flags: 0,
            session_id: s as u64,
            branch_id: 0,
            row: -1,
            n_prefix: 0,
            prefix_indices: std::ptr::null(),
            lock_node: 0,
            lock_receipt: 0,
            aux_state: -1,
            aux_track: [-1, -1],
            tokens: std::ptr::null(),
            n_tokens: 0,
        };
        let mut out = [0i32; PAGES as usize];
        let (mut n, mut t) = (0usize, 0u64);
        // SAFETY: a live handle; unit and out hold what their lengths say.
        let st = unsafe {
            skv_session_import(self.c, &spec, unit.as_ptr(), unit.len(), out.as_mut_ptr(), out.len(), &mut n, &mut t)
        };
        check(st, "import");
        t
    }

    fn park(&mut self, s: usize) -> u64 {
        let mut t = 0;
        // SAFETY: a live handle and a local.
        check(unsafe { skv_session_park(self.c, s as u64, 0, &mut t) }, "park");
        t
    }

    fn done(&mut self, t: u64) {
        // SAFETY: a live handle.
        check(unsafe { skv_ticket_done(self.c, t, 0) }, "ticket_done");
    }

    fn restore(&mut self, s: usize) -> u64 {
        let r = &mut self.reqs[s];
        // SAFETY: a live handle and locals.
        unsafe { check(skv_req_init(r), "init") };
        let mut m = skv_tier_match { struct_size: std::mem::size_of::<skv_tier_match>() as u32, ..Default::default() };
        // SAFETY: as above.
        check(unsafe { skv_match_prefix_tier(self.c, s as u64, 0, r, TOKENS, 0, &mut m) }, "restore");
        assert_eq!((m.hit, m.restored_pages as u64), (1, PAGES), "a whole session restored");
        m.ticket
    }

    fn hand_back(&mut self, s: usize) {
        // SAFETY: a live handle and its req.
        check(unsafe { skv_hand_back(self.c, s as u64, 0, &mut self.reqs[s]) }, "hand_back");
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        // SAFETY: the handle is live and freed once.
        unsafe { skv_cache_free(self.c) };
    }
}

/// Times `op` on each session in turn; returns the per-call times in ns.
fn pass<T>(bed: &mut Bed, n: usize, overhead: u64, mut op: impl FnMut(&mut Bed, usize) -> T) -> (Vec<u64>, Vec<T>) {
    let mut times = Vec::with_capacity(n);
    let mut out = Vec::with_capacity(n);
    for s in 0..n {
        let t0 = Instant::now();
        let v = black_box(op(bed, s));
        times.push((t0.elapsed().as_nanos() as u64).saturating_sub(overhead));
        out.push(v);
    }
    (times, out)
}

fn main() {
    let bench = std::env::args().any(|a| a == "--bench");
    let sizes: Vec<usize> = match std::env::var("SKV_BENCH_SESSIONS") {
        Ok(list) => list.split(',').map(|s| s.trim().parse().expect("SKV_BENCH_SESSIONS")).collect(),
        Err(_) if bench => vec![1_000, 100_000],
        Err(_) => vec![16],
    };
    let overhead = clock_overhead_ns();
    println!("host tier, owned mode, page size {PS}, sessions of {TOKENS} tokens ({PAGES} pages), round-robin");
    println!("clock overhead {overhead} ns (subtracted)");
    println!("{:<12} {:>9} {:>8} {:>8} {:>10}", "op", "sessions", "p50 ns", "p99 ns", "ns / page");
    for n in sizes {
        let mut bed = Bed::new(n);
        let rounds = if bench { (400_000 / n).clamp(3, 40) } else { 2 };
        let mut all: [Vec<u64>; 5] = Default::default();
        let mut dst = Bed::empty(n);
        let mut units = vec![Vec::new(); n];
        for _ in 0..rounds {
            let (t, tickets) = pass(&mut bed, n, overhead, |b, s| b.restore(s));
            all[0].extend(t);
            for (s, t) in tickets.into_iter().enumerate() {
                bed.done(t);
                bed.hand_back(s);
            }
            let (t, tickets) = pass(&mut bed, n, overhead, |b, s| b.park(s));
            all[1].extend(t);
            let (t, _) = pass(&mut bed, n, overhead, |b, s| b.done(tickets[s]));
            all[2].extend(t);
            // Export every session (restored to the device first, untimed), import each unit
            // into the second handle, then put both handles back as they were.
            for (s, t) in (0..n).map(|s| (s, bed.restore(s))).collect::<Vec<_>>() {
                bed.done(t);
                bed.hand_back(s);
            }
            let (t, tickets) = pass(&mut bed, n, overhead, |b, s| b.export(s, &mut units[s]));
            all[3].extend(t);
            tickets.into_iter().for_each(|t| bed.done(t));
            let (t, tickets) = pass(&mut dst, n, overhead, |b, s| b.import(s, &units[s]));
            all[4].extend(t);
            for (s, t) in tickets.into_iter().enumerate() {
                dst.done(t);
                // SAFETY: a live handle.
                check(unsafe { skv_release_session(dst.c, s as u64) }, "release");
            }
            let tickets: Vec<u64> = (0..n).map(|s| bed.park(s)).collect();
            tickets.into_iter().for_each(|t| bed.done(t));
        }
        for (name, mut v) in ["restore", "write-back", "park", "export", "import"].into_iter().zip(all) {
            v.sort_unstable();
            let (p50, p99) = (v[v.len() / 2], v[v.len() * 99 / 100]);
            println!("{name:<12} {n:>9} {p50:>8} {p99:>8} {:>10.2}", p50 as f64 / PAGES as f64);
        }
        let mut rep = skv_check_report::default();
        // SAFETY: a live handle and a local.
        check(unsafe { skv_cache_check(bed.c, &mut rep) }, "check");
        assert_eq!(rep.violations, 0, "{}", rep.first_violation_text());
        // Per round each session is restored twice and written back twice; once more to start.
        assert_eq!(*bed.copied, PAGES * n as u64 * (4 * rounds as u64 + 1), "pages copied");
    }
}
