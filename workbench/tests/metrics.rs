//! Metrics scraped over HTTP: the `metrics` feature's series, rendered by
//! `metrics-exporter-prometheus`, served by the example's tiny HTTP
//! responder (`examples/support/metrics_http.rs`), fetched with a plain
//! `TcpStream` GET and parsed from the text format, move by what real
//! traffic against a private `redis-server` did.
//!
//! One global recorder per test binary (installed before any `Redwheel`
//! connects). Tests run in parallel and share it: queue series are told
//! apart by each test's own queue names, so their counts are exact;
//! process-wide series (driver, wheel, reconnects) are asserted to move,
//! and the lock series are touched by one test only.

mod support;

use std::time::Duration;

use redwheel::{ErrorKind, Nacked, QueueOptions, Redwheel};
use support::metrics::metrics_http;
use support::metrics::{Scrape, WAIT, delta, endpoint, recorder, scrape_when, until};
use support::{RedisServer, within};

const HANG: Duration = Duration::from_secs(120);

fn connect(server: &RedisServer) -> Redwheel {
    recorder(); // before connecting: handles are looked up at open
    server.connect()
}

#[test]
fn queue_counters_move_by_exactly_what_the_traffic_did() {
    within(HANG, || {
        let server = RedisServer::start();
        let rw = connect(&server);
        let http = endpoint();
        let q = rw
            .queue_with::<String>(
                "m-reliable",
                QueueOptions::default()
                    .visibility(Duration::from_millis(300))
                    .max_deliveries(2),
            )
            .unwrap();
        let label = [("queue", "m-reliable")];
        let before = Scrape::of(&http);

        // Three messages due in 1 ms (one due now would skip the transfer,
        // straight to ready): the transfer moves them to ready.
        q.offer_batch(&[
            ("acked".to_string(), Duration::from_millis(1)),
            ("nacked".to_string(), Duration::from_millis(1)),
        ])
        .unwrap();
        q.offer(&"expiring".to_string(), Duration::from_millis(1))
            .unwrap();
        until("the transfer of 3", || {
            (q.transfer_stats().moved == 3).then_some(())
        });

        // Attempt 1 of each (in whatever order ties of due time come):
        // ack, nack (retried: it goes behind the other two), and one left
        // to expire.
        let (mut nacked_id, mut left) = (None, None);
        for _ in 0..3 {
            let d = q.claim(WAIT).unwrap().unwrap();
            assert_eq!(d.attempt(), 1);
            match d.payload().as_str() {
                "acked" => d.ack().unwrap(),
                "nacked" => {
                    assert_eq!(d.nack(Duration::ZERO).unwrap(), Nacked::Retried);
                    nacked_id = Some(d.id().clone());
                }
                _ => left = Some(d),
            }
        }
        let (nacked_id, left) = (nacked_id.unwrap(), left.unwrap());
        let expiring = left.id().clone();

        // Attempt 2 of both: the nacked one dies at the limit, the expired
        // one (redelivered by the transfer job) is acked.
        let mut seen = 0;
        while seen < 2 {
            let d = q.claim(WAIT).unwrap().expect("a redelivery");
            assert_eq!(d.attempt(), 2);
            if d.id() == &nacked_id {
                assert_eq!(d.nack(Duration::ZERO).unwrap(), Nacked::Dead);
            } else {
                assert_eq!(d.id(), &expiring);
                // The first claim's ack is refused: not counted.
                assert_eq!(left.ack().unwrap_err().kind(), ErrorKind::StaleDelivery);
                d.ack().unwrap();
            }
            seen += 1;
        }
        // Once the message is gone, an ack is a no-op: not counted either.
        left.ack().unwrap();

        // A consumer may get a message before the driver thread has read
        // the transfer's reply (and counted it): wait for the count.
        let after = scrape_when(
            &http,
            &before,
            "redwheel_messages_transferred_total",
            &label,
            5.0,
        );
        let moved = |name| delta(&before, &after, name, &label);
        assert_eq!(moved("redwheel_messages_offered_total"), 3.0);
        // 3 moved at first, the nacked one again, the expired claim.
        assert_eq!(moved("redwheel_messages_transferred_total"), 5.0);
        assert_eq!(moved("redwheel_messages_delivered_total"), 5.0);
        assert_eq!(moved("redwheel_messages_redelivered_total"), 2.0);
        // Neither the refused ack nor the one of a message gone counts.
        assert_eq!(moved("redwheel_messages_acked_total"), 2.0);
        assert_eq!(moved("redwheel_messages_nacked_total"), 2.0);
        assert_eq!(moved("redwheel_messages_dead_lettered_total"), 1.0);
        // Lateness: the three first deliveries only.
        assert_eq!(moved("redwheel_delivery_lateness_seconds_count"), 3.0);
        assert!(after.value("redwheel_delivery_lateness_seconds_sum", &label) >= 0.0);
        assert_eq!(
            after.value(
                "redwheel_delivery_lateness_seconds_bucket",
                &[("queue", "m-reliable"), ("le", "+Inf")]
            ),
            after.value("redwheel_delivery_lateness_seconds_count", &label)
        );
        assert_eq!(
            q.transfer_stats().moved as f64,
            moved("redwheel_messages_transferred_total")
        );
    });
}

