//! The single calls' caller buffers: one misaligned for its type, or (where a call reads
//! caller memory while it writes caller memory) two overlapping at a random byte offset. Each
//! is SKV_ERR_INVALID_ARG before the handle is looked at (a NULL handle, an owned-only call on
//! an external handle included), nothing changed; an empty array is never checked.

use std::mem::{align_of, size_of};
use std::ptr::{null_mut, write_unaligned};

use skv::skv_status::*;
use skv::*;

use super::{Expect, World};

/// One caller array of a call: its name in the call's signature, element size and alignment,
/// and length in elements.
#[derive(Clone, Copy)]
struct Buf {
    name: &'static str,
    size: usize,
    align: usize,
    count: usize,
}

fn buf<T>(name: &'static str, count: usize) -> Buf {
    Buf { name, size: size_of::<T>(), align: align_of::<T>(), count }
}

/// The fault placed: a buffer misaligned, or the second of two buffers overlapping the first.
#[derive(Debug)]
enum Fault {
    Misaligned(&'static str),
    Overlap(&'static str, &'static str),
    /// An empty array at an odd address: never read, never checked.
    EmptyMisaligned(&'static str),
}

/// One probe's call (`which`) and the values it passes besides its arrays.
struct Args {
    which: usize,
    /// The length of its arrays of `n` values (`cap` for kv_indices, `end` for a row's indices).
    n: usize,
    cap: usize,
    end: u32,
    ps: u32,
    row: i32,
    sid: u64,
    b: u64,
    req: skv_req,
}

impl Args {
    /// The call's name and its caller arrays, in its signature's order.
    fn buffers(&self) -> (&'static str, Vec<Buf>) {
        let (n, req) = (self.n, buf::<skv_req>("req", 1));
        match self.which {
            0 => ("skv_alloc_extend", vec![req, buf::<i32>("out_loc", n)]),
            1 => ("skv_match_prefix", vec![req, buf::<skv_match>("out", 1)]),
            2 => ("skv_checkpoint", vec![req, buf::<u32>("handled", 1)]),
            3 => ("skv_swa_evict", vec![req, buf::<u32>("freed", 1)]),
            4 => ("skv_map_prefix", vec![req, buf::<i32>("indices", n)]),
            5 => ("skv_page_refs", vec![buf::<i32>("indices", n), buf::<u32>("out_counts", n)]),
            6 => ("skv_session_held", vec![buf::<i32>("active_rows", n), buf::<skv_held>("out", 1)]),
            7 | 8 => (
                if self.which == 8 { "skv_build_flashinfer_swa" } else { "skv_build_flashinfer" },
                vec![
                    buf::<i32>("rows", n),
                    buf::<i32>("kv_indptr", n + 1),
                    buf::<i32>("kv_indices", self.cap),
                    buf::<i32>("kv_last_page_len", n),
                    buf::<usize>("needed", 1),
                ],
            ),
            9 => ("skv_pool_alloc", vec![buf::<i32>("out_indices", self.ps as usize)]),
            10 => ("skv_row_indices", vec![buf::<i32>("out", self.end as usize)]),
            11 => ("skv_row_swa_indices", vec![buf::<i32>("out", self.end as usize)]),
            12 => ("skv_cache_stats", vec![buf::<skv_stats>("out", 1)]),
            13 => ("skv_cache_check", vec![buf::<skv_check_report>("out", 1)]),
            14 => ("skv_pool_free", vec![buf::<i32>("indices", n)]),
            15 => ("skv_cache_finished_req", vec![req]),
            16 => ("skv_hand_back", vec![req]),
            17 => ("skv_trim_overshoot", vec![req]),
            18 => ("skv_free_tail", vec![req]),
            19 => ("skv_free_req", vec![req]),
            20 => ("skv_alloc_row", vec![req]),
            21 => ("skv_commit", vec![req]),
            22 => ("skv_publish_prefix", vec![req]),
            23 => ("skv_req_init", vec![req]),
            24 => ("skv_session_usage", vec![buf::<skv_usage>("out", 1)]),
            25 => ("skv_branch_usage", vec![buf::<skv_usage>("out", 1)]),
            26 => (
                "skv_idle_sessions",
                vec![buf::<u64>("session_ids", n), buf::<u64>("branch_ids", n), buf::<usize>("count", 1)],
            ),
            27 => ("skv_admission_pages", vec![buf::<skv_admission>("out", 1)]),
            28 => ("skv_device_sync", vec![buf::<u64>("out_device_ptr", 1), buf::<u64>("out_row_stride", 1)]),
            _ => ("skv_commit_batch", vec![buf::<skv_req>("reqs", 1), buf::<u32>("n_tokens", 1)]),
        }
    }

    /// Makes the call on handle `c`, its arrays at `p` (in `buffers`' order).
    fn call(&self, c: *mut skv_cache, p: &[*mut u8]) -> skv_status {
        let (n, sid, b, r) = (self.n, self.sid, self.b, self.req);
        // SAFETY: c is NULL or the side's live handle; each pointer lies in the probe's buffer
        // with room for its array's length (or is misaligned, or overlaps another, on purpose:
        // the call must refuse it before reading or writing through it).
        unsafe {
            match self.which {
                0 => skv_alloc_extend(c, p[0].cast(), n as u32, p[1].cast()),
                1 => skv_match_prefix(c, sid, b, p[0].cast(), 0, 0, p[1].cast()),
                2 => skv_checkpoint(c, sid, b, p[0].cast(), p[1].cast()),
                3 => skv_swa_evict(c, p[0].cast(), r.kv_allocated_len, 1, 0, -1, 0, p[1].cast()),
                4 => skv_map_prefix(c, p[0].cast(), p[1].cast(), n as u32),
                5 => skv_page_refs(c, p[0].cast(), n, p[1].cast()),
                6 => skv_session_held(c, p[0].cast(), n, p[1].cast()),
                7 | 8 => {
                    let f = if self.which == 8 { skv_build_flashinfer_swa } else { skv_build_flashinfer };
                    f(c, p[0].cast(), n, p[1].cast(), p[2].cast(), p[3].cast(), self.cap, p[4].cast())
                }
                9 => skv_pool_alloc(c, self.ps, p[0].cast()),
                10 => skv_row_indices(c, self.row, 0, self.end, p[0].cast()),
                11 => skv_row_swa_indices(c, self.row, 0, self.end, p[0].cast()),
                12 => skv_cache_stats(c, p[0].cast()),
                13 => skv_cache_check(c, p[0].cast()),
                14 => skv_pool_free(c, p[0].cast(), n),
                15 => skv_cache_finished_req(c, sid, b, p[0].cast(), (sid % 2) as u32),
                16 => skv_hand_back(c, sid, b, p[0].cast()),
                17 => skv_trim_overshoot(c, p[0].cast(), 0),
                18 => skv_free_tail(c, p[0].cast(), r.kv_allocated_len),
                19 => skv_free_req(c, p[0].cast()),
                20 => skv_alloc_row(c, p[0].cast()),
                21 => skv_commit(c, p[0].cast(), 0),
                22 => skv_publish_prefix(c, p[0].cast(), r.cache_protected_len),
                23 => skv_req_init(p[0].cast()),
                24 => skv_session_usage(c, sid, p[0].cast()),
                25 => skv_branch_usage(c, sid, b, p[0].cast()),
                26 => skv_idle_sessions(c, p[0].cast(), p[1].cast(), n, p[2].cast()),
                27 => skv_admission_pages(c, sid, b, 0, 0, p[0].cast()),
                28 => skv_device_sync(c, p[0].cast(), p[1].cast()),
                _ => skv_commit_batch(c, p[0].cast(), 1, p[1].cast()),
            }
        }
    }
}

impl World {
    pub(super) fn op_buffers(&mut self, s: usize) -> skv_status {
        let side = &self.sides[s];
        let (ps, max, rows) = (side.ps(), side.max_ctx(), side.cfg.num_rows as i32);
        let i = self.pick_req(s, true);
        let req = self.sides[s].reqs[i].r;
        let a = Args {
            which: self.rng.below(30) as usize,
            n: 1 + self.rng.upto(2 * ps) as usize,
            cap: self.rng.upto(16) as usize,
            end: self.rng.upto(max),
            ps,
            row: self.rng.below(rows as u64) as i32,
            sid: self.rng.below(4),
            b: self.rng.below(2),
            req,
        };
        let (name, bufs) = a.buffers();
        // These only write caller memory (or only read it): alignment is all they check.
        let pairs = !matches!(name, "skv_idle_sessions" | "skv_device_sync");
        // Overlaps are refused where the call reads caller memory while it writes some: every
        // call above with two arrays or more.
        let mut faults: Vec<Fault> =
            bufs.iter().filter(|b| b.count > 0 && b.align > 1).map(|b| Fault::Misaligned(b.name)).collect();
        for (k, a) in bufs.iter().enumerate().filter(|(_, a)| a.count > 0 && pairs) {
            for z in bufs[k + 1..].iter().filter(|z| z.count > 0) {
                faults.push(Fault::Overlap(a.name, z.name));
                faults.push(Fault::Overlap(z.name, a.name));
            }
        }
        if !self.probes.aliased_buffers {
            faults.clear();
        }
        faults.extend(bufs.iter().filter(|b| b.count == 0).map(|b| Fault::EmptyMisaligned(b.name)));
        if faults.is_empty() {
            return SKV_OK;
        }
        let fault = faults.swap_remove(self.rng.below(faults.len() as u64) as usize);
        // Apart, each on its own 8-byte boundary; then the fault moves one array.
        let mut at = Vec::new();
        let mut end = 8usize;
        for b in &bufs {
            at.push(end);
            end = (end + b.size * b.count + 8).div_ceil(8) * 8;
        }
        let pos = |name: &str| bufs.iter().position(|b| b.name == name).unwrap();
        let odd = |w: &mut World, align: usize| 1 + w.rng.below(align as u64 - 1) as usize;
        match fault {
            Fault::Misaligned(x) => at[pos(x)] += odd(self, bufs[pos(x)].align),
            Fault::EmptyMisaligned(x) => at[pos(x)] += 1,
            Fault::Overlap(a, z) => {
                // a past the others, with room before it for z, which starts anywhere that
                // overlaps a.
                let (a, z) = (pos(a), pos(z));
                let (span, len) = (bufs[a].size * bufs[a].count, bufs[z].size * bufs[z].count);
                at[a] = (end + len).div_ceil(8) * 8;
                at[z] = self.overlapping(at[a], span, len, bufs[z].align);
            }
        }
        let size = bufs.iter().zip(&at).map(|(b, &o)| o + b.size * b.count).max().unwrap_or(0) + 8;
        let mut mem = vec![0u64; size.div_ceil(8)];
        let base = mem.as_mut_ptr() as *mut u8;
        // SAFETY: every array lies inside mem; the req is written unaligned where it lies, after
        // the other arrays (which hold -7 everywhere: indices of no page, rows of none).
        let ptrs: Vec<*mut u8> = unsafe {
            for (b, &o) in bufs.iter().zip(&at) {
                for k in 0..b.size * b.count / 4 {
                    write_unaligned(base.add(o + 4 * k) as *mut i32, -7);
                }
            }
            if let Some(k) = bufs.iter().position(|b| b.name == "req") {
                write_unaligned(base.add(at[k]) as *mut skv_req, req);
            }
            at.iter().map(|&o| base.add(o)).collect()
        };
        let refused = !matches!(fault, Fault::EmptyMisaligned(_));
        // The buffers are checked before the handle (skv_device_sync: after it).
        let c = if refused && name != "skv_device_sync" && self.rng.chance(150) { null_mut() } else { self.sides[s].c };
        let expect = if refused { Expect::Is(SKV_ERR_INVALID_ARG) } else { Expect::Any };
        self.watch = vec![(base as *const u8, size)];
        let layout: Vec<String> = bufs.iter().zip(&at).map(|(b, o)| format!("{} {}@{o}", b.name, b.count)).collect();
        let desc =
            format!("{name}({fault:?}: {}{})", layout.join(", "), if c.is_null() { ", NULL handle" } else { "" });
        self.honest = false;
        let st = self.call(s, desc, std::ptr::null(), expect, || a.call(c, &ptrs));
        if refused {
            let named = match &fault {
                Fault::Misaligned(x) => self.last_msg.contains(x) && self.last_msg.contains("aligned"),
                // An overlap at an odd offset may be named as z's misalignment.
                Fault::Overlap(a, z) => {
                    let m = &self.last_msg;
                    (m.contains(a) && m.contains(z) && m.contains("overlap"))
                        || (m.contains(z) && m.contains("aligned"))
                }
                Fault::EmptyMisaligned(_) => true,
            };
            if !named {
                self.fail(&format!("{fault:?} refused without naming it"));
            }
            *self.cover.entry("single-call misaligned or overlapping buffers refused").or_default() += 1;
        } else if st != SKV_ERR_INVALID_ARG || !self.last_msg.contains("aligned") {
            *self.cover.entry("an empty misaligned array passed unchecked").or_default() += 1;
        } else {
            self.fail("an empty array was checked for alignment");
        }
        drop(mem);
        st
    }
}
