//! `wait_replicas` under the futures (feature `async`): the `WAIT` after
//! a write blocks the connection it is sent on, so it must not be sent on
//! the multiplexed connection every other future of the node shares. One
//! queue's or lock's option must not stall the rest of the process.
#![cfg(feature = "async")]

mod async_common;
mod support;

use std::time::{Duration, Instant};

use async_common::{HANG, tokio_multi};
use redwheel::{ErrorKind, QueueOptions, Redwheel, RedwheelOptions};
use support::RedisServer;

/// Long enough that a future stuck behind a `WAIT` is told apart from a
/// slow one; no replica ever confirms, so each `WAIT` lasts all of it.
const WAIT: Duration = Duration::from_secs(5);

fn connect(server: &RedisServer) -> Redwheel {
    let options = RedwheelOptions::default().command_timeout(WAIT + Duration::from_secs(1));
    Redwheel::connect_with(&server.url(), options).unwrap()
}

/// Clients blocked on the server now (a `WAIT` blocks its client).
fn blocked(server: &RedisServer) -> u64 {
    server
        .info("clients")
        .lines()
        .find_map(|l| l.strip_prefix("blocked_clients:"))
        .map_or(0, |n| n.trim().parse().unwrap())
}

async fn until_blocked(server: &RedisServer, n: u64) {
    let give_up = Instant::now() + HANG;
    while blocked(server) < n {
        assert!(
            Instant::now() < give_up,
            "hang guard: {n} WAITs on the server"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Issue 29, finding 2: two `offer_async` on a queue with `wait_replicas`
/// (no replica: each `WAIT` lasts its whole timeout), then an
/// `offer_async` on another queue: it is answered while both `WAIT`s are
/// still pending (and, generously, well within one `WAIT`).
#[test]
fn offers_waiting_for_replicas_hold_up_no_other_queues_offers() {
    let server = RedisServer::start();
    let rw = connect(&server);
    let slow = rw
        .queue_with::<String>("slow", QueueOptions::default().wait_replicas(1, WAIT))
        .unwrap();
    let fast = rw.queue::<String>("fast").unwrap();
    tokio_multi(async {
        let hour = Duration::from_secs(3600);
        fast.offer_async(&"warm".to_owned(), hour).await.unwrap();
        let a = tokio::spawn(slow.offer_async(&"a".to_owned(), hour));
        let b = tokio::spawn(slow.offer_async(&"b".to_owned(), hour));
        until_blocked(&server, 1).await;
        let started = Instant::now();
        fast.offer_async(&"quick".to_owned(), hour).await.unwrap();
        let took = started.elapsed();
        assert!(
            !a.is_finished() && !b.is_finished(),
            "the other queue's offer waited for the WAITs ({took:?})"
        );
        assert!(took < WAIT / 2, "the other queue's offer took {took:?}");
        for t in [a, b] {
            let e = t.await.unwrap().unwrap_err();
            assert_eq!(e.kind(), ErrorKind::NotReplicated, "{e}");
        }
    });
    assert_eq!(server.int(&["ZCARD", "redwheel:{slow}:delayed"]), 2);
}

/// Issue 29, finding 2, for locks: an acquisition with `wait_replicas`
/// (no replica) waits in `WAIT`; meanwhile another lock's futures on the
/// same node are answered, while that `WAIT` is pending.
#[test]
fn a_lock_waiting_for_replicas_holds_up_no_other_lock() {
    let server = RedisServer::start();
    let rw = connect(&server);
    let slow = rw.lock("slow").wait_replicas(1, WAIT);
    let fast = rw.lock("fast");
    tokio_multi(async {
        fast.lock_async()
            .await
            .unwrap()
            .unlock_async()
            .await
            .unwrap();
        let a = tokio::spawn(slow.try_lock_async(Duration::ZERO));
        until_blocked(&server, 1).await;
        let started = Instant::now();
        let g = fast.lock_async().await.unwrap();
        g.unlock_async().await.unwrap();
        let took = started.elapsed();
        assert!(
            !a.is_finished(),
            "the other lock waited for the WAIT ({took:?})"
        );
        assert!(took < WAIT / 2, "the other lock took {took:?}");
        let e = a.await.unwrap().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotReplicated, "{e}");
    });
    assert!(!slow.is_locked().unwrap(), "the refused grant was released");
}

/// An acquisition that finds the lock busy was granted nothing: it sends
/// no `WAIT` (which would only block a connection for nothing).
#[test]
fn a_busy_lock_sends_no_wait() {
    let server = RedisServer::start();
    let rw = connect(&server);
    let other = Redwheel::connect(&server.url()).unwrap();
    let held = other.lock("busy").lock().unwrap();
    let lock = rw.lock("busy").wait_replicas(1, WAIT);
    let before = server.calls("wait");
    let r = tokio_multi(lock.try_lock_async(Duration::ZERO)).unwrap();
    assert!(r.is_none(), "held by another process");
    assert_eq!(
        server.calls("wait"),
        before,
        "a WAIT was sent for a busy lock"
    );
    drop(held);
}
