//! The move calls through the C ABI over hostile arguments: skv_transfer_descs's layouts and
//! arrays (docs/transfer.md#the-nixl-glue), and outputs aliasing a unit. Every
//! refusal is a status naming the value, writes nothing, and never a wrapped address.

mod common;

use common::*;
use skv::*;

const SIZE: u32 = std::mem::size_of::<skv_kv_layout>() as u32;

fn layout(bases: &[u64], stride: u64, bytes: u64) -> skv_kv_layout {
    skv_kv_layout {
        struct_size: SIZE,
        n_regions: bases.len() as u32,
        region_base: bases.as_ptr(),
        page_stride: stride,
        page_bytes: bytes,
    }
}

/// The call with `out` of `cap` descriptors pre-filled with a marker; the status, `*out_len`
/// (`usize::MAX` when untouched) and `out`.
fn call(l: &skv_kv_layout, lp: &[i32], r: &skv_kv_layout, rp: &[i32], cap: usize) -> (u32, usize, Vec<skv_xfer_desc>) {
    assert_eq!(lp.len(), rp.len());
    let mark = skv_xfer_desc { local_addr: 0xAB, remote_addr: 0xCD, len: 0xEF };
    let mut out = vec![mark; cap];
    let mut n = usize::MAX;
    // SAFETY: the layouts' bases hold n_regions values, lp and rp hold n values, out cap.
    let st = unsafe { skv_transfer_descs(l, lp.as_ptr(), r, rp.as_ptr(), lp.len(), out.as_mut_ptr(), cap, &mut n) };
    (code(st), n, out)
}

/// An address past 2^64 is refused, never wrapped: a stride times a large id, a base near the
/// top, a page's bytes past the end; each naming the side and the value.
#[test]
fn addresses_past_the_address_space_are_refused() {
    let mark = skv_xfer_desc { local_addr: 0xAB, remote_addr: 0xCD, len: 0xEF };
    let ok = layout(&[0x1000], 64, 64);
    let cases: Vec<(skv_kv_layout, Vec<i32>, &str)> = vec![
        // id * stride overflows u64 (a wrapped address would be small and plausible).
        (layout(&[0x1000], 1 << 62, 64), vec![5], "local"),
        (layout(&[0x1000], u64::MAX / 2, u64::MAX / 2), vec![3], "local"),
        (layout(&[0x1000], 1 << 34, 64), vec![i32::MAX], "local"),
        // base + id * stride + bytes overflows.
        (layout(&[u64::MAX - 100], 64, 64), vec![1], "local region_base[0]"),
        (layout(&[0, u64::MAX - 64], 64, 64), vec![1], "local region_base[1]"),
        // page_bytes alone past the end.
        (layout(&[0x1000], u64::MAX, u64::MAX), vec![1], "local"),
    ];
    let rbases = [0x1000u64, 0x2000];
    for (l, ids, needle) in cases {
        let r = layout(&rbases[..l.n_regions as usize], l.page_bytes.max(64), l.page_bytes);
        let rp = vec![1; ids.len()];
        let (st, n, out) = call(&l, &ids, &r, &rp, 4);
        assert_eq!(status_name(st), "INVALID_ARG", "{needle} stride {:#x}: {}", l.page_stride, last_error());
        assert!(last_error().contains(needle), "{needle}: {}", last_error());
        assert_eq!(n, usize::MAX, "out_len untouched");
        assert!(out.iter().all(|d| *d == mark), "out untouched");
    }
    // The same on the remote side.
    let r = layout(&[0x1000], 1 << 62, 64);
    let (st, n, _) = call(&ok, &[1], &r, &[5], 4);
    assert_eq!(status_name(st), "INVALID_ARG", "{}", last_error());
    assert!(last_error().contains("remote"), "{}", last_error());
    assert_eq!(n, usize::MAX);
}

