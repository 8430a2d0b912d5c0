//! Every lock write (lock, try_lock, unlock, and the watchdog's renewal
//! on the runtime's driver connection) with its reply lost, cut midway or
//! delayed past the command timeout by the proxy, after the server ran
//! it. What the server holds afterwards (read directly) must match what
//! the caller was told.
//!
//! A `LockGuard` belongs to the thread that took it, so each scenario's
//! holder runs on a thread of its own and reports over channels.

mod faults_common;
mod support;

use std::sync::mpsc;
use std::time::Duration;

use faults_common::{Cut, Env, HANG, scripts, sha, string, under_every_cut};
use redwheel::{Error, ErrorKind, Lock};
use support::proxy::{Fault, Rule};

const KEY: &str = "redwheel:lock:{L}";

/// What the server says about lock `L`: its token and how many owners
/// hold it (fields other than `token`).
fn held(env: &Env) -> Option<(u64, i64)> {
    let token = string(&env.server, &["HGET", KEY, "token"])?;
    let owners = env.server.int(&["HLEN", KEY]) - 1;
    Some((token.parse().unwrap(), owners))
}

/// How a holder thread acquires.
#[derive(Debug, Clone, Copy)]
enum Acquire {
    Lock,
    TryLock,
}

/// A holder on a thread of its own: acquires as told, reports the token
/// (or the error), then on `go` reports whether its guard reads as lost,
/// unlocks and reports the unlock's result.
struct Holder {
    go: mpsc::Sender<()>,
    acquired: mpsc::Receiver<Result<u64, Error>>,
    lost: mpsc::Receiver<bool>,
    unlocked: mpsc::Receiver<Result<(), Error>>,
}

impl Holder {
    fn start(lock: Lock, how: Acquire) -> Holder {
        let (go, go_rx) = mpsc::channel();
        let (acq_tx, acquired) = mpsc::channel();
        let (lost_tx, lost) = mpsc::channel();
        let (unl_tx, unlocked) = mpsc::channel();
        std::thread::spawn(move || {
            let g = match how {
                Acquire::Lock => lock.lock(),
                Acquire::TryLock => lock
                    .try_lock(Duration::from_secs(10))
                    .map(|g| g.expect("granted: nobody else holds it")),
            };
            let g = match g {
                Ok(g) => g,
                Err(e) => {
                    let _ = acq_tx.send(Err(e));
                    return;
                }
            };
            let _ = acq_tx.send(Ok(g.fencing_token()));
            if go_rx.recv().is_err() {
                return;
            }
            let _ = lost_tx.send(g.is_lost());
            let _ = unl_tx.send(g.unlock());
        });
        Holder {
            go,
            acquired,
            lost,
            unlocked,
        }
    }

    /// Lets the holder go on: is its guard lost, and how did unlocking go.
    fn finish(self) -> (bool, Result<(), Error>) {
        self.go.send(()).unwrap();
        let lost = self.lost.recv_timeout(HANG).unwrap();
        (lost, self.unlocked.recv_timeout(HANG).unwrap())
    }
}

/// Takes the lock once and lets it go (scripts loaded, a connection idle).
fn warm_up(lock: &Lock) {
    let h = Holder::start(lock.clone(), Acquire::Lock);
    h.acquired.recv_timeout(HANG).unwrap().unwrap();
    let (_, unlocked) = h.finish();
    unlocked.unwrap();
}

/// The acquisition runs under `cut`. If it is granted, Redis holds the
/// lock with the guard's token, for one owner, and that token is the
/// last one handed out; if it fails, nobody holds it (or the outcome is
/// unknown).
fn acquire_under(how: Acquire, cut: Cut) {
    let env = Env::start();
    let lock = env.rw.lock("L");
    warm_up(&lock);
    let rule = env.proxy.inject(cut.rule(&sha(scripts::LOCK_ACQUIRE)));
    let h = Holder::start(lock, how);
    let r = h.acquired.recv_timeout(HANG).unwrap();
    assert!(
        rule.wait_fired(1, HANG),
        "the fault fired: the server ran the acquire"
    );
    match r {
        Ok(token) => {
            assert_eq!(
                held(&env),
                Some((token, 1)),
                "{how:?} granted token {token}: Redis must hold that, once"
            );
            let fence: u64 = string(&env.server, &["GET", "redwheel:lock:{L}:fence"])
                .unwrap()
                .parse()
                .unwrap();
            assert_eq!(fence, token, "the guard's token is the last one handed out");
            let (lost, unlocked) = h.finish();
            assert!(!lost, "the hold was never lost");
            unlocked.unwrap();
            assert_eq!(held(&env), None, "one unlock frees it");
        }
        Err(e) if e.is_outcome_unknown() => {}
        Err(e) => assert_eq!(
            held(&env),
            None,
            "{how:?} failed with {e}, yet the lock is held"
        ),
    }
}

under_every_cut!(lock_a_free_lock, |cut| acquire_under(Acquire::Lock, cut));
under_every_cut!(try_lock_a_free_lock, |cut| acquire_under(
    Acquire::TryLock,
    cut
));

