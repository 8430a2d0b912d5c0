//! # redwheel
//!
//! Timers, delayed jobs and leases that survive restarts, for synchronous
//! Rust services: a Netty-style hashed timing wheel, and on top of it
//! Redis-persisted delayed queues and Redis locks whose timing (transfers,
//! redeliveries, lease renewals) that wheel drives, on one Redis or a Redis
//! Cluster ([`Redwheel::connect_cluster`]).
//!
//! **[The guide](guide)** explains each part in chapters whose examples
//! all run as doc tests: what every operation guarantees, what each call
//! does when its connection drops, consumers, controls, schedules (cron
//! and daylight saving time), locks and fencing, async, production
//! (TLS, ACL, cluster), operating it (CLI, metrics, dashboard) and how the
//! timer's `unsafe` code is checked. This page is the short tour.
//!
//! ## The timer
//!
//! [`timer::HashedWheelTimer`] runs tasks after a delay on one dedicated
//! worker thread. Scheduling is a push onto the calling thread's own queue
//! (one atomic read-modify-write, no lock, no allocator call); cancelling
//! is a compare-and-swap; the worker moves timeouts into a ring of buckets
//! once per tick and runs those that are due. It knows nothing of Redis and
//! works alone in any program.
//!
//! ```
//! use std::sync::mpsc;
//! use std::time::Duration;
//! use redwheel::timer::{HashedWheelTimer, Timeout};
//!
//! let timer = HashedWheelTimer::builder()
//!     .tick_duration(Duration::from_millis(1))
//!     .ticks_per_wheel(512)
//!     .build()?;
//!
//! let (tx, rx) = mpsc::channel();
//! timer.new_timeout(Duration::from_millis(20), move |_: &Timeout| {
//!     tx.send("fired").unwrap();
//! })?;
//! let never = timer.new_timeout(Duration::from_secs(3600), |_: &Timeout| {})?;
//! assert!(never.cancel());
//!
//! assert_eq!(rx.recv().unwrap(), "fired");
//! let never_ran = timer.stop()?;
//! assert!(never_ran.is_empty());
//! # Ok::<(), redwheel::timer::TimerError>(())
//! ```
//!
//! See the [`timer`] module for the semantics (Netty's, item by item) and
//! the places where redwheel deliberately differs.
//!
//! ## Delayed queues
//!
//! A [`Redwheel`] connects to Redis and owns one wheel, the driver thread
//! that runs timed Redis work on it, connection pools and a subscriber
//! connection. A message offered with a delay waits in Redis (so it
//! survives any crash of this process); at its due time, by the Redis
//! server's clock, a wheel timeout runs an atomic Lua script that moves it
//! to the queue's ready list, where [`Queue::take`] and [`Queue::poll`] find
//! it. Any number of processes may offer to, transfer and consume one queue
//! at once. The [`queue`] module says exactly what each operation
//! guarantees (`take` is at-most-once).
//!
//! ```no_run
//! use std::time::Duration;
//! use redwheel::{ErrorKind, MessageId, Redwheel};
//!
//! let rw = Redwheel::connect("redis://127.0.0.1:6379")?;
//! let q = rw.queue::<String>("orders")?;
//! let id = q.offer(&"order-42".to_string(), Duration::from_secs(600))?;
//! assert!(q.remove(&id)?); // cancelled by id, in O(log n)
//!
//! // An offer that may be retried: under an id of ours, written at most once.
//! let order = MessageId::from("order-43");
//! loop {
//!     match q.offer_with_id(&order, &"order-43".to_string(), Duration::from_millis(50)) {
//!         Ok(_) => break,
//!         Err(e) if e.is_transient() => continue, // Unavailable or OutcomeUnknown
//!         Err(e) => return Err(e),
//!     }
//! }
//! let m = q.take()?; // blocks until a message is due
//! println!("{} was due at {:?}", m.payload(), m.due());
//! assert_ne!(ErrorKind::Unavailable, ErrorKind::OutcomeUnknown);
//! rw.shutdown(Duration::from_secs(5))?;
//! # Ok::<(), redwheel::Error>(())
//! ```
//!
//! ## Locks
//!
//! [`Redwheel::lock`] gives a reentrant Redis lock whose lease (30 s by
//! default) the same runtime renews every lease / 3 while its guard lives,
//! all of a process's locks in one pipelined round trip, so it lapses within
//! one lease of its holder's death. Each acquisition carries a fencing
//! token, strictly increasing per lock name, for the store the critical
//! section writes to. A lease that is lost (the lock gone or taken over, or
//! Redis unreachable for a whole lease) shows as [`LockGuard::is_lost`], an
//! `on_lost` callback and [`ErrorKind::LockLost`] from the unlock. Waiters
//! are woken by the unlock's notification, one per process. The [`lock`]
//! module says what a lock can and cannot promise.
//!
//! ```no_run
//! use std::time::Duration;
//! use redwheel::Redwheel;
//!
//! let rw = Redwheel::connect("redis://127.0.0.1:6379")?;
//! let lock = rw.lock("inventory:42").watchdog_lease(Duration::from_secs(5));
//! let guard = lock.lock()?;                        // blocks until acquired
//! let token = guard.fencing_token();               // strictly increasing per name
//! // … write to the store with `token`; stop if guard.is_lost() …
//! guard.unlock()?;                                 // Err(LockLost) if the lease was lost
//! if let Some(g) = lock.try_lock(Duration::from_millis(200))? {
//!     drop(g);                                     // dropping unlocks too
//! }
//! # let _ = token;
//! # Ok::<(), redwheel::Error>(())
//! ```
//!
//! ## Recurring schedules
//!
//! [`schedule::Schedule`] says when a recurring job fires: a cron
//! expression (Vixie cron's grammar and day rule) read on the wall clock of
//! an IANA time zone, with daylight saving time handled as Debian's cron
//! does, or a fixed period anchored so that restarts never drift. It is a
//! pure value that reads no clock: [`next_after`](schedule::Schedule::next_after)
//! previews runs, [`plan`](schedule::Schedule::plan) says what a catch-up
//! policy fires after downtime, and [`definition`](schedule::Schedule::definition)
//! is the stable text it is stored and compared as. The zone database is
//! bundled, so every process of one build agrees.
//!
//! ```
//! use std::time::{Duration, UNIX_EPOCH};
//! use redwheel::schedule::Schedule;
//!
//! let nightly = Schedule::cron("30 2 * * *")?.time_zone("Europe/Berlin")?;
//! // 29 March 2026: 02:30 does not exist in Berlin; it runs at 03:00 CEST.
//! let t = UNIX_EPOCH + Duration::from_secs(1_774_742_400); // 2026-03-29T00:00:00Z
//! assert_eq!(nightly.next_after(t), Some(UNIX_EPOCH + Duration::from_secs(1_774_746_000)));
//! # Ok::<(), redwheel::Error>(())
//! ```
//!
//! Put on a queue with [`Queue::schedule`], each occurrence becomes one
//! message of the queue, due at the occurrence and offered exactly once
//! however many processes have the queue open (see "Recurring schedules"
//! in [`queue`]):
//!
//! ```no_run
//! use redwheel::Redwheel;
//! use redwheel::schedule::Schedule;
//!
//! let rw = Redwheel::connect("redis://127.0.0.1:6379")?;
//! let q = rw.queue::<String>("reports")?;
//! let nightly = Schedule::cron("0 3 * * *")?.time_zone("Europe/Berlin")?;
//! q.schedule("nightly", &nightly, &"build the report".to_string())?; // every process may declare it
//! let m = q.take()?;                                                  // at 03:00 Berlin time
//! assert_eq!(m.payload(), "build the report");
//! # Ok::<(), redwheel::Error>(())
//! ```
//!
//! ## Errors
//!
//! The timer has its own [`TimerError`]. Everything Redis-backed returns one
//! [`Error`]: [`Error::kind`] says what happened, [`Error::is_transient`]
//! whether a retry may succeed, [`Error::is_invalid_input`] whether the
//! call itself was wrong, and [`Error::queue`] / [`Error::message_id`] what
//! it concerns.
//!
//! ## Features
//!
//! * `serde`: JSON payloads through serde, `rw.queue::<Json<T>>(…)`
//!   (`queue::Json`).
//! * `metrics`: counters, gauges and histograms (per queue: offered,
//!   delivered, acked…, backlog, delivery lateness; per process: driver
//!   rounds, reconnects, wheel lag, lock renewals) through the `metrics`
//!   facade; install the exporter's recorder before connecting. The names
//!   are in the guide's [Operating it](guide::operating).
//! * `tls`: `rediss://` URLs, through the `redis` crate's rustls support;
//!   `RedwheelOptions::tls_root_certificate` trusts a private CA.
//! * `async`: every queue and lock operation as a future
//!   (`Queue::offer_async`, `take_async`, `claim_async`, `deliveries`,
//!   `Lock::lock_async`…) and the wheel's `HashedWheelTimer::sleep`,
//!   completed by redwheel's own threads (one multiplexed connection per
//!   Redis node, the wheel): no runtime inside, for tokio, smol or any
//!   executor. What dropping each future does is in the guide's
//!   [Async](guide::async_futures) and on each method.
//! * `cli`: the `redwheel` operator tool (`cargo install --path .
//!   --features cli`): stats, peek, dead letters, requeue, remove, offer,
//!   a live `watch`, locks and schedules, as tables or JSON. What it reads is library
//!   API too (`queue::inspect`, `lock::inspect`), with or without the
//!   feature.

