//! Leases: their limits, and the process-wide monotonic nanosecond clock
//! that lease deadlines are kept on.

use std::sync::LazyLock;
use std::time::{Duration, Instant};

/// The default watchdog lease.
pub const DEFAULT_WATCHDOG_LEASE: Duration = Duration::from_secs(30);
/// Shortest watchdog lease (renewed every 33 ms).
pub const MIN_WATCHDOG_LEASE: Duration = Duration::from_millis(100);
/// Longest lease, watchdog or explicit.
pub const MAX_LEASE: Duration = Duration::from_secs(86_400 * 365);

/// Nanoseconds on a process-wide monotonic clock (for lease deadlines).
pub(crate) fn now_ns() -> u64 {
    static BASE: LazyLock<Instant> = LazyLock::new(Instant::now);
    BASE.elapsed().as_nanos() as u64
}

/// Nanoseconds in `d`, saturating.
pub(crate) fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// A lease in whole ms, at least 1.
pub(crate) fn lease_ms(lease: Duration) -> u64 {
    (ns(lease) / 1_000_000).max(1)
}
