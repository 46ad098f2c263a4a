//! The embedded paged KV allocator.
//!
//! Policy (deterministic, so tensor-parallel ranks running the same calls get the same
//! indices): free pages form a LIFO stack that starts as `1, 2, 3, …` from the top; an
//! allocation pops pages, a free pushes them back in the order the caller frees them (a
//! row's tail from its lowest position up; `pool_free`'s distinct pages in ascending order).
//! Page 0 is the padding page: never on the stack, never handed out.

use super::error::{try_vec, Error, Result};

/// The policy above, for both pools' free stacks: pages `1..total`, page 1 on top (the end).
fn full_stack(total: u32, what: &str) -> Result<Vec<u32>> {
    let n = total as usize;
    try_vec(n - 1, what, |i| (n - 1 - i) as u32)
}

/// Pops the top `n` pages of `stack` into `out`, last-pushed first; the caller has checked
/// that `n` are there.
#[inline(always)]
fn pop_into(stack: &mut Vec<u32>, n: usize, out: &mut Vec<u32>) {
    let at = stack.len() - n;
    out.extend(stack[at..].iter().rev().copied());
    stack.truncate(at);
}

/// Puts back `popped`, the end of a list the last `pop_into`s filled: the stack is then
/// exactly as before them.
fn unpop(stack: &mut Vec<u32>, popped: &[u32]) {
    stack.extend(popped.iter().rev());
}

/// The full pool's pages. A page is free (on the stack), a row's own (in one row's list past
/// its protected prefix), or engine-held (handed out by `pool_alloc`, or inside a protected
/// prefix). Only the engine-held ones carry a per-page word, their map count: the engine hands
/// those back by index, so they need checking one by one, while a row's own pages only ever
/// come back from the row's list. An allocation or a release therefore writes no word per page
/// (at 100,000 sessions each such word was a cache miss). Where free and row-owned must be told
/// apart (an error's message, `page_refs`, the audit), the free stack says which.
pub struct PageAllocator {
    /// Per page: 0 unless engine-held, then 1 + the rows mapping it.
    held: Vec<u32>,
    free: Vec<u32>,
}

impl PageAllocator {
    pub fn new(total_pages: u32) -> Result<Self> {
        let n = total_pages as usize;
        let held = try_vec(n, "engine-held pages' map counts", |_| 0)?;
        Ok(PageAllocator { held, free: full_stack(total_pages, "the free-page stack")? })
    }

    #[inline]
    pub fn total_pages(&self) -> u32 {
        self.held.len() as u32
    }

    #[inline]
    pub fn free_pages(&self) -> u32 {
        self.free.len() as u32
    }

    /// How many rows map `page` if it is engine-held; `None` for any other page (free, a
    /// row's own, page 0, or past the pool).
    #[inline]
    pub fn held_maps(&self, page: u32) -> Option<u32> {
        match self.held.get(page as usize) {
            Some(&m) if m > 0 => Some(m - 1),
            _ => None,
        }
    }

    /// `page` becomes engine-held, mapped by `maps` rows (a row's page joining the engine's
    /// tree, or a map count changing).
    #[inline]
    pub fn set_held(&mut self, page: u32, maps: u32) {
        self.held[page as usize] = maps + 1;
    }

    /// Pops `n` pages into a row's list `out`; all or nothing (`OutOfMemory` when the pool, or
    /// the host holding `out`, lacks room).
    #[inline(always)]
    pub fn alloc(&mut self, n: u32, out: &mut Vec<u32>) -> Result<()> {
        // One page into a list with room is what a decode step asks for: inlined, it is a
        // pop and a push, where the general path below costs ~70 instructions.
        if n == 1 && self.take_one(out) {
            return Ok(());
        }
        self.alloc_many(n, out)
    }

    /// Pops one page into `out` if a page is free and `out` has room (nothing to allocate):
    /// whether it did.
    #[inline(always)]
    pub fn take_one(&mut self, out: &mut Vec<u32>) -> bool {
        if out.len() < out.capacity() {
            if let Some(page) = self.free.pop() {
                out.push(page);
                return true;
            }
        }
        false
    }

    /// `alloc`, the pages handed to the engine (engine-held, mapped by no row).
    pub fn alloc_held(&mut self, n: u32, out: &mut Vec<u32>) -> Result<()> {
        let from = out.len();
        self.alloc_many(n, out)?;
        for &page in &out[from..] {
            self.held[page as usize] = 1;
        }
        Ok(())
    }

    #[inline(never)]
    fn alloc_many(&mut self, n: u32, out: &mut Vec<u32>) -> Result<()> {
        if n as usize > self.free.len() {
            return Err(Error::OutOfMemory(format!("{n} pages needed, {} free", self.free.len())));
        }
        // Exact: measured faster than doubling (glibc grows a row's list in place), and a
        // trim no longer shrinks it back every turn.
        if out.try_reserve_exact(n as usize).is_err() {
            return Err(Error::OutOfMemory(format!("no host memory for a list of {n} more pages")));
        }
        pop_into(&mut self.free, n as usize, out);
        Ok(())
    }

    /// Puts back `pages`, the end of a list the last allocations filled: the stack is then
    /// exactly as before them.
    pub fn unalloc(&mut self, pages: &[u32]) {
        unpop(&mut self.free, pages);
    }

