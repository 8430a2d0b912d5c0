//! Metrics and tracing spans: the one home of every metric name, and thin
//! handles that compile to nothing without the `metrics` feature.
//!
//! A leaf module: any layer may use it, it uses none of them. Call sites
//! carry no `#[cfg]`: without the feature [`Counter`], [`Gauge`] and
//! [`Histogram`] are zero-sized and their methods empty `#[inline]`
//! functions, and nothing depends on the `metrics` crate.
//!
//! # Metrics (feature `metrics`)
//!
//! Recorded through the [`metrics`](https://docs.rs/metrics) facade: the
//! application installs a recorder (an exporter, such as
//! `metrics-exporter-prometheus`) **before** it connects, since handles are
//! looked up once, when a queue is opened (per queue) or a `Redwheel`
//! connects (per process), and a handle taken before any recorder was
//! installed stays a no-op. `examples/prometheus.rs` serves them.
//!
//! Per queue, label `queue` (the queue's name; one series per queue name,
//! so keep the number of queue names bounded):
//!
//! | name | type | meaning |
//! | --- | --- | --- |
//! | `redwheel_messages_offered_total` | counter | messages added by `offer*` (an `offer_with_id` of a known id adds none) |
//! | `redwheel_messages_transferred_total` | counter | ids this process's transfer job made ready: due ones moved from delayed, and claims whose visibility expired put back for redelivery (an offer due now that goes straight to `ready` is not counted) |
//! | `redwheel_messages_delivered_total` | counter | messages handed to a consumer by `take`/`poll` and `claim`/`claim_batch`/`consume` |
//! | `redwheel_messages_acked_total` | counter | acks that deleted their message (`Delivery::ack`, and the consumer pool's acks); refused ones (stale deliveries) and those that found the message gone already (removed, or acked by an earlier attempt) are not counted |
//! | `redwheel_messages_nacked_total` | counter | nacks accepted (`Delivery::nack`, a consumer handler's failure, a release at shutdown): the message was scheduled again or dead-lettered |
//! | `redwheel_messages_redelivered_total` | counter | deliveries (claims) of a message that was delivered before: its visibility expired, or it was nacked (attempt > 1) |
//! | `redwheel_messages_dead_lettered_total` | counter | messages this process sent to the dead letters: a nack at `max_deliveries`, a claim that expired at `max_deliveries` (found by its transfer job), a payload that could not be decoded, or a message past its ttl |
//! | `redwheel_messages_expired_total` | counter | messages this process found past their ttl (`OfferOptions::ttl`) before they were handed out and made dead letters (reason `expired`): by its transfer job, or by a `take`/`claim` that met one first. `QueueStats::expired` counts them for every process |
//! | `redwheel_queue_messages` | gauge, also label `state` = `delayed`, `ready`, `in_flight`, `dead` | messages in each state, set whenever [`Queue::stats`](crate::Queue::stats) runs |
//! | `redwheel_queue_oldest_overdue_seconds` | gauge | how long the oldest due message not yet handed to a consumer has been due (0 when none), set whenever `Queue::stats` runs |
//! | `redwheel_delivery_lateness_seconds` | histogram | per message delivered for the first time (by `take`, or a claim of attempt 1): delivery time (Redis server clock, by this process's estimate) − due time. Redeliveries are left out: they keep their first due time |
//! | `redwheel_schedule_occurrences_fired_total` | counter | occurrences of the queue's recurring schedules that this process offered (each occurrence is offered by one process) |
//! | `redwheel_schedule_occurrences_skipped_total` | counter | due occurrences this process's firing dropped by the schedule's catch-up policy (after downtime) |
//! | `redwheel_schedule_firing_lateness_seconds` | histogram | per occurrence this process offered: the Redis server's `TIME` when the firing script ran − the occurrence; 0 for one offered ahead of its time (within the lead) |
//!
//! The backlog gauges are only as fresh as the last `stats()` call: have
//! the exporter's scrape handler call it, or call it on an interval (the
//! example does every second).
//!
//! Per process (no label; every `Redwheel` of the process adds to the same
//! counters, and the gauges show the last one that set them):
//!
//! | name | type | labels | meaning |
//! | --- | --- | --- | --- |
//! | `redwheel_wheel_pending_timeouts` | gauge | | timeouts pending on the driver's wheel, set by the driver thread after a round, at most every 100 ms |
//! | `redwheel_wheel_tick_lag_seconds` | gauge | | how late the driver's wheel processed its latest tick ([`HashedWheelTimer::tick_lag`](crate::timer::HashedWheelTimer::tick_lag)), set likewise |
//! | `redwheel_driver_round_duration_seconds` | histogram | | one driver round: its pipelined round trip(s) to Redis, from send to the last reply |
//! | `redwheel_driver_rounds_failed_total` | counter | | driver rounds that failed as a whole (no connection) |
//! | `redwheel_driver_job_failures_total` | counter | | due-work jobs (a transfer, a renewal round) whose commands failed |
//! | `redwheel_reconnects_total` | counter | `connection` = `driver`, `subscriber` | reconnects of the driver's connection, and of a pub/sub listener |
//! | `redwheel_lock_acquired_total` | counter | | lock acquisitions (re-entries included) |
//! | `redwheel_lock_renewals_total` | counter | | watchdog lease renewals confirmed |
//! | `redwheel_lock_leases_lost_total` | counter | `cause` = `gone`, `expired`, `force_unlocked` | holds lost (see `LostCause`) |
//!
//! # Tracing
//!
//! Every Redis round trip of a queue or lock operation runs in a
//! `debug`-level span named `redis` (target `redwheel::redis`) with the
//! fields `op` (the script or command: `offer`, `claim`, `lock_acquire`…),
//! `queue` or `lock`, `batch` (messages or commands in it) and
//! `elapsed_us`, recorded when it ends. The driver's rounds run in a
//! `round` span (target `redwheel::runtime`) with `jobs`, `commands` and
//! `elapsed_us`. With the level disabled a span costs one check of the
//! callsite's interest and reads no clock.

