//! Random multi-turn sessions over engine-owned pools (external mode), driven through the C ABI
//! and checked after every call against a small reference model of docs/operations.md: the status, every
//! callback (each freed index in order, `free_row`, `dec_lock_ref`, `free_aux`), every `skv_req`
//! field, every out-value, and the whole slot table (`skv_session_held`, `skv_checkpoint`).
//!
//! The fake engine behind the callbacks owns a paged KV allocator and a row pool, like a real one:
//! it hands out rows and pages, and flags any double free, freed prefix-tree page, read of an
//! unmapped position or page left behind in a returned row. The generator evolves each request as
//! an engine would (prefill chunks, speculative decode rounds, lookahead over-allocation, SWA
//! cursors, finishes with overshoot), and also feeds invalid inputs and failing callbacks, and
//! the misuse docs/decisions.md's session rules refuse: a second request matching a running session,
//! stale copies of finished turns finished, trimmed or matched again, primitives on idle session
//! rows, and primitives on a running session's row that start short of its slot or cut into its
//! protected prefix.

// As in the library: every unsafe block says why it is sound.
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

mod common;

use common::model::*;
use common::*;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use skv::*;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::{c_int, c_void};

/// Session 0 holds the engine's own non-session requests: they meet libskv only through the
/// primitives, or as a first turn finished (or matched) under another key.
const KEYS: [Key; 8] = [(1, 0), (1, 1), (1, 2), (2, 0), (2, 1), (3, 0), (0, 0), (0, 1)];
const SESSION_KEYS: usize = 6;

// ---------------------------------------------------------------------------------------------
// The fake engine behind skv_pool_ops.
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Debug, PartialEq)]
enum Ev {
    Read(i32, u32, u32),
    FreeKv(Vec<i32>),
    FreeRow(i32),
    DecLock(u64, u64),
    FreeAux(i64),
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Cb {
    Read,
    FreeKv,
    FreeRow,
    DecLock,
    FreeAux,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Owner {
    Row(i32, usize),
    Tree,
}

struct Engine {
    ps: u32,
    max_ctx: u32,
    events: Vec<Ev>,
    /// the next callback of this kind returns 1; a free still takes effect
    fail: Option<Cb>,
    /// req_to_token, by page: table[row][position / ps]
    table: Vec<Vec<Option<u32>>>,
    pages: HashMap<u32, Owner>,
    next_page: u32,
    row_used: Vec<bool>,
    locks: HashMap<u64, u64>,
    auxes: HashSet<i64>,
    next_id: u64,
    violations: Vec<String>,
}

impl Engine {
    fn new(ps: u32, rows: u32, max_ctx: u32) -> Engine {
        Engine {
            ps,
            max_ctx,
            events: vec![],
            fail: None,
            table: vec![vec![None; max_ctx.div_ceil(ps) as usize]; rows as usize],
            pages: HashMap::new(),
            next_page: 1,
            row_used: vec![false; rows as usize],
            locks: HashMap::new(),
            auxes: HashSet::new(),
            next_id: 1,
            violations: vec![],
        }
    }

    fn take_fail(&mut self, cb: Cb) -> bool {
        let hit = self.fail == Some(cb);
        if hit {
            self.fail = None;
        }
        hit
    }

    fn index(&self, row: i32, p: u32) -> Option<i32> {
        let page = self.table[row as usize][(p / self.ps) as usize]?;
        Some((page * self.ps + p % self.ps) as i32)
    }

    fn alloc_row(&mut self) -> Option<i32> {
        let r = self.row_used.iter().position(|u| !u)?;
        self.row_used[r] = true;
        Some(r as i32)
    }

    fn new_page(&mut self, owner: Owner) -> u32 {
        let p = self.next_page;
        self.next_page += 1;
        self.pages.insert(p, owner);
        p
    }

    /// A prefix-tree hit: the tree's pages become the row's first `tokens` positions.
    fn map_tree(&mut self, row: i32, tokens: u32) {
        for s in 0..(tokens / self.ps) as usize {
            self.table[row as usize][s] = Some(self.new_page(Owner::Tree));
        }
    }

    /// Positions [from, to): the partial page at `from` is continued, then new pages.
    fn extend(&mut self, row: i32, from: u32, to: u32) {
        for s in (from / self.ps) as usize..to.div_ceil(self.ps) as usize {
            if self.table[row as usize][s].is_none() {
                self.table[row as usize][s] = Some(self.new_page(Owner::Row(row, s)));
            }
        }
    }

    fn free_indices(&mut self, v: &[i32]) {
        let mut done = HashSet::new();
        for &i in v {
            let page = i as u32 / self.ps;
            if !done.insert(page) {
                continue;
            }
            match self.pages.get(&page).copied() {
                Some(Owner::Row(r, s)) => {
                    self.pages.remove(&page);
                    self.table[r as usize][s] = None;
                }
                Some(Owner::Tree) => self.violations.push(format!("free_kv index {i}: a prefix-tree page")),
                None => self.violations.push(format!("free_kv index {i}: page {page} already free")),
            }
        }
    }

    fn return_row(&mut self, row: i32) {
        if row < 0 || row as usize >= self.row_used.len() || !self.row_used[row as usize] {
            self.violations.push(format!("free_row({row}): not a row in use"));
            return;
        }
        for s in 0..self.table[row as usize].len() {
            if let Some(page) = self.table[row as usize][s].take() {
                if self.pages[&page] != Owner::Tree {
                    self.violations.push(format!("free_row({row}): page slot {s} still mapped (leak)"));
                    self.pages.remove(&page);
                }
            }
        }
        self.row_used[row as usize] = false;
    }

    /// The engine finishing a request of its own, without libskv.
    fn drop_req(&mut self, r: &skv_req) {
        let row = r.req_pool_idx;
        for s in 0..self.table[row as usize].len() {
            if let Some(Owner::Row(..)) = self.table[row as usize][s].map(|p| self.pages[&p]) {
                let page = self.table[row as usize][s].take().unwrap();
                self.pages.remove(&page);
            }
        }
        self.return_row(row);
        if r.lock_node != 0 {
            self.locks.remove(&r.lock_node);
        }
        for h in aux_handles(r) {
            self.auxes.remove(&h);
        }
    }

    fn new_lock(&mut self) -> (u64, u64) {
        self.next_id += 1;
        let lock = (self.next_id, self.next_id * 1_000_003 + 17);
        self.locks.insert(lock.0, lock.1);
        lock
    }

    fn new_aux(&mut self) -> i64 {
        self.next_id += 1;
        self.auxes.insert(self.next_id as i64);
        self.next_id as i64
    }
}

/// # Safety
/// `ud` must be the `Engine` this test handed libskv as user_data, alive and not otherwise
/// borrowed while a callback runs.
unsafe fn engine<'a>(ud: *mut c_void) -> &'a mut Engine {
    // SAFETY: the contract above.
    unsafe { &mut *(ud as *mut Engine) }
}

unsafe extern "C" fn cb_read_row(ud: *mut c_void, row: i32, start: u32, end: u32, out: *mut i32) -> c_int {
    // SAFETY: ud is the Engine this test passed as user_data; libskv calls back one at a time.
    let e = unsafe { engine(ud) };
    e.events.push(Ev::Read(row, start, end));
    if e.take_fail(Cb::Read) {
        return 1;
    }
    if row < 0 || row as usize >= e.table.len() || start > end || end > e.max_ctx {
        e.violations.push(format!("read_row({row}, {start}, {end}): out of range"));
        return 1;
    }
    for (i, p) in (start..end).enumerate() {
        let v = e.index(row, p).unwrap_or_else(|| {
            e.violations.push(format!("read_row({row}): position {p} is not mapped"));
            -1
        });
        // SAFETY: libskv hands read_row room for end - start values at out.
        unsafe { *out.add(i) = v };
    }
    0
}

unsafe extern "C" fn cb_free_kv(ud: *mut c_void, idx: *const i32, n: usize) -> c_int {
    // SAFETY: ud is the Engine this test passed as user_data; libskv calls back one at a time.
    let e = unsafe { engine(ud) };
    // SAFETY: libskv hands free_kv n readable indices at idx (n > 0 here).
    let v = if n == 0 { vec![] } else { unsafe { std::slice::from_raw_parts(idx, n) }.to_vec() };
    e.free_indices(&v);
    e.events.push(Ev::FreeKv(v));
    e.take_fail(Cb::FreeKv) as c_int
}

unsafe extern "C" fn cb_free_row(ud: *mut c_void, row: i32) -> c_int {
    // SAFETY: ud is the Engine this test passed as user_data; libskv calls back one at a time.
    let e = unsafe { engine(ud) };
    e.events.push(Ev::FreeRow(row));
    e.return_row(row);
    e.take_fail(Cb::FreeRow) as c_int
}

unsafe extern "C" fn cb_dec_lock_ref(ud: *mut c_void, node: u64, receipt: u64) -> c_int {
    // SAFETY: ud is the Engine this test passed as user_data; libskv calls back one at a time.
    let e = unsafe { engine(ud) };
    e.events.push(Ev::DecLock(node, receipt));
    if e.locks.remove(&node) != Some(receipt) {
        e.violations.push(format!("dec_lock_ref({node}, {receipt}): not a held lock"));
    }
    e.take_fail(Cb::DecLock) as c_int
}

unsafe extern "C" fn cb_free_aux(ud: *mut c_void, aux: i64) -> c_int {
    // SAFETY: ud is the Engine this test passed as user_data; libskv calls back one at a time.
    let e = unsafe { engine(ud) };
    e.events.push(Ev::FreeAux(aux));
    if !e.auxes.remove(&aux) {
        e.violations.push(format!("free_aux({aux}): not a live aux state"));
    }
    e.take_fail(Cb::FreeAux) as c_int
}

// ---------------------------------------------------------------------------------------------
// Operations, as the generator draws them: small numbers a driver turns into engine-like calls.
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Debug)]
struct Cfg {
    ps: u32,
    aligned: bool,
    rows: u32,
    max_ctx: u32,
}

