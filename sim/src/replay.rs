//! `skv-sim replay FILE.jsonl`: re-runs a call trace (SKV_TRACE / skv_cache_set_trace) against
//! fresh handles of the recorded configs, call by call, and reports the first call whose
//! status, outputs or req differ from the recording, or the first audit violation, with its
//! line number. Exit 0 when every call matches, 1 at the first difference, 2 when the trace
//! cannot be replayed.
//!
//! A line the replay cannot reproduce exactly is "cannot replay", never passed on: an input
//! array, or an output the replay compares, that the trace cut (`"<name>_cut_at"`); a compared
//! output recorded with other than the values the call writes; a number out of its argument's
//! range; a buffer larger than `MAX_VALUES` values (or than the host can give). Every length
//! handed to libskv is the length of the buffer passed with it.
//!
//! Owned-mode traces replay fully. The engine hooks (skv_cache_set_hooks) are replaced by hooks
//! that succeed, so a recorded SKV_ERR_CALLBACK of a failing hook shows as a difference.
//! External-mode traces are refused: the trace records the calls, not the engine's
//! `req_to_token` rows that libskv reads back through `read_row`, so the indices handed to
//! `free_kv` cannot be reproduced.

use std::collections::HashMap;
use std::ffi::{c_int, c_void, CStr};
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::process::ExitCode;
use std::ptr::{null, null_mut};

use serde_json::Value;
use skv::core::{FieldValue, ReqField};
use skv::*;

/// The `skv_req` fields traces from before ABI 4 lack: such a trace reads each as its
/// `skv_req::default()` value, the value every req had then.
const NEWER_REQ_FIELDS: [&str; 2] = ["swa_evict_floor", "aux_track"];

/// The most values one buffer of the replay holds (64 MiB of `i32`). A call that succeeded
/// wrote at most 65,536 values the trace kept whole, so only a failed call's buffer (its
/// length as the engine passed it) can be larger: such a line cannot be replayed.
const MAX_VALUES: usize = 1 << 24;

/// The longest line the replay reads. libskv's longest, a batch line of 65,536 reqs, is under
/// 32 MiB.
const MAX_LINE: u64 = 64 << 20;

/// `skv-sim replay FILE` when the command line starts with `replay`; `None` otherwise.
pub fn from_args() -> Option<ExitCode> {
    let mut args = std::env::args().skip(1);
    if args.next().as_deref() != Some("replay") {
        return None;
    }
    let (Some(path), None) = (args.next(), args.next()) else {
        eprintln!("skv-sim: usage: skv-sim replay FILE.jsonl");
        return Some(ExitCode::from(2));
    };
    Some(match replay_file(&path) {
        Ok(summary) => {
            println!("skv-sim replay: {summary}");
            ExitCode::SUCCESS
        }
        Err(Stop::Differs(msg)) => {
            println!("skv-sim replay: FAIL: {msg}");
            ExitCode::from(1)
        }
        Err(Stop::Cannot(msg)) => {
            eprintln!("skv-sim replay: cannot replay: {msg}");
            ExitCode::from(2)
        }
    })
}

/// Why a replay stopped before the trace's end: a difference (exit 1) or a trace it cannot
/// replay (exit 2). Not the simulator's `engine::Fault`, a libskv misbehaviour a run found.
enum Stop {
    /// The replay disagrees with the recording (or the audit found a violation).
    Differs(String),
    /// The trace cannot be replayed at all.
    Cannot(String),
}

fn cannot(line: usize, msg: impl std::fmt::Display) -> Stop {
    Stop::Cannot(format!("line {line}: {msg}"))
}

unsafe extern "C" fn hook_lock(_: *mut c_void, _: u64, _: u64) -> c_int {
    0
}

unsafe extern "C" fn hook_aux(_: *mut c_void, _: i64) -> c_int {
    0
}

/// The replayed handles, keyed by the recorded handle id.
struct Handles(HashMap<u64, *mut skv_cache>);

impl Drop for Handles {
    fn drop(&mut self) {
        for &c in self.0.values() {
            // SAFETY: each handle made by skv_cache_new, freed once.
            unsafe { skv_cache_free(c) };
        }
    }
}

