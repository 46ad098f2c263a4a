//! Call traces: every call on a traced handle appends one JSON object per line to a file —
//! the handle, the function, its arguments (a req field by field, arrays in full up to
//! `MAX_LIST` values; a longer one keeps its first `MAX_LIST` and is marked
//! `"<name>_cut_at":MAX_LIST,"<name>_full_len":<its length>`), the status, the error message,
//! and what the call wrote back. The first line a handle writes gives its mode and config.
//! Lines of one handle appear in the order its calls ran. For reproducing an engine's bug
//! report call for call.

use std::fmt::Write as _;
use std::fs::{File, OpenOptions};
use std::io::{LineWriter, Write};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use super::{guard, in_callback, set_last_error, skv_cache, skv_held, skv_match, skv_req, skv_status};
use crate::core::{Cache, Error, Result};

/// Where a handle's trace goes; `None` when it is not traced.
#[derive(Default)]
pub(crate) struct TraceFile {
    /// Whether `file` is open: an untraced call costs one relaxed load.
    on: AtomicBool,
    file: Mutex<Option<LineWriter<File>>>,
}

impl TraceFile {
    /// A handle's trace at creation: `SKV_TRACE=path` traces every new handle.
    pub(crate) fn from_env(id: u64, cache: &Cache) -> Result<TraceFile> {
        let t = TraceFile::default();
        if let Some(path) = std::env::var_os("SKV_TRACE").filter(|p| !p.is_empty()) {
            let first = opening_line(id, cache);
            t.open(Some((Path::new(&path), first))).map_err(|e| Error::InvalidArg(format!("SKV_TRACE: {e}")))?;
        }
        Ok(t)
    }

    /// Starts appending to `path` (created if missing), beginning with `first` (the handle's
    /// `opening_line`), or stops tracing with `None`.
    pub(crate) fn open(&self, to: Option<(&Path, String)>) -> Result<()> {
        let file =
            match to {
                None => None,
                Some((p, first)) => {
                    let mut f =
                        LineWriter::new(OpenOptions::new().create(true).append(true).open(p).map_err(|e| {
                            Error::InvalidArg(format!("path \"{}\" cannot be opened: {e}", p.display()))
                        })?);
                    let _ = f.write_all(first.as_bytes());
                    Some(f)
                }
            };
        let mut slot = self.file.lock().map_err(|_| Error::Internal("trace file lock poisoned".into()))?;
        self.on.store(file.is_some(), Ordering::Relaxed);
        *slot = file;
        Ok(())
    }
}

/// The line a trace of handle `id` begins with: its mode and config.
pub(crate) fn opening_line(id: u64, cache: &Cache) -> String {
    let cfg = cache.config();
    let mode = if cache.is_owned() { "owned" } else { "external" };
    format!(
        "{{\"h\":{id},\"fn\":\"trace_start\",\"mode\":\"{mode}\",\"page_size\":{},\"num_token_slots\":{},\
         \"num_rows\":{},\"max_context_len\":{},\"aligned_reuse\":{},\"swa_num_token_slots\":{},\"version\":\"{}\"}}\n",
        cfg.page_size,
        cfg.num_token_slots,
        cfg.num_rows,
        cfg.max_context_len,
        cfg.aligned_reuse,
        cfg.swa_num_token_slots,
        env!("CARGO_PKG_VERSION")
    )
}

/// The most values of one array a line spells out; a longer one is cut, and says so.
const MAX_LIST: usize = 1 << 16;

/// One trace line under construction: a JSON object.
pub(crate) struct Line(String);

impl Line {
    pub(crate) fn num(&mut self, name: &str, v: impl Into<i128>) -> &mut Self {
        let _ = write!(self.0, ",\"{name}\":{}", v.into());
        self
    }

    pub(crate) fn text(&mut self, name: &str, v: &str) -> &mut Self {
        let _ = write!(self.0, ",\"{name}\":\"");
        for c in v.chars() {
            match c {
                '"' => self.0.push_str("\\\""),
                '\\' => self.0.push_str("\\\\"),
                c if (c as u32) < 0x20 => {
                    let _ = write!(self.0, "\\u{:04x}", c as u32);
                }
                c => self.0.push(c),
            }
        }
        self.0.push('"');
        self
    }

