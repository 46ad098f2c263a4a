//! The KV events of libskv's session calls, through the C ABI, read by NVIDIA Dynamo's router
//! (crate `dynamo-kv-router`, pinned): every batch `skv_events_drain` hands out is decoded by
//! Dynamo's `zmq_wire::decode_event_batch`, normalized by its `ZmqEventNormalizer` and applied
//! to its `RadixTree`. At every turn boundary each session's score there
//! (`find_matches(compute_block_hash_for_seq(tokens, page_size, salt))`) must equal exactly
//! the full pages libskv holds for it (`skv_branch_usage`), and the router must hold no other
//! block. Scenarios in owned and external mode, then a differential over long random call
//! streams.

use std::collections::{HashMap, HashSet};
use std::ffi::{c_int, c_void, CString};
use std::ptr::{null, null_mut};

use dynamo_kv_router::protocols::{compute_block_hash_for_seq, BlockHashOptions, WorkerWithDpRank};
use dynamo_kv_router::zmq_wire::{decode_event_batch, BlockHashValue, RawKvEvent, ZmqEventNormalizer};
use dynamo_kv_router::RadixTree;
use skv::*;

const WORKER: u64 = 1;

/// Dynamo's router for one worker.
struct Router {
    normalizer: ZmqEventNormalizer,
    tree: RadixTree,
    ps: u32,
    next_event_id: u64,
    /// The sequence number the next batch should carry.
    next_seq: u64,
    gaps: u64,
    /// The medium of each store and removal applied, in order.
    media: Vec<String>,
    /// The lower tiers' blocks (medium CPU), apart from the device's.
    lower: RadixTree,
}

impl Router {
    fn new(ps: u32) -> Self {
        Router {
            normalizer: ZmqEventNormalizer::new(ps),
            tree: RadixTree::new(),
            ps,
            next_event_id: 0,
            next_seq: 0,
            gaps: 0,
            media: Vec::new(),
            lower: RadixTree::new(),
        }
    }

    /// Applies one batch as Dynamo's listener does; every event must apply.
    fn apply(&mut self, seq: u64, payload: &[u8]) {
        if seq != self.next_seq {
            assert!(seq > self.next_seq, "sequence {seq} after {}", self.next_seq);
            self.gaps += seq - self.next_seq;
        }
        self.next_seq = seq + 1;
        let batch = decode_event_batch(payload).expect("Dynamo decodes the batch");
        let rank = batch.data_parallel_rank.expect("the batch names its rank") as u32;
        for raw in batch.events {
            let id = self.next_event_id;
            self.next_event_id += 1;
            if let RawKvEvent::BlockStored { medium, .. } | RawKvEvent::BlockRemoved { medium, .. } = &raw {
                self.media.push(medium.clone().unwrap_or_default());
            }
            let Some(ev) = self.normalizer.normalize(raw, id, WorkerWithDpRank::new(WORKER, rank)) else {
                panic!("an event filtered out");
            };
            let ev = ev.into_router_event().expect("worker-local");
            // As Dynamo's indexer routes them: the device tier (GPU) is the primary tree; other
            // tiers (a parked session's CPU pages) go to a lower-tier index.
            let tree = match ev.targets_primary().expect("a supported residency") {
                true => &mut self.tree,
                false => &mut self.lower,
            };
            tree.apply_event(ev).expect("the router applies the event");
        }
    }

    fn score(&self, tokens: &[u32], salt: &str) -> u32 {
        Self::score_in(&self.tree, self.ps, tokens, salt)
    }

    /// The score in the lower tiers' index (medium CPU).
    fn score_lower(&self, tokens: &[u32], salt: &str) -> u32 {
        Self::score_in(&self.lower, self.ps, tokens, salt)
    }

    fn score_in(tree: &RadixTree, ps: u32, tokens: &[u32], salt: &str) -> u32 {
        let opts = BlockHashOptions { cache_namespace: Some(salt), ..Default::default() };
        let seq = compute_block_hash_for_seq(tokens, ps, opts);
        tree.find_matches(seq, false).scores.get(&WorkerWithDpRank::new(WORKER, 0)).copied().unwrap_or(0)
    }

    /// Blocks the router holds for the worker.
    fn blocks(&self) -> usize {
        self.tree.current_size()
    }
}

fn ok(st: skv_status, what: &str) {
    if let Err(e) = st.ok() {
        panic!("{what}: {e}");
    }
}

// ---------------------------------------------------------------------------------------------
// The engine side of external mode: its req_to_token table and rows.

struct Pool {
    table: Vec<Vec<i32>>,
    free_rows: Vec<i32>,
    next_page: i32,
    ps: u32,
}

/// # Safety
/// `ud` is the test's `Pool`, alive and not otherwise borrowed while a callback runs.
unsafe fn pool<'a>(ud: *mut c_void) -> &'a mut Pool {
    // SAFETY: the contract above.
    unsafe { &mut *(ud as *mut Pool) }
}

unsafe extern "C" fn cb_read_row(ud: *mut c_void, row: i32, start: u32, end: u32, out: *mut i32) -> c_int {
    // SAFETY: the Pool passed as user_data; libskv calls back one at a time.
    let p = unsafe { pool(ud) };
    for (i, pos) in (start..end).enumerate() {
        // SAFETY: libskv hands room for end - start values.
        unsafe { *out.add(i) = p.table[row as usize][pos as usize] };
    }
    0
}

unsafe extern "C" fn cb_free_kv(_ud: *mut c_void, _idx: *const i32, _n: usize) -> c_int {
    0
}

unsafe extern "C" fn cb_free_kv_segment(
    _ud: *mut c_void,
    _row: i32,
    _first_pos: u32,
    _idx: *const i32,
    _n: usize,
    _pools: u32,
) -> c_int {
    0
}

unsafe extern "C" fn cb_free_row(ud: *mut c_void, row: i32) -> c_int {
    // SAFETY: the Pool passed as user_data; libskv calls back one at a time.
    unsafe { pool(ud) }.free_rows.push(row);
    0
}

// ---------------------------------------------------------------------------------------------
// One engine over one handle, feeding one router.

#[derive(Clone, Copy, PartialEq, Debug)]
enum Mode {
    Owned,
    External,
}

struct Setup {
    mode: Mode,
    ps: u32,
    rows: u32,
    max_ctx: u32,
    /// Owned mode's SWA pool, in tokens (0: none).
    swa: u64,
    flags: u32,
    max_batches: u32,
    /// SKV_FLAG_* of the cache.
    cache_flags: u32,
    /// External mode's skv_pool_ops.struct_size (48, or 56 with free_kv_segment's slot).
    ops_size: u32,
    /// External mode: free_kv_segment set (with an ops_size of 56).
    segments: bool,
    /// Owned mode's host tier, in tokens (0: none), with a copy_pages that only queues.
    host: u64,
}

impl Setup {
    fn new(mode: Mode) -> Self {
        Setup {
            mode,
            ps: 4,
            rows: 16,
            max_ctx: 512,
            swa: 0,
            flags: 0,
            max_batches: 0,
            cache_flags: 0,
            ops_size: 48,
            segments: false,
            host: 0,
        }
    }
}

struct Engine {
    c: *mut skv_cache,
    mode: Mode,
    ps: u32,
    pool: *mut Pool,
    router: Router,
    /// Tree pages the engine's own prefix cache published (their hash ids), per session.
    tree_blocks: usize,
    next_tree_hash: u64,
}

impl Drop for Engine {
    fn drop(&mut self) {
        // SAFETY: the handle and the pool were made by `Engine::new`; the handle goes first.
        unsafe {
            skv_cache_free(self.c);
            drop(Box::from_raw(self.pool));
        }
    }
}

impl Engine {
    fn new(s: &Setup) -> Engine {
        let cfg = skv_cache_config {
            struct_size: std::mem::size_of::<skv_cache_config>() as u32,
            page_size: s.ps,
            num_token_slots: 8192 * s.ps as u64,
            num_rows: s.rows,
            max_context_len: s.max_ctx,
            flags: s.cache_flags,
            swa_num_token_slots: s.swa,
            host_num_token_slots: s.host,
            ..Default::default()
        };
        let pool = Box::into_raw(Box::new(Pool {
            table: vec![vec![-1; s.max_ctx as usize]; s.rows as usize],
            free_rows: (0..s.rows as i32).rev().collect(),
            next_page: 1,
            ps: s.ps,
        }));
        let mut c = null_mut();
        // SAFETY: valid pointers; the pool outlives the handle (Drop).
        let st = unsafe {
            match s.mode {
                Mode::Owned => skv_cache_new(&cfg, &mut c),
                Mode::External => {
                    let ops = skv_pool_ops {
                        struct_size: s.ops_size,
                        read_row: Some(cb_read_row),
                        free_kv: Some(cb_free_kv),
                        free_row: Some(cb_free_row),
                        dec_lock_ref: None,
                        free_aux: None,
                        free_kv_segment: if s.segments { Some(cb_free_kv_segment) } else { None },
                    };
                    skv_cache_new_external(&cfg, &ops, pool as *mut c_void, &mut c)
                }
            }
        };
        ok(st, "create");
        if s.host != 0 {
            let hooks = skv_engine_hooks { copy_pages: Some(cb_copy_pages), ..Default::default() };
            let hooks = skv_engine_hooks { struct_size: std::mem::size_of::<skv_engine_hooks>() as u32, ..hooks };
            // SAFETY: a live handle; the hooks use no user data.
            ok(unsafe { skv_cache_set_hooks(c, &hooks, null_mut()) }, "skv_cache_set_hooks");
        }
        let e = Engine {
            c,
            mode: s.mode,
            ps: s.ps,
            pool,
            router: Router::new(s.ps),
            tree_blocks: 0,
            next_tree_hash: 0xe000,
        };
        let ecfg = skv_events_config { flags: s.flags, max_batches: s.max_batches, ..drain_only() };
        // SAFETY: a live handle, a valid config.
        ok(unsafe { skv_events_enable(e.c, &ecfg) }, "skv_events_enable");
        let mut e = e;
        // The first batch, AllBlocksCleared, before the engine's own publisher says anything.
        e.pump();
        e
    }

    /// Drains every pending batch into the router.
    fn pump(&mut self) {
        let mut buf = vec![0u8; 64];
        loop {
            let (mut len, mut seq) = (0usize, 0u64);
            // SAFETY: a live handle; buf holds buf.len() bytes.
            let st = unsafe { skv_events_drain(self.c, buf.as_mut_ptr(), buf.len(), &mut len, &mut seq) };
            if st == skv_status::SKV_ERR_BUFFER {
                buf.resize(len, 0);
                continue;
            }
            ok(st, "skv_events_drain");
            if len == 0 {
                return;
            }
            self.router.apply(seq, &buf[..len]);
        }
    }

