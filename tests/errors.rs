//! Errors a user can act on: each failure a user meets is a typed
//! [`ErrorKind`] whose `Display` says what redwheel was doing (the queue or
//! lock, the operation or script) and what Redis replied, in words, with
//! what to do; never only the reply (`WRONGTYPE …`, `ERR redwheel: …`), and
//! never the location Redis appends to a script's error (`script: <sha1>,
//! on @user_script:<line>`), which says nothing to a user.
//!
//! Each test runs against a real `redis-server` (tests/support).

mod support;

use std::time::Duration;

use redwheel::{Error, ErrorKind, MessageId, QueueOptions, Redwheel};
use support::{RedisServer, add_acl_user, readme_acl_rules, within};

/// Hang guard for calls that must fail rather than block.
const HANG: Duration = Duration::from_secs(30);

/// A `Redwheel` connected to `server` as ACL user `user` (password `pw`).
fn connect_as(server: &RedisServer, user: &str) -> Redwheel {
    Redwheel::connect(&format!("redis://{user}:pw@127.0.0.1:{}/", server.port())).unwrap()
}

/// What every error of this file must not be: the bare reply, or a reply
/// with the script location Redis appends.
fn assert_not_just_the_reply(e: &Error) {
    let text = e.to_string();
    for raw in [
        "WRONGTYPE",
        "ERR ",
        "NOPERM",
        "OOM",
        "ResponseError",
        "NoPerm",
    ] {
        assert!(!text.starts_with(raw), "starts with the reply: {text}");
    }
    assert!(
        !text.contains("@user_script") && !text.contains("script: "),
        "shows where in a script Redis failed, not what it means: {text}"
    );
    assert!(
        !text.contains("ResponseError") && !text.contains("\"WRONGTYPE\":"),
        "shows the redis crate's rendering of the reply: {text}"
    );
}

#[test]
fn a_users_own_key_where_a_queue_key_should_be_names_the_queue_its_keys_and_the_fix() {
    let server = RedisServer::start();
    let rw = server.connect();
    // The user's own data under the key redwheel uses for queue "mine".
    server.cmd(&["SET", "redwheel:{mine}:delayed", "the user's own data"]);
    let q = rw.queue::<String>("mine").unwrap();
    let e = q
        .offer(&"x".to_string(), Duration::from_secs(5))
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Protocol, "{e}");
    assert_eq!(e.queue(), Some("mine"));
    assert!(
        e.redis_error().is_some(),
        "the reply stays reachable: {e:?}"
    );
    let text = e.to_string();
    assert!(text.starts_with("queue \"mine\": "), "{text}");
    assert!(text.contains("offer.lua"), "names the operation: {text}");
    assert!(text.contains("redwheel:{mine}:*"), "names its keys: {text}");
    assert!(
        text.contains("another program"),
        "says who wrote it: {text}"
    );
    assert!(
        text.contains("another queue name"),
        "says what to do: {text}"
    );
    assert!(
        text.contains(
            "redis replied \"WRONGTYPE Operation against a key holding the wrong kind of value\""
        ),
        "says what Redis replied: {text}"
    );
    assert_not_just_the_reply(&e);

    // A consumer's poll meets it in the ready list: take.lua.
    server.cmd(&["SET", "redwheel:{mine2}:ready", "the user's own data"]);
    let q2 = rw.queue::<String>("mine2").unwrap();
    let e = q2.poll(Duration::ZERO).map(|_| ()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Protocol, "{e}");
    let text = e.to_string();
    assert!(text.contains("take.lua"), "{text}");
    assert!(text.contains("redwheel:{mine2}:*"), "{text}");
    assert_not_just_the_reply(&e);

    // A lock whose key holds the user's own data.
    server.cmd(&["SET", "redwheel:lock:{acct}", "the user's own data"]);
    let e = rw
        .lock("acct")
        .try_lock(Duration::ZERO)
        .map(|_| ())
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Protocol, "{e}");
    let text = e.to_string();
    assert!(
        text.starts_with("lock \"acct\": could not acquire"),
        "{text}"
    );
    assert!(
        text.contains("redwheel:lock:{"),
        "names a lock's keys: {text}"
    );
    assert!(text.contains("WRONGTYPE"), "{text}");
    assert_not_just_the_reply(&e);
}

