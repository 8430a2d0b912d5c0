//! Unit tests that span the timer's layers: a slot's whole life (entry
//! state, task storage, pool), and the calling thread's producer cache
//! against a real timer. Run under Miri by `.ci/run` with the other unit
//! tests of `timer::`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering as O};

use super::entry::SlotRef;
use super::local::{cache_state, mine};
use super::pool::{Frees, Pool, SLOTS_PER_CHUNK, owner_of, release, release_into};
use super::producer::Producer;
use super::task::fits_inline;
use super::test_support::{Tally, new_slot, producer, task};
use super::{HashedWheelTimer, ManualClock};

#[test]
fn small_tasks_live_in_the_slot_and_large_ones_in_a_box() {
    assert!(fits_inline::<[usize; 2]>());
    assert!(!fits_inline::<[usize; 3]>());
    assert!(!fits_inline::<u128>(), "alignment above the slot's");
    assert_eq!(std::mem::size_of::<super::entry::Slot>(), 40);
    assert_eq!(SLOTS_PER_CHUNK, 102);
}

#[test]
fn an_expired_task_runs_once_and_is_dropped_once_inline_or_boxed() {
    let p = producer();
    let small = Arc::new(Tally::default());
    let large = Arc::new(Tally::default());
    for (slot, t) in [
        (new_slot(&p, 1, task::<1>(&small)), &small),
        (new_slot(&p, 1, task::<64>(&large)), &large),
    ] {
        assert_eq!(slot.deadline(), 42);
        assert!(slot.try_expire());
        assert!(!slot.try_cancel(0), "expired is final");
        // SAFETY: this test made the move to EXPIRED, once.
        unsafe { slot.run_task() };
        release(slot);
        assert_eq!(t.ran.load(O::SeqCst), 1);
        assert_eq!(t.dropped.load(O::SeqCst), 1);
    }
    // SAFETY: this thread owns the pool.
    unsafe { Pool::close(&p.pool) };
    assert_eq!(
        Arc::strong_count(&p),
        1,
        "the chunks let go of the producer"
    );
}

#[test]
fn a_cancelled_task_is_dropped_by_the_canceller_and_never_runs() {
    let p = producer();
    let t = Arc::new(Tally::default());
    let slot = new_slot(&p, 2, task::<8>(&t));
    assert!(slot.try_cancel(1));
    assert!(!slot.try_cancel(1), "a second cancel loses");
    assert!(!slot.try_expire(), "cancelled is final");
    // SAFETY: the cancel above won.
    unsafe { slot.drop_task() };
    assert_eq!(t.dropped.load(O::SeqCst), 1);
    for _ in 0..3 {
        release(slot);
    }
    assert_eq!(t.ran.load(O::SeqCst), 0);
    assert_eq!(
        t.dropped.load(O::SeqCst),
        1,
        "freeing does not drop it again"
    );
    // SAFETY: this thread owns the pool.
    unsafe { Pool::close(&p.pool) };
    assert_eq!(Arc::strong_count(&p), 1);
}

#[test]
fn a_never_claimed_slot_drops_its_task_when_its_last_reference_goes() {
    let p = producer();
    let t = Arc::new(Tally::default());
    let slot = new_slot(&p, 2, task::<24>(&t));
    slot.add_ref();
    release(slot);
    release(slot);
    assert_eq!(t.dropped.load(O::SeqCst), 0, "one reference is left");
    release(slot);
    assert_eq!(t.dropped.load(O::SeqCst), 1);
    assert_eq!(t.ran.load(O::SeqCst), 0);
    unsafe { Pool::close(&p.pool) };
}

#[test]
fn freed_slots_are_reused_and_the_chunks_go_with_the_last_slot_after_close() {
    let p = producer();
    let t = Arc::new(Tally::default());
    let first: Vec<SlotRef> = (0..250).map(|_| new_slot(&p, 1, task::<1>(&t))).collect();
    let addrs: std::collections::BTreeSet<usize> = first.iter().map(|s| s.0.addr().get()).collect();
    for s in first {
        release(s);
    }
    let again: Vec<SlotRef> = (0..250).map(|_| new_slot(&p, 1, task::<1>(&t))).collect();
    assert!(
        again.iter().all(|s| addrs.contains(&s.0.addr().get())),
        "freed slots come back before new ones are carved"
    );
    let (keep, rest) = again.split_at(1);
    for &s in rest {
        release(s);
    }
    // SAFETY: this thread owns the pool.
    unsafe { Pool::close(&p.pool) };
    assert_eq!(Arc::strong_count(&p), 2, "one slot still holds the chunks");
    release(keep[0]);
    assert_eq!(Arc::strong_count(&p), 1, "released with the last slot");
    assert_eq!(t.dropped.load(O::SeqCst), 500);
}

