//! Redis-persisted delayed queues.
//!
//! A message offered with a delay waits in Redis until it is due, then a
//! transfer task moves it to the queue's ready list, where a consumer
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
//! | `redwheel:{N}:dead` | LIST | ids of messages a consumer could not decode |
//! | `redwheel:{N}:wake` | channel | a new earliest due time (ms) |
//!
//! Every state change is one Lua script (`lua/*.lua`): offer, batch offer,
//! transfer, remove, clear, take, park. Due times and "now" come from the
//! server's `TIME`, so machines with skewed clocks agree; relative delays
//! are sent, never client timestamps. No script scans a list.
//!
//! # Delivery
//!
//! * Never early by the Redis server clock: a message moves to the ready
//!   list only once `due <= TIME`.
//! * In due order: the transfer appends ids in due order; one consumer
//!   takes them in that order.
//! * Exactly once to the ready list, however many processes transfer the
//!   queue; **at most once** to consumers: a message is deleted from Redis
//!   by the same script that hands it to a consumer, so a consumer that
//!   dies (or loses its connection) from then on loses it. Nothing is lost
//!   or orphaned before that point: a consumer blocks on the ready list
//!   without popping from it. (Reliable claim/ack delivery is a later
//!   addition; the layout leaves room for it.)
//! * Latency: each `Redwheel` schedules one wheel timeout per queue at the
//!   head's due time, replaced only by an earlier head announced on the
//!   wake channel; a guard sweep (default every second) covers a lost
//!   wake-up or a dead process.

mod codec;
pub(crate) mod state;

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis::Connection;

#[cfg(feature = "serde")]
pub use self::codec::Json;
pub use self::codec::{Codec, CodecError};
pub use self::state::{MAX_ID_LEN, MAX_NAME_LEN};
pub use crate::error::QueueError;

use self::state::{QueueState, new_message_id};
use crate::error::is_unavailable;
use crate::redwheel::Redwheel;
use crate::scripts::{self, BATCH_OFFER_MAX, MAX_DUE_MS, TRANSFER_BATCH_MAX};

/// Longest guard interval accepted.
const MAX_GUARD_INTERVAL: Duration = Duration::from_secs(86_400);

/// Options of one queue, for [`Redwheel::queue_with`].
#[derive(Debug, Clone)]
pub struct QueueOptions {
    pub(crate) transfer_batch: usize,
    pub(crate) guard_interval: Duration,
    pub(crate) max_payload_bytes: usize,
}

impl Default for QueueOptions {
    fn default() -> Self {
        QueueOptions {
            transfer_batch: 1_000,
            guard_interval: Duration::from_secs(1),
            max_payload_bytes: 1 << 20,
        }
    }
}

impl QueueOptions {
    /// Most ids one transfer script call moves (1 ..= 4,000; default
    /// 1,000). A full batch is followed by another call at once.
    pub fn transfer_batch(mut self, n: usize) -> Self {
        self.transfer_batch = n;
        self
    }

    /// Period of the guard sweep: a transfer run even when no wake-up came,
    /// so a lost pub/sub message or a dead process never strands a message
    /// for longer than this. 10 ms ..= 1 day; default 1 s.
    pub fn guard_interval(mut self, d: Duration) -> Self {
        self.guard_interval = d;
        self
    }

    /// Largest encoded payload accepted by `offer` (bytes; default 1 MiB).
    /// A larger one fails with [`QueueError::PayloadTooLarge`].
    pub fn max_payload_bytes(mut self, n: usize) -> Self {
        self.max_payload_bytes = n;
        self
    }

    pub(crate) fn validate(&self) -> Result<(), QueueError> {
        if self.transfer_batch == 0 || self.transfer_batch > TRANSFER_BATCH_MAX {
            return Err(QueueError::InvalidOption {
                name: "transfer_batch",
                reason: format!("{} is not in 1..={TRANSFER_BATCH_MAX}", self.transfer_batch),
            });
        }
        if self.guard_interval < Duration::from_millis(10)
            || self.guard_interval > MAX_GUARD_INTERVAL
        {
            return Err(QueueError::InvalidOption {
                name: "guard_interval",
                reason: format!("{:?} is not within 10 ms ..= 1 day", self.guard_interval),
            });
        }
        Ok(())
    }
}

