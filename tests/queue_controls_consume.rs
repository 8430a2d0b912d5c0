//! Queue controls on the consuming side, against real redis-server
//! processes: pause with consumers blocked (threads of this process and a
//! consumer process), kept through a reconnect and a Redis restart, then
//! resume; `max_in_flight` across 4 consumer processes (sampled by the
//! consumers); the rate limit on `take` and `claim` (a short run; the 60 s
//! fleet run is `queue_controls_rate.rs`); limits stored in Redis, read
//! and lifted; the CLI's `limits`, `pause` and `resume`.

mod queue_controls_common;
mod support;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, UNIX_EPOCH};

use queue_controls_common::{Fleet, connection, ready_and_wait, report, results, role, wait_until};
use redwheel::{ConsumerOptions, Limit, QueueLimits, QueueOptions, Redwheel};
use support::{RedisServer, within};

const HANG: Duration = Duration::from_secs(120);

/// The child processes of this file's fleet tests.
#[test]
fn child_role() {
    if let Some((url, _)) = role("pause-consumer") {
        // Consumes until told to stop, recording each message taken.
        let rw = Redwheel::connect(&url).unwrap();
        let q = rw.queue::<String>("paused").unwrap();
        let mut con = connection(&url);
        let url_for_stop = url.clone();
        let c = q
            .consume(ConsumerOptions::default().concurrency(2), move |d| {
                let mut con = connection(&url);
                report(&mut con, "test:got", &[d.payload().clone()]);
                Ok::<(), String>(())
            })
            .unwrap();
        ready_and_wait(&mut con);
        // The parent pushes `stop` when done (Redis restarts meanwhile:
        // reconnect).
        loop {
            let stop: redis::RedisResult<Option<(String, String)>> =
                redis::cmd("BLPOP").arg("test:stop").arg(1).query(&mut con);
            match stop {
                Ok(Some(_)) => break,
                Ok(None) => {}
                Err(_) => {
                    std::thread::sleep(Duration::from_millis(50));
                    if let Ok(c) =
                        redis::Client::open(url_for_stop.as_str()).and_then(|c| c.get_connection())
                    {
                        con = c;
                    }
                }
            }
        }
        c.shutdown(Duration::from_secs(10)).unwrap();
    }
    if let Some((url, _)) = role("mif-consumer") {
        // Holds each claim a moment, sampling how many are held across the
        // fleet (a counter raised after the claim and lowered before the
        // ack, so never above what Redis counts) and the in-flight set.
        let rw = Redwheel::connect(&url).unwrap();
        let q = rw.queue::<String>("mif").unwrap();
        let mut con = connection(&url);
        let handler_url = url.clone();
        let c = q
            .consume(
                ConsumerOptions::default().concurrency(4).claimers(2),
                move |d| {
                    let mut con = connection(&handler_url);
                    let held: i64 = redis::cmd("INCR").arg("test:held").query(&mut con).unwrap();
                    let inflight: i64 = redis::cmd("ZCARD")
                        .arg("redwheel:{mif}:inflight")
                        .query(&mut con)
                        .unwrap();
                    std::thread::sleep(Duration::from_millis(2));
                    let _: i64 = redis::cmd("DECR").arg("test:held").query(&mut con).unwrap();
                    let _: i64 = redis::cmd("HINCRBY")
                        .arg("test:seen")
                        .arg(d.id().as_str())
                        .arg(1)
                        .query(&mut con)
                        .unwrap();
                    report(&mut con, "test:samples", &[format!("{held} {inflight}")]);
                    Ok::<(), String>(())
                },
            )
            .unwrap();
        ready_and_wait(&mut con);
        while q.len().unwrap() > 0 {
            std::thread::sleep(Duration::from_millis(20));
        }
        c.shutdown(Duration::from_secs(10)).unwrap();
    }
}

// ------------------------------------------------------------ pause

