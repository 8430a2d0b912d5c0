//! The queue's futures (feature `async`) against a real redis-server,
//! under tokio (current-thread and multi-thread) and smol: each returns
//! what its synchronous twin returns; waiting takes and claims are woken
//! by the transfer job, hold no connection, and many of them share one
//! multiplexed connection.

mod async_common;
mod support;

use std::collections::HashSet;
use std::future::Future;
use std::time::Duration;

use async_common::{setup, tokio_current, tokio_multi};
use redwheel::{ErrorKind, MessageId, Nacked, Queue, QueueOptions};

fn assert_send<F: Future + Send + 'static>(f: F) -> F {
    f
}

#[test]
fn futures_are_send_and_static() {
    let (_server, rw) = setup();
    let q: Queue<String> = rw.queue("send").unwrap();
    let payload = "x".to_string();
    // Each is moved to another thread (a multi-thread executor's worker).
    let f1 = assert_send(q.offer_async(&payload, Duration::ZERO));
    let f2 = assert_send(q.take_async());
    let f3 = assert_send(q.poll_async(Duration::ZERO));
    let f4 = assert_send(q.claim_async(Duration::ZERO));
    let f5 = assert_send(q.claim_batch_async(2, Duration::ZERO));
    let f6 = assert_send(q.stats_async());
    let f7 = assert_send(q.remove_async(&MessageId::from("nope")));
    let f8 = assert_send(q.offer_batch_async(&[(payload.clone(), Duration::ZERO)]));
    drop((f1, f2, f3, f4, f5, f6, f7, f8));
}

#[test]
fn offer_take_remove_and_stats_return_what_their_sync_twins_return_under_tokio() {
    let (server, rw) = setup();
    let q: Queue<String> = rw.queue("twins").unwrap();
    tokio_current(async {
        let id = q
            .offer_async(&"a".to_string(), Duration::ZERO)
            .await
            .unwrap();
        let later = q
            .offer_async(&"later".to_string(), Duration::from_secs(3600))
            .await
            .unwrap();
        let m = q.take_async().await.unwrap();
        assert_eq!((m.id(), m.payload().as_str()), (&id, "a"));
        let s = q.stats_async().await.unwrap();
        assert_eq!((s.delayed, s.ready, s.in_flight), (1, 0, 0));
        assert!(q.remove_async(&later).await.unwrap());
        assert!(!q.remove_async(&later).await.unwrap());
        assert_eq!(
            q.poll_async(Duration::from_millis(50))
                .await
                .unwrap()
                .map(|m| m.into_payload()),
            None
        );
        let e = q.remove_async(&MessageId::from("")).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidId);
    });
    assert_eq!(server.int(&["EXISTS", "redwheel:{twins}:msg"]), 0);
}

#[test]
fn a_waiting_take_is_woken_by_a_later_offer_under_smol() {
    let (_server, rw) = setup();
    let q: Queue<String> = rw.queue("wake").unwrap();
    let producer = q.clone();
    let got = smol::block_on(async {
        let take = smol::spawn(q.take_async());
        // The taker is parked on the ready list's wait list by now or soon;
        // either way the offer reaches it.
        producer
            .offer_async(&"due soon".to_string(), Duration::from_millis(30))
            .await
            .unwrap();
        take.await.unwrap()
    });
    assert_eq!(got.payload(), "due soon");
}

