//! The per-step calls of a running batch: one call extends (or commits) every request by its
//! own count. All or nothing: every request is checked — as its single call would check it,
//! plus no row twice — and applied in turn; the first that fails (the pool's capacity for the
//! batch so far included) undoes the ones before it, so a failing call changes nothing. An
//! error names the request's position (`reqs[17]: ...`).

use super::cache::{Backend, Cache};
use super::error::{bail, Error, Result};
use super::owned::{OwnedPool, Row, RowRecord};
use super::page::{div_rem, pages_for, token_slot};
use super::req::{Config, Req};
use super::row_meta::RowMeta;

impl Error {
    /// The same error, its message prefixed (a batch names the request's position).
    pub(crate) fn at(self, prefix: impl std::fmt::Display) -> Error {
        let p = |m: String| format!("{prefix}: {m}");
        match self {
            Error::NullArg(m) => Error::NullArg(p(m)),
            Error::InvalidArg(m) => Error::InvalidArg(p(m)),
            Error::OutOfMemory(m) => Error::OutOfMemory(p(m)),
            Error::NotFound(m) => Error::NotFound(p(m)),
            Error::State(m) => Error::State(p(m)),
            Error::Callback(m) => Error::Callback(p(m)),
            Error::Cuda(m) => Error::Cuda(p(m)),
            Error::Unsupported(m) => Error::Unsupported(p(m)),
            Error::Internal(m) => Error::Internal(p(m)),
        }
    }
}

impl Cache {
    /// The checks `alloc_extend(req, n)` runs: the row, and the length it will map.
    #[inline(always)]
    fn check_extend(&self, cfg: &Config, pool: &OwnedPool, req: &Req, n: u32) -> Result<(u32, u32)> {
        let new_len = req.allocated as u64 + n as u64;
        match plainly_current(cfg, pool, req, new_len <= cfg.max_context_len as u64) {
            Some(row) => Ok((row, new_len as u32)),
            None => self.check_extend_in_order(pool, req, n),
        }
    }

    /// The checks `commit(req, n)` runs: the row, and the committed length after it.
    #[inline(always)]
    fn check_commit(&self, cfg: &Config, pool: &OwnedPool, req: &Req, n: u32) -> Result<(u32, u32)> {
        let committed = req.committed as u64 + n as u64;
        match plainly_current(cfg, pool, req, committed <= req.allocated as u64) {
            Some(row) => Ok((row, committed as u32)),
            None => self.check_commit_in_order(pool, req, n),
        }
    }

    /// `check_extend`, each check in turn.
    #[inline(never)]
    fn check_extend_in_order(&self, pool: &OwnedPool, req: &Req, n: u32) -> Result<(u32, u32)> {
        req.validate(&self.cfg)?;
        let row = req.require_row()?;
        let max = self.cfg.max_context_len;
        let new_len = match req.allocated.checked_add(n) {
            Some(l) if l <= max => l,
            _ => bail!(InvalidArg, "kv_allocated_len {} + n_tokens {n} > max_context_len {max}", req.allocated),
        };
        self.check_record_in(Some(pool), req)?;
        self.guard_idle_session_row(row)?;
        Ok((row, new_len))
    }

    /// `check_commit`, each check in turn.
    #[inline(never)]
    fn check_commit_in_order(&self, pool: &OwnedPool, req: &Req, n: u32) -> Result<(u32, u32)> {
        req.validate(&self.cfg)?;
        let row = req.require_row()?;
        let committed = match req.committed.checked_add(n) {
            Some(c) if c <= req.allocated => c,
            _ => bail!(
                InvalidArg,
                "kv_committed_len {} + n_tokens {n} > kv_allocated_len {}",
                req.committed,
                req.allocated
            ),
        };
        self.check_record_in(Some(pool), req)?;
        self.guard_idle_session_row(row)?;
        Ok((row, committed))
    }

