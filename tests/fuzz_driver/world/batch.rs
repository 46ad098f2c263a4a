//! The batch calls, `skv_alloc_extend_batch` and `skv_commit_batch`: batches of the side's reqs
//! (some mutated, a stale copy, a row named twice, a req holding one recurrent handle twice,
//! huge counts, a short out_cap) checked against what the single calls say of each request,
//! laid out in one buffer: apart, touching, or overlapping and misaligned at random byte
//! offsets, which must be refused with SKV_ERR_INVALID_ARG, nothing changed.

use std::mem::size_of;
use std::ptr::{null_mut, read_unaligned, write_unaligned};

use skv::skv_status::*;
use skv::*;

use super::{show, Expect, World, REQS};

const REQ: usize = size_of::<skv_req>();

/// A request of a batch: the req passed, the req a single call is asked about (the passed one
/// without a handle doubled), and the side's req it stands for (`None`: a stale copy or a
/// second copy of a member).
struct Member {
    r: skv_req,
    asked: skv_req,
    live: Option<usize>,
}

/// How the arrays lie in the buffer.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Lay {
    Apart,
    /// Each array starts where the one before it ends.
    Touching,
    /// reqs misaligned with n = 0: never read, never checked.
    EmptyMisaligned,
    MisalignedReqs,
    MisalignedCounts,
    MisalignedOut,
    OutOverReqs,
    CountsOverReqs,
    OutOverCounts,
}

impl Lay {
    fn refused(self) -> bool {
        !matches!(self, Lay::Apart | Lay::Touching | Lay::EmptyMisaligned)
    }
}

/// Byte offsets of the three arrays from the buffer's 8-aligned start, and its size.
struct Layout {
    lay: Lay,
    reqs: usize,
    counts: usize,
    out: usize,
    size: usize,
}

fn pages_for(len: u64, ps: u32) -> u64 {
    len.div_ceil(ps as u64)
}

