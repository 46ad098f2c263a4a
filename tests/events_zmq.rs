//! The built-in ZMQ publisher (`--features zmq`) against a real subscriber: a SUB socket of
//! the `zmq` crate in its own context, as a router's listener connects (NVIDIA Dynamo's
//! standalone indexer uses the same crate). Each test waits for the subscription to take
//! (a PUB socket drops what it sends before a subscriber's subscription arrives: ZMQ's slow
//! joiner) by publishing probe batches until one is received, then asserts on everything
//! that follows. What arrives goes through Dynamo's decoder and radix tree.

use std::collections::HashMap;
use std::ffi::CString;
use std::net::TcpListener;
use std::ptr::null_mut;
use std::sync::mpsc;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use dynamo_kv_router::protocols::{compute_block_hash_for_seq, BlockHashOptions, WorkerWithDpRank};
use dynamo_kv_router::zmq_wire::{decode_event_batch, RawKvEvent, ZmqEventNormalizer};
use dynamo_kv_router::RadixTree;
use skv::core::Error;
use skv::events::{now_ts, rank_endpoint, BatchEncoder, Full, Publisher, SessionKey, STOP_LINGER};
use skv::*;

const PS: u32 = 16;
/// How long a test waits for what must arrive before it fails (a loaded 2-core CI machine).
const PATIENCE: Duration = Duration::from_secs(30);

/// One message as the subscriber received it.
struct Received {
    topic: Vec<u8>,
    seq: u64,
    payload: Vec<u8>,
}

/// A router's listener: a SUB socket connected to the publisher, subscribed to `prefix`.
struct Subscriber {
    _ctx: zmq::Context,
    sock: zmq::Socket,
}

impl Subscriber {
    /// `rcvhwm` and `rcvbuf` (0: the defaults) let a test make a subscriber that falls behind
    /// quickly when it stops reading.
    fn connect(endpoint: &str, prefix: &[u8], rcvhwm: i32, rcvbuf: i32) -> Self {
        let ctx = zmq::Context::new();
        let sock = ctx.socket(zmq::SUB).unwrap();
        if rcvhwm > 0 {
            sock.set_rcvhwm(rcvhwm).unwrap();
        }
        if rcvbuf > 0 {
            sock.set_rcvbuf(rcvbuf).unwrap();
        }
        sock.set_linger(0).unwrap();
        sock.connect(endpoint).unwrap();
        sock.set_subscribe(prefix).unwrap();
        Self { _ctx: ctx, sock }
    }

    /// The next message, waiting at most `wait`; its frames checked: three, the second 8 bytes.
    fn recv(&self, wait: Duration) -> Option<Received> {
        if self.sock.poll(zmq::POLLIN, wait.as_millis() as i64).unwrap() == 0 {
            return None;
        }
        let mut parts = self.sock.recv_multipart(0).unwrap();
        assert_eq!(parts.len(), 3, "a batch is three frames: topic, sequence number, payload");
        let payload = parts.pop().unwrap();
        let seq = parts.pop().unwrap();
        let topic = parts.pop().unwrap();
        let seq = u64::from_be_bytes(seq.try_into().expect("the sequence number is 8 bytes"));
        Some(Received { topic, seq, payload })
    }

    /// Waits for the subscription to reach the publisher: sends probes (an `AllBlocksCleared`
    /// batch each, numbered from `*next_seq` on) until one arrives. Returns the first probe
    /// received; every later probe is on its way, in order.
    fn join(&self, publisher: &Publisher, enc: &mut BatchEncoder, next_seq: &mut u64) -> Received {
        let deadline = Instant::now() + PATIENCE;
        loop {
            enc.all_blocks_cleared().unwrap();
            let mut probe = Vec::new();
            enc.finish(now_ts(), &mut probe);
            // A full queue cannot happen here (the queue drains while nobody is subscribed);
            // a probe that did not fit would only leave a gap before the first one received.
            let _ = publisher.send(*next_seq, probe);
            *next_seq += 1;
            if let Some(m) = self.recv(Duration::from_millis(20)) {
                return m;
            }
            assert!(Instant::now() < deadline, "the subscriber never received a probe");
        }
    }
}

