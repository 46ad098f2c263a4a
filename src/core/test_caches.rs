//! The small owned caches and rows the unit tests of the per-step calls start from.

use super::cache::Cache;
use super::req::{Config, Req};

/// An owned cache of `pages` pages of 4 tokens, 4 rows, no SWA pool.
pub(super) fn cache(pages: u64) -> Cache {
    let cfg = Config {
        page_size: 4,
        num_token_slots: pages * 4,
        num_rows: 4,
        max_context_len: 64,
        aligned_reuse: false,
        swa_num_token_slots: 0,
        tier: Default::default(),
    };
    Cache::new_owned(cfg).unwrap()
}

pub(super) fn rows(c: &mut Cache, n: usize) -> Vec<Req> {
    (0..n)
        .map(|_| {
            let mut r = Req::default();
            c.alloc_row(&mut r).unwrap();
            r
        })
        .collect()
}

/// An owned cache of `full_pages` pages of 4 tokens and `swa_pages` SWA pages (0: none).
pub(super) fn twin(full_pages: u64, swa_pages: u64) -> Cache {
    let cfg = Config {
        page_size: 4,
        num_token_slots: full_pages * 4,
        num_rows: 4,
        max_context_len: 64,
        aligned_reuse: false,
        swa_num_token_slots: swa_pages * 4,
        tier: Default::default(),
    };
    Cache::new_owned(cfg).unwrap()
}