    /// An array of `n` values at `p`, read only when the pair passes the checks the call's
    /// body makes (`slice`): `null` for a NULL pointer with a length, `"invalid"` for a length
    /// no array can have.
    pub(crate) fn list<T: Copy + Into<i128>>(&mut self, name: &str, p: *const T, n: usize) -> &mut Self {
        // SAFETY: the caller's array of n values by the call's contract, once `slice` has
        // refused the pairs no caller could own.
        let values = match unsafe { super::slice(p, n, name) } {
            Ok(v) => v,
            Err(_) => {
                let _ = write!(self.0, ",\"{name}\":{}", if p.is_null() { "null" } else { "\"invalid\"" });
                return self;
            }
        };
        let _ = write!(self.0, ",\"{name}\":[");
        for (i, &v) in values.iter().take(MAX_LIST).enumerate() {
            let _ = write!(self.0, "{}{}", if i == 0 { "" } else { "," }, v.into());
        }
        self.0.push(']');
        self.cut(name, n)
    }

    /// After an array of `n` values: the mark of a cut one, how many values it keeps and how
    /// many it had (a reader must not take the kept ones for the whole).
    fn cut(&mut self, name: &str, n: usize) -> &mut Self {
        if n > MAX_LIST {
            let _ = write!(self.0, ",\"{name}_cut_at\":{MAX_LIST},\"{name}_full_len\":{n}");
        }
        self
    }

    /// A req, field by field (`null` for a NULL pointer).
    pub(crate) fn req(&mut self, name: &str, r: *const skv_req) -> &mut Self {
        if !r.is_aligned() {
            let _ = write!(self.0, ",\"{name}\":\"invalid\"");
            return self;
        }
        // SAFETY: the caller's pointer, valid or NULL by the call's contract (and aligned).
        match unsafe { r.as_ref() } {
            None => {
                let _ = write!(self.0, ",\"{name}\":null");
            }
            Some(r) => {
                let _ = write!(self.0, ",\"{name}\":");
                for (i, f) in skv_req::FIELDS.iter().enumerate() {
                    let _ = write!(self.0, "{}\"{}\":{}", if i == 0 { "{" } else { "," }, f.name, (f.get)(r));
                }
                self.0.push('}');
            }
        }
        self
    }

    /// An array of `n` reqs, field by field.
    pub(crate) fn reqs(&mut self, name: &str, p: *const skv_req, n: usize) -> &mut Self {
        if p.is_null() && n > 0 {
            let _ = write!(self.0, ",\"{name}\":null");
            return self;
        }
        if !p.is_aligned() && n > 0 {
            let _ = write!(self.0, ",\"{name}\":\"invalid\"");
            return self;
        }
        let _ = write!(self.0, ",\"{name}\":[");
        let mut one = Line(String::new());
        for i in 0..n.min(MAX_LIST) {
            one.0.clear();
            // SAFETY: the caller's array of n reqs, by the call's contract.
            one.req("r", unsafe { p.add(i) });
            let text = one.0.strip_prefix(",\"r\":").unwrap_or(&one.0);
            let _ = write!(self.0, "{}{text}", if i == 0 { "" } else { "," });
        }
        self.0.push(']');
        self.cut(name, n)
    }

    pub(crate) fn matched(&mut self, name: &str, m: *const skv_match) -> &mut Self {
        // SAFETY: written by the call that just succeeded.
        if let Some(m) = unsafe { m.as_ref() } {
            let _ = write!(self.0, ",\"{name}\":{{\"hit\":{},\"prefix_len\":{}}}", m.hit, m.prefix_len);
        }
        self
    }

    pub(crate) fn held(&mut self, name: &str, h: *const skv_held) -> &mut Self {
        // SAFETY: written by the call that just succeeded.
        if let Some(h) = unsafe { h.as_ref() } {
            let _ = write!(
                self.0,
                ",\"{name}\":{{\"full_tokens\":{},\"swa_tokens\":{},\"rows\":{},\"aux_states\":{},\"sessions\":{},\"aux_handles\":{}}}",
                h.full_tokens, h.swa_tokens, h.rows, h.aux_states, h.sessions, h.aux_handles
            );
        }
        self
    }
}

