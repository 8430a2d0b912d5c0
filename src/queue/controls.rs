//! Pausing and lifting a queue's controls through its handle:
//! [`Queue::pause`], [`Queue::resume`], [`Queue::is_paused`],
//! [`Queue::limits`], [`Queue::lift_limit`] (the stored form and its one
//! reader and writer are in `limits.rs`).

use super::codec::Codec;
use super::handle::Queue;
use super::limits::{Limit, PAUSED, QueueLimits, read_limits, write_controls};
use crate::error::Error;
use crate::telemetry;

impl<T: Codec> Queue<T> {
    /// Pauses the queue for every process: offers are still taken and due
    /// messages still move to the ready list (a message with a ttl still
    /// expires), but `take`, `poll`, `claim` and `consume` hand nothing out
    /// until [`resume`](Queue::resume). Claims already in flight go on (they
    /// can be acked, nacked, extended, and come back when their visibility
    /// ends). Consumers that are waiting keep waiting, in their process,
    /// without polling Redis. The state is kept in Redis: it outlives
    /// restarts of the consumers (and of Redis, as far as its persistence
    /// keeps writes). Idempotent.
    ///
    /// ```no_run
    /// use redwheel::Redwheel;
    ///
    /// let rw = Redwheel::connect("redis://127.0.0.1:6379")?;
    /// let q = rw.queue::<String>("emails")?;
    /// q.pause()?;            // the mail server is down for maintenance
    /// assert!(q.is_paused()?);
    /// // … later, from this process or any other (or `redwheel resume emails`):
    /// q.resume()?;
    /// # Ok::<(), redwheel::Error>(())
    /// ```
    pub fn pause(&self) -> Result<(), Error> {
        let _span = telemetry::queue_op("pause", &self.state.name, 0);
        write_controls(self.rt(), &self.state.keys, &[(PAUSED, "1".to_owned())])
            .map_err(|e| self.tag(e))
    }

    /// Ends a [`pause`](Queue::pause): consumers waiting in any process
    /// are woken at once (through the queue's wake channel; a lost
    /// announcement is made up by each process's guard sweep). Idempotent.
    pub fn resume(&self) -> Result<(), Error> {
        let _span = telemetry::queue_op("resume", &self.state.name, 0);
        write_controls(self.rt(), &self.state.keys, &[(PAUSED, String::new())])
            .map_err(|e| self.tag(e))?;
        self.state.gate.open();
        Ok(())
    }

    /// True while the queue is paused (by any process).
    pub fn is_paused(&self) -> Result<bool, Error> {
        Ok(self.limits()?.paused)
    }

    /// The queue's controls as stored in Redis: pause, rate limit, max in
    /// flight, max length (whoever set them).
    pub fn limits(&self) -> Result<QueueLimits, Error> {
        let _span = telemetry::queue_op("limits", &self.state.name, 0);
        read_limits(self.rt(), &self.state.keys).map_err(|e| self.tag(e))
    }

    /// Removes one of the queue's limits, for every process (those waiting
    /// because of it are woken). Idempotent.
    ///
    /// ```no_run
    /// use redwheel::{Limit, Redwheel};
    ///
    /// let rw = Redwheel::connect("redis://127.0.0.1:6379")?;
    /// let q = rw.queue::<String>("emails")?;
    /// q.lift_limit(Limit::RateLimit)?; // the provider raised our quota
    /// # Ok::<(), redwheel::Error>(())
    /// ```
    pub fn lift_limit(&self, which: Limit) -> Result<(), Error> {
        let _span = telemetry::queue_op("lift_limit", &self.state.name, 0);
        let fields: Vec<(&str, String)> =
            which.fields().iter().map(|f| (*f, String::new())).collect();
        write_controls(self.rt(), &self.state.keys, &fields).map_err(|e| self.tag(e))?;
        self.state.gate.open();
        Ok(())
    }
}
