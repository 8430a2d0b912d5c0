//! At-least-once consumption: claim, ack, nack, visibility, the delivery
//! limit, dead letters, counts, and the consumer pool.

mod support;

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redwheel::{ConsumerOptions, ErrorKind, MessageId, Nacked, QueueOptions, Redwheel};
use support::{RedisServer, within};

const HANG: Duration = Duration::from_secs(120);
const WAIT: Duration = Duration::from_secs(30);

fn setup() -> (RedisServer, Redwheel) {
    let server = RedisServer::start();
    let rw = server.connect();
    (server, rw)
}

fn short(visibility_ms: u64) -> QueueOptions {
    QueueOptions::default().visibility(Duration::from_millis(visibility_ms))
}

#[test]
fn an_acked_claim_leaves_no_trace() {
    let (server, rw) = setup();
    let q = rw.queue::<String>("ack").unwrap();
    let id = q.offer(&"a".to_string(), Duration::ZERO).unwrap();
    let d = q.claim(WAIT).unwrap().expect("a delivery");
    assert_eq!((d.id(), d.payload().as_str(), d.attempt()), (&id, "a", 1));
    let s = q.stats().unwrap();
    assert_eq!((s.in_flight, s.ready, s.delayed, s.dead), (1, 0, 0, 0));
    assert_eq!(
        q.len().unwrap(),
        1,
        "a claimed message still counts until acked"
    );
    d.ack().unwrap();
    d.ack().expect("an ack is idempotent");
    assert_eq!(q.len().unwrap(), 0);
    for key in ["msg", "inflight", "lease", "attempts"] {
        assert_eq!(
            server.int(&["EXISTS", &format!("redwheel:{{ack}}:{key}")]),
            0,
            "{key} is empty"
        );
    }
    assert!(q.claim(Duration::from_millis(50)).unwrap().is_none());
}

#[test]
fn an_unacked_claim_is_delivered_again_and_the_late_ack_is_refused() {
    let (_server, rw) = setup();
    let q = rw.queue_with::<String>("redeliver", short(200)).unwrap();
    let id = q.offer(&"r".to_string(), Duration::ZERO).unwrap();
    let first = q.claim(WAIT).unwrap().unwrap();
    // Not acked: once its visibility ends the message comes back.
    let second = q.claim(WAIT).unwrap().expect("delivered again");
    assert_eq!(second.id(), &id);
    assert_eq!(second.attempt(), 2);
    assert!(second.visible_until() > first.visible_until());
    let err = first.ack().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::StaleDelivery, "{err}");
    assert_eq!(err.message_id(), Some(id.as_str()));
    assert_eq!(
        first.nack(Duration::ZERO).unwrap_err().kind(),
        ErrorKind::StaleDelivery
    );
    assert_eq!(
        first.extend(Duration::from_secs(9)).unwrap_err().kind(),
        ErrorKind::StaleDelivery
    );
    // The refused calls did not touch the current delivery.
    second.ack().unwrap();
    assert_eq!(q.len().unwrap(), 0);
}

#[test]
fn a_nacked_message_comes_back_after_its_delay() {
    let (_server, rw) = setup();
    let q = rw.queue::<String>("nack").unwrap();
    q.offer(&"n".to_string(), Duration::ZERO).unwrap();
    let d = q.claim(WAIT).unwrap().unwrap();
    assert_eq!(d.nack(Duration::from_millis(200)).unwrap(), Nacked::Retried);
    assert_eq!(
        q.stats().unwrap().delayed,
        1,
        "rescheduled through the delayed set"
    );
    assert!(
        q.claim(Duration::from_millis(20)).unwrap().is_none(),
        "not before its delay"
    );
    let again = q.claim(WAIT).unwrap().unwrap();
    assert_eq!(again.attempt(), 2);
    again.ack().unwrap();
}

#[test]
fn extend_keeps_a_long_job_from_being_delivered_again() {
    let (_server, rw) = setup();
    let q = rw.queue_with::<String>("extend", short(300)).unwrap();
    q.offer(&"long".to_string(), Duration::ZERO).unwrap();
    let d = q.claim(WAIT).unwrap().unwrap();
    for _ in 0..4 {
        // Each extension moves the deadline; nobody else gets the message.
        d.extend(Duration::from_millis(300)).unwrap();
        assert!(q.claim(Duration::from_millis(150)).unwrap().is_none());
    }
    d.ack().unwrap();
    assert_eq!(q.len().unwrap(), 0);
}

