//! The JSON documents under `/api` (shapes in the module docs). Pages and
//! documents are made from the same values.

use serde_json::{Value, json};

use super::config::Config;
use super::detail::{QueueDetail, SECTIONS, epoch_ms};
use super::payload::show;
use super::refresher::{Row, View};
use crate::lock::inspect::LockInfo;
use crate::queue::inspect::{MessageState, PeekedMessage};
use crate::schedule::ScheduleInfo;

/// Rates rounded to a tenth.
fn tenth(r: f64) -> f64 {
    (r * 10.0).round() / 10.0
}

/// One queue of the overview (`GET /api/queues`).
pub(crate) fn row(r: &Row) -> Value {
    let mut v = json!({
        "name": r.name,
        "status": r.status.as_str(),
        "delivered_per_sec": r.rate.map(tenth),
        "rate_history": r.history.iter().copied().map(tenth).collect::<Vec<_>>(),
    });
    match &r.reading {
        Ok(x) => {
            v["delayed"] = json!(x.delayed);
            v["ready"] = json!(x.ready);
            v["in_flight"] = json!(x.in_flight);
            v["dead"] = json!(x.dead);
            v["oldest_overdue_ms"] = json!(x.oldest_overdue_ms);
            v["next_due_ms"] = json!(x.next_due_ms);
            v["server_time_ms"] = json!(x.server_ms);
            v["delivered"] = json!(x.delivered);
            v["paused"] = json!(x.paused);
            v["error"] = Value::Null;
        }
        Err(e) => {
            for k in [
                "delayed",
                "ready",
                "in_flight",
                "dead",
                "oldest_overdue_ms",
                "next_due_ms",
                "server_time_ms",
                "delivered",
                "paused",
            ] {
                v[k] = Value::Null;
            }
            v["error"] = json!(e);
        }
    }
    v
}

/// One queue (`GET /api/queues/{name}`); `row` is its line of the overview,
/// if the refresher has one (for the rates).
pub(crate) fn queue(d: &QueueDetail, row: Option<&Row>) -> Value {
    let s = &d.stats;
    let mut messages = serde_json::Map::new();
    for ((state, key, _), list) in SECTIONS.iter().zip(&d.messages) {
        let items: Vec<Value> = list
            .iter()
            .map(|m| message(m, *state, d.show.as_deref() == Some(m.id.as_str())))
            .collect();
        messages.insert((*key).to_owned(), Value::Array(items));
    }
    let l = &d.limits;
    let schedules: Vec<Value> = d.schedules.iter().map(schedule).collect();
    json!({
        "name": d.name,
        "server_time_ms": d.server_ms,
        "stats": {
            "delayed": s.delayed,
            "ready": s.ready,
            "in_flight": s.in_flight,
            "dead": s.dead,
            "oldest_overdue_ms": s.oldest_overdue.map(|x| x.as_millis() as u64),
            "next_due_ms": s.next_due.map(epoch_ms),
        },
        "paused": l.paused,
        "controls": {
            "paused": l.paused,
            "rate_limit": l.rate_limit.map(|(max, per)| json!({
                "max": max,
                "per_ms": per.as_millis() as u64,
            })),
            "max_in_flight": l.max_in_flight,
            "max_len": l.max_len,
        },
        "schedules": schedules,
        "delivered_per_sec": row.and_then(|r| r.rate).map(tenth),
        "rate_history": row.map(|r| r.history.iter().copied().map(tenth).collect::<Vec<_>>()).unwrap_or_default(),
        "limit": d.limit,
        "messages": messages,
    })
}

/// One schedule of a queue.
pub(crate) fn schedule(s: &ScheduleInfo) -> Value {
    json!({
        "name": s.name,
        "definition": s.definition,
        "next_ms": s.next.map(epoch_ms),
        "last_fired_ms": s.last_fired.map(epoch_ms),
        "paused": s.paused,
    })
}

/// One message; `full`: the whole payload rather than a preview.
pub(crate) fn message(m: &PeekedMessage, state: MessageState, full: bool) -> Value {
    let mut v = json!({
        "id": m.id,
        "due_ms": m.due_ms,
        "attempts": m.attempts,
    });
    match m.payload.as_deref().map(|p| show(p, full)) {
        Some(p) => {
            v["payload_bytes"] = json!(p.bytes);
            v[if p.is_text {
                "payload_text"
            } else {
                "payload_hex"
            }] = json!(p.body);
            v["payload_truncated"] = json!(p.truncated);
        }
        None => v["payload_bytes"] = Value::Null,
    }
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

/// One held lock (`GET /api/locks`).
pub(crate) fn lock(l: &LockInfo) -> Value {
    let holders: Vec<Value> = l
        .holders
        .iter()
        .map(|(owner, holds)| json!({ "owner": owner, "holds": holds }))
        .collect();
    json!({
        "name": l.name,
        "holders": holders,
        "token": l.token,
        "ttl_ms": l.ttl_ms,
        "last_token": l.last_token,
    })
}

/// `GET /api/status`.
pub(crate) fn status(view: &View, config: &Config) -> Value {
    let (down_for_ms, error) = match &view.redis {
        super::refresher::Redis::Down { down_for, error } => {
            (Some(down_for.as_millis() as u64), Some(error.clone()))
        }
        _ => (None, None),
    };
    let snap = view.snapshot.as_deref();
    json!({
        "redis": view.redis.as_str(),
        "error": error,
        "down_for_ms": down_for_ms,
        "snapshot": snap.map_or(0, |s| s.generation),
        "snapshot_age_ms": view.age.map(|a| a.as_millis() as u64),
        "queues": snap.map(|s| s.rows.len()),
        "last_refresh": snap.map(|s| json!({
            "round_trips": s.cost.round_trips,
            "commands": s.cost.commands,
            "took_ms": s.cost.took.as_millis() as u64,
        })),
        "refresh_interval_ms": config.refresh.as_millis() as u64,
        "read_only": config.read_only,
        "token_required": config.token.is_some(),
        "version": env!("CARGO_PKG_VERSION"),
    })
}

/// An error document.
pub(crate) fn error(kind: &str, message: &str) -> Value {
    json!({ "ok": false, "error": { "kind": kind, "message": message } })
}
