//! [`Redwheel`]: one shared timer, Redis connections and the background
//! threads that move due messages.
//!
//! # Threads and connections (one `Redwheel`)
//!
//! * **Wheel thread** (the [`HashedWheelTimer`]): its timeouts only ask for
//!   a transfer (an atomic swap and a channel send); it never waits on Redis.
//! * **Transfer thread**: receives "transfer queue N now" (coalesced per
//!   queue), runs `transfer.lua` on its own connection, schedules the next
//!   wheel timeout, runs each queue's guard sweep and refreshes the clock
//!   offset estimate. Errors are logged and retried with backoff.
//! * **Subscriber thread**: one pub/sub connection subscribed to the wake
//!   channels of every open queue, polled with a short read timeout so it
//!   picks up new queues and notices shutdown; it reconnects with backoff,
//!   resubscribes, and asks for a sweep of every queue after each reconnect.
//! * **Command connections**: a small pool for short commands (offer,
//!   remove, len, clear), so many threads can offer at once.
//! * **Blocking consumers**: each waiting `take`/`poll` holds its own
//!   connection (from a second pool) and blocks server-side for at most
//!   [`RedwheelOptions::max_block`] at a time, so shutdown is prompt.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use parking_lot::{Mutex, RwLock};
use redis::{Client, Connection, ConnectionLike};

use crate::error::{QueueError, is_unavailable};
use crate::queue::state::{Cmd, QueueState, validate_name};
use crate::queue::{Codec, Queue, QueueOptions};
use crate::scripts;
use crate::timer::HashedWheelTimer;

/// Connection settings of a [`Redwheel`].
#[derive(Debug, Clone)]
pub struct RedwheelOptions {
    connect_timeout: Duration,
    command_timeout: Duration,
    pub(crate) max_block: Duration,
    max_idle_connections: usize,
    clock_refresh: Duration,
}

impl Default for RedwheelOptions {
    fn default() -> Self {
        RedwheelOptions {
            connect_timeout: Duration::from_secs(2),
            command_timeout: Duration::from_secs(5),
            max_block: Duration::from_secs(1),
            max_idle_connections: 16,
            clock_refresh: Duration::from_secs(30),
        }
    }
}

impl RedwheelOptions {
    /// How long opening a connection may take. Default 2 s.
    pub fn connect_timeout(mut self, d: Duration) -> Self {
        self.connect_timeout = d;
        self
    }

    /// Read/write timeout of command connections: a command that gets no
    /// answer in this time fails with [`QueueError::Unavailable`].
    /// Default 5 s.
    pub fn command_timeout(mut self, d: Duration) -> Self {
        self.command_timeout = d;
        self
    }

    /// Longest server-side block of one `take`/`poll` round (`BLMOVE`
    /// timeout); `take` blocks in rounds of this length, so it notices
    /// shutdown within it. 1 ms ..= 1 s; default 1 s.
    pub fn max_block(mut self, d: Duration) -> Self {
        self.max_block = d;
        self
    }

    /// Idle connections kept per pool (commands, blocking consumers).
    /// Default 16.
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

    fn validate(&self) -> Result<(), QueueError> {
        let bad = |name, reason: &str| {
            Err(QueueError::InvalidOption {
                name,
                reason: reason.to_owned(),
            })
        };
        if self.connect_timeout.is_zero() {
            return bad("connect_timeout", "must be greater than zero");
        }
        if self.command_timeout.is_zero() {
            return bad("command_timeout", "must be greater than zero");
        }
        if self.max_block < Duration::from_millis(1) || self.max_block > Duration::from_secs(1) {
            return bad("max_block", "must be within 1 ms ..= 1 s");
        }
        if self.clock_refresh.is_zero() {
            return bad("clock_refresh", "must be greater than zero");
        }
        Ok(())
    }
}

