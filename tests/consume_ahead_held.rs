//! A pool that claims ahead holds messages in its memory, between the
//! claim and its handler: these tests, against real redis-server
//! processes, check that a held message never outlives its claim (one its
//! workers cannot start in time goes back, uncounted, and runs once), that
//! a busy worker is not claimed for, that the queue's controls (a pause, a
//! rate limit set by another process) reach what is held, that the due
//! time is judged by the server's clock even when this process's estimate
//! of it runs ahead, and that what is held and given back frees its
//! in-flight slot for a claim waiting on `max_in_flight`.

mod ahead_support;
mod support;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use ahead_support::{Entry, HANG, delayed, key, num, open, recording, recording_with, wait_until};
use crossbeam_channel::{Receiver, unbounded};
use redwheel::{ConsumerOptions, Limit, QueueOptions, Redwheel};
use support::RedisServer;
use support::proxy::{Fault, Proxy, Rule};

/// Every entry until each of `ids` has run and the queue's `msg` hash is
/// empty (all acked); then the pool is shut down and what ran meanwhile is
/// added. Per id, its entries.
fn run_all(
    server: &RedisServer,
    name: &str,
    consumer: redwheel::Consumer,
    entries: &Receiver<Entry>,
    ids: usize,
) -> HashMap<String, Vec<Entry>> {
    let mut seen: HashMap<String, Vec<Entry>> = HashMap::new();
    let give_up = Instant::now() + HANG;
    while seen.len() < ids || server.int(&["HLEN", &key(name, "msg")]) > 0 {
        if let Ok(e) = entries.recv_timeout(Duration::from_millis(50)) {
            seen.entry(e.id.clone()).or_default().push(e);
        }
        assert!(
            seen.values().map(Vec::len).sum::<usize>() < 10 * ids,
            "runaway: {seen:?}"
        );
        assert!(Instant::now() < give_up, "hang guard: {seen:?}");
    }
    consumer.shutdown(Duration::from_secs(10)).unwrap();
    for e in entries.try_iter() {
        seen.entry(e.id.clone()).or_default().push(e);
    }
    seen
}

#[test]
fn a_message_its_workers_cannot_start_within_its_claim_goes_back_and_runs_once() {
    // The trigger: one worker, a 1 s visibility, a 250 ms handler,
    // 12 messages due within 1.5 s, all claimed ahead (deadline = due +
    // 1 s). The worker cannot start most of them before their claim ends:
    // those must go back (and come again through the claimers), never be
    // started on a claim the transfer may already have redelivered.
    let server = RedisServer::start();
    let rw = server.connect();
    let name = "held-late";
    let q = open(&rw, name, Duration::from_secs(1));
    for i in 0..12 {
        q.offer(&format!("m{i}"), Duration::from_millis(2_000 + 125 * i))
            .unwrap();
    }
    let (consumer, entries) = recording_with(
        &q,
        &server.url(),
        ConsumerOptions::default()
            .concurrency(1)
            .claim_ahead(Duration::from_secs(5)),
        Duration::from_millis(250),
    );
    wait_until("the claims ahead", || {
        server.int(&["ZCARD", &key(name, "inflight")]) == 12
    });
    let seen = run_all(&server, name, consumer, &entries, 12);
    assert_eq!(seen.len(), 12, "{seen:?}");
    for (id, runs) in &seen {
        assert_eq!(runs.len(), 1, "{id} ran {} times: {runs:?}", runs.len());
        let e = &runs[0];
        assert!(
            e.at < e.visible_until,
            "{id} started at {} on a claim that ended at {}",
            e.at,
            e.visible_until
        );
        assert_eq!(e.attempt, 1, "{id}: a give-back counted an attempt");
    }
}

