//! Async benchmarks A1–A3 of BENCHMARKS.md (feature `async`), each beside
//! its peer in the same sitting, runs interleaved (ours, peer, ours,
//! peer…); one JSON line per run, then the medians and their ratio.
//!
//! ```text
//! cargo run --release --features async --example bench_async -- [a1,a2,a3,s1] [--reps 3]
//! ```
//!
//! Uses the Redis at `REDIS_URL` if set (flushed between runs: use a
//! scratch server), otherwise a private `redis-server --save ''
//! --appendonly no` on a free loopback port. Both sides run on the same
//! tokio runtime shape (multi-thread, 2 workers: the machine's cores).
//!
//! * A1: 64 tasks offer 100,000 messages in all (64-byte payloads, delays
//!   U[1, 60] s from SplitMix64): offers/s of `offer_async` (one
//!   multiplexed connection) beside redis-rs's own async multiplexed
//!   connection (`redis` with `tokio-comp`) sending the same number of
//!   `EVALSHA` of the peers' raw `offer.lua`
//!   (`shared/peers/redis-raw/lua/offer.lua`, built in) from 64 tasks.
//! * A2: 100,000 tasks each awaiting a sleep of U[1, 2000] ms: tasks
//!   created (spawned and their sleep armed) per second, lateness
//!   (wake-up − deadline) p50 and p99, and resident memory per sleeping
//!   task (`/proc/self/statm` before and after all are armed), of
//!   `HashedWheelTimer::sleep` (1 ms ticks) beside `tokio::time::sleep`,
//!   on the same runtime.
//! * A3: 100,000 due messages; 64 tasks each looping `claim_async` +
//!   `ack_async` until all are acked: messages/s, beside the synchronous
//!   consumer pool (`consume`, 64 workers, 4 claimers, a no-op handler).
//! * S1 (for the question whether the multiplexed connection would help
//!   the synchronous API): the synchronous `offer` from 64 threads beside
//!   `offer_async` from 64 tasks, 100,000 offers each.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use redwheel::{ConsumerOptions, Queue, Redwheel};

#[path = "../../examples/support/splitmix.rs"]
mod splitmix;
use redwheel_testkit::ThrowawayRedis;
use splitmix::SplitMix64;

const N: usize = 100_000;
const TASKS: usize = 64;

/// The peers' Redisson-style offer script (shared/peers/redis-raw/lua/offer.lua).
const PEER_OFFER: &str = r#"local value = struct.pack('Lc0Lc0', string.len(ARGV[2]), ARGV[2], string.len(ARGV[3]), ARGV[3])
redis.call('ZADD', KEYS[1], ARGV[1], value)
redis.call('RPUSH', KEYS[2], value)
local head = redis.call('ZRANGE', KEYS[1], 0, 0)
if head[1] == value then
  redis.call('PUBLISH', KEYS[3], ARGV[1])
  return 1
end
return 0
"#;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn payload() -> String {
    "p".repeat(64)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

fn delays(seed: u64) -> Vec<Duration> {
    let mut rng = SplitMix64(seed);
    (0..N)
        .map(|_| Duration::from_millis(rng.range(1_000, 60_000)))
        .collect()
}

fn flush(url: &str) -> Res<()> {
    let client = redis::Client::open(url)?;
    let mut con = client.get_connection()?;
    redis::cmd("FLUSHALL").query::<()>(&mut con)?;
    Ok(())
}

/// A1, ours: 64 tasks share the N offers; offers/s.
fn a1_ours(url: &str) -> Res<f64> {
    let rw = Redwheel::connect(url)?;
    let q: Queue<String> = rw.queue("bench-a1")?;
    let delays = Arc::new(delays(42));
    let rt = runtime();
    let secs = rt.block_on(async {
        // One offer first: the multiplexed connection is open and the
        // script loaded, as the peer's is.
        q.offer_async(&payload(), Duration::from_secs(60)).await?;
        let next = Arc::new(AtomicUsize::new(0));
        let start = Instant::now();
        let mut tasks = Vec::new();
        for _ in 0..TASKS {
            let (q, next, delays) = (q.clone(), Arc::clone(&next), Arc::clone(&delays));
            tasks.push(tokio::spawn(async move {
                let p = payload();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= N {
                        return Ok::<(), redwheel::Error>(());
                    }
                    q.offer_async(&p, delays[i]).await?;
                }
            }));
        }
        for t in tasks {
            t.await??;
        }
        Ok::<f64, Box<dyn std::error::Error>>(start.elapsed().as_secs_f64())
    })?;
    rw.shutdown(Duration::from_secs(5))?;
    Ok(N as f64 / secs)
}

