//! `skv_cache_check`: proves the owned pool's invariants, linear in pages plus the rows'
//! page entries.

use std::ffi::c_char;

use super::alloc::PageAllocator;
use super::cache::Cache;
use super::error::{try_vec, Result};
use super::owned::{OwnedPool, SwaSide};
use super::page::pages_for;
use super::records::Report;
use super::req::swa_dead;
use super::slots::Place;

impl Report {
    /// Counts a violation; the first one's text goes into `first_violation`, cut to 255 bytes
    /// and NUL-terminated (the rest of the array stays 0).
    pub(crate) fn violation(&mut self, what: impl FnOnce() -> String) {
        if self.violations == 0 {
            let text = what();
            for (t, b) in self.first_violation.iter_mut().zip(text.bytes().take(255)) {
                *t = b as c_char;
            }
        }
        self.violations += 1;
    }

    /// `first_violation` as text, up to its NUL ("" when there is none).
    pub fn first_violation_text(&self) -> String {
        let bytes: Vec<u8> = self.first_violation.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

impl Cache {
    pub fn check(&self) -> Result<Report> {
        let pool = self.owned_pool()?;
        let mut rep = Report::default();
        let (maps, owners) = count_row_maps(pool, self.cfg.page_size, &mut rep)?;
        let on_list = check_free_list(pool, &mut rep)?;
        check_page_states(pool.allocator(), &maps, &owners, &on_list, &mut rep);
        self.check_slots(pool, &mut rep);
        self.check_tier(&mut rep)?;
        self.check_slot_handles(&mut rep);
        if let Some(s) = pool.swa.as_ref() {
            check_swa(pool, s, &mut rep)?;
            self.check_slot_windows(pool, s, &mut rep);
        }
        Ok(rep)
    }

    /// An idle slot's row has no SWA page where its window passed (`swa_dead`) and one at
    /// every other position past its protected prefix.
    fn check_slot_windows(&self, pool: &OwnedPool, s: &SwaSide, rep: &mut Report) {
        let ps = self.cfg.page_size;
        for (row, slot) in self.slots.iter().filter(|(_, s)| !s.in_flight && s.place != Place::Parked) {
            let Some(r) = pool.in_use(row) else { continue };
            let (lo, hi) = swa_dead(slot.protected, slot.swa_floor, slot.swa, ps);
            let ids = &s.rows[row as usize].ids;
            let shared = (r.protected / ps) as usize;
            for (i, &id) in ids.iter().enumerate().take(r.pages.len()).skip(shared) {
                let first = i as u32 * ps;
                let passed = first >= lo && first < hi;
                if passed != (id == 0) {
                    rep.violation(|| {
                        format!(
                            "row {row} page {i} (positions from {first}) {} an SWA page, but session {} branch {} \
                             has the window past [{lo}, {hi})",
                            if passed { "still has" } else { "lacks" },
                            slot.session,
                            slot.branch
                        )
                    });
                }
            }
        }
    }

    /// No recurrent-state handle is kept twice, by two slots or one: each release would free
    /// it. A finish does not look at other slots (that would cost a lookup per handle on
    /// every finish and release), so only the audit sees two slots sharing one.
    fn check_slot_handles(&self, rep: &mut Report) {
        let mut holders: foldhash::HashMap<i64, (u64, u64)> = Default::default();
        for (_, s) in self.slots.iter() {
            for h in [s.aux, s.track[0], s.track[1]].into_iter().filter(|&h| h != -1) {
                if let Some(&(session, branch)) = holders.get(&h) {
                    rep.violation(|| {
                        format!(
                            "recurrent-state handle {h} is kept by session {session} branch {branch} and again by \
                             session {} branch {}",
                            s.session, s.branch
                        )
                    });
                }
                holders.insert(h, (s.session, s.branch));
            }
        }
    }

    /// Every slot's row is in use, an idle slot's record matches its row, and the slot holds
    /// the row's current generation; each row's idle flag says whether an idle slot holds it.
    fn check_slots(&self, pool: &OwnedPool, rep: &mut Report) {
        for (row, m) in pool.rows.iter().map(|r| &r.meta).enumerate() {
            let idle = self.slots.of_row(row as u32).is_some_and(|s| !s.in_flight);
            if m.idle_slot != idle {
                rep.violation(|| {
                    format!("row {row} is flagged idle_slot {} but an idle slot holding it is {idle}", m.idle_slot)
                });
            }
        }
        for (row, s) in self.slots.iter() {
            match pool.in_use(row) {
                None => rep.violation(|| format!("session {} branch {} holds unused row {row}", s.session, s.branch)),
                // A parked slot's row maps its protected prefix only (its KV is in the host tier).
                Some(r) if s.place == Place::Parked && (r.len != s.protected || r.protected != s.protected) => rep
                    .violation(|| {
                        format!(
                            "parked slot of session {} records a {}-token prefix, row {row} maps {}/{}",
                            s.session, s.protected, r.len, r.protected
                        )
                    }),
                Some(r)
                    if !s.in_flight
                        && s.place != Place::Parked
                        && (r.len != s.allocated || r.protected != s.protected) =>
                {
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
        let Some(r) = &r.in_use else { continue };
        if r.pages.len() != pages_for(r.len, ps) as usize {
            rep.violation(|| format!("row {row} maps {} tokens in {} pages", r.len, r.pages.len()));
        }
        let (kept, last) = (r.pages.last_page(), r.pages.last().copied().unwrap_or(0));
        if kept != last {
            rep.violation(|| format!("row {row} keeps {kept} as its last page, its list ends with {last}"));
        }
        if r.protected % ps != 0 || r.protected > r.len {
            rep.violation(|| format!("row {row} protected {} of {} tokens", r.protected, r.len));
        }
        let shared = (r.protected / ps) as usize;
        for (i, &p) in r.pages.iter().enumerate() {
            if p >= alloc.total_pages() {
                rep.violation(|| format!("row {row} maps page {p} outside the pool"));
                continue;
            }
            maps[p as usize] += 1;
            match (i < shared, alloc.held_maps(p)) {
                (true, Some(_)) => {}
                (false, None) => owners[p as usize] += 1,
                (true, None) => {
                    rep.violation(|| format!("row {row} prefix page {p} (position page {i}) is not engine-held"))
                }
                (false, Some(_)) => {
                    rep.violation(|| format!("row {row} position page {i} maps engine-held page {p} past its prefix"))
                }
            }
        }
    }
    Ok((maps, owners))
}

/// Each page is exactly one of free (on the list), one row's own, or engine-held with as many
/// maps as rows map it; page 0 none of them.
fn check_page_states(alloc: &PageAllocator, maps: &[u32], owners: &[u32], on_list: &[bool], rep: &mut Report) {
    if maps[0] != 0 || alloc.held_maps(0).is_some() {
        rep.violation(|| "page 0 (padding) is mapped or engine-held".into());
    }
    for p in 1..alloc.total_pages() {
        let i = p as usize;
        match alloc.held_maps(p) {
            Some(m) => {
                rep.pages_engine_held += 1;
                if m != maps[i] {
                    rep.violation(|| format!("engine-held page {p} counts {m} maps, rows map it {} times", maps[i]));
                }
            }
            None if on_list[i] => {
                rep.pages_free += 1;
                if maps[i] != 0 {
                    rep.violation(|| format!("free page {p} is mapped by {} rows", maps[i]));
                }
            }
            None => match owners[i] {
                1 => rep.pages_in_rows += 1,
                0 => rep.violation(|| format!("page {p} is not free, not a row's, not engine-held (leaked)")),
                n => {
                    rep.pages_in_rows += 1;
                    rep.violation(|| format!("page {p} is owned by {n} rows"))
                }
            },
        }
    }
    let total = alloc.total_pages() as u64;
    let (free, owned, held) = (rep.pages_free, rep.pages_in_rows, rep.pages_engine_held);
    if free + owned + held != total - 1 {
        rep.violation(|| format!("free {free} + row-owned {owned} + engine-held {held} != {total} pages - 1"));
    }
}

/// Every SWA page is on the free list or named by one row-owned or engine-held page, once;
/// a row names the SWA pages of its pages, its protected prefix those the engine's pages hold.
fn check_swa(pool: &OwnedPool, s: &SwaSide, rep: &mut Report) -> Result<()> {
    let total = s.alloc.total_pages();
    let mut seen = try_vec(total as usize, "the audit's SWA-page marks", |_| false)?;
    let mut mark = |id: u32, what: &dyn Fn() -> String, rep: &mut Report| {
        if id == 0 {
            return;
        }
        match seen.get_mut(id as usize).map(|m| std::mem::replace(m, true)) {
            None => rep.violation(|| format!("{} names SWA page {id}, outside the SWA pool", what())),
            Some(true) => rep.violation(|| format!("SWA page {id} is named twice (again by {})", what())),
            Some(false) => {}
        }
    };
    let drained: Vec<u32> = pool.pins.drained_pages().flat_map(|d| d.swa.iter().copied()).collect();
    for &id in s.alloc.free_stack().chain(&drained) {
        mark(id, &|| "the SWA free list or a drain".into(), rep);
    }
    rep.swa_pages_free = s.alloc.free_pages() as u64 + drained.len() as u64;
    let mut in_use = 0u64;
    for (p, &id) in s.held.iter().enumerate() {
        if pool.allocator().held_maps(p as u32).is_some() {
            mark(id, &|| format!("engine-held page {p}"), rep);
            in_use += (id != 0) as u64;
        } else if id != 0 {
            rep.violation(|| format!("page {p}, not engine-held, keeps an engine-held SWA page {id}"));
        }
    }
    for (row, r) in pool.rows.iter().enumerate() {
        let sr = &s.rows[row];
        let ids = &sr.ids;
        let (lo, hi) = (sr.passed.0 as usize, sr.passed.1 as usize);
        if lo < hi && ids.get(lo..hi).is_none_or(|run| run.iter().any(|&id| id != 0)) {
            rep.violation(|| format!("row {row}'s SWA entries [{lo}, {hi}), which frees skip, are not all empty"));
        }
        let Some(r) = &r.in_use else {
            if !ids.is_empty() {
                rep.violation(|| format!("unused row {row} names {} SWA pages", ids.len()));
            }
            continue;
        };
        if ids.len() != r.pages.len() {
            rep.violation(|| format!("row {row} maps {} pages but names {} SWA pages", r.pages.len(), ids.len()));
        }
        let shared = (r.protected / pool.ps) as usize;
        for (i, (&p, &id)) in r.pages.iter().zip(ids).enumerate() {
            if i < shared {
                if s.held.get(p as usize) != Some(&id) {
                    rep.violation(|| format!("row {row} prefix page {p} names SWA page {id}, not its engine-held one"));
                }
            } else {
                mark(id, &|| format!("row {row} page {p}"), rep);
                in_use += (id != 0) as u64;
            }
        }
    }
    rep.swa_pages_in_use = in_use;
    let free = rep.swa_pages_free;
    if free + in_use != total as u64 - 1 {
        rep.violation(|| format!("SWA free {free} + in use {in_use} != {total} SWA pages - 1 (a page leaked)"));
    }
    Ok(())
}

/// The free list holds each page at most once, and only pages in the pool past page 0 that
/// are not engine-held; returns, per page, whether the list holds it.
fn check_free_list(pool: &OwnedPool, rep: &mut Report) -> Result<Vec<bool>> {
    let alloc = pool.allocator();
    let mut on_list = try_vec(alloc.total_pages() as usize, "the audit's free-list marks", |_| false)?;
    // A draining page is free once its ticket completes: it counts with the free pages.
    let drained = pool.pins.drained_pages().flat_map(|d| d.full.iter());
    for &p in alloc.free_stack().chain(drained) {
        let ok = p != 0 && alloc.held_maps(p).is_none();
        match on_list.get_mut(p as usize) {
            Some(m) if ok && !*m => *m = true,
            _ => rep.violation(|| format!("free list holds page {p} twice, outside the pool, or engine-held")),
        }
    }
    Ok(on_list)
}

#[cfg(test)]
mod tests {
    use super::Report;

    /// The C record's text: the first violation only, cut to 255 bytes, NUL-terminated.
    #[test]
    fn the_first_violation_fills_the_c_text_cut_to_255_bytes() {
        let mut rep = Report::default();
        assert_eq!(rep.first_violation_text(), "");
        rep.violation(|| "x".repeat(300));
        rep.violation(|| "a later violation".into());
        assert_eq!(rep.violations, 2);
        assert_eq!(rep.first_violation_text(), "x".repeat(255));
        assert_eq!(rep.first_violation[254], b'x' as std::ffi::c_char);
        assert_eq!(rep.first_violation[255], 0, "the last byte stays the NUL");
    }
}
