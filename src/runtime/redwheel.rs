//! [`Redwheel`]: the public handle. Connecting builds the backend (one
//! server or a cluster), starts the driver and the subscriber, and measures
//! the server's clock; dropping the last handle shuts everything down.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use parking_lot::Mutex;

use super::cluster::{Cluster, ClusterTransport};
use super::driver::{Driver, DriverConfig, DriverStats, Transport};
use super::endpoint::Endpoint;
use super::node_transport::NodeTransport;
use super::options::RedwheelOptions;
use super::pool::Pool;
use super::server_clock::ServerClock;
use super::shared::{Backend, Runtime};
use super::subscriber::{Locator, SingleNode, Subscriber};
use crate::error::Error;
use crate::timer::SystemClock;

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
    ///
    /// [`ErrorKind::Authentication`]: crate::ErrorKind::Authentication
    /// [`ErrorKind::InvalidUrl`]: crate::ErrorKind::InvalidUrl
    /// [`ErrorKind::Protocol`]: crate::ErrorKind::Protocol
    /// [`ErrorKind::Tls`]: crate::ErrorKind::Tls
    /// [`ErrorKind::Unavailable`]: crate::ErrorKind::Unavailable
    pub fn connect(url: &str) -> Result<Redwheel, Error> {
        Redwheel::connect_with(url, RedwheelOptions::default())
    }

    /// As [`connect`](Redwheel::connect), with options.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use redwheel::{Redwheel, RedwheelOptions};
    ///
    /// let rw = Redwheel::connect_with(
    ///     "redis://app:secret@10.0.0.5:6379/0",
    ///     RedwheelOptions::default()
    ///         .command_timeout(Duration::from_secs(2))
    ///         .reconnect_backoff(Duration::from_millis(10), Duration::from_millis(200)),
    /// )?;
    /// # Ok::<(), redwheel::Error>(())
    /// ```
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
            Some(endpoint),
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
    ///
    /// ```no_run
    /// use redwheel::Redwheel;
    ///
    /// // Any of the nodes will do; the slot map is learnt from the first that answers.
    /// let rw = Redwheel::connect_cluster(&["redis://10.0.0.1:7000", "redis://10.0.0.2:7000"])?;
    /// let q = rw.queue::<String>("orders")?; // lives on the master of the slot of `{orders}`
    /// # Ok::<(), redwheel::Error>(())
    /// ```
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
        Redwheel::start(
            addr,
            Backend::Cluster(cluster),
            transport,
            locator,
            options,
            None,
        )
    }

    fn start(
        addr: String,
        backend: Backend,
        transport: impl Transport,
        locator: Arc<dyn Locator>,
        options: RedwheelOptions,
        // The one server's endpoint; `None` on a cluster.
        #[cfg_attr(not(feature = "async"), allow(unused_variables))] single: Option<Arc<Endpoint>>,
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
        #[cfg(feature = "async")]
        let asynk = super::mux::AsyncRuntime::new(
            single,
            super::mux::MuxConfig {
                io_timeout: options.command_timeout,
                reconnect: (options.reconnect_min, options.reconnect_max),
            },
        );
        let rt = Arc::new(Runtime {
            #[cfg(feature = "async")]
            asynk,
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
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use redwheel::{ErrorKind, Redwheel};
    ///
    /// let rw = Redwheel::connect("redis://127.0.0.1:6379")?;
    /// // … at the end of the service:
    /// match rw.shutdown(Duration::from_secs(20)) {
    ///     Ok(()) => {}
    ///     // A round of due work still on the wire: it ends on its own.
    ///     Err(e) if e.kind() == ErrorKind::ShutdownTimeout => eprintln!("{e}"),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok::<(), redwheel::Error>(())
    /// ```
    ///
    /// [`ErrorKind::Shutdown`]: crate::ErrorKind::Shutdown
    pub fn shutdown(&self, timeout: Duration) -> Result<(), Error> {
        self.handle.rt.shutdown(timeout)
    }

    /// True once [`shutdown`](Redwheel::shutdown) was called.
    pub fn is_shut_down(&self) -> bool {
        self.handle.rt.is_shut_down()
    }

    /// What the driver did so far: rounds (round trips) and commands sent,
    /// failures, reconnects. For diagnostics and benchmarks.
    ///
    /// ```no_run
    /// use redwheel::Redwheel;
    ///
    /// let rw = Redwheel::connect("redis://127.0.0.1:6379")?;
    /// let s = rw.driver_stats();
    /// println!("{} rounds, {} round trips, {} failed", s.rounds, s.round_trips, s.failed_rounds);
    /// # Ok::<(), redwheel::Error>(())
    /// ```
    pub fn driver_stats(&self) -> DriverStats {
        self.handle.rt.driver.stats()
    }

    pub(crate) fn runtime(&self) -> &Arc<Runtime> {
        &self.handle.rt
    }
}
