//! A queue's controls as kept in Redis (`redwheel:{N}:controls`), so every
//! process obeys the same ones: pause, rate limit, max in flight, max
//! length. [`QueueLimits`] (what is stored), [`Limit`], and the one reader
//! and the one writer of that hash (`controls.lua`), used when a queue is
//! opened, by `controls.rs` and by the inspector.
//!
//! [`QueueLimits`]: crate::QueueLimits
//! [`Limit`]: crate::Limit

use std::time::Duration;

use super::keys::Keys;
use super::options::QueueOptions;
use crate::error::{Access, Error, ErrorKind};
use crate::runtime::Runtime;
use crate::scripts;

/// A queue's controls as stored in Redis, read by
/// [`Queue::limits`](crate::Queue::limits) (or the operators'
/// `QueueInspector::limits`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct QueueLimits {
    /// Paused: offers are taken and due messages keep moving to the ready
    /// list, but nothing is handed out.
    pub paused: bool,
    /// At most `max` deliveries in any interval of length `per`.
    pub rate_limit: Option<(u32, Duration)>,
    /// At most this many claims in flight.
    pub max_in_flight: Option<u64>,
    /// At most this many messages held (delayed, ready, in flight).
    pub max_len: Option<u64>,
}

/// One of the limits [`Queue::lift_limit`](crate::Queue::lift_limit) can
/// lift.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Limit {
    /// [`QueueOptions::rate_limit`].
    RateLimit,
    /// [`QueueOptions::max_in_flight`].
    MaxInFlight,
    /// [`QueueOptions::max_len`].
    MaxLen,
}

impl Limit {
    /// The fields of `controls` that hold it.
    pub(crate) fn fields(self) -> &'static [&'static str] {
        match self {
            Limit::RateLimit => &["rate_max", "rate_per"],
            Limit::MaxInFlight => &["max_in_flight"],
            Limit::MaxLen => &["max_len"],
        }
    }
}

/// The fields (and values) that `options` sets, for `controls.lua`.
pub(crate) fn option_fields(options: &QueueOptions) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    if let Some((max, per)) = options.rate_limit {
        let ms = per.as_nanos().div_ceil(1_000_000);
        out.push(("rate_max", max.to_string()));
        out.push(("rate_per", ms.to_string()));
    }
    if let Some(n) = options.max_in_flight {
        out.push(("max_in_flight", n.to_string()));
    }
    if let Some(n) = options.max_len {
        out.push(("max_len", n.to_string()));
    }
    out
}

/// Runs `controls.lua`: sets each field to its value ("" lifts it), and
/// announces the change on the queue's wake channel.
pub(crate) fn write_controls(
    rt: &Runtime,
    keys: &Keys,
    fields: &[(&str, String)],
) -> Result<(), Error> {
    rt.run(&keys.controls, Access::Write, |con| {
        let mut inv = scripts::CONTROLS.prepare_invoke();
        inv.key(&keys.controls).key(&keys.wake);
        for (field, value) in fields {
            inv.arg(*field).arg(value.as_str());
        }
        inv.invoke::<i64>(con)
    })
    .map(|_| ())
}

/// The field of `controls` that holds the pause: present (`'1'`) while
/// the queue is paused.
pub(super) const PAUSED: &str = "paused";

/// Appends the read of a queue's paused flag to a pipeline, for readers of
/// many queues in one round trip (the dashboard); [`decode_paused`] reads
/// its reply.
#[cfg_attr(not(feature = "web"), allow(dead_code))]
pub(crate) fn pipe_paused(pipe: &mut redis::Pipeline, keys: &Keys) {
    pipe.cmd("HGET").arg(&keys.controls).arg(PAUSED);
}

/// The reply of [`pipe_paused`]'s command: whether the queue is paused.
#[cfg_attr(not(feature = "web"), allow(dead_code))]
pub(crate) fn decode_paused(reply: redis::Value) -> redis::RedisResult<bool> {
    let field: Option<String> = redis::from_redis_value(reply)?;
    Ok(field.is_some())
}

/// Reads a queue's controls.
pub(crate) fn read_limits(rt: &Runtime, keys: &Keys) -> Result<QueueLimits, Error> {
    type Fields = (
        Option<String>,
        Option<u32>,
        Option<u64>,
        Option<u64>,
        Option<u64>,
    );
    let (paused, rate_max, rate_per, max_in_flight, max_len): Fields =
        rt.run(&keys.controls, Access::Read, |con| {
            redis::cmd("HMGET")
                .arg(&keys.controls)
                .arg(PAUSED)
                .arg("rate_max")
                .arg("rate_per")
                .arg("max_in_flight")
                .arg("max_len")
                .query(con)
        })?;
    let rate_limit = match (rate_max, rate_per) {
        (Some(max), Some(per)) => Some((max, Duration::from_millis(per))),
        (None, None) => None,
        _ => {
            return Err(Error::new(
                ErrorKind::Protocol,
                "the rate limit's fields in redis are half written (rate_max or rate_per alone)",
            ));
        }
    };
    Ok(QueueLimits {
        paused: paused.is_some(),
        rate_limit,
        max_in_flight,
        max_len,
    })
}
