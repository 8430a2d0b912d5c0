//! Failures and bad input: Redis restarts, a cut wake path, outages, and
//! every kind of invalid argument, each a typed error.

mod support;

use std::collections::HashSet;
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redwheel::{ErrorKind, MessageId, QueueOptions, Redwheel, RedwheelOptions};
use support::{RedisServer, within};

const HANG: Duration = Duration::from_secs(120);

#[test]
fn redis_killed_and_restarted_mid_test_loses_nothing() {
    let mut server = RedisServer::with_appendonly();
    let rw = server.connect();
    let q = rw.queue::<String>("restart").unwrap();
    let n = 200u64;
    let mut offered = HashSet::new();
    for i in 0..n {
        // Half are due before the kill, half after the restart.
        let delay = if i % 2 == 0 { i } else { 1_500 + i };
        offered.insert(
            q.offer(&format!("r{i}"), Duration::from_millis(delay))
                .unwrap(),
        );
    }
    // Phase 1: take 50, then stop, so that no take script is in flight
    // when the server is killed (a reply lost in flight is at-most-once).
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let (phase_tx, phase_rx) = mpsc::channel::<()>();
    let consumer = {
        let q = q.clone();
        std::thread::spawn(move || {
            let mut got = Vec::new();
            for _ in 0..50 {
                got.push(q.take().unwrap().id().clone());
            }
            phase_tx.send(()).unwrap();
            go_rx.recv().unwrap();
            // Phase 2: called while Redis is down; keeps waiting.
            while got.len() < n as usize {
                got.push(q.take().unwrap().id().clone());
            }
            got
        })
    };
    within(HANG, move || phase_rx.recv().unwrap());
    server.kill();
    go_tx.send(()).unwrap();

    // During the outage: offers fail with a transient typed error; a
    // short poll gives up with the same kind of error. The first offer may
    // go out on a pooled connection the kill closed: a command written to
    // a dead connection looks to the client exactly like one the server
    // ran just before it died, so that one is `OutcomeUnknown` (or
    // `Unavailable`, if the pool had checked the connection first). The
    // failure empties the pool: the next offer finds no server, and
    // nothing was sent.
    let err = q.offer(&"lost".to_string(), Duration::ZERO).unwrap_err();
    assert!(
        matches!(
            err.kind(),
            ErrorKind::Unavailable | ErrorKind::OutcomeUnknown
        ),
        "{err:?}"
    );
    assert!(err.is_transient());
    let err = q.offer(&"lost".to_string(), Duration::ZERO).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err:?}");
    let err = q.poll(Duration::from_millis(200)).unwrap_err();
    assert!(err.is_transient(), "{err:?}");
    assert!(q.len().unwrap_err().is_transient());

    server.restart();
    let got = within(HANG, move || consumer.join().unwrap());
    let got_set: HashSet<MessageId> = got.iter().cloned().collect();
    assert_eq!(got.len(), got_set.len(), "no duplicates");
    assert_eq!(
        got_set, offered,
        "every message offered before the kill was delivered"
    );
    assert_eq!(q.len().unwrap(), 0);
    // And the queue works normally afterwards.
    q.offer(&"after".to_string(), Duration::from_millis(10))
        .unwrap();
    let m = within(HANG, move || q.take().unwrap());
    assert_eq!(m.payload(), "after");
}

#[test]
fn delivery_continues_after_the_wake_path_is_cut() {
    let server = RedisServer::start();
    let guard = Duration::from_millis(500);
    let rw = server.connect();
    let q = rw
        .queue_with::<String>("cut", QueueOptions::default().guard_interval(guard))
        .unwrap();
    // Make sure the subscriber is up before cutting it: Redis is another
    // process, so look at its subscription count until it shows.
    let server = within(HANG, move || {
        while !server
            .cmd(&["PUBSUB", "SHARDNUMSUB", "redwheel:{cut}:wake"])
            .contains(":1\r\n")
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        server
    });
    let killed = server.int(&["CLIENT", "KILL", "TYPE", "pubsub"]);
    assert!(killed >= 1, "the subscriber connection was killed");
    for i in 0..5u64 {
        q.offer(&format!("c{i}"), Duration::from_millis(20 + i * 20))
            .unwrap();
    }
    // Delivered (by the reconnect sweep or the guard sweep), never early.
    // The bound is many guard intervals long: it is a hang guard, not a
    // latency assertion.
    let got = within(HANG, move || {
        (0..5)
            .map(|_| {
                let m = q
                    .poll(guard * 40)
                    .unwrap()
                    .expect("delivered within 40 guard intervals");
                (m, server.time_ms())
            })
            .collect::<Vec<_>>()
    });
    for (i, (m, at)) in got.iter().enumerate() {
        assert_eq!(m.payload(), &format!("c{i}"));
        assert!(*at >= m.due_ms(), "not early");
    }
}

