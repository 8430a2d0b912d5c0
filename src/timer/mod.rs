//! A hashed timing wheel with Netty's `HashedWheelTimer` semantics.
//!
//! # Model
//!
//! One timer owns one worker thread, started lazily by the first
//! [`new_timeout`](HashedWheelTimer::new_timeout) (or by
//! [`start`](HashedWheelTimer::start)). The wheel is a ring of `2^k`
//! buckets; the bucket of tick `t` is `t & (2^k - 1)`.
//!
//! * `new_timeout` never touches the wheel: it pushes the timeout onto its
//!   thread's own ring for this timer and returns its [`Timeout`] handle.
//! * `cancel` is a compare-and-swap on the timeout's state plus a
//!   cancellation pushed onto the calling thread's ring (or, when that
//!   thread pushed the timeout last and the worker has not taken it yet,
//!   taking it back out of the ring, which leaves a count for the worker).
//! * Tick `t` covers `[start + t·tick, start + (t+1)·tick)`. The worker
//!   processes it once it has ended: it takes what the rings hold, counts
//!   out the cancellations (unlinking those timeouts), moves at most
//!   100,000 new timeouts into buckets, and then fires, in FIFO order, every
//!   timeout of bucket `t & mask` whose deadline falls in tick `t` or
//!   earlier.
//!
//! A timeout therefore fires at most once, never before its deadline, never
//! after a `cancel()` that returned `true`, and normally within one tick
//! after its deadline (later only if the worker is kept busy by slow tasks
//! or by more than 100,000 new timeouts per tick).
//!
//! # Implementation
//!
//! In layers, following tokio's time driver; each file imports only the
//! ones listed before it:
//!
//! * `sync.rs`: the atomics, cells and locks (loom's under `--cfg redwheel_loom`,
//!   for the model checks in `loom.rs`) and the calling thread's id;
//!   `clock.rs`: the time source; `wheel.rs`: the wheel as a data structure
//!   in integer ticks (buckets are vectors of timeouts, each timeout
//!   recording its position), with no clock, thread or timeout in it.
//! * `entry.rs`: one timeout's slot: state word, references, deadline,
//!   task storage.
//! * `pool.rs`: where slots live (per-producer chunks) and how a slot goes
//!   back when its last reference does; `ring.rs`: the lock-free ring that
//!   carries new timeouts and cancellations to the worker.
//! * `producer.rs`: a thread's way into one timer (its ring and pool) and
//!   the timer's list of them; `local.rs`: the calling thread's producers.
//! * `timeout.rs`: the [`Timeout`] handle and `cancel`; `task.rs`: how a
//!   task is stored, run, or handed to an [`Executor`] as a [`Job`].
//! * `shared.rs`: the state the handles, timeouts and worker share.
//! * `worker.rs`: the tick loop, on the worker thread; `worker/exit.rs`:
//!   its exit when the timer stops (leftovers cancelled, rings closed).
//! * `handle.rs`: [`Builder`] and [`HashedWheelTimer`]: start,
//!   `new_timeout`, stop.
//!
//! Tests: `wheel/tests.rs` (the wheel alone), the `tests` modules of the
//! files above, `tests.rs` (across layers), `loom.rs` (model checks), and
//! `test_support.rs` (what the last two share).
//!
//! The fast path, per `new_timeout`: a 40-byte slot taken from the
//! calling thread's own pool (no lock, no allocator call), its deadline,
//! and a push onto the calling thread's own ring, whose one
//! read-modify-write also tells whether the worker sleeps. The deadline is
//! the delay after a clock reading (`Instant`: a `clock_gettime`, 35–40 ns
//! here, more than all the rest) taken no earlier than the call: the call's
//! own, except in a tight loop, where a thread's first 64 timeouts after
//! each claim of the worker read the clock and later ones leave the delay
//! in the slot for the first reading taken after their push (a time mark
//! the thread pushes after every 16 of them, the worker's own when it
//! claims them, or the handle's if `deadline()` is asked first; `entry.rs`).
//! Such a deadline is later than the call's own reading by at most 16
//! calls, or by the wait for the worker's claim for the last few of a
//! burst (its end of tick). Cancelling the timeout this thread pushed last,
//! before the worker claimed it, takes it back out of the ring, and when
//! no other handle exists needs no compare-and-swap on the slot.
//! The handle is a pointer to the slot, whose one word holds both the
//! state and a reference count; dropping a handle is one
//! read-modify-write (none when it is the last reference). Netty uses one
//! lock-free MPSC queue instead; in Rust that costs a contended
//! compare-and-swap per push when producers run in parallel. Each thread's
//! timeouts keep their order (SPEC HWT-W11 promises order per producer);
//! how two threads' timeouts due in the same tick interleave is not
//! specified. Timeouts are counted per producer (`added`) and by the worker
//! (`removed`), so no counter is shared by all producers either.
//!
//! Netty wakes up every tick. This worker processes every tick in order
//! while there is something to do, but when nothing can be due before some
//! later tick it sleeps until that tick (or forever, on an empty timer), and
//! a producer whose deadline comes earlier wakes it. An idle timer costs no
//! CPU.
//!
//! When timeouts fall due at the end of the tick it waits for, the worker
//! (on the real clock) sleeps until 50 µs before that instant, with 1 ns of
//! timer slack (Linux's default 50 µs would let every wake-up come that
//! late), and spins on the clock, without yielding, for the rest: a timed
//! sleep alone overshoots by the scheduler's and the VM's latency, which
//! would add to every timeout's lateness. That costs about 5 % of a core
//! while timeouts fall due every millisecond, and nothing while none are
//! due. (It used to sleep until 0.2 ms before and yield in a loop: a fifth
//! of a core, and a yield on a busy machine gives the CPU away for a whole
//! time slice, milliseconds late.)
//!
//! # Where redwheel differs from Netty
//!
//! * A stopped timer's `new_timeout` fails without leaking a pending count
//!   (Netty HWT-N03), and timeouts cancelled by `stop()` stop being counted
//!   (HWT-L09). A `new_timeout` that races with `stop()` fails, or has its
//!   timeout returned by `stop()`, instead of being stranded (HWT-L10).
//! * `ticks_per_wheel` above `2^30` is an error, not an allocation failure.
//! * A mis-placed timeout (Netty throws from the worker) cannot exist: the
//!   due tick is stored, and the worker only processes a tick after it ended.
//! * Cancelled timeouts are processed at the start of a tick (Netty 4.1's
//!   order), so `pending_timeouts()` drops by one at the next tick boundary.
//! * The worker thread is spawned on start, not created beforehand (Rust
//!   threads cannot exist unstarted).
//! * Timeouts due in the same tick fire in the order their thread scheduled
//!   them (HWT-W11's promise per producer). Netty's single queue also
//!   orders timeouts of different threads by when they reached it; here
//!   each thread has its own ring, and that interleaving is unspecified.
//! * A bucket visit does not walk timeouts due on later turns of the wheel
//!   (see `wheel.rs`), and the worker wakes up precisely at a tick end when
//!   something falls due (see above); Netty wakes every tick and walks the
//!   whole bucket.
//! * Tasks that panic are caught and logged with `tracing`; the worker goes
//!   on. So are the other panics of user code on the worker thread: an
//!   executor's `execute` or `end_of_tick`, and a task's `Drop` when the
//!   worker drops it (a job the executor rejected, the timeouts `stop()`
//!   cancels). Netty's `TimerTask.cancelled()` callback and `Timeout.timer()` /
//!   `task()` accessors have no equivalent: a cancelled task is dropped
//!   (implement `Drop` on what it captures to observe that).

mod clock;
mod entry;
mod handle;
mod local;
mod pool;
mod prefetch;
mod producer;
mod ring;
mod shared;
#[cfg(feature = "async")]
mod sleep;
mod sync;
mod task;
mod timeout;
mod wheel;
mod worker;

#[cfg(all(test, redwheel_loom))]
mod loom;
#[cfg(test)]
mod test_support;
#[cfg(all(test, not(redwheel_loom)))]
mod tests;

pub use self::clock::{Clock, ManualClock, SystemClock};
pub use self::handle::{
    Builder, HashedWheelTimer, INSTANCE_COUNT_LIMIT, MAX_TICKS_PER_WHEEL, MIN_TICK,
};
#[cfg(feature = "async")]
#[cfg_attr(docsrs, doc(cfg(feature = "async")))]
pub use self::sleep::Sleep;
pub use self::task::{Executor, Job, TimerTask};
pub use self::timeout::Timeout;
pub use self::worker::TRANSFER_CAP;
pub use crate::error::TimerError;
