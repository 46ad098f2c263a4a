//! Adversarial tests of a move between handles (docs/transfer.md): every refused call changes
//! nothing (fences included), no page is freed twice or leaked whatever order the tickets
//! complete in, both modes, a sliding window at every cursor, recurrent-state handles, the
//! host tier around a move, and epochs over a session that goes back and forth.

use std::sync::{Arc, Mutex};

use super::test_unit::{external, owned, saved, spec, External};
use super::transfer::Answer;
use super::unit::{read_unit, Destination, UnitHeader};
use super::*;

/// Everything a refused call must leave as it was: stats, slots, tickets, fences, incarnations
/// and the host tier.
fn snap(c: &Cache) -> String {
    let mut slots: Vec<_> = c.slots().iter().map(|(r, s)| (r, *s)).collect();
    slots.sort_by_key(|s| s.0);
    let mut fences: Vec<_> = c.fences.iter().map(|(k, f)| (*k, *f)).collect();
    fences.sort_unstable_by_key(|f| f.0);
    let mut origins: Vec<_> = c.origins.iter().map(|(r, o)| (*r, *o)).collect();
    origins.sort_unstable();
    let tier = c.tier.as_deref().map(|_| c.tier_stats());
    format!("{:?} {slots:?} {} {fences:?} {origins:?} {tier:?}", c.stats().unwrap(), c.tickets.next())
}

fn clean(c: &Cache) {
    let rep = c.check().unwrap();
    assert_eq!(rep.violations, 0, "{}", rep.first_violation_text());
}

fn header(c: &Cache, unit: &[u8]) -> UnitHeader {
    read_unit(unit, &Destination { fingerprint: c.unit_fingerprint(), max_context_len: 4096 }).unwrap().header
}

fn move_out(c: &mut Cache, session: u64) -> (Vec<u8>, u64) {
    let mut buf = vec![0; c.export_len(session, 0, true).unwrap()];
    let (n, t) = c.export(session, 0, true, &mut buf).unwrap();
    assert_eq!(n, buf.len());
    (buf, t)
}

/// Imports a move's unit with no recurrent state: the ids written and the ticket.
fn move_in(c: &mut Cache, session: u64, unit: &[u8]) -> (Vec<i32>, u64) {
    let mut out = vec![0; 4096];
    let (n, t) = c.import(&spec(session, &[]), unit, &mut out).unwrap();
    out.truncate(n);
    (out, t)
}

/// The engine's callbacks, logged: lock releases, recurrent-state frees and copies.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<String>>>);

impl Log {
    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

impl EngineHooks for Log {
    fn dec_lock_ref(&mut self, node: u64, receipt: u64) -> std::result::Result<(), i32> {
        self.0.lock().unwrap().push(format!("lock {node} {receipt}"));
        Ok(())
    }
    fn free_aux(&mut self, aux: i64) -> std::result::Result<(), i32> {
        self.0.lock().unwrap().push(format!("aux {aux}"));
        Ok(())
    }
    fn can_copy(&self) -> bool {
        true
    }
    fn copy_pages(
        &mut self,
        t: u64,
        d: u32,
        src: &[i32],
        _: &[i32],
        _: usize,
        _: usize,
    ) -> std::result::Result<(), i32> {
        self.0.lock().unwrap().push(format!("copy {t} {d} {}", src.len()));
        Ok(())
    }
}

/// An owned cache of 4-token pages with a host tier (`host_pages`, 0: none) and the logging
/// hooks.
fn tiered(swa_pages: u64, host_pages: u64) -> (Cache, Log) {
    let cfg = *owned(4, 600, swa_pages).config();
    let tier = match host_pages {
        0 => cfg.tier,
        _ => TierConfig {
            host_num_token_slots: host_pages * 4,
            host_swa_num_token_slots: if swa_pages > 0 { host_pages * 4 } else { 0 },
            idle_steps: 1,
            pages_per_step: 1000,
            ..cfg.tier
        },
    };
    let mut c = Cache::new_owned(Config { tier, ..cfg }).unwrap();
    let log = Log::default();
    c.set_hooks(Some(Box::new(log.clone()))).unwrap();
    (c, log)
}

/// Every refusal around a move changes nothing on either handle: a move export of a parked,
/// running, already exported or missing session or into a short buffer; a match, release,
/// park or abort of a moving session; an import of a duplicate, of a unit whose key has a slot,
/// of one with the wrong handles; and skv_session_fence of bad units.
#[test]
fn every_refusal_around_a_move_changes_nothing() {
    let (mut a, _) = tiered(0, 400);
    let (mut b, _) = tiered(0, 400);
    saved(&mut a, 1, 8, 30);
    saved(&mut a, 2, 0, 13);
    let wb = a.park(2, 0).unwrap();
    a.ticket_done(wb, true).unwrap();
    assert_eq!(a.slots().find(2, 0).unwrap().1.place, Place::Parked);
    let before = snap(&a);
    let mut buf = vec![0xAA; 4096];
    let err = a.export(2, 0, true, &mut buf).unwrap_err();
    assert!(matches!(&err, Error::State(m) if m.contains("not on the device")), "{err}");
    assert!(matches!(a.export(3, 0, true, &mut buf), Err(Error::NotFound(_))));
    let need = a.export_len(1, 0, true).unwrap();
    assert!(matches!(a.export(1, 0, true, &mut buf[..need - 1]), Err(Error::Buffer(_))));
    let mut r = Req::default();
    a.match_prefix(1, 0, &mut r, 30, false).unwrap();
    assert!(matches!(a.export(1, 0, true, &mut buf), Err(Error::State(m)) if m.contains("in flight")));
    a.hand_back(1, 0, &mut r).unwrap();
    assert!(buf.iter().all(|&x| x == 0xAA), "no refusal wrote the buffer");
    assert_eq!(snap(&a), before, "no epoch or incarnation drawn by a refusal");

    let (unit, te) = move_out(&mut a, 1);
    let during = snap(&a);
    let refusals: Vec<(&str, Result<()>)> = vec![
        ("release_branch", a.release_branch(1, 0)),
        ("release_session", a.release_session(1)),
        ("match_prefix", a.match_prefix(1, 0, &mut Req::default(), 30, false).map(|_| ())),
        ("match_prefix_tier", a.match_prefix_tier(1, 0, &mut Req::default(), 30, false).map(|_| ())),
        ("park", a.park(1, 0).map(|_| ())),
        ("export", a.export(1, 0, false, &mut buf).map(|_| ())),
        ("export move", a.export(1, 0, true, &mut buf).map(|_| ())),
    ];
    for (name, got) in refusals {
        assert!(matches!(got, Err(Error::State(_))), "{name}: {got:?}");
        assert_eq!(snap(&a), during, "{name}");
    }
    // An eviction passes over the moving session.
    assert_eq!(a.tier_evict(1000, true).unwrap().released, 0);
    assert_eq!(snap(&a), during, "nothing else on the device to evict");
    clean(&a);

    // The destination: a slot under the key, a wrong handle, then a real import and its
    // duplicate; a fence of bad bytes.
    saved(&mut b, 1, 0, 5);
    let b0 = snap(&b);
    let mut out = vec![-1; 64];
    assert!(matches!(b.import(&spec(1, &[]), &unit, &mut out), Err(Error::State(m)) if m.contains("already has")));
    assert_eq!(snap(&b), b0, "the refused import recorded no fence");
    b.release_branch(1, 0).unwrap();
    let b0 = snap(&b);
    let bad = ImportSpec { aux_state: 4, ..spec(1, &[]) };
    assert!(matches!(b.import(&bad, &unit, &mut out), Err(Error::InvalidArg(m)) if m.contains("aux_state 4")));
    assert!(matches!(b.import(&spec(1, &[]), &unit, &mut out[..3]), Err(Error::InvalidArg(_))));
    let mut garbage = unit.clone();
    garbage[0] ^= 1;
    let mut other = unit.clone();
    other[32] ^= 1; // kv_layout_id
    let mut copy = unit.clone();
    copy[12] = 0; // flags: a copy's, with an epoch
    for u in [&garbage, &other, &copy, &unit[..50].to_vec()] {
        assert!(b.import(&spec(1, &[]), u, &mut out).is_err());
        assert!(b.fence(u).is_err());
        assert_eq!(snap(&b), b0);
    }
    assert!(out.iter().all(|&x| x == -1), "no refusal wrote out_pages");
    let (_, ti) = move_in(&mut b, 1, &unit);
    let b1 = snap(&b);
    assert!(matches!(b.import(&spec(1, &[]), &unit, &mut out), Err(Error::State(_))));
    assert_eq!(snap(&b), b1, "a duplicate reserves nothing");
    assert_eq!(b.fence(&unit).unwrap(), Answer::Pending);
    b.ticket_done(ti, true).unwrap();
    a.ticket_done(te, true).unwrap();
    clean(&a);
    clean(&b);
}

/// A finished first turn of `len` tokens as session `id`, its first `prefix` mapped from the
/// tree under lock (77, 78), a window step of `window` tokens (0: none) and the recurrent
/// handles `aux`.
fn session(c: &mut Cache, id: u64, prefix: u32, len: u32, window: u32, aux: [i64; 3]) {
    let mut r = Req::default();
    c.alloc_row(&mut r).unwrap();
    if prefix > 0 {
        let mut idx = vec![0; prefix as usize];
        c.pool_alloc(&mut idx).unwrap();
        c.map_prefix(&mut r, &idx).unwrap();
        (r.lock_node, r.lock_receipt) = (77, 78);
    }
    if len > prefix {
        c.alloc_extend(&mut r, len - prefix, None).unwrap();
        c.commit(&mut r, len - prefix).unwrap();
    }
    if window > 0 {
        let w = Window { size: window, eviction_interval: 0, prefix_sharing: false, retain_floor: None };
        c.swa_evict(&mut r, len, &w).unwrap();
    }
    (r.aux_state, r.aux_track) = (aux[0], [aux[1], aux[2]]);
    (r.origin_input_len, r.output_len) = (len, 0);
    c.cache_finished_req(id, 0, &mut r, false).unwrap();
}

/// The order the two tickets complete in, and whether the read succeeded.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Order {
    /// The destination commits, then the source releases (the lifecycle).
    CommitThenRelease,
    /// The source's ticket first (an engine acting before the commit): no page is freed twice.
    ReleaseThenCommit,
    /// The read failed: the destination, then the source.
    FailDestinationFirst,
    /// The read failed: the source gives up first.
    FailSourceFirst,
}

