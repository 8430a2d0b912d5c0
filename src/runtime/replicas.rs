//! Waiting for replicas: a write is confirmed by `WAIT replicas timeout`
//! on the connection that made it, so a failover to one of those replicas
//! keeps it. The option's limits, the command and what its answer means;
//! and, for the futures (feature `async`), where such a write and its
//! `WAIT` run.
//!
//! # `WAIT` and the futures
//!
//! Redis blocks the whole connection during `WAIT`, and `WAIT` counts the
//! replicas that have *this connection's* writes, so the write and its
//! `WAIT` must share a connection that no other command waits behind: not
//! the node's multiplexed connection, which every future of the process
//! shares. A future's write with `WAIT` ([`run_alone`], or
//! `Runtime::call_alone` for a packed command) runs on a pooled
//! synchronous connection (`runtime/pool.rs`, routed as every synchronous
//! call) on one of a few threads kept for that ([`MAX_ALONE`], started
//! when needed, ended after [`IDLE_FOR`] without work); the future waits
//! for its result on a [`Cell`] without blocking its executor.

use std::time::Duration;

#[cfg(feature = "async")]
pub(crate) use self::alone::run_alone;
use super::conn::Conn;
use crate::error::{Error, ErrorKind};

/// Longest `WAIT` an option may ask for.
const MAX_WAIT: Duration = Duration::from_secs(60);

/// Room the command timeout must leave beside the `WAIT` for the write
/// itself.
const ROOM: Duration = Duration::from_millis(100);

/// Confirm writes on `replicas` replicas within `timeout`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WaitReplicas {
    pub(crate) replicas: u32,
    pub(crate) timeout: Duration,
}

impl WaitReplicas {
    /// Checks the option (`name` in messages): at least one replica, a
    /// timeout of 1 ms ..= 60 s that leaves room within `command_timeout`.
    pub(crate) fn check(&self, name: &str, command_timeout: Duration) -> Result<(), Error> {
        let bad = |why: String| {
            Err(Error::new(
                ErrorKind::InvalidOption,
                format!("invalid option `{name}`: {why}"),
            ))
        };
        if self.replicas == 0 || self.timeout < Duration::from_millis(1) || self.timeout > MAX_WAIT
        {
            return bad(format!(
                "{} replicas within {:?}: needs at least 1 replica and 1 ms ..= 60 s",
                self.replicas, self.timeout
            ));
        }
        if self.timeout + ROOM > command_timeout {
            return bad(format!(
                "a timeout of {:?} leaves no room within the command timeout of {command_timeout:?}",
                self.timeout
            ));
        }
        Ok(())
    }

    /// `WAIT`s on `con`, after a write on it: how many replicas have
    /// everything this connection wrote.
    pub(crate) fn wait(&self, con: &mut Conn) -> redis::RedisResult<i64> {
        self.command().query(con)
    }

    /// The `WAIT` command itself (sent after the write, on its connection).
    pub(crate) fn command(&self) -> redis::Cmd {
        let ms = u64::try_from(self.timeout.as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        let mut cmd = redis::cmd("WAIT");
        cmd.arg(self.replicas).arg(ms);
        cmd
    }

    /// [`confirmed`](WaitReplicas::confirmed) of `WAIT`'s reply, or its
    /// error (which confirms nothing).
    pub(crate) fn confirmed_reply(
        &self,
        acked: redis::RedisResult<i64>,
        what: &str,
    ) -> Result<(), Error> {
        acked
            .map_err(|e| Error::from_redis(e, crate::error::Access::Read))
            .and_then(|n| self.confirmed(n, what))
    }

    /// `Ok` if `acked` replicas are enough; else
    /// [`ErrorKind::NotReplicated`] saying how many confirmed `what`.
    pub(crate) fn confirmed(&self, acked: i64, what: &str) -> Result<(), Error> {
        if acked >= i64::from(self.replicas) {
            return Ok(());
        }
        Err(Error::new(
            ErrorKind::NotReplicated,
            format!(
                "{what} on the master, but only {acked} of the {} replicas asked for confirmed it within {:?}",
                self.replicas, self.timeout
            ),
        ))
    }
}

/// Most threads running writes with `WAIT` for futures at once; more
/// writes wait their turn.
#[cfg(feature = "async")]
pub(crate) const MAX_ALONE: usize = 32;

/// A thread of [`MAX_ALONE`] with nothing to do for this long ends.
#[cfg(feature = "async")]
pub(crate) const IDLE_FOR: Duration = Duration::from_secs(10);

#[cfg(feature = "async")]
mod alone {
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    use std::sync::{Arc, LazyLock};
    use std::task::{Context, Poll};

