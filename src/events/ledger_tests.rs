use super::*;

const PS: u32 = 4;

fn ledger(max_batches: usize, from_page_zero: bool) -> Ledger {
    Ledger::new(LedgerConfig { page_size: PS, data_parallel_rank: 0, from_page_zero, max_batches }).unwrap()
}

fn toks(seed: u32, n: u32) -> Vec<u32> {
    (0..n).map(|i| seed * 1000 + i).collect()
}

fn rs(row: u32, protected: u32, committed: u32, allocated: u32) -> RowState {
    RowState { row, protected, committed, allocated }
}

/// The events of every queued batch, in order, by their type tags.
fn drain_kinds(l: &mut Ledger) -> Vec<&'static str> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 1 << 20];
    while let Drained::Batch { len, .. } = l.drain(&mut buf) {
        let b = &buf[..len];
        let mut at = 0;
        while at < b.len() {
            let hit = ["AllBlocksCleared", "BlockStored", "BlockRemoved"]
                .into_iter()
                .filter_map(|k| b[at..].windows(k.len()).position(|w| w == k.as_bytes()).map(|p| (p, k)))
                .min();
            match hit {
                Some((p, k)) => {
                    out.push(k);
                    at += p + k.len();
                }
                None => break,
            }
        }
    }
    out
}

#[test]
fn the_first_batch_is_all_blocks_cleared_numbered_zero() {
    let mut l = ledger(8, false);
    let mut buf = [0u8; 64];
    assert!(matches!(l.drain(&mut buf), Drained::Batch { seq: 0, .. }));
    assert!(buf.windows(16).any(|w| w == b"AllBlocksCleared"));
    assert_eq!(l.drain(&mut buf), Drained::Empty);
}

#[test]
fn committed_known_full_pages_are_stored_once_per_block() {
    let mut l = ledger(8, false);
    drain_kinds(&mut l);
    let t = toks(1, 22);
    // 22 tokens known, 13 committed: pages 0..3 committed and known.
    l.tokens((1, 0), rs(3, 0, 13, 22), 0, &t).unwrap();
    assert_eq!(l.chain((1, 0)).unwrap().1.len(), 3);
    // A second branch sharing the first 8 tokens then diverging: shares 2 blocks.
    let mut t2 = t[..8].to_vec();
    t2.extend(toks(2, 8));
    l.tokens((1, 1), rs(4, 0, 16, 16), 0, &t2).unwrap();
    assert_eq!(l.blocks(), 5);
    assert_eq!(drain_kinds(&mut l), ["BlockStored", "BlockStored"]);
    // Branch 0 released: its own page goes, the shared ones stay (branch 1 holds them).
    l.remove((1, 0));
    assert_eq!(l.blocks(), 4);
    assert_eq!(drain_kinds(&mut l), ["BlockRemoved"]);
    l.remove((1, 1));
    assert_eq!(l.blocks(), 0);
    assert_eq!(l.holder_of_row(4), None);
}

#[test]
fn protected_pages_are_never_published() {
    let mut l = ledger(8, false);
    l.tokens((1, 0), rs(0, 8, 16, 16), 0, &toks(1, 16)).unwrap();
    assert_eq!(l.chain((1, 0)).unwrap().0, 2);
    assert_eq!(l.chain((1, 0)).unwrap().1.len(), 2);
    // From page zero, the protected pages are the session's too.
    let mut z = ledger(8, true);
    z.tokens((1, 0), rs(0, 8, 16, 16), 0, &toks(1, 16)).unwrap();
    assert_eq!(z.chain((1, 0)).unwrap().0, 0);
    assert_eq!(z.chain((1, 0)).unwrap().1.len(), 4);
}

#[test]
fn a_drop_releases_pages_past_the_held_length_and_forgets_their_tokens() {
    let mut l = ledger(8, false);
    l.tokens((1, 0), rs(0, 0, 16, 16), 0, &toks(1, 16)).unwrap();
    drain_kinds(&mut l);
    l.shortened(0, 9);
    assert_eq!(l.chain((1, 0)).unwrap().1.len(), 2);
    assert_eq!(drain_kinds(&mut l), ["BlockRemoved"]);
    // Position 9 on was forgotten: other tokens there are accepted, and stored once committed.
    let other = toks(7, 7);
    l.tokens((1, 0), rs(0, 0, 9, 9), 9, &other).unwrap();
    assert_eq!(l.chain((1, 0)).unwrap().1.len(), 2);
    l.held((1, 0), 16, 16);
    assert_eq!(l.chain((1, 0)).unwrap().1.len(), 4);
    assert_eq!(drain_kinds(&mut l), ["BlockStored"]);
}

#[test]
fn a_hole_or_a_changed_held_token_is_refused_and_changes_nothing() {
    let mut l = ledger(8, false);
    l.tokens((1, 0), rs(0, 0, 8, 10), 0, &toks(1, 10)).unwrap();
    drain_kinds(&mut l);
    let before = (l.chain((1, 0)).unwrap().1.to_vec(), l.blocks());
    let e = l.tokens((1, 0), rs(0, 0, 12, 12), 11, &toks(1, 2)).unwrap_err();
    assert!(e.to_string().contains("first_pos 11 leaves a hole"), "{e}");
    let mut changed = toks(1, 12);
    changed[5] = 99;
    let e = l.tokens((1, 0), rs(0, 0, 12, 12), 0, &changed).unwrap_err();
    assert!(e.to_string().contains("tokens[5] = 99 at position 5 differs"), "{e}");
    let e = l.tokens((1, 0), rs(1, 0, 12, 12), 10, &toks(1, 2)).unwrap_err();
    assert!(e.to_string().contains("lives in row 0, the req holds row 1"), "{e}");
    let e = l.tokens((2, 0), rs(0, 0, 12, 12), 0, &toks(1, 2)).unwrap_err();
    assert!(e.to_string().contains("row 0 holds session 1 branch 0"), "{e}");
    assert_eq!((l.chain((1, 0)).unwrap().1.to_vec(), l.blocks()), before);
    assert_eq!(drain_kinds(&mut l), Vec::<&str>::new());
    // A token past the held length may change (an engine's retried output).
    let mut past = toks(1, 10);
    past[9] = 5;
    l.tokens((1, 0), rs(0, 0, 8, 9), 0, &past).unwrap();
}

