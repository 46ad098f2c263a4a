//! Export and import of an idle session slot as a unit (`unit`: the byte form). An export
//! writes the unit and opens a ticket pinning the slot's row while the engine copies the pages
//! out; an import records a slot (owned mode: on a new row and new pages) whose KV arrives
//! under its ticket. The protected prefix and its tree lock never move: they stay with the
//! engine's tree on each side.

use super::cache::{Backend, Cache};
use super::error::{bail, Result};
use super::owned_ops::{check_held, prefix_pages};
use super::page::{floor_align, pages_for};
use super::req::Req;
use super::slots::{Place, Slot};
use super::tickets::Kind;
use super::transfer;
use super::unit::{
    read_unit, write_ids, Destination, Fingerprint, UnitHeader, UNIT_FLAG_ENGINE_SWA, UNIT_FLAG_HOST_PAGES,
    UNIT_FLAG_MOVE, UNIT_HEADER_LEN, UNIT_POOL_FULL, UNIT_POOL_SWA,
};

/// What an import needs besides the unit: the destination's key, row and handles.
#[derive(Debug, Clone, Copy)]
pub struct ImportSpec<'a> {
    pub session: u64,
    pub branch: u64,
    /// External mode: the engine's row, already mapping `[0, allocated)`; owned mode: -1.
    pub row: i32,
    /// Owned mode: the token indices of the destination tree's prefix (`protected` of them,
    /// engine-held pages, the rules of `map_prefix`); empty when the unit protects nothing,
    /// and always in external mode (the engine's row maps it).
    pub prefix: &'a [i32],
    pub lock_node: u64,
    pub lock_receipt: u64,
    /// The destination's recurrent-state handles: not -1 exactly where the unit's `aux_mask`
    /// says the source held one.
    pub aux_state: i64,
    pub aux_track: [i64; 2],
}

/// Where an export's page ids are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// The device pools (owned mode's rows, or the engine's).
    Device,
    /// The host tier's copy of a parked slot.
    Host,
}

impl Cache {
    /// This cache's unit fingerprint: what an imported unit must carry.
    pub(crate) fn unit_fingerprint(&self) -> Fingerprint {
        let swa = match &self.pool {
            Backend::Owned(p) => p.swa.is_some(),
            Backend::Engine(p) => p.frees_swa().is_ok(),
        };
        Fingerprint {
            page_size: self.cfg.page_size,
            pools: UNIT_POOL_FULL | if swa { UNIT_POOL_SWA } else { 0 },
            swa_window: self.cfg.tier.swa_window,
            kv_layout_id: self.cfg.tier.kv_layout_id,
        }
    }

    /// The header of a unit this cache could import, checked as `read_unit` checks it.
    fn read_own_unit(&self, unit: &[u8]) -> Result<UnitHeader> {
        let dest = Destination { fingerprint: self.unit_fingerprint(), max_context_len: self.cfg.max_context_len };
        Ok(read_unit(unit, &dest)?.header)
    }

    /// The bytes `export` would write for the slot, or why it would refuse.
    pub fn export_len(&self, session: u64, branch: u64, moving: bool) -> Result<usize> {
        Ok(self.export_plan(session, branch, moving)?.2.unit_len())
    }

