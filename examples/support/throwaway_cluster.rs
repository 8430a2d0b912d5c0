//! A throwaway local Redis Cluster for the examples: six private
//! `redis-server`s on free loopback ports (three masters, three replicas),
//! joined with `redis-cli --cluster create`, stopped on drop. Included with
//! `#[path = "support/throwaway_cluster.rs"] mod throwaway_cluster;`; its
//! nodes are the testkit's `ThrowawayRedis`.
#![allow(dead_code)]

use std::net::TcpListener;
use std::process::Command;
use std::time::{Duration, Instant};

use redwheel_testkit::ThrowawayRedis;

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
                    // A replica may take over however long ago it last
                    // heard from its master.
                    "--cluster-replica-validity-factor",
                    "0",
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

    /// The port of the master serving `slot`, asked of a live node.
    pub fn master_of(&self, slot: u16) -> Result<u16, Box<dyn std::error::Error>> {
        for n in &self.nodes {
            let Ok(mut con) =
                redis::Client::open(n.url().as_str()).and_then(|c| c.get_connection())
            else {
                continue;
            };
            let ranges: Vec<redis::Value> = redis::cmd("CLUSTER").arg("SLOTS").query(&mut con)?;
            for r in ranges {
                let redis::Value::Array(items) = r else {
                    continue;
                };
                let first: u16 = redis::from_redis_value(items[0].clone())?;
                let last: u16 = redis::from_redis_value(items[1].clone())?;
                if first <= slot && slot <= last {
                    let redis::Value::Array(master) = &items[2] else {
                        continue;
                    };
                    return Ok(redis::from_redis_value(master[1].clone())?);
                }
            }
        }
        Err("no live node answers CLUSTER SLOTS".into())
    }

    /// Kills (SIGKILL) the node listening on `port`.
    pub fn kill(&mut self, port: u16) {
        if let Some(n) = self.nodes.iter_mut().find(|n| n.port() == port) {
            n.kill();
        }
    }

    /// Starts the node on `port` again (it rejoins, as a replica if its
    /// replica took over) and waits until every node reports
    /// `cluster_state:ok`.
    pub fn restart(&mut self, port: u16) -> Result<(), Box<dyn std::error::Error>> {
        if let Some(n) = self.nodes.iter_mut().find(|n| n.port() == port) {
            n.restart()?;
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.ok() {
            if Instant::now() > deadline {
                return Err("the cluster did not recover".into());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// The slot of `key`, asked of a live node.
    pub fn keyslot(&self, key: &str) -> Result<u16, Box<dyn std::error::Error>> {
        for n in &self.nodes {
            if let Ok(mut con) =
                redis::Client::open(n.url().as_str()).and_then(|c| c.get_connection())
            {
                return Ok(redis::cmd("CLUSTER")
                    .arg("KEYSLOT")
                    .arg(key)
                    .query(&mut con)?);
            }
        }
        Err("no live node answers CLUSTER KEYSLOT".into())
    }
}
