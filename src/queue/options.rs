//! The settings of a queue handle ([`QueueOptions`]) and of a consumer
//! pool ([`ConsumerOptions`]), each checked before it is used.

use std::time::Duration;

use crate::error::{Error, ErrorKind};
use crate::scripts::TRANSFER_BATCH_MAX;

/// Longest guard interval accepted.
const MAX_GUARD_INTERVAL: Duration = Duration::from_secs(86_400);

/// Largest `max_payload_bytes`: Redis's own limit on one string (512 MiB).
const MAX_PAYLOAD_LIMIT: usize = 512 << 20;

/// Largest `max` of a rate limit: the sliding log holds one entry per
/// delivery of the window (about 60 bytes each in Redis).
pub(crate) const MAX_RATE: u32 = 1_000_000;

/// Options of one queue, for [`Redwheel::queue_with`].
///
/// ```no_run
/// use std::time::Duration;
/// use redwheel::{QueueOptions, Redwheel};
///
/// let rw = Redwheel::connect("redis://127.0.0.1:6379")?;
/// let jobs = rw.queue_with::<String>("jobs", QueueOptions::default()
///     .visibility(Duration::from_secs(60)) // a claim not acked within a minute comes back
///     .max_deliveries(5)                   // the fifth failure makes it a dead letter
///     .guard_interval(Duration::from_secs(5)))?;
/// # Ok::<(), redwheel::Error>(())
/// ```
///
/// [`Redwheel::queue_with`]: crate::Redwheel::queue_with
#[derive(Debug, Clone)]
pub struct QueueOptions {
    pub(crate) transfer_batch: usize,
    pub(crate) guard_interval: Duration,
    pub(crate) max_payload_bytes: usize,
    pub(crate) wait_replicas: Option<(u32, Duration)>,
    pub(crate) visibility: Duration,
    pub(crate) max_deliveries: u32,
    pub(crate) rate_limit: Option<(u32, Duration)>,
    pub(crate) max_in_flight: Option<u64>,
    pub(crate) max_len: Option<u64>,
}

impl Default for QueueOptions {
    fn default() -> Self {
        QueueOptions {
            transfer_batch: 1_000,
            guard_interval: Duration::from_secs(1),
            max_payload_bytes: 1 << 20,
            wait_replicas: None,
            visibility: Duration::from_secs(30),
            max_deliveries: 10,
            rate_limit: None,
            max_in_flight: None,
            max_len: None,
        }
    }
}

impl QueueOptions {
    /// Most ids one transfer script call moves (1 ..= 4,000; default
    /// 1,000). A full batch is followed by another call in the next round.
    pub fn transfer_batch(mut self, n: usize) -> Self {
        self.transfer_batch = n;
        self
    }

    /// Period of the guard sweep: a transfer run even when no wake-up came,
    /// so a lost pub/sub message or a dead process never strands a message
    /// for longer than this. 10 ms ..= 1 day; default 1 s. Queues with the
    /// same interval are swept together, in one round trip.
    pub fn guard_interval(mut self, d: Duration) -> Self {
        self.guard_interval = d;
        self
    }

    /// Largest encoded payload accepted by `offer` (1 byte ..= 512 MiB;
    /// default 1 MiB). A larger one fails with
    /// [`ErrorKind::PayloadTooLarge`].
    pub fn max_payload_bytes(mut self, n: usize) -> Self {
        self.max_payload_bytes = n;
        self
    }

    /// Durability for replicated deployments: every offer (and each chunk
    /// of a batch offer) returns only once Redis confirms (`WAIT replicas
    /// timeout`) that at least `replicas` replicas received it, and fails
    /// with [`ErrorKind::NotReplicated`] otherwise (the message is then on
    /// the master, but a failover may lose it; retry with
    /// [`Queue::offer_with_id`]). Without it, an offer acknowledged just
    /// before its master dies can be lost: Redis replicates
    /// asynchronously. `timeout` is 1 ms ..= 60 s and must leave room within
    /// [`command_timeout`](crate::RedwheelOptions::command_timeout).
    /// Default: no waiting.
    ///
    /// [`Queue::offer_with_id`]: crate::Queue::offer_with_id
    pub fn wait_replicas(mut self, replicas: u32, timeout: Duration) -> Self {
        self.wait_replicas = Some((replicas, timeout));
        self
    }