#[derive(Clone, Debug)]
enum Op {
    /// a new request for a key: match (a hit restores the slot) or a first turn
    Start {
        k: u8,
        growth: u16,
        shape: u8,
        prot: u8,
    },
    PreAbort {
        k: u8,
        finish: bool,
    },
    /// the scheduler rejected a running request; it matches again next cycle
    Retry {
        k: u8,
        shrink: u8,
    },
    /// a prefill chunk, or a speculative decode round (draft tokens, accepted count)
    Step {
        k: u8,
        draft: u8,
        accept: u8,
    },
    /// lookahead over-allocation
    Extend {
        k: u8,
        n: u8,
    },
    Swa {
        k: u8,
        n: u8,
    },
    SwapAux {
        k: u8,
    },
    /// sglang's ping-pong track step: fill the empty track entry, or free the older one
    PingPong {
        k: u8,
    },
    /// `again`: the engine finishes the same req a second time
    Finish {
        k: u8,
        mode: u8,
        aborted: bool,
        again: bool,
    },
    /// finish (or match) a running request under another key
    FinishAs {
        k: u8,
        other: u8,
        aborted: bool,
    },
    MatchAs {
        k: u8,
        other: u8,
    },
    /// a second request for a session whose turn is running
    Intrude {
        k: u8,
        pre: bool,
    },
    /// the engine's old copy of a finished turn (or the idle slot's record) used again
    Stale {
        k: u8,
        what: u8,
        x: u16,
    },
    /// a running session's req with lengths short of what its slot records
    Lie {
        k: u8,
        what: u8,
        x: u16,
    },
    Checkpoint {
        k: u8,
    },
    ReleaseBranch {
        k: u8,
    },
    ReleaseSession {
        s: u8,
    },
    Trim {
        k: u8,
        x: u16,
    },
    FreeTail {
        k: u8,
        x: u16,
    },
    FreeAligned {
        k: u8,
        x: u16,
    },
    Invalid {
        k: u8,
        field: u8,
        func: u8,
        v: u8,
    },
    /// the next call's first callback of this kind fails
    Fail {
        cb: u8,
    },
}

fn op_strategy() -> impl Strategy<Value = Op> {
    let k = 0u8..8;
    prop_oneof![
        6 => (k.clone(), any::<u16>(), any::<u8>(), any::<u8>())
            .prop_map(|(k, growth, shape, prot)| Op::Start { k, growth, shape, prot }),
        1 => (k.clone(), any::<bool>()).prop_map(|(k, finish)| Op::PreAbort { k, finish }),
        2 => (k.clone(), any::<u8>()).prop_map(|(k, shrink)| Op::Retry { k, shrink }),
        10 => (k.clone(), any::<u8>(), any::<u8>()).prop_map(|(k, draft, accept)| Op::Step { k, draft, accept }),
        3 => (k.clone(), any::<u8>()).prop_map(|(k, n)| Op::Extend { k, n }),
        2 => (k.clone(), any::<u8>()).prop_map(|(k, n)| Op::Swa { k, n }),
        1 => k.clone().prop_map(|k| Op::SwapAux { k }),
        2 => k.clone().prop_map(|k| Op::PingPong { k }),
        6 => (k.clone(), any::<u8>(), prop::bool::weighted(0.2), prop::bool::weighted(0.15))
            .prop_map(|(k, mode, aborted, again)| Op::Finish { k, mode, aborted, again }),
        1 => (k.clone(), 0u8..6, any::<bool>()).prop_map(|(k, other, aborted)| Op::FinishAs { k, other, aborted }),
        1 => (k.clone(), 0u8..6).prop_map(|(k, other)| Op::MatchAs { k, other }),
        1 => (k.clone(), prop::bool::weighted(0.2)).prop_map(|(k, pre)| Op::Intrude { k, pre }),
        3 => (k.clone(), any::<u8>(), any::<u16>()).prop_map(|(k, what, x)| Op::Stale { k, what, x }),
        2 => (k.clone(), any::<u8>(), any::<u16>()).prop_map(|(k, what, x)| Op::Lie { k, what, x }),
        1 => k.clone().prop_map(|k| Op::Checkpoint { k }),
        1 => k.clone().prop_map(|k| Op::ReleaseBranch { k }),
        1 => (0u8..5).prop_map(|s| Op::ReleaseSession { s }),
        2 => (k.clone(), any::<u16>()).prop_map(|(k, x)| Op::Trim { k, x }),
        2 => (k.clone(), any::<u16>()).prop_map(|(k, x)| Op::FreeTail { k, x }),
        2 => (k.clone(), any::<u16>()).prop_map(|(k, x)| Op::FreeAligned { k, x }),
        3 => (k.clone(), any::<u8>(), any::<u8>(), any::<u8>())
            .prop_map(|(k, field, func, v)| Op::Invalid { k, field, func, v }),
        1 => (0u8..5).prop_map(|cb| Op::Fail { cb }),
    ]
}

fn cfg_strategy() -> impl Strategy<Value = Cfg> {
    (prop::sample::select(vec![1u32, 4, 16, 64]), any::<bool>(), 3u32..10, 4u32..24, 0u32..3).prop_map(
        |(ps, aligned, rows, units, odd)| {
            // a max_context_len that is not a multiple of the page size now and then
            let max_ctx = units * ps.max(8) - if ps > 1 { odd } else { 0 };
            Cfg { ps, aligned, rows, max_ctx }
        },
    )
}

// ---------------------------------------------------------------------------------------------
// The driver: runs ops through the C ABI, compares with the model after every call.
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug)]
struct Run {
    req: skv_req,
    /// restored from a slot (the slot is in flight)
    hit: bool,
    swapped_aux: bool,
    max_new: u32,
    /// sliding window of the engine's SWA layers: the cursor trails the committed end by this
    window: Option<u32>,
}

struct Sim {
    cfg: Cfg,
    cache: *mut skv_cache,
    eng: *mut Engine,
    model: Model,
    running: BTreeMap<Key, Run>,
    hist: HashMap<Key, u32>,
    /// the engine's copies of finished turns' reqs, as they were before the finish
    stale: Vec<(Key, skv_req)>,
    fail_next: Option<Cb>,
    log: Vec<String>,
}

impl Drop for Sim {
    fn drop(&mut self) {
        // SAFETY: both were created in Sim::new and are freed once, here.
        unsafe {
            skv_cache_free(self.cache);
            drop(Box::from_raw(self.eng));
        }
    }
}

/// What `exec` returns for SKV_ERR_CALLBACK from a failed `read_row`, which changes nothing.
const CALLBACK_UNCHANGED: u32 = 0x100 | CALLBACK;

/// The call took effect: success, or a free callback failing part-way.
fn took(st: u32) -> bool {
    st == OK || st == CALLBACK
}

const MATCH_SENTINEL: (u32, u32) = (0xAAAA, 0xBBBB_BBBB);
const HANDLED_SENTINEL: u32 = 0xCCCC;

