//! The host tier's calls (`--host-pool-tokens`; docs/simulator.md#the-host-tier): untimed,
//! since they are not the session operations the latency table reports.

use skv::skv_status::{self, SKV_OK};
use skv::{skv_import, skv_req, skv_tier_evicted, skv_tier_match, skv_tier_stats, skv_where};

use super::Cache;

fn ok<T>(s: skv_status, v: T) -> Result<T, skv_status> {
    if s == SKV_OK {
        Ok(v)
    } else {
        Err(s)
    }
}

// Every call below passes `self.ptr`, a live handle until drop, and pointers from references
// or slices, valid for the call's duration.
impl Cache {
    pub fn match_prefix_tier(
        &mut self,
        sid: u64,
        bid: u64,
        req: &mut skv_req,
        key_len: u32,
    ) -> Result<skv_tier_match, skv_status> {
        let mut out = skv_tier_match { struct_size: size_of::<skv_tier_match>() as u32, ..Default::default() };
        let c = self.ptr;
        // SAFETY: a live handle; req and out are references.
        let s = self
            .timed(super::Op::Match, || unsafe { skv::skv_match_prefix_tier(c, sid, bid, req, key_len, 0, &mut out) });
        ok(s, out)
    }

    /// Completes `ticket`: its copies ran, or failed (`failed`).
    pub fn ticket_done(&mut self, ticket: u64, failed: bool) -> skv_status {
        // SAFETY: a live handle.
        unsafe { skv::skv_ticket_done(self.ptr, ticket, failed as i32) }
    }

    /// One tick of the policy's clock: the pages it queued and their ticket (0: none).
    pub fn tier_step(&mut self) -> Result<(u64, u64), skv_status> {
        let (mut pages, mut ticket) = (0u64, 0u64);
        // SAFETY: a live handle; pages and ticket are references.
        let s = unsafe { skv::skv_tier_step(self.ptr, &mut pages, &mut ticket) };
        ok(s, (pages, ticket))
    }

    pub fn tier_evict(&mut self, pages: u64) -> Result<skv_tier_evicted, skv_status> {
        let mut out = skv_tier_evicted { struct_size: size_of::<skv_tier_evicted>() as u32, ..Default::default() };
        // SAFETY: a live handle; out is a reference.
        let s = unsafe { skv::skv_tier_evict(self.ptr, pages, 0, &mut out) };
        ok(s, out)
    }

    pub fn session_where(&self, sid: u64, bid: u64) -> Result<skv_where, skv_status> {
        let mut out = skv_where { struct_size: size_of::<skv_where>() as u32, ..Default::default() };
        // SAFETY: a live handle; out is a reference.
        let s = unsafe { skv::skv_session_where(self.ptr, sid, bid, &mut out) };
        ok(s, out)
    }

    pub fn tier_stats(&self) -> Result<skv_tier_stats, skv_status> {
        let mut out = skv_tier_stats { struct_size: size_of::<skv_tier_stats>() as u32, ..Default::default() };
        // SAFETY: a live handle; out is a reference.
        let s = unsafe { skv::skv_cache_tier_stats(self.ptr, &mut out) };
        ok(s, out)
    }

    /// The token slots of positions `[start, end)` of `row`.
    pub fn row_indices(&self, row: i32, start: u32, end: u32) -> Result<Vec<i32>, skv_status> {
        let mut out = vec![0i32; (end - start) as usize];
        // SAFETY: a live handle; out has room for end - start values.
        let s = unsafe { skv::skv_row_indices(self.ptr, row, start, end, out.as_mut_ptr()) };
        ok(s, out)
    }

    /// The SWA pool's token slots of positions `[start, end)` of `row` (0 where the window
    /// passed).
    pub fn row_swa_indices(&self, row: i32, start: u32, end: u32) -> Result<Vec<i32>, skv_status> {
        let mut out = vec![0i32; (end - start) as usize];
        // SAFETY: a live handle; out has room for end - start values.
        let s = unsafe { skv::skv_row_swa_indices(self.ptr, row, start, end, out.as_mut_ptr()) };
        ok(s, out)
    }
}

/// A session's export and import between handles (`--migrate`; docs/simulator.md#migration).
impl Cache {
    /// The unit of the idle slot of (`sid`, `bid`) and the ticket pinning its pages.
    pub fn session_export(&mut self, sid: u64, bid: u64, flags: u32) -> Result<(Vec<u8>, u64), skv_status> {
        let (mut len, mut ticket) = (0usize, 0u64);
        // SAFETY: a live handle; buf NULL with cap 0 asks the size; len and ticket are references.
        let s = unsafe {
            skv::skv_session_export(self.ptr, sid, bid, flags, std::ptr::null_mut(), 0, &mut len, &mut ticket)
        };
        if s != skv_status::SKV_ERR_BUFFER {
            return Err(s);
        }
        let mut unit = vec![0u8; len];
        // SAFETY: a live handle; unit holds len writable bytes; len and ticket are references.
        let s = unsafe {
            skv::skv_session_export(self.ptr, sid, bid, flags, unit.as_mut_ptr(), unit.len(), &mut len, &mut ticket)
        };
        ok(s, ()).map(|_| {
            unit.truncate(len);
            (unit, ticket)
        })
    }

    /// Records the slot `unit` describes; the new pages' ids (the copy's destinations, full
    /// then SWA) and the ticket its KV arrives under.
    pub fn session_import(
        &mut self,
        spec: &skv_import,
        unit: &[u8],
        pages: usize,
    ) -> Result<(Vec<i32>, u64), skv_status> {
        let mut out = vec![0i32; pages];
        let (mut n, mut ticket) = (0usize, 0u64);
        // SAFETY: a live handle; spec a reference whose prefix slice outlives the call; unit a
        // slice; out holds `pages` values; n and ticket are references.
        let s = unsafe {
            skv::skv_session_import(
                self.ptr,
                spec,
                unit.as_ptr(),
                unit.len(),
                out.as_mut_ptr(),
                out.len(),
                &mut n,
                &mut ticket,
            )
        };
        ok(s, ()).map(|_| {
            out.truncate(n);
            (out, ticket)
        })
    }
}

impl Cache {
    /// Whether the move `unit` describes committed here (SKV_FENCE_*); fences its epoch when
    /// it did not.
    pub fn session_fence(&mut self, unit: &[u8]) -> Result<i32, skv_status> {
        let mut state = -1;
        // SAFETY: a live handle; unit holds its length; state is a reference.
        let s = unsafe { skv::skv_session_fence(self.ptr, unit.as_ptr(), unit.len(), &mut state) };
        ok(s, state)
    }
}
