//! The dlopen entry point: one `dlsym("skv_get_api")` gives an engine every function of the
//! library through a table, so it needs no link-time dependency on libskv.

use std::ffi::{c_char, c_int, c_void};
use std::ptr;

use super::{
    clear_last_error, set_last_error, skv_abi_version, skv_alloc_extend, skv_alloc_extend_batch, skv_alloc_row,
    skv_build_flashinfer, skv_cache, skv_cache_check, skv_cache_config, skv_cache_finished_req, skv_cache_free,
    skv_cache_new, skv_cache_new_external, skv_cache_set_hooks, skv_cache_set_trace, skv_cache_stats, skv_check_report,
    skv_checkpoint, skv_commit, skv_commit_batch, skv_device_attach, skv_device_sync, skv_engine_hooks,
    skv_free_aligned, skv_free_req, skv_free_tail, skv_held, skv_last_error, skv_map_prefix, skv_match,
    skv_match_prefix, skv_page_refs, skv_pool_alloc, skv_pool_free, skv_pool_ops, skv_publish_prefix,
    skv_release_branch, skv_release_session, skv_req, skv_req_init, skv_row_indices, skv_session_held, skv_stats,
    skv_status, skv_status_str, skv_trim_overshoot, skv_version, StatusArg, SKV_ABI_VERSION,
};