/// The pages a row maps over `[0, allocated)`, one id a page (`swa`: the SWA pool's, 0 where
/// none).
fn page_ids(c: &Cache, session: u64, swa: bool) -> Vec<i32> {
    let (row, s) = c.slots().find(session, 0).unwrap();
    let ps = c.config().page_size;
    let mut out = vec![0; s.allocated as usize];
    c.row_indices(row, 0, s.allocated, swa, &mut out).unwrap();
    out.iter().step_by(ps as usize).map(|&t| t / ps as i32).collect()
}

/// Moves session 1 of the given shape from one owned handle to another, completing the
/// tickets in `order` (a failure is then retried), and checks at every step: the audit, the
/// pages each side holds, that every page travels to its position, which callbacks ran (each
/// lock and handle released once, at the right side), and, after the destination serves and
/// releases the session, that it holds nothing.
fn owned_move(swa: bool, prefix: u32, len: u32, window: u32, aux: [i64; 3], order: Order) {
    let what = format!("swa {swa} prefix {prefix} len {len} window {window} aux {aux:?} {order:?}");
    let swa_pages = if swa { 600 } else { 0 };
    let (mut a, la) = tiered(swa_pages, 0);
    let (mut b, lb) = tiered(swa_pages, 0);
    let (a0, b0) = (a.stats().unwrap(), b.stats().unwrap());
    session(&mut a, 1, prefix, len, window, aux);
    let held = (a.stats().unwrap(), a.slots().find(1, 0).map(|(_, s)| *s).unwrap());
    let (full_a, swa_a) = (page_ids(&a, 1, false), if swa { page_ids(&a, 1, true) } else { Vec::new() });
    let mut attempts = vec![order];
    if matches!(order, Order::FailDestinationFirst | Order::FailSourceFirst) {
        attempts.push(Order::CommitThenRelease);
    }
    for (k, &o) in attempts.iter().enumerate() {
        let (unit, te) = move_out(&mut a, 1);
        let h = header(&b, &unit);
        assert_eq!(h.epoch, k as u32 + 1, "{what}: a retry takes the next epoch");
        assert_eq!((h.protected, h.committed, h.allocated), (0, len, len), "{what}");
        assert_eq!(a.stats().unwrap(), held.0, "{what}: the export frees nothing");
        clean(&a);
        let dst_aux = aux.map(|x| if x == -1 { -1 } else { x + 100 });
        let sp = ImportSpec { aux_state: dst_aux[0], aux_track: [dst_aux[1], dst_aux[2]], ..spec(1, &[]) };
        let mut out = vec![0; 4096];
        let (n, ti) = b.import(&sp, &unit, &mut out).unwrap();
        out.truncate(n);
        clean(&b);
        let bi = b.stats().unwrap();
        assert_eq!(b0.free_pages - bi.free_pages, h.n_full as u64, "{what}: the prefix arrives as own pages");
        assert_eq!(b0.swa_free_pages - bi.swa_free_pages, h.n_swa as u64, "{what}");
        // Every page lands at its position: the unit names the source's, out the destination's.
        let (full_b, swa_b) = (page_ids(&b, 1, false), if swa { page_ids(&b, 1, true) } else { Vec::new() });
        let u = read_unit(&unit, &Destination { fingerprint: b.unit_fingerprint(), max_context_len: 4096 }).unwrap();
        assert_eq!(u.full().collect::<Vec<_>>(), full_a, "{what}: the whole session from page 0");
        assert_eq!(&out[..h.n_full as usize], full_b, "{what}");
        if swa {
            let live: Vec<usize> = (0..full_b.len()).filter(|&p| swa_b[p] != 0).collect();
            assert_eq!(live.len(), h.n_swa as usize, "{what}");
            let want: Vec<i32> = live.iter().map(|&p| swa_a[p]).collect();
            assert_eq!(u.swa().collect::<Vec<_>>(), want, "{what}: the source's SWA pages of those positions");
            assert!(want.iter().all(|&p| p > 0), "{what}: the source holds each one it sends");
            let got: Vec<i32> = live.iter().map(|&p| swa_b[p]).collect();
            assert_eq!(&out[h.n_full as usize..], got, "{what}");
            let ps = 4;
            assert!(live.iter().all(|&p| (p as u32 + 1) * ps > h.swa_cursor), "{what}: only the window travels");
        }
        la.take();
        match o {
            Order::CommitThenRelease => {
                b.ticket_done(ti, true).unwrap();
                clean(&b);
                a.ticket_done(te, true).unwrap();
            }
            Order::ReleaseThenCommit => {
                a.ticket_done(te, true).unwrap();
                clean(&a);
                b.ticket_done(ti, true).unwrap();
            }
            Order::FailDestinationFirst => {
                b.ticket_done(ti, false).unwrap();
                clean(&b);
                a.ticket_done(te, false).unwrap();
            }
            Order::FailSourceFirst => {
                a.ticket_done(te, false).unwrap();
                clean(&a);
                b.ticket_done(ti, false).unwrap();
            }
        }
        clean(&a);
        clean(&b);
        let (src_log, dst_log) = (la.take(), lb.take());
        let released: Vec<String> = aux.iter().filter(|&&x| x != -1).map(|x| format!("aux {x}")).collect();
        match o {
            Order::CommitThenRelease | Order::ReleaseThenCommit => {
                assert!(a.slots().find(1, 0).is_none(), "{what}");
                let sa = a.stats().unwrap();
                let tree = prefix as u64 / 4;
                assert_eq!(a0.free_pages - sa.free_pages, tree, "{what}: only the tree's prefix stays held");
                assert_eq!(a0.swa_free_pages - sa.swa_free_pages, if swa { tree } else { 0 }, "{what}");
                let mut want = released.clone();
                if prefix > 0 {
                    want.push("lock 77 78".into());
                }
                let mut got = src_log.clone();
                got.sort();
                want.sort();
                assert_eq!(got, want, "{what}: the source's lock and handles, each once");
                assert!(dst_log.is_empty(), "{what}: {dst_log:?}");
                let d = *b.slots().find(1, 0).unwrap().1;
                assert_eq!((d.protected, d.lock_node, d.committed, d.allocated), (0, 0, len, len), "{what}");
                assert_eq!([d.aux, d.track[0], d.track[1]], dst_aux, "{what}");
            }
            Order::FailDestinationFirst | Order::FailSourceFirst => {
                assert!(src_log.is_empty(), "{what}: {src_log:?}");
                let want: Vec<String> = dst_aux.iter().filter(|&&x| x != -1).map(|x| format!("aux {x}")).collect();
                assert_eq!(dst_log, want, "{what}: the destination's handles go back");
                assert_eq!(a.stats().unwrap(), held.0, "{what}");
                assert_eq!(*a.slots().find(1, 0).unwrap().1, held.1, "{what}: the session serves, unchanged");
                assert_eq!(b.stats().unwrap(), b0, "{what}");
                assert!(matches!(b.import(&sp, &unit, &mut vec![0; 4096]), Err(Error::State(_))), "{what}");
            }
        }
    }
    // The destination serves a turn, then releases: it holds nothing of the session.
    let mut r = Req::default();
    assert_eq!(b.match_prefix(1, 0, &mut r, len, false).unwrap().hit, 1, "{what}");
    b.alloc_extend(&mut r, 3, None).unwrap();
    b.commit(&mut r, 3).unwrap();
    (r.origin_input_len, r.output_len) = (len + 3, 0);
    b.cache_finished_req(1, 0, &mut r, false).unwrap();
    b.release_branch(1, 0).unwrap();
    clean(&b);
    let sb = b.stats().unwrap();
    assert_eq!((sb.free_pages, sb.swa_free_pages, sb.free_rows), (b0.free_pages, b0.swa_free_pages, b0.free_rows));
}

