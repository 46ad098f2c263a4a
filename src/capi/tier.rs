//! The host tier and tickets (docs/tiers.md): export and import a session as a unit, park
//! idle sessions in host memory, restore them on a match, complete the copies' tickets, and
//! ask where a session's KV is.

use super::req::on_req;
use super::{disjoint, disjoint_across, events_emit, lock, out_mut, skv_cache, skv_status, slice, slice_mut, Span};
use crate::core::{Error, ImportSpec, Req, Result};

/// The Rust names of the C records (one definition each, in `core`).
pub use crate::core::{
    Evicted as skv_tier_evicted, TierMatch as skv_tier_match, TierStats as skv_tier_stats, Where as skv_where,
};

/// copy_pages' direction: device pages to host pages (a write-back).
pub const SKV_COPY_TO_HOST: u32 = 1;
/// copy_pages' direction: host pages to device pages (a restore).
pub const SKV_COPY_TO_DEVICE: u32 = 2;
/// skv_tier_evict: never start a copy (a slot without a clean host copy is released).
pub const SKV_EVICT_NO_COPY: u32 = 1;
/// skv_session_export: the session moves to another instance (docs/transfer.md).
pub const SKV_EXPORT_MOVE: u32 = 1;
/// skv_where.place: no slot.
pub const SKV_PLACE_NONE: u32 = 0;
/// skv_where.place: on the device only.
pub const SKV_PLACE_DEVICE: u32 = 1;
/// skv_where.place: on the device, with a clean host copy beside it.
pub const SKV_PLACE_BOTH: u32 = 2;
/// skv_where.place: parked: in the host tier only.
pub const SKV_PLACE_HOST: u32 = 3;
/// skv_where.state: restored into a running request.
pub const SKV_WHERE_IN_FLIGHT: u32 = 1;
/// skv_where.state: a ticket's copy of its pages is open.
pub const SKV_WHERE_COPYING: u32 = 2;
/// skv_where.state: its restore's copy failed (hand the request back or abort it).
pub const SKV_WHERE_FAILED: u32 = 4;
/// skv_where.state: it parks when its write-back completes.
pub const SKV_WHERE_LEAVING: u32 = 8;

const _: () =
    assert!(SKV_COPY_TO_HOST == crate::core::COPY_TO_HOST && SKV_COPY_TO_DEVICE == crate::core::COPY_TO_DEVICE);
const _: () = assert!(SKV_PLACE_HOST == crate::core::PLACE_HOST && SKV_WHERE_LEAVING == crate::core::WHERE_LEAVING);

/// The caller's out-struct, whose `struct_size` (its first field, set by the caller) must be
/// at least `size`, this library's sizeof; the answer keeps it.
///
/// # Safety
/// `p` must be NULL or point at a struct of its struct_size writable bytes.
unsafe fn versioned_out<'a, T>(p: *mut T, name: &str) -> Result<&'a mut T> {
    // SAFETY: NULL or valid by contract; out_mut refuses NULL and misalignment.
    let out = unsafe { out_mut(p, name) }?;
    // SAFETY: out is a valid T, whose first field is a u32 struct_size.
    let size = unsafe { (out as *mut T).cast::<u32>().read() };
    let full = std::mem::size_of::<T>() as u32;
    if size < full {
        return Err(Error::InvalidArg(format!("{name}->struct_size {size} < {full}, the first published size")));
    }
    Ok(out)
}

/// Writes `v` to `out` keeping the caller's struct_size.
fn answer<T: Copy>(out: &mut T, v: T) {
    // SAFETY: both are valid Ts whose first field is a u32 struct_size.
    unsafe {
        let size = (out as *mut T).cast::<u32>().read();
        *out = v;
        (out as *mut T).cast::<u32>().write(size);
    }
}

