//! A session's KV as a movable unit: the byte form `Cache::export` writes and `Cache::import`
//! reads (`unit_ops`). A unit names an idle session slot's own pages (those past its protected
//! prefix, which stays with the engine's tree), its lengths, window cursor and floor, and which
//! recurrent-state handles it holds; the KV bytes themselves are the engine's to copy.
//!
//! Version 1, in the writer's byte order (a unit is refused, never swapped, on a machine of the
//! other order): a 104-byte header, then `n_full` then `n_swa` i32 page ids.
//!
//! ```text
//!  0 u32 magic 0x55564B53                         4 u32 byte_order 0x01020304   8 u16 version
//! 10 u16 header_len     12 u32 flags              16 u32 page_size             20 u32 pools
//! 24 u32 swa_window     28 u32 epoch       32 u64 kv_layout_id          40 u64 session_id
//! 48 u64 branch_id      56 u32 committed          60 u32 allocated             64 u32 protected
//! 68 u32 swa_cursor     72 u32 swa_floor          76 u32 aux_mask              80 u32 n_full
//! 84 u32 n_swa          88 u64 total_len (bytes, header included)
//! 96 u64 origin (a move's: the session's incarnation, `transfer`; 0 in a copy's)
//! ```
//!
//! A later version appends to the header (`header_len` says where the ids start); a reader of
//! this version refuses it (`Unsupported`). The fingerprint (page size, pools, window, the
//! engine's KV layout id) must equal the destination's.

use super::error::{bail, Result};
use super::page::{is_aligned, pages_for};
use super::req::swa_dead;

/// The unit's first field: the bytes "SKVU" on a little-endian machine.
pub(crate) const UNIT_MAGIC: u32 = 0x5556_4B53;
/// Written as a native u32: a reader of the other byte order sees it swapped.
pub(crate) const UNIT_BYTE_ORDER: u32 = 0x0102_0304;
/// The version this library writes and reads.
pub(crate) const UNIT_VERSION: u16 = 1;
/// Bytes before the page ids in version 1.
pub(crate) const UNIT_HEADER_LEN: usize = 104;
/// `flags`: the ids are host-tier pages (the slot was parked), not device pages.
pub(crate) const UNIT_FLAG_HOST_PAGES: u32 = 1;
/// `flags`: the SWA side stays the engine's (external mode with SWA frees): the engine's rows
/// name its SWA slots, libskv does not, so the unit carries no SWA ids (`n_swa` 0) and the
/// engine's copy carries that side with its own indices.
pub(crate) const UNIT_FLAG_ENGINE_SWA: u32 = 2;
/// `flags`: the unit moves the session (`transfer`): it carries an epoch (> 0) and the whole
/// session from position 0 (`protected` 0: the source's prefix travels as the session's own).
pub(crate) const UNIT_FLAG_MOVE: u32 = 4;
/// `pools`: the full-attention pool.
pub(crate) const UNIT_POOL_FULL: u32 = 1;
/// `pools`: a sliding-window pool beside it.
pub(crate) const UNIT_POOL_SWA: u32 = 2;

/// The byte offset of each header field.
pub(crate) mod at {
    pub(crate) const MAGIC: usize = 0;
    pub(crate) const BYTE_ORDER: usize = 4;
    pub(crate) const VERSION: usize = 8;
    pub(crate) const HEADER_LEN: usize = 10;
    pub(crate) const FLAGS: usize = 12;
    pub(crate) const PAGE_SIZE: usize = 16;
    pub(crate) const POOLS: usize = 20;
    pub(crate) const SWA_WINDOW: usize = 24;
    pub(crate) const EPOCH: usize = 28;
    pub(crate) const KV_LAYOUT_ID: usize = 32;
    pub(crate) const SESSION: usize = 40;
    pub(crate) const BRANCH: usize = 48;
    pub(crate) const COMMITTED: usize = 56;
    pub(crate) const ALLOCATED: usize = 60;
    pub(crate) const PROTECTED: usize = 64;
    pub(crate) const SWA_CURSOR: usize = 68;
    pub(crate) const SWA_FLOOR: usize = 72;
    pub(crate) const AUX_MASK: usize = 76;
    pub(crate) const N_FULL: usize = 80;
    pub(crate) const N_SWA: usize = 84;
    pub(crate) const TOTAL_LEN: usize = 88;
    pub(crate) const ORIGIN: usize = 96;
}

