//! Locks on a real local Redis Cluster (3 masters + 3 replicas of the
//! machine's `redis-server`, tests/support/cluster.rs): a master that stops
//! answering holds up no lock on the other masters, and fencing tokens
//! keep increasing across a failover when the grants wait for a replica.

mod support;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redwheel::{ErrorKind, LockGuard, LostCause};
use support::cluster::{RedisCluster, wait_until};
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
    wait_until("a first renewal of every hold", HANG, || {
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
    wait_until("renewals after the stop", HANG, || {
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

/// A read of `key` on the replica at `port` (`READONLY` first).
fn read_on_replica(port: u16, key: &str) -> Option<String> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).unwrap();
    let mut con = client
        .get_connection_with_timeout(Duration::from_secs(5))
        .unwrap();
    redis::cmd("READONLY").query::<()>(&mut con).unwrap();
    redis::cmd("GET").arg(key).query(&mut con).unwrap()
}

/// Issue 18, item 10. A token is `max(last + 1, server TIME in µs)`: after
/// a failover to a replica that missed the last grant, tokens kept
/// increasing only through the clocks. With `wait_replicas`, a grant is
/// returned only once a replica holds it, so tokens increase across a
/// failover whatever the clocks say. Here the counter is set far beyond
/// any clock (so the time term cannot help), the master is killed right
/// after a grant, and on the promoted replica the lock is still held and
/// the next tokens are greater; a grant that no replica confirms (the
/// promoted master has none yet) is refused and the lock released.
#[test]
fn with_wait_replicas_tokens_increase_across_a_failover_right_after_a_grant_without_the_clocks() {
    let mut cluster = RedisCluster::start();
    let (a, b) = (cluster.connect(), cluster.connect());
    let name = "fenced";
    let fence = format!("redwheel:lock:{{{name}}}:fence");
    let master = master_of_lock(&cluster, name);
    let replica = cluster.replica_of(master);
    // Far beyond the clocks' µs (about 1.8e15 in 2026): only the counter
    // makes tokens increase now.
    let far: u64 = 8_000_000_000_000_000;
    cluster.node(master).cmd(&["SET", &fence, &far.to_string()]);
    let wait = Duration::from_secs(2);
    let lease = Duration::from_secs(10);
    let lock = |rw: &redwheel::Redwheel| rw.lock(name).watchdog_lease(lease).wait_replicas(1, wait);

    let g1 = lock(&a).lock().unwrap();
    let t1 = g1.fencing_token();
    assert_eq!(t1, far + 1, "the counter decides, not the clock");
    // Returned only once the replica had it.
    let on_replica: u64 = read_on_replica(replica, &fence).unwrap().parse().unwrap();
    assert!(on_replica >= t1, "{on_replica} < {t1}");
    g1.unlock().unwrap();
    let g2 = lock(&a).lock().unwrap();
    let t2 = g2.fencing_token();
    assert!(t2 > t1);

    // A failover right after the grant.
    cluster.kill(master);
    cluster.wait_failover(master, HANG);
    assert_eq!(
        master_of_lock(&cluster, name),
        replica,
        "the replica took over"
    );

    // The grant survived: nobody else gets the lock from the failover.
    let other = within(HANG, {
        let b = b.clone();
        move || {
            b.lock(name)
                .try_lock(Duration::ZERO)
                .unwrap()
                .map(|g| g.fencing_token())
        }
    });
    assert_eq!(other, None, "the lock is still held on the new master");
    assert!(!g2.is_lost());
    g2.unlock().unwrap();

    // The new master has no replica yet: a grant cannot be confirmed, so
    // it is refused and the lock released (its token is used up).
    let err = lock(&b).try_lock(Duration::ZERO).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotReplicated, "{err}");
    assert!(err.is_transient());
    let new_master = cluster.node(replica);
    assert_eq!(
        new_master.int(&["EXISTS", &format!("redwheel:lock:{{{name}}}")]),
        0,
        "released"
    );
    let counter: u64 = new_master
        .cmd(&["GET", &fence])
        .lines()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    assert!(counter > t2, "{counter} <= {t2}");

    // The old master is back as a replica: grants are confirmed again, and
    // every token is greater than those before the failover.
    cluster.restart(master);
    cluster.wait_replicas_in_sync(HANG);
    let g3 = within(HANG, {
        let b = b.clone();
        move || {
            let g = b
                .lock(name)
                .watchdog_lease(lease)
                .wait_replicas(1, wait)
                .try_lock(HANG)
                .unwrap()
                .expect("granted once a replica confirms");
            let t = g.fencing_token();
            g.unlock().unwrap();
            t
        }
    });
    assert!(g3 > counter, "{g3} <= {counter}");
    a.shutdown(Duration::from_secs(10)).unwrap();
    b.shutdown(Duration::from_secs(10)).unwrap();
}

/// `wait_replicas` that cannot work is refused before anything is sent.
#[test]
fn wait_replicas_out_of_range_is_an_invalid_option() {
    let server = support::RedisServer::start();
    let rw = server.connect();
    for (n, ms) in [(0, 100), (1, 0), (1, 5_000), (1, 61_000)] {
        let err = rw
            .lock("bad")
            .wait_replicas(n, Duration::from_millis(ms))
            .try_lock(Duration::ZERO)
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidOption, "{n} {ms}: {err}");
    }
    assert!(!rw.lock("bad").is_locked().unwrap());
    // On a server with no replica, a grant is refused and released.
    let err = rw
        .lock("alone")
        .wait_replicas(1, Duration::from_millis(50))
        .try_lock(Duration::ZERO)
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotReplicated, "{err}");
    assert!(
        err.to_string().contains("only 0 of the 1 replicas"),
        "{err}"
    );
    assert!(!rw.lock("alone").is_locked().unwrap());
}

