//! The random side of the workload: one seeded stream decides everything, so a seed
//! replays the same calls (and libskv's deterministic allocator the same indices).

use crate::cli::Args;

/// Turns that end at a stop token before `max_new_tokens` (the rest run to the limit).
const STOP_TOKEN_RATE: f64 = 0.5;

/// xorshift64* seeded through splitmix64, so nearby seeds give unrelated streams and the
/// state is never zero.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        Rng((z ^ (z >> 31)) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// True with probability `p` (exactly never for 0, always for 1).
    pub fn chance(&mut self, p: f64) -> bool {
        ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64) < p
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u32, hi: u32) -> u32 {
        lo + (self.next_u64() % (hi as u64 - lo as u64 + 1)) as u32
    }

    /// Uniform in `0..n`, `n > 0`.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// Draft tokens a verify round accepts: drafts are checked in order and the first
    /// rejection discards the rest.
    pub fn accepted(&mut self, k: u32, p: f64) -> u32 {
        (0..k).take_while(|_| self.chance(p)).count() as u32
    }
}

/// What one turn will do, decided when it is admitted.
#[derive(Clone, Copy)]
pub struct TurnPlan {
    /// New user tokens appended to the session's history.
    pub user_tokens: u32,
    /// Tokens the turn really produces (`finished_len`); the last verify round overshoots it.
    pub finish_at: u32,
    /// The client goes away once this many tokens are out.
    pub abort_at: Option<u32>,
    /// The scheduler rejects the turn once after matching; it is matched again.
    pub retry: bool,
}

impl TurnPlan {
    pub fn draw(a: &Args, rng: &mut Rng) -> TurnPlan {
        let user_tokens = rng.range(a.prompt_min, a.prompt_max);
        let finish_at = if rng.chance(STOP_TOKEN_RATE) { rng.range(1, a.max_new_tokens) } else { a.max_new_tokens };
        let abort_at = rng.chance(a.abort_rate).then(|| rng.range(0, finish_at - 1));
        TurnPlan { user_tokens, finish_at, abort_at, retry: rng.chance(a.retry_rate) }
    }
}
