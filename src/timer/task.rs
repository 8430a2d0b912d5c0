//! Tasks: how a task is stored in its slot and run, and the executor
//! that may run it elsewhere.
//!
//! A task of type `F` is stored in the slot itself when it fits (16 bytes,
//! alignment 8), else as a `Box<F>`; a vtable per `F` moves it out and
//! runs it, or drops it. Whoever moved the slot's state out of `INIT` owns
//! the task (`entry.rs`): the worker (to run it, or to hand it to the
//! executor as a [`Job`]) or a successful `cancel` (to drop it).
//!
//! User code run on the worker thread (a task, a task's drop, the
//! executor's methods) goes through [`catch_logged`]: a panic is caught and
//! logged, and the worker goes on.

use std::fmt;
use std::mem::{ManuallyDrop, MaybeUninit, align_of, size_of};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr::{self, NonNull};
use std::time::Duration;

use super::entry::{self, INLINE_TASK, Slot, SlotRef, TaskArea, TaskVTable};
use super::timeout::Timeout;

/// What [`HashedWheelTimer::new_timeout`](super::HashedWheelTimer::new_timeout)
/// runs: any `FnOnce(&Timeout)` that can be sent to another thread. Run at
/// most once, on expiry, with its timeout's handle; dropped without running
/// if cancelled or never due.
pub trait TimerTask: FnOnce(&Timeout) + Send + 'static {}

impl<F: FnOnce(&Timeout) + Send + 'static> TimerTask for F {}

/// Whether a task of type `F` is stored in the slot itself.
pub(crate) const fn fits_inline<F>() -> bool {
    size_of::<F>() <= INLINE_TASK && align_of::<F>() <= align_of::<usize>()
}

/// The vtable of `F` stored inline.
struct Inline<F>(F);

impl<F: TimerTask> Inline<F> {
    const VTABLE: TaskVTable = TaskVTable {
        run: Self::run,
        drop: Self::drop,
    };

    /// # Safety
    /// `area` holds an `F` (in `slot`); it is moved out.
    unsafe fn run(area: *mut TaskArea, slot: SlotRef) {
        // SAFETY: the caller promises an `F` there; reading moves it out.
        let task = unsafe { ptr::read(area.cast::<F>()) };
        task(&borrowed_handle(slot));
    }

    /// # Safety
    /// `area` holds an `F`; it is dropped.
    unsafe fn drop(area: *mut TaskArea) {
        // SAFETY: the caller promises an `F` there.
        unsafe { ptr::drop_in_place(area.cast::<F>()) };
    }
}

/// The vtable of `F` stored as a `Box<F>`.
struct Boxed<F>(F);

impl<F: TimerTask> Boxed<F> {
    const VTABLE: TaskVTable = TaskVTable {
        run: Self::run,
        drop: Self::drop,
    };

    /// # Safety
    /// `area` holds a `Box<F>` (in `slot`); it is moved out.
    unsafe fn run(area: *mut TaskArea, slot: SlotRef) {
        // SAFETY: the caller promises a `Box<F>` there.
        let task = unsafe { ptr::read(area.cast::<Box<F>>()) };
        task(&borrowed_handle(slot));
    }

    /// # Safety
    /// `area` holds a `Box<F>`; it is dropped.
    unsafe fn drop(area: *mut TaskArea) {
        // SAFETY: the caller promises a `Box<F>` there.
        unsafe { ptr::drop_in_place(area.cast::<Box<F>>()) };
    }
}

/// Fills a freshly allocated slot with `task` (see [`entry::init`]).
///
/// # Safety
/// `slot` is free and owned by the caller.
pub(crate) unsafe fn init_slot<F: TimerTask>(
    slot: NonNull<Slot>,
    deadline: u64,
    refs: u32,
    task: F,
) {
    let mut area: TaskArea = [MaybeUninit::uninit(); INLINE_TASK / size_of::<usize>()];
    let vtable: &'static TaskVTable = if fits_inline::<F>() {
        // SAFETY: `F` fits the area (size and alignment).
        unsafe { ptr::write(area.as_mut_ptr().cast::<F>(), task) };
        &Inline::<F>::VTABLE
    } else {
        // SAFETY: a `Box` fits the area.
        unsafe { ptr::write(area.as_mut_ptr().cast::<Box<F>>(), Box::new(task)) };
        &Boxed::<F>::VTABLE
    };
    // SAFETY: forwarded; `area` holds the task `vtable` is for.
    unsafe { entry::init(slot, deadline, refs, vtable, area) };
}