/// The shapes: partial last pages, one page, nothing past the prefix, recurrent handles; with
/// a window at the start (inside the prefix), at the prefix's end, and past it.
const SHAPES: [(bool, u32, u32, u32, [i64; 3]); 12] = [
    (false, 8, 30, 0, [11, 12, -1]),
    (false, 0, 3, 0, [-1; 3]),
    (false, 0, 4, 0, [11, -1, 13]),
    (false, 8, 8, 0, [-1, 12, 13]),
    (false, 16, 17, 0, [-1; 3]),
    (true, 8, 30, 8, [11, 12, 13]),
    (true, 8, 12, 8, [-1; 3]),
    (true, 8, 30, 0, [11, -1, -1]),
    (true, 0, 30, 8, [-1; 3]),
    (true, 8, 8, 0, [-1; 3]),
    (true, 0, 3, 2, [-1, 12, -1]),
    (true, 16, 33, 4, [-1; 3]),
];

#[test]
fn owned_moves_free_each_page_once_in_every_order() {
    for (swa, prefix, len, window, aux) in SHAPES {
        for order in
            [Order::CommitThenRelease, Order::ReleaseThenCommit, Order::FailDestinationFirst, Order::FailSourceFirst]
        {
            owned_move(swa, prefix, len, window, aux, order);
        }
    }
}

/// A prefix whose first SWA pages the tree no longer holds (the window had passed them when it
/// was published): a move whose window still needs them is refused, changing nothing; once the
/// window passed them the session moves, and both sides stay whole.
#[test]
fn a_window_needing_an_evicted_prefix_swa_page_is_refused() {
    let (mut a, _) = tiered(600, 0);
    let (mut b, _) = tiered(600, 0);
    // The tree's prefix: 16 tokens whose first 8 lost their SWA side to a window.
    let mut x = Req::default();
    a.alloc_row(&mut x).unwrap();
    a.alloc_extend(&mut x, 16, None).unwrap();
    a.commit(&mut x, 16).unwrap();
    let w = |size| Window { size, eviction_interval: 0, prefix_sharing: false, retain_floor: None };
    a.swa_evict(&mut x, 16, &w(8)).unwrap();
    a.publish_prefix(&mut x, 16).unwrap();
    let mut idx = vec![0; 16];
    a.row_indices(x.row().unwrap(), 0, 16, false, &mut idx).unwrap();
    a.free_req(&mut x).unwrap();
    // A session over it whose window has not moved: it needs pages 0 and 1's SWA side.
    let mut r = Req::default();
    a.alloc_row(&mut r).unwrap();
    a.map_prefix(&mut r, &idx).unwrap();
    a.alloc_extend(&mut r, 8, None).unwrap();
    a.commit(&mut r, 8).unwrap();
    (r.origin_input_len, r.output_len) = (24, 0);
    a.cache_finished_req(1, 0, &mut r, false).unwrap();
    clean(&a);
    assert_eq!(page_ids(&a, 1, true)[..2], [0, 0], "the prefix's first SWA pages are gone");
    let before = snap(&a);
    let mut buf = vec![0; 4096];
    let err = a.export(1, 0, true, &mut buf).unwrap_err();
    assert!(matches!(&err, Error::State(m) if m.contains("SWA page of page 0")), "{err}");
    assert!(matches!(a.export_len(1, 0, true), Err(Error::State(_))));
    assert_eq!(snap(&a), before);
    // A copy (not a move) leaves the prefix behind and is not refused.
    let mut copy = vec![0; a.export_len(1, 0, false).unwrap()];
    let (_, t) = a.export(1, 0, false, &mut copy).unwrap();
    a.ticket_done(t, true).unwrap();
    // The next turn's window passes the prefix: the move carries the window only.
    let mut r = Req::default();
    a.match_prefix(1, 0, &mut r, 24, false).unwrap();
    a.alloc_extend(&mut r, 4, None).unwrap();
    a.commit(&mut r, 4).unwrap();
    a.swa_evict(&mut r, 28, &w(4)).unwrap();
    (r.origin_input_len, r.output_len) = (28, 0);
    a.cache_finished_req(1, 0, &mut r, false).unwrap();
    let (unit, te) = move_out(&mut a, 1);
    let h = header(&b, &unit);
    assert_eq!((h.swa_cursor, h.n_full, h.n_swa), (24, 7, 1), "{h:?}");
    let (_, ti) = move_in(&mut b, 1, &unit);
    b.ticket_done(ti, true).unwrap();
    a.ticket_done(te, true).unwrap();
    clean(&a);
    clean(&b);
    assert_eq!(a.stats().unwrap().sessions, 0);
}

/// The effects an external handle's engine was asked for since the last call, one string each.
fn effects(e: &External) -> Vec<String> {
    std::mem::take(&mut *e.log.lock().unwrap())
}

fn count(log: &[String], needle: &str) -> usize {
    log.iter().filter(|l| l.contains(needle)).count()
}

