//! The async API on a real local Redis Cluster (3 masters + 3 replicas,
//! tests/support/cluster.rs): queues and locks spread over every master,
//! each reached through that master's multiplexed connection; a slot moved
//! away is followed (`MOVED`, with the slot map refreshed off the
//! executor's thread), and so is an `ASK` naming only a port.

mod async_common;
mod support;

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_common::tokio_multi;
use support::cluster::RedisCluster;

/// Queue `name`'s slot, the master serving it, and another master.
fn slot_and_two_masters(cluster: &RedisCluster, name: &str) -> (u16, u16, u16) {
    let slot = cluster.keyslot(&format!("redwheel:{{{name}}}:delayed"));
    let from = cluster.master_of_slot(slot);
    let to = *cluster
        .master_ports()
        .iter()
        .find(|&&p| p != from)
        .expect("another master");
    (slot, from, to)
}

#[test]
fn queues_and_locks_on_every_master_work_through_the_futures() {
    let cluster = RedisCluster::start();
    let rw = cluster.connect();
    let names: Vec<String> = (0..12).map(|i| format!("async-spread-{i}")).collect();
    let masters: HashSet<u16> = names
        .iter()
        .map(|n| cluster.master_of_slot(cluster.keyslot(&format!("redwheel:{{{n}}}:delayed"))))
        .collect();
    assert_eq!(masters.len(), 3, "the queues fall on all three masters");
    let got = tokio_multi(async {
        let mut tasks = Vec::new();
        for name in &names {
            let q = rw.queue::<String>(name).unwrap();
            let lock = rw.lock(name);
            let name = name.clone();
            tasks.push(tokio::spawn(async move {
                let g = lock.lock_async().await.unwrap();
                q.offer_async(&name, Duration::from_millis(20))
                    .await
                    .unwrap();
                let m = q.take_async().await.unwrap();
                let d = {
                    q.offer_async(&format!("{name}!"), Duration::ZERO)
                        .await
                        .unwrap();
                    q.claim_async(Duration::from_secs(30))
                        .await
                        .unwrap()
                        .unwrap()
                };
                d.ack_async().await.unwrap();
                let s = q.stats_async().await.unwrap();
                assert_eq!((s.delayed, s.ready, s.in_flight), (0, 0, 0));
                g.unlock_async().await.unwrap();
                (m.into_payload(), d.payload().clone())
            }));
        }
        let mut got = Vec::new();
        for t in tasks {
            got.push(t.await.unwrap());
        }
        got
    });
    for (name, (taken, claimed)) in names.iter().zip(got) {
        assert_eq!(&taken, name);
        assert_eq!(claimed, format!("{name}!"));
    }
}

#[test]
fn a_queue_whose_slot_moves_while_tasks_offer_loses_and_duplicates_nothing() {
    let cluster = RedisCluster::start();
    let rw = cluster.connect();
    let q = rw.queue::<String>("async-moving").unwrap();
    let (slot, from, to) = slot_and_two_masters(&cluster, "async-moving");
    let stop = Arc::new(AtomicBool::new(false));
    // Four tasks offer while the slot moves (ASK while it is half moved,
    // TRYAGAIN while its keys are split, MOVED after).
    let offering = {
        let (q, stop) = (q.clone(), Arc::clone(&stop));
        std::thread::spawn(move || {
            tokio_multi(async move {
                let mut tasks = Vec::new();
                for t in 0..4 {
                    let (q, stop) = (q.clone(), Arc::clone(&stop));
                    tasks.push(tokio::spawn(async move {
                        let mut written = 0u64;
                        let mut i = 0;
                        while !stop.load(Ordering::SeqCst) || i < 20 {
                            q.offer_async(&format!("{t}/{i}"), Duration::from_secs(3600))
                                .await
                                .unwrap();
                            written += 1;
                            i += 1;
                        }
                        written
                    }));
                }
                let mut written = 0;
                for t in tasks {
                    written += t.await.unwrap();
                }
                written
            })
        })
    };
    cluster.migrate_slot(slot, from, to, 1, || {});
    stop.store(true, Ordering::SeqCst);
    let written = offering.join().unwrap();
    assert_eq!(cluster.master_of_slot(slot), to);
    let s = tokio_multi(q.stats_async()).unwrap();
    assert_eq!(s.delayed, written, "every offer landed once");
}

#[test]
fn an_ask_naming_only_a_port_is_followed_to_the_redirecting_nodes_host() {
    let cluster = RedisCluster::start();
    let rw = cluster.connect();
    let name = "async-ask-port";
    let q = rw.queue::<String>(name).unwrap();
    let (slot, from, to) = slot_and_two_masters(&cluster, name);
    let id_of = |port: u16| {
        cluster
            .nodes()
            .into_iter()
            .find(|n| n.port == port)
            .expect("known node")
            .id
    };
    let slot_s = slot.to_string();
    // The slot half moved: the queue's keys (none yet) are asked for on
    // `to`; `from` names it by its port alone, as a node that does not
    // know its own host does.
    let ok = |reply: String| assert!(reply.starts_with("+OK"), "{reply}");
    ok(cluster
        .node(to)
        .cmd(&["CLUSTER", "SETSLOT", &slot_s, "IMPORTING", &id_of(from)]));
    ok(cluster
        .node(from)
        .cmd(&["CLUSTER", "SETSLOT", &slot_s, "MIGRATING", &id_of(to)]));
    ok(cluster.node(from).cmd(&[
        "CONFIG",
        "SET",
        "cluster-preferred-endpoint-type",
        "unknown-endpoint",
    ]));
    let asked = cluster
        .node(from)
        .cmd(&["ZCARD", &format!("redwheel:{{{name}}}:delayed")]);
    assert!(
        asked.starts_with(&format!("-ASK {slot} :{to}")),
        "the redirect names a port only: {asked}"
    );
    // The queue's keys are on `to` already (a multi-key script is asked
    // there only when all of them are: else `TRYAGAIN`), written there
    // after `ASKING` on one connection.
    let mut con = redis::Client::open(format!("redis://127.0.0.1:{to}"))
        .unwrap()
        .get_connection()
        .unwrap();
    let k = |suffix: &str| format!("redwheel:{{{name}}}:{suffix}");
    let mut pipe = redis::pipe();
    for (cmd, suffix, args) in [
        ("ZADD", "delayed", &["99999999999999", "m"][..]),
        ("RPUSH", "ready", &["r"][..]),
        ("ZADD", "inflight", &["99999999999999", "f"][..]),
        ("ZADD", "dead", &["1", "d"][..]),
        ("HSET", "msg", &["m", "99999999999999:x"][..]),
        ("ZADD", "prioritized", &["1", "p"][..]),
        ("HSET", "counts", &["expired", "0"][..]),
    ] {
        pipe.cmd("ASKING").ignore();
        pipe.cmd(cmd).arg(k(suffix)).arg(args).ignore();
    }
    let () = pipe.query(&mut con).unwrap();
    let stats = tokio_multi(q.stats_async());
    let stats = stats.expect("the stats, read on the node asked");
    assert_eq!(stats.delayed, 1, "read on {to}: {stats:?}");
}
