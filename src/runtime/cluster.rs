//! Redis Cluster: the slot map, a pool per master, routing by a key's slot
//! (following `MOVED` and `ASK`, waiting out `TRYAGAIN` and a failover),
//! and the driver's transport, which sends each round as one pipeline per
//! master.
//!
//! Everything redwheel stores for one queue (or lock) shares a `{hash tag}`,
//! so every script touches one slot. This module sends each command to the
//! master serving the slot of its routing key, as the slot map says. The
//! map comes from `CLUSTER SLOTS`, asked of any node that answers, and is
//! asked again whenever a node says `MOVED`, a master cannot be reached, or
//! a subscription is moved away; every change bumps a generation that the
//! driver (which then runs every job) and the subscriber (which then
//! resubscribes) watch.
//!
//! Connections are the `redis` crate's, one server each: the crate's own
//! cluster connection has no sharded pub/sub, no per-node blocking
//! connections, and builds pipelines from commands rather than the packed
//! bytes the driver keeps, so the routing lives here.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use redis::Value;

use super::RedwheelOptions;
use super::backoff::Backoff;
use super::driver::{Commands, Transport};
use super::pool::{Attempt, Conn, Endpoint, Linger, Pool, shut_down};
use super::server_clock::{ClockSample, measure};
use super::subscriber::Locator;
use crate::error::{Access, Error, ErrorKind};

/// Slots of a Redis Cluster.
pub(crate) const SLOTS: usize = 16_384;

/// The slot of `key`: CRC16 (XMODEM) of its hash tag (the part between the
/// first `{` and the next `}`, when not empty) or of the whole key, mod
/// 16,384.
pub(crate) fn slot(key: &[u8]) -> u16 {
    let tagged = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(key);
    crc16(tagged) % SLOTS as u16
}

/// CRC16/XMODEM (polynomial 0x1021, initial value 0), as Redis Cluster
/// hashes keys.
fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in data {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

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
    options: RedwheelOptions,
    topology: RwLock<Arc<Topology>>,
    nodes: Mutex<HashMap<String, Arc<Node>>>,
    /// Serialises refreshes and remembers when the last one ended.
    refreshing: Mutex<Option<Instant>>,
    generation: AtomicU64,
    closed: AtomicBool,
}

/// Fewest ms between two refreshes asked for by errors.
const REFRESH_GAP: Duration = Duration::from_millis(20);

