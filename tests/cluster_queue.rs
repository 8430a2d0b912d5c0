//! Queues on a real local Redis Cluster: 3 masters + 3 replicas of the
//! machine's `redis-server` (tests/support/cluster.rs), through failover
//! and resharding.

mod support;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redwheel::{ErrorKind, MessageId, QueueOptions, Redwheel};
use support::cluster::{NODE_TIMEOUT_MS, RedisCluster};
use support::within;

const HANG: Duration = Duration::from_secs(180);

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

#[test]
fn the_local_cluster_has_three_masters_covering_every_slot() {
    let cluster = RedisCluster::start();
    assert_eq!(cluster.master_ports().len(), 3, "{:?}", cluster.nodes());
    assert_eq!(cluster.nodes().len(), 6);
    assert_eq!(
        cluster.keyslot("redwheel:{orders}:delayed"),
        cluster.keyslot("orders")
    );
}

#[test]
fn a_hundred_queues_spread_over_every_master_each_deliver_as_on_one_node() {
    let cluster = RedisCluster::start();
    let rw = cluster.connect();
    let names: Vec<String> = (0..100).map(|i| format!("spread-{i}")).collect();
    // Where Redis says each queue lives: every master holds some.
    let masters: HashSet<u16> = names
        .iter()
        .map(|n| cluster.master_of_slot(cluster.keyslot(&format!("redwheel:{{{n}}}:delayed"))))
        .collect();
    assert_eq!(masters.len(), 3, "the queues fall on all three masters");
    let per_queue = 10u64;
    let consumers: Vec<_> = names
        .iter()
        .map(|name| {
            let q = rw.queue::<String>(name).unwrap();
            let ids: Vec<MessageId> = (0..per_queue)
                .map(|i| {
                    q.offer(&format!("{name}/{i}"), Duration::from_millis(50 + i * 40))
                        .unwrap()
                })
                .collect();
            std::thread::spawn(move || {
                let mut got = Vec::new();
                for _ in 0..per_queue {
                    let m = q.take().unwrap();
                    got.push((m.id().clone(), m.due_ms(), now_ms()));
                }
                assert!(q.poll(Duration::from_millis(50)).unwrap().is_none());
                assert_eq!(q.len().unwrap(), 0);
                (ids, got)
            })
        })
        .collect();
    for c in consumers {
        let (ids, got) = within(HANG, move || c.join().unwrap());
        let got_ids: Vec<MessageId> = got.iter().map(|(id, _, _)| id.clone()).collect();
        assert_eq!(got_ids, ids, "each once, in due order");
        for (id, due, at) in got {
            assert!(at >= due, "{id} delivered {} ms early", due - at);
        }
    }
    rw.shutdown(Duration::from_secs(10)).unwrap();
}