#[test]
fn a_never_claimed_task_whose_drop_panics_still_gives_its_slot_back() {
    struct Bomb;
    impl Drop for Bomb {
        fn drop(&mut self) {
            panic!("a task's drop panicked");
        }
    }
    let p = producer();
    let bomb = Bomb;
    let slot = new_slot(&p, 1, move |_| drop(bomb));
    let released = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| release(slot)));
    assert!(released.is_err(), "the panic reaches the caller");
    // SAFETY: this thread owns the pool.
    unsafe { Pool::close(&p.pool) };
    assert_eq!(
        Arc::strong_count(&p),
        1,
        "the slot came back, so the chunks went"
    );
}

#[test]
fn a_closed_pool_hands_out_no_slot() {
    let p = producer();
    let t = Arc::new(Tally::default());
    let live = new_slot(&p, 1, task::<1>(&t));
    // SAFETY: this thread owns the pool.
    unsafe { Pool::close(&p.pool) };
    // SAFETY: as above.
    assert!(unsafe { Producer::alloc(Arc::as_ptr(&p)) }.is_none());
    // A slot freed on another thread after the close does not come back.
    std::thread::scope(|s| {
        s.spawn(|| release(live));
    });
    assert!(unsafe { Producer::alloc(Arc::as_ptr(&p)) }.is_none());
    assert_eq!(
        Arc::strong_count(&p),
        1,
        "the last slot released the chunks"
    );
    assert_eq!(t.dropped.load(O::SeqCst), 1);
}

#[test]
fn slots_freed_on_other_threads_go_back_to_their_pool() {
    let p = producer();
    let t = Arc::new(Tally::default());
    let slots: Vec<SlotRef> = (0..150).map(|_| new_slot(&p, 1, task::<1>(&t))).collect();
    let addrs: std::collections::BTreeSet<usize> = slots.iter().map(|s| s.0.addr().get()).collect();
    std::thread::scope(|s| {
        let (a, b) = slots.split_at(75);
        s.spawn(move || {
            let mut frees = Frees::new();
            for slot in a {
                release_into(*slot, &mut frees);
            }
        });
        s.spawn(move || {
            for &slot in b {
                release(slot);
            }
        });
    });
    assert_eq!(t.dropped.load(O::SeqCst), 150);
    // The pool has 54 carved-but-unused slots in its chunk; then the
    // remote ones come back.
    let again: Vec<SlotRef> = (0..204).map(|_| new_slot(&p, 1, task::<1>(&t))).collect();
    let reused = again
        .iter()
        .filter(|s| addrs.contains(&s.0.addr().get()))
        .count();
    assert_eq!(reused, 150);
    for s in again {
        release(s);
    }
    unsafe { Pool::close(&p.pool) };
    assert_eq!(Arc::strong_count(&p), 1);
}

#[test]
fn a_slot_finds_its_producer_through_its_chunk() {
    let p = producer();
    let t = Arc::new(Tally::default());
    let slots: Vec<SlotRef> = (0..300).map(|_| new_slot(&p, 1, task::<1>(&t))).collect();
    assert!(
        slots
            .iter()
            .all(|s| std::ptr::eq(owner_of(s.0), Arc::as_ptr(&p).cast()))
    );
    for s in slots {
        release(s);
    }
    unsafe { Pool::close(&p.pool) };
}

