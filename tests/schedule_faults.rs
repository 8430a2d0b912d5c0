//! Recurring schedules through real faults, against real redis-server
//! processes: Redis killed and restarted (`appendfsync always`) mid-run,
//! the reply of a firing lost on the wire (the driver's retry after an
//! unknown outcome), ten seconds with no process running (each catch-up
//! policy), and a schedule's definition replaced over and over while
//! several runtimes fire it. No occurrence is offered twice, none is lost.
//!
//! Deliveries are recorded by a consumer pool in Redis itself: every id in
//! a set, and per id how many first deliveries (attempt 1) it had. A
//! second first delivery of one id can only be a second message: a
//! doubled firing. (A claim whose reply was lost is delivered again with
//! a higher attempt; with `appendfsync always` a reply the client got is
//! on disk.)

mod support;

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::{Duration, UNIX_EPOCH};

use redwheel::schedule::{CatchUp, Schedule, parse_occurrence_id};
use redwheel::{Consumer, ConsumerOptions, Queue, Redwheel};
use support::proxy::{Fault, Proxy, Rule};
use support::{RedisServer, within};

const HANG: Duration = Duration::from_secs(120);
const SEEN: &str = "test:seen";
const FIRST: &str = "test:first";

fn at_ms(ms: u64) -> std::time::SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

/// Consumes `q`, recording each delivery in Redis at `url` (outside
/// redwheel's keys), in one MULTI: the id in `SEEN`, and a first delivery
/// counted in `FIRST`.
fn record_all(q: &Queue<String>, url: &str) -> Consumer {
    let client = redis::Client::open(url).unwrap();
    let con: Mutex<Option<redis::Connection>> = Mutex::new(None);
    q.consume(
        ConsumerOptions::default()
            .concurrency(4)
            .retry_backoff(Duration::from_millis(10), Duration::from_millis(50)),
        move |d| {
            let mut con = con.lock().unwrap();
            if con.is_none() {
                *con = Some(client.get_connection().map_err(|e| e.to_string())?);
            }
            let mut pipe = redis::pipe();
            pipe.atomic().sadd(SEEN, d.id().as_str());
            if d.attempt() == 1 {
                pipe.hincr(FIRST, d.id().as_str(), 1);
            }
            let r: redis::RedisResult<()> = pipe.query(con.as_mut().unwrap());
            r.map_err(|e| {
                *con = None;
                e.to_string()
            })
        },
    )
    .unwrap()
}

/// What was recorded: the ids seen, and the first-delivery counts.
fn recorded(url: &str) -> (BTreeSet<String>, HashMap<String, u64>) {
    let mut con = redis::Client::open(url).unwrap().get_connection().unwrap();
    let seen: BTreeSet<String> = redis::cmd("SMEMBERS").arg(SEEN).query(&mut con).unwrap();
    let first: HashMap<String, u64> = redis::cmd("HGETALL").arg(FIRST).query(&mut con).unwrap();
    (seen, first)
}

