//! libskv: streaming-session KV-cache management for LLM serving engines.
//!
//! `core` is the model in safe Rust; `capi` is the C ABI over it (re-exported here, so Rust
//! programs can drive the same entry points C engines use). For such programs (the
//! simulator, the benchmarks, the tests) a few conveniences need no `unsafe`:
//! `skv_req::default()` is the req `skv_req_init` writes, `skv_status::name` and
//! `skv_status::ok` give a status's name and `Result`, and `last_error_message` is the
//! thread's `skv_last_error` as a `String`.

// Unsafe operations are written in `unsafe` blocks, also inside `unsafe fn`s, each block with
// a `// SAFETY:` comment naming the contract or the check that makes it sound.
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

mod capi;
pub mod core;
mod device;
#[cfg(feature = "events")]
pub mod events;

pub use capi::*;
