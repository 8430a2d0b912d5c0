//! One timeout's state: the slot that holds its state word, deadline and
//! (small) task, and the operations on it. Where slots live and how they
//! are freed is `pool.rs`; how a task is stored and run is `task.rs`.
//!
//! # A slot
//!
//! ```text
//!   word      u32   state (2 bits: INIT, CANCELLED, EXPIRED) | references << 2
//!   pos       u32   where the worker put it in the wheel (worker only)
//!   vtable    ptr   how to run or drop the task in `task`
//!   deadline  u64   ns on the timer's clock, or the delay it is still to be
//!                   added to ("unresolved": set once, then immutable)
//!   task      16 B  the task itself if it fits (size ≤ 16, align ≤ 8), else a Box of it
//! ```
//!
//! A deadline is the delay added to a clock reading taken no earlier than
//! the `new_timeout` call. Usually that is the call's own reading. A thread
//! scheduling in a tight loop reads the clock for only some of its calls
//! (`handle.rs`): the others leave the delay in the slot, *unresolved*,
//! and the first reading taken after them resolves it (the thread's next
//! time mark in its ring, or the worker's reading once it has claimed the
//! entry; see `worker.rs`), or the handle's own reading if `deadline()` is
//! asked first. Resolving is one compare-and-swap from the unresolved
//! value, so every reader sees the one deadline the timeout fires by.
//!
//! Forty bytes. The state moves only `INIT → CANCELLED` (a successful
//! `cancel`) or `INIT → EXPIRED` (the worker, before it runs the task): a
//! timeout fires at most once and never after a `cancel()` that returned
//! true. The task is in the slot exactly while the state is `INIT`: whoever
//! makes the move out of `INIT` takes it (to run it or to drop it).
//!
//! The references count the `Timeout` handles and the entries queued for
//! or held by the worker (its wheel, a queued cancellation). The last one
//! out frees the slot. One word carries both, so the worker's claim of an
//! expired timeout can also check that nobody else holds it, and a handle
//! that is the only reference frees its slot without a read-modify-write.
//!
//! While a slot is free, its task area holds the next free slot of its
//! pool's free list (`link_of`, `set_link`).

use std::fmt;
use std::mem::{MaybeUninit, size_of};
use std::ptr::{self, NonNull};
use std::time::Duration;

use super::sync::{AtomicU32, AtomicU64, Ordering, UnsafeCell, fence};
use super::wheel::{NOT_PLACED, Placed};

pub(crate) const ST_INIT: u32 = 0;
pub(crate) const ST_CANCELLED: u32 = 1;
pub(crate) const ST_EXPIRED: u32 = 2;
const STATE_MASK: u32 = 3;

/// One reference in the state word.
pub(crate) const REF: u32 = 4;

/// References at or above this abort the process (as `Arc`'s overflow
/// does): only leaking hundreds of millions of clones of one handle gets
/// there. The word counts up to `2^30 - 1`; half of that is the bound, so
/// that increments racing one another's check (each aborts after its own
/// `fetch_add`) cannot carry the count past what it holds, and the count
/// never wraps (a wrapped count would let a handle's drop free a slot the
/// wheel and other handles still point at).
pub(crate) const MAX_REFS: u32 = (u32::MAX / REF) / 2;

/// Bytes of a task stored in the slot itself; larger tasks are boxed.
pub(crate) const INLINE_TASK: usize = 16;

/// The task area: inline task bytes, a `Box` of a larger task, or (while
/// the slot is free) the next free slot.
pub(crate) type TaskArea = [MaybeUninit<usize>; INLINE_TASK / size_of::<usize>()];

/// How to run or drop the task stored in a slot (made by `task.rs` for
/// each task type).
pub(crate) struct TaskVTable {
    /// Moves the task out of `area` and runs it, with the slot's handle.
    pub(crate) run: unsafe fn(area: *mut TaskArea, slot: SlotRef),
    /// Drops the task in `area`.
    pub(crate) drop: unsafe fn(area: *mut TaskArea),
}