    /// Maps `n` more positions: the partial last page first, then whole new pages; with
    /// `out`, writes the new positions' token slots there (`out.len() == n`).
    #[inline]
    pub fn alloc_extend(&mut self, req: &mut Req, n: u32, mut out: Option<&mut [i32]>) -> Result<()> {
        let (cfg, old) = (self.cfg, req.allocated);
        if let Backend::Owned(pool) = &mut self.pool {
            let slots = out.as_deref_mut();
            let plain = match pool.swa.is_some() {
                true => extend_plainly::<true>(&cfg, pool, req, n, slots, None),
                false => extend_plainly::<false>(&cfg, pool, req, n, slots, None),
            };
            if plain.is_some() {
                pool.mapped(req.row as u32, old, req.allocated);
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
            write_slots(&r.pages, ps, req.allocated, out);
        }
        pool.mapped(row, req.allocated, new_len);
        req.allocated = new_len;
        Ok(())
    }

    /// Marks `n` more allocated tokens as final.
    #[inline]
    pub fn commit(&mut self, req: &mut Req, n: u32) -> Result<()> {
        let (_, committed) = self.check_commit(&self.cfg, self.owned_pool()?, req, n)?;
        req.committed = committed;
        Ok(())
    }

    /// `alloc_extend(reqs[i], n_tokens[i])` for every i, all or nothing; with `out`, every
    /// newly assigned token slot, request after request (`out.len()` >= their sum).
    ///
    /// One pass: each request is checked, in the order its single call checks it, and extended
    /// at once. A request that fails undoes the ones before it, newest first, so each pool's
    /// free stack is back exactly as it was (a failing batch changes nothing: the undo is
    /// the rare path, and the common one reads each request once).
    pub fn alloc_extend_batch(&mut self, reqs: &mut [Req], n_tokens: &[u32], out: Option<&mut [i32]>) -> Result<()> {
        self.require_owned()?;
        let total: u64 = n_tokens.iter().map(|&n| n as u64).sum();
        if let Some(out) = out.as_deref() {
            if (out.len() as u64) < total {
                bail!(InvalidArg, "out_cap {} < the {total} token slots the batch assigns", out.len());
            }
        }
        // The slots are written as each request is extended; a failing batch puts back what
        // out_loc held.
        let mut out = out.map(|o| &mut o[..total as usize]);
        if let Some(o) = out.as_deref() {
            self.batch_marks.save_out(o)?;
        }
        let stamp =
            self.batch_marks.begin(self.pool.owned().expect("owned checked").rows.iter().map(|r| &r.meta.batch));
        let mut taken = 0u64;
        let cfg = self.cfg;
        let ahead = Ahead::extends(self.pool.owned().expect("owned checked"), reqs);
        let (mut at, mut i) = (0usize, 0usize);
        while i < reqs.len() {
            // A decode step's requests, each with its row's record looked up once
            // (`extend_plainly`).
            if let Backend::Owned(pool) = &mut self.pool {
                let run = Run { cfg: &cfg, ahead, stamp };
                match pool.swa.is_some() {
                    true => run.extend::<true>(pool, reqs, n_tokens, &mut out, (&mut i, &mut at, &mut taken)),
                    false => run.extend::<false>(pool, reqs, n_tokens, &mut out, (&mut i, &mut at, &mut taken)),
                }
            }
            if i == reqs.len() {
                break;
            }
            // Any other request: every check in turn.
            ahead.load(self.pool.owned().expect("owned checked"), reqs, n_tokens, i);
            let (req, n) = (&mut reqs[i], n_tokens[i]);
            let slots = out.as_deref_mut().map(|o| &mut o[at..at + n as usize]);
            if let Err(e) = self.extend_in_batch_in_full(&cfg, req, n, slots, stamp, i, &mut taken) {
                self.undo_extends(&mut reqs[..i], &n_tokens[..i]);
                if let Some(o) = out {
                    o.copy_from_slice(&self.batch_marks.saved_out);
                }
                return Err(e);
            }
            at += n as usize;
            i += 1;
        }
        let pool = self.pool.owned_mut().expect("owned checked");
        if pool.dirty.is_some() {
            for (req, &n) in reqs.iter().zip(n_tokens) {
                pool.mapped(req.row as u32, req.allocated - n, req.allocated);
            }
        }
        Ok(())
    }

    /// `reqs[i]`'s part of `alloc_extend_batch`, every case and every check in turn: checked,
    /// marked, extended. `taken` counts the pages the batch took before it (for the error's
    /// count of the whole batch's).
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    fn extend_in_batch_in_full(
        &mut self,
        cfg: &Config,
        req: &mut Req,
        n: u32,
        slots: Option<&mut [i32]>,
        stamp: u32,
        i: usize,
        taken: &mut u64,
    ) -> Result<()> {
        // Marked first: an earlier request on the same row has extended it already, and its
        // checks would then name the length rather than the row named twice.
        let pool = self.pool.owned().expect("owned checked");
        mark_row(&pool.rows, req.row, stamp, i)?;
        let (row, new_len) = self.check_extend(cfg, pool, req, n).map_err(|e| e.at(format_args!("reqs[{i}]")))?;
        let ps = cfg.page_size;
        let pool = self.pool.owned_mut().expect("owned checked");
        let need = pages_for(new_len, ps) - pool.row_mut(row).pages.len() as u32;
        if need > 0 {
            let pages = *taken + need as u64;
            let free = pool.pages.free_pages();
            if need > free {
                return Err(batch_short_of_pages(i, n, pages, free as u64 + *taken));
            }
            if let Some(s) = pool.swa.as_ref() {
                let free = s.alloc.free_pages() as u64 + *taken;
                if pages > free {
                    bail!(
                        OutOfMemory,
                        "reqs[{i}]: n_tokens {n}: the batch up to here: {pages} SWA pages needed, {free} free"
                    );
                }
            }
            pool.grow(row, need).map_err(|e| e.at(format_args!("reqs[{i}]")))?;
            *taken = pages;
        }
        let r = pool.row_mut(row);
        if let Some(slots) = slots {
            write_slots(&r.pages, ps, req.allocated, slots);
        }
        r.len = new_len;
        req.allocated = new_len;
        Ok(())
    }

    /// Undoes the extends of `reqs` (each extended by its `n_tokens`), newest first.
    #[cold]
    #[inline(never)]
    fn undo_extends(&mut self, reqs: &mut [Req], n_tokens: &[u32]) {
        let ps = self.cfg.page_size;
        let pool = self.pool.owned_mut().expect("owned checked");
        for (req, &n) in reqs.iter_mut().zip(n_tokens).rev() {
            let (row, old) = (req.row as u32, req.allocated - n);
            pool.ungrow(row, pages_for(old, ps) as usize);
            pool.row_mut(row).len = old;
            req.allocated = old;
        }
    }

    /// `commit(reqs[i], n_tokens[i])` for every i, all or nothing: each request is checked
    /// and committed in turn; one that fails undoes those before it.
    pub fn commit_batch(&mut self, reqs: &mut [Req], n_tokens: &[u32]) -> Result<()> {
        self.require_owned()?;
        let stamp =
            self.batch_marks.begin(self.pool.owned().expect("owned checked").rows.iter().map(|r| &r.meta.batch));
        let pool = self.pool.owned().expect("owned checked");
        let cfg = self.cfg;
        let swa = pool.swa.is_some();
        // The table as a slice held for the loop: read through the pool, its bounds were loaded
        // again after every mark's store.
        let rows = &pool.rows[..];
        let ahead = Ahead::commits(pool, reqs);
        for i in 0..reqs.len().min(n_tokens.len()) {
            ahead.load(pool, reqs, n_tokens, i);
            let (req, n) = (&mut reqs[i], n_tokens[i]);
            // The rule, with the row's record looked up once: `plainly_current` and the mark.
            let row = req.row as u32 as usize;
            if let Some(RowRecord { meta: m, in_use: Some(r) }) = rows.get(row) {
                let committed = req.committed as u64 + n as u64;
                if m.batch.get().0 != stamp
                    && committed <= req.allocated as u64
                    && plainly_matches(&cfg, req, r, m, swa)
                {
                    m.batch.set((stamp, i as u32));
                    req.committed = committed as u32;
                    continue;
                }
            }
            let checked = mark_row(rows, req.row, stamp, i)
                .and_then(|_| self.check_commit(&cfg, pool, req, n).map_err(|e| e.at(format_args!("reqs[{i}]"))));
            match checked {
                Ok((_, committed)) => req.committed = committed,
                Err(e) => {
                    for (req, &n) in reqs[..i].iter_mut().zip(n_tokens) {
                        req.committed -= n;
                    }
                    return Err(e);
                }
            }
        }
        Ok(())
    }
}

/// A batch extend's run of requests that `extend_plainly` serves.
struct Run<'a> {
    cfg: &'a Config,
    ahead: Ahead,
    stamp: u32,
}

