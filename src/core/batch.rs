//! The per-step calls of a running batch: one call extends (or commits) every request by its
//! own count. All or nothing: every request is checked — as its single call would check it,
//! plus no row twice — and applied in turn; the first that fails (the pool's capacity for the
//! batch so far included) undoes the ones before it, so a failing call changes nothing. An
//! error names the request's position (`reqs[17]: ...`).

use super::batch_prefetch::BatchPrefetch;
use super::cache::{Backend, Cache};
use super::error::{bail, Error, Result};
use super::fast_extend::{fast_extend, write_slots};
use super::owned::{OwnedPool, RowRecord};
use super::page::pages_for;
use super::req::{Config, Req};
use super::step_checks::fast_matches;

impl Cache {
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
        let prefetch = BatchPrefetch::for_extends(self.pool.owned().expect("owned checked"), reqs);
        let (mut at, mut i) = (0usize, 0usize);
        while i < reqs.len() {
            // A decode step's requests, each with its row's record looked up once
            // (`fast_extend`).
            if let Backend::Owned(pool) = &mut self.pool {
                let run = FastExtendRun { cfg: &cfg, prefetch, stamp };
                match pool.swa.is_some() {
                    true => run.extend::<true>(pool, reqs, n_tokens, &mut out, (&mut i, &mut at, &mut taken)),
                    false => run.extend::<false>(pool, reqs, n_tokens, &mut out, (&mut i, &mut at, &mut taken)),
                }
            }
            if i == reqs.len() {
                break;
            }
            // Any other request: the slow path.
            prefetch.load(self.pool.owned().expect("owned checked"), reqs, n_tokens, i);
            let (req, n) = (&mut reqs[i], n_tokens[i]);
            let slots = out.as_deref_mut().map(|o| &mut o[at..at + n as usize]);
            if let Err(e) = self.extend_in_batch_slow(&cfg, req, n, slots, stamp, i, &mut taken) {
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
                pool.mapped(req.req_pool_idx as u32, req.kv_allocated_len - n, req.kv_allocated_len);
            }
        }
        Ok(())
    }

    /// `reqs[i]`'s part of `alloc_extend_batch`, on the slow path (every case, every check in turn): checked,
    /// marked, extended. `taken` counts the pages the batch took before it (for the error's
    /// count of the whole batch's).
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    fn extend_in_batch_slow(
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
        mark_row(&pool.rows, req.req_pool_idx, stamp, i)?;
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
            write_slots(&r.pages, ps, req.kv_allocated_len, slots);
        }
        r.len = new_len;
        req.kv_allocated_len = new_len;
        Ok(())
    }

    /// Undoes the extends of `reqs` (each extended by its `n_tokens`), newest first.
    #[cold]
    #[inline(never)]
    fn undo_extends(&mut self, reqs: &mut [Req], n_tokens: &[u32]) {
        let ps = self.cfg.page_size;
        let pool = self.pool.owned_mut().expect("owned checked");
        for (req, &n) in reqs.iter_mut().zip(n_tokens).rev() {
            let (row, old) = (req.req_pool_idx as u32, req.kv_allocated_len - n);
            pool.ungrow(row, pages_for(old, ps) as usize);
            pool.row_mut(row).len = old;
            req.kv_allocated_len = old;
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
        let has_swa_pool = pool.swa.is_some();
        // The table as a slice held for the loop: read through the pool, its bounds were loaded
        // again after every mark's store.
        let rows = &pool.rows[..];
        let prefetch = BatchPrefetch::for_commits(pool, reqs);
        for i in 0..reqs.len().min(n_tokens.len()) {
            prefetch.load(pool, reqs, n_tokens, i);
            let (req, n) = (&mut reqs[i], n_tokens[i]);
            // The rule, with the row's record looked up once: `fast_row` and the mark.
            let row = req.req_pool_idx as u32 as usize;
            if let Some(RowRecord { meta: m, in_use: Some(r) }) = rows.get(row) {
                let committed = req.kv_committed_len as u64 + n as u64;
                if m.batch.get().0 != stamp
                    && committed <= req.kv_allocated_len as u64
                    && fast_matches(&cfg, req, r, m, has_swa_pool)
                {
                    m.batch.set((stamp, i as u32));
                    req.kv_committed_len = committed as u32;
                    continue;
                }
            }
            let checked = mark_row(rows, req.req_pool_idx, stamp, i)
                .and_then(|_| self.check_commit(&cfg, pool, req, n).map_err(|e| e.at(format_args!("reqs[{i}]"))));
            match checked {
                Ok((_, committed)) => req.kv_committed_len = committed,
                Err(e) => {
                    for (req, &n) in reqs[..i].iter_mut().zip(n_tokens) {
                        req.kv_committed_len -= n;
                    }
                    return Err(e);
                }
            }
        }
        Ok(())
    }
}