/// Issue 29, finding 8: the synchronous unlock during a slot migration
/// (the lock's hash already on the new master, the slot not handed over
/// yet: `ASK`, then `TRYAGAIN` there, as the release names more than one
/// key) and after it (`MOVED`, the slot map read before the move). Both
/// unlocks are `Ok` and the lock is free.
#[test]
fn the_unlock_goes_through_during_and_after_a_slot_migration() {
    use std::sync::mpsc;
    let cluster = RedisCluster::start();
    let rw = cluster.connect();
    for (name, during) in [("ask-me", true), ("moved-me", false)] {
        let key = lock_key(name);
        let slot = cluster.keyslot(&key);
        let from = cluster.master_of_slot(slot);
        let to = cluster
            .master_ports()
            .into_iter()
            .find(|&p| p != from)
            .unwrap();
        let lock = rw.lock(name);
        // The holder: a thread of its own, which unlocks when told.
        let (go, go_rx) = mpsc::channel::<()>();
        let (held_tx, held) = mpsc::channel::<()>();
        let l = lock.clone();
        let holder = std::thread::spawn(move || {
            let g = l.lock().unwrap();
            held_tx.send(()).unwrap();
            go_rx.recv().unwrap();
            g.unlock()
        });
        held.recv_timeout(HANG).unwrap();
        let mut told = false;
        // One key per batch (the fence key moves too): a moment with the
        // hash moved and the slot not yet handed over.
        cluster.migrate_slot(slot, from, to, 1, || {
            if !during || told {
                return;
            }
            let left =
                cluster
                    .node(from)
                    .cmd(&["CLUSTER", "GETKEYSINSLOT", &slot.to_string(), "10"]);
            if !left.split("\r\n").any(|l| l == key) {
                told = true;
                go.send(()).unwrap();
                // Let the unlock meet the half-moved slot.
                std::thread::sleep(Duration::from_millis(300));
            }
        });
        if !during {
            go.send(()).unwrap();
        }
        let r = within(HANG, move || holder.join().unwrap());
        r.unwrap_or_else(|e| panic!("{name}: the unlock failed: {e}"));
        assert_eq!(cluster.master_of_slot(slot), to);
        assert!(!lock.is_locked().unwrap(), "{name}: the lock is free");
    }
}
