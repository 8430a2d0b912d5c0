//! What the async fault tests (`tests/async_cancel.rs`,
//! `tests/async_trust.rs`) share on top of `faults_common`: the ready list
//! read straight from the server, two messages made ready, and a warm-up
//! of the multiplexed connection and the pop scripts. Included by
//! `#[path]` by the binaries that have both `async_common` and
//! `faults_common`.
#![allow(dead_code)] // each test binary uses a different part

use std::time::Duration;

use std::future::Future;
use std::pin::Pin;

use redwheel::{Error, Message, MessageId, Queue};

use crate::async_common::Manual;
use crate::faults_common::{Env, HANG, scripts, sha, strings};
use crate::support::proxy::{Fault, Rule, RuleHandle};

/// The ids on queue `q`'s ready list, head first.
pub fn ready(env: &Env, q: &str) -> Vec<String> {
    strings(
        &env.server,
        &["LRANGE", &format!("redwheel:{{{q}}}:ready"), "0", "-1"],
    )
}

/// Two messages due now, on the ready list in offer order.
pub fn two_ready(env: &Env, q: &Queue<String>) -> (MessageId, MessageId) {
    let a = q.offer(&"first".to_string(), Duration::ZERO).unwrap();
    let b = q.offer(&"second".to_string(), Duration::ZERO).unwrap();
    env.wait_ready(q.name(), 2);
    (a, b)
}

/// A first use of the multiplexed connection and of the scripts (loaded
/// after a first `NOSCRIPT`), so a fault applies to the command under
/// test itself. The queue is empty.
pub fn warm_up(q: &Queue<String>) {
    Manual::new(q.stats_async()).finish().unwrap();
    assert!(
        Manual::new(q.poll_async(Duration::ZERO))
            .finish()
            .unwrap()
            .is_none()
    );
    assert!(
        Manual::new(q.claim_async(Duration::ZERO))
            .finish()
            .unwrap()
            .is_none()
    );
}

/// A take polled by hand.
pub type Take<'q> =
    Manual<Pin<Box<dyn Future<Output = Result<Message<String>, Error>> + Send + 'q>>>;

/// A take whose reply was lost: the two messages, the take, and the rule
/// that lost its reply.
pub struct LostTake<'q> {
    /// Taken by the take.
    pub a: MessageId,
    /// Still ready.
    pub b: MessageId,
    pub take: Take<'q>,
    pub lost: RuleHandle,
}

/// Queue `q` (warmed up) with two ready messages, `a` then `b`, and a
/// take of it that ran on the server and took `a`, its reply lost: the
/// proxy holds its connection open until the rule is released.
pub fn take_with_its_reply_lost<'q>(env: &Env, q: &'q Queue<String>) -> LostTake<'q> {
    warm_up(q);
    let (a, b) = two_ready(env, q);
    let lost = env.proxy.inject(
        Rule::new(Fault::LoseReply)
            .matching(sha(scripts::TAKE))
            .times(1)
            .hold(),
    );
    let mut take: Take<'q> = Manual::new(Box::pin(q.take_async()));
    assert!(take.poll().is_pending());
    assert!(lost.wait_fired(1, HANG), "the take ran; its reply is gone");
    assert_eq!(ready(env, q.name()), [b.as_str()], "it took `a`");
    LostTake { a, b, take, lost }
}
