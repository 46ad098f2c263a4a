//! The batch calls against the single calls they replace: random batches on one cache, the
//! same requests one by one on a twin cache of the same config. A batch that succeeds gives
//! the same slot indices, reqs and pool as the single calls; a batch that fails changes
//! nothing (reqs, pool, rows), and names the request's position.

// As in the library: every unsafe block says why it is sound.
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

use proptest::prelude::*;
use skv::skv_status::SKV_OK;
use skv::*;

const ROWS: usize = 8;
const MAX_CTX: u32 = 96;

fn new_cache(ps: u32, pages: u64) -> *mut skv_cache {
    let cfg = skv_cache_config {
        struct_size: std::mem::size_of::<skv_cache_config>() as u32,
        page_size: ps,
        num_token_slots: pages * ps as u64,
        num_rows: ROWS as u32,
        max_context_len: MAX_CTX,
        flags: 0,
        swa_num_token_slots: 0,
        ..Default::default()
    };
    let mut c = std::ptr::null_mut();
    // SAFETY: cfg and c are locals.
    assert_eq!(unsafe { skv_cache_new(&cfg, &mut c) }, SKV_OK);
    c
}

/// Everything observable: free pages, and every row's indices.
fn snapshot(c: *mut skv_cache, reqs: &[skv_req]) -> (u64, Vec<Vec<i32>>) {
    let mut s = std::mem::MaybeUninit::<skv_stats>::zeroed();
    // SAFETY: c is the caller's live handle; s is a local.
    assert_eq!(unsafe { skv_cache_stats(c, s.as_mut_ptr()) }, SKV_OK);
    let rows = reqs
        .iter()
        .map(|r| {
            let mut out = vec![0; r.kv_allocated_len as usize];
            // SAFETY: as above; out holds the kv_allocated_len indices asked for.
            let st = unsafe { skv_row_indices(c, r.req_pool_idx, 0, r.kv_allocated_len, out.as_mut_ptr()) };
            assert_eq!(st, SKV_OK);
            out
        })
        .collect();
    // SAFETY: skv_stats is plain integers, so the zeroed s is initialized whatever the call did.
    (unsafe { s.assume_init() }.free_pages, rows)
}

#[derive(Debug, Clone)]
struct Step {
    commit: bool,
    /// Positions into the rows (repeats allowed: a row named twice is refused).
    pick: Vec<usize>,
    n_tokens: Vec<u32>,
    short_out: bool,
}

fn step() -> impl Strategy<Value = Step> {
    (any::<bool>(), prop::collection::vec((0..ROWS, 0u32..24), 0..6), prop::bool::weighted(0.1)).prop_map(
        |(commit, v, short_out)| Step {
            commit,
            pick: v.iter().map(|p| p.0).collect(),
            n_tokens: v.iter().map(|p| p.1).collect(),
            short_out,
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    #[test]
    fn batch_equals_single_calls(ps in prop::sample::select(vec![1u32, 4, 16]), pages in 8u64..64,
                                 steps in prop::collection::vec(step(), 1..30)) {
        let (a, b) = (new_cache(ps, pages), new_cache(ps, pages));
        let mut ra = Vec::new();
        for _ in 0..ROWS {
            let (mut r, mut r2) = (skv_req::default(), skv_req::default());
            // SAFETY: a and b are live until the end of the case; r and r2 are locals.
            unsafe {
                assert_eq!(skv_alloc_row(a, &mut r), SKV_OK);
                assert_eq!(skv_alloc_row(b, &mut r2), SKV_OK);
            }
            assert_eq!(r, r2);
            ra.push(r);
        }
        let mut rb = ra.clone();
        for s in steps {
            let mut batch: Vec<skv_req> = s.pick.iter().map(|&p| ra[p]).collect();
            let before = batch.clone();
            let total: u32 = s.n_tokens.iter().sum();
            let cap = if s.short_out && total > 0 { total - 1 } else { total } as usize;
            let mut loc = vec![-7i32; cap + 1];
            let snap = snapshot(a, &ra);
            // SAFETY: a is live; n_tokens has one count per req of batch; loc holds cap + 1
            // entries, more than the cap passed.
            let st = unsafe {
                if s.commit {
                    skv_commit_batch(a, batch.as_mut_ptr(), batch.len(), s.n_tokens.as_ptr())
                } else {
                    skv_alloc_extend_batch(a, batch.as_mut_ptr(), batch.len(), s.n_tokens.as_ptr(), loc.as_mut_ptr(), cap)
                }
            };
            if st != SKV_OK {
                let msg = last_error_message();
                prop_assert_eq!(&batch, &before, "a failed batch wrote a req");
                prop_assert_eq!(snapshot(a, &ra), snap, "a failed batch changed the pool");
                prop_assert!(loc.iter().all(|&v| v == -7), "a failed batch wrote out_loc");
                let named = msg.contains("reqs[") || msg.contains("out_cap");
                prop_assert!(named, "{}", msg);
                continue;
            }
            // The same requests one by one on the twin: each succeeds, same slots, same reqs.
            let mut at = 0usize;
            for (k, (&p, &n)) in s.pick.iter().zip(&s.n_tokens).enumerate() {
                let mut single = vec![-7i32; n as usize];
                // SAFETY: b is live; single holds the n slot indices asked for.
                let st = unsafe {
                    if s.commit { skv_commit(b, &mut rb[p], n) } else { skv_alloc_extend(b, &mut rb[p], n, single.as_mut_ptr()) }
                };
                prop_assert_eq!(st, SKV_OK, "single call {} after an OK batch: {}", k, last_error_message());
                prop_assert_eq!(rb[p], batch[k]);
                if !s.commit {
                    prop_assert_eq!(&loc[at..at + n as usize], &single[..]);
                    at += n as usize;
                }
                ra[p] = batch[k];
            }
            prop_assert_eq!(snapshot(a, &ra), snapshot(b, &rb));
        }
        let mut rep = std::mem::MaybeUninit::<skv_check_report>::zeroed();
        // SAFETY: a is live; rep is a local.
        prop_assert_eq!(unsafe { skv_cache_check(a, rep.as_mut_ptr()) }, SKV_OK);
        // SAFETY: skv_check_report is integers and bytes, so the zeroed rep is initialized.
        prop_assert_eq!(unsafe { rep.assume_init() }.violations, 0);
        // SAFETY: both handles were created for this case and are freed once, here.
        unsafe { skv_cache_free(a); skv_cache_free(b) };
    }
}
