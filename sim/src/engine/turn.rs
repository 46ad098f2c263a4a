//! A turn's start: the match checked against the engine's mirror (`expected_match`), a
//! fresh row with the shared system prompt on a miss, and the prefill.

use skv::{skv_match, skv_req};

use crate::ffi::SHARED_NODE;
use crate::workload::TurnPlan;

use super::mamba::{handles_of, real};
use super::{expect_ok, floor_to, Branch, Engine, Fault, Turn};

impl Engine<'_> {
    /// The slot's answer to a match, as libskv must give it (docs/operations.md, skv_match_prefix).
    pub(super) fn expected_match(&self, br: &Branch, key_len: u32) -> (bool, u32) {
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

    pub(super) fn do_match(&mut self, i: usize, b: usize, req: &mut skv_req, key_len: u32) -> Result<bool, Fault> {
        if !self.tier.is_empty() {
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
    pub(super) fn start_turn(&mut self, i: usize) -> Result<bool, Fault> {
        let b = self.pick_branch(i, None);
        let plan = TurnPlan::draw(&self.cfg.args, &mut self.rng);
        self.begin_turn(i, b, plan, 0, 0)
    }

    /// Starts a turn of branch `b` on instance `k`.
    pub(super) fn begin_turn(
        &mut self,
        i: usize,
        b: usize,
        plan: TurnPlan,
        k: usize,
        charged_blocks: u64,
    ) -> Result<bool, Fault> {
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
        #[cfg(feature = "router")]
        self.note_moved_turn(i, b, hit);
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
        self.inst[k].prefilled += n as u64;
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

    pub(super) fn prefill(&mut self, _i: usize, req: &mut skv_req, origin: u32) -> Result<bool, Fault> {
        let n = origin - req.kv_allocated_len;
        if n == 0 {
            return Ok(true);
        }
        self.with_memory("skv_alloc_extend(prefill)", req, |c, r| c.alloc_extend(r, n))
    }
}