impl Run<'_> {
    /// `extend_plainly` on `reqs[i..]`, up to the first request it leaves to the checks in
    /// order (or the end), moving `(i, at, taken)` (the request, its first slot in `out`, the
    /// pages taken so far) past each one served. `SWA` says whether there is an SWA pool,
    /// decided once for the run, so a model without one pays nothing for it.
    #[inline(always)]
    fn extend<const SWA: bool>(
        &self,
        pool: &mut OwnedPool,
        reqs: &mut [Req],
        n_tokens: &[u32],
        out: &mut Option<&mut [i32]>,
        (i, at, taken): (&mut usize, &mut usize, &mut u64),
    ) {
        while *i < reqs.len() {
            self.ahead.load(pool, reqs, n_tokens, *i);
            let n = n_tokens[*i];
            let slots = out.as_deref_mut().map(|o| &mut o[*at..*at + n as usize]);
            let mark = Some((self.stamp, *i as u32));
            let Some(need) = extend_plainly::<SWA>(self.cfg, pool, &mut reqs[*i], n, slots, mark) else {
                return;
            };
            *taken += need as u64;
            *at += n as usize;
            *i += 1;
        }
    }
}

/// The rule of an extend, done with the row's record looked up once: a request that passes
/// every check at once (`plainly_current`'s, and with `mark` = (stamp, position), no earlier
/// request of the batch on its row) and needs at most one page (a decode step's), with an SWA
/// page beside it when there is an SWA pool (`SWA`, which the caller knows). Returns the pages
/// taken, or `None` having changed nothing: the caller then takes the path that checks in order
/// and does every case.
#[inline(always)]
fn extend_plainly<const SWA: bool>(
    cfg: &Config,
    pool: &mut OwnedPool,
    req: &mut Req,
    n: u32,
    slots: Option<&mut [i32]>,
    mark: Option<(u32, u32)>,
) -> Option<usize> {
    let row = req.row as u32 as usize;
    let Some(RowRecord { meta: m, in_use: Some(r) }) = pool.rows.get_mut(row) else {
        return None;
    };
    let new_len = req.allocated as u64 + n as u64;
    // Wraps for a req behind its row; the checks below then refuse it.
    let need = (pages_for(new_len.min(u32::MAX as u64) as u32, cfg.page_size) as usize).wrapping_sub(r.pages.len());
    let fine = mark.is_none_or(|(stamp, _)| m.batch.get().0 != stamp)
        && new_len <= cfg.max_context_len as u64
        && plainly_matches(cfg, req, r, m, SWA)
        && need <= 1;
    if !fine {
        return None;
    }
    // The row's last page before the extend: with the page taken (if any), it holds every
    // position the extend maps, so the slots come from the two ids in hand, not the list. (A
    // row maps pages_for(len) pages: the audit checks it.)
    debug_assert_eq!(r.pages.len(), pages_for(r.len, cfg.page_size) as usize);
    let last = r.pages.last_page();
    let taken = match (need, if SWA { pool.swa.as_mut() } else { None }) {
        (0, _) => None,
        (_, None) => Some(r.pages.take_one(&mut pool.pages)?),
        // A page and its SWA page, or neither: the SWA side is checked first, so that its
        // take, after the full side's, cannot fail.
        (_, Some(s)) => {
            let ids = &mut s.rows[row].ids;
            if ids.len() == ids.capacity() || s.alloc.free_pages() == 0 {
                return None;
            }
            let page = r.pages.take_one(&mut pool.pages)?;
            s.alloc.take_one(ids).expect("an SWA page and room, checked above");
            Some(page)
        }
    };
    if let Some(mark) = mark {
        m.batch.set(mark);
    }
    let ps = cfg.page_size;
    match (slots, taken) {
        // One token on the page it just took (a decode step's every page-size-th token): the
        // page's first slot. (A row maps pages_for(len) pages, an invariant the audit checks,
        // so one token needing a page starts it.)
        (Some([one]), Some(page)) => *one = (page * ps) as i32,
        // One token on the last page (the other steps').
        (Some([one]), None) => *one = (last * ps + div_rem(req.allocated, ps).1) as i32,
        (Some(slots), _) => write_step_slots(slots, ps, req.allocated, last, taken),
        (None, _) => {}
    }
    r.len = new_len as u32;
    req.allocated = new_len as u32;
    Some(need)
}

