//! The actions, each through the library's own operation: `Queue::requeue_dead`,
//! `Queue::remove`, `Queue::pause`, `Queue::resume`,
//! `Queue::trigger_schedule`, `Lock::force_unlock`. Run on a helper thread (see
//! `bounded.rs`); the checks of who may act are in `guard.rs`.

use serde_json::{Value, json};

use super::model;
use super::router::Action;
use crate::error::{Error, ErrorKind};
use crate::lock::ForcedRelease;
use crate::queue::{MessageId, Queue};
use crate::runtime::Redwheel;

/// Dead letters requeued per call.
const REQUEUE_BATCH: usize = 1_000;
/// The most `?count=` may ask for.
pub(crate) const MAX_COUNT: usize = 1_000_000;

/// An HTTP status and a JSON body.
#[derive(Debug, Clone)]
pub(crate) struct Outcome {
    pub status: u16,
    pub body: Value,
}

impl Outcome {
    fn ok(body: Value) -> Outcome {
        Outcome { status: 200, body }
    }

    fn not_found(message: String) -> Outcome {
        Outcome {
            status: 404,
            body: model::error("not found", &message),
        }
    }

    /// A library error as a status and a document.
    pub(crate) fn from_error(e: &Error) -> Outcome {
        let status = match e.kind() {
            _ if e.is_invalid_input() => 400,
            ErrorKind::Unavailable | ErrorKind::OutcomeUnknown | ErrorKind::Shutdown => 503,
            _ => 500,
        };
        let mut message = e.to_string();
        if e.is_outcome_unknown() {
            message.push_str(" (it may or may not have taken effect)");
        }
        Outcome {
            status,
            body: model::error(e.kind().as_str(), &message),
        }
    }
}

/// How many dead letters to requeue: `?count=N` (1 ..= [`MAX_COUNT`]) or
/// all.
pub(crate) fn requeue_count(param: Option<&str>) -> Result<Option<usize>, String> {
    match param {
        None | Some("all") | Some("") => Ok(None),
        Some(n) => match n.parse::<usize>() {
            Ok(n) if (1..=MAX_COUNT).contains(&n) => Ok(Some(n)),
            _ => Err(format!(
                "count must be a number from 1 to {MAX_COUNT} or `all`, not {n:?}"
            )),
        },
    }
}

/// The acquisition a force-unlock is for: the holder and the fencing
/// token the page showed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Shown {
    pub holder: Option<String>,
    pub fencing_token: Option<String>,
}

/// Does `action` (`shown` is read by a force-unlock only).
pub(crate) fn perform(
    rw: &Redwheel,
    action: &Action,
    count: Option<usize>,
    shown: &Shown,
) -> Outcome {
    let done = match action {
        Action::RequeueDead { queue } => requeue(rw, queue, count),
        Action::Remove { queue, id } => remove(rw, queue, id),
        Action::Pause { queue } => pause(rw, queue, true),
        Action::Resume { queue } => pause(rw, queue, false),
        Action::TriggerSchedule { queue, schedule } => trigger(rw, queue, schedule),
        Action::ForceUnlock { lock } => force_unlock(rw, lock, shown),
    };
    done.unwrap_or_else(|e| Outcome::from_error(&e))
}

/// Queue `name` opened for an action, or the 404 of a queue with no key
/// in Redis (an action never creates a queue).
fn open(rw: &Redwheel, name: &str) -> Result<Result<Queue<Vec<u8>>, Outcome>, Error> {
    if !rw.inspect_queue(name)?.exists()? {
        return Ok(Err(Outcome::not_found(format!(
            "no queue {name:?} in Redis"
        ))));
    }
    rw.queue::<Vec<u8>>(name).map(Ok)
}

fn requeue(rw: &Redwheel, name: &str, count: Option<usize>) -> Result<Outcome, Error> {
    let q = match open(rw, name)? {
        Ok(q) => q,
        Err(missing) => return Ok(missing),
    };
    // In batches, and no more than there were (or were asked for):
    // letters that die again meanwhile wait for the next click.
    let target = match count {
        Some(n) => n as u64,
        None => rw.inspect_queue(name)?.stats()?.dead,
    };
    let mut requeued = 0u64;
    while requeued < target {
        let n = q.requeue_dead(REQUEUE_BATCH.min((target - requeued) as usize))?;
        requeued += n;
        if n == 0 {
            break;
        }
    }
    Ok(Outcome::ok(json!({
        "ok": true,
        "queue": name,
        "requeued": requeued,
        "message": format!("requeued {requeued} dead letter{} of {name}", if requeued == 1 { "" } else { "s" }),
    })))
}

