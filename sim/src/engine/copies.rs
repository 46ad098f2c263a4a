//! The host tier's copies as the engine runs them (`--host-pool-tokens`): one FIFO queue per
//! direction at the modelled bandwidth, each ticket completed (`skv_ticket_done`) at the first
//! step boundary after its modelled finish, or when a step waits for it; and a byte-tag mirror
//! of every device and host token slot, written by the forward passes and moved by the copies
//! when their ticket completes, against which every reused position is checked.

use std::collections::{BTreeMap, HashSet};

use skv::{SKV_COPY_TO_DEVICE, SKV_COPY_TO_HOST};

use crate::ffi::CopyCall;
use crate::workload::Rng;

use super::{unexpected, Engine, Fault};

/// The tag a forward pass writes at `pos` of (session, branch) in the turn `writer` (0: the
/// shared system prompt, written once by the engine's tree). Never 0, the tag of a slot
/// nothing wrote.
pub(super) fn tag(sid: u64, bid: u64, pos: u32, writer: u64) -> u64 {
    let (sid, bid) = if writer == 0 { (0, 0) } else { (sid, bid) };
    let mut z = sid.wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ bid.wrapping_mul(0xC2B2_AE3D_27D4_EB4F)
        ^ writer.wrapping_mul(0x1656_67B1_9E37_79F9)
        ^ pos as u64;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)) | 1
}

/// The writer of each stretch of a slot's positions: `(first position, writer)`, ascending.
pub(super) type Writes = Vec<(u32, u64)>;

/// The writer of `pos`.
pub(super) fn writer_at(w: &Writes, pos: u32) -> u64 {
    w.iter().rev().find(|&&(from, _)| from <= pos).map_or(u64::MAX, |&(_, id)| id)
}

/// A ticket the engine has not completed yet.
struct Open {
    finish: f64,
    to_host: bool,
    copies: Vec<CopyCall>,
}

/// The copy queues and the tag mirror.
pub(super) struct Copies {
    pub(super) device: Vec<u64>,
    host: Vec<u64>,
    /// The SWA pools' tags (empty without an SWA pool).
    swa_device: Vec<u64>,
    swa_host: Vec<u64>,
    ps: usize,
    page_bytes: f64,
    bytes_per_s: f64,
    open: BTreeMap<u64, Open>,
    /// When each queue (to host, to device) is next free, in modelled seconds.
    free_at: [f64; 2],
    /// `--copy-fail-rate`: the chance a ticket's copies fail, drawn from a stream of its own
    /// (the workload's stays as it is), and the restores that failed.
    fail_rate: f64,
    fail_rng: Rng,
    pub(super) failed: HashSet<u64>,
}

/// Pages of each pool: (device, host) of the full pools, then of the SWA pools (0: none).
pub(super) type PoolPages = [(u64, u64); 2];

impl Copies {
    pub(super) fn new(pages: PoolPages, a: &crate::cli::Args) -> Copies {
        let ps = a.page_size;
        let slots = |n: u64| vec![0; (n * ps as u64) as usize];
        Copies {
            device: slots(pages[0].0),
            host: slots(pages[0].1),
            swa_device: slots(pages[1].0),
            swa_host: slots(pages[1].1),
            ps: ps as usize,
            page_bytes: ps as f64 * a.kv_bytes_per_token as f64,
            bytes_per_s: a.copy_gbps * 1e9,
            open: BTreeMap::new(),
            free_at: [0.0; 2],
            fail_rate: a.copy_fail_rate,
            fail_rng: Rng::new(a.seed ^ 0x636F_7079_6661_696C),
            failed: HashSet::new(),
        }
    }

    /// The open write-backs' last modelled finish (None: none open).
    pub(super) fn last_to_host(&self) -> Option<f64> {
        self.open.values().filter(|o| o.to_host).map(|o| o.finish).reduce(f64::max)
    }

    pub(super) fn finish_of(&self, ticket: u64) -> Option<f64> {
        self.open.get(&ticket).map(|o| o.finish)
    }

    pub(super) fn open_count(&self) -> usize {
        self.open.len()
    }

