//! Offers: one message or a batch, due after a delay or at a time, under
//! a fresh id or an id of the caller's (written at most once), with the
//! optional wait for replicas.

use std::borrow::Cow;
use std::time::{Duration, SystemTime};

use super::codec::Codec;
use super::handle::{Queue, check_id, epoch_ms};
use super::ids::{self, new_message_id, new_message_ids};
use super::keys::Keys;
use super::message::MessageId;
use crate::error::{Access, Error, ErrorKind};
use crate::runtime::Conn;
use crate::scripts::{self, BATCH_OFFER_MAX};
use crate::telemetry;

impl<T: Codec> Queue<T> {
    /// Offers `payload`, due `delay` from now by the Redis server's clock.
    /// Returns its id.
    ///
    /// A shorthand for [`offer_with`](Queue::offer_with)`(payload,
    /// OfferOptions::after(delay))`: a fresh id, priority 0, no ttl.
    ///
    /// Fails with [`ErrorKind::PayloadTooLarge`], [`ErrorKind::Encode`],
    /// [`ErrorKind::DelayOverflow`], [`ErrorKind::QueueFull`] (the queue
    /// holds `max_len` messages; nothing is written),
    /// [`ErrorKind::Unavailable`] when Redis cannot be reached (nothing is
    /// written), or [`ErrorKind::OutcomeUnknown`] when the connection was
    /// lost or Redis stopped answering after the offer was sent (it may
    /// have been written; retry with [`offer_with_id`](Queue::offer_with_id)
    /// to be sure it is written once). The offer is sent once: never again
    /// behind the caller's back. The call takes at most
    /// [`command_timeout`](crate::RedwheelOptions::command_timeout).
    ///
    /// Ids are made by this process (`ErrorKind::Server` in the
    /// astronomically unlikely case that the id is in use already: nothing
    /// is written, and later ids get a new prefix). Messages that one
    /// process offers with equal due times are delivered in offer order.
    pub fn offer(&self, payload: &T, delay: Duration) -> Result<MessageId, Error> {
        let bytes = self.encode(payload)?;
        let ms = self.delay_ms(delay)?;
        let id = new_message_id();
        self.offer_fresh("r", ms, id, &bytes)
    }

    /// Offers `payload`, due at `at` (wall-clock time, compared with the
    /// Redis server's clock). A time in the past is clamped to now: the
    /// message is due at once. A shorthand for
    /// [`offer_with`](Queue::offer_with)`(payload, OfferOptions::at(at))`.
    ///
    /// ```no_run
    /// use std::time::{Duration, SystemTime};
    /// use redwheel::Redwheel;
    ///
    /// let rw = Redwheel::connect("redis://127.0.0.1:6379")?;
    /// let reminders = rw.queue::<String>("reminders")?;
    /// let tomorrow = SystemTime::now() + Duration::from_secs(86_400);
    /// let id = reminders.offer_at(&"call back".to_string(), tomorrow)?;
    /// # let _ = id;
    /// # Ok::<(), redwheel::Error>(())
    /// ```
    pub fn offer_at(&self, payload: &T, at: SystemTime) -> Result<MessageId, Error> {
        let bytes = self.encode(payload)?;
        let at = epoch_ms(at)?;
        self.offer_fresh("a", at, new_message_id(), &bytes)
    }

    /// Adds one message under `id`, an id of ours: `Ok` only if it was
    /// written. Shared with `Queue::trigger_schedule`, which offers a
    /// stored, already encoded payload.
    pub(super) fn offer_fresh(
        &self,
        mode: &str,
        value: u64,
        id: String,
        bytes: &[u8],
    ) -> Result<MessageId, Error> {
        let added = self.offer_raw(mode, value, &id, bytes)?;
        self.fresh_offered(added, id)
    }

    /// What an offer under a fresh id of ours means (shared with the async
    /// offer): `Ok` only if it was written.
    pub(super) fn fresh_offered(&self, added: bool, id: String) -> Result<MessageId, Error> {
        if added {
            return Ok(MessageId(id));
        }
        ids::reseed();
        Err(self.id_in_use(&id, false))
    }

    /// The error of an id of ours found in use (`id`, or one of a batch's
    /// chunk starting at `id`): another process makes ids with the same
    /// prefix (a `fork()` that went unseen, or a collision of 64 random
    /// bits).
    pub(super) fn id_in_use(&self, id: &str, batch: bool) -> Error {
        let what = if batch {
            format!("an id of the batch chunk starting at {id}")
        } else {
            format!("the id {id}")
        };
        let e = self.tag(Error::new(
            ErrorKind::Server,
            format!(
                "{what}, made by this process, is already in use in the queue; nothing of it was written \
                 (ids made from now on have a new prefix)"
            ),
        ));
        if batch { e } else { e.for_message(id) }
    }

