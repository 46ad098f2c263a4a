//! Recurrent-state handles (`--mamba`), as sglang's hybrid models hold them: each request a
//! pool slot (`aux_state`) and a two-entry ping-pong track buffer (`aux_track`) whose entries
//! alternate. At a track boundary the engine fills the empty entry with the next tracked
//! state; after the following round it frees the older entry itself. Whatever the req holds
//! when libskv takes it over (a finish) or lets it go (an abort, a release) is libskv's to
//! hand back, in the order `aux_state`, `aux_track[0]`, `aux_track[1]`; the engine checks
//! every such call against its own mirror.

use skv::skv_req;

use super::{Engine, Fault, Turn};

/// Verify rounds between track boundaries.
const TRACK_EVERY: u32 = 4;

/// Where a request's ping-pong buffer stands (sglang's `mamba_next_track_idx`).
#[derive(Clone, Copy, Default)]
pub(super) struct Track {
    /// The entry the tracked state is written to.
    next: usize,
    /// The older entry, freed by the engine after the round that filled `next`.
    stale: Option<usize>,
    rounds: u32,
}

/// A req's handles in libskv's free order, sentinels included.
pub(super) fn handles_of(r: &skv_req) -> [i64; 3] {
    [r.aux_state, r.aux_track[0], r.aux_track[1]]
}

/// The handles libskv hands back for `h`, in order: the sentinels skipped.
pub(super) fn real(h: [i64; 3]) -> impl Iterator<Item = i64> {
    h.into_iter().filter(|&x| x != -1)
}

impl Engine<'_> {
    /// A request without a slot to restore: a fresh pool slot and its first track entry.
    pub(super) fn mamba_first_turn(&mut self, req: &mut skv_req) -> Track {
        if self.cfg.args.mamba {
            let h = &self.inst[self.cur].cache.hooks.handles;
            req.aux_state = h.alloc();
            req.aux_track[0] = h.alloc();
        }
        Track::default()
    }

    /// One verify round's track-buffer work.
    pub(super) fn track_step(&mut self, t: &mut Turn) -> Result<(), Fault> {
        if !self.cfg.args.mamba {
            return Ok(());
        }
        let h = &self.inst[self.cur].cache.hooks.handles;
        if let Some(old) = t.track.stale.take() {
            if !h.engine_free(t.req.aux_track[old]) {
                return Err(format!("track entry {} was not live when the engine freed it", t.req.aux_track[old]));
            }
            t.req.aux_track[old] = -1;
        }
        t.track.rounds += 1;
        let other = 1 - t.track.next;
        if t.track.rounds.is_multiple_of(TRACK_EVERY) && t.req.aux_track[other] == -1 {
            t.req.aux_track[other] = h.alloc();
            t.track.stale = Some(t.track.next);
            t.track.next = other;
        }
        Ok(())
    }

    /// What `free_aux` received during `what` must be `want`, in order; -1 or a handle not
    /// live is a fault whatever was expected.
    pub(super) fn expect_handed_back(&self, what: &str, want: impl IntoIterator<Item = i64>) -> Result<(), Fault> {
        let h = &self.inst[self.cur].cache.hooks.handles;
        let got = h.take_handed_back();
        let want: Vec<i64> = want.into_iter().collect();
        if got != want || !h.bad.borrow().is_empty() {
            return Err(format!("{what}: free_aux received {got:?}, the engine expected {want:?}"));
        }
        Ok(())
    }

    /// After every session closed: every handle came back once, by libskv or by the engine.
    pub(super) fn mamba_close_out(&mut self) -> Result<(), Fault> {
        let mut bad = Vec::new();
        for inst in &self.inst {
            let h = &inst.cache.hooks.handles;
            self.m.mamba_allocated += h.allocated.get();
            self.m.mamba_freed_by_libskv += h.freed_by_libskv.get();
            self.m.mamba_freed_by_engine += h.freed_by_engine.get();
            self.m.mamba_leaked += h.live() as u64;
            bad.extend(h.bad.borrow().iter().copied());
        }
        if self.m.mamba_leaked > 0 || !bad.is_empty() {
            return Err(format!(
                "recurrent-state handles: {} allocated, {} leaked, bad free_aux calls {bad:?}",
                self.m.mamba_allocated, self.m.mamba_leaked,
            ));
        }
        Ok(())
    }
}
