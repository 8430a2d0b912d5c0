//! Model checks, with loom, of the timer's concurrent protocol: every
//! interleaving (within the preemption bound) of the operations that race
//! in the real timer, run on the real code through the `sync` shim.
//!
//! `RUSTFLAGS="--cfg redwheel_loom" LOOM_MAX_PREEMPTIONS=3 cargo test --release
//! --lib timer::loom` (as `.ci/run` does).
//!
//! * the ring: push / claim (nothing lost, nothing read twice, in order,
//!   across segments), and the take-back of the last push racing a claim
//!   (exactly one of them gets the entry, and a taken-back timeout is
//!   counted out exactly once);
//! * the doze / wake handshake: arming a ring before dozing races a push
//!   (with the asymmetric fence modelled as two `SeqCst` fences: a worker
//!   that dozes always gets the push's wake-up request; no missed wake-up);
//! * stop racing new_timeout: closing a ring races a push (the entry is
//!   either handed to the closing worker or refused, never both, never
//!   neither, and the pending count agrees);
//! * cancel racing expiry on a real pooled slot (one winner; the task runs
//!   or is dropped, exactly once; the slot is freed exactly once, which
//!   releases its chunk);
//! * the last two references of a slot dropped at once (freed once);
//! * `new_timeout` (its producer lookup, `mine()`, and its push) and
//!   `cancel` racing the worker's exit at `stop()` (every timeout either
//!   refused, cancelled or returned by `stop()`, counted out, its task
//!   dropped once, and the thread's producer and pool freed once it left);
//! * a lookup for another timer racing the stop of the cached one (the
//!   cached producer is let go, and freed exactly once);
//! * a pool closed by its thread while its slots are cancelled and freed on
//!   another (no slot handed out after the close; chunks freed once);
//! * a deferred deadline resolved by the worker and by a handle at once
//!   (one value, seen by both);
//! * the real `new_timeout` and `cancel` of one thread racing the worker's
//!   claim, expiry and release of what it claimed (the take-back that
//!   cancels without a compare-and-swap, or the worker, gets the timeout:
//!   never both; the task goes once, the slot is freed once).

use std::ptr;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize as StdAtomicUsize;

use loom::thread;

use super::entry::{self, SlotRef};
use super::local;
use super::pool::{Frees, Pool, release, release_into};
use super::producer::Producer;
use super::ring::{Entry, Item, Pushed, Ring, SEG, item_of};
use super::shared::{Shared, WORKER_SHUTDOWN, WORKER_STARTED};
use super::sync::{self, Ordering};
use super::test_support::{Tally, new_slot, new_slot_due, producer, task};
use super::{ManualClock, Timeout, TimerError};

/// A fake ring entry (the ring never dereferences entries).
fn entry(i: usize) -> Entry {
    ptr::without_provenance_mut(8 * (i + 1))
}

fn index(e: Entry) -> usize {
    e.addr() / 8 - 1
}

fn ring() -> Arc<Ring> {
    Arc::new(Ring::new())
}

/// Claims (as the worker) and appends what it got; returns the unseen count.
fn claim(p: &Ring, got: &mut Vec<usize>) -> u32 {
    // SAFETY: the calling model thread plays the worker, the only one.
    unsafe { p.claim(|e| got.push(index(e))) }
}

/// A model thread playing the worker: `claims` claims of `p`; returns what
/// they got and their unseen count.
fn claiming_worker(p: &Arc<Ring>, claims: usize) -> thread::JoinHandle<(Vec<usize>, u32)> {
    let p = Arc::clone(p);
    thread::spawn(move || {
        let mut got = Vec::new();
        let unseen = (0..claims).map(|_| claim(&p, &mut got)).sum();
        (got, unseen)
    })
}

