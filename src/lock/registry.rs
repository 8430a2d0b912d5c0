//! The locks of one `Redwheel` ([`LockRegistry`]): the state of each lock
//! name, the subscribed unlock channels, the renewal groups, and
//! [`LockStats`].

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use super::ctx::LockCtx;
use super::hold::RenewalGroup;
use super::renewal::RenewalJob;
use super::state::LockState;
use crate::runtime::{Deadline, Runtime, Subscription};

/// What the locks of one [`Redwheel`] did so far (diagnostics, benchmarks).
///
/// [`Redwheel`]: crate::Redwheel
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockStats {
    /// Acquire scripts sent (attempts, including re-entries and retries).
    pub acquire_attempts: u64,
    /// Acquisitions and re-entries granted.
    pub acquired: u64,
    /// Threads in `lock` / `try_lock` now (waiting, or on their attempt).
    pub waiting: usize,
    /// Holds renewed by the watchdog now.
    pub watchdog_holds: usize,
    /// Renewal rounds that got their replies (one per group per period).
    pub renewal_rounds: u64,
    /// Holds renewed (one per hold per round).
    pub renewals: u64,
    /// Holds lost.
    pub lost: u64,
    /// The longest time between the sending of two consecutive confirmed
    /// renewals (or the acquisition and the first renewal) of one hold: the
    /// lease left at a renewal was at least `lease − this`.
    pub max_renewal_gap: Duration,
}

/// The locks of one runtime: shared by every `Lock` handle made from it.
pub(crate) struct LockRegistry {
    pub(super) ctx: Arc<LockCtx>,
    rt: Weak<Runtime>,
    locks: parking_lot::Mutex<LockTable>,
    channels: parking_lot::Mutex<HashMap<String, Arc<ChannelLink>>>,
    groups: parking_lot::Mutex<HashMap<u64, Arc<RenewalGroup>>>,
}

#[derive(Default)]
struct LockTable {
    by_name: HashMap<String, Weak<LockState>>,
    prune_at: usize,
}

/// A subscribed unlock channel and the lock state it wakes (replaced when a
/// lock's state is dropped and made again; the subscription stays).
struct ChannelLink {
    target: parking_lot::Mutex<Weak<LockState>>,
}

/// Name of the channel subscribed only to learn of reconnects (nothing is
/// published on it): after one, every renewal group runs at once.
const RECONNECT_PROBE: &str = "redwheel:lock:reconnect-probe";

impl LockRegistry {
    pub(super) fn get(rt: &Arc<Runtime>) -> Option<Arc<LockRegistry>> {
        let (reg, created) = rt.state("redwheel locks", || LockRegistry {
            ctx: Arc::new(LockCtx::new()),
            rt: Arc::downgrade(rt),
            locks: parking_lot::Mutex::new(LockTable::default()),
            channels: parking_lot::Mutex::new(HashMap::new()),
            groups: parking_lot::Mutex::new(HashMap::new()),
        })?;
        if created {
            let weak = Arc::downgrade(&reg);
            rt.subscriber.subscribe(
                RECONNECT_PROBE,
                Subscription {
                    on_message: Box::new(|_| {}),
                    on_subscribed: Box::new(move || {
                        if let Some(reg) = weak.upgrade() {
                            reg.renew_all_now();
                        }
                    }),
                },
            );
        }
        Some(reg)
    }

    /// The shared state of lock `name`.
    pub(super) fn state(&self, name: &str) -> Arc<LockState> {
        let mut t = self.locks.lock();
        if let Some(s) = t.by_name.get(name).and_then(Weak::upgrade) {
            return s;
        }
        let s = Arc::new(LockState::new(name));
        t.by_name.insert(name.to_owned(), Arc::downgrade(&s));
        if t.by_name.len() > t.prune_at {
            t.by_name.retain(|_, w| w.strong_count() > 0);
            t.prune_at = (t.by_name.len() * 2).max(1_024);
        }
        s
    }

    /// The renewal group of `lease`, registered with the driver on first
    /// use.
    pub(super) fn group(&self, rt: &Runtime, lease: Duration) -> Arc<RenewalGroup> {
        let mut groups = self.groups.lock();
        let ms = lease.as_millis() as u64;
        if let Some(g) = groups.get(&ms) {
            return Arc::clone(g);
        }
        let g = Arc::new(RenewalGroup::new(lease, Arc::clone(&self.ctx)));
        rt.driver.register(
            &g.key,
            Arc::new(RenewalJob::new(Arc::clone(&g))),
            Deadline::After(g.period()),
            None,
        );
        groups.insert(ms, Arc::clone(&g));
        g
    }

    /// Runs every non-empty renewal group now (after a reconnect: Redis may
    /// have restarted without our locks).
    pub(super) fn renew_all_now(&self) {
        let Some(rt) = self.rt.upgrade() else { return };
        let groups: Vec<Arc<RenewalGroup>> = self.groups.lock().values().cloned().collect();
        for g in groups {
            if g.len() > 0 {
                rt.driver.announce(&g.key, Deadline::Now);
            }
        }
    }

    /// Makes sure `state`'s unlock channel is subscribed.
    pub(super) fn subscribe(&self, rt: &Runtime, state: &Arc<LockState>) {
        if state.subscribed.swap(true, Ordering::AcqRel) {
            return;
        }
        let mut channels = self.channels.lock();
        if let Some(link) = channels.get(&state.keys.channel) {
            // Subscribed for an earlier state of this name: messages went
            // to that one until now, so everyone tries again once.
            *link.target.lock() = Arc::downgrade(state);
            drop(channels);
            state.waiters.wake_all();
            return;
        }
        let link = Arc::new(ChannelLink {
            target: parking_lot::Mutex::new(Arc::downgrade(state)),
        });
        channels.insert(state.keys.channel.clone(), Arc::clone(&link));
        drop(channels);
        let on_message = {
            let link = Arc::clone(&link);
            move |payload: &[u8]| {
                if let Some(st) = link.target.lock().upgrade() {
                    let token = std::str::from_utf8(payload)
                        .ok()
                        .and_then(|s| s.parse::<u64>().ok())
                        .unwrap_or(0);
                    st.waiters.released(token);
                }
            }
        };
        let on_subscribed = move || {
            if let Some(st) = link.target.lock().upgrade() {
                st.waiters.wake_all();
            }
        };
        rt.subscriber.subscribe(
            &state.keys.channel,
            Subscription {
                on_message: Box::new(on_message),
                on_subscribed: Box::new(on_subscribed),
            },
        );
    }

    pub(super) fn stats(&self) -> LockStats {
        let c = &self.ctx.counters;
        let watchdog_holds = self.groups.lock().values().map(|g| g.len()).sum();
        LockStats {
            acquire_attempts: c.acquire_attempts.load(Ordering::Relaxed),
            acquired: c.acquired.load(Ordering::Relaxed),
            waiting: c.waiting.load(Ordering::Relaxed),
            watchdog_holds,
            renewal_rounds: c.renewal_rounds.load(Ordering::Acquire),
            renewals: c.renewals.load(Ordering::Relaxed),
            lost: c.lost.load(Ordering::Relaxed),
            max_renewal_gap: Duration::from_nanos(c.max_renewal_gap_ns.load(Ordering::Relaxed)),
        }
    }
}