#[test]
fn a_paused_queue_hands_out_nothing_keeps_transferring_and_resume_wakes_its_consumers() {
    let mut server = RedisServer::with_appendonly();
    let url = server.url();
    let rw = server.connect();
    let q = rw.queue::<String>("paused").unwrap();
    q.pause().unwrap();
    assert!(q.is_paused().unwrap());
    // Consumers blocked on the empty queue: two threads here, two workers
    // in another process.
    let got = Arc::new(std::sync::Mutex::new(Vec::new()));
    // (The local ones poll until told to stop: which consumer gets how
    // many of the ten is not fixed.)
    let stop = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let (q, got, stop) = (q.clone(), Arc::clone(&got), Arc::clone(&stop));
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    if let Ok(Some(m)) = q.poll(Duration::from_millis(200)) {
                        got.lock().unwrap().push(m.into_payload());
                    }
                }
            })
        })
        .collect();
    let mut fleet = Fleet::spawn("child_role", "pause-consumer", &url, 1, &[]);
    fleet.go();
    for i in 0..10 {
        q.offer(&format!("m{i}"), Duration::ZERO).unwrap();
    }
    // Transferring goes on while paused.
    wait_until(HANG, "the messages to be ready", || {
        q.stats().unwrap().ready == 10
    });
    // Let the consumers look again a few times (a held-back consumer runs
    // its script again when the gate opens, and after `max_block` at the
    // latest: Redis counts the calls): still paused, they take nothing.
    let calls = server.calls("evalsha");
    wait_until(HANG, "the consumers to look again", || {
        server.calls("evalsha") >= calls + 6
    });
    let inspector = rw.inspect_queue("paused").unwrap();
    assert_eq!(
        inspector.counters().unwrap().delivered,
        0,
        "nothing handed out while paused"
    );
    // Kept in Redis: another connection sees it, and so does the server
    // after a restart (append-only file).
    let other = Redwheel::connect(&url).unwrap();
    assert!(
        other
            .queue::<String>("paused")
            .unwrap()
            .is_paused()
            .unwrap()
    );
    server.restart();
    wait_until(HANG, "redis back", || q.is_paused().is_ok());
    assert!(q.is_paused().unwrap());
    assert_eq!(inspector.counters().unwrap().delivered, 0);
    // Resume from the other connection: every consumer is woken. (Its
    // pooled connection died with the restart: a write on it would be
    // sent once and fail as OutcomeUnknown, so it reads first.)
    let other_q = other.queue::<String>("paused").unwrap();
    wait_until(HANG, "the other connection back", || {
        other_q.is_paused().is_ok()
    });
    other_q.resume().unwrap();
    assert!(!q.is_paused().unwrap());
    let mut con = connection(&url);
    wait_until(HANG, "all ten taken", || {
        got.lock().unwrap().len() + results(&mut con, "test:got").len() == 10
    });
    stop.store(true, Ordering::SeqCst);
    for t in threads {
        within(HANG, move || t.join().unwrap());
    }
    let _: () = redis::cmd("RPUSH")
        .arg("test:stop")
        .arg("stop")
        .query(&mut con)
        .unwrap();
    fleet.wait();
    let mut all = got.lock().unwrap().clone();
    all.extend(results(&mut con, "test:got"));
    all.sort();
    let mut want: Vec<String> = (0..10).map(|i| format!("m{i}")).collect();
    want.sort();
    assert_eq!(all, want, "each message taken once");
    assert!(!all.is_empty());
}

#[test]
fn a_paused_queue_lets_claims_in_flight_finish() {
    let server = RedisServer::start();
    let rw = server.connect();
    let q = rw.queue::<String>("pause-inflight").unwrap();
    q.offer(&"a".into(), Duration::ZERO).unwrap();
    let d = within(HANG, {
        let q = q.clone();
        move || q.claim(Duration::from_secs(10)).unwrap().unwrap()
    });
    q.pause().unwrap();
    q.pause().unwrap(); // idempotent
    d.ack().unwrap();
    q.offer(&"b".into(), Duration::ZERO).unwrap();
    assert!(q.poll(Duration::from_millis(200)).unwrap().is_none());
    assert!(q.claim(Duration::from_millis(200)).unwrap().is_none());
    q.resume().unwrap();
    assert_eq!(q.take().unwrap().payload(), "b");
}

