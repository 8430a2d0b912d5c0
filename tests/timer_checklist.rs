//! The timer behaviours of SPEC §1 that no Netty test covers, at least one
//! test each (Netty's own tests are ported in `timer_netty.rs`), a few more
//! explicit tests of items Netty covers only in passing, and tests for the
//! places where redwheel deliberately differs from Netty (see the module docs
//! of `redwheel::timer`).
//!
//! Each test names the SPEC item it checks (`HWT-…`). Timing goes through a
//! [`ManualClock`]; nothing here sleeps or asserts a wall-clock time. The
//! instance-count warning (HWT-C11) needs a process of its own and lives in
//! `timer_instances.rs`.

use std::fs;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Barrier, Mutex};
use std::thread;
use std::time::Duration;

use redwheel::timer::{
    Clock, Executor, HashedWheelTimer, Job, MAX_TICKS_PER_WHEEL, MIN_TICK, ManualClock,
    TRANSFER_CAP, Timeout, TimerError,
};

mod timer_common;
use timer_common::*;

/// Threads of this process whose name (`/proc/self/task/*/comm`, at most 15
/// bytes) is `name`. Listing `/proc/self/task` while other threads exit can
/// skip entries, so this takes the largest of a few listings.
fn threads_named(name: &str) -> usize {
    assert!(
        name.len() <= 15,
        "Linux keeps only 15 bytes of a thread name"
    );
    let scan = || {
        fs::read_dir("/proc/self/task")
            .expect("/proc/self/task is readable")
            .filter_map(|entry| fs::read_to_string(entry.ok()?.path().join("comm")).ok())
            .filter(|comm| comm.trim_end() == name)
            .count()
    };
    (0..5).map(|_| scan()).max().unwrap_or(0)
}

fn is_invalid(result: &Result<HashedWheelTimer, TimerError>, arg: &str) -> bool {
    matches!(result, Err(TimerError::InvalidArgument { name, .. }) if *name == arg)
}

// HWT-C01: Netty's defaults: 100 ms tick, 512 buckets, no pending limit, and
// tasks run on the worker thread.
#[test]
fn builder_defaults_are_nettys() -> TestResult {
    let clock = ManualClock::new();
    let timer = HashedWheelTimer::builder().clock(clock.clone()).build()?;
    assert_eq!(timer.tick_duration(), ms(100));
    assert_eq!(timer.ticks_per_wheel(), 512);

    let (tx, rx) = mpsc::channel();
    timer.new_timeout(Duration::ZERO, move |_| {
        let _ = tx.send(thread::current().name().map(str::to_owned));
    })?;
    for _ in 0..1_000 {
        timer.new_timeout(secs(60), |_| {})?;
    }
    clock.advance(ms(100));
    assert_eq!(rx.try_recv()?.as_deref(), Some("redwheel-timer"));
    assert_eq!(timer.pending_timeouts(), 1_000);
    Ok(())
}

// HWT-C02: bad arguments are typed errors, not panics, checked in Netty's
// order: tick_duration, then ticks_per_wheel, then the overflow guard. (Rust
// has no null thread factory, unit or executor to check.)
#[test]
fn invalid_arguments_are_typed_errors_checked_tick_first() {
    let both_bad = HashedWheelTimer::builder()
        .tick_duration(Duration::ZERO)
        .ticks_per_wheel(0)
        .build();
    assert!(is_invalid(&both_bad, "tick_duration"), "got {both_bad:?}");

    let wheel_and_overflow_bad = HashedWheelTimer::builder()
        .tick_duration(Duration::MAX)
        .ticks_per_wheel(0)
        .build();
    assert!(
        is_invalid(&wheel_and_overflow_bad, "ticks_per_wheel"),
        "got {wheel_and_overflow_bad:?}"
    );

    let err = both_bad.unwrap_err();
    assert!(!err.is_transient());
    assert!(err.to_string().contains("tick_duration"), "{err}");
}

// HWT-C03: a zero tick is an error.
#[test]
fn zero_tick_duration_is_rejected() {
    let result = HashedWheelTimer::builder()
        .tick_duration(Duration::ZERO)
        .build();
    assert!(is_invalid(&result, "tick_duration"), "got {result:?}");
}

// HWT-C04: zero buckets is an error.
#[test]
fn zero_ticks_per_wheel_is_rejected() {
    let result = HashedWheelTimer::builder().ticks_per_wheel(0).build();
    assert!(is_invalid(&result, "ticks_per_wheel"), "got {result:?}");
}

// HWT-C05: the number of buckets is rounded up to a power of two.
#[test]
fn ticks_per_wheel_rounds_up_to_a_power_of_two() -> TestResult {
    for (asked, got) in [(1, 1), (2, 2), (3, 4), (5, 8), (512, 512), (513, 1024)] {
        let timer = HashedWheelTimer::builder().ticks_per_wheel(asked).build()?;
        assert_eq!(timer.ticks_per_wheel(), got, "ticks_per_wheel({asked})");
    }
    Ok(())
}

// HWT-C05 (port): more than 2^30 buckets is an invalid argument, not an
// allocation failure. (A 2^30-bucket timer is never built here: its wheel
// takes gigabytes.)
#[test]
fn ticks_per_wheel_above_two_to_the_thirtieth_is_rejected() {
    assert_eq!(MAX_TICKS_PER_WHEEL, 1 << 30);
    for asked in [(1 << 30) + 1, 1 << 31, usize::MAX] {
        let result = HashedWheelTimer::builder().ticks_per_wheel(asked).build();
        assert!(
            is_invalid(&result, "ticks_per_wheel"),
            "{asked}: got {result:?}"
        );
    }
}

