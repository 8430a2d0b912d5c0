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
//! | key | type | holds |
//! | --- | --- | --- |
//! | `redwheel:{N}:delayed` | ZSET | message id → due time (epoch ms, Redis server clock) |
//! | `redwheel:{N}:msg` | HASH | message id → `"<due ms>:<payload bytes>"` |
//! | `redwheel:{N}:ready` | LIST | ids that are due, in due order |
//! | `redwheel:{N}:inflight` | ZSET | claimed ids → visibility deadline (ms) |
//! | `redwheel:{N}:lease` | HASH | claimed id → token of its current claim |
//! | `redwheel:{N}:attempts` | HASH | id → deliveries so far |
//! | `redwheel:{N}:dead` | ZSET | dead ids (delivery limit reached, or undecodable) → when they died (ms) |
//! | `redwheel:{N}:reason` | HASH | dead id → why it died |
//! | `redwheel:{N}:counts` | HASH | `delivered` → messages handed out by take and claim so far |
//! | `redwheel:{N}:stale` | HASH | id → entries of `ready` left by a message removed after its transfer (skipped) |
//! | `redwheel:{N}:wake` | channel | a new earliest due time (ms) |
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
//!   durable as the server's persistence settings make it). When it
//!   returns [`ErrorKind::Unavailable`], nothing was written. When it
//!   returns [`ErrorKind::OutcomeUnknown`] (Redis stopped answering after
//!   the command was sent), the message may or may not be there: retry
//!   with [`Queue::offer_with_id`], which writes an id at most once.
//! * **Delivery**: never early by the Redis server clock (a message moves
//!   to the ready list only once `due <= TIME`), in due order, exactly once
//!   to the ready list however many processes transfer the queue.
//! * **Take** is **at-most-once**: a message is deleted from Redis by the
//!   same script that hands it to a consumer, so a consumer that dies (or
//!   loses its connection) from then on loses it. Nothing is lost before
//!   that point: a consumer blocks on the ready list without popping.
//! * **Latency**: each [`Redwheel`] keeps one wheel timeout per queue at the
//!   head's due time, replaced only by an earlier head announced on the wake
//!   channel; a guard sweep (default every second) covers a lost wake-up or
//!   a dead process.
//!
//! [`ErrorKind::Unavailable`]: crate::ErrorKind::Unavailable
//! [`ErrorKind::OutcomeUnknown`]: crate::ErrorKind::OutcomeUnknown

mod codec;
mod consumer;
pub mod inspect;
mod reliable;
pub(crate) mod state;

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

#[cfg(feature = "serde")]
#[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
pub use self::codec::Json;
pub use self::codec::{Codec, CodecError};
pub use self::consumer::{Consumer, ConsumerOptions};
pub use self::reliable::{DeadLetter, Delivery, Nacked, QueueStats};
pub use self::state::{MAX_ID_LEN, MAX_NAME_LEN};

/// Checks a queue name as [`Redwheel::queue`] does, without Redis: non-empty,
/// at most [`MAX_NAME_LEN`] bytes, no `{` or `}` (they delimit the hash
/// tag), no control characters. Fails with [`ErrorKind::InvalidName`].
pub fn validate_name(name: &str) -> Result<(), Error> {
    state::validate_name(name)
}

use self::state::{QueueState, new_message_id};
use crate::error::{Access, Error, ErrorKind};
use crate::runtime::{Backoff, Conn, Deadline, Redwheel, Runtime, Subscription, shut_down};
use crate::scripts::{self, BATCH_OFFER_MAX, MAX_DUE_MS, TRANSFER_BATCH_MAX};
use crate::telemetry;

/// Longest guard interval accepted.
const MAX_GUARD_INTERVAL: Duration = Duration::from_secs(86_400);

/// Largest `max_payload_bytes`: Redis's own limit on one string (512 MiB).
const MAX_PAYLOAD_LIMIT: usize = 512 << 20;

/// Options of one queue, for [`Redwheel::queue_with`].
#[derive(Debug, Clone)]
pub struct QueueOptions {
    pub(crate) transfer_batch: usize,
    pub(crate) guard_interval: Duration,
    pub(crate) max_payload_bytes: usize,
    pub(crate) wait_replicas: Option<(u32, Duration)>,
    pub(crate) visibility: Duration,
    pub(crate) max_deliveries: u32,
}

impl Default for QueueOptions {
    fn default() -> Self {
        QueueOptions {
            transfer_batch: 1_000,
            guard_interval: Duration::from_secs(1),
            max_payload_bytes: 1 << 20,
            wait_replicas: None,
            visibility: Duration::from_secs(30),
            max_deliveries: 10,
        }
    }
}

impl QueueOptions {
    /// Most ids one transfer script call moves (1 ..= 4,000; default
    /// 1,000). A full batch is followed by another call in the next round.
    pub fn transfer_batch(mut self, n: usize) -> Self {
        self.transfer_batch = n;
        self
    }

    /// Period of the guard sweep: a transfer run even when no wake-up came,
    /// so a lost pub/sub message or a dead process never strands a message
    /// for longer than this. 10 ms ..= 1 day; default 1 s. Queues with the
    /// same interval are swept together, in one round trip.
    pub fn guard_interval(mut self, d: Duration) -> Self {
        self.guard_interval = d;
        self
    }

    /// Largest encoded payload accepted by `offer` (1 byte ..= 512 MiB;
    /// default 1 MiB). A larger one fails with
    /// [`ErrorKind::PayloadTooLarge`].
    pub fn max_payload_bytes(mut self, n: usize) -> Self {
        self.max_payload_bytes = n;
        self
    }