#[test]
fn a_message_that_keeps_failing_ends_in_the_dead_letters_after_exactly_max_deliveries() {
    let (_server, rw) = setup();
    let q = rw
        .queue_with::<String>("limit", short(100).max_deliveries(3))
        .unwrap();
    let id = q.offer(&"bad".to_string(), Duration::ZERO).unwrap();
    let attempts = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&attempts);
    let consumer = q
        .consume(
            ConsumerOptions::default()
                .concurrency(2)
                .retry_backoff(Duration::from_millis(10), Duration::from_millis(20)),
            move |d| {
                seen.lock().unwrap().push(d.attempt());
                Err("it always fails")
            },
        )
        .unwrap();
    let dead = within(HANG, {
        let q = q.clone();
        move || loop {
            let dead = q.dead_letters(10).unwrap();
            if !dead.is_empty() {
                return dead;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    });
    consumer.shutdown(Duration::from_secs(10)).unwrap();
    assert_eq!(
        *attempts.lock().unwrap(),
        vec![1, 2, 3],
        "exactly max_deliveries attempts"
    );
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].id(), &id);
    assert_eq!(dead[0].attempts(), 3);
    assert_eq!(dead[0].payload().map(String::as_str), Some("bad"));
    assert!(
        dead[0].reason().contains("it always fails"),
        "{}",
        dead[0].reason()
    );
    let s = q.stats().unwrap();
    assert_eq!((s.dead, s.in_flight, s.ready, s.delayed), (1, 0, 0, 0));
    assert_eq!(q.len().unwrap(), 0, "dead letters are not waiting");
    // A fresh start: back to ready, attempts counted from 1 again.
    assert_eq!(q.requeue_dead(10).unwrap(), 1);
    let d = q.claim(WAIT).unwrap().unwrap();
    assert_eq!((d.id(), d.attempt()), (&id, 1));
    d.ack().unwrap();
    assert!(q.dead_letters(10).unwrap().is_empty());
}

#[test]
fn an_expired_claim_at_the_limit_dies_instead_of_coming_back() {
    let (_server, rw) = setup();
    let q = rw
        .queue_with::<String>("expire-limit", short(50).max_deliveries(2))
        .unwrap();
    q.offer(&"x".to_string(), Duration::ZERO).unwrap();
    let _a = q.claim(WAIT).unwrap().unwrap();
    let _b = q.claim(WAIT).unwrap().unwrap(); // after the first visibility ended
    // The second visibility ends too: no third delivery, a dead letter.
    assert!(q.claim(Duration::from_millis(500)).unwrap().is_none());
    let dead = q.dead_letters(10).unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].attempts(), 2);
    assert!(
        dead[0].reason().contains("without an ack"),
        "{}",
        dead[0].reason()
    );
}

#[test]
fn claim_batch_takes_up_to_n_in_one_call() {
    let (_server, rw) = setup();
    let q = rw.queue::<String>("batch").unwrap();
    let ids: HashSet<MessageId> = q
        .offer_batch(
            &(0..5)
                .map(|i| (format!("b{i}"), Duration::ZERO))
                .collect::<Vec<_>>(),
        )
        .unwrap()
        .into_iter()
        .collect();
    let first = within(HANG, {
        let q = q.clone();
        move || {
            // Wait until all five are ready, then claim three at once.
            while q.stats().unwrap().ready < 5 {
                std::thread::sleep(Duration::from_millis(5));
            }
            q.claim_batch(3, WAIT).unwrap()
        }
    });
    assert_eq!(first.len(), 3);
    let rest = q.claim_batch(10, WAIT).unwrap();
    assert_eq!(rest.len(), 2);
    let got: HashSet<MessageId> = first.iter().chain(&rest).map(|d| d.id().clone()).collect();
    assert_eq!(got, ids);
    for d in first.iter().chain(&rest) {
        d.ack().unwrap();
    }
    assert_eq!(
        q.claim_batch(0, WAIT).unwrap_err().kind(),
        ErrorKind::InvalidOption
    );
}

#[test]
fn an_undecodable_claim_goes_to_the_dead_letters_with_the_decode_error() {
    let (_server, rw) = setup();
    let raw = rw.queue::<Vec<u8>>("claim-decode").unwrap();
    let text = rw.queue::<String>("claim-decode").unwrap();
    let bad = raw.offer(&vec![0xff, 0xfe], Duration::ZERO).unwrap();
    let err = text.claim(WAIT).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Decode);
    assert_eq!(err.message_id(), Some(bad.as_str()));
    let dead = text.dead_letters(10).unwrap();
    assert_eq!(dead.len(), 1);
    assert!(dead[0].payload().is_none());
    assert_eq!(dead[0].raw_payload(), [0xff, 0xfe]);
    assert!(
        dead[0].reason().contains("could not decode"),
        "{}",
        dead[0].reason()
    );
    assert_eq!(text.stats().unwrap().in_flight, 0, "no longer in flight");
}

