//! The watchdog: renewal while the holder lives, on time whatever the
//! wheel or the application threads are doing, and never past an unlock.
//! Redisson's watchdog tests (`RedissonLockExpirationRenewalTest`,
//! `RedissonLockTest`) are the model where named.

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use redwheel::{LostCause, Redwheel};
use support::{RedisServer, within};

const HANG: Duration = Duration::from_secs(60);

fn lost_flag(rw: &Redwheel, name: &str, lease: Duration) -> (redwheel::Lock, Arc<AtomicBool>) {
    let lost = Arc::new(AtomicBool::new(false));
    let l = Arc::clone(&lost);
    let lock = rw
        .lock(name)
        .watchdog_lease(lease)
        .on_lost(move |_| l.store(true, Ordering::SeqCst));
    (lock, lost)
}

#[test]
fn a_holder_that_lives_five_leases_keeps_the_lock() {
    let server = RedisServer::start();
    let (rw, other) = (server.connect(), server.connect());
    let (lock, lost) = lost_flag(&rw, "long", Duration::from_secs(1));
    let g = lock.lock().unwrap();
    let renewals = rw.lock_stats().renewals;
    let until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < until {
        assert!(
            other
                .lock("long")
                .try_lock(Duration::ZERO)
                .unwrap()
                .is_none()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    assert!(!g.is_lost());
    assert!(!lost.load(Ordering::SeqCst));
    // Renewed all along (every 333 ms).
    assert!(rw.lock_stats().renewals >= renewals + 5);
    g.unlock().unwrap();
}

/// A deliberately slow task holds the runtime's wheel thread for three
/// leases: the driver's backstop runs the renewals anyway.
#[test]
fn renewals_stay_on_time_while_a_slow_task_holds_the_wheel_thread() {
    let server = RedisServer::start();
    let rw = server.connect();
    let (lock, lost) = lost_flag(&rw, "stall", Duration::from_millis(600));
    let g = lock.lock().unwrap();
    redwheel::test_support::stall_wheel(&rw, Duration::from_millis(1_800));
    let renewals = rw.lock_stats().renewals;
    std::thread::sleep(Duration::from_millis(1_800)); // the stall
    assert!(
        rw.lock_stats().renewals >= renewals + 3,
        "renewed during the stall"
    );
    assert!(!g.is_lost());
    assert!(!lost.load(Ordering::SeqCst));
    g.unlock().unwrap();
}

#[test]
fn renewals_stay_on_time_while_application_threads_are_busy() {
    let server = RedisServer::start();
    let rw = server.connect();
    let (lock, lost) = lost_flag(&rw, "busy", Duration::from_millis(600));
    let g = lock.lock().unwrap();
    let renewals = rw.lock_stats().renewals;
    let stop = Arc::new(AtomicBool::new(false));
    let spinners: Vec<_> = (0..4)
        .map(|_| {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                let mut x = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                }
                x
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(1_800));
    stop.store(true, Ordering::Relaxed);
    for s in spinners {
        s.join().unwrap();
    }
    assert!(rw.lock_stats().renewals >= renewals + 3);
    assert!(!g.is_lost());
    assert!(!lost.load(Ordering::SeqCst));
    g.unlock().unwrap();
}

/// Redisson's `testLockReentrantRenew` (LW-10): a thread locks twice and
/// unlocks twice; a second thread then takes the lock and must stay
/// renewed indefinitely.
#[test]
fn a_lock_taken_after_a_reentrant_lock_and_unlock_stays_renewed() {
    let server = RedisServer::start();
    let rw = server.connect();
    let lease = Duration::from_millis(500);
    let (lock, lost) = lost_flag(&rw, "lw10", lease);
    {
        let a = lock.lock().unwrap();
        let b = lock.lock().unwrap();
        b.unlock().unwrap();
        a.unlock().unwrap();
    }
    let t = std::thread::spawn({
        let lock = lock.clone();
        move || {
            let g = lock.lock().unwrap();
            std::thread::sleep(lease * 6);
            let held = !g.is_lost();
            g.unlock().unwrap();
            held
        }
    });
    assert!(t.join().unwrap());
    assert!(!lost.load(Ordering::SeqCst));
}

/// Renewal rounds crossing thousands of unlocks and re-locks (a 300 ms
/// lease: a round every 100 ms) never mark a hold lost, never extend a
/// released lock, and leave nothing renewed at the end.
#[test]
fn renewals_crossing_unlocks_never_mark_the_next_hold_lost() {
    let server = RedisServer::start();
    let rw = server.connect();
    let (lock, lost) = lost_flag(&rw, "race", Duration::from_millis(300));
    let rounds = rw.lock_stats().renewal_rounds;
    let mut n = 0;
    while rw.lock_stats().renewal_rounds < rounds + 10 {
        let g = lock.lock().unwrap();
        if n % 7 == 0 {
            let again = lock.lock().unwrap();
            drop(again);
        }
        assert!(!g.is_lost());
        g.unlock().unwrap();
        n += 1;
    }
    assert!(!lost.load(Ordering::SeqCst), "after {n} lock/unlock pairs");
    assert_eq!(rw.lock_stats().lost, 0);
    // Rounds that found only locks still being acquired sent nothing and
    // failed nothing (the driver's connection was never dropped for them).
    let d = rw.driver_stats();
    assert_eq!((d.failed_rounds, d.reconnects), (0, 0), "{d:?}");
    assert_eq!(rw.lock_stats().watchdog_holds, 0);
    // Nothing renews the released lock: it is gone and stays gone.
    let rounds = rw.lock_stats().renewal_rounds;
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(server.int(&["EXISTS", "redwheel:lock:{race}"]), 0);
    assert!(
        rw.lock_stats().renewal_rounds <= rounds + 1,
        "the group went idle"
    );
}

/// Redisson's `testAutoExpire` (LW-08): once the holder's client shuts down,
/// nothing renews the lock, and it frees within the watchdog lease.
#[test]
fn a_shut_down_holder_stops_renewing_and_the_lock_lapses() {
    let server = RedisServer::start();
    let rw = server.connect();
    let (lost_tx, lost_rx) = mpsc::channel();
    let lost_tx = Mutex::new(lost_tx);
    let lock = rw
        .lock("expire")
        .watchdog_lease(Duration::from_millis(500))
        .on_lost(move |l| {
            let _ = lost_tx.lock().unwrap().send(l.cause());
        });
    let g = lock.lock().unwrap();
    let token = g.fencing_token();
    rw.shutdown(Duration::from_secs(10)).unwrap();
    // The guard learns, without Redis, that its lease ran out.
    assert_eq!(lost_rx.recv_timeout(HANG).unwrap(), LostCause::Expired);
    assert!(g.is_lost());
    let other = server.connect();
    let token2 = within(HANG, move || {
        other.lock("expire").lock().unwrap().fencing_token()
    });
    assert!(token2 > token);
    drop(g); // unlock after shutdown: logged, nothing sent
}

/// Many holds of one process share each renewal round: 1,000 locks, one
/// round trip per period for all of them.
#[test]
fn a_thousand_held_locks_are_renewed_in_one_round_per_period() {
    let server = RedisServer::start();
    let rw = server.connect();
    let guards: Vec<_> = (0..1_000)
        .map(|i| {
            rw.lock(&format!("many-{i}"))
                .watchdog_lease(Duration::from_millis(900))
                .lock()
                .unwrap()
        })
        .collect();
    assert_eq!(rw.lock_stats().watchdog_holds, 1_000);
    // A round sent while the locks were still being taken renews only
    // those taken before it: count from the end of the next round on.
    let wait_rounds = |n: u64| {
        within(HANG, {
            let rw = rw.clone();
            move || {
                while rw.lock_stats().renewal_rounds < n {
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        })
    };
    wait_rounds(rw.lock_stats().renewal_rounds + 2);
    let s0 = rw.lock_stats();
    let (rounds, renewals) = (s0.renewal_rounds, s0.renewals);
    within(HANG, {
        let rw = rw.clone();
        move || {
            while rw.lock_stats().renewal_rounds < rounds + 3 {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    });
    let s = rw.lock_stats();
    let per_round = (s.renewals - renewals) as f64 / (s.renewal_rounds - rounds) as f64;
    assert!(per_round > 900.0, "{per_round} renewals per round");
    assert!(guards.iter().all(|g| !g.is_lost()));
    drop(guards);
    assert_eq!(rw.lock_stats().watchdog_holds, 0);
}