/// A process that has used a queue before it had controls sends the pop
/// scripts the short key list of a queue without them; once another
/// process pauses the queue, those scripts send it back for every key and
/// the pause holds: for `poll`, `claim`, and a consumer pool's ack that
/// carries its next claim (the ack is applied, the claim held back).
#[test]
fn controls_set_by_another_process_hold_for_one_that_saw_none_before() {
    let server = RedisServer::start();
    let (rw_a, rw_b) = (server.connect(), server.connect());
    let qa = rw_a.queue::<String>("late-controls").unwrap();
    let qb = rw_b.queue::<String>("late-controls").unwrap();
    // A takes and claims while the queue has no controls.
    qa.offer(&"a".into(), Duration::ZERO).unwrap();
    assert_eq!(
        within(HANG, {
            let qa = qa.clone();
            move || qa.take().unwrap()
        })
        .payload(),
        "a"
    );
    qa.offer(&"b".into(), Duration::ZERO).unwrap();
    let d = within(HANG, {
        let qa = qa.clone();
        move || qa.claim(Duration::from_secs(10)).unwrap().unwrap()
    });
    d.ack().unwrap();
    // A consumer pool of A holds "x" in its handler until told to finish.
    let (entered_tx, entered) = std::sync::mpsc::channel::<String>();
    let (finish, finish_rx) = std::sync::mpsc::channel::<()>();
    let finish_rx = std::sync::Mutex::new(finish_rx);
    let consumer = qa
        .consume(ConsumerOptions::default().concurrency(1), move |d| {
            entered_tx.send(d.payload().clone()).unwrap();
            if d.payload() == "x" {
                finish_rx.lock().unwrap().recv().unwrap();
            }
            Ok::<(), String>(())
        })
        .unwrap();
    qa.offer(&"x".into(), Duration::ZERO).unwrap();
    assert_eq!(entered.recv_timeout(HANG).unwrap(), "x");

    // B pauses the queue; A's calls see it.
    qb.pause().unwrap();
    qa.offer(&"c".into(), Duration::ZERO).unwrap();
    assert!(qa.poll(Duration::from_millis(200)).unwrap().is_none());
    assert!(qa.claim(Duration::from_millis(200)).unwrap().is_none());
    // The pool's ack of "x" goes out with its next claim: acked, and "c"
    // not claimed in the same call.
    finish.send(()).unwrap();
    wait_until(HANG, "the ack of x", || consumer.handled() == 1);
    let stats = qb.stats().unwrap();
    assert_eq!((stats.ready, stats.in_flight), (1, 0), "{stats:?}");
    qb.resume().unwrap();
    assert_eq!(entered.recv_timeout(HANG).unwrap(), "c");
    wait_until(HANG, "the ack of c", || consumer.handled() == 2);
    consumer.shutdown(Duration::from_secs(10)).unwrap();
}

// ------------------------------------------------------------ max_in_flight