/// A connection to Redis for delayed queues: one shared timer, a pool of
/// connections, a subscriber connection and the transfer thread.
///
/// A cheap `Clone` handle, `Send + Sync`. Dropping the last handle (queue
/// handles count) shuts everything down, as
/// [`shutdown`](Redwheel::shutdown) does.
///
/// ```no_run
/// use std::time::Duration;
/// use redwheel::Redwheel;
///
/// let rw = Redwheel::connect("redis://127.0.0.1:6379")?;
/// let q = rw.queue::<String>("orders")?;
/// let id = q.offer(&"order-42".to_string(), Duration::from_secs(2))?;
/// let m = q.take()?;
/// assert_eq!(m.id(), &id);
/// rw.shutdown(Duration::from_secs(5))?;
/// # Ok::<(), redwheel::QueueError>(())
/// ```
#[derive(Clone)]
pub struct Redwheel {
    handle: Arc<Handle>,
}

/// Owned by `Redwheel` clones (and queue handles) only, never by the
/// background threads: its drop means "the last handle is gone".
struct Handle {
    shared: Arc<Shared>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        if let Err(e) = self.shared.shutdown(Duration::from_secs(5)) {
            tracing::warn!(target: "redwheel::queue", error = %e, "shutdown on drop did not finish");
        }
    }
}

impl fmt::Debug for Redwheel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Redwheel")
            .field("queues", &self.handle.shared.queues.read().len())
            .field("shut_down", &self.handle.shared.is_shutdown())
            .finish_non_exhaustive()
    }
}

impl Redwheel {
    /// Connects to the Redis at `url` (`redis://host:port/db`) with default
    /// options, and starts the background threads.
    ///
    /// Fails with [`QueueError::Unavailable`] if Redis cannot be reached and
    /// [`QueueError::Redis`] for a malformed URL.
    pub fn connect(url: &str) -> Result<Redwheel, QueueError> {
        Redwheel::connect_with(url, RedwheelOptions::default())
    }

    /// As [`connect`](Redwheel::connect), with options.
    pub fn connect_with(url: &str, options: RedwheelOptions) -> Result<Redwheel, QueueError> {
        options.validate()?;
        let client = Client::open(url).map_err(QueueError::Redis)?;
        let timer = HashedWheelTimer::builder()
            .tick_duration(Duration::from_millis(1))
            .ticks_per_wheel(512)
            .thread_name("redwheel-timer")
            .build()?;
        let (tx, rx) = crossbeam_channel::unbounded();
        let (done_tx, done_rx) = crossbeam_channel::unbounded();
        let shared = Arc::new(Shared {
            client,
            options,
            timer,
            shut_down: AtomicBool::new(false),
            pool: Mutex::new(Vec::new()),
            blocking_pool: Mutex::new(Vec::new()),
            queues: RwLock::new(HashMap::new()),
            queues_gen: AtomicU64::new(0),
            tx,
            clock: Mutex::new(None),
            threads: Mutex::new(Vec::new()),
            done_rx,
        });
        // Fail fast when Redis is unreachable; keep the connection.
        let mut con = shared.open_connection(shared.options.command_timeout)?;
        if let Some(sample) = estimate_clock(&mut con) {
            *shared.clock.lock() = Some(sample);
        }
        shared.put_back(con);
        shared.timer.start()?;
        let handle = Arc::new(Handle {
            shared: Arc::clone(&shared),
        });
        let s = Arc::clone(&shared);
        let d = done_tx.clone();
        shared.spawn("redwheel-transfer", move || {
            let _done = Done(d);
            transfer_loop(&s, &rx);
        })?;
        let s = Arc::clone(&shared);
        shared.spawn("redwheel-subscriber", move || {
            let _done = Done(done_tx);
            subscriber_loop(&s);
        })?;
        Ok(Redwheel { handle })
    }

    /// Opens queue `name` carrying payloads of type `T`, with default
    /// options. See [`queue_with`](Redwheel::queue_with).
    pub fn queue<T: Codec>(&self, name: &str) -> Result<Queue<T>, QueueError> {
        self.queue_with(name, QueueOptions::default())
    }

