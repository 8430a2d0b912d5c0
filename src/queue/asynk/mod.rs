//! The queue operations as futures (feature `async`): `offer_async`,
//! `offer_batch_async`, `remove_async`, `take_async`, `poll_async`,
//! `claim_async`, `claim_batch_async`, `Delivery::{ack_async, nack_async,
//! extend_async}`, `stats_async` (and `Queue::deliveries`, in
//! `queue/consumer/stream.rs`).
//!
//! Each returns what its synchronous twin returns, with the same errors,
//! and runs the same script with the same keys (each twin's command and
//! reply reader live beside the synchronous call, shared by both). The
//! command goes out on the runtime's multiplexed connection
//! (`runtime/mux/`): polling never waits on Redis. A take or claim that
//! finds nothing waits for this process's transfer job to run (at each due
//! time announced on the queue's wake channel, and at each guard sweep),
//! with a deadline on the driver's wheel; a waiter that gets a message
//! wakes the next, so every message moved by any process is found.
//!
//! Every future is `Send` and `'static` (it owns a clone of the handle);
//! the command is built when the method is called (bad input fails there,
//! at the first poll) and sent at the first poll. What dropping a future
//! does is said on each method ("Cancellation").
//!
//! Files: `offer.rs`, `take.rs` (take, poll, and the give-back of a
//! dropped take), `claim.rs` (and the give-back of a dropped claim),
//! `lost.rs` (the answer a dropped take or claim still needs after a lost
//! reply), `delivery.rs`, `acks.rs` and `coalesce.rs` (calls sent
//! together), `ops.rs` (remove, stats), and this one (the wait for the
//! ready list shared by take and claim).

mod acks;
mod claim;
pub(super) mod coalesce;
mod delivery;
mod lost;
mod offer;
mod ops;
mod take;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use redis::Value;

use super::codec::Codec;
use super::handle::Queue;
use super::pop::Unresolved;
use crate::error::{Access, Error, ErrorKind};
use crate::runtime::{Backoff, Call, Cell, Command, Deadline, Orphan, first_reply, shut_down};

/// What a pop script found.
pub(super) enum Popped {
    /// A reply holding messages.
    Found(Value),
    /// Nothing before the deadline.
    Nothing,
}

