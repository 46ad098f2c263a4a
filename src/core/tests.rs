//! Unit tests of the session operations over a recording pool, the golden cases of
//! docs/operations.md among them, and of owned mode's allocator.

use super::*;

use std::sync::{Arc, Mutex};

/// An engine pool that records what it is asked to free; `req_to_token[r][p] = r*cols + p`.
#[derive(Default)]
struct Recorder {
    cols: i32,
    /// Each effect as the engine would see it, with the freed indices spelled out.
    log: Arc<Mutex<Vec<String>>>,
    fail_prepare: bool,
}

impl Pool for Recorder {
    fn prepare(&mut self, _effects: &[Effect]) -> Result<()> {
        if self.fail_prepare {
            return Err(Error::Callback("read_row failed".into()));
        }
        Ok(())
    }
    fn apply(&mut self, effects: &[Effect]) -> Result<()> {
        let mut log = self.log.lock().unwrap();
        for e in effects {
            log.push(match *e {
                Effect::FreeKv { row, start, end, dead_lo, dead_hi, .. } => {
                    // sglang's split, as free_kv_segment sees it: "free_full" for the part
                    // whose SWA slots the window already freed, "free_kv" for both pools.
                    let base = row as i32 * self.cols;
                    for p in split(start, end, dead_lo, dead_hi) {
                        let name = if p.pools == Pools::Full { "free_full" } else { "free_kv" };
                        log.push(format!("{name} {}..{}", base + p.start as i32, base + p.end as i32));
                    }
                    continue;
                }
                Effect::FreeSwa { row, start, end } => {
                    let base = row as i32 * self.cols;
                    format!("free_swa {}..{}", base + start as i32, base + end as i32)
                }
                Effect::FreeRow { row } => format!("free_row {row}"),
                Effect::DecLockRef { node, receipt } => format!("dec_lock_ref {node} {receipt}"),
                Effect::FreeAux { aux } => format!("free_aux {aux}"),
            });
        }
        Ok(())
    }
    fn frees_swa(&self) -> std::result::Result<(), String> {
        Ok(())
    }
}

/// An external-mode cache over a fresh recorder, with the recorder's log.
struct Engine {
    cache: Cache,
    log: Arc<Mutex<Vec<String>>>,
}

impl std::ops::Deref for Engine {
    type Target = Cache;
    fn deref(&self) -> &Cache {
        &self.cache
    }
}

impl std::ops::DerefMut for Engine {
    fn deref_mut(&mut self) -> &mut Cache {
        &mut self.cache
    }
}

fn external(ps: u32, cols: i32, aligned_reuse: bool) -> Engine {
    let cfg = Config {
        page_size: ps,
        num_token_slots: 0,
        num_rows: 8,
        max_context_len: cols as u32,
        aligned_reuse,
        swa_num_token_slots: 0,
        tier: Default::default(),
    };
    let rec = Recorder { cols, ..Recorder::default() };
    let log = rec.log.clone();
    Engine { cache: Cache::new(cfg, super::cache::Backend::Engine(Box::new(rec))).unwrap(), log }
}

/// The recorded effects since the last call of `log`.
fn log(c: &mut Engine) -> Vec<String> {
    std::mem::take(&mut *c.log.lock().unwrap())
}

fn req(row: i32, committed: u32, allocated: u32) -> Req {
    Req { req_pool_idx: row, kv_committed_len: committed, kv_allocated_len: allocated, ..Req::default() }
}

#[test]
fn golden_1_trim_postcondition() {
    let mut c = external(1, 128, false);
    let mut r = Req { origin_input_len: 26, output_len: 14, swa_evicted_seqlen: 42, ..req(0, 40, 44) };
    c.trim_overshoot(&mut r, 12).unwrap();
    assert_eq!((r.kv_committed_len, r.kv_allocated_len, r.swa_evicted_seqlen, r.output_len), (38, 38, 38, 12));
    // [38, 42) lies below the cursor: its SWA slots are gone, the full side goes back alone.
    assert_eq!(log(&mut c), ["free_full 38..42", "free_kv 42..44"]);
    assert_eq!(c.trimmed_tokens, 6);
}

#[test]
fn golden_2_finish_with_over_allocated_tail() {
    let mut c = external(16, 128, false);
    let mut r = Req { origin_input_len: 17, ..req(0, 17, 40) };
    c.cache_finished_req(1, 0, &mut r, false).unwrap();
    assert_eq!(log(&mut c), ["free_kv 32..40"], "the partial page 16..31 stays");
    let (row, s) = c.slots().find(1, 0).unwrap();
    assert_eq!((row, s.committed, s.allocated, s.in_flight), (0, 17, 17, false));
    assert_eq!(r.req_pool_idx, -1);
}

#[test]
fn golden_3_first_turn_mid_abort() {
    let mut c = external(1, 128, false);
    let mut r = req(0, 0, 20);
    c.cache_finished_req(1, 0, &mut r, true).unwrap();
    assert_eq!(log(&mut c), ["free_kv 0..20", "free_row 0"]);
    assert!(c.slots().is_empty());
    assert_eq!(r, Req::default());
}

#[test]
fn golden_4_nth_turn_mid_abort() {
    let mut c = external(1, 128, false);
    let mut first = Req { origin_input_len: 50, ..req(0, 50, 50) };
    c.cache_finished_req(1, 0, &mut first, false).unwrap();
    let mut r = Req { origin_input_len: 55, ..Req::default() };
    c.match_prefix(1, 0, &mut r, 54, false).unwrap();
    log(&mut c);
    (r.kv_committed_len, r.kv_allocated_len) = (60, 65);
    c.cache_finished_req(1, 0, &mut r, true).unwrap();
    assert_eq!(log(&mut c), ["free_kv 0..65", "free_row 0"], "the running request's allocation");
    assert!(c.slots().is_empty());
}

#[test]
fn aborting_an_idle_slot_with_a_stale_req_frees_the_slots_record() {
    let mut c = external(1, 128, false);
    let mut first = Req { origin_input_len: 20, output_len: 10, finished_len: 5, ..req(0, 30, 30) };
    let stale = first;
    c.cache_finished_req(1, 0, &mut first, false).unwrap();
    assert_eq!(log(&mut c), ["free_kv 25..30"]);
    c.cache_finished_req(1, 0, &mut stale.clone(), true).unwrap();
    assert_eq!(log(&mut c), ["free_kv 0..25", "free_row 0"], "25..30 went back with the trim");
}

#[test]
fn golden_5_pre_abort() {
    let mut c = external(16, 128, false);
    let mut first = Req { origin_input_len: 48, cache_protected_len: 16, ..req(0, 48, 48) };
    c.cache_finished_req(1, 0, &mut first, false).unwrap();
    let before = *c.slots().find(1, 0).unwrap().1;
    let mut r = Req::default();
    let m = c.match_prefix(1, 0, &mut r, 64, true).unwrap();
    assert_eq!(m, Match { hit: 0, prefix_len: 0 });
    assert_eq!(*c.slots().find(1, 0).unwrap().1, before);
    assert_eq!(r, Req::default());
}

#[test]
fn golden_6_branches_release_in_creation_order() {
    let mut c = external(16, 256, false);
    let mut plan = Req { origin_input_len: 48, ..req(0, 48, 48) };
    let mut tool = Req { origin_input_len: 64, ..req(1, 64, 64) };
    c.cache_finished_req(7, 1, &mut plan, false).unwrap();
    c.cache_finished_req(7, 2, &mut tool, false).unwrap();
    log(&mut c);
    c.release_session(7).unwrap();
    assert_eq!(log(&mut c), ["free_kv 0..48", "free_row 0", "free_kv 256..320", "free_row 1"]);
}

#[test]
fn match_restores_and_frees_the_tail() {
    let mut c = external(4, 128, false);
    let mut r = Req {
        origin_input_len: 10,
        output_len: 6,
        finished_len: 4,
        lock_node: 9,
        lock_receipt: 3,
        aux_state: 5,
        ..req(2, 12, 16)
    };
    c.cache_finished_req(1, 0, &mut r, false).unwrap();
    assert_eq!(log(&mut c), Vec::<String>::new(), "14..16 lies in the page holding token 13");
    let mut next = Req { origin_input_len: 20, ..Req::default() };
    let m = c.match_prefix(1, 0, &mut next, 10, false).unwrap();
    assert_eq!(m, Match { hit: 1, prefix_len: 10 });
    assert_eq!(log(&mut c), ["free_kv 268..270"], "positions 12..14 go; 10..12 share a page with 9");
    assert_eq!((next.req_pool_idx, next.kv_committed_len, next.kv_allocated_len), (2, 10, 10));
    assert_eq!((next.lock_node, next.lock_receipt, next.aux_state), (9, 3, 5));
    assert!(c.slots().find(1, 0).unwrap().1.in_flight);
    assert_eq!(c.tail_freed_tokens, 4);
}

#[test]
fn swa_cursor_past_the_prefix_aligns_it() {
    let mut c = external(4, 128, false);
    let mut r = Req { origin_input_len: 10, output_len: 4, swa_evicted_seqlen: 12, ..req(0, 14, 14) };
    c.cache_finished_req(1, 0, &mut r, false).unwrap();
    let s = *c.slots().find(1, 0).unwrap().1;
    assert_eq!((s.allocated, s.committed, s.swa), (14, 14, 12));
    let mut next = Req::default();
    let m = c.match_prefix(1, 0, &mut next, 11, false).unwrap();
    assert_eq!(m.prefix_len, 8, "the cursor at 12 lies past 11: reuse whole pages only");
    assert_eq!((next.kv_committed_len, next.kv_allocated_len, next.swa_evicted_seqlen), (8, 8, 8));
    assert_eq!(log(&mut c), ["free_full 8..12", "free_kv 12..14"]);
}

