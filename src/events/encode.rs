//! Event batches in vLLM's msgpack form: `[ts, [event, ...], data_parallel_rank]`, each
//! event a map tagged by `"type"`.

use std::time::{SystemTime, UNIX_EPOCH};

use rmp::encode as mp;

use super::key::{put_str, SessionKey};
use crate::core::{Error, Result};

/// The `medium` of a session's pages on the device: the engine's GPU pool.
pub const MEDIUM_GPU: &str = "GPU";
/// The `medium` of a parked session's pages: the host tier (docs/tiers.md).
pub const MEDIUM_CPU: &str = "CPU";

/// Where the pages an event names are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Medium {
    Gpu,
    Cpu,
}

impl Medium {
    pub fn as_str(self) -> &'static str {
        match self {
            Medium::Gpu => MEDIUM_GPU,
            Medium::Cpu => MEDIUM_CPU,
        }
    }
}
/// The `kv_cache_spec_kind` of every store: only full-attention pages are emitted
/// (`group_idx` 0); sliding-window pages and recurrent state never are.
pub const KIND_FULL_ATTENTION: &str = "full_attention";

/// Entries in a `BlockStored` map: the tag and the seven fields of vLLM's schema that have no
/// default (`type`, `block_hashes`, `parent_block_hash`, `token_ids`, `block_size`, `lora_id`,
/// `medium`, `lora_name`), the two libskv sets (`group_idx`, `kv_cache_spec_kind`), then
/// `cache_salt` and `session_id` from the session's key.
const STORED_ENTRIES: u32 = 12;

/// Builds one batch of events at a time, then closes it into bytes with [`finish`].
/// Nothing is allocated per event once the buffers have grown to a batch's size.
///
/// [`finish`]: BatchEncoder::finish
#[derive(Debug, Clone)]
pub struct BatchEncoder {
    page_size: u32,
    data_parallel_rank: u32,
    /// The open batch's events, encoded.
    body: Vec<u8>,
    events: u32,
    /// Constant runs of a `BlockStored` map: up to the `block_hashes` array, the
    /// `parent_block_hash` key, the `token_ids` key, and `block_size` through
    /// `kv_cache_spec_kind`.
    stored_head: Vec<u8>,
    stored_parent_key: Vec<u8>,
    stored_tokens_key: Vec<u8>,
    /// `block_size` through `kv_cache_spec_kind`, and `BlockRemoved`'s head, per medium
    /// (`Medium as usize`).
    stored_meta: [Vec<u8>; 2],
    removed_head: [Vec<u8>; 2],
    cleared: Vec<u8>,
    /// The block-id hash's input.
    scratch: Vec<u8>,
}

impl BatchEncoder {
    /// An encoder for a cache whose pages hold `page_size` tokens (each store's
    /// `block_size`), publishing as `data_parallel_rank`.
    pub fn new(page_size: u32, data_parallel_rank: u32) -> Result<Self> {
        if page_size == 0 {
            return Err(Error::InvalidArg("page_size 0: a page holds at least one token".into()));
        }
        if i32::try_from(data_parallel_rank).is_err() {
            return Err(Error::InvalidArg(format!(
                "data_parallel_rank {data_parallel_rank} is over i32::MAX, the router's rank type"
            )));
        }
        let mut stored_head = Vec::new();
        mp::write_map_len(&mut stored_head, STORED_ENTRIES).expect("Vec");
        put_str(&mut stored_head, "type");
        put_str(&mut stored_head, "BlockStored");
        put_str(&mut stored_head, "block_hashes");
        let mut stored_parent_key = Vec::new();
        put_str(&mut stored_parent_key, "parent_block_hash");
        let mut stored_tokens_key = Vec::new();
        put_str(&mut stored_tokens_key, "token_ids");
        let stored_meta = [Medium::Gpu, Medium::Cpu].map(|m| {
            let mut meta = Vec::new();
            put_str(&mut meta, "block_size");
            mp::write_uint(&mut meta, page_size.into()).expect("Vec");
            put_str(&mut meta, "lora_id");
            mp::write_nil(&mut meta).expect("Vec");
            put_str(&mut meta, "medium");
            put_str(&mut meta, m.as_str());
            put_str(&mut meta, "lora_name");
            mp::write_nil(&mut meta).expect("Vec");
            put_str(&mut meta, "group_idx");
            mp::write_uint(&mut meta, 0).expect("Vec");
            put_str(&mut meta, "kv_cache_spec_kind");
            put_str(&mut meta, KIND_FULL_ATTENTION);
            meta
        });
        let removed_head = [Medium::Gpu, Medium::Cpu].map(|m| {
            let mut head = Vec::new();
            mp::write_map_len(&mut head, 4).expect("Vec");
            put_str(&mut head, "type");
            put_str(&mut head, "BlockRemoved");
            put_str(&mut head, "medium");
            put_str(&mut head, m.as_str());
            put_str(&mut head, "group_idx");
            mp::write_uint(&mut head, 0).expect("Vec");
            put_str(&mut head, "block_hashes");
            head
        });
        let mut cleared = Vec::new();
        mp::write_map_len(&mut cleared, 1).expect("Vec");
        put_str(&mut cleared, "type");
        put_str(&mut cleared, "AllBlocksCleared");
        Ok(Self {
            page_size,
            data_parallel_rank,
            body: Vec::new(),
            events: 0,
            stored_head,
            stored_parent_key,
            stored_tokens_key,
            stored_meta,
            removed_head,
            cleared,
            scratch: Vec::new(),
        })
    }

