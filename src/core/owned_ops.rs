//! The owned-mode operations an engine calls besides the session ones: rows, allocation,
//! prefix sharing with the engine's prefix tree, and views of the pool.

use super::cache::{Backend, Cache};
use super::error::{bail, Error, Result};
use super::fast_extend::{fast_extend, write_slots};
use super::mirror::Dirty;
use super::owned::{EngineHooks, OwnedPool, SwaSide};
use super::page::{pages_for, token_slot};
use super::pool::Effect;
use super::records::Stats;
use super::req::{keep_protected, swa_dead, Req};

fn external_mode() -> Error {
    Error::Unsupported("not available in external mode (the engine owns the pools)".into())
}

impl Cache {
    /// `Unsupported` unless this is an owned-mode cache.
    #[inline]
    pub fn require_owned(&self) -> Result<()> {
        self.owned_pool().map(|_| ())
    }

    /// Whether libskv owns the pools (owned mode).
    pub fn is_owned(&self) -> bool {
        matches!(self.pool, Backend::Owned(_))
    }

    #[inline]
    pub(super) fn owned_pool(&self) -> Result<&OwnedPool> {
        self.pool.owned().ok_or_else(external_mode)
    }

    fn owned_pool_mut(&mut self) -> Result<&mut OwnedPool> {
        self.pool.owned_mut().ok_or_else(external_mode)
    }

    /// Refuses calls on a row any session slot holds, in flight or not.
    fn guard_session_row(&self, row: u32) -> Result<()> {
        match self.slots.of_row(row) {
            Some(s) => bail!(State, "row {row} belongs to session {} branch {}", s.session, s.branch),
            None => Ok(()),
        }
    }

    pub fn set_hooks(&mut self, hooks: Option<Box<dyn EngineHooks>>) -> Result<()> {
        self.owned_pool_mut()?.set_hooks(hooks);
        Ok(())
    }

    /// Assigns a free row to a req that holds none, stamped with the row's new generation.
    /// The row maps nothing yet, so the req's KV lengths become 0.
    pub fn alloc_row(&mut self, req: &mut Req) -> Result<()> {
        self.owned_pool()?;
        req.validate(&self.cfg)?;
        if req.req_pool_idx >= 0 {
            bail!(InvalidArg, "req already holds row {}", req.req_pool_idx);
        }
        let pool = self.owned_pool_mut()?;
        let Some(row) = pool.take_row() else {
            bail!(OutOfMemory, "no free row (num_rows {})", pool.total_rows());
        };
        let generation = self.bump_generation(row);
        req.set_row(row as i32, generation);
        Ok(())
    }

    /// A non-session finish: frees `[protected, allocated)` and the row. The req's tree lock
    /// and aux state stay the engine's.
    pub fn free_req(&mut self, req: &mut Req) -> Result<()> {
        self.owned_pool()?;
        self.check_req(req)?;
        let row = req.require_row()?;
        self.guard_session_row(row)?;
        self.effects.clear();
        if req.cache_protected_len < req.kv_allocated_len {
            let (dead_lo, dead_hi) =
                swa_dead(req.cache_protected_len, req.swa_evict_floor, req.swa_evicted_seqlen, self.cfg.page_size);
            let (keep, start, end) = (req.cache_protected_len, req.cache_protected_len, req.kv_allocated_len);
            self.effects.push(Effect::FreeKv { row, keep, start, end, dead_lo, dead_hi });
        }
        self.effects.push(Effect::FreeRow { row });
        self.run_effects(|_| {})?;
        req.set_row(-1, 0);
        Ok(())
    }

    /// Maps `n` more positions: the partial last page first, then whole new pages; with
    /// `out`, writes the new positions' token slots there (`out.len() == n`).
    #[inline]
    pub fn alloc_extend(&mut self, req: &mut Req, n: u32, mut out: Option<&mut [i32]>) -> Result<()> {
        let (cfg, old) = (self.cfg, req.kv_allocated_len);
        if let Backend::Owned(pool) = &mut self.pool {
            let slots = out.as_deref_mut();
            let fast = match pool.swa.is_some() {
                true => fast_extend::<true>(&cfg, pool, req, n, slots, None),
                false => fast_extend::<false>(&cfg, pool, req, n, slots, None),
            };
            if fast.is_some() {
                pool.mapped(req.req_pool_idx as u32, old, req.kv_allocated_len);
                return Ok(());
            }
        }
        let (row, new_len) = self.check_extend(&self.cfg, self.owned_pool()?, req, n)?;
        let ps = self.cfg.page_size;
        let pool = self.pool.owned_mut().expect("owned checked");
        let need = pages_for(new_len, ps) - pool.row_mut(row).pages.len() as u32;
        if need > 0 {
            pool.grow(row, need).map_err(|e| e.at(format_args!("n_tokens {n}")))?;
        }
        let r = pool.row_mut(row);
        r.len = new_len;
        if let Some(out) = out {
            write_slots(&r.pages, ps, req.kv_allocated_len, out);
        }
        pool.mapped(row, req.kv_allocated_len, new_len);
        req.kv_allocated_len = new_len;
        Ok(())
    }

