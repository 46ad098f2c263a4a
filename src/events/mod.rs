//! KV events, the format layer: the bytes a KV-aware router (NVIDIA Dynamo's, llm-d's)
//! reads to learn which pages an engine holds, in the form vLLM publishes them. Behind the
//! `events` feature; without it none of this is built. docs/events.md describes the format and
//! which session calls emit what (the hooks are in `capi/events_emit.rs`).
//!
//! - [`SessionKey`]: a session's salt and id, and the ids of its blocks.
//! - [`BatchEncoder`]: `BlockStored`, `BlockRemoved` and `AllBlocksCleared` events into one
//!   batch, `[ts, [event, ...], data_parallel_rank]`, msgpack.
//! - [`Ledger`]: which full pages each holder (a session branch) has published, the
//!   counts of shared blocks, and the closed batches waiting to go out.
//! - [`Frames`]: a batch's ZMQ multipart message, `[topic, 8-byte big-endian sequence
//!   number, payload]`.
//! - `Publisher` (feature `zmq`): sends closed batches on a ZMQ PUB socket from a
//!   background thread, through a bounded queue that never blocks the caller, and tells the
//!   ledger when a subscriber joins.
//!
//! **Block ids.** A page's id (its `block_hashes` entry, and its children's
//! `parent_block_hash`) is the 64-bit XXH3 of the parent's id, the page's index in the
//! sequence and its token ids, seeded by the XXH3 of the session's salt
//! ([`SessionKey::block_id`]). The router never hashes these ids: it matches on hashes it
//! computes itself from `token_ids` and `cache_salt`, and uses the ids only to link a block
//! to its parent and to name it in a removal. So they need to be unique per page content,
//! position, prefix and session, and the same every time the same page is stored, which lets
//! the next layer count holders of a page shared by branches. XXH3 is specified (the same
//! bits on every platform and version), fast on 64-byte inputs, and already what the router
//! hashes tokens with.
//!
//! **Crates.** `rmp`, msgpack's low-level Rust writer: the one under `rmp-serde`, which
//! Dynamo's decoder uses, so both ends share one codec. No serde and no derive: each value is
//! written straight into the batch's buffer, and the constant runs of a map are encoded once,
//! when the encoder is built. The two loops that carry the volume (token ids, block ids)
//! write msgpack's integer forms inline, which halved a store's time against rmp's
//! out-of-line call. `xxhash-rust` (its `xxh3` only) for the ids. Both are small and pure
//! Rust; rmp's only dependency is `num-traits`, xxhash-rust has none.

mod encode;
mod frame;
mod key;
mod ledger;
#[cfg(feature = "zmq")]
mod publish;

pub use encode::{now_ts, BatchEncoder, Medium, KIND_FULL_ATTENTION, MEDIUM_CPU, MEDIUM_GPU};
pub use frame::Frames;
pub use key::SessionKey;
pub use ledger::{Drained, HolderKey, Ledger, LedgerConfig, RowState};
#[cfg(feature = "zmq")]
pub use publish::{rank_endpoint, Full, Publisher, STOP_LINGER};
