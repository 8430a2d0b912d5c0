//! The driver's scheduling, on a manual clock, with fake jobs and a fake
//! transport (`test_rig.rs`): no Redis, no sleeps.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::test_rig::*;
use super::*;

#[test]
fn a_job_runs_at_its_deadline_and_never_before() {
    let rig = Rig::new();
    rig.register(job("a", Next::Idle), Deadline::After(ms(100)), None);
    rig.register(job("b", Next::Idle), Deadline::ServerMs(250), None);
    rig.advance(ms(99));
    assert!(rig.wire.rounds().is_empty(), "nothing runs early");
    for _ in 0..3 {
        rig.advance(MS);
    }
    let runs = rig.wire.runs_of("a");
    assert_eq!(runs.len(), 1);
    assert!(runs[0] >= ms(100) && runs[0] <= ms(101), "{runs:?}");
    rig.advance(ms(148));
    assert!(rig.wire.runs_of("b").is_empty(), "b is due at 250 ms");
    for _ in 0..3 {
        rig.advance(MS);
    }
    let runs = rig.wire.runs_of("b");
    assert_eq!(runs.len(), 1);
    assert!(runs[0] >= ms(250) && runs[0] <= ms(251), "{runs:?}");
}

#[test]
fn a_job_first_due_now_runs_in_the_next_round_and_its_reply_schedules_it() {
    let rig = Rig::new();
    let at = Next::After(ms(40));
    rig.register(scripted("a", Next::Idle, vec![Ok(at)]), Deadline::Now, None);
    assert_eq!(rig.wire.runs_of("a"), vec![Duration::ZERO]);
    // Measured from the reply's arrival: 40 ms ahead.
    assert_eq!(rig.driver.scheduled_at("a"), Some(ms(40)));
    rig.advance(ms(41));
    assert_eq!(rig.wire.runs_of("a").len(), 2);
}

#[test]
fn an_earlier_deadline_replaces_a_later_one_and_a_later_one_does_not() {
    let rig = Rig::new();
    rig.register(job("a", Next::Idle), Deadline::After(ms(100)), None);
    assert_eq!(rig.driver.scheduled_at("a"), Some(ms(100)));
    // A later announcement (a stale reply, a later head) changes nothing.
    rig.driver.announce("a", Deadline::ServerMs(300));
    assert_eq!(rig.driver.scheduled_at("a"), Some(ms(100)));
    // An earlier one replaces it.
    rig.driver.announce("a", Deadline::ServerMs(50));
    assert_eq!(rig.driver.scheduled_at("a"), Some(ms(50)));
    rig.advance(ms(52));
    assert_eq!(
        rig.wire.runs_of("a").len(),
        1,
        "ran at the earlier deadline"
    );
    // The replaced timeout was cancelled: nothing runs at 100 or 300 ms.
    rig.advance(ms(400));
    assert_eq!(rig.wire.runs_of("a").len(), 1);
    // A deadline already past runs in the next round.
    rig.driver.announce("a", Deadline::ServerMs(1));
    rig.driver.settle();
    assert_eq!(rig.wire.runs_of("a").len(), 2);
}

#[test]
fn a_job_whose_wake_up_was_lost_still_runs_at_the_next_guard_sweep() {
    let rig = Rig::new();
    rig.register(job("a", Next::Idle), Deadline::Now, Some(ms(1_000)));
    rig.register(job("b", Next::Idle), Deadline::Now, Some(ms(1_000)));
    assert_eq!(rig.wire.rounds().len(), 2);
    // Work appears in Redis but its announcement is lost: nothing is
    // scheduled, until the sweep.
    rig.advance(ms(999));
    assert_eq!(rig.wire.rounds().len(), 2);
    rig.advance(ms(2));
    let rounds = rig.wire.rounds();
    assert_eq!(rounds.len(), 3, "one sweep round for the group: {rounds:?}");
    let mut swept = rounds[2].1.clone();
    swept.sort();
    assert_eq!(swept, ["a", "b"]);
    // And again one interval after that sweep.
    rig.advance(ms(1_001));
    assert_eq!(rig.wire.rounds().len(), 4);
}

#[test]
fn an_unregistered_key_runs_no_more_and_its_sweep_stops() {
    let rig = Rig::new();
    rig.register(job("a", Next::Idle), Deadline::After(ms(50)), Some(ms(100)));
    rig.driver.unregister("a");
    rig.advance(ms(500));
    assert!(rig.wire.rounds().is_empty());
    // The same key can be registered again.
    rig.register(job("a", Next::Idle), Deadline::Now, None);
    assert_eq!(rig.wire.runs_of("a").len(), 1);
}

