//! The model: streaming-session KV management in safe Rust. Its only C-shaped items are the
//! `#[repr(C)]` records it answers with (`records`), which the C ABI hands out as they are.
//! A newcomer reads it in this order: `page` (arithmetic), `req` (what an engine hands us),
//! `slots` (what a session keeps), `pool` (what the logic asks of a KV pool), `cache` +
//! `session` and `session_checks` (the operations), `queries` (what a scheduler asks),
//! `records` (what the answers look like), `swa` (the
//! sliding-window step), then owned mode: `alloc`, `swa_alloc` and `page_list` (the pools'
//! pages), `owned` (the pool and its rows), `owned_ops` (the owned-mode calls), `step_checks`,
//! `fast_extend`, `batch` and `batch_prefetch` (the per-step calls), `audit`, and `mirror`
//! (what a device copy of the rows must learn). Then the host tier: `tickets` and `pins`
//! (copies in flight and the pages they hold) and `ticket_ops` (completing them), `tier` (its
//! pools and policy), `tier_ops`, `tier_restore` and `owned_tier` (its calls), `audit_tier`; and a session's KV as a movable unit: `unit` (its
//! byte form) and `unit_ops` (export and import); `transfer` (moving it between instances: the
//! lifecycle's decisions and the descriptor glue).

mod alloc;
mod audit;
mod audit_tier;
mod batch;
mod batch_prefetch;
mod cache;
mod error;
mod fast_extend;
mod mirror;
mod owned;
mod owned_ops;
mod owned_tier;
mod page;
mod page_list;
mod pins;
mod pool;
mod queries;
mod records;
mod req;
mod row_meta;
mod session;
mod session_checks;
mod slots;
mod step_checks;
mod swa;
mod swa_alloc;
#[cfg(test)]
mod test_caches;
#[cfg(test)]
mod test_move;
#[cfg(test)]
mod test_transfer;
#[cfg(test)]
mod test_unit;
mod ticket_ops;
mod tickets;
mod tier;
mod tier_ops;
mod tier_restore;
pub mod transfer;
mod unit;
mod unit_ops;

pub use cache::{Backend, Cache, Move};
pub use error::{Error, Result};
pub use mirror::Dirty;
pub use owned::{EngineHooks, OwnedPool};
pub use page::{ceil_align, floor_align, pages_for};
pub use pool::{split, Effect, Pool, Pools, Segment};
pub use records::{Admission, Evicted, Held, Match, Report, Stats, TierMatch, TierStats, Usage, Where, XferDesc};
pub use req::{swa_dead, swa_dead_lo, Config, FieldValue, Req, ReqField};
pub use slots::{Place, Slot};
pub use swa::Window;
pub use tier::TierConfig;
pub(crate) use tier_ops::{COPY_TO_DEVICE, COPY_TO_HOST, PLACE_HOST, WHERE_LEAVING};
pub use unit_ops::ImportSpec;

impl Cache {
    /// An owned-mode cache: libskv's own pool and rows.
    pub fn new_owned(cfg: Config) -> Result<Cache> {
        cfg.validate_owned()?;
        Cache::new(cfg, Backend::Owned(Box::new(OwnedPool::new(&cfg)?)))
    }
}

#[cfg(test)]
mod tests;