    /// `skv_session_export`: writes the unit of an idle slot into `buf` and opens an export
    /// ticket pinning the slot's row (a release meanwhile drains in owned mode and is refused in
    /// external mode); returns the unit's length and the ticket. The engine copies the pages
    /// the unit names, then completes the ticket. A move (`moving`, docs/transfer.md) writes
    /// the whole session under a new epoch; its release is refused while the ticket is open,
    /// and its completion releases the session (success) or lets it serve again (failure).
    pub fn export(&mut self, session: u64, branch: u64, moving: bool, buf: &mut [u8]) -> Result<(usize, u64)> {
        let (row, s, mut h, source) = self.export_plan(session, branch, moving)?;
        let len = h.unit_len();
        if buf.len() < len {
            bail!(
                Buffer,
                "the unit of session {session} branch {branch} needs {len} bytes; the buffer holds {}",
                buf.len()
            );
        }
        let ps = self.cfg.page_size;
        let first = if moving { 0 } else { pages_for(s.protected, ps) as usize };
        let last = pages_for(s.allocated, ps) as usize;
        let body = &mut buf[UNIT_HEADER_LEN..len];
        match (&mut self.pool, source) {
            (_, Source::Host) => {
                let c = &self.tier.as_deref().expect("a parked slot's tier").copies[row as usize];
                let n = write_ids(body, c.full.iter().copied());
                write_ids(&mut body[n..], c.swa.iter().copied().filter(|&p| p != 0));
            }
            (Backend::Owned(p), Source::Device) => {
                let n = write_ids(body, p.in_use(row).expect("a slot's row").pages[first..last].iter().copied());
                if let Some(sw) = p.swa.as_ref() {
                    let ids = &sw.rows[row as usize].ids[first..last];
                    match moving {
                        // The pages the move's window holds (checked present by its plan).
                        true => write_ids(
                            &mut body[n..],
                            ids.iter().zip(h.swa_live(ps)).filter(|&(_, l)| l).map(|(&p, _)| p),
                        ),
                        false => write_ids(&mut body[n..], ids.iter().copied().filter(|&p| p != 0)),
                    };
                }
            }
            (Backend::Engine(p), Source::Device) => {
                let from = if moving { 0 } else { s.protected };
                read_engine_pages(&mut **p, row, from, s.allocated, ps, body)?
            }
        }
        if moving && h.origin == 0 {
            // The first move of a session born here: a new incarnation.
            h.origin = self.origin_seed.draw();
        }
        h.write(buf);
        let t = self.tickets.open(if moving { Kind::Move } else { Kind::Export }, vec![row]);
        self.pin(row, t);
        if moving {
            let f = self.fences.entry((session, branch, h.origin)).or_default();
            *f = transfer::exported(*f, h.epoch);
            self.origins.insert(row, h.origin);
        }
        if source == Source::Host {
            // A release meanwhile drains the host pages to the ticket.
            self.tier.as_deref_mut().expect("tier").copies[row as usize].ticket = t;
        }
        Ok((len, t))
    }

    /// The slot an export writes, its header and where its ids are; refuses what cannot move.
    fn export_plan(&self, session: u64, branch: u64, moving: bool) -> Result<(u32, Slot, UnitHeader, Source)> {
        let Some((row, s)) = self.slots.find(session, branch).map(|(r, s)| (r, *s)) else {
            bail!(NotFound, "session {session} branch {branch} has no slot to export");
        };
        if s.in_flight {
            bail!(State, "session {session} branch {branch} is in flight: finish or hand back its request first");
        }
        let t = self.ticket_of(row);
        if t != 0 {
            bail!(State, "session {session} branch {branch} is being copied (ticket {t}): complete it first");
        }
        let ps = self.cfg.page_size;
        let (first, last) = (pages_for(s.protected, ps) as usize, pages_for(s.allocated, ps) as usize);
        let fingerprint = self.unit_fingerprint();
        if moving {
            return self.move_plan(row, &s, fingerprint);
        }
        let (source, flags, n_full, n_swa) = match (s.place, &self.pool) {
            (Place::Parked, _) => {
                let c = self.tier.as_deref().map(|t| &t.copies[row as usize]).filter(|c| c.clean && c.ticket == 0);
                let Some(c) = c else {
                    bail!(State, "session {session} branch {branch} is parked without a complete host copy");
                };
                (Source::Host, UNIT_FLAG_HOST_PAGES, c.full.len(), c.swa.iter().filter(|&&p| p != 0).count())
            }
            (Place::Failed, _) => {
                bail!(State, "session {session} branch {branch}'s KV never arrived (a failed restore)")
            }
            (Place::Device, Backend::Owned(p)) => {
                let mapped = p.in_use(row).map_or(0, |r| r.pages.len());
                let swa = p.swa.as_ref().map(|sw| &sw.rows[row as usize].ids);
                if mapped < last || swa.is_some_and(|ids| ids.len() < last) {
                    bail!(Internal, "row {row} maps {mapped} pages, fewer than the {last} its idle slot records");
                }
                let n_swa = swa.map_or(0, |ids| ids[first..last].iter().filter(|&&p| p != 0).count());
                (Source::Device, 0, last - first, n_swa)
            }
            // The engine's rows name its SWA slots, libskv does not: its copy carries that side.
            (Place::Device, Backend::Engine(_)) => {
                let flags = if fingerprint.pools & UNIT_POOL_SWA != 0 { UNIT_FLAG_ENGINE_SWA } else { 0 };
                (Source::Device, flags, last - first, 0)
            }
        };
        if n_full != last - first {
            bail!(
                Internal,
                "the host copy of row {row} holds {n_full} pages, not the {} its slot records",
                last - first
            );
        }
        let h = UnitHeader {
            flags,
            fingerprint,
            session,
            branch,
            committed: s.committed,
            allocated: s.allocated,
            protected: s.protected,
            swa_cursor: s.swa,
            swa_floor: s.swa_floor,
            aux_mask: s.aux_mask(),
            n_full: n_full as u32,
            n_swa: n_swa as u32,
            epoch: 0,
            origin: 0,
        };
        Ok((row, s, h, source))
    }

