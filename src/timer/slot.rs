//! Timeouts in memory: fixed-size slots, carved out of per-producer chunks,
//! each holding one timeout's state word, deadline and (small) task.
//!
//! # A slot
//!
//! ```text
//!   word      u32   state (2 bits: INIT, CANCELLED, EXPIRED) | references << 2
//!   pos       u32   where the worker put it in the wheel (worker only)
//!   vtable    ptr   how to run or drop the task in `task`
//!   deadline  u64   ns on the timer's clock (immutable while allocated)
//!   task      16 B  the task itself if it fits (size ≤ 16, align ≤ 8), else a Box of it
//! ```
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
//! # Chunks
//!
//! Slots come in 4 KiB chunks, aligned to 4 KiB (allocated a few at a
//! time, up to 64 KiB), that belong to one
//! producer (a thread's way into one timer, `inbox.rs`): a slot finds its
//! producer (and, through it, its timer) by masking its address, so it
//! needs no pointer of its own. The producer's thread takes slots from its
//! pool without synchronisation; a slot freed on another thread (the
//! worker, mostly) goes back onto the pool's remote list with one
//! compare-and-swap, and the owner takes that whole list in one swap when
//! its own runs dry. Chunks live as long as the pool: when the producer's
//! thread exits (or its timer is gone) the pool closes, and the last slot
//! freed after that frees the chunks.

use std::alloc::{Layout, alloc, dealloc, handle_alloc_error};
use std::fmt;
use std::mem::{ManuallyDrop, MaybeUninit, align_of, size_of};
use std::ptr::{self, NonNull};
use std::time::Duration;

use super::inbox::Producer;
use super::sync::{AtomicPtr, AtomicU32, AtomicUsize, Ordering, UnsafeCell, fence};

pub(crate) const ST_INIT: u32 = 0;
pub(crate) const ST_CANCELLED: u32 = 1;
pub(crate) const ST_EXPIRED: u32 = 2;
const STATE_MASK: u32 = 3;

/// One reference in the state word.
pub(crate) const REF: u32 = 4;

/// References above this abort the process (as `Arc` does): only leaking
/// hundreds of millions of clones of one handle gets there.
const MAX_REFS: u32 = u32::MAX / 2;

/// Bytes of a task stored in the slot itself; larger tasks are boxed.
const INLINE_TASK: usize = 16;

/// The task area: inline task bytes, a `Box` of a larger task, or (while
/// the slot is free) the next free slot.
type TaskArea = [MaybeUninit<usize>; INLINE_TASK / size_of::<usize>()];

/// How to run or drop the task stored in a slot.
pub(crate) struct TaskVTable {
    /// Moves the task out of `area` and runs it.
    run: unsafe fn(area: *mut TaskArea, timeout: &super::Timeout),
    /// Drops the task in `area`.
    drop: unsafe fn(area: *mut TaskArea),
}

/// A timeout: see the module docs.
#[repr(C)]
pub(crate) struct Slot {
    word: AtomicU32,
    pos: UnsafeCell<u32>,
    vtable: UnsafeCell<*const TaskVTable>,
    deadline: UnsafeCell<u64>,
    task: UnsafeCell<TaskArea>,
}

/// Bytes of a chunk; also its alignment, so that a slot's chunk is its
/// address rounded down.
const CHUNK: usize = 4096;

/// Bytes in front of a chunk's slots.
const CHUNK_HEADER: usize = 16;

/// Slots per chunk (102 of 40 bytes in normal builds).
pub(crate) const SLOTS_PER_CHUNK: usize = (CHUNK - CHUNK_HEADER) / size_of::<Slot>();

#[repr(C, align(4096))]
struct Chunk {
    /// The producer whose pool this chunk belongs to (immutable).
    owner: *const Producer,
    _reserved: usize,
    slots: [MaybeUninit<Slot>; SLOTS_PER_CHUNK],
}

const _: () = assert!(size_of::<Chunk>() == CHUNK && align_of::<Chunk>() == CHUNK);
const _: () = assert!(CHUNK_HEADER == 2 * size_of::<usize>());
#[cfg(not(loom))]
const _: () = assert!(size_of::<Slot>() == 40);

/// Marks the remote free list closed (slot addresses are 8-aligned).
const CLOSED: usize = 1;