/// External mode, both ends: the source's row and pages are the engine's. A move in each
/// order (failures retried): nothing is freed at either side while the move is open (a release
/// of either slot is refused, not drained: the free list is the engine's), and each row, lock
/// and handle goes back to its engine exactly once, at the side that no longer holds the
/// session.
#[test]
fn external_moves_free_each_row_once_in_every_order() {
    for swa in [false, true] {
        for order in
            [Order::CommitThenRelease, Order::ReleaseThenCommit, Order::FailDestinationFirst, Order::FailSourceFirst]
        {
            let what = format!("swa {swa} {order:?}");
            let (mut a, mut b) = (external(4, swa), external(4, swa));
            // Row 1: page i is engine page 10 + 3i; 8 tokens of the tree's prefix.
            a.rows.lock().unwrap()[1] = (0..4096).map(|p| (10 + 3 * (p / 4)) * 4 + p % 4).collect();
            b.rows.lock().unwrap()[2] = (0..4096).map(|p| (50 + p / 4) * 4 + p % 4).collect();
            let mut r = Req {
                req_pool_idx: 1,
                kv_committed_len: 22,
                kv_allocated_len: 22,
                cache_protected_len: 8,
                lock_node: 5,
                lock_receipt: 6,
                aux_state: 40,
                swa_evicted_seqlen: if swa { 12 } else { 0 },
                origin_input_len: 22,
                ..Req::default()
            };
            a.cache.cache_finished_req(1, 0, &mut r, false).unwrap();
            effects(&a);
            let mut attempts = vec![order];
            if matches!(order, Order::FailDestinationFirst | Order::FailSourceFirst) {
                attempts.push(Order::CommitThenRelease);
            }
            for (k, &o) in attempts.iter().enumerate() {
                let (unit, te) = move_out(&mut a.cache, 1);
                let h = header(&b.cache, &unit);
                assert_eq!((h.epoch, h.protected, h.n_full, h.n_swa), (k as u32 + 1, 0, 6, 0), "{what}");
                let u =
                    read_unit(&unit, &Destination { fingerprint: b.cache.unit_fingerprint(), max_context_len: 4096 })
                        .unwrap();
                assert_eq!(u.full().collect::<Vec<_>>(), [10, 13, 16, 19, 22, 25], "{what}: from page 0");
                let before_a = snap(&a.cache);
                assert!(matches!(a.cache.release_session(1), Err(Error::State(_))), "{what}");
                assert_eq!(snap(&a.cache), before_a, "{what}");
                let sp = ImportSpec { row: 2, aux_state: 140, ..spec(1, &[]) };
                let (n, ti) = b.cache.import(&sp, &unit, &mut []).unwrap();
                assert_eq!(n, 0, "{what}");
                let before_b = snap(&b.cache);
                assert!(matches!(b.cache.release_session(1), Err(Error::State(_))), "{what}");
                assert_eq!(snap(&b.cache), before_b, "{what}");
                assert!(effects(&a).is_empty() && effects(&b).is_empty(), "{what}: nothing freed while open");
                let ok = matches!(o, Order::CommitThenRelease | Order::ReleaseThenCommit);
                match o {
                    Order::CommitThenRelease | Order::FailDestinationFirst => {
                        b.cache.ticket_done(ti, ok).unwrap();
                        a.cache.ticket_done(te, ok).unwrap();
                    }
                    Order::ReleaseThenCommit | Order::FailSourceFirst => {
                        a.cache.ticket_done(te, ok).unwrap();
                        b.cache.ticket_done(ti, ok).unwrap();
                    }
                }
                let (la, lb) = (effects(&a), effects(&b));
                let (gone, kept, lg) = if ok { (&la, &lb, "source") } else { (&lb, &la, "destination") };
                assert!(kept.is_empty(), "{what}: the side keeping the session freed {kept:?}");
                let (row, aux) = if ok { (1, 40) } else { (2, 140) };
                assert_eq!(count(gone, &format!("FreeRow {{ row: {row} }}")), 1, "{what}: the {lg}'s row: {gone:?}");
                assert_eq!(count(gone, "FreeRow"), 1, "{what}: {gone:?}");
                assert_eq!(count(gone, &format!("FreeAux {{ aux: {aux} }}")), 1, "{what}: {gone:?}");
                assert_eq!(count(gone, "DecLockRef"), ok as usize, "{what}: the source's lock, once: {gone:?}");
                let freed_from = if ok { "start: 8" } else { "start: 0" };
                assert_eq!(count(gone, "FreeKv"), 1, "{what}: {gone:?}");
                assert_eq!(count(gone, freed_from), 1, "{what}: the pages past the side's prefix: {gone:?}");
                assert_eq!(a.cache.slots().find(1, 0).is_some(), !ok, "{what}");
                assert_eq!(b.cache.slots().find(1, 0).is_some(), ok, "{what}");
            }
            // The destination serves, then releases: its row once more, nothing at the source.
            b.cache.release_session(1).unwrap();
            assert_eq!(count(&effects(&b), "FreeRow { row: 2 }"), 1);
            assert!(effects(&a).is_empty());
        }
    }
}

/// An import released mid-copy (owned mode drains its pages to the ticket): its row goes to
/// another import and its pages to no one until the ticket ends; the ticket's completion,
/// failed or succeeded, returns exactly the drained pages, commits nothing (the session is not
/// live here: the fence answers ABSENT, so the source serves again), and leaves the row's new
/// session whole.
#[test]
fn an_import_released_mid_copy_commits_nothing() {
    for (swa, ok) in [(false, true), (false, false), (true, true), (true, false)] {
        let what = format!("swa {swa} ok {ok}");
        let swa_pages = if swa { 600 } else { 0 };
        let (mut a, _) = tiered(swa_pages, 0);
        let (mut b, _) = tiered(swa_pages, 0);
        session(&mut a, 1, 8, 30, if swa { 8 } else { 0 }, [-1; 3]);
        session(&mut a, 2, 0, 13, 0, [-1; 3]);
        let a1 = (a.stats().unwrap(), *a.slots().find(1, 0).unwrap().1);
        let b0 = b.stats().unwrap();
        let (unit, te) = move_out(&mut a, 1);
        let (_, ti) = move_in(&mut b, 1, &unit);
        let row = b.slots().find(1, 0).unwrap().0;
        let imported = b.stats().unwrap();
        b.release_branch(1, 0).unwrap();
        let s = b.stats().unwrap();
        assert_eq!((s.sessions, s.free_rows, s.free_pages), (0, b0.free_rows, imported.free_pages), "{what}: draining");
        clean(&b);
        assert_eq!(b.fence(&unit).unwrap(), Answer::Absent, "{what}: released, so not live here");
        // The row goes to another move's import; a local turn cannot take the drained pages.
        let (unit2, te2) = move_out(&mut a, 2);
        let (out2, ti2) = move_in(&mut b, 2, &unit2);
        assert_eq!(b.slots().find(2, 0).unwrap().0, row, "{what}: the released row, reused");
        let mid = b.stats().unwrap();
        b.ticket_done(ti, ok).unwrap();
        clean(&b);
        let after = b.stats().unwrap();
        let h = header(&b, &unit);
        assert_eq!(after.free_pages - mid.free_pages, h.n_full as u64, "{what}: the drained pages, once");
        assert_eq!(after.swa_free_pages - mid.swa_free_pages, h.n_swa as u64, "{what}");
        assert_eq!(b.fence(&unit).unwrap(), Answer::Absent, "{what}: a completion after a release commits nothing");
        assert!(b.slots().find(1, 0).is_none());
        let s2 = *b.slots().find(2, 0).unwrap().1;
        assert_eq!(b.ticket_of(row), ti2, "{what}: session 2's import still pins its row");
        let n2 = header(&b, &unit2).n_full as usize;
        assert_eq!(page_ids(&b, 2, false), out2[..n2], "{what}: session 2's pages untouched");
        assert_eq!(s2.allocated, 13);
        // The source hears ABSENT: it serves again, unchanged.
        a.ticket_done(te, false).unwrap();
        assert_eq!((a.stats().unwrap().free_pages, *a.slots().find(1, 0).unwrap().1), (a1.0.free_pages, a1.1));
        b.ticket_done(ti2, true).unwrap();
        a.ticket_done(te2, true).unwrap();
        b.release_branch(2, 0).unwrap();
        clean(&a);
        clean(&b);
        assert_eq!(b.stats().unwrap(), b0, "{what}: the destination holds nothing");
    }
}

