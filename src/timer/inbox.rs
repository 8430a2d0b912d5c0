//! Inboxes: how new and cancelled timeouts reach the worker.
//!
//! A timer has a small fixed set of inboxes (a power of two, a few per
//! core). Each thread that schedules or cancels uses the inbox its thread
//! slot maps to, so two producer threads rarely share one, and an inbox's
//! cache lines stay with its producer: the worker visits it about once per
//! tick.
//!
//! An inbox is two vectors under a lock: `pending` (new timeouts, in the
//! order its threads submitted them) and `cancelled`. Producers push under
//! the lock; the worker swaps a whole vector out for an empty one of its
//! own and works on the batch without the lock. Critical sections are a
//! push or a swap; nothing is allocated, freed or run under the lock except
//! a vector's amortised growth.
//!
//! The lock also carries the two signals the worker and producers exchange:
//!
//! * `dozing`: set by the worker in every inbox (each found empty) before it
//!   sleeps past the current tick. A producer that pushes into an inbox
//!   marked `dozing` clears the mark and wakes the worker. Lock order gives
//!   the guarantee: either the worker saw the push, or the producer sees the
//!   mark. No fence on the producer's path.
//! * `closed`: set by the worker when it has collected its last leftovers
//!   (or by `stop()` if it never started). A new timeout is then refused, and
//!   a cancellation is counted out on the spot, since no worker will see it.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use crossbeam_utils::CachePadded;
use parking_lot::Mutex;

use super::Shared;
use super::timeout::SharedTimeout;

/// One inbox. Handles of the timeouts pushed here keep it alive (for
/// `cancel`); it reaches the timer only through a weak reference.
pub(crate) struct Inbox {
    lists: CachePadded<Mutex<Lists>>,
    /// Timeouts ever accepted through this inbox, written under the lock
    /// (a plain store: one writer at a time), read without it.
    added: CachePadded<AtomicU64>,
    shared: Weak<Shared>,
}

#[derive(Default)]
struct Lists {
    pending: Vec<SharedTimeout>,
    cancelled: Vec<SharedTimeout>,
    dozing: bool,
    closed: bool,
}

/// What a push found in its inbox.
pub(crate) enum Pushed {
    /// Queued for the worker, which is awake or will look before it sleeps.
    Queued,
    /// Queued, and the worker was dozing: the caller must wake it.
    QueuedWake,
    /// The timer has stopped for good: nothing was queued.
    Closed,
}

impl Inbox {
    pub(crate) fn new(shared: Weak<Shared>) -> Self {
        Inbox {
            lists: CachePadded::new(Mutex::new(Lists::default())),
            added: CachePadded::new(AtomicU64::new(0)),
            shared,
        }
    }

    /// Queues a new timeout and counts it as pending.
    pub(crate) fn push_pending(&self, timeout: SharedTimeout) -> Pushed {
        let mut lists = self.lists.lock();
        if lists.closed {
            return Pushed::Closed;
        }
        lists.pending.push(timeout);
        self.added
            .store(self.added.load(Ordering::Relaxed) + 1, Ordering::Release);
        lists.take_wake()
    }

    /// Queues a cancelled timeout for the worker to unlink and count out.
    /// After the worker is gone it is counted out here instead.
    pub(crate) fn push_cancelled(&self, timeout: SharedTimeout) {
        let pushed = {
            let mut lists = self.lists.lock();
            if lists.closed {
                Pushed::Closed
            } else {
                lists.cancelled.push(timeout);
                lists.take_wake()
            }
        };
        match pushed {
            Pushed::Queued => {}
            Pushed::QueuedWake => {
                if let Some(shared) = self.shared.upgrade() {
                    shared.wake();
                }
            }
            Pushed::Closed => {
                if let Some(shared) = self.shared.upgrade() {
                    shared.count_out_elsewhere(1);
                }
            }
        }
    }

    /// Timeouts ever accepted here.
    pub(crate) fn added(&self) -> u64 {
        self.added.load(Ordering::Acquire)
    }

    /// Worker: swaps the pending timeouts out for `spare` (which must be
    /// empty); false if there were none.
    pub(crate) fn take_pending(&self, spare: &mut Vec<SharedTimeout>) -> bool {
        self.take(spare, |lists| &mut lists.pending)
    }

    /// Worker: like [`take_pending`](Self::take_pending), for cancellations.
    pub(crate) fn take_cancelled(&self, spare: &mut Vec<SharedTimeout>) -> bool {
        self.take(spare, |lists| &mut lists.cancelled)
    }

    fn take(
        &self,
        spare: &mut Vec<SharedTimeout>,
        list: fn(&mut Lists) -> &mut Vec<SharedTimeout>,
    ) -> bool {
        debug_assert!(spare.is_empty());
        let mut lists = self.lists.lock();
        let list = list(&mut lists);
        if list.is_empty() {
            return false;
        }
        std::mem::swap(list, spare);
        true
    }

    /// Worker: whether anything waits here (pending, cancelled).
    pub(crate) fn has_input(&self) -> (bool, bool) {
        let lists = self.lists.lock();
        (!lists.pending.is_empty(), !lists.cancelled.is_empty())
    }

    /// Worker, before dozing: marks the inbox if it is empty; false (and no
    /// mark) if something arrived.
    pub(crate) fn arm(&self) -> bool {
        let mut lists = self.lists.lock();
        if lists.pending.is_empty() && lists.cancelled.is_empty() {
            lists.dozing = true;
            true
        } else {
            false
        }
    }

    /// Worker, after dozing: clears the mark.
    pub(crate) fn disarm(&self) {
        self.lists.lock().dozing = false;
    }

    /// Worker, at exit (or `stop()` of a timer that never started): closes
    /// the inbox and returns what was still in it (pending, cancelled).
    pub(crate) fn close(&self) -> (Vec<SharedTimeout>, Vec<SharedTimeout>) {
        let mut lists = self.lists.lock();
        lists.closed = true;
        lists.dozing = false;
        (
            std::mem::take(&mut lists.pending),
            std::mem::take(&mut lists.cancelled),
        )
    }
}

impl Lists {
    /// After a push: whether the pusher must wake the worker (only the first
    /// push into a marked inbox must).
    fn take_wake(&mut self) -> Pushed {
        if std::mem::take(&mut self.dozing) {
            Pushed::QueuedWake
        } else {
            Pushed::Queued
        }
    }
}

/// How many inboxes a timer gets: a few per core, a power of two.
pub(crate) fn inbox_count() -> usize {
    let cores = std::thread::available_parallelism().map_or(4, |n| n.get());
    (cores * 4).next_power_of_two().clamp(4, 64)
}

static NEXT_SLOT: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This thread's slot, handed out round-robin on first use.
    static SLOT: Cell<usize> = const { Cell::new(usize::MAX) };
}

/// The calling thread's slot; `slot & (inbox_count - 1)` picks its inbox.
pub(crate) fn thread_slot() -> usize {
    SLOT.with(|slot| {
        let mut s = slot.get();
        if s == usize::MAX {
            s = NEXT_SLOT.fetch_add(1, Ordering::Relaxed);
            slot.set(s);
        }
        s
    })
}

/// The inboxes of one timer.
pub(crate) type Inboxes = Box<[Arc<Inbox>]>;
