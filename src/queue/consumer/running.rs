//! What a consumer pool's threads and its extension job share: the
//! messages being handled now, the counters, the stop flags.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::runtime::Backoff;

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
