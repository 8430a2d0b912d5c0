//! [`LockGuard`]: a held lock, and the unlock (sent exactly once per
//! attempt, retried while Redis is briefly unreachable).

use std::fmt;
use std::marker::PhantomData;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Instant;

use super::handle::Lock;
use super::hold::{HELD, Hold, LOST, RELEASED};
use super::keys::Keys;
use super::state::LockState;
use crate::error::{Access, Error, ErrorKind};
use crate::runtime::{Backoff, Runtime};
use crate::scripts;
use crate::telemetry;

/// A held lock. Dropping it unlocks (errors are logged);
/// [`unlock`](LockGuard::unlock) does the same and returns the error.
///
/// Not `Send`: a lock belongs to the thread that took it (re-entry is per
/// thread).
pub struct LockGuard {
    pub(super) lock: Lock,
    pub(super) hold: Arc<Hold>,
    pub(super) watchdog: bool,
    pub(super) tid: u64,
    pub(super) released: bool,
    pub(super) _not_send: PhantomData<*const ()>,
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
    /// hold's token); across a restart without persistence or a failover,
    /// as the [module docs](crate::lock) say, which
    /// [`Lock::wait_replicas`](crate::Lock::wait_replicas) makes hold
    /// without relying on clocks. Give it to the store you write to, so it
    /// can reject writes from a holder whose lease was lost.
    ///
    /// ```no_run
    /// use redwheel::Redwheel;
    ///
    /// let rw = Redwheel::connect("redis://127.0.0.1:6379")?;
    /// let guard = rw.lock("account:7").lock()?;
    /// let token = guard.fencing_token();
    /// // The store keeps the highest token it has seen and refuses lower ones:
    /// // `UPDATE accounts SET …, fence = $token WHERE id = 7 AND fence <= $token`
    /// # let _ = token;
    /// guard.unlock()?;
    /// # Ok::<(), redwheel::Error>(())
    /// ```
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
    ///
    /// ```no_run
    /// use redwheel::{ErrorKind, Redwheel};
    ///
    /// let rw = Redwheel::connect("redis://127.0.0.1:6379")?;
    /// let guard = rw.lock("account:7").lock()?;
    /// // … the critical section …
    /// match guard.unlock() {
    ///     Ok(()) => {}
    ///     // Someone else may have held it meanwhile: undo or check what was written.
    ///     Err(e) if e.kind() == ErrorKind::LockLost => eprintln!("{e}"),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok::<(), redwheel::Error>(())
    /// ```
    pub fn unlock(mut self) -> Result<(), Error> {
        self.release()
    }

    fn release(&mut self) -> Result<(), Error> {
        if std::mem::replace(&mut self.released, true) {
            return Ok(());
        }
        let lock = &self.lock;
        let st = match &lock.state {
            Some(s) => s,
            None => return Ok(()),
        };
        let r = begin_release(st, &self.hold, self.watchdog, self.tid);
        let rt = lock.rt();
        let started = Instant::now();
        let mut backoff = Backoff::new(rt.options.reconnect_min, rt.options.reconnect_max);
        // Sent on connections of our own choosing (not `Pool::run`, which
        // may resend once behind our back), so we know whether an earlier
        // attempt may have been applied when a later one finds the hold gone.
        let mut maybe_applied = false;
        let reply = loop {
            let r = send_release(rt, st, &self.hold, r.token, r.left);
            match r {
                Err(e) if e.is_transient() && started.elapsed() < rt.options.command_timeout => {
                    maybe_applied |= e.is_outcome_unknown();
                    std::thread::sleep(backoff.step());
                }
                other => break other,
            }
        };
        release_outcome(lock, st, &self.hold, &r, reply, maybe_applied)
    }
}

/// An unlock under way: the count left, the token, and whether the hold
/// was lost before it.
pub(super) struct Releasing {
    pub(super) left: u32,
    pub(super) token: u64,
    was_lost: bool,
}

/// The local half of an unlock of `hold` by holder `tid` (shared with the
/// async unlock): one guard fewer; the last watchdog guard leaves the
/// renewal group (before the release is sent); the last guard marks the
/// hold released.
pub(super) fn begin_release(
    st: &LockState,
    hold: &Arc<Hold>,
    watchdog: bool,
    tid: u64,
) -> Releasing {
    let left = hold.count.fetch_sub(1, Ordering::AcqRel).saturating_sub(1);
    if watchdog
        && hold.watchdog.fetch_sub(1, Ordering::AcqRel) == 1
        && let Some(g) = hold.group.get().and_then(Weak::upgrade)
    {
        // Renewal stops before the release is sent.
        g.leave(hold);
    }
    let was_lost = hold.check_lost();
    if left == 0 {
        let _ = hold
            .state
            .compare_exchange(HELD, RELEASED, Ordering::AcqRel, Ordering::Acquire);
        st.forget(tid, hold);
    }
    Releasing {
        left,
        token: hold.token(),
        was_lost,
    }
}

/// What the release script's `reply` means for the unlock `r` (shared
/// with the async unlock); `maybe_applied`: an earlier attempt of it may
/// have been applied.
pub(super) fn release_outcome(
    lock: &Lock,
    st: &LockState,
    hold: &Hold,
    r: &Releasing,
    reply: Result<i64, Error>,
    maybe_applied: bool,
) -> Result<(), Error> {
    let (token, left, was_lost) = (r.token, r.left, r.was_lost);
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
        let mut inv = scripts::LOCK_RELEASE.prepare_invoke();
        for k in release_keys(&st.keys) {
            inv.key(k);
        }
        inv.arg(&hold.owner).arg(token).arg(left).invoke(con)
    })
}

/// `lock_release.lua`'s keys, in its order (ARGV: owner, token, count
/// left).
pub(super) fn release_keys(keys: &Keys) -> [&str; 2] {
    [&keys.lock, &keys.channel]
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if let Err(e) = self.release() {
            tracing::warn!(target: "redwheel::lock", lock = %self.lock.name, error = %e, "unlock on drop failed");
        }
    }
}
