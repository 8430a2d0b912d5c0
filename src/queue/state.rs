//! Per-queue state shared by handles, the transfer thread, the subscriber
//! thread and wheel timeouts; queue names, keys and message ids.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;
use parking_lot::Mutex;

use crate::error::QueueError;
use crate::timer::{HashedWheelTimer, Timeout};

/// Longest queue name, in bytes.
pub const MAX_NAME_LEN: usize = 200;

/// Longest message id `remove` accepts, in bytes (redwheel's own are
/// about 14).
pub const MAX_ID_LEN: usize = 128;

/// Checks a queue name: non-empty, at most [`MAX_NAME_LEN`] bytes, no `{`
/// or `}` (they would break the `{hash tag}`), no control characters.
pub(crate) fn validate_name(name: &str) -> Result<(), QueueError> {
    let reason = if name.is_empty() {
        "must not be empty"
    } else if name.len() > MAX_NAME_LEN {
        "longer than 200 bytes"
    } else if name.contains(['{', '}']) {
        "must not contain `{` or `}` (they delimit the Redis hash tag)"
    } else if name.chars().any(char::is_control) {
        "must not contain control characters"
    } else {
        return Ok(());
    };
    Err(QueueError::InvalidName {
        name: name.to_owned(),
        reason,
    })
}

/// The Redis keys of one queue; all share the hash tag `{N}`.
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    pub delayed: String,
    pub msg: String,
    pub ready: String,
    pub dead: String,
    pub wake: String,
}

impl Keys {
    pub(crate) fn new(name: &str) -> Keys {
        let k = |suffix: &str| format!("redwheel:{{{name}}}:{suffix}");
        Keys {
            delayed: k("delayed"),
            msg: k("msg"),
            ready: k("ready"),
            dead: k("dead"),
            wake: k("wake"),
        }
    }
}

/// What the transfer thread is asked to do.
pub(crate) enum Cmd {
    /// Run this queue's transfer script now.
    Transfer(Arc<QueueState>),
    /// Look at the shutdown flag and the queue registry again.
    Wake,
}

/// The wheel timeout that will next run a queue's transfer.
struct Scheduled {
    at: Instant,
    timeout: Timeout,
}

/// One open queue, as the background threads see it.
pub(crate) struct QueueState {
    pub name: String,
    pub keys: Keys,
    pub batch: usize,
    pub guard: Duration,
    /// A `Cmd::Transfer` for this queue is in the channel (coalescing).
    requested: AtomicBool,
    /// The pending wheel timeout, replaced only by an earlier one.
    scheduled: Mutex<Option<Scheduled>>,
    /// When the guard sweep runs next (touched by the transfer thread).
    pub next_sweep: Mutex<Instant>,
    /// Transfers run, messages moved (for tests and metrics).
    pub runs: AtomicU64,
    pub moved: AtomicU64,
}

impl QueueState {
    pub(crate) fn new(name: &str, batch: usize, guard: Duration) -> QueueState {
        QueueState {
            name: name.to_owned(),
            keys: Keys::new(name),
            batch,
            guard,
            requested: AtomicBool::new(false),
            scheduled: Mutex::new(None),
            next_sweep: Mutex::new(Instant::now() + guard),
            runs: AtomicU64::new(0),
            moved: AtomicU64::new(0),
        }
    }

    /// Asks the transfer thread to run this queue's transfer; coalesced:
    /// at most one request is in the channel at a time. Cheap enough for
    /// the wheel thread (an atomic swap and a channel send).
    pub(crate) fn request(self: &Arc<Self>, tx: &Sender<Cmd>) {
        if !self.requested.swap(true, Ordering::AcqRel) {
            let _ = tx.send(Cmd::Transfer(Arc::clone(self)));
        }
    }

    /// Called by the transfer thread as it starts a run: requests made from
    /// now on queue another run.
    pub(crate) fn begin_run(&self) {
        self.requested.store(false, Ordering::Release);
    }

    /// Makes sure a transfer runs at `at` (local monotonic time). An
    /// already pending timeout at or before `at` is kept (an earlier head
    /// is never pushed back by a later one: DQ-W05); a later one is
    /// cancelled and replaced.
    pub(crate) fn schedule(
        self: &Arc<Self>,
        at: Instant,
        timer: &HashedWheelTimer,
        tx: &Sender<Cmd>,
    ) {
        let now = Instant::now();
        let mut slot = self.scheduled.lock();
        if let Some(s) = slot.as_ref() {
            let live = !s.timeout.is_expired() && !s.timeout.is_cancelled();
            if live && s.at <= at {
                return;
            }
            s.timeout.cancel();
        }
        *slot = None;
        if at <= now {
            drop(slot);
            self.request(tx);
            return;
        }
        let me = Arc::clone(self);
        let tx = tx.clone();
        match timer.new_timeout(at - now, move |_: &Timeout| me.request(&tx)) {
            Ok(timeout) => *slot = Some(Scheduled { at, timeout }),
            Err(e) => tracing::warn!(
                target: "redwheel::queue",
                queue = %self.name,
                error = %e,
                "could not schedule a transfer on the wheel; the guard sweep will run it"
            ),
        }
    }

