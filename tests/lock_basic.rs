//! Locks: exclusion, re-entry, fencing tokens, explicit leases,
//! force_unlock, waiting and waking, inputs, and the scripts themselves.

mod support;

use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redwheel::{ErrorKind, LostCause};
use support::{RedisServer, within};

const HANG: Duration = Duration::from_secs(60);

fn raw(server: &RedisServer) -> redis::Connection {
    redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap()
}

#[test]
fn lock_handles_are_shared_between_threads() {
    fn send_sync_clone<T: Send + Sync + Clone>() {}
    send_sync_clone::<redwheel::Lock>();
    send_sync_clone::<redwheel::LeaseLost>();
}

#[test]
fn a_held_lock_excludes_another_instance_and_dropping_the_guard_frees_it() {
    let server = RedisServer::start();
    let (a, b) = (server.connect(), server.connect());
    let guard = a.lock("excl").lock().unwrap();
    assert!(a.lock("excl").is_locked().unwrap());
    assert!(b.lock("excl").try_lock(Duration::ZERO).unwrap().is_none());
    assert!(
        b.lock("excl")
            .try_lock(Duration::from_millis(50))
            .unwrap()
            .is_none()
    );
    drop(guard);
    assert!(!a.lock("excl").is_locked().unwrap());
    let g = b.lock("excl").try_lock(Duration::ZERO).unwrap().unwrap();
    assert!(!g.is_lost());
    g.unlock().unwrap();
}

#[test]
fn a_thread_re_enters_its_lock_and_the_last_unlock_frees_it() {
    let server = RedisServer::start();
    let (a, b) = (server.connect(), server.connect());
    let lock = a.lock("reentrant");
    let first = lock.lock().unwrap();
    // Another handle of the same name, same thread: a re-entry.
    let second = a
        .lock("reentrant")
        .try_lock(Duration::ZERO)
        .unwrap()
        .unwrap();
    assert_eq!(first.fencing_token(), second.fencing_token());
    assert_eq!(lock.hold_count().unwrap(), 2);
    second.unlock().unwrap();
    assert_eq!(lock.hold_count().unwrap(), 1);
    // Still excluded, from another thread and another instance.
    let other_thread = {
        let lock = lock.clone();
        std::thread::spawn(move || lock.try_lock(Duration::ZERO).unwrap().is_some())
    };
    assert!(!other_thread.join().unwrap());
    assert!(
        b.lock("reentrant")
            .try_lock(Duration::ZERO)
            .unwrap()
            .is_none()
    );
    first.unlock().unwrap();
    assert_eq!(lock.hold_count().unwrap(), 0);
    assert!(!lock.is_locked().unwrap());
}

#[test]
fn every_acquisition_gets_a_greater_fencing_token() {
    let server = RedisServer::start();
    let (a, b) = (server.connect(), server.connect());
    let mut last = 0;
    for i in 0..50 {
        let rw = if i % 2 == 0 { &a } else { &b };
        let g = rw.lock("fence").lock().unwrap();
        assert!(
            g.fencing_token() > last,
            "{} after {last}",
            g.fencing_token()
        );
        last = g.fencing_token();
    }
    let stored: u64 = redis::cmd("GET")
        .arg("redwheel:lock:{fence}:fence")
        .query(&mut raw(&server))
        .unwrap();
    assert_eq!(stored, last);
}

#[test]
fn the_watchdog_lease_is_the_ttl_right_after_acquisition() {
    let server = RedisServer::start();
    let rw = server.connect();
    let g = rw
        .lock("ttl")
        .watchdog_lease(Duration::from_secs(7))
        .lock()
        .unwrap();
    // LW-11: the lease, less the time since (generous: machines are busy).
    let ttl = server.int(&["PTTL", "redwheel:lock:{ttl}"]);
    assert!((5_000..=7_000).contains(&ttl), "{ttl}");
    drop(g);
    let g = rw.lock("ttl").lock().unwrap();
    let ttl = server.int(&["PTTL", "redwheel:lock:{ttl}"]);
    assert!((28_000..=30_000).contains(&ttl), "default 30 s: {ttl}");
    drop(g);
}

