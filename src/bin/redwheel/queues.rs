//! The queue subcommands: `stats`, `peek`, `dead` (read through the
//! inspector, which opens no queue) and `requeue-dead`, `remove`,
//! `offer`, `limits`, `pause`, `resume` (through the queue API).

use std::time::Duration;

use redwheel::queue::inspect::{MessageState, PeekedMessage, QueueInspector};
use redwheel::{Limit, MessageId, Queue, QueueLimits, QueueOptions, QueueStats, Redwheel};
use serde_json::{Value, json};

use crate::args::{LiftArg, StateArg};
use crate::out::{self, Table, emit, emit_json, epoch_ms, or_dash};
use crate::{Failure, code};

/// An inspector on `name`, which must have at least one key in Redis.
fn existing(rw: &Redwheel, name: &str) -> Result<QueueInspector, Failure> {
    let q = rw.inspect_queue(name)?;
    if !q.exists()? {
        return Err(Failure::new(
            code::NOT_FOUND,
            format!("unknown queue {name:?}: it has no keys in redis"),
        ));
    }
    Ok(q)
}

/// The named queues (each must exist), or every queue found by SCAN.
pub fn inspectors(rw: &Redwheel, names: &[String]) -> Result<Vec<QueueInspector>, Failure> {
    if names.is_empty() {
        let found = rw.find_queues()?;
        return Ok(found
            .iter()
            .map(|n| rw.inspect_queue(n))
            .collect::<Result<_, _>>()?);
    }
    names.iter().map(|n| existing(rw, n)).collect()
}

// ---------------------------------------------------------------- stats

pub fn stats(rw: &Redwheel, names: &[String], json: bool) -> Result<(), Failure> {
    let queues = inspectors(rw, names)?;
    let mut rows = Vec::with_capacity(queues.len());
    for q in &queues {
        let (s, now) = q.stats_at()?;
        rows.push((q.name().to_owned(), s, now));
    }
    if json {
        let list: Vec<Value> = rows
            .iter()
            .map(|(name, s, now)| stats_json(name, s, *now))
            .collect();
        emit_json(&json!({ "queues": list }));
        return Ok(());
    }
    let mut t = Table::new(&[
        "QUEUE",
        "DELAYED",
        "READY",
        "IN-FLIGHT",
        "DEAD",
        "OLDEST-OVERDUE",
        "NEXT-DUE",
    ]);
    for (name, s, now) in &rows {
        t.row(vec![
            name.clone(),
            s.delayed.to_string(),
            s.ready.to_string(),
            s.in_flight.to_string(),
            s.dead.to_string(),
            or_dash(
                s.oldest_overdue
                    .map(|d| out::human_ms(d.as_millis() as u64)),
            ),
            or_dash(s.next_due.map(|t| out::relative(epoch_ms(t), *now))),
        ]);
    }
    if rows.is_empty() {
        emit("no queues found\n");
    } else {
        emit(&t.render());
    }
    Ok(())
}

fn stats_json(name: &str, s: &QueueStats, now: u64) -> Value {
    json!({
        "queue": name,
        "delayed": s.delayed,
        "ready": s.ready,
        "in_flight": s.in_flight,
        "dead": s.dead,
        "oldest_overdue_ms": s.oldest_overdue.map(|d| d.as_millis() as u64),
        "next_due_ms": s.next_due.map(epoch_ms),
        "expired": s.expired,
        "server_time_ms": now,
    })
}

// ---------------------------------------------------------------- peek, dead

pub fn state_of(a: &StateArg) -> MessageState {
    if a.delayed {
        MessageState::Delayed
    } else if a.inflight {
        MessageState::InFlight
    } else if a.dead {
        MessageState::Dead
    } else {
        MessageState::Ready
    }
}

fn state_name(s: MessageState) -> &'static str {
    match s {
        MessageState::Delayed => "delayed",
        MessageState::InFlight => "inflight",
        MessageState::Dead => "dead",
        _ => "ready",
    }
}