/// A batch extend's run of requests that `fast_extend` serves.
struct FastExtendRun<'a> {
    cfg: &'a Config,
    prefetch: BatchPrefetch,
    stamp: u32,
}

impl FastExtendRun<'_> {
    /// `fast_extend` on `reqs[i..]`, up to the first request it leaves to the checks in
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
            self.prefetch.load(pool, reqs, n_tokens, *i);
            let n = n_tokens[*i];
            let slots = out.as_deref_mut().map(|o| &mut o[*at..*at + n as usize]);
            let mark = Some((self.stamp, *i as u32));
            let Some(need) = fast_extend::<SWA>(self.cfg, pool, &mut reqs[*i], n, slots, mark) else {
                return;
            };
            *taken += need as u64;
            *at += n as usize;
            *i += 1;
        }
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

#[cfg(test)]
mod tests {
    use super::super::test_caches::{cache, rows, twin};
    use super::*;

    #[test]
    fn extends_each_req_and_lists_the_new_slots_in_order() {
        let mut c = cache(16);
        let mut reqs = rows(&mut c, 2);
        c.alloc_extend(&mut reqs[0], 3, None).unwrap();
        let mut out = [0i32; 5];
        c.alloc_extend_batch(&mut reqs, &[2, 3], Some(&mut out)).unwrap();
        assert_eq!((reqs[0].kv_allocated_len, reqs[1].kv_allocated_len), (5, 3));
        let mut want = [0i32; 5];
        c.row_indices(reqs[0].req_pool_idx as u32, 3, 5, false, &mut want[..2]).unwrap();
        c.row_indices(reqs[1].req_pool_idx as u32, 0, 3, false, &mut want[2..]).unwrap();
        assert_eq!(out, want);
        c.commit_batch(&mut reqs, &[5, 1]).unwrap();
        assert_eq!((reqs[0].kv_committed_len, reqs[1].kv_committed_len), (5, 1));
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
                let (mut sa, mut sb) =
                    (vec![0i32; x.kv_allocated_len as usize], vec![0i32; y.kv_allocated_len as usize]);
                a.row_indices(x.req_pool_idx as u32, 0, x.kv_allocated_len, view, &mut sa).unwrap();
                b.row_indices(y.req_pool_idx as u32, 0, y.kv_allocated_len, view, &mut sb).unwrap();
                assert_eq!(sa, sb, "row {} (SWA view: {view})", x.req_pool_idx);
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
            ra[2].kv_allocated_len = 1;
            let before = ra.clone();
            let mut out = [-7i32; 11];
            let e = a.alloc_extend_batch(&mut ra, &[5, 4, 1], Some(&mut out)).unwrap_err();
            assert!(matches!(&e, Error::InvalidArg(m) if m.starts_with("reqs[2]: kv_allocated_len 1")), "{e}");
            assert_eq!(ra, before);
            assert_eq!(out, [-7; 11], "out_loc is put back");
            ra[2].kv_allocated_len = 0;
            same_from_here(&mut a, &mut ra, &mut b, &mut rb, &[3, 6, 5]);
        }
    }

    /// Requests served by the fast path take a page and its SWA page each; a later request
    /// that fails gives both back, and the two free stacks hand out the same pages after.
    #[test]
    fn a_failing_batch_gives_back_the_pages_and_swa_pages_its_fast_requests_took() {
        let (mut a, mut b) = (twin(16, 16), twin(16, 16));
        let (mut ra, mut rb) = (rows(&mut a, 3), rows(&mut b, 3));
        for (c, reqs) in [(&mut a, &mut ra), (&mut b, &mut rb)] {
            // Two pages, then one: each list keeps room for the page the next token takes.
            c.alloc_extend_batch(reqs, &[8, 8, 8], None).unwrap();
            for r in reqs.iter_mut() {
                r.kv_committed_len = 8;
                c.free_tail(r, 4).unwrap();
            }
            let pool = c.owned_pool().unwrap();
            for r in reqs.iter() {
                let row = r.req_pool_idx as usize;
                let pages = &pool.rows[row].in_use.as_ref().unwrap().pages;
                let ids = &pool.swa.as_ref().unwrap().rows[row].ids;
                assert!(pages.len() < pages.capacity() && ids.len() < ids.capacity(), "room for the fast path's take");
            }
        }
        let before = ra.clone();
        ra[2].kv_allocated_len = 5;
        let e = a.alloc_extend_batch(&mut ra, &[1, 1, 1], None).unwrap_err();
        assert!(matches!(&e, Error::InvalidArg(m) if m.starts_with("reqs[2]: kv_allocated_len 5")), "{e}");
        ra[2].kv_allocated_len = 4;
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
        assert_eq!(reqs[0].kv_allocated_len, 0);
        assert_eq!(c.stats().unwrap().free_pages, 15);
    }
}