impl World {
    pub(super) fn op_batch(&mut self, s: usize) -> skv_status {
        let extend = self.rng.chance(550);
        let members = self.batch_members(s);
        let n = members.len();
        let counts: Vec<u32> = members.iter().map(|m| self.batch_count(s, &m.r, extend)).collect();
        let total: u64 = counts.iter().map(|&k| k as u64).sum();
        let with_out = extend && !self.rng.chance(250);
        // Room for every slot (a huge count's total gets less: the call refuses it), or one short.
        let room = total.min(1 << 16) as usize;
        let cap = match with_out {
            false => 0,
            true if room > 0 && self.rng.chance(40) => room - 1,
            true => room + self.rng.upto(3) as usize,
        };
        let layout = self.batch_layout(n, with_out, cap, extend);
        let mut buf = vec![0u64; layout.size.div_ceil(8) + 1];
        let base = buf.as_mut_ptr() as *mut u8;
        // SAFETY: every array lies inside buf (batch_layout sizes it); writes are unaligned-safe.
        // Written out, n_tokens, reqs: an array overlapping another holds that one's bytes, and
        // the reqs are always intact.
        let (rp, np, op) = unsafe {
            let (rp, np, op) = (base.add(layout.reqs), base.add(layout.counts), base.add(layout.out));
            for k in 0..cap {
                write_unaligned((op as *mut i32).add(k), -7);
            }
            for (k, &v) in counts.iter().enumerate() {
                write_unaligned((np as *mut u32).add(k), v);
            }
            for (k, m) in members.iter().enumerate() {
                write_unaligned((rp as *mut skv_req).add(k), m.r);
            }
            (rp as *mut skv_req, np as *const u32, if with_out { op as *mut i32 } else { null_mut() })
        };
        let null_handle = layout.lay.refused() && self.rng.chance(150);
        let c = if null_handle { null_mut() } else { self.sides[s].c };
        let want = match () {
            _ if layout.lay.refused() => SKV_ERR_INVALID_ARG,
            _ if !self.sides[s].owned => SKV_ERR_UNSUPPORTED,
            _ => self.batch_oracle(s, &members, &counts, extend, with_out.then_some(cap)),
        };
        let before = self.sides[s].snap();
        let rows: Vec<String> = members.iter().map(|m| show(&m.r)).collect();
        let desc = match extend {
            true => format!(
                "skv_alloc_extend_batch({:?} at {}/{}/{}{}, n {n}, n_tokens {counts:?}, out_cap {cap}{}) reqs {}",
                layout.lay,
                layout.reqs,
                layout.counts,
                layout.out,
                if with_out { "" } else { " (out_loc NULL)" },
                if null_handle { ", NULL handle" } else { "" },
                rows.join(" ")
            ),
            false => format!(
                "skv_commit_batch({:?} at {}/{}, n {n}, n_tokens {counts:?}{}) reqs {}",
                layout.lay,
                layout.reqs,
                layout.counts,
                if null_handle { ", NULL handle" } else { "" },
                rows.join(" ")
            ),
        };
        self.watch = vec![(base as *const u8, layout.size)];
        let st = self.call(s, desc, std::ptr::null(), Expect::Is(want), || {
            // SAFETY: c is NULL or the side's live handle; the arrays lie in buf with the
            // lengths passed (or overlap and are misaligned on purpose: the call must refuse
            // them before reading).
            unsafe {
                match extend {
                    true => skv_alloc_extend_batch(c, rp, n, np, op, cap),
                    false => skv_commit_batch(c, rp, n, np),
                }
            }
        });
        if layout.lay.refused() {
            let named = ["overlap", "aligned"].iter().any(|w| self.last_msg.contains(w));
            if !named {
                self.fail(&format!("{:?} refused without naming the overlap or alignment", layout.lay));
            }
            *self.cover.entry("batch aliasing or misaligned buffers refused").or_default() += 1;
        }
        if st == SKV_OK && n > 0 {
            // SAFETY: the reqs lie in buf, n of them at rp.
            let after: Vec<skv_req> = (0..n).map(|k| unsafe { read_unaligned(rp.add(k)) }).collect();
            // SAFETY: cap values at op when with_out.
            let out: Vec<i32> = (0..cap).map(|k| unsafe { read_unaligned(op.add(k)) }).collect();
            self.batch_done(s, &members, &counts, &after, extend.then_some((with_out, &out[..])), before);
        }
        drop(buf);
        st
    }

    /// The requests of a batch: some of the side's reqs in random order, any of them mutated
    /// or with a recurrent handle doubled; then perhaps a stale copy or a second copy of a
    /// member. A request other than the side's own unchanged req that a single call would
    /// take is put back to the side's req (or left out): a batch that succeeds holds only the
    /// side's reqs, which the model then follows.
    fn batch_members(&mut self, s: usize) -> Vec<Member> {
        let mut order: Vec<usize> = (0..REQS).collect();
        for k in (1..REQS).rev() {
            order.swap(k, self.rng.below(k as u64 + 1) as usize);
        }
        let holds: Vec<bool> = (0..REQS).map(|i| self.sides[s].reqs[i].r.req_pool_idx >= 0).collect();
        let mut picked: Vec<usize> = order.into_iter().filter(|&i| holds[i] || self.rng.chance(100)).collect();
        picked.truncate(self.rng.upto(REQS as u32) as usize);
        let mut members = Vec::new();
        for i in picked {
            let own = self.sides[s].reqs[i].r;
            let (mutated, m) = match self.sides[s].owned {
                true => {
                    let (m, mutated) = self.maybe_mutate(s, own);
                    (mutated, m)
                }
                false => (false, own),
            };
            let m = match mutated && self.single_call(s, &m) == SKV_OK {
                true => own,
                false => m,
            };
            let r = if self.rng.chance(30) { self.doubled_handle(s, m) } else { m };
            members.push(Member { r, asked: m, live: (m == own).then_some(i) });
        }
        let extra = match self.rng.below(20) {
            0 if !self.sides[s].stale.is_empty() => {
                let k = self.rng.below(self.sides[s].stale.len() as u64) as usize;
                Some(self.sides[s].stale[k].r)
            }
            1 if !members.is_empty() => Some(members[self.rng.below(members.len() as u64) as usize].asked),
            _ => None,
        };
        if let Some(r) = extra {
            let named = members.iter().any(|m| m.asked.req_pool_idx == r.req_pool_idx);
            if named || self.single_call(s, &r) != SKV_OK {
                members.push(Member { r, asked: r, live: None });
            }
        }
        members
    }

