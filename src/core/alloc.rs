//! The embedded paged KV allocator.
//!
//! Policy (deterministic, so tensor-parallel ranks running the same calls get the same
//! indices): free pages form a LIFO stack that starts as `1, 2, 3, …` from the top; an
//! allocation pops pages, a free pushes them back in the order the caller frees them (a
//! row's tail from its lowest position up; `pool_free`'s distinct pages in ascending order).
//! Page 0 is the padding page and never leaves the `Padding` state.

use super::error::{try_vec, Error, Result};

/// Who a page belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageState {
    /// Page 0: never handed out.
    Padding,
    Free,
    /// Mapped by exactly one row, at or past its protected prefix.
    Owned,
    /// Handed to the engine (`pool_alloc`) or inside a protected prefix; `maps` rows map it.
    Held {
        maps: u32,
    },
}

impl PageState {
    /// Four bytes a page: `Free` 0, `Owned` 1, `Padding` 2, `Held { maps }` 3 + maps (maps
    /// never exceeds the row count, which is below 2^31). Half the width of the enum, so a
    /// release walks half the cache lines.
    const fn pack(self) -> u32 {
        match self {
            PageState::Free => 0,
            PageState::Owned => 1,
            PageState::Padding => 2,
            PageState::Held { maps } => 3 + maps,
        }
    }

    const fn unpack(v: u32) -> PageState {
        match v {
            0 => PageState::Free,
            1 => PageState::Owned,
            2 => PageState::Padding,
            m => PageState::Held { maps: m - 3 },
        }
    }
}

pub struct PageAllocator {
    /// `PageState::pack`ed.
    states: Vec<u32>,
    free: Vec<u32>,
}

impl PageAllocator {
    pub fn new(total_pages: u32) -> Result<Self> {
        let n = total_pages as usize;
        let states = try_vec(n, "page states", |p| if p == 0 { PageState::Padding } else { PageState::Free }.pack())?;
        let free = try_vec(n - 1, "the free-page stack", |i| (n - 1 - i) as u32)?;
        Ok(PageAllocator { states, free })
    }

    #[inline]
    pub fn total_pages(&self) -> u32 {
        self.states.len() as u32
    }

    #[inline]
    pub fn free_pages(&self) -> u32 {
        self.free.len() as u32
    }

    pub fn state(&self, page: u32) -> PageState {
        PageState::unpack(self.states[page as usize])
    }

    /// The state of `page`, `None` past the pool.
    pub fn get(&self, page: u32) -> Option<PageState> {
        self.states.get(page as usize).map(|&v| PageState::unpack(v))
    }

    pub fn set_state(&mut self, page: u32, state: PageState) {
        self.states[page as usize] = state.pack();
    }

    /// Pops `n` pages into `out`, each in state `state`; all or nothing (`OutOfMemory` when
    /// the pool, or the host holding `out`, lacks room).
    #[inline(always)]
    pub fn alloc(&mut self, n: u32, state: PageState, out: &mut Vec<u32>) -> Result<()> {
        // One page into a list with room is what a decode step asks for: inlined, it is a
        // pop, a push and a store, where the general path below costs ~70 instructions.
        if n == 1 && out.len() < out.capacity() {
            if let Some(page) = self.free.pop() {
                self.states[page as usize] = state.pack();
                out.push(page);
                return Ok(());
            }
        }
        self.alloc_many(n, state, out)
    }

    #[inline(never)]
    fn alloc_many(&mut self, n: u32, state: PageState, out: &mut Vec<u32>) -> Result<()> {
        if n as usize > self.free.len() {
            return Err(Error::OutOfMemory(format!("{n} pages needed, {} free", self.free.len())));
        }
        // Exact: measured faster than doubling (glibc grows a row's list in place), and a
        // trim no longer shrinks it back every turn.
        if out.try_reserve_exact(n as usize).is_err() {
            return Err(Error::OutOfMemory(format!("no host memory for a list of {n} more pages")));
        }
        let at = self.free.len() - n as usize;
        let (state, popped) = (state.pack(), &self.free[at..]);
        // The stack's top is its end: the pages pop last-pushed first.
        out.extend(popped.iter().rev().copied());
        for &page in popped {
            self.states[page as usize] = state;
        }
        self.free.truncate(at);
        Ok(())
    }

    /// Returns a page the caller has checked is not free.
    pub fn free(&mut self, page: u32) {
        debug_assert!(!matches!(self.state(page), PageState::Free | PageState::Padding));
        self.states[page as usize] = PageState::Free.pack();
        self.free.push(page);
    }

    /// Returns row-owned pages, pushed in the order given (as `free` one by one would).
    pub fn free_owned(&mut self, pages: &[u32]) {
        // Four pages a step: a one-page loop is so short that its speed hung on where the
        // compiler placed it (straddling a 64-byte fetch block made a release 1.3x slower).
        let mut quads = pages.chunks_exact(4);
        for quad in &mut quads {
            for &page in quad {
                self.set_free(page);
            }
        }
        for &page in quads.remainder() {
            self.set_free(page);
        }
        self.free.extend_from_slice(pages);
    }

    #[inline(always)]
    fn set_free(&mut self, page: u32) {
        debug_assert_eq!(self.state(page), PageState::Owned);
        self.states[page as usize] = PageState::Free.pack();
    }

    /// The free stack, for the audit.
    pub fn free_list(&self) -> &[u32] {
        &self.free
    }

    /// Every page's state, page 0 first.
    pub fn states(&self) -> impl Iterator<Item = PageState> + '_ {
        self.states.iter().map(|&v| PageState::unpack(v))
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
        let n = total_pages as usize;
        let free = try_vec(n - 1, "the free SWA-page stack", |i| (n - 1 - i) as u32)?;
        Ok(SwaAllocator { total: total_pages, free })
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
        let at = self.free.len() - n as usize;
        out.extend(self.free[at..].iter().rev().copied());
        self.free.truncate(at);
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
        self.free.extend(ids.iter().copied().filter(|&id| id != 0));
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
        a.alloc(2, PageState::Owned, &mut got).unwrap();
        assert_eq!(got, [1, 2]);
        a.free(1);
        got.clear();
        a.alloc(1, PageState::Owned, &mut got).unwrap();
        assert_eq!(got, [1], "the last page freed is the next handed out");
    }

    #[test]
    fn all_or_nothing() {
        let mut a = PageAllocator::new(3).unwrap();
        let mut got = Vec::new();
        assert!(a.alloc(3, PageState::Owned, &mut got).is_err());
        assert!(got.is_empty());
        assert_eq!(a.free_pages(), 2);
        assert_eq!(a.state(0), PageState::Padding);
    }

    #[test]
    fn states_pack_into_four_bytes() {
        for s in [PageState::Free, PageState::Owned, PageState::Padding, PageState::Held { maps: 0 }] {
            assert_eq!(PageState::unpack(s.pack()), s);
        }
        let most = PageState::Held { maps: i32::MAX as u32 };
        assert_eq!(PageState::unpack(most.pack()), most);
    }

    #[test]
    fn bulk_free_pushes_in_order() {
        let mut a = PageAllocator::new(6).unwrap();
        let mut got = Vec::new();
        a.alloc(4, PageState::Owned, &mut got).unwrap();
        assert_eq!(got, [1, 2, 3, 4]);
        a.free_owned(&got[1..]);
        got.clear();
        a.alloc(2, PageState::Owned, &mut got).unwrap();
        assert_eq!(got, [4, 3], "LIFO, as one-by-one frees would give");
        assert_eq!(a.states().filter(|s| *s == PageState::Free).count(), 2);
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
    }
}
