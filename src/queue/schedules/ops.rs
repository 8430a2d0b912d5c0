//! The schedule operations of a queue: `schedule` (the idempotent
//! upsert), `unschedule`, `pause_schedule`, `resume_schedule`, and the
//! read-only listings (`Queue::schedules`, `Redwheel::inspect_schedules`).

use super::stored::{Record, Stored, parse_read, parse_record};
use crate::error::{Access, Error, ErrorKind};
use crate::queue::codec::Codec;
use crate::queue::handle::Queue;
use crate::queue::keys::{Keys, validate_name};
use crate::runtime::{Deadline, Redwheel, Runtime, validate_tag_name};
use crate::schedule::{Schedule, ScheduleInfo, Scheduled, floor_ms, from_ms};
use crate::scripts;
use crate::telemetry;

/// Longest schedule name, in bytes: its occurrences' message ids
/// (`sched:<name>:<ms>`) then stay within [`MAX_ID_LEN`](crate::queue::MAX_ID_LEN).
pub const MAX_SCHEDULE_NAME_LEN: usize = 100;

/// How often a change that found the clock estimate off, or the record
/// changed under it, is tried again (once is always enough for the
/// estimate; more only under a stream of concurrent changes).
const ATTEMPTS: usize = 8;

/// Checks a schedule name: the rule of queue names, and at most
/// [`MAX_SCHEDULE_NAME_LEN`] bytes.
pub(super) fn validate_schedule_name(name: &str) -> Result<(), Error> {
    if name.len() > MAX_SCHEDULE_NAME_LEN {
        return Err(Error::new(
            ErrorKind::InvalidName,
            format!("invalid schedule name {name:?}: longer than {MAX_SCHEDULE_NAME_LEN} bytes"),
        ));
    }
    validate_tag_name("schedule", name)
}

/// The keys of `schedule_set.lua` and `schedule_remove.lua`, in their order.
fn set_keys(keys: &Keys) -> [&str; 10] {
    [
        &keys.schedules,
        &keys.schedules_payload,
        &keys.schedules_next,
        &keys.schedules_last,
        &keys.schedules_changes,
        &keys.head,
        &keys.wake,
        &keys.schedules_ahead,
        &keys.delayed,
        &keys.msg,
    ]
}

/// The next occurrence after `settled` (ms), as the scripts take it ('' for none).
fn next_arg(schedule: &Schedule, settled_ms: i64) -> String {
    from_ms(settled_ms)
        .and_then(|t| schedule.next_after(t))
        .map(|t| floor_ms(t).to_string())
        .unwrap_or_default()
}

impl<T: Codec> Queue<T> {
    /// Creates schedule `name` on this queue, or replaces its definition and
    /// payload: from then on, each occurrence of `schedule` (by the Redis
    /// server's clock) becomes one message of this queue carrying
    /// `payload`, due at the occurrence, with the id
    /// `sched:<name>:<occurrence ms>` ([`occurrence_id`](crate::schedule::occurrence_id)).
    ///
    /// An idempotent upsert: calling it again with the same schedule and
    /// payload changes nothing ([`Scheduled::Unchanged`]), however many
    /// processes do it at once, so every process of a fleet may declare its
    /// schedules at start-up. A different definition or payload replaces
    /// both ([`Scheduled::Replaced`]), keeping the paused state: the new
    /// definition's occurrences after the call fire; if the old one had an
    /// occurrence due and not yet offered (the fleet was down, or the call
    /// raced the firing), the new definition takes over from just before
    /// it, so what was owed is owed under the new definition (by its
    /// catch-up policy) rather than dropped; the occurrences the old one
    /// offered ahead (within the lead, before they fell due) are taken back
    /// in the same step, so none of them is delivered. The first occurrence
    /// of a new schedule is the first one after the call. Occurrences are
    /// offered exactly once (see the [module
    /// documentation](crate::queue#recurring-schedules)).
    ///
    /// Fails with [`ErrorKind::InvalidName`] for a name that is empty, over
    /// [`MAX_SCHEDULE_NAME_LEN`] bytes, or holds `{`, `}` or control
    /// characters; [`ErrorKind::InvalidOption`] for a schedule that
    /// [`Schedule::validate`] refuses; [`ErrorKind::PayloadTooLarge`] or
    /// [`ErrorKind::Encode`] for the payload (nothing is written in all
    /// these cases); and as [`offer`](Queue::offer) when Redis fails:
    /// after [`ErrorKind::OutcomeUnknown`], call it again (it is idempotent).
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use redwheel::Redwheel;
    /// use redwheel::schedule::{CatchUp, Schedule, Scheduled};
    ///
    /// let rw = Redwheel::connect("redis://127.0.0.1:6379")?;
    /// let q = rw.queue::<String>("reports")?;
    /// let nightly = Schedule::cron("0 3 * * *")?.time_zone("Europe/Berlin")?;
    /// q.schedule("nightly", &nightly, &"build the report".to_string())?;
    /// let heartbeat = Schedule::every(Duration::from_secs(30)).catch_up(CatchUp::Skip);
    /// let done = q.schedule("heartbeat", &heartbeat, &"ping".to_string())?;
    /// assert_ne!(done, Scheduled::Replaced);
    /// # Ok::<(), redwheel::Error>(())
    /// ```
    pub fn schedule(
        &self,
        name: &str,
        schedule: &Schedule,
        payload: &T,
    ) -> Result<Scheduled, Error> {
        validate_schedule_name(name).map_err(|e| self.tag(e))?;
        schedule.validate().map_err(|e| self.tag(e))?;
        let bytes = self.encode(payload)?;
        let definition = schedule.definition();
        let keys = &self.state.keys;
        let mut settled = self.server_now();
        for _ in 0..ATTEMPTS {
            let next = next_arg(schedule, settled);
            let _span = telemetry::queue_op("schedule", &self.state.name, 1);
            let (code, now) = self
                .rt()
                .run(&keys.delayed, Access::Write, |con| {
                    let mut inv = scripts::SCHEDULE_SET.prepare_invoke();
                    for k in set_keys(keys) {
                        inv.key(k);
                    }
                    inv.arg(name)
                        .arg(&definition)
                        .arg(bytes.as_ref())
                        .arg(settled)
                        .arg(&next)
                        .invoke::<(i64, i64)>(con)
                })
                .map_err(|e| self.tag(e))?;
            let done = match code {
                0 => Scheduled::Unchanged,
                1 => Scheduled::Created,
                2 => Scheduled::Replaced,
                _ => {
                    // Start from where the script says: the server's own
                    // now (the estimate ran ahead of it, or behind the last
                    // firing), or just before an occurrence the replaced
                    // definition still owed.
                    settled = now;
                    continue;
                }
            };
            if done != Scheduled::Unchanged {
                self.wake_job();
            }
            return Ok(done);
        }
        Err(self.tag(Error::new(
            ErrorKind::Server,
            format!("could not store schedule {name:?}: its state kept changing under the call"),
        )))
    }

