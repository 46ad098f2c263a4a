//! The fake engine behind a fuzzed handle: in external mode a paged KV pool and a
//! `req_to_token` table that flag any index or row handed back while free (a double free) and,
//! at the end, anything never handed back (a leak); in both modes the prefix-tree locks and aux
//! states libskv returns. Its callbacks fail on demand and call back into libskv (the same
//! handle or another) to test the re-entry rule.

use std::collections::BTreeSet;
use std::ffi::{c_int, c_void};

use skv::*;

use super::every::{call_export, HANDLE_EXPORTS};
use super::{Probes, Rng};

/// Without the strict re-entry rule a call into another handle may run: only queries that
/// change nothing (and succeed on a fresh req) are then made (`Engine::reenter`).
fn call_export_is_harmless(k: usize) -> bool {
    matches!(
        HANDLE_EXPORTS[k],
        "skv_session_held"
            | "skv_cache_stats"
            | "skv_session_usage"
            | "skv_branch_usage"
            | "skv_checkpoint"
            | "skv_session_where"
            | "skv_cache_tier_stats"
    )
}

/// How the external side's pool ops look (`skv_pool_ops.struct_size` and `free_kv_segment`).
#[derive(Clone, Copy, PartialEq, Debug)]
pub enum Pools {
    /// An ABI 2 caller (struct_size 48): free_kv takes every free whole, the SWA cursor included.
    Plain,
    /// Hybrid: free_kv_segment set (struct_size = sizeof); free_kv may be NULL.
    Hybrid { free_kv: bool },
    /// struct_size 56 with free_kv_segment NULL: a free with a full-only piece is refused.
    NoSegment,
}

