//! [`Queue::consume`]: a pool of worker threads that claim, run a handler,
//! and ack or nack.
//!
//! * Claimer threads (`ConsumerOptions::claimers`, by default one per
//!   worker up to four) share the workers out; each claims for its own free
//!   workers only (as many messages as it has free workers, in one script
//!   call), so nothing waits in local memory: a message is either in Redis
//!   or being handled. A claimer with one worker runs the handler itself;
//!   several claimers keep several claims in flight at once.
//! * `Ok` acks (the acks of finished handlers travel with the next claim, in
//!   the same script call: at most one round trip per message while
//!   messages keep coming, fewer when several workers free up together);
//!   `Err` (or a panic) nacks with exponential backoff by the message's
//!   attempt number, so after `max_deliveries` failures it lands in the dead
//!   letters.
//! * While a handler runs, a job on the runtime's driver extends its
//!   message's visibility every third of it, for every running handler in
//!   one round trip; it stops the moment the handler returns. A handler
//!   still running after `handler_timeout` is treated as failed: its
//!   message is given back (nacked) by that job, and the handler's late
//!   result cannot ack it (the claim's token is stale by then).

use std::any::Any;
use std::collections::HashMap;
use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use parking_lot::Mutex;
use redis::Value;

use super::reliable::{count_nack, nack_keys};
use super::{Codec, Delivery, Queue};
use crate::error::{Error, ErrorKind};
use crate::runtime::{Backoff, Commands, Deadline, Job, Next, slot};
use crate::scripts::{self, MAX_DUE_MS};

/// Settings of a [`Consumer`] pool.
#[derive(Debug, Clone)]
pub struct ConsumerOptions {
    concurrency: usize,
    claimers: Option<usize>,
    handler_timeout: Option<Duration>,
    retry_min: Duration,
    retry_max: Duration,
    poll: Duration,
    shutdown_grace: Duration,
}

impl Default for ConsumerOptions {
    fn default() -> Self {
        ConsumerOptions {
            concurrency: 1,
            claimers: None,
            handler_timeout: None,
            retry_min: Duration::from_secs(1),
            retry_max: Duration::from_secs(300),
            poll: Duration::from_secs(1),
            shutdown_grace: Duration::from_secs(10),
        }
    }
}

impl ConsumerOptions {
    /// Worker threads, each handling one message at a time (1 ..= 1,024;
    /// default 1).
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n;
        self
    }

    /// Threads that claim messages for the workers (1 ..= `concurrency`;
    /// default `min(concurrency, 4)`). The workers are split among them;
    /// each claims for its own free workers only, in one script call that
    /// also carries their acks. A claimer with a single worker runs the
    /// handler itself. More claimers keep more claims in flight (faster
    /// with short handlers); fewer use fewer connections.
    pub fn claimers(mut self, n: usize) -> Self {
        self.claimers = Some(n);
        self
    }

    /// A handler running longer than this is treated as failed: its
    /// message is given back for a retry while the handler still runs, and
    /// the handler's eventual result is ignored. Default: no limit (the
    /// visibility is extended for as long as the handler runs).
    pub fn handler_timeout(mut self, d: Duration) -> Self {
        self.handler_timeout = Some(d);
        self
    }

    /// Delay before a failed message is delivered again: `min` after the
    /// first attempt, doubling with each attempt up to `max`. Default 1 s to
    /// 5 min.
    pub fn retry_backoff(mut self, min: Duration, max: Duration) -> Self {
        self.retry_min = min;
        self.retry_max = max;
        self
    }

    /// How long an idle worker waits for a message before it looks at the
    /// shutdown flag again (1 ms ..= 60 s; default 1 s). Messages arriving
    /// meanwhile wake it at once.
    pub fn poll(mut self, d: Duration) -> Self {
        self.poll = d;
        self
    }

    /// How long dropping the [`Consumer`] waits for running handlers.
    /// Default 10 s.
    pub fn shutdown_grace(mut self, d: Duration) -> Self {
        self.shutdown_grace = d;
        self
    }

    fn validate(&self) -> Result<(), Error> {
        let bad = |name: &str, reason: String| {
            Err(Error::new(
                ErrorKind::InvalidOption,
                format!("invalid option `{name}`: {reason}"),
            ))
        };
        if self.concurrency == 0 || self.concurrency > 1_024 {
            return bad(
                "concurrency",
                format!("{} is not in 1..=1024", self.concurrency),
            );
        }
        if let Some(n) = self.claimers
            && (n == 0 || n > self.concurrency)
        {
            return bad(
                "claimers",
                format!("{n} is not in 1..={} (the concurrency)", self.concurrency),
            );
        }
        if self.poll < Duration::from_millis(1) || self.poll > Duration::from_secs(60) {
            return bad(
                "poll",
                format!("{:?} is not within 1 ms ..= 60 s", self.poll),
            );
        }
        if self.handler_timeout.is_some_and(|d| d.is_zero()) {
            return bad("handler_timeout", "must be greater than zero".to_owned());
        }
        if self.retry_max < self.retry_min {
            return bad("retry_backoff", "needs min <= max".to_owned());
        }
        Ok(())
    }

    fn claimer_count(&self) -> usize {
        self.claimers.unwrap_or(self.concurrency.min(4))
    }
}

