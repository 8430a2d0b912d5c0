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

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use parking_lot::Mutex;
use redis::{Script, Value};
use slab::Slab;

use super::backoff::Backoff;
use super::server_clock::{ClockSample, MAX_AHEAD, ServerClock};
use crate::error::{Access, Error, ErrorKind};
use crate::telemetry::DriverMetrics;
use crate::timer::{Clock, Executor, HashedWheelTimer, Job as WheelJob, Timeout};

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
    /// Reads the replies to its commands (none is an error reply) and says
    /// when to run next.
    fn on_reply(&self, replies: &[Value]) -> Result<Next, Error>;
}

/// When a job wants to run again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Next {
    /// After this long, counted on the local clock from the reply's arrival
    /// (at most [`MAX_AHEAD`]; a longer wait runs early, once, to look
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

    fn clear(&mut self) {
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
    /// Loads `script` (after a `NOSCRIPT` reply).
    fn load_script(&mut self, script: &Script) -> Result<(), Error>;
    /// How many connections were established so far (the driver re-runs
    /// every job when this grows past 1: a reconnect).
    fn connects(&self) -> u64;
    /// Round trips made so far (a round is one per connection it used).
    fn round_trips(&self) -> u64;
    /// Measures the server's clock, if connected.
    fn measure_clock(&mut self, now: &dyn Fn() -> Duration) -> Option<ClockSample>;
}

/// The driver's settings.
#[derive(Debug, Clone)]
pub(crate) struct DriverConfig {
    /// Backoff of a job whose commands failed: first wait.
    pub job_backoff_min: Duration,
    /// Backoff of a job whose commands failed: longest wait.
    pub job_backoff_max: Duration,
    /// Backoff of rounds while Redis is unreachable: first wait.
    pub reconnect_min: Duration,
    /// Backoff of rounds while Redis is unreachable: longest wait.
    pub reconnect_max: Duration,
    /// How often the server clock estimate is refreshed (`None`: never).
    pub clock_refresh: Option<Duration>,
    /// How long after an armed deadline the driver stops waiting for the
    /// wheel to fire it and runs the job itself.
    pub backstop_grace: Duration,
}

impl Default for DriverConfig {
    fn default() -> Self {
        DriverConfig {
            job_backoff_min: Duration::from_millis(100),
            job_backoff_max: Duration::from_secs(5),
            reconnect_min: Duration::from_millis(10),
            reconnect_max: Duration::from_millis(50),
            clock_refresh: Some(Duration::from_secs(30)),
            backstop_grace: Duration::from_millis(5),
        }
    }
}

/// Shortest time between two updates of the wheel gauges.
const GAUGE_INTERVAL: Duration = Duration::from_millis(100);

/// Most jobs in one round.
pub(crate) const MAX_ROUND: usize = 16_384;

/// Counters of what the driver did (diagnostics, benchmarks, tests).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DriverStats {
    /// Rounds sent.
    pub rounds: u64,
    /// Round trips those rounds made: one per round on one server, one per
    /// master the round had commands for on a cluster.
    pub round_trips: u64,
    /// Commands sent in those rounds.
    pub commands: u64,
    /// Rounds that failed as a whole (connection errors).
    pub failed_rounds: u64,
    /// Jobs whose commands failed.
    pub job_failures: u64,
    /// Reconnects after which every job was run again.
    pub reconnects: u64,
}

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

struct DriverShared {
    /// Itself, for the wheel tasks (weak: the wheel must not keep the
    /// driver alive).
    me: Weak<DriverShared>,
    timer: HashedWheelTimer,
    server_clock: Arc<ServerClock>,
    state: Mutex<State>,
    notifier: Notifier,
    stopping: AtomicBool,
    clock_due: AtomicBool,
    stats: Counters,
    /// The same events for the `metrics` feature (no-ops without it).
    metrics: DriverMetrics,
}

