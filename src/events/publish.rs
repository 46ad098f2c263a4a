//! The built-in publisher: closed batches out on a ZMQ PUB socket, as vLLM publishes them
//! (`[topic, 8-byte big-endian sequence number, payload]`), from a background thread, so an
//! engine's call never waits on the network. Behind the `zmq` feature. docs/events.md
//! ("Publisher") states the rules: endpoints and ranks, the queue bound, drops, `fork`.

use std::ffi::{CStr, CString};
use std::fmt;
use std::os::raw::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::core::{Error, Result};

/// How long [`Publisher::stop`] may spend sending what is still queued (a subscriber that
/// stopped reading holds it back) and then flushing the socket: at most this, once.
pub const STOP_LINGER: Duration = Duration::from_secs(1);

/// The longest the publisher thread sleeps before retrying a batch a subscriber's full
/// queue refused.
const RETRY_MAX: Duration = Duration::from_millis(5);

/// How often an idle publisher thread looks for new subscribers.
const SUBSCRIPTION_POLL: Duration = Duration::from_millis(50);

/// A batch handed to [`Publisher::send`] did not fit: the queue holds `bound` batches not
/// yet sent. The caller drops it and its sequence number stays spent, so subscribers see a
/// gap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Full;

impl fmt::Display for Full {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the publisher's queue is full: the batch was dropped")
    }
}

/// A ZMQ PUB socket bound to one endpoint and the thread that sends on it. Owned by one
/// handle; [`stop`](Publisher::stop) (or dropping it) flushes and joins the thread.
pub struct Publisher {
    queue: Option<SyncSender<(u64, Vec<u8>)>>,
    bound: usize,
    /// Batches queued and not yet taken by the thread (at most `bound`, and one more for
    /// the moment a refused batch is counted).
    pending: Arc<AtomicUsize>,
    stopping: Arc<AtomicBool>,
    /// A subscription reached the socket since `subscriber_joined` last said so.
    joined: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    endpoint: String,
}

impl fmt::Debug for Publisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Publisher").field("endpoint", &self.endpoint).finish_non_exhaustive()
    }
}

impl Publisher {
    /// Binds an XPUB socket (a PUB socket that also reads its subscriptions) to `endpoint`
    /// as data-parallel rank `data_parallel_rank` binds it ([`rank_endpoint`]) and starts the
    /// thread that sends each batch as `[topic, seq, payload]`. At most `bound` batches (at
    /// least 1) wait to be sent. A malformed endpoint or a failed bind (the port in use, an
    /// address not on this host) is `InvalidArg` naming the endpoint, a thread the system
    /// cannot start `OutOfMemory`; nothing is left running.
    pub fn start(endpoint: &str, data_parallel_rank: u32, topic: &str, bound: usize) -> Result<Publisher> {
        if bound == 0 {
            return Err(Error::InvalidArg("publisher: a queue bound of 0 batches: at least 1".into()));
        }
        let target = rank_endpoint(endpoint, data_parallel_rank)?;
        let zmq_err = |what: &str, e: String| {
            Error::InvalidArg(format!(
                "publisher on {target:?} (endpoint {endpoint:?}, rank {data_parallel_rank}): {what}: {e}"
            ))
        };
        let ctx = zmq::Context::new();
        let mut socket = ctx.socket(zmq::XPUB).map_err(|e| zmq_err("cannot create the socket", e.to_string()))?;
        // Every subscription comes up, a second one to the same topic too: each new
        // subscriber is told to the ledger, which then re-stores everything for it.
        socket.set_xpub_verbose(true).map_err(|e| zmq_err("ZMQ_XPUB_VERBOSE", e.to_string()))?;
        // A subscriber's queue holds as many batches as ours; past that the socket refuses
        // the batch (no drop) and the thread retries, so every loss happens at our queue,
        // where the caller sees it, rather than silently inside libzmq.
        let hwm = i32::try_from(bound).unwrap_or(i32::MAX);
        socket.set_sndhwm(hwm).map_err(|e| zmq_err("ZMQ_SNDHWM", e.to_string()))?;
        set_int(&mut socket, zmq_sys::ZMQ_XPUB_NODROP, 1).map_err(|e| zmq_err("ZMQ_XPUB_NODROP", e))?;
        if target.starts_with("tcp://[") {
            socket.set_ipv6(true).map_err(|e| zmq_err("ZMQ_IPV6", e.to_string()))?;
        }
        bind(&mut socket, &target).map_err(|e| zmq_err("cannot bind", e))?;
        let bound_to = match socket.get_last_endpoint() {
            Ok(Ok(s)) => s,
            _ => target.clone(),
        };
        let (queue, batches) = sync_channel(bound);
        let stopping = Arc::new(AtomicBool::new(false));
        let pending = Arc::new(AtomicUsize::new(0));
        let joined = Arc::new(AtomicBool::new(false));
        let shared =
            Shared { pending: Arc::clone(&pending), stopping: Arc::clone(&stopping), joined: Arc::clone(&joined) };
        let topic = topic.as_bytes().to_vec();
        let thread = thread::Builder::new()
            .name("skv-events-pub".into())
            .spawn(move || run(socket, ctx, topic, batches, shared))
            .map_err(|e| Error::OutOfMemory(format!("publisher on {target:?}: cannot start its thread: {e}")))?;
        Ok(Publisher { queue: Some(queue), bound, pending, stopping, joined, thread: Some(thread), endpoint: bound_to })
    }

