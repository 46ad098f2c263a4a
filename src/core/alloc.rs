//! The embedded paged KV allocator: the free stack both pools use, and the full pool's pages
//! (the SWA pool's are `swa_alloc`'s).
//!
//! Policy (deterministic, so tensor-parallel ranks running the same calls get the same
//! indices): free pages form a LIFO stack that starts as `1, 2, 3, …` from the top; an
//! allocation pops pages, a free pushes them back in the order the caller frees them (a
//! row's tail from its lowest position up; `pool_free`'s distinct pages in ascending order).
//! Page 0 is the padding page: never on the stack, never handed out.

use std::mem;

use super::error::{try_vec, Error, Result};

/// A row's page list shorter than this is copied onto the free stack at a release rather than
/// becoming a run of it: a run costs a list of its own, which a few pages do not repay.
const MIN_RUN: usize = 32;

/// The free stack of one pool, the policy above, kept as runs: the stack is the runs
/// concatenated, bottom first, and pops and pushes work on the top one. A released row's
/// page list becomes a run whole, so a release moves a list instead of copying its pages (at
/// 100,000 sessions that copy, and the read of the list behind it, were most of a release).
/// A run emptied by allocations is kept as a spare list for the next row taken. Every run
/// below the top holds at least half its room in pages, so the stack's lists never hold more
/// than twice the free pages, plus the top's.
pub(crate) struct FreeStack {
    /// The top run.
    top: Vec<u32>,
    /// The runs under it, bottom first.
    below: Vec<Vec<u32>>,
    /// Pages in `below`.
    below_len: usize,
    /// Emptied runs, for rows' page lists.
    spares: Vec<Vec<u32>>,
    /// At most this many spares are kept, none with room for more than `max_spare_room`
    /// pages: the rest go back to the host.
    max_spares: usize,
    max_spare_room: usize,
}

impl FreeStack {
    /// Pages `1..total`, page 1 on top.
    pub(super) fn full(total: u32, what: &str, max_spares: usize, max_spare_room: usize) -> Result<Self> {
        let n = total as usize;
        let mut spares = Vec::new();
        if spares.try_reserve_exact(max_spares).is_err() {
            return Err(Error::OutOfMemory(format!("no host memory for {max_spares} spare page lists")));
        }
        Ok(FreeStack {
            top: try_vec(n - 1, what, |i| (n - 1 - i) as u32)?,
            below: Vec::new(),
            below_len: 0,
            spares,
            max_spares,
            max_spare_room,
        })
    }

    #[inline(always)]
    pub(super) fn len(&self) -> usize {
        self.top.len() + self.below_len
    }

    #[inline(always)]
    fn pop(&mut self) -> Option<u32> {
        match self.top.pop() {
            Some(page) => Some(page),
            None => self.pop_below(),
        }
    }

    /// Pops one page into `out` if a page is free and `out` has room (a decode step's page):
    /// the page, or `None` having changed nothing.
    #[inline(always)]
    pub(super) fn take_one(&mut self, out: &mut Vec<u32>) -> Option<u32> {
        if out.len() < out.capacity() {
            if let Some(page) = self.pop() {
                out.push(page);
                return Some(page);
            }
        }
        None
    }

    #[cold]
    #[inline(never)]
    fn pop_below(&mut self) -> Option<u32> {
        self.next_run()?;
        self.top.pop()
    }

    /// The emptied top gives way to the run under it: `None` when there is none.
    fn next_run(&mut self) -> Option<()> {
        let run = self.below.pop()?;
        self.below_len -= run.len();
        let emptied = mem::replace(&mut self.top, run);
        self.keep_spare(emptied);
        Some(())
    }

    fn keep_spare(&mut self, list: Vec<u32>) {
        debug_assert!(list.is_empty());
        if self.spares.len() < self.max_spares && list.capacity() <= self.max_spare_room {
            self.spares.push(list);
        }
    }

    /// Pops the top `n` pages into `out`, last-pushed first; the caller has checked that `n`
    /// are there.
    #[inline(always)]
    pub(super) fn pop_into(&mut self, mut n: usize, out: &mut Vec<u32>) {
        loop {
            let k = n.min(self.top.len());
            let at = self.top.len() - k;
            out.extend(self.top[at..].iter().rev().copied());
            self.top.truncate(at);
            n -= k;
            if n == 0 {
                return;
            }
            self.next_run().expect("the caller checked that n pages are free");
        }
    }

