//! Connections to Redis: where they go ([`Endpoint`]), what one is
//! ([`Conn`]), and the pools that keep idle ones ([`Pool`]).
//!
//! A [`Conn`] is the one connection type the rest of the crate uses; it
//! implements [`redis::ConnectionLike`], so scripts and pipelines run on it
//! whatever it is connected to. Today that is one Redis server; a cluster
//! connection becomes another variant, and nothing above this file changes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use redis::{Client, ConnectionLike, Value};

use super::RedwheelOptions;
use super::driver::{Commands, Transport};
use super::server_clock::{ClockSample, measure};
use crate::error::{Access, Error, ErrorKind};

/// Where connections go, and how they are opened.
pub(crate) struct Endpoint {
    client: Client,
    /// The same, speaking RESP3 (pub/sub messages arrive as pushes).
    resp3: Client,
    /// `host:port`, with " (TLS)" for TLS (never the password), for messages.
    addr: String,
    /// `host:port`.
    host_port: String,
    connect_timeout: Duration,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

/// `url` with any password replaced by `***`, for messages.
pub(crate) fn redact(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return url.to_owned();
    };
    let Some(at) = url[scheme_end..].rfind('@').map(|i| i + scheme_end) else {
        return url.to_owned();
    };
    let userinfo = &url[scheme_end..at];
    let user = userinfo.split(':').next().unwrap_or("");
    let hidden = if userinfo.contains(':') {
        format!("{user}:***")
    } else {
        "***".to_owned()
    };
    format!("{}{hidden}{}", &url[..scheme_end], &url[at..])
}

impl Endpoint {
    /// Parses `url` (`redis://[user:password@]host:port[/db]`, or
    /// `rediss://…` with the `tls` feature).
    pub(crate) fn new(url: &str, options: &RedwheelOptions) -> Result<Endpoint, Error> {
        let invalid = |e: redis::RedisError| {
            Error::new(
                ErrorKind::InvalidUrl,
                format!("invalid redis URL {:?}", redact(url)),
            )
            .with_cause(e)
        };
        let is_tls = url.starts_with("rediss://");
        if is_tls && !cfg!(feature = "tls") {
            return Err(Error::new(
                ErrorKind::InvalidUrl,
                format!(
                    "{:?} asks for TLS, which needs redwheel's `tls` feature",
                    redact(url)
                ),
            ));
        }
        let client = if is_tls {
            tls_client(url, options).map_err(invalid)?
        } else {
            Client::open(url).map_err(invalid)?
        };
        let (host_port, addr) = match client.get_connection_info().addr() {
            redis::ConnectionAddr::Tcp(host, port) => {
                (format!("{host}:{port}"), format!("{host}:{port}"))
            }
            redis::ConnectionAddr::TcpTls { host, port, .. } => {
                (format!("{host}:{port}"), format!("{host}:{port} (TLS)"))
            }
            redis::ConnectionAddr::Unix(path) => {
                (path.display().to_string(), path.display().to_string())
            }
            other => (format!("{other:?}"), format!("{other:?}")),
        };
        let info = client.get_connection_info().clone();
        let settings = info
            .redis_settings()
            .clone()
            .set_protocol(redis::ProtocolVersion::RESP3);
        let resp3 = Client::open(info.set_redis_settings(settings)).map_err(invalid)?;
        Ok(Endpoint {
            client,
            resp3,
            addr,
            host_port,
            connect_timeout: options.connect_timeout,
        })
    }

    /// `host:port` of the server, for messages.
    pub(crate) fn addr(&self) -> &str {
        &self.addr
    }

    /// `host:port` of the server.
    pub(crate) fn host_port(&self) -> &str {
        &self.host_port
    }

    /// Opens a raw connection whose reads and writes time out after
    /// `io_timeout`; the connect itself takes at most `connect_timeout`.
    pub(crate) fn open_raw(
        &self,
        connect_timeout: Duration,
        io_timeout: Duration,
    ) -> Result<redis::Connection, Error> {
        let con = self
            .client
            .get_connection_with_timeout(connect_timeout.min(self.connect_timeout).max(MIN_WAIT))
            .map_err(|e| Error::connect(e, &self.addr))?;
        set_timeouts(&con, io_timeout).map_err(|e| Error::connect(e, &self.addr))?;
        Ok(con)
    }

