//! The cluster's slot map: which master serves each slot, the nodes met so
//! far with their connection pools and whether each answers, and
//! refreshes of the map from `CLUSTER SLOTS` (each change bumps a
//! generation that the driver and the subscriber watch).
//!
//! # Ground rules
//!
//! * Refreshes run on one background thread (`redwheel-cluster`), one at a
//!   time: [`Cluster::request_refresh`] only asks for one and returns, so
//!   no caller waits for the network I/O of a refresh, and a request made
//!   while one runs is served by another right after it (never dropped).
//! * No lock is held across network I/O: a refresh asks a node with no
//!   lock held, then takes the topology's write lock just to install the
//!   answer. A `MOVED` reply updates one slot's owner at once
//!   ([`Cluster::moved`]), under the same write lock, briefly.
//! * A node that did not answer (a connection refused or timed out, a
//!   round that got nothing back) is marked down. Refreshes ask the nodes
//!   that answer first and the ones marked down last; the driver's rounds
//!   leave a master marked down out (its commands fail at once) until the
//!   background thread's probe (`PING`) finds it answering again.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, RwLock};
use redis::Value;

use crate::error::{Access, Error, ErrorKind};
use crate::runtime::backoff::Backoff;
use crate::runtime::endpoint::Endpoint;
use crate::runtime::keyslot::{SLOTS, slot};
use crate::runtime::options::RedwheelOptions;
use crate::runtime::pool::{Pool, shut_down};

/// How long a node may send nothing on a connection that waits for its
/// answer (capped by the command timeout) before the driver's round and
/// the probe take it as not answering: a stopped or hung master holds a
/// round up for at most this long, once, and is then left out until it
/// answers a probe.
pub(crate) const UNRESPONSIVE: Duration = Duration::from_secs(1);

/// One node (a master, or a seed): where it is, its pools, and whether it
/// answers.
pub(crate) struct Node {
    pub(crate) addr: String,
    pub(crate) endpoint: Arc<Endpoint>,
    pub(crate) commands: Pool,
    pub(crate) blocking: Pool,
    /// It did not answer last time, and no probe has found it answering
    /// since.
    down: AtomicBool,
}

impl Node {
    /// True while the node is marked down.
    pub(crate) fn is_down(&self) -> bool {
        self.down.load(Ordering::Acquire)
    }

    /// The node did not answer (`why`): marked down until it does.
    pub(crate) fn mark_down(&self, why: &Error) {
        if !self.down.swap(true, Ordering::AcqRel) {
            tracing::warn!(
                target: "redwheel::runtime",
                node = %self.addr,
                error = %why,
                "cluster: a node does not answer; its share of each round fails at once until it answers again"
            );
        }
    }

    /// The node answered.
    pub(crate) fn mark_up(&self) {
        if self.down.load(Ordering::Acquire) && self.down.swap(false, Ordering::AcqRel) {
            tracing::info!(target: "redwheel::runtime", node = %self.addr, "cluster: a node answers again");
        }
    }
}

/// Who serves each slot.
struct Topology {
    /// Index into `masters` per slot; `NONE` when no master serves it.
    slots: Vec<u16>,
    masters: Vec<Arc<Node>>,
}

const NONE: u16 = u16::MAX;

/// The cluster as this process sees it.
pub(crate) struct Cluster {
    /// The first seed URL: credentials, TLS and database for every node.
    template: String,
    /// `host:port` of every seed.
    seeds: Vec<String>,
    pub(super) options: RedwheelOptions,
    topology: RwLock<Arc<Topology>>,
    nodes: Mutex<HashMap<String, Arc<Node>>>,
    /// Talks to the background thread.
    refresher: Arc<Refresher>,
    generation: AtomicU64,
    closed: AtomicBool,
}

/// Fewest time between the starts of two refreshes: a burst of requests
/// (every caller of a moved slot at once) makes one or two refreshes, not
/// one each. A request is never dropped, only served after the gap.
const REFRESH_GAP: Duration = Duration::from_millis(20);

/// How often the background thread looks whether its `Cluster` is gone
/// when nothing is asked of it.
const IDLE_CHECK: Duration = Duration::from_secs(1);

/// What the background thread is asked to do.
#[derive(Default)]
struct Refresher {
    state: Mutex<RefreshState>,
    wake: Condvar,
}

#[derive(Default)]
struct RefreshState {
    /// A refresh was asked for since the last one started.
    requested: bool,
    closed: bool,
}