    /// The endpoint the socket is bound to, as libzmq reports it: the port a wildcard
    /// (`tcp://127.0.0.1:*`) resolved to, and the rank's port or suffix applied.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Queues the batch numbered `seq` (its bytes, [`BatchEncoder::finish`]'s) to be sent.
    /// Never blocks: when `bound` batches are already waiting, returns [`Full`] and the
    /// batch is dropped.
    ///
    /// [`BatchEncoder::finish`]: super::BatchEncoder::finish
    pub fn send(&self, seq: u64, payload: Vec<u8>) -> std::result::Result<(), Full> {
        let Some(q) = &self.queue else { return Err(Full) };
        // Counted before it is queued, so that the thread never takes it off the count first.
        self.pending.fetch_add(1, Ordering::AcqRel);
        // Disconnected cannot happen while the thread runs (it leaves its loop only once the
        // queue is closed here); were it to, the batch is lost all the same.
        q.try_send((seq, payload)).map_err(|_| {
            self.pending.fetch_sub(1, Ordering::AcqRel);
            Full
        })
    }

    /// Whether a batch sent now would fit: fewer than `bound` batches wait. (The thread may
    /// take one meanwhile: then a batch fits that this said would not.) Lets a caller skip
    /// encoding a batch that would be dropped.
    pub fn has_room(&self) -> bool {
        self.pending.load(Ordering::Acquire) < self.bound
    }

    /// Whether a subscriber joined since the last call: its subscription reached the socket,
    /// so a batch sent from now on reaches it, but nothing sent before did. The ledger answers
    /// with its recovery (everything held, stored again).
    pub fn subscriber_joined(&self) -> bool {
        self.joined.swap(false, Ordering::AcqRel)
    }

    /// Sends what is queued, then closes the socket and joins the thread, spending at most
    /// [`STOP_LINGER`] on a subscriber that is not reading; what is left then is dropped.
    pub fn stop(mut self) {
        self.shut_down();
    }

    fn shut_down(&mut self) {
        self.stopping.store(true, Ordering::Release);
        // Closing the queue wakes the thread once it has sent what is queued.
        self.queue = None;
        if let Some(t) = self.thread.take() {
            // The thread does not panic (it unwraps nothing); were it to, its panic ends
            // with it: join hands it back here and it goes no further.
            let _ = t.join();
        }
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        self.shut_down();
    }
}

/// The endpoint data-parallel rank `rank` binds, by vLLM's convention: `tcp://HOST:PORT`
/// binds port `PORT + rank`, `ipc://PATH` binds `PATH_dpR` past rank 0, `tcp://HOST:*` is
/// bound as given; anything else, `inproc://` included, is `InvalidArg` (docs/events.md,
/// "Publisher").
pub fn rank_endpoint(endpoint: &str, rank: u32) -> Result<String> {
    let bad = |why: &str| Err(Error::InvalidArg(format!("endpoint {endpoint:?} (rank {rank}): {why}")));
    if endpoint.contains('\0') {
        return bad("contains a NUL byte");
    }
    if let Some(rest) = endpoint.strip_prefix("tcp://") {
        let Some((host, port)) = rest.rsplit_once(':') else {
            return bad("a tcp endpoint needs a port (tcp://HOST:PORT)");
        };
        if host.is_empty() {
            return bad("a tcp endpoint needs a host or * (tcp://*:PORT)");
        }
        if port == "*" || port == "0" {
            return Ok(endpoint.to_owned());
        }
        let Some(base) = port.parse::<u16>().ok().filter(|_| port.bytes().all(|b| b.is_ascii_digit())) else {
            return bad("the port is not a number from 1 to 65535 (or *)");
        };
        let Some(p) = u32::from(base).checked_add(rank).filter(|&p| p <= 65535) else {
            return bad("the port plus the rank is past 65535");
        };
        return Ok(format!("tcp://{host}:{p}"));
    }
    if let Some(path) = endpoint.strip_prefix("ipc://") {
        if path.is_empty() {
            return bad("an ipc endpoint needs a path");
        }
        return Ok(if rank == 0 { endpoint.to_owned() } else { format!("{endpoint}_dp{rank}") });
    }
    if endpoint.starts_with("inproc://") {
        return bad("inproc is not reachable: the publisher's ZMQ context is private (use tcp:// or ipc://)");
    }
    bad("only tcp:// and ipc:// endpoints are published on")
}