/// A1, the peer: redis-rs's multiplexed connection, 64 tasks, the same
/// number of EVALSHA of the peers' offer.lua; offers/s.
fn a1_peer(url: &str) -> Res<f64> {
    let client = redis::Client::open(url)?;
    let delays = Arc::new(delays(42));
    let script = redis::Script::new(PEER_OFFER);
    let sha = script.get_hash().to_owned();
    let rt = runtime();
    let secs = rt.block_on(async {
        let con = client.get_multiplexed_async_connection().await?;
        let mut c = con.clone();
        redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(PEER_OFFER)
            .query_async::<String>(&mut c)
            .await?;
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_millis() as u64;
        let next = Arc::new(AtomicUsize::new(0));
        let start = Instant::now();
        let mut tasks = Vec::new();
        for t in 0..TASKS {
            let (mut con, next, delays, sha) = (
                con.clone(),
                Arc::clone(&next),
                Arc::clone(&delays),
                sha.clone(),
            );
            tasks.push(tokio::spawn(async move {
                let p = payload();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= N {
                        return Ok::<(), redis::RedisError>(());
                    }
                    let deadline = now_ms + delays[i].as_millis() as u64;
                    let id = format!("{t}-{i}");
                    redis::cmd("EVALSHA")
                        .arg(&sha)
                        .arg(3)
                        .arg("peer:{q}:timeout")
                        .arg("peer:{q}:order")
                        .arg("peer:{q}:channel")
                        .arg(deadline)
                        .arg(id)
                        .arg(&p)
                        .query_async::<i64>(&mut con)
                        .await?;
                }
            }));
        }
        for t in tasks {
            t.await??;
        }
        Ok::<f64, Box<dyn std::error::Error>>(start.elapsed().as_secs_f64())
    })?;
    Ok(N as f64 / secs)
}

/// Resident memory of this process, bytes.
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

/// A future that counts, once, that its first poll has happened (its
/// sleep is armed).
struct Armed<F> {
    inner: std::pin::Pin<Box<F>>,
    count: Option<Arc<AtomicUsize>>,
}

impl<F: std::future::Future> std::future::Future for Armed<F> {
    type Output = F::Output;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<F::Output> {
        let r = self.inner.as_mut().poll(cx);
        if let Some(c) = self.count.take() {
            c.fetch_add(1, Ordering::Release);
        }
        r
    }
}

/// A2 on either timer; `sleep(ms)` makes the future. Prints the figures,
/// returns tasks created per second.
fn a2_run<S, F>(side: &str, sleep: S) -> Res<f64>
where
    S: Fn(Duration) -> F + Send + Sync + 'static,
    F: std::future::Future<Output = ()> + Send + 'static,
{
    let rt = runtime();
    let sleep = Arc::new(sleep);
    let mut rng = SplitMix64(99);
    let delays: Vec<Duration> = (0..N)
        .map(|_| Duration::from_millis(rng.range(1, 2_000)))
        .collect();
    let (created_per_s, late, bytes) = rt.block_on(async move {
        let armed = Arc::new(AtomicUsize::new(0));
        let before = rss();
        let start = Instant::now();
        let mut tasks = Vec::with_capacity(N);
        for d in delays {
            let (sleep, armed) = (Arc::clone(&sleep), Arc::clone(&armed));
            tasks.push(tokio::spawn(async move {
                let deadline = Instant::now() + d;
                Armed {
                    inner: Box::pin(sleep(d)),
                    count: Some(armed),
                }
                .await;
                Instant::now()
                    .saturating_duration_since(deadline)
                    .as_secs_f64()
                    * 1e3
            }));
        }
        while armed.load(Ordering::Acquire) < N {
            tokio::task::yield_now().await;
        }
        let created = N as f64 / start.elapsed().as_secs_f64();
        let bytes = rss().saturating_sub(before) as f64 / N as f64;
        let mut late = Vec::with_capacity(N);
        for t in tasks {
            late.push(t.await.expect("a sleeping task"));
        }
        late.sort_by(|a, b| a.total_cmp(b));
        (created, late, bytes)
    });
    let pct = |p: f64| late[((p * late.len() as f64) as usize).min(late.len() - 1)];
    println!(
        r#"{{"bench":"a2","side":"{side}","tasks_created_per_s":{created_per_s:.0},"lateness_p50_ms":{:.2},"lateness_p99_ms":{:.2},"bytes_per_sleeping_task":{bytes:.0}}}"#,
        pct(0.50),
        pct(0.99)
    );
    Ok(created_per_s)
}

