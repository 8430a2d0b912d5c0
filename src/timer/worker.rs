//! The tick loop, run on the timer's worker thread.
//!
//! # Ground rules
//!
//! * Only this thread touches the [`Wheel`]; producers reach it through
//!   their rings (`ring.rs`, `producer.rs`).
//! * Tick `t` is processed once the clock reads at least the end of `t`
//!   (`start + (t+1)·tick`), so every timeout it fires has a deadline in the
//!   past: nothing fires early.
//! * Processing a tick: claim what the producers published, count out the
//!   cancellations among it (unlinking those timeouts), move at most
//!   [`TRANSFER_CAP`] new timeouts into buckets (never into a past bucket),
//!   then fire the due entries of the tick's bucket in FIFO order.
//!   Cancellations claimed outside a tick's processing (while skipping idle
//!   ticks) wait for the next one, so each is counted out at a tick
//!   boundary.
//! * Every slot the worker holds (in the wheel, in its batch of new
//!   timeouts, in its list of claimed cancellations) is one reference,
//!   released exactly once: after the task ran, when the cancellation is
//!   processed, or at exit.
//! * Ticks are processed one by one, in order, while there is work. When
//!   the rings are empty and nothing in the wheel can be due before tick
//!   `w`, the worker "dozes" until the end of `w` (forever when the wheel is
//!   empty) and then skips the ticks in between, which had nothing to do.
//!   Before dozing it sets `doze` and arms every producer (a
//!   compare-and-swap on its ring's word that fails if anything arrived);
//!   a producer whose push finds its ring armed claims the wake-up with a
//!   CAS on `doze` that also records when it happened, then wakes the
//!   worker. So nothing waits in a ring while the worker dozes. A worker
//!   woken that way stays awake until the current tick ends and transfers
//!   what arrived meanwhile then: a burst of new timeouts is moved into
//!   buckets tick by tick as it arrives, with one wake-up at most per tick.

use std::collections::VecDeque;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use super::clock::{Parker, nanos};
use super::entry::SlotRef;
use super::pool::{Frees, release, release_into};
use super::producer::Producer;
use super::ring::{Item, item_of};
use super::shared::{DOZE_AWAKE, DOZE_DOZING, DOZE_WOKEN_BASE, Shared};
use super::sync::{self, Ordering};
use super::task::{Job, borrowed_handle, catch_logged, drop_task_logged, run_task};
use super::timeout::Timeout;
use super::wheel::Wheel;

mod exit;

/// Most timeouts the worker moves from the pending queue into buckets per
/// tick, so that a producer adding in a tight loop cannot starve expiry.
pub const TRANSFER_CAP: usize = 100_000;

/// A timeout on its way to, or in, the wheel.
pub(crate) type Pending = SlotRef;

/// Deadline meaning "never" (a delay that overflowed).
const NEVER: u64 = u64::MAX;

struct Worker {
    shared: Arc<Shared>,
    wheel: Wheel<Pending>,
    /// The next tick to process.
    tick: u64,
    /// The worker's start time on the clock, in ns.
    start: u64,
    tick_ns: u64,
    /// Timeouts moved into buckets for the tick `tick` so far (the cap is
    /// per processed tick, including a transfer made on waking up).
    transferred: usize,
    /// New timeouts claimed and not yet placed, in order.
    batch: VecDeque<Pending>,
    /// Cancellations claimed and not yet counted out.
    cancels: Vec<Pending>,
    /// New timeouts of the ring being claimed whose deadlines wait for a
    /// reading (see `entry.rs`); empty between claims.
    unresolved: Vec<Pending>,
    /// Timeouts taken back unseen (see `ring.rs`), not yet counted out.
    unseen: u64,
    /// The producers, as of registry generation `generation`.
    producers: Vec<sync::Arc<Producer>>,
    generation: u64,
    /// Timeouts this worker counted out; published in
    /// `Shared::removed_by_worker`.
    removed: u64,
}

