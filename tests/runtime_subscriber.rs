//! The subscriber's connection after it has idled: the `redis` crate
//! counts every read that times out as a reply still owed and skips that
//! many later non-push replies, so the error replies to a subscription
//! sent after the listener's first idle poll (100 ms) were never seen: a
//! refusal (`NOPERM`) or a `MOVED` left the subscription silently never
//! taking effect, and wake-ups fell back to the guard sweep.
//!
//! The test reproduces the exact read pattern on a real `redis-server`:
//! the listener idles (its connection shows `idle >= 1` s in `CLIENT
//! LIST`, so reads of 100 ms have timed out), then a queue is opened whose
//! wake channel the ACL refuses, then the ACL allows it.

mod support;

use std::time::Duration;

use redwheel::{QueueOptions, Redwheel};
use support::RedisServer;
use support::cluster::wait_until;

const HANG: Duration = Duration::from_secs(30);

/// The listener's connection of `user` (RESP3, the only one), if any:
/// how long it has been idle, in seconds.
fn listener_idle(server: &RedisServer, user: &str) -> Option<u64> {
    let list = server.cmd(&["CLIENT", "LIST"]);
    let user = format!("user={user}");
    list.lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|fields| fields.contains(&user.as_str()) && fields.contains(&"resp=3"))
        .find_map(|fields| {
            fields
                .iter()
                .find_map(|f| f.strip_prefix("idle="))
                .and_then(|n| n.parse().ok())
        })
}

fn shard_subscribers(server: &RedisServer, channel: &str) -> i64 {
    // *2 $len channel :n
    let reply = server.cmd(&["PUBSUB", "SHARDNUMSUB", channel]);
    reply
        .lines()
        .last()
        .and_then(|l| l.strip_prefix(':'))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

#[test]
fn a_subscription_refused_after_the_listener_idled_is_retried_and_takes_effect_once_allowed() {
    let server = RedisServer::start();
    // May run every command on every key, but publish or subscribe only
    // to channels named `allowed:*`.
    let ok = server.cmd(&[
        "ACL",
        "SETUSER",
        "sub",
        "on",
        ">pw",
        "~*",
        "resetchannels",
        "&allowed:*",
        "+@all",
    ]);
    assert_eq!(ok.trim(), "+OK");
    let url = format!("redis://sub:pw@127.0.0.1:{}/", server.port());
    let consumer = Redwheel::connect(&url).unwrap();
    // The listener has idled: its reads of 100 ms have timed out.
    wait_until("the listener idles for a second", HANG, || {
        listener_idle(&server, "sub").is_some_and(|idle| idle >= 1)
    });
    // Its wake channel is refused (NOPERM) ...
    let q = consumer
        .queue_with::<String>(
            "refused",
            QueueOptions::default().guard_interval(Duration::from_secs(600)),
        )
        .unwrap();
    let channel = "redwheel:{refused}:wake";
    wait_until("the subscription is refused", HANG, || {
        server.cmd(&["ACL", "LOG"]).contains(channel)
    });
    // ... until the ACL allows every channel: a listener that saw the
    // refusal retries on its backoff and subscribes now.
    let ok = server.cmd(&["ACL", "SETUSER", "sub", "allchannels"]);
    assert_eq!(ok.trim(), "+OK");
    wait_until(
        "the refused subscription is retried and takes effect",
        HANG,
        || shard_subscribers(&server, channel) == 1,
    );

    // What it is for: a message offered by another process (gone since,
    // so only the consumer's process can move it) is announced on the
    // wake channel, and taken at its due time, not at the guard sweep 10
    // minutes later.
    let producer = server.connect();
    producer
        .queue::<String>("refused")
        .unwrap()
        .offer(&"due soon".to_string(), Duration::from_millis(300))
        .unwrap();
    producer.shutdown(Duration::from_secs(10)).unwrap();
    let got = q.poll(Duration::from_secs(10)).unwrap();
    assert_eq!(got.map(|m| m.into_payload()).as_deref(), Some("due soon"));
}