    /// Opens a RESP3 connection for pub/sub (messages arrive as pushes),
    /// whose reads and writes time out after `io_timeout`.
    pub(crate) fn open_resp3(
        &self,
        connect_timeout: Duration,
        io_timeout: Duration,
    ) -> Result<redis::Connection, Error> {
        let con = self
            .resp3
            .get_connection_with_timeout(connect_timeout.min(self.connect_timeout).max(MIN_WAIT))
            .map_err(|e| Error::connect(e, &self.addr))?;
        set_timeouts(&con, io_timeout).map_err(|e| Error::connect(e, &self.addr))?;
        Ok(con)
    }

    /// Opens a connection whose reads and writes time out after
    /// `io_timeout`.
    pub(crate) fn open(&self, io_timeout: Duration) -> Result<Conn, Error> {
        self.open_raw(self.connect_timeout, io_timeout)
            .map(Conn::Node)
    }
}

/// Shortest wait handed to a socket (zero means "no timeout" there).
const MIN_WAIT: Duration = Duration::from_millis(1);

fn set_timeouts(con: &redis::Connection, io_timeout: Duration) -> redis::RedisResult<()> {
    let d = Some(io_timeout.max(MIN_WAIT));
    con.set_read_timeout(d)?;
    con.set_write_timeout(d)
}

#[cfg(feature = "tls")]
fn tls_client(url: &str, options: &RedwheelOptions) -> redis::RedisResult<Client> {
    // rustls needs a process-wide crypto provider; install ring's unless the
    // application installed one already.
    let _ = rustls::crypto::ring::default_provider().install_default();
    match &options.tls {
        Some(tls) => Client::build_with_tls(
            url,
            redis::TlsCertificates {
                client_tls: tls.client.clone().map(|(client_cert, client_key)| {
                    redis::ClientTlsConfig {
                        client_cert,
                        client_key,
                    }
                }),
                root_cert: tls.root_cert.clone(),
            },
        ),
        None => Client::open(url),
    }
}

#[cfg(not(feature = "tls"))]
fn tls_client(url: &str, _options: &RedwheelOptions) -> redis::RedisResult<Client> {
    Client::open(url)
}

/// A connection to Redis.
pub(crate) enum Conn {
    /// To one server.
    Node(redis::Connection),
}

impl Conn {
    /// Sets the read and write timeouts.
    pub(crate) fn set_io_timeout(&self, d: Duration) -> redis::RedisResult<()> {
        match self {
            Conn::Node(c) => set_timeouts(c, d),
        }
    }
}

impl Conn {
    /// Sends a pipeline of packed commands without reading the replies.
    pub(crate) fn send_pipeline(&mut self, bytes: &[u8]) -> redis::RedisResult<()> {
        match self {
            Conn::Node(c) => c.send_packed_command(bytes),
        }
    }

    /// Reads the `count` replies of a pipeline sent with
    /// [`send_pipeline`](Conn::send_pipeline): error replies as
    /// `Value::ServerError`, push messages skipped.
    pub(crate) fn recv_pipeline(&mut self, count: usize) -> redis::RedisResult<Vec<Value>> {
        let Conn::Node(c) = self;
        let mut out = Vec::with_capacity(count);
        while out.len() < count {
            match c.recv_response()? {
                Value::Push { .. } => {}
                v => out.push(v),
            }
        }
        Ok(out)
    }
}

/// Reads the replies of big pipelines in a few large reads instead of
/// hundreds of small ones.
///
/// Redis reads a pipeline 16 KiB at a time and answers each chunk as it
/// goes, so a reader blocked on the socket is woken for every few dozen
/// replies: for a sweep of 10,000 queues, a couple of hundred wake-ups,
/// which cost more CPU than parsing the replies. Before reading a big
/// pipeline's replies we sleep for most of the time the previous one took
/// Redis to answer; the last reply comes no later for it (every reply of
/// a round is handled once the last is in), but it comes with the others.
/// When the replies were all in by the time the sleep ended (we slept too
/// long: Redis got faster), the estimate is halved, so one slow round
/// does not keep later rounds waiting.
#[derive(Debug, Default)]
pub(crate) struct Linger {
    /// How long the last big pipeline took Redis to answer (an estimate).
    last: Duration,
    /// The sleep before reading the current pipeline, and when it ended.
    woke: Option<(Duration, Instant)>,
}