/// A timeout: see the module docs.
#[repr(C)]
pub(crate) struct Slot {
    word: AtomicU32,
    pos: UnsafeCell<u32>,
    vtable: UnsafeCell<*const TaskVTable>,
    deadline: AtomicU64,
    task: UnsafeCell<TaskArea>,
}

/// Marks a deadline field that holds a delay still to be added to a
/// reading (bit 63). On a timer whose clock lets deadlines wait for a
/// reading (`Clock::amortized`), resolved deadlines are below 2^63, or
/// [`NEVER`] (see [`deadline_after`]), so the two never meet; on the others
/// (a `ManualClock`) nothing is ever unresolved and deadlines take the
/// whole range.
const UNRESOLVED: u64 = 1 << 63;

/// Delays below this may be left unresolved (2^62 ns, 146 years), so that
/// an unresolved value never equals `NEVER`.
pub(crate) const MAX_UNRESOLVED_DELAY: u64 = 1 << 62;

/// The deadline meaning "never" (a delay too large to represent).
pub(crate) const NEVER: u64 = u64::MAX;

/// The deadline field of a timeout whose delay is `delay` ns (below
/// [`MAX_UNRESOLVED_DELAY`]), to be resolved by a later reading.
pub(crate) fn unresolved(delay: u64) -> u64 {
    debug_assert!(delay < MAX_UNRESOLVED_DELAY);
    UNRESOLVED | delay
}

fn is_unresolved(value: u64) -> bool {
    value >> 62 == 0b10
}

/// An unresolved delay added to `reading`: a deadline below 2^63, or
/// `NEVER` past it (never early: at worst it never fires, as a delay too
/// large to represent).
fn resolved(value: u64, reading: u64) -> u64 {
    match reading.checked_add(value & !UNRESOLVED) {
        Some(d) if d < UNRESOLVED => d,
        _ => NEVER,
    }
}

/// A deadline `delay` after `reading` on a timer that defers readings: a
/// resolved deadline never has bit 63 set unless it is `NEVER`, so that it
/// cannot be taken for an unresolved one (a deadline 2^63 ns, 292 years,
/// past the clock's origin counts as never).
pub(crate) fn deadline_after(reading: u64, delay: u64) -> u64 {
    match reading.checked_add(delay) {
        Some(d) if d < UNRESOLVED => d,
        _ => NEVER,
    }
}

#[cfg(not(redwheel_loom))]
const _: () = assert!(size_of::<Slot>() == 40);

/// The free-list link of a free slot.
///
/// # Safety
/// `slot` is free and its link was written before it was handed to us.
pub(crate) unsafe fn link_of(slot: *mut Slot) -> *mut Slot {
    // SAFETY: forwarded.
    unsafe { (*slot).task.with(|t| ptr::read(t.cast::<*mut Slot>())) }
}

/// Writes the free-list link of a dead slot.
///
/// # Safety
/// The slot is dead (or being initialised) and not shared.
pub(crate) unsafe fn set_link(slot: NonNull<Slot>, next: *mut Slot) {
    // SAFETY: the caller owns the slot's task area.
    unsafe {
        (*slot.as_ptr())
            .task
            .with_mut(|t| ptr::write(t.cast::<*mut Slot>(), next))
    };
}

fn state(word: u32) -> u32 {
    word & STATE_MASK
}

fn refs(word: u32) -> u32 {
    word / REF
}

/// Fills a freshly allocated slot: state `INIT`, `refs` references,
/// `deadline`, and the task (in `area`, to be run or dropped by `vtable`).
///
/// # Safety
/// `slot` is free and owned by the caller; `area` holds the task `vtable`
/// is for.
pub(crate) unsafe fn init(
    slot: NonNull<Slot>,
    deadline: u64,
    refs: u32,
    vtable: &'static TaskVTable,
    area: TaskArea,
) {
    let s = slot.as_ptr();
    // SAFETY: the caller owns the free slot; nothing else reads it until
    // it is published.
    unsafe {
        ptr::addr_of_mut!((*s).word).write(AtomicU32::new(ST_INIT | (refs * REF)));
        ptr::addr_of_mut!((*s).pos).write(UnsafeCell::new(NOT_PLACED));
        ptr::addr_of_mut!((*s).deadline).write(AtomicU64::new(deadline));
        ptr::addr_of_mut!((*s).vtable).write(UnsafeCell::new(vtable as *const TaskVTable));
        ptr::addr_of_mut!((*s).task).write(UnsafeCell::new(area));
    }
}

