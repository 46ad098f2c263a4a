//! What the cache keeps beside every row for the per-request checks (`RowMeta`), and the
//! numbering of batch calls that finds a row named twice in one pass (`BatchMarks`).

use std::cell::Cell;

use super::error::{bail, Result};

/// A row's facts the per-request checks read, side by side. In owned mode they share a cache
/// line with the row's mapping (`RowRecord`).
#[derive(Debug, Clone, Default)]
pub(crate) struct RowMeta {
    /// Owned mode bumps it when `alloc_row` hands the row out, external mode when libskv
    /// hands the row back through `free_row`. Never 0 once the row was handed out (0 on a req
    /// means "not stamped").
    pub(crate) generation: u32,
    /// An idle session slot holds the row (see `guard_idle_session_row`; kept by `sync_idle`).
    pub(crate) idle_slot: bool,
    /// A ticket's copy reads or writes the row's pages (`Pins`): its frees drain.
    pub(crate) pinned: bool,
    /// The last batch call that named the row, and the row's position in it (`BatchMarks`).
    /// A cell: a batch marks its rows while its checks read the cache.
    pub(crate) batch: Cell<(u32, u32)>,
}

/// Numbers the batch calls, so a batch finds a row named twice in one pass: each row's
/// `RowMeta::batch` holds the last batch call that named it and the row's position there.
#[derive(Default)]
pub(crate) struct BatchMarks {
    /// The batch call in progress (or the last one).
    pub(crate) stamp: u32,
    /// What out_loc held before the batch extend in progress wrote it (kept to reuse the
    /// allocation).
    pub(crate) saved_out: Vec<i32>,
}

impl BatchMarks {
    /// Copies `out` aside, for a failing batch to put back.
    pub(crate) fn save_out(&mut self, out: &[i32]) -> Result<()> {
        self.saved_out.clear();
        if self.saved_out.try_reserve(out.len()).is_err() {
            bail!(OutOfMemory, "no host memory to keep a copy of out_loc's {} values", out.len());
        }
        self.saved_out.extend_from_slice(out);
        Ok(())
    }

    /// Starts a batch call: a stamp no row's mark holds yet. `marks` are every row's
    /// `RowMeta::batch`, cleared when the stamp wraps (once every 2^32 calls).
    pub(crate) fn begin<'a>(&mut self, marks: impl IntoIterator<Item = &'a Cell<(u32, u32)>>) -> u32 {
        self.stamp = self.stamp.wrapping_add(1);
        if self.stamp == 0 {
            marks.into_iter().for_each(|m| m.set((0, 0)));
            self.stamp = 1;
        }
        self.stamp
    }
}