#[test]
fn bad_names_and_leases_are_invalid_input_and_nothing_is_sent() {
    let server = RedisServer::start();
    let rw = server.connect();
    for name in ["", "a{b}", "x\n"] {
        let e = rw.lock(name).lock().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidName, "{name:?}: {e}");
        assert!(e.is_invalid_input());
        assert_eq!(
            rw.lock(name).is_locked().unwrap_err().kind(),
            ErrorKind::InvalidName
        );
    }
    let short = rw.lock("l").watchdog_lease(Duration::from_millis(99));
    let e = short.try_lock(Duration::ZERO).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidOption, "{e}");
    let e = rw
        .lock("l")
        .lock_with_lease(Duration::from_micros(10))
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidOption, "{e}");
    let e = rw
        .lock("l")
        .lock_with_lease(Duration::from_secs(400 * 86_400))
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidOption, "{e}");
    assert_eq!(server.calls("evalsha"), 0);
}

/// Redisson's `testExpire`: an explicit lease frees the lock for another
/// holder; the first holder's late unlock fails and leaves the new holder's
/// lock alone.
#[test]
fn an_explicit_lease_lapses_and_the_late_unlock_is_lock_lost() {
    let server = RedisServer::start();
    let (a, b) = (server.connect(), server.connect());
    let first = a
        .lock("lease")
        .lock_with_lease(Duration::from_millis(200))
        .unwrap();
    assert!(!first.is_lost());
    // No watchdog: b gets it once the lease ran out (woken by its TTL bound).
    let (tx, rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let t = std::thread::spawn({
        let b = b.clone();
        move || {
            let g = b.lock("lease").lock().unwrap();
            tx.send(g.fencing_token()).unwrap();
            let _ = done_rx.recv();
            g.unlock().unwrap();
        }
    });
    let second = rx.recv_timeout(HANG).unwrap();
    assert!(second > first.fencing_token());
    assert!(first.is_lost(), "its lease ran out");
    let e = first.unlock().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::LockLost, "{e}");
    assert!(!e.is_transient());
    // b's hold (on its own thread) is untouched.
    assert!(b.lock("lease").is_locked().unwrap());
    assert_eq!(
        server.cmd(&["HGET", "redwheel:lock:{lease}", "token"]),
        format!("${}\r\n{}\r\n", second.to_string().len(), second)
    );
    done_tx.send(()).unwrap();
    t.join().unwrap();
}

#[test]
fn force_unlock_frees_the_lock_and_the_holder_learns_it_lost_the_lease() {
    let server = RedisServer::start();
    let (a, b) = (server.connect(), server.connect());
    let (tx, rx) = mpsc::channel();
    let tx = Mutex::new(tx);
    let guard = a
        .lock("force")
        .watchdog_lease(Duration::from_secs(1))
        .on_lost(move |lost| {
            // Never on the wheel or driver thread: on the lock watcher's.
            let thread = std::thread::current().name().map(str::to_owned);
            assert_eq!(thread.as_deref(), Some("redwheel-lock-watch"));
            let _ = tx.lock().unwrap().send((
                lost.name().to_owned(),
                lost.fencing_token(),
                lost.cause(),
            ));
        })
        .lock()
        .unwrap();
    assert!(b.lock("force").force_unlock().unwrap());
    assert!(!b.lock("force").force_unlock().unwrap(), "already free");
    // a's next renewal finds it gone.
    let (name, token, cause) = rx.recv_timeout(HANG).unwrap();
    assert_eq!(name, "force");
    assert_eq!(token, guard.fencing_token());
    assert_eq!(cause, LostCause::Gone);
    assert!(guard.is_lost());
    let g = b.lock("force").try_lock(Duration::ZERO).unwrap().unwrap();
    assert_eq!(guard.unlock().unwrap_err().kind(), ErrorKind::LockLost);
    assert!(!g.is_lost());
    g.unlock().unwrap();
    assert_eq!(a.lock_stats().lost, 1);
}

