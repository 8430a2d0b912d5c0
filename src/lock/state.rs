//! Per-lock state shared by the handles of one lock name, holds, waiters,
//! and the process-wide lock context (owner id, counters, the thread that
//! runs `on_lost` callbacks).
//!
//! # Ground rules
//!
//! * A [`Hold`] is one acquisition (with its re-entries) by one owner (a
//!   `Redwheel` instance and a thread). Its hold counts are changed by the
//!   owning thread only (guards are `!Send`); its `state` moves by
//!   compare-and-swap, so the driver thread (a renewal that finds the lock
//!   gone) and the owner (an unlock) never both act on it.
//! * `state` only moves forward: `ACQUIRING → HELD → RELEASED | LOST`, and
//!   `RELEASED → LOST` when an unlock finds the lock already gone. A lost
//!   hold stays lost: `is_lost` never flips back.
//! * Membership of a renewal group (`member_index`, `member_epoch`) changes
//!   under that group's member mutex only.
//! * No mutex here is held across Redis I/O.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, OnceLock, Weak};
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;
use parking_lot::{Condvar, Mutex};

use super::renewal::RenewalGroup;
use super::{LeaseLost, LostCause};
use crate::error::Error;
use crate::runtime::{MAX_TAG_NAME_LEN, random_u64, validate_tag_name};
use crate::telemetry::LockMetrics;

/// Longest lock name, in bytes.
pub const MAX_NAME_LEN: usize = MAX_TAG_NAME_LEN;

/// Checks a lock name: non-empty, at most [`MAX_NAME_LEN`] bytes, no `{`
/// or `}` (they would break the `{hash tag}`), no control characters.
pub(crate) fn validate_name(name: &str) -> Result<(), Error> {
    validate_tag_name("lock", name)
}

/// The Redis keys of lock `L`; all share the hash tag `{L}`.
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    /// `redwheel:lock:{L}`: HASH owner → count, `token` → fencing token.
    pub lock: String,
    /// `redwheel:lock:{L}:fence`: the last token handed out.
    pub fence: String,
    /// `redwheel:lock:{L}:unlock`: channel, the released token.
    pub channel: String,
}

impl Keys {
    pub(crate) fn new(name: &str) -> Keys {
        let lock = format!("redwheel:lock:{{{name}}}");
        Keys {
            fence: format!("{lock}:fence"),
            channel: format!("{lock}:unlock"),
            lock,
        }
    }
}

/// This thread's number, for owner ids: small, never reused in a process.
pub(crate) fn thread_seq() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local! {
        static SEQ: u64 = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    SEQ.with(|s| *s)
}

/// Nanoseconds on a process-wide monotonic clock (for lease deadlines).
pub(crate) fn now_ns() -> u64 {
    static BASE: LazyLock<Instant> = LazyLock::new(Instant::now);
    BASE.elapsed().as_nanos() as u64
}

/// Nanoseconds in `d`, saturating.
pub(crate) fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
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

/// A callback on its way to the watcher thread.
type Callback = Box<dyn FnOnce() + Send>;

/// What the watcher thread is asked to do.
enum Watch {
    /// Run an `on_lost` callback.
    Run(Callback),
    /// At this instant (`now_ns`), mark the group's holds whose lease may
    /// have run out lost.
    Group(u64, Weak<RenewalGroup>),
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
    fn dispatch(&self, f: Callback) {
        self.send(Watch::Run(f));
    }

