//! What every lock of one `Redwheel` shares ([`LockCtx`]): the owner id,
//! the counters behind `LockStats`, and the watcher thread, which runs
//! `on_lost` callbacks and checks leases that may have run out (never on
//! the wheel or driver thread).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use crossbeam_channel::Sender;

use super::lease::now_ns;
use super::lost::LeaseLost;
use crate::runtime::random_u64;
use crate::telemetry::LockMetrics;

/// This thread's number, for owner ids: small, never reused in a process.
pub(crate) fn thread_seq() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local! {
        static SEQ: u64 = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    SEQ.with(|s| *s)
}

/// A callback run when a hold is lost.
pub(crate) type OnLost = Arc<dyn Fn(&LeaseLost) + Send + Sync>;

/// Counters of what the locks of one `Redwheel` did.
#[derive(Default)]
pub(crate) struct Counters {
    pub acquire_attempts: AtomicU64,
    pub acquired: AtomicU64,
    pub renewal_rounds: AtomicU64,
    pub renewals: AtomicU64,
    pub lost: AtomicU64,
    pub max_renewal_gap_ns: AtomicU64,
    pub waiting: AtomicUsize,
}

/// What the watcher thread checks when a lease may have run out: a
/// renewal group (`hold.rs`), which marks its expired holds lost.
pub(crate) trait LeaseCheck: Send + Sync {
    /// Marks lost every hold whose lease may have run out by `now`
    /// (`now_ns`); returns when to look again, or `None`.
    fn expire_check(&self, now: u64) -> Option<u64>;
}

/// A callback on its way to the watcher thread.
type Callback = Box<dyn FnOnce() + Send>;

/// What the watcher thread is asked to do.
enum Watch {
    /// Run an `on_lost` callback.
    Run(Callback),
    /// At this instant (`now_ns`), mark the group's holds whose lease may
    /// have run out lost.
    Group(u64, Weak<dyn LeaseCheck>),
}

/// What every lock of one `Redwheel` shares.
pub(crate) struct LockCtx {
    /// `"<16 hex digits>:"`, random per `Redwheel`.
    pub owner_prefix: String,
    pub counters: Counters,
    /// The same events for the `metrics` feature (no-ops without it).
    pub metrics: LockMetrics,
    /// The watcher thread (started on first use): it marks holds lost when
    /// their lease may have run out, whatever the driver thread is doing
    /// (a round hung on a dead connection for up to the command timeout),
    /// and runs `on_lost` callbacks, never on the wheel or driver thread.
    watch_tx: OnceLock<Option<Sender<Watch>>>,
}

impl LockCtx {
    pub(crate) fn new() -> LockCtx {
        let id = random_u64();
        LockCtx {
            owner_prefix: format!("{id:016x}:"),
            counters: Counters::default(),
            metrics: LockMetrics::new(),
            watch_tx: OnceLock::new(),
        }
    }

    /// The owner id of the calling thread.
    pub(crate) fn owner(&self) -> String {
        format!("{}{}", self.owner_prefix, thread_seq())
    }

    fn send(&self, msg: Watch) {
        let tx = self.watch_tx.get_or_init(|| {
            let (tx, rx) = crossbeam_channel::unbounded::<Watch>();
            let spawned = std::thread::Builder::new()
                .name("redwheel-lock-watch".to_owned())
                .spawn(move || watch(&rx));
            match spawned {
                Ok(_) => Some(tx),
                Err(e) => {
                    tracing::error!(target: "redwheel::lock", error = %e, "could not start the lock watcher thread; on_lost callbacks will not run");
                    None
                }
            }
        });
        if let Some(tx) = tx {
            let _ = tx.send(msg);
        }
    }

    /// Runs `f` on the watcher thread.
    pub(super) fn dispatch(&self, f: Callback) {
        self.send(Watch::Run(f));
    }

    /// Checks `group`'s leases at `at` (`now_ns`).
    pub(crate) fn watch_group(&self, at: u64, group: Weak<dyn LeaseCheck>) {
        self.send(Watch::Group(at, group));
    }

    pub(crate) fn note_renewal_gap(&self, gap_ns: u64) {
        self.counters
            .max_renewal_gap_ns
            .fetch_max(gap_ns, Ordering::Relaxed);
    }
}

/// Runs an `on_lost` callback, catching a panic.
fn run_callback(f: Callback) {
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).is_err() {
        tracing::error!(target: "redwheel::lock", "an on_lost callback panicked");
    }
}

/// The watcher thread: runs callbacks, and checks watchdog leases when
/// they may have run out (an explicit lease is checked by `is_lost` and
/// the unlock). Ends when every sender is gone (the `Redwheel` is).
fn watch(rx: &crossbeam_channel::Receiver<Watch>) {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    let mut due: BinaryHeap<Reverse<(u64, u64)>> = BinaryHeap::new();
    let mut targets: HashMap<u64, Weak<dyn LeaseCheck>> = HashMap::new();
    let mut next_id = 0u64;
    loop {
        let msg = match due.peek() {
            None => match rx.recv() {
                Ok(m) => Some(m),
                Err(_) => return,
            },
            Some(Reverse((at, _))) => {
                let wait = Duration::from_nanos(at.saturating_sub(now_ns()));
                match rx.recv_timeout(wait) {
                    Ok(m) => Some(m),
                    Err(crossbeam_channel::RecvTimeoutError::Timeout) => None,
                    Err(crossbeam_channel::RecvTimeoutError::Disconnected) => return,
                }
            }
        };
        match msg {
            Some(Watch::Run(f)) => run_callback(f),
            Some(Watch::Group(at, g)) => {
                next_id += 1;
                targets.insert(next_id, g);
                due.push(Reverse((at, next_id)));
            }
            None => {}
        }
        let now = now_ns();
        while let Some(&Reverse((at, id))) = due.peek() {
            if at > now {
                break;
            }
            due.pop();
            if let Some(g) = targets.remove(&id)
                && let Some(group) = g.upgrade()
                && let Some(next) = group.expire_check(now)
            {
                next_id += 1;
                targets.insert(next_id, g);
                due.push(Reverse((next, next_id)));
            }
        }
    }
}
