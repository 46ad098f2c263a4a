//! The exports the rest of the fuzzer does not drive: `skv_req_init`, `skv_cache_check` as a
//! call (not the audit), the device calls (SKV_ERR_UNSUPPORTED in a build without the `cuda`
//! feature), and the queries without a status (names, versions, the dlopen table).

use std::ffi::CStr;
use std::ptr::null_mut;

use skv::skv_status::*;
use skv::*;

use super::{init_req, Expect, World};

impl World {
    pub(super) fn op_misc(&mut self, s: usize) -> skv_status {
        let c = self.sides[s].c;
        let owned = self.sides[s].owned;
        let null = self.rng.chance(300);
        match self.rng.below(5) {
            0 => {
                let i = self.pick_req(s, false);
                let mut r = self.sides[s].reqs[i].r;
                let rp: *mut skv_req = if null { null_mut() } else { &mut r };
                let want = if null { SKV_ERR_NULL_ARG } else { SKV_OK };
                // SAFETY: rp is NULL or points at the local r.
                let st = self.call(s, "skv_req_init(a used req)".into(), null_mut(), Expect::Is(want), || unsafe {
                    skv_req_init(rp)
                });
                if st == SKV_OK && r != init_req() {
                    self.fail(&format!("skv_req_init left {r:?}"));
                }
                st
            }
            1 => {
                // SAFETY: skv_check_report is plain integers and bytes: all zero is valid.
                let mut rep = unsafe { std::mem::zeroed::<skv_check_report>() };
                let (cp, op): (*const skv_cache, *mut skv_check_report) = match (null, self.rng.below(2)) {
                    (true, 0) => (std::ptr::null(), &mut rep),
                    (true, _) => (c, null_mut()),
                    _ => (c, &mut rep),
                };
                let want = match () {
                    _ if null => SKV_ERR_NULL_ARG,
                    _ if !owned => SKV_ERR_UNSUPPORTED,
                    _ => SKV_OK,
                };
                // SAFETY: cp is NULL or the side's live handle; op is NULL or points at rep.
                let st = self.call(s, "skv_cache_check".into(), std::ptr::null(), Expect::Is(want), || unsafe {
                    skv_cache_check(cp, op)
                });
                if st == SKV_OK && rep.violations != 0 {
                    self.fail(&format!("skv_cache_check reports {} violations", rep.violations));
                }
                st
            }
            2 | 3 => {
                // Without the cuda feature the device calls are unavailable; with it, they may
                // attach a device copy (the state the snapshots compare does not change).
                let cuda = cfg!(feature = "cuda");
                let cp = if null { null_mut() } else { c };
                let want = match () {
                    _ if null => Expect::Is(SKV_ERR_NULL_ARG),
                    _ if cuda => Expect::Any,
                    _ => Expect::Is(SKV_ERR_UNSUPPORTED),
                };
                let (mut ptr, mut stride) = (7u64, 7u64);
                let (pp, sp): (*mut u64, *mut u64) = (&mut ptr, &mut stride);
                let st = match self.rng.below(2) {
                    // SAFETY: cp is NULL or the side's live handle; the stream is the default.
                    0 => self.call(s, "skv_device_attach(0)".into(), std::ptr::null(), want, || unsafe {
                        skv_device_attach(cp, 0, null_mut())
                    }),
                    // SAFETY: cp is NULL or the side's live handle; pp and sp point at locals.
                    _ => self.call(s, "skv_device_sync".into(), std::ptr::null(), want, || unsafe {
                        skv_device_sync(cp, pp, sp)
                    }),
                };
                if st != SKV_OK && (ptr, stride) != (7, 7) {
                    self.fail("a failing skv_device_sync wrote its out-values");
                }
                st
            }
            4 if self.probes.aliased_buffers && self.rng.chance(500) => {
                // A handle pointer no live handle has (misaligned): refused before it is read.
                // (skv_device_attach and skv_device_sync read it first, through the trace
                // check every export makes: not probed.)
                let bad = (c as usize + 1 + self.rng.below(7) as usize) as *mut skv_cache;
                let desc = format!("skv_cache_set_trace(misaligned handle {bad:p})");
                // SAFETY: bad is never dereferenced (the call refuses a misaligned handle first).
                self.call(s, desc, std::ptr::null(), Expect::Is(SKV_ERR_INVALID_ARG), || unsafe {
                    skv_cache_set_trace(bad, std::ptr::null())
                })
            }
            _ => {
                self.no_status_calls();
                SKV_OK
            }
        }
    }

    /// The exports without a status: never NULL, and what the header says they return.
    fn no_status_calls(&mut self) {
        let v = self.rng.below(14) as i32 - 2;
        // SAFETY: these take plain values and return static strings or tables (or the thread's
        // last error, valid until the next call).
        let bad = unsafe {
            let name = CStr::from_ptr(skv_status_str(v as _)).to_str().unwrap_or("");
            let want = match v {
                0..=10 => super::super::coverage::STATUSES[v as usize],
                _ => "SKV_ERR_UNKNOWN",
            };
            let last = skv_last_error();
            let version = CStr::from_ptr(skv_version()).to_str().unwrap_or("");
            let abi = skv_abi_version();
            if name != want {
                Some(format!("skv_status_str({v}) = {name:?}, not {want:?}"))
            } else if last.is_null() {
                Some("skv_last_error() returned NULL".into())
            } else if version != env!("CARGO_PKG_VERSION") || abi != SKV_ABI_VERSION {
                Some(format!("skv_version() {version:?}, skv_abi_version() {abi}"))
            } else if skv_get_api(abi).is_null() || !skv_get_api(abi.wrapping_sub(1)).is_null() {
                Some(format!("skv_get_api: its own ABI {abi} must give the table, the one before it NULL"))
            } else {
                None
            }
        };
        if let Some(b) = bad {
            self.fail(&b);
        }
        *self.cover.entry("names, versions and the dlopen table checked").or_default() += 1;
    }
}
