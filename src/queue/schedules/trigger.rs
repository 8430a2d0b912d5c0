//! Firing a schedule by hand: [`Queue::trigger_schedule`] offers the
//! schedule's stored payload now, as one message, through the queue's own
//! offer (the stored payload is already encoded: it is offered as it is).

use crate::error::{Access, Error};
use crate::queue::codec::Codec;
use crate::queue::handle::Queue;
use crate::queue::ids::new_message_id;
use crate::queue::message::MessageId;
use crate::telemetry;

use super::ops::validate_schedule_name;

impl<T: Codec> Queue<T> {
    /// Fires schedule `name` now, by hand: offers its stored payload as
    /// one message, due at once, under a fresh id (not an occurrence id:
    /// it is not one of the schedule's occurrences). Returns the
    /// message's id, or `None` if the queue has no schedule of that name.
    ///
    /// The schedule itself is left as it was: its next occurrence, its
    /// last fired occurrence and its paused state do not change (a paused
    /// schedule can be triggered too), and each call offers one more
    /// message. The payload is the one stored when the call reads it; a
    /// schedule replaced or removed at that moment may give the old
    /// payload once more.
    ///
    /// Fails with [`ErrorKind::InvalidName`](crate::ErrorKind::InvalidName)
    /// for a bad schedule name, and as [`offer`](Queue::offer) otherwise
    /// (after [`ErrorKind::OutcomeUnknown`](crate::ErrorKind::OutcomeUnknown)
    /// the message may or may not have been written; calling again may
    /// offer a second one).
    ///
    /// ```no_run
    /// use redwheel::Redwheel;
    /// use redwheel::schedule::Schedule;
    ///
    /// let rw = Redwheel::connect("redis://127.0.0.1:6379")?;
    /// let q = rw.queue::<String>("reports")?;
    /// q.schedule("nightly", &Schedule::cron("0 3 * * *")?, &"build the report".to_string())?;
    /// // The report is wanted now, not at 03:00:
    /// let id = q.trigger_schedule("nightly")?.expect("it was just declared");
    /// # let _ = id;
    /// # Ok::<(), redwheel::Error>(())
    /// ```
    pub fn trigger_schedule(&self, name: &str) -> Result<Option<MessageId>, Error> {
        validate_schedule_name(name).map_err(|e| self.tag(e))?;
        let keys = &self.state.keys;
        let payload: Option<Vec<u8>> = {
            let _span = telemetry::queue_op("trigger_schedule", &self.state.name, 1);
            self.rt()
                .run(&keys.delayed, Access::Read, |con| {
                    redis::cmd("HGET")
                        .arg(&keys.schedules_payload)
                        .arg(name)
                        .query(con)
                })
                .map_err(|e| self.tag(e))?
        };
        let Some(payload) = payload else {
            return Ok(None);
        };
        self.offer_fresh("r", 0, new_message_id(), &payload)
            .map(Some)
    }
}