    /// The pages' size in tokens: every store's `block_size`.
    pub fn page_size(&self) -> u32 {
        self.page_size
    }

    /// Events in the open batch.
    pub fn len(&self) -> usize {
        self.events as usize
    }

    /// Whether the open batch has no event.
    pub fn is_empty(&self) -> bool {
        self.events == 0
    }

    /// Appends a `BlockStored` of the full pages `tokens` (a whole number of pages, at least
    /// one) of `key`'s session, the first of them page number `first_page` of the sequence,
    /// chained to `parent` (the id of the page before `first_page`, or `None` when the
    /// chain starts at the root of the router's tree). Appends the pages' ids to `ids`, in
    /// order: the last is the next store's parent. On error nothing is appended anywhere.
    pub fn block_stored(
        &mut self,
        key: &SessionKey,
        parent: Option<u64>,
        first_page: u32,
        tokens: &[u32],
        ids: &mut Vec<u64>,
    ) -> Result<()> {
        let ps = self.page_size as usize;
        if tokens.is_empty() || !tokens.len().is_multiple_of(ps) {
            return Err(Error::InvalidArg(format!(
                "block_stored: {} token ids are not a whole number of pages of {ps} (at least one)",
                tokens.len()
            )));
        }
        let pages = tokens.len() / ps;
        if u32::try_from(tokens.len()).is_err() || u32::try_from(first_page as usize + pages - 1).is_err() {
            return Err(Error::InvalidArg(format!(
                "block_stored: {pages} pages from page {first_page} run past page u32::MAX"
            )));
        }
        self.check_room()?;
        let start = ids.len();
        let mut prev = parent;
        for (i, chunk) in tokens.chunks_exact(ps).enumerate() {
            let id = key.block_id(prev, first_page + i as u32, chunk, &mut self.scratch);
            ids.push(id);
            prev = Some(id);
        }
        self.write_stored(key, parent, &ids[start..], tokens, Medium::Gpu);
        Ok(())
    }

    /// `block_stored` of pages whose ids the caller computed already ([`SessionKey::block_id`],
    /// chained from `parent`): one id a page of `tokens`. The ledger hashes each page once to
    /// count its holders, and stores only the runs whose count went from 0 to 1.
    pub fn block_stored_ids(
        &mut self,
        key: &SessionKey,
        parent: Option<u64>,
        ids: &[u64],
        tokens: &[u32],
        medium: Medium,
    ) -> Result<()> {
        let ps = self.page_size as usize;
        if ids.is_empty() || tokens.len() != ids.len() * ps || u32::try_from(tokens.len()).is_err() {
            return Err(Error::InvalidArg(format!(
                "block_stored_ids: {} token ids for {} pages of {ps} (at least one)",
                tokens.len(),
                ids.len()
            )));
        }
        self.check_room()?;
        self.write_stored(key, parent, ids, tokens, medium);
        Ok(())
    }

