//! A throwaway local Redis Cluster for the examples: six private
//! `redis-server`s on free loopback ports (three masters, three replicas),
//! joined with `redis-cli --cluster create`, stopped on drop. Included with
//! `#[path = "support/throwaway_cluster.rs"] mod throwaway_cluster;` next to
//! `throwaway_redis`.
#![allow(dead_code)]

use std::net::TcpListener;
use std::process::Command;
use std::time::{Duration, Instant};

use super::throwaway_redis::ThrowawayRedis;

/// Six nodes made into a cluster.
pub struct ThrowawayCluster {
    nodes: Vec<ThrowawayRedis>,
}

impl ThrowawayCluster {
    /// Starts the nodes and creates the cluster; returns once every node
    /// reports `cluster_state:ok`.
    pub fn start(name: &str) -> Result<ThrowawayCluster, Box<dyn std::error::Error>> {
        let mut nodes = Vec::new();
        for i in 0..6 {
            let bus = TcpListener::bind("127.0.0.1:0")?
                .local_addr()?
                .port()
                .to_string();
            nodes.push(ThrowawayRedis::start_with(
                "redis-server",
                &format!("{name}-{i}"),
                &[
                    "--appendonly",
                    "no",
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "1000",
                    "--cluster-port",
                    &bus,
                ],
            )?);
        }
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| {
                n.url()
                    .trim_start_matches("redis://")
                    .trim_end_matches('/')
                    .to_owned()
            })
            .collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .output()
            .map_err(|e| format!("could not run redis-cli (install redis-tools): {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "redis-cli --cluster create failed: {}",
                String::from_utf8_lossy(&out.stdout)
            )
            .into());
        }
        let cluster = ThrowawayCluster { nodes };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !cluster.ok() {
            if Instant::now() > deadline {
                return Err("the cluster did not become ready".into());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(cluster)
    }

    fn ok(&self) -> bool {
        self.nodes.iter().all(|n| {
            redis::Client::open(n.url().as_str())
                .and_then(|c| c.get_connection())
                .and_then(|mut con| redis::cmd("CLUSTER").arg("INFO").query::<String>(&mut con))
                .is_ok_and(|info| info.contains("cluster_state:ok"))
        })
    }

    /// Every node's URL (seeds).
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(ThrowawayRedis::url).collect()
    }
}
