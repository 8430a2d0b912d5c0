//! The overview's reads: every queue's counts, delivery counter and
//! paused flag in one pipelined round trip per master.
//!
//! The one place where the dashboard leans on crate internals rather than
//! the public inspection API (which reads one queue per round trip): the
//! runtime's `run_on_masters`, the queue key layout (`queue::Keys`, with
//! its `scan_pattern` and `queue_of`) and the queue's own pipelined stats
//! read (`queue::pipe_stats`, decoded by `queue::decode_stats`, the one
//! reader of `stats.lua`'s reply) and paused flag (`queue::pipe_paused`,
//! `queue::decode_paused`). A queue whose commands came back with an
//! error (a slot that
//! moved, a refused command) is read again through that public inspector,
//! one round trip or two each, and the next round looks for the queues
//! again.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use redis::{RedisResult, Value};

use crate::error::{Access, Error};
use crate::queue::{Keys, QueueStats, decode_paused, decode_stats, pipe_paused, pipe_stats};
use crate::runtime::Redwheel;
use crate::scripts;

/// `SCAN … COUNT` of one discovery step.
const SCAN_COUNT: usize = 1_000;

/// One queue's counts, as `stats.lua` and the delivery counter give them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Reading {
    pub delayed: u64,
    pub ready: u64,
    pub in_flight: u64,
    pub dead: u64,
    pub oldest_overdue_ms: Option<u64>,
    pub next_due_ms: Option<u64>,
    /// The server's clock when they were read (epoch ms).
    pub server_ms: u64,
    /// Messages handed out by take and claim so far.
    pub delivered: u64,
    /// Paused (`Queue::pause`): nothing is handed out.
    pub paused: bool,
}

impl Reading {
    fn new(s: &QueueStats, server_ms: u64, delivered: u64, paused: bool) -> Reading {
        Reading {
            delayed: s.delayed,
            ready: s.ready,
            in_flight: s.in_flight,
            dead: s.dead,
            oldest_overdue_ms: s.oldest_overdue.map(|d| d.as_millis() as u64),
            next_due_ms: s.next_due.and_then(|t| {
                t.duration_since(std::time::UNIX_EPOCH)
                    .ok()
                    .map(|d| d.as_millis() as u64)
            }),
            server_ms,
            delivered,
            paused,
        }
    }
}

/// What one round read, and what it cost.
#[derive(Debug)]
pub(crate) struct Round {
    pub readings: Vec<(String, Result<Reading, Error>)>,
    /// Round trips this round made (pipelines, `SCAN` pages, fallbacks).
    pub round_trips: u64,
    /// Commands it sent.
    pub commands: u64,
}

/// Reads rounds, remembering which master holds which queue between the
/// discoveries.
pub(crate) struct Gatherer {
    rw: Redwheel,
    rescan: Duration,
    /// Queue names per master, in the runtime's order of masters.
    groups: Vec<Vec<String>>,
    scanned: Option<Instant>,
}

impl Gatherer {
    pub(crate) fn new(rw: Redwheel, rescan: Duration) -> Gatherer {
        Gatherer {
            rw,
            rescan,
            groups: Vec::new(),
            scanned: None,
        }
    }

    /// Reads every queue (looking for them first when due). `Err` when no
    /// master could be read at all.
    pub(crate) fn round(&mut self) -> Result<Round, Error> {
        let mut round = Round {
            readings: Vec::new(),
            round_trips: 0,
            commands: 0,
        };
        if self.scanned.is_none_or(|at| at.elapsed() >= self.rescan) {
            self.discover(&mut round)?;
        }
        let mut replies = self.read_groups(&mut round)?;
        if replies.len() != self.groups.len() {
            // The masters changed since the last discovery.
            self.discover(&mut round)?;
            replies = self.read_groups(&mut round)?;
        }
        let mut moved = false;
        for (names, results) in self.groups.iter().zip(replies) {
            for (name, result) in names.iter().zip(results) {
                let reading = match result {
                    Ok(r) => Ok(r),
                    Err(_) => {
                        moved = true;
                        self.read_one(name, &mut round)
                    }
                };
                round.readings.push((name.clone(), reading));
            }
        }
        if moved {
            self.scanned = None;
        }
        Ok(round)
    }