    /// Writes one `BlockStored` of checked arguments.
    fn write_stored(&mut self, key: &SessionKey, parent: Option<u64>, ids: &[u64], tokens: &[u32], medium: Medium) {
        let pages = ids.len();
        let meta = &self.stored_meta[medium as usize];
        let body = &mut self.body;
        body.reserve(self.stored_head.len() + meta.len() + key.tail.len() + 48 + 9 * pages + 5 * tokens.len());
        body.extend_from_slice(&self.stored_head);
        mp::write_array_len(body, pages as u32).expect("Vec");
        for &id in ids {
            put_uint(body, id);
        }
        body.extend_from_slice(&self.stored_parent_key);
        match parent {
            Some(p) => mp::write_uint(body, p).map(drop).expect("Vec"),
            None => mp::write_nil(body).expect("Vec"),
        }
        body.extend_from_slice(&self.stored_tokens_key);
        mp::write_array_len(body, tokens.len() as u32).expect("Vec");
        for &t in tokens {
            put_uint(body, t.into());
        }
        body.extend_from_slice(meta);
        body.extend_from_slice(&key.tail);
        self.events += 1;
    }

    /// Appends a `BlockRemoved` of the blocks `ids` (at least one). The router drops each
    /// block and, within its tree, every block stored under it.
    pub fn block_removed(&mut self, ids: &[u64]) -> Result<()> {
        self.block_removed_in(ids, Medium::Gpu)
    }

    /// `block_removed` of blocks in `medium`.
    pub fn block_removed_in(&mut self, ids: &[u64], medium: Medium) -> Result<()> {
        if ids.is_empty() {
            return Err(Error::InvalidArg("block_removed: no block id".into()));
        }
        let Ok(n) = u32::try_from(ids.len()) else {
            return Err(Error::InvalidArg(format!("block_removed: {} block ids in one event", ids.len())));
        };
        self.check_room()?;
        self.body.extend_from_slice(&self.removed_head[medium as usize]);
        mp::write_array_len(&mut self.body, n).expect("Vec");
        for &id in ids {
            put_uint(&mut self.body, id);
        }
        self.events += 1;
        Ok(())
    }

    /// Appends an `AllBlocksCleared`: the router forgets everything this publisher stored.
    pub fn all_blocks_cleared(&mut self) -> Result<()> {
        self.check_room()?;
        self.body.extend_from_slice(&self.cleared);
        self.events += 1;
        Ok(())
    }

    /// Closes the open batch: appends `[ts, [events], data_parallel_rank]` to `out` and
    /// starts an empty batch. Returns the bytes appended. `ts` is the batch's time in
    /// seconds since the Unix epoch ([`now_ts`]).
    pub fn finish(&mut self, ts: f64, out: &mut Vec<u8>) -> usize {
        let start = out.len();
        out.reserve(self.body.len() + 24);
        mp::write_array_len(out, 3).expect("Vec");
        mp::write_f64(out, ts).expect("Vec");
        mp::write_array_len(out, self.events).expect("Vec");
        out.extend_from_slice(&self.body);
        mp::write_uint(out, self.data_parallel_rank.into()).expect("Vec");
        self.body.clear();
        self.events = 0;
        out.len() - start
    }

    /// Drops the open batch's events: an overflow's recovery batch replaces them.
    pub fn clear(&mut self) {
        self.body.clear();
        self.events = 0;
    }

    /// A msgpack array holds at most u32::MAX events.
    fn check_room(&self) -> Result<()> {
        if self.events == u32::MAX {
            return Err(Error::State(format!("the open batch holds {} events: finish it first", self.events)));
        }
        Ok(())
    }
}

/// Now, in seconds since the Unix epoch: a batch's `ts`, as vLLM's `time.time()`.
pub fn now_ts() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// An unsigned integer in msgpack's shortest form, as `rmp::encode::write_uint` writes it,
/// inlined into the loops over token ids and block ids: rmp's call, not inlined across the
/// crate boundary, was half of a store's time (benches/events.rs).
#[inline(always)]
fn put_uint(out: &mut Vec<u8>, v: u64) {
    if v < 0x80 {
        out.push(v as u8);
    } else if v <= 0xff {
        out.extend_from_slice(&[0xcc, v as u8]);
    } else if v <= 0xffff {
        let b = (v as u16).to_be_bytes();
        out.extend_from_slice(&[0xcd, b[0], b[1]]);
    } else if v <= 0xffff_ffff {
        let b = (v as u32).to_be_bytes();
        out.extend_from_slice(&[0xce, b[0], b[1], b[2], b[3]]);
    } else {
        out.push(0xcf);
        out.extend_from_slice(&v.to_be_bytes());
    }
}
