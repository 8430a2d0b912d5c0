//! A queue's counts: [`Queue::len`] and friends, and [`QueueStats`] (every
//! state in one atomic read), shared with the operators' inspector.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::codec::Codec;
use super::handle::Queue;
use super::keys::Keys;
use crate::error::{Access, Error};
use crate::runtime::Runtime;
use crate::scripts;
use crate::telemetry;

/// How many messages a queue holds in each state, and how it is keeping up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueueStats {
    /// Not yet due.
    pub delayed: u64,
    /// Due, waiting for a consumer, at any priority (may count ids removed
    /// after they fell due, until a consumer skips them).
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
    /// Messages whose ttl ran out before they were handed out, so far, by
    /// every process (each is a dead letter with reason `expired`, until
    /// removed or requeued).
    pub expired: u64,
}

impl<T: Codec> Queue<T> {
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

    /// How many messages are in each state, in one atomic read, and how
    /// delivery is keeping up.
    ///
    /// ```no_run
    /// use redwheel::Redwheel;
    ///
    /// let rw = Redwheel::connect("redis://127.0.0.1:6379")?;
    /// let q = rw.queue::<String>("emails")?;
    /// let s = q.stats()?;
    /// println!("{} delayed, {} ready, {} in flight, {} dead", s.delayed, s.ready, s.in_flight, s.dead);
    /// if let Some(late) = s.oldest_overdue {
    ///     println!("consumers are {late:?} behind");
    /// }
    /// # Ok::<(), redwheel::Error>(())
    /// ```
    pub fn stats(&self) -> Result<QueueStats, Error> {
        let span = telemetry::queue_op("stats", &self.state.name, 0);
        let (stats, _now) = read_stats(self.rt(), &self.state.keys).map_err(|e| self.tag(e))?;
        drop(span);
        Ok(self.note_stats(stats))
    }

    /// Records what `stats` read in the queue's gauges (shared with the
    /// async stats).
    pub(super) fn note_stats(&self, stats: QueueStats) -> QueueStats {
        self.state.metrics.backlog(
            stats.delayed,
            stats.ready,
            stats.in_flight,
            stats.dead,
            stats.oldest_overdue,
        );
        stats
    }
}

/// Runs `stats.lua` on a queue's keys: its counts, and the server's time
/// (epoch ms) at the instant they were read. Shared by [`Queue::stats`]
/// and the operators' inspector, which reads without opening the queue.
pub(crate) fn read_stats(rt: &Runtime, keys: &Keys) -> Result<(QueueStats, u64), Error> {
    let reply: redis::Value = rt.run(&keys.delayed, Access::Read, |con| {
        let mut inv = scripts::STATS.prepare_invoke();
        for k in stats_keys(keys) {
            inv.key(k);
        }
        inv.invoke(con)
    })?;
    decode_stats(reply).map_err(|e| Error::from_redis(e, Access::Read))
}

/// The keys `stats.lua` reads, in its order.
pub(super) fn stats_keys(keys: &Keys) -> [&str; 7] {
    [
        &keys.delayed,
        &keys.ready,
        &keys.inflight,
        &keys.dead,
        &keys.msg,
        &keys.prioritized,
        &keys.counts,
    ]
}

/// Appends `stats.lua` on `keys` (by `EVALSHA`: the caller loads the
/// script after a `NOSCRIPT`) to a pipeline, for readers of many queues in
/// one round trip (the dashboard); [`decode_stats`] reads its reply.
#[cfg_attr(not(feature = "web"), allow(dead_code))]
pub(crate) fn pipe_stats(pipe: &mut redis::Pipeline, keys: &Keys) {
    let k = stats_keys(keys);
    pipe.cmd("EVALSHA")
        .arg(scripts::STATS.get_hash())
        .arg(k.len())
        .arg(&k[..]);
}

/// `stats.lua`'s reply `{delayed, ready, inflight, dead, oldest_overdue_ms
/// (-1: none), next_due_ms (-1: none), now_ms, expired}`: the counts and the
/// server's clock (epoch ms). The one reader of that reply.
pub(crate) fn decode_stats(reply: redis::Value) -> redis::RedisResult<(QueueStats, u64)> {
    let (delayed, ready, in_flight, dead, overdue, next_due, now, expired): (
        u64,
        u64,
        u64,
        u64,
        i64,
        i64,
        u64,
        u64,
    ) = redis::from_redis_value(reply)?;
    let stats = QueueStats {
        delayed,
        ready,
        in_flight,
        dead,
        oldest_overdue: (overdue >= 0).then(|| Duration::from_millis(overdue as u64)),
        next_due: (next_due >= 0).then(|| UNIX_EPOCH + Duration::from_millis(next_due as u64)),
        expired,
    };
    Ok((stats, now))
}
