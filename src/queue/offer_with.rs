//! [`Queue::offer_with`]: one offer with every option ([`OfferOptions`]):
//! when, under which dedup key and [`Dedup`] mode, at which priority, with
//! which ttl; and what happened ([`Offered`]).

use std::fmt;
use std::time::{Duration, SystemTime};

use super::codec::Codec;
use super::handle::{Queue, check_id, epoch_ms};
use super::ids::{self, new_message_id};
use super::message::MessageId;
use crate::error::{Access, Error, ErrorKind};
use crate::scripts;
use crate::telemetry;

/// Highest priority ([`OfferOptions::priority`]).
pub const MAX_PRIORITY: u8 = 9;

/// Longest throttle window and ttl accepted.
const MAX_WINDOW: Duration = Duration::from_secs(366 * 86_400);

/// What an offer under a dedup key ([`OfferOptions::id`]) does when the
/// queue already has a message under that key. Every mode is one atomic
/// script: however many producers, in however many processes, offer under
/// one key at once, the outcomes are as if they came one after another.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Dedup {
    /// While a message under the key is known to the queue (delayed, ready,
    /// in flight, or a dead letter), a new offer is dropped
    /// ([`Offered::Kept`]) and the known one is left as it is. Once that
    /// message is gone (taken, acked or removed) the key is free again: a
    /// new offer is written. What [`Queue::offer_with_id`] does.
    ///
    /// A producer that retries after [`ErrorKind::OutcomeUnknown`] gets
    /// [`Offered::Kept`] while its first attempt's message waits, but a
    /// second message if a consumer already took or acked the first: use
    /// [`Throttle`](Dedup::Throttle) with a window longer than the retries
    /// to rule that out.
    Keep,
    /// As [`Keep`](Dedup::Keep), and besides: for `window` after an offer
    /// under the key was written, every other offer under it is dropped
    /// ([`Offered::Throttled`]), even once that message was delivered and
    /// acked. So at most one message per key per window.
    ///
    /// This is also the safe retry: a producer that retries an offer after
    /// [`ErrorKind::OutcomeUnknown`] (or after a crash) under the same key,
    /// within `window` of the attempt that may have been written, writes
    /// the message at most once, whatever the consumers did meanwhile. The
    /// window is kept in Redis as a key of its own with that TTL
    /// (`redwheel:{N}:throttle:<key>`), so it holds across processes and
    /// restarts. 1 ms ..= 366 days.
    Throttle(Duration),
    /// The newest offer wins while the message waits: if the message under
    /// the key has never been handed out (delayed or ready), it gets the new
    /// payload, due time, priority and ttl ([`Offered::Replaced`]; a ready
    /// one goes back to the delayed set). If it was handed out already (in
    /// flight, waiting for a retry after a nack or an expired visibility, or
    /// a dead letter), the new one is written beside it under a fresh id
    /// ([`Offered::WrittenAfter`]) and the key leads to that one from then
    /// on; none known: written under the key ([`Offered::Written`]).
    Debounce,
}

/// When an [`OfferOptions`] message is due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Due {
    After(Duration),
    At(SystemTime),
}

/// Everything one offer can say, for [`Queue::offer_with`]: when the
/// message is due, under which key, with which dedup mode, priority and
/// ttl.
///
/// ```no_run
/// use std::time::Duration;
/// use redwheel::{Dedup, OfferOptions, Offered, Redwheel};
///
/// let rw = Redwheel::connect("redis://127.0.0.1:6379")?;
/// let q = rw.queue::<String>("search-index")?;
/// // Reindex document 42 five seconds after its last edit, not after each one.
/// let r = q.offer_with(&"reindex 42".to_string(), OfferOptions::after(Duration::from_secs(5))
///     .id("doc-42")
///     .dedup(Dedup::Debounce)
///     .priority(3)                        // before the bulk reindexing at priority 0
///     .ttl(Duration::from_secs(600)))?;   // pointless after ten minutes: a dead letter then
/// match r {
///     Offered::Written(id) => println!("queued {id}"),
///     Offered::Replaced(id) => println!("{id} now waits for the newest edit"),
///     other => println!("{other:?}"),
/// }
/// # Ok::<(), redwheel::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OfferOptions {
    due: Due,
    id: Option<MessageId>,
    dedup: Option<Dedup>,
    priority: u8,
    ttl: Option<Duration>,
}

