//! The streaming-session operations (docs/operations.md): restore a session's KV for its
//! next turn, hand back a restored request that never ran, trim a finished turn's
//! speculative overshoot, release what a session holds.

use super::cache::{free_aligned_effect, push_release, Backend, Cache};
use super::error::{bail, Result};
use super::page::{ceil_align, floor_align};
use super::records::{Held, Match};
use super::req::{keep_protected, swa_dead, swa_dead_lo, Req};
use super::session_checks::{check_claim, check_unrun};
use super::slots::{Place, Slot};
use super::tickets::Kind;

const MISS: Match = Match { hit: 0, prefix_len: 0 };

impl Cache {
    /// `free_aligned(row, target, end)`: the page-safe tail free.
    pub fn free_aligned(&mut self, row: u32, target: u32, end: u32) -> Result<()> {
        if row >= self.cfg.num_rows {
            bail!(InvalidArg, "row {row} out of range [0, {})", self.cfg.num_rows);
        }
        if end > self.cfg.max_context_len {
            bail!(InvalidArg, "end {end} > max_context_len {}", self.cfg.max_context_len);
        }
        if target > end {
            bail!(InvalidArg, "target {target} > end {end}: the range [target, end) runs backwards");
        }
        self.pool.check_free(row, target, end)?;
        // Only a session slot records the row's SWA cursor; any other row's is the engine's.
        let dead = self.slots.of_row(row).map_or((0, 0), |s| slot_dead(s, self.cfg.page_size));
        self.shorten_row(row, target, end, dead, |_| {})
    }

    /// `trim_overshoot(req, finished_len)`: cut every KV field back to
    /// `origin_input_len + finished_len`, freeing only whole pages.
    pub fn trim_overshoot(&mut self, req: &mut Req, finished_len: u32) -> Result<()> {
        req.validate(&self.cfg)?;
        let row = req.require_row()?;
        let target = self.trim_target(req, finished_len)?;
        self.check_record(req)?;
        self.check_floor(req)?;
        let (end, dead) = (req.kv_allocated_len, req_dead(req, self.cfg.page_size));
        self.shorten_row(row, target, end, dead, |c| c.apply_trim(req, target, finished_len))
    }

    /// `free_tail(req, prefix_len)`: free what lies past a reused prefix.
    pub fn free_tail(&mut self, req: &mut Req, prefix_len: u32) -> Result<()> {
        req.validate(&self.cfg)?;
        let row = req.require_row()?;
        if prefix_len > req.kv_allocated_len {
            bail!(InvalidArg, "prefix_len {prefix_len} > kv_allocated_len {}", req.kv_allocated_len);
        }
        self.check_record(req)?;
        self.check_floor(req)?;
        keep_protected("prefix_len", prefix_len, req.cache_protected_len, "the tree's prefix is never freed")?;
        // Where frees split at the SWA cursor, a boundary inside the window-freed range floors to
        // a page, as a trim's: a cursor clamped inside a page there would refuse every later free
        // of the row, its release included.
        let ps = self.cfg.page_size;
        let (end, dead) = (req.kv_allocated_len, req_dead(req, ps));
        let prefix_len = match self.pool.frees_swa().is_ok() && ps > 1 && dead.0 < prefix_len && prefix_len < dead.1 {
            true => floor_align(prefix_len, ps),
            false => prefix_len,
        };
        self.shorten_row(row, prefix_len, end, dead, |c| c.apply_free_tail(req, prefix_len))
    }

    /// What the three primitives share: free `row[len..end)` page-safely, where a session
    /// holding the row must be running, keep its floor (`check_slot_floor`), and shortens its
    /// record with the row; `mutate` updates the caller's req.
    fn shorten_row(
        &mut self,
        row: u32,
        len: u32,
        end: u32,
        dead: (u32, u32),
        mutate: impl FnOnce(&mut Self),
    ) -> Result<()> {
        self.guard_idle_session_row(row)?;
        self.check_slot_floor(row, len, end)?;
        self.check_kept_page(row, len, end, dead)?;
        self.effects.clear();
        self.effects.extend(free_aligned_effect(self.cfg.page_size, row, len, end, dead));
        self.run_effects(|c| {
            mutate(c);
            match c.slots.of_row_mut(row) {
                Some(s) if len < end => clamp_slot(s, len),
                _ => {}
            }
        })
    }

