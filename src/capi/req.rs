//! The request record: skv_req, its one layout with the core's `Req`, and the calls that
//! run an operation on one caller req.

use super::{lock, out_mut, skv_cache, skv_status, traced};
use crate::core::Req;

/// One request's KV bookkeeping: engine-owned plain data that libskv reads and writes.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct skv_req {
    /// req_to_token row, -1 = none.
    pub req_pool_idx: i32,
    /// The generation of req_pool_idx when libskv handed the row to this req (skv_alloc_row,
    /// a skv_match_prefix hit); 0 = not stamped. A req whose non-zero row_generation differs
    /// from its row's current generation is a stale copy (the row was released and handed
    /// out again since): SKV_ERR_STATE. Engines copy it with the req and never set it; a req
    /// built by hand carries 0, which is not checked (in external mode rows the engine
    /// allocates itself are never stamped).
    pub row_generation: u32,
    /// Tokens whose KV is final.
    pub kv_committed_len: u32,
    /// Tokens with KV slots assigned (>= committed).
    pub kv_allocated_len: u32,
    /// Prefix owned by the engine's prefix tree: never freed here. A multiple of page_size.
    pub cache_protected_len: u32,
    /// Sliding-window cursor: [0, this) already freed for SWA layers; 0 = none. Owned mode
    /// with an SWA pool records it per row and only skv_swa_evict (and the frees that cut a
    /// row below it) moves it: a req disagreeing with the record is SKV_ERR_INVALID_ARG.
    pub swa_evicted_seqlen: u32,
    /// Eviction floor of sliding-window layers (sglang's swa_evict_floor): [0, this) is
    /// never window-evicted; 0 = none. The engine sets it (at a prefill, to the prefill's
    /// end); a hit restores the slot's. It may lie past swa_evicted_seqlen and past
    /// kv_allocated_len, and no trim clamps it; at most max_context_len. SWA slots below
    /// swa_dead_lo = max(cache_protected_len, this), rounded up to a page when the floor is
    /// the larger, are never freed by the window. It may rise only while the window has freed
    /// nothing: on a running session's row, a floor lifting swa_dead_lo over positions the
    /// window freed is SKV_ERR_INVALID_ARG (docs/hybrid.md).
    pub swa_evict_floor: u32,
    /// Prompt tokens of this turn (the full session history).
    pub origin_input_len: u32,
    /// Tokens in output_ids, speculative overshoot included.
    pub output_len: u32,
    /// Tokens the turn really produced; -1 = output_len.
    pub finished_len: i32,
    /// Engine prefix-tree node locked by the session's first turn, 0 = none.
    pub lock_node: u64,
    /// Opaque value handed back to dec_lock_ref.
    pub lock_receipt: u64,
    /// Engine auxiliary state handed back to free_aux, -1 = none (sglang: the request's mamba
    /// pool slot, mamba_pool_idx).
    pub aux_state: i64,
    /// Two more recurrent-state handles (sglang: the ping-pong track buffer,
    /// mamba_ping_pong_track_buffer), each -1 when empty. Kept, restored and freed like
    /// aux_state, each on its own: a release calls free_aux for `aux_state`, then
    /// `aux_track[0]`, then `aux_track[1]`, skipping -1 (docs/recurrent-state.md).
    pub aux_track: [i64; 2],
}

impl From<&skv_req> for Req {
    /// A copy of the whole struct at once (one layout: see `as_core_req`), not field by field.
    fn from(r: &skv_req) -> Req {
        *as_core_req(r)
    }
}

/// The caller's reqs as core `Req`s, without copying them (a batch call's requests were
/// copied in and out, a fifth of its time).
pub(crate) fn as_core_reqs(reqs: &mut [skv_req]) -> &mut [Req] {
    // SAFETY: Req and skv_req have one layout (asserted below) of plain integers, for which
    // every bit pattern is valid; the result borrows the same memory for the same lifetime.
    unsafe { std::slice::from_raw_parts_mut(reqs.as_mut_ptr().cast::<Req>(), reqs.len()) }
}

/// The caller's req as a core `Req`, without copying it (see `as_core_reqs`).
pub(crate) fn as_core_req(req: &skv_req) -> &Req {
    // SAFETY: Req and skv_req have one layout (asserted below) of plain integers, for which
    // every bit pattern is valid; the result borrows the same memory for the same lifetime.
    unsafe { &*std::ptr::from_ref(req).cast::<Req>() }
}

// `as_core_reqs` and `as_core_req` rely on these: one size, one alignment, each field at one offset.
const _: () = {
    use std::mem::{align_of, offset_of, size_of};
    assert!(size_of::<Req>() == size_of::<skv_req>() && align_of::<Req>() == align_of::<skv_req>());
    assert!(offset_of!(Req, row) == offset_of!(skv_req, req_pool_idx));
    assert!(offset_of!(Req, generation) == offset_of!(skv_req, row_generation));
    assert!(offset_of!(Req, committed) == offset_of!(skv_req, kv_committed_len));
    assert!(offset_of!(Req, allocated) == offset_of!(skv_req, kv_allocated_len));
    assert!(offset_of!(Req, protected) == offset_of!(skv_req, cache_protected_len));
    assert!(offset_of!(Req, swa) == offset_of!(skv_req, swa_evicted_seqlen));
    assert!(offset_of!(Req, swa_floor) == offset_of!(skv_req, swa_evict_floor));
    assert!(offset_of!(Req, origin_input_len) == offset_of!(skv_req, origin_input_len));
    assert!(offset_of!(Req, output_len) == offset_of!(skv_req, output_len));
    assert!(offset_of!(Req, finished_len) == offset_of!(skv_req, finished_len));
    assert!(offset_of!(Req, lock_node) == offset_of!(skv_req, lock_node));
    assert!(offset_of!(Req, lock_receipt) == offset_of!(skv_req, lock_receipt));
    assert!(offset_of!(Req, aux) == offset_of!(skv_req, aux_state));
    assert!(offset_of!(Req, track) == offset_of!(skv_req, aux_track));
};