#[test]
fn a_claim_that_expires_at_the_delivery_limit_counts_as_dead_lettered_not_transferred() {
    within(HANG, || {
        let server = RedisServer::start();
        let rw = connect(&server);
        let http = endpoint();
        let q = rw
            .queue_with::<String>(
                "m-expiry-dies",
                QueueOptions::default()
                    .visibility(Duration::from_millis(200))
                    .max_deliveries(1),
            )
            .unwrap();
        let label = [("queue", "m-expiry-dies")];
        let start = Scrape::of(&http);
        q.offer(&"abandoned".to_string(), Duration::from_millis(1))
            .unwrap();
        let d = q.claim(WAIT).unwrap().expect("the message");
        assert_eq!(d.attempt(), 1);
        // The claim may return before the driver has counted the transfer
        // that made the message ready: wait for that count first.
        let before = scrape_when(
            &http,
            &start,
            "redwheel_messages_transferred_total",
            &label,
            1.0,
        );
        // Never acked: at the end of its visibility the driver's transfer
        // finds it at the limit and sends it to the dead letters.
        let after = scrape_when(
            &http,
            &before,
            "redwheel_messages_dead_lettered_total",
            &label,
            1.0,
        );
        assert_eq!(
            delta(
                &before,
                &after,
                "redwheel_messages_transferred_total",
                &label
            ),
            0.0
        );
        let dead = q.dead_letters(10).unwrap();
        assert_eq!(dead.len(), 1);
        assert_eq!(dead[0].id(), d.id());
    });
}

#[test]
fn take_counts_deliveries_and_records_their_lateness() {
    within(HANG, || {
        let server = RedisServer::start();
        let rw = connect(&server);
        let http = endpoint();
        let q = rw.queue::<String>("m-take").unwrap();
        let label = [("queue", "m-take")];
        let before = Scrape::of(&http);
        for i in 0..4 {
            q.offer(&format!("m{i}"), Duration::from_millis(20))
                .unwrap();
        }
        // An idempotent offer of a known id adds nothing.
        let id = redwheel::MessageId::from("fixed");
        assert!(
            q.offer_with_id(&id, &"x".to_string(), Duration::from_millis(1))
                .unwrap()
        );
        assert!(
            !q.offer_with_id(&id, &"x".to_string(), Duration::from_millis(1))
                .unwrap()
        );
        for _ in 0..5 {
            q.poll(WAIT).unwrap().expect("a message");
        }
        let after = scrape_when(
            &http,
            &before,
            "redwheel_messages_transferred_total",
            &label,
            5.0,
        );
        let moved = |name| delta(&before, &after, name, &label);
        assert_eq!(moved("redwheel_messages_offered_total"), 5.0);
        assert_eq!(moved("redwheel_messages_delivered_total"), 5.0);
        assert_eq!(moved("redwheel_delivery_lateness_seconds_count"), 5.0);
        assert_eq!(moved("redwheel_messages_transferred_total"), 5.0);
        assert_eq!(
            after.get("redwheel_messages_acked_total", &label),
            Some(0.0)
        );
    });
}

