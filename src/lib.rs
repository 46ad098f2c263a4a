//! libskv: streaming-session KV-cache management for LLM serving engines.
//!
//! `core` is the model in safe Rust; `capi` is the C ABI over it (re-exported here, so Rust
//! programs can drive the same entry points C engines use).

mod capi;
pub mod core;
mod device;

pub use capi::*;
