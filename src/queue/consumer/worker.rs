//! The threads of a consumer pool: claimers, which claim for their free
//! workers (the finished ones' acks in the same call), and workers, which
//! run the handler and ack or nack. In a pool that claims ahead, a worker
//! busy with a message claimed ahead is not free: its claimer does not
//! claim for it.

use std::any::Any;
use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};

use super::ahead::AheadJob;
use super::running::{Ack, Inner, RunHandler, Running, retry_delay};
use crate::error::ErrorKind;
use crate::queue::codec::Codec;
use crate::queue::delivery::Delivery;
use crate::queue::handle::Queue;
use crate::queue::options::ConsumerOptions;
use crate::runtime::Backoff;

fn panic_text(panic: &(dyn Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-string panic payload".to_owned())
}

/// One claimer's share of the workers.
pub(super) enum Lane<T: Codec> {
    /// A single worker: the claimer runs the handler itself.
    Inline {
        worker: usize,
        run: RunHandler<Delivery<T>>,
    },
    /// Worker threads fed through a channel, reporting their acks back.
    Pool {
        size: usize,
        work_tx: Sender<Delivery<T>>,
        results: Receiver<Finished>,
        /// In a pool that claims ahead: the job, and how many of the
        /// lane's workers are busy with its messages.
        ahead: Option<(Arc<AheadJob<T>>, Arc<AtomicUsize>)>,
    },
}

/// A worker's share of a pool that claims ahead: the job, the channel that
/// wakes workers for its due messages, and the count of the lane's workers
/// busy with them.
pub(super) type WorkerAhead<T> = (Arc<AheadJob<T>>, Receiver<()>, Arc<AtomicUsize>);

/// What a worker of a lane tells its claimer.
pub(super) enum Finished {
    /// A delivery of the claimer is done: its ack, if it succeeded.
    Claimed(Option<Ack>),
    /// A message claimed ahead is done: the worker may be free again.
    Ahead,
}

/// A claimer thread: claims as many messages as its lane has free workers,
/// sending the finished ones' acks in the same script call (one round trip
/// for all of them), and runs or hands out each message. At shutdown it
/// stops claiming and acks what the running handlers finish.
pub(super) fn dispatch<T: Codec>(
    q: &Queue<T>,
    inner: &Inner,
    opts: &ConsumerOptions,
    lane: &Lane<T>,
) {
    let rt = q.rt();
    let mut backoff = Backoff::new(rt.options.reconnect_min, Duration::from_secs(1));
    let mut acks: Vec<Ack> = Vec::new();
    let mut outstanding = 0usize;
    let size = match lane {
        Lane::Inline { .. } => 1,
        Lane::Pool { size, .. } => *size,
    };
    let busy_ahead = || match lane {
        Lane::Pool {
            ahead: Some((_, busy)),
            ..
        } => busy.load(Ordering::SeqCst),
        _ => 0,
    };
    loop {
        let stopping = inner.stop.load(Ordering::SeqCst);
        if stopping && (outstanding == 0 || inner.abandon.load(Ordering::SeqCst)) && acks.is_empty()
        {
            return;
        }
        if let Lane::Pool { results, .. } = lane {
            let take = |f: Finished, outstanding: &mut usize, acks: &mut Vec<Ack>| {
                if let Finished::Claimed(r) = f {
                    *outstanding -= 1;
                    acks.extend(r);
                }
            };
            // All workers busy (with this claimer's deliveries or messages
            // claimed ahead), or stopping with handlers running: wait for
            // one.
            if outstanding + busy_ahead() >= size || (stopping && outstanding > 0) {
                match results.recv_timeout(Duration::from_millis(50)) {
                    Ok(f) => take(f, &mut outstanding, &mut acks),
                    Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                        if acks.is_empty() {
                            continue;
                        }
                    }
                    Err(crossbeam_channel::RecvTimeoutError::Disconnected) => return,
                }
            }
            while let Ok(f) = results.try_recv() {
                take(f, &mut outstanding, &mut acks);
            }
        }
        let free = if stopping {
            0
        } else {
            size.saturating_sub(outstanding + busy_ahead())
        };
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
        let claimed = match q.claim_acking(&acks, free, (wait, Some(&inner.stop))) {
            Ok(got) => {
                backoff.reset();
                inner.handled.fetch_add(got.acked, Ordering::Relaxed);
                if got.refused > 0 {
                    tracing::warn!(target: "redwheel::queue", queue = %q.state.name, refused = got.refused, "consumer: a message was delivered again before its handler's ack; that result is dropped");
                }
                acks.clear();
                got.deliveries
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
                Lane::Pool {
                    ahead: Some((job, _)),
                    ..
                } if outstanding + busy_ahead() >= size => {
                    // Its worker took a message claimed ahead while the
                    // claim was waiting: it goes back (uncounted) rather
                    // than wait here, unextended.
                    job.give_back_claim(d);
                }
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

/// A worker thread of a lane: runs what its claimer hands it, reporting
/// each result back, and, in a pool that claims ahead, what the wheel hands
/// out at its due time (whose results go to the claim-ahead job; `busy`
/// counts the lane's workers doing that). Ends when its claimer has ended.
pub(super) fn work<T: Codec>(
    worker: usize,
    run: &RunHandler<Delivery<T>>,
    work_rx: &Receiver<Delivery<T>>,
    result_tx: &Sender<Finished>,
    ahead: Option<WorkerAhead<T>>,
) {
    let Some((job, woken, busy)) = ahead else {
        while let Ok(d) = work_rx.recv() {
            if result_tx.send(Finished::Claimed(run(worker, &d))).is_err() {
                return;
            }
        }
        return;
    };
    // A delivery of the claimer, which may have waited while this worker
    // handled messages claimed ahead: one whose claim is near its end goes
    // back instead of starting.
    let claimed = |d: Delivery<T>| {
        let r = if job.claim_ending(&d) {
            job.give_back_claim(d);
            None
        } else {
            run(worker, &d)
        };
        result_tx.send(Finished::Claimed(r)).is_ok()
    };
    loop {
        crossbeam_channel::select! {
            recv(work_rx) -> d => {
                let Ok(d) = d else { return };
                if !claimed(d) {
                    return;
                }
            }
            recv(woken) -> w => {
                if w.is_err() {
                    return;
                }
                // Woken for due messages claimed ahead: handle them until
                // none is left, or the pool stops (what is left then goes
                // back to the queue). A delivery of the claimer (claimed
                // while this worker was free) goes first: it is not
                // extended while it waits.
                loop {
                    if let Ok(d) = work_rx.try_recv() {
                        if !claimed(d) {
                            return;
                        }
                        continue;
                    }
                    busy.fetch_add(1, Ordering::SeqCst);
                    let m = job.next_due();
                    let found = m.is_some();
                    if let Some(m) = m {
                        job.run(worker, m, run);
                    }
                    busy.fetch_sub(1, Ordering::SeqCst);
                    if !found {
                        break;
                    }
                    if result_tx.send(Finished::Ahead).is_err() || job.stopping() {
                        break;
                    }
                }
            }
        }
    }
}

/// Runs the handler on `d`; on success returns the ack to send, on failure
/// nacks it with backoff.
pub(super) fn handle<T: Codec, E: fmt::Display>(
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
