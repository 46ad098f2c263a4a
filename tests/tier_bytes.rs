//! The host tier moves real bytes: the device and host pools are byte arrays, every forward
//! writes its tokens' KV (a tag of session and position) into the slots libskv handed out, and
//! `copy_pages` only queues its copies. Queued copies run later, ticket by ticket, in a seeded
//! shuffled order, with other sessions' forwards writing in between; a restored session's
//! forward waits for its own ticket only. Every hit then compares every position it reuses,
//! in both pools. A page freed (and handed to another session) before a copy that reads it
//! ran shows up as a wrong tag; so does a restore read before its copy.

#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

mod common;

use std::cell::RefCell;
use std::ffi::{c_int, c_void};
use std::ptr::null_mut;

use common::last_error;
use skv::skv_status::*;
use skv::*;

struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (z ^ (z >> 31)) % n.max(1)
    }
}

/// One queued page copy: `(swa pool, src page, dst page)`.
type Copy = (bool, i32, i32);

#[derive(Default)]
struct Queue {
    /// `(ticket, direction, copies)` in the order libskv asked.
    pending: Vec<(u64, u32, Vec<Copy>)>,
    fail_next: bool,
}

extern "C" fn copy_pages(
    user_data: *mut c_void,
    ticket: u64,
    direction: u32,
    src: *const i32,
    dst: *const i32,
    n_full: usize,
    n_swa: usize,
) -> c_int {
    // SAFETY: user_data is the test's queue, alive while the handle is.
    let q = unsafe { &*(user_data as *const RefCell<Queue>) };
    let mut q = q.borrow_mut();
    if std::mem::take(&mut q.fail_next) {
        return -1;
    }
    let n = n_full + n_swa;
    // SAFETY: libskv passes n readable values in each array.
    let (src, dst) = unsafe { (std::slice::from_raw_parts(src, n), std::slice::from_raw_parts(dst, n)) };
    let copies = (0..n).map(|i| (i >= n_full, src[i], dst[i])).collect();
    q.pending.push((ticket, direction, copies));
    0
}

struct World {
    c: *mut skv_cache,
    ps: u32,
    swa: bool,
    dev: [Vec<u32>; 2],
    host: [Vec<u32>; 2],
    queue: Box<RefCell<Queue>>,
    /// Tokens each session's slot holds (0: none).
    len: Vec<u32>,
    rng: Rng,
    restores: u64,
    checked: u64,
}

fn tag(session: usize, pos: u32, swa: bool) -> u32 {
    ((session as u32) << 20 | pos) + 1 + (swa as u32) * 0x8000_0000
}

impl World {
    fn new(ps: u32, swa: bool, seed: u64) -> World {
        let (dev_pages, host_pages) = (48u64, 64u64);
        let cfg = skv_cache_config {
            struct_size: std::mem::size_of::<skv_cache_config>() as u32,
            page_size: ps,
            num_token_slots: dev_pages * ps as u64,
            num_rows: 24,
            max_context_len: 24 * ps,
            swa_num_token_slots: if swa { dev_pages * ps as u64 } else { 0 },
            host_num_token_slots: host_pages * ps as u64,
            host_swa_num_token_slots: if swa { host_pages * ps as u64 } else { 0 },
            tier_idle_steps: 2,
            tier_min_tokens: 0,
            tier_pages_per_step: 8,
            ..Default::default()
        };
        let mut c = null_mut();
        // SAFETY: valid pointers.
        assert_eq!(unsafe { skv_cache_new(&cfg, &mut c) }, SKV_OK, "{}", last_error());
        let queue = Box::new(RefCell::new(Queue::default()));
        let hooks = skv_engine_hooks {
            struct_size: std::mem::size_of::<skv_engine_hooks>() as u32,
            copy_pages: Some(copy_pages),
            ..Default::default()
        };
        // SAFETY: the queue outlives the handle (both live in the World, the handle freed first).
        let s = unsafe { skv_cache_set_hooks(c, &hooks, &*queue as *const _ as *mut c_void) };
        assert_eq!(s, SKV_OK, "{}", last_error());
        let slots = |pages: u64| vec![0u32; (pages * ps as u64) as usize];
        World {
            c,
            ps,
            swa,
            dev: [slots(dev_pages), slots(if swa { dev_pages } else { 0 })],
            host: [slots(host_pages), slots(if swa { host_pages } else { 0 })],
            queue,
            len: vec![0; 12],
            rng: Rng(seed),
            restores: 0,
            checked: 0,
        }
    }

