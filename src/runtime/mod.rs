//! [`Redwheel`]: what every Redis-backed part of redwheel shares.
//!
//! One `Redwheel` owns:
//!
//! * **the driver** (`driver.rs`): a 1 ms hashed wheel and a thread that
//!   runs *due work* at Redis deadlines, the one place where a deadline on
//!   the server's clock becomes a wheel timeout (coalescing per key, guard
//!   sweeps, retries with backoff, a run of everything after a reconnect);
//! * **connections** (`pool.rs`): a pool for short commands, so many
//!   threads can write at once, a second pool for blocking reads (each
//!   blocked caller holds its own connection, blocking server-side for at
//!   most [`RedwheelOptions::max_block`] at a time so shutdown is prompt),
//!   and the driver's own connection;
//! * **the subscriber** (`subscriber.rs`): one pub/sub connection for every
//!   channel listened to, resubscribed after a reconnect;
//! * **the server clock estimate** (`server_clock.rs`): `server − local`,
//!   measured with `TIME` at connect and refreshed periodically.
//!
//! # Threads
//!
//! * the wheel's worker: moves timeouts and marks keys due (a short lock); it
//!   never waits on Redis;
//! * the driver thread: all Redis I/O of due work, one pipelined round trip
//!   per connection per round;
//! * the subscriber thread.

mod backoff;
mod cluster;
pub(crate) mod driver;
mod names;
mod pool;
mod server_clock;
mod subscriber;

use std::any::Any;
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;

pub(crate) use self::backoff::Backoff;
pub(crate) use self::cluster::slot;
use self::cluster::{Cluster, ClusterTransport, Node};
pub use self::driver::DriverStats;
use self::driver::Transport;
pub(crate) use self::driver::{Commands, Deadline, Driver, DriverConfig, Job, Next};
pub(crate) use self::names::{MAX_TAG_NAME_LEN, random_u64, validate_tag_name};
use self::pool::NodeTransport;
pub(crate) use self::pool::{Conn, Endpoint, Pool, shut_down};
use self::server_clock::{ClockSample, ServerClock};
use self::subscriber::{Locator, SingleNode};
pub(crate) use self::subscriber::{Subscriber, Subscription};
use crate::error::{Access, Error, ErrorKind};
use crate::timer::SystemClock;

/// Connection settings of a [`Redwheel`].
#[derive(Clone)]
pub struct RedwheelOptions {
    pub(crate) connect_timeout: Duration,
    pub(crate) command_timeout: Duration,
    pub(crate) max_block: Duration,
    pub(crate) max_idle_connections: usize,
    pub(crate) clock_refresh: Duration,
    pub(crate) reconnect_min: Duration,
    pub(crate) reconnect_max: Duration,
    #[cfg(feature = "tls")]
    pub(crate) tls: Option<TlsSettings>,
}

/// Certificates for `rediss://` connections.
#[cfg(feature = "tls")]
#[derive(Clone)]
pub(crate) struct TlsSettings {
    pub(crate) root_cert: Option<Vec<u8>>,
    pub(crate) client: Option<(Vec<u8>, Vec<u8>)>,
}

impl fmt::Debug for RedwheelOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("RedwheelOptions");
        d.field("connect_timeout", &self.connect_timeout)
            .field("command_timeout", &self.command_timeout)
            .field("max_block", &self.max_block)
            .field("max_idle_connections", &self.max_idle_connections)
            .field("clock_refresh", &self.clock_refresh)
            .field(
                "reconnect_backoff",
                &(self.reconnect_min, self.reconnect_max),
            );
        #[cfg(feature = "tls")]
        d.field("tls", &self.tls.as_ref().map(|_| "<certificates>"));
        d.finish()
    }
}

impl Default for RedwheelOptions {
    fn default() -> Self {
        RedwheelOptions {
            connect_timeout: Duration::from_secs(2),
            command_timeout: Duration::from_secs(5),
            max_block: Duration::from_secs(1),
            max_idle_connections: 16,
            clock_refresh: Duration::from_secs(30),
            reconnect_min: Duration::from_millis(10),
            reconnect_max: Duration::from_millis(50),
            #[cfg(feature = "tls")]
            tls: None,
        }
    }
}

impl RedwheelOptions {
    /// How long opening a connection may take. Default 2 s.
    pub fn connect_timeout(mut self, d: Duration) -> Self {
        self.connect_timeout = d;
        self
    }