#[test]
fn an_ack_of_a_message_already_gone_is_not_counted() {
    within(HANG, || {
        let server = RedisServer::start();
        let rw = connect(&server);
        let http = endpoint();
        let q = rw.queue::<String>("m-gone").unwrap();
        let label = [("queue", "m-gone")];
        q.offer(&"x".to_string(), Duration::from_millis(1)).unwrap();
        // The handler removes its own message: the pool's ack, sent with
        // its next claim, finds it gone. Nothing was acked.
        let (tx, rx) = std::sync::mpsc::channel();
        let remover = q.clone();
        let consumer = q
            .consume(
                redwheel::ConsumerOptions::default().concurrency(1),
                move |d| {
                    assert!(remover.remove(d.id()).unwrap());
                    let _ = tx.send(());
                    Ok::<(), String>(())
                },
            )
            .unwrap();
        rx.recv_timeout(WAIT).expect("the handler ran");
        // Shutting down sends the finished handlers' acks first.
        consumer.shutdown(Duration::from_secs(10)).unwrap();
        let after = Scrape::of(&http);
        assert_eq!(
            after.get("redwheel_messages_acked_total", &label),
            Some(0.0),
            "an ack that found its message gone acked nothing"
        );
    });
}

#[test]
fn backlog_gauges_match_what_stats_returned() {
    within(HANG, || {
        let server = RedisServer::start();
        let rw = connect(&server);
        let http = endpoint();
        let q = rw
            .queue_with::<String>("m-backlog", QueueOptions::default().max_deliveries(1))
            .unwrap();
        let state = |s| [("queue", "m-backlog"), ("state", s)];
        let check = |scrape: &Scrape, stats: &redwheel::QueueStats| {
            assert_eq!(
                scrape.value("redwheel_queue_messages", &state("delayed")),
                stats.delayed as f64
            );
            assert_eq!(
                scrape.value("redwheel_queue_messages", &state("ready")),
                stats.ready as f64
            );
            assert_eq!(
                scrape.value("redwheel_queue_messages", &state("in_flight")),
                stats.in_flight as f64
            );
            assert_eq!(
                scrape.value("redwheel_queue_messages", &state("dead")),
                stats.dead as f64
            );
            assert_eq!(
                scrape.value(
                    "redwheel_queue_oldest_overdue_seconds",
                    &[("queue", "m-backlog")]
                ),
                stats.oldest_overdue.unwrap_or_default().as_secs_f64()
            );
        };

        // Two far in the future, three due: one claimed and held, one dead.
        for _ in 0..2 {
            q.offer(&"later".to_string(), Duration::from_secs(3600))
                .unwrap();
        }
        for _ in 0..3 {
            q.offer(&"now".to_string(), Duration::from_millis(1))
                .unwrap();
        }
        until("the transfer of 3", || {
            (q.transfer_stats().moved == 3).then_some(())
        });
        let held = q.claim(WAIT).unwrap().unwrap();
        let dies = q.claim(WAIT).unwrap().unwrap();
        assert_eq!(dies.nack(Duration::ZERO).unwrap(), Nacked::Dead);
        let stats = q.stats().unwrap();
        assert_eq!(
            (stats.delayed, stats.ready, stats.in_flight, stats.dead),
            (2, 1, 1, 1)
        );
        let first = Scrape::of(&http);
        check(&first, &stats);

        // The gauges follow the next `stats()`.
        held.ack().unwrap();
        q.poll(WAIT).unwrap().unwrap();
        q.offer(&"later".to_string(), Duration::from_secs(3600))
            .unwrap();
        let stats = q.stats().unwrap();
        assert_eq!(
            (stats.delayed, stats.ready, stats.in_flight, stats.dead),
            (3, 0, 0, 1)
        );
        let second = Scrape::of(&http);
        check(&second, &stats);
        assert_eq!(
            delta(
                &first,
                &second,
                "redwheel_queue_messages",
                &state("delayed")
            ),
            1.0
        );
    });
}