impl Cluster {
    /// Checks the seed URLs and learns the slot map from the first seed
    /// that answers.
    pub(crate) fn connect(urls: &[&str], options: &RedwheelOptions) -> Result<Arc<Cluster>, Error> {
        let Some(first) = urls.first() else {
            return Err(Error::new(
                ErrorKind::InvalidUrl,
                "a cluster needs at least one seed URL",
            ));
        };
        let mut seeds = Vec::new();
        for url in urls {
            let endpoint = Endpoint::new(url, options)?;
            seeds.push(endpoint.host_port().to_owned());
        }
        let cluster = Arc::new(Cluster {
            template: (*first).to_owned(),
            seeds,
            options: options.clone(),
            topology: RwLock::new(Arc::new(Topology {
                slots: vec![NONE; SLOTS],
                masters: Vec::new(),
            })),
            nodes: Mutex::new(HashMap::new()),
            refresher: Arc::new(Refresher::default()),
            generation: AtomicU64::new(0),
            closed: AtomicBool::new(false),
        });
        cluster.refresh()?;
        let refresher = Arc::clone(&cluster.refresher);
        let weak = Arc::downgrade(&cluster);
        std::thread::Builder::new()
            .name("redwheel-cluster".to_owned())
            .spawn(move || maintain(&refresher, &weak))
            .map_err(|e| {
                Error::new(
                    ErrorKind::Spawn,
                    "could not start the cluster's refresh thread",
                )
                .with_cause(e)
            })?;
        Ok(cluster)
    }

    /// How many times the slot map changed.
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The masters serving slots now.
    pub(crate) fn masters(&self) -> Vec<Arc<Node>> {
        self.topology.read().masters.clone()
    }

    /// The master serving `route`'s slot.
    pub(crate) fn node_for(&self, route: &[u8]) -> Result<Arc<Node>, Error> {
        self.node_for_slot(slot(route))
    }

    /// The master serving slot `s`.
    pub(crate) fn node_for_slot(&self, s: u16) -> Result<Arc<Node>, Error> {
        if let Some(node) = self.owner(s) {
            return Ok(node);
        }
        self.request_refresh();
        self.owner(s).ok_or_else(|| {
            Error::new(
                ErrorKind::Unavailable,
                format!("no master of the cluster serves slot {s} right now"),
            )
        })
    }

    fn owner(&self, slot: u16) -> Option<Arc<Node>> {
        let topo = self.topology.read();
        let i = topo.slots[usize::from(slot)];
        (i != NONE).then(|| Arc::clone(&topo.masters[usize::from(i)]))
    }

    /// The address of the master serving `route`'s slot, if known.
    pub(crate) fn owner_addr(&self, route: &[u8]) -> Option<String> {
        self.owner(slot(route)).map(|n| n.addr.clone())
    }

    /// The node at `addr` (`host:port`), with its pools.
    pub(crate) fn node(&self, addr: &str) -> Result<Arc<Node>, Error> {
        if self.closed.load(Ordering::Acquire) {
            return Err(shut_down());
        }
        let mut nodes = self.nodes.lock();
        if let Some(n) = nodes.get(addr) {
            return Ok(Arc::clone(n));
        }
        let endpoint = Arc::new(Endpoint::new(
            &node_url(&self.template, addr),
            &self.options,
        )?);
        let node = Arc::new(Node {
            down: AtomicBool::new(false),
            addr: addr.to_owned(),
            commands: Pool::new(
                Arc::clone(&endpoint),
                self.options.command_timeout,
                self.options.max_idle_connections,
            ),
            blocking: Pool::new(
                Arc::clone(&endpoint),
                self.options.max_block + self.options.command_timeout,
                self.options.max_idle_connections,
            ),
            endpoint,
        });
        nodes.insert(addr.to_owned(), Arc::clone(&node));
        Ok(node)
    }

    /// Asks the background thread for a fresh slot map, and returns at
    /// once.
    pub(crate) fn request_refresh(&self) {
        let mut st = self.refresher.state.lock();
        if !st.requested {
            st.requested = true;
            self.refresher.wake.notify_one();
        }
    }

    /// The slot `slot` is served by the master at `addr` (a `MOVED` reply
    /// said so): routes it there from now on, and asks for a fresh map in
    /// the background (more slots may have moved with it).
    pub(crate) fn moved(&self, slot: u16, addr: &str) {
        let Ok(node) = self.node(addr) else {
            return;
        };
        let mut topo = self.topology.write();
        let s = usize::from(slot);
        let current = topo.slots.get(s).copied().unwrap_or(NONE);
        if current != NONE && topo.masters[usize::from(current)].addr == addr {
            return;
        }
        let mut masters = topo.masters.clone();
        let i = match masters.iter().position(|m| m.addr == addr) {
            Some(i) => i,
            None => {
                masters.push(node);
                masters.len() - 1
            }
        };
        let mut slots = topo.slots.clone();
        slots[s] = i as u16;
        *topo = Arc::new(Topology { slots, masters });
        drop(topo);
        self.generation.fetch_add(1, Ordering::AcqRel);
        tracing::debug!(target: "redwheel::runtime", slot, node = addr, "cluster: a slot moved");
        self.request_refresh();
    }

