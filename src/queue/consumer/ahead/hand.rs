//! From claimed to started: a held message waits for the check before
//! its due time (a wheel timeout per due time, armed [`CHECK_LEAD`] before
//! it by this process's estimate of the server's clock), then, checked,
//! for its due time, then for a worker (`pace.rs`), each step bounded:
//!
//! * the check (`claim_ahead.lua` 'h', in the job's next round) reads the
//!   server's `TIME` and whether the queue has controls. With controls,
//!   everything held goes back (the job). Otherwise the hand-out is armed
//!   `due − TIME` after the reply came: since `TIME` was read before that,
//!   the server's clock then reads at least the due time, whatever the
//!   estimate (one farther off than twice the lead is checked again
//!   closer to the due time); a reply that comes at or after the due time
//!   hands out at once;
//! * each message gets, at the check, the latest instant it may start:
//!   half the visibility before its claim's deadline, by an upper bound of
//!   the server's clock (the check's `TIME` plus the time since the check
//!   was sent). A worker that finds it later gives it back instead, and so
//!   does the job, a wheel timeout at that instant, for those still
//!   waiting for a worker; one given back goes to `delayed` at its due
//!   time (already past), uncounted, and from there to whichever consumer
//!   has a free worker.
//!
//! So a control set in the last moments before a due time (under twice the
//! lead and a round trip) may not stop its messages, as one set after a
//! claim does not stop a claimed message; the queue's wake-up on a control
//! change runs the job, whose claim then sees the controls and gives back
//! what is not handed out yet.

use std::sync::Weak;
use std::sync::atomic::Ordering;
use std::time::Duration;

use redis::Value;

use super::{AheadJob, Claimed, Due, State};
use crate::queue::codec::Codec;
use crate::queue::consumer::running::RunHandler;
use crate::queue::delivery::Delivery;
use crate::runtime::Deadline;

/// How long before a due time (by this process's estimate of the server's
/// clock) its check is asked for: the check's round trip then usually ends
/// before the due time, and the hand-out needs none.
pub(super) const CHECK_LEAD: Duration = Duration::from_millis(5);

impl<T: Codec> AheadJob<T> {
    /// Keeps the claimed messages until their check: one wheel timeout per
    /// due time asks for it.
    pub(super) fn hold(&self, st: &mut State<T>, claims: Vec<Claimed<T>>) {
        let rt = self.q.rt();
        for c in claims {
            let due = c.due;
            st.held += 1;
            st.waiting.entry(due).or_default().push(c);
            if st.timeouts.contains_key(&due) || st.due.contains(&due) {
                continue;
            }
            let until = rt.driver.until_server_ms(due).unwrap_or_else(|| {
                let now = rt.server_now_ms() as i64;
                Duration::from_millis(due.saturating_sub(now).max(0) as u64)
            });
            self.arm_check(st, due, until.saturating_sub(CHECK_LEAD));
        }
    }

    /// The wheel timeout that asks for due time `due`'s check, `delay`
    /// from now.
    fn arm_check(&self, st: &mut State<T>, due: i64, delay: Duration) {
        let me = Weak::clone(&self.me);
        if let Some(t) = self.after(delay, move || {
            if let Some(job) = me.upgrade() {
                job.check_due(due);
            }
        }) {
            st.timeouts.insert(due, t);
        }
    }

    /// Runs `task` on the wheel `delay` from now (at least a tick).
    fn after(
        &self,
        delay: Duration,
        task: impl FnOnce() + Send + 'static,
    ) -> Option<crate::timer::Timeout> {
        self.q
            .rt()
            .driver
            .after(delay.max(Duration::from_micros(1)), task)
    }

    /// The wheel's task shortly before a due time (by this process's
    /// clock): the job's next round checks it.
    fn check_due(&self, due: i64) {
        let mut st = self.st.lock();
        st.timeouts.remove(&due);
        if st.stopped || !st.waiting.contains_key(&due) {
            return;
        }
        st.due.insert(due);
        drop(st);
        self.q.rt().driver.announce(&self.key, Deadline::Now);
    }

    /// Reads the check's reply (`{ now µs, controls }`; sent when the driver's
    /// clock read `sent_at`, for due times `dues`): arms the hand-out of
    /// each due time from the server's `now` (or hands out at once what is
    /// due), checks again one still far off, gives back everything if the
    /// queue has controls.
    pub(super) fn on_check(
        &self,
        st: &mut State<T>,
        reply: &Value,
        sent_at: Duration,
        dues: &[i64],
    ) -> Result<(), crate::error::Error> {
        let (now_us, controls) = self.parse_check(reply)?;
        if controls != 0 {
            self.take_back_all(st);
            return Ok(());
        }
        let lead = CHECK_LEAD.as_micros() as i64;
        for &due in dues {
            st.due.remove(&due);
            let rest = due * 1_000 - now_us;
            if rest > 2 * lead {
                // This process's clock ran well ahead of the server's:
                // check again closer to the due time (counted from the
                // reply's arrival, after `now` was read).
                self.arm_check(st, due, Duration::from_micros((rest - lead) as u64));
                continue;
            }
            let Some(batch) = st.waiting.remove(&due) else {
                continue;
            };
            let mut out: Vec<Due<T>> = Vec::with_capacity(batch.len());
            for c in batch {
                let room = (c.deadline - self.margin_ms) * 1_000 - now_us;
                if room <= 0 {
                    st.held = st.held.saturating_sub(1);
                    st.back.push(c);
                } else {
                    out.push((c, sent_at + Duration::from_micros(room as u64)));
                }
            }
            if out.is_empty() {
                continue;
            }
            st.checked.entry(due).or_default().extend(out);
            if rest <= 0 {
                self.hand_out_locked(st, due);
                continue;
            }
            // `rest` after the reply's arrival the server's clock reads at
            // least `due`: `now` was read before the reply left.
            let me = Weak::clone(&self.me);
            let _ = self.after(Duration::from_micros(rest as u64), move || {
                if let Some(job) = me.upgrade() {
                    job.hand_out(due);
                }
            });
        }
        if !st.back.is_empty() {
            tracing::debug!(target: "redwheel::queue", queue = %self.q.state.name, n = st.back.len(), "consumer: messages claimed ahead were handed out too late to start on their claim; they go back");
        }
        Ok(())
    }

