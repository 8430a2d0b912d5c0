//! [`Queue::consume`]: a pool of worker threads that claim, run a handler,
//! and ack or nack.
//!
//! * Claimer threads (`ConsumerOptions::claimers`, by default one per
//!   worker up to four) share the workers out; each claims for its own free
//!   workers only (as many messages as it has free workers, in one script
//!   call), so nothing waits in local memory: a message is either in Redis
//!   or being handled (but with `claim_ahead`, below). A claimer with one
//!   worker runs the handler itself; several claimers keep several claims
//!   in flight at once.
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
//!   result cannot ack it (by then it is a stale delivery: its claim is no
//!   longer current).
//!
//! * With `ConsumerOptions::claim_ahead`, a second driver job claims
//!   delayed messages up to the window before their due time and hands
//!   each to the workers at its due time, once the server's clock says so
//!   and if the queue has no controls (`ahead/`). Those wait in this
//!   process's memory, but never past their claim: one the workers cannot
//!   start by half its visibility before its claim ends goes back to the
//!   queue, uncounted. The claimers go on claiming what is ready, for the
//!   workers not busy with messages claimed ahead; a delivery that finds
//!   its worker taken by one meanwhile goes back too.
//!
//! Files: `running.rs` (what the threads and the jobs share), `worker.rs`
//! (the claimer and worker threads), `extend.rs` (the visibility job),
//! `ahead/` (the claim-ahead job).

pub(super) mod ahead;
mod extend;
pub(super) mod running;
#[cfg(feature = "async")]
mod stream;
mod worker;

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use parking_lot::Mutex;

#[cfg(feature = "async")]
pub use self::stream::Deliveries;

use self::ahead::AheadJob;
use self::extend::ExtendJob;
use self::running::{Inner, RunHandler, Running};
use self::worker::{Finished, Lane, dispatch, handle, work};
use super::codec::Codec;
use super::delivery::Delivery;
use super::handle::Queue;
use super::options::ConsumerOptions;
use crate::error::{Error, ErrorKind};
use crate::runtime::{Deadline, slot};

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
    /// Stops claiming ahead, if the pool does: gives back what was not
    /// started, sends the last acks.
    stop_ahead: Option<StopAhead>,
    grace: Duration,
}

type StopAhead = Box<dyn FnOnce() + Send + Sync>;

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

impl Consumer {
    /// Messages acked so far (an ack that found its message gone, removed
    /// meanwhile, is not counted).
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
    ///
    /// Returns within `grace` plus one `command_timeout` (the giving back)
    /// even when Redis is unreachable: a message that could not be given
    /// back in that time comes back when its visibility ends. A `grace`
    /// too long to be a point in time (`Duration::MAX`) waits for every
    /// handler.
    pub fn shutdown(mut self, grace: Duration) -> Result<(), Error> {
        self.stop(grace)
    }