/// Offers `name` messages with ids `p0, p1, …` until `stop`, counting
/// those Redis acknowledged (`Ok`).
fn produce(
    rw: &Redwheel,
    name: &str,
    options: QueueOptions,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<(HashSet<MessageId>, u64)> {
    let q = rw.queue_with::<String>(name, options).unwrap();
    std::thread::spawn(move || {
        let mut acked = HashSet::new();
        let mut failed = 0;
        let mut i = 0u64;
        while !stop.load(Ordering::SeqCst) {
            let id = MessageId::from(format!("p{i}"));
            match q.offer_with_id(&id, &format!("m{i}"), Duration::from_millis(20)) {
                Ok(_) => {
                    acked.insert(id);
                }
                Err(e) => {
                    assert!(e.is_transient(), "{e}");
                    failed += 1;
                }
            }
            i += 1;
            std::thread::sleep(Duration::from_millis(2));
        }
        (acked, failed)
    })
}

#[test]
fn a_killed_master_fails_over_and_no_offer_confirmed_by_a_replica_is_lost() {
    let mut cluster = RedisCluster::start();
    let rw = cluster.connect();
    let name = "failover";
    let owner = cluster.master_of_slot(cluster.keyslot(name));
    let stop = Arc::new(AtomicBool::new(false));
    let producer = produce(
        &rw,
        name,
        QueueOptions::default().wait_replicas(1, Duration::from_millis(500)),
        Arc::clone(&stop),
    );
    let q = rw.queue::<String>(name).unwrap();
    let (received_tx, received) = crossbeam_channel::unbounded::<(MessageId, Instant)>();
    let consumer_stop = Arc::new(AtomicBool::new(false));
    let consumer = {
        let q = q.clone();
        let stop = Arc::clone(&consumer_stop);
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                match q.poll(Duration::from_millis(100)) {
                    Ok(Some(m)) => {
                        let _ = received_tx.send((m.id().clone(), Instant::now()));
                    }
                    Ok(None) => {}
                    // The master is down until its replica takes over.
                    Err(e) => assert!(e.is_transient(), "{e}"),
                }
            }
        })
    };
    // Let deliveries flow, then kill the queue's master mid-run.
    let first = received.recv_timeout(HANG).expect("deliveries start");
    let mut got: HashMap<MessageId, u32> = HashMap::from([(first.0, 1)]);
    for _ in 0..50 {
        let (id, _) = received.recv_timeout(HANG).unwrap();
        *got.entry(id).or_default() += 1;
    }
    cluster.kill(owner);
    let killed_at = Instant::now();
    // The replica takes over once the node timeout has passed.
    cluster.wait_failover(owner, HANG);
    let promoted_at = Instant::now();
    let new_owner = cluster.master_of_slot(cluster.keyslot(name));
    assert_ne!(new_owner, owner, "a replica was promoted");
    // The first delivery after the promotion.
    let resumed_at = loop {
        let (id, at) = received.recv_timeout(HANG).expect("delivery resumes");
        *got.entry(id).or_default() += 1;
        if at > promoted_at {
            break at;
        }
    };
    eprintln!(
        "failover: master killed; promoted after {:?}; first delivery {:?} after the kill \
         (node timeout {NODE_TIMEOUT_MS} ms + guard 1 s)",
        promoted_at - killed_at,
        resumed_at - killed_at
    );
    // The old master comes back as the new master's replica, so offers
    // can be confirmed by a replica again; keep producing for a while,
    // then stop and drain.
    cluster.restart(owner);
    for _ in 0..200 {
        let (id, _) = received.recv_timeout(HANG).unwrap();
        *got.entry(id).or_default() += 1;
    }
    stop.store(true, Ordering::SeqCst);
    let (acked, failed) = within(HANG, move || producer.join().unwrap());
    let missing =
        |got: &HashMap<MessageId, u32>| acked.iter().filter(|id| !got.contains_key(*id)).count();
    let give_up = Instant::now() + Duration::from_secs(60);
    while missing(&got) > 0 && Instant::now() < give_up {
        if let Ok((id, _)) = received.recv_timeout(Duration::from_millis(500)) {
            *got.entry(id).or_default() += 1;
        }
    }
    consumer_stop.store(true, Ordering::SeqCst);
    within(HANG, move || consumer.join().unwrap());
    let duplicates = got.values().filter(|&&n| n > 1).count();
    eprintln!(
        "failover: {} offers acknowledged by master and replica, {failed} not (refused or unconfirmed \
         while the master was down or had no replica), \
         {} delivered, {duplicates} delivered twice (at-most-once takes across a failover)",
        acked.len(),
        got.len()
    );
    assert_eq!(missing(&got), 0, "an acknowledged offer was lost");
    rw.shutdown(Duration::from_secs(10)).unwrap();
}

#[test]
fn a_queue_slot_migrated_while_offering_and_taking_loses_and_duplicates_nothing() {
    let cluster = RedisCluster::start();
    let rw = cluster.connect();
    let name = "migrate";
    let slot = cluster.keyslot(name);
    let from = cluster.master_of_slot(slot);
    let to = *cluster.master_ports().iter().find(|&&p| p != from).unwrap();
    let q = rw.queue::<String>(name).unwrap();
    // Some messages wait far in the future (moved with the slot), some are
    // removed during the move, the rest flow through.
    let far: Vec<MessageId> = (0..20)
        .map(|i| {
            q.offer(&format!("far{i}"), Duration::from_secs(3_600))
                .unwrap()
        })
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let producer = produce(&rw, name, QueueOptions::default(), Arc::clone(&stop));
    let consumer = {
        let q = q.clone();
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut got: HashMap<MessageId, u32> = HashMap::new();
            loop {
                match q.poll(Duration::from_millis(200)).unwrap() {
                    Some(m) => *got.entry(m.id().clone()).or_default() += 1,
                    None if stop.load(Ordering::SeqCst) => return got,
                    None => {}
                }
            }
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    // Remove half of the far ones and count the queue while the slot moves
    // (each call waits out the `TRYAGAIN` of a half-moved slot).
    let remover = {
        let q = q.clone();
        let far = far.clone();
        std::thread::spawn(move || {
            for id in &far[..10] {
                assert!(q.remove(id).unwrap(), "{id}");
                assert!(q.len().unwrap() >= 10);
            }
        })
    };
    cluster.migrate_slot(slot, from, to, 1, || {
        std::thread::sleep(Duration::from_millis(100));
    });
    within(HANG, move || remover.join().unwrap());
    let removed = 10;
    assert_eq!(cluster.master_of_slot(slot), to, "the slot moved");
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::SeqCst);
    let (acked, failed) = within(HANG, move || producer.join().unwrap());
    let got = within(HANG, move || consumer.join().unwrap());
    assert_eq!(failed, 0, "offers waited out the migration");
    let twice = got.values().filter(|&&n| n > 1).count();
    assert_eq!(twice, 0, "nothing delivered twice");
    let delivered: HashSet<&MessageId> = got.keys().collect();
    let acked_ref: HashSet<&MessageId> = acked.iter().collect();
    assert_eq!(
        delivered, acked_ref,
        "every offer delivered once, nothing else"
    );
    assert_eq!(
        q.len().unwrap(),
        20 - removed as u64,
        "the far ones that were not removed"
    );
    for (i, id) in far.iter().enumerate() {
        assert_eq!(q.remove(id).unwrap(), i >= removed, "{id}");
    }
    assert_eq!(q.len().unwrap(), 0);
    rw.shutdown(Duration::from_secs(10)).unwrap();
}

