//! Routing on a real local Redis Cluster (3 masters + 3 replicas,
//! tests/support/cluster.rs): a `MOVED` reply is followed to the master it
//! names at once, and the slot map is refreshed in the background, so no
//! call waits for a refresh, nor for a node that does not answer one.

mod support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redwheel::{Redwheel, RedwheelOptions};
use support::cluster::{RedisCluster, wait_until};
use support::within;

const HANG: Duration = Duration::from_secs(180);

/// The ACL user the tests connect as: everything, until a test takes
/// `cluster|slots` away (so no slot map can be read any more).
const USER: &str = "app";
const PASSWORD: &str = "pw";

fn allow_everything(cluster: &RedisCluster) {
    cluster.acl_setuser(USER, &["on", ">pw", "~*", "&*", "+@all"]);
}

/// From now on no node tells `USER` its slot map: only redirects can say
/// where a slot went.
fn deny_slot_map(cluster: &RedisCluster) {
    cluster.acl_setuser(USER, &["-cluster|slots"]);
}

fn connect(cluster: &RedisCluster, options: RedwheelOptions) -> Redwheel {
    let urls = cluster.urls_as(USER, PASSWORD);
    let seeds: Vec<&str> = urls.iter().map(String::as_str).collect();
    Redwheel::connect_cluster_with(&seeds, options).unwrap()
}

/// Issue 18, item 8. A `MOVED` used to wait for a slot-map refresh, and a
/// refresh asked for within 20 ms of another was skipped, so a burst of
/// redirects failed calls with `Unavailable` in microseconds. Here the map
/// cannot be read at all while a queue's slot moves under load (the user
/// may not run `CLUSTER SLOTS`): the calls find the slot by following `ASK`
/// and `MOVED` alone, and every one of them succeeds.
#[test]
fn a_slot_migrated_under_load_fails_no_call_even_with_no_slot_map_to_read() {
    let cluster = RedisCluster::start();
    allow_everything(&cluster);
    let rw = connect(&cluster, RedwheelOptions::default());
    let name = "hot";
    let slot = cluster.keyslot(name);
    let from = cluster.master_of_slot(slot);
    let to = *cluster.master_ports().iter().find(|&&p| p != from).unwrap();
    let q = rw.queue::<String>(name).unwrap();
    q.offer(&"first".to_string(), Duration::from_secs(3_600))
        .unwrap();
    deny_slot_map(&cluster);

    let stop = Arc::new(AtomicBool::new(false));
    let calls = Arc::new(AtomicU64::new(0));
    let errors: Arc<Mutex<Vec<String>>> = Arc::default();
    let offered = Arc::new(AtomicU64::new(1));
    let workers: Vec<_> = (0..4)
        .map(|w| {
            let (q, stop, calls, errors, offered) = (
                q.clone(),
                Arc::clone(&stop),
                Arc::clone(&calls),
                Arc::clone(&errors),
                Arc::clone(&offered),
            );
            let lock = rw.lock(name);
            std::thread::spawn(move || {
                let mut i = 0u64;
                while !stop.load(Ordering::SeqCst) {
                    i += 1;
                    let r = match (w, i % 3) {
                        // One thread locks in the same slot (the lock's
                        // tag is the queue's name).
                        (0, _) => lock
                            .try_lock(Duration::from_secs(1))
                            .and_then(|g| g.map_or(Ok(()), |g| g.unlock())),
                        (_, 0) => q.len().map(|_| ()),
                        _ => q
                            .offer(&format!("{w}/{i}"), Duration::from_secs(3_600))
                            .map(|_| {
                                offered.fetch_add(1, Ordering::SeqCst);
                            }),
                    };
                    if let Err(e) = r {
                        errors.lock().unwrap().push(format!("{e} ({:?})", e.kind()));
                    }
                    calls.fetch_add(1, Ordering::SeqCst);
                }
            })
        })
        .collect();
    wait_until("load before the move", HANG, || {
        calls.load(Ordering::SeqCst) >= 50
    });
    cluster.migrate_slot(slot, from, to, 10, || {
        std::thread::sleep(Duration::from_millis(50));
    });
    assert_eq!(cluster.master_of_slot(slot), to, "the slot moved");
    // Calls go on after the move, every one of them redirected at first.
    let after = calls.load(Ordering::SeqCst);
    wait_until("load after the move", HANG, || {
        calls.load(Ordering::SeqCst) >= after + 200
    });
    stop.store(true, Ordering::SeqCst);
    for w in workers {
        within(HANG, move || w.join().unwrap());
    }
    let errors = errors.lock().unwrap().clone();
    assert!(
        errors.is_empty(),
        "{} calls failed: {errors:?}",
        errors.len()
    );
    assert_eq!(
        q.len().unwrap(),
        offered.load(Ordering::SeqCst),
        "every offer is there, once"
    );
    rw.shutdown(Duration::from_secs(10)).unwrap();
}