    use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
    use parking_lot::Mutex;
    use redis::Value;

    use super::{IDLE_FOR, MAX_ALONE};
    use crate::error::{Access, Error, ErrorKind};
    use crate::runtime::cluster::{Step, step_after};
    use crate::runtime::mux::Command;
    use crate::runtime::shared::Runtime;
    use crate::runtime::wait::Cell;

    type Job = Box<dyn FnOnce() + Send>;

    /// Gets the result of a job whose future was dropped.
    pub(crate) type Orphan<R> = Box<dyn FnOnce(Result<R, Error>) + Send>;

    /// The threads, and the jobs waiting for one.
    struct Workers {
        tx: Sender<Job>,
        rx: Receiver<Job>,
        /// Threads waiting for a job.
        idle: AtomicUsize,
        /// Threads alive.
        alive: AtomicUsize,
    }

    static WORKERS: LazyLock<Workers> = LazyLock::new(|| {
        let (tx, rx) = crossbeam_channel::unbounded();
        Workers {
            tx,
            rx,
            idle: AtomicUsize::new(0),
            alive: AtomicUsize::new(0),
        }
    });

    /// Queues `job`, starting a thread if none is free (up to
    /// [`MAX_ALONE`]). If no thread can be started and none is alive, the
    /// job runs here.
    fn submit(job: Job) {
        let w = &*WORKERS;
        // Sent before looking for an idle thread: a thread that is about
        // to end looks at the queue after it stopped counting as idle.
        let _ = w.tx.send(job);
        if w.idle.load(SeqCst) > 0 {
            return;
        }
        if w.alive.fetch_add(1, SeqCst) >= MAX_ALONE {
            // Every thread is busy: it waits its turn.
            w.alive.fetch_sub(1, SeqCst);
            return;
        }
        let spawned = std::thread::Builder::new()
            .name("redwheel-wait".to_owned())
            .spawn(work);
        if let Err(e) = spawned {
            tracing::warn!(target: "redwheel::runtime", error = %e, "could not start a thread for a write with WAIT");
            if w.alive.fetch_sub(1, SeqCst) == 1 {
                // Nobody would run it.
                while let Ok(job) = w.rx.try_recv() {
                    job();
                }
            }
        }
    }

    /// One thread: runs jobs until none came for [`IDLE_FOR`].
    fn work() {
        let w = &*WORKERS;
        loop {
            w.idle.fetch_add(1, SeqCst);
            let next = w.rx.recv_timeout(IDLE_FOR);
            w.idle.fetch_sub(1, SeqCst);
            match next {
                Ok(job) => job(),
                Err(RecvTimeoutError::Timeout) => {
                    w.alive.fetch_sub(1, SeqCst);
                    if w.rx.is_empty() {
                        return;
                    }
                    // A job came as it was ending (and saw it idle).
                    w.alive.fetch_add(1, SeqCst);
                }
                Err(RecvTimeoutError::Disconnected) => return,
            }
        }
    }

    /// Where a job leaves its result.
    enum State<R> {
        /// Running; the future waits.
        Running(Option<Orphan<R>>),
        /// Done, not read yet.
        Done(Result<R, Error>, Option<Orphan<R>>),
        /// The future was dropped before the result came.
        Dropped(Option<Orphan<R>>),
        /// Read (or handed to the orphan).
        Taken,
    }

    struct Slot<R> {
        cell: Cell,
        state: Mutex<State<R>>,
    }

    /// The future of [`run_alone`].
    pub(crate) struct Alone<R> {
        slot: Arc<Slot<R>>,
    }

