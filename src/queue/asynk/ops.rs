//! `remove_async` and `stats_async`.

use std::future::Future;
use std::sync::Arc;

use super::offer::reply_as;
use crate::error::{Access, Error};
use crate::queue::codec::Codec;
use crate::queue::handle::{Queue, check_id};
use crate::queue::message::MessageId;
use crate::queue::remove::remove_keys;
use crate::queue::stats::{QueueStats, decode_stats, stats_keys};
use crate::runtime::{Command, first_reply};
use crate::scripts;
use crate::telemetry;

impl<T: Codec> Queue<T> {
    /// [`remove`](Queue::remove) as a future: cancels a message by id;
    /// `true` if it was known and is now gone. Same errors as `remove`.
    ///
    /// **Cancellation**: dropped after its first poll, the message may or
    /// may not have been removed; removing again is harmless (it answers
    /// `false` the second time).
    pub fn remove_async(
        &self,
        id: &MessageId,
    ) -> impl Future<Output = Result<bool, Error>> + Send + 'static {
        let checked = check_id(id).map_err(|e| self.tag(e));
        let command = Command::script(
            &scripts::REMOVE,
            &remove_keys(&self.state.keys),
            &[id.as_str().as_bytes()],
        );
        let (q, id) = (self.clone(), id.as_str().to_owned());
        async move {
            checked?;
            let _span = telemetry::queue_op_async("remove", &q.state.name, 1);
            let tag = |e: Error| q.tag(e).for_message(&id);
            let replies = Arc::clone(q.rt())
                .call(&q.state.keys.delayed, Access::Write, command, None)
                .await
                .map_err(tag)?;
            let n: i64 = reply_as(replies.into_iter().next(), Access::Write).map_err(tag)?;
            Ok(n == 1)
        }
    }

    /// [`stats`](Queue::stats) as a future: how many messages are in each
    /// state, in one atomic read. Same errors as `stats`.
    ///
    /// **Cancellation**: a read; dropping it changes nothing.
    pub fn stats_async(&self) -> impl Future<Output = Result<QueueStats, Error>> + Send + 'static {
        let command = Command::script(&scripts::STATS, &stats_keys(&self.state.keys), &[]);
        let q = self.clone();
        async move {
            let span = telemetry::queue_op_async("stats", &q.state.name, 0);
            let reply = Arc::clone(q.rt())
                .call(&q.state.keys.delayed, Access::Read, command, None)
                .await
                .and_then(|v| first_reply(v, Access::Read))
                .map_err(|e| q.tag(e))?;
            drop(span);
            let (stats, _now) =
                decode_stats(reply).map_err(|e| q.tag(Error::from_redis(e, Access::Read)))?;
            Ok(q.note_stats(stats))
        }
    }
}
