//! The `server − local` clock offset estimate.
//!
//! Due times live on the Redis server's clock (`TIME` inside the scripts),
//! so machines with skewed clocks agree. To put a wheel timeout at a
//! server instant, each process keeps one sample: the server's `TIME`
//! matched to the local instant halfway through the round trip that read
//! it, keeping the sample with the smallest round trip of a few. Local
//! instants are readings of the runtime timer's clock (a `Duration` since
//! its start), so a manual clock drives the estimate in tests too.

use std::time::Duration;

use parking_lot::Mutex;

/// One sample: server epoch µs at local clock reading `local`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct ClockSample {
    pub(crate) local: Duration,
    pub(crate) server_us: i64,
    pub(crate) rtt: Duration,
}

/// The current estimate; `None` before the first sample.
#[derive(Debug, Default)]
pub(crate) struct ServerClock {
    sample: Mutex<Option<ClockSample>>,
}

/// Farthest ahead a server instant is mapped (1 h); a farther one is
/// looked at again when that time comes.
pub(crate) const MAX_AHEAD: Duration = Duration::from_secs(3_600);

impl ServerClock {
    /// Replaces the estimate.
    pub(crate) fn set(&self, sample: ClockSample) {
        *self.sample.lock() = Some(sample);
    }

    /// The current sample.
    pub(crate) fn sample(&self) -> Option<ClockSample> {
        *self.sample.lock()
    }

    /// Shifts the estimate by `ms` (test hook: positive means "the server
    /// is further ahead than measured").
    pub(crate) fn skew(&self, ms: i64) {
        if let Some(s) = self.sample.lock().as_mut() {
            s.server_us += ms * 1_000;
        }
    }

    /// The local clock reading at which the server clock reads `due_ms`
    /// (epoch ms), at most [`MAX_AHEAD`] after `now`; `None` before any
    /// estimate.
    pub(crate) fn to_local(&self, due_ms: i64, now: Duration) -> Option<Duration> {
        let s = self.sample()?;
        let diff_us = due_ms.saturating_mul(1_000).saturating_sub(s.server_us);
        let at = if diff_us >= 0 {
            s.local
                .saturating_add(Duration::from_micros(diff_us as u64))
        } else {
            s.local
                .saturating_sub(Duration::from_micros(diff_us.unsigned_abs()))
        };
        Some(at.min(now.saturating_add(MAX_AHEAD)))
    }

    /// The server's clock at local reading `now`, in epoch ms; `None`
    /// before any estimate.
    pub(crate) fn server_ms_at(&self, now: Duration) -> Option<u64> {
        let s = self.sample()?;
        let us = if now >= s.local {
            s.server_us
                .saturating_add((now - s.local).as_micros().min(i64::MAX as u128) as i64)
        } else {
            s.server_us
                .saturating_sub((s.local - now).as_micros().min(i64::MAX as u128) as i64)
        };
        Some((us.max(0) / 1_000) as u64)
    }
}

/// Reads `TIME` three times on `con` and keeps the sample with the
/// smallest round trip. `now` reads the local clock.
pub(crate) fn measure(
    con: &mut dyn redis::ConnectionLike,
    now: &dyn Fn() -> Duration,
) -> redis::RedisResult<ClockSample> {
    let mut best: Option<ClockSample> = None;
    for _ in 0..3 {
        let t0 = now();
        let (secs, micros): (i64, i64) = redis::cmd("TIME").query(con)?;
        let t1 = now();
        let rtt = t1.saturating_sub(t0);
        let sample = ClockSample {
            local: t0 + rtt / 2,
            server_us: secs.saturating_mul(1_000_000).saturating_add(micros),
            rtt,
        };
        if best.is_none_or(|b| sample.rtt < b.rtt) {
            best = Some(sample);
        }
    }
    Ok(best.expect("three samples were taken"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn clock_at(local_ms: u64, server_ms: i64) -> ServerClock {
        let c = ServerClock::default();
        c.set(ClockSample {
            local: Duration::from_millis(local_ms),
            server_us: server_ms * 1_000,
            rtt: MS,
        });
        c
    }

    #[test]
    fn maps_server_instants_to_local_readings_both_ways() {
        let c = clock_at(1_000, 1_700_000_000_000);
        assert_eq!(c.to_local(1_700_000_000_250, 1_000 * MS), Some(1_250 * MS));
        assert_eq!(c.to_local(1_699_999_999_900, 1_000 * MS), Some(900 * MS));
        assert_eq!(c.server_ms_at(1_500 * MS), Some(1_700_000_000_500));
        assert_eq!(c.server_ms_at(500 * MS), Some(1_699_999_999_500));
    }

    #[test]
    fn far_instants_are_capped_at_an_hour_ahead_and_nothing_before_a_sample() {
        let c = clock_at(0, 0);
        assert_eq!(c.to_local(i64::MAX, 10 * MS), Some(10 * MS + MAX_AHEAD));
        assert_eq!(ServerClock::default().to_local(5, MS), None);
        assert_eq!(ServerClock::default().server_ms_at(MS), None);
    }

    #[test]
    fn skew_moves_the_estimate() {
        let c = clock_at(0, 10_000);
        c.skew(300);
        assert_eq!(c.to_local(10_300, Duration::ZERO), Some(Duration::ZERO));
    }
}