/// The host tier around a move (owned mode with a host pool): a session with a clean host copy
/// moves from its device pages; a failed move leaves the copy clean, a successful one frees
/// its host pages with the slot. While the move is open, a tier step writes nothing of it and
/// an eviction passes over it.
#[test]
fn a_host_copy_goes_with_the_moved_session() {
    for (swa, ok) in [(false, true), (false, false), (true, true), (true, false)] {
        let what = format!("swa {swa} ok {ok}");
        let (mut a, log) = tiered(if swa { 600 } else { 0 }, 400);
        let (mut b, _) = tiered(if swa { 600 } else { 0 }, 400);
        let host0 = a.tier_stats();
        session(&mut a, 1, 8, 30, if swa { 8 } else { 0 }, [-1; 3]);
        let (queued, wb) = a.tier_step().unwrap();
        assert!(queued > 0 && wb != 0, "{what}: written back");
        a.ticket_done(wb, true).unwrap();
        assert_eq!(a.where_is(1, 0).place, super::tier_ops::PLACE_BOTH, "{what}: on the device and the host");
        let with_copy = a.tier_stats();
        log.take();
        let (unit, te) = move_out(&mut a, 1);
        // Open: the policy leaves it alone.
        session(&mut a, 2, 0, 9, 0, [-1; 3]);
        for _ in 0..3 {
            let (_, t) = a.tier_step().unwrap();
            if t != 0 {
                a.ticket_done(t, true).unwrap();
            }
        }
        let copies = log.take();
        assert!(copies.iter().all(|c| c.ends_with(" 3") || c.ends_with(" 6")), "{what}: session 2 only: {copies:?}");
        let ev = a.tier_evict(1000, true).unwrap();
        assert!(a.slots().find(1, 0).is_some(), "{what}: {ev:?}");
        clean(&a);
        let (_, ti) = move_in(&mut b, 1, &unit);
        b.ticket_done(ti, ok).unwrap();
        a.ticket_done(te, ok).unwrap();
        clean(&a);
        let s2 = a.tier_stats();
        a.release_session(2).unwrap();
        let t = a.tier_stats();
        assert_eq!(t.host_free_pages - s2.host_free_pages, 3, "{what}: session 2's copy");
        if ok {
            assert!(a.slots().find(1, 0).is_none());
            assert_eq!(t.host_free_pages, host0.host_free_pages, "{what}: no host page leaked");
            assert_eq!(t.host_swa_free_pages, host0.host_swa_free_pages, "{what}");
            assert_eq!(t.host_draining_pages + t.host_swa_draining_pages, 0, "{what}");
        } else {
            assert_eq!(a.where_is(1, 0).place, super::tier_ops::PLACE_BOTH, "{what}: the copy stays clean");
            assert_eq!(t.host_free_pages, with_copy.host_free_pages, "{what}: the copy's pages, still held");
            a.release_session(1).unwrap();
            assert_eq!(a.tier_stats().host_free_pages, host0.host_free_pages, "{what}");
        }
    }
}

/// A move that failed leaves its session to the tier's policy again: a session moved out
/// before its write-back began is written back once the move failed and it stayed idle.
#[test]
fn a_failed_move_is_written_back_later() {
    let (mut a, log) = tiered(0, 400);
    let (mut b, _) = tiered(0, 400);
    session(&mut a, 1, 0, 30, 0, [-1; 3]);
    let (unit, te) = move_out(&mut a, 1);
    for _ in 0..3 {
        assert_eq!(a.tier_step().unwrap(), (0, 0), "nothing of a moving session is written back");
    }
    let (_, ti) = move_in(&mut b, 1, &unit);
    b.ticket_done(ti, false).unwrap();
    a.ticket_done(te, false).unwrap();
    log.take();
    let mut queued = 0;
    for _ in 0..3 {
        let (q, t) = a.tier_step().unwrap();
        queued += q;
        if t != 0 {
            a.ticket_done(t, true).unwrap();
        }
    }
    assert_eq!(queued, 8, "the idle session's 8 pages: {:?}", log.take());
    assert_eq!(a.where_is(1, 0).place, super::tier_ops::PLACE_BOTH);
}

/// The same for an import: a session that arrived while the policy's walk passed it is
/// written back once its ticket completed and it stayed idle.
#[test]
fn an_imported_session_is_written_back_later() {
    let (mut a, _) = tiered(0, 400);
    let (mut b, _) = tiered(0, 400);
    session(&mut a, 1, 0, 30, 0, [-1; 3]);
    let (unit, te) = move_out(&mut a, 1);
    let (_, ti) = move_in(&mut b, 1, &unit);
    for _ in 0..3 {
        assert_eq!(b.tier_step().unwrap(), (0, 0), "nothing of an arriving session is written back");
    }
    b.ticket_done(ti, true).unwrap();
    a.ticket_done(te, true).unwrap();
    let (q, t) = b.tier_step().unwrap();
    assert_eq!(q, 8);
    b.ticket_done(t, true).unwrap();
    assert_eq!(b.where_is(1, 0).place, super::tier_ops::PLACE_BOTH);
    clean(&b);
}

