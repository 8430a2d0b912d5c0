//! Lock benchmarks L1–L3 of BENCHMARKS.md, printed as one JSON line per
//! run.
//!
//! ```text
//! cargo run --release --example bench_lock -- [l1,l2,l2x,l3] [--reps 3] [--l3-locks 10000] [--l3-secs 20]
//! ```
//!
//! Uses the Redis at `REDIS_URL` if set, otherwise a private
//! `redis-server --save '' --appendonly no` on a free loopback port.
//!
//! * L1: one thread, 3,000 `lock` + `unlock` pairs on one name (watchdog
//!   on, as `lock()` does; `l1_lease` without it): pairs/s.
//! * L2: 8 threads contend for one lock, each taking it 100 times and
//!   holding it 0.5 ms; handoff = the next holder's acquire instant − the
//!   instant the previous holder began its unlock, p50/p99/max ms, with the
//!   peers' percentile rule (`sorted[round((n − 1)·p)]`). `l2` has the 8
//!   threads share one `Redwheel` (a release wakes a waiter of its own
//!   process directly); `l2x` gives each thread its own `Redwheel`, so
//!   every wake-up travels through Redis pub/sub, as between processes.
//! * L3: `--l3-locks` locks (10,000) held by one process with a 3 s
//!   watchdog lease (renewed every 1 s) for `--l3-secs` while a busy queue
//!   shares the wheel and the driver (a producer offering batches of 1,000
//!   due within 100 ms, 4 consumers taking them): renewal rounds (round
//!   trips) per period per 1,000 locks, and the worst lateness of a renewal
//!   (the longest gap between two renewals of one lock, minus the period).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redwheel::Redwheel;

#[path = "support/throwaway_redis.rs"]
mod throwaway_redis;
use throwaway_redis::ThrowawayRedis;

