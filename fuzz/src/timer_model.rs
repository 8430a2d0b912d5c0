//! A reference model of redwheel's `HashedWheelTimer`, and a harness that
//! replays a sequence of operations against a real timer on a
//! [`ManualClock`], checking the timer against the model after every step.
//!
//! Shared, word for word, by the property tests (`tests/timer_props.rs`
//! includes this file with `#[path]`) and the fuzz target
//! (`fuzz/fuzz_targets/timer_ops.rs`, through this crate's library). It
//! depends on nothing but `redwheel` and `std`, and panics on the first
//! violation, with a message saying which invariant broke.
//!
//! # The model
//!
//! Times are nanoseconds on the manual clock. The worker starts at `start`,
//! the clock reading at the first `new_timeout` (or `start()`). Tick `t`
//! covers `[start + t·tick, start + (t+1)·tick)`. A timeout created at `n`
//! with delay `d` has deadline `n + d` (saturating; `u64::MAX` means never);
//! its *due tick* is the tick that contains the deadline, and its *due end*
//! the end of that tick. Then, as long as the worker keeps up (fewer than
//! `TRANSFER_CAP` new timeouts per tick, which the harness guarantees):
//!
//! * a timeout fires during the `advance` that moves the clock to or past
//!   its due end, and in no other: never before its deadline, never before
//!   its tick ended, never late, at most once;
//! * within one `advance`, timeouts fire in due-tick order, and within a
//!   tick in creation order per producer thread (the test thread, or the
//!   worker thread running tasks): each thread's timeouts reach the wheel
//!   in the order it made them, but how two threads' timeouts interleave
//!   is not promised (SPEC HWT-W11);
//! * `cancel()` returns true iff the timeout had neither fired nor been
//!   cancelled; after a true `cancel()` it never fires;
//! * `pending_timeouts()` counts every timeout created and not fired, plus
//!   each cancelled one until the worker processes its cancellation: for a
//!   `cancel()` made by the test thread at clock time `c`, at the end of the
//!   tick that contains `c`; for one made by a task that fires during tick
//!   `k`, at the end of tick `k + 1` (the worker drains cancellations at the
//!   start of the next tick it processes);
//! * every task is dropped exactly once: right after it ran; without
//!   running, by the successful `cancel()` itself or at the latest when the
//!   worker counts the cancellation out; by `stop()`; or at once when
//!   `new_timeout` fails. A live timeout's task is never dropped;
//! * `stop()` returns exactly the timeouts neither fired nor cancelled, each
//!   now cancelled; afterwards the count is zero, `new_timeout` fails with
//!   `Stopped`, every `cancel()` returns false and nothing fires.
//!
//! Tasks run on the worker thread and record what they see and do in an
//! event log; the harness replays the log through the model after each
//! step. The test thread acts only between `advance` calls, when no tick
//! is left to process, so the log is a total order of everything that
//! happened.
//!
//! # Cost
//!
//! Once awake, the worker processes every tick that ended one by one, even
//! empty ones (it only skips ticks when it wakes from a sleep). A jump of
//! years across a deadline would therefore cost ~10^10 tick iterations, so
//! [`Step::Far`] stops a few ticks past the first due end it meets.

use std::collections::BTreeSet;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Once, OnceLock};
use std::thread;
use std::time::Duration;

use redwheel::timer::{Clock, HashedWheelTimer, ManualClock, TRANSFER_CAP, Timeout, TimerError};

/// Name of the timer's worker thread in these runs (the panic hook
/// recognises the model's deliberate task panics by it).
pub const WORKER_THREAD: &str = "redwheel-model-worker";

/// The message of a [`Task::Panic`] task's panic.
pub const TASK_PANIC: &str = "model task panics on purpose";

/// Most whole ticks one [`Step::Ticks`] advances: it bounds the catch-up
/// work of the worker (it processes ticks one by one after it wakes).
pub const MAX_STEP_TICKS: u64 = 300;

/// Most wheel turns one [`Step::Turns`] advances.
pub const MAX_STEP_TURNS: u64 = 4;

/// Most days one [`Step::Far`] jump covers (about three years).
pub const MAX_FAR_DAYS: u64 = 1100;

/// Most ticks a [`Step::Far`] jump goes past the first wake-up point it
/// meets.
pub const MAX_FAR_OVERSHOOT: u64 = 32;

/// Most times a [`Task::Rearm`] task re-arms itself.
pub const MAX_REARMS: u8 = 3;

/// Most operations replayed from one sequence (keeps a case cheap and far
/// below `TRANSFER_CAP` timeouts per tick).
pub const MAX_OPS: usize = 256;

