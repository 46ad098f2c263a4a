//! Owned mode: libskv's own paged KV pool and req_to_token rows.
//!
//! Rows hold page lists, not dense token tables: position `p` of a row maps to token slot
//! `pages[p / ps] * ps + p % ps`. A row's first `protected / ps` pages are engine-held
//! (shared with the engine's prefix tree, possibly by many rows); the rest are owned by the
//! row alone.
//!
//! With an SWA pool (a hybrid model's sliding-window layers), every page a row maps also has
//! an SWA page until the window passes it: `SwaSide` keeps those ids beside the rows, so a
//! model without one pays nothing for it.

use super::alloc::{reserve_pages, PageAllocator, GROW_ROOM};
use super::error::{bail, try_vec, Error, Result};
use super::mirror::Dirty;
use super::page::pages_for;
use super::page_list::PageList;
use super::pins::Pins;
use super::pool::{Effect, Pool};
use super::req::{Config, Req};
use super::row_meta::RowMeta;
use super::swa_alloc::SwaAllocator;

/// The engine callbacks owned mode hands released locks and aux states to. `Err(code)`
/// carries the callback's non-zero return.
pub trait EngineHooks: Send {
    fn dec_lock_ref(&mut self, lock_node: u64, lock_receipt: u64) -> Result<(), i32>;
    fn free_aux(&mut self, aux_state: i64) -> Result<(), i32>;
    /// Whether `copy_pages` is installed (the host tier's moves need it).
    fn can_copy(&self) -> bool {
        false
    }
    /// Enqueue the copies of `ticket`: `src[i] -> dst[i]`, the first `n_full` pairs in the
    /// full pools, the rest in the SWA pools (`COPY_TO_HOST` or `COPY_TO_DEVICE`).
    fn copy_pages(
        &mut self,
        _ticket: u64,
        _direction: u32,
        _src: &[i32],
        _dst: &[i32],
        _n_full: usize,
        _n_swa: usize,
    ) -> Result<(), i32> {
        Err(-1)
    }
}

/// One req_to_token row in use (48 bytes; kept in the row's `RowRecord`).
#[derive(Debug, Default)]
pub struct Row {
    pub pages: PageList,
    /// Tokens mapped.
    pub len: u32,
    /// Leading tokens whose pages are engine-held.
    pub protected: u32,
    /// With an SWA pool, the row's SWA cursor (sglang's `swa_evicted_seqlen`): a req must agree
    /// with it (0, and unchecked, without one). Kept here rather than with the row's SWA pages
    /// (`SwaRow`), so that a request's checks read one record.
    pub swa_cursor: u32,
}

/// One row of the pool: what the cache knows of it (`RowMeta`, kept for every row) and, while
/// the row is in use, its mapping. 64 bytes, aligned to a cache line: a request's checks read
/// both, so where an engine's rows are scattered they cost one miss, not one per table.
#[derive(Debug, Default)]
#[repr(align(64))]
pub struct RowRecord {
    pub(crate) meta: RowMeta,
    pub(crate) in_use: Option<Row>,
}

const _: () = assert!(std::mem::size_of::<RowRecord>() == 64, "a row's record is one cache line");

impl Row {
    /// The leading pages the engine holds (inside the protected prefix): the rest are the row's
    /// own.
    #[inline(always)]
    fn shared_pages(&self, ps: u32) -> usize {
        ((self.protected / ps) as usize).min(self.pages.len())
    }
}

/// One row's side of the SWA pool, kept together so a call on the row reads one record: 32
/// bytes, aligned to half a cache line so that none straddles two.
#[derive(Debug, Default)]
#[repr(align(32))]
pub struct SwaRow {
    /// The SWA page of each page the row maps (`Row::pages`, same positions); 0 once the
    /// window freed it. Entries inside a protected prefix copy `SwaSide::held`'s.
    pub(crate) ids: Vec<u32>,
    /// Entries `[lo, hi)` the window emptied in one run: a free skips them, so a release
    /// walks only the pages still holding an SWA page (a long row's window passed most).
    pub(crate) passed: (u32, u32),
}