    fn alloc_row(&mut self, r: &mut skv_req) {
        match self.mode {
            // SAFETY: a live handle and req.
            Mode::Owned => ok(unsafe { skv_alloc_row(self.c, r) }, "skv_alloc_row"),
            Mode::External => {
                // SAFETY: the test's pool, not borrowed elsewhere.
                let p = unsafe { &mut *self.pool };
                r.req_pool_idx = p.free_rows.pop().expect("a free row");
                (r.kv_allocated_len, r.kv_committed_len, r.cache_protected_len) = (0, 0, 0);
            }
        }
    }

    fn extend(&mut self, r: &mut skv_req, n: u32) {
        match self.mode {
            // SAFETY: a live handle and req.
            Mode::Owned => ok(unsafe { skv_alloc_extend(self.c, r, n, null_mut()) }, "skv_alloc_extend"),
            Mode::External => {
                // SAFETY: the test's pool, not borrowed elsewhere.
                let p = unsafe { &mut *self.pool };
                let row = r.req_pool_idx as usize;
                for pos in r.kv_allocated_len..r.kv_allocated_len + n {
                    let page = match pos % p.ps {
                        0 => {
                            p.next_page += 1;
                            p.next_page
                        }
                        _ => p.table[row][pos as usize - 1] / p.ps as i32,
                    };
                    p.table[row][pos as usize] = page * p.ps as i32 + (pos % p.ps) as i32;
                }
                r.kv_allocated_len += n;
            }
        }
    }

    fn commit(&mut self, r: &mut skv_req, n: u32) {
        match self.mode {
            // SAFETY: a live handle and req.
            Mode::Owned => ok(unsafe { skv_commit(self.c, r, n) }, "skv_commit"),
            Mode::External => r.kv_committed_len += n,
        }
    }

    /// A fresh row's protected prefix from the engine's tree: `n` tokens (whole pages).
    fn tree_prefix(&mut self, r: &mut skv_req, n: u32) {
        match self.mode {
            Mode::Owned => {
                let mut idx = vec![0i32; n as usize];
                // SAFETY: a live handle; idx holds n values.
                ok(unsafe { skv_pool_alloc(self.c, n, idx.as_mut_ptr()) }, "skv_pool_alloc");
                // SAFETY: as above.
                ok(unsafe { skv_map_prefix(self.c, r, idx.as_ptr(), n) }, "skv_map_prefix");
            }
            Mode::External => {
                self.extend(r, n);
                r.kv_committed_len = n;
                r.cache_protected_len = n;
            }
        }
    }

    /// The engine's prefix cache publishes the pages of `tokens` itself, salted with the
    /// session's salt; returns the hash of the last (the session's first parent).
    fn publish_tree(&mut self, tokens: &[u32], salt: &str) -> u64 {
        let pages = tokens.len() / self.ps as usize;
        let hashes: Vec<u64> = (0..pages).map(|i| self.next_tree_hash + i as u64).collect();
        self.next_tree_hash += pages as u64;
        let ev = RawKvEvent::BlockStored {
            block_hashes: hashes.iter().map(|&h| BlockHashValue::Unsigned(h)).collect(),
            parent_block_hash: None,
            token_ids: tokens.to_vec(),
            block_size: self.ps as usize,
            medium: Some("GPU".into()),
            lora_name: None,
            cache_namespace: Some(salt.into()),
            block_mm_infos: None,
            is_eagle: None,
            group_idx: None,
            kv_cache_spec_kind: None,
            kv_cache_spec_sliding_window: None,
            locality: None,
            ownership: None,
            session_id: None,
        };
        let payload = rmp_serde::to_vec_named(&(1.0f64, vec![ev], Some(0i32))).unwrap();
        // The engine's publisher is another one: its events do not count in libskv's numbering.
        let next = self.router.next_seq;
        self.router.apply(next, &payload);
        self.router.next_seq = next;
        self.tree_blocks += pages;
        *hashes.last().unwrap()
    }

    fn tokens(&mut self, s: u64, b: u64, r: &skv_req, first_pos: u32, toks: &[u32]) {
        let t: Vec<i32> = toks.iter().map(|&t| t as i32).collect();
        // SAFETY: a live handle; t holds t.len() values.
        ok(unsafe { skv_events_tokens(self.c, s, b, r, first_pos, t.as_ptr(), t.len()) }, "skv_events_tokens");
    }

    fn matched(&mut self, s: u64, b: u64, r: &mut skv_req, key_len: u32) -> skv_match {
        let mut m = skv_match { hit: 0, prefix_len: 0 };
        // SAFETY: a live handle, req and out.
        ok(unsafe { skv_match_prefix(self.c, s, b, r, key_len, 0, &mut m) }, "skv_match_prefix");
        m
    }

    fn finish(&mut self, s: u64, b: u64, r: &mut skv_req, aborted: bool) {
        // SAFETY: a live handle and req.
        ok(unsafe { skv_cache_finished_req(self.c, s, b, r, aborted as u32) }, "skv_cache_finished_req");
    }

    fn free_rows(&self) -> u64 {
        match self.mode {
            Mode::Owned => {
                // SAFETY: plain integers.
                let mut stats: skv_stats = unsafe { std::mem::zeroed() };
                // SAFETY: a live handle and out.
                ok(unsafe { skv_cache_stats(self.c, &mut stats) }, "skv_cache_stats");
                stats.free_rows as u64
            }
            // SAFETY: the test's pool, not borrowed elsewhere.
            Mode::External => unsafe { &*self.pool }.free_rows.len() as u64,
        }
    }

    fn usage(&self, s: u64, b: u64) -> skv_usage {
        // SAFETY: plain integers.
        let mut u: skv_usage = unsafe { std::mem::zeroed() };
        // SAFETY: a live handle and out.
        ok(unsafe { skv_branch_usage(self.c, s, b, &mut u) }, "skv_branch_usage");
        u
    }
}

// ---------------------------------------------------------------------------------------------
// Conversations: what the engine knows of each branch, and the turns it runs.

/// `n` token ids for `seed`.
fn toks(seed: u64, n: usize) -> Vec<u32> {
    (0..n as u64).map(|i| ((seed.wrapping_mul(0x9e37_79b9) ^ (i * 7919)) % 150_000) as u32).collect()
}

fn salt_of(s: u64) -> String {
    format!("skv-session:{s}")
}

/// One turn of (s, b): the engine's prompt (`prompt`, the whole conversation) and output.
struct Turn<'a> {
    prompt: &'a [u32],
    out: &'a [u32],
    /// Rejected draft tokens past the output (committed, then trimmed by the finish).
    overshoot: u32,
    /// Prefill chunks.
    chunks: u32,
    /// A first turn's tree prefix, in tokens.
    tree: u32,
}

impl Turn<'_> {
    fn plain<'a>(prompt: &'a [u32], out: &'a [u32]) -> Turn<'a> {
        Turn { prompt, out, overshoot: 0, chunks: 1, tree: 0 }
    }
}

/// The reusable prefix length of `prompt` against `held` (what the engine knows the branch holds).
fn common(held: &[u32], prompt: &[u32]) -> u32 {
    held.iter().zip(prompt).take_while(|(a, b)| a == b).count() as u32
}

impl Engine {
    /// Runs the turn up to its finish (not included): match (or a fresh row), prefill in
    /// chunks, decode. Returns the running req.
    fn run(&mut self, s: u64, b: u64, held: &[u32], t: &Turn) -> skv_req {
        let mut r = skv_req { origin_input_len: t.prompt.len() as u32, ..Default::default() };
        let m = self.matched(s, b, &mut r, common(held, t.prompt));
        let mut done = m.prefix_len;
        if m.hit == 0 {
            self.alloc_row(&mut r);
            if t.tree > 0 {
                self.tree_prefix(&mut r, t.tree);
            }
            done = r.kv_committed_len;
        }
        let first = if m.hit == 0 { 0 } else { done };
        let rest = t.prompt.len() as u32 - done;
        let chunk = rest.div_ceil(t.chunks.max(1)).max(1);
        let mut from = first;
        while done < t.prompt.len() as u32 {
            let n = chunk.min(t.prompt.len() as u32 - done);
            self.extend(&mut r, n);
            self.commit(&mut r, n);
            done += n;
            self.tokens(s, b, &r, from, &t.prompt[from as usize..done as usize]);
            from = done;
        }
        if m.hit == 0 && done == from && from == 0 {
            // A prompt wholly inside the tree prefix still names the branch's tokens.
            self.tokens(s, b, &r, 0, t.prompt);
        }
        // Decode: every output token's KV written, then the rejected drafts.
        let n = t.out.len() as u32 + t.overshoot;
        self.extend(&mut r, n);
        self.commit(&mut r, n);
        r.output_len = n;
        r.finished_len = t.out.len() as i32;
        r
    }

    /// A whole turn: `run`, the output's tokens, the finish. Returns the sequence the branch
    /// now holds as the engine knows it.
    fn turn(&mut self, s: u64, b: u64, held: &[u32], t: &Turn) -> Vec<u32> {
        let mut r = self.run(s, b, held, t);
        self.tokens(s, b, &r, t.prompt.len() as u32, t.out);
        self.finish(s, b, &mut r, false);
        let mut seq = t.prompt.to_vec();
        seq.extend_from_slice(t.out);
        seq
    }

    /// The router's score of (s, b)'s sequence against the full pages libskv holds for it.
    fn check(&mut self, s: u64, b: u64, seq: &[u32]) {
        self.check_salted(s, b, seq, &salt_of(s));
    }

    fn check_salted(&mut self, s: u64, b: u64, seq: &[u32], salt: &str) {
        self.pump();
        let held = (self.usage(s, b).committed_tokens / self.ps as u64) as u32;
        assert_eq!(self.router.score(seq, salt), held, "session {s} branch {b}: the router against libskv");
    }
}

fn both(f: impl Fn(Mode)) {
    for m in [Mode::Owned, Mode::External] {
        f(m);
    }
}

/// The host tier's copies are not run: these tests look at events only.
unsafe extern "C" fn cb_copy_pages(
    _ud: *mut c_void,
    _ticket: u64,
    _dir: u32,
    _src: *const i32,
    _dst: *const i32,
    _n_full: usize,
    _n_swa: usize,
) -> c_int {
    0
}

// ---------------------------------------------------------------------------------------------
// Scenarios.

#[test]
fn a_retained_slot_scores_its_full_pages_and_the_next_turn_its_hit() {
    both(|mode| {
        let mut e = Engine::new(&Setup::new(mode));
        let p1 = toks(1, 22);
        let seq = e.turn(1, 0, &[], &Turn { chunks: 3, ..Turn::plain(&p1, &toks(2, 9)) });
        e.check(1, 0, &seq);
        assert_eq!(e.router.score(&seq, &salt_of(1)), 7, "{mode:?}: 31 tokens, 7 full pages");
        // Turn 2: the conversation so far plus a new prompt; the hit reuses the slot.
        let mut p2 = seq.clone();
        p2.extend(toks(3, 6));
        let seq2 = e.turn(1, 0, &seq, &Turn::plain(&p2, &toks(4, 5)));
        e.check(1, 0, &seq2);
        assert_eq!(e.router.score(&seq2, &salt_of(1)), 10);
        assert_eq!(e.router.blocks(), 10);
    });
}

