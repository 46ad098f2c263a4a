//! KV events (docs/events.md): the pages each session holds, published for a KV-aware router
//! in vLLM's format. Built with the `events` feature; without it these calls exist and return
//! SKV_ERR_UNSUPPORTED after their pointer checks.

use std::ffi::{c_char, CStr};

use super::{arg, disjoint, lock, nonnull, out_mut, skv_cache, skv_req, skv_status, Span};
use crate::core::{Cache, Error, Result};

/// skv_events_config's flags: libskv is the only publisher of session KV, so a session's
/// chain starts at page 0, its protected pages included (docs/events.md, "Parents").
pub const SKV_EVENTS_FROM_PAGE_ZERO: u32 = 0x1;

/// How a handle publishes its events (skv_events_enable).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct skv_events_config {
    /// sizeof(skv_events_config): 32 from ABI 4.
    pub struct_size: u32,
    /// Written in every batch; added to the endpoint's port.
    pub data_parallel_rank: u32,
    /// SKV_EVENTS_* values, OR-ed.
    pub flags: u32,
    /// The bound of the queue of closed batches (drain or publisher); 0 = 1024.
    pub max_batches: u32,
    /// NULL: drain only. A ZMQ endpoint the publisher binds, e.g. "tcp://0.0.0.0:5557", its port
    /// plus data_parallel_rank bound (vLLM's and TensorRT-LLM's convention). Needs the `zmq`
    /// feature (else SKV_ERR_UNSUPPORTED).
    pub endpoint: *const c_char,
    /// The publisher's topic; NULL = "" (vLLM's default).
    pub topic: *const c_char,
}

/// Every published sizeof(skv_events_config), oldest first (`read_versioned`).
const EVENTS_CONFIG_SIZES: [u32; 1] = [32];
const _: () = assert!(std::mem::size_of::<skv_events_config>() as u32 == EVENTS_CONFIG_SIZES[0]);

/// The default bound of the queue of closed batches.
#[cfg(feature = "events")]
const DEFAULT_MAX_BATCHES: u32 = 1024;

/// The refusal of every events call in a build without the feature.
#[cfg(not(feature = "events"))]
fn without_events() -> Error {
    Error::Unsupported("this libskv was built without the `events` feature".into())
}

/// Turns KV events on for this handle, once, before its first session call; the first batch
/// (sequence number 0) is AllBlocksCleared (docs/events.md#turning-events-on). An endpoint
/// starts the built-in publisher, stopped by skv_cache_free (docs/events.md#publisher).
///
/// The caller must pass c as NULL or a live handle, cfg as NULL or valid.
///
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG, SKV_ERR_OUT_OF_MEMORY, SKV_ERR_STATE,
///          SKV_ERR_UNSUPPORTED
#[no_mangle]
pub unsafe extern "C" fn skv_events_enable(c: *mut skv_cache, cfg: *const skv_events_config) -> skv_status {
    export!(
        skv_events_enable,
        c,
        |t| t.num("cfg", !cfg.is_null() as u8),
        // SAFETY: c is NULL or a live handle and cfg NULL or valid (the contract above); arg
        // and lock refuse NULL before anything is read.
        || unsafe {
            arg(c.cast_const(), "cache")?;
            arg(cfg, "cfg")?;
            let cfg = super::read_versioned(cfg, &EVENTS_CONFIG_SIZES, "cfg")?;
            let cache = lock(c)?;
            enable_events(&*c, &cache, &cfg)
        },
        |_| {},
    )
}

#[cfg(not(feature = "events"))]
unsafe fn enable_events(_h: &skv_cache, _cache: &Cache, _cfg: &skv_events_config) -> Result<()> {
    Err(without_events())
}

