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

        /// The time `new_timeout` adds its delay to: never earlier than
        /// [`Clock::now`](super::Clock::now) read at the same instant (so
        /// no deadline is early), and at most a few microseconds later.
        fn now_for_deadline(&self) -> Duration;

        /// Blocks the calling worker until the clock reads at least
        /// `deadline` (forever when `None`), or until `parker` is unparked.
        /// May return early for no reason; the worker re-checks. `precise`
        /// asks to return as close after `deadline` as the clock allows
        /// (timeouts fall due then), at some CPU cost.
        fn park(&self, parker: &Parker, deadline: Option<Duration>, precise: bool);
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
/// `new_timeout` reads it through a cheaper estimate where one is provably
/// never behind it (the time-stamp counter; see `clock::tsc` in the
/// source); the worker, which
/// decides when a timeout fires, always reads `Instant`.
#[derive(Clone, Copy, Debug)]
pub struct SystemClock {
    origin: Instant,
    /// `origin` in ns since [`tsc::epoch`].
    origin_ns: u64,
}

impl SystemClock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        let epoch = tsc::epoch();
        let origin = Instant::now();
        SystemClock {
            origin,
            origin_ns: nanos_between(epoch, origin),
        }
    }
}

fn nanos_between(from: Instant, to: Instant) -> u64 {
    u64::try_from(to.saturating_duration_since(from).as_nanos()).unwrap_or(u64::MAX)
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
/// starts yielding until the deadline.
const PRECISE_SPIN: Duration = Duration::from_micros(200);

impl sealed::Sealed for SystemClock {
    fn attach(&self, _parker: &Parker) {}

    fn now_for_deadline(&self) -> Duration {
        match tsc::now_upper() {
            Some(ns) => Duration::from_nanos(ns.saturating_sub(self.origin_ns)),
            None => self.origin.elapsed(),
        }
    }

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
                    // A timed wait overshoots by the kernel's timer slack
                    // and the scheduler's latency (tens of microseconds,
                    // often more on a busy VM). For a precise wake-up, wait
                    // until a little before and yield the rest.
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
                std::thread::yield_now();
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
    fn now_for_deadline(&self) -> Duration {
        self.now()
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

/// A cheap upper bound of the monotonic clock, for deadlines.
///
/// Reading `Instant` costs a `clock_gettime` (about 25 ns on the VMs this
/// was measured on); the time-stamp counter costs an `rdtsc` (about 10 ns).
/// The monotonic clock is, on Linux with the `tsc` clocksource, the counter
/// scaled by a rate the kernel slews by at most 500 ppm. So each thread
/// keeps a *base*: a counter reading `c0` and an `Instant` read *after* it
/// (`m0`, so `m0` is not behind the clock at `c0`), and estimates the clock
/// at counter `c` as `m0 + (c - c0) · r`, with `r` a calibrated rate raised
/// by 0.1 %, more than any slew plus the calibration's error: never behind
/// the clock. It re-reads `Instant` for a new base after 1 ms of counter
/// time, so it is never more than about 1 µs ahead either: a deadline is
/// never early, and at worst (0.1 % of timeouts, those whose exact deadline
/// falls within that microsecond before a tick boundary) fires a tick
/// later. Each new base checks the old estimate against the real clock,
/// and any estimate found behind it turns the estimator off for good.
///
/// Used only where the counter is the kernel's own clocksource (so the
/// kernel vouches that it is invariant and synchronised across CPUs), on
/// x86-64 Linux, outside Miri; elsewhere `now_upper` says `None` and the
/// caller reads `Instant`.
pub(crate) mod tsc {
    use std::cell::Cell;
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::time::Instant;

    use super::nanos_between;

    /// Counter ticks between two reads of `Instant` by one thread, at most
    /// (1 ms worth once calibrated).
    static WINDOW: AtomicU64 = AtomicU64::new(0);
    /// ns per tick, raised by 0.1 %, in 32.32 fixed point; 0 until known.
    static RATE: AtomicU64 = AtomicU64::new(0);
    /// False once the estimator was found behind the clock, or where it
    /// cannot be used.
    static USABLE: AtomicBool = AtomicBool::new(true);
    /// The first sample, for the calibration: (counter, ns since epoch).
    static FIRST: OnceLock<(u64, u64)> = OnceLock::new();

    /// Samples this far apart (in ns) calibrate the rate.
    const CALIBRATE_AFTER_NS: u64 = 20_000_000;
    /// The counter read and the `Instant` read of a sample must be this
    /// close (in counter ticks at ~1-5 GHz: under a microsecond; a read
    /// takes ~25 ns), or the sample is not used to calibrate or to check:
    /// over the 20 ms of a calibration that is an error below 50 ppm.
    const SAMPLE_SLACK: u64 = 2_000;

    thread_local! {
        /// This thread's base: (counter, ns since epoch); counter 0 = none.
        static BASE: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
    }

    /// The instant all estimates are measured from (the first
    /// `SystemClock` made).
    pub(crate) fn epoch() -> Instant {
        static EPOCH: OnceLock<Instant> = OnceLock::new();
        *EPOCH.get_or_init(|| {
            if !supported() {
                USABLE.store(false, Ordering::Relaxed);
            }
            Instant::now()
        })
    }

    fn supported() -> bool {
        cfg!(all(target_arch = "x86_64", target_os = "linux", not(miri)))
            && std::fs::read_to_string(
                "/sys/devices/system/clocksource/clocksource0/current_clocksource",
            )
            .is_ok_and(|s| s.trim() == "tsc")
    }

    #[cfg(all(target_arch = "x86_64", not(miri)))]
    fn counter() -> u64 {
        // SAFETY: `rdtsc` reads the time-stamp counter; it has no
        // preconditions and touches no memory.
        unsafe { core::arch::x86_64::_rdtsc() }
    }

    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    fn counter() -> u64 {
        0
    }

    /// ns since [`epoch`], never behind the monotonic clock; `None` where
    /// the estimator is not used (read `Instant` then).
    #[inline]
    pub(crate) fn now_upper() -> Option<u64> {
        if !USABLE.load(Ordering::Relaxed) {
            return None;
        }
        let c = counter();
        let rate = RATE.load(Ordering::Relaxed);
        let window = WINDOW.load(Ordering::Relaxed);
        let (c0, m0) = BASE.try_with(Cell::get).ok()?;
        let delta = c.wrapping_sub(c0);
        if rate != 0 && c0 != 0 && delta < window {
            return Some(m0 + ((u128::from(delta) * u128::from(rate)) >> 32) as u64 + 1);
        }
        rebase(c)
    }

    /// Reads `Instant` for a new base (after counter `c`), checks the old
    /// estimate against it, and calibrates the rate when it can.
    #[cold]
    fn rebase(c: u64) -> Option<u64> {
        let epoch = epoch();
        let m = nanos_between(epoch, Instant::now());
        let after = counter();
        let (c0, m0) = BASE.try_with(Cell::get).ok()?;
        let rate = RATE.load(Ordering::Relaxed);
        // A tight sample: `m` was read within `SAMPLE_SLACK` ticks of `c`.
        let tight = after.wrapping_sub(c) < SAMPLE_SLACK;
        if tight && rate != 0 && c0 != 0 {
            // The old base's estimate at `c` must not be behind the clock
            // at `c`, which is at least `m` less the read's duration.
            let delta = c.wrapping_sub(c0);
            let read = ((u128::from(after.wrapping_sub(c)) * u128::from(rate)) >> 32) as u64;
            if delta < (1 << 40) {
                let est = m0 + ((u128::from(delta) * u128::from(rate)) >> 32) as u64 + 1;
                if est + read < m {
                    USABLE.store(false, Ordering::Relaxed);
                    tracing::warn!(
                        target: "redwheel::timer",
                        behind_ns = m - read - est,
                        "the time-stamp counter ran slower than the clock; \
                         deadlines now read the clock directly"
                    );
                    return None;
                }
            }
        }
        let _ = BASE.try_with(|b| b.set((c, m)));
        if rate == 0 && tight {
            let &(fc, fm) = FIRST.get_or_init(|| (c, m));
            if m.saturating_sub(fm) >= CALIBRATE_AFTER_NS && c > fc {
                // ns per tick, measured from `Instant` reads that each came
                // after their counter read: the later sample's read may
                // lag by up to its slack, the first's too; raise by 0.1 %.
                let ticks = c - fc;
                let ns = m - fm;
                let exact = (u128::from(ns) << 32) / u128::from(ticks);
                let raised = exact + exact / 1000 + 1;
                let window = (1_000_000u128 << 32) / raised;
                if let (Ok(r), Ok(w)) = (u64::try_from(raised), u64::try_from(window)) {
                    WINDOW.store(w, Ordering::Relaxed);
                    RATE.store(r, Ordering::Relaxed);
                }
            }
        }
        Some(m)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn the_deadline_clock_is_never_behind_the_clock_read_before_it() {
        // Long enough (and with enough re-bases) for the counter estimate
        // to calibrate and take over where it is used.
        let clock = SystemClock::new();
        let until = Instant::now() + Duration::from_millis(60);
        let mut reads = 0u64;
        while Instant::now() < until {
            let before = clock.now();
            let estimate = sealed::Sealed::now_for_deadline(&clock);
            assert!(
                estimate >= before,
                "estimate {estimate:?} is behind the clock read before it ({before:?})"
            );
            reads += 1;
        }
        assert!(reads > 0);
    }

    #[test]
    fn a_manual_clock_gives_deadlines_its_exact_time() {
        let clock = ManualClock::new();
        clock.advance(Duration::from_nanos(12_345));
        assert_eq!(
            sealed::Sealed::now_for_deadline(&clock),
            Duration::from_nanos(12_345)
        );
    }
}
