//! The host tier's state (owned mode): a second page pool in host memory (and one for the SWA
//! pool), the host copy of each session slot, and the policy's queues. `tier_ops` runs the
//! calls; nothing here touches the device pool.
//!
//! The policy runs on a logical clock, one tick a `skv_tier_step`, never wall time, and its
//! queues depend only on the calls made: two handles given the same calls (tensor-parallel
//! ranks) choose the same sessions and the same host pages.

use std::collections::{BTreeMap, VecDeque};

use super::error::{bail, try_vec, Result};
use super::swa_alloc::SwaAllocator;

/// The host tier's part of the config (all 0: no tier).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TierConfig {
    /// Host pool capacity in token slots (owned mode; 0 = no host tier).
    pub host_num_token_slots: u64,
    /// Host SWA pool capacity in token slots (exactly when both a tier and an SWA pool exist).
    pub host_swa_num_token_slots: u64,
    /// The engine's id of its KV byte layout: part of a unit's fingerprint.
    pub kv_layout_id: u64,
    /// The sliding window in tokens, for the fingerprint (0 = not stated).
    pub swa_window: u32,
    /// A finished slot is written back once idle this many steps.
    pub idle_steps: u32,
    /// Slots holding fewer tokens past their prefix are never written back by the policy
    /// (0 = one page).
    pub min_tokens: u32,
    /// Pages a step starts writing back, at most (0 = no background write-back).
    pub pages_per_step: u32,
}

impl TierConfig {
    /// The checks against the rest of the config.
    pub(crate) fn validate(&self, ps: u32, swa_pool: bool, owned: bool) -> Result<()> {
        let (host, host_swa) = (self.host_num_token_slots, self.host_swa_num_token_slots);
        if host == 0 {
            if host_swa != 0 || self.idle_steps != 0 || self.min_tokens != 0 || self.pages_per_step != 0 {
                bail!(
                    InvalidArg,
                    "host_swa_num_token_slots and the tier_* fields must be 0 without a host tier \
                     (host_num_token_slots 0)"
                );
            }
            return Ok(());
        }
        if !owned {
            bail!(
                InvalidArg,
                "host_num_token_slots {host}: external mode has no host tier (the engine owns its memory)"
            );
        }
        check_slots("host_num_token_slots", host, ps)?;
        match (swa_pool, host_swa) {
            (true, 0) => {
                bail!(InvalidArg, "host_swa_num_token_slots 0: an SWA pool with a host tier needs a host SWA pool")
            }
            (false, n) if n != 0 => bail!(InvalidArg, "host_swa_num_token_slots {n}: there is no SWA pool"),
            (true, n) => check_slots("host_swa_num_token_slots", n, ps),
            _ => Ok(()),
        }
    }
}

fn check_slots(what: &str, n: u64, ps: u32) -> Result<()> {
    let ps = ps as u64;
    if !n.is_multiple_of(ps) || n / ps < 2 || n > 1 << 31 {
        bail!(
            InvalidArg,
            "{what} {n}: must be a multiple of page_size {ps} of at least 2 pages (page 0 is padding) and at most 2^31"
        );
    }
    Ok(())
}

/// A host pool's pages: a page stack of the SWA pool's kind (LIFO from `1, 2, 3, ...`, page 0
/// never handed out, nothing kept per page: each page is free or named by one host copy).
pub(crate) type HostPool = SwaAllocator;

/// A slot's host copy: the host page of each page past its protected prefix (`full`), and of
/// each such page's SWA page (`swa`, 0 where the window had passed).
#[derive(Debug, Default)]
pub(crate) struct HostCopy {
    pub(crate) full: Vec<u32>,
    pub(crate) swa: Vec<u32>,
    /// The open ticket writing or reading these pages, 0 when none.
    pub(crate) ticket: u64,
    /// The copy holds the slot's KV (its write-back completed).
    pub(crate) clean: bool,
    /// An eviction asked for the device copy to go once the write-back completes.
    pub(crate) leaving: bool,
    /// Its place in `dup_lru` (its session on the device) or `host_lru` (parked).
    pub(crate) stamp: u64,
}

// docs/tiers.md#host-memory counts 72 bytes a row for it, 80 with the row's finish clock.
const _: () = assert!(std::mem::size_of::<HostCopy>() == 72);

impl HostCopy {
    pub(crate) fn exists(&self) -> bool {
        !self.full.is_empty()
    }
}

/// The counters `skv_tier_stats` reports.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct TierCounts {
    pub(crate) parks: u64,
    pub(crate) unparks: u64,
    pub(crate) writebacks: u64,
    pub(crate) host_evictions: u64,
    pub(crate) failed_copies: u64,
    pub(crate) pages_to_host: u64,
    pub(crate) pages_to_device: u64,
}