    /// Durability for replicated deployments: every offer (and each chunk
    /// of a batch offer) returns only once Redis confirms (`WAIT replicas
    /// timeout`) that at least `replicas` replicas received it, and fails
    /// with [`ErrorKind::NotReplicated`] otherwise (the message is then on
    /// the master, but a failover may lose it; retry with
    /// [`Queue::offer_with_id`]). Without it, an offer acknowledged just
    /// before its master dies can be lost: Redis replicates
    /// asynchronously. `timeout` is 1 ms ..= 60 s and must leave room within
    /// [`command_timeout`](crate::RedwheelOptions::command_timeout).
    /// Default: no waiting.
    pub fn wait_replicas(mut self, replicas: u32, timeout: Duration) -> Self {
        self.wait_replicas = Some((replicas, timeout));
        self
    }

    /// How long a claimed message stays hidden from other consumers
    /// ([`Queue::claim`]): not acked within this, it is delivered again.
    /// 1 ms ..= 1 day; default 30 s. Each handle uses its own.
    pub fn visibility(mut self, d: Duration) -> Self {
        self.visibility = d;
        self
    }

    /// How many times a claimed message is delivered before it goes to the
    /// dead letters instead (a visibility that expires and a `nack` both
    /// count). 1 ..= 1,000,000; default 10. The first open of a queue in a
    /// `Redwheel` sets it for that process's redeliveries.
    pub fn max_deliveries(mut self, n: u32) -> Self {
        self.max_deliveries = n;
        self
    }

    pub(crate) fn validate(&self) -> Result<(), Error> {
        let bad = |name: &str, reason: String| {
            Err(Error::new(
                ErrorKind::InvalidOption,
                format!("invalid option `{name}`: {reason}"),
            ))
        };
        if self.transfer_batch == 0 || self.transfer_batch > TRANSFER_BATCH_MAX {
            return bad(
                "transfer_batch",
                format!("{} is not in 1..={TRANSFER_BATCH_MAX}", self.transfer_batch),
            );
        }
        if self.guard_interval < Duration::from_millis(10)
            || self.guard_interval > MAX_GUARD_INTERVAL
        {
            return bad(
                "guard_interval",
                format!("{:?} is not within 10 ms ..= 1 day", self.guard_interval),
            );
        }
        if let Some((n, timeout)) = self.wait_replicas
            && (n == 0 || timeout < Duration::from_millis(1) || timeout > Duration::from_secs(60))
        {
            return bad(
                "wait_replicas",
                format!(
                    "{n} replicas within {timeout:?}: needs at least 1 replica and 1 ms ..= 60 s"
                ),
            );
        }
        if self.visibility < Duration::from_millis(1) || self.visibility > MAX_GUARD_INTERVAL {
            return bad(
                "visibility",
                format!("{:?} is not within 1 ms ..= 1 day", self.visibility),
            );
        }
        if self.max_deliveries == 0 || self.max_deliveries > 1_000_000 {
            return bad(
                "max_deliveries",
                format!("{} is not in 1..=1000000", self.max_deliveries),
            );
        }
        if self.max_payload_bytes == 0 || self.max_payload_bytes > MAX_PAYLOAD_LIMIT {
            return bad(
                "max_payload_bytes",
                format!(
                    "{} is not in 1..={MAX_PAYLOAD_LIMIT}",
                    self.max_payload_bytes
                ),
            );
        }
        Ok(())
    }
}

/// The id of a message, unique across processes; returned by `offer`,
/// accepted by [`Queue::remove`], or chosen by the caller with
/// [`Queue::offer_with_id`].
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MessageId(String);

impl MessageId {
    /// The id as stored in Redis.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The id as an owned string.
    pub fn into_string(self) -> String {
        self.0
    }
}

impl fmt::Display for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<String> for MessageId {
    /// Wraps an id kept elsewhere (a database row); `remove` and
    /// `offer_with_id` check it.
    fn from(s: String) -> Self {
        MessageId(s)
    }
}

impl From<&str> for MessageId {
    fn from(s: &str) -> Self {
        MessageId(s.to_owned())
    }
}

impl AsRef<str> for MessageId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// A message handed to a consumer by [`Queue::take`] or [`Queue::poll`].
#[derive(Debug, Clone)]
pub struct Message<T> {
    id: MessageId,
    payload: T,
    due_ms: u64,
}

impl<T> Message<T> {
    /// The message's id (as returned by `offer`).
    pub fn id(&self) -> &MessageId {
        &self.id
    }

    /// The payload.
    pub fn payload(&self) -> &T {
        &self.payload
    }

    /// The payload, by value.
    pub fn into_payload(self) -> T {
        self.payload
    }

    /// When the message fell due, on the Redis server's clock.
    pub fn due(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(self.due_ms)
    }

    /// When the message fell due, in ms since the Unix epoch (Redis clock).
    pub fn due_ms(&self) -> u64 {
        self.due_ms
    }
}

/// A handle on one delayed queue carrying payloads of type `T`.
///
/// Cheap to `Clone`, `Send + Sync`: share it between producer and consumer
/// threads. Keeps its [`Redwheel`] alive.
pub struct Queue<T> {
    rw: Redwheel,
    state: Arc<QueueState>,
    max_payload: usize,
    wait_replicas: Option<(u32, Duration)>,
    visibility: Duration,
    max_deliveries: u32,
    _payload: PhantomData<fn(T) -> T>,
}

