//! The ledger: which full pages each holder (a session branch) has published, how many
//! holders each published block has, and the batches waiting to go out.
//!
//! A holder's chain is the ids of its full pages from its first published page on, each
//! chained to the one before ([`SessionKey::block_id`]); two branches of a session that
//! share a page share its id. A block is stored when its count goes 0 -> 1 and removed when
//! it goes 1 -> 0, so the router (which keeps no count) never loses a block a holder still
//! stands on. Every operation costs O(pages it stores or removes); only a recovery (after an
//! overflow or a new subscriber) walks every holder. Only a session's own branches can share a block (ids are salted per
//! session), so counts are kept per session, and only while it has two holders or more.
//!
//! The ledger keeps each held page's token ids (4 bytes a token) and its id (8 bytes) (and, in
//! a session with several branches, a count entry of 16 bytes, plus a hash-map control byte, per distinct block): an
//! overflow's recovery stores every chain again from them. docs/events.md has the rules this implements.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet, VecDeque};

use foldhash::fast::RandomState;
use smallvec::SmallVec;

use super::encode::{now_ts, BatchEncoder, Medium};
use super::key::SessionKey;
use crate::core::{Error, Result};

/// A holder's key: `(session_id, branch_id)`.
pub type HolderKey = (u64, u64);

/// How a ledger is set up (from `skv_events_config` and the cache's page size).
#[derive(Debug, Clone, Copy)]
pub struct LedgerConfig {
    pub page_size: u32,
    pub data_parallel_rank: u32,
    /// libskv is the only publisher of session KV: chains start at page 0, protected pages
    /// included (`SKV_EVENTS_FROM_PAGE_ZERO`).
    pub from_page_zero: bool,
    /// The bound of the queue of closed batches, at least 1.
    pub max_batches: usize,
}

/// What the ledger knows of one session: its key (salt) and the parent of its chains.
struct SessionMeta {
    key: SessionKey,
    first_parent: Option<u64>,
    /// Live holders (branches with a chain or known tokens).
    holders: u32,
    /// Their branch ids.
    branches: SmallVec<[u64; 2]>,
    /// Holders of each published block, kept while the session has two holders or more. Only
    /// a session's own branches can share a block (ids are salted per session), and a lone
    /// holder's blocks each have one: the common case touches no count at all.
    counts: Option<HashMap<(u64, Medium), u32, RandomState>>,
}

/// One session branch: the row it lives in, its first published page, the token ids it
/// has been handed (from that page's first position on) and the ids of its published pages.
struct Holder {
    row: u32,
    first_page: u32,
    tokens: Vec<u32>,
    ids: Vec<u64>,
    /// Parked: `ids[cpu_from..]` are in the host tier (medium CPU), the rest on the device.
    cpu_from: Option<usize>,
}

impl Holder {
    /// The medium of published page `k` (an index into `ids`).
    fn medium(&self, k: usize) -> Medium {
        match self.cpu_from {
            Some(c) if k >= c => Medium::Cpu,
            _ => Medium::Gpu,
        }
    }
}

/// What a request's row holds when its tokens are handed over (`Ledger::tokens`).
#[derive(Debug, Clone, Copy)]
pub struct RowState {
    pub row: u32,
    /// `cache_protected_len`: the engine's prefix, never published (unless from page zero).
    pub protected: u32,
    /// `kv_committed_len`: pages up to here may be stored.
    pub committed: u32,
    /// `kv_allocated_len`: the held length; tokens handed before for positions below it
    /// must not change.
    pub allocated: u32,
}

/// Where closed batches go: the drain queue, or the built-in ZMQ publisher (feature `zmq`),
/// its bounded queue full being the same `Full` (the batch dropped, the recovery due).
struct Queue {
    batches: VecDeque<(u64, Vec<u8>)>,
    max: usize,
    #[cfg(feature = "zmq")]
    publisher: Option<super::Publisher>,
}

