//! The request record an engine hands libskv, the cache configuration, and the checks every
//! operation runs on them before it changes anything.

use super::error::{bail, Result};
use super::page::ceil_align;
use super::tier::TierConfig;

/// How a cache is laid out. Mirrors `skv_cache_config`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// Tokens per KV page.
    pub page_size: u32,
    /// Owned mode: KV pool capacity in token slots (page 0 is the padding page).
    pub num_token_slots: u64,
    /// req_to_token rows; bounds the valid row numbers.
    pub num_rows: u32,
    /// Longest sequence a row may map.
    pub max_context_len: u32,
    /// A session prefix is reused only in whole pages.
    pub aligned_reuse: bool,
    /// Owned mode: the sliding-window pool's capacity in token slots (page 0 is its padding
    /// page); 0 = no SWA pool (the engine runs any window itself).
    pub swa_num_token_slots: u64,
    /// The host tier and the unit fingerprint's fields.
    pub tier: TierConfig,
}

impl Config {
    /// The checks both modes share.
    pub fn validate(&self) -> Result<()> {
        if self.page_size == 0 {
            bail!(InvalidArg, "page_size 0: must be >= 1");
        }
        if self.num_rows == 0 || self.num_rows > i32::MAX as u32 {
            bail!(InvalidArg, "num_rows {} out of range [1, {}]", self.num_rows, i32::MAX);
        }
        if self.max_context_len == 0 {
            bail!(InvalidArg, "max_context_len 0: must be >= 1");
        }
        Ok(())
    }

    /// Owned mode also sizes the pool: whole pages, page 0 plus at least one usable page,
    /// and every token index must fit in an int32.
    pub fn validate_owned(&self) -> Result<()> {
        self.validate()?;
        let (slots, ps) = (self.num_token_slots, self.page_size as u64);
        if slots % ps != 0 {
            bail!(InvalidArg, "num_token_slots {slots} is not a multiple of page_size {ps}");
        }
        if slots / ps < 2 {
            bail!(InvalidArg, "num_token_slots {slots}: need at least 2 pages of {ps} (page 0 is padding)");
        }
        if slots > 1 << 31 {
            bail!(InvalidArg, "num_token_slots {slots} exceeds 2^31 (indices are int32)");
        }
        let swa = self.swa_num_token_slots;
        if swa != 0 && (!swa.is_multiple_of(ps) || swa / ps < 2 || swa > 1 << 31) {
            bail!(
                InvalidArg,
                "swa_num_token_slots {swa}: must be 0 (no SWA pool) or a multiple of page_size {ps} of at least \
                 2 pages (page 0 is padding) and at most 2^31"
            );
        }
        self.tier.validate(ps as u32, swa != 0, true)
    }
}