fn a2_ours(_url: &str) -> Res<f64> {
    let timer = redwheel::timer::HashedWheelTimer::builder()
        .tick_duration(Duration::from_millis(1))
        .ticks_per_wheel(2048)
        .build()?;
    a2_run("redwheel", move |d| {
        let s = timer.sleep(d);
        async move {
            s.await.expect("the timer runs");
        }
    })
}

fn a2_peer(_url: &str) -> Res<f64> {
    a2_run("tokio", tokio::time::sleep)
}

/// N due messages in queue `name`, all on the ready list.
fn fill_ready(rw: &Redwheel, name: &str) -> Res<Queue<String>> {
    let q: Queue<String> = rw.queue(name)?;
    let batch: Vec<(String, Duration)> = (0..1_000).map(|_| (payload(), Duration::ZERO)).collect();
    for _ in 0..N / 1_000 {
        q.offer_batch(&batch)?;
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    while q.stats()?.ready < N as u64 {
        if Instant::now() > deadline {
            return Err("the messages did not reach the ready list".into());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(q)
}

/// A3, ours: 64 tasks claim and ack until all N are acked; messages/s.
fn a3_ours(url: &str) -> Res<f64> {
    let rw = Redwheel::connect(url)?;
    let q = fill_ready(&rw, "bench-a3")?;
    let rt = runtime();
    let secs = rt.block_on(async {
        let acked = Arc::new(AtomicUsize::new(0));
        let start = Instant::now();
        let mut tasks = Vec::new();
        for _ in 0..TASKS {
            let (q, acked) = (q.clone(), Arc::clone(&acked));
            tasks.push(tokio::spawn(async move {
                while acked.load(Ordering::Relaxed) < N {
                    match q.claim_async(Duration::from_millis(100)).await? {
                        Some(d) => {
                            d.ack_async().await?;
                            acked.fetch_add(1, Ordering::Relaxed);
                        }
                        None => continue,
                    }
                }
                Ok::<(), redwheel::Error>(())
            }));
        }
        for t in tasks {
            t.await??;
        }
        Ok::<f64, Box<dyn std::error::Error>>(start.elapsed().as_secs_f64())
    })?;
    rw.shutdown(Duration::from_secs(5))?;
    Ok(N as f64 / secs)
}

/// A3, the peer: the synchronous consumer pool (64 workers, 4 claimers);
/// messages/s.
fn a3_peer(url: &str) -> Res<f64> {
    let rw = Redwheel::connect(url)?;
    let q = fill_ready(&rw, "bench-a3")?;
    let done = Arc::new(AtomicUsize::new(0));
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let tx = std::sync::Mutex::new(tx);
    let d = Arc::clone(&done);
    let start = Instant::now();
    let c = q.consume(
        ConsumerOptions::default().concurrency(TASKS).claimers(4),
        move |_m| -> Result<(), String> {
            if d.fetch_add(1, Ordering::Relaxed) + 1 == N {
                let _ = tx.lock().unwrap().send(());
            }
            Ok(())
        },
    )?;
    rx.recv_timeout(Duration::from_secs(600))?;
    // Every handler returned; the last acks go out with the pool's next
    // claim: wait until Redis holds nothing in flight.
    while q.stats()?.in_flight > 0 {
        std::thread::sleep(Duration::from_millis(1));
    }
    let secs = start.elapsed().as_secs_f64();
    c.shutdown(Duration::from_secs(10))?;
    rw.shutdown(Duration::from_secs(5))?;
    Ok(N as f64 / secs)
}

/// S1: the synchronous offer from 64 threads; offers/s.
fn s1_sync(url: &str) -> Res<f64> {
    let rw = Redwheel::connect(url)?;
    let q: Queue<String> = rw.queue("bench-s1")?;
    q.offer(&payload(), Duration::from_secs(60))?;
    let delays = Arc::new(delays(7));
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let threads: Vec<_> = (0..TASKS)
        .map(|_| {
            let (q, next, delays) = (q.clone(), Arc::clone(&next), Arc::clone(&delays));
            std::thread::spawn(move || -> Result<(), redwheel::Error> {
                let p = payload();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= N {
                        return Ok(());
                    }
                    q.offer(&p, delays[i])?;
                }
            })
        })
        .collect();
    for t in threads {
        t.join().map_err(|_| "a thread panicked")??;
    }
    let secs = start.elapsed().as_secs_f64();
    rw.shutdown(Duration::from_secs(5))?;
    Ok(N as f64 / secs)
}

/// Redis's own time in scripts so far (`INFO commandstats`): (calls, µs).
fn script_time(url: &str) -> Res<(u64, u64)> {
    let client = redis::Client::open(url)?;
    let mut con = client.get_connection()?;
    let info: String = redis::cmd("INFO").arg("commandstats").query(&mut con)?;
    let line = info.lines().find(|l| l.starts_with("cmdstat_evalsha:"));
    let field = |name: &str| -> u64 {
        line.and_then(|l| {
            l.split([':', ','])
                .find_map(|kv| kv.strip_prefix(name))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
    };
    Ok((field("calls="), field("usec=")))
}

/// Runs `bench` and gives its figure and Redis's µs per script call in it.
fn measured(bench: Bench, url: &str) -> Res<(f64, f64)> {
    flush(url)?;
    let (c0, u0) = script_time(url)?;
    let x = bench(url)?;
    let (c1, u1) = script_time(url)?;
    Ok((x, (u1 - u0) as f64 / (c1 - c0).max(1) as f64))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

type Bench = fn(&str) -> Res<f64>;

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut which = vec![
        "a1".to_owned(),
        "a2".to_owned(),
        "a3".to_owned(),
        "s1".to_owned(),
    ];
    let mut reps = 3;
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            "--reps" => {
                reps = args.get(i + 1).ok_or("--reps N")?.parse()?;
                i += 1;
            }
            list => which = list.split(',').map(str::to_owned).collect(),
        }
        i += 1;
    }
    let own;
    let url = match std::env::var("REDIS_URL") {
        Ok(u) => u,
        Err(_) => {
            own = ThrowawayRedis::start("bench-async")?;
            own.url()
        }
    };
    for w in &which {
        let (ours, peer, unit, peer_name): (Bench, Bench, &str, &str) = match w.as_str() {
            "a1" => (
                a1_ours,
                a1_peer,
                "offers/s",
                "redis-rs multiplexed EVALSHA offer.lua",
            ),
            "a2" => (a2_ours, a2_peer, "tasks created/s", "tokio::time::sleep"),
            "a3" => (
                a3_ours,
                a3_peer,
                "msgs/s",
                "sync consume (64 workers, 4 claimers)",
            ),
            "s1" => (s1_sync, a1_ours, "offers/s", "offer_async, 64 tasks"),
            other => return Err(format!("unknown benchmark {other}").into()),
        };
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for rep in 0..reps {
            let (x, us) = measured(ours, &url)?;
            println!(
                r#"{{"bench":"{w}","side":"redwheel","rep":{rep},"{unit}":{x:.0},"redis_us_per_script":{us:.2}}}"#
            );
            let (y, us) = measured(peer, &url)?;
            println!(
                r#"{{"bench":"{w}","side":"peer","rep":{rep},"{unit}":{y:.0},"redis_us_per_script":{us:.2}}}"#
            );
            a.push(x);
            b.push(y);
        }
        let (ma, mb) = (median(a), median(b));
        println!(
            "{w}: redwheel {ma:.0} {unit} (median of {reps}), {peer_name} {mb:.0}: ratio {:.2}",
            ma / mb
        );
    }
    Ok(())
}