    /// Cancels the pending timeout (shutdown).
    pub(crate) fn unschedule(&self) {
        if let Some(s) = self.scheduled.lock().take() {
            s.timeout.cancel();
        }
    }

    /// The instant of the pending wheel timeout, if any (tests, debugging).
    pub(crate) fn scheduled_at(&self) -> Option<Instant> {
        self.scheduled
            .lock()
            .as_ref()
            .filter(|s| !s.timeout.is_expired() && !s.timeout.is_cancelled())
            .map(|s| s.at)
    }
}

/// Message ids: a per-process random prefix of 11 base-62 characters (64
/// random bits) followed by a per-process counter in base 62. Unique across
/// processes with overwhelming probability, and short: they are stored in
/// Redis three times per message.
pub(crate) fn new_message_id() -> String {
    use std::sync::OnceLock;
    static PREFIX: OnceLock<String> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let prefix = PREFIX.get_or_init(|| {
        let seed = getrandom::u64().unwrap_or_else(|_| {
            // No OS randomness: fall back on time and pid (still distinct
            // between processes started at different instants).
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0);
            t ^ (u64::from(std::process::id()) << 32)
        });
        let mut s = String::with_capacity(11);
        let mut x = seed;
        for _ in 0..11 {
            s.push(BASE62[(x % 62) as usize] as char);
            x /= 62;
        }
        s
    });
    let mut n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut id = String::with_capacity(prefix.len() + 11);
    id.push_str(prefix);
    let mut digits = [0u8; 11];
    let mut len = 0;
    loop {
        digits[len] = BASE62[(n % 62) as usize];
        len += 1;
        n /= 62;
        if n == 0 {
            break;
        }
    }
    for &d in digits[..len].iter().rev() {
        id.push(d as char);
    }
    id
}

const BASE62: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_would_break_the_hash_tag_are_rejected() {
        assert!(validate_name("orders").is_ok());
        assert!(validate_name("").is_err());
        assert!(validate_name("a{b").is_err());
        assert!(validate_name("a}b").is_err());
        assert!(validate_name("a\nb").is_err());
        assert!(validate_name(&"x".repeat(MAX_NAME_LEN + 1)).is_err());
        assert!(validate_name(&"x".repeat(MAX_NAME_LEN)).is_ok());
    }

    #[test]
    fn keys_share_the_queue_hash_tag() {
        let k = Keys::new("orders");
        assert_eq!(k.delayed, "redwheel:{orders}:delayed");
        assert_eq!(k.msg, "redwheel:{orders}:msg");
        assert_eq!(k.ready, "redwheel:{orders}:ready");
        assert_eq!(k.wake, "redwheel:{orders}:wake");
    }

    #[test]
    fn a_pending_wakeup_is_replaced_only_by_an_earlier_one() {
        let timer = HashedWheelTimer::builder()
            .tick_duration(Duration::from_millis(1))
            .build()
            .unwrap();
        let (tx, rx) = crossbeam_channel::unbounded();
        let q = Arc::new(QueueState::new("w05", 100, Duration::from_secs(1)));
        let now = Instant::now();
        let early = now + Duration::from_secs(10);
        q.schedule(early, &timer, &tx);
        assert_eq!(q.scheduled_at(), Some(early));
        // A later head (e.g. a stale transfer reply) never pushes it back.
        q.schedule(now + Duration::from_secs(20), &timer, &tx);
        assert_eq!(q.scheduled_at(), Some(early));
        // An earlier head replaces it, and the replaced timeout is cancelled.
        let earlier = now + Duration::from_millis(30);
        q.schedule(earlier, &timer, &tx);
        assert_eq!(q.scheduled_at(), Some(earlier));
        // It fires once, as one coalesced transfer request.
        match rx.recv_timeout(Duration::from_secs(30)).unwrap() {
            Cmd::Transfer(s) => assert_eq!(s.name, "w05"),
            Cmd::Wake => panic!("unexpected wake"),
        }
        assert_eq!(
            timer.stop().unwrap().len(),
            0,
            "the replaced timeout was cancelled"
        );
        assert!(rx.try_recv().is_err());
    }

    #[test]
    fn transfer_requests_are_coalesced() {
        let (tx, rx) = crossbeam_channel::unbounded();
        let q = Arc::new(QueueState::new("c", 100, Duration::from_secs(1)));
        q.request(&tx);
        q.request(&tx);
        assert_eq!(rx.len(), 1);
        let _ = rx.try_recv();
        q.begin_run();
        q.request(&tx);
        assert_eq!(rx.len(), 1, "a request during a run queues one more run");
    }

    #[test]
    fn message_ids_are_short_and_distinct() {
        let ids: std::collections::HashSet<String> =
            (0..10_000).map(|_| new_message_id()).collect();
        assert_eq!(ids.len(), 10_000);
        assert!(ids.iter().all(|id| id.len() <= 22));
    }
}
