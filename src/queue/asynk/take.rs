//! `take_async` and `poll_async`, and the give-back of a message handed to
//! a take whose future was dropped before it read the reply.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::Value;

use super::Popped;
use super::lost::orphan_of;
use crate::error::{Access, Error, ErrorKind};
use crate::queue::codec::Codec;
use crate::queue::dead::{Parked, park_args, park_keys};
use crate::queue::handle::Queue;
use crate::queue::keys::Keys;
use crate::queue::message::Message;
use crate::queue::pop::call_prefix;
use crate::queue::request::Request;
use crate::queue::take::{Taken, take_keys};
use crate::runtime::{Backoff, Cell, Command, Runtime, detach, first_reply};
use crate::scripts;

impl<T: Codec> Queue<T> {
    /// [`take`](Queue::take) as a future: waits for the next due message
    /// and takes it (at-most-once from here). Same errors as `take`: a take
    /// whose reply was lost is sent again and answered with the message the
    /// lost one took (its reply record), or fails with
    /// [`ErrorKind::OutcomeUnknown`] if Redis cannot be asked in time.
    ///
    /// It waits without holding a connection: woken when this process's
    /// transfer job has run (at every due time announced on the queue's
    /// wake channel, and at every guard sweep), so 10,000 waiting tasks
    /// cost no connection and no thread each.
    ///
    /// **Cancellation**: dropping the future never loses a message. Dropped
    /// while waiting, nothing was taken. Dropped with a take on the wire,
    /// the message it is handed (if any) goes back to the head of the ready
    /// list (`give_back.lua`, sent by redwheel's threads, retried while
    /// Redis is unreachable); if the connection fails before the reply
    /// comes, the same request is sent again (answered from its reply
    /// record) to learn which message it took, and that one goes back,
    /// wherever the future is dropped after a lost reply: with that resend
    /// on the wire, in its backoff, or while Redis is unreachable. Only if
    /// Redis cannot be asked for five minutes, or the `Redwheel` shuts
    /// down first, may that message be lost (logged as an error, as nobody
    /// is left to tell).
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), redwheel::Error> {
    /// use redwheel::Redwheel;
    ///
    /// let rw = Redwheel::connect("redis://127.0.0.1:6379")?;
    /// let q = rw.queue::<String>("emails")?;
    /// let m = q.take_async().await?;
    /// println!("{}", m.payload());
    /// # Ok(()) }
    /// ```
    pub fn take_async(&self) -> impl Future<Output = Result<Message<T>, Error>> + Send + 'static {
        let q = self.clone();
        async move {
            match q.take_until_async(None).await? {
                Some(m) => Ok(m),
                None => Err(q.tag(Error::new(ErrorKind::Protocol, "take returned no message"))),
            }
        }
    }

    /// [`poll`](Queue::poll) as a future: as
    /// [`take_async`](Queue::take_async), giving up after `timeout`
    /// (`Ok(None)`), with a deadline on the runtime's wheel. It returns
    /// within `timeout` plus one `command_timeout` whatever Redis does
    /// (gone mid-wait: `Ok(None)` or a transient error); an attempt still
    /// unanswered then is abandoned as a dropped future's is (nothing
    /// lost).
    ///
    /// **Cancellation**: as `take_async`.
    pub fn poll_async(
        &self,
        timeout: Duration,
    ) -> impl Future<Output = Result<Option<Message<T>>, Error>> + Send + 'static {
        let q = self.clone();
        let deadline = Instant::now().checked_add(timeout);
        async move { q.take_until_async(deadline).await }
    }

    async fn take_until_async(
        &self,
        deadline: Option<Instant>,
    ) -> Result<Option<Message<T>>, Error> {
        let keys = &self.state.keys;
        // One request for every round of this call (as the synchronous
        // take): a round whose reply was lost is answered again.
        let req = Arc::new(Request::new(keys));
        let prefix = call_prefix();
        let command = Command::script(
            &scripts::TAKE,
            &take_keys(keys, &req.key),
            &[
                req.seq_arg.as_bytes(),
                req.ttl_arg.as_bytes(),
                prefix.as_bytes(),
            ],
        );
        let shared_keys = Arc::new(keys.clone());
        let orphan = || {
            let keys = Arc::clone(&shared_keys);
            Some(orphan_of(
                self.rt(),
                &shared_keys.ready,
                &req,
                &command,
                ("take", "a message may be lost"),
                move |rt, values| give_back(rt, keys, values),
            ))
        };
        let popped = self
            .pop_async("take", deadline, command.clone(), 2, orphan)
            .await?;
        let Popped::Found(value) = popped else {
            return Ok(None);
        };
        match self.taken(value)? {
            Taken::Message(m) => Ok(Some(m)),
            Taken::Undecodable(id, stored, cause) => {
                let parked = self
                    .park_async(&id, &stored, None, &cause.to_string())
                    .await;
                Err(self.decode_failed(&id, None, parked, cause))
            }
        }
    }

    /// Parks an undecodable message as a dead letter through the
    /// multiplexed connection (`token`: the claim that handed it out).
    pub(crate) async fn park_async(
        &self,
        id: &str,
        stored: &[u8],
        token: Option<&str>,
        reason: &str,
    ) -> Parked {
        let args = park_args(id, stored, token, reason);
        let args: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
        let command = Command::script(&scripts::PARK, &park_keys(&self.state.keys), &args);
        let result = Arc::clone(self.rt())
            .call(&self.state.keys.msg, Access::Write, command, None)
            .await
            .and_then(|v| first_reply(v, Access::Write))
            .and_then(|v| {
                redis::from_redis_value::<i64>(v).map_err(|e| {
                    Error::new(ErrorKind::Protocol, "unexpected reply to park.lua").with_cause(e)
                })
            });
        self.parked(id, result)
    }
}

