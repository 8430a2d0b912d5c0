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
//! A timeout cancelled while it still waits in its inbox's pending list
//! (the usual case for one cancelled soon after it was scheduled) is taken
//! out of the list there and then, if it is among the last few pushed:
//! only a count of such cancellations goes to the worker, which counts them
//! out at the next tick boundary as usual. The worker never sees the
//! timeout, and its memory is freed by the thread that allocated it.
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
    /// Cancellations of timeouts taken out of `pending` before the worker
    /// saw them: only to be counted out.
    cancelled_unseen: u64,
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

    /// Hands a cancelled timeout to the worker: takes it out of the
    /// pending list if it is among the last [`UNSEEN_SEARCH`] there, else
    /// queues it for the worker to unlink. Either way the worker counts it
    /// out at its next tick. After the worker is gone it is counted out
    /// here instead.
    pub(crate) fn push_cancelled(&self, timeout: &SharedTimeout) {
        let (pushed, _taken) = {
            let mut lists = self.lists.lock();
            if lists.closed {
                (Pushed::Closed, None)
            } else {
                let from = lists.pending.len().saturating_sub(UNSEEN_SEARCH);
                let found = lists.pending[from..]
                    .iter()
                    .rposition(|queued| Arc::ptr_eq(queued, timeout));
                let taken = found.map(|i| lists.pending.remove(from + i));
                if taken.is_some() {
                    lists.cancelled_unseen += 1;
                } else {
                    lists.cancelled.push(Arc::clone(timeout));
                }
                (lists.take_wake(), taken)
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
        debug_assert!(spare.is_empty());
        let mut lists = self.lists.lock();
        if lists.pending.is_empty() {
            return false;
        }
        std::mem::swap(&mut lists.pending, spare);
        true
    }

    /// Worker: swaps the cancelled timeouts out for `spare` (which must be
    /// empty; it is left alone when there are none, so that its capacity
    /// stays with the worker) and returns how many more were cancelled
    /// unseen.
    pub(crate) fn take_cancelled(&self, spare: &mut Vec<SharedTimeout>) -> u64 {
        debug_assert!(spare.is_empty());
        let mut lists = self.lists.lock();
        if !lists.cancelled.is_empty() {
            std::mem::swap(&mut lists.cancelled, spare);
        }
        std::mem::take(&mut lists.cancelled_unseen)
    }

    /// Worker: whether anything waits here (pending, cancelled).
    pub(crate) fn has_input(&self) -> (bool, bool) {
        let lists = self.lists.lock();
        (!lists.pending.is_empty(), lists.has_cancellations())
    }

    /// Worker, before dozing: marks the inbox if it is empty; false (and no
    /// mark) if something arrived.
    pub(crate) fn arm(&self) -> bool {
        let mut lists = self.lists.lock();
        if lists.pending.is_empty() && !lists.has_cancellations() {
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
    /// the inbox and returns what was still in it: the pending timeouts, and
    /// the number of cancellations not yet counted out.
    pub(crate) fn close(&self) -> (Vec<SharedTimeout>, u64) {
        let mut lists = self.lists.lock();
        lists.closed = true;
        lists.dozing = false;
        let cancelled = lists.cancelled.len() as u64 + lists.cancelled_unseen;
        lists.cancelled_unseen = 0;
        let cancelled_list = std::mem::take(&mut lists.cancelled);
        let pending = std::mem::take(&mut lists.pending);
        drop(lists);
        drop(cancelled_list);
        (pending, cancelled)
    }
}

/// How far from the end of the pending list a cancellation looks for its
/// timeout (a bounded search under the lock).
const UNSEEN_SEARCH: usize = 16;

impl Lists {
    fn has_cancellations(&self) -> bool {
        !self.cancelled.is_empty() || self.cancelled_unseen > 0
    }

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timer::timeout::TimeoutInner;

    fn timeout() -> SharedTimeout {
        TimeoutInner::new(0, |_: &crate::timer::Timeout| {})
    }

    #[test]
    fn a_recent_cancellation_is_taken_out_of_pending_and_only_counted() {
        let inbox = Inbox::new(Weak::new());
        let queued: Vec<SharedTimeout> = (0..UNSEEN_SEARCH + 4).map(|_| timeout()).collect();
        for t in &queued {
            assert!(matches!(inbox.push_pending(Arc::clone(t)), Pushed::Queued));
        }
        inbox.push_cancelled(&queued[UNSEEN_SEARCH + 3]); // the last pushed
        inbox.push_cancelled(&queued[UNSEEN_SEARCH - 1]); // within the last few
        inbox.push_cancelled(&queued[0]); // too far back: queued for the worker

        let mut spare = Vec::new();
        assert_eq!(inbox.take_cancelled(&mut spare), 2);
        assert_eq!(spare.len(), 1);
        assert!(Arc::ptr_eq(&spare[0], &queued[0]));

        let mut pending = Vec::new();
        assert!(inbox.take_pending(&mut pending));
        let expect: Vec<&SharedTimeout> = queued
            .iter()
            .enumerate()
            .filter(|&(i, _)| i != UNSEEN_SEARCH - 1 && i != UNSEEN_SEARCH + 3)
            .map(|(_, t)| t)
            .collect();
        assert_eq!(pending.len(), expect.len());
        assert!(
            pending.iter().zip(expect).all(|(a, b)| Arc::ptr_eq(a, b)),
            "the others keep their order"
        );
        assert_eq!(inbox.added(), queued.len() as u64, "still counted as added");
    }

    #[test]
    fn a_closed_inbox_refuses_timeouts_and_reports_uncounted_cancellations() {
        let inbox = Inbox::new(Weak::new());
        let (a, b) = (timeout(), timeout());
        assert!(matches!(inbox.push_pending(Arc::clone(&a)), Pushed::Queued));
        assert!(matches!(inbox.push_pending(Arc::clone(&b)), Pushed::Queued));
        inbox.push_cancelled(&b);
        let (pending, cancelled) = inbox.close();
        assert_eq!(pending.len(), 1);
        assert!(Arc::ptr_eq(&pending[0], &a));
        assert_eq!(cancelled, 1);
        assert!(matches!(inbox.push_pending(timeout()), Pushed::Closed));
    }
}