    /// Takes back an engine-held page no row maps (the caller has checked).
    pub fn free_held(&mut self, page: u32) {
        debug_assert_eq!(self.held_maps(page), Some(0));
        self.held[page as usize] = 0;
        self.free.push(page);
    }

    /// Returns a row's own pages, pushed in the order given (as one by one would).
    #[inline]
    pub fn free_owned(&mut self, pages: &[u32]) {
        self.free.extend_from_slice(pages);
    }

    /// The free stack, for the audit.
    pub fn free_list(&self) -> &[u32] {
        &self.free
    }

    /// The free stack, for tests that break it on purpose.
    #[cfg(test)]
    pub(crate) fn free_stack_mut(&mut self) -> &mut Vec<u32> {
        &mut self.free
    }

    /// Per page, whether it is on the free stack: for the paths that must tell a free page
    /// from a row's own (linear in the free pages, so never on a hot path).
    #[cold]
    pub fn free_marks(&self) -> Result<Vec<bool>> {
        let mut marks = try_vec(self.held.len(), "the free-page marks", |_| false)?;
        for &p in &self.free {
            if let Some(m) = marks.get_mut(p as usize) {
                *m = true;
            }
        }
        Ok(marks)
    }
}

/// The sliding-window pool's pages (owned mode with an SWA pool). Each SWA page is either
/// on the free stack or named by exactly one full page's entry (a row's `swa_pages`, or the
/// engine-held table): those entries are the record, and clearing one as its page goes back
/// is what keeps a page from being freed twice, so no per-page state is kept. Same policy
/// as `PageAllocator`: a LIFO stack starting `1, 2, 3, ...`, page 0 never handed out.
pub struct SwaAllocator {
    total: u32,
    free: Vec<u32>,
}

impl SwaAllocator {
    pub fn new(total_pages: u32) -> Result<Self> {
        Ok(SwaAllocator { total: total_pages, free: full_stack(total_pages, "the free SWA-page stack")? })
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
        pop_into(&mut self.free, n as usize, out);
    }

    /// `PageAllocator::unalloc` for the SWA pool.
    pub fn unalloc(&mut self, ids: &[u32]) {
        unpop(&mut self.free, ids);
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
        // vector steps. A push loop, not `extend_from_slice`: for a trim's few entries the
        // copy call made a hybrid match at 100,000 sessions 2x slower.)
        if ids.iter().fold(false, |any, &id| any | (id == 0)) {
            self.free.extend(ids.iter().copied().filter(|&id| id != 0));
        } else {
            for &id in ids {
                self.free.push(id);
            }
        }
    }

    /// The free stack, for the audit.
    pub fn free_list(&self) -> &[u32] {
        &self.free
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lifo_from_page_one() {
        let mut a = PageAllocator::new(5).unwrap();
        let mut got = Vec::new();
        a.alloc(2, &mut got).unwrap();
        assert_eq!(got, [1, 2]);
        a.free_owned(&got[..1]);
        got.clear();
        a.alloc(1, &mut got).unwrap();
        assert_eq!(got, [1], "the last page freed is the next handed out");
    }

    #[test]
    fn all_or_nothing() {
        let mut a = PageAllocator::new(3).unwrap();
        let mut got = Vec::new();
        assert!(a.alloc(3, &mut got).is_err());
        assert!(a.alloc_held(3, &mut got).is_err());
        assert!(got.is_empty());
        assert_eq!(a.free_pages(), 2);
        assert_eq!(a.held_maps(0), None, "page 0 is never engine-held");
    }

    #[test]
    fn only_engine_held_pages_carry_a_map_count() {
        let mut a = PageAllocator::new(6).unwrap();
        let mut row = Vec::new();
        a.alloc(2, &mut row).unwrap();
        let mut engine = Vec::new();
        a.alloc_held(2, &mut engine).unwrap();
        assert_eq!((row.as_slice(), engine.as_slice()), ([1, 2].as_slice(), [3, 4].as_slice()));
        assert_eq!(row.iter().map(|&p| a.held_maps(p)).collect::<Vec<_>>(), [None, None]);
        assert_eq!(engine.iter().map(|&p| a.held_maps(p)).collect::<Vec<_>>(), [Some(0), Some(0)]);
        a.set_held(2, 1);
        assert_eq!(a.held_maps(2), Some(1), "a row's page joins the engine's tree");
        a.free_held(4);
        assert_eq!(a.held_maps(4), None);
        let marks = a.free_marks().unwrap();
        assert_eq!(marks, [false, false, false, false, true, true], "free: page 5, then 4");
        assert_eq!(a.held_maps(6), None, "past the pool");
    }

    #[test]
    fn bulk_free_pushes_in_order() {
        let mut a = PageAllocator::new(6).unwrap();
        let mut got = Vec::new();
        a.alloc(4, &mut got).unwrap();
        assert_eq!(got, [1, 2, 3, 4]);
        a.free_owned(&got[1..]);
        got.clear();
        a.alloc(2, &mut got).unwrap();
        assert_eq!(got, [4, 3], "LIFO, as one-by-one frees would give");
        assert_eq!(a.free_marks().unwrap().iter().filter(|&&f| f).count(), 2);
    }

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
}
