//! The actions, each through the library's own operation: `Queue::requeue_dead`,
//! `Queue::remove`, `Queue::pause`, `Queue::resume`,
//! `Queue::trigger_schedule`, `Lock::force_unlock`. Run on a helper thread (see
//! `bounded.rs`); the checks of who may act are in `guard.rs`.

use serde_json::{Value, json};

use super::model;
use super::router::Action;
use crate::error::{Error, ErrorKind};
use crate::queue::{MessageId, Queue};
use crate::runtime::Redwheel;

/// Dead letters requeued per call when all are asked for.
const REQUEUE_BATCH: usize = 1_000;

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

/// How many dead letters to requeue: `?count=N` (N >= 1) or all.
pub(crate) fn requeue_count(param: Option<&str>) -> Result<Option<usize>, String> {
    match param {
        None | Some("all") | Some("") => Ok(None),
        Some(n) => match n.parse::<usize>() {
            Ok(n) if n >= 1 => Ok(Some(n)),
            _ => Err(format!("count must be a number >= 1 or `all`, not {n:?}")),
        },
    }
}

/// Does `action`.
pub(crate) fn perform(rw: &Redwheel, action: &Action, count: Option<usize>) -> Outcome {
    let done = match action {
        Action::RequeueDead { queue } => requeue(rw, queue, count),
        Action::Remove { queue, id } => remove(rw, queue, id),
        Action::Pause { queue } => pause(rw, queue, true),
        Action::Resume { queue } => pause(rw, queue, false),
        Action::TriggerSchedule { queue, schedule } => trigger(rw, queue, schedule),
        Action::ForceUnlock { lock } => force_unlock(rw, lock),
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
    let inspector = rw.inspect_queue(name)?;
    let requeued = match count {
        Some(n) => q.requeue_dead(n)?,
        None => {
            // In batches, and no more than there were: letters that die
            // again meanwhile wait for the next click.
            let there = inspector.stats()?.dead;
            let mut total = 0u64;
            while total < there {
                let n = q.requeue_dead(REQUEUE_BATCH.min((there - total) as usize))?;
                total += n;
                if n == 0 {
                    break;
                }
            }
            total
        }
    };
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

fn force_unlock(rw: &Redwheel, name: &str) -> Result<Outcome, Error> {
    if rw.lock(name).force_unlock()? {
        Ok(Outcome::ok(json!({
            "ok": true,
            "lock": name,
            "released": true,
            "message": format!("force-unlocked {name}"),
        })))
    } else {
        let mut o = Outcome::not_found(format!("lock {name:?} is not held"));
        o.body["released"] = json!(false);
        Ok(o)
    }
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
    }
}
