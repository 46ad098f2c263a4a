//! The C ABI: thin glue over `core`, one file per section of `include/skv.h`. Each export
//! checks its pointers, converts, calls the model and maps the error; `guard` is the one
//! panic boundary every fallible export goes through.

#![allow(non_camel_case_types)]
// The exports' docs are the C header's: each states its contract in C prose ("The caller must
// pass ...") rather than under a Rust `# Safety` heading, which would read as noise in C.
#![allow(clippy::missing_safety_doc)]

/// The boundary of an export, written once: the body of every export returning `skv_status`
/// is one `export!` call, its first argument the export's own name (`stringify!`-ed for the
/// error message prefix and the trace's `"fn"`). The fn item itself stays written out, so
/// cbindgen, the dlopen table (build.rs) and tests/refusals.rs read its doc comment and
/// signature as they are; the capi tests check that each export names itself. The lock stays
/// in the body: where a call takes the handle's lock among its checks decides which refusal
/// wins (docs/refusals.md).
///
/// - `export!(name, c, |t| args, || body, |t| results)`: an export taking a handle. Panics
///   become `SKV_ERR_INTERNAL`, the thread's last error is set or cleared, and on a traced
///   handle the call's line is written (`traced`); `args` and `results` run only then.
///   `args` is one expression or a block (`|t| t.num(...).list(...)`), its value dropped.
/// - `export!(name, || body)`: an export without a handle (no trace): `guard` alone.
/// - `export!(name, |n| shared(n, ...))`: an export whose body is one shared with a sibling
///   (`req_export`, `flashinfer_of`): `n` is bound to the name, no closure is built.
macro_rules! export {
    ($name:ident, |$n:ident| $body:expr $(,)?) => {{
        let $n: &'static str = stringify!($name);
        $body
    }};
    ($name:ident, $body:expr $(,)?) => {
        $crate::capi::guard(stringify!($name), $body)
    };
    ($name:ident, $c:expr, |$t:tt| $args:expr, $body:expr, $results:expr $(,)?) => {
        $crate::capi::traced(
            $c,
            stringify!($name),
            |$t| {
                $args;
            },
            $body,
            $results,
        )
    };
}

// cbindgen writes the header in the order these modules are declared, so each stands in its
// own group (rustfmt sorts a group alphabetically): status and errors first, then the handle
// and its config, the request record, the session calls, scheduler queries, owned pools (their
// operations, the stats and audit, the engine hooks, FlashInfer's arrays), the device, the
// dlopen table, tracing.
mod status;

mod cache;

mod external;

mod req;

mod session;

mod queries;

mod owned;

mod stats;

mod hooks;

mod flashinfer;

mod device;

mod api;

mod trace;

mod events;

mod tier;

mod transfer;

// The session calls with their events (no exports).
mod events_emit;

// The handle's lock (no exports).
mod handle_lock;

// The panic hook that keeps panics inside libskv calls quiet (no exports).
mod quiet;

use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};

pub use api::*;
pub use cache::*;
pub use device::*;
pub use events::*;
pub use external::*;
pub use flashinfer::*;
pub(crate) use handle_lock::{HandleGuard, HandleLock};
pub use hooks::*;
pub use owned::*;
pub use queries::*;
pub use req::*;
pub use session::*;
pub use stats::*;
pub use status::*;
pub use tier::*;
pub(crate) use trace::traced;
pub use transfer::*;

use crate::core::{Cache, Error, Result};

