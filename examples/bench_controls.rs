//! Benchmarks of the queue controls (issue 21), printed as one JSON line
//! per run.
//!
//! ```text
//! cargo run --release --example bench_controls -- [q1,q1k,q1t,q1d,q5p0,q5p,rl]
//!     [--reps 3] [--q5-n 200000] [--rl-secs 30]
//! ```
//!
//! Uses the Redis at `REDIS_URL` if set, otherwise a private
//! `redis-server --save '' --appendonly no` on a free loopback port.
//! Payloads are 64 bytes.
//!
//! * Q1 and its dedup twins: 100,000 offers one after another from one
//!   thread, delays U[1, 60] s (SplitMix64, seed 42): `q1` plain `offer`,
//!   `q1k` `offer_with` under a key of its own per message (`Dedup::Keep`),
//!   `q1t` the same with `Dedup::Throttle(60 s)`, `q1d` with
//!   `Dedup::Debounce`. Offers/s.
//! * Q5 with priorities: N messages all due at one instant D, offered by 8
//!   threads through `offer_with`, then taken by 4 consumers in `poll`:
//!   ms from D until all are ready and until all are taken. `q5p0` offers
//!   them all at priority 0 (the path without priorities), `q5p` with
//!   priorities 0..9 (SplitMix64, seed 5).
//! * rl (rate-limited consumption, beside BullMQ's `limiter` through
//!   `benches/peers/run-bullmq-limiter.sh`): a limit of 100 per 1 s, 5,000
//!   messages due now, a consumer pool of 4 workers draining them for
//!   `--rl-secs`. Each delivery's admission time is its claim's server time
//!   (BullMQ: `job.processedOn`, set when its limiter let it through).
//!   Reports the rate over the run (deliveries from the first one on,
//!   divided by the run's length, against 100/s), the most deliveries in
//!   any sliding window of 1 s (the limit is 100), and lateness against the
//!   ideal limited schedule (delivery i at t0 + floor(i / 100) s) p50, p99,
//!   max.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redwheel::{ConsumerOptions, Dedup, OfferOptions, Queue, QueueOptions, Redwheel};

#[path = "support/splitmix.rs"]
mod splitmix;
#[path = "support/throwaway_redis.rs"]
mod throwaway_redis;
use splitmix::SplitMix64;
use throwaway_redis::ThrowawayRedis;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn payload() -> String {
    "p".repeat(64)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let rank = ((p * sorted.len() as f64).ceil() as usize).max(1);
    sorted[rank - 1]
}

