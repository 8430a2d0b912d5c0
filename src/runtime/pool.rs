//! The pools that keep idle connections ([`Pool`]): one for short commands,
//! so many threads can write at once, one for blocking reads; and the
//! rules for running a command on a pooled connection.
//!
//! A connection that died while it sat idle (a Redis restart, the server's
//! `timeout`, a load balancer) looks, once a command was written to it,
//! exactly like one that died after the server ran the command: the
//! client sees a reset or an end of stream either way. So:
//!
//! * a connection idle for [`CHECK_IDLE_AFTER`] or longer is checked with
//!   a `PING` before it carries a command (a harmless command: if the
//!   check fails, the connection is replaced and nothing was sent);
//! * a command that may write is sent once: a connection lost after it
//!   was written is [`ErrorKind::OutcomeUnknown`] for the caller (through
//!   [`Access::Write`]), never resent behind its back. Callers whose
//!   scripts make a resend harmless and truthful (take and claim, which
//!   replay their recorded reply) resend it themselves;
//! * a read ([`Access::Read`]) is resent once on a fresh connection when
//!   a pooled one turns out dead.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use redis::ConnectionLike;

use super::conn::{Conn, MIN_WAIT};
use super::endpoint::Endpoint;
use crate::error::{Access, Error, ErrorKind};

/// A pooled connection idle this long is checked with a `PING` before it
/// carries a command: long enough that a busy pool never pays for it, short
/// enough that a restart of Redis during a quiet spell, or a server closing
/// idle clients, costs a round trip rather than an unknown outcome.
pub(crate) const CHECK_IDLE_AFTER: Duration = Duration::from_secs(1);

/// Idle connections of one kind (short commands, or blocking consumers),
/// all with the same I/O timeout.
pub(crate) struct Pool {
    endpoint: std::sync::Arc<Endpoint>,
    /// Idle connections and when each was put back, most recent last.
    idle: Mutex<Vec<(Conn, Instant)>>,
    io_timeout: Duration,
    max_idle: usize,
    closed: AtomicBool,
}

impl Pool {
    pub(crate) fn new(
        endpoint: std::sync::Arc<Endpoint>,
        io_timeout: Duration,
        max_idle: usize,
    ) -> Pool {
        Pool {
            endpoint,
            idle: Mutex::new(Vec::new()),
            io_timeout,
            max_idle,
            closed: AtomicBool::new(false),
        }
    }

    /// An idle connection (`true`: it was idle; checked if idle long, but it
    /// may still have died since its last use) or a new one, for a caller
    /// whose wait must end within `budget`: the check of a long-idle
    /// connection, and the connect and handshake of a new one, take no
    /// longer (a frozen server accepts connections and never answers on
    /// them).
    pub(crate) fn get_within(&self, budget: Duration) -> Result<(Conn, bool), Error> {
        if self.closed.load(Ordering::Acquire) {
            return Err(shut_down());
        }
        let budget = budget.max(MIN_WAIT);
        if let Some(c) = self.take_idle(budget) {
            return Ok((c, true));
        }
        let con = self.endpoint.open_raw(budget, self.io_timeout)?;
        Ok((Conn::Node(con), false))
    }

    /// The most recently used idle connection that is alive as far as a
    /// `PING` can tell (only those idle for [`CHECK_IDLE_AFTER`] are
    /// asked, each for at most `check_within`); `None` if there is none. A
    /// connection that fails the check means the others are probably dead
    /// too: the pool is emptied.
    fn take_idle(&self, check_within: Duration) -> Option<Conn> {
        let (mut con, since) = self.idle.lock().pop()?;
        if since.elapsed() < CHECK_IDLE_AFTER {
            return Some(con);
        }
        let shortened = check_within < self.io_timeout;
        let checked = (|| -> redis::RedisResult<()> {
            if shortened {
                con.set_io_timeout(check_within)?;
            }
            redis::cmd("PING").query::<()>(&mut con)?;
            if shortened {
                con.set_io_timeout(self.io_timeout)?;
            }
            Ok(())
        })();
        match checked {
            Ok(()) => Some(con),
            Err(e) => {
                tracing::debug!(target: "redwheel::runtime", addr = %self.endpoint.addr(), error = %e, "an idle connection died; opening a new one");
                self.clear();
                None
            }
        }
    }

    /// The I/O timeout of its connections.
    pub(crate) fn io_timeout(&self) -> Duration {
        self.io_timeout
    }

    /// Returns a healthy connection for reuse.
    pub(crate) fn put(&self, con: Conn) {
        if !con.is_open() || self.closed.load(Ordering::Acquire) {
            return;
        }
        let mut idle = self.idle.lock();
        if idle.len() < self.max_idle {
            idle.push((con, Instant::now()));
        }
    }

    /// Drops every idle connection (they are probably dead too).
    pub(crate) fn clear(&self) {
        self.idle.lock().clear();
    }

