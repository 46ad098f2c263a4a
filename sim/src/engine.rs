//! A continuous-batching serving engine in miniature. Open sessions wait idle with their
//! KV held by libskv between turns; up to `batch` turns run at once, one verify round per
//! tick each; memory pressure evicts the least recently used idle branch, and a request
//! that still cannot grow is preempted (aborted) and re-queued. A hybrid model
//! (`--swa-window`) has a second, sliding-window pool that libskv runs beside the full one;
//! running out of either is memory pressure.
//!
//! The engine mirrors which (session, branch) slots libskv should hold and what each
//! match should return, so every answer from the library is checked, not just its status.
//! A multi-instance run (`multi`) has one such engine state per instance, each its own libskv
//! handle; a branch's slot lives on one instance at a time.

use std::time::{Duration, Instant};

use indicatif::ProgressBar;
use skv::skv_status::{self, SKV_ERR_OUT_OF_MEMORY, SKV_OK};
use skv::{skv_cache_config, skv_req, SKV_FLAG_ALIGNED_REUSE};

use crate::cli::{Config, Policy, MAX_BRANCHES};
use crate::ffi::Cache;
use crate::workload::{Rng, TurnPlan};

mod audit;
mod copies;
mod decode;
mod mamba;
#[cfg(feature = "router")]
mod migrate;
#[cfg(feature = "router")]
mod multi;
mod tier;
mod turn;
mod window;

#[cfg(feature = "router")]
pub use migrate::MigrateMetrics;
#[cfg(feature = "router")]
pub use multi::RouterMetrics;
pub use tier::TierMetrics;

use mamba::{real, Track};

/// Why a run stopped early: an unexpected status, a wrong answer, or an audit violation.
pub type Fault = String;

#[derive(Default)]
pub struct Metrics {
    pub turns: u64,
    /// Requests served by batch calls.
    pub batched_requests: u64,
    pub aborted: u64,
    pub preempted: u64,
    pub retried: u64,
    pub branches: u64,
    pub hits: u64,
    pub misses: u64,
    pub aligned_releases: u64,
    pub evictions: u64,
    pub sessions_closed: u64,
    pub rounds: u64,
    pub drafted: u64,
    pub accepted: u64,
    /// Tokens verified by decode rounds, overshoot included.
    pub generated: u64,
    /// Tokens the finished turns kept (`finished_len`).
    pub kept: u64,
    pub prefilled: u64,
    pub freed_trim: u64,
    pub freed_abort: u64,
    pub freed_release: u64,
    pub freed_evict: u64,
    pub freed_tail: u64,
    /// Full-pool pages in use at the busiest moment.
    pub peak_used_pages: u64,
    /// The SWA pool (`--swa-window`): its pages (padding included, 0 without one), its pages
    /// in use at the busiest moment, and what the window steps gave back.
    pub swa_total_pages: u64,
    pub peak_used_swa_pages: u64,
    pub swa_window_steps: u64,
    pub swa_freed_positions: u64,
    pub swa_freed_pages: u64,
    pub peak_held_tokens: u64,
    pub peak_held_swa_tokens: u64,
    pub peak_held_rows: u64,
    pub audits: u64,
    pub violations: u64,
    pub first_violation: String,
    pub locks_taken: u64,
    pub locks_returned: u64,
    pub trimmed_tokens: u64,
    pub tail_freed_tokens: u64,
    pub total_pages: u64,
    pub leaked_pages: u64,
    pub leaked_swa_pages: u64,
    pub leaked_rows: u64,
    /// Recurrent-state handles (`--mamba`): handed out, and handed back by libskv's
    /// `free_aux` or by the engine itself (replaced track entries); left live at the end.
    pub mamba_allocated: u64,
    pub mamba_freed_by_libskv: u64,
    pub mamba_freed_by_engine: u64,
    pub mamba_leaked: u64,
    pub peak_held_aux_handles: u64,
    pub elapsed: Duration,
    /// Prompt tokens of the turns started (what a cold cache would prefill).
    pub prompt_tokens: u64,
    /// Idle slots released because their branch's next turn went to another instance.
    pub moved_slots: u64,
    /// The router's figures (multi-instance runs).
    #[cfg(feature = "router")]
    pub router: RouterMetrics,
    /// The moves between instances (`--migrate`).
    #[cfg(feature = "router")]
    pub migrate: MigrateMetrics,
    /// The host tier's figures and the modelled time (`--host-pool-tokens`).
    pub tier: TierMetrics,
}