/// Dynamo's router fed by one worker: its normalizer and radix tree.
struct Router {
    normalizer: ZmqEventNormalizer,
    tree: RadixTree,
    next_event_id: u64,
}

impl Router {
    fn new() -> Self {
        Self { normalizer: ZmqEventNormalizer::new(PS), tree: RadixTree::new(), next_event_id: 0 }
    }

    /// Decodes and applies one payload as Dynamo's ZMQ listener does; returns the batch's rank.
    fn apply(&mut self, worker: u64, payload: &[u8]) -> u32 {
        let batch = decode_event_batch(payload).expect("Dynamo decodes the batch");
        let rank = batch.data_parallel_rank.expect("the batch names its rank") as u32;
        for raw in batch.events {
            let id = self.next_event_id;
            self.next_event_id += 1;
            if let Some(ev) = self.normalizer.normalize(raw, id, WorkerWithDpRank::new(worker, rank)) {
                self.tree.apply_event(ev.into_router_event().unwrap()).expect("the router applies the event");
            }
        }
        rank
    }

    fn score(&self, worker: u64, rank: u32, tokens: &[u32], salt: &str) -> u32 {
        let opts = BlockHashOptions { cache_namespace: Some(salt), ..Default::default() };
        let seq = compute_block_hash_for_seq(tokens, PS, opts);
        let scores = self.tree.find_matches(seq, false).scores;
        scores.get(&WorkerWithDpRank::new(worker, rank)).copied().unwrap_or(0)
    }
}

fn tokens(seed: u32, n: u32) -> Vec<u32> {
    (0..n).map(|i| seed.wrapping_mul(100_003).wrapping_add(i * 7) % 150_000).collect()
}

fn finish(enc: &mut BatchEncoder) -> Vec<u8> {
    let mut out = Vec::new();
    enc.finish(now_ts(), &mut out);
    out
}

/// A port no socket on 127.0.0.1 holds right now (the system's pick).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn invalid_arg(r: Result<Publisher, Error>) -> String {
    match r {
        Err(Error::InvalidArg(m)) => m,
        other => panic!("expected InvalidArg, got {other:?}"),
    }
}

#[test]
fn batches_arrive_as_three_frames_numbered_in_order() {
    let publisher = Publisher::start("tcp://127.0.0.1:*", 0, "kv-events", 16).unwrap();
    let port = publisher.endpoint().rsplit_once(':').unwrap().1;
    assert!(port.parse::<u16>().unwrap() > 0, "the wildcard resolved to a port: {}", publisher.endpoint());
    let sub = Subscriber::connect(publisher.endpoint(), b"kv-events", 0, 0);
    let mut enc = BatchEncoder::new(PS, 0).unwrap();
    let mut router = Router::new();
    let mut next_seq = 0;
    let first = sub.join(&publisher, &mut enc, &mut next_seq);

    // A session's prompt (3 pages), its next page chained to them, then that page's removal.
    let key = SessionKey::new(5);
    let toks = tokens(5, 64);
    let mut ids = Vec::new();
    enc.block_stored(&key, None, 0, &toks[..48], &mut ids).unwrap();
    let b0 = finish(&mut enc);
    enc.block_stored(&key, ids.last().copied(), 3, &toks[48..64], &mut ids).unwrap();
    let b1 = finish(&mut enc);
    enc.block_removed(&ids[3..]).unwrap();
    let b2 = finish(&mut enc);
    let real = next_seq;
    for (i, b) in [&b0, &b1, &b2].into_iter().enumerate() {
        publisher.send(real + i as u64, b.clone()).unwrap();
    }

    let mut got = vec![first];
    while got.last().unwrap().seq < real + 2 {
        got.push(sub.recv(PATIENCE).expect("every batch sent after the join arrives"));
    }
    for (i, m) in got.iter().enumerate() {
        assert_eq!(m.topic, b"kv-events");
        assert_eq!(m.seq, got[0].seq + i as u64, "sequence numbers are consecutive");
        router.apply(1, &m.payload);
    }
    let tail: Vec<&[u8]> = got[got.len() - 3..].iter().map(|m| &m.payload[..]).collect();
    assert_eq!(tail, [&b0[..], &b1[..], &b2[..]], "the payloads arrive as sent");
    // The router holds the prompt's three pages (the fourth was stored, then removed).
    assert_eq!(router.score(1, 0, &toks, key.salt()), 3);
    assert_eq!(router.score(1, 0, &toks, "another-session"), 0);
    publisher.stop();
}