/// A pointer to a live slot, with the operations the worker and the
/// handles use. Copying it does not count a reference.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct SlotRef(pub(crate) NonNull<Slot>);

// SAFETY: a slot's shared parts are atomics or immutable while referenced;
// the task is `Send` and is only touched by the one who moved the state
// out of `INIT`; `pos` only by the worker.
unsafe impl Send for SlotRef {}
// SAFETY: as for `Send`.
unsafe impl Sync for SlotRef {}

impl fmt::Debug for SlotRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SlotRef({:p})", self.0)
    }
}

impl SlotRef {
    fn slot(&self) -> &Slot {
        // SAFETY: a `SlotRef` is only made for a slot that one of its
        // references keeps alive for as long as the `SlotRef` is used.
        unsafe { self.0.as_ref() }
    }

    pub(crate) fn word(&self) -> u32 {
        self.slot().word.load(Ordering::Acquire)
    }

    pub(crate) fn state(&self) -> u32 {
        state(self.word())
    }

    pub(crate) fn is_cancelled(&self) -> bool {
        self.state() == ST_CANCELLED
    }

    /// The references counted now.
    pub(crate) fn refs(&self) -> u32 {
        refs(self.word())
    }

    /// `INIT → CANCELLED` with two references, one of which (the entry the
    /// caller took back out of its ring) goes: for a timeout nobody else
    /// can reach (the caller holds its only handle, and the worker never
    /// saw it), so a plain store does. The caller then drops the task.
    pub(crate) fn cancel_alone(&self) {
        debug_assert_eq!(self.word(), ST_INIT | (2 * REF));
        self.slot()
            .word
            .store(ST_CANCELLED | REF, Ordering::Relaxed);
    }

    /// The deadline field: for the worker, resolved when it claimed the
    /// timeout (`resolve`), immutable since.
    pub(crate) fn deadline(&self) -> u64 {
        self.slot().deadline.load(Ordering::Relaxed)
    }

    /// The deadline if it is resolved, on a timer that defers readings
    /// (elsewhere every deadline is).
    pub(crate) fn resolved_deadline(&self) -> Option<u64> {
        let d = self.deadline();
        (!is_unresolved(d)).then_some(d)
    }

    /// Resolves the deadline with `reading` (taken no earlier than the
    /// `new_timeout` call) if it is still unresolved, and returns it: on a
    /// timer that defers readings only. Whoever resolves first sets it for
    /// good. The caller holds a reference; when it is the only one (no
    /// handle is left, and none can appear), no other thread reads or writes
    /// the field, and a plain store does.
    pub(crate) fn resolve(&self, reading: u64) -> u64 {
        let field = &self.slot().deadline;
        let mut d = field.load(Ordering::Relaxed);
        while is_unresolved(d) {
            let new = resolved(d, reading);
            if refs(self.word()) == 1 {
                field.store(new, Ordering::Relaxed);
                return new;
            }
            match field.compare_exchange_weak(d, new, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return new,
                Err(actual) => d = actual,
            }
        }
        d
    }

    /// Worker only.
    pub(crate) fn pos(&self) -> u32 {
        // SAFETY: only the worker thread reads or writes `pos`.
        self.slot().pos.with(|p| unsafe { *p })
    }

    /// Worker only.
    pub(crate) fn set_pos(&self, pos: u32) {
        // SAFETY: only the worker thread reads or writes `pos`.
        self.slot().pos.with_mut(|p| unsafe { *p = pos })
    }

    /// One more reference (a new handle, a queued cancellation).
    pub(crate) fn add_ref(&self) {
        let before = self.slot().word.fetch_add(REF, Ordering::Relaxed);
        if refs(before) >= MAX_REFS {
            std::process::abort();
        }
    }

