//! What a queue reports about its schedules ([`ScheduleInfo`],
//! [`Scheduled`]), and the message id of an occurrence.

use std::time::SystemTime;

use super::Schedule;
use super::time::{floor_ms, from_ms};

/// One schedule of a queue, as `Queue::schedules` reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ScheduleInfo {
    /// Its name within the queue.
    pub name: String,
    /// Its canonical definition, as stored ([`Schedule::definition`]).
    pub definition: String,
    /// The definition decoded; `None` when this build cannot read it (a
    /// later version of redwheel wrote it).
    pub schedule: Option<Schedule>,
    /// Its next occurrence (by the Redis server's clock): the next one not
    /// yet offered; `None` while it is paused and once it has no more (past
    /// its [`until`](Schedule::until)).
    pub next: Option<SystemTime>,
    /// The last occurrence offered to the queue, if any. Occurrences are
    /// offered up to 100 ms before they fall due (see "Recurring
    /// schedules" in [`queue`](crate::queue#recurring-schedules)), so this
    /// may be one a little in the future, waiting in the queue as a
    /// delayed message.
    pub last_fired: Option<SystemTime>,
    /// Whether it is paused ([`Queue::pause_schedule`]).
    ///
    /// [`Queue::pause_schedule`]: crate::Queue::pause_schedule
    pub paused: bool,
}

/// What `Queue::schedule` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Scheduled {
    /// There was no schedule of that name: it was created.
    Created,
    /// Its definition or payload was different: both were replaced. The
    /// new definition goes on from the call, or from just before an
    /// occurrence the old one still owed (its paused state is kept).
    Replaced,
    /// The same definition and payload were stored already: nothing
    /// changed.
    Unchanged,
}

/// The message id of schedule `name`'s occurrence at `at`:
/// `sched:<name>:<occurrence in epoch ms>`. An occurrence is offered under
/// this id, at most once.
///
/// ```
/// use std::time::{Duration, UNIX_EPOCH};
/// use redwheel::schedule::{occurrence_id, parse_occurrence_id};
///
/// let at = UNIX_EPOCH + Duration::from_millis(1_767_225_600_000);
/// let id = occurrence_id("nightly", at);
/// assert_eq!(id, "sched:nightly:1767225600000");
/// assert_eq!(parse_occurrence_id(&id), Some(("nightly", at)));
/// assert_eq!(parse_occurrence_id("XvxreRomluFY8"), None);
/// ```
pub fn occurrence_id(name: &str, at: SystemTime) -> String {
    format!("sched:{name}:{}", floor_ms(at))
}

/// The schedule name and the occurrence an id of
/// [`occurrence_id`]'s form names; `None` for any other id.
pub fn parse_occurrence_id(id: &str) -> Option<(&str, SystemTime)> {
    let rest = id.strip_prefix("sched:")?;
    let (name, ms) = rest.rsplit_once(':')?;
    let digits = ms.strip_prefix('-').unwrap_or(ms);
    if name.is_empty() || digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((name, from_ms(ms.parse().ok()?)?))
}
