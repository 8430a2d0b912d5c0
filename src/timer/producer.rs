//! A producer: one thread's way into one timer, and the timer's list of
//! them.
//!
//! Every thread that schedules or cancels on a timer gets a [`Producer`]
//! for it (found through the thread's own list, `local.rs`, and registered
//! with the timer on first use). A producer is a [`Ring`] of entries
//! (`ring.rs`), which only its thread pushes to and only the worker reads,
//! plus the [`Pool`] its timeouts' slots come from (`pool.rs`). A slot
//! finds its producer through its chunk ([`producer_of`]), and through it
//! the ring to queue a cancellation on and the timer to wake.
//!
//! # Ground rules
//!
//! * The ring's producing side and the pool's local side belong to the
//!   producer's thread; the ring's reading side to the worker.
//! * A producer's thread leaving (its thread-local list is destroyed)
//!   *orphans* it: the pool closes, and the worker retires the producer
//!   once it has claimed everything in its ring.
//! * The worker closes every ring at exit ([`Producer::close`]); a push
//!   after that is refused, and the pool closes at the owner's next free.
//! * The producer knows its timer only through [`TimerLink`] (the timer's
//!   shared state, `shared.rs`, sits above this layer).

use std::ptr::NonNull;
use std::sync::Weak;

use super::entry::{Slot, SlotRef};
use super::pool::{self, Pool};
use super::ring::{Entry, Ring};
use super::sync::{Arc, AtomicBool, Ordering, thread_id};

/// What a producer, and a timeout through it, needs of its timer.
pub(crate) trait TimerLink: Send + Sync {
    /// Registers a new producer for the calling thread with the timer;
    /// `None` once its worker is gone.
    fn register(self: std::sync::Arc<Self>) -> Option<Arc<Producer>>;

    /// Wakes the dozing worker (a push found its ring armed).
    fn wake(&self);

    /// Counts out `n` timeouts from a thread other than the running worker
    /// (the worker is gone, so nobody else will).
    fn count_out_elsewhere(&self, n: u64);

    /// A reading of the timer's clock, in ns (to resolve a deferred
    /// deadline: `entry.rs`).
    fn now(&self) -> u64;
}

/// A thread's way into one timer: see the module docs.
pub(crate) struct Producer {
    pub(crate) ring: Ring,
    pub(crate) pool: Pool,
    /// Its thread has left it (see the module docs).
    orphaned: AtomicBool,
    /// The timer; its address is the key the thread-local lists use.
    pub(crate) timer: Weak<dyn TimerLink>,
    /// The timer's clock defers readings: its timeouts' deadlines may be
    /// unresolved (`entry.rs`).
    pub(crate) defers_readings: bool,
}

impl Producer {
    /// A producer for the calling thread on `timer`.
    pub(crate) fn new(timer: Weak<dyn TimerLink>, defers_readings: bool) -> Self {
        Producer {
            ring: Ring::new(),
            pool: Pool::new(thread_id(), hold, let_go),
            orphaned: AtomicBool::new(false),
            timer,
            defers_readings,
        }
    }

    /// A producer for the calling thread, on no timer (unit tests and
    /// loom models of the rings and slots).
    #[cfg(test)]
    pub(crate) fn detached() -> Self {
        struct NoTimer;
        impl TimerLink for NoTimer {
            fn register(self: std::sync::Arc<Self>) -> Option<Arc<Producer>> {
                None
            }
            fn wake(&self) {}
            fn count_out_elsewhere(&self, _: u64) {}
            fn now(&self) -> u64 {
                0
            }
        }
        Producer::new(Weak::<NoTimer>::new(), false)
    }

    /// The key of this producer's timer in thread-local lists: its address.
    pub(crate) fn timer_key(&self) -> usize {
        self.timer.as_ptr().cast::<()>().addr()
    }

    /// True while the timer exists.
    pub(crate) fn timer_alive(&self) -> bool {
        self.timer.strong_count() > 0
    }

    /// A slot from this producer's pool, for the producer's thread; `None`
    /// once the pool is closed.
    ///
    /// # Safety
    /// The producer's thread only, with `this` from `Arc::as_ptr` of a live
    /// producer (the pool's chunks keep it alive).
    pub(crate) unsafe fn alloc(this: *const Producer) -> Option<NonNull<Slot>> {
        // SAFETY: forwarded.
        unsafe { (*this).pool.alloc(this.cast()) }
    }

    /// Whether the producer's thread left it.
    pub(crate) fn is_orphaned(&self) -> bool {
        self.orphaned.load(Ordering::Acquire)
    }

    /// The producer's thread leaves it for good: closes the pool and marks
    /// it orphaned (after its last push).
    ///
    /// # Safety
    /// The producer's thread only, once.
    pub(crate) unsafe fn orphan(&self) {
        // SAFETY: forwarded; the caller's reference keeps this producer
        // (hence the pool) alive through the close.
        unsafe { Pool::close(&self.pool) };
        self.orphaned.store(true, Ordering::Release);
    }

    /// Worker, at exit: closes the ring (handing every entry still in it
    /// to `f`; returns the unseen count) and retires the pool.
    ///
    /// # Safety
    /// The worker thread only, once.
    pub(crate) unsafe fn close(&self, f: impl FnMut(Entry)) -> u32 {
        // SAFETY: forwarded.
        let unseen = unsafe { self.ring.close(f) };
        self.pool.retire();
        unseen
    }
}

/// The pool's hold on its producer (see `Pool::new`).
///
/// # Safety
/// `this` is a live producer from `Arc::as_ptr`.
unsafe fn hold(this: *const ()) {
    // SAFETY: forwarded: one more strong count.
    unsafe { Arc::increment_strong_count(this.cast::<Producer>()) };
}

/// Drops the strong count `hold` took.
///
/// # Safety
/// Once per `hold`, by the pool's final release.
unsafe fn let_go(this: *const ()) {
    // SAFETY: forwarded.
    unsafe { Arc::decrement_strong_count(this.cast::<Producer>()) };
}

/// The producer whose pool `slot` came from.
pub(crate) fn producer_of<'a>(slot: SlotRef) -> &'a Producer {
    // SAFETY: every pool is a producer's, created with the producer as its
    // owner (`Producer::alloc`); the chunks keep the producer alive as
    // long as the slot, which the caller's reference keeps alive.
    unsafe { &*pool::owner_of(slot.0).cast::<Producer>() }
}

/// The producers a timer knows.
#[derive(Default)]
pub(crate) struct Registry {
    pub(crate) list: Vec<Arc<Producer>>,
    /// The worker is gone: no more producers.
    pub(crate) closed: bool,
    /// Timeouts accepted by the producers retired from `list` (their
    /// `accepted`, counted by the worker).
    pub(crate) retired_added: u64,
}
