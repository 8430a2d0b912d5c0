//! Error types: [`TimerError`] for the timer alone, and one [`Error`] (with
//! its [`ErrorKind`]) for everything Redis-backed.
//!
//! Every fallible public operation returns one of these; nothing in the
//! public API panics on bad input.
//!
//! Files: `timer.rs` ([`TimerError`]), `kind.rs` ([`ErrorKind`]),
//! `redwheel_error.rs` ([`Error`] itself), `classify.rs` (how a `redis`
//! crate error becomes an [`Error`]: its kind, and a message that says what
//! it means and what to do) and `reply.rs` (Redis's reply in words, and the
//! script it came from).

mod classify;
mod kind;
mod redwheel_error;
mod reply;
mod timer;

pub(crate) use self::classify::Access;
pub use self::kind::ErrorKind;
pub use self::redwheel_error::{CodecError, Error};
pub use self::timer::TimerError;