#[test]
fn a_blocked_take_returns_shutdown_promptly() {
    let server = RedisServer::start();
    let rw = server.connect();
    let q = rw.queue::<String>("shut").unwrap();
    let (started_tx, started_rx) = mpsc::channel();
    let consumer = {
        let q = q.clone();
        std::thread::spawn(move || {
            started_tx.send(()).unwrap();
            q.take()
        })
    };
    started_rx.recv().unwrap();
    rw.shutdown(Duration::from_secs(10)).unwrap();
    let r = within(HANG, move || consumer.join().unwrap());
    assert_eq!(r.unwrap_err().kind(), ErrorKind::Shutdown);
    assert_eq!(
        q.offer(&"x".to_string(), Duration::ZERO)
            .unwrap_err()
            .kind(),
        ErrorKind::Shutdown
    );
    assert_eq!(
        rw.queue::<String>("other").unwrap_err().kind(),
        ErrorKind::Shutdown
    );
    rw.shutdown(Duration::from_secs(1)).unwrap();
    drop(server);
}

#[test]
fn connecting_to_nothing_is_a_transient_error_and_a_bad_url_is_not() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let err = Redwheel::connect(&format!("redis://127.0.0.1:{port}/")).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err:?}");
    assert!(err.is_transient());
    assert!(err.redis_error().is_some(), "the redis error is kept");
    let text = err.to_string();
    assert!(
        text.contains(&format!("cannot connect to redis at 127.0.0.1:{port}"))
            && text.contains("refused"),
        "the message says what went wrong: {text}"
    );
    let err = Redwheel::connect("not a url").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidUrl, "{err:?}");
    assert!(err.is_invalid_input() && !err.is_transient());
    assert!(
        err.to_string().contains("invalid redis URL \"not a url\""),
        "{err}"
    );
}

#[test]
fn invalid_queue_names_are_rejected() {
    let server = RedisServer::start();
    let rw = server.connect();
    let long = "n".repeat(201);
    for name in [
        "",
        "a{b",
        "a}b",
        "{tag}",
        "tab\there",
        "nul\0",
        long.as_str(),
    ] {
        let err = rw.queue::<String>(name).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidName, "{name:?}: {err:?}");
        assert!(err.is_invalid_input());
    }
    assert!(rw.queue::<String>("ünïcode name: ok").is_ok());
    assert!(rw.queue::<String>(&"n".repeat(200)).is_ok());
}

#[test]
fn invalid_options_are_rejected() {
    let server = RedisServer::start();
    let rw = server.connect();
    for opts in [
        QueueOptions::default().transfer_batch(0),
        QueueOptions::default().transfer_batch(4_001),
        QueueOptions::default().guard_interval(Duration::ZERO),
        QueueOptions::default().guard_interval(Duration::MAX),
        QueueOptions::default().max_payload_bytes(0),
    ] {
        let err = rw.queue_with::<String>("opts", opts).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidOption, "{err:?}");
    }
    let err = Redwheel::connect_with(
        &server.url(),
        redwheel::RedwheelOptions::default().max_block(Duration::from_secs(5)),
    )
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidOption, "{err:?}");
}

#[test]
fn delays_that_overflow_are_rejected_and_nothing_is_written() {
    let server = RedisServer::start();
    let rw = server.connect();
    let q = rw.queue::<String>("overflow").unwrap();
    let x = "x".to_string();
    for delay in [
        Duration::MAX,
        Duration::from_millis(1 << 53),
        Duration::from_secs(u64::MAX / 2),
    ] {
        let err = q.offer(&x, delay).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::DelayOverflow, "{delay:?}: {err:?}");
        assert!(err.is_invalid_input());
    }
    let far = UNIX_EPOCH + Duration::from_millis((1 << 53) + 1);
    assert_eq!(
        q.offer_at(&x, far).unwrap_err().kind(),
        ErrorKind::DelayOverflow
    );
    // The largest due accepted: 2^53 ms since the epoch.
    assert!(
        q.offer_at(&x, UNIX_EPOCH + Duration::from_millis(1 << 53))
            .is_ok()
    );
    // One bad delay in a batch rejects the whole batch.
    let batch = vec![(x.clone(), Duration::ZERO), (x.clone(), Duration::MAX)];
    assert_eq!(
        q.offer_batch(&batch).unwrap_err().kind(),
        ErrorKind::DelayOverflow
    );
    assert_eq!(q.len().unwrap(), 1, "only the 2^53 one was written");
    // A year is fine.
    assert!(
        q.offer_at(&x, SystemTime::now() + Duration::from_secs(365 * 86_400))
            .is_ok()
    );
}

