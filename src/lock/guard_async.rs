//! [`AsyncLockGuard`]: a lock held by an async acquisition (feature
//! `async`), and its unlock, run by redwheel's threads so that neither
//! `unlock_async` nor a drop waits on Redis in the caller's thread.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;

use super::guard::{Release, Releasing, begin_release, release_outcome};
use super::handle::Lock;
use super::hold::{Hold, LOST};
use crate::error::{Access, Error, ErrorKind};
use crate::runtime::{Backoff, Cell, Command, detach, first_reply};
use crate::scripts;
use crate::telemetry;

/// A lock held by [`Lock::lock_async`] or [`Lock::try_lock_async`]:
/// `Send`, so a task may hold it across `.await` on a multi-thread
/// executor and move between threads meanwhile.
///
/// Each async acquisition is an owner of its own (not the thread's), so
/// it is **not reentrant**: a task that holds the lock and asks for it
/// again waits for itself. Renewed by the watchdog as a [`LockGuard`]
/// is; [`is_lost`](AsyncLockGuard::is_lost) and the lock's `on_lost` work
/// the same.
///
/// Dropping it unlocks in the background (on redwheel's threads; errors
/// are logged); [`unlock_async`](AsyncLockGuard::unlock_async) does the
/// same and gives the result.
///
/// [`LockGuard`]: crate::LockGuard
pub struct AsyncLockGuard {
    pub(super) lock: Lock,
    pub(super) hold: Arc<Hold>,
    /// The acquisition's holder number (in the lock's holds).
    pub(super) tid: u64,
    pub(super) released: bool,
}

impl fmt::Debug for AsyncLockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AsyncLockGuard")
            .field("name", &self.lock.name)
            .field("fencing_token", &self.hold.token())
            .field("lost", &(self.hold.state() == LOST))
            .finish_non_exhaustive()
    }
}

impl AsyncLockGuard {
    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.lock.name
    }

    /// The fencing token of this acquisition, as
    /// [`LockGuard::fencing_token`](crate::LockGuard::fencing_token).
    pub fn fencing_token(&self) -> u64 {
        self.hold.token()
    }

    /// True once the lease was lost, as
    /// [`LockGuard::is_lost`](crate::LockGuard::is_lost). No round trip.
    pub fn is_lost(&self) -> bool {
        self.hold.check_lost()
    }

    /// Unlocks; the future gives what [`LockGuard::unlock`] returns (`Err`
    /// with [`ErrorKind::LockLost`] when the lease was lost before). A
    /// transient error is retried within the command timeout, with the
    /// waits on the runtime's wheel.
    ///
    /// **Cancellation**: the unlock runs on redwheel's threads from the
    /// first poll on; dropping the future only drops its result.
    ///
    /// [`LockGuard::unlock`]: crate::LockGuard::unlock
    pub fn unlock_async(mut self) -> impl Future<Output = Result<(), Error>> + Send + 'static {
        self.released = true;
        let outcome = release_in_background(self.lock.clone(), Arc::clone(&self.hold), self.tid);
        async move {
            let outcome = outcome?;
            std::future::poll_fn(|cx| outcome.0.poll_fired(cx)).await;
            outcome.1.lock().take().unwrap_or_else(|| {
                Err(Error::new(ErrorKind::Protocol, "the unlock gave no result"))
            })
        }
    }
}

impl Drop for AsyncLockGuard {
    fn drop(&mut self) {
        if !self.released {
            self.released = true;
            // The result goes to the log (in `release_in_background`).
            let _ = release_in_background(self.lock.clone(), Arc::clone(&self.hold), self.tid);
        }
    }
}

/// Where a background unlock leaves its result.
type Outcome = Arc<(Cell, Mutex<Option<Result<(), Error>>>)>;

/// Unlocks `hold` (holder `tid`) on redwheel's threads: the local half now,
/// then `lock_release.lua`, sent again only after a failure that left it
/// unsent or unknown (the script is idempotent), within the command
/// timeout. An error nobody reads is logged.
fn release_in_background(lock: Lock, hold: Arc<Hold>, tid: u64) -> Result<Outcome, Error> {
    let Some(st) = lock.state.clone() else {
        return Err(lock.error(ErrorKind::InvalidName, "invalid lock name"));
    };
    let r = begin_release(&st, &hold, true, tid);
    let outcome: Outcome = Arc::default();
    let out = Arc::clone(&outcome);
    detach(async move {
        let result = send_release(&lock, &st, &hold, &r).await;
        if let Err(e) = &result
            && Arc::strong_count(&out) == 1
        {
            tracing::warn!(target: "redwheel::lock", lock = %lock.name, error = %e, "unlock of a dropped async guard failed");
        }
        *out.1.lock() = Some(result);
        out.0.fire();
    });
    Ok(outcome)
}

async fn send_release(
    lock: &Lock,
    st: &super::state::LockState,
    hold: &Hold,
    r: &Releasing,
) -> Result<(), Error> {
    let rt = Arc::clone(lock.rt());
    let release = Release::new(&st.keys, &hold.owner, r.token, r.left, &rt);
    let command = Command::script(&scripts::LOCK_RELEASE, &release.keys(), &release.args());
    let started = Instant::now();
    let mut backoff = Backoff::new(rt.options.reconnect_min, rt.options.reconnect_max);
    // Resent after a failure that left it unsent or unknown: the script's
    // release record tells a resend what an earlier attempt did.
    let reply = loop {
        let span = telemetry::lock_op_async("lock_release", &st.name);
        let reply = rt
            .call(&st.keys.lock, Access::Write, command.clone(), None)
            .await
            .and_then(|v| first_reply(v, Access::Write))
            .and_then(|v| {
                redis::from_redis_value::<i64>(v).map_err(|e| {
                    Error::new(ErrorKind::Protocol, "unexpected reply to lock_release.lua")
                        .with_cause(e)
                })
            });
        drop(span);
        match reply {
            Err(e) if e.is_transient() && started.elapsed() < rt.options.command_timeout => {
                rt.wait_for(&Arc::new(Cell::default()), Some(backoff.step()))
                    .await;
            }
            other => break other,
        }
    };
    release_outcome(lock, st, hold, r, reply)
}