/// A producer's supply of slots. The `local` part belongs to the
/// producer's thread; `remote` and `balance` are shared.
///
/// Counting, so that closing is O(1): the owner counts its allocations
/// and its own frees (plain counters); every free on another thread
/// subtracts one from `balance`. Closing adds `allocs - local_frees`, after
/// which `balance` is the number of slots still allocated, and the free
/// that brings it to zero releases the chunks. (Before the close it only
/// goes down, so it cannot reach zero early.)
pub(crate) struct Pool {
    /// Slots freed on other threads, an intrusive list through the task
    /// area, with `CLOSED` in the low bit once the pool closed.
    remote: AtomicPtr<Slot>,
    /// See above (two's complement).
    balance: AtomicUsize,
    /// Every block of chunks (its first chunk and its number of chunks),
    /// for the final release (published by `balance`).
    chunks: UnsafeCell<Vec<(NonNull<Chunk>, usize)>>,
    local: UnsafeCell<PoolLocal>,
}

struct PoolLocal {
    /// Slots freed on this thread (or taken from `remote`).
    free: *mut Slot,
    /// The chunk slots are bumped from, and the next index in it.
    bump: *mut Chunk,
    bump_next: usize,
    /// Chunks of the last block not used yet, from `block_next` on.
    block_next: *mut Chunk,
    block_left: usize,
    /// Slots handed out, and slots freed on this thread.
    allocs: usize,
    local_frees: usize,
    closed: bool,
}

// SAFETY: `local` is only touched by the owning producer's thread (the
// callers of the `unsafe fn`s below promise it); everything else is atomic
// or published through atomics with release/acquire.
unsafe impl Send for Pool {}
// SAFETY: as for `Send`.
unsafe impl Sync for Pool {}

impl Pool {
    pub(crate) fn new() -> Self {
        Pool {
            remote: AtomicPtr::new(ptr::null_mut()),
            balance: AtomicUsize::new(0),
            chunks: UnsafeCell::new(Vec::new()),
            local: UnsafeCell::new(PoolLocal {
                free: ptr::null_mut(),
                bump: ptr::null_mut(),
                bump_next: SLOTS_PER_CHUNK,
                block_next: ptr::null_mut(),
                block_left: 0,
                allocs: 0,
                local_frees: 0,
                closed: false,
            }),
        }
    }

    /// A free slot, uninitialised apart from its memory being reserved;
    /// `None` once the pool is closed (its timer is stopped or gone, or
    /// its thread left it: the caller answers `Stopped`). A closed pool
    /// hands out nothing: its counts were settled at the close, and its
    /// remote list holds the `CLOSED` mark, not a slot.
    ///
    /// # Safety
    /// Only the owner's thread may call this, with `owner` its producer,
    /// a pointer from `Arc::as_ptr` (the chunks keep a strong count of it:
    /// see `Producer::take_pool_ref`).
    pub(crate) unsafe fn alloc(&self, owner: *const Producer) -> Option<NonNull<Slot>> {
        self.local.with_mut(|l| {
            // SAFETY: owner thread only, no other borrow of `local` is live.
            let l = unsafe { &mut *l };
            if l.closed {
                return None;
            }
            l.allocs += 1;
            if l.free.is_null() && l.bump_next == SLOTS_PER_CHUNK {
                l.free = self.remote.swap(ptr::null_mut(), Ordering::Acquire);
            }
            if let Some(slot) = NonNull::new(l.free) {
                // SAFETY: a free slot's task area holds the next free slot,
                // written before it was published to us.
                l.free = unsafe { link_of(slot.as_ptr()) };
                return Some(slot);
            }
            if l.bump_next == SLOTS_PER_CHUNK {
                if l.block_left == 0 {
                    (l.block_next, l.block_left) = new_block(owner, self);
                }
                l.bump = l.block_next;
                // SAFETY: within the block (one past its end at most).
                l.block_next = unsafe { l.block_next.add(1) };
                l.block_left -= 1;
                // SAFETY: a fresh chunk of ours.
                unsafe { init_chunk(l.bump, owner) };
                l.bump_next = 0;
            }
            let index = l.bump_next;
            l.bump_next += 1;
            // SAFETY: `bump` is a live chunk and `index` is in bounds; the
            // pointer keeps the chunk's provenance.
            Some(unsafe { slot_at(l.bump, index) })
        })
    }

