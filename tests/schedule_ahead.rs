//! Recurring schedules fire ahead, against a real redis-server: an
//! occurrence is written up to the lead before it falls due, as a delayed
//! message due at it, and delivered at it (never early, and without waiting
//! for a guard sweep); a pause, an unschedule or a replacement while it
//! waits takes it back (it is never delivered), while declaring the same
//! schedule again keeps it.

mod ahead_support;
mod schedule_support;
mod support;

use std::time::Duration;

use ahead_support::{HANG, at_ms, fire_by_hand, key, ms, raw, server_ms};
use redwheel::schedule::{CatchUp, Schedule, Scheduled, parse_occurrence_id};
use redwheel::{Queue, QueueOptions};
use support::{RedisServer, within};

/// Period of the schedules the withdrawal tests act on.
const PERIOD: u64 = 300;

/// Tries the withdrawal tests make: each needs its change to land between
/// an occurrence's ahead firing and the occurrence (the lead: 100 ms), which
/// a loaded machine may miss now and then.
const TRIES: usize = 20;

/// In one atomic step: the server's `TIME` (ms) and the ids in the queue's
/// `delayed` set that fall due after it.
const AHEAD: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return { now, redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf') }
";

/// The first occurrence of schedule `name` seen waiting in `delayed` before
/// it falls due, as (id, occurrence); `None` if none was seen by server
/// time `until`.
fn seen_ahead(server: &RedisServer, queue: &str, name: &str, until: u64) -> Option<(String, u64)> {
    let url = server.url();
    let delayed = key(queue, "delayed");
    let prefix = format!("sched:{name}:");
    within(HANG, move || {
        let mut con = redis::Client::open(url).unwrap().get_connection().unwrap();
        let script = redis::Script::new(AHEAD);
        loop {
            let (now, ids): (u64, Vec<String>) = script.key(&delayed).invoke(&mut con).unwrap();
            if let Some(id) = ids.into_iter().find(|id| id.starts_with(&prefix)) {
                let (_, at) = parse_occurrence_id(&id).unwrap();
                assert!(ms(at) > now);
                return Some((id, ms(at)));
            }
            if now > until {
                return None;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    })
}

/// Whether message `id` is in the queue at all (a message is deliverable
/// iff it has a `msg` entry).
fn exists(server: &RedisServer, queue: &str, id: &str) -> bool {
    server.int(&["HEXISTS", &key(queue, "msg"), id]) == 1
}

/// Takes messages until server time `until`; their ids and payloads.
fn drain_until(q: &Queue<String>, server: &RedisServer, until: u64) -> Vec<(String, String)> {
    let mut got = Vec::new();
    while server.time_ms() <= until {
        if let Some(m) = q.poll(Duration::from_millis(50)).unwrap() {
            got.push((m.id().to_string(), m.payload().clone()));
        }
    }
    got
}

/// Declares schedule `<label><try>` (`every(PERIOD)`, payload "old"), waits
/// for one of its occurrences to be offered ahead, and runs `change` on it
/// before that occurrence falls due; a fresh schedule each try, until one
/// try's change lands in time. The schedule's name, the id and the
/// occurrence offered ahead, and the server's time after the change.
fn change_within_the_lead(
    server: &RedisServer,
    q: &Queue<String>,
    label: &str,
    change: impl Fn(&Queue<String>, &str),
) -> (String, String, u64, u64) {
    let s = Schedule::every(Duration::from_millis(PERIOD));
    for attempt in 0..TRIES {
        let name = format!("{label}{attempt}");
        q.schedule(&name, &s, &"old".to_string()).unwrap();
        let until = server.time_ms() + 5 * PERIOD;
        let Some((id, occurrence)) = seen_ahead(server, q.name(), &name, until) else {
            q.unschedule(&name).unwrap();
            continue;
        };
        // What the schedule shows while the occurrence waits: it was fired.
        let info = q.schedules().unwrap();
        let mine = info.iter().find(|i| i.name == name).unwrap();
        assert_eq!(mine.last_fired, Some(at_ms(occurrence)), "{id}");
        change(q, &name);
        let after = server.time_ms();
        if after < occurrence {
            return (name, id, occurrence, after);
        }
        // Too late to tell: the occurrence fell due during the change.
        q.unschedule(&name).unwrap();
    }
    panic!("in {TRIES} tries, no change landed between an ahead firing and its occurrence");
}

#[test]
fn an_occurrence_waits_in_delayed_before_its_time_and_is_delivered_not_before_it() {
    let server = RedisServer::start();
    let rw = server.connect();
    let q = rw.queue::<String>("ahead").unwrap();
    let start = server.time_ms() + 500;
    let s = Schedule::every(Duration::from_millis(250))
        .starting_at(at_ms(start))
        .catch_up(CatchUp::All { max: 100 });
    q.schedule("tick", &s, &"tock".to_string()).unwrap();
    // Seen waiting before its time (a loaded machine may fire one late, so
    // any of the first twenty will do).
    let (id, occurrence) = seen_ahead(&server, "ahead", "tick", start + 20 * 250)
        .expect("no occurrence was offered before it fell due");
    assert_eq!(id, format!("sched:tick:{occurrence}"));
    assert_eq!(occurrence % 250, start % 250, "{id} is an occurrence");
    // Each occurrence up to it is delivered once, due at it, never before
    // it by the server's clock.
    let n = ((occurrence - start) / 250 + 1) as usize;
    let url = server.url();
    let taken = within(HANG, {
        let q = q.clone();
        move || schedule_support::take_timed(&q, &url, n)
    });
    for (i, (m, at)) in taken.iter().enumerate() {
        let due = start + 250 * i as u64;
        assert_eq!(m.id().as_str(), format!("sched:tick:{due}"));
        assert_eq!(m.due_ms(), due);
        assert!(*at >= due, "{} taken at {at}, early", m.id());
    }
}

#[test]
fn an_occurrence_fired_ahead_is_moved_at_its_time_without_waiting_for_a_guard_sweep() {
    let server = RedisServer::start();
    let rw = server.connect();
    // No guard sweep within the test: only the firing's own arming of the
    // transfer can move the occurrence to the ready list.
    let q = rw
        .queue_with::<String>(
            "armed",
            QueueOptions::default().guard_interval(Duration::from_secs(86_400)),
        )
        .unwrap();
    let start = server.time_ms() + 500;
    let hourly = Schedule::every(Duration::from_secs(3_600)).starting_at(at_ms(start));
    q.schedule("h", &hourly, &"once".to_string()).unwrap();
    let url = server.url();
    let (m, taken) = within(HANG, {
        let q = q.clone();
        move || schedule_support::take_timed(&q, &url, 1).remove(0)
    });
    assert_eq!(m.id().as_str(), format!("sched:h:{start}"));
    assert!(taken >= start, "taken at {taken}, before {start}");
    let info = q.schedules().unwrap();
    assert_eq!(info[0].last_fired, Some(at_ms(start)));
    assert_eq!(info[0].next, Some(at_ms(start + 3_600_000)));
}

#[test]
fn pausing_within_the_lead_takes_back_the_occurrence_offered_ahead() {
    let server = RedisServer::start();
    let rw = server.connect();
    let q = rw.queue::<String>("pause").unwrap();
    let (name, id, occurrence, after) = change_within_the_lead(&server, &q, "p", |q, name| {
        assert!(q.pause_schedule(name).unwrap());
    });
    assert!(!exists(&server, "pause", &id), "{id} is still in the queue");
    assert_eq!(
        server.cmd(&["ZSCORE", &key("pause", "delayed"), &id]),
        "$-1\r\n"
    );
    // `last fired` is back to what was fired before it.
    let info = q.schedules().unwrap();
    let mine = info.iter().find(|i| i.name == name).unwrap();
    assert!(mine.paused && mine.next.is_none());
    if let Some(last) = mine.last_fired {
        assert!(
            ms(last) < occurrence && ms(last) <= after,
            "last fired {last:?}"
        );
        assert_eq!((occurrence - ms(last)) % PERIOD, 0);
    }
    // Nothing is delivered for it, nor for the paused schedule after it.
    for (got, _) in drain_until(&q, &server, occurrence + PERIOD) {
        let (n, at) = parse_occurrence_id(&got).unwrap();
        assert!(
            n != name || ms(at) <= after,
            "{got} delivered after the pause"
        );
    }
    // Resumed, it goes on from its next occurrence after the resume.
    let resumed = server.time_ms();
    assert!(q.resume_schedule(&name).unwrap());
    let m = within(HANG, {
        let q = q.clone();
        let name = name.clone();
        move || loop {
            let m = q.take().unwrap();
            if parse_occurrence_id(m.id().as_str()).unwrap().0 == name {
                return m;
            }
        }
    });
    let (_, at) = parse_occurrence_id(m.id().as_str()).unwrap();
    assert!(ms(at) > resumed, "{} is from before the resume", m.id());
}

#[test]
fn unscheduling_within_the_lead_takes_back_the_occurrence_offered_ahead() {
    let server = RedisServer::start();
    let rw = server.connect();
    let q = rw.queue::<String>("gone").unwrap();
    let (name, id, occurrence, after) = change_within_the_lead(&server, &q, "u", |q, name| {
        assert!(q.unschedule(name).unwrap());
    });
    assert!(!exists(&server, "gone", &id), "{id} is still in the queue");
    assert!(q.schedules().unwrap().iter().all(|i| i.name != name));
    assert_eq!(
        server.int(&["HEXISTS", &key("gone", "schedules:ahead"), &name]),
        0
    );
    for (got, _) in drain_until(&q, &server, occurrence + PERIOD) {
        let (n, at) = parse_occurrence_id(&got).unwrap();
        assert!(
            n != name || ms(at) <= after,
            "{got} delivered after the removal"
        );
    }
}

#[test]
fn replacing_the_definition_within_the_lead_takes_back_the_old_occurrence_offered_ahead() {
    let server = RedisServer::start();
    let rw = server.connect();
    let q = rw.queue::<String>("swap").unwrap();
    // The new grid is 7 ms off the old one: no occurrence is on both.
    let new = Schedule::every(Duration::from_millis(PERIOD)).starting_at(at_ms(7));
    let (name, id, _, after) = change_within_the_lead(&server, &q, "r", |q, name| {
        assert_eq!(
            q.schedule(name, &new, &"new".to_string()).unwrap(),
            Scheduled::Replaced
        );
    });
    assert!(!exists(&server, "swap", &id), "{id} is still in the queue");
    // From then on, only the new definition's occurrences come.
    let got = within(HANG, {
        let q = q.clone();
        let name = name.clone();
        move || {
            let mut got = Vec::new();
            while got.len() < 3 {
                let m = q.take().unwrap();
                let (n, at) = parse_occurrence_id(m.id().as_str()).unwrap();
                if n == name && ms(at) > after {
                    got.push((m.id().to_string(), ms(at), m.payload().clone()));
                }
            }
            got
        }
    });
    for (got, at, payload) in got {
        assert_ne!(got, id);
        assert_eq!((at % PERIOD, payload.as_str()), (7, "new"), "{got}");
    }
}

#[test]
fn replacing_only_the_payload_within_the_lead_offers_that_occurrence_again_with_the_new_one() {
    let server = RedisServer::start();
    let rw = server.connect();
    let q = rw.queue::<String>("repay").unwrap();
    let same = Schedule::every(Duration::from_millis(PERIOD));
    let (name, id, occurrence, _) = change_within_the_lead(&server, &q, "y", |q, name| {
        assert_eq!(
            q.schedule(name, &same, &"new".to_string()).unwrap(),
            Scheduled::Replaced
        );
    });
    // The occurrence is still owed (it was not due at the change): it comes
    // once, with the new payload.
    let got = drain_until(&q, &server, occurrence + 2 * PERIOD);
    let mine: Vec<&(String, String)> = got.iter().filter(|(g, _)| *g == id).collect();
    assert_eq!(mine.len(), 1, "{id}: {got:?}");
    assert_eq!(mine[0].1, "new");
    assert!(got.iter().all(|(g, p)| {
        let (n, at) = parse_occurrence_id(g).unwrap();
        n != name || ms(at) < occurrence || p == "new"
    }));
}

#[test]
fn declaring_the_same_schedule_within_the_lead_keeps_the_occurrence_offered_ahead() {
    let server = RedisServer::start();
    let rw = server.connect();
    let q = rw.queue::<String>("keep").unwrap();
    let s = Schedule::every(Duration::from_millis(PERIOD));
    let (_, id, occurrence, _) = change_within_the_lead(&server, &q, "k", |q, name| {
        assert_eq!(
            q.schedule(name, &s, &"old".to_string()).unwrap(),
            Scheduled::Unchanged
        );
    });
    assert!(exists(&server, "keep", &id), "{id} was taken back");
    let got = drain_until(&q, &server, occurrence + PERIOD);
    assert_eq!(
        got.iter().filter(|(g, p)| *g == id && p == "old").count(),
        1,
        "{id}: {got:?}"
    );
}

#[test]
fn pausing_a_schedule_with_several_occurrences_ahead_takes_back_each_one_due_after_it() {
    let server = RedisServer::start();
    let rw = server.connect();
    let q = rw.queue::<String>("fast").unwrap();
    // Every 20 ms, every occurrence fired: several wait ahead at any time,
    // written by several firing calls.
    let s = Schedule::every(Duration::from_millis(20)).catch_up(CatchUp::All { max: 100 });
    q.schedule("f", &s, &"f".to_string()).unwrap();
    let declared = server.time_ms();
    let url = server.url();
    let delayed = key("fast", "delayed");
    let (latest_ahead, after) = within(HANG, {
        let q = q.clone();
        let server_url = url.clone();
        move || {
            let mut con = redis::Client::open(server_url)
                .unwrap()
                .get_connection()
                .unwrap();
            let script = redis::Script::new(AHEAD);
            loop {
                let (now, ids): (u64, Vec<String>) = script.key(&delayed).invoke(&mut con).unwrap();
                let latest = ids
                    .iter()
                    .filter_map(|id| parse_occurrence_id(id))
                    .map(|(_, at)| ms(at))
                    .max();
                // Once some have been delivered, with two or more ahead,
                // the latest well after now: pause.
                if now > declared + 300 && ids.len() >= 2 && latest.is_some_and(|l| l > now + 20) {
                    assert!(q.pause_schedule("f").unwrap());
                    let (s, us): (u64, u64) = redis::cmd("TIME").query(&mut con).unwrap();
                    let after = s * 1000 + us / 1000;
                    if after < latest.unwrap() {
                        return (latest.unwrap(), after);
                    }
                    assert!(q.resume_schedule("f").unwrap());
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        }
    });
    assert!(
        !exists(&server, "fast", &format!("sched:f:{latest_ahead}")),
        "sched:f:{latest_ahead} is still in the queue"
    );
    // What it delivers: one unbroken run of occurrences, each once, none
    // after the pause; and `last fired` is the last of them.
    let mut got: Vec<u64> = drain_until(&q, &server, after + 200)
        .into_iter()
        .map(|(id, _)| ms(parse_occurrence_id(&id).unwrap().1))
        .collect();
    got.sort();
    assert!(!got.is_empty());
    for w in got.windows(2) {
        assert_eq!(w[1] - w[0], 20, "a gap or a double: {got:?}");
    }
    let last = *got.last().unwrap();
    assert!(
        last <= after,
        "{last} delivered, after the pause at {after}"
    );
    let info = q.schedules().unwrap();
    assert_eq!(info[0].last_fired, Some(at_ms(last)));
    assert!(info[0].paused);
}

#[test]
fn a_pause_after_several_firings_puts_last_fired_back_to_the_last_occurrence_due() {
    // The firing script driven by hand: a first call offers o1 and o2
    // ahead; a second, once o1 is due and o2 still ahead, offers o3 ahead;
    // a pause before o2 takes back o2 and o3, and `last fired` is o1.
    let server = RedisServer::start();
    let mut con = redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let k = |suffix: &str| key("byhand", suffix);
    let s = Schedule::every(Duration::from_millis(1));
    for attempt in 0..TRIES {
        let name = format!("h{attempt}");
        let t0 = server_ms(&mut con);
        let set_keys: Vec<String> = [
            "schedules",
            "schedules:payload",
            "schedules:next",
            "schedules:last",
            "schedules:changes",
            "head",
            "wake",
            "schedules:ahead",
            "delayed",
            "msg",
        ]
        .map(k)
        .to_vec();
        let created = raw(
            &mut con,
            &["schedule_lib", "schedule_set"],
            &set_keys,
            &[
                name.clone(),
                s.definition(),
                "p".into(),
                t0.to_string(),
                (t0 + 1).to_string(),
            ],
        );
        assert_eq!(created[0], 1);
        let fire = |con: &mut redis::Connection, expected: i64, occurrences: &[i64]| {
            let new_next = occurrences.last().unwrap() + 1;
            fire_by_hand(
                con,
                &server,
                "byhand",
                (&name, expected, new_next),
                100,
                occurrences,
            )
        };
        let t = server_ms(&mut con);
        let (o1, o2) = (t + 40, t + 95);
        assert_eq!(fire(&mut con, t0 + 1, &[o1, o2])[2], 1, "applied");
        while server_ms(&mut con) < o1 + 5 {
            std::thread::sleep(Duration::from_millis(2));
        }
        let t2 = server_ms(&mut con);
        let o3 = t2 + 80;
        assert_eq!(fire(&mut con, o2 + 1, &[o3])[2], 1, "applied");
        let paused = raw(
            &mut con,
            &["schedule_lib", "schedule_pause"],
            // schedule_pause.lua's keys: schedule_set.lua's but the payloads.
            &set_keys
                .iter()
                .filter(|key| !key.ends_with(":payload"))
                .cloned()
                .collect::<Vec<_>>(),
            &[
                name.clone(),
                "p".into(),
                "0".into(),
                "0".into(),
                String::new(),
            ],
        );
        assert_eq!(paused[0], 1);
        let after = server_ms(&mut con);
        if t2 >= o2 || after >= o2 {
            continue; // too slow to tell: o2 fell due before the second call or the pause
        }
        let id = |o: i64| format!("sched:{name}:{o}");
        assert!(exists(&server, "byhand", &id(o1)), "o1 was due: it stays");
        assert!(!exists(&server, "byhand", &id(o2)), "o2 is taken back");
        assert!(!exists(&server, "byhand", &id(o3)), "o3 is taken back");
        assert_eq!(
            server.cmd(&["HGET", &k("schedules:last"), &name]),
            format!("${}\r\n{o1}\r\n", o1.to_string().len()),
            "last fired is o1 again"
        );
        assert_eq!(server.int(&["HEXISTS", &k("schedules:ahead"), &name]), 0);
        return;
    }
    panic!("in {TRIES} tries, the second firing and the pause never both came before o2");
}
