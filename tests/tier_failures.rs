//! The host tier's failure paths change nothing, and its outcomes are the documented ones.
//!
//! A failing call is checked against a twin: two handles given the same calls, one of them
//! also the failing call. Everything observable must then agree: skv_cache_stats,
//! skv_tier_stats, skv_session_where of every session, the audit, the tickets and page ids of
//! the next copies, and (at the end) the device page ids the pool hands out next. Then the
//! tensor-parallel lockstep: two handles given the same 20,000 random calls agree after every
//! call.

#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

mod common;

use std::cell::RefCell;
use std::ffi::{c_int, c_void};
use std::ptr::null_mut;

use common::last_error;
use skv::skv_status::*;
use skv::*;

const SESSIONS: u64 = 8;

/// One `copy_pages` call: `(ticket, direction, src, dst, n_full)`.
type Copy = (u64, u32, Vec<i32>, Vec<i32>, usize);

#[derive(Default)]
struct Engine {
    /// Copies queued and not yet completed.
    pending: Vec<Copy>,
    /// Every copy asked for, in order.
    log: Vec<Copy>,
    fail_next: bool,
    locks: Vec<u64>,
    aux: Vec<i64>,
}

fn eng<'a>(ud: *mut c_void) -> std::cell::RefMut<'a, Engine> {
    // SAFETY: user_data is the harness's engine, alive while its handle is.
    unsafe { &*(ud as *const RefCell<Engine>) }.borrow_mut()
}

extern "C" fn copy_pages(
    ud: *mut c_void,
    ticket: u64,
    direction: u32,
    src: *const i32,
    dst: *const i32,
    n_full: usize,
    n_swa: usize,
) -> c_int {
    let mut e = eng(ud);
    if std::mem::take(&mut e.fail_next) {
        return -1;
    }
    let n = n_full + n_swa;
    // SAFETY: libskv passes n readable values in each array.
    let (src, dst) = unsafe { (std::slice::from_raw_parts(src, n), std::slice::from_raw_parts(dst, n)) };
    let c = (ticket, direction, src.to_vec(), dst.to_vec(), n_full);
    e.pending.push(c.clone());
    e.log.push(c);
    0
}

extern "C" fn dec_lock_ref(ud: *mut c_void, node: u64, _receipt: u64) -> c_int {
    eng(ud).locks.push(node);
    0
}

extern "C" fn free_aux(ud: *mut c_void, aux: i64) -> c_int {
    eng(ud).aux.push(aux);
    0
}

/// Everything a failing call must leave as it was.
#[derive(PartialEq, Debug)]
struct Snap {
    stats: skv_stats,
    tier: skv_tier_stats,
    wheres: Vec<skv_where>,
}

struct H {
    c: *mut skv_cache,
    e: Box<RefCell<Engine>>,
    ps: u32,
}

fn config(host_pages: u64) -> skv_cache_config {
    skv_cache_config {
        struct_size: std::mem::size_of::<skv_cache_config>() as u32,
        page_size: 4,
        num_token_slots: 64 * 4,
        num_rows: 10,
        max_context_len: 64,
        host_num_token_slots: host_pages * 4,
        tier_idle_steps: if host_pages > 0 { 1 } else { 0 },
        tier_pages_per_step: if host_pages > 0 { 64 } else { 0 },
        ..Default::default()
    }
}

impl H {
    fn new(cfg: skv_cache_config) -> H {
        Self::with_hooks(cfg, true)
    }

    fn with_hooks(cfg: skv_cache_config, copy: bool) -> H {
        let mut c = null_mut();
        // SAFETY: valid pointers.
        assert_eq!(unsafe { skv_cache_new(&cfg, &mut c) }, SKV_OK, "{}", last_error());
        let e = Box::new(RefCell::new(Engine::default()));
        let hooks = skv_engine_hooks {
            struct_size: std::mem::size_of::<skv_engine_hooks>() as u32,
            dec_lock_ref: Some(dec_lock_ref),
            free_aux: Some(free_aux),
            copy_pages: if copy { Some(copy_pages) } else { None },
        };
        // SAFETY: the engine outlives the handle (both live in H, the handle freed first).
        let st = unsafe { skv_cache_set_hooks(c, &hooks, &*e as *const _ as *mut c_void) };
        assert_eq!(st, SKV_OK, "{}", last_error());
        H { c, e, ps: cfg.page_size }
    }

    fn snap(&self) -> Snap {
        let mut stats = skv_stats::default();
        // SAFETY: a live handle and a local.
        assert_eq!(unsafe { skv_cache_stats(self.c, &mut stats) }, SKV_OK);
        self.audit();
        Snap { stats, tier: self.tier(), wheres: (0..SESSIONS).map(|s| self.at(s)).collect() }
    }

    fn audit(&self) {
        let mut rep = skv_check_report::default();
        // SAFETY: a live handle and a local.
        assert_eq!(unsafe { skv_cache_check(self.c, &mut rep) }, SKV_OK);
        assert_eq!(rep.violations, 0, "{}", rep.first_violation_text());
    }