/// skv_events_enable's work once the pointers are checked.
///
/// # Safety
/// `cache` is `handle`'s, locked; `cfg`'s strings are NULL or NUL-terminated.
#[cfg(feature = "events")]
unsafe fn enable_events(handle: &skv_cache, cache: &Cache, cfg: &skv_events_config) -> Result<()> {
    use crate::events::{Ledger, LedgerConfig};
    if cfg.flags & !SKV_EVENTS_FROM_PAGE_ZERO != 0 {
        return Err(Error::InvalidArg(format!("cfg->flags {:#x} has unknown bits", cfg.flags)));
    }
    // SAFETY: NULL or NUL-terminated, by this function's contract.
    let topic = unsafe { c_text(cfg.topic, "cfg->topic") }?.unwrap_or("");
    // SAFETY: NULL or NUL-terminated, by this function's contract.
    let endpoint = unsafe { c_text(cfg.endpoint, "cfg->endpoint") }?;
    // A malformed endpoint is refused with the other arguments; a failed bind comes last.
    #[cfg(feature = "zmq")]
    if let Some(e) = endpoint {
        crate::events::rank_endpoint(e, cfg.data_parallel_rank).map_err(|e| e.at("cfg->endpoint"))?;
    }
    #[cfg(not(feature = "zmq"))]
    if let Some(e) = endpoint {
        return Err(Error::Unsupported(format!(
            "cfg->endpoint {e:?}: this libskv has no built-in publisher (the `zmq` feature); topic \
             {topic:?} unused: drain with skv_events_drain and an endpoint of NULL"
        )));
    }
    let max = if cfg.max_batches == 0 { DEFAULT_MAX_BATCHES } else { cfg.max_batches };
    let ledger = Ledger::new(LedgerConfig {
        page_size: cache.config().page_size,
        data_parallel_rank: cfg.data_parallel_rank,
        from_page_zero: cfg.flags & SKV_EVENTS_FROM_PAGE_ZERO != 0,
        max_batches: max as usize,
    })
    .map_err(|e| match e {
        Error::InvalidArg(m) => Error::InvalidArg(format!("cfg->{m}")),
        other => other,
    })?;
    if handle.events.get().is_some() {
        return Err(Error::State("events are already enabled on this handle".into()));
    }
    if let Some(why) = super::events_emit::session_state(cache) {
        return Err(Error::State(format!("events are enabled before the handle's first session call: {why}")));
    }
    // The last step that can fail: a bound publisher is never left behind by a refusal.
    #[cfg(feature = "zmq")]
    let ledger = match endpoint {
        Some(e) => {
            // A bind that fails is INVALID_ARG; a thread the system cannot start, OUT_OF_MEMORY.
            let p = crate::events::Publisher::start(e, cfg.data_parallel_rank, topic, max as usize).map_err(
                |e| match e {
                    Error::OutOfMemory(m) => Error::OutOfMemory(format!("cfg->endpoint: {m}")),
                    other => other.at("cfg->endpoint"),
                },
            )?;
            let mut ledger = ledger;
            ledger.publish_to(p);
            ledger
        }
        None => ledger,
    };
    handle.events.set(std::sync::Mutex::new(ledger)).map_err(|_| Error::State("events are already enabled".into()))
}

/// A C string argument as UTF-8; NULL stays None.
///
/// # Safety
/// `p` is NULL or NUL-terminated.
#[cfg_attr(not(feature = "events"), allow(dead_code))]
unsafe fn c_text<'a>(p: *const c_char, name: &str) -> Result<Option<&'a str>> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: not NULL, so NUL-terminated, by this function's contract.
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str().map(Some).map_err(|_| Error::InvalidArg(format!("{name} is not UTF-8")))
}

/// A session's salt (NULL: "skv-session:<session_id>") and the parent of its first published
/// page (NULL: none), before the session's first skv_events_tokens (docs/events.md#salts,
/// docs/events.md#parents).
///
/// The caller must pass c as NULL or a live handle, salt as NULL or NUL-terminated,
/// first_parent as NULL or valid.
///
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG, SKV_ERR_STATE, SKV_ERR_UNSUPPORTED
#[no_mangle]
pub unsafe extern "C" fn skv_events_session(
    c: *mut skv_cache,
    session_id: u64,
    salt: *const c_char,
    first_parent: *const u64,
) -> skv_status {
    export!(
        skv_events_session,
        c,
        |t| {
            t.num("session_id", session_id).num("salt", !salt.is_null() as u8);
            t.num("first_parent", !first_parent.is_null() as u8);
        },
        // SAFETY: c is NULL or a live handle, salt NULL or NUL-terminated and first_parent
        // NULL or valid (the contract above); arg refuses NULL, the others are read only when
        // not NULL.
        || unsafe {
            arg(c.cast_const(), "cache")?;
            super::aligned(first_parent, 1, "first_parent")?;
            let _cache = lock(c)?;
            set_session(&*c, session_id, salt, first_parent.as_ref().copied())
        },
        |_| {},
    )
}

#[cfg(not(feature = "events"))]
unsafe fn set_session(_h: &skv_cache, _id: u64, _salt: *const c_char, _parent: Option<u64>) -> Result<()> {
    Err(without_events())
}

/// # Safety
/// The caller holds `handle`'s lock; `salt` is NULL or NUL-terminated.
#[cfg(feature = "events")]
unsafe fn set_session(handle: &skv_cache, session_id: u64, salt: *const c_char, parent: Option<u64>) -> Result<()> {
    let mut ledger = super::events_emit::enabled(handle)?;
    // SAFETY: NULL or NUL-terminated, by this function's contract.
    let salt = unsafe { c_text(salt, "salt") }?;
    ledger.set_session(session_id, salt, parent)
}