/// Every exported function of ABI version 1, in the order of the C API's sections; each
/// field is named like its function without the skv_ prefix (abi_version_fn is
/// skv_abi_version, the plain name being this table's own version field). Append-only: a
/// function joins the end of the table when it joins the library, nothing is removed or
/// reordered, and struct_size tells a caller how far the table it was given reaches.
#[repr(C)]
pub struct skv_api_v1 {
    /// sizeof(skv_api_v1) of the library that made the table: a field lies inside the
    /// table when offsetof(field) + sizeof(field) <= struct_size.
    pub struct_size: u32,
    /// The ABI version the table implements (SKV_ABI_VERSION).
    pub abi_version: u32,
    /// Same as skv_status_str.
    pub status_str: Option<extern "C" fn(s: StatusArg) -> *const c_char>,
    /// Same as skv_last_error.
    pub last_error: Option<extern "C" fn() -> *const c_char>,
    /// Same as skv_abi_version.
    pub abi_version_fn: Option<extern "C" fn() -> u32>,
    /// Same as skv_version.
    pub version: Option<extern "C" fn() -> *const c_char>,
    /// Same as skv_cache_new.
    pub cache_new: Option<unsafe extern "C" fn(cfg: *const skv_cache_config, out: *mut *mut skv_cache) -> skv_status>,
    /// Same as skv_cache_new_external.
    pub cache_new_external: Option<
        unsafe extern "C" fn(
            cfg: *const skv_cache_config,
            ops: *const skv_pool_ops,
            user_data: *mut c_void,
            out: *mut *mut skv_cache,
        ) -> skv_status,
    >,
    /// Same as skv_cache_free.
    pub cache_free: Option<unsafe extern "C" fn(cache: *mut skv_cache)>,
    /// Same as skv_req_init.
    pub req_init: Option<unsafe extern "C" fn(req: *mut skv_req) -> skv_status>,
    /// Same as skv_match_prefix.
    pub match_prefix: Option<
        unsafe extern "C" fn(
            c: *mut skv_cache,
            session_id: u64,
            branch_id: u64,
            req: *mut skv_req,
            key_len: u32,
            pre_aborted: u32,
            out: *mut skv_match,
        ) -> skv_status,
    >,
    /// Same as skv_cache_finished_req.
    pub cache_finished_req: Option<
        unsafe extern "C" fn(
            c: *mut skv_cache,
            session_id: u64,
            branch_id: u64,
            req: *mut skv_req,
            aborted: u32,
        ) -> skv_status,
    >,
    /// Same as skv_checkpoint.
    pub checkpoint: Option<
        unsafe extern "C" fn(
            c: *mut skv_cache,
            session_id: u64,
            branch_id: u64,
            req: *const skv_req,
            handled: *mut u32,
        ) -> skv_status,
    >,
    /// Same as skv_release_session.
    pub release_session: Option<unsafe extern "C" fn(c: *mut skv_cache, session_id: u64) -> skv_status>,
    /// Same as skv_release_branch.
    pub release_branch: Option<unsafe extern "C" fn(c: *mut skv_cache, session_id: u64, branch_id: u64) -> skv_status>,
    /// Same as skv_free_aligned.
    pub free_aligned: Option<unsafe extern "C" fn(c: *mut skv_cache, row: i32, target: u32, end: u32) -> skv_status>,
    /// Same as skv_trim_overshoot.
    pub trim_overshoot:
        Option<unsafe extern "C" fn(c: *mut skv_cache, req: *mut skv_req, finished_len: u32) -> skv_status>,
    /// Same as skv_free_tail.
    pub free_tail: Option<unsafe extern "C" fn(c: *mut skv_cache, req: *mut skv_req, prefix_len: u32) -> skv_status>,
    /// Same as skv_session_held.
    pub session_held: Option<
        unsafe extern "C" fn(
            c: *mut skv_cache,
            active_rows: *const i32,
            n_active: usize,
            out: *mut skv_held,
        ) -> skv_status,
    >,
    /// Same as skv_alloc_row.
    pub alloc_row: Option<unsafe extern "C" fn(c: *mut skv_cache, req: *mut skv_req) -> skv_status>,
    /// Same as skv_alloc_extend.
    pub alloc_extend: Option<
        unsafe extern "C" fn(c: *mut skv_cache, req: *mut skv_req, n_tokens: u32, out_loc: *mut i32) -> skv_status,
    >,
    /// Same as skv_commit.
    pub commit: Option<unsafe extern "C" fn(c: *mut skv_cache, req: *mut skv_req, n_tokens: u32) -> skv_status>,
    /// Same as skv_free_req.
    pub free_req: Option<unsafe extern "C" fn(c: *mut skv_cache, req: *mut skv_req) -> skv_status>,
    /// Same as skv_pool_alloc.
    pub pool_alloc: Option<unsafe extern "C" fn(c: *mut skv_cache, n_tokens: u32, out_indices: *mut i32) -> skv_status>,
    /// Same as skv_pool_free.
    pub pool_free: Option<unsafe extern "C" fn(c: *mut skv_cache, indices: *const i32, n: usize) -> skv_status>,
    /// Same as skv_page_refs.
    pub page_refs: Option<
        unsafe extern "C" fn(c: *mut skv_cache, indices: *const i32, n: usize, out_counts: *mut u32) -> skv_status,
    >,
    /// Same as skv_map_prefix.
    pub map_prefix: Option<
        unsafe extern "C" fn(c: *mut skv_cache, req: *mut skv_req, indices: *const i32, n_tokens: u32) -> skv_status,
    >,
    /// Same as skv_publish_prefix.
    pub publish_prefix:
        Option<unsafe extern "C" fn(c: *mut skv_cache, req: *mut skv_req, new_protected_len: u32) -> skv_status>,
    /// Same as skv_row_indices.
    pub row_indices:
        Option<unsafe extern "C" fn(c: *mut skv_cache, row: i32, start: u32, end: u32, out: *mut i32) -> skv_status>,
    /// Same as skv_cache_stats.
    pub cache_stats: Option<unsafe extern "C" fn(c: *mut skv_cache, out: *mut skv_stats) -> skv_status>,
    /// Same as skv_cache_check.
    pub cache_check: Option<unsafe extern "C" fn(c: *mut skv_cache, out: *mut skv_check_report) -> skv_status>,
    /// Same as skv_cache_set_hooks.
    pub cache_set_hooks: Option<
        unsafe extern "C" fn(c: *mut skv_cache, hooks: *const skv_engine_hooks, user_data: *mut c_void) -> skv_status,
    >,
    /// Same as skv_build_flashinfer.
    pub build_flashinfer: Option<
        unsafe extern "C" fn(
            c: *mut skv_cache,
            rows: *const i32,
            n: usize,
            kv_indptr: *mut i32,
            kv_indices: *mut i32,
            kv_last_page_len: *mut i32,
            cap: usize,
            needed: *mut usize,
        ) -> skv_status,
    >,
    /// Same as skv_cache_set_trace.
    pub cache_set_trace: Option<unsafe extern "C" fn(c: *mut skv_cache, path: *const c_char) -> skv_status>,
    /// Same as skv_get_api.
    pub get_api: Option<extern "C" fn(abi_version: u32) -> *const skv_api_v1>,
    /// Same as skv_device_attach.
    pub device_attach:
        Option<unsafe extern "C" fn(c: *mut skv_cache, device_ordinal: c_int, cu_stream: *mut c_void) -> skv_status>,
    /// Same as skv_device_sync.
    pub device_sync: Option<
        unsafe extern "C" fn(c: *mut skv_cache, out_device_ptr: *mut u64, out_row_stride: *mut u64) -> skv_status,
    >,
    /// Same as skv_alloc_extend_batch.
    pub alloc_extend_batch: Option<
        unsafe extern "C" fn(
            c: *mut skv_cache,
            reqs: *mut skv_req,
            n: usize,
            n_tokens: *const u32,
            out_loc: *mut i32,
            out_cap: usize,
        ) -> skv_status,
    >,
    /// Same as skv_commit_batch.
    pub commit_batch: Option<
        unsafe extern "C" fn(c: *mut skv_cache, reqs: *mut skv_req, n: usize, n_tokens: *const u32) -> skv_status,
    >,
}

