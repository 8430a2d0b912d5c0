//! Redis locks with a watchdog, fencing tokens and a lease-lost signal.
//!
//! ```no_run
//! use std::time::Duration;
//! use redwheel::Redwheel;
//!
//! let rw = Redwheel::connect("redis://127.0.0.1:6379")?;
//! let lock = rw.lock("inventory:42");            // lease 30 s, renewed every 10 s while held
//! let guard = lock.lock()?;                      // blocks until acquired
//! let token = guard.fencing_token();             // hand it to the store you write to
//! // … the critical section; check guard.is_lost() before each write …
//! guard.unlock()?;                               // or drop it; Err if the lease was lost
//!
//! if let Some(g) = lock.try_lock(Duration::from_millis(200))? {
//!     assert!(!g.is_lost());
//! }
//! # Ok::<(), redwheel::Error>(())
//! ```
//!
//! # What a lock is
//!
//! A lock `L` is a Redis hash `redwheel:lock:{L}` holding its owner (a
//! random id of the [`Redwheel`] instance and the thread number) with its
//! hold count, and the current fencing token; its TTL is the lease. It is
//! **reentrant per (instance, thread)**: a thread that holds it may lock it
//! again, and it is released when every guard is gone. A [`LockGuard`] is
//! therefore not `Send`: it belongs to the thread that locked.
//!
//! | key | type | holds |
//! | --- | --- | --- |
//! | `redwheel:lock:{L}` | HASH | owner → hold count, `token` → fencing token; TTL = lease |
//! | `redwheel:lock:{L}:fence` | STRING | the last fencing token handed out (no TTL) |
//! | `redwheel:lock:{L}:unlock` | channel | the token of each release |
//!
//! All three share the hash tag `{L}`: every script touches one slot.
//!
//! # The watchdog
//!
//! [`Lock::lock`] and [`Lock::try_lock`] take the lock for the watchdog
//! lease (30 s by default, [`Lock::watchdog_lease`]) and renew it every
//! lease / 3 while the guard lives. Renewals are work of the runtime's
//! driver: every lock with the same lease is renewed in the same round, so
//! 10,000 held locks cost one pipelined round trip per period. A lock joins
//! its renewal group before the acquire script is sent and leaves it before
//! the release script is sent, so a renewal neither misses a fresh lock nor
//! outlives an unlock; the renew script checks owner and token, so it never
//! extends a lock that changed hands. A renewal that fails (Redis down, an
//! error reply) is retried at once with backoff for as long as the lease
//! may last. The wheel thread only marks work due, and the driver runs
//! due work on its own if the wheel is held up, so neither a slow task nor
//! a busy application delays renewals.
//!
//! With [`Lock::lock_with_lease`] / [`Lock::try_lock_with_lease`] the lease
//! is explicit and nothing renews it: the lock lapses at its end.
//!
//! # Losing a lease
//!
//! A hold is **lost** when a renewal (or the unlock) finds the lock gone or
//! another acquisition's, or when no renewal was confirmed within one lease
//! of the last one's sending (Redis unreachable for that long: the lock may
//! be someone else's now, whether or not Redis can say so yet), or when
//! [`Lock::force_unlock`] released it. Then [`LockGuard::is_lost`] turns
//! true (and stays true), a `tracing` error is logged, the lock's
//! [`on_lost`](Lock::on_lost) callback runs on a thread of its own (never
//! the wheel or driver thread), renewal stops, and
//! [`LockGuard::unlock`] returns [`ErrorKind::LockLost`]. An explicit-lease
//! guard reads as lost once its lease may have run out.
//!
//! # Fencing tokens, failover and what a lock cannot promise
//!
//! Every acquisition (not a re-entry) gets a token strictly greater than
//! every earlier one for the same name, from the script that grants it:
//! `max(last + 1, server TIME in µs)`. The counter key never expires, and
//! the time term keeps tokens increasing even when the counter is lost (a
//! Redis restart without persistence, a failover to a replica that missed
//! the last writes), as long as the server clocks do not step back.
//!
//! A lease is a promise about time, and it can break: a holder paused
//! (GC, a stopped VM, swap) for longer than the lease wakes believing it
//! holds a lock that has lapsed; a Redis restart without persistence, or a
//! failover to a replica that had not yet received the acquisition
//! (replication is asynchronous), lets a second owner acquire while the
//! first still believes it holds. No client-side scheme closes these gaps
//! (the Redlock debate and Redisson's documentation agree on that); what
//! does is the **store** checking the fencing token: write the token with
//! each change, and reject a change whose token is lower than the last one
//! seen. `is_lost` and `on_lost` tell a holder as early as they can; they
//! cannot tell it before the lease has lapsed if it was not running.
//!
//! # Waiting
//!
//! A waiting [`Lock::lock`] is woken by the unlock's notification on the
//! runtime's subscriber connection, one waiter per process per release (a
//! release by this process also wakes one of its own waiters directly), not
//! by polling. Each wait is also bounded by the holder's remaining lease,
//! so a lost notification costs at most that. The first wait on a lock name
//! in a process subscribes its unlock channel (the subscriber takes a new
//! channel up within about 100 ms); every waiter tries again once the
//! subscription is in effect, so an unlock in between is not missed. The
//! lock is not fair: a woken waiter races with newcomers.

