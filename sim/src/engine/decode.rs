//! A running turn: one verify round per step (the running requests' extensions and commits
//! in one batch call each), the finish that stores its slot, and the preemption of a request
//! the pool cannot hold.

use skv::skv_req;
use skv::skv_status::{SKV_ERR_OUT_OF_MEMORY, SKV_OK};

use super::mamba::{handles_of, real};
use super::{expect_ok, floor_to, unexpected, Engine, Fault, Turn};

impl Engine<'_> {
    /// One speculative verify round: k+1 slots ahead of the committed tokens, the accepted
    /// drafts plus the bonus token committed.
    pub(super) fn decode_round(&mut self, i: usize) -> Result<(), Fault> {
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
    pub(super) fn decode_step(&mut self) -> Result<(), Fault> {
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
    pub(super) fn after_round(&mut self, i: usize, mut t: Turn, accepted: u32) -> Result<(), Fault> {
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

    pub(super) fn finish(&mut self, i: usize, mut t: Turn, aborted: bool) -> Result<(), Fault> {
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
    pub(super) fn preempt(&mut self, i: usize, mut t: Turn) -> Result<(), Fault> {
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
}
