//! What a consumer pool's threads and its extension job share: the
//! messages being handled now, the counters, the stop flags.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64};
#[cfg(feature = "async")]
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::runtime::Backoff;
#[cfg(feature = "async")]
use crate::runtime::{Cell, Runtime};

/// An ack to send: a message's id and its claim's token.
pub(super) type Ack = (String, String);

/// Runs the handler on a delivery `D` (a `Delivery<T>`) for a worker (by
/// number); returns the ack to send, if any.
pub(super) type RunHandler<D> = Arc<dyn Fn(usize, &D) -> Option<Ack> + Send + Sync>;

/// What the workers and the extension job share.
pub(super) struct Inner {
    pub(super) stop: AtomicBool,
    /// Set after the shutdown grace: stop waiting for running handlers.
    pub(super) abandon: AtomicBool,
    /// Messages being handled now, by worker.
    pub(super) running: Mutex<HashMap<usize, Running>>,
    pub(super) handled: AtomicU64,
    pub(super) failed: AtomicU64,
}

impl Inner {
    /// Nothing running, nothing stopped.
    pub(super) fn new() -> Arc<Inner> {
        Arc::new(Inner {
            stop: AtomicBool::new(false),
            abandon: AtomicBool::new(false),
            running: Mutex::new(HashMap::new()),
            handled: AtomicU64::new(0),
            failed: AtomicU64::new(0),
        })
    }
}

/// A message a worker is handling.
#[derive(Clone)]
pub(crate) struct Running {
    pub(super) id: String,
    pub(super) token: String,
    pub(super) started: Instant,
    pub(super) attempt: u32,
    /// Given back by the extension job (handler timeout) or at shutdown.
    pub(super) released: Arc<AtomicBool>,
}

/// Retry delay after attempt `attempt` failed.
pub(super) fn retry_delay(min: Duration, max: Duration, attempt: u32) -> Duration {
    Backoff::nth(min, max, attempt.max(1))
}

#[cfg(feature = "async")]
/// What a stream and the deliveries it handed out share: the running map
/// the extension job reads, and the job's registration (ended when the
/// last of them is gone).
pub(super) struct Shared {
    pub(super) inner: Arc<Inner>,
    pub(super) rt: Arc<Runtime>,
    pub(super) key: String,
    pub(super) next: AtomicUsize,
    /// Fired when a held delivery is done (room for another claim).
    pub(super) room: Mutex<Arc<Cell>>,
}

#[cfg(feature = "async")]
impl Drop for Shared {
    fn drop(&mut self) {
        self.rt.driver.unregister(&self.key);
    }
}

#[cfg(feature = "async")]
/// A delivery held by a stream: extended until acked, nacked or dropped.
pub(crate) struct Held {
    shared: Arc<Shared>,
    key: usize,
    done: AtomicBool,
}

#[cfg(feature = "async")]
impl Held {
    /// Held as `key` in `shared`'s running map.
    pub(super) fn new(shared: &Arc<Shared>, key: usize) -> Held {
        Held {
            shared: Arc::clone(shared),
            key,
            done: AtomicBool::new(false),
        }
    }

    /// Done with it (acked, nacked, dropped): no longer extended.
    pub(crate) fn done(&self) {
        if !self.done.swap(true, Ordering::AcqRel) {
            self.shared.inner.running.lock().remove(&self.key);
            let room = Arc::clone(&self.shared.room.lock());
            room.fire();
        }
    }
}

#[cfg(feature = "async")]
impl Drop for Held {
    fn drop(&mut self) {
        self.done();
    }
}