/// What a session's import needs besides its unit: the destination's key, row and handles.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct skv_import {
    /// sizeof(skv_import) of the header the caller was built with: 80 or 96 (0.4). See "Versioned
    /// structs" at the top of this header.
    pub struct_size: u32,
    /// 0.
    pub flags: u32,
    pub session_id: u64,
    pub branch_id: u64,
    /// External mode: the engine's row, already mapping the unit's `[0, allocated)`; owned
    /// mode: -1 (libskv takes a row).
    pub row: i32,
    /// Owned mode: the token slots of the destination tree's prefix, `n_prefix` of them (the
    /// unit's protected length; skv_map_prefix's rules); 0 and NULL when it protects nothing,
    /// and in external mode.
    pub n_prefix: u32,
    pub prefix_indices: *const i32,
    /// The destination's prefix-tree lock (0: none) and recurrent-state handles: not -1 exactly
    /// where the source held one (docs/tiers.md#export-and-import).
    pub lock_node: u64,
    pub lock_receipt: u64,
    pub aux_state: i64,
    pub aux_track: [i64; 2],
    /// With KV events on: the session's token ids from position 0, `n_tokens` of them (those
    /// past its committed length are ignored), so the import stores its full pages at once
    /// (docs/transfer.md#kv-events); NULL and 0 publish nothing until skv_events_tokens.
    /// Ignored with events off.
    pub tokens: *const i32,
    pub n_tokens: u64,
}

/// Every published sizeof(skv_import) (`read_versioned`).
pub(crate) const IMPORT_SIZES: [u32; 2] = [80, 96];
const _: () = assert!(std::mem::size_of::<skv_import>() as u32 == IMPORT_SIZES[1]);

/// Writes the unit of the idle slot of (session_id, branch_id) into `buf` (`cap` bytes; NULL
/// and 0 ask the size) and pins its pages under `*ticket` until the engine's copy of them
/// completes (docs/tiers.md#export-and-import). `*len` receives the unit's size, also when
/// `cap` is short. `flags`: 0 (a copy), or SKV_EXPORT_MOVE (the session moves to another
/// instance: the whole session under a new epoch; success releases it here, failure leaves it
/// serving; its release is refused meanwhile; docs/transfer.md).
///
/// The caller must pass buf holding cap bytes.
///
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG, SKV_ERR_OUT_OF_MEMORY, SKV_ERR_NOT_FOUND,
///          SKV_ERR_STATE, SKV_ERR_CALLBACK, SKV_ERR_UNSUPPORTED, SKV_ERR_BUFFER
#[no_mangle]
pub unsafe extern "C" fn skv_session_export(
    c: *mut skv_cache,
    session_id: u64,
    branch_id: u64,
    flags: u32,
    buf: *mut u8,
    cap: usize,
    len: *mut usize,
    ticket: *mut u64,
) -> skv_status {
    export!(
        skv_session_export,
        c,
        |t| t.num("session_id", session_id).num("branch_id", branch_id).num("flags", flags).num("cap", cap as u64),
        // SAFETY: c is NULL or a live handle, buf NULL or cap bytes, len and ticket NULL or
        // valid (the contract above); the helpers refuse NULL and misalignment.
        || unsafe {
            disjoint(&[Span::of(buf, cap, "buf"), Span::of(len, 1, "len"), Span::of(ticket, 1, "ticket")])?;
            let (len, ticket) = (out_mut(len, "len")?, out_mut(ticket, "ticket")?);
            let buf = slice_mut(buf, cap, "buf")?;
            if flags & !SKV_EXPORT_MOVE != 0 {
                return Err(Error::InvalidArg(format!("flags {flags:#x} has unknown bits (SKV_EXPORT_MOVE or 0)")));
            }
            let moving = flags & SKV_EXPORT_MOVE != 0;
            let mut cache = lock(c)?;
            match cache.export(session_id, branch_id, moving, buf) {
                Ok(out) => (*len, *ticket) = out,
                // The size the caller's buffer lacks, with the refusal.
                Err(e @ Error::Buffer(_)) => {
                    *len = cache.export_len(session_id, branch_id, moving)?;
                    return Err(e);
                }
                Err(e) => return Err(e),
            }
            Ok(())
        },
        |t| {
            // SAFETY: NULL or valid (the contract above), read after the body wrote it.
            t.num("ticket", unsafe { ticket.as_ref() }.copied().unwrap_or(0));
        },
    )
}