/// A handle that borrows the caller's reference to `slot` (not counted,
/// never dropped).
pub(crate) fn borrowed_handle(slot: SlotRef) -> ManuallyDrop<Timeout> {
    ManuallyDrop::new(Timeout { slot })
}

/// Runs expired tasks somewhere other than the worker thread.
///
/// By default a task runs on the timer's worker thread, so a slow task
/// delays every later timeout. Give the builder an executor (a thread pool,
/// a channel to one) and the worker only hands each expired [`Job`] over.
///
/// Any `Fn(Job) + Send + Sync` closure is an executor that never rejects.
///
/// Both methods run on the worker thread. A panic in either is caught and
/// logged (`tracing`, WARN), and the worker goes on: the job given to an
/// `execute` that panicked is dropped as the panic unwinds, which drops its
/// task (unless the executor kept the job), and the timeout stays expired.
/// A job kept by an `end_of_tick` that panicked is the executor's, to run
/// or drop later.
pub trait Executor: Send + Sync + 'static {
    /// Runs `job` now or later, on any thread. Returning `Err(job)` rejects
    /// it: the timer logs a warning and drops the job, whose timeout stays
    /// expired (Netty's behaviour for a rejecting executor).
    fn execute(&self, job: Job) -> Result<(), Job>;

    /// Called on the worker thread once it has handed over every job that
    /// expired in one tick (and only after a tick that handed over at least
    /// one). An executor that batches jobs releases its batch here, so that
    /// timeouts due in the same tick are run together. Does nothing by
    /// default.
    fn end_of_tick(&self) {}
}

impl<F> Executor for F
where
    F: Fn(Job) + Send + Sync + 'static,
{
    fn execute(&self, job: Job) -> Result<(), Job> {
        self(job);
        Ok(())
    }
}

/// An expired timeout and its task, handed to an [`Executor`]. Dropping
/// a job without running it drops the task.
pub struct Job {
    timeout: Timeout,
    /// The task is still in the timeout's slot.
    task: bool,
}

impl Job {
    pub(crate) fn new(timeout: Timeout) -> Job {
        Job {
            timeout,
            task: true,
        }
    }

    /// Runs the task. A panic in the task is caught and logged.
    pub fn run(mut self) {
        self.task = false;
        run_task(&self.timeout);
    }

    /// The expired timeout this job belongs to.
    pub fn timeout(&self) -> &Timeout {
        &self.timeout
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        if self.task {
            // SAFETY: the worker moved the timeout to EXPIRED and handed the
            // task to this job, which never ran it.
            unsafe { self.timeout.slot.drop_task() };
        }
    }
}

impl fmt::Debug for Job {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Job")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// Runs the timeout's task, catching and logging a panic.
/// Called once per expired timeout (by the worker, or by its [`Job`]), by
/// whoever holds its task.
#[inline]
pub(crate) fn run_task(timeout: &Timeout) {
    // SAFETY: the worker made the timeout EXPIRED and hands its task to
    // exactly one runner: itself, or the job (which runs it once).
    let run = || unsafe { timeout.slot.run_task() };
    catch_logged("a timer task", || Some(timeout.deadline()), run);
}

/// Runs user code on the worker thread (`who`: a task, its drop, the
/// executor), catching a panic and logging it at WARN with the deadline of
/// the timeout involved, if one is, so that the worker goes on. The
/// deadline is looked up only for the log line.
#[inline]
pub(crate) fn catch_logged(
    who: &str,
    deadline: impl FnOnce() -> Option<Duration>,
    f: impl FnOnce(),
) {
    if let Err(panic) = catch_unwind(AssertUnwindSafe(f)) {
        log_panic(who, deadline(), panic);
    }
}

/// The log line of a panic that `catch_logged` caught (out of the line of
/// the call that did not panic).
#[cold]
#[inline(never)]
fn log_panic(who: &str, deadline: Option<Duration>, panic: Box<dyn std::any::Any + Send>) {
    let what = panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-string panic payload".to_owned());
    tracing::warn!(
        target: "redwheel::timer",
        deadline = ?deadline,
        "{who} panicked: {what}"
    );
}

/// Drops a task the worker holds (a cancelled or refused timeout's),
/// catching and logging a panic of its `Drop`.
///
/// # Safety
/// As [`SlotRef::drop_task`]: the caller owns the task.
pub(crate) unsafe fn drop_task_logged(slot: SlotRef) {
    let deadline = || Some(slot.deadline_duration());
    // SAFETY: forwarded.
    catch_logged("a timer task's drop", deadline, || unsafe {
        slot.drop_task()
    });
}
