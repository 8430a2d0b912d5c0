//! The driver's transport on a cluster: each round goes out as one
//! pipeline per master serving any of its commands, with `ASK` and `MOVED`
//! replies followed, and a stand-in error reply for each command of a
//! master that cannot be reached, so the rest of the round is answered as
//! usual and each job decides what its own commands' replies mean.
//!
//! A master that sends nothing for [`UNRESPONSIVE`] (a stopped or hung
//! process) fails its share of the round then, not after the command
//! timeout, and is marked down: later rounds answer its commands at once
//! with the stand-in, without waiting on it, until the cluster's background
//! probe finds it answering again. So one master that stops holds the
//! driver up once, for at most that long, and the other masters' work goes
//! on.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::Value;

use super::routing::{Redirect, redirect};
use super::slot_map::{Cluster, Node, UNRESPONSIVE};
use crate::error::{Access, Error};
use crate::runtime::conn::{Conn, Linger};
use crate::runtime::driver::{Commands, Transport};
use crate::runtime::server_clock::{ClockSample, measure};

/// The driver's connections to the masters: each round goes out as one
/// pipeline per master serving any of its commands.
pub(crate) struct ClusterTransport {
    cluster: Arc<Cluster>,
    /// Read and write timeout of the driver's connections: the command
    /// timeout, capped at [`UNRESPONSIVE`].
    io_timeout: Duration,
    cons: HashMap<String, Conn>,
    connects: u64,
    round_trips: u64,
    seen_generation: u64,
    linger: Linger,
    /// The nodes that answered the last round, and which of them answered
    /// each command (an index into `answered`, `None` for a stand-in).
    answered: Vec<Arc<Node>>,
    answered_by: Vec<Option<usize>>,
}

impl ClusterTransport {
    pub(crate) fn new(cluster: Arc<Cluster>, command_timeout: Duration) -> ClusterTransport {
        let seen_generation = cluster.generation();
        ClusterTransport {
            cluster,
            io_timeout: command_timeout.min(UNRESPONSIVE),
            cons: HashMap::new(),
            connects: 0,
            round_trips: 0,
            seen_generation,
            linger: Linger::default(),
            answered: Vec::new(),
            answered_by: Vec::new(),
        }
    }

    /// A master failed its share of a round: its connection is dropped, it
    /// is marked down, and each of its commands gets a stand-in
    /// "unreachable" reply.
    fn unreachable(
        &mut self,
        node: &Node,
        items: &[(usize, bool)],
        e: &Error,
        replies: &mut [Option<Value>],
    ) {
        tracing::debug!(target: "redwheel::runtime", node = %node.addr, error = %e, "cluster: a master did not answer its share of a round");
        self.cons.remove(&node.addr);
        node.mark_down(e);
        for &(i, _) in items {
            replies[i] = Some(unreachable_reply(&node.addr));
        }
    }

    fn con(&mut self, node: &Node) -> Result<&mut Conn, Error> {
        if !self.cons.contains_key(&node.addr) {
            // Connecting waits no longer than a read would: a stopped
            // master accepts the connection but never answers the
            // handshake.
            let con = node
                .endpoint
                .open_raw(self.io_timeout, self.io_timeout)
                .map(Conn::Node)?;
            self.connects += 1;
            self.cons.insert(node.addr.clone(), con);
        }
        Ok(self.cons.get_mut(&node.addr).expect("just inserted"))
    }

    /// The number of `node` among the nodes that answered this round.
    fn answered_index(&mut self, node: &Arc<Node>) -> usize {
        match self.answered.iter().position(|n| n.addr == node.addr) {
            Some(i) => i,
            None => {
                self.answered.push(Arc::clone(node));
                self.answered.len() - 1
            }
        }
    }
}

/// One master's share of a round: the node, and each command's index with
/// whether it goes after `ASKING`.
type Group = (Arc<Node>, Vec<(usize, bool)>);

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
        self.answered.clear();
        self.answered_by.clear();
        self.answered_by.resize(n, None);
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
                if node.is_down() {
                    // Left out until the probe finds it answering.
                    replies[i] = Some(unreachable_reply(&node.addr));
                    continue;
                }
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
                node.mark_up();
                let server = self.answered_index(&node);
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
                            Redirect::Moved(addr) => {
                                // Sent where the reply says at once; the
                                // rest of the map is refreshed meanwhile.
                                self.cluster
                                    .moved(commands.slot(i), &node.redirected_to(&addr));
                                pending.push((i, None));
                            }
                            Redirect::Ask(addr) => {
                                pending.push((i, Some(node.redirected_to(&addr))));
                            }
                        }
                        continue;
                    }
                    replies[i] = Some(v);
                    self.answered_by[i] = Some(server);
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

    fn server_of(&self, command: usize) -> Option<usize> {
        self.answered_by.get(command).copied().flatten()
    }

    fn load_script(&mut self, script: &redis::Script, server: usize) -> Result<(), Error> {
        let Some(node) = self.answered.get(server).cloned() else {
            return Ok(());
        };
        let con = self.con(&node)?;
        if let Err(e) = script.load(con) {
            let e = Error::from_redis(e, Access::Read);
            if e.is_transient() {
                self.cons.remove(&node.addr);
            }
            return Err(e);
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
