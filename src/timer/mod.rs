//! A hashed timing wheel with Netty's `HashedWheelTimer` semantics.
//!
//! # Model
//!
//! One timer owns one worker thread, started lazily by the first
//! [`new_timeout`](HashedWheelTimer::new_timeout) (or by
//! [`start`](HashedWheelTimer::start)). The wheel is a ring of `2^k`
//! buckets; the bucket of tick `t` is `t & (2^k - 1)`.
//!
//! * `new_timeout` never touches the wheel: it pushes the timeout onto its
//!   thread's own ring for this timer and returns its [`Timeout`] handle.
//! * `cancel` is a compare-and-swap on the timeout's state plus a
//!   cancellation pushed onto the calling thread's ring (or, when that
//!   thread pushed the timeout last and the worker has not taken it yet,
//!   taking it back out of the ring, which leaves a count for the worker).
//! * Tick `t` covers `[start + t·tick, start + (t+1)·tick)`. The worker
//!   processes it once it has ended: it takes what the rings hold, counts
//!   out the cancellations (unlinking those timeouts), moves at most
//!   100,000 new timeouts into buckets, and then fires, in FIFO order, every
//!   timeout of bucket `t & mask` whose deadline falls in tick `t` or
//!   earlier.
//!
//! A timeout therefore fires at most once, never before its deadline, never
//! after a `cancel()` that returned `true`, and normally within one tick
//! after its deadline (later only if the worker is kept busy by slow tasks
//! or by more than 100,000 new timeouts per tick).
//!
//! # Implementation
//!
//! In layers, following tokio's time driver: `wheel.rs` is the data
//! structure in integer ticks (buckets are vectors of timeouts, each timeout
//! recording its position), `slot.rs` the memory and state of a timeout,
//! `timeout.rs` its handle, `clock.rs` the time source, `inbox.rs` the way
//! in, `worker.rs` the tick loop; `sync.rs` swaps in loom's primitives for
//! the model checks in `loom.rs`.
//!
//! The fast path, per `new_timeout`: one clock read (`Instant`), a
//! 40-byte slot taken from the calling thread's own pool
//! (no lock, no allocator call), and a push onto the calling thread's own
//! ring, whose one read-modify-write also tells whether the worker sleeps.
//! The handle is a pointer to the slot, whose one word holds both the
//! state and a reference count; dropping a handle is one
//! read-modify-write (none when it is the last reference). Netty uses one
//! lock-free MPSC queue instead; in Rust that costs a contended
//! compare-and-swap per push when producers run in parallel. Each thread's
//! timeouts keep their order (SPEC HWT-W11 promises order per producer);
//! how two threads' timeouts due in the same tick interleave is not
//! specified. Timeouts are counted per producer (`added`) and by the worker
//! (`removed`), so no counter is shared by all producers either.
//!
//! Netty wakes up every tick. This worker processes every tick in order
//! while there is something to do, but when nothing can be due before some
//! later tick it sleeps until that tick (or forever, on an empty timer), and
//! a producer whose deadline comes earlier wakes it. An idle timer costs no
//! CPU.
//!
//! When timeouts fall due at the end of the tick it waits for, the worker
//! (on the real clock) sleeps until 0.2 ms before that instant and yields
//! the CPU in a loop for the rest: a timed sleep alone overshoots by the
//! kernel's timer slack and scheduling latency, which would add to every
//! timeout's lateness. That costs up to a fifth of a core while timeouts
//! fall due every millisecond, and nothing while none are due.
//!
//! # Where redwheel differs from Netty
//!
//! * A stopped timer's `new_timeout` fails without leaking a pending count
//!   (Netty HWT-N03), and timeouts cancelled by `stop()` stop being counted
//!   (HWT-L09). A `new_timeout` that races with `stop()` fails, or has its
//!   timeout returned by `stop()`, instead of being stranded (HWT-L10).
//! * `ticks_per_wheel` above `2^30` is an error, not an allocation failure.
//! * A mis-placed timeout (Netty throws from the worker) cannot exist: the
//!   due tick is stored, and the worker only processes a tick after it ended.
//! * Cancelled timeouts are processed at the start of a tick (Netty 4.1's
//!   order), so `pending_timeouts()` drops by one at the next tick boundary.
//! * The worker thread is spawned on start, not created beforehand (Rust
//!   threads cannot exist unstarted).
//! * Timeouts due in the same tick fire in the order their thread scheduled
//!   them (HWT-W11's promise per producer). Netty's single queue also
//!   orders timeouts of different threads by when they reached it; here
//!   each thread has its own ring, and that interleaving is unspecified.
//! * A bucket visit does not walk timeouts due on later turns of the wheel
//!   (see `wheel.rs`), and the worker wakes up precisely at a tick end when
//!   something falls due (see above); Netty wakes every tick and walks the
//!   whole bucket.
//! * Tasks that panic are caught and logged with `tracing`; the worker goes
//!   on. So are the other panics of user code on the worker thread: an
//!   executor's `execute` or `end_of_tick`, and a task's `Drop` when the
//!   worker drops it (a job the executor rejected, the timeouts `stop()`
//!   cancels). Netty's `TimerTask.cancelled()` callback and `Timeout.timer()` /
//!   `task()` accessors have no equivalent: a cancelled task is dropped
//!   (implement `Drop` on what it captures to observe that).