#[test]
fn a_failing_job_backs_off_and_recovers() {
    let rig = Rig::new();
    let fail = || Err(Error::new(ErrorKind::Server, "fake failure"));
    let recovered = Next::After(ms(4_000));
    rig.register(
        scripted("a", Next::Idle, vec![fail(), fail(), fail(), Ok(recovered)]),
        Deadline::Now,
        None,
    );
    // Backoff 100 ms, doubling, capped at 300 ms.
    assert_eq!(rig.driver.scheduled_at("a"), Some(ms(100)));
    // A timeout fires when the 1 ms tick holding its deadline ends.
    rig.advance(ms(101));
    assert_eq!(rig.driver.scheduled_at("a"), Some(ms(101) + ms(200)));
    rig.advance(ms(201));
    assert_eq!(rig.driver.scheduled_at("a"), Some(ms(302) + ms(300)));
    rig.advance(ms(301));
    // The fourth run succeeds and schedules the job where its reply says.
    assert_eq!(rig.wire.runs_of("a").len(), 4);
    assert_eq!(rig.driver.scheduled_at("a"), Some(ms(603) + ms(4_000)));
    assert_eq!(rig.driver.stats().job_failures, 3);
    // The failure count is reset: a later failure starts at 100 ms again.
    let rig2 = Rig::new();
    rig2.register(
        scripted("b", Next::Idle, vec![fail(), Ok(Next::Again), fail()]),
        Deadline::Now,
        None,
    );
    rig2.advance(ms(101));
    assert_eq!(rig2.wire.runs_of("b").len(), 3);
    assert_eq!(rig2.driver.scheduled_at("b"), Some(ms(101) + ms(100)));
}

#[test]
fn rounds_retry_while_redis_is_down_and_every_job_runs_after_the_reconnect() {
    let rig = Rig::new();
    rig.register(job("idle", Next::Idle), Deadline::Now, None);
    rig.register(
        job("later", Next::Idle),
        Deadline::After(ms(3_600_000)),
        None,
    );
    assert_eq!(rig.wire.rounds().len(), 1);
    rig.wire.down.store(true, Ordering::SeqCst);
    rig.driver.announce("idle", Deadline::Now);
    rig.driver.settle();
    // The failed round is retried on the reconnect backoff: 10, 20, 40, 40 ms.
    assert_eq!(rig.driver.scheduled_at("idle"), Some(ms(10)));
    rig.advance(ms(11));
    assert_eq!(rig.driver.scheduled_at("idle"), Some(ms(11) + ms(20)));
    rig.advance(ms(21));
    assert_eq!(rig.driver.scheduled_at("idle"), Some(ms(32) + ms(40)));
    assert_eq!(rig.driver.stats().failed_rounds, 3);
    rig.wire.down.store(false, Ordering::SeqCst);
    rig.advance(ms(41));
    // Back: the retried job runs, and then every job runs once more, the
    // one scheduled an hour away included.
    assert_eq!(rig.wire.runs_of("later").len(), 1);
    assert_eq!(rig.driver.stats().reconnects, 1);
    assert!(rig.wire.runs_of("idle").len() >= 2);
}

#[test]
fn shutdown_with_jobs_pending_returns_within_its_timeout() {
    let rig = Rig::new();
    for i in 0..100 {
        rig.register(
            job(&format!("k{i}"), Next::Idle),
            Deadline::After(ms(60_000)),
            Some(ms(1_000)),
        );
    }
    rig.driver
        .shutdown(Some(Instant::now() + Duration::from_secs(10)))
        .expect("an idle driver stops at once");
    rig.advance(ms(120_000));
    assert!(rig.wire.rounds().is_empty(), "nothing runs after shutdown");

    // A driver stuck in a round (Redis not answering) gives up waiting at
    // the deadline and says so.
    let stuck = Rig::new();
    let (release, hold) = crossbeam_channel::bounded::<()>(0);
    let (entered_tx, entered) = crossbeam_channel::bounded::<()>(1);
    *stuck.wire.hold.lock() = Some((entered_tx, hold));
    assert!(
        stuck
            .driver
            .register("a", job("a", Next::Idle), Deadline::Now, None)
    );
    entered.recv().expect("the round started");
    let err = stuck
        .driver
        .shutdown(Some(Instant::now() + Duration::from_millis(50)))
        .expect_err("the round never ends");
    assert_eq!(err.kind(), ErrorKind::ShutdownTimeout);
    drop(release);
}

