//! Several instances behind a router (`--instances N --router kv|session|random`). Each
//! instance is its own libskv handle with events on (drain path, its data-parallel rank);
//! after every step the router drains every instance's batches into NVIDIA Dynamo's radix
//! tree, its only view of what each instance holds. A turn is routed when its session is
//! ready for it and waits in that instance's queue for a place in its batch.
//!
//! The audit compares the router's view with every instance: for each open session's
//! branch, the tree's score on each instance must be the full pages that instance's libskv
//! holds and knows the tokens of for the session, the longest run of them the branch's
//! conversation shares (the session's branches share their prefix, and its salt).

use std::collections::HashMap;

use super::{expect_ok, turn_rng, unexpected, Engine, Fault, Pending};
use crate::cli::Policy;
use crate::router::{cost, salt, Load, Router};
use crate::workload::{Rng, TurnPlan};

/// The router's figures of a run.
#[derive(Default, Clone, Debug)]
pub struct RouterMetrics {
    pub policy: &'static str,
    pub instances: u32,
    /// Turns routed (a preempted turn is routed again).
    pub routed: u64,
    pub batches: u64,
    pub events: u64,
    pub event_bytes: u64,
    /// Events of medium CPU (the host tier's parked sessions), left out of the router's tree.
    pub cpu_events: u64,
    /// Engine steps (every instance takes one verify round of its batch a step).
    pub steps: u64,
    /// max / mean active tokens over the live instances, summed over the steps that had any.
    pub imbalance_sum: f64,
    pub imbalance_steps: u64,
    /// Router audits, (branch, instance) pairs compared, and those that differed.
    pub audits: u64,
    pub compared: u64,
    pub mismatches: u64,
    pub first_mismatch: String,
    /// `--drain K`: the turn count when it happened, and the turns it sent elsewhere
    /// (queued or running there).
    pub drained: Option<u32>,
    pub drained_at_turn: u64,
    pub drain_rerouted: u64,
    pub drain_released_slots: u64,
}

impl RouterMetrics {
    pub fn imbalance(&self) -> f64 {
        if self.imbalance_steps == 0 {
            1.0
        } else {
            self.imbalance_sum / self.imbalance_steps as f64
        }
    }
}

/// The router and what it keeps besides Dynamo's tree.
pub struct Fleet {
    pub(super) policy: Policy,
    pub(super) router: Router,
    /// Tie breaks and the random policy.
    rng: Rng,
    buf: Vec<u8>,
    /// `session`: where each session's turns go.
    pub(super) pinned: HashMap<u64, usize>,
    drain_done: bool,
    /// `--migrate`: the moves in flight.
    pub(super) moves: super::migrate::Moves,
}

impl Fleet {
    /// Turns events on for every instance (rank = its index) and feeds the router their
    /// first batches.
    pub fn new(e: &mut Engine<'_>, policy: Policy) -> Result<Fleet, String> {
        let n = e.inst.len();
        for (k, inst) in e.inst.iter_mut().enumerate() {
            let s = inst.cache.events_enable(k as u32);
            expect_ok(&format!("skv_events_enable(instance {k})"), s)?;
        }
        e.m.router = RouterMetrics {
            policy: policy.name(),
            instances: n as u32,
            drained: e.cfg.args.drain,
            ..RouterMetrics::default()
        };
        Ok(Fleet {
            policy,
            router: Router::new(e.cfg.args.page_size, n),
            rng: Rng::new(e.cfg.args.seed ^ 0x5EED_0F20_47E2),
            buf: Vec::new(),
            pinned: HashMap::new(),
            drain_done: false,
            moves: Default::default(),
        })
    }
}