/// One message as `peek --json` gives it: the fields every state has,
/// then the visibility deadline (in flight) or death and reason (dead).
fn message_json(m: &PeekedMessage, state: MessageState) -> Value {
    let payload = m.payload.as_deref();
    let mut v = json!({
        "id": m.id,
        "due_ms": m.due_ms,
        "attempts": m.attempts,
        "payload_text": payload.and_then(|p| std::str::from_utf8(p).ok()),
        "payload_base64": payload.map(out::base64),
        "payload_bytes": payload.map(<[u8]>::len),
    });
    match state {
        MessageState::InFlight => v["visible_until_ms"] = json!(m.since_ms),
        MessageState::Dead => {
            v["died_ms"] = json!(m.since_ms);
            v["reason"] = json!(m.reason);
        }
        _ => {}
    }
    v
}

pub fn peek(
    rw: &Redwheel,
    name: &str,
    state: MessageState,
    n: usize,
    json: bool,
) -> Result<(), Failure> {
    let q = existing(rw, name)?;
    let (_, now) = q.stats_at()?;
    let messages = q.peek(state, n)?;
    if json {
        let list: Vec<Value> = messages.iter().map(|m| message_json(m, state)).collect();
        emit_json(&json!({
            "queue": name,
            "state": state_name(state),
            "server_time_ms": now,
            "messages": list,
        }));
        return Ok(());
    }
    if state == MessageState::Dead {
        emit(&dead_table(&messages, now));
        return Ok(());
    }
    let mut header = vec!["ID", "DUE", "ATTEMPTS"];
    if state == MessageState::InFlight {
        header.push("VISIBLE-UNTIL");
    }
    header.push("PAYLOAD");
    let mut t = Table::new(&header);
    for m in &messages {
        let mut row = vec![
            m.id.clone(),
            or_dash(m.due_ms.map(|d| out::relative(d, now))),
            m.attempts.to_string(),
        ];
        if state == MessageState::InFlight {
            row.push(or_dash(m.since_ms.map(|d| out::relative(d, now))));
        }
        row.push(payload_cell(m));
        t.row(row);
    }
    if messages.is_empty() {
        emit(&format!("no {} messages in {name}\n", state_name(state)));
    } else {
        emit(&t.render());
    }
    Ok(())
}

fn payload_cell(m: &PeekedMessage) -> String {
    m.payload
        .as_deref()
        .map_or_else(|| "(gone)".to_owned(), out::preview)
}

fn dead_table(messages: &[PeekedMessage], now: u64) -> String {
    if messages.is_empty() {
        return "no dead letters\n".to_owned();
    }
    let mut t = Table::new(&["ID", "DIED", "ATTEMPTS", "REASON", "PAYLOAD"]);
    for m in messages {
        t.row(vec![
            m.id.clone(),
            or_dash(m.since_ms.map(|d| out::relative(d, now))),
            m.attempts.to_string(),
            out::preview(m.reason.as_deref().unwrap_or("").as_bytes()),
            payload_cell(m),
        ]);
    }
    t.render()
}

pub fn dead(rw: &Redwheel, name: &str, n: usize, json: bool) -> Result<(), Failure> {
    peek(rw, name, MessageState::Dead, n, json)
}

// ---------------------------------------------------------------- changes

/// Opens `name` through the queue API (raw bytes), if it exists.
fn open(rw: &Redwheel, name: &str) -> Result<Queue<Vec<u8>>, Failure> {
    existing(rw, name)?;
    Ok(rw.queue::<Vec<u8>>(name)?)
}

pub fn requeue_dead(rw: &Redwheel, name: &str, n: usize, json: bool) -> Result<(), Failure> {
    let q = open(rw, name)?;
    let moved = q.requeue_dead(n)?;
    if json {
        emit_json(&json!({ "queue": name, "requeued": moved }));
    } else {
        emit(&format!("requeued {moved} dead letters of {name}\n"));
    }
    Ok(())
}

