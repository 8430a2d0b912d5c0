//! Queue benchmarks Q1–Q6 of BENCHMARKS.md, printed as one JSON
//! line per run.
//!
//! ```text
//! cargo run --release --example bench_queue -- [q1,q1m,q2,q3,q4,q5,q5c,q5t,q6,mem,restart,failover,bb1,bb2,bb3,bb4]
//!     [--reps 3] [--q4-claimers 4] [--q5-n 1000000] [--q6-queues 100] [--q6-secs 30]
//!     [--cluster]
//! ```
//!
//! With `--cluster`, everything runs on a Redis Cluster: the one whose node
//! URLs are in `REDIS_CLUSTER_URLS` (comma-separated), or a throwaway local
//! one (three masters, three replicas).
//!
//! Uses the Redis at `REDIS_URL` if set (it is cleared of the bench
//! queues), otherwise a private `redis-server --save '' --appendonly no` on
//! a free loopback port. Payloads are 64 bytes; delays come from SplitMix64.
//!
//! * Q1: 100,000 `offer`s from one thread, delays U[1, 60] s: offers/s.
//! * Q2: 100,000 offers through `offer_batch`, batches of 1,000: offers/s.
//! * Q3: 2,000 messages, delays U[1000, 5000] ms, one consumer in `take`:
//!   lateness (receive − due) p50/p99/max in ms and the count of early ones.
//! * Q4: a consumer pool (`consume`, 4 threads, at-least-once: claim and
//!   ack) runs first; then 100,000 messages with delays U[1000, 5000] ms
//!   are offered in batches of 1,000: lateness (handler entry − due)
//!   p50/p99/max, consumed/s (as BullMQ's harness counts it: starts per
//!   second between the first and the last), and round trips per message
//!   (the consumer's script calls, from `INFO commandstats`).
//! * Q5: N messages all due at one instant D, 4 consumers: ms from D until
//!   all are in the ready list (transfer rate) and until all are taken.
//!   `q5t` is the same with no consumers (transfer only); `q5c` drains with
//!   a consumer pool (`consume`, 4 threads, claim and ack) instead of four
//!   threads in `poll` (at-most-once).
//! * Q6: `--q6-queues` queues (100 by default; run again with 10000), each
//!   holding one message due in an hour, open and idle for `--q6-secs`
//!   (30 s): Redis commands/s and round trips/s this process causes, and
//!   the CPU it uses (% of one core, from `/proc/self/stat`).
//! * mem (one server): Redis memory per waiting message, as BENCHMARKS.md
//!   counts it: `used_memory` (`INFO memory`) after 100,000 64-byte
//!   messages due in an hour were offered (batches of 1,000), minus
//!   before, over 100,000.
//! * BB1–BB4 (BENCHMARKS.md "Engine workloads", bullmq-bench's scenarios
//!   scaled ×5), each on a flushed server with its statistics reset:
//!   `bb1` 10,000 single offers, each awaited, of a 10×10 nested-uuid JSON
//!   payload (~3.9 kB), due now; `bb2` 50,000 `{"a":1}` in `offer_batch`es
//!   of 50, due now; `bb3` 20,000 ready messages, then a pool of
//!   concurrency 1 (no-op handler) until all are acked; `bb4` the same with
//!   50,000 and concurrency 100. For bb3/bb4 the messages are offered (due
//!   now) and moved to `ready` before the clock starts, as BullMQ's adds
//!   are outside its measure; that phase is printed apart (`fill_us_per_job`).
//!   Each prints jobs/s, redis-server CPU µs per job (`INFO cpu`
//!   used_cpu_user + used_cpu_sys over the run, over the jobs), and the
//!   profile: µs per job of each command (`INFO commandstats`; the commands
//!   scripts call are counted under their own names, inside `evalsha`'s).
//!   With `--slowlog`, a small run is logged at threshold 0 and the
//!   scripts are printed apart (by their first key and key count).
//! * Q1m: 100,000 offers from three threads, each offering to its own queue
//!   (on a cluster, the three queues live on three different masters).
//! * failover (cluster only): a producer offers every ms (10 ms delays) and
//!   a consumer takes; the master serving the queue is killed (SIGKILL).
//!   Reports ms from the kill to the replica's promotion (as `CLUSTER
//!   SLOTS` shows it) and to the first delivery after it.
//! * restart: a private `redis-server` with `appendonly yes, appendfsync
//!   everysec` (a SIGKILL of the server loses nothing written: the page
//!   cache keeps it; `always` would measure fsync, not recovery); 200 messages due while it is down and 200 due just after it is
//!   back; it is killed (SIGKILL) and restarted 1 s later. Reports the ms
//!   from Redis accepting connections again to the first overdue delivery,
//!   and the lateness of the messages due after the restart.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime};

use redwheel::{Queue, QueueOptions, Redwheel};

#[path = "support/measure.rs"]
mod measure;
#[path = "support/splitmix.rs"]
mod splitmix;
#[path = "support/throwaway_cluster.rs"]
mod throwaway_cluster;
#[path = "support/throwaway_redis.rs"]
mod throwaway_redis;
use measure::{info_field, percentile, process_cpu, server_totals};
use splitmix::SplitMix64;
use throwaway_cluster::ThrowawayCluster;
use throwaway_redis::ThrowawayRedis;