    /// `match_prefix`: restore a session's slot into the req for its next turn. A parked slot,
    /// or one an import still writes, is refused: its KV is not on the device yet
    /// (`match_prefix_tier` restores it and names the copy's ticket).
    #[inline]
    pub fn match_prefix(
        &mut self,
        session: u64,
        branch: u64,
        req: &mut Req,
        key_len: u32,
        pre_aborted: bool,
    ) -> Result<Match> {
        self.hit(session, branch, req, key_len, pre_aborted, false)
    }

    /// `match_prefix`; `tiered`: the caller (`match_prefix_tier`) restored a parked slot or
    /// hands out an import's ticket with the hit.
    pub(crate) fn hit(
        &mut self,
        session: u64,
        branch: u64,
        req: &mut Req,
        key_len: u32,
        pre_aborted: bool,
        tiered: bool,
    ) -> Result<Match> {
        self.check_req(req)?;
        let Some((row, slot)) = self.slots.find_near(session, branch, req.row()) else { return Ok(MISS) };
        let slot = *slot;
        if !tiered && !pre_aborted && (slot.place == Place::Parked || self.meta(row).is_some_and(|m| m.pinned)) {
            self.refuse_untiered(session, branch, row, &slot)?;
        }
        if pre_aborted {
            return Ok(MISS);
        }
        check_claim(session, branch, row, &slot, req)?;
        let ps = self.cfg.page_size;
        let Some(prefix_len) = self.reusable_prefix(&slot, key_len)? else {
            self.release_rows(&[row])?;
            return Ok(MISS);
        };
        let mut r = self.restore(row, &slot, req);
        self.effects.clear();
        self.effects.extend(free_aligned_effect(ps, row, prefix_len, r.kv_allocated_len, req_dead(&r, ps)));
        self.run_effects(|c| {
            c.apply_free_tail(&mut r, prefix_len);
            *req = r;
            let s = c.slots.of_row_mut(row).expect("slot found above");
            (s.committed, s.allocated, s.swa, s.in_flight) =
                (r.kv_committed_len, r.kv_allocated_len, r.swa_evicted_seqlen, true);
            c.sync_idle(row);
            c.tier_hit(row);
        })?;
        Ok(Match { hit: 1, prefix_len })
    }

    /// A plain match of a parked slot, or of one an import still writes or an export still
    /// reads: refused.
    #[cold]
    fn refuse_untiered(&self, session: u64, branch: u64, row: u32, slot: &Slot) -> Result<()> {
        self.refuse_exporting(session, branch, row, false)?;
        if slot.place == Place::Parked {
            bail!(
                State,
                "session {session} branch {branch} is parked in the host tier: match it with \
                 skv_match_prefix_tier, which restores it"
            );
        }
        let t = self.ticket_of(row);
        if self.arriving(t) {
            bail!(
                State,
                "session {session} branch {branch} is being imported (ticket {t}): match it with \
                 skv_match_prefix_tier, which names the ticket"
            );
        }
        Ok(())
    }

    /// The prefix a match of `slot` with `key_len` reuses; `None` when aligned reuse finds
    /// nothing whole to reuse (the match releases the slot and misses).
    pub(crate) fn reusable_prefix(&self, slot: &Slot, key_len: u32) -> Result<Option<u32>> {
        let ps = self.cfg.page_size;
        if self.cfg.aligned_reuse && ps > 1 {
            let a = floor_align(slot.committed.min(key_len), ps);
            if a < slot.protected || a == 0 {
                return Ok(None);
            }
        }
        let prefix_len = slot.committed.min(key_len);
        keep_protected("reusable prefix", prefix_len, slot.protected, "sessions are append-only")?;
        // The SWA cursor must stay page-aligned, so a window past the prefix floors it.
        Ok(Some(match ps > 1 && (self.cfg.aligned_reuse || slot.swa > prefix_len) {
            true => floor_align(prefix_len, ps),
            false => prefix_len,
        }))
    }