    /// Marks `n` more allocated tokens as final.
    #[inline]
    pub fn commit(&mut self, req: &mut Req, n: u32) -> Result<()> {
        let (_, committed) = self.check_commit(&self.cfg, self.owned_pool()?, req, n)?;
        req.kv_committed_len = committed;
        Ok(())
    }

    /// Hands the engine's prefix tree `out.len()` token slots in whole pages.
    pub fn pool_alloc(&mut self, out: &mut [i32]) -> Result<()> {
        let ps = self.cfg.page_size;
        let pool = self.owned_pool_mut()?;
        let n = out.len();
        if !n.is_multiple_of(ps as usize) {
            bail!(InvalidArg, "n_tokens {n} is not a multiple of page_size {ps}");
        }
        let need = (n / ps as usize) as u32;
        if let Some(s) = pool.swa.as_ref() {
            s.check_room(need as u64).map_err(|e| e.at(format_args!("n_tokens {n}")))?;
        }
        let mut pages = std::mem::take(&mut pool.scratch);
        pages.clear();
        let got = pool.pages.alloc_held(need, &mut pages);
        if got.is_ok() {
            for (i, slot) in out.iter_mut().enumerate() {
                *slot = token_slot(&pages, ps, i as u32);
            }
            if let Some(s) = pool.swa.as_mut() {
                // One SWA page each, recorded against the full page: it goes back with it.
                let mut ids = Vec::with_capacity(need as usize);
                s.alloc.alloc(need, &mut ids);
                for (&p, id) in pages.iter().zip(ids) {
                    s.held[p as usize] = id;
                }
            }
        }
        pool.scratch = pages;
        got.map_err(|e| Error::OutOfMemory(format!("n_tokens {n}: {e}")))
    }

    /// Takes back engine-held pages (each index frees the page it falls in); a page any row
    /// still maps, or one already free, refuses the whole call.
    pub fn pool_free(&mut self, indices: &[i32]) -> Result<()> {
        let pool = self.owned_pool_mut()?;
        let mut pages = std::mem::take(&mut pool.scratch);
        let checked = distinct_held_pages(pool, indices, &mut pages);
        if checked.is_ok() {
            for &p in &pages {
                pool.pages.free_held(p);
            }
            if let Some(s) = pool.swa.as_mut() {
                for &p in &pages {
                    s.alloc.free_entries(std::slice::from_mut(&mut s.held[p as usize]));
                }
            }
        }
        pool.scratch = pages;
        checked
    }

    /// For each index, how many rows map its page (0: the tree may evict it).
    pub fn page_refs(&self, indices: &[i32], out: &mut [u32]) -> Result<()> {
        let pool = self.owned_pool()?;
        let mut unheld = false;
        for &i in indices {
            unheld |= pool.pages.held_maps(page_of(pool, i)?).is_none();
        }
        // A page not engine-held is free or a row's own: the free stack tells, read only when
        // some index asks.
        let free = if unheld { pool.pages.free_marks()? } else { Vec::new() };
        for (o, &i) in out.iter_mut().zip(indices) {
            let p = page_of(pool, i)?;
            *o = pool.pages.held_maps(p).unwrap_or_else(|| u32::from(!free[p as usize]));
        }
        Ok(())
    }