mod clock;
mod inbox;
mod slot;
mod sync;
mod timeout;
mod wheel;
mod worker;

#[cfg(all(test, loom))]
mod loom;

use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicUsize as StdAtomicUsize, Ordering as StdOrdering};
use std::sync::{Arc, OnceLock};
use std::thread::{self, JoinHandle, ThreadId};
use std::time::Duration;

use crossbeam_utils::CachePadded;
use parking_lot::Condvar;

pub use self::clock::{Clock, ManualClock, SystemClock};
pub use self::timeout::Timeout;
pub use crate::error::TimerError;

use self::clock::Parker;
use self::inbox::{Pushed, Registry, entry_of};
use self::slot::SlotRef;
use self::sync::{AtomicU8, AtomicU64, AtomicUsize, Mutex, Ordering};
use self::worker::Pending;

/// What [`HashedWheelTimer::new_timeout`] runs: any `FnOnce(&Timeout)`
/// that can be sent to another thread. Run at most once, on expiry, with its
/// timeout's handle; dropped without running if cancelled or never due.
pub trait TimerTask: FnOnce(&Timeout) + Send + 'static {}

impl<F: FnOnce(&Timeout) + Send + 'static> TimerTask for F {}

/// Most timeouts the worker moves from the pending queue into buckets per
/// tick, so that a producer adding in a tight loop cannot starve expiry.
pub const TRANSFER_CAP: usize = 100_000;

/// Live timers above which one warning is logged (each timer owns a
/// thread; share one instead).
pub const INSTANCE_COUNT_LIMIT: usize = 64;

/// Largest `ticks_per_wheel`, after rounding up to a power of two.
pub const MAX_TICKS_PER_WHEEL: usize = wheel::MAX_BUCKETS;

/// Shortest tick; shorter ones are raised to it (with a warning).
pub const MIN_TICK: Duration = Duration::from_millis(1);

const WORKER_INIT: u8 = 0;
const WORKER_STARTED: u8 = 1;
const WORKER_SHUTDOWN: u8 = 2;

/// `start_ns` before the worker has published its start time.
const START_UNSET: u64 = u64::MAX;

/// `Shared::doze` values; `DOZE_WOKEN_BASE + t` records a wake-up at `t`.
const DOZE_AWAKE: u64 = 0;
const DOZE_DOZING: u64 = 1;
const DOZE_WOKEN_BASE: u64 = 2;

static LIVE_TIMERS: StdAtomicUsize = StdAtomicUsize::new(0);
static WARNED_TOO_MANY: AtomicBool = AtomicBool::new(false);