#[test]
fn a_first_turn_under_a_tree_prefix_is_chained_to_the_engines_last_block() {
    both(|mode| {
        let mut e = Engine::new(&Setup::new(mode));
        let p = toks(5, 30);
        // The engine published the 8-token tree prefix with the session's salt.
        let parent = e.publish_tree(&p[..8], &salt_of(7));
        // SAFETY: a live handle; parent is valid.
        ok(unsafe { skv_events_session(e.c, 7, null(), &parent) }, "skv_events_session");
        let seq = e.turn(7, 0, &[], &Turn { tree: 8, ..Turn::plain(&p, &toks(6, 4)) });
        e.check(7, 0, &seq);
        assert_eq!(e.router.score(&seq, &salt_of(7)), 8);
        // libskv stored only its own pages: 2 tree blocks + 6.
        assert_eq!(e.router.blocks(), 8);
        // Released: libskv's pages go, the engine's stay.
        // SAFETY: a live handle.
        ok(unsafe { skv_release_session(e.c, 7) }, "release");
        e.pump();
        assert_eq!((e.router.score(&seq, &salt_of(7)), e.router.blocks()), (2, 2), "{mode:?}");
    });
}

#[test]
fn from_page_zero_libskv_publishes_the_protected_pages_too() {
    both(|mode| {
        let mut e = Engine::new(&Setup { flags: SKV_EVENTS_FROM_PAGE_ZERO, ..Setup::new(mode) });
        let p = toks(8, 26);
        let seq = e.turn(3, 0, &[], &Turn { tree: 12, ..Turn::plain(&p, &toks(9, 6)) });
        e.check(3, 0, &seq);
        assert_eq!(e.router.score(&seq, &salt_of(3)), 8);
    });
}

#[test]
fn overshoot_is_never_stored_and_another_session_with_the_same_tokens_scores_zero() {
    both(|mode| {
        let mut e = Engine::new(&Setup::new(mode));
        let p = toks(10, 13);
        // 13 + 6 tokens kept, 9 rejected drafts committed and trimmed at the finish.
        let seq = e.turn(1, 0, &[], &Turn { overshoot: 9, ..Turn::plain(&p, &toks(11, 6)) });
        e.check(1, 0, &seq);
        assert_eq!((e.router.score(&seq, &salt_of(1)), e.router.blocks()), (4, 4));
        // Session 2, the same tokens: scores 0 with its own salt, and holds its own pages.
        assert_eq!(e.router.score(&seq, &salt_of(2)), 0);
        let seq2 = e.turn(2, 0, &[], &Turn::plain(&p, &toks(11, 6)));
        e.check(2, 0, &seq2);
        e.check(1, 0, &seq);
        assert_eq!(e.router.blocks(), 8);
    });
}

#[test]
fn a_trim_or_tail_free_mid_turn_removes_the_pages_it_cuts() {
    both(|mode| {
        let mut e = Engine::new(&Setup::new(mode));
        let p = toks(12, 20);
        let seq = e.turn(1, 0, &[], &Turn::plain(&p, &toks(13, 4)));
        e.check(1, 0, &seq);
        // Turn 2 runs, then the engine cuts its row back to 9 tokens mid-turn.
        let mut p2 = seq.clone();
        p2.extend(toks(14, 8));
        let mut r = e.run(1, 0, &seq, &Turn::plain(&p2, &toks(15, 2)));
        e.pump();
        assert_eq!(e.router.score(&p2, &salt_of(1)), 8, "the prefill's pages are stored at its commit");
        // SAFETY: a live handle and req.
        ok(unsafe { skv_free_tail(e.c, &mut r, 9) }, "skv_free_tail");
        e.pump();
        assert_eq!(e.router.score(&p2, &salt_of(1)), 2);
        // ... then an overshoot trim of a re-extended row.
        e.extend(&mut r, 11);
        e.commit(&mut r, 11);
        e.tokens(1, 0, &r, 9, &p2[9..20]);
        e.pump();
        assert_eq!(e.router.score(&p2, &salt_of(1)), 5);
        (r.origin_input_len, r.output_len, r.finished_len) = (14, 6, -1);
        // SAFETY: a live handle and req.
        ok(unsafe { skv_trim_overshoot(e.c, &mut r, 2) }, "skv_trim_overshoot");
        e.pump();
        assert_eq!(e.router.score(&p2, &salt_of(1)), 4);
        e.finish(1, 0, &mut r, false);
        e.check(1, 0, &p2[..16]);
        assert_eq!(e.router.blocks(), 4);
    });
}

#[test]
fn a_mid_turn_abort_removes_everything_the_branch_held() {
    both(|mode| {
        let mut e = Engine::new(&Setup::new(mode));
        let p = toks(16, 18);
        let seq = e.turn(1, 0, &[], &Turn::plain(&p, &toks(17, 3)));
        let mut p2 = seq.clone();
        p2.extend(toks(18, 10));
        let mut r = e.run(1, 0, &seq, &Turn::plain(&p2, &toks(19, 3)));
        e.pump();
        assert!(e.router.score(&p2, &salt_of(1)) > 5);
        e.finish(1, 0, &mut r, true);
        e.check(1, 0, &p2);
        assert_eq!(e.router.blocks(), 0);
        // A first turn aborted mid-prefill too.
        let mut r = e.run(2, 0, &[], &Turn::plain(&p, &toks(17, 3)));
        e.pump();
        assert_eq!(e.router.blocks(), 4);
        e.finish(2, 0, &mut r, true);
        e.pump();
        assert_eq!(e.router.blocks(), 0);
    });
}

#[test]
fn a_retried_match_and_a_hand_back_keep_the_hits_pages() {
    both(|mode| {
        let mut e = Engine::new(&Setup::new(mode));
        let p = toks(20, 21);
        let seq = e.turn(1, 0, &[], &Turn::plain(&p, &toks(21, 7)));
        e.check(1, 0, &seq);
        // The next turn's prompt diverges at token 13: the hit's tail past it goes.
        let mut p2 = seq[..13].to_vec();
        p2.extend(toks(22, 9));
        let mut r = skv_req { origin_input_len: p2.len() as u32, ..Default::default() };
        let m = e.matched(1, 0, &mut r, 13);
        assert_eq!((m.hit, m.prefix_len), (1, 13));
        e.pump();
        assert_eq!(e.router.score(&seq, &salt_of(1)), 3);
        // A retry of the same match, then a hand-back: nothing changes.
        let m = e.matched(1, 0, &mut r, 13);
        assert_eq!(m.hit, 1);
        // SAFETY: a live handle and req.
        ok(unsafe { skv_hand_back(e.c, 1, 0, &mut r) }, "skv_hand_back");
        e.check(1, 0, &seq);
        assert_eq!(e.router.blocks(), 3);
        // The turn runs for real later.
        let seq2 = e.turn(1, 0, &seq[..13], &Turn::plain(&p2, &toks(23, 2)));
        e.check(1, 0, &seq2);
        assert_eq!(e.router.blocks(), 6);
    });
}

#[test]
fn two_branches_released_one_at_a_time_keep_their_shared_pages_until_the_last() {
    both(|mode| {
        let mut e = Engine::new(&Setup::new(mode));
        let p = toks(24, 16);
        let a = e.turn(1, 0, &[], &Turn::plain(&p, &toks(25, 8)));
        // Branch 1 forks the conversation after the prompt: 4 pages shared.
        let b = e.turn(1, 1, &[], &Turn::plain(&p, &toks(26, 8)));
        e.check(1, 0, &a);
        e.check(1, 1, &b);
        assert_eq!(e.router.blocks(), 8);
        // SAFETY: a live handle.
        ok(unsafe { skv_release_branch(e.c, 1, 0) }, "release branch 0");
        e.check(1, 1, &b);
        // Branch 0's conversation still scores the pages branch 1 shares with it: one salt
        // for the session, and branch 1 holds them.
        assert_eq!((e.router.score(&a, &salt_of(1)), e.router.blocks()), (4, 6));
        // SAFETY: a live handle.
        ok(unsafe { skv_release_branch(e.c, 1, 1) }, "release branch 1");
        e.check(1, 1, &b);
        assert_eq!((e.router.score(&a, &salt_of(1)), e.router.blocks()), (0, 0));
    });
}

#[test]
fn idle_eviction_releases_the_least_recently_used_session() {
    both(|mode| {
        let mut e = Engine::new(&Setup::new(mode));
        let seqs: Vec<Vec<u32>> =
            (0..3).map(|s| e.turn(s, 0, &[], &Turn::plain(&toks(30 + s, 12), &toks(40 + s, 4)))).collect();
        let (mut sid, mut bid, mut n) = ([0u64; 4], [0u64; 4], 0usize);
        // SAFETY: a live handle; arrays of 4.
        ok(unsafe { skv_idle_sessions(e.c, sid.as_mut_ptr(), bid.as_mut_ptr(), 4, &mut n) }, "idle");
        assert_eq!((n, sid[0]), (3, 0));
        // SAFETY: a live handle.
        ok(unsafe { skv_release_branch(e.c, sid[0], bid[0]) }, "evict");
        for (s, seq) in seqs.iter().enumerate() {
            e.check(s as u64, 0, seq);
        }
        assert_eq!(e.router.blocks(), 8);
    });
}

#[test]
fn a_match_that_releases_the_slot_removes_its_pages() {
    both(|mode| {
        // Aligned reuse: a prompt sharing less than a page with the slot finds nothing whole to
        // reuse, and the match releases the slot before it misses.
        let mut e = Engine::new(&Setup { cache_flags: SKV_FLAG_ALIGNED_REUSE, ..Setup::new(mode) });
        let seq = e.turn(1, 0, &[], &Turn::plain(&toks(55, 22), &toks(56, 9)));
        e.check(1, 0, &seq);
        assert_eq!(e.router.blocks(), 7);
        let mut p2 = seq[..2].to_vec();
        p2.extend(toks(57, 10));
        let seq2 = e.turn(1, 0, &seq, &Turn::plain(&p2, &toks(58, 2)));
        e.check(1, 0, &seq2);
        assert_eq!((e.router.score(&seq, &salt_of(1)), e.router.blocks()), (0, 3), "{mode:?}");
    });
}

