//! Locks on a real local Redis Cluster (3 masters + 3 replicas of the
//! machine's `redis-server`, tests/support/cluster.rs): a master that stops
//! answering holds up no lock on the other masters, and fencing tokens
//! keep increasing across a failover when the grants wait for a replica.

mod support;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redwheel::{ErrorKind, LockGuard, LostCause};
use support::cluster::RedisCluster;
use support::within;

const HANG: Duration = Duration::from_secs(180);

/// The lock's hash key, as redwheel names it.
fn lock_key(name: &str) -> String {
    format!("redwheel:lock:{{{name}}}")
}

/// The master serving lock `name`, as Redis reports it (`CLUSTER KEYSLOT`).
fn master_of_lock(cluster: &RedisCluster, name: &str) -> u16 {
    cluster.master_of_slot(cluster.keyslot(&lock_key(name)))
}

/// Waits (polling, with a hang guard) until `done` holds.
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let give_up = Instant::now() + HANG;
    while !done() {
        assert!(Instant::now() < give_up, "hang guard: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Issue 18, item 7. One renewal group (one driver job) renews the locks
/// of every master; a master that stops answering used to fail the whole
/// job, so no lock of the lease was confirmed and every one of them, on
/// every master, lapsed. Now each lock's renewal counts on its own: a
/// master stopped (SIGSTOP, no failover) for two leases loses only its own
/// locks; the others are neither lost nor reported lost, and stay held in
/// Redis.
#[test]
fn a_master_stopped_for_two_leases_loses_no_lock_held_on_the_other_masters() {
    // A node timeout far beyond the stop: the stopped master stays the
    // master of its slots (this is about a master that does not answer,
    // not about a failover).
    let cluster = RedisCluster::start_with_node_timeout(120_000);
    let rw = cluster.connect();
    let lease = Duration::from_secs(3);
    let names: Vec<String> = (0..30).map(|i| format!("spread-{i}")).collect();
    let master: HashMap<&str, u16> = names
        .iter()
        .map(|n| (n.as_str(), master_of_lock(&cluster, n)))
        .collect();
    let masters: HashSet<u16> = master.values().copied().collect();
    assert_eq!(masters.len(), 3, "the locks fall on all three masters");
    let stopped = master[names[0].as_str()];

    let lost: Arc<Mutex<Vec<(String, LostCause)>>> = Arc::default();
    let guards: Vec<(String, LockGuard)> = names
        .iter()
        .map(|n| {
            let lost = Arc::clone(&lost);
            let g = rw
                .lock(n)
                .watchdog_lease(lease)
                .on_lost(move |l| lost.lock().unwrap().push((l.name().to_owned(), l.cause())))
                .lock()
                .unwrap();
            (n.clone(), g)
        })
        .collect();

    // Running as in production: every hold renewed once, so the driver
    // is connected to every master when one of them stops.
    let renewals = rw.lock_stats().renewals;
    wait_until("a first renewal of every hold", || {
        rw.lock_stats().renewals >= renewals + names.len() as u64
    });
    cluster.node(stopped).signal("STOP");
    // The fault itself lasts two leases: its length, not a wait for an
    // event.
    std::thread::sleep(2 * lease);
    cluster.node(stopped).signal("CONT");

    // The stopped master answers again, and the renewal rounds went on
    // past it: a lock taken there now is held and renewed.
    let back = (0..)
        .map(|i| format!("back-{i}"))
        .find(|n| master_of_lock(&cluster, n) == stopped)
        .unwrap();
    let back_guard = within(HANG, {
        let rw = rw.clone();
        let back = back.clone();
        move || {
            let g = rw
                .lock(&back)
                .watchdog_lease(lease)
                .try_lock(HANG)
                .unwrap()
                .expect("the lock on the continued master");
            g.fencing_token()
        }
    });
    assert!(back_guard > 0);
    let rounds = rw.lock_stats().renewal_rounds;
    wait_until("renewals after the stop", || {
        rw.lock_stats().renewal_rounds >= rounds + 6
    });

    let lost = lost.lock().unwrap().clone();
    for (name, g) in &guards {
        let port = master[name.as_str()];
        if port == stopped {
            // No renewal could be confirmed for two leases: lost, and told.
            assert!(g.is_lost(), "{name} on the stopped master");
            assert!(
                lost.iter()
                    .any(|(n, c)| n == name && *c == LostCause::Expired),
                "{name}: {lost:?}"
            );
            continue;
        }
        assert!(!g.is_lost(), "{name} on {port} reads as lost");
        assert!(
            lost.iter().all(|(n, _)| n != name),
            "{name} on {port} reported lost: {lost:?}"
        );
        let node = cluster.node(port);
        let token = node.cmd(&["HGET", &lock_key(name), "token"]);
        assert!(
            token.contains(&g.fencing_token().to_string()),
            "{name} on {port} is still this hold's in Redis: {token:?}"
        );
        let ttl = node.int(&["PTTL", &lock_key(name)]);
        assert!(ttl > 0, "{name} on {port} has a lease: {ttl}");
    }
    let on_stopped = guards
        .iter()
        .filter(|(n, _)| master[n.as_str()] == stopped)
        .count();
    assert_eq!(
        lost.len(),
        on_stopped,
        "only the stopped master's: {lost:?}"
    );
    for (name, g) in guards {
        let r = g.unlock();
        if master[name.as_str()] == stopped {
            assert_eq!(r.unwrap_err().kind(), ErrorKind::LockLost, "{name}");
        } else {
            r.unwrap_or_else(|e| panic!("{name}: {e}"));
        }
    }
    rw.shutdown(Duration::from_secs(10)).unwrap();
}
