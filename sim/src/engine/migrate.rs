//! Sessions that move between instances (`--migrate`; docs/simulator.md#migration). Once a
//! step, before turns are routed: an instance whose pool use is at `--migrate-threshold` or
//! above hands its idle sessions, least recently used first, to the live instance with the
//! fewest pages in use while that one would still hold fewer than it; a drained instance
//! hands every idle session it holds to the least used live instance, each step until none
//! is left. A move is libskv's move export at the source, an import at the destination
//! (handed the token ids, so it publishes the session before the source can remove it), and
//! the copy the sim models: it takes the unit's bytes over the source's link at
//! `--link-gbps`, and its tickets complete at the first step boundary past that (the
//! destination's first: the commit; then the source's, which releases the session there). A
//! destination without room refuses the import: the source's ticket fails and the session
//! stays where it was.
//!
//! Until the move commits, the session waits (its turn is not routed); then its moved
//! branch's next turn goes where its KV went, under every policy.

use skv::skv_status::SKV_ERR_OUT_OF_MEMORY;
use skv::{skv_import, SKV_EXPORT_MOVE, SKV_FENCE_ABSENT, SKV_PLACE_NONE};

use super::mamba::real;
use super::{expect_ok, unexpected, Engine, Fault};
use crate::cli::Policy;

/// Header fields of a unit (docs/tiers.md#export-and-import): byte offsets of `u32`s.
const UNIT_EPOCH: usize = 28;
const UNIT_COMMITTED: usize = 56;
const UNIT_PROTECTED: usize = 64;
const UNIT_N_FULL: usize = 80;
const UNIT_N_SWA: usize = 84;

fn unit_u32(unit: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes(unit[at..at + 4].try_into().expect("a unit's header holds 96 bytes"))
}

/// The moves' figures of a run.
#[derive(Default, Clone, Debug)]
pub struct MigrateMetrics {
    /// Moves committed, and of them those off a drained instance.
    pub migrations: u64,
    pub drain_migrations: u64,
    /// Imports the destination refused for lack of room: an attempt each, after which the
    /// session stayed.
    pub refused: u64,
    /// What the committed moves carried: the units' pages (both pools, the whole session from
    /// position 0), their bytes (`pages x --page-size x --kv-bytes-per-token`), their committed
    /// tokens, and of those the ones past the shared prompt (what the destination would
    /// otherwise prefill: its own tree holds the prompt).
    pub pages: u64,
    pub bytes: u64,
    pub tokens: u64,
    pub saved_tokens: u64,
    /// Modelled seconds: the copies at `--link-gbps`, and the prefill of `saved_tokens` at
    /// `--prefill-tokens-per-s` they saved.
    pub transfer_s: f64,
    pub recompute_s: f64,
    /// The next turns of moved branches, and those that hit at the instance the branch
    /// moved to.
    pub next_turns: u64,
    pub next_hits: u64,
    /// Moves at which the router was checked to see the session on the destination, before
    /// and after the source's removal.
    pub event_checks: u64,
}

impl MigrateMetrics {
    pub fn hit_rate_after(&self) -> f64 {
        self.next_hits as f64 / self.next_turns.max(1) as f64
    }
}

/// A move in flight: both tickets open until the copy's modelled `finish`.
pub(super) struct Move {
    sid: u64,
    bid: u64,
    src: usize,
    dst: usize,
    export_ticket: u64,
    import_ticket: u64,
    finish: f64,
    /// The destination's recurrent-state handles.
    handles: [i64; 3],
    /// When the destination's slot was created (a release frees a session's slots oldest first).
    slot_seq: u64,
    /// Pages carried, and freed at the source when it commits; tokens carried and saved.
    pages: u64,
    freed: u64,
    tokens: u64,
    saved: u64,
    drain: bool,
}

/// A move whose export is open and whose import is tried.
struct Attempt {
    src: usize,
    dst: usize,
    export_ticket: u64,
    /// The source's unit: what it asks the destination about (skv_session_fence).
    unit: Vec<u8>,
    /// The destination's recurrent-state handles offered to the import.
    handles: [i64; 3],
}

