//! How redwheel's futures wait without an executor of their own (feature
//! `async`): a [`Cell`] that one thread fires and a future awaits, lists of
//! waiters woken by what they wait for ([`WaitList`]: a queue's ready
//! list, a lock's release), waits bounded by a deadline on the driver's
//! wheel ([`Wait`]), and [`detach`], which runs a future to its end on
//! whichever of redwheel's threads wakes it (an unlock after a guard was
//! dropped, a message given back after a take was dropped).
//!
//! Nothing here blocks: firing a cell takes a short lock and wakes a
//! waker; polling only looks at state.
//!
//! # Ground rules
//!
//! * A cell fires at most once per [`reset`](Cell::reset); a waiter resets
//!   its cell **before** each attempt, so a wake-up that lands while the
//!   attempt is on the wire leaves the cell fired and the next wait
//!   returns at once: no wake-up is missed.
//! * A waiter that leaves with its cell fired passes the wake-up on to
//!   another waiter of the list (it may have been meant for any of them).
//! * Every [`Wait`] is also registered with the runtime's shutdown list,
//!   which fires every cell at shutdown (the wheel stops then, and its
//!   timeouts would never fire).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use parking_lot::Mutex;
use slab::Slab;

use crate::timer::{HashedWheelTimer, Timeout};

/// A one-shot wake-up: fired by one side, awaited by a future.
#[derive(Default)]
pub(crate) struct Cell {
    fired: AtomicBool,
    waker: Mutex<Option<Waker>>,
}

impl Cell {
    /// Fires the cell and wakes its waiter, if any.
    pub(crate) fn fire(&self) {
        self.fired.store(true, Ordering::Release);
        let waker = self.waker.lock().take();
        if let Some(w) = waker {
            w.wake();
        }
    }

    /// True once fired (until the next [`reset`](Cell::reset)).
    pub(crate) fn is_fired(&self) -> bool {
        self.fired.load(Ordering::Acquire)
    }

    /// Unfires the cell (before an attempt).
    pub(crate) fn reset(&self) {
        self.fired.store(false, Ordering::Release);
    }

    /// Ready once fired.
    pub(crate) fn poll_fired(&self, cx: &mut Context<'_>) -> Poll<()> {
        if self.is_fired() {
            return Poll::Ready(());
        }
        {
            let mut w = self.waker.lock();
            match &mut *w {
                Some(old) if old.will_wake(cx.waker()) => {}
                slot => *slot = Some(cx.waker().clone()),
            }
        }
        // Fired between the first look and the registration.
        if self.is_fired() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

/// Futures waiting for the same thing (a queue's ready list, a lock's
/// release), woken one at a time or all at once.
#[derive(Default)]
pub(crate) struct WaitList {
    waiters: Mutex<Slab<Arc<Cell>>>,
}

impl WaitList {
    /// Registers a waiter; it stays registered until the ticket is dropped.
    pub(crate) fn register(self: &Arc<Self>) -> Ticket {
        let cell = Arc::new(Cell::default());
        let key = self.waiters.lock().insert(Arc::clone(&cell));
        Ticket {
            list: Arc::clone(self),
            key,
            cell,
        }
    }

    /// Wakes up to `n` waiters that are not woken already; returns how
    /// many it woke.
    pub(crate) fn wake(&self, n: usize) -> usize {
        if n == 0 {
            return 0;
        }
        let mut woken = Vec::new();
        {
            let waiters = self.waiters.lock();
            for (_, cell) in waiters.iter() {
                if woken.len() == n {
                    break;
                }
                if !cell.is_fired() {
                    // Marked under the lock, so two wakers never pick the
                    // same waiter; woken outside it.
                    cell.fired.store(true, Ordering::Release);
                    woken.push(Arc::clone(cell));
                }
            }
        }
        for cell in &woken {
            cell.fire();
        }
        woken.len()
    }

    /// Wakes every waiter.
    pub(crate) fn wake_all(&self) {
        fire_all(&self.waiters);
    }

    /// Waiters registered now.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.waiters.lock().len()
    }
}

/// Fires every cell of `cells` (outside the lock).
fn fire_all(cells: &Mutex<Slab<Arc<Cell>>>) {
    let cells: Vec<Arc<Cell>> = cells.lock().iter().map(|(_, c)| Arc::clone(c)).collect();
    for c in cells {
        c.fire();
    }
}

/// One waiter's place in a [`WaitList`]; leaves it on drop.
pub(crate) struct Ticket {
    list: Arc<WaitList>,
    key: usize,
    cell: Arc<Cell>,
}

impl Ticket {
    /// The waiter's cell.
    pub(crate) fn cell(&self) -> &Arc<Cell> {
        &self.cell
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.list.waiters.lock().try_remove(self.key);
        if self.cell.is_fired() {
            // A wake-up this waiter did not use: another may need it.
            self.list.wake(1);
        }
    }
}

/// The cells of every wait in progress, fired at shutdown.
#[derive(Default)]
pub(crate) struct ShutdownList {
    closed: AtomicBool,
    cells: Mutex<Slab<Arc<Cell>>>,
}

impl ShutdownList {
    /// Fires every registered cell, and every cell registered from now on.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
        fire_all(&self.cells);
    }

    fn add(&self, cell: &Arc<Cell>) -> usize {
        let key = self.cells.lock().insert(Arc::clone(cell));
        if self.closed.load(Ordering::Acquire) {
            cell.fire();
        }
        key
    }