#[test]
fn the_rank_offsets_the_port() {
    // The system's free port p, asked for as base p - 2 by rank 2. Another process may take p
    // between the pick and the bind: then pick again.
    let (publisher, port) = (0..10)
        .find_map(|_| {
            let p = free_port();
            let base = p.checked_sub(2)?;
            Publisher::start(&format!("tcp://127.0.0.1:{base}"), 2, "", 8).ok().map(|pb| (pb, p))
        })
        .expect("a free port to bind");
    assert_eq!(publisher.endpoint(), format!("tcp://127.0.0.1:{port}"));
    let sub = Subscriber::connect(&format!("tcp://127.0.0.1:{port}"), b"", 0, 0);
    let mut enc = BatchEncoder::new(PS, 2).unwrap();
    let first = sub.join(&publisher, &mut enc, &mut 0);
    assert_eq!(first.topic, b"", "the default topic is empty");
    assert_eq!(Router::new().apply(3, &first.payload), 2, "Dynamo files the batch under rank 2");
    publisher.stop();
}

#[test]
fn endpoints_follow_the_rank_convention() {
    let ok = |e: &str, r: u32| rank_endpoint(e, r).unwrap();
    assert_eq!(ok("tcp://*:5557", 0), "tcp://*:5557");
    assert_eq!(ok("tcp://*:5557", 2), "tcp://*:5559");
    assert_eq!(ok("tcp://10.0.0.7:5557", 1), "tcp://10.0.0.7:5558");
    assert_eq!(ok("tcp://[::1]:5557", 3), "tcp://[::1]:5560");
    assert_eq!(ok("tcp://*:65534", 1), "tcp://*:65535");
    assert_eq!(ok("tcp://127.0.0.1:*", 4), "tcp://127.0.0.1:*");
    assert_eq!(ok("tcp://127.0.0.1:0", 4), "tcp://127.0.0.1:0");
    assert_eq!(ok("ipc:///run/skv/events", 0), "ipc:///run/skv/events");
    assert_eq!(ok("ipc:///run/skv/events", 2), "ipc:///run/skv/events_dp2");
    for (bad, rank, why) in [
        ("tcp://*:65535", 1, "past 65535"),
        ("tcp://*:5557", u32::MAX, "past 65535"),
        ("tcp://localhost", 0, "needs a port"),
        ("tcp://:5557", 0, "needs a host"),
        ("tcp://*:55x7", 0, "not a number"),
        ("tcp://*:+5557", 0, "not a number"),
        ("tcp://*:70000", 0, "not a number"),
        ("ipc://", 0, "needs a path"),
        ("inproc://events", 0, "private"),
        ("udp://*:5557", 0, "only tcp:// and ipc://"),
        ("5557", 0, "only tcp:// and ipc://"),
        ("tcp://*:55\u{0}57", 0, "NUL"),
    ] {
        match rank_endpoint(bad, rank) {
            Err(Error::InvalidArg(m)) => {
                assert!(m.contains(why), "{bad:?}: {m}");
                assert!(m.contains(&format!("{bad:?}")), "the message names the endpoint: {m}");
            }
            other => panic!("{bad:?} rank {rank}: {other:?}"),
        }
    }
}

