//! # redwheel
//!
//! A Netty-style hashed timing wheel for synchronous Rust programs, and the
//! engine of redwheel's Redis-persisted delayed queues and lock watchdogs.
//!
//! ## The timer
//!
//! [`timer::HashedWheelTimer`] runs tasks after a delay on one dedicated
//! worker thread. Scheduling is a push onto the calling thread's own queue
//! (one atomic read-modify-write, no lock, no allocator call); cancelling
//! is a compare-and-swap; the worker moves timeouts into a ring of buckets
//! once per tick and runs those that are due.
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
//! A [`Redwheel`] connects to Redis and owns one timer, a transfer thread and
//! a subscriber connection. A message offered with a delay waits in Redis
//! (so it survives any crash of this process); at its due time, by the
//! Redis server's clock, a wheel timeout runs an atomic Lua script that
//! moves it to the queue's ready list, where [`Queue::take`] and
//! [`Queue::poll`] find it. Any number of processes may offer to, transfer
//! and consume one queue at once.
//!
//! ```no_run
//! use std::time::Duration;
//! use redwheel::Redwheel;
//!
//! let rw = Redwheel::connect("redis://127.0.0.1:6379")?;
//! let q = rw.queue::<String>("orders")?;
//! let id = q.offer(&"order-42".to_string(), Duration::from_secs(600))?;
//! assert!(q.remove(&id)?); // cancelled by id, in O(log n)
//!
//! q.offer(&"order-43".to_string(), Duration::from_millis(50))?;
//! let m = q.take()?; // blocks until a message is due
//! println!("{} was due at {:?}", m.payload(), m.due());
//! rw.shutdown(Duration::from_secs(5))?;
//! # Ok::<(), redwheel::QueueError>(())
//! ```

#![deny(missing_docs)]
#![deny(unsafe_code)]

mod error;
pub mod queue;
mod redwheel;
mod scripts;
// The timer's fast path (pooled slots, per-thread rings) is unsafe code,
// each block with its `// SAFETY:` argument, covered by Miri and loom.
#[allow(unsafe_code)]
pub mod timer;

pub use error::{QueueError, TimerError};
pub use queue::{Codec, Message, MessageId, Queue, QueueOptions};
pub use redwheel::{Redwheel, RedwheelOptions};

/// The README's code blocks, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