#[test]
fn ten_thousand_keys_due_in_the_same_tick_run_in_one_round() {
    let rig = Rig::new();
    for i in 0..10_000 {
        assert!(rig.driver.register(
            &format!("k{i}"),
            job(&format!("k{i}"), Next::Idle),
            Deadline::After(ms(50)),
            None
        ));
    }
    rig.clock.settle();
    rig.driver.settle();
    assert!(rig.wire.rounds().is_empty());
    rig.advance(ms(51));
    let rounds = rig.wire.rounds();
    assert_eq!(rounds.len(), 1, "one round trip for the whole tick");
    assert_eq!(rounds[0].1.len(), 10_000);
    assert_eq!(rig.driver.stats().commands, 10_000);
}

#[test]
fn a_job_that_always_reports_a_full_batch_does_not_starve_another() {
    let rig = Rig::new();
    rig.register(job("burst", Next::Again), Deadline::Now, None);
    rig.register(job("other", Next::Idle), Deadline::After(ms(20)), None);
    rig.advance(ms(21));
    let rounds = rig.wire.rounds();
    let first_other = rounds
        .iter()
        .position(|(_, keys)| keys.iter().any(|k| k == "other"))
        .expect("the other job ran while the burst went on");
    assert!(
        rounds[first_other].1.iter().any(|k| k == "burst"),
        "it ran beside the burst, in the same round"
    );
    // The burst is still going: it yields between batches, it is not
    // dropped.
    let before = rig.wire.runs_of("burst").len();
    rig.driver.settle();
    assert!(rig.wire.runs_of("burst").len() > before);
    assert_eq!(rig.wire.runs_of("other").len(), 1);
}

#[test]
fn a_noscript_reply_loads_the_job_scripts_and_runs_it_again() {
    let rig = Rig::new();
    rig.wire.noscript.lock().push("a".to_owned());
    rig.register(job("a", Next::Idle), Deadline::Now, None);
    rig.driver.settle();
    assert_eq!(rig.wire.loaded.load(Ordering::SeqCst), 1);
    assert_eq!(rig.wire.runs_of("a").len(), 2);
    assert_eq!(rig.driver.stats().job_failures, 0);
}

/// A script that cannot be loaded (an ACL user without `script|load`)
/// must not have the job run again and again at once: it backs off on the
/// job schedule, and the error says which permission is missing.
#[test]
fn a_noscript_whose_script_cannot_be_loaded_backs_off_instead_of_spinning() {
    let rig = Rig::new();
    rig.wire.always_noscript.store(true, Ordering::SeqCst);
    *rig.wire.load_fails.lock() = Some(ErrorKind::PermissionDenied);
    rig.register(job("a", Next::Idle), Deadline::Now, None);
    for _ in 0..5 {
        rig.driver.settle();
    }
    assert_eq!(
        rig.wire.runs_of("a").len(),
        1,
        "no new round before the backoff"
    );
    assert_eq!(rig.wire.loaded.load(Ordering::SeqCst), 1);
    assert_eq!(rig.driver.stats().job_failures, 1);
    // The job backoff (100 ms here), not the reconnect one (10 ms): a
    // refused load will not mend itself soon.
    rig.advance(ms(99));
    assert_eq!(rig.wire.runs_of("a").len(), 1);
    rig.advance(ms(2));
    assert_eq!(rig.wire.runs_of("a").len(), 2);
    rig.advance(ms(150));
    assert_eq!(rig.wire.runs_of("a").len(), 2, "then 200 ms");
    rig.advance(ms(60));
    assert_eq!(rig.wire.runs_of("a").len(), 3);
}