#[test]
fn many_waiting_takers_share_one_connection_and_each_gets_one_message() {
    let (server, rw) = setup();
    let q: Queue<String> = rw.queue("many").unwrap();
    let n = 200;
    let got = tokio_multi(async {
        let mut tasks = Vec::new();
        for _ in 0..n {
            tasks.push(tokio::spawn(q.take_async()));
        }
        let batch: Vec<(String, Duration)> = (0..n)
            .map(|i| (format!("m{i}"), Duration::from_millis(20)))
            .collect();
        q.offer_batch_async(&batch).await.unwrap();
        let mut got = HashSet::new();
        for t in tasks {
            got.insert(t.await.unwrap().unwrap().into_payload());
        }
        got
    });
    assert_eq!(got.len(), n);
    let clients: i64 = server
        .info("clients")
        .lines()
        .find_map(|l| l.strip_prefix("connected_clients:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // The pooled command connections, the subscriber, the driver and one
    // multiplexed connection: nothing per waiting task.
    assert!(clients < 20, "{clients} connections for {n} waiting takers");
}

#[test]
fn claim_ack_nack_and_extend_work_as_their_sync_twins() {
    let (_server, rw) = setup();
    let q: Queue<String> = rw
        .queue_with("reliable", QueueOptions::default().max_deliveries(2))
        .unwrap();
    tokio_current(async {
        q.offer_async(&"job".to_string(), Duration::ZERO)
            .await
            .unwrap();
        let d = q
            .claim_async(Duration::from_secs(5))
            .await
            .unwrap()
            .unwrap();
        assert_eq!((d.payload().as_str(), d.attempt()), ("job", 1));
        d.extend_async(Duration::from_secs(60)).await.unwrap();
        assert_eq!(d.nack_async(Duration::ZERO).await.unwrap(), Nacked::Retried);
        // The nack made the claim stale.
        assert_eq!(
            d.ack_async().await.unwrap_err().kind(),
            ErrorKind::StaleDelivery
        );
        let d = q
            .claim_async(Duration::from_secs(5))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(d.attempt(), 2);
        d.ack_async().await.unwrap();
        d.ack_async().await.unwrap(); // idempotent
        assert!(
            q.claim_async(Duration::from_millis(20))
                .await
                .unwrap()
                .is_none()
        );
        let batch: Vec<(String, Duration)> =
            (0..5).map(|i| (format!("b{i}"), Duration::ZERO)).collect();
        q.offer_batch_async(&batch).await.unwrap();
        let mut claimed = Vec::new();
        while claimed.len() < 5 {
            claimed.extend(
                q.claim_batch_async(5, Duration::from_secs(5))
                    .await
                    .unwrap(),
            );
        }
        for d in &claimed {
            d.ack_async().await.unwrap();
        }
        let e = q.claim_batch_async(0, Duration::ZERO).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidOption);
    });
}

#[test]
fn an_oversized_payload_fails_at_the_first_poll_with_nothing_sent() {
    let (server, rw) = setup();
    let q: Queue<Vec<u8>> = rw
        .queue_with("big", QueueOptions::default().max_payload_bytes(4))
        .unwrap();
    let e = tokio_current(q.offer_async(&vec![0; 5], Duration::ZERO)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::PayloadTooLarge);
    assert_eq!(server.int(&["EXISTS", "redwheel:{big}:msg"]), 0);
}

#[test]
fn a_future_awaited_after_shutdown_fails_with_shutdown_and_waiters_end() {
    let (_server, rw) = setup();
    let q: Queue<String> = rw.queue("down").unwrap();
    tokio_multi(async {
        let waiting = tokio::spawn(q.take_async());
        tokio::task::yield_now().await;
        rw.shutdown(Duration::from_secs(5)).unwrap();
        let e = waiting.await.unwrap().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Shutdown);
        let e = q
            .offer_async(&"x".to_string(), Duration::ZERO)
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Shutdown);
    });
}

async fn next<T: redwheel::queue::Codec>(
    s: &mut redwheel::queue::Deliveries<T>,
) -> Option<Result<redwheel::Delivery<T>, redwheel::Error>> {
    use futures_core::Stream;
    std::future::poll_fn(|cx| std::pin::Pin::new(&mut *s).poll_next(cx)).await
}

