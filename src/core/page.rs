//! Page arithmetic. Computed in u64 so a length near `u32::MAX` cannot wrap.

/// `(x / ps, x % ps)`. Page sizes are nearly always powers of two, where a shift and a mask
/// replace the division: a division's latency sat on the per-step calls' critical path (the
/// page a new token lands in is read through it). The power-of-two test is the bit trick, not
/// `is_power_of_two`: without `popcnt` in the baseline x86-64 target that is a dozen
/// instructions, and a per-step call runs this several times a request.
#[inline(always)]
pub fn div_rem(x: u32, ps: u32) -> (u32, u32) {
    if ps & ps.wrapping_sub(1) == 0 {
        (x >> ps.trailing_zeros(), x & (ps - 1))
    } else {
        (x / ps, x % ps)
    }
}

/// Whether `x` is a whole number of pages.
#[inline]
pub fn is_aligned(x: u32, ps: u32) -> bool {
    div_rem(x, ps).1 == 0
}

/// `ceil(x / ps) * ps`.
#[inline]
pub fn ceil_align(x: u32, ps: u32) -> u64 {
    pages_for(x, ps) as u64 * ps as u64
}

/// `floor(x / ps) * ps`.
#[inline]
pub fn floor_align(x: u32, ps: u32) -> u32 {
    x - div_rem(x, ps).1
}

/// Pages needed to map `len` tokens.
#[inline(always)]
pub fn pages_for(len: u32, ps: u32) -> u32 {
    let (whole, rest) = div_rem(len, ps);
    whole + (rest != 0) as u32
}

/// The KV slot (token index) of position `pos` in a row whose pages are `pages`: the page
/// the position falls in, times the page size, plus the offset inside it.
#[inline(always)]
pub fn token_slot(pages: &[u32], ps: u32, pos: u32) -> i32 {
    let (page, offset) = div_rem(pos, ps);
    (pages[page as usize] * ps + offset) as i32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alignment() {
        assert_eq!(ceil_align(0, 16), 0);
        assert_eq!(ceil_align(17, 16), 32);
        assert_eq!(ceil_align(32, 16), 32);
        assert_eq!(ceil_align(u32::MAX, 16), 1 << 32);
        assert_eq!(floor_align(17, 16), 16);
        assert_eq!(floor_align(15, 16), 0);
        assert_eq!(floor_align(7, 1), 7);
        assert_eq!(pages_for(0, 4), 0);
        assert_eq!(pages_for(5, 4), 2);
        assert_eq!(token_slot(&[3, 7], 4, 0), 12);
        assert_eq!(token_slot(&[3, 7], 4, 6), 30);
        // A page size that is no power of two takes the division.
        assert_eq!(ceil_align(7, 3), 9);
        assert_eq!(ceil_align(u32::MAX, 3), u32::MAX as u64);
        assert_eq!(floor_align(7, 3), 6);
        assert_eq!(pages_for(7, 3), 3);
        assert_eq!(pages_for(u32::MAX, 1), u32::MAX);
        assert_eq!(token_slot(&[3, 7], 3, 4), 22);
        assert!(is_aligned(48, 16) && !is_aligned(47, 16) && is_aligned(9, 3) && !is_aligned(10, 3));
    }
}