    /// The longest a command may take, all attempts included: a call that
    /// gets no answer in this time fails with
    /// [`ErrorKind::OutcomeUnknown`] (a write that may have happened) or
    /// [`ErrorKind::Unavailable`] (a read, or nothing sent). Default 5 s.
    pub fn command_timeout(mut self, d: Duration) -> Self {
        self.command_timeout = d;
        self
    }

    /// Longest server-side block of one round of a blocking read (a
    /// consumer waiting for a message); a blocked call waits in rounds of
    /// this length, so it notices shutdown within it. 1 ms ..= 1 s; default
    /// 1 s.
    pub fn max_block(mut self, d: Duration) -> Self {
        self.max_block = d;
        self
    }

    /// Idle connections kept per pool (commands, blocking reads). Default
    /// 16.
    pub fn max_idle_connections(mut self, n: usize) -> Self {
        self.max_idle_connections = n;
        self
    }

    /// How often the `server − local` clock offset is re-estimated.
    /// Default 30 s.
    pub fn clock_refresh(mut self, d: Duration) -> Self {
        self.clock_refresh = d;
        self
    }

    /// Waits between attempts to reach Redis again while it is down: from
    /// `min`, doubling up to `max`. Every background thread and blocked
    /// consumer retries on this schedule, so work resumes within about
    /// `max` of Redis being back. Default 10 ms to 50 ms.
    pub fn reconnect_backoff(mut self, min: Duration, max: Duration) -> Self {
        self.reconnect_min = min;
        self.reconnect_max = max;
        self
    }

    /// Trusts the CA certificate(s) in `pem` (instead of the system's
    /// roots) for `rediss://` URLs.
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub fn tls_root_certificate(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls.get_or_insert_with(empty_tls).root_cert = Some(pem.into());
        self
    }

    /// Presents a client certificate (mutual TLS) on `rediss://` URLs:
    /// the certificate chain and its private key, both PEM.
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub fn tls_client_certificate(
        mut self,
        cert_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.tls.get_or_insert_with(empty_tls).client = Some((cert_pem.into(), key_pem.into()));
        self
    }

    fn validate(&self) -> Result<(), Error> {
        let bad = |name: &str, reason: &str| {
            Err(Error::new(
                ErrorKind::InvalidOption,
                format!("invalid option `{name}`: {reason}"),
            ))
        };
        if self.connect_timeout.is_zero() {
            return bad("connect_timeout", "must be greater than zero");
        }
        if self.command_timeout < Duration::from_millis(1) {
            return bad("command_timeout", "must be at least 1 ms");
        }
        if self.max_block < Duration::from_millis(1) || self.max_block > Duration::from_secs(1) {
            return bad("max_block", "must be within 1 ms ..= 1 s");
        }
        if self.clock_refresh.is_zero() {
            return bad("clock_refresh", "must be greater than zero");
        }
        if self.reconnect_min < Duration::from_millis(1) || self.reconnect_max < self.reconnect_min
        {
            return bad(
                "reconnect_backoff",
                "needs 1 ms <= min <= max (for example 10 ms, 50 ms)",
            );
        }
        Ok(())
    }
}

#[cfg(feature = "tls")]
fn empty_tls() -> TlsSettings {
    TlsSettings {
        root_cert: None,
        client: None,
    }
}

/// A connection to Redis, shared by everything Redis-backed in a process:
/// one wheel and the thread that runs timed Redis work on it, connection
/// pools, and a subscriber connection.
///
/// A cheap `Clone` handle, `Send + Sync`. Dropping the last handle (the
/// handles made from it count) shuts everything down, as
/// [`shutdown`](Redwheel::shutdown) does. See the crate docs for an
/// example.
#[derive(Clone)]
pub struct Redwheel {
    handle: Arc<Handle>,
}

/// Owned by `Redwheel` clones only, never by background threads: its drop
/// means "the last handle is gone".
struct Handle {
    rt: Arc<Runtime>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        if let Err(e) = self.rt.shutdown(Duration::from_secs(5)) {
            tracing::warn!(target: "redwheel::runtime", error = %e, "shutdown on drop did not finish");
        }
    }
}

impl fmt::Debug for Redwheel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Redwheel")
            .field("addr", &self.handle.rt.addr)
            .field("shut_down", &self.handle.rt.is_shut_down())
            .finish_non_exhaustive()
    }
}

/// Most keys one `SCAN` call is asked to look at.
const SCAN_COUNT: usize = 1_000;