    /// Asks the nodes that answer (masters first, then the seeds), then
    /// those marked down, for `CLUSTER SLOTS`, and installs the first
    /// answer. True if the map changed. Runs on the background thread (and
    /// once in `connect`), with no lock held while it waits for a node.
    fn refresh(&self) -> Result<bool, Error> {
        let masters = self.masters();
        let mut candidates: Vec<String> = masters.iter().map(|n| n.addr.clone()).collect();
        for s in &self.seeds {
            if !candidates.contains(s) {
                candidates.push(s.clone());
            }
        }
        {
            let nodes = self.nodes.lock();
            // Stable: each group keeps the map's order.
            candidates.sort_by_key(|a| nodes.get(a).is_some_and(|n| n.is_down()));
        }
        let mut first_error = None;
        for addr in candidates {
            match self.ask_slots(&addr) {
                Ok(ranges) => return self.install(ranges),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        Err(first_error.unwrap_or_else(|| {
            Error::new(
                ErrorKind::Unavailable,
                "no cluster node to ask for the slot map",
            )
        }))
    }

    /// `CLUSTER SLOTS` of the node at `addr`: (first, last, master
    /// address). A node that does not answer is marked down.
    fn ask_slots(&self, addr: &str) -> Result<Vec<(u16, u16, String)>, Error> {
        let node = self.node(addr)?;
        let asked = node
            .endpoint
            .open_raw(self.options.connect_timeout, self.options.command_timeout)
            .and_then(|mut con| {
                redis::cmd("CLUSTER")
                    .arg("SLOTS")
                    .query::<Value>(&mut con)
                    .map_err(|e| Error::from_redis(e, Access::Read))
            });
        let reply = match asked {
            Ok(reply) => {
                node.mark_up();
                reply
            }
            Err(e) => {
                if e.is_transient() {
                    node.mark_down(&e);
                }
                return Err(e);
            }
        };
        let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
        parse_slots(&reply, host).ok_or_else(|| {
            Error::new(
                ErrorKind::Protocol,
                format!("the node at {addr} sent a CLUSTER SLOTS reply redwheel cannot read"),
            )
        })
    }

    /// `PING`s every master marked down, marking those that answer up.
    fn probe_down_masters(&self) {
        for node in self.masters() {
            if !node.is_down() || self.closed.load(Ordering::Acquire) {
                continue;
            }
            let wait = self.options.command_timeout.min(UNRESPONSIVE);
            let answered = node
                .endpoint
                .open_raw(self.options.connect_timeout, wait)
                .and_then(|mut con| {
                    redis::cmd("PING")
                        .query::<()>(&mut con)
                        .map_err(|e| Error::from_redis(e, Access::Read))
                });
            if answered.is_ok() {
                node.mark_up();
            }
        }
    }

    /// True if a master is marked down.
    fn any_master_down(&self) -> bool {
        self.topology.read().masters.iter().any(|n| n.is_down())
    }

    fn install(&self, ranges: Vec<(u16, u16, String)>) -> Result<bool, Error> {
        let mut slots = vec![NONE; SLOTS];
        let mut masters: Vec<Arc<Node>> = Vec::new();
        for (first, last, addr) in ranges {
            let i = match masters.iter().position(|m| m.addr == addr) {
                Some(i) => i,
                None => {
                    masters.push(self.node(&addr)?);
                    masters.len() - 1
                }
            };
            for s in first..=last.min(SLOTS as u16 - 1) {
                slots[usize::from(s)] = i as u16;
            }
        }
        let mut topo = self.topology.write();
        let same = topo.masters.len() == masters.len()
            && topo.slots.iter().zip(&slots).all(|(a, b)| match (*a, *b) {
                (NONE, NONE) => true,
                (NONE, _) | (_, NONE) => false,
                (a, b) => topo.masters[usize::from(a)].addr == masters[usize::from(b)].addr,
            });
        if same {
            return Ok(false);
        }
        let served = slots.iter().filter(|&&i| i != NONE).count();
        tracing::info!(
            target: "redwheel::runtime",
            masters = masters.len(),
            slots_served = served,
            "cluster slot map changed"
        );
        *topo = Arc::new(Topology { slots, masters });
        self.generation.fetch_add(1, Ordering::AcqRel);
        Ok(true)
    }
    /// Closes every pool and ends the background thread.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
        {
            let mut st = self.refresher.state.lock();
            st.closed = true;
            self.refresher.wake.notify_all();
        }
        for n in self.nodes.lock().values() {
            n.commands.close();
            n.blocking.close();
        }
    }
}

/// The background thread: refreshes the slot map when asked (one at a
/// time, at most one per [`REFRESH_GAP`]) and probes the masters marked
/// down on the reconnect backoff. Ends when the cluster is closed or gone.
fn maintain(refresher: &Refresher, cluster: &Weak<Cluster>) {
    let mut last_refresh: Option<Instant> = None;
    let mut probe = None::<Backoff>;
    loop {
        let requested = {
            let mut st = refresher.state.lock();
            let gap = last_refresh.map_or(Duration::ZERO, |at| {
                REFRESH_GAP.saturating_sub(at.elapsed())
            });
            let wait = match (&mut probe, st.requested) {
                (_, true) => gap,
                (Some(b), false) => b.step(),
                (None, false) => IDLE_CHECK,
            };
            if !st.closed && !wait.is_zero() {
                refresher.wake.wait_for(&mut st, wait);
            }
            if st.closed {
                return;
            }
            let gap_over = last_refresh.is_none_or(|at| at.elapsed() >= REFRESH_GAP);
            gap_over && std::mem::take(&mut st.requested)
        };
        let Some(c) = cluster.upgrade() else {
            return;
        };
        if requested {
            last_refresh = Some(Instant::now());
            if let Err(e) = c.refresh() {
                tracing::debug!(target: "redwheel::runtime", error = %e, "cluster: could not refresh the slot map");
            }
        }
        if c.any_master_down() {
            c.probe_down_masters();
            let b = probe.get_or_insert_with(|| {
                Backoff::new(c.options.reconnect_min, c.options.reconnect_max)
            });
            if !c.any_master_down() {
                b.reset();
                probe = None;
            }
        } else {
            probe = None;
        }
    }
}

/// `template` (a URL) pointing at `addr` (`host:port`) instead: same
/// scheme, credentials, database and parameters.
pub(crate) fn node_url(template: &str, addr: &str) -> String {
    let (scheme, rest) = template.split_once("://").unwrap_or(("redis", template));
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let userinfo = authority.rfind('@').map(|i| &authority[..=i]).unwrap_or("");
    let (host, port) = addr.rsplit_once(':').unwrap_or((addr, "6379"));
    let host = if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]")
    } else {
        host.to_owned()
    };
    format!("{scheme}://{userinfo}{host}:{port}{tail}")
}

