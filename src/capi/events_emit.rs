//! The session calls as the exports run them: the core operation, then, on a handle with
//! events on, what it changed for which holder fed to the ledger (docs/events.md, "What each
//! call emits"). A handle without events pays one load of its events cell and a branch per
//! call; the per-step calls never come here. The ledger is locked after the handle's lock,
//! and only while the handle's lock is held.

use super::skv_cache;
#[cfg(feature = "events")]
use crate::core::Move;
use crate::core::{Cache, Match, Req, Result};
#[cfg(feature = "events")]
use crate::{
    capi::skv_req,
    core::Error,
    events::{Ledger, RowState},
};

/// A holder's key: `(session_id, branch_id)`.
pub(crate) type HolderKey = (u64, u64);

/// The handle's ledger, locked.
#[cfg(feature = "events")]
pub(crate) type Guard<'a> = std::sync::MutexGuard<'a, Ledger>;

/// Why events can no longer be enabled on this handle, if they cannot: a session call ran.
#[cfg(feature = "events")]
pub(crate) fn session_state(cache: &Cache) -> Option<String> {
    if let Some((row, s)) = cache.slots().iter().next() {
        return Some(format!("session {} branch {} holds row {row}", s.session, s.branch));
    }
    if cache.turns_finished > 0 {
        return Some(format!("{} turns finished", cache.turns_finished));
    }
    match cache.pool.owned() {
        Some(p) if p.free_rows() < p.total_rows() => {
            Some(format!("{} owned rows are in use", p.total_rows() - p.free_rows()))
        }
        _ => None,
    }
}

/// The handle's ledger, locked; SKV_ERR_STATE when events are off.
#[cfg(feature = "events")]
pub(crate) fn enabled(handle: &skv_cache) -> Result<Guard<'_>> {
    match handle.events.get() {
        Some(m) => Ok(m.lock().unwrap_or_else(|e| e.into_inner())),
        None => Err(Error::State("events are not enabled on this handle (skv_events_enable)".into())),
    }
}

/// The handle's ledger, locked, when events are on.
///
/// # Safety
/// `c` is a live handle whose lock the caller holds.
#[cfg(feature = "events")]
#[inline(always)]
unsafe fn ledger<'a>(c: *const skv_cache) -> Option<Guard<'a>> {
    // SAFETY: a live handle, by this function's contract.
    let cell = unsafe { &(*c).events };
    cell.get().map(|m| m.lock().unwrap_or_else(|e| e.into_inner()))
}

/// Runs `emit` on the ledger of `c` when events are on, then closes the call's batch.
///
/// # Safety
/// `c` is a live handle whose lock the caller holds.
#[cfg(feature = "events")]
#[inline(always)]
unsafe fn emit(c: *const skv_cache, emit: impl FnOnce(&mut Ledger)) {
    // SAFETY: the caller's contract, passed on.
    if let Some(mut l) = unsafe { ledger(c) } {
        emit(&mut l);
        l.close();
    }
}

/// `skv_match_prefix`: a hit keeps the pages below its prefix; a slot the match released
/// (nothing whole to reuse) is gone.
///
/// # Safety
/// `c` is a live handle whose lock the caller holds, as `cache`.
#[inline(always)]
pub(crate) unsafe fn match_prefix(
    c: *const skv_cache,
    cache: &mut Cache,
    key: (u64, u64),
    r: &mut Req,
    key_len: u32,
    pre_aborted: bool,
) -> Result<Match> {
    #[cfg(feature = "events")]
    // SAFETY: the caller's contract, passed on.
    if let Some(mut l) = unsafe { ledger(c) } {
        let had = cache.slots().find(key.0, key.1).is_some();
        let m = cache.match_prefix(key.0, key.1, r, key_len, pre_aborted)?;
        match (m.hit, had && cache.slots().find(key.0, key.1).is_none()) {
            (1, _) => l.held(key, r.kv_allocated_len, r.kv_committed_len),
            (_, true) => l.remove(key),
            _ => {}
        }
        l.close();
        return Ok(m);
    }
    let _ = c;
    cache.match_prefix(key.0, key.1, r, key_len, pre_aborted)
}

/// `skv_cache_finished_req`: a finish stores what its slot keeps after the trim and releases
/// what the trim cut; an abort releases the holder.
///
/// # Safety
/// As `match_prefix`.
#[inline(always)]
pub(crate) unsafe fn finished(
    c: *const skv_cache,
    cache: &mut Cache,
    key: (u64, u64),
    r: &mut Req,
    aborted: bool,
) -> Result<()> {
    cache.cache_finished_req(key.0, key.1, r, aborted)?;
    #[cfg(feature = "events")]
    // SAFETY: the caller's contract, passed on.
    unsafe {
        emit(c, |l| match (aborted, cache.slots().find(key.0, key.1)) {
            (true, _) | (false, None) => l.remove(key),
            (false, Some((_, s))) => l.held(key, s.allocated, s.committed),
        })
    };
    let _ = c;
    Ok(())
}

