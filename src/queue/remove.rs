//! Removing messages: one by id (`remove.lua`, O(log n)), or every
//! message of the queue (`clear.lua`).

use super::codec::Codec;
use super::handle::{Queue, check_id};
use super::keys::Keys;
use super::message::MessageId;
use crate::error::{Access, Error};
use crate::scripts;
use crate::telemetry;

impl<T: Codec> Queue<T> {
    /// Cancels a message by id. True if it was known to the queue
    /// (delayed, due but not yet taken, claimed and not yet acked, or a
    /// dead letter) and is now gone for good; false if it is unknown, was
    /// already taken or acked, or already removed. O(log n): a due id
    /// already on the ready list is not searched for; its entry there is
    /// marked stale, and `take` and `claim` skip it (so the id may be
    /// offered again at once without an early or second delivery). A claim
    /// in flight loses its lease: its ack finds the message gone.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use redwheel::Redwheel;
    ///
    /// let rw = Redwheel::connect("redis://127.0.0.1:6379")?;
    /// let q = rw.queue::<String>("reminders")?;
    /// let id = q.offer(&"call back".to_string(), Duration::from_secs(600))?;
    /// // The customer called first: cancel the reminder.
    /// if !q.remove(&id)? {
    ///     // Too late: it was already taken (or acked).
    /// }
    /// # Ok::<(), redwheel::Error>(())
    /// ```
    pub fn remove(&self, id: &MessageId) -> Result<bool, Error> {
        check_id(id).map_err(|e| self.tag(e))?;
        let keys = &self.state.keys;
        let _span = telemetry::queue_op("remove", &self.state.name, 1);
        let n: i64 = self
            .rt()
            .run(&keys.delayed, Access::Write, |con| {
                let mut inv = scripts::REMOVE.prepare_invoke();
                for k in remove_keys(keys) {
                    inv.key(k);
                }
                inv.arg(id.as_str()).invoke(con)
            })
            .map_err(|e| self.tag(e).for_message(id.as_str()))?;
        Ok(n == 1)
    }

    /// Deletes every message of the queue (delayed, ready, in flight and
    /// dead letters, with their leases, attempt counts, reasons, priorities,
    /// ttls and debounce successors); returns how many there were. The
    /// queue's controls (pause, limits), its rate limit's window and its
    /// throttle windows stay.
    pub fn clear(&self) -> Result<u64, Error> {
        let keys = &self.state.keys;
        let _span = telemetry::queue_op("clear", &self.state.name, 0);
        let n: i64 = self
            .rt()
            .run(&keys.delayed, Access::Write, |con| {
                scripts::CLEAR
                    .key(&keys.delayed)
                    .key(&keys.msg)
                    .key(&keys.ready)
                    .key(&keys.dead)
                    .key(&keys.inflight)
                    .key(&keys.lease)
                    .key(&keys.attempts)
                    .key(&keys.reason)
                    .key(&keys.stale)
                    .key(&keys.prioritized)
                    .key(&keys.priority)
                    .key(&keys.expires)
                    .key(&keys.dedup)
                    .key(&keys.controls)
                    .invoke(con)
            })
            .map_err(|e| self.tag(e))?;
        Ok(n.max(0) as u64)
    }
}

/// `remove.lua`'s keys, in its order (ARGV: the id).
pub(super) fn remove_keys(keys: &Keys) -> [&str; 11] {
    [
        &keys.delayed,
        &keys.msg,
        &keys.dead,
        &keys.inflight,
        &keys.lease,
        &keys.attempts,
        &keys.reason,
        &keys.stale,
        &keys.prioritized,
        &keys.priority,
        &keys.expires,
    ]
}
