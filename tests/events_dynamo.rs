//! libskv's KV events read by the router they are for: NVIDIA Dynamo's (crate
//! `dynamo-kv-router`, pinned). Each test encodes events with `skv::events`, decodes them with
//! Dynamo's `zmq_wire::decode_event_batch`, normalizes them as its ZMQ listener does, applies
//! them to its `RadixTree`, and asks the tree what a request would score on each worker:
//! `find_matches(compute_block_hash_for_seq(tokens, block_size, salt))`, the router's
//! overlap in blocks. The engine's own prefix-tree events, where a test needs them, are
//! Dynamo's `RawKvEvent`s serialized as vLLM does.

use dynamo_kv_router::protocols::{
    compute_block_hash_for_seq, BlockHashOptions, KvCacheEventData, KvCacheEventError, WorkerWithDpRank,
};
use dynamo_kv_router::zmq_wire::{decode_event_batch, BlockHashValue, KvCacheSpecKind, RawKvEvent, ZmqEventNormalizer};
use dynamo_kv_router::RadixTree;
use skv::events::{now_ts, BatchEncoder, Frames, SessionKey};

const PS: u32 = 16;

/// Dynamo's router for one model: its event normalizer and its radix tree, fed by several
/// workers (one libskv handle each, data-parallel rank 0).
struct Router {
    normalizer: ZmqEventNormalizer,
    tree: RadixTree,
    next_event_id: u64,
}

impl Router {
    fn new(block_size: u32) -> Self {
        Self { normalizer: ZmqEventNormalizer::new(block_size), tree: RadixTree::new(), next_event_id: 0 }
    }

    /// Applies one batch as Dynamo's ZMQ listener does; one result a normalized event (an
    /// event the normalizer filters out gives none).
    fn apply(&mut self, worker: u64, payload: &[u8]) -> Vec<Result<(), KvCacheEventError>> {
        let batch = decode_event_batch(payload).expect("Dynamo decodes the batch");
        let rank = batch.data_parallel_rank.expect("the batch names its rank") as u32;
        let mut results = Vec::new();
        for raw in batch.events {
            let id = self.next_event_id;
            self.next_event_id += 1;
            let Some(ev) = self.normalizer.normalize(raw, id, WorkerWithDpRank::new(worker, rank)) else {
                continue;
            };
            results.push(self.tree.apply_event(ev.into_router_event().expect("a worker-local event")));
        }
        results
    }

    /// Applies a batch whose every event must apply cleanly.
    fn apply_ok(&mut self, worker: u64, payload: &[u8]) {
        for r in self.apply(worker, payload) {
            r.expect("the router applies the event");
        }
    }

    /// The router's overlap score, in blocks, of a request for `tokens` salted with `salt`,
    /// on `worker` (0 when the tree does not name the worker).
    fn score(&self, worker: u64, tokens: &[u32], salt: Option<&str>) -> u32 {
        let opts = BlockHashOptions { cache_namespace: salt, ..Default::default() };
        let seq = compute_block_hash_for_seq(tokens, PS, opts);
        let scores = self.tree.find_matches(seq, false).scores;
        scores.get(&WorkerWithDpRank::new(worker, 0)).copied().unwrap_or(0)
    }
}

/// `n` token ids, different for each `seed`.
fn tokens(seed: u32, n: u32) -> Vec<u32> {
    (0..n).map(|i| seed.wrapping_mul(100_003).wrapping_add(i * 7) % 150_000).collect()
}

/// One batch holding one store.
fn store(
    enc: &mut BatchEncoder,
    key: &SessionKey,
    parent: Option<u64>,
    first_page: u32,
    toks: &[u32],
) -> (Vec<u8>, Vec<u64>) {
    let mut ids = Vec::new();
    enc.block_stored(key, parent, first_page, toks, &mut ids).unwrap();
    (finish(enc), ids)
}

fn finish(enc: &mut BatchEncoder) -> Vec<u8> {
    let mut out = Vec::new();
    enc.finish(now_ts(), &mut out);
    out
}

fn remove(enc: &mut BatchEncoder, ids: &[u64]) -> Vec<u8> {
    enc.block_removed(ids).unwrap();
    finish(enc)
}

