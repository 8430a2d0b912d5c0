//! Calls of one queue sent together: what comes while an earlier batch is
//! on the wire goes out as the next batch, in one script call; the first
//! call of a quiet queue goes out at once (no waiting for company). The
//! acks of `ack_async` (`acks.rs`) and the offers of `offer_async` and
//! `offer_with_id_async` (`offer.rs`) each have one per queue.
//!
//! Each waiting call gets its answer through an [`Answer`], whose cell
//! wakes its future.
//!
//! The lowest layer of `asynk/`: the queue's state (`queue/state.rs`)
//! holds one [`AckBatcher`] and one [`OfferBatcher`], so they and what
//! waits in them ([`PendingAck`], [`PendingOffer`]) are here, below the
//! state; what sends them is above it (`acks.rs`, `offer.rs`). This file
//! imports nothing of the queue.

use std::future::Future;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::error::{Error, ErrorKind};
use crate::runtime::{Cell, contained, detach};

/// A call's answer, and the cell that wakes its future.
pub(crate) struct Answer<R> {
    pub(crate) cell: Cell,
    reply: Mutex<Option<Result<R, Error>>>,
}

impl<R> Default for Answer<R> {
    fn default() -> Self {
        Answer {
            cell: Cell::default(),
            reply: Mutex::new(None),
        }
    }
}

impl<R> Answer<R> {
    /// Gives the answer and wakes its future (on the batch's task, on
    /// redwheel's thread: a waker that panics stops neither).
    pub(crate) fn set(&self, r: Result<R, Error>) {
        *self.reply.lock() = Some(r);
        contained("a future's waker", || self.cell.fire());
    }

    /// Waits for the answer (`what` names the call in the error of an
    /// answer that never came, which would be a bug).
    pub(crate) async fn wait(&self, what: &str) -> Result<R, Error> {
        std::future::poll_fn(|cx| self.cell.poll_fired(cx)).await;
        self.reply.lock().take().unwrap_or_else(|| {
            Err(Error::new(
                ErrorKind::Protocol,
                format!("{what} gave no answer"),
            ))
        })
    }
}

/// The calls of one queue waiting for the batch on the wire to come back,
/// and whether one is on the wire.
pub(crate) struct Coalescer<P> {
    state: Mutex<(Vec<P>, bool)>,
}

impl<P> Default for Coalescer<P> {
    fn default() -> Self {
        Coalescer {
            state: Mutex::new((Vec::new(), false)),
        }
    }
}

impl<P: Send + 'static> Coalescer<P> {
    /// Queues `item`. If no batch is on the wire, sends what waits now
    /// (this item alone, on a quiet queue) with `send`, on a task of the
    /// runtime's, then each batch that gathered meanwhile, up to `max` a
    /// batch, until none is left. `which` finds this coalescer in `state`
    /// (the queue's state, which holds it).
    pub(crate) fn push<S, Fut>(
        &self,
        state: &Arc<S>,
        which: fn(&S) -> &Coalescer<P>,
        max: usize,
        item: P,
        send: impl Fn(Arc<S>, Vec<P>) -> Fut + Send + 'static,
    ) where
        S: Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let batch = {
            let mut st = self.state.lock();
            st.0.push(item);
            if st.1 {
                return;
            }
            st.1 = true;
            take_batch(&mut st.0, max)
        };
        let state = Arc::clone(state);
        detach(async move {
            let mut batch = batch;
            loop {
                send(Arc::clone(&state), batch).await;
                let mut st = which(&state).state.lock();
                if st.0.is_empty() {
                    st.1 = false;
                    return;
                }
                batch = take_batch(&mut st.0, max);
            }
        });
    }
}

fn take_batch<P>(pending: &mut Vec<P>, max: usize) -> Vec<P> {
    let n = pending.len().min(max);
    pending.drain(..n).collect()
}

/// One ack waiting for its batch (`acks.rs`): what it acks and where its
/// answer goes (the `ack.lua` reply it stands for: 1 acked, 0 gone, -1
/// refused).
pub(crate) struct PendingAck {
    pub(super) id: String,
    pub(super) token: String,
    pub(super) answer: Arc<Answer<i64>>,
}

/// The acks of one queue waiting for the batch on the wire to come back.
pub(crate) type AckBatcher = Coalescer<PendingAck>;

/// One offer of `offer_async` or `offer_with_id_async` waiting for its
/// call (`offer.rs`): its delay (ms), id and encoded payload, and where its
/// answer goes (true: written, false: its id was known).
pub(crate) struct PendingOffer {
    pub(super) ms: u64,
    pub(super) id: String,
    pub(super) bytes: Vec<u8>,
    pub(super) answer: Arc<Answer<bool>>,
}

/// The offers of one queue waiting for the call on the wire to come back.
pub(crate) type OfferBatcher = Coalescer<PendingOffer>;

/// An error for each of a batch's callers (errors are not `Clone`).
pub(crate) fn copy_error(e: &Error) -> Error {
    Error::new(e.kind(), e.to_string())
}