/// The unlock of a hold held throughout runs under `cut`: `Ok` iff the
/// lock is free; never `LockLost` (the lease was never lost).
fn unlock(cut: Cut) {
    let env = Env::start();
    let lock = env.rw.lock("L");
    warm_up(&lock);
    let h = Holder::start(lock, Acquire::Lock);
    let token = h.acquired.recv_timeout(HANG).unwrap().unwrap();
    assert_eq!(held(&env), Some((token, 1)));
    let rule = env.proxy.inject(cut.rule(&sha(scripts::LOCK_RELEASE)));
    let (lost, r) = h.finish();
    assert!(!lost);
    assert!(
        rule.wait_fired(1, HANG),
        "the fault fired: the server ran the release"
    );
    match r {
        Ok(()) => assert_eq!(held(&env), None, "unlock said done, the lock is still held"),
        Err(e) if e.kind() == ErrorKind::LockLost => {
            panic!("unlock reported the lease lost, but it was held throughout: {e}")
        }
        Err(e) => assert!(e.is_transient(), "{e}"),
    }
}

under_every_cut!(unlock_a_held_lock, unlock);

/// A renewal of the watchdog runs under `cut`, on the driver's
/// connection. The holder keeps the lock: later renewals go through,
/// Redis still holds it with its token, and the guard is not lost.
fn renew(cut: Cut) {
    let env = Env::start();
    // Renewed every second; a failed round is retried well within it.
    let lock = env.rw.lock("L").watchdog_lease(Duration::from_secs(3));
    let renew_sha = sha(scripts::LOCK_RENEW);
    // Warm up: one renewal (loads the script) and an unlock.
    let first = env
        .proxy
        .inject(Rule::new(Fault::Forward).matching(&renew_sha).times(1));
    let h = Holder::start(lock.clone(), Acquire::Lock);
    h.acquired.recv_timeout(HANG).unwrap().unwrap();
    assert!(first.wait_fired(1, HANG));
    h.finish().1.unwrap();
    let h = Holder::start(lock, Acquire::Lock);
    let token = h.acquired.recv_timeout(HANG).unwrap().unwrap();
    let fault = env.proxy.inject(cut.rule(&renew_sha));
    let later = env
        .proxy
        .inject(Rule::new(Fault::Forward).matching(&renew_sha));
    assert!(
        fault.wait_fired(1, HANG),
        "the fault fired: the server ran the renewal"
    );
    assert!(later.wait_fired(2, HANG), "renewals go on after the fault");
    assert_eq!(
        held(&env),
        Some((token, 1)),
        "Redis still holds the lock for its holder"
    );
    let ttl = env.server.int(&["PTTL", KEY]);
    assert!(ttl > 0, "the lease is renewed (PTTL {ttl})");
    let (lost, unlocked) = h.finish();
    assert!(
        !lost,
        "the guard must not read as lost: its lease was renewed"
    );
    unlocked.unwrap();
}

under_every_cut!(renew_a_watchdog_lease, renew);

/// Issue 29, finding 1 (trigger A): the holder's lock is force-unlocked
/// and taken by another process; then the holder's release runs with its
/// reply lost, and its resend finds the lock someone else's. That unlock
/// did not release this hold (nothing did: it was gone), so it must be
/// `LockLost`, counted and signalled, never `Ok`.
#[test]
fn a_resent_unlock_is_lock_lost_when_another_owner_took_the_lock_meanwhile() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let env = Env::start();
    let signalled = Arc::new(AtomicUsize::new(0));
    let s = Arc::clone(&signalled);
    let lock = env.rw.lock("L").on_lost(move |_| {
        s.fetch_add(1, Ordering::SeqCst);
    });
    warm_up(&lock);
    let h = Holder::start(lock, Acquire::Lock);
    let t1 = h.acquired.recv_timeout(HANG).unwrap().unwrap();
    // Another process force-unlocks L and takes it.
    let other = env.direct();
    assert!(other.lock("L").force_unlock().unwrap());
    let g2 = other
        .lock("L")
        .try_lock(Duration::ZERO)
        .unwrap()
        .expect("free after the force unlock");
    let t2 = g2.fencing_token();
    assert!(t2 > t1);
    let rule = env
        .proxy
        .inject(Cut::LoseReply.rule(&sha(scripts::LOCK_RELEASE)));
    let (_, r) = h.finish();
    assert!(
        rule.wait_fired(1, HANG),
        "the first release ran, its reply lost"
    );
    let e = r.expect_err("the unlock released nothing: the lock was another owner's");
    assert_eq!(e.kind(), ErrorKind::LockLost, "{e}");
    assert_eq!(env.rw.lock_stats().lost, 1, "the lost hold is counted");
    let deadline = std::time::Instant::now() + HANG;
    while signalled.load(Ordering::SeqCst) == 0 {
        assert!(std::time::Instant::now() < deadline, "hang guard: on_lost");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(
        held(&env),
        Some((t2, 1)),
        "the other owner's hold is untouched"
    );
    g2.unlock().unwrap();
}
