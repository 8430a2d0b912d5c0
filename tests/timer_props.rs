//! Property tests of the hashed wheel timer against a reference model, and
//! explicit tests for the edge cases that shipped as bugs in other timers
//! (shared/USERS.md items 9, 12 and 14).
//!
//! The model and the replay harness live in `fuzz/src/timer_model.rs`,
//! shared with the `timer_ops` fuzz target; its header states the
//! invariants checked after every operation. Everything runs on a
//! [`ManualClock`]: no sleeps, no wall-clock assertions.
//!
//! Each property runs 10,000 cases by default; set `PROPTEST_CASES` to
//! change that. The next operation may race the worker's handling of a
//! wake-up (the stricter mode); `REDWHEEL_MODEL_SETTLE=1` makes the harness
//! settle the clock after every call that may wake the worker instead.

#[allow(dead_code)]
#[path = "../fuzz/src/timer_model.rs"]
mod timer_model;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread;
use std::time::Duration;

use proptest::prelude::*;
use redwheel::timer::{Clock, HashedWheelTimer, ManualClock, TRANSFER_CAP, Timeout, TimerError};

use timer_model::{Config, Delay, Harness, MAX_STEP_TICKS, Op, Step, Task};

// ---------------------------------------------------------------------------
// Strategies
// ---------------------------------------------------------------------------

/// Cases per property: `PROPTEST_CASES` if set, else 10,000.
fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10_000)
}

fn proptest_config() -> ProptestConfig {
    ProptestConfig {
        // Failures are kept as explicit regression tests below, not in a
        // proptest-regressions file.
        failure_persistence: None,
        ..ProptestConfig::with_cases(cases())
    }
}

fn config() -> impl Strategy<Value = Config> {
    let tick_ns = prop_oneof![
        Just(1_000_000u64),
        Just(10_000_000u64),
        1_000_000u64..=10_000_000,
    ];
    let ticks_per_wheel = prop_oneof![1 => 1usize..8, 4 => 8usize..=64];
    (tick_ns, ticks_per_wheel).prop_map(|(tick_ns, ticks_per_wheel)| Config {
        tick_ns,
        ticks_per_wheel,
    })
}

/// Delays with the edges weighted up: zero, sub-tick, exact wheel spans and
/// one nanosecond either side, years, saturating and `Duration::MAX`.
fn delay() -> impl Strategy<Value = Delay> {
    prop_oneof![
        3 => Just(Delay::Zero),
        2 => any::<u64>().prop_map(Delay::SubTick),
        8 => (0u32..160, any::<u64>()).prop_map(|(ticks, extra)| Delay::Ticks { ticks, extra }),
        4 => (0u32..5, -1i64..=1).prop_map(|(turns, offset)| Delay::Spans { turns, offset }),
        1 => (0u32..200).prop_map(Delay::Years),
        1 => prop_oneof![Just(u64::MAX), Just(u64::MAX - 1), (u64::MAX / 2)..u64::MAX]
            .prop_map(Delay::Nanos),
        1 => Just(Delay::Max),
    ]
}

/// Delays on the wheel's edges only.
fn edge_delay() -> impl Strategy<Value = Delay> {
    prop_oneof![
        Just(Delay::Zero),
        any::<u64>().prop_map(Delay::SubTick),
        (0u32..5, -1i64..=1).prop_map(|(turns, offset)| Delay::Spans { turns, offset }),
        Just(Delay::Max),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => any::<u64>().prop_map(Step::SubTick),
        3 => (0u8..3).prop_map(Step::ToTickEnd),
        5 => (0u32..=16, any::<u64>()).prop_map(|(ticks, extra)| Step::Ticks { ticks, extra }),
        1 => (0u32..=MAX_STEP_TICKS as u32, any::<u64>())
            .prop_map(|(ticks, extra)| Step::Ticks { ticks, extra }),
        2 => (0u32..4).prop_map(Step::Turns),
        1 => (any::<u32>(), any::<u8>())
            .prop_map(|(days, overshoot)| Step::Far { days, overshoot }),
    ]
}

fn task() -> impl Strategy<Value = Task> {
    prop_oneof![
        6 => Just(Task::Record),
        3 => (delay(), any::<u8>()).prop_map(|(delay, times)| Task::Rearm { delay, times }),
        3 => any::<usize>().prop_map(|pick| Task::Cancel { pick }),
        1 => Just(Task::CancelSelf),
        1 => Just(Task::Panic),
        1 => Just(Task::CallStop),
    ]
}

/// Every operation except `stop()` (the harness stops at the end).
fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        7 => (delay(), task()).prop_map(|(delay, task)| Op::Schedule { delay, task }),
        3 => any::<usize>().prop_map(|pick| Op::Cancel { pick }),
        7 => step().prop_map(Op::Advance),
        1 => Just(Op::Settle),
        1 => Just(Op::Start),
    ]
}

/// Operations with a `stop()` now and then.
fn op_with_stop() -> impl Strategy<Value = Op> {
    prop_oneof![19 => op(), 1 => Just(Op::Stop)]
}

