//! Encoding speed of KV events (`--features events`): `BlockStored` events of 1, 16 and 256
//! pages of 16 tokens, each closed into its own batch, ids hashed and token ids included; and
//! a `BlockRemoved` of 16 pages. Throughput is in blocks (pages) per second on one core; the
//! target is at least 5 M blocks/s.
//!
//! Token ids are drawn from a 150,000-token vocabulary, so most take msgpack's 5-byte form,
//! as a large model's do.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput};
use skv::events::{BatchEncoder, SessionKey};

const PAGE_SIZE: u32 = 16;
const VOCAB: u64 = 150_000;

fn tokens(n: usize) -> Vec<u32> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % VOCAB) as u32
        })
        .collect()
}

fn stored(c: &mut Criterion) {
    let mut g = c.benchmark_group("events_stored");
    let key = SessionKey::new(42);
    for pages in [1usize, 16, 256] {
        let toks = tokens(pages * PAGE_SIZE as usize);
        let mut enc = BatchEncoder::new(PAGE_SIZE, 0).unwrap();
        let (mut ids, mut out) = (Vec::new(), Vec::new());
        g.throughput(Throughput::Elements(pages as u64));
        g.bench_with_input(BenchmarkId::from_parameter(pages), &toks, |b, toks| {
            b.iter(|| {
                ids.clear();
                out.clear();
                enc.block_stored(&key, Some(7), 3, black_box(toks), &mut ids).unwrap();
                enc.finish(1.0, &mut out);
                black_box(&out);
            })
        });
        assert!(!out.is_empty() && ids.len() == pages, "the store was encoded");
    }
    g.finish();
}

fn removed(c: &mut Criterion) {
    let mut g = c.benchmark_group("events_removed");
    let ids: Vec<u64> = (0..16u64).map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15)).collect();
    let mut enc = BatchEncoder::new(PAGE_SIZE, 0).unwrap();
    let mut out = Vec::new();
    g.throughput(Throughput::Elements(ids.len() as u64));
    g.bench_function("16", |b| {
        b.iter(|| {
            out.clear();
            enc.block_removed(black_box(&ids)).unwrap();
            enc.finish(1.0, &mut out);
            black_box(&out);
        })
    });
    g.finish();
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    stored(&mut c);
    removed(&mut c);
    c.final_summary();
}