fn replay_file(path: &str) -> Result<String, Stop> {
    let file = File::open(path).map_err(|e| Stop::Cannot(format!("{path}: {e}")))?;
    let mut reader = BufReader::new(file);
    let mut raw = Vec::new();
    let mut handles = Handles(HashMap::new());
    let mut calls = 0u64;
    for line in 1.. {
        raw.clear();
        // A line is read up to MAX_LINE bytes and no further, so that no line can grow the
        // buffer past what the host holds.
        let read = (&mut reader).take(MAX_LINE + 1).read_until(b'\n', &mut raw);
        match read.map_err(|e| cannot(line, format!("{path}: {e}")))? {
            0 => break,
            n if n as u64 > MAX_LINE => return Err(cannot(line, format!("longer than {MAX_LINE} bytes"))),
            _ => {}
        }
        if raw.trim_ascii().is_empty() {
            continue;
        }
        let v: Value = serde_json::from_slice(&raw).map_err(|e| cannot(line, format!("not JSON: {e}")))?;
        let h = v["h"].as_u64().ok_or_else(|| cannot(line, "no handle id \"h\""))?;
        let f = v["fn"].as_str().ok_or_else(|| cannot(line, "no \"fn\""))?;
        if f == "trace_start" {
            // A handle traced again (skv_cache_set_trace twice) starts a new line of the same
            // handle: keep replaying on it.
            if let std::collections::hash_map::Entry::Vacant(e) = handles.0.entry(h) {
                e.insert(open(&v, line)?);
            }
            continue;
        }
        let c = *handles.0.get(&h).ok_or_else(|| cannot(line, format!("handle {h} has no trace_start line")))?;
        Call { v: &v, line, c }.run()?;
        audit(c, line, f)?;
        calls += 1;
    }
    Ok(format!(
        "{calls} calls on {} handles replayed from {path}: every status, output and req matches",
        handles.0.len()
    ))
}

/// A fresh handle of the config a `trace_start` line records.
fn open(v: &Value, line: usize) -> Result<*mut skv_cache, Stop> {
    if v["mode"] != "owned" {
        return Err(cannot(
            line,
            format!(
                "mode {}: only owned-mode traces replay (an external-mode trace lacks the engine's \
                 req_to_token rows, which libskv reads back through read_row)",
                v["mode"]
            ),
        ));
    }
    let num = |k: &str| v[k].as_u64().ok_or_else(|| cannot(line, format!("trace_start has no {k}")));
    let num32 = |k: &str| {
        let n = num(k)?;
        u32::try_from(n).map_err(|_| cannot(line, format!("trace_start: {k} {n} out of range")))
    };
    let cfg = skv_cache_config {
        struct_size: std::mem::size_of::<skv_cache_config>() as u32,
        page_size: num32("page_size")?,
        num_token_slots: num("num_token_slots")?,
        num_rows: num32("num_rows")?,
        max_context_len: num32("max_context_len")?,
        flags: if v["aligned_reuse"] == true { SKV_FLAG_ALIGNED_REUSE } else { 0 },
        // Absent from a trace written before the SWA pool existed: none.
        swa_num_token_slots: v["swa_num_token_slots"].as_u64().unwrap_or(0),
        ..Default::default()
    };
    if v["version"].as_str() != Some(env!("CARGO_PKG_VERSION")) {
        eprintln!(
            "skv-sim replay: line {line}: recorded by libskv {}, replayed on {}",
            v["version"],
            env!("CARGO_PKG_VERSION")
        );
    }
    let mut c = null_mut();
    // SAFETY: valid pointers.
    let st = unsafe { skv_cache_new(&cfg, &mut c) };
    if st != skv_status::SKV_OK {
        return Err(cannot(line, format!("skv_cache_new({cfg:?}) = {}: {}", st.name(), last_error_message())));
    }
    Ok(c)
}

fn audit(c: *mut skv_cache, line: usize, f: &str) -> Result<(), Stop> {
    // SAFETY: a live handle and a valid out-pointer.
    unsafe {
        let mut rep = std::mem::zeroed::<skv_check_report>();
        let st = skv_cache_check(c, &mut rep);
        if st != skv_status::SKV_OK || rep.violations != 0 {
            let first = CStr::from_ptr(rep.first_violation.as_ptr()).to_string_lossy().into_owned();
            return Err(Stop::Differs(format!(
                "line {line}: after {f}: audit {} with {} violations: {first}",
                st.name(),
                rep.violations
            )));
        }
    }
    Ok(())
}

