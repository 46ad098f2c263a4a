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

pub struct PageAllocator {
    states: Vec<PageState>,
    free: Vec<u32>,
}

impl PageAllocator {
    pub fn new(total_pages: u32) -> Result<Self> {
        let n = total_pages as usize;
        let states = try_vec(n, "page states", |p| if p == 0 { PageState::Padding } else { PageState::Free })?;
        let free = try_vec(n - 1, "the free-page stack", |i| (n - 1 - i) as u32)?;
        Ok(PageAllocator { states, free })
    }

    pub fn total_pages(&self) -> u32 {
        self.states.len() as u32
    }

    pub fn free_pages(&self) -> u32 {
        self.free.len() as u32
    }

    pub fn state(&self, page: u32) -> PageState {
        self.states[page as usize]
    }

    pub fn set_state(&mut self, page: u32, state: PageState) {
        self.states[page as usize] = state;
    }

    /// Pops `n` pages into `out`, each in state `state`; all or nothing (`OutOfMemory` when
    /// the pool, or the host holding `out`, lacks room).
    pub fn alloc(&mut self, n: u32, state: PageState, out: &mut Vec<u32>) -> Result<()> {
        if n as usize > self.free.len() {
            return Err(Error::OutOfMemory(format!("{n} pages needed, {} free", self.free.len())));
        }
        if out.try_reserve_exact(n as usize).is_err() {
            return Err(Error::OutOfMemory(format!("no host memory for a list of {n} more pages")));
        }
        for _ in 0..n {
            let page = self.free.pop().expect("counted above");
            self.states[page as usize] = state;
            out.push(page);
        }
        Ok(())
    }

    /// Returns a page the caller has checked is not free.
    pub fn free(&mut self, page: u32) {
        debug_assert!(!matches!(self.states[page as usize], PageState::Free | PageState::Padding));
        self.states[page as usize] = PageState::Free;
        self.free.push(page);
    }

    /// The free stack, for the audit.
    pub fn free_list(&self) -> &[u32] {
        &self.free
    }

    pub fn states(&self) -> &[PageState] {
        &self.states
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
}