    /// Opens queue `name` (keys `redwheel:{name}:…`) carrying payloads of
    /// type `T`.
    ///
    /// The first open of a name in this `Redwheel` starts its transfer task
    /// (one per queue per `Redwheel`), which runs at once, so messages that
    /// fell due while no process was running move right away. Later opens
    /// share that task; their `transfer_batch` and `guard_interval` are
    /// ignored, their `max_payload_bytes` applies to their handle.
    ///
    /// Fails with [`QueueError::InvalidName`] for an empty name, one over
    /// 200 bytes, or one holding `{`, `}` or control characters.
    pub fn queue_with<T: Codec>(
        &self,
        name: &str,
        options: QueueOptions,
    ) -> Result<Queue<T>, QueueError> {
        validate_name(name)?;
        options.validate()?;
        let shared = &self.handle.shared;
        if shared.is_shutdown() {
            return Err(QueueError::Shutdown);
        }
        let state = {
            let mut queues = shared.queues.write();
            if let Some(state) = queues.get(name) {
                Arc::clone(state)
            } else {
                let state = Arc::new(QueueState::new(
                    name,
                    options.transfer_batch,
                    options.guard_interval,
                ));
                queues.insert(name.to_owned(), Arc::clone(&state));
                shared.queues_gen.fetch_add(1, Ordering::SeqCst);
                // Move whatever fell due while nobody was running.
                state.request(&shared.tx);
                state
            }
        };
        Ok(Queue {
            rw: self.clone(),
            state,
            max_payload: options.max_payload_bytes,
            _payload: PhantomData,
        })
    }

    /// Stops the transfer and subscriber threads and the timer, and waits
    /// up to `timeout` for them to end. Blocked `take`/`poll` calls return
    /// [`QueueError::Shutdown`] within [`RedwheelOptions::max_block`].
    /// Messages stay in Redis; another process (or a later `Redwheel`)
    /// delivers them. A second call returns at once.
    pub fn shutdown(&self, timeout: Duration) -> Result<(), QueueError> {
        self.handle.shared.shutdown(timeout)
    }

    /// True once [`shutdown`](Redwheel::shutdown) was called.
    pub fn is_shut_down(&self) -> bool {
        self.handle.shared.is_shutdown()
    }

    /// Test hook: shifts this process's `server − local` clock estimate by
    /// `ms` (positive: believe the server clock is further ahead), so that
    /// wake-ups announced on the wake channel fire early (or late) on the
    /// wheel. Not part of the API.
    #[doc(hidden)]
    pub fn skew_clock_estimate_for_tests(&self, ms: i64) {
        if let Some(s) = self.handle.shared.clock.lock().as_mut() {
            s.server_ms += ms as f64;
        }
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.handle.shared
    }
}

/// Sends on drop: a background thread has ended.
struct Done(Sender<()>);

impl Drop for Done {
    fn drop(&mut self) {
        let _ = self.0.send(());
    }
}

/// A clock sample: the server's `TIME` (epoch ms, fractional) matched to
/// the local monotonic instant halfway through the round trip.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ClockSample {
    local: Instant,
    server_ms: f64,
    rtt: Duration,
}

/// State shared by the handles and the background threads.
pub(crate) struct Shared {
    client: Client,
    pub(crate) options: RedwheelOptions,
    pub(crate) timer: HashedWheelTimer,
    shut_down: AtomicBool,
    pool: Mutex<Vec<Connection>>,
    blocking_pool: Mutex<Vec<Connection>>,
    queues: RwLock<HashMap<String, Arc<QueueState>>>,
    queues_gen: AtomicU64,
    pub(crate) tx: Sender<Cmd>,
    clock: Mutex<Option<ClockSample>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    done_rx: Receiver<()>,
}