#[test]
fn lock_acquisitions_renewals_and_lost_leases_are_counted() {
    within(HANG, || {
        let server = RedisServer::start();
        let rw = connect(&server);
        let http = endpoint();
        let before = Scrape::of(&http);
        let before_stats = rw.lock_stats();

        // A watchdog lease of 300 ms is renewed every 100 ms.
        let lock = rw.lock("m-lock").watchdog_lease(Duration::from_millis(300));
        let guard = lock.lock().unwrap();
        until("two renewals", || {
            (rw.lock_stats().renewals >= before_stats.renewals + 2).then_some(())
        });
        guard.unlock().unwrap();

        // A hold force-unlocked by its own process is lost.
        let other = rw.lock("m-lock-forced");
        let forced = other.lock().unwrap();
        assert!(other.force_unlock().unwrap());
        assert!(forced.is_lost());
        assert_eq!(forced.unlock().unwrap_err().kind(), ErrorKind::LockLost);

        // No renewal lands after an unlock; one whose reply was being read
        // as the lock was released may be counted in the stats a moment
        // before the metric.
        let stats = rw.lock_stats();
        let renewals = (stats.renewals - before_stats.renewals) as f64;
        let after = scrape_when(
            &http,
            &before,
            "redwheel_lock_renewals_total",
            &[],
            renewals,
        );
        assert_eq!(
            delta(&before, &after, "redwheel_lock_acquired_total", &[]),
            2.0
        );
        // Only this test takes locks in this process, so the metric moved
        // by this `Redwheel`'s count (`scrape_when` above) and no more.
        assert!(renewals >= 2.0);
        assert_eq!(
            delta(
                &before,
                &after,
                "redwheel_lock_leases_lost_total",
                &[("cause", "force_unlocked")]
            ),
            1.0
        );
        assert_eq!(
            delta(
                &before,
                &after,
                "redwheel_lock_leases_lost_total",
                &[("cause", "gone")]
            ),
            0.0
        );
    });
}

#[test]
fn driver_rounds_and_wheel_gauges_are_exported() {
    within(HANG, || {
        let server = RedisServer::start();
        let rw = connect(&server);
        let http = endpoint();
        let q = rw.queue::<String>("m-driver").unwrap();
        let before = Scrape::of(&http);
        let rounds = rw.driver_stats().rounds;
        q.offer(&"x".to_string(), Duration::from_millis(10))
            .unwrap();
        q.poll(WAIT).unwrap().unwrap();
        until("a driver round", || {
            (rw.driver_stats().rounds > rounds).then_some(())
        });
        let after = until("the round in the histogram", || {
            let s = Scrape::of(&http);
            (delta(
                &before,
                &s,
                "redwheel_driver_round_duration_seconds_count",
                &[],
            ) >= 1.0)
                .then_some(s)
        });
        assert!(after.value("redwheel_driver_round_duration_seconds_sum", &[]) > 0.0);
        // Set by the driver after a round (this process has a wheel with
        // guard sweeps armed, so some timeouts are pending).
        assert!(after.value("redwheel_wheel_pending_timeouts", &[]) >= 1.0);
        let lag = after.value("redwheel_wheel_tick_lag_seconds", &[]);
        assert!(lag >= 0.0 && lag.is_finite());
        for name in [
            "redwheel_driver_rounds_failed_total",
            "redwheel_driver_job_failures_total",
        ] {
            assert!(after.get(name, &[]).is_some(), "no {name}");
        }
    });
}