    /// `r` with one of its recurrent handles given twice (the per-step calls do not look at
    /// them: the batch must treat it as the req without).
    pub(super) fn doubled_handle(&mut self, s: usize, mut r: skv_req) -> skv_req {
        let mut hs = [r.aux_state, r.aux_track[0], r.aux_track[1]];
        let (a, b) = match self.rng.below(3) {
            0 => (0, 1),
            1 => (0, 2),
            _ => (1, 2),
        };
        if hs[a] == -1 && hs[b] == -1 {
            hs[a] = self.sides[s].next_aux;
            self.sides[s].next_aux += 1;
        }
        if hs[a] == -1 {
            hs[a] = hs[b];
        } else {
            hs[b] = hs[a];
        }
        (r.aux_state, r.aux_track) = (hs[0], [hs[1], hs[2]]);
        r
    }

    fn batch_count(&mut self, s: usize, r: &skv_req, extend: bool) -> u32 {
        let side = &self.sides[s];
        if self.rng.chance(25) {
            return self.huge_u32(side.max_ctx());
        }
        match extend {
            true => self.rng.upto(2 * side.ps() + 3),
            false => {
                let room = r.kv_allocated_len.saturating_sub(r.kv_committed_len);
                match self.rng.chance(40) {
                    true => room + 1 + self.rng.upto(2),
                    false => self.rng.upto(room),
                }
            }
        }
    }

    /// What `skv_commit(req, 0)` says of a copy of `r`: every check a per-step call makes of a
    /// req but the call's own count (validate, its row, the row's record, an idle slot's row).
    fn single_call(&self, s: usize, r: &skv_req) -> skv_status {
        let mut q = *r;
        // SAFETY: the side's live handle and a local req; a commit of 0 changes nothing.
        unsafe { skv_commit(self.sides[s].c, &mut q, 0) }
    }

    /// What the batch must return, from the single calls' answers for each request in turn
    /// (docs: all or nothing, the first failing request's error): a row named twice; the
    /// call's own count (past max_context_len, past kv_allocated_len); the req's checks; the
    /// pages the batch needs so far (full pool, and the SWA pool beside it).
    fn batch_oracle(
        &self,
        s: usize,
        members: &[Member],
        counts: &[u32],
        extend: bool,
        cap: Option<usize>,
    ) -> skv_status {
        let side = &self.sides[s];
        let total: u64 = counts.iter().map(|&k| k as u64).sum();
        if extend && cap.is_some_and(|c| (c as u64) < total) {
            return SKV_ERR_INVALID_ARG;
        }
        let stats = side.stats();
        let (mut free, mut swa_free) = (stats.free_pages, stats.swa_free_pages);
        let (ps, max, rows) = (side.ps(), side.max_ctx() as u64, side.cfg.num_rows as i32);
        let mut seen = Vec::new();
        for (m, &n) in members.iter().zip(counts) {
            let row = m.asked.req_pool_idx;
            if (0..rows).contains(&row) {
                if seen.contains(&row) {
                    return SKV_ERR_INVALID_ARG;
                }
                seen.push(row);
            }
            let (alloc, committed) = (m.asked.kv_allocated_len as u64, m.asked.kv_committed_len as u64);
            let own = match extend {
                true => alloc + n as u64 <= max,
                false => committed + n as u64 <= alloc,
            };
            if !own {
                return SKV_ERR_INVALID_ARG;
            }
            let single = self.single_call(s, &m.asked);
            if single != SKV_OK {
                return single;
            }
            if extend {
                let need = pages_for(alloc + n as u64, ps) - pages_for(alloc, ps);
                if need > free || (side.swa() && need > swa_free) {
                    return SKV_ERR_OUT_OF_MEMORY;
                }
                free -= need;
                swa_free = swa_free.saturating_sub(need);
            }
        }
        SKV_OK
    }

