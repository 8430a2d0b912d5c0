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

/// The timeout ran: the deadline has passed.
const DUE: u8 = 1;
/// The task was dropped unrun: the timer stopped.
const STOPPED: u8 = 2;

/// What a sleep and its wheel task share.
#[derive(Default)]
struct Wake {
    /// 0 until fired, then `DUE` or `STOPPED`.
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
    /// The timeout is put on the wheel now (a zero delay puts nothing
    /// there: the future is ready at once). It ends with
    /// `Err(TimerError::Stopped)` if the timer was (or is) stopped before
    /// the deadline, `Err(TimerError::TooManyPending)` past `max_pending`.
    /// `Send`; it needs no executor of its own, and any executor's waker
    /// will do.
    ///
    /// **Cancellation**: dropping it cancels its timeout (the task never
    /// runs; its slot goes back to the pool).
    ///
    /// ```
    /// use std::time::Duration;
    /// use redwheel::timer::HashedWheelTimer;
    ///
    /// let timer = HashedWheelTimer::builder()
    ///     .tick_duration(Duration::from_millis(1))
    ///     .build()?;
    /// # redwheel_testkit::block_on(async {
    /// timer.sleep(Duration::from_millis(20)).await?;
    /// # Ok::<(), redwheel::TimerError>(())
    /// # })?;
    /// # Ok::<(), redwheel::TimerError>(())
    /// ```
    pub fn sleep(&self, delay: Duration) -> Sleep {
        Sleep::new(self, Instant::now().checked_add(delay), delay)
    }

    /// A future that completes at `deadline` (measured against
    /// [`Instant::now`]: for a timer on the system clock), as
    /// [`sleep`](Self::sleep) does.
    pub fn sleep_until(&self, deadline: Instant) -> Sleep {
        let delay = deadline.saturating_duration_since(Instant::now());
        Sleep::new(self, Some(deadline), delay)
    }
}

/// The future of [`HashedWheelTimer::sleep`] and
/// [`HashedWheelTimer::sleep_until`].
#[must_use = "a sleep does nothing unless awaited"]
pub struct Sleep {
    /// `None`: too far to represent (never fires).
    deadline: Option<Instant>,
    state: State,
}

enum State {
    /// On the wheel.
    Armed(Timeout, Arc<Wake>),
    /// The wheel refused it (reported at the first poll).
    Refused(TimerError),
    Done,
}

impl fmt::Debug for Sleep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sleep")
            .field("deadline", &self.deadline)
            .field("armed", &matches!(self.state, State::Armed(..)))
            .finish_non_exhaustive()
    }
}

impl Sleep {
    fn new(timer: &HashedWheelTimer, deadline: Option<Instant>, delay: Duration) -> Sleep {
        if delay.is_zero() {
            return Sleep {
                deadline,
                state: State::Done,
            };
        }
        let delay = if deadline.is_none() {
            Duration::MAX
        } else {
            delay
        };
        let wake = Arc::new(Wake::default());
        let mut on_drop = OnDrop {
            wake: Arc::clone(&wake),
            ran: false,
        };
        let state = match timer.new_timeout(delay, move |_: &Timeout| {
            on_drop.ran = true;
            drop(on_drop);
        }) {
            Ok(t) => State::Armed(t, wake),
            Err(e) => State::Refused(e),
        };
        Sleep { deadline, state }
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
        let wake = match &this.state {
            State::Done => return Poll::Ready(Ok(())),
            State::Refused(_) => {
                let State::Refused(e) = std::mem::replace(&mut this.state, State::Done) else {
                    unreachable!("just matched")
                };
                return Poll::Ready(Err(e));
            }
            State::Armed(_, wake) => Arc::clone(wake),
        };
        let ready = |this: &mut Sleep, state: u8| -> Option<Poll<Result<(), TimerError>>> {
            let r = match state {
                DUE => Ok(()),
                STOPPED => Err(TimerError::Stopped),
                _ => return None,
            };
            this.state = State::Done;
            Some(Poll::Ready(r))
        };
        if let Some(r) = ready(this, wake.state.load(Ordering::Acquire)) {
            return r;
        }
        {
            let mut w = wake.waker.lock();
            match &mut *w {
                Some(old) if old.will_wake(cx.waker()) => {}
                slot => *slot = Some(cx.waker().clone()),
            }
        }
        // Fired between the look and the registration.
        match ready(this, wake.state.load(Ordering::Acquire)) {
            Some(r) => r,
            None => Poll::Pending,
        }
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        if let State::Armed(t, _) = &self.state {
            t.cancel();
        }
    }
}
