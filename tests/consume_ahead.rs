//! A consumer pool that claims ahead (`ConsumerOptions::claim_ahead`),
//! against real redis-server processes: messages are claimed before their
//! due time under a deadline counted from it, start at it and never before
//! (by the server's clock), a lost reply of the claim is asked again and
//! answered from its record, a process SIGKILLed while holding claims made
//! ahead loses none, shutdown gives back what was not started, and a queue
//! with controls is not claimed ahead.

mod ahead_support;
mod support;

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, UNIX_EPOCH};

use ahead_support::{Entry, HANG, delayed, key, num, open, recording, wait_until};
use redwheel::schedule::{Schedule, parse_occurrence_id};
use redwheel::{ConsumerOptions, ErrorKind, Queue, QueueOptions, Redwheel};
use support::RedisServer;
use support::proxy::{Fault, Proxy, Rule, RuleHandle};

/// A runtime behind a proxy, and queue `name` on it, whose first
/// `claim_ahead.lua` call runs and loses its reply (`hold`: the connection
/// is kept open). The script is loaded beforehand, so that first call runs
/// (no NOSCRIPT).
fn losing_first_claim_ahead(
    server: &RedisServer,
    name: &str,
    hold: bool,
) -> (Proxy, Queue<String>, RuleHandle) {
    let proxy = Proxy::start(server.port());
    let rw = Redwheel::connect(&proxy.url()).unwrap();
    let q = rw.queue::<String>(name).unwrap();
    let mut con = redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let sha = redwheel::test_support::load_script(&mut con, "claim_ahead").unwrap();
    let mut rule = Rule::new(Fault::LoseReply)
        .matching(sha.as_bytes())
        .times(1);
    if hold {
        rule = rule.hold();
    }
    let lost = proxy.inject(rule);
    (proxy, q, lost)
}

#[test]
fn messages_claimed_ahead_are_held_past_their_due_time_and_start_at_it_never_before() {
    let server = RedisServer::start();
    let rw = server.connect();
    let name = "ahead-start";
    let q = open(&rw, name, Duration::from_secs(20));
    for i in 0..20 {
        q.offer(
            &format!("m{i}"),
            Duration::from_millis(2_500 + 50 * (i % 5)),
        )
        .unwrap();
    }
    let due = delayed(&server, name);
    assert_eq!(due.len(), 20);
    let (consumer, entries) = recording(&q, &server.url(), Duration::from_secs(30));
    // All claimed ahead: out of `delayed`, in `inflight` under a deadline
    // counted from the due time, before any is due.
    wait_until("the claims ahead", || {
        server.int(&["ZCARD", &key(name, "inflight")]) == 20
    });
    let checked_at = server.time_ms();
    assert_eq!(server.int(&["ZCARD", &key(name, "delayed")]), 0);
    for (id, due_ms) in &due {
        let deadline = num(&server, &["ZSCORE", &key(name, "inflight"), id]);
        assert!(
            deadline >= due_ms + 20_000,
            "{id}: deadline {deadline}, due {due_ms}"
        );
    }
    if checked_at < due.values().copied().min().unwrap() {
        assert!(entries.is_empty(), "a handler started before its due time");
    }
    let mut seen = HashMap::new();
    for _ in 0..20 {
        let Entry {
            id, attempt, at, ..
        } = entries.recv_timeout(HANG).expect("a handler entry");
        assert_eq!(attempt, 1);
        assert!(at >= due[&id], "{id} started at {at}, due {}", due[&id]);
        *seen.entry(id).or_insert(0) += 1;
    }
    assert_eq!(seen.len(), 20);
    wait_until("the acks", || server.int(&["HLEN", &key(name, "msg")]) == 0);
    assert_eq!(server.int(&["ZCARD", &key(name, "inflight")]), 0);
    assert_eq!(consumer.handled(), 20);
    consumer.shutdown(Duration::from_secs(10)).unwrap();
    assert!(entries.try_recv().is_err(), "a message ran twice");
}