/// What the handles and the layers above share.
pub(crate) struct Runtime {
    pub(crate) options: RedwheelOptions,
    backend: Backend,
    /// What it is connected to, for messages.
    addr: String,
    pub(crate) driver: Driver,
    pub(crate) subscriber: Arc<Subscriber>,
    server_clock: Arc<ServerClock>,
    /// Per-name state of the layers above (one entry per open name).
    registry: Mutex<HashMap<String, Arc<dyn Any + Send + Sync>>>,
    shut_down: AtomicBool,
    subscriber_thread: Mutex<Option<JoinHandle<()>>>,
}

impl Redwheel {
    /// Connects to the Redis at `url` with default options, and starts the
    /// background threads.
    ///
    /// URLs: `redis://[user:password@]host:port[/db]`, or `rediss://…` for
    /// TLS (feature `tls`). Fails with [`ErrorKind::InvalidUrl`] for a URL
    /// that does not parse, [`ErrorKind::Unavailable`] if Redis cannot be
    /// reached, [`ErrorKind::Authentication`] for refused credentials,
    /// [`ErrorKind::Tls`] for a failed handshake and
    /// [`ErrorKind::Protocol`] when the server is not Redis. Only
    /// `Unavailable` is worth retrying.
    pub fn connect(url: &str) -> Result<Redwheel, Error> {
        Redwheel::connect_with(url, RedwheelOptions::default())
    }

    /// As [`connect`](Redwheel::connect), with options.
    pub fn connect_with(url: &str, options: RedwheelOptions) -> Result<Redwheel, Error> {
        options.validate()?;
        let endpoint = Arc::new(Endpoint::new(url, &options)?);
        let backend = Backend::Node {
            commands: Pool::new(
                Arc::clone(&endpoint),
                options.command_timeout,
                options.max_idle_connections,
            ),
            blocking: Pool::new(
                Arc::clone(&endpoint),
                options.max_block + options.command_timeout,
                options.max_idle_connections,
            ),
        };
        let transport = NodeTransport::new(Arc::clone(&endpoint), options.command_timeout);
        let locator = Arc::new(SingleNode(Arc::clone(&endpoint)));
        Redwheel::start(
            endpoint.addr().to_owned(),
            backend,
            transport,
            locator,
            options,
        )
    }

    /// Connects to a Redis Cluster through any of `seeds` (URLs of some of
    /// its nodes, `redis://…` or, with the `tls` feature, `rediss://…`; the
    /// first one's credentials and TLS settings are used for every node),
    /// with default options.
    ///
    /// Every queue and its keys live in the slot of the queue's `{hash
    /// tag}`, so queues spread over the masters and every script touches
    /// one slot. Commands go to the master serving the slot, following
    /// `MOVED` and `ASK`, waiting out `TRYAGAIN` (a slot being migrated)
    /// and a failover within `command_timeout`. Needs Redis 7.0 or later
    /// (sharded pub/sub).
    pub fn connect_cluster(seeds: &[&str]) -> Result<Redwheel, Error> {
        Redwheel::connect_cluster_with(seeds, RedwheelOptions::default())
    }

    /// As [`connect_cluster`](Redwheel::connect_cluster), with options.
    pub fn connect_cluster_with(
        seeds: &[&str],
        options: RedwheelOptions,
    ) -> Result<Redwheel, Error> {
        options.validate()?;
        let cluster = Cluster::connect(seeds, &options)?;
        let masters: Vec<String> = cluster.masters().iter().map(|n| n.addr.clone()).collect();
        let addr = format!(
            "cluster of {} masters ({})",
            masters.len(),
            masters.join(", ")
        );
        let transport = ClusterTransport::new(Arc::clone(&cluster), options.command_timeout);
        let locator: Arc<dyn Locator> = Arc::clone(&cluster) as Arc<dyn Locator>;
        Redwheel::start(addr, Backend::Cluster(cluster), transport, locator, options)
    }

