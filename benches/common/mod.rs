//! What both benchmarks need to drive the C ABI and read the clock.

use std::hint::black_box;
use std::time::Instant;

use skv::skv_status;

/// Panics with the status's name and libskv's message unless `st` is `SKV_OK` (a benchmark's
/// setup must not fail). For the linked-in library: `hot_path`, which may call a loaded one,
/// has its own.
#[allow(dead_code)]
pub fn check(st: skv_status, what: &str) {
    if let Err(e) = st.ok() {
        panic!("{what}: {e}");
    }
}

/// The median cost of reading the clock twice, subtracted from per-call timings.
pub fn clock_overhead_ns() -> u64 {
    let mut v: Vec<u64> = (0..100_000)
        .map(|_| {
            let t = Instant::now();
            black_box(());
            t.elapsed().as_nanos() as u64
        })
        .collect();
    v.sort_unstable();
    v[v.len() / 2]
}