#[test]
fn swa_past_target_floors_the_trim() {
    let mut c = external(4, 128, false);
    let mut r = Req { origin_input_len: 9, output_len: 6, finished_len: 1, swa_evicted_seqlen: 12, ..req(0, 14, 16) };
    c.trim_overshoot(&mut r, 1).unwrap();
    assert_eq!(
        (r.kv_allocated_len, r.kv_committed_len, r.swa_evicted_seqlen),
        (8, 8, 8),
        "target 10 floors to the page boundary 8"
    );
    assert_eq!(log(&mut c), ["free_full 8..12", "free_kv 12..16"]);
}

#[test]
fn aligned_reuse_releases_a_slot_with_nothing_whole_to_reuse() {
    let mut c = external(16, 128, true);
    save(&mut c, 1, 0, 3, 10);
    let mut next = Req::default();
    assert_eq!(c.match_prefix(1, 0, &mut next, 100, false).unwrap().hit, 0);
    assert_eq!(log(&mut c), ["free_kv 384..394", "free_row 3"]);
    assert!(c.slots().is_empty());
}

#[test]
fn in_flight_slots_refuse_release() {
    let mut c = external(1, 128, false);
    save(&mut c, 1, 0, 0, 5);
    let mut other = Req { origin_input_len: 3, ..req(1, 3, 3) };
    c.cache_finished_req(1, 1, &mut other, false).unwrap();
    matched(&mut c, 5);
    log(&mut c);
    assert!(matches!(c.release_session(1), Err(Error::State(_))));
    assert!(matches!(c.release_branch(1, 0), Err(Error::State(_))));
    assert_eq!(log(&mut c), Vec::<String>::new());
    assert_eq!(c.slots().len(), 2);
    c.release_branch(1, 1).unwrap();
    c.release_branch(9, 9).unwrap();
}

#[test]
fn retried_match_and_row_ownership() {
    let mut c = external(1, 128, false);
    save(&mut c, 1, 0, 0, 8);
    let mut next = matched(&mut c, 8);
    next.kv_allocated_len = 12;
    let again = c.match_prefix(1, 0, &mut next, 6, false).unwrap();
    assert_eq!(again.prefix_len, 6);
    assert_eq!(log(&mut c), ["free_kv 6..12"], "the retry also frees what the first try extended");
    let mut stranger = req(4, 0, 0);
    assert!(matches!(c.match_prefix(1, 0, &mut stranger, 6, false), Err(Error::State(_))));
    let mut thief = Req { origin_input_len: 2, ..req(0, 2, 2) };
    assert!(matches!(c.cache_finished_req(2, 0, &mut thief, false), Err(Error::State(_))));
}

#[test]
fn failing_prepare_changes_nothing() {
    let mut c = external(1, 128, false);
    let mut r = Req { origin_input_len: 8, output_len: 2, finished_len: 0, ..req(0, 8, 10) };
    c.cache.pool =
        super::cache::Backend::Engine(Box::new(Recorder { cols: 128, fail_prepare: true, ..Recorder::default() }));
    let before = r;
    assert!(matches!(c.cache_finished_req(1, 0, &mut r, false), Err(Error::Callback(_))));
    assert_eq!(r, before);
    assert!(c.slots().is_empty());
    assert_eq!(c.trimmed_tokens, 0);
}

#[test]
fn protected_prefix_is_never_freed() {
    let mut c = external(4, 128, false);
    let mut r = Req { cache_protected_len: 8, ..req(0, 10, 12) };
    assert!(matches!(c.free_tail(&mut r, 4), Err(Error::State(_))));
    assert!(matches!(c.trim_overshoot(&mut Req { origin_input_len: 4, ..r }, 0), Err(Error::InvalidArg(_))));
}

#[test]
fn session_held_skips_active_rows() {
    let mut c = external(4, 128, false);
    let mut a =
        Req { origin_input_len: 9, cache_protected_len: 4, swa_evicted_seqlen: 8, aux_state: 1, ..req(0, 9, 9) };
    let mut b = Req { origin_input_len: 4, aux_track: [-1, 7], ..req(1, 4, 4) };
    c.cache_finished_req(1, 0, &mut a, false).unwrap();
    c.cache_finished_req(2, 0, &mut b, false).unwrap();
    let all = c.session_held(&[]).unwrap();
    let held = Held { full_tokens: 8 + 4, swa_tokens: 4 + 4, rows: 2, aux_states: 1, sessions: 2, aux_handles: 2 };
    assert_eq!(all, held, "b's track entry counts; its empty entry and its -1 aux_state do not");
    let some = c.session_held(&[1, 1, 7]).unwrap();
    assert_eq!(some, Held { full_tokens: 8, swa_tokens: 4, rows: 1, aux_states: 1, sessions: 2, aux_handles: 1 });
}

// ---- recurrent-state handles ----

/// A turn holding a pool slot and both track entries.
fn mamba_turn(row: i32, aux: i64, track: [i64; 2]) -> Req {
    Req { origin_input_len: 8, aux_state: aux, aux_track: track, ..req(row, 8, 8) }
}

#[test]
fn recurrent_handles_are_kept_restored_and_freed_in_order() {
    let mut c = external(4, 128, false);
    let mut r = mamba_turn(0, 10, [11, 12]);
    c.cache_finished_req(1, 0, &mut r, false).unwrap();
    assert_eq!((r.aux_state, r.aux_track), (-1, [-1, -1]), "a finished req holds nothing");
    assert_eq!(log(&mut c), Vec::<String>::new(), "a finish frees no handle");
    let mut next = Req { origin_input_len: 12, ..Req::default() };
    c.match_prefix(1, 0, &mut next, 8, false).unwrap();
    assert_eq!((next.aux_state, next.aux_track), (10, [11, 12]));
    // The engine's ping-pong step frees entry 0 itself and leaves it empty.
    next.aux_track = [-1, 12];
    c.cache_finished_req(1, 0, &mut next, false).unwrap();
    assert_eq!(c.session_held(&[]).unwrap().aux_handles, 2);
    c.release_session(1).unwrap();
    assert_eq!(log(&mut c), ["free_kv 0..8", "free_row 0", "free_aux 10", "free_aux 12"], "the sentinel is skipped");
}

#[test]
fn recurrent_handles_without_a_pool_slot_are_still_freed() {
    let mut c = external(1, 64, false);
    let mut r = mamba_turn(3, -1, [-1, 21]);
    c.cache_finished_req(1, 0, &mut r, false).unwrap();
    c.release_branch(1, 0).unwrap();
    assert_eq!(log(&mut c), ["free_kv 192..200", "free_row 3", "free_aux 21"]);
}

#[test]
fn an_in_flight_abort_frees_the_reqs_handles() {
    let mut c = external(4, 128, false);
    let mut r = mamba_turn(0, 10, [11, -1]);
    c.cache_finished_req(1, 0, &mut r, false).unwrap();
    let mut next = Req { origin_input_len: 12, ..Req::default() };
    c.match_prefix(1, 0, &mut next, 8, false).unwrap();
    // Replaced mid-turn: 11 became the engine's to free, 13 and 14 are the running request's.
    next.aux_track = [13, 14];
    c.cache_finished_req(1, 0, &mut next, true).unwrap();
    assert_eq!(log(&mut c), ["free_kv 0..8", "free_row 0", "free_aux 10", "free_aux 13", "free_aux 14"]);
    assert_eq!((next.aux_state, next.aux_track), (-1, [-1, -1]));
    assert!(c.slots().is_empty());
}

#[test]
fn an_idle_abort_frees_the_slots_handles() {
    let mut c = external(4, 128, false);
    let mut r = mamba_turn(0, 10, [11, 12]);
    c.cache_finished_req(1, 0, &mut r, false).unwrap();
    let mut stale = Req { req_pool_idx: 0, aux_track: [99, 98], ..Req::default() };
    c.cache_finished_req(1, 0, &mut stale, true).unwrap();
    assert_eq!(log(&mut c), ["free_kv 0..8", "free_row 0", "free_aux 10", "free_aux 11", "free_aux 12"]);
}

#[test]
fn an_aligned_reuse_miss_frees_the_slots_handles() {
    let mut c = external(4, 128, true);
    let mut r = mamba_turn(0, 10, [-1, 12]);
    c.cache_finished_req(1, 0, &mut r, false).unwrap();
    let mut next = Req { aux_track: [7, 8], ..Req::default() };
    let m = c.match_prefix(1, 0, &mut next, 3, false).unwrap();
    assert_eq!(m.hit, 0, "3 tokens make no whole page");
    assert_eq!(log(&mut c), ["free_kv 0..8", "free_row 0", "free_aux 10", "free_aux 12"]);
    assert_eq!(next.aux_track, [7, 8], "a miss leaves the req's own handles alone");
}

#[test]
fn a_retried_match_restores_the_slots_handles() {
    let mut c = external(4, 128, false);
    let mut r = mamba_turn(0, 10, [11, 12]);
    c.cache_finished_req(1, 0, &mut r, false).unwrap();
    let mut next = Req { origin_input_len: 12, ..Req::default() };
    c.match_prefix(1, 0, &mut next, 8, false).unwrap();
    next.aux_track = [11, 15];
    c.match_prefix(1, 0, &mut next, 8, false).unwrap();
    assert_eq!(next.aux_track, [11, 12], "the slot's value comes back over a replacement");
}

// ---- hybrid (full + sliding-window) pools: golden numbers from sglang 0.5.23's own
// free_kv_row_segments, free_swa_out_of_window_slots, swa_dead_lo and kv_private_swa_tokens,
// run on the same inputs ----