    /// A batch that succeeded: each req moved by its count and nothing else, out_loc holds the
    /// rows' new slots (nothing past them written), the rows grew by exactly the pages
    /// counted and no other row changed; the model follows. `extend`: whether out_loc was
    /// passed, and what it holds.
    fn batch_done(
        &mut self,
        s: usize,
        members: &[Member],
        counts: &[u32],
        after: &[skv_req],
        extend: Option<(bool, &[i32])>,
        before: super::Snap,
    ) {
        let side = &self.sides[s];
        let (c, ps) = (side.c, side.ps());
        let now = side.snap();
        let mut at = 0usize;
        let mut need = 0u64;
        for ((m, &n), a) in members.iter().zip(counts).zip(after) {
            let mut want = m.r;
            match extend {
                Some(_) => want.kv_allocated_len += n,
                None => want.kv_committed_len += n,
            }
            if *a != want {
                self.fail(&format!("batch: req {} came back as {}, not {}", show(&m.r), show(a), show(&want)));
            }
            let Some((with_out, out)) = extend else { continue };
            let (row, old, new) = (m.r.req_pool_idx, m.r.kv_allocated_len, want.kv_allocated_len);
            if with_out {
                let mut slots = vec![0i32; n as usize];
                // SAFETY: the side's live handle; slots holds new - old values.
                let st = unsafe { skv_row_indices(c, row, old, new, slots.as_mut_ptr()) };
                if st != SKV_OK || out[at..at + n as usize] != slots[..] {
                    self.fail(&format!(
                        "batch: out_loc[{at}..] = {:?}, row {row}'s new slots {old}..{new} are {slots:?} ({st:?})",
                        &out[at..at + n as usize]
                    ));
                }
                at += n as usize;
            }
            need += pages_for(new as u64, ps) - pages_for(old as u64, ps);
            let (b, a) = (&before.rows[row as usize], &now.rows[row as usize]);
            let grew = match (b, a) {
                (Some((bp, _)), Some((ap, _))) => ap.len() as u64 == pages_for(new as u64, ps) && ap.starts_with(bp),
                _ => false,
            };
            if !grew {
                self.fail(&format!("batch: row {row} went from {b:?} to {a:?} ({old} -> {new} tokens)"));
            }
        }
        if let Some((_, out)) = extend {
            if out[at..].iter().any(|&v| v != -7) {
                self.fail(&format!("batch: out_loc written past the {at} slots assigned: {:?}", &out[at..]));
            }
            let rows: Vec<i32> = members.iter().map(|m| m.r.req_pool_idx).collect();
            let untouched = (0..before.rows.len()).all(|r| rows.contains(&(r as i32)) || before.rows[r] == now.rows[r]);
            let (b, a) = (before.stats.unwrap(), now.stats.unwrap());
            let swa_need = if side.swa() { need } else { 0 };
            if !untouched || b.free_pages - a.free_pages != need || b.swa_free_pages - a.swa_free_pages != swa_need {
                self.fail(&format!("batch: {need} pages taken, but the state went\n  from {before:?}\n  to   {now:?}"));
            }
        } else if before != now {
            self.fail(&format!("skv_commit_batch changed the cache:\n  from {before:?}\n  to   {now:?}"));
        }
        *self
            .cover
            .entry(if extend.is_some() { "extend batch checked" } else { "commit batch checked" })
            .or_default() += 1;
        let side = &mut self.sides[s];
        let mut rows = Vec::new();
        for (m, a) in members.iter().zip(after) {
            let Some(i) = m.live else { continue };
            let mut r = *a;
            (r.aux_state, r.aux_track) = (m.asked.aux_state, m.asked.aux_track);
            side.reqs[i].r = r;
            rows.push((i, r.req_pool_idx));
        }
        // Another req on a row the batch moved is no longer the request's own.
        for j in 0..REQS {
            let row = side.reqs[j].r.req_pool_idx;
            if row >= 0 && rows.iter().any(|&(i, r)| i != j && r == row) {
                side.reqs[j].matched = None;
            }
        }
    }