impl<T> Clone for Queue<T> {
    fn clone(&self) -> Self {
        Queue {
            rw: self.rw.clone(),
            state: Arc::clone(&self.state),
            max_payload: self.max_payload,
            wait_replicas: self.wait_replicas,
            visibility: self.visibility,
            max_deliveries: self.max_deliveries,
            _payload: PhantomData,
        }
    }
}

impl<T> fmt::Debug for Queue<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Queue")
            .field("name", &self.state.name)
            .field("max_payload", &self.max_payload)
            .finish_non_exhaustive()
    }
}

impl Redwheel {
    /// Opens queue `name` carrying payloads of type `T`, with default
    /// options. See [`queue_with`](Redwheel::queue_with).
    pub fn queue<T: Codec>(&self, name: &str) -> Result<Queue<T>, Error> {
        self.queue_with(name, QueueOptions::default())
    }

    /// Opens queue `name` (keys `redwheel:{name}:…`) carrying payloads of
    /// type `T`.
    ///
    /// The first open of a name in this `Redwheel` registers its transfer
    /// job (one per queue per `Redwheel`), which runs at once, so messages
    /// that fell due while no process was running move right away. Later
    /// opens share that job; their `transfer_batch` and `guard_interval`
    /// are ignored, their `max_payload_bytes` applies to their handle.
    ///
    /// Fails with [`ErrorKind::InvalidName`] for an empty name, one over
    /// 200 bytes, or one holding `{`, `}` or control characters, and
    /// [`ErrorKind::InvalidOption`] for an option out of range.
    pub fn queue_with<T: Codec>(
        &self,
        name: &str,
        options: QueueOptions,
    ) -> Result<Queue<T>, Error> {
        state::validate_name(name)?;
        options.validate()?;
        let rt = self.runtime();
        if rt.is_shut_down() {
            return Err(shut_down());
        }
        let (state, created) = rt
            .state(&format!("queue {name}"), || {
                QueueState::new(name, options.transfer_batch, options.max_deliveries)
            })
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::InvalidName,
                    "the name is in use by another kind of object",
                )
                .in_queue(name)
            })?;
        if let Some((_, timeout)) = options.wait_replicas
            && timeout + Duration::from_millis(100) > rt.options.command_timeout
        {
            return Err(Error::new(
                ErrorKind::InvalidOption,
                format!(
                    "invalid option `wait_replicas`: a timeout of {timeout:?} leaves no room within the command timeout of {:?}",
                    rt.options.command_timeout
                ),
            )
            .in_queue(name));
        }
        if created {
            open_transfer(rt, &state, &options);
        }
        Ok(Queue {
            rw: self.clone(),
            state,
            max_payload: options.max_payload_bytes,
            wait_replicas: options.wait_replicas,
            visibility: options.visibility,
            max_deliveries: options.max_deliveries,
            _payload: PhantomData,
        })
    }
}

/// Registers a new queue's transfer job and wake channel.
fn open_transfer(rt: &Arc<Runtime>, state: &Arc<QueueState>, options: &QueueOptions) {
    let weak: Weak<Runtime> = Arc::downgrade(rt);
    let key = state.job_key.clone();
    let on_message = {
        let (weak, key) = (weak.clone(), key.clone());
        move |payload: &[u8]| {
            let Some(rt) = weak.upgrade() else { return };
            let due = std::str::from_utf8(payload)
                .ok()
                .and_then(|s| s.parse::<i64>().ok());
            let at = match due {
                Some(ms) => Deadline::ServerMs(ms),
                None => Deadline::Now,
            };
            rt.driver.announce(&key, at);
        }
    };
    let on_subscribed = {
        let (weak, key) = (weak, key);
        move || {
            if let Some(rt) = weak.upgrade() {
                rt.driver.announce(&key, Deadline::Now);
            }
        }
    };
    rt.driver.register(
        &state.job_key,
        Arc::clone(&state.transfer) as Arc<dyn crate::runtime::Job>,
        Deadline::Now,
        Some(options.guard_interval),
    );
    rt.subscriber.subscribe(
        &state.keys.wake,
        Subscription {
            on_message: Box::new(on_message),
            on_subscribed: Box::new(on_subscribed),
        },
    );
}

/// `at` in epoch ms, rounded up; before the epoch is 0 (clamped to now by
/// the script); past 2^53 ms is an error.
fn epoch_ms(at: SystemTime) -> Result<u64, Error> {
    let ms = match at.duration_since(UNIX_EPOCH) {
        Ok(d) => ceil_ms(d),
        Err(_) => 0,
    };
    if ms > u128::from(MAX_DUE_MS) {
        return Err(Error::new(
            ErrorKind::DelayOverflow,
            format!("the due time {at:?} is past 2^53 ms since the epoch"),
        ));
    }
    Ok(ms as u64)
}

/// Milliseconds in `d`, rounded up (a delay is never shortened).
fn ceil_ms(d: Duration) -> u128 {
    d.as_nanos().div_ceil(1_000_000)
}

impl<T: Codec> Queue<T> {
    /// The queue's name.
    pub fn name(&self) -> &str {
        &self.state.name
    }

    fn rt(&self) -> &Arc<Runtime> {
        self.rw.runtime()
    }

    /// Tags an error with this queue's name.
    fn tag(&self, e: Error) -> Error {
        e.in_queue(&self.state.name)
    }

