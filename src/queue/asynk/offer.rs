//! `offer_async`, `offer_with_id_async` and `offer_batch_async`.

use std::borrow::Cow;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use super::coalesce::{Answer, PendingOffer, copy_error};
use crate::error::{Access, Error, ErrorKind};
use crate::queue::codec::Codec;
use crate::queue::handle::{Queue, check_id};
use crate::queue::ids::{new_message_id, new_message_ids};
use crate::queue::message::MessageId;
use crate::queue::offer::{batch_args, offer_keys, pieces};
use crate::queue::state::QueueState;
use crate::runtime::{Command, Runtime, first_reply};
use crate::scripts::{self, BATCH_OFFER_MAX};
use crate::telemetry;

impl<T: Codec> Queue<T> {
    /// [`offer`](Queue::offer) as a future: offers `payload`, due `delay`
    /// from now by the Redis server's clock, and gives its id.
    ///
    /// The payload is encoded and checked when this is called (an
    /// oversized or unencodable payload, or a delay past the limit, fails
    /// at the first poll with nothing sent). Same errors as `offer`.
    ///
    /// Offers of one queue that come while an earlier one is on the wire go
    /// out together, in one `offer_batch.lua` call (without
    /// `QueueOptions::wait_replicas`): Redis spends a fraction of a call per
    /// offer when many tasks offer at once, and each still gets its own
    /// answer. A call that a queue's `max_len` refuses whole is sent again
    /// offer by offer, so each is refused or written as if it had been sent
    /// alone.
    ///
    /// **Cancellation**: dropped before its first poll, nothing is sent.
    /// Dropped after, the offer may or may not be written, as after
    /// [`ErrorKind::OutcomeUnknown`]: where that matters, offer with an id
    /// of your own ([`offer_with_id_async`](Queue::offer_with_id_async)) and
    /// offer it again.
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), redwheel::Error> {
    /// use std::time::Duration;
    /// use redwheel::Redwheel;
    ///
    /// let rw = Redwheel::connect("redis://127.0.0.1:6379")?;
    /// let q = rw.queue::<String>("emails")?;
    /// let id = q.offer_async(&"hello".to_string(), Duration::from_secs(5)).await?;
    /// # let _ = id; Ok(()) }
    /// ```
    pub fn offer_async(
        &self,
        payload: &T,
        delay: Duration,
    ) -> impl Future<Output = Result<MessageId, Error>> + Send + 'static {
        let id = new_message_id();
        let prepared = self.offer_parts(delay, payload);
        let q = self.clone();
        async move {
            let (ms, bytes) = prepared?;
            let added = q.offer_coalesced(ms, &id, bytes).await?;
            q.fresh_offered(added, id)
        }
    }

    /// [`offer_with_id`](Queue::offer_with_id) as a future: the idempotent
    /// offer, `true` if added, `false` if the id was known. Same errors.
    ///
    /// Sent together with other offers of the queue as
    /// [`offer_async`](Queue::offer_async) is.
    ///
    /// **Cancellation**: as [`offer_async`](Queue::offer_async); offering
    /// the same id again after a drop writes it at most once.
    pub fn offer_with_id_async(
        &self,
        id: &MessageId,
        payload: &T,
        delay: Duration,
    ) -> impl Future<Output = Result<bool, Error>> + Send + 'static {
        let prepared = check_id(id)
            .map_err(|e| self.tag(e))
            .and_then(|()| self.offer_parts(delay, payload));
        let (q, id) = (self.clone(), id.as_str().to_owned());
        async move {
            let (ms, bytes) = prepared?;
            q.offer_coalesced(ms, &id, bytes).await
        }
    }

    /// An offer's delay in ms and its encoded payload, checked.
    fn offer_parts(&self, delay: Duration, payload: &T) -> Result<(u64, Vec<u8>), Error> {
        let bytes = self.encode(payload)?.into_owned();
        Ok((self.delay_ms(delay)?, bytes))
    }

    /// Offers `bytes` under `id`, due `ms` from now: with the offers of
    /// the queue that gather meanwhile (see `offer_async`), or alone, with
    /// its `WAIT`, under `wait_replicas`. True if it was written, false if
    /// its id was known.
    async fn offer_coalesced(&self, ms: u64, id: &str, bytes: Vec<u8>) -> Result<bool, Error> {
        if self.wait_replicas.is_some() {
            let ms = ms.to_string();
            let command = Command::script(
                &scripts::OFFER,
                &offer_keys(&self.state.keys),
                &[b"r", ms.as_bytes(), id.as_bytes(), &bytes],
            );
            let command = match self.wait_cmd() {
                Some(wait) => command.then(&wait),
                None => command,
            };
            return self.send_offer(command, id).await;
        }
        let _span = telemetry::queue_op_async("offer", &self.state.name, 1);
        let answer = Arc::new(Answer::default());
        let item = PendingOffer {
            ms,
            id: id.to_owned(),
            bytes,
            answer: Arc::clone(&answer),
        };
        let rt = Arc::clone(self.rt());
        self.state.offers.push(
            &self.state,
            |s| &s.offers,
            BATCH_OFFER_MAX,
            item,
            move |state, batch| {
                let rt = Arc::clone(&rt);
                async move { send_offers(&rt, &state, batch).await }
            },
        );
        let added = answer
            .wait("an offer")
            .await
            .map_err(|e| self.tag(e).for_message(id))?;
        self.offered(if added { 0 } else { -1 }, None, id)
    }

    async fn send_offer(&self, command: Command, id: &str) -> Result<bool, Error> {
        let _span = telemetry::queue_op_async("offer", &self.state.name, 1);
        let tag = |e: Error| self.tag(e).for_message(id);
        // With its `WAIT` (under `wait_replicas`): on a connection of its
        // own, as `WAIT` blocks the connection it is sent on.
        let mut replies = Arc::clone(self.rt())
            .call_alone(&self.state.keys.delayed, Access::Write, command)
            .await
            .map_err(tag)?
            .into_iter();
        let due: i64 = reply_as(replies.next(), Access::Write).map_err(tag)?;
        let replicas = match self.wait_replicas {
            Some(_) => Some(reply_as::<i64>(replies.next(), Access::Write).map_err(tag)?),
            None => None,
        };
        self.offered(due, replicas, id)
    }

    /// [`offer_batch`](Queue::offer_batch) as a future: offers every
    /// message, each with its own delay, in atomic chunks of up to 1,000;
    /// gives their ids in order. Every payload and delay is checked when
    /// this is called. Same errors.
    ///
    /// **Cancellation**: dropped before its first poll, nothing is sent;
    /// after, the chunks already sent may be written (the rest is not).
    pub fn offer_batch_async(
        &self,
        messages: &[(T, Duration)],
    ) -> impl Future<Output = Result<Vec<MessageId>, Error>> + Send + 'static {
        let prepared = self.batch_commands(messages);
        let q = self.clone();
        async move {
            let (ids, commands) = prepared?;
            for (command, len, first) in commands {
                let _span = telemetry::queue_op_async("offer_batch", &q.state.name, len);
                let rt = Arc::clone(q.rt());
                let route = &q.state.keys.delayed;
                // A chunk with its `WAIT` goes on a connection of its own
                // (`WAIT` blocks the connection it is sent on).
                let replies = match q.wait_replicas {
                    Some(_) => rt.call_alone(route, Access::Write, command).await,
                    None => rt.call(route, Access::Write, command, None).await,
                };
                let mut replies = replies.map_err(|e| q.tag(e))?.into_iter();
                let reply = first_reply(replies.next().into_iter().collect(), Access::Write)
                    .map_err(|e| q.tag(e))?;
                let replicas = match q.wait_replicas {
                    Some(_) => {
                        Some(reply_as::<i64>(replies.next(), Access::Write).map_err(|e| q.tag(e))?)
                    }
                    None => None,
                };
                q.batch_written(false, len, &first, reply, replicas)?;
            }
            Ok(ids.into_iter().map(MessageId).collect())
        }
    }

    /// The ids and the chunks' commands of a batch offer.
    fn batch_commands(
        &self,
        messages: &[(T, Duration)],
    ) -> Result<(Vec<String>, Vec<Chunk>), Error> {
        let limit = self.delay_limit();
        let mut encoded: Vec<(String, u64, Cow<'_, [u8]>)> = Vec::with_capacity(messages.len());
        // Ids that sort in batch order, as the synchronous batch's.
        let ids = new_message_ids(messages.len());
        for ((payload, delay), id) in messages.iter().zip(ids) {
            let bytes = self.encode(payload)?;
            let ms = self.delay_ms_within(*delay, limit)?;
            encoded.push((id, ms, bytes));
        }
        let keys = offer_keys(&self.state.keys);
        let commands = encoded
            .chunks(BATCH_OFFER_MAX)
            .map(|chunk| {
                let args = batch_args("r", false, pieces(chunk));
                let args: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
                let command = Command::script(&scripts::OFFER_BATCH, &keys, &args);
                let command = match self.wait_cmd() {
                    Some(wait) => command.then(&wait),
                    None => command,
                };
                let first = chunk.first().map_or(String::new(), |(id, _, _)| id.clone());
                (command, chunk.len(), first)
            })
            .collect();
        Ok((encoded.into_iter().map(|(id, _, _)| id).collect(), commands))
    }
}