    /// Where the arrays go: apart or touching, or (often) one of the faults the call must
    /// refuse, each with a non-empty array (reqs n, n_tokens n, out_loc cap values).
    fn batch_layout(&mut self, n: usize, with_out: bool, cap: usize, extend: bool) -> Layout {
        let (r, k, o) = (n * REQ, n * 4, if with_out { cap * 4 } else { 0 });
        let mut lays = vec![Lay::Apart, Lay::Touching];
        if n == 0 {
            lays.push(Lay::EmptyMisaligned);
        } else {
            lays.extend([Lay::MisalignedReqs, Lay::MisalignedCounts, Lay::CountsOverReqs]);
        }
        if o > 0 {
            lays.push(Lay::MisalignedOut);
            if n > 0 {
                lays.extend([Lay::OutOverReqs, Lay::OutOverCounts]);
            }
        }
        if !self.probes.aliased_buffers {
            lays.retain(|l| !l.refused());
        }
        let lay = match self.rng.chance(550) {
            true => Lay::Apart,
            false => self.rng.pick(&lays),
        };
        // Room before the reqs for an array that starts before them and runs into them.
        let b = (k.max(o) + 8).div_ceil(8) * 8;
        let apart = |at: usize| (at + 8).div_ceil(8) * 8;
        let (mut reqs, mut counts) = (b, apart(b + r));
        let mut out = apart(counts + k);
        let odd = |w: &mut World, align: usize| 1 + w.rng.below(align as u64 - 1) as usize;
        match lay {
            Lay::Apart => {}
            Lay::Touching if self.rng.chance(500) => {
                // The other order: n_tokens, out_loc, reqs (at the next 8-byte boundary).
                (counts, out) = (8, 8 + k);
                reqs = (8 + k + o).div_ceil(8) * 8;
            }
            Lay::Touching => (counts, out) = (b + r, b + r + k),
            Lay::EmptyMisaligned | Lay::MisalignedReqs => reqs += odd(self, 8),
            Lay::MisalignedCounts => counts += odd(self, 4),
            Lay::MisalignedOut => out += odd(self, 4),
            Lay::OutOverReqs => out = self.overlapping(reqs, r, o, 4),
            Lay::CountsOverReqs => {
                counts = match self.rng.below(3) {
                    // &reqs[j].kv_allocated_len or kv_committed_len: legal C for a const array.
                    0 => reqs + REQ * self.rng.below(n as u64) as usize + if extend { 12 } else { 8 },
                    _ => self.overlapping(reqs, r, k, 4),
                }
            }
            Lay::OutOverCounts => out = self.overlapping(counts, k, o, 4),
        }
        let size = [reqs + r, counts + k, out + o].into_iter().max().unwrap() + 8;
        Layout { lay, reqs, counts, out, size }
    }

    /// A start for an array of `len` bytes aligned to `align` that overlaps `[at, at + span)`
    /// (both non-empty, `at >= len`): at any byte offset, most often an aligned one (an overlap,
    /// not a misalignment).
    pub(super) fn overlapping(&mut self, at: usize, span: usize, len: usize, align: usize) -> usize {
        // Starts from at - len + 1 to at + span - 1 overlap.
        let lo = at + 1 - len;
        let start = lo + self.rng.below((at + span - lo) as u64) as usize;
        let down = start - start % align;
        match self.rng.chance(700) && down >= lo {
            true => down,
            false => start,
        }
    }
}