// HWT-C06: a tick for which one turn of the wheel does not fit in signed
// 64-bit nanoseconds is rejected; the limit is i64::MAX / buckets.
#[test]
fn tick_whose_wheel_turn_overflows_64_bit_nanoseconds_is_rejected() -> TestResult {
    let limit = i64::MAX as u64 / 512;
    let at_limit = HashedWheelTimer::builder()
        .tick_duration(Duration::from_nanos(limit))
        .ticks_per_wheel(512)
        .build();
    assert!(is_invalid(&at_limit, "tick_duration"), "got {at_limit:?}");

    let huge = HashedWheelTimer::builder()
        .tick_duration(Duration::from_secs(u64::MAX / 1_000))
        .ticks_per_wheel(512)
        .build();
    assert!(is_invalid(&huge, "tick_duration"), "got {huge:?}");

    let max_on_one_bucket = HashedWheelTimer::builder()
        .tick_duration(Duration::MAX)
        .ticks_per_wheel(1)
        .build();
    assert!(is_invalid(&max_on_one_bucket, "tick_duration"));

    let below = HashedWheelTimer::builder()
        .tick_duration(Duration::from_nanos(limit - 1))
        .ticks_per_wheel(512)
        .build()?;
    assert_eq!(below.tick_duration(), Duration::from_nanos(limit - 1));
    Ok(())
}

// HWT-C07: a tick below 1 ms becomes exactly 1 ms, with a warning, and the
// timer then ticks every millisecond.
#[test]
fn tick_below_one_millisecond_is_raised_to_exactly_one_millisecond() -> TestResult {
    let log = LogBuf::default();
    let clock = ManualClock::new();
    let timer = tracing::subscriber::with_default(subscriber_into(&log), || {
        for tiny in [Duration::from_nanos(1), Duration::from_micros(999)] {
            let timer = HashedWheelTimer::builder().tick_duration(tiny).build()?;
            assert_eq!(timer.tick_duration(), MIN_TICK, "tick_duration({tiny:?})");
        }
        HashedWheelTimer::builder()
            .tick_duration(Duration::from_nanos(999_999))
            .clock(clock.clone())
            .build()
    })?;
    assert_eq!(MIN_TICK, ms(1));
    assert_eq!(timer.tick_duration(), ms(1));
    let warnings = log.lines_with("below the minimum");
    assert_eq!(
        warnings.len(),
        3,
        "one warning per raised tick: {warnings:?}"
    );
    assert!(warnings.iter().all(|l| l.contains("WARN")));

    let ran = counter();
    timer.new_timeout(Duration::ZERO, counting(&ran))?;
    clock.advance(Duration::from_micros(999));
    assert_eq!(get(&ran), 0);
    clock.advance(Duration::from_micros(1));
    assert_eq!(get(&ran), 1, "a zero delay fires when the 1 ms tick ends");
    Ok(())
}

// HWT-C07: a tick of 1 ms or more is used as given, not rounded to whole
// milliseconds, and logs nothing.
#[test]
fn tick_of_one_millisecond_or_more_is_kept_as_given() -> TestResult {
    let log = LogBuf::default();
    let (one, one_and_a_half) = tracing::subscriber::with_default(subscriber_into(&log), || {
        let one = HashedWheelTimer::builder().tick_duration(ms(1)).build();
        let one_and_a_half = HashedWheelTimer::builder()
            .tick_duration(Duration::from_micros(1_500))
            .build();
        (one, one_and_a_half)
    });
    assert_eq!(one?.tick_duration(), ms(1));
    assert_eq!(
        one_and_a_half?.tick_duration(),
        Duration::from_micros(1_500)
    );
    assert!(log.text().is_empty(), "unexpected log: {}", log.text());
    Ok(())
}

// HWT-C08 / HWT-L03: building a timer starts no thread; the first new_timeout
// does.
#[test]
fn worker_thread_starts_with_the_first_timeout_not_at_build() -> TestResult {
    const NAME: &str = "rw-c08-lazy";
    assert_eq!(threads_named(NAME), 0);
    let timer = HashedWheelTimer::builder()
        .thread_name(NAME)
        .clock(ManualClock::new())
        .build()?;
    assert_eq!(threads_named(NAME), 0, "build() started the worker");

    timer.new_timeout(secs(60), |_| {})?;
    assert_eq!(threads_named(NAME), 1);
    timer.new_timeout(secs(60), |_| {})?;
    assert_eq!(threads_named(NAME), 1, "one worker per timer");
    timer.stop()?;
    Ok(())
}

// HWT-C08 / HWT-L01: start() starts the worker before any timeout, and
// returns only once it runs; later calls start nothing more.
#[test]
fn start_starts_the_worker_thread_once() -> TestResult {
    const NAME: &str = "rw-c08-start";
    let timer = HashedWheelTimer::builder()
        .thread_name(NAME)
        .clock(ManualClock::new())
        .build()?;
    assert_eq!(threads_named(NAME), 0);
    timer.start()?;
    assert_eq!(threads_named(NAME), 1);
    timer.start()?;
    timer.new_timeout(secs(60), |_| {})?;
    assert_eq!(threads_named(NAME), 1);
    timer.stop()?;
    Ok(())
}

// HWT-L01: concurrent start() calls all succeed and spawn one worker.
#[test]
fn concurrent_starts_spawn_one_worker_thread() -> TestResult {
    const NAME: &str = "rw-l01-race";
    let timer = HashedWheelTimer::builder()
        .thread_name(NAME)
        .clock(ManualClock::new())
        .build()?;
    let barrier = Arc::new(Barrier::new(8));
    let starters: Vec<_> = (0..8)
        .map(|_| {
            let (timer, barrier) = (timer.clone(), barrier.clone());
            thread::spawn(move || {
                barrier.wait();
                let started = timer.start();
                // Each caller returns only once the worker runs.
                (started.is_ok(), threads_named(NAME))
            })
        })
        .collect();
    for starter in starters {
        let (ok, threads) = starter.join().expect("start() does not panic");
        assert!(ok);
        assert_eq!(threads, 1, "worker threads seen when start() returned");
    }
    timer.stop()?;
    Ok(())
}

// HWT-C10: max_pending(0), the default, means no limit.
#[test]
fn max_pending_zero_means_unlimited() -> TestResult {
    let clock = ManualClock::new();
    let timer = HashedWheelTimer::builder()
        .max_pending(0)
        .clock(clock.clone())
        .build()?;
    for _ in 0..20_000 {
        timer.new_timeout(secs(60), |_| {})?;
    }
    assert_eq!(timer.pending_timeouts(), 20_000);
    assert_eq!(timer.stop()?.len(), 20_000);
    Ok(())
}