/// The worker thread's body. Once the timer shuts down, cancels the
/// timeouts that never ran (neither expired nor cancelled) and returns
/// those whose cancellation it won, for `stop()`.
pub(crate) fn run(shared: Arc<Shared>) -> Vec<Timeout> {
    /// Tells the clock the worker is gone however it leaves (a manual
    /// clock would otherwise wait for it to settle).
    struct Exit(Parker);
    impl Drop for Exit {
        fn drop(&mut self) {
            self.0.exit();
        }
    }
    let _exit = Exit(shared.parker.clone());
    shared.clock.attach(&shared.parker);
    let _ = shared.worker_id.set(thread::current().id());
    let start = nanos(shared.clock.now());
    shared.publish_start(start);
    let mut worker = Worker::new(shared, start);
    worker.run_loop();
    worker.finish()
}

/// The worker's exit alone, as `stop()` makes it happen, on a timer whose
/// worker never ran (the loom models play the worker's exit on the
/// calling model thread).
#[cfg(all(test, redwheel_loom))]
pub(crate) fn exit_for_model(shared: Arc<Shared>) -> Vec<Timeout> {
    Worker::new(shared, 0).finish()
}

impl Worker {
    fn new(shared: Arc<Shared>, start: u64) -> Worker {
        Worker {
            wheel: Wheel::new(shared.wheel_len),
            tick: 0,
            start,
            tick_ns: shared.tick_ns,
            transferred: 0,
            batch: VecDeque::new(),
            cancels: Vec::new(),
            unresolved: Vec::new(),
            unseen: 0,
            producers: Vec::new(),
            generation: u64::MAX,
            removed: 0,
            shared,
        }
    }

    /// Due tick of a deadline: the tick that contains it.
    fn due_tick(start: u64, tick_ns: u64, deadline: u64) -> u64 {
        if deadline == NEVER {
            u64::MAX
        } else {
            deadline.saturating_sub(start) / tick_ns
        }
    }

    /// When tick `t` ends, in ns on the clock; `None` if never.
    fn end_of(&self, t: u64) -> Option<u64> {
        t.checked_add(1)
            .and_then(|n| n.checked_mul(self.tick_ns))
            .and_then(|d| d.checked_add(self.start))
            .filter(|&e| e != u64::MAX)
    }

    #[inline(never)]
    fn run_loop(&mut self) {
        let shared = Arc::clone(&self.shared);
        // The tick during which new input woke us from a doze: until it
        // ends we stay awake (producers then push without waking us again),
        // and its transfer moves whatever arrived meanwhile.
        let mut awake_through: Option<u64> = None;
        loop {
            if shared.is_shutdown() {
                return;
            }
            let now = nanos(shared.clock.now());
            if let Some(end) = self.end_of(self.tick).filter(|&end| now >= end) {
                shared.tick_lag_ns.store(now - end, Ordering::Relaxed);
                self.process_tick(now);
                self.tick += 1;
                // Catching up after a jump of the clock: ticks that ended
                // with nothing due need no processing. Cancellations queued
                // meanwhile (by tasks) are for the very next tick. (The
                // rings are looked at only when there is a tick to skip.)
                let behind = self.end_of(self.tick).is_some_and(|end| now >= end);
                if behind {
                    self.collect();
                    if self.cancels.is_empty() && self.unseen == 0 {
                        self.skip_idle_ticks(now);
                    }
                }
                continue;
            }
            // The current tick is still running: sleep, as long as we can.
            self.refresh_producers();
            let has_input = !self.batch.is_empty()
                || !self.cancels.is_empty()
                || self.unseen > 0
                // SAFETY: this is the worker thread.
                || self.producers.iter().any(|p| unsafe { p.ring.has_input() });
            let next_due = self.wheel.next_due(self.tick).map(|t| t.max(self.tick));
            let wake_tick = if has_input || awake_through == Some(self.tick) {
                Some(self.tick)
            } else {
                next_due
            };
            // Something falls due when `wake_tick` ends: wake up on time.
            let precise = wake_tick.is_some() && next_due == wake_tick;
            let dozing = wake_tick != Some(self.tick);
            // Before dozing, arm every producer (each found with nothing
            // unclaimed): a producer pushing later sees the mark and wakes
            // us. One that pushed earlier makes us stay up instead, and so
            // does a producer registered since our list was made.
            let mut raced = false;
            if dozing {
                shared.doze.store(DOZE_DOZING, Ordering::SeqCst);
                for p in &self.producers {
                    // SAFETY: this is the worker thread.
                    unsafe { p.ring.set_doze() };
                }
                // One heavy fence for every ring (`ring.rs`): a push before
                // a mark shows in `has_input`, one after it sees the mark.
                sync::heavy_fence();
                raced = shared.generation.load(Ordering::SeqCst) != self.generation
                    // SAFETY: this is the worker thread.
                    || self.producers.iter().any(|p| unsafe { p.ring.has_input() });
            }
            if !raced && !shared.is_shutdown() {
                let deadline = wake_tick.and_then(|t| self.end_of(t));
                shared
                    .clock
                    .park(&shared.parker, deadline.map(Duration::from_nanos), precise);
            }
            let doze = shared.doze.swap(DOZE_AWAKE, Ordering::SeqCst);
            if dozing {
                for p in &self.producers {
                    // SAFETY: this is the worker thread.
                    unsafe { p.ring.disarm() };
                }
                // A producer or canceller that woke us did so at `woken_at`:
                // what it pushed belongs to that tick, even if the clock
                // moved on before we ran.
                let woken_at = doze.checked_sub(DOZE_WOKEN_BASE).unwrap_or(u64::MAX);
                // Only a worker that really slept may skip the ticks that
                // passed meanwhile. One that found a ring filled while it
                // was arming them has not looked at what arrived: maybe a
                // cancellation, which counts out at the end of the tick it
                // was made in, not of a later one.
                if !raced {
                    let now = nanos(shared.clock.now());
                    self.skip_idle_ticks(now.min(woken_at));
                }
                if woken_at != u64::MAX {
                    awake_through = Some(self.tick);
                }
            }
        }
    }

