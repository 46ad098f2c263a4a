//! A cache: one KV pool (the engine's or libskv's own), the session slots kept over it,
//! and the counters the stats report.

use super::error::{bail, Error, Result};
use super::owned::OwnedPool;
use super::page::ceil_align;
use super::pins::Pins;
use super::pool::{Effect, Pool};
use super::req::{swa_dead, Config, Req};
use super::row_meta::{BatchMarks, RowMeta};
use super::slots::{Slot, Slots};
use super::tickets::Tickets;
use super::tier::Tier;

pub struct Cache {
    pub(crate) cfg: Config,
    pub(crate) slots: Slots,
    pub(crate) pool: Backend,
    /// The effects of the call in progress (kept to reuse its allocation).
    pub(crate) effects: Vec<Effect>,
    /// What the cache knows of each row beyond the pool, indexed by row: engine mode's. Owned
    /// mode keeps each row's beside its mapping (`OwnedPool::rows`), so that a request's checks
    /// read one cache line; this is then empty. `meta` finds a row's, either way.
    engine_meta: Vec<RowMeta>,
    /// Which rows the batch call in progress has named (the marks are in the rows' `RowMeta`).
    pub(crate) batch_marks: BatchMarks,
    /// A free callback that failed part-way through the last call (see `take_deferred`).
    deferred: Option<Error>,
    /// Tokens released by `trim_overshoot` since creation.
    pub trimmed_tokens: u64,
    /// Tokens released by `free_tail` since creation.
    pub tail_freed_tokens: u64,
    /// Finishes (not aborted) whose target `origin_input_len + finished_len` lay more than one
    /// token past `kv_committed_len`: the last sampled token has no KV yet, so a finish never
    /// has a reason to claim more (docs/conventions.md, "Finishes past committed").
    pub finishes_past_committed: u64,
    /// Turns saved into slots since creation: each saved turn's `Slot::finished_at`.
    pub(crate) turns_finished: u64,
    /// The open tickets (both modes).
    pub(crate) tickets: Tickets,
    /// External mode's pinned rows (owned mode's are the pool's, `OwnedPool::pins`).
    pub(crate) engine_pins: Pins,
    /// The host tier, when the config sizes one (owned mode).
    pub(crate) tier: Option<Box<Tier>>,
    /// What the host tier's call in progress did to which sessions (for KV events; the call's
    /// export clears it first).
    pub moves: Vec<(u64, u64, Move)>,
    /// What this handle knows of each moved session's epochs (`transfer`), by key and
    /// incarnation: one entry per session it ever exported with `SKV_EXPORT_MOVE`, imported
    /// from a move, or was asked about.
    pub(crate) fences: std::collections::HashMap<super::transfer::Incarnation, super::transfer::Fence>,
    /// The incarnation of the slot on each row that has one: a slot that arrived by a move, or
    /// one born here that a move exported (`transfer`). Empty until the first move.
    pub(crate) origins: std::collections::HashMap<u32, u64>,
    /// Draws the incarnations this handle's first moves of a session start.
    pub(crate) origin_seed: super::transfer::Origins,
}

/// A session's KV changed place (`Cache::moves`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Move {
    /// Parked: its pages past its `protected` tokens are in the host tier only.
    Parked { protected: u32 },
    /// Back on the device (a match restored it).
    Restored,
    /// Released whole.
    Released,
}