impl Default for OfferOptions {
    /// Due at once, a fresh id, priority 0, no ttl.
    fn default() -> Self {
        OfferOptions::after(Duration::ZERO)
    }
}

impl OfferOptions {
    /// Due `delay` from now, by the Redis server's clock.
    pub fn after(delay: Duration) -> OfferOptions {
        OfferOptions {
            due: Due::After(delay),
            id: None,
            dedup: None,
            priority: 0,
            ttl: None,
        }
    }

    /// Due at `at` (wall-clock time, compared with the Redis server's
    /// clock); a time in the past is clamped to now.
    pub fn at(at: SystemTime) -> OfferOptions {
        OfferOptions {
            due: Due::At(at),
            ..OfferOptions::after(Duration::ZERO)
        }
    }

    /// The message's id, which is also its dedup key: without a
    /// [`dedup`](OfferOptions::dedup) mode, [`Dedup::Keep`]. Without an id
    /// the message gets a fresh one and no dedup applies. 1 ..= 128 bytes.
    pub fn id(mut self, id: impl Into<MessageId>) -> OfferOptions {
        self.id = Some(id.into());
        self
    }

    /// What to do when a message under the same key is known (see
    /// [`Dedup`]). Needs an [`id`](OfferOptions::id).
    pub fn dedup(mut self, mode: Dedup) -> OfferOptions {
        self.dedup = Some(mode);
        self
    }

    /// 0 (the default) ..= 9: among messages that are due, a higher number
    /// is handed out first, even before lower ones that fell due earlier;
    /// equal priorities keep due order (and offer order for equal due
    /// times). Ten levels: Redisson's range, and what the ready set's
    /// scores hold exactly (each level is a band of 2^49 ms of due times in
    /// a 2^53 score). A steady stream at a high priority starves the lower
    /// ones: priorities order a backlog, they do not share out capacity.
    pub fn priority(mut self, priority: u8) -> OfferOptions {
        self.priority = priority;
        self
    }

    /// The message must be handed out (by `take`, `poll`, `claim` or
    /// `consume`) within `ttl` of its due time. If it is not, it becomes a
    /// dead letter with reason `expired` (counted in [`QueueStats::expired`]
    /// and the `redwheel_messages_expired_total` metric) and is never
    /// delivered: not late, not at all. Once handed out, the ttl no longer
    /// applies (a redelivery after a nack or an expired visibility is
    /// governed by `max_deliveries`). The queue's transfer job kills it at
    /// due + ttl (also while the queue is paused, or has no consumer); a
    /// consumer that meets it first kills it instead of taking it.
    /// 1 ms ..= 366 days.
    ///
    /// [`QueueStats::expired`]: crate::QueueStats::expired
    pub fn ttl(mut self, ttl: Duration) -> OfferOptions {
        self.ttl = Some(ttl);
        self
    }
}

/// What [`Queue::offer_with`] did.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Offered {
    /// A new message was written under this id (the dedup key, or a fresh
    /// id when none was given).
    Written(MessageId),
    /// [`Dedup::Debounce`]: the message under the key (`after`) had been
    /// handed out already, so the new one was written beside it under a
    /// fresh id (`id`); later offers under the key debounce that one.
    WrittenAfter {
        /// The new message's id.
        id: MessageId,
        /// The message it follows (in flight, waiting for a retry, or dead).
        after: MessageId,
    },
    /// [`Dedup::Debounce`]: the waiting message with this id now has the
    /// new payload, due time, priority and ttl.
    Replaced(MessageId),
    /// [`Dedup::Keep`] (or [`Dedup::Throttle`] past its window): a message
    /// with this id is known to the queue; nothing was written, it is
    /// unchanged.
    Kept(MessageId),
    /// [`Dedup::Throttle`]: an offer under the key was written within the
    /// window; nothing was written. The id is the key's message, which may
    /// be gone already (delivered).
    Throttled(MessageId),
}

impl Offered {
    /// The message the offer wrote or matched.
    pub fn id(&self) -> &MessageId {
        match self {
            Offered::Written(id)
            | Offered::WrittenAfter { id, .. }
            | Offered::Replaced(id)
            | Offered::Kept(id)
            | Offered::Throttled(id) => id,
        }
    }

