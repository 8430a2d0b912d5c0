//! A fleet sharing schedules: three separate OS processes (this test
//! binary, run as children) open one queue and declare the same 50
//! `every` schedules for a minute; one of them also takes every message
//! and counts it in Redis. A second one is SIGKILLed a third of the way
//! in, the third is SIGKILLed and started again two thirds of the way in.
//! Every occurrence of every schedule is delivered exactly once.
//!
//! The only long test of the suite (about 70 s): the three processes run
//! at once, the minute is the scenario.

mod support;

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, UNIX_EPOCH};

use redwheel::Redwheel;
use redwheel::schedule::{CatchUp, Schedule};
use support::{RedisServer, within};

const QUEUE: &str = "fleet";
const SCHEDULES: u64 = 50;
const MINUTE_MS: u64 = 60_000;
/// Per delivery: the id's count (outside redwheel's keys).
const COUNT: &str = "test:count";
/// Set when the children should exit.
const STOP: &str = "test:stop";

/// Schedule `s<i>` fires every `period(i)` ms.
fn period(i: u64) -> u64 {
    250 * (1 + i % 8)
}

/// Not a test of its own: a fleet process (this test binary, running
/// only this function). Declares the schedules and, if told to, takes
/// and counts every message, until `STOP` is set. Run directly, it does
/// nothing.
#[test]
fn child_fleet_process() {
    let (Ok(url), Ok(start)) = (
        std::env::var("REDWHEEL_FLEET_URL"),
        std::env::var("REDWHEEL_FLEET_START"),
    ) else {
        return;
    };
    let start: u64 = start.parse().unwrap();
    let consume = std::env::var("REDWHEEL_FLEET_CONSUME").is_ok();
    let rw = Redwheel::connect(&url).unwrap();
    let q = rw.queue::<String>(QUEUE).unwrap();
    for i in 0..SCHEDULES {
        // Every occurrence fires however late (a loaded machine may hold a
        // process up for longer than a period): this test counts.
        let s = Schedule::every(Duration::from_millis(period(i)))
            .starting_at(UNIX_EPOCH + Duration::from_millis(start))
            .until(UNIX_EPOCH + Duration::from_millis(start + MINUTE_MS))
            .catch_up(CatchUp::All { max: 10_000 });
        q.schedule(&format!("s{i}"), &s, &format!("s{i}")).unwrap();
    }
    let mut con = redis::Client::open(url.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    loop {
        let stop: bool = redis::cmd("EXISTS").arg(STOP).query(&mut con).unwrap();
        if stop {
            break;
        }
        if consume {
            // `poll` hands each message over once (this process is never
            // killed), so a count above 1 is an occurrence offered twice.
            while let Some(m) = q.poll(Duration::from_millis(200)).unwrap() {
                redis::cmd("HINCRBY")
                    .arg(COUNT)
                    .arg(m.id().as_str())
                    .arg(1)
                    .query::<i64>(&mut con)
                    .unwrap();
            }
        } else {
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    rw.shutdown(Duration::from_secs(10)).unwrap();
}

fn spawn(url: &str, start: u64, consume: bool) -> Child {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        "child_fleet_process",
        "--test-threads=1",
        "--quiet",
    ])
    .env("REDWHEEL_FLEET_URL", url)
    .env("REDWHEEL_FLEET_START", start.to_string())
    .stdout(Stdio::null())
    .stderr(Stdio::null());
    if consume {
        cmd.env("REDWHEEL_FLEET_CONSUME", "1");
    }
    cmd.spawn().unwrap()
}

fn wait_until_server_time(server: &RedisServer, ms: u64) {
    while server.time_ms() < ms {
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn counts(url: &str) -> HashMap<String, u64> {
    let mut con = redis::Client::open(url).unwrap().get_connection().unwrap();
    redis::cmd("HGETALL").arg(COUNT).query(&mut con).unwrap()
}

#[test]
fn three_processes_sharing_fifty_schedules_for_a_minute_deliver_each_occurrence_once() {
    let server = RedisServer::start();
    let url = server.url();
    // Time for the processes to start and declare before the first
    // occurrence.
    let start = server.time_ms() + 4_000;
    let mut consumer = spawn(&url, start, true);
    let mut killed = spawn(&url, start, false);
    let mut restarted = spawn(&url, start, false);
    wait_until_server_time(&server, start + MINUTE_MS / 3);
    killed.kill().unwrap(); // SIGKILL
    killed.wait().unwrap();
    wait_until_server_time(&server, start + 2 * MINUTE_MS / 3);
    restarted.kill().unwrap();
    restarted.wait().unwrap();
    let mut again = spawn(&url, start, false);
    wait_until_server_time(&server, start + MINUTE_MS);
    let expected: HashMap<String, u64> = (0..SCHEDULES)
        .flat_map(|i| {
            (0..=MINUTE_MS / period(i))
                .map(move |k| (format!("sched:s{i}:{}", start + k * period(i)), 1))
        })
        .collect();
    let got = within(Duration::from_secs(120), {
        let url = url.clone();
        let n = expected.len();
        move || loop {
            let got = counts(&url);
            if got.len() >= n {
                return got;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    // Nothing more falls due (every schedule ended): wait for a late
    // double, if any, to be counted, then stop the fleet.
    std::thread::sleep(Duration::from_secs(1));
    let got = {
        let later = counts(&url);
        assert!(later.len() >= got.len());
        later
    };
    server.cmd(&["SET", STOP, "1"]);
    assert!(
        consumer.wait().unwrap().success(),
        "the consumer process failed"
    );
    again.wait().unwrap();
    let missing: Vec<&String> = expected.keys().filter(|k| !got.contains_key(*k)).collect();
    let extra: Vec<&String> = got.keys().filter(|k| !expected.contains_key(*k)).collect();
    let doubled: Vec<(&String, &u64)> = got.iter().filter(|(_, n)| **n != 1).collect();
    assert!(
        missing.is_empty(),
        "occurrences never delivered: {missing:?}"
    );
    assert!(extra.is_empty(), "deliveries of no occurrence: {extra:?}");
    assert!(
        doubled.is_empty(),
        "occurrences delivered more than once: {doubled:?}"
    );
    assert_eq!(got.len(), expected.len());
}