// HWT-L04: stop() from a task on the worker thread fails with StopFromTask
// (the worker cannot join itself), and the timer keeps running.
#[test]
fn stop_from_a_task_on_the_worker_thread_fails_and_the_timer_keeps_running() -> TestResult {
    let (timer, clock) = manual_timer(ms(10), 8);
    let (tx, rx) = mpsc::channel();
    let inner = timer.clone();
    timer.new_timeout(ms(5), move |_| {
        let _ = tx.send(inner.stop());
    })?;
    let ran = counter();
    timer.new_timeout(ms(25), counting(&ran))?;

    clock.advance(ms(10));
    let result = rx.try_recv()?;
    assert!(
        matches!(result, Err(TimerError::StopFromTask)),
        "got {result:?}"
    );

    clock.advance(ms(20));
    assert_eq!(get(&ran), 1, "the timer stopped");
    let ran_after = counter();
    timer.new_timeout(ms(5), counting(&ran_after))?;
    clock.advance(ms(10));
    assert_eq!(get(&ran_after), 1);
    assert!(timer.stop()?.is_empty());
    Ok(())
}

// HWT-L04: with an executor the task runs on another thread, where stop()
// works: it stops the timer and returns the other pending timeout.
#[test]
fn stop_from_a_task_run_by_an_executor_stops_the_timer() -> TestResult {
    let clock = ManualClock::new();
    let timer = HashedWheelTimer::builder()
        .tick_duration(ms(10))
        .clock(clock.clone())
        .executor(|job: Job| {
            thread::spawn(move || job.run());
        })
        .build()?;
    let (tx, rx) = mpsc::channel();
    let inner = timer.clone();
    timer.new_timeout(ms(5), move |_| {
        let _ = tx.send(inner.stop());
    })?;
    let other = timer.new_timeout(secs(60), |_| {})?;

    clock.advance(ms(10));
    let never_ran = rx.recv_timeout(HANG_GUARD)??;
    assert_eq!(never_ran.len(), 1);
    assert!(never_ran[0].ptr_eq(&other));
    assert!(other.is_cancelled());
    assert!(matches!(
        timer.new_timeout(ms(5), |_| {}),
        Err(TimerError::Stopped)
    ));
    Ok(())
}

// HWT-L05: stop() on a never-started timer returns nothing at once, starts no
// thread, and leaves the timer stopped; a second stop() also returns nothing.
#[test]
fn stop_before_start_and_a_second_stop_return_nothing() -> TestResult {
    const NAME: &str = "rw-l05-never";
    let timer = HashedWheelTimer::builder()
        .thread_name(NAME)
        .clock(ManualClock::new())
        .build()?;
    assert!(timer.stop()?.is_empty());
    assert!(timer.stop()?.is_empty());
    assert!(matches!(timer.start(), Err(TimerError::Stopped)));
    assert!(matches!(
        timer.new_timeout(ms(1), |_| {}),
        Err(TimerError::Stopped)
    ));
    assert_eq!(threads_named(NAME), 0);
    assert_eq!(timer.pending_timeouts(), 0);

    let (started, _clock) = manual_timer(ms(10), 8);
    started.new_timeout(secs(60), |_| {})?;
    assert_eq!(started.stop()?.len(), 1);
    assert!(
        started.stop()?.is_empty(),
        "a second stop() returned timeouts again"
    );
    Ok(())
}

// HWT-L06: stop() is synchronous: when it returns, a task that was running
// has finished.
#[test]
fn stop_waits_for_a_running_task_to_finish() -> TestResult {
    let (timer, clock) = manual_timer(ms(10), 8);
    let finished = Arc::new(AtomicBool::new(false));
    let (running_tx, running_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let done = finished.clone();
    timer.new_timeout(ms(5), move |_| {
        let _ = running_tx.send(());
        let _ = release_rx.recv_timeout(HANG_GUARD);
        done.store(true, Ordering::SeqCst);
    })?;
    let mover = {
        let clock = clock.clone();
        thread::spawn(move || clock.advance(ms(10)))
    };
    running_rx.recv_timeout(HANG_GUARD)?;

    let (stopping_tx, stopping_rx) = mpsc::channel();
    let stopper = {
        let (timer, finished) = (timer.clone(), finished.clone());
        thread::spawn(move || {
            let _ = stopping_tx.send(());
            let result = timer.stop();
            (result.map(|v| v.len()), finished.load(Ordering::SeqCst))
        })
    };
    stopping_rx.recv_timeout(HANG_GUARD)?;
    release_tx.send(())?;
    let (result, finished_when_stop_returned) = stopper.join().expect("stop() does not panic");
    assert_eq!(result?, 0);
    assert!(
        finished_when_stop_returned,
        "stop() returned while the task ran"
    );
    mover.join().expect("advance does not panic");
    Ok(())
}

// HWT-X01: a panicking task is caught and logged at WARN; the worker goes on
// and later timeouts fire.
#[test]
fn panicking_task_is_logged_and_later_timeouts_still_fire() -> TestResult {
    let log = global_log();
    let (timer, clock) = manual_timer(ms(10), 8);
    let bad = timer.new_timeout(ms(5), |_| panic!("x01 boom from a timer task"))?;
    let ran = counter();
    timer.new_timeout(ms(25), counting(&ran))?;

    clock.advance(ms(10));
    assert!(bad.is_expired());
    let lines = log.lines_with("x01 boom from a timer task");
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains("WARN"), "{}", lines[0]);

    clock.advance(ms(20));
    assert_eq!(get(&ran), 1);
    let after = counter();
    timer.new_timeout(ms(5), counting(&after))?;
    clock.advance(ms(10));
    assert_eq!(get(&after), 1);
    assert_eq!(timer.pending_timeouts(), 0);
    assert!(timer.stop()?.is_empty());
    Ok(())
}

// HWT-X01 with an executor: Job::run catches a task's panic too.
#[test]
fn panicking_task_run_by_an_executor_is_caught() -> TestResult {
    let log = global_log();
    let clock = ManualClock::new();
    let (jobs_tx, jobs_rx) = mpsc::channel::<Job>();
    let timer = HashedWheelTimer::builder()
        .tick_duration(ms(10))
        .clock(clock.clone())
        .executor(move |job: Job| {
            let _ = jobs_tx.send(job);
        })
        .build()?;
    timer.new_timeout(ms(5), |_| panic!("x01 boom from an executor job"))?;
    clock.advance(ms(10));
    jobs_rx.try_recv()?.run();
    assert_eq!(log.lines_with("x01 boom from an executor job").len(), 1);
    Ok(())
}

