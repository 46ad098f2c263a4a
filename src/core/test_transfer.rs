//! Tests of a move between two handles (`transfer`, `unit_ops`): what travels, the commit
//! point, epochs and fences, and that no page is freed while the move may still read it.

use super::test_unit::{owned, saved, spec};
use super::transfer::Answer;
use super::unit::{read_unit, Destination, UNIT_FLAG_MOVE};
use super::*;

fn move_vec(c: &mut Cache, session: u64) -> (Vec<u8>, u64) {
    let mut buf = vec![0; c.export_len(session, 0, true).unwrap()];
    let (n, t) = c.export(session, 0, true, &mut buf).unwrap();
    assert_eq!(n, buf.len());
    (buf, t)
}

/// `[0, allocated)`'s token slots of a session's row (`swa`: the SWA pool's).
fn whole(c: &Cache, session: u64, swa: bool) -> Vec<i32> {
    let (row, s) = c.slots().find(session, 0).unwrap();
    let mut out = vec![0; s.allocated as usize];
    c.row_indices(row, 0, s.allocated, swa, &mut out).unwrap();
    out
}

fn check(c: &Cache) {
    let rep = c.check().unwrap();
    assert_eq!(rep.violations, 0, "{}", rep.first_violation_text());
}

/// Moves session 1 (a tree prefix of 8 tokens, 30 in all) from one handle to another and
/// back, checking position by position, and the pages on both sides at every step.
fn move_and_back(swa_pages: u64) {
    let ps = 4;
    let (mut a, mut b) = (owned(ps, 600, swa_pages), owned(ps, 600, swa_pages));
    let a_free0 = a.stats().unwrap();
    saved(&mut a, 1, 8, 30);
    let s = *a.slots().find(1, 0).unwrap().1;
    let a_held = a.stats().unwrap();
    let (unit, te) = move_vec(&mut a, 1);
    let dest = Destination { fingerprint: b.unit_fingerprint(), max_context_len: 4096 };
    let u = read_unit(&unit, &dest).unwrap();
    let h = u.header;
    assert_eq!((h.flags & UNIT_FLAG_MOVE, h.epoch, h.protected), (UNIT_FLAG_MOVE, 1, 0), "the whole session");
    assert_eq!((h.committed, h.allocated, h.n_full), (s.committed, s.allocated, pages_for(30, ps)));
    assert_eq!(h.swa_floor, 0);
    // While the move reads: no release, no match, no eviction drops it.
    assert!(matches!(a.release_branch(1, 0), Err(Error::State(m)) if m.contains("moving to another instance")));
    let mut r = Req::default();
    assert!(matches!(a.match_prefix(1, 0, &mut r, 30, false), Err(Error::State(m)) if m.contains("being exported")));
    assert_eq!(a.stats().unwrap().free_pages, a_held.free_pages, "nothing freed by the export");
    let before = b.stats().unwrap();
    let mut out = vec![0; (h.n_full + h.n_swa) as usize];
    let (n, ti) = b.import(&spec(1, &[]), &unit, &mut out).unwrap();
    assert_eq!(n, out.len());
    assert_eq!(before.free_pages - b.stats().unwrap().free_pages, h.n_full as u64, "the prefix arrives as own pages");
    // Each position's page, through the unit, lands on the same position's page.
    let (sa, sb) = (whole(&a, 1, false), whole(&b, 1, false));
    let full: Vec<i32> = u.full().collect();
    for (i, (&x, &y)) in sa.iter().zip(&sb).enumerate() {
        let page = i / ps as usize;
        assert_eq!((x / ps as i32, y / ps as i32), (full[page], out[page]), "position {i}");
    }
    if swa_pages > 0 {
        let (wa, wb) = (whole(&a, 1, true), whole(&b, 1, true));
        let swa_ids: Vec<i32> = u.swa().collect();
        let live: Vec<usize> = (0..h.n_full as usize).filter(|&p| wb[p * ps as usize] != 0).collect();
        assert_eq!(live.len(), h.n_swa as usize);
        assert!(live.iter().all(|&p| (p as u32 + 1) * ps > h.swa_cursor), "only in-window pages travel");
        for (k, &p) in live.iter().enumerate() {
            assert_eq!(
                (wa[p * ps as usize] / ps as i32, wb[p * ps as usize] / ps as i32),
                (swa_ids[k], out[h.n_full as usize + k])
            );
        }
    }
    let d = *b.slots().find(1, 0).unwrap().1;
    assert_eq!((d.protected, d.lock_node, d.epoch), (0, 0, 1));
    check(&b);
    assert_eq!(b.fence(&unit).unwrap(), Answer::Pending, "the import is open");
    b.ticket_done(ti, true).unwrap();
    assert_eq!(b.fence(&unit).unwrap(), Answer::Committed, "the commit point");
    a.ticket_done(te, true).unwrap();
    assert!(a.slots().find(1, 0).is_none(), "success releases the source's session");
    let a_after = a.stats().unwrap();
    assert_eq!(a_free0.free_pages - a_after.free_pages, 2, "only the tree's prefix pages stay held");
    assert_eq!(a_after.swa_free_pages + 2 * (swa_pages > 0) as u64, a_free0.swa_free_pages);
    check(&a);
    // A duplicate of the unit (the notification lost after the commit) is fenced.
    let mut out2 = vec![0; out.len()];
    assert!(
        matches!(b.import(&spec(1, &[]), &unit, &mut out2), Err(Error::State(m)) if m.contains("epoch 1 of session 1 branch 0 (origin"))
    );
    // Back: epoch 2; the stale epoch-1 unit is fenced at the first handle too.
    let mut r = Req::default();
    assert_eq!(b.match_prefix(1, 0, &mut r, 30, false).unwrap().hit, 1);
    b.alloc_extend(&mut r, 5, None).unwrap();
    b.commit(&mut r, 5).unwrap();
    (r.origin_input_len, r.output_len) = (35, 0);
    b.cache_finished_req(1, 0, &mut r, false).unwrap();
    let (back, tb) = move_vec(&mut b, 1);
    assert_eq!(read_unit(&back, &dest).unwrap().header.epoch, 2);
    assert!(matches!(a.import(&spec(1, &[]), &unit, &mut out2), Err(Error::State(m)) if m.contains("seen epoch 1")));
    let h2 = read_unit(&back, &dest).unwrap().header;
    let mut out3 = vec![0; (h2.n_full + h2.n_swa) as usize];
    let (_, ta) = a.import(&spec(1, &[]), &back, &mut out3).unwrap();
    a.ticket_done(ta, true).unwrap();
    b.ticket_done(tb, true).unwrap();
    assert_eq!(b.stats().unwrap().free_pages, before.free_pages, "every page of the second handle back");
    assert_eq!(a.slots().find(1, 0).unwrap().1.committed, 35);
    check(&a);
    check(&b);
}

