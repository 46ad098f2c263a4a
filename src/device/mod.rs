//! The device copy of `req_to_token` (feature `cuda`): an int32 array of `num_rows x
//! max_context_len` in GPU memory, the layout attention kernels read, brought up to date by
//! `skv_device_sync` with only the spans of rows mapped anew since the last sync. Owned mode
//! only: in external mode the engine owns its table.

#[cfg(feature = "cuda")]
mod cuda;
#[cfg(feature = "cuda")]
pub(crate) use cuda::Device;

#[cfg(not(feature = "cuda"))]
mod absent {
    use std::ffi::c_void;

    use crate::core::{Cache, Error, Result};

    /// A build without the `cuda` feature has no device copy.
    pub(crate) enum Device {}

    impl Device {
        pub(crate) fn attach(cache: &mut Cache, _: i32, _: *mut c_void) -> Result<Device> {
            // The mode is the first reason: no build gives an external handle a device copy.
            cache.require_owned()?;
            Err(Error::Unsupported("libskv was built without the cuda feature".into()))
        }

        pub(crate) fn sync(&mut self, _: &mut Cache) -> Result<(u64, u64)> {
            match *self {}
        }
    }
}
#[cfg(not(feature = "cuda"))]
pub(crate) use absent::Device;