/// protected 4, floor 13 (dead_lo 16 at page 4), cursor 24, 30 tokens allocated.
fn hybrid_req() -> Req {
    Req { cache_protected_len: 4, swa_evict_floor: 13, swa_evicted_seqlen: 24, origin_input_len: 30, ..req(0, 30, 30) }
}

#[test]
fn hybrid_trim_frees_the_window_passed_part_full_side_only() {
    let mut c = external(4, 128, false);
    let mut r = Req { origin_input_len: 20, output_len: 10, ..hybrid_req() };
    c.trim_overshoot(&mut r, 0).unwrap();
    assert_eq!(log(&mut c), ["free_full 20..24", "free_kv 24..30"]);
    assert_eq!(
        (r.kv_allocated_len, r.kv_committed_len, r.swa_evicted_seqlen, r.swa_evict_floor),
        (20, 20, 20, 13),
        "the floor is never clamped"
    );
}

#[test]
fn hybrid_free_tail_below_the_cursor_floors_to_a_page() {
    // A tail free inside a page the window passed: its boundary floors to a page, as a trim's,
    // so the clamped cursor stays page-aligned and the row's later frees can still split there.
    let mut c = external(4, 128, false);
    let mut r = hybrid_req();
    c.free_tail(&mut r, 21).unwrap();
    assert_eq!((r.kv_allocated_len, r.kv_committed_len, r.swa_evicted_seqlen, r.swa_evict_floor), (20, 20, 20, 13));
    assert_eq!(log(&mut c), ["free_full 20..24", "free_kv 24..30"]);
    // Below the cursor's page nothing changes: the boundary stays where it is.
    let mut r = Req { req_pool_idx: 1, swa_evicted_seqlen: 8, swa_evict_floor: 0, ..hybrid_req() };
    c.free_tail(&mut r, 9).unwrap();
    assert_eq!((r.kv_allocated_len, r.swa_evicted_seqlen), (9, 8));
}

#[test]
fn hybrid_free_aligned_keeps_no_part_of_a_page_the_window_passed_external() {
    let mut c = external(4, 128, false);
    let mut r = hybrid_req();
    c.cache_finished_req(1, 0, &mut r, false).unwrap();
    let mut next = Req { origin_input_len: 40, ..Req::default() };
    c.match_prefix(1, 0, &mut next, 30, false).unwrap();
    log(&mut c);
    // The slot's window freed [16, 24): a cut at 21 would keep positions 21..24 of that page.
    let e = c.free_aligned(0, 21, 30).unwrap_err();
    assert!(matches!(&e, Error::InvalidArg(m) if m.contains("free from a page boundary, 20")), "{e}");
    assert!(log(&mut c).is_empty());
    c.free_aligned(0, 25, 30).unwrap();
    assert_eq!(log(&mut c), ["free_kv 28..30"], "past the window's range a cut keeps its partial page");
    c.free_aligned(0, 20, 25).unwrap();
    assert_eq!(log(&mut c), ["free_full 20..24", "free_kv 24..25"]);
}

#[test]
fn hybrid_release_and_held() {
    let mut c = external(4, 128, false);
    let mut r = hybrid_req();
    c.cache_finished_req(1, 0, &mut r, false).unwrap();
    assert_eq!(log(&mut c), Vec::<String>::new());
    let s = *c.slots().find(1, 0).unwrap().1;
    assert_eq!((s.swa, s.swa_floor), (24, 13));
    // ceil_align(30, 4) - 4 = 28; minus the window's [16, 24): 20 (sglang: 20).
    assert_eq!(
        c.session_held(&[]).unwrap(),
        Held { full_tokens: 28, swa_tokens: 20, rows: 1, aux_states: 0, sessions: 1, aux_handles: 0 }
    );
    c.release_session(1).unwrap();
    assert_eq!(log(&mut c), ["free_full 16..24", "free_kv 4..16", "free_kv 24..30", "free_row 0"]);
}

#[test]
fn hybrid_held_without_a_floor_is_the_old_formula() {
    let mut c = external(4, 128, false);
    c.cache_finished_req(1, 0, &mut Req { swa_evict_floor: 0, ..hybrid_req() }, false).unwrap();
    // sglang: 8 = ceil_align(30) - max(protected, swa).
    assert_eq!(c.session_held(&[]).unwrap().swa_tokens, 8);
}

#[test]
fn hybrid_match_restores_the_floor_and_clamps_the_cursor() {
    let mut c = external(4, 128, false);
    c.cache_finished_req(1, 0, &mut hybrid_req(), false).unwrap();
    let mut next = Req { origin_input_len: 40, ..Req::default() };
    let m = c.match_prefix(1, 0, &mut next, 22, false).unwrap();
    // The cursor (24) lies past 22: the prefix floors to a page, 20.
    assert_eq!(m.prefix_len, 20);
    assert_eq!((next.swa_evicted_seqlen, next.swa_evict_floor, next.kv_allocated_len), (20, 13, 20));
    assert_eq!(log(&mut c), ["free_full 20..24", "free_kv 24..30"]);
}

fn window(size: u32) -> Window {
    Window { size, eviction_interval: 1, prefix_sharing: true, retain_floor: None }
}

#[test]
fn swa_evict_golden() {
    // (req, pre_len, window) -> (SWA frees, cursor), each from sglang on the same input.
    let fresh = Req { cache_protected_len: 4, swa_evict_floor: 13, swa_evicted_seqlen: 0, ..req(0, 40, 40) };
    let cases: [(Req, u32, Window, &[&str], u32); 6] = [
        (fresh, 40, window(8), &["free_swa 16..32"], 32),
        (fresh, 40, Window { prefix_sharing: false, ..window(6) }, &["free_swa 16..32"], 32),
        (fresh, 40, Window { retain_floor: Some(21), ..window(6) }, &["free_swa 16..20"], 20),
        (Req { swa_evicted_seqlen: 16, ..fresh }, 40, Window { eviction_interval: 17, ..window(8) }, &[], 16),
        (fresh, 22, window(5), &[], 16),
        (
            Req { req_pool_idx: 1, cache_protected_len: 0, swa_evict_floor: 0, ..fresh },
            40,
            Window { prefix_sharing: false, ..window(8) },
            &["free_swa 128..160"],
            32,
        ),
    ];
    for (mut r, pre_len, w, frees, cursor) in cases {
        let mut c = external(if r.req_pool_idx == 1 { 1 } else { 4 }, 128, false);
        let before = r;
        let freed = c.swa_evict(&mut r, pre_len, &w).unwrap();
        assert_eq!(log(&mut c), frees, "{before:?} {pre_len} {w:?}");
        assert_eq!(r.swa_evicted_seqlen, cursor, "{before:?} {pre_len} {w:?}");
        assert_eq!(
            freed,
            cursor.saturating_sub(before.swa_evicted_seqlen.max(before.swa_dead_lo(c.config().page_size)))
        );
    }
}

#[test]
fn swa_evict_page_one_keeps_the_window() {
    let mut c = external(1, 128, false);
    let mut r = req(0, 40, 40);
    assert_eq!(c.swa_evict(&mut r, 40, &window(8)).unwrap(), 32);
    assert_eq!(log(&mut c), ["free_swa 0..32"]);
}

#[test]
fn swa_evict_refusals_change_nothing() {
    let mut c = external(4, 128, false);
    let r0 = Req { cache_protected_len: 4, swa_evict_floor: 13, ..req(0, 40, 40) };
    let mut r = r0;
    assert!(matches!(c.swa_evict(&mut r, 40, &window(0)), Err(Error::InvalidArg(_))));
    assert!(matches!(c.swa_evict(&mut r, 41, &window(8)), Err(Error::InvalidArg(_))));
    assert!(matches!(c.swa_evict(&mut Req { swa_evicted_seqlen: 41, ..r }, 40, &window(8)), Err(Error::InvalidArg(_))));
    assert!(matches!(c.swa_evict(&mut Req { swa_evict_floor: 129, ..r }, 40, &window(8)), Err(Error::InvalidArg(_))));
    let unaligned = Req { swa_evicted_seqlen: 18, ..r0 };
    let mut q = unaligned;
    assert!(
        matches!(c.swa_evict(&mut q, 40, &window(8)), Err(Error::InvalidArg(m)) if m.contains("18 is not a multiple"))
    );
    assert_eq!(q, unaligned);
    assert_eq!(r, r0);
    c.cache_finished_req(1, 0, &mut Req { origin_input_len: 40, ..r }, false).unwrap();
    assert!(matches!(c.swa_evict(&mut r, 40, &window(8)), Err(Error::State(_))), "an idle slot's row");
    assert_eq!(r, r0);
    assert!(log(&mut c).is_empty());
    let mut none = Req::default();
    assert_eq!(c.swa_evict(&mut none, 0, &window(8)).unwrap(), 0, "no row: nothing to do");
    let mut owned = Cache::new_owned(Config { num_token_slots: 64, ..*c.config() }).unwrap();
    assert!(matches!(owned.swa_evict(&mut Req::default(), 0, &window(8)), Err(Error::Unsupported(_))));
}