    /// Returns `slot` (dead: no references, task gone) to this pool.
    ///
    /// # Safety
    /// `slot` must come from this pool, be dead, and `on_owner` must be
    /// true only on the owner's thread.
    pub(crate) unsafe fn free(&self, slot: NonNull<Slot>, on_owner: bool) {
        if on_owner {
            let done = self.local.with_mut(|l| {
                // SAFETY: owner thread only.
                let l = unsafe { &mut *l };
                if l.closed {
                    return false;
                }
                // SAFETY: the slot is dead; its task area is ours.
                unsafe { set_link(slot, l.free) };
                l.free = slot.as_ptr();
                l.local_frees += 1;
                true
            });
            if done {
                return;
            }
        }
        // SAFETY: forwarded: a chain of one dead slot.
        unsafe { self.free_chain(slot, slot, 1) };
    }

    /// Returns `n` dead slots of this pool, linked from `first` to `last`
    /// through their task areas, from a thread other than the owner's
    /// (or after the close): one compare-and-swap and one subtraction.
    ///
    /// # Safety
    /// The slots are dead, come from this pool, and the chain is ours.
    pub(crate) unsafe fn free_chain(&self, first: NonNull<Slot>, last: NonNull<Slot>, n: usize) {
        let mut head = self.remote.load(Ordering::Relaxed);
        while head.addr() & CLOSED == 0 {
            // SAFETY: the chain is ours until the swap publishes it.
            unsafe { set_link(last, head) };
            match self.remote.compare_exchange_weak(
                head,
                first.as_ptr(),
                Ordering::Release,
                Ordering::Relaxed,
            ) {
                Ok(_) => break,
                Err(h) => head = h,
            }
        }
        // SAFETY: `n` slots were freed (into the list, or for good).
        unsafe { self.add_balance(n.wrapping_neg()) };
    }

    /// Closes the pool (its owner thread is leaving it for good, or its
    /// timer is gone): no slot is reused any more, and the last one freed
    /// releases the chunks and the pool's reference to its producer. A
    /// second call does nothing.
    ///
    /// # Safety
    /// Owner's thread only.
    pub(crate) unsafe fn close(&self) {
        let live = self.local.with_mut(|l| {
            // SAFETY: owner thread only.
            let l = unsafe { &mut *l };
            if l.closed {
                return None;
            }
            l.closed = true;
            l.free = ptr::null_mut();
            Some(l.allocs - l.local_frees)
        });
        let Some(live) = live else {
            return;
        };
        let closed = ptr::null_mut::<Slot>().with_addr(CLOSED);
        self.remote.swap(closed, Ordering::AcqRel);
        let chunks = self.chunks.with(|c| {
            // SAFETY: `chunks` is only written by the owner (here).
            unsafe { (*c).len() }
        });
        if chunks == 0 {
            return;
        }
        // SAFETY: the Release of this add publishes `chunks`.
        unsafe { self.add_balance(live) };
    }

    /// Adds `n` (mod 2^64) to `balance` and releases everything if that
    /// brings it to zero.
    unsafe fn add_balance(&self, n: usize) {
        let before = self.balance.fetch_add(n, Ordering::AcqRel);
        if before.wrapping_add(n) == 0 {
            // SAFETY: nobody else can reach the chunks any more.
            unsafe { self.release_chunks() };
        }
    }

    /// Frees every chunk and drops the pool's reference to its producer.
    unsafe fn release_chunks(&self) {
        fence(Ordering::Acquire);
        let chunks = self.chunks.with_mut(|c| {
            // SAFETY: the last user; see `add_balance`.
            unsafe { std::mem::take(&mut *c) }
        });
        let owner = chunks.first().map(|(c, _)| {
            // SAFETY: the chunk is live until freed below.
            unsafe { (*c.as_ptr()).owner }
        });
        for (c, n) in chunks {
            // SAFETY: allocated by `new_block` with this layout.
            unsafe { dealloc(c.as_ptr().cast(), block_layout(n)) };
        }
        if let Some(owner) = owner {
            // SAFETY: the chunks held one strong count of the producer,
            // taken in `new_chunk`; this may free it (and this pool).
            unsafe { Producer::release_pool_ref(owner) };
        }
    }
}