#[test]
fn payloads_over_the_limit_are_rejected() {
    let server = RedisServer::start();
    let rw = server.connect();
    let q = rw
        .queue_with::<Vec<u8>>("big", QueueOptions::default().max_payload_bytes(16))
        .unwrap();
    assert!(q.offer(&vec![0; 16], Duration::from_secs(60)).is_ok());
    let err = q.offer(&vec![0; 17], Duration::ZERO).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::PayloadTooLarge, "{err:?}");
    assert_eq!(
        err.to_string(),
        "queue \"big\": payload of 17 bytes exceeds the limit of 16 bytes \
         (QueueOptions::max_payload_bytes); nothing was written"
    );
    assert!(err.is_invalid_input());
    let batch = vec![
        (vec![1u8], Duration::ZERO),
        (vec![0u8; 100], Duration::ZERO),
    ];
    assert_eq!(
        q.offer_batch(&batch).unwrap_err().kind(),
        ErrorKind::PayloadTooLarge
    );
    assert_eq!(q.len().unwrap(), 1);
}

#[test]
fn invalid_message_ids_are_rejected_by_remove() {
    let server = RedisServer::start();
    let rw = server.connect();
    let q = rw.queue::<String>("ids").unwrap();
    for id in [String::new(), "i".repeat(129)] {
        let err = q.remove(&MessageId::from(id)).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidId, "{err:?}");
    }
}

#[test]
fn an_undecodable_payload_is_a_typed_error_naming_the_message_and_it_is_not_lost() {
    let server = RedisServer::start();
    let rw = server.connect();
    let raw = rw.queue::<Vec<u8>>("decode").unwrap();
    let text = rw.queue::<String>("decode").unwrap();
    let bad = raw.offer(&vec![0xff, 0xfe, 0x00], Duration::ZERO).unwrap();
    let good = text
        .offer(&"fine".to_string(), Duration::from_millis(30))
        .unwrap();
    let (first, second) = within(HANG, {
        let text = text.clone();
        move || (text.take(), text.take())
    });
    let err = first.expect_err("a decode error");
    assert_eq!(err.kind(), ErrorKind::Decode, "{err:?}");
    assert_eq!(err.queue(), Some("decode"));
    assert_eq!(
        err.message_id(),
        Some(bad.as_str()),
        "the error names the message"
    );
    assert!(
        err.to_string().contains("invalid utf-8"),
        "the codec's error is in the message: {err}"
    );
    // The next message is delivered: the bad one does not block the queue.
    assert_eq!(second.unwrap().id(), &good);
    // The bad one is parked, with its payload, not lost.
    assert_eq!(text.dead_letter_ids(10).unwrap(), vec![bad.clone()]);
    let stored = server.cmd(&["HEXISTS", "redwheel:{decode}:msg", bad.as_str()]);
    assert_eq!(stored.trim(), ":1");
    assert_eq!(
        text.len().unwrap(),
        0,
        "dead letters do not count as waiting"
    );
    // Cleared with the queue.
    assert_eq!(text.clear().unwrap(), 1);
}

