//! At-least-once consumption, the claiming side: [`Queue::claim`] and
//! [`Queue::claim_batch`] (claim.lua, which can carry the acks of finished
//! claims in the same call), and the reading of its reply into
//! deliveries. Every claim call is a request (`queue/request.rs`): one whose
//! reply was lost is sent again and answered with what the lost one did,
//! so no message is claimed for nobody and no attempt is counted twice.

use std::sync::atomic::{AtomicBool, AtomicU64};
use std::time::{Duration, Instant};

use super::codec::{Codec, CodecError};
use super::delivery::Delivery;
use super::handle::Queue;
use super::keys::Keys;
use super::message::MessageId;
use super::pop::Unresolved;
use super::request::Request;
use super::stored::parse_stored;
use crate::error::{Access, Error, ErrorKind};
use crate::runtime::Backoff;
use crate::scripts::{self, CLAIM_BATCH_MAX};
use crate::telemetry;

/// What one claim call did: the deliveries (or the decode errors of
/// messages moved to the dead letters), and of the acks sent along, how
/// many were refused (their claim was no longer current) and how many
/// deleted their message (the rest found it gone already).
pub(crate) struct Claims<T> {
    pub(crate) deliveries: Vec<Result<Delivery<T>, Error>>,
    pub(crate) refused: u64,
    pub(crate) acked: u64,
}