/// Most chunks allocated at once: blocks grow 1, 2, 4, ... up to this, so
/// that a producer that schedules little holds 4 KiB, and a busy one asks
/// the allocator for 64 KiB at a time (aligned allocations of one page
/// each would cost the allocator a page of slack apiece).
const MAX_BLOCK: usize = 16;

fn block_layout(chunks: usize) -> Layout {
    Layout::from_size_align(chunks * CHUNK, CHUNK).unwrap_or_else(|_| Layout::new::<Chunk>())
}

/// A new block of chunks for `pool`: its first chunk and its length.
fn new_block(owner: *const Producer, pool: &Pool) -> (*mut Chunk, usize) {
    let blocks = pool.chunks.with(|c| {
        // SAFETY: owner thread only (the caller, `alloc`).
        unsafe { (*c).len() }
    });
    let n = (1usize << blocks.min(4)).min(MAX_BLOCK);
    let layout = block_layout(n);
    // SAFETY: the layout has a non-zero size.
    let block = unsafe { alloc(layout) }.cast::<Chunk>();
    let Some(block) = NonNull::new(block) else {
        handle_alloc_error(layout)
    };
    pool.chunks.with_mut(|c| {
        // SAFETY: owner thread only (the caller, `alloc`).
        unsafe { (*c).push((block, n)) };
    });
    if blocks == 0 {
        // SAFETY: `owner` comes from `Arc::as_ptr` (see `alloc`).
        unsafe { Producer::take_pool_ref(owner) };
    }
    (block.as_ptr(), n)
}

/// Writes a fresh chunk's header.
///
/// # Safety
/// `chunk` is an unused chunk of one of `owner`'s blocks.
unsafe fn init_chunk(chunk: *mut Chunk, owner: *const Producer) {
    // SAFETY: allocated and suitably aligned; ours.
    unsafe {
        ptr::addr_of_mut!((*chunk).owner).write(owner);
        ptr::addr_of_mut!((*chunk)._reserved).write(0);
    }
}

/// The slot at `index` of `chunk`, keeping the chunk's provenance.
///
/// # Safety
/// `chunk` is live and `index < SLOTS_PER_CHUNK`.
unsafe fn slot_at(chunk: *mut Chunk, index: usize) -> NonNull<Slot> {
    // SAFETY: in bounds of the chunk allocation.
    let p = unsafe { ptr::addr_of_mut!((*chunk).slots).cast::<Slot>().add(index) };
    // SAFETY: derived from a non-null chunk pointer.
    unsafe { NonNull::new_unchecked(p) }
}

/// The free-list link of a free slot.
///
/// # Safety
/// `slot` is free and its link was written before it was handed to us.
unsafe fn link_of(slot: *mut Slot) -> *mut Slot {
    // SAFETY: forwarded.
    unsafe { (*slot).task.with(|t| ptr::read(t.cast::<*mut Slot>())) }
}

/// Writes the free-list link of a dead slot.
///
/// # Safety
/// The slot is dead (or being initialised) and not shared.
unsafe fn set_link(slot: NonNull<Slot>, next: *mut Slot) {
    // SAFETY: the caller owns the slot's task area.
    unsafe {
        (*slot.as_ptr())
            .task
            .with_mut(|t| ptr::write(t.cast::<*mut Slot>(), next))
    };
}

/// The producer whose pool `slot` came from.
pub(crate) fn owner_of(slot: NonNull<Slot>) -> *const Producer {
    let chunk = slot.as_ptr().map_addr(|a| a & !(CHUNK - 1)).cast::<Chunk>();
    // SAFETY: every slot lives in a chunk whose header was written at its
    // allocation and never changes; the pointer keeps the chunk's
    // provenance (slots are derived from it by `slot_at`).
    unsafe { (*chunk).owner }
}

fn state(word: u32) -> u32 {
    word & STATE_MASK
}

fn refs(word: u32) -> u32 {
    word / REF
}

/// Whether a task of type `F` is stored in the slot itself.
const fn fits_inline<F>() -> bool {
    size_of::<F>() <= INLINE_TASK && align_of::<F>() <= align_of::<usize>()
}

/// The vtable of `F` stored inline.
struct Inline<F>(F);