/// Which sink refused a batch: it was dropped, its sequence number spent.
struct Full;

impl Queue {
    fn push(&mut self, seq: u64, payload: Vec<u8>) -> std::result::Result<(), Full> {
        #[cfg(feature = "zmq")]
        if let Some(p) = &self.publisher {
            return p.send(seq, payload).map_err(|_| Full);
        }
        if self.batches.len() >= self.max {
            return Err(Full);
        }
        self.batches.push_back((seq, payload));
        Ok(())
    }

    /// Whether a batch closed now would be queued.
    fn has_room(&self) -> bool {
        #[cfg(feature = "zmq")]
        if let Some(p) = &self.publisher {
            return p.has_room();
        }
        self.batches.len() < self.max
    }
}

/// The oldest closed batch, as `drain` hands it out.
#[derive(Debug, PartialEq, Eq)]
pub enum Drained {
    /// No batch is waiting.
    Empty,
    /// The batch numbered `seq`, `len` bytes, copied into the caller's buffer.
    Batch { seq: u64, len: usize },
    /// The caller's buffer is smaller than the oldest batch's `len` bytes; nothing consumed.
    TooSmall { len: usize },
}

/// The ledger of one handle (see the module's doc).
pub struct Ledger {
    cfg: LedgerConfig,
    enc: BatchEncoder,
    sessions: HashMap<u64, SessionMeta, RandomState>,
    holders: HashMap<HolderKey, Holder, RandomState>,
    by_row: HashMap<u32, HolderKey, RandomState>,
    /// Distinct blocks published and held.
    blocks: usize,
    queue: Queue,
    next_seq: u64,
    /// A batch was dropped: the next batch closed is the recovery (`AllBlocksCleared`, then
    /// every held chain stored again).
    overflowed: bool,
    /// Dropped batches since creation.
    dropped: u64,
    scratch: Vec<u8>,
    /// A call's removed blocks, per medium (`Medium as usize`).
    removed: [Vec<u64>; 2],
}

impl Ledger {
    /// A ledger whose first batch, sequence number 0, is `AllBlocksCleared`: a router that
    /// saw an earlier run of this publisher forgets it.
    pub fn new(cfg: LedgerConfig) -> Result<Self> {
        if cfg.max_batches == 0 {
            return Err(Error::InvalidArg("max_batches 0: the queue holds at least one batch".into()));
        }
        let enc = BatchEncoder::new(cfg.page_size, cfg.data_parallel_rank)?;
        let mut l = Ledger {
            cfg,
            enc,
            sessions: HashMap::default(),
            holders: HashMap::default(),
            by_row: HashMap::default(),
            blocks: 0,
            queue: Queue {
                batches: VecDeque::new(),
                max: cfg.max_batches,
                #[cfg(feature = "zmq")]
                publisher: None,
            },
            next_seq: 0,
            overflowed: false,
            dropped: 0,
            scratch: Vec::new(),
            removed: [Vec::new(), Vec::new()],
        };
        l.enc.all_blocks_cleared()?;
        l.close();
        Ok(l)
    }

    /// Sets a session's salt (`None`: `skv-session:<id>`) and the parent of its first
    /// published page. Refused while the session has a holder: its published ids would
    /// change under the router.
    pub fn set_session(&mut self, session: u64, salt: Option<&str>, first_parent: Option<u64>) -> Result<()> {
        if let Some(m) = self.sessions.get(&session).filter(|m| m.holders > 0) {
            return Err(Error::State(format!(
                "session {session} already has {} holder(s) with tokens: its salt and first parent are set \
                 before its first skv_events_tokens",
                m.holders
            )));
        }
        let key = match salt {
            Some(s) => SessionKey::with_salt(session, s)?,
            None => SessionKey::new(session),
        };
        let branches = SmallVec::new();
        self.sessions.insert(session, SessionMeta { key, first_parent, holders: 0, branches, counts: None });
        Ok(())
    }