/// Runs one export's body: panics become `SKV_ERR_INTERNAL`, errors set the thread's last
/// error message (prefixed with the function name), success clears it. While the body runs
/// the thread counts as inside a libskv call, so the panic hook keeps a panic quiet.
#[inline]
pub(crate) fn guard(function: &'static str, body: impl FnOnce() -> Result<()>) -> skv_status {
    let outcome = quiet::inside_call(|| catch_unwind(AssertUnwindSafe(body))).unwrap_or_else(|panic| {
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
        Err(e) => failed(function, e),
    }
}

/// `guard`'s error path, out of line: every export inlines `guard`.
#[cold]
#[inline(never)]
fn failed(function: &'static str, e: Error) -> skv_status {
    set_last_error(function, &e.to_string());
    status_of(&e)
}

/// A required pointer as a reference; a misaligned one is refused.
///
/// # Safety
/// `p` must be NULL or point at a `T` that stays valid and unmodified for `'a`.
#[inline]
pub(crate) unsafe fn arg<'a, T>(p: *const T, name: &str) -> Result<&'a T> {
    aligned(p, 1, name)?;
    // SAFETY: as_ref turns NULL into None; any other p is aligned (checked) and valid by this
    // function's contract.
    unsafe { p.as_ref() }.ok_or_else(|| Error::NullArg(format!("{name} is NULL")))
}

/// A required out-pointer as a mutable reference; a misaligned one is refused.
///
/// # Safety
/// `p` must be NULL or point at a `T` that stays valid, and is accessed only through the
/// result, for `'a`.
#[inline]
pub(crate) unsafe fn out_mut<'a, T>(p: *mut T, name: &str) -> Result<&'a mut T> {
    aligned(p, 1, name)?;
    // SAFETY: as_mut turns NULL into None; any other p is aligned (checked) and valid by this
    // function's contract.
    unsafe { p.as_mut() }.ok_or_else(|| Error::NullArg(format!("{name} is NULL")))
}

/// Refuses a pointer to `n > 0` values that is not aligned for `T`: a reference to it would
/// be undefined behaviour. NULL and empty arrays pass (they are never dereferenced).
#[inline(always)]
pub(crate) fn aligned<T>(p: *const T, n: usize, name: &str) -> Result<()> {
    match p.is_aligned() || n == 0 {
        true => Ok(()),
        false => Err(misaligned(p as usize, std::mem::align_of::<T>(), name)),
    }
}

#[cold]
#[inline(never)]
fn misaligned(addr: usize, align: usize, name: &str) -> Error {
    Error::InvalidArg(format!("{name} {addr:#x} is not aligned to {align} bytes"))
}

/// One caller array as raw addresses: its first byte and how many bytes it spans. Calls that
/// read caller memory while they write caller memory compare these (`disjoint`) before any
/// reference to either is formed: two overlapping references, one of them `&mut`, are
/// undefined behaviour whatever order the code reads in.
#[derive(Clone, Copy)]
pub(crate) struct Span {
    name: &'static str,
    start: usize,
    bytes: usize,
}

impl Span {
    /// `n` values of `T` at `p` (NULL or an empty array span nothing).
    #[inline(always)]
    pub(crate) fn of<T>(p: *const T, n: usize, name: &'static str) -> Span {
        let bytes = if p.is_null() { 0 } else { n.saturating_mul(std::mem::size_of::<T>()) };
        Span { name, start: p as usize, bytes }
    }

    #[inline(always)]
    fn overlaps(&self, other: &Span) -> bool {
        self.bytes != 0
            && other.bytes != 0
            && self.start < other.start.saturating_add(other.bytes)
            && other.start < self.start.saturating_add(self.bytes)
    }
}

/// Refuses a call whose arrays share a byte, naming the pair: one comparison per pair of
/// arrays, whatever their lengths.
#[inline(always)]
pub(crate) fn disjoint(spans: &[Span]) -> Result<()> {
    for (i, a) in spans.iter().enumerate() {
        for b in &spans[..i] {
            if a.overlaps(b) {
                return Err(overlap(a, b));
            }
        }
    }
    Ok(())
}

/// Refuses an output sharing a byte with an input (inputs, only read, may share with each
/// other; the outputs among themselves are `disjoint`'s).
pub(crate) fn disjoint_across(outputs: &[Span], inputs: &[Span]) -> Result<()> {
    for input in inputs {
        for output in outputs {
            if input.overlaps(output) {
                return Err(overlap(input, output));
            }
        }
    }
    Ok(())
}

#[cold]
#[inline(never)]
fn overlap(a: &Span, b: &Span) -> Error {
    Error::InvalidArg(format!(
        "{} [{:#x}, +{} bytes) and {} [{:#x}, +{} bytes) overlap: a call's arrays must not share memory",
        b.name, b.start, b.bytes, a.name, a.start, a.bytes
    ))
}

/// A `(pointer, length)` pair as a slice; `(NULL, 0)` is the empty slice. A length no
/// array can have is refused rather than turned into a slice.
///
/// # Safety
/// `p` must be NULL or point at `n` initialised `T`s that stay valid and unmodified for `'a`.
pub(crate) unsafe fn slice<'a, T>(p: *const T, n: usize, name: &str) -> Result<&'a [T]> {
    aligned(p, n, name)?;
    match (p.is_null(), n) {
        (_, 0) => Ok(&[]),
        (true, _) => Err(Error::NullArg(format!("{name} is NULL with {n} elements"))),
        // SAFETY: p is not NULL, so it holds n values by this function's contract, and
        // checked_len has refused an n whose byte size exceeds isize::MAX.
        (false, _) => Ok(unsafe { std::slice::from_raw_parts(p, checked_len::<T>(n, name)?) }),
    }
}

/// `slice` for an array the call writes.
///
/// # Safety
/// `p` must be NULL or point at `n` initialised `T`s that stay valid, and are accessed only
/// through the result, for `'a`.
pub(crate) unsafe fn slice_mut<'a, T>(p: *mut T, n: usize, name: &str) -> Result<&'a mut [T]> {
    aligned(p, n, name)?;
    match (p.is_null(), n) {
        (_, 0) => Ok(&mut []),
        (true, _) => Err(Error::NullArg(format!("{name} is NULL with {n} elements"))),
        // SAFETY: p is not NULL, so it holds n values by this function's contract, and
        // checked_len has refused an n whose byte size exceeds isize::MAX.
        (false, _) => Ok(unsafe { std::slice::from_raw_parts_mut(p, checked_len::<T>(n, name)?) }),
    }
}

/// The NULL check of a `(pointer, length)` pair alone, for calls that check the handle's
/// mode between the NULL checks and the lengths.
pub(crate) fn nonnull<T>(p: *const T, n: usize, name: &str) -> Result<()> {
    match p.is_null() && n > 0 {
        true => Err(Error::NullArg(format!("{name} is NULL with {n} elements"))),
        false => aligned(p, n, name),
    }
}

/// A caller's versioned struct (one whose first field is `uint32_t struct_size`), read as
/// the struct grows: every published sizeof (`sizes`, oldest first, the last this library's)
/// is accepted; only `struct_size` bytes are read, and fields past them keep their zero
/// default (NULL callbacks, zero numbers). A size between two published ones would cut a
/// field in two, and is refused. A larger struct than this library's is accepted only when
/// every byte past `sizeof(T)` is zero: a non-zero one is a field this library cannot honour.
///
/// # Safety
/// `p` must be non-NULL and point at `struct_size` readable bytes, and an all-zero `T` must be
/// a valid value.
pub(crate) unsafe fn read_versioned<T: Copy>(p: *const T, sizes: &[u32], name: &str) -> Result<T> {
    let ty = std::any::type_name::<T>().rsplit("::").next().unwrap_or("?");
    // SAFETY: p is not NULL and its struct_size (the first 4 bytes) is readable, by contract.
    let size = unsafe { p.cast::<u32>().read_unaligned() };
    let full = std::mem::size_of::<T>();
    if size < sizes[0] {
        return Err(Error::InvalidArg(format!(
            "{name}->struct_size {size} < {}, the first published sizeof({ty})",
            sizes[0]
        )));
    }
    if (size as usize) < full && !sizes.contains(&size) {
        let list: Vec<String> = sizes.iter().map(u32::to_string).collect();
        return Err(Error::InvalidArg(format!(
            "{name}->struct_size {size} is no published sizeof({ty}) ({}): it would cut a field in two",
            list.join(", ")
        )));
    }
    let bytes = p.cast::<u8>();
    // SAFETY: i < size, and the caller's struct has size readable bytes, by contract.
    if let Some(at) = (full..size as usize).find(|&i| unsafe { *bytes.add(i) } != 0) {
        return Err(Error::InvalidArg(format!(
            "{name}->struct_size {size}: byte {at}, past this library's sizeof({ty}) {full}, is non-zero \
             (a field this library does not know)"
        )));
    }
    let mut out = std::mem::MaybeUninit::<T>::zeroed();
    // SAFETY: at most size bytes are read from the caller's struct and at most sizeof(T) are
    // written into out; the two do not overlap, and an all-zero T overwritten with a prefix
    // of a caller's T is a valid T, by contract.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes, out.as_mut_ptr().cast::<u8>(), full.min(size as usize));
        Ok(out.assume_init())
    }
}