#[test]
fn swa_evict_moves_a_running_slot_and_its_abort_splits_there() {
    let mut c = external(4, 128, false);
    c.cache_finished_req(
        1,
        0,
        &mut Req { cache_protected_len: 4, swa_evict_floor: 13, origin_input_len: 20, ..req(0, 20, 20) },
        false,
    )
    .unwrap();
    let mut r = Req { origin_input_len: 40, ..Req::default() };
    c.match_prefix(1, 0, &mut r, 39, false).unwrap();
    r.kv_allocated_len = 40;
    r.kv_committed_len = 40;
    assert_eq!(c.swa_evict(&mut r, 40, &window(8)).unwrap(), 16);
    assert_eq!(c.slots().find(1, 0).unwrap().1.swa, 32, "the running slot follows the cursor");
    // Listed as idle by mistake, the running slot (20 tokens recorded at the hit) counts no
    // SWA tokens past the window's cursor, and nothing underflows.
    let held = c.session_held(&[]).unwrap();
    assert_eq!((held.full_tokens, held.swa_tokens), (16, 0));
    log(&mut c);
    // A floor lifted over what the window freed would free [16, 32)'s SWA slots again.
    let lifted = Req { swa_evict_floor: 40, ..r };
    let lifts = |e: Result<()>| matches!(e, Err(Error::InvalidArg(m)) if m.contains("lifts swa_dead_lo from 16"));
    for mut q in [lifted, Req { swa_evict_floor: 17, ..r }] {
        let before = q;
        assert!(lifts(c.cache_finished_req(1, 0, &mut q, true)));
        assert!(lifts(c.cache_finished_req(1, 0, &mut q, false)));
        assert!(lifts(c.swa_evict(&mut q, 40, &window(8)).map(|_| ())));
        assert!(lifts(c.free_tail(&mut q, 36)));
        assert!(lifts(c.trim_overshoot(&mut q, 0)));
        assert_eq!(q, before);
    }
    assert!(log(&mut c).is_empty());
    // A floor within the same page leaves swa_dead_lo where it was.
    assert!(c.free_tail(&mut Req { swa_evict_floor: 16, ..r }, 40).is_ok());
    c.cache_finished_req(1, 0, &mut r, true).unwrap();
    assert_eq!(log(&mut c), ["free_full 16..32", "free_kv 4..16", "free_kv 32..40", "free_row 0"]);
}

#[test]
fn split_matches_free_kv_row_segments() {
    use super::pool::Segment as S;
    let seg = |start, end, pools| S { start, end, pools };
    assert_eq!(split(20, 30, 16, 24).as_slice(), [seg(20, 24, Pools::Full), seg(24, 30, Pools::Both)]);
    assert_eq!(
        split(4, 30, 16, 24).as_slice(),
        [seg(16, 24, Pools::Full), seg(4, 16, Pools::Both), seg(24, 30, Pools::Both)]
    );
    assert_eq!(split(4, 30, 16, 16).as_slice(), [seg(4, 30, Pools::Both)], "cursor at dead_lo: nothing dead");
    assert_eq!(split(26, 30, 16, 24).as_slice(), [seg(26, 30, Pools::Both)]);
    assert_eq!(split(16, 24, 16, 24).as_slice(), [seg(16, 24, Pools::Full)]);
    assert!(split(5, 5, 0, 9).is_empty());
}

// ---- owned mode ----

fn owned(ps: u32, pages: u64) -> Cache {
    hybrid(ps, pages, 0)
}

/// A fresh row of `c` with `n` tokens allocated.
fn extended(c: &mut Cache, n: u32) -> Req {
    let mut r = Req::default();
    c.alloc_row(&mut r).unwrap();
    c.alloc_extend(&mut r, n, None).unwrap();
    r
}

/// A running request's row: `len` tokens mapped and committed, as a turn of `origin` prompt
/// tokens and `len - origin` outputs leaves it.
fn running_turn(c: &mut Cache, origin: u32, len: u32) -> Req {
    let mut r = extended(c, len);
    c.commit(&mut r, len).unwrap();
    (r.origin_input_len, r.output_len) = (origin, len - origin);
    r
}

fn indices(c: &Cache, r: &Req) -> Vec<i32> {
    let mut out = vec![0; r.kv_allocated_len as usize];
    c.row_indices(r.req_pool_idx as u32, 0, r.kv_allocated_len, false, &mut out).unwrap();
    out
}

fn clean(c: &Cache) {
    let rep = c.check().unwrap();
    assert_eq!(rep.violations, 0, "{}", rep.first_violation_text());
}

#[test]
fn extend_continues_inside_the_kept_partial_page() {
    let mut c = owned(4, 16);
    let mut r = extended(&mut c, 6);
    assert_eq!(indices(&c, &r), [4, 5, 6, 7, 8, 9]);
    c.commit(&mut r, 5).unwrap();
    r.origin_input_len = 5;
    r.output_len = 1;
    c.alloc_extend(&mut r, 6, None).unwrap();
    c.trim_overshoot(&mut r, 1).unwrap();
    assert_eq!(r.kv_allocated_len, 6);
    assert_eq!(c.stats().unwrap().used_pages, 2, "pages 1 and 2 stay: page 2 holds token 5");
    c.alloc_extend(&mut r, 3, None).unwrap();
    assert_eq!(indices(&c, &r), [4, 5, 6, 7, 8, 9, 10, 11, 12]);
    clean(&c);
}

#[test]
fn oom_changes_nothing_and_allocation_is_deterministic() {
    let run = || {
        let mut c = owned(2, 6);
        let (mut a, mut b) = (Req::default(), Req::default());
        c.alloc_row(&mut a).unwrap();
        c.alloc_row(&mut b).unwrap();
        c.alloc_extend(&mut a, 3, None).unwrap();
        let before = (b, c.stats().unwrap());
        assert!(matches!(c.alloc_extend(&mut b, 7, None), Err(Error::OutOfMemory(_))));
        assert_eq!((b, c.stats().unwrap()), before);
        c.alloc_extend(&mut b, 5, None).unwrap();
        c.free_req(&mut a).unwrap();
        c.alloc_row(&mut a).unwrap();
        c.alloc_extend(&mut a, 4, None).unwrap();
        clean(&c);
        (indices(&c, &a), indices(&c, &b))
    };
    assert_eq!(run(), run());
    assert_eq!(run().1, [6, 7, 8, 9, 10]);
}

#[test]
fn pool_pages_refuse_double_free_and_mapped_frees() {
    let mut c = owned(2, 8);
    let mut tree = [0i32; 4];
    c.pool_alloc(&mut tree).unwrap();
    assert_eq!(tree, [2, 3, 4, 5]);
    let mut r = Req::default();
    c.alloc_row(&mut r).unwrap();
    c.map_prefix(&mut r, &tree).unwrap();
    assert_eq!((r.kv_allocated_len, r.cache_protected_len), (4, 4));
    let mut refs = [9u32; 2];
    c.page_refs(&[2, 5], &mut refs).unwrap();
    assert_eq!(refs, [1, 1]);
    assert!(matches!(c.pool_free(&tree), Err(Error::State(_))));
    c.free_req(&mut r).unwrap();
    c.pool_free(&tree).unwrap();
    assert!(matches!(c.pool_free(&tree[..1]), Err(Error::State(_))), "double free");
    assert!(matches!(c.pool_free(&[0]), Err(Error::InvalidArg(_))), "page 0 is padding");
    assert_eq!(c.stats().unwrap().free_pages, 7);
    clean(&c);
}

#[test]
fn free_and_row_owned_pages_are_told_apart_by_the_free_stack() {
    // Neither kind carries a per-page word: refs, refusals and the audit ask the free stack.
    let mut c = owned(2, 8);
    let r = extended(&mut c, 4);
    let own = indices(&c, &r);
    let mut tree = [0i32; 2];
    c.pool_alloc(&mut tree).unwrap();
    let free = 2 * 7; // page 7: never handed out
    let mut refs = [9u32; 4];
    c.page_refs(&[own[0], own[3], tree[0], free], &mut refs).unwrap();
    assert_eq!(refs, [1, 1, 0, 0], "row-owned 1, engine-held its maps, free 0");
    let e = c.pool_free(&[tree[0], own[0]]).unwrap_err();
    assert!(matches!(&e, Error::State(m) if m.contains("is owned by a row")), "{e}");
    let e = c.pool_free(&[tree[0], free]).unwrap_err();
    assert!(matches!(&e, Error::State(m) if m.contains("already free (double free)")), "{e}");
    let mut s = Req::default();
    c.alloc_row(&mut s).unwrap();
    let e = c.map_prefix(&mut s, &own[..2]).unwrap_err();
    assert!(matches!(&e, Error::State(m) if m.contains("not engine-held (owned by a row)")), "{e}");
    let e = c.map_prefix(&mut s, &[free, free + 1]).unwrap_err();
    assert!(matches!(&e, Error::State(m) if m.contains("not engine-held (free)")), "{e}");
    assert_eq!(c.stats().unwrap().free_pages, 7 - 2 - 1, "nothing changed");
    clean(&c);
}

#[test]
fn the_audit_sees_every_full_page() {
    // A row with a 2-page prefix the engine holds and one page of its own, one engine page
    // no row maps, and 3 free pages; each break below must be reported.
    let corrupt = |f: &dyn Fn(&mut super::owned::OwnedPool, u32)| {
        let mut c = owned(4, 8);
        let mut r = extended(&mut c, 12);
        c.commit(&mut r, 12).unwrap();
        c.publish_prefix(&mut r, 8).unwrap();
        c.pool_alloc(&mut [0i32; 4]).unwrap();
        let rep = c.check().unwrap();
        assert_eq!((rep.pages_free, rep.pages_in_rows, rep.pages_engine_held), (3, 1, 3));
        clean(&c);
        f(c.pool.owned_mut().unwrap(), r.req_pool_idx as u32);
        let rep = c.check().unwrap();
        assert!(rep.violations > 0);
        rep.first_violation_text()
    };
    let m = corrupt(&|p, _| {
        p.pages.free_stack_mut().pop();
    });
    assert!(m.contains("(leaked)"), "{m}");
    let m = corrupt(&|p, _| {
        let top = p.pages.next_free().unwrap();
        p.pages.free_stack_mut().push(top)
    });
    assert!(m.contains("free list holds page"), "{m}");
    let m = corrupt(&|p, row| {
        let own = p.row_mut(row).pages[2];
        p.pages.set_held(own, 0)
    });
    assert!(m.contains("maps engine-held page"), "{m}");
    let m = corrupt(&|p, row| {
        let held = p.row_mut(row).pages[0];
        p.pages.set_held(held, 5)
    });
    assert!(m.contains("counts 5 maps, rows map it 1 times"), "{m}");
    let m = corrupt(&|p, row| {
        let free = p.pages.next_free().unwrap();
        p.row_mut(row).pages.edit(|v| v[2] = free)
    });
    assert!(m.contains("(leaked)") || m.contains("is mapped by 1 rows"), "{m}");
    let m = corrupt(&|p, row| {
        let wrong = p.row_mut(row).pages.last_page() + 1;
        p.row_mut(row).pages.break_last(wrong)
    });
    assert!(m.contains("as its last page, its list ends with"), "{m}");
    let m = corrupt(&|p, _| p.pages.free_stack_mut().push(0));
    assert!(m.contains("free list holds page 0"), "{m}");
}