    /// How long a claimed message stays hidden from other consumers
    /// ([`Queue::claim`]): not acked within this, it is delivered again.
    /// 1 ms ..= 1 day; default 30 s. Each handle uses its own.
    ///
    /// [`Queue::claim`]: crate::Queue::claim
    pub fn visibility(mut self, d: Duration) -> Self {
        self.visibility = d;
        self
    }

    /// How many times a claimed message is delivered before it goes to the
    /// dead letters instead (a visibility that expires and a `nack` both
    /// count). 1 ..= 1,000,000; default 10. The first open of a queue in a
    /// `Redwheel` sets it for that process's redeliveries.
    pub fn max_deliveries(mut self, n: u32) -> Self {
        self.max_deliveries = n;
        self
    }

    /// A fleet-wide rate limit: no interval of length `per` (a sliding
    /// window, not fixed buckets) sees more than `max` messages handed out
    /// by `take`, `poll`, `claim` and `consume`, across every process.
    /// `max` 1 ..= 1,000,000; `per` 1 ms ..= 1 day, in whole milliseconds
    /// (rounded up).
    ///
    /// The limit is stored in Redis (`redwheel:{N}:controls`), so every
    /// process obeys it, also those that open the queue without it: opening
    /// with this option writes it (replacing the queue's rate limit, if it
    /// had one); opening without it leaves the stored one alone.
    /// [`Queue::lift_limit`] removes it; `redwheel limits QUEUE` shows it.
    /// Consumers held back wait in their process, woken by its driver when
    /// the window lets the next one through (no polling).
    ///
    /// [`Queue::lift_limit`]: crate::Queue::lift_limit
    pub fn rate_limit(mut self, max: u32, per: Duration) -> Self {
        self.rate_limit = Some((max, per));
        self
    }

    /// A fleet-wide bound on messages claimed and not yet acked (or given
    /// back, or expired): a `claim` finds no more than `n` in flight across
    /// every process, and waits (woken when one ends) otherwise. `take` is
    /// not bound by it (a taken message is not in flight). `n` 1 ..= 2^32.
    /// Stored in Redis like [`rate_limit`](QueueOptions::rate_limit).
    pub fn max_in_flight(mut self, n: u64) -> Self {
        self.max_in_flight = Some(n);
        self
    }

    /// A bound on the queue's length ([`Queue::len`]: delayed, ready and in
    /// flight; dead letters are not counted): an offer that would pass it
    /// fails with [`ErrorKind::QueueFull`] and writes nothing. A batch
    /// offer is written per chunk of up to 1,000, each all or nothing (see
    /// [`Queue::offer_batch`]). `n` >= 1. Stored in Redis like
    /// [`rate_limit`](QueueOptions::rate_limit).
    ///
    /// [`Queue::len`]: crate::Queue::len
    /// [`Queue::offer_batch`]: crate::Queue::offer_batch
    pub fn max_len(mut self, n: u64) -> Self {
        self.max_len = Some(n);
        self
    }

    pub(crate) fn validate(&self) -> Result<(), Error> {
        let bad = |name: &str, reason: String| {
            Err(Error::new(
                ErrorKind::InvalidOption,
                format!("invalid option `{name}`: {reason}"),
            ))
        };
        if let Some((max, per)) = self.rate_limit
            && (max == 0
                || max > MAX_RATE
                || per < Duration::from_millis(1)
                || per > MAX_GUARD_INTERVAL)
        {
            return bad(
                "rate_limit",
                format!("{max} per {per:?}: needs 1..={MAX_RATE} per 1 ms ..= 1 day"),
            );
        }
        if let Some(n) = self.max_in_flight
            && (n == 0 || n > 1 << 32)
        {
            return bad("max_in_flight", format!("{n} is not in 1..=2^32"));
        }
        if self.max_len == Some(0) {
            return bad("max_len", "must be at least 1".to_owned());
        }
        if self.transfer_batch == 0 || self.transfer_batch > TRANSFER_BATCH_MAX {
            return bad(
                "transfer_batch",
                format!("{} is not in 1..={TRANSFER_BATCH_MAX}", self.transfer_batch),
            );
        }
        if self.guard_interval < Duration::from_millis(10)
            || self.guard_interval > MAX_GUARD_INTERVAL
        {
            return bad(
                "guard_interval",
                format!("{:?} is not within 10 ms ..= 1 day", self.guard_interval),
            );
        }
        if let Some((n, timeout)) = self.wait_replicas
            && (n == 0 || timeout < Duration::from_millis(1) || timeout > Duration::from_secs(60))
        {
            return bad(
                "wait_replicas",
                format!(
                    "{n} replicas within {timeout:?}: needs at least 1 replica and 1 ms ..= 60 s"
                ),
            );
        }
        if self.visibility < Duration::from_millis(1) || self.visibility > MAX_GUARD_INTERVAL {
            return bad(
                "visibility",
                format!("{:?} is not within 1 ms ..= 1 day", self.visibility),
            );
        }
        if self.max_deliveries == 0 || self.max_deliveries > 1_000_000 {
            return bad(
                "max_deliveries",
                format!("{} is not in 1..=1000000", self.max_deliveries),
            );
        }
        if self.max_payload_bytes == 0 || self.max_payload_bytes > MAX_PAYLOAD_LIMIT {
            return bad(
                "max_payload_bytes",
                format!(
                    "{} is not in 1..={MAX_PAYLOAD_LIMIT}",
                    self.max_payload_bytes
                ),
            );
        }
        Ok(())
    }
}

