//! Capped exponential backoff: the one retry schedule of the runtime
//! (reconnects, failed due work, blocked consumers waiting for Redis).

use std::time::Duration;

/// Waits that start at `min` and double up to `max`.
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    min: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    /// A backoff from `min` doubling up to `max` (`max` is raised to `min`
    /// if smaller).
    pub(crate) fn new(min: Duration, max: Duration) -> Backoff {
        let max = max.max(min);
        Backoff {
            min,
            max,
            next: min,
        }
    }

    /// The wait before the next attempt; doubles the one after it.
    pub(crate) fn step(&mut self) -> Duration {
        let d = self.next;
        self.next = self.next.saturating_mul(2).min(self.max);
        d
    }

    /// Back to `min` (after a success).
    pub(crate) fn reset(&mut self) {
        self.next = self.min;
    }

    /// The wait before attempt `failures + 1` after `failures` failures in
    /// a row (`failures >= 1`), without keeping state.
    pub(crate) fn nth(min: Duration, max: Duration, failures: u32) -> Duration {
        let shift = failures.saturating_sub(1).min(31);
        min.saturating_mul(1 << shift).min(max.max(min))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn doubles_up_to_the_cap_and_resets() {
        let mut b = Backoff::new(10 * MS, 50 * MS);
        let waits: Vec<_> = (0..5).map(|_| b.step()).collect();
        assert_eq!(waits, [10 * MS, 20 * MS, 40 * MS, 50 * MS, 50 * MS]);
        b.reset();
        assert_eq!(b.step(), 10 * MS);
    }

    #[test]
    fn nth_matches_the_stateful_schedule_and_never_overflows() {
        let mut b = Backoff::new(100 * MS, 5_000 * MS);
        for n in 1..40 {
            assert_eq!(
                Backoff::nth(100 * MS, 5_000 * MS, n),
                b.step(),
                "failure {n}"
            );
        }
        assert_eq!(
            Backoff::nth(Duration::MAX, Duration::MAX, u32::MAX),
            Duration::MAX
        );
    }
}