/// A running pool of consumer threads; see [`Queue::consume`].
///
/// Dropping it shuts it down as [`shutdown`](Consumer::shutdown) does, with
/// `ConsumerOptions::shutdown_grace`.
pub struct Consumer {
    inner: Arc<Inner>,
    threads: Vec<JoinHandle<()>>,
    done: Receiver<()>,
    release: Release,
    unregister: Box<dyn Fn() + Send + Sync>,
    grace: Duration,
}

impl fmt::Debug for Consumer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Consumer")
            .field("threads", &self.threads.len())
            .field("running", &self.inner.running.lock().len())
            .field("handled", &self.handled())
            .finish_non_exhaustive()
    }
}

/// Gives the messages of still-running handlers back (shutdown).
type Release = Box<dyn Fn(&[Running]) + Send + Sync>;

/// What the workers and the extension job share.
struct Inner {
    stop: AtomicBool,
    /// Set after the shutdown grace: stop waiting for running handlers.
    abandon: AtomicBool,
    /// Messages being handled now, by worker.
    running: Mutex<HashMap<usize, Running>>,
    handled: AtomicU64,
    failed: AtomicU64,
}

/// A message a worker is handling.
#[derive(Clone)]
pub(crate) struct Running {
    id: String,
    token: String,
    started: Instant,
    attempt: u32,
    /// Given back by the extension job (handler timeout) or at shutdown.
    released: Arc<AtomicBool>,
}

impl Consumer {
    /// Messages acked so far.
    pub fn handled(&self) -> u64 {
        self.inner.handled.load(Ordering::Relaxed)
    }

    /// Messages whose handler failed (returned `Err`, panicked or timed
    /// out) so far.
    pub fn failed(&self) -> u64 {
        self.inner.failed.load(Ordering::Relaxed)
    }

    /// Stops claiming, lets running handlers finish within `grace`, gives
    /// back (nacks with no delay) the messages of handlers still running
    /// then, and joins the threads. Fails with
    /// [`ErrorKind::ShutdownTimeout`] if handlers were still running (their
    /// threads are left to end on their own; their results are ignored).
    pub fn shutdown(mut self, grace: Duration) -> Result<(), Error> {
        self.stop(grace)
    }

    fn stop(&mut self, grace: Duration) -> Result<(), Error> {
        if self.threads.is_empty() {
            return Ok(());
        }
        self.inner.stop.store(true, Ordering::SeqCst);
        let deadline = Instant::now() + grace;
        let total = self.threads.len();
        let mut ended = 0;
        while ended < total && self.done.recv_deadline(deadline).is_ok() {
            ended += 1;
        }
        self.inner.abandon.store(true, Ordering::SeqCst);
        (self.unregister)();
        let still: Vec<Running> = self.inner.running.lock().values().cloned().collect();
        if !still.is_empty() {
            for r in &still {
                r.released.store(true, Ordering::SeqCst);
            }
            (self.release)(&still);
        }
        let threads = std::mem::take(&mut self.threads);
        if ended < total {
            // Handlers still running: their threads are not joined.
            return Err(Error::new(
                ErrorKind::ShutdownTimeout,
                format!(
                    "{} handler(s) still running after {grace:?}; their messages were given back",
                    total - ended
                ),
            ));
        }
        for t in threads {
            let _ = t.join();
        }
        Ok(())
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        let grace = self.grace;
        if let Err(e) = self.stop(grace) {
            tracing::warn!(target: "redwheel::queue", error = %e, "consumer shutdown on drop did not finish");
        }
    }
}