    /// Offers `payload` under an id of the caller's choosing, due `delay`
    /// from now: the idempotent offer, for producers that retry.
    ///
    /// Returns `true` if the message was added, `false` if a message with
    /// this id is already known to the queue (waiting, due, in flight, or a
    /// dead letter): then nothing changes, its payload and due time stay as
    /// they were. A shorthand for [`offer_with`](Queue::offer_with)`(payload,
    /// OfferOptions::after(delay).id(id))` ([`Dedup::Keep`]).
    ///
    /// What a retry after [`ErrorKind::OutcomeUnknown`] gets: while the
    /// first attempt's message (if it was written) is still known to the
    /// queue, `false`, and the message is there once. But once that message
    /// has been taken or acked, the id is free again, and the retry writes
    /// it a second time: a fast consumer can get there between the attempt
    /// and its retry. To retry safely whatever the consumers do, offer with
    /// [`Dedup::Throttle`]`(window)` (a window longer than your retries):
    /// then the key is refused for the window after the write, consumed or
    /// not.
    ///
    /// [`Dedup::Keep`]: crate::Dedup::Keep
    /// [`Dedup::Throttle`]: crate::Dedup::Throttle
    ///
    /// Fails with [`ErrorKind::InvalidId`] for an empty id or one over 128
    /// bytes, and as [`offer`](Queue::offer) otherwise.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use redwheel::{MessageId, Redwheel};
    ///
    /// let rw = Redwheel::connect("redis://127.0.0.1:6379")?;
    /// let q = rw.queue::<String>("invoices")?;
    /// // The id comes from the database row, so a retry after a crash or an
    /// // OutcomeUnknown writes the message at most once.
    /// let id = MessageId::from("invoice-1017");
    /// loop {
    ///     match q.offer_with_id(&id, &"send invoice 1017".to_string(), Duration::from_secs(3600)) {
    ///         Ok(_added) => break, // false: it was there already
    ///         Err(e) if e.is_transient() => std::thread::sleep(Duration::from_millis(100)),
    ///         Err(e) => return Err(e),
    ///     }
    /// }
    /// # Ok::<(), redwheel::Error>(())
    /// ```
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
                let mut inv = scripts::OFFER.prepare_invoke();
                for k in offer_keys(keys) {
                    inv.key(k);
                }
                let due = inv
                    .arg(mode)
                    .arg(value)
                    .arg(id)
                    .arg(bytes)
                    .invoke::<i64>(con)?;
                Ok((due, self.wait(con)?))
            })
            .map_err(|e| self.tag(e).for_message(id))?;
        self.offered(due, replicas, id)
    }

    /// Reads `offer.lua`'s reply (and `WAIT`'s): true if added. Shared
    /// with the async offer.
    pub(super) fn offered(&self, due: i64, replicas: Option<i64>, id: &str) -> Result<bool, Error> {
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
    /// each, sent once); if Redis fails midway, the chunks already written
    /// stay, and the chunk in flight when a connection was lost may or may
    /// not have been written ([`ErrorKind::OutcomeUnknown`]). For a batch
    /// that can be retried safely, use
    /// [`offer_batch_with_ids`](Queue::offer_batch_with_ids). The ids
    /// sort in batch order, so messages with equal due times are delivered
    /// in batch order.
    ///
    /// With `QueueOptions::max_len`, each chunk is written whole or not at
    /// all: a chunk that does not fit under the bound fails with
    /// [`ErrorKind::QueueFull`] and writes nothing, the chunks before it
    /// stay written and the ones after it are not sent (the error's message
    /// says how many were written). So a batch of up to 1,000 is all or
    /// nothing.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use redwheel::Redwheel;
    ///
    /// let rw = Redwheel::connect("redis://127.0.0.1:6379")?;
    /// let q = rw.queue::<String>("emails")?;
    /// let batch: Vec<(String, Duration)> = (1..=3)
    ///     .map(|i| (format!("reminder {i}"), Duration::from_secs(60 * i)))
    ///     .collect();
    /// let ids = q.offer_batch(&batch)?;
    /// assert_eq!(ids.len(), 3);
    /// # Ok::<(), redwheel::Error>(())
    /// ```
    pub fn offer_batch(&self, messages: &[(T, Duration)]) -> Result<Vec<MessageId>, Error> {
        let mut encoded = Vec::with_capacity(messages.len());
        let limit = self.delay_limit();
        let mut ids = new_message_ids(messages.len()).into_iter();
        for ((payload, delay), id) in messages.iter().zip(&mut ids) {
            let bytes = self.encode(payload)?;
            let ms = self.delay_ms_within(*delay, limit)?;
            encoded.push((id, ms, bytes));
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
        let mut ids = new_message_ids(messages.len()).into_iter();
        for ((payload, at), id) in messages.iter().zip(&mut ids) {
            let bytes = self.encode(payload)?;
            encoded.push((id, epoch_ms(*at)?, bytes));
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
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use redwheel::{MessageId, Redwheel};
    ///
    /// let rw = Redwheel::connect("redis://127.0.0.1:6379")?;
    /// let q = rw.queue::<String>("emails")?;
    /// let batch = vec![
    ///     (MessageId::from("welcome-7"), "welcome 7".to_string(), Duration::from_secs(10)),
    ///     (MessageId::from("welcome-8"), "welcome 8".to_string(), Duration::from_secs(10)),
    /// ];
    /// let added = q.offer_batch_with_ids(&batch)?; // safe to send again after an error
    /// assert_eq!(added.len(), 2);
    /// # Ok::<(), redwheel::Error>(())
    /// ```
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
            let args = batch_args(mode, check_ids, pieces(chunk));
            let mut inv = scripts::OFFER_BATCH.prepare_invoke();
            for k in offer_keys(keys) {
                inv.key(k);
            }
            for a in &args {
                inv.arg(a.as_slice());
            }
            let _span = telemetry::queue_op("offer_batch", &self.state.name, chunk.len());
            let (reply, replicas): (redis::Value, _) = self
                .rt()
                .run(&keys.delayed, Access::Write, |con| {
                    Ok((inv.invoke(con)?, self.wait(con)?))
                })
                .map_err(|e| self.tag(partly_full(e, added.len(), encoded.len())))?;
            let first = chunk.first().map_or("", |(id, _, _)| id.as_str());
            added.extend(self.batch_written(check_ids, chunk.len(), first, reply, replicas)?);
        }
        Ok(added)
    }

    /// Reads `offer_batch.lua`'s reply to a chunk of `len` (and `WAIT`'s):
    /// whether each was added. Shared with the async batch offer.
    pub(super) fn batch_written(
        &self,
        check_ids: bool,
        len: usize,
        first_id: &str,
        reply: redis::Value,
        replicas: Option<i64>,
    ) -> Result<Vec<bool>, Error> {
        let protocol = |e: redis::ParsingError| {
            self.tag(
                Error::new(ErrorKind::Protocol, "unexpected reply to offer_batch.lua")
                    .with_cause(e),
            )
        };
        let added = if check_ids {
            let flags: Vec<i64> = redis::from_redis_value(reply).map_err(protocol)?;
            flags.into_iter().map(|f| f == 1).collect()
        } else {
            let written: i64 = redis::from_redis_value(reply).map_err(protocol)?;
            if written < 0 {
                // Nothing of this chunk was written.
                ids::reseed();
                return Err(self.id_in_use(first_id, true));
            }
            vec![true; len]
        };
        let new = added.iter().filter(|&&a| a).count();
        self.state.metrics.offered.add(new as u64);
        self.check_replicas(replicas, None)?;
        Ok(added)
    }

    /// With `wait_replicas`, `WAIT`s on `con` (after a write on it) and
    /// returns how many replicas acknowledged.
    pub(super) fn wait(&self, con: &mut Conn) -> redis::RedisResult<Option<i64>> {
        self.wait_cmd().map(|c| c.query(con)).transpose()
    }

    /// With `wait_replicas`, the `WAIT` to send after a write.
    pub(super) fn wait_cmd(&self) -> Option<redis::Cmd> {
        let (n, timeout) = self.wait_replicas?;
        let ms = u64::try_from(timeout.as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        let mut cmd = redis::cmd("WAIT");
        cmd.arg(n).arg(ms);
        Some(cmd)
    }

    pub(super) fn check_replicas(&self, acked: Option<i64>, id: Option<&str>) -> Result<(), Error> {
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
}

/// A batch's `QueueFull` after `done` of its `total` messages were sent in
/// earlier chunks: says so (the chunks before stay written).
fn partly_full(e: Error, done: usize, total: usize) -> Error {
    if e.kind() != ErrorKind::QueueFull || done == 0 {
        return e;
    }
    Error::new(
        ErrorKind::QueueFull,
        format!(
            "the queue is full (max_len): the first {done} of the batch's {total} messages were written, the rest were not"
        ),
    )
    .with_cause(e)
}

/// `offer.lua`'s and `offer_batch.lua`'s keys, in their order.
pub(super) fn offer_keys(keys: &Keys) -> [&str; 7] {
    [
        &keys.delayed,
        &keys.msg,
        &keys.wake,
        &keys.head,
        &keys.controls,
        &keys.dead,
        &keys.ready,
    ]
}

/// A batch chunk's messages as `batch_args` takes them.
pub(super) fn pieces<'a>(
    chunk: &'a [(String, u64, Cow<'_, [u8]>)],
) -> impl ExactSizeIterator<Item = (&'a str, u64, &'a [u8])> {
    chunk
        .iter()
        .map(|(id, ms, bytes)| (id.as_str(), *ms, &**bytes))
}

/// `offer_batch.lua`'s ARGV for one chunk: the mode, whether ids are
/// checked, then (delay or time, id, payload) per message.
pub(super) fn batch_args<'a>(
    mode: &str,
    check_ids: bool,
    chunk: impl ExactSizeIterator<Item = (&'a str, u64, &'a [u8])>,
) -> Vec<Vec<u8>> {
    let mut args = Vec::with_capacity(2 + 3 * chunk.len());
    args.push(mode.as_bytes().to_vec());
    args.push(if check_ids {
        b"k".to_vec()
    } else {
        b"n".to_vec()
    });
    for (id, ms, bytes) in chunk {
        args.push(ms.to_string().into_bytes());
        args.push(id.as_bytes().to_vec());
        args.push(bytes.to_vec());
    }
    args
}
