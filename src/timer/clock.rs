//! Where the timer's time comes from.
//!
//! A [`Clock`] gives the time elapsed since its own origin, and knows how to
//! put the timer's worker to sleep until a given time. Two clocks exist:
//!
//! * [`SystemClock`], the default: the monotonic clock ([`Instant`]); the
//!   worker sleeps on a condition variable with a deadline.
//! * [`ManualClock`]: time moves only when a test calls
//!   [`ManualClock::advance`], which returns once every timer worker attached
//!   to the clock has processed everything that became due and gone back to
//!   sleep. Timing-dependent tests become exact and fast.
//!
//! The trait is sealed: the worker's sleeping protocol is an internal
//! contract, so only the clocks of this module implement it.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

/// A source of monotonic time for a [`HashedWheelTimer`](super::HashedWheelTimer).
///
/// Implemented by [`SystemClock`] and [`ManualClock`]; sealed.
pub trait Clock: sealed::Sealed + Send + Sync + fmt::Debug + 'static {
    /// Time elapsed since this clock's origin. Never goes backwards.
    fn now(&self) -> Duration;
}

pub(crate) mod sealed {
    pub use super::parker::Parker;
    use std::time::Duration;

    /// The internal half of [`Clock`](super::Clock).
    pub trait Sealed {
        /// Called by a worker thread once, before it publishes its start
        /// time, with the parker it will sleep on.
        fn attach(&self, parker: &Parker);

        /// Blocks the calling worker until the clock reads at least
        /// `deadline` (forever when `None`), or until `parker` is unparked.
        /// May return early for no reason; the worker re-checks. `precise`
        /// asks to return as close after `deadline` as the clock allows
        /// (timeouts fall due then), at some CPU cost.
        fn park(&self, parker: &Parker, deadline: Option<Duration>, precise: bool);

        /// Whether a reading costs enough (a system call's worth) that a
        /// thread scheduling in a tight loop should read the clock for only
        /// some of its timeouts and leave the others' deadlines to a later
        /// reading (`entry.rs`, `handle.rs`). False by default.
        fn defers_readings(&self) -> bool {
            false
        }
    }
}

pub(crate) use parker::Parker;

mod parker {
    use super::ParkerInner;
    use std::sync::Arc;

    /// What a worker sleeps on: a flag set by `unpark` and a condition
    /// variable, plus what a `ManualClock` needs to know about the sleeper
    /// (asleep or not, and until when). Public only to satisfy the sealed
    /// trait; not reachable from outside the crate.
    #[derive(Clone, Debug, Default)]
    pub struct Parker {
        pub(super) inner: Arc<ParkerInner>,
    }
}

#[derive(Debug, Default)]
struct ParkerInner {
    state: Mutex<ParkState>,
    cv: Condvar,
}

#[derive(Debug, Default)]
struct ParkState {
    /// Set by `unpark`, consumed by the sleeper.
    notified: bool,
    /// `Some(deadline)` while the worker sleeps in `park`.
    parked: Option<Option<Duration>>,
    /// The worker has exited for good.
    exited: bool,
}

impl ParkState {
    /// The worker has nothing left to do at time `now` until time moves on
    /// or someone unparks it.
    fn settled(&self, now: Duration) -> bool {
        self.exited
            || (!self.notified
                && match self.parked {
                    Some(None) => true,
                    Some(Some(deadline)) => deadline > now,
                    None => false,
                })
    }
}

impl Parker {
    /// Wakes the worker if it sleeps, or makes its next `park` return at
    /// once.
    pub fn unpark(&self) {
        let mut st = self.inner.state.lock();
        st.notified = true;
        self.inner.cv.notify_all();
    }

    /// Marks the worker as gone, so manual clocks stop waiting for it.
    pub fn exit(&self) {
        let mut st = self.inner.state.lock();
        st.exited = true;
        self.inner.cv.notify_all();
    }
}