    /// Checks `group`'s leases at `at` (`now_ns`).
    pub(crate) fn watch_group(&self, at: u64, group: Weak<RenewalGroup>) {
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
    let mut targets: HashMap<u64, Weak<RenewalGroup>> = HashMap::new();
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

pub(crate) const ACQUIRING: u8 = 0;
pub(crate) const HELD: u8 = 1;
pub(crate) const RELEASED: u8 = 2;
pub(crate) const LOST: u8 = 3;

/// One acquisition of a lock by one owner, with its re-entries.
pub(crate) struct Hold {
    pub name: Arc<str>,
    /// The lock's hash key, the route of its commands.
    pub route: Arc<str>,
    /// Its cluster slot.
    pub slot: u16,
    pub owner: String,
    /// Its fencing token (set once, when granted).
    pub token: AtomicU64,
    pub state: AtomicU8,
    /// Guards alive (the count in Redis, as this owner wants it).
    pub count: AtomicU32,
    /// Of those, guards that asked for the watchdog.
    pub watchdog: AtomicU32,
    /// Until when (`now_ns`) the lease surely lasts: the send instant of
    /// the last confirmed acquire or renewal, plus its lease.
    pub valid_until: AtomicU64,
    /// Send instant of the last confirmed acquire or renewal.
    pub last_renewed: AtomicU64,
    /// Its renewal group, once it joined one (at most one in its life).
    pub group: OnceLock<Weak<RenewalGroup>>,
    /// Its index in the group's members, `usize::MAX` when not a member.
    pub member_index: AtomicUsize,
    /// Changes at every join and leave: a renewal reply for an earlier
    /// membership is ignored.
    pub member_epoch: AtomicU64,
    /// The renewal command, packed on first use.
    pub renew_packed: OnceLock<Vec<u8>>,
    pub on_lost: Option<OnLost>,
    pub ctx: Arc<LockCtx>,
}

impl Hold {
    pub(crate) fn new(
        state: &LockState,
        owner: String,
        on_lost: Option<OnLost>,
        ctx: Arc<LockCtx>,
    ) -> Hold {
        Hold {
            name: Arc::clone(&state.name),
            route: Arc::clone(&state.route),
            slot: state.slot,
            owner,
            token: AtomicU64::new(0),
            state: AtomicU8::new(ACQUIRING),
            count: AtomicU32::new(0),
            watchdog: AtomicU32::new(0),
            valid_until: AtomicU64::new(0),
            last_renewed: AtomicU64::new(0),
            group: OnceLock::new(),
            member_index: AtomicUsize::new(usize::MAX),
            member_epoch: AtomicU64::new(0),
            renew_packed: OnceLock::new(),
            on_lost,
            ctx,
        }
    }

    pub(crate) fn state(&self) -> u8 {
        self.state.load(Ordering::Acquire)
    }

    pub(crate) fn token(&self) -> u64 {
        self.token.load(Ordering::Acquire)
    }

    /// The lease is confirmed until `sent + lease`: moves the deadline
    /// forward, never back.
    pub(crate) fn confirmed(&self, sent_ns: u64, lease: Duration) {
        self.valid_until
            .fetch_max(sent_ns.saturating_add(ns(lease)), Ordering::AcqRel);
    }

    /// True once the lease may have run out with no renewal confirmed.
    pub(crate) fn expired(&self, now: u64) -> bool {
        now > self.valid_until.load(Ordering::Acquire)
    }

    /// True if the hold is lost, or its lease may have lapsed (then it is
    /// marked lost now).
    pub(crate) fn check_lost(&self) -> bool {
        match self.state() {
            LOST => true,
            HELD if self.expired(now_ns()) => {
                self.lose(LostCause::Expired);
                true
            }
            _ => false,
        }
    }

    /// Marks a held hold lost (once): leaves its renewal group, logs, and
    /// hands `on_lost` to its thread. False if it was not held.
    pub(crate) fn lose(&self, cause: LostCause) -> bool {
        if self
            .state
            .compare_exchange(HELD, LOST, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return false;
        }
        self.after_lost(cause);
        true
    }

    /// An unlock found the hold gone: lost, even if it was being released.
    pub(crate) fn lose_at_unlock(&self) {
        if self.state.swap(LOST, Ordering::AcqRel) != LOST {
            self.after_lost(LostCause::Gone);
        }
    }

    fn after_lost(&self, cause: LostCause) {
        if let Some(group) = self.group.get().and_then(Weak::upgrade) {
            group.leave(self);
        }
        self.ctx.counters.lost.fetch_add(1, Ordering::Relaxed);
        let metrics = &self.ctx.metrics;
        match cause {
            LostCause::Gone => &metrics.lost_gone,
            LostCause::Expired => &metrics.lost_expired,
            LostCause::ForceUnlocked => &metrics.lost_force_unlocked,
        }
        .add(1);
        let token = self.token();
        tracing::error!(
            target: "redwheel::lock",
            lock = %self.name,
            token,
            cause = cause.as_str(),
            "lock lease lost: stop working under it; its fencing token is stale"
        );
        if let Some(f) = &self.on_lost {
            let f = Arc::clone(f);
            let lost = LeaseLost {
                name: self.name.to_string(),
                fencing_token: token,
                cause,
            };
            self.ctx.dispatch(Box::new(move || f(&lost)));
        }
    }
}

/// Threads of this process waiting for one lock, woken one per unlock.
///
/// A waiter registers ([`enter`](Waiters::enter)) before its first
/// attempt, so an unlock that lands while an attempt is on the wire is
/// not missed: it leaves a permit, and the next wait returns at once.
pub(crate) struct Waiters {
    st: Mutex<WaitState>,
    cv: Condvar,
}

#[derive(Default)]
struct WaitState {
    waiting: usize,
    permits: usize,
    /// Tokens of releases already counted: a release of this process is
    /// seen twice (its own reply and the channel), each woken for once.
    seen: VecDeque<u64>,
}

const SEEN: usize = 64;

impl Waiters {
    fn new() -> Waiters {
        Waiters {
            st: Mutex::new(WaitState::default()),
            cv: Condvar::new(),
        }
    }

    pub(crate) fn enter(&self, counters: &Counters) {
        self.st.lock().waiting += 1;
        counters.waiting.fetch_add(1, Ordering::Relaxed);
    }

    /// Leaves; `acquired` means whatever woke waiters so far is used up.
    pub(crate) fn leave(&self, acquired: bool, counters: &Counters) {
        counters.waiting.fetch_sub(1, Ordering::Relaxed);
        let mut st = self.st.lock();
        st.waiting -= 1;
        if acquired || st.waiting == 0 {
            st.permits = 0;
        } else {
            st.permits = st.permits.min(st.waiting);
            if st.permits > 0 {
                // It may have been woken for a permit it did not use.
                self.cv.notify_one();
            }
        }
    }

    /// Waits for a permit until `until`; true if it got one.
    pub(crate) fn wait(&self, until: Instant) -> bool {
        let mut st = self.st.lock();
        loop {
            if st.permits > 0 {
                st.permits -= 1;
                return true;
            }
            if self.cv.wait_until(&mut st, until).timed_out() {
                if st.permits > 0 {
                    st.permits -= 1;
                    return true;
                }
                return false;
            }
        }
    }

    /// A release of the hold `token` (0: unknown): wakes one waiter, once
    /// per token.
    pub(crate) fn released(&self, token: u64) {
        let mut st = self.st.lock();
        if token != 0 {
            if let Some(i) = st.seen.iter().position(|&t| t == token) {
                st.seen.remove(i);
                return;
            }
            if st.seen.len() == SEEN {
                st.seen.pop_front();
            }
            st.seen.push_back(token);
        }
        if st.waiting > st.permits {
            st.permits += 1;
            self.cv.notify_one();
        }
    }

    /// Every waiter tries again (a subscription just took effect: any
    /// unlock before it was missed).
    pub(crate) fn wake_all(&self) {
        let mut st = self.st.lock();
        st.permits = st.waiting;
        self.cv.notify_all();
    }
}

/// One lock name, as every handle of it in one `Redwheel` sees it.
pub(crate) struct LockState {
    pub name: Arc<str>,
    pub keys: Keys,
    pub route: Arc<str>,
    /// The cluster slot of its keys.
    pub slot: u16,
    /// The current hold of each thread of this process (by thread number).
    pub holds: Mutex<HashMap<u64, Arc<Hold>>>,
    pub waiters: Waiters,
    /// The unlock channel is subscribed (or being subscribed).
    pub subscribed: AtomicBool,
}

impl LockState {
    pub(crate) fn new(name: &str) -> LockState {
        let keys = Keys::new(name);
        LockState {
            name: Arc::from(name),
            route: Arc::from(keys.lock.as_str()),
            slot: crate::runtime::slot(keys.lock.as_bytes()),
            keys,
            holds: Mutex::new(HashMap::new()),
            waiters: Waiters::new(),
            subscribed: AtomicBool::new(false),
        }
    }

    /// The calling thread's current hold, if it has one that is held.
    pub(crate) fn current_hold(&self, tid: u64) -> Option<Arc<Hold>> {
        let hold = self.holds.lock().get(&tid).cloned()?;
        (!hold.check_lost() && hold.state() == HELD).then_some(hold)
    }

    /// Forgets `hold` as `tid`'s current hold, if it still is.
    pub(crate) fn forget(&self, tid: u64, hold: &Arc<Hold>) {
        let mut holds = self.holds.lock();
        if holds.get(&tid).is_some_and(|h| Arc::ptr_eq(h, hold)) {
            holds.remove(&tid);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    #[test]
    fn names_that_would_break_the_hash_tag_are_rejected() {
        assert!(validate_name("inventory:42").is_ok());
        for bad in ["", "a{b", "a}b", "a\nb"] {
            let e = validate_name(bad).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidName, "{bad:?}");
            assert!(e.is_invalid_input());
        }
        assert!(validate_name(&"x".repeat(MAX_NAME_LEN + 1)).is_err());
        assert!(validate_name(&"x".repeat(MAX_NAME_LEN)).is_ok());
    }

    #[test]
    fn keys_share_the_lock_hash_tag() {
        let k = Keys::new("inventory:42");
        assert_eq!(k.lock, "redwheel:lock:{inventory:42}");
        assert_eq!(k.fence, "redwheel:lock:{inventory:42}:fence");
        assert_eq!(k.channel, "redwheel:lock:{inventory:42}:unlock");
    }

    #[test]
    fn a_release_seen_twice_wakes_one_waiter_once() {
        let c = Counters::default();
        let w = Waiters::new();
        w.enter(&c);
        w.enter(&c);
        w.released(7); // our own reply
        w.released(7); // the same release on the channel
        let now = Instant::now();
        assert!(w.wait(now));
        assert!(!w.wait(now), "one permit per release");
        w.released(8);
        assert!(w.wait(now));
        w.leave(false, &c);
        w.leave(true, &c);
        assert_eq!(c.waiting.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_permit_left_by_a_leaving_waiter_goes_to_another() {
        let c = Counters::default();
        let w = Waiters::new();
        w.enter(&c);
        w.enter(&c);
        w.released(1);
        w.leave(false, &c); // leaves without using it
        assert!(w.wait(Instant::now()));
        w.leave(true, &c);
    }

    #[test]
    fn nobody_waiting_keeps_no_permit() {
        let c = Counters::default();
        let w = Waiters::new();
        w.released(3);
        w.enter(&c);
        assert!(!w.wait(Instant::now()));
        w.wake_all();
        assert!(w.wait(Instant::now()));
        w.leave(false, &c);
    }
}
