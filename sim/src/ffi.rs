//! The simulator's one door into libskv: every call goes through the exported C ABI, as
//! an engine's would, and the session operations are timed one by one.

use std::cell::{Cell, RefCell};
use std::collections::HashSet;
use std::ffi::{c_int, c_void};
use std::time::Instant;

use skv::skv_status::{self, SKV_OK};
use skv::{skv_cache, skv_cache_config, skv_check_report, skv_engine_hooks, skv_held, skv_match, skv_req, skv_stats};

mod tier;

/// The timed operations, in report order.
#[derive(Clone, Copy)]
pub enum Op {
    Match,
    AllocRow,
    MapPrefix,
    Extend,
    Commit,
    Finish,
    Release,
    Evict,
    ExtendBatch,
    CommitBatch,
    SwaEvict,
}

pub const OPS: [(Op, &str); 11] = [
    (Op::Match, "match"),
    (Op::AllocRow, "alloc_row"),
    (Op::MapPrefix, "map_prefix"),
    (Op::Extend, "extend"),
    (Op::Commit, "commit"),
    (Op::Finish, "finish"),
    (Op::Release, "release"),
    (Op::Evict, "evict"),
    (Op::ExtendBatch, "extend_batch"),
    (Op::CommitBatch, "commit_batch"),
    (Op::SwaEvict, "swa_evict"),
];

/// What the engine hooks saw: every prefix-tree lock a session took must come back
/// exactly once, through `dec_lock_ref`, when libskv releases the session.
#[derive(Default)]
pub struct Locks {
    pub returned: Cell<u64>,
    pub receipt_sum: Cell<u64>,
    pub wrong_node: Cell<u64>,
}

/// The engine's recurrent-state pool (`--mamba`; sglang's mamba pool): every handle it
/// hands out must come back exactly once, from libskv's `free_aux` or from the engine itself
/// (a ping-pong track entry it replaced), and never as the empty sentinel -1.
#[derive(Default)]
pub struct Handles {
    next: Cell<i64>,
    live: RefCell<HashSet<i64>>,
    pub allocated: Cell<u64>,
    pub freed_by_libskv: Cell<u64>,
    pub freed_by_engine: Cell<u64>,
    /// What `free_aux` received since the engine last looked, in order.
    handed_back: RefCell<Vec<i64>>,
    /// `free_aux` calls with -1 or with a handle not live (never handed out, or freed before).
    pub bad: RefCell<Vec<i64>>,
}

impl Handles {
    pub fn alloc(&self) -> i64 {
        let h = self.next.get();
        self.next.set(h + 1);
        self.live.borrow_mut().insert(h);
        self.allocated.set(self.allocated.get() + 1);
        h
    }

    /// The engine lets a handle go itself; false when it was not live.
    pub fn engine_free(&self, h: i64) -> bool {
        let ok = self.live.borrow_mut().remove(&h);
        if ok {
            self.freed_by_engine.set(self.freed_by_engine.get() + 1);
        }
        ok
    }

    pub fn take_handed_back(&self) -> Vec<i64> {
        std::mem::take(&mut *self.handed_back.borrow_mut())
    }

    pub fn live(&self) -> usize {
        self.live.borrow().len()
    }
}

/// One `copy_pages` call: the copies of `ticket`, enqueued and not yet run (`--host-pool-tokens`).
pub struct CopyCall {
    pub ticket: u64,
    pub direction: u32,
    pub src: Vec<i32>,
    pub dst: Vec<i32>,
    pub n_full: usize,
}

/// The engine hooks' state, their `user_data`.
#[derive(Default)]
pub struct Hooks {
    pub locks: Locks,
    pub handles: Handles,
    /// What `copy_pages` enqueued since the engine last looked, in order.
    pub copies: RefCell<Vec<CopyCall>>,
}

/// The prefix-tree node of the shared system prompt.
pub const SHARED_NODE: u64 = 7;

extern "C" fn dec_lock_ref(user_data: *mut c_void, node: u64, receipt: u64) -> c_int {
    // SAFETY: user_data is the `Hooks` that `Cache` owns and outlives the handle.
    let locks = unsafe { &(*(user_data as *const Hooks)).locks };
    locks.returned.set(locks.returned.get() + 1);
    locks.receipt_sum.set(locks.receipt_sum.get().wrapping_add(receipt));
    if node != SHARED_NODE {
        locks.wrong_node.set(locks.wrong_node.get() + 1);
    }
    0
}