pub mod inspect;
mod renewal;
pub(crate) mod state;

use std::collections::HashMap;
use std::fmt;
use std::marker::PhantomData;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

pub use self::state::MAX_NAME_LEN;

use self::renewal::{RenewalGroup, RenewalJob, lease_ms};
use self::state::{
    ACQUIRING, HELD, Hold, LOST, LockCtx, LockState, OnLost, RELEASED, now_ns, thread_seq,
    validate_name,
};
use crate::error::{Access, Error, ErrorKind};
use crate::runtime::{Backoff, Deadline, Redwheel, Runtime, Subscription, shut_down};
use crate::scripts;
use crate::telemetry;

/// The default watchdog lease.
pub const DEFAULT_WATCHDOG_LEASE: Duration = Duration::from_secs(30);
/// Shortest watchdog lease (renewed every 33 ms).
pub const MIN_WATCHDOG_LEASE: Duration = Duration::from_millis(100);
/// Longest lease, watchdog or explicit.
pub const MAX_LEASE: Duration = Duration::from_secs(86_400 * 365);

/// Why a hold was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LostCause {
    /// A renewal or the unlock found the lock gone or another acquisition's
    /// (it expired and may have been taken, was force-unlocked by another
    /// process, or Redis lost it in a restart or failover).
    Gone,
    /// No renewal was confirmed within one lease (Redis unreachable, or an
    /// explicit lease ran out): the lock may be someone else's by now.
    Expired,
    /// [`Lock::force_unlock`] in this process released it.
    ForceUnlocked,
}

impl LostCause {
    /// A short description, lowercase.
    pub fn as_str(self) -> &'static str {
        match self {
            LostCause::Gone => "gone or taken over",
            LostCause::Expired => "lease expired unrenewed",
            LostCause::ForceUnlocked => "force-unlocked",
        }
    }
}

impl fmt::Display for LostCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What an [`on_lost`](Lock::on_lost) callback is told.
#[derive(Debug, Clone)]
pub struct LeaseLost {
    pub(crate) name: String,
    pub(crate) fencing_token: u64,
    pub(crate) cause: LostCause,
}

impl LeaseLost {
    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The fencing token of the lost hold (now stale).
    pub fn fencing_token(&self) -> u64 {
        self.fencing_token
    }

    /// Why it was lost.
    pub fn cause(&self) -> LostCause {
        self.cause
    }
}

/// What the locks of one [`Redwheel`] did so far (diagnostics, benchmarks).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockStats {
    /// Acquire scripts sent (attempts, including re-entries and retries).
    pub acquire_attempts: u64,
    /// Acquisitions and re-entries granted.
    pub acquired: u64,
    /// Threads in `lock` / `try_lock` now (waiting, or on their attempt).
    pub waiting: usize,
    /// Holds renewed by the watchdog now.
    pub watchdog_holds: usize,
    /// Renewal rounds that got their replies (one per group per period).
    pub renewal_rounds: u64,
    /// Holds renewed (one per hold per round).
    pub renewals: u64,
    /// Holds lost.
    pub lost: u64,
    /// The longest time between the sending of two consecutive confirmed
    /// renewals (or the acquisition and the first renewal) of one hold: the
    /// lease left at a renewal was at least `lease − this`.
    pub max_renewal_gap: Duration,
}

/// The locks of one runtime: shared by every `Lock` handle made from it.
pub(crate) struct LockRegistry {
    ctx: Arc<LockCtx>,
    rt: Weak<Runtime>,
    locks: parking_lot::Mutex<LockTable>,
    channels: parking_lot::Mutex<HashMap<String, Arc<ChannelLink>>>,
    groups: parking_lot::Mutex<HashMap<u64, Arc<RenewalGroup>>>,
}