    fn tier(&self) -> skv_tier_stats {
        let mut t = skv_tier_stats { struct_size: std::mem::size_of::<skv_tier_stats>() as u32, ..Default::default() };
        // SAFETY: a live handle and a local.
        assert_eq!(unsafe { skv_cache_tier_stats(self.c, &mut t) }, SKV_OK);
        t
    }

    fn at(&self, sid: u64) -> skv_where {
        let mut w = skv_where { struct_size: std::mem::size_of::<skv_where>() as u32, ..Default::default() };
        // SAFETY: a live handle and a local.
        assert_eq!(unsafe { skv_session_where(self.c, sid, 0, &mut w) }, SKV_OK);
        w
    }

    fn match_tier(&mut self, sid: u64, key: u32, r: &mut skv_req) -> (skv_status, skv_tier_match) {
        let mut m = skv_tier_match { struct_size: std::mem::size_of::<skv_tier_match>() as u32, ..Default::default() };
        // SAFETY: a live handle and locals.
        let st = unsafe { skv_match_prefix_tier(self.c, sid, 0, r, key, 0, &mut m) };
        (st, m)
    }

    /// A turn of `sid`: tiered match (its restore completed ok), `new` tokens, finish. Returns
    /// the match.
    fn turn(&mut self, sid: u64, new: u32, lock: Option<(u64, i64)>) -> skv_tier_match {
        let mut r = common::fresh_req();
        let key = self.at(sid).tokens;
        let (st, m) = self.match_tier(sid, key, &mut r);
        assert_eq!(st, SKV_OK, "{}", last_error());
        if m.ticket != 0 {
            self.complete(m.ticket, 0);
        }
        if m.hit == 0 {
            // SAFETY: a live handle and a local.
            assert_eq!(unsafe { skv_alloc_row(self.c, &mut r) }, SKV_OK, "{}", last_error());
            if let Some((node, aux)) = lock {
                (r.lock_node, r.lock_receipt, r.aux_state) = (node, node, aux);
            }
        }
        self.extend_finish(sid, &mut r, new);
        m
    }

    fn extend_finish(&mut self, sid: u64, r: &mut skv_req, new: u32) {
        // SAFETY: a live handle and a local; out_loc NULL.
        assert_eq!(unsafe { skv_alloc_extend(self.c, r, new, null_mut()) }, SKV_OK, "{}", last_error());
        let k = r.kv_allocated_len - r.kv_committed_len;
        // SAFETY: as above.
        assert_eq!(unsafe { skv_commit(self.c, r, k) }, SKV_OK, "{}", last_error());
        (r.origin_input_len, r.output_len, r.finished_len) = (r.kv_committed_len, 0, 0);
        // SAFETY: as above.
        assert_eq!(unsafe { skv_cache_finished_req(self.c, sid, 0, r, 0) }, SKV_OK, "{}", last_error());
    }

    fn step(&mut self) -> (skv_status, u64, u64) {
        let (mut pages, mut t) = (0, 0);
        // SAFETY: a live handle and locals.
        let st = unsafe { skv_tier_step(self.c, &mut pages, &mut t) };
        (st, pages, t)
    }

    fn park(&mut self, sid: u64) -> (skv_status, u64) {
        let mut t = 0;
        // SAFETY: a live handle and a local.
        let st = unsafe { skv_session_park(self.c, sid, 0, &mut t) };
        (st, t)
    }

    fn evict(&mut self, pages: u64, flags: u32) -> (skv_status, skv_tier_evicted) {
        let mut e =
            skv_tier_evicted { struct_size: std::mem::size_of::<skv_tier_evicted>() as u32, ..Default::default() };
        // SAFETY: a live handle and a local.
        let st = unsafe { skv_tier_evict(self.c, pages, flags, &mut e) };
        (st, e)
    }

    fn done(&mut self, t: u64, status: i32) -> skv_status {
        self.e.borrow_mut().pending.retain(|c| c.0 != t);
        // SAFETY: a live handle.
        unsafe { skv_ticket_done(self.c, t, status) }
    }

    fn complete(&mut self, t: u64, status: i32) {
        assert_eq!(self.done(t, status), SKV_OK, "ticket {t}: {}", last_error());
    }

    /// Completes every queued copy, in ticket order.
    fn complete_all(&mut self) {
        let mut ts: Vec<u64> = self.e.borrow().pending.iter().map(|c| c.0).collect();
        ts.sort_unstable();
        for t in ts {
            self.complete(t, 0);
        }
    }

    fn fail_next(&self) {
        self.e.borrow_mut().fail_next = true;
    }

    /// Takes every free device page: the ids the pool hands out next, in order.
    fn next_pages(&mut self) -> Vec<i32> {
        let st = self.snap().stats;
        // With an SWA pool each page takes an SWA page too.
        let free = st.free_pages.min(if st.swa_total_pages > 0 { st.swa_free_pages } else { u64::MAX }) as u32;
        let mut out = vec![0i32; (free * self.ps) as usize];
        // SAFETY: a live handle; out holds free * ps values.
        assert_eq!(unsafe { skv_pool_alloc(self.c, free * self.ps, out.as_mut_ptr()) }, SKV_OK, "{}", last_error());
        out.into_iter().step_by(self.ps as usize).collect()
    }

