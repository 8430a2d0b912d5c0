//! The driver: the one place where Redis deadlines become wheel timeouts.
//!
//! Higher layers register **due work**: a key, a first deadline, and a
//! [`Job`] that sends one round of commands and reads their replies into
//! its [`Next`] deadline. The driver thread runs jobs when they fall due;
//! everything about *when* lives here:
//!
//! * **One wheel timeout per key**, replaced only by an earlier deadline
//!   ([`Driver::announce`]): a stale, later deadline (a reply that crossed
//!   an announcement on the wire) never pushes an earlier one back.
//! * **Rounds**: every job due at once (in the same wheel tick, or marked due
//!   while the previous round was on the wire) runs in one round, one
//!   pipelined round trip per connection, not one round trip per job. The
//!   wheel's executor ([`Executor::end_of_tick`]) wakes the driver once per
//!   tick, after the tick's last timeout, so a tick's jobs are never split.
//! * **Fairness**: a job that reports more work waiting ([`Next::Again`],
//!   a full batch) goes to the back of the line: it runs again in the next
//!   round, beside whatever fell due meanwhile, so one key's burst cannot
//!   delay another key's deadline by more than one round.
//! * **Guard sweeps**: each key may join a guard group (its interval); one
//!   recurring wheel timeout per interval marks every key of the group due, so
//!   a lost wake-up or a dead process never strands work for longer than
//!   the interval, at one pipelined round trip per connection per interval.
//!   A job may answer a sweep with a *probe* ([`Job::sweep`]): one cheap
//!   read instead of its full commands, whose reply says whether the full
//!   commands must run now ([`Next::Again`], in the next round) or when
//!   ([`Next::After`]). Any other reason to run (a deadline, an
//!   announcement, a retry, a reconnect) runs the job in full
//!   ([`Job::run_in_full`]), so a probe never stands in for a due run for
//!   longer than one round.
//! * **Retries**: a job that fails runs again after a capped exponential
//!   backoff (logged with `tracing`); a round whose connection failed is
//!   retried after the reconnect backoff, and after a reconnect every job
//!   runs at once (Redis may have restarted without the state we saw).
//! * **A backstop**: the driver thread also waits, on its own, for the
//!   earliest armed deadline (plus [`DriverConfig::backstop_grace`]), so a
//!   wheel thread that is held up (descheduled, or a slow task) delays no
//!   deadline by more than the grace.
//! * **Shutdown**: stops after the round in flight; waits are bounded.
//!
//! # Ground rules
//!
//! * The state (`State`) is one mutex, never held across Redis I/O. Wheel
//!   tasks take it briefly to mark a key due; the driver thread takes it to
//!   take a round and to apply its outcomes.
//! * A key is in `State::due` at most once (`Entry::marked`).
//! * `Entry::timeout` is the key's one live wheel timeout, if any.
//! * Local times are readings of the wheel's clock, so a manual clock
//!   drives the driver in tests exactly as the real one does in production.
mod backstop;
mod deadlines;
mod job;
mod round;
mod stats;
mod wake;

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use parking_lot::Mutex;

use self::deadlines::{DriverShared, Entry, State, arm_clock_refresh, arm_guard};
pub(crate) use self::job::{Commands, Deadline, Job, Next, Replies, Transport};
pub(crate) use self::round::DriverConfig;
use self::round::Runner;
use self::stats::Counters;
pub use self::stats::DriverStats;
use self::wake::{Msg, Notifier, TickBatcher};
use super::server_clock::ServerClock;
use crate::error::{Error, ErrorKind};
use crate::telemetry::DriverMetrics;
use crate::timer::{Clock, HashedWheelTimer, Timeout};

/// The registered due work and the thread that runs it.
pub(crate) struct Driver {
    shared: Arc<DriverShared>,
    thread: Mutex<Option<JoinHandle<()>>>,
    done: Receiver<()>,
}

impl fmt::Debug for Driver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Driver")
            .field("keys", &self.shared.state.lock().by_key.len())
            .finish_non_exhaustive()
    }
}