/// A script that is missing again right after it was loaded (a node the
/// load did not reach, a server that keeps losing it) runs the job once
/// more at once, then backs off.
#[test]
fn a_script_missing_again_right_after_its_load_backs_off() {
    let rig = Rig::new();
    rig.wire.always_noscript.store(true, Ordering::SeqCst);
    rig.register(job("a", Next::Idle), Deadline::Now, None);
    for _ in 0..5 {
        rig.driver.settle();
    }
    assert_eq!(rig.wire.runs_of("a").len(), 2, "loaded, and run again once");
    assert_eq!(rig.wire.loaded.load(Ordering::SeqCst), 2);
    assert_eq!(rig.driver.stats().job_failures, 1);
    rig.advance(ms(99));
    assert_eq!(rig.wire.runs_of("a").len(), 2);
    rig.advance(ms(2));
    assert_eq!(rig.wire.runs_of("a").len(), 3);
    // The server keeps the script again: back on the job's own schedule.
    rig.wire.always_noscript.store(false, Ordering::SeqCst);
    rig.advance(ms(200));
    rig.advance(ms(200));
    assert_eq!(rig.wire.runs_of("a").len(), 4);
}

#[test]
fn run_all_runs_every_registered_job_in_one_round() {
    let rig = Rig::new();
    for k in ["a", "b", "c"] {
        rig.register(job(k, Next::Idle), Deadline::After(ms(10_000)), None);
    }
    rig.driver.run_all();
    rig.driver.settle();
    let rounds = rig.wire.rounds();
    assert_eq!(rounds.len(), 1);
    assert_eq!(rounds[0].1.len(), 3);
}

#[test]
fn a_job_asking_for_after_runs_that_long_later_on_the_local_clock() {
    let rig = Rig::new();
    rig.register(job("lease", Next::After(ms(30))), Deadline::Now, None);
    rig.advance(ms(31));
    rig.advance(ms(31));
    let runs = rig.wire.runs_of("lease");
    assert_eq!(runs.len(), 3, "{runs:?}");
    assert!(runs[1] >= ms(30) && runs[2] >= runs[1] + ms(30), "{runs:?}");
}

#[test]
fn a_deadline_is_kept_while_the_wheel_thread_is_held_up() {
    // The real clock: the wheel's worker is stuck in a task, so only the
    // driver's own wait (the backstop) can run the job.
    let clock = crate::timer::SystemClock::new();
    let wire = Arc::new(Wire::default());
    let (rounds_tx, rounds) = crossbeam_channel::unbounded();
    *wire.rounds_tx.lock() = Some(rounds_tx);
    let driver = Driver::start(
        Rig::config(),
        FakeTransport {
            wire: Arc::clone(&wire),
            clock: Arc::new(clock),
            connected: false,
        },
        clock,
        Arc::new(ServerClock::default()),
        "driver-backstop",
    )
    .unwrap();
    let (release, stuck) = crossbeam_channel::bounded::<()>(0);
    let (entered_tx, entered) = crossbeam_channel::bounded::<()>(1);
    driver
        .shared
        .timer
        .new_timeout(Duration::ZERO, move |_: &crate::timer::Timeout| {
            let _ = entered_tx.send(());
            let _ = stuck.recv();
        })
        .unwrap();
    entered.recv().expect("the wheel runs the slow task");
    let started = driver.now();
    assert!(driver.register(
        "lease",
        job("lease", Next::Idle),
        Deadline::After(ms(30)),
        None
    ));
    rounds
        .recv_timeout(Duration::from_secs(30))
        .expect("the job ran although the wheel is stuck");
    let runs = wire.runs_of("lease");
    assert_eq!(runs.len(), 1);
    assert!(
        runs[0] >= started + ms(30),
        "never early: {runs:?} vs {started:?}"
    );
    drop(release);
    let _ = driver.shutdown(Some(Instant::now() + Duration::from_secs(10)));
}

#[test]
fn a_round_with_nothing_to_send_is_no_round_trip_and_no_failure() {
    let rig = Rig::new();
    let empty = Arc::new(EmptyJob {
        replies: AtomicU64::new(0),
    });
    assert!(rig.driver.register(
        "empty",
        Arc::clone(&empty) as Arc<dyn Job>,
        Deadline::Now,
        None
    ));
    rig.clock.settle();
    rig.driver.settle();
    assert_eq!(empty.replies.load(Ordering::SeqCst), 1);
    rig.advance(ms(100));
    rig.advance(MS);
    assert_eq!(empty.replies.load(Ordering::SeqCst), 2, "on its schedule");
    assert!(rig.wire.rounds().is_empty(), "nothing went on the wire");
    let stats = rig.driver.stats();
    assert_eq!((stats.rounds, stats.failed_rounds), (0, 0));
    assert_eq!(rig.wire.connects.load(Ordering::SeqCst), 0);
}