const DAY_NS: u64 = 86_400 * 1_000_000_000;
const YEAR_NS: u64 = 365 * DAY_NS;

/// Whether the harness calls `ManualClock::settle()` after each call that
/// may wake the worker (`new_timeout`, `cancel`, `start`) before it checks
/// or moves the clock. Off by default, the stricter mode: the next
/// operation may then move the clock while the worker is still handling
/// the wake-up, and the model's timing must hold all the same. Set
/// `REDWHEEL_MODEL_SETTLE=1` to check only at quiescent points (for hunting
/// other failures should a wake-up race reappear).
fn settle_after_calls() -> bool {
    static SETTLE: OnceLock<bool> = OnceLock::new();
    *SETTLE.get_or_init(|| std::env::var_os("REDWHEEL_MODEL_SETTLE").is_some_and(|v| v == "1"))
}

/// Installs (once per process) a panic hook that stays silent for the
/// model's deliberate task panics on the worker thread and hands every
/// other panic to the hook that was installed before.
pub fn silence_task_panics() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let on_worker = thread::current().name() == Some(WORKER_THREAD);
            let payload = info.payload();
            let ours = payload.downcast_ref::<&str>() == Some(&TASK_PANIC)
                || payload.downcast_ref::<String>().map(String::as_str) == Some(TASK_PANIC);
            if !(on_worker && ours) {
                previous(info);
            }
        }));
    });
}

/// The timer's shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Config {
    /// Tick length in ns; clamped to `1 ms ..= 10 ms`.
    pub tick_ns: u64,
    /// Buckets asked for; clamped to `1..=64` (the timer rounds up to a
    /// power of two).
    pub ticks_per_wheel: usize,
}

/// A delay, given relative to the timer's shape so that interesting values
/// (zero, sub-tick, exact wheel spans, never) come up often.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Delay {
    /// Zero.
    Zero,
    /// `n % tick` nanoseconds: less than one tick.
    SubTick(u64),
    /// `ticks % 512` whole ticks plus `extra % tick` nanoseconds.
    Ticks {
        /// Whole ticks.
        ticks: u32,
        /// Nanoseconds past them.
        extra: u64,
    },
    /// `turns % 5` times the wheel's span (tick × buckets), plus `offset`
    /// nanoseconds (`-1`, `0` and `1` are the edges that matter).
    Spans {
        /// Whole wheel turns.
        turns: u32,
        /// Nanoseconds off the exact multiple (saturating at zero).
        offset: i64,
    },
    /// `1 + years % 200` years: beyond the clock of a case, or just in
    /// reach of a few [`Step::Far`] jumps.
    Years(u32),
    /// A raw nanosecond count (huge ones come from the fuzzer).
    Nanos(u64),
    /// `Duration::MAX`: saturates, never fires.
    Max,
}

/// How far one [`Op::Advance`] moves the clock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// `n % tick` nanoseconds (possibly zero, which just settles).
    SubTick(u64),
    /// To the end of the current tick, `offset % 3 - 1` nanoseconds off
    /// (one before, exactly on, one after).
    ToTickEnd(u8),
    /// `ticks % (MAX_STEP_TICKS + 1)` ticks plus `extra % tick` ns.
    Ticks {
        /// Whole ticks.
        ticks: u32,
        /// Nanoseconds past them.
        extra: u64,
    },
    /// `1 + turns % MAX_STEP_TURNS` exact wheel spans.
    Turns(u32),
    /// A jump of `1 + days % MAX_FAR_DAYS` days. So that the worker's
    /// tick-by-tick catch-up stays cheap, the jump stops
    /// `overshoot % (MAX_FAR_OVERSHOOT + 1)` ticks past the first point at
    /// which the worker can wake up (a due end, a transfer, a queued
    /// cancellation), if it meets one.
    Far {
        /// Days.
        days: u32,
        /// Ticks past the first wake-up point met.
        overshoot: u8,
    },
}

/// What a task does when it runs (it always records that it fired first).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Task {
    /// Nothing else.
    Record,
    /// Schedules a new timeout with `delay` from inside the task, whose
    /// task re-arms again, `1 + times % MAX_REARMS` times in all.
    Rearm {
        /// The delay of each new timeout.
        delay: Delay,
        /// How many more times.
        times: u8,
    },
    /// Cancels timeout number `pick % created` (maybe itself, maybe one that
    /// already fired or was cancelled).
    Cancel {
        /// Which one.
        pick: usize,
    },
    /// Cancels itself through the handle it is given: must return false.
    CancelSelf,
    /// Panics: the worker must catch it and carry on.
    Panic,
    /// Calls `stop()` from the worker thread: must fail with
    /// `StopFromTask`, and the timer must keep running.
    CallStop,
}