    fn host_used(&self) -> u64 {
        let t = self.tier();
        t.host_total_pages - 1 - t.host_free_pages - t.host_draining_pages
    }
}

impl Drop for H {
    fn drop(&mut self) {
        // SAFETY: the handle is live and freed once.
        unsafe { skv_cache_free(self.c) };
    }
}

/// Two handles of one config given the same setup.
fn twin(cfg: skv_cache_config, setup: impl Fn(&mut H)) -> (H, H) {
    let (mut a, mut b) = (H::new(cfg), H::new(cfg));
    setup(&mut a);
    setup(&mut b);
    same(&a, &b);
    (a, b)
}

/// Everything observable agrees, the copies asked for included.
fn same(a: &H, b: &H) {
    assert_eq!(a.snap(), b.snap());
    assert_eq!(a.e.borrow().log, b.e.borrow().log, "copy_pages' tickets and pages");
    assert_eq!((&a.e.borrow().locks, &a.e.borrow().aux), (&b.e.borrow().locks, &b.e.borrow().aux));
}

/// Completes everything on both and compares the pages they hand out next.
fn finally_same(mut a: H, mut b: H) {
    a.complete_all();
    b.complete_all();
    same(&a, &b);
    assert_eq!(a.next_pages(), b.next_pages(), "the device pages handed out next");
}

/// Sessions 0..4 finished with 10, 20, 6 and 14 tokens (dirty: never written back).
fn four(h: &mut H) {
    for (s, n) in [(0, 10), (1, 20), (2, 6), (3, 14)] {
        h.turn(s, n, Some((100 + s, 10 + s as i64)));
    }
}

/// `four`, written back by a step and completed: every session has a clean host copy.
fn four_clean(h: &mut H) {
    four(h);
    let (st, pages, t) = h.step();
    assert_eq!((st, pages > 0), (SKV_OK, true), "{}", last_error());
    h.complete(t, 0);
    for s in 0..4 {
        assert_eq!(h.at(s).place, SKV_PLACE_BOTH, "session {s}");
    }
}

/// A failing call on `a` only, then the same call on both: `call` returns its status.
fn fails_then_runs(cfg: skv_cache_config, setup: impl Fn(&mut H), call: impl Fn(&mut H) -> skv_status) {
    let (mut a, mut b) = twin(cfg, setup);
    a.fail_next();
    assert_eq!(call(&mut a), SKV_ERR_CALLBACK, "copy_pages refused: {}", last_error());
    assert!(last_error().contains("nothing changed"), "{}", last_error());
    same(&a, &b);
    assert_eq!(call(&mut a), SKV_OK, "{}", last_error());
    assert_eq!(call(&mut b), SKV_OK, "{}", last_error());
    same(&a, &b);
    finally_same(a, b);
}

#[test]
fn refused_copy_in_step_changes_nothing() {
    fails_then_runs(config(48), four, |h| h.step().0);
}

#[test]
fn refused_copy_in_park_changes_nothing() {
    fails_then_runs(config(48), four, |h| h.park(1).0);
}

#[test]
fn refused_copy_in_evict_changes_nothing() {
    fails_then_runs(config(48), four, |h| h.evict(100, 0).0);
}

#[test]
fn refused_copy_in_restore_changes_nothing() {
    let setup = |h: &mut H| {
        four_clean(h);
        assert_eq!(h.park(1), (SKV_OK, 0));
    };
    let (mut a, mut b) = twin(config(48), setup);
    let mut r = common::fresh_req();
    let before = r;
    a.fail_next();
    assert_eq!(a.match_tier(1, 20, &mut r).0, SKV_ERR_CALLBACK, "{}", last_error());
    assert_eq!(r, before, "the req is as it was");
    same(&a, &b);
    for h in [&mut a, &mut b] {
        let mut r = common::fresh_req();
        let (st, m) = h.match_tier(1, 20, &mut r);
        assert_eq!((st, m.hit, m.prefix_len), (SKV_OK, 1, 20), "{}", last_error());
        h.complete(m.ticket, 0);
        h.extend_finish(1, &mut r, 3);
    }
    same(&a, &b);
    finally_same(a, b);
}

#[test]
fn failed_write_back_keeps_the_session_on_the_device() {
    let mut h = H::new(config(48));
    four(&mut h);
    let (st, pages, t) = h.step();
    assert_eq!((st, pages), (SKV_OK, 14), "10 + 20 + 6 + 14 tokens in 3 + 5 + 2 + 4 pages");
    for s in 0..4 {
        assert_eq!(h.at(s).state, SKV_WHERE_COPYING);
    }
    h.complete(t, 1);
    let ts = h.tier();
    assert_eq!((ts.failed_copies, ts.writebacks, h.host_used(), ts.open_tickets), (4, 0, 0, 0), "{ts:?}");
    for s in 0..4 {
        let w = h.at(s);
        assert_eq!((w.place, w.state, w.host_pages), (SKV_PLACE_DEVICE, 0, 0), "session {s}: {w:?}");
    }
    // A later step writes them back again.
    let (st, pages2, t2) = h.step();
    assert_eq!((st, pages2), (SKV_OK, 14));
    assert!(t2 > t);
    h.complete(t2, 0);
    for s in 0..4 {
        assert_eq!(h.at(s).place, SKV_PLACE_BOTH);
    }
    assert_eq!(h.tier().writebacks, 4);
}