    /// The holder bound to `row`, if any.
    pub fn holder_of_row(&self, row: u32) -> Option<HolderKey> {
        self.by_row.get(&row).copied()
    }

    /// Takes the token ids of positions `[first_pos, first_pos + tokens.len())` of holder
    /// `key`'s sequence, living in `rs.row`, then stores its committed full pages whose tokens
    /// are all known. A new holder's first page is `ceil(protected / page_size)` (0 from page
    /// zero). Refused, nothing changed: the holder lives in another row, a hole past the
    /// known tokens, or a token differing from one handed before below `rs.allocated`.
    pub fn tokens(&mut self, key: HolderKey, rs: RowState, first_pos: u32, tokens: &[u32]) -> Result<()> {
        let (session, branch) = key;
        let ps = self.cfg.page_size;
        let (first_page, known, row) = match self.holders.get(&key) {
            Some(h) => (h.first_page, h.tokens.as_slice(), h.row),
            None if self.cfg.from_page_zero => (0, &[][..], rs.row),
            None => (rs.protected.div_ceil(ps), &[][..], rs.row),
        };
        if row != rs.row {
            return Err(Error::State(format!(
                "session {session} branch {branch} lives in row {row}, the req holds row {}",
                rs.row
            )));
        }
        if let Some(other) = self.by_row.get(&rs.row).filter(|&&k| k != key) {
            return Err(Error::State(format!(
                "row {} holds session {} branch {}, not session {session} branch {branch}",
                rs.row, other.0, other.1
            )));
        }
        let base = first_page as u64 * ps as u64;
        let known_end = base + known.len() as u64;
        if first_pos as u64 > known_end {
            return Err(Error::InvalidArg(format!(
                "first_pos {first_pos} leaves a hole: session {session} branch {branch} has tokens up to \
                 position {known_end}"
            )));
        }
        // The handed tokens from the holder's first position on, and where they start in `known`.
        let skip = base.saturating_sub(first_pos as u64).min(tokens.len() as u64) as usize;
        let (from, new) = ((first_pos as u64).max(base) - base, &tokens[skip..]);
        let overlap = (known.len() - from as usize).min(new.len());
        let differs = (0..overlap).find(|&i| known[from as usize + i] != new[i]);
        if let Some(i) = differs {
            let pos = base + from + i as u64;
            if pos < rs.allocated as u64 {
                return Err(Error::InvalidArg(format!(
                    "tokens[{}] = {} at position {pos} differs from the {} handed before for session {session} \
                     branch {branch}, which still holds that position",
                    skip + i,
                    new[i],
                    known[from as usize + i]
                )));
            }
        }
        let keep = from as usize + differs.unwrap_or(overlap);
        // Checked: now change.
        if !self.holders.contains_key(&key) {
            self.add_holder(
                key,
                Holder { row: rs.row, first_page, tokens: Vec::new(), ids: Vec::new(), cpu_from: None },
            );
        }
        let h = self.holders.get_mut(&key).expect("inserted above");
        h.tokens.truncate(keep);
        let start = h.tokens.len() - from as usize;
        h.tokens.extend_from_slice(&new[start.min(new.len())..]);
        self.sync(key, rs.allocated, rs.committed, false);
        Ok(())
    }

    /// Holder `key` now holds `held` tokens, of which `committed` are final (a finish after
    /// its trim, a hit, a hand-back): pages ending past `held` are released, tokens past it
    /// forgotten, and committed full pages whose tokens are known stored. A key with no
    /// holder is not published: nothing happens.
    pub fn held(&mut self, key: HolderKey, held: u32, committed: u32) {
        if self.holders.contains_key(&key) {
            self.sync(key, held, committed, true);
        }
    }

    /// The holder living in `row` now holds `held` tokens (a trim or tail free of the row):
    /// pages ending past it are released and tokens past it forgotten.
    pub fn shortened(&mut self, row: u32, held: u32) {
        if let Some(key) = self.holder_of_row(row) {
            self.sync(key, held, 0, true);
        }
    }