    /// Puts back `popped`, the end of a list the last pops filled: the stack is then exactly
    /// as before them (the concatenation; a run the pops emptied is not restored).
    pub(super) fn unpop(&mut self, popped: &[u32]) {
        self.top.extend(popped.iter().rev());
    }

    #[inline(always)]
    pub(super) fn push(&mut self, page: u32) {
        self.top.push(page);
    }

    /// Pushes `pages` in the order given.
    #[inline(always)]
    pub(super) fn extend(&mut self, pages: &[u32]) {
        self.top.extend_from_slice(pages);
    }

    /// Pushes `list[from..]` in order, and keeps the list. A list long enough, and not mostly
    /// room, becomes the top run whole; the top it covers is cut to its pages first if it is
    /// mostly room, so the runs below stay dense. Any other is copied onto the top and kept,
    /// emptied, as a spare.
    fn push_list(&mut self, mut list: Vec<u32>, from: usize) {
        let n = list.len() - from;
        if from > 0 || n < MIN_RUN || list.capacity() > 2 * n || self.below.try_reserve(1).is_err() {
            self.top.extend_from_slice(&list[from..]);
            list.clear();
            self.keep_spare(list);
            return;
        }
        let mut covered = mem::replace(&mut self.top, list);
        if covered.is_empty() {
            self.keep_spare(covered);
            return;
        }
        if covered.capacity() > 2 * covered.len() {
            covered.shrink_to_fit();
        }
        self.below_len += covered.len();
        self.below.push(covered);
    }

    /// An empty list for a row: a spare, or a new one.
    fn take_spare(&mut self) -> Vec<u32> {
        self.spares.pop().unwrap_or_default()
    }

    /// The `n` pages `pop_into(n)` would hand out after `extend(pushed)` (0s skipped, the
    /// caller checked there are `n`), last pushed first: known before anything changes.
    pub(super) fn predict(&self, pushed: &[u32], n: usize) -> Vec<u32> {
        let runs = self.below.iter().rev().flat_map(|r| r.iter().rev());
        pushed.iter().rev().filter(|&&p| p != 0).chain(self.top.iter().rev()).chain(runs).take(n).copied().collect()
    }

    /// Every page on the stack, bottom first.
    pub(super) fn iter(&self) -> impl Iterator<Item = &u32> + '_ {
        self.below.iter().flatten().chain(&self.top)
    }
}

/// Pages a row's list grows by beyond what an extend needs, when it has to grow: room for the
/// pages of the decode steps that follow (8 pages: 32 bytes a row at most).
pub(crate) const GROW_ROOM: usize = 8;

/// Makes room in a row's page list (or SWA list) for `n` more pages; false when the host has
/// no memory for it. A list that has to grow grows by `n` and `GROW_ROOM` more: exactly what
/// is needed was measured faster than doubling (glibc grows a row's list in place), but left
/// every decode step that takes a page after a prefill to grow the list by one, on the path
/// that checks in order (the slow path), where with room it takes the page on the fast one (`take_one`):
/// the simulator's extend batches ran 1.4-2.1 -> 0.8-1.2 us a call (p50).
pub(crate) fn reserve_pages(list: &mut Vec<u32>, n: usize) -> bool {
    list.capacity() - list.len() >= n || list.try_reserve_exact(n + GROW_ROOM).is_ok()
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
    free: FreeStack,
}

impl PageAllocator {
    /// A pool of `total_pages`, keeping up to `rows` spare page lists of at most `row_pages`
    /// pages' room (see `FreeStack`).
    pub fn new(total_pages: u32, rows: usize, row_pages: usize) -> Result<Self> {
        let n = total_pages as usize;
        let held = try_vec(n, "engine-held pages' map counts", |_| 0)?;
        Ok(PageAllocator { held, free: FreeStack::full(total_pages, "the free-page stack", rows, row_pages)? })
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
        if n == 1 && self.take_one(out).is_some() {
            return Ok(());
        }
        self.alloc_many(n, out)
    }