/// Most redirects one command follows.
const MAX_REDIRECTS: usize = 16;

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

    /// Runs `f` on a connection to the master serving `route`'s slot,
    /// following `MOVED` (after learning the new map) and `ASK` (with
    /// `ASKING`), and waiting out `TRYAGAIN`, `CLUSTERDOWN` and an
    /// unreachable master (a failover) on the reconnect backoff, within
    /// `command_timeout` in all. A command that may have been applied is
    /// never retried.
    pub(crate) fn run<R>(
        &self,
        route: &[u8],
        access: Access,
        mut f: impl FnMut(&mut Conn) -> redis::RedisResult<R>,
    ) -> Result<R, Error> {
        let started = Instant::now();
        let budget = self.options.command_timeout;
        let mut backoff = Backoff::new(self.options.reconnect_min, self.options.reconnect_max);
        let mut ask: Option<String> = None;
        let mut redirects = 0;
        loop {
            let asking = ask.take();
            let node = match &asking {
                Some(addr) => self.node(addr)?,
                None => match self.node_for(route) {
                    Ok(n) => n,
                    Err(e) if e.is_transient() && wait(&mut backoff, started, budget) => {
                        self.request_refresh();
                        continue;
                    }
                    Err(e) => return Err(e),
                },
            };
            let result = if asking.is_some() {
                node.commands.try_run(|con| {
                    redis::cmd("ASKING").query::<()>(con)?;
                    f(con)
                })
            } else {
                node.commands.try_run(&mut f)
            };
            let e = match result {
                Ok(r) => return Ok(r),
                Err(Attempt::NotSent(e)) => {
                    // The master cannot be reached: maybe failing over.
                    self.request_refresh();
                    if e.is_transient() && wait(&mut backoff, started, budget) {
                        continue;
                    }
                    return Err(e);
                }
                Err(Attempt::Failed(e)) => e,
            };
            if let Some(to) = redirect(&e)
                && redirects < MAX_REDIRECTS
            {
                redirects += 1;
                match to {
                    Redirect::Ask(addr) => ask = Some(addr),
                    Redirect::Moved => self.request_refresh(),
                }
                continue;
            }
            let retry = matches!(
                e.kind(),
                redis::ErrorKind::Server(
                    redis::ServerErrorKind::TryAgain
                        | redis::ServerErrorKind::ClusterDown
                        | redis::ServerErrorKind::MasterDown
                        | redis::ServerErrorKind::BusyLoading
                )
            );
            if retry && wait(&mut backoff, started, budget) {
                if e.kind() != redis::ErrorKind::Server(redis::ServerErrorKind::TryAgain) {
                    self.request_refresh();
                }
                continue;
            }
            if e.is_io_error() || e.is_connection_dropped() {
                self.request_refresh();
            }
            return Err(Error::from_redis(e, access));
        }
    }

    /// As [`run`](Cluster::run), but sends `f` once on the master serving
    /// `route`'s slot: no redirect followed, nothing resent (a redirect is
    /// a transient error; the command was not applied).
    pub(crate) fn run_once<R>(
        &self,
        route: &[u8],
        access: Access,
        f: impl FnMut(&mut Conn) -> redis::RedisResult<R>,
    ) -> Result<R, Error> {
        let node = self.node_for(route)?;
        let r = node.commands.run_once(access, f);
        if r.as_ref().is_err_and(|e| e.is_transient()) {
            self.request_refresh();
        }
        r
    }

    /// A blocking connection to the master serving `route`'s slot.
    pub(crate) fn blocking(&self, route: &[u8]) -> Result<(Conn, Arc<Node>), Error> {
        let node = self.node_for(route)?;
        let (con, _) = node.blocking.get()?;
        Ok((con, node))
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

impl Locator for Cluster {
    fn nodes(&self) -> Vec<(String, Arc<Endpoint>)> {
        self.masters()
            .iter()
            .map(|n| (n.addr.clone(), Arc::clone(&n.endpoint)))
            .collect()
    }

    fn owner(&self, channel: &str) -> Option<String> {
        self.owner_addr(channel.as_bytes())
    }

    fn generation(&self) -> u64 {
        Cluster::generation(self)
    }

    fn refresh(&self) {
        self.request_refresh();
    }
}

/// Sleeps for the backoff's next wait if the budget allows; false if not.
fn wait(backoff: &mut Backoff, started: Instant, budget: Duration) -> bool {
    let left = budget.saturating_sub(started.elapsed());
    if left.is_zero() {
        return false;
    }
    std::thread::sleep(backoff.step().min(left));
    true
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

/// The driver's connections to the masters: each round goes out as one
/// pipeline per master serving any of its commands.
pub(crate) struct ClusterTransport {
    cluster: Arc<Cluster>,
    io_timeout: Duration,
    cons: HashMap<String, Conn>,
    connects: u64,
    round_trips: u64,
    seen_generation: u64,
    linger: Linger,
}

impl ClusterTransport {
    pub(crate) fn new(cluster: Arc<Cluster>, io_timeout: Duration) -> ClusterTransport {
        let seen_generation = cluster.generation();
        ClusterTransport {
            cluster,
            io_timeout,
            cons: HashMap::new(),
            connects: 0,
            round_trips: 0,
            seen_generation,
            linger: Linger::default(),
        }
    }

    /// A master failed its share of a round: its connection is dropped and
    /// each of its commands gets a stand-in "unreachable" reply.
    fn unreachable(
        &mut self,
        node: &Node,
        items: &[(usize, bool)],
        e: &Error,
        replies: &mut [Option<Value>],
    ) {
        tracing::debug!(target: "redwheel::runtime", node = %node.addr, error = %e, "cluster: a master did not answer its share of a round");
        self.cons.remove(&node.addr);
        for &(i, _) in items {
            replies[i] = Some(unreachable_reply(&node.addr));
        }
    }

    fn con(&mut self, node: &Node) -> Result<&mut Conn, Error> {
        if !self.cons.contains_key(&node.addr) {
            let con = node.endpoint.open(self.io_timeout)?;
            self.connects += 1;
            self.cons.insert(node.addr.clone(), con);
        }
        Ok(self.cons.get_mut(&node.addr).expect("just inserted"))
    }
}

/// One master's share of a round: the node, and each command's index with
/// whether it goes after `ASKING`.
type Group = (Arc<Node>, Vec<(usize, bool)>);

/// Where a `MOVED` or `ASK` error sends a command.
enum Redirect {
    /// The slot moved for good: refresh the slot map and route again.
    Moved,
    /// Ask this node once (after `ASKING`): the slot is migrating.
    Ask(String),
}

/// The redirect in `e`, if it is one (the `redis` crate parses it, for
/// direct calls and pipelined replies alike).
fn redirect(e: &redis::RedisError) -> Option<Redirect> {
    let (addr, _) = e.redirect_node()?;
    Some(
        if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::Ask) {
            Redirect::Ask(addr.to_owned())
        } else {
            Redirect::Moved
        },
    )
}

/// A stand-in reply for a command that could not be sent: a `CLUSTERDOWN`
/// error, which the driver treats as transient.
fn clusterdown_reply(why: &str) -> Value {
    let text = format!("-CLUSTERDOWN {why}\r\n");
    redis::parse_redis_value(text.as_bytes()).unwrap_or(Value::Nil)
}

/// The stand-in reply for a command whose master could not be reached.
fn unreachable_reply(addr: &str) -> Value {
    clusterdown_reply(&format!("the master at {addr} cannot be reached"))
}

impl Transport for ClusterTransport {
    fn round_trip(&mut self, commands: &Commands) -> Result<Vec<Value>, Error> {
        let n = commands.len();
        let mut replies: Vec<Option<Value>> = vec![None; n];
        // Commands still to send, each with the node to ask (`ASK`), if any.
        let mut pending: Vec<(usize, Option<String>)> = (0..n).map(|i| (i, None)).collect();
        for _pass in 0..3 {
            if pending.is_empty() {
                break;
            }
            // Group by node, keeping the order within each group.
            let mut groups: Vec<Group> = Vec::new();
            for (i, ask) in pending.drain(..) {
                let node = match &ask {
                    Some(addr) => self.cluster.node(addr),
                    None => self.cluster.node_for_slot(commands.slot(i)),
                };
                let node = match node {
                    Ok(node) => node,
                    Err(e) => {
                        replies[i] = Some(clusterdown_reply(&e.to_string()));
                        continue;
                    }
                };
                match groups.iter_mut().find(|(g, _)| g.addr == node.addr) {
                    Some((_, items)) => items.push((i, ask.is_some())),
                    None => groups.push((node, vec![(i, ask.is_some())])),
                }
            }
            let mut refresh = false;
            // Every master's share is sent before any is read, so the
            // masters work on them at the same time.
            let mut sent: Vec<(Group, usize)> = Vec::with_capacity(groups.len());
            for (node, items) in groups {
                let mut packed = Vec::new();
                let mut count = 0;
                for &(i, asking) in &items {
                    if asking {
                        packed.extend_from_slice(b"*1\r\n$6\r\nASKING\r\n");
                        count += 1;
                    }
                    packed.extend_from_slice(commands.command(i));
                    count += 1;
                }
                self.round_trips += 1;
                let result = self.con(&node).and_then(|con| {
                    con.send_pipeline(&packed)
                        .map_err(|e| Error::from_redis(e, Access::Write))
                });
                match result {
                    Ok(()) => sent.push(((node, items), count)),
                    Err(e) => {
                        self.unreachable(&node, &items, &e, &mut replies);
                        refresh = true;
                    }
                }
            }
            let started = Instant::now();
            let biggest = sent.iter().map(|(_, count)| *count).max().unwrap_or(0);
            self.linger.before_reading(biggest);
            for ((node, items), count) in sent {
                let result = self.con(&node).and_then(|con| {
                    con.recv_pipeline(count)
                        .map_err(|e| Error::from_redis(e, Access::Write))
                });
                let values = match result {
                    Ok(values) => values,
                    Err(e) => {
                        self.unreachable(&node, &items, &e, &mut replies);
                        refresh = true;
                        continue;
                    }
                };
                let mut values = values.into_iter();
                for &(i, asking) in &items {
                    if asking {
                        let _ = values.next(); // ASKING's +OK
                    }
                    let v = values.next().unwrap_or(Value::Nil);
                    if let Value::ServerError(err) = &v
                        && let Some(to) = redirect(&err.clone().into())
                    {
                        match to {
                            Redirect::Moved => {
                                refresh = true;
                                pending.push((i, None));
                            }
                            Redirect::Ask(addr) => pending.push((i, Some(addr))),
                        }
                        continue;
                    }
                    replies[i] = Some(v);
                }
            }
            self.linger.answered(biggest, started);
            if refresh {
                self.cluster.request_refresh();
            }
        }
        for (i, _) in pending {
            replies[i] = Some(unreachable_reply("(still moving)"));
        }
        let generation = self.cluster.generation();
        if generation != self.seen_generation {
            // The map changed: count it as a reconnect, so the driver runs
            // every job again.
            self.seen_generation = generation;
            self.connects += 1;
        }
        Ok(replies
            .into_iter()
            .map(|r| r.unwrap_or(Value::Nil))
            .collect())
    }

    fn load_script(&mut self, script: &redis::Script) -> Result<(), Error> {
        for node in self.cluster.masters() {
            let con = self.con(&node)?;
            if let Err(e) = script.load(con) {
                self.cons.remove(&node.addr);
                return Err(Error::from_redis(e, Access::Read));
            }
        }
        Ok(())
    }

    fn connects(&self) -> u64 {
        self.connects
    }

    fn round_trips(&self) -> u64 {
        self.round_trips
    }

    fn measure_clock(&mut self, now: &dyn Fn() -> Duration) -> Option<ClockSample> {
        let (addr, con) = self.cons.iter_mut().next()?;
        match measure(con, now) {
            Ok(sample) => Some(sample),
            Err(e) => {
                tracing::debug!(target: "redwheel::runtime", node = %addr, error = %e, "could not measure the server clock");
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_match_redis_cluster_hashing() {
        // The CRC16/XMODEM check value, and slots Redis reports.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(slot(b"123456789"), 12_739);
        assert_eq!(slot(b"foo"), 12_182);
        assert_eq!(slot(b""), 0);
        // The hash tag decides: every key of a queue shares its slot.
        assert_eq!(slot(b"redwheel:{orders}:delayed"), slot(b"orders"));
        assert_eq!(
            slot(b"redwheel:{orders}:wake"),
            slot(b"redwheel:{orders}:msg")
        );
        // An empty tag `{}` does not count: the whole key is hashed.
        assert_eq!(slot(b"a{}b"), crc16(b"a{}b") % 16_384);
        // Only the first tag counts.
        assert_eq!(slot(b"{x}{y}"), slot(b"x"));
    }

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