/// A session going A→B→A→B→A, a turn served at each stop: each move takes the next epoch
/// under one incarnation; after each step every unit ever written, replayed at either handle,
/// is refused and changes nothing, and skv_session_fence answers each unit's truth at each
/// handle (PENDING while its import is open, COMMITTED after, ABSENT where it never landed).
/// An unanswered move fenced by ABSENT is retried under the next epoch. Then the session ends
/// and begins afresh at the other handle: another incarnation, epoch 1 again, accepted.
#[test]
fn epochs_over_a_session_that_goes_back_and_forth() {
    let (mut a, _) = tiered(600, 0);
    let (mut b, _) = tiered(600, 0);
    session(&mut a, 1, 8, 30, 8, [-1; 3]);
    let mut units: Vec<Vec<u8>> = Vec::new();
    let mut len = 30;
    let mut origin = 0;
    for k in 0..5usize {
        let (src, dst) = if k % 2 == 0 { (&mut a, &mut b) } else { (&mut b, &mut a) };
        let (mut unit, mut te) = move_out(src, 1);
        if k == 2 {
            // This unit is lost: the source asks, the destination fences it, the source retries.
            assert_eq!(dst.fence(&unit).unwrap(), Answer::Absent, "step {k}");
            let mut out = vec![0; 4096];
            assert!(matches!(dst.import(&spec(1, &[]), &unit, &mut out), Err(Error::State(_))), "step {k}");
            src.ticket_done(te, false).unwrap();
            units.push(unit);
            (unit, te) = move_out(src, 1);
        }
        let h = header(dst, &unit);
        assert_eq!(h.epoch as usize, units.len() + 1, "step {k}: the next epoch");
        assert_eq!(h.committed, len, "step {k}");
        if origin == 0 {
            origin = h.origin;
        }
        assert_eq!(h.origin, origin, "step {k}: one incarnation");
        let (_, ti) = move_in(dst, 1, &unit);
        assert_eq!(dst.fence(&unit).unwrap(), Answer::Pending, "step {k}");
        dst.ticket_done(ti, true).unwrap();
        assert_eq!(dst.fence(&unit).unwrap(), Answer::Committed, "step {k}");
        src.ticket_done(te, true).unwrap();
        units.push(unit);
        // The destination serves the next turn.
        let mut r = Req::default();
        assert_eq!(dst.match_prefix(1, 0, &mut r, len, false).unwrap().hit, 1, "step {k}");
        dst.alloc_extend(&mut r, 5, None).unwrap();
        dst.commit(&mut r, 5).unwrap();
        len += 5;
        (r.origin_input_len, r.output_len) = (len, 0);
        dst.cache_finished_req(1, 0, &mut r, false).unwrap();
        clean(src);
        clean(dst);
        // Every unit so far, replayed at both handles: refused, nothing changed.
        for c in [&mut a, &mut b] {
            let before = snap(c);
            for (j, u) in units.iter().enumerate() {
                let mut out = vec![-1; 4096];
                let got = c.import(&spec(1, &[]), u, &mut out);
                assert!(matches!(got, Err(Error::State(_))), "step {k} unit {j}: {got:?}");
                assert_eq!(snap(c), before, "step {k} unit {j}");
            }
        }
        let holder = if k % 2 == 0 { &mut b } else { &mut a };
        let highest = header(holder, units.last().unwrap()).epoch;
        for (j, u) in units.iter().enumerate() {
            let e = header(holder, u).epoch;
            let want = if e <= highest && j != 2 { Answer::Committed } else { Answer::Absent };
            let got = holder.fence(u).unwrap();
            // The lost unit (index 2) never landed anywhere, but a later epoch committed at the
            // holder: COMMITTED means "this epoch or a later one", which is what a source needs.
            assert!(got == want || (j == 2 && got == Answer::Committed), "step {k} unit {j}: {got:?}");
        }
    }
    // The session ends where it is (B), and begins afresh at A: another incarnation, which
    // B takes at epoch 1 while the old one's units stay fenced there.
    assert!(b.slots().find(1, 0).is_some() && a.slots().find(1, 0).is_none());
    b.release_branch(1, 0).unwrap();
    session(&mut a, 1, 0, 13, 0, [-1; 3]);
    let (fresh, te) = move_out(&mut a, 1);
    let h = header(&b, &fresh);
    assert_eq!(h.epoch, 1);
    assert_ne!(h.origin, origin);
    let (_, ti) = move_in(&mut b, 1, &fresh);
    b.ticket_done(ti, true).unwrap();
    a.ticket_done(te, true).unwrap();
    assert_eq!(b.fence(&fresh).unwrap(), Answer::Committed);
    b.release_branch(1, 0).unwrap();
    for u in &units {
        assert!(matches!(b.import(&spec(1, &[]), u, &mut vec![0; 4096]), Err(Error::State(_))));
    }
    clean(&a);
    clean(&b);
    assert_eq!((a.stats().unwrap().sessions, b.stats().unwrap().sessions), (0, 0));
}

/// A turn that matched an arriving session (skv_match_prefix_tier hits with the import's
/// ticket) runs on its row; the import then fails. The row and its pages must not be freed
/// under the running request: the request's end (abort, or hand-back) frees them once.
#[test]
fn an_import_failing_under_a_running_turn_frees_once() {
    for (hand_back, host) in [(false, 0), (true, 0), (false, 400), (true, 400)] {
        let (mut a, _) = tiered(0, host);
        let (mut b, _) = tiered(0, host);
        let b0 = b.stats().unwrap();
        session(&mut a, 1, 8, 30, 0, [-1; 3]);
        let (unit, te) = move_out(&mut a, 1);
        let (_, ti) = move_in(&mut b, 1, &unit);
        let mut r = Req::default();
        let m = b.match_prefix_tier(1, 0, &mut r, 30, false).unwrap();
        assert_eq!((m.hit, m.ticket), (1, ti));
        let row = r.row().unwrap();
        let before = b.stats().unwrap();
        let got = b.ticket_done(ti, false);
        clean(&b);
        let after = b.stats().unwrap();
        // Whatever the answer, the running request's row and pages are still its own.
        assert!(after.free_rows == before.free_rows, "hand_back {hand_back}: {got:?}: the running row was freed");
        assert_eq!(after.free_pages, before.free_pages, "hand_back {hand_back}: {got:?}");
        got.unwrap();
        assert_eq!(b.where_is(1, 0).state & super::tier_ops::WHERE_FAILED, super::tier_ops::WHERE_FAILED);
        // The turn cannot finish on KV that never arrived; it is handed back or aborted.
        let mut done = r;
        (done.origin_input_len, done.output_len) = (30, 0);
        assert!(
            matches!(b.cache_finished_req(1, 0, &mut done, false), Err(Error::State(m)) if m.contains("never arrived"))
        );
        match hand_back {
            true => b.hand_back(1, 0, &mut r).unwrap(),
            false => b.cache_finished_req(1, 0, &mut r, true).unwrap(),
        }
        assert!(b.slots().find(1, 0).is_none(), "the session never arrived: it ends");
        assert_eq!(r.row(), None);
        clean(&b);
        let s = b.stats().unwrap();
        assert_eq!((s.free_rows, s.free_pages), (b0.free_rows, b0.free_pages), "row {row}: freed once, all of it");
        a.ticket_done(te, false).unwrap();
        clean(&a);
    }
}

/// A stale request naming a moving session's row cannot free or rewrite it, a ticket completes
/// once, and a notification lost after the commit is answered by the fence, after which the
/// session can move straight back.
#[test]
fn a_moving_row_is_untouchable_and_a_lost_notification_is_answered() {
    let (mut a, _) = tiered(0, 0);
    let (mut b, _) = tiered(0, 0);
    session(&mut a, 1, 8, 30, 0, [-1; 3]);
    let (row, s) = a.slots().find(1, 0).map(|(r, s)| (r, *s)).unwrap();
    let (unit, te) = move_out(&mut a, 1);
    let during = snap(&a);
    let stale = Req {
        req_pool_idx: row as i32,
        kv_committed_len: s.committed,
        kv_allocated_len: s.allocated,
        cache_protected_len: s.protected,
        row_generation: s.generation,
        ..Req::default()
    };
    let mut r = stale;
    assert!(a.free_req(&mut r).is_err(), "free_req");
    let mut r = stale;
    assert!(a.free_tail(&mut r, 12).is_err(), "free_tail");
    let mut r = stale;
    assert!(a.trim_overshoot(&mut r, 0).is_err(), "trim_overshoot");
    assert!(a.free_aligned(row, 12, s.allocated).is_err(), "free_aligned");
    let mut r = stale;
    assert!(a.publish_prefix(&mut r, 16).is_err(), "publish_prefix");
    let mut r = stale;
    (r.origin_input_len, r.output_len) = (30, 0);
    assert!(a.cache_finished_req(1, 0, &mut r, false).is_err(), "a finish of the idle slot");
    let mut r = stale;
    assert!(a.cache_finished_req(1, 0, &mut r, true).is_err(), "an abort of the moving slot");
    assert_eq!(snap(&a), during, "nothing changed");
    // The destination commits; its notification is lost; it exports the session back at once.
    let (_, ti) = move_in(&mut b, 1, &unit);
    b.ticket_done(ti, true).unwrap();
    let b1 = snap(&b);
    assert!(b.ticket_done(ti, true).is_err() && b.ticket_done(ti, false).is_err(), "a ticket completes once");
    assert_eq!(snap(&b), b1);
    let (back, tb) = move_out(&mut b, 1);
    let mut out = vec![0; 64];
    assert!(
        matches!(a.import(&spec(1, &[]), &back, &mut out), Err(Error::State(m)) if m.contains("already has a slot")),
        "the source still holds its frozen copy"
    );
    assert_eq!(snap(&a), during);
    // The source's timer: it asks, hears COMMITTED, releases; then takes the session back.
    assert_eq!(b.fence(&unit).unwrap(), Answer::Committed);
    a.ticket_done(te, true).unwrap();
    let a1 = snap(&a);
    assert!(a.ticket_done(te, false).is_err());
    assert_eq!(snap(&a), a1);
    let (_, ta) = move_in(&mut a, 1, &back);
    a.ticket_done(ta, true).unwrap();
    b.ticket_done(tb, true).unwrap();
    assert_eq!(a.slots().find(1, 0).unwrap().1.epoch, 2);
    assert!(b.slots().find(1, 0).is_none());
    clean(&a);
    clean(&b);
}