/// The real clock: [`Instant`], measured from the moment the clock was made.
///
/// Both `new_timeout` (for a deadline) and the worker (to decide when a
/// timeout fires) read `Instant` itself, so a deadline is never earlier
/// than `Instant::now() + delay` at the call. (An earlier release read the
/// time-stamp counter for deadlines, extrapolated from a recent `Instant`;
/// nothing bounded its error if the kernel moved the clock away from the
/// counter, so it is gone.)
#[derive(Clone, Copy, Debug)]
pub struct SystemClock {
    origin: Instant,
}

impl SystemClock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        SystemClock {
            origin: Instant::now(),
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Duration {
        self.origin.elapsed()
    }
}

/// How long before a precise deadline [`SystemClock`] stops sleeping and
/// spins (reading the clock) until the deadline.
const PRECISE_SPIN: Duration = Duration::from_micros(50);

impl sealed::Sealed for SystemClock {
    /// The worker's timed sleeps end where timeouts fall due: their
    /// lateness is the sleep's overshoot. Linux lets a timed wait end up to
    /// the thread's timer slack late (50 µs by default, so that wake-ups can
    /// be batched); the worker asks for 1 ns (`PR_SET_TIMERSLACK`, its
    /// thread only).
    fn attach(&self, _parker: &Parker) {
        #[cfg(all(target_os = "linux", not(miri)))]
        // SAFETY: `prctl(PR_SET_TIMERSLACK)` sets a number in the calling
        // thread's kernel state and touches no memory of ours. A failure
        // only leaves the default slack.
        unsafe {
            libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0);
        }
    }

    /// `Instant::now()` is a `clock_gettime` (a vDSO call that orders the
    /// counter read: 35–40 ns on the project's VM, more than the rest of
    /// `new_timeout`).
    fn defers_readings(&self) -> bool {
        true
    }

    /// A timed wait on the parker's condition variable (a futex), which a
    /// producer's `unpark` ends early. Even with 1 ns of slack the wake-up
    /// comes some tens of microseconds late (the timer interrupt, the
    /// scheduler, the VM), so a precise one ends the wait [`PRECISE_SPIN`]
    /// early and spins on the clock for the rest, without yielding: a
    /// yield gives the CPU away for a whole time slice when another thread
    /// wants it, milliseconds on a busy machine. (See README, "The worker's
    /// wake-up", for the measurements behind the choice.)
    fn park(&self, parker: &Parker, deadline: Option<Duration>, precise: bool) {
        let inner = &parker.inner;
        let mut st = inner.state.lock();
        let target = deadline.map(|d| self.origin + d);
        if !st.notified {
            match target {
                None => {
                    inner.cv.wait(&mut st);
                }
                Some(target) => {
                    let wait_until = if precise {
                        target.checked_sub(PRECISE_SPIN).unwrap_or(target)
                    } else {
                        target
                    };
                    if wait_until > Instant::now() {
                        inner.cv.wait_until(&mut st, wait_until);
                    }
                }
            }
        }
        let notified = std::mem::take(&mut st.notified);
        drop(st);
        if let (true, false, Some(target)) = (precise, notified, target) {
            while Instant::now() < target {
                std::hint::spin_loop();
            }
        }
    }
}

/// A clock that moves only when told to, for deterministic tests.
///
/// Clones share the same time. Give a clone to
/// [`Builder::clock`](super::Builder::clock), then move time with
/// [`advance`](ManualClock::advance):
///
/// ```
/// use std::sync::atomic::{AtomicBool, Ordering};
/// use std::sync::Arc;
/// use std::time::Duration;
/// use redwheel::timer::{HashedWheelTimer, ManualClock};
///
/// let clock = ManualClock::new();
/// let timer = HashedWheelTimer::builder()
///     .tick_duration(Duration::from_millis(10))
///     .clock(clock.clone())
///     .build()?;
/// let fired = Arc::new(AtomicBool::new(false));
/// let f = fired.clone();
/// timer.new_timeout(Duration::from_millis(25), move |_| f.store(true, Ordering::SeqCst))?;
///
/// clock.advance(Duration::from_millis(20));
/// assert!(!fired.load(Ordering::SeqCst)); // never early
/// clock.advance(Duration::from_millis(10));
/// assert!(fired.load(Ordering::SeqCst)); // fired during the tick [20 ms, 30 ms)
/// # Ok::<(), redwheel::timer::TimerError>(())
/// ```
#[derive(Clone, Default)]
pub struct ManualClock {
    inner: Arc<ManualInner>,
}

