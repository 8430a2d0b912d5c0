//! Drop-counting tests: every task handed to the timer is either run or
//! dropped without running, and what it captured is dropped exactly once,
//! whatever happens to its timeout: it fires, is cancelled (before or after
//! reaching its bucket, from a task or from another thread), is scheduled by
//! a task, is still pending at `stop()`, or is refused by a stopped timer.

use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread;
use std::time::Duration;

use redwheel::timer::{HashedWheelTimer, ManualClock, Timeout, TimerError};

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Per task: how often it ran and how often what it captured was dropped.
struct Ledger {
    runs: Vec<AtomicU8>,
    drops: Vec<AtomicU8>,
    created: AtomicUsize,
}

impl Ledger {
    fn new(capacity: usize) -> Arc<Ledger> {
        Arc::new(Ledger {
            runs: (0..capacity).map(|_| AtomicU8::new(0)).collect(),
            drops: (0..capacity).map(|_| AtomicU8::new(0)).collect(),
            created: AtomicUsize::new(0),
        })
    }

    /// A task with a fresh id: it records its run, then does `body`. What it
    /// captures records its drop.
    fn task<F>(self: &Arc<Self>, body: F) -> (usize, impl FnOnce(&Timeout) + Send + 'static)
    where
        F: FnOnce(&Timeout) + Send + 'static,
    {
        let id = self.created.fetch_add(1, Ordering::SeqCst);
        assert!(id < self.runs.len(), "ledger too small");
        let tracker = Tracker {
            id,
            ledger: Arc::clone(self),
        };
        let task = move |t: &Timeout| {
            tracker.ledger.runs[tracker.id].fetch_add(1, Ordering::SeqCst);
            body(t);
            drop(tracker);
        };
        (id, task)
    }

    fn created(&self) -> usize {
        self.created.load(Ordering::SeqCst)
    }

    fn runs(&self, id: usize) -> u8 {
        self.runs[id].load(Ordering::SeqCst)
    }

    fn drops(&self, id: usize) -> u8 {
        self.drops[id].load(Ordering::SeqCst)
    }

    /// Every task ran at most once and its captures were dropped exactly
    /// once; runs plus drops-without-run account for every task.
    fn assert_each_task_run_or_dropped_once(&self) {
        let created = self.created();
        let (mut ran, mut dropped_unrun) = (0, 0);
        for id in 0..created {
            let (runs, drops) = (self.runs(id), self.drops(id));
            assert!(runs <= 1, "task {id} ran {runs} times");
            assert_eq!(
                drops, 1,
                "task {id} (ran {runs} times) dropped {drops} times"
            );
            if runs == 1 {
                ran += 1;
            } else {
                dropped_unrun += 1;
            }
        }
        assert_eq!(ran + dropped_unrun, created);
        for id in created..self.runs.len() {
            assert_eq!(
                (self.runs(id), self.drops(id)),
                (0, 0),
                "unallocated id {id} used"
            );
        }
    }
}

/// Records the drop of its task's captures.
struct Tracker {
    id: usize,
    ledger: Arc<Ledger>,
}

impl Drop for Tracker {
    fn drop(&mut self) {
        self.ledger.drops[self.id].fetch_add(1, Ordering::SeqCst);
    }
}

/// A small deterministic generator (xorshift64*), so a failure replays.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
    }
}

/// Schedules one link of a chain re-armed from inside tasks. A link with
/// `Some(n)` schedules, when it runs, a 30 ms link with `Some(n - 1)`, and
/// after `Some(0)` a final 10 s link (`None`), still pending at `stop()`.
fn schedule_chain(
    timer: &HashedWheelTimer,
    ledger: &Arc<Ledger>,
    delay: Duration,
    hops: Option<u32>,
    chain_ids: &Arc<Mutex<Vec<usize>>>,
) -> Result<Timeout, TimerError> {
    let (next_timer, next_ledger, next_ids) = (timer.clone(), ledger.clone(), chain_ids.clone());
    let (id, task) = ledger.task(move |_| {
        let next = match hops {
            None => return,
            Some(0) => (ms(10_000), None),
            Some(n) => (ms(30), Some(n - 1)),
        };
        schedule_chain(&next_timer, &next_ledger, next.0, next.1, &next_ids)
            .expect("re-arming from a task on a running timer");
    });
    chain_ids.lock().unwrap().push(id);
    timer.new_timeout(delay, task)
}

