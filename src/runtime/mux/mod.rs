//! The futures' side of the runtime (feature `async`): one multiplexed,
//! pipelined connection per node (per master on a cluster), each served by
//! one I/O thread of redwheel's, and the calls that go through them.
//!
//! No executor runs inside: a future hands its command to an I/O thread
//! and returns `Pending`; the I/O thread wakes it with the reply. Waits
//! (a backoff, a deadline) are timeouts on the driver's wheel
//! (`runtime/wait.rs`). So a future never blocks the thread that polls
//! it, on any executor.
//!
//! Files, lowest first: `io.rs` (one node's connection and its I/O
//! thread), `set.rs` (the muxes of one `Redwheel`, started on first use,
//! and what its futures share), `call.rs` (one call as a future: routing,
//! redirects, `NOSCRIPT`, no resend after a possible write).
//!
//! Code of the futures' users that runs on redwheel's threads (wakers,
//! what a dropped future leaves behind) runs under [`contained`]: a panic
//! in it is logged and goes no further.

mod call;
mod io;
mod set;

pub(crate) use self::call::{Call, Command, first_reply};
pub(crate) use self::io::{MuxConfig, Orphan, contained};
pub(crate) use self::set::AsyncRuntime;
