//! Every export that takes a handle, called with honest arguments on a given handle: the
//! fuzzer passes NULL (SKV_ERR_NULL_ARG) or, from inside a callback, a handle (SKV_ERR_STATE:
//! no libskv call may be made from a callback), so each reaches those two refusals.

use std::ptr::{null, null_mut};

use skv::*;

/// The exports `call_export` makes, by index.
pub const HANDLE_EXPORTS: [&str; 50] = [
    "skv_cache_set_trace",
    "skv_match_prefix",
    "skv_cache_finished_req",
    "skv_checkpoint",
    "skv_release_session",
    "skv_release_branch",
    "skv_free_aligned",
    "skv_trim_overshoot",
    "skv_free_tail",
    "skv_session_held",
    "skv_alloc_row",
    "skv_alloc_extend",
    "skv_commit",
    "skv_free_req",
    "skv_pool_alloc",
    "skv_pool_free",
    "skv_page_refs",
    "skv_map_prefix",
    "skv_publish_prefix",
    "skv_row_indices",
    "skv_cache_stats",
    "skv_cache_check",
    "skv_cache_set_hooks",
    "skv_build_flashinfer",
    "skv_device_attach",
    "skv_device_sync",
    "skv_alloc_extend_batch",
    "skv_commit_batch",
    "skv_session_usage",
    "skv_branch_usage",
    "skv_idle_sessions",
    "skv_admission_pages",
    "skv_hand_back",
    "skv_swa_evict",
    "skv_row_swa_indices",
    "skv_build_flashinfer_swa",
    "skv_events_enable",
    "skv_events_session",
    "skv_events_tokens",
    "skv_events_drain",
    "skv_match_prefix_tier",
    "skv_ticket_done",
    "skv_session_park",
    "skv_tier_step",
    "skv_tier_evict",
    "skv_session_where",
    "skv_cache_tier_stats",
    "skv_session_export",
    "skv_session_import",
    "skv_session_fence",
];

