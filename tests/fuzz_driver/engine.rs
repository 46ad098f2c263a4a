//! The fake engine behind a fuzzed handle: in external mode a paged KV pool and a
//! `req_to_token` table that flag any index or row handed back while free (a double free) and,
//! at the end, anything never handed back (a leak); in both modes the prefix-tree locks and aux
//! states libskv returns. Its callbacks fail on demand and call back into libskv (the same
//! handle or another) to test the re-entry rule.

use std::collections::BTreeSet;
use std::ffi::{c_int, c_void};

use skv::*;

use super::{Probes, Rng};

pub struct Engine {
    pub ps: u32,
    /// External mode: the row owning each page (`None`: free); page 0 is padding.
    pub page_owner: Vec<Option<i32>>,
    pub free_pages: Vec<u32>,
    pub row_free: Vec<bool>,
    /// External mode: each row's token indices by position, as the engine wrote them.
    pub row_map: Vec<Vec<i32>>,
    /// Locks and aux states libskv has handed back, to flag a second return.
    pub locks_returned: BTreeSet<u64>,
    pub aux_returned: BTreeSet<i64>,
    /// Every state change a callback made (a failed call other than SKV_ERR_CALLBACK makes none).
    pub events: u64,
    pub findings: Vec<String>,
    /// What the callbacks of the current call did, for the finding's call log.
    pub trail: Vec<String>,
    /// Reads of positions the engine never mapped for that row.
    pub unmapped_reads: u64,
    /// Callbacks that returned non-zero during the current call.
    pub injected: u64,
    /// Chance per 1000 that a callback fails (after doing its work, for the free callbacks).
    pub fail_rate: u64,
    /// Chance per 1000 that a callback calls back into libskv.
    pub reenter_rate: u64,
    pub rng: Rng,
    pub me: *mut skv_cache,
    pub other: *mut skv_cache,
    pub probes: Probes,
}

impl Engine {
    pub fn new(ps: u32, pages: u32, rows: u32, seed: u64, probes: Probes) -> Engine {
        Engine {
            ps,
            page_owner: vec![None; pages as usize],
            // LIFO: pop hands out 1, 2, 3, ... first.
            free_pages: (1..pages).rev().collect(),
            row_free: vec![true; rows as usize],
            row_map: vec![Vec::new(); rows as usize],
            locks_returned: BTreeSet::new(),
            aux_returned: BTreeSet::new(),
            events: 0,
            findings: Vec::new(),
            trail: Vec::new(),
            unmapped_reads: 0,
            injected: 0,
            fail_rate: 0,
            reenter_rate: 0,
            rng: Rng(seed),
            me: std::ptr::null_mut(),
            other: std::ptr::null_mut(),
            probes,
        }
    }

    fn fail(&mut self) -> c_int {
        if self.fail_rate > 0 && self.rng.below(1000) < self.fail_rate {
            self.injected += 1;
            -7
        } else {
            0
        }
    }

    /// A callback calling libskv: on its own handle that is SKV_ERR_STATE (and freeing it does
    /// nothing); on another handle OK today, SKV_ERR_STATE under the strict rule.
    fn reenter(&mut self) {
        if self.reenter_rate == 0 || self.rng.below(1000) >= self.reenter_rate {
            return;
        }
        let mut h = skv_held { full_tokens: 0, swa_tokens: 0, rows: 0, aux_states: 0, sessions: 0, aux_handles: 0 };
        // SAFETY: both handles outlive every call made on them.
        unsafe {
            let st = skv_session_held(self.me, std::ptr::null(), 0, &mut h);
            if st != skv_status::SKV_ERR_STATE {
                self.findings.push(format!("re-entry into the same handle returned {st:?}, not SKV_ERR_STATE"));
            }
            if self.rng.below(4) == 0 {
                // Must do nothing: the running call holds the handle.
                skv_cache_free(self.me);
            }
            if !self.other.is_null() {
                let st = skv_session_held(self.other, std::ptr::null(), 0, &mut h);
                let ok = match self.probes.strict_reentry {
                    true => st == skv_status::SKV_ERR_STATE,
                    false => matches!(st, skv_status::SKV_OK | skv_status::SKV_ERR_STATE),
                };
                if !ok {
                    self.findings.push(format!("re-entry into another handle from a callback returned {st:?}"));
                }
            }
        }
    }

    /// Pops a free page for `row`.
    pub fn take_page(&mut self, row: i32) -> Option<u32> {
        let p = self.free_pages.pop()?;
        self.trail.push(format!("take page {p}"));
        self.page_owner[p as usize] = Some(row);
        Some(p)
    }

    fn page_of(&self, idx: i32) -> Option<usize> {
        let p = (idx >= 0).then(|| idx as usize / self.ps as usize)?;
        (p >= 1 && p < self.page_owner.len()).then_some(p)
    }