/// The host tier.
pub(crate) struct Tier {
    pub(crate) cfg: TierConfig,
    pub(crate) full: HostPool,
    pub(crate) swa: Option<HostPool>,
    /// Per row: the host copy of the slot holding it.
    pub(crate) copies: Vec<HostCopy>,
    /// Per row: the clock when its slot's last turn finished.
    pub(crate) finished_clock: Vec<u64>,
    pub(crate) clock: u64,
    /// Idle slots by finish, oldest first: `(finished_at, row)`, valid while the slot holds that
    /// finish (a hit leaves it; a hand-back finds it again). Eviction walks it.
    pub(crate) device_lru: VecDeque<(u64, u32)>,
    /// Slots to write back, by finish: `(finished_at, row)`.
    pub(crate) writeback: VecDeque<(u64, u32)>,
    /// Host copies of sessions still on the device, by last use: `(stamp, row)`. Host eviction
    /// walks it first: dropping one of these loses nothing.
    pub(crate) dup_lru: VecDeque<(u64, u32)>,
    /// Parked sessions' host copies, by last use. Host eviction walks it once `dup_lru` has
    /// nothing left to give: each one it takes releases its session.
    pub(crate) host_lru: VecDeque<(u64, u32)>,
    stamps: u64,
    /// Host pages a released slot's open ticket still writes or reads: `(full, swa)`.
    pub(crate) drains: BTreeMap<u64, (Vec<u32>, Vec<u32>)>,
    pub(crate) counts: TierCounts,
}

impl Tier {
    pub(crate) fn new(cfg: TierConfig, ps: u32, rows: u32) -> Result<Self> {
        let pages = |slots: u64| (slots / ps as u64) as u32;
        Ok(Tier {
            cfg,
            full: HostPool::named(pages(cfg.host_num_token_slots), "the free host-page stack")?,
            swa: match cfg.host_swa_num_token_slots {
                0 => None,
                n => Some(HostPool::named(pages(n), "the free host SWA-page stack")?),
            },
            copies: try_vec(rows as usize, "host copies", |_| HostCopy::default())?,
            finished_clock: try_vec(rows as usize, "finish clocks", |_| 0)?,
            clock: 0,
            device_lru: VecDeque::new(),
            writeback: VecDeque::new(),
            dup_lru: VecDeque::new(),
            host_lru: VecDeque::new(),
            stamps: 0,
            drains: BTreeMap::new(),
            counts: TierCounts::default(),
        })
    }

    /// The smallest slot (tokens past its prefix) the policy writes back.
    pub(crate) fn min_tokens(&self, ps: u32) -> u32 {
        self.cfg.min_tokens.max(ps)
    }

    /// Marks `row`'s copy used now: the tail of `host_lru` when its session is `parked`,
    /// else of `dup_lru`.
    pub(crate) fn touch(&mut self, row: u32, parked: bool) {
        self.stamps += 1;
        self.copies[row as usize].stamp = self.stamps;
        let q = if parked { &mut self.host_lru } else { &mut self.dup_lru };
        q.push_back((self.stamps, row));
        compact(q, self.copies.len());
    }

    /// `row`'s slot finished a turn at `finished_at`.
    pub(crate) fn finished(&mut self, row: u32, finished_at: u64) {
        self.finished_clock[row as usize] = self.clock;
        self.device_lru.push_back((finished_at, row));
        self.writeback.push_back((finished_at, row));
        compact(&mut self.device_lru, self.copies.len());
        compact(&mut self.writeback, self.copies.len());
    }

    /// Drops `row`'s host copy: its pages go free, or, while `ticket` still copies them, to
    /// that ticket's drain.
    pub(crate) fn drop_copy(&mut self, row: u32) {
        let c = std::mem::take(&mut self.copies[row as usize]);
        if !c.exists() {
            return;
        }
        if c.ticket != 0 {
            let d = self.drains.entry(c.ticket).or_default();
            d.0.extend(&c.full);
            d.1.extend(c.swa.iter().filter(|&&p| p != 0));
        } else {
            self.give(&c.full, &c.swa);
        }
    }

    /// Keeps the first `n` pages of `row`'s host copy (no ticket copies it); the rest go free.
    pub(crate) fn trim_copy(&mut self, row: u32, n: usize) {
        let c = &mut self.copies[row as usize];
        if c.full.len() <= n {
            return;
        }
        let full = c.full.split_off(n);
        let swa = c.swa.split_off(n.min(c.swa.len()));
        self.give(&full, &swa);
    }

    /// Host pages back on their stacks (0s skipped).
    pub(crate) fn give(&mut self, full: &[u32], swa: &[u32]) {
        self.full.free_dropped(full);
        if let Some(s) = self.swa.as_mut() {
            s.free_dropped(swa);
        }
    }

    /// A completed ticket's drained host pages go free.
    pub(crate) fn return_drain(&mut self, ticket: u64) {
        if let Some((full, swa)) = self.drains.remove(&ticket) {
            self.give(&full, &swa);
        }
    }

    /// Host pages draining: `(full, swa)`.
    pub(crate) fn draining(&self) -> (u64, u64) {
        self.drains.values().fold((0, 0), |(f, s), d| (f + d.0.len() as u64, s + d.1.len() as u64))
    }
}

/// Drops stale entries once a queue holds more than twice the rows (amortized O(1) a push):
/// `valid` is checked by the walks, so a compaction only keeps the newest entry of each row.
fn compact(q: &mut VecDeque<(u64, u32)>, rows: usize) {
    if q.len() <= 2 * rows + 64 {
        return;
    }
    let mut newest = vec![0u64; rows];
    for &(k, r) in q.iter() {
        newest[r as usize] = newest[r as usize].max(k);
    }
    q.retain(|&(k, r)| newest[r as usize] == k);
}
