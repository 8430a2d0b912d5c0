//! [`Runtime`]: what the `Redwheel` handles and the layers above share
//! (the backend, the driver, the subscriber, the server clock estimate,
//! the per-name registry), and the calls the layers above make on it:
//! run a command where its key lives, get a blocking connection, read the
//! server's clock.

use std::any::Any;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;

use super::cluster::{Cluster, Node};
use super::conn::Conn;
use super::driver::Driver;
use super::options::RedwheelOptions;
use super::pool::Pool;
use super::server_clock::{self, ClockSample, ServerClock};
use super::subscriber::Subscriber;
use crate::error::{Access, Error, ErrorKind};

/// Most keys one `SCAN` call is asked to look at.
const SCAN_COUNT: usize = 1_000;

/// What the handles and the layers above share.
pub(crate) struct Runtime {
    pub(crate) options: RedwheelOptions,
    pub(super) backend: Backend,
    /// What it is connected to, for messages.
    pub(super) addr: String,
    pub(crate) driver: Driver,
    pub(crate) subscriber: Arc<Subscriber>,
    pub(super) server_clock: Arc<ServerClock>,
    /// Per-name state of the layers above (one entry per open name).
    pub(super) registry: Mutex<HashMap<String, Arc<dyn Any + Send + Sync>>>,
    pub(super) shut_down: AtomicBool,
    pub(super) subscriber_thread: Mutex<Option<JoinHandle<()>>>,
    /// The futures' connections and waits (feature `async`).
    #[cfg(feature = "async")]
    pub(crate) asynk: super::mux::AsyncRuntime,
}

/// What a `Redwheel` is connected to.
pub(crate) enum Backend {
    /// One server.
    Node { commands: Pool, blocking: Pool },
    /// A Redis Cluster.
    Cluster(Arc<Cluster>),
}

impl Backend {
    /// Measures the server clock (on one of the masters of a cluster:
    /// their clocks are the machines').
    pub(super) fn measure_clock(&self, now: &dyn Fn() -> Duration) -> Result<ClockSample, Error> {
        let measure = |con: &mut Conn| server_clock::measure(con, now);
        match self {
            Backend::Node { commands, .. } => commands.run(Access::Read, measure),
            Backend::Cluster(c) => {
                let node = c.masters().into_iter().next().ok_or_else(|| {
                    Error::new(ErrorKind::Unavailable, "the cluster has no master")
                })?;
                node.commands.run(Access::Read, measure)
            }
        }
    }
}

/// A blocking connection and the node whose pool it goes back to.
pub(crate) struct Blocking {
    pub(crate) con: Conn,
    node: Option<Arc<Node>>,
    /// Its pool's I/O timeout, and whether this call set a shorter one.
    io_timeout: Duration,
    shortened: bool,
}

impl Blocking {
    fn new(con: Conn, node: Option<Arc<Node>>, io_timeout: Duration) -> Blocking {
        Blocking {
            con,
            node,
            io_timeout,
            shortened: false,
        }
    }

    /// Makes the connection's next read or write end by `until` at the
    /// latest (a wait that must end on time, on a server that may have
    /// stopped answering), or after its pool's I/O timeout if that comes
    /// first. A no-op while `until` is further away than that.
    pub(crate) fn end_io_by(&mut self, until: Option<Instant>) -> redis::RedisResult<()> {
        let Some(until) = until else { return Ok(()) };
        let left = until.saturating_duration_since(Instant::now());
        if left < self.io_timeout {
            self.con.set_io_timeout(left)?;
            self.shortened = true;
        } else if self.shortened {
            self.con.set_io_timeout(self.io_timeout)?;
            self.shortened = false;
        }
        Ok(())
    }
}

impl Runtime {
    /// Runs `f` (a command or script whose keys share `route`'s slot) on a
    /// connection to the node serving `route`, within `command_timeout`.
    pub(crate) fn run<R>(
        &self,
        route: &str,
        access: Access,
        f: impl FnMut(&mut Conn) -> redis::RedisResult<R>,
    ) -> Result<R, Error> {
        match &self.backend {
            Backend::Node { commands, .. } => commands.run(access, f),
            Backend::Cluster(c) => c.run(route.as_bytes(), access, f),
        }
    }

    /// Runs `f` once on every master (the one server, or each master of a
    /// cluster as the slot map has it now), for commands that read each
    /// node's own keyspace (`SCAN`). The replies in the masters' order.
    pub(crate) fn run_on_masters<R>(
        &self,
        access: Access,
        mut f: impl FnMut(&mut Conn) -> redis::RedisResult<R>,
    ) -> Result<Vec<R>, Error> {
        match &self.backend {
            Backend::Node { commands, .. } => Ok(vec![commands.run(access, f)?]),
            Backend::Cluster(c) => c
                .masters()
                .iter()
                .map(|node| node.commands.run(access, &mut f))
                .collect(),
        }
    }