    /// Runs ticket `t`'s queued copies (reading the pools as they are now) and completes it.
    fn complete(&mut self, t: u64) {
        let mut q = self.queue.borrow_mut();
        let Some(at) = q.pending.iter().position(|p| p.0 == t) else {
            drop(q);
            // A ticket with no copies (a park of a clean session never has one).
            return self.done(t, 0);
        };
        let (_, dir, mut copies) = q.pending.remove(at);
        drop(q);
        // The copies of one ticket run in any order: shuffle them.
        for i in (1..copies.len()).rev() {
            copies.swap(i, self.rng.below(i as u64 + 1) as usize);
        }
        let ps = self.ps as usize;
        for (swa, src, dst) in copies {
            let p = swa as usize;
            for k in 0..ps {
                let (s, d) = (src as usize * ps + k, dst as usize * ps + k);
                match dir {
                    SKV_COPY_TO_HOST => self.host[p][d] = self.dev[p][s],
                    _ => self.dev[p][d] = self.host[p][s],
                }
            }
        }
        self.done(t, 0);
    }

    fn done(&mut self, t: u64, status: i32) {
        // SAFETY: a live handle.
        assert_eq!(unsafe { skv_ticket_done(self.c, t, status) }, SKV_OK, "ticket {t}: {}", last_error());
    }

    /// Completes a random open ticket (out of issue order).
    fn complete_some(&mut self) {
        let n = self.queue.borrow().pending.len();
        if n > 0 {
            let t = self.queue.borrow().pending[self.rng.below(n as u64) as usize].0;
            self.complete(t);
        }
    }

    fn check_bytes(&mut self, s: usize, row: i32, upto: u32) {
        let mut full = vec![0i32; upto as usize];
        // SAFETY: a live handle; full holds upto values.
        assert_eq!(unsafe { skv_row_indices(self.c, row, 0, upto, full.as_mut_ptr()) }, SKV_OK, "{}", last_error());
        for (p, &slot) in full.iter().enumerate() {
            assert_eq!(self.dev[0][slot as usize], tag(s, p as u32, false), "session {s} position {p}: full pool");
        }
        if self.swa {
            let mut ids = vec![0i32; upto as usize];
            // SAFETY: as above.
            let st = unsafe { skv_row_swa_indices(self.c, row, 0, upto, ids.as_mut_ptr()) };
            assert_eq!(st, SKV_OK, "{}", last_error());
            for (p, &slot) in ids.iter().enumerate().filter(|(_, &x)| x != 0) {
                assert_eq!(self.dev[1][slot as usize], tag(s, p as u32, true), "session {s} position {p}: SWA pool");
            }
        }
        self.checked += upto as u64;
    }

