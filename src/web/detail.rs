//! A queue page's data, read on demand through the public inspection API
//! (`queue::inspect`, `Redwheel::inspect_schedules`): its counts, its
//! controls, the first messages of each state and its schedules.

use std::time::{SystemTime, UNIX_EPOCH};

use crate::error::Error;
use crate::queue::inspect::{MessageState, PeekedMessage};
use crate::queue::{QueueLimits, QueueStats};
use crate::runtime::Redwheel;
use crate::schedule::ScheduleInfo;

/// Messages listed per state unless `?limit=` says otherwise.
pub(crate) const DEFAULT_LIMIT: usize = 20;
/// The most `?limit=` may ask for.
pub(crate) const MAX_LIMIT: usize = 500;

/// The sections of a queue page, in page order: the state, its key in the
/// JSON (`messages.<key>`) and its heading. The schedules come after these.
pub(crate) const SECTIONS: [(MessageState, &str, &str); 4] = [
    (MessageState::Dead, "dead", "Dead letters"),
    (MessageState::InFlight, "in_flight", "In flight"),
    (MessageState::Ready, "ready", "Ready"),
    (MessageState::Delayed, "delayed", "Next delayed"),
];

/// One queue as its page shows it.
#[derive(Debug, Clone)]
pub(crate) struct QueueDetail {
    pub name: String,
    pub stats: QueueStats,
    /// The Redis clock when the counts were read (epoch ms).
    pub server_ms: u64,
    /// Its controls (pause, rate limit, max in flight, max length).
    pub limits: QueueLimits,
    pub limit: usize,
    /// The message whose whole payload is shown.
    pub show: Option<String>,
    /// The first messages of each state, in [`SECTIONS`]' order.
    pub messages: Vec<Vec<PeekedMessage>>,
    /// Its recurring schedules, by name.
    pub schedules: Vec<ScheduleInfo>,
}

/// Reads queue `name`; `None` if it has no key in Redis.
pub(crate) fn load_queue(
    rw: &Redwheel,
    name: &str,
    limit: usize,
    show: Option<String>,
) -> Result<Option<QueueDetail>, Error> {
    let q = rw.inspect_queue(name)?;
    if !q.exists()? {
        return Ok(None);
    }
    let (stats, server_ms) = q.stats_at()?;
    let limits = q.limits()?;
    let messages = SECTIONS
        .iter()
        .map(|(state, _, _)| q.peek(*state, limit))
        .collect::<Result<Vec<_>, Error>>()?;
    let schedules = rw.inspect_schedules(name)?;
    Ok(Some(QueueDetail {
        name: name.to_owned(),
        stats,
        server_ms,
        limits,
        limit,
        show,
        messages,
        schedules,
    }))
}

/// `?limit=`, clamped to 1 ..= [`MAX_LIMIT`].
pub(crate) fn limit_of(param: Option<&str>) -> usize {
    param
        .and_then(|v| v.parse::<usize>().ok())
        .map_or(DEFAULT_LIMIT, |n| n.clamp(1, MAX_LIMIT))
}

/// Epoch ms of a time on the Redis clock.
pub(crate) fn epoch_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