impl Sim {
    fn new(cfg: &Cfg) -> Sim {
        let eng = Box::into_raw(Box::new(Engine::new(cfg.ps, cfg.rows, cfg.max_ctx)));
        let ccfg = skv_cache_config {
            struct_size: std::mem::size_of::<skv_cache_config>() as u32,
            page_size: cfg.ps,
            num_token_slots: 0,
            num_rows: cfg.rows,
            max_context_len: cfg.max_ctx,
            flags: if cfg.aligned { SKV_FLAG_ALIGNED_REUSE } else { 0 },
            swa_num_token_slots: 0,
            ..Default::default()
        };
        let ops = skv_pool_ops {
            // An ABI 2 caller (no free_kv_segment): free_kv takes every free whole, the SWA cursor
            // included (tests/prop_swa.rs drives the split).
            struct_size: 48,
            read_row: Some(cb_read_row),
            free_kv: Some(cb_free_kv),
            free_row: Some(cb_free_row),
            dec_lock_ref: Some(cb_dec_lock_ref),
            free_aux: Some(cb_free_aux),
            free_kv_segment: None,
        };
        let mut cache = std::ptr::null_mut();
        // SAFETY: valid pointers; the engine outlives the cache (Drop frees the cache first).
        let st = unsafe { skv_cache_new_external(&ccfg, &ops, eng as *mut c_void, &mut cache) };
        assert_eq!(code(st), OK, "skv_cache_new_external: {}", last_error());
        let model = Model {
            ps: cfg.ps,
            rows: cfg.rows,
            max_ctx: cfg.max_ctx,
            aligned: cfg.aligned,
            slots: BTreeMap::new(),
            next_order: 0,
        };
        Sim {
            cfg: cfg.clone(),
            cache,
            eng,
            model,
            running: BTreeMap::new(),
            hist: HashMap::new(),
            stale: vec![],
            fail_next: None,
            log: vec![],
        }
    }

    fn eng(&mut self) -> &mut Engine {
        // SAFETY: no call into libskv is in progress while the driver holds this reference.
        unsafe { &mut *self.eng }
    }

    fn failure(&self, what: &str) -> TestCaseError {
        let tail: Vec<&String> = self.log.iter().rev().take(60).collect::<Vec<_>>().into_iter().rev().collect();
        let mut s =
            format!("{what}\nconfig {:?}\nhistory (last {} of {} calls):\n", self.cfg, tail.len(), self.log.len());
        for l in tail {
            s += "  ";
            s += l;
            s += "\n";
        }
        TestCaseError::fail(s)
    }

    fn expand(&self, e: &Eff) -> Result<Ev, TestCaseError> {
        // SAFETY: no call in progress.
        let eng = unsafe { &*self.eng };
        Ok(match *e {
            Eff::FreeKv(row, a, b) => {
                let mut v = Vec::with_capacity((b - a) as usize);
                for p in a..b {
                    match eng.index(row, p) {
                        Some(i) => v.push(i),
                        None => {
                            return Err(self.failure(&format!(
                                "generator/model bug: predicted free of unmapped position {p} of row {row}"
                            )))
                        }
                    }
                }
                Ev::FreeKv(v)
            }
            Eff::FreeRow(r) => Ev::FreeRow(r),
            Eff::DecLock(n, r) => Ev::DecLock(n, r),
            Eff::FreeAux(a) => Ev::FreeAux(a),
        })
    }

    /// One call: predict with the model, run through the C ABI, compare everything.
    fn exec(
        &mut self,
        what: String,
        req: &skv_req,
        model_op: impl FnOnce(&mut Model, &mut skv_req) -> Res,
        call: impl FnOnce(*mut skv_cache, &mut skv_req) -> (skv_status, Out),
    ) -> Result<(u32, skv_req, Out), TestCaseError> {
        let mut m = self.model.clone();
        let mut pr = *req;
        let (mut want, effs, out) = match model_op(&mut m, &mut pr) {
            Ok((fx, out)) => (OK, fx, out),
            Err(st) => (st, vec![], Out::None),
        };
        let ranges: Vec<(i32, u32, u32)> =
            effs.iter().filter_map(|e| if let Eff::FreeKv(r, a, b) = *e { Some((r, a, b)) } else { None }).collect();
        let fail = self.fail_next.take();
        let mut advance = want == OK;
        if want == OK {
            let kind_of = |e: &Eff| match e {
                Eff::FreeKv(..) => Cb::FreeKv,
                Eff::FreeRow(_) => Cb::FreeRow,
                Eff::DecLock(..) => Cb::DecLock,
                Eff::FreeAux(_) => Cb::FreeAux,
            };
            match fail {
                Some(Cb::Read) if !ranges.is_empty() => (want, advance) = (CALLBACK, false),
                Some(cb) if effs.iter().any(|e| kind_of(e) == cb) => want = CALLBACK,
                _ => {}
            }
        }
        let want_req = if advance { pr } else { *req };
        let want_evs =
            if advance { effs.iter().map(|e| self.expand(e)).collect::<Result<Vec<_>, _>>()? } else { vec![] };

        self.eng().events.clear();
        self.eng().fail = fail;
        let mut got = *req;
        let (st, got_out) = call(self.cache, &mut got);
        let err = last_error();
        let evs = std::mem::take(&mut self.eng().events);
        self.eng().fail = None;
        let st = code(st);
        let note = if let Some(cb) = fail { format!(" [{cb:?} fails]") } else { String::new() };
        self.log.push(format!("{what}{note} -> {} {got_out:?} {}", status_name(st), show(&got)));
        cover(&what, st, &effs, &got_out);

        let mut bad = vec![];
        if st != want {
            bad.push(format!("status {} (\"{err}\"), model {}", status_name(st), status_name(want)));
        }
        if (st == OK) != err.is_empty() {
            bad.push(format!("skv_last_error() is {err:?} after {}", status_name(st)));
        }
        if !same(&got, &want_req) {
            bad.push(format!("req {}\n      model {}", show(&got), show(&want_req)));
        }
        // a free callback failing part-way advances the call as if it succeeded: the req and
        // the out-values say what now holds (else the engine could not tell what it owns)
        let want_out = if advance { out.clone() } else { Out::None };
        if got_out != want_out {
            bad.push(format!("out {got_out:?}, model {want_out:?}"));
        }
        let first_free = evs.iter().position(|e| !matches!(e, Ev::Read(..))).unwrap_or(evs.len());
        let (reads, frees) = evs.split_at(first_free);
        if frees.iter().any(|e| matches!(e, Ev::Read(..))) {
            bad.push(format!("read_row after a free: {evs:?}"));
        }
        let mut reads: Vec<(i32, u32, u32)> =
            reads.iter().map(|e| if let Ev::Read(r, a, b) = *e { (r, a, b) } else { unreachable!() }).collect();
        if want == CALLBACK && !advance {
            if !frees.is_empty() || reads.is_empty() || reads.iter().any(|r| !ranges.contains(r)) {
                bad.push(format!("a failing read_row must stop the call before any free: {evs:?}"));
            }
        } else {
            let mut want_reads = if advance { ranges.clone() } else { vec![] };
            reads.sort();
            want_reads.sort();
            if reads != want_reads {
                bad.push(format!("read_row calls {reads:?}, model {want_reads:?}"));
            }
            if frees != want_evs.as_slice() {
                bad.push(format!("callbacks {frees:?}\n      model {want_evs:?}"));
            }
        }
        let v = std::mem::take(&mut self.eng().violations);
        if !v.is_empty() {
            bad.push(format!("engine saw: {v:?}"));
        }
        if !bad.is_empty() {
            return Err(self.failure(&format!("mismatch on `{what}`:\n    {}", bad.join("\n    "))));
        }
        if advance {
            self.model = m;
        }
        // a failed read_row changed nothing: the driver must not take the call as done
        Ok((if st == CALLBACK && !advance { CALLBACK_UNCHANGED } else { st }, got, got_out))
    }

    // --- thin call wrappers -------------------------------------------------------------------

    fn call_match(
        &mut self,
        key: Key,
        req: &skv_req,
        key_len: u32,
        pre: bool,
    ) -> Result<(u32, skv_req, Out), TestCaseError> {
        self.exec(
            format!("match{key:?} key_len {key_len} pre {pre} {}", show(req)),
            req,
            |m, r| m.op_match(key, r, key_len, pre),
            |c, r| {
                let mut out = skv_match { hit: MATCH_SENTINEL.0, prefix_len: MATCH_SENTINEL.1 };
                // SAFETY: the handle is this test's live cache; the other pointers are locals.
                let st = unsafe { skv_match_prefix(c, key.0, key.1, r, key_len, pre as u32, &mut out) };
                let o = if (out.hit, out.prefix_len) == MATCH_SENTINEL {
                    Out::None
                } else {
                    Out::Match(out.hit, out.prefix_len)
                };
                (st, o)
            },
        )
    }

    fn call_finish(&mut self, key: Key, req: &skv_req, aborted: bool) -> Result<(u32, skv_req, Out), TestCaseError> {
        self.exec(
            format!("finished{key:?} aborted {aborted} {}", show(req)),
            req,
            |m, r| m.op_finished(key, r, aborted),
            // SAFETY: the call helper passes this driver's live handle and a req it owns.
            |c, r| (unsafe { skv_cache_finished_req(c, key.0, key.1, r, aborted as u32) }, Out::None),
        )
    }