#[test]
fn a_worker_busy_with_a_message_claimed_ahead_is_not_claimed_for() {
    let server = RedisServer::start();
    let rw = server.connect();
    let name = "held-busy";
    let q = open(&rw, name, Duration::from_secs(10));
    let (release_tx, release) = unbounded::<()>();
    let (tx, started) = unbounded::<(String, u32)>();
    let consumer = q
        .consume(
            ConsumerOptions::default()
                .concurrency(1)
                .claim_ahead(Duration::from_secs(5)),
            move |d| {
                let _ = tx.send((d.id().as_str().to_owned(), d.attempt()));
                if d.payload() == "a" {
                    let _ = release.recv_timeout(HANG);
                }
                Ok::<(), String>(())
            },
        )
        .unwrap();
    let a = q
        .offer(&"a".to_owned(), Duration::from_millis(1_500))
        .unwrap();
    let (got, _) = started.recv_timeout(HANG).expect("a ran");
    assert_eq!(got, a.as_str());
    // The one worker is busy with `a` (claimed ahead): `b`, ready now, is
    // for another consumer, not claimed for this pool's busy worker (a
    // claim already waiting when `a` started may take it, and gives it
    // straight back).
    let b = q.offer(&"b".to_owned(), Duration::ZERO).unwrap();
    let unclaimed = || {
        server.cmd(&["ZSCORE", &key(name, "delayed"), b.as_str()]) == "$-1\r\n"
            && server.cmd(&["ZSCORE", &key(name, "inflight"), b.as_str()]) == "$-1\r\n"
    };
    // (5 s, half the visibility: slack for a loaded machine; a give-back takes
    // one round trip.)
    let give_up = Instant::now() + Duration::from_secs(5);
    while !unclaimed() {
        assert!(
            Instant::now() < give_up,
            "b stays claimed for a worker busy with a message claimed ahead"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let watch_until = server.time_ms() + 2_000;
    while server.time_ms() < watch_until {
        assert_eq!(
            server.cmd(&["ZSCORE", &key(name, "inflight"), b.as_str()]),
            "$-1\r\n",
            "b was claimed for a worker busy with a message claimed ahead"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    release_tx.send(()).unwrap();
    let (got, attempt) = started.recv_timeout(HANG).expect("b ran");
    assert_eq!((got.as_str(), attempt), (b.as_str(), 1));
    wait_until("the acks", || server.int(&["HLEN", &key(name, "msg")]) == 0);
    consumer.shutdown(Duration::from_secs(10)).unwrap();
    assert!(started.try_recv().is_err(), "a message ran twice");
}

#[test]
fn a_pause_reaches_a_message_claimed_ahead_before_its_due_time() {
    let server = RedisServer::start();
    let rw = server.connect();
    let name = "held-pause";
    let q = rw.queue::<String>(name).unwrap();
    q.offer(&"m".to_owned(), Duration::from_millis(1_500))
        .unwrap();
    let due = *delayed(&server, name).values().next().unwrap();
    let (consumer, entries) = recording(&q, &server.url(), Duration::from_secs(10));
    wait_until("the claim ahead", || {
        server.int(&["ZCARD", &key(name, "inflight")]) == 1
    });
    q.pause().unwrap();
    assert!(
        server.time_ms() < due,
        "the pause came after the due time: the test proves nothing"
    );
    // Paused: nothing starts, at its due time or after.
    while server.time_ms() < due + 1_500 {
        assert!(
            entries.recv_timeout(Duration::from_millis(50)).is_err(),
            "a handler ran on a paused queue"
        );
    }
    q.resume().unwrap();
    let e = entries
        .recv_timeout(HANG)
        .expect("the message after the resume");
    assert_eq!(e.attempt, 1, "the give-back counted an attempt");
    assert!(e.at >= due);
    wait_until("the ack", || server.int(&["HLEN", &key(name, "msg")]) == 0);
    consumer.shutdown(Duration::from_secs(10)).unwrap();
    assert!(entries.try_recv().is_err(), "the message ran twice");
}

#[test]
fn a_rate_limit_set_by_another_process_reaches_messages_claimed_ahead() {
    let server = RedisServer::start();
    let rw = server.connect();
    let name = "held-rate";
    let q = rw.queue::<String>(name).unwrap();
    for i in 0..10 {
        q.offer(&format!("m{i}"), Duration::from_millis(2_000))
            .unwrap();
    }
    let due = delayed(&server, name).values().copied().min().unwrap();
    let (consumer, entries) = recording(&q, &server.url(), Duration::from_secs(10));
    wait_until("the claims ahead", || {
        server.int(&["ZCARD", &key(name, "inflight")]) == 10
    });
    // Another process limits the queue to 2 deliveries per 10 s.
    let other = server.connect();
    let limited = other
        .queue_with::<String>(
            name,
            QueueOptions::default().rate_limit(2, Duration::from_secs(10)),
        )
        .unwrap();
    assert!(
        server.time_ms() < due,
        "the limit came after the due time: the test proves nothing"
    );
    let mut seen: HashMap<String, u32> = HashMap::new();
    while server.time_ms() < due + 3_000 {
        if let Ok(e) = entries.recv_timeout(Duration::from_millis(50)) {
            *seen.entry(e.id).or_default() += 1;
        }
    }
    let started: u32 = seen.values().sum();
    assert!(
        started <= 2,
        "{started} started within 3 s under 2 per 10 s"
    );
    limited.lift_limit(Limit::RateLimit).unwrap();
    while seen.len() < 10 {
        let e = entries.recv_timeout(HANG).expect("the rest, once lifted");
        assert_eq!(e.attempt, 1, "{}: a give-back counted an attempt", e.id);
        *seen.entry(e.id).or_default() += 1;
    }
    wait_until("the acks", || server.int(&["HLEN", &key(name, "msg")]) == 0);
    consumer.shutdown(Duration::from_secs(10)).unwrap();
    for e in entries.try_iter() {
        *seen.entry(e.id).or_default() += 1;
    }
    assert!(seen.values().all(|&n| n == 1), "{seen:?}");
}

#[test]
fn a_message_claimed_ahead_never_starts_before_its_due_time_by_the_server_clock() {
    // This process believes the server's clock 500 ms further ahead than
    // it is (as when the Redis host's clock is stepped back): its wheel
    // fires half a second early, and the hand-out must still wait for the
    // server's due time.
    let server = RedisServer::start();
    let rw = server.connect();
    redwheel::test_support::skew_clock_estimate(&rw, 500);
    let name = "held-clock";
    let q = rw.queue::<String>(name).unwrap();
    for i in 0..5 {
        q.offer(&format!("m{i}"), Duration::from_millis(1_500 + 100 * i))
            .unwrap();
    }
    let due = delayed(&server, name);
    let (consumer, entries) = recording(&q, &server.url(), Duration::from_secs(10));
    for _ in 0..5 {
        let e = entries.recv_timeout(HANG).expect("a handler entry");
        assert!(
            e.at >= due[&e.id],
            "{} started at {}, {} ms before its due time {}",
            e.id,
            e.at,
            due[&e.id] - e.at,
            due[&e.id]
        );
    }
    consumer.shutdown(Duration::from_secs(10)).unwrap();
}

#[test]
fn a_shutdown_while_the_hand_out_is_being_checked_gives_the_messages_back() {
    // The hand-out's check at the due time (claim_ahead.lua 'h') is on the
    // wire, its reply held back, when the pool shuts down: the messages
    // are neither started nor left claimed; they are back in the queue
    // (`delayed` at their due time, already past, so the transfer may have
    // moved them to `ready`), uncounted.
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let rw = Redwheel::connect(&proxy.url()).unwrap();
    let name = "held-stop";
    let q = rw.queue::<String>(name).unwrap();
    let mut con = redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let sha = redwheel::test_support::load_script(&mut con, "claim_ahead").unwrap();
    let check = proxy.inject(
        Rule::new(Fault::Forward)
            .matching(sha.as_bytes())
            .matching(b"$1\r\nh\r\n")
            .hold(),
    );
    for i in 0..5 {
        q.offer(&format!("m{i}"), Duration::from_millis(1_500))
            .unwrap();
    }
    let (consumer, entries) = recording(&q, &server.url(), Duration::from_secs(10));
    assert!(check.wait_matched(1, HANG), "no hand-out check was sent");
    consumer.shutdown(Duration::from_secs(10)).unwrap();
    check.release();
    assert!(entries.try_recv().is_err(), "a handler ran");
    // One atomic read (the transfer may move them meanwhile).
    let waiting = server.int(&[
        "EVAL",
        "return redis.call('ZCARD', KEYS[1]) + redis.call('LLEN', KEYS[2])",
        "2",
        &key(name, "delayed"),
        &key(name, "ready"),
    ]);
    assert_eq!(waiting, 5);
    assert_eq!(server.int(&["ZCARD", &key(name, "inflight")]), 0);
    assert_eq!(server.int(&["HLEN", &key(name, "attempts")]), 0);
    assert_eq!(
        num(&server, &["HGET", &key(name, "counts"), "delivered"]),
        0
    );
}

#[test]
fn a_give_back_of_claims_ahead_frees_its_in_flight_slot_for_a_waiting_claim() {
    let server = RedisServer::start();
    let name = "held-slot";
    // Pool A holds one message (m1) claimed ahead, at most one.
    let rw_a = server.connect();
    let qa = rw_a.queue::<String>(name).unwrap();
    let m1 = qa.offer(&"m1".to_owned(), Duration::from_secs(40)).unwrap();
    let a = qa
        .consume(
            ConsumerOptions::default()
                .claim_ahead(Duration::from_secs(60))
                .claim_ahead_max(1),
            |_| Ok::<(), String>(()),
        )
        .unwrap();
    wait_until("m1 claimed ahead", || {
        server.cmd(&["ZSCORE", &key(name, "inflight"), m1.as_str()]) != "$-1\r\n"
    });
    // Process B: one message in flight at most (m1 is), and one ready.
    let proxy = Proxy::start(server.port());
    let rw_b = Redwheel::connect(&proxy.url()).unwrap();
    let qb = rw_b
        .queue_with::<String>(name, QueueOptions::default().max_in_flight(1))
        .unwrap();
    let m2 = qb.offer(&"m2".to_owned(), Duration::ZERO).unwrap();
    let mut con = redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let sha = redwheel::test_support::load_script(&mut con, "claim").unwrap();
    // A claim of B that went with every key (the queue has controls) and
    // was answered: held back by max_in_flight, it waits for a slot (the
    // flag `release_waiters` says so to every process).
    let rate_key = key(name, "rate");
    let answered = proxy.inject(
        Rule::new(Fault::Forward)
            .matching(sha.as_bytes())
            .matching(rate_key.as_bytes()),
    );
    let waiting = std::thread::spawn(move || {
        let got = qb.claim(Duration::from_secs(25)).unwrap();
        got.map(|d| d.id().as_str().to_owned())
    });
    assert!(answered.wait_fired(1, HANG), "B's claim was never answered");
    let waiter = || server.int(&["HEXISTS", &key(name, "controls"), "release_waiters"]);
    assert_eq!(waiter(), 1, "B's claim was not held back");
    // A stops: m1 goes back, its slot is free, and the waiters are told
    // (as an ack tells them): the flag goes with the announcement.
    a.shutdown(Duration::from_secs(10)).unwrap();
    assert_ne!(
        server.cmd(&["ZSCORE", &key(name, "delayed"), m1.as_str()]),
        "$-1\r\n",
        "m1 was not given back"
    );
    assert_eq!(
        waiter(),
        0,
        "the give-back freed an in-flight slot without waking the claims waiting for one"
    );
    assert_eq!(waiting.join().unwrap().as_deref(), Some(m2.as_str()));
}
