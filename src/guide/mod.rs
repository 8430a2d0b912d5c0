//! # The redwheel guide
//!
//! What redwheel does and promises, chapter by chapter, beside the API
//! reference of each module. Every example here is a doc test that
//! `cargo test --doc` compiles **and runs**; those that need Redis run
//! against a throwaway `redis-server` (or `REDIS_URL`), whose URL the
//! examples call `redis_url`: in your code, `"redis://127.0.0.1:6379"` or
//! wherever your Redis is.
//!
//! Read in this order:
//!
//! 1. [The timer](timer): the hashed timing wheel on its own, what a
//!    timeout promises, and where redwheel differs from Netty's.
//! 2. [Delayed queues](queues): offer, take, remove; payloads; what each
//!    operation guarantees; errors.
//! 3. [When the connection drops](connection_drops): what every call does
//!    when its connection fails at each point, and the chaos run that puts
//!    all of it under every fault at once.
//! 4. [At-least-once consumers](consumers): claim, ack, the consumer pool,
//!    claiming ahead for on-time starts.
//! 5. [Queue controls](controls): dedup, priorities, ttl, length, rate and
//!    in-flight limits, pause.
//! 6. [Recurring schedules](schedules): cron and fixed periods, what cron
//!    means here and the daylight-saving rules, exactly once per
//!    occurrence, catch-up.
//! 7. [Locks](locks): the watchdog, lost leases, fencing tokens and what
//!    no lock can promise.
//! 8. [Async](async_futures) (feature `async`): every operation as a
//!    future for any executor, and what dropping each one does.
//! 9. [In production](production): URLs, TLS, a least-privilege ACL user,
//!    Redis Cluster and what a failover can lose.
//! 10. [How it works](how_it_works): keys, scripts, the driver.
//! 11. [Operating it](operating): the `redwheel` command-line tool,
//!     metrics and tracing.
//! 12. [The dashboard](dashboard) (feature `web`).
//! 13. [Checking the timer](verification): the `unsafe` code's proof
//!     (loom, Miri), fuzzing and the property tests.
//!
//! The measured figures, each beside its peer, are in the repository's
//! `BENCHMARKS.md`; the map of the code is its `ARCHITECTURE.md`.

#[doc = include_str!("timer.md")]
pub mod timer {}

#[doc = include_str!("queues.md")]
pub mod queues {}

#[doc = include_str!("connection_drops.md")]
pub mod connection_drops {}

#[doc = include_str!("consumers.md")]
pub mod consumers {}

#[doc = include_str!("controls.md")]
pub mod controls {}

#[doc = include_str!("schedules.md")]
pub mod schedules {}

#[doc = include_str!("locks.md")]
pub mod locks {}

#[doc = include_str!("async_futures.md")]
pub mod async_futures {}

#[doc = include_str!("production.md")]
pub mod production {}

#[doc = include_str!("how_it_works.md")]
pub mod how_it_works {}

#[doc = include_str!("operating.md")]
pub mod operating {}

#[doc = include_str!("dashboard.md")]
pub mod dashboard {}

#[doc = include_str!("verification.md")]
pub mod verification {}