/// Many regions: the count (regions times runs) is exact, a short `out` gets SKV_ERR_BUFFER
/// with the count and nothing written, and the full call writes every region's descriptor.
#[test]
fn many_regions_count_exactly() {
    let bases: Vec<u64> = (0..100_000u64).map(|r| 0x10_0000 + r * 0x1_0000).collect();
    let (l, r) = (layout(&bases, 64, 64), layout(&bases, 64, 64));
    let (lp, rp) = ([1, 2, 5], [7, 8, 3]);
    let (st, n, out) = call(&l, &lp, &r, &rp, 3);
    assert_eq!((st, n), (skv_status::SKV_ERR_BUFFER as u32, 200_000), "{}", last_error());
    assert!(out.iter().all(|d| d.local_addr == 0xAB), "a short out is not written");
    let (st, n, out) = call(&l, &lp, &r, &rp, 200_000);
    assert_eq!((status_name(st), n), ("OK", 200_000));
    let last = out[199_999];
    assert_eq!((last.local_addr, last.remote_addr, last.len), (bases[99_999] + 5 * 64, bases[99_999] + 3 * 64, 64));
    // The two sides must name as many regions.
    let (st, ..) = call(&layout(&bases[..2], 64, 64), &lp, &layout(&bases[..3], 64, 64), &rp, 8);
    assert_eq!(status_name(st), "INVALID_ARG");
    assert!(last_error().contains("local n_regions 2 != remote n_regions 3"), "{}", last_error());
}

/// `out` sharing memory with `out_len` or with an input (the ids, the layouts' bases) is
/// refused before anything is read or written: a descriptor written over the ids it is being
/// computed from would be garbage.
#[test]
fn aliased_arrays_are_refused() {
    let bases = [0x1000u64];
    let (l, r) = (layout(&bases, 16, 16), layout(&bases, 16, 16));
    // A buffer big enough for 4 descriptors, whose start also holds the ids.
    let mut buf = vec![0u64; 12];
    let p = buf.as_mut_ptr();
    let ids = p.cast::<i32>();
    for i in 0..4 {
        // SAFETY: buf holds 24 i32s.
        unsafe { *ids.add(i) = [1, 3, 5, 7][i] };
    }
    let remote = [2, 4, 6, 8];
    let mut n = usize::MAX;
    // out and local_pages share their first bytes.
    // SAFETY: every pointer holds the counts passed.
    let st = unsafe { skv_transfer_descs(&l, ids, &r, remote.as_ptr(), 4, p.cast(), 4, &mut n) };
    assert_eq!(status_name(code(st)), "INVALID_ARG", "{}", last_error());
    assert!(last_error().contains("overlap"), "{}", last_error());
    assert_eq!(n, usize::MAX);
    // SAFETY: buf holds 24 i32s.
    assert_eq!(unsafe { std::slice::from_raw_parts(ids, 4) }, [1, 3, 5, 7], "the ids are untouched");
    // out and remote_pages.
    let mut out = [skv_xfer_desc::default(); 4];
    let op = out.as_mut_ptr();
    let rids = op.cast::<i32>();
    for i in 0..4 {
        // SAFETY: out holds 24 bytes' worth of i32s and more.
        unsafe { *rids.add(i) = i as i32 + 1 };
    }
    let local = [1, 2, 3, 4];
    // SAFETY: as above.
    let st = unsafe { skv_transfer_descs(&l, local.as_ptr(), &r, rids, 4, op, 4, &mut n) };
    assert_eq!(status_name(code(st)), "INVALID_ARG", "{}", last_error());
    // out over a layout's bases.
    let mut out = [skv_xfer_desc::default(); 4];
    out[0].local_addr = 0x1000;
    let l2 = skv_kv_layout { region_base: &out[0].local_addr, ..l };
    let op = out.as_mut_ptr();
    // SAFETY: as above.
    let st = unsafe { skv_transfer_descs(&l2, local.as_ptr(), &r, remote.as_ptr(), 4, op, 4, &mut n) };
    assert_eq!(status_name(code(st)), "INVALID_ARG", "{}", last_error());
    // out_len inside out.
    let mut out = [skv_xfer_desc::default(); 4];
    let op = out.as_mut_ptr();
    // SAFETY: out_len points inside out, valid for a usize.
    let st = unsafe { skv_transfer_descs(&l, local.as_ptr(), &r, remote.as_ptr(), 4, op, 4, op.cast()) };
    assert_eq!(status_name(code(st)), "INVALID_ARG", "{}", last_error());
    assert!(last_error().contains("out_len"), "{}", last_error());
    // Inputs may share memory with each other: both sides read the same ids.
    let (st, n, out) = call(&l, &local, &r, &local, 4);
    assert_eq!((status_name(st), n), ("OK", 1));
    assert_eq!((out[0].local_addr, out[0].len), (0x1000 + 16, 64));
}

