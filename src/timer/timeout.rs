//! The [`Timeout`] handle and the state machine it shares with the worker.
//!
//! # State
//!
//! ```text
//!   INIT ──cancel() wins the CAS──▶ CANCELLED   (final)
//!     │
//!     └──worker wins the CAS──────▶ EXPIRED     (final; the task then runs)
//! ```
//!
//! Only those two moves exist, each a compare-and-swap from `INIT`, so a
//! timeout fires at most once, and never after a `cancel()` that returned
//! `true`. Beside the state, the timeout records where the worker put it in
//! the wheel (its position); only the worker writes and reads that, so it is
//! a plain store, and the state and position together take eight bytes.
//!
//! The task lives in the same allocation as the state (one allocation per
//! timeout). Whoever wins the state transition takes it out: the worker to
//! run it, a successful `cancel` to drop it.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use crossbeam_utils::atomic::AtomicCell;

use super::inbox::Inbox;
use super::wheel::{NOT_PLACED, Placed};

const ST_INIT: u32 = 0;
const ST_CANCELLED: u32 = 1;
const ST_EXPIRED: u32 = 2;

/// What a timeout shares between its handles and the worker: its deadline,
/// its state word and its task, in one allocation. `T` is the task's slot;
/// handles and the worker see it as `dyn TaskSlot`.
pub(crate) struct TimeoutInner<T: ?Sized + TaskSlot = dyn TaskSlot> {
    /// Nanoseconds on the timer's clock (since the clock's origin);
    /// `u64::MAX` means "never".
    pub(crate) deadline: u64,
    state: AtomicU32,
    /// Where the worker put it in the wheel (`NOT_PLACED` when it is in no
    /// bucket). Worker only.
    pos: AtomicU32,
    task: T,
}

/// A shared timeout, as handles, queues and the wheel hold it.
pub(crate) type SharedTimeout = Arc<TimeoutInner>;

/// A task's slot inside its timeout: the task is taken out exactly once,
/// to run it or to drop it, by whoever won the timeout's state transition.
pub(crate) trait TaskSlot: Send + Sync {
    /// Takes the task out (if it is still there) and runs it.
    fn run(&self, timeout: &Timeout);
    /// Takes the task out (if it is still there) and drops it.
    fn discard(&self);
}

/// `AtomicCell` is exactly as large as the `Option<F>` it holds and lets a
/// shared reference move the task out, without `unsafe` in this crate.
pub(crate) struct Slot<F>(AtomicCell<Option<F>>);

impl<F> TaskSlot for Slot<F>
where
    F: FnOnce(&Timeout) + Send + 'static,
{
    fn run(&self, timeout: &Timeout) {
        if let Some(task) = self.0.take() {
            task(timeout);
        }
    }

    fn discard(&self) {
        drop(self.0.take());
    }
}

impl TimeoutInner {
    /// A new pending timeout holding `task`.
    pub(crate) fn new<F>(deadline: u64, task: F) -> SharedTimeout
    where
        F: FnOnce(&Timeout) + Send + 'static,
    {
        Arc::new(TimeoutInner {
            deadline,
            state: AtomicU32::new(ST_INIT),
            pos: AtomicU32::new(NOT_PLACED),
            task: Slot(AtomicCell::new(Some(task))),
        })
    }
}

impl<T: ?Sized + TaskSlot> TimeoutInner<T> {
    fn state(&self) -> u32 {
        self.state.load(Ordering::Acquire)
    }

    /// INIT → `to`; true if this call made the move.
    fn transition(&self, to: u32) -> bool {
        self.state
            .compare_exchange(ST_INIT, to, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// INIT → CANCELLED, dropping the task. True only for the caller that
    /// made the move.
    pub(crate) fn try_cancel(&self) -> bool {
        let won = self.transition(ST_CANCELLED);
        if won {
            self.task.discard();
        }
        won
    }

    /// INIT → EXPIRED, by the worker just before it runs the task.
    pub(crate) fn try_expire(&self) -> bool {
        self.transition(ST_EXPIRED)
    }

    pub(crate) fn is_cancelled(&self) -> bool {
        self.state() == ST_CANCELLED
    }

    /// Runs the task (once; later calls do nothing).
    pub(crate) fn run_task(&self, timeout: &Timeout) {
        self.task.run(timeout);
    }

    /// Drops the task without running it (it may already be gone).
    pub(crate) fn discard_task(&self) {
        self.task.discard();
    }
}

impl Placed for SharedTimeout {
    fn pos(&self) -> u32 {
        self.pos.load(Ordering::Relaxed)
    }

    fn set_pos(&self, pos: u32) {
        self.pos.store(pos, Ordering::Relaxed);
    }

    fn same(&self, other: &Self) -> bool {
        Arc::ptr_eq(self, other)
    }
}

/// A handle on one scheduled task, returned by
/// [`HashedWheelTimer::new_timeout`](super::HashedWheelTimer::new_timeout)
/// and passed to the task when it runs.
///
/// Cheap to clone; all clones refer to the same timeout. Dropping a handle
/// does not cancel the timeout. A handle never panics, even long after its
/// timer was stopped or dropped.
#[derive(Clone)]
pub struct Timeout {
    pub(crate) inner: SharedTimeout,
    /// The inbox the timeout was queued through, for `cancel` to reach the
    /// worker. `None` on handles whose timeout can no longer be cancelled
    /// (those the worker passes to running tasks, those `stop()` returns):
    /// `cancel` has nothing to do there, and the worker saves a
    /// reference-count round trip per expiry.
    pub(crate) inbox: Option<Arc<Inbox>>,
}

impl Timeout {
    /// Cancels the timeout: its task will never run, and is dropped now, on
    /// the calling thread.
    ///
    /// Returns `true` only if this call moved the timeout from pending to
    /// cancelled; `false` if it had already expired (its task runs or ran)
    /// or was already cancelled. The timer lets go of a cancelled timeout
    /// (its memory goes with the last handle), and
    /// [`pending_timeouts`](super::HashedWheelTimer::pending_timeouts)
    /// stops counting it, within one tick.
    pub fn cancel(&self) -> bool {
        if !self.inner.try_cancel() {
            return false;
        }
        if let Some(inbox) = &self.inbox {
            inbox.push_cancelled(&self.inner);
        }
        true
    }

    /// True if [`cancel`](Timeout::cancel) succeeded on this timeout (or
    /// [`stop`](super::HashedWheelTimer::stop) cancelled it).
    pub fn is_cancelled(&self) -> bool {
        self.inner.state() == ST_CANCELLED
    }

    /// True once the worker has claimed the timeout to run its task: it may
    /// be about to run, running, or done. Never true together with
    /// [`is_cancelled`](Timeout::is_cancelled).
    pub fn is_expired(&self) -> bool {
        self.inner.state() == ST_EXPIRED
    }

    /// When the task becomes due, as time since the origin of the timer's
    /// [`Clock`](super::Clock) (see
    /// [`HashedWheelTimer::now`](super::HashedWheelTimer::now)).
    /// `Duration::from_nanos(u64::MAX)` for a delay too large to represent,
    /// which never fires.
    pub fn deadline(&self) -> Duration {
        Duration::from_nanos(self.inner.deadline)
    }

    /// True if both handles refer to the same timeout.
    pub fn ptr_eq(&self, other: &Timeout) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl fmt::Debug for Timeout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.inner.state() {
            ST_INIT => "pending",
            ST_CANCELLED => "cancelled",
            _ => "expired",
        };
        f.debug_struct("Timeout")
            .field("deadline", &self.deadline())
            .field("state", &state)
            .finish()
    }
}
