//! Dead letters: messages past `max_deliveries` or whose payload cannot be
//! decoded. Reading them, requeueing them, and parking an undecodable
//! message on arrival.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::codec::{Codec, CodecError};
use super::handle::Queue;
use super::keys::Keys;
use super::message::MessageId;
use super::stored::{parse_stored, split_stored};
use crate::error::{Access, Error, ErrorKind};
use crate::scripts;
use crate::telemetry;

/// A message that is no longer delivered: it reached `max_deliveries`, or
/// its payload could not be decoded.
#[derive(Debug, Clone)]
pub struct DeadLetter<T> {
    id: MessageId,
    payload: Option<T>,
    raw: Vec<u8>,
    due_ms: u64,
    reason: String,
    attempts: u32,
    died_ms: u64,
}

impl<T> DeadLetter<T> {
    /// The message's id.
    pub fn id(&self) -> &MessageId {
        &self.id
    }

    /// The payload, or `None` if it cannot be decoded (see
    /// [`raw_payload`](DeadLetter::raw_payload)).
    pub fn payload(&self) -> Option<&T> {
        self.payload.as_ref()
    }

    /// The payload's stored bytes.
    pub fn raw_payload(&self) -> &[u8] {
        &self.raw
    }

    /// Why it died: the delivery count and the last failure, or the decode
    /// error.
    pub fn reason(&self) -> &str {
        &self.reason
    }

    /// How many times it was delivered.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// When it was due (as offered), Redis clock.
    pub fn due(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(self.due_ms)
    }

    /// When it died, Redis clock.
    pub fn died(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(self.died_ms)
    }
}

impl<T: Codec> Queue<T> {
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