#[test]
fn max_in_flight_is_never_exceeded_across_4_consumer_processes() {
    let server = RedisServer::start();
    let url = server.url();
    let rw = server.connect();
    let limit = 5;
    let q = rw
        .queue_with::<String>("mif", QueueOptions::default().max_in_flight(limit))
        .unwrap();
    let n = 400;
    let batch: Vec<(String, Duration)> =
        (0..n).map(|i| (format!("m{i}"), Duration::ZERO)).collect();
    let ids = q.offer_batch(&batch).unwrap();
    let mut fleet = Fleet::spawn("child_role", "mif-consumer", &url, 4, &[]);
    fleet.go();
    within(Duration::from_secs(300), move || fleet.wait());
    let mut con = connection(&url);
    let samples = results(&mut con, "test:samples");
    assert_eq!(samples.len(), n, "one sample per message handled");
    let (mut max_held, mut max_inflight) = (0, 0);
    for s in &samples {
        let (held, inflight) = s.split_once(' ').unwrap();
        max_held = max_held.max(held.parse::<u64>().unwrap());
        max_inflight = max_inflight.max(inflight.parse::<u64>().unwrap());
    }
    assert!(
        max_held <= limit,
        "{max_held} claims held at once (limit {limit})"
    );
    assert!(
        max_inflight <= limit,
        "{max_inflight} in flight (limit {limit})"
    );
    // 16 workers wanted messages: the limit, not a lack of demand, bound them.
    assert!(
        max_inflight >= 2,
        "the consumers ran concurrently: {max_inflight}"
    );
    let seen: HashMap<String, u64> = redis::cmd("HGETALL")
        .arg("test:seen")
        .query(&mut con)
        .unwrap();
    assert_eq!(seen.len(), n);
    assert!(
        ids.iter().all(|id| seen.get(id.as_str()) == Some(&1)),
        "each handled once"
    );
    assert_eq!(q.len().unwrap(), 0);
}

#[test]
fn a_claim_held_back_by_max_in_flight_is_woken_by_an_ack_in_another_process() {
    let server = RedisServer::start();
    let a = server.connect();
    let b = server.connect();
    let qa = a
        .queue_with::<String>("slots", QueueOptions::default().max_in_flight(1))
        .unwrap();
    let qb = b.queue::<String>("slots").unwrap();
    qa.offer(&"1".into(), Duration::ZERO).unwrap();
    qa.offer(&"2".into(), Duration::ZERO).unwrap();
    let first = within(HANG, {
        let qa = qa.clone();
        move || qa.claim(Duration::from_secs(10)).unwrap().unwrap()
    });
    // B's claim waits (no slot), in B's process.
    let waiting = std::thread::spawn(move || qb.claim(Duration::from_secs(60)).unwrap());
    wait_until(HANG, "B to be held back", || {
        server.int(&["HEXISTS", "redwheel:{slots}:controls", "release_waiters"]) == 1
    });
    first.ack().unwrap();
    let second = within(HANG, move || waiting.join().unwrap()).expect("woken by the ack");
    assert_eq!(second.payload(), "2");
}

// ------------------------------------------------------------ rate limit

#[test]
fn no_window_of_the_rate_limit_sees_more_than_max_claims() {
    let server = RedisServer::start();
    let rw = server.connect();
    let (max, per) = (10usize, Duration::from_millis(400));
    let visibility = Duration::from_secs(60);
    let q = rw
        .queue_with::<String>(
            "rate",
            QueueOptions::default()
                .rate_limit(max as u32, per)
                .visibility(visibility),
        )
        .unwrap();
    let n = 50;
    let batch: Vec<(String, Duration)> =
        (0..n).map(|i| (format!("m{i}"), Duration::ZERO)).collect();
    q.offer_batch(&batch).unwrap();
    let times: Vec<u64> = within(HANG, {
        let q = q.clone();
        move || {
            let consumers: Vec<_> = (0..3)
                .map(|_| {
                    let q = q.clone();
                    std::thread::spawn(move || {
                        let mut t = Vec::new();
                        while let Ok(batch) = q.claim_batch(4, Duration::from_secs(2)) {
                            if batch.is_empty() {
                                break;
                            }
                            for d in batch {
                                t.push(claimed_at(&d, visibility));
                                d.ack().unwrap();
                            }
                        }
                        t
                    })
                })
                .collect();
            consumers
                .into_iter()
                .flat_map(|c| c.join().unwrap())
                .collect()
        }
    });
    assert_eq!(times.len(), n);
    assert_windows(times, max, per);
}

/// The server time of a claim: its visibility deadline minus the visibility.
fn claimed_at<T: redwheel::Codec>(d: &redwheel::Delivery<T>, visibility: Duration) -> u64 {
    d.visible_until()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
        - visibility.as_millis() as u64
}