impl Linger {
    /// Pipelines shorter than this are read at once.
    const MIN_COMMANDS: usize = 512;
    /// The longest sleep before reading.
    const MAX: Duration = Duration::from_millis(250);

    /// Call after sending pipelines of at most `count` commands, before
    /// reading their replies: sleeps if they are big.
    pub(crate) fn before_reading(&mut self, count: usize) {
        self.woke = None;
        if count >= Self::MIN_COMMANDS {
            let nap = (self.last * 3 / 4).min(Self::MAX);
            if !nap.is_zero() {
                std::thread::sleep(nap);
                self.woke = Some((nap, Instant::now()));
            }
        }
    }

    /// Call once the replies of pipelines of at most `count` commands,
    /// sent at `sent`, are all in.
    pub(crate) fn answered(&mut self, count: usize, sent: Instant) {
        if count < Self::MIN_COMMANDS {
            return;
        }
        self.last = match self.woke.take() {
            // Reading took a small part of the sleep: the replies were in
            // when we woke, so the answer time is below the sleep, by how
            // much is unknown.
            Some((nap, woke)) if woke.elapsed() < nap / 4 => self.last / 2,
            _ => sent.elapsed(),
        };
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command(&mut self, cmd: &[u8]) -> redis::RedisResult<Value> {
        match self {
            Conn::Node(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands(
        &mut self,
        cmd: &[u8],
        offset: usize,
        count: usize,
    ) -> redis::RedisResult<Vec<Value>> {
        match self {
            Conn::Node(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Node(c) => c.get_db(),
        }
    }

    fn check_connection(&mut self) -> bool {
        match self {
            Conn::Node(c) => c.check_connection(),
        }
    }

    fn is_open(&self) -> bool {
        match self {
            Conn::Node(c) => c.is_open(),
        }
    }
}

/// Idle connections of one kind (short commands, or blocking consumers),
/// all with the same I/O timeout.
pub(crate) struct Pool {
    endpoint: std::sync::Arc<Endpoint>,
    idle: Mutex<Vec<Conn>>,
    io_timeout: Duration,
    max_idle: usize,
    closed: AtomicBool,
}

impl Pool {
    pub(crate) fn new(
        endpoint: std::sync::Arc<Endpoint>,
        io_timeout: Duration,
        max_idle: usize,
    ) -> Pool {
        Pool {
            endpoint,
            idle: Mutex::new(Vec::new()),
            io_timeout,
            max_idle,
            closed: AtomicBool::new(false),
        }
    }

    /// An idle connection (`true`: it was idle, and may have died since)
    /// or a new one.
    pub(crate) fn get(&self) -> Result<(Conn, bool), Error> {
        if self.closed.load(Ordering::Acquire) {
            return Err(shut_down());
        }
        if let Some(c) = self.idle.lock().pop() {
            return Ok((c, true));
        }
        Ok((self.endpoint.open(self.io_timeout)?, false))
    }

    /// Returns a healthy connection for reuse.
    pub(crate) fn put(&self, con: Conn) {
        if !con.is_open() || self.closed.load(Ordering::Acquire) {
            return;
        }
        let mut idle = self.idle.lock();
        if idle.len() < self.max_idle {
            idle.push(con);
        }
    }

    /// Drops every idle connection (they are probably dead too).
    pub(crate) fn clear(&self) {
        self.idle.lock().clear();
    }

    /// Drops every idle connection and refuses to hand out more.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.clear();
    }

    /// Runs `f`, one command (or pipeline), on a connection of this pool,
    /// within the pool's I/O timeout in all.
    ///
    /// An idle connection may have died since its last use (a Redis
    /// restart). If it fails at once with a connection error, the call is
    /// tried once more on a fresh connection with what is left of the time
    /// budget; the commands run through here are idempotent (an offer
    /// carries its id). A call that timed out is never retried: it may
    /// have been applied, and the budget is spent. `access` decides how a
    /// failure after sending is reported (see [`Access`]).
    pub(crate) fn run<R>(
        &self,
        access: Access,
        f: impl FnMut(&mut Conn) -> redis::RedisResult<R>,
    ) -> Result<R, Error> {
        self.try_run(f).map_err(|a| a.into_error(access))
    }

    /// As [`run`](Pool::run), telling a command that was never sent (no
    /// connection) from one that failed (a redis error, possibly a
    /// redirect to follow).
    pub(crate) fn try_run<R>(
        &self,
        mut f: impl FnMut(&mut Conn) -> redis::RedisResult<R>,
    ) -> Result<R, Attempt> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Attempt::NotSent(shut_down()));
        }
        let started = Instant::now();
        let idle = self.idle.lock().pop();
        let was_idle = idle.is_some();
        let mut con = match idle {
            Some(c) => c,
            None => self.open_within(started).map_err(Attempt::NotSent)?,
        };
        match f(&mut con) {
            Ok(r) => {
                self.put_back(con, was_idle);
                Ok(r)
            }
            Err(e) if was_idle && is_stale_connection(&e) => {
                // The server closed a connection that sat idle: it went away
                // (a restart) before this command reached it. If it cannot
                // be reached again, it is down: nothing was written.
                drop(con);
                self.clear();
                let mut con = self.open_within(started).map_err(Attempt::NotSent)?;
                let r = f(&mut con).map_err(Attempt::Failed)?;
                self.put_back(con, false);
                Ok(r)
            }
            Err(e) => Err(Attempt::Failed(e)),
        }
    }

    /// As [`run`](Pool::run), but sends `f` once: a pooled connection that
    /// turns out dead is not replaced and the call not resent (for callers
    /// that must tell "applied before" from "applied now").
    pub(crate) fn run_once<R>(
        &self,
        access: Access,
        mut f: impl FnMut(&mut Conn) -> redis::RedisResult<R>,
    ) -> Result<R, Error> {
        let (mut con, was_idle) = self.get()?;
        match f(&mut con) {
            Ok(r) => {
                self.put_back(con, was_idle);
                Ok(r)
            }
            Err(e) => Err(Error::from_redis(e, access)),
        }
    }

    /// A fresh connection whose connect and I/O fit in what is left of a
    /// call's budget (the pool's I/O timeout) since `started`.
    fn open_within(&self, started: Instant) -> Result<Conn, Error> {
        let left = self.io_timeout.saturating_sub(started.elapsed());
        if left < MIN_WAIT {
            return Err(Error::new(
                ErrorKind::Unavailable,
                format!(
                    "no answer from redis at {} within {:?}",
                    self.endpoint.addr(),
                    self.io_timeout
                ),
            ));
        }
        Ok(Conn::Node(self.endpoint.open_raw(left, left)?))
    }

    /// Keeps `con` for reuse, with the pool's I/O timeout again if it was
    /// opened for a shorter budget.
    fn put_back(&self, con: Conn, was_idle: bool) {
        if was_idle || con.set_io_timeout(self.io_timeout).is_ok() {
            self.put(con);
        }
    }
}

/// The driver's connection to one server: opened lazily, dropped when it
/// fails, re-opened by the next round (the driver paces the retries).
pub(crate) struct NodeTransport {
    endpoint: std::sync::Arc<Endpoint>,
    io_timeout: Duration,
    con: Option<Conn>,
    connects: u64,
    round_trips: u64,
    linger: Linger,
}

impl NodeTransport {
    pub(crate) fn new(endpoint: std::sync::Arc<Endpoint>, io_timeout: Duration) -> NodeTransport {
        NodeTransport {
            endpoint,
            io_timeout,
            con: None,
            connects: 0,
            round_trips: 0,
            linger: Linger::default(),
        }
    }

