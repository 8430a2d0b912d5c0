//! The worker's exit, once the timer shuts down: it closes the rings,
//! takes every timeout that never ran out of the wheel and the rings,
//! counts out the cancellations still queued, and cancels the rest,
//! handing those whose cancellation it won back to `stop()`.

use super::{Pending, Worker};
use crate::timer::clock::nanos;
use crate::timer::pool::{Frees, release, release_into};
use crate::timer::ring::{Item, item_of};
use crate::timer::shared::Shared;
use crate::timer::sync::Ordering;
use crate::timer::task::drop_task_logged;
use crate::timer::timeout::Timeout;

impl Worker {
    /// The worker's exit: closes the rings and cancels every timeout that
    /// never ran; returns those whose cancellation it won, for `stop()`.
    pub(super) fn finish(mut self) -> Vec<Timeout> {
        let leftovers = self.collect_leftovers();
        cancel_all(&self.shared, leftovers)
    }

    /// Takes every timeout that never ran out of the wheel and the rings,
    /// closes the rings, and counts out the cancellations still queued.
    fn collect_leftovers(&mut self) -> Vec<Pending> {
        let mut leftovers: Vec<Pending> = self.wheel.drain();
        leftovers.extend(self.batch.drain(..));
        let list = {
            let mut reg = self.shared.producers.lock();
            reg.closed = true;
            reg.list.clone()
        };
        let mut cancelled = std::mem::take(&mut self.unseen) + self.cancels.len() as u64;
        for slot in self.cancels.drain(..) {
            release(slot);
        }
        let mut retired_added = 0;
        for p in &list {
            // SAFETY: this is the worker thread, leaving.
            let unseen = unsafe {
                p.close(|entry| match item_of(entry) {
                    Item::Cancel(slot) => {
                        cancelled += 1;
                        release(slot);
                    }
                    Item::New(slot, _) => leftovers.push(slot),
                    Item::Time(_) => {}
                })
            };
            cancelled += u64::from(unseen);
            // Not `added()`: a push racing the close may still count a
            // timeout it is about to take back.
            // SAFETY: this is the worker thread, and the ring is closed.
            retired_added += unsafe { p.ring.accepted() };
        }
        {
            let mut reg = self.shared.producers.lock();
            reg.retired_added += retired_added;
            reg.list.clear();
        }
        self.shared.generation.fetch_add(1, Ordering::SeqCst);
        self.producers.clear();
        // These cancellations were made before the close; their cancellers
        // left the counting to us.
        if cancelled > 0 {
            self.count_out(cancelled);
        }
        // Deadlines still deferred get one: the rings are closed, so every
        // timeout was pushed before this reading. (Once the worker is gone
        // no clock is at hand for them: see `Timeout::deadline`.)
        if self.shared.defers_readings {
            let reading = nanos(self.shared.clock.now());
            for slot in &leftovers {
                slot.resolve(reading);
            }
        }
        leftovers.retain(|e| {
            if e.is_cancelled() {
                release(*e);
                false
            } else {
                true
            }
        });
        leftovers
    }
}

/// Cancels the timeouts the worker collected at its exit and returns those
/// whose cancellation succeeded (a concurrent user `cancel` may have won).
/// They left the wheel and the rings with the final collection, so no ring
/// is involved: they are counted out here.
fn cancel_all(shared: &Shared, leftovers: Vec<Pending>) -> Vec<Timeout> {
    let mut never_ran = Vec::with_capacity(leftovers.len());
    let mut frees = Frees::new();
    for slot in leftovers {
        if slot.try_cancel(0) {
            // SAFETY: we made the move out of `INIT`: the task is ours. A
            // panic in its drop is caught: the others still go.
            unsafe { drop_task_logged(slot) };
            // The worker's reference becomes the returned handle.
            never_ran.push(Timeout { slot });
        } else {
            release_into(slot, &mut frees);
        }
    }
    drop(frees);
    shared.count_out_elsewhere(never_ran.len() as u64);
    never_ran
}
