//! [`LockGuard`]: a held lock, and the unlock (sent exactly once per
//! attempt, retried while Redis is briefly unreachable).

use std::fmt;
use std::marker::PhantomData;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

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
    /// this hold's), and also when the unlock finds the lock gone or
    /// another owner's (force-unlocked, lost in a restart without
    /// persistence), even on a resend after a lost reply: the release
    /// leaves a short-lived record, so a resend answers `Ok` only if an
    /// earlier attempt released this very hold. A transient error is
    /// retried (the release script is idempotent) for up to the command
    /// timeout; if Redis stays
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
        // Resent only after a failure that left it unsent or unknown: the
        // script records a release, so a resend tells "an earlier attempt
        // released it" from "it was gone or another owner's".
        let reply = loop {
            match send_release(rt, st, &self.hold, &r) {
                Err(e) if e.is_transient() && started.elapsed() < rt.options.command_timeout => {
                    std::thread::sleep(backoff.step());
                }
                other => break other,
            }
        };
        release_outcome(lock, st, &self.hold, &r, reply)
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
/// with the async unlock).
pub(super) fn release_outcome(
    lock: &Lock,
    st: &LockState,
    hold: &Hold,
    r: &Releasing,
    reply: Result<i64, Error>,
) -> Result<(), Error> {
    let (token, was_lost) = (r.token, r.was_lost);
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
        // An earlier attempt of this unlock, whose reply was lost,
        // released it (the script's record says so).
        Ok(RELEASED_BEFORE) => {
            st.waiters.released(token);
            if was_lost { Err(lost_error()) } else { Ok(()) }
        }
        // Gone, or another owner's: nothing of ours was released.
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

/// `lock_release.lua`'s reply when an earlier attempt of the same unlock
/// released the hold.
const RELEASED_BEFORE: i64 = -2;

/// One `lock_release.lua` call, sent once (a write: never resent behind
/// our back), following the cluster's redirects (`MOVED`, `ASK`: the
/// command was not applied where it was refused).
fn send_release(rt: &Runtime, st: &LockState, hold: &Hold, r: &Releasing) -> Result<i64, Error> {
    let _span = telemetry::lock_op("lock_release", &st.name);
    let release = Release::new(&st.keys, &hold.owner, r.token, r.left, rt);
    rt.run(&st.keys.lock, Access::Write, |con| {
        let mut inv = scripts::LOCK_RELEASE.prepare_invoke();
        for k in release.keys() {
            inv.key(k);
        }
        for a in release.args() {
            inv.arg(a);
        }
        inv.invoke(con)
    })
}

/// One `lock_release.lua` call's keys and arguments (shared with the async
/// unlock and the release of a grant nobody waits for).
pub(super) struct Release<'a> {
    keys: &'a Keys,
    record: String,
    args: [String; 4],
}

impl<'a> Release<'a> {
    /// The release by `owner` of its hold `token`, leaving `left` guards;
    /// the record outlives every resend (each within the command timeout
    /// from the first, its reply read within one more).
    pub(super) fn new(keys: &'a Keys, owner: &str, token: u64, left: u32, rt: &Runtime) -> Self {
        let record_ms = (rt.options.command_timeout * 2 + Duration::from_secs(1)).as_millis();
        Release {
            keys,
            record: keys.release_record(owner, token),
            args: [
                owner.to_owned(),
                token.to_string(),
                left.to_string(),
                record_ms.to_string(),
            ],
        }
    }

    /// KEYS: the lock, its unlock channel, the release record.
    pub(super) fn keys(&self) -> [&str; 3] {
        [&self.keys.lock, &self.keys.channel, &self.record]
    }

    /// ARGV: owner, token, count left, the record's life in ms.
    pub(super) fn args(&self) -> [&[u8]; 4] {
        self.args.each_ref().map(|a| a.as_bytes())
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if let Err(e) = self.release() {
            tracing::warn!(target: "redwheel::lock", lock = %self.lock.name, error = %e, "unlock on drop failed");
        }
    }
}