    /// Holder `key` is gone (an abort, a release, an eviction): every page it published is
    /// released. A session whose last holder went keeps its salt until `forget_session`.
    pub fn remove(&mut self, key: HolderKey) {
        if !self.holders.contains_key(&key) {
            return;
        }
        self.sync(key, 0, 0, true);
        let h = self.holders.remove(&key).expect("checked above");
        self.by_row.remove(&h.row);
        if let Some(m) = self.sessions.get_mut(&key.0) {
            m.holders -= 1;
            m.branches.retain(|b| *b != key.1);
            if m.holders < 2 {
                m.counts = None;
            }
        }
    }

    /// A new holder; a session's second one starts the counts of its blocks.
    fn add_holder(&mut self, key: HolderKey, h: Holder) {
        self.by_row.insert(h.row, key);
        self.holders.insert(key, h);
        self.meta_mut(key.0);
        let Ledger { sessions, holders, .. } = self;
        let m = sessions.get_mut(&key.0).expect("made above");
        m.holders += 1;
        m.branches.push(key.1);
        if m.holders == 2 {
            let mut counts: HashMap<(u64, Medium), u32, RandomState> = HashMap::default();
            for &b in &m.branches {
                let h = &holders[&(key.0, b)];
                for (k, &id) in h.ids.iter().enumerate() {
                    *counts.entry((id, h.medium(k))).or_insert(0) += 1;
                }
            }
            m.counts = Some(counts);
        }
    }

    /// `remove` of the holder living in `row`, if any.
    pub fn remove_row(&mut self, row: u32) {
        if let Some(key) = self.holder_of_row(row) {
            self.remove(key);
        }
    }

    /// Forgets a session's salt and first parent once it has no holder (`skv_release_session`).
    pub fn forget_session(&mut self, session: u64) {
        if let Entry::Occupied(m) = self.sessions.entry(session) {
            if m.get().holders == 0 {
                m.remove();
            }
        }
    }

    /// The ids of holder `key`'s published pages, in chain order, and its first page.
    pub fn chain(&self, key: HolderKey) -> Option<(u32, &[u64])> {
        self.holders.get(&key).map(|h| (h.first_page, h.ids.as_slice()))
    }

    /// Distinct blocks published and held now.
    pub fn blocks(&self) -> usize {
        self.blocks
    }

    /// Batches dropped because the queue was full, since creation.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// The salt of `session` as its stores carry it (the default when none was set).
    pub fn salt(&self, session: u64) -> String {
        self.sessions.get(&session).map_or_else(|| SessionKey::new(session).salt().to_owned(), |m| m.key.salt().into())
    }

    fn meta_mut(&mut self, session: u64) -> &mut SessionMeta {
        self.sessions.entry(session).or_insert_with(|| SessionMeta {
            key: SessionKey::new(session),
            first_parent: None,
            holders: 0,
            branches: SmallVec::new(),
            counts: None,
        })
    }