/// Issue 18, item 1: on one thread, timer A is used, stopped and
/// dropped; B's `new_timeout` loses its race with `B.stop()` at the
/// lookup (played here step by step: the lookup runs after the stop);
/// then C, built where A was, schedules. The thread's cache must never
/// name a producer that nothing keeps alive.
#[test]
fn the_producer_cache_never_outlives_its_producer() {
    use std::time::Duration;

    let build = || {
        HashedWheelTimer::builder()
            .clock(ManualClock::new())
            .build()
            .expect("valid arguments")
    };
    let key = |t: &HashedWheelTimer| Arc::as_ptr(&t.handle.shared).addr();

    let a = build();
    let key_a = key(&a);
    drop(
        a.new_timeout(Duration::from_secs(1), |_| {})
            .expect("A runs"),
    );
    let (cached_a, _) = cache_state();
    assert_ne!(cached_a, 0, "A's producer is cached");
    drop(a.stop().expect("stop from outside a task"));
    drop(a);

    // B: its `new_timeout` passed the state check, then `stop()` ran,
    // then it looks up its producer (registration refused).
    let b = build();
    let b_shared = Arc::clone(&b.handle.shared);
    drop(b.stop().expect("stop from outside a task"));
    assert!(mine(key(&b), || b_shared.register()).is_none());
    drop(b_shared);

    // C, at A's address if the allocator gives it (it usually does).
    let mut others = Vec::new();
    let c = loop {
        let c = build();
        if key(&c) == key_a || others.len() == 64 {
            break c;
        }
        others.push(c);
    };
    let (cached, listed) = cache_state();
    let dangling = cached != 0 && !listed.contains(&cached);
    // Before the fix this lookup hit the cache and used the freed
    // producer (Miri: use after free; natively: a panic or worse).
    let ran = Arc::new(AtomicUsize::new(0));
    let r = Arc::clone(&ran);
    let scheduled = c.new_timeout(Duration::ZERO, move |_| {
        r.fetch_add(1, O::SeqCst);
    });
    assert!(
        !dangling,
        "the cache names producer {cached:#x}, which no list holds (A's was {cached_a:#x})"
    );
    assert!(scheduled.is_ok(), "C refused a timeout: {scheduled:?}");
    let never_ran = c.stop().expect("stop from outside a task");
    assert_eq!(never_ran.len() + ran.load(O::SeqCst), 1);
    drop((never_ran, scheduled, others));
    let (cached, listed) = cache_state();
    assert!(cached == 0 || listed.contains(&cached));
}

/// Every path of a timeout through the real worker, small enough for
/// Miri: two producer threads schedule, take back (cancel right after
/// scheduling), cancel later and leave timeouts to fire, to an executor or
/// on the worker, then `stop()` collects the rest. Each task runs or is
/// dropped exactly once, and every slot goes back (the producers' threads
/// have left, so their pools close and free their chunks).
#[test]
fn timeouts_from_two_threads_run_or_drop_once_through_the_worker() {
    use std::sync::Mutex;
    use std::time::Duration;

    let ms = Duration::from_millis;
    for with_executor in [false, true] {
        let clock = ManualClock::new();
        let mut builder = HashedWheelTimer::builder()
            .tick_duration(ms(10))
            .ticks_per_wheel(8)
            .clock(clock.clone());
        if with_executor {
            builder = builder.executor(|job: super::Job| job.run());
        }
        let timer = builder.build().expect("valid arguments");
        let tally = Arc::new(Tally::default());
        let kept = Arc::new(Mutex::new(Vec::new()));
        std::thread::scope(|s| {
            for thread in 0..2u64 {
                let (timer, tally, kept) = (&timer, &tally, &kept);
                s.spawn(move || {
                    for i in 0..12u64 {
                        let delay = ms(5 + 10 * ((i + thread) % 6) + 100 * (i % 2));
                        let t = timer.new_timeout(delay, task::<8>(tally)).expect("running");
                        match i % 4 {
                            0 => assert!(t.cancel(), "taken back at once"),
                            1 => kept.lock().unwrap().push(t),
                            _ => drop(t),
                        }
                    }
                });
            }
        });
        for t in kept.lock().unwrap().iter().step_by(2) {
            assert!(t.cancel());
        }
        clock.advance(ms(70));
        let never_ran = timer.stop().expect("stop from outside a task");
        let (ran, dropped) = (tally.ran.load(O::SeqCst), tally.dropped.load(O::SeqCst));
        assert_eq!(dropped, 24, "every task dropped once (run or not)");
        assert_eq!(
            ran + never_ran.len() + 6 + 3,
            24,
            "ran, returned or cancelled"
        );
        assert_eq!(timer.pending_timeouts(), 0);
        drop((never_ran, kept));
    }
}

/// How a forked child ended: its exit code, or the signal that killed it.
#[cfg(not(miri))]
#[derive(Debug, PartialEq, Eq)]
enum ChildEnd {
    Exited(i32),
    Killed(i32),
}