/// One step of a sequence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// `new_timeout(delay, task)`.
    Schedule {
        /// Its delay.
        delay: Delay,
        /// What its task does.
        task: Task,
    },
    /// `cancel()` of timeout number `pick % created`, if there is one.
    Cancel {
        /// Which one.
        pick: usize,
    },
    /// `ManualClock::advance`.
    Advance(Step),
    /// `ManualClock::settle`.
    Settle,
    /// `start()`.
    Start,
    /// `stop()`.
    Stop,
}

/// What tasks record, in the order it happened.
#[derive(Debug)]
enum Event {
    Fired {
        id: usize,
        now: u64,
        expired: bool,
        cancelled: bool,
        same_timeout: bool,
    },
    Scheduled {
        parent: usize,
        id: usize,
        now: u64,
        delay: Duration,
        result: Result<u64, String>,
    },
    /// A task is about to call `cancel()` on `target`.
    Cancelling {
        target: usize,
    },
    Cancelled {
        by: usize,
        target: usize,
        returned: bool,
    },
    CancelledSelf {
        id: usize,
        returned: bool,
    },
    StopFromTask {
        id: usize,
        result: String,
    },
    Dropped {
        id: usize,
        ran: bool,
    },
}

/// Shared by the harness and every task.
struct Recorder {
    clock: ManualClock,
    events: Mutex<Vec<Event>>,
    handles: Mutex<Vec<Option<Timeout>>>,
    next_id: AtomicUsize,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Recorder {
    fn log(&self, e: Event) {
        lock(&self.events).push(e);
    }

    fn take_events(&self) -> Vec<Event> {
        std::mem::take(&mut *lock(&self.events))
    }

    fn handle(&self, id: usize) -> Option<Timeout> {
        lock(&self.handles).get(id).cloned().flatten()
    }

    fn store(&self, id: usize, handle: Option<Timeout>) {
        let mut handles = lock(&self.handles);
        if handles.len() <= id {
            handles.resize(id + 1, None);
        }
        handles[id] = handle;
    }

    fn created(&self) -> usize {
        self.next_id.load(Ordering::SeqCst)
    }
}

/// Logs `Dropped` when the task that owns it is dropped, run or not.
struct DropGuard {
    rec: Arc<Recorder>,
    id: usize,
    ran: bool,
}

impl Drop for DropGuard {
    fn drop(&mut self) {
        self.rec.log(Event::Dropped {
            id: self.id,
            ran: self.ran,
        });
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Builds the closure for timeout `id`.
fn make_task(
    rec: &Arc<Recorder>,
    timer: &HashedWheelTimer,
    cfg: Shape,
    id: usize,
    task: Task,
) -> impl FnOnce(&Timeout) + Send + 'static {
    let guard = DropGuard {
        rec: Arc::clone(rec),
        id,
        ran: false,
    };
    let rec = Arc::clone(rec);
    // Only the tasks that need it hold a timer handle.
    let timer = matches!(task, Task::Rearm { .. } | Task::CallStop).then(|| timer.clone());
    let task = match task {
        Task::Rearm { delay, times } => Task::Rearm {
            delay,
            times: times % MAX_REARMS,
        },
        other => other,
    };
    move |t: &Timeout| {
        // Takes the whole guard (a closure would capture only the field).
        let mut guard = guard;
        guard.ran = true;
        let now = nanos(rec.clock.now());
        let same_timeout = rec.handle(id).is_some_and(|h| h.ptr_eq(t));
        rec.log(Event::Fired {
            id,
            now,
            expired: t.is_expired(),
            cancelled: t.is_cancelled(),
            same_timeout,
        });
        match task {
            Task::Record => {}
            Task::Rearm { delay, times } => {
                let timer = timer.expect("a re-arming task holds the timer");
                let child_id = rec.next_id.fetch_add(1, Ordering::SeqCst);
                let child_task = if times == 0 {
                    Task::Record
                } else {
                    Task::Rearm {
                        delay: delay.clone(),
                        times: times - 1,
                    }
                };
                let d = cfg.delay(&delay);
                let child = make_task(&rec, &timer, cfg, child_id, child_task);
                let result = timer.new_timeout(d, child);
                let logged = match &result {
                    Ok(h) => Ok(nanos(h.deadline())),
                    Err(e) => Err(e.to_string()),
                };
                rec.store(child_id, result.ok());
                rec.log(Event::Scheduled {
                    parent: id,
                    id: child_id,
                    now,
                    delay: d,
                    result: logged,
                });
            }
            Task::Cancel { pick } => {
                let created = rec.created();
                let target = pick % created;
                if let Some(h) = rec.handle(target) {
                    rec.log(Event::Cancelling { target });
                    let returned = h.cancel();
                    rec.log(Event::Cancelled {
                        by: id,
                        target,
                        returned,
                    });
                }
            }
            Task::CancelSelf => {
                let returned = t.cancel();
                rec.log(Event::CancelledSelf { id, returned });
                if let Some(h) = rec.handle(id) {
                    let returned = h.cancel();
                    rec.log(Event::CancelledSelf { id, returned });
                }
            }
            Task::Panic => panic!("{}", TASK_PANIC),
            Task::CallStop => {
                let timer = timer.expect("a stopping task holds the timer");
                let result = match timer.stop() {
                    Ok(v) => format!("Ok({} timeouts)", v.len()),
                    Err(TimerError::StopFromTask) => "StopFromTask".to_owned(),
                    Err(e) => format!("Err({e})"),
                };
                rec.log(Event::StopFromTask { id, result });
            }
        }
    }
}

/// The timer's actual shape (after the builder's rounding).
#[derive(Clone, Copy, Debug)]
struct Shape {
    tick: u64,
    wheel_len: u64,
}

impl Shape {
    fn span(self) -> u64 {
        self.tick.saturating_mul(self.wheel_len)
    }