    /// The req a slot restores into. libskv's own rows know their mapped length (a retried
    /// match also frees what the first try extended); an engine's retried req may have
    /// extended past what the in-flight slot recorded. (A req holding an idle slot's row is a
    /// stale copy: its lengths count for nothing.)
    fn restore(&self, row: u32, slot: &Slot, req: &Req) -> Req {
        let allocated = self.pool.mapped_len(row).unwrap_or(if slot.in_flight {
            slot.allocated.max(req.kv_allocated_len)
        } else {
            slot.allocated
        });
        Req {
            req_pool_idx: row as i32,
            row_generation: slot.generation,
            kv_committed_len: slot.committed,
            kv_allocated_len: allocated,
            cache_protected_len: slot.protected,
            swa_evicted_seqlen: slot.swa,
            swa_evict_floor: slot.swa_floor,
            lock_node: slot.lock_node,
            lock_receipt: slot.lock_receipt,
            aux_state: slot.aux,
            aux_track: slot.track,
            ..*req
        }
    }

    /// `cache_finished_req`: save a finished turn into its session slot (after trimming its
    /// overshoot), or release everything on an abort.
    pub fn cache_finished_req(&mut self, session: u64, branch: u64, req: &mut Req, aborted: bool) -> Result<()> {
        if aborted {
            return self.finish_aborted(session, branch, req);
        }
        req.validate(&self.cfg)?;
        let row = req.require_row()?;
        let finished_len = req.finished();
        let trim_target = self.trim_target(req, finished_len)?;
        self.check_record(req)?;
        self.check_floor(req)?;
        let found = self.slots.find_near(session, branch, req.row()).map(|(r, s)| (r, *s));
        self.check_row_belongs(row, found.map(|(r, _)| r), session, branch)?;
        let copying = found.map_or(0, |(r, _)| self.ticket_of(r));
        match found.map(|(_, s)| s) {
            Some(s) if !s.in_flight => bail!(
                State,
                "session {session} branch {branch} is idle: a later turn's req comes from match_prefix \
                 (this one is a stale copy or already finished)"
            ),
            Some(s) if s.place == Place::Failed => bail!(
                State,
                "session {session} branch {branch}'s KV never arrived (its restore's copy failed): hand the \
                 request back (the session parks again) or abort it"
            ),
            Some(_) if copying != 0 && self.tickets.get(copying).is_some_and(|p| p.kind != Kind::WriteBack) => bail!(
                State,
                "session {session} branch {branch}'s KV is still being copied (ticket {copying}): complete the \
                 ticket before the turn's forward pass"
            ),
            // Saving a shorter record would forget the tail the running slot records.
            Some(s) if req.kv_allocated_len < s.allocated => bail!(
                State,
                "kv_allocated_len {} < the {} tokens session {session} branch {branch} records",
                req.kv_allocated_len,
                s.allocated
            ),
            _ => {}
        }
        // The slot keeps its first turn's protected prefix: the cursor it will record must be
        // one the pool can free around with that prefix, not only with the req's.
        if let (Some(s), Backend::Engine(p)) = (found.map(|(_, s)| s), &self.pool) {
            p.check_cursor(&Req { cache_protected_len: s.protected, ..*req })?;
        }
        self.check_slot_floor(row, trim_target, req.kv_allocated_len)?;
        let target = req.origin_input_len + finished_len;
        let past_committed = past_committed(target, req.kv_committed_len);
        self.effects.clear();
        let dead = req_dead(req, self.cfg.page_size);
        self.effects.extend(free_aligned_effect(self.cfg.page_size, row, trim_target, req.kv_allocated_len, dead));
        self.run_effects(|c| {
            c.apply_trim(req, trim_target, finished_len);
            let saved = match c.slots.of_row_mut(row) {
                Some(s) => {
                    (s.committed, s.allocated, s.swa, s.aux, s.track) = (
                        req.kv_committed_len,
                        req.kv_allocated_len,
                        req.swa_evicted_seqlen,
                        req.aux_state,
                        req.aux_track,
                    );
                    s.swa_floor = req.swa_evict_floor;
                    s
                }
                None => {
                    let generation = c.generation(row);
                    c.slots.insert(row, slot_from(session, branch, generation, req));
                    c.slots.of_row_mut(row).expect("just inserted")
                }
            };
            saved.committed = target.min(saved.allocated);
            saved.in_flight = false;
            c.finishes_past_committed += past_committed as u64;
            c.turns_finished += 1;
            saved.finished_at = c.turns_finished;
            c.sync_idle(row);
            c.tier_finished(row, c.turns_finished);
            req.clear_kv();
        })
    }

