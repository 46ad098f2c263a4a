//! `skv-sim replay FILE.jsonl`: re-runs a call trace (SKV_TRACE / skv_cache_set_trace) against
//! fresh handles of the recorded configs, call by call, and reports the first call whose
//! status, outputs or req differ from the recording, or the first audit violation, with its
//! line number. Exit 0 when every call matches, 1 at the first difference, 2 when the trace
//! cannot be replayed.
//!
//! Owned-mode traces replay fully. The engine hooks (skv_cache_set_hooks) are replaced by hooks
//! that succeed, so a recorded SKV_ERR_CALLBACK of a failing hook shows as a difference.
//! External-mode traces are refused: the trace records the calls, not the engine's
//! `req_to_token` rows that libskv reads back through `read_row`, so the indices handed to
//! `free_kv` cannot be reproduced.

use std::collections::HashMap;
use std::ffi::{c_int, c_void, CStr};
use std::process::ExitCode;
use std::ptr::{null, null_mut};

use serde_json::Value;
use skv::*;

/// The fields of `skv_req` a trace spells out, in its order.
const REQ_FIELDS: [&str; 12] = [
    "req_pool_idx",
    "row_generation",
    "kv_committed_len",
    "kv_allocated_len",
    "cache_protected_len",
    "swa_evicted_seqlen",
    "origin_input_len",
    "output_len",
    "finished_len",
    "lock_node",
    "lock_receipt",
    "aux_state",
];

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
        Err(Fault::Differs(msg)) => {
            println!("skv-sim replay: FAIL: {msg}");
            ExitCode::from(1)
        }
        Err(Fault::Cannot(msg)) => {
            eprintln!("skv-sim replay: {msg}");
            ExitCode::from(2)
        }
    })
}

enum Fault {
    /// The replay disagrees with the recording (or the audit found a violation).
    Differs(String),
    /// The trace cannot be replayed at all.
    Cannot(String),
}

