//! Redis-persisted delayed queues.
//!
//! A message offered with a delay waits in Redis until it is due, then a
//! transfer job moves it to the queue's ready list, where a consumer
//! blocked in [`Queue::take`] gets it. Nothing is held in process memory:
//! any process that opens the queue delivers what is due, including
//! messages offered by processes that have since exited.
//!
//! # Redis layout (queue `N`)
//!
//! Eleven keys, `redwheel:{N}:delayed`, `:msg`, `:ready`, `:inflight`,
//! `:lease`, `:attempts`, `:dead`, `:reason`, `:counts`, `:stale` and the
//! `:wake` channel, plus the short-lived reply records of take and claim
//! calls (`:reply:<process>.<slot>`), all under the hash tag `{N}`, so
//! every script of a queue touches one cluster slot. What each holds and which scripts write
//! it is in the one table of the repository's `ARCHITECTURE.md` ("Redis
//! keys and scripts").
//!
//! Every state change is one Lua script (`lua/*.lua` in the repository):
//! offer, batch offer, transfer, remove, clear, take, park, claim, ack,
//! nack, extend, dead, requeue, stats, len. Due times and
//! "now" come from the server's `TIME`, so machines with skewed clocks
//! agree; relative delays are sent, never client timestamps. No script
//! scans a list.
//!
//! # What each operation guarantees
//!
//! * **Offer**: when `offer` returns `Ok`, the message is in Redis (as
//!   durable as the server's persistence settings make it), written by this
//!   call. When it returns [`ErrorKind::Unavailable`], nothing was written.
//!   When it returns [`ErrorKind::OutcomeUnknown`] (the connection was lost,
//!   or Redis stopped answering, after the command was sent), the message
//!   may or may not be there: retry with [`Queue::offer_with_id`], which
//!   writes an id at most once. An offer is never sent twice behind the
//!   caller's back.
//! * **Delivery**: never early by the Redis server clock (a message moves
//!   to the ready list only once `due <= TIME`), in due order, exactly once
//!   to the ready list however many processes transfer the queue; messages
//!   one process offers with equal due times, in offer order.
//! * **Take** is **at-most-once**: a message is deleted from Redis by the
//!   same script that hands it to a consumer, so a consumer that dies from
//!   then on loses it. Nothing is lost before that point (a consumer blocks
//!   on the ready list without popping), nor with a lost reply: the script
//!   records what it handed out, and the take is sent again and answered
//!   with that message (claims likewise: `claim`, `consume`).
//! * **Faults**: every write either did its work exactly once and says so,
//!   or did not and says so, or returns [`ErrorKind::OutcomeUnknown`]; the
//!   repository's README has the table of what each call does when its
//!   connection drops before the command, after it ran, mid-reply, or
//!   when the reply is late.
//! * **Futures** (feature `async`): `offer_async`, `take_async`,
//!   `claim_async`, `ack_async`… give what their synchronous twins give, on
//!   the same scripts, and never lose a message when dropped (see the
//!   README's "Async" for each operation).
//! * **Latency**: each [`Redwheel`] keeps one wheel timeout per queue at the
//!   head's due time, replaced only by an earlier head announced on the wake
//!   channel; a guard sweep (default every second) covers a lost wake-up or
//!   a dead process.
//!
//! [`ErrorKind::Unavailable`]: crate::ErrorKind::Unavailable
//! [`ErrorKind::OutcomeUnknown`]: crate::ErrorKind::OutcomeUnknown
//! [`Redwheel`]: crate::Redwheel

#[cfg(feature = "async")]
mod asynk;
mod claim;
mod codec;
mod consumer;
mod dead;
mod delivery;
mod handle;
mod ids;
pub mod inspect;
mod keys;
mod message;
mod offer;
mod options;
mod pop;
mod remove;
mod request;
mod state;
mod stats;
mod stored;
mod take;
mod transfer;

use crate::error::Error;

#[cfg(feature = "serde")]
#[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
pub use self::codec::Json;
pub use self::codec::{Codec, CodecError};
pub use self::consumer::Consumer;
#[cfg(feature = "async")]
#[cfg_attr(docsrs, doc(cfg(feature = "async")))]
pub use self::consumer::Deliveries;
pub use self::dead::DeadLetter;
pub use self::delivery::{Delivery, Nacked};
pub use self::handle::{Queue, TransferStats};
pub use self::keys::{MAX_ID_LEN, MAX_NAME_LEN};
pub use self::message::{Message, MessageId};
pub use self::options::{ConsumerOptions, QueueOptions};
pub use self::stats::QueueStats;
// For the dashboard's reads of many queues in one round trip per master.
#[cfg(feature = "web")]
pub(crate) use self::keys::Keys;
#[cfg(feature = "web")]
pub(crate) use self::stats::{decode_stats, pipe_stats};

/// Checks a queue name as [`Redwheel::queue`] does, without Redis: non-empty,
/// at most [`MAX_NAME_LEN`] bytes, no `{` or `}` (they delimit the hash
/// tag), no control characters. Fails with [`ErrorKind::InvalidName`].
///
/// ```
/// use redwheel::{ErrorKind, queue};
///
/// assert!(queue::validate_name("orders").is_ok());
/// let e = queue::validate_name("orders{eu}").unwrap_err();
/// assert_eq!(e.kind(), ErrorKind::InvalidName);
/// ```
///
/// [`ErrorKind::InvalidName`]: crate::ErrorKind::InvalidName
/// [`Redwheel::queue`]: crate::Redwheel::queue
pub fn validate_name(name: &str) -> Result<(), Error> {
    keys::validate_name(name)
}