impl SwaRow {
    /// The first entry at or past `from` that a free reads: `from`, or the end of the passed
    /// run when the run covers `from`.
    #[inline]
    fn first_live(&self, from: usize) -> usize {
        let (lo, hi) = (self.passed.0 as usize, self.passed.1 as usize);
        if lo <= from && from < hi {
            hi
        } else {
            from
        }
    }

    /// Starts loading the first `lines` cache lines (16 entries each) of the entries a free
    /// from `from` reads, for a caller that has other work to do before it: the loads then
    /// overlap that work.
    #[inline(always)]
    fn preload_from(&self, from: usize, lines: usize) {
        let ids = self.ids.as_ptr();
        for at in (self.first_live(from)..self.ids.len()).step_by(16).take(lines) {
            prefetch(ids.wrapping_add(at));
        }
    }

    /// Gives back the SWA pages of entries `from..` and drops those entries.
    #[inline]
    pub(crate) fn free_from(&mut self, alloc: &mut SwaAllocator, from: usize) {
        let n = self.ids.len();
        if from >= n {
            return;
        }
        let (lo, hi) = (self.passed.0 as usize, self.passed.1 as usize);
        let (a, b) = (lo.clamp(from, n), hi.clamp(from, n));
        // The entries are dropped below: nothing to clear.
        if b > a {
            alloc.free_dropped(&self.ids[from..a]);
            alloc.free_dropped(&self.ids[b..]);
        } else {
            alloc.free_dropped(&self.ids[from..]);
        }
        self.ids.truncate(from);
        let f = from as u32;
        self.passed = match (lo as u32).min(f)..(hi as u32).min(f) {
            r if r.is_empty() => (0, 0),
            r => (r.start, r.end),
        };
    }

    /// Gives back the SWA pages of entries `[lo, hi)`: the window passed them.
    pub(crate) fn pass(&mut self, alloc: &mut SwaAllocator, lo: u32, hi: u32) {
        let hi = hi.min(self.ids.len() as u32);
        if lo >= hi {
            return;
        }
        alloc.free_entries(&mut self.ids[lo as usize..hi as usize]);
        let (plo, phi) = self.passed;
        // Runs that touch make one; otherwise the longer is kept (either holds only zeros).
        self.passed = if plo < phi && lo <= phi && hi >= plo {
            (plo.min(lo), phi.max(hi))
        } else if hi - lo >= phi.saturating_sub(plo) {
            (lo, hi)
        } else {
            (plo, phi)
        };
    }
}

/// The sliding-window pool and what maps it.
pub struct SwaSide {
    pub(crate) alloc: SwaAllocator,
    /// Per row: its SWA pages (its cursor is in the row's own record, `Row::swa_cursor`).
    pub(crate) rows: Vec<SwaRow>,
    /// Per full page: the SWA page of an engine-held page, 0 for every other page. A held
    /// page's SWA page goes back with it (`pool_free`), never with a row.
    pub(crate) held: Vec<u32>,
}

impl SwaSide {
    fn new(cfg: &Config, full_pages: u32) -> Result<Self> {
        let n = cfg.num_rows as usize;
        Ok(SwaSide {
            alloc: SwaAllocator::new((cfg.swa_num_token_slots / cfg.page_size as u64) as u32)?,
            rows: try_vec(n, "rows' SWA pages", |_| SwaRow::default())?,
            held: try_vec(full_pages as usize, "engine-held pages' SWA pages", |_| 0)?,
        })
    }

    /// `OutOfMemory` unless `n` more SWA pages are free.
    #[inline]
    pub(crate) fn check_room(&self, n: u64) -> Result<()> {
        if n > self.alloc.free_pages() as u64 {
            bail!(OutOfMemory, "{n} SWA pages needed, {} free", self.alloc.free_pages());
        }
        Ok(())
    }
}