/// Whether `req` passes every check of an extend or a commit, `fits` being the call's
/// own (the new length): all of them at once, for the rule that a request is fine. `None`
/// when any fails, or the answer needs more than one compare each: the checks then run in
/// their documented order, which also says what is wrong. `cfg` is the caller's copy: a batch
/// keeps it in registers, where the cache's own would be read again after every mark.
#[inline(always)]
fn plainly_current(cfg: &Config, pool: &OwnedPool, req: &Req, fits: bool) -> Option<u32> {
    let row = u32::try_from(req.row).ok()?;
    let RowRecord { meta, in_use: Some(r) } = pool.rows.get(row as usize)? else { return None };
    let swa = pool.swa.is_some();
    (fits && plainly_matches(cfg, req, r, meta, swa)).then_some(row)
}

/// `plainly_current`'s checks of `req` against its row's record (`r` and `meta`, its
/// `RowRecord`; the SWA cursor too when there is an SWA pool, `swa`), the call's own aside:
/// the one statement of the rule that a request is fine, for the calls that look the records
/// up themselves. (Finding the records, and the protected length equal to the row's, make
/// `plainly_valid`'s row and alignment checks hold: `plainly_valid_lengths` does the rest.)
#[inline(always)]
fn plainly_matches(cfg: &Config, req: &Req, r: &Row, meta: &RowMeta, swa: bool) -> bool {
    req.plainly_valid_lengths(cfg)
        && (req.generation == 0 || req.generation == meta.generation)
        && req.allocated == r.len
        && req.protected == r.protected
        && (!swa || r.swa_cursor == req.swa)
        && !meta.idle_slot
}

/// How many requests ahead a batch starts loading what a request reads.
const AHEAD: usize = 8;

/// What a batch starts loading ahead of its requests, decided once per batch. With thousands
/// of rows a request's state is rarely in cache, and it is a chain of loads (the row's
/// record, then for an extend that takes a page the ends of its page lists): started early,
/// the loads overlap with the requests in between.
/// - `records`: the row's record, from `AHEAD` requests on (an extend's, from `2 * AHEAD`, so
///   that the lists' loads can follow). Only when the records outgrow a core's cache and the
///   batch's rows are not in order (`rows_in_order`): rows in order are streamed by the
///   hardware, and there these loads only cost instructions.
/// - `lists`: the ends of the lists an extend that takes a page writes, from `AHEAD` on, when
///   the lists outgrow the caches (`OwnedPool::lists_outgrow_cache`). Even rows in order have
///   their lists apart.
#[derive(Clone, Copy)]
struct Ahead {
    records: bool,
    lists: bool,
    /// How far ahead the records are loaded.
    records_at: usize,
}

impl Ahead {
    fn extends(pool: &OwnedPool, reqs: &[Req]) -> Ahead {
        let records = pool.records_outgrow_cache() && !rows_in_order(reqs);
        Ahead { records, lists: pool.lists_outgrow_cache(), records_at: 2 * AHEAD }
    }

    fn commits(pool: &OwnedPool, reqs: &[Req]) -> Ahead {
        let records = pool.records_outgrow_cache() && !rows_in_order(reqs);
        Ahead { records, lists: false, records_at: AHEAD }
    }

    /// Starts the loads for the requests ahead of `reqs[i]`.
    #[inline(always)]
    fn load(self, pool: &OwnedPool, reqs: &[Req], n_tokens: &[u32], i: usize) {
        // One test a request when there is nothing to load (state in cache).
        if !(self.records | self.lists) {
            return;
        }
        if self.records {
            if let Some(far) = reqs.get(i + self.records_at) {
                pool.preload_record(far.row as u32);
            }
        }
        if self.lists {
            if let (Some(near), Some(&n)) = (reqs.get(i + AHEAD), n_tokens.get(i + AHEAD)) {
                pool.preload_tail(near.row as u32, n);
            }
        }
    }
}