    fn delay(self, d: &Delay) -> Duration {
        match *d {
            Delay::Zero => Duration::ZERO,
            Delay::SubTick(n) => Duration::from_nanos(n % self.tick),
            Delay::Ticks { ticks, extra } => {
                Duration::from_nanos(u64::from(ticks % 512) * self.tick + extra % self.tick)
            }
            Delay::Spans { turns, offset } => {
                let exact = i128::from(turns % 5) * i128::from(self.span());
                Duration::from_nanos(
                    (exact + i128::from(offset)).clamp(0, i128::from(u64::MAX)) as u64
                )
            }
            Delay::Years(y) => Duration::from_nanos(u64::from(1 + y % 200) * YEAR_NS),
            Delay::Nanos(n) => Duration::from_nanos(n),
            Delay::Max => Duration::MAX,
        }
    }
}

/// Where a timeout is in its life, as the model sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Scheduled, not fired, not cancelled.
    Live,
    /// Its task ran at clock time `at`.
    Fired { at: u64 },
    /// `cancel()` returned true; `pending_timeouts()` counts it until the
    /// clock reaches `counted_out_at`.
    Cancelled { counted_out_at: u64 },
    /// Returned (cancelled) by `stop()`.
    Stopped,
    /// `new_timeout` failed; nothing was scheduled.
    Failed,
}

#[derive(Clone, Debug)]
struct Entry {
    deadline: u64,
    due_tick: u64,
    /// End of the due tick; `None` if the clock can never get there.
    due_end: Option<u64>,
    /// When the worker moves it from the queue into the wheel: the end of
    /// the first tick it processes after the timeout was made.
    queued_until: u64,
    state: State,
    /// `Some(ran)` once the task was dropped.
    dropped: Option<bool>,
    /// Made by a task (on the worker thread), not by the test thread.
    by_task: bool,
}

/// The model of one timer.
#[derive(Debug)]
struct Model {
    shape: Shape,
    now: u64,
    start: Option<u64>,
    stopped: bool,
    entries: Vec<Entry>,
}

impl Model {
    fn start(&self) -> u64 {
        self.start.expect("the worker has started")
    }

    /// Tick that contains clock time `t`.
    fn tick_of(&self, t: u64) -> u64 {
        (t - self.start()) / self.shape.tick
    }

    /// End of tick `k`, or `None` past the end of the clock.
    fn end_of(&self, k: u64) -> Option<u64> {
        let end = u128::from(self.start()) + (u128::from(k) + 1) * u128::from(self.shape.tick);
        u64::try_from(end).ok().filter(|&e| e != u64::MAX)
    }

    fn entry(&self, deadline: u64, queued_until: u64) -> Entry {
        let (due_tick, due_end) = if deadline == u64::MAX {
            (u64::MAX, None)
        } else {
            let k = self.tick_of(deadline);
            (k, self.end_of(k))
        };
        Entry {
            deadline,
            due_tick,
            due_end,
            queued_until,
            state: State::Live,
            dropped: None,
            by_task: false,
        }
    }

