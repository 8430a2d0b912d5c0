//! `redwheel schedules QUEUE` (read through the inspector: nothing is
//! opened, nothing fires) and `redwheel schedule set|remove|pause|resume`
//! (through the queue API).

use std::time::SystemTime;

use redwheel::Redwheel;
use redwheel::schedule::{Schedule, ScheduleInfo, Scheduled};
use serde_json::{Value, json};

use crate::args::ScheduleCommand;
use crate::out::{self, Table, emit, emit_json, epoch_ms, or_dash};
use crate::{Failure, code};

/// The next `n` runs of a schedule (from its stored next occurrence).
fn next_runs(info: &ScheduleInfo, n: usize) -> Vec<SystemTime> {
    let (Some(first), Some(schedule)) = (info.next, info.schedule.as_ref()) else {
        return Vec::new();
    };
    std::iter::once(first)
        .chain(schedule.occurrences_after(first))
        .take(n)
        .collect()
}

/// How a schedule reads in a table: its human form, or the stored text
/// when this build cannot read it.
fn shown(info: &ScheduleInfo) -> String {
    info.schedule
        .as_ref()
        .map_or_else(|| info.definition.clone(), Schedule::to_string)
}

pub fn list(rw: &Redwheel, queue: &str, n: usize, json: bool) -> Result<(), Failure> {
    let found = rw.inspect_schedules(queue)?;
    // Times are shown against the Redis server's clock.
    let (_, now) = rw.inspect_queue(queue)?.stats_at()?;
    if json {
        let list: Vec<Value> = found
            .iter()
            .map(|i| {
                json!({
                    "name": i.name,
                    "definition": i.definition,
                    "schedule": i.schedule.as_ref().map(Schedule::to_string),
                    "next_ms": i.next.map(epoch_ms),
                    "last_fired_ms": i.last_fired.map(epoch_ms),
                    "paused": i.paused,
                    "next_runs_ms": next_runs(i, n).into_iter().map(epoch_ms).collect::<Vec<_>>(),
                })
            })
            .collect();
        emit_json(&json!({
            "queue": queue,
            "server_time_ms": now,
            "schedules": list,
        }));
        return Ok(());
    }
    if found.is_empty() {
        emit(&format!("no schedules in {queue}\n"));
        return Ok(());
    }
    let mut t = Table::new(&[
        "NAME",
        "SCHEDULE",
        "NEXT",
        "LAST-FIRED",
        "PAUSED",
        "NEXT-RUNS (UTC)",
    ]);
    for i in &found {
        let runs: Vec<String> = next_runs(i, n)
            .into_iter()
            .map(|t| out::utc(epoch_ms(t)))
            .collect();
        t.row(vec![
            i.name.clone(),
            shown(i),
            or_dash(i.next.map(|t| out::relative(epoch_ms(t), now))),
            or_dash(i.last_fired.map(|t| out::relative(epoch_ms(t), now))),
            if i.paused { "yes" } else { "no" }.to_owned(),
            if runs.is_empty() {
                "-".to_owned()
            } else {
                runs.join(", ")
            },
        ]);
    }
    emit(&t.render());
    Ok(())
}

pub fn change(rw: &Redwheel, c: &ScheduleCommand, json: bool) -> Result<(), Failure> {
    match c {
        ScheduleCommand::Set {
            queue,
            name,
            payload,
            every,
            cron,
            tz,
            catch_up,
        } => {
            let schedule = match (every, cron) {
                (Some(period), _) => Schedule::every(*period),
                (None, Some(expr)) => {
                    let s = Schedule::cron(expr)?;
                    match tz {
                        Some(zone) => s.time_zone(zone)?,
                        None => s,
                    }
                }
                (None, None) => {
                    return Err(Failure::new(code::USAGE, "--every or --cron is needed"));
                }
            }
            .catch_up(*catch_up);
            let q = rw.queue::<Vec<u8>>(queue)?;
            let done = q.schedule(name, &schedule, &payload.as_bytes().to_vec())?;
            let word = match done {
                Scheduled::Created => "created",
                Scheduled::Replaced => "replaced",
                _ => "unchanged",
            };
            // Its next occurrence as stored (by the server's clock).
            let next = q
                .schedules()?
                .into_iter()
                .find(|i| i.name == *name)
                .and_then(|i| i.next)
                .map(epoch_ms);
            if json {
                emit_json(&json!({
                    "queue": queue,
                    "name": name,
                    "result": word,
                    "definition": schedule.definition(),
                    "schedule": schedule.to_string(),
                    "next_ms": next,
                }));
            } else {
                emit(&format!(
                    "{word} schedule {name} of {queue}: {schedule} (next run {})\n",
                    or_dash(next.map(out::utc))
                ));
            }
            Ok(())
        }
        ScheduleCommand::Remove { queue, name } => {
            let q = rw.queue::<Vec<u8>>(queue)?;
            answer(queue, name, "removed", q.unschedule(name)?, json)
        }
        ScheduleCommand::Pause { queue, name } => {
            let q = rw.queue::<Vec<u8>>(queue)?;
            answer(queue, name, "paused", q.pause_schedule(name)?, json)
        }
        ScheduleCommand::Resume { queue, name } => {
            let q = rw.queue::<Vec<u8>>(queue)?;
            answer(queue, name, "resumed", q.resume_schedule(name)?, json)
        }
    }
}

/// Reports a change of one schedule; exit 4 when there was none of that name.
fn answer(queue: &str, name: &str, done: &str, found: bool, json: bool) -> Result<(), Failure> {
    if !found {
        return Err(Failure::new(
            code::NOT_FOUND,
            format!("no schedule {name:?} in queue {queue:?}"),
        ));
    }
    if json {
        emit_json(&json!({ "queue": queue, "name": name, "result": done }));
    } else {
        emit(&format!("{done} schedule {name} of {queue}\n"));
    }
    Ok(())
}
