//! Model checks, with loom, of the timer's concurrent protocol: every
//! interleaving (within the preemption bound) of the operations that race
//! in the real timer, run on the real code through the `sync` shim.
//!
//! `RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=3 cargo test --release
//! --lib timer::loom` (as `.ci/run` does).
//!
//! * the ring: push / claim (nothing lost, nothing read twice, in order,
//!   across segments), and the take-back of the last push racing a claim
//!   (exactly one of them gets the entry, and a taken-back timeout is
//!   counted out exactly once);
//! * the doze / wake handshake: arming a ring before dozing races a push
//!   (a push after the arm always asks for the wake-up, one before it
//!   always makes the arm fail: no missed wake-up);
//! * stop racing new_timeout: closing a ring races a push (the entry is
//!   either handed to the closing worker or refused, never both, never
//!   neither, and the pending count agrees);
//! * cancel racing expiry on a real pooled slot (one winner; the task runs
//!   or is dropped, exactly once; the slot is freed exactly once, which
//!   releases its chunk);
//! * the last two references of a slot dropped at once (freed once).

use std::ptr;
use std::sync::atomic::AtomicUsize as StdAtomicUsize;
use std::sync::{Arc, Weak};

use loom::thread;

use super::Timeout;
use super::inbox::{Entry, Producer, Pushed, SEG, thread_id};
use super::slot::{self, Frees, SlotRef};
use super::sync::{AtomicUsize, Ordering};

/// A fake ring entry (the ring never dereferences entries).
fn entry(i: usize) -> Entry {
    ptr::without_provenance_mut(8 * (i + 1))
}

fn index(e: Entry) -> usize {
    e.addr() / 8 - 1
}

fn producer() -> Arc<Producer> {
    Arc::new(Producer::new(Weak::new(), thread_id()))
}

/// Claims (as the worker) and appends what it got; returns the unseen count.
fn claim(p: &Producer, got: &mut Vec<usize>) -> u32 {
    // SAFETY: the calling model thread plays the worker, the only one.
    unsafe { p.claim(|e| got.push(index(e))) }
}

#[test]
fn pushes_and_claims_deliver_every_entry_once_in_order() {
    loom::model(|| {
        let p = producer();
        let n = SEG + 1; // crosses a segment boundary
        let worker = {
            let p = Arc::clone(&p);
            thread::spawn(move || {
                let mut got = Vec::new();
                claim(&p, &mut got);
                claim(&p, &mut got);
                got
            })
        };
        for i in 0..n {
            // SAFETY: this model thread is the producer.
            assert_ne!(unsafe { p.push(entry(i), true) }, Pushed::Closed);
        }
        let mut got = worker.join().unwrap();
        claim(&p, &mut got);
        assert_eq!(got, (0..n).collect::<Vec<_>>());
        assert_eq!(p.added(), n as u64);
    });
}

#[test]
fn a_taken_back_entry_is_never_also_claimed_and_counts_once() {
    loom::model(|| {
        let p = producer();
        let worker = {
            let p = Arc::clone(&p);
            thread::spawn(move || {
                let mut got = Vec::new();
                let unseen = claim(&p, &mut got);
                (got, unseen)
            })
        };
        // SAFETY: this model thread is the producer.
        let taken = unsafe {
            p.push(entry(0), true);
            p.unpublish(entry(0))
        };
        let (mut got, mut unseen) = worker.join().unwrap();
        unseen += claim(&p, &mut got);
        if taken {
            assert!(got.is_empty(), "taken back and claimed: {got:?}");
            assert_eq!(unseen, 1, "a taken-back timeout is counted out once");
        } else {
            assert_eq!(got, [0]);
            assert_eq!(unseen, 0);
        }
    });
}

#[test]
fn a_push_racing_the_arming_of_a_doze_never_misses_the_wake_up() {
    loom::model(|| {
        let p = producer();
        let worker = {
            let p = Arc::clone(&p);
            // SAFETY: this model thread plays the worker.
            thread::spawn(move || unsafe { p.arm() })
        };
        // SAFETY: this model thread is the producer.
        let pushed = unsafe { p.push(entry(0), true) };
        let armed = worker.join().unwrap();
        // Armed first: the push must ask for the wake-up. Pushed first: the
        // arm must fail (the worker stays up and claims it).
        assert_eq!(
            armed,
            pushed == Pushed::QueuedWake,
            "armed {armed}, push {pushed:?}"
        );
        let mut got = Vec::new();
        claim(&p, &mut got);
        assert_eq!(got, [0]);
    });
}

