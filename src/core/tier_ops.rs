//! The host tier's calls (owned mode): write idle sessions back to host memory, park them
//! (drop the device copy), evict under pressure, and say where a session is (docs/tiers.md);
//! a match's restore is `tier_restore`'s, a ticket's completion `ticket_ops`'. Every decision walks a queue from its head: O(pages moved), plus the
//! entries a walk skips (running requests, open tickets).

use std::collections::HashSet;

use foldhash::fast::RandomState;

use super::cache::{push_free_past_prefix, push_release, Cache, Move};
use super::error::{bail, Error, Result};
use super::page::pages_for;
use super::records::{Evicted, TierStats, Where};
use super::slots::{Place, Slot};
use super::tickets::Kind;
use super::tier::{HostCopy, Tier};

/// `copy_pages`' direction: device pages to host pages.
pub(crate) const COPY_TO_HOST: u32 = 1;
/// `copy_pages`' direction: host pages to device pages.
pub(crate) const COPY_TO_DEVICE: u32 = 2;

/// The copies one call asks for: pairs in the full pools, then in the SWA pools.
#[derive(Default)]
pub(super) struct Copies {
    pub(super) full_src: Vec<i32>,
    pub(super) full_dst: Vec<i32>,
    pub(super) swa_src: Vec<i32>,
    pub(super) swa_dst: Vec<i32>,
}

/// One slot a plan writes back: its row, its device pages' count and which of them hold an SWA
/// page (positions past the protected prefix).
struct WriteBack {
    row: u32,
    n_full: usize,
    swa_at: Vec<bool>,
    leaving: bool,
}

/// What a call will do to the host tier, decided before anything changes.
#[derive(Default)]
struct Plan {
    writes: Vec<WriteBack>,
    /// Host copies dropped to make room, in the order they go: `(row, release the slot)`.
    victims: Vec<(u32, bool)>,
    /// Their pages, in the order they go back.
    pushed_full: Vec<u32>,
    pushed_swa: Vec<u32>,
    taken_full: usize,
    taken_swa: usize,
    copies: Copies,
    /// Where the walks of `dup_lru` and `host_lru` for victims stand.
    dup_at: usize,
    lru_at: usize,
    /// Every row the plan holds: written back, a victim, or parked or released by the call
    /// itself (a walk skips them).
    rows: HashSet<u32, RandomState>,
}

impl Plan {
    fn has(&self, row: u32) -> bool {
        self.rows.contains(&row)
    }
}

impl Cache {
    pub(super) fn tier_ref(&self) -> Result<&Tier> {
        match self.tier.as_deref() {
            Some(t) => Ok(t),
            None => bail!(Unsupported, "no host tier (host_num_token_slots 0, or external mode)"),
        }
    }

    pub(super) fn tier_mut(&mut self) -> &mut Tier {
        self.tier.as_deref_mut().expect("checked by tier_ref")
    }

    /// Refuses a tier move without a `copy_pages` hook.
    pub(super) fn require_copy(&self) -> Result<()> {
        let p = self.owned_pool()?;
        match p.hooks.as_deref().is_some_and(|h| h.can_copy()) {
            true => Ok(()),
            false => {
                bail!(Unsupported, "no copy_pages hook installed (skv_cache_set_hooks): the host tier cannot copy")
            }
        }
    }

    /// Calls `copy_pages` for ticket `t`: nothing has changed yet, and on failure nothing does.
    pub(super) fn copy(&mut self, t: u64, direction: u32, c: &Copies) -> Result<()> {
        let (nf, ns) = (c.full_src.len(), c.swa_src.len());
        if nf + ns == 0 {
            return Ok(());
        }
        let src: Vec<i32> = c.full_src.iter().chain(&c.swa_src).copied().collect();
        let dst: Vec<i32> = c.full_dst.iter().chain(&c.swa_dst).copied().collect();
        let p = self.pool.owned_mut().expect("owned mode");
        let h = p.hooks.as_deref_mut().expect("checked by require_copy");
        h.copy_pages(t, direction, &src, &dst, nf, ns).map_err(|code| {
            Error::Callback(format!("copy_pages returned {code} for ticket {t}: nothing was copied, nothing changed"))
        })
    }

