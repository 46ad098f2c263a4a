//! The move lifecycle (docs/transfer.md), model-checked with stateright over every
//! interleaving of: the source and the destination (either may crash), the transfer engine's
//! read (it completes, fails, is cancelled, or completes late), the unit on the wire (lost or
//! delivered twice), the destination's notification (lost or late), the source's timeouts and
//! its questions to the destination (lost too). libskv's part of each step is the code's own
//! decision function (`skv::core::transfer`: `next_epoch`, `exported`, `admit`, `import_done`,
//! `export_done`, `ask`); the model adds only what an engine and a network do around them.
//!
//! Checked always: never two live copies; at least one copy unless a crash destroyed the last;
//! each side's pages freed at most once, and never while the transfer may still touch them.
//! The state space is explored whole (every message kind lost at most once, duplicated at most
//! once, at most two timeouts): the test prints its size and depth.

use skv::core::transfer::{self, Answer, Fence, ImportEnd, SourceEnd};
use stateright::{Checker, Model, Property};

/// The source's slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Src {
    /// Serving (live).
    Held,
    /// A move export's ticket is open: pages pinned, turns refused.
    Exporting(u32),
    /// Released after the destination committed.
    Released,
    Crashed,
}

/// The destination's slot for the key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Dst {
    Absent,
    /// Imported, its pages reserved, the read not yet completed here.
    Reserved(u32),
    /// Committed (live).
    Live(u32),
    Crashed,
}

/// The destination's read of the source's pages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Xfer {
    Idle,
    Running(u32),
    /// Ended: `true` when the bytes arrived.
    Ended(u32, bool),
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct State {
    src: Src,
    /// The session's epoch at the source (0: born there).
    src_epoch: u32,
    src_fence: Fence,
    dst: Dst,
    dst_fence: Fence,
    xfer: Xfer,
    /// On the wire, to the destination: the unit (an epoch) and questions (an epoch).
    unit: Option<u32>,
    query: Option<u32>,
    /// To the source: the notification (an epoch) and answers.
    notify: Option<u32>,
    answer: Option<(u32, Answer)>,
    /// The source's timer fired for the open export: it asked and waits for the answer.
    waiting: bool,
    /// Budgets of the environment's faults.
    losses: u8,
    dups: u8,
    timeouts: u8,
    src_frees: u8,
    /// Frees of the destination's current reservation.
    dst_frees: u8,
    /// A free of pages the transfer could still touch.
    freed_under_transfer: bool,
    /// A crash destroyed the session's authoritative copy (a loss no protocol prevents).
    lost_by_crash: bool,
    /// Ghosts: the highest epoch the destination ever committed (a crash keeps it), and the
    /// epoch the source released (0: none).
    ever_committed: u32,
    released_at: u32,
}

impl State {
    /// Whether the session's authoritative copy exists: the destination's once it committed,
    /// else the source's until it releases.
    fn owned(&self) -> bool {
        matches!(self.dst, Dst::Live(_)) || matches!(self.src, Src::Held | Src::Exporting(_))
    }