impl Driver {
    /// Starts the driver thread (named `thread_name`) on a new 1 ms wheel
    /// driven by `clock`, sending rounds through `transport`.
    pub(crate) fn start(
        config: DriverConfig,
        transport: impl Transport,
        clock: impl Clock,
        server_clock: Arc<ServerClock>,
        thread_name: &str,
    ) -> Result<Driver, Error> {
        let (tx, rx) = crossbeam_channel::unbounded();
        let notifier = Notifier {
            tx,
            notified: Arc::new(AtomicBool::new(false)),
        };
        let timer = HashedWheelTimer::builder()
            .tick_duration(Duration::from_millis(1))
            .ticks_per_wheel(512)
            .thread_name(format!("{thread_name}-wheel"))
            .clock(clock)
            .executor(TickBatcher(notifier.clone()))
            .build()?;
        timer.start()?;
        let shared = Arc::new_cyclic(|me| DriverShared {
            me: Weak::clone(me),
            timer,
            server_clock,
            state: Mutex::new(State::default()),
            notifier,
            stopping: AtomicBool::new(false),
            clock_due: AtomicBool::new(false),
            stats: Counters::default(),
            metrics: DriverMetrics::new(),
        });
        if let Some(every) = config.clock_refresh {
            arm_clock_refresh(&shared, every);
        }
        let (done_tx, done) = crossbeam_channel::bounded(1);
        let s = Arc::clone(&shared);
        let thread = thread::Builder::new()
            .name(thread_name.to_owned())
            .spawn(move || {
                Runner::new(s, transport, rx, config).run();
                let _ = done_tx.send(());
            })
            .map_err(|e| {
                Error::new(ErrorKind::Spawn, "could not start the driver thread").with_cause(e)
            })?;
        Ok(Driver {
            shared,
            thread: Mutex::new(Some(thread)),
            done,
        })
    }

    /// The driver's wheel, for the futures' waits (feature `async`): their
    /// tasks only fire a wake-up cell.
    #[cfg(feature = "async")]
    pub(crate) fn wheel(&self) -> &HashedWheelTimer {
        &self.shared.timer
    }

    /// The local clock (the wheel's).
    pub(crate) fn now(&self) -> Duration {
        self.shared.timer.now()
    }

    /// Registers `job` under `key`, first due at `first`, and in the guard
    /// group of `guard` if given. False (and nothing changes) if `key` is
    /// registered already.
    pub(crate) fn register(
        &self,
        key: &str,
        job: Arc<dyn Job>,
        first: Deadline,
        guard: Option<Duration>,
    ) -> bool {
        let key: Arc<str> = Arc::from(key);
        let mut st = self.shared.state.lock();
        if st.by_key.contains_key(&key) {
            return false;
        }
        st.next_epoch += 1;
        let epoch = st.next_epoch;
        let index = st.entries.insert(Entry {
            key: Arc::clone(&key),
            job,
            epoch,
            timeout: None,
            marked: false,
            failures: 0,
            reloaded: false,
            guard: None,
        });
        st.by_key.insert(key, index);
        if let Some(every) = guard {
            let group = st.guards.entry(every).or_default();
            group.members.push(index);
            let pos = group.members.len() - 1;
            if group.timeout.is_none() {
                group.timeout = arm_guard(&self.shared, every);
            }
            st.entries[index].guard = Some((every, pos));
        }
        let now = self.now();
        let notify = self.shared.deadline(&mut st, index, first, now);
        drop(st);
        if notify {
            self.shared.notifier.notify();
        }
        true
    }

    /// Forgets `key`: its timeout is cancelled, it leaves its guard group,
    /// and a round in flight that includes it has no effect on it. A later
    /// `register` of the same key starts afresh.
    #[allow(dead_code)] // used by locks and reliable consumers
    pub(crate) fn unregister(&self, key: &str) {
        let mut st = self.shared.state.lock();
        let Some(index) = st.by_key.remove(key) else {
            return;
        };
        let entry = st.entries.remove(index);
        if let Some(a) = entry.timeout {
            a.timeout.cancel();
        }
        if let Some((every, pos)) = entry.guard
            && let Some(group) = st.guards.get_mut(&every)
        {
            group.members.swap_remove(pos);
            if let Some(&moved) = group.members.get(pos)
                && let Some(e) = st.entries.get_mut(moved)
            {
                e.guard = Some((every, pos));
            }
            if st.guards.get(&every).is_some_and(|g| g.members.is_empty())
                && let Some(mut group) = st.guards.remove(&every)
                && let Some(t) = group.timeout.take()
            {
                t.cancel();
            }
        }
        // Left in `due` if marked: a round skips slots whose epoch moved on
        // (or that are empty).
    }