extern "C" fn free_aux(user_data: *mut c_void, aux: i64) -> c_int {
    // SAFETY: as in `dec_lock_ref`.
    let h = unsafe { &(*(user_data as *const Hooks)).handles };
    h.handed_back.borrow_mut().push(aux);
    if aux != -1 && h.live.borrow_mut().remove(&aux) {
        h.freed_by_libskv.set(h.freed_by_libskv.get() + 1);
    } else {
        h.bad.borrow_mut().push(aux);
    }
    0
}

extern "C" fn copy_pages(
    user_data: *mut c_void,
    ticket: u64,
    direction: u32,
    src: *const i32,
    dst: *const i32,
    n_full: usize,
    n_swa: usize,
) -> c_int {
    // SAFETY: as in `dec_lock_ref`.
    let h = unsafe { &*(user_data as *const Hooks) };
    let n = n_full + n_swa;
    // SAFETY: libskv passes n readable values in each array, valid for the call.
    let (src, dst) =
        unsafe { (std::slice::from_raw_parts(src, n).to_vec(), std::slice::from_raw_parts(dst, n).to_vec()) };
    h.copies.borrow_mut().push(CopyCall { ticket, direction, src, dst, n_full });
    0
}

/// An owned-mode cache handle plus the per-operation latency samples (nanoseconds).
pub struct Cache {
    ptr: *mut skv_cache,
    pub hooks: Box<Hooks>,
    pub samples: Vec<Vec<u32>>,
    /// Requests served by batch calls (each batch call is one sample).
    pub batched_requests: u64,
}

impl Drop for Cache {
    fn drop(&mut self) {
        // SAFETY: ptr came from skv_cache_new and is freed once, before `hooks` drops.
        unsafe { skv::skv_cache_free(self.ptr) };
    }
}

impl Cache {
    /// An owned-pool cache with its hooks installed (`copy_pages` when `copy`: the host
    /// tier's); the error carries libskv's message.
    pub fn new(cfg: &skv_cache_config, copy: bool) -> Result<Cache, (skv_status, String)> {
        let mut ptr = std::ptr::null_mut();
        // SAFETY: cfg and the out-pointer are valid for the call.
        let s = unsafe { skv::skv_cache_new(cfg, &mut ptr) };
        if s != SKV_OK {
            return Err((s, skv::last_error_message()));
        }
        let cache = Cache { ptr, hooks: Box::default(), samples: vec![Vec::new(); OPS.len()], batched_requests: 0 };
        let mut hooks = skv_engine_hooks {
            struct_size: size_of::<skv_engine_hooks>() as u32,
            dec_lock_ref: Some(dec_lock_ref),
            free_aux: Some(free_aux),
            ..Default::default()
        };
        if copy {
            hooks.copy_pages = Some(copy_pages);
        }
        let user_data = &*cache.hooks as *const Hooks as *mut c_void;
        // SAFETY: the handle is live; `hooks` is boxed, so its address outlives the handle.
        let s = unsafe { skv::skv_cache_set_hooks(cache.ptr, &hooks, user_data) };
        if s != SKV_OK {
            return Err((s, skv::last_error_message()));
        }
        Ok(cache)
    }

    fn timed(&mut self, op: Op, call: impl FnOnce() -> skv_status) -> skv_status {
        let t = Instant::now();
        let s = call();
        let ns = t.elapsed().as_nanos().min(u32::MAX as u128) as u32;
        self.samples[op as usize].push(ns);
        s
    }

    // Every call below passes `self.ptr`, a live handle until drop, and pointers from references
    // or slices, valid for the call's duration.

    pub fn match_prefix(
        &mut self,
        sid: u64,
        bid: u64,
        req: &mut skv_req,
        key_len: u32,
        out: &mut skv_match,
    ) -> skv_status {
        let c = self.ptr;
        // SAFETY: a live handle; req and out are references.
        self.timed(Op::Match, || unsafe { skv::skv_match_prefix(c, sid, bid, req, key_len, 0, out) })
    }

    pub fn alloc_row(&mut self, req: &mut skv_req) -> skv_status {
        let c = self.ptr;
        // SAFETY: a live handle; req is a reference.
        self.timed(Op::AllocRow, || unsafe { skv::skv_alloc_row(c, req) })
    }

