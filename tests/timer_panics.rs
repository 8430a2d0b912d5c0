//! User code that panics on the timer's worker thread: an executor's
//! `execute`, its `end_of_tick`, and a task's `Drop` (when the worker drops
//! a task: a job the executor rejected, or the timeouts `stop()` cancels).
//! Each is caught and logged like a panicking task (HWT-X01): the worker
//! keeps going, `pending_timeouts()` stays right, `stop()` returns the
//! timeouts that never ran, and every task is run or dropped exactly once.
//!
//! Time goes through a [`ManualClock`]; nothing here sleeps.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use redwheel::timer::{Executor, HashedWheelTimer, Job, ManualClock, Timeout};

mod timer_common;
use timer_common::*;

fn timer_with(clock: &ManualClock, executor: impl Executor) -> HashedWheelTimer {
    HashedWheelTimer::builder()
        .tick_duration(ms(10))
        .ticks_per_wheel(8)
        .clock(clock.clone())
        .executor(executor)
        .build()
        .expect("valid timer arguments")
}

/// Counts its drop, then panics with `message`.
struct PanicOnDrop {
    drops: Counter,
    message: &'static str,
}

impl Drop for PanicOnDrop {
    fn drop(&mut self) {
        self.drops.fetch_add(1, Ordering::SeqCst);
        panic!("{}", self.message);
    }
}

/// A task that counts its runs, and whose drop counts and then panics.
fn panics_when_dropped(
    ran: &Counter,
    drops: &Counter,
    message: &'static str,
) -> impl FnOnce(&Timeout) + Send + 'static {
    let ran = ran.clone();
    let bomb = PanicOnDrop {
        drops: drops.clone(),
        message,
    };
    move |_| {
        ran.fetch_add(1, Ordering::SeqCst);
        // Defused: a task that ran drops what it captured without a panic.
        std::mem::forget(bomb);
    }
}

/// Panics instead of taking the first job; runs the others at once.
#[derive(Default)]
struct PanicsOnFirstJob {
    calls: AtomicUsize,
}

impl Executor for PanicsOnFirstJob {
    fn execute(&self, job: Job) -> Result<(), Job> {
        if self.calls.fetch_add(1, Ordering::SeqCst) == 0 {
            panic!("p01 the executor panicked in execute");
        }
        job.run();
        Ok(())
    }
}

#[test]
fn an_executor_that_panics_in_execute_does_not_stop_the_worker() -> TestResult {
    let log = global_log();
    let clock = ManualClock::new();
    let timer = timer_with(&clock, PanicsOnFirstJob::default());
    let (ran, dropped) = (counter(), counter());
    for _ in 0..3 {
        timer.new_timeout(ms(15), tracked(&ran, &dropped))?;
    }
    timer.new_timeout(ms(100), tracked(&ran, &dropped))?;

    // Tick 1 hands the three over: the first `execute` panics (its job,
    // dropped as the panic unwinds, drops its task), the next two run.
    clock.advance(ms(20));
    assert_eq!((get(&ran), get(&dropped)), (2, 3));
    assert_eq!(timer.pending_timeouts(), 1);
    assert_eq!(log.lines_with("p01 the executor panicked").len(), 1);

    // The worker goes on.
    timer.new_timeout(ms(5), tracked(&ran, &dropped))?;
    clock.advance(ms(10));
    assert_eq!((get(&ran), get(&dropped)), (3, 4));
    let never_ran = timer.stop()?;
    assert_eq!(never_ran.len(), 1, "the 100 ms timeout never ran");
    assert_eq!(timer.pending_timeouts(), 0);
    drop(never_ran);
    assert_eq!((get(&ran), get(&dropped)), (3, 5), "each task once");
    Ok(())
}

/// Collects a tick's jobs and runs them in `end_of_tick`, except that its
/// first `end_of_tick` panics (keeping the jobs for the next one).
#[derive(Default)]
struct PanicsAtFirstEndOfTick {
    batch: Mutex<Vec<Job>>,
    ends: AtomicUsize,
}

impl Executor for PanicsAtFirstEndOfTick {
    fn execute(&self, job: Job) -> Result<(), Job> {
        self.batch.lock().unwrap().push(job);
        Ok(())
    }

    fn end_of_tick(&self) {
        if self.ends.fetch_add(1, Ordering::SeqCst) == 0 {
            panic!("p02 the executor panicked in end_of_tick");
        }
        let jobs = std::mem::take(&mut *self.batch.lock().unwrap());
        for job in jobs {
            job.run();
        }
    }
}