#[test]
fn deliveries_hand_out_every_message_at_least_once_and_claim_no_more_than_concurrency() {
    let (_server, rw) = setup();
    let q: Queue<String> = rw.queue("stream").unwrap();
    tokio_current(async {
        let batch: Vec<(String, Duration)> =
            (0..5).map(|i| (format!("s{i}"), Duration::ZERO)).collect();
        q.offer_batch_async(&batch).await.unwrap();
        let mut s = q.deliveries(redwheel::ConsumerOptions::default().concurrency(2));
        let a = next(&mut s).await.unwrap().unwrap();
        let b = next(&mut s).await.unwrap().unwrap();
        // Two held: the stream claims nothing more until one is done.
        let pending = std::future::poll_fn(|cx| {
            use futures_core::Stream;
            std::task::Poll::Ready(std::pin::Pin::new(&mut s).poll_next(cx).is_pending())
        })
        .await;
        assert!(pending);
        assert_eq!(q.stats_async().await.unwrap().in_flight, 2);
        a.ack_async().await.unwrap();
        drop(b); // dropped unacked: it comes back when its visibility ends
        let mut seen = vec![a.payload().clone()];
        for _ in 0..3 {
            let d = next(&mut s).await.unwrap().unwrap();
            seen.push(d.payload().clone());
            d.ack_async().await.unwrap();
        }
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), 4);
        assert_eq!(q.stats_async().await.unwrap().in_flight, 1);
    });
}

#[test]
fn a_held_delivery_is_extended_past_its_visibility_until_it_is_acked() {
    let (server, rw) = setup();
    let q: Queue<String> = rw
        .queue_with(
            "held",
            QueueOptions::default().visibility(Duration::from_millis(300)),
        )
        .unwrap();
    tokio_current(async {
        q.offer_async(&"long job".to_string(), Duration::ZERO)
            .await
            .unwrap();
        let mut s = q.deliveries(redwheel::ConsumerOptions::default());
        let d = next(&mut s).await.unwrap().unwrap();
        let score = || -> u64 {
            let raw = server.cmd(&["ZSCORE", "redwheel:{held}:inflight", d.id().as_str()]);
            raw.lines().nth(1).unwrap().trim().parse().unwrap()
        };
        let first = score();
        // Wait (by events: the score in Redis) until the visibility was
        // extended twice past the first deadline.
        loop {
            if score() > first + 300 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(d.attempt(), 1);
        d.ack_async().await.unwrap();
        assert_eq!(server.int(&["ZCARD", "redwheel:{held}:inflight"]), 0);
    });
}

#[test]
fn acks_sent_together_each_get_their_own_answer() {
    let (server, rw) = setup();
    let q: Queue<String> = rw.queue("acks").unwrap();
    tokio_current(async {
        let batch: Vec<(String, Duration)> =
            (0..4).map(|i| (format!("a{i}"), Duration::ZERO)).collect();
        q.offer_batch_async(&batch).await.unwrap();
        let mut ds = Vec::new();
        while ds.len() < 4 {
            ds.extend(
                q.claim_batch_async(4, Duration::from_secs(5))
                    .await
                    .unwrap(),
            );
        }
        // The second one's claim is made stale: given back.
        ds[1].nack_async(Duration::from_secs(3600)).await.unwrap();
        // The first ack goes out alone; the other three wait for it and
        // go out together, one of them refused.
        let (a, b, c, d) = tokio::join!(
            ds[0].ack_async(),
            ds[1].ack_async(),
            ds[2].ack_async(),
            ds[3].ack_async()
        );
        assert!(a.is_ok() && c.is_ok() && d.is_ok(), "{a:?} {c:?} {d:?}");
        assert_eq!(b.unwrap_err().kind(), ErrorKind::StaleDelivery);
    });
    assert_eq!(server.int(&["ZCARD", "redwheel:{acks}:inflight"]), 0);
    assert_eq!(
        server.int(&["HLEN", "redwheel:{acks}:msg"]),
        1,
        "only the nacked one is left"
    );
}

#[test]
fn a_stream_of_deliveries_refuses_claim_ahead_at_its_first_poll() {
    let (_server, rw) = setup();
    let q: Queue<String> = rw.queue("stream-ahead").unwrap();
    tokio_current(async {
        let mut s =
            q.deliveries(redwheel::ConsumerOptions::default().claim_ahead(Duration::from_secs(1)));
        let e = next(&mut s).await.unwrap().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidOption);
    });
}