/// Hands over the token ids of positions [first_pos, first_pos + n) of the sequence the req's
/// row holds for (session_id, branch_id): once per prefill chunk, after its commit, and once
/// before skv_cache_finished_req with the output; never per decode step. Stores the committed
/// full pages whose tokens are all known (docs/events.md#what-each-call-emits).
///
/// The caller must pass c as NULL or a live handle, req as NULL or valid, tokens as NULL or n
/// values.
///
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG, SKV_ERR_NOT_FOUND, SKV_ERR_STATE,
///          SKV_ERR_UNSUPPORTED
#[no_mangle]
pub unsafe extern "C" fn skv_events_tokens(
    c: *mut skv_cache,
    session_id: u64,
    branch_id: u64,
    req: *const skv_req,
    first_pos: u32,
    tokens: *const i32,
    n: usize,
) -> skv_status {
    export!(
        skv_events_tokens,
        c,
        |t| {
            t.num("session_id", session_id).num("branch_id", branch_id).req("req", req);
            t.num("first_pos", first_pos).list("tokens", tokens, n);
        },
        // SAFETY: c is NULL or a live handle, req NULL or valid and tokens NULL or n values
        // (the contract above); arg, nonnull and slice refuse NULL.
        || unsafe {
            arg(c.cast_const(), "cache")?;
            let r = arg(req, "req")?;
            nonnull(tokens, n, "tokens")?;
            let tokens = super::slice(tokens, n, "tokens")?;
            let cache = lock(c)?;
            hand_tokens(&*c, &cache, (session_id, branch_id), r, first_pos, tokens)
        },
        |_| {},
    )
}

#[cfg(not(feature = "events"))]
fn hand_tokens(_h: &skv_cache, _c: &Cache, _key: (u64, u64), _r: &skv_req, _first: u32, _t: &[i32]) -> Result<()> {
    Err(without_events())
}

/// `cache` is `handle`'s, locked.
#[cfg(feature = "events")]
fn hand_tokens(
    handle: &skv_cache,
    cache: &Cache,
    key: (u64, u64),
    r: &skv_req,
    first_pos: u32,
    tokens: &[i32],
) -> Result<()> {
    let mut ledger = super::events_emit::enabled(handle)?;
    super::events_emit::events_tokens(cache, &mut ledger, key, r, first_pos, tokens)
}

/// Copies the oldest closed batch of events into buf and consumes it: *len its size, *seq its
/// sequence number; *len = 0 when none is pending. cap too small: SKV_ERR_BUFFER, *len the
/// size needed, nothing consumed; a handle whose publisher runs: SKV_ERR_STATE
/// (docs/events.md#the-drain-path).
///
/// The caller must pass c as NULL or a live handle, buf as NULL or cap writable bytes, len
/// and seq as NULL or valid.
///
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG, SKV_ERR_STATE, SKV_ERR_UNSUPPORTED,
///          SKV_ERR_BUFFER
#[no_mangle]
pub unsafe extern "C" fn skv_events_drain(
    c: *mut skv_cache,
    buf: *mut u8,
    cap: usize,
    len: *mut usize,
    seq: *mut u64,
) -> skv_status {
    export!(
        skv_events_drain,
        c,
        |t| t.num("cap", cap as u64),
        // SAFETY: c is NULL or a live handle, buf NULL or cap bytes, len and seq NULL or valid
        // (the contract above); arg, nonnull, out_mut and slice_mut refuse NULL.
        || unsafe {
            arg(c.cast_const(), "cache")?;
            nonnull(buf, cap, "buf")?;
            disjoint(&[Span::of(buf, cap, "buf"), Span::of(len, 1, "len"), Span::of(seq, 1, "seq")])?;
            let len = out_mut(len, "len")?;
            let seq = out_mut(seq, "seq")?;
            let buf = super::slice_mut(buf, cap, "buf")?;
            let _cache = lock(c)?;
            drain_batch(&*c, buf, len, seq)
        },
        |t| {
            // SAFETY: written by the call that just returned (len is read only when not NULL).
            if let Some(n) = unsafe { len.as_ref() } {
                t.num("len", *n as u64);
            }
        },
    )
}

#[cfg(not(feature = "events"))]
fn drain_batch(_h: &skv_cache, _buf: &mut [u8], _len: &mut usize, _seq: &mut u64) -> Result<()> {
    Err(without_events())
}

/// The caller holds `handle`'s lock.
#[cfg(feature = "events")]
fn drain_batch(handle: &skv_cache, buf: &mut [u8], len: &mut usize, seq: &mut u64) -> Result<()> {
    use crate::events::Drained;
    let mut ledger = super::events_emit::enabled(handle)?;
    #[cfg(feature = "zmq")]
    if let Some(e) = ledger.publisher_endpoint() {
        return Err(Error::State(format!("events are published on {e}: there is nothing to drain")));
    }
    match ledger.drain(buf) {
        Drained::Empty => *len = 0,
        Drained::Batch { seq: s, len: n } => (*len, *seq) = (n, s),
        Drained::TooSmall { len: n } => {
            *len = n;
            return Err(Error::Buffer(format!(
                "cap {} < {n}, the size of the oldest batch: nothing consumed",
                buf.len()
            )));
        }
    }
    Ok(())
}
