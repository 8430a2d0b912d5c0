//! The guard sweep against a real redis-server: one cheap read per queue
//! (an `HMGET` of the queue's `head` hash: `due` and `schedules`) rather than the
//! transfer script, and still every guarantee the full sweep gave: a
//! message whose wake-up was lost, a claim whose claimer died, and a
//! schedule whose announcement was lost are all found within a guard
//! interval by a process that heard nothing of them.

mod support;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redwheel::schedule::Schedule;
use redwheel::{Queue, QueueOptions, Redwheel};
use support::{RedisServer, within};

const HANG: Duration = Duration::from_secs(60);
const GUARD: Duration = Duration::from_millis(50);

/// Where nobody listens: a wake-up sent here is a lost one.
const NOWHERE: &str = "redwheel:{sweep}:nowhere";

/// Opens the queue and waits for its first run (a full one, at open), so
/// that what the test does next is known to it only through its sweeps.
fn open(rw: &Redwheel) -> Queue<String> {
    let q = rw
        .queue_with::<String>("sweep", QueueOptions::default().guard_interval(GUARD))
        .unwrap();
    within(HANG, {
        let q = q.clone();
        move || {
            while q.transfer_stats().runs == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    });
    q
}

/// Runs `script` (sources concatenated as `src/scripts.rs` builds it) with
/// `keys` and `args` on a plain connection.
fn run_script(
    server: &RedisServer,
    sources: &[&str],
    keys: &[&str],
    args: &[&str],
) -> redis::Value {
    let mut con = redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let script = redis::Script::new(&sources.concat());
    let mut inv = script.prepare_invoke();
    for k in keys {
        inv.key(*k);
    }
    for a in args {
        inv.arg(*a);
    }
    inv.invoke(&mut con).unwrap()
}

#[test]
fn an_idle_queue_is_swept_with_one_hmget_and_no_script() {
    let server = RedisServer::start();
    let rw = server.connect();
    let q = open(&rw);
    q.offer(&"later".to_string(), Duration::from_secs(3_600))
        .unwrap();
    // Let the start-up runs settle, then count over about 20 sweeps.
    std::thread::sleep(GUARD * 4);
    let (hmget, evalsha) = (server.calls("hmget"), server.calls("evalsha"));
    std::thread::sleep(GUARD * 20);
    let sweeps = server.calls("hmget") - hmget;
    assert!(sweeps >= 2, "the sweeps ran: {sweeps} HMGETs");
    assert_eq!(
        server.calls("evalsha"),
        evalsha,
        "an idle queue's sweep runs no script"
    );
}

#[test]
fn a_message_whose_wake_up_was_lost_is_moved_by_the_guard_sweep() {
    let server = RedisServer::start();
    let rw = server.connect();
    let q = open(&rw);
    // Offered by offer.lua itself, with its wake-up sent where nobody
    // listens.
    let added = run_script(
        &server,
        &offer_sources(false),
        &OFFER_KEYS,
        &["r", "100", "lost", "payload"],
    );
    assert!(matches!(added, redis::Value::Int(due) if due > 0));
    let m = within(HANG, move || q.poll(Duration::from_secs(30)).unwrap());
    assert_eq!(m.expect("moved by the sweep").id().as_str(), "lost");
}

#[test]
fn a_claim_whose_claimer_died_is_redelivered_by_another_processes_sweep() {
    let server = RedisServer::start();
    let rw = server.connect();
    let q = open(&rw);
    // A message ready already (as a transfer leaves it), so that nothing
    // but the claim below touches the queue's deadlines.
    server.cmd(&["HSET", "redwheel:{sweep}:msg", "work", "0:work"]);
    server.cmd(&["RPUSH", "redwheel:{sweep}:ready", "work"]);
    // Another process claims it and dies: its own deadline for the claim
    // dies with it, and no wake-up announces a claim.
    let dying = server.connect();
    let d = dying
        .queue_with::<String>(
            "sweep",
            QueueOptions::default().visibility(Duration::from_millis(200)),
        )
        .unwrap()
        .claim(Duration::from_secs(10))
        .unwrap()
        .expect("claimed");
    assert_eq!(d.attempt(), 1);
    std::mem::forget(d);
    dying.shutdown(Duration::from_secs(5)).unwrap();
    let again = within(HANG, move || q.claim(Duration::from_secs(30)).unwrap())
        .expect("redelivered after the visibility, found by the sweep");
    assert_eq!(again.payload(), "work");
    assert_eq!(again.attempt(), 2);
}

#[test]
fn a_schedule_whose_announcement_was_lost_fires_after_the_guard_sweep() {
    let server = RedisServer::start();
    let rw = server.connect();
    let q = open(&rw);
    assert!(q.schedules().unwrap().is_empty());
    // Created by schedule_set.lua itself, announced where nobody listens.
    let now = server.time_ms();
    let first = now + 200;
    let s = Schedule::every(Duration::from_secs(3_600))
        .starting_at(UNIX_EPOCH + Duration::from_millis(first));
    let set = run_script(
        &server,
        &[
            include_str!("../lua/schedule_lib.lua"),
            include_str!("../lua/schedule_set.lua"),
        ],
        &[
            "redwheel:{sweep}:schedules",
            "redwheel:{sweep}:schedules:payload",
            "redwheel:{sweep}:schedules:next",
            "redwheel:{sweep}:schedules:last",
            "redwheel:{sweep}:schedules:changes",
            "redwheel:{sweep}:head",
            NOWHERE,
            "redwheel:{sweep}:schedules:ahead",
            "redwheel:{sweep}:delayed",
            "redwheel:{sweep}:msg",
        ],
        &[
            "hourly",
            &s.definition(),
            "quiet",
            &now.to_string(),
            &first.to_string(),
        ],
    );
    assert!(
        matches!(&set, redis::Value::Array(v) if v[0] == redis::Value::Int(1)),
        "{set:?}"
    );
    let m = within(HANG, move || q.poll(Duration::from_secs(30)).unwrap())
        .expect("fired after the sweep found the new version");
    assert_eq!(m.id().as_str(), format!("sched:hourly:{first}"));
    assert_eq!(m.payload(), "quiet");
    let _ = SystemTime::now();
}

/// `offer.lua`'s keys for queue `sweep`, in its order (the wake-up
/// channel where nobody listens).
const OFFER_KEYS: [&str; 7] = [
    "redwheel:{sweep}:delayed",
    "redwheel:{sweep}:msg",
    NOWHERE,
    "redwheel:{sweep}:head",
    "redwheel:{sweep}:controls",
    "redwheel:{sweep}:dead",
    "redwheel:{sweep}:ready",
];

/// `offer.lua` or (`batch`) `offer_batch.lua`, as scripts.rs builds them.
fn offer_sources(batch: bool) -> [&'static str; 3] {
    [
        include_str!("../lua/head.lua"),
        include_str!("../lua/offer_lib.lua"),
        if batch {
            include_str!("../lua/offer_batch.lua")
        } else {
            include_str!("../lua/offer.lua")
        },
    ]
}

#[test]
fn a_message_due_now_goes_straight_to_ready_when_nothing_is_due_in_delayed() {
    // No process has the queue open: no transfer runs, so where the
    // script put the messages is where they are.
    let server = RedisServer::start();
    server.cmd(&["ZADD", "redwheel:{sweep}:delayed", "9999999999999", "later"]);
    server.cmd(&[
        "HSET",
        "redwheel:{sweep}:msg",
        "later",
        "9999999999999:later",
    ]);
    let added = run_script(
        &server,
        &offer_sources(false),
        &OFFER_KEYS,
        &["r", "0", "now", "p"],
    );
    assert!(matches!(added, redis::Value::Int(due) if due > 0));
    let batch = run_script(
        &server,
        &offer_sources(true),
        &OFFER_KEYS,
        &["r", "n", "0", "b1", "p", "60000", "b2", "p", "0", "b3", "p"],
    );
    assert_eq!(batch, redis::Value::Int(3));
    assert_eq!(
        server.cmd(&["LRANGE", "redwheel:{sweep}:ready", "0", "-1"]),
        "*3\r\n$3\r\nnow\r\n$2\r\nb1\r\n$2\r\nb3\r\n",
        "the due ones, in offer order"
    );
    assert_eq!(
        server.int(&["ZCARD", "redwheel:{sweep}:delayed"]),
        2,
        "later and b2"
    );
    assert_eq!(server.int(&["HLEN", "redwheel:{sweep}:msg"]), 5);
}

#[test]
fn a_message_due_now_waits_behind_due_messages_still_in_delayed() {
    let server = RedisServer::start();
    // Due a second ago and not yet moved (its transfer has not run).
    let past = (server.time_ms() - 1_000).to_string();
    server.cmd(&["ZADD", "redwheel:{sweep}:delayed", &past, "early"]);
    server.cmd(&[
        "HSET",
        "redwheel:{sweep}:msg",
        "early",
        &format!("{past}:early"),
    ]);
    run_script(
        &server,
        &offer_sources(false),
        &OFFER_KEYS,
        &["r", "0", "m1", "late"],
    );
    // Its id orders after m1's: the two may fall due in the same
    // millisecond, and ids order such ties (as the client's ids do).
    run_script(
        &server,
        &offer_sources(true),
        &OFFER_KEYS,
        &["r", "n", "0", "m2", "last"],
    );
    assert_eq!(server.int(&["LLEN", "redwheel:{sweep}:ready"]), 0);
    let rw = server.connect();
    let q = open(&rw);
    let order: Vec<String> = (0..3)
        .map(|_| {
            let q = q.clone();
            within(HANG, move || q.poll(Duration::from_secs(30)).unwrap())
                .expect("due")
                .into_payload()
        })
        .collect();
    assert_eq!(order, ["early", "late", "last"], "in due order");
}