fn cannot(line: usize, msg: impl std::fmt::Display) -> Fault {
    Fault::Cannot(format!("line {line}: {msg}"))
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

fn replay_file(path: &str) -> Result<String, Fault> {
    let text = std::fs::read_to_string(path).map_err(|e| Fault::Cannot(format!("{path}: {e}")))?;
    let mut handles = Handles(HashMap::new());
    let mut calls = 0u64;
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        if raw.trim().is_empty() {
            continue;
        }
        let v: Value = serde_json::from_str(raw).map_err(|e| cannot(line, format!("not JSON: {e}")))?;
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
fn open(v: &Value, line: usize) -> Result<*mut skv_cache, Fault> {
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
    let cfg = skv_cache_config {
        struct_size: std::mem::size_of::<skv_cache_config>() as u32,
        page_size: num("page_size")? as u32,
        num_token_slots: num("num_token_slots")?,
        num_rows: num("num_rows")? as u32,
        max_context_len: num("max_context_len")? as u32,
        flags: if v["aligned_reuse"] == true { SKV_FLAG_ALIGNED_REUSE } else { 0 },
        // Traces from before the SWA pool have no such key: no SWA pool.
        swa_num_token_slots: v["swa_num_token_slots"].as_u64().unwrap_or(0),
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

fn audit(c: *mut skv_cache, line: usize, f: &str) -> Result<(), Fault> {
    // SAFETY: a live handle and a valid out-pointer.
    unsafe {
        let mut rep = std::mem::zeroed::<skv_check_report>();
        let st = skv_cache_check(c, &mut rep);
        if st != skv_status::SKV_OK || rep.violations != 0 {
            let first = CStr::from_ptr(rep.first_violation.as_ptr()).to_string_lossy().into_owned();
            return Err(Fault::Differs(format!(
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

/// A req's `aux_track` pair; a trace older than the field records none (both empty).
fn track(v: &Value) -> Option<[i64; 2]> {
    match v {
        Value::Null => Some([-1, -1]),
        Value::Array(a) if a.len() == 2 => Some([a[0].as_i64()?, a[1].as_i64()?]),
        _ => None,
    }
}

impl Call<'_> {
    fn f(&self) -> &str {
        self.v["fn"].as_str().unwrap_or("?")
    }

    fn num(&self, k: &str) -> Result<i128, Fault> {
        int(&self.v[k]).ok_or_else(|| cannot(self.line, format!("{}: no number \"{k}\"", self.f())))
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

    fn req(&self, k: &str) -> Result<Option<skv_req>, Fault> {
        self.req_value(k, &self.v[k])
    }

    fn req_value(&self, k: &str, r: &Value) -> Result<Option<skv_req>, Fault> {
        if r.is_null() {
            return Ok(None);
        }
        let mut q = std::mem::MaybeUninit::<skv_req>::zeroed();
        // SAFETY: skv_req_init writes every field.
        let mut q = unsafe {
            skv_req_init(q.as_mut_ptr());
            q.assume_init()
        };
        let field = |name: &str| int(&r[name]).ok_or_else(|| cannot(self.line, format!("{k}.{name} missing")));
        q.req_pool_idx = field("req_pool_idx")? as i32;
        q.row_generation = field("row_generation")? as u32;
        q.kv_committed_len = field("kv_committed_len")? as u32;
        q.kv_allocated_len = field("kv_allocated_len")? as u32;
        q.cache_protected_len = field("cache_protected_len")? as u32;
        q.swa_evicted_seqlen = field("swa_evicted_seqlen")? as u32;
        q.origin_input_len = field("origin_input_len")? as u32;
        q.output_len = field("output_len")? as u32;
        q.finished_len = field("finished_len")? as i32;
        q.lock_node = field("lock_node")? as u64;
        q.lock_receipt = field("lock_receipt")? as u64;
        q.aux_state = field("aux_state")? as i64;
        q.aux_track =
            track(&r["aux_track"]).ok_or_else(|| cannot(self.line, format!("{k}.aux_track: not two numbers")))?;
        // Traces from before the field read as 0, the value every req had then.
        q.swa_evict_floor = int(&r["swa_evict_floor"]).unwrap_or(0) as u32;
        Ok(Some(q))
    }

    fn list(&self, k: &str) -> Result<Option<Vec<i32>>, Fault> {
        if self.v.get(format!("{k}_cut_at")).is_some() {
            return Err(cannot(self.line, format!("{}: {k} was cut short in the trace", self.f())));
        }
        match &self.v[k] {
            Value::Null => Ok(None),
            Value::Array(a) => a
                .iter()
                .map(|x| int(x).map(|n| n as i32).ok_or_else(|| cannot(self.line, format!("{k}: not a number"))))
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            _ => Err(cannot(self.line, format!("{k}: not an array"))),
        }
    }

    fn differs(&self, what: String) -> Fault {
        Fault::Differs(format!("line {}: {}: {what}", self.line, self.f()))
    }

    /// The status first, then (for a call that completed) every output the trace recorded.
    fn check_status(&self, st: skv_status) -> Result<bool, Fault> {
        let want = self.v["status"].as_str().unwrap_or("?");
        let got = st.name();
        if got != want {
            let err = if st == skv_status::SKV_OK { String::new() } else { format!(" ({})", last_error_message()) };
            return Err(self.differs(format!("status {got}{err}, recorded {want} ({})", self.v["error"])));
        }
        Ok(matches!(st, skv_status::SKV_OK | skv_status::SKV_ERR_CALLBACK))
    }

    fn check_req(&self, k: &str, got: Option<&skv_req>) -> Result<(), Fault> {
        let (Some(want), Some(got)) = (self.v.get(k), got) else { return Ok(()) };
        let got_track = got.aux_track;
        let got_floor = got.swa_evict_floor;
        let got = [
            got.req_pool_idx as i128,
            got.row_generation as i128,
            got.kv_committed_len as i128,
            got.kv_allocated_len as i128,
            got.cache_protected_len as i128,
            got.swa_evicted_seqlen as i128,
            got.origin_input_len as i128,
            got.output_len as i128,
            got.finished_len as i128,
            got.lock_node as i128,
            got.lock_receipt as i128,
            got.aux_state as i128,
        ];
        for (name, g) in REQ_FIELDS.iter().zip(got) {
            if int(&want[name]) != Some(g) {
                return Err(self.differs(format!("{k}.{name} = {g}, recorded {}", want[name])));
            }
        }
        if track(&want["aux_track"]) != Some(got_track) {
            return Err(self.differs(format!("{k}.aux_track = {got_track:?}, recorded {}", want["aux_track"])));
        }
        let floor = got_floor as i128;
        match int(&want["swa_evict_floor"]) {
            Some(w) if w != floor => {
                Err(self.differs(format!("{k}.swa_evict_floor = {floor}, recorded {}", want["swa_evict_floor"])))
            }
            _ => Ok(()),
        }
    }

    fn check_num(&self, k: &str, got: i128) -> Result<(), Fault> {
        match self.v.get(k) {
            Some(w) if int(w) != Some(got) => Err(self.differs(format!("{k} = {got}, recorded {w}"))),
            _ => Ok(()),
        }
    }

    fn check_list<T: Copy + Into<i128>>(&self, k: &str, got: &[T]) -> Result<(), Fault> {
        let Some(want) = self.v.get(k) else { return Ok(()) };
        let got: Vec<i128> = got.iter().map(|&x| x.into()).collect();
        let want: Vec<i128> = want.as_array().map(|a| a.iter().filter_map(int).collect()).unwrap_or_default();
        if got != want {
            return Err(self.differs(format!("{k} = {got:?}, recorded {want:?}")));
        }
        Ok(())
    }

    /// Replays a call that takes a req: NULL when recorded so, compared after.
    fn with_req(&self, call: impl FnOnce(*mut skv_req) -> skv_status) -> Result<(bool, Option<skv_req>), Fault> {
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

    fn run(&self) -> Result<(), Fault> {
        let c = self.c;
        let u32_ = |k: &str| self.num(k).map(|n| n as u32);
        let u64_ = |k: &str| self.num(k).map(|n| n as u64);
        // SAFETY: every call below gets a live handle, buffers sized as each call requires, and
        // NULL where the recording names a NULL argument.
        unsafe {
            match self.f() {
                "skv_alloc_row" => {
                    self.with_req(|r| skv_alloc_row(c, r))?;
                }
                "skv_alloc_extend" => {
                    let n = u32_("n_tokens")?;
                    self.with_req(|r| skv_alloc_extend(c, r, n, std::ptr::null_mut()))?;
                }
                "skv_commit" => {
                    let n = u32_("n_tokens")?;
                    self.with_req(|r| skv_commit(c, r, n))?;
                }
                "skv_free_req" => {
                    self.with_req(|r| skv_free_req(c, r))?;
                }
                "skv_trim_overshoot" => {
                    let n = u32_("finished_len")?;
                    self.with_req(|r| skv_trim_overshoot(c, r, n))?;
                }
                "skv_swa_evict" => {
                    let (pre, w, iv, f) =
                        (u32_("pre_len")?, u32_("window")?, u32_("eviction_interval")?, u32_("flags")?);
                    let retain = self.num("retain_floor")? as i64;
                    let mut freed = 0u32;
                    self.with_req(|r| skv_swa_evict(c, r, pre, w, iv, retain, f, &mut freed))?;
                }
                "skv_free_tail" => {
                    let n = u32_("prefix_len")?;
                    self.with_req(|r| skv_free_tail(c, r, n))?;
                }
                "skv_publish_prefix" => {
                    let n = u32_("new_protected_len")?;
                    self.with_req(|r| skv_publish_prefix(c, r, n))?;
                }
                "skv_map_prefix" => {
                    let idx = self.list("indices")?;
                    let n = idx.as_ref().map_or(0, |v| v.len() as u32);
                    let p = idx.as_ref().map_or(null(), |v| v.as_ptr());
                    self.with_req(|r| skv_map_prefix(c, r, p, n))?;
                }
                "skv_match_prefix" => {
                    let (s, b, key, pre) =
                        (u64_("session_id")?, u64_("branch_id")?, u32_("key_len")?, u32_("pre_aborted")?);
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
                    let (s, b, a) = (u64_("session_id")?, u64_("branch_id")?, u32_("aborted")?);
                    self.with_req(|r| skv_cache_finished_req(c, s, b, r, a))?;
                }
                "skv_hand_back" => {
                    let (s, b) = (u64_("session_id")?, u64_("branch_id")?);
                    self.with_req(|r| skv_hand_back(c, s, b, r))?;
                }
                // The queries change nothing: their status is what replay can hold them to.
                f @ ("skv_session_usage" | "skv_branch_usage") => {
                    let s = u64_("session_id")?;
                    let mut u = std::mem::zeroed::<skv_usage>();
                    let st = match f {
                        "skv_session_usage" => skv_session_usage(c, s, &mut u),
                        _ => skv_branch_usage(c, s, u64_("branch_id")?, &mut u),
                    };
                    if self.check_status(st)? {
                        self.check_num("slots", u.slots.into())?;
                        self.check_num("pages", u.pages.into())?;
                    }
                }
                "skv_idle_sessions" => {
                    let cap = (self.num("cap")? as usize).min(1 << 20);
                    let (mut sids, mut bids, mut n) = (vec![0u64; cap], vec![0u64; cap], 0usize);
                    let st = skv_idle_sessions(c, sids.as_mut_ptr(), bids.as_mut_ptr(), cap, &mut n);
                    self.check_status(st)?;
                }
                "skv_admission_pages" => {
                    let (s, b) = (u64_("session_id")?, u64_("branch_id")?);
                    let mut a = std::mem::zeroed::<skv_admission>();
                    let st = skv_admission_pages(c, s, b, u32_("key_len")?, u32_("total_len")?, &mut a);
                    if self.check_status(st)? {
                        self.check_num("pages_needed", a.pages_needed.into())?;
                    }
                }
                "skv_checkpoint" => {
                    let (s, b) = (u64_("session_id")?, u64_("branch_id")?);
                    let mut handled = 0u32;
                    let hp = if self.is_null("handled") { null_mut() } else { &mut handled as *mut u32 };
                    let (done, _) = self.with_req(|r| skv_checkpoint(c, s, b, r, hp))?;
                    if done {
                        self.check_num("handled", handled.into())?;
                    }
                }
                "skv_release_session" => {
                    self.check_status(skv_release_session(c, u64_("session_id")?))?;
                }
                "skv_release_branch" => {
                    self.check_status(skv_release_branch(c, u64_("session_id")?, u64_("branch_id")?))?;
                }
                "skv_free_aligned" => {
                    let st = skv_free_aligned(c, self.num("row")? as i32, u32_("target")?, u32_("end")?);
                    self.check_status(st)?;
                }
                "skv_session_held" => {
                    let rows = self.list("active_rows")?;
                    let (p, n) = rows.as_ref().map_or((null(), 0), |v| (v.as_ptr(), v.len()));
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
                    let n = u32_("n_tokens")?;
                    // A count no pool can grant is refused before anything is written.
                    let mut out = vec![0i32; (n as usize).min(1 << 24)];
                    let p = if self.is_null("out_indices") { null_mut() } else { out.as_mut_ptr() };
                    if self.check_status(skv_pool_alloc(c, n, p))? {
                        self.check_list("out_indices", &out)?;
                    }
                }
                "skv_pool_free" => {
                    let idx = self.list("indices")?;
                    let (p, n) = idx.as_ref().map_or((null(), 0), |v| (v.as_ptr(), v.len()));
                    self.check_status(skv_pool_free(c, p, n))?;
                }
                "skv_page_refs" => {
                    let idx = self.list("indices")?;
                    let (p, n) = idx.as_ref().map_or((null(), 0), |v| (v.as_ptr(), v.len()));
                    let mut out = vec![0u32; n];
                    let op = if self.is_null("out_counts") { null_mut() } else { out.as_mut_ptr() };
                    if self.check_status(skv_page_refs(c, p, n, op))? {
                        self.check_list("out_counts", &out)?;
                    }
                }
                "skv_row_indices" => {
                    let (start, end) = (u32_("start")?, u32_("end")?);
                    // No row maps more than max_context_len tokens: a longer range is refused
                    // before anything is written.
                    let mut out = vec![0i32; (end.saturating_sub(start) as usize).min(1 << 24)];
                    let p = if self.is_null("out") { null_mut() } else { out.as_mut_ptr() };
                    if self.check_status(skv_row_indices(c, self.num("row")? as i32, start, end, p))? {
                        self.check_list("out", &out)?;
                    }
                }
                "skv_build_flashinfer" => {
                    let rows = self.list("rows")?;
                    let (p, n) = rows.as_ref().map_or((null(), 0), |v| (v.as_ptr(), v.len()));
                    let cap = self.num("cap")? as usize;
                    let (mut indptr, mut last) = (vec![0i32; n + 1], vec![0i32; n]);
                    let mut idx = vec![0i32; cap.min(1 << 24)];
                    let mut needed = 0usize;
                    let np = if self.is_null("needed") { null_mut() } else { &mut needed as *mut usize };
                    let st = skv_build_flashinfer(
                        c,
                        p,
                        n,
                        indptr.as_mut_ptr(),
                        idx.as_mut_ptr(),
                        last.as_mut_ptr(),
                        cap,
                        np,
                    );
                    if self.check_status(st)? {
                        self.check_num("needed", needed as i128)?;
                        self.check_list("kv_indptr", &indptr)?;
                        self.check_list("kv_indices", &idx[..needed.min(idx.len())])?;
                        self.check_list("kv_last_page_len", &last)?;
                    }
                }
                "skv_cache_stats" => {
                    let mut s = std::mem::zeroed::<skv_stats>();
                    let sp = if self.is_null("out") { null_mut() } else { &mut s as *mut skv_stats };
                    if self.check_status(skv_cache_stats(c, sp))? {
                        self.check_num("free_pages", s.free_pages.into())?;
                        self.check_num("free_rows", s.free_rows.into())?;
                        self.check_num("sessions", s.sessions.into())?;
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
                    };
                    let hp = if on("hooks") { &hooks as *const skv_engine_hooks } else { null() };
                    self.check_status(skv_cache_set_hooks(c, hp, null_mut()))?;
                }
                // A batch call records its arrays only when it succeeds (the inputs are the
                // outputs less n_tokens); a failed one changed nothing, so replay passes over it.
                f @ ("skv_alloc_extend_batch" | "skv_commit_batch") => {
                    if self.v["status"].as_str() != Some("SKV_OK") {
                        return Ok(());
                    }
                    let counts = self.list("n_tokens")?.unwrap_or_default();
                    let outs = self.v["reqs_out"].as_array().cloned().unwrap_or_default();
                    if outs.len() != counts.len() {
                        return Err(cannot(self.line, format!("{f}: reqs_out and n_tokens differ in length")));
                    }
                    let mut reqs = Vec::with_capacity(outs.len());
                    for (i, o) in outs.iter().enumerate() {
                        let Some(mut r) = self.req_value("reqs_out", o)? else {
                            return Err(cannot(self.line, format!("{f}: reqs_out[{i}] is not a req")));
                        };
                        let n = counts[i] as u32;
                        if f == "skv_commit_batch" {
                            r.kv_committed_len -= n;
                        } else {
                            r.kv_allocated_len -= n;
                        }
                        reqs.push(r);
                    }
                    let want = outs;
                    let n_tokens: Vec<u32> = counts.iter().map(|&n| n as u32).collect();
                    let st = if f == "skv_commit_batch" {
                        skv_commit_batch(c, reqs.as_mut_ptr(), reqs.len(), n_tokens.as_ptr())
                    } else {
                        let total: usize = n_tokens.iter().map(|&n| n as usize).sum();
                        let mut loc = vec![0i32; total];
                        skv_alloc_extend_batch(
                            c,
                            reqs.as_mut_ptr(),
                            reqs.len(),
                            n_tokens.as_ptr(),
                            loc.as_mut_ptr(),
                            total,
                        )
                    };
                    self.check_status(st)?;
                    for (i, (got, w)) in reqs.iter().zip(&want).enumerate() {
                        if self.req_value("reqs_out", w)?.as_ref() != Some(got) {
                            return Err(self.differs(format!("reqs_out[{i}] = {got:?}, recorded {w}")));
                        }
                    }
                }
                other => return Err(cannot(self.line, format!("{other}: not a call replay knows"))),
            }
        }
        Ok(())
    }
}
