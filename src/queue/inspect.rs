//! Read-only inspection of queues for operators (the `redwheel` command-line
//! tool): finding queues, their counts, the messages in each state, the
//! delivery counter and how long the ready messages have waited.
//!
//! Unlike [`Redwheel::queue`], nothing here opens a queue: no transfer job
//! is registered, so inspecting a queue never moves, redelivers or kills a
//! message (a transfer run by the inspecting process would apply its own
//! `max_deliveries`). Every key name comes from the queue's `Keys` (in
//! `keys.rs`), the one home of the layout.

use std::collections::BTreeSet;

use super::keys::{Keys, validate_name};
use super::limits::{QueueLimits, read_limits};
use super::stats::QueueStats;
use super::stats::read_stats;
use super::stored::split_stored;
use crate::error::{Access, Error};
use crate::runtime::Redwheel;

/// Per id: the stored value, the attempt count and the death reason.
type Details = (Vec<Option<Vec<u8>>>, Vec<Option<u32>>, Vec<Option<String>>);

/// A message state, for [`QueueInspector::peek`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum MessageState {
    /// Not yet due (`delayed`), earliest due first.
    Delayed,
    /// Due, waiting for a consumer (`prioritized` by priority, then
    /// `ready`), in delivery order.
    Ready,
    /// Claimed and not yet acked (`inflight`), earliest visibility deadline first.
    InFlight,
    /// Dead letters (`dead`), oldest first.
    Dead,
}

/// One message as [`QueueInspector::peek`] found it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PeekedMessage {
    /// Its id.
    pub id: String,
    /// When it is (or was) due, epoch ms on the Redis clock; `None` if its
    /// stored value is gone (removed between the two reads) or malformed.
    pub due_ms: Option<u64>,
    /// The payload bytes as stored; `None` if the message is gone.
    pub payload: Option<Vec<u8>>,
    /// Deliveries so far (0 if never claimed).
    pub attempts: u32,
    /// In flight: the visibility deadline; dead: when it died (epoch ms).
    pub since_ms: Option<u64>,
    /// Dead letters: why it died.
    pub reason: Option<String>,
}

/// The counters that the take and claim scripts keep per queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct QueueCounters {
    /// Messages handed to consumers so far (by `take` and `claim`).
    pub delivered: u64,
}

/// How long the messages at the head of the ready list have been due.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReadyAges {
    /// The Redis server's clock when they were read, epoch ms.
    pub now_ms: u64,
    /// How long each sampled ready message has been due, in ms, in list
    /// order (the head first); ids removed after they fell due are left out.
    pub ages_ms: Vec<u64>,
}

/// Read-only access to one queue's keys, made by
/// [`Redwheel::inspect_queue`]. Used by the `redwheel` command-line tool;
/// not needed by applications.
#[derive(Debug, Clone)]
pub struct QueueInspector {
    rw: Redwheel,
    name: String,
    keys: Keys,
}

impl Redwheel {
    /// Read-only access to queue `name`, without opening it (no transfer
    /// job runs). Fails with [`crate::ErrorKind::InvalidName`] for a name that
    /// `queue` would refuse.
    ///
    /// ```no_run
    /// use redwheel::Redwheel;
    /// use redwheel::queue::inspect::MessageState;
    ///
    /// let rw = Redwheel::connect("redis://127.0.0.1:6379")?;
    /// for name in rw.find_queues()? {
    ///     let q = rw.inspect_queue(&name)?;
    ///     let s = q.stats()?;
    ///     println!("{name}: {} ready, {} dead", s.ready, s.dead);
    ///     for m in q.peek(MessageState::Dead, 3)? {
    ///         println!("  {m:?}");
    ///     }
    /// }
    /// # Ok::<(), redwheel::Error>(())
    /// ```
    pub fn inspect_queue(&self, name: &str) -> Result<QueueInspector, Error> {
        validate_name(name)?;
        Ok(QueueInspector {
            rw: self.clone(),
            name: name.to_owned(),
            keys: Keys::new(name),
        })
    }

    /// The names of every queue with at least one key in Redis (on a
    /// cluster, on any master), sorted. Runs `SCAN` over the whole
    /// keyspace: meant for operators, not for a hot path.
    pub fn find_queues(&self) -> Result<Vec<String>, Error> {
        let found = self.runtime().scan_masters(&Keys::scan_pattern())?;
        let names: BTreeSet<String> = found
            .iter()
            .filter_map(|key| Keys::queue_of(key).map(str::to_owned))
            .collect();
        Ok(names.into_iter().collect())
    }
}