impl Cache {
    /// A cache over `pool`; `cfg` must already be valid for the pool's mode.
    pub fn new(cfg: Config, pool: Backend) -> Result<Self> {
        // External rows exist before libskv sees them: they start at generation 1. (Owned
        // rows start at 0, and `alloc_row` moves them on.)
        let engine_rows = if pool.owned().is_some() { 0 } else { cfg.num_rows as usize };
        Ok(Cache {
            cfg,
            slots: Slots::new(cfg.num_rows)?,
            engine_meta: super::error::try_vec(engine_rows, "row generations", |_| RowMeta {
                generation: 1,
                ..RowMeta::default()
            })?,
            pool,
            effects: Vec::with_capacity(8),
            batch_marks: BatchMarks::default(),
            deferred: None,
            trimmed_tokens: 0,
            tail_freed_tokens: 0,
            finishes_past_committed: 0,
            turns_finished: 0,
            tickets: Tickets::default(),
            engine_pins: Pins::default(),
            moves: Vec::new(),
            fences: std::collections::HashMap::new(),
            origins: std::collections::HashMap::new(),
            origin_seed: super::transfer::Origins::default(),
            tier: match cfg.tier.host_num_token_slots {
                0 => None,
                _ => Some(Box::new(Tier::new(cfg.tier, cfg.page_size, cfg.num_rows)?)),
            },
        })
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    pub fn slots(&self) -> &Slots {
        &self.slots
    }

    pub fn pool(&self) -> &dyn Pool {
        self.pool.get()
    }

    /// Runs the planned effects: everything that can fail first, then `mutate` (libskv's own
    /// state), then the frees. A free callback failing part-way cannot be undone: the call
    /// completes as if it had succeeded (so nothing is ever handed back twice) and the
    /// failure waits in `take_deferred`.
    pub(crate) fn run_effects(&mut self, mutate: impl FnOnce(&mut Self)) -> Result<()> {
        self.deferred = None;
        if !self.engine_pins.is_empty() {
            self.refuse_pinned()?;
        }
        self.pool.prepare(&self.effects)?;
        mutate(self);
        if self.pool.owned().is_none() {
            for e in &self.effects {
                if let Effect::FreeRow { row } = *e {
                    next_generation(&mut self.engine_meta[row as usize].generation);
                }
            }
        }
        if let Err(e) = self.pool.apply(&self.effects) {
            self.deferred = Some(e);
        }
        Ok(())
    }

    /// External mode frees through the engine's callbacks, straight onto its free lists: a
    /// free of a row an open ticket copies is refused until the ticket completes.
    #[cold]
    fn refuse_pinned(&self) -> Result<()> {
        match self.engine_pins.first_pinned(&self.effects) {
            Some((row, t)) => bail!(
                State,
                "row {row}'s pages are being copied under ticket {t}: complete it (skv_ticket_done) before \
                 freeing them"
            ),
            None => Ok(()),
        }
    }

    /// The callback failure of the last call, after its outputs were written as for a
    /// success.
    #[inline]
    pub fn take_deferred(&mut self) -> Result<()> {
        self.deferred.take().map_or(Ok(()), Err)
    }

    /// A row an idle session slot holds belongs to the session: engine calls that would
    /// reshape it behind the session's back are refused (while the slot is in flight, its
    /// running request works on the row as usual).
    #[inline]
    pub(crate) fn guard_idle_session_row(&self, row: u32) -> Result<()> {
        match self.meta(row) {
            Some(m) if m.idle_slot => self.idle_session_row(row),
            _ => Ok(()),
        }
    }

    #[cold]
    #[inline(never)]
    fn idle_session_row(&self, row: u32) -> Result<()> {
        let s = self.slots.of_row(row).expect("the idle flag follows the slot");
        bail!(State, "row {row} belongs to the idle slot of session {} branch {}", s.session, s.branch)
    }

    /// Brings the row's `idle_slot` flag in step with its slot: called wherever a slot is
    /// created, dropped, or starts or ends a turn.
    pub(crate) fn sync_idle(&mut self, row: u32) {
        self.meta_mut(row).idle_slot = self.slots.of_row(row).is_some_and(|s| !s.in_flight);
    }

    /// The row's generation (see `RowMeta::generation`).
    #[inline]
    pub(crate) fn generation(&self, row: u32) -> u32 {
        self.meta(row).expect("row in range").generation
    }

    /// The row's `RowMeta`, wherever the mode keeps it; `None` for a row out of range.
    #[inline(always)]
    pub(crate) fn meta(&self, row: u32) -> Option<&RowMeta> {
        match &self.pool {
            Backend::Owned(p) => p.rows.get(row as usize).map(|r| &r.meta),
            Backend::Engine(_) => self.engine_meta.get(row as usize),
        }
    }

    /// The row's `RowMeta`, for a row in range.
    pub(crate) fn meta_mut(&mut self, row: u32) -> &mut RowMeta {
        match &mut self.pool {
            Backend::Owned(p) => &mut p.rows[row as usize].meta,
            Backend::Engine(_) => &mut self.engine_meta[row as usize],
        }
    }

    /// Checks a req and its row against everything libskv knows, in the documented order of
    /// errors: fields (`InvalidArg`), then `check_record`.
    #[inline]
    pub(crate) fn check_req(&self, req: &Req) -> Result<()> {
        req.validate(&self.cfg)?;
        self.check_record(req)
    }

    /// Checks a valid req against libskv's record of its row, in the documented order: a row
    /// not in use (`NotFound`, owned mode), a stale copy (`State`: a stamped generation the
    /// row has left), then fields disagreeing with the row (owned mode: `State` on an idle
    /// slot's row, where the req is a stale copy; `InvalidArg` elsewhere).
    /// Before the record, the checks of what a session keeps and frees, which the per-step
    /// calls (`check_record_in`) never need: no recurrent-state handle twice, and a window
    /// cursor the pool can free around.
    #[inline(always)]
    pub(crate) fn check_record(&self, req: &Req) -> Result<()> {
        req.check_aux_handles()?;
        if let Backend::Engine(p) = &self.pool {
            p.check_cursor(req)?;
        }
        self.check_record_in(self.pool.owned(), req)
    }

    /// `check_record` with `self.pool.owned()` looked up by the caller: a batch looks it up
    /// once, not once a request.
    #[inline(always)]
    pub(crate) fn check_record_in(&self, owned: Option<&OwnedPool>, req: &Req) -> Result<()> {
        if let Some(row) = req.row() {
            if let Some(p) = owned {
                p.preload_swa(row);
                p.row(row)?;
            }
            let now = self.generation(row);
            if req.row_generation != 0 && req.row_generation != now {
                bail!(
                    State,
                    "req_pool_idx {row} is a stale copy: its row_generation is {} but row {row} is now at \
                     generation {now} (the row was released and handed out again since)",
                    req.row_generation
                );
            }
        }
        // The owned pool's check called directly, so it inlines (see `Result`).
        let record = match owned {
            Some(p) => Pool::check_req(p, req),
            None => self.pool.check_req(req),
        };
        match record {
            // A req on an idle slot's row that disagrees with the row is a copy kept from an
            // earlier turn: say so, rather than only which field disagrees.
            Err(Error::InvalidArg(m)) => match req.row().and_then(|r| self.slots.of_row(r)).filter(|s| !s.in_flight) {
                Some(s) => bail!(
                    State,
                    "req_pool_idx {} is a stale copy: row {} belongs to the idle slot of session {} branch {} \
                     and the req disagrees with it ({m})",
                    req.req_pool_idx,
                    req.req_pool_idx,
                    s.session,
                    s.branch
                ),
                None => Err(Error::InvalidArg(m)),
            },
            other => other,
        }
    }

    /// The row changes lifetime: copies stamped with its old generation become stale.
    pub(crate) fn bump_generation(&mut self, row: u32) -> u32 {
        next_generation(&mut self.meta_mut(row).generation)
    }
}

/// Moves a row generation on, skipping 0 (which on a req means "not stamped").
fn next_generation(g: &mut u32) -> u32 {
    *g = g.wrapping_add(1).max(1);
    *g
}

/// The effect of `free_aligned(row, target, end)`: whole pages from `ceil_align(target)` go
/// back; the page holding `target - 1` stays, since it also holds committed tokens. `dead`
/// is the row's SWA-dead range before the free (`swa_dead`).
pub(crate) fn free_aligned_effect(ps: u32, row: u32, target: u32, end: u32, dead: (u32, u32)) -> Option<Effect> {
    if end <= target {
        return None;
    }
    let start = if ps > 1 { ceil_align(target, ps).min(end as u64) as u32 } else { target };
    Some(Effect::FreeKv { row, keep: target, start, end, dead_lo: dead.0, dead_hi: dead.1 })
}

/// The effects of releasing a slot, in release order: the recurrent-state handles go last,
/// the pool slot before the track entries, as sglang's `_free_slot_mamba` frees them.
pub(crate) fn push_release(effects: &mut Vec<Effect>, ps: u32, row: u32, s: &Slot) {
    if s.lock_node != 0 {
        effects.push(Effect::DecLockRef { node: s.lock_node, receipt: s.lock_receipt });
    }
    push_free_past_prefix(effects, ps, row, s, s.allocated);
    effects.push(Effect::FreeRow { row });
    effects.extend(s.aux_handles().into_iter().filter(|&aux| aux != -1).map(|aux| Effect::FreeAux { aux }));
}

/// The effect freeing a slot's row past its protected prefix, up to `end` (a release's, to
/// its record; a park's, to what the row maps).
#[inline]
pub(crate) fn push_free_past_prefix(effects: &mut Vec<Effect>, ps: u32, row: u32, s: &Slot, end: u32) {
    if s.protected < end {
        let (dead_lo, dead_hi) = swa_dead(s.protected, s.swa_floor, s.swa, ps);
        effects.push(Effect::FreeKv { row, keep: s.protected, start: s.protected, end, dead_lo, dead_hi });
    }
}

/// The cache's pool: libskv's own, reached without a virtual call (every owned-mode call
/// asks for it), or the engine's behind its callbacks.
pub enum Backend {
    Owned(Box<OwnedPool>),
    Engine(Box<dyn Pool>),
}

impl Backend {
    /// The pool, whichever it is.
    #[inline(always)]
    pub fn get(&self) -> &dyn Pool {
        match self {
            Backend::Owned(p) => &**p,
            Backend::Engine(p) => &**p,
        }
    }