/// `HANDLE_EXPORTS[k]` on handle `c`, every other argument honest: a fresh req, outputs and
/// arrays of the lengths passed. With `c` NULL, or live while one of libskv's callbacks runs
/// on this thread, it changes nothing.
pub fn call_export(k: usize, c: *mut skv_cache) -> skv_status {
    let mut r = skv_req::default();
    let mut reqs = [skv_req::default(); 2];
    let (mut i32s, mut u32s, mut u64s, mut n) = ([0i32; 8], [1u32; 8], [0u64; 8], 0usize);
    let (mut m, mut h) = (skv_match { hit: 0, prefix_len: 0 }, 0u32);
    let mut tm = skv_tier_match { struct_size: std::mem::size_of::<skv_tier_match>() as u32, ..Default::default() };
    let mut ev = skv_tier_evicted { struct_size: std::mem::size_of::<skv_tier_evicted>() as u32, ..Default::default() };
    let mut wh = skv_where { struct_size: std::mem::size_of::<skv_where>() as u32, ..Default::default() };
    let imp = skv_import {
        struct_size: std::mem::size_of::<skv_import>() as u32,
        flags: 0,
        session_id: 0,
        branch_id: 0,
        row: -1,
        n_prefix: 0,
        prefix_indices: null(),
        lock_node: 0,
        lock_receipt: 0,
        aux_state: -1,
        aux_track: [-1, -1],
        tokens: null(),
        n_tokens: 0,
    };
    let mut ts = skv_tier_stats { struct_size: std::mem::size_of::<skv_tier_stats>() as u32, ..Default::default() };
    // SAFETY: these are plain integers: all zero is a valid value.
    let (mut held, mut stats, mut rep, mut usage, mut adm) = unsafe {
        (
            std::mem::zeroed::<skv_held>(),
            std::mem::zeroed::<skv_stats>(),
            std::mem::zeroed::<skv_check_report>(),
            std::mem::zeroed::<skv_usage>(),
            std::mem::zeroed::<skv_admission>(),
        )
    };
    let hooks = skv_engine_hooks {
        struct_size: std::mem::size_of::<skv_engine_hooks>() as u32,
        dec_lock_ref: None,
        free_aux: None,
        ..Default::default()
    };
    let events = skv_events_config {
        struct_size: std::mem::size_of::<skv_events_config>() as u32,
        data_parallel_rank: 0,
        flags: 0,
        max_batches: 0,
        endpoint: null(),
        topic: null(),
    };
    let (rp, ip, up) = (&mut r as *mut skv_req, i32s.as_mut_ptr(), u32s.as_mut_ptr());
    let (ip2, up2) = (u64s.as_mut_ptr(), u64s[4..].as_mut_ptr());
    let (two, u2) = (reqs.as_mut_ptr(), [1u32, 1]);
    // SAFETY: c is NULL or a live handle; every pointer is a local with room for the length
    // passed with it (arrays of 8 values, 2 reqs; four indices each past the first four).
    unsafe {
        match k {
            0 => skv_cache_set_trace(c, null()),
            1 => skv_match_prefix(c, 0, 0, rp, 0, 0, &mut m),
            2 => skv_cache_finished_req(c, 0, 0, rp, 1),
            3 => skv_checkpoint(c, 0, 0, rp, &mut h),
            4 => skv_release_session(c, 0),
            5 => skv_release_branch(c, 0, 0),
            6 => skv_free_aligned(c, 0, 0, 0),
            7 => skv_trim_overshoot(c, rp, 0),
            8 => skv_free_tail(c, rp, 0),
            9 => skv_session_held(c, ip, 1, &mut held),
            10 => skv_alloc_row(c, rp),
            11 => skv_alloc_extend(c, rp, 1, ip),
            12 => skv_commit(c, rp, 0),
            13 => skv_free_req(c, rp),
            14 => skv_pool_alloc(c, 1, ip),
            15 => skv_pool_free(c, ip, 1),
            16 => skv_page_refs(c, ip, 4, up),
            17 => skv_map_prefix(c, rp, ip, 1),
            18 => skv_publish_prefix(c, rp, 0),
            19 => skv_row_indices(c, 0, 0, 1, ip),
            20 => skv_cache_stats(c, &mut stats),
            21 => skv_cache_check(c, &mut rep),
            22 => skv_cache_set_hooks(c, &hooks, null_mut()),
            23 => skv_build_flashinfer(c, ip, 1, ip.add(2), ip.add(4), ip.add(6), 1, &mut n),
            24 => skv_device_attach(c, 0, null_mut()),
            25 => skv_device_sync(c, ip2, up2),
            26 => skv_alloc_extend_batch(c, two, 2, u2.as_ptr(), ip, 2),
            27 => skv_commit_batch(c, two, 2, u2.as_ptr()),
            28 => skv_session_usage(c, 0, &mut usage),
            29 => skv_branch_usage(c, 0, 0, &mut usage),
            30 => skv_idle_sessions(c, ip2, up2, 2, &mut n),
            31 => skv_admission_pages(c, 0, 0, 0, 1, &mut adm),
            32 => skv_hand_back(c, 0, 0, rp),
            33 => skv_swa_evict(c, rp, 0, 1, 0, -1, 0, up),
            34 => skv_row_swa_indices(c, 0, 0, 1, ip),
            35 => skv_build_flashinfer_swa(c, ip, 1, ip.add(2), ip.add(4), ip.add(6), 1, &mut n),
            36 => skv_events_enable(c, &events),
            37 => skv_events_session(c, 0, null(), null()),
            38 => skv_events_tokens(c, 0, 0, rp, 0, ip, 1),
            39 => skv_events_drain(c, u64s.as_mut_ptr().cast(), 16, &mut n, ip2.add(2)),
            40 => skv_match_prefix_tier(c, 0, 0, rp, 0, 0, &mut tm),
            41 => skv_ticket_done(c, 1, 0),
            42 => skv_session_park(c, 0, 0, ip2),
            43 => skv_tier_step(c, ip2, up2),
            44 => skv_tier_evict(c, 1, 0, &mut ev),
            45 => skv_session_where(c, 0, 0, &mut wh),
            46 => skv_cache_tier_stats(c, &mut ts),
            47 => skv_session_export(c, 0, 0, 0, null_mut(), 0, &mut n, ip2),
            48 => skv_session_import(c, &imp, u64s.as_ptr().cast(), 8, ip, 8, &mut n, up2),
            _ => skv_session_fence(c, u64s.as_ptr().cast(), 8, ip),
        }
    }
}