    /// Whether the transfer may still read the source's pages or write the destination's.
    fn transfer_running(&self) -> bool {
        matches!(self.xfer, Xfer::Running(_))
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Action {
    SrcExport,
    DeliverUnit {
        duplicate: bool,
    },
    LoseUnit,
    XferDone(bool),
    /// The destination gives up on a read (its timeout): the transfer engine cancels it.
    DstCancel,
    DstComplete,
    DeliverNotify,
    LoseNotify,
    SrcTimeout,
    DeliverQuery,
    LoseQuery,
    DeliverAnswer,
    LoseAnswer,
    /// The source learns its destination died: its copy, if any, died with it.
    SrcPeerDead,
    CrashSrc,
    CrashDst,
}

/// The lifecycle. Two broken variants the checker must catch: `free_on_timeout`, a source
/// that frees when its timer fires; `no_fence`, a destination that admits any epoch.
struct Lifecycle {
    free_on_timeout: bool,
    no_fence: bool,
}

const MAX_LOSSES: u8 = 1;
const MAX_DUPS: u8 = 1;
const MAX_TIMEOUTS: u8 = 2;

impl Lifecycle {
    /// The source frees its pages (a release).
    fn src_free(s: &mut State) {
        s.src_frees += 1;
        if let Src::Exporting(e) = s.src {
            s.released_at = e;
        }
        if s.transfer_running() {
            s.freed_under_transfer = true;
        }
    }

    fn dst_free(s: &mut State) {
        s.dst_frees += 1;
        if s.transfer_running() {
            s.freed_under_transfer = true;
        }
    }

    /// A crash of the side holding the authoritative copy loses the session.
    fn crash(s: &mut State, owner: bool, f: impl FnOnce(&mut State)) {
        s.lost_by_crash |= owner;
        f(s);
    }
}

impl Model for Lifecycle {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            src: Src::Held,
            src_epoch: 0,
            src_fence: Fence::default(),
            dst: Dst::Absent,
            dst_fence: Fence::default(),
            xfer: Xfer::Idle,
            unit: None,
            query: None,
            notify: None,
            answer: None,
            waiting: false,
            losses: 0,
            dups: 0,
            timeouts: 0,
            src_frees: 0,
            dst_frees: 0,
            freed_under_transfer: false,
            lost_by_crash: false,
            ever_committed: 0,
            released_at: 0,
        }]
    }

    fn actions(&self, s: &State, out: &mut Vec<Action>) {
        let alive_src = s.src != Src::Crashed;
        let alive_dst = s.dst != Dst::Crashed;
        // At most two moves: the first, and the retry of a failed one.
        if s.src == Src::Held && s.src_fence.seen < 2 && s.unit.is_none() {
            out.push(Action::SrcExport);
        }
        if s.unit.is_some() {
            out.push(Action::DeliverUnit { duplicate: false });
            if s.dups < MAX_DUPS {
                out.push(Action::DeliverUnit { duplicate: true });
            }
            if s.losses < MAX_LOSSES {
                out.push(Action::LoseUnit);
            }
        }
        if let Xfer::Running(_) = s.xfer {
            out.push(Action::XferDone(true));
            out.push(Action::XferDone(false));
            if alive_dst {
                out.push(Action::DstCancel);
            }
        }
        if let (Dst::Reserved(_), Xfer::Ended(..)) = (s.dst, s.xfer) {
            out.push(Action::DstComplete);
        }
        if s.notify.is_some() {
            out.push(Action::DeliverNotify);
            if s.losses < MAX_LOSSES {
                out.push(Action::LoseNotify);
            }
        }
        if let Src::Exporting(_) = s.src {
            if !s.waiting && s.timeouts < MAX_TIMEOUTS {
                out.push(Action::SrcTimeout);
            }
            if !alive_dst {
                out.push(Action::SrcPeerDead);
            }
        }
        if s.query.is_some() {
            out.push(Action::DeliverQuery);
            if s.losses < MAX_LOSSES {
                out.push(Action::LoseQuery);
            }
        }
        if s.answer.is_some() {
            out.push(Action::DeliverAnswer);
            if s.losses < MAX_LOSSES {
                out.push(Action::LoseAnswer);
            }
        }
        if alive_src {
            out.push(Action::CrashSrc);
        }
        if alive_dst {
            out.push(Action::CrashDst);
        }
    }

    fn next_state(&self, s: &State, a: Action) -> Option<State> {
        let mut n = s.clone();
        match a {
            Action::SrcExport => {
                let e = transfer::next_epoch(s.src_fence, s.src_epoch)?;
                n.src_fence = transfer::exported(s.src_fence, e);
                n.src = Src::Exporting(e);
                n.unit = Some(e);
                n.waiting = false;
            }
            Action::DeliverUnit { duplicate } => {
                let e = s.unit?;
                if duplicate {
                    n.dups += 1;
                } else {
                    n.unit = None;
                }
                match s.dst {
                    // A crashed destination drops what arrives.
                    Dst::Crashed => {}
                    // A slot for the key exists: the import is refused; the engine answers
                    // from its fence as it would a question.
                    Dst::Reserved(_) | Dst::Live(_) => {
                        let pending = matches!(s.dst, Dst::Reserved(r) if r == e);
                        let (ans, f) = transfer::ask(s.dst_fence, e, pending);
                        n.dst_fence = f;
                        n.answer = Some((e, ans));
                    }
                    Dst::Absent => match match self.no_fence {
                        false => transfer::admit(s.dst_fence, e),
                        true => Ok(Fence { seen: e, ..s.dst_fence }),
                    } {
                        Ok(f) => {
                            // Reserve the pages, post the read.
                            n.dst_fence = f;
                            n.dst = Dst::Reserved(e);
                            n.xfer = Xfer::Running(e);
                            // New pages: their frees count afresh.
                            n.dst_frees = 0;
                        }
                        Err(_) => {
                            let (ans, f) = transfer::ask(s.dst_fence, e, false);
                            n.dst_fence = f;
                            n.answer = Some((e, ans));
                        }
                    },
                }
            }
            Action::LoseUnit => {
                n.unit = None;
                n.losses += 1;
            }
            Action::XferDone(ok) => {
                let Xfer::Running(e) = s.xfer else { return None };
                // Bytes arrive only from a live source's pinned pages.
                let ok = ok && matches!(s.src, Src::Exporting(x) if x == e) && s.src_frees == 0;
                n.xfer = Xfer::Ended(e, ok);
            }
            Action::DstCancel => {
                let Xfer::Running(e) = s.xfer else { return None };
                n.xfer = Xfer::Ended(e, false);
            }
            Action::DstComplete => {
                let (Dst::Reserved(e), Xfer::Ended(x, ok)) = (s.dst, s.xfer) else { return None };
                debug_assert_eq!(e, x);
                let (end, f) = transfer::import_done(s.dst_fence, e, ok);
                n.dst_fence = f;
                n.xfer = Xfer::Idle;
                match end {
                    ImportEnd::Commit => {
                        n.ever_committed = n.ever_committed.max(e);
                        n.dst = Dst::Live(e);
                        n.notify = Some(e);
                    }
                    ImportEnd::Release => {
                        Self::dst_free(&mut n);
                        n.dst = Dst::Absent;
                        // The destination says so: the source may serve again.
                        let (ans, f) = transfer::ask(n.dst_fence, e, false);
                        n.dst_fence = f;
                        n.answer = Some((e, ans));
                    }
                }
            }
            Action::DeliverNotify => {
                let e = s.notify?;
                n.notify = None;
                if s.src == Src::Exporting(e) && transfer::export_done(true) == SourceEnd::Release {
                    Self::src_free(&mut n);
                    n.src = Src::Released;
                }
            }
            Action::LoseNotify => {
                n.notify = None;
                n.losses += 1;
            }
            Action::SrcTimeout => {
                let Src::Exporting(e) = s.src else { return None };
                n.timeouts += 1;
                if self.free_on_timeout {
                    Self::src_free(&mut n);
                    n.src = Src::Released;
                } else {
                    n.waiting = true;
                    n.query = Some(e);
                }
            }
            Action::DeliverQuery => {
                let e = s.query?;
                n.query = None;
                if s.dst != Dst::Crashed {
                    let pending = matches!(s.dst, Dst::Reserved(r) if r == e);
                    let (ans, f) = transfer::ask(s.dst_fence, e, pending);
                    n.dst_fence = f;
                    n.answer = Some((e, ans));
                }
            }
            Action::LoseQuery => {
                n.query = None;
                n.losses += 1;
                // The source's timer fires again later.
                n.waiting = false;
            }
            Action::DeliverAnswer => {
                let (e, ans) = s.answer?;
                n.answer = None;
                n.waiting = false;
                if s.src == Src::Exporting(e) {
                    match ans {
                        Answer::Committed => {
                            Self::src_free(&mut n);
                            n.src = Src::Released;
                        }
                        Answer::Absent => {
                            assert_eq!(transfer::export_done(false), SourceEnd::Serve);
                            n.src = Src::Held;
                        }
                        Answer::Pending => {}
                    }
                }
            }
            Action::LoseAnswer => {
                n.answer = None;
                n.losses += 1;
                n.waiting = false;
            }
            Action::SrcPeerDead => {
                if let Src::Exporting(_) = s.src {
                    n.src = Src::Held;
                }
            }
            Action::CrashSrc => {
                let owner = !matches!(s.dst, Dst::Live(_)) && matches!(s.src, Src::Held | Src::Exporting(_));
                Self::crash(&mut n, owner, |n| n.src = Src::Crashed)
            }
            Action::CrashDst => Self::crash(&mut n, matches!(s.dst, Dst::Live(_)), |n| {
                n.dst = Dst::Crashed;
                n.dst_fence = Fence::default();
            }),
        }
        Some(n)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("never two live copies", |_, s: &State| {
                !(s.src == Src::Held && matches!(s.dst, Dst::Live(_)))
            }),
            Property::always("a copy survives unless a crash took it", |_, s: &State| s.owned() || s.lost_by_crash),
            Property::always("the source releases only a committed epoch", |_, s: &State| {
                s.released_at == 0 || s.ever_committed >= s.released_at
            }),
            Property::always("pages freed once, never under the transfer", |_, s: &State| {
                s.src_frees <= 1 && s.dst_frees <= 1 && !s.freed_under_transfer
            }),
            Property::sometimes("the session moved", |_, s: &State| {
                s.src == Src::Released && matches!(s.dst, Dst::Live(_))
            }),
            Property::sometimes("a failed move serves again", |_, s: &State| {
                s.src == Src::Held && s.src_fence.seen >= 1 && s.dst == Dst::Absent && s.dst_frees == 1
            }),
            Property::sometimes("a duplicate was fenced", |_, s: &State| s.dups == 1 && s.answer.is_some()),
        ]
    }
}

#[test]
fn the_lifecycle_holds_in_every_interleaving() {
    let c = Lifecycle { free_on_timeout: false, no_fence: false }.checker().spawn_bfs().join();
    c.assert_properties();
    eprintln!(
        "transfer model: {} states ({} unique), depth {}, explored whole",
        c.state_count(),
        c.unique_state_count(),
        c.max_depth()
    );
    assert!(c.unique_state_count() > 1000, "the faults were explored");
}

#[test]
fn a_source_freeing_on_its_timeout_is_caught() {
    let c = Lifecycle { free_on_timeout: true, no_fence: false }.checker().spawn_bfs().join();
    assert!(
        c.discovery("a copy survives unless a crash took it").is_some()
            || c.discovery("the source releases only a committed epoch").is_some()
            || c.discovery("pages freed once, never under the transfer").is_some(),
        "the checker must find the hole"
    );
}

#[test]
fn a_destination_without_the_fence_is_caught() {
    let c = Lifecycle { free_on_timeout: false, no_fence: true }.checker().spawn_bfs().join();
    let path = c.discovery("never two live copies").expect("a late duplicate makes a second live copy");
    eprintln!("without the fence, two live copies after: {:?}", path.into_actions());
}