/// Sessions 0..4 clean, session 1 parked and its restore's copy failed: `(handle, req)`.
fn failed_restore() -> (H, skv_req, Copy) {
    let mut h = H::new(config(48));
    four_clean(&mut h);
    assert_eq!(h.park(1), (SKV_OK, 0));
    let host = h.at(1).host_pages;
    let mut r = common::fresh_req();
    let (st, m) = h.match_tier(1, 20, &mut r);
    assert_eq!((st, m.hit, m.restored_pages), (SKV_OK, 1, 5), "{}", last_error());
    let copy = h.e.borrow().log.last().cloned().unwrap();
    assert_eq!(copy.0, m.ticket);
    h.complete(m.ticket, 1);
    let w = h.at(1);
    assert_eq!(w.state & (SKV_WHERE_FAILED | SKV_WHERE_IN_FLIGHT), SKV_WHERE_FAILED | SKV_WHERE_IN_FLIGHT, "{w:?}");
    assert_eq!((w.host_pages, h.tier().failed_copies), (host, 1));
    // Its request cannot finish: the KV never arrived.
    let (before, snap) = (r, h.snap());
    r.output_len = 1;
    let mut fin = r;
    // SAFETY: a live handle and a local.
    assert_eq!(unsafe { skv_cache_finished_req(h.c, 1, 0, &mut fin, 0) }, SKV_ERR_STATE);
    assert_eq!((fin, h.snap()), (r, snap));
    (h, before, copy)
}

#[test]
fn failed_restore_hands_back_to_the_host() {
    let (mut h, mut r, first) = failed_restore();
    // SAFETY: a live handle and a local.
    assert_eq!(unsafe { skv_hand_back(h.c, 1, 0, &mut r) }, SKV_OK, "{}", last_error());
    let w = h.at(1);
    assert_eq!((w.place, w.state, w.tokens), (SKV_PLACE_HOST, 0, 20), "{w:?}");
    h.audit();
    // Restored again: the same host pages are read, into the row the match gives.
    let mut r = common::fresh_req();
    let (st, m) = h.match_tier(1, 20, &mut r);
    assert_eq!((st, m.hit, m.prefix_len), (SKV_OK, 1, 20));
    let again = h.e.borrow().log.last().cloned().unwrap();
    assert_eq!((again.1, &again.2), (SKV_COPY_TO_DEVICE, &first.2), "the host copy is intact");
    let mut idx = vec![0i32; 20];
    // SAFETY: a live handle; idx holds 20 values.
    assert_eq!(unsafe { skv_row_indices(h.c, r.req_pool_idx, 0, 20, idx.as_mut_ptr()) }, SKV_OK);
    let pages: Vec<i32> = idx.iter().step_by(4).map(|i| i / 4).collect();
    assert_eq!(pages, again.3, "the restored row maps the copy's destinations");
    h.complete(m.ticket, 0);
    h.extend_finish(1, &mut r, 2);
    assert_eq!(h.at(1).place, SKV_PLACE_DEVICE);
    h.audit();
}

#[test]
fn failed_restore_aborted_releases_it() {
    let (h, mut r, _) = failed_restore();
    let locks = h.e.borrow().locks.len();
    // SAFETY: a live handle and a local.
    assert_eq!(unsafe { skv_cache_finished_req(h.c, 1, 0, &mut r, 1) }, SKV_OK, "{}", last_error());
    assert_eq!(h.at(1).place, SKV_PLACE_NONE);
    assert_eq!(h.e.borrow().locks[locks..], [101], "its lock goes back");
    let ts = h.tier();
    assert_eq!((ts.parked_sessions, h.host_used()), (0, h.at(0).host_pages + h.at(2).host_pages + h.at(3).host_pages));
    h.audit();
}

#[test]
fn park_during_write_back_leaves_at_completion() {
    let mut h = H::new(config(48));
    four(&mut h);
    // A park of a dirty session starts its write-back and leaves when it completes.
    let (st, t) = h.park(1);
    assert_eq!(st, SKV_OK);
    assert_ne!(t, 0);
    let w = h.at(1);
    assert_eq!((w.place, w.state, w.ticket), (SKV_PLACE_DEVICE, SKV_WHERE_COPYING | SKV_WHERE_LEAVING, t));
    let snap = h.snap();
    assert_eq!(h.park(1).0, SKV_ERR_STATE, "being copied");
    assert_eq!(h.snap(), snap);
    h.complete(t, 0);
    let w = h.at(1);
    assert_eq!((w.place, w.state, w.device_pages), (SKV_PLACE_HOST, 0, 0), "{w:?}");
    // An eviction while a step's write-back runs: the session leaves when it completes.
    let (_, _, t) = h.step();
    assert_ne!(t, 0);
    let (st, e) = h.evict(3, 0);
    assert_eq!((st, e.copying, e.ticket), (SKV_OK, 1, 0), "{e:?}");
    let w = h.at(0);
    assert_eq!(w.state, SKV_WHERE_COPYING | SKV_WHERE_LEAVING, "{w:?}");
    h.complete(t, 0);
    assert_eq!(h.at(0).place, SKV_PLACE_HOST);
    assert_eq!(h.at(2).place, SKV_PLACE_BOTH, "not asked to leave");
}

