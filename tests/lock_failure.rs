//! Locks when things fail: a killed holder, Redis restarts, a holder cut
//! off from Redis, replies lost on the wire, connections killed, and a
//! least-privilege ACL user.

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use redwheel::{ErrorKind, LostCause, Redwheel, RedwheelOptions};
use support::proxy::{Fault, Proxy, Rule};
use support::{RedisServer, add_acl_user, readme_acl_rules, within};

const HANG: Duration = Duration::from_secs(60);

fn connect(url: &str) -> Redwheel {
    Redwheel::connect(url).unwrap()
}

/// The SHA1 of a lock script as redwheel sends it in `EVALSHA`.
fn sha(name: &str) -> String {
    redwheel::test_support::script_sha(name).unwrap_or_else(|| panic!("no script {name}"))
}

/// Sends each lost hold's (token, cause) down a channel.
fn lost_channel() -> (
    impl Fn(&redwheel::LeaseLost) + Send + Sync + 'static,
    mpsc::Receiver<(u64, LostCause)>,
) {
    let (tx, rx) = mpsc::channel();
    let tx = Mutex::new(tx);
    (
        move |l: &redwheel::LeaseLost| {
            let _ = tx.lock().unwrap().send((l.fencing_token(), l.cause()));
        },
        rx,
    )
}

