//! The audit's part for the host tier and the tickets: each host page is free, in one slot's
//! host copy, or draining, exactly once; host copies belong to live slots; a parked slot has
//! one; every pin and open ticket names what it copies.

use super::cache::Cache;
use super::error::{try_vec, Result};
use super::records::Report;
use super::slots::Place;
use super::tier::HostPool;

impl Cache {
    pub(crate) fn check_tier(&self, rep: &mut Report) -> Result<()> {
        for (row, s) in self.slots.iter() {
            let t = self.ticket_of(row);
            if t != 0 && self.tickets.get(t).is_none_or(|p| !p.rows.contains(&row)) {
                rep.violation(|| {
                    format!("session {} branch {} is pinned by ticket {t}, which does not copy it", s.session, s.branch)
                });
            }
        }
        let Some(tier) = self.tier.as_deref() else { return Ok(()) };
        let mut holds = [
            try_vec(tier.full.total_pages() as usize, "the audit's host-page marks", |_| false)?,
            try_vec(tier.swa.as_ref().map_or(0, |s| s.total_pages()) as usize, "the audit's host SWA marks", |_| {
                false
            })?,
        ];
        let mut mark = |pool: usize, p: u32, what: &dyn Fn() -> String, rep: &mut Report| {
            if p == 0 && pool == 1 {
                return;
            }
            match holds[pool].get_mut(p as usize).map(|m| std::mem::replace(m, true)) {
                Some(false) if p != 0 => {}
                _ => rep.violation(|| {
                    format!("host page {p} (pool {pool}) is named twice, is 0 or is out of the pool ({})", what())
                }),
            }
        };
        let pools: [Option<&HostPool>; 2] = [Some(&tier.full), tier.swa.as_ref()];
        for (i, hp) in pools.iter().enumerate() {
            for &p in hp.iter().flat_map(|h| h.free_stack()) {
                mark(i, p, &|| "the free host stack".into(), rep);
            }
        }
        for (t, (full, swa)) in &tier.drains {
            full.iter().for_each(|&p| mark(0, p, &|| format!("ticket {t}'s drain"), rep));
            swa.iter().for_each(|&p| mark(1, p, &|| format!("ticket {t}'s drain"), rep));
        }
        for (row, c) in tier.copies.iter().enumerate() {
            if !c.exists() {
                continue;
            }
            let slot = self.slots.of_row(row as u32);
            if slot.is_none() {
                rep.violation(|| format!("row {row} keeps a host copy but no slot holds it"));
            }
            c.full.iter().for_each(|&p| mark(0, p, &|| format!("row {row}'s host copy"), rep));
            c.swa.iter().for_each(|&p| mark(1, p, &|| format!("row {row}'s host copy"), rep));
        }
        for (row, s) in self.slots.iter() {
            let c = &tier.copies[row as usize];
            if s.place == Place::Parked && s.allocated > s.protected && !(c.exists() && c.clean) {
                rep.violation(|| format!("parked session {} branch {} has no clean host copy", s.session, s.branch));
            }
        }
        for (i, hp) in pools.iter().enumerate() {
            let Some(hp) = hp else { continue };
            let named = holds[i].iter().filter(|&&m| m).count() as u64;
            if named != hp.total_pages() as u64 - 1 {
                rep.violation(|| {
                    format!("host pool {i}: {named} pages accounted for of {} - 1 (a page leaked)", hp.total_pages())
                });
            }
        }
        Ok(())
    }
}
