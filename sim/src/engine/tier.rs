//! libskv's host tier in the engine (`--host-pool-tokens`; docs/simulator.md#the-host-tier):
//! one `skv_tier_step` per step, `skv_tier_evict` under memory pressure instead of releasing
//! idle branches, `skv_match_prefix_tier` for every match, and the modelled time of each step.
//!
//! The time model: a step takes `--step-ms` of decode, then its prefill tokens at
//! `--prefill-tokens-per-s`. Copies are enqueued at the step's start; the step's prefill
//! waits for every restore it admitted (and for any write-back an eviction had to wait on):
//! the time it starts past the decode is the step's stall.

use skv::skv_req;
use skv::{SKV_PLACE_HOST, SKV_PLACE_NONE};

use super::copies::{Copies, PoolPages, Writes};
use super::mamba::{handles_of, real};
use super::{unexpected, Engine, Fault};

/// The host tier's figures (the run with the tier) and the modelled time (every run).
#[derive(Default, Clone, Copy)]
pub struct TierMetrics {
    /// Modelled seconds of the whole run (its steps, stalls included).
    pub model_s: f64,
    /// Restores: matches that hit a parked session; matches that found it parked but missed
    /// because its device pages did not fit (libskv released the slot).
    pub restores: u64,
    pub restore_misses: u64,
    /// Slots the tier released (an eviction found no host room, or a parked copy was dropped
    /// for room), seen by the engine.
    pub released_by_tier: u64,
    /// Steps whose prefill waited for a copy, requests among them that waited for their
    /// restore, evictions that waited for a write-back, and the modelled seconds waited.
    pub stalled_steps: u64,
    pub stalled_restores: u64,
    pub eviction_waits: u64,
    pub stall_s: f64,
    /// skv_tier_evict calls, and the sessions they parked, released, or left to park when
    /// their write-back completes.
    pub evict_calls: u64,
    pub evict_parked: u64,
    pub evict_released: u64,
    pub evict_copying: u64,
    /// Restores whose copy failed (`--copy-fail-rate`): their request was aborted.
    pub failed_restores: u64,
    /// Positions checked against the tag mirror at hits.
    pub verified_positions: u64,
    /// skv_tier_stats at the end.
    pub parks: u64,
    pub unparks: u64,
    pub writebacks: u64,
    pub host_evictions: u64,
    pub failed_copies: u64,
    pub bytes_to_host: u64,
    pub bytes_to_device: u64,
}

/// The modelled clock (every run).
#[derive(Default)]
pub(super) struct Clock {
    /// The current step's start, in modelled seconds.
    pub(super) now: f64,
    /// Each instance's prefilled tokens at the last step.
    last_prefilled: Vec<u64>,
    /// The time the step's prefill may start, set by the copies it waits for.
    gate: f64,
}

/// A restored request whose reused KV is checked once its restore's ticket completes.
struct Restored {
    sid: u64,
    bid: u64,
    row: i32,
    len: u32,
    cursor: u32,
    ticket: u64,
    writes: Writes,
}

/// The engine's side of the host tier.
pub(super) struct TierSim {
    pub(super) copies: Copies,
    restored: Vec<Restored>,
    writers: u64,
    host_evictions_seen: u64,
}

impl TierSim {
    pub(super) fn new(pages: PoolPages, a: &crate::cli::Args) -> TierSim {
        TierSim { copies: Copies::new(pages, a), restored: Vec::new(), writers: 0, host_evictions_seen: 0 }
    }
}