#[derive(Default)]
struct Counters {
    rounds: AtomicU64,
    round_trips: AtomicU64,
    commands: AtomicU64,
    failed_rounds: AtomicU64,
    job_failures: AtomicU64,
    reconnects: AtomicU64,
}

/// Registered work. Entries live in a slab; everything on the hot path
/// (wheel tasks, sweeps, rounds) refers to them by slab index, checked by
/// epoch, and only registration and announcements look a key up by name.
#[derive(Default)]
struct State {
    entries: Slab<Entry>,
    by_key: HashMap<Arc<str>, usize>,
    due: VecDeque<usize>,
    /// Every armed deadline, earliest first, for the backstop: (at, slot,
    /// epoch). Stale items (the deadline was replaced, fired or dropped)
    /// are skipped when they come up.
    armed: BinaryHeap<Reverse<(Duration, usize, u64)>>,
    guards: HashMap<Duration, Guard>,
    next_epoch: u64,
}

struct Entry {
    key: Arc<str>,
    job: Arc<dyn Job>,
    /// Tells this registration from an earlier one in the same slot.
    epoch: u64,
    timeout: Option<Armed>,
    marked: bool,
    failures: u32,
    /// Its guard group, and its place in the group's list.
    guard: Option<(Duration, usize)>,
}

impl State {
    /// The entry at `index` if it is still the registration `epoch`.
    fn live(&mut self, index: usize, epoch: u64) -> Option<&mut Entry> {
        self.entries.get_mut(index).filter(|e| e.epoch == epoch)
    }
}

struct Armed {
    at: Duration,
    timeout: Timeout,
}

#[derive(Default)]
struct Guard {
    members: Vec<usize>,
    timeout: Option<Timeout>,
}

enum Msg {
    Ready,
    Barrier(Sender<()>),
    Stop,
}

/// Wakes the driver thread, at most one message in flight.
#[derive(Clone)]
struct Notifier {
    tx: Sender<Msg>,
    notified: Arc<AtomicBool>,
}

impl Notifier {
    fn notify(&self) {
        if !self.notified.swap(true, Ordering::AcqRel) {
            let _ = self.tx.send(Msg::Ready);
        }
    }
}

/// The wheel's executor: runs each expired task at once (it only marks a
/// key, under a short lock) and wakes the driver once per tick.
struct TickBatcher(Notifier);

impl Executor for TickBatcher {
    fn execute(&self, job: WheelJob) -> Result<(), WheelJob> {
        job.run();
        Ok(())
    }