#[test]
fn a_turn_scores_exactly_its_full_pages() {
    let key = SessionKey::new(1);
    let mut enc = BatchEncoder::new(PS, 0).unwrap();
    let mut router = Router::new(PS);
    // Turn 1: an 88-token conversation, 5 full pages and a partial one. Its prompt's pages are
    // stored at the prefill (3 pages), the generated ones at finish (2), chained to the last.
    let turn1 = tokens(1, 88);
    let (b, ids) = store(&mut enc, &key, None, 0, &turn1[..48]);
    router.apply_ok(7, &b);
    let (b, ids2) = store(&mut enc, &key, ids.last().copied(), 3, &turn1[48..80]);
    router.apply_ok(7, &b);
    // Turn 2's request: turn 1's tokens and new ones. It scores the 5 full pages, not the
    // partial one; a shorter request scores its own full pages.
    let mut turn2 = turn1.clone();
    turn2.extend(tokens(2, 40));
    assert_eq!(router.score(7, &turn2, Some(key.salt())), 5);
    assert_eq!(router.score(7, &turn1[..50], Some(key.salt())), 3);
    assert_eq!(router.score(7, &turn1[..15], Some(key.salt())), 0);
    // Turn 2 stores its new full pages from page 5 on: the whole of turn 2's full pages score.
    let (b, _) = store(&mut enc, &key, ids2.last().copied(), 5, &turn2[80..128]);
    router.apply_ok(7, &b);
    assert_eq!(router.score(7, &turn2, Some(key.salt())), 8);
}

#[test]
fn a_store_decodes_to_the_fields_libskv_sets() {
    let key = SessionKey::new(31);
    let mut enc = BatchEncoder::new(PS, 3).unwrap();
    let toks = tokens(3, 32);
    let mut ids = Vec::new();
    enc.block_stored(&key, Some(99), 4, &toks, &mut ids).unwrap();
    let mut payload = Vec::new();
    enc.finish(1234.5, &mut payload);
    let batch = decode_event_batch(&payload).unwrap();
    assert_eq!((batch.ts, batch.data_parallel_rank, batch.events.len()), (1234.5, Some(3), 1));
    let RawKvEvent::BlockStored {
        block_hashes,
        parent_block_hash,
        token_ids,
        block_size,
        medium,
        lora_name,
        cache_namespace,
        group_idx,
        kv_cache_spec_kind,
        session_id,
        ..
    } = &batch.events[0]
    else {
        panic!("a BlockStored: {:?}", batch.events[0]);
    };
    let hashes: Vec<u64> = block_hashes.iter().map(|h| h.into_u64()).collect();
    assert_eq!(hashes, ids);
    assert_eq!(parent_block_hash.map(BlockHashValue::into_u64), Some(99));
    assert_eq!((token_ids, *block_size), (&toks, PS as usize));
    assert_eq!((medium.as_deref(), lora_name.as_deref()), (Some("GPU"), None));
    assert_eq!(cache_namespace.as_deref(), Some("skv-session:31"));
    assert_eq!(session_id.as_deref(), Some("31"));
    assert_eq!((*group_idx, *kv_cache_spec_kind), (Some(0), Some(KvCacheSpecKind::FullAttention)));
}

#[test]
fn another_session_with_the_same_tokens_scores_zero() {
    let (a, b) = (SessionKey::new(1), SessionKey::new(2));
    let mut enc = BatchEncoder::new(PS, 0).unwrap();
    let mut router = Router::new(PS);
    let toks = tokens(5, 80);
    router.apply_ok(1, &store(&mut enc, &a, None, 0, &toks).0);
    assert_eq!(router.score(1, &toks, Some(a.salt())), 5);
    // Session b's request, the same tokens: nothing of session a's counts, nor for an
    // unsalted request.
    assert_eq!(router.score(1, &toks, Some(b.salt())), 0);
    assert_eq!(router.score(1, &toks, None), 0);
    // Session b holding the same tokens on another worker: each session finds its own worker.
    router.apply_ok(2, &store(&mut enc, &b, None, 0, &toks).0);
    assert_eq!((router.score(1, &toks, Some(b.salt())), router.score(2, &toks, Some(b.salt()))), (0, 5));
    assert_eq!((router.score(1, &toks, Some(a.salt())), router.score(2, &toks, Some(a.salt()))), (5, 0));
    // The block ids differ too, so the two chains never share a parent.
    let mut ids_a = Vec::new();
    let mut ids_b = Vec::new();
    enc.block_stored(&a, None, 0, &toks, &mut ids_a).unwrap();
    enc.block_stored(&b, None, 0, &toks, &mut ids_b).unwrap();
    assert!(ids_a.iter().all(|i| !ids_b.contains(i)));
}

