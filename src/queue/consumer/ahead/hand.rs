//! From claimed to started: a held message waits for its due time (a
//! wheel timeout per due time, armed from this process's estimate of the
//! server's clock), then for the check (`claim_ahead.lua` 'h', in the
//! job's next round: the server's `TIME` and whether the queue has
//! controls), then for a worker (`pace.rs`), each step bounded:
//!
//! * before `TIME` reaches the due time, the wheel waits again for the
//!   difference, so nothing starts early by the server's clock, whatever
//!   the estimate;
//! * with controls on the queue, everything held goes back (the job);
//! * each message gets, at the check, the latest instant it may start:
//!   half the visibility before its claim's deadline, by an upper bound of
//!   the server's clock (the check's `TIME` plus the time since the check
//!   was sent). A worker that finds it later gives it back instead, and so
//!   does the job, a wheel timeout at that instant, for those still
//!   waiting for a worker; one given back goes to `delayed` at its due
//!   time (already past), uncounted, and from there to whichever consumer
//!   has a free worker.

use std::sync::Weak;
use std::sync::atomic::Ordering;
use std::time::Duration;

use redis::Value;

use super::{AheadJob, Claimed, Due, State};
use crate::queue::codec::Codec;
use crate::queue::consumer::running::RunHandler;
use crate::queue::delivery::Delivery;
use crate::runtime::Deadline;

impl<T: Codec> AheadJob<T> {
    /// Keeps the claimed messages until their due time: one wheel timeout
    /// per due time asks for the check.
    pub(super) fn hold(&self, st: &mut State<T>, claims: Vec<Claimed<T>>) {
        let rt = self.q.rt();
        for c in claims {
            let due = c.due;
            st.held += 1;
            st.waiting.entry(due).or_default().push(c);
            if st.timeouts.contains_key(&due) || st.due.contains(&due) {
                continue;
            }
            let delay = rt.driver.until_server_ms(due).unwrap_or_else(|| {
                let now = rt.server_now_ms() as i64;
                Duration::from_millis(due.saturating_sub(now).max(0) as u64)
            });
            self.arm(st, due, delay);
        }
    }

    /// The wheel timeout of due time `due`, `delay` from now.
    fn arm(&self, st: &mut State<T>, due: i64, delay: Duration) {
        let me = Weak::clone(&self.me);
        if let Some(t) = self
            .q
            .rt()
            .driver
            .after(delay.max(Duration::from_micros(1)), move || {
                if let Some(job) = me.upgrade() {
                    job.came(due);
                }
            })
        {
            st.timeouts.insert(due, t);
        }
    }

    /// The wheel's task at a due time (by this process's clock): the job's
    /// next round checks it.
    fn came(&self, due: i64) {
        let mut st = self.st.lock();
        st.timeouts.remove(&due);
        if st.stopped || !st.waiting.contains_key(&due) {
            return;
        }
        st.due.insert(due);
        drop(st);
        self.q.rt().driver.announce(&self.key, Deadline::Now);
    }

    /// Reads the check's reply (`{ now, controls }`; sent when the driver's
    /// clock read `sent_at`, for due times `dues`): hands out what is due
    /// by the server's clock, waits again for what is not, gives back
    /// everything if the queue has controls.
    pub(super) fn on_check(
        &self,
        st: &mut State<T>,
        reply: &Value,
        sent_at: Duration,
        dues: &[i64],
    ) -> Result<(), crate::error::Error> {
        let (now, controls) = self.parse_check(reply)?;
        if controls != 0 {
            self.take_back_all(st);
            return Ok(());
        }
        let rt = self.q.rt();
        for &due in dues {
            st.due.remove(&due);
            if due > now {
                // This process's clock ran ahead of the server's: wait for
                // the rest (counted from the reply's arrival, after `now`
                // was read), and check again.
                self.arm(st, due, Duration::from_millis((due - now) as u64));
                continue;
            }
            let Some(batch) = st.waiting.remove(&due) else {
                continue;
            };
            let mut out: Vec<Due<T>> = Vec::with_capacity(batch.len());
            for c in batch {
                let room = c.deadline - self.margin_ms - now;
                if room <= 0 {
                    st.held = st.held.saturating_sub(1);
                    st.back.push(c);
                } else {
                    out.push((c, sent_at + Duration::from_millis(room as u64)));
                }
            }
            let Some(latest) = out.iter().map(|(_, l)| *l).min() else {
                continue;
            };
            self.q.state.metrics.delivered(
                out.iter()
                    .filter_map(|(c, _)| c.m.as_ref().ok())
                    .map(|d| (d.attempt, d.due_ms)),
                || rt.server_now_ms(),
            );
            // Pushed with the state locked and the job not stopped: `stop`
            // drains the workers' queue after it has set `stopped`, so it
            // finds these.
            self.pace.push(out);
            let me = Weak::clone(&self.me);
            let _ = rt.driver.after(
                latest.saturating_sub(rt.driver.now()) + Duration::from_millis(1),
                move || {
                    if let Some(job) = me.upgrade() {
                        job.sweep();
                    }
                },
            );
        }
        if !st.back.is_empty() {
            tracing::debug!(target: "redwheel::queue", queue = %self.q.state.name, n = st.back.len(), "consumer: messages claimed ahead were handed out too late to start on their claim; they go back");
        }
        Ok(())
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