    /// The idle device slot of `row`, if the row holds one no call is copying.
    fn idle_on_device(&self, row: u32) -> Option<Slot> {
        let s = *self.slots.of_row(row)?;
        (!s.in_flight && s.place == Place::Device).then_some(s)
    }

    /// Adds `row`'s slot to a write-back plan, evicting host copies for room; false when the
    /// host pools cannot hold it (the plan is as before).
    fn plan_write(&self, plan: &mut Plan, row: u32, s: &Slot, leaving: bool) -> bool {
        let ps = self.cfg.page_size;
        let first = pages_for(s.protected, ps) as usize;
        let p = self.pool.owned().expect("owned mode");
        let r = p.in_use(row).expect("a slot's row is in use");
        let full = &r.pages[first.min(r.pages.len())..];
        let swa: &[u32] = match p.swa.as_ref() {
            Some(sw) => &sw.rows[row as usize].ids[first.min(r.pages.len())..],
            None => &[],
        };
        let n_swa = swa.iter().filter(|&&i| i != 0).count();
        if full.is_empty() || !self.host_room(plan, full.len(), n_swa, row) {
            return false;
        }
        let c = &mut plan.copies;
        c.full_src.extend(full.iter().map(|&p| p as i32));
        c.swa_src.extend(swa.iter().filter(|&&i| i != 0).map(|&p| p as i32));
        let swa_at = match swa.is_empty() {
            true => Vec::new(),
            false => swa.iter().map(|&i| i != 0).collect(),
        };
        plan.taken_full += full.len();
        plan.taken_swa += n_swa;
        plan.writes.push(WriteBack { row, n_full: full.len(), swa_at, leaving });
        plan.rows.insert(row);
        true
    }

    /// Whether the host pools can give `n_full` and `n_swa` more pages to the plan, adding
    /// victims (only when the pool is full): the least recently used copies of sessions on the
    /// device first, then of parked sessions.
    fn host_room(&self, plan: &mut Plan, n_full: usize, n_swa: usize, for_row: u32) -> bool {
        let t = self.tier.as_deref().expect("tier");
        let (free_full, free_swa) =
            (t.full.free_pages() as usize, t.swa.as_ref().map_or(0, |s| s.free_pages() as usize));
        let fits = |p: &Plan| {
            free_full + p.pushed_full.len() >= p.taken_full + n_full
                && free_swa + p.pushed_swa.iter().filter(|&&x| x != 0).count() >= p.taken_swa + n_swa
        };
        // A slot larger than the pool never fits: evict nothing for it.
        if n_full >= t.full.total_pages() as usize || n_swa >= t.swa.as_ref().map_or(1, |s| s.total_pages() as usize) {
            return false;
        }
        while !fits(plan) {
            let Some((row, release)) = self.next_victim(plan, for_row) else { return false };
            let c = &self.tier.as_deref().expect("tier").copies[row as usize];
            plan.pushed_full.extend(&c.full);
            plan.pushed_swa.extend(c.swa.iter().filter(|&&x| x != 0));
            plan.victims.push((row, release));
            plan.rows.insert(row);
        }
        true
    }

    /// The next host copy the plan may drop, no ticket copying it and the plan not holding it:
    /// the least recently used copy of a session on the device (a duplicate), else of a parked
    /// session (`true`: it goes whole).
    fn next_victim(&self, plan: &mut Plan, for_row: u32) -> Option<(u32, bool)> {
        let t = self.tier.as_deref().expect("tier");
        let free = |plan: &Plan, stamp: u64, row: u32| {
            let c = &t.copies[row as usize];
            c.stamp == stamp && c.exists() && c.ticket == 0 && row != for_row && !plan.has(row)
        };
        let parked = |row: u32| self.slots.of_row(row).is_some_and(|s| s.place == Place::Parked);
        while plan.dup_at < t.dup_lru.len() {
            let (stamp, row) = t.dup_lru[plan.dup_at];
            plan.dup_at += 1;
            if free(plan, stamp, row) && !parked(row) {
                return Some((row, false));
            }
        }
        while plan.lru_at < t.host_lru.len() {
            let (stamp, row) = t.host_lru[plan.lru_at];
            plan.lru_at += 1;
            if free(plan, stamp, row) && parked(row) {
                return Some((row, true));
            }
        }
        None
    }