/// Waits (polling the server, with a hang guard) until `cond` holds.
fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let give_up = Instant::now() + HANG;
    while !cond() {
        assert!(Instant::now() < give_up, "hang guard: {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

// A user froze Redis (`kill -STOP`): `offer` answered after two timeouts
// with an error documented as "retry later", although the message had been
// written, so the retry delivered it twice.
#[test]
fn an_offer_to_a_frozen_redis_is_sent_once_and_reported_as_outcome_unknown() {
    let server = RedisServer::start();
    let rw = Redwheel::connect_with(
        &server.url(),
        RedwheelOptions::default().command_timeout(Duration::from_millis(300)),
    )
    .unwrap();
    let q = rw.queue::<String>("frozen").unwrap();
    q.offer(&"warm".to_string(), Duration::from_secs(60))
        .unwrap();
    // Counted by its ZADD: the transfer writes hashes too (the queue's
    // `head`), but adds to no sorted set here.
    let zadds = server.calls("zadd");

    server.signal("STOP");
    // Sent on the pooled connection; Redis never answers.
    let id = MessageId::from("order-7");
    let started = Instant::now();
    let err = q
        .offer_with_id(&id, &"order 7".to_string(), Duration::from_secs(60))
        .unwrap_err();
    let took = started.elapsed();
    assert_eq!(err.kind(), ErrorKind::OutcomeUnknown, "{err}");
    assert!(err.is_transient() && err.is_outcome_unknown());
    assert_eq!(err.queue(), Some("frozen"));
    assert_eq!(
        err.message_id(),
        Some("order-7"),
        "the error names the message"
    );
    assert!(
        err.to_string().contains("may or may not have happened"),
        "{err}"
    );
    eprintln!("the offer to a frozen redis returned after {took:?} (command_timeout 300 ms)");
    // A new connection cannot even be set up: nothing is sent, and the
    // error says so.
    let err = q
        .offer(&"never sent".to_string(), Duration::from_secs(60))
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    server.signal("CONT");

    // The one offer that was sent ran once when Redis woke up: it was not
    // retried behind the caller's back.
    eventually("the frozen offer ran", || server.calls("zadd") > zadds);
    assert_eq!(server.calls("zadd"), zadds + 1);
    // The caller retries the idempotent offer: it had landed, and stays
    // there once.
    assert!(
        !q.offer_with_id(&id, &"order 7".to_string(), Duration::from_secs(60))
            .unwrap()
    );
    assert_eq!(q.len().unwrap(), 2, "warm and order-7");
}

// A user removed a dead-lettered id: `remove` said true but left the id on
// the dead list, so `len()` (msg − dead) under-counted from then on.
#[test]
fn removing_a_dead_letter_removes_every_trace_and_len_stays_exact() {
    let server = RedisServer::start();
    let rw = server.connect();
    let bytes = rw.queue::<Vec<u8>>("dead-remove").unwrap();
    let text = rw.queue::<String>("dead-remove").unwrap();
    let bad = bytes.offer(&vec![0xff], Duration::ZERO).unwrap();
    let err = within(HANG, {
        let text = text.clone();
        move || text.take().unwrap_err()
    });
    assert_eq!(err.kind(), ErrorKind::Decode);
    assert_eq!(text.dead_letter_ids(10).unwrap(), vec![bad.clone()]);

    assert!(text.remove(&bad).unwrap());
    assert!(text.dead_letter_ids(10).unwrap().is_empty());
    assert!(!text.remove(&bad).unwrap(), "gone for good");
    text.offer(&"later".to_string(), Duration::from_secs(60))
        .unwrap();
    assert_eq!(text.len().unwrap(), 1);
    assert!(!text.is_empty().unwrap());
}

// A user saw overdue messages arrive 551 ms after Redis was back (the
// reconnect backoff reached 2 s). With the guard sweep a day away, only the
// reconnect path can deliver here: the driver runs every queue once it
// reaches Redis again.
#[test]
fn delivery_resumes_after_a_restart_without_waiting_for_a_sweep() {
    let mut server = RedisServer::with_appendonly();
    let rw = server.connect();
    let q = rw
        .queue_with::<String>(
            "resume",
            QueueOptions::default().guard_interval(Duration::from_secs(86_400)),
        )
        .unwrap();
    // Make sure the queue's first run is done, so what follows depends on
    // the reconnect alone.
    q.offer(&"warm-up".to_string(), Duration::ZERO).unwrap();
    within(HANG, {
        let q = q.clone();
        move || q.take().unwrap()
    });
    let ids: HashSet<MessageId> = (0..20)
        .map(|i| {
            q.offer(&format!("m{i}"), Duration::from_millis(300))
                .unwrap()
        })
        .collect();
    server.kill();
    // Down for longer than the messages' delay: all are overdue at restart.
    std::thread::sleep(Duration::from_millis(500));
    server.restart();
    let back = Instant::now();
    let (got, first) = within(HANG, move || {
        let first = q.take().unwrap();
        let at = back.elapsed();
        let mut got: HashSet<MessageId> = HashSet::from([first.id().clone()]);
        while got.len() < 20 {
            got.insert(q.take().unwrap().id().clone());
        }
        (got, at)
    });
    eprintln!("first overdue delivery {first:?} after redis accepted connections again");
    assert_eq!(got, ids);
}

/// A pooled connection the server closed while it sat idle (a restart,
/// the server's `timeout`, a load balancer) is found out by a `PING`
/// before it carries a write: the offer goes out once, on a fresh
/// connection, and returns `Ok` (never `OutcomeUnknown` for a write that
/// never reached a live connection).
#[test]
fn an_offer_after_the_server_closed_an_idle_connection_is_written_once() {
    let server = RedisServer::start();
    let rw = server.connect();
    let q = rw.queue::<String>("idle-closed").unwrap();
    q.offer(&"first".to_string(), Duration::from_secs(3600))
        .unwrap();
    // Every client connection is closed by the server; ours sits in the
    // pool. The pool checks connections idle for a second or more, so the
    // scenario is a connection idle that long (the sleep is the
    // precondition, not a wait for something to happen).
    server.cmd(&["CLIENT", "KILL", "TYPE", "normal"]);
    std::thread::sleep(Duration::from_millis(1_100));
    let id = q
        .offer(&"second".to_string(), Duration::from_secs(3600))
        .expect("written on a fresh connection");
    let stored = server.cmd(&["HGET", "redwheel:{idle-closed}:msg", id.as_str()]);
    assert!(stored.ends_with(":second\r\n"), "{stored}");
    assert_eq!(q.len().unwrap(), 2);
}
