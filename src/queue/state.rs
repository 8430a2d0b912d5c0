//! Per-queue state shared by the handles of one queue in one `Redwheel`
//! and its transfer job.
//!
//! Layer 3 of `queue/` (see `ARCHITECTURE.md`): above the base and the
//! job (`job.rs`), below the handle; what it holds is defined below it.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

#[cfg(feature = "async")]
use super::asynk::coalesce::{AckBatcher, OfferBatcher};
use super::gate::Gate;
use super::job::AheadKeys;
use super::keys::Keys;
use super::transfer::TransferJob;
use crate::telemetry::QueueMetrics;

/// One open queue, as its handles see it.
pub(crate) struct QueueState {
    pub name: String,
    pub keys: Keys,
    /// The driver's key for this queue's transfer job.
    pub job_key: String,
    /// Its transfer job (registered with the driver by the first open).
    pub transfer: Arc<TransferJob>,
    /// Its metric handles (no-ops without the `metrics` feature).
    pub metrics: QueueMetrics,
    /// Where its consumers wait while the controls hold them back.
    pub gate: Arc<Gate>,
    /// Whether this process has seen the queue's controls hash: until it
    /// has, `take.lua` and `claim.lua` are sent with the keys a queue
    /// without controls needs (`TAKE_PLAIN_KEYS`, `CLAIM_PLAIN_KEYS`), and
    /// a script that finds the controls sends the caller back for the
    /// whole list ([`pop::NEEDS_ALL_KEYS`](super::pop::NEEDS_ALL_KEYS)),
    /// which it uses from then on.
    pub controls_seen: AtomicBool,
    /// This process's consumer pools that claim ahead from the queue
    /// (`ConsumerOptions::claim_ahead`): told of its due times a window
    /// early.
    pub ahead: Arc<AheadKeys>,
    /// The acks of `ack_async` waiting to go out together (feature
    /// `async`).
    #[cfg(feature = "async")]
    pub acks: AckBatcher,
    /// The offers of `offer_async` waiting to go out together (feature
    /// `async`).
    #[cfg(feature = "async")]
    pub offers: OfferBatcher,
}

impl QueueState {
    /// A queue's state, its transfer moving up to `batch` ids per call
    /// and sending claims delivered `max_deliveries` times to the dead
    /// letters.
    pub(crate) fn new(name: &str, batch: usize, max_deliveries: u32) -> QueueState {
        let keys = Keys::new(name);
        let gate = Arc::new(Gate::default());
        QueueState {
            name: name.to_owned(),
            job_key: keys.delayed.clone(),
            transfer: Arc::new(TransferJob::new(
                name,
                &keys,
                batch,
                max_deliveries,
                Arc::clone(&gate),
            )),
            metrics: QueueMetrics::new(name),
            keys,
            gate,
            controls_seen: AtomicBool::new(false),
            ahead: Arc::default(),
            #[cfg(feature = "async")]
            acks: Default::default(),
            #[cfg(feature = "async")]
            offers: Default::default(),
        }
    }
}
