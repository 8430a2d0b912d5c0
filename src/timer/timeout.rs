//! The [`Timeout`] handle: one pointer to the timeout's slot (`entry.rs`),
//! counted in the slot's state word.
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
//! `true`. A successful `cancel` drops the task at once and tells the
//! worker: it queues a cancellation (with a reference of its own) on the
//! calling thread's producer, or, when the calling thread pushed the
//! timeout last and the worker has not claimed it yet, takes the timeout
//! back out of the ring (`ring.rs`, *unpublish*). Either way the worker
//! counts it out at the next tick boundary.

use std::fmt;
use std::ptr;
use std::time::Duration;

use super::entry::{ST_CANCELLED, ST_EXPIRED, ST_INIT, SlotRef};
use super::local;
use super::pool::release;
use super::producer::producer_of;
use super::ring::{Pushed, entry_of};

/// A handle on one scheduled task, returned by
/// [`HashedWheelTimer::new_timeout`](super::HashedWheelTimer::new_timeout)
/// and passed to the task when it runs.
///
/// Cheap to clone; all clones refer to the same timeout. Dropping a handle
/// does not cancel the timeout. A handle never panics, even long after its
/// timer was stopped or dropped.
pub struct Timeout {
    pub(crate) slot: SlotRef,
}

impl Clone for Timeout {
    fn clone(&self) -> Self {
        self.slot.add_ref();
        Timeout { slot: self.slot }
    }
}

impl Drop for Timeout {
    fn drop(&mut self) {
        release(self.slot);
    }
}

/// What `cancel` did, decided on the producer's side.
enum Cancelled {
    /// Another call (or the worker) got there first.
    Lost,
    /// Taken back out of this thread's ring: its reference is ours.
    TakenBack,
    /// Taken back, and cancelled without a compare-and-swap: nothing else
    /// held it (its entry's reference is dropped already).
    TakenBackAlone,
    /// A cancellation was queued (`Queued`/`QueuedWake`) or refused
    /// (`Closed`: the worker is gone; its reference is ours).
    Queued(Pushed),
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
        if self.slot.state() != ST_INIT {
            return false;
        }
        let slot = self.slot;
        let owner = producer_of(slot);
        let key = owner.timer_key();
        let register = || owner.timer.upgrade().and_then(|timer| timer.register());
        let outcome = local::mine(key, register).map(|mine| {
            let pending = entry_of(slot, false, false);
            // SAFETY: `mine` is this thread's producer.
            let own_last = ptr::eq(&*mine, owner) && unsafe { mine.ring.pushed_last(pending) };
            if own_last && slot.refs() == 2 {
                // This handle and the entry are the only references: once
                // the entry is taken back, nothing else can reach the
                // timeout (no other handle to clone or cancel it; the
                // worker never saw it), and plain stores cancel it.
                // SAFETY: as above.
                if unsafe { mine.ring.unpublish(pending) } {
                    slot.cancel_alone();
                    return Cancelled::TakenBackAlone;
                }
                // The worker claimed it: cancel as from another thread.
                if !slot.try_cancel(1) {
                    return Cancelled::Lost;
                }
            } else if own_last {
                if !slot.try_cancel(0) {
                    return Cancelled::Lost;
                }
                // SAFETY: as above.
                if unsafe { mine.ring.unpublish(pending) } {
                    return Cancelled::TakenBack;
                }
                slot.add_ref();
            } else if !slot.try_cancel(1) {
                return Cancelled::Lost;
            }
            // SAFETY: as above; the entry carries the reference just added.
            Cancelled::Queued(unsafe { mine.ring.push(entry_of(slot, true, false), false) })
        });
        let pushed = match outcome {
            Some(Cancelled::Lost) => return false,
            Some(Cancelled::TakenBack) => {
                release(slot);
                None
            }
            Some(Cancelled::TakenBackAlone) => None,
            Some(Cancelled::Queued(pushed)) => Some(pushed),
            // No producer: the timer is gone or closed.
            None => {
                if !slot.try_cancel(0) {
                    return false;
                }
                Some(Pushed::Closed)
            }
        };
        match pushed {
            Some(Pushed::QueuedWake) => {
                if let Some(timer) = owner.timer.upgrade() {
                    timer.wake();
                }
            }
            Some(Pushed::Closed) => {
                // No worker will see it: count it out here.
                if let Some(timer) = owner.timer.upgrade() {
                    timer.count_out_elsewhere(1);
                }
                if outcome.is_some() {
                    release(slot);
                }
            }
            _ => {}
        }
        // SAFETY: this call moved the state out of `INIT`: the task is ours.
        unsafe { slot.drop_task() };
        true
    }

    /// True if [`cancel`](Timeout::cancel) succeeded on this timeout (or
    /// [`stop`](super::HashedWheelTimer::stop) cancelled it).
    pub fn is_cancelled(&self) -> bool {
        self.slot.state() == ST_CANCELLED
    }

    /// True once the worker has claimed the timeout to run its task: it may
    /// be about to run, running, or done. Never true together with
    /// [`is_cancelled`](Timeout::is_cancelled).
    pub fn is_expired(&self) -> bool {
        self.slot.state() == ST_EXPIRED
    }

    /// When the task becomes due, as time since the origin of the timer's
    /// [`Clock`](super::Clock) (see
    /// [`HashedWheelTimer::now`](super::HashedWheelTimer::now)).
    /// `Duration::from_nanos(u64::MAX)` for a delay too large to represent,
    /// which never fires.
    pub fn deadline(&self) -> Duration {
        let owner = producer_of(self.slot);
        let deadline = match self.slot.resolved_deadline() {
            Some(d) => d,
            _ if !owner.defers_readings => self.slot.deadline(),
            // Deferred and not resolved yet (`entry.rs`): a reading taken
            // now is one taken after the call. (The worker resolves every
            // timeout it holds before it exits, so a timer that is gone
            // leaves none unresolved; if one were, it would never fire.)
            None => self
                .slot
                .resolve(owner.timer.upgrade().map_or(u64::MAX, |t| t.now())),
        };
        Duration::from_nanos(deadline)
    }

    /// True if both handles refer to the same timeout.
    pub fn ptr_eq(&self, other: &Timeout) -> bool {
        self.slot == other.slot
    }
}

impl fmt::Debug for Timeout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.slot.state() {
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