pub struct OwnedPool {
    pub(crate) ps: u32,
    pub(crate) pages: PageAllocator,
    pub(crate) rows: Vec<RowRecord>,
    /// The SWA pool, when the config sizes one.
    pub(crate) swa: Option<SwaSide>,
    free_rows: Vec<u32>,
    pub(crate) hooks: Option<Box<dyn EngineHooks>>,
    /// Page lists a call sorts to find duplicates, kept to reuse the allocation.
    pub(crate) scratch: Vec<u32>,
    /// Spans of rows mapped anew, kept once a device copy of the rows exists.
    pub(crate) dirty: Option<Dirty>,
    /// Rows an open ticket copies, and what they freed meanwhile.
    pub(crate) pins: Pins,
}

impl OwnedPool {
    pub fn new(cfg: &Config) -> Result<Self> {
        let total = (cfg.num_token_slots / cfg.page_size as u64) as u32;
        let n = cfg.num_rows as usize;
        let swa = match cfg.swa_num_token_slots {
            0 => None,
            _ => Some(SwaSide::new(cfg, total)?),
        };
        Ok(OwnedPool {
            ps: cfg.page_size,
            // Spare page lists for the rows (see `take_row`): at most one per row, of at most a
            // full row's room (its most pages, and the room a growth may have left).
            pages: PageAllocator::new(total, n, pages_for(cfg.max_context_len, cfg.page_size) as usize + GROW_ROOM)?,
            rows: try_vec(n, "rows", |_| RowRecord::default())?,
            swa,
            free_rows: try_vec(n, "the free-row stack", |i| (n - 1 - i) as u32)?,
            hooks: None,
            scratch: Vec::new(),
            dirty: None,
            pins: Pins::default(),
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

    /// The row's mapping, if the row is in range and in use.
    #[inline(always)]
    pub(crate) fn in_use(&self, row: u32) -> Option<&Row> {
        self.rows.get(row as usize)?.in_use.as_ref()
    }

    /// The row record, or `NotFound`.
    #[inline(always)]
    pub fn row(&self, row: u32) -> Result<&Row> {
        match self.rows.get(row as usize).map(|r| &r.in_use) {
            Some(Some(r)) => Ok(r),
            Some(None) => bail!(NotFound, "row {row} is not in use"),
            None => bail!(InvalidArg, "row {row} out of range [0, {})", self.rows.len()),
        }
    }

    pub(crate) fn row_mut(&mut self, row: u32) -> &mut Row {
        self.rows[row as usize].in_use.as_mut().expect("row checked in use")
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
        // A list a released row or an emptied run left: a new turn's first extend finds room,
        // and a release hands the host allocator nothing.
        self.rows[row as usize].in_use =
            Some(Row { pages: PageList::new(self.pages.take_list()), len: 0, protected: 0, swa_cursor: 0 });
        Some(row)
    }

    /// Gives a row back: its owned pages go free (with their SWA pages), its engine-held
    /// pages lose one map.
    pub(crate) fn free_row(&mut self, row: u32) {
        let r = self.rows[row as usize].in_use.take().expect("row in use");
        let shared = r.shared_pages(self.ps);
        if let Some(s) = self.swa.as_ref() {
            s.rows[row as usize].preload_from(shared, 1);
        }
        for &page in &r.pages[..shared] {
            self.unmap_held(page);
        }
        if let Some(s) = self.swa.as_mut() {
            let sr = &mut s.rows[row as usize];
            sr.free_from(&mut s.alloc, shared);
            sr.passed = (0, 0);
            sr.ids.clear();
        }
        self.pages.free_list_of_row(r.pages.into_vec(), shared);
        self.free_rows.push(row);
    }

    /// Maps `n` more pages at the end of `row`, in both pools; all or nothing.
    #[inline]
    pub(crate) fn grow(&mut self, row: u32, n: u32) -> Result<()> {
        let r = self.rows[row as usize].in_use.as_mut().expect("row checked in use");
        let Some(s) = self.swa.as_mut() else {
            return r.pages.edit(|v| self.pages.alloc(n, v));
        };
        s.check_room(n as u64)?;
        let ids = &mut s.rows[row as usize].ids;
        if !reserve_pages(ids, n as usize) {
            bail!(OutOfMemory, "no host memory for a list of {n} more SWA pages");
        }
        r.pages.edit(|v| self.pages.alloc(n, v))?;
        s.alloc.alloc(n, ids);
        Ok(())
    }

    /// Undoes the `grow`s that took `row` past its first `keep` pages, the last one first:
    /// both free stacks are as they were before them.
    pub(crate) fn ungrow(&mut self, row: u32, keep: usize) {
        let r = self.rows[row as usize].in_use.as_mut().expect("row in use");
        self.pages.unalloc(&r.pages[keep..]);
        r.pages.edit(|v| v.truncate(keep));
        if let Some(s) = self.swa.as_mut() {
            let ids = &mut s.rows[row as usize].ids;
            s.alloc.unalloc(&ids[keep..]);
            ids.truncate(keep);
        }
    }

    /// Gives back the SWA pages of `row`'s positions `[start, end)`, both page-aligned (a
    /// window step's are): the window moved past them.
    pub(crate) fn free_swa(&mut self, row: u32, start: u32, end: u32) {
        let Some(s) = self.swa.as_mut() else { return };
        s.rows[row as usize].pass(&mut s.alloc, start / self.ps, end / self.ps);
    }

    /// Starts loading `row`'s SWA record, if there is an SWA pool: a call reads it after the
    /// row's own record, a cache line apart, and the two loads then overlap.
    #[inline(always)]
    pub(crate) fn preload_swa(&self, row: u32) {
        if let Some(s) = self.swa.as_ref() {
            prefetch(s.rows.as_ptr().wrapping_add(row as usize));
        }
    }

    /// Starts loading `row`'s records in both pools, for a call that reaches them only after
    /// other work (a release, after the session's slots): the loads then overlap that work.
    #[inline(always)]
    pub(crate) fn preload_row(&self, row: u32) {
        self.preload_record(row);
        self.preload_swa(row);
    }

    /// Starts loading `row`'s own record: all a batch's request reads unless it takes a page.
    #[inline(always)]
    pub(crate) fn preload_record(&self, row: u32) {
        prefetch(self.rows.as_ptr().wrapping_add(row as usize));
    }

    /// Starts loading the SWA entries a release of `row` gives back (with an SWA pool), for a
    /// release that has its session's bookkeeping still to do: the loads then overlap it. The
    /// row's records were loaded by `preload_row`; the full side needs nothing, as its list is
    /// handed to the free stack unread.
    #[inline(always)]
    pub(crate) fn preload_release(&self, row: u32) {
        let (Some(s), Some(r)) = (self.swa.as_ref(), self.in_use(row)) else { return };
        // Four lines: a 1,024-token window's entries at page size 16.
        s.rows[row as usize].preload_from(r.shared_pages(self.ps), 4);
    }

    /// Whether the rows' page lists have outgrown the caches: more than `LISTS_IN_CACHE` bytes
    /// of page ids mapped. Beyond it a batch extend starts loading each list's end a few
    /// requests ahead (`preload_tail`); below it the lists stay in cache and those loads are
    /// only instructions (measured at 1,000 sessions of 4,096 tokens, 1 MiB of ids: 19.0 ns
    /// a request with them, 15.9 without; at 100,000, 24.4 with, 31.3 without).
    #[inline]
    pub(crate) fn lists_outgrow_cache(&self) -> bool {
        let mapped = self.pages.total_pages() - self.pages.free_pages();
        mapped as u64 * std::mem::size_of::<u32>() as u64 > LISTS_IN_CACHE
    }

    /// Whether the row records outgrow a core's own cache (`RECORDS_IN_CACHE`): beyond it a batch
    /// whose rows are not in order starts loading each request's record a few requests ahead.
    #[inline]
    pub(crate) fn records_outgrow_cache(&self) -> bool {
        (self.rows.len() * std::mem::size_of::<RowRecord>()) as u64 > RECORDS_IN_CACHE
    }

    /// Starts loading the ends of `row`'s page lists (where an extend writes), if the row is
    /// in use and an extend by `n` takes a page: a batch extend asks for them a few requests
    /// ahead. An extend that takes no page reads no list (its slots come from the record's copy
    /// of the last page), so a decode step loads one row's lists in `ps`. The row's record is
    /// read for the test, so that load too starts early.
    #[inline(always)]
    pub(crate) fn preload_tail(&self, row: u32, n: u32) {
        if let Some(r) = self.in_use(row) {
            let room = (r.pages.len() as u64 * self.ps as u64).saturating_sub(r.len as u64);
            if n as u64 <= room {
                return;
            }
            prefetch(r.pages.as_ptr().wrapping_add(r.pages.len()));
            if let Some(s) = self.swa.as_ref() {
                let ids = &s.rows[row as usize].ids;
                prefetch(ids.as_ptr().wrapping_add(ids.len()));
            }
        }
    }

    /// Records the row's SWA cursor (with an SWA pool; without one the engine keeps it).
    #[inline]
    pub(crate) fn set_cursor(&mut self, row: u32, swa_cursor: u32) {
        if let (Some(_), Some(r)) = (self.swa.as_ref(), self.rows[row as usize].in_use.as_mut()) {
            r.swa_cursor = swa_cursor;
        }
    }

    fn unmap_held(&mut self, page: u32) {
        match self.pages.held_maps(page) {
            Some(maps) if maps > 0 => self.pages.set_held(page, maps - 1),
            m => unreachable!("protected page {page} is not engine-held and mapped ({m:?})"),
        }
    }

    /// Frees the row's pages past those holding its first `keep` tokens.
    pub(crate) fn truncate(&mut self, row: u32, keep: u32) {
        let ps = self.ps;
        let r = self.rows[row as usize].in_use.as_mut().expect("row in use");
        let kept = (pages_for(keep, ps) as usize).min(r.pages.len());
        r.len = r.len.min(keep);
        if let Some(s) = self.swa.as_ref() {
            // The row's SWA record itself was loaded with its own.
            s.rows[row as usize].preload_from(kept, 1);
        }
        if kept < r.pages.len() {
            self.pages.free_owned(&r.pages[kept..]);
            r.pages.edit(|v| v.truncate(kept));
            // Held rows cost 4 bytes per mapped page, not per page they ever mapped; halving
            // only when less than half is used (beside the room a growth leaves, `GROW_ROOM`)
            // keeps a turn's trim and the next turn's growth from reallocating every time. An
            // emptied list keeps its room: the row grows again, or a release hands the list to
            // the free stack, kept for a row taken.
            if kept > 0 && r.pages.capacity() > 2 * kept.max(4) + GROW_ROOM {
                r.pages.edit(|v| v.shrink_to_fit());
            }
        }
        if let Some(s) = self.swa.as_mut() {
            r.swa_cursor = r.swa_cursor.min(keep);
            s.rows[row as usize].free_from(&mut s.alloc, kept);
        }
    }

    /// Whether `next` frees `row`, and a trim to `keep` before it frees only pages the row's
    /// free would (`keep` is the row's page-aligned protected prefix).
    fn row_freed_next(&self, row: u32, keep: u32, next: Option<&Effect>) -> bool {
        matches!(next, Some(&Effect::FreeRow { row: r }) if r == row)
            && keep.is_multiple_of(self.ps)
            && self.in_use(row).is_some_and(|r| r.protected == keep)
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

/// Page ids a core's caches and TLB are taken to hold (8 MiB: what 2,048 TLB entries of 4 KiB
/// pages map, a common x86 second-level TLB): see `OwnedPool::lists_outgrow_cache`.
const LISTS_IN_CACHE: u64 = 8 << 20;

/// Row records a core's own cache is taken to hold (1 MiB: the second-level cache of common
/// x86 cores): see `OwnedPool::records_outgrow_cache`.
const RECORDS_IN_CACHE: u64 = 1 << 20;

/// A hint to load `p`'s cache line; `p` need not be valid (nothing is read through it).
#[inline(always)]
fn prefetch<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads nothing and cannot fault, whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

impl Pool for OwnedPool {
    fn mapped_len(&self, row: u32) -> Option<u32> {
        self.in_use(row).map(|r| r.len)
    }

    #[inline(always)]
    fn check_req(&self, req: &Req) -> Result<()> {
        let Some(row) = req.row() else { return Ok(()) };
        let r = self.row(row)?;
        if req.kv_allocated_len != r.len {
            bail!(InvalidArg, "kv_allocated_len {} != {} tokens mapped by row {row}", req.kv_allocated_len, r.len);
        }
        if req.cache_protected_len != r.protected {
            bail!(
                InvalidArg,
                "cache_protected_len {} != {} recorded for row {row}",
                req.cache_protected_len,
                r.protected
            );
        }
        if let Some(s) = self.swa.as_ref() {
            let sr = &s.rows[row as usize];
            // The call goes on to the row's last SWA entries (a trim, a tail free, a grow):
            // start that load now, behind the checks, rather than after them.
            prefetch(sr.ids.as_ptr().wrapping_add(r.pages.len().saturating_sub(1)));
            let cursor = r.swa_cursor;
            if req.swa_evicted_seqlen != cursor {
                bail!(
                    InvalidArg,
                    "swa_evicted_seqlen {} != {cursor} recorded for row {row} (with an SWA pool only \
                     skv_swa_evict moves the window)",
                    req.swa_evicted_seqlen
                );
            }
        }
        Ok(())
    }

    fn prepare(&mut self, effects: &[Effect]) -> Result<()> {
        match self.pins.is_empty() {
            true => Ok(()),
            false => self.reserve_drains(effects),
        }
    }

    fn check_free(&self, row: u32, target: u32, end: u32) -> Result<()> {
        let r = self.row(row)?;
        if end < r.len {
            bail!(InvalidArg, "end {end} < {} tokens mapped by row {row}: a tail free reaches the row's end", r.len);
        }
        if target < r.protected {
            bail!(State, "target {target} < protected prefix {} of row {row}", r.protected);
        }
        // The page holding `target - 1` stays; if the window passed it, positions grown into
        // it later would have no SWA slot (a trim floors its target to a page for this).
        let passed = |s: &SwaSide| s.rows[row as usize].ids.get((target / self.ps) as usize) == Some(&0);
        if target < r.len && !target.is_multiple_of(self.ps) && self.swa.as_ref().is_some_and(passed) {
            bail!(
                InvalidArg,
                "target {target} lies inside a page of row {row} the window has passed: the kept page would \
                 hold positions without SWA slots (free from a page boundary, {})",
                target - target % self.ps
            );
        }
        Ok(())
    }

    fn apply(&mut self, effects: &[Effect]) -> Result<()> {
        let mut failures = Vec::new();
        for (i, e) in effects.iter().enumerate() {
            if !self.pins.is_empty() && e.freed_row().is_some_and(|r| self.rows[r as usize].meta.pinned) {
                self.apply_pinned(e);
                continue;
            }
            match *e {
                // A release frees the row's tail, then the row: the row's free alone gives back
                // the same pages in the same order, and can hand its list to the free stack whole.
                Effect::FreeKv { row, keep, .. } if self.row_freed_next(row, keep, effects.get(i + 1)) => {}
                Effect::DecLockRef { node, receipt } => self.hook(
                    &mut failures,
                    |h| h.dec_lock_ref(node, receipt),
                    || format!("dec_lock_ref({node}, {receipt})"),
                ),
                Effect::FreeKv { row, keep, .. } => self.truncate(row, keep),
                Effect::FreeSwa { row, start, end } => self.free_swa(row, start, end),
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

    fn frees_swa(&self) -> std::result::Result<(), String> {
        match self.swa {
            Some(_) => Ok(()),
            None => Err("owned mode without an SWA pool (swa_num_token_slots 0): the engine runs the window".into()),
        }
    }
}