/// Reads `CLUSTER SLOTS`: `[[first, last, [host, port, id…], replicas…]…]`.
/// A master with no host (`""` or `"?"`) is on `asked_host`.
fn parse_slots(reply: &Value, asked_host: &str) -> Option<Vec<(u16, u16, String)>> {
    let Value::Array(ranges) = reply else {
        return None;
    };
    let mut out = Vec::with_capacity(ranges.len());
    for range in ranges {
        let Value::Array(items) = range else {
            return None;
        };
        let first = as_int(items.first()?)?;
        let last = as_int(items.get(1)?)?;
        let Value::Array(master) = items.get(2)? else {
            return None;
        };
        let host = match master.first()? {
            Value::BulkString(b) => String::from_utf8(b.clone()).ok()?,
            Value::SimpleString(s) => s.clone(),
            _ => return None,
        };
        let host = if host.is_empty() || host == "?" {
            asked_host.to_owned()
        } else {
            host
        };
        let port = as_int(master.get(1)?)?;
        out.push((
            u16::try_from(first).ok()?,
            u16::try_from(last).ok()?,
            format!("{host}:{port}"),
        ));
    }
    Some(out)
}

fn as_int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_urls_keep_credentials_database_and_scheme() {
        assert_eq!(
            node_url("redis://app:pw@10.0.0.1:7000/0", "10.0.0.2:7001"),
            "redis://app:pw@10.0.0.2:7001/0"
        );
        assert_eq!(
            node_url("rediss://10.0.0.1:7000", "10.0.0.3:7002"),
            "rediss://10.0.0.3:7002"
        );
        assert_eq!(node_url("redis://h:1", "::1:7000"), "redis://[::1]:7000");
    }

    #[test]
    fn cluster_slots_replies_are_read_with_a_missing_host_meaning_the_asked_node() {
        let reply = Value::Array(vec![
            Value::Array(vec![
                Value::Int(0),
                Value::Int(5460),
                Value::Array(vec![
                    Value::BulkString(b"127.0.0.1".to_vec()),
                    Value::Int(7000),
                    Value::BulkString(b"id0".to_vec()),
                ]),
            ]),
            Value::Array(vec![
                Value::Int(5461),
                Value::Int(16383),
                Value::Array(vec![Value::BulkString(Vec::new()), Value::Int(7001)]),
            ]),
        ]);
        assert_eq!(
            parse_slots(&reply, "10.1.1.1"),
            Some(vec![
                (0, 5460, "127.0.0.1:7000".to_owned()),
                (5461, 16383, "10.1.1.1:7001".to_owned()),
            ])
        );
        assert_eq!(parse_slots(&Value::Int(3), "h"), None);
    }
}