/// Records the session a unit describes as an idle slot whose KV arrives under `*ticket`
/// (docs/tiers.md#export-and-import). Owned mode: takes a row and the unit's pages, writing
/// their ids to `out_pages` (full pages, then SWA pages: the copy's destinations; `*n_pages`
/// receives how many); external mode: adopts `in->row`, `*n_pages` 0. Until the ticket
/// completes, only skv_match_prefix_tier matches it.
///
/// The caller must pass unit holding len bytes and out_pages holding out_cap values.
///
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG, SKV_ERR_OUT_OF_MEMORY, SKV_ERR_STATE,
///          SKV_ERR_UNSUPPORTED
#[no_mangle]
pub unsafe extern "C" fn skv_session_import(
    c: *mut skv_cache,
    in_: *const skv_import,
    unit: *const u8,
    len: usize,
    out_pages: *mut i32,
    out_cap: usize,
    n_pages: *mut usize,
    ticket: *mut u64,
) -> skv_status {
    export!(
        skv_session_import,
        c,
        |t| t.num("len", len as u64).num("out_cap", out_cap as u64),
        // SAFETY: c NULL or live, in_ NULL or its struct_size bytes, unit len bytes, out_pages
        // out_cap values, n_pages and ticket NULL or valid (the contract above); the helpers
        // refuse NULL and misalignment.
        || unsafe {
            disjoint(&[
                Span::of(out_pages, out_cap, "out_pages"),
                Span::of(n_pages, 1, "n_pages"),
                Span::of(ticket, 1, "ticket"),
            ])?;
            let spec = super::read_versioned(super::arg(in_, "in")?, &IMPORT_SIZES, "in")?;
            let (n_pages, ticket) = (out_mut(n_pages, "n_pages")?, out_mut(ticket, "ticket")?);
            let unit = slice(unit, len, "unit")?;
            let out = slice_mut(out_pages, out_cap, "out_pages")?;
            if spec.flags != 0 {
                return Err(Error::InvalidArg(format!("in->flags {:#x} has unknown bits", spec.flags)));
            }
            let prefix = slice(spec.prefix_indices, spec.n_prefix as usize, "in->prefix_indices")?;
            let tokens = match usize::try_from(spec.n_tokens) {
                Ok(n) => slice(spec.tokens, n, "in->tokens")?,
                Err(_) => return Err(Error::InvalidArg(format!("in->n_tokens {} is too large", spec.n_tokens))),
            };
            // The outputs share no byte with the inputs read after they are written.
            disjoint_across(
                &[
                    Span::of(out_pages, out_cap, "out_pages"),
                    Span::of(n_pages as *const usize, 1, "n_pages"),
                    Span::of(ticket as *const u64, 1, "ticket"),
                ],
                &[
                    Span::of(unit.as_ptr(), unit.len(), "unit"),
                    Span::of(prefix.as_ptr(), prefix.len(), "in->prefix_indices"),
                    Span::of(tokens.as_ptr(), tokens.len(), "in->tokens"),
                ],
            )?;
            let key = (spec.session_id, spec.branch_id);
            let spec = ImportSpec {
                session: spec.session_id,
                branch: spec.branch_id,
                row: spec.row,
                prefix,
                lock_node: spec.lock_node,
                lock_receipt: spec.lock_receipt,
                aux_state: spec.aux_state,
                aux_track: spec.aux_track,
            };
            let mut cache = lock(c)?;
            (*n_pages, *ticket) =
                events_emit::import(c, &mut cache, key, tokens, |cache| cache.import(&spec, unit, out))?;
            Ok(())
        },
        |t| {
            // SAFETY: NULL or valid (the contract above), read after the body wrote it.
            t.num("ticket", unsafe { ticket.as_ref() }.copied().unwrap_or(0));
        },
    )
}

