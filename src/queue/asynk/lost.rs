//! What a take or claim leaves behind when its future ends without the
//! answer of an attempt that may have run: that answer, learnt on
//! redwheel's threads, for what gives the message(s) back (`take.rs`'s
//! `give_back.lua`, `claim.rs`'s nacks).
//!
//! The answer is the attempt's replies, if they came; if they were lost,
//! the same request is sent again until Redis answers (its reply record
//! answers what the lost attempt did, and the request's slot is held
//! until then, so no later request overwrites the record), for
//! [`RESOLVE_WITHIN`] at most, or until shutdown.

use std::sync::Arc;
use std::time::Instant;

use redis::Value;

use crate::error::Access;
use crate::queue::request::{RESOLVE_WITHIN, Request};
use crate::runtime::{Backoff, Cell, Command, Orphan, Runtime, detach};

/// An [`Orphan`] for the attempts of one pop request (`command`, on
/// `route`'s node): once the answer is known, `then` gets it on
/// redwheel's threads (not at all if Redis could not be asked: logged as
/// an error, `what` naming the call and `else_` what follows then).
pub(super) fn orphan_of(
    rt: &Arc<Runtime>,
    route: &str,
    req: &Arc<Request>,
    command: &Command,
    (what, else_): (&'static str, &'static str),
    then: impl FnOnce(Arc<Runtime>, Vec<Value>) + Send + 'static,
) -> Orphan {
    let (rt, route, req, command) = (
        Arc::downgrade(rt),
        route.to_owned(),
        Arc::clone(req),
        command.clone(),
    );
    Box::new(move |values: Option<Vec<Value>>| {
        let Some(rt) = rt.upgrade() else { return };
        match values {
            Some(values) => then(rt, values),
            None => detach(async move {
                match asked_again(&rt, &route, command, &req).await {
                    Some(values) => then(rt, values),
                    None => {
                        tracing::error!(target: "redwheel::queue", key = %route, "a dropped {what}'s reply was lost and redis could not be asked again: {else_}");
                    }
                }
            }),
        }
    })
}

/// The answer of `command` (the request `_req`, whose slot is held until
/// this ends), sent again until Redis answers; `None` past
/// [`RESOLVE_WITHIN`] or at shutdown.
async fn asked_again(
    rt: &Arc<Runtime>,
    route: &str,
    command: Command,
    _req: &Arc<Request>,
) -> Option<Vec<Value>> {
    let mut backoff = Backoff::new(rt.options.reconnect_min, rt.options.reconnect_max);
    let started = Instant::now();
    loop {
        if rt.is_shut_down() || started.elapsed() >= RESOLVE_WITHIN {
            return None;
        }
        match rt.call(route, Access::Write, command.clone(), None).await {
            Ok(v) => return Some(v),
            Err(_) => {
                rt.wait_for(&Arc::new(Cell::default()), Some(backoff.step()))
                    .await;
            }
        }
    }
}
