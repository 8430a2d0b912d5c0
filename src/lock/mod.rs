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
//! therefore not `Send`: it belongs to the thread that locked. With the
//! `async` feature, `Lock::lock_async` gives an `AsyncLockGuard`, which is
//! `Send` (a task may hold it across `.await` on any worker thread): each
//! async acquisition is an owner of its own, so it is not reentrant.
//!
//! Beside it, `redwheel:lock:{L}:fence` keeps the last fencing token handed
//! out, `redwheel:lock:{L}:unlock` is the channel releases are announced
//! on, and `redwheel:lock:{L}:released:<owner>:<token>` records, for a
//! little over twice the command timeout, that an unlock released that
//! hold: an unlock resent after a lost reply then tells "an earlier
//! attempt of mine released it" (`Ok`) from "it was gone or another
//! owner's" ([`ErrorKind::LockLost`]). All share the hash tag `{L}`: every
//! script touches one slot. The repository's `ARCHITECTURE.md` ("Redis keys and scripts")
//! lists every key with the scripts that write it.
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
//! extends a lock that changed hands. Each lock's renewal counts on its
//! own: on a cluster, a master that does not answer holds up no renewal of
//! a lock on another master. A renewal that fails (Redis down, an error
//! reply) is retried at once with backoff for as long as the lease may
//! last. The wheel thread only marks work due, and the driver runs
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
//! Every acquisition (not a re-entry) gets its token from the script that
//! grants it: `max(last + 1, server TIME in µs)`, where `last` is the
//! counter `redwheel:lock:{L}:fence`, which never expires. Exactly:
//!
//! * **On one master that keeps its data** (no restart, or a restart with
//!   the append-only file), tokens of one name strictly increase, whatever
//!   the clocks do: the counter does it.
//! * **After the counter was lost** (a restart without persistence) or
//!   **after a failover to a replica that had not received the last grants**
//!   (replication is asynchronous), the next token is greater than every
//!   earlier one only through the time term: only if the clock of the host
//!   that grants it reads later, in µs, than the last token handed out
//!   before (when that token came from the old host's clock: if the new
//!   host's clock is behind the old one's by less than the time from the
//!   last grant there to the first grant here).
//!   Clocks that step back, or a new master whose clock is behind by more
//!   than the failover took, can hand out a token that is not greater.
//! * **With [`Lock::wait_replicas`]**`(n, timeout)`, an acquisition is
//!   returned only once `WAIT` confirms that `n` replicas hold the grant
//!   (the lock and the counter); otherwise it is refused and the lock
//!   released ([`ErrorKind::NotReplicated`]). Then a failover that promotes
//!   one of those replicas (with `n` equal to the number of replicas: any
//!   replica that was in sync) keeps the counter, so tokens strictly
//!   increase across it without relying on any clock, and keeps the lock
//!   held, so the failover alone lets no second owner in. It does not
//!   cover a promoted replica that had not confirmed (`n` below the number
//!   of replicas), nor a replica that confirmed and then restarted without
//!   persistence. Renewals are not waited for, so a failover can shorten
//!   the lease left by up to one renewal period.
//!
//! A lease is a promise about time, and it can break: a holder paused
//! (GC, a stopped VM, swap) for longer than the lease wakes believing it
//! holds a lock that has lapsed; a Redis restart without persistence, or a
//! failover to a replica that had not yet received the acquisition
//! (replication is asynchronous; `wait_replicas` narrows this one to the
//! cases listed above), lets a second owner acquire while the first still
//! believes it holds. No client-side scheme closes these gaps
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
//!
//! [`ErrorKind::LockLost`]: crate::ErrorKind::LockLost
//! [`ErrorKind::NotReplicated`]: crate::ErrorKind::NotReplicated
//! [`Redwheel`]: crate::Redwheel

mod acquire;
#[cfg(feature = "async")]
mod acquire_async;
mod ctx;
mod guard;
#[cfg(feature = "async")]
mod guard_async;
mod handle;
mod hold;
pub mod inspect;
mod keys;
mod lease;
mod lost;
mod registry;
mod renewal;
mod state;
mod waiters;

pub use self::guard::LockGuard;
#[cfg(feature = "async")]
#[cfg_attr(docsrs, doc(cfg(feature = "async")))]
pub use self::guard_async::AsyncLockGuard;
#[cfg(feature = "web")]
pub(crate) use self::handle::ForcedRelease;
pub use self::handle::Lock;
pub use self::keys::MAX_NAME_LEN;
pub use self::lease::{DEFAULT_WATCHDOG_LEASE, MAX_LEASE, MIN_WATCHDOG_LEASE};
pub use self::lost::{LeaseLost, LostCause};
pub use self::registry::LockStats;