    fn encode<'a>(&self, payload: &'a T) -> Result<Cow<'a, [u8]>, Error> {
        let bytes = payload.encode().map_err(|e| {
            self.tag(Error::new(ErrorKind::Encode, "could not encode a payload").with_cause(e))
        })?;
        if bytes.len() > self.max_payload {
            return Err(self.tag(Error::new(
                ErrorKind::PayloadTooLarge,
                format!(
                    "payload of {} bytes exceeds the limit of {} bytes",
                    bytes.len(),
                    self.max_payload
                ),
            )));
        }
        Ok(bytes)
    }

    /// The delay in ms, checked against the 2^53 ms limit of a score.
    fn delay_ms(&self, delay: Duration) -> Result<u64, Error> {
        self.delay_ms_within(delay, self.delay_limit())
    }

    /// The longest delay (ms) whose due time stays within 2^53 ms.
    fn delay_limit(&self) -> u64 {
        MAX_DUE_MS.saturating_sub(self.rt().server_now_ms())
    }

    fn delay_ms_within(&self, delay: Duration, limit: u64) -> Result<u64, Error> {
        let ms = ceil_ms(delay);
        if ms > u128::from(limit) {
            return Err(self.tag(Error::new(
                ErrorKind::DelayOverflow,
                format!("a delay of {delay:?} puts the due time past 2^53 ms"),
            )));
        }
        Ok(ms as u64)
    }

    /// Offers `payload`, due `delay` from now by the Redis server's clock.
    /// Returns its id.
    ///
    /// Fails with [`ErrorKind::PayloadTooLarge`], [`ErrorKind::Encode`],
    /// [`ErrorKind::DelayOverflow`] (nothing is written),
    /// [`ErrorKind::Unavailable`] when Redis cannot be reached (nothing is
    /// written), or [`ErrorKind::OutcomeUnknown`] when Redis stopped
    /// answering after the offer was sent (it may have been written; retry
    /// with [`offer_with_id`](Queue::offer_with_id) to be sure it is written
    /// once). The call takes at most
    /// [`command_timeout`](crate::RedwheelOptions::command_timeout).
    pub fn offer(&self, payload: &T, delay: Duration) -> Result<MessageId, Error> {
        let bytes = self.encode(payload)?;
        let ms = self.delay_ms(delay)?;
        let id = new_message_id();
        // A retry inside `offer_raw` that finds the id written means the
        // first attempt succeeded: the offer stands either way.
        self.offer_raw("r", ms, &id, &bytes)?;
        Ok(MessageId(id))
    }

    /// Offers `payload`, due at `at` (wall-clock time, compared with the
    /// Redis server's clock). A time in the past is clamped to now: the
    /// message is due at once.
    pub fn offer_at(&self, payload: &T, at: SystemTime) -> Result<MessageId, Error> {
        let bytes = self.encode(payload)?;
        let id = new_message_id();
        self.offer_raw("a", epoch_ms(at)?, &id, &bytes)?;
        Ok(MessageId(id))
    }

    /// Offers `payload` under an id of the caller's choosing, due `delay`
    /// from now: the idempotent offer, for producers that retry.
    ///
    /// Returns `true` if the message was added, `false` if a message with
    /// this id is already known to the queue (waiting, due, or a dead
    /// letter): then nothing changes, its payload and due time stay as they
    /// were. So after [`ErrorKind::OutcomeUnknown`], offering the same id
    /// again is safe: the message ends up in the queue exactly once. Once
    /// the message has been taken, the id is free again.
    ///
    /// Fails with [`ErrorKind::InvalidId`] for an empty id or one over 128
    /// bytes, and as [`offer`](Queue::offer) otherwise.
    pub fn offer_with_id(
        &self,
        id: &MessageId,
        payload: &T,
        delay: Duration,
    ) -> Result<bool, Error> {
        check_id(id).map_err(|e| self.tag(e))?;
        let bytes = self.encode(payload)?;
        let ms = self.delay_ms(delay)?;
        self.offer_raw("r", ms, id.as_str(), &bytes)
    }

    /// Adds one message; true if added, false if the id was known.
    fn offer_raw(&self, mode: &str, value: u64, id: &str, bytes: &[u8]) -> Result<bool, Error> {
        let keys = &self.state.keys;
        let _span = telemetry::queue_op("offer", &self.state.name, 1);
        let (due, replicas): (i64, Option<i64>) = self
            .rt()
            .run(&keys.delayed, Access::Write, |con| {
                let due = scripts::OFFER
                    .key(&keys.delayed)
                    .key(&keys.msg)
                    .key(&keys.wake)
                    .arg(mode)
                    .arg(value)
                    .arg(id)
                    .arg(bytes)
                    .invoke::<i64>(con)?;
                Ok((due, self.wait(con)?))
            })
            .map_err(|e| self.tag(e).for_message(id))?;
        if due >= 0 {
            self.state.metrics.offered.add(1);
        }
        self.check_replicas(replicas, Some(id))?;
        Ok(due >= 0)
    }

    /// Offers many messages, each with its own delay; returns their ids in
    /// the same order.
    ///
    /// Every payload and delay is checked before anything is sent. The
    /// messages are written in atomic chunks of up to 1,000 (one script call
    /// each); if Redis fails midway, the chunks already written stay. For a
    /// batch that can be retried safely, use
    /// [`offer_batch_with_ids`](Queue::offer_batch_with_ids).
    pub fn offer_batch(&self, messages: &[(T, Duration)]) -> Result<Vec<MessageId>, Error> {
        let mut encoded = Vec::with_capacity(messages.len());
        let limit = self.delay_limit();
        for (payload, delay) in messages {
            let bytes = self.encode(payload)?;
            let ms = self.delay_ms_within(*delay, limit)?;
            encoded.push((new_message_id(), ms, bytes));
        }
        self.offer_batch_raw("r", false, &encoded)?;
        Ok(encoded
            .into_iter()
            .map(|(id, _, _)| MessageId(id))
            .collect())
    }

    /// As [`offer_batch`](Queue::offer_batch), each message due at a
    /// wall-clock time (as [`offer_at`](Queue::offer_at): past times are
    /// clamped to now).
    pub fn offer_batch_at(&self, messages: &[(T, SystemTime)]) -> Result<Vec<MessageId>, Error> {
        let mut encoded = Vec::with_capacity(messages.len());
        for (payload, at) in messages {
            let bytes = self.encode(payload)?;
            encoded.push((new_message_id(), epoch_ms(*at)?, bytes));
        }
        self.offer_batch_raw("a", false, &encoded)?;
        Ok(encoded
            .into_iter()
            .map(|(id, _, _)| MessageId(id))
            .collect())
    }

    /// The idempotent batch offer: each message under an id of the
    /// caller's choosing, with its own delay. Returns, in order, whether
    /// each was added (`false`: its id was already known to the queue, and
    /// nothing changed for it), so a whole batch can be retried after an
    /// error without duplicates. Checked and written as
    /// [`offer_batch`](Queue::offer_batch).
    pub fn offer_batch_with_ids(
        &self,
        messages: &[(MessageId, T, Duration)],
    ) -> Result<Vec<bool>, Error> {
        let mut encoded = Vec::with_capacity(messages.len());
        let limit = self.delay_limit();
        for (id, payload, delay) in messages {
            check_id(id).map_err(|e| self.tag(e))?;
            let bytes = self.encode(payload)?;
            let ms = self.delay_ms_within(*delay, limit)?;
            encoded.push((id.0.clone(), ms, bytes));
        }
        self.offer_batch_raw("r", true, &encoded)
    }

    /// Writes `encoded` in chunks. With `check_ids`, an id already known is
    /// kept as it is and the reply says, per message, whether it was added;
    /// without, the ids are fresh ones of ours and every message is added.
    fn offer_batch_raw(
        &self,
        mode: &str,
        check_ids: bool,
        encoded: &[(String, u64, Cow<'_, [u8]>)],
    ) -> Result<Vec<bool>, Error> {
        let keys = &self.state.keys;
        let mut added = Vec::with_capacity(encoded.len());
        for chunk in encoded.chunks(BATCH_OFFER_MAX) {
            let mut inv = scripts::OFFER_BATCH.prepare_invoke();
            inv.key(&keys.delayed)
                .key(&keys.msg)
                .key(&keys.wake)
                .arg(mode)
                .arg(if check_ids { "k" } else { "n" });
            for (id, ms, bytes) in chunk {
                inv.arg(*ms).arg(id).arg(bytes.as_ref());
            }
            let rt = self.rt();
            let _span = telemetry::queue_op("offer_batch", &self.state.name, chunk.len());
            if check_ids {
                let (flags, replicas): (Vec<i64>, _) = rt
                    .run(&keys.delayed, Access::Write, |con| {
                        Ok((inv.invoke(con)?, self.wait(con)?))
                    })
                    .map_err(|e| self.tag(e))?;
                let new = flags.iter().filter(|&&f| f == 1).count();
                self.state.metrics.offered.add(new as u64);
                self.check_replicas(replicas, None)?;
                added.extend(flags.into_iter().map(|f| f == 1));
            } else {
                let (_, replicas): (i64, _) = rt
                    .run(&keys.delayed, Access::Write, |con| {
                        Ok((inv.invoke(con)?, self.wait(con)?))
                    })
                    .map_err(|e| self.tag(e))?;
                self.state.metrics.offered.add(chunk.len() as u64);
                self.check_replicas(replicas, None)?;
                added.resize(added.len() + chunk.len(), true);
            }
        }
        Ok(added)
    }

    /// With `wait_replicas`, `WAIT`s on `con` (after a write on it) and
    /// returns how many replicas acknowledged.
    fn wait(&self, con: &mut Conn) -> redis::RedisResult<Option<i64>> {
        let Some((n, timeout)) = self.wait_replicas else {
            return Ok(None);
        };
        let ms = u64::try_from(timeout.as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        redis::cmd("WAIT").arg(n).arg(ms).query(con).map(Some)
    }

    fn check_replicas(&self, acked: Option<i64>, id: Option<&str>) -> Result<(), Error> {
        let (Some(acked), Some((n, timeout))) = (acked, self.wait_replicas) else {
            return Ok(());
        };
        if acked >= i64::from(n) {
            return Ok(());
        }
        let e = Error::new(
            ErrorKind::NotReplicated,
            format!(
                "written on the master, but only {acked} of the {n} replicas asked for confirmed it within {timeout:?}"
            ),
        );
        Err(match id {
            Some(id) => self.tag(e).for_message(id),
            None => self.tag(e),
        })
    }

    /// Cancels a message by id. True if it was known to the queue
    /// (delayed, due but not yet taken, claimed and not yet acked, or a
    /// dead letter) and is now gone for good; false if it is unknown, was
    /// already taken or acked, or already removed. O(log n): a due id
    /// already on the ready list is not searched for; its entry there is
    /// marked stale, and `take` and `claim` skip it (so the id may be
    /// offered again at once without an early or second delivery). A claim
    /// in flight loses its lease: its ack finds the message gone.
    pub fn remove(&self, id: &MessageId) -> Result<bool, Error> {
        check_id(id).map_err(|e| self.tag(e))?;
        let keys = &self.state.keys;
        let _span = telemetry::queue_op("remove", &self.state.name, 1);
        let n: i64 = self
            .rt()
            .run(&keys.delayed, Access::Write, |con| {
                scripts::REMOVE
                    .key(&keys.delayed)
                    .key(&keys.msg)
                    .key(&keys.dead)
                    .key(&keys.inflight)
                    .key(&keys.lease)
                    .key(&keys.attempts)
                    .key(&keys.reason)
                    .key(&keys.stale)
                    .arg(id.as_str())
                    .invoke(con)
            })
            .map_err(|e| self.tag(e).for_message(id.as_str()))?;
        Ok(n == 1)
    }

    /// Messages the queue still owes: delayed, due and not yet taken, or
    /// claimed and not yet acked (a claim may still come back). Dead
    /// letters are not counted; [`stats`](Queue::stats) gives each state.
    pub fn len(&self) -> Result<u64, Error> {
        let keys = &self.state.keys;
        let _span = telemetry::queue_op("len", &self.state.name, 0);
        let n: i64 = self
            .rt()
            .run(&keys.msg, Access::Read, |con| {
                scripts::LEN.key(&keys.msg).key(&keys.dead).invoke(con)
            })
            .map_err(|e| self.tag(e))?;
        Ok(n.max(0) as u64)
    }

    /// True when [`len`](Queue::len) is 0: nothing delayed, ready or in
    /// flight.
    pub fn is_empty(&self) -> Result<bool, Error> {
        Ok(self.len()? == 0)
    }

    /// Messages not yet due (in the `delayed` sorted set).
    pub fn delayed_len(&self) -> Result<u64, Error> {
        let key = &self.state.keys.delayed;
        let _span = telemetry::queue_op("zcard", &self.state.name, 0);
        self.rt()
            .run(key, Access::Read, |con| {
                redis::cmd("ZCARD").arg(key).query(con)
            })
            .map_err(|e| self.tag(e))
    }

    /// Ids of the dead letters (undecodable, or past `max_deliveries`),
    /// oldest first, at most `max`; [`dead_letters`](Queue::dead_letters)
    /// gives their payloads and reasons too.
    pub fn dead_letter_ids(&self, max: usize) -> Result<Vec<MessageId>, Error> {
        if max == 0 {
            return Ok(Vec::new());
        }
        let key = &self.state.keys.dead;
        let stop = i64::try_from(max).unwrap_or(i64::MAX) - 1;
        let _span = telemetry::queue_op("zrange", &self.state.name, max);
        let ids: Vec<String> = self
            .rt()
            .run(key, Access::Read, |con| {
                redis::cmd("ZRANGE").arg(key).arg(0).arg(stop).query(con)
            })
            .map_err(|e| self.tag(e))?;
        Ok(ids.into_iter().map(MessageId).collect())
    }

    /// Deletes every message of the queue (delayed, ready, in flight and
    /// dead letters, with their leases, attempt counts and reasons);
    /// returns how many there were.
    pub fn clear(&self) -> Result<u64, Error> {
        let keys = &self.state.keys;
        let _span = telemetry::queue_op("clear", &self.state.name, 0);
        let n: i64 = self
            .rt()
            .run(&keys.delayed, Access::Write, |con| {
                scripts::CLEAR
                    .key(&keys.delayed)
                    .key(&keys.msg)
                    .key(&keys.ready)
                    .key(&keys.dead)
                    .key(&keys.inflight)
                    .key(&keys.lease)
                    .key(&keys.attempts)
                    .key(&keys.reason)
                    .key(&keys.stale)
                    .invoke(con)
            })
            .map_err(|e| self.tag(e))?;
        Ok(n.max(0) as u64)
    }

    /// Waits for the next due message and takes it (at-most-once from
    /// here: it is gone from Redis when this returns). For at-least-once
    /// delivery, use [`claim`](Queue::claim) and ack.
    ///
    /// Blocks on the ready list (`BLMOVE`), so it wakes as soon as a message
    /// lands there. While Redis is unreachable it keeps waiting, retrying on
    /// the reconnect backoff. Returns [`ErrorKind::Shutdown`] once the
    /// `Redwheel` is shut down, and [`ErrorKind::Decode`] for a payload that
    /// cannot be decoded (that message is parked as a dead letter, not
    /// lost). A connection lost while waiting is re-opened and the wait
    /// goes on; a message whose take script ran just as the connection
    /// broke is lost with the reply (at-most-once).
    pub fn take(&self) -> Result<Message<T>, Error> {
        match self.take_until(None)? {
            Some(m) => Ok(m),
            None => Err(self.tag(Error::new(ErrorKind::Protocol, "take returned no message"))),
        }
    }

    /// As [`take`](Queue::take), but gives up after `timeout`: `Ok(None)`
    /// when no message came. If Redis stayed unreachable until the timeout,
    /// the last connection error is returned instead.
    pub fn poll(&self, timeout: Duration) -> Result<Option<Message<T>>, Error> {
        self.take_until(Instant::now().checked_add(timeout))
    }

    fn take_until(&self, deadline: Option<Instant>) -> Result<Option<Message<T>>, Error> {
        let keys = &self.state.keys;
        let popped = self.wait_pop(
            deadline,
            ("take", 1),
            &scripts::TAKE,
            &[
                &keys.ready,
                &keys.msg,
                &keys.attempts,
                &keys.counts,
                &keys.stale,
            ],
            &[],
            0,
        )?;
        let Some(value) = popped else {
            return Ok(None);
        };
        let (id, stored): (String, Vec<u8>) = redis::from_redis_value(value).map_err(|e| {
            self.tag(Error::new(ErrorKind::Protocol, "unexpected reply to take.lua").with_cause(e))
        })?;
        match parse_stored::<T>(&stored) {
            Ok((due_ms, payload)) => {
                let rt = self.rt();
                self.state
                    .metrics
                    .delivered([(1, due_ms)], || rt.server_now_ms());
                Ok(Some(Message {
                    id: MessageId(id),
                    payload,
                    due_ms,
                }))
            }
            Err(cause) => Err(self.dead_on_arrival(&id, &stored, cause)),
        }
    }

    /// Runs `script` (which pops from the ready list and replies with `Nil`,
    /// or an array of at most `header` elements, when it found nothing)
    /// until it finds something or `deadline` passes, waiting on the ready
    /// list in between (blocking server-side, at most `max_block` a round).
    /// Waits out Redis being unreachable and a moving cluster slot.
    pub(crate) fn wait_pop(
        &self,
        deadline: Option<Instant>,
        op: (&'static str, usize),
        script: &redis::Script,
        keys: &[&str],
        args: &[&[u8]],
        header: usize,
    ) -> Result<Option<redis::Value>, Error> {
        let rt = self.rt();
        let max_block = rt.options.max_block;
        let mut backoff = Backoff::new(rt.options.reconnect_min, rt.options.reconnect_max);
        let pop = Pop {
            op,
            script,
            keys,
            args,
            header,
        };
        loop {
            if rt.is_shut_down() {
                return Err(self.tag(shut_down()));
            }
            let mut con = match rt.blocking(&self.state.keys.ready) {
                Ok(c) => c,
                Err(e) if e.is_transient() => {
                    rt.topology_may_have_changed();
                    if !wait_backoff(deadline, &mut backoff) {
                        return Err(self.tag(e));
                    }
                    continue;
                }
                Err(e) => return Err(self.tag(e)),
            };
            match self.pop_round(&mut con.con, deadline, max_block, &pop) {
                Ok(Some(value)) => {
                    rt.put_blocking(con);
                    return Ok(Some(value));
                }
                Ok(None) => {
                    rt.put_blocking(con);
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        return Ok(None);
                    }
                    backoff.reset();
                }
                Err(e) if slot_is_moving(&e) => {
                    // A cluster slot being migrated or failed over: the
                    // queue is reachable again once the move completes.
                    drop(con);
                    rt.topology_may_have_changed();
                    if !wait_backoff(deadline, &mut backoff) {
                        return Ok(None);
                    }
                }
                Err(e) => {
                    drop(con);
                    let e = self.tag(Error::from_redis(e, Access::Write));
                    if !e.is_transient() {
                        return Err(e);
                    }
                    rt.topology_may_have_changed();
                    // A connection lost while blocked: keep waiting. (Had a
                    // take script run in that instant, its message went with
                    // the reply: at-most-once; a claim comes back when its
                    // visibility ends.)
                    tracing::debug!(target: "redwheel::queue", queue = %self.state.name, error = %e, "redis unavailable while waiting; retrying");
                    if !wait_backoff(deadline, &mut backoff) {
                        return Err(e);
                    }
                }
            }
        }
    }

    /// One round: run the pop script; if it found nothing, block until the
    /// ready list is non-empty (or the round's timeout), then run it once
    /// more.
    fn pop_round(
        &self,
        con: &mut Conn,
        deadline: Option<Instant>,
        max_block: Duration,
        pop: &Pop<'_>,
    ) -> redis::RedisResult<Option<redis::Value>> {
        let Pop {
            op,
            script,
            keys,
            args,
            header,
        } = *pop;
        let _span = telemetry::queue_op(op.0, &self.state.name, op.1);
        let invoke = |con: &mut Conn| -> redis::RedisResult<redis::Value> {
            let mut inv = script.prepare_invoke();
            for k in keys {
                inv.key(*k);
            }
            for a in args {
                inv.arg(*a);
            }
            inv.invoke(con)
        };
        let found = |v: redis::Value| -> Option<redis::Value> {
            match &v {
                redis::Value::Nil => None,
                redis::Value::Array(items) if items.len() <= header => None,
                _ => Some(v),
            }
        };
        if let Some(v) = found(invoke(con)?) {
            return Ok(Some(v));
        }
        let block = match deadline {
            None => max_block,
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left < Duration::from_millis(1) {
                    return Ok(None);
                }
                left.min(max_block)
            }
        };
        // A blocking peek (BLMOVE from the list to itself: it waits until the
        // list is non-empty without consuming anything), pipelined with the
        // script: Redis runs the script as soon as the peek returns, with no
        // round trip back to us in between. If the peek timed out the script
        // usually finds nothing; if it finds a message, that is just as good.
        let ready = &self.state.keys.ready;
        let mut p = redis::pipe();
        p.cmd("BLMOVE")
            .arg(ready)
            .arg(ready)
            .arg("LEFT")
            .arg("LEFT")
            .arg(format!("{:.3}", block.as_secs_f64()))
            .ignore();
        let evalsha = p
            .cmd("EVALSHA")
            .arg(script.get_hash())
            .arg(keys.len())
            .arg(keys);
        for a in args {
            evalsha.arg(*a);
        }
        let reply = match p.query::<(redis::Value,)>(con) {
            Err(e) if is_noscript(&e) => {
                // Pipelined EVALSHA is not reloaded by `redis::Script`:
                // load it and run the round again.
                script.load(con)?;
                p.query::<(redis::Value,)>(con)?
            }
            other => other?,
        };
        Ok(found(reply.0))
    }

    /// A message whose stored value does not decode: kept as a dead letter
    /// (with the reason), and the error naming it.
    pub(crate) fn dead_on_arrival(&self, id: &str, stored: &[u8], cause: CodecError) -> Error {
        let parked = self.park(id, stored, &cause.to_string());
        let what = if parked {
            "could not decode a message; it is kept as a dead letter"
        } else {
            "could not decode a message, and parking it as a dead letter failed"
        };
        self.tag(
            Error::new(ErrorKind::Decode, what)
                .with_cause(cause)
                .for_message(id),
        )
    }

    /// Puts an undecodable message in the dead letters; true if it was.
    fn park(&self, id: &str, value: &[u8], reason: &str) -> bool {
        let keys = &self.state.keys;
        let _span = telemetry::queue_op("park", &self.state.name, 1);
        let parked = self.rt().run(&keys.msg, Access::Write, |con| {
            scripts::PARK
                .key(&keys.msg)
                .key(&keys.dead)
                .key(&keys.reason)
                .key(&keys.inflight)
                .key(&keys.lease)
                .arg(id)
                .arg(value)
                .arg(format!("could not decode: {reason}"))
                .invoke::<i64>(con)
        });
        match parked {
            Ok(_) => {
                self.state.metrics.dead_lettered.add(1);
                tracing::warn!(
                    target: "redwheel::queue",
                    queue = %self.state.name,
                    id,
                    "a message could not be decoded; parked as a dead letter"
                );
                true
            }
            Err(e) => {
                tracing::error!(
                    target: "redwheel::queue",
                    queue = %self.state.name,
                    id,
                    error = %e,
                    "a message could not be decoded, and parking it failed: it is lost"
                );
                false
            }
        }
    }

    /// Transfer script runs and messages moved by this process's transfer
    /// job for this queue so far (diagnostics).
    pub fn transfer_stats(&self) -> TransferStats {
        use std::sync::atomic::Ordering;
        let rt = self.rt();
        let next_wakeup = rt.driver.scheduled_at(&self.state.job_key).map(|at| {
            let now = rt.local_now();
            Instant::now() + at.saturating_sub(now)
        });
        TransferStats {
            runs: self.state.transfer.runs.load(Ordering::Relaxed),
            moved: self.state.transfer.moved.load(Ordering::Relaxed),
            next_wakeup,
        }
    }
}

/// What this process's transfer job did for one queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct TransferStats {
    /// Transfer script calls that succeeded.
    pub runs: u64,
    /// Messages they moved to the ready list.
    pub moved: u64,
    /// When the pending wheel timeout fires, if one is pending.
    pub next_wakeup: Option<Instant>,
}