/// Runs one export's body behind `guard`; on a traced handle, appends the call's line:
/// `args` describes its arguments before the call, `results` what it wrote back (only
/// after a call that completed: OK, or a free callback failing part-way). The whole traced
/// path runs inside the panic boundary, and `args` reads the caller's memory only through
/// the checks the body makes (`Line::list`, `read_versioned`).
#[inline]
pub(crate) fn traced(
    c: *const skv_cache,
    function: &'static str,
    args: impl FnOnce(&mut Line),
    body: impl FnOnce() -> Result<()>,
    results: impl FnOnce(&mut Line),
) -> skv_status {
    // SAFETY: a handle pointer is NULL or live by the call's contract.
    let handle = unsafe { c.as_ref() }.filter(|h| h.trace.on.load(Ordering::Relaxed));
    // A call from inside a callback is refused without touching the trace, whose lock the
    // outer call may hold.
    match handle.filter(|_| !in_callback()) {
        None => guard(function, body),
        Some(handle) => traced_call(handle, function, args, body, results),
    }
}

/// The traced path of `traced`, kept out of line so that an untraced call inlines to `guard`.
#[inline(never)]
fn traced_call(
    handle: &skv_cache,
    function: &'static str,
    args: impl FnOnce(&mut Line),
    body: impl FnOnce() -> Result<()>,
    results: impl FnOnce(&mut Line),
) -> skv_status {
    let outcome = super::quiet::inside_call(|| {
        catch_unwind(AssertUnwindSafe(|| {
            // The trace lock is held across the call, so lines appear in the order calls ran.
            // A panic while formatting a line leaves the file as it was: a poisoned lock is fine.
            let mut file = handle.trace.file.lock().unwrap_or_else(|p| p.into_inner());
            let mut line = Line(format!("{{\"h\":{},\"fn\":\"{}\"", handle.id, function));
            args(&mut line);
            let status = guard(function, body);
            line.text("status", status.name());
            if matches!(status, skv_status::SKV_OK | skv_status::SKV_ERR_CALLBACK) {
                results(&mut line);
            }
            if status != skv_status::SKV_OK {
                line.text("error", &super::last_error_message());
            }
            line.0.push_str("}\n");
            if let Some(f) = file.as_mut() {
                // A trace is a debugging aid: a full disk must not fail the engine's call.
                let _ = f.write_all(line.0.as_bytes());
            }
            status
        }))
    });
    outcome.unwrap_or_else(|_| {
        set_last_error(function, "internal error (a libskv bug): tracing the call panicked");
        skv_status::SKV_ERR_INTERNAL
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capi::{skv_cache_config, skv_cache_free, skv_cache_new, skv_cache_set_trace};

    /// A panic while the line is written (arguments, results) is caught like one in the body.
    #[test]
    fn tracing_runs_inside_the_panic_boundary() {
        let path = std::env::temp_dir().join(format!("skv_trace_panic_{}.jsonl", std::process::id()));
        let cfg = skv_cache_config::small_owned();
        let mut c = std::ptr::null_mut();
        let cpath = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
        // SAFETY: valid pointers throughout; the handle is freed at the end.
        unsafe {
            assert_eq!(skv_cache_new(&cfg, &mut c), skv_status::SKV_OK);
            assert_eq!(skv_cache_set_trace(c, cpath.as_ptr()), skv_status::SKV_OK);
            fn probe_args(c: *mut skv_cache) -> skv_status {
                export!(probe_args, c, |_| panic!("args"), || Ok(()), |_| {})
            }
            fn probe_results(c: *mut skv_cache) -> skv_status {
                export!(probe_results, c, |_| {}, || Ok(()), |_| panic!("results"))
            }
            fn probe_after(c: *mut skv_cache) -> skv_status {
                export!(probe_after, c, |_| {}, || Ok(()), |_| {})
            }
            let s = probe_args(c);
            assert_eq!(s, skv_status::SKV_ERR_INTERNAL);
            let s = probe_results(c);
            assert_eq!(s, skv_status::SKV_ERR_INTERNAL);
            // Later calls are still traced.
            let s = probe_after(c);
            assert_eq!(s, skv_status::SKV_OK);
            skv_cache_free(c);
        }
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains("\"fn\":\"probe_after\",\"status\":\"SKV_OK\""), "{text}");
        assert!(!text.contains("probe_args"), "{text}");
        let _ = std::fs::remove_file(path);
    }
}