    /// One turn of session `s`: match (restoring from host if parked), check the reused KV,
    /// prefill what was lost and `new` tokens, finish.
    fn turn(&mut self, s: usize, new: u32) {
        if self.len[s] + new > 24 * self.ps {
            // The conversation is done: its slot goes, wherever it is (parked included).
            // SAFETY: a live handle.
            assert_eq!(unsafe { skv_release_session(self.c, s as u64) }, SKV_OK, "{}", last_error());
            self.len[s] = 0;
        }
        let mut r = common::fresh_req();
        let mut m = skv_tier_match { struct_size: std::mem::size_of::<skv_tier_match>() as u32, ..Default::default() };
        // SAFETY: a live handle and locals.
        let st = unsafe { skv_match_prefix_tier(self.c, s as u64, 0, &mut r, self.len[s], 0, &mut m) };
        assert_eq!(st, SKV_OK, "{}", last_error());
        if m.hit == 1 {
            if m.ticket != 0 && self.rng.below(4) == 0 {
                // The request is dropped before its restore's copy ran: the copy still writes
                // the pages it was given, so they must not go to another session meanwhile.
                // SAFETY: a live handle and a local.
                assert_eq!(unsafe { skv_cache_finished_req(self.c, s as u64, 0, &mut r, 1) }, SKV_OK);
                self.len[s] = 0;
                return;
            }
            if m.ticket != 0 {
                self.restores += 1;
                self.complete(m.ticket);
            }
            self.check_bytes(s, r.req_pool_idx, m.prefix_len);
        } else {
            // SAFETY: as above.
            let st = unsafe { skv_alloc_row(self.c, &mut r) };
            assert_eq!(st, SKV_OK, "{}", last_error());
        }
        let from = r.kv_allocated_len;
        let to = self.len[s].max(from) + new;
        let mut out = vec![0i32; (to - from) as usize];
        loop {
            // SAFETY: out holds to - from values.
            let st = unsafe { skv_alloc_extend(self.c, &mut r, to - from, out.as_mut_ptr()) };
            if st == SKV_OK {
                break;
            }
            assert_eq!(st, SKV_ERR_OUT_OF_MEMORY, "{}", last_error());
            let mut e =
                skv_tier_evicted { struct_size: std::mem::size_of::<skv_tier_evicted>() as u32, ..Default::default() };
            let pages = 2 * (to - from) as u64 / self.ps as u64 + 2;
            // SAFETY: as above.
            let st = unsafe { skv_tier_evict(self.c, pages, 0, &mut e) };
            assert_eq!(st, SKV_OK, "{}", last_error());
            if e.freed_pages + e.draining_pages == 0 && self.queue.borrow().pending.is_empty() {
                // Nothing left to evict: this turn is dropped.
                // SAFETY: as above.
                assert_eq!(unsafe { skv_cache_finished_req(self.c, s as u64, 0, &mut r, 1) }, SKV_OK);
                self.len[s] = 0;
                return;
            }
            self.complete_some();
        }
        for (i, &slot) in out.iter().enumerate() {
            self.dev[0][slot as usize] = tag(s, from + i as u32, false);
        }
        if self.swa {
            let mut ids = vec![0i32; (to - from) as usize];
            // SAFETY: as above.
            let st = unsafe { skv_row_swa_indices(self.c, r.req_pool_idx, from, to, ids.as_mut_ptr()) };
            assert_eq!(st, SKV_OK, "{}", last_error());
            for (i, &slot) in ids.iter().enumerate() {
                self.dev[1][slot as usize] = tag(s, from + i as u32, true);
            }
        }
        // SAFETY: as above.
        assert_eq!(unsafe { skv_commit(self.c, &mut r, to - r.kv_committed_len) }, SKV_OK, "{}", last_error());
        (r.origin_input_len, r.output_len, r.finished_len) = (to, 0, 0);
        // SAFETY: as above.
        assert_eq!(unsafe { skv_cache_finished_req(self.c, s as u64, 0, &mut r, 0) }, SKV_OK, "{}", last_error());
        self.len[s] = to;
    }

    fn audit(&self) {
        let mut rep = skv_check_report::default();
        // SAFETY: a live handle and a local.
        assert_eq!(unsafe { skv_cache_check(self.c, &mut rep) }, SKV_OK);
        assert_eq!(rep.violations, 0, "{}", rep.first_violation_text());
    }