    /// `hand_back`: a request a hit restored, dropped before it ran, gives its row back to
    /// the slot. The slot becomes idle exactly as the match left it (its recency too: the turn
    /// never ran) and nothing is freed; the req ends holding nothing.
    pub fn hand_back(&mut self, session: u64, branch: u64, req: &mut Req) -> Result<()> {
        self.check_req(req)?;
        let Some(row) = req.row() else {
            bail!(
                InvalidArg,
                "req_pool_idx -1: the req holds no row (a miss has nothing to hand back; only a \
                 skv_match_prefix hit restores a row)"
            );
        };
        let Some((slot_row, slot)) = self.slots.find_near(session, branch, Some(row)).map(|(r, s)| (r, *s)) else {
            bail!(
                State,
                "session {session} branch {branch} has no slot: req_pool_idx {row} was not restored by a \
                 skv_match_prefix hit (a first turn or a miss finishes, or frees, its row instead)"
            );
        };
        if slot_row != row {
            bail!(State, "req holds row {row} but session {session} branch {branch} is restored into row {slot_row}");
        }
        if !slot.in_flight {
            bail!(
                State,
                "session {session} branch {branch} is idle: no request restored into row {row} is running \
                 (the req is a stale copy, already finished or already handed back)"
            );
        }
        check_unrun(req, &slot, row)?;
        if slot.place == Place::Failed {
            // A failed restore parks again on its host copy; a failed import has none: its
            // session ends, as an abort would end it.
            if self.tier.as_deref().is_some_and(|t| t.copies[row as usize].exists()) {
                return self.repark(row, &slot).map(|()| req.clear_kv());
            }
            return self.finish_aborted(session, branch, req);
        }
        self.effects.clear();
        self.run_effects(|c| {
            c.slots.of_row_mut(row).expect("slot found above").in_flight = false;
            c.sync_idle(row);
            c.tier_handed_back(row, slot.finished_at);
            req.clear_kv();
        })
    }

    fn finish_aborted(&mut self, session: u64, branch: u64, req: &mut Req) -> Result<()> {
        self.check_req(req)?;
        let found = self.slots.find_near(session, branch, req.row()).map(|(r, s)| (r, *s));
        let (row, doomed) = match (found, req.row()) {
            (None, None) => return Ok(()),
            (None, Some(row)) => {
                self.check_row_belongs(row, None, session, branch)?;
                (row, slot_from(session, branch, 0, req))
            }
            (Some((row, slot)), held) => {
                if held != Some(row) {
                    bail!(
                        State,
                        "aborted req holds row {} but session {session} branch {branch} holds row {row}",
                        req.req_pool_idx
                    );
                }
                self.check_floor(req)?;
                self.refuse_moving(row, &slot)?;
                // The running request's state counts (its extension, its cursors, its
                // recurrent-state handles); an idle slot's req is a stale copy, and the slot's
                // own record is what it holds.
                let doomed = match slot.in_flight {
                    true => Slot {
                        allocated: slot.allocated.max(req.kv_allocated_len),
                        aux: req.aux_state,
                        track: req.aux_track,
                        swa: req.swa_evicted_seqlen,
                        swa_floor: req.swa_evict_floor,
                        ..slot
                    },
                    false => slot,
                };
                (row, doomed)
            }
        };
        self.effects.clear();
        push_release(&mut self.effects, self.cfg.page_size, row, &doomed);
        self.run_effects(|c| {
            c.remove_slot(row);
            req.clear_kv();
        })
    }

    /// `checkpoint`: whether a session slot handles this request's chunk boundary.
    pub fn checkpoint(&self, session: u64, branch: u64, req: &Req) -> Result<bool> {
        self.check_req(req)?;
        Ok(self.slots.find(session, branch).is_some())
    }

    /// `release_branch`: free one slot (none is fine).
    pub fn release_branch(&mut self, session: u64, branch: u64) -> Result<()> {
        match self.slots.find(session, branch) {
            Some((row, _)) => self.release_rows(&[row]),
            None => Ok(()),
        }
    }