/// Runs expired tasks somewhere other than the worker thread.
///
/// By default a task runs on the timer's worker thread, so a slow task
/// delays every later timeout. Give the builder an executor (a thread pool,
/// a channel to one) and the worker only hands each expired [`Job`] over.
///
/// Any `Fn(Job) + Send + Sync` closure is an executor that never rejects.
///
/// Both methods run on the worker thread. A panic in either is caught and
/// logged (`tracing`, WARN), and the worker goes on: the job given to an
/// `execute` that panicked is dropped as the panic unwinds, which drops its
/// task (unless the executor kept the job), and the timeout stays expired.
/// A job kept by an `end_of_tick` that panicked is the executor's, to run
/// or drop later.
pub trait Executor: Send + Sync + 'static {
    /// Runs `job` now or later, on any thread. Returning `Err(job)` rejects
    /// it: the timer logs a warning and drops the job, whose timeout stays
    /// expired (Netty's behaviour for a rejecting executor).
    fn execute(&self, job: Job) -> Result<(), Job>;

    /// Called on the worker thread once it has handed over every job that
    /// expired in one tick (and only after a tick that handed over at least
    /// one). An executor that batches jobs releases its batch here, so that
    /// timeouts due in the same tick are run together. Does nothing by
    /// default.
    fn end_of_tick(&self) {}
}

impl<F> Executor for F
where
    F: Fn(Job) + Send + Sync + 'static,
{
    fn execute(&self, job: Job) -> Result<(), Job> {
        self(job);
        Ok(())
    }
}

/// An expired timeout and its task, handed to an [`Executor`]. Dropping
/// a job without running it drops the task.
pub struct Job {
    timeout: Timeout,
    /// The task is still in the timeout's slot.
    task: bool,
}

impl Job {
    fn new(timeout: Timeout) -> Job {
        Job {
            timeout,
            task: true,
        }
    }

    /// Runs the task. A panic in the task is caught and logged.
    pub fn run(mut self) {
        self.task = false;
        run_task(&self.timeout);
    }

    /// The expired timeout this job belongs to.
    pub fn timeout(&self) -> &Timeout {
        &self.timeout
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        if self.task {
            // SAFETY: the worker moved the timeout to EXPIRED and handed the
            // task to this job, which never ran it.
            unsafe { self.timeout.slot.drop_task() };
        }
    }
}

impl fmt::Debug for Job {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Job")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// Runs the timeout's task, catching and logging a panic.
/// Called once per expired timeout (by the worker, or by its [`Job`]), by
/// whoever holds its task.
fn run_task(timeout: &Timeout) {
    // SAFETY: the worker made the timeout EXPIRED and hands its task to
    // exactly one runner: itself, or the job (which runs it once).
    let run = || unsafe { timeout.slot.run_task(timeout) };
    catch_logged("a timer task", Some(timeout.deadline()), run);
}

/// Runs user code on the worker thread (`who`: a task, its drop, the
/// executor), catching a panic and logging it at WARN with the deadline of
/// the timeout involved, if one is, so that the worker goes on.
fn catch_logged(who: &str, deadline: Option<Duration>, f: impl FnOnce()) {
    if let Err(panic) = catch_unwind(AssertUnwindSafe(f)) {
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a non-string panic payload".to_owned());
        tracing::warn!(
            target: "redwheel::timer",
            deadline = ?deadline,
            "{who} panicked: {what}"
        );
    }
}

/// Drops a task the worker holds (a cancelled or refused timeout's),
/// catching and logging a panic of its `Drop`.
///
/// # Safety
/// As [`slot::SlotRef::drop_task`]: the caller owns the task.
unsafe fn drop_task_logged(slot: SlotRef) {
    let deadline = Some(slot.deadline_duration());
    // SAFETY: forwarded.
    catch_logged("a timer task's drop", deadline, || unsafe {
        slot.drop_task()
    });
}

/// Configures and builds a [`HashedWheelTimer`].
///
/// Defaults are Netty's: a 100 ms tick, 512 ticks per wheel, no limit on
/// pending timeouts, tasks run on the worker thread, the real clock.
pub struct Builder {
    tick: Duration,
    ticks_per_wheel: usize,
    max_pending: usize,
    thread_name: String,
    executor: Option<Arc<dyn Executor>>,
    clock: Option<Arc<dyn Clock>>,
}

impl Default for Builder {
    fn default() -> Self {
        Builder {
            tick: Duration::from_millis(100),
            ticks_per_wheel: 512,
            max_pending: 0,
            thread_name: "redwheel-timer".to_owned(),
            executor: None,
            clock: None,
        }
    }
}

impl fmt::Debug for Builder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Builder")
            .field("tick_duration", &self.tick)
            .field("ticks_per_wheel", &self.ticks_per_wheel)
            .field("max_pending", &self.max_pending)
            .field("thread_name", &self.thread_name)
            .field("executor", &self.executor.is_some())
            .field("clock", &self.clock)
            .finish()
    }
}