    fn pending(&self) -> usize {
        if self.stopped {
            return 0;
        }
        self.entries
            .iter()
            .filter(|e| match e.state {
                State::Live => true,
                State::Cancelled { counted_out_at } => counted_out_at > self.now,
                _ => false,
            })
            .count()
    }

    /// The first time after now at which the worker may wake up and
    /// process a tick: a due end of a live timeout, or of a cancelled one
    /// (its removal can leave an early wake-up bound in its bucket), the
    /// transfer of a queued timeout, the processing of a queued
    /// cancellation.
    fn next_wake(&self) -> Option<u64> {
        self.entries
            .iter()
            .flat_map(|e| {
                let (due_end, queued_until, counted_out_at) = match e.state {
                    State::Live => (e.due_end, Some(e.queued_until), None),
                    State::Cancelled { counted_out_at } => {
                        (e.due_end, Some(e.queued_until), Some(counted_out_at))
                    }
                    _ => (None, None, None),
                };
                [due_end, queued_until, counted_out_at]
            })
            .flatten()
            .filter(|&t| t > self.now)
            .min()
    }
}

/// A timer on a manual clock, its model, and the log that connects them.
pub struct Harness {
    clock: ManualClock,
    timer: HashedWheelTimer,
    rec: Arc<Recorder>,
    model: Model,
    steps: usize,
}

impl fmt::Debug for Harness {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Harness")
            .field("timer", &self.timer)
            .field("now", &self.model.now)
            .field("start", &self.model.start)
            .field("steps", &self.steps)
            .finish_non_exhaustive()
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        // Also on a failed check: end the worker thread and free the tasks
        // (some hold a timer handle).
        let _ = self.timer.stop();
    }
}

impl Harness {
    /// A timer of the given shape on a fresh manual clock.
    pub fn new(cfg: Config) -> Harness {
        silence_task_panics();
        let tick = cfg.tick_ns.clamp(1_000_000, 10_000_000);
        let ticks_per_wheel = cfg.ticks_per_wheel.clamp(1, 64);
        let clock = ManualClock::new();
        let timer = HashedWheelTimer::builder()
            .tick_duration(Duration::from_nanos(tick))
            .ticks_per_wheel(ticks_per_wheel)
            .thread_name(WORKER_THREAD)
            .clock(clock.clone())
            .build()
            .expect("a valid timer shape");
        let shape = Shape {
            tick: nanos(timer.tick_duration()),
            wheel_len: timer.ticks_per_wheel() as u64,
        };
        assert_eq!(shape.tick, tick, "a tick of at least 1 ms is used as given");
        assert_eq!(
            shape.wheel_len,
            ticks_per_wheel.next_power_of_two() as u64,
            "the wheel length is the next power of two"
        );
        Harness {
            rec: Arc::new(Recorder {
                clock: clock.clone(),
                events: Mutex::new(Vec::new()),
                handles: Mutex::new(Vec::new()),
                next_id: AtomicUsize::new(0),
            }),
            clock,
            timer,
            model: Model {
                shape,
                now: 0,
                start: None,
                stopped: false,
                entries: Vec::new(),
            },
            steps: 0,
        }
    }

    /// Replays `ops` (at most [`MAX_OPS`]), then stops the timer and checks
    /// what `stop()` returns and what the timer does afterwards.
    pub fn run(cfg: Config, ops: &[Op]) {
        let mut h = Harness::new(cfg);
        for op in ops.iter().take(MAX_OPS) {
            h.apply(op);
        }
        h.finish();
    }

    /// The clock reading, in ns.
    pub fn now(&self) -> u64 {
        self.model.now
    }

    /// Applies one operation, then checks the timer against the model.
    pub fn apply(&mut self, op: &Op) {
        self.steps += 1;
        match op {
            Op::Schedule { delay, task } => self.schedule(delay, task),
            Op::Cancel { pick } => self.cancel(*pick),
            Op::Advance(step) => self.advance(step),
            Op::Settle => {
                self.clock.settle();
                self.replay();
            }
            Op::Start => self.start(),
            Op::Stop => self.stop(),
        }
        if settle_after_calls() && matches!(op, Op::Schedule { .. } | Op::Cancel { .. } | Op::Start)
        {
            self.clock.settle();
        }
        self.check();
    }

    /// Stops the timer (if no op did) and checks the stopped timer.
    pub fn finish(&mut self) {
        if !self.model.stopped {
            self.apply(&Op::Stop);
        }
        // A stopped timer takes no timeouts, fires nothing, cancels nothing.
        self.apply(&Op::Schedule {
            delay: Delay::Zero,
            task: Task::Record,
        });
        for id in 0..self.model.entries.len() {
            self.apply(&Op::Cancel { pick: id });
        }
        self.apply(&Op::Advance(Step::Turns(0)));
        self.apply(&Op::Stop);
        for (id, e) in self.model.entries.iter().enumerate() {
            assert!(
                e.dropped.is_some(),
                "timeout {id} ({e:?}): its task was never dropped after stop()"
            );
        }
    }