/// skv_match_prefix, where a parked session is restored: new device pages for its prefix and a
/// copy from host under `out->ticket`, which the engine orders its forward pass after (a miss
/// when the pages do not fit: the parked slot is released). A slot an import still writes hits
/// with the import's ticket; one already on the device hits with ticket 0.
///
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG, SKV_ERR_OUT_OF_MEMORY, SKV_ERR_NOT_FOUND,
///          SKV_ERR_STATE, SKV_ERR_CALLBACK, SKV_ERR_UNSUPPORTED
#[no_mangle]
pub unsafe extern "C" fn skv_match_prefix_tier(
    c: *mut skv_cache,
    session_id: u64,
    branch_id: u64,
    req: *mut Req,
    key_len: u32,
    pre_aborted: u32,
    out: *mut crate::core::TierMatch,
) -> skv_status {
    export!(
        skv_match_prefix_tier,
        c,
        |t| {
            t.num("session_id", session_id).num("branch_id", branch_id).req("req", req);
            t.num("key_len", key_len).num("pre_aborted", pre_aborted);
        },
        // SAFETY: c, req and out are NULL or valid (the contract above); versioned_out and
        // on_req refuse NULL.
        || unsafe {
            disjoint(&[Span::of(req, 1, "req"), Span::of(out, 1, "out")])?;
            let out = versioned_out(out, "out")?;
            let key = (session_id, branch_id);
            on_req(
                c,
                req,
                |cache, r| {
                    let pre = pre_aborted != 0;
                    let (m, lens) = events_emit::tier(
                        c,
                        cache,
                        |cache| {
                            let m = cache.match_prefix_tier(session_id, branch_id, r, key_len, pre)?;
                            Ok((m, (r.kv_allocated_len, r.kv_committed_len)))
                        },
                        // The hit's own answer, as skv_match_prefix's (after the restore's move).
                        |_, (m, (held, committed))| (m.hit == 1).then_some((key, *held, *committed)),
                    )?;
                    let _ = lens;
                    Ok(m)
                },
                |m| answer(out, m),
            )
        },
        |t| {
            t.req("req_out", req);
        },
    )
}

/// Completes `ticket`: its copies ran (`status` 0) or failed (non-zero). Pages freed while it
/// copied them go back; a write-back's session is clean (and parks if an eviction asked); a
/// failed copy loses nothing (docs/tiers.md#completing-a-ticket).
///
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG, SKV_ERR_OUT_OF_MEMORY, SKV_ERR_STATE,
///          SKV_ERR_CALLBACK, SKV_ERR_UNSUPPORTED
#[no_mangle]
pub unsafe extern "C" fn skv_ticket_done(c: *mut skv_cache, ticket: u64, status: i32) -> skv_status {
    export!(
        skv_ticket_done,
        c,
        |t| t.num("ticket", ticket).num("status", status),
        // SAFETY: c is NULL or a live handle (the contract above); lock refuses NULL.
        || unsafe {
            let mut cache = lock(c)?;
            events_emit::tier(c, &mut cache, |cache| cache.ticket_done(ticket, status == 0), |_, _| None)?;
            cache.take_deferred()
        },
        |_| {},
    )
}

/// Owned mode with a host tier: parks the idle slot of (session_id, branch_id): its device
/// pages past the protected prefix go now if its host copy is clean (`*ticket` 0), else once
/// the write-back this starts completes (`*ticket`).
///
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG, SKV_ERR_OUT_OF_MEMORY, SKV_ERR_NOT_FOUND,
///          SKV_ERR_STATE, SKV_ERR_CALLBACK, SKV_ERR_UNSUPPORTED
#[no_mangle]
pub unsafe extern "C" fn skv_session_park(
    c: *mut skv_cache,
    session_id: u64,
    branch_id: u64,
    ticket: *mut u64,
) -> skv_status {
    export!(
        skv_session_park,
        c,
        |t| t.num("session_id", session_id).num("branch_id", branch_id),
        // SAFETY: c and ticket are NULL or valid (the contract above); lock and out_mut refuse NULL.
        || unsafe {
            let ticket = out_mut(ticket, "ticket")?;
            let mut cache = lock(c)?;
            *ticket = events_emit::tier(c, &mut cache, |cache| cache.park(session_id, branch_id), |_, _| None)?;
            cache.take_deferred()
        },
        |t| {
            // SAFETY: NULL or valid (the contract above), read after the body wrote it.
            t.num("ticket", unsafe { ticket.as_ref() }.copied().unwrap_or(0));
        },
    )
}

