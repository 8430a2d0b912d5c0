//! At-least-once consumption: claims with a visibility deadline, acks,
//! nacks, dead letters, and a queue's counts.
//!
//! [`Queue::claim`] hands a message over without deleting it: it moves to
//! the in-flight set under a visibility deadline (server clock) and a token
//! of its own, in the same atomic step that takes it off the ready list, so
//! no crash at any instant loses it. [`Delivery::ack`] deletes it; a claim
//! that is neither acked nor given back ([`Delivery::nack`]) in time is
//! delivered again by the queue's transfer job (this process's, or any other
//! process's that has the queue open), with its attempt count raised, until
//! `max_deliveries` is reached and it goes to the dead letters.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::state::Keys;
use super::{Codec, MessageId, Queue, parse_stored, split_stored};
use crate::error::{Access, Error, ErrorKind};
use crate::runtime::{Deadline, Runtime, random_u64};
use crate::scripts::{self, CLAIM_BATCH_MAX};
use crate::telemetry::{self, QueueMetrics};

/// A claimed message: delivered at least once; [`ack`](Delivery::ack) it
/// when done with it.
///
/// Until it is acked, given back ([`nack`](Delivery::nack)) or its
/// visibility ends, no other consumer gets it. After the visibility ends it
/// is delivered again, and this delivery's `ack`, `nack` and `extend` fail
/// with [`ErrorKind::StaleDelivery`]: they never touch the new delivery.
pub struct Delivery<T> {
    queue: Queue<T>,
    id: MessageId,
    payload: T,
    due_ms: u64,
    attempt: u32,
    token: String,
    /// The visibility deadline, epoch ms on the server's clock.
    visible_until_ms: AtomicU64,
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

    fn stale(&self, what: &str) -> Error {
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
                scripts::ACK
                    .key(&keys.inflight)
                    .key(&keys.lease)
                    .key(&keys.msg)
                    .key(&keys.attempts)
                    .arg(self.id.as_str())
                    .arg(&self.token)
                    .invoke(con)
            })
            .map_err(|e| self.queue.tag(e).for_message(self.id.as_str()))?;
        if n < 0 {
            return Err(self.stale("ack"));
        }
        if n == 1 {
            // Not a repeated ack of a message already gone.
            self.queue.state.metrics.acked.add(1);
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
        let delay_ms = u64::try_from(retry_delay.as_millis()).unwrap_or(u64::MAX);
        let delay_ms = delay_ms.min(self.queue.delay_limit());
        self.queue
            .nack_claim(self.id.as_str(), &self.token, delay_ms, why)
            .map_err(|e| self.queue.tag(e).for_message(self.id.as_str()))?
            .ok_or_else(|| self.stale("nack"))
    }

    /// Still working on it: no other consumer gets it for `visibility` from
    /// now (server clock). Fails with [`ErrorKind::StaleDelivery`] if the
    /// visibility already ended (it is never revived).
    pub fn extend(&self, visibility: Duration) -> Result<(), Error> {
        let keys = &self.queue.state.keys;
        let ms = visibility.as_millis().clamp(1, u128::from(u32::MAX)) as u64;
        let _span = telemetry::queue_op("extend", &self.queue.state.name, 1);
        let deadline: i64 = self
            .queue
            .rt()
            .run(&keys.inflight, Access::Write, |con| {
                scripts::EXTEND
                    .key(&keys.inflight)
                    .key(&keys.lease)
                    .arg(self.id.as_str())
                    .arg(&self.token)
                    .arg(ms)
                    .invoke(con)
            })
            .map_err(|e| self.queue.tag(e).for_message(self.id.as_str()))?;
        if deadline < 0 {
            return Err(self.stale("extend"));
        }
        self.visible_until_ms
            .store(deadline as u64, Ordering::Relaxed);
        self.queue.announce_deadline(visibility);
        Ok(())
    }
}

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

/// How many messages a queue holds in each state, and how it is keeping up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueueStats {
    /// Not yet due.
    pub delayed: u64,
    /// Due, waiting for a consumer (may count ids removed after they fell
    /// due, until a consumer skips them).
    pub ready: u64,
    /// Claimed and not yet acked.
    pub in_flight: u64,
    /// Dead letters.
    pub dead: u64,
    /// How long the oldest message that is due but not yet handed to a
    /// consumer has been due; `None` if none is.
    pub oldest_overdue: Option<Duration>,
    /// When the next delayed message falls due (Redis clock), if any.
    pub next_due: Option<SystemTime>,
}

/// Claimed deliveries (or the decode errors of messages moved to the dead
/// letters), and how many acks sent along were refused.
pub(crate) type Claims<T> = (Vec<Result<Delivery<T>, Error>>, u64);

/// 64 random bits per process, then a counter: claim tokens no two claims
/// share.
fn token_prefix() -> String {
    use std::sync::OnceLock;
    static SEED: OnceLock<u64> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let seed = *SEED.get_or_init(random_u64);
    format!("{seed:x}.{:x}", COUNTER.fetch_add(1, Ordering::Relaxed))
}