/// What a unit must share with the cache that imports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Fingerprint {
    pub page_size: u32,
    /// `UNIT_POOL_FULL`, plus `UNIT_POOL_SWA` with a sliding-window pool.
    pub pools: u32,
    pub swa_window: u32,
    pub kv_layout_id: u64,
}

/// A unit's header: everything but the ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct UnitHeader {
    pub flags: u32,
    pub fingerprint: Fingerprint,
    pub session: u64,
    pub branch: u64,
    pub committed: u32,
    pub allocated: u32,
    pub protected: u32,
    pub swa_cursor: u32,
    pub swa_floor: u32,
    /// Bit i set: handle i of `[aux_state, aux_track[0], aux_track[1]]` is not -1.
    pub aux_mask: u32,
    pub n_full: u32,
    pub n_swa: u32,
    /// A move's epoch (`transfer`); 0 in a copy's unit.
    pub epoch: u32,
    /// A move's session incarnation (`transfer`): a random id its first move drew, carried by
    /// every later one; 0 in a copy's unit.
    pub origin: u64,
}

impl UnitHeader {
    /// Bytes of the whole unit (version 1).
    pub fn unit_len(&self) -> usize {
        UNIT_HEADER_LEN + 4 * (self.n_full as usize + self.n_swa as usize)
    }

    /// Writes the header into `buf[..104]` (the caller checked `buf` holds the unit).
    pub(crate) fn write(&self, buf: &mut [u8]) {
        let f = &self.fingerprint;
        let b = &mut buf[..UNIT_HEADER_LEN];
        put32(b, at::MAGIC, UNIT_MAGIC);
        put32(b, at::BYTE_ORDER, UNIT_BYTE_ORDER);
        b[at::VERSION..at::VERSION + 2].copy_from_slice(&UNIT_VERSION.to_ne_bytes());
        b[at::HEADER_LEN..at::HEADER_LEN + 2].copy_from_slice(&(UNIT_HEADER_LEN as u16).to_ne_bytes());
        put32(b, at::FLAGS, self.flags);
        put32(b, at::PAGE_SIZE, f.page_size);
        put32(b, at::POOLS, f.pools);
        put32(b, at::SWA_WINDOW, f.swa_window);
        put32(b, at::EPOCH, self.epoch);
        put64(b, at::KV_LAYOUT_ID, f.kv_layout_id);
        put64(b, at::SESSION, self.session);
        put64(b, at::BRANCH, self.branch);
        put32(b, at::COMMITTED, self.committed);
        put32(b, at::ALLOCATED, self.allocated);
        put32(b, at::PROTECTED, self.protected);
        put32(b, at::SWA_CURSOR, self.swa_cursor);
        put32(b, at::SWA_FLOOR, self.swa_floor);
        put32(b, at::AUX_MASK, self.aux_mask);
        put32(b, at::N_FULL, self.n_full);
        put32(b, at::N_SWA, self.n_swa);
        put64(b, at::TOTAL_LEN, self.unit_len() as u64);
        put64(b, at::ORIGIN, self.origin);
    }

    /// The SWA pages a slot of these lengths holds past its prefix, one flag a page: false
    /// where the window passed the whole page (`[swa_dead_lo, swa_cursor)` covers it).
    pub(crate) fn swa_live(&self, ps: u32) -> impl Iterator<Item = bool> {
        let first = pages_for(self.protected, ps);
        let dead = swa_dead(self.protected, self.swa_floor, self.swa_cursor, ps);
        (first..first + self.n_full)
            .map(move |i| !(dead.0 as u64 <= i as u64 * ps as u64 && (i as u64 + 1) * ps as u64 <= dead.1 as u64))
    }
}

/// Writes `ids` as i32 page ids from `out`'s start, one pass; returns the bytes written.
#[inline]
pub(crate) fn write_ids(out: &mut [u8], ids: impl IntoIterator<Item = u32>) -> usize {
    let mut n = 0;
    for (o, id) in out.chunks_exact_mut(4).zip(ids) {
        o.copy_from_slice(&(id as i32).to_ne_bytes());
        n += 4;
    }
    n
}

fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_ne_bytes());
}

fn put64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_ne_bytes());
}

fn get16(b: &[u8], at: usize) -> u16 {
    u16::from_ne_bytes(b[at..at + 2].try_into().expect("2 bytes"))
}