    /// Drops every idle connection and refuses to hand out more.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.clear();
    }

    /// Runs `f`, one command (or pipeline), on a connection of this pool,
    /// within the pool's I/O timeout in all.
    ///
    /// `f` is sent once when it may write ([`Access::Write`]): a failure
    /// after sending is [`ErrorKind::OutcomeUnknown`], a connection that
    /// could not be had [`ErrorKind::Unavailable`] (nothing was sent). A
    /// read ([`Access::Read`]) that fails at once on a pooled connection
    /// that died (reset, closed; not slow) is sent again on a fresh one,
    /// with what is left of the time budget. A call that timed out is
    /// never resent: the budget is spent.
    pub(crate) fn run<R>(
        &self,
        access: Access,
        f: impl FnMut(&mut Conn) -> redis::RedisResult<R>,
    ) -> Result<R, Error> {
        self.try_run_as(access, f).map_err(|e| e.into_error(access))
    }

    /// As [`run`](Pool::run), telling a command that was never sent (no
    /// connection) from one that failed (a redis error, possibly a
    /// redirect to follow, or a connection lost after sending: the caller
    /// decides what that means). A read is sent again once on a fresh
    /// connection when the pooled one it went out on had died while idle.
    pub(crate) fn try_run_as<R>(
        &self,
        access: Access,
        mut f: impl FnMut(&mut Conn) -> redis::RedisResult<R>,
    ) -> Result<R, TryRunError> {
        let started = Instant::now();
        let (mut con, was_idle) = self.checkout(started).map_err(TryRunError::NotSent)?;
        match f(&mut con) {
            Ok(r) => {
                self.put_back(con, was_idle);
                Ok(r)
            }
            Err(e) if access == Access::Read && was_idle && died_while_idle(&e) => {
                // A read is harmless to send again; the server closed a
                // connection that sat idle (a restart, CLIENT KILL, its
                // `timeout`). If it cannot be reached again, it is down.
                drop(con);
                self.clear();
                let mut con = self.open_within(started).map_err(TryRunError::NotSent)?;
                match f(&mut con) {
                    Ok(r) => {
                        self.put_back(con, false);
                        Ok(r)
                    }
                    Err(e) => {
                        self.lost(&e);
                        Err(TryRunError::Failed(e))
                    }
                }
            }
            Err(e) => {
                self.lost(&e);
                Err(TryRunError::Failed(e))
            }
        }
    }

    /// After `e` on one of this pool's connections: if the connection
    /// died (reset, closed; not slow), the idle ones probably did too
    /// (a restart): they are dropped, so the calls after this one open
    /// fresh connections instead of finding out the same way.
    fn lost(&self, e: &redis::RedisError) {
        if died_while_idle(e) {
            self.clear();
        }
    }

    /// Runs `f` once, as [`run`](Pool::run) runs a write (see
    /// [`try_run_as`](Pool::try_run_as)).
    pub(crate) fn try_run<R>(
        &self,
        f: impl FnMut(&mut Conn) -> redis::RedisResult<R>,
    ) -> Result<R, TryRunError> {
        self.try_run_as(Access::Write, f)
    }

    /// A connection for a call started at `started`: an idle one (checked
    /// if idle long; `true`) or a fresh one within the call's budget.
    fn checkout(&self, started: Instant) -> Result<(Conn, bool), Error> {
        if self.closed.load(Ordering::Acquire) {
            return Err(shut_down());
        }
        match self.take_idle(self.io_timeout) {
            Some(c) => Ok((c, true)),
            None => Ok((self.open_within(started)?, false)),
        }
    }

    /// A fresh connection whose connect and I/O fit in what is left of a
    /// call's budget (the pool's I/O timeout) since `started`.
    fn open_within(&self, started: Instant) -> Result<Conn, Error> {
        let left = self.io_timeout.saturating_sub(started.elapsed());
        if left < MIN_WAIT {
            return Err(Error::new(
                ErrorKind::Unavailable,
                format!(
                    "no answer from redis at {} within {:?}",
                    self.endpoint.addr(),
                    self.io_timeout
                ),
            ));
        }
        Ok(Conn::Node(self.endpoint.open_raw(left, left)?))
    }

    /// Keeps `con` for reuse, with the pool's I/O timeout again if it was
    /// opened for a shorter budget.
    fn put_back(&self, con: Conn, was_idle: bool) {
        if was_idle || con.set_io_timeout(self.io_timeout).is_ok() {
            self.put(con);
        }
    }
}

/// How a command on a pooled connection failed.
pub(crate) enum TryRunError {
    /// No connection could be had: the command was not sent.
    NotSent(Error),
    /// Redis (or the connection) failed the command.
    Failed(redis::RedisError),
}

impl TryRunError {
    /// The caller's error, given whether the command writes.
    pub(crate) fn into_error(self, access: Access) -> Error {
        match self {
            TryRunError::NotSent(e) => e,
            TryRunError::Failed(e) => Error::from_redis(e, access),
        }
    }
}

/// A connection that died: reset, closed or broken, not slow.
fn died_while_idle(e: &redis::RedisError) -> bool {
    e.is_connection_dropped() && !e.is_timeout()
}

/// The error of a call made after shutdown.
pub(crate) fn shut_down() -> Error {
    Error::new(ErrorKind::Shutdown, "redwheel is shut down")
}
