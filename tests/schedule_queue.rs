//! Recurring schedules on a queue, against a real redis-server: each
//! occurrence becomes one message due at it (never early, in order, under
//! the id `sched:<name>:<ms>`); the upsert is idempotent; unschedule,
//! pause and resume; the listing; bad input; two runtimes sharing the
//! schedules; the guard sweep finding a schedule whose announcement was
//! lost.

mod schedule_support;
mod support;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redwheel::schedule::{CatchUp, Schedule, Scheduled, parse_occurrence_id};
use redwheel::{ErrorKind, Message, QueueOptions, Redwheel};
use support::{RedisServer, within};

const HANG: Duration = Duration::from_secs(60);

fn ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

fn at_ms(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

/// Takes `n` messages (with the server's clock when each was taken).
fn take_n(
    q: &redwheel::Queue<String>,
    server: &RedisServer,
    n: usize,
) -> Vec<(Message<String>, u64)> {
    let q = q.clone();
    let url = server.url();
    within(HANG, move || schedule_support::take_timed(&q, &url, n))
}

#[test]
fn each_occurrence_becomes_one_message_due_at_it_never_early_and_in_order() {
    let server = RedisServer::start();
    let rw = server.connect();
    let q = rw.queue::<String>("ticks").unwrap();
    let start = server.time_ms() + 300;
    // Every occurrence fires however late (a loaded machine may hold the
    // firing up for longer than a period): the test is about each one.
    let s = Schedule::every(Duration::from_millis(100))
        .starting_at(at_ms(start))
        .catch_up(CatchUp::All { max: 100 });
    assert_eq!(
        q.schedule("tick", &s, &"tock".to_string()).unwrap(),
        Scheduled::Created
    );
    let got = take_n(&q, &server, 8);
    for (i, (m, taken)) in got.iter().enumerate() {
        let occurrence = start + 100 * i as u64;
        assert_eq!(m.id().as_str(), format!("sched:tick:{occurrence}"));
        assert_eq!(
            parse_occurrence_id(m.id().as_str()),
            Some(("tick", at_ms(occurrence)))
        );
        assert_eq!(m.due_ms(), occurrence, "due at the occurrence");
        assert_eq!(m.payload(), "tock");
        assert!(
            *taken >= occurrence,
            "taken at {taken}, before {occurrence}"
        );
    }
    let info = q.schedules().unwrap();
    assert_eq!(info.len(), 1);
    assert_eq!(info[0].name, "tick");
    assert_eq!(info[0].schedule.as_ref(), Some(&s));
    assert_eq!(info[0].definition, s.definition());
    assert!(!info[0].paused);
    let last = ms(info[0].last_fired.unwrap());
    assert!(last >= start + 700, "last fired {last}");
    assert_eq!(ms(info[0].next.unwrap()), last + 100);
}

#[test]
fn declaring_the_same_schedule_again_changes_nothing_and_a_new_definition_replaces_it() {
    let server = RedisServer::start();
    let rw = server.connect();
    let q = rw.queue::<String>("upsert").unwrap();
    let hourly = Schedule::cron("0 * * * *").unwrap();
    let p = "report".to_string();
    assert_eq!(q.schedule("r", &hourly, &p).unwrap(), Scheduled::Created);
    let version = server.cmd(&["HGET", "redwheel:{upsert}:head", "schedules"]);
    // Any number of declarations of the same thing, from other runtimes too.
    let other = server.connect();
    let q2 = other.queue::<String>("upsert").unwrap();
    for _ in 0..3 {
        assert_eq!(q.schedule("r", &hourly, &p).unwrap(), Scheduled::Unchanged);
        assert_eq!(q2.schedule("r", &hourly, &p).unwrap(), Scheduled::Unchanged);
    }
    assert_eq!(
        server.cmd(&["HGET", "redwheel:{upsert}:head", "schedules"]),
        version,
        "nothing was written"
    );
    // A new payload or definition replaces it.
    assert_eq!(
        q.schedule("r", &hourly, &"other".to_string()).unwrap(),
        Scheduled::Replaced
    );
    let daily = Schedule::cron("0 3 * * *").unwrap();
    assert_eq!(q2.schedule("r", &daily, &p).unwrap(), Scheduled::Replaced);
    let info = q.schedules().unwrap();
    assert_eq!(info.len(), 1);
    assert_eq!(info[0].schedule.as_ref(), Some(&daily));
    let now = at_ms(server.time_ms());
    assert_eq!(info[0].next, daily.next_after(now));
}

#[test]
fn unschedule_pause_and_resume_stop_and_restart_the_occurrences() {
    let server = RedisServer::start();
    let rw = server.connect();
    let q = rw.queue::<String>("ctl").unwrap();
    let s = Schedule::every(Duration::from_millis(50));
    q.schedule("a", &s, &"a".to_string()).unwrap();
    q.schedule("b", &s, &"b".to_string()).unwrap();
    assert!(q.pause_schedule("a").unwrap());
    assert!(q.pause_schedule("a").unwrap(), "paused already: still true");
    assert!(!q.pause_schedule("nope").unwrap());
    assert!(q.unschedule("b").unwrap());
    assert!(!q.unschedule("b").unwrap());
    // Nothing fires while a is paused and b is gone: whatever still comes
    // was fired before the changes.
    let changed = server.time_ms();
    while let Some(m) = q.poll(Duration::from_millis(400)).unwrap() {
        let (_, at) = parse_occurrence_id(m.id().as_str()).unwrap();
        assert!(ms(at) <= changed, "{} fired after the changes", m.id());
    }
    let info = q.schedules().unwrap();
    assert_eq!(info.len(), 1);
    assert!(info[0].paused && info[0].next.is_none());
    let resumed_at = server.time_ms();
    assert!(q.resume_schedule("a").unwrap());
    assert!(
        q.resume_schedule("a").unwrap(),
        "running already: still true"
    );
    assert!(!q.resume_schedule("nope").unwrap());
    let m = within(HANG, {
        let q = q.clone();
        move || q.take().unwrap()
    });
    let (name, occurrence) = parse_occurrence_id(m.id().as_str()).unwrap();
    assert_eq!(name, "a");
    assert!(
        ms(occurrence) > resumed_at,
        "nothing from the pause is owed: {} <= {resumed_at}",
        ms(occurrence)
    );
}

#[test]
fn bad_names_and_schedules_are_refused_and_nothing_is_written() {
    let server = RedisServer::start();
    let rw = server.connect();
    let q = rw
        .queue_with::<String>("bad", QueueOptions::default().max_payload_bytes(10))
        .unwrap();
    let s = Schedule::every(Duration::from_secs(1));
    let p = "x".to_string();
    for name in ["", "a{b", "a\nb", &"n".repeat(101)] {
        let e = q.schedule(name, &s, &p).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidName, "{name:?}: {e}");
        assert_eq!(e.queue(), Some("bad"));
    }
    assert!(q.schedule(&"n".repeat(100), &s, &p).is_ok());
    assert!(q.unschedule(&"n".repeat(100)).unwrap());
    let zero = Schedule::every(Duration::ZERO);
    assert_eq!(
        q.schedule("z", &zero, &p).unwrap_err().kind(),
        ErrorKind::InvalidOption
    );
    let all0 = s.clone().catch_up(CatchUp::All { max: 0 });
    assert_eq!(
        q.schedule("z", &all0, &p).unwrap_err().kind(),
        ErrorKind::InvalidOption
    );
    assert_eq!(
        q.schedule("z", &s, &"far too long".to_string())
            .unwrap_err()
            .kind(),
        ErrorKind::PayloadTooLarge
    );
    assert!(q.schedules().unwrap().is_empty());
    assert_eq!(
        server.int(&["EXISTS", "redwheel:{bad}:schedules"]),
        0,
        "nothing was written"
    );
}