/// The fence is kept under the unit's key: a move imported under another key would commit
/// where the source's question (its unit's key) never finds it, the answer would be ABSENT,
/// and the source would serve again beside the live copy. A move keeps its key: an import
/// under another is refused, changing nothing.
#[test]
fn a_move_cannot_change_its_key() {
    let (mut a, _) = tiered(0, 0);
    let (mut b, _) = tiered(0, 0);
    session(&mut a, 1, 0, 13, 0, [-1; 3]);
    let (unit, te) = move_out(&mut a, 1);
    let before = snap(&b);
    let mut out = vec![-1; 64];
    for sp in [spec(7, &[]), ImportSpec { branch: 3, ..spec(1, &[]) }] {
        let got = b.import(&sp, &unit, &mut out);
        if let Ok((_, ti)) = got {
            b.ticket_done(ti, true).unwrap();
            assert_eq!(b.fence(&unit).unwrap(), Answer::Committed, "committed under {}/{}", sp.session, sp.branch);
            continue;
        }
        assert!(matches!(&got, Err(Error::InvalidArg(m)) if m.contains("keeps its key")), "{got:?}");
        assert_eq!(snap(&b), before);
    }
    let (_, ti) = move_in(&mut b, 1, &unit);
    b.ticket_done(ti, true).unwrap();
    assert_eq!(b.fence(&unit).unwrap(), Answer::Committed);
    a.ticket_done(te, true).unwrap();
    clean(&b);
}

/// A moved-in session parks and is restored at its destination, then moves on under the next
/// epoch; while it is parked a move of it is refused.
#[test]
fn a_moved_in_session_parks_restores_and_moves_on() {
    let (mut a, _) = tiered(600, 0);
    let (mut b, _) = tiered(600, 400);
    session(&mut a, 1, 8, 30, 8, [-1; 3]);
    let (unit, te) = move_out(&mut a, 1);
    let (_, ti) = move_in(&mut b, 1, &unit);
    b.ticket_done(ti, true).unwrap();
    a.ticket_done(te, true).unwrap();
    let wb = b.park(1, 0).unwrap();
    b.ticket_done(wb, true).unwrap();
    let parked = snap(&b);
    assert!(matches!(b.export(1, 0, true, &mut vec![0; 4096]), Err(Error::State(_))));
    assert_eq!(snap(&b), parked);
    let mut r = Req::default();
    let m = b.match_prefix_tier(1, 0, &mut r, 30, false).unwrap();
    assert_eq!(m.hit, 1);
    b.ticket_done(m.ticket, true).unwrap();
    b.hand_back(1, 0, &mut r).unwrap();
    clean(&b);
    let (back, tb) = move_out(&mut b, 1);
    let h = header(&a, &back);
    assert_eq!((h.epoch, h.origin, h.committed), (2, header(&a, &unit).origin, 30));
    let (_, ta) = move_in(&mut a, 1, &back);
    a.ticket_done(ta, true).unwrap();
    b.ticket_done(tb, true).unwrap();
    clean(&a);
    clean(&b);
    let t = b.tier_stats();
    assert_eq!((t.host_free_pages, t.parked_sessions), (b.tier_stats().host_total_pages - 1, 0), "{t:?}");
}

/// A move of one branch freezes that branch only: releasing the session (all branches or
/// none) is refused and leaves the other branch, which still serves.
#[test]
fn a_branch_moving_holds_its_session_release() {
    let (mut a, _) = tiered(0, 0);
    session(&mut a, 1, 0, 13, 0, [-1; 3]);
    let mut r = Req::default();
    a.alloc_row(&mut r).unwrap();
    a.alloc_extend(&mut r, 9, None).unwrap();
    a.commit(&mut r, 9).unwrap();
    (r.origin_input_len, r.output_len) = (9, 0);
    a.cache_finished_req(1, 1, &mut r, false).unwrap();
    let (_, te) = move_out(&mut a, 1);
    let before = snap(&a);
    assert!(matches!(a.release_session(1), Err(Error::State(_))));
    assert_eq!(snap(&a), before, "neither branch released");
    let mut r = Req::default();
    assert_eq!(a.match_prefix(1, 1, &mut r, 9, false).unwrap().hit, 1, "the other branch serves");
    a.hand_back(1, 1, &mut r).unwrap();
    a.release_branch(1, 1).unwrap();
    a.ticket_done(te, true).unwrap();
    assert_eq!(a.stats().unwrap().sessions, 0);
    clean(&a);
}

/// Refusals that come late in a move export change nothing either: a session whose epochs are
/// spent (it arrived at epoch 2^32 - 1), and an external row whose page starts are not pages.
#[test]
fn late_move_export_refusals_change_nothing() {
    let (mut a, _) = tiered(0, 0);
    let (mut b, _) = tiered(0, 0);
    session(&mut a, 1, 0, 13, 0, [-1; 3]);
    let (mut unit, _) = move_out(&mut a, 1);
    unit[super::unit::at::EPOCH..super::unit::at::EPOCH + 4].copy_from_slice(&u32::MAX.to_ne_bytes());
    let (_, ti) = move_in(&mut b, 1, &unit);
    b.ticket_done(ti, true).unwrap();
    let before = snap(&b);
    let got = b.export(1, 0, true, &mut vec![0; 4096]);
    assert!(matches!(&got, Err(Error::State(m)) if m.contains("every move epoch")), "{got:?}");
    assert_eq!(snap(&b), before);
    let mut r = Req::default();
    assert_eq!(b.match_prefix(1, 0, &mut r, 13, false).unwrap().hit, 1, "it serves");
    b.hand_back(1, 0, &mut r).unwrap();
    // External mode: the row's page starts are read after the plan; a bad one refuses.
    let mut e = external(4, false);
    e.rows.lock().unwrap()[1] = (0..4096).map(|p| p + 40).collect();
    e.rows.lock().unwrap()[1][4] = 41;
    let mut r =
        Req { req_pool_idx: 1, kv_committed_len: 12, kv_allocated_len: 12, origin_input_len: 12, ..Req::default() };
    e.cache.cache_finished_req(1, 0, &mut r, false).unwrap();
    let before = snap(&e.cache);
    let mut buf = vec![0xAA; 4096];
    let got = e.cache.export(1, 0, true, &mut buf);
    assert!(matches!(&got, Err(Error::State(m)) if m.contains("req_to_token[4] = 41")), "{got:?}");
    assert_eq!(snap(&e.cache), before, "no incarnation drawn, no ticket");
    assert!(buf.iter().all(|&x| x == 0xAA));
}

