//! Status codes, the thread-local last error, and version queries.

use std::cell::{Cell, RefCell};
use std::ffi::{c_char, c_int, CStr};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::core::Error;

// SKV_ABI_VERSION and SKV_SONAME, from the crate version by build.rs's one rule (the header
// gets them as macros from build.rs too).
include!(concat!(env!("OUT_DIR"), "/version.rs"));

/// The result of every libskv call. Numbers are never reused.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub enum skv_status {
    /// Success.
    SKV_OK = 0,
    /// A required pointer was NULL.
    SKV_ERR_NULL_ARG = 1,
    /// A number out of range, or inconsistent skv_req fields.
    SKV_ERR_INVALID_ARG = 2,
    /// Not enough free pages or rows; nothing allocated.
    SKV_ERR_OUT_OF_MEMORY = 3,
    /// Row not in use (a session or branch with no slot is not an error).
    SKV_ERR_NOT_FOUND = 4,
    /// The call would break an invariant: a prefix shrinking below the protected length, a
    /// double free, a row already in use, releasing a slot in flight, a stale req copy, a
    /// call made from inside a libskv callback.
    SKV_ERR_STATE = 5,
    /// An engine callback returned non-zero.
    SKV_ERR_CALLBACK = 6,
    /// CUDA driver missing or a CUDA call failed.
    SKV_ERR_CUDA = 7,
    /// Operation not available in this mode or build.
    SKV_ERR_UNSUPPORTED = 8,
    /// A bug caught at the boundary; the handle stays usable or reports SKV_ERR_INTERNAL on
    /// every later call.
    SKV_ERR_INTERNAL = 9,
    /// The caller's buffer is too small: the call says the size it needs (skv_events_drain's
    /// *len) and consumed nothing.
    SKV_ERR_BUFFER = 10,
}

use skv_status::*;

/// The status code of a core error: the one place errors become numbers.
pub(crate) fn status_of(e: &Error) -> skv_status {
    match e {
        Error::NullArg(_) => SKV_ERR_NULL_ARG,
        Error::InvalidArg(_) => SKV_ERR_INVALID_ARG,
        Error::OutOfMemory(_) => SKV_ERR_OUT_OF_MEMORY,
        Error::NotFound(_) => SKV_ERR_NOT_FOUND,
        Error::State(_) => SKV_ERR_STATE,
        Error::Callback(_) => SKV_ERR_CALLBACK,
        Error::Cuda(_) => SKV_ERR_CUDA,
        Error::Unsupported(_) => SKV_ERR_UNSUPPORTED,
        Error::Internal(_) => SKV_ERR_INTERNAL,
        Error::Buffer(_) => SKV_ERR_BUFFER,
    }
}

thread_local! {
    /// The last failed call's message, NUL-terminated; empty after a success.
    static LAST_ERROR: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    /// Whether LAST_ERROR holds a message: a success then costs one flag read.
    static HAS_ERROR: Cell<bool> = const { Cell::new(false) };
}

/// Threads whose last call failed (their HAS_ERROR is set). While it is 0 a success has no
/// message to clear and skips the thread-local access; a thread holding a message raised
/// it itself, so it never reads 0. (A thread that exits holding one leaves it raised: later
/// successes then take the thread-local path, which is still correct.)
static THREADS_WITH_ERROR: AtomicUsize = AtomicUsize::new(0);

pub(crate) fn set_last_error(function: &str, message: &str) {
    if !HAS_ERROR.replace(true) {
        THREADS_WITH_ERROR.fetch_add(1, Ordering::Relaxed);
    }
    LAST_ERROR.with_borrow_mut(|buf| {
        buf.clear();
        buf.extend(format!("{function}: {message}").bytes().filter(|&b| b != 0 && b != b'\n'));
        buf.push(0);
    });
}

#[inline]
pub(crate) fn clear_last_error() {
    if THREADS_WITH_ERROR.load(Ordering::Relaxed) == 0 {
        return;
    }
    if HAS_ERROR.replace(false) {
        THREADS_WITH_ERROR.fetch_sub(1, Ordering::Relaxed);
        LAST_ERROR.with_borrow_mut(|buf| buf.clear());
    }
}

/// The status code as a constant string naming it, e.g. "SKV_ERR_STATE"; never NULL, also
/// for a value that is no status code.
#[no_mangle]
pub extern "C" fn skv_status_str(s: StatusArg) -> *const c_char {
    status_name(s).as_ptr()
}

fn status_name(s: c_int) -> &'static CStr {
    match s {
        0 => c"SKV_OK",
        1 => c"SKV_ERR_NULL_ARG",
        2 => c"SKV_ERR_INVALID_ARG",
        3 => c"SKV_ERR_OUT_OF_MEMORY",
        4 => c"SKV_ERR_NOT_FOUND",
        5 => c"SKV_ERR_STATE",
        6 => c"SKV_ERR_CALLBACK",
        7 => c"SKV_ERR_CUDA",
        8 => c"SKV_ERR_UNSUPPORTED",
        9 => c"SKV_ERR_INTERNAL",
        10 => c"SKV_ERR_BUFFER",
        _ => c"SKV_ERR_UNKNOWN",
    }
}

/// For Rust programs driving the C ABI (the simulator, the benchmarks, the tests): the
/// status's name and the calling thread's last error, without `unsafe`.
impl skv_status {
    /// "SKV_ERR_STATE", as `skv_status_str` gives it.
    pub fn name(self) -> &'static str {
        status_name(self as c_int).to_str().unwrap_or("SKV_ERR_UNKNOWN")
    }

    /// `Ok` for `SKV_OK`; otherwise the status's name and this thread's last error message.
    pub fn ok(self) -> Result<(), String> {
        match self {
            SKV_OK => Ok(()),
            _ => Err(format!("{}: {}", self.name(), last_error_message())),
        }
    }
}

/// The calling thread's last error message, as `skv_last_error` gives it ("" after a success).
pub fn last_error_message() -> String {
    LAST_ERROR.with_borrow(|buf| String::from_utf8_lossy(buf.strip_suffix(&[0]).unwrap_or(buf)).into_owned())
}

/// A C caller may pass any int as a `skv_status`; reading it as the Rust enum would be
/// undefined for values outside it, so the argument is taken as the plain integer (the
/// header still names it `skv_status`).
pub type StatusArg = c_int;

/// The message of the last failed libskv call on this thread, naming the function and the
/// offending value; "" when the last call on this thread succeeded. Valid until the next
/// libskv call on this thread. Never NULL.
#[no_mangle]
pub extern "C" fn skv_last_error() -> *const c_char {
    LAST_ERROR.with_borrow(|buf| if buf.is_empty() { c"".as_ptr() } else { buf.as_ptr().cast() })
}

/// SKV_ABI_VERSION of this build.
#[no_mangle]
pub extern "C" fn skv_abi_version() -> u32 {
    SKV_ABI_VERSION
}

/// The library's version, e.g. "0.4.0" (SKV_VERSION of the header it was built with).
#[no_mangle]
pub extern "C" fn skv_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}
