//! The lock holders of the chaos run (`examples/chaos.rs`): each takes
//! the run's one lock in turn, writes under its fencing token to the
//! fenced store (`fenced_store.rs`), and unlocks, telling the store when
//! its unlock began and how it answered. Threads with `try_lock`, and,
//! with the `async` feature, tasks with `try_lock_async` (each on an
//! executor of its own), whose unlock is `unlock_async`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redwheel::{Error, ErrorKind, Redwheel};

use crate::fenced_store::FencedStore;
use crate::splitmix::SplitMix64;

/// The run's one lock.
pub const LOCK: &str = "chaos-lock";
/// Its watchdog lease.
pub const LEASE: Duration = Duration::from_secs(2);

/// What the holders counted.
#[derive(Default)]
pub struct LockCounters {
    pub lock_errors: AtomicU64,
    pub leases_lost: AtomicU64,
    pub unlock_lock_lost: AtomicU64,
}

/// What every holder shares.
#[derive(Clone)]
pub struct Holders {
    pub seed: u64,
    pub stop: Arc<AtomicBool>,
    pub store: Arc<Mutex<FencedStore>>,
    pub counters: Arc<LockCounters>,
    /// Longest pause between two writes of a section, in ms: long
    /// sections (`--unlocks`) outlast a restart of Redis, so the lock
    /// changes hands under their holders.
    pub pause_ms: u64,
}

impl Holders {
    /// The pause before holder `k`'s next write.
    fn pause(&self, rng: &mut SplitMix64) -> Duration {
        Duration::from_millis(rng.range(1, self.pause_ms))
    }

    fn rng(&self, k: u64) -> SplitMix64 {
        SplitMix64(self.seed ^ (k + 101).wrapping_mul(0x94D0_49BB))
    }

    /// After a section of holder `k` whose guard reads `lost`: its unlock
    /// begins.
    fn closing(&self, k: u64, lost: bool) {
        let mut store = self.store.lock().unwrap();
        store.close(k);
        store.unlocking(k);
        if lost {
            self.counters.leases_lost.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Holder `k`'s unlock answered `r`.
    fn unlocked(&self, k: u64, r: Result<(), Error>) {
        self.store.lock().unwrap().unlocked(k, r.is_ok());
        match r {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::LockLost => {
                self.counters
                    .unlock_lock_lost
                    .fetch_add(1, Ordering::Relaxed);
            }
            Err(_) => {
                self.counters.lock_errors.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Holder `k` on this thread, until told to stop.
pub fn lock_holder(k: u64, rw: Redwheel, h: Holders) {
    let lock = rw.lock(LOCK).watchdog_lease(LEASE);
    let mut rng = h.rng(k);
    while !h.stop.load(Ordering::SeqCst) {
        let g = match lock.try_lock(Duration::from_millis(500)) {
            Ok(Some(g)) => g,
            Ok(None) => continue,
            Err(_) => {
                h.counters.lock_errors.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
        };
        h.store.lock().unwrap().open(k, g.fencing_token());
        for _ in 0..rng.range(1, 6) {
            if g.is_lost() {
                break;
            }
            h.store.lock().unwrap().write(k);
            std::thread::sleep(h.pause(&mut rng));
        }
        h.closing(k, g.is_lost());
        h.unlocked(k, g.unlock());
    }
    let _ = rw.shutdown(Duration::from_secs(10));
}

/// Holder `k` as a future driven on this thread (the test kit's
/// `block_on`; its pauses are the wheel's own `sleep`), until told to stop.
#[cfg(feature = "async")]
pub fn async_lock_holder(k: u64, rw: Redwheel, h: Holders) {
    let lock = rw.lock(LOCK).watchdog_lease(LEASE);
    let mut rng = h.rng(k);
    let timer = redwheel::timer::HashedWheelTimer::builder()
        .build()
        .expect("a timer with the default settings");
    redwheel_testkit::block_on(async {
        while !h.stop.load(Ordering::SeqCst) {
            let g = match lock.try_lock_async(Duration::from_millis(500)).await {
                Ok(Some(g)) => g,
                Ok(None) => continue,
                Err(_) => {
                    h.counters.lock_errors.fetch_add(1, Ordering::Relaxed);
                    timer
                        .sleep(Duration::from_millis(20))
                        .await
                        .expect("the wheel runs");
                    continue;
                }
            };
            h.store.lock().unwrap().open(k, g.fencing_token());
            for _ in 0..rng.range(1, 6) {
                if g.is_lost() {
                    break;
                }
                h.store.lock().unwrap().write(k);
                timer
                    .sleep(h.pause(&mut rng))
                    .await
                    .expect("the wheel runs");
            }
            h.closing(k, g.is_lost());
            h.unlocked(k, g.unlock_async().await);
        }
    });
    let _ = rw.shutdown(Duration::from_secs(10));
}