    /// Pops one page into `out` if a page is free and `out` has room (nothing to allocate):
    /// the page, or `None` having changed nothing.
    #[inline(always)]
    pub fn take_one(&mut self, out: &mut Vec<u32>) -> Option<u32> {
        self.free.take_one(out)
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
        if !reserve_pages(out, n as usize) {
            return Err(Error::OutOfMemory(format!("no host memory for a list of {n} more pages")));
        }
        self.free.pop_into(n as usize, out);
        Ok(())
    }

    /// Puts back `pages`, the end of a list the last allocations filled: the stack is then
    /// exactly as before them.
    pub fn unalloc(&mut self, pages: &[u32]) {
        self.free.unpop(pages);
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
        self.free.extend(pages);
    }

    /// Takes back a released row's page list, whose pages from `from` on are the row's own:
    /// pushed in order, as `free_owned` would, but the list itself may become part of the
    /// stack (no copy).
    #[inline]
    pub fn free_list_of_row(&mut self, list: Vec<u32>, from: usize) {
        self.free.push_list(list, from);
    }

    /// An empty page list for a row taken: one a released row or an emptied run left, when
    /// there is one.
    #[inline]
    pub fn take_list(&mut self) -> Vec<u32> {
        self.free.take_spare()
    }

    /// Every page on the free stack, bottom first, for the audit.
    pub fn free_stack(&self) -> impl Iterator<Item = &u32> + '_ {
        self.free.iter()
    }

    /// The top of the free stack (the next page handed out), for the audit's tests.
    #[cfg(test)]
    pub(crate) fn next_free(&self) -> Option<u32> {
        self.free.iter().last().copied()
    }

    /// The free stack's top run, for tests that break it on purpose.
    #[cfg(test)]
    pub(crate) fn free_stack_mut(&mut self) -> &mut Vec<u32> {
        &mut self.free.top
    }

    /// Per page, whether it is on the free stack: for the paths that must tell a free page
    /// from a row's own (linear in the free pages, so never on a hot path).
    #[cold]
    pub fn free_marks(&self) -> Result<Vec<bool>> {
        let mut marks = try_vec(self.held.len(), "the free-page marks", |_| false)?;
        for &p in self.free.iter() {
            if let Some(m) = marks.get_mut(p as usize) {
                *m = true;
            }
        }
        Ok(marks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An allocator of `total_pages` (4 rows of 64 pages) with `n` pages handed to a row.
    fn allocated(total_pages: u32, n: u32) -> (PageAllocator, Vec<u32>) {
        let mut a = PageAllocator::new(total_pages, 4, 64).unwrap();
        let mut got = Vec::new();
        a.alloc(n, &mut got).unwrap();
        (a, got)
    }

    #[test]
    fn lifo_from_page_one() {
        let (mut a, mut got) = allocated(5, 2);
        assert_eq!(got, [1, 2]);
        a.free_owned(&got[..1]);
        got.clear();
        a.alloc(1, &mut got).unwrap();
        assert_eq!(got, [1], "the last page freed is the next handed out");
    }

    #[test]
    fn all_or_nothing() {
        let mut a = PageAllocator::new(3, 4, 64).unwrap();
        let mut got = Vec::new();
        assert!(a.alloc(3, &mut got).is_err());
        assert!(a.alloc_held(3, &mut got).is_err());
        assert!(got.is_empty());
        assert_eq!(a.free_pages(), 2);
        assert_eq!(a.held_maps(0), None, "page 0 is never engine-held");
    }

    #[test]
    fn only_engine_held_pages_carry_a_map_count() {
        let (mut a, row) = allocated(6, 2);
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
        let (mut a, mut got) = allocated(6, 4);
        assert_eq!(got, [1, 2, 3, 4]);
        a.free_owned(&got[1..]);
        got.clear();
        a.alloc(2, &mut got).unwrap();
        assert_eq!(got, [4, 3], "LIFO, as one-by-one frees would give");
        assert_eq!(a.free_marks().unwrap().iter().filter(|&&f| f).count(), 2);
    }
}

/// The free stack kept as runs against the one stack it stands for.
#[cfg(test)]
mod runs {
    use proptest::prelude::*;

    use super::*;

    #[derive(Debug, Clone)]
    enum Op {
        /// A new row takes `n` pages into a list from `take_list`.
        Take(usize),
        /// Row `i` takes one more page.
        TakeOne(usize),
        /// Row `i` gives back its last `n` pages (a trim).
        Trim(usize, usize),
        /// Row `i` is released; its first `shared` pages are not its own (they go nowhere).
        Release(usize, usize),
        /// Row `i`'s last `n` pages are put back as the last allocation's (an undo).
        Undo(usize, usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (1..80usize).prop_map(Op::Take),
            (0..8usize).prop_map(Op::TakeOne),
            (0..8usize, 1..6usize).prop_map(|(i, n)| Op::Trim(i, n)),
            (0..8usize, 0..3usize).prop_map(|(i, s)| Op::Release(i, s)),
            (0..8usize, 1..4usize).prop_map(|(i, n)| Op::Undo(i, n)),
        ]
    }

    proptest! {
        /// Every call hands out the pages one plain stack would, in the same order; the runs
        /// below the top stay dense; emptied runs come back as rows' lists.
        #[test]
        fn runs_are_one_stack(ops in proptest::collection::vec(op(), 1..120)) {
            const TOTAL: u32 = 400;
            let mut a = PageAllocator::new(TOTAL, 8, 128).unwrap();
            let mut model: Vec<u32> = (1..TOTAL).rev().collect();
            let mut rows: Vec<Vec<u32>> = Vec::new();
            for op in ops {
                match op {
                    Op::Take(n) if n <= model.len() && rows.len() < 8 => {
                        let mut list = a.take_list();
                        prop_assert!(list.is_empty());
                        a.alloc(n as u32, &mut list).unwrap();
                        let want: Vec<u32> = model.drain(model.len() - n..).rev().collect();
                        prop_assert_eq!(&list, &want);
                        rows.push(list);
                    }
                    Op::TakeOne(i) if i < rows.len() && !model.is_empty() => {
                        a.alloc(1, &mut rows[i]).unwrap();
                        prop_assert_eq!(rows[i].last().copied(), model.pop());
                    }
                    Op::Trim(i, n) if i < rows.len() => {
                        let r = &mut rows[i];
                        let at = r.len().saturating_sub(n);
                        a.free_owned(&r[at..]);
                        model.extend_from_slice(&r[at..]);
                        r.truncate(at);
                    }
                    Op::Release(i, shared) if i < rows.len() => {
                        let list = rows.swap_remove(i);
                        let shared = shared.min(list.len());
                        model.extend_from_slice(&list[shared..]);
                        // The shared pages stay with the engine in the pool; here they leave.
                        a.free_list_of_row(list, shared);
                    }
                    Op::Undo(i, n) if i < rows.len() => {
                        let r = &mut rows[i];
                        let at = r.len().saturating_sub(n);
                        a.unalloc(&r[at..]);
                        model.extend(r[at..].iter().rev());
                        r.truncate(at);
                    }
                    _ => {}
                }
                prop_assert_eq!(a.free_pages() as usize, model.len());
                prop_assert_eq!(a.free_stack().copied().collect::<Vec<_>>(), model.clone());
                let s = &a.free;
                prop_assert!(s.below.iter().all(|run| !run.is_empty() && run.capacity() <= 2 * run.len()));
                prop_assert_eq!(s.below_len, s.below.iter().map(Vec::len).sum::<usize>());
                prop_assert!(s.spares.len() <= 8 && s.spares.iter().all(|l| l.is_empty() && l.capacity() <= 128));
            }
        }
    }

    #[test]
    fn a_released_list_is_moved_and_its_run_comes_back_as_a_spare() {
        let mut a = PageAllocator::new(200, 4, 64).unwrap();
        let mut row = a.take_list();
        a.alloc(MIN_RUN as u32, &mut row).unwrap();
        let at = row.as_ptr();
        a.free_list_of_row(row, 0);
        assert_eq!(a.free.top.as_ptr(), at, "the row's list is the top run: no page was copied");
        assert_eq!(a.free.below.len(), 1, "the run it covers");
        let mut next = Vec::new();
        a.alloc(MIN_RUN as u32 + 1, &mut next).unwrap();
        let spare = a.take_list();
        assert_eq!(spare.as_ptr(), at, "the emptied run is the next row's list");
        // A short list is copied, and kept as a spare.
        let mut short = a.take_list();
        a.alloc(3, &mut short).unwrap();
        let at = short.as_ptr();
        a.free_list_of_row(short, 0);
        assert_ne!(a.free.top.as_ptr(), at);
        let spare = a.take_list();
        assert_eq!(spare.as_ptr(), at);
    }
}