/// Sleeps for the backoff's next wait (not past `deadline`); false if the
/// deadline has passed.
fn wait_backoff(deadline: Option<Instant>, backoff: &mut Backoff) -> bool {
    let mut wait = backoff.step();
    if let Some(d) = deadline {
        let left = d.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        wait = wait.min(left);
    }
    std::thread::sleep(wait);
    true
}

/// A stored value, `"<due ms>:<payload>"`, decoded: (due, payload).
pub(crate) fn parse_stored<T: Codec>(value: &[u8]) -> Result<(u64, T), CodecError> {
    match split_stored(value) {
        (Some(due), bytes) => T::decode(bytes).map(|p| (due, p)),
        (None, _) => Err("stored value is not \"<due ms>:<payload>\"".into()),
    }
}

/// A stored value `"<due ms>:<payload>"` split into its due time (`None`
/// if malformed) and payload bytes (the whole value if malformed): the one
/// reader of the `msg` layout.
pub(crate) fn split_stored(value: &[u8]) -> (Option<u64>, &[u8]) {
    value
        .iter()
        .position(|&b| b == b':')
        .and_then(|i| {
            let due = std::str::from_utf8(&value[..i]).ok()?.parse::<u64>().ok()?;
            Some((Some(due), &value[i + 1..]))
        })
        .unwrap_or((None, value))
}