#[test]
fn two_runtimes_sharing_schedules_offer_each_occurrence_once() {
    let server = RedisServer::start();
    let a = server.connect();
    let b = server.connect();
    let qa = a.queue::<String>("shared").unwrap();
    let qb = b.queue::<String>("shared").unwrap();
    let start = server.time_ms() + 300;
    for i in 0..10 {
        let s = Schedule::every(Duration::from_millis(50 + 10 * i))
            .starting_at(at_ms(start))
            .until(at_ms(start + 1_000))
            .catch_up(CatchUp::All { max: 100 });
        let p = format!("s{i}");
        qa.schedule(&p, &s, &p).unwrap();
        qb.schedule(&p, &s, &p).unwrap();
    }
    let expected: u64 = (0..10).map(|i| 1_000 / (50 + 10 * i) + 1).sum();
    let got = take_n(&qa, &server, expected as usize);
    let mut ids: Vec<String> = got.iter().map(|(m, _)| m.id().to_string()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len() as u64, expected, "each occurrence once");
    std::thread::sleep(Duration::from_millis(300));
    assert!(qa.poll(Duration::ZERO).unwrap().is_none(), "and no more");
    let _ = Redwheel::connect(&server.url()).unwrap();
}

/// Runs `schedule_set.lua` as `Queue::schedule` sends it, on a plain
/// connection (no process has the queue open).
fn set_raw(
    server: &RedisServer,
    queue: &str,
    name: &str,
    s: &Schedule,
    payload: &str,
    settled: u64,
) -> (i64, i64) {
    let script = redis::Script::new(concat!(
        include_str!("../lua/schedule_lib.lua"),
        include_str!("../lua/schedule_set.lua")
    ));
    let next = s
        .next_after(at_ms(settled))
        .map(|t| ms(t).to_string())
        .unwrap_or_default();
    let k = |suffix: &str| format!("redwheel:{{{queue}}}:{suffix}");
    let mut con = redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    script
        .key(k("schedules"))
        .key(k("schedules:payload"))
        .key(k("schedules:next"))
        .key(k("schedules:last"))
        .key(k("schedules:changes"))
        .key(k("head"))
        .key(k("wake"))
        .key(k("schedules:ahead"))
        .key(k("delayed"))
        .key(k("msg"))
        .arg(name)
        .arg(s.definition())
        .arg(payload)
        .arg(settled)
        .arg(next)
        .invoke(&mut con)
        .unwrap()
}