    /// `release_session`: free every branch, oldest slot first.
    pub fn release_session(&mut self, session: u64) -> Result<()> {
        let rows: smallvec::SmallVec<[u32; 4]> = self.slots.rows_of(session).into();
        self.release_rows(&rows)
    }

    /// Releases the slots holding `rows`, all or none: one in flight refuses the lot.
    pub(crate) fn release_rows(&mut self, rows: &[u32]) -> Result<()> {
        if let Some(p) = self.pool.owned() {
            rows.iter().for_each(|&row| p.preload_row(row));
        }
        self.effects.clear();
        for &row in rows {
            let s = self.slots.of_row(row).expect("rows of live slots");
            self.refuse_moving(row, s)?;
            if s.in_flight {
                bail!(
                    State,
                    "session {} branch {} is in flight (row {row}): finish or abort its request first",
                    s.session,
                    s.branch
                );
            }
            push_release(&mut self.effects, self.cfg.page_size, row, s);
        }
        if let Some(p) = self.pool.owned() {
            rows.iter().for_each(|&row| p.preload_release(row));
        }
        self.run_effects(|c| {
            for &row in rows {
                c.remove_slot(row);
            }
        })
    }

    /// Drops the slot holding `row` (the frees of its pages are the caller's effects): its host
    /// copy goes, or drains while a ticket still copies it, and the row's idle flag follows.
    #[inline]
    pub(crate) fn remove_slot(&mut self, row: u32) {
        if let Some(t) = self.tier.as_deref_mut() {
            t.drop_copy(row);
        }
        self.slots.remove(row);
        if !self.origins.is_empty() {
            self.origins.remove(&row);
        }
        self.sync_idle(row);
    }

    /// `session_held`: what idle slots hold; rows in `active` belong to running requests.
    pub fn session_held(&self, active: &[i32]) -> Result<Held> {
        let n = self.cfg.num_rows;
        if let Some((i, row)) = active.iter().enumerate().find(|(_, &r)| u32::try_from(r).map_or(true, |r| r >= n)) {
            bail!(InvalidArg, "active_rows[{i}] = {row} out of range [0, {n})");
        }
        let mut active = active.to_vec();
        active.sort_unstable();
        let ps = self.cfg.page_size;
        let mut h = Held { sessions: self.slots.len() as u64, ..Held::default() };
        for (row, s) in self.slots.iter() {
            if active.binary_search(&(row as i32)).is_ok() {
                continue;
            }
            h.rows += 1;
            h.aux_states += (s.aux != -1) as u64;
            h.aux_handles += s.aux_handles().iter().filter(|&&a| a != -1).count() as u64;
            if s.place == Place::Parked {
                // Its KV is in the host tier: only the row and its recurrent state stay here.
                continue;
            }
            let end = ceil_align(s.allocated, ps);
            h.full_tokens += end - s.protected as u64;
            // sglang's kv_private_swa_tokens: the window frees only [swa_dead_lo, swa);
            // [protected, swa_dead_lo) stays held even after the cursor passes it.
            // An in-flight slot's cursor is its running request's, which may lie past the
            // length the slot recorded at the hit: such a slot holds no SWA tokens of its own.
            let window_freed = s.swa.saturating_sub(swa_dead_lo(s.protected, s.swa_floor, ps));
            h.swa_tokens += (end - s.protected as u64).saturating_sub(window_freed as u64);
        }
        Ok(h)
    }

    /// The trim boundary of skv_trim_overshoot (docs/operations.md), after its checks.
    fn trim_target(&self, req: &Req, finished_len: u32) -> Result<u32> {
        if finished_len > req.output_len {
            bail!(InvalidArg, "finished_len {finished_len} > output_len {}", req.output_len);
        }
        let Some(target) = req.origin_input_len.checked_add(finished_len) else {
            bail!(
                InvalidArg,
                "origin_input_len {} + finished_len {finished_len} overflows 32 bits",
                req.origin_input_len
            );
        };
        if target < req.cache_protected_len {
            bail!(
                InvalidArg,
                "origin_input_len + finished_len = {target} < cache_protected_len {}: a trim never reaches into the tree's prefix",
                req.cache_protected_len
            );
        }
        let ps = self.cfg.page_size;
        // The SWA cursor must stay page-aligned; the partial page is re-prefilled next turn.
        Ok(if ps > 1 && req.swa_evicted_seqlen > target { floor_align(target, ps) } else { target })
    }

