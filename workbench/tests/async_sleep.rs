//! `HashedWheelTimer::sleep` and `sleep_until` (feature `async`): futures
//! woken by the wheel, on tokio (current-thread and multi-thread) and smol;
//! never early; a dropped sleep cancels its timeout; a stopped timer ends
//! its sleeps with an error instead of leaving them hanging.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use redwheel::TimerError;
use redwheel::timer::{HashedWheelTimer, ManualClock};

const HANG: Duration = Duration::from_secs(60);

fn timer() -> HashedWheelTimer {
    HashedWheelTimer::builder()
        .tick_duration(Duration::from_millis(1))
        .build()
        .unwrap()
}

#[derive(Default)]
struct Probe(AtomicBool);

impl Wake for Probe {
    fn wake(self: Arc<Self>) {
        self.0.store(true, Ordering::SeqCst);
    }
}

fn poll<F: Future + Unpin>(f: &mut F, probe: &Arc<Probe>) -> Poll<F::Output> {
    let waker = Waker::from(Arc::clone(probe));
    Pin::new(f).poll(&mut Context::from_waker(&waker))
}

fn wait_for(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + HANG;
    while !cond() {
        assert!(Instant::now() < deadline, "hang guard: {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn a_sleep_is_send_and_needs_no_executor() {
    fn send<T: Send + 'static>(_: &T) {}
    let t = timer();
    let s = t.sleep(Duration::from_millis(1));
    send(&s);
}

#[test]
fn sleeps_on_tokio_and_smol_complete_never_before_their_deadline() {
    let t = timer();
    let run = |t: HashedWheelTimer| async move {
        let mut v = Vec::new();
        for ms in [0u64, 1, 5, 20] {
            let s = t.sleep(Duration::from_millis(ms));
            let deadline = s.deadline().unwrap();
            s.await.unwrap();
            v.push(Instant::now() >= deadline);
        }
        v
    };
    let current = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(run(t.clone()));
    let multi = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap()
        .block_on(async {
            let tasks: Vec<_> = (0..8).map(|_| tokio::spawn(run(t.clone()))).collect();
            let mut all = Vec::new();
            for task in tasks {
                all.extend(task.await.unwrap());
            }
            all
        });
    let smol = smol::block_on(run(t.clone()));
    for ok in current.iter().chain(&multi).chain(&smol) {
        assert!(ok, "a sleep ended before its deadline");
    }
}

#[test]
fn a_sleep_is_woken_by_the_wheel_on_a_manual_clock() {
    let clock = ManualClock::new();
    let t = HashedWheelTimer::builder()
        .tick_duration(Duration::from_millis(1))
        .clock(clock.clone())
        .build()
        .unwrap();
    let probe = Arc::new(Probe::default());
    let mut s = t.sleep(Duration::from_millis(50));
    assert!(poll(&mut s, &probe).is_pending());
    assert_eq!(t.pending_timeouts(), 1);
    clock.advance(Duration::from_millis(60));
    wait_for("the wheel to wake the sleep", || {
        probe.0.load(Ordering::SeqCst)
    });
    assert!(matches!(poll(&mut s, &probe), Poll::Ready(Ok(()))));
}

#[test]
fn a_dropped_sleep_cancels_its_timeout() {
    let t = timer();
    let probe = Arc::new(Probe::default());
    let mut s = t.sleep(Duration::from_secs(3600));
    assert!(poll(&mut s, &probe).is_pending());
    assert_eq!(t.pending_timeouts(), 1);
    drop(s);
    wait_for("the cancelled timeout to leave", || {
        t.pending_timeouts() == 0
    });
    // Nothing left for stop() to report.
    assert!(t.stop().unwrap().is_empty());
}

#[test]
fn stopping_the_timer_ends_its_sleeps_with_an_error() {
    let t = timer();
    let probe = Arc::new(Probe::default());
    let mut s = t.sleep(Duration::from_secs(3600));
    assert!(poll(&mut s, &probe).is_pending());
    t.stop().unwrap();
    wait_for("the sleep to be woken", || probe.0.load(Ordering::SeqCst));
    assert!(matches!(
        poll(&mut s, &probe),
        Poll::Ready(Err(TimerError::Stopped))
    ));
    // A sleep made after the stop fails at its first poll.
    let mut late = t.sleep(Duration::from_millis(1));
    assert!(matches!(
        poll(&mut late, &probe),
        Poll::Ready(Err(TimerError::Stopped))
    ));
}

#[test]
fn sleep_until_a_past_instant_completes_at_once_without_a_timeout() {
    let t = timer();
    let probe = Arc::new(Probe::default());
    let mut s = t.sleep_until(Instant::now());
    assert!(matches!(poll(&mut s, &probe), Poll::Ready(Ok(()))));
    assert_eq!(t.pending_timeouts(), 0);
}