    /// A move's plan: the whole session from position 0 under the next epoch; the window keeps
    /// its cursor (floored to a page) and no floor, as nothing is protected at the destination.
    fn move_plan(&self, row: u32, s: &Slot, fingerprint: Fingerprint) -> Result<(u32, Slot, UnitHeader, Source)> {
        let (session, branch, ps) = (s.session, s.branch, self.cfg.page_size);
        if s.place != Place::Device {
            bail!(
                State,
                "session {session} branch {branch} is not on the device ({:?}): a move reads device pages; restore \
                 it first (skv_match_prefix_tier)",
                s.place
            );
        }
        // The session's incarnation: its own if it moved before (0: `export` draws one).
        let origin = self.origins.get(&row).copied().unwrap_or(0);
        let f = self.fences.get(&(session, branch, origin)).copied().unwrap_or_default();
        let Some(epoch) = transfer::next_epoch(f, s.epoch) else {
            bail!(State, "session {session} branch {branch} has used every move epoch");
        };
        let swa = fingerprint.pools & UNIT_POOL_SWA != 0;
        let mut h = UnitHeader {
            flags: UNIT_FLAG_MOVE,
            fingerprint,
            session,
            branch,
            committed: s.committed,
            allocated: s.allocated,
            protected: 0,
            swa_cursor: if swa { floor_align(s.swa, ps) } else { s.swa },
            swa_floor: 0,
            aux_mask: s.aux_mask(),
            n_full: pages_for(s.allocated, ps),
            n_swa: 0,
            epoch,
            origin,
        };
        match &self.pool {
            Backend::Owned(p) => {
                let mapped = p.in_use(row).map_or(0, |r| r.pages.len());
                if mapped < h.n_full as usize {
                    bail!(Internal, "row {row} maps {mapped} pages, fewer than the {} its idle slot records", h.n_full);
                }
                if let Some(sw) = p.swa.as_ref() {
                    let ids = &sw.rows[row as usize].ids;
                    for (i, live) in h.swa_live(ps).enumerate() {
                        match (live, ids.get(i).copied().unwrap_or(0)) {
                            (false, _) => {}
                            (true, 0) => bail!(
                                State,
                                "session {session} branch {branch}: its window needs the SWA page of page {i}, which \
                                 its prefix no longer holds (a tree eviction); a move cannot carry it"
                            ),
                            (true, _) => h.n_swa += 1,
                        }
                    }
                }
            }
            Backend::Engine(_) if swa => h.flags |= UNIT_FLAG_ENGINE_SWA,
            Backend::Engine(_) => {}
        }
        Ok((row, *s, h, Source::Device))
    }

    /// `skv_session_import`: records an idle slot for `spec`'s key from `unit`, whose KV the
    /// engine then copies in under the returned ticket (a plain `match_prefix` is refused until
    /// it completes; `match_prefix_tier` hits with it; a failed completion releases the slot).
    /// Owned mode takes a row, maps `spec.prefix` as its protected prefix and takes the unit's
    /// pages, writing their ids (full, then SWA) to `out_pages`; external mode adopts
    /// `spec.row` and takes nothing. Returns the ids written and the ticket.
    pub fn import(&mut self, spec: &ImportSpec, unit: &[u8], out_pages: &mut [i32]) -> Result<(usize, u64)> {
        let h = self.read_own_unit(unit)?;
        let fence = self.admit(spec, &h)?;
        check_handles(spec, h.aux_mask)?;
        if let Some((row, _)) = self.slots.find(spec.session, spec.branch) {
            bail!(
                State,
                "session {} branch {} already has a slot (row {row}): release it before importing into it",
                spec.session,
                spec.branch
            );
        }
        let out = match self.pool {
            Backend::Owned(_) => self.import_owned(spec, &h, out_pages),
            Backend::Engine(_) => self.import_external(spec, &h),
        }?;
        if let Some(f) = fence {
            self.fences.insert((spec.session, spec.branch, h.origin), f);
        }
        Ok(out)
    }

