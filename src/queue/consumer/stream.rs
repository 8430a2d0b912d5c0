//! [`Queue::deliveries`]: claimed deliveries as a `futures_core::Stream`
//! (feature `async`), at-least-once, each extended while it is held, as
//! `consume` extends its running handlers: by the same driver job
//! (`extend.rs`), over the same map of running messages.

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Instant;

use futures_core::Stream;
use parking_lot::Mutex;

use super::running::{Inner, Running, Shared};
use crate::error::{Error, ErrorKind};
use crate::queue::codec::Codec;
use crate::queue::delivery::{Delivery, Held, Holder};
use crate::queue::handle::Queue;
use crate::queue::options::ConsumerOptions;
use crate::runtime::Cell;
use crate::scripts::CLAIM_BATCH_MAX;

type Claiming<T> =
    Pin<Box<dyn Future<Output = Result<Vec<Result<Delivery<T>, Error>>, Error>> + Send>>;

/// The claimed deliveries of a queue, as a [`Stream`]; see
/// [`Queue::deliveries`].
///
/// Dropping it stops claiming; deliveries already handed out stay yours
/// (still extended until you ack, nack or drop them), and the ones claimed
/// but not yet handed out are given back at once.
pub struct Deliveries<T: Codec> {
    q: Queue<T>,
    shared: Arc<Shared>,
    options: ConsumerOptions,
    /// Claimed, not yet handed out (already extended).
    buffer: VecDeque<Result<Delivery<T>, Error>>,
    claiming: Option<Claiming<T>>,
    done: bool,
}

impl<T: Codec> fmt::Debug for Deliveries<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Deliveries")
            .field("queue", &self.q.state.name)
            .field("held", &self.shared.inner.running.lock().len())
            .finish_non_exhaustive()
    }
}

impl<T: Codec> Queue<T> {
    /// The queue's claimed deliveries as a [`Stream`] (feature `async`):
    /// at-least-once, as [`consume`](Queue::consume), for code that wants
    /// the messages in its own tasks.
    ///
    /// The stream claims only while fewer than `options.concurrency`
    /// deliveries it handed out are still held (not acked, nacked or
    /// dropped), waiting up to `options.poll` per claim, so nothing piles
    /// up in memory. While a delivery is held, the runtime's driver extends
    /// its visibility every third of it, in one round trip for all held
    /// deliveries (as `consume` does for running handlers); one held past
    /// `options.handler_timeout` is given back and its ack fails with
    /// [`ErrorKind::StaleDelivery`]. A payload that does not decode is
    /// parked as a dead letter and comes as an `Err` item; the stream goes
    /// on. It ends (`None`) once the `Redwheel` is shut down.
    ///
    /// **Cancellation**: dropping the stream (or a `next()` in progress)
    /// loses nothing: a claim on the wire when it is dropped gives its
    /// messages back (as [`claim_async`](Queue::claim_async) does, also
    /// after a lost reply, and while it parks an undecodable message), and
    /// so does dropping the stream with claimed deliveries not yet handed
    /// out.
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), redwheel::Error> {
    /// use std::future::poll_fn;
    /// use std::pin::pin;
    /// use futures_core::Stream;
    /// use redwheel::{ConsumerOptions, Redwheel};
    ///
    /// let rw = Redwheel::connect("redis://127.0.0.1:6379")?;
    /// let q = rw.queue::<String>("emails")?;
    /// let mut deliveries = pin!(q.deliveries(ConsumerOptions::default().concurrency(8)));
    /// // (or `deliveries.next().await` with futures' or tokio-stream's StreamExt)
    /// while let Some(d) = poll_fn(|cx| deliveries.as_mut().poll_next(cx)).await {
    ///     let d = d?;
    ///     // … send the email …
    ///     d.ack_async().await?;
    /// }
    /// # Ok(()) }
    /// ```
    pub fn deliveries(&self, options: ConsumerOptions) -> Deliveries<T> {
        let inner = Inner::new();
        let invalid = options
            .validate()
            .and_then(|()| {
                if options.claim_ahead.is_zero() {
                    Ok(())
                } else {
                    Err(crate::error::Error::new(
                        crate::error::ErrorKind::InvalidOption,
                        "invalid option `claim_ahead`: a stream of deliveries does not claim ahead (a `consume` pool does)",
                    ))
                }
            })
            .err()
            .map(|e| self.tag(e));
        let key = self.start_extension(&inner, &options);
        let mut buffer = VecDeque::new();
        if let Some(e) = invalid {
            buffer.push_back(Err(e));
        }
        Deliveries {
            q: self.clone(),
            shared: Arc::new(Shared {
                inner,
                rt: Arc::clone(self.rt()),
                key,
                next: AtomicUsize::new(0),
                room: Mutex::new(Arc::new(Cell::default())),
            }),
            options,
            buffer,
            claiming: None,
            done: false,
        }
    }
}

impl<T: Codec> Deliveries<T> {
    /// Deliveries handed out and still held (extended).
    fn held(&self) -> usize {
        self.shared.inner.running.lock().len()
    }

    /// Registers each claimed delivery as held (extended from now on).
    fn hold(&mut self, claims: Vec<Result<Delivery<T>, Error>>) {
        for c in claims {
            self.buffer.push_back(c.map(|mut d| {
                let key = self.shared.next.fetch_add(1, Ordering::Relaxed);
                self.shared.inner.running.lock().insert(
                    key,
                    Running {
                        id: d.id.as_str().to_owned(),
                        token: d.token.clone(),
                        started: Instant::now(),
                        attempt: d.attempt,
                        released: Arc::default(),
                    },
                );
                d.held = Some(Held::new(Arc::clone(&self.shared) as Arc<dyn Holder>, key));
                d
            }));
        }
    }
}

// Nothing of it is pinned in place (the claim in progress is boxed).
impl<T: Codec> Unpin for Deliveries<T> {}

impl<T: Codec> Stream for Deliveries<T> {
    type Item = Result<Delivery<T>, Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        loop {
            if let Some(item) = this.buffer.pop_front() {
                return Poll::Ready(Some(item));
            }
            if this.done {
                return Poll::Ready(None);
            }
            if let Some(claiming) = &mut this.claiming {
                let result = match claiming.as_mut().poll(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(r) => r,
                };
                this.claiming = None;
                match result {
                    Ok(claims) => this.hold(claims),
                    Err(e) if e.kind() == ErrorKind::Shutdown => {
                        this.done = true;
                        return Poll::Ready(None);
                    }
                    Err(e) => return Poll::Ready(Some(Err(e))),
                }
                continue;
            }
            let held = this.held();
            let concurrency = this.options.concurrency.max(1);
            if held >= concurrency {
                // Wait for one to be done; a fresh cell, registered before
                // looking again, so a done in between is not missed.
                let room = Arc::new(Cell::default());
                *this.shared.room.lock() = Arc::clone(&room);
                if this.held() >= concurrency && room.poll_fired(cx).is_pending() {
                    return Poll::Pending;
                }
                continue;
            }
            let n = (concurrency - held).min(CLAIM_BATCH_MAX);
            let (q, wait) = (this.q.clone(), this.options.poll);
            this.claiming = Some(Box::pin(async move { q.claim_some_async(n, wait).await }));
        }
    }
}

impl<T: Codec> Drop for Deliveries<T> {
    fn drop(&mut self) {
        // Claimed but never handed out: give them back at once.
        for d in self.buffer.drain(..).flatten() {
            let Some(held) = &d.held else { continue };
            held.done();
            d.give_back_now("its stream was dropped");
        }
    }
}