    /// Makes sure `key` runs by `at`: an earlier deadline than the pending
    /// one replaces it, a later one changes nothing.
    pub(crate) fn announce(&self, key: &str, at: Deadline) {
        let now = self.now();
        let mut st = self.shared.state.lock();
        let Some(&index) = st.by_key.get(key) else {
            return;
        };
        let notify = self.shared.deadline(&mut st, index, at, now);
        drop(st);
        if notify {
            self.shared.notifier.notify();
        }
    }

    /// How long from now until the server's clock reads `ms` (epoch ms),
    /// by the clock estimate, with the estimate's round trip added so the
    /// wait is never short: `Some(Duration::ZERO)` when that time has
    /// come, `None` before any estimate.
    pub(crate) fn until_server_ms(&self, ms: i64) -> Option<Duration> {
        let now = self.now();
        let sample = self.shared.server_clock.sample()?;
        let at = self.shared.server_clock.to_local(ms, now)?;
        Some(at.saturating_add(sample.rtt).saturating_sub(now))
    }

    /// Runs `task` on the wheel's thread `delay` from now (at the end of
    /// that tick, so it must be brief); `None` (and `task` dropped) if the
    /// wheel has stopped.
    pub(crate) fn after(
        &self,
        delay: Duration,
        task: impl FnOnce() + Send + 'static,
    ) -> Option<Timeout> {
        self.shared
            .timer
            .new_timeout(delay, move |_: &Timeout| task())
            .ok()
    }

    /// Runs every registered job in the next round.
    #[cfg_attr(not(test), allow(dead_code))] // cluster topology changes
    pub(crate) fn run_all(&self) {
        self.shared.mark_all_due();
        self.shared.notifier.notify();
    }

    /// What the driver did so far.
    pub(crate) fn stats(&self) -> DriverStats {
        self.shared.stats.snapshot()
    }

    /// When `key`'s wheel timeout fires, on the local clock, if one is
    /// pending.
    pub(crate) fn scheduled_at(&self, key: &str) -> Option<Duration> {
        let st = self.shared.state.lock();
        let index = *st.by_key.get(key)?;
        st.entries.get(index)?.timeout.as_ref().map(|a| a.at)
    }

    /// Test hook: runs `task` on the wheel's thread after `delay`, as a
    /// wheel task (so a slow one holds the wheel up).
    pub(crate) fn run_on_wheel_for_tests(
        &self,
        delay: Duration,
        task: impl FnOnce() + Send + 'static,
    ) -> Result<(), Error> {
        self.shared
            .timer
            .new_timeout(delay, move |_: &Timeout| task())
            .map(|_| ())
            .map_err(Error::from)
    }

    /// Waits until the driver has finished the round that follows this
    /// call (or found nothing to do): whatever was due when it was called
    /// has run.
    #[allow(dead_code)] // tests
    pub(crate) fn settle(&self) {
        let (tx, rx) = crossbeam_channel::bounded(1);
        if self.shared.notifier.tx.send(Msg::Barrier(tx)).is_ok() {
            let _ = rx.recv();
        }
    }

    /// Stops the wheel and the driver thread, waiting until `deadline`
    /// (`None`: as long as it takes) for the thread (busy with a round) to
    /// end. Registered work stays in Redis; nothing more runs here.
    pub(crate) fn shutdown(&self, deadline: Option<Instant>) -> Result<(), Error> {
        self.shared.stopping.store(true, Ordering::SeqCst);
        let _ = self.shared.notifier.tx.send(Msg::Stop);
        if let Err(e) = self.shared.timer.stop() {
            tracing::warn!(target: "redwheel::runtime", error = %e, "could not stop the driver's wheel");
        }
        let Some(handle) = self.thread.lock().take() else {
            return Ok(());
        };
        let ended = match deadline {
            Some(d) => self.done.recv_deadline(d).map_err(drop),
            None => self.done.recv().map_err(drop),
        };
        match ended {
            Ok(()) => {
                let _ = handle.join();
                Ok(())
            }
            Err(_) => {
                // Still on the wire; it ends on its own after its I/O
                // timeout.
                Err(Error::new(
                    ErrorKind::ShutdownTimeout,
                    "shutdown timed out; the driver thread is still running a round",
                ))
            }
        }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        let _ = self.shared.notifier.tx.send(Msg::Stop);
        let _ = self.shared.timer.stop();
    }
}

#[cfg(test)]
mod test_rig;
#[cfg(test)]
mod tests;
