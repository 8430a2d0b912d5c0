//! At-least-once consumption, the claimed side: a [`Delivery`] and what
//! its holder does with it (ack, nack, extend).
//!
//! [`Queue::claim`] hands a message over without deleting it: it moves to
//! the in-flight set under a visibility deadline (server clock) and a token
//! of its own, in the same atomic step that takes it off the ready list, so
//! no crash at any instant loses it. [`Delivery::ack`] deletes it; a claim
//! that is neither acked nor given back ([`Delivery::nack`]) in time is
//! delivered again by the queue's transfer job (this process's, or any other
//! process's that has the queue open), with its attempt count raised, until
//! `max_deliveries` is reached and it goes to the dead letters.
//!
//! One of the calls (layer 5 of `queue/`, see `ARCHITECTURE.md`): above
//! the handle, below `claim.rs` and the consumers; a stream of deliveries
//! holds one through `Holder` (feature `async`), defined here and
//! implemented above.

use std::fmt;
#[cfg(feature = "async")]
use std::sync::Arc;
#[cfg(feature = "async")]
use std::sync::atomic::AtomicBool;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::codec::Codec;
use super::handle::Queue;
use super::keys::Keys;
use super::message::MessageId;
use crate::error::{Access, Error, ErrorKind};
use crate::scripts;
use crate::telemetry::{self, QueueMetrics};

/// A claimed message: delivered at least once; [`ack`](Delivery::ack) it
/// when done with it.
///
/// Until it is acked, given back ([`nack`](Delivery::nack)) or its
/// visibility ends, no other consumer gets it. After the visibility ends it
/// is delivered again, and this delivery's `ack`, `nack` and `extend` fail
/// with [`ErrorKind::StaleDelivery`]: they never touch the new delivery.
pub struct Delivery<T> {
    pub(super) queue: Queue<T>,
    pub(super) id: MessageId,
    pub(super) payload: T,
    pub(super) due_ms: u64,
    pub(super) attempt: u32,
    pub(super) token: String,
    /// The visibility deadline, epoch ms on the server's clock.
    pub(super) visible_until_ms: AtomicU64,
    /// Held by a stream of deliveries, which extends it until it is acked,
    /// nacked or dropped (feature `async`).
    #[cfg(feature = "async")]
    pub(super) held: Option<Held>,
}

/// What holds a delivery until it is done with (acked, nacked, dropped):
/// a stream of deliveries (`queue/consumer/stream.rs`), which extends it
/// until then. Defined here, below the consumers, and implemented there.
#[cfg(feature = "async")]
pub(crate) trait Holder: Send + Sync {
    /// The delivery held as `key` is done with: no longer extended.
    fn done(&self, key: usize);
}

/// A delivery's hold by its [`Holder`] (feature `async`), told once that
/// it is done with: at its ack or nack, or when the delivery is dropped.
#[cfg(feature = "async")]
pub(crate) struct Held {
    holder: Arc<dyn Holder>,
    key: usize,
    done: AtomicBool,
}

#[cfg(feature = "async")]
impl Held {
    /// Held as `key` by `holder`.
    pub(crate) fn new(holder: Arc<dyn Holder>, key: usize) -> Held {
        Held {
            holder,
            key,
            done: AtomicBool::new(false),
        }
    }

    /// Done with it (acked, nacked, dropped): tells its holder, once.
    pub(crate) fn done(&self) {
        if !self.done.swap(true, Ordering::AcqRel) {
            self.holder.done(self.key);
        }
    }
}

#[cfg(feature = "async")]
impl Drop for Held {
    fn drop(&mut self) {
        self.done();
    }
}

impl<T: fmt::Debug> fmt::Debug for Delivery<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Delivery")
            .field("queue", &self.queue.state.name)
            .field("id", &self.id)
            .field("payload", &self.payload)
            .field("attempt", &self.attempt)
            .field(
                "visible_until_ms",
                &self.visible_until_ms.load(Ordering::Relaxed),
            )
            .finish_non_exhaustive()
    }
}

/// Why [`Delivery::nack`] left the message where it did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Nacked {
    /// It will be delivered again after the delay.
    Retried,
    /// It reached `max_deliveries` and is now a dead letter.
    Dead,
    /// It was gone already (acked or removed meanwhile): nothing to do.
    Gone,
}

impl<T: Codec> Delivery<T> {
    /// The message's id.
    pub fn id(&self) -> &MessageId {
        &self.id
    }

    /// The payload.
    pub fn payload(&self) -> &T {
        &self.payload
    }

