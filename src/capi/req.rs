//! The request record under its C name, `skv_req` (core's `Req`), and the calls that run an
//! operation on one caller req.

use super::{lock, out_mut, skv_cache, skv_status, traced};
use crate::core::Req;

/// The request record: core's `Req`, one `#[repr(C)]` definition under its C name (cbindgen.toml
/// renames it; the batch calls work on the caller's array in place).
pub use crate::core::Req as skv_req;

/// Runs a core operation on a copy of `*req`, writing it back when the call completes
/// (also when a free callback failed part-way: the state advanced).
///
/// # Safety
/// `cache` must be NULL or a live handle, `req` NULL or a valid skv_req.
pub(crate) unsafe fn on_req<T>(
    cache: *mut skv_cache,
    req: *mut Req,
    op: impl FnOnce(&mut crate::core::Cache, &mut Req) -> crate::core::Result<T>,
    write: impl FnOnce(T),
) -> crate::core::Result<()> {
    // SAFETY: NULL or valid, by this function's contract.
    let req = unsafe { out_mut(req, "req") }?;
    // SAFETY: NULL or a live handle, by this function's contract.
    let mut c = unsafe { lock(cache) }?;
    let mut r = *req;
    let value = op(&mut c, &mut r)?;
    *req = r;
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
    req: *mut Req,
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

/// Sets a req to hold nothing: row -1, row_generation 0, lengths 0, finished_len -1, lock 0,
/// aux_state -1, both aux_track entries -1.
///
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG
#[no_mangle]
pub unsafe extern "C" fn skv_req_init(req: *mut Req) -> skv_status {
    export!(skv_req_init, || {
        // SAFETY: req is NULL or valid (the contract above); out_mut refuses NULL.
        let req = unsafe { out_mut(req, "req") }?;
        // A whole-struct write leaves no byte indeterminate: `Req` has no padding (asserted
        // beside its field table).
        *req = skv_req::default();
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::skv_req;

    /// The fields of `typedef struct skv_req` in the committed header, in order.
    fn header_fields() -> Vec<String> {
        let h = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/include/skv.h"));
        let body = h.split_once("typedef struct skv_req {").unwrap().1.split_once("} skv_req;").unwrap().0;
        let mut in_comment = false;
        let mut names = Vec::new();
        for line in body.lines().map(str::trim) {
            if line.starts_with("/*") {
                in_comment = true;
            }
            if !in_comment && line.ends_with(';') {
                let decl = line.trim_end_matches(';').split('[').next().unwrap();
                names.push(decl.rsplit(' ').next().unwrap().to_string());
            }
            if line.ends_with("*/") {
                in_comment = false;
            }
        }
        names
    }

    #[test]
    fn the_field_table_is_the_headers_fields_in_order() {
        let table: Vec<&str> = skv_req::FIELDS.iter().map(|f| f.name).collect();
        assert_eq!(table, header_fields());
        assert_eq!(table.len(), 14);
    }
}