    /// Deletes schedule `name`: no occurrence fires after this returns
    /// (occurrences already due stay in the queue, as messages; those
    /// offered ahead and not yet due are taken back, in the same step). True
    /// if it existed.
    ///
    /// Fails with [`ErrorKind::InvalidName`] for a bad name, and as
    /// [`offer`](Queue::offer) when Redis fails (it is safe to call again).
    pub fn unschedule(&self, name: &str) -> Result<bool, Error> {
        validate_schedule_name(name).map_err(|e| self.tag(e))?;
        let keys = &self.state.keys;
        let _span = telemetry::queue_op("unschedule", &self.state.name, 1);
        let removed: i64 = self
            .rt()
            .run(&keys.delayed, Access::Write, |con| {
                let mut inv = scripts::SCHEDULE_REMOVE.prepare_invoke();
                for k in set_keys(keys) {
                    inv.key(k);
                }
                inv.arg(name).invoke(con)
            })
            .map_err(|e| self.tag(e))?;
        if removed == 1 {
            self.wake_job();
        }
        Ok(removed == 1)
    }

    /// Pauses schedule `name`: no occurrence fires until
    /// [`resume_schedule`](Queue::resume_schedule), and none of those that
    /// fall meanwhile is owed afterwards; those offered ahead and not yet
    /// due are taken back, in the same step (and its last fired occurrence
    /// is what it was before them). True if the schedule exists (now
    /// paused, whether or not it was before); false if there is none of
    /// that name. Errors as [`unschedule`](Queue::unschedule).
    pub fn pause_schedule(&self, name: &str) -> Result<bool, Error> {
        validate_schedule_name(name).map_err(|e| self.tag(e))?;
        let (code, _) = self.pause_script(name, "p", 0, 0, "")?;
        if code == 1 {
            self.wake_job();
        }
        Ok(code >= 0)
    }