/// Q1 through `offer` (`mode` None) or `offer_with` in a dedup mode.
fn q1(rw: &Redwheel, rep: usize, mode: Option<Dedup>, test: &str) -> Res<()> {
    let q = rw.queue::<String>(&format!("bench-{test}"))?;
    q.clear()?;
    let n = 100_000;
    let mut rng = SplitMix64(42);
    let delays: Vec<Duration> = (0..n)
        .map(|_| Duration::from_millis(rng.range(1_000, 60_000)))
        .collect();
    // Keys of their own per run (throttle windows outlive `clear`).
    let keys: Vec<String> = (0..n).map(|i| format!("order-{rep}-{i:07}")).collect();
    let p = payload();
    let t0 = Instant::now();
    match mode {
        None => {
            for d in &delays {
                q.offer(&p, *d)?;
            }
        }
        Some(mode) => {
            for (d, k) in delays.iter().zip(&keys) {
                q.offer_with(&p, OfferOptions::after(*d).id(k.as_str()).dedup(mode))?;
            }
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    println!(
        r#"{{"test":"{test}","rep":{rep},"n":{n},"seconds":{secs:.3},"offers_per_s":{:.0}}}"#,
        n as f64 / secs
    );
    q.clear()?;
    Ok(())
}

/// Q5 through `offer_with`, at priority 0 or at priorities 0..9.
fn q5(rw: &Redwheel, url: &str, rep: usize, n: usize, priorities: bool) -> Res<()> {
    let name = if priorities {
        "bench-q5p"
    } else {
        "bench-q5p0"
    };
    let q: Queue<String> = rw.queue_with(name, QueueOptions::default())?;
    q.clear()?;
    let mut rng = SplitMix64(5);
    let prio: Arc<Vec<u8>> = Arc::new(
        (0..n)
            .map(|_| {
                if priorities {
                    (rng.next() % 10) as u8
                } else {
                    0
                }
            })
            .collect(),
    );
    // Learn the offer rate, then pick D so that everything is offered
    // before it.
    let producers = 8;
    let offer_range = |from: usize, to: usize, due: SystemTime| -> Res<()> {
        let next = Arc::new(AtomicUsize::new(from));
        let handles: Vec<_> = (0..producers)
            .map(|_| {
                let (q, next, prio) = (q.clone(), Arc::clone(&next), Arc::clone(&prio));
                std::thread::spawn(move || -> Result<(), redwheel::Error> {
                    let p = payload();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= to {
                            return Ok(());
                        }
                        q.offer_with(&p, OfferOptions::at(due).priority(prio[i]))?;
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().map_err(|_| "producer panicked")??;
        }
        Ok(())
    };
    let probe = 10_000.min(n);
    let t0 = Instant::now();
    offer_range(0, probe, SystemTime::now() + Duration::from_secs(3_600))?;
    let per_msg = t0.elapsed().as_secs_f64() / probe as f64;
    q.clear()?;
    let due = SystemTime::now() + Duration::from_secs_f64(per_msg * n as f64 * 1.5 + 1.0);
    offer_range(0, n, due)?;
    if SystemTime::now() >= due {
        return Err("offering took longer than planned; rerun".into());
    }
    let taken = Arc::new(AtomicUsize::new(0));
    let consumers: Vec<_> = (0..4)
        .map(|_| {
            let (q, taken) = (q.clone(), Arc::clone(&taken));
            std::thread::spawn(move || {
                while taken.load(Ordering::Relaxed) < n {
                    if q.poll(Duration::from_millis(200)).ok().flatten().is_some() {
                        taken.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    let mut con = redis::Client::open(url)?.get_connection()?;
    let key = format!("redwheel:{{{name}}}:delayed");
    std::thread::sleep(due.duration_since(SystemTime::now()).unwrap_or_default());
    loop {
        let left: u64 = redis::cmd("ZCARD").arg(&key).query(&mut con)?;
        if left == 0 {
            break;
        }
        std::thread::sleep(Duration::from_micros(500));
    }
    let since_due = || {
        SystemTime::now()
            .duration_since(due)
            .unwrap_or_default()
            .as_secs_f64()
            * 1e3
    };
    let transferred_ms = since_due();
    for c in consumers {
        c.join().map_err(|_| "consumer panicked")?;
    }
    let drained_ms = since_due();
    let test = if priorities {
        "q5_priorities"
    } else {
        "q5_priority_0"
    };
    println!(
        r#"{{"test":"{test}","rep":{rep},"n":{n},"consumers":4,"transferred_ms":{transferred_ms:.1},"transfer_msgs_per_s":{:.0},"drained_ms":{drained_ms:.1},"consumed_per_s":{:.0}}}"#,
        n as f64 / transferred_ms * 1e3,
        n as f64 / drained_ms * 1e3
    );
    q.clear()?;
    Ok(())
}

/// Rate-limited consumption: 100 per 1 s, 4 workers, `secs` long.
fn rl(rw: &Redwheel, url: &str, rep: usize, secs: u64) -> Res<()> {
    let (max, per_ms) = (100usize, 1_000u64);
    let visibility = Duration::from_secs(600);
    let q: Queue<String> = rw.queue_with(
        "bench-rl",
        QueueOptions::default()
            .rate_limit(max as u32, Duration::from_millis(per_ms))
            .visibility(visibility),
    )?;
    q.clear()?;
    // Each run starts with an empty window.
    let mut con = redis::Client::open(url)?.get_connection()?;
    let _: () = redis::cmd("DEL")
        .arg("redwheel:{bench-rl}:rate")
        .query(&mut con)?;
    let p = payload();
    let backlog = 5_000;
    let batch: Vec<(String, Duration)> =
        (0..backlog).map(|_| (p.clone(), Duration::ZERO)).collect();
    q.offer_batch(&batch)?;
    let times = Arc::new(Mutex::new(Vec::with_capacity(backlog)));
    let pool = {
        let times = Arc::clone(&times);
        q.consume(ConsumerOptions::default().concurrency(4), move |d| {
            let until = d.visible_until().duration_since(UNIX_EPOCH).unwrap();
            times
                .lock()
                .unwrap()
                .push((until - visibility).as_millis() as u64);
            Ok::<(), String>(())
        })?
    };
    std::thread::sleep(Duration::from_secs(secs + 2));
    pool.shutdown(Duration::from_secs(10))?;
    let mut t = times.lock().unwrap().clone();
    t.sort_unstable();
    let run_ms = secs * 1_000;
    let t0 = t[0];
    let t: Vec<u64> = t.into_iter().filter(|&x| x < t0 + run_ms).collect();
    let max_in_window = t
        .iter()
        .enumerate()
        .map(|(i, &a)| t[i..].iter().take_while(|&&b| b < a + per_ms).count())
        .max()
        .unwrap_or(0);
    let mut late: Vec<f64> = t
        .iter()
        .enumerate()
        .map(|(i, &x)| x as f64 - (t0 + (i / max) as u64 * per_ms) as f64)
        .collect();
    late.sort_by(f64::total_cmp);
    println!(
        r#"{{"test":"rate_limited","rep":{rep},"max":{max},"per_ms":{per_ms},"run_s":{secs},"delivered":{},"rate_per_s":{:.2},"rate_vs_limit":{:.4},"max_in_any_window":{max_in_window},"lateness_p50_ms":{:.1},"lateness_p99_ms":{:.1},"lateness_max_ms":{:.1}}}"#,
        t.len(),
        t.len() as f64 / secs as f64,
        t.len() as f64 / (secs as f64 * max as f64 * 1_000.0 / per_ms as f64),
        percentile(&late, 0.5),
        percentile(&late, 0.99),
        late.last().copied().unwrap_or(0.0),
    );
    q.clear()?;
    Ok(())
}

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut tests: Vec<String> = ["q1", "q1k", "q1t", "q1d"].map(String::from).to_vec();
    let (mut reps, mut q5_n, mut rl_secs) = (3, 200_000, 30);
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
            "--rl-secs" => {
                rl_secs = args[i + 1].parse()?;
                i += 1;
            }
            list => tests = list.split(',').map(String::from).collect(),
        }
        i += 1;
    }
    let mut _server = None;
    let url = match std::env::var("REDIS_URL") {
        Ok(url) => url,
        Err(_) => {
            let s = ThrowawayRedis::start("bench-controls")?;
            let url = s.url();
            _server = Some(s);
            url
        }
    };
    let rw = Redwheel::connect(&url)?;
    for rep in 0..reps {
        for t in &tests {
            match t.as_str() {
                "q1" => q1(&rw, rep, None, "q1_offer")?,
                "q1k" => q1(&rw, rep, Some(Dedup::Keep), "q1_dedup_keep")?,
                "q1t" => q1(
                    &rw,
                    rep,
                    Some(Dedup::Throttle(Duration::from_secs(60))),
                    "q1_dedup_throttle",
                )?,
                "q1d" => q1(&rw, rep, Some(Dedup::Debounce), "q1_dedup_debounce")?,
                "q5p0" => q5(&rw, &url, rep, q5_n, false)?,
                "q5p" => q5(&rw, &url, rep, q5_n, true)?,
                "rl" => rl(&rw, &url, rep, rl_secs)?,
                other => return Err(format!("unknown test {other}").into()),
            }
        }
    }
    rw.shutdown(Duration::from_secs(10))?;
    Ok(())
}