impl<T: Codec> Queue<T> {
    /// Runs a pop request (`take.lua`, `claim.lua` with their reply
    /// record: `Nil`, or an array of at most `header` elements, when it
    /// finds nothing) until it finds something or `deadline` passes,
    /// waiting for the ready list in between. `orphan` makes the handler
    /// of an attempt's answer should the future end without it (see
    /// below). As the synchronous `wait_pop`: a transient failure is waited
    /// out on the reconnect backoff, and an attempt whose reply was lost
    /// is sent again (the same request) until Redis answers what it did;
    /// at shutdown, after `RESOLVE_WITHIN`, or past `deadline` and
    /// `command_timeout` more, such an attempt makes it fail with
    /// `OutcomeUnknown`.
    ///
    /// With a `deadline`, it returns by `deadline + command_timeout`
    /// whatever Redis does: an attempt still unanswered then is abandoned
    /// (as a dropped future abandons it).
    ///
    /// An attempt that may have run is never left behind: if the future
    /// is dropped or gives up while one is unanswered, the orphan path
    /// (`lost.rs`) asks Redis again what it did and gives back what it
    /// handed out, whether an attempt is on the wire then (its call's
    /// orphan, also when that attempt is never sent) or not (in the
    /// backoff, waiting: [`Unanswered`]).
    pub(super) async fn pop_async(
        &self,
        op: &'static str,
        deadline: Option<Instant>,
        command: Command,
        header: usize,
        orphan: impl Fn() -> Option<Orphan> + Sync,
    ) -> Result<Popped, Error> {
        let rt = Arc::clone(self.rt());
        let route = self.state.keys.ready.clone();
        let ready = Arc::clone(&self.state.transfer.ready);
        // Registered before the first attempt: a wake-up while it is on
        // the wire is kept.
        let ticket = ready.register();
        let mut backoff = Backoff::new(rt.options.reconnect_min, rt.options.reconnect_max);
        let mut unresolved = Unresolved::default();
        let mut unanswered = Unanswered {
            orphan: &orphan,
            armed: false,
        };
        // The latest it returns, unresolved or not (`None`: no limit).
        let hard_stop = deadline.and_then(|d| d.checked_add(rt.options.command_timeout));
        let give_up = |unresolved: &Unresolved, e: Error| -> Error {
            if unresolved.pending() {
                self.tag(unresolved.outcome_unknown(op, Some(e)))
            } else {
                e
            }
        };
        loop {
            if rt.is_shut_down() {
                return Err(give_up(&unresolved, self.tag(shut_down())));
            }
            if unresolved.too_old() {
                unanswered.armed = false; // as long as anyone asks
                return Err(self.tag(unresolved.outcome_unknown(op, None)));
            }
            ticket.cell().reset();
            // This attempt's call carries an unanswered earlier one now.
            unanswered.armed = false;
            let attempt = rt
                .call(&route, Access::Write, command.clone(), orphan())
                .resend_of_unresolved(unresolved.pending());
            let Some(reply) = self.attempt(attempt, hard_stop).await else {
                // Abandoned at the hard stop: its call's orphan gives back
                // whatever it (or an earlier attempt) handed out.
                let e = self.tag(Error::new(
                    ErrorKind::Unavailable,
                    format!(
                        "redis did not answer the {op} within its wait and the command timeout"
                    ),
                ));
                return Err(give_up(&unresolved, e));
            };
            let reply = reply.and_then(|values| first_reply(values, Access::Write));
            let pause = match reply {
                Ok(v) if found(&v, header) => {
                    self.count_expired(&v);
                    // More may be ready: the next waiter looks.
                    ready.wake(1);
                    return Ok(Popped::Found(v));
                }
                Ok(v) => {
                    self.count_expired(&v);
                    if let Value::Array(items) = &v
                        && let Some(Value::Int(g)) = items.first()
                        && *g > 0
                    {
                        // Held back by the rate limit for `g` µs: the
                        // queue's job runs then, and its run wakes this
                        // waiter (pause and a full in-flight set end with
                        // a `wake` message, which runs it too).
                        rt.driver.announce(
                            &self.state.job_key,
                            Deadline::After(Duration::from_micros(*g as u64)),
                        );
                    }
                    unresolved.resolved();
                    backoff.reset();
                    None
                }
                Err(e) if e.is_transient() => {
                    if e.is_outcome_unknown() {
                        // It may have run: the same request again, at once
                        // after the backoff, answered by what it did.
                        unresolved.lost();
                    }
                    tracing::debug!(target: "redwheel::queue", queue = %self.state.name, error = %e, "redis unavailable while waiting; retrying");
                    Some((backoff.step(), e))
                }
                Err(e) => {
                    unanswered.armed = unresolved.pending();
                    return Err(give_up(&unresolved, self.tag(e)));
                }
            };
            // No call in flight from here to the next attempt: should the
            // future end meanwhile, an unanswered attempt is asked about.
            unanswered.armed = unresolved.pending();
            // While an attempt is unanswered, wait for its answer until
            // the hard stop; else until the deadline.
            let until = if unresolved.pending() {
                hard_stop
            } else {
                deadline
            };
            let left = until.map(|d| d.saturating_duration_since(Instant::now()));
            if left.is_some_and(|l| l.is_zero()) {
                return match pause {
                    Some((_, e)) => Err(give_up(&unresolved, self.tag(e))),
                    None if unresolved.pending() => {
                        Err(self.tag(unresolved.outcome_unknown(op, None)))
                    }
                    None => Ok(Popped::Nothing),
                };
            }
            // Woken by the transfer job; at most a blocking round of the
            // synchronous call apart, as a safety net.
            let mut wait = pause.as_ref().map_or(rt.options.max_block, |(d, _)| *d);
            if let Some(l) = left {
                wait = wait.min(l);
            }
            let cell = if pause.is_some() {
                // A backoff pause: not cut short by the ready list.
                Arc::new(Cell::default())
            } else {
                Arc::clone(ticket.cell())
            };
            rt.wait_for(&cell, Some(wait.max(Duration::from_millis(1))))
                .await;
        }
    }

    /// Runs one attempt, abandoning it (`None`) if it is unanswered at
    /// `stop`.
    async fn attempt(
        &self,
        mut call: Call,
        stop: Option<Instant>,
    ) -> Option<Result<Vec<Value>, Error>> {
        let Some(stop) = stop else {
            return Some(call.await);
        };
        let rt = self.rt();
        let cell = Arc::new(Cell::default());
        let left = stop.saturating_duration_since(Instant::now());
        let mut stop = rt.wait_for(&cell, Some(left.max(Duration::from_millis(1))));
        std::future::poll_fn(|cx| {
            if let Poll::Ready(r) = Pin::new(&mut call).poll(cx) {
                return Poll::Ready(Some(r));
            }
            match Pin::new(&mut stop).poll(cx) {
                Poll::Ready(()) => Poll::Ready(None),
                Poll::Pending => Poll::Pending,
            }
        })
        .await
    }
}

/// An attempt of a pop request that may have run unanswered while no call
/// carries it (`armed`): should the future end then (dropped, or giving
/// up), its orphan is told the reply was lost, and asks Redis again.
struct Unanswered<'a, F: Fn() -> Option<Orphan>> {
    orphan: &'a F,
    armed: bool,
}

impl<F: Fn() -> Option<Orphan>> Drop for Unanswered<'_, F> {
    fn drop(&mut self) {
        if self.armed
            && let Some(f) = (self.orphan)()
        {
            f(None);
        }
    }
}

/// True if a pop script's reply holds messages.
fn found(v: &Value, header: usize) -> bool {
    match v {
        Value::Nil => false,
        Value::Array(items) => items.len() > header,
        _ => true,
    }
}
