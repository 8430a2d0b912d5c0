//! Queues on a real local Redis Cluster: 3 masters + 3 replicas of the
//! machine's `redis-server` (tests/support/cluster.rs).

mod support;

use support::cluster::RedisCluster;

#[test]
fn the_local_cluster_has_three_masters_covering_every_slot() {
    let cluster = RedisCluster::start();
    let masters = cluster.master_ports();
    assert_eq!(masters.len(), 3, "{:?}", cluster.nodes());
    assert_eq!(cluster.nodes().len(), 6);
    assert_eq!(
        cluster.keyslot("redwheel:{orders}:delayed"),
        cluster.keyslot("orders")
    );
}