    /// A move's unit must carry an epoch this handle has not seen for the key (`transfer`):
    /// the fence after the import, `None` for a copy's unit.
    fn admit(&self, spec: &ImportSpec, h: &UnitHeader) -> Result<Option<transfer::Fence>> {
        if h.flags & UNIT_FLAG_MOVE == 0 {
            return Ok(None);
        }
        if (spec.session, spec.branch) != (h.session, h.branch) {
            // The source asks about its unit's key: a session committed under another would be
            // ABSENT to it, and it would serve again beside the live copy.
            bail!(
                InvalidArg,
                "session {} branch {}: a move keeps its key (the unit's session {} branch {})",
                spec.session,
                spec.branch,
                h.session,
                h.branch
            );
        }
        let key = (spec.session, spec.branch, h.origin);
        let f = self.fences.get(&key).copied().unwrap_or_default();
        match transfer::admit(f, h.epoch) {
            Ok(f) => Ok(Some(f)),
            Err(seen) => bail!(
                State,
                "unit epoch {} of session {} branch {} (origin {:#x}) is fenced: this handle has seen epoch {seen} \
                 (a duplicate or late move; skv_session_fence tells whether it committed here)",
                h.epoch,
                key.0,
                key.1,
                key.2
            ),
        }
    }

    fn import_owned(&mut self, spec: &ImportSpec, h: &UnitHeader, out: &mut [i32]) -> Result<(usize, u64)> {
        let ps = self.cfg.page_size;
        if spec.row != -1 {
            bail!(InvalidArg, "row {}: owned mode takes a row of its own (pass -1)", spec.row);
        }
        if spec.prefix.len() != h.protected as usize {
            bail!(
                InvalidArg,
                "prefix of {} indices: the unit protects {} tokens, mapped from the destination's tree",
                spec.prefix.len(),
                h.protected
            );
        }
        if h.flags & UNIT_FLAG_ENGINE_SWA != 0 {
            let live = h.swa_live(ps).filter(|&l| l).count();
            bail!(
                InvalidArg,
                "unit flags {:#x}: its SWA side stayed with the engine that wrote it, but this SWA pool needs \
                 its {live} SWA pages' ids",
                h.flags
            );
        }
        let need = (h.n_full + h.n_swa) as usize;
        if out.len() < need {
            bail!(InvalidArg, "out_pages holds {} page ids; the unit needs {need}", out.len());
        }
        let pool = self.pool.owned_mut().expect("owned mode");
        let prefix = prefix_pages(pool, ps, spec.prefix)?;
        check_held(pool, &prefix)?;
        if pool.free_rows() == 0 {
            bail!(OutOfMemory, "no free row (num_rows {}) for the import", pool.total_rows());
        }
        if (pool.allocator().free_pages() as u64) < h.n_full as u64 {
            bail!(OutOfMemory, "the import needs {} pages, {} free", h.n_full, pool.allocator().free_pages());
        }
        if let Some(sw) = pool.swa.as_ref() {
            sw.check_room(h.n_swa as u64)?;
        }
        // Which new pages get an SWA page: only an SWA pool asks (no list to build without one).
        let live: Vec<bool> = match pool.swa {
            Some(_) => h.swa_live(ps).collect(),
            None => Vec::new(),
        };
        let row = pool.take_row().expect("a free row, checked");
        if !prefix.is_empty() {
            pool.map_held_prefix(row, prefix);
        }
        if let Err(e) = pool.restore_pages(row, h.n_full, &live) {
            pool.free_row(row);
            return Err(e);
        }
        // Consecutive destinations, so that the copy's runs coalesce.
        pool.ascend_from(row, pages_for(h.protected, ps) as usize);
        pool.row_mut(row).len = h.allocated;
        pool.set_cursor(row, h.swa_cursor);
        pool.mapped(row, h.protected, h.allocated);
        let first = pages_for(h.protected, ps) as usize;
        let r = pool.in_use(row).expect("taken above");
        for (o, &id) in out.iter_mut().zip(&r.pages[first..]) {
            *o = id as i32;
        }
        if let Some(sw) = pool.swa.as_ref() {
            let ids = sw.rows[row as usize].ids[first..].iter().filter(|&&p| p != 0);
            for (o, &id) in out[h.n_full as usize..need].iter_mut().zip(ids) {
                *o = id as i32;
            }
        }
        let generation = self.bump_generation(row);
        Ok((need, self.record_import(spec, h, row, generation)))
    }

