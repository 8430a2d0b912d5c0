//! Connecting for production: URLs, credentials, a least-privilege ACL
//! user, TLS, and what each failure says.

mod support;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::time::Duration;

use redwheel::{ConsumerOptions, Dedup, ErrorKind, Limit, OfferOptions, QueueOptions, Redwheel};
use support::{RedisServer, add_acl_user, readme_acl_rules, within};

const HANG: Duration = Duration::from_secs(60);

/// Everything the queue API does, end to end.
fn exercise(rw: &Redwheel) {
    let q = rw.queue::<String>("acl").unwrap();
    q.clear().unwrap();
    let later = q
        .offer(&"later".to_string(), Duration::from_secs(60))
        .unwrap();
    q.offer_batch(&[("b".to_string(), Duration::ZERO)]).unwrap();
    q.offer_with_id(&"fixed".into(), &"c".to_string(), Duration::ZERO)
        .unwrap();
    assert_eq!(q.len().unwrap(), 3);
    assert!((1..=3).contains(&q.delayed_len().unwrap()));
    let got = within(HANG, {
        let q = q.clone();
        move || (q.take().unwrap(), q.take().unwrap())
    });
    let mut payloads = [got.0.into_payload(), got.1.into_payload()];
    payloads.sort();
    assert_eq!(payloads, ["b", "c"]);
    assert!(q.poll(Duration::from_millis(20)).unwrap().is_none());
    assert!(q.remove(&later).unwrap());
    assert!(q.dead_letter_ids(10).unwrap().is_empty());
    // An undecodable payload is parked (park.lua) by the same user.
    let bytes = rw.queue::<Vec<u8>>("acl").unwrap();
    let bad = bytes.offer(&vec![0xff], Duration::ZERO).unwrap();
    let err = within(HANG, {
        let q = q.clone();
        move || q.take().unwrap_err()
    });
    assert_eq!(err.kind(), ErrorKind::Decode, "{err}");
    assert_eq!(q.dead_letter_ids(10).unwrap(), vec![bad]);
    assert_eq!(q.clear().unwrap(), 1);

    // The at-least-once side: claim, ack, nack, extend, a delivery past
    // its limit, dead letters, requeue, stats and a consumer pool.
    let r = rw
        .queue_with::<String>(
            "acl-reliable",
            QueueOptions::default()
                .visibility(Duration::from_secs(5))
                .max_deliveries(2),
        )
        .unwrap();
    r.clear().unwrap();
    r.offer_batch(&[
        ("x".to_string(), Duration::ZERO),
        ("y".to_string(), Duration::ZERO),
    ])
    .unwrap();
    let batch = within(HANG, {
        let r = r.clone();
        move || {
            let mut got = Vec::new();
            while got.len() < 2 {
                got.extend(r.claim_batch(2, Duration::from_secs(1)).unwrap());
            }
            got
        }
    });
    for d in &batch {
        d.extend(Duration::from_secs(10)).unwrap();
    }
    let stats = r.stats().unwrap();
    assert_eq!(stats.in_flight, 2);
    let mut batch = batch.into_iter();
    batch.next().unwrap().ack().unwrap();
    // Nacked twice: past `max_deliveries`, a dead letter.
    batch.next().unwrap().nack(Duration::ZERO).unwrap();
    let again = within(HANG, {
        let r = r.clone();
        move || r.claim(Duration::from_secs(5)).unwrap().unwrap()
    });
    assert_eq!(again.attempt(), 2);
    again.nack(Duration::ZERO).unwrap();
    let dead = r.dead_letters(10).unwrap();
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(r.requeue_dead(10).unwrap(), 1);
    let handled = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let consumer = {
        let handled = std::sync::Arc::clone(&handled);
        r.consume(
            ConsumerOptions::default().concurrency(2),
            move |_d| -> Result<(), String> {
                handled.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                Ok(())
            },
        )
        .unwrap()
    };
    within(HANG, {
        let r = r.clone();
        move || {
            while r.len().unwrap() > 0 {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    });
    consumer.shutdown(Duration::from_secs(10)).unwrap();
    assert_eq!(handled.load(std::sync::atomic::Ordering::SeqCst), 1);
    r.clear().unwrap();

    // The queue controls: offer options in each dedup mode, a priority, a
    // ttl, the limits, pause and resume.
    let c = rw
        .queue_with::<String>(
            "acl-controls",
            QueueOptions::default()
                .rate_limit(100, Duration::from_secs(1))
                .max_in_flight(10)
                .max_len(100),
        )
        .unwrap();
    c.clear().unwrap();
    let o = || {
        OfferOptions::default()
            .priority(5)
            .ttl(Duration::from_secs(60))
    };
    c.offer_with(
        &"t".to_string(),
        o().id("t").dedup(Dedup::Throttle(Duration::from_secs(60))),
    )
    .unwrap();
    c.offer_with(&"d".to_string(), o().id("d").dedup(Dedup::Debounce))
        .unwrap();
    c.offer_with(&"d2".to_string(), o().id("d").dedup(Dedup::Debounce))
        .unwrap();
    c.offer_with(&"k".to_string(), o().id("t")).unwrap();
    c.pause().unwrap();
    assert!(c.is_paused().unwrap());
    c.resume().unwrap();
    let d = within(HANG, {
        let c = c.clone();
        move || c.claim(Duration::from_secs(5)).unwrap().unwrap()
    });
    d.ack().unwrap();
    assert!(c.take().is_ok());
    assert_eq!(c.limits().unwrap().max_len, Some(100));
    c.lift_limit(Limit::RateLimit).unwrap();
    assert_eq!(c.stats().unwrap().ready, 0);
    c.clear().unwrap();
    // Recurring schedules: declare, fire, list, pause, resume, remove.
    let s = rw.queue::<String>("acl-schedules").unwrap();
    let every = redwheel::schedule::Schedule::every(Duration::from_millis(20));
    s.schedule("tick", &every, &"t".to_string()).unwrap();
    within(HANG, {
        let s = s.clone();
        move || s.take().unwrap()
    });
    assert_eq!(s.schedules().unwrap().len(), 1);
    assert_eq!(rw.inspect_schedules("acl-schedules").unwrap().len(), 1);
    assert!(s.pause_schedule("tick").unwrap());
    assert!(s.resume_schedule("tick").unwrap());
    assert!(s.unschedule("tick").unwrap());
}

#[test]
fn a_least_privilege_acl_user_runs_every_queue_operation() {
    let server = RedisServer::start();
    add_acl_user(&server, "app", "s3cret", &readme_acl_rules());
    server.cmd(&["ACL", "LOG", "RESET"]);
    let rw =
        Redwheel::connect(&format!("redis://app:s3cret@127.0.0.1:{}/", server.port())).unwrap();
    exercise(&rw);
    // The guard sweep and the subscriber ran meanwhile too: the subscriber
    // (a RESP3 connection) is subscribed under this user.
    let q = rw.queue::<String>("acl-sweep").unwrap();
    let give_up = std::time::Instant::now() + HANG;
    while !server
        .cmd(&["PUBSUB", "SHARDNUMSUB", "redwheel:{acl-sweep}:wake"])
        .ends_with(":1\r\n")
    {
        assert!(std::time::Instant::now() < give_up, "never subscribed");
        std::thread::sleep(Duration::from_millis(10));
    }
    q.offer(&"x".to_string(), Duration::from_millis(5)).unwrap();
    within(HANG, move || q.take().unwrap());
    rw.shutdown(Duration::from_secs(10)).unwrap();
    // Nothing redwheel sent was refused, not even a command whose error a
    // client library would swallow.
    let log = server.cmd(&["ACL", "LOG"]);
    assert_eq!(
        log.trim(),
        "*0",
        "denied by the ACL: {}",
        log.replace("\r\n", " ")
    );
    // The rules do refuse what redwheel does not need.
    let other =
        Redwheel::connect(&format!("redis://app:s3cret@127.0.0.1:{}/", server.port())).unwrap();
    drop(other);
    let denied = server.cmd(&[
        "ACL",
        "DRYRUN",
        "app",
        "LRANGE",
        "redwheel:{x}:ready",
        "0",
        "-1",
    ]);
    assert!(denied.contains("no permissions"), "{denied}");
    let denied = server.cmd(&["ACL", "DRYRUN", "app", "SET", "other", "1"]);
    assert!(denied.contains("no permissions"), "{denied}");
}

#[test]
fn a_missing_permission_is_a_typed_non_transient_error() {
    let server = RedisServer::start();
    // No SPUBLISH: every offer script fails on it.
    let rules = readme_acl_rules().replace(" +spublish", "");
    add_acl_user(&server, "app", "pw", &rules);
    let rw = Redwheel::connect(&format!("redis://app:pw@127.0.0.1:{}/", server.port())).unwrap();
    let q = rw.queue::<String>("noperm").unwrap();
    let err = q.offer(&"x".to_string(), Duration::ZERO).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::PermissionDenied, "{err}");
    assert!(!err.is_transient());
    assert!(err.to_string().contains("lacks a permission"), "{err}");

    // The same from a script run after a blocking wait (a pipeline): a
    // claim that finds a message but may not count its attempt.
    let rules = readme_acl_rules().replace(" +hincrby", "");
    add_acl_user(&server, "app2", "pw", &rules);
    let rw = Redwheel::connect(&format!("redis://app2:pw@127.0.0.1:{}/", server.port())).unwrap();
    let q = rw.queue::<String>("noperm-claim").unwrap();
    q.offer(&"x".to_string(), Duration::from_millis(50))
        .unwrap();
    let err = within(HANG, move || q.claim(Duration::from_secs(5)).unwrap_err());
    assert_eq!(err.kind(), ErrorKind::PermissionDenied, "{err}");
    assert!(!err.is_transient());
}

#[test]
fn wrong_credentials_are_a_clear_non_transient_error() {
    let server = RedisServer::start();
    add_acl_user(&server, "app", "right", &readme_acl_rules());
    let url = format!("redis://app:wrong@127.0.0.1:{}/", server.port());
    let err = Redwheel::connect(&url).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Authentication, "{err:?}");
    assert!(!err.is_transient() && !err.is_invalid_input());
    let text = err.to_string();
    assert!(text.contains("refused the credentials"), "{text}");
    assert!(!text.contains("wrong"), "no password in messages: {text}");
    // Once refused, connect returns: no retry loop behind it.
    assert_eq!(server.calls("auth"), 1);
}

#[test]
fn a_server_that_is_not_redis_is_named_as_such() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming().take(4) {
            let Ok(mut s) = stream else { continue };
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf);
            let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n");
        }
    });
    let err = Redwheel::connect(&format!("redis://127.0.0.1:{port}/")).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Protocol, "{err:?}");
    assert!(!err.is_transient());
    assert!(
        err.to_string().contains(&format!(
            "the server at 127.0.0.1:{port} did not answer as redis does"
        )),
        "{err}"
    );
}

#[test]
fn error_messages_say_what_went_wrong() {
    let err = Redwheel::connect("redis://127.0.0.1:notaport/").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidUrl);
    assert!(
        err.to_string()
            .starts_with("invalid redis URL \"redis://127.0.0.1:notaport/\""),
        "{err}"
    );
    let err = Redwheel::connect("http://127.0.0.1:6379/").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidUrl, "{err}");
    let port = support::free_port();
    let err = Redwheel::connect(&format!("redis://127.0.0.1:{port}/")).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable);
    assert!(
        err.to_string()
            .starts_with(&format!("cannot connect to redis at 127.0.0.1:{port}: ")),
        "{err}"
    );
    // The cause is printed once, in Display, not again through source().
    assert!(std::error::Error::source(&err).is_none());
}