fn payload() -> String {
    "p".repeat(64)
}

fn q1(rw: &Redwheel, rep: usize) -> Result<(), Box<dyn std::error::Error>> {
    let q = rw.queue::<String>("bench-q1")?;
    q.clear()?;
    let n = 100_000;
    let mut rng = SplitMix64(42);
    let delays: Vec<Duration> = (0..n)
        .map(|_| Duration::from_millis(rng.range(1_000, 60_000)))
        .collect();
    let p = payload();
    let t0 = Instant::now();
    for d in &delays {
        q.offer(&p, *d)?;
    }
    let secs = t0.elapsed().as_secs_f64();
    println!(
        r#"{{"test":"q1_offer","rep":{rep},"n":{n},"seconds":{secs:.3},"offers_per_s":{:.0}}}"#,
        n as f64 / secs
    );
    q.clear()?;
    Ok(())
}

/// The port of the master serving `key` in the cluster reachable at
/// `seed`, or 0 on a single server.
fn master_port(seed: &str, key: &str) -> Result<u16, Box<dyn std::error::Error>> {
    let mut con = redis::Client::open(seed)?.get_connection()?;
    let info: String = redis::cmd("INFO").arg("cluster").query(&mut con)?;
    if !info.contains("cluster_enabled:1") {
        return Ok(0);
    }
    let slot: u16 = redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(key)
        .query(&mut con)?;
    let ranges: Vec<redis::Value> = redis::cmd("CLUSTER").arg("SLOTS").query(&mut con)?;
    for r in ranges {
        let redis::Value::Array(items) = r else {
            continue;
        };
        let first: u16 = redis::from_redis_value(items[0].clone())?;
        let last: u16 = redis::from_redis_value(items[1].clone())?;
        if let redis::Value::Array(m) = &items[2]
            && first <= slot
            && slot <= last
        {
            return Ok(redis::from_redis_value(m[1].clone())?);
        }
    }
    Err(format!("no master serves slot {slot}").into())
}

/// Q1 with three producer threads, each on its own queue; on a cluster
/// the three queues are on three different masters.
fn q1m(rw: &Redwheel, seed: &str, rep: usize) -> Result<(), Box<dyn std::error::Error>> {
    let mut names: Vec<String> = Vec::new();
    let mut masters = std::collections::HashSet::new();
    for k in 0..10_000 {
        let name = format!("bench-q1m-{k}");
        let port = master_port(seed, &name)?;
        if port == 0 || masters.insert(port) {
            names.push(name);
        }
        if names.len() == 3 {
            break;
        }
    }
    let n = 100_000 / names.len();
    let p = payload();
    let queues: Vec<Queue<String>> = names
        .iter()
        .map(|name| rw.queue::<String>(name))
        .collect::<Result<_, _>>()?;
    for q in &queues {
        q.clear()?;
    }
    let t0 = Instant::now();
    let threads: Vec<_> = queues
        .iter()
        .enumerate()
        .map(|(t, q)| {
            let q = q.clone();
            let p = p.clone();
            std::thread::spawn(move || -> Result<(), redwheel::Error> {
                let mut rng = SplitMix64(42 + t as u64);
                for _ in 0..n {
                    q.offer(&p, Duration::from_millis(rng.range(1_000, 60_000)))?;
                }
                Ok(())
            })
        })
        .collect();
    for t in threads {
        t.join().map_err(|_| "a producer panicked")??;
    }
    let secs = t0.elapsed().as_secs_f64();
    for q in &queues {
        q.clear()?;
    }
    println!(
        r#"{{"test":"q1m_offer_3_threads","rep":{rep},"n":{},"queues":{},"masters":{},"seconds":{secs:.3},"offers_per_s":{:.0}}}"#,
        n * names.len(),
        names.len(),
        masters.len().max(1),
        (n * names.len()) as f64 / secs
    );
    Ok(())
}

