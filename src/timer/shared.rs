//! The timer's shared state: what the handles, the timeouts, the producers
//! and the worker all see, and the small operations on it (counting,
//! waking the worker, registering a producer).
//!
//! # Ground rules
//!
//! * `state` moves `INIT → STARTED → SHUTDOWN` (or `INIT → SHUTDOWN`), once
//!   each; `start_ns` is published once, by the worker (or a failed spawn).
//! * The pending count is never stored: it is what the producers accepted
//!   (`added` of the listed ones, `retired_added` of the rest) minus what
//!   was counted out (`removed_by_worker`, written by the worker only, and
//!   `removed_elsewhere`, after the worker is gone). No counter is written
//!   by every producer.
//! * The registry (`producers`) changes under its lock and bumps
//!   `generation`, which the worker checks before it dozes.
//! * `doze` is the worker's sleep handshake: it sets `DOZE_DOZING` and arms
//!   every ring; a push that finds its ring armed claims the wake-up with a
//!   compare-and-swap that also records when, and unparks the worker.

use std::sync::atomic::{AtomicBool, AtomicUsize as StdAtomicUsize, Ordering as StdOrdering};
use std::sync::{Arc, OnceLock};
use std::thread::{self, JoinHandle, ThreadId};

use crossbeam_utils::CachePadded;
use parking_lot::Condvar;

use super::clock::{Clock, Parker, nanos};
use super::producer::{Producer, Registry, TimerLink};
use super::sync::{self, AtomicU8, AtomicU64, AtomicUsize, Mutex, Ordering};
use super::task::Executor;
use super::timeout::Timeout;

pub(crate) const WORKER_INIT: u8 = 0;
pub(crate) const WORKER_STARTED: u8 = 1;
pub(crate) const WORKER_SHUTDOWN: u8 = 2;

/// `start_ns` before the worker has published its start time.
pub(crate) const START_UNSET: u64 = u64::MAX;

/// `Shared::doze` values; `DOZE_WOKEN_BASE + t` records a wake-up at `t`.
pub(crate) const DOZE_AWAKE: u64 = 0;
pub(crate) const DOZE_DOZING: u64 = 1;
pub(crate) const DOZE_WOKEN_BASE: u64 = 2;

/// Timers built and not yet stopped or dropped (see `INSTANCE_COUNT_LIMIT`).
pub(crate) static LIVE_TIMERS: StdAtomicUsize = StdAtomicUsize::new(0);

/// State shared by the timer handles, the timeouts and the worker.
pub(crate) struct Shared {
    pub(crate) state: AtomicU8,
    /// The worker's start time on the clock, in ns; `START_UNSET` before.
    pub(crate) start_ns: AtomicU64,
    pub(crate) start_lock: parking_lot::Mutex<()>,
    pub(crate) start_cv: Condvar,
    /// The producers: one per thread that scheduled or cancelled here (see
    /// `producer.rs`).
    pub(crate) producers: Mutex<Registry>,
    /// Bumped whenever `producers` changes, so the worker knows to look.
    pub(crate) generation: AtomicU64,
    /// Timeouts counted out (expired, or their cancellation processed) by
    /// the worker; only the worker writes it. Pending is the producers'
    /// `added` minus this and `removed_elsewhere`.
    pub(crate) removed_by_worker: CachePadded<AtomicU64>,
    /// Timeouts counted out by other threads (after the worker exited).
    pub(crate) removed_elsewhere: AtomicU64,
    /// How late (ns) the worker processed its latest tick: clock time when
    /// it began minus the tick's end. Written by the worker once per
    /// processed tick, read by `HashedWheelTimer::tick_lag`.
    pub(crate) tick_lag_ns: AtomicU64,
    /// With `max_pending > 0` only: the pending count, kept exactly for
    /// admission (a reservation is taken before the push).
    pub(crate) reserved: AtomicUsize,
    pub(crate) max_pending: usize,
    pub(crate) tick_ns: u64,
    pub(crate) wheel_len: usize,
    pub(crate) clock: Arc<dyn Clock>,
    /// The clock's `defers_readings` (see `entry.rs`).
    pub(crate) defers_readings: bool,
    /// `DOZE_AWAKE`, `DOZE_DOZING` (the worker sleeps past the end of the
    /// current tick), or `DOZE_WOKEN_BASE + t`: a producer or canceller woke
    /// it at clock time `t`. One word, so claiming the wake-up and recording
    /// its time is one CAS, and the worker reads and clears both at once.
    pub(crate) doze: AtomicU64,
    pub(crate) parker: Parker,
    pub(crate) worker: Mutex<Option<JoinHandle<Vec<Timeout>>>>,
    pub(crate) worker_id: OnceLock<ThreadId>,
    pub(crate) executor: Option<Arc<dyn Executor>>,
    pub(crate) thread_name: String,
    /// This timer is still counted in `LIVE_TIMERS`.
    pub(crate) counted: AtomicBool,
}