#[test]
fn a_removal_drops_that_block_and_its_descendants() {
    let key = SessionKey::new(4);
    let mut enc = BatchEncoder::new(PS, 0).unwrap();
    let mut router = Router::new(PS);
    // Branch 0 holds 5 pages; branch 1 shares its first 3 and holds 2 of its own.
    let main = tokens(6, 80);
    let mut fork = main[..48].to_vec();
    fork.extend(tokens(7, 32));
    let (b, ids) = store(&mut enc, &key, None, 0, &main);
    router.apply_ok(1, &b);
    let (b, fork_ids) = store(&mut enc, &key, Some(ids[2]), 3, &fork[48..]);
    router.apply_ok(1, &b);
    let salt = Some(key.salt());
    assert_eq!((router.score(1, &main, salt), router.score(1, &fork, salt)), (5, 5));
    // The last page of branch 0: exactly that block goes.
    router.apply_ok(1, &remove(&mut enc, &ids[4..]));
    assert_eq!((router.score(1, &main, salt), router.score(1, &fork, salt)), (4, 5));
    // A page both branches stand on: the router keeps no count of holders, so one removal
    // drops it and everything under it, on both branches. (Hence libskv removes a page only
    // when its last holder lets it go.)
    router.apply_ok(1, &remove(&mut enc, &ids[2..3]));
    assert_eq!((router.score(1, &main, salt), router.score(1, &fork, salt)), (2, 2));
    // Dynamo leaves the worker's entries for the blocks under the cut in its lookup (a TODO in
    // its `apply_removed`): a store under one of them is accepted, and stays unreachable.
    let mut longer = fork.clone();
    longer.extend(tokens(8, 16));
    let (b, _) = store(&mut enc, &key, fork_ids.last().copied(), 5, &longer[80..]);
    assert_eq!(router.apply(1, &b), vec![Ok(())]);
    assert_eq!(router.score(1, &longer, salt), 2);
}

#[test]
fn all_blocks_cleared_empties_the_worker() {
    let (a, b) = (SessionKey::new(1), SessionKey::new(2));
    let mut enc = BatchEncoder::new(PS, 0).unwrap();
    let mut router = Router::new(PS);
    let (ta, tb) = (tokens(9, 64), tokens(10, 64));
    router.apply_ok(1, &store(&mut enc, &a, None, 0, &ta).0);
    router.apply_ok(1, &store(&mut enc, &b, None, 0, &tb).0);
    router.apply_ok(2, &store(&mut enc, &a, None, 0, &ta).0);
    enc.all_blocks_cleared().unwrap();
    router.apply_ok(1, &finish(&mut enc));
    assert_eq!((router.score(1, &ta, Some(a.salt())), router.score(1, &tb, Some(b.salt()))), (0, 0));
    assert_eq!(router.score(2, &ta, Some(a.salt())), 4, "another worker keeps its blocks");
    // Stores after the clear start afresh (the first batch after a publisher's start, and an
    // overflow's recovery: clear, then store everything held again).
    enc.all_blocks_cleared().unwrap();
    enc.block_stored(&b, None, 0, &tb, &mut Vec::new()).unwrap();
    router.apply_ok(1, &finish(&mut enc));
    assert_eq!(router.score(1, &tb, Some(b.salt())), 4);
}

