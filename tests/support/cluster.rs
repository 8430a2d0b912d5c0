//! Test support: a real local Redis Cluster of the machine's `redis-server`.
//!
//! Six nodes (three masters, three replicas) on loopback, client and bus
//! ports from the OS, private directories, `cluster-node-timeout` 1 s, made
//! into a cluster with `redis-cli --cluster create … --cluster-replicas 1
//! --cluster-yes`; ready once every node reports `cluster_state:ok` and
//! agrees on who serves every slot. Dropped, it kills every node.
#![allow(dead_code)]

use std::process::Command;
use std::time::{Duration, Instant};

use super::RedisServer;

/// Cluster node timeout, in ms: how long a master may be unreachable
/// before its replica takes over.
pub const NODE_TIMEOUT_MS: u64 = 1_000;

/// A running local cluster.
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

/// One node as `CLUSTER NODES` describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    /// The node id.
    pub id: String,
    /// Its client port.
    pub port: u16,
    /// True for a master.
    pub master: bool,
    /// True if the cluster marked it failed.
    pub failed: bool,
    /// For a replica, its master's id.
    pub master_id: Option<String>,
    /// Slot ranges it serves (masters).
    pub slots: Vec<(u16, u16)>,
}

impl RedisCluster {
    /// Starts six nodes and makes them a cluster.
    pub fn start() -> RedisCluster {
        RedisCluster::start_with(&[])
    }

    /// As [`start`](RedisCluster::start), with more `redis-server`
    /// arguments for every node.
    pub fn start_with(extra: &[&str]) -> RedisCluster {
        RedisCluster::build(NODE_TIMEOUT_MS, extra)
    }

    /// As [`start`](RedisCluster::start), with a cluster node timeout of
    /// `node_timeout_ms`: a long one keeps a stopped master a master (no
    /// failover) for that long.
    pub fn start_with_node_timeout(node_timeout_ms: u64) -> RedisCluster {
        RedisCluster::build(node_timeout_ms, &[])
    }

    fn build(node_timeout_ms: u64, extra: &[&str]) -> RedisCluster {
        let mut nodes = Vec::new();
        for _ in 0..6 {
            let timeout = node_timeout_ms.to_string();
            let mut args = vec![
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "{dir}/nodes.conf",
                "--cluster-node-timeout",
                &timeout,
                "--cluster-port",
                "{port2}",
                // A replica may take over however long it was cut off.
                "--cluster-replica-validity-factor",
                "0",
            ];
            args.extend_from_slice(extra);
            nodes.push(RedisServer::with_args(&args));
        }
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        let out = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .output()
            .expect("run redis-cli (is redis-tools installed?)");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let cluster = RedisCluster { nodes };
        cluster.wait_healthy(Duration::from_secs(60));
        cluster.wait_replicas_in_sync(Duration::from_secs(60));
        cluster
    }