impl Shared {
    pub(crate) fn on_worker_thread(&self) -> bool {
        self.worker_id.get() == Some(&thread::current().id())
    }

    #[inline]
    pub(crate) fn is_shutdown(&self) -> bool {
        self.state.load(Ordering::SeqCst) == WORKER_SHUTDOWN
    }

    /// Stops counting this timer in `LIVE_TIMERS` (once).
    pub(crate) fn uncount(&self) {
        if self.counted.swap(false, StdOrdering::Relaxed) {
            LIVE_TIMERS.fetch_sub(1, StdOrdering::Relaxed);
        }
    }

    /// Called by the worker (or a failed spawn) once: releases `start()`.
    pub(crate) fn publish_start(&self, start_ns: u64) {
        let _guard = self.start_lock.lock();
        self.start_ns.store(start_ns, Ordering::Release);
        self.start_cv.notify_all();
    }

    /// Waits until the worker has published its start time.
    pub(crate) fn wait_started(&self) {
        let mut guard = self.start_lock.lock();
        while self.start_ns.load(Ordering::Acquire) == START_UNSET {
            self.start_cv.wait(&mut guard);
        }
    }

    /// Wakes the dozing worker (a push found its ring armed). Claims the
    /// wake-up and says when, in one step: the worker may run only after
    /// the clock moved on, and must not skip the tick the push belongs to.
    /// Only the first claimant unparks it.
    pub(crate) fn wake(&self) {
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
    pub(crate) fn pending(&self) -> usize {
        let removed = self.removed_by_worker.load(Ordering::Acquire)
            + self.removed_elsewhere.load(Ordering::Acquire);
        let added: u64 = {
            let reg = self.producers.lock();
            reg.retired_added + reg.list.iter().map(|p| p.ring.added()).sum::<u64>()
        };
        usize::try_from(added.saturating_sub(removed)).unwrap_or(usize::MAX)
    }

    /// Releases admission reservations (bounded timers only).
    pub(crate) fn unreserve(&self, n: usize) {
        if self.max_pending > 0 {
            self.reserved.fetch_sub(n, Ordering::SeqCst);
        }
    }

    /// Counts out `n` timeouts from a thread other than the running worker.
    pub(crate) fn count_out_elsewhere(&self, n: u64) {
        self.removed_elsewhere.fetch_add(n, Ordering::AcqRel);
        self.unreserve(n as usize);
    }

    /// Closes the registry of a timer whose worker never ran: no producer
    /// can join it any more (none has: producers register after `start`).
    pub(crate) fn close_registry(&self) {
        self.producers.lock().closed = true;
    }

    /// Registers a new producer for the calling thread; `None` once the
    /// worker is gone (the registry is closed).
    pub(crate) fn register(self: &Arc<Self>) -> Option<sync::Arc<Producer>> {
        let timer: Arc<dyn TimerLink> = Arc::clone(self) as Arc<dyn TimerLink>;
        let p = sync::Arc::new(Producer::new(Arc::downgrade(&timer), self.defers_readings));
        {
            let mut reg = self.producers.lock();
            if reg.closed {
                return None;
            }
            reg.list.push(sync::Arc::clone(&p));
            self.generation.fetch_add(1, Ordering::SeqCst);
        }
        // The worker may be dozing with the old list armed: make it look
        // again (it checks the generation after announcing its doze).
        if self.doze.load(Ordering::SeqCst) == DOZE_DOZING {
            self.wake();
        }
        Some(p)
    }
}

impl TimerLink for Shared {
    fn register(self: Arc<Self>) -> Option<sync::Arc<Producer>> {
        Shared::register(&self)
    }

    fn wake(&self) {
        Shared::wake(self);
    }

    fn count_out_elsewhere(&self, n: u64) {
        Shared::count_out_elsewhere(self, n);
    }

    fn now(&self) -> u64 {
        nanos(self.clock.now())
    }
}