#[cfg(feature = "metrics")]
use std::time::Duration;
use std::time::Instant;

/// `redwheel_messages_offered_total`.
pub(crate) const OFFERED: &str = "redwheel_messages_offered_total";
/// `redwheel_messages_transferred_total`.
pub(crate) const TRANSFERRED: &str = "redwheel_messages_transferred_total";
/// `redwheel_messages_delivered_total`.
pub(crate) const DELIVERED: &str = "redwheel_messages_delivered_total";
/// `redwheel_messages_acked_total`.
pub(crate) const ACKED: &str = "redwheel_messages_acked_total";
/// `redwheel_messages_nacked_total`.
pub(crate) const NACKED: &str = "redwheel_messages_nacked_total";
/// `redwheel_messages_redelivered_total`.
pub(crate) const REDELIVERED: &str = "redwheel_messages_redelivered_total";
/// `redwheel_messages_dead_lettered_total`.
pub(crate) const DEAD_LETTERED: &str = "redwheel_messages_dead_lettered_total";
/// `redwheel_messages_expired_total`.
pub(crate) const EXPIRED: &str = "redwheel_messages_expired_total";
/// `redwheel_queue_messages{state}`.
pub(crate) const QUEUE_MESSAGES: &str = "redwheel_queue_messages";
/// `redwheel_queue_oldest_overdue_seconds`.
pub(crate) const OLDEST_OVERDUE: &str = "redwheel_queue_oldest_overdue_seconds";
/// `redwheel_delivery_lateness_seconds`.
pub(crate) const LATENESS: &str = "redwheel_delivery_lateness_seconds";
/// `redwheel_schedule_occurrences_fired_total`.
pub(crate) const SCHEDULE_FIRED: &str = "redwheel_schedule_occurrences_fired_total";
/// `redwheel_schedule_occurrences_skipped_total`.
pub(crate) const SCHEDULE_SKIPPED: &str = "redwheel_schedule_occurrences_skipped_total";
/// `redwheel_schedule_firing_lateness_seconds`.
pub(crate) const SCHEDULE_LATENESS: &str = "redwheel_schedule_firing_lateness_seconds";
/// `redwheel_wheel_pending_timeouts`.
pub(crate) const WHEEL_PENDING: &str = "redwheel_wheel_pending_timeouts";
/// `redwheel_wheel_tick_lag_seconds`.
pub(crate) const WHEEL_TICK_LAG: &str = "redwheel_wheel_tick_lag_seconds";
/// `redwheel_driver_round_duration_seconds`.
pub(crate) const ROUND_DURATION: &str = "redwheel_driver_round_duration_seconds";
/// `redwheel_driver_rounds_failed_total`.
pub(crate) const ROUNDS_FAILED: &str = "redwheel_driver_rounds_failed_total";
/// `redwheel_driver_job_failures_total`.
pub(crate) const JOB_FAILURES: &str = "redwheel_driver_job_failures_total";
/// `redwheel_reconnects_total{connection}`.
pub(crate) const RECONNECTS: &str = "redwheel_reconnects_total";
/// `redwheel_lock_acquired_total`.
pub(crate) const LOCK_ACQUIRED: &str = "redwheel_lock_acquired_total";
/// `redwheel_lock_renewals_total`.
pub(crate) const LOCK_RENEWALS: &str = "redwheel_lock_renewals_total";
/// `redwheel_lock_leases_lost_total{cause}`.
pub(crate) const LOCK_LOST: &str = "redwheel_lock_leases_lost_total";

