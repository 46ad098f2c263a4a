//! Moving a session between instances (docs/transfer.md): the destination's answer to a
//! source whose notification was lost or late, and the glue from page ids and KV layouts to a
//! transfer engine's descriptors. libskv never links a transfer engine.

use super::{arg, disjoint, disjoint_across, lock, out_mut, skv_cache, skv_status, slice, slice_mut, Span};
use crate::core::transfer::{descs, descs_len, Answer, Layout};
use crate::core::Error;

/// The Rust name of the C record (one definition, in `core::transfer`).
pub use crate::core::XferDesc as skv_xfer_desc;

/// skv_session_fence: this handle never committed the epoch; an import of it (or lower) is
/// refused from now on.
pub const SKV_FENCE_ABSENT: i32 = 0;
/// skv_session_fence: an import of the epoch is still open here: ask again after its ticket.
pub const SKV_FENCE_PENDING: i32 = 1;
/// skv_session_fence: committed here at the epoch or a later one.
pub const SKV_FENCE_COMMITTED: i32 = 2;

const _: () = assert!(
    SKV_FENCE_ABSENT == Answer::Absent as i32
        && SKV_FENCE_PENDING == Answer::Pending as i32
        && SKV_FENCE_COMMITTED == Answer::Committed as i32
);

/// One side's KV layout in one pool, for skv_transfer_descs: region `r` of page `p` is
/// `page_bytes` bytes at `region_base[r] + p * page_stride` (a region per layer and K/V, or
/// one for a page-major arena).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct skv_kv_layout {
    /// sizeof(skv_kv_layout) of the header the caller was built with: 32 (0.4). See
    /// "Versioned structs" at the top of this header.
    pub struct_size: u32,
    pub n_regions: u32,
    /// `n_regions` base addresses.
    pub region_base: *const u64,
    pub page_stride: u64,
    pub page_bytes: u64,
}

/// Every published sizeof(skv_kv_layout) (`read_versioned`).
pub(crate) const LAYOUT_SIZES: [u32; 1] = [32];
const _: () = assert!(std::mem::size_of::<skv_kv_layout>() as u32 == LAYOUT_SIZES[0]);

/// What a move's source asks its destination after a lost or late notification: whether the
/// move `unit` describes (the source's own unit, `len` bytes: its session, incarnation and
/// epoch) committed here. `*out_state` receives SKV_FENCE_COMMITTED, SKV_FENCE_PENDING (its
/// import ticket is still open) or SKV_FENCE_ABSENT (never committed; from now on an import of
/// that epoch or lower is refused, so the source may serve the session again)
/// (docs/transfer.md#when-the-notification-is-lost).
///
/// The caller must pass unit holding len bytes.
///
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG, SKV_ERR_STATE, SKV_ERR_UNSUPPORTED
#[no_mangle]
pub unsafe extern "C" fn skv_session_fence(
    c: *mut skv_cache,
    unit: *const u8,
    len: usize,
    out_state: *mut i32,
) -> skv_status {
    export!(
        skv_session_fence,
        c,
        |t| t.num("len", len as u64),
        // SAFETY: c, unit (len bytes) and out_state are NULL or valid (the contract above);
        // lock, slice and out_mut refuse NULL.
        || unsafe {
            disjoint(&[Span::of(unit, len, "unit"), Span::of(out_state, 1, "out_state")])?;
            let out = out_mut(out_state, "out_state")?;
            let unit = slice(unit, len, "unit")?;
            *out = lock(c)?.fence(unit)? as i32;
            Ok(())
        },
        |t| {
            // SAFETY: NULL or valid (the contract above), read after the body wrote it.
            t.num("state", unsafe { out_state.as_ref() }.copied().unwrap_or(-1));
        },
    )
}

/// The descriptors a transfer engine moves a session's pages with: `remote_pages[i]` (the
/// unit's ids, the source's) into `local_pages[i]` (the import's `out_pages`), region by region
/// in page order, runs of consecutive ids on both sides merged where `page_bytes` equals
/// `page_stride` on both. `*out_len` receives the count, also when `out_cap` is short (NULL and
/// 0 ask it: SKV_ERR_BUFFER). Call once per pool (full pages, then SWA pages with the SWA
/// pool's layouts). Needs no handle (docs/transfer.md#the-nixl-glue).
///
/// The caller must pass local_pages and remote_pages holding n_pages values and out holding
/// out_cap descriptors.
///
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG, SKV_ERR_BUFFER
#[no_mangle]
pub unsafe extern "C" fn skv_transfer_descs(
    local: *const skv_kv_layout,
    local_pages: *const i32,
    remote: *const skv_kv_layout,
    remote_pages: *const i32,
    n_pages: usize,
    out: *mut crate::core::XferDesc,
    out_cap: usize,
    out_len: *mut usize,
) -> skv_status {
    export!(
        skv_transfer_descs,
        // SAFETY: every pointer is NULL or valid for the counts the contract above names; the
        // helpers refuse NULL and misalignment.
        || unsafe {
            let (l, r) = (layout(local, "local")?, layout(remote, "remote")?);
            // The outputs share no byte with each other or with any input (the inputs may
            // share: both sides may name the same ids).
            let outs = [Span::of(out, out_cap, "out"), Span::of(out_len, 1, "out_len")];
            disjoint(&outs)?;
            disjoint_across(
                &outs,
                &[
                    Span::of(local_pages, n_pages, "local_pages"),
                    Span::of(remote_pages, n_pages, "remote_pages"),
                    Span::of(l.0.as_ptr(), l.0.len(), "local->region_base"),
                    Span::of(r.0.as_ptr(), r.0.len(), "remote->region_base"),
                ],
            )?;
            let out_len = out_mut(out_len, "out_len")?;
            let (lp, rp) = (slice(local_pages, n_pages, "local_pages")?, slice(remote_pages, n_pages, "remote_pages")?);
            let out = slice_mut(out, out_cap, "out")?;
            let (l, r) = (Layout { region_base: l.0, ..l.1 }, Layout { region_base: r.0, ..r.1 });
            let n = descs_len(&l, lp, &r, rp)?;
            if n > out.len() {
                *out_len = n;
                return Err(Error::Buffer(format!("{n} descriptors; out holds {}", out.len())));
            }
            *out_len = descs(&l, lp, &r, rp, out);
            Ok(())
        },
    )
}

/// A layout's bases and its other fields (`region_base` empty in the second).
///
/// # Safety
/// `p` is NULL or a valid `skv_kv_layout` whose `region_base` holds `n_regions` values.
unsafe fn layout<'a>(p: *const skv_kv_layout, name: &str) -> crate::core::Result<(&'a [u64], Layout<'a>)> {
    // SAFETY: p is NULL or valid (this function's contract); arg refuses NULL.
    let l = unsafe { super::read_versioned(arg(p, name)?, &LAYOUT_SIZES, name)? };
    if l.n_regions == 0 {
        return Err(Error::InvalidArg(format!("{name}->n_regions 0: a layout has at least one region")));
    }
    // SAFETY: region_base holds n_regions values (this function's contract); slice refuses NULL.
    let bases = unsafe { slice(l.region_base, l.n_regions as usize, &format!("{name}->region_base"))? };
    Ok((bases, Layout { region_base: &[], page_stride: l.page_stride, page_bytes: l.page_bytes }))
}
