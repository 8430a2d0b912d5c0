//! Helpers shared by the claim-ahead tests (`consume_ahead*`,
//! `schedule_ahead*`): the queue's keys, polling for a state in Redis, a
//! pool that records each handler's entry by the server's clock, and the
//! library's scripts run by hand.

#![allow(dead_code)] // each test file uses its own part

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crossbeam_channel::{Receiver, unbounded};
use redwheel::{Consumer, ConsumerOptions, Queue, QueueOptions, Redwheel};

use crate::support::RedisServer;

/// The hang guard of every wait.
pub const HANG: Duration = Duration::from_secs(60);

/// Key `suffix` of queue `queue`.
pub fn key(queue: &str, suffix: &str) -> String {
    format!("redwheel:{{{queue}}}:{suffix}")
}

/// Polls `f` until it holds (a condition in Redis another process brings
/// about), panicking after `HANG`.
pub fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let give_up = Instant::now() + HANG;
    while !f() {
        assert!(Instant::now() < give_up, "hang guard: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Queue `name` with the given visibility.
pub fn open(rw: &Redwheel, name: &str, visibility: Duration) -> Queue<String> {
    rw.queue_with::<String>(name, QueueOptions::default().visibility(visibility))
        .unwrap()
}

/// One handler entry, as a recording pool sends it.
#[derive(Debug, Clone)]
pub struct Entry {
    pub id: String,
    pub attempt: u32,
    /// The server's `TIME` (ms) at entry.
    pub at: u64,
    /// The delivery's visibility deadline (ms) as the handler got it.
    pub visible_until: u64,
}

/// A pool of 4 workers on `q` claiming up to `window` ahead, recording
/// each handler entry.
pub fn recording(q: &Queue<String>, url: &str, window: Duration) -> (Consumer, Receiver<Entry>) {
    recording_with(
        q,
        url,
        ConsumerOptions::default()
            .concurrency(4)
            .claim_ahead(window),
        Duration::ZERO,
    )
}

/// A pool on `q` with `options`, whose handler records its entry (read
/// from the server on a connection to `url`) and then works for `work`.
pub fn recording_with(
    q: &Queue<String>,
    url: &str,
    options: ConsumerOptions,
    work: Duration,
) -> (Consumer, Receiver<Entry>) {
    let (tx, rx) = unbounded();
    let con = Mutex::new(redis::Client::open(url).unwrap().get_connection().unwrap());
    let consumer = q
        .consume(options, move |d| {
            let (s, us): (u64, u64) = redis::cmd("TIME")
                .query(&mut *con.lock().unwrap())
                .map_err(|e| e.to_string())?;
            let visible_until = d
                .visible_until()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |t| t.as_millis() as u64);
            let _ = tx.send(Entry {
                id: d.id().as_str().to_owned(),
                attempt: d.attempt(),
                at: s * 1_000 + us / 1_000,
                visible_until,
            });
            std::thread::sleep(work);
            Ok::<(), String>(())
        })
        .unwrap();
    (consumer, rx)
}

/// A command's reply as a number (a missing field: 0).
pub fn num(server: &RedisServer, args: &[&str]) -> u64 {
    let mut con = redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query::<Option<u64>>(&mut con).unwrap().unwrap_or(0)
}

/// The due time (ms) of every message in `delayed`.
pub fn delayed(server: &RedisServer, queue: &str) -> HashMap<String, u64> {
    let mut con = redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    redis::cmd("ZRANGE")
        .arg(key(queue, "delayed"))
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query(&mut con)
        .unwrap()
}

/// Runs `files` (under `lua/`, one script) as the library sends it, on a
/// plain connection: no process has the queue open.
pub fn raw(
    con: &mut redis::Connection,
    files: &[&str],
    keys: &[String],
    args: &[String],
) -> Vec<i64> {
    let text: String = files
        .iter()
        .map(|f| std::fs::read_to_string(format!("lua/{f}.lua")).unwrap())
        .collect();
    let script = redis::Script::new(&text);
    let mut inv = script.prepare_invoke();
    for k in keys {
        inv.key(k);
    }
    for a in args {
        inv.arg(a);
    }
    inv.invoke(con).unwrap()
}

/// The server's `TIME` in epoch ms.
pub fn server_ms(con: &mut redis::Connection) -> i64 {
    let (s, us): (i64, i64) = redis::cmd("TIME").query(con).unwrap();
    s * 1000 + us / 1000
}

/// Epoch ms of `t`.
pub fn ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

/// The instant at epoch ms `ms`.
pub fn at_ms(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

/// The version of queue `queue`'s schedules (`head`'s `schedules` field).
pub fn schedules_version(server: &RedisServer, queue: &str) -> String {
    let head = server.cmd(&["HGET", &key(queue, "head"), "schedules"]);
    head.lines()
        .nth(1)
        .unwrap()
        .split(':')
        .next()
        .unwrap()
        .to_owned()
}

/// `schedule_fire.lua` by hand: fires `occurrences` (ms) of schedule
/// `name` of queue `queue`, whose stored next is `expected`, with `lead`
/// ms of lead, and sets its next to `new_next`. The reply.
pub fn fire_by_hand(
    con: &mut redis::Connection,
    server: &RedisServer,
    queue: &str,
    (name, expected, new_next): (&str, i64, i64),
    lead: i64,
    occurrences: &[i64],
) -> Vec<i64> {
    let keys: Vec<String> = [
        "schedules:next",
        "schedules:payload",
        "schedules:last",
        "head",
        "delayed",
        "msg",
        "schedules:ahead",
    ]
    .map(|k| key(queue, k))
    .to_vec();
    let mut args = vec![
        schedules_version(server, queue),
        lead.to_string(),
        name.to_owned(),
        expected.to_string(),
        String::new(),
        new_next.to_string(),
        occurrences.len().to_string(),
    ];
    args.extend(occurrences.iter().map(i64::to_string));
    raw(
        con,
        &["head", "schedule_lib", "schedule_fire"],
        &keys,
        &args,
    )
}