fn owned_handle() -> *mut skv_cache {
    let cfg = skv_cache_config {
        struct_size: std::mem::size_of::<skv_cache_config>() as u32,
        page_size: 4,
        num_token_slots: 400,
        num_rows: 4,
        max_context_len: 64,
        ..Default::default()
    };
    let mut c = std::ptr::null_mut();
    // SAFETY: valid pointers.
    assert_eq!(code(unsafe { skv_cache_new(&cfg, &mut c) }), OK, "{}", last_error());
    c
}

/// skv_session_fence and skv_session_import refuse outputs that share bytes with the unit (or
/// the import's token and prefix arrays), changing nothing: no fence recorded, no slot.
#[test]
fn a_unit_aliased_by_an_output_is_refused() {
    let c = owned_handle();
    // A move unit: a session of 9 tokens exported with SKV_EXPORT_MOVE.
    let mut r = fresh_req();
    // SAFETY: a live handle and a local req throughout.
    unsafe {
        assert_eq!(code(skv_alloc_row(c, &mut r)), OK);
        assert_eq!(code(skv_alloc_extend(c, &mut r, 9, std::ptr::null_mut())), OK);
        assert_eq!(code(skv_commit(c, &mut r, 9)), OK);
        r.origin_input_len = 9;
        assert_eq!(code(skv_cache_finished_req(c, 1, 0, &mut r, 0)), OK, "{}", last_error());
    }
    let mut buf = vec![0u64; 64];
    let (mut len, mut t) = (0usize, 0u64);
    // SAFETY: buf holds 512 bytes.
    let st = unsafe { skv_session_export(c, 1, 0, SKV_EXPORT_MOVE, buf.as_mut_ptr().cast(), 512, &mut len, &mut t) };
    assert_eq!(code(st), OK, "{}", last_error());
    let unit = buf.as_mut_ptr().cast::<u8>();
    let d = owned_handle();
    // The fence's answer written over the unit's header.
    let before = buf.clone();
    // SAFETY: out_state points inside the unit, valid for an i32.
    let st = unsafe { skv_session_fence(d, unit, len, unit.add(16).cast()) };
    assert_eq!(status_name(code(st)), "INVALID_ARG", "{}", last_error());
    assert!(last_error().contains("overlap"), "{}", last_error());
    assert_eq!(buf, before);
    // The import's outputs over the unit.
    let spec = skv_import {
        struct_size: std::mem::size_of::<skv_import>() as u32,
        flags: 0,
        session_id: 1,
        branch_id: 0,
        row: -1,
        n_prefix: 0,
        prefix_indices: std::ptr::null(),
        lock_node: 0,
        lock_receipt: 0,
        aux_state: -1,
        aux_track: [-1, -1],
        tokens: std::ptr::null(),
        n_tokens: 0,
    };
    let (mut n, mut ti) = (0usize, 0u64);
    let mut out = [0i32; 8];
    // SAFETY: out_pages points inside the unit (8 values past its 104-byte header are in buf).
    let st = unsafe { skv_session_import(d, &spec, unit, len, unit.add(104).cast(), 8, &mut n, &mut ti) };
    assert_eq!(status_name(code(st)), "INVALID_ARG", "{}", last_error());
    // SAFETY: ticket points inside the unit.
    let st = unsafe { skv_session_import(d, &spec, unit, len, out.as_mut_ptr(), 8, &mut n, unit.add(40).cast()) };
    assert_eq!(status_name(code(st)), "INVALID_ARG", "{}", last_error());
    // The tokens under out_pages.
    let toks = [5i32; 9];
    let spec2 = skv_import { tokens: out.as_ptr(), n_tokens: 8, ..spec };
    // SAFETY: tokens and out_pages are the same 8 values.
    let st = unsafe { skv_session_import(d, &spec2, unit, len, out.as_mut_ptr(), 8, &mut n, &mut ti) };
    assert_eq!(status_name(code(st)), "INVALID_ARG", "{}", last_error());
    assert_eq!(buf, before, "the unit is untouched");
    // Nothing was recorded: the honest import lands (no fence was taken by a refusal).
    let spec3 = skv_import { tokens: toks.as_ptr(), n_tokens: 9, ..spec };
    // SAFETY: distinct arrays.
    let st = unsafe { skv_session_import(d, &spec3, unit, len, out.as_mut_ptr(), 8, &mut n, &mut ti) };
    assert_eq!(code(st), OK, "{}", last_error());
    assert_eq!(n, 3);
    // SAFETY: live handles, freed once.
    unsafe {
        skv_cache_free(c);
        skv_cache_free(d);
    }
}
