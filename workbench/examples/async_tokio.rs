//! redwheel's futures under tokio (feature `async`).
//!
//! On a multi-thread tokio runtime: 8 tasks offer 100 messages at once
//! (their offers go out together, a few script calls for all of them),
//! a stream of claimed deliveries is consumed by tasks that each ack
//! theirs, a `take_async` waits for a delayed message without holding a
//! thread or a connection, a lock is held across `.await` points (the
//! guard is `Send`) while other tasks queue for it, and the wheel's
//! `sleep` times the run. Nothing in redwheel is tokio's: the same code
//! runs under smol or any other executor.
//!
//! Run with `cargo run -p redwheel-workbench --example async_tokio
//! --features async`. It uses the Redis at `REDIS_URL` if set; otherwise
//! it starts a throwaway `redis-server` on a free loopback port (and stops
//! it at the end).

use std::future::poll_fn;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures_core::Stream;
use redwheel::timer::HashedWheelTimer;
use redwheel::{ConsumerOptions, Redwheel};
use redwheel_testkit::ThrowawayRedis;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // REDIS_URL, or a throwaway redis-server kept until the end of main.
    let (url, _server) = ThrowawayRedis::unless_redis_url("async-tokio")?;
    println!("using {url}");
    let rw = Redwheel::connect(&url)?;
    let q = rw.queue::<String>("example-async")?;
    q.clear()?;
    let timer = HashedWheelTimer::builder()
        .tick_duration(Duration::from_millis(1))
        .build()?;

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()?;
    rt.block_on(async {
        let started = Instant::now();

        // 8 tasks × 12 offers, due at once; 4 more due in 300 ms.
        let mut offers = Vec::new();
        for t in 0..8 {
            let q = q.clone();
            offers.push(tokio::spawn(async move {
                for i in 0..12 {
                    q.offer_async(&format!("task {t} message {i}"), Duration::ZERO)
                        .await?;
                }
                Ok::<(), redwheel::Error>(())
            }));
        }
        for offer in offers {
            offer.await??;
        }
        for i in 0..4 {
            q.offer_async(&format!("late {i}"), Duration::from_millis(300))
                .await?;
        }
        println!("offered 100 messages from 8 tasks");

        // A stream of claimed deliveries (at most 16 held at once), each
        // acked by a task of its own.
        let acked = Arc::new(AtomicU64::new(0));
        {
            let mut deliveries = pin!(q.deliveries(ConsumerOptions::default().concurrency(16)));
            let mut acks = Vec::new();
            while acks.len() < 96 {
                let Some(d) = poll_fn(|cx| deliveries.as_mut().poll_next(cx)).await else {
                    break;
                };
                let d = d?;
                let acked = acked.clone();
                acks.push(tokio::spawn(async move {
                    d.ack_async().await?;
                    acked.fetch_add(1, Ordering::Relaxed);
                    Ok::<(), redwheel::Error>(())
                }));
            }
            for ack in acks {
                ack.await??;
            }
        } // the stream ends here: what it claimed and did not hand out goes back
        println!("acked {} deliveries", acked.load(Ordering::Relaxed));

        // Waits in this process for the delayed ones: no thread, no connection.
        for _ in 0..4 {
            let m = q.take_async().await?;
            println!(
                "took {} {:.0} ms after start",
                m.payload(),
                started.elapsed().as_secs_f64() * 1e3
            );
        }

        // A lock held across .await on whichever worker; 3 tasks wait for it.
        let lock = rw.lock("example-async-lock");
        let mut tokens = Vec::new();
        let mut waiters = Vec::new();
        for _ in 0..3 {
            let lock = lock.clone();
            waiters.push(tokio::spawn(async move {
                let g = lock.lock_async().await?;
                tokio::task::yield_now().await; // held across an await
                let token = g.fencing_token();
                g.unlock_async().await?;
                Ok::<u64, redwheel::Error>(token)
            }));
        }
        for w in waiters {
            tokens.push(w.await??);
        }
        tokens.sort_unstable();
        tokens.dedup();
        assert_eq!(tokens.len(), 3, "every acquisition has a token of its own");
        println!("3 tasks held the lock in turn, tokens {tokens:?}");

        // The wheel's sleep, a future woken by one wheel timeout.
        timer.sleep(Duration::from_millis(20)).await?;
        println!("done in {:.0} ms", started.elapsed().as_secs_f64() * 1e3);
        Ok::<(), Box<dyn std::error::Error>>(())
    })?;
    q.clear()?;
    rw.shutdown(Duration::from_secs(5))?;
    Ok(())
}