#[test]
fn a_push_racing_the_close_is_either_handed_over_or_refused() {
    loom::model(|| {
        let p = producer();
        let worker = {
            let p = Arc::clone(&p);
            thread::spawn(move || {
                let mut got = Vec::new();
                // SAFETY: this model thread plays the worker, at its exit.
                let unseen = unsafe { p.close(|e| got.push(index(e))) };
                (got, unseen)
            })
        };
        // SAFETY: this model thread is the producer.
        let pushed = unsafe { p.push(entry(0), true) };
        let (got, unseen) = worker.join().unwrap();
        assert_eq!(unseen, 0);
        if pushed == Pushed::Closed {
            assert!(got.is_empty(), "refused, yet handed over");
            assert_eq!(p.added(), 0, "a refused timeout is not counted");
        } else {
            assert_eq!(got, [0], "accepted, yet not handed over");
            assert_eq!(p.added(), 1);
        }
    });
}

/// Counts the runs and drops of a task.
#[derive(Default)]
struct Tally {
    ran: AtomicUsize,
    dropped: AtomicUsize,
}

struct Guard(Arc<Tally>);

impl Drop for Guard {
    fn drop(&mut self) {
        self.0.dropped.fetch_add(1, Ordering::SeqCst);
    }
}

/// A fresh slot of `p` (owned by this model thread) with `refs` references
/// and a task that counts into `tally`.
fn slot_of(p: &Arc<Producer>, refs: u32, tally: &Arc<Tally>) -> SlotRef {
    let guard = Guard(Arc::clone(tally));
    let task = move |_: &Timeout| {
        guard.0.ran.fetch_add(1, Ordering::SeqCst);
    };
    // SAFETY: this model thread owns `p`; the slot is fresh.
    let slot = SlotRef(unsafe { p.pool.alloc(Arc::as_ptr(p)) }.expect("an open pool"));
    // SAFETY: as above.
    unsafe { slot::init(slot.0, 0, refs, task) };
    slot
}

/// Closes `p`'s pool (as its thread does on leaving) and checks that its
/// chunks, hence every slot, were released.
fn close_and_check_released(p: &Arc<Producer>) {
    // SAFETY: the model's main thread owns the pool.
    unsafe { p.pool.close() };
    assert_eq!(
        Arc::strong_count(p),
        1,
        "a slot was not freed (or freed twice)"
    );
}

#[test]
fn cancel_racing_expiry_has_one_winner_and_the_task_goes_exactly_once() {
    loom::model(|| {
        let p = producer();
        let tally = Arc::new(Tally::default());
        // Two references: the handle (this thread) and the wheel (worker).
        let slot = slot_of(&p, 2, &tally);
        let expired = Arc::new(StdAtomicUsize::new(0));
        let worker = {
            let expired = Arc::clone(&expired);
            thread::spawn(move || {
                let mut frees = Frees::new();
                if slot.try_expire() {
                    expired.store(1, std::sync::atomic::Ordering::SeqCst);
                    let handle = slot.borrowed_handle();
                    // SAFETY: this thread made the move to EXPIRED.
                    unsafe { slot.run_task(&handle) };
                }
                slot.release_into(&mut frees);
            })
        };
        // The handle's cancel: one more reference for its queued entry.
        let cancelled = slot.try_cancel(1);
        if cancelled {
            // SAFETY: this thread made the move to CANCELLED.
            unsafe { slot.drop_task() };
        }
        worker.join().unwrap();
        let expired = expired.load(std::sync::atomic::Ordering::SeqCst) == 1;
        assert!(
            cancelled != expired,
            "cancelled {cancelled}, expired {expired}"
        );
        if cancelled {
            slot.release(); // the worker processes the queued cancellation
        }
        slot.release(); // the handle
        assert_eq!(tally.ran.load(Ordering::SeqCst), usize::from(expired));
        assert_eq!(tally.dropped.load(Ordering::SeqCst), 1);
        close_and_check_released(&p);
    });
}

#[test]
fn the_last_two_references_dropped_at_once_free_the_slot_once() {
    loom::model(|| {
        let p = producer();
        let tally = Arc::new(Tally::default());
        let slot = slot_of(&p, 2, &tally);
        let other = thread::spawn(move || slot.release());
        slot.release();
        other.join().unwrap();
        assert_eq!(tally.dropped.load(Ordering::SeqCst), 1);
        assert_eq!(tally.ran.load(Ordering::SeqCst), 0);
        close_and_check_released(&p);
    });
}
