//! What a batch call starts loading ahead of its requests, where the rows' state outgrows
//! the caches.

use super::owned::OwnedPool;
use super::req::Req;

/// How many requests ahead a batch starts loading what a request reads.
pub(super) const PREFETCH_DISTANCE: usize = 8;

/// What a batch starts loading ahead of its requests, decided once per batch. With thousands
/// of rows a request's state is rarely in cache, and it is a chain of loads (the row's
/// record, then for an extend that takes a page the ends of its page lists): started early,
/// the loads overlap with the requests in between.
/// - `records`: the row's record, from `PREFETCH_DISTANCE` requests on (an extend's, from `2 * PREFETCH_DISTANCE`, so
///   that the lists' loads can follow). Only when the records outgrow a core's cache and the
///   batch's rows are not in order (`rows_in_order`): rows in order are streamed by the
///   hardware, and there these loads only cost instructions.
/// - `lists`: the ends of the lists an extend that takes a page writes, from `PREFETCH_DISTANCE` on, when
///   the lists outgrow the caches (`OwnedPool::lists_outgrow_cache`). Even rows in order have
///   their lists apart.
#[derive(Clone, Copy)]
pub(super) struct BatchPrefetch {
    records: bool,
    lists: bool,
    /// How far ahead the records are loaded.
    records_at: usize,
}

impl BatchPrefetch {
    pub(super) fn for_extends(pool: &OwnedPool, reqs: &[Req]) -> BatchPrefetch {
        let records = pool.records_outgrow_cache() && !rows_in_order(reqs);
        BatchPrefetch { records, lists: pool.lists_outgrow_cache(), records_at: 2 * PREFETCH_DISTANCE }
    }

    pub(super) fn for_commits(pool: &OwnedPool, reqs: &[Req]) -> BatchPrefetch {
        let records = pool.records_outgrow_cache() && !rows_in_order(reqs);
        BatchPrefetch { records, lists: false, records_at: PREFETCH_DISTANCE }
    }

    /// Starts the loads for the requests ahead of `reqs[i]`.
    #[inline(always)]
    pub(super) fn load(self, pool: &OwnedPool, reqs: &[Req], n_tokens: &[u32], i: usize) {
        // One test a request when there is nothing to load (state in cache).
        if !(self.records | self.lists) {
            return;
        }
        if self.records {
            if let Some(far) = reqs.get(i + self.records_at) {
                pool.preload_record(far.req_pool_idx as u32);
            }
        }
        if self.lists {
            if let (Some(near), Some(&n)) = (reqs.get(i + PREFETCH_DISTANCE), n_tokens.get(i + PREFETCH_DISTANCE)) {
                pool.preload_tail(near.req_pool_idx as u32, n);
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
        (Some(a), Some(b)) => (b.req_pool_idx as i64 - a.req_pool_idx as i64).unsigned_abs() == reqs.len() as u64 - 1,
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::super::cache::Cache;
    use super::super::req::Config;
    use super::super::test_caches::rows;
    use super::*;

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
            tier: Default::default(),
        };
        let mut c = Cache::new_owned(cfg).unwrap();
        let mut long = Req::default();
        c.alloc_row(&mut long).unwrap();
        // More requests than the loads run ahead (PREFETCH_DISTANCE), so some are loaded ahead.
        let mut reqs = rows(&mut c, 3 * PREFETCH_DISTANCE);
        assert!(!c.owned_pool().unwrap().lists_outgrow_cache());
        c.alloc_extend(&mut long, long_len, None).unwrap();
        assert!(c.owned_pool().unwrap().lists_outgrow_cache());
        let (ones, mut out) = (vec![1; reqs.len()], vec![0i32; reqs.len()]);
        c.alloc_extend_batch(&mut reqs, &ones, Some(&mut out)).unwrap();
        for (r, &slot) in reqs.iter().zip(&out) {
            let mut want = [0i32];
            c.row_indices(r.req_pool_idx as u32, 0, 1, false, &mut want).unwrap();
            assert_eq!((r.kv_allocated_len, slot), (1, want[0]));
        }
        assert_eq!(c.check().unwrap().violations, 0);
    }

    #[test]
    fn rows_in_order_are_judged_from_the_batch_ends() {
        let reqs =
            |rows: &[i32]| rows.iter().map(|&row| Req { req_pool_idx: row, ..Req::default() }).collect::<Vec<_>>();
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
            tier: Default::default(),
        };
        let mut c = Cache::new_owned(cfg).unwrap();
        let mut reqs = rows(&mut c, 5 * PREFETCH_DISTANCE);
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
                c.row_indices(r.req_pool_idx as u32, r.kv_allocated_len - k, r.kv_allocated_len, false, &mut want)
                    .unwrap();
                assert_eq!(out[at..at + k as usize], want[..], "row {} in round {round}", r.req_pool_idx);
                at += k as usize;
            }
            c.commit_batch(&mut reqs, &lens).unwrap();
            assert!(reqs.iter().all(|r| r.kv_committed_len == r.kv_allocated_len));
        }
        assert_eq!(c.check().unwrap().violations, 0);
    }
}
