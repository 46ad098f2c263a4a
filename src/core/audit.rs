//! `skv_cache_check`: proves the owned pool's invariants, linear in pages plus the rows'
//! page entries.

use super::alloc::{PageAllocator, PageState};
use super::cache::Cache;
use super::error::{try_vec, Result};
use super::owned::OwnedPool;
use super::page::pages_for;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    pub pages_free: u64,
    pub pages_in_rows: u64,
    pub pages_engine_held: u64,
    pub violations: u64,
    pub first_violation: String,
}

impl Report {
    fn violation(&mut self, what: impl FnOnce() -> String) {
        if self.violations == 0 {
            self.first_violation = what();
        }
        self.violations += 1;
    }
}

impl Cache {
    pub fn check(&self) -> Result<Report> {
        let pool = self.owned_pool()?;
        let mut rep = Report::default();
        let (maps, owners) = count_row_maps(pool, self.cfg.page_size, &mut rep)?;
        check_page_states(pool.allocator(), &maps, &owners, &mut rep);
        check_free_list(pool.allocator(), &mut rep)?;
        self.check_slots(pool, &mut rep);
        Ok(rep)
    }

    /// Every slot's row is in use, an idle slot's record matches its row, and the slot holds
    /// the row's current generation; each row's idle flag says whether an idle slot holds it.
    fn check_slots(&self, pool: &OwnedPool, rep: &mut Report) {
        for (row, m) in self.row_meta.iter().enumerate() {
            let idle = self.slots.of_row(row as u32).is_some_and(|s| !s.in_flight);
            if m.idle_slot != idle {
                rep.violation(|| {
                    format!("row {row} is flagged idle_slot {} but an idle slot holding it is {idle}", m.idle_slot)
                });
            }
        }
        for (row, s) in self.slots.iter() {
            match pool.rows.get(row as usize).and_then(|r| r.as_ref()) {
                None => rep.violation(|| format!("session {} branch {} holds unused row {row}", s.session, s.branch)),
                Some(r) if !s.in_flight && (r.len != s.allocated || r.protected != s.protected) => {
                    rep.violation(|| {
                        format!(
                            "idle slot of session {} records {}/{} tokens, row {row} maps {}/{}",
                            s.session, s.allocated, s.protected, r.len, r.protected
                        )
                    })
                }
                Some(_) if s.generation != self.generation(row) => rep.violation(|| {
                    format!(
                        "slot of session {} branch {} records generation {} of row {row}, which is at {}",
                        s.session,
                        s.branch,
                        s.generation,
                        self.generation(row)
                    )
                }),
                Some(_) => {}
            }
        }
    }
}

/// How many rows map each page, and how many of those map it as their own; checks each row's
/// shape on the way.
fn count_row_maps(pool: &OwnedPool, ps: u32, rep: &mut Report) -> Result<(Vec<u32>, Vec<u32>)> {
    let alloc = pool.allocator();
    let n_pages = alloc.total_pages() as usize;
    let mut maps = try_vec(n_pages, "the audit's map counts", |_| 0u32)?;
    let mut owners = try_vec(n_pages, "the audit's owner counts", |_| 0u32)?;
    for (row, r) in pool.rows.iter().enumerate() {
        let Some(r) = r else { continue };
        if r.pages.len() != pages_for(r.len, ps) as usize {
            rep.violation(|| format!("row {row} maps {} tokens in {} pages", r.len, r.pages.len()));
        }
        if r.protected % ps != 0 || r.protected > r.len {
            rep.violation(|| format!("row {row} protected {} of {} tokens", r.protected, r.len));
        }
        let shared = (r.protected / ps) as usize;
        for (i, &p) in r.pages.iter().enumerate() {
            let Some(state) = alloc.get(p) else {
                rep.violation(|| format!("row {row} maps page {p} outside the pool"));
                continue;
            };
            maps[p as usize] += 1;
            match (i < shared, state) {
                (true, PageState::Held { .. }) => {}
                (false, PageState::Owned) => owners[p as usize] += 1,
                (_, s) => rep.violation(|| format!("row {row} position page {i} maps page {p} in state {s:?}")),
            }
        }
    }
    Ok((maps, owners))
}

/// Each page's state agrees with how the rows map it, and the states add up to the pool.
fn check_page_states(alloc: &PageAllocator, maps: &[u32], owners: &[u32], rep: &mut Report) {
    for (p, s) in alloc.states().enumerate() {
        match s {
            PageState::Padding if p != 0 => rep.violation(|| format!("page {p} marked padding")),
            PageState::Padding if maps[p] != 0 => rep.violation(|| "page 0 (padding) is mapped".into()),
            PageState::Padding => {}
            PageState::Free => {
                rep.pages_free += 1;
                if maps[p] != 0 {
                    rep.violation(|| format!("free page {p} is mapped by {} rows", maps[p]));
                }
            }
            PageState::Owned => {
                rep.pages_in_rows += 1;
                if owners[p] != 1 {
                    rep.violation(|| format!("page {p} is owned by {} rows", owners[p]));
                }
            }
            PageState::Held { maps: m } => {
                rep.pages_engine_held += 1;
                if m != maps[p] {
                    rep.violation(|| format!("engine-held page {p} counts {m} maps, rows map it {} times", maps[p]));
                }
            }
        }
    }
    if alloc.get(0) != Some(PageState::Padding) {
        rep.violation(|| "page 0 is not the padding page".into());
    }
    let total = alloc.total_pages() as u64;
    let (free, owned, held) = (rep.pages_free, rep.pages_in_rows, rep.pages_engine_held);
    if free + owned + held != total - 1 {
        rep.violation(|| format!("free {free} + row-owned {owned} + engine-held {held} != {total} pages - 1"));
    }
}

/// The free list holds each free page once and nothing else.
fn check_free_list(alloc: &PageAllocator, rep: &mut Report) -> Result<()> {
    let mut on_list = try_vec(alloc.total_pages() as usize, "the audit's free-list marks", |_| false)?;
    for &p in alloc.free_list() {
        if alloc.get(p) != Some(PageState::Free) || std::mem::replace(&mut on_list[p as usize], true) {
            rep.violation(|| format!("free list holds page {p} twice or in another state"));
        }
    }
    let (listed, free) = (alloc.free_list().len(), rep.pages_free);
    if listed as u64 != free {
        rep.violation(|| format!("free list of {listed} pages, {free} pages free"));
    }
    Ok(())
}