// Deterministic mix on a manual clock: timeouts that fire, that are cancelled
// before transfer, in their bucket, or by a task, chains re-armed from tasks,
// and long ones pending at stop(); then refused ones after stop().
#[test]
fn every_task_is_run_or_dropped_exactly_once() -> TestResult {
    let clock = ManualClock::new();
    let timer = HashedWheelTimer::builder()
        .tick_duration(ms(10))
        .ticks_per_wheel(16)
        .clock(clock.clone())
        .build()?;
    let ledger = Ledger::new(20_000);
    let chain_ids = Arc::new(Mutex::new(Vec::new()));
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);

    let mut must_fire = Vec::new();
    let mut cancel_now = Vec::new();
    let mut cancel_later = Vec::new();
    let mut long = Vec::new();
    let mut cancelled_by_task = Vec::new();
    for _ in 0..3_000 {
        match rng.below(6) {
            0 => {
                let (id, task) = ledger.task(|_| {});
                timer.new_timeout(ms(rng.below(500)), task)?;
                must_fire.push(id);
            }
            1 => {
                let (id, task) = ledger.task(|_| {});
                let t = timer.new_timeout(ms(rng.below(500)), task)?;
                assert!(t.cancel());
                cancel_now.push(id);
            }
            2 => {
                let (id, task) = ledger.task(|_| {});
                let t = timer.new_timeout(ms(200 + rng.below(300)), task)?;
                cancel_later.push((id, t));
            }
            3 => {
                let (id, task) = ledger.task(|_| {});
                let t = timer.new_timeout(ms(10_000 + rng.below(10_000)), task)?;
                long.push((id, t));
            }
            4 => {
                let hops = Some(rng.below(4) as u32);
                schedule_chain(&timer, &ledger, ms(rng.below(300)), hops, &chain_ids)?;
            }
            _ => {
                // A task that cancels a timeout due in a later tick.
                let delay = rng.below(400);
                let (victim_id, victim_task) = ledger.task(|_| {});
                let victim = timer.new_timeout(ms(delay + 10 + rng.below(100)), victim_task)?;
                let (killer_id, killer_task) = ledger.task(move |_| {
                    victim.cancel();
                });
                timer.new_timeout(ms(delay), killer_task)?;
                cancelled_by_task.push(victim_id);
                must_fire.push(killer_id);
            }
        }
    }

    for step in 1..=60 {
        if step == 10 {
            for (_, t) in &cancel_later {
                assert!(t.cancel(), "cancelled before its deadline");
            }
        }
        clock.advance(ms(10));
    }

    let never_ran = timer.stop()?;
    for t in &never_ran {
        assert!(t.is_cancelled() && !t.is_expired());
    }
    assert_eq!(timer.pending_timeouts(), 0);
    for _ in 0..50 {
        let (_, task) = ledger.task(|_| {});
        assert!(matches!(
            timer.new_timeout(ms(1), task),
            Err(TimerError::Stopped)
        ));
    }

    ledger.assert_each_task_run_or_dropped_once();
    for &id in &must_fire {
        assert_eq!(ledger.runs(id), 1, "task {id} should have fired");
    }
    for &id in cancel_now.iter().chain(&cancelled_by_task) {
        assert_eq!(ledger.runs(id), 0, "cancelled task {id} ran");
    }
    for (id, t) in &cancel_later {
        assert_eq!(ledger.runs(*id), 0, "cancelled task {id} ran");
        assert!(t.is_cancelled());
    }
    for (id, t) in &long {
        assert_eq!(ledger.runs(*id), 0);
        assert!(
            never_ran.iter().any(|n| n.ptr_eq(t)),
            "long timeout {id} not returned"
        );
    }
    let chain_ids = chain_ids.lock().unwrap();
    let chain_pending = chain_ids.iter().filter(|&&id| ledger.runs(id) == 0).count();
    let chain_ran = chain_ids.len() - chain_pending;
    assert!(
        chain_ran > chain_pending,
        "re-armed links should have fired"
    );
    assert!(
        chain_pending > 0,
        "the last link of each chain is pending at stop()"
    );
    assert_eq!(never_ran.len(), long.len() + chain_pending);
    Ok(())
}