#[test]
fn a_block_size_other_than_the_routers_stores_nothing() {
    let key = SessionKey::new(1);
    let toks = tokens(11, 64);
    for (engine, router_bs) in [(2 * PS, PS), (PS, 2 * PS)] {
        let mut enc = BatchEncoder::new(engine, 0).unwrap();
        let mut router = Router::new(router_bs);
        let (b, ids) = store(&mut enc, &key, None, 0, &toks);
        // The event decodes and normalizes, but into a store of no block: Dynamo cuts a
        // store at its first block whose size is not the router's.
        let batch = decode_event_batch(&b).unwrap();
        let raw = batch.events.into_iter().next().unwrap();
        let ev = router.normalizer.normalize(raw, 0, WorkerWithDpRank::new(1, 0)).expect("not filtered");
        let KvCacheEventData::Stored(data) = &ev.event.data else { panic!("a store: {ev:?}") };
        assert!(data.blocks.is_empty(), "engine {engine}, router {router_bs}: {} blocks", data.blocks.len());
        assert_eq!(router.apply(1, &b), vec![Ok(())]);
        let opts = BlockHashOptions { cache_namespace: Some(key.salt()), ..Default::default() };
        let seq = compute_block_hash_for_seq(&toks, router_bs, opts);
        assert!(router.tree.find_matches(seq, false).scores.is_empty());
        // So every later store chained to it is dropped too.
        let (b, _) = store(&mut enc, &key, ids.last().copied(), ids.len() as u32, &tokens(12, engine));
        assert_eq!(router.apply(1, &b), vec![Err(KvCacheEventError::ParentBlockNotFound)]);
    }
}

#[test]
fn a_store_under_an_unknown_parent_is_dropped() {
    let key = SessionKey::new(1);
    let mut enc = BatchEncoder::new(PS, 0).unwrap();
    let mut router = Router::new(PS);
    // The session's pages after a 2-page protected prefix, chained to the engine's last
    // protected block, which nobody published: the router drops the store.
    let toks = tokens(13, 96);
    let (b, _) = store(&mut enc, &key, Some(0xfeed), 2, &toks[32..]);
    assert_eq!(router.apply(1, &b), vec![Err(KvCacheEventError::ParentBlockNotFound)]);
    assert_eq!(router.score(1, &toks, Some(key.salt())), 0);
    // A parent known on another worker only is unknown here too.
    let (b, ids2) = store(&mut enc, &key, None, 0, &toks[..32]);
    router.apply_ok(2, &b);
    let (b, _) = store(&mut enc, &key, ids2.last().copied(), 2, &toks[32..48]);
    assert_eq!(router.apply(1, &b), vec![Err(KvCacheEventError::ParentBlockNotFound)]);
    assert_eq!(router.score(2, &toks, Some(key.salt())), 2);
    // With the engine's prefix published by the engine, salted with the same key, and its last
    // block's hash as the first parent, the whole conversation scores.
    let mut router = Router::new(PS);
    router.apply_ok(1, &engine_store(&[0xe0, 0xe1], None, &toks[..32], Some(key.salt())));
    let (b, _) = store(&mut enc, &key, Some(0xe1), 2, &toks[32..]);
    router.apply_ok(1, &b);
    assert_eq!(router.score(1, &toks, Some(key.salt())), 6);
}

#[test]
fn a_page_must_have_one_id_on_every_worker() {
    // Dynamo's tree node for a run of pages keeps the ids of the first worker that stored
    // them; a parent is looked up among those. libskv's ids depend only on the session, the
    // prefix and the tokens, so the same pages have the same ids on every worker.
    let key = SessionKey::new(1);
    let mut enc = BatchEncoder::new(PS, 0).unwrap();
    let mut router = Router::new(PS);
    let toks = tokens(19, 64);
    let (b1, ids1) = store(&mut enc, &key, None, 0, &toks[..32]);
    let (b2, ids2) = store(&mut enc, &key, None, 0, &toks[..32]);
    assert_eq!((ids1 == ids2, b1[10..] == b2[10..]), (true, true), "the same store, byte for byte past its ts");
    router.apply_ok(1, &b1);
    router.apply_ok(2, &b2);
    for w in [1, 2] {
        router.apply_ok(w, &store(&mut enc, &key, ids1.last().copied(), 2, &toks[32..]).0);
        assert_eq!(router.score(w, &toks, Some(key.salt())), 4);
    }
    // A worker whose publisher gave the same pages other ids (an engine publishing the prefix
    // there, while libskv published it elsewhere): the pages score, but a store chained to
    // their ids is dropped. One fleet, one publisher of a session's prefix.
    router.apply_ok(3, &engine_store(&[0xe0, 0xe1], None, &toks[..32], Some(key.salt())));
    assert_eq!(router.score(3, &toks, Some(key.salt())), 2);
    let (b, _) = store(&mut enc, &key, Some(0xe1), 2, &toks[32..]);
    assert_eq!(router.apply(3, &b), vec![Err(KvCacheEventError::ParentBlockNotFound)]);
}