    /// Every key matching `pattern` on every master, by `SCAN` (for
    /// operators' tools: it walks the whole keyspace). Not a snapshot: a
    /// key may be missed if it is created meanwhile, or listed twice.
    pub(crate) fn scan_masters(&self, pattern: &str) -> Result<Vec<String>, Error> {
        let found = self.run_on_masters(Access::Read, |con| {
            let mut cursor: u64 = 0;
            let mut keys = Vec::new();
            loop {
                let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(pattern)
                    .arg("COUNT")
                    .arg(SCAN_COUNT)
                    .query(con)?;
                keys.extend(batch);
                if next == 0 {
                    return Ok(keys);
                }
                cursor = next;
            }
        })?;
        Ok(found.into_iter().flatten().collect())
    }

    /// A connection for a blocking read of `route` (on the node serving
    /// it); give it back with [`put_blocking`](Runtime::put_blocking). A
    /// connection that must be checked or opened first takes no longer
    /// than until `until`.
    pub(crate) fn blocking(&self, route: &str, until: Option<Instant>) -> Result<Blocking, Error> {
        let pool_of = |pool: &Pool| {
            until.map_or(pool.io_timeout(), |u| {
                u.saturating_duration_since(Instant::now())
            })
        };
        match &self.backend {
            Backend::Node { blocking, .. } => {
                let (con, _) = blocking.get_within(pool_of(blocking))?;
                Ok(Blocking::new(con, None, blocking.io_timeout()))
            }
            Backend::Cluster(c) => {
                let node = c.node_for(route.as_bytes())?;
                let (con, _) = node.blocking.get_within(pool_of(&node.blocking))?;
                let io = node.blocking.io_timeout();
                Ok(Blocking::new(con, Some(node), io))
            }
        }
    }

    /// Keeps a healthy blocking connection for reuse (with its pool's I/O
    /// timeout again, if a call shortened it).
    pub(crate) fn put_blocking(&self, b: Blocking) {
        if b.shortened && b.con.set_io_timeout(b.io_timeout).is_err() {
            return;
        }
        match (&self.backend, b.node) {
            (Backend::Node { blocking, .. }, _) => blocking.put(b.con),
            (Backend::Cluster(_), Some(node)) => node.blocking.put(b.con),
            (Backend::Cluster(_), None) => {}
        }
    }

    /// A command failed in a way that may mean the slot map is stale (a
    /// redirect, a node down): look again (a no-op on one server).
    pub(crate) fn topology_may_have_changed(&self) {
        if let Backend::Cluster(c) = &self.backend {
            c.request_refresh();
        }
    }

    pub(crate) fn is_shut_down(&self) -> bool {
        self.shut_down.load(Ordering::SeqCst)
    }

    /// The state registered under `name`, made by `init` on first use.
    /// `None` if a state of another type holds the name.
    pub(crate) fn state<S: Any + Send + Sync>(
        &self,
        name: &str,
        init: impl FnOnce() -> S,
    ) -> Option<(Arc<S>, bool)> {
        let mut reg = self.registry.lock();
        if let Some(s) = reg.get(name) {
            return Arc::clone(s).downcast::<S>().ok().map(|s| (s, false));
        }
        let s = Arc::new(init());
        reg.insert(
            name.to_owned(),
            Arc::clone(&s) as Arc<dyn Any + Send + Sync>,
        );
        Some((s, true))
    }

    /// The server's clock now, by the offset estimate, in epoch ms (the
    /// local wall clock before any estimate).
    pub(crate) fn server_now_ms(&self) -> u64 {
        self.server_clock
            .server_ms_at(self.driver.now())
            .unwrap_or_else(|| {
                SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map(|d| d.as_millis() as u64)
                    .unwrap_or(0)
            })
    }

    /// The local clock reading (the driver's wheel).
    pub(crate) fn local_now(&self) -> Duration {
        self.driver.now()
    }

    /// Shuts down, waiting up to `timeout` for the threads (a timeout too
    /// long to be a point in time: as long as they take).
    pub(super) fn shutdown(&self, timeout: Duration) -> Result<(), Error> {
        let deadline = Instant::now().checked_add(timeout);
        if self.shut_down.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        self.subscriber.stop();
        #[cfg(feature = "async")]
        self.asynk.close();
        let driver = self.driver.shutdown(deadline);
        match &self.backend {
            Backend::Node { commands, blocking } => {
                commands.close();
                blocking.close();
            }
            Backend::Cluster(c) => c.close(),
        }
        // The subscriber notices within its poll interval (100 ms).
        let sub = self.subscriber_thread.lock().take();
        let mut sub_done = true;
        if let Some(h) = sub {
            while !h.is_finished() && deadline.is_none_or(|d| Instant::now() < d) {
                std::thread::sleep(Duration::from_millis(5));
            }
            if h.is_finished() {
                let _ = h.join();
            } else {
                sub_done = false;
            }
        }
        driver?;
        if !sub_done {
            return Err(Error::new(
                ErrorKind::ShutdownTimeout,
                "shutdown timed out; the subscriber thread is still running",
            ));
        }
        tracing::debug!(target: "redwheel::runtime", "redwheel shut down");
        Ok(())
    }
}