    fn run(&mut self, turns: usize) {
        for i in 0..turns {
            let s = self.rng.below(self.len.len() as u64) as usize;
            let new = 1 + self.rng.below(2 * self.ps as u64) as u32;
            self.turn(s, new);
            match self.rng.below(6) {
                0 | 1 => {
                    let (mut pages, mut t) = (0, 0);
                    // SAFETY: a live handle and locals.
                    assert_eq!(unsafe { skv_tier_step(self.c, &mut pages, &mut t) }, SKV_OK, "{}", last_error());
                }
                2 => self.complete_some(),
                4 if self.rng.below(3) == 0 => {
                    // A conversation ends while its write-back may still be queued.
                    let p = self.rng.below(self.len.len() as u64);
                    // SAFETY: a live handle.
                    let st = unsafe { skv_release_session(self.c, p) };
                    assert!([SKV_OK, SKV_ERR_STATE].contains(&st), "{}", last_error());
                    if st == SKV_OK {
                        self.len[p as usize] = 0;
                    }
                }
                3 => {
                    let p = self.rng.below(self.len.len() as u64);
                    let mut t = 0;
                    // SAFETY: as above.
                    let st = unsafe { skv_session_park(self.c, p, 0, &mut t) };
                    assert!(
                        [SKV_OK, SKV_ERR_NOT_FOUND, SKV_ERR_STATE, SKV_ERR_OUT_OF_MEMORY].contains(&st),
                        "{}",
                        last_error()
                    );
                }
                _ => {}
            }
            if i % 16 == 0 {
                self.audit();
            }
        }
        while !self.queue.borrow().pending.is_empty() {
            self.complete_some();
        }
        self.audit();
    }
}

impl Drop for World {
    fn drop(&mut self) {
        // SAFETY: the handle is live and freed once.
        unsafe { skv_cache_free(self.c) };
    }
}

fn run(ps: u32, swa: bool) {
    let (mut restores, mut checked) = (0, 0);
    for seed in 0..6 {
        let mut w = World::new(ps, swa, seed);
        w.run(400);
        let mut st = skv_tier_stats { struct_size: std::mem::size_of::<skv_tier_stats>() as u32, ..Default::default() };
        // SAFETY: a live handle and a local.
        assert_eq!(unsafe { skv_cache_tier_stats(w.c, &mut st) }, SKV_OK);
        assert_eq!(st.open_tickets, 0);
        assert_eq!(st.host_draining_pages + st.draining_pages + st.swa_draining_pages, 0, "{st:?}");
        assert!(st.parks > 0 && st.writebacks > 0, "the workload parks and writes back: {st:?}");
        restores += w.restores;
        checked += w.checked;
    }
    assert!(restores > 20, "the workload restores parked sessions ({restores})");
    assert!(checked > 2_000 * ps as u64, "positions checked: {checked}");
}

#[test]
fn bytes_survive_park_and_restore_page_size_1() {
    run(1, false);
}

#[test]
fn bytes_survive_park_and_restore_page_size_16() {
    run(16, false);
}

#[test]
fn bytes_survive_park_and_restore_hybrid() {
    run(16, true);
    run(4, true);
}

/// Reads a unit's page ids (full, then SWA) from its header's counts (byte form v1).
fn unit_ids(unit: &[u8]) -> (Vec<i32>, Vec<i32>) {
    let u32_at = |at: usize| u32::from_ne_bytes(unit[at..at + 4].try_into().unwrap());
    let (hlen, nf, ns) = (u16::from_ne_bytes([unit[10], unit[11]]) as usize, u32_at(80) as usize, u32_at(84) as usize);
    let id = |k: usize| i32::from_ne_bytes(unit[hlen + 4 * k..hlen + 4 * k + 4].try_into().unwrap());
    ((0..nf).map(id).collect(), (nf..nf + ns).map(id).collect())
}