#[test]
fn a_lost_reply_of_a_claim_ahead_is_asked_again_and_each_message_runs_once() {
    let server = RedisServer::start();
    let name = "ahead-lost";
    // The first claim ahead finds all ten, and its reply never comes back
    // (the script ran; the connection is reset).
    let (_proxy, q, lost) = losing_first_claim_ahead(&server, name, false);
    for i in 0..10 {
        q.offer(&format!("m{i}"), Duration::from_millis(1_500))
            .unwrap();
    }
    let (consumer, entries) = recording(&q, &server.url(), Duration::from_secs(30));
    assert!(lost.wait_fired(1, HANG), "no claim ahead was sent");
    // Without the replay the ten would sit in `inflight` for the whole
    // visibility (30 s), claimed for nobody.
    let mut seen = HashMap::new();
    for _ in 0..10 {
        let Entry { id, attempt, .. } = entries
            .recv_timeout(Duration::from_secs(20))
            .expect("a message claimed by the lost call never ran");
        assert_eq!(attempt, 1, "{id} was counted twice");
        *seen.entry(id).or_insert(0) += 1;
    }
    assert_eq!(seen.len(), 10);
    wait_until("the acks", || server.int(&["HLEN", &key(name, "msg")]) == 0);
    consumer.shutdown(Duration::from_secs(10)).unwrap();
    assert!(entries.try_recv().is_err(), "a message ran twice");
}

#[test]
fn shutdown_gives_back_what_was_claimed_ahead_and_not_started_uncounted() {
    let server = RedisServer::start();
    let rw = server.connect();
    let name = "ahead-shutdown";
    let q = rw.queue::<String>(name).unwrap();
    for i in 0..5 {
        q.offer(&format!("m{i}"), Duration::from_secs(40)).unwrap();
    }
    let due = delayed(&server, name);
    let (consumer, entries) = recording(&q, &server.url(), Duration::from_secs(60));
    wait_until("the claims ahead", || {
        server.int(&["ZCARD", &key(name, "inflight")]) == 5
    });
    assert_eq!(
        num(&server, &["HGET", &key(name, "counts"), "delivered"]),
        5
    );
    consumer.shutdown(Duration::from_secs(10)).unwrap();
    assert!(entries.try_recv().is_err());
    // Back where they were, as if never claimed.
    assert_eq!(delayed(&server, name), due);
    assert_eq!(server.int(&["ZCARD", &key(name, "inflight")]), 0);
    assert_eq!(server.int(&["HLEN", &key(name, "lease")]), 0);
    assert_eq!(server.int(&["HLEN", &key(name, "attempts")]), 0);
    assert_eq!(
        num(&server, &["HGET", &key(name, "counts"), "delivered"]),
        0
    );
    assert_eq!(server.int(&["HLEN", &key(name, "msg")]), 5);
}

#[test]
fn nothing_is_claimed_ahead_from_a_queue_with_controls_and_it_is_still_delivered_when_due() {
    let server = RedisServer::start();
    let rw = server.connect();
    let name = "ahead-controls";
    let q = rw
        .queue_with::<String>(
            name,
            QueueOptions::default().rate_limit(1_000, Duration::from_secs(1)),
        )
        .unwrap();
    q.offer(&"m".to_owned(), Duration::from_millis(1_500))
        .unwrap();
    let due = delayed(&server, name);
    let (_, due_ms) = due.iter().next().unwrap();
    // The script itself, asked by hand with a window covering the message:
    // nothing claimed, gate -1.
    let mut con = redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let sha = redwheel::test_support::load_script(&mut con, "claim_ahead").unwrap();
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(&sha).arg(10);
    for k in [
        "delayed",
        "msg",
        "inflight",
        "lease",
        "attempts",
        "counts",
        "reply:test.0",
        "head",
        "controls",
        "wake",
    ] {
        cmd.arg(key(name, k));
    }
    cmd.arg("c")
        .arg(30_000)
        .arg("t")
        .arg(10)
        .arg(1)
        .arg(60_000)
        .arg(60_000);
    let reply: Vec<i64> = cmd.query(&mut con).unwrap();
    assert_eq!(reply[0], -1);
    assert_eq!(reply.len(), 3);
    assert_eq!(server.int(&["ZCARD", &key(name, "delayed")]), 1);
    assert_eq!(server.int(&["ZCARD", &key(name, "inflight")]), 0);
    // A pool that claims ahead still gets it, when due, the usual way.
    let (consumer, entries) = recording(&q, &server.url(), Duration::from_secs(30));
    let Entry { attempt, at, .. } = entries.recv_timeout(HANG).expect("the message");
    assert_eq!(attempt, 1);
    assert!(at >= *due_ms);
    consumer.shutdown(Duration::from_secs(10)).unwrap();
}

