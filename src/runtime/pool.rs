//! The pools that keep idle connections ([`Pool`]): one for short commands,
//! so many threads can write at once, one for blocking reads; and the
//! rules for running a command on a pooled connection (one hidden resend
//! on a connection that died while idle, never on one that may have
//! applied the command).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use redis::ConnectionLike;

use super::conn::{Conn, MIN_WAIT};
use super::endpoint::Endpoint;
use crate::error::{Access, Error, ErrorKind};

/// Idle connections of one kind (short commands, or blocking consumers),
/// all with the same I/O timeout.
pub(crate) struct Pool {
    endpoint: std::sync::Arc<Endpoint>,
    idle: Mutex<Vec<Conn>>,
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

    /// An idle connection (`true`: it was idle, and may have died since)
    /// or a new one.
    pub(crate) fn get(&self) -> Result<(Conn, bool), Error> {
        if self.closed.load(Ordering::Acquire) {
            return Err(shut_down());
        }
        if let Some(c) = self.idle.lock().pop() {
            return Ok((c, true));
        }
        Ok((self.endpoint.open(self.io_timeout)?, false))
    }

    /// Returns a healthy connection for reuse.
    pub(crate) fn put(&self, con: Conn) {
        if !con.is_open() || self.closed.load(Ordering::Acquire) {
            return;
        }
        let mut idle = self.idle.lock();
        if idle.len() < self.max_idle {
            idle.push(con);
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
    /// An idle connection may have died since its last use (a Redis
    /// restart). If it fails at once with a connection error, the call is
    /// tried once more on a fresh connection with what is left of the time
    /// budget; the commands run through here are idempotent (an offer
    /// carries its id). A call that timed out is never retried: it may
    /// have been applied, and the budget is spent. `access` decides how a
    /// failure after sending is reported (see [`Access`]).
    pub(crate) fn run<R>(
        &self,
        access: Access,
        f: impl FnMut(&mut Conn) -> redis::RedisResult<R>,
    ) -> Result<R, Error> {
        self.try_run(f).map_err(|a| a.into_error(access))
    }

    /// As [`run`](Pool::run), telling a command that was never sent (no
    /// connection) from one that failed (a redis error, possibly a
    /// redirect to follow).
    pub(crate) fn try_run<R>(
        &self,
        mut f: impl FnMut(&mut Conn) -> redis::RedisResult<R>,
    ) -> Result<R, TryRunError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(TryRunError::NotSent(shut_down()));
        }
        let started = Instant::now();
        let idle = self.idle.lock().pop();
        let was_idle = idle.is_some();
        let mut con = match idle {
            Some(c) => c,
            None => self.open_within(started).map_err(TryRunError::NotSent)?,
        };
        match f(&mut con) {
            Ok(r) => {
                self.put_back(con, was_idle);
                Ok(r)
            }
            Err(e) if was_idle && died_while_idle(&e) => {
                // The server closed a connection that sat idle: it went away
                // (a restart) before this command reached it. If it cannot
                // be reached again, it is down: nothing was written.
                drop(con);
                self.clear();
                let mut con = self.open_within(started).map_err(TryRunError::NotSent)?;
                let r = f(&mut con).map_err(TryRunError::Failed)?;
                self.put_back(con, false);
                Ok(r)
            }
            Err(e) => Err(TryRunError::Failed(e)),
        }
    }

    /// As [`run`](Pool::run), but sends `f` once: a pooled connection that
    /// turns out dead is not replaced and the call not resent (for callers
    /// that must tell "applied before" from "applied now").
    pub(crate) fn run_once<R>(
        &self,
        access: Access,
        mut f: impl FnMut(&mut Conn) -> redis::RedisResult<R>,
    ) -> Result<R, Error> {
        let (mut con, was_idle) = self.get()?;
        match f(&mut con) {
            Ok(r) => {
                self.put_back(con, was_idle);
                Ok(r)
            }
            Err(e) => Err(Error::from_redis(e, access)),
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

/// A connection that died while idle: reset, closed or broken, not slow.
fn died_while_idle(e: &redis::RedisError) -> bool {
    e.is_connection_dropped() && !e.is_timeout()
}

/// The error of a call made after shutdown.
pub(crate) fn shut_down() -> Error {
    Error::new(ErrorKind::Shutdown, "redwheel is shut down")
}