/// Cancellation-heavy operations with short steps, so that cancels land
/// on every side of a tick boundary.
fn cancel_heavy_op() -> impl Strategy<Value = Op> {
    let task = prop_oneof![
        1 => Just(Task::Record),
        2 => any::<usize>().prop_map(|pick| Task::Cancel { pick }),
    ];
    let delay = (0u32..24, any::<u64>()).prop_map(|(ticks, extra)| Delay::Ticks { ticks, extra });
    let step = prop_oneof![
        any::<u64>().prop_map(Step::SubTick),
        (0u8..3).prop_map(Step::ToTickEnd),
        (0u32..3, any::<u64>()).prop_map(|(ticks, extra)| Step::Ticks { ticks, extra }),
    ];
    prop_oneof![
        3 => (delay, task).prop_map(|(delay, task)| Op::Schedule { delay, task }),
        4 => any::<usize>().prop_map(|pick| Op::Cancel { pick }),
        4 => step.prop_map(Op::Advance),
    ]
}

/// Edge delays scheduled at every offset in a tick, and steps of whole
/// turns and to either side of tick ends.
fn wheel_edge_op() -> impl Strategy<Value = Op> {
    let step = prop_oneof![
        any::<u64>().prop_map(Step::SubTick),
        (0u8..3).prop_map(Step::ToTickEnd),
        (0u32..4).prop_map(Step::Turns),
    ];
    prop_oneof![
        2 => edge_delay().prop_map(|delay| Op::Schedule { delay, task: Task::Record }),
        1 => (edge_delay(), any::<u8>())
            .prop_map(|(d, times)| Op::Schedule {
                delay: d.clone(),
                task: Task::Rearm { delay: d, times },
            }),
        3 => step.prop_map(Op::Advance),
    ]
}

// ---------------------------------------------------------------------------
// Properties
// ---------------------------------------------------------------------------

proptest! {
    #![proptest_config(proptest_config())]

    /// Every invariant of the model (see `timer_model.rs`) after every step
    /// of a random mix of all operations, then at `stop()`.
    #[test]
    fn timer_matches_the_model_on_random_operations(
        cfg in config(),
        ops in prop::collection::vec(op(), 1..32),
    ) {
        Harness::run(cfg, &ops);
    }

    /// `stop()` in the middle returns exactly the timeouts neither fired nor
    /// cancelled (each cancelled), drops every task, and afterwards
    /// `new_timeout` fails, `cancel` returns false and nothing fires.
    #[test]
    fn stop_returns_exactly_the_unfired_uncancelled_timeouts_and_later_calls_fail(
        cfg in config(),
        ops in prop::collection::vec(op_with_stop(), 1..32),
    ) {
        Harness::run(cfg, &ops);
    }

    /// `pending_timeouts()` is exact at every step while timeouts are
    /// cancelled by the test thread and by tasks, on both sides of tick
    /// boundaries: a cancellation counts out at the next tick boundary.
    #[test]
    fn pending_count_is_exact_under_cancellation(
        cfg in config(),
        ops in prop::collection::vec(cancel_heavy_op(), 1..32),
    ) {
        Harness::run(cfg, &ops);
    }

    /// Zero, sub-tick, exact-wheel-span (±1 ns) and never delays, scheduled
    /// at random offsets in a tick and re-armed from tasks, fire at the end
    /// of the tick containing their deadline: not a turn early, not a turn
    /// late.
    #[test]
    fn wheel_span_edge_delays_fire_at_the_end_of_their_tick(
        cfg in config(),
        ops in prop::collection::vec(wheel_edge_op(), 1..32),
    ) {
        Harness::run(cfg, &ops);
    }
}

// ---------------------------------------------------------------------------
// Explicit edge cases (USERS.md 9, 12, 14)
// ---------------------------------------------------------------------------

const TICK: Duration = Duration::from_millis(10);

fn timer_on(clock: &ManualClock, tick: Duration, ticks_per_wheel: usize) -> HashedWheelTimer {
    HashedWheelTimer::builder()
        .tick_duration(tick)
        .ticks_per_wheel(ticks_per_wheel)
        .clock(clock.clone())
        .build()
        .expect("valid timer")
}

/// Records `(name, clock time)` of each task that runs.
#[derive(Clone, Default)]
struct Fired(Arc<Mutex<Vec<(usize, Duration)>>>);

impl Fired {
    fn task(&self, clock: &ManualClock, name: usize) -> impl FnOnce(&Timeout) + Send + 'static {
        let log = self.0.clone();
        let clock = clock.clone();
        move |_: &Timeout| log.lock().unwrap().push((name, clock.now()))
    }

    fn all(&self) -> Vec<(usize, Duration)> {
        self.0.lock().unwrap().clone()
    }

    fn names(&self) -> Vec<usize> {
        self.all().into_iter().map(|(n, _)| n).collect()
    }
}

#[test]
fn zero_delay_fires_at_the_end_of_the_current_tick_not_before() {
    let clock = ManualClock::new();
    let timer = timer_on(&clock, TICK, 8);
    let fired = Fired::default();
    timer.start().unwrap(); // the worker starts at 0: ticks are [0, 10 ms), ...
    clock.advance(Duration::from_millis(3));
    let t = timer
        .new_timeout(Duration::ZERO, fired.task(&clock, 0))
        .unwrap();
    assert_eq!(t.deadline(), Duration::from_millis(3));
    clock.settle();
    assert!(
        fired.all().is_empty(),
        "a zero delay waits for its tick to end"
    );
    clock.advance(Duration::from_millis(7) - Duration::from_nanos(1));
    assert!(fired.all().is_empty(), "1 ns before the tick ends");
    assert_eq!(timer.pending_timeouts(), 1);
    clock.advance(Duration::from_nanos(1));
    assert_eq!(fired.all(), vec![(0, Duration::from_millis(10))]);
    assert_eq!(timer.pending_timeouts(), 0);
    assert!(t.is_expired());
}