/// The child of the kill test: claims ahead from the queue with a 2 s
/// visibility and never gets to run anything (the messages fall due after
/// it is killed). Runs only when spawned by that test.
#[test]
fn child_holding_claims_ahead() {
    let Ok(url) = std::env::var("REDWHEEL_AHEAD_URL") else {
        return;
    };
    let rw = Redwheel::connect(&url).unwrap();
    let q = open(&rw, "ahead-kill", Duration::from_secs(2));
    let _consumer = q
        .consume(
            ConsumerOptions::default().claim_ahead(Duration::from_secs(60)),
            |_| Err::<(), _>("the child must never run a message"),
        )
        .unwrap();
    std::thread::sleep(Duration::from_secs(600));
}

fn spawn_child(url: &str) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_holding_claims_ahead",
            "--test-threads=1",
            "--quiet",
        ])
        .env("REDWHEEL_AHEAD_URL", url)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

#[test]
fn a_process_sigkilled_while_holding_claims_ahead_loses_none_of_them() {
    let server = RedisServer::start();
    let rw = server.connect();
    let name = "ahead-kill";
    let q = open(&rw, name, Duration::from_secs(2));
    for i in 0..10 {
        q.offer(&format!("m{i}"), Duration::from_secs(8)).unwrap();
    }
    let due = delayed(&server, name);
    let mut child = spawn_child(&server.url());
    wait_until("the child's claims ahead", || {
        server.int(&["ZCARD", &key(name, "inflight")]) == 10
    });
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    // Each comes back once its deadline (due + 2 s) passes, to this pool,
    // as a second delivery; none is lost, none runs before that.
    let (consumer, entries) = recording(&q, &server.url(), Duration::from_secs(30));
    let mut seen = HashMap::new();
    for _ in 0..10 {
        let Entry {
            id, attempt, at, ..
        } = entries
            .recv_timeout(HANG)
            .expect("a message the child held");
        assert_eq!(attempt, 2, "{id}");
        assert!(at >= due[&id] + 2_000, "{id} ran at {at}, due {}", due[&id]);
        *seen.entry(id).or_insert(0) += 1;
    }
    assert_eq!(seen.len(), 10);
    wait_until("the acks", || server.int(&["HLEN", &key(name, "msg")]) == 0);
    consumer.shutdown(Duration::from_secs(10)).unwrap();
    assert!(entries.try_recv().is_err(), "a message ran twice");
}

#[test]
fn claim_ahead_options_out_of_range_are_refused() {
    let server = RedisServer::start();
    let rw = server.connect();
    let q = rw.queue::<String>("ahead-options").unwrap();
    for opts in [
        ConsumerOptions::default().claim_ahead(Duration::from_secs(61)),
        ConsumerOptions::default()
            .claim_ahead(Duration::from_secs(1))
            .claim_ahead_max(0),
        ConsumerOptions::default()
            .claim_ahead(Duration::from_secs(1))
            .claim_ahead_max(100_001),
    ] {
        let e = q.consume(opts, |_| Ok::<(), String>(())).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidOption);
    }
}