/// A counter handle (zero-sized without the feature).
#[derive(Clone)]
pub(crate) struct Counter {
    #[cfg(feature = "metrics")]
    inner: metrics::Counter,
}

impl Counter {
    #[inline]
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    fn new(name: &'static str, labels: &[(&'static str, &str)]) -> Counter {
        Counter {
            #[cfg(feature = "metrics")]
            inner: metrics::counter!(name, owned(labels)),
        }
    }

    /// Adds `n`.
    #[inline]
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn add(&self, n: u64) {
        #[cfg(feature = "metrics")]
        if n > 0 {
            self.inner.increment(n);
        }
    }
}

/// A gauge handle (zero-sized without the feature).
#[derive(Clone)]
pub(crate) struct Gauge {
    #[cfg(feature = "metrics")]
    inner: metrics::Gauge,
}

impl Gauge {
    #[inline]
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    fn new(name: &'static str, labels: &[(&'static str, &str)]) -> Gauge {
        Gauge {
            #[cfg(feature = "metrics")]
            inner: metrics::gauge!(name, owned(labels)),
        }
    }

    /// Sets it to `v`.
    #[inline]
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn set(&self, v: f64) {
        #[cfg(feature = "metrics")]
        self.inner.set(v);
    }
}

/// A histogram handle (zero-sized without the feature).
#[derive(Clone)]
pub(crate) struct Histogram {
    #[cfg(feature = "metrics")]
    inner: metrics::Histogram,
}

impl Histogram {
    #[inline]
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    fn new(name: &'static str, labels: &[(&'static str, &str)]) -> Histogram {
        Histogram {
            #[cfg(feature = "metrics")]
            inner: metrics::histogram!(name, owned(labels)),
        }
    }

    /// Records `v`.
    #[inline]
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn record(&self, v: f64) {
        #[cfg(feature = "metrics")]
        self.inner.record(v);
    }
}