/// Records, per timeout, the clock reading when its task ran.
fn record_fire_time(
    clock: &ManualClock,
    fired_at: &Arc<Mutex<Vec<Duration>>>,
) -> impl FnOnce(&Timeout) + Send + 'static {
    let (clock, fired_at) = (clock.clone(), fired_at.clone());
    move |_| fired_at.lock().unwrap().push(clock.now())
}

// HWT-W07 (with W03, W05): a timeout already overdue when the worker moves it
// into the wheel goes into the current bucket and fires in the current tick,
// never a turn later. Made overdue here by the transfer cap: of TRANSFER_CAP+1
// zero-delay timeouts (due in tick 0) the last is transferred in tick 1.
#[test]
fn timeout_overdue_at_transfer_fires_in_the_current_tick() -> TestResult {
    let (timer, clock) = manual_timer(ms(10), 4);
    let fired_at = Arc::new(Mutex::new(Vec::with_capacity(TRANSFER_CAP + 1)));
    for _ in 0..=TRANSFER_CAP {
        timer.new_timeout(Duration::ZERO, record_fire_time(&clock, &fired_at))?;
    }

    clock.advance(ms(10));
    assert_eq!(
        fired_at.lock().unwrap().len(),
        TRANSFER_CAP,
        "one tick moves at most the cap"
    );
    clock.advance(ms(10));
    let fired_at = fired_at.lock().unwrap();
    assert_eq!(
        fired_at.len(),
        TRANSFER_CAP + 1,
        "the overdue timeout did not fire in tick 1"
    );
    assert_eq!(fired_at[TRANSFER_CAP], ms(20));
    assert_eq!(timer.pending_timeouts(), 0);
    Ok(())
}

// HWT-N06 / HWT-W07: a zero-delay timeout scheduled by a task (on the worker
// thread, during tick t) is due in tick t+1, so it fires one tick later, not
// in the tick that scheduled it and not a wheel turn later.
#[test]
fn zero_delay_timeout_scheduled_from_a_task_fires_one_tick_later() -> TestResult {
    let (timer, clock) = manual_timer(ms(10), 4);
    let fired_at = Arc::new(Mutex::new(Vec::new()));
    let (inner, inner_clock, inner_fired) = (timer.clone(), clock.clone(), fired_at.clone());
    timer.new_timeout(Duration::ZERO, move |_| {
        inner_fired.lock().unwrap().push(inner_clock.now());
        inner
            .new_timeout(Duration::ZERO, record_fire_time(&inner_clock, &inner_fired))
            .expect("the timer is running");
    })?;

    clock.advance(ms(10));
    assert_eq!(*fired_at.lock().unwrap(), [ms(10)]);
    clock.advance(ms(10));
    assert_eq!(*fired_at.lock().unwrap(), [ms(10), ms(20)]);
    Ok(())
}

// HWT-N05 / HWT-W01: a zero delay is accepted and fires when the current tick
// ends, not before.
#[test]
fn zero_delay_timeout_fires_when_the_current_tick_ends() -> TestResult {
    let (timer, clock) = manual_timer(ms(10), 8);
    timer.start()?;
    clock.advance(ms(3));
    let ran = counter();
    timer.new_timeout(Duration::ZERO, counting(&ran))?;

    clock.advance(ms(7) - Duration::from_nanos(1));
    assert_eq!(get(&ran), 0);
    clock.advance(Duration::from_nanos(1));
    assert_eq!(get(&ran), 1);
    Ok(())
}

// HWT-N03 (fixed): new_timeout on a stopped timer fails without raising the
// pending count, and drops its task.
#[test]
fn new_timeout_after_stop_does_not_leak_a_pending_count() -> TestResult {
    let (timer, clock) = manual_timer(ms(10), 8);
    timer.new_timeout(secs(60), |_| {})?;
    timer.stop()?;
    assert_eq!(timer.pending_timeouts(), 0);

    let (ran, dropped) = (counter(), counter());
    for _ in 0..3 {
        let result = timer.new_timeout(ms(1), tracked(&ran, &dropped));
        assert!(matches!(result, Err(TimerError::Stopped)), "got {result:?}");
    }
    assert_eq!(timer.pending_timeouts(), 0);
    assert_eq!(get(&dropped), 3);
    clock.advance(ms(100));
    assert_eq!(get(&ran), 0);
    Ok(())
}

// HWT-L08 / HWT-L09 (fixed): the timeouts stop() returns are cancelled, no
// longer counted as pending, and their tasks are dropped without running.
#[test]
fn timeouts_returned_by_stop_are_cancelled_and_not_counted() -> TestResult {
    let (timer, clock) = manual_timer(ms(10), 8);
    let (ran, dropped) = (counter(), counter());
    for _ in 0..4 {
        timer.new_timeout(secs(60), tracked(&ran, &dropped))?;
    }
    clock.advance(ms(10)); // four in buckets
    for _ in 0..3 {
        timer.new_timeout(secs(60), tracked(&ran, &dropped))?;
    }
    assert_eq!(timer.pending_timeouts(), 7);

    let never_ran = timer.stop()?;
    assert_eq!(never_ran.len(), 7);
    assert!(
        never_ran
            .iter()
            .all(|t| t.is_cancelled() && !t.is_expired())
    );
    assert_eq!(timer.pending_timeouts(), 0);
    assert_eq!(get(&dropped), 7);
    assert_eq!(get(&ran), 0);
    Ok(())
}

// HWT-N04: Duration::MAX (too large for the clock) never fires, reports a
// "never" deadline, and can be cancelled. A one-day tick lets the clock move
// a century in 36,500 ticks.
#[test]
fn duration_max_delay_never_fires_and_can_be_cancelled() -> TestResult {
    const DAY: Duration = Duration::from_secs(24 * 3600);
    let (timer, clock) = manual_timer(DAY, 8);
    let (ran, dropped) = (counter(), counter());
    let timeout = timer.new_timeout(Duration::MAX, tracked(&ran, &dropped))?;
    assert_eq!(timeout.deadline(), Duration::from_nanos(u64::MAX));

    for _ in 0..5 {
        clock.advance(DAY * 365 * 20);
    }
    assert_eq!(get(&ran), 0);
    assert!(!timeout.is_expired());

    assert!(timeout.cancel());
    clock.advance(DAY);
    assert_eq!(timer.pending_timeouts(), 0);
    assert_eq!(get(&dropped), 1);
    assert_eq!(get(&ran), 0);
    Ok(())
}

