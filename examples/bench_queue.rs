//! Queue benchmarks Q1, Q2, Q3 and Q5 of BENCHMARKS.md, printed as one JSON
//! line per run.
//!
//! ```text
//! cargo run --release --example bench_queue -- [q1,q2,q3,q5,q5t] [--reps 3] [--q5-n 1000000]
//! ```
//!
//! Uses the Redis at `REDIS_URL` if set (it is cleared of the bench
//! queues), otherwise a private `redis-server --save '' --appendonly no` on
//! a free loopback port. Payloads are 64 bytes; delays come from SplitMix64.
//!
//! * Q1: 100,000 `offer`s from one thread, delays U[1, 60] s: offers/s.
//! * Q2: 100,000 offers through `offer_batch`, batches of 1,000: offers/s.
//! * Q3: 2,000 messages, delays U[1000, 5000] ms, one consumer in `take`:
//!   lateness (receive − due) p50/p99/max in ms and the count of early ones.
//! * Q5: N messages all due at one instant D, 4 consumers: ms from D until
//!   all are in the ready list (transfer rate) and until all are taken.
//!   `q5t` is the same with no consumers (transfer only).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime};

use redwheel::{Queue, QueueOptions, Redwheel};

#[path = "support/splitmix.rs"]
mod splitmix;
#[path = "support/throwaway_redis.rs"]
mod throwaway_redis;
use splitmix::SplitMix64;
use throwaway_redis::ThrowawayRedis;

fn payload() -> String {
    "p".repeat(64)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let rank = ((p * sorted.len() as f64).ceil() as usize).max(1);
    sorted[rank - 1]
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

fn q5(
    rw: &Redwheel,
    url: &str,
    rep: usize,
    n: usize,
    consumers: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let name = if consumers > 0 {
        "bench-q5"
    } else {
        "bench-q5t"
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
    let handles: Vec<_> = (0..consumers)
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
    let drained_ms = SystemTime::now()
        .duration_since(due)
        .unwrap_or_default()
        .as_secs_f64()
        * 1e3;
    if consumers > 0 {
        println!(
            r#"{{"test":"q5_burst","rep":{rep},"n":{n},"consumers":{consumers},"transferred_ms":{transferred_ms:.1},"transfer_msgs_per_s":{:.0},"drained_ms":{drained_ms:.1},"consumed_per_s":{:.0}}}"#,
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

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut tests: Vec<String> = ["q1", "q2", "q3", "q5t", "q5"].map(String::from).to_vec();
    let mut reps = 3;
    let mut q5_n = 1_000_000;
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
            list => tests = list.split(',').map(String::from).collect(),
        }
        i += 1;
    }
    let (url, _server) = match std::env::var("REDIS_URL") {
        Ok(url) => (url, None),
        Err(_) => {
            let s = ThrowawayRedis::start("bench")?;
            (s.url(), Some(s))
        }
    };
    let rw = Redwheel::connect(&url)?;
    for rep in 0..reps {
        for t in &tests {
            match t.as_str() {
                "q1" => q1(&rw, rep)?,
                "q2" => q2(&rw, rep)?,
                "q3" => q3(&rw, rep)?,
                "q5" => q5(&rw, &url, rep, q5_n, 4)?,
                "q5t" => q5(&rw, &url, rep, q5_n, 0)?,
                other => return Err(format!("unknown test {other}").into()),
            }
        }
    }
    rw.shutdown(Duration::from_secs(10))?;
    Ok(())
}