#[test]
fn a_waiter_is_woken_by_the_unlock_not_by_its_lease_bound() {
    let server = RedisServer::start();
    let (holder, waiter) = (server.connect(), server.connect());
    // A 60 s lease, no watchdog: the waiter's own bound is a minute away,
    // past the hang guard, so only the unlock's notification can wake it.
    let guard = holder
        .lock("wake")
        .lock_with_lease(Duration::from_secs(60))
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let t = std::thread::spawn({
        let waiter = waiter.clone();
        move || {
            let g = waiter.lock("wake").lock().unwrap();
            tx.send(g.fencing_token()).unwrap();
        }
    });
    // Wait until the waiter waits, subscribed to the unlock channel.
    within(HANG, {
        let waiter = waiter.clone();
        let url = server.url();
        move || {
            let mut con = redis::Client::open(url).unwrap().get_connection().unwrap();
            loop {
                let subs: Vec<(String, u64)> = redis::cmd("PUBSUB")
                    .arg("SHARDNUMSUB")
                    .arg("redwheel:lock:{wake}:unlock")
                    .query(&mut con)
                    .unwrap();
                // Subscribed, and the attempt that follows the subscription
                // (anything released before it was missed) is done.
                let s = waiter.lock_stats();
                if subs[0].1 == 1 && s.waiting == 1 && s.acquire_attempts == 2 {
                    break;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    });
    let attempts = waiter.lock_stats().acquire_attempts;
    std::thread::sleep(Duration::from_millis(300)); // a window to catch polling
    assert_eq!(waiter.lock_stats().acquire_attempts, attempts, "no polling");
    let token = guard.fencing_token();
    guard.unlock().unwrap();
    let got = rx.recv_timeout(Duration::from_secs(30)).unwrap();
    assert!(got > token);
    t.join().unwrap();
}

#[test]
fn one_unlock_wakes_one_waiter_of_a_process() {
    let server = RedisServer::start();
    let (holder, waiters) = (server.connect(), server.connect());
    let guard = holder
        .lock("one")
        .lock_with_lease(Duration::from_secs(60))
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let done_rx = Arc::new(Mutex::new(done_rx));
    let spawn = |n: usize| -> Vec<_> {
        (0..n)
            .map(|_| {
                let (w, tx, done) = (waiters.clone(), tx.clone(), Arc::clone(&done_rx));
                std::thread::spawn(move || {
                    let g = w.lock("one").lock().unwrap();
                    tx.send(()).unwrap();
                    // Hold it until the test says so.
                    let _ = done.lock().unwrap().recv();
                    drop(g);
                })
            })
            .collect()
    };
    let settled = |attempts: u64, waiting: usize| {
        let w = waiters.clone();
        within(HANG, move || {
            loop {
                let s = w.lock_stats();
                if s.acquire_attempts >= attempts && s.waiting == waiting {
                    break;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };
    // One waiter first: its attempt, the subscription, and the attempt
    // that follows the subscription taking effect.
    let mut threads = spawn(1);
    settled(2, 1);
    // Three more: one attempt each, the channel is subscribed already.
    threads.extend(spawn(3));
    settled(5, 4);
    std::thread::sleep(Duration::from_millis(300)); // let the last attempt land
    let before = waiters.lock_stats().acquire_attempts;
    guard.unlock().unwrap();
    rx.recv_timeout(HANG).unwrap();
    std::thread::sleep(Duration::from_millis(300)); // would catch a herd
    let after = waiters.lock_stats().acquire_attempts;
    assert_eq!(before, 5);
    assert_eq!(after - before, 1, "one waiter woken, one attempt");
    assert_eq!(waiters.lock_stats().waiting, 3);
    // Each release hands it to the next, through this process's own wake.
    for _ in 0..3 {
        done_tx.send(()).unwrap();
        rx.recv_timeout(HANG).unwrap();
    }
    done_tx.send(()).unwrap();
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn try_lock_gives_up_after_its_wait() {
    let server = RedisServer::start();
    let (a, b) = (server.connect(), server.connect());
    let _g = a.lock("busy").lock().unwrap();
    let r = within(HANG, move || {
        b.lock("busy")
            .try_lock(Duration::from_millis(100))
            .map(|g| g.is_some())
    });
    assert!(!r.unwrap());
}

/// The scripts alone, as a retry after a lost reply sends them again.
#[test]
fn retried_scripts_never_count_twice_nor_touch_another_owners_lock() {
    let server = RedisServer::start();
    let mut con = raw(&server);
    let acquire = redis::Script::new(include_str!("../lua/lock_acquire.lua"));
    let release = redis::Script::new(include_str!("../lua/lock_release.lua"));
    let renew = redis::Script::new(include_str!("../lua/lock_renew.lua"));
    let (key, fence, chan) = (
        "redwheel:lock:{s}",
        "redwheel:lock:{s}:fence",
        "redwheel:lock:{s}:unlock",
    );
    let acq = |con: &mut redis::Connection, owner: &str, token: u64, count: u32| -> Vec<i64> {
        acquire
            .key(key)
            .key(fence)
            .arg(owner)
            .arg(10_000)
            .arg(token)
            .arg(count)
            .invoke(con)
            .unwrap()
    };
    let record = |owner: &str, token: u64| format!("{key}:released:{owner}:{token}");
    let rel = |con: &mut redis::Connection, owner: &str, token: u64, left: u32| -> i64 {
        release
            .key(key)
            .key(chan)
            .key(record(owner, token))
            .arg(owner)
            .arg(token)
            .arg(left)
            .arg(10_000)
            .invoke(con)
            .unwrap()
    };
    let r = acq(&mut con, "a:1", 0, 1);
    let (t1, fresh) = (r[1] as u64, r[2]);
    assert_eq!((r[0], fresh), (1, 1));
    // A re-entry sent twice (its reply was lost) counts once.
    assert_eq!(acq(&mut con, "a:1", t1, 2), vec![1, t1 as i64, 0]);
    assert_eq!(acq(&mut con, "a:1", t1, 2), vec![1, t1 as i64, 0]);
    assert_eq!(server.cmd(&["HGET", key, "a:1"]), "$1\r\n2\r\n");
    // Another owner waits.
    let busy = acq(&mut con, "b:1", 0, 1);
    assert_eq!(busy[0], 0);
    assert!((9_000..=10_000).contains(&busy[1]), "{busy:?}");
    // An unlock sent twice counts once.
    assert_eq!(rel(&mut con, "a:1", t1, 1), 1);
    assert_eq!(rel(&mut con, "a:1", t1, 1), 1);
    assert_eq!(server.cmd(&["HGET", key, "a:1"]), "$1\r\n1\r\n");
    // The final unlock, sent twice: the retry is told an earlier attempt
    // of its own released it (its short-lived record), even with another
    // owner in between, whose lock it leaves alone.
    assert_eq!(rel(&mut con, "a:1", t1, 0), 0);
    let ttl = server.int(&["PTTL", &record("a:1", t1)]);
    assert!((1..=10_000).contains(&ttl), "the record lapses: {ttl}");
    assert_eq!(rel(&mut con, "a:1", t1, 0), -2);
    let r = acq(&mut con, "b:1", 0, 1);
    let t2 = r[1] as u64;
    assert!(t2 > t1);
    assert_eq!(rel(&mut con, "a:1", t1, 0), -2);
    // A release of a hold that is gone and was never released by its
    // owner (force-unlocked, or lost in a restart) is -1, before or after
    // the lock changed hands.
    assert_eq!(rel(&mut con, "a:1", t1 + 1, 0), -1);
    assert_eq!(rel(&mut con, "c:1", t1, 0), -1);
    assert_eq!(
        renew
            .key(key)
            .arg("a:1")
            .arg(t1)
            .arg(10_000)
            .invoke::<i64>(&mut con)
            .unwrap(),
        0
    );
    assert_eq!(
        renew
            .key(key)
            .arg("b:1")
            .arg(t2)
            .arg(20_000)
            .invoke::<i64>(&mut con)
            .unwrap(),
        1
    );
    assert!(server.int(&["PTTL", key]) > 10_000, "renewed to 20 s");
    // A renewal never shortens a lease.
    assert_eq!(
        renew
            .key(key)
            .arg("b:1")
            .arg(t2)
            .arg(1_000)
            .invoke::<i64>(&mut con)
            .unwrap(),
        1
    );
    assert!(server.int(&["PTTL", key]) > 10_000);
    // Even the same owner id with a stale token is refused (an old hold).
    assert_eq!(rel(&mut con, "b:1", t1, 0), -1);
    assert_eq!(server.int(&["EXISTS", key]), 1);
    // A key overwritten with another type is a lost hold to a renewal,
    // never an error that would fail the batch it is in.
    server.cmd(&["SET", key, "x"]);
    assert_eq!(
        renew
            .key(key)
            .arg("b:1")
            .arg(t2)
            .arg(1_000)
            .invoke::<i64>(&mut con)
            .unwrap(),
        0
    );
    // Tokens keep increasing even when the counter is lost.
    server.cmd(&["DEL", key, fence]);
    let r = acq(&mut con, "c:1", 0, 1);
    assert!(r[1] as u64 > t2);
}