#[test]
fn a_hybrid_models_window_changes_nothing_the_router_sees() {
    let mut e = Engine::new(&Setup { swa: 4096, ..Setup::new(Mode::Owned) });
    let p = toks(50, 40);
    let mut r = e.run(1, 0, &[], &Turn::plain(&p, &toks(51, 10)));
    let mut freed = 0u32;
    // SAFETY: a live handle, req and out.
    ok(unsafe { skv_swa_evict(e.c, &mut r, 48, 8, 1, -1, 0, &mut freed) }, "skv_swa_evict");
    assert!(freed > 0);
    e.tokens(1, 0, &r, 40, &toks(51, 10));
    e.finish(1, 0, &mut r, false);
    let mut seq = p.clone();
    seq.extend(toks(51, 10));
    e.check(1, 0, &seq);
    assert_eq!(e.router.score(&seq, &salt_of(1)), 12);
}

#[test]
fn free_req_of_a_first_turn_row_removes_its_published_pages() {
    let mut e = Engine::new(&Setup::new(Mode::Owned));
    let p = toks(52, 17);
    let mut r = e.run(1, 0, &[], &Turn::plain(&p, &[]));
    e.pump();
    assert_eq!(e.router.blocks(), 4);
    // SAFETY: a live handle and req.
    ok(unsafe { skv_free_req(e.c, &mut r) }, "skv_free_req");
    e.pump();
    assert_eq!(e.router.blocks(), 0);
}

#[test]
fn an_engine_salt_is_what_the_router_finds_the_session_by() {
    both(|mode| {
        let mut e = Engine::new(&Setup::new(mode));
        let salt = CString::new("conversation-abc").unwrap();
        // SAFETY: a live handle, a NUL-terminated salt.
        ok(unsafe { skv_events_session(e.c, 9, salt.as_ptr(), null()) }, "skv_events_session");
        let seq = e.turn(9, 0, &[], &Turn::plain(&toks(53, 12), &toks(54, 4)));
        e.check_salted(9, 0, &seq, "conversation-abc");
        assert_eq!(e.router.score(&seq, &salt_of(9)), 0);
    });
}

// ---------------------------------------------------------------------------------------------
// The drain path and the refusals.

#[test]
fn a_small_buffer_gets_the_size_and_loses_nothing() {
    let mut e = Engine::new(&Setup::new(Mode::Owned));
    e.pump();
    let seq = e.turn(1, 0, &[], &Turn::plain(&toks(60, 12), &toks(61, 4)));
    let (mut len, mut s) = (0usize, 77u64);
    let mut small = [0u8; 8];
    // SAFETY: a live handle; small holds 8 bytes.
    let st = unsafe { skv_events_drain(e.c, small.as_mut_ptr(), small.len(), &mut len, &mut s) };
    assert_eq!(st, skv_status::SKV_ERR_BUFFER);
    assert!(last_error_message().starts_with("skv_events_drain: cap 8 <"), "{}", last_error_message());
    assert!(len > 8);
    // (NULL, 0) asks the size too.
    let mut len2 = 0usize;
    // SAFETY: as above.
    let st = unsafe { skv_events_drain(e.c, null_mut(), 0, &mut len2, &mut s) };
    assert_eq!((st, len2, s), (skv_status::SKV_ERR_BUFFER, len, 77));
    e.pump();
    assert_eq!(e.router.score(&seq, &salt_of(1)), 4);
    assert_eq!(e.router.gaps, 0);
}

#[test]
fn an_overflow_drops_batches_then_the_router_converges_on_the_recovery() {
    both(|mode| {
        let mut e = Engine::new(&Setup { max_batches: 2, ..Setup::new(mode) });
        let mut seqs = Vec::new();
        // Nobody drains: the queue (AllBlocksCleared, the first store) fills, the rest drop.
        for s in 0..4 {
            seqs.push(e.turn(s, 0, &[], &Turn { chunks: 2, ..Turn::plain(&toks(70 + s, 14), &toks(80 + s, 3)) }));
        }
        // SAFETY: a live handle.
        ok(unsafe { skv_release_branch(e.c, 1, 0) }, "release");
        e.pump();
        assert!(e.router.gaps > 0, "{mode:?}: batches were dropped");
        for (s, seq) in seqs.iter().enumerate() {
            e.check(s as u64, 0, seq);
        }
        assert_eq!(e.router.blocks(), 12);
    });
}

#[test]
fn a_handle_with_events_off_emits_nothing_and_says_so() {
    let c = bare_handle();
    let mut r = skv_req::default();
    // SAFETY: a live handle and req.
    unsafe {
        ok(skv_alloc_row(c, &mut r), "alloc_row");
        ok(skv_alloc_extend(c, &mut r, 8, null_mut()), "extend");
        ok(skv_commit(c, &mut r, 8), "commit");
        let (mut len, mut seq, mut buf) = (0usize, 0u64, [0u8; 64]);
        let st = skv_events_drain(c, buf.as_mut_ptr(), 64, &mut len, &mut seq);
        assert_eq!(st, skv_status::SKV_ERR_STATE);
        assert_eq!(last_error_message(), "skv_events_drain: events are not enabled on this handle (skv_events_enable)");
        let t = [1i32; 8];
        assert_eq!(skv_events_tokens(c, 1, 0, &r, 0, t.as_ptr(), 8), skv_status::SKV_ERR_STATE);
        assert_eq!(
            last_error_message(),
            "skv_events_tokens: events are not enabled on this handle (skv_events_enable)"
        );
        assert_eq!(skv_events_session(c, 1, null(), null()), skv_status::SKV_ERR_STATE);
        assert_eq!(
            last_error_message(),
            "skv_events_session: events are not enabled on this handle (skv_events_enable)"
        );
        ok(skv_cache_finished_req(c, 1, 0, &mut r, 0), "finish");
        // Too late to enable now: a session holds a slot.
        assert_eq!(skv_events_enable(c, &drain_only()), skv_status::SKV_ERR_STATE);
        assert!(last_error_message().contains("before the handle's first session call: session 1 branch 0 holds row"));
        skv_cache_free(c);
    }
}

