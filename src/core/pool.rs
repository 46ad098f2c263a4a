//! What the session logic asks of a KV pool. The session operations compute a list of
//! effects first; the pool checks and prepares all of them before the first one is applied,
//! so a call either fails having changed nothing, or runs to the end.

use super::error::Result;
use super::req::Req;

/// One externally visible step of an operation, in the order it happens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    /// Drop the prefix-tree lock a session inherited from its first request.
    DecLockRef { node: u64, receipt: u64 },
    /// Hand back KV slots `row[start..end)`. The row keeps `keep` tokens mapped afterwards;
    /// `[keep, start)` lies in the partial page that still holds committed tokens. Positions
    /// in `[dead_lo, dead_hi)` already gave their SWA slots back (the window passed them):
    /// they go back to the full pool only (see `split`).
    FreeKv { row: u32, keep: u32, start: u32, end: u32, dead_lo: u32, dead_hi: u32 },
    /// Hand back the SWA slots of `row[start..end)` only: the window moved past them.
    FreeSwa { row: u32, start: u32, end: u32 },
    /// Return the row itself.
    FreeRow { row: u32 },
    /// Free engine auxiliary state.
    FreeAux { aux: i64 },
}

impl Effect {
    /// The row the effect frees from, if it frees KV.
    #[inline(always)]
    pub fn freed_row(&self) -> Option<u32> {
        match *self {
            Effect::FreeKv { row, .. } | Effect::FreeSwa { row, .. } | Effect::FreeRow { row } => Some(row),
            Effect::DecLockRef { .. } | Effect::FreeAux { .. } => None,
        }
    }
}

/// Which pools a piece of a free goes back to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pools {
    Full,
    Swa,
    Both,
}

/// One piece of a row free: positions `[start, end)` back to `pools`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    pub start: u32,
    pub end: u32,
    pub pools: Pools,
}

/// sglang's `free_kv_row_segments` for one range: the part inside `[dead_lo, dead_hi)` goes
/// back full-side only, first; the rest to both pools, in row order. Empty pieces are left
/// out.
pub fn split(start: u32, end: u32, dead_lo: u32, dead_hi: u32) -> smallvec::SmallVec<[Segment; 3]> {
    let mut out = smallvec::SmallVec::new();
    if start >= end {
        return out;
    }
    let lo = dead_lo.clamp(start, end);
    let hi = dead_hi.clamp(start, end);
    if hi <= lo {
        out.push(Segment { start, end, pools: Pools::Both });
        return out;
    }
    out.push(Segment { start: lo, end: hi, pools: Pools::Full });
    if lo > start {
        out.push(Segment { start, end: lo, pools: Pools::Both });
    }
    if end > hi {
        out.push(Segment { start: hi, end, pools: Pools::Both });
    }
    out
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

    /// Checks that the pool could free everything the req's row holds: a pool that cannot
    /// free the full side alone refuses a req whose window already freed positions.
    fn check_cursor(&self, _req: &Req) -> Result<()> {
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

    /// Copies `req_to_token[row, start..end)` into `out` (`end - start` values): the page ids
    /// an export of an engine's row names (`Cache::export`). A pool that cannot read its
    /// rows refuses with `Unsupported`; on error `out` holds nothing to use.
    fn read_row(&mut self, row: u32, start: u32, end: u32, _out: &mut [i32]) -> Result<()> {
        Err(super::error::Error::Unsupported(format!(
            "this pool cannot read row {row}'s indices [{start}, {end}): an export needs the engine's read_row"
        )))
    }

    /// Whether the pool can hand back the SWA side of a row alone (`FreeSwa`).
    fn frees_swa(&self) -> std::result::Result<(), String> {
        Err("this pool cannot free the SWA side alone".into())
    }
}
