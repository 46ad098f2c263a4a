//! The dlopen entry point: one `dlsym("skv_get_api")` gives an engine every function of the
//! library through a table, so it needs no link-time dependency on libskv.

use std::ffi::{c_char, c_int, c_void};
use std::ptr;

#[allow(unused_imports)] // the generated table names whatever the exports take
use super::*;
use crate::core::Req;

include!(concat!(env!("OUT_DIR"), "/api_table.rs"));

/// The function table of ABI version `abi_version`, or NULL when this library does not
/// implement that version (skv_last_error() then says which it does). The table is static:
/// valid until the library is unloaded, never freed by the caller.
#[no_mangle]
pub extern "C" fn skv_get_api(abi_version: u32) -> *const skv_api {
    if abi_version == SKV_ABI_VERSION {
        clear_last_error();
        &API
    } else {
        set_last_error(
            stringify!(skv_get_api),
            &format!("abi_version {abi_version} is not supported (this library implements {SKV_ABI_VERSION})"),
        );
        ptr::null()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_current_version_has_a_table() {
        let api = skv_get_api(SKV_ABI_VERSION);
        assert!(!api.is_null());
        // SAFETY: a non-NULL result points at the static table.
        let api = unsafe { &*api };
        assert_eq!(api.struct_size as usize, std::mem::size_of::<skv_api>());
        assert_eq!(api.abi_version, SKV_ABI_VERSION);
        assert_eq!((api.abi_version_fn.unwrap())(), SKV_ABI_VERSION);
        assert!(skv_get_api(SKV_ABI_VERSION - 1).is_null());
        assert!(skv_get_api(0).is_null());
        assert!(skv_get_api(999).is_null());
        // SAFETY: skv_last_error returns a NUL-terminated thread-local string.
        let msg = unsafe { std::ffi::CStr::from_ptr(skv_last_error()) }.to_string_lossy().into_owned();
        assert!(msg.starts_with("skv_get_api: abi_version 999"), "{msg}");
    }
}