pub struct Engine {
    pub ps: u32,
    pub pools: Pools,
    /// SKV_FLAG_PAGE_FREES: every free hands one index per page (the page's first position).
    pub page_frees: bool,
    /// Hybrid: whether each full page's SWA peer (page p of the SWA pool) is still live.
    pub swa_live: Vec<bool>,
    /// SWA-only positions handed back during the current call (skv_swa_evict's `*freed`).
    pub swa_freed: u64,
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
    /// The calls made from callbacks during the current call, with their statuses.
    pub reentered: Vec<(&'static str, skv_status)>,
    /// The rest of a free that failed midway (`free_kv` or `free_kv_segment` handed back a
    /// part, then returned non-zero): the engine frees it itself once the call returns, as an
    /// engine that knows what its callback could not free does. libskv must never hand it back
    /// again (a double free) and must still run every later callback of the call.
    pub midway: Vec<(i32, u32, Vec<i32>, u32)>,
    /// Owned mode's `copy_pages`: the copies queued during the current call, as `(ticket,
    /// direction, n_full, n_swa)`; each ticket must be new (above `last_copy_ticket`).
    pub queued: Vec<(u64, u32, usize, usize)>,
    pub last_copy_ticket: u64,
    /// Chance per 1000 that `copy_pages` refuses (the call must then change nothing).
    pub copy_fail_rate: u64,
    /// Whether `copy_pages` refused during the current call.
    pub copy_refused: bool,

    pub rng: Rng,
    pub me: *mut skv_cache,
    pub other: *mut skv_cache,
    pub probes: Probes,
}

impl Engine {
    pub fn new(ps: u32, pages: u32, rows: u32, seed: u64, probes: Probes) -> Engine {
        Engine {
            ps,
            pools: Pools::Plain,
            page_frees: false,
            swa_live: vec![false; pages as usize],
            swa_freed: 0,
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
            reentered: Vec::new(),
            midway: Vec::new(),
            queued: Vec::new(),
            last_copy_ticket: 0,
            copy_fail_rate: 0,
            copy_refused: false,

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

    /// For a free of `idx`: where it stops when it fails midway (it hands back the pages of
    /// the indices before that, keeps the rest for `finish_midway` and returns non-zero), or
    /// `None` to do its work whole and then fail or succeed as `fail` says. It stops between
    /// two pages.
    fn stop_midway(&mut self, idx: &[i32]) -> Option<usize> {
        if idx.len() < 2 || self.fail_rate == 0 || self.rng.below(1000) >= self.fail_rate / 2 {
            return None;
        }
        let ps = self.ps as i32;
        let cuts: Vec<usize> = (1..idx.len()).filter(|&k| idx[k] / ps != idx[k - 1] / ps).collect();
        if cuts.is_empty() {
            return None;
        }
        self.injected += 1;
        Some(cuts[self.rng.below(cuts.len() as u64) as usize])
    }

    /// Frees what the frees that failed midway kept, after the call that ran them returned;
    /// returns how many free_kv and free_kv_segment calls had failed so.
    pub fn finish_midway(&mut self) -> (u64, u64) {
        let (mut kv, mut seg) = (0, 0);
        for (row, first_pos, idx, pools) in std::mem::take(&mut self.midway) {
            self.trail.push("(the engine frees the rest)".into());
            match row {
                -1 => (kv, _) = (kv + 1, self.free_whole(&idx)),
                _ => (seg, _) = (seg + 1, self.segment(row, first_pos, &idx, pools)),
            }
        }
        (kv, seg)
    }

    /// A callback calling libskv: on its own handle that is SKV_ERR_STATE (and freeing it does
    /// nothing); on another handle OK today, SKV_ERR_STATE under the strict rule. Each call is
    /// any export taking a handle (`every`), kept in `reentered` for the coverage.
    fn reenter(&mut self) {
        if self.reenter_rate == 0 || self.rng.below(1000) >= self.reenter_rate {
            return;
        }
        let k = self.rng.below(HANDLE_EXPORTS.len() as u64) as usize;
        let st = call_export(k, self.me);
        self.reentered.push((HANDLE_EXPORTS[k], st));
        if st != skv_status::SKV_ERR_STATE {
            self.findings.push(format!(
                "re-entry into the same handle: {} returned {st:?}, not SKV_ERR_STATE",
                HANDLE_EXPORTS[k]
            ));
        }
        if self.rng.below(4) == 0 {
            // Must do nothing: the running call holds the handle.
            // SAFETY: the handle outlives every call made on it.
            unsafe { skv_cache_free(self.me) };
        }
        if !self.other.is_null() {
            let mut k = self.rng.below(HANDLE_EXPORTS.len() as u64) as usize;
            while !self.probes.strict_reentry && !call_export_is_harmless(k) {
                k = self.rng.below(HANDLE_EXPORTS.len() as u64) as usize;
            }
            let st = call_export(k, self.other);
            self.reentered.push((HANDLE_EXPORTS[k], st));
            let ok = match self.probes.strict_reentry {
                true => st == skv_status::SKV_ERR_STATE,
                false => matches!(st, skv_status::SKV_OK | skv_status::SKV_ERR_STATE),
            };
            if !ok {
                self.findings.push(format!(
                    "re-entry into another handle from a callback: {} returned {st:?}",
                    HANDLE_EXPORTS[k]
                ));
            }
        }
    }

    /// Pops a free page for `row`.
    pub fn take_page(&mut self, row: i32) -> Option<u32> {
        let p = self.free_pages.pop()?;
        self.trail.push(format!("take page {p}"));
        self.page_owner[p as usize] = Some(row);
        self.swa_live[p as usize] = true;
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
                self.swa_live[p] = false;
                self.free_pages.push(p as u32);
            }
        }
    }