#[test]
fn a_session_chain_under_an_unsalted_engine_prefix_is_invisible_to_the_sessions_requests() {
    // The router hashes a request's blocks with one salt from the first block on, so a
    // session-salted chain under an engine prefix stored without that salt never matches:
    // the session's salt misses at the prefix, and no salt misses at the session's pages.
    let key = SessionKey::new(1);
    let mut enc = BatchEncoder::new(PS, 0).unwrap();
    let mut router = Router::new(PS);
    let toks = tokens(14, 96);
    router.apply_ok(1, &engine_store(&[0xe0, 0xe1], None, &toks[..32], None));
    router.apply_ok(1, &store(&mut enc, &key, Some(0xe1), 2, &toks[32..]).0);
    assert_eq!(router.score(1, &toks, Some(key.salt())), 0);
    assert_eq!(router.score(1, &toks, None), 2);
}

/// A store as the engine's own prefix cache publishes it: Dynamo's `RawKvEvent` serialized
/// the way vLLM's msgspec does (a tagged map in a `[ts, events, rank]` array).
fn engine_store(hashes: &[u64], parent: Option<u64>, toks: &[u32], salt: Option<&str>) -> Vec<u8> {
    let ev = RawKvEvent::BlockStored {
        block_hashes: hashes.iter().map(|&h| BlockHashValue::Unsigned(h)).collect(),
        parent_block_hash: parent.map(BlockHashValue::Unsigned),
        token_ids: toks.to_vec(),
        block_size: PS as usize,
        medium: Some("GPU".into()),
        lora_name: None,
        cache_namespace: salt.map(str::to_owned),
        block_mm_infos: None,
        is_eagle: None,
        group_idx: None,
        kv_cache_spec_kind: None,
        kv_cache_spec_sliding_window: None,
        locality: None,
        ownership: None,
        session_id: None,
    };
    rmp_serde::to_vec_named(&(1.0f64, vec![ev], Some(0i32))).unwrap()
}

#[test]
fn frames_carry_the_topic_the_big_endian_sequence_and_the_payload() {
    let key = SessionKey::new(1);
    let mut enc = BatchEncoder::new(PS, 0).unwrap();
    let (payload, _) = store(&mut enc, &key, None, 0, &tokens(15, 16));
    let f = Frames::new("kv", 0x0102_0304_0506_0708, &payload);
    let [topic, seq, body] = f.parts();
    assert_eq!((topic, seq), (&b"kv"[..], &[1u8, 2, 3, 4, 5, 6, 7, 8][..]));
    assert_eq!(f.seq(), 0x0102_0304_0506_0708);
    assert_eq!(decode_event_batch(body).unwrap().events.len(), 1);
    assert_eq!(Frames::new("", 0, &payload).parts()[..2], [&b""[..], &[0u8; 8][..]]);
}

#[test]
fn a_batch_keeps_its_events_in_order() {
    let key = SessionKey::new(1);
    let mut enc = BatchEncoder::new(PS, 0).unwrap();
    let mut router = Router::new(PS);
    let toks = tokens(16, 48);
    let mut ids = Vec::new();
    enc.all_blocks_cleared().unwrap();
    enc.block_stored(&key, None, 0, &toks, &mut ids).unwrap();
    enc.block_removed(&ids[2..]).unwrap();
    assert_eq!(enc.len(), 3);
    let b = finish(&mut enc);
    assert!(enc.is_empty(), "finish starts an empty batch");
    let kinds: Vec<_> = decode_event_batch(&b).unwrap().events.iter().map(|e| e.event_type_label()).collect();
    assert_eq!(kinds, ["cleared", "stored", "removed"]);
    router.apply_ok(1, &b);
    assert_eq!(router.score(1, &toks, Some(key.salt())), 2);
}