    /// Releases holder `key`'s pages ending past `held` (and, with `forget`, its tokens past
    /// it), then stores its full pages below `committed` whose tokens are known.
    fn sync(&mut self, key: HolderKey, held: u32, committed: u32, forget: bool) {
        let ps = self.cfg.page_size as u64;
        let Ledger { holders, sessions, blocks, enc, scratch, removed, overflowed, .. } = self;
        let h = holders.get_mut(&key).expect("the callers checked");
        let meta = sessions.get_mut(&key.0).expect("a holder's session has its meta");
        let base = h.first_page as u64 * ps;
        let keep_pages = ((held as u64 / ps).saturating_sub(h.first_page as u64) as usize).min(h.ids.len());
        removed.iter_mut().for_each(Vec::clear);
        for k in keep_pages..h.ids.len() {
            let (id, medium) = (h.ids[k], h.medium(k));
            let last = match &mut meta.counts {
                None => true,
                Some(counts) => match counts.entry((id, medium)) {
                    Entry::Occupied(mut c) => {
                        *c.get_mut() -= 1;
                        (*c.get() == 0).then(|| c.remove()).is_some()
                    }
                    Entry::Vacant(_) => false,
                },
            };
            if last {
                removed[medium as usize].push(id);
            }
        }
        h.ids.truncate(keep_pages);
        // Leaves first: each block named is then a leaf of the worker's chain in the router.
        for (ids, medium) in removed.iter_mut().zip([Medium::Gpu, Medium::Cpu]).rev() {
            *blocks -= ids.len();
            ids.reverse();
            if !ids.is_empty() && enc.block_removed_in(ids, medium).is_err() {
                *overflowed = true;
            }
        }
        if forget {
            h.tokens.truncate((held as u64).saturating_sub(base) as usize);
        }
        let known_end = base + h.tokens.len() as u64;
        let want = ((committed as u64).min(known_end) / ps).saturating_sub(h.first_page as u64) as usize;
        if want <= h.ids.len() {
            return;
        }
        let psz = ps as usize;
        let from = h.ids.len();
        // Runs of pages new to the router, each stored chained to the page before it.
        let mut run: Option<usize> = None;
        let mut failed = false;
        for k in from..=want {
            let parent = if k == 0 { meta.first_parent } else { Some(h.ids[k - 1]) };
            let fresh = k < want && {
                let id = meta.key.block_id(parent, h.first_page + k as u32, &h.tokens[k * psz..(k + 1) * psz], scratch);
                h.ids.push(id);
                match &mut meta.counts {
                    None => true,
                    Some(counts) => {
                        let c = counts.entry((id, h.medium(k))).or_insert(0);
                        *c += 1;
                        *c == 1
                    }
                }
            };
            *blocks += fresh as usize;
            // A run ends where the pages' medium changes, too.
            let split = run.is_some_and(|a| k < want && h.medium(a) != h.medium(k));
            match (run, fresh && !split) {
                (None, true) => run = Some(k),
                (Some(a), false) => {
                    let parent = if a == 0 { meta.first_parent } else { Some(h.ids[a - 1]) };
                    let (ids, toks) = (&h.ids[a..k], &h.tokens[a * psz..k * psz]);
                    failed |= enc.block_stored_ids(&meta.key, parent, ids, toks, h.medium(a)).is_err();
                    run = (fresh && split).then_some(k);
                }
                _ => {}
            }
        }
        *overflowed |= failed;
    }

    /// Closes the open batch (when it has events, or a recovery is due) and queues it with
    /// the next sequence number. A full queue drops it, its number spent: the next batch
    /// closed is then the recovery.
    pub fn close(&mut self) {
        // A subscriber that joined missed what was stored before: it gets the recovery too.
        #[cfg(feature = "zmq")]
        if self.queue.publisher.as_ref().is_some_and(|p| p.subscriber_joined()) {
            self.overflowed = true;
        }
        if self.overflowed {
            // The recovery re-stores everything, this batch's events included; it is encoded
            // only when it can be queued.
            if !self.queue.has_room() {
                if !self.enc.is_empty() {
                    self.enc.clear();
                    self.dropped += 1;
                    self.next_seq += 1;
                }
                return;
            }
            self.enc.clear();
            if self.encode_recovery().is_err() {
                self.enc.clear();
                self.dropped += 1;
                self.next_seq += 1;
                return;
            }
        } else if self.enc.is_empty() {
            return;
        }
        let mut payload = Vec::new();
        self.enc.finish(now_ts(), &mut payload);
        let seq = self.next_seq;
        self.next_seq += 1;
        match self.queue.push(seq, payload) {
            Ok(()) => self.overflowed = false,
            Err(Full) => {
                self.dropped += 1;
                self.overflowed = true;
            }
        }
    }