/// `skv_hand_back`: nothing is freed; tokens past the slot's length are forgotten (a failed
/// import's session ends).
///
/// # Safety
/// As `match_prefix`.
#[inline(always)]
pub(crate) unsafe fn hand_back(c: *const skv_cache, cache: &mut Cache, key: (u64, u64), r: &mut Req) -> Result<()> {
    cache.hand_back(key.0, key.1, r)?;
    #[cfg(feature = "events")]
    // SAFETY: the caller's contract, passed on.
    unsafe {
        emit(c, |l| match cache.slots().find(key.0, key.1) {
            Some((_, s)) => l.held(key, s.allocated, s.committed),
            // A failed import's session ends with its turn's hand-back.
            None => l.remove(key),
        })
    };
    let _ = c;
    Ok(())
}

/// `skv_release_session`: every branch with a slot is released (an idle eviction, or the end
/// of the session), and the session's salt forgotten.
///
/// # Safety
/// As `match_prefix`.
#[inline(always)]
pub(crate) unsafe fn release_session(c: *const skv_cache, cache: &mut Cache, session: u64) -> Result<()> {
    #[cfg(feature = "events")]
    // SAFETY: the caller's contract, passed on.
    if let Some(mut l) = unsafe { ledger(c) } {
        let branches: smallvec::SmallVec<[u64; 4]> = cache
            .slots()
            .rows_of(session)
            .iter()
            .filter_map(|&row| cache.slots().of_row(row).map(|s| s.branch))
            .collect();
        cache.release_session(session)?;
        branches.into_iter().for_each(|b| l.remove((session, b)));
        l.forget_session(session);
        l.close();
        return Ok(());
    }
    let _ = c;
    cache.release_session(session)
}

/// `skv_release_branch`: the branch's slot, if any, is released.
///
/// # Safety
/// As `match_prefix`.
#[inline(always)]
pub(crate) unsafe fn release_branch(c: *const skv_cache, cache: &mut Cache, key: (u64, u64)) -> Result<()> {
    #[cfg(feature = "events")]
    // SAFETY: the caller's contract, passed on.
    if let Some(mut l) = unsafe { ledger(c) } {
        let had = cache.slots().find(key.0, key.1).is_some();
        cache.release_branch(key.0, key.1)?;
        if had {
            l.remove(key);
        }
        l.close();
        return Ok(());
    }
    let _ = c;
    cache.release_branch(key.0, key.1)
}

/// `skv_free_aligned`: the row's holder keeps its pages below `target`.
///
/// # Safety
/// As `match_prefix`.
#[inline(always)]
pub(crate) unsafe fn free_aligned(
    c: *const skv_cache,
    cache: &mut Cache,
    row: u32,
    target: u32,
    end: u32,
) -> Result<()> {
    cache.free_aligned(row, target, end)?;
    #[cfg(feature = "events")]
    if target < end {
        // SAFETY: the caller's contract, passed on.
        unsafe { emit(c, |l| l.shortened(row, target)) };
    }
    let _ = c;
    Ok(())
}

/// `skv_trim_overshoot` and `skv_free_tail`: the row's holder keeps its pages below the req's
/// new kv_allocated_len.
///
/// # Safety
/// As `match_prefix`.
#[inline(always)]
pub(crate) unsafe fn shorten(
    c: *const skv_cache,
    cache: &mut Cache,
    r: &mut Req,
    op: impl FnOnce(&mut Cache, &mut Req) -> Result<()>,
) -> Result<()> {
    op(cache, r)?;
    #[cfg(feature = "events")]
    if let Some(row) = r.row() {
        // SAFETY: the caller's contract, passed on.
        unsafe { emit(c, |l| l.shortened(row, r.kv_allocated_len)) };
    }
    let _ = c;
    Ok(())
}

/// `skv_free_req`: a first turn's row goes, and its holder with it.
///
/// # Safety
/// As `match_prefix`.
#[inline(always)]
pub(crate) unsafe fn free_req(c: *const skv_cache, cache: &mut Cache, r: &mut Req) -> Result<()> {
    let row = r.row();
    cache.free_req(r)?;
    #[cfg(feature = "events")]
    if let Some(row) = row {
        // SAFETY: the caller's contract, passed on.
        unsafe { emit(c, |l| l.remove_row(row)) };
    }
    let _ = (c, row);
    Ok(())
}