#[test]
fn wait_replicas_on_a_server_without_replicas_is_a_typed_error_after_the_write() {
    let server = support::RedisServer::start();
    let rw = server.connect();
    let q = rw
        .queue_with::<String>(
            "no-replicas",
            QueueOptions::default().wait_replicas(1, Duration::from_millis(50)),
        )
        .unwrap();
    let err = q
        .offer(&"x".to_string(), Duration::from_secs(60))
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotReplicated, "{err}");
    assert!(err.is_transient());
    assert!(
        err.to_string().contains("only 0 of the 1 replicas"),
        "{err}"
    );
    assert_eq!(q.len().unwrap(), 1, "it is written on the master");
    // A timeout that does not fit in the command timeout is refused.
    let err = rw
        .queue_with::<String>(
            "no-room",
            QueueOptions::default().wait_replicas(1, Duration::from_secs(5)),
        )
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidOption);
}

/// Waits (polling the node, with a hang guard) until this process's
/// subscriber listens to `channel` on the node at `port`.
fn wait_subscribed(cluster: &RedisCluster, port: u16, channel: &str) {
    let give_up = Instant::now() + HANG;
    while !cluster
        .node(port)
        .cmd(&["PUBSUB", "SHARDNUMSUB", channel])
        .ends_with(":1\r\n")
    {
        assert!(Instant::now() < give_up, "never subscribed on {port}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn wake_ups_follow_a_queue_to_its_new_master_after_a_move_and_a_failover() {
    let mut cluster = RedisCluster::start();
    let rw = cluster.connect();
    let name = "follow";
    let channel = format!("redwheel:{{{name}}}:wake");
    let slot = cluster.keyslot(name);
    // No guard sweep during the test: only wake-ups and the runs after a
    // topology change deliver.
    let q = rw
        .queue_with::<String>(
            name,
            QueueOptions::default().guard_interval(Duration::from_secs(86_400)),
        )
        .unwrap();
    let from = cluster.master_of_slot(slot);
    wait_subscribed(&cluster, from, &channel);
    let deliver = |q: &redwheel::Queue<String>, what: &str| {
        q.offer(&what.to_string(), Duration::from_millis(30))
            .unwrap();
        let q = q.clone();
        let m = within(HANG, move || q.take().unwrap());
        assert_eq!(m.payload(), what);
    };
    deliver(&q, "before");

    // The slot moves: Redis drops the subscription on the old master, and
    // the subscriber takes it up on the new one.
    let to = *cluster.master_ports().iter().find(|&&p| p != from).unwrap();
    cluster.migrate_slot(slot, from, to, 10, || {});
    wait_subscribed(&cluster, to, &channel);
    deliver(&q, "after the move");

    // Its new master dies; the replica takes over, and the subscription
    // follows. The replica first has every write so far (the take of
    // "after the move" included): a take the replica missed comes back
    // after the failover, as the README says, which is not what this test
    // is about (under load it did).
    let acked = cluster.node(to).cmd(&["WAIT", "1", "10000"]);
    assert_eq!(acked.trim(), ":1", "the replica of {to} never caught up");
    cluster.kill(to);
    cluster.wait_failover(to, HANG);
    let promoted = cluster.master_of_slot(slot);
    wait_subscribed(&cluster, promoted, &channel);
    deliver(&q, "after the failover");
    cluster.restart(to);
    rw.shutdown(Duration::from_secs(10)).unwrap();
}