/// Whether a batch's rows look in order, judged from its ends: the last row is the first plus
/// or minus (n - 1), as when each request's row follows the one before it (rows handed out
/// in turn and never recycled). A hint only: a batch judged wrongly is as correct, and only
/// loads ahead, or not, in vain.
fn rows_in_order(reqs: &[Req]) -> bool {
    match (reqs.first(), reqs.last()) {
        (Some(a), Some(b)) => (b.row as i64 - a.row as i64).unsigned_abs() == reqs.len() as u64 - 1,
        _ => true,
    }
}

#[cold]
#[inline(never)]
fn batch_short_of_pages(i: usize, n: u32, pages: u64, free: u64) -> Error {
    Error::OutOfMemory(format!("reqs[{i}]: n_tokens {n}: the batch needs {pages} pages up to here, {free} free"))
}

/// Marks `reqs[i]`'s row for batch `stamp`; refuses a row an earlier request named. A row out
/// of range is left to the request's checks.
#[inline(always)]
fn mark_row(rows: &[RowRecord], row: i32, stamp: u32, i: usize) -> Result<()> {
    let Some(r) = rows.get(row as u32 as usize) else { return Ok(()) };
    let m = &r.meta.batch;
    let (seen, j) = m.get();
    if seen == stamp {
        bail!(InvalidArg, "reqs[{i}]: row {row} is also reqs[{j}]'s: one request per row in a batch");
    }
    m.set((stamp, i as u32));
    Ok(())
}

/// The token slots of positions `from..from + out.len()` of an extend that maps at most one
/// new page: the positions left on the row's last page (`last`, before the extend), then those
/// on the page it took (`taken`).
#[inline(never)]
fn write_step_slots(out: &mut [i32], ps: u32, from: u32, last: u32, taken: Option<u32>) {
    let off = div_rem(from, ps).1;
    let room = if off == 0 { 0 } else { (ps - off) as usize };
    let new = taken.unwrap_or(0) * ps;
    for (k, o) in out.iter_mut().enumerate() {
        *o = match k < room {
            true => (last * ps + off + k as u32) as i32,
            false => (new + (k - room) as u32) as i32,
        };
    }
}

/// The token slots of `row[from..from + out.len())`. One slot (a decode step's) inline; more
/// in a loop of their own.
#[inline(always)]
fn write_slots(pages: &[u32], ps: u32, from: u32, out: &mut [i32]) {
    match out {
        [one] => *one = token_slot(pages, ps, from),
        _ => write_slots_loop(pages, ps, from, out),
    }
}

#[inline(never)]
fn write_slots_loop(pages: &[u32], ps: u32, from: u32, out: &mut [i32]) {
    for (o, p) in out.iter_mut().zip(from..) {
        *o = token_slot(pages, ps, p);
    }
}

#[cfg(test)]
mod tests {
    use super::super::req::Config;
    use super::*;

    fn cache(pages: u64) -> Cache {
        let cfg = Config {
            page_size: 4,
            num_token_slots: pages * 4,
            num_rows: 4,
            max_context_len: 64,
            aligned_reuse: false,
            swa_num_token_slots: 0,
        };
        Cache::new_owned(cfg).unwrap()
    }

    fn rows(c: &mut Cache, n: usize) -> Vec<Req> {
        (0..n)
            .map(|_| {
                let mut r = Req::default();
                c.alloc_row(&mut r).unwrap();
                r
            })
            .collect()
    }

    #[test]
    fn extends_each_req_and_lists_the_new_slots_in_order() {
        let mut c = cache(16);
        let mut reqs = rows(&mut c, 2);
        c.alloc_extend(&mut reqs[0], 3, None).unwrap();
        let mut out = [0i32; 5];
        c.alloc_extend_batch(&mut reqs, &[2, 3], Some(&mut out)).unwrap();
        assert_eq!((reqs[0].allocated, reqs[1].allocated), (5, 3));
        let mut want = [0i32; 5];
        c.row_indices(reqs[0].row as u32, 3, 5, false, &mut want[..2]).unwrap();
        c.row_indices(reqs[1].row as u32, 0, 3, false, &mut want[2..]).unwrap();
        assert_eq!(out, want);
        c.commit_batch(&mut reqs, &[5, 1]).unwrap();
        assert_eq!((reqs[0].committed, reqs[1].committed), (5, 1));
    }

    /// Past 8 MiB of mapped page ids a batch extend loads its requests' list ends ahead: the
    /// same batch, slot for slot.
    #[test]
    fn a_batch_over_lists_larger_than_the_caches_is_the_same_batch() {
        // Page size 1: one long row maps 2^21 + 1024 pages, 8 MiB and 4 KiB of page ids.
        let long_len: u32 = (1 << 21) + 1024;
        let cfg = Config {
            page_size: 1,
            num_token_slots: long_len as u64 + 64,
            num_rows: 32,
            max_context_len: long_len,
            aligned_reuse: false,
            swa_num_token_slots: 0,
        };
        let mut c = Cache::new_owned(cfg).unwrap();
        let mut long = Req::default();
        c.alloc_row(&mut long).unwrap();
        // More requests than the loads run ahead (AHEAD), so some are loaded ahead.
        let mut reqs = rows(&mut c, 3 * AHEAD);
        assert!(!c.owned_pool().unwrap().lists_outgrow_cache());
        c.alloc_extend(&mut long, long_len, None).unwrap();
        assert!(c.owned_pool().unwrap().lists_outgrow_cache());
        let (ones, mut out) = (vec![1; reqs.len()], vec![0i32; reqs.len()]);
        c.alloc_extend_batch(&mut reqs, &ones, Some(&mut out)).unwrap();
        for (r, &slot) in reqs.iter().zip(&out) {
            let mut want = [0i32];
            c.row_indices(r.row as u32, 0, 1, false, &mut want).unwrap();
            assert_eq!((r.allocated, slot), (1, want[0]));
        }
        assert_eq!(c.check().unwrap().violations, 0);
    }