#[test]
fn a_move_carries_the_whole_session_and_back() {
    move_and_back(0);
}

#[test]
fn a_hybrid_move_carries_the_window_only() {
    move_and_back(600);
}

#[test]
fn a_failed_move_leaves_the_session_serving() {
    let (mut a, mut b) = (owned(4, 600, 0), owned(4, 600, 0));
    saved(&mut a, 1, 8, 30);
    let held = a.stats().unwrap();
    let (unit, te) = move_vec(&mut a, 1);
    let mut out = vec![0; 8];
    let (_, ti) = b.import(&spec(1, &[]), &unit, &mut out).unwrap();
    // The read failed: the destination releases once its transfer ended, and says so.
    b.ticket_done(ti, false).unwrap();
    assert!(b.slots().find(1, 0).is_none());
    assert_eq!(b.fence(&unit).unwrap(), Answer::Absent);
    assert!(matches!(b.import(&spec(1, &[]), &unit, &mut out), Err(Error::State(m)) if m.contains("fenced")));
    a.ticket_done(te, false).unwrap();
    assert_eq!(a.stats().unwrap().free_pages, held.free_pages, "nothing freed at the source");
    let mut r = Req::default();
    assert_eq!(a.match_prefix(1, 0, &mut r, 30, false).unwrap().hit, 1, "it serves again");
    a.hand_back(1, 0, &mut r).unwrap();
    // The next move writes a new epoch, which the destination takes.
    let (unit2, _) = move_vec(&mut a, 1);
    let dest = Destination { fingerprint: b.unit_fingerprint(), max_context_len: 4096 };
    assert_eq!(read_unit(&unit2, &dest).unwrap().header.epoch, 2);
    assert!(b.import(&spec(1, &[]), &unit2, &mut out).is_ok());
}