#[test]
fn a_failed_bind_is_an_error_naming_the_endpoint() {
    let first = Publisher::start("tcp://127.0.0.1:*", 0, "", 4).unwrap();
    let taken = first.endpoint().to_owned();
    let m = invalid_arg(Publisher::start(&taken, 0, "", 4));
    assert!(m.contains(&taken) && m.contains("Address already in use"), "{m}");
    // A bind error the `zmq` crate's error type does not list (ENOTDIR) is reported too.
    let m = invalid_arg(Publisher::start("ipc:///etc/hostname/events", 0, "", 4));
    assert!(m.contains("ipc:///etc/hostname/events") && m.contains("cannot bind"), "{m}");
    let m = invalid_arg(Publisher::start("tcp://127.0.0.1:*", 0, "", 0));
    assert!(m.contains("bound of 0"), "{m}");
    first.stop();
}

/// Sends 64 KiB batches numbered from `*next_seq` on until the publisher's queue stays full
/// (a batch refused, and the next one too after a pause: the subscriber, not the thread's
/// speed, holds it back), on another thread: a send that blocked would leave this test
/// waiting, and fail it. Returns the sequence numbers dropped.
fn fill_until_stalled(publisher: &Arc<Publisher>, next_seq: &mut u64) -> Vec<u64> {
    let (done, result) = mpsc::channel();
    let p = Arc::clone(publisher);
    let start = *next_seq;
    thread::spawn(move || {
        let mut dropped = Vec::new();
        let mut outcome = None;
        for seq in start..start + 100_000 {
            if p.send(seq, vec![seq as u8; 64 << 10]) == Err(Full) {
                if dropped.last() == Some(&(seq - 1)) {
                    dropped.push(seq);
                    outcome = Some((seq + 1, dropped));
                    break;
                }
                dropped.push(seq);
                thread::sleep(Duration::from_millis(100));
            }
        }
        drop(p);
        let _ = done.send(outcome);
    });
    let (next, dropped) = result
        .recv_timeout(PATIENCE)
        .expect("a send blocked, or the queue never stayed full while the subscriber read nothing")
        .expect("the queue stays full while the subscriber reads nothing");
    *next_seq = next;
    dropped
}

#[test]
fn a_full_queue_drops_the_batch_without_blocking_and_leaves_a_gap() {
    let publisher = Arc::new(Publisher::start("tcp://127.0.0.1:*", 0, "", 4).unwrap());
    // A subscriber that buffers little: once it stops reading, its queue and the socket
    // buffers fill, the publisher's thread cannot hand a batch on, and the queue fills.
    let sub = Subscriber::connect(publisher.endpoint(), b"", 1, 4096);
    let mut enc = BatchEncoder::new(PS, 0).unwrap();
    let mut next_seq = 0;
    let first = sub.join(&publisher, &mut enc, &mut next_seq);
    let start = next_seq;
    let dropped = fill_until_stalled(&publisher, &mut next_seq);

    // The subscriber reads again; the next batch goes in once the queue has room.
    let last = next_seq;
    let mut got = vec![first];
    let mut sent_last = false;
    let deadline = Instant::now() + PATIENCE;
    while got.last().unwrap().seq != last {
        assert!(Instant::now() < deadline, "batch {last} never arrived");
        if !sent_last {
            sent_last = publisher.send(last, b"after the gap".to_vec()).is_ok();
        }
        if let Some(m) = sub.recv(Duration::from_millis(10)) {
            got.push(m);
        }
    }
    let seqs: Vec<u64> = got.iter().map(|m| m.seq).collect();
    let expected: Vec<u64> = (got[0].seq..=last).filter(|s| !dropped.contains(s)).collect();
    assert_eq!(seqs, expected, "every batch but the dropped ones ({dropped:?}) arrives, in order");
    assert_eq!(got.last().unwrap().payload, b"after the gap");
    for m in got.iter().filter(|m| m.seq >= start && m.seq < last) {
        assert_eq!((m.payload.len(), m.payload[0]), (64 << 10, m.seq as u8));
    }
}