impl Builder {
    /// Length of one tick: the timer's resolution. Zero is an error; below
    /// 1 ms it is raised to 1 ms with a warning. Default 100 ms.
    pub fn tick_duration(mut self, tick: Duration) -> Self {
        self.tick = tick;
        self
    }

    /// Number of buckets, rounded up to a power of two; `1..=2^30`.
    /// Default 512.
    pub fn ticks_per_wheel(mut self, n: usize) -> Self {
        self.ticks_per_wheel = n;
        self
    }

    /// Most timeouts pending at once (scheduled, not yet fired or
    /// cancelled); past it `new_timeout` returns
    /// [`TimerError::TooManyPending`]. `0`, the default, means no limit.
    pub fn max_pending(mut self, max: usize) -> Self {
        self.max_pending = max;
        self
    }

    /// Name of the worker thread. Default `redwheel-timer`.
    pub fn thread_name(mut self, name: impl Into<String>) -> Self {
        self.thread_name = name.into();
        self
    }

    /// Runs expired tasks on `executor` instead of the worker thread.
    pub fn executor(mut self, executor: impl Executor) -> Self {
        self.executor = Some(Arc::new(executor));
        self
    }

    /// Takes time from `clock` ([`SystemClock`] by default; a
    /// [`ManualClock`] in tests).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// Checks the arguments and builds the timer. Its thread starts with the
    /// first timeout.
    pub fn build(self) -> Result<HashedWheelTimer, TimerError> {
        if self.tick.is_zero() {
            return Err(TimerError::InvalidArgument {
                name: "tick_duration",
                reason: "must be greater than zero".to_owned(),
            });
        }
        let wheel_len =
            wheel::wheel_length(self.ticks_per_wheel, MAX_TICKS_PER_WHEEL).ok_or_else(|| {
                TimerError::InvalidArgument {
                    name: "ticks_per_wheel",
                    reason: format!(
                        "{} is not in 1..={MAX_TICKS_PER_WHEEL}",
                        self.ticks_per_wheel
                    ),
                }
            })?;
        // Netty's overflow guard, before the 1 ms raise: one turn of the
        // wheel must be representable in signed 64-bit nanoseconds.
        let tick_ns = u64::try_from(self.tick.as_nanos()).unwrap_or(u64::MAX);
        if tick_ns >= i64::MAX as u64 / wheel_len as u64 {
            return Err(TimerError::InvalidArgument {
                name: "tick_duration",
                reason: format!(
                    "{:?} × {wheel_len} buckets overflows 64-bit nanoseconds",
                    self.tick
                ),
            });
        }
        let tick_ns = if self.tick < MIN_TICK {
            tracing::warn!(
                target: "redwheel::timer",
                "tick_duration {:?} is below the minimum; using {:?}",
                self.tick,
                MIN_TICK
            );
            MIN_TICK.as_nanos() as u64
        } else {
            tick_ns
        };
        if self.thread_name.contains('\0') {
            return Err(TimerError::InvalidArgument {
                name: "thread_name",
                reason: "must not contain a NUL character".to_owned(),
            });
        }
        let clock = self.clock.unwrap_or_else(|| Arc::new(SystemClock::new()));
        let shared = Arc::new(Shared {
            state: AtomicU8::new(WORKER_INIT),
            start_ns: AtomicU64::new(START_UNSET),
            start_lock: parking_lot::Mutex::new(()),
            start_cv: Condvar::new(),
            producers: Mutex::new(Registry::default()),
            generation: AtomicU64::new(0),
            removed_by_worker: CachePadded::new(AtomicU64::new(0)),
            removed_elsewhere: AtomicU64::new(0),
            tick_lag_ns: AtomicU64::new(0),
            reserved: AtomicUsize::new(0),
            max_pending: self.max_pending,
            tick_ns,
            wheel_len,
            clock,
            doze: AtomicU64::new(DOZE_AWAKE),
            parker: Parker::default(),
            worker: Mutex::new(None),
            worker_id: OnceLock::new(),
            executor: self.executor,
            thread_name: self.thread_name,
            counted: AtomicBool::new(true),
        });
        let live = LIVE_TIMERS.fetch_add(1, StdOrdering::Relaxed) + 1;
        if live > INSTANCE_COUNT_LIMIT
            && WARNED_TOO_MANY
                .compare_exchange(false, true, StdOrdering::Relaxed, StdOrdering::Relaxed)
                .is_ok()
        {
            tracing::warn!(
                target: "redwheel::timer",
                live,
                "more than {INSTANCE_COUNT_LIMIT} HashedWheelTimers are alive; each owns a \
                 thread, so share one timer instead of creating many"
            );
        }
        Ok(HashedWheelTimer {
            handle: Arc::new(Handle { shared }),
        })
    }
}

