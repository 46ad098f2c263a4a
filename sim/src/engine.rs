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
use skv::{skv_cache_config, skv_match, skv_req, SKV_FLAG_ALIGNED_REUSE};

use crate::cli::{Config, Policy, MAX_BRANCHES};
use crate::ffi::{Cache, SHARED_NODE};
use crate::workload::{Rng, TurnPlan};

mod audit;
mod copies;
mod mamba;
#[cfg(feature = "router")]
mod multi;
mod tier;
mod window;

#[cfg(feature = "router")]
pub use multi::RouterMetrics;
pub use tier::TierMetrics;

use mamba::{handles_of, real, Track};

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
    tier: Option<Box<tier::TierSim>>,
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
        let c = skv_cache_config {
            struct_size: size_of::<skv_cache_config>() as u32,
            page_size: a.page_size,
            num_token_slots: pages * a.page_size as u64,
            num_rows: cfg.num_rows,
            max_context_len: cfg.max_context_len,
            flags: if a.aligned_reuse { SKV_FLAG_ALIGNED_REUSE } else { 0 },
            swa_num_token_slots: swa_pages * a.page_size as u64,
            host_num_token_slots: cfg.host_pages * a.page_size as u64,
            host_swa_num_token_slots: if swa_pages > 0 { cfg.host_pages * a.page_size as u64 } else { 0 },
            tier_idle_steps: if cfg.host_pages > 0 { a.tier_idle_steps } else { 0 },
            tier_pages_per_step: if cfg.host_pages > 0 { a.tier_pages_per_step } else { 0 },
            ..Default::default()
        };
        let n = if cfg.multi { a.instances as usize } else { 1 };
        let mut inst = Vec::with_capacity(n);
        for _ in 0..n {
            let cache =
                Cache::new(&c, cfg.host_pages > 0).map_err(|(s, msg)| format!("skv_cache_new: {}: {msg}", s.name()))?;
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
            tier: (cfg.host_pages > 0).then(|| {
                let host_swa = if swa_pages > 0 { cfg.host_pages } else { 0 };
                Box::new(tier::TierSim::new([(pages, cfg.host_pages), (swa_pages, host_swa)], a))
            }),
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
            if self.running == 0 && !self.open.is_empty() {
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
                    let evicted = if self.tier.is_some() { self.tier_evict(1)? } else { self.evict_one()? };
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

    /// The slot's answer to a match, as libskv must give it (docs/operations.md, skv_match_prefix).
    fn expected_match(&self, br: &Branch, key_len: u32) -> (bool, u32) {
        if !br.has_slot {
            return (false, 0);
        }
        let ps = self.cfg.args.page_size;
        let mut prefix = br.kv_len.min(key_len);
        if ps > 1 && br.swa_cursor > prefix {
            // A reuse boundary below the SWA cursor floors to a page, so the cursor stays aligned.
            prefix = floor_to(prefix, ps);
        }
        if self.cfg.args.aligned_reuse && ps > 1 {
            let a = floor_to(prefix, ps);
            if a < br.protected || a == 0 {
                return (false, 0); // the slot is released: no page-aligned prefix left to reuse
            }
            return (true, a);
        }
        (true, prefix)
    }

    fn do_match(&mut self, i: usize, b: usize, req: &mut skv_req, key_len: u32) -> Result<bool, Fault> {
        if self.tier.is_some() {
            return self.do_match_tier(i, b, req, key_len);
        }
        let (sid, bid) = (self.open[i].id, self.open[i].branches[b].id);
        let (want_hit, want_len) = self.expected_match(&self.open[i].branches[b], key_len);
        let mut out = skv_match { hit: 0, prefix_len: 0 };
        let before = self.free_pages()?;
        let what = format!("skv_match_prefix(session {sid}, branch {bid})");
        expect_ok(&what, self.inst[self.cur].cache.match_prefix(sid, bid, req, key_len, &mut out))?;
        let freed = self.free_pages()? - before;
        let hit = out.hit == 1;
        if hit != want_hit || (hit && out.prefix_len != want_len) || (hit && req.kv_allocated_len != want_len) {
            return Err(format!(
                "{what}: hit {} prefix {} allocated {}, expected hit {} prefix {want_len}",
                out.hit, out.prefix_len, req.kv_allocated_len, want_hit as u32
            ));
        }
        // A hit restores the slot's cursor, clamped to the reused prefix.
        let want_cursor = self.open[i].branches[b].swa_cursor.min(want_len);
        if hit && req.swa_evicted_seqlen != want_cursor {
            return Err(format!(
                "{what}: restored swa_evicted_seqlen {}, expected {want_cursor} (the slot's {} clamped to prefix {want_len})",
                req.swa_evicted_seqlen,
                self.open[i].branches[b].swa_cursor
            ));
        }
        let slot_handles = self.open[i].branches[b].handles;
        let released = self.open[i].branches[b].has_slot && !hit;
        self.expect_handed_back(&what, real(slot_handles).filter(|_| released))?;
        if hit && handles_of(req) != slot_handles {
            return Err(format!("{what}: restored handles {:?}, the slot holds {slot_handles:?}", handles_of(req)));
        }
        let br = &mut self.open[i].branches[b];
        if br.has_slot && !hit {
            br.has_slot = false;
            self.m.aligned_releases += 1;
            self.m.freed_release += freed;
        } else {
            self.m.freed_tail += freed;
        }
        Ok(hit)
    }

    /// Match, then (on a miss) a fresh row with the shared prefix, then prefill. Ok(false)
    /// when the pool could not hold the prompt and the turn went back to the queue.
    fn start_turn(&mut self, i: usize) -> Result<bool, Fault> {
        let b = self.pick_branch(i, None);
        let plan = TurnPlan::draw(&self.cfg.args, &mut self.rng);
        self.begin_turn(i, b, plan, 0, 0)
    }

    /// Starts a turn of branch `b` on instance `k`.
    fn begin_turn(&mut self, i: usize, b: usize, plan: TurnPlan, k: usize, charged_blocks: u64) -> Result<bool, Fault> {
        if self.open[i].branches[b].has_slot && self.open[i].branches[b].inst != k {
            // The turn went to another instance: the engine lets the slot it left go.
            self.cur = self.open[i].branches[b].inst;
            self.m.freed_release += self.release_slot(i, b)?;
            self.m.moved_slots += 1;
        }
        self.cur = k;
        self.inst[k].running += 1;
        let origin = self.open[i].branches[b].history + plan.user_tokens;
        let key_len = origin - 1; // the last prompt token is recomputed for its logits
        let mut req = skv_req { origin_input_len: origin, ..Default::default() };
        self.open[i].busy = Some(b);
        self.running += 1;

        let hit = self.do_match(i, b, &mut req, key_len)?;
        let mut track = self.open[i].branches[b].track;
        if hit {
            self.m.hits += 1
        } else {
            self.m.misses += 1
        }
        if !hit {
            if !self.with_memory("skv_alloc_row", &mut req, |c, r| c.alloc_row(r))? {
                return self.preempt(i, Turn { branch: b, inst: k, charged_blocks, req, plan, track }).map(|_| false);
            }
            track = self.mamba_first_turn(&mut req);
            if self.open[i].shared {
                let inst = &mut self.inst[k];
                expect_ok("skv_map_prefix", inst.cache.map_prefix(&mut req, &inst.shared))?;
                self.inst[self.cur].receipts += 1;
                req.lock_node = SHARED_NODE;
                req.lock_receipt = self.inst[self.cur].receipts;
                self.m.locks_taken += 1;
                self.inst[k].locks_taken += 1;
            }
        }
        if !self.prefill(i, &mut req, origin)? {
            return self.preempt(i, Turn { branch: b, inst: k, charged_blocks, req, plan, track }).map(|_| false);
        }
        if plan.retry {
            // Rejected this cycle after its prefill was allocated; the next cycle's match
            // restores the slot again and frees what this one extended.
            self.m.retried += 1;
            let again = self.do_match(i, b, &mut req, key_len)?;
            if again != hit {
                return Err(format!("retried match of session {}: hit {} then {}", self.open[i].id, hit, again));
            }
            if !self.prefill(i, &mut req, origin)? {
                return self.preempt(i, Turn { branch: b, inst: k, charged_blocks, req, plan, track }).map(|_| false);
            }
        }
        let n = origin - req.kv_committed_len;
        expect_ok("skv_commit(prefill)", self.inst[self.cur].cache.commit(&mut req, n))?;
        self.m.prefilled += n as u64;
        self.m.prompt_tokens += origin as u64;
        self.tier_prefilled(i, b, hit, origin - n);
        #[cfg(feature = "router")]
        if self.fleet.is_some() {
            // The prefill's one chunk: its tokens, from where the reuse ended (0 on a miss:
            // the shared prompt's pages are the session's to publish too).
            let from = if hit { origin - n } else { 0 };
            self.hand_tokens(i, b, &req, from, origin)?;
        }
        self.open[i].turn = Some(Turn { branch: b, inst: k, charged_blocks, req, plan, track });
        Ok(true)
    }

    fn prefill(&mut self, _i: usize, req: &mut skv_req, origin: u32) -> Result<bool, Fault> {
        let n = origin - req.kv_allocated_len;
        if n == 0 {
            return Ok(true);
        }
        self.with_memory("skv_alloc_extend(prefill)", req, |c, r| c.alloc_extend(r, n))
    }

    /// One speculative verify round: k+1 slots ahead of the committed tokens, the accepted
    /// drafts plus the bonus token committed.
    fn decode_round(&mut self, i: usize) -> Result<(), Fault> {
        let mut t = self.open[i].turn.take().expect("running turn");
        let a = &self.cfg.args;
        let (k, p) = (a.draft_len, a.accept_rate);
        let need = (t.req.kv_committed_len + k + 1).saturating_sub(t.req.kv_allocated_len);
        if need > 0 && !self.with_memory("skv_alloc_extend(decode)", &mut t.req, |c, r| c.alloc_extend(r, need))? {
            return self.preempt(i, t);
        }
        let accepted = self.rng.accepted(k, p);
        expect_ok("skv_commit(decode)", self.inst[self.cur].cache.commit(&mut t.req, accepted + 1))?;
        self.after_round(i, t, accepted)
    }

    /// One verify round of every running request, as an engine's decode step makes it: the
    /// extensions in one batch call, the commits in another. A batch the pool cannot hold
    /// takes the per-request path, which evicts idle branches or preempts requests.
    fn decode_step(&mut self) -> Result<(), Fault> {
        let cur = self.cur;
        let running: Vec<usize> =
            (0..self.open.len()).filter(|&i| self.open[i].turn.as_ref().is_some_and(|t| t.inst == cur)).collect();
        self.window_steps(&running)?;
        let (k, p) = (self.cfg.args.draft_len, self.cfg.args.accept_rate);
        let mut reqs: Vec<skv_req> =
            running.iter().map(|&i| self.open[i].turn.as_ref().expect("running").req).collect();
        self.inst[cur].active_tokens = reqs.iter().map(|r| r.kv_committed_len as u64).sum();
        let need: Vec<u32> =
            reqs.iter().map(|r| (r.kv_committed_len + k + 1).saturating_sub(r.kv_allocated_len)).collect();
        match self.inst[self.cur].cache.alloc_extend_batch(&mut reqs, &need) {
            SKV_OK => self.note_peak()?,
            SKV_ERR_OUT_OF_MEMORY => {
                for &i in &running {
                    self.decode_round(i)?;
                }
                return Ok(());
            }
            s => return Err(unexpected("skv_alloc_extend_batch(decode)", s)),
        }
        let accepted: Vec<u32> = running.iter().map(|_| self.rng.accepted(k, p)).collect();
        let counts: Vec<u32> = accepted.iter().map(|a| a + 1).collect();
        expect_ok("skv_commit_batch(decode)", self.inst[self.cur].cache.commit_batch(&mut reqs, &counts))?;
        for ((&i, req), &acc) in running.iter().zip(reqs).zip(&accepted) {
            let mut t = self.open[i].turn.take().expect("running");
            t.req = req;
            self.after_round(i, t, acc)?;
        }
        Ok(())
    }

    /// A verify round's bookkeeping once its KV is extended and `accepted + 1` committed.
    fn after_round(&mut self, i: usize, mut t: Turn, accepted: u32) -> Result<(), Fault> {
        let k = self.cfg.args.draft_len;
        t.req.output_len += accepted + 1;
        self.m.rounds += 1;
        self.m.drafted += k as u64;
        self.m.accepted += accepted as u64;
        self.m.generated += accepted as u64 + 1;
        self.track_step(&mut t)?;
        // The client goes away with a verify round's slots still allocated ahead.
        if t.plan.abort_at.is_some_and(|at| t.req.output_len >= at) {
            return self.finish(i, t, true);
        }
        if t.req.output_len >= t.plan.finish_at {
            return self.finish(i, t, false);
        }
        self.open[i].turn = Some(t);
        Ok(())
    }

    fn finish(&mut self, i: usize, mut t: Turn, aborted: bool) -> Result<(), Fault> {
        self.cur = t.inst;
        let (sid, bid) = (self.open[i].id, self.open[i].branches[t.branch].id);
        let ps = self.cfg.args.page_size;
        let target = t.req.origin_input_len + t.plan.finish_at;
        // Trim floors the boundary to a page when the SWA cursor libskv's window steps left is
        // past it (docs/hybrid.md), then clamps the cursor to the new length.
        let cursor = t.req.swa_evicted_seqlen;
        let kv_len = if ps > 1 && cursor > target { floor_to(target, ps) } else { target };
        let (protected, output) = (t.req.cache_protected_len, t.req.output_len);
        if !aborted {
            t.req.finished_len = t.plan.finish_at as i32;
            #[cfg(feature = "router")]
            if self.fleet.is_some() {
                // The turn's output tokens, once, before the finish stores its pages.
                let origin = t.req.origin_input_len;
                self.hand_tokens(i, t.branch, &t.req, origin, target)?;
            }
        }
        if !aborted {
            self.tier_finishing(i, t.branch, &t.req, target)?;
        }
        let before = self.free_pages()?;
        let what = format!("skv_cache_finished_req(session {sid}, branch {bid}, aborted {})", aborted as u32);
        let handles = handles_of(&t.req);
        expect_ok(&what, self.inst[self.cur].cache.finished_req(sid, bid, &mut t.req, aborted))?;
        self.expect_handed_back(&what, real(handles).filter(|_| aborted))?;
        let freed = self.free_pages()? - before;
        let want_output = if aborted { output } else { output.min(t.plan.finish_at) };
        if t.req.req_pool_idx != -1 || t.req.kv_allocated_len != 0 || t.req.output_len != want_output {
            return Err(format!(
                "{what}: req left with row {} allocated {} output {} (expected -1, 0, {want_output})",
                t.req.req_pool_idx, t.req.kv_allocated_len, t.req.output_len
            ));
        }
        let tick = self.tick;
        let conversation = if self.cfg.multi && !aborted { self.conversation(i, t.branch, target) } else { Vec::new() };
        let br = &mut self.open[i].branches[t.branch];
        if aborted {
            br.has_slot = false;
            self.m.aborted += 1;
            self.m.freed_abort += freed;
        } else {
            if !br.has_slot {
                br.protected = protected; // a new slot keeps its first turn's tree prefix
                self.slots_created += 1;
                br.slot_seq = self.slots_created;
            }
            (br.handles, br.track) = (handles, t.track);
            br.has_slot = true;
            br.inst = t.inst;
            br.history = target;
            br.tokens = conversation;
            br.kv_len = kv_len;
            br.swa_cursor = cursor.min(kv_len);
            br.idle_since = tick;
            self.m.kept += t.plan.finish_at as u64;
            self.m.freed_trim += freed;
        }
        let s = &mut self.open[i];
        s.busy = None;
        s.turns_left -= 1;
        self.running -= 1;
        self.inst[t.inst].running -= 1;
        self.inst[t.inst].decode_blocks -= t.charged_blocks;
        self.m.turns += 1;
        self.bar.inc(1);
        Ok(())
    }

    /// The pool cannot hold this request: abort it (freeing its row and pages, its slot
    /// included) and queue the same turn again.
    fn preempt(&mut self, i: usize, mut t: Turn) -> Result<(), Fault> {
        self.cur = t.inst;
        let s = &mut self.open[i];
        let (sid, bid) = (s.id, s.branches[t.branch].id);
        s.busy = None;
        self.running -= 1;
        self.inst[t.inst].running -= 1;
        self.inst[t.inst].decode_blocks -= t.charged_blocks;
        self.m.preempted += 1;
        if self.cfg.multi {
            s.replay = Some((t.branch, t.plan));
        }
        if t.req.req_pool_idx < 0 {
            return Ok(()); // no row yet: nothing was allocated
        }
        let before = self.free_pages()?;
        let what = format!("skv_cache_finished_req(session {sid}, branch {bid}, preempted)");
        let handles = handles_of(&t.req);
        expect_ok(&what, self.inst[self.cur].cache.finished_req(sid, bid, &mut t.req, true))?;
        self.expect_handed_back(&what, real(handles))?;
        self.m.freed_abort += self.free_pages()? - before;
        self.open[i].branches[t.branch].has_slot = false;
        Ok(())
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