    /// Takes a fresh copy of the producer list if it changed.
    fn refresh_producers(&mut self) {
        let generation = self.shared.generation.load(Ordering::SeqCst);
        if generation != self.generation {
            let reg = self.shared.producers.lock();
            self.producers.clone_from(&reg.list);
            self.generation = self.shared.generation.load(Ordering::SeqCst);
        }
    }

    /// Claims what every producer published: new timeouts join the batch
    /// (their deadlines resolved: `entry.rs`), cancellations the list of
    /// those to count out at the next processed tick. Retires producers
    /// whose thread left them, once empty.
    fn collect(&mut self) {
        self.refresh_producers();
        let mut retire = false;
        let (batch, cancels, unresolved) =
            (&mut self.batch, &mut self.cancels, &mut self.unresolved);
        for p in &self.producers {
            // Read before claiming: an orphan pushes no more, so this claim
            // gets everything.
            let orphaned = p.is_orphaned();
            // SAFETY: this is the worker thread.
            let unseen = unsafe {
                p.ring.claim(|entry| match item_of(entry) {
                    Item::New(slot, deferred) => {
                        if deferred {
                            unresolved.push(slot);
                        }
                        batch.push_back(slot);
                    }
                    Item::Cancel(slot) => cancels.push(slot),
                    // Taken after every deferred timeout before it.
                    Item::Time(reading) => resolve_all(unresolved, reading),
                })
            };
            // The rest were pushed before the claim, hence before this.
            if !unresolved.is_empty() {
                resolve_all(unresolved, nanos(self.shared.clock.now()));
            }
            self.unseen += u64::from(unseen);
            retire |= orphaned;
        }
        if retire {
            let mut reg = self.shared.producers.lock();
            let mut retired_added = 0;
            reg.list.retain(|p| {
                let gone = p.is_orphaned() && {
                    // SAFETY: this is the worker thread.
                    !unsafe { p.ring.has_input() }
                };
                if gone {
                    // SAFETY: this is the worker thread.
                    retired_added += unsafe { p.ring.accepted() };
                }
                !gone
            });
            reg.retired_added += retired_added;
            self.shared.generation.fetch_add(1, Ordering::SeqCst);
            drop(reg);
            self.refresh_producers();
        }
    }