struct Branch {
    id: u64,
    /// Conversation tokens on this branch (what the next prompt starts with).
    history: u32,
    /// libskv should hold a slot for this branch.
    has_slot: bool,
    /// The slot's committed length (the history, or less when a finish floored it below the
    /// SWA cursor).
    kv_len: u32,
    /// The SWA cursor the slot records (what libskv's window steps and trims left it at).
    swa_cursor: u32,
    protected: u32,
    idle_since: u64,
    /// The slot's recurrent-state handles (free order) and its ping-pong state.
    handles: [i64; 3],
    track: Track,
    /// When the slot was created: a session's release frees its slots oldest first.
    slot_seq: u64,
    /// The instance holding the slot (when `has_slot`).
    inst: usize,
    /// The conversation's token ids, `history` of them (multi-instance runs only).
    tokens: Vec<u32>,
    /// The host tier's tag mirror: who wrote the slot's positions, and where the running
    /// turn's writes start, its writer, and whether it missed (mapping the shared prompt).
    writes: copies::Writes,
    turn_writes: (u32, u64, bool),
    /// `--migrate`: the slot is being moved (its export open); it was moved and has not run a
    /// turn since.
    moving: bool,
    migrated: bool,
}

impl Branch {
    fn new(id: u64, history: u32) -> Branch {
        Branch {
            id,
            history,
            has_slot: false,
            kv_len: 0,
            swa_cursor: 0,
            protected: 0,
            idle_since: 0,
            handles: [-1; 3],
            track: Track::default(),
            slot_seq: 0,
            inst: 0,
            tokens: Vec::new(),
            writes: Vec::new(),
            turn_writes: (0, 0, false),
            moving: false,
            migrated: false,
        }
    }
}

struct Turn {
    branch: usize,
    /// The instance running it, and the decode blocks the router charged it with.
    inst: usize,
    charged_blocks: u64,
    req: skv_req,
    plan: TurnPlan,
    track: Track,
}

struct Session {
    id: u64,
    turns_left: u32,
    shared: bool,
    branches: Vec<Branch>,
    /// The branch whose turn is running (its slot, if any, is in flight).
    busy: Option<usize>,
    turn: Option<Turn>,
    /// Multi-instance runs: the turn routed to an instance and waiting in its queue.
    pending: Option<Pending>,
    /// A turn preempted (or taken from a drained instance) before it finished: routed again
    /// as it was (its branch and plan).
    replay: Option<(usize, TurnPlan)>,
}

/// A turn the router sent to an instance, waiting there for a place in its batch.
struct Pending {
    branch: usize,
    plan: TurnPlan,
    /// What the router charged the instance's prefill load with (Dynamo's effective prefill
    /// tokens: the prompt less the overlap it saw).
    prefill_tokens: u64,
    decode_blocks: u64,
}

/// One serving instance: its libskv handle and its engine's state.
pub struct Instance {
    pub cache: Cache,
    /// The shared system prompt's pages in this instance's prefix tree.
    shared: Vec<i32>,
    receipts: u64,
    locks_taken: u64,
    running: usize,
    /// Sessions whose turn was routed here and waits (multi-instance runs).
    queue: std::collections::VecDeque<u64>,
    /// False once drained (`--drain`): nothing runs or is routed here.
    live: bool,
    /// The router's load view of this instance (prefill tokens, decode blocks).
    prefill_tokens: u64,
    decode_blocks: u64,
    /// The running turns' committed tokens at the last step (the load imbalance's measure).
    active_tokens: u64,
    /// Prompt tokens prefilled here (the modelled time's).
    prefilled: u64,
}

pub struct Engine<'a> {
    cfg: &'a Config,
    inst: Vec<Instance>,
    /// The instance the current call goes to.
    cur: usize,
    rng: Rng,
    open: Vec<Session>,
    opened: u64,
    running: usize,
    tick: u64,
    next_audit: u64,
    slots_created: u64,
    /// The router and its state (multi-instance runs).
    #[cfg(feature = "router")]
    fleet: Option<multi::Fleet>,
    /// The host tier's side (`--host-pool-tokens`), and the modelled clock.
    tier: Vec<tier::TierSim>,
    clock: tier::Clock,
    pub m: Metrics,
    bar: ProgressBar,
}

/// The stream of one session's turn `turn` (`u32::MAX`: the session's own draws).
fn turn_rng(seed: u64, sid: u64, turn: u32) -> Rng {
    Rng::new(seed ^ sid.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (turn as u64 + 1).wrapping_mul(0xC2B2_AE3D_27D4_EB4F))
}