    fn schedule(&mut self, delay: &Delay, task: &Task) {
        let id = self.rec.next_id.fetch_add(1, Ordering::SeqCst);
        assert_eq!(id, self.model.entries.len(), "ids are dense");
        let d = self.model.shape.delay(delay);
        let f = make_task(&self.rec, &self.timer, self.model.shape, id, task.clone());
        let result = self.timer.new_timeout(d, f);
        let now = self.model.now;
        match result {
            Ok(handle) => {
                assert!(
                    !self.model.stopped,
                    "new_timeout succeeded on a stopped timer"
                );
                self.model.start.get_or_insert(now);
                let deadline = now.saturating_add(nanos(d));
                assert_eq!(
                    nanos(handle.deadline()),
                    deadline,
                    "timeout {id}: deadline of a delay of {d:?} at {now} ns"
                );
                assert!(!handle.is_expired() && !handle.is_cancelled());
                let queued_until = self.model.end_of(self.model.tick_of(now));
                let entry = self.model.entry(deadline, queued_until.unwrap_or(u64::MAX));
                self.model.entries.push(entry);
                self.rec.store(id, Some(handle));
            }
            Err(e) => {
                assert!(
                    self.model.stopped && matches!(e, TimerError::Stopped),
                    "new_timeout failed with {e:?} (stopped: {})",
                    self.model.stopped
                );
                self.model.entries.push(Entry {
                    deadline: 0,
                    due_tick: 0,
                    due_end: None,
                    queued_until: 0,
                    state: State::Failed,
                    dropped: None,
                    by_task: false,
                });
                self.rec.store(id, None);
            }
        }
        self.replay();
        if self.model.entries[id].state == State::Failed {
            assert_eq!(
                self.model.entries[id].dropped,
                Some(false),
                "the task of a failed new_timeout is dropped at once"
            );
        }
    }

    fn cancel(&mut self, pick: usize) {
        let created = self.model.entries.len();
        if created == 0 {
            return;
        }
        let id = pick % created;
        let Some(handle) = self.rec.handle(id) else {
            return;
        };
        let returned = handle.cancel();
        let e = &self.model.entries[id];
        let expected = e.state == State::Live;
        assert_eq!(
            returned, expected,
            "cancel() of timeout {id} ({e:?}) at {} ns",
            self.model.now
        );
        if returned {
            let now = self.model.now;
            let counted_out_at = self
                .model
                .end_of(self.model.tick_of(now))
                .unwrap_or(u64::MAX);
            self.model.entries[id].state = State::Cancelled { counted_out_at };
        }
        self.replay();
    }

    fn start(&mut self) {
        let result = self.timer.start();
        if self.model.stopped {
            assert!(
                matches!(result, Err(TimerError::Stopped)),
                "start() after stop() returned {result:?}"
            );
        } else {
            assert!(result.is_ok(), "start() returned {result:?}");
            self.model.start.get_or_insert(self.model.now);
        }
        self.replay();
    }

    fn stop(&mut self) {
        let returned = match self.timer.stop() {
            Ok(v) => v,
            Err(e) => panic!("stop() from the test thread failed: {e:?}"),
        };
        let handles: Vec<Option<Timeout>> = lock(&self.rec.handles).clone();
        let mut got = BTreeSet::new();
        for t in &returned {
            assert!(t.is_cancelled(), "stop() returned {t:?}, not cancelled");
            let id = handles
                .iter()
                .position(|h| h.as_ref().is_some_and(|h| h.ptr_eq(t)))
                .unwrap_or_else(|| panic!("stop() returned an unknown timeout {t:?}"));
            assert!(got.insert(id), "stop() returned timeout {id} twice");
        }
        let expected: BTreeSet<usize> = if self.model.stopped {
            BTreeSet::new()
        } else {
            (0..self.model.entries.len())
                .filter(|&id| self.model.entries[id].state == State::Live)
                .collect()
        };
        assert_eq!(
            got, expected,
            "stop() must return exactly the timeouts neither fired nor cancelled"
        );
        for id in got {
            self.model.entries[id].state = State::Stopped;
        }
        self.model.stopped = true;
        self.replay();
    }