    fn start(
        addr: String,
        backend: Backend,
        transport: impl Transport,
        locator: Arc<dyn Locator>,
        options: RedwheelOptions,
    ) -> Result<Redwheel, Error> {
        let clock = SystemClock::new();
        let server_clock = Arc::new(ServerClock::default());
        let driver = Driver::start(
            DriverConfig {
                reconnect_min: options.reconnect_min,
                reconnect_max: options.reconnect_max,
                clock_refresh: Some(options.clock_refresh),
                ..DriverConfig::default()
            },
            transport,
            clock,
            Arc::clone(&server_clock),
            "redwheel-driver",
        )?;
        // Fail fast when Redis is unreachable or refuses us, and measure
        // the server's clock.
        let sample = backend.measure_clock(&|| driver.now())?;
        server_clock.set(sample);
        let (subscriber, subscriber_thread) = Subscriber::start(
            locator,
            (options.reconnect_min, options.reconnect_max),
            options.command_timeout,
        )?;
        let rt = Arc::new(Runtime {
            options,
            backend,
            addr,
            driver,
            subscriber,
            server_clock,
            registry: Mutex::new(HashMap::new()),
            shut_down: AtomicBool::new(false),
            subscriber_thread: Mutex::new(Some(subscriber_thread)),
        });
        Ok(Redwheel {
            handle: Arc::new(Handle { rt }),
        })
    }

    /// Stops the background threads and waits up to `timeout` for them to
    /// end. Blocked reads return [`ErrorKind::Shutdown`] within
    /// [`RedwheelOptions::max_block`]. Everything stored stays in Redis;
    /// another process (or a later `Redwheel`) carries on. A second call
    /// returns at once.
    pub fn shutdown(&self, timeout: Duration) -> Result<(), Error> {
        self.handle.rt.shutdown(timeout)
    }

    /// True once [`shutdown`](Redwheel::shutdown) was called.
    pub fn is_shut_down(&self) -> bool {
        self.handle.rt.is_shut_down()
    }

    /// What the driver did so far: rounds (round trips) and commands sent,
    /// failures, reconnects. For diagnostics and benchmarks.
    pub fn driver_stats(&self) -> DriverStats {
        self.handle.rt.driver.stats()
    }

    /// Test hook: shifts this process's `server − local` clock estimate by
    /// `ms` (positive: believe the server clock is further ahead), so that
    /// announced deadlines fire early (or late) on the wheel. Not part of
    /// the API.
    #[doc(hidden)]
    pub fn skew_clock_estimate_for_tests(&self, ms: i64) {
        self.handle.rt.server_clock.skew(ms);
    }

    /// Test hook: holds the runtime's wheel thread up for `stall` with a
    /// deliberately slow wheel task, and returns once that task has begun
    /// (or after 10 s). Work due meanwhile must not wait for it: the
    /// driver's backstop runs it. Not part of the API.
    #[doc(hidden)]
    pub fn stall_wheel_for_tests(&self, stall: Duration) {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let task = move || {
            let _ = tx.send(());
            std::thread::sleep(stall);
        };
        if self
            .handle
            .rt
            .driver
            .run_on_wheel_for_tests(Duration::from_millis(1), task)
            .is_ok()
        {
            let _ = rx.recv_timeout(Duration::from_secs(10));
        }
    }

    pub(crate) fn runtime(&self) -> &Arc<Runtime> {
        &self.handle.rt
    }
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
    fn measure_clock(&self, now: &dyn Fn() -> Duration) -> Result<ClockSample, Error> {
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

    /// As [`run`](Runtime::run), but sends `f` exactly once: no hidden
    /// resend on a pooled connection that died, no redirect followed.
    pub(crate) fn run_once<R>(
        &self,
        route: &str,
        access: Access,
        f: impl FnMut(&mut Conn) -> redis::RedisResult<R>,
    ) -> Result<R, Error> {
        match &self.backend {
            Backend::Node { commands, .. } => commands.run_once(access, f),
            Backend::Cluster(c) => c.run_once(route.as_bytes(), access, f),
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
    /// it); give it back with [`put_blocking`](Runtime::put_blocking).
    pub(crate) fn blocking(&self, route: &str) -> Result<Blocking, Error> {
        match &self.backend {
            Backend::Node { blocking, .. } => {
                let (con, _) = blocking.get()?;
                Ok(Blocking { con, node: None })
            }
            Backend::Cluster(c) => {
                let (con, node) = c.blocking(route.as_bytes())?;
                Ok(Blocking {
                    con,
                    node: Some(node),
                })
            }
        }
    }

    /// Keeps a healthy blocking connection for reuse.
    pub(crate) fn put_blocking(&self, b: Blocking) {
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

    fn shutdown(&self, timeout: Duration) -> Result<(), Error> {
        if self.shut_down.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        let deadline = Instant::now() + timeout;
        self.subscriber.stop();
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
            while !h.is_finished() && Instant::now() < deadline {
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