#[test]
fn delays_that_are_exact_multiples_of_the_wheel_span_fire_whole_turns_later() {
    // akka#1016: a delay of exactly k wheel turns lands in the bucket being
    // visited; it must wait k turns, neither fire at once nor a turn late.
    let clock = ManualClock::new();
    let timer = timer_on(&clock, TICK, 8);
    let span = TICK * 8;
    let fired = Fired::default();
    timer.start().unwrap();
    for k in 1..=3u32 {
        timer
            .new_timeout(span * k, fired.task(&clock, k as usize))
            .unwrap();
    }
    // Mid-tick too: created at 5 ms, due in tick 8k, fires at its end.
    clock.advance(Duration::from_millis(5));
    timer.new_timeout(span, fired.task(&clock, 10)).unwrap();
    for k in 1..=3u32 {
        // The bucket of tick 8k is visited at ticks 0, 8, ..., 8(k-1) first.
        let due_end = span * k + TICK;
        clock.advance(due_end - Duration::from_nanos(1) - clock.now());
        let before: Vec<usize> = fired.names();
        assert!(
            !before.contains(&(k as usize)),
            "turn {k}: fired early: {before:?}"
        );
        clock.advance(Duration::from_nanos(1));
        let after = fired.all();
        assert!(
            after.contains(&(k as usize, due_end)),
            "turn {k}: {after:?}"
        );
    }
    assert_eq!(
        fired.all(),
        vec![
            (1, span + TICK),
            (10, span + TICK),
            (2, span * 2 + TICK),
            (3, span * 3 + TICK)
        ]
    );
    assert_eq!(timer.pending_timeouts(), 0);
}

#[test]
fn duration_max_never_fires_and_can_be_cancelled() {
    // netty#7760: Long.MAX_VALUE fired at once.
    let clock = ManualClock::new();
    let timer = timer_on(&clock, TICK, 8);
    let fired = Fired::default();
    let max = timer
        .new_timeout(Duration::MAX, fired.task(&clock, 0))
        .unwrap();
    let beyond = timer
        .new_timeout(Duration::from_secs(u64::MAX / 2), fired.task(&clock, 1))
        .unwrap();
    let kept = timer
        .new_timeout(Duration::MAX, fired.task(&clock, 2))
        .unwrap();
    assert_eq!(max.deadline(), Duration::from_nanos(u64::MAX));
    assert_eq!(
        beyond.deadline(),
        Duration::from_nanos(u64::MAX),
        "saturates"
    );
    // One tick moves them into the wheel; from then on the worker sleeps
    // for good. (A jump straight away would have the worker process every
    // elapsed tick one by one: see the catch-up note in the harness.)
    clock.advance(TICK);
    for _ in 0..50 {
        clock.advance(Duration::from_secs(86_400 * 365));
    }
    assert!(fired.all().is_empty(), "fifty years on: {:?}", fired.all());
    assert_eq!(timer.pending_timeouts(), 3);
    assert!(max.cancel());
    assert!(beyond.cancel());
    assert!(!max.cancel(), "a second cancel returns false");
    clock.settle(); // the wake-up race: see the `..._wakes_the_worker_...` tests
    clock.advance(TICK);
    assert_eq!(timer.pending_timeouts(), 1);
    let never_ran = timer.stop().unwrap();
    assert_eq!(never_ran.len(), 1);
    assert!(never_ran[0].ptr_eq(&kept) && kept.is_cancelled());
    assert_eq!(timer.pending_timeouts(), 0);
    assert!(fired.all().is_empty());
}

