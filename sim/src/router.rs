//! The router in front of the instances (`--router kv`): NVIDIA Dynamo's KV router
//! (`dynamo-kv-router` 1.6.1), fed only by the events libskv publishes, and Dynamo's cost
//! function. Each instance is one data-parallel rank of one worker, as an engine with DP
//! ranks publishes: its batches carry its rank, and the router files them under it.

use dynamo_kv_router::protocols::{compute_block_hash_for_seq, BlockHashOptions, WorkerWithDpRank};
use dynamo_kv_router::zmq_wire::{decode_event_batch, RawKvEvent, ZmqEventNormalizer};
use dynamo_kv_router::RadixTree;

/// The worker id the instances publish under (their ranks tell them apart).
const WORKER: u64 = 1;

/// The salt libskv gives a session's blocks when the engine names none
/// (`skv_events_session`'s default): what a request for the session is hashed with.
pub fn salt(sid: u64) -> String {
    format!("skv-session:{sid}")
}

/// Dynamo's view of the fleet: its event normalizer and radix tree, and what it was fed.
pub struct Router {
    normalizer: ZmqEventNormalizer,
    tree: RadixTree,
    /// Events of the lower tiers (medium CPU: sessions parked in libskv's host tier). Dynamo
    /// indexes them apart from the device's, in its `LowerTierIndexer` (continuation edges:
    /// a parked chain's parent is a device block, its protected prefix); the overlaps a
    /// request is routed by read the device's tree only, so the run counts them.
    pub lower_events: u64,
    block_size: u32,
    next_event_id: u64,
    /// The next sequence number expected from each instance (a gap is a fault).
    next_seq: Vec<u64>,
    pub batches: u64,
    pub events: u64,
    pub bytes: u64,
}

impl Router {
    pub fn new(block_size: u32, instances: usize) -> Router {
        Router {
            normalizer: ZmqEventNormalizer::new(block_size),
            tree: RadixTree::new(),
            lower_events: 0,
            block_size,
            next_event_id: 0,
            next_seq: vec![0; instances],
            batches: 0,
            events: 0,
            bytes: 0,
        }
    }

    /// One drained batch of `instance`, applied as Dynamo's ZMQ listener does: decoded,
    /// normalized, applied to the tree. The batch must be the instance's next sequence
    /// number and name its rank; the first must clear; every event must apply.
    pub fn apply(&mut self, instance: usize, seq: u64, payload: &[u8]) -> Result<(), String> {
        let what = format!("instance {instance}'s batch {seq}");
        if seq != self.next_seq[instance] {
            return Err(format!("{what}: expected sequence number {}", self.next_seq[instance]));
        }
        self.next_seq[instance] += 1;
        let batch = decode_event_batch(payload).map_err(|e| format!("{what}: Dynamo cannot decode it: {e}"))?;
        if batch.data_parallel_rank != Some(instance as _) {
            return Err(format!("{what}: data_parallel_rank {:?}", batch.data_parallel_rank));
        }
        if seq == 0 && !matches!(batch.events.first(), Some(RawKvEvent::AllBlocksCleared { .. })) {
            return Err(format!("{what}: the first batch does not start with AllBlocksCleared"));
        }
        self.batches += 1;
        self.bytes += payload.len() as u64;
        self.events += batch.events.len() as u64;
        let worker = WorkerWithDpRank::new(WORKER, instance as u32);
        for raw in batch.events {
            let id = self.next_event_id;
            self.next_event_id += 1;
            let Some(ev) = self.normalizer.normalize(raw, id, worker) else {
                return Err(format!("{what}: the normalizer filtered an event out"));
            };
            let ev = ev.into_router_event().ok_or_else(|| format!("{what}: not a worker-local event"))?;
            match ev.targets_primary() {
                Ok(true) => {
                    self.tree.apply_event(ev).map_err(|e| format!("{what}: the tree refused an event: {e:?}"))?
                }
                Ok(false) => self.lower_events += 1,
                Err(e) => return Err(format!("{what}: an event of no supported residency: {e:?}")),
            }
        }
        Ok(())
    }

    /// The overlap, in blocks, of a request for `tokens` salted with `salt` on each instance:
    /// `find_matches(compute_block_hash_for_seq(..))`, as Dynamo's scheduler asks it.
    pub fn overlaps(&self, tokens: &[u32], salt: &str, instances: usize) -> Vec<u32> {
        let opts = BlockHashOptions { cache_namespace: Some(salt), ..Default::default() };
        let seq = compute_block_hash_for_seq(tokens, self.block_size, opts);
        let scores = self.tree.find_matches(seq, false).scores;
        (0..instances).map(|k| scores.get(&WorkerWithDpRank::new(WORKER, k as u32)).copied().unwrap_or(0)).collect()
    }

    /// True when no instance holds a block in the tree (every session closed).
    pub fn is_empty(&self) -> bool {
        self.tree.dump_tree_as_events().is_empty()
    }
}

/// What the router tracks of an instance's requests (Dynamo's `WorkerLoadProjection`):
/// prefill tokens routed and not yet prefilled, and the prompt blocks of requests routed and
/// not yet finished.
#[derive(Clone, Copy, Default, Debug)]
pub struct Load {
    pub prefill_tokens: u64,
    pub decode_blocks: u64,
}

/// Dynamo's cost of sending a request to an instance, lower is better: its
/// `DefaultWorkerScorer::worker_logit` (scheduling/selector/reference.rs) with
/// `KvRouterConfig::default()` (overlap_score_credit 1 unless `--overlap-credit`, no credit decay, prefill_load_scale 1,
/// decode_active_request_weight 0, router_track_prefill_tokens on):
///
/// `max(0, (active_prefill_tokens + isl) / block_size - overlap_score_credit * overlap_blocks)
///  + active_decode_blocks + request_blocks`
///
/// (`request_blocks`, the request's own blocks not shared with the instance's active
/// requests, is all of them: two sessions never share a block, and a session runs one turn at
/// a time.)
pub fn cost(load: Load, isl: u32, overlap_blocks: u32, block_size: u32, overlap_credit: f64) -> f64 {
    let bs = block_size as f64;
    let prefill = ((load.prefill_tokens as f64 + isl as f64) / bs - overlap_credit * overlap_blocks as f64).max(0.0);
    prefill + load.decode_blocks as f64 + isl.div_ceil(block_size) as f64
}