#[test]
fn a_session_salt_is_set_before_its_first_tokens() {
    let mut l = ledger(8, false);
    l.set_session(5, Some("conv-5"), Some(77)).unwrap();
    assert_eq!(l.salt(5), "conv-5");
    l.tokens((5, 0), rs(0, 0, 4, 4), 0, &toks(1, 4)).unwrap();
    let e = l.set_session(5, None, None).unwrap_err();
    assert!(matches!(e, Error::State(_)), "{e}");
    assert!(matches!(l.set_session(6, Some(""), None), Err(Error::InvalidArg(_))));
    // The first page is chained to the first parent.
    let id = SessionKey::with_salt(5, "conv-5").unwrap().block_id(Some(77), 0, &toks(1, 4), &mut Vec::new());
    assert_eq!(l.chain((5, 0)).unwrap().1, [id]);
    l.remove((5, 0));
    assert_eq!(l.salt(5), "conv-5", "kept for the session's next first turn");
    l.forget_session(5);
    assert_eq!(l.salt(5), "skv-session:5");
}

#[test]
fn an_overflow_drops_a_batch_then_recovers_with_everything_held() {
    let mut l = ledger(2, false);
    // Queue: [cleared]. Three stores: one fits, two are dropped.
    for s in 1..=3u64 {
        l.tokens((s, 0), rs(s as u32, 0, 8, 8), 0, &toks(s as u32, 8)).unwrap();
        l.close();
    }
    assert_eq!((l.queued(), l.dropped()), (2, 2));
    let mut buf = vec![0u8; 4096];
    assert!(matches!(l.drain(&mut buf), Drained::Batch { seq: 0, .. }));
    assert!(matches!(l.drain(&mut buf), Drained::Batch { seq: 1, .. }));
    // The recovery: a gap (2 and 3 were spent), then clear and the three chains.
    match l.drain(&mut buf) {
        Drained::Batch { seq: 4, len } => {
            let b = &buf[..len];
            assert_eq!(b.windows(16).filter(|w| w == b"AllBlocksCleared").count(), 1);
            assert_eq!(b.windows(11).filter(|w| w == b"BlockStored").count(), 3);
        }
        other => panic!("the recovery batch: {other:?}"),
    }
    assert_eq!(l.drain(&mut buf), Drained::Empty);
}

#[test]
fn a_small_buffer_consumes_nothing() {
    let mut l = ledger(8, false);
    let mut small = [0u8; 4];
    let len = match l.drain(&mut small) {
        Drained::TooSmall { len } => len,
        other => panic!("{other:?}"),
    };
    let mut buf = vec![0u8; len];
    assert_eq!(l.drain(&mut buf), Drained::Batch { seq: 0, len });
}

#[test]
fn the_recovery_stores_a_shared_block_once() {
    let mut l = ledger(1, false);
    let t = toks(1, 8);
    l.tokens((1, 0), rs(0, 0, 8, 8), 0, &t).unwrap();
    l.tokens((1, 1), rs(1, 0, 8, 8), 0, &t).unwrap();
    l.close();
    assert_eq!(l.dropped(), 1);
    let mut buf = vec![0u8; 4096];
    assert!(matches!(l.drain(&mut buf), Drained::Batch { seq: 0, .. }));
    match l.drain(&mut buf) {
        Drained::Batch { seq: 2, len } => {
            let b = &buf[..len];
            assert_eq!(b.windows(11).filter(|w| w == b"BlockStored").count(), 1);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_session_counts_its_blocks_only_while_it_has_two_holders() {
    let mut l = ledger(64, false);
    drain_kinds(&mut l);
    let t = toks(3, 16);
    l.tokens((1, 0), rs(0, 0, 16, 16), 0, &t).unwrap();
    // A second branch over the same pages: nothing new is stored, and the pages stay while
    // either holds them.
    l.tokens((1, 1), rs(1, 0, 8, 8), 0, &t[..8]).unwrap();
    assert_eq!(drain_kinds(&mut l), ["BlockStored"]);
    l.remove((1, 0));
    assert_eq!((l.blocks(), drain_kinds(&mut l)), (2, vec!["BlockRemoved"]));
    // Back to one holder, then a third branch: the counts start again from the chains held.
    l.tokens((1, 2), rs(2, 0, 16, 16), 0, &t).unwrap();
    assert_eq!((l.blocks(), drain_kinds(&mut l)), (4, vec!["BlockStored"]));
    l.remove((1, 1));
    assert_eq!((l.blocks(), drain_kinds(&mut l)), (4, vec![]));
    l.remove((1, 2));
    assert_eq!((l.blocks(), drain_kinds(&mut l)), (0, vec!["BlockRemoved"]));
}