    fn apply_trim(&mut self, req: &mut Req, target: u32, finished_len: u32) {
        self.trimmed_tokens += req.kv_allocated_len.saturating_sub(target) as u64;
        req.kv_allocated_len = req.kv_allocated_len.min(target);
        req.kv_committed_len = req.kv_committed_len.min(target);
        req.swa_evicted_seqlen = req.swa_evicted_seqlen.min(target);
        req.output_len = req.output_len.min(finished_len);
        // A trim below the engine's recorded finished length lowers it too: finished_len may
        // never exceed output_len, or every later call would refuse the req.
        if u32::try_from(req.finished_len).is_ok_and(|f| f > req.output_len) {
            req.finished_len = req.output_len as i32;
        }
        self.sync_cursor(req);
    }

    /// An owned SWA pool records each row's cursor: it follows the req's wherever an
    /// operation moves it (a trim, a tail free, a match, a window step).
    #[inline]
    pub(crate) fn sync_cursor(&mut self, req: &Req) {
        if let (Some(row), Some(p)) = (req.row(), self.pool.owned_mut()) {
            p.set_cursor(row, req.swa_evicted_seqlen);
        }
    }

    /// A running session's slot takes the SWA cursor and floor of a window step, so a later
    /// `free_aligned` (which sees no req) splits where the window left off.
    pub(crate) fn mirror_cursor(&mut self, row: u32, req: &Req) {
        if let Some(s) = self.slots.of_row_mut(row) {
            (s.swa, s.swa_floor) = (req.swa_evicted_seqlen, req.swa_evict_floor);
        }
        self.sync_cursor(req);
    }

    fn apply_free_tail(&mut self, req: &mut Req, prefix_len: u32) {
        self.tail_freed_tokens += (req.kv_allocated_len - prefix_len) as u64;
        req.kv_allocated_len = prefix_len;
        req.kv_committed_len = req.kv_committed_len.min(prefix_len);
        req.swa_evicted_seqlen = req.swa_evicted_seqlen.min(prefix_len);
        self.sync_cursor(req);
    }
}

/// A finish claims `target` tokens while the req committed `committed`. The last sampled token
/// has no KV yet, so a finish may claim one token past what was committed and no more: an
/// engine in step with sglang's scheduler has `committed >= target - 1` at every finish (one
/// more under non-speculative overlap). Beyond that the finish claims tokens whose KV the engine
/// never committed, and the slot (committed = min(target, allocated)) offers them for reuse:
/// such a finish is counted, not refused (docs/conventions.md, "Finishes past committed").
fn past_committed(target: u32, committed: u32) -> bool {
    target as u64 > committed as u64 + 1
}

/// The SWA-dead range of a req's row before a free.
fn req_dead(r: &Req, ps: u32) -> (u32, u32) {
    swa_dead(r.cache_protected_len, r.swa_evict_floor, r.swa_evicted_seqlen, ps)
}

fn slot_dead(s: &Slot, ps: u32) -> (u32, u32) {
    swa_dead(s.protected, s.swa_floor, s.swa, ps)
}

/// A running request's primitive shortened its row: the in-flight slot mirrors it, so a
/// later abort never hands back the same tail twice.
fn clamp_slot(s: &mut Slot, len: u32) {
    s.allocated = s.allocated.min(len);
    s.committed = s.committed.min(len);
    s.swa = s.swa.min(len);
}

fn slot_from(session: u64, branch: u64, generation: u32, r: &Req) -> Slot {
    Slot {
        session,
        branch,
        generation,
        committed: r.kv_committed_len,
        allocated: r.kv_allocated_len,
        protected: r.cache_protected_len,
        swa: r.swa_evicted_seqlen,
        swa_floor: r.swa_evict_floor,
        lock_node: r.lock_node,
        lock_receipt: r.lock_receipt,
        aux: r.aux_state,
        track: r.aux_track,
        in_flight: false,
        finished_at: 0,
        epoch: 0,
        place: Place::Device,
    }
}
