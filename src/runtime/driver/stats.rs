//! What the driver counts: [`DriverStats`] (public, through
//! `Redwheel::driver_stats`), the atomic counters behind it, and the wheel
//! gauges of the `metrics` feature.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::telemetry::DriverMetrics;
use crate::timer::HashedWheelTimer;

/// Shortest time between two updates of the wheel gauges.
pub(super) const GAUGE_INTERVAL: Duration = Duration::from_millis(100);

/// Counters of what the driver did (diagnostics, benchmarks, tests).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DriverStats {
    /// Rounds sent.
    pub rounds: u64,
    /// Round trips those rounds made: one per round on one server, one per
    /// master the round had commands for on a cluster.
    pub round_trips: u64,
    /// Commands sent in those rounds.
    pub commands: u64,
    /// Rounds that failed as a whole (connection errors).
    pub failed_rounds: u64,
    /// Jobs whose commands failed.
    pub job_failures: u64,
    /// Reconnects after which every job was run again.
    pub reconnects: u64,
}

/// The counters behind [`DriverStats`], bumped by the driver thread.
#[derive(Default)]
pub(super) struct Counters {
    pub(super) rounds: AtomicU64,
    pub(super) round_trips: AtomicU64,
    pub(super) commands: AtomicU64,
    pub(super) failed_rounds: AtomicU64,
    pub(super) job_failures: AtomicU64,
    pub(super) reconnects: AtomicU64,
}

impl Counters {
    /// What they say now.
    pub(super) fn snapshot(&self) -> DriverStats {
        DriverStats {
            rounds: self.rounds.load(Ordering::Relaxed),
            round_trips: self.round_trips.load(Ordering::Relaxed),
            commands: self.commands.load(Ordering::Relaxed),
            failed_rounds: self.failed_rounds.load(Ordering::Relaxed),
            job_failures: self.job_failures.load(Ordering::Relaxed),
            reconnects: self.reconnects.load(Ordering::Relaxed),
        }
    }
}

/// The wheel's gauges (pending timeouts, tick lag) of the `metrics`
/// feature, set by the driver thread after its rounds.
#[derive(Default)]
pub(super) struct WheelGauges {
    /// When they were last set.
    set_at: Option<Duration>,
}

impl WheelGauges {
    /// Sets the gauges, at most every [`GAUGE_INTERVAL`]: counting the
    /// pending timeouts reads every producer's counter.
    pub(super) fn update(&mut self, now: Duration, timer: &HashedWheelTimer, m: &DriverMetrics) {
        if !cfg!(feature = "metrics")
            || self
                .set_at
                .is_some_and(|at| now.saturating_sub(at) < GAUGE_INTERVAL)
        {
            return;
        }
        self.set_at = Some(now);
        m.wheel_pending.set(timer.pending_timeouts() as f64);
        m.tick_lag.set(timer.tick_lag().as_secs_f64());
    }
}
