//! The C ABI: thin glue over `core`, one file per section of `include/skv.h`. Each export
//! checks its pointers, converts, calls the model and maps the error; `guard` is the one
//! panic boundary every fallible export goes through.

#![allow(non_camel_case_types)]

mod api;
mod cache;
mod device;
mod owned;
mod session;
mod status;
mod trace;

use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::MutexGuard;

pub use api::*;
pub use cache::*;
pub use device::*;
pub use owned::*;
pub use session::*;
pub use status::*;
pub(crate) use trace::traced;

use crate::core::{Cache, Error, Result};

/// Runs one export's body: panics become `SKV_ERR_INTERNAL`, errors set the thread's last
/// error message (prefixed with the function name), success clears it.
pub(crate) fn guard(function: &'static str, body: impl FnOnce() -> Result<()>) -> skv_status {
    let outcome = catch_unwind(AssertUnwindSafe(body)).unwrap_or_else(|panic| {
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".into());
        Err(Error::Internal(format!("internal error (a libskv bug): {what}")))
    });
    match outcome {
        Ok(()) => {
            clear_last_error();
            skv_status::SKV_OK
        }
        Err(e) => {
            set_last_error(function, &e.to_string());
            status_of(&e)
        }
    }
}

/// A required pointer as a reference.
pub(crate) unsafe fn arg<'a, T>(p: *const T, name: &str) -> Result<&'a T> {
    p.as_ref().ok_or_else(|| Error::NullArg(format!("{name} is NULL")))
}

/// A required out-pointer as a mutable reference.
pub(crate) unsafe fn out_mut<'a, T>(p: *mut T, name: &str) -> Result<&'a mut T> {
    p.as_mut().ok_or_else(|| Error::NullArg(format!("{name} is NULL")))
}

/// A `(pointer, length)` pair as a slice; `(NULL, 0)` is the empty slice. A length no
/// array can have is refused rather than turned into a slice.
pub(crate) unsafe fn slice<'a, T>(p: *const T, n: usize, name: &str) -> Result<&'a [T]> {
    match (p.is_null(), n) {
        (_, 0) => Ok(&[]),
        (true, _) => Err(Error::NullArg(format!("{name} is NULL with {n} elements"))),
        (false, _) => Ok(std::slice::from_raw_parts(p, checked_len::<T>(n, name)?)),
    }
}

pub(crate) unsafe fn slice_mut<'a, T>(p: *mut T, n: usize, name: &str) -> Result<&'a mut [T]> {
    match (p.is_null(), n) {
        (_, 0) => Ok(&mut []),
        (true, _) => Err(Error::NullArg(format!("{name} is NULL with {n} elements"))),
        (false, _) => Ok(std::slice::from_raw_parts_mut(p, checked_len::<T>(n, name)?)),
    }
}

/// The NULL check of a `(pointer, length)` pair alone, for calls that check the handle's
/// mode between the NULL checks and the lengths.
pub(crate) fn nonnull<T>(p: *const T, n: usize, name: &str) -> Result<()> {
    match p.is_null() && n > 0 {
        true => Err(Error::NullArg(format!("{name} is NULL with {n} elements"))),
        false => Ok(()),
    }
}

fn checked_len<T>(n: usize, name: &str) -> Result<usize> {
    match n.checked_mul(std::mem::size_of::<T>()) {
        Some(bytes) if bytes <= isize::MAX as usize => Ok(n),
        _ => Err(Error::InvalidArg(format!("{name}: {n} elements is no array's length"))),
    }
}

thread_local! {
    /// The handles whose engine callbacks this thread is running, innermost last: a
    /// callback calling back into its own handle would otherwise deadlock on the lock.
    static IN_CALLBACK: Cell<[u64; 8]> = const { Cell::new([0; 8]) };
    static CALLBACK_DEPTH: Cell<usize> = const { Cell::new(0) };
}

/// Callback scopes open on all threads. While it is 0 no thread is inside a callback, so a
/// call skips the thread-local check (in a shared library each thread-local access is a
/// `__tls_get_addr` call). A thread inside a callback raised it itself, so it never reads 0.
static CALLBACKS_RUNNING: AtomicUsize = AtomicUsize::new(0);

/// Marks the thread as inside one of handle `id`'s callbacks until dropped.
pub(crate) struct CallbackScope;

impl CallbackScope {
    pub(crate) fn enter(id: u64) -> CallbackScope {
        CALLBACKS_RUNNING.fetch_add(1, Ordering::Relaxed);
        let depth = CALLBACK_DEPTH.get();
        if depth < 8 {
            let mut ids = IN_CALLBACK.get();
            ids[depth] = id;
            IN_CALLBACK.set(ids);
        }
        CALLBACK_DEPTH.set(depth + 1);
        CallbackScope
    }
}

impl Drop for CallbackScope {
    fn drop(&mut self) {
        CALLBACK_DEPTH.set(CALLBACK_DEPTH.get() - 1);
        CALLBACKS_RUNNING.fetch_sub(1, Ordering::Relaxed);
    }
}

pub(crate) fn in_callback_of(id: u64) -> bool {
    if CALLBACKS_RUNNING.load(Ordering::Relaxed) == 0 {
        return false;
    }
    let depth = CALLBACK_DEPTH.get();
    depth > 0 && IN_CALLBACK.get()[..depth.min(8)].contains(&id)
}

/// Locks a handle for one call.
pub(crate) unsafe fn lock<'a>(c: *mut skv_cache) -> Result<MutexGuard<'a, Cache>> {
    let handle = arg(c.cast_const(), "cache")?;
    if in_callback_of(handle.id) {
        return Err(Error::State("called from inside one of this handle's own callbacks".into()));
    }
    handle.inner.lock().map_err(|_| Error::Internal("the handle is unusable after an earlier internal error".into()))
}