/// An executor that refuses every job.
struct RejectAll(Counter);

impl Executor for RejectAll {
    fn execute(&self, job: Job) -> Result<(), Job> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Err(job)
    }
}

// HWT-W08 / HWT-X03: a job the executor rejects is logged and dropped; its
// timeout stays expired and counted out, and the worker goes on.
#[test]
fn rejecting_executor_leaves_the_timeout_expired_and_drops_the_task() -> TestResult {
    let log = global_log();
    let clock = ManualClock::new();
    let offered = counter();
    let timer = HashedWheelTimer::builder()
        .tick_duration(ms(10))
        .clock(clock.clone())
        .executor(RejectAll(offered.clone()))
        .build()?;
    let (ran, dropped) = (counter(), counter());
    let timeout = timer.new_timeout(ms(5), tracked(&ran, &dropped))?;

    clock.advance(ms(10));
    assert_eq!(get(&offered), 1);
    assert!(timeout.is_expired());
    assert!(!timeout.is_cancelled());
    assert!(!timeout.cancel());
    assert_eq!(get(&ran), 0);
    assert_eq!(get(&dropped), 1);
    assert_eq!(timer.pending_timeouts(), 0);
    assert!(!log.lines_with("executor rejected").is_empty());

    timer.new_timeout(ms(5), |_| {})?;
    clock.advance(ms(10));
    assert_eq!(get(&offered), 2, "the worker stopped after a rejection");
    Ok(())
}

// Handles outlive their timer: after the last timer handle is dropped, every
// Timeout method still works and nothing panics.
#[test]
fn timeout_handle_works_after_its_timer_is_dropped() -> TestResult {
    let (timer, clock) = manual_timer(ms(10), 8);
    let ran = counter();
    let expired = timer.new_timeout(ms(5), counting(&ran))?;
    let pending = timer.new_timeout(secs(60), |_| {})?;
    clock.advance(ms(10));
    drop(timer);

    assert!(expired.is_expired());
    assert!(!expired.cancel());
    assert!(
        pending.is_cancelled(),
        "dropping the timer stops it as stop() does"
    );
    assert!(!pending.cancel());
    assert_eq!(pending.deadline(), secs(60));
    assert!(format!("{pending:?} {expired:?}").contains("cancelled"));
    clock.advance(secs(120));
    assert_eq!(get(&ran), 1);
    Ok(())
}

// Dropping the last HashedWheelTimer clone stops the worker: pending tasks
// are dropped without running, by the time the drop returns. Dropping another
// clone does nothing.
#[test]
fn dropping_the_last_timer_clone_stops_the_worker_and_drops_pending_tasks() -> TestResult {
    let (timer, clock) = manual_timer(ms(10), 8);
    let clone = timer.clone();
    let (ran, dropped) = (counter(), counter());
    let timeout = timer.new_timeout(secs(60), tracked(&ran, &dropped))?;

    drop(clone);
    clock.advance(ms(10));
    assert_eq!(
        get(&dropped),
        0,
        "dropping a clone that is not the last stopped the timer"
    );
    assert!(!timeout.is_cancelled());

    drop(timer);
    assert_eq!(get(&dropped), 1);
    assert_eq!(get(&ran), 0);
    assert!(timeout.is_cancelled());
    Ok(())
}

/// Sends on a channel when dropped.
struct DropSignal(mpsc::Sender<()>);

impl Drop for DropSignal {
    fn drop(&mut self) {
        let _ = self.0.send(());
    }
}

// Dropping the last timer clone from inside a task (on the worker thread,
// which cannot join itself) still stops the timer: the worker exits and
// drops the tasks still pending, and their handles read as cancelled.
#[test]
fn dropping_the_last_timer_clone_inside_a_task_stops_the_timer() -> TestResult {
    let (timer, clock) = manual_timer(ms(10), 8);
    let (dropped_tx, dropped_rx) = mpsc::channel();
    let signal = DropSignal(dropped_tx);
    let ran = counter();
    let left_behind = timer.new_timeout(secs(60), {
        let ran = ran.clone();
        move |_| {
            let _signal = signal;
            ran.fetch_add(1, Ordering::SeqCst);
        }
    })?;
    let (ran_tx, ran_rx) = mpsc::channel();
    let last = timer.clone();
    timer.new_timeout(ms(5), move |_| {
        drop(last);
        let _ = ran_tx.send(());
    })?;
    drop(timer);

    clock.advance(ms(10));
    ran_rx.recv_timeout(HANG_GUARD)?;
    dropped_rx.recv_timeout(HANG_GUARD)?;
    clock.advance(secs(120));
    assert_eq!(get(&ran), 0);
    assert!(!left_behind.is_expired());
    assert!(
        left_behind.is_cancelled(),
        "a timeout of a dropped timer reads as pending forever"
    );
    Ok(())
}

