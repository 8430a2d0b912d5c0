//! The public handle: [`Builder`] and [`HashedWheelTimer`], and what they
//! do on the calling thread — start the worker, schedule (the fast path of
//! `new_timeout`), stop.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering as StdOrdering};
use std::sync::{Arc, OnceLock};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use crossbeam_utils::CachePadded;
use parking_lot::Condvar;

use super::clock::{Clock, Parker, SystemClock, nanos};
use super::entry::{self, MAX_UNRESOLVED_DELAY, SlotRef};
use super::local;
use super::pool::release;
use super::producer::{Producer, Registry};
use super::ring::{MAX_MARK, Pushed, entry_of, time_entry};
use super::shared::{
    DOZE_AWAKE, LIVE_TIMERS, START_UNSET, Shared, WORKER_INIT, WORKER_SHUTDOWN, WORKER_STARTED,
};
use super::sync::{AtomicU8, AtomicU64, AtomicUsize, Mutex, Ordering};
use super::task::{Executor, TimerTask, init_slot};
use super::timeout::Timeout;
use super::{wheel, worker};
use crate::error::TimerError;

/// Live timers above which one warning is logged (each timer owns a
/// thread; share one instead).
pub const INSTANCE_COUNT_LIMIT: usize = 64;

/// Largest `ticks_per_wheel`, after rounding up to a power of two.
pub const MAX_TICKS_PER_WHEEL: usize = wheel::MAX_BUCKETS;

/// Shortest tick; shorter ones are raised to it (with a warning).
pub const MIN_TICK: Duration = Duration::from_millis(1);

static WARNED_TOO_MANY: AtomicBool = AtomicBool::new(false);

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
    /// [`ManualClock`](super::ManualClock) in tests).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// Checks the arguments and builds the timer. Its thread starts with the
    /// first timeout.
    pub fn build(self) -> Result<HashedWheelTimer, TimerError> {
        super::sync::init_fences();
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
        let defers_readings = clock.defers_readings();
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
            defers_readings,
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
    pub(crate) handle: Arc<Handle>,
}