    #[test]
    fn rows_in_order_are_judged_from_the_batch_ends() {
        let reqs = |rows: &[i32]| rows.iter().map(|&row| Req { row, ..Req::default() }).collect::<Vec<_>>();
        assert!(rows_in_order(&reqs(&[3, 4, 5, 6])));
        assert!(rows_in_order(&reqs(&[6, 5, 4, 3])), "handed out again in reverse after a release");
        assert!(!rows_in_order(&reqs(&[3, 9, 1, 5])));
        assert!(rows_in_order(&reqs(&[7])) && rows_in_order(&[]));
    }

    /// Past 1 MiB of row records, a batch whose rows are not in order loads each request's
    /// record ahead: the same batches, slot for slot.
    #[test]
    fn a_batch_over_scattered_rows_past_the_cache_is_the_same_batch() {
        let cfg = Config {
            page_size: 4,
            num_token_slots: 4 * 4096,
            num_rows: 20_000,
            max_context_len: 64,
            aligned_reuse: false,
            swa_num_token_slots: 0,
        };
        let mut c = Cache::new_owned(cfg).unwrap();
        let mut reqs = rows(&mut c, 5 * AHEAD);
        // Rows out of order: every 7th of the 40, in turn.
        let n = reqs.len();
        reqs = (0..n).map(|i| reqs[i * 7 % n]).collect();
        assert!(c.owned_pool().unwrap().records_outgrow_cache() && !rows_in_order(&reqs));
        for round in 0..6u32 {
            let lens: Vec<u32> = (0..n as u32).map(|i| 1 + (i + round) % 3).collect();
            let mut out = vec![0i32; lens.iter().sum::<u32>() as usize];
            c.alloc_extend_batch(&mut reqs, &lens, Some(&mut out)).unwrap();
            let mut at = 0;
            for (r, &k) in reqs.iter().zip(&lens) {
                let mut want = vec![0i32; k as usize];
                c.row_indices(r.row as u32, r.allocated - k, r.allocated, false, &mut want).unwrap();
                assert_eq!(out[at..at + k as usize], want[..], "row {} in round {round}", r.row);
                at += k as usize;
            }
            c.commit_batch(&mut reqs, &lens).unwrap();
            assert!(reqs.iter().all(|r| r.committed == r.allocated));
        }
        assert_eq!(c.check().unwrap().violations, 0);
    }

    /// An extend that maps at most one new page takes its slots from the record's copy of the
    /// last page and the page it took: the slots the list names, one token or several, across
    /// trims and the pages taken again after them, in single calls and in batches.
    #[test]
    fn a_token_on_the_last_page_gets_the_slot_the_list_names() {
        let mut c = cache(48);
        let mut reqs = rows(&mut c, 2);
        // The last `k` slots of `r`'s row, as its list names them.
        let slots_of = |c: &Cache, r: &Req, k: u32| {
            let mut want = vec![0i32; k as usize];
            c.row_indices(r.row as u32, r.allocated - k, r.allocated, false, &mut want).unwrap();
            want
        };
        for keep in [9u32, 4, 0, 7] {
            for step in 0..10 {
                let mut one = [-1i32];
                c.alloc_extend(&mut reqs[0], 1, Some(&mut one)).unwrap();
                assert_eq!(one[..], slots_of(&c, &reqs[0], 1), "single call at {}", reqs[0].allocated);
                // Several tokens a request (a speculative step's), on the last page and past it.
                let lens = if step % 3 == 0 { [3, 2] } else { [1, 1] };
                let mut out = [-1i32; 5];
                let out = &mut out[..(lens[0] + lens[1]) as usize];
                c.alloc_extend_batch(&mut reqs, &lens, Some(out)).unwrap();
                let want = [slots_of(&c, &reqs[0], lens[0]), slots_of(&c, &reqs[1], lens[1])].concat();
                assert_eq!(out[..], want[..], "batch of {lens:?} at {}", reqs[0].allocated);
            }
            for r in reqs.iter_mut() {
                r.committed = r.allocated;
                c.free_tail(r, keep).unwrap();
                assert_eq!(r.allocated, keep);
            }
            assert_eq!(c.check().unwrap().violations, 0);
        }
    }