/// Owned mode with a host tier: one tick of the policy's clock. Idle sessions past
/// tier_idle_steps start writing back, at most tier_pages_per_step pages (the first session
/// always); `*pages` receives the pages queued and `*ticket` their ticket (0: none).
///
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG, SKV_ERR_OUT_OF_MEMORY, SKV_ERR_STATE,
///          SKV_ERR_CALLBACK, SKV_ERR_UNSUPPORTED
#[no_mangle]
pub unsafe extern "C" fn skv_tier_step(c: *mut skv_cache, pages: *mut u64, ticket: *mut u64) -> skv_status {
    export!(
        skv_tier_step,
        c,
        |_t| {},
        // SAFETY: c, pages and ticket are NULL or valid (the contract above); lock and out_mut
        // refuse NULL.
        || unsafe {
            disjoint(&[Span::of(pages, 1, "pages"), Span::of(ticket, 1, "ticket")])?;
            let (pages, ticket) = (out_mut(pages, "pages")?, out_mut(ticket, "ticket")?);
            let mut cache = lock(c)?;
            (*pages, *ticket) = events_emit::tier(c, &mut cache, |cache| cache.tier_step(), |_, _| None)?;
            cache.take_deferred()
        },
        |t| {
            // SAFETY: NULL or valid (the contract above), read after the body wrote it.
            t.num("ticket", unsafe { ticket.as_ref() }.copied().unwrap_or(0));
        },
    )
}

/// Owned mode with a host tier: frees device pages, least recently finished idle sessions
/// first, until `pages` are freed or draining (docs/tiers.md#eviction). `flags`:
/// SKV_EVICT_NO_COPY or 0. `*out` says what went and the write-back's ticket.
///
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG, SKV_ERR_OUT_OF_MEMORY, SKV_ERR_STATE,
///          SKV_ERR_CALLBACK, SKV_ERR_UNSUPPORTED
#[no_mangle]
pub unsafe extern "C" fn skv_tier_evict(
    c: *mut skv_cache,
    pages: u64,
    flags: u32,
    out: *mut crate::core::Evicted,
) -> skv_status {
    export!(
        skv_tier_evict,
        c,
        |t| t.num("pages", pages).num("flags", flags),
        // SAFETY: c and out are NULL or valid (the contract above); lock and versioned_out
        // refuse NULL.
        || unsafe {
            let out = versioned_out(out, "out")?;
            if flags & !SKV_EVICT_NO_COPY != 0 {
                return Err(Error::InvalidArg(format!("flags {flags:#x} has unknown bits")));
            }
            let mut cache = lock(c)?;
            let no_copy = flags & SKV_EVICT_NO_COPY != 0;
            let e = events_emit::tier(c, &mut cache, |cache| cache.tier_evict(pages, no_copy), |_, _| None)?;
            answer(out, e);
            cache.take_deferred()
        },
        |_| {},
    )
}

/// Where the KV of (session_id, branch_id) is: `*out` (place SKV_PLACE_NONE when it has no
/// slot). Changes nothing.
///
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG, SKV_ERR_STATE
#[no_mangle]
pub unsafe extern "C" fn skv_session_where(
    c: *const skv_cache,
    session_id: u64,
    branch_id: u64,
    out: *mut crate::core::Where,
) -> skv_status {
    export!(
        skv_session_where,
        c,
        |t| t.num("session_id", session_id).num("branch_id", branch_id),
        // SAFETY: c and out are NULL or valid (the contract above); lock and versioned_out
        // refuse NULL.
        || unsafe {
            let out = versioned_out(out, "out")?;
            answer(out, lock(c)?.where_is(session_id, branch_id));
            Ok(())
        },
        |_| {},
    )
}

/// The host tier's pools and counters, and the open tickets (both modes; without a host tier
/// the host fields are 0). Changes nothing.
///
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG, SKV_ERR_STATE
#[no_mangle]
pub unsafe extern "C" fn skv_cache_tier_stats(c: *const skv_cache, out: *mut crate::core::TierStats) -> skv_status {
    export!(
        skv_cache_tier_stats,
        c,
        |_t| {},
        // SAFETY: c and out are NULL or valid (the contract above); lock and versioned_out
        // refuse NULL.
        || unsafe {
            let out = versioned_out(out, "out")?;
            answer(out, lock(c)?.tier_stats());
            Ok(())
        },
        |_| {},
    )
}