impl<T: Codec> Queue<T> {
    /// Runs `nack.lua` for the claim `token` of message `id`: back in
    /// `delay_ms` (server clock), or dead at `max_deliveries`, with the
    /// counters to match. `None`: the claim is no longer current (stale).
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
        Ok(count_nack(&self.state.metrics, n))
    }

    /// Waits up to `wait` for a due message and claims it: at-least-once
    /// delivery. `Ok(None)` if none came.
    ///
    /// The message stays in Redis, hidden from other consumers for the
    /// queue handle's visibility (`QueueOptions::visibility`, default 30 s);
    /// [`ack`](Delivery::ack) it when done, [`nack`](Delivery::nack) it to
    /// have it retried, [`extend`](Delivery::extend) it for a long job. If
    /// none of those happens in time (the consumer died or hung), it is
    /// delivered again. Use [`take`](Queue::take) when losing a message to a
    /// crash is acceptable and one round trip matters; use this (or
    /// [`consume`](Queue::consume)) otherwise.
    ///
    /// Blocks like `take` (woken when a message lands, not by polling). A
    /// payload that cannot be decoded is moved to the dead letters with the
    /// decode error, and this returns [`ErrorKind::Decode`] naming it.
    pub fn claim(&self, wait: Duration) -> Result<Option<Delivery<T>>, Error> {
        let mut batch = self.claim_some(1, wait)?;
        match batch.pop() {
            Some(Ok(d)) => Ok(Some(d)),
            Some(Err(e)) => Err(e),
            None => Ok(None),
        }
    }

    /// As [`claim`](Queue::claim), up to `n` messages (1 ..= 1,000) in one
    /// round trip, for consumers that work in batches. Waits up to `wait`
    /// for the first; returns what was ready then (possibly fewer than `n`,
    /// never an empty vector unless none came). Undecodable payloads are
    /// moved to the dead letters and left out (logged).
    pub fn claim_batch(&self, n: usize, wait: Duration) -> Result<Vec<Delivery<T>>, Error> {
        if n == 0 || n > CLAIM_BATCH_MAX {
            return Err(self.tag(Error::new(
                ErrorKind::InvalidOption,
                format!("claim_batch of {n}: not in 1..={CLAIM_BATCH_MAX}"),
            )));
        }
        Ok(self
            .claim_some(n, wait)?
            .into_iter()
            .filter_map(Result::ok)
            .collect())
    }

    fn claim_some(
        &self,
        n: usize,
        wait: Duration,
    ) -> Result<Vec<Result<Delivery<T>, Error>>, Error> {
        Ok(self.claim_acking(&[], n, wait)?.0)
    }

    /// Acks `acks` (id, token pairs of finished claims) and claims up to `n`
    /// in the same script call (one round trip when a message is ready),
    /// then waits up to `wait` if none was. Returns the claims and how many
    /// of the acks were refused (their claim was no longer current).
    pub(crate) fn claim_acking(
        &self,
        acks: &[(String, String)],
        n: usize,
        wait: Duration,
    ) -> Result<Claims<T>, Error> {
        let keys = &self.state.keys;
        let key_list = [
            keys.ready.as_str(),
            keys.msg.as_str(),
            keys.inflight.as_str(),
            keys.lease.as_str(),
            keys.attempts.as_str(),
            keys.counts.as_str(),
            keys.stale.as_str(),
        ];
        let visibility_ms = self.visibility.as_millis().clamp(1, u128::from(u32::MAX)) as u64;
        let prefix = token_prefix();
        let vis = visibility_ms.to_string();
        let count = n.to_string();
        let mut stale = 0;
        if !acks.is_empty() {
            // Ack and try a claim at once: no wait on this first call.
            let ack_count = acks.len().to_string();
            let mut args: Vec<&[u8]> = vec![
                vis.as_bytes(),
                prefix.as_bytes(),
                count.as_bytes(),
                ack_count.as_bytes(),
            ];
            for (id, token) in acks {
                args.push(id.as_bytes());
                args.push(token.as_bytes());
            }
            let span = telemetry::queue_op("claim", &self.state.name, n + acks.len());
            let reply: redis::Value = self
                .rt()
                .run(&keys.ready, Access::Write, |con| {
                    let mut inv = scripts::CLAIM.prepare_invoke();
                    for k in key_list {
                        inv.key(k);
                    }
                    for a in &args {
                        inv.arg(*a);
                    }
                    inv.invoke(con)
                })
                .map_err(|e| self.tag(e))?;
            drop(span);
            let (claims, refused) = self.read_claims(reply)?;
            stale = refused;
            self.state
                .metrics
                .acked
                .add((acks.len() as u64).saturating_sub(refused));
            if !claims.is_empty() || wait.is_zero() {
                return Ok((claims, stale));
            }
        }
        let popped = self.wait_pop(
            Instant::now().checked_add(wait),
            ("claim", n),
            &scripts::CLAIM,
            &key_list,
            &[vis.as_bytes(), prefix.as_bytes(), count.as_bytes(), b"0"],
            2,
        )?;
        match popped {
            Some(reply) => Ok((self.read_claims(reply)?.0, stale)),
            None => Ok((Vec::new(), stale)),
        }
    }

    /// Reads claim.lua's reply: the deliveries (or the decode errors of
    /// the messages moved to the dead letters) and the refused acks.
    fn read_claims(&self, reply: redis::Value) -> Result<Claims<T>, Error> {
        let protocol = |what: &str| {
            self.tag(Error::new(
                ErrorKind::Protocol,
                format!("unexpected reply to claim.lua: {what}"),
            ))
        };
        let redis::Value::Array(items) = reply else {
            return Err(protocol("not an array"));
        };
        let mut items = items.into_iter();
        let deadline: u64 = items
            .next()
            .and_then(|v| redis::from_redis_value(v).ok())
            .ok_or_else(|| protocol("no deadline"))?;
        let stale: u64 = items
            .next()
            .and_then(|v| redis::from_redis_value(v).ok())
            .ok_or_else(|| protocol("no count of refused acks"))?;
        let mut out = Vec::new();
        while let Some(id) = items.next() {
            let (Some(value), Some(attempt), Some(token)) =
                (items.next(), items.next(), items.next())
            else {
                return Err(protocol("a truncated entry"));
            };
            let id: String = redis::from_redis_value(id).map_err(|_| protocol("an id"))?;
            let stored: Vec<u8> =
                redis::from_redis_value(value).map_err(|_| protocol("a value"))?;
            let attempt: u32 =
                redis::from_redis_value(attempt).map_err(|_| protocol("an attempt"))?;
            let token: String = redis::from_redis_value(token).map_err(|_| protocol("a token"))?;
            match parse_stored::<T>(&stored) {
                Ok((due_ms, payload)) => out.push(Ok(Delivery {
                    queue: self.clone(),
                    id: MessageId(id),
                    payload,
                    due_ms,
                    attempt,
                    token,
                    visible_until_ms: AtomicU64::new(deadline),
                })),
                Err(cause) => out.push(Err(self.dead_on_arrival(&id, &stored, cause))),
            }
        }
        let rt = self.rt();
        self.state.metrics.delivered(
            out.iter()
                .filter_map(|d| d.as_ref().ok())
                .map(|d| (d.attempt, d.due_ms)),
            || rt.server_now_ms(),
        );
        if !out.is_empty() {
            // This process's transfer job looks at the in-flight set when
            // the visibility ends (other processes learn of it at their
            // sweep).
            self.announce_deadline(self.visibility);
        }
        Ok((out, stale))
    }

    /// Makes this process's transfer job look at the queue after `d`.
    pub(crate) fn announce_deadline(&self, d: Duration) {
        self.rt().driver.announce(
            &self.state.job_key,
            Deadline::After(d + Duration::from_millis(1)),
        );
    }

    /// The oldest dead letters, at most `limit`: messages that reached
    /// `max_deliveries` or could not be decoded, with why.
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

    /// How many messages are in each state, in one atomic read, and how
    /// delivery is keeping up.
    pub fn stats(&self) -> Result<QueueStats, Error> {
        let span = telemetry::queue_op("stats", &self.state.name, 0);
        let (stats, _now) = read_stats(self.rt(), &self.state.keys).map_err(|e| self.tag(e))?;
        drop(span);
        self.state.metrics.backlog(
            stats.delayed,
            stats.ready,
            stats.in_flight,
            stats.dead,
            stats.oldest_overdue,
        );
        Ok(stats)
    }
}