#[derive(Default)]
struct LockTable {
    by_name: HashMap<String, Weak<LockState>>,
    prune_at: usize,
}

/// A subscribed unlock channel and the lock state it wakes (replaced when a
/// lock's state is dropped and made again; the subscription stays).
struct ChannelLink {
    target: parking_lot::Mutex<Weak<LockState>>,
}

/// Name of the channel subscribed only to learn of reconnects (nothing is
/// published on it): after one, every renewal group runs at once.
const RECONNECT_PROBE: &str = "redwheel:lock:reconnect-probe";

impl LockRegistry {
    fn get(rt: &Arc<Runtime>) -> Option<Arc<LockRegistry>> {
        let (reg, created) = rt.state("redwheel locks", || LockRegistry {
            ctx: Arc::new(LockCtx::new()),
            rt: Arc::downgrade(rt),
            locks: parking_lot::Mutex::new(LockTable::default()),
            channels: parking_lot::Mutex::new(HashMap::new()),
            groups: parking_lot::Mutex::new(HashMap::new()),
        })?;
        if created {
            let weak = Arc::downgrade(&reg);
            rt.subscriber.subscribe(
                RECONNECT_PROBE,
                Subscription {
                    on_message: Box::new(|_| {}),
                    on_subscribed: Box::new(move || {
                        if let Some(reg) = weak.upgrade() {
                            reg.renew_all_now();
                        }
                    }),
                },
            );
        }
        Some(reg)
    }

    /// The shared state of lock `name`.
    fn state(&self, name: &str) -> Arc<LockState> {
        let mut t = self.locks.lock();
        if let Some(s) = t.by_name.get(name).and_then(Weak::upgrade) {
            return s;
        }
        let s = Arc::new(LockState::new(name));
        t.by_name.insert(name.to_owned(), Arc::downgrade(&s));
        if t.by_name.len() > t.prune_at {
            t.by_name.retain(|_, w| w.strong_count() > 0);
            t.prune_at = (t.by_name.len() * 2).max(1_024);
        }
        s
    }

    /// The renewal group of `lease`, registered with the driver on first
    /// use.
    fn group(&self, rt: &Runtime, lease: Duration) -> Arc<RenewalGroup> {
        let mut groups = self.groups.lock();
        let ms = lease.as_millis() as u64;
        if let Some(g) = groups.get(&ms) {
            return Arc::clone(g);
        }
        let g = Arc::new(RenewalGroup::new(lease, Arc::clone(&self.ctx)));
        rt.driver.register(
            &g.key,
            Arc::new(RenewalJob(Arc::clone(&g))),
            Deadline::After(g.period()),
            None,
        );
        groups.insert(ms, Arc::clone(&g));
        g
    }

    /// Runs every non-empty renewal group now (after a reconnect: Redis may
    /// have restarted without our locks).
    fn renew_all_now(&self) {
        let Some(rt) = self.rt.upgrade() else { return };
        let groups: Vec<Arc<RenewalGroup>> = self.groups.lock().values().cloned().collect();
        for g in groups {
            if g.len() > 0 {
                rt.driver.announce(&g.key, Deadline::Now);
            }
        }
    }

    /// Makes sure `state`'s unlock channel is subscribed.
    fn subscribe(&self, rt: &Runtime, state: &Arc<LockState>) {
        if state.subscribed.swap(true, Ordering::AcqRel) {
            return;
        }
        let mut channels = self.channels.lock();
        if let Some(link) = channels.get(&state.keys.channel) {
            // Subscribed for an earlier state of this name: messages went
            // to that one until now, so everyone tries again once.
            *link.target.lock() = Arc::downgrade(state);
            drop(channels);
            state.waiters.wake_all();
            return;
        }
        let link = Arc::new(ChannelLink {
            target: parking_lot::Mutex::new(Arc::downgrade(state)),
        });
        channels.insert(state.keys.channel.clone(), Arc::clone(&link));
        drop(channels);
        let on_message = {
            let link = Arc::clone(&link);
            move |payload: &[u8]| {
                if let Some(st) = link.target.lock().upgrade() {
                    let token = std::str::from_utf8(payload)
                        .ok()
                        .and_then(|s| s.parse::<u64>().ok())
                        .unwrap_or(0);
                    st.waiters.released(token);
                }
            }
        };
        let on_subscribed = move || {
            if let Some(st) = link.target.lock().upgrade() {
                st.waiters.wake_all();
            }
        };
        rt.subscriber.subscribe(
            &state.keys.channel,
            Subscription {
                on_message: Box::new(on_message),
                on_subscribed: Box::new(on_subscribed),
            },
        );
    }