#[test]
fn stop_sends_what_is_queued_then_joins() {
    let publisher = Publisher::start("tcp://127.0.0.1:*", 0, "t", 64).unwrap();
    let sub = Subscriber::connect(publisher.endpoint(), b"t", 0, 0);
    let mut enc = BatchEncoder::new(PS, 0).unwrap();
    let mut next_seq = 0;
    let first = sub.join(&publisher, &mut enc, &mut next_seq);
    let last = next_seq + 49;
    for seq in next_seq..=last {
        publisher.send(seq, seq.to_le_bytes().to_vec()).unwrap();
    }
    let t = Instant::now();
    publisher.stop();
    assert!(t.elapsed() < STOP_LINGER + Duration::from_secs(4), "stop took {:?}", t.elapsed());
    let mut seq = first.seq;
    while seq < last {
        let m = sub.recv(PATIENCE).expect("what was queued at stop is sent");
        assert_eq!(m.seq, seq + 1);
        seq = m.seq;
        if seq >= last - 49 {
            assert_eq!(m.payload, seq.to_le_bytes());
        }
    }
}

#[test]
fn stop_gives_a_stalled_subscriber_at_most_the_linger() {
    // Nobody subscribed: nothing holds the queue back.
    let idle = Publisher::start("tcp://127.0.0.1:*", 0, "", 4).unwrap();
    idle.send(0, vec![1; 100]).unwrap();
    let t = Instant::now();
    idle.stop();
    assert!(t.elapsed() < STOP_LINGER + Duration::from_secs(4), "stop took {:?}", t.elapsed());

    // A subscriber that stopped reading with the queue full: stop gives it the linger, then
    // gives up on what is left.
    let publisher = Arc::new(Publisher::start("tcp://127.0.0.1:*", 0, "", 4).unwrap());
    let sub = Subscriber::connect(publisher.endpoint(), b"", 1, 4096);
    let mut enc = BatchEncoder::new(PS, 0).unwrap();
    let mut seq = 0;
    sub.join(&publisher, &mut enc, &mut seq);
    fill_until_stalled(&publisher, &mut seq);
    let publisher = Arc::into_inner(publisher).expect("the filling thread is done with it");
    let t = Instant::now();
    publisher.stop();
    let took = t.elapsed();
    assert!(took >= STOP_LINGER.mul_f32(0.9), "stop gave the subscriber {took:?}");
    assert!(took < STOP_LINGER + Duration::from_secs(4), "stop took {took:?}");
    drop(sub);
}

// ---------------------------------------------------------------------------------------------
// Through the C ABI: a handle whose skv_events_enable names an endpoint.

/// A handle in owned mode, page size 4, with events published on `endpoint`.
struct Engine {
    c: *mut skv_cache,
}

impl Drop for Engine {
    fn drop(&mut self) {
        // SAFETY: made by `Engine::new`, freed once.
        unsafe { skv_cache_free(self.c) };
    }
}

const EPS: u32 = 4;

fn ok(st: skv_status, what: &str) {
    if let Err(e) = st.ok() {
        panic!("{what}: {e}");
    }
}

fn events_config(endpoint: &CString, topic: &CString, max_batches: u32) -> skv_events_config {
    skv_events_config {
        struct_size: std::mem::size_of::<skv_events_config>() as u32,
        data_parallel_rank: 0,
        flags: 0,
        max_batches,
        endpoint: endpoint.as_ptr(),
        topic: topic.as_ptr(),
    }
}

impl Engine {
    /// A handle without events.
    fn bare() -> Engine {
        let cfg = skv_cache_config {
            struct_size: std::mem::size_of::<skv_cache_config>() as u32,
            page_size: EPS,
            num_token_slots: 1 << 16,
            num_rows: 16,
            max_context_len: 512,
            flags: 0,
            swa_num_token_slots: 0,
            ..Default::default()
        };
        let mut c = null_mut();
        // SAFETY: valid pointers.
        ok(unsafe { skv_cache_new(&cfg, &mut c) }, "skv_cache_new");
        Engine { c }
    }