#[test]
fn remove_works_on_claimed_and_dead_messages() {
    let (_server, rw) = setup();
    let q = rw
        .queue_with::<String>("remove-any", short(100).max_deliveries(1))
        .unwrap();
    let a = q.offer(&"a".to_string(), Duration::ZERO).unwrap();
    let b = q.offer(&"b".to_string(), Duration::ZERO).unwrap();
    let da = q.claim(WAIT).unwrap().unwrap();
    assert!(q.remove(da.id()).unwrap(), "a claimed message is removed");
    // Its ack finds it gone: nothing to do.
    da.ack().unwrap();
    let db = q.claim(WAIT).unwrap().unwrap();
    assert_eq!(
        db.nack(Duration::ZERO).unwrap(),
        Nacked::Dead,
        "max_deliveries 1"
    );
    assert!(q.remove(&b).unwrap(), "a dead letter is removed");
    assert!(!q.remove(&a).unwrap());
    let s = q.stats().unwrap();
    assert_eq!((s.dead, s.in_flight, s.delayed, s.ready), (0, 0, 0, 0));
    assert_eq!(q.len().unwrap(), 0);
}

#[test]
fn stats_ready_counts_messages_not_the_entries_removed_ones_left() {
    let (server, rw) = setup();
    let q = rw.queue::<String>("stats-stale").unwrap();
    let gone = q.offer(&"gone".to_string(), Duration::ZERO).unwrap();
    q.offer(&"kept".to_string(), Duration::ZERO).unwrap();
    until_ready(&server, "stats-stale", 2);
    // Removed once due: its entry stays in the ready list until a
    // consumer skips it, but the message is gone.
    assert!(q.remove(&gone).unwrap());
    let s = q.stats().unwrap();
    assert_eq!((s.delayed, s.ready, s.in_flight, s.dead), (0, 1, 0, 0));
    assert_eq!(s.ready, q.len().unwrap());
}