    fn import_external(&mut self, spec: &ImportSpec, h: &UnitHeader) -> Result<(usize, u64)> {
        let n = self.cfg.num_rows;
        let row = match u32::try_from(spec.row) {
            Ok(r) if r < n => r,
            _ => bail!(InvalidArg, "row {}: external mode imports into the engine's row, in [0, {n})", spec.row),
        };
        if !spec.prefix.is_empty() {
            bail!(
                InvalidArg,
                "prefix of {} indices: in external mode the engine's row maps the prefix (pass none)",
                spec.prefix.len()
            );
        }
        if let Some(s) = self.slots.of_row(row) {
            bail!(State, "row {row} already belongs to session {} branch {}", s.session, s.branch);
        }
        if let Some(t) = self.engine_pins.ticket_of(row) {
            bail!(State, "row {row}'s pages are being copied under ticket {t}: complete it first");
        }
        if let Backend::Engine(p) = &self.pool {
            // The cursor the slot records must be one the engine's frees can split at.
            p.check_cursor(&Req {
                req_pool_idx: row as i32,
                kv_committed_len: h.committed,
                kv_allocated_len: h.allocated,
                cache_protected_len: h.protected,
                swa_evicted_seqlen: h.swa_cursor,
                swa_evict_floor: h.swa_floor,
                ..Req::default()
            })?;
        }
        let generation = self.generation(row);
        Ok((0, self.record_import(spec, h, row, generation)))
    }

    /// Records an imported idle slot on `row`, under a new import ticket pinning the row.
    fn record_import(&mut self, spec: &ImportSpec, h: &UnitHeader, row: u32, generation: u32) -> u64 {
        let t = self.tickets.open(Kind::Import, vec![row]);
        self.turns_finished += 1;
        let slot = Slot {
            session: spec.session,
            branch: spec.branch,
            generation,
            committed: h.committed,
            allocated: h.allocated,
            protected: h.protected,
            swa: h.swa_cursor,
            swa_floor: h.swa_floor,
            lock_node: spec.lock_node,
            lock_receipt: spec.lock_receipt,
            aux: spec.aux_state,
            track: spec.aux_track,
            in_flight: false,
            finished_at: self.turns_finished,
            epoch: h.epoch,
            place: Place::Device,
        };
        self.slots.insert(row, slot);
        if h.origin != 0 {
            // A move's: the incarnation the slot carries on (only moves have one).
            self.origins.insert(row, h.origin);
        }
        self.sync_idle(row);
        self.tier_finished(row, self.turns_finished);
        self.pin(row, t);
        t
    }

    /// An import's completion on `rows`: a move's commits (or not) in the key's fence.
    pub(crate) fn import_done(&mut self, rows: &[u32], ok: bool) {
        for &row in rows {
            let s = self.slots.of_row(row).expect("an import's slot");
            if let (true, Some(&origin)) = (s.epoch > 0, self.origins.get(&row)) {
                let f = self.fences.entry((s.session, s.branch, origin)).or_default();
                *f = transfer::import_done(*f, s.epoch, ok).1;
            }
        }
    }