    fn con(&mut self) -> Result<&mut Conn, Error> {
        if self.con.is_none() {
            self.con = Some(self.endpoint.open(self.io_timeout)?);
            self.connects += 1;
        }
        Ok(self.con.as_mut().expect("just opened"))
    }
}

impl Transport for NodeTransport {
    fn round_trip(&mut self, commands: &Commands) -> Result<Vec<Value>, Error> {
        self.round_trips += 1;
        self.con()?;
        let con = self.con.as_mut().expect("opened above");
        let n = commands.len();
        let result = con.send_pipeline(commands.bytes()).and_then(|()| {
            let sent = Instant::now();
            self.linger.before_reading(n);
            let replies = con.recv_pipeline(n)?;
            self.linger.answered(n, sent);
            Ok(replies)
        });
        match result {
            Ok(replies) => Ok(replies),
            Err(e) => {
                self.con = None;
                Err(Error::from_redis(e, Access::Write))
            }
        }
    }

    fn load_script(&mut self, script: &redis::Script) -> Result<(), Error> {
        let con = self.con()?;
        match script.load(con) {
            Ok(_) => Ok(()),
            Err(e) => {
                if !con.is_open() {
                    self.con = None;
                }
                Err(Error::from_redis(e, Access::Read))
            }
        }
    }