    /// Runs a plan: `copy_pages` first (its failure changes nothing), then the victims go,
    /// the host pages are taken and each written slot is pinned under one new ticket. `extra`
    /// runs inside the same change (the slots an eviction parks or releases now).
    fn run_plan(&mut self, mut plan: Plan, extra: impl FnOnce(&mut Self)) -> Result<u64> {
        let tier = self.tier.as_deref().expect("tier");
        let dst_full = tier.full.predict(&plan.pushed_full, plan.taken_full);
        let dst_swa = tier.swa.as_ref().map_or(Vec::new(), |s| s.predict(&plan.pushed_swa, plan.taken_swa));
        plan.copies.full_dst = dst_full.iter().map(|&p| p as i32).collect();
        plan.copies.swa_dst = dst_swa.iter().map(|&p| p as i32).collect();
        let ps = self.cfg.page_size;
        for &(row, release) in &plan.victims {
            if release {
                let s = *self.slots.of_row(row).expect("a parked victim's slot");
                push_release(&mut self.effects, ps, row, &s);
            }
        }
        // Everything that can fail, before the copy is asked for.
        self.pool.prepare(&self.effects)?;
        let t = match plan.writes.is_empty() {
            true => 0,
            false => self.tickets.next(),
        };
        self.copy(t, COPY_TO_HOST, &plan.copies)?;
        self.run_effects(|c| {
            for &(row, release) in &plan.victims {
                c.tier_mut().counts.host_evictions += 1;
                match release {
                    true => c.release_moved(row),
                    false => c.tier_mut().drop_copy(row),
                }
            }
            if plan.writes.is_empty() {
                extra(c);
                c.trim_queues();
                return;
            }
            let rows = plan.writes.iter().map(|w| w.row).collect();
            let t = c.tickets.open(Kind::WriteBack, rows);
            let (mut full, mut swa) = (Vec::new(), Vec::new());
            let tier = c.tier_mut();
            tier.full.alloc(plan.taken_full as u32, &mut full);
            if let Some(s) = tier.swa.as_mut() {
                s.alloc(plan.taken_swa as u32, &mut swa);
            }
            debug_assert_eq!((&full, &swa), (&dst_full, &dst_swa), "the plan foresaw the host pages");
            tier.counts.pages_to_host += (full.len() + swa.len()) as u64;
            let (mut f, mut s) = (full.into_iter(), swa.into_iter());
            for w in &plan.writes {
                let copy = HostCopy {
                    full: f.by_ref().take(w.n_full).collect(),
                    swa: w.swa_at.iter().map(|&live| if live { s.next().expect("planned") } else { 0 }).collect(),
                    ticket: t,
                    clean: false,
                    leaving: w.leaving,
                    stamp: 0,
                };
                let tier = c.tier_mut();
                tier.copies[w.row as usize] = copy;
                tier.touch(w.row, false);
                c.pool.owned_mut().expect("owned").pin_row(w.row, t);
            }
            extra(c);
            c.trim_queues();
        })?;
        Ok(t)
    }

    /// Pops the entries at the heads of the policy's queues that no longer stand for anything
    /// (the walks skip them; popping them keeps each walk's skips to the entries that still do).
    fn trim_queues(&mut self) {
        let Cache { tier, slots, .. } = self;
        let t = tier.as_deref_mut().expect("tier");
        let copy_gone = |copies: &[HostCopy], (stamp, row): (u64, u32)| {
            let c = &copies[row as usize];
            c.stamp != stamp || !c.exists()
        };
        while t.dup_lru.front().is_some_and(|&e| copy_gone(&t.copies, e)) {
            t.dup_lru.pop_front();
        }
        while t.host_lru.front().is_some_and(|&e| copy_gone(&t.copies, e)) {
            t.host_lru.pop_front();
        }
        let slot_gone =
            |(fin, row): (u64, u32)| slots.of_row(row).is_none_or(|s| s.finished_at != fin || s.place == Place::Parked);
        while t.device_lru.front().is_some_and(|&e| slot_gone(e)) {
            t.device_lru.pop_front();
        }
    }