    fn stop(&mut self, grace: Duration) -> Result<(), Error> {
        if self.threads.is_empty() {
            return Ok(());
        }
        self.inner.stop.store(true, Ordering::SeqCst);
        let deadline = Instant::now().checked_add(grace);
        let total = self.threads.len();
        let mut ended = 0;
        while ended < total {
            let one = match deadline {
                Some(d) => self.done.recv_deadline(d).is_ok(),
                None => self.done.recv().is_ok(),
            };
            if !one {
                break;
            }
            ended += 1;
        }
        self.inner.abandon.store(true, Ordering::SeqCst);
        (self.unregister)();
        if let Some(stop) = self.stop_ahead.take() {
            stop();
        }
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
                    "{} consumer thread(s) still running after {grace:?}; the messages of running handlers were given back (or come back when their visibility ends)",
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

static CONSUMERS: AtomicU64 = AtomicU64::new(0);

impl<T: Codec> Queue<T> {
    /// Starts a pool of `options.concurrency` worker threads that claim
    /// messages ([`claim`](Queue::claim): at-least-once), run `handler` on
    /// each, ack on `Ok` and nack with backoff on `Err` or a panic.
    ///
    /// Messages are claimed for free workers only: nothing waits in local
    /// memory (with `ConsumerOptions::claim_ahead`, messages claimed ahead
    /// wait for their due time and a worker, never past their claim; see
    /// that option).
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
        let inner = Inner::new();
        let key = self.start_extension(&inner, &options);
        let (done_tx, done) = crossbeam_channel::unbounded();
        let handler = Arc::new(handler);
        let run: RunHandler<Delivery<T>> = {
            let (q, shared, opts) = (self.clone(), Arc::clone(&inner), options.clone());
            Arc::new(move |worker: usize, d: &Delivery<T>| {
                handle(&q, &shared, worker, &opts, &*handler, d)
            })
        };
        let claimers = options.claimer_count();
        // Claiming ahead: a driver job claims, the wheel hands each message
        // to the workers at its due time through a channel they all read.
        let ahead = (!options.claim_ahead.is_zero()).then(|| {
            let (tx, rx) = crossbeam_channel::unbounded::<()>();
            let job = AheadJob::start(
                self,
                &inner,
                (
                    options.claim_ahead,
                    options.claim_ahead_max,
                    options.concurrency,
                ),
                tx,
                CONSUMERS.fetch_add(1, Ordering::Relaxed),
            );
            (job, rx)
        });
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
            let lane = if size == 1 && ahead.is_none() {
                Lane::Inline {
                    worker: next_worker,
                    run: Arc::clone(&run),
                }
            } else {
                let (work_tx, work_rx) = crossbeam_channel::bounded::<Delivery<T>>(size);
                let (result_tx, results) = crossbeam_channel::unbounded::<Finished>();
                let busy = Arc::new(AtomicUsize::new(0));
                let lane_ahead = ahead
                    .as_ref()
                    .map(|(job, _)| (Arc::clone(job), Arc::clone(&busy)));
                for worker in next_worker..next_worker + size {
                    let (run, work_rx, result_tx) =
                        (Arc::clone(&run), work_rx.clone(), result_tx.clone());
                    let ahead = ahead
                        .as_ref()
                        .map(|(job, rx)| (Arc::clone(job), rx.clone(), Arc::clone(&busy)));
                    started = started.and_then(|()| {
                        spawn(
                            format!("redwheel-consumer-{worker}"),
                            Box::new(move || work(worker, &run, &work_rx, &result_tx, ahead)),
                        )
                    });
                }
                Lane::Pool {
                    size,
                    work_tx,
                    results,
                    ahead: lane_ahead,
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
        let stop_ahead: Option<StopAhead> = ahead.map(|(job, rx)| -> StopAhead {
            Box::new(move || {
                drop(rx);
                job.stop();
            })
        });
        if let Err(e) = started {
            inner.stop.store(true, Ordering::SeqCst);
            inner.abandon.store(true, Ordering::SeqCst);
            rt.driver.unregister(&key);
            if let Some(stop) = stop_ahead {
                stop();
            }
            return Err(e);
        }
        let release = {
            let q = self.clone();
            move |still: &[Running]| {
                // One command timeout for them all: with Redis unreachable
                // the first one uses it up, and shutdown does not wait one
                // more per message.
                let until = Instant::now().checked_add(q.rt().options.command_timeout);
                for r in still {
                    if until.is_some_and(|u| Instant::now() >= u) {
                        tracing::warn!(target: "redwheel::queue", queue = %q.state.name, id = %r.id, "no time left to give a message back at shutdown; it comes back when its visibility ends");
                        continue;
                    }
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
            stop_ahead,
            grace: options.shutdown_grace,
        })
    }

    /// Registers the extension job of a consumer (a pool, or a stream of
    /// deliveries) whose running messages are `inner.running`; returns
    /// its driver key.
    fn start_extension(&self, inner: &Arc<Inner>, options: &ConsumerOptions) -> String {
        // One per consumer, on the shared driver.
        let period = (self.visibility / 3).max(Duration::from_millis(1));
        let key = format!(
            "consumer {} {}",
            self.state.name,
            CONSUMERS.fetch_add(1, Ordering::Relaxed)
        );
        let job = Arc::new(ExtendJob {
            inner: Arc::clone(inner),
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
        self.rt()
            .driver
            .register(&key, job, Deadline::After(period), None);
        key
    }

    /// Gives a running message back with no delay (shutdown).
    fn release(&self, r: &Running, why: &str) -> Result<(), Error> {
        self.nack_claim(&r.id, &r.token, 0, why).map(drop)
    }
}