impl Shared {
    pub(crate) fn is_shutdown(&self) -> bool {
        self.shut_down.load(Ordering::SeqCst)
    }

    fn spawn(&self, name: &str, f: impl FnOnce() + Send + 'static) -> Result<(), QueueError> {
        let h = thread::Builder::new()
            .name(name.to_owned())
            .spawn(f)
            .map_err(QueueError::Spawn)?;
        self.threads.lock().push(h);
        Ok(())
    }

    fn shutdown(&self, timeout: Duration) -> Result<(), QueueError> {
        if self.shut_down.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        let deadline = Instant::now() + timeout;
        let _ = self.tx.send(Cmd::Wake);
        for q in self.queues.read().values() {
            q.unschedule();
        }
        if let Err(e) = self.timer.stop() {
            tracing::warn!(target: "redwheel::queue", error = %e, "could not stop the timer");
        }
        let threads = std::mem::take(&mut *self.threads.lock());
        let mut running = threads.len();
        while running > 0 {
            match self.done_rx.recv_deadline(deadline) {
                Ok(()) => running -= 1,
                Err(_) => break,
            }
        }
        if running > 0 {
            return Err(QueueError::ShutdownTimeout { threads: running });
        }
        for h in threads {
            let _ = h.join();
        }
        self.pool.lock().clear();
        self.blocking_pool.lock().clear();
        tracing::debug!(target: "redwheel::queue", "redwheel shut down");
        Ok(())
    }

    fn open_connection(&self, io_timeout: Duration) -> Result<Connection, QueueError> {
        let con = self
            .client
            .get_connection_with_timeout(self.options.connect_timeout)
            .map_err(QueueError::from)?;
        con.set_read_timeout(Some(io_timeout))?;
        con.set_write_timeout(Some(io_timeout))?;
        Ok(con)
    }

    fn put_back(&self, con: Connection) {
        let mut pool = self.pool.lock();
        if pool.len() < self.options.max_idle_connections && !self.is_shutdown() {
            pool.push(con);
        }
    }