#![deny(missing_docs)]
#![deny(rustdoc::broken_intra_doc_links)]
#![deny(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod error;
pub mod guide;
pub mod lock;
pub mod queue;
mod runtime;
pub mod schedule;
mod scripts;
mod telemetry;
// The timer's fast path (pooled slots, per-thread rings) is unsafe code,
// each block with its `// SAFETY:` argument, covered by Miri and loom.
#[allow(unsafe_code)]
pub mod timer;
#[cfg(feature = "web")]
#[cfg_attr(docsrs, doc(cfg(feature = "web")))]
pub mod web;

pub use error::{Error, ErrorKind, TimerError};
#[cfg(feature = "async")]
#[cfg_attr(docsrs, doc(cfg(feature = "async")))]
pub use lock::AsyncLockGuard;
pub use lock::{LeaseLost, Lock, LockGuard, LockStats, LostCause};
pub use queue::{
    Codec, Consumer, ConsumerOptions, DeadLetter, Dedup, Delivery, Limit, Message, MessageId,
    Nacked, OfferOptions, Offered, Queue, QueueLimits, QueueOptions, QueueStats,
};
pub use runtime::{DriverStats, Redwheel, RedwheelOptions};

/// Hooks for redwheel's own tests (faults that cannot be injected from
/// outside the process). Not part of the API: hidden from the docs, and
/// free to change in any release.
#[doc(hidden)]
pub mod test_support {
    pub use crate::runtime::test_hooks::{skew_clock_estimate, stall_wheel};
    pub use crate::scripts::{load_script, script_sha};
}

/// The README's code blocks, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