    fn call_checkpoint(&mut self, key: Key, req: &skv_req) -> Result<(u32, skv_req, Out), TestCaseError> {
        self.exec(
            format!("checkpoint{key:?} {}", show(req)),
            req,
            |m, r| m.op_checkpoint(key, r),
            |c, r| {
                let mut h = HANDLED_SENTINEL;
                // SAFETY: the handle is this test's live cache; the other pointers are locals.
                let st = unsafe { skv_checkpoint(c, key.0, key.1, r, &mut h) };
                (st, if h == HANDLED_SENTINEL { Out::None } else { Out::Handled(h) })
            },
        )
    }

    fn call_release(&mut self, session: u64, branch: Option<u64>) -> Result<u32, TestCaseError> {
        let dummy = fresh_req();
        let what = match branch {
            Some(b) => format!("release_branch({session}, {b})"),
            None => format!("release_session({session})"),
        };
        let (st, ..) = self.exec(
            what,
            &dummy,
            |m, _| m.op_release(session, branch),
            |c, _| {
                // SAFETY: the handle is this test's live cache; the other pointers are locals.
                let st = unsafe {
                    match branch {
                        Some(b) => skv_release_branch(c, session, b),
                        None => skv_release_session(c, session),
                    }
                };
                (st, Out::None)
            },
        )?;
        Ok(st)
    }

    fn call_trim(&mut self, req: &skv_req, fl: u32) -> Result<(u32, skv_req, Out), TestCaseError> {
        self.exec(
            format!("trim_overshoot({fl}) {}", show(req)),
            req,
            |m, r| m.op_trim(r, fl),
            // SAFETY: the call helper passes this driver's live handle and a req it owns.
            |c, r| (unsafe { skv_trim_overshoot(c, r, fl) }, Out::None),
        )
    }

    fn call_free_tail(&mut self, req: &skv_req, prefix: u32) -> Result<(u32, skv_req, Out), TestCaseError> {
        self.exec(
            format!("free_tail({prefix}) {}", show(req)),
            req,
            |m, r| m.op_free_tail(r, prefix),
            // SAFETY: the call helper passes this driver's live handle and a req it owns.
            |c, r| (unsafe { skv_free_tail(c, r, prefix) }, Out::None),
        )
    }

    fn call_free_aligned(&mut self, row: i32, target: u32, end: u32) -> Result<u32, TestCaseError> {
        let dummy = fresh_req();
        let (st, ..) = self.exec(
            format!("free_aligned(row {row}, target {target}, end {end})"),
            &dummy,
            |m, _| m.op_free_aligned(row, target, end),
            // SAFETY: the call helper passes this driver's live handle and a req it owns.
            |c, _| (unsafe { skv_free_aligned(c, row, target, end) }, Out::None),
        )?;
        Ok(st)
    }

    // --- the state of the world after every op ---------------------------------------------

    fn check_world(&mut self, with_active: bool) -> Result<(), TestCaseError> {
        let active: Vec<i32> = self.running.values().map(|r| r.req.req_pool_idx).collect();
        let passed: &[i32] = if with_active { &active } else { &[] };
        let mut h = skv_held { full_tokens: 7, swa_tokens: 7, rows: 7, aux_states: 7, sessions: 7, aux_handles: 7 };
        let ptr = if passed.is_empty() { std::ptr::null() } else { passed.as_ptr() };
        // SAFETY: the handle is this test's live cache; the other pointers are locals.
        let st = unsafe { skv_session_held(self.cache, ptr, passed.len(), &mut h) };
        let got = [h.full_tokens, h.swa_tokens, h.rows, h.aux_states, h.sessions, h.aux_handles];
        let want = self.model.held(passed);
        if code(st) != OK || got != want {
            return Err(self.failure(&format!(
                "session_held(active {passed:?}): {} {got:?}, model {want:?} (slots {:?})",
                status_name(code(st)),
                self.model.slots
            )));
        }
        let probe = fresh_req();
        for key in &KEYS[..SESSION_KEYS] {
            let mut handled = HANDLED_SENTINEL;
            // SAFETY: the handle is this test's live cache; the other pointers are locals.
            let st = unsafe { skv_checkpoint(self.cache, key.0, key.1, &probe, &mut handled) };
            let want = self.model.slots.contains_key(key) as u32;
            if code(st) != OK || handled != want {
                return Err(self.failure(&format!(
                    "checkpoint{key:?}: {} handled {handled}, model {want}",
                    status_name(code(st))
                )));
            }
        }
        if !self.eng().events.is_empty() {
            let e = std::mem::take(&mut self.eng().events);
            return Err(self.failure(&format!("callbacks from session_held/checkpoint: {e:?}")));
        }
        self.check_engine_rows()
    }

    /// Every row the engine lent is held by a running request or a slot and maps exactly the
    /// pages below its allocated end; every other row maps nothing.
    fn check_engine_rows(&mut self) -> Result<(), TestCaseError> {
        let mut held: HashMap<i32, u32> = HashMap::new();
        for s in self.model.slots.values() {
            held.insert(s.row, s.allocated);
        }
        for (key, r) in &self.running {
            let row = r.req.req_pool_idx;
            if let Some(k) = self.model.slot_holding(row) {
                if !(r.hit && k == *key && self.model.slots[&k].in_flight) {
                    return Err(self.failure(&format!("generator bug: running {key:?} holds row {row} of slot {k:?}")));
                }
            }
            held.insert(row, r.req.kv_allocated_len);
        }
        let ps = self.cfg.ps;
        // SAFETY: self.eng is the engine this driver owns for its whole run; no callback runs now.
        let e = unsafe { &*self.eng };
        for row in 0..self.cfg.rows as i32 {
            let want_pages = held.get(&row).map_or(0, |a| a.div_ceil(ps) as usize);
            if e.row_used[row as usize] != held.contains_key(&row) {
                return Err(self.failure(&format!(
                    "row {row}: engine says used {}, held {:?}",
                    e.row_used[row as usize],
                    held.get(&row)
                )));
            }
            for (s, p) in e.table[row as usize].iter().enumerate() {
                if p.is_some() != (s < want_pages) {
                    return Err(self.failure(&format!(
                        "row {row} page slot {s}: mapped {}, but the holder's allocated is {:?}",
                        p.is_some(),
                        held.get(&row)
                    )));
                }
            }
        }
        Ok(())
    }

    // --- ops ----------------------------------------------------------------------------------

    /// The `k`-th running request (of a session key only, with `session_only`).
    fn pick_running(&self, k: u8, session_only: bool) -> Option<(Key, Run)> {
        let keys: Vec<&Key> = self.running.keys().filter(|key| !session_only || key.0 != 0).collect();
        let key = **keys.get(k as usize % keys.len().max(1))?;
        Some((key, self.running[&key]))
    }

    fn growth(&self, g: u16) -> u32 {
        1 + g as u32 % (2 * self.cfg.ps + 12)
    }

