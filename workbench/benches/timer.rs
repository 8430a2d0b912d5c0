//! Criterion micro-benchmarks of the hashed wheel timer: small, fast
//! versions of the workloads of `shared/BENCHMARKS.md`.
//!
//! * `new_timeout`: scheduling on a running timer (W1-like; delays 1–60 s,
//!   so nothing fires while measuring).
//! * `new_timeout_cancel`: schedule then cancel at once (W2-like).
//! * `expiry`: a batch scheduled on a [`ManualClock`] timer and moved into
//!   the wheel beforehand; the measured `clock.advance(..)` fires all of it.
//!
//! The cross-implementation comparison (against Netty, same sitting) is
//! `examples/bench_timer.rs`; these benches are for tracking our own
//! changes. `cargo bench --bench timer` runs them; `cargo test --benches`
//! runs each once as a smoke test.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use redwheel::timer::{HashedWheelTimer, ManualClock, Timeout};

#[path = "../../examples/support/splitmix.rs"]
mod splitmix;

/// The shared no-op task's counter (only the worker thread touches it).
static FIRED: AtomicU64 = AtomicU64::new(0);

fn bump() {
    FIRED.store(FIRED.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
}

/// SplitMix64 delays in `[lo, hi]` ms, as in the workload definitions.
fn delays(n: usize, lo: u64, hi: u64, seed: u64) -> Vec<Duration> {
    splitmix::delays_ms(n, lo, hi, seed)
        .into_iter()
        .map(Duration::from_millis)
        .collect()
}

fn started_timer() -> HashedWheelTimer {
    let timer = HashedWheelTimer::builder()
        .tick_duration(Duration::from_millis(1))
        .ticks_per_wheel(512)
        .build()
        .expect("build");
    timer.start().expect("start");
    timer
}

/// W1/W2-like: each sample gets a fresh timer (so the pending set stays
/// bounded), and only the scheduling loop is timed.
fn schedule(c: &mut Criterion) {
    let delays = delays(1 << 16, 1000, 60_000, 42);
    let mut g = c.benchmark_group("timer");
    g.sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .throughput(Throughput::Elements(1));
    g.bench_function("new_timeout", |b| {
        b.iter_custom(|iters| {
            let timer = started_timer();
            let t0 = Instant::now();
            for i in 0..iters as usize {
                let t = timer.new_timeout(delays[i & 0xFFFF], |_: &Timeout| bump());
                black_box(t.expect("new_timeout"));
            }
            let elapsed = t0.elapsed();
            drop(timer.stop());
            elapsed
        })
    });
    g.bench_function("new_timeout_cancel", |b| {
        b.iter_custom(|iters| {
            let timer = started_timer();
            let t0 = Instant::now();
            for i in 0..iters as usize {
                let t = timer.new_timeout(delays[i & 0xFFFF], |_: &Timeout| bump());
                black_box(t.expect("new_timeout").cancel());
            }
            let elapsed = t0.elapsed();
            drop(timer.stop());
            elapsed
        })
    });
    g.finish();
}

/// Expiry throughput: `BATCH` timeouts due over the next 256 ticks are
/// scheduled and transferred into the wheel (one untimed tick), then a
/// timed `advance` runs every one of them.
fn expiry(c: &mut Criterion) {
    const BATCH: usize = 10_000;
    let delays = delays(BATCH, 2, 257, 43);
    let clock = ManualClock::new();
    let timer = HashedWheelTimer::builder()
        .tick_duration(Duration::from_millis(1))
        .ticks_per_wheel(512)
        .clock(clock.clone())
        .build()
        .expect("build");
    timer.start().expect("start");
    let mut g = c.benchmark_group("timer");
    g.sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
        .throughput(Throughput::Elements(BATCH as u64));
    g.bench_function("expiry_10k", |b| {
        b.iter_batched(
            || {
                for &d in &delays {
                    timer
                        .new_timeout(d, |_: &Timeout| bump())
                        .expect("new_timeout");
                }
                // One tick: the worker moves the batch into the buckets.
                clock.advance(Duration::from_millis(1));
                assert_eq!(timer.pending_timeouts(), BATCH);
            },
            |()| {
                clock.advance(Duration::from_millis(300));
                assert_eq!(timer.pending_timeouts(), 0);
            },
            BatchSize::PerIteration,
        )
    });
    g.finish();
    drop(timer.stop());
}

criterion_group!(benches, schedule, expiry);
criterion_main!(benches);