#[test]
fn stats_count_every_state_and_the_oldest_overdue() {
    let (_server, rw) = setup();
    let q = rw.queue::<String>("stats").unwrap();
    q.offer(&"later".to_string(), Duration::from_secs(3_600))
        .unwrap();
    q.offer_batch(&[
        ("r1".to_string(), Duration::ZERO),
        ("r2".to_string(), Duration::ZERO),
    ])
    .unwrap();
    let s = within(HANG, {
        let q = q.clone();
        move || loop {
            let s = q.stats().unwrap();
            if s.ready == 2 {
                return s;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    });
    assert_eq!((s.delayed, s.ready, s.in_flight, s.dead), (1, 2, 0, 0));
    assert!(s.oldest_overdue.is_some());
    assert!(s.next_due.is_some());
    let d = q.claim(WAIT).unwrap().unwrap();
    let s = q.stats().unwrap();
    assert_eq!((s.ready, s.in_flight), (1, 1));
    d.ack().unwrap();
}

#[test]
fn a_consumer_pool_acks_what_succeeds_and_treats_a_panic_as_a_failure() {
    // Four claimers each running its one worker's handler itself.
    pool_acks_and_fails_a_panic(ConsumerOptions::default().concurrency(4));
}

#[test]
fn a_claimer_feeding_worker_threads_acks_what_succeeds_and_fails_a_panic() {
    // One claimer handing messages to four worker threads, and three
    // claimers sharing seven.
    pool_acks_and_fails_a_panic(ConsumerOptions::default().concurrency(4).claimers(1));
    pool_acks_and_fails_a_panic(ConsumerOptions::default().concurrency(7).claimers(3));
}

fn pool_acks_and_fails_a_panic(options: ConsumerOptions) {
    let (_server, rw) = setup();
    let q = rw.queue_with::<String>("pool", short(5_000)).unwrap();
    let n = 200;
    q.offer_batch(
        &(0..n)
            .map(|i| (format!("p{i}"), Duration::ZERO))
            .collect::<Vec<_>>(),
    )
    .unwrap();
    let handled = Arc::new(Mutex::new(Vec::new()));
    let panicked = Arc::new(AtomicUsize::new(0));
    let consumer = {
        let handled = Arc::clone(&handled);
        let panicked = Arc::clone(&panicked);
        q.consume(
            options.retry_backoff(Duration::from_millis(5), Duration::from_millis(5)),
            move |d| -> Result<(), String> {
                if d.payload() == "p7" && d.attempt() == 1 {
                    panicked.fetch_add(1, Ordering::SeqCst);
                    panic!("boom on p7");
                }
                handled.lock().unwrap().push(d.payload().clone());
                Ok(())
            },
        )
        .unwrap()
    };
    within(HANG, {
        let handled = Arc::clone(&handled);
        let q = q.clone();
        move || {
            // Handled, and the last acks sent (they go with the next claim).
            while handled.lock().unwrap().len() < n || q.len().unwrap() > 0 {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    });
    // The workers count an ack once its reply is back.
    let give_up = std::time::Instant::now() + HANG;
    while consumer.handled() < n as u64 && std::time::Instant::now() < give_up {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(consumer.handled(), n as u64);
    assert_eq!(consumer.failed(), 1, "the panic counted as a failure");
    consumer.shutdown(Duration::from_secs(10)).unwrap();
    let got: HashSet<String> = handled.lock().unwrap().iter().cloned().collect();
    assert_eq!(got.len(), n, "each handled once");
    assert_eq!(panicked.load(Ordering::SeqCst), 1);
    assert_eq!(q.len().unwrap(), 0);
}

#[test]
fn a_running_handler_keeps_its_message_past_the_visibility() {
    let (_server, rw) = setup();
    // A 300 ms visibility, a 1 s job: extended while it runs.
    let q = rw.queue_with::<String>("long-job", short(300)).unwrap();
    q.offer(&"job".to_string(), Duration::ZERO).unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let consumer = {
        let runs = Arc::clone(&runs);
        q.consume(
            ConsumerOptions::default().concurrency(2),
            move |_d| -> Result<(), String> {
                runs.fetch_add(1, Ordering::SeqCst);
                std::thread::sleep(Duration::from_secs(1));
                Ok(())
            },
        )
        .unwrap()
    };
    within(HANG, {
        let q = q.clone();
        move || {
            while q.len().unwrap() > 0 {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    });
    consumer.shutdown(Duration::from_secs(10)).unwrap();
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "never handed to the idle worker"
    );
}

#[test]
fn a_handler_past_its_timeout_fails_and_its_late_result_does_not_ack() {
    let (_server, rw) = setup();
    let q = rw.queue_with::<String>("timeout", short(300)).unwrap();
    q.offer(&"slow".to_string(), Duration::ZERO).unwrap();
    let attempts = Arc::new(Mutex::new(Vec::new()));
    let (release_tx, release_rx) = crossbeam_channel::unbounded::<()>();
    let consumer = {
        let attempts = Arc::clone(&attempts);
        q.consume(
            ConsumerOptions::default()
                .concurrency(2)
                .handler_timeout(Duration::from_millis(200))
                .retry_backoff(Duration::from_millis(10), Duration::from_millis(10)),
            move |d| -> Result<(), String> {
                attempts.lock().unwrap().push(d.attempt());
                if d.attempt() == 1 {
                    // Stuck until the test lets it go, well past the timeout.
                    let _ = release_rx.recv_timeout(HANG);
                }
                Ok(())
            },
        )
        .unwrap()
    };
    // The second attempt (on the other worker) succeeds and acks.
    within(HANG, {
        let q = q.clone();
        move || {
            while q.len().unwrap() > 0 {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    });
    drop(release_tx); // the first handler returns Ok now, too late
    consumer.shutdown(Duration::from_secs(10)).unwrap();
    assert_eq!(*attempts.lock().unwrap(), vec![1, 2]);
    assert_eq!(q.len().unwrap(), 0);
}

#[test]
fn shutdown_gives_back_the_messages_of_handlers_still_running() {
    let (_server, rw) = setup();
    let q = rw.queue_with::<String>("release", short(60_000)).unwrap();
    q.offer(&"held".to_string(), Duration::ZERO).unwrap();
    let (started_tx, started) = crossbeam_channel::bounded::<()>(1);
    let (release_tx, release_rx) = crossbeam_channel::unbounded::<()>();
    let consumer = q
        .consume(
            ConsumerOptions::default(),
            move |_d| -> Result<(), String> {
                let _ = started_tx.send(());
                let _ = release_rx.recv_timeout(HANG);
                Ok(())
            },
        )
        .unwrap();
    started.recv_timeout(HANG).unwrap();
    let err = consumer.shutdown(Duration::from_millis(100)).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ShutdownTimeout, "{err}");
    // Given back at once, not after the 60 s visibility.
    let d = q
        .claim(WAIT)
        .unwrap()
        .expect("released for another consumer");
    assert_eq!(d.attempt(), 2);
    d.ack().unwrap();
    drop(release_tx);
}

#[test]
fn invalid_consumer_and_queue_options_are_rejected() {
    let (_server, rw) = setup();
    for opts in [
        QueueOptions::default().visibility(Duration::ZERO),
        QueueOptions::default().max_deliveries(0),
    ] {
        assert_eq!(
            rw.queue_with::<String>("bad-opts", opts)
                .unwrap_err()
                .kind(),
            ErrorKind::InvalidOption
        );
    }
    let q = rw.queue::<String>("bad-consumer").unwrap();
    for opts in [
        ConsumerOptions::default().concurrency(0),
        ConsumerOptions::default().concurrency(2).claimers(0),
        ConsumerOptions::default().concurrency(2).claimers(3),
        ConsumerOptions::default().poll(Duration::ZERO),
        ConsumerOptions::default().handler_timeout(Duration::ZERO),
        ConsumerOptions::default().retry_backoff(Duration::from_secs(2), Duration::from_secs(1)),
    ] {
        let err = q
            .consume(opts, |_d| -> Result<(), String> { Ok(()) })
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidOption);
    }
}

/// Waits (bounded by `within`) until `q` holds `n` entries in `ready`.
/// Waits until the ready list of queue `name` holds `n` entries (read
/// from the server: `stats().ready` counts messages, not the entries a
/// removed message left behind).
fn until_ready(server: &RedisServer, name: &str, n: i64) {
    let key = format!("redwheel:{{{name}}}:ready");
    let give_up = std::time::Instant::now() + HANG;
    while server.int(&["LLEN", &key]) < n {
        assert!(
            std::time::Instant::now() < give_up,
            "hang guard: {n} ready in {name}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn an_id_offered_again_after_its_removal_from_ready_is_not_delivered_early() {
    let (server, rw) = setup();
    let id = MessageId::from("re-offered");
    for (queue, by_claim) in [("again-claim", true), ("again-take", false)] {
        let q = rw.queue::<String>(queue).unwrap();
        assert!(
            q.offer_with_id(&id, &"first".into(), Duration::ZERO)
                .unwrap()
        );
        until_ready(&server, queue, 1);
        // Removed while its id waits in `ready`, then offered again for
        // an hour from now: the old entry must not deliver the new one.
        assert!(q.remove(&id).unwrap());
        assert!(
            q.offer_with_id(&id, &"later".into(), Duration::from_secs(3600))
                .unwrap()
        );
        if by_claim {
            assert!(q.claim(Duration::from_millis(300)).unwrap().is_none());
        } else {
            assert!(q.poll(Duration::from_millis(300)).unwrap().is_none());
        }
        let s = q.stats().unwrap();
        assert_eq!((s.delayed, s.ready, s.in_flight), (1, 0, 0), "{queue}");
        assert_eq!(q.len().unwrap(), 1);
    }
}

#[test]
fn an_id_offered_again_after_its_removal_from_ready_is_claimed_once() {
    let (server, rw) = setup();
    let q = rw
        .queue_with::<String>("again-once", short(60_000))
        .unwrap();
    let id = MessageId::from("twice-queued");
    assert!(
        q.offer_with_id(&id, &"first".into(), Duration::ZERO)
            .unwrap()
    );
    until_ready(&server, "again-once", 1);
    assert!(q.remove(&id).unwrap());
    assert!(
        q.offer_with_id(&id, &"second".into(), Duration::ZERO)
            .unwrap()
    );
    // The stale entry and the new one both sit in `ready` now; the
    // removed message is not counted.
    until_ready(&server, "again-once", 2);
    assert_eq!(q.stats().unwrap().ready, 1);
    let d = q.claim(WAIT).unwrap().expect("the message offered again");
    assert_eq!(
        (d.id(), d.payload().as_str(), d.attempt()),
        (&id, "second", 1)
    );
    // No second delivery of it while the first claim is in flight.
    assert!(q.claim(Duration::from_millis(300)).unwrap().is_none());
    d.ack().unwrap();
    assert!(q.is_empty().unwrap());
    assert_eq!(q.stats().unwrap().ready, 0);
}