    /// True when the offer added a message to the queue ([`Written`] or
    /// [`WrittenAfter`]).
    ///
    /// [`Written`]: Offered::Written
    /// [`WrittenAfter`]: Offered::WrittenAfter
    pub fn is_written(&self) -> bool {
        matches!(self, Offered::Written(_) | Offered::WrittenAfter { .. })
    }
}

impl fmt::Display for Offered {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Offered::Written(id) => write!(f, "written as {id}"),
            Offered::WrittenAfter { id, after } => {
                write!(f, "written as {id}, after {after} (already delivered)")
            }
            Offered::Replaced(id) => write!(f, "replaced {id}"),
            Offered::Kept(id) => write!(f, "dropped: {id} is known"),
            Offered::Throttled(id) => write!(f, "dropped: {id} was offered within the window"),
        }
    }
}

impl<T: Codec> Queue<T> {
    /// Offers `payload` with `options`: when it is due, under which dedup
    /// key and mode, at which priority, with which ttl (see
    /// [`OfferOptions`] and [`Dedup`]). Says what happened: written (with
    /// its id), or which message under the key it matched and what it did
    /// to it.
    ///
    /// [`offer`](Queue::offer), [`offer_at`](Queue::offer_at) and
    /// [`offer_with_id`](Queue::offer_with_id) are shorthands for
    /// `offer_with(p, OfferOptions::after(d))`, `…::at(t)` and
    /// `…::after(d).id(id)` (mode [`Dedup::Keep`]).
    ///
    /// Fails with [`ErrorKind::QueueFull`] when a message would be added to
    /// a queue at its `max_len` (nothing is written; a replacement adds
    /// none), [`ErrorKind::InvalidOption`] for a priority above 9, a zero or
    /// over-long ttl or throttle window, or a dedup mode without an id,
    /// [`ErrorKind::InvalidId`], and as [`offer`](Queue::offer) otherwise.
    /// After [`ErrorKind::OutcomeUnknown`], offering again under the same
    /// key is safe with [`Dedup::Throttle`] (at most one message per
    /// window) and [`Dedup::Debounce`] (the same message replaced, unless it
    /// was delivered meanwhile); with [`Dedup::Keep`] only while the first
    /// attempt's message has not been consumed.
    pub fn offer_with(&self, payload: &T, options: OfferOptions) -> Result<Offered, Error> {
        let (mode, window_ms) = match (&options.id, options.dedup) {
            (None, None) => ("n", 0),
            (None, Some(_)) => {
                return Err(self.tag(invalid("dedup", "a dedup mode needs an id (the key)")));
            }
            (Some(_), None | Some(Dedup::Keep)) => ("k", 0),
            (Some(_), Some(Dedup::Throttle(w))) => ("t", self.window_ms("throttle window", w)?),
            (Some(_), Some(Dedup::Debounce)) => ("d", 0),
        };
        if options.priority > MAX_PRIORITY {
            return Err(self.tag(invalid(
                "priority",
                &format!("{} is not in 0..={MAX_PRIORITY}", options.priority),
            )));
        }
        let ttl_ms = match options.ttl {
            Some(ttl) => self.window_ms("ttl", ttl)?,
            None => 0,
        };
        if let Some(id) = &options.id {
            check_id(id).map_err(|e| self.tag(e))?;
        }
        let bytes = self.encode(payload)?;
        let (how, when) = match options.due {
            Due::After(d) => ("r", self.delay_ms(d)?),
            Due::At(t) => ("a", epoch_ms(t).map_err(|e| self.tag(e))?),
        };
        let key = match &options.id {
            Some(id) => id.as_str().to_owned(),
            None => new_message_id(),
        };
        let successor = if mode == "d" {
            new_message_id()
        } else {
            String::new()
        };
        let keys = &self.state.keys;
        let throttle = keys.throttle(&key);
        let _span = telemetry::queue_op("offer_with", &self.state.name, 1);
        let (reply, replicas): (Vec<redis::Value>, Option<i64>) = self
            .rt()
            .run(&keys.delayed, Access::Write, |con| {
                let reply = scripts::OFFER_WITH
                    .key(&keys.delayed)
                    .key(&keys.msg)
                    .key(&keys.wake)
                    .key(&keys.controls)
                    .key(&keys.dead)
                    .key(&keys.inflight)
                    .key(&keys.prioritized)
                    .key(&keys.priority)
                    .key(&keys.expires)
                    .key(&keys.dedup)
                    .key(&keys.stale)
                    .key(&keys.attempts)
                    .key(&throttle)
                    .key(&keys.head)
                    .arg(how)
                    .arg(when)
                    .arg(&key)
                    .arg(bytes.as_ref())
                    .arg(u32::from(options.priority))
                    .arg(ttl_ms)
                    .arg(mode)
                    .arg(window_ms)
                    .arg(&successor)
                    .invoke(con)?;
                Ok((reply, self.wait(con)?))
            })
            .map_err(|e| self.tag(e).for_message(&key))?;
        if mode == "n" && matches!(reply.first(), Some(redis::Value::Int(0))) {
            // The fresh id was known already: another process shares this
            // one's id prefix. Nothing was written.
            ids::reseed();
            return Err(self.id_in_use(&key, true));
        }
        let offered = read_offered(&reply).ok_or_else(|| {
            self.tag(Error::new(
                ErrorKind::Protocol,
                format!("unexpected reply to offer_with.lua: {reply:?}"),
            ))
        })?;
        if offered.is_written() {
            self.state.metrics.offered.add(1);
        }
        self.check_replicas(replicas, Some(offered.id().as_str()))?;
        Ok(offered)
    }

