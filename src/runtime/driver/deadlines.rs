//! The driver's registered work and its deadlines: one wheel timeout per
//! key (replaced only by an earlier deadline), the due list a round is
//! taken from, guard sweeps (which let a job probe instead of running in
//! full), and the wheel tasks that mark keys due.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use slab::Slab;

use super::backstop::Backstop;
use super::job::{Deadline, Job};
use super::stats::Counters;
use super::wake::Notifier;
use crate::runtime::server_clock::ServerClock;
use crate::telemetry::DriverMetrics;
use crate::timer::{HashedWheelTimer, Timeout};

/// What the driver's handle, its thread and the wheel tasks share.
pub(super) struct DriverShared {
    /// Itself, for the wheel tasks (weak: the wheel must not keep the
    /// driver alive).
    pub(super) me: Weak<DriverShared>,
    pub(super) timer: HashedWheelTimer,
    pub(super) server_clock: Arc<ServerClock>,
    pub(super) state: Mutex<State>,
    pub(super) notifier: Notifier,
    pub(super) stopping: AtomicBool,
    pub(super) clock_due: AtomicBool,
    pub(super) stats: Counters,
    /// The same events for the `metrics` feature (no-ops without it).
    pub(super) metrics: DriverMetrics,
}

/// Registered work. Entries live in a slab; everything on the hot path
/// (wheel tasks, sweeps, rounds) refers to them by slab index, checked by
/// epoch, and only registration and announcements look a key up by name.
#[derive(Default)]
pub(super) struct State {
    pub(super) entries: Slab<Entry>,
    pub(super) by_key: HashMap<Arc<str>, usize>,
    pub(super) due: VecDeque<usize>,
    /// Every armed deadline, earliest first, for the backstop: (at, slab
    /// index, epoch). Stale items (the deadline was replaced, fired or
    /// dropped) are skipped when they come up.
    pub(super) armed: Backstop,
    pub(super) guards: HashMap<Duration, Guard>,
    pub(super) next_epoch: u64,
}

pub(super) struct Entry {
    pub(super) key: Arc<str>,
    pub(super) job: Arc<dyn Job>,
    /// Tells this registration from an earlier one at the same slab index.
    pub(super) epoch: u64,
    pub(super) timeout: Option<Armed>,
    pub(super) marked: bool,
    pub(super) failures: u32,
    /// Its last round found a script missing and loaded it again.
    pub(super) reloaded: bool,
    /// Its guard group, and its place in the group's list.
    pub(super) guard: Option<(Duration, usize)>,
}

impl State {
    /// The entry at `index` if it is still the registration `epoch`.
    pub(super) fn live(&mut self, index: usize, epoch: u64) -> Option<&mut Entry> {
        self.entries.get_mut(index).filter(|e| e.epoch == epoch)
    }
}

pub(super) struct Armed {
    pub(super) at: Duration,
    pub(super) timeout: Timeout,
}

#[derive(Default)]
pub(super) struct Guard {
    pub(super) members: Vec<usize>,
    pub(super) timeout: Option<Timeout>,
}

impl DriverShared {
    /// Applies deadline `at` to the entry at `index` (which exists). True
    /// when it was marked due and the driver must be woken.
    pub(super) fn deadline(
        &self,
        st: &mut State,
        index: usize,
        at: Deadline,
        now: Duration,
    ) -> bool {
        let local = match at {
            Deadline::Now => None,
            Deadline::After(d) => Some(now.saturating_add(d)),
            // No estimate yet: run it and let its reply schedule it.
            Deadline::ServerMs(ms) => self.server_clock.to_local(ms, now),
        };
        match local {
            Some(t) if t > now => {
                self.arm_earlier(st, index, t, now);
                false
            }
            _ => mark_due(st, index),
        }
    }

    /// Makes sure the entry at `index` has a wheel timeout firing at `at`
    /// or earlier.
    pub(super) fn arm_earlier(&self, st: &mut State, index: usize, at: Duration, now: Duration) {
        let Some(entry) = st.entries.get_mut(index) else {
            return;
        };
        if let Some(a) = &entry.timeout {
            if a.at <= at {
                return;
            }
            a.timeout.cancel();
        }
        entry.timeout = None;
        // Never zero: a job that keeps asking for "now" through a deadline
        // runs once per tick at most, never in a busy loop.
        let delay = at.saturating_sub(now).max(Duration::from_micros(1));
        tracing::trace!(target: "redwheel::runtime", key = %entry.key, delay_us = delay.as_micros() as u64, "arm");
        let epoch = entry.epoch;
        let weak = Weak::clone(&self.me);
        match self
            .timer
            .new_timeout(delay, move |t: &Timeout| fire_key(&weak, index, epoch, t))
        {
            Ok(timeout) => {
                entry.timeout = Some(Armed { at, timeout });
                // A new earliest deadline: the driver thread, if it waits,
                // waits for a later one; have it look again.
                if st.armed.is_earliest(at) {
                    self.notifier.notify();
                }
                st.armed.push((at, index, epoch));
                if st.armed.len() > 4 * st.entries.len() + 1_024 {
                    compact_armed(st);
                }
            }
            Err(e) => {
                if !self.stopping.load(Ordering::Relaxed) {
                    tracing::warn!(
                        target: "redwheel::runtime",
                        key = %entry.key,
                        error = %e,
                        "could not schedule due work on the wheel; the guard sweep will run it"
                    );
                }
            }
        }
    }