// HWT-L10 (fixed): a new_timeout racing with stop() either fails with
// Stopped or has its timeout returned by stop() (never both, never neither);
// none runs, every task is dropped, and the pending count ends at zero.
#[test]
fn new_timeout_racing_stop_is_rejected_or_returned_by_stop() -> TestResult {
    for _ in 0..300 {
        let (timer, _clock) = manual_timer(ms(10), 8);
        let (ran, dropped) = (counter(), counter());
        let ready = Arc::new(Barrier::new(2));
        let (stopped_tx, stopped_rx) = mpsc::channel::<()>();
        let producer = {
            let (timer, ran, dropped, ready) =
                (timer.clone(), ran.clone(), dropped.clone(), ready.clone());
            thread::spawn(move || {
                let (mut accepted, mut attempts) = (Vec::new(), 0usize);
                loop {
                    if attempts == 50 {
                        ready.wait(); // stop() starts now, while we go on
                    }
                    if attempts == 1_050 {
                        // stop() was slow to start: wait for it, so the
                        // lists stay short, and check the next call fails.
                        let _ = stopped_rx.recv_timeout(HANG_GUARD);
                    }
                    attempts += 1;
                    match timer.new_timeout(secs(3600), tracked(&ran, &dropped)) {
                        Ok(t) => accepted.push(t),
                        Err(TimerError::Stopped) => break,
                        Err(e) => panic!("unexpected {e:?}"),
                    }
                }
                (accepted, attempts)
            })
        };
        ready.wait();
        let never_ran = timer.stop()?;
        stopped_tx.send(()).ok();
        let (accepted, attempts) = producer.join().expect("the producer does not panic");

        for n in &never_ran {
            assert!(
                accepted.iter().any(|t| t.ptr_eq(n)),
                "stop() returned a timeout whose new_timeout failed: {n:?}"
            );
        }
        for t in &accepted {
            assert!(
                t.is_cancelled(),
                "accepted before stop() but not cancelled: {t:?}"
            );
            assert!(never_ran.iter().any(|n| n.ptr_eq(t)), "stranded: {t:?}");
        }
        assert_eq!(timer.pending_timeouts(), 0);
        drop((timer, never_ran, accepted));
        assert_eq!(get(&ran), 0);
        assert_eq!(get(&dropped), attempts, "a task was not dropped");
    }
    Ok(())
}

// HWT-P01: an expiring timeout is counted out before its task runs, so the
// task sees its own slot free.
#[test]
fn pending_count_drops_before_the_task_runs() -> TestResult {
    let clock = ManualClock::new();
    let timer = HashedWheelTimer::builder()
        .tick_duration(ms(10))
        .max_pending(1)
        .clock(clock.clone())
        .build()?;
    let (tx, rx) = mpsc::channel();
    let inner = timer.clone();
    timer.new_timeout(ms(5), move |_| {
        let seen = inner.pending_timeouts();
        let rescheduled = inner.new_timeout(secs(60), |_| {}).is_ok();
        let _ = tx.send((seen, rescheduled));
    })?;
    clock.advance(ms(10));
    assert_eq!(rx.try_recv()?, (0, true));
    assert_eq!(timer.pending_timeouts(), 1);
    Ok(())
}

// HWT-W11: timeouts due in the same tick run in the order they were
// scheduled, not sorted by deadline.
#[test]
fn timeouts_due_in_the_same_tick_run_in_submission_order() -> TestResult {
    let (timer, clock) = manual_timer(ms(10), 8);
    let order = Arc::new(Mutex::new(Vec::new()));
    for (i, delay_ms) in [9, 1, 5, 0, 7].into_iter().enumerate() {
        let order = order.clone();
        timer.new_timeout(ms(delay_ms), move |_| order.lock().unwrap().push(i))?;
    }
    clock.advance(ms(10));
    assert_eq!(*order.lock().unwrap(), [0, 1, 2, 3, 4]);
    Ok(())
}

// HWT-W12: a task may cancel a later timeout of its own tick; that one then
// never runs.
#[test]
fn a_task_can_cancel_a_later_timeout_of_its_own_tick() -> TestResult {
    let (timer, clock) = manual_timer(ms(10), 8);
    let victim_slot: Arc<Mutex<Option<Timeout>>> = Arc::default();
    let (tx, rx) = mpsc::channel();
    let slot = victim_slot.clone();
    timer.new_timeout(ms(5), move |_| {
        let victim = slot.lock().unwrap().take().expect("set before the tick");
        let _ = tx.send(victim.cancel());
    })?;
    let (ran, dropped) = (counter(), counter());
    let victim = timer.new_timeout(ms(5), tracked(&ran, &dropped))?;
    *victim_slot.lock().unwrap() = Some(victim.clone());

    clock.advance(ms(10));
    assert!(rx.try_recv()?, "cancel() from the task returned false");
    assert_eq!(get(&ran), 0);
    assert_eq!(get(&dropped), 1);
    assert!(victim.is_cancelled());
    clock.advance(ms(10));
    assert_eq!(timer.pending_timeouts(), 0);
    Ok(())
}

// HWT-W02: when time jumps over many ticks, the worker processes every one
// of them: everything due fires, in deadline order across ticks.
#[test]
fn worker_catches_up_on_every_tick_that_ended() -> TestResult {
    let (timer, clock) = manual_timer(ms(10), 8);
    let order = Arc::new(Mutex::new(Vec::new()));
    for k in (0..50u64).rev() {
        let order = order.clone();
        timer.new_timeout(ms(10 * k + 5), move |_| order.lock().unwrap().push(k))?;
    }
    clock.advance(secs(1));
    let order = order.lock().unwrap();
    assert_eq!(*order, (0..50).collect::<Vec<_>>());
    assert_eq!(timer.pending_timeouts(), 0);
    Ok(())
}

// HWT-W06: a timeout several wheel turns ahead is passed over on the earlier
// visits of its bucket and fires on its own turn.
#[test]
fn timeout_several_turns_ahead_fires_only_on_its_own_turn() -> TestResult {
    let (timer, clock) = manual_timer(ms(10), 4);
    let ran = counter();
    // Due in tick 8: bucket 0, visited at ticks 0 and 4 first.
    timer.new_timeout(ms(85), counting(&ran))?;
    for tick in 0..8 {
        clock.advance(ms(10));
        assert_eq!(get(&ran), 0, "fired at the end of tick {tick}");
    }
    clock.advance(ms(10));
    assert_eq!(get(&ran), 1);
    Ok(())
}

// HWT-P03: a timeout cancelled after it was placed in its bucket, before its
// tick, is counted out exactly once (and its slot under max_pending freed).
#[test]
fn timeout_cancelled_in_its_bucket_before_its_tick_is_counted_out_once() -> TestResult {
    let clock = ManualClock::new();
    let timer = HashedWheelTimer::builder()
        .tick_duration(ms(10))
        .ticks_per_wheel(8)
        .max_pending(1)
        .clock(clock.clone())
        .build()?;
    let (ran, dropped) = (counter(), counter());
    let timeout = timer.new_timeout(ms(55), tracked(&ran, &dropped))?;
    clock.advance(ms(10)); // now in bucket 5
    assert!(timeout.cancel());
    clock.advance(ms(100));
    assert_eq!(timer.pending_timeouts(), 0);
    assert_eq!(get(&ran), 0);
    assert_eq!(get(&dropped), 1);

    timer.new_timeout(secs(60), |_| {})?;
    assert_eq!(timer.pending_timeouts(), 1);
    assert!(timer.new_timeout(secs(60), |_| {}).is_err());
    Ok(())
}