/// Sends on drop: a worker thread has ended.
struct Done(Sender<()>);

impl Drop for Done {
    fn drop(&mut self) {
        let _ = self.0.send(());
    }
}

fn panic_text(panic: &(dyn Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-string panic payload".to_owned())
}

static CONSUMERS: AtomicU64 = AtomicU64::new(0);

impl<T: Codec> Queue<T> {
    /// Starts a pool of `options.concurrency` worker threads that claim
    /// messages ([`claim`](Queue::claim): at-least-once), run `handler` on
    /// each, ack on `Ok` and nack with backoff on `Err` or a panic.
    ///
    /// Messages are claimed for free workers only: nothing waits in local
    /// memory.
    /// The visibility of running handlers is extended by the runtime's
    /// driver while they run; see the module docs of `consumer` for the
    /// handler timeout. Stop it with [`Consumer::shutdown`].
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use redwheel::{ConsumerOptions, Redwheel};
    ///
    /// let rw = Redwheel::connect("redis://127.0.0.1:6379")?;
    /// let q = rw.queue::<String>("emails")?;
    /// let consumer = q.consume(ConsumerOptions::default().concurrency(4), |d| {
    ///     if d.payload().is_empty() {
    ///         return Err("an empty address"); // retried with backoff, then a dead letter
    ///     }
    ///     println!("sending to {}", d.payload());
    ///     Ok(())
    /// })?;
    /// // … later:
    /// consumer.shutdown(Duration::from_secs(20))?;
    /// # Ok::<(), redwheel::Error>(())
    /// ```
    pub fn consume<F, E>(&self, options: ConsumerOptions, handler: F) -> Result<Consumer, Error>
    where
        F: Fn(&Delivery<T>) -> Result<(), E> + Send + Sync + 'static,
        E: fmt::Display,
    {
        options.validate().map_err(|e| self.tag(e))?;
        let rt = self.rt();
        if rt.is_shut_down() {
            return Err(self.tag(crate::runtime::shut_down()));
        }
        let inner = Arc::new(Inner {
            stop: AtomicBool::new(false),
            abandon: AtomicBool::new(false),
            running: Mutex::new(HashMap::new()),
            handled: AtomicU64::new(0),
            failed: AtomicU64::new(0),
        });
        // The extension job: one per consumer pool, on the shared driver.
        let period = (self.visibility / 3).max(Duration::from_millis(1));
        let key = format!(
            "consumer {} {}",
            self.state.name,
            CONSUMERS.fetch_add(1, Ordering::Relaxed)
        );
        let job = Arc::new(ExtendJob {
            inner: Arc::clone(&inner),
            state: Arc::clone(&self.state),
            slot: slot(self.state.keys.inflight.as_bytes()),
            visibility_ms: self.visibility.as_millis().clamp(1, u128::from(u32::MAX)) as u64,
            period,
            handler_timeout: options.handler_timeout,
            retry_min: options.retry_min,
            retry_max: options.retry_max,
            max_deliveries: self.max_deliveries,
            sent: Mutex::new(Vec::new()),
        });
        rt.driver.register(&key, job, Deadline::After(period), None);
        let (done_tx, done) = crossbeam_channel::unbounded();
        let handler = Arc::new(handler);
        let run: RunHandler<T> = {
            let (q, shared, opts) = (self.clone(), Arc::clone(&inner), options.clone());
            Arc::new(move |worker: usize, d: &Delivery<T>| {
                handle(&q, &shared, worker, &opts, &*handler, d)
            })
        };
        let claimers = options.claimer_count();
        let mut threads = Vec::with_capacity(options.concurrency + claimers);
        let mut spawn = |name: String, f: Box<dyn FnOnce() + Send>| -> Result<(), Error> {
            let done = Done(done_tx.clone());
            match thread::Builder::new().name(name).spawn(move || {
                let _done = done;
                f();
            }) {
                Ok(t) => {
                    threads.push(t);
                    Ok(())
                }
                Err(e) => Err(self.tag(
                    Error::new(ErrorKind::Spawn, "could not start a consumer thread").with_cause(e),
                )),
            }
        };
        // The workers are split among the claimers; each claimer claims for
        // its own free workers (one round trip for as many messages as they
        // are, the finished ones' acks included) and hands each message to
        // one of them, or runs the handler itself if it has only one.
        let mut started: Result<(), Error> = Ok(());
        let mut next_worker = 0;
        for c in 0..claimers {
            let size =
                options.concurrency / claimers + usize::from(c < options.concurrency % claimers);
            let lane = if size == 1 {
                Lane::Inline {
                    worker: next_worker,
                    run: Arc::clone(&run),
                }
            } else {
                let (work_tx, work_rx) = crossbeam_channel::bounded::<Delivery<T>>(size);
                let (result_tx, results) = crossbeam_channel::unbounded::<Option<Ack>>();
                for worker in next_worker..next_worker + size {
                    let (run, work_rx, result_tx) =
                        (Arc::clone(&run), work_rx.clone(), result_tx.clone());
                    started = started.and_then(|()| {
                        spawn(
                            format!("redwheel-consumer-{worker}"),
                            Box::new(move || {
                                while let Ok(d) = work_rx.recv() {
                                    if result_tx.send(run(worker, &d)).is_err() {
                                        return;
                                    }
                                }
                            }),
                        )
                    });
                }
                Lane::Pool {
                    size,
                    work_tx,
                    results,
                }
            };
            next_worker += size;
            let (q, shared, opts) = (self.clone(), Arc::clone(&inner), options.clone());
            started = started.and_then(|()| {
                spawn(
                    format!("redwheel-claimer-{c}"),
                    Box::new(move || dispatch(&q, &shared, &opts, &lane)),
                )
            });
        }
        if let Err(e) = started {
            inner.stop.store(true, Ordering::SeqCst);
            inner.abandon.store(true, Ordering::SeqCst);
            rt.driver.unregister(&key);
            return Err(e);
        }
        let release = {
            let q = self.clone();
            move |still: &[Running]| {
                for r in still {
                    if let Err(e) = q.release(r, "released at shutdown") {
                        tracing::warn!(target: "redwheel::queue", queue = %q.state.name, id = %r.id, error = %e, "could not give a message back at shutdown; it comes back when its visibility ends");
                    }
                }
            }
        };
        let unregister = {
            let rt = std::sync::Arc::clone(rt);
            let key = key.clone();
            move || rt.driver.unregister(&key)
        };
        Ok(Consumer {
            inner,
            threads,
            done,
            release: Box::new(release),
            unregister: Box::new(unregister),
            grace: options.shutdown_grace,
        })
    }

    /// Gives a running message back with no delay (shutdown).
    fn release(&self, r: &Running, why: &str) -> Result<(), Error> {
        self.nack_claim(&r.id, &r.token, 0, why).map(drop)
    }
}

/// Retry delay after attempt `attempt` failed.
fn retry_delay(min: Duration, max: Duration, attempt: u32) -> Duration {
    Backoff::nth(min, max, attempt.max(1))
}

/// An ack to send: a message's id and its claim's token.
type Ack = (String, String);

/// Runs the handler on a message for a worker (by number); returns the ack
/// to send, if any.
type RunHandler<T> = Arc<dyn Fn(usize, &Delivery<T>) -> Option<Ack> + Send + Sync>;

/// One claimer's share of the workers.
enum Lane<T: Codec> {
    /// A single worker: the claimer runs the handler itself.
    Inline { worker: usize, run: RunHandler<T> },
    /// Worker threads fed through a channel, reporting their acks back.
    Pool {
        size: usize,
        work_tx: Sender<Delivery<T>>,
        results: Receiver<Option<Ack>>,
    },
}

/// A claimer thread: claims as many messages as its lane has free workers,
/// sending the finished ones' acks in the same script call (one round trip
/// for all of them), and runs or hands out each message. At shutdown it
/// stops claiming and acks what the running handlers finish.
fn dispatch<T: Codec>(q: &Queue<T>, inner: &Inner, opts: &ConsumerOptions, lane: &Lane<T>) {
    let rt = q.rt();
    let mut backoff = Backoff::new(rt.options.reconnect_min, Duration::from_secs(1));
    let mut acks: Vec<Ack> = Vec::new();
    let mut outstanding = 0usize;
    let size = match lane {
        Lane::Inline { .. } => 1,
        Lane::Pool { size, .. } => *size,
    };
    loop {
        let stopping = inner.stop.load(Ordering::SeqCst);
        if stopping && (outstanding == 0 || inner.abandon.load(Ordering::SeqCst)) && acks.is_empty()
        {
            return;
        }
        if let Lane::Pool { results, .. } = lane {
            // All workers busy (or stopping with handlers running): wait
            // for one.
            if outstanding == size || (stopping && outstanding > 0) {
                match results.recv_timeout(Duration::from_millis(50)) {
                    Ok(r) => {
                        outstanding -= 1;
                        acks.extend(r);
                    }
                    Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                        if acks.is_empty() {
                            continue;
                        }
                    }
                    Err(crossbeam_channel::RecvTimeoutError::Disconnected) => return,
                }
            }
            while let Ok(r) = results.try_recv() {
                outstanding -= 1;
                acks.extend(r);
            }
        }
        let free = if stopping { 0 } else { size - outstanding };
        if free == 0 && acks.is_empty() {
            continue;
        }
        // While handlers run, wait briefly, so their acks are not held back
        // long; with every worker idle, wait the whole poll interval.
        let wait = if free == 0 {
            Duration::ZERO
        } else if outstanding > 0 {
            opts.poll.min(Duration::from_millis(50))
        } else {
            opts.poll
        };
        let claimed = match q.claim_acking(&acks, free, wait) {
            Ok((claimed, stale)) => {
                backoff.reset();
                let acked = acks.len() as u64 - stale.min(acks.len() as u64);
                inner.handled.fetch_add(acked, Ordering::Relaxed);
                if stale > 0 {
                    tracing::warn!(target: "redwheel::queue", queue = %q.state.name, stale, "consumer: a message was delivered again before its handler's ack; that result is dropped");
                }
                acks.clear();
                claimed
            }
            Err(e) if e.kind() == ErrorKind::Shutdown => return,
            Err(e) => {
                // The acks (idempotent) go again with the next call.
                tracing::warn!(target: "redwheel::queue", queue = %q.state.name, error = %e, "consumer: claim failed; retrying");
                thread::sleep(backoff.step().min(opts.poll));
                continue;
            }
        };
        for d in claimed {
            let d = match d {
                Ok(d) => d,
                Err(e) => {
                    tracing::warn!(target: "redwheel::queue", queue = %q.state.name, id = e.message_id().unwrap_or_default(), error = %e, "consumer: a message could not be decoded; it is a dead letter now");
                    continue;
                }
            };
            match lane {
                Lane::Inline { worker, run } => acks.extend(run(*worker, &d)),
                Lane::Pool { work_tx, .. } => {
                    outstanding += 1;
                    if work_tx.send(d).is_err() {
                        return;
                    }
                }
            }
        }
    }
}