    pub fn leaks(&self) -> Option<String> {
        let pages: Vec<(usize, i32)> =
            (1..self.page_owner.len()).filter_map(|p| Some((p, self.page_owner[p]?))).collect();
        let rows: Vec<usize> = (0..self.row_free.len()).filter(|&r| !self.row_free[r]).collect();
        let swa: Vec<usize> = (1..self.swa_live.len()).filter(|&p| self.swa_live[p]).collect();
        (!pages.is_empty() || !rows.is_empty() || !swa.is_empty())
            .then(|| format!("leaked (page, row) {pages:?}, rows {rows:?}, SWA pages {swa:?}"))
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
    if matches!(e.pools, Pools::Hybrid { .. }) {
        // With free_kv_segment set, every KV free goes through it.
        e.findings.push(format!("free_kv of {n} indices, though free_kv_segment is set"));
    }
    if let Some(k) = e.stop_midway(idx) {
        e.free_whole(&idx[..k]);
        e.midway.push((-1, 0, idx[k..].to_vec(), 0));
        return -8;
    }
    e.free_whole(idx);
    e.fail()
}

impl Engine {
    /// free_kv's work: every page the indices fall in goes back to the pool.
    fn free_whole(&mut self, idx: &[i32]) {
        for p in self.pages_of(idx, "free_kv") {
            match self.page_owner[p] {
                None => self
                    .findings
                    .push(format!("double free: page {p} (index in free_kv of {}) is already free", idx.len())),
                Some(_) => self.free_full(p),
            }
        }
    }

    /// The distinct pages of a free's indices; under SKV_FLAG_PAGE_FREES each must be its page's
    /// first index and no page may come twice.
    fn pages_of(&mut self, idx: &[i32], what: &str) -> BTreeSet<usize> {
        let mut pages = BTreeSet::new();
        for &i in idx {
            match self.page_of(i) {
                Some(p) => {
                    if !pages.insert(p) && self.page_frees {
                        self.findings.push(format!("{what}: page {p} twice under SKV_FLAG_PAGE_FREES"));
                    }
                    if self.page_frees && !(i as u32).is_multiple_of(self.ps) {
                        self.findings.push(format!("{what}: index {i} is not its page's first (SKV_FLAG_PAGE_FREES)"));
                    }
                }
                None => self.findings.push(format!("{what} of index {i}, outside the pool")),
            }
        }
        pages
    }