fn get32(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn get64(b: &[u8], at: usize) -> u64 {
    u64::from_ne_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// A unit that passed `read_unit`'s checks, borrowing its bytes.
#[derive(Debug, Clone, Copy)]
pub struct Unit<'a> {
    pub header: UnitHeader,
    ids: &'a [u8],
}

impl Unit<'_> {
    /// The full pool's page ids, in page order.
    pub fn full(&self) -> impl Iterator<Item = i32> + '_ {
        self.id_run(0, self.header.n_full)
    }

    /// The SWA pool's page ids of the pages the window still holds, in page order.
    pub fn swa(&self) -> impl Iterator<Item = i32> + '_ {
        self.id_run(self.header.n_full, self.header.n_swa)
    }

    fn id_run(&self, from: u32, n: u32) -> impl Iterator<Item = i32> + '_ {
        let bytes = &self.ids[4 * from as usize..4 * (from + n) as usize];
        bytes.chunks_exact(4).map(|c| i32::from_ne_bytes(c.try_into().expect("4 bytes")))
    }
}

/// The destination's limits a unit must fit: its fingerprint and `max_context_len`.
#[derive(Debug, Clone, Copy)]
pub struct Destination {
    pub fingerprint: Fingerprint,
    pub max_context_len: u32,
}

/// Reads a unit, checking it against the destination; the first failing check is named with
/// its field and value (`InvalidArg`; a later version is `Unsupported`).
pub fn read_unit<'a>(bytes: &'a [u8], dest: &Destination) -> Result<Unit<'a>> {
    let len = bytes.len();
    if len < UNIT_HEADER_LEN {
        bail!(InvalidArg, "unit of {len} bytes is shorter than its {UNIT_HEADER_LEN}-byte header");
    }
    let magic = get32(bytes, at::MAGIC);
    if magic == UNIT_MAGIC.swap_bytes() {
        bail!(
            InvalidArg,
            "unit magic {magic:#010x}: written on a machine of the other byte order (units are never swapped)"
        );
    }
    if magic != UNIT_MAGIC {
        bail!(InvalidArg, "unit magic {magic:#010x} is not {UNIT_MAGIC:#010x} : not a libskv session unit");
    }
    match get32(bytes, at::BYTE_ORDER) {
        UNIT_BYTE_ORDER => {}
        o if o == UNIT_BYTE_ORDER.swap_bytes() => bail!(
            InvalidArg,
            "unit byte_order {o:#010x}: written on a machine of the other byte order (units are never swapped)"
        ),
        o => bail!(InvalidArg, "unit byte_order {o:#010x} is not {UNIT_BYTE_ORDER:#010x}"),
    }
    match get16(bytes, at::VERSION) {
        0 => bail!(InvalidArg, "unit version 0: versions start at 1"),
        v if v > UNIT_VERSION => bail!(Unsupported, "unit version {v}: this library reads version {UNIT_VERSION}"),
        _ => {}
    }
    let header_len = get16(bytes, at::HEADER_LEN) as usize;
    if header_len < UNIT_HEADER_LEN {
        bail!(InvalidArg, "unit header_len {header_len} < {UNIT_HEADER_LEN}");
    }
    let h = header(bytes);
    let total = get64(bytes, at::TOTAL_LEN);
    let want = header_len as u64 + 4 * (h.n_full as u64 + h.n_swa as u64);
    if total != len as u64 || total != want {
        bail!(
            InvalidArg,
            "unit total_len {total}: the unit is {len} bytes and header_len {header_len} with n_full {} and n_swa {} \
             make {want}",
            h.n_full,
            h.n_swa
        );
    }
    check_fingerprint(&h.fingerprint, &dest.fingerprint)?;
    check_lengths(&h, dest.max_context_len)?;
    let unit = Unit { header: h, ids: &bytes[header_len..] };
    if let Some((i, id)) = unit.full().enumerate().find(|&(_, id)| id <= 0) {
        bail!(InvalidArg, "unit full[{i}] = {id}: page ids are > 0 (page 0 is padding)");
    }
    if let Some((i, id)) = unit.swa().enumerate().find(|&(_, id)| id <= 0) {
        bail!(InvalidArg, "unit swa[{i}] = {id}: page ids are > 0 (page 0 is padding)");
    }
    Ok(unit)
}