/// Settings of a [`Consumer`] pool.
///
/// ```
/// use std::time::Duration;
/// use redwheel::ConsumerOptions;
///
/// let options = ConsumerOptions::default()
///     .concurrency(8)                                   // eight handlers at once
///     .handler_timeout(Duration::from_secs(120))        // past that, the message is given back
///     .retry_backoff(Duration::from_secs(1), Duration::from_secs(60));
/// # let _ = options;
/// ```
///
/// [`Consumer`]: crate::Consumer
#[derive(Debug, Clone)]
pub struct ConsumerOptions {
    pub(super) concurrency: usize,
    pub(super) claimers: Option<usize>,
    pub(super) handler_timeout: Option<Duration>,
    pub(super) retry_min: Duration,
    pub(super) retry_max: Duration,
    pub(super) poll: Duration,
    pub(super) shutdown_grace: Duration,
    pub(super) claim_ahead: Duration,
    pub(super) claim_ahead_max: usize,
}

impl Default for ConsumerOptions {
    fn default() -> Self {
        ConsumerOptions {
            concurrency: 1,
            claimers: None,
            handler_timeout: None,
            retry_min: Duration::from_secs(1),
            retry_max: Duration::from_secs(300),
            poll: Duration::from_secs(1),
            shutdown_grace: Duration::from_secs(10),
            claim_ahead: Duration::ZERO,
            claim_ahead_max: 1_000,
        }
    }
}

