//! A session as a movable unit (ABI 4): skv_session_export of idle (and other) sessions in
//! both modes, its size query, short buffers and bad arguments; skv_session_import of the
//! units a side exported into the owned side (as another session), and hostile imports on
//! both sides (a corrupt unit, a later version, bad flags, pointers and rows). Export and
//! import tickets join the ones the fuzzer completes (ok or failed: a failed import is
//! released).

use std::ptr::{null, null_mut};

use skv::skv_status::*;
use skv::*;

use super::{Expect, World, SESSIONS};

/// A u32 field of a unit (docs/tiers.md, "Byte form").
fn field(unit: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes(unit[at..at + 4].try_into().expect("4 bytes"))
}

impl World {
    pub(super) fn op_unit(&mut self, s: usize) -> skv_status {
        if self.rng.chance(550) || self.sides[s].units.is_empty() {
            self.unit_export(s)
        } else {
            self.unit_import(s)
        }
    }

    fn unit_export(&mut self, s: usize) -> skv_status {
        let idle = |w: &skv_where| w.place != SKV_PLACE_NONE && w.state == 0;
        let (sid, b) = match self.slot_where(s, idle) {
            Some(k) if self.rng.chance(800) => k,
            _ => (self.session(), self.branch()),
        };
        let c = self.sides[s].c;
        // The size first (NULL, 0): SKV_ERR_BUFFER with *len, nothing pinned.
        let (mut len, mut t) = (0usize, 0u64);
        // SAFETY: the side's live handle; NULL buf with cap 0 asks the size.
        let st = unsafe { skv_session_export(c, sid, b, 0, null_mut(), 0, &mut len, &mut t) };
        let mut buf = vec![0u8; len.max(8) + 8];
        let (mut flags, mut cap, mut lp, mut tp): (u32, usize, *mut usize, *mut u64) = (0, len, &mut len, &mut t);
        let mut odd = [0u64; 4];
        let want = match self.rng.below(24) {
            0 => {
                flags = self.rng.pick(&[2, 4, u32::MAX]);
                Expect::Is(SKV_ERR_INVALID_ARG)
            }
            1 => {
                lp = null_mut();
                Expect::Is(SKV_ERR_NULL_ARG)
            }
            2 => {
                // SAFETY: 4 bytes into a 32-byte local: misaligned for a u64.
                tp = unsafe { (odd.as_mut_ptr() as *mut u8).add(4) as *mut u64 };
                Expect::Is(SKV_ERR_INVALID_ARG)
            }
            3 if st == SKV_ERR_BUFFER && len > 0 => {
                cap = len - 1;
                Expect::Is(SKV_ERR_BUFFER)
            }
            4 => {
                cap = 0;
                Expect::Any
            }
            _ if st == SKV_ERR_BUFFER => Expect::Any,
            // No unit to write (no slot, in flight, being copied ...): refused again.
            _ => Expect::Fail,
        };
        let bp = if cap == 0 { null_mut() } else { buf.as_mut_ptr() };
        let desc = format!("skv_session_export(s {sid} b {b}, flags {flags}, cap {cap})");
        // SAFETY: the side's live handle; bp holds cap bytes (NULL with cap 0); lp and tp are
        // NULL, misaligned on purpose or locals.
        let st = self.call(s, desc, null(), want, || unsafe { skv_session_export(c, sid, b, flags, bp, cap, lp, tp) });
        if st == SKV_OK {
            self.keep_unit(s, t, buf, len, "session exported");
        }
        st
    }

    /// An export's ticket joins those the fuzzer completes; its unit (`len` bytes of `buf`)
    /// joins the side's last four, which its imports and questions use.
    pub(super) fn keep_unit(&mut self, s: usize, t: u64, mut buf: Vec<u8>, len: usize, what: &'static str) {
        self.note_ticket(s, t);
        buf.truncate(len);
        let units = &mut self.sides[s].units;
        units.push(buf);
        if units.len() > 4 {
            units.remove(0);
        }
        *self.cover.entry(what).or_default() += 1;
    }