    fn advance(&mut self, step: &Step) {
        let shape = self.model.shape;
        let now = self.model.now;
        match *step {
            Step::SubTick(n) => self.advance_by(n % shape.tick),
            Step::ToTickEnd(offset) => {
                let end = match self.model.start {
                    Some(_) if !self.model.stopped => self
                        .model
                        .end_of(self.model.tick_of(now))
                        .expect("the clock stays far from its end"),
                    _ => now + shape.tick,
                };
                let target = (end + u64::from(offset % 3)).saturating_sub(1).max(now);
                self.advance_by(target - now);
            }
            Step::Ticks { ticks, extra } => {
                let ticks = u64::from(ticks) % (MAX_STEP_TICKS + 1);
                self.advance_by(ticks * shape.tick + extra % shape.tick);
            }
            Step::Turns(turns) => {
                self.advance_by((1 + u64::from(turns) % MAX_STEP_TURNS) * shape.span());
            }
            Step::Far { days, overshoot } => {
                // Once the worker wakes up it processes every tick up to
                // now: stop a few ticks past the first wake-up point.
                let target = now + (1 + u64::from(days) % MAX_FAR_DAYS) * DAY_NS;
                let stop_at = match self.model.next_wake() {
                    Some(wake) if wake <= target => {
                        let past = u64::from(overshoot) % (MAX_FAR_OVERSHOOT + 1);
                        target.min(wake + past * shape.tick)
                    }
                    _ => target,
                };
                self.advance_by(stop_at - now);
            }
        }
    }

    fn advance_by(&mut self, by: u64) {
        self.clock.advance(Duration::from_nanos(by));
        self.model.now += by;
        assert_eq!(
            nanos(self.clock.now()),
            self.model.now,
            "the clock moved by {by} ns"
        );
        self.replay();
        self.check();
    }

    /// Feeds the tasks' events through the model, checking each.
    fn replay(&mut self) {
        let now = self.model.now;
        let mut last_fired: Option<(u64, usize)> = None;
        // Per producer (test thread, tasks): the last timeout fired.
        let mut last_of: [Option<(u64, usize)>; 2] = [None, None];
        let mut running: Option<usize> = None;
        // The target of the `cancel()` a task is in: a successful cancel
        // may drop the task right away, before it returns.
        let mut cancelling: Option<usize> = None;
        for event in self.rec.take_events() {
            match event {
                Event::Fired {
                    id,
                    now: at,
                    expired,
                    cancelled,
                    same_timeout,
                } => {
                    let e = &self.model.entries[id];
                    assert_eq!(
                        e.state,
                        State::Live,
                        "timeout {id} fired at {at} ns but it is not live: {e:?}"
                    );
                    assert_eq!(at, now, "timeout {id}: the clock moved while tasks ran");
                    assert!(
                        at >= e.deadline,
                        "timeout {id} fired at {at} ns, before its deadline {} ns",
                        e.deadline
                    );
                    assert!(
                        e.due_end.is_some_and(|end| end <= at),
                        "timeout {id} fired at {at} ns, before the end of its tick ({e:?})"
                    );
                    assert!(
                        expired && !cancelled,
                        "timeout {id}: the running task's handle: expired {expired}, \
                         cancelled {cancelled}"
                    );
                    assert!(
                        same_timeout,
                        "timeout {id}: the task was given another timeout's handle"
                    );
                    let key = (e.due_tick, id);
                    if let Some(last) = last_fired {
                        assert!(
                            last.0 <= key.0,
                            "timeout {id} (due tick {}) fired after timeout {} (due tick {}): \
                             ticks run in order",
                            e.due_tick,
                            last.1,
                            last.0
                        );
                    }
                    let producer = &mut last_of[usize::from(e.by_task)];
                    if let Some(last) = *producer {
                        assert!(
                            last < key,
                            "timeout {id} (due tick {}) fired after timeout {} (due tick {}) \
                             of the same producer: FIFO within a tick",
                            e.due_tick,
                            last.1,
                            last.0
                        );
                    }
                    *producer = Some(key);
                    last_fired = Some(key);
                    running = Some(id);
                    self.model.entries[id].state = State::Fired { at };
                }
                Event::Scheduled {
                    parent,
                    id,
                    now: at,
                    delay,
                    result,
                } => {
                    assert_eq!(
                        running,
                        Some(parent),
                        "timeout {id} scheduled outside its parent"
                    );
                    assert_eq!(at, now, "task {parent}: the clock moved while tasks ran");
                    assert_eq!(id, self.model.entries.len(), "ids are dense");
                    let deadline = at.saturating_add(nanos(delay));
                    match result {
                        Ok(d) => assert_eq!(
                            d, deadline,
                            "timeout {id} (scheduled by task {parent}): deadline of {delay:?} \
                             at {at} ns"
                        ),
                        Err(e) => panic!("new_timeout from task {parent} failed: {e}"),
                    }
                    // Made during tick `k`: moved into the wheel at `k + 1`.
                    let k = self.model.entries[parent].due_tick;
                    let queued_until = self.model.end_of(k + 1).unwrap_or(u64::MAX);
                    let mut entry = self.model.entry(deadline, queued_until);
                    entry.by_task = true;
                    assert!(
                        entry.due_end.is_none_or(|end| end > now),
                        "timeout {id} made by a task is due in a tick that already ended"
                    );
                    self.model.entries.push(entry);
                }
                Event::Cancelling { target } => {
                    cancelling = Some(target);
                }
                Event::Cancelled {
                    by,
                    target,
                    returned,
                } => {
                    assert_eq!(running, Some(by), "cancel logged outside its task");
                    assert_eq!(cancelling.take(), Some(target));
                    let e = &self.model.entries[target];
                    assert_eq!(
                        returned,
                        e.state == State::Live,
                        "cancel() of timeout {target} ({e:?}) from task {by}"
                    );
                    if returned {
                        // Counted out when the worker processes the next
                        // tick, `k + 1`, where `k` is the task's tick.
                        let k = self.model.entries[by].due_tick;
                        let counted_out_at = self.model.end_of(k + 1).unwrap_or(u64::MAX);
                        self.model.entries[target].state = State::Cancelled { counted_out_at };
                    }
                }
                Event::CancelledSelf { id, returned } => {
                    assert_eq!(running, Some(id));
                    assert!(!returned, "timeout {id} cancelled itself while running");
                }
                Event::StopFromTask { id, result } => {
                    assert_eq!(running, Some(id));
                    assert_eq!(result, "StopFromTask", "stop() from task {id}");
                }
                Event::Dropped { id, ran } => {
                    let e = &self.model.entries[id];
                    assert_eq!(
                        e.dropped, None,
                        "the task of timeout {id} was dropped twice"
                    );
                    let fired = matches!(e.state, State::Fired { .. });
                    assert_eq!(ran, fired, "timeout {id} ({e:?}) dropped with ran = {ran}");
                    assert!(
                        e.state != State::Live || (cancelling == Some(id) && !ran),
                        "the task of live timeout {id} was dropped ({e:?})"
                    );
                    self.model.entries[id].dropped = Some(ran);
                }
            }
        }
    }