    /// The earliest armed deadline, if any (stale items are dropped).
    pub(super) fn earliest_armed(&self) -> Option<Duration> {
        let mut st = self.state.lock();
        while let Some((at, index, epoch)) = st.armed.peek() {
            if is_armed_at(&st, index, epoch, at) {
                return Some(at);
            }
            st.armed.pop();
        }
        None
    }

    /// Runs the jobs whose deadline passed more than `grace` ago without
    /// the wheel firing them; true if it marked any.
    pub(super) fn backstop(&self, now: Duration, grace: Duration) -> bool {
        let mut st = self.state.lock();
        let mut marked = 0;
        while let Some((at, index, epoch)) = st.armed.peek() {
            if at.saturating_add(grace) > now {
                break;
            }
            st.armed.pop();
            if !is_armed_at(&st, index, epoch, at) {
                continue;
            }
            if let Some(a) = st.entries[index].timeout.take() {
                a.timeout.cancel();
            }
            if mark_due(&mut st, index) {
                marked += 1;
            }
        }
        if marked > 0 {
            tracing::debug!(
                target: "redwheel::runtime",
                jobs = marked,
                "the wheel did not fire these deadlines in time; the driver runs them"
            );
        }
        marked > 0
    }

    pub(super) fn mark_all_due(&self) {
        let mut st = self.state.lock();
        let all: Vec<usize> = st.entries.iter().map(|(i, _)| i).collect();
        for i in all {
            mark_due(&mut st, i);
        }
    }
}

/// True if the entry at `index` (registration `epoch`) has a timeout armed
/// for `at`.
fn is_armed_at(st: &State, index: usize, epoch: u64, at: Duration) -> bool {
    st.entries
        .get(index)
        .is_some_and(|e| e.epoch == epoch && e.timeout.as_ref().is_some_and(|a| a.at == at))
}

/// Rebuilds the backstop heap from the live timeouts only.
fn compact_armed(st: &mut State) {
    let live: Vec<(Duration, usize, u64)> = st
        .entries
        .iter()
        .filter_map(|(i, e)| e.timeout.as_ref().map(|a| (a.at, i, e.epoch)))
        .collect();
    st.armed.rebuild(live);
}

/// Puts the entry at `index` in the next round unless it is there already,
/// to run in full (a probe a sweep asked for, if any, is dropped). True if
/// it was added.
pub(super) fn mark_due(st: &mut State, index: usize) -> bool {
    match st.entries.get_mut(index) {
        Some(entry) => {
            entry.job.run_in_full();
            if entry.marked {
                return false;
            }
            entry.marked = true;
            st.due.push_back(index);
            true
        }
        None => false,
    }
}

/// A key's wheel timeout fired (on the wheel thread; the executor wakes the
/// driver at the end of the tick).
fn fire_key(weak: &Weak<DriverShared>, index: usize, epoch: u64, t: &Timeout) {
    let Some(shared) = weak.upgrade() else { return };
    let mut st = shared.state.lock();
    let Some(entry) = st.live(index, epoch) else {
        return;
    };
    if entry.timeout.as_ref().is_some_and(|a| a.timeout.ptr_eq(t)) {
        entry.timeout = None;
    }
    mark_due(&mut st, index);
}

/// Arms the recurring guard sweep of interval `every`.
pub(super) fn arm_guard(shared: &Arc<DriverShared>, every: Duration) -> Option<Timeout> {
    let weak = Arc::downgrade(shared);
    shared
        .timer
        .new_timeout(every, move |_: &Timeout| {
            let Some(shared) = weak.upgrade() else { return };
            let mut st = shared.state.lock();
            let st = &mut *st;
            let Some(group) = st.guards.get(&every) else {
                return;
            };
            // Members already marked run in full anyway; the others run
            // their probe if they have one (`Job::sweep`).
            for &i in &group.members {
                if let Some(entry) = st.entries.get_mut(i)
                    && !entry.marked
                {
                    entry.job.sweep();
                    entry.marked = true;
                    st.due.push_back(i);
                }
            }
            let next = arm_guard(&shared, every);
            if let Some(g) = st.guards.get_mut(&every) {
                g.timeout = next;
            }
        })
        .ok()
}

/// Arms the recurring clock refresh.
pub(super) fn arm_clock_refresh(shared: &Arc<DriverShared>, every: Duration) {
    let weak = Arc::downgrade(shared);
    let armed = shared.timer.new_timeout(every, move |_: &Timeout| {
        let Some(shared) = weak.upgrade() else { return };
        shared.clock_due.store(true, Ordering::Release);
        shared.notifier.notify();
        arm_clock_refresh(&shared, every);
    });
    if let Err(e) = armed {
        // Only a stopped wheel refuses (shutdown): nothing left to refresh.
        tracing::debug!(target: "redwheel::runtime", error = %e, "clock refresh not armed again");
    }
}