#[cfg(feature = "metrics")]
fn owned(labels: &[(&'static str, &str)]) -> Vec<metrics::Label> {
    labels
        .iter()
        .map(|&(k, v)| metrics::Label::new(k, v.to_owned()))
        .collect()
}

/// Gives the registered metrics their help text and unit, once per
/// process (after the application installed its recorder).
pub(crate) fn describe() {
    #[cfg(feature = "metrics")]
    {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
            describe_counter!(OFFERED, Unit::Count, "Messages offered to the queue.");
            describe_counter!(
                TRANSFERRED,
                Unit::Count,
                "Messages moved from delayed to ready, plus expired claims handled, by this process's transfer job."
            );
            describe_counter!(
                DELIVERED,
                Unit::Count,
                "Messages handed to a consumer (take and claim)."
            );
            describe_counter!(ACKED, Unit::Count, "Acks accepted.");
            describe_counter!(NACKED, Unit::Count, "Nacks accepted.");
            describe_counter!(
                REDELIVERED,
                Unit::Count,
                "Claims of a message delivered before (visibility expired or nacked)."
            );
            describe_counter!(
                DEAD_LETTERED,
                Unit::Count,
                "Messages this process sent to the dead letters (nack at max_deliveries, undecodable, past their ttl)."
            );
            describe_counter!(
                EXPIRED,
                Unit::Count,
                "Messages past their ttl that this process made dead letters."
            );
            describe_gauge!(
                QUEUE_MESSAGES,
                Unit::Count,
                "Messages in each state, as of the last Queue::stats()."
            );
            describe_gauge!(
                OLDEST_OVERDUE,
                Unit::Seconds,
                "Age of the oldest due message not yet delivered, as of the last Queue::stats()."
            );
            describe_histogram!(
                LATENESS,
                Unit::Seconds,
                "Delivery time (Redis clock estimate) minus due time, per delivered message."
            );
            describe_counter!(
                SCHEDULE_FIRED,
                Unit::Count,
                "Occurrences of recurring schedules offered by this process."
            );
            describe_counter!(
                SCHEDULE_SKIPPED,
                Unit::Count,
                "Due occurrences of recurring schedules dropped by their catch-up policy."
            );
            describe_histogram!(
                SCHEDULE_LATENESS,
                Unit::Seconds,
                "Redis server time when an occurrence was offered minus the occurrence."
            );
            describe_gauge!(
                WHEEL_PENDING,
                Unit::Count,
                "Timeouts pending on the driver's wheel."
            );
            describe_gauge!(
                WHEEL_TICK_LAG,
                Unit::Seconds,
                "How late the driver's wheel processed its latest tick."
            );
            describe_histogram!(
                ROUND_DURATION,
                Unit::Seconds,
                "Duration of one driver round trip to Redis."
            );
            describe_counter!(
                ROUNDS_FAILED,
                Unit::Count,
                "Driver rounds that failed as a whole."
            );
            describe_counter!(
                JOB_FAILURES,
                Unit::Count,
                "Driver jobs whose commands failed."
            );
            describe_counter!(RECONNECTS, Unit::Count, "Reconnects to Redis.");
            describe_counter!(LOCK_ACQUIRED, Unit::Count, "Lock acquisitions.");
            describe_counter!(
                LOCK_RENEWALS,
                Unit::Count,
                "Watchdog lease renewals confirmed."
            );
            describe_counter!(LOCK_LOST, Unit::Count, "Lock holds lost.");
        });
    }
}

/// The metric handles of one queue's recurring schedules, looked up once
/// when the queue is opened.
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
pub(crate) struct ScheduleMetrics {
    pub fired: Counter,
    pub skipped: Counter,
    pub lateness: Histogram,
}

impl ScheduleMetrics {
    pub(crate) fn new(queue: &str) -> ScheduleMetrics {
        let q = [("queue", queue)];
        ScheduleMetrics {
            fired: Counter::new(SCHEDULE_FIRED, &q),
            skipped: Counter::new(SCHEDULE_SKIPPED, &q),
            lateness: Histogram::new(SCHEDULE_LATENESS, &q),
        }
    }
}

/// The metric handles of one queue, looked up once when it is opened.
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
pub(crate) struct QueueMetrics {
    pub offered: Counter,
    pub delivered: Counter,
    pub acked: Counter,
    pub nacked: Counter,
    pub redelivered: Counter,
    pub dead_lettered: Counter,
    pub expired: Counter,
    lateness: Histogram,
    delayed: Gauge,
    ready: Gauge,
    in_flight: Gauge,
    dead: Gauge,
    oldest_overdue: Gauge,
}

