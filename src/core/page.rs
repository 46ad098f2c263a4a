//! Page arithmetic. Computed in u64 so a length near `u32::MAX` cannot wrap.

/// `ceil(x / ps) * ps`.
pub fn ceil_align(x: u32, ps: u32) -> u64 {
    (x as u64).div_ceil(ps as u64) * ps as u64
}

/// `floor(x / ps) * ps`.
pub fn floor_align(x: u32, ps: u32) -> u32 {
    x - x % ps
}

/// Pages needed to map `len` tokens.
pub fn pages_for(len: u32, ps: u32) -> u32 {
    len.div_ceil(ps)
}

/// The KV slot (token index) of position `pos` in a row whose pages are `pages`: the page
/// the position falls in, times the page size, plus the offset inside it.
pub fn token_slot(pages: &[u32], ps: u32, pos: u32) -> i32 {
    (pages[(pos / ps) as usize] * ps + pos % ps) as i32
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
    }
}