    fn remove(&self, key: usize) {
        self.cells.lock().try_remove(key);
    }
}

/// A wait for `cell` to fire, at most until a deadline on the driver's
/// wheel (which fires the cell), or until shutdown (which fires it too).
/// Cancels its wheel timeout on drop.
pub(crate) struct Wait {
    cell: Arc<Cell>,
    timeout: Option<Timeout>,
    shutdown: Arc<ShutdownList>,
    key: usize,
}

impl Wait {
    /// Waits for `cell`, for `at_most` at most (`None`: no limit).
    pub(crate) fn new(
        cell: &Arc<Cell>,
        at_most: Option<Duration>,
        wheel: &HashedWheelTimer,
        shutdown: &Arc<ShutdownList>,
    ) -> Wait {
        let key = shutdown.add(cell);
        let timeout = at_most.and_then(|d| {
            let c = Arc::clone(cell);
            match wheel.new_timeout(d, move |_: &Timeout| c.fire()) {
                Ok(t) => Some(t),
                Err(_) => {
                    // The wheel is stopped: shutting down.
                    cell.fire();
                    None
                }
            }
        });
        Wait {
            cell: Arc::clone(cell),
            timeout,
            shutdown: Arc::clone(shutdown),
            key,
        }
    }
}

impl Future for Wait {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.cell.poll_fired(cx)
    }
}

impl Drop for Wait {
    fn drop(&mut self) {
        if let Some(t) = self.timeout.take() {
            t.cancel();
        }
        self.shutdown.remove(self.key);
    }
}

/// Runs `fut` to its end with no executor: polled once here, then again on
/// whichever thread wakes it (redwheel's I/O thread, the wheel, a caller
/// firing a cell). For short background work whose every step only looks
/// at state or hands work to another thread: an unlock after its guard
/// was dropped, a message given back after its take was dropped.
pub(crate) fn detach(fut: impl Future<Output = ()> + Send + 'static) {
    let task = Arc::new(Detached {
        fut: Mutex::new(Some(Box::pin(fut))),
        state: AtomicU8::new(IDLE),
    });
    task.run();
}

const IDLE: u8 = 0;
const POLLING: u8 = 1;
/// Woken while being polled: poll again.
const AGAIN: u8 = 2;

type BoxedTask = Pin<Box<dyn Future<Output = ()> + Send>>;

struct Detached {
    fut: Mutex<Option<BoxedTask>>,
    state: AtomicU8,
}

impl Detached {
    fn run(self: Arc<Self>) {
        // Only one thread polls at a time; a wake-up while it polls makes
        // it poll again.
        if self.state.swap(AGAIN, Ordering::AcqRel) != IDLE {
            return;
        }
        let waker = Waker::from(Arc::clone(&self));
        loop {
            self.state.store(POLLING, Ordering::Release);
            {
                let mut slot = self.fut.lock();
                if let Some(fut) = slot.as_mut() {
                    let mut cx = Context::from_waker(&waker);
                    if fut.as_mut().poll(&mut cx).is_ready() {
                        *slot = None;
                    }
                }
            }
            if self
                .state
                .compare_exchange(POLLING, IDLE, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return;
            }
        }
    }
}

impl Wake for Detached {
    fn wake(self: Arc<Self>) {
        self.run();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        Arc::clone(self).run();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn noop_cx() -> Context<'static> {
        Context::from_waker(Waker::noop())
    }

    #[test]
    fn a_wake_up_during_an_attempt_is_not_missed() {
        let list = Arc::new(WaitList::default());
        let t = list.register();
        t.cell().reset(); // before the attempt
        assert_eq!(list.wake(1), 1); // lands during the attempt
        assert!(t.cell().poll_fired(&mut noop_cx()).is_ready());
    }

    #[test]
    fn wake_picks_distinct_waiters_and_an_unused_wake_up_passes_on() {
        let list = Arc::new(WaitList::default());
        let a = list.register();
        let b = list.register();
        assert_eq!(list.wake(1), 1);
        assert!(a.cell().is_fired() != b.cell().is_fired());
        let (fired, other) = if a.cell().is_fired() { (a, b) } else { (b, a) };
        drop(fired);
        assert!(other.cell().is_fired(), "the unused wake-up went on");
        assert_eq!(list.len(), 1);
    }

    #[test]
    fn shutdown_fires_waits_registered_before_and_after() {
        let sd = Arc::new(ShutdownList::default());
        let before = Arc::new(Cell::default());
        let key = sd.add(&before);
        sd.close();
        assert!(before.is_fired());
        let after = Arc::new(Cell::default());
        sd.add(&after);
        assert!(after.is_fired());
        sd.remove(key);
    }

    #[test]
    fn a_detached_future_runs_to_its_end_on_the_waking_thread() {
        let cell = Arc::new(Cell::default());
        let done = Arc::new(AtomicBool::new(false));
        {
            let (cell, done) = (Arc::clone(&cell), Arc::clone(&done));
            detach(async move {
                std::future::poll_fn(|cx| cell.poll_fired(cx)).await;
                done.store(true, Ordering::SeqCst);
            });
        }
        assert!(!done.load(Ordering::SeqCst));
        let c = Arc::clone(&cell);
        std::thread::spawn(move || c.fire()).join().unwrap();
        assert!(done.load(Ordering::SeqCst));
    }
}