    fn stats(&self) -> LockStats {
        let c = &self.ctx.counters;
        let watchdog_holds = self.groups.lock().values().map(|g| g.len()).sum();
        LockStats {
            acquire_attempts: c.acquire_attempts.load(Ordering::Relaxed),
            acquired: c.acquired.load(Ordering::Relaxed),
            waiting: c.waiting.load(Ordering::Relaxed),
            watchdog_holds,
            renewal_rounds: c.renewal_rounds.load(Ordering::Relaxed),
            renewals: c.renewals.load(Ordering::Relaxed),
            lost: c.lost.load(Ordering::Relaxed),
            max_renewal_gap: Duration::from_nanos(c.max_renewal_gap_ns.load(Ordering::Relaxed)),
        }
    }
}

impl Redwheel {
    /// A handle on the lock `name` (keys `redwheel:lock:{name}…`), with the
    /// default watchdog lease (30 s). Cheap; nothing is sent to Redis until
    /// it is used. A bad name (empty, over 200 bytes, holding `{`, `}` or a
    /// control character) makes every operation of the handle fail with
    /// [`ErrorKind::InvalidName`].
    pub fn lock(&self, name: &str) -> Lock {
        let valid = validate_name(name).is_ok();
        let reg = LockRegistry::get(self.runtime());
        let state = match (&reg, valid) {
            (Some(reg), true) => Some(reg.state(name)),
            _ => None,
        };
        Lock {
            rw: self.clone(),
            name: Arc::from(name),
            reg,
            state,
            lease: DEFAULT_WATCHDOG_LEASE,
            on_lost: None,
        }
    }

    /// What the locks of this `Redwheel` did so far.
    pub fn lock_stats(&self) -> LockStats {
        LockRegistry::get(self.runtime())
            .map(|r| r.stats())
            .unwrap_or_default()
    }
}

/// A handle on one Redis lock. Cheap to `Clone`, `Send + Sync`; handles of
/// the same name in one [`Redwheel`] share their holds (re-entry works
/// across them) and their waiters.
#[derive(Clone)]
pub struct Lock {
    rw: Redwheel,
    name: Arc<str>,
    reg: Option<Arc<LockRegistry>>,
    state: Option<Arc<LockState>>,
    lease: Duration,
    on_lost: Option<OnLost>,
}

impl fmt::Debug for Lock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lock")
            .field("name", &self.name)
            .field("watchdog_lease", &self.lease)
            .finish_non_exhaustive()
    }
}

/// One attempt's outcome.
enum Attempt {
    Granted(LockGuard),
    /// Held by another owner for this much longer (`None`: no TTL).
    Busy(Option<Duration>),
}

