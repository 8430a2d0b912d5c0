//! Schedule benchmarks S1 and S2 of BENCHMARKS.md, and the idle cost of
//! the guard sweep, printed as one JSON line per run.
//!
//! ```text
//! cargo run --release --example bench_schedule -- [s1,s2,s2spread,idle]
//!     [--reps 1] [--s1-secs 60] [--s1-workers 50] [--s1-claimers N]
//!     [--s1-ahead-ms MS]
//!     [--s2-n 10000] [--idle-queues 10000] [--idle-secs 30]
//! ```
//!
//! Each run gets a private `redis-server --save '' --appendonly no` on a
//! free loopback port (or the Redis at `REDIS_URL`, flushed first).
//!
//! * S1: a consumer pool (`consume`, 50 workers by default, as BullMQ's
//!   harness runs its Worker; `--s1-workers`, `--s1-claimers` change it) runs first; then 1,000 schedules `every(1 s)` are declared
//!   on one queue, one call each, and run for `--s1-secs` (60) from the
//!   first call, plus 2 s for the last ones to arrive. Lateness: handler
//!   entry (this machine's clock, the server's too on loopback) − the
//!   occurrence (from the message id), p50/p90/p99/max; occurrences
//!   missed (an occurrence after a schedule's declaration returned and at
//!   or before the window's end that never arrived) and doubled (arrived
//!   twice). Also the Redis server's commands/s and CPU, and this process's
//!   CPU, over the window.
//! * S2: 10,000 schedules `every(1 h)` (the next due within the hour) on one
//!   queue, idle for 30 s: Redis commands/s, round trips/s of the driver,
//!   this process's CPU, the server's CPU. `s2spread`: the same with each
//!   schedule on a queue of its own (10,000 queues).
//! * idle: `--idle-queues` queues, each holding one message due in an hour
//!   and one schedule `every(1 h)`, idle for `--idle-secs`: the guard
//!   sweep's cost on the server (`INFO cpu` delta), as README's idle
//!   table measures it.

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redwheel::schedule::{Schedule, parse_occurrence_id};
use redwheel::{ConsumerOptions, Redwheel};

#[path = "support/measure.rs"]
mod measure;
#[path = "support/throwaway_redis.rs"]
mod throwaway_redis;

use measure::{percentile, process_cpu, server_totals};
use throwaway_redis::ThrowawayRedis;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn epoch_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A fresh Redis: the one at `REDIS_URL` flushed, or a private one.
fn fresh(name: &str) -> Res<(String, Option<ThrowawayRedis>)> {
    if let Ok(url) = std::env::var("REDIS_URL") {
        let mut con = redis::Client::open(url.as_str())?.get_connection()?;
        redis::cmd("FLUSHALL").query::<()>(&mut con)?;
        return Ok((url, None));
    }
    let s = ThrowawayRedis::start(name)?;
    Ok((s.url(), Some(s)))
}

/// The server's load and this process's CPU, read at the start and end of
/// a window.
struct Window {
    server: redis::Connection,
    start: Instant,
    cmds: f64,
    redis_cpu: f64,
    cpu: Duration,
    round_trips: u64,
}

impl Window {
    fn open(url: &str, rw: &Redwheel) -> Res<Window> {
        let mut server = redis::Client::open(url)?.get_connection()?;
        let (cmds, redis_cpu) = server_totals(std::slice::from_mut(&mut server))?;
        Ok(Window {
            server,
            start: Instant::now(),
            cmds,
            redis_cpu,
            cpu: process_cpu()?,
            round_trips: rw.driver_stats().round_trips,
        })
    }

    /// `"seconds", "redis_cmds_per_s", "redis_cpu_pct", "cpu_pct_of_core",
    /// "round_trips_per_s"` as JSON fields.
    fn close(mut self, rw: &Redwheel) -> Res<String> {
        let cpu = process_cpu()? - self.cpu;
        let wall = self.start.elapsed().as_secs_f64();
        let round_trips = rw.driver_stats().round_trips - self.round_trips;
        let (cmds, redis_cpu) = server_totals(std::slice::from_mut(&mut self.server))?;
        // Our own INFO calls: 3 per reading.
        let cmds = cmds - self.cmds - 3.0;
        Ok(format!(
            r#""seconds":{wall:.1},"redis_cmds_per_s":{:.1},"redis_cpu_pct":{:.2},"cpu_pct_of_core":{:.2},"round_trips_per_s":{:.2}"#,
            cmds / wall,
            (redis_cpu - self.redis_cpu) / wall * 100.0,
            cpu.as_secs_f64() / wall * 100.0,
            round_trips as f64 / wall,
        ))
    }
}

