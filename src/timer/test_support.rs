//! What the unit tests (`tests.rs`) and the loom models (`loom.rs`) share:
//! drop-counting tasks and slots made by hand. Test builds only.

use super::Timeout;
use super::entry::SlotRef;
use super::producer::Producer;
use super::sync::{Arc, AtomicUsize, Ordering};
use super::task::init_slot;

/// Counts the runs and drops of the tasks it is captured in.
#[derive(Default)]
pub(crate) struct Tally {
    pub(crate) ran: AtomicUsize,
    pub(crate) dropped: AtomicUsize,
}

struct Guard(std::sync::Arc<Tally>);

impl Drop for Guard {
    fn drop(&mut self) {
        self.0.dropped.fetch_add(1, Ordering::SeqCst);
    }
}

/// A task of about `N` bytes (inline up to 8, boxed from 16) that counts
/// its run and its drop into `tally`.
pub(crate) fn task<const N: usize>(
    tally: &std::sync::Arc<Tally>,
) -> impl FnOnce(&Timeout) + Send + 'static {
    let guard = Guard(std::sync::Arc::clone(tally));
    let pad = [7u8; N];
    move |_| {
        std::hint::black_box(pad);
        guard.0.ran.fetch_add(1, Ordering::SeqCst);
    }
}

/// A producer for the calling thread, on no timer.
pub(crate) fn producer() -> Arc<Producer> {
    Arc::new(Producer::detached())
}

/// A fresh slot of `p` (owned by the calling thread) with `refs`
/// references, deadline 42 and the task `f`.
pub(crate) fn new_slot<F>(p: &Arc<Producer>, refs: u32, f: F) -> SlotRef
where
    F: FnOnce(&Timeout) + Send + 'static,
{
    new_slot_due(p, refs, 42, f)
}

/// As [`new_slot`], with the deadline field `deadline` (maybe unresolved:
/// `entry::unresolved`).
pub(crate) fn new_slot_due<F>(p: &Arc<Producer>, refs: u32, deadline: u64, f: F) -> SlotRef
where
    F: FnOnce(&Timeout) + Send + 'static,
{
    // SAFETY: the calling thread owns `p`; the slot is fresh.
    let slot = SlotRef(unsafe { Producer::alloc(Arc::as_ptr(p)) }.expect("an open pool"));
    // SAFETY: as above.
    unsafe { init_slot(slot.0, deadline, refs, f) };
    slot
}