#[test]
fn an_executor_that_panics_in_end_of_tick_does_not_stop_the_worker() -> TestResult {
    let log = global_log();
    let clock = ManualClock::new();
    let timer = timer_with(&clock, PanicsAtFirstEndOfTick::default());
    let (ran, dropped) = (counter(), counter());
    timer.new_timeout(ms(15), tracked(&ran, &dropped))?;
    timer.new_timeout(ms(15), tracked(&ran, &dropped))?;
    timer.new_timeout(ms(35), tracked(&ran, &dropped))?;
    timer.new_timeout(ms(500), tracked(&ran, &dropped))?;

    clock.advance(ms(20));
    assert_eq!(get(&ran), 0, "the batch is still with the executor");
    assert_eq!(timer.pending_timeouts(), 2, "two were handed over");
    assert_eq!(log.lines_with("p02 the executor panicked").len(), 1);

    // The next tick that hands a job over ends with the whole batch run.
    clock.advance(ms(20));
    assert_eq!((get(&ran), get(&dropped)), (3, 3));
    assert_eq!(timer.pending_timeouts(), 1);
    let never_ran = timer.stop()?;
    assert_eq!(never_ran.len(), 1);
    drop(never_ran);
    assert_eq!((get(&ran), get(&dropped)), (3, 4), "each task once");
    Ok(())
}

#[test]
fn a_rejected_job_whose_task_panics_when_dropped_does_not_stop_the_worker() -> TestResult {
    let log = global_log();
    let clock = ManualClock::new();
    let rejects = |job: Job| -> Result<(), Job> { Err(job) };
    struct Rejects<F>(F);
    impl<F: Fn(Job) -> Result<(), Job> + Send + Sync + 'static> Executor for Rejects<F> {
        fn execute(&self, job: Job) -> Result<(), Job> {
            (self.0)(job)
        }
    }
    let timer = timer_with(&clock, Rejects(rejects));
    let (ran, dropped, bombs) = (counter(), counter(), counter());
    timer.new_timeout(
        ms(15),
        panics_when_dropped(&ran, &bombs, "p03 a rejected task panicked in drop"),
    )?;
    timer.new_timeout(ms(15), tracked(&ran, &dropped))?;
    timer.new_timeout(ms(100), tracked(&ran, &dropped))?;

    clock.advance(ms(20));
    assert_eq!((get(&ran), get(&bombs), get(&dropped)), (0, 1, 1));
    assert_eq!(timer.pending_timeouts(), 1);
    assert_eq!(log.lines_with("p03 a rejected task panicked").len(), 1);
    let never_ran = timer.stop()?;
    assert_eq!(never_ran.len(), 1);
    drop(never_ran);
    assert_eq!((get(&ran), get(&bombs), get(&dropped)), (0, 1, 2));
    Ok(())
}

#[test]
fn a_task_that_panics_when_dropped_at_stop_does_not_lose_the_others() -> TestResult {
    let log = global_log();
    let (timer, clock) = manual_timer(ms(10), 8);
    let (ran, dropped, bombs) = (counter(), counter(), counter());
    timer.new_timeout(ms(1000), tracked(&ran, &dropped))?;
    timer.new_timeout(
        ms(1000),
        panics_when_dropped(&ran, &bombs, "p04 a task panicked in drop at stop"),
    )?;
    timer.new_timeout(ms(2000), tracked(&ran, &dropped))?;
    clock.advance(ms(10)); // all three in the wheel
    timer.new_timeout(ms(3000), tracked(&ran, &dropped))?; // and one in a ring

    let never_ran = timer.stop()?;
    assert_eq!(
        never_ran.len(),
        4,
        "stop() returns every timeout that never ran"
    );
    assert!(never_ran.iter().all(Timeout::is_cancelled));
    assert_eq!(timer.pending_timeouts(), 0);
    assert_eq!((get(&ran), get(&bombs), get(&dropped)), (0, 1, 3));
    assert_eq!(log.lines_with("p04 a task panicked in drop").len(), 1);
    Ok(())
}

#[test]
fn a_task_that_panics_when_dropped_with_the_last_handle_does_not_lose_the_others() -> TestResult {
    let (timer, clock) = manual_timer(ms(10), 8);
    let (ran, dropped, bombs) = (counter(), counter(), counter());
    // The panicking task sits in the bucket the worker empties first (0),
    // the others in later ones (1 to 7), so that none is dropped before it.
    timer.new_timeout(
        ms(2000),
        panics_when_dropped(
            &ran,
            &bombs,
            "p05 a task panicked in drop at the last handle",
        ),
    )?;
    for bucket in 1..8 {
        timer.new_timeout(ms(2000 + 10 * bucket), tracked(&ran, &dropped))?;
    }
    clock.advance(ms(10));
    // Dropping the last handle stops the worker, which drops the tasks.
    drop(timer);
    assert_eq!((get(&ran), get(&bombs), get(&dropped)), (0, 1, 7));
    Ok(())
}