    /// Resumes a paused schedule `name`: it fires again from the next
    /// occurrence after this call (those that fell while it was paused are
    /// not owed). True if the schedule exists (now running, whether or not
    /// it was paused); false if there is none of that name.
    ///
    /// Errors as [`unschedule`](Queue::unschedule), and
    /// [`ErrorKind::InvalidOption`] when its stored definition is one this
    /// build of redwheel cannot read (a later version wrote it).
    pub fn resume_schedule(&self, name: &str) -> Result<bool, Error> {
        validate_schedule_name(name).map_err(|e| self.tag(e))?;
        let keys = &self.state.keys;
        let mut settled = self.server_now();
        for _ in 0..ATTEMPTS {
            let record: Option<Vec<u8>> = self
                .rt()
                .run(&keys.delayed, Access::Read, |con| {
                    redis::cmd("HGET").arg(&keys.schedules).arg(name).query(con)
                })
                .map_err(|e| self.tag(e))?;
            let Some(record) = record else {
                return Ok(false);
            };
            let Record {
                rev,
                paused,
                definition,
            } = parse_record(&record).ok_or_else(|| {
                self.tag(Error::new(
                    ErrorKind::Protocol,
                    format!("schedule {name:?}: its stored record is not one redwheel writes"),
                ))
            })?;
            if !paused {
                return Ok(true);
            }
            let schedule = Schedule::from_definition(&definition).map_err(|e| self.tag(e))?;
            let next = next_arg(&schedule, settled);
            let (code, now) = self.pause_script(name, "r", rev, settled, &next)?;
            match code {
                1 => {
                    self.wake_job();
                    return Ok(true);
                }
                0 => return Ok(true),
                -1 => return Ok(false),
                -3 => settled = now,
                // -2: replaced or paused again meanwhile: read it again.
                _ => {}
            }
        }
        Err(self.tag(Error::new(
            ErrorKind::Server,
            format!("could not resume schedule {name:?}: its state kept changing under the call"),
        )))
    }

    fn pause_script(
        &self,
        name: &str,
        mode: &str,
        rev: u64,
        settled: i64,
        next: &str,
    ) -> Result<(i64, i64), Error> {
        let keys = &self.state.keys;
        let _span = telemetry::queue_op("pause_schedule", &self.state.name, 1);
        self.rt()
            .run(&keys.delayed, Access::Write, |con| {
                scripts::SCHEDULE_PAUSE
                    .key(&keys.schedules)
                    .key(&keys.schedules_next)
                    .key(&keys.schedules_last)
                    .key(&keys.schedules_changes)
                    .key(&keys.head)
                    .key(&keys.wake)
                    .key(&keys.schedules_ahead)
                    .key(&keys.delayed)
                    .key(&keys.msg)
                    .arg(name)
                    .arg(mode)
                    .arg(rev)
                    .arg(settled)
                    .arg(next)
                    .invoke::<(i64, i64)>(con)
            })
            .map_err(|e| self.tag(e))
    }

    /// This queue's schedules, by name: each one's definition, next
    /// occurrence, last occurrence fired, and whether it is paused. One
    /// atomic read.
    pub fn schedules(&self) -> Result<Vec<ScheduleInfo>, Error> {
        read_schedules(self.rt(), &self.state.keys).map_err(|e| self.tag(e))
    }

    /// The server's clock now, by this process's estimate (epoch ms).
    fn server_now(&self) -> i64 {
        i64::try_from(self.rt().server_now_ms()).unwrap_or(i64::MAX)
    }

    /// Has this process's job read the changed schedules now (other
    /// processes hear of it on the wake channel).
    fn wake_job(&self) {
        self.rt()
            .driver
            .announce(&self.state.job_key, Deadline::Now);
    }
}

impl Redwheel {
    /// The schedules of queue `queue`, as [`Queue::schedules`] lists them,
    /// without opening the queue (so nothing is moved or fired): for
    /// operators' tools. An empty list when it has none.
    ///
    /// Fails with [`ErrorKind::InvalidName`] for a bad queue name, and a
    /// transient error when Redis cannot be reached.
    pub fn inspect_schedules(&self, queue: &str) -> Result<Vec<ScheduleInfo>, Error> {
        validate_name(queue)?;
        read_schedules(self.runtime(), &Keys::new(queue)).map_err(|e| e.in_queue(queue))
    }
}

/// Every schedule of the queue with `keys`, sorted by name.
fn read_schedules(rt: &Runtime, keys: &Keys) -> Result<Vec<ScheduleInfo>, Error> {
    let reply: redis::Value = rt.run(&keys.delayed, Access::Read, |con| {
        scripts::SCHEDULE_READ
            .key(&keys.schedules)
            .key(&keys.schedules_next)
            .key(&keys.schedules_last)
            .key(&keys.schedules_changes)
            .key(&keys.head)
            .key(&keys.schedules_payload)
            .arg(-1)
            .arg("")
            .invoke(con)
    })?;
    let read = parse_read(&reply, false).ok_or_else(|| {
        Error::new(
            ErrorKind::Protocol,
            format!("unexpected reply to schedule_read.lua: {reply:?}"),
        )
    })?;
    let mut out: Vec<ScheduleInfo> = read.schedules.into_iter().filter_map(info).collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

fn info(s: Stored) -> Option<ScheduleInfo> {
    let record = s.record?;
    let at = |ms: Option<i64>| ms.and_then(from_ms);
    Some(ScheduleInfo {
        schedule: Schedule::from_definition(&record.definition).ok(),
        definition: record.definition,
        name: s.name,
        next: if record.paused { None } else { at(s.next_ms) },
        last_fired: at(s.last_ms),
        paused: record.paused,
    })
}