    /// Checks everything the model knows against the timer, at a point
    /// where the worker has nothing left to do.
    fn check(&mut self) {
        let m = &self.model;
        let now = m.now;
        assert_eq!(
            self.timer.pending_timeouts(),
            m.pending(),
            "pending_timeouts() at {now} ns (start {:?}, tick {} ns, {} buckets)",
            m.start,
            m.shape.tick,
            m.shape.wheel_len
        );
        let handles = lock(&self.rec.handles).clone();
        for (id, e) in m.entries.iter().enumerate() {
            match e.state {
                State::Live => {
                    assert!(
                        m.stopped || e.due_end.is_none_or(|end| end > now),
                        "timeout {id} did not fire by the end of its tick: {e:?}, now {now} ns"
                    );
                    assert_eq!(e.dropped, None, "live timeout {id} lost its task");
                }
                State::Fired { .. } => {
                    assert_eq!(
                        e.dropped,
                        Some(true),
                        "timeout {id} ran but was not dropped"
                    );
                }
                State::Cancelled { counted_out_at } => {
                    if counted_out_at <= now || m.stopped {
                        assert_eq!(
                            e.dropped,
                            Some(false),
                            "timeout {id}: cancellation processed, task not freed"
                        );
                    }
                }
                State::Stopped | State::Failed => {
                    assert_eq!(e.dropped, Some(false), "timeout {id}: task not freed");
                }
            }
            if let Some(h) = handles.get(id).cloned().flatten() {
                let (expired, cancelled) = match e.state {
                    State::Live => (false, false),
                    State::Fired { .. } => (true, false),
                    State::Cancelled { .. } | State::Stopped => (false, true),
                    State::Failed => unreachable!("a failed timeout has no handle"),
                };
                assert_eq!(
                    (h.is_expired(), h.is_cancelled()),
                    (expired, cancelled),
                    "timeout {id} ({e:?}): is_expired / is_cancelled"
                );
            }
        }
        assert!(
            m.entries.len() < TRANSFER_CAP,
            "the model assumes the worker keeps up"
        );
    }
}