fn checked_len<T>(n: usize, name: &str) -> Result<usize> {
    match n.checked_mul(std::mem::size_of::<T>()) {
        Some(bytes) if bytes <= isize::MAX as usize => Ok(n),
        _ => Err(Error::InvalidArg(format!("{name}: {n} elements is no array's length"))),
    }
}

thread_local! {
    /// How many libskv callbacks (pool ops, engine hooks, of any handle) this thread is
    /// running. While it is non-zero, every call that takes a handle is refused: a callback
    /// reaching any handle could wait on a lock its own call holds, directly or through another
    /// thread doing the mirror image (A's callback calls B while B's calls A).
    static CALLBACK_DEPTH: Cell<u32> = const { Cell::new(0) };
}

/// Callback scopes open on all threads. While it is 0 no thread is inside a callback, so a
/// call skips the thread-local check (in a shared library each thread-local access is a
/// `__tls_get_addr` call). A thread inside a callback raised it itself, so it never reads 0.
static CALLBACKS_RUNNING: AtomicUsize = AtomicUsize::new(0);

/// Marks the thread as inside a libskv callback until dropped.
pub(crate) struct CallbackScope;

impl CallbackScope {
    pub(crate) fn enter() -> CallbackScope {
        CALLBACKS_RUNNING.fetch_add(1, Ordering::Relaxed);
        CALLBACK_DEPTH.set(CALLBACK_DEPTH.get() + 1);
        CallbackScope
    }
}