#[test]
fn each_refusal_names_the_function_and_the_value() {
    let mut e = Engine::new(&Setup::new(Mode::Owned));
    let mut ecfg = drain_only();
    let refused = |st: skv_status, want: skv_status, text: &str| {
        assert_eq!(st, want, "{}", last_error_message());
        assert!(last_error_message().contains(text), "{:?} lacks {text:?}", last_error_message());
    };
    use skv_status::*;
    // Misaligned pointers point a few bytes into this (aligned) buffer; nothing reads them.
    let mut raw = [0u64; 8];
    let base = raw.as_mut_ptr() as *mut u8;
    let mis = |off: usize| base.wrapping_add(off);
    // SAFETY: a live handle and valid pointers throughout (NULL or misaligned where the test
    // says: each is refused before it is read).
    unsafe {
        refused(skv_events_enable(e.c, &ecfg), SKV_ERR_STATE, "skv_events_enable: events are already enabled");
        refused(skv_events_enable(null_mut(), &ecfg), SKV_ERR_NULL_ARG, "cache is NULL");
        refused(skv_events_enable(e.c, null()), SKV_ERR_NULL_ARG, "cfg is NULL");
        ecfg.flags = 0x10;
        refused(skv_events_enable(e.c, &ecfg), SKV_ERR_INVALID_ARG, "cfg->flags 0x10 has unknown bits");
        ecfg.flags = 0;
        let ep = CString::new("tcp://*:5557").unwrap();
        ecfg.endpoint = ep.as_ptr();
        refused(skv_events_enable(e.c, &ecfg), SKV_ERR_UNSUPPORTED, "cfg->endpoint");
        ecfg.endpoint = null();
        ecfg.data_parallel_rank = 1 << 31;
        refused(skv_events_enable(e.c, &ecfg), SKV_ERR_INVALID_ARG, "data_parallel_rank 2147483648");
        let empty = CString::new("").unwrap();
        refused(
            skv_events_session(e.c, 4, empty.as_ptr(), null()),
            SKV_ERR_INVALID_ARG,
            "session 4: the salt is empty",
        );
        // Session 4's salt stays the default through these (checked at the end).
        refused(
            skv_events_session(null_mut(), 4, null(), null()),
            SKV_ERR_NULL_ARG,
            "skv_events_session: cache is NULL",
        );
        let not_utf8 = CString::new(vec![b's', 0xff, 0xfe]).unwrap();
        refused(
            skv_events_session(e.c, 4, not_utf8.as_ptr(), null()),
            SKV_ERR_INVALID_ARG,
            "skv_events_session: salt is not UTF-8",
        );
        let other = CString::new("another-salt").unwrap();
        let parent = mis(1) as *const u64;
        refused(
            skv_events_session(e.c, 4, other.as_ptr(), parent),
            SKV_ERR_INVALID_ARG,
            &format!("skv_events_session: first_parent {:#x} is not aligned to 8 bytes", parent as usize),
        );
        let mut r = e.run(4, 0, &[], &Turn::plain(&toks(90, 10), &[]));
        refused(skv_events_session(e.c, 4, null(), null()), SKV_ERR_STATE, "session 4 already has 1 holder");
        let t: Vec<i32> = toks(90, 10).iter().map(|&x| x as i32).collect();
        refused(skv_events_tokens(e.c, 4, 0, &r, 11, t.as_ptr(), 2), SKV_ERR_INVALID_ARG, "first_pos 11 leaves a hole");
        let mut bad = t.clone();
        bad[3] += 1;
        refused(skv_events_tokens(e.c, 4, 0, &r, 0, bad.as_ptr(), 10), SKV_ERR_INVALID_ARG, "tokens[3] =");
        bad[3] = -5;
        refused(
            skv_events_tokens(e.c, 4, 0, &r, 0, bad.as_ptr(), 10),
            SKV_ERR_INVALID_ARG,
            "tokens[3] = -5 is negative",
        );
        refused(
            skv_events_tokens(e.c, 4, 0, &r, 510, t.as_ptr(), 3),
            SKV_ERR_INVALID_ARG,
            "first_pos 510 + n 3 > max_context_len 512",
        );
        refused(skv_events_tokens(e.c, 4, 0, &r, 0, null(), 3), SKV_ERR_NULL_ARG, "tokens is NULL");
        refused(skv_events_tokens(e.c, 5, 0, &r, 0, t.as_ptr(), 10), SKV_ERR_STATE, "row 0 holds session 4 branch 0");
        refused(skv_events_tokens(e.c, 4, 1, &r, 0, t.as_ptr(), 10), SKV_ERR_STATE, "row 0 holds session 4 branch 0");
        refused(
            skv_events_tokens(null_mut(), 4, 0, &r, 0, t.as_ptr(), 10),
            SKV_ERR_NULL_ARG,
            "skv_events_tokens: cache is NULL",
        );
        refused(
            skv_events_tokens(e.c, 4, 0, null(), 0, t.as_ptr(), 10),
            SKV_ERR_NULL_ARG,
            "skv_events_tokens: req is NULL",
        );
        let req = mis(4) as *const skv_req;
        refused(
            skv_events_tokens(e.c, 4, 0, req, 0, t.as_ptr(), 10),
            SKV_ERR_INVALID_ARG,
            &format!("skv_events_tokens: req {:#x} is not aligned to 8 bytes", req as usize),
        );
        let tokens = (t.as_ptr() as *const u8).wrapping_add(1) as *const i32;
        refused(
            skv_events_tokens(e.c, 4, 0, &r, 0, tokens, 2),
            SKV_ERR_INVALID_ARG,
            &format!("skv_events_tokens: tokens {:#x} is not aligned to 4 bytes", tokens as usize),
        );
        let huge = isize::MAX as usize / 4 + 1;
        refused(
            skv_events_tokens(e.c, 4, 0, &r, 0, t.as_ptr(), huge),
            SKV_ERR_INVALID_ARG,
            &format!("skv_events_tokens: tokens: {huge} elements is no array's length"),
        );
        // The req's fields (docs/refusals.md), each on a copy of the running req.
        let fields: [(skv_req, &str); 9] = [
            (skv_req { req_pool_idx: -2, ..r }, "req_pool_idx -2 out of range [-1, 16)"),
            (skv_req { req_pool_idx: 16, ..r }, "req_pool_idx 16 out of range [-1, 16)"),
            (skv_req { kv_committed_len: 11, ..r }, "kv_committed_len 11 > kv_allocated_len 10"),
            (skv_req { cache_protected_len: 12, ..r }, "cache_protected_len 12 > kv_committed_len 10"),
            (skv_req { cache_protected_len: 2, ..r }, "cache_protected_len 2 is not a multiple of page_size 4"),
            (skv_req { kv_allocated_len: 513, ..r }, "kv_allocated_len 513 > max_context_len 512"),
            (skv_req { swa_evict_floor: 513, ..r }, "swa_evict_floor 513 > max_context_len 512"),
            (
                skv_req { swa_evicted_seqlen: 11, ..r },
                "swa_evicted_seqlen 11 > max(kv_allocated_len 10, swa_dead_lo 0)",
            ),
            (skv_req { finished_len: -2, ..r }, "finished_len -2 out of range [-1, 0] (output_len)"),
        ];
        for (q, text) in &fields {
            refused(
                skv_events_tokens(e.c, 4, 0, q, 0, t.as_ptr(), 10),
                SKV_ERR_INVALID_ARG,
                &format!("skv_events_tokens: {text}"),
            );
        }
        let fresh = skv_req::default();
        refused(skv_events_tokens(e.c, 4, 0, &fresh, 0, t.as_ptr(), 1), SKV_ERR_INVALID_ARG, "the req holds no row");
        e.finish(4, 0, &mut r, false);
        refused(skv_events_tokens(e.c, 4, 0, &r, 0, t.as_ptr(), 1), SKV_ERR_INVALID_ARG, "the req holds no row");
        // Batches are pending now: no refused drain consumes one, or writes *len or *seq.
        let (mut len, mut seq) = (77usize, 77u64);
        refused(
            skv_events_drain(e.c, null_mut(), 8, &mut len, &mut seq),
            SKV_ERR_NULL_ARG,
            "buf is NULL with 8 elements",
        );
        refused(skv_events_drain(e.c, null_mut(), 0, null_mut(), &mut seq), SKV_ERR_NULL_ARG, "len is NULL");
        let mut words = [0u64; 8];
        let buf = words.as_mut_ptr() as *mut u8;
        refused(
            skv_events_drain(null_mut(), buf, 64, &mut len, &mut seq),
            SKV_ERR_NULL_ARG,
            "skv_events_drain: cache is NULL",
        );
        refused(
            skv_events_drain(e.c, buf, 64, &mut len, null_mut()),
            SKV_ERR_NULL_ARG,
            "skv_events_drain: seq is NULL",
        );
        let inside = buf.wrapping_add(8) as *mut usize;
        refused(
            skv_events_drain(e.c, buf, 64, inside, &mut seq),
            SKV_ERR_INVALID_ARG,
            &format!(
                "skv_events_drain: buf [{:#x}, +64 bytes) and len [{:#x}, +8 bytes) overlap",
                buf as usize, inside as usize
            ),
        );
        let last = buf.wrapping_add(56) as *mut u64;
        refused(
            skv_events_drain(e.c, buf, 64, &mut len, last),
            SKV_ERR_INVALID_ARG,
            &format!(
                "skv_events_drain: buf [{:#x}, +64 bytes) and seq [{:#x}, +8 bytes) overlap",
                buf as usize, last as usize
            ),
        );
        let both: *mut usize = &mut len;
        refused(
            skv_events_drain(e.c, buf, 64, both, both as *mut u64),
            SKV_ERR_INVALID_ARG,
            &format!(
                "skv_events_drain: len [{:#x}, +8 bytes) and seq [{:#x}, +8 bytes) overlap",
                both as usize, both as usize
            ),
        );
        let len_at = mis(1) as *mut usize;
        refused(
            skv_events_drain(e.c, buf, 64, len_at, &mut seq),
            SKV_ERR_INVALID_ARG,
            &format!("skv_events_drain: len {:#x} is not aligned to 8 bytes", len_at as usize),
        );
        let seq_at = mis(20) as *mut u64;
        refused(
            skv_events_drain(e.c, buf, 64, &mut len, seq_at),
            SKV_ERR_INVALID_ARG,
            &format!("skv_events_drain: seq {:#x} is not aligned to 8 bytes", seq_at as usize),
        );
        // A cap no array can have: len and seq lie below buf, so the three do not overlap.
        #[repr(C)]
        struct Outs {
            len: usize,
            seq: u64,
            buf: [u8; 16],
        }
        let mut o = Outs { len: 77, seq: 77, buf: [0; 16] };
        let cap = isize::MAX as usize + 1;
        refused(
            skv_events_drain(e.c, o.buf.as_mut_ptr(), cap, &mut o.len, &mut o.seq),
            SKV_ERR_INVALID_ARG,
            &format!("skv_events_drain: buf: {cap} elements is no array's length"),
        );
        assert_eq!((len, seq, o.len, o.seq), (77, 77, 77, 77), "a refused drain writes neither *len nor *seq");
    }
    e.pump();
    assert_eq!(e.router.gaps, 0, "a refused drain consumed a batch");
    // The refused skv_events_session calls left session 4's salt the default.
    e.check(4, 0, &toks(90, 10));
    assert_eq!(e.router.score(&toks(90, 10), &salt_of(4)), 2);
}

/// A small pool: pages of 4 tokens, 4 rows of 64.
fn small_config() -> skv_cache_config {
    skv_cache_config {
        struct_size: std::mem::size_of::<skv_cache_config>() as u32,
        page_size: 4,
        num_token_slots: 1024,
        num_rows: 4,
        max_context_len: 64,
        flags: 0,
        swa_num_token_slots: 0,
        ..Default::default()
    }
}

/// An owned handle with events off.
fn bare_handle() -> *mut skv_cache {
    let cfg = small_config();
    let mut c = null_mut();
    // SAFETY: valid pointers.
    ok(unsafe { skv_cache_new(&cfg, &mut c) }, "create");
    c
}

fn drain_only() -> skv_events_config {
    skv_events_config {
        struct_size: std::mem::size_of::<skv_events_config>() as u32,
        data_parallel_rank: 0,
        flags: 0,
        max_batches: 0,
        endpoint: null(),
        topic: null(),
    }
}

#[test]
fn a_refused_enable_leaves_the_handles_events_off() {
    use skv_status::*;
    let c = bare_handle();
    let good = drain_only();
    let not_utf8 = CString::new(vec![b't', 0xff]).unwrap();
    let ep = CString::new("tcp://*:5557").unwrap();
    let cases: [(skv_events_config, skv_status, &str); 7] = [
        (
            skv_events_config { struct_size: 16, ..good },
            SKV_ERR_INVALID_ARG,
            "cfg->struct_size 16 < 32, the first published sizeof(skv_events_config)",
        ),
        (skv_events_config { struct_size: 0, ..good }, SKV_ERR_INVALID_ARG, "cfg->struct_size 0 < 32"),
        (skv_events_config { flags: 0x2, ..good }, SKV_ERR_INVALID_ARG, "cfg->flags 0x2 has unknown bits"),
        (skv_events_config { topic: not_utf8.as_ptr(), ..good }, SKV_ERR_INVALID_ARG, "cfg->topic is not UTF-8"),
        (skv_events_config { endpoint: not_utf8.as_ptr(), ..good }, SKV_ERR_INVALID_ARG, "cfg->endpoint is not UTF-8"),
        (
            skv_events_config { endpoint: ep.as_ptr(), ..good },
            SKV_ERR_UNSUPPORTED,
            "cfg->endpoint \"tcp://*:5557\": this libskv has no built-in publisher",
        ),
        (
            skv_events_config { data_parallel_rank: 1 << 31, ..good },
            SKV_ERR_INVALID_ARG,
            "data_parallel_rank 2147483648",
        ),
    ];
    let refused = |st: skv_status, want: skv_status, text: &str| {
        let m = last_error_message();
        assert_eq!(st, want, "{m}");
        assert!(m.starts_with("skv_events_enable: ") && m.contains(text), "{m:?} lacks {text:?}");
    };
    /// A caller's config from a later ABI: bytes past this library's sizeof.
    #[repr(C)]
    struct Wider {
        cfg: skv_events_config,
        next: u64,
    }
    let wider = |next| Wider { cfg: skv_events_config { struct_size: 40, ..good }, next };
    let mut raw = [0u64; 8];
    let misaligned = (raw.as_mut_ptr() as *mut u8).wrapping_add(4) as *const skv_events_config;
    let (mut len, mut seq, mut buf) = (0usize, 77u64, [0u8; 256]);
    // SAFETY: a live handle; valid configs (the misaligned one is refused before it is read).
    unsafe {
        for (cfg, want, text) in &cases {
            refused(skv_events_enable(c, cfg), *want, text);
        }
        refused(
            skv_events_enable(c, misaligned),
            SKV_ERR_INVALID_ARG,
            &format!("cfg {:#x} is not aligned to 8 bytes", misaligned as usize),
        );
        refused(
            skv_events_enable(c, &wider(1).cfg),
            SKV_ERR_INVALID_ARG,
            "cfg->struct_size 40: byte 32, past this library's sizeof(skv_events_config) 32, is non-zero",
        );
        // Every refusal left events off ...
        let st = skv_events_drain(c, buf.as_mut_ptr(), buf.len(), &mut len, &mut seq);
        assert_eq!(st, SKV_ERR_STATE);
        assert_eq!(last_error_message(), "skv_events_drain: events are not enabled on this handle (skv_events_enable)");
        // ... so they can still be enabled, and the first batch is sequence 0: AllBlocksCleared.
        ok(skv_events_enable(c, &wider(0).cfg), "skv_events_enable, a wider config of zeros");
        ok(skv_events_drain(c, buf.as_mut_ptr(), buf.len(), &mut len, &mut seq), "skv_events_drain");
        assert_eq!(seq, 0);
        let batch = decode_event_batch(&buf[..len]).expect("Dynamo decodes the batch");
        assert!(matches!(batch.events[..], [RawKvEvent::AllBlocksCleared { .. }]), "{:?}", batch.events);
        skv_cache_free(c);
    }
}