// HWT-P02: a cancelled timeout stops counting by the next tick boundary,
// whether it was still queued or already placed in a bucket. (When exactly
// before that boundary is the worker's business, so it is not asserted.)
#[test]
fn cancelled_timeout_stops_counting_by_the_next_tick_boundary() -> TestResult {
    let (timer, clock) = manual_timer(ms(10), 8);
    let placed = timer.new_timeout(secs(60), |_| {})?;
    clock.advance(ms(10)); // the worker has moved it into a bucket
    let queued = timer.new_timeout(secs(60), |_| {})?;
    let _other = timer.new_timeout(secs(60), |_| {})?;
    assert_eq!(timer.pending_timeouts(), 3);

    assert!(queued.cancel());
    assert!(placed.cancel());
    assert!(timer.pending_timeouts() >= 1);
    clock.advance(ms(10));
    assert_eq!(timer.pending_timeouts(), 1);
    Ok(())
}

// HWT-P02, for timeouts cancelled before the worker took them from their
// ring: one among the last pushed there is taken out by `cancel` itself,
// one pushed longer ago goes through the cancelled list; both stay counted
// until the next tick boundary, never run, and have their task dropped by
// `cancel`.
#[test]
fn timeouts_cancelled_while_queued_count_out_at_the_next_tick_boundary() -> TestResult {
    let (timer, clock) = manual_timer(ms(10), 8);
    let (ran, dropped) = (counter(), counter());
    let old = timer.new_timeout(ms(25), tracked(&ran, &dropped))?;
    let others: Vec<Timeout> = (0..20)
        .map(|_| timer.new_timeout(ms(25), counting(&ran)))
        .collect::<Result<_, _>>()?;
    let recent = timer.new_timeout(ms(25), tracked(&ran, &dropped))?;
    assert_eq!(timer.pending_timeouts(), 22);

    assert!(recent.cancel());
    assert!(old.cancel());
    assert_eq!(get(&dropped), 2, "cancel drops the task");
    assert_eq!(
        timer.pending_timeouts(),
        22,
        "counted until the worker processes the cancellations"
    );
    clock.advance(ms(10));
    assert_eq!(timer.pending_timeouts(), 20);

    clock.advance(ms(20));
    assert_eq!(get(&ran), 20, "only the uncancelled timeouts ran");
    assert!(others.iter().all(Timeout::is_expired));
    assert!(recent.is_cancelled() && old.is_cancelled());
    assert_eq!(timer.pending_timeouts(), 0);
    Ok(())
}

// HWT-P02 again, with the cancellations made by another thread while the
// producer keeps scheduling into the same ring: every cancelled timeout is
// counted out at the next tick boundary, never runs and has its task
// dropped; the others all run.
#[test]
fn timeouts_cancelled_by_another_thread_while_queued_are_counted_out_once() -> TestResult {
    const N: usize = 2_000;
    let (timer, clock) = manual_timer(ms(10), 8);
    let (ran, dropped) = (counter(), counter());
    let (tx, rx) = mpsc::channel::<Timeout>();
    let canceller = thread::spawn(move || {
        let mut cancelled = 0;
        for (i, t) in rx.into_iter().enumerate() {
            if i % 2 == 0 && t.cancel() {
                cancelled += 1;
            }
        }
        cancelled
    });
    for _ in 0..N {
        let t = timer.new_timeout(secs(60), tracked(&ran, &dropped))?;
        tx.send(t)?;
    }
    drop(tx);
    let cancelled = canceller.join().map_err(|_| "the canceller panicked")?;
    assert_eq!(cancelled, N / 2);
    assert_eq!(get(&dropped), N / 2, "cancel drops the task");
    assert_eq!(
        timer.pending_timeouts(),
        N,
        "counted until the next tick boundary"
    );

    clock.advance(ms(10));
    assert_eq!(timer.pending_timeouts(), N / 2);
    clock.advance(secs(61));
    assert_eq!(get(&ran), N / 2);
    assert_eq!(get(&dropped), N);
    assert_eq!(timer.pending_timeouts(), 0);
    Ok(())
}

// HWT-H02 / HWT-H03: cancel() succeeds once; it fails after expiry; a timeout
// is never both expired and cancelled.
#[test]
fn cancel_succeeds_once_and_never_after_expiry() -> TestResult {
    let (timer, clock) = manual_timer(ms(10), 8);
    let a = timer.new_timeout(ms(5), |_| {})?;
    let b = timer.new_timeout(ms(5), |_| {})?;
    assert!(!a.is_cancelled() && !a.is_expired());

    assert!(b.cancel());
    assert!(!b.cancel());
    assert!(!b.clone().cancel(), "a clone is the same timeout");
    clock.advance(ms(10));

    assert!(a.is_expired() && !a.is_cancelled());
    assert!(!a.cancel());
    assert!(a.is_expired() && !a.is_cancelled());
    assert!(b.is_cancelled() && !b.is_expired());
    Ok(())
}

// HWT-H06 (closest equivalent): a timeout's Debug output shows its deadline
// and its state.
#[test]
fn timeout_debug_shows_its_deadline_and_state() -> TestResult {
    let (timer, clock) = manual_timer(ms(10), 8);
    let a = timer.new_timeout(ms(5), |_| {})?;
    let b = timer.new_timeout(ms(7), |_| {})?;
    assert!(format!("{a:?}").contains("pending"), "{a:?}");
    assert!(format!("{a:?}").contains(&format!("{:?}", ms(5))), "{a:?}");
    b.cancel();
    clock.advance(ms(10));
    assert!(format!("{a:?}").contains("expired"), "{a:?}");
    assert!(format!("{b:?}").contains("cancelled"), "{b:?}");
    Ok(())
}