    /// With an SWA pool, a decode step's page maps the SWA page on top of the SWA free stack,
    /// as the path that checks in order maps it (`SwaAllocator::alloc`), and the rest of the
    /// step's tokens map nothing: token by token, across trims that leave the lists room.
    #[test]
    fn a_hybrid_step_maps_the_next_swa_page_beside_each_page_it_takes() {
        let mut c = twin(48, 48);
        let mut reqs = rows(&mut c, 2);
        let swa_top = |c: &Cache, k: usize| -> Vec<u32> {
            let stack: Vec<u32> = c.owned_pool().unwrap().swa.as_ref().unwrap().alloc.free_stack().copied().collect();
            stack.iter().rev().take(k).copied().collect()
        };
        for keep in [5u32, 2, 9] {
            for _ in 0..12 {
                // The requests that start a page, in order, take the SWA stack's top pages.
                let starting: Vec<usize> = (0..2).filter(|&i| reqs[i].allocated.is_multiple_of(4)).collect();
                let want_swa = swa_top(&c, starting.len());
                let before = c.stats().unwrap().swa_free_pages;
                let mut out = [-1i32; 2];
                c.alloc_extend_batch(&mut reqs, &[1, 1], Some(&mut out)).unwrap();
                assert_eq!(c.stats().unwrap().swa_free_pages, before - starting.len() as u64);
                for (k, &i) in starting.iter().enumerate() {
                    let (r, mut got) = (reqs[i], [0i32; 1]);
                    c.row_indices(r.row as u32, r.allocated - 1, r.allocated, true, &mut got).unwrap();
                    assert_eq!(got[0] as u32, want_swa[k] * 4, "reqs[{i}] at {}", r.allocated);
                }
                for (i, r) in reqs.iter().enumerate() {
                    let mut full = [0i32; 1];
                    c.row_indices(r.row as u32, r.allocated - 1, r.allocated, false, &mut full).unwrap();
                    assert_eq!(out[i], full[0]);
                }
                assert_eq!(c.check().unwrap().violations, 0);
            }
            for r in reqs.iter_mut() {
                r.committed = r.allocated;
                c.free_tail(r, keep).unwrap();
            }
        }
    }

    #[test]
    fn the_batch_stamp_wraps_without_forgetting_a_row_named_twice() {
        let mut c = cache(16);
        let mut reqs = rows(&mut c, 2);
        c.batch_marks.stamp = u32::MAX - 1;
        c.commit_batch(&mut reqs, &[0, 0]).unwrap();
        // The stamp wraps here: every row's mark starts again from 0.
        c.commit_batch(&mut reqs, &[0, 0]).unwrap();
        assert_eq!(c.batch_marks.stamp, 1);
        reqs[1] = reqs[0];
        let e = c.commit_batch(&mut reqs, &[0, 0]).unwrap_err();
        assert!(matches!(&e, Error::InvalidArg(m) if m.contains("reqs[1]: row 0 is also reqs[0]'s")), "{e}");
        assert_eq!(c.check().unwrap().violations, 0);
    }

    #[test]
    fn a_failing_batch_names_the_position_and_changes_nothing() {
        let mut c = cache(4); // 3 usable pages
        let mut reqs = rows(&mut c, 3);
        let before = reqs.clone();
        let free = c.stats().unwrap().free_pages;
        let e = c.alloc_extend_batch(&mut reqs, &[4, 4, 8], None).unwrap_err();
        assert!(matches!(&e, Error::OutOfMemory(m) if m.starts_with("reqs[2]: ")), "{e}");
        reqs[1] = reqs[0];
        let e = c.alloc_extend_batch(&mut reqs, &[1, 1, 1], None).unwrap_err();
        assert!(matches!(&e, Error::InvalidArg(m) if m.contains("reqs[1]: row 0 is also reqs[0]'s")), "{e}");
        let e = c.commit_batch(&mut reqs, &[0, 0, 1]).unwrap_err();
        assert!(matches!(&e, Error::InvalidArg(m) if m.starts_with("reqs[1]: ")), "{e}");
        reqs[1] = before[1];
        let e = c.commit_batch(&mut reqs, &[0, 0, 1]).unwrap_err();
        assert!(matches!(&e, Error::InvalidArg(m) if m.starts_with("reqs[2]: kv_committed_len 0")), "{e}");
        assert_eq!(reqs, before);
        assert_eq!(c.stats().unwrap().free_pages, free);
        let mut out = [0i32; 2];
        let e = c.alloc_extend_batch(&mut reqs, &[1, 1, 1], Some(&mut out)).unwrap_err();
        assert!(matches!(&e, Error::InvalidArg(m) if m.starts_with("out_cap 2")), "{e}");
        assert_eq!(c.check().unwrap().violations, 0);
    }

    fn twin(full_pages: u64, swa_pages: u64) -> Cache {
        let cfg = Config {
            page_size: 4,
            num_token_slots: full_pages * 4,
            num_rows: 4,
            max_context_len: 64,
            aligned_reuse: false,
            swa_num_token_slots: swa_pages * 4,
        };
        Cache::new_owned(cfg).unwrap()
    }