    pub fn map_prefix(&mut self, req: &mut skv_req, indices: &[i32]) -> skv_status {
        let c = self.ptr;
        let n = indices.len() as u32;
        // SAFETY: a live handle; req is a reference, indices a slice of n values.
        self.timed(Op::MapPrefix, || unsafe { skv::skv_map_prefix(c, req, indices.as_ptr(), n) })
    }

    pub fn alloc_extend(&mut self, req: &mut skv_req, n: u32) -> skv_status {
        let c = self.ptr;
        // SAFETY: a live handle; req is a reference, out_loc NULL.
        self.timed(Op::Extend, || unsafe { skv::skv_alloc_extend(c, req, n, std::ptr::null_mut()) })
    }

    /// Extends every req by its count in one call (the decode step of the running batch).
    pub fn alloc_extend_batch(&mut self, reqs: &mut [skv_req], n_tokens: &[u32]) -> skv_status {
        assert_eq!(reqs.len(), n_tokens.len(), "one count per req");
        let c = self.ptr;
        self.batched_requests += reqs.len() as u64;
        // SAFETY: a live handle; reqs and n_tokens are slices of reqs.len() values, out_loc NULL.
        self.timed(Op::ExtendBatch, || unsafe {
            skv::skv_alloc_extend_batch(c, reqs.as_mut_ptr(), reqs.len(), n_tokens.as_ptr(), std::ptr::null_mut(), 0)
        })
    }

    pub fn commit_batch(&mut self, reqs: &mut [skv_req], n_tokens: &[u32]) -> skv_status {
        assert_eq!(reqs.len(), n_tokens.len(), "one count per req");
        let c = self.ptr;
        self.batched_requests += reqs.len() as u64;
        // SAFETY: a live handle; reqs and n_tokens are slices of reqs.len() values.
        self.timed(Op::CommitBatch, || unsafe {
            skv::skv_commit_batch(c, reqs.as_mut_ptr(), reqs.len(), n_tokens.as_ptr())
        })
    }

    pub fn commit(&mut self, req: &mut skv_req, n: u32) -> skv_status {
        let c = self.ptr;
        // SAFETY: a live handle; req is a reference.
        self.timed(Op::Commit, || unsafe { skv::skv_commit(c, req, n) })
    }

    /// One window step of a running request (flags 0: the engine shares prefixes through
    /// its tree); the positions whose SWA pages went back, or the status.
    pub fn swa_evict(
        &mut self,
        req: &mut skv_req,
        pre_len: u32,
        window: u32,
        interval: u32,
    ) -> Result<u32, skv_status> {
        let c = self.ptr;
        let mut freed = 0u32;
        // SAFETY: a live handle; req and freed are references.
        let s = self.timed(Op::SwaEvict, || unsafe {
            skv::skv_swa_evict(c, req, pre_len, window, interval, -1, 0, &mut freed)
        });
        if s == SKV_OK {
            Ok(freed)
        } else {
            Err(s)
        }
    }

    pub fn finished_req(&mut self, sid: u64, bid: u64, req: &mut skv_req, aborted: bool) -> skv_status {
        let c = self.ptr;
        // SAFETY: a live handle; req is a reference.
        self.timed(Op::Finish, || unsafe { skv::skv_cache_finished_req(c, sid, bid, req, aborted as u32) })
    }

    pub fn release_session(&mut self, sid: u64) -> skv_status {
        let c = self.ptr;
        // SAFETY: a live handle; no other pointer.
        self.timed(Op::Release, || unsafe { skv::skv_release_session(c, sid) })
    }

    pub fn release_branch(&mut self, sid: u64, bid: u64) -> skv_status {
        let c = self.ptr;
        // SAFETY: a live handle; no other pointer.
        self.timed(Op::Evict, || unsafe { skv::skv_release_branch(c, sid, bid) })
    }

    pub fn stats(&self) -> Result<skv_stats, skv_status> {
        let mut out = std::mem::MaybeUninit::<skv_stats>::zeroed();
        // SAFETY: a live handle; out points at a skv_stats.
        match unsafe { skv::skv_cache_stats(self.ptr, out.as_mut_ptr()) } {
            // SAFETY: written by libskv on success; all-zero is a valid skv_stats anyway.
            SKV_OK => Ok(unsafe { out.assume_init() }),
            s => Err(s),
        }
    }

