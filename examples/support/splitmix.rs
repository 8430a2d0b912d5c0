//! SplitMix64, the generator that `shared/BENCHMARKS.md` and the peer
//! harnesses draw delays from, so that both sides of a comparison get the
//! same sequence. Shared by the bench examples and `benches/timer.rs`.

/// A SplitMix64 state; `SplitMix64(seed)`.
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    /// The next 64 random bits.
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// `lo + x mod (hi - lo + 1)`, as the harnesses reduce to a range.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
}

/// `n` delays in `[lo, hi]` ms from `seed`: the Netty harness's `delaysMs`.
#[allow(dead_code)] // not every bench that includes this file uses it
pub fn delays_ms(n: usize, lo: u64, hi: u64, seed: u64) -> Vec<u64> {
    let mut rng = SplitMix64(seed);
    (0..n).map(|_| rng.range(lo, hi)).collect()
}
