//! The watchdog: one renewal group per watchdog lease, run by the driver.
//!
//! A group is one driver job. Every `lease / 3` it renews every hold of
//! the group in one round: one `lock_renew.lua` call per hold, pipelined
//! with everything else due (10,000 locks, one round trip; on a cluster,
//! one per master). Its reply for each hold is "still yours, renewed" or
//! "gone": the second marks the hold lost. Each hold's reply is applied on
//! its own: a renewal that failed (its master unreachable, an error reply)
//! holds up no other hold's, and the job is run again by the driver after
//! a backoff for the holds that were not confirmed. Such a retry leaves out
//! the holds renewed less than half a period ago, so it does not renew the
//! healthy holds again each time. While renewals fail, a hold
//! whose lease may have run out (no renewal confirmed within one lease of
//! the last one's sending) is marked lost without waiting for Redis.
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

use super::hold::{HELD, Hold, RenewalGroup};
use super::lease::{now_ns, ns};
use super::lost::LostCause;
use crate::error::{Error, ErrorKind};
use crate::runtime::{Commands, Job, Next, Replies};
use crate::scripts;

/// The driver job of a [`RenewalGroup`].
pub(crate) struct RenewalJob {
    group: Arc<RenewalGroup>,
    /// The last round left some holds unconfirmed (their master did not
    /// answer): the driver runs the job again soon, for those.
    retrying: AtomicBool,
    /// The holds of the round on the wire, with their membership epoch,
    /// and when it was sent.
    inflight: Mutex<(u64, Vec<Sent>)>,
}

impl RenewalJob {
    pub(crate) fn new(group: Arc<RenewalGroup>) -> RenewalJob {
        RenewalJob {
            group,
            retrying: AtomicBool::new(false),
            inflight: Mutex::new((0, Vec::new())),
        }
    }
}

/// A hold in the round on the wire, with its membership epoch then.
type Sent = (Arc<Hold>, u64);

/// The renewal command of `hold` in `group`, packed on first use.
fn renew_command<'a>(group: &RenewalGroup, hold: &'a Hold) -> &'a [u8] {
    hold.renew_packed.get_or_init(|| {
        redis::cmd("EVALSHA")
            .arg(scripts::LOCK_RENEW.get_hash())
            .arg(1)
            .arg(&*hold.route)
            .arg(&hold.owner)
            .arg(hold.token())
            .arg(group.lease.as_millis() as u64)
            .get_packed_command()
    })
}

impl Job for RenewalJob {
    fn describe(&self) -> String {
        format!(
            "renewal of the locks with a {:?} watchdog lease",
            self.group.lease
        )
    }

    fn commands(&self, out: &mut Commands) {
        let group = &self.group;
        let sent = now_ns();
        // A retry after some renewals failed leaves out the holds renewed
        // this recently (half a period): they were confirmed already.
        let fresh = if self.retrying.load(Ordering::Acquire) {
            ns(group.period()) / 2
        } else {
            0
        };
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
                if sent.saturating_sub(hold.last_renewed.load(Ordering::Acquire)) < fresh {
                    continue;
                }
                out.push(hold.slot, renew_command(group, hold));
                inflight.push((Arc::clone(hold), hold.member_epoch.load(Ordering::Acquire)));
            }
        }
        *self.inflight.lock() = (sent, inflight);
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
        self.on_replies(&Replies::new(replies, None))
    }

    fn on_replies(&self, replies: &Replies<'_>) -> Result<Next, Error> {
        let group = &self.group;
        let (sent, inflight) = std::mem::take(&mut *self.inflight.lock());
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
        let mut renewed = 0u64;
        let mut failed = None;
        for (i, (hold, epoch)) in inflight.iter().enumerate() {
            if hold.member_epoch.load(Ordering::Acquire) != *epoch || hold.state() != HELD {
                continue; // left the group (unlocked) since it was sent
            }
            match replies.get(i) {
                Ok(Value::Int(1)) => {
                    renewed += 1;
                    hold.confirmed(sent, group.lease);
                    let last = hold.last_renewed.swap(sent, Ordering::AcqRel);
                    group.ctx.note_renewal_gap(sent.saturating_sub(last));
                }
                Ok(Value::Int(0)) => {
                    hold.lose(LostCause::Gone);
                }
                Ok(other) => {
                    failed.get_or_insert_with(|| {
                        Error::new(
                            ErrorKind::Protocol,
                            format!("unexpected reply to lock_renew.lua: {other:?}"),
                        )
                    });
                }
                // Not renewed this time (its master unreachable, or
                // failing over): tried again after the driver's backoff,
                // and lost if that lasts a lease.
                Err(e) => {
                    failed.get_or_insert(e);
                }
            }
        }
        counters.renewals.fetch_add(renewed, Ordering::Relaxed);
        // After the round's renewals (Release; `lock_stats` reads it with
        // Acquire before them): a reader that sees the round sees them too.
        counters.renewal_rounds.fetch_add(1, Ordering::Release);
        group.ctx.metrics.renewals.add(renewed);
        tracing::trace!(target: "redwheel::lock", lease_ms = group.lease.as_millis() as u64, renewed, "lock renewal round");
        self.retrying.store(failed.is_some(), Ordering::Release);
        if let Some(e) = failed {
            return Err(e);
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