#[test]
fn a_replaced_definition_takes_over_what_the_old_one_still_owed() {
    let server = RedisServer::start();
    let now = server.time_ms();
    let first = now + 100;
    let old = Schedule::every(Duration::from_millis(300))
        .starting_at(at_ms(first))
        .catch_up(CatchUp::All { max: 10 });
    assert_eq!(set_raw(&server, "owed", "a", &old, "old", now).0, 1);
    // Two occurrences pass with no process running.
    while server.time_ms() < first + 400 {
        std::thread::sleep(Duration::from_millis(10));
    }
    // Replaced from now: refused, start from just before the first owed.
    let new = Schedule::every(Duration::from_millis(100))
        .starting_at(at_ms(first))
        .catch_up(CatchUp::All { max: 10 });
    let later = server.time_ms();
    assert_eq!(
        set_raw(&server, "owed", "a", &new, "new", later),
        (-1, first as i64 - 1)
    );
    assert_eq!(set_raw(&server, "owed", "a", &new, "new", first - 1).0, 2);
    // A process comes: the new definition's occurrences from the first
    // owed one fire, under the new definition.
    let rw = server.connect();
    let q = rw.queue::<String>("owed").unwrap();
    let got = take_n(&q, &server, 5);
    for (i, (m, _)) in got.iter().enumerate() {
        assert_eq!(
            m.id().as_str(),
            format!("sched:a:{}", first + 100 * i as u64)
        );
        assert_eq!(m.payload(), "new");
    }
}

#[test]
fn a_process_whose_copy_predates_a_redis_data_loss_reads_the_schedules_again() {
    let server = RedisServer::start();
    let all = CatchUp::All { max: 100 };
    let one = Schedule::every(Duration::from_millis(100)).catch_up(all);
    assert_eq!(
        set_raw(&server, "lost", "x", &one, "one", server.time_ms()).0,
        1
    );
    // A process has the queue open: its copy holds the first definition.
    let rw = server.connect();
    let q = rw.queue::<String>("lost").unwrap();
    assert_eq!(take_n(&q, &server, 1)[0].0.payload(), "one");
    // Redis loses everything; the schedule is declared anew, as the first
    // change of an empty set again.
    server.cmd(&["FLUSHALL"]);
    let two = Schedule::every(Duration::from_millis(170)).catch_up(all);
    let declared = server.time_ms();
    assert_eq!(set_raw(&server, "lost", "x", &two, "two", declared).0, 1);
    // Whatever it offers from then on follows the new definition.
    for (m, _) in take_n(&q, &server, 6) {
        let (_, at) = parse_occurrence_id(m.id().as_str()).unwrap();
        if ms(at) <= declared {
            continue; // fired before the loss, taken after it
        }
        assert_eq!(m.payload(), "two", "{}", m.id());
        assert_eq!(
            ms(at) % 170,
            0,
            "{} is not an occurrence of the new definition",
            m.id()
        );
    }
}

#[test]
fn trigger_schedule_offers_the_stored_payload_now_and_leaves_the_schedule_as_it_was() {
    let server = RedisServer::start();
    let rw = server.connect();
    let q = rw.queue::<String>("by-hand").unwrap();
    let daily = Schedule::cron("0 3 * * *").unwrap();
    q.schedule("nightly", &daily, &"build the report".to_string())
        .unwrap();
    assert!(q.pause_schedule("nightly").unwrap());
    let before = q.schedules().unwrap();

    // Paused or not, the trigger offers one message now with the payload.
    let id = q.trigger_schedule("nightly").unwrap().expect("it exists");
    assert!(
        parse_occurrence_id(id.as_str()).is_none(),
        "{id} is not an occurrence id"
    );
    let m = q
        .poll(HANG)
        .unwrap()
        .expect("the triggered message is due at once");
    assert_eq!((m.id(), m.payload().as_str()), (&id, "build the report"));

    // Each call offers one more; the schedule is unchanged.
    let second = q.trigger_schedule("nightly").unwrap().expect("it exists");
    assert_ne!(second, id);
    assert_eq!(q.len().unwrap(), 1, "one message, delayed or ready");
    assert_eq!(q.schedules().unwrap(), before);

    // No schedule of that name: nothing is offered.
    assert_eq!(q.trigger_schedule("nope").unwrap(), None);
    q.unschedule("nightly").unwrap();
    assert_eq!(q.trigger_schedule("nightly").unwrap(), None);
    assert_eq!(q.len().unwrap(), 1);
    let e = q.trigger_schedule("a{b").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidName);
}