impl QueueInspector {
    /// The queue's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    fn tag(&self, e: Error) -> Error {
        e.in_queue(&self.name)
    }

    /// True if any key of the queue exists (messages, dead letters, its
    /// delivery counter, its controls or its schedules): false for a queue
    /// never used, or one whose keys were all deleted.
    pub fn exists(&self) -> Result<bool, Error> {
        let k = &self.keys;
        let n: u64 = self
            .rw
            .runtime()
            .run(&k.delayed, Access::Read, |con| {
                redis::cmd("EXISTS")
                    .arg(&k.delayed)
                    .arg(&k.msg)
                    .arg(&k.ready)
                    .arg(&k.inflight)
                    .arg(&k.dead)
                    .arg(&k.counts)
                    .arg(&k.prioritized)
                    .arg(&k.controls)
                    .arg(&k.schedules)
                    .query(con)
            })
            .map_err(|e| self.tag(e))?;
        Ok(n > 0)
    }

    /// The queue's counts, as [`Queue::stats`](super::Queue::stats) reads
    /// them (the same script).
    pub fn stats(&self) -> Result<QueueStats, Error> {
        self.stats_at().map(|(stats, _)| stats)
    }

    /// As [`stats`](QueueInspector::stats), with the Redis server's clock
    /// (epoch ms) at the instant they were read.
    pub fn stats_at(&self) -> Result<(QueueStats, u64), Error> {
        read_stats(self.rw.runtime(), &self.keys).map_err(|e| self.tag(e))
    }

    /// The queue's controls (pause, rate limit, max in flight, max length)
    /// as stored in Redis, as [`Queue::limits`](super::Queue::limits) reads
    /// them.
    pub fn limits(&self) -> Result<QueueLimits, Error> {
        read_limits(self.rw.runtime(), &self.keys).map_err(|e| self.tag(e))
    }

    /// The delivery counter kept by the take and claim scripts.
    pub fn counters(&self) -> Result<QueueCounters, Error> {
        let k = &self.keys;
        let delivered: Option<u64> = self
            .rw
            .runtime()
            .run(&k.counts, Access::Read, |con| {
                redis::cmd("HGET")
                    .arg(&k.counts)
                    .arg("delivered")
                    .query(con)
            })
            .map_err(|e| self.tag(e))?;
        Ok(QueueCounters {
            delivered: delivered.unwrap_or(0),
        })
    }

    /// The first `n` messages in `state` (see [`MessageState`] for the
    /// order), with their stored values. Two reads (the ids, then their
    /// values), not one atomic snapshot: a message that moved or was
    /// deleted in between shows with `payload: None`.
    pub fn peek(&self, state: MessageState, n: usize) -> Result<Vec<PeekedMessage>, Error> {
        if n == 0 {
            return Ok(Vec::new());
        }
        let k = &self.keys;
        let stop = i64::try_from(n).unwrap_or(i64::MAX) - 1;
        let listed: Vec<(String, Option<u64>)> = self
            .rw
            .runtime()
            .run(&k.delayed, Access::Read, |con| match state {
                MessageState::Ready => {
                    let (pri, ids): (Vec<String>, Vec<String>) = redis::pipe()
                        .cmd("ZRANGE")
                        .arg(&k.prioritized)
                        .arg(0)
                        .arg(stop)
                        .cmd("LRANGE")
                        .arg(&k.ready)
                        .arg(0)
                        .arg(stop)
                        .query(con)?;
                    Ok(ready_order(pri, ids, n))
                }
                MessageState::Delayed | MessageState::InFlight | MessageState::Dead => {
                    let key = match state {
                        MessageState::Delayed => &k.delayed,
                        MessageState::InFlight => &k.inflight,
                        _ => &k.dead,
                    };
                    let pairs: Vec<(String, f64)> = redis::cmd("ZRANGE")
                        .arg(key)
                        .arg(0)
                        .arg(stop)
                        .arg("WITHSCORES")
                        .query(con)?;
                    Ok(pairs
                        .into_iter()
                        .map(|(id, score)| (id, Some(score.max(0.0) as u64)))
                        .collect())
                }
            })
            .map_err(|e| self.tag(e))?;
        if listed.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<&str> = listed.iter().map(|(id, _)| id.as_str()).collect();
        let (values, attempts, reasons): Details = self
            .rw
            .runtime()
            .run(&k.msg, Access::Read, |con| {
                redis::pipe()
                    .cmd("HMGET")
                    .arg(&k.msg)
                    .arg(&ids)
                    .cmd("HMGET")
                    .arg(&k.attempts)
                    .arg(&ids)
                    .cmd("HMGET")
                    .arg(&k.reason)
                    .arg(&ids)
                    .query(con)
            })
            .map_err(|e| self.tag(e))?;
        Ok(listed
            .into_iter()
            .zip(values)
            .zip(attempts)
            .zip(reasons)
            .map(|((((id, score), value), attempts), reason)| {
                let (due_ms, payload) = match value.as_deref().map(split_stored) {
                    Some((due, payload)) => (due, Some(payload.to_vec())),
                    None => (None, None),
                };
                let due_ms = match state {
                    MessageState::Delayed => score.or(due_ms),
                    _ => due_ms,
                };
                PeekedMessage {
                    id,
                    due_ms,
                    payload,
                    attempts: attempts.unwrap_or(0),
                    since_ms: match state {
                        MessageState::InFlight | MessageState::Dead => score,
                        _ => None,
                    },
                    reason: if state == MessageState::Dead {
                        reason
                    } else {
                        None
                    },
                }
            })
            .collect())
    }

    /// How long the first `sample` messages of the ready list have been
    /// due, by the server's clock (`TIME`). Reads their stored values
    /// (payloads included) with one `HMGET`: keep `sample` modest.
    pub fn ready_ages(&self, sample: usize) -> Result<ReadyAges, Error> {
        let k = &self.keys;
        let stop = i64::try_from(sample.max(1)).unwrap_or(i64::MAX) - 1;
        let ((secs, micros), pri, ids): ((u64, u64), Vec<String>, Vec<String>) = self
            .rw
            .runtime()
            .run(&k.ready, Access::Read, |con| {
                redis::pipe()
                    .cmd("TIME")
                    .cmd("ZRANGE")
                    .arg(&k.prioritized)
                    .arg(0)
                    .arg(stop)
                    .cmd("LRANGE")
                    .arg(&k.ready)
                    .arg(0)
                    .arg(stop)
                    .query(con)
            })
            .map_err(|e| self.tag(e))?;
        let now_ms = secs * 1_000 + micros / 1_000;
        let ids: Vec<String> = ready_order(pri, ids, sample.max(1))
            .into_iter()
            .map(|(id, _)| id)
            .collect();
        if ids.is_empty() {
            return Ok(ReadyAges {
                now_ms,
                ages_ms: Vec::new(),
            });
        }
        let values: Vec<Option<Vec<u8>>> = self
            .rw
            .runtime()
            .run(&k.msg, Access::Read, |con| {
                redis::cmd("HMGET").arg(&k.msg).arg(&ids).query(con)
            })
            .map_err(|e| self.tag(e))?;
        let ages_ms = values
            .iter()
            .filter_map(|v| split_stored(v.as_deref()?).0)
            .map(|due| now_ms.saturating_sub(due))
            .collect();
        Ok(ReadyAges { now_ms, ages_ms })
    }
}

