//! Instants as the schedule code counts them: whole milliseconds since the
//! Unix epoch in an `i64` (an instant between two milliseconds counts as
//! the earlier one), so that no hot path divides 128-bit numbers.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::zone::{MAX_SECOND, MIN_SECOND};

/// The first and last millisecond occurrences may fall on.
pub(super) const MIN_MS: i64 = MIN_SECOND * 1000;
pub(super) const MAX_MS: i64 = MAX_SECOND * 1000;

/// Keeps a millisecond count within a second of the domain: what lies
/// further out has no occurrence anyway, and every sum below stays far
/// from overflowing.
pub(super) fn near_domain(ms: i64) -> i64 {
    ms.clamp(MIN_MS - 1000, MAX_MS + 1000)
}

/// `t` in whole milliseconds, rounded down.
pub(crate) fn floor_ms(t: SystemTime) -> i64 {
    near_domain(match t.duration_since(UNIX_EPOCH) {
        Ok(d) => millis(d),
        // Before the epoch: minus the duration, rounded up.
        Err(e) => {
            let d = e.duration();
            -(millis(d) + i64::from(d.subsec_nanos() % 1_000_000 != 0))
        }
    })
}

/// `t` in whole milliseconds, rounded up.
pub(super) fn ceil_ms(t: SystemTime) -> i64 {
    let down = floor_ms(t);
    let exact = from_ms(down) == Some(t);
    near_domain(down + i64::from(!exact))
}

/// Whole milliseconds of `d`, saturating far beyond the domain.
fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_secs())
        .unwrap_or(i64::MAX)
        .saturating_mul(1000)
        .saturating_add(i64::from(d.subsec_millis()))
}

/// The instant `ms` milliseconds after the epoch, if `SystemTime` holds it.
pub(crate) fn from_ms(ms: i64) -> Option<SystemTime> {
    let d = Duration::from_millis(ms.unsigned_abs());
    if ms >= 0 {
        UNIX_EPOCH.checked_add(d)
    } else {
        UNIX_EPOCH.checked_sub(d)
    }
}

/// The whole second at or before millisecond `ms`.
pub(super) fn floor_sec(ms: i64) -> i64 {
    ms.div_euclid(1000)
}

/// The whole second at or after millisecond `ms`.
pub(super) fn ceil_sec(ms: i64) -> i64 {
    ceil_div(ms, 1000)
}

/// `a / b` rounded up, for `b > 0`.
pub(super) fn ceil_div(a: i64, b: i64) -> i64 {
    -((-a).div_euclid(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_to_the_millisecond_goes_the_right_way_on_both_sides_of_the_epoch() {
        let at = |ns: i64| {
            let d = Duration::from_nanos(ns.unsigned_abs());
            if ns >= 0 {
                UNIX_EPOCH + d
            } else {
                UNIX_EPOCH - d
            }
        };
        for (ns, down, up) in [
            (0, 0, 0),
            (1, 0, 1),
            (999_999, 0, 1),
            (1_000_000, 1, 1),
            (1_500_000_000, 1500, 1500),
            (-1, -1, 0),
            (-1_000_000, -1, -1),
            (-1_000_001, -2, -1),
            (-2_500_000_000, -2500, -2500),
        ] {
            assert_eq!((floor_ms(at(ns)), ceil_ms(at(ns))), (down, up), "{ns} ns");
        }
        assert_eq!(
            (floor_sec(-1), ceil_sec(-1), floor_sec(1), ceil_sec(1)),
            (-1, 0, 0, 1)
        );
        assert_eq!(
            from_ms(-1500),
            Some(UNIX_EPOCH - Duration::from_millis(1500))
        );
        let far = UNIX_EPOCH + Duration::from_secs(1 << 40); // year 36,812
        assert_eq!(floor_ms(far), MAX_MS + 1000);
    }
}
