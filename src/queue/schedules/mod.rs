//! Recurring schedules on a queue: each occurrence of a
//! [`Schedule`](crate::schedule::Schedule) becomes one message of the
//! queue, offered exactly once whatever the number of processes, their
//! crashes and Redis restarts. See "Recurring schedules" in the
//! [queue module's documentation](crate::queue#recurring-schedules).
//!
//! Lowest first: `stored.rs` (the stored layouts and script replies),
//! `mirror.rs` (a process's copy of a queue's schedules, and the plans it
//! computes), `ops.rs` (the operations on `Queue` and the inspector), `trigger.rs`
//! (firing one by hand). The
//! queue's driver job that fires them is `queue/job.rs`.

pub(crate) mod mirror;
mod ops;
pub(crate) mod stored;
mod trigger;

pub use self::ops::MAX_SCHEDULE_NAME_LEN;
