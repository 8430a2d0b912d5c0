//! The lock's futures (feature `async`) against a real redis-server:
//! `lock_async`, `try_lock_async`, the `Send` guard held across `.await`
//! on a multi-thread executor, its watchdog, `unlock_async`, and an unlock
//! on drop that does not wait in the dropping thread.

mod async_common;
mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_common::{setup, tokio_current, tokio_multi};
use redwheel::{AsyncLockGuard, ErrorKind};

#[test]
fn the_guard_and_the_futures_are_send() {
    fn send<T: Send + 'static>(_: &T) {}
    fn send_type<T: Send + Sync + 'static>() {}
    send_type::<AsyncLockGuard>();
    let (_server, rw) = setup();
    let lock = rw.lock("send");
    send(&lock.lock_async());
    send(&lock.try_lock_async(Duration::ZERO));
}

#[test]
fn a_guard_held_across_awaits_on_a_multi_thread_executor_excludes_every_other_holder() {
    let (server, rw) = setup();
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let tokens = tokio_multi(async {
        let mut tasks = Vec::new();
        for _ in 0..16 {
            let (lock, inside, most) = (rw.lock("shared"), Arc::clone(&inside), Arc::clone(&most));
            tasks.push(tokio::spawn(async move {
                let g = lock.lock_async().await.unwrap();
                let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                // Yield to the executor while holding it: the task may
                // resume on another worker thread.
                for _ in 0..3 {
                    tokio::task::yield_now().await;
                }
                inside.fetch_sub(1, Ordering::SeqCst);
                let token = g.fencing_token();
                g.unlock_async().await.unwrap();
                token
            }));
        }
        let mut tokens = Vec::new();
        for t in tasks {
            tokens.push(t.await.unwrap());
        }
        tokens
    });
    assert_eq!(most.load(Ordering::SeqCst), 1, "two holders at once");
    let mut sorted = tokens.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), 16, "each acquisition has its own token");
    assert_eq!(server.int(&["EXISTS", "redwheel:lock:{shared}"]), 0);
}

#[test]
fn try_lock_async_gives_none_when_busy_and_is_woken_by_a_release_from_a_thread() {
    let (_server, rw) = setup();
    let lock = rw.lock("busy");
    let held = lock.lock().unwrap(); // a thread's guard
    tokio_current(async {
        assert!(lock.try_lock_async(Duration::ZERO).await.unwrap().is_none());
        let waiter = lock.try_lock_async(Duration::from_secs(30));
        let release = async {
            // Once the future waits (or is on its attempt), release.
            while rw.lock_stats().waiting == 0 {
                tokio::task::yield_now().await;
            }
            held.unlock().unwrap();
        };
        let (got, ()) = tokio::join!(waiter, release);
        let g = got
            .unwrap()
            .expect("woken by the release, well within 30 s");
        g.unlock_async().await.unwrap();
    });
}

#[test]
fn an_async_acquisition_is_not_reentrant() {
    let (_server, rw) = setup();
    let lock = rw.lock("once");
    tokio_current(async {
        let g = lock.lock_async().await.unwrap();
        assert!(lock.try_lock_async(Duration::ZERO).await.unwrap().is_none());
        drop(g);
        // The drop unlocks in the background; the next acquisition gets it.
        let g2 = lock.try_lock_async(Duration::from_secs(30)).await.unwrap();
        assert!(g2.is_some());
    });
}

#[test]
fn the_watchdog_renews_an_async_hold_past_its_lease() {
    let (server, rw) = setup();
    let lock = rw
        .lock("renewed")
        .watchdog_lease(Duration::from_millis(300));
    tokio_current(async {
        let g = lock.lock_async().await.unwrap();
        let before = rw.lock_stats().renewals;
        // Wait for renewals by counting them, not by the clock.
        while rw.lock_stats().renewals < before + 4 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(!g.is_lost());
        assert!(server.int(&["PTTL", "redwheel:lock:{renewed}"]) > 0);
        g.unlock_async().await.unwrap();
    });
}

#[test]
fn force_unlock_marks_an_async_hold_lost_and_its_unlock_says_so() {
    let (_server, rw) = setup();
    let lock = rw.lock("forced");
    tokio_current(async {
        let g = lock.lock_async().await.unwrap();
        assert!(lock.force_unlock().unwrap());
        assert!(g.is_lost());
        let e = g.unlock_async().await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::LockLost);
    });
}

/// `wait_replicas` holds for the futures as for the blocking calls: out of
/// range it is refused before anything is sent, and on a server with no
/// replica a grant is refused and released at once.
#[test]
fn lock_async_with_wait_replicas_refuses_and_releases_a_grant_no_replica_confirmed() {
    let (_server, rw) = setup();
    tokio_current(async {
        let bad = rw.lock("bad").wait_replicas(0, Duration::from_millis(100));
        let err = bad.lock_async().await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidOption, "{err}");
        let alone = rw.lock("alone").wait_replicas(1, Duration::from_millis(50));
        let err = alone.try_lock_async(Duration::ZERO).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotReplicated, "{err}");
        assert!(
            err.to_string().contains("only 0 of the 1 replicas"),
            "{err}"
        );
    });
    assert!(!rw.lock("bad").is_locked().unwrap());
    assert!(!rw.lock("alone").is_locked().unwrap());
}