/// One request's KV bookkeeping: engine-owned plain data that libskv reads and writes.
//
// The one definition of C's `skv_req` (cbindgen.toml renames it; `capi` also names it
// `skv_req` for Rust callers): the batch calls work on the caller's array in place. Its fields
// keep sglang's words (docs/concepts.md's request record), as the header does; the row records
// and the slots use the short names (`row`, `committed`, `swa`, ...). `FIELDS` lists the fields
// for the trace and the replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct Req {
    /// req_to_token row, -1 = none.
    pub req_pool_idx: i32,
    /// The generation of req_pool_idx when libskv handed the row to this req (skv_alloc_row,
    /// a skv_match_prefix hit); 0 = not stamped. A req whose non-zero row_generation differs
    /// from its row's current generation is a stale copy (the row was released and handed
    /// out again since): SKV_ERR_STATE. Engines copy it with the req and never set it; a req
    /// built by hand carries 0, which is not checked (in external mode rows the engine
    /// allocates itself are never stamped).
    pub row_generation: u32,
    /// Tokens whose KV is final.
    pub kv_committed_len: u32,
    /// Tokens with KV slots assigned (>= committed).
    pub kv_allocated_len: u32,
    /// Prefix owned by the engine's prefix tree: never freed here. A multiple of page_size.
    pub cache_protected_len: u32,
    /// Sliding-window cursor: [0, this) already freed for SWA layers; 0 = none. Owned mode
    /// with an SWA pool records it per row and only skv_swa_evict (and the frees that cut a
    /// row below it) moves it: a req disagreeing with the record is SKV_ERR_INVALID_ARG.
    pub swa_evicted_seqlen: u32,
    /// Eviction floor of sliding-window layers (sglang's swa_evict_floor): [0, this) is
    /// never window-evicted; 0 = none. The engine sets it (at a prefill, to the prefill's
    /// end); a hit restores the slot's. It may lie past swa_evicted_seqlen and past
    /// kv_allocated_len, and no trim clamps it; at most max_context_len. SWA slots below
    /// swa_dead_lo = max(cache_protected_len, this), rounded up to a page when the floor is
    /// the larger, are never freed by the window. It may rise only while the window has freed
    /// nothing: on a running session's row, a floor lifting swa_dead_lo over positions the
    /// window freed is SKV_ERR_INVALID_ARG (docs/hybrid.md).
    pub swa_evict_floor: u32,
    /// Prompt tokens of this turn (the full session history).
    pub origin_input_len: u32,
    /// Tokens in output_ids, speculative overshoot included.
    pub output_len: u32,
    /// Tokens the turn really produced; -1 = output_len.
    pub finished_len: i32,
    /// Engine prefix-tree node locked by the session's first turn, 0 = none.
    pub lock_node: u64,
    /// Opaque value handed back to dec_lock_ref.
    pub lock_receipt: u64,
    /// Engine auxiliary state handed back to free_aux, -1 = none (sglang: the request's mamba
    /// pool slot, mamba_pool_idx).
    pub aux_state: i64,
    /// Two more recurrent-state handles (sglang: the ping-pong track buffer,
    /// mamba_ping_pong_track_buffer), each -1 when empty. Kept, restored and freed like
    /// aux_state, each on its own: a release calls free_aux for `aux_state`, then
    /// `aux_track[0]`, then `aux_track[1]`, skipping -1 (docs/recurrent-state.md).
    pub aux_track: [i64; 2],
}

/// A req field's value as a trace spells it: one integer, or `aux_track`'s pair. Displayed
/// as JSON (`17`, `[-1,-1]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldValue {
    One(i128),
    Pair([i64; 2]),
}

impl std::fmt::Display for FieldValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FieldValue::One(n) => write!(f, "{n}"),
            FieldValue::Pair([a, b]) => write!(f, "[{a},{b}]"),
        }
    }
}

/// The C types of a req's fields, to and from `FieldValue`.
trait FieldType: Copy {
    fn value(self) -> FieldValue;
    /// `None` when the value does not fit the type.
    fn from_value(v: FieldValue) -> Option<Self>;
}

macro_rules! integer_fields {
    ($($t:ty),*) => {$(
        impl FieldType for $t {
            fn value(self) -> FieldValue {
                FieldValue::One(self.into())
            }
            fn from_value(v: FieldValue) -> Option<Self> {
                match v {
                    FieldValue::One(n) => n.try_into().ok(),
                    FieldValue::Pair(_) => None,
                }
            }
        }
    )*};
}
integer_fields!(i32, u32, i64, u64);

impl FieldType for [i64; 2] {
    fn value(self) -> FieldValue {
        FieldValue::Pair(self)
    }
    fn from_value(v: FieldValue) -> Option<Self> {
        match v {
            FieldValue::Pair(p) => Some(p),
            FieldValue::One(_) => None,
        }
    }
}

/// One field of a req by its C name, read and written as a `FieldValue`.
#[derive(Clone, Copy)]
pub struct ReqField {
    pub name: &'static str,
    pub get: fn(&Req) -> FieldValue,
    /// Writes the value; false (nothing written) when the field's type cannot hold it.
    pub set: fn(&mut Req, FieldValue) -> bool,
}

