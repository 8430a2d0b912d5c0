//! At-least-once consumption, the claiming side: [`Queue::claim`] and
//! [`Queue::claim_batch`] (claim.lua, which can carry the acks of finished
//! claims in the same call), and the reading of its reply into
//! deliveries.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::codec::{Codec, CodecError};
use super::delivery::Delivery;
use super::handle::Queue;
use super::keys::Keys;
use super::message::MessageId;
use super::stored::parse_stored;
use crate::error::{Access, Error, ErrorKind};
use crate::runtime::random_u64;
use crate::scripts::{self, CLAIM_BATCH_MAX};
use crate::telemetry;

/// Claimed deliveries (or the decode errors of messages moved to the dead
/// letters), and how many acks sent along were refused.
pub(crate) type Claims<T> = (Vec<Result<Delivery<T>, Error>>, u64);

/// As [`Claims`], undecodable messages as (id, stored value, decode error).
pub(crate) type RawClaims<T> = (Vec<Result<Delivery<T>, (String, Vec<u8>, CodecError)>>, u64);

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
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use redwheel::{ErrorKind, Redwheel};
    ///
    /// let rw = Redwheel::connect("redis://127.0.0.1:6379")?;
    /// let q = rw.queue::<String>("emails")?;
    /// if let Some(d) = q.claim(Duration::from_secs(1))? {
    ///     match send(d.payload()) {
    ///         Ok(()) => d.ack()?,
    ///         Err(_) => {
    ///             d.nack(Duration::from_secs(30))?; // again in 30 s, or a dead letter
    ///         }
    ///     }
    /// }
    /// # fn send(_: &str) -> Result<(), ()> { Ok(()) }
    /// # let _ = ErrorKind::StaleDelivery;
    /// # Ok::<(), redwheel::Error>(())
    /// ```
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
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use redwheel::Redwheel;
    ///
    /// let rw = Redwheel::connect("redis://127.0.0.1:6379")?;
    /// let q = rw.queue::<String>("events")?;
    /// let batch = q.claim_batch(100, Duration::from_secs(1))?;
    /// for d in &batch {
    ///     // … store d.payload() …
    ///     d.ack()?;
    /// }
    /// # Ok::<(), redwheel::Error>(())
    /// ```
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
        let key_list = claim_keys(keys);
        let [vis, prefix, count] = self.claim_args(n);
        let mut refused_acks = 0;
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
            refused_acks = refused;
            self.state
                .metrics
                .acked
                .add((acks.len() as u64).saturating_sub(refused));
            if !claims.is_empty() || wait.is_zero() {
                return Ok((claims, refused_acks));
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
            Some(reply) => Ok((self.read_claims(reply)?.0, refused_acks)),
            None => Ok((Vec::new(), refused_acks)),
        }
    }

    /// `claim.lua`'s first ARGV for a claim of up to `n`: the visibility
    /// (ms), a fresh token prefix, the count.
    pub(super) fn claim_args(&self, n: usize) -> [String; 3] {
        let visibility_ms = self.visibility.as_millis().clamp(1, u128::from(u32::MAX)) as u64;
        [visibility_ms.to_string(), token_prefix(), n.to_string()]
    }

    /// Reads claim.lua's reply: the deliveries (or the decode errors of
    /// the messages moved to the dead letters) and the refused acks.
    pub(super) fn read_claims(&self, reply: redis::Value) -> Result<Claims<T>, Error> {
        let (claims, refused) = self.read_claims_raw(reply)?;
        let claims = claims
            .into_iter()
            .map(|c| c.map_err(|(id, stored, cause)| self.dead_on_arrival(&id, &stored, cause)))
            .collect();
        Ok((claims, refused))
    }

    /// Reads claim.lua's reply, leaving undecodable messages (id, stored
    /// value, decode error) for the caller to park (shared with the async
    /// claim).
    pub(super) fn read_claims_raw(&self, reply: redis::Value) -> Result<RawClaims<T>, Error> {
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
        let refused: u64 = items
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
                    #[cfg(feature = "async")]
                    held: None,
                })),
                Err(cause) => out.push(Err((id, stored, cause))),
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
        Ok((out, refused))
    }
}

/// `claim.lua`'s keys, in its order.
pub(super) fn claim_keys(keys: &Keys) -> [&str; 7] {
    [
        &keys.ready,
        &keys.msg,
        &keys.inflight,
        &keys.lease,
        &keys.attempts,
        &keys.counts,
        &keys.stale,
    ]
}
