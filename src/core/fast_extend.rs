//! An extend's fast path (see `step_checks`): a request the rule fits, served with its row's
//! record looked up once; and the token slots an extend writes, on either path.

use super::owned::{OwnedPool, RowRecord};
use super::page::{div_rem, pages_for, token_slot};
use super::req::{Config, Req};
use super::step_checks::fast_matches;

/// The rule of an extend, done with the row's record looked up once: a request that passes
/// every check at once (`fast_row`'s, and with `mark` = (stamp, position), no earlier
/// request of the batch on its row) and needs at most one page (a decode step's), with an SWA
/// page beside it when there is an SWA pool (`SWA`, which the caller knows). Returns the pages
/// taken, or `None` having changed nothing: the caller then takes the slow path, which does
/// every case.
#[inline(always)]
pub(super) fn fast_extend<const SWA: bool>(
    cfg: &Config,
    pool: &mut OwnedPool,
    req: &mut Req,
    n: u32,
    slots: Option<&mut [i32]>,
    mark: Option<(u32, u32)>,
) -> Option<usize> {
    let row = req.req_pool_idx as u32 as usize;
    let Some(RowRecord { meta: m, in_use: Some(r) }) = pool.rows.get_mut(row) else {
        return None;
    };
    let new_len = req.kv_allocated_len as u64 + n as u64;
    // Wraps for a req behind its row; the checks below then refuse it.
    let need = (pages_for(new_len.min(u32::MAX as u64) as u32, cfg.page_size) as usize).wrapping_sub(r.pages.len());
    let fine = mark.is_none_or(|(stamp, _)| m.batch.get().0 != stamp)
        && new_len <= cfg.max_context_len as u64
        && fast_matches(cfg, req, r, m, SWA)
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
        (Some([one]), None) => *one = (last * ps + div_rem(req.kv_allocated_len, ps).1) as i32,
        (Some(slots), _) => write_step_slots(slots, ps, req.kv_allocated_len, last, taken),
        (None, _) => {}
    }
    r.len = new_len as u32;
    req.kv_allocated_len = new_len as u32;
    Some(need)
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
pub(super) fn write_slots(pages: &[u32], ps: u32, from: u32, out: &mut [i32]) {
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
    use super::super::cache::Cache;
    use super::super::req::Req;
    use super::super::test_caches::{cache, rows, twin};

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
            c.row_indices(r.req_pool_idx as u32, r.kv_allocated_len - k, r.kv_allocated_len, false, &mut want).unwrap();
            want
        };
        for keep in [9u32, 4, 0, 7] {
            for step in 0..10 {
                let mut one = [-1i32];
                c.alloc_extend(&mut reqs[0], 1, Some(&mut one)).unwrap();
                assert_eq!(one[..], slots_of(&c, &reqs[0], 1), "single call at {}", reqs[0].kv_allocated_len);
                // Several tokens a request (a speculative step's), on the last page and past it.
                let lens = if step % 3 == 0 { [3, 2] } else { [1, 1] };
                let mut out = [-1i32; 5];
                let out = &mut out[..(lens[0] + lens[1]) as usize];
                c.alloc_extend_batch(&mut reqs, &lens, Some(out)).unwrap();
                let want = [slots_of(&c, &reqs[0], lens[0]), slots_of(&c, &reqs[1], lens[1])].concat();
                assert_eq!(out[..], want[..], "batch of {lens:?} at {}", reqs[0].kv_allocated_len);
            }
            for r in reqs.iter_mut() {
                r.kv_committed_len = r.kv_allocated_len;
                c.free_tail(r, keep).unwrap();
                assert_eq!(r.kv_allocated_len, keep);
            }
            assert_eq!(c.check().unwrap().violations, 0);
        }
    }

    /// With an SWA pool, a decode step's page maps the SWA page on top of the SWA free stack,
    /// as the slow path maps it (`SwaAllocator::alloc`), and the rest of the
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
                let starting: Vec<usize> = (0..2).filter(|&i| reqs[i].kv_allocated_len.is_multiple_of(4)).collect();
                let want_swa = swa_top(&c, starting.len());
                let before = c.stats().unwrap().swa_free_pages;
                let mut out = [-1i32; 2];
                c.alloc_extend_batch(&mut reqs, &[1, 1], Some(&mut out)).unwrap();
                assert_eq!(c.stats().unwrap().swa_free_pages, before - starting.len() as u64);
                for (k, &i) in starting.iter().enumerate() {
                    let (r, mut got) = (reqs[i], [0i32; 1]);
                    c.row_indices(r.req_pool_idx as u32, r.kv_allocated_len - 1, r.kv_allocated_len, true, &mut got)
                        .unwrap();
                    assert_eq!(got[0] as u32, want_swa[k] * 4, "reqs[{i}] at {}", r.kv_allocated_len);
                }
                for (i, r) in reqs.iter().enumerate() {
                    let mut full = [0i32; 1];
                    c.row_indices(r.req_pool_idx as u32, r.kv_allocated_len - 1, r.kv_allocated_len, false, &mut full)
                        .unwrap();
                    assert_eq!(out[i], full[0]);
                }
                assert_eq!(c.check().unwrap().violations, 0);
            }
            for r in reqs.iter_mut() {
                r.kv_committed_len = r.kv_allocated_len;
                c.free_tail(r, keep).unwrap();
            }
        }
    }
}