#[test]
fn pushes_and_claims_deliver_every_entry_once_in_order() {
    loom::model(|| {
        let p = ring();
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
        let p = ring();
        let worker = claiming_worker(&p, 1);
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
fn take_backs_between_pushes_racing_claims_give_each_entry_to_one_side() {
    loom::model(|| {
        let p = ring();
        let worker = claiming_worker(&p, 2);
        // SAFETY: this model thread is the producer. Entry 0 is taken back
        // (if still unclaimed) before 1 is pushed, so a claim may meet its
        // cell before the last one; 1 is taken back as the last.
        let taken = unsafe {
            p.push(entry(0), true);
            let first = p.unpublish(entry(0));
            p.push(entry(1), true);
            [first, p.unpublish(entry(1))]
        };
        let (mut got, mut unseen) = worker.join().unwrap();
        unseen += claim(&p, &mut got);
        let kept: Vec<usize> = (0..2).filter(|&i| !taken[i]).collect();
        assert_eq!(got, kept, "taken back {taken:?}");
        assert_eq!(
            unseen as usize,
            2 - kept.len(),
            "each taken back counts once"
        );
        // SAFETY: every model thread is done.
        assert_eq!(unsafe { p.accepted() }, 2);
    });
}

#[test]
fn a_push_racing_the_arming_of_a_doze_never_misses_the_wake_up() {
    loom::model(|| {
        let p = ring();
        let worker = {
            let p = Arc::clone(&p);
            // SAFETY: this model thread plays the worker.
            thread::spawn(move || unsafe { p.arm() })
        };
        // SAFETY: this model thread is the producer.
        let pushed = unsafe { p.push(entry(0), true) };
        let armed = worker.join().unwrap();
        // The worker dozes only if the push asks for the wake-up. (Both may
        // see each other: then the worker stays up and the wake-up finds it
        // awake, which costs one spurious return from its next sleep.)
        assert!(
            !armed || pushed == Pushed::QueuedWake,
            "armed {armed}, push {pushed:?}: a missed wake-up"
        );
        let mut got = Vec::new();
        claim(&p, &mut got);
        assert_eq!(got, [0]);
    });
}

#[test]
fn a_push_racing_the_close_is_either_handed_over_or_refused() {
    loom::model(|| {
        let p = ring();
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
        // SAFETY: the worker model thread is done; this one reads its side.
        assert_eq!(unsafe { p.accepted() }, got.len() as u64);
        if pushed == Pushed::Closed {
            assert!(got.is_empty(), "refused, yet handed over");
            assert_eq!(p.added(), 0, "a refused timeout is not counted");
        } else {
            assert_eq!(got, [0], "accepted, yet not handed over");
            assert_eq!(p.added(), 1);
        }
    });
}

/// A fresh slot of `p` (owned by this model thread) with `refs` references
/// and a task that counts into `tally`.
fn slot_of(p: &sync::Arc<Producer>, refs: u32, tally: &Arc<Tally>) -> SlotRef {
    new_slot(p, refs, task::<0>(tally))
}

/// Closes `p`'s pool (as its thread does on leaving) and checks that its
/// chunks, hence every slot, were released.
fn close_and_check_released(p: &sync::Arc<Producer>) {
    // SAFETY: the model's main thread owns the pool.
    unsafe { Pool::close(&p.pool) };
    assert_eq!(
        sync::Arc::strong_count(p),
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
                    // SAFETY: this thread made the move to EXPIRED.
                    unsafe { slot.run_task() };
                }
                release_into(slot, &mut frees);
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
            release(slot); // the worker processes the queued cancellation
        }
        release(slot); // the handle
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
        let other = thread::spawn(move || release(slot));
        release(slot);
        other.join().unwrap();
        assert_eq!(tally.dropped.load(Ordering::SeqCst), 1);
        assert_eq!(tally.ran.load(Ordering::SeqCst), 0);
        close_and_check_released(&p);
    });
}

/// A timer whose worker counts as started but never runs: the models play
/// its exit (what `stop()` makes the worker do) on a model thread.
fn started_timer() -> (super::HashedWheelTimer, Arc<Shared>) {
    let timer = super::HashedWheelTimer::builder()
        .clock(ManualClock::new())
        .build()
        .expect("valid arguments");
    let shared = Arc::clone(&timer.handle.shared);
    shared.state.store(WORKER_STARTED, Ordering::SeqCst);
    shared.publish_start(0);
    (timer, shared)
}