/// A job that answers guard sweeps with a probe: its command is `probe:K`
/// after a sweep, `K` otherwise; a probe's reply answers `on_probe`.
struct ProbingJob {
    key: Arc<str>,
    probe_next: AtomicBool,
    sent_probe: AtomicBool,
    on_probe: Mutex<Next>,
}

impl ProbingJob {
    fn new(key: &str, on_probe: Next) -> Arc<ProbingJob> {
        Arc::new(ProbingJob {
            key: Arc::from(key),
            probe_next: AtomicBool::new(false),
            sent_probe: AtomicBool::new(false),
            on_probe: Mutex::new(on_probe),
        })
    }
}

impl Job for ProbingJob {
    fn describe(&self) -> String {
        format!("probing job {}", self.key)
    }

    fn commands(&self, out: &mut Commands) {
        let probe = self.probe_next.swap(false, Ordering::SeqCst);
        self.sent_probe.store(probe, Ordering::SeqCst);
        if probe {
            out.push(0, format!("probe:{}", self.key).as_bytes());
        } else {
            out.push(0, self.key.as_bytes());
        }
    }

    fn on_reply(&self, _replies: &[redis::Value]) -> Result<Next, Error> {
        Ok(if self.sent_probe.load(Ordering::SeqCst) {
            *self.on_probe.lock()
        } else {
            Next::Idle
        })
    }

    fn sweep(&self) {
        self.probe_next.store(true, Ordering::SeqCst);
    }

    fn run_in_full(&self) {
        self.probe_next.store(false, Ordering::SeqCst);
    }
}

impl Rig {
    fn register_probing(&self, job: Arc<ProbingJob>, first: Deadline, guard: Duration) {
        let key = job.key.to_string();
        assert!(self.driver.register(&key, job, first, Some(guard)));
        self.clock.settle();
        self.driver.settle();
    }
}

#[test]
fn a_sweep_sends_the_probe_of_a_job_that_has_one_and_its_reply_decides_the_full_run() {
    let rig = Rig::new();
    let quiet = ProbingJob::new("quiet", Next::Idle);
    let busy = ProbingJob::new("busy", Next::Again);
    let later = ProbingJob::new("later", Next::After(ms(300)));
    rig.register_probing(Arc::clone(&quiet), Deadline::Now, ms(1_000));
    rig.register_probing(Arc::clone(&busy), Deadline::Now, ms(1_000));
    rig.register_probing(Arc::clone(&later), Deadline::Now, ms(1_000));
    // The first runs (registration) are full ones.
    assert_eq!(rig.wire.runs_of("quiet").len(), 1);
    rig.advance(ms(1_001));
    let rounds = rig.wire.rounds();
    let mut swept = rounds[rounds.len() - 2].1.clone();
    swept.sort();
    assert_eq!(
        swept,
        ["probe:busy", "probe:later", "probe:quiet"],
        "the sweep sends probes, not full commands: {rounds:?}"
    );
    // The probe that found work runs the job in full in the next round,
    // and only that one.
    assert_eq!(rounds[rounds.len() - 1].1, ["busy"]);
    assert_eq!(rig.wire.runs_of("quiet").len(), 1);
    // The one whose probe named a time runs then, in full.
    assert_eq!(rig.driver.scheduled_at("later"), Some(ms(1_001) + ms(300)));
    rig.advance(ms(301));
    assert_eq!(rig.wire.runs_of("later").len(), 2);
    assert_eq!(rig.wire.rounds().last().unwrap().1, ["later"]);
}

#[test]
fn a_job_due_for_any_other_reason_runs_in_full_even_when_a_sweep_asked_for_a_probe() {
    let rig = Rig::new();
    let a = ProbingJob::new("a", Next::Idle);
    rig.register_probing(Arc::clone(&a), Deadline::After(ms(1_000)), ms(1_000));
    rig.register_probing(ProbingJob::new("b", Next::Idle), Deadline::Now, ms(1_000));
    // Its deadline and the sweep fall in the same tick: it runs in full.
    rig.advance(ms(1_001));
    assert_eq!(rig.wire.runs_of("a").len(), 1);
    assert_eq!(rig.wire.runs_of("probe:a").len(), 0);
    // A sweep asked for a probe, then an announcement came before the
    // round: the announcement wins.
    a.sweep();
    rig.driver.announce("a", Deadline::Now);
    rig.driver.settle();
    assert_eq!(rig.wire.runs_of("a").len(), 2);
    assert_eq!(rig.wire.runs_of("probe:a").len(), 0);
}