    /// The effect that drops a slot's device pages past its protected prefix (a park).
    pub(super) fn push_park(&mut self, row: u32, s: &Slot) {
        let end = self.pool.mapped_len(row).unwrap_or(s.allocated);
        push_free_past_prefix(&mut self.effects, self.cfg.page_size, row, s, end);
    }

    /// `row`'s slot is parked (its device pages were freed by `push_park`'s effect).
    pub(super) fn mark_parked(&mut self, row: u32) {
        let s = self.slots.of_row_mut(row).expect("slot");
        s.place = Place::Parked;
        let protected = s.protected;
        self.log_move(row, Move::Parked { protected });
        let t = self.tier_mut();
        t.copies[row as usize].leaving = false;
        t.counts.parks += 1;
        t.touch(row, true);
    }

    /// `skv_tier_step`: the clock ticks, and idle slots past the idle threshold start writing
    /// back (at most `pages_per_step` pages, though always the first slot); returns the pages
    /// queued and the ticket (0 when none).
    pub fn tier_step(&mut self) -> Result<(u64, u64)> {
        let tier = self.tier_ref()?;
        let budget = tier.cfg.pages_per_step as usize;
        let (idle, min) = (tier.cfg.idle_steps as u64, tier.min_tokens(self.cfg.page_size));
        let now = tier.clock + 1;
        let mut plan = Plan::default();
        let mut at = 0;
        let mut pages = 0;
        if budget > 0 {
            self.require_copy()?;
        }
        // With no budget, nothing is written back in the background.
        let queue_len = if budget > 0 { self.tier_ref()?.writeback.len() } else { 0 };
        while at < queue_len {
            let (fin, row) = self.tier_ref()?.writeback[at];
            let t = self.tier_ref()?;
            let s = match self.idle_on_device(row) {
                Some(s)
                    if s.finished_at == fin
                        && self.ticket_of(row) == 0
                        && !t.copies[row as usize].exists()
                        && !plan.has(row) =>
                {
                    s
                }
                // Stale, in flight (its finish pushes it again), already copied, or queued twice
                // (a failed write-back queues its slot again) and planned already.
                _ => {
                    at += 1;
                    continue;
                }
            };
            if now - t.finished_clock[row as usize] < idle {
                break;
            }
            let n =
                pages_for(s.allocated, self.cfg.page_size).saturating_sub(pages_for(s.protected, self.cfg.page_size));
            if pages > 0 && pages + n as usize > budget {
                break;
            }
            at += 1;
            if s.allocated - s.protected < min {
                continue;
            }
            if self.plan_write(&mut plan, row, &s, false) {
                pages += n as usize;
            }
        }
        self.effects.clear();
        let queued = (plan.taken_full + plan.taken_swa) as u64;
        let t = self.run_plan(plan, |c| {
            let tier = c.tier_mut();
            tier.clock = now;
            tier.writeback.drain(..at);
        })?;
        Ok((queued, t))
    }