    fn run(&mut self, op: &Op) -> Result<(), TestCaseError> {
        let ps = self.cfg.ps;
        let max_ctx = self.cfg.max_ctx;
        match *op {
            Op::Start { k, growth, shape, prot } => self.start(k, growth, shape, prot)?,
            Op::PreAbort { k, finish } => {
                let key = KEYS[k as usize % SESSION_KEYS];
                let mut req = fresh_req();
                req.origin_input_len = self.hist.get(&key).copied().unwrap_or(0) + 3;
                let (_, got, _) = self.call_match(key, &req, req.origin_input_len - 1, true)?;
                if finish {
                    self.call_finish(key, &got, true)?;
                }
            }
            Op::Retry { k, shrink } => {
                let Some((key, run)) = self.pick_running(k, true) else { return Ok(()) };
                if run.swapped_aux {
                    return Ok(());
                }
                let mut key_len = run.req.origin_input_len - 1;
                if shrink % 4 == 0 {
                    key_len = key_len.saturating_sub(shrink as u32 / 4);
                }
                let (st, got, _) = self.call_match(key, &run.req, key_len, false)?;
                let restored = self.model.slots.get(&key).is_some_and(|s| s.in_flight && s.row == got.req_pool_idx);
                if took(st) && restored {
                    let r = self.running.get_mut(&key).unwrap();
                    (r.req, r.hit) = (got, true);
                }
            }
            Op::Step { k, draft, accept } => self.step(k, draft, accept)?,
            Op::Extend { k, n } => {
                let Some((key, mut run)) = self.pick_running(k, false) else { return Ok(()) };
                let to = (run.req.kv_allocated_len + n as u32 % (2 * ps + 6)).min(max_ctx);
                self.eng().extend(run.req.req_pool_idx, run.req.kv_allocated_len, to);
                run.req.kv_allocated_len = to;
                self.log.push(format!("engine extend {key:?} -> {}", show(&run.req)));
                self.running.insert(key, run);
            }
            Op::Swa { k, n } => {
                let Some((key, mut run)) = self.pick_running(k, false) else { return Ok(()) };
                let r = &mut run.req;
                // a window trailing the committed end by a few tokens, or a cursor creeping forward
                let mut s = if n & 2 == 2 {
                    r.kv_committed_len.saturating_sub(n as u32 / 4 % 8).max(r.swa_evicted_seqlen)
                } else {
                    (r.swa_evicted_seqlen + 1 + n as u32 % (2 * ps + 4)).min(r.kv_committed_len)
                };
                if n & 1 == 1 {
                    s = floor_align(s, ps).max(r.swa_evicted_seqlen);
                }
                r.swa_evicted_seqlen = s;
                self.log.push(format!("engine swa {key:?} -> {}", show(&run.req)));
                self.running.insert(key, run);
            }
            Op::SwapAux { k } => {
                let Some((key, mut run)) = self.pick_running(k, false) else { return Ok(()) };
                let old = run.req.aux_state;
                self.eng().auxes.remove(&old);
                run.req.aux_state = if old % 3 == 0 { -1 } else { self.eng().new_aux() };
                run.swapped_aux = true;
                self.log.push(format!("engine swaps aux {key:?} -> {}", show(&run.req)));
                self.running.insert(key, run);
            }
            Op::PingPong { k } => {
                let Some((key, mut run)) = self.pick_running(k, false) else { return Ok(()) };
                let t = run.req.aux_track;
                match t.iter().position(|&h| h == -1) {
                    // The next tracked state goes to the empty entry.
                    Some(empty) => run.req.aux_track[empty] = self.eng().new_aux(),
                    // Both full: the engine frees the older entry itself (the lower handle).
                    None => {
                        let older = if t[0] < t[1] { 0 } else { 1 };
                        self.eng().auxes.remove(&t[older]);
                        run.req.aux_track[older] = -1;
                    }
                }
                // A retry would restore the slot's entries over these: the engine re-applies
                // them, which this driver does not model.
                run.swapped_aux = true;
                self.log.push(format!("engine ping-pong {key:?} -> {}", show(&run.req)));
                self.running.insert(key, run);
            }
            Op::Finish { k, mode, aborted, again } => {
                let Some((key, mut run)) = self.pick_running(k, false) else { return Ok(()) };
                if key.0 == 0 {
                    self.eng().drop_req(&run.req);
                    self.log.push(format!("engine drops its own request {key:?}"));
                    self.running.remove(&key);
                    return Ok(());
                }
                let out = run.req.output_len;
                run.req.finished_len = match mode % 8 {
                    // max_new_tokens reached: the last verify round overshot it
                    0..=3 if out > run.max_new => run.max_new as i32,
                    0..=3 => -1,
                    // a stop token inside the accepted drafts, or a retracted turn
                    4 | 5 => ((mode as u32 * 7) % (out + 1)) as i32,
                    6 => out.saturating_sub(mode as u32 / 8 % 4) as i32,
                    _ => out as i32,
                };
                self.running.insert(key, run);
                self.finish(key, key, aborted, again)?;
            }
            Op::FinishAs { k, other, aborted } => {
                if let Some((key, _)) = self.pick_running(k, false) {
                    self.finish(key, KEYS[other as usize % SESSION_KEYS], aborted, false)?;
                }
            }
            Op::MatchAs { k, other } => {
                let other = KEYS[other as usize % SESSION_KEYS];
                let Some((key, run)) = self.pick_running(k, false) else { return Ok(()) };
                if other == key {
                    return Ok(());
                }
                let (_, _, out) = self.call_match(other, &run.req, run.req.origin_input_len - 1, false)?;
                if matches!(out, Out::Match(1, _)) {
                    return Err(self.failure("generator bug: a request holding its own row hit another key"));
                }
            }
            Op::Checkpoint { k } => {
                let key = KEYS[k as usize % KEYS.len()];
                let req = self.running.get(&key).map_or_else(fresh_req, |r| r.req);
                self.call_checkpoint(key, &req)?;
            }
            Op::ReleaseBranch { k } => {
                let key = KEYS[k as usize % KEYS.len()];
                self.call_release(key.0, Some(key.1))?;
            }
            Op::ReleaseSession { s } => {
                self.call_release(s as u64, None)?;
            }
            Op::Trim { k, x } => {
                // the engine may cut a running session's turn back: the slot shortens with it
                let Some((key, run)) = self.pick_running(k, false) else { return Ok(()) };
                let mut r = run.req;
                let fl = if x % 8 == 7 { r.output_len + 1 + x as u32 / 8 % 3 } else { x as u32 % (r.output_len + 1) };
                let lo = r.cache_protected_len.max(1);
                if x % 8 == 6 && r.origin_input_len >= lo {
                    // a turn cut back into its prompt (the engine shortens its input and re-queues it)
                    r.origin_input_len = lo + x as u32 / 8 % (r.origin_input_len - lo + 1);
                }
                let (st, mut got, _) = self.call_trim(&r, fl)?;
                if took(st) {
                    // the engine's own record of the finish point follows the trimmed output
                    if got.finished_len > got.output_len as i32 {
                        got.finished_len = -1;
                    }
                    self.running.get_mut(&key).unwrap().req = got;
                }
            }
            Op::FreeTail { k, x } => {
                let Some((key, run)) = self.pick_running(k, false) else { return Ok(()) };
                let r = run.req;
                let (a, p) = (r.kv_allocated_len, r.cache_protected_len);
                let prefix = match x % 8 {
                    7 => a + 1 + x as u32 / 8 % 3,
                    6 if p > 0 => p - 1 - x as u32 / 8 % p,
                    _ if p <= a => p + x as u32 % (a - p + 1),
                    _ => return Ok(()),
                };
                let (st, got, _) = self.call_free_tail(&r, prefix)?;
                if took(st) {
                    self.running.get_mut(&key).unwrap().req = got;
                }
            }
            Op::FreeAligned { k, x } => self.free_aligned_op(k, x)?,
            Op::Intrude { k, pre } => {
                let Some((key, run)) = self.pick_in_flight(k) else { return Ok(()) };
                let mut req = fresh_req();
                req.origin_input_len = run.req.origin_input_len + 1;
                let (_, _, out) = self.call_match(key, &req, run.req.origin_input_len, pre)?;
                if matches!(out, Out::Match(1, _)) {
                    return Err(self.failure("a second request restored a running session"));
                }
            }
            Op::Stale { k, what, x } => self.stale_op(k, what, x)?,
            Op::Lie { k, what, x } => self.lie_op(k, what, x)?,
            Op::Invalid { k, field, func, v } => self.invalid(KEYS[k as usize % KEYS.len()], field, func, v)?,
            Op::Fail { cb } => {
                self.fail_next = Some([Cb::Read, Cb::FreeKv, Cb::FreeRow, Cb::DecLock, Cb::FreeAux][cb as usize % 5]);
            }
        }
        Ok(())
    }

    /// A new request for an idle key: a session turn matches (a hit restores the slot), a first
    /// turn or a non-session request gets a row and maybe a prefix-tree prefix.
    fn start(&mut self, k: u8, growth: u16, shape: u8, prot: u8) -> Result<(), TestCaseError> {
        let ps = self.cfg.ps;
        let max_ctx = self.cfg.max_ctx;
        let idle: Vec<Key> = KEYS.iter().copied().filter(|k| !self.running.contains_key(k)).collect();
        let Some(&key) = idle.get(k as usize % idle.len().max(1)) else { return Ok(()) };
        let h = self.hist.get(&key).copied().unwrap_or(0);
        let g = self.growth(growth);
        // shape 0: an edited history, shorter than what the session holds
        let prompt = if shape.is_multiple_of(4) { 1 + (growth as u32 * 7919) % (h + g) } else { h + g };
        let mut key_len = prompt - 1;
        // shape 1: fewer reusable tokens than the history (e.g. an edited last message)
        if shape % 4 == 1 {
            key_len = key_len.saturating_sub(1 + shape as u32 / 4 % (2 * ps + 8));
        }
        let mut req = fresh_req();
        req.origin_input_len = prompt;
        let pre = prompt >= max_ctx;
        let mut hit = false;
        if key.0 != 0 {
            let (st, got, out) = self.call_match(key, &req, key_len, pre)?;
            if pre {
                self.hist.remove(&key);
            }
            if !took(st) || pre {
                return Ok(());
            }
            req = got;
            hit = req.req_pool_idx != -1;
            if st == OK && out != Out::Match(hit as u32, req.kv_allocated_len) {
                return Err(self.failure(&format!("unexpected match out {out:?}")));
            }
        } else if pre {
            return Ok(());
        }
        if !hit {
            let Some(row) = self.eng().alloc_row() else { return Ok(()) };
            let p = floor_align(((prot % 4) as u32 * ps).min(key_len), ps);
            req.req_pool_idx = row;
            req.cache_protected_len = p;
            req.kv_committed_len = p;
            req.kv_allocated_len = p;
            self.eng().map_tree(row, p);
            if p > 0 || prot & 8 != 0 {
                (req.lock_node, req.lock_receipt) = self.eng().new_lock();
            }
            if prot & 16 != 0 {
                // A recurrent-state request: its pool slot and its first track entry.
                req.aux_state = self.eng().new_aux();
                req.aux_track[(prot & 0x80 != 0) as usize] = self.eng().new_aux();
            }
        }
        let max_new = 1 + (growth >> 8) as u32 % (ps + 16);
        let window = (prot & 0x60 == 0x60).then_some(1 + (growth >> 4) as u32 % (2 * ps + 4));
        self.running.insert(key, Run { req, hit, swapped_aux: false, max_new, window });
        Ok(())
    }