impl ConsumerOptions {
    /// Worker threads, each handling one message at a time (1 ..= 1,024;
    /// default 1).
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n;
        self
    }

    /// Threads that claim messages for the workers (1 ..= `concurrency`;
    /// default `min(concurrency, 4)`). The workers are split among them;
    /// each claims for its own free workers only, in one script call that
    /// also carries their acks. A claimer with a single worker runs the
    /// handler itself. More claimers keep more claims in flight (faster
    /// with short handlers); fewer use fewer connections.
    pub fn claimers(mut self, n: usize) -> Self {
        self.claimers = Some(n);
        self
    }

    /// A handler running longer than this is treated as failed: its
    /// message is given back for a retry while the handler still runs, and
    /// the handler's eventual result is ignored. Default: no limit (the
    /// visibility is extended for as long as the handler runs).
    pub fn handler_timeout(mut self, d: Duration) -> Self {
        self.handler_timeout = Some(d);
        self
    }

    /// Delay before a failed message is delivered again: `min` after the
    /// first attempt, doubling with each attempt up to `max`. Default 1 s to
    /// 5 min.
    pub fn retry_backoff(mut self, min: Duration, max: Duration) -> Self {
        self.retry_min = min;
        self.retry_max = max;
        self
    }

    /// How long one claim of an idle pool waits for a message before it
    /// is sent again (1 ms ..= 60 s; default 1 s). Messages arriving
    /// meanwhile wake it at once, and a shutdown ends the wait within
    /// [`RedwheelOptions::max_block`](crate::RedwheelOptions::max_block),
    /// however long the poll.
    pub fn poll(mut self, d: Duration) -> Self {
        self.poll = d;
        self
    }

    /// How long dropping the [`Consumer`] waits for running handlers.
    /// Default 10 s.
    ///
    /// [`Consumer`]: crate::Consumer
    pub fn shutdown_grace(mut self, d: Duration) -> Self {
        self.shutdown_grace = d;
        self
    }

    /// Claims delayed messages up to `window` before they fall due and
    /// starts each handler at its message's due time, by this process's
    /// timing wheel (0 ..= 60 s; default 0: off). For work that must start
    /// on time when much of it falls due at once (recurring schedules: a
    /// thousand occurrences in the same millisecond): the claims are made
    /// ahead, in one script call per thousand messages, so at the due time
    /// no round trip stands between a message and its handler.
    ///
    /// What it changes, and what it does not:
    /// * A message claimed ahead is at-least-once as any claim: it is held
    ///   in `inflight` under a visibility deadline counted from its due
    ///   time, so if this process dies before or while handling it, it is
    ///   delivered again when that deadline passes. It is never handed to
    ///   a handler before its due time (by the server's clock).
    /// * It is claimed when it is within the window, so for the rest of
    ///   the window it belongs to this process: a
    ///   [`remove`](crate::Queue::remove) or a schedule's pause,
    ///   replacement or removal reaches it no more (as for a message
    ///   already claimed), and another process cannot claim it.
    /// * Queues with controls (pause, rate limit, max in flight,
    ///   priorities, ttls) are decided at hand-out time, so nothing is
    ///   claimed ahead from them: the pool claims them when due, as it does
    ///   without this option. Controls set after the claim (by any
    ///   process) are seen shortly before the due time (5 ms), and what is
    ///   held goes back to be claimed under them; a message a worker
    ///   already took runs, as a claimed one does.
    /// * A message the workers cannot start by half the queue's visibility
    ///   before its claim ends goes back to the queue, uncounted, for any
    ///   free worker: a held message never starts on a claim that may have
    ///   been delivered again.
    /// * At shutdown, messages claimed ahead whose handler has not started
    ///   go back to the queue at their due time, uncounted.
    ///
    /// At most [`claim_ahead_max`](ConsumerOptions::claim_ahead_max)
    /// messages are held ahead at once. For [`Queue::consume`] only (a
    /// stream of deliveries refuses it).
    ///
    /// [`Queue::consume`]: crate::Queue::consume
    pub fn claim_ahead(mut self, window: Duration) -> Self {
        self.claim_ahead = window;
        self
    }

    /// The most messages a pool holds claimed ahead at once, waiting for
    /// their due time or for a worker (1 ..= 100,000; default 1,000, enough
    /// for a thousand occurrences due in the same millisecond, whatever
    /// the concurrency: what the workers cannot start in time goes back, so
    /// more than they can handle costs round trips, not duplicates); see
    /// [`claim_ahead`](ConsumerOptions::claim_ahead).
    pub fn claim_ahead_max(mut self, n: usize) -> Self {
        self.claim_ahead_max = n;
        self
    }

    pub(super) fn validate(&self) -> Result<(), Error> {
        let bad = |name: &str, reason: String| {
            Err(Error::new(
                ErrorKind::InvalidOption,
                format!("invalid option `{name}`: {reason}"),
            ))
        };
        if self.claim_ahead > Duration::from_secs(60) {
            return bad(
                "claim_ahead",
                format!("{:?} is not within 0 ..= 60 s", self.claim_ahead),
            );
        }
        if self.claim_ahead_max == 0 || self.claim_ahead_max > 100_000 {
            return bad(
                "claim_ahead_max",
                format!("{} is not in 1..=100000", self.claim_ahead_max),
            );
        }
        if self.concurrency == 0 || self.concurrency > 1_024 {
            return bad(
                "concurrency",
                format!("{} is not in 1..=1024", self.concurrency),
            );
        }
        if let Some(n) = self.claimers
            && (n == 0 || n > self.concurrency)
        {
            return bad(
                "claimers",
                format!("{n} is not in 1..={} (the concurrency)", self.concurrency),
            );
        }
        if self.poll < Duration::from_millis(1) || self.poll > Duration::from_secs(60) {
            return bad(
                "poll",
                format!("{:?} is not within 1 ms ..= 60 s", self.poll),
            );
        }
        if self.handler_timeout.is_some_and(|d| d.is_zero()) {
            return bad("handler_timeout", "must be greater than zero".to_owned());
        }
        if self.retry_max < self.retry_min {
            return bad("retry_backoff", "needs min <= max".to_owned());
        }
        Ok(())
    }

    pub(super) fn claimer_count(&self) -> usize {
        self.claimers.unwrap_or(self.concurrency.min(4))
    }
}