impl<F: FnOnce(&super::Timeout) + Send + 'static> Inline<F> {
    const VTABLE: TaskVTable = TaskVTable {
        run: Self::run,
        drop: Self::drop,
    };

    /// # Safety
    /// `area` holds an `F`; it is moved out.
    unsafe fn run(area: *mut TaskArea, timeout: &super::Timeout) {
        // SAFETY: the caller promises an `F` there; reading moves it out.
        let task = unsafe { ptr::read(area.cast::<F>()) };
        task(timeout);
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

impl<F: FnOnce(&super::Timeout) + Send + 'static> Boxed<F> {
    const VTABLE: TaskVTable = TaskVTable {
        run: Self::run,
        drop: Self::drop,
    };

    /// # Safety
    /// `area` holds a `Box<F>`; it is moved out.
    unsafe fn run(area: *mut TaskArea, timeout: &super::Timeout) {
        // SAFETY: the caller promises a `Box<F>` there.
        let task = unsafe { ptr::read(area.cast::<Box<F>>()) };
        task(timeout);
    }

    /// # Safety
    /// `area` holds a `Box<F>`; it is dropped.
    unsafe fn drop(area: *mut TaskArea) {
        // SAFETY: the caller promises a `Box<F>` there.
        unsafe { ptr::drop_in_place(area.cast::<Box<F>>()) };
    }
}