impl Engine<'_> {
    fn sim(&mut self) -> &mut TierSim {
        &mut self.tier[self.cur]
    }

    /// The shared system prompts' tags, written once (their pages never move).
    pub(super) fn tier_start(&mut self) {
        for k in 0..self.tier.len() {
            let shared = self.inst[k].shared.clone();
            for (p, &x) in shared.iter().enumerate() {
                self.tier[k].copies.device[x as usize] = super::copies::tag(0, 0, p as u32, 0);
            }
        }
    }

    /// A step boundary: on each instance the copies done by now complete, and the policy's
    /// clock ticks (a drained instance's copies still complete).
    pub(super) fn step_begin(&mut self) -> Result<(), Fault> {
        self.clock.gate = self.clock.now + self.cfg.args.step_ms / 1000.0;
        for k in 0..self.tier.len() {
            self.cur = k;
            self.complete_due(self.clock.now)?;
            if !self.inst[k].live {
                continue;
            }
            let (_, ticket) = self.inst[k].cache.tier_step().map_err(|s| unexpected("skv_tier_step", s))?;
            self.enqueue("skv_tier_step", ticket)?;
            self.note_tier_releases("skv_tier_step", 0)?;
        }
        Ok(())
    }

    /// The step's forward passes: each instance's prefill waits for the restores it admitted;
    /// the reused KV of each is checked once its copy completed; the clock moves on by the
    /// slowest instance's step.
    pub(super) fn step_end(&mut self) -> Result<(), Fault> {
        let decode_end = self.clock.now + self.cfg.args.step_ms / 1000.0;
        let mut waited = 0;
        for t in &self.tier {
            for r in &t.restored {
                if let Some(f) = t.copies.finish_of(r.ticket) {
                    waited += (f > decode_end) as u64;
                    self.clock.gate = self.clock.gate.max(f);
                }
            }
        }
        for k in 0..self.tier.len() {
            self.cur = k;
            let restored = std::mem::take(&mut self.sim().restored);
            self.complete_due(self.clock.gate)?;
            for r in &restored {
                // A request preempted since its match let its row go; nothing reads its KV.
                let running = self.open.iter().position(|s| {
                    s.id == r.sid && s.turn.as_ref().is_some_and(|t| t.inst == k && t.req.req_pool_idx == r.row)
                });
                let Some(i) = running else { continue };
                if self.sim().copies.failed.remove(&r.ticket) {
                    // Its KV never arrived: the request cannot run, and goes back to the queue.
                    self.m.tier.failed_restores += 1;
                    let t = self.open[i].turn.take().expect("running");
                    self.preempt(i, t)?;
                    self.cur = k;
                    continue;
                }
                let what = format!("restore of session {} branch {} on instance {k}", r.sid, r.bid);
                self.verify_tags(&what, r.row, (r.sid, r.bid), (r.len, r.cursor), &r.writes)?;
            }
        }
        let stall = self.clock.gate - decode_end;
        let m = &mut self.m.tier;
        m.stalled_restores += waited;
        if stall > 0.0 {
            m.stalled_steps += 1;
            m.stall_s += stall;
        }
        let last = &mut self.clock.last_prefilled;
        last.resize(self.inst.len(), 0);
        let mut prefilled = 0;
        for (l, inst) in last.iter_mut().zip(&self.inst) {
            prefilled = prefilled.max(inst.prefilled - *l);
            *l = inst.prefilled;
        }
        self.clock.now = self.clock.gate.max(decode_end) + prefilled as f64 / self.cfg.args.prefill_tokens_per_s;
        self.m.tier.model_s = self.clock.now;
        Ok(())
    }

    /// Frees at least `pages` device pages with skv_tier_evict (waiting for the write-backs
    /// whose pages drain when that is all it could do). Ok(false): nothing left to evict.
    pub(super) fn tier_evict(&mut self, pages: u64) -> Result<bool, Fault> {
        let out = self.inst[self.cur].cache.tier_evict(pages).map_err(|s| unexpected("skv_tier_evict", s))?;
        self.enqueue("skv_tier_evict", out.ticket)?;
        let m = &mut self.m.tier;
        m.evict_calls += 1;
        m.evict_parked += out.parked as u64;
        m.evict_released += out.released as u64;
        m.evict_copying += out.copying as u64;
        self.m.evictions += (out.parked + out.released + out.copying) as u64;
        self.m.freed_evict += out.freed_pages + out.draining_pages;
        self.note_tier_releases("skv_tier_evict", out.released as u64)?;
        if out.freed_pages > 0 {
            return Ok(true);
        }
        // Pages that drain come back when their write-back completes: the engine waits for it
        // (in the model, its step's prefill does).
        let Some(done) = self.sim().copies.last_to_host() else { return Ok(false) };
        self.m.tier.eviction_waits += 1;
        self.clock.gate = self.clock.gate.max(done);
        self.complete_due(done)?;
        Ok(true)
    }

    /// After a tier call that may have released slots (`released` by an eviction, or parked
    /// copies dropped for host room): the engine's mirror forgets them, each checked with
    /// skv_session_where, and their recurrent-state handles must have come back (in any
    /// order: the tier releases by its own queues).
    fn note_tier_releases(&mut self, what: &str, released: u64) -> Result<(), Fault> {
        let st = self.inst[self.cur].cache.tier_stats().map_err(|s| unexpected("skv_tier_stats", s))?;
        let dropped = st.host_evictions - self.sim().host_evictions_seen;
        self.sim().host_evictions_seen = st.host_evictions;
        let mut handles = Vec::new();
        let mut gone = 0;
        for i in 0..self.open.len() {
            for b in 0..self.open[i].branches.len() {
                // An in-flight slot never goes; a parked one a match is about to restore may.
                let (s, br) = (&self.open[i], &self.open[i].branches[b]);
                if !br.has_slot || br.inst != self.cur || released + dropped == 0 {
                    continue;
                }
                let w = self.inst[self.cur]
                    .cache
                    .session_where(s.id, br.id)
                    .map_err(|e| unexpected("skv_session_where", e))?;
                if w.place == SKV_PLACE_NONE {
                    handles.extend(real(br.handles));
                    self.open[i].branches[b].has_slot = false;
                    gone += 1;
                }
            }
        }
        if gone < released || gone > released + dropped {
            return Err(format!(
                "{what}: the host tier released {gone} idle slots; the call said {released} released and {dropped} host copies dropped"
            ));
        }
        let h = &self.inst[self.cur].cache.hooks.handles;
        let mut got = h.take_handed_back();
        got.sort_unstable();
        handles.sort_unstable();
        if got != handles || !h.bad.borrow().is_empty() {
            return Err(format!("{what}: free_aux received {got:?}, the released slots held {handles:?}"));
        }
        self.m.tier.released_by_tier += gone;
        Ok(())
    }

    /// `skv_match_prefix_tier`, checked against the engine's mirror: a slot on the device hits
    /// as skv_match_prefix would; a parked one is restored (the engine evicts first so that
    /// its pages fit) under a ticket, its KV checked once the copy completed.
    pub(super) fn do_match_tier(&mut self, i: usize, b: usize, req: &mut skv_req, key_len: u32) -> Result<bool, Fault> {
        let (sid, bid) = (self.open[i].id, self.open[i].branches[b].id);
        let what = format!("skv_match_prefix_tier(session {sid}, branch {bid})");
        let retry = req.req_pool_idx >= 0;
        let (want_hit, want_len) = self.expected_match(&self.open[i].branches[b], key_len);
        let w = self.inst[self.cur].cache.session_where(sid, bid).map_err(|s| unexpected("skv_session_where", s))?;
        let has_slot = self.open[i].branches[b].has_slot;
        if has_slot != (w.place != SKV_PLACE_NONE) {
            return Err(format!("{what}: skv_session_where place {}, the engine expects a slot: {has_slot}", w.place));
        }
        let parked = w.place == SKV_PLACE_HOST;
        let ps = self.cfg.args.page_size;
        let protected_pages = self.open[i].branches[b].protected.div_ceil(ps);
        let restore_pages =
            w.tokens.min(want_len.div_ceil(ps) * ps).div_ceil(ps).saturating_sub(protected_pages) as u64;
        if parked && want_hit {
            // Room in both pools (the SWA pool's need is at most the full pool's).
            let swa = self.cfg.args.swa_window > 0;
            loop {
                let st = self.inst[self.cur].cache.stats().map_err(|s| unexpected("skv_cache_stats", s))?;
                let short = restore_pages.saturating_sub(st.free_pages);
                let swa_short = if swa { restore_pages.saturating_sub(st.swa_free_pages) } else { 0 };
                if short.max(swa_short) == 0 || !self.tier_evict(short.max(swa_short))? {
                    break;
                }
            }
            // Room for another write-back may have dropped this session's host copy.
            if !self.open[i].branches[b].has_slot {
                return self.do_match_tier(i, b, req, key_len);
            }
        }
        let before = self.free_pages()?;
        let m =
            self.inst[self.cur].cache.match_prefix_tier(sid, bid, req, key_len).map_err(|s| unexpected(&what, s))?;
        self.enqueue(&what, m.ticket)?;
        let after = self.free_pages()?;
        let hit = m.hit == 1;
        // A restore that does not fit misses: the full pool's pages are known; the SWA pool's
        // are at most as many (the window's dead pages take none).
        let swa_free = self.inst[self.cur].cache.stats().map_or(0, |st| st.swa_free_pages);
        let swa_short = self.cfg.args.swa_window > 0 && swa_free < restore_pages;
        let short = parked && before < restore_pages;
        let ok_hit = match (short, parked && swa_short && want_hit) {
            (true, _) => !hit,
            (false, true) => true,
            (false, false) => hit == want_hit,
        };
        let want_cursor = self.open[i].branches[b].swa_cursor.min(want_len);
        if !ok_hit
            || (hit && (m.prefix_len != want_len || req.kv_allocated_len != want_len))
            || (hit && req.swa_evicted_seqlen != want_cursor)
        {
            return Err(format!(
                "{what}: hit {} prefix {} allocated {} cursor {}, expected hit {} prefix {want_len} cursor {want_cursor} (parked {parked}, {before} pages free for a restore of {restore_pages})",
                m.hit, m.prefix_len, req.kv_allocated_len, req.swa_evicted_seqlen, want_hit as u32
            ));
        }
        let restored = parked && hit;
        // A retried match while the first one's restore copies names that restore's ticket.
        let still_copying = retry && hit && !parked && m.restored_pages == 0 && self.copies().is_open(m.ticket);
        if !still_copying
            && (m.restored_pages as u64, m.ticket != 0)
                != (restore_pages * restored as u64, restored && restore_pages > 0)
        {
            return Err(format!(
                "{what}: restored {} pages under ticket {}, expected {} pages (parked {parked}, hit {hit}, retry {retry})",
                m.restored_pages,
                m.ticket,
                restore_pages * restored as u64
            ));
        }
        self.m.freed_tail += (after + m.restored_pages as u64).saturating_sub(before);
        let slot_handles = self.open[i].branches[b].handles;
        self.expect_handed_back(&what, real(slot_handles).filter(|_| has_slot && !hit))?;
        if hit && handles_of(req) != slot_handles {
            return Err(format!("{what}: restored handles {:?}, the slot holds {slot_handles:?}", handles_of(req)));
        }
        let br = &mut self.open[i].branches[b];
        if br.has_slot && !hit {
            br.has_slot = false;
            if parked {
                self.m.tier.restore_misses += 1;
            } else {
                self.m.aligned_releases += 1;
            }
        }
        if !hit || retry {
            return Ok(hit);
        }
        let writes = self.open[i].branches[b].writes.clone();
        if restored {
            self.m.tier.restores += 1;
            let cursor = req.swa_evicted_seqlen;
            let r = Restored { sid, bid, row: req.req_pool_idx, len: want_len, cursor, ticket: m.ticket, writes };
            self.sim().restored.push(r);
            return Ok(true);
        }
        self.verify_tags(&what, req.req_pool_idx, (sid, bid), (want_len, req.swa_evicted_seqlen), &writes)?;
        Ok(true)
    }

    /// A turn's prefill committed from `from` (its reused prefix, or the shared prompt on a
    /// miss): the turn's writer, recorded with the branch until its finish.
    pub(super) fn tier_prefilled(&mut self, i: usize, b: usize, hit: bool, from: u32) {
        let Some(t) = self.tier.get_mut(self.cur) else { return };
        t.writers += 1;
        let br = &mut self.open[i].branches[b];
        if !hit {
            br.writes = if from > 0 { vec![(0, 0)] } else { Vec::new() };
        }
        br.turn_writes = (from, t.writers, !hit);
    }

    /// A finishing turn's KV, `[from, end)` of its row, written to the mirror before libskv
    /// stores the slot.
    pub(super) fn tier_finishing(&mut self, i: usize, b: usize, req: &skv_req, end: u32) -> Result<(), Fault> {
        if self.tier.is_empty() {
            return Ok(());
        }
        let (sid, br) = (self.open[i].id, &mut self.open[i].branches[b]);
        let (from, writer, miss) = br.turn_writes;
        br.writes.retain(|&(p, _)| p < from);
        br.writes.push((from, writer));
        let bid = br.id;
        if miss {
            self.write_shared_swa_tags(req.req_pool_idx, from)?;
        }
        self.write_tags(req.req_pool_idx, (sid, bid), from, end, writer)
    }

    /// After the last session closed: every copy completes and libskv has no ticket open.
    pub(super) fn tier_close(&mut self) -> Result<(), Fault> {
        let kvb = self.cfg.args.page_size as u64 * self.cfg.args.kv_bytes_per_token;
        let mut unparks = 0;
        for k in 0..self.tier.len() {
            self.cur = k;
            self.complete_due(f64::INFINITY)?;
            let st = self.inst[k].cache.tier_stats().map_err(|s| unexpected("skv_tier_stats", s))?;
            if st.open_tickets != 0 || self.sim().copies.open_count() != 0 {
                return Err(format!(
                    "instance {k}: {} tickets open at the end (every copy the engine ran completed)",
                    st.open_tickets
                ));
            }
            if st.host_free_pages + 1 != st.host_total_pages {
                return Err(format!(
                    "instance {k}'s host pool: {} of {} pages free after every session closed",
                    st.host_free_pages,
                    st.host_total_pages - 1
                ));
            }
            let m = &mut self.m.tier;
            m.parks += st.parks;
            m.unparks += st.unparks;
            m.writebacks += st.writebacks;
            m.host_evictions += st.host_evictions;
            m.failed_copies += st.failed_copies;
            m.bytes_to_host += st.pages_to_host * kvb;
            m.bytes_to_device += st.pages_to_device * kvb;
            unparks += st.unparks;
        }
        if self.m.tier.restores != unparks {
            return Err(format!(
                "libskv counts {unparks} restores, the engine's matches restored {}",
                self.m.tier.restores
            ));
        }
        Ok(())
    }
}
