//! Taking a lock: [`Lock::lock`], [`Lock::try_lock`] and their
//! explicit-lease twins, which try the acquire script until it grants the
//! lock (or the wait is over), joining the renewal group first.

use std::marker::PhantomData;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use super::ctx::thread_seq;
use super::guard::LockGuard;
use super::handle::Lock;
use super::hold::{ACQUIRING, HELD, Hold, RenewalGroup};
use super::keys::Keys;
use super::lease::now_ns;
use super::lost::LostCause;
use super::registry::LockRegistry;
use super::state::LockState;
use crate::error::{Access, Error, ErrorKind};
use crate::runtime::{Backoff, Conn, Deadline, WaitReplicas, shut_down};
use crate::scripts;
use crate::telemetry;

/// What one acquire script said.
enum AcquireOutcome {
    Granted(LockGuard),
    /// Held by another owner for this much longer (`None`: no TTL).
    Busy(Option<Duration>),
}

impl Lock {
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
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use redwheel::Redwheel;
    ///
    /// let rw = Redwheel::connect("redis://127.0.0.1:6379")?;
    /// match rw.lock("nightly-report").try_lock(Duration::ZERO)? {
    ///     Some(guard) => {
    ///         // … only one process runs the report …
    ///         guard.unlock()?;
    ///     }
    ///     None => { /* another process is on it */ }
    /// }
    /// # Ok::<(), redwheel::Error>(())
    /// ```
    pub fn try_lock(&self, wait: Duration) -> Result<Option<LockGuard>, Error> {
        let lease = self.checked_watchdog_lease()?;
        self.acquire(Some(wait), lease, true)
    }