    fn enable(&self, endpoint: &str, topic: &str, max_batches: u32) -> skv_status {
        let (e, t) = (CString::new(endpoint).unwrap(), CString::new(topic).unwrap());
        // SAFETY: a live handle; the config's strings outlive the call.
        unsafe { skv_events_enable(self.c, &events_config(&e, &t, max_batches)) }
    }

    fn new(endpoint: &str, topic: &str, max_batches: u32) -> Engine {
        let e = Engine::bare();
        ok(e.enable(endpoint, topic, max_batches), "skv_events_enable");
        e
    }

    /// A first turn of session `s` (branch 0): a fresh row, the prompt prefilled and its
    /// tokens handed over, the output decoded and handed over, the finish.
    fn turn(&mut self, s: u64, prompt: &[u32], out: &[u32]) {
        let c = self.c;
        let mut r = skv_req { origin_input_len: prompt.len() as u32, ..Default::default() };
        let (p, o): (Vec<i32>, Vec<i32>) =
            (prompt.iter().map(|&t| t as i32).collect(), out.iter().map(|&t| t as i32).collect());
        // SAFETY: a live handle and req; the token arrays hold what they say.
        unsafe {
            ok(skv_alloc_row(c, &mut r), "skv_alloc_row");
            ok(skv_alloc_extend(c, &mut r, p.len() as u32, null_mut()), "skv_alloc_extend");
            ok(skv_commit(c, &mut r, p.len() as u32), "skv_commit");
            ok(skv_events_tokens(c, s, 0, &r, 0, p.as_ptr(), p.len()), "skv_events_tokens");
            ok(skv_alloc_extend(c, &mut r, o.len() as u32, null_mut()), "skv_alloc_extend");
            ok(skv_commit(c, &mut r, o.len() as u32), "skv_commit");
            r.output_len = o.len() as u32;
            r.finished_len = o.len() as i32;
            ok(skv_events_tokens(c, s, 0, &r, p.len() as u32, o.as_ptr(), o.len()), "skv_events_tokens");
            ok(skv_cache_finished_req(c, s, 0, &mut r, 0), "skv_cache_finished_req");
        }
    }

    fn release(&mut self, s: u64) {
        // SAFETY: a live handle.
        ok(unsafe { skv_release_session(self.c, s) }, "skv_release_session");
    }

    /// The full pages session `s` holds.
    fn held_pages(&self, s: u64) -> u32 {
        // SAFETY: plain integers.
        let mut u: skv_usage = unsafe { std::mem::zeroed() };
        // SAFETY: a live handle and out.
        ok(unsafe { skv_branch_usage(self.c, s, 0, &mut u) }, "skv_branch_usage");
        (u.committed_tokens / EPS as u64) as u32
    }
}

/// Dynamo's router fed by a subscriber that may have joined late: an event that does not
/// apply (a removal or a child of a block it never saw) is counted, as Dynamo's listener logs
/// and goes on; what counts is that none fails after the last `AllBlocksCleared`.
struct LateRouter {
    normalizer: ZmqEventNormalizer,
    tree: RadixTree,
    next_event_id: u64,
    next_seq: Option<u64>,
    gaps: u64,
    failed_since_clear: u64,
    clears: u64,
}

impl LateRouter {
    fn new() -> Self {
        LateRouter {
            normalizer: ZmqEventNormalizer::new(EPS),
            tree: RadixTree::new(),
            next_event_id: 0,
            next_seq: None,
            gaps: 0,
            failed_since_clear: 0,
            clears: 0,
        }
    }