pub fn remove(rw: &Redwheel, name: &str, ids: &[String], json: bool) -> Result<(), Failure> {
    let q = open(rw, name)?;
    let (mut removed, mut missing) = (Vec::new(), Vec::new());
    for id in ids {
        if q.remove(&MessageId::from(id.as_str()))? {
            removed.push(id.as_str());
        } else {
            missing.push(id.as_str());
        }
    }
    if json {
        emit_json(&json!({ "queue": name, "removed": removed, "not_found": missing }));
    } else {
        for id in &removed {
            emit(&format!("removed {id}\n"));
        }
    }
    if missing.is_empty() {
        Ok(())
    } else {
        Err(Failure::new(
            code::NOT_FOUND,
            format!(
                "{} of {} ids not found in queue {name:?}: {}",
                missing.len(),
                ids.len(),
                missing.join(" ")
            ),
        ))
    }
}

pub fn offer(
    rw: &Redwheel,
    name: &str,
    payload: &str,
    delay: Duration,
    json: bool,
) -> Result<(), Failure> {
    let q = rw.queue::<Vec<u8>>(name)?;
    let id = q.offer(&payload.as_bytes().to_vec(), delay)?;
    if json {
        emit_json(&json!({
            "queue": name,
            "id": id.as_str(),
            "delay_ms": delay.as_millis() as u64,
        }));
    } else {
        emit(&format!("{id}\n"));
    }
    Ok(())
}

// ---------------------------------------------------------------- controls

/// What `limits` sets: the rate limit, max in flight, max length.
type Settings = (Option<(u32, Duration)>, Option<u64>, Option<u64>);

pub fn limits(
    rw: &Redwheel,
    name: &str,
    (rate, max_in_flight, max_len): Settings,
    lift: &[LiftArg],
    json: bool,
) -> Result<(), Failure> {
    let changes =
        rate.is_some() || max_in_flight.is_some() || max_len.is_some() || !lift.is_empty();
    if changes {
        // Through the queue API: opening with these options writes them.
        let mut options = QueueOptions::default();
        if let Some((max, per)) = rate {
            options = options.rate_limit(max, per);
        }
        if let Some(n) = max_in_flight {
            options = options.max_in_flight(n);
        }
        if let Some(n) = max_len {
            options = options.max_len(n);
        }
        let q = rw.queue_with::<Vec<u8>>(name, options)?;
        for l in lift {
            q.lift_limit(match l {
                LiftArg::Rate => Limit::RateLimit,
                LiftArg::MaxInFlight => Limit::MaxInFlight,
                LiftArg::MaxLen => Limit::MaxLen,
            })?;
        }
    }
    let l = if changes {
        rw.inspect_queue(name)?.limits()?
    } else {
        existing(rw, name)?.limits()?
    };
    if json {
        emit_json(&limits_json(name, &l));
    } else {
        let mut t = Table::new(&["QUEUE", "PAUSED", "RATE-LIMIT", "MAX-IN-FLIGHT", "MAX-LEN"]);
        t.row(vec![
            name.to_owned(),
            if l.paused { "yes" } else { "no" }.to_owned(),
            or_dash(
                l.rate_limit
                    .map(|(max, per)| format!("{max}/{}", out::human_ms(per.as_millis() as u64))),
            ),
            or_dash(l.max_in_flight.map(|n| n.to_string())),
            or_dash(l.max_len.map(|n| n.to_string())),
        ]);
        emit(&t.render());
    }
    Ok(())
}

fn limits_json(name: &str, l: &QueueLimits) -> Value {
    json!({
        "queue": name,
        "paused": l.paused,
        "rate_limit": l.rate_limit.map(|(max, per)| json!({
            "max": max,
            "per_ms": per.as_millis() as u64,
        })),
        "max_in_flight": l.max_in_flight,
        "max_len": l.max_len,
    })
}

pub fn pause(rw: &Redwheel, name: &str, paused: bool, json: bool) -> Result<(), Failure> {
    let q = rw.queue::<Vec<u8>>(name)?;
    if paused {
        q.pause()?;
    } else {
        q.resume()?;
    }
    if json {
        emit_json(&json!({ "queue": name, "paused": paused }));
    } else {
        emit(&format!(
            "{} {name}\n",
            if paused { "paused" } else { "resumed" }
        ));
    }
    Ok(())
}
