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
//! Keys `redwheel:{N}:delayed`, `:msg`, `:ready`, `:inflight`, `:lease`,
//! `:attempts`, `:dead`, `:reason`, `:counts`, `:stale`, `:head` and the
//! `:wake` channel; the controls' `:controls`, `:prioritized`,
//! `:priority`, `:expires`, `:dedup`, `:rate` and `:throttle:<key>`; six
//! more for recurring schedules (`:schedules`, `:schedules:payload`,
//! `:schedules:next`, `:schedules:last`, `:schedules:changes`,
//! `:schedules:ahead`), and the
//! short-lived reply records of take and claim calls
//! (`:reply:<process>.<slot>`), all under the hash tag `{N}`, so every
//! script of a queue touches one cluster slot. What each holds and which
//! scripts write
//! it is in the one table of the repository's `ARCHITECTURE.md` ("Redis
//! keys and scripts").
//!
//! Every state change is one Lua script (`lua/*.lua` in the repository):
//! offer, batch offer, offer with options, transfer, remove, clear, take,
//! park, claim, ack, nack, extend, dead, requeue, stats, len, controls.
//! Due times and
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
//!   writes an id at most once while it is known, or, to rule out a second
//!   message after a fast consumer took the first, with
//!   [`Queue::offer_with`] and [`Dedup::Throttle`]. An offer is never sent
//!   twice behind the caller's back.
//! * **Delivery**: never early by the Redis server clock (a message moves
//!   to the ready list only once `due <= TIME`), in due order within a
//!   priority (higher priorities first), exactly once to the ready list
//!   however many processes transfer the queue; messages one process
//!   offers with equal due times and priority, in offer order (with ids of
//!   the caller's own, in the ids' byte order); never after its ttl.
//! * **Controls** (pause, rate limit, max in flight, max length) are kept
//!   in Redis and applied by the scripts in the same atomic step as the
//!   hand-out or the offer, for every process; see [`QueueOptions`],
//!   [`OfferOptions`], [`Queue::pause`].
//! * **Take** is **at-most-once**: a message is deleted from Redis by the
//!   same script that hands it to a consumer, so a consumer that dies from
//!   then on loses it. Nothing is lost before that point (a consumer blocks
//!   on the ready list without popping), nor with a lost reply: the script
//!   records what it handed out, and the take is sent again and answered
//!   with that message (claims likewise: `claim`, `consume`).
//! * **Claim ahead** ([`ConsumerOptions::claim_ahead`]): a consumer pool
//!   may claim delayed messages up to a window before their due time
//!   (at-least-once, the visibility counted from the due time) and start
//!   each handler at its due time from its own wheel, never before; a
//!   message so claimed is out of reach of `remove` and of a schedule's
//!   pause for the rest of the window. Queues with controls are not
//!   claimed ahead.
//! * **Faults**: every write either did its work exactly once and says so,
//!   or did not and says so, or returns [`ErrorKind::OutcomeUnknown`]; the
//!   guide's [When the connection drops](crate::guide::connection_drops)
//!   has the table of what each call does when its connection drops
//!   before the command, after it ran, mid-reply, or when the reply is
//!   late.
//! * **Futures** (feature `async`): `offer_async`, `take_async`,
//!   `claim_async`, `ack_async`… give what their synchronous twins give, on
//!   the same scripts, and never lose a message when dropped (see the
//!   guide's [Async](crate::guide::async_futures) for each operation).
//! * **Latency**: each [`Redwheel`] keeps one wheel timeout per queue at the
//!   head's due time, replaced only by an earlier head announced on the wake
//!   channel; a guard sweep (default every second) covers a lost wake-up or
//!   a dead process. The sweep reads one small key per queue (a lower
//!   bound of its due times and deadlines, kept by every script that adds
//!   one) and runs the transfer only when that is due.
//!
//!
//! # Recurring schedules
//!
//! [`Queue::schedule`]`(name, &schedule, &payload)` puts a
//! [`Schedule`](crate::schedule::Schedule) (a cron expression in a time
//! zone, or a fixed period) on the queue: each of its occurrences becomes
//! one message of the queue carrying `payload`, due at the occurrence,
//! consumed like any other (take, claim, consume), with the id
//! `sched:<name>:<occurrence in epoch ms>`.
//!
//! * **Exactly once per occurrence.** Every process that has the queue
//!   open fires its schedules (one driver job per queue, armed at the
//!   earliest next occurrence); an occurrence is offered by the one script
//!   call that also moves its schedule's stored next occurrence past it,
//!   and only from the value that call's plan was made from. So any number
//!   of processes, a retry after [`ErrorKind::OutcomeUnknown`], a process
//!   killed at any instant, or a Redis restart with `appendfsync always`
//!   never offers an occurrence twice, and each occurrence is offered as
//!   soon as one process runs. (A Redis failover can replay the last
//!   firing a replica had not received, as it can any write.)
//! * **Server time.** Occurrences are judged by the Redis server's `TIME`;
//!   a process's clock estimate only arms its wheel, and a firing planned
//!   early is refused by the script: the catch-up policy only judges
//!   occurrences at or before the server's `TIME`, and none is offered more
//!   than the lead (below) before it.
//! * **Downtime.** Occurrences that passed while no process ran are
//!   settled by the schedule's [`CatchUp`](crate::schedule::CatchUp)
//!   policy when a process comes back: by default
//!   [`Latest`](crate::schedule::CatchUp::Latest), the most recent one
//!   fires once and the others are skipped (see `CatchUp` for why).
//! * **Changes.** Declaring the same schedule and payload again changes
//!   nothing, so every process may declare its schedules at start-up; a
//!   different definition or payload replaces them, and the new definition
//!   goes on from that call (or from an occurrence the old one still owed:
//!   nothing owed is dropped). [`Queue::pause_schedule`] stops it (what falls
//!   while paused is not owed), [`Queue::resume_schedule`] restarts it,
//!   [`Queue::unschedule`] deletes it; its occurrences already due stay
//!   (those offered ahead and not yet due are taken back by the pause, the
//!   replacement or the removal, in the same script: none of them is ever
//!   delivered). [`Queue::schedules`] lists them with their next occurrence and
//!   last one fired; `Redwheel::inspect_schedules` does the same without
//!   opening the queue. [`Queue::trigger_schedule`] fires one by hand: its
//!   payload as one more message, due now, under a fresh id (not one of
//!   its occurrences, which go on as before).
//! * **Fired ahead.** Each occurrence is offered up to a lead of 100 ms
//!   before it falls due, as a message due at the occurrence (so never
//!   delivered before it), and the queue's transfer is armed for it: at
//!   the occurrence only the transfer (one script call for up to a batch
//!   of occurrences) stands between it and the consumers, however many
//!   schedules fall due at once. Within the lead, [`ScheduleInfo`]'s
//!   `last_fired` already shows the waiting occurrence (and `next` the one
//!   after it), and the firing lateness metric counts it as 0 (it measures
//!   how late an occurrence was written, relative to its time). An
//!   occurrence fired late (no process was running, or its wheel was held
//!   up past the lead) is offered due at once and moved to the ready list
//!   in the same round trip. A pool with `claim_ahead` of 100 ms or more
//!   claims an occurrence as soon as it is written and starts it at its
//!   time, with no round trip left at all; such an occurrence is no longer
//!   taken back by a pause, replacement or removal.
//!
//! [`ScheduleInfo`]: crate::schedule::ScheduleInfo
//!
//! [`ErrorKind::Unavailable`]: crate::ErrorKind::Unavailable
//! [`ErrorKind::OutcomeUnknown`]: crate::ErrorKind::OutcomeUnknown
//! [`Redwheel`]: crate::Redwheel