    /// As [`lock`](Lock::lock), with an explicit lease and no watchdog: the
    /// lock lapses `lease` after it was taken (1 ms ..= 365 days, whole ms)
    /// unless unlocked before.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use redwheel::Redwheel;
    ///
    /// let rw = Redwheel::connect("redis://127.0.0.1:6379")?;
    /// // Nothing renews it: if this process dies, the lock is free 10 s later.
    /// let guard = rw.lock("cache-rebuild").lock_with_lease(Duration::from_secs(10))?;
    /// // … finish well within the lease, or check guard.is_lost() …
    /// drop(guard);
    /// # Ok::<(), redwheel::Error>(())
    /// ```
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
        if let Some(w) = &self.wait_replicas {
            w.check("wait_replicas", rt.options.command_timeout)
                .map_err(|e| self.wrap(e, "cannot take the lock"))?;
        }
        let deadline = wait.map(|w| Instant::now().checked_add(w).unwrap_or_else(far_future));
        let counters = &reg.ctx.counters;
        st.waiters.enter(counters);
        let mut backoff = Backoff::new(rt.options.reconnect_min, rt.options.reconnect_max);
        let result = loop {
            if rt.is_shut_down() {
                break Err(shut_down());
            }
            match self.acquire_once(st, reg, lease, watchdog) {
                Ok(AcquireOutcome::Granted(g)) => break Ok(Some(g)),
                Ok(AcquireOutcome::Busy(ttl)) => {
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
    fn acquire_once(
        &self,
        st: &Arc<LockState>,
        reg: &Arc<LockRegistry>,
        lease: Duration,
        watchdog: bool,
    ) -> Result<AcquireOutcome, Error> {
        let tid = thread_seq();
        let current = st.current_hold(tid);
        let attempt = self.begin_attempt(st, reg, lease, watchdog, tid, reg.ctx.owner(), current);
        let span = telemetry::lock_op("lock_acquire", &st.name);
        let args = attempt.args();
        let (reply, acked) = split_acked(self.rt().run(&st.keys.lock, Access::Write, |con| {
            acquire_on(con, &st.keys, &args, self.wait_replicas.as_ref())
        }));
        drop(span);
        let guard = match self.finish_attempt(st, reg, attempt, reply)? {
            Granted::Hold(hold) => LockGuard {
                lock: self.clone(),
                hold,
                watchdog,
                tid,
                released: false,
                _not_send: PhantomData,
            },
            Granted::Busy(ttl) => return Ok(AcquireOutcome::Busy(ttl)),
        };
        if let (Some(w), Some(acked)) = (&self.wait_replicas, acked) {
            let token = guard.hold.token();
            if let Err(e) = w.confirmed_reply(acked, &format!("granted (fencing token {token})")) {
                // Refused: not handed out, and released at once.
                if let Err(unlock) = guard.unlock() {
                    tracing::warn!(target: "redwheel::lock", lock = %self.name, error = %unlock, "could not release a grant its replicas did not confirm; it lapses at the end of its lease");
                }
                return Err(self.wrap(e, "the grant was refused and the lock released"));
            }
        }
        Ok(AcquireOutcome::Granted(guard))
    }

    /// Prepares one acquire script for holder `tid` (a thread, or an async
    /// acquisition) as `owner`, re-entering `current` if given: the hold
    /// joins its renewal group first, so a renewal covers the lock from
    /// the moment it is granted. Shared with the async acquire.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn begin_attempt(
        &self,
        st: &Arc<LockState>,
        reg: &Arc<LockRegistry>,
        lease: Duration,
        watchdog: bool,
        tid: u64,
        owner: String,
        current: Option<Arc<Hold>>,
    ) -> Attempt {
        let rt = self.rt();
        let hold = match &current {
            Some(h) => Arc::clone(h),
            None => {
                Arc::new(st.new_hold(owner.clone(), self.on_lost.clone(), Arc::clone(&reg.ctx)))
            }
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
        Attempt {
            hold,
            current,
            joined,
            owner,
            lease,
            watchdog,
            tid,
            token_arg,
            new_count,
            sent: now_ns(),
        }
    }

    /// Reads one acquire script's reply (shared with the async acquire).
    pub(super) fn finish_attempt(
        &self,
        st: &Arc<LockState>,
        reg: &Arc<LockRegistry>,
        mut attempt: Attempt,
        reply: Result<Vec<i64>, Error>,
    ) -> Result<Granted, Error> {
        let rt = self.rt();
        let joined = attempt.joined.take();
        let Attempt {
            ref hold,
            ref current,
            ref owner,
            lease,
            watchdog,
            tid,
            new_count,
            sent,
            ..
        } = attempt;
        let undo_join = |hold: &Hold| {
            if let Some(g) = &joined {
                g.leave(hold);
            }
        };
        let reply = match reply {
            Ok(r) => r,
            Err(e) => {
                undo_join(hold);
                return Err(self.wrap(e, "could not acquire"));
            }
        };
        match reply.as_slice() {
            [1, token, fresh] => {
                let token = *token as u64;
                let guard_hold = if *fresh == 1 {
                    if let Some(old) = current {
                        // The hold we meant to re-enter was gone.
                        undo_join(old);
                        old.lose(LostCause::Gone);
                    }
                    let h = if current.is_some() {
                        let h = Arc::new(st.new_hold(
                            owner.clone(),
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
                        Arc::clone(hold)
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
                    Arc::clone(hold)
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
                Ok(Granted::Hold(guard_hold))
            }
            [0, pttl] => {
                undo_join(hold);
                if let Some(old) = current {
                    // We believed we held it; someone else does.
                    old.lose(LostCause::Gone);
                }
                Ok(Granted::Busy(
                    u64::try_from(*pttl).ok().map(Duration::from_millis),
                ))
            }
            other => {
                undo_join(hold);
                Err(self.error(
                    ErrorKind::Protocol,
                    &format!("unexpected reply to lock_acquire.lua: {other:?}"),
                ))
            }
        }
    }
}

/// One acquire script on its way: the hold it is for, and what the reply
/// changes. Dropped unread (an async acquire whose future was dropped),
/// it leaves the renewal group it joined.
pub(super) struct Attempt {
    pub(super) hold: Arc<Hold>,
    current: Option<Arc<Hold>>,
    joined: Option<Arc<RenewalGroup>>,
    pub(super) owner: String,
    lease: Duration,
    watchdog: bool,
    tid: u64,
    token_arg: u64,
    new_count: u32,
    sent: u64,
}

impl Attempt {
    /// `lock_acquire.lua`'s ARGV (KEYS: the lock, its fence).
    pub(super) fn args(&self) -> [String; 4] {
        [
            self.owner.clone(),
            (self.lease.as_millis() as u64).to_string(),
            self.token_arg.to_string(),
            self.new_count.to_string(),
        ]
    }
}

impl Drop for Attempt {
    fn drop(&mut self) {
        if let Some(g) = self.joined.take() {
            g.leave(&self.hold);
        }
    }
}

/// One `lock_acquire.lua` on `con` with an attempt's `args`; with `wait`,
/// a fresh grant is followed by `WAIT` on the same connection (it counts
/// the replicas that have this connection's writes), its answer or
/// failure kept apart, so the grant is known either way and can be
/// released. Nothing is waited for when nothing was granted. Shared with
/// the async acquire.
pub(super) fn acquire_on(
    con: &mut Conn,
    keys: &Keys,
    args: &[String; 4],
    wait: Option<&WaitReplicas>,
) -> redis::RedisResult<Acquired> {
    let mut inv = scripts::LOCK_ACQUIRE.prepare_invoke();
    inv.key(&keys.lock).key(&keys.fence);
    for a in args {
        inv.arg(a);
    }
    let r: Vec<i64> = inv.invoke(con)?;
    let acked = match (wait, r.as_slice()) {
        (Some(w), [1, _, 1]) => Some(w.wait(con)),
        _ => None,
    };
    Ok((r, acked))
}

/// `lock_acquire.lua`'s reply, and `WAIT`'s after a fresh grant.
pub(super) type Acquired = (Vec<i64>, Option<redis::RedisResult<i64>>);

/// [`acquire_on`]'s result as the acquire script's reply and `WAIT`'s.
pub(super) fn split_acked(
    r: Result<Acquired, Error>,
) -> (Result<Vec<i64>, Error>, Option<redis::RedisResult<i64>>) {
    match r {
        Ok((reply, acked)) => (Ok(reply), acked),
        Err(e) => (Err(e), None),
    }
}

/// What one acquire script granted.
pub(super) enum Granted {
    /// The hold (fresh, or the re-entered one).
    Hold(Arc<Hold>),
    /// Held by another owner for this much longer (`None`: no TTL).
    Busy(Option<Duration>),
}

fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(86_400 * 365 * 30)
}
