//! What the driver runs and what carries it: the [`Job`] interface the
//! layers above implement, the [`Next`] and [`Deadline`] they answer with,
//! the packed [`Commands`] of a round, the [`Replies`] a job reads, and the
//! [`Transport`] (one server or a cluster) that sends them.

use std::time::Duration;

use redis::{Script, Value};

use crate::error::{Access, Error};
use crate::runtime::server_clock::ClockSample;

/// One unit of due work: a round of commands and what to make of their
/// replies.
pub(crate) trait Job: Send + Sync + 'static {
    /// A short description for logs ("transfer of orders").
    fn describe(&self) -> String;
    /// Appends this job's commands (usually one) to the round.
    fn commands(&self, out: &mut Commands);
    /// The scripts its commands run by `EVALSHA`, loaded after `NOSCRIPT`.
    fn scripts(&self) -> &[&'static Script] {
        &[]
    }
    /// Reads the replies to its commands, when none of them is an error,
    /// and says when to run next. An `Err` has the driver run the job again
    /// after a backoff.
    fn on_reply(&self, replies: &[Value]) -> Result<Next, Error>;
    /// Reads the replies to its commands, each a value or the error that
    /// command got, and says when to run next. By default the job stands or
    /// falls as a whole: the first error is the job's, and
    /// [`on_reply`](Job::on_reply) sees only rounds without one. A job
    /// whose commands stand alone (a renewal group: one command per lock,
    /// spread over the masters of a cluster) overrides this to apply each
    /// reply on its own, so a master that did not answer holds up only its
    /// own commands; it returns an `Err` (after applying the rest) to be run
    /// again after a backoff.
    fn on_replies(&self, replies: &Replies<'_>) -> Result<Next, Error> {
        self.on_reply(replies.all()?)
    }
    /// A guard sweep is putting this job in a round (see "Guard sweeps"
    /// in the driver's docs). A job that can tell from a cheap read
    /// whether it has work may make its next [`commands`](Job::commands)
    /// that read (a *probe*) instead of its full commands, whose reply
    /// answers [`Next::Again`] when the full commands must run. By default
    /// nothing changes: a sweep runs the job in full. Called with the
    /// driver's state locked: flip a flag, nothing more.
    fn sweep(&self) {}
    /// The job was marked due for any other reason (its deadline, an
    /// announcement, [`Next::Again`], a retry, a reconnect): its next
    /// commands are the full ones, even if a sweep asked for a probe.
    /// Called with the driver's state locked.
    fn run_in_full(&self) {}
}

/// The replies to one job's commands in a round: one per command, in
/// order. The one place where an error reply (or the stand-in of a command
/// a cluster master did not answer) becomes an [`Error`].
pub(crate) struct Replies<'a> {
    values: &'a [Value],
    /// What a `NOSCRIPT` reply stands for in this round: the driver loaded
    /// the job's scripts again (a transient error), or could not (why).
    noscript: Option<&'a Error>,
}

impl<'a> Replies<'a> {
    /// The replies `values`; a `NOSCRIPT` among them reads as `noscript`
    /// when given.
    pub(crate) fn new(values: &'a [Value], noscript: Option<&'a Error>) -> Replies<'a> {
        Replies { values, noscript }
    }

    /// How many replies (one per command).
    pub(crate) fn len(&self) -> usize {
        self.values.len()
    }

    /// The reply to command `i`: its value, or its error. A command past
    /// the end reads as a protocol error.
    pub(crate) fn get(&self, i: usize) -> Result<&'a Value, Error> {
        match self.values.get(i) {
            Some(Value::ServerError(e)) => Err(self.error(e)),
            Some(v) => Ok(v),
            None => Err(Error::new(
                crate::error::ErrorKind::Protocol,
                "redis sent fewer replies than commands",
            )),
        }
    }

    /// Every reply, or the first error among them.
    pub(crate) fn all(&self) -> Result<&'a [Value], Error> {
        match self.values.iter().find_map(|v| match v {
            Value::ServerError(e) => Some(e),
            _ => None,
        }) {
            Some(e) => Err(self.error(e)),
            None => Ok(self.values),
        }
    }

    fn error(&self, e: &redis::ServerError) -> Error {
        match self.noscript {
            Some(n) if is_noscript(e) => Error::new(n.kind(), n.to_string()),
            _ => Error::from_redis(redis::RedisError::from(e.clone()), Access::Write),
        }
    }
}

