//! The lock's futures (feature `async`) against a real redis-server:
//! `lock_async`, `try_lock_async`, the `Send` guard held across `.await`
//! on a multi-thread executor, its watchdog, `unlock_async`, and an unlock
//! on drop that does not wait in the dropping thread.

mod async_common;
mod support;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use async_common::{HANG, setup, tokio_current, tokio_multi};
use redwheel::{AsyncLockGuard, ErrorKind, Lock, Redwheel, RedwheelOptions};
use support::RedisServer;
use support::proxy::{Fault, Proxy, Rule};

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

/// Polls `done` every 5 ms until it holds (a hang guard, not a timing
/// claim).
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let give_up = Instant::now() + HANG;
    while !done() {
        assert!(Instant::now() < give_up, "hang guard: {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Issue 29, finding 1 (trigger B): Redis restarts without persistence
/// while a future holds a lock, and another process takes it. The first
/// attempt of `unlock_async` goes out on the dead connection (its outcome
/// unknown), the resend finds the lock another owner's: the unlock
/// released nothing of ours, so it is `LockLost`, never `Ok`.
#[test]
fn unlock_async_after_a_restart_without_persistence_and_a_new_owner_is_lock_lost() {
    let (mut server, rw) = setup();
    let signalled = Arc::new(AtomicUsize::new(0));
    let s = Arc::clone(&signalled);
    let lock = rw.lock("restarted").on_lost(move |_| {
        s.fetch_add(1, Ordering::SeqCst);
    });
    let g = tokio_current(lock.lock_async()).unwrap();
    server.restart(); // no persistence: the lock is gone
    let other = Redwheel::connect(&server.url()).unwrap();
    let g2 = other
        .lock("restarted")
        .try_lock(Duration::ZERO)
        .unwrap()
        .expect("free after the restart");
    let e = tokio_current(g.unlock_async())
        .expect_err("two holders: the unlock must say the lease was lost");
    assert_eq!(e.kind(), ErrorKind::LockLost, "{e}");
    assert_eq!(rw.lock_stats().lost, 1);
    wait_until("on_lost ran", || signalled.load(Ordering::SeqCst) == 1);
    assert_eq!(
        server.cmd(&["HGET", "redwheel:lock:{restarted}", "token"]),
        format!(
            "${}\r\n{}\r\n",
            g2.fencing_token().to_string().len(),
            g2.fencing_token()
        ),
        "the new owner's lock is untouched"
    );
    g2.unlock().unwrap();
}

/// Issue 29, finding 6: with `wait_replicas` and no replica to confirm,
/// `try_lock_async(wait)` keeps trying for its whole wait, as
/// `try_lock(wait)` does, and both end with `NotReplicated`.
#[test]
fn try_lock_async_with_wait_replicas_tries_for_its_whole_wait_as_try_lock_does() {
    let (_server, rw) = setup();
    let wait = Duration::from_millis(800);
    let lock = rw
        .lock("unconfirmed")
        .wait_replicas(1, Duration::from_millis(50));
    let attempts = || rw.lock_stats().acquire_attempts;
    let before = attempts();
    let started = Instant::now();
    let e = lock.try_lock(wait).unwrap_err();
    let (sync_took, sync_attempts) = (started.elapsed(), attempts() - before);
    assert_eq!(e.kind(), ErrorKind::NotReplicated, "{e}");
    let before = attempts();
    let started = Instant::now();
    let e = tokio_current(lock.try_lock_async(wait)).unwrap_err();
    let (async_took, async_attempts) = (started.elapsed(), attempts() - before);
    assert_eq!(e.kind(), ErrorKind::NotReplicated, "{e}");
    assert!(
        sync_took >= wait && sync_attempts > 1,
        "try_lock: {sync_attempts} attempts in {sync_took:?}"
    );
    assert!(
        async_took >= wait && async_attempts > 1,
        "try_lock_async gave up after {async_attempts} attempt(s) in {async_took:?}; try_lock tried {sync_attempts} times in {sync_took:?}"
    );
    assert!(
        !lock.is_locked().unwrap(),
        "every refused grant was released"
    );
}

/// Issue 28, finding 8: the reply of `lock_async`'s grant is lost; its
/// retry must take over the grant it was itself given (same owner), not
/// wait for that grant's lease to run out as if another owner held it.
#[test]
fn lock_async_after_a_lost_grant_reply_takes_its_own_grant_over_at_once() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let options = RedwheelOptions::default().command_timeout(Duration::from_millis(500));
    let rw = Redwheel::connect_with(&proxy.url(), options).unwrap();
    let lease = Duration::from_secs(20);
    let lock = rw.lock("own").watchdog_lease(lease);
    tokio_current(async {
        // Warm up: the script is loaded.
        lock.lock_async()
            .await
            .unwrap()
            .unlock_async()
            .await
            .unwrap();
        let sha = redwheel::test_support::script_sha("lock_acquire").unwrap();
        let cut = proxy.inject(Rule::new(Fault::LoseReply).matching(&sha).times(1));
        let started = Instant::now();
        let g = lock.lock_async().await.unwrap();
        let took = started.elapsed();
        assert_eq!(cut.fired(), 1, "the first grant ran and its reply was lost");
        // Generous: a retry that waits out its own grant takes the lease.
        assert!(
            took < lease / 2,
            "lock_async waited {took:?} for a grant of its own (lease {lease:?})"
        );
        assert_eq!(
            server.int(&["HLEN", "redwheel:lock:{own}"]),
            2,
            "one owner and the token"
        );
        g.unlock_async().await.unwrap();
    });
    assert_eq!(server.int(&["EXISTS", "redwheel:lock:{own}"]), 0);
}

/// A waker that tries the lock inline, on whichever thread wakes it (as
/// an executor that polls a woken task at once may), and reports each
/// wake.
struct InlineWaker {
    lock: Lock,
    armed: AtomicBool,
    woken: Mutex<mpsc::Sender<()>>,
}

impl Wake for InlineWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if self.armed.load(Ordering::SeqCst) {
            // Whether it gets it or not does not matter; it must not hang.
            if let Ok(Some(g)) = self.lock.try_lock(Duration::ZERO) {
                drop(g);
            }
        }
        let _ = self.woken.lock().unwrap().send(());
    }
}