    /// A fresh row adopts engine-held pages as its protected prefix (a prefix-tree hit).
    pub fn map_prefix(&mut self, req: &mut Req, indices: &[i32]) -> Result<()> {
        let ps = self.cfg.page_size;
        let max = self.cfg.max_context_len;
        self.owned_pool()?;
        req.validate(&self.cfg)?;
        let row = req.require_row()?;
        let n = indices.len();
        if req.kv_allocated_len != 0 {
            bail!(InvalidArg, "map_prefix needs a fresh row: kv_allocated_len {}", req.kv_allocated_len);
        }
        if !n.is_multiple_of(ps as usize) || n > max as usize {
            bail!(InvalidArg, "n_tokens {n} must be a multiple of page_size {ps} and <= max_context_len {max}");
        }
        let pages = prefix_pages(self.owned_pool_mut()?, ps, indices)?;
        self.check_record(req)?;
        self.guard_session_row(row)?;
        let pool = self.owned_pool_mut()?;
        check_held(pool, &pages)?;
        let n = n as u32;
        pool.map_held_prefix(row, pages);
        (req.kv_allocated_len, req.kv_committed_len, req.cache_protected_len) = (n, n, n);
        Ok(())
    }

    /// The row's pages `[protected, new)` become engine-held (inserted in the engine's tree).
    pub fn publish_prefix(&mut self, req: &mut Req, new_protected: u32) -> Result<()> {
        let ps = self.cfg.page_size;
        self.owned_pool()?;
        req.validate(&self.cfg)?;
        let row = req.require_row()?;
        if !new_protected.is_multiple_of(ps) || new_protected > req.kv_committed_len {
            bail!(
                InvalidArg,
                "new_protected_len {new_protected} must be a multiple of page_size {ps} and <= kv_committed_len {}",
                req.kv_committed_len
            );
        }
        self.check_record(req)?;
        keep_protected("new_protected_len", new_protected, req.cache_protected_len, "a prefix never shrinks")?;
        self.guard_session_row(row)?;
        let pool = self.owned_pool_mut()?;
        let r = pool.row_mut(row);
        let (lo, hi) = ((r.protected / ps) as usize, (new_protected / ps) as usize);
        let newly: Vec<u32> = r.pages[lo..hi].to_vec();
        r.protected = new_protected;
        for &p in &newly {
            pool.pages.set_held(p, 1);
        }
        if let Some(s) = pool.swa.as_mut() {
            // The SWA pages go to the engine with their full pages (0 where the window passed).
            for (&p, &id) in newly.iter().zip(&s.rows[row as usize].ids[lo..hi]) {
                s.held[p as usize] = id;
            }
        }
        req.cache_protected_len = new_protected;
        Ok(())
    }

    /// Copies `req_to_token[row, start..end)`: the full pool's token slots, or with `swa`
    /// the SWA pool's (0 for a position the window passed).
    pub fn row_indices(&self, row: u32, start: u32, end: u32, swa: bool, out: &mut [i32]) -> Result<()> {
        let pool = self.owned_pool()?;
        let side = swa_side(pool, swa)?;
        if start > end {
            bail!(InvalidArg, "range [{start}, {end}) runs backwards");
        }
        let r = pool.row(row)?;
        if end > r.len {
            bail!(InvalidArg, "range [{start}, {end}) outside the {} tokens row {row} maps", r.len);
        }
        let ps = self.cfg.page_size;
        let Some(s) = side else {
            for (o, p) in out.iter_mut().zip(start..end) {
                *o = token_slot(&r.pages, ps, p);
            }
            return Ok(());
        };
        let ids = &s.rows[row as usize].ids;
        for (o, p) in out.iter_mut().zip(start..end) {
            *o = match ids[(p / ps) as usize] {
                0 => 0,
                _ => token_slot(ids, ps, p),
            };
        }
        Ok(())
    }

    /// Pool occupancy. External mode knows no pool: only the rows' count, the sessions and
    /// the counters are filled, the pool's fields are 0.
    #[inline]
    pub fn stats(&self) -> Result<Stats> {
        let Ok(pool) = self.owned_pool() else {
            return Ok(Stats {
                total_rows: self.cfg.num_rows,
                sessions: self.slots.len() as u64,
                trimmed_tokens: self.trimmed_tokens,
                tail_freed_tokens: self.tail_freed_tokens,
                finishes_past_committed: self.finishes_past_committed,
                ..Stats::default()
            });
        };
        let a = pool.allocator();
        let (total, free) = (a.total_pages() as u64, a.free_pages() as u64);
        Ok(Stats {
            total_pages: total,
            free_pages: free,
            used_pages: total - 1 - free,
            total_rows: pool.total_rows(),
            free_rows: pool.free_rows(),
            sessions: self.slots.len() as u64,
            trimmed_tokens: self.trimmed_tokens,
            tail_freed_tokens: self.tail_freed_tokens,
            finishes_past_committed: self.finishes_past_committed,
            ..swa_stats(pool)
        })
    }