/// The shortest time one attempt of an ack-and-claim call waits for its
/// reply before it is sent again (see [`Queue::claim_acking`]).
const MIN_ATTEMPT: Duration = Duration::from_millis(100);

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
    /// Blocks like `take` (woken when a message lands, not by polling), and
    /// like [`poll`](Queue::poll) returns within `wait` plus one
    /// `command_timeout` whatever Redis does meanwhile (`OutcomeUnknown`
    /// if a claim whose reply was lost could not be asked about again by
    /// then); a `wait` too long to be a point in time waits until a
    /// message comes. A
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
        Ok(self.claim_acking(&[], n, (wait, None))?.deliveries)
    }

    /// Acks `acks` (id, token pairs of finished claims) and claims up to `n`
    /// in the same script call (one round trip when a message is ready),
    /// then waits up to `wait` if none was (less if `stop` is set
    /// meanwhile: a pool that shuts down).
    ///
    /// The call with acks goes through the command pool; each attempt
    /// waits for its reply at most a third of the visibility (at least
    /// 100 ms, at most `command_timeout`), so that a reply that is late or
    /// lost is asked for again while the claims it made are still
    /// current, and the answer (from the reply record) restarts their
    /// visibility.
    pub(crate) fn claim_acking(
        &self,
        acks: &[(String, String)],
        n: usize,
        (wait, stop): (Duration, Option<&AtomicBool>),
    ) -> Result<Claims<T>, Error> {
        let keys = &self.state.keys;
        let mut req = Request::new(keys);
        let record = req.key.clone();
        let key_list = claim_keys(keys, &record);
        let vis = self.claim_visibility();
        let count = n.to_string();
        let (mut refused, mut acked) = (0, 0);
        if !acks.is_empty() {
            // Ack and try a claim at once: no wait on this first call.
            let ack_count = acks.len().to_string();
            let mut args: Vec<&[u8]> = vec![
                vis.as_bytes(),
                req.token.as_bytes(),
                count.as_bytes(),
                req.seq_arg.as_bytes(),
                req.ttl_arg.as_bytes(),
                ack_count.as_bytes(),
            ];
            for (id, token) in acks {
                args.push(id.as_bytes());
                args.push(token.as_bytes());
            }
            let span = telemetry::queue_op("claim", &self.state.name, n + acks.len());
            let reply = self.claim_resending(&key_list, &args)?;
            drop(span);
            self.count_expired(&reply);
            let got = self.read_claims(reply)?;
            self.state.metrics.acked.add(got.acked);
            // In-flight slots freed: a claim of this process held back by
            // max_in_flight looks again.
            self.state.gate.slot_freed();
            if !got.deliveries.is_empty() || wait.is_zero() {
                return Ok(got);
            }
            (refused, acked) = (got.refused, got.acked);
            req.next();
        }
        let popped = self.wait_pop(
            (Instant::now().checked_add(wait), stop),
            ("claim", n),
            &scripts::CLAIM,
            (&key_list, CLAIM_PLAIN_KEYS),
            &claim_args(&vis, &req, &count),
            5,
        )?;
        let deliveries = match popped {
            Some(reply) => self.read_claims(reply)?.deliveries,
            None => Vec::new(),
        };
        Ok(Claims {
            deliveries,
            refused,
            acked,
        })
    }

    /// Runs claim.lua with `args` on the command pool until Redis answers:
    /// an attempt whose reply was lost (or late) is sent again, and the
    /// answer is what it did. Fails with [`ErrorKind::OutcomeUnknown`] at
    /// shutdown or when Redis cannot be asked for five minutes, with
    /// another error when nothing was sent.
    fn claim_resending(&self, keys: &[&str], args: &[&[u8]]) -> Result<redis::Value, Error> {
        let rt = self.rt();
        let full = rt.options.command_timeout;
        let attempt = (self.visibility / 3).clamp(MIN_ATTEMPT, full.max(MIN_ATTEMPT));
        let mut unresolved = Unresolved::default();
        let mut backoff = Backoff::new(rt.options.reconnect_min, rt.options.reconnect_max);
        loop {
            let r = rt.run(&self.state.keys.ready, Access::Write, |con| {
                let shortened = attempt < full;
                if shortened {
                    con.set_io_timeout(attempt)?;
                }
                let mut inv = scripts::CLAIM.prepare_invoke();
                for k in self.pop_keys(keys, CLAIM_PLAIN_KEYS) {
                    inv.key(*k);
                }
                for a in args {
                    inv.arg(*a);
                }
                let v: redis::Value = inv.invoke(con)?;
                if shortened {
                    con.set_io_timeout(full)?;
                }
                Ok(v)
            });
            let e = match r {
                Ok(v) if self.needs_all_keys(super::pop::header_int_of(&v)) => {
                    // The queue has controls: nothing was done; the same
                    // request again, with every key.
                    unresolved.resolved();
                    continue;
                }
                Ok(v) => return Ok(v),
                Err(e) if e.is_outcome_unknown() => {
                    unresolved.lost();
                    e
                }
                Err(e) if e.is_transient() && unresolved.pending() => e,
                Err(e) if unresolved.pending() => {
                    return Err(self.tag(unresolved.outcome_unknown("claim", Some(e))));
                }
                Err(e) => return Err(self.tag(e)),
            };
            if rt.is_shut_down() || unresolved.too_old() {
                return Err(self.tag(unresolved.outcome_unknown("claim", Some(e))));
            }
            tracing::debug!(target: "redwheel::queue", queue = %self.state.name, error = %e, "claim: the reply was lost; asking again");
            rt.topology_may_have_changed();
            std::thread::sleep(backoff.step());
        }
    }

    /// `claim.lua`'s visibility argument (ms).
    pub(super) fn claim_visibility(&self) -> String {
        let visibility_ms = self.visibility.as_millis().clamp(1, u128::from(u32::MAX)) as u64;
        visibility_ms.to_string()
    }

    /// Reads claim.lua's reply: the deliveries (or the decode errors of
    /// the messages moved to the dead letters) and the counts of the acks.
    fn read_claims(&self, reply: redis::Value) -> Result<Claims<T>, Error> {
        let raw = self.read_claims_raw(reply)?;
        let deliveries = raw
            .deliveries
            .into_iter()
            .map(|c| c.map_err(|u| self.dead_on_arrival(&u.id, &u.stored, Some(&u.token), u.cause)))
            .collect();
        Ok(Claims {
            deliveries,
            refused: raw.refused,
            acked: raw.acked,
        })
    }

    /// Reads claim.lua's reply, leaving undecodable messages for the
    /// caller to park (shared with the async claim).
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
        // The gate and the messages found past their ttl (counted by
        // `count_expired`).
        let (Some(_gate), Some(_expired)) = (items.next(), items.next()) else {
            return Err(protocol("no header"));
        };
        let deadline: u64 = items
            .next()
            .and_then(|v| redis::from_redis_value(v).ok())
            .ok_or_else(|| protocol("no deadline"))?;
        let refused: u64 = items
            .next()
            .and_then(|v| redis::from_redis_value(v).ok())
            .ok_or_else(|| protocol("no count of refused acks"))?;
        let acked: u64 = items
            .next()
            .and_then(|v| redis::from_redis_value(v).ok())
            .ok_or_else(|| protocol("no count of acks"))?;
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
            out.push(self.claimed(id, stored, attempt, token, deadline));
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
        Ok(RawClaims {
            deliveries: out,
            refused,
            acked,
        })
    }
}