#[test]
fn publish_hands_pages_to_the_tree() {
    let mut c = owned(2, 8);
    let mut r = extended(&mut c, 5);
    c.commit(&mut r, 5).unwrap();
    c.publish_prefix(&mut r, 4).unwrap();
    let prefix = indices(&c, &r)[..4].to_vec();
    let mut s = Req::default();
    c.alloc_row(&mut s).unwrap();
    c.map_prefix(&mut s, &prefix).unwrap();
    let mut refs = [0u32; 1];
    c.page_refs(&prefix[..1], &mut refs).unwrap();
    assert_eq!(refs, [2]);
    assert!(matches!(c.publish_prefix(&mut r, 2), Err(Error::State(_))));
    c.free_req(&mut r).unwrap();
    c.free_req(&mut s).unwrap();
    c.pool_free(&prefix).unwrap();
    assert_eq!(c.stats().unwrap().free_pages, 7);
    clean(&c);
}

#[test]
fn owned_session_turns_conserve_pages() {
    let mut c = owned(4, 32);
    let mut r = running_turn(&mut c, 9, 10);
    c.cache_finished_req(5, 0, &mut r, false).unwrap();
    assert!(matches!(
        c.alloc_extend(
            &mut Req { req_pool_idx: 0, kv_allocated_len: 10, kv_committed_len: 10, ..Req::default() },
            1,
            None
        ),
        Err(Error::State(_))
    ));
    let mut next = Req { origin_input_len: 14, ..Req::default() };
    let m = c.match_prefix(5, 0, &mut next, 13, false).unwrap();
    assert_eq!((m.hit, m.prefix_len, next.kv_allocated_len), (1, 10, 10));
    c.alloc_extend(&mut next, 8, None).unwrap();
    c.commit(&mut next, 4).unwrap();
    assert!(matches!(c.match_prefix(5, 0, &mut Req::default(), 13, false), Err(Error::State(_))));
    let again = c.match_prefix(5, 0, &mut next, 13, false).unwrap();
    assert_eq!(again.prefix_len, 10, "a retried match frees what the first try extended");
    assert_eq!((next.kv_allocated_len, next.kv_committed_len), (10, 10));
    clean(&c);
    next.origin_input_len = 10;
    c.cache_finished_req(5, 0, &mut next, false).unwrap();
    c.release_session(5).unwrap();
    let s = c.stats().unwrap();
    assert_eq!((s.free_pages, s.free_rows, s.sessions), (31, 4, 0));
    clean(&c);
}

#[test]
fn flashinfer_layout() {
    let mut c = owned(4, 16);
    let (mut a, mut b, mut e) = (Req::default(), Req::default(), Req::default());
    for r in [&mut a, &mut b, &mut e] {
        c.alloc_row(r).unwrap();
    }
    c.alloc_extend(&mut a, 6, None).unwrap();
    c.alloc_extend(&mut b, 4, None).unwrap();
    let rows = [a.req_pool_idx, e.req_pool_idx, b.req_pool_idx];
    assert_eq!(c.flashinfer_len(&rows, false).unwrap(), 3);
    let (mut indptr, mut idx, mut last) = ([0; 4], [0; 3], [0; 3]);
    c.flashinfer_fill(&rows, false, &mut indptr, &mut idx, &mut last);
    assert_eq!((indptr, idx, last), ([0, 2, 2, 3], [1, 2, 3], [2, 0, 4]));
}

#[test]
fn primitives_respect_the_session_that_holds_the_row() {
    let mut c = external(4, 128, false);
    let mut r = Req { origin_input_len: 12, cache_protected_len: 8, ..req(0, 12, 12) };
    let stale = r;
    c.cache_finished_req(1, 0, &mut r, false).unwrap();
    log(&mut c);
    assert!(matches!(c.free_aligned(0, 10, 12), Err(Error::State(_))), "the slot is idle");
    assert!(matches!(c.cache_finished_req(1, 0, &mut stale.clone(), false), Err(Error::State(_))), "stale req");
    let next = matched(&mut c, 12);
    assert!(matches!(c.free_aligned(0, 4, 12), Err(Error::State(_))), "below the protected prefix");
    assert!(matches!(c.free_aligned(0, 10, 11), Err(Error::State(_))), "short of the slot's end");
    let mut liar = Req { cache_protected_len: 0, ..next };
    assert!(matches!(c.free_tail(&mut liar, 4), Err(Error::State(_))), "the req claims no protected prefix");
    assert!(matches!(c.trim_overshoot(&mut Req { output_len: 4, ..liar }, 4), Err(Error::State(_))));
    let mut short = Req { origin_input_len: 4, cache_protected_len: 0, ..next };
    assert!(matches!(c.cache_finished_req(1, 0, &mut short, false), Err(Error::State(_))));
    let mut behind = Req { kv_allocated_len: 10, kv_committed_len: 10, origin_input_len: 10, ..next };
    assert!(matches!(c.cache_finished_req(1, 0, &mut behind, false), Err(Error::State(_))), "shorter than the slot");
    assert_eq!(log(&mut c), Vec::<String>::new());
    c.free_aligned(0, 10, 12).unwrap();
    assert_eq!(c.slots().find(1, 0).unwrap().1.allocated, 10, "the running slot mirrors the free");
    c.free_aligned(0, 10, 10).unwrap();
    assert_eq!(c.slots().find(1, 0).unwrap().1.allocated, 10, "end == target frees and changes nothing");
    assert!(matches!(c.free_aligned(0, 20, 10), Err(Error::InvalidArg(_))), "target > end");
    c.cache_finished_req(
        1,
        0,
        &mut Req { origin_input_len: 10, kv_allocated_len: 10, kv_committed_len: 10, ..next },
        false,
    )
    .unwrap();
    assert_eq!(c.session_held(&[]).unwrap().full_tokens, 4);
}

#[test]
fn a_running_slot_matches_only_its_own_request_again() {
    let mut c = external(1, 128, false);
    save(&mut c, 1, 0, 0, 8);
    let mut first = matched(&mut c, 8);
    let mut second = Req::default();
    assert!(matches!(c.match_prefix(1, 0, &mut second, 8, false), Err(Error::State(_))));
    assert_eq!(second, Req::default());
    assert_eq!(c.match_prefix(1, 0, &mut first, 8, false).unwrap().hit, 1);
}

#[test]
fn row_changes_keep_a_dense_copy_equal_to_the_rows() {
    let (ps, cols) = (4u32, 64u32);
    let mut c = owned(ps, 64);
    let mut reqs = vec![Req::default(); 4];
    c.alloc_row(&mut reqs[0]).unwrap();
    c.alloc_extend(&mut reqs[0], 9, None).unwrap();
    c.track_row_changes().unwrap();
    // a row that adopts the engine's pages maps them anew too
    let mut tree = [0i32; 8];
    c.pool_alloc(&mut tree).unwrap();
    c.alloc_row(&mut reqs[1]).unwrap();
    c.map_prefix(&mut reqs[1], &tree).unwrap();
    let mut dense = vec![-1i32; 4 * cols as usize];
    let mut seed = 7u64;
    for step in 0..400 {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let (i, n) = ((seed >> 33) as usize % 4, (seed >> 40) as u32 % 7);
        let r = &mut reqs[i];
        match (r.req_pool_idx, seed >> 60) {
            (-1, _) => c.alloc_row(r).unwrap(),
            (_, 0..=9) if r.kv_allocated_len + n <= cols => c.alloc_extend(r, n, None).unwrap(),
            (_, 10..=12) => {
                r.kv_committed_len = r.kv_allocated_len;
                c.free_tail(r, r.kv_allocated_len.saturating_sub(n)).unwrap();
            }
            _ => c.free_req(r).unwrap(),
        }
        if step % 3 == 0 {
            c.drain_row_changes(|row, start, idx| {
                let at = (row * cols + start) as usize;
                dense[at..at + idx.len()].copy_from_slice(idx);
                Ok(())
            })
            .unwrap();
            for r in reqs.iter().filter(|r| r.req_pool_idx >= 0) {
                let want = indices(&c, r);
                let at = (r.req_pool_idx as u32 * cols) as usize;
                assert_eq!(&dense[at..at + want.len()], &want[..], "row {} at step {step}", r.req_pool_idx);
            }
        }
    }
    let mut calls = 0;
    c.drain_row_changes(|_, _, _| {
        calls += 1;
        Ok(())
    })
    .unwrap();
    c.drain_row_changes(|_, _, _| panic!("every change was handed over once")).unwrap();
    assert!(calls <= 4);
}

