//! What a consumer pool's threads and its extension job share: the
//! messages being handled now, the counters, the stop flags.

use std::collections::HashMap;
use std::sync::Arc;
#[cfg(feature = "async")]
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

#[cfg(feature = "async")]
use crate::queue::delivery::Holder;
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
impl Holder for Shared {
    /// A held delivery is done with (acked, nacked, dropped): no longer
    /// extended, and room for another claim.
    fn done(&self, key: usize) {
        self.inner.running.lock().remove(&key);
        let room = Arc::clone(&self.room.lock());
        room.fire();
    }
}