    fn connects(&self) -> u64 {
        self.connects
    }

    fn round_trips(&self) -> u64 {
        self.round_trips
    }

    fn measure_clock(&mut self, now: &dyn Fn() -> Duration) -> Option<ClockSample> {
        let con = self.con.as_mut()?;
        match measure(con, now) {
            Ok(sample) => Some(sample),
            Err(e) => {
                tracing::debug!(target: "redwheel::runtime", error = %e, "could not measure the server clock");
                self.con = None;
                None
            }
        }
    }
}

/// How a command on a pooled connection failed.
pub(crate) enum Attempt {
    /// No connection could be had: the command was not sent.
    NotSent(Error),
    /// Redis (or the connection) failed the command.
    Failed(redis::RedisError),
}

impl Attempt {
    /// The caller's error, given whether the command writes.
    pub(crate) fn into_error(self, access: Access) -> Error {
        match self {
            Attempt::NotSent(e) => e,
            Attempt::Failed(e) => Error::from_redis(e, access),
        }
    }
}

/// A connection that died while idle: reset, closed or broken, not slow.
fn is_stale_connection(e: &redis::RedisError) -> bool {
    e.is_connection_dropped() && !e.is_timeout()
}

/// The error of a call made after shutdown.
pub(crate) fn shut_down() -> Error {
    Error::new(ErrorKind::Shutdown, "redwheel is shut down")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_reach_messages() {
        assert_eq!(
            redact("redis://app:s3cret@db:6379/0"),
            "redis://app:***@db:6379/0"
        );
        assert_eq!(redact("redis://:s3cret@db"), "redis://:***@db");
        assert_eq!(redact("redis://db:6379"), "redis://db:6379");
        assert_eq!(redact("not a url"), "not a url");
    }

    #[test]
    fn a_bad_url_is_invalid_input_naming_the_url_without_its_password() {
        let e =
            Endpoint::new("redis://u:pw@host:notaport", &RedwheelOptions::default()).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidUrl);
        assert!(e.is_invalid_input());
        let text = e.to_string();
        assert!(text.contains("invalid redis URL"), "{text}");
        assert!(!text.contains("pw"), "{text}");
    }
}

#[cfg(test)]
mod linger_tests {
    use super::*;

    #[test]
    fn a_slow_round_does_not_keep_later_rounds_sleeping() {
        let mut l = Linger {
            last: Duration::from_secs(1),
            woke: None,
        };
        // Redis now answers at once: each round finds every reply in
        // when it wakes, so the sleep halves round after round.
        let mut naps = Vec::new();
        for _ in 0..6 {
            let sent = Instant::now();
            l.before_reading(Linger::MIN_COMMANDS);
            naps.push(l.woke.map(|(nap, _)| nap).unwrap_or_default());
            l.answered(Linger::MIN_COMMANDS, sent);
        }
        assert_eq!(naps[0], Linger::MAX);
        assert!(naps.windows(2).skip(2).all(|w| w[1] < w[0]), "{naps:?}");
        assert!(naps[5] < Duration::from_millis(100), "{naps:?}");
    }

    #[test]
    fn small_pipelines_are_read_at_once() {
        let mut l = Linger {
            last: Duration::from_secs(1),
            woke: None,
        };
        let sent = Instant::now();
        l.before_reading(Linger::MIN_COMMANDS - 1);
        assert!(l.woke.is_none());
        l.answered(Linger::MIN_COMMANDS - 1, sent);
        assert_eq!(l.last, Duration::from_secs(1));
    }
}
