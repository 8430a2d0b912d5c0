//! [`Redwheel`]: what every Redis-backed part of redwheel shares.
//!
//! One `Redwheel` owns:
//!
//! * **the driver** (`driver/`): a 1 ms hashed wheel and a thread that
//!   runs *due work* at Redis deadlines, the one place where a deadline on
//!   the server's clock becomes a wheel timeout (coalescing per key, guard
//!   sweeps, retries with backoff, a run of everything after a reconnect);
//! * **connections** (`endpoint.rs`, `conn.rs`, `pool.rs`, and `cluster/`
//!   on a Redis Cluster): a pool for short commands, so many
//!   threads can write at once, a second pool for blocking reads (each
//!   blocked caller holds its own connection, blocking server-side for at
//!   most [`RedwheelOptions::max_block`] at a time so shutdown is prompt),
//!   and the driver's own connection;
//! * **the subscriber** (`subscriber.rs`): one pub/sub connection for every
//!   channel listened to, resubscribed after a reconnect;
//! * **the server clock estimate** (`server_clock.rs`): `server − local`,
//!   measured with `TIME` at connect and refreshed periodically.
//!
//! # Threads
//!
//! * the wheel's worker: moves timeouts and marks keys due (a short lock); it
//!   never waits on Redis;
//! * the driver thread: all Redis I/O of due work, one pipelined round trip
//!   per connection per round;
//! * the subscriber thread.
//!
//! `ARCHITECTURE.md` at the root of the repository maps every file.

mod backoff;
mod cluster;
mod conn;
pub(crate) mod driver;
mod endpoint;
mod keyslot;
#[cfg(feature = "async")]
mod mux;
mod names;
mod node_transport;
mod options;
mod pool;
mod redwheel;
mod replicas;
mod server_clock;
mod shared;
mod subscriber;
pub(crate) mod test_hooks;
#[cfg(feature = "async")]
mod wait;

pub(crate) use self::backoff::Backoff;
pub(crate) use self::conn::Conn;
pub use self::driver::DriverStats;
pub(crate) use self::driver::{Commands, Deadline, Job, Next, Replies};
pub(crate) use self::keyslot::slot;
#[cfg(feature = "async")]
pub(crate) use self::mux::{Call, Command, Orphan, contained, first_reply};
pub(crate) use self::names::{MAX_TAG_NAME_LEN, random_u64, validate_tag_name};
pub use self::options::RedwheelOptions;
pub(crate) use self::pool::shut_down;
pub use self::redwheel::Redwheel;
pub(crate) use self::replicas::WaitReplicas;
#[cfg(feature = "async")]
pub(crate) use self::replicas::run_alone;
pub(crate) use self::shared::{Blocking, Runtime};
pub(crate) use self::subscriber::Subscription;
#[cfg(feature = "async")]
pub(crate) use self::wait::{Cell, WaitList, detach};