    fn unit_import(&mut self, s: usize) -> skv_status {
        let k = self.rng.below(self.sides[s].units.len() as u64) as usize;
        let mut unit = self.sides[s].units[k].clone();
        let (c, owned) = (self.sides[s].c, self.sides[s].owned);
        // A move's unit (flags bit 2) is imported under its own key, mostly (another is refused).
        let key64 = |at: usize| u64::from_ne_bytes(unit[at..at + 8].try_into().expect("8 bytes"));
        let (sid, bid) = match field(&unit, 12) & 4 != 0 && self.rng.chance(900) {
            true => (key64(40), key64(48)),
            false => (self.rng.below(SESSIONS), 0),
        };
        let held = field(&unit, 76);
        let mut aux = [-1i64; 3];
        for (i, a) in aux.iter_mut().enumerate().filter(|(i, _)| held & (1 << i) != 0) {
            *a = self.sides[s].next_aux + i as i64;
        }
        let lock = if owned && self.rng.chance(300) { self.sides[s].next_lock } else { 0 };
        let mut spec = skv_import {
            struct_size: std::mem::size_of::<skv_import>() as u32,
            flags: 0,
            session_id: sid,
            branch_id: bid,
            row: -1,
            n_prefix: field(&unit, 64),
            prefix_indices: null(),
            lock_node: lock,
            lock_receipt: lock.wrapping_mul(31),
            aux_state: aux[0],
            aux_track: [aux[1], aux[2]],
            tokens: null(),
            n_tokens: 0,
        };
        let n = (field(&unit, 80) + field(&unit, 84)) as usize;
        let mut out = vec![0i32; n + 1];
        let mut cap = n;
        let mut len = unit.len();
        let (mut np, mut tp) = (0usize, 0u64);
        let hostile = match self.rng.below(if owned { 10 } else { 6 }) {
            0 => {
                unit[0] ^= 0x20;
                Some(SKV_ERR_INVALID_ARG)
            }
            // Refused, by a check whose place among the others depends on the unit (BUFFER
            // stands for "some refusal").
            1 => {
                len = self.rng.below(len as u64) as usize;
                Some(SKV_ERR_BUFFER)
            }
            2 => {
                unit[8] = 2;
                (field(&unit, 4) == 0x0102_0304).then_some(SKV_ERR_UNSUPPORTED)
            }
            3 => {
                spec.flags = 1;
                Some(SKV_ERR_INVALID_ARG)
            }
            4 => {
                spec.struct_size = self.rng.pick(&[0, 8, 40]);
                Some(SKV_ERR_BUFFER)
            }
            5 if owned => {
                spec.row = self.rng.below(self.sides[s].cfg.num_rows as u64) as i32;
                Some(SKV_ERR_BUFFER)
            }
            // External mode adopts an engine row mapping the unit: the fuzzer's engine has none
            // to give, so only refusals are asked for there.
            5 => {
                spec.row = self.bad_row(s);
                Some(SKV_ERR_BUFFER)
            }
            6 if n > 0 => {
                cap = n - 1;
                Some(SKV_ERR_BUFFER)
            }
            _ => None,
        };
        // A protected prefix without its indices is refused before the unit is read.
        let hostile = match hostile {
            Some(SKV_ERR_INVALID_ARG | SKV_ERR_UNSUPPORTED) if spec.n_prefix > 0 && spec.flags == 0 => {
                Some(SKV_ERR_NULL_ARG)
            }
            h => h,
        };
        let want = match hostile {
            Some(SKV_ERR_BUFFER) => Expect::Fail,
            Some(st) => Expect::Is(st),
            None if owned => Expect::Any,
            // In external mode row -1 is out of range (the engine names its row).
            None => Expect::Fail,
        };
        let up = if len == 0 { null() } else { unit.as_ptr() };
        let desc = format!("skv_session_import(s {sid}, unit {len} bytes, {n} pages, cap {cap}, row {})", spec.row);
        let op = out.as_mut_ptr();
        // SAFETY: the side's live handle; up holds len bytes (NULL with 0), op cap + 1 values.
        let st = self.call(s, desc, null(), want, || unsafe {
            skv_session_import(c, &spec, up, len, op, cap, &mut np, &mut tp)
        });
        if self.completed(st) && hostile.is_none() {
            let side = &mut self.sides[s];
            side.next_aux += 3;
            side.next_lock += (lock != 0) as u64;
            self.note_ticket(s, tp);
            *self.cover.entry("session imported").or_default() += 1;
        }
        st
    }
}