    /// Waits until every master has a replica whose link is up.
    pub fn wait_replicas_in_sync(&self, limit: Duration) {
        let give_up = Instant::now() + limit;
        for port in self.master_ports() {
            loop {
                let info = self.node(port).cmd(&["INFO", "replication"]);
                if info.contains("connected_slaves:1") && info.contains("state=online") {
                    break;
                }
                assert!(
                    Instant::now() < give_up,
                    "no replica of {port} in sync: {info}"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    /// Seed URLs: every node.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// A `Redwheel` connected to the cluster through every node, with
    /// default options.
    pub fn connect(&self) -> redwheel::Redwheel {
        let urls = self.urls();
        let seeds: Vec<&str> = urls.iter().map(String::as_str).collect();
        redwheel::Redwheel::connect_cluster(&seeds).unwrap()
    }

    /// Seed URLs for the ACL user `user` with password `password`.
    pub fn urls_as(&self, user: &str, password: &str) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| format!("redis://{user}:{password}@127.0.0.1:{}/", n.port()))
            .collect()
    }

    /// Runs `ACL SETUSER name` with `rules` on every live node (ACLs are
    /// each node's own).
    pub fn acl_setuser(&self, name: &str, rules: &[&str]) {
        for n in self.nodes.iter().filter(|n| n.is_running()) {
            let mut args = vec!["ACL", "SETUSER", name];
            args.extend_from_slice(rules);
            let reply = n.cmd(&args);
            assert_eq!(reply.trim(), "+OK", "ACL SETUSER {rules:?}: {reply}");
        }
    }

    /// The port of the replica of the master on `master`.
    pub fn replica_of(&self, master: u16) -> u16 {
        let nodes = self.nodes();
        let id = &nodes
            .iter()
            .find(|n| n.port == master)
            .expect("a known master")
            .id;
        nodes
            .iter()
            .find(|n| n.master_id.as_ref() == Some(id) && !n.failed)
            .unwrap_or_else(|| panic!("no replica of {master}: {nodes:?}"))
            .port
    }

    /// The node listening on `port`.
    pub fn node(&self, port: u16) -> &RedisServer {
        self.nodes
            .iter()
            .find(|n| n.port() == port)
            .unwrap_or_else(|| panic!("no node on port {port}"))
    }

    fn node_mut(&mut self, port: u16) -> &mut RedisServer {
        self.nodes
            .iter_mut()
            .find(|n| n.port() == port)
            .unwrap_or_else(|| panic!("no node on port {port}"))
    }

    /// `CLUSTER NODES` as one live node sees it.
    pub fn nodes(&self) -> Vec<NodeInfo> {
        for n in &self.nodes {
            if let Some(text) = try_cmd(n, &["CLUSTER", "NODES"]) {
                return parse_nodes(&text);
            }
        }
        panic!("no node answers CLUSTER NODES");
    }

    /// The ports of the live masters that serve slots.
    pub fn master_ports(&self) -> Vec<u16> {
        let mut ports: Vec<u16> = self
            .nodes()
            .into_iter()
            .filter(|n| n.master && !n.failed && !n.slots.is_empty())
            .map(|n| n.port)
            .collect();
        ports.sort_unstable();
        ports
    }

    /// The port of the master serving `slot`.
    pub fn master_of_slot(&self, slot: u16) -> u16 {
        self.nodes()
            .into_iter()
            .find(|n| n.master && !n.failed && n.slots.iter().any(|&(a, b)| a <= slot && slot <= b))
            .unwrap_or_else(|| panic!("no master serves slot {slot}"))
            .port
    }

    /// The slot of `key`, asked of the cluster (`CLUSTER KEYSLOT`).
    pub fn keyslot(&self, key: &str) -> u16 {
        for n in &self.nodes {
            if let Some(reply) = try_cmd(n, &["CLUSTER", "KEYSLOT", key]) {
                return reply
                    .trim()
                    .trim_start_matches(':')
                    .parse()
                    .expect("an integer slot");
            }
        }
        panic!("no node answers CLUSTER KEYSLOT");
    }

    /// Kills the node on `port` with SIGKILL.
    pub fn kill(&mut self, port: u16) {
        self.node_mut(port).kill();
    }

    /// Starts the node on `port` again (it rejoins with its saved config).
    pub fn restart(&mut self, port: u16) {
        self.node_mut(port).restart();
    }

    /// Waits until `port` no longer serves any slot (its replica took over)
    /// and the cluster is healthy again.
    pub fn wait_failover(&self, port: u16, limit: Duration) {
        let give_up = Instant::now() + limit;
        loop {
            let still = self
                .nodes()
                .iter()
                .any(|n| n.port == port && n.master && !n.failed && !n.slots.is_empty());
            if !still && self.healthy() {
                return;
            }
            assert!(
                Instant::now() < give_up,
                "no failover of {port} within {limit:?}: {:?}",
                self.nodes()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until every live node reports `cluster_state:ok` and they all
    /// agree that every slot is served by a live master.
    pub fn wait_healthy(&self, limit: Duration) {
        let give_up = Instant::now() + limit;
        loop {
            if self.healthy() {
                return;
            }
            assert!(
                Instant::now() < give_up,
                "the cluster did not become healthy within {limit:?}: {:?}",
                self.nodes()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn healthy(&self) -> bool {
        let mut views = Vec::new();
        for n in self.nodes.iter().filter(|n| n.is_running()) {
            let Some(info) = try_cmd(n, &["CLUSTER", "INFO"]) else {
                return false;
            };
            if !info.contains("cluster_state:ok") {
                return false;
            }
            let Some(text) = try_cmd(n, &["CLUSTER", "NODES"]) else {
                return false;
            };
            let mut masters: Vec<(u16, Vec<(u16, u16)>)> = parse_nodes(&text)
                .into_iter()
                .filter(|m| m.master && !m.slots.is_empty())
                .map(|m| (m.port, m.slots))
                .collect();
            if parse_nodes(&text)
                .iter()
                .any(|m| m.master && m.failed && !m.slots.is_empty())
            {
                return false;
            }
            masters.sort();
            let covered: u32 = masters
                .iter()
                .flat_map(|(_, s)| s.iter())
                .map(|&(a, b)| u32::from(b - a) + 1)
                .sum();
            if covered != 16_384 {
                return false;
            }
            views.push(masters);
        }
        views.windows(2).all(|w| w[0] == w[1])
    }

    /// Marks `slot` as migrating from the master on `from` to the master
    /// on `to` (`SETSLOT … IMPORTING` on the target, `MIGRATING` on the
    /// source), moving no key; returns the target's node id.
    pub fn start_migration(&self, slot: u16, from: u16, to: u16) -> String {
        let id_of = |port: u16| {
            self.nodes()
                .into_iter()
                .find(|n| n.port == port)
                .expect("known node")
                .id
        };
        let (from_id, to_id) = (id_of(from), id_of(to));
        let slot_s = slot.to_string();
        let ok = |reply: String| assert!(reply.starts_with("+OK"), "{reply}");
        ok(self
            .node(to)
            .cmd(&["CLUSTER", "SETSLOT", &slot_s, "IMPORTING", &from_id]));
        ok(self
            .node(from)
            .cmd(&["CLUSTER", "SETSLOT", &slot_s, "MIGRATING", &to_id]));
        to_id
    }

    /// Moves `slot`, with its keys, from the master on `from` to the master
    /// on `to`: the `CLUSTER SETSLOT … IMPORTING/MIGRATING`, `MIGRATE`,
    /// `SETSLOT … NODE` sequence `redis-cli --cluster reshard` uses, in
    /// batches of `batch` keys, calling `between` after each batch (so a
    /// test can act while the slot is half moved).
    pub fn migrate_slot(
        &self,
        slot: u16,
        from: u16,
        to: u16,
        batch: usize,
        mut between: impl FnMut(),
    ) {
        let to_id = self.start_migration(slot, from, to);
        let slot_s = slot.to_string();
        let batch_s = batch.to_string();
        let to_port = to.to_string();
        loop {
            let keys = resp_strings(&self.node(from).cmd(&[
                "CLUSTER",
                "GETKEYSINSLOT",
                &slot_s,
                &batch_s,
            ]));
            if keys.is_empty() {
                break;
            }
            let mut args = vec![
                "MIGRATE",
                "127.0.0.1",
                &to_port,
                "",
                "0",
                "5000",
                "REPLACE",
                "KEYS",
            ];
            args.extend(keys.iter().map(String::as_str));
            let reply = self.node(from).cmd(&args);
            assert!(reply.starts_with("+OK"), "MIGRATE: {reply}");
            between();
        }
        for n in &self.nodes {
            if n.is_running() {
                let _ = try_cmd(n, &["CLUSTER", "SETSLOT", &slot_s, "NODE", &to_id]);
            }
        }
        self.wait_healthy(Duration::from_secs(30));
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "cluster nodes at the failure: {:?}",
                self.nodes.iter().map(|n| n.port()).collect::<Vec<_>>()
            );
        }
    }
}

/// Polls `done` every 10 ms until it holds; panics naming `what` after
/// `limit` (a hang guard for cluster tests, not a timing claim).
pub fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let give_up = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < give_up, "hang guard: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// One command, or `None` if the node is down or answers an error.
fn try_cmd(node: &RedisServer, args: &[&str]) -> Option<String> {
    if !node.is_running() {
        return None;
    }
    let reply = node.try_cmd(args)?;
    (!reply.starts_with('-')).then_some(reply)
}

/// The strings of a RESP array of bulk strings.
fn resp_strings(reply: &str) -> Vec<String> {
    let mut lines = reply.split("\r\n");
    let Some(head) = lines.next() else {
        return Vec::new();
    };
    let n: usize = head.trim_start_matches('*').parse().unwrap_or(0);
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let Some(len) = lines.next() else { break };
        if !len.starts_with('$') {
            break;
        }
        if let Some(s) = lines.next() {
            out.push(s.to_owned());
        }
    }
    out
}

/// Parses `CLUSTER NODES` (a bulk string reply, or its text).
pub fn parse_nodes(reply: &str) -> Vec<NodeInfo> {
    reply
        .lines()
        .filter(|l| l.contains("@"))
        .filter_map(|line| {
            let f: Vec<&str> = line.split(' ').collect();
            if f.len() < 8 {
                return None;
            }
            let addr = f[1].split('@').next()?;
            let port = addr.rsplit(':').next()?.parse().ok()?;
            let flags = f[2];
            let slots = f[8..]
                .iter()
                .filter(|s| !s.starts_with('['))
                .filter_map(|s| match s.split_once('-') {
                    Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                    None => s.parse().ok().map(|x| (x, x)),
                })
                .collect();
            Some(NodeInfo {
                id: f[0]
                    .trim_start_matches(|c: char| !c.is_ascii_alphanumeric())
                    .to_owned(),
                port,
                master: flags.contains("master"),
                failed: flags.contains("fail") && !flags.contains("fail?"),
                master_id: (f[3] != "-").then(|| f[3].to_owned()),
                slots,
            })
        })
        .collect()
}