/// Issue 28, finding 8: a release wakes a waiting future after letting
/// go of the lock's waiters mutex, so a waker that does lock work inline
/// (on the releasing thread) does not deadlock the unlock.
#[test]
fn a_release_wakes_a_waiting_future_outside_the_waiters_lock() {
    let (server, rw) = setup();
    let lock = rw.lock("inline");
    // The holder: a thread of its own, which unlocks when told.
    let (go, go_rx) = mpsc::channel::<()>();
    let (done_tx, done) = mpsc::channel::<()>();
    let (held_tx, held) = mpsc::channel::<()>();
    let l = lock.clone();
    std::thread::spawn(move || {
        let g = l.lock().unwrap();
        held_tx.send(()).unwrap();
        go_rx.recv().unwrap();
        g.unlock().unwrap();
        let _ = done_tx.send(());
    });
    held.recv_timeout(HANG).unwrap();
    let (woken_tx, woken) = mpsc::channel();
    let waker = Arc::new(InlineWaker {
        lock: lock.clone(),
        armed: AtomicBool::new(false),
        woken: Mutex::new(woken_tx),
    });
    let w = Waker::from(Arc::clone(&waker));
    let mut cx = Context::from_waker(&w);
    let mut fut = Box::pin(lock.try_lock_async(Duration::from_secs(60)));
    // Poll on every wake until it waits for a release: subscribed to the
    // unlock channel, and no wake for a while.
    let channel = "redwheel:lock:{inline}:unlock";
    let give_up = Instant::now() + HANG;
    loop {
        assert!(Instant::now() < give_up, "hang guard: the future's wait");
        assert!(fut.as_mut().poll(&mut cx).is_pending(), "the lock is held");
        match woken.recv_timeout(Duration::from_millis(500)) {
            Ok(()) => continue,
            Err(_)
                if server
                    .cmd(&["PUBSUB", "SHARDNUMSUB", channel])
                    .ends_with(":1\r\n") =>
            {
                break;
            }
            Err(_) => {}
        }
    }
    waker.armed.store(true, Ordering::SeqCst);
    go.send(()).unwrap();
    done.recv_timeout(Duration::from_secs(20))
        .expect("the unlock deadlocked in the waker it woke");
    // The future is woken and gets the lock.
    let g = loop {
        if let Poll::Ready(r) = fut.as_mut().poll(&mut cx) {
            break r.unwrap().expect("free once the holder let go");
        }
        assert!(Instant::now() < give_up, "hang guard: the waiting future");
        let _ = woken.recv_timeout(Duration::from_millis(100));
    };
    waker.armed.store(false, Ordering::SeqCst);
    drop(g);
}

/// Issue 28, finding 7: Redis stops answering (SIGSTOP) while
/// `try_lock_async(wait)` waits for a busy lock. It returns within its
/// wait plus one command timeout (with generous slack for a loaded
/// machine), with `Ok(None)` or a transient error.
#[test]
fn try_lock_async_returns_within_its_wait_when_redis_stops_mid_wait() {
    let server = RedisServer::start();
    let timeout = Duration::from_millis(500);
    let options = RedwheelOptions::default().command_timeout(timeout);
    let rw = Redwheel::connect_with(&server.url(), options).unwrap();
    let other = Redwheel::connect(&server.url()).unwrap();
    let held = other.lock("stopped").lock().unwrap();
    let lock = rw.lock("stopped");
    let wait = Duration::from_secs(2);
    let r = tokio_current(async {
        let attempt = lock.try_lock_async(wait);
        let stop = async {
            while rw.lock_stats().acquire_attempts == 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
            server.signal("STOP");
        };
        let started = Instant::now();
        let (r, ()) = tokio::join!(attempt, stop);
        (r, started.elapsed())
    });
    server.signal("CONT");
    let (r, took) = r;
    assert!(
        took < wait + timeout + Duration::from_secs(3),
        "try_lock_async({wait:?}) took {took:?} with Redis stopped"
    );
    match r {
        Ok(None) => {}
        Ok(Some(_)) => panic!("granted a lock another process holds"),
        Err(e) => assert!(e.is_transient(), "{e}"),
    }
    drop(held);
}