impl QueueMetrics {
    pub(crate) fn new(queue: &str) -> QueueMetrics {
        let q = [("queue", queue)];
        let state = |s: &'static str| Gauge::new(QUEUE_MESSAGES, &[("queue", queue), ("state", s)]);
        QueueMetrics {
            offered: Counter::new(OFFERED, &q),
            delivered: Counter::new(DELIVERED, &q),
            acked: Counter::new(ACKED, &q),
            nacked: Counter::new(NACKED, &q),
            redelivered: Counter::new(REDELIVERED, &q),
            dead_lettered: Counter::new(DEAD_LETTERED, &q),
            expired: Counter::new(EXPIRED, &q),
            lateness: Histogram::new(LATENESS, &q),
            delayed: state("delayed"),
            ready: state("ready"),
            in_flight: state("in_flight"),
            dead: state("dead"),
            oldest_overdue: Gauge::new(OLDEST_OVERDUE, &q),
        }
    }

    /// The transfer job's counter.
    pub(crate) fn transferred(queue: &str) -> Counter {
        Counter::new(TRANSFERRED, &[("queue", queue)])
    }

    /// The transfer job's count of expired claims sent to the dead letters.
    pub(crate) fn dead_lettered(queue: &str) -> Counter {
        Counter::new(DEAD_LETTERED, &[("queue", queue)])
    }

    /// The transfer job's count of messages past their ttl.
    pub(crate) fn expired(queue: &str) -> Counter {
        Counter::new(EXPIRED, &[("queue", queue)])
    }

    /// Messages delivered, as (attempt, due time in epoch ms on the server
    /// clock) pairs: counted as delivered, those of attempt > 1 as
    /// redelivered, and for the others (first deliveries) the lateness is
    /// recorded. (A redelivery keeps its first due time, so its "lateness"
    /// would be its visibility or retry delay: left out.) `now_ms`, the
    /// server clock estimate, is read at most once, and only with the
    /// feature on.
    #[inline]
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn delivered(
        &self,
        deliveries: impl IntoIterator<Item = (u32, u64)>,
        now_ms: impl FnOnce() -> u64,
    ) {
        #[cfg(feature = "metrics")]
        {
            let (mut count, mut again) = (0, 0);
            let mut now_ms = Some(now_ms);
            let mut now = 0i64;
            for (attempt, due) in deliveries {
                count += 1;
                if attempt > 1 {
                    again += 1;
                    continue;
                }
                if let Some(f) = now_ms.take() {
                    now = f() as i64;
                }
                // Negative only when the clock estimate is off by more than
                // the lateness (the script never delivers early): 0.
                let late = (now - due as i64).max(0);
                self.lateness.record(late as f64 / 1000.0);
            }
            self.delivered.add(count);
            self.redelivered.add(again);
        }
    }

    /// Sets the backlog gauges from `Queue::stats`.
    #[inline]
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn backlog(
        &self,
        delayed: u64,
        ready: u64,
        in_flight: u64,
        dead: u64,
        oldest_overdue: Option<std::time::Duration>,
    ) {
        #[cfg(feature = "metrics")]
        {
            self.delayed.set(delayed as f64);
            self.ready.set(ready as f64);
            self.in_flight.set(in_flight as f64);
            self.dead.set(dead as f64);
            self.oldest_overdue
                .set(oldest_overdue.unwrap_or(Duration::ZERO).as_secs_f64());
        }
    }
}

/// The driver's metric handles (per process).
pub(crate) struct DriverMetrics {
    pub round_duration: Histogram,
    pub rounds_failed: Counter,
    pub job_failures: Counter,
    pub reconnects: Counter,
    pub wheel_pending: Gauge,
    pub tick_lag: Gauge,
}

impl DriverMetrics {
    pub(crate) fn new() -> DriverMetrics {
        describe();
        DriverMetrics {
            round_duration: Histogram::new(ROUND_DURATION, &[]),
            rounds_failed: Counter::new(ROUNDS_FAILED, &[]),
            job_failures: Counter::new(JOB_FAILURES, &[]),
            reconnects: reconnects("driver"),
            wheel_pending: Gauge::new(WHEEL_PENDING, &[]),
            tick_lag: Gauge::new(WHEEL_TICK_LAG, &[]),
        }
    }
}