    // The trait's methods, each dispatched by hand.
    #[inline(always)]
    pub(crate) fn mapped_len(&self, row: u32) -> Option<u32> {
        match self {
            Backend::Owned(p) => p.mapped_len(row),
            Backend::Engine(p) => p.mapped_len(row),
        }
    }

    #[inline(always)]
    pub(crate) fn check_req(&self, req: &Req) -> Result<()> {
        match self {
            Backend::Owned(p) => p.check_req(req),
            Backend::Engine(p) => p.check_req(req),
        }
    }

    pub(crate) fn check_free(&self, row: u32, target: u32, end: u32) -> Result<()> {
        self.get().check_free(row, target, end)
    }

    #[inline(always)]
    pub(crate) fn prepare(&mut self, effects: &[Effect]) -> Result<()> {
        match self {
            Backend::Owned(p) => p.prepare(effects),
            Backend::Engine(p) => p.prepare(effects),
        }
    }

    #[inline(always)]
    pub(crate) fn apply(&mut self, effects: &[Effect]) -> Result<()> {
        match self {
            Backend::Owned(p) => p.apply(effects),
            Backend::Engine(p) => p.apply(effects),
        }
    }

    pub(crate) fn frees_swa(&self) -> std::result::Result<(), String> {
        self.get().frees_swa()
    }

    #[inline(always)]
    pub(crate) fn owned(&self) -> Option<&OwnedPool> {
        match self {
            Backend::Owned(p) => Some(p),
            Backend::Engine(_) => None,
        }
    }

    #[inline(always)]
    pub(crate) fn owned_mut(&mut self) -> Option<&mut OwnedPool> {
        match self {
            Backend::Owned(p) => Some(p),
            Backend::Engine(_) => None,
        }
    }
}