    /// Jumps over the ticks that ended before clock time `upto` with
    /// nothing due. New timeouts that arrived meanwhile may be due in any of
    /// them, so they go into the wheel first (within this tick's transfer
    /// cap); if some are still queued, no tick is skipped. Cancellations are
    /// left for the next processed tick, where Netty counts them out.
    fn skip_idle_ticks(&mut self, upto: u64) {
        let current = upto.saturating_sub(self.start) / self.tick_ns;
        if current <= self.tick {
            return;
        }
        // `upto` was read from the clock before this transfer started. If
        // the transfer saw the rings empty, whatever is queued now was pushed
        // after that reading, so its deadline is at or after `upto` and no
        // skipped tick can be its due tick. Only a transfer stopped by the
        // cap leaves timeouts that may be due earlier.
        if !self.transfer() {
            return;
        }
        let next_due = self.wheel.next_due(self.tick).unwrap_or(u64::MAX);
        self.tick = self.tick.max(current.min(next_due));
    }

    fn process_tick(&mut self, now: u64) {
        self.process_cancelled();
        let _ = self.transfer();
        self.expire(now);
        self.transferred = 0;
    }

    /// Counts out `n` timeouts: published before any task of theirs runs.
    fn count_out(&mut self, n: u64) {
        count_out(&self.shared, &mut self.removed, n);
    }

    /// Counts out the cancellations claimed so far and unlinks their
    /// timeouts.
    fn process_cancelled(&mut self) {
        self.collect();
        let counted = self.cancels.len() as u64 + std::mem::take(&mut self.unseen);
        let (start, tick_ns, tick) = (self.start, self.tick_ns, self.tick);
        let mut frees = Frees::new();
        for slot in self.cancels.drain(..) {
            // A timeout that already left the wheel (or has not entered it
            // yet: it waits in the batch, which drops it) is not placed.
            if let Some(placed) = self.wheel.remove(&slot, tick, |e| {
                Self::due_tick(start, tick_ns, e.deadline())
            }) {
                release_into(placed, &mut frees);
            }
            release_into(slot, &mut frees);
        }
        drop(frees);
        if counted > 0 {
            self.count_out(counted);
        }
    }

    /// Moves pending timeouts into buckets, at most `TRANSFER_CAP` for the
    /// current tick. Returns `true` if it found the rings empty, `false`
    /// if it stopped at the cap. (Out of line, as `expire`, so that profiles
    /// show the two apart; each runs once per tick.)
    #[inline(never)]
    fn transfer(&mut self) -> bool {
        self.collect();
        while self.transferred < TRANSFER_CAP {
            let Some(entry) = self.batch.pop_front() else {
                return true;
            };
            self.transferred += 1;
            if entry.is_cancelled() {
                // Its cancellation, queued too, counts it out.
                release(entry);
                continue;
            }
            let due = Self::due_tick(self.start, self.tick_ns, entry.deadline());
            if let Err(entry) = self.wheel.insert(entry, due, self.tick) {
                // 2^30 timeouts in one bucket: refuse this one loudly
                // rather than lose track of it.
                tracing::error!(
                    target: "redwheel::timer",
                    "the wheel is full; cancelling a timeout"
                );
                if entry.try_cancel(0) {
                    // SAFETY: we made the move out of `INIT`.
                    unsafe { drop_task_logged(entry) };
                    self.count_out(1);
                }
                release(entry);
            }
        }
        self.batch.is_empty()
    }

    /// Fires the due entries of the current tick's bucket.
    #[inline(never)]
    fn expire(&mut self, now: u64) {
        let (start, tick_ns, tick) = (self.start, self.tick_ns, self.tick);
        let tick_end = self.end_of(tick);
        let shared = &self.shared;
        let removed = &mut self.removed;
        let mut handed_over = false;
        // Each fired slot is released at once, while its memory is at hand
        // (a second pass over a large bucket would fetch every slot again).
        let mut frees = Frees::new();
        self.wheel.expire(
            tick,
            |e| Self::due_tick(start, tick_ns, e.deadline()),
            |e| {
                is_due(tick_end, e.deadline(), || {
                    Self::due_tick(start, tick_ns, e.deadline()) <= tick
                })
            },
            |entry| {
                debug_assert!(
                    entry.deadline() <= now,
                    "tick {tick} fires deadline {} at {now}",
                    entry.deadline()
                );
                match fire(shared, removed, entry) {
                    Fired::Here(done) => release_into(done, &mut frees),
                    Fired::HandedOver => handed_over = true,
                    Fired::No(entry) => release_into(entry, &mut frees),
                }
            },
        );
        drop(frees);
        if handed_over && let Some(executor) = &shared.executor {
            catch_logged(
                "the executor's end_of_tick",
                || None,
                || executor.end_of_tick(),
            );
        }
    }
}