/// `redwheel_reconnects_total{connection}`.
pub(crate) fn reconnects(connection: &'static str) -> Counter {
    Counter::new(RECONNECTS, &[("connection", connection)])
}

/// The locks' metric handles (per `Redwheel`).
pub(crate) struct LockMetrics {
    pub acquired: Counter,
    pub renewals: Counter,
    pub lost_gone: Counter,
    pub lost_expired: Counter,
    pub lost_force_unlocked: Counter,
}

impl LockMetrics {
    pub(crate) fn new() -> LockMetrics {
        let lost = |cause| Counter::new(LOCK_LOST, &[("cause", cause)]);
        LockMetrics {
            acquired: Counter::new(LOCK_ACQUIRED, &[]),
            renewals: Counter::new(LOCK_RENEWALS, &[]),
            lost_gone: lost("gone"),
            lost_expired: lost("expired"),
            lost_force_unlocked: lost("force_unlocked"),
        }
    }
}

/// A Redis round trip in progress: a `debug` span, entered, that records
/// its `elapsed_us` when dropped. Not `Send`: keep it on the thread that
/// made it.
pub(crate) struct RoundTrip {
    span: tracing::span::EnteredSpan,
    start: Option<Instant>,
}

impl RoundTrip {
    #[inline]
    fn new(span: tracing::Span) -> RoundTrip {
        let start = (!span.is_disabled()).then(Instant::now);
        RoundTrip {
            span: span.entered(),
            start,
        }
    }
}

impl Drop for RoundTrip {
    #[inline]
    fn drop(&mut self) {
        if let Some(start) = self.start {
            self.span
                .record("elapsed_us", start.elapsed().as_micros() as u64);
        }
    }
}

/// The span of a round trip of queue `queue` running `op` on `batch`
/// messages.
#[inline]
pub(crate) fn queue_op(op: &'static str, queue: &str, batch: usize) -> RoundTrip {
    RoundTrip::new(queue_span(op, queue, batch))
}

fn queue_span(op: &'static str, queue: &str, batch: usize) -> tracing::Span {
    tracing::debug_span!(
        target: "redwheel::redis",
        "redis",
        op,
        queue,
        batch,
        elapsed_us = tracing::field::Empty
    )
}

/// The span of a round trip of lock `lock` running `op`.
#[inline]
pub(crate) fn lock_op(op: &'static str, lock: &str) -> RoundTrip {
    RoundTrip::new(lock_span(op, lock))
}

fn lock_span(op: &'static str, lock: &str) -> tracing::Span {
    tracing::debug_span!(
        target: "redwheel::redis",
        "redis",
        op,
        lock,
        batch = 1usize,
        elapsed_us = tracing::field::Empty
    )
}

/// As [`RoundTrip`], for a round trip awaited in a future (feature
/// `async`): the span is not entered (an entered span must not cross an
/// `.await`), and it is `Send`.
#[cfg(feature = "async")]
pub(crate) struct AwaitedRoundTrip {
    span: tracing::Span,
    start: Option<Instant>,
}

#[cfg(feature = "async")]
impl Drop for AwaitedRoundTrip {
    fn drop(&mut self) {
        if let Some(start) = self.start {
            self.span
                .record("elapsed_us", start.elapsed().as_micros() as u64);
        }
    }
}

#[cfg(feature = "async")]
fn awaited(span: tracing::Span) -> AwaitedRoundTrip {
    let start = (!span.is_disabled()).then(Instant::now);
    AwaitedRoundTrip { span, start }
}

/// [`queue_op`] for a future.
#[cfg(feature = "async")]
pub(crate) fn queue_op_async(op: &'static str, queue: &str, batch: usize) -> AwaitedRoundTrip {
    awaited(queue_span(op, queue, batch))
}

/// [`lock_op`] for a future.
#[cfg(feature = "async")]
pub(crate) fn lock_op_async(op: &'static str, lock: &str) -> AwaitedRoundTrip {
    awaited(lock_span(op, lock))
}