/// Session 0 clean, 1 being written back, 2 dirty, 3 short (below tier_min_tokens).
fn evict_setup() -> (H, u64) {
    let mut cfg = config(48);
    cfg.tier_min_tokens = 8;
    let mut h = H::new(cfg);
    h.turn(0, 12, None);
    let (_, _, t0) = h.step();
    h.complete(t0, 0);
    h.turn(1, 12, None);
    let (_, _, t1) = h.step();
    assert_ne!(t1, 0);
    h.turn(2, 12, None);
    h.turn(3, 4, None);
    (h, t1)
}

#[test]
fn evict_parks_joins_writes_back_and_releases() {
    let (mut h, t1) = evict_setup();
    let (st, e) = h.evict(1000, 0);
    assert_eq!(st, SKV_OK);
    assert_eq!((e.parked, e.copying, e.released, e.freed_pages, e.draining_pages), (1, 2, 1, 3 + 1, 3 + 3), "{e:?}");
    assert!(e.ticket > t1);
    let places: Vec<u32> = (0..4).map(|s| h.at(s).place).collect();
    assert_eq!(places, [SKV_PLACE_HOST, SKV_PLACE_DEVICE, SKV_PLACE_DEVICE, SKV_PLACE_NONE]);
    assert_eq!(h.at(1).state & SKV_WHERE_LEAVING, SKV_WHERE_LEAVING);
    assert_eq!(h.at(2).state & SKV_WHERE_LEAVING, SKV_WHERE_LEAVING);
    h.complete_all();
    let places: Vec<u32> = (0..4).map(|s| h.at(s).place).collect();
    assert_eq!(places, [SKV_PLACE_HOST; 3].into_iter().chain([SKV_PLACE_NONE]).collect::<Vec<_>>());
    h.audit();
}

#[test]
fn evict_without_copies_releases_dirty_sessions() {
    let (mut h, _) = evict_setup();
    let (st, e) = h.evict(1000, SKV_EVICT_NO_COPY);
    assert_eq!(st, SKV_OK);
    assert_eq!((e.parked, e.copying, e.released, e.ticket), (1, 1, 2, 0), "{e:?}");
    let places: Vec<u32> = (0..4).map(|s| h.at(s).place).collect();
    assert_eq!(places, [SKV_PLACE_HOST, SKV_PLACE_DEVICE, SKV_PLACE_NONE, SKV_PLACE_NONE]);
    h.complete_all();
    h.audit();
}

#[test]
fn sessions_below_break_even_are_never_written_back() {
    let mut cfg = config(48);
    cfg.tier_min_tokens = 12;
    let mut h = H::new(cfg);
    h.turn(0, 11, None);
    h.turn(1, 12, None);
    for _ in 0..10 {
        let (st, _, t) = h.step();
        assert_eq!(st, SKV_OK);
        if t != 0 {
            h.complete(t, 0);
        }
    }
    assert_eq!((h.at(0).place, h.at(0).host_pages), (SKV_PLACE_DEVICE, 0));
    assert_eq!(h.at(1).place, SKV_PLACE_BOTH);
    assert_eq!(h.tier().writebacks, 1);
}

#[test]
fn host_eviction_is_lru_and_only_when_full() {
    // 5 host pages: page 0 and two 2-page copies.
    let mut h = H::new(config(5));
    h.turn(0, 8, Some((100, 7)));
    h.turn(1, 8, Some((101, 8)));
    for s in 0..2 {
        let (st, t) = h.park(s);
        assert_eq!(st, SKV_OK);
        h.complete(t, 0);
    }
    assert_eq!((h.tier().host_free_pages, h.tier().host_evictions), (0, 0), "no eviction while there is room");
    h.turn(2, 8, None);
    let (st, t) = h.park(2);
    assert_eq!(st, SKV_OK, "{}", last_error());
    // Session 0's copy was the least recently used: the parked session went whole.
    assert_eq!((h.at(0).place, h.at(1).place), (SKV_PLACE_NONE, SKV_PLACE_HOST));
    assert_eq!((h.e.borrow().locks.clone(), h.e.borrow().aux.clone()), (vec![100], vec![7]));
    assert_eq!(h.tier().host_evictions, 1);
    h.complete(t, 0);
    h.audit();
}

#[test]
fn host_eviction_of_a_clean_device_copy_drops_the_copy_only() {
    let mut h = H::new(config(5));
    h.turn(0, 8, Some((100, 7)));
    h.turn(1, 8, None);
    let (_, pages, t) = h.step();
    assert_eq!(pages, 4);
    h.complete(t, 0);
    assert_eq!((h.at(0).place, h.at(1).place, h.tier().host_free_pages), (SKV_PLACE_BOTH, SKV_PLACE_BOTH, 0));
    h.turn(2, 8, None);
    let (_, pages, t) = h.step();
    assert_eq!(pages, 2);
    h.complete(t, 0);
    let w0 = h.at(0);
    assert_eq!((w0.place, w0.host_pages, w0.device_pages), (SKV_PLACE_DEVICE, 0, 2), "{w0:?}");
    assert_eq!((h.at(1).place, h.at(2).place), (SKV_PLACE_BOTH, SKV_PLACE_BOTH));
    assert_eq!(h.tier().host_evictions, 1);
    assert!(h.e.borrow().locks.is_empty(), "the session stays: its lock too");
    h.audit();
}

