//! Per-queue state shared by the handles of one queue in one `Redwheel`
//! and its transfer job.

use std::sync::Arc;

use super::gate::Gate;
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
    /// The acks of `ack_async` waiting to go out together (feature
    /// `async`).
    #[cfg(feature = "async")]
    pub acks: super::asynk::AckBatcher,
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
            #[cfg(feature = "async")]
            acks: Default::default(),
        }
    }
}