/// True for a `NOSCRIPT` error reply: the server does not have the script
/// (flushed, restarted, or a node that never had it).
pub(crate) fn is_noscript(e: &redis::ServerError) -> bool {
    e.code() == "NOSCRIPT"
}

/// When a job wants to run again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Next {
    /// After this long, counted on the local clock from the reply's arrival
    /// (at most [`MAX_AHEAD`](crate::runtime::server_clock::MAX_AHEAD); a longer wait runs early, once, to look
    /// again). A job whose script computes the wait from the server's own
    /// `TIME` ("due − now") is never run early by clock offsets, since the
    /// reply arrives after the script read the clock.
    After(Duration),
    /// At once: more work is waiting (a full batch). Runs in the next round.
    Again,
    /// Nothing to schedule: the next announcement or guard sweep runs it.
    Idle,
}

/// A first deadline, or an announced one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Deadline {
    /// In the next round.
    Now,
    /// At this server time (epoch ms), by the offset estimate.
    ServerMs(i64),
    /// After this long on the local clock.
    #[cfg_attr(not(test), allow(dead_code))] // lock renewal
    After(Duration),
}

/// The commands of one round, packed back to back, each with the cluster
/// slot of its keys.
#[derive(Default)]
pub(crate) struct Commands {
    buf: Vec<u8>,
    /// Where each command ends in `buf`.
    ends: Vec<usize>,
    /// The cluster slot of each command's keys.
    slots: Vec<u16>,
}

impl Commands {
    /// Appends one packed command whose keys are in cluster slot `slot`
    /// (a cluster sends it to the master serving that slot).
    pub(crate) fn push(&mut self, slot: u16, packed: &[u8]) {
        self.buf.extend_from_slice(packed);
        self.ends.push(self.buf.len());
        self.slots.push(slot);
    }

    /// The packed bytes of command `i`.
    pub(crate) fn command(&self, i: usize) -> &[u8] {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.buf[start..self.ends[i]]
    }

    /// The packed bytes of every command.
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.buf
    }

    /// The number of commands.
    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }

    /// The cluster slot of command `i`.
    pub(crate) fn slot(&self, i: usize) -> u16 {
        self.slots[i]
    }

    pub(super) fn clear(&mut self) {
        self.buf.clear();
        self.ends.clear();
        self.slots.clear();
    }
}

/// What carries a round to Redis and back.
pub(crate) trait Transport: Send + 'static {
    /// Sends every command and returns one reply per command, in order:
    /// one pipelined round trip per connection. `Err` when the round as a
    /// whole failed (no connection, or it broke); an error reply of one
    /// command is a [`Value::ServerError`] in its place.
    fn round_trip(&mut self, commands: &Commands) -> Result<Vec<Value>, Error>;
    /// Which server answered command `command` of the last round, as a
    /// number that is the same for every command that server answered (0
    /// on one server); `None` if no server did (a stand-in reply).
    fn server_of(&self, command: usize) -> Option<usize>;
    /// Loads `script` on server `server` (as [`server_of`] numbers them),
    /// after its `NOSCRIPT` reply.
    ///
    /// [`server_of`]: Transport::server_of
    fn load_script(&mut self, script: &Script, server: usize) -> Result<(), Error>;
    /// How many connections were established so far (the driver re-runs
    /// every job when this grows past 1: a reconnect).
    fn connects(&self) -> u64;
    /// Round trips made so far (a round is one per connection it used).
    fn round_trips(&self) -> u64;
    /// Measures the server's clock, if connected.
    fn measure_clock(&mut self, now: &dyn Fn() -> Duration) -> Option<ClockSample>;
}