/// Runs the handler on `d`; on success returns the ack to send, on failure
/// nacks it with backoff.
fn handle<T: Codec, E: fmt::Display>(
    q: &Queue<T>,
    inner: &Inner,
    worker: usize,
    opts: &ConsumerOptions,
    handler: &(dyn Fn(&Delivery<T>) -> Result<(), E> + Send + Sync),
    d: &Delivery<T>,
) -> Option<(String, String)> {
    let released = Arc::new(AtomicBool::new(false));
    inner.running.lock().insert(
        worker,
        Running {
            id: d.id().as_str().to_owned(),
            token: d.token().to_owned(),
            started: Instant::now(),
            attempt: d.attempt(),
            released: Arc::clone(&released),
        },
    );
    let result = catch_unwind(AssertUnwindSafe(|| handler(d)));
    inner.running.lock().remove(&worker);
    if released.load(Ordering::SeqCst) {
        // Timed out (given back by the extension job) or released at
        // shutdown: the result comes too late to count.
        tracing::debug!(target: "redwheel::queue", queue = %q.state.name, id = %d.id(), "consumer: a handler finished after its message was given back; its result is ignored");
        return None;
    }
    let why = match result {
        Ok(Ok(())) => return Some((d.id().as_str().to_owned(), d.token().to_owned())),
        Ok(Err(e)) => {
            let why = e.to_string();
            tracing::debug!(target: "redwheel::queue", queue = %q.state.name, id = %d.id(), attempt = d.attempt(), error = %why, "consumer: handler failed; retrying later");
            why
        }
        Err(panic) => {
            let why = format!("the handler panicked: {}", panic_text(&*panic));
            tracing::warn!(target: "redwheel::queue", queue = %q.state.name, id = %d.id(), attempt = d.attempt(), "consumer: {why}");
            why
        }
    };
    inner.failed.fetch_add(1, Ordering::Relaxed);
    match d.nack_because(
        retry_delay(opts.retry_min, opts.retry_max, d.attempt()),
        &why,
    ) {
        Ok(_) => {}
        Err(e) if e.kind() == ErrorKind::StaleDelivery => {
            tracing::warn!(target: "redwheel::queue", queue = %q.state.name, id = %d.id(), "consumer: the message was delivered again before its handler finished; this result is dropped");
        }
        Err(e) => {
            // Not given back: it comes back when its visibility ends.
            tracing::warn!(target: "redwheel::queue", queue = %q.state.name, id = %d.id(), error = %e, "consumer: could not nack; the message comes back when its visibility ends");
        }
    }
    None
}