static API_V1: skv_api_v1 = skv_api_v1 {
    struct_size: std::mem::size_of::<skv_api_v1>() as u32,
    abi_version: SKV_ABI_VERSION,
    status_str: Some(skv_status_str),
    last_error: Some(skv_last_error),
    abi_version_fn: Some(skv_abi_version),
    version: Some(skv_version),
    cache_new: Some(skv_cache_new),
    cache_new_external: Some(skv_cache_new_external),
    cache_free: Some(skv_cache_free),
    req_init: Some(skv_req_init),
    match_prefix: Some(skv_match_prefix),
    cache_finished_req: Some(skv_cache_finished_req),
    checkpoint: Some(skv_checkpoint),
    release_session: Some(skv_release_session),
    release_branch: Some(skv_release_branch),
    free_aligned: Some(skv_free_aligned),
    trim_overshoot: Some(skv_trim_overshoot),
    free_tail: Some(skv_free_tail),
    session_held: Some(skv_session_held),
    alloc_row: Some(skv_alloc_row),
    alloc_extend: Some(skv_alloc_extend),
    commit: Some(skv_commit),
    free_req: Some(skv_free_req),
    pool_alloc: Some(skv_pool_alloc),
    pool_free: Some(skv_pool_free),
    page_refs: Some(skv_page_refs),
    map_prefix: Some(skv_map_prefix),
    publish_prefix: Some(skv_publish_prefix),
    row_indices: Some(skv_row_indices),
    cache_stats: Some(skv_cache_stats),
    cache_check: Some(skv_cache_check),
    cache_set_hooks: Some(skv_cache_set_hooks),
    build_flashinfer: Some(skv_build_flashinfer),
    cache_set_trace: Some(skv_cache_set_trace),
    get_api: Some(skv_get_api),
    device_attach: Some(skv_device_attach),
    device_sync: Some(skv_device_sync),
    alloc_extend_batch: Some(skv_alloc_extend_batch),
    commit_batch: Some(skv_commit_batch),
};