    fn free_full(&mut self, p: usize) {
        self.trail.push(format!("page {p}"));
        self.page_owner[p] = None;
        self.swa_live[p] = false;
        self.free_pages.push(p as u32);
        self.events += 1;
    }
}

/// Hybrid pools (docs/hybrid.md): full page p's SWA peer is SWA page p. An SWA page freed twice,
/// a full page freed alone while its SWA peer lives (the peer would leak), a page of another row
/// or an index that is not the row's position are findings.
pub unsafe extern "C" fn free_kv_segment(
    ud: *mut c_void,
    row: i32,
    first_pos: u32,
    idx: *const i32,
    n: usize,
    pools: u32,
) -> c_int {
    let e = engine(ud);
    e.reenter();
    // SAFETY: libskv passes n indices at idx.
    let idx = unsafe { std::slice::from_raw_parts(idx, n) };
    if row < 0 || row as usize >= e.row_free.len() || e.row_free[row as usize] {
        e.findings.push(format!(
            "free_kv_segment(row {row}, first_pos {first_pos}, n {n}, pools {pools}): a row the engine does not hold"
        ));
        return e.fail();
    }
    if pools == SKV_POOL_SWA {
        // A window step frees whole pages: one index each under SKV_FLAG_PAGE_FREES.
        e.swa_freed += n as u64 * if e.page_frees { e.ps as u64 } else { 1 };
    }
    if let Some(k) = e.stop_midway(idx) {
        let step = if e.page_frees { e.ps } else { 1 };
        e.segment(row, first_pos, &idx[..k], pools);
        e.midway.push((row, first_pos + k as u32 * step, idx[k..].to_vec(), pools));
        return -8;
    }
    e.segment(row, first_pos, idx, pools);
    e.fail()
}

impl Engine {
    /// free_kv_segment's work on positions `first_pos..` of `row` (the row may have been handed
    /// back since, when the engine finishes a free that failed midway).
    fn segment(&mut self, row: i32, first_pos: u32, idx: &[i32], pools: u32) {
        let n = idx.len();
        let why = format!("free_kv_segment(row {row}, first_pos {first_pos}, n {n}, pools {pools})");
        if !first_pos.is_multiple_of(self.ps) {
            self.findings.push(format!("{why}: first_pos is not a page boundary"));
        }
        let step = if self.page_frees { self.ps } else { 1 };
        for (k, &i) in idx.iter().enumerate() {
            let pos = first_pos as usize + k * step as usize;
            if self.row_map[row as usize].get(pos).copied() != Some(i) {
                self.findings.push(format!("{why}: index {i} is not row position {pos}"));
            }
        }
        for p in self.pages_of(idx, &why) {
            if self.page_owner[p] != Some(row) {
                self.findings.push(format!("{why}: page {p} is not the row's (owner {:?})", self.page_owner[p]));
                continue;
            }
            match pools {
                SKV_POOL_FULL if self.swa_live[p] => {
                    self.findings.push(format!("{why}: full page {p} freed alone while its SWA peer lives (a leak)"))
                }
                SKV_POOL_FULL => self.free_full(p),
                SKV_POOL_BOTH | SKV_POOL_SWA if !self.swa_live[p] => {
                    self.findings.push(format!("{why}: SWA page {p} freed twice"))
                }
                SKV_POOL_BOTH => self.free_full(p),
                SKV_POOL_SWA => {
                    self.trail.push(format!("swa {p}"));
                    self.swa_live[p] = false;
                    self.events += 1;
                }
                _ => self.findings.push(format!("{why}: unknown pools")),
            }
        }
    }
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

/// Queues a ticket's copies (the fuzzer completes it later, in any order) or refuses them.
pub unsafe extern "C" fn copy_pages(
    ud: *mut c_void,
    ticket: u64,
    direction: u32,
    src: *const i32,
    dst: *const i32,
    n_full: usize,
    n_swa: usize,
) -> c_int {
    let e = engine(ud);
    e.reenter();
    let n = n_full + n_swa;
    let why = format!("copy_pages(ticket {ticket}, direction {direction}, n_full {n_full}, n_swa {n_swa})");
    if n == 0 || ticket <= e.last_copy_ticket || ![SKV_COPY_TO_HOST, SKV_COPY_TO_DEVICE].contains(&direction) {
        e.findings.push(format!("{why}: no copies, a ticket not new (last {}), or no direction", e.last_copy_ticket));
    }
    // SAFETY: libskv passes n readable indices in each array.
    let (src, dst) = unsafe { (std::slice::from_raw_parts(src, n), std::slice::from_raw_parts(dst, n)) };
    if src.iter().chain(dst).any(|&p| p < 1) {
        e.findings.push(format!("{why}: a page below 1 (page 0 is padding): {src:?} -> {dst:?}"));
    }
    if e.copy_fail_rate > 0 && e.rng.below(1000) < e.copy_fail_rate {
        e.injected += 1;
        e.copy_refused = true;
        e.trail.push(format!("copy_pages({ticket}) refused"));
        return -1;
    }
    e.trail.push(format!("copy_pages({ticket}, dir {direction}, {n_full}+{n_swa})"));
    e.last_copy_ticket = ticket;
    e.queued.push((ticket, direction, n_full, n_swa));
    0
}

pub fn pool_ops(pools: Pools) -> skv_pool_ops {
    let (struct_size, free_kv, seg): (u32, skv_free_kv_fn, skv_free_kv_segment_fn) = match pools {
        Pools::Plain => (48, Some(free_kv), None),
        Pools::Hybrid { free_kv: f } => {
            let kv: skv_free_kv_fn = if f { Some(free_kv) } else { None };
            (std::mem::size_of::<skv_pool_ops>() as u32, kv, Some(free_kv_segment))
        }
        Pools::NoSegment => (56, Some(free_kv), None),
    };
    skv_pool_ops {
        struct_size,
        read_row: Some(read_row),
        free_kv,
        free_row: Some(free_row),
        dec_lock_ref: Some(dec_lock_ref),
        free_aux: Some(free_aux),
        free_kv_segment: seg,
    }
}

pub fn hooks() -> skv_engine_hooks {
    skv_engine_hooks {
        struct_size: std::mem::size_of::<skv_engine_hooks>() as u32,
        dec_lock_ref: Some(dec_lock_ref),
        free_aux: Some(free_aux),
        copy_pages: Some(copy_pages),
    }
}