    /// `AllBlocksCleared`, then every held chain, each block stored once.
    fn encode_recovery(&mut self) -> Result<()> {
        self.enc.all_blocks_cleared()?;
        let psz = self.cfg.page_size as usize;
        let mut done: HashSet<(u64, Medium), RandomState> = HashSet::default();
        for (&(session, _), h) in &self.holders {
            let meta = self.sessions.get(&session).expect("a holder's session has its meta");
            let mut a = 0;
            while a < h.ids.len() {
                if done.contains(&(h.ids[a], h.medium(a))) {
                    a += 1;
                    continue;
                }
                let mut b = a;
                while b < h.ids.len() && h.medium(b) == h.medium(a) && done.insert((h.ids[b], h.medium(b))) {
                    b += 1;
                }
                let parent = if a == 0 { meta.first_parent } else { Some(h.ids[a - 1]) };
                let (ids, toks) = (&h.ids[a..b], &h.tokens[a * psz..b * psz]);
                self.enc.block_stored_ids(&meta.key, parent, ids, toks, h.medium(a))?;
                a = b;
            }
        }
        Ok(())
    }

    /// Copies the oldest closed batch into `buf` and consumes it (closing the open batch
    /// first, and queueing a due recovery when there is room).
    pub fn drain(&mut self, buf: &mut [u8]) -> Drained {
        self.close();
        let Some((seq, payload)) = self.queue.batches.front() else { return Drained::Empty };
        let (seq, len) = (*seq, payload.len());
        if buf.len() < len {
            return Drained::TooSmall { len };
        }
        buf[..len].copy_from_slice(payload);
        self.queue.batches.pop_front();
        Drained::Batch { seq, len }
    }

    /// Closed batches waiting in the queue.
    pub fn queued(&self) -> usize {
        self.queue.batches.len()
    }

    /// Sends the batches through `publisher` from now on, those already closed (the first,
    /// `AllBlocksCleared`) first; skv_events_drain has nothing to hand out then.
    #[cfg(feature = "zmq")]
    pub fn publish_to(&mut self, publisher: super::Publisher) {
        let closed = std::mem::take(&mut self.queue.batches);
        self.queue.publisher = Some(publisher);
        for (seq, payload) in closed {
            if self.queue.push(seq, payload).is_err() {
                self.dropped += 1;
                self.overflowed = true;
            }
        }
    }

    /// The endpoint the batches are published on, when they are.
    #[cfg(feature = "zmq")]
    pub fn publisher_endpoint(&self) -> Option<&str> {
        self.queue.publisher.as_ref().map(|p| p.endpoint())
    }
}

impl Ledger {
    /// Holder `key` was parked (`Some(protected)`: its pages from the first one past its
    /// `protected` tokens moved to the host tier) or restored (`None`): those pages are removed
    /// in their old medium, then stored in their new one, same ids, same chain.
    pub fn moved(&mut self, key: HolderKey, parked: Option<u32>) {
        let ps = self.cfg.page_size;
        let Some(h) = self.holders.get(&key) else { return };
        let cpu_from = parked.map(|p| (p.div_ceil(ps).saturating_sub(h.first_page) as usize).min(h.ids.len()));
        if cpu_from == h.cpu_from {
            return;
        }
        let n = h.ids.len();
        let lo = cpu_from.unwrap_or(n).min(h.cpu_from.unwrap_or(n));
        let end = (h.first_page as usize + n) as u64 * ps as u64;
        let base = h.first_page as u64 * ps as u64;
        self.sync(key, (base + lo as u64 * ps as u64) as u32, 0, false);
        self.holders.get_mut(&key).expect("checked above").cpu_from = cpu_from;
        self.sync(key, u32::MAX, end.min(u32::MAX as u64) as u32, false);
    }
}

#[cfg(test)]
#[path = "ledger_tests.rs"]
mod tests;