/// Owned by the `HashedWheelTimer` clones only (not by `Timeout`s or the
/// worker), so its drop means "the last timer handle is gone".
pub(crate) struct Handle {
    pub(crate) shared: Arc<Shared>,
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
        let _ = shutdown(shared);
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
        new_timeout(&self.handle.shared, delay, task)
    }

    /// Starts the worker thread if it is not running yet. Optional: the
    /// first `new_timeout` does it. Returns once the worker has recorded its
    /// start time. Fails after `stop`.
    pub fn start(&self) -> Result<(), TimerError> {
        start(&self.handle.shared)
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
        shutdown(shared)
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

/// Starts the worker thread if it is not running yet, and waits for its
/// start time. Fails after `stop()`.
fn start(shared: &Arc<Shared>) -> Result<(), TimerError> {
    if shared.start_ns.load(Ordering::Acquire) != START_UNSET {
        return if shared.is_shutdown() {
            Err(TimerError::Stopped)
        } else {
            Ok(())
        };
    }
    match shared.state.compare_exchange(
        WORKER_INIT,
        WORKER_STARTED,
        Ordering::SeqCst,
        Ordering::SeqCst,
    ) {
        Ok(_) => {
            let worker_shared = Arc::clone(shared);
            let spawned = thread::Builder::new()
                .name(shared.thread_name.clone())
                .spawn(move || worker::run(worker_shared));
            match spawned {
                Ok(handle) => *shared.worker.lock() = Some(handle),
                Err(e) => {
                    shared.state.store(WORKER_SHUTDOWN, Ordering::SeqCst);
                    shared.close_registry();
                    shared.uncount();
                    shared.publish_start(0);
                    return Err(TimerError::Spawn(e));
                }
            }
        }
        Err(WORKER_STARTED) => {}
        Err(_) => return Err(TimerError::Stopped),
    }
    shared.wait_started();
    Ok(())
}

/// The fast path: a slot from this thread's pool, its task in it, and a
/// push onto this thread's ring. See the module docs of `timer`.
fn new_timeout<F: TimerTask>(
    shared: &Arc<Shared>,
    delay: Duration,
    task: F,
) -> Result<Timeout, TimerError> {
    if shared.max_pending > 0 {
        let pending = shared.reserved.fetch_add(1, Ordering::SeqCst) + 1;
        if pending > shared.max_pending {
            shared.reserved.fetch_sub(1, Ordering::SeqCst);
            return Err(TimerError::TooManyPending {
                pending: pending - 1,
                max: shared.max_pending,
            });
        }
    }
    // Started and not stopped (the usual case) costs two loads.
    if (shared.start_ns.load(Ordering::Acquire) == START_UNSET || shared.is_shutdown())
        && let Err(e) = start(shared)
    {
        shared.unreserve(1);
        return Err(e);
    }
    let key = Arc::as_ptr(shared).addr();
    let Some(mine) = local::mine(key, || shared.register()) else {
        // The worker is gone: `stop()` ran.
        shared.unreserve(1);
        return Err(TimerError::Stopped);
    };
    // SAFETY: `mine` is this thread's producer, alive for this use.
    let Some(slot) = (unsafe { Producer::alloc(mine.as_ptr()) }) else {
        // The pool closed: `stop()` ran (or the timer is gone).
        shared.unreserve(1);
        return Err(TimerError::Stopped);
    };
    let slot = SlotRef(slot);
    let delay = nanos(delay);
    // The deadline: the delay after a reading taken now, or (in a tight
    // loop) after one taken a little later (see `entry.rs`).
    let deferred = shared.defers_readings
        && delay < MAX_UNRESOLVED_DELAY
        // SAFETY: this thread's producer.
        && unsafe { mine.ring.may_defer() };
    let deadline = if deferred {
        entry::unresolved(delay)
    } else if shared.defers_readings {
        entry::deadline_after(nanos(shared.clock.now()), delay)
    } else {
        nanos(shared.clock.now()).saturating_add(delay)
    };
    // Two references: the handle and the ring entry.
    // SAFETY: the slot is fresh and ours.
    unsafe { init_slot(slot.0, deadline, 2, task) };
    // SAFETY: this thread's producer.
    let pushed = unsafe { mine.ring.push(entry_of(slot, false, deferred), true) };
    // SAFETY: as above.
    if deferred && pushed != Pushed::Closed && unsafe { mine.ring.mark_due() } {
        // A reading taken after the deferred timeouts' pushes resolves them.
        let reading = nanos(shared.clock.now());
        if reading <= MAX_MARK {
            // SAFETY: as above.
            if unsafe { mine.ring.push(time_entry(reading), false) } == Pushed::QueuedWake {
                shared.wake();
            }
        }
    }
    drop(mine);
    match pushed {
        Pushed::Queued => {}
        Pushed::QueuedWake => shared.wake(),
        // The worker collected its last leftovers: `stop()` ran.
        Pushed::Closed => {
            shared.unreserve(1);
            // Both references go; the last drops the task.
            release(slot);
            release(slot);
            return Err(TimerError::Stopped);
        }
    }
    Ok(Timeout { slot })
}

/// Moves to SHUTDOWN, joins the worker and returns the timeouts that never
/// ran, which the worker cancelled.
fn shutdown(shared: &Shared) -> Result<Vec<Timeout>, TimerError> {
    match shared.state.swap(WORKER_SHUTDOWN, Ordering::SeqCst) {
        WORKER_SHUTDOWN => return Ok(Vec::new()),
        WORKER_INIT => {
            shared.close_registry();
            shared.uncount();
            shared.publish_start(0);
            return Ok(Vec::new());
        }
        _ => {}
    }
    shared.parker.unpark();
    let handle = shared.worker.lock().take();
    let never_ran = match handle.map(JoinHandle::join) {
        Some(Ok(never_ran)) => never_ran,
        Some(Err(_)) => {
            tracing::error!(target: "redwheel::timer", "the timer's worker thread panicked");
            Vec::new()
        }
        None => Vec::new(),
    };
    shared.uncount();
    Ok(never_ran)
}