/// A hashed wheel timer: runs tasks after a delay, on one worker thread.
///
/// A cheap-to-clone handle; every clone drives the same wheel, and every
/// method takes `&self`. Dropping the last clone stops the worker thread
/// (tasks still pending are dropped without running), as
/// [`stop`](HashedWheelTimer::stop) does.
#[derive(Clone)]
pub struct HashedWheelTimer {
    handle: Arc<Handle>,
}

/// Owned by the `HashedWheelTimer` clones only (not by `Timeout`s or the
/// worker), so its drop means "the last timer handle is gone".
struct Handle {
    shared: Arc<Shared>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        let shared = &self.shared;
        if shared.on_worker_thread() {
            // A task dropped the last handle: the worker cannot join itself.
            // It sees the shutdown when the task returns, cancels what never
            // ran and exits, detached.
            shared.state.store(WORKER_SHUTDOWN, Ordering::SeqCst);
            shared.parker.unpark();
            shared.uncount();
            drop(shared.worker.lock().take());
            return;
        }
        let _ = shared.shutdown();
    }
}

impl fmt::Debug for HashedWheelTimer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.handle.shared;
        let state = match s.state.load(Ordering::Relaxed) {
            WORKER_INIT => "init",
            WORKER_STARTED => "started",
            _ => "shutdown",
        };
        f.debug_struct("HashedWheelTimer")
            .field("tick_duration", &Duration::from_nanos(s.tick_ns))
            .field("ticks_per_wheel", &s.wheel_len)
            .field("pending_timeouts", &s.pending())
            .field("state", &state)
            .finish()
    }
}

impl HashedWheelTimer {
    /// A builder with Netty's defaults.
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// Schedules `task` to run once, `delay` from now.
    ///
    /// The task runs on the worker thread (or the executor) at the end of
    /// the tick that contains its deadline, never earlier. A zero delay runs
    /// it at the end of the current tick. A delay too large to represent
    /// (`Duration::MAX`) never fires but can be cancelled.
    ///
    /// Fails with [`TimerError::Stopped`] after [`stop`](Self::stop), and
    /// with [`TimerError::TooManyPending`] when `max_pending` is reached. On
    /// failure the task is dropped without running.
    pub fn new_timeout<F>(&self, delay: Duration, task: F) -> Result<Timeout, TimerError>
    where
        F: FnOnce(&Timeout) + Send + 'static,
    {
        self.handle.shared.new_timeout(delay, task)
    }

    /// Starts the worker thread if it is not running yet. Optional: the
    /// first `new_timeout` does it. Returns once the worker has recorded its
    /// start time. Fails after `stop`.
    pub fn start(&self) -> Result<(), TimerError> {
        self.handle.shared.start()
    }