/// No `max + 1` of the (ms) times fall in one interval of length `per`.
fn assert_windows(mut times: Vec<u64>, max: usize, per: Duration) {
    times.sort_unstable();
    let per = per.as_millis() as u64;
    for (i, w) in times.windows(max + 1).enumerate() {
        assert!(
            w[max] - w[0] >= per,
            "deliveries {i}..={}: {} within {} ms (max {max} per {per} ms)",
            i + max,
            max + 1,
            w[max] - w[0]
        );
    }
}

#[test]
fn take_obeys_the_rate_limit_waits_without_polling_and_a_lifted_limit_wakes_it() {
    let server = RedisServer::start();
    let rw = server.connect();
    let q = rw
        .queue_with::<String>(
            "rate-take",
            QueueOptions::default().rate_limit(5, Duration::from_secs(3600)),
        )
        .unwrap();
    for i in 0..8 {
        q.offer(&format!("m{i}"), Duration::ZERO).unwrap();
    }
    for _ in 0..5 {
        within(HANG, {
            let q = q.clone();
            move || q.take().unwrap()
        });
    }
    // The window is full for an hour: the sixth waits.
    let (tx, rx) = std::sync::mpsc::channel();
    let waiting = {
        let q = q.clone();
        std::thread::spawn(move || {
            tx.send(()).unwrap();
            q.take().unwrap().into_payload()
        })
    };
    rx.recv().unwrap();
    // While it waits it sends a script call when something may have
    // changed (a transfer run, once a second here), not in a loop.
    let before = server.calls("evalsha");
    std::thread::sleep(Duration::from_secs(2));
    let calls = server.calls("evalsha") - before;
    assert!(calls < 40, "{calls} script calls in 2 s while held back");
    assert_eq!(
        rw.inspect_queue("rate-take")
            .unwrap()
            .counters()
            .unwrap()
            .delivered,
        5
    );
    q.lift_limit(Limit::RateLimit).unwrap();
    assert!(within(HANG, move || waiting.join().unwrap()).starts_with('m'));
    assert_eq!(q.limits().unwrap().rate_limit, None);
}

// ------------------------------------------------------------ limits in Redis

#[test]
fn limits_are_stored_in_redis_for_every_process_and_options_are_checked() {
    let server = RedisServer::start();
    let a = server.connect();
    let qa = a
        .queue_with::<String>(
            "stored",
            QueueOptions::default()
                .rate_limit(100, Duration::from_millis(1500))
                .max_in_flight(50)
                .max_len(1_000),
        )
        .unwrap();
    // Another process opening it with no limits obeys (and reads) them.
    let b = server.connect();
    let qb = b.queue::<String>("stored").unwrap();
    let want = qb.limits().unwrap();
    assert_eq!(
        (
            want.paused,
            want.rate_limit,
            want.max_in_flight,
            want.max_len
        ),
        (
            false,
            Some((100, Duration::from_millis(1500))),
            Some(50),
            Some(1_000)
        )
    );
    assert_eq!(a.inspect_queue("stored").unwrap().limits().unwrap(), want);
    // Opening with one option replaces that one only.
    let qc = b
        .queue_with::<String>("stored", QueueOptions::default().max_len(7))
        .unwrap();
    assert_eq!(qc.limits().unwrap().max_len, Some(7));
    assert_eq!(qc.limits().unwrap().max_in_flight, Some(50));
    qa.lift_limit(Limit::MaxInFlight).unwrap();
    qa.lift_limit(Limit::MaxLen).unwrap();
    qa.lift_limit(Limit::RateLimit).unwrap();
    assert_eq!(qb.limits().unwrap(), QueueLimits::default());
    for bad in [
        QueueOptions::default().rate_limit(0, Duration::from_secs(1)),
        QueueOptions::default().rate_limit(10, Duration::ZERO),
        QueueOptions::default().rate_limit(2_000_000, Duration::from_secs(1)),
        QueueOptions::default().max_in_flight(0),
        QueueOptions::default().max_len(0),
    ] {
        let e = a.queue_with::<String>("stored", bad.clone()).unwrap_err();
        assert!(e.is_invalid_input(), "{bad:?}: {e}");
    }
}