// Two calls go to libzmq directly: the `zmq` crate has no setter for ZMQ_XPUB_NODROP, and
// its error type panics on an errno it does not list, which a bind can return (ENOTDIR,
// EAFNOSUPPORT, ...): these two report libzmq's own text instead.

/// Sets the integer socket option `option` (a `zmq_sys::ZMQ_*`).
fn set_int(socket: &mut zmq::Socket, option: u32, value: c_int) -> std::result::Result<(), String> {
    let Ok(option) = c_int::try_from(option) else {
        return Err(format!("option {option} is not a C int"));
    };
    // SAFETY: the socket is live and used by this thread only (`&mut`); libzmq reads a C int
    // of the given size from `value`, which outlives the call.
    let rc = unsafe {
        zmq_sys::zmq_setsockopt(
            socket.as_mut_ptr(),
            option,
            (&value as *const c_int).cast::<c_void>(),
            std::mem::size_of::<c_int>(),
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(last_error())
    }
}

/// Binds the socket to `endpoint` (no NUL byte: [`rank_endpoint`] checked).
fn bind(socket: &mut zmq::Socket, endpoint: &str) -> std::result::Result<(), String> {
    let Ok(c) = CString::new(endpoint) else {
        return Err("the endpoint contains a NUL byte".into());
    };
    // SAFETY: the socket is live and used by this thread only (`&mut`); `c` is a
    // NUL-terminated string that outlives the call.
    let rc = unsafe { zmq_sys::zmq_bind(socket.as_mut_ptr(), c.as_ptr()) };
    if rc == 0 {
        Ok(())
    } else {
        Err(last_error())
    }
}

/// libzmq's text for this thread's last error.
fn last_error() -> String {
    // SAFETY: zmq_errno reads this thread's errno; zmq_strerror returns a static
    // NUL-terminated string for any number (libzmq's own or the system's strerror).
    unsafe {
        let e = zmq_sys::zmq_errno();
        let s = zmq_sys::zmq_strerror(e);
        if s.is_null() {
            return format!("error {e}");
        }
        CStr::from_ptr(s).to_string_lossy().into_owned()
    }
}

/// What the publisher thread shares with its `Publisher`.
struct Shared {
    pending: Arc<AtomicUsize>,
    stopping: Arc<AtomicBool>,
    joined: Arc<AtomicBool>,
}

/// The publisher thread: sends each queued batch, retrying while a subscriber's queue is
/// full; once stopping, gives the rest at most [`STOP_LINGER`]. Between batches, and at least
/// every [`SUBSCRIPTION_POLL`], notes new subscribers.
fn run(socket: zmq::Socket, ctx: zmq::Context, topic: Vec<u8>, batches: Receiver<(u64, Vec<u8>)>, shared: Shared) {
    let Shared { pending, stopping, joined } = shared;
    let mut deadline: Option<Instant> = None;
    'batches: loop {
        note_subscribers(&socket, &joined);
        let (seq, payload) = match batches.recv_timeout(SUBSCRIPTION_POLL) {
            Ok(batch) => batch,
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => break,
        };
        pending.fetch_sub(1, Ordering::AcqRel);
        let seq = seq.to_be_bytes();
        let mut wait = Duration::from_micros(50);
        loop {
            let frames: [&[u8]; 3] = [&topic, &seq, &payload];
            match socket.send_multipart(frames, zmq::DONTWAIT) {
                // Any error but a full subscriber queue (none is expected of a bound XPUB
                // socket) loses this one batch, as a drop at the queue would.
                Ok(()) => break,
                Err(zmq::Error::EAGAIN | zmq::Error::EINTR) => {}
                Err(_) => break,
            }
            if stopping.load(Ordering::Acquire) {
                let d = *deadline.get_or_insert_with(|| Instant::now() + STOP_LINGER);
                if Instant::now() >= d {
                    break 'batches;
                }
            }
            thread::sleep(wait);
            wait = (wait * 2).min(RETRY_MAX);
        }
    }
    // What libzmq still holds goes out within the rest of the linger; closing the socket and
    // then the context waits at most that long.
    let left = deadline.map_or(STOP_LINGER, |d| d.saturating_duration_since(Instant::now()));
    let _ = socket.set_linger(i32::try_from(left.as_millis()).unwrap_or(i32::MAX));
    drop(socket);
    drop(ctx);
}

/// Reads the subscription messages that reached the socket (`\x01` and the topic for a
/// subscription, `\x00` for its end); a subscription sets `joined`.
fn note_subscribers(socket: &zmq::Socket, joined: &AtomicBool) {
    while let Ok(m) = socket.recv_bytes(zmq::DONTWAIT) {
        if m.first() == Some(&1) {
            joined.store(true, Ordering::Release);
        }
    }
}
