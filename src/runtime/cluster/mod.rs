//! Redis Cluster: the slot map, a pool per master, routing by a key's slot
//! (following `MOVED` and `ASK`, waiting out `TRYAGAIN` and a failover),
//! and the driver's transport, which sends each round as one pipeline per
//! master.
//!
//! Everything redwheel stores for one queue (or lock) shares a `{hash tag}`,
//! so every script touches one slot. This module sends each command to the
//! master serving the slot of its routing key, as the slot map says. A
//! `MOVED` reply moves its slot to the master it names at once; the map as
//! a whole comes from `CLUSTER SLOTS`, asked of a node that answers (those
//! that did not answer last time are asked last) by a background thread,
//! whenever a node says `MOVED`, a master cannot be reached, or a
//! subscription is moved away: no caller waits for it. Every change bumps
//! a generation that the driver (which then runs every job) and the
//! subscriber (which then resubscribes) watch.
//!
//! Connections are the `redis` crate's, one server each: the crate's own
//! cluster connection has no sharded pub/sub, no per-node blocking
//! connections, and builds pipelines from commands rather than the packed
//! bytes the driver keeps, so the routing lives here.
//!
//! Three files, lowest first: `slot_map.rs` (who serves each slot, the
//! nodes and their pools, refreshes), `routing.rs` (running one command
//! where its slot is served, following redirects) and `transport.rs` (the
//! driver's rounds, one pipeline per master).

mod routing;
mod slot_map;
mod transport;

pub(crate) use self::routing::redirect_target;
#[cfg(feature = "async")]
pub(crate) use self::routing::{Step, step_after};
pub(crate) use self::slot_map::{Cluster, Node};
pub(crate) use self::transport::ClusterTransport;
