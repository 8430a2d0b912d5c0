//! Holds and the renewal groups they belong to: a hold's state machine,
//! and group membership (the renewal round itself is `renewal.rs`).
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

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use slab::Slab;

use super::ctx::{LeaseCheck, LockCtx, OnLost};
use super::lease::{now_ns, ns};
use super::lost::{LeaseLost, LostCause};

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
    /// A hold of lock `name` (whose commands go to `route`, in cluster
    /// slot `slot`) by `owner`, still acquiring.
    pub(crate) fn new(
        name: &Arc<str>,
        route: &Arc<str>,
        slot: u16,
        owner: String,
        on_lost: Option<OnLost>,
        ctx: Arc<LockCtx>,
    ) -> Hold {
        Hold {
            name: Arc::clone(name),
            route: Arc::clone(route),
            slot,
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

/// The holds renewed with one watchdog lease.
pub(crate) struct RenewalGroup {
    pub lease: Duration,
    /// The driver's key of this group's job.
    pub key: String,
    pub(super) members: Mutex<Slab<Arc<Hold>>>,
    /// A lease check is pending on the watcher thread.
    check_pending: AtomicBool,
    pub(super) ctx: Arc<LockCtx>,
}

impl RenewalGroup {
    pub(crate) fn new(lease: Duration, ctx: Arc<LockCtx>) -> RenewalGroup {
        RenewalGroup {
            lease,
            key: format!("redwheel:lock-renewal:{}ms", lease.as_millis()),
            members: Mutex::new(Slab::new()),
            check_pending: AtomicBool::new(false),
            ctx,
        }
    }

    /// How often the group renews.
    pub(crate) fn period(&self) -> Duration {
        self.lease / 3
    }

    /// Adds `hold` (a hold joins at most one group in its life).
    pub(crate) fn join(self: &Arc<Self>, hold: &Arc<Hold>) {
        let _ = hold.group.set(Arc::downgrade(self));
        let mut members = self.members.lock();
        if hold.member_index.load(Ordering::Acquire) != usize::MAX {
            return;
        }
        let index = members.insert(Arc::clone(hold));
        hold.member_index.store(index, Ordering::Release);
        hold.member_epoch.fetch_add(1, Ordering::AcqRel);
    }

    /// Removes `hold` if it is a member.
    pub(crate) fn leave(&self, hold: &Hold) {
        let mut members = self.members.lock();
        let index = hold.member_index.swap(usize::MAX, Ordering::AcqRel);
        if index != usize::MAX
            && members
                .get(index)
                .is_some_and(|h| std::ptr::eq(Arc::as_ptr(h), hold))
        {
            members.remove(index);
        }
        hold.member_epoch.fetch_add(1, Ordering::AcqRel);
    }

    /// Asks the watcher to check the leases at `at` (`now_ns`) unless a
    /// check is pending.
    pub(crate) fn watch(self: &Arc<Self>, at: u64) {
        // Under the members' mutex, as the watcher clears the pending
        // check under it after a scan that found nothing held: a hold that
        // became held before this call was seen by that scan (which then
        // keeps the check), or finds the check cleared and asks anew.
        let ask = {
            let _members = self.members.lock();
            !self.check_pending.swap(true, Ordering::AcqRel)
        };
        if ask {
            let group: Weak<RenewalGroup> = Arc::downgrade(self);
            self.ctx.watch_group(at, group as Weak<dyn LeaseCheck>);
        }
    }

    /// On the watcher thread: marks lost every hold whose lease may have
    /// run out with no renewal confirmed; returns when to look again (the
    /// earliest lease deadline left), or `None` (nothing held).
    pub(crate) fn expire_check(&self, now: u64) -> Option<u64> {
        let mut expired = Vec::new();
        let mut next: Option<u64> = None;
        {
            let members = self.members.lock();
            for (_, hold) in members.iter() {
                if hold.state() != HELD {
                    continue;
                }
                let until = hold.valid_until.load(Ordering::Acquire);
                if now > until {
                    expired.push(Arc::clone(hold));
                } else {
                    next = Some(next.map_or(until, |n| n.min(until)));
                }
            }
            if next.is_none() {
                #[cfg(test)]
                tests::before_clear();
                self.check_pending.store(false, Ordering::Release);
            }
        }
        for hold in expired {
            hold.lose(LostCause::Expired);
        }
        next.map(|n| n.saturating_add(1_000_000))
    }

    /// Members now.
    pub(crate) fn len(&self) -> usize {
        self.members.lock().len()
    }
}

impl LeaseCheck for RenewalGroup {
    fn expire_check(&self, now: u64) -> Option<u64> {
        RenewalGroup::expire_check(self, now)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::time::Duration;

    use super::*;

    type Hook = Box<dyn FnOnce() + Send>;

    /// Run by `expire_check` once it decided that nothing is held, before
    /// it clears its pending check (the moment a hold can become held).
    static BEFORE_CLEAR: std::sync::Mutex<Option<Hook>> = std::sync::Mutex::new(None);

    pub(super) fn before_clear() {
        let hook = BEFORE_CLEAR.lock().unwrap().take();
        if let Some(f) = hook {
            f();
        }
    }

    /// Issue 29, finding 8: the watcher finds no held hold and clears its
    /// pending check just as a new hold becomes held and asks for a
    /// check. The new hold must still be watched: its ask must not be
    /// swallowed by the check that is being cleared.
    #[test]
    fn a_hold_that_becomes_held_while_the_watcher_clears_its_check_is_still_watched() {
        let ctx = Arc::new(LockCtx::new());
        let group = Arc::new(RenewalGroup::new(Duration::from_secs(3), Arc::clone(&ctx)));
        let name: Arc<str> = Arc::from("w");
        let hold = Arc::new(Hold::new(
            &name,
            &name,
            0,
            "o".into(),
            None,
            Arc::clone(&ctx),
        ));
        group.join(&hold); // still acquiring
        // Far ahead: the watcher thread itself never runs these checks.
        let far = u64::MAX / 2;
        group.watch(far);
        let (g, h) = (Arc::clone(&group), Arc::clone(&hold));
        let (tx, rx) = mpsc::channel();
        let (done_tx, done) = mpsc::channel();
        *BEFORE_CLEAR.lock().unwrap() = Some(Box::new(move || {
            std::thread::spawn(move || {
                // The grant: held, then its lease watched.
                h.confirmed(now_ns(), Duration::from_secs(3));
                h.state.store(HELD, Ordering::Release);
                g.watch(far);
                let _ = tx.send(());
                let _ = done_tx.send(());
            });
            // Done at once unless it waits for the watcher's scan to end.
            let _ = rx.recv_timeout(Duration::from_millis(500));
        }));
        assert_eq!(
            group.expire_check(now_ns()),
            None,
            "nothing held at the scan"
        );
        done.recv_timeout(Duration::from_secs(30)).unwrap();
        assert!(
            group.check_pending.load(Ordering::Acquire),
            "the held hold is left with no lease check pending"
        );
    }
}
