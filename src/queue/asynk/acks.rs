//! The acks of `ack_async`, sent together: the acks of one queue that
//! come while an earlier batch is on the wire go out as the next batch,
//! in one `claim.lua` call that claims nothing (`count` 0), as the consumer
//! pool sends its acks with its claims. Redis spends a fraction of an
//! `ack.lua` call per ack, and the first ack of a quiet queue goes out at
//! once (no waiting for company).
//!
//! `claim.lua` says how many of a batch's acks were refused, not which: a
//! batch with a refusal is settled ack by ack with `ack.lua` (idempotent:
//! an ack the batch applied answers "nothing to do"), so each caller gets
//! its own answer. That holds because no call carries two acks of one
//! message: an ack refused in the call (a stale claim's) would find the
//! message deleted by the other (the current claim's) and answer "nothing
//! to do" instead of being refused, so a second ack of a message waits for
//! the next call. The batch is a request (`queue/request.rs`): one whose
//! reply was lost is sent again and answered from its reply record.

use std::sync::Arc;

use redis::Value;

use super::coalesce::{Answer, PendingAck, copy_error};

use crate::error::{Access, Error, ErrorKind};
use crate::queue::claim::claim_keys;
use crate::queue::delivery::ack_keys;
use crate::queue::pop::Unresolved;
use crate::queue::request::Request;
use crate::queue::state::QueueState;
use crate::runtime::{Backoff, Cell, Command, Runtime, first_reply};
use crate::scripts;

/// Most acks one batch carries.
const MAX_BATCH: usize = 1_000;

/// Queues the ack of `id` under claim `token`; its answer comes in the
/// returned cell. Sends a batch at once if none is on the wire.
pub(crate) fn ack(
    rt: &Arc<Runtime>,
    state: &Arc<QueueState>,
    visibility_ms: String,
    id: &str,
    token: &str,
) -> Arc<Answer<i64>> {
    let answer = Arc::new(Answer::default());
    let item = PendingAck {
        id: id.to_owned(),
        token: token.to_owned(),
        answer: Arc::clone(&answer),
    };
    let rt = Arc::clone(rt);
    state.acks.push(
        state,
        |s| &s.acks,
        MAX_BATCH,
        item,
        move |state, batch| {
            let (rt, visibility_ms) = (Arc::clone(&rt), visibility_ms.clone());
            async move { send_batch(&rt, &state, &visibility_ms, batch).await }
        },
    );
    answer
}

/// Sends one batch and answers each of its acks: in one call, or, if it
/// acks a message twice, in one call per ack of it (see the module doc).
async fn send_batch(
    rt: &Arc<Runtime>,
    state: &QueueState,
    visibility_ms: &str,
    mut batch: Vec<PendingAck>,
) {
    while !batch.is_empty() {
        let mut seen = std::collections::HashSet::with_capacity(batch.len());
        let (now, later): (Vec<_>, Vec<_>) =
            batch.into_iter().partition(|a| seen.insert(a.id.clone()));
        send_call(rt, state, visibility_ms, now).await;
        batch = later;
    }
}

/// Sends the acks of `batch` (each of another message) in one call and
/// answers each.
async fn send_call(
    rt: &Arc<Runtime>,
    state: &QueueState,
    visibility_ms: &str,
    batch: Vec<PendingAck>,
) {
    let keys = &state.keys;
    let req = Request::new(keys);
    let n = batch.len().to_string();
    let mut args: Vec<&[u8]> = vec![
        visibility_ms.as_bytes(),
        req.token.as_bytes(),
        b"0",
        req.seq_arg.as_bytes(),
        req.ttl_arg.as_bytes(),
        n.as_bytes(),
    ];
    for a in &batch {
        args.push(a.id.as_bytes());
        args.push(a.token.as_bytes());
    }
    let command = Command::script(&scripts::CLAIM, &claim_keys(keys, &req.key), &args);
    let mut unresolved = Unresolved::default();
    let mut backoff = Backoff::new(rt.options.reconnect_min, rt.options.reconnect_max);
    let reply = loop {
        let r = rt
            .call(&keys.inflight, Access::Write, command.clone(), None)
            .await
            .and_then(|v| first_reply(v, Access::Write));
        match r {
            Ok(v) => break Ok(v),
            Err(e) if e.is_outcome_unknown() || (e.is_transient() && unresolved.pending()) => {
                // It may have run: the same request again, answered from
                // its reply record.
                unresolved.lost();
                if rt.is_shut_down() || unresolved.too_old() {
                    break Err(unresolved.outcome_unknown("ack", Some(e)));
                }
                rt.wait_for(&Arc::new(Cell::default()), Some(backoff.step()))
                    .await;
            }
            Err(e) => break Err(e),
        }
    };
    let counts = reply.and_then(|v| match v {
        Value::Array(items) => match items.as_slice() {
            [_, _, _, Value::Int(refused), Value::Int(acked), ..] => Ok((*refused, *acked)),
            _ => Err(protocol()),
        },
        _ => Err(protocol()),
    });
    match counts {
        Ok((0, acked)) => {
            state.metrics.acked.add(acked.max(0) as u64);
            // In-flight slots freed: a claim held back by max_in_flight
            // looks again.
            state.gate.slot_freed();
            // Each applied now or found its message gone: as ack.lua's
            // 1 or 0, told apart only in the count.
            for a in batch {
                a.answer.set(Ok(0));
            }
        }
        Ok((_, acked)) => {
            state.metrics.acked.add(acked.max(0) as u64);
            // Some were refused: each asks on its own (idempotent).
            for a in batch {
                let command = Command::script(
                    &scripts::ACK,
                    &ack_keys(keys),
                    &[a.id.as_bytes(), a.token.as_bytes()],
                );
                let r = rt
                    .call(&keys.inflight, Access::Write, command, None)
                    .await
                    .and_then(|v| first_reply(v, Access::Write))
                    .and_then(|v| redis::from_redis_value::<i64>(v).map_err(|_| protocol()));
                a.answer.set(r);
            }
        }
        Err(e) => {
            for a in batch {
                a.answer.set(Err(copy_error(&e)));
            }
        }
    }
}

fn protocol() -> Error {
    Error::new(ErrorKind::Protocol, "unexpected reply to claim.lua (acks)")
}