    /// The payload, by value (the delivery can no longer be acked: take
    /// what you need first, or ack before).
    pub fn into_payload(self) -> T {
        self.payload
    }

    /// Which delivery of this message this is: 1 on the first, raised by
    /// every redelivery after a visibility ended and every `nack`.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// When the message was due (as offered), on the Redis server's clock.
    pub fn due(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(self.due_ms)
    }

    /// When the message was due, in ms since the epoch (Redis clock).
    pub fn due_ms(&self) -> u64 {
        self.due_ms
    }

    /// Until when no other consumer gets it (Redis clock).
    pub fn visible_until(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(self.visible_until_ms.load(Ordering::Relaxed))
    }

    /// The claim's token (diagnostics).
    pub fn token(&self) -> &str {
        &self.token
    }

    fn stale_delivery(&self, what: &str) -> Error {
        self.queue.tag(
            Error::new(
                ErrorKind::StaleDelivery,
                format!(
                    "cannot {what}: this delivery's visibility ended and the message was \
                     handed to another consumer (or waits for one)"
                ),
            )
            .for_message(self.id.as_str()),
        )
    }

    /// Done with it: deletes the message for good. Idempotent (an ack
    /// retried after a lost reply succeeds). Fails with
    /// [`ErrorKind::StaleDelivery`] if the visibility ended first and the
    /// message was delivered again, or waits to be.
    pub fn ack(&self) -> Result<(), Error> {
        let keys = &self.queue.state.keys;
        let _span = telemetry::queue_op("ack", &self.queue.state.name, 1);
        let n: i64 = self
            .queue
            .rt()
            .run(&keys.inflight, Access::Write, |con| {
                let mut inv = scripts::ACK.prepare_invoke();
                for k in ack_keys(keys) {
                    inv.key(k);
                }
                inv.arg(self.id.as_str()).arg(&self.token).invoke(con)
            })
            .map_err(|e| self.queue.tag(e).for_message(self.id.as_str()))?;
        self.acked(n)
    }

    /// Reads `ack.lua`'s reply (shared with the async ack).
    pub(super) fn acked(&self, n: i64) -> Result<(), Error> {
        #[cfg(feature = "async")]
        if let Some(h) = &self.held {
            h.done();
        }
        if n < 0 {
            return Err(self.stale_delivery("ack"));
        }
        if n == 1 {
            // Not a repeated ack of a message already gone.
            self.queue.state.metrics.acked.add(1);
            self.queue.state.gate.slot_freed();
        }
        Ok(())
    }

    /// Gives it back: it is delivered again `retry_delay` from now (server
    /// clock), or, if this was delivery number `max_deliveries`, it goes to
    /// the dead letters. Fails with [`ErrorKind::StaleDelivery`] as
    /// [`ack`](Delivery::ack) does.
    pub fn nack(&self, retry_delay: Duration) -> Result<Nacked, Error> {
        self.nack_because(retry_delay, "nacked")
    }

    pub(crate) fn nack_because(&self, retry_delay: Duration, why: &str) -> Result<Nacked, Error> {
        let delay_ms = self.nack_delay_ms(retry_delay);
        let nacked = self
            .queue
            .nack_claim(self.id.as_str(), &self.token, delay_ms, why)
            .map_err(|e| self.queue.tag(e).for_message(self.id.as_str()))?;
        self.nacked(nacked)
    }

    /// Still working on it: no other consumer gets it for `visibility` from
    /// now (server clock). Fails with [`ErrorKind::StaleDelivery`] if the
    /// visibility already ended (it is never revived).
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use redwheel::Redwheel;
    ///
    /// let rw = Redwheel::connect("redis://127.0.0.1:6379")?;
    /// let q = rw.queue::<String>("reports")?;
    /// if let Some(d) = q.claim(Duration::from_secs(1))? {
    ///     for chunk in 0..10 {
    ///         // … a long job, in steps …
    ///         # let _ = chunk;
    ///         d.extend(Duration::from_secs(60))?; // still mine for another minute
    ///     }
    ///     d.ack()?;
    /// }
    /// # Ok::<(), redwheel::Error>(())
    /// ```
    pub fn extend(&self, visibility: Duration) -> Result<(), Error> {
        let keys = &self.queue.state.keys;
        let ms = extend_ms(visibility);
        let _span = telemetry::queue_op("extend", &self.queue.state.name, 1);
        let deadline: i64 = self
            .queue
            .rt()
            .run(&keys.inflight, Access::Write, |con| {
                let mut inv = scripts::EXTEND.prepare_invoke();
                for k in extend_keys(keys) {
                    inv.key(k);
                }
                inv.arg(self.id.as_str())
                    .arg(&self.token)
                    .arg(ms)
                    .invoke(con)
            })
            .map_err(|e| self.queue.tag(e).for_message(self.id.as_str()))?;
        self.extended(deadline, visibility)
    }