/// A token id of a vocabulary of 150,000, fixed by what it is and where.
fn token(a: u64, b: u64, pos: u32) -> u32 {
    let mut z = a.wrapping_mul(0xBF58_476D_1CE4_E5B9) ^ b.wrapping_mul(0x94D0_49BB_1331_11EB) ^ pos as u64;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    ((z ^ (z >> 31)) % 150_000) as u32
}

/// The shared system prompt's token ids.
fn shared_tokens(n: u32) -> Vec<u32> {
    (0..n).map(|p| token(0, 0, p)).collect()
}

fn floor_to(x: u32, ps: u32) -> u32 {
    x / ps * ps
}

fn unexpected(what: &str, s: skv_status) -> Fault {
    format!("{what}: unexpected {} ({})", s.name(), skv::last_error_message())
}

fn expect_ok(what: &str, s: skv_status) -> Result<(), Fault> {
    if s == SKV_OK {
        Ok(())
    } else {
        Err(unexpected(what, s))
    }
}

impl<'a> Engine<'a> {
    /// One cache per instance (the whole pool in one unless `cfg.multi`), and the router
    /// of a multi-instance run with `policy`. An error here is a configuration libskv
    /// refuses (exit status 2).
    pub fn new(cfg: &'a Config, policy: Option<Policy>, bar: ProgressBar) -> Result<Engine<'a>, String> {
        let a = &cfg.args;
        let (pages, swa_pages) = if cfg.multi {
            (cfg.instance_pages, cfg.instance_swa_pages)
        } else {
            (cfg.total_pages, cfg.swa_total_pages)
        };
        // The host pool splits between the instances as the device pool does.
        let host_pages = if cfg.multi { cfg.host_pages / a.instances as u64 } else { cfg.host_pages };
        let c = skv_cache_config {
            struct_size: size_of::<skv_cache_config>() as u32,
            page_size: a.page_size,
            num_token_slots: pages * a.page_size as u64,
            num_rows: cfg.num_rows,
            max_context_len: cfg.max_context_len,
            flags: if a.aligned_reuse { SKV_FLAG_ALIGNED_REUSE } else { 0 },
            swa_num_token_slots: swa_pages * a.page_size as u64,
            host_num_token_slots: host_pages * a.page_size as u64,
            host_swa_num_token_slots: if swa_pages > 0 { host_pages * a.page_size as u64 } else { 0 },
            tier_idle_steps: if cfg.host_pages > 0 { a.tier_idle_steps } else { 0 },
            tier_pages_per_step: if cfg.host_pages > 0 { a.tier_pages_per_step } else { 0 },
            ..Default::default()
        };
        let n = if cfg.multi { a.instances as usize } else { 1 };
        let mut inst = Vec::with_capacity(n);
        for _ in 0..n {
            let cache =
                Cache::new(&c, host_pages > 0).map_err(|(s, msg)| format!("skv_cache_new: {}: {msg}", s.name()))?;
            inst.push(Instance {
                cache,
                shared: Vec::new(),
                receipts: 0,
                locks_taken: 0,
                running: 0,
                queue: Default::default(),
                live: true,
                prefill_tokens: 0,
                decode_blocks: 0,
                active_tokens: 0,
                prefilled: 0,
            });
        }
        let check_every = a.check_every;
        #[cfg_attr(not(feature = "router"), allow(unused_mut))]
        let mut e = Engine {
            cfg,
            inst,
            cur: 0,
            rng: Rng::new(a.seed),
            open: Vec::new(),
            opened: 0,
            running: 0,
            tick: 0,
            next_audit: if check_every == 0 { u64::MAX } else { check_every },
            slots_created: 0,
            #[cfg(feature = "router")]
            fleet: None,
            tier: (0..if host_pages > 0 { n } else { 0 })
                .map(|_| {
                    let host_swa = if swa_pages > 0 { host_pages } else { 0 };
                    tier::TierSim::new([(pages, host_pages), (swa_pages, host_swa)], a)
                })
                .collect(),
            clock: tier::Clock::default(),
            m: Metrics { total_pages: pages * n as u64, swa_total_pages: swa_pages * n as u64, ..Metrics::default() },
            bar,
        };
        #[cfg(feature = "router")]
        if let Some(p) = policy {
            e.fleet = Some(multi::Fleet::new(&mut e, p)?);
        }
        #[cfg(not(feature = "router"))]
        let _ = policy;
        Ok(e)
    }

    /// Every instance's latency samples, gathered into the first's.
    pub fn latency_samples(&mut self) -> &mut [Vec<u32>] {
        let (first, rest) = self.inst.split_at_mut(1);
        for other in rest {
            for (into, from) in first[0].cache.samples.iter_mut().zip(&mut other.cache.samples) {
                into.append(from);
            }
        }
        &mut first[0].cache.samples
    }

    /// Runs the whole workload, then the end-of-run leak checks.
    pub fn run(&mut self) -> Result<(), Fault> {
        let start = Instant::now();
        let r = self.serve();
        self.m.elapsed = start.elapsed();
        self.m.batched_requests = self.inst.iter().map(|i| i.cache.batched_requests).sum();
        r?;
        self.tier_close()?;
        self.close_out()?;
        #[cfg(feature = "router")]
        if self.fleet.is_some() {
            self.close_fleet()?;
        }
        Ok(())
    }

    fn serve(&mut self) -> Result<(), Fault> {
        if self.cfg.shared_tokens > 0 {
            for k in 0..self.inst.len() {
                self.inst[k].shared = self.inst[k]
                    .cache
                    .pool_alloc(self.cfg.shared_tokens)
                    .map_err(|s| unexpected("skv_pool_alloc(shared prefix)", s))?;
            }
        }
        self.tier_start();
        loop {
            self.arrive();
            if self.open.is_empty() {
                return Ok(());
            }
            self.tick += 1;
            self.step_begin()?;
            for k in 0..self.inst.len() {
                if self.inst[k].live {
                    self.cur = k;
                    self.decode_step()?;
                }
            }
            self.close_done()?;
            self.arrive();
            #[cfg(feature = "router")]
            if self.fleet.is_some() {
                self.route_and_admit()?;
            } else {
                self.admit()?;
            }
            #[cfg(not(feature = "router"))]
            self.admit()?;
            self.step_end()?;
            if self.m.turns >= self.next_audit {
                self.audit()?;
                self.next_audit = self.m.turns + self.cfg.args.check_every;
            }
            // With nothing running every idle slot could be evicted, so a request that
            // still does not fit never will.
            if self.running == 0 && !self.open.is_empty() && !self.moving() {
                return Err("no progress: the pool cannot hold one request".into());
            }
        }
    }

    fn arrive(&mut self) {
        let a = &self.cfg.args;
        while self.open.len() < a.concurrency as usize && self.opened < a.sessions {
            self.opened += 1;
            // A multi-instance run draws each session's and each turn's choices from a stream
            // of its own, so every policy serves the same workload.
            let rng = if self.cfg.multi { &mut turn_rng(a.seed, self.opened, u32::MAX) } else { &mut self.rng };
            let shared = self.cfg.shared_tokens > 0 && rng.chance(a.prefix_fraction);
            let mut first = Branch::new(0, if shared { self.cfg.shared_tokens } else { 0 });
            if self.cfg.multi && shared {
                first.tokens = shared_tokens(self.cfg.shared_tokens);
            }
            self.open.push(Session {
                id: self.opened,
                turns_left: a.turns,
                shared,
                branches: vec![first],
                busy: None,
                turn: None,
                pending: None,
                replay: None,
            });
        }
    }

    /// A branch's slot is moving between instances (`--migrate`): its session waits for it.
    fn moving(&self) -> bool {
        self.open.iter().any(|s| s.branches.iter().any(|b| b.moving))
    }

    fn free_pages(&self) -> Result<u64, Fault> {
        self.inst[self.cur].cache.stats().map(|s| s.free_pages).map_err(|s| unexpected("skv_cache_stats", s))
    }

    fn note_peak(&mut self) -> Result<(), Fault> {
        let st = self.inst[self.cur].cache.stats().map_err(|s| unexpected("skv_cache_stats", s))?;
        self.m.peak_used_pages = self.m.peak_used_pages.max(st.used_pages);
        self.m.peak_used_swa_pages = self.m.peak_used_swa_pages.max(st.swa_used_pages);
        Ok(())
    }

    /// Runs an allocating call, evicting idle branches while the pool is out of pages or
    /// rows. Ok(false): nothing left to evict, the caller preempts its request.
    fn with_memory(
        &mut self,
        what: &str,
        req: &mut skv_req,
        mut call: impl FnMut(&mut Cache, &mut skv_req) -> skv_status,
    ) -> Result<bool, Fault> {
        loop {
            match call(&mut self.inst[self.cur].cache, req) {
                SKV_OK => {
                    self.note_peak()?;
                    return Ok(true);
                }
                SKV_ERR_OUT_OF_MEMORY => {
                    let evicted = if !self.tier.is_empty() { self.tier_evict(1)? } else { self.evict_one()? };
                    if !evicted {
                        return Ok(false);
                    }
                }
                s => return Err(unexpected(what, s)),
            }
        }
    }

    /// Releases the least recently used idle slot (never one in flight).
    fn evict_one(&mut self) -> Result<bool, Fault> {
        let mut victim: Option<(u64, usize, usize)> = None;
        for (i, s) in self.open.iter().enumerate() {
            for (b, br) in s.branches.iter().enumerate() {
                if br.has_slot
                    && br.inst == self.cur
                    && s.busy != Some(b)
                    && !br.moving
                    && victim.is_none_or(|(t, _, _)| br.idle_since < t)
                {
                    victim = Some((br.idle_since, i, b));
                }
            }
        }
        let Some((_, i, b)) = victim else { return Ok(false) };
        self.m.freed_evict += self.release_slot(i, b)?;
        self.m.evictions += 1;
        Ok(true)
    }

    /// Releases an idle branch's slot on the current instance; the pages that came back.
    fn release_slot(&mut self, i: usize, b: usize) -> Result<u64, Fault> {
        let (sid, bid) = (self.open[i].id, self.open[i].branches[b].id);
        let before = self.free_pages()?;
        let what = format!("skv_release_branch(session {sid}, branch {bid})");
        expect_ok(&what, self.inst[self.cur].cache.release_branch(sid, bid))?;
        self.expect_handed_back(&what, real(self.open[i].branches[b].handles))?;
        self.open[i].branches[b].has_slot = false;
        Ok(self.free_pages()? - before)
    }

    /// Starts turns on waiting sessions until the batch is full.
    fn admit(&mut self) -> Result<(), Fault> {
        while self.running < self.cfg.args.batch as usize {
            let waiting: Vec<usize> =
                (0..self.open.len()).filter(|&i| self.open[i].turn.is_none() && self.open[i].turns_left > 0).collect();
            if waiting.is_empty() {
                return Ok(());
            }
            let i = waiting[self.rng.below(waiting.len())];
            if !self.start_turn(i)? {
                return Ok(()); // preempted for lack of memory: wait for running turns to finish
            }
        }
        Ok(())
    }

    /// The first `len` token ids of branch `b`'s conversation: what it holds, then new ones
    /// (multi-instance runs).
    fn conversation(&self, i: usize, b: usize, len: u32) -> Vec<u32> {
        let (s, br) = (&self.open[i], &self.open[i].branches[b]);
        let known = br.tokens.len().min(len as usize);
        let mut t = br.tokens[..known].to_vec();
        t.extend((known as u32..len).map(|p| token(s.id, br.id + 1, p)));
        t
    }

    fn pick_branch(&mut self, i: usize, rng: Option<&mut Rng>) -> usize {
        let a = &self.cfg.args;
        let rng = rng.unwrap_or(&mut self.rng);
        let s = &mut self.open[i];
        let n = s.branches.len();
        let started = s.turns_left < a.turns;
        if started && n < MAX_BRANCHES as usize && rng.chance(a.branch_rate) {
            // A fork continues the conversation of an existing branch in a slot of its own,
            // prefilled from scratch.
            let from = rng.below(n);
            let mut fork = Branch::new(n as u64, s.branches[from].history);
            fork.tokens.clone_from(&s.branches[from].tokens);
            s.branches.push(fork);
            self.m.branches += 1;
            return n;
        }
        rng.below(n)
    }

    /// Sessions whose last turn finished close: every branch released.
    fn close_done(&mut self) -> Result<(), Fault> {
        let mut i = 0;
        while i < self.open.len() {
            let s = &self.open[i];
            if s.turns_left > 0 || s.turn.is_some() {
                i += 1;
                continue;
            }
            let sid = s.id;
            // Each instance holding a slot of the session releases it (a single instance
            // always: it hears every session's end).
            for k in 0..self.inst.len() {
                let s = &self.open[i];
                let mut slots: Vec<&Branch> = s.branches.iter().filter(|b| b.has_slot && b.inst == k).collect();
                if slots.is_empty() && self.cfg.multi {
                    continue;
                }
                slots.sort_by_key(|b| b.slot_seq);
                let handles: Vec<i64> = slots.iter().flat_map(|b| real(b.handles)).collect();
                self.cur = k;
                let before = self.free_pages()?;
                let what = format!("skv_release_session({sid})");
                expect_ok(&what, self.inst[k].cache.release_session(sid))?;
                self.expect_handed_back(&what, handles)?;
                self.m.freed_release += self.free_pages()? - before;
            }
            self.m.sessions_closed += 1;
            self.open.swap_remove(i);
        }
        Ok(())
    }
}