/// The driver job of one consumer pool: extends the visibility of every
/// running handler's message, or gives it back if the handler ran past its
/// timeout.
struct ExtendJob {
    inner: Arc<Inner>,
    state: Arc<super::state::QueueState>,
    slot: u16,
    visibility_ms: u64,
    period: Duration,
    handler_timeout: Option<Duration>,
    retry_min: Duration,
    retry_max: Duration,
    max_deliveries: u32,
    /// What the last `commands` sent, for `on_reply`.
    sent: Mutex<Vec<(Running, bool)>>,
}

impl Job for ExtendJob {
    fn describe(&self) -> String {
        format!(
            "visibility extension of queue {:?}'s consumer",
            self.state.name
        )
    }

    fn commands(&self, out: &mut Commands) {
        let running: Vec<Running> = self.inner.running.lock().values().cloned().collect();
        let mut sent = self.sent.lock();
        sent.clear();
        for r in running {
            if r.released.load(Ordering::SeqCst) {
                continue;
            }
            let timed_out = self
                .handler_timeout
                .is_some_and(|limit| r.started.elapsed() >= limit);
            let packed = if timed_out {
                let delay = retry_delay(self.retry_min, self.retry_max, r.attempt);
                // Far below MAX_DUE_MS - now for ages: nack.lua adds it to now.
                let delay_ms = u64::try_from(delay.as_millis())
                    .unwrap_or(u64::MAX)
                    .min(MAX_DUE_MS / 2);
                redis::cmd("EVALSHA")
                    .arg(scripts::NACK.get_hash())
                    .arg(8)
                    .arg(&nack_keys(&self.state.keys)[..])
                    .arg(&r.id)
                    .arg(&r.token)
                    .arg(delay_ms)
                    .arg(self.max_deliveries)
                    .arg("the handler timed out")
                    .get_packed_command()
            } else {
                redis::cmd("EVALSHA")
                    .arg(scripts::EXTEND.get_hash())
                    .arg(2)
                    .arg(&self.state.keys.inflight)
                    .arg(&self.state.keys.lease)
                    .arg(&r.id)
                    .arg(&r.token)
                    .arg(self.visibility_ms)
                    .get_packed_command()
            };
            out.push(self.slot, &packed);
            sent.push((r, timed_out));
        }
    }