/// Sends a batch of offers and answers each: one `offer.lua` call for one
/// offer, one `offer_batch.lua` call (ids checked, a flag per offer) for
/// several; a batch that `max_len` refuses whole (it wrote nothing) goes
/// again offer by offer, so that each gets the answer it would have had
/// alone.
async fn send_offers(rt: &Arc<Runtime>, state: &QueueState, batch: Vec<PendingOffer>) {
    let keys = offer_keys(&state.keys);
    let call = |command: Command| async move {
        rt.call(&state.keys.delayed, Access::Write, command, None)
            .await
            .and_then(|v| first_reply(v, Access::Write))
    };
    if batch.len() > 1 {
        let args = batch_args(
            "r",
            true,
            batch
                .iter()
                .map(|p| (p.id.as_str(), p.ms, p.bytes.as_slice())),
        );
        let args: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
        match call(Command::script(&scripts::OFFER_BATCH, &keys, &args)).await {
            Ok(v) => {
                match redis::from_redis_value::<Vec<i64>>(v) {
                    Ok(flags) if flags.len() == batch.len() => {
                        for (p, f) in batch.iter().zip(flags) {
                            p.answer.set(Ok(f == 1));
                        }
                    }
                    _ => {
                        for p in &batch {
                            p.answer.set(Err(Error::new(
                                ErrorKind::Protocol,
                                "unexpected reply to offer_batch.lua",
                            )));
                        }
                    }
                }
                return;
            }
            Err(e) if e.kind() == ErrorKind::QueueFull => {}
            Err(e) => {
                for p in &batch {
                    p.answer.set(Err(copy_error(&e)));
                }
                return;
            }
        }
    }
    for p in batch {
        let ms = p.ms.to_string();
        let command = Command::script(
            &scripts::OFFER,
            &keys,
            &[b"r", ms.as_bytes(), p.id.as_bytes(), &p.bytes],
        );
        let r = call(command).await.and_then(|v| {
            redis::from_redis_value::<i64>(v).map_err(|e| {
                Error::new(ErrorKind::Protocol, "unexpected reply to offer.lua").with_cause(e)
            })
        });
        p.answer.set(r.map(|due| due >= 0));
    }
}

/// One chunk of a batch offer: its command, how many messages it holds,
/// and the first one's id (for the error of an id found in use).
type Chunk = (Command, usize, String);

/// A reply read as `R`, an error reply as the caller's error.
pub(super) fn reply_as<R: redis::FromRedisValue>(
    v: Option<redis::Value>,
    access: Access,
) -> Result<R, Error> {
    let v = first_reply(v.into_iter().collect(), access)?;
    redis::from_redis_value(v)
        .map_err(|e| Error::new(ErrorKind::Protocol, "unexpected reply from redis").with_cause(e))
}
