//! What the session logic asks of a KV pool. The session operations compute a list of
//! effects first; the pool checks and prepares all of them before the first one is applied,
//! so a call either fails having changed nothing, or runs to the end.

use super::error::Result;
use super::owned::OwnedPool;
use super::req::Req;

/// One externally visible step of an operation, in the order it happens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    /// Drop the prefix-tree lock a session inherited from its first request.
    DecLockRef { node: u64, receipt: u64 },
    /// Hand back KV slots `row[start..end)`. The row keeps `keep` tokens mapped afterwards;
    /// `[keep, start)` lies in the partial page that still holds committed tokens.
    FreeKv { row: u32, keep: u32, start: u32, end: u32 },
    /// Return the row itself.
    FreeRow { row: u32 },
    /// Free engine auxiliary state.
    FreeAux { aux: i64 },
}

/// A KV pool: the engine's (through callbacks) or libskv's own.
pub trait Pool: Send {
    /// The tokens `row` maps, when libskv owns the rows; `None` (the default) when the
    /// engine does.
    fn mapped_len(&self, _row: u32) -> Option<u32> {
        None
    }

    /// Checks a valid req against the pool's own record of its row (owned mode:
    /// `NotFound` for a row not in use, `InvalidArg` for fields that disagree). A pool that
    /// keeps no record of rows accepts every req.
    fn check_req(&self, _req: &Req) -> Result<()> {
        Ok(())
    }

    /// Checks a `free_aligned(row, target, end)` against the pool's record, if it has one.
    fn check_free(&self, _row: u32, _target: u32, _end: u32) -> Result<()> {
        Ok(())
    }

    /// Everything that can fail before the first free (the engine's `read_row`). On error
    /// nothing has changed. A pool whose frees cannot fail has nothing to prepare.
    fn prepare(&mut self, _effects: &[Effect]) -> Result<()> {
        Ok(())
    }

    /// Applies every effect. A failing engine callback cannot be undone: the remaining
    /// effects still run and the error names what failed.
    fn apply(&mut self, effects: &[Effect]) -> Result<()>;

    /// The embedded allocator, in owned mode.
    fn owned(&self) -> Option<&OwnedPool> {
        None
    }

    fn owned_mut(&mut self) -> Option<&mut OwnedPool> {
        None
    }
}