/// The answer of a take whose future is gone (its replies, or, after a
/// lost reply, those of the same request sent again: `lost.rs`): the
/// message it took, if any, goes back to the head of the ready list, on
/// redwheel's threads.
fn give_back(rt: Arc<Runtime>, keys: Arc<Keys>, taken: Vec<Value>) {
    detach(async move {
        let mut backoff = Backoff::new(rt.options.reconnect_min, rt.options.reconnect_max);
        let Some(Value::Array(items)) = taken.into_iter().next() else {
            return; // an error reply
        };
        // { gate, expired, id, stored }, or the header alone: nothing taken.
        let (Some(Value::BulkString(id)), Some(Value::BulkString(stored))) =
            (items.get(2), items.get(3))
        else {
            return;
        };
        let command = Command::script(
            &scripts::GIVE_BACK,
            &[&keys.ready, &keys.msg, &keys.counts],
            &[id, stored],
        );
        let id = String::from_utf8_lossy(id).into_owned();
        loop {
            let r = rt
                .call(&keys.ready, Access::Write, command.clone(), None)
                .await
                .and_then(|v| first_reply(v, Access::Write));
            match r {
                Ok(Value::Int(1)) => {
                    tracing::debug!(target: "redwheel::queue", key = %keys.ready, id, "a dropped take's message is back at the head of the ready list");
                    return;
                }
                Ok(_) => {
                    tracing::warn!(target: "redwheel::queue", key = %keys.ready, id, "a dropped take's message was not put back: its id was offered anew meanwhile");
                    return;
                }
                // Never sent: safe to send again (once Redis is back).
                Err(e) if e.kind() == ErrorKind::Unavailable && !rt.is_shut_down() => {
                    rt.wait_for(&Arc::new(Cell::default()), Some(backoff.step()))
                        .await;
                }
                Err(e) => {
                    tracing::error!(target: "redwheel::queue", key = %keys.ready, id, error = %e, "a dropped take's message could not be put back: it may be lost");
                    return;
                }
            }
        }
    });
}