#[test]
fn integers_of_every_msgpack_width_decode() {
    let widths = [0u64, 0x7f, 0x80, 0xff, 0x100, 0xffff, 0x1_0000, 0xffff_ffff, 0x1_0000_0000, u64::MAX];
    let mut enc = BatchEncoder::new(2, 0).unwrap();
    let toks: Vec<u32> = widths.iter().filter_map(|&w| u32::try_from(w).ok()).collect();
    let mut ids = Vec::new();
    enc.block_stored(&SessionKey::new(1), None, 0, &toks, &mut ids).unwrap();
    enc.block_removed(&widths).unwrap();
    let events = decode_event_batch(&finish(&mut enc)).unwrap().events;
    let RawKvEvent::BlockStored { token_ids, .. } = &events[0] else { panic!("{:?}", events[0]) };
    assert_eq!(token_ids, &toks);
    let RawKvEvent::BlockRemoved { block_hashes, .. } = &events[1] else { panic!("{:?}", events[1]) };
    assert_eq!(block_hashes.iter().map(|h| h.into_u64()).collect::<Vec<_>>(), widths);
}

#[test]
fn block_ids_name_the_session_the_position_the_prefix_and_the_tokens() {
    let (a, b) = (SessionKey::new(1), SessionKey::new(2));
    let s = &mut Vec::new();
    let t = tokens(17, 16);
    let id = a.block_id(Some(5), 3, &t, s);
    assert_eq!(id, SessionKey::new(1).block_id(Some(5), 3, &t, s), "the same in every call");
    let mut t2 = t.clone();
    t2[15] += 1;
    for other in [
        b.block_id(Some(5), 3, &t, s),
        a.block_id(Some(6), 3, &t, s),
        a.block_id(None, 3, &t, s),
        a.block_id(Some(5), 4, &t, s),
        a.block_id(Some(5), 3, &t2, s),
    ] {
        assert_ne!(id, other);
    }
    // An engine's own salt for the session, and the router's view of it.
    let named = SessionKey::with_salt(1, "conversation-abc").unwrap();
    assert_eq!((named.salt(), named.session_id()), ("conversation-abc", 1));
    assert_ne!(named.block_id(Some(5), 3, &t, s), id);
}

#[test]
fn bad_input_is_refused_and_changes_nothing() {
    let key = SessionKey::new(1);
    let msg = |r: skv::core::Result<()>| match r {
        Err(skv::core::Error::InvalidArg(m)) => m,
        other => panic!("InvalidArg: {other:?}"),
    };
    assert!(msg(BatchEncoder::new(0, 0).map(drop)).contains("page_size 0"));
    assert!(msg(BatchEncoder::new(PS, 1 << 31).map(drop)).contains("data_parallel_rank 2147483648"));
    assert!(msg(SessionKey::with_salt(9, "").map(drop)).contains("session 9: the salt is empty"));
    let mut enc = BatchEncoder::new(PS, 0).unwrap();
    let mut ids = vec![1];
    enc.block_stored(&key, None, 0, &tokens(18, 16), &mut ids).unwrap();
    let before = finish(&mut enc.clone());
    for n in [0, 15, 17, 40] {
        let m = msg(enc.block_stored(&key, None, 0, &tokens(18, n), &mut ids));
        assert!(m.contains(&format!("block_stored: {n} token ids are not a whole number of pages of 16")), "{m}");
    }
    assert!(msg(enc.block_stored(&key, None, u32::MAX, &tokens(18, 32), &mut ids)).contains("run past page"));
    // The last page a sequence can have is accepted.
    enc.clone().block_stored(&key, None, u32::MAX, &tokens(18, 16), &mut Vec::new()).unwrap();
    assert!(msg(enc.block_removed(&[])).contains("block_removed: no block id"));
    assert_eq!((ids.len(), enc.len()), (2, 1), "a refused call appends nothing");
    assert_eq!(finish(&mut enc)[10..], before[10..], "the batch is as it was (past its ts)");
}