#[derive(Default)]
struct ManualInner {
    /// Nanoseconds since the origin.
    now: AtomicU64,
    sleepers: Mutex<Vec<Weak<ParkerInner>>>,
    /// Tests only: deadlines wait for readings as on the system clock.
    defers: bool,
}

/// How long [`ManualClock::advance`] waits for a worker that does not go
/// back to sleep (a task stuck on something the test thread holds) before it
/// gives up and says so in a warning, rather than hang the test forever.
const SETTLE_LIMIT: Duration = Duration::from_secs(60);

impl ManualClock {
    /// A clock reading zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// A clock reading zero on which deadlines wait for readings as on the
    /// system clock (unit tests of that path).
    #[cfg(test)]
    pub(crate) fn deferring() -> Self {
        ManualClock {
            inner: Arc::new(ManualInner {
                defers: true,
                ..ManualInner::default()
            }),
        }
    }

    /// Moves time forward by `by`, then waits until every timer worker on
    /// this clock has processed all ticks that ended and sleeps again.
    ///
    /// Tasks that run on a worker thread (the default) have therefore run
    /// when this returns; tasks handed to an executor have been handed over.
    /// Time saturates at `u64::MAX` nanoseconds (about 584 years).
    pub fn advance(&self, by: Duration) {
        let by = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        let now = self.inner.now.load(Ordering::SeqCst).saturating_add(by);
        self.inner.now.store(now, Ordering::SeqCst);
        self.wait_settled(Duration::from_nanos(now));
    }

    /// Waits until every attached worker sleeps with nothing to do at the
    /// current time, without moving time. Useful after an operation that
    /// wakes a worker (a zero-delay timeout, a cancellation).
    pub fn settle(&self) {
        self.wait_settled(self.now());
    }

    fn wait_settled(&self, now: Duration) {
        let sleepers: Vec<Arc<ParkerInner>> = {
            let mut list = self.inner.sleepers.lock();
            list.retain(|w| w.strong_count() > 0);
            list.iter().filter_map(Weak::upgrade).collect()
        };
        let give_up = Instant::now() + SETTLE_LIMIT;
        for p in sleepers {
            let mut st = p.state.lock();
            p.cv.notify_all();
            while !st.settled(now) {
                if p.cv.wait_until(&mut st, give_up).timed_out() && !st.settled(now) {
                    tracing::warn!(
                        target: "redwheel::timer",
                        "ManualClock: a timer worker did not go back to sleep within {:?}",
                        SETTLE_LIMIT
                    );
                    break;
                }
            }
        }
    }
}

impl fmt::Debug for ManualClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ManualClock")
            .field("now", &self.now())
            .finish()
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Duration {
        Duration::from_nanos(self.inner.now.load(Ordering::SeqCst))
    }
}

impl sealed::Sealed for ManualClock {
    fn defers_readings(&self) -> bool {
        self.inner.defers
    }

    fn attach(&self, parker: &Parker) {
        self.inner
            .sleepers
            .lock()
            .push(Arc::downgrade(&parker.inner));
    }

    fn park(&self, parker: &Parker, deadline: Option<Duration>, _precise: bool) {
        let inner = &parker.inner;
        let mut st = inner.state.lock();
        // Time is read under the parker's lock: `advance` stores the new time
        // before it takes this lock to wake us, so no advance is missed.
        while !st.notified && deadline.is_none_or(|d| self.now() < d) {
            st.parked = Some(deadline);
            inner.cv.notify_all();
            inner.cv.wait(&mut st);
        }
        st.parked = None;
        st.notified = false;
    }
}

/// A clock reading in nanoseconds (saturating; 584 years fit).
pub(crate) fn nanos(d: Duration) -> u64 {
    d.as_secs()
        .checked_mul(1_000_000_000)
        .and_then(|ns| ns.checked_add(u64::from(d.subsec_nanos())))
        .unwrap_or(u64::MAX)
}