    /// Runs `f` on a pooled command connection. A pooled connection may have
    /// died since its last use (a Redis restart): on a connection-level
    /// error the call is retried once on a fresh connection, so the commands
    /// run through here must be idempotent (every redwheel command is: an
    /// offer carries its id).
    pub(crate) fn with_conn<R>(
        &self,
        mut f: impl FnMut(&mut Connection) -> redis::RedisResult<R>,
    ) -> Result<R, QueueError> {
        if self.is_shutdown() {
            return Err(QueueError::Shutdown);
        }
        let pooled = self.pool.lock().pop();
        let was_pooled = pooled.is_some();
        let mut con = match pooled {
            Some(c) => c,
            None => self.open_connection(self.options.command_timeout)?,
        };
        match f(&mut con) {
            Ok(r) => {
                self.put_back(con);
                Ok(r)
            }
            Err(e) if was_pooled && is_unavailable(&e) => {
                drop(con);
                // Stale pooled connections after a restart: drop them all.
                self.pool.lock().clear();
                let mut con = self.open_connection(self.options.command_timeout)?;
                let r = f(&mut con)?;
                self.put_back(con);
                Ok(r)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// A connection for a blocking consumer (read timeout above the
    /// longest server-side block).
    pub(crate) fn blocking_conn(&self) -> Result<Connection, QueueError> {
        if let Some(c) = self.blocking_pool.lock().pop() {
            return Ok(c);
        }
        self.open_connection(self.options.max_block + self.options.command_timeout)
    }

    pub(crate) fn put_back_blocking(&self, con: Connection) {
        let mut pool = self.blocking_pool.lock();
        if pool.len() < self.options.max_idle_connections && !self.is_shutdown() {
            pool.push(con);
        }
    }

    /// The local instant at which the server clock reads `due_ms`, by the
    /// current offset estimate (`None` before any estimate).
    pub(crate) fn server_ms_to_local(&self, due_ms: i64) -> Option<Instant> {
        let s = (*self.clock.lock())?;
        let diff = due_ms as f64 - s.server_ms;
        Some(if diff >= 0.0 {
            let ahead =
                Duration::from_secs_f64((diff / 1000.0).min(MAX_SCHEDULE_AHEAD_MS as f64 / 1000.0));
            s.local + ahead
        } else {
            s.local
                .checked_sub(Duration::from_secs_f64(-diff / 1000.0))
                .unwrap_or_else(Instant::now)
        })
    }

    /// The server's clock now, by the offset estimate, in epoch ms; the
    /// local wall clock before any estimate.
    pub(crate) fn server_now_ms(&self) -> u64 {
        match *self.clock.lock() {
            Some(s) => {
                let now = Instant::now();
                let ms = if now >= s.local {
                    s.server_ms + (now - s.local).as_secs_f64() * 1000.0
                } else {
                    s.server_ms - (s.local - now).as_secs_f64() * 1000.0
                };
                ms.max(0.0) as u64
            }
            None => SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0),
        }
    }

    fn queue_list(&self) -> Vec<Arc<QueueState>> {
        self.queues.read().values().cloned().collect()
    }

    /// Asks for a transfer of every open queue.
    fn sweep_all(&self) {
        for q in self.queues.read().values() {
            q.request(&self.tx);
        }
    }
}

/// Takes three `TIME` samples and keeps the one with the smallest round
/// trip. `None` if Redis did not answer.
fn estimate_clock(con: &mut Connection) -> Option<ClockSample> {
    let mut best: Option<ClockSample> = None;
    for _ in 0..3 {
        let t0 = Instant::now();
        let (secs, micros): (u64, u64) = redis::cmd("TIME").query(con).ok()?;
        let rtt = t0.elapsed();
        let sample = ClockSample {
            local: t0 + rtt / 2,
            server_ms: secs as f64 * 1000.0 + micros as f64 / 1000.0,
            rtt,
        };
        if best.is_none_or(|b| sample.rtt < b.rtt) {
            best = Some(sample);
        }
    }
    best
}

/// Backoff for reconnect attempts: 50 ms doubling up to 2 s.
struct Backoff {
    next: Duration,
}

impl Backoff {
    const MIN: Duration = Duration::from_millis(50);
    const MAX: Duration = Duration::from_secs(2);

    fn new() -> Backoff {
        Backoff { next: Self::MIN }
    }

    fn reset(&mut self) {
        self.next = Self::MIN;
    }

    fn step(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(Self::MAX);
        d
    }
}

/// One transfer script reply: `{ moved, next_due or -1, server now ms,
/// µs past it }`.
fn run_transfer(con: &mut Connection, q: &QueueState) -> redis::RedisResult<(u64, i64, i64, u64)> {
    scripts::TRANSFER
        .key(&q.keys.delayed)
        .key(&q.keys.ready)
        .arg(q.batch)
        .invoke(con)
}

/// Farthest ahead a wheel timeout is scheduled (1 h); a farther head is
/// rescheduled when it fires.
const MAX_SCHEDULE_AHEAD_MS: u64 = 3_600_000;

/// The transfer thread.
fn transfer_loop(shared: &Arc<Shared>, rx: &Receiver<Cmd>) {
    let mut con: Option<Connection> = None;
    let mut backoff = Backoff::new();
    let mut next_connect = Instant::now();
    let mut next_clock = Instant::now() + shared.options.clock_refresh;
    let mut connected_once = false;
    loop {
        if shared.is_shutdown() {
            break;
        }
        let now = Instant::now();
        // Guard sweeps that are due.
        let queues = shared.queue_list();
        let mut wait_until = next_clock;
        for q in &queues {
            let at = *q.next_sweep.lock();
            if at <= now {
                q.request(&shared.tx);
            } else {
                wait_until = wait_until.min(at);
            }
        }
        if now >= next_clock {
            if let Some(c) = con.as_mut()
                && let Some(sample) = estimate_clock(c)
            {
                *shared.clock.lock() = Some(sample);
            }
            next_clock = now + shared.options.clock_refresh;
        }
        let cmd = match rx.recv_deadline(wait_until) {
            Ok(cmd) => cmd,
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => break,
        };
        let q = match cmd {
            Cmd::Transfer(q) => q,
            Cmd::Wake => continue,
        };
        q.begin_run();
        if shared.is_shutdown() {
            break;
        }
        if con.is_none() {
            if Instant::now() < next_connect {
                // Still backing off: try again at the reconnect time.
                *q.next_sweep.lock() = next_connect;
                continue;
            }
            match shared.open_connection(shared.options.command_timeout) {
                Ok(mut c) => {
                    backoff.reset();
                    if let Some(sample) = estimate_clock(&mut c) {
                        *shared.clock.lock() = Some(sample);
                    }
                    con = Some(c);
                    if connected_once {
                        tracing::info!(target: "redwheel::queue", "transfer connection re-established; sweeping every queue");
                        // Whatever fell due during the outage moves now.
                        shared.sweep_all();
                    }
                    connected_once = true;
                }
                Err(e) => {
                    let wait = backoff.step();
                    next_connect = Instant::now() + wait;
                    *q.next_sweep.lock() = next_connect;
                    tracing::warn!(
                        target: "redwheel::queue",
                        queue = %q.name,
                        error = %e,
                        retry_in_ms = wait.as_millis() as u64,
                        "transfer: cannot connect to redis"
                    );
                    continue;
                }
            }
        }
        let Some(c) = con.as_mut() else { continue };
        loop {
            let span = tracing::trace_span!(target: "redwheel::queue", "transfer", queue = %q.name);
            let result = span.in_scope(|| run_transfer(c, &q));
            let received = Instant::now();
            match result {
                Ok((moved, next_due, server_now, now_us)) => {
                    backoff.reset();
                    q.runs.fetch_add(1, Ordering::Relaxed);
                    q.moved.fetch_add(moved, Ordering::Relaxed);
                    *q.next_sweep.lock() = received + q.guard;
                    tracing::trace!(
                        target: "redwheel::queue",
                        queue = %q.name,
                        moved,
                        next_due_ms = next_due,
                        "transfer"
                    );
                    if moved as usize >= q.batch && !shared.is_shutdown() {
                        // A full batch: more may be due; run again at once.
                        continue;
                    }
                    if next_due >= 0 {
                        // Relative to the server's own "now" (to the µs):
                        // no offset error, and never early, since the reply
                        // arrives after the script read the clock. The head
                        // is always ahead here (the script moved everything
                        // due), and a wheel timeout fires a tick later at
                        // the earliest, so this never spins.
                        // A head far away is looked at again within the
                        // hour (and by every guard sweep meanwhile).
                        let ahead_us = ((next_due - server_now).max(1) as u64)
                            .min(MAX_SCHEDULE_AHEAD_MS)
                            .saturating_mul(1_000)
                            .saturating_sub(now_us)
                            .max(1);
                        q.schedule(
                            received + Duration::from_micros(ahead_us),
                            &shared.timer,
                            &shared.tx,
                        );
                    }
                }
                Err(e) => {
                    let wait = backoff.step();
                    next_connect = Instant::now() + wait;
                    *q.next_sweep.lock() = next_connect;
                    tracing::warn!(
                        target: "redwheel::queue",
                        queue = %q.name,
                        error = %e,
                        retry_in_ms = wait.as_millis() as u64,
                        "transfer failed; will retry"
                    );
                    if is_unavailable(&e) || !c.is_open() {
                        con = None;
                    }
                }
            }
            break;
        }
    }
    tracing::debug!(target: "redwheel::queue", "transfer thread ends");
}

/// How long the subscriber blocks on its socket before looking at the
/// shutdown flag and the queue registry again.
const SUBSCRIBER_POLL: Duration = Duration::from_millis(100);

/// The subscriber thread.
fn subscriber_loop(shared: &Arc<Shared>) {
    let mut backoff = Backoff::new();
    let mut first = true;
    while !shared.is_shutdown() {
        let mut con = match shared
            .client
            .get_connection_with_timeout(shared.options.connect_timeout)
        {
            Ok(c) => c,
            Err(e) => {
                let wait = backoff.step();
                tracing::warn!(
                    target: "redwheel::queue",
                    error = %e,
                    retry_in_ms = wait.as_millis() as u64,
                    "subscriber: cannot connect to redis"
                );
                sleep_unless_shutdown(shared, wait);
                continue;
            }
        };
        if let Err(e) = subscribe_and_listen(shared, &mut con, first, &mut backoff) {
            let wait = backoff.step();
            tracing::warn!(
                target: "redwheel::queue",
                error = %e,
                retry_in_ms = wait.as_millis() as u64,
                "subscriber connection lost; reconnecting"
            );
            sleep_unless_shutdown(shared, wait);
        }
        first = false;
    }
    tracing::debug!(target: "redwheel::queue", "subscriber thread ends");
}

fn sleep_unless_shutdown(shared: &Shared, d: Duration) {
    let deadline = Instant::now() + d;
    while !shared.is_shutdown() {
        let now = Instant::now();
        if now >= deadline {
            break;
        }
        thread::sleep((deadline - now).min(SUBSCRIBER_POLL));
    }
}

/// Subscribes to every open queue's wake channel and dispatches wake
/// messages until the connection fails (`Err`) or shutdown (`Ok`).
fn subscribe_and_listen(
    shared: &Arc<Shared>,
    con: &mut Connection,
    first: bool,
    backoff: &mut Backoff,
) -> redis::RedisResult<()> {
    con.set_read_timeout(Some(SUBSCRIBER_POLL))?;
    con.set_write_timeout(Some(shared.options.command_timeout))?;
    let mut ps = con.as_pubsub();
    let mut channels: HashMap<String, Arc<QueueState>> = HashMap::new();
    let mut subscribed: HashSet<String> = HashSet::new();
    let mut seen_gen = u64::MAX;
    let mut connected = false;
    loop {
        if shared.is_shutdown() {
            return Ok(());
        }
        let generation = shared.queues_gen.load(Ordering::SeqCst);
        if generation != seen_gen {
            seen_gen = generation;
            let mut new = Vec::new();
            for q in shared.queue_list() {
                if subscribed.insert(q.keys.wake.clone()) {
                    channels.insert(q.keys.wake.clone(), Arc::clone(&q));
                    new.push(q);
                }
            }
            if !new.is_empty() {
                let names: Vec<&str> = new.iter().map(|q| q.keys.wake.as_str()).collect();
                ps.subscribe(&names)?;
                // A wake published before the subscription took effect was
                // missed: sweep the newly subscribed queues.
                for q in &new {
                    q.request(&shared.tx);
                }
            }
        }
        if !connected {
            connected = true;
            backoff.reset();
            if !first {
                tracing::info!(target: "redwheel::queue", "subscriber reconnected; sweeping every queue");
                shared.sweep_all();
            }
        }
        match ps.get_message() {
            Ok(msg) => {
                let Some(q) = channels.get(msg.get_channel_name()) else {
                    continue;
                };
                let due: i64 = match msg
                    .get_payload::<String>()
                    .ok()
                    .and_then(|s| s.parse().ok())
                {
                    Some(d) => d,
                    None => continue,
                };
                match shared.server_ms_to_local(due) {
                    Some(at) => q.schedule(at, &shared.timer, &shared.tx),
                    None => q.request(&shared.tx),
                }
            }
            Err(e) if e.is_timeout() => {}
            Err(e) => return Err(e),
        }
    }
}
