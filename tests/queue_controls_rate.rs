//! The fleet-wide rate limit over a minute: 4 consumer processes (each a
//! consumer pool of 4 workers) drain a backlog far larger than the limit
//! allows. Every delivery's time comes from the server's clock (the
//! claim's visibility deadline minus the visibility, both set by the claim
//! script from `TIME`). No interval of length `per` may hold more than
//! `max` of them, and over 60 s the rate must be within 5 % of the limit.
//! This is the one long test of the controls (about 70 s).

mod queue_controls_common;
mod support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use queue_controls_common::{Fleet, connection, ready_and_wait, report, results, role, wait_until};
use redwheel::{ConsumerOptions, QueueOptions, Redwheel};
use support::{RedisServer, within};

const MAX: u64 = 100;
const PER: Duration = Duration::from_secs(1);
const RUN: Duration = Duration::from_secs(60);
const VISIBILITY: Duration = Duration::from_secs(300);

/// A consumer process: records the server time of every claim until told
/// to stop, then reports them.
#[test]
fn child_role() {
    let Some((url, _)) = role("rate-consumer") else {
        return;
    };
    let rw = Redwheel::connect(&url).unwrap();
    let q = rw
        .queue_with::<String>("limited", QueueOptions::default().visibility(VISIBILITY))
        .unwrap();
    let times = Arc::new(Mutex::new(Vec::new()));
    let mut con = connection(&url);
    let c = {
        let times = Arc::clone(&times);
        q.consume(ConsumerOptions::default().concurrency(4), move |d| {
            let until = d.visible_until().duration_since(UNIX_EPOCH).unwrap();
            times
                .lock()
                .unwrap()
                .push((until - VISIBILITY).as_millis() as u64);
            Ok::<(), String>(())
        })
        .unwrap()
    };
    ready_and_wait(&mut con);
    let _: Option<(String, String)> = redis::cmd("BLPOP")
        .arg("test:stop")
        .arg(600)
        .query(&mut con)
        .unwrap();
    c.shutdown(Duration::from_secs(10)).unwrap();
    let lines: Vec<String> = times.lock().unwrap().iter().map(u64::to_string).collect();
    report(&mut con, "test:times", &lines);
}

#[test]
fn four_consumer_processes_stay_within_the_sliding_window_and_at_the_limit_for_a_minute() {
    let server = RedisServer::start();
    let url = server.url();
    let rw = server.connect();
    let q = rw
        .queue_with::<String>(
            "limited",
            QueueOptions::default()
                .rate_limit(MAX as u32, PER)
                .visibility(VISIBILITY),
        )
        .unwrap();
    // Far more than a minute's worth, all due now.
    let backlog = 10_000;
    let batch: Vec<(String, Duration)> = (0..backlog)
        .map(|i| (format!("m{i}"), Duration::ZERO))
        .collect();
    q.offer_batch(&batch).unwrap();
    let mut fleet = Fleet::spawn("child_role", "rate-consumer", &url, 4, &[]);
    fleet.go();
    // Run until a little more than the measured minute has been delivered.
    let inspector = rw.inspect_queue("limited").unwrap();
    let enough = MAX * (RUN.as_secs() + 3);
    wait_until(RUN * 3, "a minute and more of deliveries", || {
        inspector.counters().unwrap().delivered >= enough
    });
    let mut con = connection(&url);
    let stops = vec!["stop"; 4];
    let _: () = redis::cmd("RPUSH")
        .arg("test:stop")
        .arg(&stops)
        .query(&mut con)
        .unwrap();
    within(Duration::from_secs(120), move || fleet.wait());
    let mut times: Vec<u64> = results(&mut con, "test:times")
        .iter()
        .map(|t| t.parse().unwrap())
        .collect();
    times.sort_unstable();
    assert!(
        times.len() as u64 >= enough,
        "{} deliveries recorded",
        times.len()
    );
    // Never more than MAX in any interval of length PER (ms times are the
    // server's µs floored, which keeps every gap of PER or more at PER or
    // more).
    let per = PER.as_millis() as u64;
    let m = MAX as usize;
    let worst = times.windows(m + 1).map(|w| w[m] - w[0]).min().unwrap();
    assert!(
        worst >= per,
        "{} deliveries within {worst} ms (limit {MAX} per {per} ms)",
        m + 1
    );
    // The long-run rate over the first minute: within 5 % of the limit.
    let t0 = times[0];
    let in_run = times
        .iter()
        .filter(|&&t| t < t0 + RUN.as_millis() as u64)
        .count() as f64;
    let limit = (MAX * RUN.as_secs()) as f64;
    let ratio = in_run / limit;
    eprintln!(
        "{} deliveries; closest {} apart: {worst} ms; first minute: {in_run} ({:.2} % of the limit)",
        times.len(),
        m + 1,
        ratio * 100.0
    );
    assert!(
        (0.95..=1.0).contains(&ratio),
        "{in_run} deliveries in {RUN:?}: {:.1} % of the limit",
        ratio * 100.0
    );
}