    /// Applies a completed ticket's copies to the mirror, page by page: the first `n_full`
    /// pairs in the full pools, the rest in the SWA pools.
    fn apply(&mut self, copies: &[CopyCall]) {
        let ps = self.ps;
        for c in copies {
            for (k, (&s, &d)) in c.src.iter().zip(&c.dst).enumerate() {
                let (s, d) = (s as usize * ps, d as usize * ps);
                let (device, host) = match k < c.n_full {
                    true => (&mut self.device, &mut self.host),
                    false => (&mut self.swa_device, &mut self.swa_host),
                };
                if c.direction == SKV_COPY_TO_HOST {
                    host[d..d + ps].copy_from_slice(&device[s..s + ps]);
                } else {
                    device[d..d + ps].copy_from_slice(&host[s..s + ps]);
                }
            }
        }
    }

    fn swa(&self) -> bool {
        !self.swa_device.is_empty()
    }

    /// Whether `ticket`'s copies are queued and not yet complete.
    pub(super) fn is_open(&self, ticket: u64) -> bool {
        self.open.contains_key(&ticket)
    }
}

impl Engine<'_> {
    pub(super) fn copies(&mut self) -> &mut Copies {
        &mut self.tier[self.cur].copies
    }

    /// Queues the copies `copy_pages` received for `ticket`, the ticket a libskv call just
    /// returned (0: none); a copy under any other ticket is a fault.
    pub(super) fn enqueue(&mut self, what: &str, ticket: u64) -> Result<(), Fault> {
        let calls = std::mem::take(&mut *self.inst[self.cur].cache.hooks.copies.borrow_mut());
        if let Some(c) = calls.iter().find(|c| c.ticket != ticket || ticket == 0) {
            return Err(format!("{what}: copy_pages for ticket {} but the call returned ticket {ticket}", c.ticket));
        }
        if let Some(c) = calls.iter().find(|c| c.n_full != c.src.len() && !self.copies().swa()) {
            return Err(format!("{what}: copy_pages with {} SWA pairs and no SWA pool", c.src.len() - c.n_full));
        }
        if ticket == 0 {
            return Ok(());
        }
        let now = self.clock.now;
        let c = self.copies();
        if c.open.contains_key(&ticket) {
            // A retried match of a session still being restored names the restore's ticket
            // again, and asks for no copy.
            if calls.is_empty() {
                return Ok(());
            }
            return Err(format!("{what}: returned ticket {ticket}, already open"));
        }
        let to_host = calls.first().is_none_or(|c| c.direction == SKV_COPY_TO_HOST);
        let want = if to_host { SKV_COPY_TO_HOST } else { SKV_COPY_TO_DEVICE };
        if let Some(c) = calls.iter().find(|c| c.direction != want) {
            return Err(format!("{what}: copy_pages direction {} in a ticket whose copies go {want}", c.direction));
        }
        let pages: usize = calls.iter().map(|c| c.src.len()).sum();
        let q = if to_host { 0 } else { 1 };
        let finish = c.free_at[q].max(now) + pages as f64 * c.page_bytes / c.bytes_per_s;
        c.free_at[q] = finish;
        c.open.insert(ticket, Open { finish, to_host, copies: calls });
        Ok(())
    }

    /// Completes, in ticket order, every open ticket whose copies are done by `t`.
    pub(super) fn complete_due(&mut self, t: f64) -> Result<(), Fault> {
        let due: Vec<u64> = self.copies().open.iter().filter(|(_, o)| o.finish <= t).map(|(&k, _)| k).collect();
        for ticket in due {
            let o = self.copies().open.remove(&ticket).expect("due ticket");
            let c = self.copies();
            let failed = c.fail_rate > 0.0 && c.fail_rng.chance(c.fail_rate);
            if failed && !o.to_host {
                c.failed.insert(ticket); // a restore: its request cannot run
            }
            if !failed {
                c.apply(&o.copies);
            }
            let what = format!("skv_ticket_done({ticket}, failed {failed})");
            let s = self.inst[self.cur].cache.ticket_done(ticket, failed);
            if s != skv::skv_status::SKV_OK {
                return Err(unexpected(&what, s));
            }
            // A completed copy parks or frees pages, a failed one loses nothing: no slot goes.
            self.expect_handed_back(&what, [])?;
        }
        Ok(())
    }

    /// Writes the tags of positions `[from, to)` of a running request's row (its forward
    /// passes' KV), as (session, branch) `slot` in turn `writer`.
    pub(super) fn write_tags(
        &mut self,
        row: i32,
        slot: (u64, u64),
        from: u32,
        to: u32,
        writer: u64,
    ) -> Result<(), Fault> {
        let (sid, bid) = slot;
        if from >= to {
            return Ok(());
        }
        let idx = self.inst[self.cur].cache.row_indices(row, from, to).map_err(|s| unexpected("skv_row_indices", s))?;
        let dev = &mut self.copies().device;
        for (p, &x) in (from..to).zip(&idx) {
            dev[x as usize] = tag(sid, bid, p, writer);
        }
        if !self.copies().swa() {
            return Ok(());
        }
        // The sliding-window layers' KV, at the positions the window still holds.
        let idx = self.inst[self.cur]
            .cache
            .row_swa_indices(row, from, to)
            .map_err(|s| unexpected("skv_row_swa_indices", s))?;
        let dev = &mut self.copies().swa_device;
        for (p, &x) in (from..to).zip(&idx).filter(|&(_, &x)| x != 0) {
            dev[x as usize] = tag(sid, bid, p, writer);
        }
        Ok(())
    }

    /// Checks positions `[0, len)` of `row`, the (session, branch) `slot`'s, against the writers
    /// the engine recorded; with an SWA pool, also every position the window holds (from the
    /// SWA cursor `cursor` on, and any other still mapped).
    pub(super) fn verify_tags(
        &mut self,
        what: &str,
        row: i32,
        slot: (u64, u64),
        (len, cursor): (u32, u32),
        w: &Writes,
    ) -> Result<(), Fault> {
        let (sid, bid) = slot;
        if len == 0 {
            return Ok(());
        }
        let idx = self.inst[self.cur].cache.row_indices(row, 0, len).map_err(|s| unexpected("skv_row_indices", s))?;
        let dev = &self.tier[self.cur].copies.device;
        for (p, &x) in (0..len).zip(&idx) {
            let want = tag(sid, bid, p, writer_at(w, p));
            if dev[x as usize] != want {
                return Err(format!(
                    "{what}: position {p} of {len} (token slot {x}) holds the KV of another write ({:#x}, expected {want:#x})",
                    dev[x as usize]
                ));
            }
        }
        self.m.tier.verified_positions += len as u64;
        if !self.copies().swa() {
            return Ok(());
        }
        let idx =
            self.inst[self.cur].cache.row_swa_indices(row, 0, len).map_err(|s| unexpected("skv_row_swa_indices", s))?;
        let dev = &self.tier[self.cur].copies.swa_device;
        for (p, &x) in (0..len).zip(&idx) {
            let want = tag(sid, bid, p, writer_at(w, p));
            if (x == 0 && p >= cursor) || (x != 0 && dev[x as usize] != want) {
                let held = if x == 0 { 0 } else { dev[x as usize] };
                return Err(format!(
                    "{what}: position {p} of {len} (SWA cursor {cursor}, SWA token slot {x}) holds the sliding-window KV of another write ({held:#x}, expected {want:#x})"
                ));
            }
        }
        Ok(())
    }

    /// The shared system prompt's sliding-window KV, `[0, len)` of a row that mapped it (the
    /// tree's pages: the same tags for every row).
    pub(super) fn write_shared_swa_tags(&mut self, row: i32, len: u32) -> Result<(), Fault> {
        if len == 0 || !self.copies().swa() {
            return Ok(());
        }
        let idx =
            self.inst[self.cur].cache.row_swa_indices(row, 0, len).map_err(|s| unexpected("skv_row_swa_indices", s))?;
        let dev = &mut self.copies().swa_device;
        for (p, &x) in (0..len).zip(&idx).filter(|&(_, &x)| x != 0) {
            dev[x as usize] = tag(0, 0, p, 0);
        }
        Ok(())
    }
}