#[test]
fn cancel_from_another_thread_while_the_task_runs_returns_false() {
    let clock = ManualClock::new();
    let timer = timer_on(&clock, TICK, 8);
    let (started_tx, started_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let finished = Arc::new(AtomicBool::new(false));
    let f = finished.clone();
    let t = timer
        .new_timeout(TICK, move |_: &Timeout| {
            started_tx.send(()).unwrap();
            release_rx.recv().unwrap();
            f.store(true, Ordering::SeqCst);
        })
        .unwrap();
    clock.settle(); // the wake-up race: see the `..._wakes_the_worker_...` tests
    // advance() returns only once the task is done: run it elsewhere.
    let c = clock.clone();
    let advancer = thread::spawn(move || c.advance(TICK * 2));
    started_rx.recv().unwrap();
    assert!(!t.cancel(), "the task is running: too late to cancel");
    assert!(t.is_expired() && !t.is_cancelled());
    assert!(!finished.load(Ordering::SeqCst));
    release_tx.send(()).unwrap();
    advancer.join().unwrap();
    assert!(finished.load(Ordering::SeqCst), "the task ran to its end");
    assert_eq!(timer.pending_timeouts(), 0);
    clock.advance(TICK);
    assert_eq!(
        timer.pending_timeouts(),
        0,
        "the failed cancel counted nothing out"
    );
    assert!(timer.stop().unwrap().is_empty());
}

#[test]
fn a_task_cancelling_itself_gets_false() {
    let clock = ManualClock::new();
    let timer = timer_on(&clock, TICK, 8);
    let handle: Arc<Mutex<Option<Timeout>>> = Arc::default();
    let (tx, rx) = mpsc::channel();
    let h = handle.clone();
    let t = timer
        .new_timeout(Duration::ZERO, move |me: &Timeout| {
            let stored = h.lock().unwrap().clone().unwrap();
            tx.send((
                me.cancel(),
                stored.cancel(),
                me.is_expired(),
                me.ptr_eq(&stored),
            ))
            .unwrap();
        })
        .unwrap();
    *handle.lock().unwrap() = Some(t.clone());
    clock.settle(); // the wake-up race: see the `..._wakes_the_worker_...` tests
    clock.advance(TICK);
    assert_eq!(rx.try_recv().unwrap(), (false, false, true, true));
    assert!(t.is_expired() && !t.is_cancelled());
    assert_eq!(timer.pending_timeouts(), 0);
}

#[test]
fn a_task_cancelling_a_later_timeout_of_its_own_tick_stops_it() {
    // Netty HWT-W12: same bucket, FIFO; the cancelled sibling never runs.
    let clock = ManualClock::new();
    let timer = timer_on(&clock, TICK, 8);
    let fired = Fired::default();
    let victim: Arc<Mutex<Option<Timeout>>> = Arc::default();
    let (tx, rx) = mpsc::channel();
    let v = victim.clone();
    let log = fired.clone();
    let c = clock.clone();
    timer
        .new_timeout(TICK, move |_: &Timeout| {
            log.0.lock().unwrap().push((0, c.now()));
            tx.send(v.lock().unwrap().as_ref().unwrap().cancel())
                .unwrap();
        })
        .unwrap();
    let b = timer.new_timeout(TICK, fired.task(&clock, 1)).unwrap();
    *victim.lock().unwrap() = Some(b.clone());
    clock.settle(); // the wake-up race: see the `..._wakes_the_worker_...` tests
    clock.advance(TICK * 2);
    assert!(rx.try_recv().unwrap(), "the sibling had not run yet");
    assert_eq!(fired.names(), vec![0]);
    assert!(b.is_cancelled());
    assert_eq!(timer.pending_timeouts(), 1, "counted out at the next tick");
    clock.advance(TICK);
    assert_eq!(timer.pending_timeouts(), 0);
    assert_eq!(fired.names(), vec![0]);
}

#[test]
fn a_task_re_arming_itself_fires_once_per_period_and_never_in_its_own_tick() {
    // Netty HWT-N06 / testTimerOverflowWheelLength: a timeout created from a
    // running task reaches the wheel at the next tick at the earliest.
    fn arm(
        timer: &HashedWheelTimer,
        clock: &ManualClock,
        log: &Fired,
        delay: Duration,
        left: usize,
    ) {
        let (t, c, l) = (timer.clone(), clock.clone(), log.clone());
        timer
            .new_timeout(delay, move |_: &Timeout| {
                l.0.lock().unwrap().push((left, c.now()));
                if left > 0 {
                    arm(&t, &c, &l, delay, left - 1);
                }
            })
            .unwrap();
    }
    let clock = ManualClock::new();
    let timer = timer_on(&clock, TICK, 4);
    // Each task runs at a tick end B, so a re-armed delay d has its
    // deadline at B + d and fires at the end of the tick containing it.
    let periods = [
        (Duration::ZERO, TICK),
        (TICK * 4, TICK * 5), // one wheel turn: the bucket it is in is the current one
        (Duration::from_millis(25), TICK * 3),
    ];
    for (delay, expected_gap) in periods {
        let log = Fired::default();
        let t0 = clock.now();
        arm(&timer, &clock, &log, delay, 5);
        clock.settle(); // the wake-up race: see the `..._wakes_the_worker_...` tests
        // One tick at a time, so each fire time is exact.
        while log.all().len() < 6 {
            clock.advance(TICK);
            assert!(
                clock.now() - t0 < TICK * 100,
                "delay {delay:?}: {:?}",
                log.all()
            );
        }
        let times: Vec<Duration> = log.all().into_iter().map(|(_, at)| at).collect();
        for w in times.windows(2) {
            assert_eq!(
                w[1] - w[0],
                expected_gap,
                "delay {delay:?}: fire times {times:?}"
            );
        }
        assert_eq!(timer.pending_timeouts(), 0);
    }
    // A zero-delay re-arm never runs twice in one advance, however long.
    let log = Fired::default();
    arm(&timer, &clock, &log, Duration::ZERO, 1000);
    clock.settle(); // the wake-up race: see the `..._wakes_the_worker_...` tests
    clock.advance(TICK * 50);
    assert_eq!(log.all().len(), 1, "{:?}", log.all());
    assert_eq!(timer.stop().unwrap().len(), 1, "the next link of the chain");
}

#[test]
fn cancelled_timeouts_stay_counted_until_the_next_tick_boundary() {
    let clock = ManualClock::new();
    let timer = timer_on(&clock, TICK, 8);
    timer.start().unwrap();
    let a = timer.new_timeout(TICK * 5, |_: &Timeout| {}).unwrap();
    let b = timer.new_timeout(TICK * 50, |_: &Timeout| {}).unwrap();
    clock.advance(Duration::from_millis(14));
    assert!(a.cancel());
    assert!(b.cancel());
    clock.settle();
    assert_eq!(
        timer.pending_timeouts(),
        2,
        "cancellations wait for the tick to end"
    );
    clock.advance(Duration::from_millis(6) - Duration::from_nanos(1));
    assert_eq!(timer.pending_timeouts(), 2);
    clock.advance(Duration::from_nanos(1));
    assert_eq!(timer.pending_timeouts(), 0, "counted out at 20 ms");
    assert!(timer.stop().unwrap().is_empty());
}

/// Counts the drops of the value it is cloned into.
#[derive(Clone, Default)]
struct Drops(Arc<AtomicUsize>);

impl Drops {
    fn live_clones(&self) -> usize {
        Arc::strong_count(&self.0) - 1
    }
}

#[test]
fn a_timeout_that_wakes_the_worker_fires_at_the_end_of_its_own_tick() {
    // Found by the properties at b528c3c (fixed since by `woken_at`). The
    // worker sleeps with nothing to do; `new_timeout` unparks it. When the
    // clock moved on before the worker ran, the worker read the new time on
    // waking, skipped to the current tick (the wheel had nothing due) and
    // only then looked at the new timeout: due in tick 1, it fired at the
    // end of tick 5, not in the `advance` that ended tick 1. With a real
    // clock a wake-up lag across a tick boundary cost a whole extra tick.
    for round in 0..20 {
        let clock = ManualClock::new();
        let timer = timer_on(&clock, TICK, 8);
        timer.start().unwrap();
        clock.advance(TICK); // tick 0 processed; the worker sleeps for good
        let fired = Fired::default();
        timer
            .new_timeout(Duration::ZERO, fired.task(&clock, 0))
            .unwrap();
        clock.advance(TICK * 4); // tick 1 (due) ended at 20 ms
        assert_eq!(
            fired.all(),
            vec![(0, TICK * 5)],
            "round {round}: a zero-delay timeout made at 10 ms must fire by 20 ms"
        );
        assert_eq!(timer.pending_timeouts(), 0);
    }
}

#[test]
fn a_cancellation_that_wakes_the_worker_is_counted_out_at_the_next_tick_boundary() {
    // The same race for `cancel` (b528c3c): a worker dozing until a far
    // tick, unparked by the cancellation, woke after the clock moved,
    // skipped to the current tick and processed the cancellation only at
    // its end, so `pending_timeouts()` and the task outlived the boundary.
    for round in 0..20 {
        let clock = ManualClock::new();
        let timer = timer_on(&clock, TICK, 8);
        let drops = Drops::default();
        let d = drops.clone();
        let t = timer
            .new_timeout(TICK * 100, move |_: &Timeout| drop(d))
            .unwrap();
        clock.settle();
        clock.advance(TICK); // in the wheel; the worker dozes until tick 100
        assert!(t.cancel());
        clock.advance(TICK * 4); // the boundary after the cancel (20 ms) passed
        assert_eq!(
            timer.pending_timeouts(),
            0,
            "round {round}: a cancel at 10 ms is counted out at 20 ms"
        );
        assert_eq!(
            drops.live_clones(),
            0,
            "round {round}: the cancelled task is freed"
        );
    }
}

#[test]
fn a_cancellation_is_not_counted_out_before_the_tick_boundary_while_others_push() {
    // Found by the properties at 1ae39ed (fixed since: only a transfer
    // stopped by the cap keeps `skip_idle_ticks` from skipping). The worker
    // dozes through ticks 1 and 2; a cancel at 30 ms wakes it. When another
    // thread pushes between the worker's transfer and its "queue empty?"
    // check, `skip_idle_ticks` declines to skip, the worker processes the
    // ticks that ended while it dozed and counts the cancellation made in
    // tick 3 out at 30 ms, before the boundary at 40 ms. So the count after
    // a settle depends on thread timing.
    const PUSHES: usize = 2000;
    for round in 0..200 {
        let clock = ManualClock::new();
        let timer = timer_on(&clock, TICK, 64);
        let far = timer.new_timeout(TICK * 50, |_: &Timeout| {}).unwrap();
        clock.settle();
        clock.advance(TICK); // tick 0 processed; the worker dozes until tick 50
        clock.advance(TICK * 2); // 30 ms: ticks 1 and 2 ended while it dozed
        let go = Arc::new(std::sync::Barrier::new(2));
        let (t, g) = (timer.clone(), go.clone());
        let pusher = thread::spawn(move || {
            g.wait();
            for _ in 0..PUSHES {
                t.new_timeout(TICK * 40, |_: &Timeout| {}).unwrap();
            }
        });
        go.wait();
        assert!(far.cancel()); // at 30 ms, in tick 3: counted out at 40 ms
        pusher.join().unwrap();
        clock.settle();
        assert_eq!(
            timer.pending_timeouts(),
            PUSHES + 1,
            "round {round}: the cancellation was counted out before 40 ms"
        );
        clock.advance(TICK);
        assert_eq!(timer.pending_timeouts(), PUSHES, "round {round}");
        timer.stop().unwrap();
    }
}

#[test]
fn more_than_the_transfer_cap_in_one_tick_spills_into_the_next_tick() {
    // Netty HWT-W03: at most 100,000 timeouts move into the wheel per tick;
    // the rest wait for the next tick, in order.
    let clock = ManualClock::new();
    let timer = timer_on(&clock, TICK, 8);
    let count = Arc::new(AtomicUsize::new(0));
    let mut handles = Vec::with_capacity(TRANSFER_CAP + 1);
    for _ in 0..=TRANSFER_CAP {
        let c = count.clone();
        handles.push(
            timer
                .new_timeout(Duration::ZERO, move |_: &Timeout| {
                    c.fetch_add(1, Ordering::Relaxed);
                })
                .unwrap(),
        );
    }
    assert_eq!(timer.pending_timeouts(), TRANSFER_CAP + 1);
    clock.settle(); // the wake-up race: see the `..._wakes_the_worker_...` tests
    clock.advance(TICK);
    assert_eq!(count.load(Ordering::Relaxed), TRANSFER_CAP);
    assert_eq!(timer.pending_timeouts(), 1);
    let last = handles.last().unwrap();
    assert!(
        !last.is_expired(),
        "the last one created is the one left over"
    );
    assert!(handles[TRANSFER_CAP - 1].is_expired());
    clock.advance(TICK);
    assert_eq!(count.load(Ordering::Relaxed), TRANSFER_CAP + 1);
    assert!(last.is_expired());
    assert_eq!(timer.pending_timeouts(), 0);
}

#[test]
fn cancelled_timeouts_count_against_the_transfer_cap() {
    // Netty HWT-W03: the cap counts the cancelled entries it polls and drops.
    let clock = ManualClock::new();
    let timer = timer_on(&clock, TICK, 8);
    let count = Arc::new(AtomicUsize::new(0));
    let mut handles = Vec::with_capacity(TRANSFER_CAP + 1);
    for _ in 0..=TRANSFER_CAP {
        let c = count.clone();
        handles.push(
            timer
                .new_timeout(Duration::ZERO, move |_: &Timeout| {
                    c.fetch_add(1, Ordering::Relaxed);
                })
                .unwrap(),
        );
    }
    assert!(handles[0].cancel());
    clock.settle(); // the wake-up race: see the `..._wakes_the_worker_...` tests
    clock.advance(TICK);
    assert_eq!(count.load(Ordering::Relaxed), TRANSFER_CAP - 1);
    assert_eq!(timer.pending_timeouts(), 1);
    clock.advance(TICK);
    assert_eq!(count.load(Ordering::Relaxed), TRANSFER_CAP);
    assert_eq!(timer.pending_timeouts(), 0);
}

#[test]
fn three_years_of_uptime_fire_every_timeout_at_its_tick() {
    // tokio#5630: a wheel that panicked after ~2^36 ms of uptime. Two timers
    // share one manual clock that runs for three years in big jumps.
    const MS: u64 = 1_000_000;
    const MINUTE: u64 = 60_000 * MS;
    const COARSE_TICK: u64 = 15 * MINUTE;
    const DAY: u64 = 86_400_000 * MS;
    const YEAR: u64 = 365 * DAY;
    let clock = ManualClock::new();
    // A 1 ms tick (~9.5e10 ticks in three years): the clock lands exactly
    // on each deadline's tick end, so the worker never has millions of
    // idle ticks to catch up one by one.
    let fine = timer_on(&clock, Duration::from_millis(1), 512);
    // A 15-minute tick: day-long jumps cross its deadlines, and a task
    // re-arms every day; its worker catches up at most a day of ticks.
    let coarse = timer_on(&clock, Duration::from_nanos(COARSE_TICK), 64);
    let fired = Fired::default();

    // (name, delay in ns) on the fine timer, scheduled at time 0.
    let fine_delays = [
        (0, DAY),
        (1, (1u64 << 32) * MS + 7 * MS + 3), // past u32::MAX ms
        (2, (1u64 << 36) * MS + 3 * MS),     // past 2^36 ms (~2.18 years)
        (3, 3 * YEAR - MS),
        (4, 3 * YEAR + 60 * MINUTE), // an hour after the three years
        (5, 100 * YEAR),             // still pending at the end
    ];
    let mut due: Vec<(usize, u64)> = Vec::new(); // (name, tick end) on the fine timer
    for &(name, d) in &fine_delays {
        fine.new_timeout(Duration::from_nanos(d), fired.task(&clock, name))
            .unwrap();
        due.push((name, (d / MS + 1) * MS));
    }
    let never = fine
        .new_timeout(Duration::MAX, fired.task(&clock, 99))
        .unwrap();

    // On the coarse timer: a task that re-arms itself a day later each time
    // it runs, logging (deadline, clock when it ran); and one timeout.
    type Runs = Arc<Mutex<Vec<(u64, u64)>>>;
    fn daily(timer: &HashedWheelTimer, clock: &ManualClock, runs: &Runs) {
        let (t, c, r) = (timer.clone(), clock.clone(), runs.clone());
        let handle: Arc<Mutex<Option<Timeout>>> = Arc::default();
        let h = handle.clone();
        let timeout = timer
            .new_timeout(Duration::from_secs(86_400), move |_: &Timeout| {
                let deadline = h.lock().unwrap().as_ref().unwrap().deadline();
                r.lock()
                    .unwrap()
                    .push((deadline.as_nanos() as u64, c.now().as_nanos() as u64));
                daily(&t, &c, &r);
            })
            .unwrap();
        *handle.lock().unwrap() = Some(timeout);
    }
    let runs: Runs = Arc::default();
    daily(&coarse, &clock, &runs);
    let coarse_mid = coarse
        .new_timeout(
            Duration::from_nanos(YEAR + 123 * MS),
            fired.task(&clock, 50),
        )
        .unwrap();

    clock.settle(); // the wake-up race: see the `..._wakes_the_worker_...` tests
    let end = 3 * YEAR + 120 * MINUTE;
    let mut now = 0u64;
    let mut landings = vec![0u64];
    let mut exact = 0;
    while now < end {
        // At most a day, and never past the next fine deadline's tick end
        // minus 1 ns; from there, 1 ns more must fire it.
        let next_fine = due
            .iter()
            .map(|&(_, e)| e)
            .filter(|&e| e > now)
            .min()
            .unwrap_or(u64::MAX);
        let target = (now + DAY).min(next_fine - 1).min(end);
        if target > now {
            clock.advance(Duration::from_nanos(target - now));
            now = target;
            landings.push(now);
        }
        let names = fired.names();
        for &(name, e) in &due {
            assert_eq!(
                names.contains(&name),
                e <= now,
                "timeout {name} (tick end {e} ns) at {now} ns: {:?}",
                fired.all()
            );
        }
        if now == next_fine - 1 {
            clock.advance(Duration::from_nanos(1));
            now += 1;
            landings.push(now);
            let (name, at) = *fired.all().last().unwrap();
            assert_eq!(
                at,
                Duration::from_nanos(now),
                "timeout {name} fired at its tick end"
            );
            exact += 1;
        }
    }
    assert_eq!(
        exact, 5,
        "every fine deadline within the run was met exactly"
    );

    // A coarse timeout runs in the advance that crosses its tick end.
    let ran_in_the_right_advance = |deadline: u64, at: u64| {
        let tick_end = (deadline / COARSE_TICK + 1) * COARSE_TICK;
        let i = landings
            .binary_search(&at)
            .expect("runs happen at landings");
        i > 0 && landings[i - 1] < tick_end && tick_end <= at
    };
    let runs = runs.lock().unwrap().clone();
    assert!(runs.len() > 500, "{} daily runs", runs.len());
    assert_eq!(runs[0].0, DAY);
    for (i, &(deadline, at)) in runs.iter().enumerate() {
        assert!(
            ran_in_the_right_advance(deadline, at),
            "daily run {i}: {deadline} ns ran at {at} ns"
        );
        if i > 0 {
            assert_eq!(
                deadline,
                runs[i - 1].1 + DAY,
                "run {i} was armed a day after run {}",
                i - 1
            );
        }
    }
    let (_, mid_at) = *fired.all().iter().find(|(n, _)| *n == 50).unwrap();
    assert!(coarse_mid.is_expired());
    assert!(ran_in_the_right_advance(
        coarse_mid.deadline().as_nanos() as u64,
        mid_at.as_nanos() as u64
    ));

    // After three years both timers still schedule and fire on time.
    fine.new_timeout(Duration::from_millis(5), fired.task(&clock, 7))
        .unwrap();
    coarse
        .new_timeout(Duration::from_secs(60), fired.task(&clock, 8))
        .unwrap();
    clock.advance(Duration::from_millis(5));
    assert!(!fired.names().contains(&7), "not before its tick ended");
    clock.advance(Duration::from_millis(1));
    assert!(fired.names().contains(&7));
    clock.advance(Duration::from_nanos(COARSE_TICK));
    assert!(fired.names().contains(&8));
    assert!(!fired.names().contains(&5) && !fired.names().contains(&99));
    assert_eq!(fine.pending_timeouts(), 2);
    let left = fine.stop().unwrap();
    assert_eq!(left.len(), 2);
    assert!(left.iter().any(|t| t.ptr_eq(&never)));
    assert_eq!(coarse.pending_timeouts(), 1, "the daily task");
    assert_eq!(coarse.stop().unwrap().len(), 1);
}

#[test]
fn stop_returns_the_pending_timeouts_cancelled_and_new_timeout_fails_after() {
    // netty#14081: stop() returned the pending timeouts without cancelling.
    let clock = ManualClock::new();
    let timer = timer_on(&clock, TICK, 8);
    let fired = Fired::default();
    let ran = timer.new_timeout(TICK, fired.task(&clock, 0)).unwrap();
    let cancelled = timer.new_timeout(TICK * 3, fired.task(&clock, 1)).unwrap();
    let in_wheel = timer.new_timeout(TICK * 30, fired.task(&clock, 2)).unwrap();
    clock.settle(); // the wake-up race: see the `..._wakes_the_worker_...` tests
    clock.advance(TICK * 2);
    assert!(cancelled.cancel());
    let queued = timer.new_timeout(TICK, fired.task(&clock, 3)).unwrap();
    let left = timer.stop().unwrap();
    assert_eq!(left.len(), 2);
    for t in [&in_wheel, &queued] {
        assert!(left.iter().any(|l| l.ptr_eq(t)), "{t:?} not returned");
        assert!(t.is_cancelled());
        assert!(!t.cancel(), "already cancelled by stop()");
    }
    assert!(ran.is_expired());
    assert_eq!(timer.pending_timeouts(), 0);
    assert!(matches!(
        timer.new_timeout(Duration::ZERO, |_: &Timeout| {}),
        Err(TimerError::Stopped)
    ));
    assert!(matches!(timer.start(), Err(TimerError::Stopped)));
    assert_eq!(timer.pending_timeouts(), 0);
    clock.advance(TICK * 100);
    assert_eq!(fired.names(), vec![0]);
    assert!(
        timer.stop().unwrap().is_empty(),
        "a second stop returns nothing"
    );
}

#[test]
fn a_panicking_task_does_not_stop_the_worker() {
    timer_model::silence_task_panics();
    let clock = ManualClock::new();
    let timer = HashedWheelTimer::builder()
        .tick_duration(TICK)
        .ticks_per_wheel(8)
        .thread_name(timer_model::WORKER_THREAD)
        .clock(clock.clone())
        .build()
        .unwrap();
    let fired = Fired::default();
    timer
        .new_timeout(TICK, |_: &Timeout| panic!("{}", timer_model::TASK_PANIC))
        .unwrap();
    timer.new_timeout(TICK, fired.task(&clock, 1)).unwrap();
    timer.new_timeout(TICK * 2, fired.task(&clock, 2)).unwrap();
    clock.settle(); // the wake-up race: see the `..._wakes_the_worker_...` tests
    clock.advance(TICK * 3);
    assert_eq!(fired.names(), vec![1, 2]);
    assert_eq!(timer.pending_timeouts(), 0);
}

// ---------------------------------------------------------------------------
// Model harness smoke test and regressions found by fuzzing
// ---------------------------------------------------------------------------

#[test]
fn model_harness_replays_a_hand_written_sequence() {
    let cfg = Config {
        tick_ns: 10_000_000,
        ticks_per_wheel: 8,
    };
    Harness::run(
        cfg,
        &[
            Op::Schedule {
                delay: Delay::Zero,
                task: Task::Record,
            },
            Op::Schedule {
                delay: Delay::Spans {
                    turns: 1,
                    offset: 0,
                },
                task: Task::Cancel { pick: 0 },
            },
            Op::Schedule {
                delay: Delay::Max,
                task: Task::Record,
            },
            Op::Advance(Step::ToTickEnd(0)),
            Op::Advance(Step::ToTickEnd(1)),
            Op::Cancel { pick: 0 },
            Op::Schedule {
                delay: Delay::Ticks { ticks: 3, extra: 5 },
                task: Task::Rearm {
                    delay: Delay::Zero,
                    times: 2,
                },
            },
            Op::Advance(Step::Turns(1)),
            Op::Advance(Step::Far {
                days: 800,
                overshoot: 3,
            }),
            Op::Cancel { pick: 2 },
            Op::Advance(Step::Ticks {
                ticks: 40,
                extra: 0,
            }),
        ],
    );
}

#[test]
fn regression_fuzz_first_zero_delay_timeout_then_a_jump_fires_in_its_tick() {
    // Found by `timer_ops` (at b528c3c) after 5,323 runs: the wake-up race of
    // `a_timeout_that_wakes_the_worker_fires_at_the_end_of_its_own_tick`,
    // here on the very first `new_timeout` (the worker starts, finds no
    // input, sleeps; the timeout's unpark comes after the clock moved).
    Harness::run(
        Config {
            tick_ns: 1_578_004,
            ticks_per_wheel: 6,
        },
        &[
            Op::Schedule {
                delay: Delay::Zero,
                task: Task::Record,
            },
            Op::Advance(Step::Far {
                days: 12079,
                overshoot: 0,
            }),
        ],
    );
}

#[test]
fn regression_fuzz_a_far_jump_after_task_cancellations_completes_and_matches_the_model() {
    // Found by `timer_ops` (with REDWHEEL_MODEL_SETTLE=1) after 119,892
    // runs: one wheel bucket, tasks that cancel and panic, then jumps of
    // hundreds of days. A cancellation queued by a task in the last tick
    // before a jump woke the worker right after the jump's start, and it
    // then processed ~5.5e9 empty ticks one by one: `advance` gave up after
    // its 60 s limit and the model saw timeouts not yet fired. The harness
    // now stops a jump at the first wake-up point; the worker's tick-by-tick
    // catch-up is noted in the report.
    Harness::run(
        Config {
            tick_ns: 3_621_440,
            ticks_per_wheel: 1,
        },
        &[
            Op::Schedule {
                delay: Delay::Nanos(18429966857693102015),
                task: Task::Record,
            },
            Op::Schedule {
                delay: Delay::Zero,
                task: Task::Record,
            },
            Op::Schedule {
                delay: Delay::Spans {
                    turns: 2,
                    offset: 0,
                },
                task: Task::Cancel {
                    pick: 506381209866536711,
                },
            },
            Op::Schedule {
                delay: Delay::Spans {
                    turns: 2,
                    offset: 0,
                },
                task: Task::Cancel {
                    pick: 3028397001194014471,
                },
            },
            Op::Schedule {
                delay: Delay::Spans {
                    turns: 0,
                    offset: -2,
                },
                task: Task::Panic,
            },
            Op::Schedule {
                delay: Delay::Spans {
                    turns: 2,
                    offset: 0,
                },
                task: Task::Panic,
            },
            Op::Schedule {
                delay: Delay::Spans {
                    turns: 2,
                    offset: 0,
                },
                task: Task::Panic,
            },
            Op::Start,
            Op::Advance(Step::Far {
                days: 229,
                overshoot: 0,
            }),
            Op::Schedule {
                delay: Delay::Ticks {
                    ticks: 0,
                    extra: 648799565318062075,
                },
                task: Task::Record,
            },
            Op::Schedule {
                delay: Delay::Zero,
                task: Task::Panic,
            },
            Op::Schedule {
                delay: Delay::Spans {
                    turns: 2,
                    offset: 0,
                },
                task: Task::Rearm {
                    delay: Delay::Spans {
                        turns: 2,
                        offset: 0,
                    },
                    times: 42,
                },
            },
            Op::Schedule {
                delay: Delay::Spans {
                    turns: 2,
                    offset: 0,
                },
                task: Task::Panic,
            },
            Op::Schedule {
                delay: Delay::Spans {
                    turns: 2,
                    offset: 0,
                },
                task: Task::Panic,
            },
            Op::Advance(Step::Far {
                days: 3857049061,
                overshoot: 229,
            }),
            Op::Advance(Step::Far {
                days: 1357243877,
                overshoot: 46,
            }),
            Op::Advance(Step::Far {
                days: 3857049061,
                overshoot: 229,
            }),
            Op::Advance(Step::Far {
                days: 3035365,
                overshoot: 0,
            }),
        ],
    );
}