impl Drop for CallbackScope {
    fn drop(&mut self) {
        CALLBACK_DEPTH.set(CALLBACK_DEPTH.get() - 1);
        CALLBACKS_RUNNING.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Whether this thread is running a libskv callback.
#[inline]
pub(crate) fn in_callback() -> bool {
    CALLBACKS_RUNNING.load(Ordering::Relaxed) != 0 && this_thread_in_callback()
}

/// `in_callback`'s thread-local half, out of line: inlined, the compiler computes the
/// thread-local's address (in the shared library a `__tls_get_addr` call) before the global
/// test that makes it unnecessary, on every call.
#[cold]
#[inline(never)]
fn this_thread_in_callback() -> bool {
    CALLBACK_DEPTH.get() > 0
}

/// Locks a handle for one call. A shared reference is enough, also for calls that change the
/// cache: the handle's lock gives the interior mutability, which is why the queries take a
/// `const skv_cache *`.
///
/// # Safety
/// `c` must be NULL or a live handle that stays live for `'a`.
#[inline(always)]
pub(crate) unsafe fn lock<'a>(c: *const skv_cache) -> Result<HandleGuard<'a, Cache>> {
    // SAFETY: NULL or a live handle, by this function's contract.
    let handle = unsafe { c.as_ref() }.ok_or_else(|| Error::NullArg("cache is NULL".into()))?;
    if in_callback() {
        return Err(Error::State(
            "called from inside a libskv callback (skv_pool_ops or skv_engine_hooks): a callback must not \
             call libskv on any handle"
                .into(),
        ));
    }
    handle.inner.lock().map_err(|_| Error::Internal("the handle is unusable after an earlier internal error".into()))
}

#[cfg(test)]
mod export_tests {
    use std::path::Path;

    /// Every export returning skv_status is one shape: its body makes one `export!` call, and
    /// that call names the export itself (a copied body naming its sibling would put the wrong
    /// name in every message and trace line).
    #[test]
    fn every_export_goes_through_export_naming_itself() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/capi");
        let mut files: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
        files.sort();
        let (mut checked, mut bad) = (0, Vec::new());
        for path in files.iter().filter(|p| p.extension().is_some_and(|x| x == "rs")) {
            let file = syn::parse_file(&std::fs::read_to_string(path).unwrap()).unwrap();
            for item in &file.items {
                let syn::Item::Fn(f) = item else { continue };
                let returns_status = matches!(&f.sig.output, syn::ReturnType::Type(_, t)
                    if matches!(&**t, syn::Type::Path(p) if p.path.is_ident("skv_status")));
                if !f.attrs.iter().any(|a| a.path().is_ident("no_mangle")) || !returns_status {
                    continue;
                }
                let name = f.sig.ident.to_string();
                let named: Vec<String> = f
                    .block
                    .stmts
                    .iter()
                    .filter_map(|s| match s {
                        syn::Stmt::Macro(m) => Some(&m.mac),
                        syn::Stmt::Expr(syn::Expr::Macro(m), _) => Some(&m.mac),
                        _ => None,
                    })
                    .filter(|m| m.path.is_ident("export"))
                    .map(|m| m.tokens.clone().into_iter().next().map(|t| t.to_string()).unwrap_or_default())
                    .collect();
                match named.as_slice() {
                    [one] if *one == name => checked += 1,
                    _ => bad.push(format!("{name}: export! calls naming {named:?}")),
                }
            }
        }
        assert!(bad.is_empty(), "exports not written as one export!(own name, ...):\n  {}", bad.join("\n  "));
        let header = std::fs::read_to_string(dir.join("../../include/skv.h")).unwrap();
        let declared = header.lines().filter(|l| l.starts_with("enum skv_status skv_")).count();
        assert_eq!(checked, declared, "exports checked against the header's functions returning skv_status");
    }
}
