//! The threads of this process waiting for one lock, woken one per unlock.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::time::Instant;

use parking_lot::{Condvar, Mutex};

use super::ctx::Counters;

/// Threads of this process waiting for one lock, woken one per unlock.
///
/// A waiter registers ([`enter`](Waiters::enter)) before its first
/// attempt, so an unlock that lands while an attempt is on the wire is
/// not missed: it leaves a permit, and the next wait returns at once.
pub(crate) struct Waiters {
    st: Mutex<WaitState>,
    cv: Condvar,
    /// Async acquisitions waiting (feature `async`): each release wakes
    /// one of them too.
    #[cfg(feature = "async")]
    pub(crate) futures: std::sync::Arc<crate::runtime::WaitList>,
}

#[derive(Default)]
struct WaitState {
    waiting: usize,
    permits: usize,
    /// Tokens of releases already counted: a release of this process is
    /// seen twice (its own reply and the channel), each woken for once.
    seen: VecDeque<u64>,
}

const SEEN: usize = 64;

impl Waiters {
    pub(super) fn new() -> Waiters {
        Waiters {
            st: Mutex::new(WaitState::default()),
            cv: Condvar::new(),
            #[cfg(feature = "async")]
            futures: Default::default(),
        }
    }

    pub(crate) fn enter(&self, counters: &Counters) {
        self.st.lock().waiting += 1;
        counters.waiting.fetch_add(1, Ordering::Relaxed);
    }

    /// Leaves; `acquired` means whatever woke waiters so far is used up.
    pub(crate) fn leave(&self, acquired: bool, counters: &Counters) {
        counters.waiting.fetch_sub(1, Ordering::Relaxed);
        let mut st = self.st.lock();
        st.waiting -= 1;
        if acquired || st.waiting == 0 {
            st.permits = 0;
        } else {
            st.permits = st.permits.min(st.waiting);
            if st.permits > 0 {
                // It may have been woken for a permit it did not use.
                self.cv.notify_one();
            }
        }
    }

    /// Waits for a permit until `until`; true if it got one.
    pub(crate) fn wait(&self, until: Instant) -> bool {
        let mut st = self.st.lock();
        loop {
            if st.permits > 0 {
                st.permits -= 1;
                return true;
            }
            if self.cv.wait_until(&mut st, until).timed_out() {
                if st.permits > 0 {
                    st.permits -= 1;
                    return true;
                }
                return false;
            }
        }
    }

    /// A release of the hold `token` (0: unknown): wakes one waiter, once
    /// per token.
    pub(crate) fn released(&self, token: u64) {
        {
            let mut st = self.st.lock();
            if token != 0 {
                if let Some(i) = st.seen.iter().position(|&t| t == token) {
                    st.seen.remove(i);
                    return;
                }
                if st.seen.len() == SEEN {
                    st.seen.pop_front();
                }
                st.seen.push_back(token);
            }
            if st.waiting > st.permits {
                st.permits += 1;
                self.cv.notify_one();
            }
        }
        // Woken with the mutex let go: a waker may run lock work inline
        // (an executor that polls a woken task at once).
        #[cfg(feature = "async")]
        self.futures.wake(1);
    }

    /// Every waiter tries again (a subscription just took effect: any
    /// unlock before it was missed).
    pub(crate) fn wake_all(&self) {
        #[cfg(feature = "async")]
        self.futures.wake_all();
        let mut st = self.st.lock();
        st.permits = st.waiting;
        self.cv.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_release_seen_twice_wakes_one_waiter_once() {
        let c = Counters::default();
        let w = Waiters::new();
        w.enter(&c);
        w.enter(&c);
        w.released(7); // our own reply
        w.released(7); // the same release on the channel
        let now = Instant::now();
        assert!(w.wait(now));
        assert!(!w.wait(now), "one permit per release");
        w.released(8);
        assert!(w.wait(now));
        w.leave(false, &c);
        w.leave(true, &c);
        assert_eq!(c.waiting.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_permit_left_by_a_leaving_waiter_goes_to_another() {
        let c = Counters::default();
        let w = Waiters::new();
        w.enter(&c);
        w.enter(&c);
        w.released(1);
        w.leave(false, &c); // leaves without using it
        assert!(w.wait(Instant::now()));
        w.leave(true, &c);
    }

    #[test]
    fn nobody_waiting_keeps_no_permit() {
        let c = Counters::default();
        let w = Waiters::new();
        w.released(3);
        w.enter(&c);
        assert!(!w.wait(Instant::now()));
        w.wake_all();
        assert!(w.wait(Instant::now()));
        w.leave(false, &c);
    }
}