fn s1(
    rep: usize,
    secs: u64,
    workers: usize,
    claimers: Option<usize>,
    ahead: Option<u64>,
) -> Res<()> {
    let (url, _server) = fresh("bench-s1")?;
    let rw = Redwheel::connect(&url)?;
    let q = rw.queue::<String>("bench-s1")?;
    let n = 1_000;
    // Each handler entry: (schedule, occurrence ms, lateness ms), sent on a
    // channel (no lock shared by the handlers, so the measurement does not
    // hold them up), tallied after the run.
    let (entries_tx, entries) = crossbeam_channel::unbounded::<(String, u64, f64)>();
    let consumer = {
        let mut opts = ConsumerOptions::default().concurrency(workers);
        if let Some(c) = claimers {
            opts = opts.claimers(c);
        }
        if let Some(ms) = ahead {
            opts = opts.claim_ahead(Duration::from_millis(ms));
        }
        q.consume(opts, move |d| {
            let entry = SystemTime::now();
            let (name, at) = parse_occurrence_id(d.id().as_str()).ok_or("not an occurrence")?;
            let late = entry.duration_since(at).map_or_else(
                |e| -(e.duration().as_secs_f64() * 1e3),
                |d| d.as_secs_f64() * 1e3,
            );
            let _ = entries_tx.send((name.to_owned(), epoch_ms(at), late));
            Ok::<(), &'static str>(())
        })?
    };
    let every = Schedule::every(Duration::from_secs(1));
    let t0 = SystemTime::now();
    let end = epoch_ms(t0) + secs * 1_000;
    // When each declaration returned: its occurrences after that are owed.
    let mut declared = Vec::with_capacity(n);
    for i in 0..n {
        q.schedule(&format!("s{i}"), &every, &format!("s{i}"))?;
        declared.push(epoch_ms(SystemTime::now()));
    }
    let upsert_s = t0.elapsed()?.as_secs_f64();
    let window = Window::open(&url, &rw)?;
    while epoch_ms(SystemTime::now()) < end {
        std::thread::sleep(Duration::from_millis(100));
    }
    let load = window.close(&rw)?;
    std::thread::sleep(Duration::from_secs(2));
    consumer.shutdown(Duration::from_secs(10))?;
    // (schedule, occurrence ms) -> deliveries; and each lateness in ms.
    let mut seen: HashMap<(String, u64), u32> = HashMap::new();
    let mut late: Vec<f64> = Vec::new();
    for (name, at_ms, l) in entries.try_iter() {
        *seen.entry((name, at_ms)).or_default() += 1;
        late.push(l);
    }
    let (mut expected, mut missed, mut doubled) = (0u64, 0u64, 0u64);
    for (i, after) in declared.iter().enumerate() {
        let name = format!("s{i}");
        let mut t = (after / 1_000 + 1) * 1_000;
        while t <= end {
            expected += 1;
            match seen.get(&(name.clone(), t)) {
                None => missed += 1,
                Some(&k) if k > 1 => doubled += u64::from(k - 1),
                _ => {}
            }
            t += 1_000;
        }
    }
    late.sort_by(f64::total_cmp);
    let runs = seen.values().map(|&k| u64::from(k)).sum::<u64>();
    println!(
        r#"{{"test":"s1","rep":{rep},"schedules":{n},"secs":{secs},"upsert_s":{upsert_s:.2},"runs":{runs},"expected":{expected},"missed":{missed},"doubled":{doubled},"lateness_ms_min":{:.2},"p50":{:.2},"p90":{:.2},"p99":{:.2},"max":{:.2},"early":{},{load}}}"#,
        late.first().copied().unwrap_or(0.0),
        percentile(&late, 0.5),
        percentile(&late, 0.9),
        percentile(&late, 0.99),
        late.last().copied().unwrap_or(0.0),
        late.iter().filter(|&&l| l < 0.0).count(),
    );
    rw.shutdown(Duration::from_secs(10))?;
    Ok(())
}