/// The first `n` ready ids in the order they are handed out: the
/// prioritized ones, then the ready list without its wake marker (`""`).
fn ready_order(
    prioritized: Vec<String>,
    list: Vec<String>,
    n: usize,
) -> Vec<(String, Option<u64>)> {
    prioritized
        .into_iter()
        .chain(list.into_iter().filter(|id| !id.is_empty()))
        .take(n)
        .map(|id| (id, None))
        .collect()
}

impl Keys {
    /// A `SCAN MATCH` pattern for every queue key (`{` and `}` are literal
    /// in Redis patterns; lock keys, `redwheel:lock:…`, do not match).
    pub(crate) fn scan_pattern() -> String {
        "redwheel:{*}:*".to_owned()
    }

    /// The queue a key belongs to, if it is a queue key (`redwheel:{N}:…`).
    pub(crate) fn queue_of(key: &str) -> Option<&str> {
        let rest = key.strip_prefix("redwheel:{")?;
        let end = rest.find("}:")?;
        let name = &rest[..end];
        validate_name(name).ok().map(|()| name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_of_reads_the_name_from_every_queue_key() {
        let k = Keys::new("orders:eu");
        for key in [
            &k.delayed,
            &k.msg,
            &k.ready,
            &k.dead,
            &k.counts,
            &k.inflight,
        ] {
            assert_eq!(Keys::queue_of(key), Some("orders:eu"));
        }
        assert_eq!(Keys::queue_of("redwheel:lock:{x}"), None);
        assert_eq!(Keys::queue_of("redwheel:{}:msg"), None);
        assert_eq!(Keys::queue_of("other:{x}:msg"), None);
    }

    #[test]
    fn split_stored_keeps_every_payload_byte() {
        assert_eq!(split_stored(b"12:a:b"), (Some(12), &b"a:b"[..]));
        assert_eq!(split_stored(b"12:"), (Some(12), &b""[..]));
        assert_eq!(split_stored(b"x:y"), (None, &b"x:y"[..]));
    }
}