#[test]
fn a_failed_upload_is_owed_again() {
    let mut c = owned(4, 16);
    c.track_row_changes().unwrap();
    let r = extended(&mut c, 6);
    assert!(c.drain_row_changes(|_, _, _| Err(Error::Cuda("copy failed".into()))).is_err());
    let mut got = Vec::new();
    c.drain_row_changes(|row, start, idx| {
        got.push((row, start, idx.to_vec()));
        Ok(())
    })
    .unwrap();
    assert_eq!(got, [(r.req_pool_idx as u32, 0, indices(&c, &r))]);
}

/// Owned mode: a copy of a freed req, its row handed to another request since, is refused
/// as stale and the live request's row is untouched.
#[test]
fn a_stale_copy_cannot_free_a_reused_row() {
    let mut c = owned(4, 32);
    let mut a = Req::default();
    c.alloc_row(&mut a).unwrap();
    c.alloc_extend(&mut a, 8, None).unwrap();
    let stale = a;
    c.free_req(&mut a).unwrap();
    assert_eq!(a.row_generation, 0, "a req holding nothing is not stamped");
    let mut b = Req::default();
    c.alloc_row(&mut b).unwrap();
    assert_eq!(b.req_pool_idx, stale.req_pool_idx, "the row is handed out again");
    assert_ne!(b.row_generation, stale.row_generation);
    c.alloc_extend(&mut b, 8, None).unwrap();
    let mut s = stale;
    let err = c.free_req(&mut s).unwrap_err();
    assert!(matches!(err, Error::State(_)), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("stale copy") && text.contains(&format!("row_generation is {}", stale.row_generation)),
        "{text}"
    );
    assert!(text.contains(&format!("generation {}", b.row_generation)), "{text}");
    assert_eq!(s, stale, "a refused call changes nothing");
    assert_eq!(c.pool().mapped_len(b.req_pool_idx as u32), Some(8));
    // Precedence: a row no longer in use is NOT_FOUND before the stale check.
    c.free_req(&mut b).unwrap();
    assert!(matches!(c.free_req(&mut s), Err(Error::NotFound(_))));
    assert_eq!(c.check().unwrap().violations, 0);
}

/// External mode: a match hit stamps the slot's generation; once the slot is released (the
/// row handed back), a stale copy cannot make another request's row that session's slot.
#[test]
fn external_stale_copy_after_release_is_refused() {
    let mut c = external(4, 64, false);
    let mut first = Req { origin_input_len: 8, output_len: 0, ..req(2, 8, 8) };
    c.cache_finished_req(1, 0, &mut first, false).unwrap();
    let mut turn = Req { origin_input_len: 10, ..Req::default() };
    assert_eq!(c.match_prefix(1, 0, &mut turn, 8, false).unwrap().hit, 1);
    assert_eq!(turn.req_pool_idx, 2);
    assert_ne!(turn.row_generation, 0, "a hit stamps the row's generation");
    turn.kv_allocated_len = 10;
    turn.kv_committed_len = 10;
    let stale = Req { finished_len: -1, ..turn };
    c.cache_finished_req(1, 0, &mut turn, false).unwrap();
    c.release_session(1).unwrap();
    log(&mut c);
    // The engine reuses row 2 for another request; the stale copy comes back.
    let mut s = stale;
    let err = c.cache_finished_req(1, 0, &mut s, false).unwrap_err();
    assert!(matches!(err, Error::State(_)), "{err}");
    assert_eq!(s, stale);
    assert!(c.slots().is_empty(), "no slot was made of the other request's row");
    assert!(log(&mut c).is_empty());
    // An unstamped req (the engine's own) is not checked.
    let mut fresh = req(2, 4, 4);
    c.cache_finished_req(2, 0, &mut fresh, false).unwrap();
    assert_eq!(c.slots().len(), 1);
}

/// A trim to fewer tokens than the req's finished_len lowers finished_len with output_len, so
/// the req stays valid for the finish that follows.
#[test]
fn a_trim_below_finished_len_keeps_the_req_valid() {
    let mut c = owned(2, 32);
    let mut r = extended(&mut c, 10);
    c.commit(&mut r, 10).unwrap();
    (r.origin_input_len, r.output_len, r.finished_len) = (6, 4, 3);
    c.trim_overshoot(&mut r, 1).unwrap();
    assert_eq!((r.output_len, r.finished_len, r.kv_allocated_len), (1, 1, 7));
    c.commit(&mut r, 0).unwrap();
    c.free_req(&mut r).unwrap();
    assert_eq!(c.check().unwrap().violations, 0);
}

// ---- handing back a matched request that never ran, and the scheduler queries ----

/// Saves a first turn of `len` tokens on `row` (external mode, no callback).
fn save(c: &mut Engine, session: u64, branch: u64, row: i32, len: u32) {
    let mut r = Req { origin_input_len: len, ..req(row, len, len) };
    c.cache_finished_req(session, branch, &mut r, false).unwrap();
}

/// A fresh req matched against session 1 branch 0 for `len` tokens.
fn matched(c: &mut Engine, len: u32) -> Req {
    let mut r = Req::default();
    c.match_prefix(1, 0, &mut r, len, false).unwrap();
    r
}

#[test]
fn hand_back_returns_the_slot_idle_as_the_match_left_it() {
    let mut c = external(4, 128, false);
    let mut first = Req { origin_input_len: 20, ..req(3, 20, 22) };
    c.cache_finished_req(1, 0, &mut first, false).unwrap();
    log(&mut c);
    let mut turn = Req { origin_input_len: 30, ..Req::default() };
    let m = c.match_prefix(1, 0, &mut turn, 29, false).unwrap();
    assert_eq!(m, Match { hit: 1, prefix_len: 20 });
    log(&mut c);
    let after_match = *c.slots().find(1, 0).unwrap().1;
    c.hand_back(1, 0, &mut turn).unwrap();
    assert!(log(&mut c).is_empty(), "nothing is freed");
    assert_eq!(turn, Req { origin_input_len: 30, ..Req::default() }, "the req holds nothing");
    let s = *c.slots().find(1, 0).unwrap().1;
    assert_eq!(s, Slot { in_flight: false, ..after_match });
    assert_eq!(c.session_held(&[]).unwrap().rows, 1, "idle: counted again");
    // The slot matches again, and a released slot frees what the match left.
    let mut again = Req { origin_input_len: 30, ..Req::default() };
    assert_eq!(c.match_prefix(1, 0, &mut again, 29, false).unwrap().prefix_len, 20);
    c.hand_back(1, 0, &mut again).unwrap();
    c.release_session(1).unwrap();
    assert_eq!(log(&mut c), ["free_kv 384..404", "free_row 3"]);
}

#[test]
fn hand_back_refuses_what_is_not_a_matched_unrun_request() {
    let mut c = external(4, 128, false);
    save(&mut c, 1, 0, 2, 16);
    let state = |e: Error| matches!(e, Error::State(_));
    // A miss: no row.
    let mut miss = Req::default();
    let e = c.hand_back(1, 0, &mut miss).unwrap_err();
    assert!(matches!(&e, Error::InvalidArg(m) if m.contains("req_pool_idx -1")), "{e}");
    // A first turn: a row but no slot.
    let mut first = req(5, 4, 4);
    let e = c.hand_back(9, 0, &mut first).unwrap_err();
    assert!(e.to_string().contains("session 9 branch 0 has no slot"), "{e}");
    // The idle slot's row: a stale copy.
    let mut stale = req(2, 16, 16);
    assert!(state(c.hand_back(1, 0, &mut stale).unwrap_err()));
    // A request that ran past what the match restored.
    let mut turn = Req { origin_input_len: 20, ..Req::default() };
    c.match_prefix(1, 0, &mut turn, 19, false).unwrap();
    let before = (turn, *c.slots().find(1, 0).unwrap().1);
    let mut ran = Req { kv_allocated_len: 20, ..turn };
    let e = c.hand_back(1, 0, &mut ran).unwrap_err();
    assert!(e.to_string().contains("kv_allocated_len 20 != the 16 the match restored into row 2"), "{e}");
    assert_eq!(ran, Req { kv_allocated_len: 20, ..turn }, "a refused call changes nothing");
    // Another session's key, a stale generation.
    assert!(state(c.hand_back(1, 7, &mut turn.clone()).unwrap_err()));
    let mut old = Req { row_generation: turn.row_generation + 1, ..turn };
    assert!(c.hand_back(1, 0, &mut old).unwrap_err().to_string().contains("stale copy"));
    assert_eq!((turn, *c.slots().find(1, 0).unwrap().1), before);
    assert!(log(&mut c).is_empty());
    c.hand_back(1, 0, &mut turn).unwrap();
    assert!(state(c.hand_back(1, 0, &mut Req { ..before.0 }).unwrap_err()), "handed back twice");
}

#[test]
fn owned_hand_back_keeps_the_pages_and_refuses_an_extended_row() {
    let mut c = owned(4, 32);
    let mut r = running_turn(&mut c, 10, 10);
    c.cache_finished_req(1, 0, &mut r, false).unwrap();
    let free = c.stats().unwrap().free_pages;
    let mut turn = Req { origin_input_len: 14, ..Req::default() };
    c.match_prefix(1, 0, &mut turn, 13, false).unwrap();
    c.alloc_extend(&mut turn, 4, None).unwrap();
    let e = c.hand_back(1, 0, &mut turn).unwrap_err();
    assert!(matches!(e, Error::State(_)), "{e}");
    c.free_tail(&mut turn, 10).unwrap();
    c.hand_back(1, 0, &mut turn).unwrap();
    assert_eq!(turn.req_pool_idx, -1);
    assert_eq!(c.stats().unwrap().free_pages, free, "the row keeps its pages");
    assert_eq!(c.pool().mapped_len(0), Some(10));
    clean(&c);
}