    /// Starts recording which rows change, for a device copy of `req_to_token`; every row in
    /// use counts as changed.
    pub fn track_row_changes(&mut self) -> Result<()> {
        let pool = self.owned_pool_mut()?;
        let mut dirty = Dirty::new(pool.total_rows())?;
        for (row, r) in pool.rows.iter().enumerate() {
            if let Some(r) = &r.in_use {
                dirty.mark(row as u32, 0, r.len);
            }
        }
        pool.dirty = Some(dirty);
        Ok(())
    }

    /// Hands `upload(row, start, indices)` every span of token indices mapped anew since the
    /// last call (`indices` = `req_to_token[row, start..start + indices.len()]`), once.
    pub fn drain_row_changes(&mut self, mut upload: impl FnMut(u32, u32, &[i32]) -> Result<()>) -> Result<()> {
        let ps = self.cfg.page_size;
        let pool = self.owned_pool_mut()?;
        let Some(mut dirty) = pool.dirty.take() else { return Ok(()) };
        let mut spans = Vec::new();
        dirty.drain(|r| pool.in_use(r).map_or(0, |r| r.len), |r, lo, hi| spans.push((r, lo, hi)));
        pool.dirty = Some(dirty);
        let mut buf = Vec::new();
        for (i, &(row, lo, hi)) in spans.iter().enumerate() {
            let r = pool.in_use(row).expect("clipped to rows in use");
            buf.clear();
            buf.extend((lo..hi).map(|p| token_slot(&r.pages, ps, p)));
            if let Err(e) = upload(row, lo, &buf) {
                // What did not reach the device is still owed to it.
                for &(row, lo, hi) in &spans[i..] {
                    pool.mapped(row, lo, hi);
                }
                return Err(e);
            }
        }
        Ok(())
    }

    /// FlashInfer's paged-KV layout for `rows`: how many page ids it takes.
    pub fn flashinfer_len(&self, rows: &[i32], swa: bool) -> Result<usize> {
        let pool = self.owned_pool()?;
        swa_side(pool, swa)?;
        if let Some(bad) = rows.iter().find(|&&r| r < 0 || r as u32 >= pool.total_rows()) {
            bail!(InvalidArg, "row {bad} out of range [0, {})", pool.total_rows());
        }
        let mut total = 0usize;
        for &row in rows {
            total += pages_for(pool.row(row as u32)?.len, self.cfg.page_size) as usize;
        }
        Ok(total)
    }

    /// Fills the layout (with `swa`, the SWA pool's page ids, 0 where the window passed); the
    /// slices are sized by the caller from `flashinfer_len`.
    pub fn flashinfer_fill(
        &self,
        rows: &[i32],
        swa: bool,
        indptr: &mut [i32],
        indices: &mut [i32],
        last_page_len: &mut [i32],
    ) {
        let pool = self.owned_pool().expect("checked by flashinfer_len");
        let side = swa_side(pool, swa).expect("checked by flashinfer_len");
        let ps = self.cfg.page_size;
        let mut at = 0usize;
        indptr[0] = 0;
        for (i, &row) in rows.iter().enumerate() {
            let r = pool.row(row as u32).expect("checked by flashinfer_len");
            let n = pages_for(r.len, ps) as usize;
            let ids = side.map_or(&r.pages[..], |s| &s.rows[row as usize].ids[..]);
            for (o, &p) in indices[at..at + n].iter_mut().zip(ids) {
                *o = p as i32;
            }
            at += n;
            indptr[i + 1] = at as i32;
            last_page_len[i] = if n == 0 { 0 } else { (r.len - (n as u32 - 1) * ps) as i32 };
        }
    }
}

/// The SWA side a view asks for: `None` for the full pool; `Unsupported` for the SWA pool of
/// a cache without one.
fn swa_side(pool: &OwnedPool, swa: bool) -> Result<Option<&SwaSide>> {
    match (swa, pool.swa.as_ref()) {
        (false, _) => Ok(None),
        (true, Some(s)) => Ok(Some(s)),
        (true, None) => bail!(Unsupported, "no SWA pool: the cache was created with swa_num_token_slots 0"),
    }
}

/// The SWA pool's occupancy; zeros without one.
fn swa_stats(pool: &OwnedPool) -> Stats {
    let Some(s) = pool.swa.as_ref() else { return Stats::default() };
    let (total, free) = (s.alloc.total_pages() as u64, s.alloc.free_pages() as u64);
    Stats { swa_total_pages: total, swa_free_pages: free, swa_used_pages: total - 1 - free, ..Stats::default() }
}