    /// `skv_session_fence`: whether the move `unit` describes committed here; fences its
    /// epoch when it did not (`transfer::ask`).
    pub fn fence(&mut self, unit: &[u8]) -> Result<transfer::Answer> {
        let h = self.read_own_unit(unit)?;
        if h.flags & UNIT_FLAG_MOVE == 0 {
            bail!(InvalidArg, "unit flags {:#x}: a copy's unit, not a move's (no epoch to ask about)", h.flags);
        }
        let key = (h.session, h.branch, h.origin);
        let pending = self.slots.find(h.session, h.branch).is_some_and(|(row, s)| {
            s.epoch == h.epoch && self.origins.get(&row) == Some(&h.origin) && self.copy_kind(row) == Some(Kind::Import)
        });
        let f = self.fences.entry(key).or_default();
        let answer;
        (answer, *f) = transfer::ask(*f, h.epoch, pending);
        Ok(answer)
    }

    /// Whether a move still reads `row`'s pages (its open ticket is a move export's).
    pub(crate) fn moving(&self, row: u32) -> bool {
        self.copy_kind(row) == Some(Kind::Move)
    }

    /// Refuses the release of a slot a move still reads: the transfer may touch its pages (its
    /// prefix's too) until the ticket ends, and a failed move leaves the session here. An
    /// unpinned row (every release's case but a copy's) costs one load.
    #[inline]
    pub(crate) fn refuse_moving(&self, row: u32, s: &Slot) -> Result<()> {
        match self.ticket_of(row) {
            0 => Ok(()),
            t => self.refuse_moving_ticket(row, t, s),
        }
    }

    #[cold]
    fn refuse_moving_ticket(&self, row: u32, t: u64, s: &Slot) -> Result<()> {
        if self.moving(row) {
            bail!(
                State,
                "session {} branch {} is moving to another instance (ticket {t}): complete the ticket (success \
                 releases it)",
                s.session,
                s.branch
            );
        }
        Ok(())
    }

    /// Refuses a match (not a pre-aborted one, which changes nothing) of a slot an export is
    /// still reading: the request would rewrite its pages under the copy.
    pub(crate) fn refuse_exporting(&self, session: u64, branch: u64, row: u32, pre_aborted: bool) -> Result<()> {
        let t = self.ticket_of(row);
        if !pre_aborted && t != 0 && self.tickets.get(t).is_some_and(|p| matches!(p.kind, Kind::Export | Kind::Move)) {
            bail!(
                State,
                "session {session} branch {branch} is being exported (ticket {t}): complete the ticket before \
                 matching it"
            );
        }
        Ok(())
    }
}

/// The import's handles must be non -1 exactly where the unit's `aux_mask` says, and distinct.
fn check_handles(spec: &ImportSpec, mask: u32) -> Result<()> {
    let names = ["aux_state", "aux_track[0]", "aux_track[1]"];
    let handles = [spec.aux_state, spec.aux_track[0], spec.aux_track[1]];
    for (i, (name, h)) in names.iter().zip(handles).enumerate() {
        let held = mask & (1 << i) != 0;
        if (h != -1) != held {
            let want = if held { "a handle" } else { "-1" };
            bail!(InvalidArg, "{name} {h}: the unit's aux_mask {mask:#x} asks for {want} there");
        }
    }
    Req { aux_state: spec.aux_state, aux_track: spec.aux_track, ..Req::default() }.check_aux_handles()
}

/// An engine row's page ids for positions `[protected, allocated)`: the token slot at each
/// page's first position, over the page size. Read whole, checked, then written, so a refusal
/// leaves `out` as it was.
fn read_engine_pages(
    pool: &mut dyn super::pool::Pool,
    row: u32,
    protected: u32,
    allocated: u32,
    ps: u32,
    out: &mut [u8],
) -> Result<()> {
    if protected >= allocated {
        return Ok(());
    }
    let n = (allocated - protected) as usize;
    let mut tokens = Vec::new();
    if tokens.try_reserve_exact(n).is_err() {
        bail!(OutOfMemory, "no host memory to read row {row}'s {n} indices");
    }
    tokens.resize(n, -1);
    pool.read_row(row, protected, allocated, &mut tokens)?;
    let starts = tokens.iter().step_by(ps as usize);
    if let Some((i, &v)) = starts.clone().enumerate().find(|&(_, &v)| v < ps as i32 || !(v as u32).is_multiple_of(ps)) {
        bail!(
            State,
            "row {row}'s req_to_token[{}] = {v} is not the first slot of a page past page 0 (page_size {ps})",
            protected as usize + i * ps as usize
        );
    }
    write_ids(out, starts.map(|&v| v as u32 / ps));
    Ok(())
}