/// The header's fields past the ones `read_unit` checks first.
fn header(b: &[u8]) -> UnitHeader {
    UnitHeader {
        flags: get32(b, at::FLAGS),
        fingerprint: Fingerprint {
            page_size: get32(b, at::PAGE_SIZE),
            pools: get32(b, at::POOLS),
            swa_window: get32(b, at::SWA_WINDOW),
            kv_layout_id: get64(b, at::KV_LAYOUT_ID),
        },
        session: get64(b, at::SESSION),
        branch: get64(b, at::BRANCH),
        committed: get32(b, at::COMMITTED),
        allocated: get32(b, at::ALLOCATED),
        protected: get32(b, at::PROTECTED),
        swa_cursor: get32(b, at::SWA_CURSOR),
        swa_floor: get32(b, at::SWA_FLOOR),
        aux_mask: get32(b, at::AUX_MASK),
        n_full: get32(b, at::N_FULL),
        n_swa: get32(b, at::N_SWA),
        epoch: get32(b, at::EPOCH),
        origin: get64(b, at::ORIGIN),
    }
}

fn check_fingerprint(got: &Fingerprint, want: &Fingerprint) -> Result<()> {
    let fields = [
        ("page_size", got.page_size as u64, want.page_size as u64),
        ("pools", got.pools as u64, want.pools as u64),
        ("swa_window", got.swa_window as u64, want.swa_window as u64),
        ("kv_layout_id", got.kv_layout_id, want.kv_layout_id),
    ];
    for (name, g, w) in fields {
        if g != w {
            bail!(InvalidArg, "unit {name} {g} != this cache's {w}: the unit's KV layout differs (fingerprint)");
        }
    }
    Ok(())
}