/// Issue 18, item 8. A refresh of the slot map used to run on the caller's
/// thread under a mutex, asking the first master of the map first: with
/// that master stopped, every caller that needed a refresh queued behind
/// its timeout (and the driver thread with them). Here a master is stopped
/// (SIGSTOP, no failover) and no other node will tell the map, so the one
/// refresh there is hangs on the stopped master for as long as the options
/// allow (a minute). Meanwhile calls on the live masters, one of them
/// redirected by a `MOVED`, go on, and so do the watchdog's renewals: none
/// of them waits for the refresh.
#[test]
fn calls_on_live_masters_never_wait_for_a_slot_map_refresh_stuck_on_a_stopped_master() {
    let cluster = RedisCluster::start_with_node_timeout(120_000);
    allow_everything(&cluster);
    // A minute for every connect and command: a refresh stuck on the
    // stopped master stays stuck through the test.
    let rw = connect(
        &cluster,
        RedwheelOptions::default()
            .connect_timeout(Duration::from_secs(60))
            .command_timeout(Duration::from_secs(60)),
    );
    // Asked first by a refresh: the master of the map's first slots.
    let stopped = cluster.master_of_slot(0);
    let live: Vec<u16> = cluster
        .master_ports()
        .into_iter()
        .filter(|&p| p != stopped)
        .collect();
    let on = |port: u16, prefix: &str| {
        (0..)
            .map(|i| format!("{prefix}-{i}"))
            .find(|n| {
                cluster.master_of_slot(cluster.keyslot(&format!("redwheel:lock:{{{n}}}"))) == port
            })
            .unwrap()
    };
    // A lock held on a live master, renewed by the driver throughout.
    let held_name = on(live[0], "held");
    let held = rw
        .lock(&held_name)
        .watchdog_lease(Duration::from_secs(3))
        .lock()
        .unwrap();
    // A lock whose slot moves from one live master to the other behind
    // this process's back: its next call gets `MOVED`.
    let moving = on(live[0], "moving");
    let slot = cluster.keyslot(&format!("redwheel:lock:{{{moving}}}"));
    assert!(!rw.lock(&moving).is_locked().unwrap());
    // Locks on both live masters (found before the stop: the test's own
    // `CLUSTER NODES` would wait on the stopped node).
    let others: Vec<String> = (0..20)
        .flat_map(|k| live.iter().map(move |&p| (p, k)))
        .map(|(p, k)| on(p, &format!("live-{p}-{k}")))
        .collect();
    deny_slot_map(&cluster);
    cluster.migrate_slot(slot, live[0], live[1], 10, || {});
    cluster.node(stopped).signal("STOP");

    let renewals = rw.lock_stats().renewals;
    let rw2 = rw.clone();
    let moving2 = moving.clone();
    within(Duration::from_secs(45), move || {
        // Redirected: follows the `MOVED` (asking for a refresh, which
        // hangs on the stopped master), without waiting for it.
        let g = rw2
            .lock(&moving2)
            .try_lock(Duration::ZERO)
            .unwrap()
            .expect("the moved lock is free");
        assert!(rw2.lock(&moving2).is_locked().unwrap());
        g.unlock().unwrap();
        for name in &others {
            let g = rw2
                .lock(name)
                .try_lock(Duration::ZERO)
                .unwrap()
                .expect("a free lock");
            g.unlock().unwrap();
        }
        // The watchdog renews the held lock meanwhile.
        while rw2.lock_stats().renewals < renewals + 3 {
            std::thread::sleep(Duration::from_millis(20));
        }
    });
    assert!(!held.is_lost());
    cluster.node(stopped).signal("CONT");
    held.unlock().unwrap();
    rw.shutdown(Duration::from_secs(10)).unwrap();
}