/// One recorded call.
struct Call<'a> {
    v: &'a Value,
    line: usize,
    c: *mut skv_cache,
}

fn int(v: &Value) -> Option<i128> {
    v.as_i64().map(i128::from).or_else(|| v.as_u64().map(i128::from))
}

/// A req field's recorded value: a number, or a pair of numbers (`aux_track`).
fn field_value(v: &Value) -> Option<FieldValue> {
    match v {
        Value::Array(a) if a.len() == 2 => Some(FieldValue::Pair([a[0].as_i64()?, a[1].as_i64()?])),
        v => int(v).map(FieldValue::One),
    }
}

impl Call<'_> {
    fn f(&self) -> &str {
        self.v["fn"].as_str().unwrap_or("?")
    }

    fn num(&self, k: &str) -> Result<i128, Stop> {
        int(&self.v[k]).ok_or_else(|| self.cannot(format!("no number \"{k}\"")))
    }

    /// An argument as the type the call takes; a number that type cannot hold was not written
    /// by libskv.
    fn arg<T: TryFrom<i128>>(&self, k: &str) -> Result<T, Stop> {
        let n = self.num(k)?;
        T::try_from(n).map_err(|_| self.cannot(format!("{k} {n} out of range")))
    }

    fn cannot(&self, what: impl std::fmt::Display) -> Stop {
        cannot(self.line, format!("{}: {what}", self.f()))
    }

    /// The argument a recorded SKV_ERR_NULL_ARG names ("skv_x: out is NULL"): replayed as NULL.
    fn null_arg(&self) -> Option<String> {
        if self.v["status"] != "SKV_ERR_NULL_ARG" {
            return None;
        }
        let msg = self.v["error"].as_str()?;
        let rest = msg.split_once(": ")?.1;
        Some(rest.split(' ').next()?.to_string())
    }

    fn is_null(&self, name: &str) -> bool {
        self.null_arg().as_deref() == Some(name)
    }

    fn req(&self, k: &str) -> Result<Option<skv_req>, Stop> {
        self.req_value(k, &self.v[k])
    }

    fn req_value(&self, k: &str, r: &Value) -> Result<Option<skv_req>, Stop> {
        if r.is_null() {
            return Ok(None);
        }
        let mut q = skv_req::default();
        for f in &skv_req::FIELDS {
            let Some(v) = self.recorded_field(k, r, f)? else { continue };
            if !(f.set)(&mut q, v) {
                return Err(self.cannot(format!("{k}.{} {v} out of range", f.name)));
            }
        }
        Ok(Some(q))
    }

    /// A req's field as recorded; `None` for a field newer than the trace (`NEWER_REQ_FIELDS`).
    fn recorded_field(&self, k: &str, r: &Value, f: &ReqField) -> Result<Option<FieldValue>, Stop> {
        let name = f.name;
        match r.get(name) {
            None if NEWER_REQ_FIELDS.contains(&name) => Ok(None),
            None => Err(self.cannot(format!("{k}.{name} missing"))),
            Some(v) => field_value(v).map(Some).ok_or_else(|| self.cannot(format!("{k}.{name} = {v}: not a value"))),
        }
    }

    /// An input array as the values the call takes (`None` for a recorded NULL).
    fn list<T: TryFrom<i128>>(&self, k: &str) -> Result<Option<Vec<T>>, Stop> {
        self.whole(k)?;
        let a = match &self.v[k] {
            Value::Null => return Ok(None),
            Value::Array(a) => a,
            _ => return Err(self.cannot(format!("{k}: not an array"))),
        };
        let mut out = Vec::new();
        out.try_reserve_exact(a.len()).map_err(|e| self.cannot(format!("{k} of {} values: {e}", a.len())))?;
        for (i, x) in a.iter().enumerate() {
            out.push(
                int(x)
                    .and_then(|n| T::try_from(n).ok())
                    .ok_or_else(|| self.cannot(format!("{k}[{i}] = {x}: out of range")))?,
            );
        }
        Ok(Some(out))
    }

    /// Refuses an array the trace cut (`"<k>_cut_at"`), which the replay needs whole: as the
    /// call's input, or to compare the call's output with.
    fn whole(&self, k: &str) -> Result<(), Stop> {
        let Some(kept) = self.v.get(format!("{k}_cut_at")) else { return Ok(()) };
        let len = self.v.get(format!("{k}_full_len")).map_or("more".into(), Value::to_string);
        Err(self.cannot(format!("{k} was cut in the trace: {kept} of {len} values kept")))
    }

    /// A recorded output array `k`, if any, must hold the `n` values the call writes to be
    /// compared with them.
    fn stored(&self, k: &str, n: usize) -> Result<(), Stop> {
        self.whole(k)?;
        match self.v.get(k) {
            None => Ok(()),
            Some(Value::Array(a)) if a.len() == n => Ok(()),
            Some(Value::Array(a)) => {
                Err(self.cannot(format!("{k}: the trace holds {} values, the call writes {n}", a.len())))
            }
            Some(w) => Err(self.cannot(format!("{k} = {w}: not an array"))),
        }
    }

    /// `n` zeroed values for the call to write, or "cannot replay" when the replay cannot hold
    /// them.
    fn zeroed<T: Copy + Default>(&self, k: &str, n: usize) -> Result<Vec<T>, Stop> {
        if n > MAX_VALUES {
            return Err(self.cannot(format!("{k} of {n} values: more than the replay holds ({MAX_VALUES})")));
        }
        let mut v = Vec::new();
        v.try_reserve_exact(n).map_err(|e| self.cannot(format!("{k} of {n} values: {e}")))?;
        v.resize(n, T::default());
        Ok(v)
    }

    /// The buffer of `n` values an output argument `k` is replayed with: none (NULL) where the
    /// recording names `k` NULL.
    fn out<T: Copy + Default>(&self, k: &str, n: usize) -> Result<Option<Vec<T>>, Stop> {
        if self.is_null(k) {
            return Ok(None);
        }
        self.zeroed(k, n).map(Some)
    }

    fn differs(&self, what: String) -> Stop {
        Stop::Differs(format!("line {}: {}: {what}", self.line, self.f()))
    }

    /// The status first, then (for a call that completed) every output the trace recorded.
    fn check_status(&self, st: skv_status) -> Result<bool, Stop> {
        let want = self.v["status"].as_str().unwrap_or("?");
        let got = st.name();
        if got != want {
            let err = if st == skv_status::SKV_OK { String::new() } else { format!(" ({})", last_error_message()) };
            return Err(self.differs(format!("status {got}{err}, recorded {want} ({})", self.v["error"])));
        }
        Ok(matches!(st, skv_status::SKV_OK | skv_status::SKV_ERR_CALLBACK))
    }

    fn check_req(&self, k: &str, got: Option<&skv_req>) -> Result<(), Stop> {
        let (Some(want), Some(got)) = (self.v.get(k), got) else { return Ok(()) };
        for f in &skv_req::FIELDS {
            let g = (f.get)(got);
            let w = match self.recorded_field(k, want, f) {
                Ok(w) => w.unwrap_or((f.get)(&skv_req::default())),
                Err(_) => return Err(self.differs(format!("{k}.{} = {g}, recorded {}", f.name, want[f.name]))),
            };
            if g != w {
                return Err(self.differs(format!("{k}.{} = {g}, recorded {}", f.name, want[f.name])));
            }
        }
        Ok(())
    }

    fn check_num(&self, k: &str, got: i128) -> Result<(), Stop> {
        match self.v.get(k) {
            Some(w) if int(w) != Some(got) => Err(self.differs(format!("{k} = {got}, recorded {w}"))),
            _ => Ok(()),
        }
    }

    fn check_list<T: Copy + Into<i128>>(&self, k: &str, got: &[T]) -> Result<(), Stop> {
        let Some(want) = self.v.get(k) else { return Ok(()) };
        let Some(want) = want.as_array() else { return Err(self.cannot(format!("{k} = {want}: not an array"))) };
        if want.len() != got.len() {
            return Err(self.differs(format!("{k} has {} values, recorded {}", got.len(), want.len())));
        }
        for (i, (w, &g)) in want.iter().zip(got).enumerate() {
            if int(w) != Some(g.into()) {
                return Err(self.differs(format!("{k}[{i}] = {}, recorded {w}", g.into())));
            }
        }
        Ok(())
    }

    /// Replays a call that takes a req: NULL when recorded so, compared after.
    fn with_req(&self, call: impl FnOnce(*mut skv_req) -> skv_status) -> Result<(bool, Option<skv_req>), Stop> {
        let mut r = self.req("req")?;
        let before = r;
        let p = r.as_mut().map_or(null_mut(), |r| r as *mut skv_req);
        let done = self.check_status(call(p))?;
        if done {
            self.check_req("req_out", r.as_ref())?;
        } else if r != before {
            return Err(self.differs("a failed call changed the req".into()));
        }
        Ok((done, r))
    }

    fn run(&self) -> Result<(), Stop> {
        let c = self.c;
        // SAFETY: every call below gets a live handle, buffers of at least the length passed
        // with them, and NULL where the recording names a NULL argument.
        unsafe {
            match self.f() {
                "skv_alloc_row" => {
                    self.with_req(|r| skv_alloc_row(c, r))?;
                }
                "skv_alloc_extend" => {
                    // out_loc is optional and its slots are not compared: NULL.
                    let n = self.arg("n_tokens")?;
                    self.with_req(|r| skv_alloc_extend(c, r, n, null_mut()))?;
                }
                "skv_commit" => {
                    let n = self.arg("n_tokens")?;
                    self.with_req(|r| skv_commit(c, r, n))?;
                }
                "skv_free_req" => {
                    self.with_req(|r| skv_free_req(c, r))?;
                }
                "skv_trim_overshoot" => {
                    let n = self.arg("finished_len")?;
                    self.with_req(|r| skv_trim_overshoot(c, r, n))?;
                }
                "skv_swa_evict" => {
                    let (pre, w) = (self.arg("pre_len")?, self.arg("window")?);
                    let (iv, f) = (self.arg("eviction_interval")?, self.arg("flags")?);
                    let retain = self.arg("retain_floor")?;
                    let mut freed = 0u32;
                    self.with_req(|r| skv_swa_evict(c, r, pre, w, iv, retain, f, &mut freed))?;
                }
                "skv_free_tail" => {
                    let n = self.arg("prefix_len")?;
                    self.with_req(|r| skv_free_tail(c, r, n))?;
                }
                "skv_publish_prefix" => {
                    let n = self.arg("new_protected_len")?;
                    self.with_req(|r| skv_publish_prefix(c, r, n))?;
                }
                "skv_map_prefix" => {
                    let idx = self.list::<i32>("indices")?;
                    let (p, n) = input(&idx);
                    let n = u32::try_from(n).map_err(|_| self.cannot(format!("indices of {n} values")))?;
                    self.with_req(|r| skv_map_prefix(c, r, p, n))?;
                }
                "skv_match_prefix" => {
                    let (s, b) = (self.arg("session_id")?, self.arg("branch_id")?);
                    let (key, pre) = (self.arg("key_len")?, self.arg("pre_aborted")?);
                    let mut m = skv_match { hit: 0, prefix_len: 0 };
                    let mp = if self.is_null("out") { null_mut() } else { &mut m as *mut skv_match };
                    let (done, _) = self.with_req(|r| skv_match_prefix(c, s, b, r, key, pre, mp))?;
                    if done {
                        let out = &self.v["out"];
                        if int(&out["hit"]) != Some(m.hit.into())
                            || int(&out["prefix_len"]) != Some(m.prefix_len.into())
                        {
                            return Err(self.differs(format!("out = {m:?}, recorded {out}")));
                        }
                    }
                }
                "skv_cache_finished_req" => {
                    let (s, b, a) = (self.arg("session_id")?, self.arg("branch_id")?, self.arg("aborted")?);
                    self.with_req(|r| skv_cache_finished_req(c, s, b, r, a))?;
                }
                "skv_hand_back" => {
                    let (s, b) = (self.arg("session_id")?, self.arg("branch_id")?);
                    self.with_req(|r| skv_hand_back(c, s, b, r))?;
                }
                // The queries change nothing: their status is what replay can hold them to.
                f @ ("skv_session_usage" | "skv_branch_usage") => {
                    let s = self.arg("session_id")?;
                    let mut u = std::mem::zeroed::<skv_usage>();
                    let st = match f {
                        "skv_session_usage" => skv_session_usage(c, s, &mut u),
                        _ => skv_branch_usage(c, s, self.arg("branch_id")?, &mut u),
                    };
                    if self.check_status(st)? {
                        self.check_num("slots", u.slots.into())?;
                        self.check_num("pages", u.pages.into())?;
                    }
                }
                "skv_idle_sessions" => self.idle_sessions()?,
                "skv_admission_pages" => {
                    let (s, b) = (self.arg("session_id")?, self.arg("branch_id")?);
                    let (key, total) = (self.arg("key_len")?, self.arg("total_len")?);
                    let mut a = std::mem::zeroed::<skv_admission>();
                    if self.check_status(skv_admission_pages(c, s, b, key, total, &mut a))? {
                        self.check_num("pages_needed", a.pages_needed.into())?;
                    }
                }
                "skv_checkpoint" => {
                    let (s, b) = (self.arg("session_id")?, self.arg("branch_id")?);
                    let mut handled = 0u32;
                    let hp = if self.is_null("handled") { null_mut() } else { &mut handled as *mut u32 };
                    let (done, _) = self.with_req(|r| skv_checkpoint(c, s, b, r, hp))?;
                    if done {
                        self.check_num("handled", handled.into())?;
                    }
                }
                "skv_release_session" => {
                    self.check_status(skv_release_session(c, self.arg("session_id")?))?;
                }
                "skv_release_branch" => {
                    self.check_status(skv_release_branch(c, self.arg("session_id")?, self.arg("branch_id")?))?;
                }
                "skv_free_aligned" => {
                    let st = skv_free_aligned(c, self.arg("row")?, self.arg("target")?, self.arg("end")?);
                    self.check_status(st)?;
                }
                "skv_session_held" => {
                    let rows = self.list::<i32>("active_rows")?;
                    let (p, n) = input(&rows);
                    let mut h = std::mem::zeroed::<skv_held>();
                    let hp = if self.is_null("out") { null_mut() } else { &mut h as *mut skv_held };
                    if self.check_status(skv_session_held(c, p, n, hp))? {
                        let out = &self.v["out"];
                        let got = [h.full_tokens, h.swa_tokens, h.rows, h.aux_states, h.sessions, h.aux_handles];
                        let names = ["full_tokens", "swa_tokens", "rows", "aux_states", "sessions", "aux_handles"];
                        for (name, g) in names.iter().zip(got) {
                            // A trace older than aux_handles does not record it.
                            if out.get(name).is_none() && *name == "aux_handles" {
                                continue;
                            }
                            if int(&out[name]) != Some(g.into()) {
                                return Err(self.differs(format!("out.{name} = {g}, recorded {}", out[name])));
                            }
                        }
                    }
                }
                "skv_pool_alloc" => {
                    let n: u32 = self.arg("n_tokens")?;
                    self.stored("out_indices", n as usize)?;
                    let mut out = self.out::<i32>("out_indices", n as usize)?;
                    if self.check_status(skv_pool_alloc(c, n, ptr(&mut out)))? {
                        self.check_list("out_indices", out.as_deref().unwrap_or(&[]))?;
                    }
                }
                "skv_pool_free" => {
                    let idx = self.list::<i32>("indices")?;
                    let (p, n) = input(&idx);
                    self.check_status(skv_pool_free(c, p, n))?;
                }
                "skv_page_refs" => {
                    let idx = self.list::<i32>("indices")?;
                    let (p, n) = input(&idx);
                    self.stored("out_counts", n)?;
                    let mut out = self.out::<u32>("out_counts", n)?;
                    if self.check_status(skv_page_refs(c, p, n, ptr(&mut out)))? {
                        self.check_list("out_counts", out.as_deref().unwrap_or(&[]))?;
                    }
                }
                f @ ("skv_row_indices" | "skv_row_swa_indices") => {
                    let view = if f == "skv_row_indices" { skv_row_indices } else { skv_row_swa_indices };
                    let (start, end): (u32, u32) = (self.arg("start")?, self.arg("end")?);
                    let n = end.saturating_sub(start) as usize;
                    self.stored("out", n)?;
                    let mut out = self.out::<i32>("out", n)?;
                    if self.check_status(view(c, self.arg("row")?, start, end, ptr(&mut out)))? {
                        self.check_list("out", out.as_deref().unwrap_or(&[]))?;
                    }
                }
                f @ ("skv_build_flashinfer" | "skv_build_flashinfer_swa") => self.flashinfer(f)?,
                "skv_cache_stats" => {
                    let mut s = std::mem::zeroed::<skv_stats>();
                    let sp = if self.is_null("out") { null_mut() } else { &mut s as *mut skv_stats };
                    if self.check_status(skv_cache_stats(c, sp))? {
                        self.check_num("free_pages", s.free_pages.into())?;
                        self.check_num("free_rows", s.free_rows.into())?;
                        self.check_num("sessions", s.sessions.into())?;
                        self.check_num("swa_free_pages", s.swa_free_pages.into())?;
                    }
                }
                "skv_cache_check" => {
                    let mut r = std::mem::zeroed::<skv_check_report>();
                    let rp = if self.is_null("out") { null_mut() } else { &mut r as *mut skv_check_report };
                    if self.check_status(skv_cache_check(c, rp))? {
                        self.check_num("violations", r.violations.into())?;
                    }
                }
                "skv_cache_set_hooks" => {
                    let on = |k: &str| self.v[k] == 1;
                    let hooks = skv_engine_hooks {
                        struct_size: std::mem::size_of::<skv_engine_hooks>() as u32,
                        dec_lock_ref: on("dec_lock_ref").then_some(hook_lock as _),
                        free_aux: on("free_aux").then_some(hook_aux as _),
                        ..Default::default()
                    };
                    let hp = if on("hooks") { &hooks as *const skv_engine_hooks } else { null() };
                    self.check_status(skv_cache_set_hooks(c, hp, null_mut()))?;
                }
                f @ ("skv_alloc_extend_batch" | "skv_commit_batch") => self.batch(f)?,
                other => return Err(cannot(self.line, format!("{other}: not a call replay knows"))),
            }
        }
        Ok(())
    }

    /// skv_idle_sessions: its status (the ids are not compared).
    fn idle_sessions(&self) -> Result<(), Stop> {
        let cap: usize = self.arg("cap")?;
        let (mut sids, mut bids) = (self.out::<u64>("session_ids", cap)?, self.out::<u64>("branch_ids", cap)?);
        let mut count = 0usize;
        let np = if self.is_null("count") { null_mut() } else { &mut count as *mut usize };
        // SAFETY: a live handle; both buffers NULL or cap values; np NULL or valid.
        let st = unsafe { skv_idle_sessions(self.c, ptr(&mut sids), ptr(&mut bids), cap, np) };
        self.check_status(st)?;
        Ok(())
    }

    /// skv_build_flashinfer and its SWA twin: kv_indices gets the `cap` values the call was
    /// given, whose first `needed` the trace records.
    fn flashinfer(&self, f: &str) -> Result<(), Stop> {
        let build = if f == "skv_build_flashinfer" { skv_build_flashinfer } else { skv_build_flashinfer_swa };
        let rows = self.list::<i32>("rows")?;
        let (p, n) = input(&rows);
        let cap: usize = self.arg("cap")?;
        self.stored("kv_indptr", n + 1)?;
        self.stored("kv_last_page_len", n)?;
        if self.v.get("needed").is_some() {
            self.stored("kv_indices", self.arg("needed")?)?;
        }
        let mut indptr = self.out::<i32>("kv_indptr", n + 1)?;
        let mut last = self.out::<i32>("kv_last_page_len", n)?;
        let mut idx = self.out::<i32>("kv_indices", cap)?;
        let mut needed = 0usize;
        let np = if self.is_null("needed") { null_mut() } else { &mut needed as *mut usize };
        // SAFETY: a live handle; rows n values; each buffer NULL or the length passed for it
        // (kv_indptr n+1, kv_indices cap, kv_last_page_len n); np NULL or valid.
        let st = unsafe { build(self.c, p, n, ptr(&mut indptr), ptr(&mut idx), ptr(&mut last), cap, np) };
        if self.check_status(st)? {
            self.check_num("needed", needed as i128)?;
            self.check_list("kv_indptr", indptr.as_deref().unwrap_or(&[]))?;
            let idx = idx.as_deref().unwrap_or(&[]);
            self.check_list("kv_indices", &idx[..needed.min(idx.len())])?;
            self.check_list("kv_last_page_len", last.as_deref().unwrap_or(&[]))?;
        }
        Ok(())
    }

    /// A batch call records its arrays only when it succeeds (the inputs are the outputs less
    /// n_tokens); a failed one changed nothing, so replay passes over it.
    fn batch(&self, f: &str) -> Result<(), Stop> {
        if self.v["status"].as_str() != Some("SKV_OK") {
            return Ok(());
        }
        let commit = f == "skv_commit_batch";
        let counts = self.list::<u32>("n_tokens")?.unwrap_or_default();
        self.whole("reqs_out")?;
        let outs = match &self.v["reqs_out"] {
            Value::Null => &[][..],
            Value::Array(a) => a,
            _ => return Err(self.cannot("reqs_out: not an array")),
        };
        if outs.len() != counts.len() {
            return Err(self.cannot(format!("reqs_out holds {} reqs, n_tokens {} values", outs.len(), counts.len())));
        }
        if self.v.get("n").is_some() && self.arg::<usize>("n")? != counts.len() {
            return Err(self.cannot(format!("n is {}, the trace holds {} reqs", self.v["n"], counts.len())));
        }
        let mut reqs = Vec::new();
        reqs.try_reserve_exact(outs.len()).map_err(|e| self.cannot(format!("{} reqs: {e}", outs.len())))?;
        for (i, (o, &n)) in outs.iter().zip(&counts).enumerate() {
            let Some(mut r) = self.req_value("reqs_out", o)? else {
                return Err(self.cannot(format!("reqs_out[{i}] is not a req")));
            };
            let (name, len) = match commit {
                true => ("kv_committed_len", &mut r.kv_committed_len),
                false => ("kv_allocated_len", &mut r.kv_allocated_len),
            };
            *len = len
                .checked_sub(n)
                .ok_or_else(|| self.cannot(format!("reqs_out[{i}].{name} {len} is less than n_tokens[{i}] {n}")))?;
            reqs.push(r);
        }
        // "out_loc" is the flag the arguments record (0 for NULL; the slots written replace it
        // when it was given, and are not compared). A successful call wrote `total` slots, so a
        // buffer of `total` stands for the engine's (whose out_cap was at least that).
        let (mut loc, mut out_cap) = (None, 0);
        if !commit {
            let total = counts.iter().try_fold(0usize, |t, &k| t.checked_add(k as usize));
            let total = total.ok_or_else(|| self.cannot("n_tokens add up past usize"))?;
            if int(&self.v["out_loc"]) == Some(0) {
                out_cap = if self.v.get("out_cap").is_some() { self.arg("out_cap")? } else { 0 };
            } else {
                loc = Some(self.zeroed::<i32>("out_loc", total)?);
                out_cap = total;
            }
        }
        let (rp, n, np) = (reqs.as_mut_ptr(), reqs.len(), counts.as_ptr());
        // SAFETY: a live handle; reqs and n_tokens n values each; out_loc NULL or out_cap values.
        let st = unsafe {
            match commit {
                true => skv_commit_batch(self.c, rp, n, np),
                false => skv_alloc_extend_batch(self.c, rp, n, np, ptr(&mut loc), out_cap),
            }
        };
        self.check_status(st)?;
        for (i, (got, w)) in reqs.iter().zip(outs).enumerate() {
            if self.req_value("reqs_out", w)?.as_ref() != Some(got) {
                return Err(self.differs(format!("reqs_out[{i}] = {got:?}, recorded {w}")));
            }
        }
        Ok(())
    }
}

/// An input array as the call takes it: `(NULL, 0)` for a recorded NULL.
fn input<T>(v: &Option<Vec<T>>) -> (*const T, usize) {
    v.as_ref().map_or((null(), 0), |v| (v.as_ptr(), v.len()))
}

/// An output buffer as the call takes it: NULL for none.
fn ptr<T>(v: &mut Option<Vec<T>>) -> *mut T {
    v.as_mut().map_or(null_mut(), |v| v.as_mut_ptr())
}