    fn scripts(&self) -> &[&'static redis::Script] {
        static SCRIPTS: std::sync::LazyLock<[&'static redis::Script; 2]> =
            std::sync::LazyLock::new(|| [&*scripts::EXTEND, &*scripts::NACK]);
        &*SCRIPTS
    }

    fn on_reply(&self, replies: &[Value]) -> Result<Next, Error> {
        let sent = self.sent.lock();
        for ((r, timed_out), reply) in sent.iter().zip(replies) {
            let n = match reply {
                Value::Int(n) => *n,
                _ => continue,
            };
            if *timed_out {
                r.released.store(true, Ordering::SeqCst);
                self.inner.failed.fetch_add(1, Ordering::Relaxed);
                count_nack(&self.state.metrics, n);
                tracing::warn!(target: "redwheel::queue", queue = %self.state.name, id = %r.id, "consumer: a handler ran past its timeout; its message was given back");
            } else if n < 0 {
                // The claim expired before we could extend it (a stalled
                // process): the message is another consumer's now.
                r.released.store(true, Ordering::SeqCst);
                tracing::warn!(target: "redwheel::queue", queue = %self.state.name, id = %r.id, "consumer: a running handler's claim expired before it was extended; its result will be dropped");
            }
        }
        Ok(Next::After(self.period))
    }
}