    /// Stops the worker and returns the timeouts that never ran: every one
    /// that was neither expired nor cancelled, each now cancelled (their
    /// tasks are dropped). Waits for a running task to finish.
    ///
    /// A second `stop` returns an empty list at once. Called from a task on
    /// the worker thread it fails with [`TimerError::StopFromTask`] and the
    /// timer keeps running.
    pub fn stop(&self) -> Result<Vec<Timeout>, TimerError> {
        let shared = &self.handle.shared;
        if shared.on_worker_thread() {
            return Err(TimerError::StopFromTask);
        }
        shared.shutdown()
    }

    /// Timeouts scheduled and not yet fired or cancelled. A cancelled
    /// timeout stops counting when the worker processes the cancellation, at
    /// the next tick boundary (as in Netty).
    pub fn pending_timeouts(&self) -> usize {
        self.handle.shared.pending()
    }

    /// How far behind its tick the worker runs: for the latest tick it
    /// processed, the clock time when it began processing it minus the
    /// tick's end (zero before the first tick). A worker that keeps up reads
    /// well under one tick; one held up by slow tasks (on the worker
    /// thread) or starved of CPU reads more. Updated once per processed
    /// tick (idle ticks skipped during a doze are not processed).
    pub fn tick_lag(&self) -> Duration {
        Duration::from_nanos(self.handle.shared.tick_lag_ns.load(Ordering::Relaxed))
    }

    /// The current time on the timer's clock, on the same scale as
    /// [`Timeout::deadline`].
    pub fn now(&self) -> Duration {
        self.handle.shared.clock.now()
    }

    /// The tick length in use (after the 1 ms minimum was applied).
    pub fn tick_duration(&self) -> Duration {
        Duration::from_nanos(self.handle.shared.tick_ns)
    }

    /// The number of buckets (a power of two).
    pub fn ticks_per_wheel(&self) -> usize {
        self.handle.shared.wheel_len
    }
}

/// State shared by the timer handles, the timeouts and the worker.
pub(crate) struct Shared {
    state: AtomicU8,
    /// The worker's start time on the clock, in ns; `START_UNSET` before.
    start_ns: AtomicU64,
    start_lock: parking_lot::Mutex<()>,
    start_cv: Condvar,
    /// The producers: one per thread that scheduled or cancelled here (see
    /// `inbox.rs`).
    producers: Mutex<Registry>,
    /// Bumped whenever `producers` changes, so the worker knows to look.
    generation: AtomicU64,
    /// Timeouts counted out (expired, or their cancellation processed) by
    /// the worker; only the worker writes it. Pending is the inboxes'
    /// `added` minus this and `removed_elsewhere`.
    removed_by_worker: CachePadded<AtomicU64>,
    /// Timeouts counted out by other threads (after the worker exited).
    removed_elsewhere: AtomicU64,
    /// How late (ns) the worker processed its latest tick: clock time when
    /// it began minus the tick's end. Written by the worker once per
    /// processed tick, read by [`HashedWheelTimer::tick_lag`].
    tick_lag_ns: AtomicU64,
    /// With `max_pending > 0` only: the pending count, kept exactly for
    /// admission (a reservation is taken before the push).
    reserved: AtomicUsize,
    max_pending: usize,
    tick_ns: u64,
    wheel_len: usize,
    clock: Arc<dyn Clock>,
    /// `DOZE_AWAKE`, `DOZE_DOZING` (the worker sleeps past the end of the
    /// current tick), or `DOZE_WOKEN_BASE + t`: a producer or canceller woke
    /// it at clock time `t`. One word, so claiming the wake-up and recording
    /// its time is one CAS, and the worker reads and clears both at once.
    doze: AtomicU64,
    parker: Parker,
    worker: Mutex<Option<JoinHandle<Vec<Timeout>>>>,
    worker_id: OnceLock<ThreadId>,
    executor: Option<Arc<dyn Executor>>,
    thread_name: String,
    /// This timer is still counted in `LIVE_TIMERS`.
    counted: AtomicBool,
}

impl Shared {
    fn on_worker_thread(&self) -> bool {
        self.worker_id.get() == Some(&thread::current().id())
    }