/// Resolves the deferred deadlines in `list` with `reading`, taken after
/// their pushes, and empties it.
fn resolve_all(list: &mut Vec<Pending>, reading: u64) {
    for slot in list.drain(..) {
        slot.resolve(reading);
    }
}

/// Whether a deadline is due by the end of the tick that ends at
/// `tick_end` (see `Worker::end_of`): `due_tick(deadline) <= tick` without
/// the division, since the tick of a deadline is at most `tick` exactly when
/// the deadline comes before that tick's end (`NEVER` never does: `tick_end`
/// is below `u64::MAX`). `slow` answers for a tick that never ends.
fn is_due(tick_end: Option<u64>, deadline: u64, slow: impl FnOnce() -> bool) -> bool {
    match tick_end {
        Some(end) => deadline < end,
        None => slow(),
    }
}

/// Adds `n` to the worker's count of timeouts counted out (`removed`) and
/// publishes it; the only writer of `Shared::removed_by_worker`.
fn count_out(shared: &Shared, removed: &mut u64, n: u64) {
    *removed += n;
    shared.removed_by_worker.store(*removed, Ordering::Release);
    shared.unreserve(n as usize);
}

/// What [`fire`] did with a due entry.
enum Fired {
    /// Its task ran on this thread; the entry is returned for release.
    Here(Pending),
    /// Its task was handed to the executor (which may have rejected it),
    /// with the entry's reference.
    HandedOver,
    /// Its cancellation won the race; nothing ran. The entry is returned
    /// for release (its queued cancellation counts it out).
    No(Pending),
}

/// Claims a due entry and runs (or hands over) its task. An entry whose
/// cancellation won the race is dropped: its queued cancellation counts it
/// out. `removed` is the worker's count of timeouts counted out.
fn fire(shared: &Shared, removed: &mut u64, slot: Pending) -> Fired {
    if !slot.try_expire() {
        return Fired::No(slot);
    }
    // Counted out before the task runs (Netty's order).
    count_out(shared, removed, 1);
    match &shared.executor {
        None => {
            let handle = borrowed_handle(slot);
            run_task(&handle);
            Fired::Here(slot)
        }
        Some(executor) => {
            // A panic in `execute` is caught: the job, dropped as it
            // unwinds, drops the task (or the executor kept it).
            let deadline = Some(slot.deadline_duration());
            let mut rejected = None;
            catch_logged(
                "the executor's execute",
                || deadline,
                || {
                    rejected = executor.execute(Job::new(Timeout { slot })).err();
                },
            );
            if let Some(job) = rejected {
                tracing::warn!(
                    target: "redwheel::timer",
                    deadline = ?deadline,
                    "the executor rejected an expired timer task; it will not run"
                );
                catch_logged("a timer task's drop", || deadline, || drop(job));
            }
            Fired::HandedOver
        }
    }
}

#[cfg(all(test, not(redwheel_loom)))]
mod tests {
    use super::*;

    /// `is_due` agrees with the due tick's division for every deadline
    /// around the ends of a few ticks, with starts and tick lengths that do
    /// and do not divide evenly, and for `NEVER`.
    #[test]
    fn is_due_agrees_with_the_due_tick() {
        for start in [0u64, 7, 1_000_003] {
            for tick_ns in [1u64, 3, 1_000_000] {
                for tick in [0u64, 1, 2, 511, 512, 1_000] {
                    let end = (tick + 1)
                        .checked_mul(tick_ns)
                        .and_then(|d| d.checked_add(start))
                        .filter(|&e| e != u64::MAX);
                    let around = end.unwrap_or(u64::MAX - 2);
                    let deadlines = (around.saturating_sub(5)..around.saturating_add(5)).chain([
                        0,
                        start.saturating_sub(1),
                        start,
                        NEVER,
                    ]);
                    for deadline in deadlines {
                        let exact = Worker::due_tick(start, tick_ns, deadline) <= tick;
                        assert_eq!(
                            is_due(end, deadline, || exact),
                            exact,
                            "start {start} tick_ns {tick_ns} tick {tick} deadline {deadline}"
                        );
                    }
                }
            }
        }
    }
}