    fn end_of_tick(&self) {
        self.0.notify();
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
                let mut runner = Runner {
                    shared: s,
                    transport,
                    rx,
                    reconnect: Backoff::new(config.reconnect_min, config.reconnect_max),
                    refused: Backoff::new(config.job_backoff_min, config.job_backoff_max),
                    config,
                    seen_connects: 0,
                    commands: Commands::default(),
                    round: Vec::new(),
                    outcomes: Vec::new(),
                    unavailable_since: None,
                    gauges_at: None,
                };
                runner.run();
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

    /// Runs every registered job in the next round.
    #[cfg_attr(not(test), allow(dead_code))] // cluster topology changes
    pub(crate) fn run_all(&self) {
        self.shared.mark_all_due();
        self.shared.notifier.notify();
    }

    /// What the driver did so far.
    pub(crate) fn stats(&self) -> DriverStats {
        let c = &self.shared.stats;
        DriverStats {
            rounds: c.rounds.load(Ordering::Relaxed),
            round_trips: c.round_trips.load(Ordering::Relaxed),
            commands: c.commands.load(Ordering::Relaxed),
            failed_rounds: c.failed_rounds.load(Ordering::Relaxed),
            job_failures: c.job_failures.load(Ordering::Relaxed),
            reconnects: c.reconnects.load(Ordering::Relaxed),
        }
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

    /// Stops the wheel and the driver thread, waiting until `deadline` for
    /// the thread (busy with a round) to end. Registered work stays in
    /// Redis; nothing more runs here.
    pub(crate) fn shutdown(&self, deadline: Instant) -> Result<(), Error> {
        self.shared.stopping.store(true, Ordering::SeqCst);
        let _ = self.shared.notifier.tx.send(Msg::Stop);
        if let Err(e) = self.shared.timer.stop() {
            tracing::warn!(target: "redwheel::runtime", error = %e, "could not stop the driver's wheel");
        }
        let Some(handle) = self.thread.lock().take() else {
            return Ok(());
        };
        match self.done.recv_deadline(deadline) {
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

impl DriverShared {
    /// Applies deadline `at` to the entry at `index` (which exists). True
    /// when it was marked due and the driver must be woken.
    fn deadline(&self, st: &mut State, index: usize, at: Deadline, now: Duration) -> bool {
        let local = match at {
            Deadline::Now => None,
            Deadline::After(d) => Some(now.saturating_add(d)),
            // No estimate yet: run it and let its reply schedule it.
            Deadline::ServerMs(ms) => self.server_clock.to_local(ms, now),
        };
        match local {
            Some(t) if t > now => {
                self.arm_earlier(st, index, t, now);
                false
            }
            _ => mark_due(st, index),
        }
    }

    /// Makes sure the entry at `index` has a wheel timeout firing at `at`
    /// or earlier.
    fn arm_earlier(&self, st: &mut State, index: usize, at: Duration, now: Duration) {
        let Some(entry) = st.entries.get_mut(index) else {
            return;
        };
        if let Some(a) = &entry.timeout {
            if a.at <= at {
                return;
            }
            a.timeout.cancel();
        }
        entry.timeout = None;
        // Never zero: a job that keeps asking for "now" through a deadline
        // runs once per tick at most, never in a busy loop.
        let delay = at.saturating_sub(now).max(Duration::from_micros(1));
        tracing::trace!(target: "redwheel::runtime", key = %entry.key, delay_us = delay.as_micros() as u64, "arm");
        let epoch = entry.epoch;
        let weak = Weak::clone(&self.me);
        match self
            .timer
            .new_timeout(delay, move |t: &Timeout| fire_key(&weak, index, epoch, t))
        {
            Ok(timeout) => {
                entry.timeout = Some(Armed { at, timeout });
                // A new earliest deadline: the driver thread, if it waits,
                // waits for a later one; have it look again.
                if st
                    .armed
                    .peek()
                    .is_none_or(|Reverse((first, ..))| at < *first)
                {
                    self.notifier.notify();
                }
                st.armed.push(Reverse((at, index, epoch)));
                if st.armed.len() > 4 * st.entries.len() + 1_024 {
                    compact_armed(st);
                }
            }
            Err(e) => {
                if !self.stopping.load(Ordering::Relaxed) {
                    tracing::warn!(
                        target: "redwheel::runtime",
                        key = %entry.key,
                        error = %e,
                        "could not schedule due work on the wheel; the guard sweep will run it"
                    );
                }
            }
        }
    }

    /// The earliest armed deadline, if any (stale items are dropped).
    fn earliest_armed(&self) -> Option<Duration> {
        let mut st = self.state.lock();
        while let Some(&Reverse((at, index, epoch))) = st.armed.peek() {
            if is_armed_at(&st, index, epoch, at) {
                return Some(at);
            }
            st.armed.pop();
        }
        None
    }

    /// Runs the jobs whose deadline passed more than `grace` ago without
    /// the wheel firing them; true if it marked any.
    fn backstop(&self, now: Duration, grace: Duration) -> bool {
        let mut st = self.state.lock();
        let mut marked = 0;
        while let Some(&Reverse((at, index, epoch))) = st.armed.peek() {
            if at.saturating_add(grace) > now {
                break;
            }
            st.armed.pop();
            if !is_armed_at(&st, index, epoch, at) {
                continue;
            }
            if let Some(a) = st.entries[index].timeout.take() {
                a.timeout.cancel();
            }
            if mark_due(&mut st, index) {
                marked += 1;
            }
        }
        if marked > 0 {
            tracing::debug!(
                target: "redwheel::runtime",
                jobs = marked,
                "the wheel did not fire these deadlines in time; the driver runs them"
            );
        }
        marked > 0
    }

    fn mark_all_due(&self) {
        let mut st = self.state.lock();
        let all: Vec<usize> = st.entries.iter().map(|(i, _)| i).collect();
        for i in all {
            mark_due(&mut st, i);
        }
    }
}

/// True if the entry at `index` (registration `epoch`) has a timeout armed
/// for `at`.
fn is_armed_at(st: &State, index: usize, epoch: u64, at: Duration) -> bool {
    st.entries
        .get(index)
        .is_some_and(|e| e.epoch == epoch && e.timeout.as_ref().is_some_and(|a| a.at == at))
}

/// Rebuilds the backstop heap from the live timeouts only.
fn compact_armed(st: &mut State) {
    let live: Vec<Reverse<(Duration, usize, u64)>> = st
        .entries
        .iter()
        .filter_map(|(i, e)| e.timeout.as_ref().map(|a| Reverse((a.at, i, e.epoch))))
        .collect();
    st.armed = BinaryHeap::from(live);
}

/// Puts the entry at `index` in the next round unless it is there already.
/// True if it was added.
fn mark_due(st: &mut State, index: usize) -> bool {
    match st.entries.get_mut(index) {
        Some(entry) if !entry.marked => {
            entry.marked = true;
            st.due.push_back(index);
            true
        }
        _ => false,
    }
}

/// A key's wheel timeout fired (on the wheel thread; the executor wakes the
/// driver at the end of the tick).
fn fire_key(weak: &Weak<DriverShared>, index: usize, epoch: u64, t: &Timeout) {
    let Some(shared) = weak.upgrade() else { return };
    let mut st = shared.state.lock();
    let Some(entry) = st.live(index, epoch) else {
        return;
    };
    if entry.timeout.as_ref().is_some_and(|a| a.timeout.ptr_eq(t)) {
        entry.timeout = None;
    }
    mark_due(&mut st, index);
}

/// Arms the recurring guard sweep of interval `every`.
fn arm_guard(shared: &Arc<DriverShared>, every: Duration) -> Option<Timeout> {
    let weak = Arc::downgrade(shared);
    shared
        .timer
        .new_timeout(every, move |_: &Timeout| {
            let Some(shared) = weak.upgrade() else { return };
            let mut st = shared.state.lock();
            let st = &mut *st;
            let Some(group) = st.guards.get(&every) else {
                return;
            };
            for &i in &group.members {
                if let Some(entry) = st.entries.get_mut(i)
                    && !entry.marked
                {
                    entry.marked = true;
                    st.due.push_back(i);
                }
            }
            let next = arm_guard(&shared, every);
            if let Some(g) = st.guards.get_mut(&every) {
                g.timeout = next;
            }
        })
        .ok()
}

/// Arms the recurring clock refresh.
fn arm_clock_refresh(shared: &Arc<DriverShared>, every: Duration) {
    let weak = Arc::downgrade(shared);
    let armed = shared.timer.new_timeout(every, move |_: &Timeout| {
        let Some(shared) = weak.upgrade() else { return };
        shared.clock_due.store(true, Ordering::Release);
        shared.notifier.notify();
        arm_clock_refresh(&shared, every);
    });
    if let Err(e) = armed {
        // Only a stopped wheel refuses (shutdown): nothing left to refresh.
        tracing::debug!(target: "redwheel::runtime", error = %e, "clock refresh not armed again");
    }
}

/// The driver thread's state.
struct Runner<T: Transport> {
    shared: Arc<DriverShared>,
    transport: T,
    rx: Receiver<Msg>,
    config: DriverConfig,
    reconnect: Backoff,
    /// Rounds refused for a reason retrying fast will not mend
    /// (credentials, TLS, ACL): a slower schedule, reset by a success.
    refused: Backoff,
    seen_connects: u64,
    commands: Commands,
    /// The round being run (kept to reuse its allocation).
    round: Vec<Slot>,
    /// Each job's outcome in that round.
    outcomes: Vec<Result<Next, Error>>,
    /// When the current outage began (for one log line per outage).
    unavailable_since: Option<Duration>,
    /// When the wheel gauges were last set.
    gauges_at: Option<Duration>,
}

/// One job of a round: its key and registration, and where its commands
/// sit among the round's.
struct Slot {
    index: usize,
    epoch: u64,
    job: Arc<dyn Job>,
    first: usize,
    count: usize,
}

impl<T: Transport> Runner<T> {
    fn run(&mut self) {
        let mut barriers: Vec<Sender<()>> = Vec::new();
        loop {
            // Wait for work unless some is marked already.
            let idle = {
                let st = self.shared.state.lock();
                st.due.is_empty()
            } && !self.shared.clock_due.load(Ordering::Acquire);
            if idle && barriers.is_empty() {
                let grace = self.config.backstop_grace;
                let msg = match self.shared.earliest_armed() {
                    None => self.rx.recv().map_err(|_| ()),
                    Some(at) => {
                        let wait = at
                            .saturating_sub(self.shared.timer.now())
                            .saturating_add(grace);
                        match self.rx.recv_timeout(wait) {
                            Ok(msg) => Ok(msg),
                            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                                let now = self.shared.timer.now();
                                self.shared.backstop(now, grace);
                                Ok(Msg::Ready)
                            }
                            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => Err(()),
                        }
                    }
                };
                match msg {
                    Ok(msg) => {
                        if self.handle(msg, &mut barriers) {
                            break;
                        }
                    }
                    Err(()) => break,
                }
            }
            let mut stop = false;
            while let Ok(msg) = self.rx.try_recv() {
                stop |= self.handle(msg, &mut barriers);
            }
            if stop || self.shared.stopping.load(Ordering::SeqCst) {
                break;
            }
            self.shared
                .notifier
                .notified
                .store(false, Ordering::Release);
            if self.shared.clock_due.swap(false, Ordering::AcqRel) {
                self.refresh_clock();
            }
            let mut round = std::mem::take(&mut self.round);
            self.take_round(&mut round);
            if !round.is_empty() {
                self.run_round(&mut round);
            }
            round.clear();
            if round.capacity() > MAX_ROUND {
                round = Vec::new();
            }
            self.round = round;
            for b in barriers.drain(..) {
                let _ = b.send(());
            }
        }
        for b in barriers.drain(..) {
            let _ = b.send(());
        }
        tracing::debug!(target: "redwheel::runtime", "driver thread ends");
    }

    /// True on `Stop`.
    fn handle(&mut self, msg: Msg, barriers: &mut Vec<Sender<()>>) -> bool {
        match msg {
            Msg::Ready => false,
            Msg::Barrier(tx) => {
                barriers.push(tx);
                false
            }
            Msg::Stop => true,
        }
    }

    fn refresh_clock(&mut self) {
        let timer = self.shared.timer.clone();
        if let Some(sample) = self.transport.measure_clock(&|| timer.now()) {
            self.shared.server_clock.set(sample);
        }
    }

    /// Takes up to [`MAX_ROUND`] marked keys, in the order they were
    /// marked.
    fn take_round(&mut self, round: &mut Vec<Slot>) {
        let mut st = self.shared.state.lock();
        let st = &mut *st;
        while round.len() < MAX_ROUND {
            let Some(index) = st.due.pop_front() else {
                break;
            };
            let Some(entry) = st.entries.get_mut(index) else {
                continue;
            };
            if !entry.marked {
                continue; // a slot reused after an unregister
            }
            entry.marked = false;
            round.push(Slot {
                index,
                epoch: entry.epoch,
                job: Arc::clone(&entry.job),
                first: 0,
                count: 0,
            });
        }
    }

    fn run_round(&mut self, round: &mut [Slot]) {
        self.commands.clear();
        for slot in round.iter_mut() {
            slot.first = self.commands.len();
            slot.job.commands(&mut self.commands);
            slot.count = self.commands.len() - slot.first;
        }
        let span = tracing::debug_span!(
            target: "redwheel::runtime",
            "round",
            jobs = round.len(),
            commands = self.commands.len(),
            elapsed_us = tracing::field::Empty
        );
        // A round whose jobs had nothing to send this time (a group job
        // with no member ready) is no round trip: the redis crate refuses
        // an empty pipeline, and the connection would be dropped for it.
        let empty = self.commands.len() == 0;
        let result = if empty {
            Ok(Vec::new())
        } else {
            // Timed only if someone looks (the feature, or the span).
            let sent = (cfg!(feature = "metrics") || !span.is_disabled()).then(Instant::now);
            let result = span.in_scope(|| self.transport.round_trip(&self.commands));
            if let Some(sent) = sent {
                let took = sent.elapsed();
                self.shared
                    .metrics
                    .round_duration
                    .record(took.as_secs_f64());
                span.record("elapsed_us", took.as_micros() as u64);
            }
            result
        };
        let now = self.shared.timer.now();
        let shared = Arc::clone(&self.shared);
        let stats = &shared.stats;
        if !empty {
            stats.rounds.fetch_add(1, Ordering::Relaxed);
        }
        self.set_wheel_gauges(now);
        stats
            .commands
            .fetch_add(self.commands.len() as u64, Ordering::Relaxed);
        stats
            .round_trips
            .store(self.transport.round_trips(), Ordering::Relaxed);
        let connects = self.transport.connects();
        let reconnected = connects > self.seen_connects && self.seen_connects > 0;
        self.seen_connects = connects;
        match result {
            Err(e) => self.round_failed(round, &e, now),
            Ok(replies) => {
                if let Some(since) = self.unavailable_since.take() {
                    tracing::info!(
                        target: "redwheel::runtime",
                        down_ms = now.saturating_sub(since).as_millis() as u64,
                        "redis is reachable again"
                    );
                }
                self.reconnect.reset();
                self.refused.reset();
                self.apply_replies(round, &replies, now);
            }
        }
        if reconnected {
            stats.reconnects.fetch_add(1, Ordering::Relaxed);
            shared.metrics.reconnects.add(1);
            tracing::info!(target: "redwheel::runtime", "reconnected to redis; running every job");
            self.shared.mark_all_due();
        }
    }

    /// Sets the wheel's gauges (pending timeouts, tick lag), at most every
    /// [`GAUGE_INTERVAL`]: counting the pending timeouts reads every
    /// producer's counter.
    fn set_wheel_gauges(&mut self, now: Duration) {
        if !cfg!(feature = "metrics")
            || self
                .gauges_at
                .is_some_and(|at| now.saturating_sub(at) < GAUGE_INTERVAL)
        {
            return;
        }
        self.gauges_at = Some(now);
        let (timer, m) = (&self.shared.timer, &self.shared.metrics);
        m.wheel_pending.set(timer.pending_timeouts() as f64);
        m.tick_lag.set(timer.tick_lag().as_secs_f64());
    }

    fn round_failed(&mut self, round: &[Slot], e: &Error, now: Duration) {
        self.shared
            .stats
            .failed_rounds
            .fetch_add(1, Ordering::Relaxed);
        self.shared.metrics.rounds_failed.add(1);
        let wait = if e.is_transient() {
            self.reconnect.step()
        } else {
            // Credentials, TLS, ACL: retrying fast will not help.
            self.refused.step()
        };
        if self.unavailable_since.is_none() {
            self.unavailable_since = Some(now);
            tracing::warn!(
                target: "redwheel::runtime",
                error = %e,
                jobs = round.len(),
                retry_in_ms = wait.as_millis() as u64,
                "a round of due work failed; retrying until redis answers"
            );
        } else {
            tracing::debug!(
                target: "redwheel::runtime",
                error = %e,
                jobs = round.len(),
                retry_in_ms = wait.as_millis() as u64,
                "a round of due work failed again"
            );
        }
        let mut st = self.shared.state.lock();
        for slot in round {
            if st.live(slot.index, slot.epoch).is_some() {
                self.shared
                    .arm_earlier(&mut st, slot.index, now.saturating_add(wait), now);
            }
        }
    }

    fn apply_replies(&mut self, round: &[Slot], replies: &[Value], now: Duration) {
        let mut loaded: Vec<*const Script> = Vec::new();
        let mut outcomes = std::mem::take(&mut self.outcomes);
        for slot in round {
            let Some(mine) = replies.get(slot.first..slot.first + slot.count) else {
                outcomes.push(Err(Error::new(
                    ErrorKind::Protocol,
                    "redis sent fewer replies than commands",
                )));
                continue;
            };
            let error = mine.iter().find_map(|v| match v {
                Value::ServerError(e) => Some(e.clone()),
                _ => None,
            });
            let outcome = match error {
                Some(err) if err.code() == "NOSCRIPT" => {
                    for &script in slot.job.scripts() {
                        let ptr = script as *const Script;
                        if loaded.contains(&ptr) {
                            continue;
                        }
                        loaded.push(ptr);
                        if let Err(e) = self.transport.load_script(script) {
                            tracing::warn!(target: "redwheel::runtime", job = %slot.job.describe(), error = %e, "could not load a script");
                        }
                    }
                    Ok(Next::Again)
                }
                Some(err) => Err(Error::from_redis(
                    redis::RedisError::from(err),
                    Access::Write,
                )),
                None => slot.job.on_reply(mine),
            };
            outcomes.push(outcome);
        }
        let mut st = self.shared.state.lock();
        for (slot, outcome) in round.iter().zip(outcomes.drain(..)) {
            let Some(entry) = st.live(slot.index, slot.epoch) else {
                continue;
            };
            match outcome {
                Ok(next) => {
                    entry.failures = 0;
                    match next {
                        Next::Again => {
                            mark_due(&mut st, slot.index);
                        }
                        Next::Idle => {}
                        Next::After(d) => {
                            self.shared.arm_earlier(
                                &mut st,
                                slot.index,
                                now.saturating_add(d.min(MAX_AHEAD)),
                                now,
                            );
                        }
                    }
                }
                Err(e) => {
                    entry.failures = entry.failures.saturating_add(1);
                    let failures = entry.failures;
                    // Redis unreachable for this job (a node failing over, a
                    // slot moving): retry on the reconnect schedule. Anything
                    // else will not mend itself soon: back off further.
                    let wait = if e.is_transient() {
                        Backoff::nth(
                            self.config.reconnect_min,
                            self.config.reconnect_max,
                            failures,
                        )
                    } else {
                        Backoff::nth(
                            self.config.job_backoff_min,
                            self.config.job_backoff_max,
                            failures,
                        )
                    };
                    self.shared
                        .stats
                        .job_failures
                        .fetch_add(1, Ordering::Relaxed);
                    self.shared.metrics.job_failures.add(1);
                    if e.is_transient() && failures > 1 {
                        tracing::debug!(
                            target: "redwheel::runtime",
                            job = %slot.job.describe(),
                            error = %e,
                            failures,
                            retry_in_ms = wait.as_millis() as u64,
                            "due work failed again; will retry"
                        );
                    } else {
                        tracing::warn!(
                            target: "redwheel::runtime",
                            job = %slot.job.describe(),
                            error = %e,
                            failures,
                            retry_in_ms = wait.as_millis() as u64,
                            "due work failed; will retry"
                        );
                    }
                    self.shared
                        .arm_earlier(&mut st, slot.index, now.saturating_add(wait), now);
                }
            }
        }
        drop(st);
        self.outcomes = outcomes;
    }
}

#[cfg(test)]
#[path = "driver_tests.rs"]
mod tests;