fn remove(rw: &Redwheel, name: &str, id: &str) -> Result<Outcome, Error> {
    let q = match open(rw, name)? {
        Ok(q) => q,
        Err(missing) => return Ok(missing),
    };
    if q.remove(&MessageId::from(id))? {
        Ok(Outcome::ok(json!({
            "ok": true,
            "queue": name,
            "id": id,
            "removed": true,
            "message": format!("removed {id} from {name}"),
        })))
    } else {
        let mut o = Outcome::not_found(format!(
            "no message {id:?} in {name} (already taken, acked or removed)"
        ));
        o.body["removed"] = json!(false);
        Ok(o)
    }
}

/// Pauses (`pause`) or resumes queue `name`.
fn pause(rw: &Redwheel, name: &str, pause: bool) -> Result<Outcome, Error> {
    let q = match open(rw, name)? {
        Ok(q) => q,
        Err(missing) => return Ok(missing),
    };
    if pause {
        q.pause()?;
    } else {
        q.resume()?;
    }
    Ok(Outcome::ok(json!({
        "ok": true,
        "queue": name,
        "paused": pause,
        "message": format!("{} {name}", if pause { "paused" } else { "resumed" }),
    })))
}

fn trigger(rw: &Redwheel, name: &str, schedule: &str) -> Result<Outcome, Error> {
    let q = match open(rw, name)? {
        Ok(q) => q,
        Err(missing) => return Ok(missing),
    };
    match q.trigger_schedule(schedule)? {
        Some(id) => Ok(Outcome::ok(json!({
            "ok": true,
            "queue": name,
            "schedule": schedule,
            "id": id.as_str(),
            "message": format!("triggered {schedule} of {name}: offered {id}, due now"),
        }))),
        None => Ok(Outcome::not_found(format!(
            "no schedule {schedule:?} on {name}"
        ))),
    }
}

fn force_unlock(rw: &Redwheel, name: &str, shown: &Shown) -> Result<Outcome, Error> {
    let (Some(holder), Some(token)) = (shown.holder.as_deref(), shown.fencing_token.as_deref())
    else {
        return Ok(Outcome {
            status: 400,
            body: model::error(
                "invalid input",
                "force-unlock releases only the acquisition it was shown: send its `holder` and \
                 `fencing_token` (GET /api/locks)",
            ),
        });
    };
    let Ok(token) = token.parse::<u64>() else {
        return Ok(Outcome {
            status: 400,
            body: model::error(
                "invalid input",
                &format!("fencing_token must be a number, not {token:?}"),
            ),
        });
    };
    let not_released = |status, kind, message: String| {
        let mut o = Outcome {
            status,
            body: model::error(kind, &message),
        };
        o.body["released"] = json!(false);
        o
    };
    Ok(match rw.lock(name).force_unlock_held(holder, token)? {
        ForcedRelease::Released => Outcome::ok(json!({
            "ok": true,
            "lock": name,
            "released": true,
            "message": format!("force-unlocked {name} (held by {holder}, fencing token {token})"),
        })),
        ForcedRelease::NotHeld => {
            not_released(404, "not found", format!("lock {name:?} is not held"))
        }
        ForcedRelease::HeldByAnother => not_released(
            409,
            "conflict",
            format!(
                "lock {name:?} is no longer held by {holder} with fencing token {token}: \
                 nothing was released; look again"
            ),
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_requeue_count_is_a_positive_number_or_all() {
        assert_eq!(requeue_count(None), Ok(None));
        assert_eq!(requeue_count(Some("all")), Ok(None));
        assert_eq!(requeue_count(Some("3")), Ok(Some(3)));
        assert!(requeue_count(Some("0")).is_err());
        assert!(requeue_count(Some("-1")).is_err());
        assert!(requeue_count(Some("x")).is_err());
        assert_eq!(requeue_count(Some("1000000")), Ok(Some(MAX_COUNT)));
        assert!(requeue_count(Some("1000001")).is_err());
        assert!(requeue_count(Some("18446744073709551615")).is_err());
    }
}