fn failover(
    rw: &Redwheel,
    cluster: &mut ThrowawayCluster,
    rep: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let name = format!("bench-failover-{rep}");
    let slot = cluster.keyslot(&name)?;
    let victim = cluster.master_of(slot)?;
    let q = rw.queue::<String>(&name)?;
    q.clear()?;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let producer = {
        let q = q.clone();
        let stop = stop.clone();
        let p = payload();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let _ = q.offer(&p, Duration::from_millis(10));
                std::thread::sleep(Duration::from_millis(1));
            }
        })
    };
    let (got_tx, got) = std::sync::mpsc::channel::<Instant>();
    let consumer = {
        let q = q.clone();
        let stop = stop.clone();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if let Ok(Some(_)) = q.poll(Duration::from_millis(50)) {
                    let _ = got_tx.send(Instant::now());
                }
            }
        })
    };
    std::thread::sleep(Duration::from_secs(2));
    while got.try_recv().is_ok() {}
    cluster.kill(victim);
    let killed = Instant::now();
    let promoted = loop {
        if cluster.master_of(slot).is_ok_and(|p| p != victim) {
            break Instant::now();
        }
        if killed.elapsed() > Duration::from_secs(60) {
            return Err("no failover within 60 s".into());
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let resumed = loop {
        let at = got.recv_timeout(Duration::from_secs(60))?;
        if at > promoted {
            break at;
        }
    };
    std::thread::sleep(Duration::from_secs(1));
    stop.store(true, Ordering::Relaxed);
    producer.join().map_err(|_| "producer panicked")?;
    consumer.join().map_err(|_| "consumer panicked")?;
    // The killed node comes back as a replica, for the next run.
    cluster.restart(victim)?;
    println!(
        r#"{{"test":"failover","rep":{rep},"kill_to_promotion_ms":{:.0},"kill_to_first_delivery_after_promotion_ms":{:.0},"promotion_to_delivery_ms":{:.1}}}"#,
        (promoted - killed).as_secs_f64() * 1e3,
        (resumed - killed).as_secs_f64() * 1e3,
        (resumed - promoted).as_secs_f64() * 1e3,
    );
    Ok(())
}

fn q2(rw: &Redwheel, rep: usize) -> Result<(), Box<dyn std::error::Error>> {
    let q = rw.queue::<String>("bench-q2")?;
    q.clear()?;
    let n = 100_000;
    let mut rng = SplitMix64(42);
    let p = payload();
    let batches: Vec<Vec<(String, Duration)>> = (0..n / 1_000)
        .map(|_| {
            (0..1_000)
                .map(|_| (p.clone(), Duration::from_millis(rng.range(1_000, 60_000))))
                .collect()
        })
        .collect();
    let t0 = Instant::now();
    for b in &batches {
        q.offer_batch(b)?;
    }
    let secs = t0.elapsed().as_secs_f64();
    println!(
        r#"{{"test":"q2_offer_batch","rep":{rep},"n":{n},"seconds":{secs:.3},"offers_per_s":{:.0}}}"#,
        n as f64 / secs
    );
    q.clear()?;
    Ok(())
}

fn q3(rw: &Redwheel, rep: usize) -> Result<(), Box<dyn std::error::Error>> {
    let q = rw.queue::<String>("bench-q3")?;
    q.clear()?;
    let n = 2_000;
    let mut rng = SplitMix64(42);
    let p = payload();
    let consumer = {
        let q = q.clone();
        std::thread::spawn(move || -> Result<Vec<f64>, redwheel::Error> {
            let mut late = Vec::with_capacity(n);
            for _ in 0..n {
                let m = q.take()?;
                let now = SystemTime::now();
                let ms = match now.duration_since(m.due()) {
                    Ok(d) => d.as_secs_f64() * 1e3,
                    Err(e) => -e.duration().as_secs_f64() * 1e3,
                };
                late.push(ms);
            }
            Ok(late)
        })
    };
    let msgs: Vec<(String, Duration)> = (0..n)
        .map(|_| (p.clone(), Duration::from_millis(rng.range(1_000, 5_000))))
        .collect();
    for chunk in msgs.chunks(1_000) {
        q.offer_batch(chunk)?;
    }
    let mut late = consumer.join().map_err(|_| "consumer panicked")??;
    late.sort_by(f64::total_cmp);
    let early = late.iter().filter(|&&l| l < 0.0).count();
    println!(
        r#"{{"test":"q3_lateness_low","rep":{rep},"n":{n},"p50_ms":{:.3},"p99_ms":{:.3},"max_ms":{:.3},"early":{early}}}"#,
        percentile(&late, 0.50),
        percentile(&late, 0.99),
        late[late.len() - 1]
    );
    Ok(())
}

fn q4(
    rw: &Redwheel,
    url: &str,
    rep: usize,
    claimers: Option<usize>,
) -> Result<(), Box<dyn std::error::Error>> {
    let q = rw.queue::<String>("bench-q4")?;
    q.clear()?;
    let n = 100_000usize;
    let starts: Arc<std::sync::Mutex<Vec<(Instant, f64)>>> =
        Arc::new(std::sync::Mutex::new(Vec::with_capacity(n)));
    let mut info = redis::Client::open(url)?.get_connection()?;
    let evalsha0 = command_calls(&mut info, "evalsha")?;
    let runs0 = q.transfer_stats().runs;
    let consumer = {
        let starts = Arc::clone(&starts);
        let mut options = redwheel::ConsumerOptions::default().concurrency(4);
        if let Some(n) = claimers {
            options = options.claimers(n);
        }
        q.consume(options, move |d| -> Result<(), String> {
            let now = SystemTime::now();
            let late = match now.duration_since(d.due()) {
                Ok(x) => x.as_secs_f64() * 1e3,
                Err(e) => -e.duration().as_secs_f64() * 1e3,
            };
            starts.lock().unwrap().push((Instant::now(), late));
            Ok(())
        })?
    };
    let mut rng = SplitMix64(3_000 + rep as u64);
    let p = payload();
    let msgs: Vec<(String, Duration)> = (0..n)
        .map(|_| (p.clone(), Duration::from_millis(rng.range(1_000, 5_000))))
        .collect();
    for chunk in msgs.chunks(1_000) {
        q.offer_batch(chunk)?;
    }
    let give_up = Instant::now() + Duration::from_secs(180);
    while starts.lock().unwrap().len() < n {
        if Instant::now() > give_up {
            return Err("q4: not all consumed within 180 s".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    consumer.shutdown(Duration::from_secs(10))?;
    let evalsha = command_calls(&mut info, "evalsha")? - evalsha0;
    let transfers = q.transfer_stats().runs - runs0;
    let offers = n.div_ceil(1_000) as u64;
    let round_trips = evalsha.saturating_sub(transfers + offers) as f64 / n as f64;
    let starts = std::mem::take(&mut *starts.lock().unwrap());
    let first = starts.iter().map(|s| s.0).min().ok_or("no start")?;
    let last = starts.iter().map(|s| s.0).max().ok_or("no start")?;
    let mut late: Vec<f64> = starts.iter().map(|s| s.1).collect();
    late.sort_by(f64::total_cmp);
    let early = late.iter().filter(|&&l| l < 0.0).count();
    println!(
        r#"{{"test":"q4_lateness_consume","rep":{rep},"n":{n},"consumers":4,"p50_ms":{:.2},"p99_ms":{:.2},"max_ms":{:.2},"early":{early},"consumed_per_s":{:.0},"round_trips_per_msg":{round_trips:.2}}}"#,
        percentile(&late, 0.5),
        percentile(&late, 0.99),
        late[late.len() - 1],
        (n - 1) as f64 / (last - first).as_secs_f64(),
    );
    q.clear()?;
    Ok(())
}

/// Calls of command `name` so far (`INFO commandstats`).
fn command_calls(
    con: &mut redis::Connection,
    name: &str,
) -> Result<u64, Box<dyn std::error::Error>> {
    let info: String = redis::cmd("INFO").arg("commandstats").query(con)?;
    let prefix = format!("cmdstat_{name}:calls=");
    Ok(info
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .map(|n| n.parse())
        .transpose()?
        .unwrap_or(0))
}

fn q5(
    rw: &Redwheel,
    url: &str,
    rep: usize,
    n: usize,
    consumers: usize,
    reliable: bool,
) -> Result<(), Box<dyn std::error::Error>> {
    let name = match (consumers, reliable) {
        (0, _) => "bench-q5t",
        (_, false) => "bench-q5",
        (_, true) => "bench-q5c",
    };
    let q: Queue<String> = rw.queue_with(name, QueueOptions::default())?;
    q.clear()?;
    let p = payload();
    // Offer a first chunk to learn the offer rate, then pick D so that the
    // rest is offered before it.
    let first = 10_000.min(n);
    let t0 = Instant::now();
    let far = SystemTime::now() + Duration::from_secs(3_600);
    let probe: Vec<(String, SystemTime)> = (0..first).map(|_| (p.clone(), far)).collect();
    let probe_ids = q.offer_batch_at(&probe)?;
    for id in &probe_ids {
        q.remove(id)?;
    }
    let per_msg = t0.elapsed().as_secs_f64() / first as f64;
    let lead = Duration::from_secs_f64(per_msg * n as f64 * 1.5 + 1.0);
    let due = SystemTime::now() + lead;
    let batch: Vec<(String, SystemTime)> = (0..1_000).map(|_| (p.clone(), due)).collect();
    let mut offered = 0;
    while offered < n {
        let k = 1_000.min(n - offered);
        q.offer_batch_at(&batch[..k])?;
        offered += k;
    }
    if SystemTime::now() >= due {
        return Err("offering took longer than planned; rerun".into());
    }
    let taken = Arc::new(AtomicUsize::new(0));
    // Q5c: a consumer pool (at-least-once: claim, handle, ack).
    let pool = if reliable {
        let taken = Arc::clone(&taken);
        Some(q.consume(
            redwheel::ConsumerOptions::default().concurrency(consumers),
            move |_d| -> Result<(), String> {
                taken.fetch_add(1, Ordering::Relaxed);
                Ok(())
            },
        )?)
    } else {
        None
    };
    let handles: Vec<_> = (0..if reliable { 0 } else { consumers })
        .map(|_| {
            let q = q.clone();
            let taken = taken.clone();
            std::thread::spawn(move || {
                while taken.load(Ordering::Relaxed) < n {
                    if q.poll(Duration::from_millis(200)).ok().flatten().is_some() {
                        taken.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    // Watch the delayed set from a separate connection.
    let client = redis::Client::open(url)?;
    let mut con = client.get_connection()?;
    let key = format!("redwheel:{{{name}}}:delayed");
    let to_due = due.duration_since(SystemTime::now()).unwrap_or_default();
    std::thread::sleep(to_due);
    loop {
        let left: u64 = redis::cmd("ZCARD").arg(&key).query(&mut con)?;
        if left == 0 {
            break;
        }
        std::thread::sleep(Duration::from_micros(500));
    }
    let transferred_ms = SystemTime::now()
        .duration_since(due)
        .unwrap_or_default()
        .as_secs_f64()
        * 1e3;
    for h in handles {
        h.join().map_err(|_| "consumer panicked")?;
    }
    while consumers > 0 && taken.load(Ordering::Relaxed) < n {
        std::thread::sleep(Duration::from_micros(500));
    }
    let drained_ms = SystemTime::now()
        .duration_since(due)
        .unwrap_or_default()
        .as_secs_f64()
        * 1e3;
    if let Some(pool) = pool {
        pool.shutdown(Duration::from_secs(10))?;
    }
    if consumers > 0 {
        let test = if reliable {
            "q5_burst_consume"
        } else {
            "q5_burst"
        };
        println!(
            r#"{{"test":"{test}","rep":{rep},"n":{n},"consumers":{consumers},"transferred_ms":{transferred_ms:.1},"transfer_msgs_per_s":{:.0},"drained_ms":{drained_ms:.1},"consumed_per_s":{:.0}}}"#,
            n as f64 / transferred_ms * 1e3,
            n as f64 / drained_ms * 1e3
        );
    } else {
        println!(
            r#"{{"test":"q5_transfer_only","rep":{rep},"n":{n},"transferred_ms":{transferred_ms:.1},"transfer_msgs_per_s":{:.0}}}"#,
            n as f64 / transferred_ms * 1e3
        );
    }
    q.clear()?;
    Ok(())
}

/// Redis memory per waiting message (see the module docs).
fn mem(rw: &Redwheel, url: &str, rep: usize) -> Result<(), Box<dyn std::error::Error>> {
    let n = 100_000;
    let q: Queue<String> = rw.queue("bench-mem")?;
    q.clear()?;
    let mut con = redis::Client::open(url)?.get_connection()?;
    let used = |con: &mut redis::Connection| -> Result<u64, Box<dyn std::error::Error>> {
        let info: String = redis::cmd("INFO").arg("memory").query(con)?;
        Ok(info
            .lines()
            .find_map(|l| l.strip_prefix("used_memory:"))
            .ok_or("no used_memory")?
            .trim()
            .parse()?)
    };
    let before = used(&mut con)?;
    let p = payload();
    let batch: Vec<(String, Duration)> = (0..1_000)
        .map(|_| (p.clone(), Duration::from_secs(3_600)))
        .collect();
    for _ in 0..n / 1_000 {
        q.offer_batch(&batch)?;
    }
    let after = used(&mut con)?;
    println!(
        r#"{{"test":"mem","rep":{rep},"n":{n},"payload_bytes":{},"bytes_per_msg":{:.1}}}"#,
        p.len(),
        after.saturating_sub(before) as f64 / n as f64
    );
    q.clear()?;
    Ok(())
}

fn q6(
    rw: &Redwheel,
    urls: &[String],
    rep: usize,
    queues: usize,
    secs: u64,
) -> Result<(), Box<dyn std::error::Error>> {
    let p = payload();
    let mut open = Vec::with_capacity(queues);
    for i in 0..queues {
        let q = rw.queue::<String>(&format!("bench-q6-{i}"))?;
        q.clear()?;
        q.offer(&p, Duration::from_secs(3_600))?;
        open.push(q);
    }
    // Let the first runs and subscriptions settle.
    std::thread::sleep(Duration::from_secs(3));
    // The servers that hold the queues: the one server, or every master.
    let mut cons = Vec::new();
    for url in urls {
        let mut con = redis::Client::open(url.as_str())?.get_connection()?;
        let role: String = redis::cmd("INFO").arg("replication").query(&mut con)?;
        if role.contains("role:master") {
            cons.push(con);
        }
    }
    let (cmds0, redis_cpu0) = server_totals(&mut cons)?;
    let rounds0 = rw.driver_stats();
    let cpu0 = process_cpu()?;
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs(secs));
    let cpu = process_cpu()? - cpu0;
    let wall = t0.elapsed().as_secs_f64();
    let rounds = rw.driver_stats();
    let (cmds1, redis_cpu1) = server_totals(&mut cons)?;
    // Our own INFO calls: 3 per server per reading.
    let cmds = cmds1 - cmds0 - 3.0 * cons.len() as f64;
    let servers = cons.len().max(1) as f64;
    println!(
        r#"{{"test":"q6_idle","rep":{rep},"queues":{queues},"servers":{},"seconds":{wall:.1},"redis_cmds_per_s":{:.1},"rounds_per_s":{:.2},"round_trips_per_server_per_s":{:.2},"driver_commands_per_s":{:.1},"cpu_pct_of_core":{:.2},"redis_cpu_pct":{:.2}}}"#,
        cons.len(),
        cmds / wall,
        (rounds.rounds - rounds0.rounds) as f64 / wall,
        (rounds.round_trips - rounds0.round_trips) as f64 / wall / servers,
        (rounds.commands - rounds0.commands) as f64 / wall,
        cpu.as_secs_f64() / wall * 100.0,
        (redis_cpu1 - redis_cpu0) / wall * 100.0,
    );
    for q in &open {
        q.clear()?;
    }
    Ok(())
}

fn restart(rep: usize) -> Result<(), Box<dyn std::error::Error>> {
    let mut server = ThrowawayRedis::start_with(
        "redis-server",
        &format!("bench-restart-{rep}"),
        &["--appendonly", "yes", "--appendfsync", "everysec"],
    )?;
    let rw = Redwheel::connect(&server.url())?;
    let q = rw.queue::<String>("bench-restart")?;
    let p = payload();
    let n = 400;
    let mut rng = SplitMix64(42);
    // Offered at t0: half due during the outage (kill at +100 ms, back at
    // about +1.1 s), half due 1.3..1.8 s after t0.
    let msgs: Vec<(String, Duration)> = (0..n)
        .map(|i| {
            let ms = if i % 2 == 0 {
                rng.range(200, 700)
            } else {
                rng.range(1_300, 1_800)
            };
            (p.clone(), Duration::from_millis(ms))
        })
        .collect();
    let consumer = {
        let q = q.clone();
        std::thread::spawn(
            move || -> Result<Vec<(SystemTime, SystemTime)>, redwheel::Error> {
                let mut got = Vec::with_capacity(n);
                while got.len() < n {
                    let m = q.take()?;
                    got.push((SystemTime::now(), m.due()));
                }
                Ok(got)
            },
        )
    };
    let t0 = Instant::now();
    q.offer_batch(&msgs)?;
    std::thread::sleep(Duration::from_millis(100).saturating_sub(t0.elapsed()));
    server.kill();
    std::thread::sleep(Duration::from_millis(1_100).saturating_sub(t0.elapsed()));
    server.restart()?;
    let back = SystemTime::now();
    let got = consumer.join().map_err(|_| "consumer panicked")??;
    let first_overdue = got
        .iter()
        .filter(|(_, due)| *due < back)
        .map(|(at, _)| *at)
        .min()
        .ok_or("no overdue message")?;
    let resume_ms = first_overdue
        .duration_since(back)
        .map(|d| d.as_secs_f64() * 1e3)
        .unwrap_or(0.0);
    let mut late: Vec<f64> = got
        .iter()
        .filter(|(_, due)| *due >= back)
        .map(|(at, due)| match at.duration_since(*due) {
            Ok(d) => d.as_secs_f64() * 1e3,
            Err(e) => -e.duration().as_secs_f64() * 1e3,
        })
        .collect();
    late.sort_by(f64::total_cmp);
    if late.is_empty() {
        return Err("no message was due after the restart".into());
    }
    println!(
        r#"{{"test":"restart","rep":{rep},"n":{n},"resume_ms":{resume_ms:.1},"due_after":{},"late_p50_ms":{:.2},"late_p99_ms":{:.2},"late_max_ms":{:.2},"early":{}}}"#,
        late.len(),
        percentile(&late, 0.5),
        percentile(&late, 0.99),
        late[late.len() - 1],
        late.iter().filter(|&&l| l < 0.0).count()
    );
    rw.shutdown(Duration::from_secs(10))?;
    Ok(())
}

/// A connection of its own to the server under test, for its counters.
struct Probe {
    con: redis::Connection,
}

/// `INFO commandstats`: command → (calls, µs).
type CommandStats = std::collections::BTreeMap<String, (u64, u64)>;

impl Probe {
    fn open(url: &str) -> Result<Self, Box<dyn std::error::Error>> {
        Ok(Probe {
            con: redis::Client::open(url)?.get_connection()?,
        })
    }

    /// Flushes the server and resets its statistics.
    fn reset(&mut self) -> Result<(), Box<dyn std::error::Error>> {
        redis::cmd("FLUSHALL").query::<()>(&mut self.con)?;
        redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query::<()>(&mut self.con)?;
        Ok(())
    }

    /// redis-server CPU seconds so far (user + system).
    fn cpu(&mut self) -> Result<f64, Box<dyn std::error::Error>> {
        Ok(info_field(&mut self.con, "cpu", "used_cpu_user")?
            + info_field(&mut self.con, "cpu", "used_cpu_sys")?)
    }

    fn commandstats(&mut self) -> Result<CommandStats, Box<dyn std::error::Error>> {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(&mut self.con)?;
        let mut out = CommandStats::new();
        for line in info.lines() {
            let Some(rest) = line.strip_prefix("cmdstat_") else {
                continue;
            };
            let Some((name, fields)) = rest.split_once(':') else {
                continue;
            };
            let field = |k: &str| -> u64 {
                fields
                    .split(',')
                    .find_map(|f| f.strip_prefix(k))
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0)
            };
            out.insert(name.to_owned(), (field("calls="), field("usec=")));
        }
        Ok(out)
    }
}

/// The profile between two readings as JSON: command → µs per job, calls
/// per job (commands with under 0.01 µs per job left out).
fn profile_json(before: &CommandStats, after: &CommandStats, jobs: usize) -> String {
    let mut rows: Vec<(String, f64, f64)> = after
        .iter()
        .filter(|(name, _)| !matches!(name.as_str(), "info" | "config" | "flushall" | "slowlog"))
        .map(|(name, &(calls, us))| {
            let (c0, u0) = before.get(name).copied().unwrap_or((0, 0));
            (
                name.clone(),
                (us - u0) as f64 / jobs as f64,
                (calls - c0) as f64 / jobs as f64,
            )
        })
        .filter(|r| r.1 >= 0.01)
        .collect();
    rows.sort_by(|a, b| b.1.total_cmp(&a.1));
    let inner: Vec<String> = rows
        .iter()
        .map(|(n, us, calls)| format!(r#""{n}":[{us:.2},{calls:.3}]"#))
        .collect();
    format!("{{{}}}", inner.join(","))
}

/// A 10×10 nested-uuid JSON object (~3.9 kB), as bullmq-bench's add
/// scenario sends.
fn nested_uuids() -> String {
    let mut rng = SplitMix64(7);
    let mut uuid = || {
        let (a, b) = (rng.next(), rng.next());
        format!(
            "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
            a >> 32,
            (a >> 16) & 0xffff,
            a & 0xfff,
            (b >> 48) & 0x3fff | 0x8000,
            b & 0xffff_ffff_ffff
        )
    };
    let keys: Vec<String> = (0..10)
        .map(|i| {
            let list: Vec<String> = (0..10).map(|_| format!(r#""{}""#, uuid())).collect();
            format!(r#""k{i}":[{}]"#, list.join(","))
        })
        .collect();
    format!("{{{}}}", keys.join(","))
}

/// One BB scenario (see the module docs); `slowlog`: log every command of
/// the run (threshold 0) and print the scripts' µs per job apart.
fn bb(
    rw: &Redwheel,
    url: &str,
    which: &str,
    rep: usize,
    slowlog: bool,
) -> Result<(), Box<dyn std::error::Error>> {
    let mut probe = Probe::open(url)?;
    probe.reset()?;
    let name = format!("bench-{which}");
    let q = rw.queue::<String>(&name)?;
    let tiny = r#"{"a":1}"#.to_owned();
    let (n, concurrency) = match which {
        "bb1" => (10_000, 0),
        "bb2" => (50_000, 0),
        "bb3" => (20_000, 1),
        _ => (50_000, 100),
    };
    // Fill for the worker scenarios, outside the measure (as BullMQ's
    // adds): offered due now, then moved to `ready` by the queue's job.
    let mut fill = String::new();
    if concurrency > 0 {
        let c0 = probe.cpu()?;
        let batch: Vec<(String, Duration)> =
            (0..1_000).map(|_| (tiny.clone(), Duration::ZERO)).collect();
        for _ in 0..n / 1_000 {
            q.offer_batch(&batch)?;
        }
        let key = format!("redwheel:{{{name}}}:delayed");
        let give_up = Instant::now() + Duration::from_secs(60);
        while redis::cmd("ZCARD").arg(&key).query::<u64>(&mut probe.con)? > 0 {
            if Instant::now() > give_up {
                return Err("the fill was not transferred within 60 s".into());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        fill = format!(
            r#","fill_us_per_job":{:.2}"#,
            (probe.cpu()? - c0) * 1e6 / n as f64
        );
    }
    if slowlog {
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("slowlog-log-slower-than")
            .arg(0)
            .arg("slowlog-max-len")
            .arg(1_000_000)
            .query::<()>(&mut probe.con)?;
        redis::cmd("SLOWLOG")
            .arg("RESET")
            .query::<()>(&mut probe.con)?;
    }
    let stats0 = probe.commandstats()?;
    let c0 = probe.cpu()?;
    let t0 = Instant::now();
    let secs = match which {
        "bb1" => {
            let big = nested_uuids();
            for _ in 0..n {
                q.offer(&big, Duration::ZERO)?;
            }
            t0.elapsed().as_secs_f64()
        }
        "bb2" => {
            let batch: Vec<(String, Duration)> =
                (0..50).map(|_| (tiny.clone(), Duration::ZERO)).collect();
            for _ in 0..n / 50 {
                q.offer_batch(&batch)?;
            }
            t0.elapsed().as_secs_f64()
        }
        _ => {
            let done = Arc::new(AtomicUsize::new(0));
            let (all_tx, all) = std::sync::mpsc::channel::<Instant>();
            let pool = {
                let done = Arc::clone(&done);
                q.consume(
                    redwheel::ConsumerOptions::default().concurrency(concurrency),
                    move |_d| -> Result<(), String> {
                        if done.fetch_add(1, Ordering::SeqCst) + 1 == n {
                            let _ = all_tx.send(Instant::now());
                        }
                        Ok(())
                    },
                )?
            };
            let last = all.recv_timeout(Duration::from_secs(300))?;
            // The last acks go out at the shutdown: inside the CPU measure.
            pool.shutdown(Duration::from_secs(10))?;
            (last - t0).as_secs_f64()
        }
    };
    let cpu = probe.cpu()? - c0;
    let stats1 = probe.commandstats()?;
    let load = std::fs::read_to_string("/proc/loadavg")?;
    let load1 = load.split_whitespace().next().unwrap_or("?");
    println!(
        r#"{{"test":"{which}","rep":{rep},"n":{n},"seconds":{secs:.3},"jobs_per_s":{:.0},"redis_us_per_job":{:.2}{fill},"load1":{load1},"profile_us_calls_per_job":{}}}"#,
        n as f64 / secs,
        cpu * 1e6 / n as f64,
        profile_json(&stats0, &stats1, n)
    );
    if slowlog {
        slowlog_scripts(&mut probe.con, n)?;
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("slowlog-log-slower-than")
            .arg(10_000)
            .query::<()>(&mut probe.con)?;
    }
    q.clear()?;
    Ok(())
}

/// Prints the µs per job and calls of each script the slow log recorded,
/// labelled by the script's key count and first key's last part.
fn slowlog_scripts(
    con: &mut redis::Connection,
    jobs: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let entries: Vec<redis::Value> = redis::cmd("SLOWLOG").arg("GET").arg(-1).query(con)?;
    let mut by: std::collections::BTreeMap<String, (u64, u64)> = Default::default();
    for e in entries {
        let redis::Value::Array(f) = e else { continue };
        let us: u64 = redis::from_redis_value(f[2].clone())?;
        let args: Vec<String> = match &f[3] {
            redis::Value::Array(a) => a
                .iter()
                .map(|v| redis::from_redis_value::<String>(v.clone()).unwrap_or_default())
                .collect(),
            _ => continue,
        };
        let label = match args.first().map(|a| a.to_ascii_lowercase()).as_deref() {
            Some("evalsha") if args.len() > 3 => {
                let first = args[3].rsplit(':').next().unwrap_or("?");
                format!(
                    "evalsha {} keys={} first={first}",
                    &args[1][..8.min(args[1].len())],
                    args[2]
                )
            }
            Some(cmd) => cmd.to_owned(),
            None => continue,
        };
        let row = by.entry(label).or_default();
        row.0 += 1;
        row.1 += us;
    }
    for (label, (calls, us)) in by {
        println!(
            r#"{{"slowlog":"{label}","calls":{calls},"us_per_job":{:.2},"us_per_call":{:.1}}}"#,
            us as f64 / jobs as f64,
            us as f64 / calls as f64
        );
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut tests: Vec<String> = ["q1", "q2", "q3", "q5t", "q5"].map(String::from).to_vec();
    let mut reps = 3;
    let mut q5_n = 1_000_000;
    let mut q6_queues = 100;
    let mut q6_secs = 30;
    let mut q4_claimers = None;
    let slowlog = args.iter().any(|a| a == "--slowlog");
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            "--reps" => {
                reps = args[i + 1].parse()?;
                i += 1;
            }
            "--q5-n" => {
                q5_n = args[i + 1].parse()?;
                i += 1;
            }
            "--q6-queues" => {
                q6_queues = args[i + 1].parse()?;
                i += 1;
            }
            "--q4-claimers" => {
                q4_claimers = Some(args[i + 1].parse()?);
                i += 1;
            }
            "--q6-secs" => {
                q6_secs = args[i + 1].parse()?;
                i += 1;
            }
            "--cluster" | "--slowlog" => {}
            list => tests = list.split(',').map(String::from).collect(),
        }
        i += 1;
    }
    let mut cluster: Option<ThrowawayCluster> = None;
    let mut _server = None;
    let (urls, rw) = if args.iter().any(|a| a == "--cluster") {
        let urls: Vec<String> = match std::env::var("REDIS_CLUSTER_URLS") {
            Ok(list) => list.split(',').map(|s| s.trim().to_owned()).collect(),
            Err(_) => {
                let c = ThrowawayCluster::start("bench-cluster")?;
                let urls = c.urls();
                cluster = Some(c);
                urls
            }
        };
        let seeds: Vec<&str> = urls.iter().map(String::as_str).collect();
        let rw = Redwheel::connect_cluster(&seeds)?;
        (urls, rw)
    } else {
        let url = match std::env::var("REDIS_URL") {
            Ok(url) => url,
            Err(_) => {
                let s = ThrowawayRedis::start("bench")?;
                let url = s.url();
                _server = Some(s);
                url
            }
        };
        let rw = Redwheel::connect(&url)?;
        (vec![url], rw)
    };
    let url = urls[0].clone();
    for rep in 0..reps {
        for t in &tests {
            match t.as_str() {
                "q1" => q1(&rw, rep)?,
                "q1m" => q1m(&rw, &url, rep)?,
                "q2" => q2(&rw, rep)?,
                "q3" => q3(&rw, rep)?,
                "q4" => q4(&rw, &url, rep, q4_claimers)?,
                "q5" => q5(&rw, &url, rep, q5_n, 4, false)?,
                "q5c" => q5(&rw, &url, rep, q5_n, 4, true)?,
                "q5t" => q5(&rw, &url, rep, q5_n, 0, false)?,
                "q6" => q6(&rw, &urls, rep, q6_queues, q6_secs)?,
                "mem" => mem(&rw, &url, rep)?,
                "bb1" | "bb2" | "bb3" | "bb4" => bb(&rw, &url, t, rep, slowlog)?,
                "restart" => restart(rep)?,
                "failover" => match cluster.as_mut() {
                    Some(c) => failover(&rw, c, rep)?,
                    None => {
                        return Err("failover needs --cluster (and a throwaway cluster)".into());
                    }
                },
                other => return Err(format!("unknown test {other}").into()),
            }
        }
    }
    rw.shutdown(Duration::from_secs(10))?;
    Ok(())
}
