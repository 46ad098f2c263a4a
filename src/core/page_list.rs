//! A row's page list, with a copy of its last page kept beside it.

use super::alloc::PageAllocator;

/// A row's page list, and a copy of its last page kept beside it: a decode step's token lands
/// on the last page, so its slot comes from the row's record without a read of the list (at
/// 100,000 rows the list's end was a miss of its own a request). Every change goes through
/// `edit` or `take_one`, which keep the copy (the audit checks it); reads see the pages as a
/// slice.
#[derive(Debug, Default)]
pub struct PageList {
    ids: Vec<u32>,
    /// `ids`' last page, 0 when it is empty.
    last: u32,
}

impl PageList {
    /// The list `ids`, with its copy.
    pub fn new(ids: Vec<u32>) -> Self {
        let last = ids.last().copied().unwrap_or(0);
        PageList { ids, last }
    }

    /// The last page (0 when there is none), read from the copy.
    #[inline(always)]
    pub fn last_page(&self) -> u32 {
        self.last
    }

    /// Changes the list, and with it the copy of its last page.
    #[inline(always)]
    pub fn edit<R>(&mut self, f: impl FnOnce(&mut Vec<u32>) -> R) -> R {
        let r = f(&mut self.ids);
        self.last = self.ids.last().copied().unwrap_or(0);
        r
    }

    /// `PageAllocator::take_one` onto this list: a decode step's page.
    #[inline(always)]
    pub fn take_one(&mut self, alloc: &mut PageAllocator) -> Option<u32> {
        let page = alloc.take_one(&mut self.ids)?;
        self.last = page;
        Some(page)
    }

    /// Pages the list has room for without a reallocation.
    pub fn capacity(&self) -> usize {
        self.ids.capacity()
    }

    /// The list itself, for the free stack (a release).
    pub fn into_vec(self) -> Vec<u32> {
        self.ids
    }

    /// Breaks the copy, for the audit's tests.
    #[cfg(test)]
    pub(crate) fn break_last(&mut self, page: u32) {
        self.last = page;
    }
}

impl std::ops::Deref for PageList {
    type Target = [u32];

    #[inline(always)]
    fn deref(&self) -> &[u32] {
        &self.ids
    }
}
