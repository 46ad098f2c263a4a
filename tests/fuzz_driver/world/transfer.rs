//! Moving a session (docs/transfer.md): move exports of idle sessions (their units join the
//! ones the side imports, so fenced epochs and move units reach skv_session_import), the
//! destination's answer skv_session_fence at any epoch, and skv_transfer_descs over honest and
//! hostile layouts and ids (it takes no handle: the side only labels the log).

use std::ptr::{null, null_mut};

use skv::skv_status::*;
use skv::*;

use super::{Expect, World};

impl World {
    pub(super) fn op_transfer(&mut self, s: usize) -> skv_status {
        match self.rng.below(10) {
            0..=3 => self.transfer_move(s),
            4..=6 => self.transfer_fence(s),
            _ => self.transfer_descs(s),
        }
    }

    fn transfer_move(&mut self, s: usize) -> skv_status {
        let idle = |w: &skv_where| w.place != SKV_PLACE_NONE && w.state == 0;
        let (sid, b) = match self.slot_where(s, idle) {
            Some(k) if self.rng.chance(900) => k,
            _ => (self.session(), self.branch()),
        };
        let c = self.sides[s].c;
        let (mut len, mut t) = (0usize, 0u64);
        // SAFETY: the side's live handle; NULL buf with cap 0 asks the size.
        unsafe { skv_session_export(c, sid, b, SKV_EXPORT_MOVE, null_mut(), 0, &mut len, &mut t) };
        let mut buf = vec![0u8; len.max(8)];
        let bp = buf.as_mut_ptr();
        let desc = format!("skv_session_export(s {sid} b {b}, flags move, cap {len})");
        // SAFETY: the side's live handle; bp holds len bytes or more.
        let st = self.call(s, desc, null(), Expect::Any, || unsafe {
            skv_session_export(c, sid, b, SKV_EXPORT_MOVE, bp, len, &mut len, &mut t)
        });
        if st == SKV_OK {
            self.keep_unit(s, t, buf, len, "session move-exported");
        }
        st
    }

    fn transfer_fence(&mut self, s: usize) -> skv_status {
        let c = self.sides[s].c;
        let units = &self.sides[s].units;
        let unit = match units.is_empty() {
            true => Vec::new(),
            false => units[self.rng.below(units.len() as u64) as usize].clone(),
        };
        // A unit's flags (offset 12), bit 2: a move's.
        let moving = unit.len() >= 16 && u32::from_ne_bytes(unit[12..16].try_into().unwrap()) & 4 != 0;
        let mut state = -1i32;
        let null_out = self.rng.chance(100);
        let out: *mut i32 = if null_out { null_mut() } else { &mut state };
        // A later version's unit (offset 8): a question this library cannot answer.
        let later = !unit.is_empty() && self.rng.chance(100);
        let mut unit = unit;
        if later {
            unit[8] = 2;
        }
        let want = match (null_out, unit.is_empty(), moving) {
            (true, ..) => Expect::Is(SKV_ERR_NULL_ARG),
            _ if later => Expect::Is(SKV_ERR_UNSUPPORTED),
            (false, true, _) => Expect::Is(SKV_ERR_INVALID_ARG),
            (false, false, false) => Expect::Is(SKV_ERR_INVALID_ARG),
            (false, false, true) => Expect::Is(SKV_OK),
        };
        let (up, len) = (if unit.is_empty() { null() } else { unit.as_ptr() }, unit.len());
        // SAFETY: the side's live handle; up NULL (len 0) or len bytes; out NULL or a local.
        let st = self.call(s, format!("skv_session_fence(unit {len} bytes, move {moving})"), null(), want, || unsafe {
            skv_session_fence(c, up, len, out)
        });
        if st == SKV_OK && !(SKV_FENCE_ABSENT..=SKV_FENCE_COMMITTED).contains(&state) {
            self.fail(&format!("skv_session_fence answered {state}"));
        }
        st
    }

    fn transfer_descs(&mut self, s: usize) -> skv_status {
        let n = self.rng.below(6) as usize;
        let mut local: Vec<i32> = (0..n).map(|_| 1 + self.rng.below(8) as i32).collect();
        let remote: Vec<i32> = (0..n).map(|_| 1 + self.rng.below(8) as i32).collect();
        let bases = [0x1000u64, 0x9000];
        let stride = self.rng.pick(&[16u64, 32]);
        let mk = |p: *const u64| skv_kv_layout {
            struct_size: std::mem::size_of::<skv_kv_layout>() as u32,
            n_regions: 2,
            region_base: p,
            page_stride: stride,
            page_bytes: 16,
        };
        let (mut l, r) = (mk(bases.as_ptr()), mk(bases.as_ptr()));
        let mut out = [skv_xfer_desc::default(); 12];
        let (mut cap, mut n_out) = (out.len(), 0usize);
        let mut lp = local.as_ptr();
        let want = match self.rng.below(8) {
            0 => {
                lp = null();
                if n > 0 {
                    Expect::Is(SKV_ERR_NULL_ARG)
                } else {
                    Expect::Is(SKV_OK)
                }
            }
            1 if n > 0 => {
                local[0] = 0;
                Expect::Is(SKV_ERR_INVALID_ARG)
            }
            2 => {
                l.page_bytes = 8;
                Expect::Is(SKV_ERR_INVALID_ARG)
            }
            3 => {
                l.struct_size = 8;
                Expect::Is(SKV_ERR_INVALID_ARG)
            }
            4 if n > 0 => {
                cap = 0;
                Expect::Is(SKV_ERR_BUFFER)
            }
            _ => Expect::Is(SKV_OK),
        };
        let op = if cap == 0 { null_mut() } else { out.as_mut_ptr() };
        let desc = format!("skv_transfer_descs(local {local:?}, remote {remote:?}, stride {stride}, cap {cap})");
        // SAFETY: lp NULL or n ids, the layouts' bases hold 2 values, op NULL or cap descs.
        let st = self.call(s, desc, null(), want, || unsafe {
            skv_transfer_descs(&l, lp, &r, remote.as_ptr(), n, op, cap, &mut n_out)
        });
        if st == SKV_OK {
            let moved: u64 = out[..n_out].iter().map(|d| d.len).sum();
            if moved != 2 * 16 * n as u64 {
                self.fail(&format!("skv_transfer_descs moved {moved} bytes for {n} pages of 2 x 16"));
            }
        }
        st
    }
}
