//! [`Lock::lock_async`] and [`Lock::try_lock_async`] (feature `async`):
//! the acquire script through the multiplexed connection (with
//! `wait_replicas`, with its `WAIT` on a connection of its own:
//! `runtime/replicas.rs`), waits for a release on the lock's unlock
//! channel or the holder's lease end (a deadline on the driver's wheel),
//! never in the caller's thread. One owner per call; a grant its replicas
//! did not confirm is released and tried again within the wait, as the
//! blocking twin does.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use redis::Value;

use super::acquire::{Acquired, Granted, acquire_on, split_acked};
use super::guard::Release;
use super::guard_async::AsyncLockGuard;
use super::handle::Lock;
use super::keys::Keys;
use crate::error::{Access, Error, ErrorKind};
use crate::runtime::{
    Backoff, Cell, Command, Orphan, Runtime, WaitReplicas, detach, first_reply, run_alone,
    shut_down,
};
use crate::scripts;
use crate::telemetry;

/// Holder numbers of async acquisitions: the top bit set, so they never
/// meet a thread's number in a lock's holds.
const ASYNC_HOLDER: u64 = 1 << 63;

/// The next async acquisition's number.
fn next_async_holder() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

impl Lock {
    /// [`lock`](Lock::lock) as a future: takes the lock, waiting as long as
    /// it takes, with the watchdog; gives a `Send` guard. Same errors as
    /// `lock`.
    ///
    /// Each call is an owner of its own: not reentrant (see
    /// [`AsyncLockGuard`]). Waiting costs no thread and no connection: the
    /// future is woken by the release's notice on the lock's unlock
    /// channel (one waiter per release, threads and futures alike), or at
    /// the end of the holder's lease at the latest.
    ///
    /// **Cancellation**: dropped while waiting, nothing is held. Dropped
    /// with an acquire on the wire, a lock it is granted is released at
    /// once (on redwheel's threads). Dropped after it returned the guard,
    /// the guard's drop unlocks.
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), redwheel::Error> {
    /// use redwheel::Redwheel;
    ///
    /// let rw = Redwheel::connect("redis://127.0.0.1:6379")?;
    /// let g = rw.lock("inventory:42").lock_async().await?;
    /// let token = g.fencing_token();
    /// // … the critical section, across .await points …
    /// g.unlock_async().await?;
    /// # let _ = token; Ok(()) }
    /// ```
    pub fn lock_async(
        &self,
    ) -> impl Future<Output = Result<AsyncLockGuard, Error>> + Send + 'static {
        let lock = self.clone();
        async move {
            let lease = lock.checked_watchdog_lease()?;
            lock.acquire_async(None, lease)
                .await?
                .ok_or_else(|| lock.error(ErrorKind::Protocol, "lock_async returned no guard"))
        }
    }

    /// [`try_lock`](Lock::try_lock) as a future: takes the lock if it can
    /// within `wait` (zero: one attempt), with the watchdog; `Ok(None)`
    /// when it could not. Same errors as `try_lock`.
    ///
    /// **Cancellation**: as [`lock_async`](Lock::lock_async).
    pub fn try_lock_async(
        &self,
        wait: Duration,
    ) -> impl Future<Output = Result<Option<AsyncLockGuard>, Error>> + Send + 'static {
        let lock = self.clone();
        async move {
            let lease = lock.checked_watchdog_lease()?;
            lock.acquire_async(Some(wait), lease).await
        }
    }

    async fn acquire_async(
        &self,
        wait: Option<Duration>,
        lease: Duration,
    ) -> Result<Option<AsyncLockGuard>, Error> {
        let st = Arc::clone(self.valid_state()?);
        let reg = Arc::clone(self.registry()?);
        let rt = Arc::clone(self.rt());
        if let Some(w) = &self.wait_replicas {
            w.check("wait_replicas", rt.options.command_timeout)
                .map_err(|e| self.wrap(e, "cannot take the lock"))?;
        }
        let deadline = wait.and_then(|w| Instant::now().checked_add(w));
        let _waiting = Waiting::new(&reg.ctx.counters.waiting);
        // Registered before the first attempt: a release while it is on
        // the wire is kept.
        let ticket = st.waiters.futures.register();
        let mut backoff = Backoff::new(rt.options.reconnect_min, rt.options.reconnect_max);
        // One owner for every attempt of this call: after an attempt whose
        // outcome is unknown, the next one takes over a grant the first
        // may have got (the script replaces a hold of ours it was not told
        // of) instead of waiting for its lease as for another owner's.
        let n = next_async_holder();
        let tid = ASYNC_HOLDER | n;
        let owner = format!("{}a{n}", reg.ctx.owner_prefix);
        loop {
            if rt.is_shut_down() {
                return Err(shut_down());
            }
            ticket.cell().reset();
            let attempt = self.begin_attempt(&st, &reg, lease, true, tid, owner.clone(), None);
            let span = telemetry::lock_op_async("lock_acquire", &st.name);
            let (reply, acked) = match self.wait_replicas {
                Some(w) => acquire_alone(&rt, &st.keys, &owner, attempt.args(), w).await,
                None => (
                    acquire_muxed(&rt, &st.keys, &owner, attempt.args()).await,
                    None,
                ),
            };
            drop(span);
            let left = || deadline.map(|d| d.saturating_duration_since(Instant::now()));
            let busy = match self.finish_attempt(&st, &reg, attempt, reply) {
                Ok(Granted::Hold(hold)) => {
                    let guard = AsyncLockGuard {
                        lock: self.clone(),
                        hold,
                        tid,
                        released: false,
                    };
                    let (Some(w), Some(acked)) = (&self.wait_replicas, acked) else {
                        return Ok(Some(guard));
                    };
                    let token = guard.fencing_token();
                    let what = format!("granted (fencing token {token})");
                    match w.confirmed_reply(acked, &what) {
                        Ok(()) => return Ok(Some(guard)),
                        Err(e) => {
                            // Refused: not handed out, and released at
                            // once; tried again as the blocking twin does.
                            if let Err(unlock) = guard.unlock_async().await {
                                tracing::warn!(target: "redwheel::lock", lock = %self.name, error = %unlock, "could not release a grant its replicas did not confirm; it lapses at the end of its lease");
                            }
                            Err(self.wrap(e, "the grant was refused and the lock released"))
                        }
                    }
                }
                Ok(Granted::Busy(ttl)) => Ok(ttl),
                Err(e) => Err(e),
            };
            match busy {
                Ok(ttl) => {
                    backoff.reset();
                    if left().is_some_and(|l| l.is_zero()) {
                        return Ok(None);
                    }
                    reg.subscribe(&rt, &st);
                    // Until a release, or the holder's lease ends at the
                    // latest (a missed notice costs that much).
                    let mut until = ttl
                        .unwrap_or(Duration::from_secs(1))
                        .max(Duration::from_millis(1));
                    if let Some(l) = left() {
                        until = until.min(l);
                    }
                    rt.wait_for(ticket.cell(), Some(until)).await;
                }
                Err(e) if e.is_transient() => {
                    let mut pause = backoff.step();
                    if let Some(l) = left() {
                        if l.is_zero() {
                            return Err(e);
                        }
                        pause = pause.min(l);
                    }
                    tracing::debug!(target: "redwheel::lock", lock = %self.name, error = %e, "lock: redis unavailable; retrying");
                    rt.wait_for(&Arc::new(Cell::default()), Some(pause)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// One acquire script through the node's multiplexed connection (no
/// `WAIT`). Dropped with it on the wire, a lock it is granted is released
/// when the reply comes.
async fn acquire_muxed(
    rt: &Arc<Runtime>,
    keys: &Keys,
    owner: &str,
    args: [String; 4],
) -> Result<Vec<i64>, Error> {
    let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
    let command = Command::script(&scripts::LOCK_ACQUIRE, &[&keys.lock, &keys.fence], &args);
    let orphan = release_if_granted(Arc::downgrade(rt), keys.clone(), owner.to_owned());
    rt.call(&keys.lock, Access::Write, command, Some(orphan))
        .await
        .and_then(|v| first_reply(v, Access::Write))
        .and_then(|v| {
            redis::from_redis_value::<Vec<i64>>(v).map_err(|e| {
                Error::new(ErrorKind::Protocol, "unexpected reply to lock_acquire.lua")
                    .with_cause(e)
            })
        })
}

/// One acquire script, and its `WAIT` after a fresh grant, on a connection
/// of their own (`WAIT` blocks the connection it is sent on: not the
/// multiplexed one every future shares), off the caller's thread. Dropped
/// meanwhile, a lock it is granted is released.
async fn acquire_alone(
    rt: &Arc<Runtime>,
    keys: &Keys,
    owner: &str,
    args: [String; 4],
    wait: WaitReplicas,
) -> (Result<Vec<i64>, Error>, Option<redis::RedisResult<i64>>) {
    let job = {
        let (rt, keys) = (Arc::clone(rt), keys.clone());
        move || {
            rt.run(&keys.lock, Access::Write, |con| {
                acquire_on(con, &keys, &args, Some(&wait))
            })
        }
    };
    let orphan = {
        let (rt, keys, owner) = (Arc::downgrade(rt), keys.clone(), owner.to_owned());
        Box::new(move |r: Result<Acquired, Error>| {
            if let Ok((granted, _)) = r
                && let [1, token, ..] = granted.as_slice()
            {
                release_granted(rt, keys, owner, *token);
            }
        })
    };
    split_acked(run_alone(job, Some(orphan)).await)
}

/// An acquire's reply that came after its future was dropped: a lock it
/// was granted is released at once, on redwheel's threads.
fn release_if_granted(rt: Weak<Runtime>, keys: Keys, owner: String) -> Orphan {
    Box::new(move |values: Option<Vec<Value>>| {
        // A lost reply: a lock it may have been granted lapses unrenewed
        // within its lease (as after a synchronous OutcomeUnknown).
        let Some(values) = values else { return };
        let Some(Value::Array(items)) = values.into_iter().next() else {
            return;
        };
        let [Value::Int(1), Value::Int(token), ..] = items.as_slice() else {
            return; // not granted
        };
        release_granted(rt, keys, owner, *token);
    })
}

/// Releases the lock granted to `owner` with `token`, whose acquisition
/// nobody waits for any more, in the background.
fn release_granted(rt: Weak<Runtime>, keys: Keys, owner: String, token: i64) {
    let Some(rt) = rt.upgrade() else { return };
    let release = Release::new(&keys, &owner, token as u64, 0, &rt);
    let command = Command::script(&scripts::LOCK_RELEASE, &release.keys(), &release.args());
    let route = keys.lock.clone();
    detach(async move {
        if let Err(e) = rt.call(&route, Access::Write, command, None).await {
            tracing::warn!(target: "redwheel::lock", key = %route, error = %e, "a lock granted to a dropped lock_async could not be released; it lapses at the end of its lease");
        }
    });
}

/// Counts an async acquisition in `LockStats::waiting` while it lives.
struct Waiting<'a>(&'a std::sync::atomic::AtomicUsize);

impl<'a> Waiting<'a> {
    fn new(n: &'a std::sync::atomic::AtomicUsize) -> Waiting<'a> {
        n.fetch_add(1, Ordering::Relaxed);
        Waiting(n)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}