#[test]
fn a_consumer_pool_honours_pause_and_max_in_flight_and_acks_everything() {
    let server = RedisServer::start();
    let rw = server.connect();
    let q = rw
        .queue_with::<String>("pool", QueueOptions::default().max_in_flight(2))
        .unwrap();
    let n = 60;
    for i in 0..n {
        q.offer(&format!("m{i}"), Duration::ZERO).unwrap();
    }
    q.pause().unwrap();
    let over = Arc::new(AtomicBool::new(false));
    let held = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let c = {
        let (over, held) = (Arc::clone(&over), Arc::clone(&held));
        q.consume(ConsumerOptions::default().concurrency(6), move |_d| {
            if held.fetch_add(1, Ordering::SeqCst) + 1 > 2 {
                over.store(true, Ordering::SeqCst);
            }
            std::thread::sleep(Duration::from_millis(1));
            held.fetch_sub(1, Ordering::SeqCst);
            Ok::<(), String>(())
        })
        .unwrap()
    };
    let calls = server.calls("evalsha");
    wait_until(
        HANG,
        "the pool's claimers to look again while paused",
        || server.calls("evalsha") >= calls + 6,
    );
    assert_eq!(c.handled(), 0);
    q.resume().unwrap();
    wait_until(HANG, "everything handled", || c.handled() == n);
    c.shutdown(Duration::from_secs(10)).unwrap();
    assert!(!over.load(Ordering::SeqCst), "more than 2 handlers at once");
    assert_eq!(q.len().unwrap(), 0);
}

// ------------------------------------------------------------ CLI

#[cfg(feature = "cli")]
#[test]
fn the_cli_shows_sets_and_lifts_limits_and_pauses_and_resumes() {
    use std::process::Command;
    let server = RedisServer::start();
    let url = server.url();
    let cli = |args: &[&str]| {
        let o = Command::new(env!("CARGO_BIN_EXE_redwheel"))
            .arg("--url")
            .arg(&url)
            .args(args)
            .output()
            .unwrap();
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let (code, _, err) = cli(&["limits", "nothing-here"]);
    assert_eq!(code, Some(4), "{err}");
    let (code, out, err) = cli(&["pause", "emails"]);
    assert_eq!((code, out.as_str()), (Some(0), "paused emails\n"), "{err}");
    let rw = server.connect();
    let q = rw.queue::<String>("emails").unwrap();
    assert!(q.is_paused().unwrap());
    let (code, out, err) = cli(&[
        "limits",
        "emails",
        "--rate",
        "100/1s",
        "--max-in-flight",
        "50",
        "--max-len",
        "1000",
    ]);
    assert_eq!(code, Some(0), "{err}");
    let lines: Vec<Vec<&str>> = out
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        lines[0],
        ["QUEUE", "PAUSED", "RATE-LIMIT", "MAX-IN-FLIGHT", "MAX-LEN"]
    );
    assert_eq!(lines[1], ["emails", "yes", "100/1.0s", "50", "1000"]);
    let l = q.limits().unwrap();
    assert_eq!(l.rate_limit, Some((100, Duration::from_secs(1))));
    let (code, out, err) = cli(&[
        "--json", "limits", "emails", "--lift", "rate", "--lift", "max-len",
    ]);
    assert_eq!(code, Some(0), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["paused"], true);
    assert_eq!(v["rate_limit"], serde_json::Value::Null);
    assert_eq!(v["max_len"], serde_json::Value::Null);
    assert_eq!(v["max_in_flight"], 50);
    let (code, out, _) = cli(&["resume", "emails"]);
    assert_eq!((code, out.as_str()), (Some(0), "resumed emails\n"));
    assert!(!q.is_paused().unwrap());
    let (code, _, err) = cli(&["limits", "emails", "--rate", "0/1s"]);
    assert_eq!(code, Some(2), "{err}");
}