impl Lock {
    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Sets the watchdog lease (100 ms ..= 365 days, whole ms; default
    /// 30 s): a lock taken by [`lock`](Lock::lock) or
    /// [`try_lock`](Lock::try_lock) through this handle lapses this long
    /// after its holder stops renewing it, and is renewed every lease / 3.
    /// A lease out of range makes those calls fail with
    /// [`ErrorKind::InvalidOption`]. A re-entry keeps the lease of the
    /// hold's first watchdog acquisition.
    pub fn watchdog_lease(mut self, lease: Duration) -> Lock {
        self.lease = lease;
        self
    }

    /// Runs `f` once for each hold taken through this handle that is lost
    /// (see the module docs), on a thread of its own: never on the wheel or
    /// driver thread. Keep it short; a panic in it is caught and logged.
    pub fn on_lost(mut self, f: impl Fn(&LeaseLost) + Send + Sync + 'static) -> Lock {
        self.on_lost = Some(Arc::new(f));
        self
    }

    /// Takes the lock, waiting as long as it takes, with the watchdog.
    ///
    /// While Redis is unreachable it keeps trying on the reconnect
    /// backoff. Fails with [`ErrorKind::InvalidName`] /
    /// [`ErrorKind::InvalidOption`] for a bad name or lease,
    /// [`ErrorKind::Shutdown`] once the `Redwheel` is shut down, and with
    /// non-transient Redis errors (permissions, a key of the wrong type).
    pub fn lock(&self) -> Result<LockGuard, Error> {
        let lease = self.checked_watchdog_lease()?;
        self.acquire(None, lease, true)?
            .ok_or_else(|| self.error(ErrorKind::Protocol, "lock() returned no guard"))
    }

    /// Takes the lock if it can within `wait` (zero: one attempt), with the
    /// watchdog. `Ok(None)` when it could not. If Redis stayed unreachable
    /// until then, the last error is returned instead; when that error is
    /// [`ErrorKind::OutcomeUnknown`] the last attempt may have taken the
    /// lock in Redis, unrenewed: it then lapses within the lease (a later
    /// `lock` by the same thread takes it over at once).
    pub fn try_lock(&self, wait: Duration) -> Result<Option<LockGuard>, Error> {
        let lease = self.checked_watchdog_lease()?;
        self.acquire(Some(wait), lease, true)
    }

    /// As [`lock`](Lock::lock), with an explicit lease and no watchdog: the
    /// lock lapses `lease` after it was taken (1 ms ..= 365 days, whole ms)
    /// unless unlocked before.
    pub fn lock_with_lease(&self, lease: Duration) -> Result<LockGuard, Error> {
        let lease = self.checked_lease(lease, Duration::from_millis(1), "lease")?;
        self.acquire(None, lease, false)?
            .ok_or_else(|| self.error(ErrorKind::Protocol, "lock() returned no guard"))
    }

    /// As [`try_lock`](Lock::try_lock), with an explicit lease and no
    /// watchdog.
    pub fn try_lock_with_lease(
        &self,
        wait: Duration,
        lease: Duration,
    ) -> Result<Option<LockGuard>, Error> {
        let lease = self.checked_lease(lease, Duration::from_millis(1), "lease")?;
        self.acquire(Some(wait), lease, false)
    }

    /// True if anyone holds the lock now.
    pub fn is_locked(&self) -> Result<bool, Error> {
        let st = self.valid_state()?;
        let _span = telemetry::lock_op("exists", &st.name);
        let n: i64 = self.rt().run(&st.keys.lock, Access::Read, |con| {
            redis::cmd("EXISTS").arg(&st.keys.lock).query(con)
        })?;
        Ok(n == 1)
    }

    /// How many times the calling thread holds the lock (0: not at all), as
    /// Redis sees it now.
    pub fn hold_count(&self) -> Result<u32, Error> {
        let (st, reg) = (self.valid_state()?, self.registry()?);
        let owner = reg.ctx.owner();
        let _span = telemetry::lock_op("hget", &st.name);
        let n: Option<u32> = self
            .rt()
            .run(&st.keys.lock, Access::Read, |con| {
                redis::cmd("HGET").arg(&st.keys.lock).arg(&owner).query(con)
            })
            .map_err(|e| self.wrap(e, "could not read the hold count"))?;
        Ok(n.unwrap_or(0))
    }

    /// Releases the lock whoever holds it, and wakes a waiter; true if it
    /// was held. Holds of this process are marked lost at once; those of
    /// other processes when their next renewal (or unlock) finds the lock
    /// gone. An operator's tool: the holder is not asked.
    pub fn force_unlock(&self) -> Result<bool, Error> {
        let st = self.valid_state()?;
        let span = telemetry::lock_op("lock_force_release", &st.name);
        let n: i64 = self
            .rt()
            .run(&st.keys.lock, Access::Write, |con| {
                scripts::LOCK_FORCE_RELEASE
                    .key(&st.keys.lock)
                    .key(&st.keys.channel)
                    .invoke(con)
            })
            .map_err(|e| self.wrap(e, "could not force the unlock"))?;
        drop(span);
        let holds: Vec<Arc<Hold>> = st.holds.lock().values().cloned().collect();
        for h in holds {
            h.lose(LostCause::ForceUnlocked);
        }
        Ok(n == 1)
    }

    fn rt(&self) -> &Arc<Runtime> {
        self.rw.runtime()
    }

    fn error(&self, kind: ErrorKind, what: &str) -> Error {
        Error::new(kind, format!("lock {:?}: {what}", self.name))
    }

    /// `e`, with the lock's name and what was being done in front.
    fn wrap(&self, e: Error, what: &str) -> Error {
        Error::new(e.kind(), format!("lock {:?}: {what}", self.name)).with_cause(e)
    }

    fn valid_state(&self) -> Result<&Arc<LockState>, Error> {
        if self.rt().is_shut_down() {
            return Err(shut_down());
        }
        match &self.state {
            Some(s) => Ok(s),
            None => {
                validate_name(&self.name)?;
                Err(self.registry().err().unwrap_or_else(shut_down))
            }
        }
    }

    fn registry(&self) -> Result<&Arc<LockRegistry>, Error> {
        self.reg.as_ref().ok_or_else(|| {
            self.error(
                ErrorKind::InvalidName,
                "the name \"redwheel locks\" is in use by another kind of object",
            )
        })
    }

    fn checked_watchdog_lease(&self) -> Result<Duration, Error> {
        self.checked_lease(self.lease, MIN_WATCHDOG_LEASE, "watchdog_lease")
    }

    fn checked_lease(&self, lease: Duration, min: Duration, what: &str) -> Result<Duration, Error> {
        if lease < min || lease > MAX_LEASE {
            return Err(Error::new(
                ErrorKind::InvalidOption,
                format!("invalid option `{what}`: {lease:?} is not within {min:?} ..= 365 days"),
            ));
        }
        Ok(Duration::from_millis(lease_ms(lease)))
    }

    /// Tries until granted, `wait` is over (`None`: forever), or an error
    /// that waiting will not cure.
    fn acquire(
        &self,
        wait: Option<Duration>,
        lease: Duration,
        watchdog: bool,
    ) -> Result<Option<LockGuard>, Error> {
        let st = self.valid_state()?;
        let reg = self.registry()?;
        let rt = self.rt();
        let deadline = wait.map(|w| Instant::now().checked_add(w).unwrap_or_else(far_future));
        let counters = &reg.ctx.counters;
        st.waiters.enter(counters);
        let mut backoff = Backoff::new(rt.options.reconnect_min, rt.options.reconnect_max);
        let result = loop {
            if rt.is_shut_down() {
                break Err(shut_down());
            }
            match self.attempt(st, reg, lease, watchdog) {
                Ok(Attempt::Granted(g)) => break Ok(Some(g)),
                Ok(Attempt::Busy(ttl)) => {
                    backoff.reset();
                    let now = Instant::now();
                    if deadline.is_some_and(|d| now >= d) {
                        break Ok(None);
                    }
                    reg.subscribe(rt, st);
                    // Until the holder's lease ends at the latest (a missed
                    // notification costs that much), in slices that notice
                    // a shutdown.
                    let ttl = ttl
                        .unwrap_or(Duration::from_secs(1))
                        .max(Duration::from_millis(1));
                    let mut retry_at = now + ttl;
                    if let Some(d) = deadline {
                        retry_at = retry_at.min(d);
                    }
                    loop {
                        let slice = (Instant::now() + rt.options.max_block).min(retry_at);
                        if st.waiters.wait(slice) || Instant::now() >= retry_at || rt.is_shut_down()
                        {
                            break;
                        }
                    }
                }
                Err(e) if e.is_transient() => {
                    let mut pause = backoff.step();
                    if let Some(d) = deadline {
                        let left = d.saturating_duration_since(Instant::now());
                        if left.is_zero() {
                            break Err(e);
                        }
                        pause = pause.min(left);
                    }
                    tracing::debug!(target: "redwheel::lock", lock = %self.name, error = %e, "lock: redis unavailable; retrying");
                    std::thread::sleep(pause);
                }
                Err(e) => break Err(e),
            }
        };
        st.waiters.leave(matches!(result, Ok(Some(_))), counters);
        result
    }

    /// One acquire script: a fresh acquisition, or a re-entry of the
    /// calling thread's hold.
    fn attempt(
        &self,
        st: &Arc<LockState>,
        reg: &Arc<LockRegistry>,
        lease: Duration,
        watchdog: bool,
    ) -> Result<Attempt, Error> {
        let rt = self.rt();
        let tid = thread_seq();
        let current = st.current_hold(tid);
        let owner = reg.ctx.owner();
        let hold = match &current {
            Some(h) => Arc::clone(h),
            None => Arc::new(Hold::new(
                st,
                owner.clone(),
                self.on_lost.clone(),
                Arc::clone(&reg.ctx),
            )),
        };
        // Join the renewal group before the script runs: a renewal then
        // covers the lock from the moment it is granted.
        let mut joined = None;
        if watchdog && hold.watchdog.load(Ordering::Acquire) == 0 {
            let group = match hold.group.get().and_then(Weak::upgrade) {
                Some(g) => g,
                None => reg.group(rt, lease),
            };
            group.join(&hold);
            rt.driver
                .announce(&group.key, Deadline::After(group.period()));
            joined = Some(group);
        }
        let (token_arg, new_count) = match &current {
            Some(h) => (h.token(), h.count.load(Ordering::Acquire) + 1),
            None => (0, 1),
        };
        reg.ctx
            .counters
            .acquire_attempts
            .fetch_add(1, Ordering::Relaxed);
        let sent = now_ns();
        let span = telemetry::lock_op("lock_acquire", &st.name);
        let reply: Result<Vec<i64>, Error> = self.rt().run(&st.keys.lock, Access::Write, |con| {
            scripts::LOCK_ACQUIRE
                .key(&st.keys.lock)
                .key(&st.keys.fence)
                .arg(&owner)
                .arg(lease.as_millis() as u64)
                .arg(token_arg)
                .arg(new_count)
                .invoke(con)
        });
        drop(span);
        let undo_join = |hold: &Hold| {
            if let Some(g) = &joined {
                g.leave(hold);
            }
        };
        let reply = match reply {
            Ok(r) => r,
            Err(e) => {
                undo_join(&hold);
                return Err(self.wrap(e, "could not acquire"));
            }
        };
        match reply.as_slice() {
            [1, token, fresh] => {
                let token = *token as u64;
                let guard_hold = if *fresh == 1 {
                    if let Some(old) = &current {
                        // The hold we meant to re-enter was gone.
                        undo_join(old);
                        old.lose(LostCause::Gone);
                    }
                    let h = if current.is_some() {
                        let h = Arc::new(Hold::new(
                            st,
                            owner,
                            self.on_lost.clone(),
                            Arc::clone(&reg.ctx),
                        ));
                        if watchdog {
                            let group = reg.group(rt, lease);
                            group.join(&h);
                            rt.driver
                                .announce(&group.key, Deadline::After(group.period()));
                        }
                        h
                    } else {
                        hold
                    };
                    h.token.store(token, Ordering::Release);
                    h.count.store(1, Ordering::Release);
                    h.last_renewed.store(sent, Ordering::Release);
                    h.confirmed(sent, lease);
                    let _ = h.state.compare_exchange(
                        ACQUIRING,
                        HELD,
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    );
                    st.holds.lock().insert(tid, Arc::clone(&h));
                    h
                } else {
                    hold.count.store(new_count, Ordering::Release);
                    hold.confirmed(sent, lease);
                    hold
                };
                if watchdog {
                    guard_hold.watchdog.fetch_add(1, Ordering::AcqRel);
                    if let Some(g) = guard_hold.group.get().and_then(Weak::upgrade) {
                        g.watch(
                            guard_hold
                                .valid_until
                                .load(Ordering::Acquire)
                                .saturating_add(1_000_000),
                        );
                    }
                }
                reg.ctx.counters.acquired.fetch_add(1, Ordering::Relaxed);
                reg.ctx.metrics.acquired.add(1);
                Ok(Attempt::Granted(LockGuard {
                    lock: self.clone(),
                    hold: guard_hold,
                    watchdog,
                    tid,
                    released: false,
                    _not_send: PhantomData,
                }))
            }
            [0, pttl] => {
                undo_join(&hold);
                if let Some(old) = &current {
                    // We believed we held it; someone else does.
                    old.lose(LostCause::Gone);
                }
                Ok(Attempt::Busy(
                    u64::try_from(*pttl).ok().map(Duration::from_millis),
                ))
            }
            other => {
                undo_join(&hold);
                Err(self.error(
                    ErrorKind::Protocol,
                    &format!("unexpected reply to lock_acquire.lua: {other:?}"),
                ))
            }
        }
    }
}

fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(86_400 * 365 * 30)
}