    pub fn check(&self) -> Result<skv_check_report, skv_status> {
        let mut out = std::mem::MaybeUninit::<skv_check_report>::zeroed();
        // SAFETY: a live handle; out points at a skv_check_report.
        match unsafe { skv::skv_cache_check(self.ptr, out.as_mut_ptr()) } {
            // SAFETY: as in `stats`.
            SKV_OK => Ok(unsafe { out.assume_init() }),
            s => Err(s),
        }
    }

    pub fn held(&self, active_rows: &[i32]) -> Result<skv_held, skv_status> {
        let mut out = std::mem::MaybeUninit::<skv_held>::zeroed();
        // SAFETY: a live handle; active_rows is a slice, out points at a skv_held.
        let s = unsafe { skv::skv_session_held(self.ptr, active_rows.as_ptr(), active_rows.len(), out.as_mut_ptr()) };
        match s {
            // SAFETY: as in `stats`.
            SKV_OK => Ok(unsafe { out.assume_init() }),
            s => Err(s),
        }
    }

    /// Pages for the engine's prefix tree (the shared system prompt).
    pub fn pool_alloc(&mut self, n_tokens: u32) -> Result<Vec<i32>, skv_status> {
        let mut out = vec![0i32; n_tokens as usize];
        // SAFETY: a live handle; out has room for n_tokens values.
        match unsafe { skv::skv_pool_alloc(self.ptr, n_tokens, out.as_mut_ptr()) } {
            SKV_OK => Ok(out),
            s => Err(s),
        }
    }

    pub fn pool_free(&mut self, indices: &[i32]) -> skv_status {
        // SAFETY: a live handle; indices is a slice.
        unsafe { skv::skv_pool_free(self.ptr, indices.as_ptr(), indices.len()) }
    }

    pub fn page_refs(&self, indices: &[i32]) -> Result<Vec<u32>, skv_status> {
        let mut out = vec![0u32; indices.len()];
        // SAFETY: a live handle; out has room for indices.len() values.
        match unsafe { skv::skv_page_refs(self.ptr, indices.as_ptr(), indices.len(), out.as_mut_ptr()) } {
            SKV_OK => Ok(out),
            s => Err(s),
        }
    }
}

/// The KV events of a handle, drain path (`--router`; docs/events.md).
#[cfg(feature = "router")]
impl Cache {
    /// Turns events on, drain only, libskv the only publisher of session KV (its chains start
    /// at page 0: the shared prompt's pages are published with each session's salt).
    pub fn events_enable(&mut self, rank: u32) -> skv_status {
        let cfg = skv::skv_events_config {
            struct_size: size_of::<skv::skv_events_config>() as u32,
            data_parallel_rank: rank,
            flags: skv::SKV_EVENTS_FROM_PAGE_ZERO,
            max_batches: 0,
            endpoint: std::ptr::null(),
            topic: std::ptr::null(),
        };
        // SAFETY: a live handle; cfg is a reference, its strings NULL.
        unsafe { skv::skv_events_enable(self.ptr, &cfg) }
    }

    /// Token ids of positions `[first_pos, first_pos + tokens.len())` of the row's sequence.
    pub fn events_tokens(&mut self, sid: u64, bid: u64, req: &skv_req, first_pos: u32, tokens: &[i32]) -> skv_status {
        // SAFETY: a live handle; req a reference, tokens a slice of tokens.len() values.
        unsafe { skv::skv_events_tokens(self.ptr, sid, bid, req, first_pos, tokens.as_ptr(), tokens.len()) }
    }

    /// The oldest closed batch into `buf` (grown when too small): Ok(Some(seq)) with `buf`
    /// holding the payload, Ok(None) when none is pending.
    pub fn events_drain(&mut self, buf: &mut Vec<u8>) -> Result<Option<u64>, skv_status> {
        loop {
            let (mut len, mut seq) = (0usize, 0u64);
            buf.resize(buf.capacity().max(1 << 16), 0);
            // SAFETY: a live handle; buf has buf.len() writable bytes, len and seq references.
            let s = unsafe { skv::skv_events_drain(self.ptr, buf.as_mut_ptr(), buf.len(), &mut len, &mut seq) };
            match s {
                SKV_OK if len == 0 => return Ok(None),
                SKV_OK => {
                    buf.truncate(len);
                    return Ok(Some(seq));
                }
                skv_status::SKV_ERR_BUFFER if len > buf.len() => buf.reserve(len - buf.len()),
                s => return Err(s),
            }
        }
    }
}