/// `Req::FIELDS` from the field names, in the struct's order. The destructuring below fails to
/// compile when a field is missing from the list, and the size check when the struct has
/// padding (the exports write whole reqs, so no byte of one may be indeterminate).
macro_rules! req_fields {
    ($($field:ident),* $(,)?) => {
        impl Req {
            /// Every field, in the struct's (and the header's) order: the trace writes a req
            /// with these, and the simulator's replay reads and compares one with them.
            pub const FIELDS: [ReqField; [$(stringify!($field)),*].len()] = [$(ReqField {
                name: stringify!($field),
                get: |r| r.$field.value(),
                set: |r, v| match FieldType::from_value(v) {
                    Some(x) => {
                        r.$field = x;
                        true
                    }
                    None => false,
                },
            }),*];
        }

        const _: () = {
            let _all_listed: fn(Req) = |r| {
                let Req { $($field: _),* } = r;
            };
            const fn size_of_field<T>(_: fn(&Req) -> &T) -> usize {
                std::mem::size_of::<T>()
            }
            assert!(std::mem::size_of::<Req>() == 0 $(+ size_of_field(|r| &r.$field))*, "skv_req has padding");
        };
    };
}

req_fields!(
    req_pool_idx,
    row_generation,
    kv_committed_len,
    kv_allocated_len,
    cache_protected_len,
    swa_evicted_seqlen,
    swa_evict_floor,
    origin_input_len,
    output_len,
    finished_len,
    lock_node,
    lock_receipt,
    aux_state,
    aux_track,
);

impl Default for Req {
    fn default() -> Self {
        Req {
            req_pool_idx: -1,
            row_generation: 0,
            kv_committed_len: 0,
            kv_allocated_len: 0,
            cache_protected_len: 0,
            swa_evicted_seqlen: 0,
            swa_evict_floor: 0,
            origin_input_len: 0,
            output_len: 0,
            finished_len: -1,
            lock_node: 0,
            lock_receipt: 0,
            aux_state: -1,
            aux_track: [-1; 2],
        }
    }
}

/// `SKV_ERR_STATE` unless `len` keeps the tree's prefix `protected`: `name` and `rule` say
/// which length and why (libskv never frees, or lets a session shrink below, the prefix the
/// engine's tree owns).
pub fn keep_protected(name: &str, len: u32, protected: u32, rule: &str) -> Result<()> {
    if len < protected {
        bail!(State, "{name} {len} < cache_protected_len {protected}: {rule}");
    }
    Ok(())
}

/// sglang's `ReqKvInfo.swa_dead_lo`: the lowest position whose SWA slot a request frees
/// itself, above the tree's prefix and the eviction floor, page-aligned upward.
pub fn swa_dead_lo(protected: u32, swa_floor: u32, ps: u32) -> u32 {
    let lo = protected.max(swa_floor);
    if ps > 1 && lo > protected {
        // A floor within the last page of u32 rounds past it; no row is that long.
        ceil_align(lo, ps).min(u32::MAX as u64) as u32
    } else {
        lo
    }
}

/// The positions `[lo, hi)` whose SWA slots the window already freed: a free of the row
/// hands them back to the full pool only (sglang's `free_kv_row_segments` bounds).
pub fn swa_dead(protected: u32, swa_floor: u32, swa_cursor: u32, ps: u32) -> (u32, u32) {
    let lo = swa_dead_lo(protected, swa_floor, ps);
    (lo, swa_cursor.max(lo))
}

impl Req {
    /// The recurrent-state handles in the order they are freed (`aux`, then the track
    /// entries by position); `-1` marks an empty one.
    pub fn aux_handles(&self) -> [i64; 3] {
        [self.aux_state, self.aux_track[0], self.aux_track[1]]
    }

    /// Refuses a req naming one recurrent-state handle twice: a release would free it twice.
    #[inline]
    pub fn check_aux_handles(&self) -> Result<()> {
        let [a, t0, t1] = self.aux_handles();
        let twice = match () {
            _ if a != -1 && a == t0 => ("aux_state", "aux_track[0]", a),
            _ if a != -1 && a == t1 => ("aux_state", "aux_track[1]", a),
            _ if t0 != -1 && t0 == t1 => ("aux_track[0]", "aux_track[1]", t0),
            _ => return Ok(()),
        };
        bail!(
            InvalidArg,
            "{} and {} are both recurrent-state handle {}: a release would free it twice",
            twice.0,
            twice.1,
            twice.2
        )
    }

    /// The row this request holds, if any.
    #[inline]
    pub fn row(&self) -> Option<u32> {
        u32::try_from(self.req_pool_idx).ok()
    }

