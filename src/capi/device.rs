//! Device page table: a GPU copy of owned mode's req_to_token (feature `cuda`).

use std::ffi::{c_int, c_void};

use super::{arg, lock, out_mut, skv_cache, skv_status};
use crate::core::Error;
use crate::device::Device;

/// Owned mode, feature `cuda`: allocates a device copy of req_to_token (int32, num_rows x
/// max_context_len) on device `device_ordinal`, zeroed, for the engine's stream `cu_stream` (a
/// CUstream; NULL: the legacy default stream). skv_device_sync fills it; it is freed with the
/// handle (docs/device.md).
///
/// The caller must pass cu_stream as NULL or a CUstream of that device's primary context,
/// live while the handle lives.
///
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG, SKV_ERR_OUT_OF_MEMORY, SKV_ERR_STATE,
///          SKV_ERR_CUDA, SKV_ERR_UNSUPPORTED
#[no_mangle]
pub unsafe extern "C" fn skv_device_attach(
    c: *mut skv_cache,
    device_ordinal: c_int,
    cu_stream: *mut c_void,
) -> skv_status {
    export!(
        skv_device_attach,
        c,
        |t| t.num("device_ordinal", device_ordinal),
        // SAFETY: c is NULL or a live handle (the contract above); arg and lock refuse NULL.
        || unsafe {
            let handle = arg(c.cast_const(), "cache")?;
            let mut cache = lock(c)?;
            let mut device = handle.device.lock().map_err(|_| Error::Internal("device lock poisoned".into()))?;
            if device.is_some() {
                return Err(Error::State("a device copy is already attached".into()));
            }
            *device = Some(Device::attach(&mut cache, device_ordinal, cu_stream)?);
            Ok(())
        },
        |_| {},
    )
}

/// Makes the device copy equal to the host rows at every mapped position, copying only the spans
/// mapped anew since the last sync, asynchronously on the attached stream. Writes the copy's
/// device pointer and its row stride in int32 values, max_context_len (docs/device.md).
///
/// refuses: SKV_ERR_NULL_ARG, SKV_ERR_INVALID_ARG, SKV_ERR_STATE, SKV_ERR_CUDA, SKV_ERR_UNSUPPORTED
#[no_mangle]
pub unsafe extern "C" fn skv_device_sync(
    c: *mut skv_cache,
    out_device_ptr: *mut u64,
    out_row_stride: *mut u64,
) -> skv_status {
    export!(
        skv_device_sync,
        c,
        |_| {},
        // SAFETY: c, out_device_ptr and out_row_stride are NULL or valid (the contract above); arg,
        // out_mut and lock refuse NULL.
        || unsafe {
            let handle = arg(c.cast_const(), "cache")?;
            let ptr = out_mut(out_device_ptr, "out_device_ptr")?;
            let stride = out_mut(out_row_stride, "out_row_stride")?;
            let mut cache = lock(c)?;
            cache.require_owned()?;
            let mut device = handle.device.lock().map_err(|_| Error::Internal("device lock poisoned".into()))?;
            let Some(device) = device.as_mut() else {
                return Err(match cfg!(feature = "cuda") {
                    true => Error::State("no device copy: call skv_device_attach first".into()),
                    false => Error::Unsupported("libskv was built without the cuda feature".into()),
                });
            };
            (*ptr, *stride) = device.sync(&mut cache)?;
            Ok(())
        },
        |_| {},
    )
}
