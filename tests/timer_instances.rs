//! HWT-C11, the live-timer warning, in a test binary of its own: the count of
//! live timers and the "already warned" flag are process-wide, so no other
//! test may create timers in this process.

use std::time::Duration;

use redwheel::timer::{HashedWheelTimer, INSTANCE_COUNT_LIMIT, TimerError};

mod timer_common;
use timer_common::{LogBuf, TestResult};

fn build_timers(n: usize) -> Result<Vec<HashedWheelTimer>, TimerError> {
    (0..n)
        .map(|_| HashedWheelTimer::builder().build())
        .collect()
}

// HWT-C11: more than 64 live timers log one warning, once per process. A
// timer stops counting when stopped (started or not) or dropped, and a
// failed build never counts.
#[test]
fn more_than_64_live_timers_warn_once_and_stopped_or_dropped_ones_stop_counting() -> TestResult {
    assert_eq!(INSTANCE_COUNT_LIMIT, 64);
    let log = LogBuf::default();
    let subscriber = {
        let log = log.clone();
        tracing_subscriber::fmt()
            .with_writer(move || log.clone())
            .with_ansi(false)
            .finish()
    };
    tracing::subscriber::with_default(subscriber, || -> TestResult {
        let warnings = || log.lines_with("more than 64");

        // 64 timers, then each quarter leaves a different way: stopped after
        // start, stopped unstarted (handles kept alive), dropped after start,
        // dropped unstarted.
        let mut stopped_but_alive = build_timers(64)?;
        for (i, timer) in stopped_but_alive.iter().enumerate() {
            if i % 2 == 0 {
                timer.start()?;
            }
        }
        let dropped = stopped_but_alive.split_off(32);
        for timer in &stopped_but_alive {
            assert!(timer.stop()?.is_empty());
        }
        drop(dropped);
        for _ in 0..10 {
            let failed = HashedWheelTimer::builder()
                .tick_duration(Duration::ZERO)
                .build();
            assert!(failed.is_err());
        }
        assert!(warnings().is_empty(), "{:?}", warnings());

        // Had any of those still counted, this would pass the limit.
        let mut live = build_timers(64)?;
        assert!(warnings().is_empty(), "{:?}", warnings());

        live.push(HashedWheelTimer::builder().build()?);
        let lines = warnings();
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(lines[0].contains("WARN"), "{}", lines[0]);
        assert!(lines[0].contains("live=65"), "{}", lines[0]);

        live.push(HashedWheelTimer::builder().build()?);
        assert_eq!(warnings().len(), 1, "warned twice");

        drop(live);
        drop(stopped_but_alive);
        let again = build_timers(65)?;
        assert_eq!(warnings().len(), 1, "the warning is once per process");
        drop(again);
        Ok(())
    })
}