/// A session whose window keeps a floor (sglang's `swa_evict_floor`: SWA pages above the
/// prefix kept below it) moves with floor 0: the destination's window holds the pages past the
/// cursor, each page at its position, and both sides stay whole in either outcome.
#[test]
fn a_window_with_a_floor_moves_its_in_window_pages() {
    for ok in [true, false] {
        let (mut a, _) = tiered(600, 0);
        let (mut b, _) = tiered(600, 0);
        let (a0, b0) = (a.stats().unwrap(), b.stats().unwrap());
        let mut r = Req::default();
        a.alloc_row(&mut r).unwrap();
        let mut idx = vec![0; 8];
        a.pool_alloc(&mut idx).unwrap();
        a.map_prefix(&mut r, &idx).unwrap();
        r.swa_evict_floor = 16;
        a.alloc_extend(&mut r, 30, None).unwrap();
        a.commit(&mut r, 30).unwrap();
        let w = Window { size: 8, eviction_interval: 0, prefix_sharing: true, retain_floor: None };
        a.swa_evict(&mut r, 38, &w).unwrap();
        (r.origin_input_len, r.output_len) = (38, 0);
        a.cache_finished_req(1, 0, &mut r, false).unwrap();
        clean(&a);
        let s = *a.slots().find(1, 0).unwrap().1;
        assert!(s.swa_floor == 16 && s.swa > 16, "{s:?}");
        let held = a.stats().unwrap();
        let swa_a = page_ids(&a, 1, true);
        let (unit, te) = move_out(&mut a, 1);
        let h = header(&b, &unit);
        assert_eq!((h.swa_floor, h.swa_cursor), (0, s.swa / 4 * 4));
        let (out, ti) = move_in(&mut b, 1, &unit);
        let swa_b = page_ids(&b, 1, true);
        let live: Vec<usize> = (0..swa_b.len()).filter(|&p| swa_b[p] != 0).collect();
        assert!(live.iter().all(|&p| (p as u32 + 1) * 4 > h.swa_cursor));
        let sent: Vec<i32> = live.iter().map(|&p| swa_a[p]).collect();
        let u = read_unit(&unit, &Destination { fingerprint: b.unit_fingerprint(), max_context_len: 4096 }).unwrap();
        assert_eq!(u.swa().collect::<Vec<_>>(), sent);
        assert_eq!(out[h.n_full as usize..], live.iter().map(|&p| swa_b[p]).collect::<Vec<_>>()[..]);
        clean(&b);
        b.ticket_done(ti, ok).unwrap();
        a.ticket_done(te, ok).unwrap();
        clean(&a);
        clean(&b);
        if ok {
            b.release_branch(1, 0).unwrap();
            let sa = a.stats().unwrap();
            assert_eq!((a0.free_pages - sa.free_pages, a0.swa_free_pages - sa.swa_free_pages), (2, 2));
        } else {
            assert_eq!(a.stats().unwrap(), held);
        }
        let sb = b.stats().unwrap();
        assert_eq!((sb.free_pages, sb.swa_free_pages), (b0.free_pages, b0.swa_free_pages));
    }
}

/// Random interleavings over two real handles, the engine acting correctly on libskv's
/// answers (a source completes its ticket only on the destination's fence: COMMITTED releases,
/// ABSENT serves again) and the network and the destination acting as they like: units
/// delivered late, twice or to the source, reads completing or failing in any order, imports
/// released mid-copy, turns served wherever the session is live. After every step: both audits
/// clean, never two serving copies, and always one copy that is not an import in progress.
#[test]
fn random_interleavings_keep_one_copy() {
    struct Rng(u64);
    impl Rng {
        fn below(&mut self, n: usize) -> usize {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 % n as u64) as usize
        }
    }
    let mut moves = 0;
    for seed in 1..=40u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let mut h = [tiered(600, 0).0, tiered(600, 0).0];
        session(&mut h[0], 1, 8, 30, 8, [-1; 3]);
        let mut units: Vec<Vec<u8>> = Vec::new();
        // Open exports (handle, unit index, ticket) and imports (handle, ticket).
        let mut exports: Vec<(usize, usize, u64)> = Vec::new();
        let mut imports: Vec<(usize, u64)> = Vec::new();
        for step in 0..150 {
            let at = rng.below(2);
            let what = format!("seed {seed} step {step} at {at}");
            let idle = |c: &Cache| c.slots().find(1, 0).filter(|&(r, s)| c.ticket_of(r) == 0 && !s.in_flight).is_some();
            match rng.below(6) {
                0 if idle(&h[at]) => {
                    let (u, t) = move_out(&mut h[at], 1);
                    units.push(u);
                    exports.push((at, units.len() - 1, t));
                }
                1 if !units.is_empty() => {
                    // Mostly the newest unit to the other side of its export; else any, anywhere.
                    let (d, k) = match (rng.below(3), exports.last()) {
                        (0, _) | (_, None) => (at, rng.below(units.len())),
                        (_, Some(&(s, k, _))) => (1 - s, k),
                    };
                    let mut out = vec![0; 4096];
                    if let Ok((_, t)) = h[d].import(&spec(1, &[]), &units[k], &mut out) {
                        imports.push((d, t));
                    }
                }
                2 if !imports.is_empty() => {
                    let (d, t) = imports.swap_remove(rng.below(imports.len()));
                    h[d].ticket_done(t, rng.below(4) != 0).unwrap();
                }
                3 if !exports.is_empty() => {
                    let i = rng.below(exports.len());
                    let (s, k, t) = exports[i];
                    match h[1 - s].fence(&units[k]).unwrap() {
                        Answer::Committed => {
                            h[s].ticket_done(t, true).unwrap();
                            moves += 1;
                        }
                        Answer::Absent => h[s].ticket_done(t, false).unwrap(),
                        Answer::Pending => continue,
                    }
                    exports.swap_remove(i);
                }
                4 if rng.below(3) == 0 => {
                    // A destination drops an import mid-copy.
                    let open = imports.iter().find(|&&(d, t)| {
                        d == at && h[d].slots().find(1, 0).is_some_and(|(r, _)| h[d].ticket_of(r) == t)
                    });
                    if open.is_some() {
                        h[at].release_branch(1, 0).unwrap();
                    }
                }
                5 if idle(&h[at]) => {
                    let len = h[at].slots().find(1, 0).unwrap().1.committed;
                    let mut r = Req::default();
                    assert_eq!(h[at].match_prefix(1, 0, &mut r, len, false).unwrap().hit, 1, "{what}");
                    h[at].alloc_extend(&mut r, 2, None).unwrap();
                    h[at].commit(&mut r, 2).unwrap();
                    (r.origin_input_len, r.output_len) = (len + 2, 0);
                    h[at].cache_finished_req(1, 0, &mut r, false).unwrap();
                }
                _ => {}
            }
            clean(&h[0]);
            clean(&h[1]);
            let serving = h.iter().filter(|c| idle(c)).count();
            assert!(serving <= 1, "{what}: two serving copies");
            let held = h.iter().any(|c| {
                c.slots().find(1, 0).is_some_and(|(r, _)| {
                    c.tickets.get(c.ticket_of(r)).is_none_or(|p| p.kind != super::tickets::Kind::Import)
                })
            });
            assert!(held, "{what}: no copy left");
        }
        // Wind down: every read fails, every source hears its answer, the session ends. Each
        // handle is back to its fresh pages, but for the tree's prefix the first one holds.
        for (d, t) in imports.drain(..) {
            h[d].ticket_done(t, false).unwrap();
        }
        for (s, k, t) in exports.drain(..) {
            let ok = h[1 - s].fence(&units[k]).unwrap() == Answer::Committed;
            h[s].ticket_done(t, ok).unwrap();
        }
        for (i, c) in h.iter_mut().enumerate() {
            c.release_branch(1, 0).unwrap();
            clean(c);
            let (st, fresh) = (c.stats().unwrap(), tiered(600, 0).0.stats().unwrap());
            let tree = if i == 0 { 2 } else { 0 };
            assert_eq!((st.free_pages + tree, st.swa_free_pages + tree), (fresh.free_pages, fresh.swa_free_pages));
        }
    }
    assert!(moves >= 50, "the interleavings completed {moves} moves");
}