    /// The engine's own free of positions `[from, to)` of `row` (its non-session finish).
    pub fn free_positions(&mut self, row: i32, from: u32, to: u32) {
        let mut pages = BTreeSet::new();
        for pos in from..to {
            if let Some(&i) = self.row_map[row as usize].get(pos as usize) {
                pages.extend(self.page_of(i));
            }
        }
        for p in pages {
            if self.page_owner[p] == Some(row) {
                self.page_owner[p] = None;
                self.free_pages.push(p as u32);
            }
        }
    }

    pub fn leaks(&self) -> Option<String> {
        let pages: Vec<(usize, i32)> =
            (1..self.page_owner.len()).filter_map(|p| Some((p, self.page_owner[p]?))).collect();
        let rows: Vec<usize> = (0..self.row_free.len()).filter(|&r| !self.row_free[r]).collect();
        (!pages.is_empty() || !rows.is_empty()).then(|| format!("leaked (page, row) {pages:?}, rows {rows:?}"))
    }
}

fn engine<'a>(ud: *mut c_void) -> &'a mut Engine {
    // SAFETY: user_data is the world's boxed Engine, alive while its handle is.
    unsafe { &mut *(ud as *mut Engine) }
}

pub unsafe extern "C" fn read_row(ud: *mut c_void, row: i32, start: u32, end: u32, out: *mut i32) -> c_int {
    let e = engine(ud);
    e.reenter();
    if row < 0 || row as usize >= e.row_free.len() || e.row_free[row as usize] {
        e.findings.push(format!("read_row({row}, {start}..{end}) of a row the engine does not hold"));
        return -1;
    }
    for (k, pos) in (start..end).enumerate() {
        let idx = e.row_map[row as usize].get(pos as usize).copied();
        match idx.and_then(|i| e.page_of(i)).filter(|&p| e.page_owner[p] == Some(row)) {
            // SAFETY: libskv passes out with room for end - start indices.
            Some(_) => unsafe { *out.add(k) = idx.unwrap() },
            None => {
                e.unmapped_reads += 1;
                return -2;
            }
        }
    }
    match e.fail() {
        0 => 0,
        _ => -3,
    }
}

pub unsafe extern "C" fn free_kv(ud: *mut c_void, idx: *const i32, n: usize) -> c_int {
    let e = engine(ud);
    e.reenter();
    // SAFETY: libskv passes n indices at idx.
    let idx = unsafe { std::slice::from_raw_parts(idx, n) };
    let mut pages = BTreeSet::new();
    for &i in idx {
        match e.page_of(i) {
            Some(p) => {
                pages.insert(p);
            }
            None => e.findings.push(format!("free_kv of index {i}, outside the pool")),
        }
    }
    for p in pages {
        match e.page_owner[p] {
            None => e.findings.push(format!("double free: page {p} (index in free_kv of {n}) is already free")),
            Some(_) => {
                e.trail.push(format!("page {p}"));
                e.page_owner[p] = None;
                e.free_pages.push(p as u32);
                e.events += 1;
            }
        }
    }
    e.fail()
}

pub unsafe extern "C" fn free_row(ud: *mut c_void, row: i32) -> c_int {
    let e = engine(ud);
    e.reenter();
    match e.row_free.get(row as usize) {
        None => e.findings.push(format!("free_row({row}): no such row")),
        Some(true) => e.findings.push(format!("double free: row {row} is already free")),
        Some(false) => {
            e.trail.push(format!("free_row({row})"));
            e.row_free[row as usize] = true;
            e.events += 1;
        }
    }
    e.fail()
}

pub unsafe extern "C" fn dec_lock_ref(ud: *mut c_void, node: u64, receipt: u64) -> c_int {
    let e = engine(ud);
    e.reenter();
    if receipt != node.wrapping_mul(31) {
        e.findings.push(format!("dec_lock_ref({node}, {receipt}): receipt does not belong to the node"));
    }
    if !e.locks_returned.insert(node) {
        e.findings.push(format!("lock {node} handed back twice"));
    }
    e.events += 1;
    e.fail()
}

pub unsafe extern "C" fn free_aux(ud: *mut c_void, aux: i64) -> c_int {
    let e = engine(ud);
    e.reenter();
    if aux == -1 {
        e.findings.push("free_aux(-1): an empty handle handed back".into());
    } else if !e.aux_returned.insert(aux) {
        e.findings.push(format!("aux state {aux} handed back twice"));
    }
    e.events += 1;
    e.fail()
}

pub fn pool_ops() -> skv_pool_ops {
    skv_pool_ops {
        // An ABI 2 caller (no free_kv_segment): free_kv takes every free whole, the SWA cursor
        // included (tests/prop_swa.rs drives the split).
        struct_size: 48,
        read_row: Some(read_row),
        free_kv: Some(free_kv),
        free_row: Some(free_row),
        dec_lock_ref: Some(dec_lock_ref),
        free_aux: Some(free_aux),
        free_kv_segment: None,
    }
}

pub fn hooks() -> skv_engine_hooks {
    skv_engine_hooks {
        struct_size: std::mem::size_of::<skv_engine_hooks>() as u32,
        dec_lock_ref: Some(dec_lock_ref),
        free_aux: Some(free_aux),
    }
}