#[test]
fn the_record_checks_refuse_a_req_that_is_not_libskvs_record() {
    use skv_status::*;
    let refused = |st: skv_status, want: skv_status, text: &str| {
        let m = last_error_message();
        assert_eq!(st, want, "{m}");
        assert!(m.starts_with("skv_events_tokens: ") && m.contains(text), "{m:?} lacks {text:?}");
    };
    // Owned mode with an SWA pool: the record checks but the engine's window cursor.
    let mut e = Engine::new(&Setup { swa: 4096, ..Setup::new(Mode::Owned) });
    let p = toks(30, 10);
    let t: Vec<i32> = p.iter().map(|&x| x as i32).collect();
    let mut r = e.run(1, 0, &[], &Turn::plain(&p, &[]));
    let (row, g) = (r.req_pool_idx, r.row_generation);
    assert_ne!(g, 0, "an owned row's req carries its generation");
    assert_ne!(row, 15);
    let cases: Vec<(skv_req, skv_status, String)> = vec![
        (
            skv_req { aux_state: 3, aux_track: [-1, 3], ..r },
            SKV_ERR_INVALID_ARG,
            "aux_state and aux_track[1] are both recurrent-state handle 3: a release would free it twice".into(),
        ),
        (
            skv_req { aux_track: [5, 5], ..r },
            SKV_ERR_INVALID_ARG,
            "aux_track[0] and aux_track[1] are both recurrent-state handle 5".into(),
        ),
        (
            skv_req { req_pool_idx: 15, row_generation: 0, kv_allocated_len: 0, kv_committed_len: 0, ..r },
            SKV_ERR_NOT_FOUND,
            "row 15 is not in use".into(),
        ),
        (
            skv_req { row_generation: g + 1, ..r },
            SKV_ERR_STATE,
            format!(
                "req_pool_idx {row} is a stale copy: its row_generation is {} but row {row} is now at generation {g}",
                g + 1
            ),
        ),
        (
            skv_req { kv_allocated_len: 11, ..r },
            SKV_ERR_INVALID_ARG,
            format!("kv_allocated_len 11 != 10 tokens mapped by row {row}"),
        ),
        (
            skv_req { cache_protected_len: 4, ..r },
            SKV_ERR_INVALID_ARG,
            format!("cache_protected_len 4 != 0 recorded for row {row}"),
        ),
        (
            skv_req { swa_evicted_seqlen: 4, ..r },
            SKV_ERR_INVALID_ARG,
            format!("swa_evicted_seqlen 4 != 0 recorded for row {row}"),
        ),
    ];
    // SAFETY: a live handle, reqs and tokens.
    unsafe {
        for (q, want, text) in &cases {
            refused(skv_events_tokens(e.c, 1, 0, q, 0, t.as_ptr(), 10), *want, text);
        }
        let kept = r;
        e.finish(1, 0, &mut r, false);
        // A copy kept from the finished turn: its row is the idle slot's now.
        let stale = skv_req { kv_allocated_len: kept.kv_allocated_len + 1, row_generation: 0, ..kept };
        refused(
            skv_events_tokens(e.c, 1, 0, &stale, 0, t.as_ptr(), 10),
            SKV_ERR_STATE,
            &format!(
                "req_pool_idx {row} is a stale copy: row {row} belongs to the idle slot of session 1 branch 0 and \
                 the req disagrees with it (kv_allocated_len 11 != "
            ),
        );
        // Agreeing with the row, it is still not a running turn's req.
        refused(
            skv_events_tokens(e.c, 1, 0, &kept, 0, t.as_ptr(), 10),
            SKV_ERR_STATE,
            &format!("session 1 branch 0 has an idle slot in row {row}"),
        );
    }
    // None of them changed what the router holds.
    e.check(1, 0, &p);
    assert_eq!(e.router.score(&p, &salt_of(1)), 2);
    // External mode with free_kv_segment's slot: the window cursor the pool can free around.
    for (segments, cursor, text) in [
        (
            false,
            4,
            "swa_evicted_seqlen 4 > swa_dead_lo 0: the window freed positions [0, 4), but ops->free_kv_segment is NULL",
        ),
        (true, 6, "swa_evicted_seqlen 6 is not a multiple of page_size 4: past swa_dead_lo 0"),
    ] {
        let mut e = Engine::new(&Setup { ops_size: 56, segments, ..Setup::new(Mode::External) });
        let mut r = e.run(1, 0, &[], &Turn::plain(&p, &[]));
        let q = skv_req { swa_evicted_seqlen: cursor, ..r };
        // SAFETY: a live handle, req and tokens.
        refused(unsafe { skv_events_tokens(e.c, 1, 0, &q, 0, t.as_ptr(), 10) }, SKV_ERR_INVALID_ARG, text);
        e.finish(1, 0, &mut r, false);
        e.check(1, 0, &p);
        assert_eq!(e.router.score(&p, &salt_of(1)), 2);
    }
}

#[test]
fn a_branchs_tokens_come_with_the_row_its_slot_holds() {
    use skv_status::*;
    let refused = |st: skv_status, text: &str| {
        let m = last_error_message();
        assert_eq!(st, SKV_ERR_STATE, "{m}");
        assert!(m.starts_with("skv_events_tokens: ") && m.contains(text), "{m:?} lacks {text:?}");
    };
    let i32s = |v: &[u32]| v.iter().map(|&x| x as i32).collect::<Vec<_>>();
    let mut e = Engine::new(&Setup::new(Mode::Owned));
    // Session 1 branch 0: a finished turn, its slot idle in row1.
    let (p1, o1) = (toks(40, 12), toks(41, 4));
    let mut r1 = e.run(1, 0, &[], &Turn::plain(&p1, &o1));
    let row1 = r1.req_pool_idx;
    e.tokens(1, 0, &r1, p1.len() as u32, &o1);
    e.finish(1, 0, &mut r1, false);
    let seq1 = [p1, o1].concat();
    // Session 2 branch 0: a first turn running in row2.
    let p2 = toks(42, 8);
    let mut r2 = e.run(2, 0, &[], &Turn::plain(&p2, &[]));
    let row2 = r2.req_pool_idx;
    let t2 = i32s(&p2);
    // SAFETY: a live handle, reqs and tokens throughout.
    unsafe {
        refused(
            skv_events_tokens(e.c, 1, 0, &r2, 0, t2.as_ptr(), 8),
            &format!("session 1 branch 0 has an idle slot in row {row1}"),
        );
        // Turn 2 of session 1 branch 0: the hit restores the slot, running, into row1.
        let q1 = [seq1.clone(), toks(43, 5)].concat();
        let mut r1 = e.run(1, 0, &seq1, &Turn::plain(&q1, &[]));
        assert_eq!(r1.req_pool_idx, row1);
        refused(
            skv_events_tokens(e.c, 1, 0, &r2, 0, t2.as_ptr(), 8),
            &format!("session 1 branch 0 has a running slot in row {row1}"),
        );
        let t1 = i32s(&q1);
        for (s, b) in [(3, 0), (1, 1)] {
            refused(
                skv_events_tokens(e.c, s, b, &r1, 0, t1.as_ptr(), t1.len()),
                &format!("row {row1} belongs to the slot of session 1 branch 0"),
            );
        }
        // Another row for session 2 branch 0, whose tokens went with row2.
        let mut r3 = skv_req::default();
        e.alloc_row(&mut r3);
        e.extend(&mut r3, 8);
        e.commit(&mut r3, 8);
        let row3 = r3.req_pool_idx;
        let other = i32s(&toks(44, 8));
        refused(
            skv_events_tokens(e.c, 2, 0, &r3, 0, other.as_ptr(), 8),
            &format!("session 2 branch 0 lives in row {row2}, the req holds row {row3}"),
        );
        ok(skv_free_req(e.c, &mut r3), "skv_free_req");
        e.finish(1, 0, &mut r1, false);
        e.finish(2, 0, &mut r2, false);
        // Nothing refused changed what the router holds.
        e.check(1, 0, &q1);
        e.check(2, 0, &p2);
        assert_eq!((e.router.score(&q1, &salt_of(1)), e.router.score(&p2, &salt_of(2))), (5, 2));
        assert_eq!(e.router.blocks(), 7);
    }
}

/// A pool whose free_row makes each events call on its own handle, from inside the callback.
struct Probe {
    c: *mut skv_cache,
    seen: Vec<(skv_status, String)>,
}

unsafe extern "C" fn probe_read_row(_ud: *mut c_void, _row: i32, start: u32, end: u32, out: *mut i32) -> c_int {
    for i in 0..(end - start) as usize {
        // SAFETY: libskv hands room for end - start values.
        unsafe { *out.add(i) = i as i32 };
    }
    0
}

unsafe extern "C" fn probe_free_row(ud: *mut c_void, _row: i32) -> c_int {
    // SAFETY: the Probe passed as user_data; libskv calls back one at a time.
    let p = unsafe { &mut *(ud as *mut Probe) };
    let cfg = drain_only();
    let salt = CString::new("from-a-callback").unwrap();
    let r = skv_req::default();
    let t = [1i32];
    let (mut len, mut seq, mut buf) = (0usize, 0u64, [0u8; 256]);
    // SAFETY: the handle calling back, and valid pointers.
    unsafe {
        p.seen.push((skv_events_enable(p.c, &cfg), last_error_message()));
        p.seen.push((skv_events_session(p.c, 1, salt.as_ptr(), null()), last_error_message()));
        p.seen.push((skv_events_tokens(p.c, 1, 0, &r, 0, t.as_ptr(), 1), last_error_message()));
        p.seen.push((skv_events_drain(p.c, buf.as_mut_ptr(), buf.len(), &mut len, &mut seq), last_error_message()));
    }
    0
}