#[test]
fn plain_match_of_a_parked_session_is_refused() {
    let (mut a, mut b) = twin(config(48), |h| {
        four_clean(h);
        assert_eq!(h.park(1), (SKV_OK, 0));
    });
    let mut r = common::fresh_req();
    let mut m = skv_match { hit: 7, prefix_len: 7 };
    // SAFETY: a live handle and locals.
    assert_eq!(unsafe { skv_match_prefix(a.c, 1, 0, &mut r, 20, 0, &mut m) }, SKV_ERR_STATE);
    assert_eq!((r, m.hit, m.prefix_len), (common::fresh_req(), 7, 7));
    same(&a, &b);
    // The req's own checks come first (docs/refusals.md, skv_match_prefix 5 and 6).
    r.kv_committed_len = 1;
    // SAFETY: as above.
    assert_eq!(unsafe { skv_match_prefix(a.c, 1, 0, &mut r, 20, 0, &mut m) }, SKV_ERR_INVALID_ARG);
    same(&a, &b);
    a.turn(5, 4, None);
    b.turn(5, 4, None);
    finally_same(a, b);
}

#[test]
fn a_stale_req_holding_a_parked_row_is_refused_before_any_copy() {
    let (mut a, b) = twin(config(48), |h| {
        four_clean(h);
        assert_eq!(h.park(1), (SKV_OK, 0));
    });
    // A stale copy of session 1's last req: it names the row the parked slot keeps.
    let row = (0..10).find(|&r| a.at(1).device_pages == 0 && row_len(&a, r) == Some(0)).expect("the parked row");
    let mut r = common::fresh_req();
    r.req_pool_idx = row;
    let before = r;
    let (st, _) = a.match_tier(1, 20, &mut r);
    assert_eq!(st, SKV_ERR_STATE, "{}", last_error());
    assert_eq!(r, before);
    assert!(a.e.borrow().pending.is_empty(), "no copy was asked for");
    same(&a, &b);
}

/// Tokens row `r` maps (None when free).
fn row_len(h: &H, r: i32) -> Option<u32> {
    let (mut indptr, mut idx, mut last, mut n) = ([0i32; 2], [0i32; 64], [0i32; 1], 0usize);
    // SAFETY: a live handle and locals of the lengths passed.
    let st = unsafe {
        skv_build_flashinfer(h.c, &r, 1, indptr.as_mut_ptr(), idx.as_mut_ptr(), last.as_mut_ptr(), 64, &mut n)
    };
    (st == SKV_OK).then(|| if n == 0 { 0 } else { (n as u32 - 1) * h.ps + last[0] as u32 })
}

#[test]
fn a_failed_park_write_back_is_planned_once_by_the_next_step() {
    let mut h = H::new(config(48));
    h.turn(0, 8, None);
    let (st, t) = h.park(0);
    assert_eq!(st, SKV_OK);
    h.complete(t, 1);
    // The slot is queued twice for write-back now (its finish, and the failed copy).
    let (st, pages, t) = h.step();
    assert_eq!((st, pages), (SKV_OK, 2));
    h.audit();
    h.complete(t, 0);
    assert_eq!((h.at(0).place, h.at(0).host_pages, h.host_used()), (SKV_PLACE_BOTH, 2, 2));
    h.audit();
}

#[test]
fn admission_counts_no_pages_freed_from_a_row_being_copied() {
    let mut h = H::new(config(48));
    h.turn(0, 16, None);
    let (_, _, t) = h.step();
    assert_ne!(t, 0);
    let mut a = skv_admission::default();
    // SAFETY: a live handle and a local.
    assert_eq!(unsafe { skv_admission_pages(h.c, 0, 0, 4, 8, &mut a) }, SKV_OK);
    assert_eq!((a.hit, a.prefix_len, a.pages_needed, a.pages_freed), (1, 4, 1, 0), "{a:?}");
    let free = h.snap().stats.free_pages;
    let mut r = common::fresh_req();
    let mut m = skv_match::default();
    // SAFETY: a live handle and locals.
    assert_eq!(unsafe { skv_match_prefix(h.c, 0, 0, &mut r, 4, 0, &mut m) }, SKV_OK);
    // SAFETY: as above.
    assert_eq!(unsafe { skv_alloc_extend(h.c, &mut r, 4, null_mut()) }, SKV_OK);
    assert_eq!(h.snap().stats.free_pages as i64, free as i64 + a.pages_freed as i64 - a.pages_needed as i64);
    h.complete(t, 0);
}