/// `stop()`, as the stopping thread and the exiting worker do it.
fn stop(shared: Arc<Shared>) -> Vec<Timeout> {
    shared.state.store(WORKER_SHUTDOWN, Ordering::SeqCst);
    super::worker::exit_for_model(shared)
}

#[test]
fn new_timeout_and_cancel_racing_stop_lose_nothing_and_free_everything() {
    loom::model(|| {
        let (timer, shared) = started_timer();
        let tally = Arc::new(Tally::default());
        let stopper = {
            let shared = Arc::clone(&shared);
            thread::spawn(move || stop(shared))
        };
        let producer = {
            let timer = timer.clone();
            let task = task::<0>(&tally);
            thread::spawn(move || {
                // The real `new_timeout`: the lookup (`mine`), which
                // registers this thread's producer, the slot from its pool,
                // the push; then the real `cancel`.
                let scheduled = timer.new_timeout(std::time::Duration::ZERO, task);
                let cancelled = scheduled.as_ref().ok().map(Timeout::cancel);
                local::leave_thread();
                (scheduled, cancelled)
            })
        };
        let never_ran = stopper.join().unwrap();
        let (scheduled, cancelled) = producer.join().unwrap();
        match (&scheduled, cancelled) {
            (Ok(t), Some(cancelled)) => {
                let returned = never_ran.iter().any(|n| n.ptr_eq(t));
                assert!(
                    cancelled != returned,
                    "cancelled {cancelled}, returned by stop {returned}"
                );
            }
            (Err(e), _) => {
                assert!(matches!(e, TimerError::Stopped), "{e:?}");
                assert!(never_ran.is_empty());
            }
            (Ok(_), None) => unreachable!("a scheduled timeout was not cancelled"),
        }
        assert_eq!(shared.pending(), 0, "every timeout counted out");
        assert_eq!(tally.ran.load(Ordering::SeqCst), 0);
        assert_eq!(tally.dropped.load(Ordering::SeqCst), 1, "dropped once");
        // The producer's thread has left: its producer, ring and pool
        // (chunks and all) go with the last slot; loom fails the model if
        // the producer's `Arc` is still alive at the end.
        drop((scheduled, never_ran, timer, shared));
    });
}

#[test]
fn a_lookup_racing_the_stop_of_the_cached_timer_frees_its_producer_once() {
    loom::model(|| {
        let (a, a_shared) = started_timer();
        let (b, b_shared) = started_timer();
        let tally = Arc::new(Tally::default());
        // This thread schedules on A (caching A's producer), A is stopped
        // meanwhile, and the thread's next lookup, for B, lets A's
        // producer go (or finds it still open and keeps it).
        let producer = {
            let (a, b) = (a.clone(), b.clone());
            let (task_a, task_b) = (task::<0>(&tally), task::<0>(&tally));
            thread::spawn(move || {
                let on_a = a.new_timeout(std::time::Duration::ZERO, task_a);
                let on_b = b.new_timeout(std::time::Duration::ZERO, task_b);
                assert!(on_b.is_ok(), "B refused: {on_b:?}");
                local::leave_thread();
                on_a.ok()
            })
        };
        let stopped_a = stop(Arc::clone(&a_shared));
        let on_a = producer.join().unwrap();
        let stopped_b = stop(Arc::clone(&b_shared));
        assert_eq!(stopped_b.len(), 1, "B's timeout never ran");
        if let Some(t) = &on_a {
            assert!(stopped_a.iter().any(|n| n.ptr_eq(t)));
        }
        assert_eq!(a_shared.pending() + b_shared.pending(), 0);
        drop((on_a, stopped_a, stopped_b));
        assert_eq!(tally.ran.load(Ordering::SeqCst), 0);
        assert_eq!(tally.dropped.load(Ordering::SeqCst), 2);
        // Loom fails the model if a producer's `Arc` (held by its pool
        // while a slot lives) is still alive at the end.
        drop((a, b, a_shared, b_shared));
    });
}