    /// Prefill chunks, then speculative verify rounds up to max_new_tokens (the last overshoots).
    fn step(&mut self, k: u8, draft: u8, accept: u8) -> Result<(), TestCaseError> {
        let ps = self.cfg.ps;
        let max_ctx = self.cfg.max_ctx;
        let Some((key, mut run)) = self.pick_running(k, false) else { return Ok(()) };
        let r = &mut run.req;
        let row = r.req_pool_idx;
        let mut seed = accept as u32;
        for _ in 0..1 + (draft >> 4) % 4 {
            seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12_345) >> 3;
            let to = if r.kv_committed_len < r.origin_input_len {
                // a prefill chunk
                r.origin_input_len.min(r.kv_committed_len + 1 + seed % (2 * ps + 8))
            } else if r.output_len < run.max_new && r.kv_committed_len + 1 < max_ctx {
                // a verify round: the last token plus d drafts, a of them accepted
                let d = (draft as u32 % 8).min(max_ctx - r.kv_committed_len - 1);
                let a = seed % (d + 1);
                r.output_len += a + 1;
                let need = r.kv_committed_len + d + 1;
                if need > r.kv_allocated_len {
                    self.eng().extend(row, r.kv_allocated_len, need);
                    r.kv_allocated_len = need;
                }
                r.kv_committed_len + a + 1
            } else {
                break;
            };
            if to > r.kv_allocated_len {
                self.eng().extend(row, r.kv_allocated_len, to);
                r.kv_allocated_len = to;
            }
            r.kv_committed_len = to;
            if to == r.origin_input_len && r.output_len == 0 {
                r.output_len = 1;
            }
            if let Some(w) = run.window {
                r.swa_evicted_seqlen = r.swa_evicted_seqlen.max(to.saturating_sub(w));
            }
        }
        self.log.push(format!("engine step {key:?} -> {}", show(&run.req)));
        self.running.insert(key, run);
        Ok(())
    }

    /// The `k`-th running request whose session slot is in flight.
    fn pick_in_flight(&self, k: u8) -> Option<(Key, Run)> {
        let keys: Vec<Key> = (self.running.iter())
            .filter(|(key, r)| self.model.slots.get(key).is_some_and(|s| s.in_flight && s.row == r.req.req_pool_idx))
            .map(|(key, _)| *key)
            .collect();
        let key = *keys.get(k as usize % keys.len().max(1))?;
        Some((key, self.running[&key]))
    }

    /// Whether the model says a call changes nothing: refused, or done with no effect on the
    /// engine or the slots. A made-up req or range is only sent then: anything else would
    /// change the engine's pools behind its records.
    fn inert(&self, op: impl FnOnce(&mut Model) -> Res) -> bool {
        let mut m = self.model.clone();
        match quietly(|| op(&mut m)) {
            Err(_) => true,
            Ok((fx, _)) => fx.is_empty() && m.slots == self.model.slots,
        }
    }

    /// skv_free_aligned on a running request's row: a tail the engine frees itself (its req
    /// follows), and the ranges a running session's slot refuses or ignores.
    fn free_aligned_op(&mut self, k: u8, x: u16) -> Result<(), TestCaseError> {
        let max_ctx = self.cfg.max_ctx;
        let Some((key, run)) = self.pick_running(k, false) else { return Ok(()) };
        let r = run.req;
        let (row, a, p) = (r.req_pool_idx, r.kv_allocated_len, r.cache_protected_len);
        let slot = self.model.slot_holding(row).map(|k| self.model.slots[&k].clone());
        let xs = x as u32 / 8;
        let (target, end) = match x % 8 {
            7 => {
                let bad_row = if xs & 1 == 0 { self.cfg.rows as i32 + (xs % 3) as i32 } else { -1 - (xs % 3) as i32 };
                self.call_free_aligned(bad_row, p, a)?;
                return Ok(());
            }
            6 => (p, max_ctx + 1 + xs % 3),
            // nothing to free: the end at or before the target
            5 => {
                let end = xs % (a + 1);
                (end + xs / 4 % 5, end)
            }
            // an end short of what the running slot records
            4 => match slot {
                Some(s) if s.allocated > 1 => {
                    let end = 1 + xs % (s.allocated - 1);
                    (xs / 64 % end, end)
                }
                _ => return Ok(()),
            },
            // a target inside the protected prefix
            3 if p > 0 => (xs % p, a),
            _ if p <= a => {
                let target = p + x as u32 % (a - p + 1);
                let st = self.call_free_aligned(row, target, a)?;
                if took(st) {
                    let r = &mut self.running.get_mut(&key).unwrap().req;
                    r.kv_allocated_len = r.kv_allocated_len.min(target);
                    r.kv_committed_len = r.kv_committed_len.min(target);
                    r.swa_evicted_seqlen = r.swa_evicted_seqlen.min(target);
                }
                return Ok(());
            }
            _ => return Ok(()),
        };
        if self.inert(|m| m.op_free_aligned(row, target, end)) {
            self.call_free_aligned(row, target, end)?;
        }
        Ok(())
    }

    /// The engine using an old copy of a finished turn's req, or the idle slot's own record,
    /// where only a running request may act: every primitive and a finish are refused; an
    /// abort releases the session; a match restores from the slot alone.
    fn stale_op(&mut self, k: u8, what: u8, x: u16) -> Result<(), TestCaseError> {
        let idle: Vec<(Key, Slot)> =
            self.model.slots.iter().filter(|(_, s)| !s.in_flight).map(|(k, s)| (*k, s.clone())).collect();
        let Some((key, s)) = idle.get(k as usize % idle.len().max(1)).cloned() else { return Ok(()) };
        let mut rec = fresh_req();
        (rec.req_pool_idx, rec.kv_committed_len, rec.kv_allocated_len) = (s.row, s.committed, s.allocated);
        (rec.cache_protected_len, rec.swa_evicted_seqlen, rec.origin_input_len) = (s.protected, s.swa, s.committed);
        (rec.lock_node, rec.lock_receipt) = s.lock;
        rec.aux_state = s.aux;
        rec.aux_track = s.track;
        let kept = self.stale.iter().rev().find(|(kk, r)| *kk == key && r.req_pool_idx == s.row).map(|(_, r)| *r);
        let mut r = kept.filter(|_| x & 1 == 0).unwrap_or(rec);
        let xs = x as u32 >> 1;
        match what % 6 {
            0 => {
                // the argument checks come first
                if xs.is_multiple_of(4) {
                    r.finished_len = r.output_len as i32 + 1;
                }
                self.call_finish(key, &r, false)?;
            }
            1 => {
                // an idle slot's abort releases the slot's own record, whatever the stale req
                // claims: behind the slot's end, or the pre-trim copy past it (that tail went
                // back when the turn finished)
                let r = match kept.filter(|_| x & 2 != 0) {
                    Some(pre_trim) => pre_trim,
                    None => {
                        let mut r = rec;
                        r.kv_allocated_len = s.protected + xs % (s.allocated - s.protected + 1);
                        r.kv_committed_len = r.kv_committed_len.min(r.kv_allocated_len);
                        r.swa_evicted_seqlen = r.swa_evicted_seqlen.min(r.kv_allocated_len);
                        r
                    }
                };
                self.call_finish(key, &r, true)?;
            }
            2 => {
                self.call_trim(&r, xs % (r.output_len + 2))?;
            }
            3 => {
                self.call_free_tail(&r, xs % (r.kv_allocated_len + 2))?;
            }
            4 => {
                let max_ctx = self.cfg.max_ctx;
                self.call_free_aligned(s.row, xs / 16 % (max_ctx + 1), xs % (max_ctx + 2))?;
            }
            _ => {
                // the old copy as the session's next turn
                if self.running.contains_key(&key) {
                    return Ok(());
                }
                let prompt = self.hist.get(&key).copied().unwrap_or(0) + self.growth(x);
                if prompt >= self.cfg.max_ctx {
                    return Ok(());
                }
                (r.origin_input_len, r.output_len, r.finished_len) = (prompt, 0, -1);
                let (st, got, out) = self.call_match(key, &r, prompt - 1, false)?;
                if took(st) && matches!(out, Out::Match(1, _)) {
                    let max_new = 1 + xs % (self.cfg.ps + 16);
                    self.running.insert(key, Run { req: got, hit: true, swapped_aux: false, max_new, window: None });
                }
            }
        }
        Ok(())
    }

    /// A running session's req claiming less than its slot records (a shorter allocation or
    /// protected prefix, maybe a prompt ending inside them): a primitive or a finish cutting
    /// from there is refused. Sent only when the model says the call changes nothing.
    fn lie_op(&mut self, k: u8, what: u8, x: u16) -> Result<(), TestCaseError> {
        let ps = self.cfg.ps;
        let Some((key, run)) = self.pick_in_flight(k) else { return Ok(()) };
        let s = self.model.slots[&key].clone();
        let mut r = run.req;
        let xs = x as u32;
        if what & 1 == 0 {
            if s.allocated == 0 {
                return Ok(());
            }
            r.kv_allocated_len = xs % s.allocated;
            r.kv_committed_len = r.kv_committed_len.min(r.kv_allocated_len);
            r.swa_evicted_seqlen = r.swa_evicted_seqlen.min(r.kv_allocated_len);
        } else {
            if r.cache_protected_len == 0 {
                return Ok(());
            }
            r.cache_protected_len -= ps * (1 + xs % (r.cache_protected_len / ps));
        }
        if what & 2 != 0 {
            let room = r.kv_allocated_len.saturating_sub(r.cache_protected_len);
            r.origin_input_len = r.cache_protected_len + (xs >> 8) % (room + 1);
        }
        let fl = (xs >> 4) % (r.output_len + 1);
        match (what >> 2) % 3 {
            0 => {
                if self.inert(|m| m.op_trim(&mut { r }, fl)) {
                    self.call_trim(&r, fl)?;
                }
            }
            1 => {
                let room = r.kv_allocated_len.saturating_sub(r.cache_protected_len);
                let prefix = r.cache_protected_len + (xs >> 4) % (room + 1);
                if self.inert(|m| m.op_free_tail(&mut { r }, prefix)) {
                    self.call_free_tail(&r, prefix)?;
                }
            }
            _ => {
                r.finished_len = fl as i32;
                if self.inert(|m| m.op_finished(key, &mut { r }, false)) {
                    self.call_finish(key, &r, false)?;
                }
            }
        }
        Ok(())
    }

    /// Finish the request running under `key` as a request of `as_key`.
    fn finish(&mut self, key: Key, as_key: Key, aborted: bool, again: bool) -> Result<(), TestCaseError> {
        let run = self.running[&key];
        let (st, got, _) = self.call_finish(as_key, &run.req, aborted)?;
        if took(st) {
            self.running.remove(&key);
            if !aborted {
                self.hist.insert(as_key, got.origin_input_len + got.output_len);
                if self.stale.len() == 16 {
                    self.stale.remove(0);
                }
                self.stale.push((as_key, run.req));
                if again {
                    // the slot is idle now: the same req finishing twice would free its tail twice
                    self.call_finish(as_key, &run.req, false)?;
                }
            }
        }
        Ok(())
    }

    fn invalid(&mut self, key: Key, field: u8, func: u8, v: u8) -> Result<(), TestCaseError> {
        let ps = self.cfg.ps;
        let v32 = v as u32;
        let mut r = self.running.get(&key).map_or_else(
            || {
                let mut r = fresh_req();
                r.origin_input_len = 5;
                r
            },
            |run| run.req,
        );
        match field % 14 {
            1 if r.req_pool_idx != -1 => r.cache_protected_len = ceil_align(r.kv_committed_len + 1, ps) as u32,
            2 if ps > 1 => r.cache_protected_len += 1 + v32 % (ps - 1),
            3 => r.kv_allocated_len = self.cfg.max_ctx + 1 + v32 % 3,
            4 => r.swa_evicted_seqlen = r.kv_allocated_len + 1 + v32 % 4,
            5 => r.finished_len = (r.output_len + 1 + v32 % 3) as i32,
            6 => r.finished_len = -2 - (v32 % 5) as i32,
            7 => r.req_pool_idx = (self.cfg.rows + v32 % 3) as i32,
            8 => r.req_pool_idx = -2 - (v32 % 3) as i32,
            9..=11 => return self.null_args(key, &r, field % 14, func),
            12 => {
                // trim target past u32
                r.origin_input_len = u32::MAX - v32 % 3;
                r.output_len = r.output_len.max(3);
                r.finished_len = -1;
            }
            13 => {
                // trim target below the protected prefix
                r.origin_input_len = 0;
                r.output_len = 0;
                r.finished_len = -1;
            }
            _ => r.kv_committed_len = r.kv_allocated_len + 1 + v32 % 5,
        }
        let aborted = v & 1 == 1;
        let fl = v32 % (r.output_len + 1);
        let f = func % 5;
        // only calls the model rejects: a valid one here would change state behind the driver
        let mut m = self.model.clone();
        let mut pr = r;
        let rejected = quietly(|| {
            match f {
                0 => m.op_match(key, &mut pr, v32, aborted),
                1 => m.op_finished(key, &mut pr, aborted),
                2 => m.op_checkpoint(key, &pr),
                3 => m.op_trim(&mut pr, fl),
                _ => m.op_free_tail(&mut pr, r.cache_protected_len),
            }
            .is_err()
        });
        if !rejected {
            self.log.push(format!("(skipped a valid 'invalid' call {f} on {})", show(&r)));
            return Ok(());
        }
        let (st, ..) = match f {
            0 => self.call_match(key, &r, v32, aborted)?,
            1 => self.call_finish(key, &r, aborted)?,
            2 => self.call_checkpoint(key, &r)?,
            3 => self.call_trim(&r, fl)?,
            _ => self.call_free_tail(&r, r.cache_protected_len)?,
        };
        assert_ne!(st, OK);
        Ok(())
    }

    /// NULL handle, req or out pointer: SKV_ERR_NULL_ARG, nothing touched.
    fn null_args(&mut self, key: Key, r: &skv_req, which: u8, func: u8) -> Result<(), TestCaseError> {
        let c = if which == 11 { std::ptr::null_mut() } else { self.cache };
        let mut req = *r;
        let rp: *mut skv_req = if which == 9 { std::ptr::null_mut() } else { &mut req };
        let mut out = skv_match { hit: MATCH_SENTINEL.0, prefix_len: MATCH_SENTINEL.1 };
        let mut handled = HANDLED_SENTINEL;
        let mut held = skv_held { full_tokens: 9, swa_tokens: 9, rows: 9, aux_states: 9, sessions: 9, aux_handles: 9 };
        let null_out = which == 10;
        // only the functions that take the pointer being NULLed
        let f = match which {
            9 => [0, 1, 2, 3, 4][func as usize % 5],
            10 => [0, 2, 5][func as usize % 3],
            _ => func % 7,
        };
        self.eng().events.clear();
        // SAFETY: the handle is this test's live cache; the other pointers are locals.
        let (name, st) = unsafe {
            match f {
                0 => (
                    "match_prefix",
                    skv_match_prefix(c, key.0, key.1, rp, 3, 0, if null_out { std::ptr::null_mut() } else { &mut out }),
                ),
                1 => ("cache_finished_req", skv_cache_finished_req(c, key.0, key.1, rp, 1)),
                2 => (
                    "checkpoint",
                    skv_checkpoint(c, key.0, key.1, rp, if null_out { std::ptr::null_mut() } else { &mut handled }),
                ),
                3 => ("trim_overshoot", skv_trim_overshoot(c, rp, 0)),
                4 => ("free_tail", skv_free_tail(c, rp, 0)),
                5 => (
                    "session_held",
                    skv_session_held(c, std::ptr::null(), 0, if null_out { std::ptr::null_mut() } else { &mut held }),
                ),
                _ => (
                    "release_session",
                    if which == 11 {
                        skv_release_session(c, key.0)
                    } else {
                        skv_release_branch(std::ptr::null_mut(), key.0, key.1)
                    },
                ),
            }
        };
        let err = last_error();
        let evs = std::mem::take(&mut self.eng().events);
        self.log.push(format!("{name} with NULL #{which} -> {}", status_name(code(st))));
        if code(st) != NULL_ARG
            || err.is_empty()
            || !evs.is_empty()
            || !same(&req, r)
            || (out.hit, out.prefix_len) != MATCH_SENTINEL
            || handled != HANDLED_SENTINEL
            || held.sessions != 9
        {
            return Err(self.failure(&format!(
                "{name} with a NULL pointer (#{which}): {} {err:?}, callbacks {evs:?}, req {}",
                status_name(code(st)),
                show(&req)
            )));
        }
        Ok(())
    }

    /// Finish or abort everything, release every session: nothing may be left anywhere.
    fn drain(&mut self) -> Result<(), TestCaseError> {
        self.fail_next = None;
        for key in self.running.keys().copied().collect::<Vec<_>>() {
            let run = self.running[&key];
            if key.0 != 0 {
                let (st, ..) = self.call_finish(key, &run.req, true)?;
                if st == OK {
                    self.running.remove(&key);
                    continue;
                }
            }
            self.eng().drop_req(&run.req);
            self.running.remove(&key);
        }
        for s in 0..4 {
            if self.call_release(s, None)? != OK {
                return Err(self.failure("release_session refused with nothing in flight"));
            }
        }
        self.check_world(false)?;
        // SAFETY: self.eng is the engine this driver owns for its whole run; no callback runs now.
        let e = unsafe { &*self.eng };
        let leaked = e.pages.values().filter(|o| **o != Owner::Tree).count();
        if !self.model.slots.is_empty()
            || leaked > 0
            || !e.locks.is_empty()
            || !e.auxes.is_empty()
            || !e.violations.is_empty()
        {
            let msg = format!(
                "after draining: {} slots, {leaked} pages, locks {:?}, aux {:?}, violations {:?}",
                self.model.slots.len(),
                e.locks,
                e.auxes,
                e.violations
            );
            return Err(self.failure(&msg));
        }
        Ok(())
    }
}

