//! Handles and configuration: creating a cache over libskv's own pools or the engine's.

use std::ffi::{c_char, c_void, CStr, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use super::external::{skv_pool_ops, ExternalPool, POOL_OPS_SIZES};
use super::trace::{opening_line, TraceFile};
use super::{arg, in_callback, lock, out_mut, skv_status, HandleLock};
use crate::core::{Backend, Cache, Config, Error, Result, TierConfig};
use crate::device::Device;

/// One KV pool (one per tensor-parallel rank) with its session slots. Opaque; any thread
/// may use it, calls on one handle are serialized inside.
pub struct skv_cache {
    /// Names the handle in its trace.
    pub(crate) id: u64,
    pub(crate) inner: HandleLock<Cache>,
    pub(crate) trace: TraceFile,
    /// The GPU copy of the rows, once attached (locked after `inner`).
    pub(crate) device: Mutex<Option<Device>>,
    /// The KV events' ledger, once skv_events_enable turned them on (locked after `inner`).
    #[cfg(feature = "events")]
    pub(crate) events: std::sync::OnceLock<Mutex<crate::events::Ledger>>,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A session prefix is reused only in whole pages (docs/operations.md, skv_match_prefix).
pub const SKV_FLAG_ALIGNED_REUSE: u32 = 0x1;

/// External mode: free_kv receives one index per freed page, req_to_token[row, p] at the
/// page's first position p, instead of every freed token index
/// (docs/external-mode.md#token-indices-not-pages).
pub const SKV_FLAG_PAGE_FREES: u32 = 0x2;

/// Every SKV_FLAG_* bit this library knows.
const KNOWN_FLAGS: u32 = SKV_FLAG_ALIGNED_REUSE | SKV_FLAG_PAGE_FREES;

/// How a cache is laid out.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct skv_cache_config {
    /// sizeof(skv_cache_config) of the header the caller was built with: 32 in ABI 1 and 2,
    /// 40 in ABI 3 (swa_num_token_slots), 80 from ABI 4 (the host tier's fields). Accepted
    /// from 32 up; see "Versioned structs" at the top of this header.
    pub struct_size: u32,
    /// Tokens per KV page, >= 1.
    pub page_size: u32,
    /// Owned mode: KV pool capacity in token slots, a multiple of page_size, at most 2^31;
    /// page 0 (slots 0..page_size-1) is the padding page and never handed out. Ignored in
    /// external mode.
    pub num_token_slots: u64,
    /// req_to_token rows (max live requests + held sessions); bounds the valid row numbers.
    pub num_rows: u32,
    /// Longest sequence a row may map.
    pub max_context_len: u32,
    /// SKV_FLAG_* values, OR-ed.
    pub flags: u32,
    /// Owned mode: the sliding-window (SWA) pool's capacity in token slots, a multiple of
    /// page_size of at least 2 pages and at most 2^31 (its page 0 is padding too); 0 = no
    /// SWA pool (docs/hybrid.md#owned-mode-two-pools). Ignored in external mode; 0 when
    /// struct_size is 32.
    pub swa_num_token_slots: u64,
    /// Owned mode: the host tier's pool in token slots (same rules as num_token_slots); 0 = no
    /// host tier (docs/tiers.md). Must be 0 in external mode. Fields from here on are 0 when
    /// struct_size is 32 or 40.
    pub host_num_token_slots: u64,
    /// The host tier's SWA pool in token slots: non-zero exactly when there are both an SWA
    /// pool and a host tier.
    pub host_swa_num_token_slots: u64,
    /// The engine's id of its KV byte layout (dtype, layers, heads): part of an exported
    /// unit's fingerprint; any value.
    pub kv_layout_id: u64,
    /// The sliding window in tokens, for the fingerprint (0 = not stated); not enforced.
    pub swa_window: u32,
    /// Host tier: a finished session is written back once idle this many skv_tier_step calls.
    pub tier_idle_steps: u32,
    /// Host tier: sessions holding fewer tokens past their protected prefix are never written
    /// back by the policy (0 = one page): the recompute break-even (docs/tiers.md#break-even).
    pub tier_min_tokens: u32,
    /// Host tier: pages a skv_tier_step starts writing back, at most (0 = none in the
    /// background).
    pub tier_pages_per_step: u32,
}

#[cfg(test)]
impl skv_cache_config {
    /// A small owned-mode config (4-token pages, 16 pages, 4 rows) for the unit tests.
    pub(crate) fn small_owned() -> skv_cache_config {
        skv_cache_config {
            struct_size: std::mem::size_of::<skv_cache_config>() as u32,
            page_size: 4,
            num_token_slots: 64,
            num_rows: 4,
            max_context_len: 32,
            flags: 0,
            ..Default::default()
        }
    }
}

/// Every published sizeof(skv_cache_config), oldest first; the last is this library's
/// (`read_versioned`).
pub(crate) const CONFIG_SIZES: [u32; 3] = [32, 40, 80];
const _: () = assert!(std::mem::size_of::<skv_cache_config>() as u32 == CONFIG_SIZES[2]);

/// The caller's config, read up to its struct_size.
///
/// # Safety
/// `cfg` must be NULL or point at a config of struct_size readable bytes.
unsafe fn read_config(cfg: *const skv_cache_config) -> Result<skv_cache_config> {
    // SAFETY: arg refuses NULL; any other cfg has struct_size readable bytes, by contract.
    unsafe { super::read_versioned(arg(cfg, "cfg")?, &CONFIG_SIZES, "cfg") }
}

fn config(cfg: &skv_cache_config) -> Result<Config> {
    if cfg.flags & !KNOWN_FLAGS != 0 {
        return Err(Error::InvalidArg(format!("flags {:#x} has unknown bits", cfg.flags)));
    }
    Ok(Config {
        page_size: cfg.page_size,
        num_token_slots: cfg.num_token_slots,
        num_rows: cfg.num_rows,
        max_context_len: cfg.max_context_len,
        aligned_reuse: cfg.flags & SKV_FLAG_ALIGNED_REUSE != 0,
        swa_num_token_slots: cfg.swa_num_token_slots,
        tier: TierConfig {
            host_num_token_slots: cfg.host_num_token_slots,
            host_swa_num_token_slots: cfg.host_swa_num_token_slots,
            kv_layout_id: cfg.kv_layout_id,
            swa_window: cfg.swa_window,
            idle_steps: cfg.tier_idle_steps,
            min_tokens: cfg.tier_min_tokens,
            pages_per_step: cfg.tier_pages_per_step,
        },
    })
}

/// A new handle over `cache`.
fn boxed(cache: Cache) -> Result<*mut skv_cache> {
    super::quiet::install();
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    let trace = TraceFile::from_env(id, &cache)?;
    Ok(Box::into_raw(Box::new(skv_cache {
        id,
        inner: HandleLock::new(cache),
        trace,
        device: Mutex::new(None),
        #[cfg(feature = "events")]
        events: std::sync::OnceLock::new(),
    })))
}

/// Creates a cache over libskv's own paged pool and rows (owned mode) in `*out`.
///
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG, SKV_ERR_OUT_OF_MEMORY
#[no_mangle]
pub unsafe extern "C" fn skv_cache_new(cfg: *const skv_cache_config, out: *mut *mut skv_cache) -> skv_status {
    // SAFETY: cfg and out are NULL or valid (the contract above); arg and out_mut refuse NULL.
    export!(skv_cache_new, || unsafe {
        arg(cfg, "cfg")?;
        let slot = out_mut(out, "out")?;
        let cfg = config(&read_config(cfg)?)?;
        *slot = boxed(Cache::new_owned(cfg)?)?;
        Ok(())
    })
}

/// Creates a cache over the engine's pools (external mode) in `*out`. `ops` holds the callbacks:
/// read_row, free_row and free_kv (or, for hybrid pools, free_kv_segment instead) are required;
/// `user_data` is passed to every callback (docs/external-mode.md).
///
/// The caller must pass every pointer as NULL or valid, and keep the callbacks callable while
/// the handle lives.
///
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG, SKV_ERR_OUT_OF_MEMORY
#[no_mangle]
pub unsafe extern "C" fn skv_cache_new_external(
    cfg: *const skv_cache_config,
    ops: *const skv_pool_ops,
    user_data: *mut c_void,
    out: *mut *mut skv_cache,
) -> skv_status {
    // SAFETY: cfg, ops and out are NULL or valid, cfg and ops of struct_size readable bytes
    // (the contract above); arg and out_mut refuse NULL before anything is read.
    export!(skv_cache_new_external, || unsafe {
        arg(cfg, "cfg")?;
        arg(ops, "ops")?;
        let slot = out_mut(out, "out")?;
        let ops = super::read_versioned(ops, &POOL_OPS_SIZES, "ops")?;
        let missing: Vec<&str> = [
            ("ops->read_row", ops.read_row.is_none()),
            ("ops->free_kv", ops.free_kv.is_none() && ops.free_kv_segment.is_none()),
            ("ops->free_row", ops.free_row.is_none()),
        ]
        .into_iter()
        .filter_map(|(name, null)| null.then_some(name))
        .collect();
        if !missing.is_empty() {
            return Err(Error::NullArg(format!(
                "{} {} NULL (read_row, free_row and one of free_kv, free_kv_segment are required)",
                missing.join(", "),
                if missing.len() == 1 { "is" } else { "are" }
            )));
        }
        let raw = read_config(cfg)?;
        let cfg = config(&raw)?;
        cfg.validate()?;
        cfg.tier.validate(cfg.page_size, false, false)?;
        // Page frees matter only where a page holds more than one token.
        let page_frees = raw.flags & SKV_FLAG_PAGE_FREES != 0 && cfg.page_size > 1;
        let pool = ExternalPool::new(ops, user_data, cfg.page_size, page_frees);
        *slot = boxed(Cache::new(cfg, Backend::Engine(Box::new(pool)))?)?;
        Ok(())
    })
}

/// Destroys a handle; NULL is a no-op, and so is a call from inside a libskv callback (of any
/// handle). Frees host memory only: no callback runs and no session is released.
///
/// The caller must pass NULL or a handle not yet freed, with no call on it in progress.
#[no_mangle]
pub unsafe extern "C" fn skv_cache_free(cache: *mut skv_cache) {
    // Freeing a handle from inside a callback could free the lock a running call holds.
    if !cache.is_null() && !in_callback() {
        // SAFETY: a handle from Box::into_raw not yet freed, with no call on it in progress
        // (the contract above); no callback runs on this thread, so none of its calls holds it.
        let _ = super::quiet::inside_call(|| std::panic::catch_unwind(|| drop(unsafe { Box::from_raw(cache) })));
    }
}

/// Appends every later call on this handle to the JSON-lines file `path` (created if missing),
/// one object per call; NULL stops tracing. SKV_TRACE=path in the environment does the same for
/// every new handle (docs/tracing.md).
///
/// The caller must pass path as NULL or a NUL-terminated string.
///
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG, SKV_ERR_STATE
#[no_mangle]
pub unsafe extern "C" fn skv_cache_set_trace(c: *mut skv_cache, path: *const c_char) -> skv_status {
    // SAFETY: c is NULL or a live handle and path NULL or a NUL-terminated string (the
    // contract above); arg refuses a NULL handle and path is read only when not NULL.
    export!(skv_cache_set_trace, || unsafe {
        let handle = arg(c.cast_const(), "cache")?;
        // Calls take the trace lock before the handle's: read what the first line needs and let
        // go of the handle before opening.
        let first = opening_line(handle.id, &*lock(c)?);
        let path = (!path.is_null()).then(|| Path::new(OsStr::from_bytes(CStr::from_ptr(path).to_bytes())));
        handle.trace.open(path.map(|p| (p, first)))
    })
}