#[test]
fn idle_slots_in_least_recently_finished_order() {
    let mut c = external(4, 128, false);
    save(&mut c, 1, 0, 0, 8);
    save(&mut c, 2, 0, 1, 8);
    save(&mut c, 3, 5, 2, 8);
    let mut out = [(0, 0); 4];
    assert_eq!(c.idle_lru(&mut out), 3);
    assert_eq!(out[..3], [(1, 0), (2, 0), (3, 5)]);
    // Session 1's next turn runs and finishes: it becomes the most recent.
    let mut t = Req { origin_input_len: 10, output_len: 2, ..Req::default() };
    c.match_prefix(1, 0, &mut t, 9, false).unwrap();
    assert_eq!(c.idle_lru(&mut out), 2, "an in-flight slot is not idle");
    assert_eq!(out[..2], [(2, 0), (3, 5)]);
    t.kv_allocated_len = 12;
    t.kv_committed_len = 12;
    c.cache_finished_req(1, 0, &mut t, false).unwrap();
    // Session 2 matches and is handed back: its place is unchanged.
    let mut h = Req { origin_input_len: 10, ..Req::default() };
    c.match_prefix(2, 0, &mut h, 9, false).unwrap();
    c.hand_back(2, 0, &mut h).unwrap();
    let mut two = [(0, 0); 2];
    assert_eq!(c.idle_lru(&mut two), 3, "the count is every idle slot");
    assert_eq!(two, [(2, 0), (3, 5)]);
}

#[test]
fn usage_per_session_and_branch() {
    let mut c = external(4, 128, false);
    let mut a = Req { origin_input_len: 10, cache_protected_len: 4, ..req(0, 10, 10) };
    c.cache_finished_req(1, 0, &mut a, false).unwrap();
    save(&mut c, 1, 1, 1, 5);
    save(&mut c, 2, 0, 2, 7);
    let u = c.usage(1, None);
    assert_eq!(
        u,
        Usage {
            slots: 2,
            in_flight: 0,
            allocated_tokens: 15,
            committed_tokens: 15,
            protected_tokens: 4,
            pages: 3 + 2,
            freeable_pages: 2 + 2
        }
    );
    assert_eq!(c.usage(1, Some(1)).pages, 2);
    assert_eq!(c.usage(1, Some(9)), Usage::default());
    assert_eq!(c.usage(3, None), Usage::default());
    let mut t = Req { origin_input_len: 12, ..Req::default() };
    c.match_prefix(2, 0, &mut t, 11, false).unwrap();
    assert_eq!(c.usage(2, None).in_flight, 1);
}

#[test]
fn admission_pages_mirror_match_and_extend() {
    let mut c = owned(4, 64);
    let mut r = extended(&mut c, 14);
    c.commit(&mut r, 10).unwrap();
    (r.origin_input_len, r.output_len) = (10, 0);
    c.cache_finished_req(1, 0, &mut r, false).unwrap();
    // The slot: committed 10, allocated 10 (the trim freed page 3, kept the page of 8..11).
    let a = c.admission(1, 0, 9, 30).unwrap();
    assert_eq!(a, Admission { hit: 1, prefix_len: 9, pages_needed: 8 - 3, pages_freed: 0 });
    let miss = c.admission(2, 0, 9, 30).unwrap();
    assert_eq!(miss, Admission { hit: 0, prefix_len: 0, pages_needed: 8, pages_freed: 0 });
    assert!(matches!(c.admission(1, 0, 31, 30), Err(Error::InvalidArg(_))));
    assert!(matches!(c.admission(1, 0, 9, 2000), Err(Error::InvalidArg(_))));
    // What the query said is what the calls take.
    let free = c.stats().unwrap().free_pages;
    let mut t = Req { origin_input_len: 30, ..Req::default() };
    assert_eq!(c.match_prefix(1, 0, &mut t, 9, false).unwrap().prefix_len, 9);
    c.alloc_extend(&mut t, 30 - 9, None).unwrap();
    assert_eq!(free - c.stats().unwrap().free_pages, a.pages_needed - a.pages_freed);
    assert!(matches!(c.admission(1, 0, 9, 30), Err(Error::State(_))), "in flight");
    let e = external(4, 64, false);
    assert!(matches!(e.admission(1, 0, 0, 4), Err(Error::Unsupported(_))));
}

#[test]
fn admission_counts_what_a_match_frees() {
    let mut c = owned(4, 64);
    let mut r = running_turn(&mut c, 20, 20);
    c.cache_finished_req(1, 0, &mut r, false).unwrap();
    // Reusing 6 of 20 tokens: the match keeps pages 0..2 (positions 0..7) and frees 3.
    let a = c.admission(1, 0, 6, 12).unwrap();
    assert_eq!(a, Admission { hit: 1, prefix_len: 6, pages_needed: 1, pages_freed: 3 });
    let free = c.stats().unwrap().free_pages;
    let mut t = Req { origin_input_len: 12, ..Req::default() };
    c.match_prefix(1, 0, &mut t, 6, false).unwrap();
    assert_eq!(c.stats().unwrap().free_pages - free, 3);
}

#[test]
fn external_stats_report_what_libskv_knows() {
    let mut c = external(4, 128, false);
    save(&mut c, 1, 0, 0, 8);
    let mut r = Req { origin_input_len: 4, output_len: 4, ..req(1, 8, 12) };
    c.trim_overshoot(&mut r, 2).unwrap();
    let s = c.stats().unwrap();
    assert_eq!(s, Stats { total_rows: 8, sessions: 1, trimmed_tokens: 6, ..Stats::default() });
}

#[test]
fn free_aligned_refuses_a_backwards_range() {
    let mut c = external(4, 128, false);
    let e = c.free_aligned(0, 9, 8).unwrap_err();
    assert!(matches!(&e, Error::InvalidArg(m) if m.contains("target 9 > end 8")), "{e}");
    c.free_aligned(0, 8, 8).unwrap();
    assert!(log(&mut c).is_empty());
    assert!(
        matches!(c.session_held(&[8]), Err(Error::InvalidArg(m)) if m.contains("active_rows[0] = 8 out of range [0, 8)"))
    );
    assert!(c.session_held(&[0, -7]).is_err());
}

// ---- owned mode with an SWA pool ----

fn hybrid(ps: u32, pages: u64, swa_pages: u64) -> Cache {
    Cache::new_owned(Config {
        page_size: ps,
        num_token_slots: pages * ps as u64,
        num_rows: 4,
        max_context_len: 1024,
        aligned_reuse: false,
        swa_num_token_slots: swa_pages * ps as u64,
        tier: Default::default(),
    })
    .unwrap()
}

fn swa_indices(c: &Cache, r: &Req) -> Vec<i32> {
    let mut out = vec![-1; r.kv_allocated_len as usize];
    c.row_indices(r.req_pool_idx as u32, 0, r.kv_allocated_len, true, &mut out).unwrap();
    out
}

fn swa_pages(c: &Cache) -> (u64, u64) {
    let s = c.stats().unwrap();
    (s.swa_free_pages, s.swa_used_pages)
}

/// A sliding window of `size` tokens evicted at every step, no prefix sharing, no floor.
fn unshared_window(size: u32) -> Window {
    Window { size, eviction_interval: 1, prefix_sharing: false, retain_floor: None }
}

/// running_turn, then the window of `size` tokens evicted at the turn's end.
fn evicted_turn(c: &mut Cache, origin: u32, len: u32, size: u32) -> Req {
    let mut r = running_turn(c, origin, len);
    c.swa_evict(&mut r, len, &unshared_window(size)).unwrap();
    r
}

/// A hybrid cache (page size 4, 32 pages, 16 SWA pages) running a 16-token turn whose 4-token
/// window has passed position 12.
fn passed_window() -> (Cache, Req) {
    let mut c = hybrid(4, 32, 16);
    let r = evicted_turn(&mut c, 8, 16, 4);
    (c, r)
}

#[test]
fn hybrid_pages_map_both_pools_and_the_window_frees_the_swa_side_only() {
    let mut c = hybrid(4, 32, 16);
    let mut r = running_turn(&mut c, 20, 22);
    assert_eq!(c.stats().unwrap().used_pages, 6);
    assert_eq!(swa_pages(&c), (15 - 6, 6), "one SWA page per page the row maps");
    let w = unshared_window(8);
    assert_eq!(c.swa_evict(&mut r, 22, &w).unwrap(), 12, "[0, 12): 22 - 8 floored to a page");
    assert_eq!(r.swa_evicted_seqlen, 12);
    assert_eq!(c.stats().unwrap().used_pages, 6, "the full side keeps every page");
    assert_eq!(swa_pages(&c), (12, 3));
    let ids = swa_indices(&c, &r);
    assert_eq!(&ids[..12], &[0; 12], "the window passed these");
    assert!(ids[12..].iter().all(|&i| i > 0) && ids[12] % 4 == 0 && ids[13] == ids[12] + 1);
    clean(&c);
    c.cache_finished_req(1, 0, &mut r, false).unwrap();
    assert_eq!(swa_pages(&c), (12, 3), "no overshoot: nothing trimmed");
    clean(&c);
    c.release_session(1).unwrap();
    assert_eq!(swa_pages(&c), (15, 0));
    assert_eq!(c.stats().unwrap().used_pages, 0);
    clean(&c);
}