    fn is_shutdown(&self) -> bool {
        self.state.load(Ordering::SeqCst) == WORKER_SHUTDOWN
    }

    fn uncount(&self) {
        if self.counted.swap(false, StdOrdering::Relaxed) {
            LIVE_TIMERS.fetch_sub(1, StdOrdering::Relaxed);
        }
    }

    fn start(self: &Arc<Self>) -> Result<(), TimerError> {
        if self.start_ns.load(Ordering::Acquire) != START_UNSET {
            return if self.is_shutdown() {
                Err(TimerError::Stopped)
            } else {
                Ok(())
            };
        }
        match self.state.compare_exchange(
            WORKER_INIT,
            WORKER_STARTED,
            Ordering::SeqCst,
            Ordering::SeqCst,
        ) {
            Ok(_) => {
                let shared = Arc::clone(self);
                let spawned = thread::Builder::new()
                    .name(self.thread_name.clone())
                    .spawn(move || worker::run(shared));
                match spawned {
                    Ok(handle) => *self.worker.lock() = Some(handle),
                    Err(e) => {
                        self.state.store(WORKER_SHUTDOWN, Ordering::SeqCst);
                        self.close_inboxes();
                        self.uncount();
                        self.publish_start(0);
                        return Err(TimerError::Spawn(e));
                    }
                }
            }
            Err(WORKER_STARTED) => {}
            Err(_) => return Err(TimerError::Stopped),
        }
        let mut guard = self.start_lock.lock();
        while self.start_ns.load(Ordering::Acquire) == START_UNSET {
            self.start_cv.wait(&mut guard);
        }
        Ok(())
    }

    /// Called by the worker (or a failed spawn) once: releases `start()`.
    fn publish_start(&self, start_ns: u64) {
        let _guard = self.start_lock.lock();
        self.start_ns.store(start_ns, Ordering::Release);
        self.start_cv.notify_all();
    }

    fn new_timeout<F: TimerTask>(
        self: &Arc<Self>,
        delay: Duration,
        task: F,
    ) -> Result<Timeout, TimerError> {
        if self.max_pending > 0 {
            let pending = self.reserved.fetch_add(1, Ordering::SeqCst) + 1;
            if pending > self.max_pending {
                self.reserved.fetch_sub(1, Ordering::SeqCst);
                return Err(TimerError::TooManyPending {
                    pending: pending - 1,
                    max: self.max_pending,
                });
            }
        }
        // Started and not stopped (the usual case) costs two loads.
        if (self.start_ns.load(Ordering::Acquire) == START_UNSET || self.is_shutdown())
            && let Err(e) = self.start()
        {
            self.unreserve(1);
            return Err(e);
        }
        let now = nanos(self.clock.now());
        let delay = nanos(delay);
        let deadline = now.saturating_add(delay);
        let key = Arc::as_ptr(self).addr();
        let Some(mine) = inbox::mine(key, || Some(Arc::clone(self))) else {
            // The worker is gone: `stop()` ran.
            self.unreserve(1);
            return Err(TimerError::Stopped);
        };
        // SAFETY: `mine` is this thread's producer, and its pool outlives
        // its slots.
        let Some(slot) = (unsafe { mine.pool.alloc(mine.as_ptr()) }) else {
            // The pool closed: `stop()` ran (or the timer is gone).
            self.unreserve(1);
            return Err(TimerError::Stopped);
        };
        let slot = SlotRef(slot);
        // Two references: the handle and the ring entry.
        // SAFETY: the slot is fresh and ours.
        unsafe { slot::init(slot.0, deadline, 2, task) };
        // SAFETY: this thread's producer.
        let pushed = unsafe { mine.push(entry_of(slot, false), true) };
        drop(mine);
        match pushed {
            Pushed::Queued => {}
            Pushed::QueuedWake => self.wake(),
            // The worker collected its last leftovers: `stop()` ran.
            Pushed::Closed => {
                self.unreserve(1);
                // Both references go; the last drops the task.
                slot.release();
                slot.release();
                return Err(TimerError::Stopped);
            }
        }
        Ok(Timeout { slot })
    }