/// S2: `n` schedules every hour, on one queue or on a queue each; idle.
fn s2(rep: usize, n: usize, spread: bool, secs: u64) -> Res<()> {
    let (url, _server) = fresh("bench-s2")?;
    let rw = Redwheel::connect(&url)?;
    let hourly = Schedule::every(Duration::from_secs(3_600));
    let mut open = Vec::new();
    let one = rw.queue::<String>("bench-s2")?;
    for i in 0..n {
        let q = if spread {
            let q = rw.queue::<String>(&format!("bench-s2-{i}"))?;
            open.push(q.clone());
            q
        } else {
            one.clone()
        };
        q.schedule(&format!("s{i}"), &hourly, &format!("s{i}"))?;
    }
    // Let the first runs and subscriptions settle.
    std::thread::sleep(Duration::from_secs(3));
    let window = Window::open(&url, &rw)?;
    std::thread::sleep(Duration::from_secs(secs));
    let load = window.close(&rw)?;
    println!(
        r#"{{"test":"{}","rep":{rep},"schedules":{n},"queues":{},{load}}}"#,
        if spread { "s2spread" } else { "s2" },
        if spread { n } else { 1 },
    );
    rw.shutdown(Duration::from_secs(10))?;
    Ok(())
}

/// The guard sweep's idle cost: `queues` queues, each with one message and
/// one schedule due within the hour.
fn idle(rep: usize, queues: usize, secs: u64) -> Res<()> {
    let (url, _server) = fresh("bench-idle")?;
    let rw = Redwheel::connect(&url)?;
    let hourly = Schedule::every(Duration::from_secs(3_600));
    let mut open = Vec::with_capacity(queues);
    for i in 0..queues {
        let q = rw.queue::<String>(&format!("bench-idle-{i}"))?;
        q.offer(&"x".repeat(64), Duration::from_secs(3_600))?;
        q.schedule("hourly", &hourly, &"h".to_string())?;
        open.push(q);
    }
    std::thread::sleep(Duration::from_secs(3));
    let window = Window::open(&url, &rw)?;
    std::thread::sleep(Duration::from_secs(secs));
    let load = window.close(&rw)?;
    println!(
        r#"{{"test":"idle","rep":{rep},"queues":{queues},"messages":{queues},"schedules":{queues},{load}}}"#
    );
    rw.shutdown(Duration::from_secs(10))?;
    Ok(())
}

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut tests: Vec<String> = vec!["s1".into(), "s2".into()];
    let (mut reps, mut s1_secs, mut s2_n, mut idle_queues, mut idle_secs) =
        (1, 60, 10_000, 10_000, 30);
    let (mut s1_workers, mut s1_claimers, mut s1_ahead) = (50, None, None);
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = || -> Res<u64> { Ok(it.next().ok_or("a value is missing")?.parse()?) };
        match arg.as_str() {
            "--reps" => reps = value()? as usize,
            "--s1-secs" => s1_secs = value()?,
            "--s1-workers" => s1_workers = value()? as usize,
            "--s1-claimers" => s1_claimers = Some(value()? as usize),
            "--s1-ahead-ms" => s1_ahead = Some(value()?),
            "--s2-n" => s2_n = value()? as usize,
            "--idle-queues" => idle_queues = value()? as usize,
            "--idle-secs" => idle_secs = value()?,
            list => tests = list.split(',').map(String::from).collect(),
        }
    }
    for rep in 0..reps {
        for t in &tests {
            match t.as_str() {
                "s1" => s1(rep, s1_secs, s1_workers, s1_claimers, s1_ahead)?,
                "s2" => s2(rep, s2_n, false, 30)?,
                "s2spread" => s2(rep, s2_n, true, 30)?,
                "idle" => idle(rep, idle_queues, idle_secs)?,
                other => return Err(format!("unknown test {other}").into()),
            }
        }
    }
    Ok(())
}