/// An executor that batches jobs and records, at each end of tick, how many
/// it had collected.
#[derive(Default, Clone)]
struct Batching {
    held: Arc<Mutex<Vec<Job>>>,
    batches: Arc<Mutex<Vec<usize>>>,
}

impl Executor for Batching {
    fn execute(&self, job: Job) -> Result<(), Job> {
        self.held.lock().unwrap().push(job);
        Ok(())
    }

    fn end_of_tick(&self) {
        let jobs = std::mem::take(&mut *self.held.lock().unwrap());
        self.batches.lock().unwrap().push(jobs.len());
        for job in jobs {
            job.run();
        }
    }
}

// An extension (no Netty counterpart): an executor learns where each tick's
// jobs end, once per tick that handed any over, so it can run a tick's
// timeouts as one batch.
#[test]
fn an_executor_is_told_once_per_tick_after_the_last_job_of_that_tick() -> TestResult {
    let clock = ManualClock::new();
    let exec = Batching::default();
    let timer = HashedWheelTimer::builder()
        .tick_duration(ms(10))
        .clock(clock.clone())
        .executor(exec.clone())
        .build()?;
    let ran = counter();
    for delay in [1, 2, 9, 5, 25, 21] {
        let ran = ran.clone();
        timer.new_timeout(ms(delay), move |_| {
            ran.fetch_add(1, Ordering::SeqCst);
        })?;
    }
    clock.advance(ms(10));
    assert_eq!(*exec.batches.lock().unwrap(), vec![4]);
    // A tick with nothing due hands nothing over and is not announced.
    clock.advance(ms(10));
    assert_eq!(*exec.batches.lock().unwrap(), vec![4]);
    clock.advance(ms(10));
    assert_eq!(*exec.batches.lock().unwrap(), vec![4, 2]);
    assert_eq!(get(&ran), 6);
    Ok(())
}

// Not in SPEC: `tick_lag` reports how late the worker processed its latest
// tick (the `redwheel_wheel_tick_lag_seconds` gauge reads it).
#[test]
fn tick_lag_is_how_late_the_latest_tick_was_processed() -> TestResult {
    let (timer, clock) = manual_timer(ms(1), 512);
    assert_eq!(timer.tick_lag(), Duration::ZERO, "no tick processed yet");
    let ran = counter();
    timer.new_timeout(ms(5), counting(&ran))?;
    // On time: tick 5 (ending at 6 ms) is processed when it ends.
    clock.advance(ms(6));
    assert_eq!(get(&ran), 1);
    assert_eq!(timer.tick_lag(), Duration::ZERO);
    // The clock jumps 20 ms past the end of the tick of the next timeout
    // (due at 10 ms, in tick 10, ending at 11 ms): processed that late.
    timer.new_timeout(ms(4), counting(&ran))?;
    clock.advance(ms(25));
    assert_eq!(get(&ran), 2);
    assert_eq!(timer.tick_lag(), ms(20));
    Ok(())
}

// HWT-W10 (1) at the source, on the real clock: a deadline is never earlier
// than the timer's clock read before `new_timeout` plus the delay (so no
// deadline is computed early, whatever the time-stamp counter does: the
// deadline reads `Instant` itself). Compares clock readings only.
#[test]
fn a_deadline_on_the_system_clock_is_never_before_the_clock_read_before_the_call() -> TestResult {
    let timer = HashedWheelTimer::builder().tick_duration(ms(1)).build()?;
    let delay = Duration::from_secs(3600);
    for i in 0..20_000u32 {
        let before = timer.now();
        let t = timer.new_timeout(delay, |_| {})?;
        assert!(
            t.deadline() >= before + delay,
            "call {i}: deadline {:?} is before {:?} + {delay:?}",
            t.deadline(),
            before
        );
        t.cancel();
    }
    timer.stop()?;
    Ok(())
}

// HWT-W10 (1) for a tight loop (issue 32): there most timeouts leave their
// deadline to a reading taken after the call (a time mark of the thread's,
// or the worker's own when it claims them). Checked once the worker has
// taken every one in (a zero-delay timeout scheduled after them fired):
// each deadline is still no earlier than the clock read before its call
// plus the delay. Compares clock readings only (the 30 s wait for the
// zero-delay timeout is a hang guard, not a timing claim).
#[test]
fn deadlines_left_to_a_later_reading_in_a_tight_loop_are_never_early() -> TestResult {
    let timer = HashedWheelTimer::builder().tick_duration(ms(1)).build()?;
    let delay = Duration::from_secs(3600);
    let n = 20_000;
    let mut before = Vec::with_capacity(n);
    let mut handles = Vec::with_capacity(n);
    for _ in 0..n {
        before.push(timer.now());
        handles.push(timer.new_timeout(delay, |_| {})?);
    }
    let (tx, rx) = mpsc::channel();
    timer.new_timeout(Duration::ZERO, move |_| {
        let _ = tx.send(());
    })?;
    rx.recv_timeout(Duration::from_secs(30))?;
    for (i, (t, &b)) in handles.iter().zip(&before).enumerate() {
        assert!(
            t.deadline() >= b + delay,
            "timeout {i}: deadline {:?} is before {b:?} + {delay:?}",
            t.deadline()
        );
    }
    timer.stop()?;
    Ok(())
}

// Issue 32, the lateness tail: the worker on the system clock asks Linux
// for 1 ns of timer slack (the default 50 µs lets every timed wake-up at a
// tick end come up to 50 µs late). Read back from /proc for the worker's
// thread, found by its name.
#[cfg(target_os = "linux")]
#[test]
fn the_worker_on_the_system_clock_runs_with_one_nanosecond_of_timer_slack() -> TestResult {
    let timer = HashedWheelTimer::builder()
        .tick_duration(ms(1))
        .thread_name("slack-probe")
        .build()?;
    timer.start()?;
    let mut slack = None;
    for task in fs::read_dir("/proc/self/task")? {
        let task = task?;
        let comm = fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim() == "slack-probe" {
            let tid = task.file_name();
            let path = format!("/proc/{}/timerslack_ns", tid.to_string_lossy());
            slack = Some(fs::read_to_string(path)?.trim().parse::<u64>()?);
        }
    }
    assert_eq!(slack, Some(1), "the worker thread's timer slack");
    timer.stop()?;
    Ok(())
}