/// Sessions move from one handle to another with their bytes: the source exports (from the
/// device, or from the host tier when parked), the destination imports, the engine copies
/// page by page between the two worlds' pools, both tickets complete, the source releases,
/// and the destination's hit reads every position back.
fn moves(ps: u32, swa: bool) {
    let mut a = World::new(ps, swa, 7);
    let mut b = World::new(ps, swa, 8);
    for s in 0..6 {
        a.turn(s, 3 * ps + s as u32);
        a.turn(s, ps / 2 + 1);
    }
    // Sessions 1 and 4 parked first: their units name host pages.
    for s in [1u64, 4] {
        let mut t = 0;
        // SAFETY: a live handle and a local.
        assert_eq!(unsafe { skv_session_park(a.c, s, 0, &mut t) }, SKV_OK, "{}", last_error());
        a.complete(t);
    }
    let mut moved = 0u64;
    for s in 0..6usize {
        let mut len = 0usize;
        let mut t = 0u64;
        // SAFETY: a live handle; (NULL, 0) asks the size.
        let st = unsafe { skv_session_export(a.c, s as u64, 0, 0, null_mut(), 0, &mut len, &mut t) };
        assert_eq!((st, t), (SKV_ERR_BUFFER, 0), "the size asked, nothing pinned");
        let mut unit = vec![0u8; len];
        // SAFETY: unit holds len bytes.
        let st = unsafe { skv_session_export(a.c, s as u64, 0, 0, unit.as_mut_ptr(), len, &mut len, &mut t) };
        assert_eq!(st, SKV_OK, "{}", last_error());
        let parked = unit[12] & 1 == 1;
        assert_eq!(parked, s == 1 || s == 4, "a parked session's unit names host pages");
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
        let (src_full, src_swa) = unit_ids(&unit);
        let mut out = vec![0i32; src_full.len() + src_swa.len()];
        let (mut n, mut ti) = (0usize, 0u64);
        loop {
            // SAFETY: a live handle; unit and out hold what their lengths say.
            let st = unsafe {
                skv_session_import(b.c, &spec, unit.as_ptr(), unit.len(), out.as_mut_ptr(), out.len(), &mut n, &mut ti)
            };
            if st == SKV_OK {
                break;
            }
            // The destination makes room as under any pressure: parks and evictions.
            assert_eq!(st, SKV_ERR_OUT_OF_MEMORY, "{}", last_error());
            let mut e =
                skv_tier_evicted { struct_size: std::mem::size_of::<skv_tier_evicted>() as u32, ..Default::default() };
            // SAFETY: a live handle and a local.
            assert_eq!(unsafe { skv_tier_evict(b.c, out.len() as u64, 0, &mut e) }, SKV_OK, "{}", last_error());
            while !b.queue.borrow().pending.is_empty() {
                b.complete_some();
            }
            assert!(e.parked + e.released + e.copying > 0, "the destination had room to make");
        }
        assert_eq!(n, out.len());
        // The engine's copy: every layer of each page (one tag a token slot here).
        let from = if parked { &a.host } else { &a.dev };
        let pairs = src_full.iter().zip(&out).map(|(&x, &y)| (0, x, y));
        let pairs = pairs.chain(src_swa.iter().zip(&out[src_full.len()..]).map(|(&x, &y)| (1, x, y)));
        for (pool, x, y) in pairs {
            for k in 0..ps as usize {
                b.dev[pool][y as usize * ps as usize + k] = from[pool][x as usize * ps as usize + k];
            }
        }
        a.done(t, 0);
        b.done(ti, 0);
        // SAFETY: a live handle: the source lets the session go once the destination has it.
        assert_eq!(unsafe { skv_release_session(a.c, s as u64) }, SKV_OK, "{}", last_error());
        b.len[s] = a.len[s];
        moved += a.len[s] as u64;
        a.len[s] = 0;
        let before = b.checked;
        b.turn(s, 2);
        assert_eq!(b.checked - before, b.len[s] as u64 - 2, "the hit reused every moved position");
    }
    a.audit();
    b.audit();
    assert_eq!(b.checked, moved, "every moved position read back");
}

#[test]
fn sessions_move_between_handles_with_their_bytes() {
    moves(1, false);
    moves(16, false);
    moves(16, true);
}
