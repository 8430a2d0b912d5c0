//! At-least-once consumption with a consumer pool.
//!
//! Offers 20 addresses with delays of up to half a second, two of them
//! bad, and consumes them with a pool of 4 workers: a handler that returns
//! `Ok` acks its message, one that returns `Err` nacks it, and the message
//! comes back after a backoff until its delivery limit (3 here) sends it
//! to the dead letters, with the reason. Prints each delivery, the dead
//! letters and the queue's counts, and checks that every good address was
//! handled and both bad ones ended as dead letters.
//!
//! Run with `cargo run --example consumer_pool`. It uses the Redis at
//! `REDIS_URL` if set; otherwise it starts a throwaway `redis-server` on a
//! free loopback port (and stops it at the end).

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redwheel::{ConsumerOptions, QueueOptions, Redwheel};
use redwheel_testkit::ThrowawayRedis;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // REDIS_URL, or a throwaway redis-server kept until the end of main.
    let (url, _server) = ThrowawayRedis::unless_redis_url("consumer-pool")?;
    println!("using {url}");

    let rw = Redwheel::connect(&url)?;
    let q = rw.queue_with::<String>(
        "example-emails",
        QueueOptions::default()
            .visibility(Duration::from_secs(10)) // not acked within 10 s: delivered again
            .max_deliveries(3), // then a dead letter
    )?;
    q.clear()?;

    let mut good = BTreeSet::new();
    for i in 0..20u64 {
        let address = if i % 10 == 7 {
            format!("user{i} at example.com") // no '@': the handler refuses it
        } else {
            format!("user{i}@example.com")
        };
        if address.contains('@') {
            good.insert(address.clone());
        }
        q.offer(&address, Duration::from_millis(25 * i))?;
    }
    println!("offered 20 addresses, 2 of them bad");

    let handled = Arc::new(Mutex::new(BTreeSet::new()));
    let seen = handled.clone();
    let consumer = q.consume(
        ConsumerOptions::default()
            .concurrency(4)
            // A failed message is retried after 100 ms, then 200 ms (the
            // default starts at 1 s).
            .retry_backoff(Duration::from_millis(100), Duration::from_secs(1)),
        move |d| {
            println!("  attempt {} of {}", d.attempt(), d.payload());
            if !d.payload().contains('@') {
                return Err(format!("{:?} is not an address", d.payload()));
            }
            seen.lock().unwrap().insert(d.payload().clone());
            Ok(())
        },
    )?;

    // Wait until the good ones are handled and the bad ones are dead.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let stats = q.stats()?;
        if stats.dead == 2 && stats.delayed + stats.ready + stats.in_flight == 0 {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!("the pool did not finish within 60 s: {stats:?}").into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    consumer.shutdown(Duration::from_secs(5))?;

    for dead in q.dead_letters(10)? {
        println!(
            "dead letter {} after {} attempts: {}",
            dead.payload().map_or("(undecodable)", String::as_str),
            dead.attempts(),
            dead.reason()
        );
    }
    println!("{:?}", q.stats()?);
    let handled = handled.lock().unwrap();
    if *handled != good {
        return Err(format!("handled {} of {} good addresses", handled.len(), good.len()).into());
    }
    println!("every good address was handled; both bad ones are dead letters");
    q.clear()?;
    rw.shutdown(Duration::from_secs(5))?;
    Ok(())
}