/// Issue 29, finding 5. On one server a read whose pooled connection the
/// server closed while it sat idle is sent again on a fresh one (README,
/// "When the connection drops"); on a cluster it failed with
/// `Unavailable` instead, and marked the master, which answers, down. Here
/// the queue's master closes every client connection (`CLIENT KILL TYPE
/// normal`) between two `len()`s, less than a second apart (so the pooled
/// connection is not checked with a `PING` first).
#[test]
fn a_read_on_a_connection_the_server_closed_while_idle_is_sent_again() {
    let cluster = RedisCluster::start();
    let rw = cluster.connect();
    let q = rw.queue::<String>("idle-read").unwrap();
    q.offer(&"a".to_string(), Duration::from_secs(60)).unwrap();
    assert_eq!(q.len().unwrap(), 1);
    let master = cluster.master_of_slot(cluster.keyslot("{idle-read}"));
    let killed = cluster
        .node(master)
        .cmd(&["CLIENT", "KILL", "TYPE", "normal"]);
    assert!(killed.starts_with(':'), "{killed}");
    let again = q.len();
    assert_eq!(
        again.as_ref().ok(),
        Some(&1),
        "the read is sent again on a fresh connection: {again:?}"
    );
}

/// Issue 29, finding 8. Every script of a queue declares keys that need
/// not exist (its wake channel, which never is a key, and optional ones:
/// controls, dead letters…). While the queue's slot is being migrated
/// Redis answers a command with a declared key missing `TRYAGAIN` (on the
/// source, where some keys exist) or `ASK` and then `TRYAGAIN` (on the
/// target, with keys missing there): so the queue's scripts cannot run for
/// the whole migration, from `MIGRATING` to the final `SETSLOT … NODE`,
/// not only while its keys are half moved. A call waits that out within
/// `command_timeout` and then fails with a transient error, nothing
/// applied; once the slot is settled it goes through.
#[test]
fn a_queues_scripts_wait_out_the_whole_of_a_slot_migration_within_the_command_timeout() {
    let cluster = RedisCluster::start();
    let rw = Redwheel::connect_cluster_with(
        &cluster
            .urls()
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
        RedwheelOptions::default().command_timeout(Duration::from_secs(1)),
    )
    .unwrap();
    let q = rw.queue::<String>("migrating").unwrap();
    q.offer(&"before".to_string(), Duration::from_secs(60))
        .unwrap();
    let slot = cluster.keyslot("{migrating}");
    let from = cluster.master_of_slot(slot);
    let to = *cluster.master_ports().iter().find(|&&p| p != from).unwrap();
    cluster.start_migration(slot, from, to);
    // Not one key has moved: every key of the queue is on the source.
    let delayed = "redwheel:{migrating}:delayed";
    assert_eq!(cluster.node(from).int(&["ZCARD", delayed]), 1);
    let started = std::time::Instant::now();
    let e = q
        .offer(&"during".to_string(), Duration::from_secs(60))
        .unwrap_err();
    let took = started.elapsed();
    eprintln!("an offer during the migration: {e:?} after {took:?}");
    assert!(e.is_transient(), "{e:?}");
    assert_ne!(e.kind(), redwheel::ErrorKind::OutcomeUnknown, "{e:?}");
    assert!(
        took >= Duration::from_millis(900),
        "waited the command timeout out: {took:?}"
    );
    assert_eq!(
        cluster.node(from).int(&["ZCARD", delayed]),
        1,
        "nothing was applied"
    );
    // The migration ends (its keys moved, the slot given to the target):
    // the same call goes through.
    cluster.migrate_slot(slot, from, to, 100, || {});
    q.offer(&"after".to_string(), Duration::from_secs(60))
        .unwrap();
    assert_eq!(q.len().unwrap(), 2);
}
