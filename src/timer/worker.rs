//! The tick loop, run on the timer's worker thread.
//!
//! # Ground rules
//!
//! * Only this thread touches the [`Wheel`]; producers reach it through the
//!   inboxes (`inbox.rs`).
//! * Tick `t` is processed once the clock reads at least the end of `t`
//!   (`start + (t+1)·tick`), so every timeout it fires has a deadline in the
//!   past: nothing fires early.
//! * Processing a tick: drain the cancelled lists (unlink, count out), move
//!   at most [`TRANSFER_CAP`] pending timeouts into buckets (never into a past
//!   bucket), then fire the due entries of the tick's bucket in FIFO order.
//! * Ticks are processed one by one, in order, while there is work. When
//!   the inboxes are empty and nothing in the wheel can be due before tick
//!   `w`, the worker "dozes" until the end of `w` (forever when the wheel is
//!   empty) and then skips the ticks in between, which had nothing to do.
//!   Before dozing it sets `doze` and marks every inbox, each under its lock
//!   and found empty; a producer (or canceller) that pushes into a marked
//!   inbox claims the wake-up with a CAS on `doze` that also records when it
//!   happened, then wakes the worker. So nothing waits in an inbox while the
//!   worker dozes. A worker woken that way stays awake until the current
//!   tick ends and transfers what arrived meanwhile then: a burst of new
//!   timeouts is moved into buckets tick by tick as it arrives, with one
//!   wake-up at most per tick.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread;
use std::time::Duration;

use super::timeout::SharedTimeout;
use super::wheel::Wheel;
use super::{
    DOZE_AWAKE, DOZE_DOZING, DOZE_WOKEN_BASE, Job, Shared, TRANSFER_CAP, Timeout, nanos, run_task,
};

/// A timeout on its way to, or in, the wheel (its task travels inside).
pub(crate) type Pending = SharedTimeout;

/// Deadline meaning "never" (a delay that overflowed).
const NEVER: u64 = u64::MAX;

/// Capacity of the fired list kept between ticks; a larger one, left by a
/// burst, is released.
const FIRED_KEEP: usize = 4096;

/// Capacity of the spare vector kept for swapping into inboxes; a larger
/// one, left by a burst, is released so that a burst's memory does not
/// stay with the timer.
const SPARE_KEEP: usize = 1 << 16;

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
    /// Fired timeouts, released once the whole bucket has fired: freeing
    /// memory is kept off the path between one task and the next.
    fired: Vec<Pending>,
    /// New timeouts taken from an inbox and not yet placed, in reverse
    /// order (the next one is at the end). Left over when the transfer cap
    /// stopped a transfer.
    batch: Vec<Pending>,
    /// An empty vector (with capacity) to swap into an inbox.
    spare: Vec<Pending>,
    /// Timeouts this worker counted out; published in
    /// `Shared::removed_by_worker`.
    removed: u64,
}

/// The worker thread's body. Once the timer shuts down, cancels the
/// timeouts that never ran (neither expired nor cancelled) and returns
/// those whose cancellation it won, for `stop()`.
pub(crate) fn run(shared: Arc<Shared>) -> Vec<Timeout> {
    shared.clock.attach(&shared.parker);
    let _ = shared.worker_id.set(thread::current().id());
    let start = nanos(shared.clock.now());
    shared.publish_start(start);
    let mut worker = Worker {
        wheel: Wheel::new(shared.wheel_len),
        tick: 0,
        start,
        tick_ns: shared.tick_ns,
        transferred: 0,
        fired: Vec::new(),
        batch: Vec::new(),
        spare: Vec::new(),
        removed: 0,
        shared,
    };
    worker.run_loop();
    let leftovers = worker.collect_leftovers();
    let never_ran = worker.shared.cancel_all(leftovers);
    worker.shared.parker.exit();
    never_ran
}