/// Runs `f` in a forked child of the test process and waits for it; the
/// child exits 0 when `f` returns, 101 when it panics. `f` must take no
/// lock another thread of the test process may hold (the child has only
/// the forking thread): atomics and `abort` only.
#[cfg(not(miri))]
fn in_child(f: impl FnOnce()) -> ChildEnd {
    // SAFETY: the child runs `f` (atomics only, see above) and leaves with
    // `_exit`, which runs no destructor and no atexit handler.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).is_ok();
        // SAFETY: ends the child at once.
        unsafe { libc::_exit(if ok { 0 } else { 101 }) };
    }
    let mut status = 0;
    // SAFETY: waits for our own child.
    let waited = unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(waited, pid, "waitpid failed");
    if libc::WIFSIGNALED(status) {
        ChildEnd::Killed(libc::WTERMSIG(status))
    } else {
        ChildEnd::Exited(libc::WEXITSTATUS(status))
    }
}

/// Issue 32: the reference count holds 2^30 - 1 references (30 bits of the
/// word); one more must abort the process, as `Arc`'s overflow does, and
/// never wrap (a wrapped count lets a handle's drop free the slot while
/// the wheel and leaked clones still point at it). The slot is made with
/// that many references directly: leaking them with `mem::forget` of
/// `Timeout` clones takes a billion increments. The child's `add_ref`
/// is a `Timeout::clone`'s, its `try_cancel(1)` a `cancel()`'s.
#[cfg(not(miri))]
#[test]
fn a_reference_count_at_its_bound_aborts_instead_of_wrapping() {
    use super::entry::{MAX_REFS, REF};

    let capacity = u32::MAX / REF;
    let p = producer();
    let t = Arc::new(Tally::default());
    let full = new_slot(&p, capacity, task::<8>(&t));
    assert_eq!(in_child(|| full.add_ref()), ChildEnd::Killed(libc::SIGABRT));
    assert!(
        MAX_REFS <= capacity / 2,
        "the bound leaves headroom for increments racing the check"
    );
    for refs in [capacity, MAX_REFS] {
        let slot = new_slot(&p, refs, task::<8>(&t));
        assert_eq!(in_child(|| slot.add_ref()), ChildEnd::Killed(libc::SIGABRT));
        assert_eq!(
            in_child(|| {
                slot.try_cancel(1);
            }),
            ChildEnd::Killed(libc::SIGABRT)
        );
        assert_eq!(slot.word() / REF, refs, "the parent's count is untouched");
    }
    // Below the bound, references are counted as usual.
    let slot = new_slot(&p, MAX_REFS - 1, task::<8>(&t));
    assert_eq!(
        in_child(|| {
            slot.add_ref();
            assert_eq!(slot.word() / REF, MAX_REFS);
        }),
        ChildEnd::Exited(0)
    );
    // The slots stay allocated (nobody drops a billion references): the
    // producer and its pool are leaked with them.
    std::mem::forget(p);
}

/// Issue 32: a thread scheduling in a tight loop reads the clock for the
/// first `PRECISE_PER_CLAIM` timeouts after each claim of the worker and
/// leaves the deadlines of later ones to a reading taken after their push:
/// its next time mark (every `MARK_EVERY` of them, which the worker
/// applies when it claims them), the handle's own when asked first, or the
/// worker's own at that claim. Each deadline is set
/// once and never before the clock read at the call plus the delay. (A
/// manual clock that defers like the system clock; time moves within a
/// tick, which the worker sleeps through without claiming.)
#[test]
fn deferred_deadlines_are_resolved_once_by_the_first_reading_after_the_call() {
    use super::ring::{MARK_EVERY, PRECISE_PER_CLAIM};
    use std::time::Duration;

    let tick = Duration::from_secs(1);
    let clock = ManualClock::deferring();
    let timer = HashedWheelTimer::builder()
        .tick_duration(tick)
        .clock(clock.clone())
        .build()
        .expect("valid arguments");
    timer.start().expect("starts");
    let delay = |i: u32| Duration::from_secs(3600) + Duration::from_nanos(u64::from(i));
    let (precise, marked) = (PRECISE_PER_CLAIM, 2 * MARK_EVERY);
    let unmarked = MARK_EVERY / 2;
    let n = precise + marked + unmarked;
    let mut called_at = Vec::new();
    let mut handles = Vec::new();
    for i in 0..n {
        called_at.push(timer.now());
        handles.push(timer.new_timeout(delay(i), |_| {}).expect("running"));
    }
    let unresolved = |t: &super::Timeout| t.slot.resolved_deadline().is_none();
    let expect = |range: std::ops::Range<u32>, left: bool| {
        for i in range {
            assert_eq!(unresolved(&handles[i as usize]), left, "timeout {i}");
        }
    };
    // Marks are read by the worker: until it claims, all of the deferred
    // wait.
    expect(0..precise, false);
    expect(precise..n, true);
    // 10 ms later (same tick: the worker claims nothing), the handle asks.
    clock.advance(Duration::from_millis(10));
    let asked = (precise + marked) as usize;
    assert_eq!(
        handles[asked].deadline(),
        Duration::from_millis(10) + delay(asked as u32)
    );
    // The tick ends: the worker claims the rest and resolves them.
    clock.advance(tick);
    expect(0..n, false);
    for (i, t) in handles.iter().enumerate() {
        let i = i as u32;
        let reading = match i {
            _ if i < precise + marked => Duration::ZERO,
            _ if i as usize == asked => Duration::from_millis(10),
            _ => tick + Duration::from_millis(10),
        };
        assert_eq!(t.deadline(), reading + delay(i), "timeout {i}");
        assert!(t.deadline() >= called_at[i as usize] + delay(i));
    }
    // The worker claimed: the next timeouts read the clock themselves.
    let after = timer.new_timeout(delay(0), |_| {}).expect("running");
    assert!(!unresolved(&after));
    assert_eq!(after.deadline(), timer.now() + delay(0));
    let never_ran = timer.stop().expect("stop from outside a task");
    assert_eq!(never_ran.len(), n as usize + 1);
}