    /// Reads `extend.lua`'s reply (shared with the async extend).
    pub(super) fn extended(&self, deadline: i64, visibility: Duration) -> Result<(), Error> {
        if deadline < 0 {
            return Err(self.stale_delivery("extend"));
        }
        self.visible_until_ms
            .store(deadline as u64, Ordering::Relaxed);
        self.queue.announce_deadline(visibility);
        Ok(())
    }

    /// `nack`'s delay in ms, within the due-time limit.
    pub(super) fn nack_delay_ms(&self, retry_delay: Duration) -> u64 {
        let delay_ms = u64::try_from(retry_delay.as_millis()).unwrap_or(u64::MAX);
        delay_ms.min(self.queue.delay_limit())
    }

    /// A `nack.lua` reply for this delivery (`None`: stale).
    pub(super) fn nacked(&self, nacked: Option<Nacked>) -> Result<Nacked, Error> {
        #[cfg(feature = "async")]
        if let Some(h) = &self.held {
            h.done();
        }
        nacked.ok_or_else(|| self.stale_delivery("nack"))
    }
}

impl<T: Codec> Queue<T> {
    /// Runs `nack.lua` for the claim `token` of message `id`: back in
    /// `delay_ms` (server clock), or dead at `max_deliveries`, with the
    /// counters to match. `None`: the claim is no longer current (a stale delivery).
    /// Shared by [`Delivery::nack`] and a consumer's release at shutdown.
    pub(crate) fn nack_claim(
        &self,
        id: &str,
        token: &str,
        delay_ms: u64,
        why: &str,
    ) -> Result<Option<Nacked>, Error> {
        let keys = &self.state.keys;
        let _span = telemetry::queue_op("nack", &self.state.name, 1);
        let n: i64 = self.rt().run(&keys.inflight, Access::Write, |con| {
            let mut inv = scripts::NACK.prepare_invoke();
            for k in nack_keys(keys) {
                inv.key(k);
            }
            inv.arg(id)
                .arg(token)
                .arg(delay_ms)
                .arg(self.max_deliveries)
                .arg(why)
                .invoke(con)
        })?;
        if n > 0 {
            self.state.gate.slot_freed();
        }
        Ok(count_nack(&self.state.metrics, n))
    }
}

/// `ack.lua`'s keys, in its order (ARGV: id, token).
pub(super) fn ack_keys(keys: &Keys) -> [&str; 7] {
    [
        &keys.inflight,
        &keys.lease,
        &keys.msg,
        &keys.attempts,
        &keys.priority,
        &keys.controls,
        &keys.wake,
    ]
}

/// `extend.lua`'s keys, in its order (ARGV: id, token, visibility ms).
pub(crate) fn extend_keys(keys: &Keys) -> [&str; 3] {
    [&keys.inflight, &keys.lease, &keys.head]
}

/// `extend.lua`'s visibility argument: whole ms, 1 ..= u32::MAX.
pub(super) fn extend_ms(visibility: Duration) -> u64 {
    visibility.as_millis().clamp(1, u128::from(u32::MAX)) as u64
}

/// `nack.lua`'s keys, in its order (ARGV: id, token, delay ms,
/// max_deliveries, why). Every sender of the script takes them from here.
pub(crate) fn nack_keys(keys: &Keys) -> [&str; 10] {
    [
        &keys.inflight,
        &keys.lease,
        &keys.msg,
        &keys.attempts,
        &keys.delayed,
        &keys.dead,
        &keys.reason,
        &keys.wake,
        &keys.head,
        &keys.controls,
    ]
}

/// What a `nack.lua` reply means (`None`: the claim was no longer
/// current), counted in the queue's metrics.
pub(crate) fn count_nack(metrics: &QueueMetrics, reply: i64) -> Option<Nacked> {
    match reply {
        1 => {
            metrics.nacked.add(1);
            Some(Nacked::Retried)
        }
        2 => {
            metrics.nacked.add(1);
            metrics.dead_lettered.add(1);
            Some(Nacked::Dead)
        }
        0 => Some(Nacked::Gone),
        _ => None,
    }
}
