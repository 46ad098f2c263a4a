//! The one error type of libskv. Its `Display` is the text users read in `skv_last_error()`
//! (the C boundary prefixes the function name); each variant maps to one status code.

/// Why a call was refused. Every variant carries a message naming the offending value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// A required pointer was NULL (raised at the C boundary).
    #[error("{0}")]
    NullArg(String),
    /// A number out of range, or `skv_req` fields that disagree with each other or with the record.
    #[error("{0}")]
    InvalidArg(String),
    /// Not enough free pages or rows; nothing was allocated.
    #[error("{0}")]
    OutOfMemory(String),
    /// A row that is not in use.
    #[error("{0}")]
    NotFound(String),
    /// The arguments are fine but the cache's state forbids the call.
    #[error("{0}")]
    State(String),
    /// An engine callback returned non-zero.
    #[error("{0}")]
    Callback(String),
    /// The CUDA driver is missing or a CUDA call failed.
    #[error("{0}")]
    Cuda(String),
    /// Not available in this mode or build.
    #[error("{0}")]
    Unsupported(String),
    /// A bug caught at the boundary.
    #[error("{0}")]
    Internal(String),
    /// The caller's buffer is too small; nothing was consumed.
    #[error("{0}")]
    Buffer(String),
}

impl Error {
    /// The same error, its message prefixed (a batch names the request's position).
    pub(crate) fn at(self, prefix: impl std::fmt::Display) -> Error {
        let p = |m: String| format!("{prefix}: {m}");
        match self {
            Error::NullArg(m) => Error::NullArg(p(m)),
            Error::InvalidArg(m) => Error::InvalidArg(p(m)),
            Error::OutOfMemory(m) => Error::OutOfMemory(p(m)),
            Error::NotFound(m) => Error::NotFound(p(m)),
            Error::State(m) => Error::State(p(m)),
            Error::Callback(m) => Error::Callback(p(m)),
            Error::Cuda(m) => Error::Cuda(p(m)),
            Error::Unsupported(m) => Error::Unsupported(p(m)),
            Error::Internal(m) => Error::Internal(p(m)),
            Error::Buffer(m) => Error::Buffer(p(m)),
        }
    }
}

/// The checks and steps of the per-step calls are `#[inline]`: a `Result` this wide comes
/// back through memory, and reading an `Ok` just after the callee stored only its tag stalls
/// (the narrow store cannot be forwarded to the wide load). Inlined, an `Ok` stays in registers.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A vector of `n` values, or `OutOfMemory` when the host cannot hold it: a handle's tables
/// are sized by its configuration, and a huge one must fail the call, not abort the process.
pub(crate) fn try_vec<T>(n: usize, what: &str, mut fill: impl FnMut(usize) -> T) -> Result<Vec<T>> {
    let mut v = Vec::new();
    if v.try_reserve_exact(n).is_err() {
        return Err(Error::OutOfMemory(format!("cannot allocate {what} for {n} entries")));
    }
    v.extend((0..n).map(&mut fill));
    Ok(v)
}

/// Returns `Err(Error::$kind(message))`. The message is formatted out of line, in a function
/// marked cold: a check's error paths then add a call, not a formatter, to the function
/// they sit in, which stays small enough to inline (see `Result`).
macro_rules! bail {
    ($kind:ident, $($fmt:tt)*) => {
        return Err($crate::core::error::cold(|| $crate::core::Error::$kind(format!($($fmt)*))))
    };
}
pub(crate) use bail;

/// Builds an error off the hot path (see `bail!`).
#[cold]
#[inline(never)]
pub(crate) fn cold(make: impl FnOnce() -> Error) -> Error {
    make()
}