/// A short mixed workload of the calls that existed before the tier, on a handle: every
/// status, req and page id it saw.
fn plain_workload(h: &mut H, seed: u64) -> Vec<String> {
    let mut rng = Rng(seed);
    let mut seen = Vec::new();
    for _ in 0..600 {
        let sid = rng.below(SESSIONS);
        let mut r = common::fresh_req();
        let mut m = skv_match::default();
        let key = rng.below(40) as u32;
        // SAFETY: a live handle and locals.
        let st = unsafe { skv_match_prefix(h.c, sid, 0, &mut r, key, 0, &mut m) };
        seen.push(format!("match {sid} {key}: {st:?} {m:?} {r:?}"));
        if st != SKV_OK {
            continue;
        }
        if m.hit == 0 {
            // SAFETY: as above.
            let st = unsafe { skv_alloc_row(h.c, &mut r) };
            seen.push(format!("row: {st:?} {r:?}"));
            if st != SKV_OK {
                continue;
            }
        }
        let n = (rng.below(12) as u32).min(64 - r.kv_allocated_len);
        let mut out = vec![0i32; n as usize];
        // SAFETY: out holds n values.
        let st = unsafe { skv_alloc_extend(h.c, &mut r, n, out.as_mut_ptr()) };
        seen.push(format!("extend {n}: {st:?} {out:?}"));
        let k = r.kv_allocated_len - r.kv_committed_len;
        // SAFETY: a live handle and a local.
        seen.push(format!("commit: {:?}", unsafe { skv_commit(h.c, &mut r, k) }));
        (r.origin_input_len, r.output_len, r.finished_len) = (r.kv_committed_len, 0, 0);
        let aborted = rng.below(8) == 0;
        // SAFETY: as above.
        let st = unsafe { skv_cache_finished_req(h.c, sid, 0, &mut r, aborted as u32) };
        seen.push(format!("finish {aborted}: {st:?} {r:?}"));
        if rng.below(10) == 0 {
            // SAFETY: a live handle.
            seen.push(format!("release: {:?}", unsafe { skv_release_session(h.c, rng.below(SESSIONS)) }));
        }
        seen.push(format!("{:?}", h.snap().stats));
    }
    seen.push(format!("{:?}", h.next_pages()));
    seen
}

#[test]
fn without_steps_or_evictions_the_tier_changes_no_answer() {
    let mut idle = config(48);
    idle.tier_pages_per_step = 0;
    for seed in 0..3 {
        let want = plain_workload(&mut H::new(config(0)), seed);
        assert!(want.iter().any(|l| l.contains("hit: 1")), "the workload hits");
        let mut tier = H::new(idle);
        assert_eq!(plain_workload(&mut tier, seed), want, "a host tier that never moves anything");
        let t = tier.tier();
        assert_eq!((t.clock, t.parks, t.pages_to_host), (0, 0, 0));
        assert_eq!(plain_workload(&mut H::with_hooks(config(48), false), seed), want, "no copy_pages hook");
    }
}

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

/// Two handles of one config (tensor-parallel ranks) given the same calls.
struct Lockstep {
    a: H,
    b: H,
    rng: Rng,
    calls: u64,
    /// How far the copy logs were compared.
    logged: usize,
    restores: u64,
}

impl Lockstep {
    /// Runs `f` on both; the answers, skv_session_where of every session, skv_tier_stats, the
    /// stats, the audit and the copies asked for must agree.
    fn both<T: PartialEq + std::fmt::Debug>(&mut self, what: &str, f: impl Fn(&mut H) -> T) -> T {
        self.calls += 1;
        let (x, y) = (f(&mut self.a), f(&mut self.b));
        assert_eq!(x, y, "call {}: {what}", self.calls);
        assert_eq!(self.a.snap(), self.b.snap(), "call {}: {what}", self.calls);
        let (la, lb) = (&self.a.e.borrow().log, &self.b.e.borrow().log);
        assert_eq!(la[self.logged..], lb[self.logged..], "call {}: {what}: copy_pages' arguments", self.calls);
        self.logged = la.len();
        x
    }

    fn op(&mut self) {
        let sid = self.rng.below(SESSIONS);
        match self.rng.below(20) {
            0..=7 => self.turn(sid),
            8..=9 => {
                self.both("skv_tier_step", |h| h.step());
            }
            10 => {
                let (pages, flags) = (self.rng.below(24), self.rng.below(2) as u32);
                self.both("skv_tier_evict", |h| h.evict(pages, flags));
            }
            11..=12 => {
                self.both("skv_session_park", |h| h.park(sid));
            }
            13 => {
                // SAFETY: a live handle.
                self.both("skv_release_session", |h| unsafe { skv_release_session(h.c, sid) });
            }
            _ => self.complete_one(),
        }
    }

    /// Completes one open ticket, the same on both, ok or (1 in 10) failed.
    fn complete_one(&mut self) {
        let open: Vec<u64> = self.a.e.borrow().pending.iter().map(|c| c.0).collect();
        let theirs: Vec<u64> = self.b.e.borrow().pending.iter().map(|c| c.0).collect();
        assert_eq!(open, theirs);
        if open.is_empty() {
            return;
        }
        let t = open[self.rng.below(open.len() as u64) as usize];
        let status = (self.rng.below(10) == 0) as i32;
        self.both("skv_ticket_done", |h| h.done(t, status));
    }