/// A redirect or a refusal while a cluster slot moves (`MOVED`, `ASK`,
/// `TRYAGAIN`, `CLUSTERDOWN`), also inside a pipeline's error.
fn slot_is_moving(e: &redis::RedisError) -> bool {
    use redis::ServerErrorKind as S;
    matches!(
        e.kind(),
        redis::ErrorKind::Server(S::Moved | S::Ask | S::TryAgain | S::ClusterDown)
    )
}

/// A script the server does not know (flushed, or a restarted server).
fn is_noscript(e: &redis::RedisError) -> bool {
    e.code() == Some("NOSCRIPT") || e.to_string().contains("NOSCRIPT")
}

fn check_id(id: &MessageId) -> Result<(), Error> {
    let reason = if id.0.is_empty() {
        "must not be empty"
    } else if id.0.len() > MAX_ID_LEN {
        "longer than 128 bytes"
    } else {
        return Ok(());
    };
    Err(Error::new(
        ErrorKind::InvalidId,
        format!("invalid message id {:?}: {reason}", id.0),
    ))
}

/// A pop script with its keys and arguments, for [`Queue::wait_pop`]: the
/// script replies `Nil`, or an array of at most `header` elements, when it
/// found nothing.
#[derive(Clone, Copy)]
struct Pop<'a> {
    /// What it is and the most messages it pops, for the round trip's
    /// span (`take`, `claim`).
    op: (&'static str, usize),
    script: &'a redis::Script,
    keys: &'a [&'a str],
    args: &'a [&'a [u8]],
    header: usize,
}
