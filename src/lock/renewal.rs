//! The watchdog: one renewal group per watchdog lease, run by the driver.
//!
//! A group is one driver job. Every `lease / 3` it renews every hold of
//! the group in one round: one `lock_renew.lua` call per hold, pipelined
//! with everything else due (10,000 locks, one round trip). Its reply for
//! each hold is "still yours, renewed" or "gone": the second marks the
//! hold lost. A failed round (Redis unreachable, an error reply) is
//! retried by the driver with backoff; while that lasts, a hold whose
//! lease may have run out (no renewal confirmed within one lease of the
//! last one's sending) is marked lost without waiting for Redis.
//!
//! A hold joins its group before its acquire script is sent (in the
//! `ACQUIRING` state, which renewals skip) and leaves it before its
//! release script is sent; a reply for a hold that left (or whose state
//! changed) in between is ignored. So a renewal can neither miss a fresh
//! lock nor outlive an unlock, and the renew script's owner and token
//! check means it never extends a lock that changed hands.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use parking_lot::Mutex;
use redis::Value;
use slab::Slab;

use super::LostCause;
use super::state::{HELD, Hold, LockCtx, now_ns, ns};
use crate::error::{Error, ErrorKind};
use crate::runtime::{Commands, Job, Next};
use crate::scripts;

/// A hold in the round on the wire, with its membership epoch then.
type Sent = (Arc<Hold>, u64);

/// The holds renewed with one watchdog lease.
pub(crate) struct RenewalGroup {
    pub lease: Duration,
    /// The driver's key of this group's job.
    pub key: String,
    members: Mutex<Slab<Arc<Hold>>>,
    /// The holds of the round on the wire, with their membership epoch,
    /// and when it was sent.
    inflight: Mutex<(u64, Vec<Sent>)>,
    /// A lease check is pending on the watcher thread.
    check_pending: AtomicBool,
    ctx: Arc<LockCtx>,
}

impl RenewalGroup {
    pub(crate) fn new(lease: Duration, ctx: Arc<LockCtx>) -> RenewalGroup {
        RenewalGroup {
            lease,
            key: format!("redwheel:lock-renewal:{}ms", lease.as_millis()),
            members: Mutex::new(Slab::new()),
            inflight: Mutex::new((0, Vec::new())),
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
        if !self.check_pending.swap(true, Ordering::AcqRel) {
            self.ctx.watch_group(at, Arc::downgrade(self));
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

    fn renew_command<'a>(&self, hold: &'a Hold) -> &'a [u8] {
        hold.renew_packed.get_or_init(|| {
            redis::cmd("EVALSHA")
                .arg(scripts::LOCK_RENEW.get_hash())
                .arg(1)
                .arg(&*hold.route)
                .arg(&hold.owner)
                .arg(hold.token())
                .arg(self.lease.as_millis() as u64)
                .get_packed_command()
        })
    }
}

/// The driver job of a [`RenewalGroup`].
pub(crate) struct RenewalJob(pub Arc<RenewalGroup>);

impl Job for RenewalJob {
    fn describe(&self) -> String {
        format!(
            "renewal of the locks with a {:?} watchdog lease",
            self.0.lease
        )
    }

    fn commands(&self, out: &mut Commands) {
        let group = &self.0;
        let sent = now_ns();
        let mut expired = Vec::new();
        let mut inflight = Vec::new();
        {
            let members = group.members.lock();
            inflight.reserve(members.len());
            for (_, hold) in members.iter() {
                if hold.state() != HELD {
                    continue; // still acquiring, or on its way out
                }
                if hold.expired(sent) {
                    expired.push(Arc::clone(hold));
                    continue;
                }
                out.push(hold.slot, group.renew_command(hold));
                inflight.push((Arc::clone(hold), hold.member_epoch.load(Ordering::Acquire)));
            }
        }
        *group.inflight.lock() = (sent, inflight);
        // Should this round hang, the watcher still marks the leases lost
        // in time.
        group.watch(
            sent.saturating_add(ns(group.lease))
                .saturating_add(1_000_000),
        );
        // No renewal was confirmed within a lease (Redis unreachable for
        // that long): the lock may be someone else's by now.
        for hold in expired {
            hold.lose(LostCause::Expired);
        }
    }

    fn scripts(&self) -> &[&'static redis::Script] {
        static SCRIPTS: LazyLock<[&'static redis::Script; 1]> =
            LazyLock::new(|| [&*scripts::LOCK_RENEW]);
        &*SCRIPTS
    }

    fn on_reply(&self, replies: &[Value]) -> Result<Next, Error> {
        let group = &self.0;
        let (sent, inflight) = std::mem::take(&mut *group.inflight.lock());
        if replies.len() != inflight.len() {
            return Err(Error::new(
                ErrorKind::Protocol,
                format!(
                    "{} replies to {} lock renewals",
                    replies.len(),
                    inflight.len()
                ),
            ));
        }
        let counters = &group.ctx.counters;
        counters.renewal_rounds.fetch_add(1, Ordering::Relaxed);
        let mut renewed = 0u64;
        let mut bad = None;
        for ((hold, epoch), reply) in inflight.iter().zip(replies) {
            if hold.member_epoch.load(Ordering::Acquire) != *epoch || hold.state() != HELD {
                continue; // left the group (unlocked) since it was sent
            }
            match reply {
                Value::Int(1) => {
                    renewed += 1;
                    hold.confirmed(sent, group.lease);
                    let last = hold.last_renewed.swap(sent, Ordering::AcqRel);
                    group.ctx.note_renewal_gap(sent.saturating_sub(last));
                }
                Value::Int(0) => {
                    hold.lose(LostCause::Gone);
                }
                other => bad = Some(format!("{other:?}")),
            }
        }
        counters.renewals.fetch_add(renewed, Ordering::Relaxed);
        group.ctx.metrics.renewals.add(renewed);
        tracing::trace!(target: "redwheel::lock", lease_ms = group.lease.as_millis() as u64, renewed, "lock renewal round");
        if let Some(reply) = bad {
            return Err(Error::new(
                ErrorKind::Protocol,
                format!("unexpected reply to lock_renew.lua: {reply}"),
            ));
        }
        Ok(if group.len() > 0 {
            // Every period from the last round's sending, not from its
            // reply: a round of 10,000 renewals takes Redis tens of ms,
            // which must not add up into the schedule.
            let took = Duration::from_nanos(now_ns().saturating_sub(sent));
            Next::After(
                group
                    .period()
                    .saturating_sub(took)
                    .max(Duration::from_millis(1)),
            )
        } else {
            Next::Idle
        })
    }
}

/// A lease in whole ms, at least 1.
pub(crate) fn lease_ms(lease: Duration) -> u64 {
    (ns(lease) / 1_000_000).max(1)
}