// The files are in layers, each importing only its own and lower ones
// (ARCHITECTURE.md lists them): 1 the base (codec, stored, keys, ids,
// message, options, gate, limits, request, transfer, schedules' stored and
// mirror, asynk's coalesce), 2 the job, 3 the state, 4 the handle, 5 the
// calls (`impl Queue`: pop, delivery, claim, take, offer, …), 6 on top
// (consumer, asynk, inspect).
#[cfg(feature = "async")]
mod asynk;
mod claim;
mod codec;
mod consumer;
mod controls;
mod dead;
mod delivery;
mod gate;
mod handle;
mod ids;
pub mod inspect;
mod job;
mod keys;
mod limits;
mod message;
mod offer;
mod offer_with;
mod options;
mod pop;
mod remove;
mod request;
mod schedules;
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
pub use self::limits::{Limit, QueueLimits};
pub use self::message::{Message, MessageId};
pub use self::offer_with::{Dedup, MAX_PRIORITY, OfferOptions, Offered};
pub use self::options::{ConsumerOptions, QueueOptions};
pub use self::schedules::MAX_SCHEDULE_NAME_LEN;
pub use self::stats::QueueStats;
// For the dashboard's reads of many queues in one round trip per master.
#[cfg(feature = "web")]
pub(crate) use self::keys::Keys;
#[cfg(feature = "web")]
pub(crate) use self::limits::{decode_paused, pipe_paused};
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