/// The function table of ABI version `abi_version`, or NULL when this library does not
/// implement that version (skv_last_error() then says which it does). The table is static:
/// valid until the library is unloaded, never freed by the caller.
#[no_mangle]
pub extern "C" fn skv_get_api(abi_version: u32) -> *const skv_api_v1 {
    if abi_version == SKV_ABI_VERSION {
        clear_last_error();
        &API_V1
    } else {
        set_last_error(
            "skv_get_api",
            &format!("abi_version {abi_version} is not supported (this library implements {SKV_ABI_VERSION})"),
        );
        ptr::null()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_version_one_has_a_table() {
        let api = skv_get_api(SKV_ABI_VERSION);
        assert!(!api.is_null());
        // SAFETY: a non-NULL result points at the static table.
        let api = unsafe { &*api };
        assert_eq!(api.struct_size as usize, std::mem::size_of::<skv_api_v1>());
        assert_eq!(api.abi_version, SKV_ABI_VERSION);
        assert_eq!((api.abi_version_fn.unwrap())(), SKV_ABI_VERSION);
        assert!(skv_get_api(SKV_ABI_VERSION - 1).is_null());
        assert!(skv_get_api(0).is_null());
        assert!(skv_get_api(999).is_null());
        // SAFETY: skv_last_error returns a NUL-terminated thread-local string.
        let msg = unsafe { std::ffi::CStr::from_ptr(skv_last_error()) }.to_string_lossy().into_owned();
        assert!(msg.starts_with("skv_get_api: abi_version 999"), "{msg}");
    }

    /// The table is append-only: these offsets are what engines compiled against this ABI
    /// read. A new function goes after the last field, never between.
    #[test]
    fn the_table_layout_is_pinned() {
        use std::mem::offset_of;
        let pinned = [
            (0, offset_of!(skv_api_v1, struct_size)),
            (4, offset_of!(skv_api_v1, abi_version)),
            (8, offset_of!(skv_api_v1, status_str)),
            (16, offset_of!(skv_api_v1, last_error)),
            (24, offset_of!(skv_api_v1, abi_version_fn)),
            (32, offset_of!(skv_api_v1, version)),
            (40, offset_of!(skv_api_v1, cache_new)),
            (48, offset_of!(skv_api_v1, cache_new_external)),
            (56, offset_of!(skv_api_v1, cache_free)),
            (64, offset_of!(skv_api_v1, req_init)),
            (72, offset_of!(skv_api_v1, match_prefix)),
            (80, offset_of!(skv_api_v1, cache_finished_req)),
            (88, offset_of!(skv_api_v1, checkpoint)),
            (96, offset_of!(skv_api_v1, release_session)),
            (104, offset_of!(skv_api_v1, release_branch)),
            (112, offset_of!(skv_api_v1, free_aligned)),
            (120, offset_of!(skv_api_v1, trim_overshoot)),
            (128, offset_of!(skv_api_v1, free_tail)),
            (136, offset_of!(skv_api_v1, session_held)),
            (144, offset_of!(skv_api_v1, alloc_row)),
            (152, offset_of!(skv_api_v1, alloc_extend)),
            (160, offset_of!(skv_api_v1, commit)),
            (168, offset_of!(skv_api_v1, free_req)),
            (176, offset_of!(skv_api_v1, pool_alloc)),
            (184, offset_of!(skv_api_v1, pool_free)),
            (192, offset_of!(skv_api_v1, page_refs)),
            (200, offset_of!(skv_api_v1, map_prefix)),
            (208, offset_of!(skv_api_v1, publish_prefix)),
            (216, offset_of!(skv_api_v1, row_indices)),
            (224, offset_of!(skv_api_v1, cache_stats)),
            (232, offset_of!(skv_api_v1, cache_check)),
            (240, offset_of!(skv_api_v1, cache_set_hooks)),
            (248, offset_of!(skv_api_v1, build_flashinfer)),
            (256, offset_of!(skv_api_v1, cache_set_trace)),
            (264, offset_of!(skv_api_v1, get_api)),
            (272, offset_of!(skv_api_v1, device_attach)),
            (280, offset_of!(skv_api_v1, device_sync)),
            (288, offset_of!(skv_api_v1, alloc_extend_batch)),
            (296, offset_of!(skv_api_v1, commit_batch)),
        ];
        for (want, got) in pinned {
            assert_eq!(got, want);
        }
        assert_eq!(std::mem::size_of::<skv_api_v1>(), 304);
    }
}