impl Worker {
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
            if self.end_of(self.tick).is_some_and(|end| now >= end) {
                self.process_tick(now);
                self.tick += 1;
                // Catching up after a jump of the clock: ticks that ended
                // with nothing due need no processing. Cancellations queued
                // meanwhile (by tasks) are for the very next tick. (The
                // inboxes are looked at only when there is a tick to skip.)
                let behind = self.end_of(self.tick).is_some_and(|end| now >= end);
                if behind && !shared.inboxes.iter().any(|inbox| inbox.has_input().1) {
                    self.skip_idle_ticks(now);
                }
                continue;
            }
            // The current tick is still running: sleep, as long as we can.
            let has_input = !self.batch.is_empty()
                || shared.inboxes.iter().any(|inbox| {
                    let (pending, cancelled) = inbox.has_input();
                    pending || cancelled
                });
            let next_due = self.wheel.next_due(self.tick).map(|t| t.max(self.tick));
            let wake_tick = if has_input || awake_through == Some(self.tick) {
                Some(self.tick)
            } else {
                next_due
            };
            // Something falls due when `wake_tick` ends: wake up on time.
            let precise = wake_tick.is_some() && next_due == wake_tick;
            let dozing = wake_tick != Some(self.tick);
            // Before dozing, mark every inbox (each under its lock, each
            // found empty): a producer pushing later sees the mark and wakes
            // us. One that pushed earlier makes us stay up instead.
            let mut raced = false;
            if dozing {
                shared.doze.store(DOZE_DOZING, Ordering::SeqCst);
                raced = !shared.inboxes.iter().all(|inbox| inbox.arm());
            }
            if !raced && !shared.is_shutdown() {
                let deadline = wake_tick.and_then(|t| self.end_of(t));
                shared
                    .clock
                    .park(&shared.parker, deadline.map(Duration::from_nanos), precise);
            }
            let doze = shared.doze.swap(DOZE_AWAKE, Ordering::SeqCst);
            if dozing {
                for inbox in shared.inboxes.iter() {
                    inbox.disarm();
                }
                // A producer or canceller that woke us did so at `woken_at`:
                // what it pushed belongs to that tick, even if the clock
                // moved on before we ran.
                let woken_at = doze.checked_sub(DOZE_WOKEN_BASE).unwrap_or(u64::MAX);
                // Only a worker that really slept may skip the ticks that
                // passed meanwhile. One that found an inbox filled while it
                // was marking them has not looked at what arrived: maybe a
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
        // the transfer saw the queue empty, whatever is queued now was pushed
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

    /// Unlinks cancelled timeouts and counts them out.
    fn process_cancelled(&mut self) {
        let shared = Arc::clone(&self.shared);
        let mut spare = std::mem::take(&mut self.spare);
        let mut counted = 0;
        for inbox in shared.inboxes.iter() {
            counted += inbox.take_cancelled(&mut spare) + spare.len() as u64;
            for inner in spare.drain(..) {
                // A timeout that already left the wheel (or never entered
                // it) has no position: nothing to take out.
                drop(self.wheel.remove(&inner, self.tick, |e| {
                    Self::due_tick(self.start, self.tick_ns, e.deadline)
                }));
            }
        }
        self.spare = spare;
        self.release_big_spare();
        if counted > 0 {
            self.count_out(counted);
        }
    }

    fn release_big_spare(&mut self) {
        if self.spare.capacity() > SPARE_KEEP {
            self.spare = Vec::new();
        }
    }

    /// The next new timeout to place: from the batch in hand, else from
    /// the next inbox with any.
    fn next_pending(&mut self) -> Option<Pending> {
        if let Some(entry) = self.batch.pop() {
            return Some(entry);
        }
        let shared = Arc::clone(&self.shared);
        for inbox in shared.inboxes.iter() {
            if inbox.take_pending(&mut self.spare) {
                // The emptied batch (with its capacity) becomes the spare.
                std::mem::swap(&mut self.batch, &mut self.spare);
                self.release_big_spare();
                self.batch.reverse();
                return self.batch.pop();
            }
        }
        None
    }

    /// Moves pending timeouts into buckets, at most `TRANSFER_CAP` for the
    /// current tick. Returns `true` if it found the inboxes empty, `false`
    /// if it stopped at the cap. (Out of line, as `expire`, so that profiles
    /// show the two apart; each runs once per tick.)
    #[inline(never)]
    fn transfer(&mut self) -> bool {
        while self.transferred < TRANSFER_CAP {
            let Some(entry) = self.next_pending() else {
                return true;
            };
            self.transferred += 1;
            if entry.is_cancelled() {
                // Its cancellation, queued too, counts it out.
                continue;
            }
            let due = Self::due_tick(self.start, self.tick_ns, entry.deadline);
            match self.wheel.insert(entry, due, self.tick) {
                Ok(()) => {}
                Err(entry) => {
                    // 2^30 timeouts in one bucket: refuse this one loudly
                    // rather than lose track of it.
                    tracing::error!(
                        target: "redwheel::timer",
                        "the wheel is full; cancelling a timeout"
                    );
                    if entry.try_cancel() {
                        self.count_out(1);
                    }
                }
            }
        }
        false
    }

    /// Fires the due entries of the current tick's bucket.
    #[inline(never)]
    fn expire(&mut self, now: u64) {
        let (start, tick_ns, tick) = (self.start, self.tick_ns, self.tick);
        let shared = &self.shared;
        let fired = &mut self.fired;
        let removed = &mut self.removed;
        let mut handed_over = false;
        self.wheel.expire(
            tick,
            |e| Self::due_tick(start, tick_ns, e.deadline),
            |entry| {
                debug_assert!(
                    entry.deadline <= now,
                    "tick {tick} fires deadline {} at {now}",
                    entry.deadline
                );
                match fire(shared, removed, entry) {
                    Fired::Here(done) => fired.push(done),
                    Fired::HandedOver => handed_over = true,
                    Fired::No => {}
                }
            },
        );
        if handed_over && let Some(executor) = &shared.executor {
            executor.end_of_tick();
        }
        self.fired.clear();
        if self.fired.capacity() > FIRED_KEEP {
            self.fired = Vec::new();
        }
    }

    /// Takes every timeout that never ran out of the wheel and the pending
    /// queue, and counts out the cancellations still queued.
    fn collect_leftovers(&mut self) -> Vec<Pending> {
        let mut leftovers: Vec<Pending> = self.wheel.drain();
        leftovers.extend(self.batch.drain(..).rev());
        leftovers.extend(self.shared.close_inboxes());
        leftovers.retain(|e| !e.is_cancelled());
        leftovers
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
    /// Its task was handed to the executor (which may have rejected it).
    HandedOver,
    /// Its cancellation won the race; nothing ran.
    No,
}

/// Claims a due entry and runs (or hands over) its task. An entry whose
/// cancellation won the race is dropped: its queued cancellation counts it
/// out. `removed` is the worker's count of timeouts counted out.
fn fire(shared: &Shared, removed: &mut u64, inner: Pending) -> Fired {
    if !inner.try_expire() {
        return Fired::No;
    }
    // Counted out before the task runs (Netty's order).
    count_out(shared, removed, 1);
    let timeout = Timeout { inner, inbox: None };
    match &shared.executor {
        None => {
            run_task(&timeout);
            return Fired::Here(timeout.inner);
        }
        Some(executor) => {
            if let Err(job) = executor.execute(Job { timeout }) {
                tracing::warn!(
                    target: "redwheel::timer",
                    deadline = ?job.timeout().deadline(),
                    "the executor rejected an expired timer task; it will not run"
                );
                job.timeout.inner.discard_task();
            }
        }
    }
    Fired::HandedOver
}