/// The occurrence ids of schedule `name` in `inflight` (claimed), with
/// their occurrence ms.
fn claimed_occurrences(server: &RedisServer, queue: &str, name: &str) -> Vec<u64> {
    let mut con = redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let ids: Vec<String> = redis::cmd("ZRANGE")
        .arg(key(queue, "inflight"))
        .arg(0)
        .arg(-1)
        .query(&mut con)
        .unwrap();
    ids.iter()
        .filter_map(|id| parse_occurrence_id(id))
        .filter(|(n, _)| *n == name)
        .map(|(_, at)| at.duration_since(UNIX_EPOCH).unwrap().as_millis() as u64)
        .collect()
}

#[test]
fn an_occurrence_claimed_ahead_runs_once_though_its_schedule_is_paused_before_its_time() {
    let server = RedisServer::start();
    let rw = server.connect();
    let name = "ahead-sched";
    let q = rw.queue::<String>(name).unwrap();
    let (consumer, entries) = recording(&q, &server.url(), Duration::from_millis(500));
    let every = Schedule::every(Duration::from_secs(1));
    // The pause must reach Redis within the ~90 ms between the claim ahead
    // and the occurrence; a slow attempt is made again.
    for _ in 0..20 {
        q.schedule("tick", &every, &"t".to_owned()).unwrap();
        let mut claimed = Vec::new();
        wait_until("an occurrence claimed ahead", || {
            claimed = claimed_occurrences(&server, name, "tick");
            !claimed.is_empty()
        });
        let o = *claimed.iter().max().unwrap();
        let before = server.time_ms();
        assert!(q.pause_schedule("tick").unwrap());
        if before >= o {
            q.resume_schedule("tick").unwrap();
            continue;
        }
        // Paused before its time, while claimed ahead: not taken back (it
        // left `delayed`), so it counts as fired and runs, once.
        let info = q.schedules().unwrap();
        let tick = info.iter().find(|s| s.name == "tick").unwrap();
        assert!(tick.paused);
        assert_eq!(tick.last_fired, Some(UNIX_EPOCH + Duration::from_millis(o)));
        let id = format!("sched:tick:{o}");
        let got = loop {
            let Entry {
                id: got,
                attempt,
                at,
                ..
            } = entries.recv_timeout(HANG).expect("the occurrence");
            if got == id {
                break (attempt, at);
            }
        };
        assert_eq!(got.0, 1);
        assert!(got.1 >= o, "ran at {}, due {o}", got.1);
        wait_until("its ack", || server.int(&["HLEN", &key(name, "msg")]) == 0);
        consumer.shutdown(Duration::from_secs(10)).unwrap();
        assert!(
            entries.try_iter().all(|e| e.id != id),
            "the occurrence ran twice"
        );
        return;
    }
    panic!("no pause reached Redis before the occurrence it followed in 20 tries");
}

#[test]
fn shutdown_gives_back_what_a_claim_ahead_whose_reply_never_came_claimed() {
    let server = RedisServer::start();
    let name = "ahead-shutdown-lost";
    // The claim runs; its reply is thrown away and the connection kept
    // open, so the pool never learns what it claimed.
    let (_proxy, q, lost) = losing_first_claim_ahead(&server, name, true);
    for i in 0..5 {
        q.offer(&format!("m{i}"), Duration::from_secs(40)).unwrap();
    }
    let due = delayed(&server, name);
    let (consumer, entries) = recording(&q, &server.url(), Duration::from_secs(60));
    assert!(lost.wait_fired(1, HANG), "no claim ahead was sent");
    assert_eq!(server.int(&["ZCARD", &key(name, "inflight")]), 5);
    consumer.shutdown(Duration::from_secs(10)).unwrap();
    lost.release();
    assert!(entries.try_recv().is_err());
    assert_eq!(delayed(&server, name), due);
    assert_eq!(server.int(&["ZCARD", &key(name, "inflight")]), 0);
    assert_eq!(server.int(&["HLEN", &key(name, "attempts")]), 0);
}
