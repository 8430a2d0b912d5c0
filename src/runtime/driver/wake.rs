//! How the driver thread is woken: its channel's messages, the
//! [`Notifier`] that keeps at most one wake-up in flight, and the wheel's
//! executor that wakes it once per tick.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crossbeam_channel::Sender;

use crate::timer::{Executor, Job as WheelJob};

pub(super) enum Msg {
    Ready,
    Barrier(Sender<()>),
    Stop,
}

/// Wakes the driver thread, at most one message in flight.
#[derive(Clone)]
pub(super) struct Notifier {
    pub(super) tx: Sender<Msg>,
    pub(super) notified: Arc<AtomicBool>,
}

impl Notifier {
    pub(super) fn notify(&self) {
        if !self.notified.swap(true, Ordering::AcqRel) {
            let _ = self.tx.send(Msg::Ready);
        }
    }
}

/// The wheel's executor: runs each expired task at once (it only marks a
/// key, under a short lock) and wakes the driver once per tick.
pub(super) struct TickBatcher(pub(super) Notifier);

impl Executor for TickBatcher {
    fn execute(&self, job: WheelJob) -> Result<(), WheelJob> {
        job.run();
        Ok(())
    }

    fn end_of_tick(&self) {
        self.0.notify();
    }
}
