//! An occurrence fired ahead and claimed ahead by a pool
//! (`ConsumerOptions::claim_ahead`), against a real redis-server: a pause
//! counts it as fired (it runs), and the schedule can still be resumed or
//! replaced before its time (from that occurrence on); given back by the
//! pool at shutdown, it is taken back by an unschedule before its time.
//!
//! The occurrence is fired by hand with a 10 s lead (the library's is
//! 100 ms), so the changes land before it falls due on any machine.

mod ahead_support;
mod support;

use std::time::Duration;

use ahead_support::{Entry, HANG, at_ms, fire_by_hand, key, recording, wait_until};
use crossbeam_channel::Receiver;
use redwheel::schedule::{Schedule, Scheduled};
use redwheel::{Consumer, Queue, Redwheel};
use support::RedisServer;

/// How far ahead of the server's now the occurrence falls.
const AHEAD_MS: u64 = 5_000;

/// An hourly schedule `name` whose first occurrence `o` falls `AHEAD_MS`
/// from now, fired by hand (it waits in `delayed`, listed in
/// `schedules:ahead`; its next is `o` + 1 h). Returns `o`.
fn fired_ahead(server: &RedisServer, q: &Queue<String>, name: &str) -> u64 {
    let o = server.time_ms() + AHEAD_MS;
    let hourly = Schedule::every(Duration::from_secs(3_600)).starting_at(at_ms(o));
    assert_eq!(
        q.schedule(name, &hourly, &"p".to_owned()).unwrap(),
        Scheduled::Created
    );
    let mut con = redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let o = o as i64;
    let reply = fire_by_hand(
        &mut con,
        server,
        q.name(),
        (name, o, o + 3_600_000),
        10_000,
        &[o],
    );
    assert_eq!(reply[2], 1, "the firing was refused: {reply:?}");
    o as u64
}

/// Whether message `id` is claimed (in `inflight`).
fn claimed(server: &RedisServer, queue: &str, id: &str) -> bool {
    server.cmd(&["ZSCORE", &key(queue, "inflight"), id]) != "$-1\r\n"
}

/// Whether message `id` is in the queue at all.
fn exists(server: &RedisServer, queue: &str, id: &str) -> bool {
    server.int(&["HEXISTS", &key(queue, "msg"), id]) == 1
}

/// Queue `name` of a fresh server, and a pool claiming ahead on it that
/// holds the occurrence `o` of schedule "h", fired ahead by hand.
struct Held {
    server: RedisServer,
    _rw: Redwheel,
    q: Queue<String>,
    o: u64,
    id: String,
    consumer: Consumer,
    entries: Receiver<Entry>,
}

fn held(name: &str) -> Held {
    let server = RedisServer::start();
    let rw = server.connect();
    let q = rw.queue::<String>(name).unwrap();
    let o = fired_ahead(&server, &q, "h");
    let id = format!("sched:h:{o}");
    let (consumer, entries) = recording(&q, &server.url(), Duration::from_secs(10));
    wait_until("the occurrence claimed ahead", || {
        claimed(&server, name, &id)
    });
    Held {
        server,
        _rw: rw,
        q,
        o,
        id,
        consumer,
        entries,
    }
}

/// Runs `change` while the pool holds the occurrence, before its time,
/// then checks that the occurrence runs once.
fn while_held(name: &str, change: impl FnOnce(&Queue<String>, u64)) {
    let Held {
        server,
        q,
        o,
        id,
        consumer,
        entries,
        ..
    } = held(name);
    change(&q, o);
    assert!(server.time_ms() < o, "too slow: the test proves less");
    // It runs, once.
    let e = entries.recv_timeout(HANG).expect("the occurrence");
    assert_eq!((e.id.as_str(), e.attempt), (id.as_str(), 1));
    assert!(e.at >= o);
    wait_until("its ack", || !exists(&server, name, &id));
    consumer.shutdown(Duration::from_secs(10)).unwrap();
    assert!(entries.try_recv().is_err(), "the occurrence ran twice");
}

#[test]
fn a_schedule_paused_while_a_pool_holds_its_occurrence_claimed_ahead_can_be_resumed() {
    while_held("resumed", |q, o| {
        // Paused before its time: the occurrence stays with the pool and
        // counts as fired; `last fired` is ahead of the server's now.
        assert!(q.pause_schedule("h").unwrap());
        let info = q.schedules().unwrap();
        assert_eq!(info[0].last_fired, Some(at_ms(o)));
        // Resumed before its time: from that occurrence on.
        let resumed = q.resume_schedule("h");
        assert!(
            matches!(resumed, Ok(true)),
            "resume_schedule while the occurrence is held: {resumed:?}"
        );
        let info = q.schedules().unwrap();
        assert!(!info[0].paused);
        assert_eq!(info[0].next, Some(at_ms(o + 3_600_000)));
    });
}

#[test]
fn a_schedule_whose_occurrence_a_pool_holds_claimed_ahead_can_be_replaced() {
    while_held("replaced", |q, o| {
        // Replaced before its time: the new definition goes on after the
        // occurrence the pool holds (it counts as fired).
        let every2h = Schedule::every(Duration::from_secs(7_200)).starting_at(at_ms(o));
        let replaced = q.schedule("h", &every2h, &"p".to_owned());
        assert!(
            matches!(replaced, Ok(Scheduled::Replaced)),
            "schedule (a replacement) while the occurrence is held: {replaced:?}"
        );
        let info = q.schedules().unwrap();
        assert_eq!(info[0].next, Some(at_ms(o + 7_200_000)), "{info:?}");
        assert_eq!(info[0].last_fired, Some(at_ms(o)));
    });
}

#[test]
fn an_occurrence_counted_as_fired_by_a_pause_and_given_back_is_taken_back_by_an_unschedule() {
    let name = "given";
    let Held {
        server,
        q,
        o,
        id,
        consumer,
        entries,
        ..
    } = held(name);
    assert!(q.pause_schedule("h").unwrap());
    // The pool stops before the occurrence: it goes back to `delayed`.
    consumer.shutdown(Duration::from_secs(10)).unwrap();
    assert_eq!(
        server.cmd(&["ZSCORE", &key(name, "delayed"), &id]),
        format!("${}\r\n{o}\r\n", o.to_string().len())
    );
    // Removed before its time: nothing of the schedule is left to run.
    assert!(q.unschedule("h").unwrap());
    assert!(server.time_ms() < o, "too slow: the test proves nothing");
    assert!(
        !exists(&server, name, &id),
        "{id}, due after the unschedule, is still in the queue"
    );
    assert!(entries.try_recv().is_err());
    assert!(!q.resume_schedule("h").unwrap(), "the schedule is gone");
}