    /// The oldest dead letters, at most `limit`: messages that reached
    /// `max_deliveries` or could not be decoded, with why.
    ///
    /// ```no_run
    /// use redwheel::Redwheel;
    ///
    /// let rw = Redwheel::connect("redis://127.0.0.1:6379")?;
    /// let q = rw.queue::<String>("emails")?;
    /// for dl in q.dead_letters(10)? {
    ///     println!("{}: {} after {} deliveries", dl.id(), dl.reason(), dl.attempts());
    /// }
    /// // The bug is fixed: give them another chance.
    /// let requeued = q.requeue_dead(10)?;
    /// # let _ = requeued;
    /// # Ok::<(), redwheel::Error>(())
    /// ```
    pub fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter<T>>, Error> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let keys = &self.state.keys;
        let _span = telemetry::queue_op("dead", &self.state.name, limit);
        let items: Vec<redis::Value> = self
            .rt()
            .run(&keys.dead, Access::Read, |con| {
                scripts::DEAD
                    .key(&keys.dead)
                    .key(&keys.msg)
                    .key(&keys.reason)
                    .key(&keys.attempts)
                    .arg(limit)
                    .invoke(con)
            })
            .map_err(|e| self.tag(e))?;
        let mut out = Vec::with_capacity(items.len() / 5);
        for chunk in items.chunks_exact(5) {
            let parsed: redis::RedisResult<(String, Vec<u8>, String, u32, u64)> = (|| {
                Ok((
                    redis::from_redis_value(chunk[0].clone())?,
                    redis::from_redis_value(chunk[1].clone())?,
                    redis::from_redis_value(chunk[2].clone())?,
                    redis::from_redis_value(chunk[3].clone())?,
                    redis::from_redis_value(chunk[4].clone())?,
                ))
            })();
            let (id, stored, reason, attempts, died_ms) = parsed.map_err(|e| {
                self.tag(
                    Error::new(ErrorKind::Protocol, "unexpected reply to dead.lua").with_cause(e),
                )
            })?;
            let (due, raw) = split_stored(&stored);
            let due_ms = due.unwrap_or(0);
            let raw = raw.to_vec();
            let payload = parse_stored::<T>(&stored).ok().map(|(_, p)| p);
            out.push(DeadLetter {
                id: MessageId(id),
                payload,
                raw,
                due_ms,
                reason,
                attempts,
                died_ms,
            });
        }
        Ok(out)
    }

    /// Gives the oldest dead letters (at most `limit`) a fresh start: back
    /// to the ready list, attempt count reset. Returns how many.
    pub fn requeue_dead(&self, limit: usize) -> Result<u64, Error> {
        if limit == 0 {
            return Ok(0);
        }
        let keys = &self.state.keys;
        let _span = telemetry::queue_op("requeue_dead", &self.state.name, limit);
        let n: i64 = self
            .rt()
            .run(&keys.dead, Access::Write, |con| {
                scripts::REQUEUE_DEAD
                    .key(&keys.dead)
                    .key(&keys.msg)
                    .key(&keys.reason)
                    .key(&keys.attempts)
                    .key(&keys.ready)
                    .arg(limit)
                    .invoke(con)
            })
            .map_err(|e| self.tag(e))?;
        Ok(n.max(0) as u64)
    }

    /// A message whose stored value does not decode: kept as a dead letter
    /// (with the reason), and the error naming it. `token`: the claim that
    /// handed it out (`None` after a take).
    pub(crate) fn dead_on_arrival(
        &self,
        id: &str,
        stored: &[u8],
        token: Option<&str>,
        cause: CodecError,
    ) -> Error {
        let parked = self.park(id, stored, token, &cause.to_string());
        self.decode_failed(id, token, parked, cause)
    }

    /// The error of a message that did not decode, and what became of it
    /// (shared with the async consumers, which park it through the
    /// multiplexed connection).
    pub(crate) fn decode_failed(
        &self,
        id: &str,
        token: Option<&str>,
        parked: Parked,
        cause: CodecError,
    ) -> Error {
        let what = match parked {
            Parked::Yes => "could not decode a message; it is kept as a dead letter",
            Parked::NotOurs if token.is_some() => {
                "could not decode a message; it was not parked: this claim of it is no longer current"
            }
            Parked::NotOurs => {
                "could not decode a message; it was not parked: its id was offered again meanwhile"
            }
            Parked::Failed => "could not decode a message, and parking it as a dead letter failed",
        };
        self.tag(
            Error::new(ErrorKind::Decode, what)
                .with_cause(cause)
                .for_message(id),
        )
    }

    /// Puts an undecodable message in the dead letters, if it is still
    /// this claim's (`token`) or, after a take, its id is still free.
    fn park(&self, id: &str, value: &[u8], token: Option<&str>, reason: &str) -> Parked {
        let keys = &self.state.keys;
        let _span = telemetry::queue_op("park", &self.state.name, 1);
        let parked = self.rt().run(&keys.msg, Access::Write, |con| {
            let mut inv = scripts::PARK.prepare_invoke();
            for k in park_keys(keys) {
                inv.key(k);
            }
            for a in park_args(id, value, token, reason) {
                inv.arg(a);
            }
            inv.invoke::<i64>(con)
        });
        self.parked(id, parked)
    }

    /// What `park.lua`'s reply (or its failure) means, logged (shared with
    /// the async consumers).
    pub(crate) fn parked(&self, id: &str, parked: Result<i64, Error>) -> Parked {
        match parked {
            Ok(1) => {
                self.state.metrics.dead_lettered.add(1);
                tracing::warn!(
                    target: "redwheel::queue",
                    queue = %self.state.name,
                    id,
                    "a message could not be decoded; parked as a dead letter"
                );
                Parked::Yes
            }
            Ok(_) => {
                tracing::warn!(
                    target: "redwheel::queue",
                    queue = %self.state.name,
                    id,
                    "a message could not be decoded; not parked: it is no longer this consumer's"
                );
                Parked::NotOurs
            }
            Err(e) => {
                tracing::error!(
                    target: "redwheel::queue",
                    queue = %self.state.name,
                    id,
                    error = %e,
                    "a message could not be decoded, and parking it failed (after a take it is lost; a claim of it comes back when its visibility ends)"
                );
                Parked::Failed
            }
        }
    }
}

/// `park.lua`'s keys, in its order.
pub(crate) fn park_keys(keys: &Keys) -> [&str; 5] {
    [
        &keys.msg,
        &keys.dead,
        &keys.reason,
        &keys.inflight,
        &keys.lease,
    ]
}

/// `park.lua`'s ARGV: the id, its stored value, why, the claim's token
/// (`''` after a take).
pub(crate) fn park_args(id: &str, value: &[u8], token: Option<&str>, reason: &str) -> [Vec<u8>; 4] {
    [
        id.as_bytes().to_vec(),
        value.to_vec(),
        format!("could not decode: {reason}").into_bytes(),
        token.unwrap_or("").as_bytes().to_vec(),
    ]
}

/// What became of an undecodable message.
pub(crate) enum Parked {
    /// It is a dead letter now.
    Yes,
    /// Not ours to park: another claim holds it, or (after a take) its id
    /// was offered again.
    NotOurs,
    /// Redis failed.
    Failed,
}
