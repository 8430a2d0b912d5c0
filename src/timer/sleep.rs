//! [`HashedWheelTimer::sleep`] and [`HashedWheelTimer::sleep_until`]
//! (feature `async`): a future woken by one timeout on the wheel, for any
//! executor (the wheel's worker wakes it; no executor timer is used).
//!
//! The future owns its timeout: dropping it cancels the timeout (the task
//! never runs, the slot goes back to its pool). The task owns a small
//! shared cell; whether it runs or is dropped unrun (the timer was stopped),
//! the cell is fired, so a sleep never hangs: it ends with `Ok(())` at its
//! deadline, or `Err(TimerError::Stopped)`.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::handle::HashedWheelTimer;
use super::timeout::Timeout;
use crate::error::TimerError;

/// Not fired yet.
const WAITING: u8 = 0;
/// The timeout ran: the deadline has passed.
const DUE: u8 = 1;
/// The task was dropped unrun: the timer stopped.
const STOPPED: u8 = 2;

/// What a sleep and its wheel task share.
#[derive(Default)]
struct Wake {
    state: AtomicU8,
    waker: Mutex<Option<Waker>>,
}

impl Wake {
    fn fire(&self, state: u8) {
        self.state.store(state, Ordering::Release);
        if let Some(w) = self.waker.lock().take() {
            w.wake();
        }
    }
}

/// Fires its cell when dropped: `DUE` if the task ran, `STOPPED` if the
/// wheel dropped it unrun.
struct OnDrop {
    wake: Arc<Wake>,
    ran: bool,
}

impl Drop for OnDrop {
    fn drop(&mut self) {
        self.wake.fire(if self.ran { DUE } else { STOPPED });
    }
}

impl HashedWheelTimer {
    /// A future that completes `delay` from now, woken by a timeout on this
    /// wheel: never before its deadline, at the end of the tick that holds
    /// it (as any timeout).
    ///
    /// The deadline is taken now; the timeout is put on the wheel at the
    /// first poll (a deadline already past by then completes at once, with
    /// nothing put on the wheel). `Err(TimerError::Stopped)` if the timer
    /// was stopped before the deadline, `Err(TimerError::TooManyPending)`
    /// past `max_pending`. `Send`; it needs no executor of its own.
    ///
    /// **Cancellation**: dropping it cancels its timeout.
    ///
    /// ```
    /// use std::time::Duration;
    /// use redwheel::timer::HashedWheelTimer;
    ///
    /// let timer = HashedWheelTimer::builder().build()?;
    /// # let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    /// # rt.block_on(async {
    /// timer.sleep(Duration::from_millis(20)).await?;
    /// # Ok::<(), redwheel::TimerError>(())
    /// # })?;
    /// # Ok::<(), redwheel::TimerError>(())
    /// ```
    pub fn sleep(&self, delay: Duration) -> Sleep {
        Sleep::new(self, Instant::now().checked_add(delay))
    }

    /// A future that completes at `deadline` (measured against
    /// [`Instant::now`]: for a timer on the system clock), as
    /// [`sleep`](Self::sleep) does.
    pub fn sleep_until(&self, deadline: Instant) -> Sleep {
        Sleep::new(self, Some(deadline))
    }
}

/// The future of [`HashedWheelTimer::sleep`] and
/// [`HashedWheelTimer::sleep_until`].
#[must_use = "a sleep does nothing unless awaited"]
pub struct Sleep {
    timer: HashedWheelTimer,
    /// `None`: too far to represent (never fires).
    deadline: Option<Instant>,
    armed: Option<(Timeout, Arc<Wake>)>,
    done: bool,
}

impl fmt::Debug for Sleep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sleep")
            .field("deadline", &self.deadline)
            .field("armed", &self.armed.is_some())
            .finish_non_exhaustive()
    }
}

impl Sleep {
    fn new(timer: &HashedWheelTimer, deadline: Option<Instant>) -> Sleep {
        Sleep {
            timer: timer.clone(),
            deadline,
            armed: None,
            done: false,
        }
    }

    /// The instant it completes (`None`: too far away to represent).
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }
}

impl Future for Sleep {
    type Output = Result<(), TimerError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        if this.done {
            return Poll::Ready(Ok(()));
        }
        let wake = match &this.armed {
            Some((_, wake)) => Arc::clone(wake),
            None => {
                let delay = match this.deadline {
                    Some(d) => d.saturating_duration_since(Instant::now()),
                    None => Duration::MAX,
                };
                if delay.is_zero() {
                    this.done = true;
                    return Poll::Ready(Ok(()));
                }
                let wake = Arc::new(Wake::default());
                *wake.waker.lock() = Some(cx.waker().clone());
                let mut on_drop = OnDrop {
                    wake: Arc::clone(&wake),
                    ran: false,
                };
                let timeout = this.timer.new_timeout(delay, move |_: &Timeout| {
                    on_drop.ran = true;
                    drop(on_drop);
                });
                match timeout {
                    Ok(t) => {
                        this.armed = Some((t, Arc::clone(&wake)));
                        wake
                    }
                    Err(e) => {
                        this.done = true;
                        return Poll::Ready(Err(e));
                    }
                }
            }
        };
        match wake.state.load(Ordering::Acquire) {
            DUE => {
                this.done = true;
                this.armed = None;
                return Poll::Ready(Ok(()));
            }
            STOPPED => {
                this.done = true;
                this.armed = None;
                return Poll::Ready(Err(TimerError::Stopped));
            }
            _ => {}
        }
        {
            let mut w = wake.waker.lock();
            match &mut *w {
                Some(old) if old.will_wake(cx.waker()) => {}
                slot => *slot = Some(cx.waker().clone()),
            }
        }
        // Fired between the look and the registration.
        match wake.state.load(Ordering::Acquire) {
            WAITING => Poll::Pending,
            _ => {
                cx.waker().wake_by_ref();
                Poll::Pending
            }
        }
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        if let Some((t, _)) = self.armed.take() {
            t.cancel();
        }
    }
}