    fn turn(&mut self, sid: u64) {
        let key = self.a.at(sid).tokens + self.rng.below(4) as u32;
        let mut rs = [common::fresh_req(); 2];
        let (st, m) = self.pair(&mut rs, "skv_match_prefix_tier", |h, r| h.match_tier(sid, key, r));
        if st != SKV_OK {
            return;
        }
        if m.hit == 1 && m.restored_pages > 0 {
            self.restores += 1;
            let n = m.prefix_len;
            self.pair(&mut rs, "skv_row_indices of the restored row", |h, r| {
                let mut idx = vec![0i32; n as usize];
                // SAFETY: a live handle; idx holds n values.
                let st = unsafe { skv_row_indices(h.c, r.req_pool_idx, 0, n, idx.as_mut_ptr()) };
                (st, idx)
            });
        }
        if m.ticket != 0 {
            if self.rng.below(8) == 0 {
                // Dropped before its restore ran: the ticket completes later.
                self.pair(&mut rs, "abort before the restore ran", |h, r| {
                    // SAFETY: a live handle and a local.
                    unsafe { skv_cache_finished_req(h.c, sid, 0, r, 1) }
                });
                return;
            }
            let status = (self.rng.below(6) == 0) as i32;
            self.both("skv_ticket_done (the restore)", |h| h.done(m.ticket, status));
            if status != 0 {
                let hand_back = self.rng.below(2) == 0;
                self.pair(&mut rs, "hand back or abort a failed restore", |h, r| {
                    // SAFETY: a live handle and a local.
                    unsafe {
                        match hand_back {
                            true => skv_hand_back(h.c, sid, 0, r),
                            false => skv_cache_finished_req(h.c, sid, 0, r, 1),
                        }
                    }
                });
                return;
            }
        }
        if m.hit == 0 {
            let st = self.pair(&mut rs, "skv_alloc_row", |h, r| {
                // SAFETY: a live handle and a local.
                unsafe { skv_alloc_row(h.c, r) }
            });
            if st != SKV_OK {
                return;
            }
        }
        let n = (self.rng.below(14) as u32).min(64 - rs[0].kv_allocated_len);
        let mut st = SKV_ERR_OUT_OF_MEMORY;
        for _ in 0..3 {
            (st, _) = self.pair(&mut rs, "skv_alloc_extend", |h, r| {
                let mut out = vec![0i32; n as usize];
                // SAFETY: a live handle; out holds n values.
                let st = unsafe { skv_alloc_extend(h.c, r, n, out.as_mut_ptr()) };
                (st, out)
            });
            if st != SKV_ERR_OUT_OF_MEMORY {
                break;
            }
            let pages = 2 + n as u64 / 4;
            self.both("skv_tier_evict (for room)", |h| h.evict(pages, 0));
            self.complete_one();
        }
        let aborted = (st != SKV_OK || self.rng.below(10) == 0) as u32;
        if aborted == 0 {
            self.pair(&mut rs, "skv_commit", |h, r| {
                let k = r.kv_allocated_len - r.kv_committed_len;
                // SAFETY: a live handle and a local.
                let st = unsafe { skv_commit(h.c, r, k) };
                (r.origin_input_len, r.output_len, r.finished_len) = (r.kv_committed_len, 0, 0);
                st
            });
        }
        self.pair(&mut rs, "skv_cache_finished_req", |h, r| {
            // SAFETY: a live handle and a local.
            unsafe { skv_cache_finished_req(h.c, sid, 0, r, aborted) }
        });
    }

    /// `both` for a call on each handle's own req; the reqs must agree after it.
    fn pair<T: PartialEq + std::fmt::Debug>(
        &mut self,
        rs: &mut [skv_req; 2],
        what: &str,
        f: impl Fn(&mut H, &mut skv_req) -> T,
    ) -> T {
        let cell = RefCell::new(std::mem::take(rs));
        let which = std::cell::Cell::new(0);
        let out = self.both(what, |h| {
            let i = which.replace(1);
            f(h, &mut cell.borrow_mut()[i])
        });
        *rs = cell.into_inner();
        assert_eq!(rs[0], rs[1], "call {}: {what}: the reqs", self.calls);
        out
    }
}

fn lockstep(cfg: skv_cache_config, seed: u64, calls: u64) {
    let mut l = Lockstep { a: H::new(cfg), b: H::new(cfg), rng: Rng(seed), calls: 0, logged: 0, restores: 0 };
    while l.calls < calls {
        l.op();
    }
    let t = l.a.tier();
    assert!(l.restores > 50 && t.parks > 50 && t.host_evictions > 0 && t.failed_copies > 0, "{t:?}");
    finally_same(l.a, l.b);
}

#[test]
fn tensor_parallel_ranks_stay_in_lockstep() {
    let mut cfg = config(24);
    cfg.tier_pages_per_step = 6;
    lockstep(cfg, 7, 20_000);
}

#[test]
fn tensor_parallel_ranks_stay_in_lockstep_hybrid() {
    let mut cfg = config(24);
    (cfg.swa_num_token_slots, cfg.host_swa_num_token_slots, cfg.tier_min_tokens) = (48 * 4, 20 * 4, 8);
    lockstep(cfg, 8, 20_000);
}