    /// The wheel's task at a checked due time: its messages go to the
    /// workers.
    fn hand_out(&self, due: i64) {
        let mut st = self.st.lock();
        if !st.stopped {
            self.hand_out_locked(&mut st, due);
        }
    }

    /// Hands the checked messages due at `due` to the workers (paced:
    /// `pace.rs`), with the state locked and the job not stopped: `stop`
    /// drains the workers' queue after it has set `stopped`, so it finds
    /// them.
    fn hand_out_locked(&self, st: &mut State<T>, due: i64) {
        let Some(out) = st.checked.remove(&due) else {
            return;
        };
        let Some(latest) = out.iter().map(|(_, l)| *l).min() else {
            return;
        };
        let rt = self.q.rt();
        self.q.state.metrics.delivered(
            out.iter()
                .filter_map(|(c, _)| c.m.as_ref().ok())
                .map(|d| (d.attempt, d.due_ms)),
            || rt.server_now_ms(),
        );
        self.pace.push(out);
        let me = Weak::clone(&self.me);
        let _ = self.after(
            latest.saturating_sub(rt.driver.now()) + Duration::from_millis(1),
            move || {
                if let Some(job) = me.upgrade() {
                    job.sweep();
                }
            },
        );
    }

    /// The wheel's task at a due message's latest start: those still
    /// waiting for a worker past theirs go back in the job's next round.
    fn sweep(&self) {
        let now = self.q.rt().driver.now();
        let mut st = self.st.lock();
        if st.stopped {
            // `stop` takes what is left in the workers' queue.
            return;
        }
        let late = self.pace.take_where(|(_, latest)| *latest < now);
        if late.is_empty() {
            return;
        }
        st.held = st.held.saturating_sub(late.len());
        st.back.extend(late.into_iter().map(|(c, _)| c));
        drop(st);
        self.q.rt().driver.announce(&self.key, Deadline::Now);
    }

    /// The next due message for a woken worker; `None` (and the worker
    /// goes back to sleep) when there is none.
    pub(in crate::queue::consumer) fn next_due(&self) -> Option<Due<T>> {
        self.pace.next()
    }

    /// Runs a message claimed ahead on a worker (a message that did not
    /// decode becomes a dead letter instead), unless it is past its latest
    /// start: then it goes back.
    pub(in crate::queue::consumer) fn run(
        &self,
        worker: usize,
        (c, latest): Due<T>,
        run: &RunHandler<Delivery<T>>,
    ) {
        if self.q.rt().driver.now() > latest {
            self.not_started(vec![c], true);
            return;
        }
        let ack = match c.m {
            Ok(d) => run(worker, &d),
            Err(u) => {
                let e = self
                    .q
                    .dead_on_arrival(&u.id, &u.stored, Some(&u.token), u.cause);
                tracing::warn!(target: "redwheel::queue", queue = %self.q.state.name, id = %u.id, error = %e, "consumer: a message could not be decoded; it is a dead letter now");
                None
            }
        };
        self.finished(ack);
    }

    /// Whether a delivery a claimer claimed, having waited for a worker
    /// busy with messages claimed ahead, is too near the end of its claim
    /// to start (by this process's estimate of the server's clock): it
    /// goes back instead ([`give_back_claim`](Self::give_back_claim)).
    pub(in crate::queue::consumer) fn claim_ending(&self, d: &Delivery<T>) -> bool {
        let now = self.q.rt().server_now_ms() as i64;
        d.visible_until_ms.load(Ordering::Relaxed) as i64 - self.margin_ms <= now
    }

    /// Gives back a delivery of a claimer (see
    /// [`claim_ending`](Self::claim_ending)), uncounted.
    pub(in crate::queue::consumer) fn give_back_claim(&self, d: Delivery<T>) {
        let c = Claimed {
            due: d.due_ms as i64,
            deadline: d.visible_until_ms.load(Ordering::Relaxed) as i64,
            m: Ok(d),
        };
        self.not_started(vec![c], false);
    }

    /// Messages a worker did not start go back: in the job's next round,
    /// or now if the job has stopped (its last give-back is done). `held`:
    /// they were counted as held.
    fn not_started(&self, back: Vec<Claimed<T>>, held: bool) {
        let mut st = self.st.lock();
        if st.stopped {
            drop(st);
            if let Err(e) = self.give_back(&back) {
                tracing::warn!(target: "redwheel::queue", queue = %self.q.state.name, error = %e, "consumer: could not give back a message claimed ahead; it comes back when its visibility ends");
            }
            return;
        }
        if held {
            st.held = st.held.saturating_sub(back.len());
        }
        st.back.extend(back);
        drop(st);
        self.q.rt().driver.announce(&self.key, Deadline::Now);
    }
}
