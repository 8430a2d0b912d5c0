//! # redwheel
//!
//! A Netty-style hashed timing wheel for synchronous Rust programs, and the
//! engine of redwheel's Redis-persisted delayed queues and lock watchdogs.
//!
//! ## The timer
//!
//! [`timer::HashedWheelTimer`] runs tasks after a delay on one dedicated
//! worker thread. Scheduling is a lock-free push; cancelling is a
//! compare-and-swap; the worker moves timeouts into a ring of buckets once
//! per tick and runs those that are due.
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

#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod error;
pub mod timer;

pub use error::TimerError;