impl From<Req> for skv_req {
    fn from(r: Req) -> skv_req {
        skv_req {
            req_pool_idx: r.row,
            row_generation: r.generation,
            kv_committed_len: r.committed,
            kv_allocated_len: r.allocated,
            cache_protected_len: r.protected,
            swa_evicted_seqlen: r.swa,
            origin_input_len: r.origin_input_len,
            output_len: r.output_len,
            finished_len: r.finished_len,
            lock_node: r.lock_node,
            lock_receipt: r.lock_receipt,
            aux_state: r.aux,
            aux_track: r.track,
            swa_evict_floor: r.swa_floor,
        }
    }
}

/// Writes `r` into the caller's req field by field (skv_req has no padding today; writing
/// fields, never the whole struct, keeps it so should a later field leave some).
pub(crate) fn store(req: &mut skv_req, r: Req) {
    let r = skv_req::from(r);
    req.req_pool_idx = r.req_pool_idx;
    req.row_generation = r.row_generation;
    req.kv_committed_len = r.kv_committed_len;
    req.kv_allocated_len = r.kv_allocated_len;
    req.cache_protected_len = r.cache_protected_len;
    req.swa_evicted_seqlen = r.swa_evicted_seqlen;
    req.origin_input_len = r.origin_input_len;
    req.output_len = r.output_len;
    req.finished_len = r.finished_len;
    req.lock_node = r.lock_node;
    req.lock_receipt = r.lock_receipt;
    req.aux_state = r.aux_state;
    req.aux_track = r.aux_track;
    req.swa_evict_floor = r.swa_evict_floor;
}

/// Runs a core operation on a copy of `*req`, writing it back when the call completes
/// (also when a free callback failed part-way: the state advanced).
///
/// # Safety
/// `cache` must be NULL or a live handle, `req` NULL or a valid skv_req.
pub(crate) unsafe fn on_req<T>(
    cache: *mut skv_cache,
    req: *mut skv_req,
    op: impl FnOnce(&mut crate::core::Cache, &mut Req) -> crate::core::Result<T>,
    write: impl FnOnce(T),
) -> crate::core::Result<()> {
    // SAFETY: NULL or valid, by this function's contract.
    let req = unsafe { out_mut(req, "req") }?;
    // SAFETY: NULL or a live handle, by this function's contract.
    let mut c = unsafe { lock(cache) }?;
    let mut r = Req::from(&*req);
    let value = op(&mut c, &mut r)?;
    store(req, r);
    write(value);
    c.take_deferred()
}

/// The export that changes one req and nothing else it returns: traces the req (and the
/// numbers in `args`) in and out, and runs `op` on it through `on_req`.
///
/// # Safety
/// `c` must be NULL or a live handle, `req` NULL or a valid skv_req.
pub(crate) unsafe fn req_export(
    c: *mut skv_cache,
    function: &'static str,
    req: *mut skv_req,
    args: &[(&str, u32)],
    op: impl FnOnce(&mut crate::core::Cache, &mut Req) -> crate::core::Result<()>,
) -> skv_status {
    traced(
        c,
        function,
        |t| {
            t.req("req", req);
            for &(name, v) in args {
                t.num(name, v);
            }
        },
        // SAFETY: c and req are NULL or valid (this function's contract); on_req refuses NULL.
        || unsafe { on_req(c, req, op, |()| {}) },
        |t| {
            t.req("req_out", req);
        },
    )
}

/// The req `skv_req_init` writes, for Rust programs driving the C ABI.
impl Default for skv_req {
    fn default() -> skv_req {
        // SAFETY: skv_req is plain integers; all-zero bytes (padding included) are a valid value.
        let mut r: skv_req = unsafe { std::mem::zeroed() };
        store(&mut r, Req::default());
        r
    }
}

/// Sets a req to hold nothing: row -1, row_generation 0, lengths 0, finished_len -1, lock 0,
/// aux_state -1, both aux_track entries -1.
///
/// The caller must pass req as NULL or valid.
///
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG
#[no_mangle]
pub unsafe extern "C" fn skv_req_init(req: *mut skv_req) -> skv_status {
    export!(skv_req_init, || {
        // SAFETY: req is NULL or valid (the contract above); out_mut refuses NULL.
        let req = unsafe { out_mut(req, "req") }?;
        // SAFETY: a valid skv_req; all-zero bytes (padding included) are a valid value, and
        // zeroing the padding keeps memcmp-style comparisons and valgrind quiet.
        unsafe { std::ptr::write_bytes(req as *mut skv_req, 0, 1) };
        store(req, Req::default());
        Ok(())
    })
}