    /// The row, for operations that need one.
    #[inline]
    pub fn require_row(&self) -> Result<u32> {
        match self.row() {
            Some(r) => Ok(r),
            None => bail!(InvalidArg, "req_pool_idx -1: the req holds no row"),
        }
    }

    /// `swa_dead_lo` of this req.
    pub fn swa_dead_lo(&self, ps: u32) -> u32 {
        swa_dead_lo(self.cache_protected_len, self.swa_evict_floor, ps)
    }

    /// The finished length the engine reported (`-1` means all of `output_len`).
    pub fn finished(&self) -> u32 {
        u32::try_from(self.finished_len).unwrap_or(self.output_len)
    }

    /// The field checks of docs/concepts.md's request record, run by every function that
    /// takes a req.
    #[inline(always)]
    pub fn validate(&self, cfg: &Config) -> Result<()> {
        if self.fast_valid(cfg) {
            Ok(())
        } else {
            self.validate_slow(cfg)
        }
    }

    /// `validate`'s checks at once, each one compare and one branch that a valid req never
    /// takes (measured cheaper than folding them into one flag: a batch loop spilled the
    /// flags): a valid req is the rule, and the per-step calls run this for every request. The
    /// conditions are a little stricter than the rules (a req without a row and its protected
    /// length; the SWA cursor against allocated alone): a req that fails them goes through the
    /// slow path, `validate_slow`, which also names the first field that is wrong (the split is
    /// `step_checks`').
    #[inline(always)]
    pub fn fast_valid(&self, cfg: &Config) -> bool {
        ((self.req_pool_idx as u32).wrapping_add(1) <= cfg.num_rows)
            && super::page::is_aligned(self.cache_protected_len, cfg.page_size)
            && self.fast_valid_lengths(cfg)
    }

    /// `fast_valid` less its row and protected-alignment checks, for a req that is also
    /// matched against its row's records: the row was found in the row tables (`num_rows`
    /// entries), and a protected length equal to the row's is page-aligned (a row's always is;
    /// the audit checks it).
    #[inline(always)]
    pub fn fast_valid_lengths(&self, cfg: &Config) -> bool {
        let r = self;
        (r.kv_committed_len <= r.kv_allocated_len)
            && (r.cache_protected_len <= r.kv_committed_len)
            && (r.kv_allocated_len <= cfg.max_context_len)
            && (r.swa_evict_floor <= cfg.max_context_len)
            && (r.swa_evicted_seqlen <= r.kv_allocated_len)
            && ((r.finished_len as u32).wrapping_add(1) <= r.output_len.wrapping_add(1))
    }

    /// `validate`'s checks one by one, in the documented order of errors.
    #[cold]
    #[inline(never)]
    fn validate_slow(&self, cfg: &Config) -> Result<()> {
        let r = self;
        if r.req_pool_idx < -1 || (r.req_pool_idx >= 0 && r.req_pool_idx as u32 >= cfg.num_rows) {
            bail!(InvalidArg, "req_pool_idx {} out of range [-1, {})", r.req_pool_idx, cfg.num_rows);
        }
        if r.kv_committed_len > r.kv_allocated_len {
            bail!(InvalidArg, "kv_committed_len {} > kv_allocated_len {}", r.kv_committed_len, r.kv_allocated_len);
        }
        if r.req_pool_idx >= 0 && r.cache_protected_len > r.kv_committed_len {
            bail!(
                InvalidArg,
                "cache_protected_len {} > kv_committed_len {}",
                r.cache_protected_len,
                r.kv_committed_len
            );
        }
        if !super::page::is_aligned(r.cache_protected_len, cfg.page_size) {
            bail!(
                InvalidArg,
                "cache_protected_len {} is not a multiple of page_size {}",
                r.cache_protected_len,
                cfg.page_size
            );
        }
        if r.kv_allocated_len > cfg.max_context_len {
            bail!(InvalidArg, "kv_allocated_len {} > max_context_len {}", r.kv_allocated_len, cfg.max_context_len);
        }
        if r.swa_evict_floor > cfg.max_context_len {
            bail!(InvalidArg, "swa_evict_floor {} > max_context_len {}", r.swa_evict_floor, cfg.max_context_len);
        }
        // A window step raises the cursor to swa_dead_lo first, which may lie past what is
        // allocated yet (a floor inside the last page rounds up); frees never reach past it.
        let dead_lo = r.swa_dead_lo(cfg.page_size);
        if r.swa_evicted_seqlen > r.kv_allocated_len.max(dead_lo) {
            bail!(
                InvalidArg,
                "swa_evicted_seqlen {} > max(kv_allocated_len {}, swa_dead_lo {dead_lo})",
                r.swa_evicted_seqlen,
                r.kv_allocated_len
            );
        }
        if r.finished_len < -1 || (r.finished_len >= 0 && r.finished_len as u32 > r.output_len) {
            bail!(InvalidArg, "finished_len {} out of range [-1, {}] (output_len)", r.finished_len, r.output_len);
        }
        Ok(())
    }