    /// A ttl or throttle window in whole ms (rounded up), 1 ms ..= 366 days.
    fn window_ms(&self, what: &str, d: Duration) -> Result<u64, Error> {
        if d.is_zero() || d > MAX_WINDOW {
            return Err(self.tag(invalid(
                what,
                &format!("{d:?} is not within 1 ms ..= 366 days"),
            )));
        }
        Ok(d.as_nanos().div_ceil(1_000_000) as u64)
    }
}

fn invalid(name: &str, reason: &str) -> Error {
    Error::new(
        ErrorKind::InvalidOption,
        format!("invalid offer option `{name}`: {reason}"),
    )
}

/// offer_with.lua's reply `{ code, id, due [, before] }`.
fn read_offered(reply: &[redis::Value]) -> Option<Offered> {
    let code: i64 = redis::from_redis_value(reply.first()?.clone()).ok()?;
    let id: String = redis::from_redis_value(reply.get(1)?.clone()).ok()?;
    let id = MessageId(id);
    Some(match code {
        1 => Offered::Written(id),
        2 => {
            let before: String = redis::from_redis_value(reply.get(3)?.clone()).ok()?;
            Offered::WrittenAfter {
                id,
                after: MessageId(before),
            }
        }
        3 => Offered::Replaced(id),
        4 => Offered::Kept(id),
        5 => Offered::Throttled(id),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_map_to_what_happened() {
        let v = |code: i64, id: &str| {
            vec![
                redis::Value::Int(code),
                redis::Value::BulkString(id.as_bytes().to_vec()),
                redis::Value::Int(0),
            ]
        };
        assert_eq!(
            read_offered(&v(1, "a")),
            Some(Offered::Written(MessageId::from("a")))
        );
        assert_eq!(
            read_offered(&v(3, "a")),
            Some(Offered::Replaced(MessageId::from("a")))
        );
        assert_eq!(
            read_offered(&v(4, "a")),
            Some(Offered::Kept(MessageId::from("a")))
        );
        assert_eq!(
            read_offered(&v(5, "a")),
            Some(Offered::Throttled(MessageId::from("a")))
        );
        let mut after = v(2, "b");
        after.push(redis::Value::BulkString(b"a".to_vec()));
        assert_eq!(
            read_offered(&after),
            Some(Offered::WrittenAfter {
                id: MessageId::from("b"),
                after: MessageId::from("a")
            })
        );
        assert_eq!(read_offered(&v(2, "b")), None);
        assert_eq!(read_offered(&v(9, "a")), None);
        assert_eq!(read_offered(&[]), None);
    }

    #[test]
    fn only_written_offers_are_written() {
        let id = MessageId::from("k");
        assert!(Offered::Written(id.clone()).is_written());
        assert!(!Offered::Kept(id.clone()).is_written());
        assert!(!Offered::Replaced(id.clone()).is_written());
        assert_eq!(Offered::Throttled(id.clone()).id(), &id);
    }
}