#[test]
fn an_events_call_from_inside_a_callback_is_refused_and_changes_nothing() {
    let cfg = small_config();
    let ops = skv_pool_ops {
        struct_size: 48,
        read_row: Some(probe_read_row),
        free_kv: Some(cb_free_kv),
        free_row: Some(probe_free_row),
        dec_lock_ref: None,
        free_aux: None,
        free_kv_segment: None,
    };
    let probe = Box::into_raw(Box::new(Probe { c: null_mut(), seen: Vec::new() }));
    let mut c = null_mut();
    // SAFETY: valid pointers; the probe outlives the handle, and is read here only while no
    // callback runs.
    unsafe {
        ok(skv_cache_new_external(&cfg, &ops, probe as *mut c_void, &mut c), "create");
        (*probe).c = c;
        ok(skv_events_enable(c, &drain_only()), "skv_events_enable");
        // A first turn the engine aborts: libskv hands its row back through free_row.
        let mut r = skv_req { req_pool_idx: 2, ..Default::default() };
        ok(skv_cache_finished_req(c, 1, 0, &mut r, 1), "skv_cache_finished_req, aborted");
        let seen = &(*probe).seen;
        assert_eq!(seen.len(), 4, "free_row ran once");
        let names = ["skv_events_enable", "skv_events_session", "skv_events_tokens", "skv_events_drain"];
        for (name, (st, m)) in names.iter().zip(seen) {
            assert_eq!(*st, skv_status::SKV_ERR_STATE, "{m}");
            assert!(m.starts_with(&format!("{name}: called from inside a libskv callback")), "{m:?}");
        }
        // The drain inside consumed nothing: the first batch, AllBlocksCleared, is still pending.
        let (mut len, mut seq, mut buf) = (0usize, 77u64, [0u8; 256]);
        ok(skv_events_drain(c, buf.as_mut_ptr(), buf.len(), &mut len, &mut seq), "skv_events_drain");
        assert_eq!(seq, 0);
        let batch = decode_event_batch(&buf[..len]).expect("Dynamo decodes the batch");
        assert!(matches!(batch.events[..], [RawKvEvent::AllBlocksCleared { .. }]), "{:?}", batch.events);
        skv_cache_free(c);
        drop(Box::from_raw(probe));
    }
}

// ---------------------------------------------------------------------------------------------
// The differential: long random call streams, audited against the router.

/// A small deterministic generator (splitmix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The audit: every branch's conversation scores exactly the full pages the session holds of
/// it (its own slot's, or another branch's sharing them: one salt a session), and the router
/// holds exactly the distinct blocks of all of them.
fn audit(e: &mut Engine, known: &HashMap<(u64, u64), Vec<u32>>) {
    e.pump();
    let ps = e.ps as usize;
    let held: HashMap<(u64, u64), usize> =
        known.keys().map(|&(s, b)| ((s, b), e.usage(s, b).committed_tokens as usize / ps)).collect();
    let mut distinct = HashSet::new();
    for (&(s, b), seq) in known {
        let want = known
            .iter()
            .filter(|(k, _)| k.0 == s)
            .map(|(k, other)| held[k].min(common(other, seq) as usize / ps))
            .max()
            .unwrap_or(0);
        let score = e.router.score(seq, &salt_of(s)) as usize;
        assert_eq!(score, want, "session {s} branch {b} ({} tokens known, its slot {})", seq.len(), held[&(s, b)]);
        for k in 1..=held[&(s, b)] {
            distinct.insert((s, seq[..k * ps].to_vec()));
        }
    }
    assert_eq!(e.router.blocks(), distinct.len() + e.tree_blocks, "the router's blocks against libskv's");
}

fn differential(mode: Mode, seed: u64, calls: u64) {
    let mut rng = Rng(seed);
    let mut e = Engine::new(&Setup { rows: 12, max_ctx: 256, ..Setup::new(mode) });
    let mut known: HashMap<(u64, u64), Vec<u32>> = HashMap::new();
    let mut n = 0u64;
    let mut turns = 0u64;
    // How often each path ran: evictions, aborts, tail frees, free_aligned, free_req, hits,
    // hand-backs (after a retried match or not).
    let mut ran = [0u64; 7];
    while n < calls {
        let s = rng.below(6);
        let b = rng.below(2);
        let held = known.get(&(s, b)).cloned().unwrap_or_default();
        let idle_rows = e.usage(s, b).slots;
        // Keep a row free for the turn: an idle eviction of the least recently used slot.
        if e.free_rows() < 2 {
            let (mut sid, mut bid, mut cnt) = ([0u64; 1], [0u64; 1], 0usize);
            // SAFETY: a live handle, arrays of 1.
            ok(unsafe { skv_idle_sessions(e.c, sid.as_mut_ptr(), bid.as_mut_ptr(), 1, &mut cnt) }, "idle");
            // SAFETY: a live handle.
            ok(unsafe { skv_release_branch(e.c, sid[0], bid[0]) }, "evict");
            n += 2;
            ran[0] += 1;
            audit(&mut e, &known);
            continue;
        }
        // The prompt: the branch's conversation (or part of it, or another branch's, or
        // another session's) and new tokens.
        let mut prompt = match rng.below(8) {
            0 if !held.is_empty() => held[..rng.below(held.len() as u64) as usize].to_vec(),
            1 => known.get(&(s, 1 - b)).cloned().unwrap_or_default(),
            2 => known.get(&((s + 1) % 6, b)).cloned().unwrap_or_default(),
            _ => held.clone(),
        };
        prompt.extend(toks(rng.next(), 1 + rng.below(20) as usize));
        let out = toks(rng.next(), rng.below(12) as usize);
        if prompt.len() + out.len() + 16 > 250 {
            // SAFETY: a live handle.
            ok(unsafe { skv_release_session(e.c, s) }, "release_session");
            known.retain(|k, _| k.0 != s);
            n += 1;
            audit(&mut e, &known);
            continue;
        }
        if idle_rows > 0 && rng.below(12) == 0 {
            // A hit the engine drops before it runs (after a retried match, or not).
            let mut r = skv_req { origin_input_len: prompt.len() as u32, ..Default::default() };
            let key_len = common(&held, &prompt);
            let mut m = e.matched(s, b, &mut r, key_len);
            if rng.below(2) == 0 {
                m = e.matched(s, b, &mut r, key_len);
            }
            assert_eq!(m.hit, 1);
            // SAFETY: a live handle and req.
            ok(unsafe { skv_hand_back(e.c, s, b, &mut r) }, "skv_hand_back");
            known.insert((s, b), held[..m.prefix_len as usize].to_vec());
            ran[6] += 1;
            n += 3;
            audit(&mut e, &known);
            continue;
        }
        let t = Turn {
            prompt: &prompt,
            out: &out,
            overshoot: rng.below(6) as u32,
            chunks: 1 + rng.below(3) as u32,
            tree: 0,
        };
        let mut r = e.run(s, b, &held, &t);
        n += 4 + t.chunks as u64 * 3;
        turns += 1;
        ran[5] += (idle_rows > 0) as u64;
        match rng.below(10) {
            0 => {
                ran[1] += 1;
                e.finish(s, b, &mut r, true);
                known.remove(&(s, b));
            }
            1 => {
                // A tail free mid-turn, then the finish of what is left.
                let cut = rng.below(r.kv_allocated_len as u64 + 1) as u32;
                // SAFETY: a live handle and req.
                ok(unsafe { skv_free_tail(e.c, &mut r, cut) }, "skv_free_tail");
                ran[2] += 1;
                let keep = cut.min(prompt.len() as u32);
                (r.origin_input_len, r.output_len, r.finished_len) = (keep, 0, -1);
                e.finish(s, b, &mut r, false);
                known.insert((s, b), prompt[..keep as usize].to_vec());
                n += 2;
            }
            2 if r.cache_protected_len == 0 => {
                // A free_aligned of the running row (a slot's or a first turn's).
                let target = rng.below(r.kv_allocated_len as u64 + 1) as u32;
                // SAFETY: a live handle.
                ok(unsafe { skv_free_aligned(e.c, r.req_pool_idx, target, r.kv_allocated_len) }, "free_aligned");
                ran[3] += 1;
                r.kv_allocated_len = target;
                r.kv_committed_len = r.kv_committed_len.min(target);
                let keep = target.min(prompt.len() as u32);
                (r.origin_input_len, r.output_len, r.finished_len) = (keep, 0, -1);
                e.finish(s, b, &mut r, false);
                known.insert((s, b), prompt[..keep as usize].to_vec());
                n += 2;
            }
            3 if mode == Mode::Owned && idle_rows == 0 => {
                // A first turn the engine drops without keeping it.
                // SAFETY: a live handle and req.
                let st = unsafe { skv_free_req(e.c, &mut r) };
                ok(st, "skv_free_req");
                ran[4] += 1;
                known.remove(&(s, b));
            }
            _ => {
                e.tokens(s, b, &r, prompt.len() as u32, &out);
                e.finish(s, b, &mut r, false);
                let mut seq = prompt.clone();
                seq.extend_from_slice(&out);
                known.insert((s, b), seq);
                n += 2;
            }
        }
        if rng.below(25) == 0 {
            // SAFETY: a live handle.
            ok(unsafe { skv_release_session(e.c, s) }, "release_session");
            known.retain(|k, _| k.0 != s);
        }
        known.retain(|&(s, b), _| e.usage(s, b).slots > 0);
        audit(&mut e, &known);
    }
    assert_eq!(e.router.gaps, 0);
    assert!(turns > calls / 40, "{turns} turns");
    let want = if mode == Mode::Owned { 7 } else { 6 };
    assert!(ran.iter().filter(|&&k| k > 0).count() >= want, "{mode:?}: paths run {ran:?}");
    eprintln!("events differential {mode:?}: {n} calls, {turns} turns, paths run {ran:?}");
}

#[test]
fn the_routers_view_equals_libskvs_over_random_call_streams() {
    let calls = std::env::var("SKV_EVENTS_CALLS").ok().and_then(|v| v.parse().ok()).unwrap_or(20_000);
    for (mode, seed) in [(Mode::Owned, 0x5eed_00e0), (Mode::External, 0x5eed_00e1)] {
        differential(mode, seed, calls);
    }
}

