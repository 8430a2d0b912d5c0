//! Criterion micro-benchmarks of `redwheel::schedule`: the cost of
//! `next_after` and `plan`, which the queue side's driver calls once per
//! schedule per occurrence (10,000 schedules is the S2 workload of
//! `shared/BENCHMARKS.md`).
//!
//! * `next_after/<case>`: one call, from instants spread over a year (so
//!   the zone lookups are not all for one transition);
//! * `next_after_10k_schedules`: one pass over 10,000 schedules (a mix of
//!   cron expressions in five zones and periods), as a driver would make;
//! * `plan/<case>`: an on-time plan (one occurrence due).
//!
//! `cargo bench --bench schedule` runs them; `cargo test --benches` runs
//! each once as a smoke test.

use std::hint::black_box;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use redwheel::schedule::Schedule;

/// 2026-01-01T00:00:00Z.
const YEAR_START: u64 = 1_767_225_600;

/// `n` instants spread over 2026, a prime number of seconds apart.
fn instants(n: usize) -> Vec<SystemTime> {
    (0..n as u64)
        .map(|i| UNIX_EPOCH + Duration::from_secs(YEAR_START + (i * 3_155_693) % 31_536_000))
        .collect()
}

fn cron(expr: &str, zone: &str) -> Schedule {
    Schedule::cron(expr).unwrap().time_zone(zone).unwrap()
}

fn cases() -> Vec<(&'static str, Schedule)> {
    vec![
        ("cron_daily_berlin", cron("0 3 * * *", "Europe/Berlin")),
        (
            "cron_quarter_hour_berlin",
            cron("*/15 * * * *", "Europe/Berlin"),
        ),
        (
            "cron_weekdays_new_york",
            cron("30 9 * * mon-fri", "America/New_York"),
        ),
        ("cron_daily_utc", cron("0 3 * * *", "UTC")),
        ("cron_seconds_utc", cron("*/10 * * * * *", "UTC")),
        (
            "cron_first_monday_berlin",
            cron("0 8 1-7 * *", "Europe/Berlin"),
        ),
        ("every_30s", Schedule::every(Duration::from_secs(30))),
    ]
}

fn next_after(c: &mut Criterion) {
    let ts = instants(1024);
    let mut group = c.benchmark_group("next_after");
    group.throughput(Throughput::Elements(1));
    for (name, s) in cases() {
        let mut i = 0;
        group.bench_function(name, |b| {
            b.iter(|| {
                i = (i + 1) & 1023;
                black_box(s.next_after(black_box(ts[i])))
            })
        });
    }
    group.finish();
}

fn next_after_10k_schedules(c: &mut Criterion) {
    let exprs = [
        "0 3 * * *",
        "*/15 * * * *",
        "30 9 * * mon-fri",
        "0 */2 * * *",
        "0 0 1 * *",
    ];
    let zones = [
        "Europe/Berlin",
        "America/New_York",
        "Asia/Kolkata",
        "Australia/Lord_Howe",
        "UTC",
    ];
    let schedules: Vec<Schedule> = (0..10_000)
        .map(|i| {
            if i % 5 == 4 {
                Schedule::every(Duration::from_secs(1 + i as u64 % 3600))
            } else {
                cron(exprs[i % exprs.len()], zones[(i / 5) % zones.len()])
            }
        })
        .collect();
    let now = UNIX_EPOCH + Duration::from_secs(YEAR_START + 7_000_000);
    let mut group = c.benchmark_group("next_after_10k_schedules");
    group.throughput(Throughput::Elements(schedules.len() as u64));
    group.bench_function("mixed", |b| {
        b.iter(|| {
            let mut earliest = None;
            for s in &schedules {
                if let Some(n) = s.next_after(black_box(now)) {
                    earliest = Some(earliest.map_or(n, |e: SystemTime| e.min(n)));
                }
            }
            black_box(earliest)
        })
    });
    group.finish();
}

fn plan(c: &mut Criterion) {
    let ts = instants(1024);
    let mut group = c.benchmark_group("plan");
    group.throughput(Throughput::Elements(1));
    for (name, s) in cases() {
        // The occurrence before each instant is due, planned 2 ms late.
        let due: Vec<(SystemTime, SystemTime)> = ts
            .iter()
            .map(|&t| {
                let last = s.last_at_or_before(t).unwrap();
                (
                    last - Duration::from_millis(1),
                    last + Duration::from_millis(2),
                )
            })
            .collect();
        let mut i = 0;
        group.bench_function(name, |b| {
            b.iter(|| {
                i = (i + 1) & 1023;
                let (after, now) = due[i];
                black_box(s.plan(black_box(after), black_box(now)))
            })
        });
    }
    group.finish();
}

criterion_group!(benches, next_after, next_after_10k_schedules, plan);
criterion_main!(benches);