    /// `skv_session_park`: an idle device slot leaves the device: now when its host copy is
    /// clean, else once the write-back this starts completes (the returned ticket).
    pub fn park(&mut self, session: u64, branch: u64) -> Result<u64> {
        self.tier_ref()?;
        let Some((row, s)) = self.slots.find(session, branch).map(|(r, s)| (r, *s)) else {
            bail!(NotFound, "session {session} branch {branch} has no slot to park");
        };
        self.check_movable(session, branch, row, &s)?;
        self.effects.clear();
        if self.tier_ref()?.copies[row as usize].clean {
            self.push_park(row, &s);
            self.run_effects(|c| c.mark_parked(row))?;
            return Ok(0);
        }
        self.require_copy()?;
        let mut plan = Plan::default();
        if !self.plan_write(&mut plan, row, &s, true) {
            let n = pages_for(s.allocated, self.cfg.page_size) - pages_for(s.protected, self.cfg.page_size);
            if n == 0 {
                self.push_park(row, &s);
                self.run_effects(|c| c.mark_parked(row))?;
                return Ok(0);
            }
            bail!(OutOfMemory, "the host tier cannot hold session {session} branch {branch}'s {n} pages");
        }
        self.run_plan(plan, |_| {})
    }

    /// Refuses a park or export of a slot that is running, parked or already being copied.
    pub(crate) fn check_movable(&self, session: u64, branch: u64, row: u32, s: &Slot) -> Result<()> {
        if s.in_flight {
            bail!(State, "session {session} branch {branch} is in flight: finish or hand back its request first");
        }
        let t = self.ticket_of(row);
        if t != 0 {
            bail!(State, "session {session} branch {branch} is being copied (ticket {t}): complete it first");
        }
        if s.place == Place::Parked {
            bail!(State, "session {session} branch {branch} is already parked");
        }
        Ok(())
    }

    /// `skv_tier_evict`: frees device pages, least recently finished idle slots first, until
    /// `pages` are freed or draining: a clean slot parks now, a slot being written back parks
    /// when it completes, a dirty one worth keeping is written back and parks then (unless
    /// `no_copy`), any other is released.
    pub fn tier_evict(&mut self, pages: u64, no_copy: bool) -> Result<Evicted> {
        let tier = self.tier_ref()?;
        let min = tier.min_tokens(self.cfg.page_size);
        let ps = self.cfg.page_size;
        let mut out = Evicted::default();
        let mut plan = Plan::default();
        let (mut parks, mut releases, mut joins) = (Vec::new(), Vec::new(), Vec::new());
        let mut at = 0;
        while out.freed_pages + out.draining_pages < pages {
            let Some(&(fin, row)) = self.tier_ref()?.device_lru.get(at) else { break };
            at += 1;
            let Some(s) = self.idle_on_device(row).filter(|s| s.finished_at == fin && !plan.has(row)) else {
                continue;
            };
            if self.moving(row) {
                // A move's session stays whole until the destination answers.
                continue;
            }
            let n = (pages_for(self.pool.mapped_len(row).unwrap_or(0), ps) - pages_for(s.protected, ps)) as u64;
            let c = &self.tier_ref()?.copies[row as usize];
            if c.leaving {
                continue;
            }
            if c.clean && c.ticket == 0 {
                plan.rows.insert(row);
                parks.push((row, s));
                out.parked += 1;
                out.freed_pages += n;
            } else if c.ticket != 0 && c.exists() {
                joins.push(row);
                out.copying += 1;
                out.draining_pages += n;
            } else if !no_copy
                && self.ticket_of(row) == 0
                && s.allocated - s.protected >= min
                && self.require_copy().is_ok()
                && self.plan_write(&mut plan, row, &s, true)
            {
                out.copying += 1;
                out.draining_pages += n;
            } else {
                plan.rows.insert(row);
                releases.push((row, s));
                out.released += 1;
                out.freed_pages += n;
            }
        }
        self.effects.clear();
        for &(row, s) in &parks {
            self.push_park(row, &s);
        }
        for &(row, s) in &releases {
            push_release(&mut self.effects, ps, row, &s);
        }
        out.ticket = self.run_plan(plan, |c| {
            for &(row, _) in &parks {
                c.mark_parked(row);
            }
            for &row in &joins {
                c.tier_mut().copies[row as usize].leaving = true;
            }
            for &(row, _) in &releases {
                c.release_moved(row);
            }
        })?;
        Ok(out)
    }

    /// The tier's part of a hit on a device slot: a host copy no longer matches what the
    /// request will write (unless the copy is the restore's own, which its completion drops).
    #[inline]
    pub(crate) fn tier_hit(&mut self, row: u32) {
        if self.tier.is_some() {
            self.tier_hit_copy(row);
        }
    }