    /// Both caches hand out the same pages from here: each row's full and SWA slots agree
    /// after one more batch.
    fn same_from_here(a: &mut Cache, ra: &mut [Req], b: &mut Cache, rb: &mut [Req], n: &[u32]) {
        let total = n.iter().sum::<u32>() as usize;
        let (mut oa, mut ob) = (vec![0i32; total], vec![0i32; total]);
        a.alloc_extend_batch(ra, n, Some(&mut oa)).unwrap();
        b.alloc_extend_batch(rb, n, Some(&mut ob)).unwrap();
        assert_eq!(oa, ob);
        let swa = a.stats().unwrap().swa_total_pages > 0;
        for (x, y) in ra.iter().zip(rb.iter()) {
            assert_eq!(x, y);
            for view in [false, true].into_iter().filter(|&v| !v || swa) {
                let (mut sa, mut sb) = (vec![0i32; x.allocated as usize], vec![0i32; y.allocated as usize]);
                a.row_indices(x.row as u32, 0, x.allocated, view, &mut sa).unwrap();
                b.row_indices(y.row as u32, 0, y.allocated, view, &mut sb).unwrap();
                assert_eq!(sa, sb, "row {} (SWA view: {view})", x.row);
            }
        }
        assert_eq!(a.check().unwrap().violations, 0);
        assert_eq!(a.stats().unwrap(), b.stats().unwrap());
    }

    #[test]
    fn a_batch_failing_late_gives_back_what_it_took_in_order() {
        for swa in [0, 16] {
            // reqs[0] and reqs[1] take three pages (three SWA pages), then reqs[2] is refused.
            let (mut a, mut b) = (twin(16, swa), twin(16, swa));
            let (mut ra, mut rb) = (rows(&mut a, 3), rows(&mut b, 3));
            ra[2].allocated = 1;
            let before = ra.clone();
            let mut out = [-7i32; 11];
            let e = a.alloc_extend_batch(&mut ra, &[5, 4, 1], Some(&mut out)).unwrap_err();
            assert!(matches!(&e, Error::InvalidArg(m) if m.starts_with("reqs[2]: kv_allocated_len 1")), "{e}");
            assert_eq!(ra, before);
            assert_eq!(out, [-7; 11], "out_loc is put back");
            ra[2].allocated = 0;
            same_from_here(&mut a, &mut ra, &mut b, &mut rb, &[3, 6, 5]);
        }
    }

    /// Requests served by the plain extend take a page and its SWA page each; a later request
    /// that fails gives both back, and the two free stacks hand out the same pages after.
    #[test]
    fn a_failing_batch_gives_back_the_pages_and_swa_pages_its_plain_requests_took() {
        let (mut a, mut b) = (twin(16, 16), twin(16, 16));
        let (mut ra, mut rb) = (rows(&mut a, 3), rows(&mut b, 3));
        for (c, reqs) in [(&mut a, &mut ra), (&mut b, &mut rb)] {
            // Two pages, then one: each list keeps room for the page the next token takes.
            c.alloc_extend_batch(reqs, &[8, 8, 8], None).unwrap();
            for r in reqs.iter_mut() {
                r.committed = 8;
                c.free_tail(r, 4).unwrap();
            }
            let pool = c.owned_pool().unwrap();
            for r in reqs.iter() {
                let row = r.row as usize;
                let pages = &pool.rows[row].in_use.as_ref().unwrap().pages;
                let ids = &pool.swa.as_ref().unwrap().rows[row].ids;
                assert!(pages.len() < pages.capacity() && ids.len() < ids.capacity(), "room for the plain take");
            }
        }
        let before = ra.clone();
        ra[2].allocated = 5;
        let e = a.alloc_extend_batch(&mut ra, &[1, 1, 1], None).unwrap_err();
        assert!(matches!(&e, Error::InvalidArg(m) if m.starts_with("reqs[2]: kv_allocated_len 5")), "{e}");
        ra[2].allocated = 4;
        assert_eq!(ra, before);
        assert_eq!(a.stats().unwrap(), b.stats().unwrap());
        same_from_here(&mut a, &mut ra, &mut b, &mut rb, &[1, 1, 1]);
    }

    #[test]
    fn a_batch_short_of_swa_pages_names_the_batch_and_changes_nothing() {
        // 15 full pages free, 3 SWA pages: the fourth request's page is one too many.
        let (mut a, mut b) = (twin(16, 4), twin(16, 4));
        let (mut ra, mut rb) = (rows(&mut a, 4), rows(&mut b, 4));
        let e = a.alloc_extend_batch(&mut ra, &[1, 2, 3, 4], None).unwrap_err();
        assert!(
            matches!(&e, Error::OutOfMemory(m) if m == "reqs[3]: n_tokens 4: the batch up to here: 4 SWA pages needed, 3 free"),
            "{e}"
        );
        let e = a.alloc_extend_batch(&mut ra, &[1, 2, 3, 64], None).unwrap_err();
        assert!(
            matches!(&e, Error::OutOfMemory(m) if m == "reqs[3]: n_tokens 64: the batch needs 19 pages up to here, 15 free"),
            "{e}"
        );
        same_from_here(&mut a, &mut ra, &mut b, &mut rb, &[1, 2, 3, 0]);
    }

    #[test]
    fn a_row_named_twice_is_named_as_such_though_its_first_request_extended_it() {
        let mut c = twin(16, 0);
        let mut reqs = rows(&mut c, 2);
        reqs[1] = reqs[0];
        let e = c.alloc_extend_batch(&mut reqs, &[4, 4], None).unwrap_err();
        assert!(
            matches!(&e, Error::InvalidArg(m) if m == "reqs[1]: row 0 is also reqs[0]'s: one request per row in a batch"),
            "{e}"
        );
        assert_eq!(reqs[0].allocated, 0);
        assert_eq!(c.stats().unwrap().free_pages, 15);
    }
}