#[test]
fn reconnects_after_a_redis_restart_are_counted() {
    within(HANG, || {
        let mut server = RedisServer::start();
        let rw = connect(&server);
        let http = endpoint();
        let q = rw.queue::<String>("m-restart").unwrap();
        // The driver connects at its first round (the new queue's first
        // transfer); a first connect after the restart is no reconnect.
        until("the first transfer", || {
            (q.transfer_stats().runs >= 1).then_some(())
        });
        let before = Scrape::of(&http);
        let reconnects = rw.driver_stats().reconnects;
        server.restart();
        // The driver reconnects at its next round (a guard sweep at the
        // latest), the subscriber as soon as it notices.
        // The first offer may meet a pooled connection the restart
        // closed (`OutcomeUnknown`): offer under an id, as the docs say
        // to, until it is known to be written.
        let id = redwheel::MessageId::from("after");
        loop {
            match q.offer_with_id(&id, &"after".to_string(), Duration::ZERO) {
                Ok(_) => break,
                Err(e) if e.is_transient() => std::thread::sleep(Duration::from_millis(10)),
                Err(e) => panic!("{e}"),
            }
        }
        q.poll(WAIT).unwrap().unwrap();
        until("the driver's reconnect", || {
            (rw.driver_stats().reconnects > reconnects).then_some(())
        });
        until("both reconnects in the scrape", || {
            let s = Scrape::of(&http);
            let driver = delta(
                &before,
                &s,
                "redwheel_reconnects_total",
                &[("connection", "driver")],
            );
            let sub = delta(
                &before,
                &s,
                "redwheel_reconnects_total",
                &[("connection", "subscriber")],
            );
            (driver >= 1.0 && sub >= 1.0).then_some(())
        });
    });
}

#[test]
fn the_endpoint_answers_other_paths_with_404() {
    let http = endpoint();
    let (status, _) = metrics_http::get(http.addr(), "/other").unwrap();
    assert_eq!(status, 404);
}

#[test]
fn schedule_firings_count_what_fired_and_what_the_catch_up_skipped_with_their_lateness() {
    use redwheel::schedule::Schedule;
    use std::time::UNIX_EPOCH;
    within(HANG, || {
        let server = RedisServer::start();
        let http = endpoint();
        let label = [("queue", "m-sched")];
        let before = Scrape::of(&http);
        // Declared by a process that leaves before the first occurrence:
        // ten occurrences pass with nobody running.
        let start = server.time_ms() + 300;
        let s = Schedule::every(Duration::from_millis(100))
            .starting_at(UNIX_EPOCH + Duration::from_millis(start))
            .until(UNIX_EPOCH + Duration::from_millis(start + 900));
        let early = connect(&server);
        early
            .queue::<String>("m-sched")
            .unwrap()
            .schedule("s", &s, &"x".to_string())
            .unwrap();
        early.shutdown(Duration::from_secs(5)).unwrap();
        while server.time_ms() < start + 1_000 {
            std::thread::sleep(Duration::from_millis(10));
        }
        // A process comes back: the default catch-up fires the latest.
        let rw = connect(&server);
        let q = rw.queue::<String>("m-sched").unwrap();
        let m = q.poll(WAIT).unwrap().expect("the latest occurrence");
        assert_eq!(m.id().as_str(), format!("sched:s:{}", start + 900));
        let after = scrape_when(
            &http,
            &before,
            "redwheel_schedule_occurrences_fired_total",
            &label,
            1.0,
        );
        let moved = |name| delta(&before, &after, name, &label);
        assert_eq!(moved("redwheel_schedule_occurrences_skipped_total"), 9.0);
        assert_eq!(
            moved("redwheel_schedule_firing_lateness_seconds_count"),
            1.0
        );
        // Late by at least the 100 ms it waited after the last occurrence.
        assert!(moved("redwheel_schedule_firing_lateness_seconds_sum") >= 0.1);
    });
}
