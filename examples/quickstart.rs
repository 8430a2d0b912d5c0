//! The redwheel quickstart: a Redis-persisted delayed queue.
//!
//! Offers a handful of messages with different delays, consumes them as
//! they fall due, and prints how late each one arrived.
//!
//! Run with `cargo run --example quickstart`. It uses the Redis at
//! `REDIS_URL` if set; otherwise it starts a throwaway `redis-server` on a
//! free loopback port (and stops it at the end).

use std::time::{Duration, SystemTime};

use redwheel::Redwheel;

use redwheel_testkit::ThrowawayRedis;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // REDIS_URL, or a throwaway redis-server kept until the end of main.
    let (url, _server) = ThrowawayRedis::unless_redis_url("quickstart")?;
    println!("using {url}");

    let rw = Redwheel::connect(&url)?;
    let q = rw.queue::<String>("quickstart")?;
    q.clear()?;

    let delays_ms = [400u64, 50, 800, 200, 10];
    for ms in delays_ms {
        let id = q.offer(&format!("due in {ms} ms"), Duration::from_millis(ms))?;
        println!("offered {id} ({ms:>3} ms)");
    }
    // A cancelled one is never delivered.
    let cancelled = q.offer(&"never".to_string(), Duration::from_millis(300))?;
    println!("removed {cancelled}: {}", q.remove(&cancelled)?);

    for _ in 0..delays_ms.len() {
        let m = q.take()?;
        let late = SystemTime::now()
            .duration_since(m.due())
            .unwrap_or(Duration::ZERO);
        println!(
            "took {:<16} {:<14} {:>6.2} ms after its due time",
            m.id(),
            m.payload(),
            late.as_secs_f64() * 1e3
        );
    }
    match q.poll(Duration::from_millis(100))? {
        None => println!("nothing else is due"),
        Some(m) => println!("unexpected: {}", m.payload()),
    }
    rw.shutdown(Duration::from_secs(5))?;
    Ok(())
}