/// Tally what the generator reached: the call, its status, and the kinds of effect it had.
fn cover(what: &str, st: u32, effs: &[Eff], out: &Out) {
    let name = what.split(['(', ' ']).next().unwrap_or(what);
    let mut tag = format!("{name} {}", status_name(st & 0xff));
    if let Out::Match(1, _) = out {
        tag += " hit";
    }
    if what.contains("pre true") {
        tag += " pre";
    }
    if what.contains("aborted true") {
        tag += " aborted";
    }
    for (kind, present) in [
        ("kv", effs.iter().any(|e| matches!(e, Eff::FreeKv(..)))),
        ("row", effs.iter().any(|e| matches!(e, Eff::FreeRow(_)))),
        ("lock", effs.iter().any(|e| matches!(e, Eff::DecLock(..)))),
        ("aux", effs.iter().any(|e| matches!(e, Eff::FreeAux(_)))),
    ] {
        if present {
            tag += " ";
            tag += kind;
        }
    }
    if let Out::Handled(1) = out {
        tag += " handled";
    }
    COVERAGE.with_borrow_mut(|c| *c.entry(tag).or_default() += 1);
}

fn run_case(cfg: &Cfg, ops: &[Op]) -> Result<(), TestCaseError> {
    let mut sim = Sim::new(cfg);
    for (i, op) in ops.iter().enumerate() {
        sim.log.push(format!("#{i} {op:?}"));
        sim.run(op)?;
        sim.check_world(i % 2 == 0)?;
    }
    sim.drain()
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 512,
        max_shrink_iters: 20_000,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn sessions_match_the_reference_model(cfg in cfg_strategy(), ops in prop::collection::vec(op_strategy(), 1..160)) {
        run_case(&cfg, &ops)?;
    }
}