/// Runs the calling test again, alone, in a child process (the test binary
/// with only this test selected), and panics unless it ran and passed;
/// false in that child, which then runs the test's body. For tests that
/// need the process to themselves (no other test's pool taking or adding a
/// cached block).
#[cfg(not(miri))]
fn rerun_alone(test: &str) -> bool {
    const CHILD: &str = "REDWHEEL_TIMER_TEST_ALONE";
    if std::env::var(CHILD).is_ok_and(|v| v == test) {
        return false;
    }
    let exe = std::env::current_exe().expect("the test binary");
    let out = std::process::Command::new(exe)
        .args([test, "--exact", "--test-threads", "1", "--nocapture"])
        .env(CHILD, test)
        .output()
        .expect("the test binary runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "the child run of {test} failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    true
}

/// Issue 32: the blocks of a pool whose last slot went back are kept in the
/// process-wide cache (`pool/blocks.rs`) and the next pool's chunks come from
/// it, pages already written (no page fault per 102 slots in the next timer);
/// the cache holds at most `CACHE_BYTES`. Alone in a child process, so that
/// no other test's pool takes or adds a block meanwhile.
#[cfg(not(miri))]
#[test]
fn a_closed_pools_blocks_are_reused_by_the_next_pool() {
    use super::pool::{CACHE_BYTES, cached_bytes};

    if rerun_alone("timer::tests::a_closed_pools_blocks_are_reused_by_the_next_pool") {
        return;
    }
    let chunk_of = |s: SlotRef| s.0.addr().get() & !4095;
    let t = Arc::new(Tally::default());
    let p = producer();
    // 300 slots: three chunks, in blocks of one and two.
    let slots: Vec<SlotRef> = (0..300).map(|_| new_slot(&p, 1, task::<1>(&t))).collect();
    let chunks: std::collections::BTreeSet<usize> = slots.iter().map(|&s| chunk_of(s)).collect();
    assert_eq!(chunks.len(), 3);
    let before = cached_bytes();
    for s in slots {
        release(s);
    }
    // SAFETY: this thread owns the pool.
    unsafe { Pool::close(&p.pool) };
    assert_eq!(cached_bytes(), before + 3 * 4096, "both blocks kept");
    let q = producer();
    let first = new_slot(&q, 1, task::<1>(&t));
    assert!(chunks.contains(&chunk_of(first)), "a cached block reused");
    assert_eq!(cached_bytes(), before + 2 * 4096);
    release(first);
    // SAFETY: as above.
    unsafe { Pool::close(&q.pool) };
    // More than the cache keeps: 600 pools of 31 chunks (blocks of 1, 2,
    // 4, 8 and 16), all closed.
    let mut pools = Vec::new();
    for _ in 0..600 {
        let r = producer();
        let s: Vec<SlotRef> = (0..SLOTS_PER_CHUNK * 31)
            .map(|_| new_slot(&r, 1, task::<1>(&t)))
            .collect();
        pools.push((r, s));
    }
    for (r, s) in pools {
        for slot in s {
            release(slot);
        }
        // SAFETY: as above.
        unsafe { Pool::close(&r.pool) };
    }
    assert!(cached_bytes() <= CACHE_BYTES, "{} cached", cached_bytes());
    assert!(cached_bytes() > CACHE_BYTES / 2);
}