/// Waits until every id of `expected` was recorded, or the hang guard
/// ran out (the caller's assertions then say what is missing).
fn wait_recorded(url: &str, expected: &BTreeSet<String>) {
    let give_up = std::time::Instant::now() + HANG;
    while std::time::Instant::now() < give_up {
        if let Ok(client) = redis::Client::open(url)
            && let Ok(mut con) = client.get_connection()
            && let Ok(seen) = redis::cmd("SMEMBERS")
                .arg(SEEN)
                .query::<BTreeSet<String>>(&mut con)
            && seen.is_superset(expected)
        {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The ids of `every(period)` schedules named `s<i>`, all from `start` to
/// `until`.
fn expected_ids(periods: &[u64], start: u64, until: u64) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (i, p) in periods.iter().enumerate() {
        let mut t = start;
        while t <= until {
            out.insert(format!("sched:s{i}:{t}"));
            t += p;
        }
    }
    out
}

/// Declares the `every(period)` schedules `s<i>` from `start` to `until`,
/// firing every occurrence however late (`CatchUp::All`), so that an outage
/// makes them late, never skipped.
fn declare(q: &Queue<String>, periods: &[u64], start: u64, until: u64) {
    for (i, p) in periods.iter().enumerate() {
        let s = Schedule::every(Duration::from_millis(*p))
            .starting_at(at_ms(start))
            .until(at_ms(until))
            .catch_up(CatchUp::All { max: 10_000 });
        q.schedule(&format!("s{i}"), &s, &format!("s{i}")).unwrap();
    }
}

/// Every id expected was seen, none else, and none was first-delivered
/// twice.
fn assert_each_once(url: &str, expected: &BTreeSet<String>) {
    let (seen, first) = recorded(url);
    let missing: Vec<&String> = expected.difference(&seen).collect();
    let extra: Vec<&String> = seen.difference(expected).collect();
    assert!(missing.is_empty(), "occurrences lost: {missing:?}");
    assert!(
        extra.is_empty(),
        "occurrences that should not exist: {extra:?}"
    );
    let doubled: Vec<(&String, &u64)> = first.iter().filter(|(_, n)| **n > 1).collect();
    assert!(doubled.is_empty(), "occurrences offered twice: {doubled:?}");
}

#[test]
fn redis_killed_and_restarted_with_appendfsync_always_loses_and_doubles_no_occurrence() {
    let mut server = RedisServer::with_appendonly();
    let url = server.url();
    let rw = Redwheel::connect(&url).unwrap();
    let q = rw.queue::<String>("restart").unwrap();
    let periods: Vec<u64> = (0..10).map(|i| 100 + 20 * i).collect();
    let start = server.time_ms() + 300;
    let until = start + 4_000;
    declare(&q, &periods, start, until);
    let consumer = record_all(&q, &url);
    // Kill it while the schedules fire, then bring it back.
    while server.time_ms() < start + 1_500 {
        std::thread::sleep(Duration::from_millis(10));
    }
    server.kill();
    std::thread::sleep(Duration::from_millis(500));
    server.restart();
    let expected = expected_ids(&periods, start, until);
    wait_recorded(&url, &expected);
    consumer.shutdown(Duration::from_secs(10)).unwrap();
    assert_each_once(&url, &expected);
}

#[test]
fn a_firing_whose_reply_was_lost_is_not_applied_twice_when_the_driver_runs_it_again() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let rw = Redwheel::connect(&proxy.url()).unwrap();
    let q = rw.queue::<String>("lost").unwrap();
    let periods = [50, 70, 110];
    let start = server.time_ms() + 300;
    let until = start + 1_500;
    declare(&q, &periods, start, until);
    // Three firings run on the server, their replies never reach the
    // driver, and its connection is reset each time: it reconnects and
    // runs every job again, planning from what it knew before.
    let fire = redis::Script::new(concat!(
        include_str!("../lua/head.lua"),
        include_str!("../lua/schedule_lib.lua"),
        include_str!("../lua/schedule_fire.lua")
    ));
    let rule = proxy.inject(
        Rule::new(Fault::LoseReply)
            .matching(fire.get_hash())
            .times(3),
    );
    let consumer = record_all(&q, &server.url());
    assert!(
        rule.wait_fired(3, HANG),
        "three firings ran and lost their reply"
    );
    let expected = expected_ids(&periods, start, until);
    wait_recorded(&server.url(), &expected);
    consumer.shutdown(Duration::from_secs(10)).unwrap();
    assert_each_once(&server.url(), &expected);
}

#[test]
fn after_ten_seconds_with_no_process_running_each_catch_up_policy_is_followed() {
    let server = RedisServer::start();
    let period = 1_000;
    let policies = [
        ("skip", CatchUp::Skip),
        ("latest", CatchUp::Latest),
        ("all3", CatchUp::All { max: 3 }),
        ("all100", CatchUp::All { max: 100 }),
    ];
    let rw = server.connect();
    let q = rw.queue::<String>("downtime").unwrap();
    for (name, policy) in policies {
        let s = Schedule::every(Duration::from_millis(period)).catch_up(policy);
        q.schedule(name, &s, &name.to_string()).unwrap();
    }
    // One occurrence of each fires while the process runs.
    let mut last_before: HashMap<String, u64> = HashMap::new();
    within(HANG, {
        let q = q.clone();
        move || {
            while last_before.len() < policies.len() {
                let m = q.take().unwrap();
                let (name, at) = parse_occurrence_id(m.id().as_str()).unwrap();
                let ms = at.duration_since(UNIX_EPOCH).unwrap().as_millis() as u64;
                last_before.insert(name.to_owned(), ms);
            }
        }
    });
    rw.shutdown(Duration::from_secs(10)).unwrap();
    // What was fired last before the downtime, as Redis has it.
    let inspector = server.connect();
    let last: HashMap<String, u64> = inspector
        .inspect_schedules("downtime")
        .unwrap()
        .into_iter()
        .map(|i| {
            let ms = i.last_fired.unwrap().duration_since(UNIX_EPOCH).unwrap();
            (i.name, ms.as_millis() as u64)
        })
        .collect();
    drop(inspector);
    // Ten seconds with no process; come back 200 ms after an occurrence,
    // so that the catch-up is planned well before the next one.
    std::thread::sleep(Duration::from_secs(10));
    while server.time_ms() % period < 200 || server.time_ms() % period > 300 {
        std::thread::sleep(Duration::from_millis(5));
    }
    let back = server.time_ms();
    let rw = server.connect();
    let q = rw.queue::<String>("downtime").unwrap();
    // Everything fired in the catch-up is at or before `back`; then one
    // regular occurrence of each schedule after it.
    let mut fired: HashMap<String, Vec<u64>> = HashMap::new();
    let q2 = q.clone();
    let fired = within(HANG, move || {
        let mut regular = 0;
        while regular < policies.len() {
            let m = q2.take().unwrap();
            let (name, at) = parse_occurrence_id(m.id().as_str()).unwrap();
            let ms = at.duration_since(UNIX_EPOCH).unwrap().as_millis() as u64;
            if ms > back {
                regular += 1;
            }
            fired.entry(name.to_owned()).or_default().push(ms);
        }
        fired
    });
    // Per policy: how many occurrences after the last one before the
    // downtime were never offered, and whether the rest follow each other.
    let missed = |name: &str| {
        let mut got = fired[name].clone();
        got.sort();
        for w in got.windows(2) {
            assert_eq!(
                w[1] - w[0],
                period,
                "{name}: no gap after the catch-up: {got:?}"
            );
        }
        (got[0] - last[name]) / period - 1
    };
    let (skip, latest, all3, all100) = (
        missed("skip"),
        missed("latest"),
        missed("all3"),
        missed("all100"),
    );
    // At least nine occurrences fell in the ten seconds.
    assert!(latest >= 8, "latest skipped {latest}");
    // Skip fires the latest (one second late is within the misfire grace),
    // as Latest does; All { max: 3 } the three latest; All { max: 100 }
    // every one of them.
    assert_eq!(skip, latest, "skip");
    assert_eq!(all3 + 2, latest, "all3");
    assert_eq!(all100, 0, "all100");
    rw.shutdown(Duration::from_secs(10)).unwrap();
}

#[test]
fn replacing_a_definition_while_it_fires_offers_each_occurrence_of_each_definition_once() {
    let server = RedisServer::start();
    let firing: Vec<Redwheel> = (0..3).map(|_| server.connect()).collect();
    let queues: Vec<Queue<String>> = firing
        .iter()
        .map(|rw| rw.queue::<String>("replace").unwrap())
        .collect();
    let q = queues[0].clone();
    // Two definitions, told apart by their payload and by their grid: 50 ms
    // and 70 ms from the epoch (an occurrence on both grids is one of
    // either).
    let defs = [(50u64, "fifty"), (70, "seventy")];
    let mut changes: Vec<(u64, u64, usize)> = Vec::new(); // (before, after, def)
    let consumer = std::thread::spawn({
        let q = q.clone();
        move || {
            let mut got = Vec::new();
            while let Some(m) = q.poll(Duration::from_millis(1_500)).unwrap() {
                got.push((m.id().to_string(), m.payload().clone()));
            }
            got
        }
    });
    for round in 0..12 {
        let d = round % 2;
        let (period, payload) = defs[d];
        // Late occurrences fire too (on a loaded machine a firing may be
        // later than a period): the test is about which definition fires.
        let s = Schedule::every(Duration::from_millis(period)).catch_up(CatchUp::All { max: 100 });
        let before = server.time_ms();
        queues[round % queues.len()]
            .schedule("x", &s, &payload.to_string())
            .unwrap();
        let after = server.time_ms();
        changes.push((before, after, d));
        std::thread::sleep(Duration::from_millis(250));
    }
    // The last definition stays a second longer; then stop it and let the
    // last firings be consumed.
    std::thread::sleep(Duration::from_millis(1_200));
    queues[0].unschedule("x").unwrap();
    let stopped = server.time_ms();
    let got = consumer.join().unwrap();
    let occurrence = |id: &str| {
        let (_, at) = parse_occurrence_id(id).unwrap();
        at.duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
    };
    let def_of = |payload: &str| defs.iter().position(|(_, p)| *p == payload).unwrap();
    let mut ids = BTreeSet::new();
    for (id, payload) in &got {
        assert!(ids.insert(id.clone()), "{id} offered twice");
        let (period, _) = defs[def_of(payload)];
        assert_eq!(
            occurrence(id) % period,
            0,
            "{id} ({payload}) is on its definition's grid"
        );
    }
    // No definition fires inside a span where the other one was in force:
    // a plan made with a replaced definition is refused, and the new one
    // takes over at most from just before what the old one still owed.
    for (i, &(_, after, d)) in changes.iter().enumerate() {
        let end = changes.get(i + 1).map_or(stopped, |c| c.0);
        for (id, payload) in &got {
            let t = occurrence(id);
            if t > after && t < end {
                assert_eq!(
                    def_of(payload),
                    d,
                    "{id} ({payload}) fired inside a span of {} ({after}..{end})",
                    defs[d].1
                );
            }
        }
    }
    // The last definition, in force for over a second: every occurrence of
    // it fired (but those of the last half second, which the removal may
    // have overtaken on a loaded machine).
    let &(_, after, d) = changes.last().unwrap();
    let (period, payload) = defs[d];
    let mut t = (after / period + 1) * period;
    while t + 500 < stopped {
        let id = format!("sched:x:{t}");
        assert!(
            got.iter().any(|(g, p)| *g == id && p == payload),
            "{id} of {payload} (in force from {after} to {stopped}) was never offered"
        );
        t += period;
    }
    drop(firing);
}