/// The moves in flight and each source's link.
#[derive(Default)]
pub(super) struct Moves {
    open: Vec<Move>,
    link_free: Vec<f64>,
}

impl Engine<'_> {
    /// Slots and recurrent-state handles that imports in flight hold on instance `k`.
    pub(super) fn moves_into(&self, k: usize) -> (u64, u64) {
        let Some(f) = self.fleet.as_ref() else { return (0, 0) };
        f.moves.open.iter().filter(|m| m.dst == k).fold((0, 0), |(s, h), m| (s + 1, h + real(m.handles).count() as u64))
    }

    /// The step's moves (see the module's comment): due ones commit, then new ones start.
    pub(super) fn migrate_step(&mut self) -> Result<(), Fault> {
        self.commit_due()?;
        for k in 0..self.inst.len() {
            if self.inst[k].live {
                self.unload(k)?;
            } else {
                self.move_all_off(k)?;
            }
        }
        Ok(())
    }

    fn used_pages(&self, k: usize) -> Result<u64, Fault> {
        self.inst[k].cache.stats().map(|s| s.used_pages).map_err(|s| unexpected("skv_cache_stats", s))
    }

    /// Pages of `k`'s moves in flight (still held there until they commit).
    fn leaving(&self, k: usize) -> u64 {
        self.fleet.as_ref().map_or(0, |f| f.moves.open.iter().filter(|m| m.src == k).map(|m| m.freed).sum())
    }

    /// The live instance other than `k` with the fewest pages in use, and that count.
    fn least_used(&self, k: usize) -> Result<Option<(usize, u64)>, Fault> {
        let mut best = None;
        for j in (0..self.inst.len()).filter(|&j| j != k && self.inst[j].live) {
            let u = self.used_pages(j)?;
            if best.is_none_or(|(_, b)| u < b) {
                best = Some((j, u));
            }
        }
        Ok(best)
    }

    /// The idle slots on `k` that may move: the session runs no turn, has turns left, and
    /// waits (if at all) in `k`'s queue for this branch. Least recently used first.
    fn candidates(&self, k: usize) -> Vec<(usize, usize)> {
        // A live instance keeps what it was just handed (no session bounces); a drained one
        // hands everything on.
        let again = !self.inst[k].live;
        let mut c: Vec<(u64, usize, usize)> = Vec::new();
        for (i, s) in self.open.iter().enumerate() {
            if s.turn.is_some() || s.turns_left == 0 {
                continue;
            }
            let queued_here = self.inst[k].queue.contains(&s.id);
            for (b, br) in s.branches.iter().enumerate() {
                let waits_here = match &s.pending {
                    None => true,
                    Some(p) => p.branch == b && queued_here,
                };
                if br.has_slot && br.inst == k && !br.moving && (again || !br.migrated) && waits_here {
                    c.push((br.idle_since, i, b));
                }
            }
        }
        c.sort_unstable();
        c.into_iter().map(|(_, i, b)| (i, b)).collect()
    }

    /// The threshold trigger on live instance `k`.
    fn unload(&mut self, k: usize) -> Result<(), Fault> {
        let st = self.inst[k].cache.stats().map_err(|s| unexpected("skv_cache_stats", s))?;
        let limit = self.cfg.args.migrate_threshold * (st.total_pages - 1) as f64;
        for (i, b) in self.candidates(k) {
            let used = self.used_pages(k)? - self.leaving(k);
            if (used as f64) < limit {
                break;
            }
            let Some((dst, dst_used)) = self.least_used(k)? else { break };
            let (pages, freed) = self.move_pages(i, b);
            if dst_used + pages >= used.saturating_sub(freed) {
                break; // no instance would end up holding fewer pages than this one
            }
            self.start_move(i, b, k, dst, false)?;
        }
        Ok(())
    }

    /// The drain trigger: every idle slot of drained instance `k`; its shared prompt goes back
    /// once it holds none.
    fn move_all_off(&mut self, k: usize) -> Result<(), Fault> {
        for (i, b) in self.candidates(k) {
            let Some((dst, _)) = self.least_used(k)? else { break };
            self.start_move(i, b, k, dst, true)?;
        }
        let holds = self.open.iter().any(|s| s.branches.iter().any(|br| br.has_slot && br.inst == k));
        if !holds && !self.inst[k].shared.is_empty() {
            self.cur = k;
            self.free_shared()?;
        }
        Ok(())
    }

    /// Pages a move carries of branch `b`'s slot (all of it, from position 0), and those it
    /// frees at the source (the protected prefix stays in the source's tree).
    fn move_pages(&self, i: usize, b: usize) -> (u64, u64) {
        let (br, ps) = (&self.open[i].branches[b], self.cfg.args.page_size);
        let all = br.kv_len.div_ceil(ps) as u64;
        (all, all - (br.protected / ps) as u64)
    }

    /// Exports branch `b`'s slot on `src` as a move and imports it on `dst` (publishing it
    /// there); the copy is then in flight. Ok(false): `dst` refused it for lack of room, and
    /// the session serves on `src` again.
    fn start_move(&mut self, i: usize, b: usize, src: usize, dst: usize, drain: bool) -> Result<bool, Fault> {
        let (sid, bid) = (self.open[i].id, self.open[i].branches[b].id);
        let what = format!("session {sid} branch {bid} from instance {src} to {dst}");
        let (unit, export_ticket) = self.inst[src]
            .cache
            .session_export(sid, bid, SKV_EXPORT_MOVE)
            .map_err(|s| unexpected(&format!("skv_session_export({what}, SKV_EXPORT_MOVE)"), s))?;
        let (committed, protected) = (unit_u32(&unit, UNIT_COMMITTED), unit_u32(&unit, UNIT_PROTECTED));
        let (n_full, n) = (unit_u32(&unit, UNIT_N_FULL), (unit_u32(&unit, UNIT_N_FULL) + unit_u32(&unit, UNIT_N_SWA)));
        let epoch = unit_u32(&unit, UNIT_EPOCH);
        let br = &self.open[i].branches[b];
        let (all, freed) = self.move_pages(i, b);
        // The whole session travels: its prefix as its own pages, nothing protected.
        if committed != br.kv_len || protected != 0 || n_full as u64 != all || epoch == 0 {
            return Err(format!(
                "skv_session_export({what}, SKV_EXPORT_MOVE): a unit of {committed} committed tokens in {n_full} pages, \
                 {protected} protected, epoch {epoch}; the slot holds {} tokens in {all} pages",
                br.kv_len
            ));
        }
        let (old, saved) = (br.handles, (br.kv_len - br.protected) as u64);
        let tokens: Vec<i32> = self.conversation(i, b, committed).iter().map(|&t| t as i32).collect();
        let h = &self.inst[dst].cache.hooks.handles;
        let handles = old.map(|x| if x == -1 { -1 } else { h.alloc() });
        let spec = skv_import {
            struct_size: size_of::<skv_import>() as u32,
            flags: 0,
            session_id: sid,
            branch_id: bid,
            row: -1,
            n_prefix: 0,
            prefix_indices: std::ptr::null(),
            lock_node: 0,
            lock_receipt: 0,
            aux_state: handles[0],
            aux_track: [handles[1], handles[2]],
            tokens: tokens.as_ptr(),
            n_tokens: tokens.len() as u64,
        };
        let attempt = Attempt { src, dst, export_ticket, unit: unit.clone(), handles };
        let import_ticket = match self.inst[dst].cache.session_import(&spec, &unit, n as usize) {
            Ok((pages, t)) if pages.len() == n as usize => t,
            Ok((pages, _)) => {
                return Err(format!("skv_session_import({what}): {} page ids for a unit of {n}", pages.len()))
            }
            Err(SKV_ERR_OUT_OF_MEMORY) => return self.refused(i, b, attempt, &what),
            Err(s) => return Err(unexpected(&format!("skv_session_import({what})"), s)),
        };
        self.slots_created += 1;
        let slot_seq = self.slots_created;
        self.cur = dst;
        self.note_peak()?;
        // Stored there before the source can remove anything.
        self.see_moved(i, b, dst)?;
        // Its waiting turn leaves the source's queue: it is routed again once the move commits.
        let s = &mut self.open[i];
        if let Some(p) = s.pending.take_if(|p| p.branch == b) {
            let q = &mut self.inst[src];
            q.queue.retain(|&x| x != sid);
            q.prefill_tokens -= p.prefill_tokens;
            q.decode_blocks -= p.decode_blocks;
            s.replay = Some((p.branch, p.plan));
        }
        s.branches[b].moving = true;
        let a = &self.cfg.args;
        let bytes = n as f64 * a.page_size as f64 * a.kv_bytes_per_token as f64;
        let now = self.clock.now;
        let f = self.fleet.as_mut().expect("a multi-instance run");
        f.moves.link_free.resize(self.inst.len(), 0.0);
        let finish = f.moves.link_free[src].max(now) + bytes / (a.link_gbps * 1e9);
        f.moves.link_free[src] = finish;
        f.moves.open.push(Move {
            sid,
            bid,
            src,
            dst,
            export_ticket,
            import_ticket,
            finish,
            handles,
            slot_seq,
            pages: n as u64,
            freed,
            tokens: committed as u64,
            saved,
            drain,
        });
        Ok(true)
    }

    /// The destination refused the import: its handles go back to its pool; it never
    /// committed the epoch (skv_session_fence says so and fences it there), so the source's
    /// ticket fails and the session serves there again.
    fn refused(&mut self, i: usize, b: usize, a: Attempt, what: &str) -> Result<bool, Fault> {
        let Attempt { src, dst, export_ticket, unit, handles } = a;
        let epoch = unit_u32(&unit, UNIT_EPOCH);
        let h = &self.inst[dst].cache.hooks.handles;
        if !real(handles).all(|x| h.engine_free(x)) {
            return Err(format!("skv_session_import({what}): refused, yet took its handles"));
        }
        let state = self.inst[dst]
            .cache
            .session_fence(&unit)
            .map_err(|s| unexpected(&format!("skv_session_fence({what}, epoch {epoch})"), s))?;
        if state != SKV_FENCE_ABSENT {
            return Err(format!("skv_session_fence({what}, epoch {epoch}): {state} after a refused import"));
        }
        let s = self.inst[src].cache.ticket_done(export_ticket, true);
        expect_ok(&format!("skv_ticket_done(export of {what}, failed)"), s)?;
        self.check_stayed(i, b, src, dst, what)?;
        self.m.migrate.refused += 1;
        Ok(false)
    }

    /// After a refused import: the slot is still on `src`, whole and idle, and `dst` has none.
    fn check_stayed(&self, i: usize, b: usize, src: usize, dst: usize, what: &str) -> Result<(), Fault> {
        let (sid, br) = (self.open[i].id, &self.open[i].branches[b]);
        let at =
            |k: usize| self.inst[k].cache.session_where(sid, br.id).map_err(|s| unexpected("skv_session_where", s));
        let (w_src, w_dst) = (at(src)?, at(dst)?);
        if w_src.place != skv::SKV_PLACE_DEVICE
            || w_src.state != 0
            || w_src.tokens != br.kv_len
            || w_dst.place != skv::SKV_PLACE_NONE
        {
            return Err(format!(
                "refused move of {what}: the source holds place {} state {:#x} of {} tokens (the slot's {}), the destination place {}",
                w_src.place, w_src.state, w_src.tokens, br.kv_len, w_dst.place
            ));
        }
        Ok(())
    }

    /// Commits the moves whose copy finished by the current step's start.
    fn commit_due(&mut self) -> Result<(), Fault> {
        let now = self.clock.now;
        let f = self.fleet.as_mut().expect("a multi-instance run");
        let (due, open) = std::mem::take(&mut f.moves.open).into_iter().partition(|m| m.finish <= now);
        f.moves.open = open;
        for m in due {
            self.commit_move(m)?;
        }
        Ok(())
    }

    /// The destination's commit, then the source's completion, which releases the session
    /// there; the mirror follows the branch to its new instance.
    fn commit_move(&mut self, m: Move) -> Result<(), Fault> {
        let what = format!("session {} branch {} from instance {} to {}", m.sid, m.bid, m.src, m.dst);
        let i = self.open.iter().position(|s| s.id == m.sid).expect("a moving session stays open");
        let b = m.bid as usize;
        let s = self.inst[m.dst].cache.ticket_done(m.import_ticket, false);
        expect_ok(&format!("skv_ticket_done(import of {what})"), s)?;
        self.cur = m.src;
        let before = self.free_pages()?;
        let s = self.inst[m.src].cache.ticket_done(m.export_ticket, false);
        let done = format!("skv_ticket_done(export of {what})");
        expect_ok(&done, s)?;
        self.expect_handed_back(&done, real(self.open[i].branches[b].handles))?;
        let freed = self.free_pages()? - before;
        let w = self.inst[m.src].cache.session_where(m.sid, m.bid).map_err(|s| unexpected("skv_session_where", s))?;
        if w.place != SKV_PLACE_NONE || freed != m.freed {
            return Err(format!("{done}: the source kept place {} and freed {freed} pages (of {})", w.place, m.freed));
        }
        self.m.freed_release += freed;
        self.see_moved(i, b, m.dst)?;
        let br = &mut self.open[i].branches[b];
        br.inst = m.dst;
        br.handles = m.handles;
        br.protected = 0;
        br.slot_seq = m.slot_seq;
        // Just arrived for its next turn: the destination's least recently used it is not.
        br.idle_since = self.tick;
        (br.moving, br.migrated) = (false, true);
        let f = self.fleet.as_mut().expect("a multi-instance run");
        if f.policy == Policy::Session {
            f.pinned.insert(m.sid, m.dst);
        }
        let a = &self.cfg.args;
        let bytes = m.pages * a.page_size as u64 * a.kv_bytes_per_token;
        let mm = &mut self.m.migrate;
        mm.migrations += 1;
        mm.drain_migrations += m.drain as u64;
        mm.pages += m.pages;
        mm.bytes += bytes;
        mm.tokens += m.tokens;
        mm.saved_tokens += m.saved;
        mm.transfer_s += bytes as f64 / (a.link_gbps * 1e9);
        mm.recompute_s += m.saved as f64 / a.prefill_tokens_per_s;
        Ok(())
    }

    /// The router, fed every batch so far, must see branch `b` on `dst` (the import stored
    /// its full pages there): no moment with zero copies of a moved session.
    fn see_moved(&mut self, i: usize, b: usize, dst: usize) -> Result<(), Fault> {
        self.pump()?;
        let (ps, kv_len) = (self.cfg.args.page_size, self.open[i].branches[b].kv_len);
        if kv_len < ps {
            return Ok(());
        }
        let conv = self.conversation(i, b, kv_len);
        let sid = self.open[i].id;
        let f = self.fleet.as_ref().expect("a multi-instance run");
        let got = f.router.overlaps(&conv, &crate::router::salt(sid), self.inst.len())[dst];
        if got < kv_len / ps {
            return Err(format!(
                "the router sees {got} of the {} pages of session {sid} branch {b} on instance {dst}, where it moves",
                kv_len / ps
            ));
        }
        self.m.migrate.event_checks += 1;
        Ok(())
    }

    /// Where branch `bid` of session `sid` is moving to, while it is.
    pub(super) fn moving_to(&self, sid: u64, bid: u64) -> Option<usize> {
        let f = self.fleet.as_ref()?;
        f.moves.open.iter().find(|m| m.sid == sid && m.bid == bid).map(|m| m.dst)
    }

    /// A moved branch's next turn: did it hit where the branch moved to?
    pub(super) fn note_moved_turn(&mut self, i: usize, b: usize, hit: bool) {
        let br = &mut self.open[i].branches[b];
        if br.migrated {
            br.migrated = false;
            self.m.migrate.next_turns += 1;
            self.m.migrate.next_hits += hit as u64;
        }
    }
}
