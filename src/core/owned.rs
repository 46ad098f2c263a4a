//! Owned mode: libskv's own paged KV pool and req_to_token rows.
//!
//! Rows hold page lists, not dense token tables: position `p` of a row maps to token slot
//! `pages[p / ps] * ps + p % ps`. A row's first `protected / ps` pages are engine-held
//! (shared with the engine's prefix tree, possibly by many rows); the rest are owned by the
//! row alone.

use super::alloc::{PageAllocator, PageState};
use super::error::{bail, try_vec, Error, Result};
use super::mirror::Dirty;
use super::page::pages_for;
use super::pool::{Effect, Pool};
use super::req::{Config, Req};

/// The engine callbacks owned mode hands released locks and aux states to. `Err(code)`
/// carries the callback's non-zero return.
pub trait EngineHooks: Send {
    fn dec_lock_ref(&mut self, lock_node: u64, lock_receipt: u64) -> Result<(), i32>;
    fn free_aux(&mut self, aux_state: i64) -> Result<(), i32>;
}

/// One req_to_token row in use.
#[derive(Debug, Default)]
pub struct Row {
    pub pages: Vec<u32>,
    /// Tokens mapped.
    pub len: u32,
    /// Leading tokens whose pages are engine-held.
    pub protected: u32,
}

pub struct OwnedPool {
    pub(crate) ps: u32,
    pub(crate) pages: PageAllocator,
    pub(crate) rows: Vec<Option<Row>>,
    free_rows: Vec<u32>,
    hooks: Option<Box<dyn EngineHooks>>,
    /// Page lists a call sorts to find duplicates, kept to reuse the allocation.
    pub(crate) scratch: Vec<u32>,
    /// Spans of rows mapped anew, kept once a device copy of the rows exists.
    pub(crate) dirty: Option<Dirty>,
}

impl OwnedPool {
    pub fn new(cfg: &Config) -> Result<Self> {
        let total = (cfg.num_token_slots / cfg.page_size as u64) as u32;
        let n = cfg.num_rows as usize;
        Ok(OwnedPool {
            ps: cfg.page_size,
            pages: PageAllocator::new(total)?,
            rows: try_vec(n, "rows", |_| None)?,
            free_rows: try_vec(n, "the free-row stack", |i| (n - 1 - i) as u32)?,
            hooks: None,
            scratch: Vec::new(),
            dirty: None,
        })
    }

    pub fn set_hooks(&mut self, hooks: Option<Box<dyn EngineHooks>>) {
        self.hooks = hooks;
    }

    pub fn total_rows(&self) -> u32 {
        self.rows.len() as u32
    }

    pub fn free_rows(&self) -> u32 {
        self.free_rows.len() as u32
    }

    pub fn allocator(&self) -> &PageAllocator {
        &self.pages
    }

    /// The row record, or `NotFound`.
    #[inline(always)]
    pub fn row(&self, row: u32) -> Result<&Row> {
        match self.rows.get(row as usize) {
            Some(Some(r)) => Ok(r),
            Some(None) => bail!(NotFound, "row {row} is not in use"),
            None => bail!(InvalidArg, "row {row} out of range [0, {})", self.rows.len()),
        }
    }

    pub(crate) fn row_mut(&mut self, row: u32) -> &mut Row {
        self.rows[row as usize].as_mut().expect("row checked in use")
    }

    /// Records that `row` maps positions `lo..hi` anew (for a device copy, if any).
    #[inline]
    pub(crate) fn mapped(&mut self, row: u32, lo: u32, hi: u32) {
        if let Some(d) = self.dirty.as_mut() {
            d.mark(row, lo, hi);
        }
    }

    pub(crate) fn take_row(&mut self) -> Option<u32> {
        let row = self.free_rows.pop()?;
        self.rows[row as usize] = Some(Row::default());
        Some(row)
    }