impl<T: Codec> Queue<T> {
    /// A claimed message as a delivery visible until `deadline` (epoch
    /// ms), or, if its stored value does not decode, what parking it
    /// needs.
    pub(super) fn claimed(
        &self,
        id: String,
        stored: Vec<u8>,
        attempt: u32,
        token: String,
        deadline: u64,
    ) -> Result<Delivery<T>, Undecodable> {
        match parse_stored::<T>(&stored) {
            Ok((due_ms, payload)) => Ok(Delivery {
                queue: self.clone(),
                id: MessageId(id),
                payload,
                due_ms,
                attempt,
                token,
                visible_until_ms: AtomicU64::new(deadline),
                #[cfg(feature = "async")]
                held: None,
            }),
            Err(cause) => Err(Undecodable {
                id,
                stored,
                token,
                cause,
            }),
        }
    }
}

/// As [`Claims`], with the undecodable messages not yet parked.
pub(crate) struct RawClaims<T> {
    pub(crate) deliveries: Vec<Result<Delivery<T>, Undecodable>>,
    pub(crate) refused: u64,
    pub(crate) acked: u64,
}

/// A claimed message whose payload did not decode.
pub(crate) struct Undecodable {
    pub(crate) id: String,
    pub(crate) stored: Vec<u8>,
    pub(crate) token: String,
    pub(crate) cause: CodecError,
}

/// `claim.lua`'s ARGV for a claim of `count` with no acks: visibility (ms),
/// the request's token prefix, the count, the request number, the record's
/// TTL, no acks.
pub(super) fn claim_args<'a>(vis: &'a str, req: &'a Request, count: &'a str) -> [&'a [u8]; 6] {
    [
        vis.as_bytes(),
        req.token.as_bytes(),
        count.as_bytes(),
        req.seq_arg.as_bytes(),
        req.ttl_arg.as_bytes(),
        b"0",
    ]
}

/// How many of `claim.lua`'s keys a queue without controls needs (its
/// first nine and the controls hash, whose presence sends the caller back
/// for all of them).
pub(super) const CLAIM_PLAIN_KEYS: usize = 10;

/// `claim.lua`'s keys, in its order, with the request's reply record.
pub(super) fn claim_keys<'a>(keys: &'a Keys, record: &'a str) -> [&'a str; 17] {
    [
        &keys.ready,
        &keys.msg,
        &keys.inflight,
        &keys.lease,
        &keys.attempts,
        &keys.counts,
        &keys.stale,
        record,
        &keys.head,
        &keys.controls,
        &keys.prioritized,
        &keys.priority,
        &keys.expires,
        &keys.rate,
        &keys.dead,
        &keys.reason,
        &keys.wake,
    ]
}
