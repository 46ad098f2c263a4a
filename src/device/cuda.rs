//! The device copy over the CUDA driver API, loaded at run time through cudarc: without a
//! driver the calls fail with `SKV_ERR_CUDA`, they do not abort.

use std::ffi::c_void;

use cudarc::driver::{result, sys, DriverError};

use crate::core::{Cache, Error, Result};

fn cuda(call: &'static str) -> impl FnOnce(DriverError) -> Error {
    move |e| Error::Cuda(format!("{call}: {e}"))
}

/// The calling thread's current context while one is needed, restored on drop.
struct Current(Option<sys::CUcontext>);

impl Current {
    fn set(ctx: sys::CUcontext) -> Result<Current> {
        let previous = result::ctx::get_current().map_err(cuda("cuCtxGetCurrent"))?;
        // SAFETY: a context retained by this device copy.
        unsafe { result::ctx::set_current(ctx) }.map_err(cuda("cuCtxSetCurrent"))?;
        Ok(Current(previous))
    }
}

impl Drop for Current {
    fn drop(&mut self) {
        // SAFETY: the context that was current before, or none.
        let _ = unsafe { result::ctx::set_current(self.0.unwrap_or(std::ptr::null_mut())) };
    }
}

/// One handle's device copy: its memory, the device's primary context, and the engine's stream.
pub(crate) struct Device {
    dev: sys::CUdevice,
    ctx: sys::CUcontext,
    stream: sys::CUstream,
    base: sys::CUdeviceptr,
    /// int32 values per row (max_context_len).
    stride: u64,
}

// SAFETY: CUDA driver handles (the retained context, the engine's stream, device memory) may
// be used from any thread; each use makes the context current on the calling thread first.
unsafe impl Send for Device {}

impl Device {
    /// Allocates the copy on device `ordinal`, zeroed at attach (positions past a row's length
    /// are unspecified afterwards), and starts recording row changes; every row in use is owed
    /// to the next sync.
    pub(crate) fn attach(cache: &mut Cache, ordinal: i32, stream: *mut c_void) -> Result<Device> {
        cache.require_owned()?;
        if ordinal < 0 {
            return Err(Error::InvalidArg(format!("device_ordinal {ordinal} < 0")));
        }
        // SAFETY: only probes whether the driver library can be loaded.
        if !unsafe { sys::is_culib_present() } {
            return Err(Error::Cuda("no CUDA driver: libcuda.so.1 cannot be loaded on this machine".into()));
        }
        result::init().map_err(cuda("cuInit"))?;
        let dev = result::device::get(ordinal).map_err(cuda("cuDeviceGet"))?;
        // SAFETY: a device the driver just named.
        let ctx = unsafe { result::primary_ctx::retain(dev) }.map_err(cuda("cuDevicePrimaryCtxRetain"))?;
        let cfg = *cache.config();
        let stride = cfg.max_context_len as u64;
        let bytes = cfg.num_rows as u64 * stride * 4;
        let mut device = Device { dev, ctx, stream: stream as sys::CUstream, base: 0, stride };
        {
            let _current = Current::set(ctx)?;
            // SAFETY: the retained context is current; the size is the table's.
            device.base = unsafe { result::malloc_sync(bytes as usize) }
                .map_err(|e| Error::Cuda(format!("cuMemAlloc({bytes} bytes): {e}")))?;
            // SAFETY: memory just allocated, on the engine's stream.
            unsafe { result::memset_d8_async(device.base, 0, bytes as usize, device.stream) }
                .map_err(cuda("cuMemsetD8Async"))?;
        }
        cache.track_row_changes()?;
        Ok(device)
    }

    /// Copies the spans of rows mapped anew since the last sync, asynchronously on the
    /// engine's stream; returns the copy's device pointer and its row stride in int32s.
    pub(crate) fn sync(&mut self, cache: &mut Cache) -> Result<(u64, u64)> {
        let _current = Current::set(self.ctx)?;
        let (base, stride, stream) = (self.base, self.stride, self.stream);
        cache.drain_row_changes(|row, start, indices| {
            let at = base + (row as u64 * stride + start as u64) * 4;
            // SAFETY: inside the table (start + len <= max_context_len). The source is
            // pageable host memory: the driver has taken the bytes when the call returns.
            unsafe { result::memcpy_htod_async(at, indices, stream) }.map_err(cuda("cuMemcpyHtoDAsync"))
        })?;
        Ok((base, stride))
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        if let Ok(_current) = Current::set(self.ctx) {
            // SAFETY: the copies queued on the engine's stream finish before the memory goes.
            unsafe {
                let _ = result::stream::synchronize(self.stream);
                let _ = result::free_sync(self.base);
            }
        }
        // SAFETY: the context this copy retained.
        let _ = unsafe { result::primary_ctx::release(self.dev) };
    }
}