    fn apply(&mut self, m: &Received) {
        if let Some(want) = self.next_seq {
            assert!(m.seq >= want, "sequence {} after {want}", m.seq);
            self.gaps += m.seq - want;
        }
        self.next_seq = Some(m.seq + 1);
        let batch = decode_event_batch(&m.payload).expect("Dynamo decodes the batch");
        for raw in batch.events {
            if matches!(raw, RawKvEvent::AllBlocksCleared { .. }) {
                self.failed_since_clear = 0;
                self.clears += 1;
            }
            let id = self.next_event_id;
            self.next_event_id += 1;
            let ev = self.normalizer.normalize(raw, id, WorkerWithDpRank::new(1, 0)).expect("a session event");
            if self.tree.apply_event(ev.into_router_event().unwrap()).is_err() {
                self.failed_since_clear += 1;
            }
        }
    }

    fn score(&self, tokens: &[u32], s: u64) -> u32 {
        let salt = format!("skv-session:{s}");
        let opts = BlockHashOptions { cache_namespace: Some(&salt), ..Default::default() };
        let seq = compute_block_hash_for_seq(tokens, EPS, opts);
        self.tree.find_matches(seq, false).scores.get(&WorkerWithDpRank::new(1, 0)).copied().unwrap_or(0)
    }

    /// Whether the router holds exactly the full pages of `live` (each session's sequence).
    fn agrees(&self, e: &Engine, live: &HashMap<u64, Vec<u32>>) -> bool {
        let mut total = 0;
        for (&s, seq) in live {
            let held = e.held_pages(s);
            total += held as usize;
            if self.score(seq, s) != held {
                return false;
            }
        }
        self.tree.current_size() == total
    }
}

/// Sessions' first turns, one after another, the 8 latest kept (the oldest released, its
/// pages removed); `live` is what each kept session's sequence is.
struct Workload {
    next: u64,
    live: HashMap<u64, Vec<u32>>,
}

impl Workload {
    fn new() -> Self {
        Workload { next: 0, live: HashMap::new() }
    }

    fn turns(&mut self, e: &mut Engine, n: u64) {
        for _ in 0..n {
            let s = self.next;
            self.next += 1;
            let (prompt, out) = (tokens(s as u32, 301), tokens(s as u32 + 7, 10));
            e.turn(s, &prompt, &out);
            self.live.insert(s, [prompt, out].concat());
            if s >= 8 {
                e.release(s - 8);
                self.live.remove(&(s - 8));
            }
        }
    }
}

/// A path for an ipc endpoint of this test alone.
fn ipc_endpoint(name: &str) -> String {
    format!("ipc://{}/skv-events-{}-{name}", std::env::temp_dir().display(), std::process::id())
}

#[test]
fn after_an_overflow_the_routers_view_converges_to_what_libskv_holds() {
    let endpoint = ipc_endpoint("overflow");
    let mut e = Engine::new(&endpoint, "skv", 2);
    // A subscriber that buffers little, and does not read while the engine runs: the
    // publisher's queue of 2 batches overflows, batches are dropped.
    let sub = Subscriber::connect(&endpoint, b"skv", 1, 4096);
    let mut w = Workload::new();
    // About 4 MB of stores, far past what the socket buffers hold.
    w.turns(&mut e, 1000);

    // The subscriber reads again; the engine goes on, so a batch closes with room in the
    // queue: the recovery (AllBlocksCleared, every held chain) goes out, and the router's view
    // becomes libskv's.
    let mut router = LateRouter::new();
    let deadline = Instant::now() + PATIENCE;
    loop {
        while let Some(m) = sub.recv(Duration::from_millis(5)) {
            assert_eq!(m.topic, b"skv");
            router.apply(&m);
        }
        if router.clears > 0 && router.failed_since_clear == 0 && router.agrees(&e, &w.live) {
            break;
        }
        assert!(Instant::now() < deadline, "the router never converged: {} gaps", router.gaps);
        w.turns(&mut e, 1);
    }
    assert!(router.gaps > 0, "batches were dropped while the subscriber did not read");
    // The engine goes on, the subscriber reading: after each turn the router agrees again.
    // (A queue of 2 can still overflow in a burst of batches: then the next call's batch is
    // the recovery, so a turn is run when nothing arrives.)
    for _ in 0..20 {
        w.turns(&mut e, 1);
        let deadline = Instant::now() + PATIENCE;
        while !router.agrees(&e, &w.live) {
            assert!(Instant::now() < deadline, "the router fell behind for good: {} gaps", router.gaps);
            match sub.recv(Duration::from_millis(100)) {
                Some(m) => router.apply(&m),
                None => w.turns(&mut e, 1),
            }
        }
    }
    assert_eq!(router.failed_since_clear, 0, "every event since the last recovery applied");
    // skv_cache_free stops the publisher: promptly, the subscriber still reading.
    let t = Instant::now();
    drop(e);
    assert!(t.elapsed() < STOP_LINGER + Duration::from_secs(4), "skv_cache_free took {:?}", t.elapsed());
}