/// The lengths must be a slot's a req's checks accept, and the ids' counts must follow from
/// them.
fn check_lengths(h: &UnitHeader, max_context_len: u32) -> Result<()> {
    let ps = h.fingerprint.page_size;
    let known = UNIT_FLAG_HOST_PAGES | UNIT_FLAG_ENGINE_SWA | UNIT_FLAG_MOVE;
    if h.flags & !known != 0 {
        bail!(InvalidArg, "unit flags {:#x} has bits this version does not define (known: {known:#x})", h.flags);
    }
    let moving = h.flags & UNIT_FLAG_MOVE != 0;
    if moving != (h.epoch > 0) || moving != (h.origin != 0) || moving && h.protected != 0 {
        bail!(
            InvalidArg,
            "unit epoch {} origin {:#x} with flags {:#x} and protected {}: a move (flag {UNIT_FLAG_MOVE:#x}) has an \
             epoch and an origin, and protects nothing; a copy has neither",
            h.epoch,
            h.origin,
            h.flags,
            h.protected
        );
    }
    if h.committed > h.allocated {
        bail!(InvalidArg, "unit committed {} > allocated {}", h.committed, h.allocated);
    }
    if h.allocated > max_context_len {
        bail!(InvalidArg, "unit allocated {} > this cache's max_context_len {max_context_len}", h.allocated);
    }
    if h.protected > h.committed || !is_aligned(h.protected, ps) {
        bail!(
            InvalidArg,
            "unit protected {}: must be <= committed {} and a multiple of page_size {ps}",
            h.protected,
            h.committed
        );
    }
    if h.swa_floor > max_context_len {
        bail!(InvalidArg, "unit swa_floor {} > this cache's max_context_len {max_context_len}", h.swa_floor);
    }
    let (dead_lo, _) = swa_dead(h.protected, h.swa_floor, h.swa_cursor, ps);
    if h.swa_cursor > h.allocated.max(dead_lo) {
        bail!(InvalidArg, "unit swa_cursor {} > max(allocated {}, swa_dead_lo {dead_lo})", h.swa_cursor, h.allocated);
    }
    let swa = h.fingerprint.pools & UNIT_POOL_SWA != 0;
    if swa && h.swa_cursor > dead_lo && !is_aligned(h.swa_cursor, ps) {
        bail!(
            InvalidArg,
            "unit swa_cursor {} is not a multiple of page_size {ps}: past swa_dead_lo {dead_lo} a free splits there",
            h.swa_cursor
        );
    }
    if h.aux_mask > 0b111 {
        bail!(
            InvalidArg,
            "unit aux_mask {:#x}: only bits 0-2 (aux_state, aux_track[0], aux_track[1]) exist",
            h.aux_mask
        );
    }
    let n_full = pages_for(h.allocated, ps) - pages_for(h.protected, ps);
    if h.n_full != n_full {
        bail!(
            InvalidArg,
            "unit n_full {} != the {n_full} pages past protected {} up to allocated {} (page_size {ps})",
            h.n_full,
            h.protected,
            h.allocated
        );
    }
    let n_swa = match (swa, h.flags & UNIT_FLAG_ENGINE_SWA != 0) {
        (false, true) => {
            bail!(InvalidArg, "unit flags {:#x} name the engine's SWA side, but pools has no SWA pool", h.flags)
        }
        (false, false) | (true, true) => 0,
        (true, false) => h.swa_live(ps).filter(|&l| l).count() as u32,
    };
    if h.n_swa != n_swa {
        bail!(
            InvalidArg,
            "unit n_swa {} != the {n_swa} SWA pages its window holds (pools {:#x}, flags {:#x}, swa_cursor {}, \
             swa_floor {})",
            h.n_swa,
            h.fingerprint.pools,
            h.flags,
            h.swa_cursor,
            h.swa_floor
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fp() -> Fingerprint {
        Fingerprint { page_size: 4, pools: UNIT_POOL_FULL | UNIT_POOL_SWA, swa_window: 8, kv_layout_id: 77 }
    }

    fn dest() -> Destination {
        Destination { fingerprint: fp(), max_context_len: 64 }
    }

    /// A slot of 30 tokens past a prefix of 8, whose window freed [8, 16): pages 2..8, the
    /// first two passed.
    fn unit() -> Vec<u8> {
        let h = UnitHeader {
            flags: 0,
            fingerprint: fp(),
            session: 5,
            branch: 6,
            committed: 29,
            allocated: 30,
            protected: 8,
            swa_cursor: 16,
            swa_floor: 0,
            aux_mask: 0b101,
            n_full: 6,
            n_swa: 4,
            epoch: 0,
            origin: 0,
        };
        let mut b = vec![0xAA; h.unit_len()];
        h.write(&mut b);
        let n = write_ids(&mut b[UNIT_HEADER_LEN..], [11, 12, 13, 14, 15, 16]);
        write_ids(&mut b[UNIT_HEADER_LEN + n..], [21, 22, 23, 24]);
        b
    }

    fn refused(b: &[u8]) -> String {
        match read_unit(b, &dest()) {
            Err(super::super::Error::InvalidArg(m)) => m,
            other => panic!("expected InvalidArg, got {other:?}"),
        }
    }

    #[test]
    fn a_written_unit_reads_back() {
        let b = unit();
        assert_eq!(b.len(), 104 + 40);
        assert_eq!(u32::from_le_bytes(*b"SKVU"), UNIT_MAGIC);
        #[cfg(target_endian = "little")]
        assert_eq!(&b[..4], b"SKVU", "the magic reads as text on a little-endian machine");
        let u = read_unit(&b, &dest()).unwrap();
        assert_eq!((u.header.session, u.header.branch, u.header.committed, u.header.aux_mask), (5, 6, 29, 0b101));
        assert_eq!(u.full().collect::<Vec<_>>(), [11, 12, 13, 14, 15, 16]);
        assert_eq!(u.swa().collect::<Vec<_>>(), [21, 22, 23, 24]);
        assert_eq!(u.header.swa_live(4).collect::<Vec<_>>(), [false, false, true, true, true, true]);
    }

    /// A unit written on a machine of the other byte order: every field swapped.
    #[test]
    fn a_foreign_unit_is_refused_never_swapped() {
        let mut b = unit();
        let fields32 = (0..UNIT_HEADER_LEN).step_by(4).filter(|&a| a != at::VERSION);
        for a in fields32.chain((UNIT_HEADER_LEN..b.len()).step_by(4)) {
            b[a..a + 4].reverse();
        }
        b[at::VERSION..at::VERSION + 2].reverse();
        b[at::HEADER_LEN..at::HEADER_LEN + 2].reverse();
        assert!(refused(&b).contains("other byte order"));
        // A unit whose magic alone is right still names its byte order.
        let mut b = unit();
        b[at::BYTE_ORDER..at::BYTE_ORDER + 4].reverse();
        assert!(refused(&b).contains("byte_order 0x04030201: written on a machine of the other byte order"));
    }

    #[test]
    fn a_longer_header_is_skipped() {
        let mut b = unit();
        b.splice(UNIT_HEADER_LEN..UNIT_HEADER_LEN, [0u8; 8]);
        b[at::HEADER_LEN..at::HEADER_LEN + 2].copy_from_slice(&112u16.to_ne_bytes());
        let len = b.len() as u64;
        put64(&mut b, at::TOTAL_LEN, len);
        let u = read_unit(&b, &dest()).unwrap();
        assert_eq!(u.full().next(), Some(11), "the ids start at header_len");
    }

    #[test]
    fn each_field_is_checked() {
        let set32 = |at: usize, v: u32| {
            let mut b = unit();
            put32(&mut b, at, v);
            refused(&b)
        };
        assert!(refused(&unit()[..103]).contains("103 bytes"));
        assert!(set32(at::MAGIC, 0x5556_4B54).contains("magic 0x55564b54"));
        assert!(set32(at::BYTE_ORDER, 0x04030201).contains("other byte order"));
        assert!(set32(at::BYTE_ORDER, 7).contains("byte_order 0x00000007"));
        let mut b = unit();
        b[at::VERSION..at::VERSION + 2].copy_from_slice(&2u16.to_ne_bytes());
        assert!(matches!(read_unit(&b, &dest()), Err(super::super::Error::Unsupported(m)) if m.contains("version 2")));
        b[at::VERSION..at::VERSION + 2].copy_from_slice(&0u16.to_ne_bytes());
        assert!(refused(&b).contains("version 0"));
        let mut b = unit();
        b[at::HEADER_LEN..at::HEADER_LEN + 2].copy_from_slice(&95u16.to_ne_bytes());
        assert!(refused(&b).contains("header_len 95"));
        assert!(refused(&unit()[..140]).contains("total_len 144: the unit is 140 bytes"));
        let mut b = unit();
        b.extend([0; 4]);
        assert!(refused(&b).contains("the unit is 148 bytes"));
        assert!(set32(at::TOTAL_LEN, 140).contains("total_len 140"));
        assert!(set32(at::EPOCH, 1).contains("unit epoch 1 origin 0x0 with flags 0x0"));
        assert!(set32(at::PAGE_SIZE, 8).contains("page_size 8 != this cache's 4"));
        assert!(set32(at::POOLS, 1).contains("pools 1 != this cache's 3"));
        assert!(set32(at::SWA_WINDOW, 9).contains("swa_window 9 != this cache's 8"));
        let mut b = unit();
        put64(&mut b, at::KV_LAYOUT_ID, 78);
        assert!(refused(&b).contains("kv_layout_id 78 != this cache's 77"));
        assert!(set32(at::FLAGS, 8).contains("flags 0x8"));
        assert!(set32(at::FLAGS, 4).contains("unit epoch 0 origin 0x0 with flags 0x4"));
        assert!(set32(at::COMMITTED, 31).contains("committed 31 > allocated 30"));
        assert!(set32(at::ALLOCATED, 65).contains("allocated 65 > this cache's max_context_len 64"));
        assert!(set32(at::PROTECTED, 6).contains("protected 6"));
        assert!(set32(at::PROTECTED, 30).contains("protected 30"));
        assert!(set32(at::SWA_FLOOR, 65).contains("swa_floor 65"));
        assert!(set32(at::SWA_CURSOR, 31).contains("swa_cursor 31"));
        assert!(set32(at::SWA_CURSOR, 18).contains("swa_cursor 18 is not a multiple"));
        assert!(set32(at::AUX_MASK, 8).contains("aux_mask 0x8"));
        assert!(set32(at::N_FULL, 5).contains("total_len"), "a count that disagrees with the length");
        assert!(set32(at::SWA_CURSOR, 20).contains("n_swa 4 != the 3 SWA pages"));
        assert!(set32(at::FLAGS, UNIT_FLAG_ENGINE_SWA).contains("n_swa 4 != the 0"));
        let mut b = unit();
        put32(&mut b, 104 + 8, 0);
        assert!(refused(&b).contains("full[2] = 0"));
        let mut b = unit();
        put32(&mut b, 104 + 24 + 12, u32::MAX);
        assert!(refused(&b).contains("swa[3] = -1"));
    }

    #[test]
    fn counts_must_follow_the_lengths() {
        // n_full and the total agree with each other but not with the lengths.
        let h = UnitHeader { allocated: 26, committed: 26, ..read_unit(&unit(), &dest()).unwrap().header };
        let mut b = unit();
        h.write(&mut b);
        assert!(refused(&b).contains("n_full 6 != the 5 pages"));
        let h = UnitHeader { fingerprint: Fingerprint { pools: UNIT_POOL_FULL, ..fp() }, ..h };
        let d = Destination { fingerprint: h.fingerprint, max_context_len: 64 };
        let mut b = unit();
        h.write(&mut b);
        assert!(read_unit(&b, &d).is_err_and(|e| e.to_string().contains("n_full 6 != the 5")));
    }
}
