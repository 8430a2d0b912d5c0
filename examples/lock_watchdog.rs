//! A Redis lock with a watchdog: three workers take turns on one lock,
//! each writing to a "store" that checks fencing tokens; one worker holds
//! the lock for three leases and the watchdog keeps it; then a holder
//! that stops renewing (its `Redwheel` shuts down mid-section, as a
//! crashed process would) loses the lease: `on_lost` fires, its unlock
//! fails, and the store refuses its late write.
//!
//! Run with `cargo run --example lock_watchdog`. It uses the Redis at
//! `REDIS_URL` if set; otherwise it starts a throwaway `redis-server` on a
//! free loopback port (and stops it at the end).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redwheel::{ErrorKind, Redwheel};

use redwheel_testkit::ThrowawayRedis;

/// What a downstream store does with fencing tokens: it remembers the
/// greatest token it accepted and refuses anything older.
#[derive(Default)]
struct FencedStore {
    last_token: u64,
    log: Vec<String>,
}

impl FencedStore {
    fn write(&mut self, token: u64, what: String) -> Result<(), String> {
        if token < self.last_token {
            return Err(format!(
                "refused {what:?}: token {token} is older than {}",
                self.last_token
            ));
        }
        self.last_token = token;
        self.log.push(what);
        Ok(())
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // REDIS_URL, or a throwaway redis-server kept until the end of main.
    let (url, _server) = ThrowawayRedis::unless_redis_url("lock-watchdog")?;
    println!("using {url}");
    let rw = Redwheel::connect(&url)?;
    let store = Arc::new(Mutex::new(FencedStore::default()));
    let lease = Duration::from_millis(600);

    // Three workers take turns; worker 0 holds it for three leases once.
    let t0 = Instant::now();
    let workers: Vec<_> = (0..3)
        .map(|w| {
            let (rw, store) = (rw.clone(), Arc::clone(&store));
            std::thread::spawn(move || -> Result<(), redwheel::Error> {
                let lock = rw.lock("example").watchdog_lease(lease);
                for round in 0..3 {
                    let guard = lock.lock()?;
                    let token = guard.fencing_token();
                    let hold = if w == 0 && round == 1 {
                        lease * 3
                    } else {
                        Duration::from_millis(20)
                    };
                    std::thread::sleep(hold);
                    if !guard.is_lost() {
                        let what = format!("worker {w} round {round}");
                        store.lock().unwrap().write(token, what).ok();
                    }
                    println!(
                        "{:>5} ms  worker {w} held it {:>4} ms with token {token}",
                        t0.elapsed().as_millis(),
                        hold.as_millis()
                    );
                    guard.unlock()?;
                }
                Ok(())
            })
        })
        .collect();
    for w in workers {
        w.join().expect("a worker panicked")?;
    }
    let s = rw.lock_stats();
    println!(
        "{} acquisitions, {} renewals, {} lost",
        s.acquired, s.renewals, s.lost
    );

    // A holder that stops renewing: its Redwheel shuts down while it holds
    // the lock (what a crash or a long pause looks like to Redis).
    let doomed = Redwheel::connect(&url)?;
    let guard = doomed
        .lock("example")
        .watchdog_lease(lease)
        .on_lost(|l| {
            println!(
                "on_lost: lock {:?}, token {} ({})",
                l.name(),
                l.fencing_token(),
                l.cause()
            )
        })
        .lock()?;
    let stale = guard.fencing_token();
    doomed.shutdown(Duration::from_secs(5))?;
    // Another process takes the lock once the lease has lapsed.
    let next = rw.lock("example").lock()?;
    println!("the next holder got token {}", next.fencing_token());
    store
        .lock()
        .unwrap()
        .write(next.fencing_token(), "next holder".into())
        .ok();
    // The stale holder wakes up and tries to write: the store refuses.
    println!("stale holder: is_lost() = {}", guard.is_lost());
    if let Err(e) = store.lock().unwrap().write(stale, "stale holder".into()) {
        println!("store: {e}");
    }
    match guard.unlock() {
        Err(e) if e.kind() == ErrorKind::LockLost => println!("stale unlock: {e}"),
        other => println!("stale unlock: {other:?}"),
    }
    next.unlock()?;
    println!("store log: {:?}", store.lock().unwrap().log);
    rw.shutdown(Duration::from_secs(5))?;
    Ok(())
}