/// `skv_events_tokens` once the pointers are checked and the ledger locked.
#[cfg(feature = "events")]
pub(crate) fn events_tokens(
    cache: &Cache,
    l: &mut Ledger,
    key: HolderKey,
    req: &skv_req,
    first_pos: u32,
    tokens: &[i32],
) -> Result<()> {
    let (session, branch) = key;
    let r = *req;
    cache.check_req(&r)?;
    let Some(row) = r.row() else {
        return Err(Error::InvalidArg("req_pool_idx -1: the req holds no row".into()));
    };
    let max = cache.config().max_context_len;
    if first_pos as u64 + tokens.len() as u64 > max as u64 {
        return Err(Error::InvalidArg(format!("first_pos {first_pos} + n {} > max_context_len {max}", tokens.len())));
    }
    if let Some((i, t)) = tokens.iter().enumerate().find(|(_, &t)| t < 0) {
        return Err(Error::InvalidArg(format!("tokens[{i}] = {t} is negative")));
    }
    match (cache.slots().find(session, branch), cache.slots().of_row(row)) {
        (Some((at, s)), _) if at != row || !s.in_flight => {
            return Err(Error::State(format!(
                "session {session} branch {branch} has {} slot in row {at}: its tokens come with the req a \
                 skv_match_prefix hit restored into it",
                if s.in_flight { "a running" } else { "an idle" }
            )))
        }
        (None, Some(s)) => {
            return Err(Error::State(format!(
                "row {row} belongs to the slot of session {} branch {}",
                s.session, s.branch
            )))
        }
        _ => {}
    }
    let toks: Vec<u32> = tokens.iter().map(|&t| t as u32).collect();
    let rs = RowState {
        row,
        protected: r.cache_protected_len,
        committed: r.kv_committed_len,
        allocated: r.kv_allocated_len,
    };
    let out = l.tokens(key, rs, first_pos, &toks);
    l.close();
    out
}

/// The host tier's calls: what each did to which sessions' KV (`Cache::moves`): a parked
/// session's pages move from medium GPU to CPU, a restored one's back, a released one's go
/// (docs/tiers.md#kv-events). `hit` adds a tiered match's own answer for its session.
///
/// # Safety
/// As `match_prefix`.
#[inline]
pub(crate) unsafe fn tier<T>(
    c: *const skv_cache,
    cache: &mut Cache,
    op: impl FnOnce(&mut Cache) -> Result<T>,
    hit: impl FnOnce(&Cache, &T) -> Option<(HolderKey, u32, u32)>,
) -> Result<T> {
    cache.moves.clear();
    let out = op(cache)?;
    #[cfg(feature = "events")]
    // SAFETY: the caller's contract, passed on.
    unsafe {
        emit(c, |l| {
            for &(s, b, m) in &cache.moves {
                match m {
                    Move::Parked { protected } => l.moved((s, b), Some(protected)),
                    Move::Restored => l.moved((s, b), None),
                    Move::Released => l.remove((s, b)),
                }
            }
            if let Some((key, held, committed)) = hit(cache, &out) {
                l.held(key, held, committed);
            }
        })
    };
    #[cfg(not(feature = "events"))]
    let _ = (c, hit);
    Ok(out)
}

/// `skv_session_import`: with `tokens` (and events on), the imported session's full committed
/// pages are stored at once, before its source can release them (docs/transfer.md#kv-events).
/// The tokens are checked before the import runs, so a refusal changes nothing.
///
/// # Safety
/// As `match_prefix`.
pub(crate) unsafe fn import<T>(
    c: *const skv_cache,
    cache: &mut Cache,
    key: HolderKey,
    tokens: &[i32],
    op: impl FnOnce(&mut Cache) -> Result<T>,
) -> Result<T> {
    if let Some((i, t)) = tokens.iter().enumerate().find(|(_, &t)| t < 0) {
        return Err(crate::core::Error::InvalidArg(format!("in->tokens[{i}] = {t} is negative")));
    }
    let out = op(cache)?;
    #[cfg(feature = "events")]
    if !tokens.is_empty() {
        let (row, s) = cache.slots().find(key.0, key.1).map(|(r, s)| (r, *s)).expect("the import's slot");
        let toks: Vec<u32> = tokens[..tokens.len().min(s.committed as usize)].iter().map(|&t| t as u32).collect();
        let rs = RowState { row, protected: s.protected, committed: s.committed, allocated: s.allocated };
        // SAFETY: the caller's contract, passed on.
        unsafe {
            emit(c, |l| {
                // A new holder on a new row: nothing a fresh holder's tokens can disagree with.
                let _ = l.tokens(key, rs, 0, &toks);
            })
        };
    }
    #[cfg(not(feature = "events"))]
    let _ = (c, key);
    Ok(out)
}