#[cfg(feature = "async")]
#[test]
fn an_async_call_that_meets_a_users_key_says_the_same() {
    let server = RedisServer::start();
    let rw = server.connect();
    server.cmd(&["SET", "redwheel:{mine}:ready", "the user's own data"]);
    let q = rw.queue::<String>("mine").unwrap();
    let e = redwheel_testkit::block_on(q.poll_async(Duration::ZERO))
        .map(|_| ())
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Protocol, "{e}");
    let text = e.to_string();
    assert!(text.starts_with("queue \"mine\": "), "{text}");
    assert!(text.contains("take.lua"), "{text}");
    assert!(text.contains("redwheel:{mine}:*"), "{text}");
    assert_not_just_the_reply(&e);
}

#[test]
fn an_acl_refusal_names_the_operation_and_how_to_grant_what_is_missing() {
    let server = RedisServer::start();

    // A script's command refused (no SPUBLISH: every offer publishes).
    add_acl_user(
        &server,
        "nopublish",
        "pw",
        &readme_acl_rules().replace(" +spublish", ""),
    );
    let rw = connect_as(&server, "nopublish");
    let q = rw.queue::<String>("noperm").unwrap();
    let e = q.offer(&"x".to_string(), Duration::ZERO).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{e}");
    assert!(!e.is_transient());
    let text = e.to_string();
    assert!(text.starts_with("queue \"noperm\": "), "{text}");
    assert!(text.contains("offer.lua"), "names the operation: {text}");
    assert!(text.contains("lacks a permission"), "{text}");
    assert!(
        text.contains("ACL LOG"),
        "says where the refusal is named: {text}"
    );
    assert!(
        text.contains("ACL SETUSER"),
        "says which rules to grant: {text}"
    );
    assert_not_just_the_reply(&e);

    // The same inside a pipeline (a claim after its blocking wait), with
    // no HINCRBY for the attempt count.
    add_acl_user(
        &server,
        "noincr",
        "pw",
        &readme_acl_rules().replace(" +hincrby", ""),
    );
    let rw = connect_as(&server, "noincr");
    let q = rw.queue::<String>("noperm-claim").unwrap();
    q.offer(&"x".to_string(), Duration::from_millis(50))
        .unwrap();
    let e = within(HANG, move || {
        q.claim(Duration::from_secs(5)).map(|_| ()).unwrap_err()
    });
    assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{e}");
    let text = e.to_string();
    assert!(text.contains("claim.lua"), "{text}");
    assert_not_just_the_reply(&e);

    // Keys outside the user's patterns: Redis refuses the script call
    // itself (NOPERM), before any script runs.
    add_acl_user(
        &server,
        "otherkeys",
        "pw",
        "resetkeys ~other:* resetchannels &redwheel:* +@all",
    );
    let rw = connect_as(&server, "otherkeys");
    let q = rw.queue::<String>("keys").unwrap();
    let e = q.offer(&"x".to_string(), Duration::ZERO).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{e}");
    let text = e.to_string();
    assert!(text.starts_with("queue \"keys\": "), "{text}");
    assert!(
        text.contains("~redwheel:*"),
        "names the key pattern to grant: {text}"
    );
    assert!(text.contains("redis replied \"NOPERM "), "{text}");
    assert_not_just_the_reply(&e);
}

#[test]
fn a_full_queue_says_how_full_and_what_to_do_instead_of_the_scripts_reply() {
    let server = RedisServer::start();
    let rw = server.connect();
    let q = rw
        .queue_with::<String>("full", QueueOptions::default().max_len(1))
        .unwrap();
    q.offer(&"a".to_string(), Duration::from_secs(60)).unwrap();
    let e = q
        .offer(&"b".to_string(), Duration::from_secs(60))
        .unwrap_err();
    assert_full(&e);

    #[cfg(feature = "async")]
    {
        let e =
            redwheel_testkit::block_on(q.offer_async(&"c".to_string(), Duration::from_secs(60)))
                .unwrap_err();
        assert_full(&e);
    }
    assert_eq!(q.len().unwrap(), 1, "nothing was written");
}

fn assert_full(e: &Error) {
    assert_eq!(e.kind(), ErrorKind::QueueFull, "{e}");
    assert!(!e.is_transient());
    let text = e.to_string();
    assert!(text.starts_with("queue \"full\": "), "{text}");
    assert!(text.contains("offer"), "names the operation: {text}");
    assert!(
        text.contains("holds 1 of its max_len of 1"),
        "says how full, in words: {text}"
    );
    assert!(text.contains("nothing was written"), "{text}");
    assert!(
        text.contains("QueueOptions::max_len"),
        "names the option to raise: {text}"
    );
    assert!(
        !text.contains("redwheel: queue full"),
        "the script's own reply is for redwheel, not for the user: {text}"
    );
    assert_not_just_the_reply(e);
}

