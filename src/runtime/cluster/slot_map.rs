//! The cluster's slot map: which master serves each slot, the nodes met so
//! far with their connection pools, and refreshes of the map from
//! `CLUSTER SLOTS` (each change bumps a generation that the driver and the
//! subscriber watch).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use redis::Value;

use crate::error::{Access, Error, ErrorKind};
use crate::runtime::endpoint::Endpoint;
use crate::runtime::keyslot::{SLOTS, slot};
use crate::runtime::options::RedwheelOptions;
use crate::runtime::pool::{Pool, shut_down};

/// One master: where it is and its pools.
pub(crate) struct Node {
    pub(crate) addr: String,
    pub(crate) endpoint: Arc<Endpoint>,
    pub(crate) commands: Pool,
    pub(crate) blocking: Pool,
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
    /// Serialises refreshes and remembers when the last one ended.
    refreshing: Mutex<Option<Instant>>,
    generation: AtomicU64,
    closed: AtomicBool,
}

/// Fewest ms between two refreshes asked for by errors.
const REFRESH_GAP: Duration = Duration::from_millis(20);

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
            refreshing: Mutex::new(None),
            generation: AtomicU64::new(0),
            closed: AtomicBool::new(false),
        });
        cluster.refresh()?;
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

    /// Asks the cluster for its slot map, unless another thread did so in
    /// the last few ms. Errors are logged: the caller retries anyway.
    pub(crate) fn request_refresh(&self) {
        if let Some(last) = *self.refreshing.lock()
            && last.elapsed() < REFRESH_GAP
        {
            return;
        }
        if let Err(e) = self.refresh() {
            tracing::debug!(target: "redwheel::runtime", error = %e, "cluster: could not refresh the slot map");
        }
    }

    /// Asks the masters it knows, then the seeds, for `CLUSTER SLOTS`, and
    /// installs the first answer. True if the map changed.
    pub(crate) fn refresh(&self) -> Result<bool, Error> {
        let mut last = self.refreshing.lock();
        let mut candidates: Vec<String> = self
            .topology
            .read()
            .masters
            .iter()
            .map(|n| n.addr.clone())
            .collect();
        for s in &self.seeds {
            if !candidates.contains(s) {
                candidates.push(s.clone());
            }
        }
        let mut first_error = None;
        for addr in candidates {
            match self.ask_slots(&addr) {
                Ok(ranges) => {
                    let changed = self.install(ranges)?;
                    *last = Some(Instant::now());
                    return Ok(changed);
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        *last = Some(Instant::now());
        Err(first_error.unwrap_or_else(|| {
            Error::new(
                ErrorKind::Unavailable,
                "no cluster node to ask for the slot map",
            )
        }))
    }

    /// `CLUSTER SLOTS` of the node at `addr`: (first, last, master address).
    fn ask_slots(&self, addr: &str) -> Result<Vec<(u16, u16, String)>, Error> {
        let node = self.node(addr)?;
        let timeout = self.options.command_timeout.min(Duration::from_secs(2));
        let mut con = node.endpoint.open_raw(timeout, timeout)?;
        let reply: Value = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query(&mut con)
            .map_err(|e| Error::from_redis(e, Access::Read))?;
        let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
        parse_slots(&reply, host).ok_or_else(|| {
            Error::new(
                ErrorKind::Protocol,
                format!("the node at {addr} sent a CLUSTER SLOTS reply redwheel cannot read"),
            )
        })
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
    /// Closes every pool.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
        for n in self.nodes.lock().values() {
            n.commands.close();
            n.blocking.close();
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
