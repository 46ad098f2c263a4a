//! What a device copy of `req_to_token` must learn at its next sync: for each row, the span
//! of positions mapped anew since the last one. Only new mappings matter: positions past a
//! row's mapped length are never read (attention kernels read a row up to its sequence
//! length), so a trim or a freed row needs no upload, and a row's later extension rewrites
//! the positions it reuses.

use super::error::{try_vec, Result};

/// Changed spans per row, `lo..hi` (empty when `lo >= hi`), and the rows that have one.
pub struct Dirty {
    spans: Vec<(u32, u32)>,
    rows: Vec<u32>,
}

impl Dirty {
    pub fn new(num_rows: u32) -> Result<Dirty> {
        Ok(Dirty { spans: try_vec(num_rows as usize, "the device copy's row spans", |_| (0, 0))?, rows: Vec::new() })
    }

    /// Positions `lo..hi` of `row` were mapped anew.
    pub fn mark(&mut self, row: u32, lo: u32, hi: u32) {
        if lo >= hi {
            return;
        }
        let span = &mut self.spans[row as usize];
        if span.0 >= span.1 {
            *span = (lo, hi);
            self.rows.push(row);
        } else {
            *span = (span.0.min(lo), span.1.max(hi));
        }
    }

    /// Every changed span once, clipped by `len_of(row)` (the row's mapped length now),
    /// forgetting them.
    pub fn drain(&mut self, len_of: impl Fn(u32) -> u32, mut each: impl FnMut(u32, u32, u32)) {
        for row in std::mem::take(&mut self.rows) {
            let (lo, hi) = std::mem::take(&mut self.spans[row as usize]);
            let hi = hi.min(len_of(row));
            if lo < hi {
                each(row, lo, hi);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_merge_and_clip() {
        let mut d = Dirty::new(4).unwrap();
        d.mark(2, 10, 12);
        d.mark(2, 4, 6);
        d.mark(1, 3, 3);
        d.mark(3, 0, 8);
        let mut got = Vec::new();
        d.drain(|r| if r == 3 { 5 } else { 100 }, |r, lo, hi| got.push((r, lo, hi)));
        assert_eq!(got, [(2, 4, 12), (3, 0, 5)]);
        d.drain(|_| 100, |_, _, _| panic!("drained twice"));
    }
}