#[test]
fn enable_refuses_a_bad_endpoint_and_changes_nothing() {
    let e = Engine::bare();
    assert_eq!(e.enable("tcp://localhost", "", 0), skv_status::SKV_ERR_INVALID_ARG);
    let m = last_error_message();
    assert!(m.starts_with("skv_events_enable: cfg->endpoint") && m.contains("\"tcp://localhost\""), "{m}");
    // A port another handle holds: the bind fails, named.
    let port = free_port();
    let holder = Engine::new(&format!("tcp://127.0.0.1:{port}"), "", 0);
    assert_eq!(e.enable(&format!("tcp://127.0.0.1:{port}"), "", 0), skv_status::SKV_ERR_INVALID_ARG);
    let m = last_error_message();
    assert!(m.contains(&format!("tcp://127.0.0.1:{port}")) && m.contains("Address already in use"), "{m}");
    // Nothing changed: events are still off, and can be enabled.
    let (mut len, mut seq, mut buf) = (0usize, 0u64, [0u8; 64]);
    // SAFETY: a live handle; buf holds 64 bytes.
    let st = unsafe { skv_events_drain(e.c, buf.as_mut_ptr(), 64, &mut len, &mut seq) };
    assert_eq!(st, skv_status::SKV_ERR_STATE);
    ok(e.enable(&ipc_endpoint("refusals"), "", 0), "skv_events_enable");
    // With a publisher there is nothing to drain.
    // SAFETY: as above.
    let st = unsafe { skv_events_drain(e.c, buf.as_mut_ptr(), 64, &mut len, &mut seq) };
    assert_eq!(st, skv_status::SKV_ERR_STATE);
    assert!(last_error_message().contains("published on ipc://"), "{}", last_error_message());
    // skv_cache_free closes the holder's socket: its port can be bound again.
    drop(holder);
    let again = Engine::bare();
    ok(again.enable(&format!("tcp://127.0.0.1:{port}"), "", 0), "skv_events_enable after skv_cache_free");
}

#[test]
fn a_router_that_subscribes_late_converges_at_the_next_call() {
    let endpoint = ipc_endpoint("late");
    let mut e = Engine::new(&endpoint, "", 0);
    let mut w = Workload::new();
    // Nobody listens yet: these stores go nowhere.
    w.turns(&mut e, 5);
    let sub = Subscriber::connect(&endpoint, b"", 0, 0);
    // Once the subscription reaches the publisher, the next call's batch is the recovery. The
    // engine's calls meanwhile: a turn of another session, released at once (what libskv holds
    // stays the five sessions stored before the join).
    let mut router = LateRouter::new();
    let deadline = Instant::now() + PATIENCE;
    let mut other = 1000;
    loop {
        while let Some(m) = sub.recv(Duration::from_millis(20)) {
            router.apply(&m);
        }
        if router.clears > 0 && router.failed_since_clear == 0 && router.agrees(&e, &w.live) {
            break;
        }
        assert!(Instant::now() < deadline, "the late router never converged");
        e.turn(other, &tokens(other as u32, 40), &[]);
        e.release(other);
        other += 1;
    }
    assert_eq!(w.live.len(), 5);
    assert_eq!(router.gaps, 0, "nothing was dropped: the join alone brought the recovery");
}
