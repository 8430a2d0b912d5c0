//! [`Lock`]: the handle on one lock name ([`Redwheel::lock`] makes one),
//! its settings, what it reads without taking the lock, and what every
//! operation on it shares.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::ctx::OnLost;
use super::hold::Hold;
use super::keys::validate_name;
use super::lease::{DEFAULT_WATCHDOG_LEASE, MAX_LEASE, MIN_WATCHDOG_LEASE, lease_ms};
use super::lost::{LeaseLost, LostCause};
use super::registry::{LockRegistry, LockStats};
use super::state::LockState;
use crate::error::{Access, Error, ErrorKind};
use crate::runtime::{Redwheel, Runtime, WaitReplicas, shut_down};
use crate::scripts;
use crate::telemetry;

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
            wait_replicas: None,
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
    pub(super) rw: Redwheel,
    pub(super) name: Arc<str>,
    pub(super) reg: Option<Arc<LockRegistry>>,
    pub(super) state: Option<Arc<LockState>>,
    pub(super) lease: Duration,
    pub(super) on_lost: Option<OnLost>,
    pub(super) wait_replicas: Option<WaitReplicas>,
}

impl fmt::Debug for Lock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lock")
            .field("name", &self.name)
            .field("watchdog_lease", &self.lease)
            .field("wait_replicas", &self.wait_replicas)
            .finish_non_exhaustive()
    }
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

    /// Fencing that survives a failover without relying on clocks: each
    /// acquisition (not a re-entry) through this handle is returned only
    /// once Redis confirms (`WAIT replicas timeout`, on the connection that
    /// ran the grant) that `replicas` replicas of the lock's master hold the
    /// grant: the lock itself and its fencing counter. When fewer confirm in
    /// time, the grant is refused: the lock is released and the attempt
    /// fails with [`ErrorKind::NotReplicated`] (transient: [`lock`] tries
    /// again, [`try_lock`] until its wait is over).
    ///
    /// With it, a failover that promotes one of the replicas that
    /// confirmed (with `replicas` equal to the number of replicas, any
    /// replica that was in sync) keeps both the lock and its counter: no
    /// second owner gets the lock from the failover alone, and every later
    /// token is greater than this one whatever the two hosts' clocks say.
    /// Without it, see the module docs: tokens then stay increasing across
    /// a failover only through the server clocks. Renewals are not waited
    /// for: a failover can shorten the lease left by up to one renewal
    /// period (lease / 3), which `is_lost` reports late, and the token
    /// still fences. A lock cannot be granted while fewer than `replicas`
    /// replicas are connected (right after a failover, until the old master
    /// is back as a replica).
    ///
    /// `timeout` is 1 ms ..= 60 s and must leave room within
    /// [`command_timeout`](crate::RedwheelOptions::command_timeout);
    /// otherwise (or with 0 replicas) taking the lock fails with
    /// [`ErrorKind::InvalidOption`]. The ACL user needs `+wait`.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use redwheel::Redwheel;
    ///
    /// let rw = Redwheel::connect_cluster(&["redis://10.0.0.1:7000"])?;
    /// let lock = rw.lock("ledger").wait_replicas(1, Duration::from_millis(500));
    /// let guard = lock.lock()?;   // the grant is on a replica too
    /// let token = guard.fencing_token();
    /// # let _ = token;
    /// # Ok::<(), redwheel::Error>(())
    /// ```
    ///
    /// [`lock`]: Lock::lock
    /// [`try_lock`]: Lock::try_lock
    pub fn wait_replicas(mut self, replicas: u32, timeout: Duration) -> Lock {
        self.wait_replicas = Some(WaitReplicas { replicas, timeout });
        self
    }

    /// Runs `f` once for each hold taken through this handle that is lost
    /// (see the module docs), on a thread of its own: never on the wheel or
    /// driver thread. Keep it short; a panic in it is caught and logged.
    ///
    /// ```no_run
    /// use redwheel::Redwheel;
    ///
    /// let rw = Redwheel::connect("redis://127.0.0.1:6379")?;
    /// let lock = rw.lock("leader").on_lost(|lost| {
    ///     eprintln!("lost {} (token {}): {}", lost.name(), lost.fencing_token(), lost.cause());
    /// });
    /// let guard = lock.lock()?;
    /// # drop(guard);
    /// # Ok::<(), redwheel::Error>(())
    /// ```
    pub fn on_lost(mut self, f: impl Fn(&LeaseLost) + Send + Sync + 'static) -> Lock {
        self.on_lost = Some(Arc::new(f));
        self
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
    ///
    /// ```no_run
    /// use redwheel::Redwheel;
    ///
    /// let rw = Redwheel::connect("redis://127.0.0.1:6379")?;
    /// // An operator clears a lock left by a wedged process.
    /// let was_held = rw.lock("inventory:42").force_unlock()?;
    /// # let _ = was_held;
    /// # Ok::<(), redwheel::Error>(())
    /// ```
    pub fn force_unlock(&self) -> Result<bool, Error> {
        Ok(self.force_release(None)? == 1)
    }

    /// Releases the lock only while `holder` holds the acquisition whose
    /// fencing token is `token` (what an operator saw: the dashboard's
    /// force-unlock); otherwise changes nothing.
    #[cfg(feature = "web")]
    pub(crate) fn force_unlock_held(
        &self,
        holder: &str,
        token: u64,
    ) -> Result<ForcedRelease, Error> {
        Ok(match self.force_release(Some((holder, token)))? {
            1 => ForcedRelease::Released,
            0 => ForcedRelease::NotHeld,
            _ => ForcedRelease::HeldByAnother,
        })
    }

    /// `lock_force_release.lua` (its reply), unconditional or for one
    /// holder and token; this process's holds it released (every one for
    /// an unconditional release) are marked lost.
    fn force_release(&self, only: Option<(&str, u64)>) -> Result<i64, Error> {
        let st = self.valid_state()?;
        let span = telemetry::lock_op("lock_force_release", &st.name);
        let n: i64 = self
            .rt()
            .run(&st.keys.lock, Access::Write, |con| {
                let mut inv = scripts::LOCK_FORCE_RELEASE.prepare_invoke();
                inv.key(&st.keys.lock).key(&st.keys.channel);
                if let Some((holder, token)) = only {
                    inv.arg(token).arg(holder);
                }
                inv.invoke(con)
            })
            .map_err(|e| self.wrap(e, "could not force the unlock"))?;
        drop(span);
        if only.is_none() || n == 1 {
            let holds: Vec<Arc<Hold>> = st.holds.lock().values().cloned().collect();
            for h in holds {
                if only.is_none_or(|(_, token)| h.token() == token) {
                    h.lose(LostCause::ForceUnlocked);
                }
            }
        }
        Ok(n)
    }

    pub(super) fn rt(&self) -> &Arc<Runtime> {
        self.rw.runtime()
    }

    pub(super) fn error(&self, kind: ErrorKind, what: &str) -> Error {
        Error::new(kind, format!("lock {:?}: {what}", self.name))
    }

    /// `e`, with the lock's name and what was being done in front.
    pub(super) fn wrap(&self, e: Error, what: &str) -> Error {
        Error::new(e.kind(), format!("lock {:?}: {what}", self.name)).with_cause(e)
    }

    pub(super) fn valid_state(&self) -> Result<&Arc<LockState>, Error> {
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

    pub(super) fn registry(&self) -> Result<&Arc<LockRegistry>, Error> {
        self.reg.as_ref().ok_or_else(|| {
            self.error(
                ErrorKind::InvalidName,
                "the name \"redwheel locks\" is in use by another kind of object",
            )
        })
    }

    pub(super) fn checked_watchdog_lease(&self) -> Result<Duration, Error> {
        self.checked_lease(self.lease, MIN_WATCHDOG_LEASE, "watchdog_lease")
    }

    pub(super) fn checked_lease(
        &self,
        lease: Duration,
        min: Duration,
        what: &str,
    ) -> Result<Duration, Error> {
        if lease < min || lease > MAX_LEASE {
            return Err(Error::new(
                ErrorKind::InvalidOption,
                format!("invalid option `{what}`: {lease:?} is not within {min:?} ..= 365 days"),
            ));
        }
        Ok(Duration::from_millis(lease_ms(lease)))
    }
}

/// What [`Lock::force_unlock_held`] found.
#[cfg(feature = "web")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ForcedRelease {
    /// The holder held it with that token: released.
    Released,
    /// Nobody holds it.
    NotHeld,
    /// Held, by another holder or another acquisition: left as it is.
    HeldByAnother,
}