/// The id of a message, unique across processes; returned by `offer`,
/// accepted by [`Queue::remove`].
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
    /// Wraps an id kept elsewhere (a database row); `remove` checks it.
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
    pub(crate) rw: Redwheel,
    pub(crate) state: Arc<QueueState>,
    pub(crate) max_payload: usize,
    pub(crate) _payload: PhantomData<fn(T) -> T>,
}

impl<T> Clone for Queue<T> {
    fn clone(&self) -> Self {
        Queue {
            rw: self.rw.clone(),
            state: Arc::clone(&self.state),
            max_payload: self.max_payload,
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

/// `at` in epoch ms, rounded up; before the epoch is 0 (clamped to now by
/// the script); past 2^53 ms is an error.
fn epoch_ms(at: SystemTime) -> Result<u64, QueueError> {
    let ms = match at.duration_since(UNIX_EPOCH) {
        Ok(d) => ceil_ms(d),
        Err(_) => 0,
    };
    if ms > u128::from(MAX_DUE_MS) {
        return Err(QueueError::DelayOverflow {
            reason: format!("{at:?} is past 2^53 ms since the epoch"),
        });
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

    fn encode<'a>(&self, payload: &'a T) -> Result<Cow<'a, [u8]>, QueueError> {
        let bytes = payload.encode().map_err(QueueError::Encode)?;
        if bytes.len() > self.max_payload {
            return Err(QueueError::PayloadTooLarge {
                size: bytes.len(),
                max: self.max_payload,
            });
        }
        Ok(bytes)
    }

    /// The delay in ms, checked against the 2^53 ms limit of a score.
    fn delay_ms(&self, delay: Duration) -> Result<u64, QueueError> {
        let ms = ceil_ms(delay);
        let now = self.rw.shared().server_now_ms();
        let limit = MAX_DUE_MS.saturating_sub(now);
        if ms > u128::from(limit) {
            return Err(QueueError::DelayOverflow {
                reason: format!("a delay of {delay:?} puts the due time past 2^53 ms"),
            });
        }
        Ok(ms as u64)
    }

    /// Offers `payload`, due `delay` from now by the Redis server's clock.
    /// Returns its id.
    ///
    /// Fails with [`QueueError::PayloadTooLarge`], [`QueueError::Encode`],
    /// [`QueueError::DelayOverflow`] (nothing is written), or
    /// [`QueueError::Unavailable`] when Redis cannot be reached.
    pub fn offer(&self, payload: &T, delay: Duration) -> Result<MessageId, QueueError> {
        let bytes = self.encode(payload)?;
        let ms = self.delay_ms(delay)?;
        self.offer_raw("r", ms, &bytes)
    }

    /// Offers `payload`, due at `at` (wall-clock time, compared with the
    /// Redis server's clock). A time in the past is clamped to now: the
    /// message is due at once.
    pub fn offer_at(&self, payload: &T, at: SystemTime) -> Result<MessageId, QueueError> {
        let bytes = self.encode(payload)?;
        self.offer_raw("a", epoch_ms(at)?, &bytes)
    }

    fn offer_raw(&self, mode: &str, value: u64, bytes: &[u8]) -> Result<MessageId, QueueError> {
        let id = new_message_id();
        let keys = &self.state.keys;
        self.rw.shared().with_conn(|con| {
            scripts::OFFER
                .key(&keys.delayed)
                .key(&keys.msg)
                .key(&keys.wake)
                .arg(mode)
                .arg(value)
                .arg(&id)
                .arg(bytes)
                .invoke::<i64>(con)
        })?;
        Ok(MessageId(id))
    }

    /// Offers many messages, each with its own delay; returns their ids in
    /// the same order.
    ///
    /// Every payload and delay is checked before anything is sent. The
    /// messages are written in atomic chunks of up to 1,000 (one script call
    /// each); if Redis fails midway, the chunks already written stay.
    pub fn offer_batch(&self, messages: &[(T, Duration)]) -> Result<Vec<MessageId>, QueueError> {
        let mut encoded = Vec::with_capacity(messages.len());
        for (payload, delay) in messages {
            let bytes = self.encode(payload)?;
            let ms = self.delay_ms(*delay)?;
            encoded.push((ms, bytes));
        }
        self.offer_batch_raw("r", &encoded)
    }

    /// As [`offer_batch`](Queue::offer_batch), each message due at a
    /// wall-clock time (as [`offer_at`](Queue::offer_at): past times are
    /// clamped to now).
    pub fn offer_batch_at(
        &self,
        messages: &[(T, SystemTime)],
    ) -> Result<Vec<MessageId>, QueueError> {
        let mut encoded = Vec::with_capacity(messages.len());
        for (payload, at) in messages {
            let bytes = self.encode(payload)?;
            encoded.push((epoch_ms(*at)?, bytes));
        }
        self.offer_batch_raw("a", &encoded)
    }

    fn offer_batch_raw(
        &self,
        mode: &str,
        encoded: &[(u64, Cow<'_, [u8]>)],
    ) -> Result<Vec<MessageId>, QueueError> {
        let ids: Vec<String> = (0..encoded.len()).map(|_| new_message_id()).collect();
        let keys = &self.state.keys;
        for (chunk, chunk_ids) in encoded
            .chunks(BATCH_OFFER_MAX)
            .zip(ids.chunks(BATCH_OFFER_MAX))
        {
            let mut inv = scripts::OFFER_BATCH.prepare_invoke();
            inv.key(&keys.delayed)
                .key(&keys.msg)
                .key(&keys.wake)
                .arg(mode);
            for ((ms, bytes), id) in chunk.iter().zip(chunk_ids) {
                inv.arg(*ms).arg(id).arg(bytes.as_ref());
            }
            self.rw.shared().with_conn(|con| inv.invoke::<i64>(con))?;
        }
        Ok(ids.into_iter().map(MessageId).collect())
    }

    /// Cancels a message by id. True if it was waiting (delayed, or due but
    /// not yet taken) and will now never be delivered; false if it is
    /// unknown, was already taken by a consumer, or already removed.
    /// O(log n): a due id already on the ready list is not searched for;
    /// its stored payload is deleted and `take` skips the id.
    /// (Removing a parked dead letter deletes its payload but leaves its id
    /// in `redwheel:{N}:dead`.)
    pub fn remove(&self, id: &MessageId) -> Result<bool, QueueError> {
        check_id(id)?;
        let keys = &self.state.keys;
        let n: i64 = self.rw.shared().with_conn(|con| {
            scripts::REMOVE
                .key(&keys.delayed)
                .key(&keys.msg)
                .arg(id.as_str())
                .invoke(con)
        })?;
        Ok(n == 1)
    }

    /// Messages waiting in the queue: delayed, or due and not yet taken.
    pub fn len(&self) -> Result<u64, QueueError> {
        let keys = &self.state.keys;
        let n: i64 = self
            .rw
            .shared()
            .with_conn(|con| scripts::LEN.key(&keys.msg).key(&keys.dead).invoke(con))?;
        Ok(n.max(0) as u64)
    }

    /// True when no message is waiting.
    pub fn is_empty(&self) -> Result<bool, QueueError> {
        Ok(self.len()? == 0)
    }

    /// Messages not yet due (in the `delayed` sorted set).
    pub fn delayed_len(&self) -> Result<u64, QueueError> {
        let key = &self.state.keys.delayed;
        self.rw
            .shared()
            .with_conn(|con| redis::cmd("ZCARD").arg(key).query(con))
    }

    /// Ids parked as dead letters because they could not be decoded.
    pub fn dead_letter_ids(&self, max: usize) -> Result<Vec<MessageId>, QueueError> {
        let key = &self.state.keys.dead;
        let stop = max as i64 - 1;
        if max == 0 {
            return Ok(Vec::new());
        }
        let ids: Vec<String> = self
            .rw
            .shared()
            .with_conn(|con| redis::cmd("LRANGE").arg(key).arg(0).arg(stop).query(con))?;
        Ok(ids.into_iter().map(MessageId).collect())
    }

    /// Deletes every message of the queue (delayed, ready and dead
    /// letters); returns how many there were.
    pub fn clear(&self) -> Result<u64, QueueError> {
        let keys = &self.state.keys;
        let n: i64 = self.rw.shared().with_conn(|con| {
            scripts::CLEAR
                .key(&keys.delayed)
                .key(&keys.msg)
                .key(&keys.ready)
                .key(&keys.dead)
                .invoke(con)
        })?;
        Ok(n.max(0) as u64)
    }

    /// Waits for the next due message and takes it (at-most-once from
    /// here: it is gone from Redis when this returns).
    ///
    /// Blocks on the ready list (`BLMOVE`), so it wakes as soon as a message
    /// lands there. While Redis is unreachable it keeps waiting, retrying
    /// with backoff. Returns [`QueueError::Shutdown`] once the `Redwheel` is
    /// shut down, and [`QueueError::Decode`] for a payload that cannot be
    /// decoded (that message is parked as a dead letter, not lost).
    pub fn take(&self) -> Result<Message<T>, QueueError> {
        match self.take_until(None)? {
            Some(m) => Ok(m),
            None => unreachable_none(),
        }
    }

    /// As [`take`](Queue::take), but gives up after `timeout`: `Ok(None)`
    /// when no message came. If Redis stayed unreachable until the timeout,
    /// the last connection error is returned instead.
    pub fn poll(&self, timeout: Duration) -> Result<Option<Message<T>>, QueueError> {
        let deadline = Instant::now().checked_add(timeout);
        match deadline {
            Some(d) => self.take_until(Some(d)),
            None => self.take_until(None),
        }
    }

    fn take_until(&self, deadline: Option<Instant>) -> Result<Option<Message<T>>, QueueError> {
        let shared = self.rw.shared();
        let max_block = shared.options.max_block;
        let mut backoff = Duration::from_millis(50);
        loop {
            if shared.is_shutdown() {
                return Err(QueueError::Shutdown);
            }
            let mut con = match shared.blocking_conn() {
                Ok(c) => c,
                Err(e) if e.is_transient() => {
                    if !wait_backoff(deadline, &mut backoff) {
                        return Err(e);
                    }
                    continue;
                }
                Err(e) => return Err(e),
            };
            match self.take_round(&mut con, deadline, max_block) {
                Ok(Round::Got(raw)) => {
                    shared.put_back_blocking(con);
                    return self.decode(raw).map(Some);
                }
                Ok(Round::Empty) => {
                    shared.put_back_blocking(con);
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        return Ok(None);
                    }
                    backoff = Duration::from_millis(50);
                }
                Err(e) if is_unavailable(&e) => {
                    drop(con);
                    let e = QueueError::from(e);
                    tracing::debug!(target: "redwheel::queue", queue = %self.state.name, error = %e, "take: redis unavailable; retrying");
                    if !wait_backoff(deadline, &mut backoff) {
                        return Err(e);
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// One round: take a ready message if there is one; otherwise block
    /// until the ready list is non-empty (or the round's timeout), then try
    /// once more.
    fn take_round(
        &self,
        con: &mut Connection,
        deadline: Option<Instant>,
        max_block: Duration,
    ) -> redis::RedisResult<Round> {
        let keys = &self.state.keys;
        let take = |con: &mut Connection| -> redis::RedisResult<Option<(String, Vec<u8>)>> {
            scripts::TAKE.key(&keys.ready).key(&keys.msg).invoke(con)
        };
        if let Some(raw) = take(con)? {
            return Ok(Round::Got(raw));
        }
        let block = match deadline {
            None => max_block,
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left < Duration::from_millis(1) {
                    return Ok(Round::Empty);
                }
                left.min(max_block)
            }
        };
        // A blocking peek (BLMOVE from the list to itself: it waits until the
        // list is non-empty without consuming anything), pipelined with the
        // take script: Redis runs the script as soon as the peek returns,
        // with no round trip back to us in between. If the peek timed out the
        // script usually finds nothing; if it finds a message, that is just
        // as good.
        let mut p = redis::pipe();
        p.cmd("BLMOVE")
            .arg(&keys.ready)
            .arg(&keys.ready)
            .arg("LEFT")
            .arg("LEFT")
            .arg(format!("{:.3}", block.as_secs_f64()))
            .ignore();
        p.cmd("EVALSHA")
            .arg(scripts::TAKE.get_hash())
            .arg(2)
            .arg(&keys.ready)
            .arg(&keys.msg);
        let reply = match p.query::<(Option<(String, Vec<u8>)>,)>(con) {
            Err(e) if is_noscript(&e) => {
                // Pipelined EVALSHA is not reloaded by `redis::Script`:
                // load it and run the round again.
                scripts::TAKE.load(con)?;
                p.query::<(Option<(String, Vec<u8>)>,)>(con)?
            }
            other => other?,
        };
        Ok(match reply.0 {
            Some(raw) => Round::Got(raw),
            None => Round::Empty,
        })
    }

    fn decode(&self, (id, value): (String, Vec<u8>)) -> Result<Message<T>, QueueError> {
        let parsed = value.iter().position(|&b| b == b':').and_then(|i| {
            let due = std::str::from_utf8(&value[..i]).ok()?.parse::<u64>().ok()?;
            Some((due, &value[i + 1..]))
        });
        let result: Result<(u64, T), CodecError> = match parsed {
            Some((due, bytes)) => T::decode(bytes).map(|p| (due, p)),
            None => Err("stored value is not \"<due ms>:<payload>\"".into()),
        };
        match result {
            Ok((due_ms, payload)) => Ok(Message {
                id: MessageId(id),
                payload,
                due_ms,
            }),
            Err(source) => {
                self.park(&id, &value);
                Err(QueueError::Decode {
                    queue: self.state.name.clone(),
                    id,
                    source,
                })
            }
        }
    }

    /// Puts an undecodable message back as a dead letter.
    fn park(&self, id: &str, value: &[u8]) {
        let keys = &self.state.keys;
        let parked = self.rw.shared().with_conn(|con| {
            scripts::PARK
                .key(&keys.msg)
                .key(&keys.dead)
                .arg(id)
                .arg(value)
                .invoke::<i64>(con)
        });
        match parked {
            Ok(_) => tracing::warn!(
                target: "redwheel::queue",
                queue = %self.state.name,
                id,
                "a message could not be decoded; parked as a dead letter"
            ),
            Err(e) => tracing::error!(
                target: "redwheel::queue",
                queue = %self.state.name,
                id,
                error = %e,
                "a message could not be decoded, and parking it failed: it is lost"
            ),
        }
    }

    /// Transfer script runs and messages moved by this process's transfer
    /// task for this queue so far (diagnostics).
    pub fn transfer_stats(&self) -> TransferStats {
        use std::sync::atomic::Ordering;
        TransferStats {
            runs: self.state.runs.load(Ordering::Relaxed),
            moved: self.state.moved.load(Ordering::Relaxed),
            next_wakeup: self.state.scheduled_at(),
        }
    }
}

/// What this process's transfer task did for one queue.
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

enum Round {
    Got((String, Vec<u8>)),
    Empty,
}

fn unreachable_none<M>() -> Result<M, QueueError> {
    // `take_until(None)` never returns `Ok(None)`.
    Err(QueueError::Protocol("take returned no message".to_owned()))
}

/// Sleeps for the backoff (not past `deadline`) and doubles it; false if
/// the deadline has passed.
fn wait_backoff(deadline: Option<Instant>, backoff: &mut Duration) -> bool {
    let mut wait = *backoff;
    if let Some(d) = deadline {
        let left = d.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        wait = wait.min(left);
    }
    std::thread::sleep(wait);
    *backoff = (*backoff * 2).min(Duration::from_secs(1));
    true
}

/// A script the server does not know (flushed, or a restarted server).
fn is_noscript(e: &redis::RedisError) -> bool {
    e.code() == Some("NOSCRIPT") || e.to_string().contains("NOSCRIPT")
}

fn check_id(id: &MessageId) -> Result<(), QueueError> {
    let reason = if id.0.is_empty() {
        "must not be empty"
    } else if id.0.len() > MAX_ID_LEN {
        "longer than 128 bytes"
    } else {
        return Ok(());
    };
    Err(QueueError::InvalidId {
        id: id.0.clone(),
        reason,
    })
}
