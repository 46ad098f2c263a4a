//! The sliding-window pool's page allocator.

use super::alloc::FreeStack;
use super::error::Result;

/// SWA entries from this many up are pushed onto the free stack with one copy (see
/// `SwaAllocator::free_dropped`); fewer, one by one.
const COPY_FROM: usize = 16;

/// The sliding-window pool's pages (owned mode with an SWA pool). Each SWA page is either
/// on the free stack or named by exactly one full page's entry (a row's `swa_pages`, or the
/// engine-held table): those entries are the record, and clearing one as its page goes back
/// is what keeps a page from being freed twice, so no per-page state is kept. Same policy
/// as `PageAllocator`: a LIFO stack starting `1, 2, 3, ...`, page 0 never handed out.
pub struct SwaAllocator {
    total: u32,
    free: FreeStack,
}

impl SwaAllocator {
    pub fn new(total_pages: u32) -> Result<Self> {
        Self::named(total_pages, "the free SWA-page stack")
    }

    /// `new`, for another pool of the same kind (the host tier's), named `what` when the host
    /// refuses its stack.
    pub(crate) fn named(total_pages: u32, what: &str) -> Result<Self> {
        // Rows' SWA lists are never pushed whole (a window leaves holes in them): one run.
        Ok(SwaAllocator { total: total_pages, free: FreeStack::full(total_pages, what, 0, 0)? })
    }

    #[inline]
    pub fn total_pages(&self) -> u32 {
        self.total
    }

    #[inline]
    pub fn free_pages(&self) -> u32 {
        self.free.len() as u32
    }

    /// Pops `n` pages into `out`; the caller has checked `n <= free_pages()` and reserved
    /// room in `out`.
    #[inline]
    pub fn alloc(&mut self, n: u32, out: &mut Vec<u32>) {
        self.free.pop_into(n as usize, out);
    }

    /// `alloc(1, out)` when a page is free and `out` has room (nothing to allocate): the page,
    /// or `None` having changed nothing.
    #[inline(always)]
    pub fn take_one(&mut self, out: &mut Vec<u32>) -> Option<u32> {
        self.free.take_one(out)
    }

    /// `PageAllocator::unalloc` for the SWA pool.
    pub fn unalloc(&mut self, ids: &[u32]) {
        self.free.unpop(ids);
    }

    /// Returns the pages `ids` names, skipping 0 (an entry the window already emptied), and
    /// empties every entry.
    #[inline]
    pub fn free_entries(&mut self, ids: &mut [u32]) {
        // Read, then cleared in a pass of its own: a loop that also wrote the entries kept
        // reloading the stack's length from memory, one store-to-load wait per page.
        self.free_dropped(ids);
        ids.fill(0);
    }

    /// `free_entries` for entries the caller drops right after: nothing is cleared.
    #[inline]
    pub fn free_dropped(&mut self, ids: &[u32]) {
        // Entries the window emptied are mostly in the row's passed run, which callers skip:
        // the rest is usually all pages, and is then pushed without a test each. (The test
        // for an empty entry folds, rather than stopping at the first, so that it runs in
        // vector steps. A few entries, a trim's, are pushed one by one: for them the copy call
        // made a hybrid match at 100,000 sessions 2x slower. A release's window of entries is
        // copied, one reserve and one copy rather than a push and its room check each.)
        if ids.iter().fold(false, |any, &id| any | (id == 0)) {
            for &id in ids.iter().filter(|&&id| id != 0) {
                self.free.push(id);
            }
        } else if ids.len() >= COPY_FROM {
            self.free.extend(ids);
        } else {
            for &id in ids {
                self.free.push(id);
            }
        }
    }

    /// The `n` pages `alloc(n)` would hand out after `free_dropped(pushed)`: a plan's
    /// destinations, known before anything changes (the caller checked there are `n`).
    pub(crate) fn predict(&self, pushed: &[u32], n: usize) -> Vec<u32> {
        self.free.predict(pushed, n)
    }

    /// Every page on the free stack, bottom first, for the audit.
    pub fn free_stack(&self) -> impl Iterator<Item = &u32> + '_ {
        self.free.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn swa_pages_lifo_and_emptied_entries() {
        let mut a = SwaAllocator::new(5).unwrap();
        let mut ids = Vec::new();
        a.alloc(3, &mut ids);
        assert_eq!(ids, [1, 2, 3]);
        ids[1] = 0;
        a.free_entries(&mut ids);
        assert_eq!(ids, [0, 0, 0], "every entry emptied");
        assert_eq!(a.free_pages(), 3, "the emptied entry gave nothing back");
        let mut got = Vec::new();
        a.alloc(1, &mut got);
        assert_eq!(got, [3], "the last page freed is the next handed out");
        // Entries without an emptied one are pushed whole, in the same order.
        a.alloc(2, &mut got);
        assert_eq!(got, [3, 1, 4]);
        a.free_dropped(&got[..2]);
        a.free_dropped(&[0, 4, 0]);
        let mut again = Vec::new();
        a.alloc(3, &mut again);
        assert_eq!(again, [4, 1, 3]);
    }

    #[test]
    fn a_window_of_entries_is_copied_in_the_order_given() {
        // From COPY_FROM entries up, one copy: the stack as pushing them one by one leaves it.
        let n = COPY_FROM as u32 + 3;
        let mut a = SwaAllocator::new(2 * n + 1).unwrap();
        let (mut first, mut ids) = (Vec::new(), Vec::new());
        a.alloc(n, &mut first);
        a.alloc(n, &mut ids);
        a.free_dropped(&first[..2]);
        a.free_dropped(&ids);
        let mut again = Vec::new();
        a.alloc(n + 2, &mut again);
        let pushed: Vec<u32> = first[..2].iter().chain(&ids).rev().copied().collect();
        assert_eq!(again, pushed, "popped last-pushed first");
        assert_eq!(a.free_pages(), 0);
    }
}