/// A held lock. Dropping it unlocks (errors are logged);
/// [`unlock`](LockGuard::unlock) does the same and returns the error.
///
/// Not `Send`: a lock belongs to the thread that took it (re-entry is per
/// thread).
pub struct LockGuard {
    lock: Lock,
    hold: Arc<Hold>,
    watchdog: bool,
    tid: u64,
    released: bool,
    _not_send: PhantomData<*const ()>,
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("name", &self.lock.name)
            .field("fencing_token", &self.hold.token())
            .field("watchdog", &self.watchdog)
            .field("lost", &(self.hold.state() == LOST))
            .finish_non_exhaustive()
    }
}

impl LockGuard {
    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.lock.name
    }

    /// The fencing token of this acquisition: strictly greater than every
    /// earlier acquisition's of the same lock name (a re-entry shares its
    /// hold's token). Give it to the store you write to, so it can reject
    /// writes from a holder whose lease was lost.
    pub fn fencing_token(&self) -> u64 {
        self.hold.token()
    }

    /// True once the lease was lost, or may have run out with no renewal
    /// confirmed (see the module docs); it stays true. Cheap: no Redis
    /// round trip, check it before each write of a long critical section.
    pub fn is_lost(&self) -> bool {
        self.hold.check_lost()
    }

    /// Unlocks. `Ok` when this guard held the lock throughout and the
    /// unlock reached Redis (the lock is free unless this thread holds it
    /// again through another guard). [`ErrorKind::LockLost`] when the
    /// lease was lost before (the lock was released anyway if it was still
    /// this hold's). A transient error is retried (the release script is
    /// idempotent) for up to the command timeout; if Redis stays
    /// unreachable the error is returned and the lock lapses at the end of
    /// its lease, its renewal already stopped.
    pub fn unlock(mut self) -> Result<(), Error> {
        self.release()
    }

    fn release(&mut self) -> Result<(), Error> {
        if std::mem::replace(&mut self.released, true) {
            return Ok(());
        }
        let hold = &self.hold;
        let lock = &self.lock;
        let st = match &lock.state {
            Some(s) => s,
            None => return Ok(()),
        };
        let left = hold.count.fetch_sub(1, Ordering::AcqRel).saturating_sub(1);
        if self.watchdog
            && hold.watchdog.fetch_sub(1, Ordering::AcqRel) == 1
            && let Some(g) = hold.group.get().and_then(Weak::upgrade)
        {
            // Renewal stops before the release is sent.
            g.leave(hold);
        }
        let was_lost = hold.check_lost();
        if left == 0 {
            let _ =
                hold.state
                    .compare_exchange(HELD, RELEASED, Ordering::AcqRel, Ordering::Acquire);
            st.forget(self.tid, hold);
        }
        let rt = lock.rt();
        let token = hold.token();
        let started = Instant::now();
        let mut backoff = Backoff::new(rt.options.reconnect_min, rt.options.reconnect_max);
        // Sent on connections of our own choosing (not `Pool::run`, which
        // may resend once behind our back), so we know whether an earlier
        // attempt may have been applied when a later one finds the hold gone.
        let mut maybe_applied = false;
        let reply = loop {
            let r = send_release(rt, st, hold, token, left);
            match r {
                Err(e) if e.is_transient() && started.elapsed() < rt.options.command_timeout => {
                    maybe_applied |= e.is_outcome_unknown();
                    std::thread::sleep(backoff.step());
                }
                other => break other,
            }
        };
        let lost_error = || {
            lock.error(
                ErrorKind::LockLost,
                &format!(
                    "the lease of fencing token {token} was lost before the unlock; work done under it may have overlapped with another holder"
                ),
            )
        };
        match reply {
            Ok(0) => {
                st.waiters.released(token);
                if was_lost { Err(lost_error()) } else { Ok(()) }
            }
            Ok(n) if n > 0 => {
                if was_lost {
                    Err(lost_error())
                } else {
                    Ok(())
                }
            }
            Ok(_) if maybe_applied && !was_lost => {
                // An earlier attempt whose reply was lost released it.
                if left == 0 {
                    st.waiters.released(token);
                }
                Ok(())
            }
            Ok(_) => {
                hold.lose_at_unlock();
                Err(lost_error())
            }
            Err(e) if was_lost => Err(lost_error().with_cause(e)),
            Err(e) => Err(lock.wrap(
                e,
                "could not unlock; the lock lapses at the end of its lease",
            )),
        }
    }
}

/// One `lock_release.lua` call, sent exactly once (no hidden resend, so a
/// "hold gone" reply is never the echo of an unlock that already worked);
/// errors are classified as writes.
fn send_release(
    rt: &Runtime,
    st: &LockState,
    hold: &Hold,
    token: u64,
    left: u32,
) -> Result<i64, Error> {
    let _span = telemetry::lock_op("lock_release", &st.name);
    rt.run_once(&st.keys.lock, Access::Write, |con| {
        scripts::LOCK_RELEASE
            .key(&st.keys.lock)
            .key(&st.keys.channel)
            .arg(&hold.owner)
            .arg(token)
            .arg(left)
            .invoke(con)
    })
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if let Err(e) = self.release() {
            tracing::warn!(target: "redwheel::lock", lock = %self.lock.name, error = %e, "unlock on drop failed");
        }
    }
}
