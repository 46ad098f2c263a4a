//! Helpers shared by the property tests: status numbers, `skv_req` field access, page math.
#![allow(dead_code)]

pub mod model;
pub mod refusals;

use skv::*;

pub const OK: u32 = 0;
pub const NULL_ARG: u32 = 1;
pub const INVALID: u32 = 2;
pub const OOM: u32 = 3;
pub const NOT_FOUND: u32 = 4;
pub const STATE: u32 = 5;
pub const CALLBACK: u32 = 6;
pub const UNSUPPORTED: u32 = 8;

pub fn code(s: skv_status) -> u32 {
    s as u32
}

pub fn status_name(s: u32) -> &'static str {
    const NAMES: [&str; 10] = [
        "OK",
        "NULL_ARG",
        "INVALID_ARG",
        "OUT_OF_MEMORY",
        "NOT_FOUND",
        "STATE",
        "CALLBACK",
        "CUDA",
        "UNSUPPORTED",
        "INTERNAL",
    ];
    NAMES.get(s as usize).copied().unwrap_or("?")
}

pub fn last_error() -> String {
    skv::last_error_message()
}

/// A `skv_req` as `skv_req_init` leaves it, checked field by field.
pub fn fresh_req() -> skv_req {
    let mut r = req_from([7; 13]);
    // SAFETY: a valid, exclusive pointer.
    let st = unsafe { skv_req_init(&mut r) };
    assert_eq!(code(st), OK, "skv_req_init");
    assert_eq!(fields(&r), [-1, 0, 0, 0, 0, 0, 0, -1, 0, 0, -1, -1, -1], "skv_req_init result");
    r
}

/// Every field the reference models track, in declaration order, widened to i128 so one array
/// holds them all. row_generation is left out: the models do not track row lifetimes (the
/// stale-copy rule has its own tests); `req_from` leaves it 0 ("not stamped").
pub fn fields(r: &skv_req) -> [i128; 13] {
    [
        r.req_pool_idx as i128,
        r.kv_committed_len as i128,
        r.kv_allocated_len as i128,
        r.cache_protected_len as i128,
        r.swa_evicted_seqlen as i128,
        r.origin_input_len as i128,
        r.output_len as i128,
        r.finished_len as i128,
        r.lock_node as i128,
        r.lock_receipt as i128,
        r.aux_state as i128,
        r.aux_track[0] as i128,
        r.aux_track[1] as i128,
    ]
}

pub fn req_from(f: [i128; 13]) -> skv_req {
    skv_req {
        req_pool_idx: f[0] as i32,
        row_generation: 0,
        kv_committed_len: f[1] as u32,
        kv_allocated_len: f[2] as u32,
        cache_protected_len: f[3] as u32,
        swa_evicted_seqlen: f[4] as u32,
        origin_input_len: f[5] as u32,
        output_len: f[6] as u32,
        finished_len: f[7] as i32,
        lock_node: f[8] as u64,
        lock_receipt: f[9] as u64,
        aux_state: f[10] as i64,
        aux_track: [f[11] as i64, f[12] as i64],
        swa_evict_floor: 0,
    }
}

pub fn show(r: &skv_req) -> String {
    format!(
        "{{row {} com {} alloc {} prot {} swa {} origin {} out {} fin {} lock {}/{} aux {} track {}/{}}}",
        r.req_pool_idx,
        r.kv_committed_len,
        r.kv_allocated_len,
        r.cache_protected_len,
        r.swa_evicted_seqlen,
        r.origin_input_len,
        r.output_len,
        r.finished_len,
        r.lock_node,
        r.lock_receipt,
        r.aux_state,
        r.aux_track[0],
        r.aux_track[1]
    )
}

pub fn same(a: &skv_req, b: &skv_req) -> bool {
    fields(a) == fields(b)
}

pub fn ceil_align(x: u32, ps: u32) -> u64 {
    (x as u64).div_ceil(ps as u64) * ps as u64
}

pub fn floor_align(x: u32, ps: u32) -> u32 {
    x / ps * ps
}

/// The recurrent-state handles of a req in the order libskv frees them, sentinels included.
pub fn aux_handles(r: &skv_req) -> [i64; 3] {
    [r.aux_state, r.aux_track[0], r.aux_track[1]]
}