/// The pages of a prefix given as token indices: whole pages, position `k` at offset
/// `k % ps` of its page, each page once.
pub(super) fn prefix_pages(pool: &mut OwnedPool, ps: u32, indices: &[i32]) -> Result<Vec<u32>> {
    let mut pages = Vec::with_capacity(indices.len() / ps as usize);
    for (pos, &i) in indices.iter().enumerate() {
        let page = page_of(pool, i)?;
        let expected = pages.last().copied().filter(|_| pos % ps as usize != 0).unwrap_or(page);
        if page != expected || i as u32 % ps != pos as u32 % ps {
            bail!(InvalidArg, "indices[{pos}] = {i} is not page-structured (page {page}, offset {})", i as u32 % ps);
        }
        if pos % ps as usize == 0 {
            pages.push(page);
        }
    }
    let mut sorted = std::mem::take(&mut pool.scratch);
    sorted.clear();
    sorted.extend_from_slice(&pages);
    sorted.sort_unstable();
    let twice = sorted.windows(2).find(|w| w[0] == w[1]).map(|w| w[0]);
    pool.scratch = sorted;
    if let Some(p) = twice {
        bail!(InvalidArg, "page {p} appears twice in the prefix");
    }
    Ok(pages)
}

/// `State` unless every page of a prefix is engine-held.
pub(super) fn check_held(pool: &OwnedPool, pages: &[u32]) -> Result<()> {
    for &p in pages {
        if pool.pages.held_maps(p).is_none() {
            bail!(State, "page {p} is not engine-held ({})", not_held(pool, p));
        }
    }
    Ok(())
}

impl OwnedPool {
    /// Maps engine-held `pages` (checked by `check_held`) as the protected prefix of `row`,
    /// which maps nothing yet; the row's SWA cursor stays.
    pub(super) fn map_held_prefix(&mut self, row: u32, pages: Vec<u32>) {
        for &p in &pages {
            let maps = self.pages.held_maps(p).expect("checked engine-held");
            self.pages.set_held(p, maps + 1);
        }
        let n = pages.len() as u32 * self.ps;
        if let Some(s) = self.swa.as_mut() {
            let sr = &mut s.rows[row as usize];
            sr.ids.clear();
            sr.ids.extend(pages.iter().map(|&p| s.held[p as usize]));
            sr.passed = (0, 0);
        }
        let swa_cursor = self.row_mut(row).swa_cursor;
        *self.row_mut(row) =
            super::owned::Row { pages: super::page_list::PageList::new(pages), len: n, protected: n, swa_cursor };
        self.mapped(row, 0, n);
    }
}

/// The distinct pages of `indices`, ascending, into `pages`; every one must be engine-held
/// and mapped by no row.
fn distinct_held_pages(pool: &OwnedPool, indices: &[i32], pages: &mut Vec<u32>) -> Result<()> {
    pages.clear();
    for &i in indices {
        pages.push(page_of(pool, i)?);
    }
    pages.sort_unstable();
    pages.dedup();
    for &p in pages.iter() {
        match pool.pages.held_maps(p) {
            Some(0) => {}
            Some(maps) => bail!(State, "page {p} is still mapped by {maps} rows"),
            None if not_held(pool, p) == "free" => bail!(State, "page {p} is already free (double free)"),
            None => bail!(State, "page {p} is owned by a row"),
        }
    }
    Ok(())
}

/// What a page that is not engine-held is: "free" or "owned by a row" (an error's words: the
/// free stack is searched).
#[cold]
fn not_held(pool: &OwnedPool, page: u32) -> &'static str {
    if pool.pages.free_stack().any(|&p| p == page) {
        "free"
    } else {
        "owned by a row"
    }
}

/// The page an engine-supplied token index falls in; page 0 and indices past the pool are
/// refused.
fn page_of(pool: &OwnedPool, index: i32) -> Result<u32> {
    let ps = pool.ps;
    let total = pool.allocator().total_pages();
    match u32::try_from(index) {
        Ok(i) if i / ps >= 1 && i / ps < total => Ok(i / ps),
        _ => bail!(
            InvalidArg,
            "token index {index} is not in a usable page: valid indices are [{ps}, {}) (pages [1, {total}); \
             page 0, indices [0, {ps}), is padding)",
            total as u64 * ps as u64
        ),
    }
}