/// `nack.lua`'s keys, in its order (ARGV: id, token, delay ms,
/// max_deliveries, why). Every sender of the script takes them from here.
pub(crate) fn nack_keys(keys: &Keys) -> [&str; 8] {
    [
        &keys.inflight,
        &keys.lease,
        &keys.msg,
        &keys.attempts,
        &keys.delayed,
        &keys.dead,
        &keys.reason,
        &keys.wake,
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

/// Runs `stats.lua` on a queue's keys: its counts, and the server's time
/// (epoch ms) at the instant they were read. Shared by [`Queue::stats`]
/// and the operators' inspector, which reads without opening the queue.
pub(crate) fn read_stats(rt: &Runtime, keys: &Keys) -> Result<(QueueStats, u64), Error> {
    let (delayed, ready, in_flight, dead, overdue, next_due, now): (
        u64,
        u64,
        u64,
        u64,
        i64,
        i64,
        u64,
    ) = rt.run(&keys.delayed, Access::Read, |con| {
        scripts::STATS
            .key(&keys.delayed)
            .key(&keys.ready)
            .key(&keys.inflight)
            .key(&keys.dead)
            .key(&keys.msg)
            .invoke(con)
    })?;
    let stats = QueueStats {
        delayed,
        ready,
        in_flight,
        dead,
        oldest_overdue: (overdue >= 0).then(|| Duration::from_millis(overdue as u64)),
        next_due: (next_due >= 0).then(|| UNIX_EPOCH + Duration::from_millis(next_due as u64)),
    };
    Ok((stats, now))
}
