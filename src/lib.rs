//! libskv: streaming-session KV-cache management for LLM serving engines.
//!
//! `core` is the model in safe Rust; `capi` is the C ABI over it (re-exported here, so Rust
//! programs can drive the same entry points C engines use).

// Unsafe operations are written in `unsafe` blocks, also inside `unsafe fn`s, each block with
// a `// SAFETY:` comment naming the contract or the check that makes it sound.
#![deny(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

mod capi;
pub mod core;
mod device;

pub use capi::*;