    /// Every queue with a key on each master, by `SCAN`.
    fn discover(&mut self, round: &mut Round) -> Result<(), Error> {
        let pattern = Keys::scan_pattern();
        let mut pages = 0u64;
        let groups = self.rw.runtime().run_on_masters(Access::Read, |con| {
            let mut names = BTreeSet::new();
            let mut cursor: u64 = 0;
            loop {
                pages += 1;
                let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(SCAN_COUNT)
                    .query(con)?;
                names.extend(
                    keys.iter()
                        .filter_map(|k| Keys::queue_of(k).map(str::to_owned)),
                );
                if next == 0 {
                    return Ok(names.into_iter().collect::<Vec<String>>());
                }
                cursor = next;
            }
        })?;
        round.round_trips += pages;
        round.commands += pages;
        self.groups = groups;
        self.scanned = Some(Instant::now());
        Ok(())
    }

    /// One pipeline per master of the counts of the queues found there.
    fn read_groups(&self, round: &mut Round) -> Result<Vec<Vec<RedisResult<Reading>>>, Error> {
        let mut done = 0usize;
        let (mut trips, mut commands) = (0u64, 0u64);
        let replies = self.rw.runtime().run_on_masters(Access::Read, |con| {
            // A master's call is repeated only after it failed, so
            // `done` counts the masters read so far.
            let names: &[String] = self.groups.get(done).map_or(&[], Vec::as_slice);
            let out = read_pipeline(con, names, &mut trips, &mut commands)?;
            done += 1;
            Ok(out)
        })?;
        round.round_trips += trips;
        round.commands += commands;
        Ok(replies)
    }

    /// One queue through the public inspector (after its pipelined read
    /// failed).
    fn read_one(&self, name: &str, round: &mut Round) -> Result<Reading, Error> {
        round.round_trips += 3;
        round.commands += 3;
        let q = self.rw.inspect_queue(name)?;
        let (s, server_ms) = q.stats_at()?;
        let delivered = q.counters()?.delivered;
        let paused = q.limits()?.paused;
        Ok(Reading::new(&s, server_ms, delivered, paused))
    }
}

/// `EVALSHA stats.lua`, `HGET counts delivered` and `HGET controls
/// paused` for each of `names`, in one pipeline (loading the script once if the server lacks it).
fn read_pipeline(
    con: &mut crate::runtime::Conn,
    names: &[String],
    trips: &mut u64,
    commands: &mut u64,
) -> RedisResult<Vec<RedisResult<Reading>>> {
    if names.is_empty() {
        return Ok(Vec::new());
    }
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    for name in names {
        let k = Keys::new(name);
        pipe_stats(&mut pipe, &k);
        pipe.cmd("HGET").arg(&k.counts).arg("delivered");
        pipe_paused(&mut pipe, &k);
    }
    let mut replies: Vec<RedisResult<Value>> = Vec::new();
    for attempt in 0..2 {
        *trips += 1;
        *commands += pipe.len() as u64;
        replies = pipe.query(con)?;
        let noscript = replies
            .iter()
            .any(|r| matches!(r, Err(e) if e.code() == Some("NOSCRIPT")));
        if !noscript || attempt == 1 {
            break;
        }
        *trips += 1;
        *commands += 1;
        scripts::STATS.load(con)?;
    }
    let mut out = Vec::with_capacity(names.len());
    let mut it = replies.into_iter();
    while let (Some(stats), Some(delivered), Some(paused)) = (it.next(), it.next(), it.next()) {
        out.push(reading(stats, delivered, paused));
    }
    Ok(out)
}

/// A queue's `stats.lua` reply, its delivery counter and its paused flag,
/// as one reading.
fn reading(
    stats: RedisResult<Value>,
    delivered: RedisResult<Value>,
    paused: RedisResult<Value>,
) -> RedisResult<Reading> {
    let (s, server_ms) = decode_stats(stats?)?;
    let delivered: Option<u64> = redis::from_redis_value(delivered?)?;
    let paused = decode_paused(paused?)?;
    Ok(Reading::new(&s, server_ms, delivered.unwrap_or(0), paused))
}