/// The peers' rule (bench_pylock.py, bench_redlock.js).
fn pct(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn l1(rw: &Redwheel, rep: usize, watchdog: bool) -> Result<(), Box<dyn std::error::Error>> {
    let n = 3_000;
    let lock = rw.lock("bench-l1");
    // Warm up the connection and the scripts.
    drop(lock.lock()?);
    let mut each = Vec::with_capacity(n);
    let t0 = Instant::now();
    for _ in 0..n {
        let t = Instant::now();
        let g = if watchdog {
            lock.lock()?
        } else {
            lock.lock_with_lease(Duration::from_secs(30))?
        };
        g.unlock()?;
        each.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let secs = t0.elapsed().as_secs_f64();
    each.sort_by(f64::total_cmp);
    let test = if watchdog {
        "l1_uncontended"
    } else {
        "l1_lease"
    };
    println!(
        r#"{{"test":"{test}","rep":{rep},"n":{n},"pairs_per_s":{:.0},"pair_p50_us":{:.0},"pair_p99_us":{:.0}}}"#,
        n as f64 / secs,
        pct(&each, 0.5),
        pct(&each, 0.99)
    );
    Ok(())
}

fn l2(url: &str, rep: usize, shared: bool) -> Result<(), Box<dyn std::error::Error>> {
    let threads = 8;
    let per = 100;
    let first = Redwheel::connect(url)?;
    let instances: Vec<Redwheel> = (0..threads)
        .map(|_| {
            if shared {
                Ok(first.clone())
            } else {
                Redwheel::connect(url)
            }
        })
        .collect::<Result<_, _>>()?;
    let last_release: Arc<Mutex<Option<Instant>>> = Arc::new(Mutex::new(None));
    let handoffs: Arc<Mutex<Vec<f64>>> = Arc::new(Mutex::new(Vec::new()));
    let start = Arc::new(std::sync::Barrier::new(threads));
    let t0 = Instant::now();
    let workers: Vec<_> = instances
        .into_iter()
        .map(|rw| {
            let (last_release, handoffs, start) = (
                Arc::clone(&last_release),
                Arc::clone(&handoffs),
                Arc::clone(&start),
            );
            std::thread::spawn(move || -> Result<(), redwheel::Error> {
                let lock = rw.lock("bench-l2");
                start.wait();
                for _ in 0..per {
                    let g = lock.lock()?;
                    let now = Instant::now();
                    if let Some(r) = *last_release.lock().unwrap() {
                        handoffs
                            .lock()
                            .unwrap()
                            .push(now.duration_since(r).as_secs_f64() * 1e3);
                    }
                    std::thread::sleep(Duration::from_micros(500));
                    *last_release.lock().unwrap() = Some(Instant::now());
                    g.unlock()?;
                }
                Ok(())
            })
        })
        .collect();
    for w in workers {
        w.join().expect("a worker panicked")?;
    }
    let secs = t0.elapsed().as_secs_f64();
    let mut v = handoffs.lock().unwrap().clone();
    // The first handoffs include each thread's first wait, which subscribes
    // the lock's unlock channel.
    let later_max = v.iter().skip(2 * threads).copied().fold(0.0, f64::max);
    v.sort_by(f64::total_cmp);
    let test = if shared { "l2_handoff" } else { "l2x_handoff" };
    println!(
        r#"{{"test":"{test}","rep":{rep},"acquisitions_per_s":{:.0},"p50_ms":{:.3},"p99_ms":{:.3},"max_ms":{:.3},"max_after_first_16_ms":{later_max:.3},"n":{}}}"#,
        (threads * per) as f64 / secs,
        pct(&v, 0.5),
        pct(&v, 0.99),
        v[v.len() - 1],
        v.len()
    );
    Ok(())
}

fn l3(url: &str, rep: usize, locks: usize, secs: u64) -> Result<(), Box<dyn std::error::Error>> {
    let rw = Redwheel::connect(url)?;
    let lease = Duration::from_secs(3);
    let period = lease / 3;
    // The busy queue: a producer and four consumers on the same Redwheel.
    let q = rw.queue::<String>("bench-l3")?;
    q.clear()?;
    let stop = Arc::new(AtomicBool::new(false));
    let consumed = Arc::new(AtomicU64::new(0));
    let mut workers = Vec::new();
    for _ in 0..4 {
        let (q, stop, consumed) = (q.clone(), Arc::clone(&stop), Arc::clone(&consumed));
        workers.push(std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if let Ok(Some(_)) = q.poll(Duration::from_millis(100)) {
                    consumed.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    {
        let (q, stop) = (q.clone(), Arc::clone(&stop));
        workers.push(std::thread::spawn(move || {
            let p = "p".repeat(64);
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let batch: Vec<(String, Duration)> = (0..1_000)
                    .map(|j| {
                        i += 1;
                        (p.clone(), Duration::from_millis((i * 7 + j) % 100))
                    })
                    .collect();
                let _ = q.offer_batch(&batch);
                std::thread::sleep(Duration::from_millis(100));
            }
        }));
    }
    let t_acquire = Instant::now();
    let guards: Vec<_> = (0..locks)
        .map(|i| {
            rw.lock(&format!("bench-l3-{i}"))
                .watchdog_lease(lease)
                .lock()
        })
        .collect::<Result<_, _>>()?;
    let acquire_secs = t_acquire.elapsed().as_secs_f64();
    let s0 = rw.lock_stats();
    let d0 = rw.driver_stats();
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs(secs));
    let elapsed = t0.elapsed().as_secs_f64();
    let s1 = rw.lock_stats();
    let d1 = rw.driver_stats();
    let lost = guards.iter().filter(|g| g.is_lost()).count();
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        let _ = w.join();
    }
    drop(guards);
    let periods = elapsed / period.as_secs_f64();
    let rounds = (s1.renewal_rounds - s0.renewal_rounds) as f64;
    let lateness_ms = s1.max_renewal_gap.as_secs_f64() * 1e3 - period.as_secs_f64() * 1e3;
    println!(
        r#"{{"test":"l3_renewal","rep":{rep},"locks":{locks},"seconds":{elapsed:.1},"acquire_s":{acquire_secs:.2},"renewal_round_trips_per_s":{:.2},"round_trips_per_period_per_1000_locks":{:.3},"renewals_per_s":{:.0},"max_gap_ms":{:.1},"worst_lateness_ms":{lateness_ms:.1},"lease_ms":{},"lost":{lost},"driver_round_trips_per_s":{:.1},"queue_consumed_per_s":{:.0}}}"#,
        rounds / elapsed,
        rounds / periods / (locks as f64 / 1_000.0),
        (s1.renewals - s0.renewals) as f64 / elapsed,
        s1.max_renewal_gap.as_secs_f64() * 1e3,
        lease.as_millis(),
        (d1.rounds - d0.rounds) as f64 / elapsed,
        consumed.load(Ordering::Relaxed) as f64 / elapsed,
    );
    q.clear()?;
    rw.shutdown(Duration::from_secs(10))?;
    Ok(())
}

/// The raw limit's script (run-locks.sh) through the `redis` crate on one
/// connection: what one sync Rust client gets, for comparison with
/// `redis-benchmark -c 1`.
fn raw_rs(url: &str, rep: usize) -> Result<(), Box<dyn std::error::Error>> {
    let mut con = redis::Client::open(url)?.get_connection()?;
    let script = redis::Script::new(
        "if redis.call('exists', KEYS[1]) == 0 then redis.call('hset', KEYS[1], ARGV[1], 1) \
         redis.call('pexpire', KEYS[1], 30000) return nil end return redis.call('pttl', KEYS[1])",
    );
    let n = 20_000;
    let _: Option<i64> = script.key("raw-lock").arg("owner").invoke(&mut con)?;
    let mut each = Vec::with_capacity(n);
    let t0 = Instant::now();
    for _ in 0..n {
        let t = Instant::now();
        let _: Option<i64> = script.key("raw-lock").arg("owner").invoke(&mut con)?;
        each.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let secs = t0.elapsed().as_secs_f64();
    each.sort_by(f64::total_cmp);
    println!(
        r#"{{"test":"raw_rs_evalsha","rep":{rep},"round_trips_per_s":{:.0},"pairs_per_s_limit":{:.0},"call_p50_us":{:.0},"call_p99_us":{:.0}}}"#,
        n as f64 / secs,
        n as f64 / secs / 2.0,
        pct(&each, 0.5),
        pct(&each, 0.99)
    );
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut tests: Vec<String> = ["l1", "l2", "l2x", "l3"].map(String::from).to_vec();
    let mut reps = 3;
    let mut l3_locks = 10_000;
    let mut l3_secs = 20;
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            "--reps" => {
                reps = args[i + 1].parse()?;
                i += 1;
            }
            "--l3-locks" => {
                l3_locks = args[i + 1].parse()?;
                i += 1;
            }
            "--l3-secs" => {
                l3_secs = args[i + 1].parse()?;
                i += 1;
            }
            list => tests = list.split(',').map(String::from).collect(),
        }
        i += 1;
    }
    let (url, _server) = match std::env::var("REDIS_URL") {
        Ok(url) => (url, None),
        Err(_) => {
            let s = ThrowawayRedis::start("bench-lock")?;
            (s.url(), Some(s))
        }
    };
    let rw = Redwheel::connect(&url)?;
    for rep in 0..reps {
        for t in &tests {
            match t.as_str() {
                "l1" => l1(&rw, rep, true)?,
                "l1_lease" => l1(&rw, rep, false)?,
                "raw_rs" => raw_rs(&url, rep)?,
                "l2" => l2(&url, rep, true)?,
                "l2x" => l2(&url, rep, false)?,
                "l3" => l3(&url, rep, l3_locks, l3_secs)?,
                other => return Err(format!("unknown test {other:?}").into()),
            }
        }
    }
    rw.shutdown(Duration::from_secs(10))?;
    Ok(())
}