#[test]
fn an_oversized_payload_names_the_queue_the_sizes_and_the_option() {
    let server = RedisServer::start();
    let rw = server.connect();
    let q = rw
        .queue_with::<String>("small", QueueOptions::default().max_payload_bytes(4))
        .unwrap();
    let e = q.offer(&"abcdef".to_string(), Duration::ZERO).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::PayloadTooLarge, "{e}");
    assert!(e.is_invalid_input());
    let text = e.to_string();
    assert!(text.starts_with("queue \"small\": "), "{text}");
    assert!(
        text.contains("6 bytes") && text.contains("4 bytes"),
        "{text}"
    );
    assert!(
        text.contains("QueueOptions::max_payload_bytes"),
        "names the option to raise: {text}"
    );
    assert_eq!(q.len().unwrap(), 0, "nothing was written");
}

#[test]
fn an_invalid_name_or_id_says_which_and_why() {
    let server = RedisServer::start();
    let rw = server.connect();

    let e = rw.queue::<String>("orders{eu}").map(|_| ()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidName, "{e}");
    let text = e.to_string();
    assert!(text.contains("invalid queue name \"orders{eu}\""), "{text}");
    assert!(text.contains("hash tag"), "says why: {text}");

    let e = rw
        .lock("")
        .try_lock(Duration::ZERO)
        .map(|_| ())
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidName, "{e}");
    assert!(
        e.to_string()
            .contains("invalid lock name \"\": must not be empty"),
        "{e}"
    );

    let q = rw.queue::<String>("ids").unwrap();
    let long = MessageId::from("x".repeat(10_000));
    let e = q
        .offer_with_id(&long, &"x".to_string(), Duration::ZERO)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidId, "{e}");
    let text = e.to_string();
    assert!(
        text.starts_with("queue \"ids\": invalid message id"),
        "{text}"
    );
}

#[test]
fn redis_down_says_where_it_tried_and_whether_the_write_may_have_happened() {
    let mut server = RedisServer::start();
    let rw = server.connect();
    let q = rw.queue::<String>("down").unwrap();
    let port = server.port();
    server.kill();
    // The first offer may go out on a pooled connection that the dying
    // server closed: sent or not, nobody can tell.
    let e = q.offer(&"x".to_string(), Duration::ZERO).unwrap_err();
    assert!(e.is_transient(), "{e}");
    let text = e.to_string();
    assert!(text.starts_with("queue \"down\": "), "{text}");
    match e.kind() {
        ErrorKind::OutcomeUnknown => {
            assert!(text.contains("may or may not have happened"), "{text}")
        }
        ErrorKind::Unavailable => {}
        other => panic!("{other:?}: {text}"),
    }
    // From then on every call finds no server at the address.
    let e = q.offer(&"x".to_string(), Duration::ZERO).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    let text = e.to_string();
    assert!(text.starts_with("queue \"down\": "), "{text}");
    assert!(
        text.contains(&format!("cannot connect to redis at 127.0.0.1:{port}")),
        "{text}"
    );

    let e = rw
        .lock("down")
        .try_lock(Duration::ZERO)
        .map(|_| ())
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    let text = e.to_string();
    assert!(
        text.starts_with("lock \"down\": could not acquire"),
        "{text}"
    );
    assert!(text.contains(&format!("127.0.0.1:{port}")), "{text}");
}

#[test]
fn an_out_of_memory_redis_says_so_and_what_to_do() {
    let server = RedisServer::start();
    let rw = server.connect();
    let q = rw.queue::<String>("oom").unwrap();
    q.offer(&"before".to_string(), Duration::from_secs(60))
        .unwrap();
    // Any memory in use is over a 1-byte limit: every write is refused.
    server.cmd(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
    server.cmd(&["CONFIG", "SET", "maxmemory", "1"]);
    let e = q.offer(&"x".to_string(), Duration::ZERO).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Server, "{e}");
    assert!(!e.is_transient());
    let text = e.to_string();
    assert!(text.starts_with("queue \"oom\": "), "{text}");
    assert!(text.contains("out of memory"), "says what it means: {text}");
    assert!(text.contains("maxmemory"), "names the setting: {text}");
    assert!(text.contains("redis replied \"OOM "), "{text}");
    assert_not_just_the_reply(&e);
    server.cmd(&["CONFIG", "SET", "maxmemory", "0"]);
}