// The same accounting under real concurrency: four producers schedule and
// cancel (some at once, some racing with expiry) on a 1 ms real-clock timer
// whose tasks re-arm, and the timer is stopped while work is still pending.
// No timing is asserted: only that each timeout ends expired xor cancelled,
// matching whether its task ran, and each task is run or dropped once.
#[test]
fn every_task_is_run_or_dropped_exactly_once_under_concurrency() -> TestResult {
    const PRODUCERS: u64 = 4;
    const PER_PRODUCER: u64 = 1_500;
    let timer = HashedWheelTimer::builder()
        .tick_duration(ms(1))
        .ticks_per_wheel(8)
        .build()?;
    let ledger = Ledger::new(40_000);
    let cancelled_by_user = Arc::new(AtomicUsize::new(0));
    let rearmed: Arc<Mutex<Vec<(usize, Timeout)>>> = Arc::default();
    // The 1,000th task to run says so: stop() comes after that, while
    // re-armed and long timeouts are still pending.
    let (enough_tx, enough_rx) = mpsc::channel::<()>();
    let fired = Arc::new((AtomicUsize::new(0), Mutex::new(Some(enough_tx))));

    let producers: Vec<_> = (0..PRODUCERS)
        .map(|p| {
            let (timer, ledger, cancelled_by_user, rearmed, fired) = (
                timer.clone(),
                ledger.clone(),
                cancelled_by_user.clone(),
                rearmed.clone(),
                fired.clone(),
            );
            thread::spawn(move || -> Result<Vec<(usize, Timeout)>, TimerError> {
                let mut rng = Rng(0xA076_1D64_78BD_642F ^ (p + 1));
                let mut handles: Vec<(usize, Timeout)> = Vec::new();
                for _ in 0..PER_PRODUCER {
                    let rearm = rng.below(4) == 0;
                    let (inner_timer, inner_ledger, inner_rearmed, fired) = (
                        timer.clone(),
                        ledger.clone(),
                        rearmed.clone(),
                        fired.clone(),
                    );
                    let (id, task) = ledger.task(move |_| {
                        if fired.0.fetch_add(1, Ordering::SeqCst) + 1 == 1_000
                            && let Some(tx) = fired.1.lock().unwrap().take()
                        {
                            let _ = tx.send(());
                        }
                        if rearm {
                            let (next_id, next) = inner_ledger.task(|_| {});
                            // Fails with Stopped once stop() has begun; the
                            // task is then dropped, which the ledger sees.
                            if let Ok(t) = inner_timer.new_timeout(ms(2), next) {
                                inner_rearmed.lock().unwrap().push((next_id, t));
                            }
                        }
                    });
                    let delay = if rng.below(10) == 0 {
                        ms(10_000)
                    } else {
                        ms(rng.below(20))
                    };
                    let t = timer.new_timeout(delay, task)?;
                    // Cancel this one at once, or an earlier one that may be
                    // expiring right now, or none.
                    let to_cancel = match rng.below(4) {
                        0 => Some(&t),
                        1 if !handles.is_empty() => {
                            Some(&handles[rng.below(handles.len() as u64) as usize].1)
                        }
                        _ => None,
                    };
                    if to_cancel.is_some_and(Timeout::cancel) {
                        cancelled_by_user.fetch_add(1, Ordering::SeqCst);
                    }
                    handles.push((id, t));
                    if rng.below(100) == 0 {
                        thread::yield_now();
                    }
                }
                Ok(handles)
            })
        })
        .collect();
    let mut handles = Vec::new();
    for producer in producers {
        handles.extend(producer.join().expect("a producer panicked")?);
    }
    enough_rx.recv_timeout(Duration::from_secs(10))?;

    let never_ran = timer.stop()?;
    assert_eq!(timer.pending_timeouts(), 0);
    for t in &never_ran {
        assert!(t.is_cancelled());
    }
    handles.append(&mut rearmed.lock().unwrap());
    let mut cancelled = 0;
    for (id, t) in &handles {
        let ran = ledger.runs(*id) == 1;
        assert_ne!(
            t.is_expired(),
            t.is_cancelled(),
            "{t:?} is not final after stop()"
        );
        assert_eq!(t.is_expired(), ran, "task {id}: {t:?} but ran = {ran}");
        cancelled += usize::from(t.is_cancelled());
    }
    assert_eq!(
        never_ran.len(),
        cancelled - cancelled_by_user.load(Ordering::SeqCst),
        "stop() returned other than the timeouts it cancelled"
    );
    let ran = handles.iter().filter(|(_, t)| t.is_expired()).count();
    assert!(ran >= 1_000, "only {ran} ran");
    assert!(cancelled_by_user.load(Ordering::SeqCst) > 0);
    assert!(
        !never_ran.is_empty(),
        "the 10 s timeouts are pending at stop()"
    );
    drop(timer);
    ledger.assert_each_task_run_or_dropped_once();
    Ok(())
}