/// A fixed-seed run of the same generator must reach every path the property is about;
/// otherwise a generator change could quietly stop testing something.
#[test]
fn the_generator_reaches_every_path() {
    use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
    let config = Config { cases: 300, failure_persistence: None, ..Config::default() };
    let mut runner = TestRunner::new_with_rng(config, TestRng::deterministic_rng(RngAlgorithm::ChaCha));
    let strategy = (cfg_strategy(), prop::collection::vec(op_strategy(), 1..160));
    if let Err(e) = runner.run(&strategy, |(cfg, ops)| run_case(&cfg, &ops)) {
        panic!("{e}");
    }
    let cov = COVERAGE.with_borrow(|c| c.clone());
    let reached = |want: &str| cov.keys().any(|k| k == want || k.starts_with(&format!("{want} ")));
    let missing: Vec<&str> = [
        "match OK hit",
        "match OK hit kv",
        "match OK pre",
        "match OK kv row lock",
        "match STATE",
        "match INVALID_ARG",
        "match CALLBACK",
        "finished OK kv",
        "finished OK aborted kv row lock aux",
        "finished OK aborted",
        "finished STATE",
        "finished STATE aborted",
        "finished INVALID_ARG",
        "finished CALLBACK",
        "finished CALLBACK aborted",
        "checkpoint OK handled",
        "checkpoint INVALID_ARG",
        "release_branch OK kv row",
        "release_branch STATE",
        "release_session OK kv row",
        "release_session STATE",
        "release_session CALLBACK",
        "trim_overshoot OK kv",
        "trim_overshoot INVALID_ARG",
        "free_tail OK kv",
        "free_tail STATE",
        "free_tail INVALID_ARG",
        "free_aligned OK kv",
        "free_aligned INVALID_ARG",
        "model: match: req holds another row",
        "model: match: aligned release of a slot in flight",
        "model: match: aligned release",
        "model: match: retry past the slot",
        "model: match: prefix below protected",
        "model: match: swa floors the prefix",
        "model: abort: first turn on another slot's row",
        "model: abort: req past the slot",
        "model: finish: first turn on another slot's row",
        "model: trim: swa floors the target",
        // docs/decisions.md's rules for running and idle sessions
        "model: match: second request on a running session",
        "model: match: retry",
        "model: match: stale copy, lengths ignored",
        "model: finish: idle slot (stale req)",
        "model: abort: idle slot",
        "model: abort: idle slot, stale req past its end",
        "model: free_aligned: idle session row",
        "model: trim: idle session row",
        "model: free_tail: idle session row",
        "model: free_aligned: end short of the running slot's",
        "model: trim: end short of the running slot's",
        "model: free_tail: end short of the running slot's",
        "model: finish: end short of the running slot's",
        "model: free_aligned: into the running slot's protected prefix",
        "model: trim: into the running slot's protected prefix",
        "model: free_tail: into the running slot's protected prefix",
        "model: finish: into the running slot's protected prefix",
        "model: free_aligned: nothing to free on a running session row",
        "model: free_aligned: shortens the running slot",
        "model: trim: shortens the running slot",
        "model: free_tail: shortens the running slot",
        "trim_overshoot STATE",
        "free_aligned STATE",
    ]
    .into_iter()
    .filter(|w| !reached(w))
    .collect();
    assert!(missing.is_empty(), "never reached: {missing:?}\nreached: {cov:#?}");
}

/// Golden case 2 of docs/operations.md through the same driver: pins the model to the spelled-out numbers.
#[test]
fn golden_case_2_through_the_driver() {
    // case 2: finish with an over-allocated tail, ps = 16: frees [32, 40), slot keeps 17
    let cfg = Cfg { ps: 16, aligned: false, rows: 4, max_ctx: 128 };
    let mut sim = Sim::new(&cfg);
    let mut req = fresh_req();
    req.req_pool_idx = sim.eng().alloc_row().unwrap();
    req.origin_input_len = 17;
    sim.eng().extend(req.req_pool_idx, 0, 40);
    (req.kv_committed_len, req.kv_allocated_len) = (17, 40);
    sim.running.insert((1, 0), Run { req, hit: false, swapped_aux: false, max_new: 1, window: None });
    let (st, ..) = sim.call_finish((1, 0), &req, false).unwrap();
    assert_eq!(st, OK);
    sim.running.clear();
    let s = &sim.model.slots[&(1, 0)];
    assert_eq!((s.committed, s.allocated), (17, 17));
    let row = &sim.eng().table[req.req_pool_idx as usize];
    assert!(row[1].is_some() && row[2].is_none(), "[32, 40) freed, the page of 16..31 kept");
    // the next turn matches: prefix 17 kept, nothing freed (the partial page 16..31 stays mapped)
    let mut next = fresh_req();
    next.origin_input_len = 30;
    let (st, got, out) = sim.call_match((1, 0), &next, 29, false).unwrap();
    assert_eq!((st, out), (OK, Out::Match(1, 17)));
    assert_eq!((got.kv_committed_len, got.kv_allocated_len), (17, 17));
    sim.running.insert((1, 0), Run { req: got, hit: true, swapped_aux: false, max_new: 1, window: None });
    sim.check_world(true).unwrap();
    sim.drain().unwrap();
}
