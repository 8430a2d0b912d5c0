//! At-most-once consumption: [`Queue::take`] and [`Queue::poll`] pop a due
//! message and delete it in the same script, which records what it handed
//! out so that a take whose reply was lost is sent again and answered with
//! the same message (`queue/request.rs`).

use std::time::{Duration, Instant};

use super::codec::Codec;
use super::handle::Queue;
use super::keys::Keys;
use super::message::{Message, MessageId};
use super::pop::call_prefix;
use super::request::Request;
use super::stored::parse_stored;
use crate::error::{Error, ErrorKind};
use crate::scripts;

impl<T: Codec> Queue<T> {
    /// Waits for the next due message and takes it (at-most-once from
    /// here: it is gone from Redis when this returns, and a consumer that
    /// dies with it loses it). For at-least-once delivery, use
    /// [`claim`](Queue::claim) and ack.
    ///
    /// Blocks on the ready list (`BLMOVE`), so it wakes as soon as a message
    /// lands there. While Redis is unreachable it keeps waiting, retrying on
    /// the reconnect backoff. Returns [`ErrorKind::Shutdown`] once the
    /// `Redwheel` is shut down, and [`ErrorKind::Decode`] for a payload that
    /// cannot be decoded (that message is parked as a dead letter, not
    /// lost). A connection lost while waiting is re-opened and the wait
    /// goes on. A take whose reply is lost (the connection reset, the
    /// reply cut midway or later than the command timeout) is sent again
    /// and answered with the message the lost one took: no message leaves
    /// Redis without being returned. If Redis cannot be asked within five
    /// minutes (or, for [`poll`](Queue::poll), by its timeout plus the
    /// command timeout), or the `Redwheel` shuts down meanwhile, the call
    /// fails with [`ErrorKind::OutcomeUnknown`]: a message may have been
    /// taken and not returned.
    ///
    /// The queue's controls apply: while it is paused, or its rate limit
    /// lets no delivery through, this waits (in this process, woken when a
    /// resume is announced or the rate window reopens). Messages of a
    /// higher priority come first; one past its ttl is made a dead letter,
    /// never taken.
    pub fn take(&self) -> Result<Message<T>, Error> {
        match self.take_until(None)? {
            Some(m) => Ok(m),
            None => Err(self.tag(Error::new(ErrorKind::Protocol, "take returned no message"))),
        }
    }

    /// As [`take`](Queue::take), but gives up after `timeout`: `Ok(None)`
    /// when no message came. If Redis stayed unreachable until the timeout,
    /// the last connection error is returned instead.
    ///
    /// Returns within `timeout` plus one `command_timeout` whatever Redis
    /// does meanwhile (killed, or frozen with its connections open): every
    /// read, connect and wait ends by then, and a take whose reply was lost
    /// and could not be asked about again by then is
    /// [`ErrorKind::OutcomeUnknown`]. A `timeout` too long to be a point in
    /// time (`Duration::MAX`) waits as [`take`](Queue::take) does.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use redwheel::Redwheel;
    ///
    /// let rw = Redwheel::connect("redis://127.0.0.1:6379")?;
    /// let q = rw.queue::<String>("reminders")?;
    /// while let Some(m) = q.poll(Duration::from_secs(1))? {
    ///     println!("{} (due at {:?})", m.payload(), m.due());
    /// }
    /// # Ok::<(), redwheel::Error>(())
    /// ```
    pub fn poll(&self, timeout: Duration) -> Result<Option<Message<T>>, Error> {
        self.take_until(Instant::now().checked_add(timeout))
    }

    fn take_until(&self, deadline: Option<Instant>) -> Result<Option<Message<T>>, Error> {
        let keys = &self.state.keys;
        let req = Request::new(keys);
        let prefix = call_prefix();
        let popped = self.wait_pop(
            (deadline, None),
            ("take", 1),
            &scripts::TAKE,
            (&take_keys(keys, &req.key), TAKE_PLAIN_KEYS),
            &[
                req.seq_arg.as_bytes(),
                req.ttl_arg.as_bytes(),
                prefix.as_bytes(),
            ],
            2,
        )?;
        let Some(value) = popped else {
            return Ok(None);
        };
        match self.taken(value)? {
            Taken::Message(m) => Ok(Some(m)),
            Taken::Undecodable(id, stored, cause) => {
                Err(self.dead_on_arrival(&id, &stored, None, cause))
            }
        }
    }

    /// Reads a reply of `take.lua` that holds a message (shared with the
    /// async take): the message, or what could not be decoded.
    pub(super) fn taken(&self, value: redis::Value) -> Result<Taken<T>, Error> {
        let (_gate, _expired, id, stored): (i64, i64, String, Vec<u8>) =
            redis::from_redis_value(value).map_err(|e| {
                self.tag(
                    Error::new(ErrorKind::Protocol, "unexpected reply to take.lua").with_cause(e),
                )
            })?;
        match parse_stored::<T>(&stored) {
            Ok((due_ms, payload)) => {
                let rt = self.rt();
                self.state
                    .metrics
                    .delivered([(1, due_ms)], || rt.server_now_ms());
                Ok(Taken::Message(Message {
                    id: MessageId(id),
                    payload,
                    due_ms,
                }))
            }
            Err(cause) => Ok(Taken::Undecodable(id, stored, cause)),
        }
    }
}

/// What `take.lua` handed over.
pub(super) enum Taken<T> {
    Message(Message<T>),
    /// Its id, stored value and decode error (to be parked).
    Undecodable(String, Vec<u8>, crate::error::CodecError),
}

/// How many of `take.lua`'s keys a queue without controls needs (its
/// first six and the controls hash, whose presence sends the caller back
/// for all of them).
pub(super) const TAKE_PLAIN_KEYS: usize = 7;

/// `take.lua`'s keys, in its order, with the request's reply record.
pub(super) fn take_keys<'a>(keys: &'a Keys, record: &'a str) -> [&'a str; 13] {
    [
        &keys.ready,
        &keys.msg,
        &keys.attempts,
        &keys.counts,
        &keys.stale,
        record,
        &keys.controls,
        &keys.prioritized,
        &keys.priority,
        &keys.expires,
        &keys.rate,
        &keys.dead,
        &keys.reason,
    ]
}
