//! The gate of one queue in one process: where `take` and `claim` wait
//! while the queue's controls (pause, rate limit, max in flight) hold them
//! back, and what wakes them.
//!
//! A consumer held back by the controls does not block in Redis (the ready
//! list is not empty, so a blocking read would return at once): it waits
//! here, on a generation counter, until something that may have opened the
//! gate happens. Everything that can happens in this process first: the
//! queue's transfer job ran (it runs when a rate window reopens, since a
//! held-back consumer announces that instant to the driver, and at every
//! guard sweep), a message arrived on the queue's wake channel (a resume, a
//! limit changed, a claim of another process released an in-flight slot
//! someone waits for), or this process acked or gave back a claim. Each of
//! those calls [`Gate::open`]; the waiter then asks Redis again.
//!
//! Lost wake-ups: a waiter reads the generation *before* the script call
//! that held it back, and waits only while it is unchanged, so an opening
//! between the reply and the wait is not missed.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use parking_lot::{Condvar, Mutex};

/// Where held-back consumers of one queue wait.
#[derive(Default)]
pub(crate) struct Gate {
    generation: AtomicU64,
    /// Threads inside [`wait`](Gate::wait) (so an opening with none is one
    /// atomic add).
    waiters: AtomicUsize,
    /// Claims held back by max_in_flight in this process: acks and nacks
    /// of this process open the gate only when some wait.
    slot_waiters: AtomicUsize,
    lock: Mutex<()>,
    cond: Condvar,
}

impl Gate {
    /// The current generation, to pass to [`wait`](Gate::wait).
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    /// Something that may let a held-back consumer through happened: wake
    /// every waiter.
    pub(crate) fn open(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
        if self.waiters.load(Ordering::SeqCst) > 0 {
            let _guard = self.lock.lock();
            self.cond.notify_all();
        }
    }

    /// An in-flight slot was freed by this process (ack, nack): opens the
    /// gate if a claim of this process waits for one.
    pub(crate) fn slot_freed(&self) {
        if self.slot_waiters.load(Ordering::SeqCst) > 0 {
            self.open();
        }
    }

    /// Waits until the generation is no longer `seen`, or `until`. With
    /// `for_slot`, counts as waiting for an in-flight slot meanwhile.
    pub(crate) fn wait(&self, seen: u64, until: Instant, for_slot: bool) {
        if for_slot {
            self.slot_waiters.fetch_add(1, Ordering::SeqCst);
        }
        self.waiters.fetch_add(1, Ordering::SeqCst);
        {
            let mut guard = self.lock.lock();
            while self.generation.load(Ordering::SeqCst) == seen {
                if self.cond.wait_until(&mut guard, until).timed_out() {
                    break;
                }
            }
        }
        self.waiters.fetch_sub(1, Ordering::SeqCst);
        if for_slot {
            self.slot_waiters.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::mpsc;
    use std::time::Duration;

    use super::*;

    #[test]
    fn an_opening_after_the_generation_was_read_is_not_missed() {
        let gate = Gate::default();
        let seen = gate.generation();
        gate.open();
        // Far-off deadline: returns at once because the generation moved.
        gate.wait(seen, Instant::now() + Duration::from_secs(3600), false);
    }

    #[test]
    fn open_wakes_a_waiting_thread_and_slot_freed_only_a_slot_waiter() {
        let gate = Arc::new(Gate::default());
        let (tx, rx) = mpsc::channel();
        let g = Arc::clone(&gate);
        let seen = gate.generation();
        let t = std::thread::spawn(move || {
            g.wait(seen, Instant::now() + Duration::from_secs(3600), false);
            tx.send(()).unwrap();
        });
        while gate.waiters.load(Ordering::SeqCst) == 0 {
            std::thread::yield_now();
        }
        // No slot waiter: a freed slot changes nothing.
        gate.slot_freed();
        assert_eq!(gate.generation(), seen);
        gate.open();
        rx.recv().unwrap();
        t.join().unwrap();

        let (tx, rx) = mpsc::channel();
        let g = Arc::clone(&gate);
        let seen = gate.generation();
        let t = std::thread::spawn(move || {
            g.wait(seen, Instant::now() + Duration::from_secs(3600), true);
            tx.send(()).unwrap();
        });
        while gate.slot_waiters.load(Ordering::SeqCst) == 0 {
            std::thread::yield_now();
        }
        gate.slot_freed();
        rx.recv().unwrap();
        t.join().unwrap();
    }

    #[test]
    fn a_wait_ends_at_its_deadline() {
        let gate = Gate::default();
        let seen = gate.generation();
        gate.wait(seen, Instant::now(), false);
        assert_eq!(gate.generation(), seen);
    }
}
