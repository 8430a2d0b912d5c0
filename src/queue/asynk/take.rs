//! `take_async` and `poll_async`, and the give-back of a message handed to
//! a take whose future was dropped before it read the reply.

use std::future::Future;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use redis::Value;

use super::Popped;
use crate::error::{Access, Error, ErrorKind};
use crate::queue::codec::Codec;
use crate::queue::dead::{park_args, park_keys};
use crate::queue::handle::Queue;
use crate::queue::keys::Keys;
use crate::queue::message::Message;
use crate::queue::take::{Taken, take_keys};
use crate::runtime::{Backoff, Cell, Command, Orphan, Runtime, detach, first_reply};
use crate::scripts;

impl<T: Codec> Queue<T> {
    /// [`take`](Queue::take) as a future: waits for the next due message
    /// and takes it (at-most-once from here). Same errors as `take`, with
    /// one difference: a take whose reply was lost (the connection failed
    /// after the script was sent) fails with
    /// [`ErrorKind::OutcomeUnknown`] (the message may be gone) instead of
    /// waiting on.
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
    /// Redis is unreachable). The one exception is the same as the
    /// synchronous take's: if the connection fails in the instant between
    /// the script and its reply, the message may be gone (logged, as
    /// nobody is left to tell).
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
    /// (`Ok(None)`), with a deadline on the runtime's wheel.
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
        let command = Command::script(&scripts::TAKE, &take_keys(keys), &[]);
        let rt = Arc::downgrade(self.rt());
        let give_back_keys = Arc::new(keys.clone());
        let orphan = || -> Option<Orphan> {
            let (rt, keys) = (Weak::clone(&rt), Arc::clone(&give_back_keys));
            Some(Box::new(move |values: Vec<Value>| {
                if let Some(rt) = rt.upgrade() {
                    give_back(rt, keys, values);
                }
            }))
        };
        let popped = self
            .pop_async(deadline, command, 0, orphan, |lost| {
                tracing::warn!(target: "redwheel::queue", queue = %self.state.name, error = %lost, "take: the reply was lost; a message may have been taken");
                Some(lost)
            })
            .await?;
        let Popped::Found(value) = popped else {
            return Ok(None);
        };
        match self.taken(value)? {
            Taken::Message(m) => Ok(Some(m)),
            Taken::Undecodable(id, stored, cause) => {
                let parked = self.park_async(&id, &stored, &cause.to_string()).await;
                Err(self.decode_failed(&id, parked, cause))
            }
        }
    }

    /// Parks an undecodable message as a dead letter through the
    /// multiplexed connection; true if it was.
    pub(crate) async fn park_async(&self, id: &str, stored: &[u8], reason: &str) -> bool {
        let args = park_args(id, stored, reason);
        let args: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
        let command = Command::script(&scripts::PARK, &park_keys(&self.state.keys), &args);
        let result = Arc::clone(self.rt())
            .call(&self.state.keys.msg, Access::Write, command, None)
            .await
            .and_then(|v| first_reply(v, Access::Write))
            .map(drop);
        self.parked(id, result)
    }
}

/// A take's replies arrived after its future was dropped: a message it was
/// handed goes back to the head of the ready list, on redwheel's threads.
fn give_back(rt: Arc<Runtime>, keys: Arc<Keys>, values: Vec<Value>) {
    let Some(Value::Array(items)) = values.into_iter().next() else {
        return; // nothing was taken (Nil), or an error reply
    };
    let (Some(Value::BulkString(id)), Some(Value::BulkString(stored))) =
        (items.first(), items.get(1))
    else {
        return;
    };
    let command = Command::script(
        &scripts::GIVE_BACK,
        &[&keys.ready, &keys.msg, &keys.counts],
        &[id, stored],
    );
    let id = String::from_utf8_lossy(id).into_owned();
    detach(async move {
        let mut backoff = Backoff::new(rt.options.reconnect_min, rt.options.reconnect_max);
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