#[test]
fn a_parked_session_moves_to_the_cpu_medium_and_a_restore_brings_it_back() {
    let mut e = Engine::new(&Setup { host: 4096, ..Setup::new(Mode::Owned) });
    let seq = e.turn(1, 0, &[], &Turn::plain(&toks(1, 22), &toks(2, 9)));
    let other = e.turn(2, 0, &[], &Turn::plain(&toks(5, 12), &toks(6, 4)));
    e.check(1, 0, &seq);
    e.router.media.clear();
    let mut t = 0;
    // SAFETY: a live handle and a local.
    ok(unsafe { skv_session_park(e.c, 1, 0, &mut t) }, "skv_session_park");
    e.pump();
    assert!(t != 0 && e.router.media.is_empty(), "a write-back publishes nothing: {:?}", e.router.media);
    // SAFETY: a live handle.
    ok(unsafe { skv_ticket_done(e.c, t, 0) }, "skv_ticket_done");
    e.pump();
    assert_eq!(e.router.media, ["GPU", "CPU"], "the park: removed from the device, stored in the host tier");
    // Dynamo keeps the CPU blocks apart: the device score is 0, the host tier's the 7 pages.
    assert_eq!(e.router.score(&seq, &salt_of(1)), 0, "a parked session scores nothing on the device");
    assert_eq!(e.router.score_lower(&seq, &salt_of(1)), 7, "its pages are in the host tier");
    e.check(2, 0, &other);
    // The restore: removed from CPU, stored on the GPU again; then the hit's own answer.
    e.router.media.clear();
    let mut r = skv_req::default();
    // SAFETY: a live handle and a local.
    ok(unsafe { skv_req_init(&mut r) }, "skv_req_init");
    let mut m = skv_tier_match { struct_size: std::mem::size_of::<skv_tier_match>() as u32, ..Default::default() };
    // SAFETY: a live handle and locals.
    ok(unsafe { skv_match_prefix_tier(e.c, 1, 0, &mut r, seq.len() as u32, 0, &mut m) }, "skv_match_prefix_tier");
    assert!(m.hit == 1 && m.ticket != 0, "{m:?}");
    // SAFETY: a live handle.
    ok(unsafe { skv_ticket_done(e.c, m.ticket, 0) }, "skv_ticket_done");
    // SAFETY: a live handle and a local.
    ok(unsafe { skv_hand_back(e.c, 1, 0, &mut r) }, "skv_hand_back");
    e.pump();
    assert_eq!(e.router.media[..2], ["CPU", "GPU"], "the restore: {:?}", e.router.media);
    e.check(1, 0, &seq);
    assert_eq!(e.router.score(&seq, &salt_of(1)), 7);
    assert_eq!(e.router.score_lower(&seq, &salt_of(1)), 0, "restored: nothing left in the host tier");
    // Parked again and released for good: its CPU blocks go.
    // SAFETY: a live handle and a local.
    ok(unsafe { skv_session_park(e.c, 1, 0, &mut t) }, "skv_session_park");
    // SAFETY: a live handle.
    ok(unsafe { skv_ticket_done(e.c, t, 0) }, "skv_ticket_done");
    e.pump();
    e.router.media.clear();
    // SAFETY: a live handle.
    ok(unsafe { skv_release_session(e.c, 1) }, "skv_release_session");
    e.pump();
    assert_eq!(e.router.media, ["CPU"], "a parked session's release removes its CPU blocks");
    assert_eq!(e.router.score_lower(&seq, &salt_of(1)), 0);
    e.check(2, 0, &other);
    assert_eq!(e.router.blocks(), 4, "only session 2's blocks are left");
}

/// A move (docs/transfer.md#kv-events): the destination's import, given the session's tokens,
/// stores its full pages before the source's release removes them, so at no point does the
/// router (one tree per worker here) see the session on neither instance.
#[test]
fn a_moved_session_is_stored_at_the_destination_before_the_source_removes_it() {
    let (mut a, mut b) = (Engine::new(&Setup::new(Mode::Owned)), Engine::new(&Setup::new(Mode::Owned)));
    let seq = a.turn(1, 0, &[], &Turn::plain(&toks(1, 22), &toks(2, 9)));
    a.check(1, 0, &seq);
    let full = (a.usage(1, 0).committed_tokens / a.ps as u64) as u32;
    assert!(full > 0);
    let salt = salt_of(1);
    let seen = |a: &mut Engine, b: &mut Engine, when: &str| {
        a.pump();
        b.pump();
        let (sa, sb) = (a.router.score(&seq, &salt), b.router.score(&seq, &salt));
        assert!(
            sa == full || sb == full,
            "{when}: the router sees {sa} pages at the source and {sb} at the destination"
        );
        (sa, sb)
    };
    let (unit, te) = move_out(&mut a);
    assert_eq!(seen(&mut a, &mut b, "exported"), (full, 0), "an export publishes nothing");
    let ti = move_in(&mut b, &unit, &seq);
    assert_eq!(seen(&mut a, &mut b, "imported"), (full, full), "the destination stores at its import");
    // SAFETY: a live handle.
    ok(unsafe { skv_ticket_done(b.c, ti, 0) }, "the commit");
    assert_eq!(seen(&mut a, &mut b, "committed"), (full, full));
    // SAFETY: a live handle.
    ok(unsafe { skv_ticket_done(a.c, te, 0) }, "the source's completion");
    assert_eq!(seen(&mut a, &mut b, "released"), (0, full), "the source's release removes its blocks");
    b.check(1, 0, &seq);
    assert_eq!(a.router.blocks(), 0, "nothing left at the source");
}

/// `skv_session_export` with SKV_EXPORT_MOVE of (1, 0): the unit and the ticket.
fn move_out(e: &mut Engine) -> (Vec<u8>, u64) {
    let (mut len, mut te) = (0usize, 0u64);
    let mut unit = vec![0u8; 4096];
    // SAFETY: a live handle; unit holds its length.
    let st =
        unsafe { skv_session_export(e.c, 1, 0, SKV_EXPORT_MOVE, unit.as_mut_ptr(), unit.len(), &mut len, &mut te) };
    ok(st, "export");
    unit.truncate(len);
    (unit, te)
}

/// `skv_session_import` of (1, 0) with the session's tokens: the import's ticket.
fn move_in(e: &mut Engine, unit: &[u8], seq: &[u32]) -> u64 {
    let toks_i32: Vec<i32> = seq.iter().map(|&t| t as i32).collect();
    let spec = skv_import {
        struct_size: std::mem::size_of::<skv_import>() as u32,
        flags: 0,
        session_id: 1,
        branch_id: 0,
        row: -1,
        n_prefix: 0,
        prefix_indices: null(),
        lock_node: 0,
        lock_receipt: 0,
        aux_state: -1,
        aux_track: [-1, -1],
        tokens: toks_i32.as_ptr(),
        n_tokens: toks_i32.len() as u64,
    };
    let mut out = vec![0i32; 64];
    let (mut n, mut ti) = (0usize, 0u64);
    // SAFETY: a live handle, the unit's bytes, out's 64 values.
    let st = unsafe {
        skv_session_import(e.c, &spec, unit.as_ptr(), unit.len(), out.as_mut_ptr(), out.len(), &mut n, &mut ti)
    };
    ok(st, "import");
    ti
}

fn done(e: &mut Engine, t: u64, status: i32) {
    // SAFETY: a live handle.
    ok(unsafe { skv_ticket_done(e.c, t, status) }, "skv_ticket_done");
}

/// A failed move, then its retry, then the destination's next turn: the router sees the
/// session's full pages on at least one instance at every step, and afterwards holds only
/// what libskv holds: the failed import's blocks are removed, the source's after the
/// successful move, and the next turn's pages are the destination's.
#[test]
fn a_failed_move_its_retry_and_the_next_turn_leave_nothing_stale() {
    let (mut a, mut b) = (Engine::new(&Setup::new(Mode::Owned)), Engine::new(&Setup::new(Mode::Owned)));
    let seq = a.turn(1, 0, &[], &Turn::plain(&toks(1, 22), &toks(2, 9)));
    let full = (a.usage(1, 0).committed_tokens / a.ps as u64) as u32;
    let salt = salt_of(1);
    let seen = |a: &mut Engine, b: &mut Engine, when: &str| {
        a.pump();
        b.pump();
        let (sa, sb) = (a.router.score(&seq, &salt), b.router.score(&seq, &salt));
        assert!(sa == full || sb == full, "{when}: {sa} pages at the source, {sb} at the destination");
        (sa, sb)
    };
    // The read fails: the destination releases its import (removing what it stored), then the
    // source serves again.
    let (unit, te) = move_out(&mut a);
    let ti = move_in(&mut b, &unit, &seq);
    assert_eq!(seen(&mut a, &mut b, "imported"), (full, full));
    done(&mut b, ti, 1);
    assert_eq!(seen(&mut a, &mut b, "import failed"), (full, 0), "the failed import's blocks are removed");
    assert_eq!(b.router.blocks(), 0, "nothing stale at the destination");
    done(&mut a, te, 1);
    assert_eq!(seen(&mut a, &mut b, "export failed"), (full, 0));
    a.check(1, 0, &seq);
    // The retry lands.
    let (unit, te) = move_out(&mut a);
    let ti = move_in(&mut b, &unit, &seq);
    assert_eq!(seen(&mut a, &mut b, "imported again"), (full, full));
    done(&mut b, ti, 0);
    done(&mut a, te, 0);
    assert_eq!(seen(&mut a, &mut b, "moved"), (0, full));
    assert_eq!(a.router.blocks(), 0, "nothing stale at the source");
    // The destination's next turn extends what it stored.
    let mut prompt = seq.clone();
    prompt.extend(toks(3, 6));
    let seq2 = b.turn(1, 0, &seq, &Turn::plain(&prompt, &toks(4, 5)));
    b.check(1, 0, &seq2);
    let full2 = (b.usage(1, 0).committed_tokens / b.ps as u64) as usize;
    assert!(full2 > full as usize);
    assert_eq!(b.router.blocks(), full2, "the destination's blocks are exactly the session's");
    assert_eq!(a.router.blocks(), 0);
}

/// An import that a turn hit (skv_match_prefix_tier) and whose read then failed: the turn is
/// handed back, which ends the session; the blocks the import stored are removed then, and
/// the source, which serves again, is still seen.
#[test]
fn a_failed_import_under_a_turn_is_removed_when_the_turn_ends() {
    let (mut a, mut b) = (Engine::new(&Setup::new(Mode::Owned)), Engine::new(&Setup::new(Mode::Owned)));
    let seq = a.turn(1, 0, &[], &Turn::plain(&toks(1, 22), &toks(2, 9)));
    let full = (a.usage(1, 0).committed_tokens / a.ps as u64) as usize;
    let (unit, te) = move_out(&mut a);
    let ti = move_in(&mut b, &unit, &seq);
    let mut r = skv_req::default();
    // SAFETY: a live handle and a local.
    ok(unsafe { skv_req_init(&mut r) }, "skv_req_init");
    let mut m = skv_tier_match { struct_size: std::mem::size_of::<skv_tier_match>() as u32, ..Default::default() };
    // SAFETY: a live handle and locals.
    ok(unsafe { skv_match_prefix_tier(b.c, 1, 0, &mut r, seq.len() as u32, 0, &mut m) }, "skv_match_prefix_tier");
    assert_eq!((m.hit, m.ticket), (1, ti));
    done(&mut b, ti, 1);
    b.pump();
    // SAFETY: a live handle and a local.
    ok(unsafe { skv_hand_back(b.c, 1, 0, &mut r) }, "skv_hand_back");
    b.pump();
    assert_eq!(b.router.blocks(), 0, "the failed import's blocks are gone with its session");
    done(&mut a, te, 1);
    a.check(1, 0, &seq);
    assert_eq!(a.router.blocks(), full);
}