    /// The req holding `row` (-1: none), stamped `generation`, with nothing of it mapped: its
    /// lengths, window cursor and floor 0; the rest (turn lengths, lock, handles) stays.
    pub fn set_row(&mut self, row: i32, generation: u32) {
        let empty = Req { req_pool_idx: row, row_generation: generation, ..Req::default() };
        *self = Req {
            origin_input_len: self.origin_input_len,
            output_len: self.output_len,
            finished_len: self.finished_len,
            lock_node: self.lock_node,
            lock_receipt: self.lock_receipt,
            aux_state: self.aux_state,
            aux_track: self.aux_track,
            ..empty
        };
    }

    /// The req after a finish or release: it holds nothing; `origin_input_len`,
    /// `output_len` and `finished_len` stay.
    pub fn clear_kv(&mut self) {
        *self = Req {
            origin_input_len: self.origin_input_len,
            output_len: self.output_len,
            finished_len: self.finished_len,
            ..Req::default()
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> Config {
        Config {
            page_size: 16,
            num_token_slots: 1024,
            num_rows: 8,
            max_context_len: 256,
            aligned_reuse: false,
            swa_num_token_slots: 0,
            tier: Default::default(),
        }
    }

    fn held(committed: u32, allocated: u32) -> Req {
        Req { req_pool_idx: 0, kv_committed_len: committed, kv_allocated_len: allocated, ..Req::default() }
    }

    #[test]
    fn valid_reqs_pass() {
        assert!(Req::default().validate(&cfg()).is_ok());
        assert!(Req { cache_protected_len: 16, ..held(20, 40) }.validate(&cfg()).is_ok());
    }

    #[test]
    fn the_one_pass_check_accepts_only_what_the_ordered_checks_accept() {
        // Every field over values around each bound (page size 16, 8 rows, max 256).
        let rows = [-3, -2, -1, 0, 7, 8, i32::MAX];
        let lens = [0, 1, 15, 16, 17, 255, 256, 257, u32::MAX];
        let finished = [i32::MIN, -2, -1, 0, 1, 16, i32::MAX];
        let mut seen = 0;
        for &row in &rows {
            for &committed in &lens {
                for &allocated in &lens {
                    for &protected in &lens {
                        for &swa in &lens[..6] {
                            for &finished_len in &finished {
                                for output_len in [0, 1, 16, u32::MAX] {
                                    let r = Req {
                                        req_pool_idx: row,
                                        kv_committed_len: committed,
                                        kv_allocated_len: allocated,
                                        cache_protected_len: protected,
                                        swa_evicted_seqlen: swa,
                                        swa_evict_floor: protected / 2 + 7,
                                        finished_len,
                                        output_len,
                                        ..Req::default()
                                    };
                                    let ok = r.validate(&cfg()).is_ok();
                                    assert_eq!(ok, r.validate_slow(&cfg()).is_ok(), "{r:?}");
                                    seen += ok as u32;
                                }
                            }
                        }
                    }
                }
            }
        }
        assert!(seen > 1000, "the grid holds valid reqs too: {seen}");
    }

    #[test]
    fn each_bad_field_is_refused() {
        let bad = [
            Req { req_pool_idx: 8, ..Req::default() },
            Req { req_pool_idx: -2, ..Req::default() },
            held(41, 40),
            Req { cache_protected_len: 32, ..held(20, 40) },
            Req { cache_protected_len: 8, ..held(20, 40) },
            held(20, 257),
            Req { swa_evicted_seqlen: 41, ..held(20, 40) },
            Req { finished_len: 3, output_len: 2, ..held(0, 0) },
            Req { finished_len: -2, ..held(0, 0) },
        ];
        for r in bad {
            assert!(matches!(r.validate(&cfg()), Err(crate::core::Error::InvalidArg(_))), "{r:?}");
        }
    }

    #[test]
    fn protected_past_committed_is_allowed_without_a_row() {
        assert!(Req { cache_protected_len: 16, ..Req::default() }.validate(&cfg()).is_ok());
    }

    #[test]
    fn swa_dead_lo_as_sglang() {
        // sglang's ReqKvInfo.swa_dead_lo on the same inputs: 16, 8, 13.
        assert_eq!(swa_dead_lo(8, 13, 4), 16, "a floor above the prefix rounds up to a page");
        assert_eq!(swa_dead_lo(8, 5, 4), 8);
        assert_eq!(swa_dead_lo(0, 13, 1), 13);
        assert_eq!(swa_dead(8, 13, 12, 4), (16, 16), "a cursor below dead_lo frees nothing full-only");
        assert_eq!(swa_dead(8, 13, 24, 4), (16, 24));
    }

    #[test]
    fn a_cursor_raised_to_dead_lo_may_pass_allocated() {
        let r = Req { swa_evict_floor: 13, swa_evicted_seqlen: 16, ..held(13, 13) };
        assert!(r.validate(&cfg()).is_ok(), "swa_dead_lo is 16: the floor 13 rounded up to a page");
        assert!(Req { swa_evicted_seqlen: 17, ..r }.validate(&cfg()).is_err());
    }

    #[test]
    fn each_field_reads_and_writes_through_the_table() {
        let r = Req {
            req_pool_idx: 3,
            row_generation: 4,
            kv_committed_len: 5,
            kv_allocated_len: 6,
            cache_protected_len: 7,
            swa_evicted_seqlen: 8,
            swa_evict_floor: 9,
            origin_input_len: 10,
            output_len: 11,
            finished_len: 12,
            lock_node: u64::MAX,
            lock_receipt: 14,
            aux_state: 15,
            aux_track: [16, 17],
        };
        let mut copy = Req::default();
        for f in &Req::FIELDS {
            assert!((f.set)(&mut copy, (f.get)(&r)), "{}", f.name);
            assert_eq!((f.get)(&copy), (f.get)(&r), "{}", f.name);
        }
        assert_eq!(copy, r, "every field is in the table");
        let field = |name| Req::FIELDS.iter().find(|f| f.name == name).unwrap();
        assert_eq!((field("lock_node").get)(&r).to_string(), "18446744073709551615");
        assert_eq!((field("aux_track").get)(&r).to_string(), "[16,17]");
        for (name, bad) in [
            ("req_pool_idx", FieldValue::One(1 << 31)),
            ("kv_committed_len", FieldValue::One(-1)),
            ("lock_node", FieldValue::One(1 << 64)),
            ("aux_track", FieldValue::One(0)),
            ("aux_state", FieldValue::Pair([0, 0])),
        ] {
            assert!(!(field(name).set)(&mut copy, bad), "{name} takes {bad}");
        }
        assert_eq!(copy, r, "a refused value writes nothing");
    }

    #[test]
    fn configs() {
        assert!(cfg().validate_owned().is_ok());
        assert!(Config { page_size: 0, ..cfg() }.validate().is_err());
        assert!(Config { num_rows: 0, ..cfg() }.validate().is_err());
        assert!(Config { num_token_slots: 1000, ..cfg() }.validate_owned().is_err());
        assert!(Config { num_token_slots: 16, ..cfg() }.validate_owned().is_err());
        assert!(Config { swa_num_token_slots: 512, ..cfg() }.validate_owned().is_ok());
        for bad in [16, 24, (1 << 31) + 16] {
            assert!(Config { swa_num_token_slots: bad, ..cfg() }.validate_owned().is_err(), "{bad}");
        }
    }
}