impl Engine<'_> {
    fn fleet(&mut self) -> &mut Fleet {
        self.fleet.as_mut().expect("a multi-instance run")
    }

    /// Hands instance `cur` the token ids of `[from, to)` of branch `b`'s conversation.
    pub(super) fn hand_tokens(
        &mut self,
        i: usize,
        b: usize,
        req: &skv::skv_req,
        from: u32,
        to: u32,
    ) -> Result<(), Fault> {
        let toks: Vec<i32> = self.conversation(i, b, to)[from as usize..].iter().map(|&t| t as i32).collect();
        let (sid, bid) = (self.open[i].id, self.open[i].branches[b].id);
        let s = self.inst[self.cur].cache.events_tokens(sid, bid, req, from, &toks);
        expect_ok(&format!("skv_events_tokens(session {sid}, branch {bid}, [{from}, {to}))"), s)
    }

    /// Every instance's pending batches into the router.
    pub(super) fn pump(&mut self) -> Result<(), Fault> {
        let f = self.fleet.as_mut().expect("a multi-instance run");
        for k in 0..self.inst.len() {
            loop {
                match self.inst[k].cache.events_drain(&mut f.buf) {
                    Ok(Some(seq)) => f.router.apply(k, seq, &f.buf)?,
                    Ok(None) => break,
                    Err(s) => return Err(unexpected(&format!("skv_events_drain(instance {k})"), s)),
                }
            }
        }
        let r = &mut self.m.router;
        (r.batches, r.events, r.event_bytes) = (f.router.batches, f.router.events, f.router.bytes);
        r.cpu_events = f.router.lower_events;
        Ok(())
    }

    /// One step of the fleet after the instances' decode rounds: the router reads the
    /// events, `--drain` happens when due, ready turns are routed, and each instance starts
    /// queued turns while its batch has room.
    pub(super) fn route_and_admit(&mut self) -> Result<(), Fault> {
        self.pump()?;
        self.note_imbalance();
        if let Some(k) = self.cfg.args.drain {
            let total = self.cfg.args.sessions * self.cfg.args.turns as u64;
            if !self.fleet().drain_done && self.m.turns >= total / 2 {
                self.drain_instance(k as usize)?;
            }
        }
        if self.cfg.args.migrate {
            self.migrate_step()?;
        }
        for i in 0..self.open.len() {
            let s = &self.open[i];
            // A session waits while one of its branches moves.
            if s.turn.is_none() && s.pending.is_none() && s.turns_left > 0 && !s.branches.iter().any(|b| b.moving) {
                self.route(i);
            }
        }
        for k in 0..self.inst.len() {
            while self.inst[k].live && self.inst[k].running < self.cfg.instance_batch as usize {
                // As the single engine admits: a waiting turn at random.
                let q = self.inst[k].queue.len();
                if q == 0 {
                    break;
                }
                let sid = self.inst[k].queue.swap_remove_back(self.rng.below(q)).expect("in the queue");
                let i = self.open.iter().position(|s| s.id == sid).expect("a queued session is open");
                let p = self.open[i].pending.take().expect("a queued session has a pending turn");
                self.inst[k].prefill_tokens -= p.prefill_tokens;
                if !self.begin_turn(i, p.branch, p.plan, k, p.decode_blocks)? {
                    break; // preempted for lack of memory: wait for running turns to finish
                }
            }
        }
        Ok(())
    }

    fn note_imbalance(&mut self) {
        let live: Vec<u64> = self.inst.iter().filter(|x| x.live).map(|x| x.active_tokens).collect();
        let (max, sum) = (live.iter().copied().max().unwrap_or(0), live.iter().sum::<u64>());
        let r = &mut self.m.router;
        r.steps += 1;
        if sum > 0 {
            r.imbalance_sum += max as f64 * live.len() as f64 / sum as f64;
            r.imbalance_steps += 1;
        }
    }

    /// Picks the instance of session `i`'s next turn and queues it there.
    fn route(&mut self, i: usize) {
        let cfg = self.cfg;
        let a = &cfg.args;
        let (b, plan) = match self.open[i].replay.take() {
            Some(x) => x,
            None => {
                let s = &self.open[i];
                let mut rng = turn_rng(a.seed, s.id, a.turns - s.turns_left);
                let b = self.pick_branch(i, Some(&mut rng));
                (b, TurnPlan::draw(a, &mut rng))
            }
        };
        let sid = self.open[i].id;
        let origin = self.open[i].branches[b].history + plan.user_tokens;
        let ps = a.page_size;
        let tokens = self.conversation(i, b, origin);
        let live: Vec<usize> = (0..self.inst.len()).filter(|&k| self.inst[k].live).collect();
        let n = self.inst.len();
        let f = self.fleet.as_mut().expect("a multi-instance run");
        let overlaps = f.router.overlaps(&tokens, &salt(sid), n);
        let load =
            |k: usize| Load { prefill_tokens: self.inst[k].prefill_tokens, decode_blocks: self.inst[k].decode_blocks };
        // Dynamo's choice: the lowest cost, ties broken at random.
        let best = |f: &mut Fleet, use_overlap: bool| {
            let mut pick = (f64::INFINITY, live[0], 0u32);
            for &k in &live {
                let c = cost(load(k), origin, if use_overlap { overlaps[k] } else { 0 }, ps, a.overlap_credit);
                if c < pick.0 {
                    pick = (c, k, 1);
                } else if c == pick.0 {
                    pick.2 += 1;
                    if f.rng.below(pick.2 as usize) == 0 {
                        pick.1 = k;
                    }
                }
            }
            pick.1
        };
        // A branch that moved (`--migrate`) runs its next turn where its KV went.
        let br = &self.open[i].branches[b];
        let moved_to = Some(br.inst).filter(|&k| br.migrated && br.has_slot && self.inst[k].live);
        let k = match f.policy {
            _ if moved_to.is_some() => moved_to.expect("checked"),
            Policy::Kv => best(f, true),
            Policy::Session => match f.pinned.get(&sid) {
                Some(&k) if self.inst[k].live => k,
                _ => {
                    let k = best(f, true);
                    f.pinned.insert(sid, k);
                    k
                }
            },
            Policy::Random => live[f.rng.below(live.len())],
        };
        // What Dynamo's scheduler charges the instance with until the prefill is done, and
        // until the request finishes.
        let prefill_tokens = (origin as u64).saturating_sub(overlaps[k] as u64 * ps as u64);
        let decode_blocks = origin.div_ceil(ps) as u64;
        self.inst[k].prefill_tokens += prefill_tokens;
        self.inst[k].decode_blocks += decode_blocks;
        self.inst[k].queue.push_back(sid);
        self.open[i].pending = Some(Pending { branch: b, plan, prefill_tokens, decode_blocks });
        self.m.router.routed += 1;
    }

    /// `--drain K`: nothing more goes to instance `k`; its queued and running turns are
    /// routed again, its idle slots released, its shared prompt freed. The router learns it
    /// from `k`'s events alone; the audit then checks it scores nothing there.
    fn drain_instance(&mut self, k: usize) -> Result<(), Fault> {
        self.fleet().drain_done = true;
        self.m.router.drained_at_turn = self.m.turns;
        self.inst[k].live = false;
        for sid in std::mem::take(&mut self.inst[k].queue) {
            let i = self.open.iter().position(|s| s.id == sid).expect("a queued session is open");
            let p = self.open[i].pending.take().expect("a queued session has a pending turn");
            self.inst[k].prefill_tokens -= p.prefill_tokens;
            self.inst[k].decode_blocks -= p.decode_blocks;
            self.open[i].replay = Some((p.branch, p.plan));
            self.m.router.drain_rerouted += 1;
        }
        for i in 0..self.open.len() {
            if self.open[i].turn.as_ref().is_some_and(|t| t.inst == k) {
                let t = self.open[i].turn.take().expect("running");
                self.preempt(i, t)?;
                self.m.router.drain_rerouted += 1;
            }
        }
        self.cur = k;
        // With --migrate its idle slots move instead (from this step on, until none is left),
        // then its shared prompt goes.
        if !self.cfg.args.migrate {
            for i in 0..self.open.len() {
                for b in 0..self.open[i].branches.len() {
                    let br = &self.open[i].branches[b];
                    if br.has_slot && br.inst == k {
                        self.m.freed_release += self.release_slot(i, b)?;
                        self.m.router.drain_released_slots += 1;
                    }
                }
            }
            self.free_shared()?;
        }
        self.inst[k].active_tokens = 0;
        self.audit()
    }

    /// The router's view against every instance (see the module's comment).
    pub(super) fn audit_router(&mut self) -> Result<(), Fault> {
        self.pump()?;
        let (n, ps) = (self.inst.len(), self.cfg.args.page_size);
        self.m.router.audits += 1;
        for i in 0..self.open.len() {
            let parked = self.parked_branches(i)?;
            let s = &self.open[i];
            let sid = s.id;
            // What each branch has published on the device: on which instance, how many tokens
            // (a session parked in the host tier keeps only its protected prefix there).
            let published: Vec<Option<(usize, u32)>> = (0..s.branches.len())
                .map(|b| match &s.turn {
                    Some(t) if t.branch == b => Some((t.inst, t.req.origin_input_len)),
                    _ if parked[b] => Some((s.branches[b].inst, s.branches[b].protected)),
                    _ if s.branches[b].has_slot => Some((s.branches[b].inst, s.branches[b].kv_len)),
                    _ => None,
                })
                .collect();
            let convs: Vec<Vec<u32>> = (0..s.branches.len())
                .map(|b| self.conversation(i, b, published[b].map_or(s.branches[b].history, |p| p.1)))
                .collect();
            // A moving branch (`--migrate`) is published on its destination too, since its import.
            let copies: Vec<(usize, usize, u32)> = (0..s.branches.len())
                .filter_map(|o| published[o].map(|p| (o, p.0, p.1)))
                .chain((0..s.branches.len()).filter_map(|o| {
                    let br = &s.branches[o];
                    self.moving_to(sid, br.id).filter(|_| br.moving).map(|d| (o, d, br.kv_len))
                }))
                .collect();
            let salt = salt(sid);
            for (b, conv) in convs.iter().enumerate() {
                let got = self.fleet.as_ref().expect("a multi-instance run").router.overlaps(conv, &salt, n);
                for (k, &got) in got.iter().enumerate() {
                    let want = copies
                        .iter()
                        .filter(|c| c.1 == k)
                        .map(|&(o, _, len)| {
                            let shared = conv.iter().zip(&convs[o][..len as usize]).take_while(|(x, y)| x == y).count();
                            shared as u32 / ps
                        })
                        .max()
                        .unwrap_or(0);
                    self.m.router.compared += 1;
                    if got != want {
                        self.m.router.mismatches += 1;
                        if self.m.router.first_mismatch.is_empty() {
                            self.m.router.first_mismatch = format!(
                                "session {sid} branch {b} on instance {k}: the router scores {got} pages, libskv holds {want}"
                            );
                        }
                    }
                }
            }
        }
        if self.m.router.mismatches > 0 {
            return Err(format!(
                "router audit: {} mismatches, first: {}",
                self.m.router.mismatches, self.m.router.first_mismatch
            ));
        }
        Ok(())
    }

    /// Which branches of session `i` are parked in their instance's host tier.
    fn parked_branches(&self, i: usize) -> Result<Vec<bool>, Fault> {
        let s = &self.open[i];
        let mut parked = vec![false; s.branches.len()];
        if self.tier.is_empty() {
            return Ok(parked);
        }
        for (b, br) in s.branches.iter().enumerate().filter(|(_, br)| br.has_slot) {
            let w =
                self.inst[br.inst].cache.session_where(s.id, br.id).map_err(|e| unexpected("skv_session_where", e))?;
            parked[b] = w.place == skv::SKV_PLACE_HOST;
        }
        Ok(parked)
    }

    /// After every session closed: the router's tree holds nothing of any instance, and the
    /// router's figures are final.
    pub(super) fn close_fleet(&mut self) -> Result<(), Fault> {
        self.pump()?;
        if !self.fleet.as_ref().expect("a multi-instance run").router.is_empty() {
            return Err("the router's tree still holds blocks after every session closed".into());
        }
        Ok(())
    }
}