#[test]
fn hybrid_trim_match_and_abort_free_each_side_once() {
    let mut c = hybrid(4, 64, 32);
    let mut r = evicted_turn(&mut c, 10, 30, 6);
    assert_eq!(r.swa_evicted_seqlen, 24);
    // The turn really ended at 10 + 12 = 22: the trim floors to 20 (the cursor stays on a page).
    r.finished_len = 12;
    c.cache_finished_req(7, 0, &mut r, false).unwrap();
    clean(&c);
    let u = c.stats().unwrap();
    assert_eq!((u.used_pages, u.swa_used_pages), (5, 0), "pages 0..5 stay; the window had passed all of them");
    let mut next = Req { origin_input_len: 40, ..Req::default() };
    let m = c.match_prefix(7, 0, &mut next, 40, false).unwrap();
    assert_eq!((m.hit, m.prefix_len, next.swa_evicted_seqlen), (1, 20, 20));
    c.alloc_extend(&mut next, 20, None).unwrap();
    assert_eq!(swa_pages(&c).1, 5, "new pages take SWA pages");
    assert_eq!(&swa_indices(&c, &next)[..20], &[0; 20]);
    clean(&c);
    c.cache_finished_req(7, 0, &mut next, true).unwrap();
    let s = c.stats().unwrap();
    assert_eq!((s.used_pages, s.swa_used_pages, s.sessions), (0, 0, 0));
    clean(&c);
}

#[test]
fn hybrid_cursor_moves_only_through_the_window() {
    let mut c = hybrid(4, 32, 16);
    let mut r = running_turn(&mut c, 8, 16);
    let mut lied = Req { swa_evicted_seqlen: 8, ..r };
    let e = c.alloc_extend(&mut lied, 1, None).unwrap_err();
    assert!(matches!(&e, Error::InvalidArg(m) if m.contains("swa_evicted_seqlen 8 != 0 recorded for row")), "{e}");
    let w = unshared_window(4);
    c.swa_evict(&mut r, 16, &w).unwrap();
    assert_eq!(r.swa_evicted_seqlen, 12);
    let stale = Req { swa_evicted_seqlen: 0, ..r };
    assert!(c.commit(&mut stale.clone(), 0).is_err(), "a copy from before the step is refused");
    c.free_req(&mut r).unwrap();
    assert_eq!(swa_pages(&c), (15, 0));
    clean(&c);
}

#[test]
fn hybrid_free_aligned_keeps_no_part_of_a_page_the_window_passed() {
    let (mut c, mut r) = passed_window();
    assert_eq!(r.swa_evicted_seqlen, 12);
    // Keeping 6 would keep page 1 (positions 4..8) with its SWA page gone, and put 6 and 7
    // back inside the window: an SWA layer would read them from the padding page.
    let before = (c.stats().unwrap(), swa_indices(&c, &r));
    let e = c.free_aligned(r.req_pool_idx as u32, 6, 16).unwrap_err();
    assert!(matches!(&e, Error::InvalidArg(m) if m.contains("free from a page boundary, 4")), "{e}");
    assert_eq!((c.stats().unwrap(), swa_indices(&c, &r)), before, "nothing changed");
    // A page boundary, or a page the window has not passed, is kept as asked.
    c.free_aligned(r.req_pool_idx as u32, 14, 16).unwrap();
    c.free_aligned(r.req_pool_idx as u32, 8, 14).unwrap();
    (r.kv_allocated_len, r.kv_committed_len, r.swa_evicted_seqlen) = (8, 8, 8);
    c.alloc_extend(&mut r, 2, None).unwrap();
    assert!(swa_indices(&c, &r)[8..].iter().all(|&i| i > 0), "positions the window has not passed have SWA slots");
    clean(&c);
    c.free_req(&mut r).unwrap();
    assert_eq!(swa_pages(&c), (15, 0));
    clean(&c);
}

#[test]
fn hybrid_out_of_swa_pages_changes_nothing() {
    let mut c = hybrid(4, 32, 4); // 3 usable SWA pages
    let mut r = running_turn(&mut c, 4, 8);
    let before = (r, c.stats().unwrap());
    let e = c.alloc_extend(&mut r, 8, None).unwrap_err();
    assert!(matches!(&e, Error::OutOfMemory(m) if m.contains("SWA pages needed")), "{e}");
    assert_eq!((r, c.stats().unwrap()), before);
    let mut reqs = [r];
    let e = c.alloc_extend_batch(&mut reqs, &[8], None).unwrap_err();
    assert!(matches!(&e, Error::OutOfMemory(m) if m.starts_with("reqs[0]: ")), "{e}");
    assert_eq!((reqs[0], c.stats().unwrap()), before);
    let mut tree = [0i32; 8];
    assert!(matches!(c.pool_alloc(&mut tree), Err(Error::OutOfMemory(_))));
    assert_eq!(c.stats().unwrap(), before.1);
    // The window frees room for the next page.
    let w = unshared_window(4);
    c.swa_evict(&mut r, 8, &w).unwrap();
    c.alloc_extend(&mut r, 4, None).unwrap();
    clean(&c);
}

#[test]
fn hybrid_prefix_pages_keep_their_swa_pages_with_the_engine() {
    let mut c = hybrid(2, 32, 32);
    let mut tree = [0i32; 4];
    c.pool_alloc(&mut tree).unwrap();
    assert_eq!(swa_pages(&c).1, 2);
    let mut r = Req::default();
    c.alloc_row(&mut r).unwrap();
    c.map_prefix(&mut r, &tree).unwrap();
    assert_eq!(swa_indices(&c, &r), [2, 3, 4, 5], "the prefix reads the engine's SWA pages");
    c.alloc_extend(&mut r, 4, None).unwrap();
    c.commit(&mut r, 4).unwrap();
    c.publish_prefix(&mut r, 6).unwrap();
    let published = indices(&c, &r)[4..6].to_vec();
    assert!(swa_indices(&c, &r)[4..].iter().all(|&i| i > 0));
    clean(&c);
    c.free_req(&mut r).unwrap();
    assert_eq!(swa_pages(&c).1, 3, "the published page's SWA page stays with the engine");
    clean(&c);
    c.pool_free(&tree).unwrap();
    assert_eq!(swa_pages(&c).1, 1, "the tree's pages take their SWA pages back");
    c.pool_free(&published).unwrap();
    assert_eq!(swa_pages(&c), (31, 0));
    clean(&c);
}

#[test]
fn views_of_a_missing_swa_pool_are_unsupported() {
    let mut c = owned(4, 16);
    let mut r = extended(&mut c, 4);
    let mut out = [0i32; 4];
    assert!(matches!(c.row_indices(r.req_pool_idx as u32, 0, 4, true, &mut out), Err(Error::Unsupported(_))));
    assert!(matches!(c.flashinfer_len(&[r.req_pool_idx], true), Err(Error::Unsupported(_))));
    let w = unshared_window(4);
    let e = c.swa_evict(&mut r, 4, &w).unwrap_err();
    assert!(matches!(&e, Error::Unsupported(m) if m.contains("swa_num_token_slots 0")), "{e}");
    assert_eq!(c.stats().unwrap().swa_total_pages, 0);
}

#[test]
fn the_audit_sees_both_pools() {
    let corrupt = |f: &dyn Fn(&mut super::owned::SwaSide, u32)| {
        let (mut c, mut r) = passed_window();
        let row = r.req_pool_idx as u32;
        c.cache_finished_req(1, 0, &mut r, false).unwrap();
        clean(&c);
        f(c.pool.owned_mut().unwrap().swa.as_mut().unwrap(), row);
        let rep = c.check().unwrap();
        assert!(rep.violations > 0);
        rep.first_violation_text()
    };
    let m = corrupt(&|s, row| s.rows[row as usize].ids[3] = 0);
    assert!(m.contains("lacks an SWA page") || m.contains("leaked"), "{m}");
    let m = corrupt(&|s, row| s.rows[row as usize].ids[0] = s.rows[row as usize].ids[3]);
    assert!(m.contains("named twice") || m.contains("still has") || m.contains("not all empty"), "{m}");
    let m = corrupt(&|s, _| s.held[5] = 9);
    assert!(m.contains("keeps an engine-held SWA page"), "{m}");
    let m = corrupt(&|s, row| s.rows[row as usize].passed = (1, 4));
    assert!(m.contains("which frees skip, are not all empty"), "{m}");
}

#[test]
fn hybrid_free_aligned_keeps_no_page_the_window_passed() {
    let (mut c, mut r) = passed_window();
    assert_eq!(r.swa_evicted_seqlen, 12);
    let row = r.req_pool_idx as u32;
    let before = c.stats().unwrap();
    let e = c.free_aligned(row, 10, 16).unwrap_err();
    assert!(matches!(&e, Error::InvalidArg(m) if m.contains("free from a page boundary, 8")), "{e}");
    assert_eq!(c.stats().unwrap(), before);
    c.free_aligned(row, 8, 16).unwrap();
    (r.kv_allocated_len, r.kv_committed_len, r.swa_evicted_seqlen) = (8, 8, 8);
    c.alloc_extend(&mut r, 8, None).unwrap();
    assert!(swa_indices(&c, &r)[8..].iter().all(|&i| i > 0), "the new pages take SWA pages");
    clean(&c);
}

#[test]
fn a_row_skips_only_entries_the_window_emptied() {
    use super::swa_alloc::SwaAllocator;
    let mut a = SwaAllocator::new(32).unwrap();
    let mut sr = super::owned::SwaRow::default();
    a.alloc(10, &mut sr.ids);
    sr.pass(&mut a, 2, 4);
    sr.pass(&mut a, 4, 6);
    assert_eq!(sr.passed, (2, 6), "touching runs join");
    sr.pass(&mut a, 8, 9);
    assert_eq!(sr.passed, (2, 6), "a shorter run apart keeps the longer");
    assert_eq!(a.free_pages(), 31 - 10 + 5);
    sr.free_from(&mut a, 3);
    assert_eq!((sr.ids.len(), sr.passed), (3, (2, 3)));
    assert_eq!(a.free_pages(), 31 - 2, "the live entries 6, 7 and 9 went back, nothing twice");
    sr.free_from(&mut a, 0);
    assert_eq!((a.free_pages(), sr.passed), (31, (0, 0)));
}