/// A child process killed when the test ends, passed or not.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// When run as the child of `a_holder_killed_with_sigkill_frees_the_lock_within_its_lease`
/// (the env var names the server), takes the lock, prints its token and
/// holds it until killed. Run normally, it does nothing.
#[test]
fn child_process_holder() {
    let Ok(url) = std::env::var("REDWHEEL_LOCK_CHILD_URL") else {
        return;
    };
    let rw = connect(&url);
    let g = rw
        .lock("killed")
        .watchdog_lease(Duration::from_secs(1))
        .lock()
        .unwrap();
    println!("token {}", g.fencing_token());
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

#[test]
fn a_holder_killed_with_sigkill_frees_the_lock_within_its_lease() {
    let server = RedisServer::start();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_process_holder",
            "--test-threads=1",
            "--quiet",
            "--nocapture",
        ])
        .env("REDWHEEL_LOCK_CHILD_URL", server.url())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut child = KillOnDrop(child);
    let child_token: u64 = within(HANG, move || {
        for line in lines.by_ref() {
            if let Some(t) = line.unwrap().strip_prefix("token ") {
                return t.parse().unwrap();
            }
        }
        panic!("the child exited without the lock");
    });
    // Its watchdog renews: the TTL climbs back up (by more than 100 ms
    // over the lowest value seen) at least once.
    let key = "redwheel:lock:{killed}";
    within(HANG, {
        let url = server.url();
        move || {
            let mut con = redis::Client::open(url).unwrap().get_connection().unwrap();
            let mut low = i64::MAX;
            loop {
                let ttl: i64 = redis::cmd("PTTL").arg(key).query(&mut con).unwrap();
                if ttl > low.saturating_add(100) {
                    break;
                }
                low = low.min(ttl);
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    });
    child.0.kill().unwrap(); // SIGKILL: no unlock, no goodbye
    child.0.wait().unwrap();
    let killed = Instant::now();
    // Whatever the moment of death, at most one lease is left.
    let ttl = server.int(&["PTTL", key]);
    assert!((0..=1_000).contains(&ttl), "{ttl}");
    let rw = connect(&server.url());
    let token = within(HANG, move || {
        let g = rw.lock("killed").lock().unwrap();
        g.fencing_token()
    });
    assert!(token > child_token);
    eprintln!(
        "the lock was free {:?} after the SIGKILL (TTL then {ttl} ms)",
        killed.elapsed()
    );
}

#[test]
fn a_restart_with_appendonly_keeps_the_lock_and_its_holder() {
    let mut server = RedisServer::with_appendonly();
    let rw = connect(&server.url());
    let (on_lost, lost) = lost_channel();
    let lock = rw
        .lock("aof")
        .watchdog_lease(Duration::from_secs(2))
        .on_lost(on_lost);
    let g = lock.lock().unwrap();
    let token = g.fencing_token();
    server.restart();
    // The holder renews on the restarted server (a renewal runs as soon as
    // the subscriber is back, then every lease / 3).
    let before = rw.lock_stats().renewals;
    within(HANG, {
        let rw = rw.clone();
        move || {
            while rw.lock_stats().renewals < before + 2 {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    });
    assert!(!g.is_lost());
    assert!(lost.try_recv().is_err());
    let other = connect(&server.url());
    assert!(
        other
            .lock("aof")
            .try_lock(Duration::ZERO)
            .unwrap()
            .is_none()
    );
    g.unlock().unwrap();
    let g2 = other.lock("aof").try_lock(Duration::ZERO).unwrap().unwrap();
    assert!(g2.fencing_token() > token);
}

/// Without persistence a restart forgets the lock: another owner may take
/// it before the holder's next renewal. The holder is then told, and the
/// new owner's fencing token is still the greater (the counter was lost
/// too; the server clock carries it).
#[test]
fn a_restart_that_loses_the_lock_ends_in_lost_and_fencing_still_increases() {
    let mut server = RedisServer::start();
    let rw = connect(&server.url());
    let (on_lost, lost) = lost_channel();
    let g = rw
        .lock("volatile")
        .watchdog_lease(Duration::from_secs(2))
        .on_lost(on_lost)
        .lock()
        .unwrap();
    let token = g.fencing_token();
    server.restart();
    let other = connect(&server.url());
    let g2 = other
        .lock("volatile")
        .try_lock(Duration::ZERO)
        .unwrap()
        .expect("the restarted server forgot the lock");
    assert!(g2.fencing_token() > token);
    let (lost_token, cause) = lost.recv_timeout(HANG).unwrap();
    assert_eq!((lost_token, cause), (token, LostCause::Gone));
    assert!(g.is_lost());
    let e = g.unlock().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::LockLost, "{e}");
    // The late unlock left the new owner's lock alone.
    assert!(!g2.is_lost());
    assert!(other.lock("volatile").is_locked().unwrap());
    g2.unlock().unwrap();
}

#[test]
fn a_holder_cut_off_from_redis_for_longer_than_its_lease_learns_it_lost_the_lock() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let cut_off = Redwheel::connect_with(
        &proxy.url(),
        RedwheelOptions::default().command_timeout(Duration::from_secs(2)),
    )
    .unwrap();
    let (on_lost, lost) = lost_channel();
    let g = cut_off
        .lock("partition")
        .watchdog_lease(Duration::from_millis(600))
        .on_lost(on_lost)
        .lock()
        .unwrap();
    let token = g.fencing_token();
    proxy.partition(true); // nothing passes, nothing is closed
    // Told while still cut off: no renewal confirmed within the lease.
    let (lost_token, cause) = lost.recv_timeout(HANG).unwrap();
    assert_eq!((lost_token, cause), (token, LostCause::Expired));
    assert!(g.is_lost());
    // Meanwhile the lock lapsed in Redis and another owner took it.
    let other = connect(&server.url());
    let (tx, rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let t = std::thread::spawn({
        let other = other.clone();
        move || {
            let g2 = other.lock("partition").lock().unwrap();
            tx.send(g2.fencing_token()).unwrap();
            done_rx.recv().unwrap();
            assert!(!g2.is_lost());
            g2.unlock().unwrap();
        }
    });
    let token2 = rx.recv_timeout(HANG).unwrap();
    assert!(token2 > token);
    proxy.partition(false);
    // The cut-off holder's unlock fails and leaves the new owner's lock be.
    let e = g_unlock(g); // bounded by the 2 s command timeout
    assert_eq!(e, Some(ErrorKind::LockLost));
    assert!(other.lock("partition").is_locked().unwrap());
    done_tx.send(()).unwrap();
    t.join().unwrap();
}

/// `unlock` of a guard that cannot leave its thread, on that thread.
fn g_unlock(g: redwheel::LockGuard) -> Option<ErrorKind> {
    g.unlock().err().map(|e| e.kind())
}

/// A connection cut repeatedly for a while shorter than the lease: the
/// renewals fail, are retried, and the lock is kept.
#[test]
fn renewals_that_fail_for_less_than_a_lease_are_retried_and_keep_the_lock() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let rw = connect(&proxy.url());
    let (on_lost, lost) = lost_channel();
    let g = rw
        .lock("flaky")
        .watchdog_lease(Duration::from_secs(3))
        .on_lost(on_lost)
        .lock()
        .unwrap();
    let failed = rw.driver_stats().failed_rounds;
    // Cut every connection through the proxy for a second (a third of
    // the lease), over and over.
    let until = Instant::now() + Duration::from_secs(1);
    while Instant::now() < until {
        proxy.cut_all();
        std::thread::sleep(Duration::from_millis(20));
    }
    let before = rw.lock_stats().renewals;
    within(HANG, {
        let rw = rw.clone();
        move || {
            while rw.lock_stats().renewals < before + 1 {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    });
    assert!(
        rw.driver_stats().failed_rounds > failed,
        "some renewal rounds failed"
    );
    assert!(!g.is_lost());
    assert!(lost.try_recv().is_err());
    g.unlock().unwrap();
}

/// The unlock reached Redis and released the lock, but its reply was
/// lost; another owner took the lock before the unlock was retried. The
/// retry must not release the new owner's lock, and it reports success.
#[test]
fn a_retried_unlock_after_a_lost_reply_never_releases_the_next_owner() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let rw = connect(&proxy.url());
    let other = connect(&server.url());
    let (ready_tx, ready_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let (res_tx, res_rx) = mpsc::channel();
    let holder = std::thread::spawn({
        let rw = rw.clone();
        move || {
            let lock = rw.lock("lost-reply");
            let outer = lock.lock().unwrap();
            let inner = lock.lock().unwrap(); // a re-entry: count 2
            ready_tx.send(outer.fencing_token()).unwrap();
            go_rx.recv().unwrap();
            // Count 2 -> 1, then 1 -> 0 with the lost reply.
            inner.unlock().unwrap();
            res_tx.send(("inner", lock.hold_count().unwrap())).unwrap();
            go_rx.recv().unwrap();
            let r = outer.unlock();
            res_tx.send(("outer", u32::from(r.is_ok()))).unwrap();
        }
    });
    let token = ready_rx.recv_timeout(HANG).unwrap();
    go_tx.send(()).unwrap();
    assert_eq!(res_rx.recv_timeout(HANG).unwrap(), ("inner", 1));
    // The release runs on the server; its reply is lost, and the holder's
    // connection is kept open (the holder hears nothing, so cannot retry)
    // until the rule is released.
    let lost = proxy.inject(
        Rule::new(Fault::LoseReply)
            .matching(sha("lock_release"))
            .times(1)
            .hold(),
    );
    go_tx.send(()).unwrap();
    assert!(lost.wait_fired(1, HANG), "the release ran, its reply lost");
    // The lock is free, and someone else takes it before the retry gets
    // through.
    let (tx, rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let t = std::thread::spawn(move || {
        let g = other
            .lock("lost-reply")
            .try_lock(Duration::ZERO)
            .unwrap()
            .unwrap();
        tx.send(g.fencing_token()).unwrap();
        done_rx.recv().unwrap();
        g.unlock().unwrap();
    });
    let t2 = rx.recv_timeout(HANG).unwrap();
    assert!(t2 > token);
    lost.release();
    let (_, ok) = res_rx.recv_timeout(HANG).unwrap();
    assert_eq!(ok, 1, "the retried unlock reports success");
    holder.join().unwrap();
    // The other owner still holds it.
    let owners = server.int(&["HLEN", "redwheel:lock:{lost-reply}"]);
    assert_eq!(owners, 2, "one owner field and the token");
    done_tx.send(()).unwrap();
    t.join().unwrap();
}

/// An acquire whose reply was lost, retried: one hold, count 1.
#[test]
fn a_retried_acquire_after_a_lost_reply_holds_the_lock_once() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let rw = connect(&proxy.url());
    // Loads the lock scripts, so the reply lost below is an acquire's
    // that ran, not a NOSCRIPT.
    rw.lock("warm-up").lock().unwrap().unlock().unwrap();
    let lost = proxy.inject(
        Rule::new(Fault::LoseReply)
            .matching(sha("lock_acquire"))
            .times(1)
            .hold(),
    );
    let locker = std::thread::spawn(move || {
        let lock = rw.lock("lost-acquire");
        let g = lock.lock().unwrap();
        let count = lock.hold_count().unwrap();
        let token = g.fencing_token();
        g.unlock().unwrap();
        assert!(!lock.is_locked().unwrap(), "one unlock frees it");
        (count, token)
    });
    assert!(lost.wait_fired(1, HANG), "the acquire's reply was lost");
    let key = "redwheel:lock:{lost-acquire}";
    assert_eq!(server.int(&["HLEN", key]), 2, "the lost acquire ran");
    lost.release();
    let (count, token) = within(HANG, move || locker.join().unwrap());
    assert_eq!(count, 1);
    assert!(token > 0);
}

#[test]
fn a_least_privilege_acl_user_runs_every_lock_operation() {
    let server = RedisServer::start();
    add_acl_user(&server, "app", "s3cret", &readme_acl_rules());
    server.cmd(&["ACL", "LOG", "RESET"]);
    let url = format!("redis://app:s3cret@127.0.0.1:{}/", server.port());
    let (a, b) = (connect(&url), connect(&url));
    let lock = a.lock("acl").watchdog_lease(Duration::from_millis(300));
    let g = lock.lock().unwrap();
    let again = lock.lock().unwrap();
    assert_eq!(lock.hold_count().unwrap(), 2);
    assert!(lock.is_locked().unwrap());
    drop(again);
    // A waiter in another instance subscribes and is woken; renewals run.
    let (tx, rx) = mpsc::channel();
    let t = std::thread::spawn({
        let b = b.clone();
        move || {
            let g = b
                .lock("acl")
                .lock_with_lease(Duration::from_secs(5))
                .unwrap();
            tx.send(g.fencing_token()).unwrap();
        }
    });
    let renewals = a.lock_stats().renewals;
    within(HANG, {
        let a = a.clone();
        move || {
            while a.lock_stats().renewals < renewals + 2 {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    });
    g.unlock().unwrap();
    rx.recv_timeout(HANG).unwrap();
    t.join().unwrap();
    let g = a
        .lock("acl")
        .lock_with_lease(Duration::from_secs(5))
        .unwrap();
    assert!(b.lock("acl").force_unlock().unwrap());
    assert_eq!(g.unlock().unwrap_err().kind(), ErrorKind::LockLost);
    a.shutdown(Duration::from_secs(10)).unwrap();
    b.shutdown(Duration::from_secs(10)).unwrap();
    let log = server.cmd(&["ACL", "LOG"]);
    assert_eq!(
        log.trim(),
        "*0",
        "denied by the ACL: {}",
        log.replace("\r\n", " ")
    );
}

/// Issue 28, finding 7: Redis stops answering (SIGSTOP) while
/// `try_lock(wait)` waits for a lock another process holds. It returns
/// within its wait plus one command timeout (with generous slack for a
/// loaded machine), with `Ok(None)` or a transient error.
#[test]
fn try_lock_returns_within_its_wait_when_redis_stops_mid_wait() {
    let server = RedisServer::start();
    let timeout = Duration::from_millis(500);
    let options = RedwheelOptions::default().command_timeout(timeout);
    let rw = Redwheel::connect_with(&server.url(), options).unwrap();
    let other = connect(&server.url());
    let held = other.lock("stopped").lock().unwrap();
    let wait = Duration::from_secs(2);
    let lock = rw.lock("stopped");
    let started = Instant::now();
    let waiter = std::thread::spawn(move || {
        let r = lock.try_lock(wait).map(|g| g.is_some());
        (r, started.elapsed())
    });
    let deadline = Instant::now() + HANG;
    while rw.lock_stats().acquire_attempts == 0 {
        assert!(Instant::now() < deadline, "hang guard: the first attempt");
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(300)); // mid-wait
    server.signal("STOP");
    let (r, took) = waiter.join().unwrap();
    server.signal("CONT");
    assert!(
        took < wait + timeout + Duration::from_secs(3),
        "try_lock({wait:?}) took {took:?} with Redis stopped"
    );
    match r {
        Ok(false) => {}
        Ok(true) => panic!("granted a lock another process holds"),
        Err(e) => assert!(e.is_transient(), "{e}"),
    }
    drop(held);
}