#[test]
fn a_late_notification_is_answered_by_the_fence() {
    let (mut a, mut b) = (owned(4, 600, 0), owned(4, 600, 0));
    saved(&mut a, 1, 0, 13);
    let (unit, _te) = move_vec(&mut a, 1);
    // The unit never arrived: the destination fences the epoch, and a late arrival is refused.
    assert_eq!(b.fence(&unit).unwrap(), Answer::Absent);
    let mut out = vec![0; 4];
    let before = b.stats().unwrap();
    assert!(matches!(b.import(&spec(1, &[]), &unit, &mut out), Err(Error::State(m)) if m.contains("fenced")));
    assert_eq!(b.stats().unwrap().free_pages, before.free_pages, "a refusal changes nothing");
    let (copy, _) = {
        saved(&mut a, 2, 0, 13);
        let mut buf = vec![0; a.export_len(2, 0, false).unwrap()];
        let t = a.export(2, 0, false, &mut buf).unwrap().1;
        (buf, t)
    };
    assert!(matches!(b.fence(&copy), Err(Error::InvalidArg(m)) if m.contains("a copy's unit")));
}

#[test]
fn a_destination_out_of_pages_refuses_and_changes_nothing() {
    let (mut a, mut b) = (owned(4, 600, 0), owned(4, 4, 0));
    saved(&mut a, 1, 8, 30);
    let (unit, _) = move_vec(&mut a, 1);
    let mut out = vec![0; 8];
    assert!(matches!(b.import(&spec(1, &[]), &unit, &mut out), Err(Error::OutOfMemory(_))));
    assert_eq!(b.fence(&unit).unwrap(), Answer::Absent, "nothing was recorded");
}

#[test]
fn an_eviction_passes_over_a_moving_session() {
    let cfg = *owned(4, 600, 0).config();
    let mut a = Cache::new_owned(Config { tier: TierConfig { host_num_token_slots: 400, ..cfg.tier }, ..cfg }).unwrap();
    saved(&mut a, 1, 0, 30);
    let (_unit, te) = move_vec(&mut a, 1);
    let ev = a.tier_evict(1000, true).unwrap();
    assert_eq!(ev.released, 0, "a session being moved stays whole");
    assert!(a.slots().find(1, 0).is_some());
    a.ticket_done(te, true).unwrap();
    assert!(a.slots().find(1, 0).is_none());
}

/// A session that left a handle, ended there, and began afresh elsewhere is another
/// incarnation: its first move is not mistaken for the old one's epoch 1, and the old
/// incarnation's late duplicate is still fenced.
#[test]
fn a_new_incarnation_is_not_fenced_by_an_old_one() {
    let (mut a, mut b, mut c) = (owned(4, 600, 0), owned(4, 600, 0), owned(4, 600, 0));
    saved(&mut a, 1, 0, 13);
    let (old, te) = move_vec(&mut a, 1);
    let mut out = vec![0; 8];
    let (_, ti) = b.import(&spec(1, &[]), &old, &mut out).unwrap();
    b.ticket_done(ti, true).unwrap();
    a.ticket_done(te, true).unwrap();
    b.release_branch(1, 0).unwrap();
    // Begun afresh on a third handle, and moved to the second: epoch 1 again, a new origin.
    saved(&mut c, 1, 0, 21);
    let (new, te2) = move_vec(&mut c, 1);
    let dest = Destination { fingerprint: b.unit_fingerprint(), max_context_len: 4096 };
    let (ho, hn) = (read_unit(&old, &dest).unwrap().header, read_unit(&new, &dest).unwrap().header);
    assert_eq!((ho.epoch, hn.epoch), (1, 1));
    assert_ne!(ho.origin, hn.origin, "another incarnation");
    assert_eq!(b.fence(&new).unwrap(), Answer::Absent, "never committed here");
    // The question fenced epoch 1 of the new incarnation: its retry goes as epoch 2.
    c.ticket_done(te2, false).unwrap();
    let (retry, _) = move_vec(&mut c, 1);
    assert_eq!(read_unit(&retry, &dest).unwrap().header.epoch, 2);
    let (_, ti2) = b.import(&spec(1, &[]), &retry, &mut out).unwrap();
    b.ticket_done(ti2, true).unwrap();
    assert_eq!(b.fence(&retry).unwrap(), Answer::Committed);
    // The old incarnation's duplicate: still fenced, and its answer is its own.
    b.release_branch(1, 0).unwrap();
    assert!(matches!(b.import(&spec(1, &[]), &old, &mut out), Err(Error::State(m)) if m.contains("fenced")));
    assert_eq!(b.fence(&old).unwrap(), Answer::Committed);
}