/// Fills a freshly allocated slot: state `INIT`, `refs` references,
/// `deadline`, and the task.
///
/// # Safety
/// `slot` is free and owned by the caller.
pub(crate) unsafe fn init<F>(slot: NonNull<Slot>, deadline: u64, refs: u32, task: F)
where
    F: FnOnce(&super::Timeout) + Send + 'static,
{
    let s = slot.as_ptr();
    // SAFETY: the caller owns the free slot; nothing else reads it until
    // it is published.
    unsafe {
        ptr::addr_of_mut!((*s).word).write(AtomicU32::new(ST_INIT | (refs * REF)));
        ptr::addr_of_mut!((*s).pos).write(UnsafeCell::new(super::wheel::NOT_PLACED));
        ptr::addr_of_mut!((*s).deadline).write(UnsafeCell::new(deadline));
        let vtable: *const TaskVTable = if fits_inline::<F>() {
            &Inline::<F>::VTABLE
        } else {
            &Boxed::<F>::VTABLE
        };
        ptr::addr_of_mut!((*s).vtable).write(UnsafeCell::new(vtable));
        let mut area: TaskArea = [MaybeUninit::uninit(); INLINE_TASK / size_of::<usize>()];
        if fits_inline::<F>() {
            ptr::write(area.as_mut_ptr().cast::<F>(), task);
        } else {
            ptr::write(area.as_mut_ptr().cast::<Box<F>>(), Box::new(task));
        }
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

    pub(crate) fn deadline(&self) -> u64 {
        // SAFETY: written at init, immutable while the slot is live.
        self.slot().deadline.with(|d| unsafe { *d })
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

    /// Drops one reference; the last one frees the slot (into its pool's
    /// local list on the producer's own thread, else its remote list). A
    /// reference known to be the only one is dropped without a
    /// read-modify-write.
    pub(crate) fn release(self) {
        let word = &self.slot().word;
        let w = word.load(Ordering::Acquire);
        if refs(w) != 1 {
            let before = word.fetch_sub(REF, Ordering::Release);
            if refs(before) != 1 {
                return;
            }
            fence(Ordering::Acquire);
        }
        // SAFETY: that was the last reference.
        unsafe { self.free() };
    }

    /// Drops one reference, as `release`, but a slot freed on another
    /// thread than its producer's goes into `frees`, which returns runs of
    /// slots of one pool with one compare-and-swap (the worker releases
    /// whole buckets this way).
    pub(crate) fn release_into(self, frees: &mut Frees) {
        let word = &self.slot().word;
        let w = word.load(Ordering::Acquire);
        if refs(w) != 1 {
            let before = word.fetch_sub(REF, Ordering::Release);
            if refs(before) != 1 {
                return;
            }
            fence(Ordering::Acquire);
        }
        let owner = owner_of(self.0);
        // SAFETY: the producer outlives its pool's chunks, hence this slot.
        let owner = unsafe { &*owner };
        if owner.is_current_thread() {
            // SAFETY: that was the last reference.
            unsafe { self.free() };
            return;
        }
        // SAFETY: the last reference: the task, if still here, is ours.
        let dropped = unsafe { self.drop_unclaimed_task() };
        frees.push(&owner.pool, self.0);
        if let Err(panic) = dropped {
            std::panic::resume_unwind(panic);
        }
    }

    /// Drops the task of a slot whose last reference is going, if it is
    /// still there (state `INIT`: never claimed, e.g. a refused push). A
    /// panic in its drop is returned, so that the caller returns the slot's
    /// memory first and then resumes it.
    ///
    /// # Safety
    /// No other reference remains.
    unsafe fn drop_unclaimed_task(&self) -> std::thread::Result<()> {
        if self.state() != ST_INIT {
            return Ok(());
        }
        // SAFETY: state `INIT` means the task is in the slot; nobody else
        // can reach it.
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| unsafe { self.drop_task() }))
    }

    /// Frees a slot nobody references any more.
    ///
    /// # Safety
    /// No references remain.
    unsafe fn free(self) {
        // SAFETY: no references remain.
        let dropped = unsafe { self.drop_unclaimed_task() };
        let owner = owner_of(self.0);
        // SAFETY: the producer outlives its pool's chunks, hence this slot.
        let owner = unsafe { &*owner };
        let on_owner = owner.is_current_thread();
        if on_owner && owner.is_closed() {
            // The timer is gone: stop reusing its slots, so that its chunks
            // go back to the allocator with the last of them (here, not in
            // the first `new_timeout` of the next timer).
            // SAFETY: this is the producer's thread.
            unsafe { owner.pool.close() };
        }
        // SAFETY: the slot is dead and comes from the pool.
        unsafe { owner.pool.free(self.0, on_owner) };
        if let Err(panic) = dropped {
            std::panic::resume_unwind(panic);
        }
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
    /// with `timeout` as its handle.
    ///
    /// # Safety
    /// The caller made the `INIT → EXPIRED` move and runs the task once.
    pub(crate) unsafe fn run_task(&self, timeout: &super::Timeout) {
        let s = self.slot();
        // SAFETY: immutable while live.
        let vtable = s.vtable.with(|v| unsafe { *v });
        // SAFETY: the task is there (state was INIT) and ours to move out.
        s.task
            .with_mut(|area| unsafe { ((*vtable).run)(area, timeout) });
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

    /// The deadline as a `Duration`.
    pub(crate) fn deadline_duration(&self) -> Duration {
        Duration::from_nanos(self.deadline())
    }

    /// A handle that borrows this reference (not counted, never dropped).
    pub(crate) fn borrowed_handle(&self) -> ManuallyDrop<super::Timeout> {
        ManuallyDrop::new(super::Timeout { slot: *self })
    }
}

/// A run of dead slots of one pool, being returned together (see
/// `SlotRef::release_into`). Flushed when a slot of another pool comes, and
/// on drop.
pub(crate) struct Frees {
    pool: *const Pool,
    first: *mut Slot,
    last: *mut Slot,
    n: usize,
}

impl Frees {
    pub(crate) fn new() -> Self {
        Frees {
            pool: ptr::null(),
            first: ptr::null_mut(),
            last: ptr::null_mut(),
            n: 0,
        }
    }

    fn push(&mut self, pool: &Pool, slot: NonNull<Slot>) {
        if !ptr::eq(self.pool, pool) {
            self.flush();
            self.pool = pool;
            self.last = slot.as_ptr();
        }
        // SAFETY: the slot is dead and ours.
        unsafe { set_link(slot, self.first) };
        self.first = slot.as_ptr();
        self.n += 1;
    }

    /// Returns the run collected so far to its pool.
    pub(crate) fn flush(&mut self) {
        if let (Some(first), Some(last)) = (NonNull::new(self.first), NonNull::new(self.last)) {
            // SAFETY: the run's slots are dead and keep their pool (and
            // its producer) alive until this returns them.
            unsafe { (*self.pool).free_chain(first, last, self.n) };
        }
        self.pool = ptr::null();
        self.first = ptr::null_mut();
        self.last = ptr::null_mut();
        self.n = 0;
    }
}

impl Drop for Frees {
    fn drop(&mut self) {
        self.flush();
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering as O};
    use std::sync::{Arc, Weak};

    use super::*;
    use crate::timer::inbox::{Producer, thread_id};

    /// Counts runs and drops of the task it is captured in.
    #[derive(Default)]
    struct Tally {
        ran: AtomicUsize,
        dropped: AtomicUsize,
    }

    struct Guard(Arc<Tally>);

    impl Drop for Guard {
        fn drop(&mut self) {
            self.0.dropped.fetch_add(1, O::SeqCst);
        }
    }

    /// A task of about `N` bytes that counts its run and its drop.
    fn task<const N: usize>(
        t: &Arc<Tally>,
    ) -> impl FnOnce(&super::super::Timeout) + Send + 'static {
        let guard = Guard(Arc::clone(t));
        let pad = [7u8; N];
        move |_| {
            std::hint::black_box(pad);
            guard.0.ran.fetch_add(1, O::SeqCst);
        }
    }

    fn producer() -> Arc<Producer> {
        Arc::new(Producer::new(Weak::new(), thread_id()))
    }

    fn new_slot<F>(p: &Arc<Producer>, refs: u32, f: F) -> SlotRef
    where
        F: FnOnce(&super::super::Timeout) + Send + 'static,
    {
        // SAFETY: this thread owns `p`; the slot is fresh.
        let slot = SlotRef(unsafe { p.pool.alloc(Arc::as_ptr(p)) }.expect("an open pool"));
        unsafe { init(slot.0, 42, refs, f) };
        slot
    }

    #[test]
    fn small_tasks_live_in_the_slot_and_large_ones_in_a_box() {
        assert!(fits_inline::<[usize; 2]>());
        assert!(!fits_inline::<[usize; 3]>());
        assert!(!fits_inline::<u128>(), "alignment above the slot's");
        assert_eq!(std::mem::size_of::<Slot>(), 40);
        assert_eq!(SLOTS_PER_CHUNK, 102);
    }

    #[test]
    fn an_expired_task_runs_once_and_is_dropped_once_inline_or_boxed() {
        let p = producer();
        let small = Arc::new(Tally::default());
        let large = Arc::new(Tally::default());
        for (slot, t) in [
            (new_slot(&p, 1, task::<1>(&small)), &small),
            (new_slot(&p, 1, task::<64>(&large)), &large),
        ] {
            assert_eq!(slot.deadline(), 42);
            assert!(slot.try_expire());
            assert!(!slot.try_cancel(0), "expired is final");
            let handle = slot.borrowed_handle();
            // SAFETY: this test made the move to EXPIRED, once.
            unsafe { slot.run_task(&handle) };
            slot.release();
            assert_eq!(t.ran.load(O::SeqCst), 1);
            assert_eq!(t.dropped.load(O::SeqCst), 1);
        }
        // SAFETY: this thread owns the pool.
        unsafe { p.pool.close() };
        assert_eq!(
            Arc::strong_count(&p),
            1,
            "the chunks let go of the producer"
        );
    }

    #[test]
    fn a_cancelled_task_is_dropped_by_the_canceller_and_never_runs() {
        let p = producer();
        let t = Arc::new(Tally::default());
        let slot = new_slot(&p, 2, task::<8>(&t));
        assert!(slot.try_cancel(1));
        assert!(!slot.try_cancel(1), "a second cancel loses");
        assert!(!slot.try_expire(), "cancelled is final");
        // SAFETY: the cancel above won.
        unsafe { slot.drop_task() };
        assert_eq!(t.dropped.load(O::SeqCst), 1);
        for _ in 0..3 {
            slot.release();
        }
        assert_eq!(t.ran.load(O::SeqCst), 0);
        assert_eq!(
            t.dropped.load(O::SeqCst),
            1,
            "freeing does not drop it again"
        );
        // SAFETY: this thread owns the pool.
        unsafe { p.pool.close() };
        assert_eq!(Arc::strong_count(&p), 1);
    }

    #[test]
    fn a_never_claimed_slot_drops_its_task_when_its_last_reference_goes() {
        let p = producer();
        let t = Arc::new(Tally::default());
        let slot = new_slot(&p, 2, task::<24>(&t));
        slot.add_ref();
        slot.release();
        slot.release();
        assert_eq!(t.dropped.load(O::SeqCst), 0, "one reference is left");
        slot.release();
        assert_eq!(t.dropped.load(O::SeqCst), 1);
        assert_eq!(t.ran.load(O::SeqCst), 0);
        unsafe { p.pool.close() };
    }

    #[test]
    fn freed_slots_are_reused_and_the_chunks_go_with_the_last_slot_after_close() {
        let p = producer();
        let t = Arc::new(Tally::default());
        let first: Vec<SlotRef> = (0..250).map(|_| new_slot(&p, 1, task::<1>(&t))).collect();
        let addrs: std::collections::BTreeSet<usize> =
            first.iter().map(|s| s.0.addr().get()).collect();
        for s in first {
            s.release();
        }
        let again: Vec<SlotRef> = (0..250).map(|_| new_slot(&p, 1, task::<1>(&t))).collect();
        assert!(
            again.iter().all(|s| addrs.contains(&s.0.addr().get())),
            "freed slots come back before new ones are carved"
        );
        let (keep, rest) = again.split_at(1);
        for s in rest {
            s.release();
        }
        // SAFETY: this thread owns the pool.
        unsafe { p.pool.close() };
        assert_eq!(Arc::strong_count(&p), 2, "one slot still holds the chunks");
        keep[0].release();
        assert_eq!(Arc::strong_count(&p), 1, "released with the last slot");
        assert_eq!(t.dropped.load(O::SeqCst), 500);
    }

    #[test]
    fn a_never_claimed_task_whose_drop_panics_still_gives_its_slot_back() {
        struct Bomb;
        impl Drop for Bomb {
            fn drop(&mut self) {
                panic!("a task's drop panicked");
            }
        }
        let p = producer();
        let bomb = Bomb;
        let slot = new_slot(&p, 1, move |_| drop(bomb));
        let released = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| slot.release()));
        assert!(released.is_err(), "the panic reaches the caller");
        // SAFETY: this thread owns the pool.
        unsafe { p.pool.close() };
        assert_eq!(
            Arc::strong_count(&p),
            1,
            "the slot came back, so the chunks went"
        );
    }

    #[test]
    fn a_closed_pool_hands_out_no_slot() {
        let p = producer();
        let t = Arc::new(Tally::default());
        let live = new_slot(&p, 1, task::<1>(&t));
        // SAFETY: this thread owns the pool.
        unsafe { p.pool.close() };
        // SAFETY: as above.
        assert!(unsafe { p.pool.alloc(Arc::as_ptr(&p)) }.is_none());
        // A slot freed on another thread after the close does not come back.
        std::thread::scope(|s| {
            s.spawn(|| live.release());
        });
        assert!(unsafe { p.pool.alloc(Arc::as_ptr(&p)) }.is_none());
        assert_eq!(
            Arc::strong_count(&p),
            1,
            "the last slot released the chunks"
        );
        assert_eq!(t.dropped.load(O::SeqCst), 1);
    }

    #[test]
    fn slots_freed_on_other_threads_go_back_to_their_pool() {
        let p = producer();
        let t = Arc::new(Tally::default());
        let slots: Vec<SlotRef> = (0..150).map(|_| new_slot(&p, 1, task::<1>(&t))).collect();
        let addrs: std::collections::BTreeSet<usize> =
            slots.iter().map(|s| s.0.addr().get()).collect();
        std::thread::scope(|s| {
            let (a, b) = slots.split_at(75);
            s.spawn(move || {
                let mut frees = Frees::new();
                for slot in a {
                    slot.release_into(&mut frees);
                }
            });
            s.spawn(move || {
                for slot in b {
                    slot.release();
                }
            });
        });
        assert_eq!(t.dropped.load(O::SeqCst), 150);
        // The pool has 54 carved-but-unused slots in its chunk; then the
        // remote ones come back.
        let again: Vec<SlotRef> = (0..204).map(|_| new_slot(&p, 1, task::<1>(&t))).collect();
        let reused = again
            .iter()
            .filter(|s| addrs.contains(&s.0.addr().get()))
            .count();
        assert_eq!(reused, 150);
        for s in again {
            s.release();
        }
        unsafe { p.pool.close() };
        assert_eq!(Arc::strong_count(&p), 1);
    }

    #[test]
    fn a_slot_finds_its_producer_through_its_chunk() {
        let p = producer();
        let t = Arc::new(Tally::default());
        let slots: Vec<SlotRef> = (0..300).map(|_| new_slot(&p, 1, task::<1>(&t))).collect();
        assert!(
            slots
                .iter()
                .all(|s| std::ptr::eq(owner_of(s.0), Arc::as_ptr(&p)))
        );
        for s in slots {
            s.release();
        }
        unsafe { p.pool.close() };
    }
}