    /// Runs `job` (blocking work: a write and its `WAIT` on a connection of
    /// its own) on one of the threads kept for it; the future gives its
    /// result. Dropped before that, the result goes to `orphan` (on that
    /// thread, or on the dropping one if it came already): it must not
    /// block.
    pub(crate) fn run_alone<R: Send + 'static>(
        job: impl FnOnce() -> Result<R, Error> + Send + 'static,
        orphan: Option<Orphan<R>>,
    ) -> Alone<R> {
        let slot = Arc::new(Slot {
            cell: Cell::default(),
            state: Mutex::new(State::Running(orphan)),
        });
        let s = Arc::clone(&slot);
        submit(Box::new(move || {
            let r =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(job)).unwrap_or_else(|_| {
                    Err(Error::new(
                        ErrorKind::Protocol,
                        "a write with WAIT panicked",
                    ))
                });
            let mut st = s.state.lock();
            match std::mem::replace(&mut *st, State::Taken) {
                State::Running(orphan) => {
                    *st = State::Done(r, orphan);
                    drop(st);
                    s.cell.fire();
                }
                State::Dropped(orphan) => {
                    drop(st);
                    if let Some(f) = orphan {
                        f(r);
                    }
                }
                other => *st = other,
            }
        }));
        Alone { slot }
    }

    impl<R> Future for Alone<R> {
        type Output = Result<R, Error>;

        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
            if self.slot.cell.poll_fired(cx).is_pending() {
                return Poll::Pending;
            }
            let mut st = self.slot.state.lock();
            match std::mem::replace(&mut *st, State::Taken) {
                State::Done(r, _) => Poll::Ready(r),
                _ => Poll::Ready(Err(Error::new(
                    ErrorKind::Protocol,
                    "a write with WAIT was polled after it completed",
                ))),
            }
        }
    }

    impl<R> Drop for Alone<R> {
        fn drop(&mut self) {
            let mut st = self.slot.state.lock();
            match std::mem::replace(&mut *st, State::Taken) {
                State::Running(orphan) => *st = State::Dropped(orphan),
                State::Done(r, Some(f)) => {
                    drop(st);
                    f(r);
                }
                _ => {}
            }
        }
    }

    impl Runtime {
        /// As [`Runtime::call`](crate::runtime::Runtime::call), for a
        /// command that ends in `WAIT`: sent on a connection of its own
        /// (see the module docs), once, following redirects and loading
        /// its script after `NOSCRIPT` as the synchronous calls do. One
        /// reply per command, an error reply in its place.
        pub(crate) fn call_alone(
            self: &Arc<Self>,
            route: &str,
            access: Access,
            command: Command,
        ) -> Alone<Vec<Value>> {
            let rt = Arc::clone(self);
            let route = route.to_owned();
            run_alone(
                move || rt.run(&route, access, |con| send_packed(con, &command)),
                None,
            )
        }
    }

    /// Sends `command` on `con`: its replies, or the error of a first reply
    /// that calls for sending it again elsewhere or later (a redirect,
    /// `TRYAGAIN`: it was not applied), for the caller's routing to follow.
    fn send_packed(
        con: &mut crate::runtime::conn::Conn,
        command: &Command,
    ) -> redis::RedisResult<Vec<Value>> {
        use redis::ConnectionLike;
        let (packed, count, script) = command.packed();
        let first_error = |values: &[Value]| match values.first() {
            Some(Value::ServerError(err)) => Some(redis::RedisError::from(err.clone())),
            _ => None,
        };
        let mut values = con.req_packed_commands(packed, 0, count)?;
        let no_script = redis::ErrorKind::Server(redis::ServerErrorKind::NoScript);
        if let Some(script) = script
            && first_error(&values).is_some_and(|e| e.kind() == no_script)
        {
            // Not run: load it, then send again.
            script.prepare_invoke().load(con)?;
            values = con.req_packed_commands(packed, 0, count)?;
        }
        if let Some(e) = first_error(&values)
            && !matches!(step_after(&e), Step::Fail)
        {
            return Err(e);
        }
        Ok(values)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_and_answers() {
        let five = Duration::from_secs(5);
        let w = |replicas, ms| WaitReplicas {
            replicas,
            timeout: Duration::from_millis(ms),
        };
        assert!(w(1, 500).check("x", five).is_ok());
        for bad in [w(0, 500), w(1, 0), w(1, 61_000), w(1, 4_950)] {
            let e = bad.check("x", five).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidOption, "{bad:?}");
        }
        assert!(w(2, 10).confirmed(2, "written").is_ok());
        let e = w(2, 10).confirmed(1, "written").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotReplicated);
        assert!(e.to_string().contains("only 1 of the 2 replicas"), "{e}");
    }
}