    /// Gives a row back: its owned pages go free, its engine-held pages lose one map.
    fn free_row(&mut self, row: u32) {
        let r = self.rows[row as usize].take().expect("row in use");
        let shared = ((r.protected / self.ps) as usize).min(r.pages.len());
        for &page in &r.pages[..shared] {
            self.unmap_held(page);
        }
        self.pages.free_owned(&r.pages[shared..]);
        self.free_rows.push(row);
    }

    fn unmap_held(&mut self, page: u32) {
        match self.pages.state(page) {
            PageState::Held { maps } => self.pages.set_state(page, PageState::Held { maps: maps - 1 }),
            s => unreachable!("protected page {page} in state {s:?}"),
        }
    }

    /// Frees the row's pages past those holding its first `keep` tokens.
    fn truncate(&mut self, row: u32, keep: u32) {
        let ps = self.ps;
        let r = self.rows[row as usize].as_mut().expect("row in use");
        let kept = (pages_for(keep, ps) as usize).min(r.pages.len());
        r.len = r.len.min(keep);
        if kept == r.pages.len() {
            return;
        }
        self.pages.free_owned(&r.pages[kept..]);
        r.pages.truncate(kept);
        // Held rows cost 4 bytes per mapped page, not per page they ever mapped; halving only
        // when less than half is used keeps a turn's trim and the next turn's growth from
        // reallocating every time.
        if r.pages.capacity() > 2 * kept.max(4) {
            r.pages.shrink_to_fit();
        }
    }

    fn hook(
        &mut self,
        failures: &mut Vec<String>,
        call: impl FnOnce(&mut dyn EngineHooks) -> Result<(), i32>,
        what: impl FnOnce() -> String,
    ) {
        if let Some(h) = self.hooks.as_deref_mut() {
            if let Err(code) = call(h) {
                failures.push(format!("{} returned {code}", what()));
            }
        }
    }
}

impl Pool for OwnedPool {
    fn mapped_len(&self, row: u32) -> Option<u32> {
        self.rows.get(row as usize)?.as_ref().map(|r| r.len)
    }

    #[inline(always)]
    fn check_req(&self, req: &Req) -> Result<()> {
        let Some(row) = req.row() else { return Ok(()) };
        let r = self.row(row)?;
        if req.allocated != r.len {
            bail!(InvalidArg, "kv_allocated_len {} != {} tokens mapped by row {row}", req.allocated, r.len);
        }
        if req.protected != r.protected {
            bail!(InvalidArg, "cache_protected_len {} != {} recorded for row {row}", req.protected, r.protected);
        }
        Ok(())
    }

    fn check_free(&self, row: u32, target: u32, end: u32) -> Result<()> {
        let r = self.row(row)?;
        if end < r.len {
            bail!(InvalidArg, "end {end} < {} tokens mapped by row {row}: a tail free reaches the row's end", r.len);
        }
        if target < r.protected {
            bail!(State, "target {target} < protected prefix {} of row {row}", r.protected);
        }
        Ok(())
    }

    fn apply(&mut self, effects: &[Effect]) -> Result<()> {
        let mut failures = Vec::new();
        for e in effects {
            match *e {
                Effect::DecLockRef { node, receipt } => self.hook(
                    &mut failures,
                    |h| h.dec_lock_ref(node, receipt),
                    || format!("dec_lock_ref({node}, {receipt})"),
                ),
                Effect::FreeKv { row, keep, .. } => self.truncate(row, keep),
                // Refused before planning (`frees_swa`): owned mode has one pool.
                Effect::FreeSwa { .. } => {}
                Effect::FreeRow { row } => self.free_row(row),
                Effect::FreeAux { aux } => self.hook(&mut failures, |h| h.free_aux(aux), || format!("free_aux({aux})")),
            }
        }
        if failures.is_empty() {
            Ok(())
        } else {
            Err(Error::Callback(format!("{}; every page and row was still released", failures.join(", "))))
        }
    }

    fn owned(&self) -> Option<&OwnedPool> {
        Some(self)
    }

    fn owned_mut(&mut self) -> Option<&mut OwnedPool> {
        Some(self)
    }
}