#[test]
fn a_pool_closing_while_its_slots_are_cancelled_and_freed_elsewhere_frees_once() {
    loom::model(|| {
        let p = producer();
        let tally = Arc::new(Tally::default());
        // Two handles' worth: one is cancelled, one expires, both on
        // another thread, while the owner closes the pool (its thread
        // leaves).
        let cancelled = slot_of(&p, 1, &tally);
        let expired = slot_of(&p, 1, &tally);
        let other = thread::spawn(move || {
            if cancelled.try_cancel(0) {
                // SAFETY: this thread made the move to CANCELLED.
                unsafe { cancelled.drop_task() };
            }
            release(cancelled);
            let mut frees = Frees::new();
            if expired.try_expire() {
                // SAFETY: this thread made the move to EXPIRED.
                unsafe { expired.run_task() };
            }
            release_into(expired, &mut frees);
        });
        // SAFETY: this model thread owns the pool.
        unsafe { Pool::close(&p.pool) };
        // SAFETY: as above.
        assert!(unsafe { Producer::alloc(sync::Arc::as_ptr(&p)) }.is_none());
        other.join().unwrap();
        assert_eq!(tally.ran.load(Ordering::SeqCst), 1);
        assert_eq!(tally.dropped.load(Ordering::SeqCst), 2);
        assert_eq!(
            sync::Arc::strong_count(&p),
            1,
            "the chunks were not released once"
        );
    });
}

#[test]
fn a_deferred_deadline_resolved_twice_at_once_keeps_one_value() {
    loom::model(|| {
        let p = producer();
        let tally = Arc::new(Tally::default());
        // The handle (this thread) and the worker's entry; a 1000 ns delay
        // waiting for a reading.
        let slot = new_slot_due(&p, 2, entry::unresolved(1000), task::<0>(&tally));
        let worker = thread::spawn(move || slot.resolve(5));
        let by_handle = slot.resolve(7);
        let by_worker = worker.join().unwrap();
        assert_eq!(by_worker, by_handle, "two deadlines");
        assert!(by_handle == 1005 || by_handle == 1007, "{by_handle}");
        assert_eq!(slot.resolved_deadline(), Some(by_handle));
        release(slot);
        release(slot);
        close_and_check_released(&p);
    });
}

#[test]
fn a_take_back_racing_the_claim_leaves_the_timeout_to_one_of_them() {
    loom::model(|| {
        let (timer, shared) = started_timer();
        let tally = Arc::new(Tally::default());
        let producer = {
            let timer = timer.clone();
            let task = task::<0>(&tally);
            thread::spawn(move || {
                // The real `new_timeout` and `cancel` (its take-back, with
                // this handle and the entry the only references).
                let t = timer
                    .new_timeout(std::time::Duration::ZERO, task)
                    .expect("running");
                let cancelled = t.cancel();
                drop(t);
                local::leave_thread();
                cancelled
            })
        };
        // This thread plays the worker: it claims, before or after the
        // producer's thread is done, and expires what it claimed.
        let mut fired = 0;
        let mut unseen = 0;
        let mut claim = || {
            let list = shared.producers.lock().list.clone();
            for p in &list {
                // SAFETY: this model thread is the only worker.
                unseen += unsafe {
                    p.ring.claim(|e| match item_of(e) {
                        Item::New(slot, _) => {
                            let mut frees = Frees::new();
                            if slot.try_expire() {
                                fired += 1;
                                // SAFETY: this thread made the move to EXPIRED.
                                unsafe { slot.run_task() };
                            }
                            release_into(slot, &mut frees);
                        }
                        Item::Cancel(slot) => release(slot),
                        Item::Time(_) => {}
                    })
                };
            }
        };
        claim();
        let cancelled = producer.join().unwrap();
        claim();
        assert!(
            cancelled != (fired == 1),
            "cancelled {cancelled}, fired {fired}"
        );
        assert!(fired <= 1);
        assert_eq!(tally.ran.load(Ordering::SeqCst), fired);
        assert_eq!(tally.dropped.load(Ordering::SeqCst), 1, "dropped once");
        assert!(unseen <= 1);
        // The producer's thread left: loom fails the model if its producer
        // (held by its pool while a slot lives) is still alive at the end.
        let list = std::mem::take(&mut shared.producers.lock().list);
        drop((list, timer, shared));
    });
}