    #[inline(never)]
    fn tier_hit_copy(&mut self, row: u32) {
        if self.copy_kind(row) != Some(Kind::Unpark) {
            self.tier_mut().drop_copy(row);
        }
    }

    /// The tier's part of a finished turn.
    #[inline]
    pub(crate) fn tier_finished(&mut self, row: u32, finished_at: u64) {
        if let Some(t) = self.tier.as_deref_mut() {
            t.finished(row, finished_at);
        }
    }

    /// The tier's part of a hand-back: the slot is idle again, to be written back.
    #[inline]
    pub(crate) fn tier_handed_back(&mut self, row: u32, finished_at: u64) {
        if let Some(t) = self.tier.as_deref_mut() {
            t.writeback.push_back((finished_at, row));
        }
    }
}

/// `skv_where`'s places and state bits.
pub(crate) const PLACE_DEVICE: u32 = 1;
pub(crate) const PLACE_BOTH: u32 = 2;
pub(crate) const PLACE_HOST: u32 = 3;
pub(crate) const WHERE_IN_FLIGHT: u32 = 1;
pub(crate) const WHERE_COPYING: u32 = 2;
pub(crate) const WHERE_FAILED: u32 = 4;
pub(crate) const WHERE_LEAVING: u32 = 8;

impl Cache {
    /// `skv_session_where`: where a session slot's KV is; place 0 (none) when there is no slot.
    pub fn where_is(&self, session: u64, branch: u64) -> Where {
        let Some((row, s)) = self.slots.find(session, branch) else { return Where::default() };
        let copy = self.tier.as_deref().map(|t| &t.copies[row as usize]);
        let host = copy.map_or(0, |c| c.full.len() + c.swa.iter().filter(|&&p| p != 0).count());
        let place = match (s.place, copy.is_some_and(|c| c.clean)) {
            (Place::Parked, _) => PLACE_HOST,
            (_, true) => PLACE_BOTH,
            _ => PLACE_DEVICE,
        };
        let mut state = 0;
        state |= WHERE_IN_FLIGHT * s.in_flight as u32;
        let ticket = self.ticket_of(row);
        state |= WHERE_COPYING * (ticket != 0) as u32;
        state |= WHERE_FAILED * (s.place == Place::Failed) as u32;
        state |= WHERE_LEAVING * copy.is_some_and(|c| c.leaving) as u32;
        let device_pages = self.pool.mapped_len(row).map_or(0, |n| pages_for(n, self.cfg.page_size)) as u64;
        Where { place, state, tokens: s.allocated, device_pages, host_pages: host as u64, ticket, ..Where::default() }
    }

    /// `skv_tier_stats`.
    pub fn tier_stats(&self) -> TierStats {
        let mut st = TierStats { open_tickets: self.tickets.count() as u32, ..TierStats::default() };
        if let Some(p) = self.pool.owned() {
            (st.draining_pages, st.swa_draining_pages) = p.pins.draining();
        }
        let Some(t) = self.tier.as_deref() else { return st };
        let (hd, hsd) = t.draining();
        st.clock = t.clock;
        (st.host_total_pages, st.host_free_pages, st.host_draining_pages) =
            (t.full.total_pages() as u64, t.full.free_pages() as u64, hd);
        if let Some(s) = t.swa.as_ref() {
            (st.host_swa_total_pages, st.host_swa_free_pages, st.host_swa_draining_pages) =
                (s.total_pages() as u64, s.free_pages() as u64, hsd);
        }
        st.parked_sessions = self.slots.iter().filter(|(_, s)| s.place == Place::Parked).count() as u64;
        let c = t.counts;
        (st.parks, st.unparks, st.writebacks, st.host_evictions, st.failed_copies) =
            (c.parks, c.unparks, c.writebacks, c.host_evictions, c.failed_copies);
        (st.pages_to_host, st.pages_to_device) = (c.pages_to_host, c.pages_to_device);
        st
    }
}