    /// Drops one reference; true if it was the last (the caller then
    /// frees the slot: `pool.rs`). A reference known to be the only one is
    /// dropped without a read-modify-write.
    #[inline]
    pub(crate) fn drop_ref(self) -> bool {
        let word = &self.slot().word;
        let w = word.load(Ordering::Acquire);
        if refs(w) != 1 {
            let before = word.fetch_sub(REF, Ordering::Release);
            if refs(before) != 1 {
                return false;
            }
            fence(Ordering::Acquire);
        }
        true
    }

    /// Drops the task of a slot whose last reference went, if it is still
    /// there (state `INIT`: never claimed, e.g. a refused push). A panic in
    /// its drop is returned, so that the caller gives the slot's memory
    /// back first and then resumes it.
    ///
    /// # Safety
    /// No reference remains.
    pub(crate) unsafe fn drop_unclaimed_task(&self) -> std::thread::Result<()> {
        if self.state() != ST_INIT {
            return Ok(());
        }
        // SAFETY: state `INIT` means the task is in the slot; nobody else
        // can reach it.
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| unsafe { self.drop_task() }))
    }

    /// `INIT → CANCELLED`, adding `extra_refs` references in the same step.
    /// True if this call made the move; the caller must then drop the task.
    pub(crate) fn try_cancel(&self, extra_refs: u32) -> bool {
        let word = &self.slot().word;
        let mut w = word.load(Ordering::Relaxed);
        loop {
            if state(w) != ST_INIT {
                return false;
            }
            if refs(w) >= MAX_REFS {
                std::process::abort();
            }
            let new = ((w & !STATE_MASK) + extra_refs * REF) | ST_CANCELLED;
            match word.compare_exchange_weak(w, new, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return true,
                Err(actual) => w = actual,
            }
        }
    }

    /// `INIT → EXPIRED`, by the worker (which holds a reference). When
    /// that is the only reference nobody else can touch the word, and a
    /// plain store does.
    pub(crate) fn try_expire(&self) -> bool {
        let word = &self.slot().word;
        let mut w = word.load(Ordering::Acquire);
        loop {
            if state(w) != ST_INIT {
                return false;
            }
            if refs(w) == 1 {
                word.store(REF | ST_EXPIRED, Ordering::Relaxed);
                return true;
            }
            let new = (w & !STATE_MASK) | ST_EXPIRED;
            match word.compare_exchange_weak(w, new, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return true,
                Err(actual) => w = actual,
            }
        }
    }

    /// Runs the task (after this thread moved the state to `EXPIRED`),
    /// with this slot's handle.
    ///
    /// # Safety
    /// The caller made the `INIT → EXPIRED` move and runs the task once.
    pub(crate) unsafe fn run_task(&self) {
        let s = self.slot();
        // SAFETY: immutable while live.
        let vtable = s.vtable.with(|v| unsafe { *v });
        // SAFETY: the task is there (state was INIT) and ours to move out.
        s.task
            .with_mut(|area| unsafe { ((*vtable).run)(area, *self) });
    }

    /// Drops the task (after this thread moved the state out of `INIT`
    /// without running it, or while freeing a never-claimed slot).
    ///
    /// # Safety
    /// The caller owns the task (see `run_task`) and drops it once.
    pub(crate) unsafe fn drop_task(&self) {
        let s = self.slot();
        // SAFETY: immutable while live.
        let vtable = s.vtable.with(|v| unsafe { *v });
        // SAFETY: the task is there and ours to drop.
        s.task.with_mut(|area| unsafe { ((*vtable).drop)(area) });
    }

    /// The deadline as a `Duration`, for the worker (resolved).
    pub(crate) fn deadline_duration(&self) -> Duration {
        Duration::from_nanos(self.deadline())
    }
}

impl Placed for SlotRef {
    fn pos(&self) -> u32 {
        SlotRef::pos(self)
    }

    fn set_pos(&self, pos: u32) {
        SlotRef::set_pos(self, pos)
    }

    fn same(&self, other: &Self) -> bool {
        self == other
    }

    #[inline(always)]
    fn prefetch(&self) {
        super::prefetch::read(self.0.as_ptr());
    }
}