    /// Wakes the dozing worker (a push found its ring armed). Claims the
    /// wake-up and says when, in one step: the worker may run only after
    /// the clock moved on, and must not skip the tick the push belongs to.
    /// Only the first claimant unparks it.
    fn wake(&self) {
        let at = nanos(self.clock.now()).saturating_add(DOZE_WOKEN_BASE);
        if self
            .doze
            .compare_exchange(DOZE_DOZING, at, Ordering::SeqCst, Ordering::Relaxed)
            .is_ok()
        {
            self.parker.unpark();
        }
    }

    /// Timeouts accepted and not yet counted out. The removals are read
    /// first: every timeout they count was added before, so the difference
    /// never goes below the truth at a quiescent point.
    fn pending(&self) -> usize {
        let removed = self.removed_by_worker.load(Ordering::Acquire)
            + self.removed_elsewhere.load(Ordering::Acquire);
        let added: u64 = {
            let reg = self.producers.lock();
            reg.retired_added + reg.list.iter().map(|p| p.added()).sum::<u64>()
        };
        usize::try_from(added.saturating_sub(removed)).unwrap_or(usize::MAX)
    }

    /// Releases admission reservations (bounded timers only).
    fn unreserve(&self, n: usize) {
        if self.max_pending > 0 {
            self.reserved.fetch_sub(n, Ordering::SeqCst);
        }
    }

    /// Counts out `n` timeouts from a thread other than the running worker.
    fn count_out_elsewhere(&self, n: u64) {
        self.removed_elsewhere.fetch_add(n, Ordering::AcqRel);
        self.unreserve(n as usize);
    }

    /// Closes the registry of a timer whose worker never ran: no producer
    /// can join it any more (none has: producers register after `start`).
    fn close_inboxes(&self) {
        self.producers.lock().closed = true;
    }

    /// Moves to SHUTDOWN, joins the worker and returns the timeouts that
    /// never ran, which the worker cancelled.
    fn shutdown(&self) -> Result<Vec<Timeout>, TimerError> {
        match self.state.swap(WORKER_SHUTDOWN, Ordering::SeqCst) {
            WORKER_SHUTDOWN => return Ok(Vec::new()),
            WORKER_INIT => {
                self.close_inboxes();
                self.uncount();
                self.publish_start(0);
                return Ok(Vec::new());
            }
            _ => {}
        }
        self.parker.unpark();
        let handle = self.worker.lock().take();
        let never_ran = match handle.map(JoinHandle::join) {
            Some(Ok(never_ran)) => never_ran,
            Some(Err(_)) => {
                tracing::error!(target: "redwheel::timer", "the timer's worker thread panicked");
                Vec::new()
            }
            None => Vec::new(),
        };
        self.uncount();
        Ok(never_ran)
    }

    /// Cancels the timeouts the worker collected at shutdown and returns
    /// those whose cancellation succeeded (a concurrent user `cancel` may
    /// have won).
    fn cancel_all(&self, leftovers: Vec<Pending>) -> Vec<Timeout> {
        let mut never_ran = Vec::with_capacity(leftovers.len());
        let mut frees = slot::Frees::new();
        for slot in leftovers {
            // These left the wheel and the rings with the worker's final
            // collection, so no ring is involved: count them out here.
            if slot.try_cancel(0) {
                // SAFETY: we made the move out of `INIT`: the task is ours.
                // A panic in its drop is caught: the others still go.
                unsafe { drop_task_logged(slot) };
                // The worker's reference becomes the returned handle.
                never_ran.push(Timeout { slot });
            } else {
                slot.release_into(&mut frees);
            }
        }
        drop(frees);
        self.count_out_elsewhere(never_ran.len() as u64);
        never_ran
    }
}

/// A clock reading in nanoseconds (saturating; 584 years fit).
fn nanos(d: Duration) -> u64 {
    d.as_secs()
        .checked_mul(1_000_000_000)
        .and_then(|ns| ns.checked_add(u64::from(d.subsec_nanos())))
        .unwrap_or(u64::MAX)
}
