//! Where slots live: per-producer pools of 4 KiB chunks, and the return
//! of a slot to its pool when its last reference goes.
//!
//! Slots (`entry.rs`) come in 4 KiB chunks, aligned to 4 KiB (allocated a
//! few at a time, up to 64 KiB), that belong to one pool, which belongs to
//! one producer (a thread's way into one timer, `producer.rs`). A slot
//! finds its pool and its owner by masking its address, so it needs no
//! pointer of its own. The owning thread takes slots from its pool without
//! synchronisation; a slot freed on another thread (the worker, mostly)
//! goes back onto the pool's remote list with one compare-and-swap, and the
//! owner takes that whole list in one swap when its own runs dry. Chunks
//! live as long as the pool: when the owning thread leaves it (or its timer
//! is stopped or gone) the pool closes, and the last slot freed after that
//! frees the chunks (into a process-wide cache of blocks for the next
//! pools, `pool/blocks.rs`) and lets go of the owner, which the chunks kept
//! alive.
//!
//! This layer knows its owner only as an address and two functions (hold
//! and let go of it), given at [`Pool::new`].

use std::alloc::Layout;
use std::mem::{align_of, size_of};
use std::ptr::{self, NonNull};

use super::entry::{Slot, SlotRef, link_of, set_link};
use super::prefetch;

mod blocks;

#[cfg(all(test, not(redwheel_loom)))]
pub(crate) use self::blocks::{CACHE_BYTES, cached_bytes};
use super::sync::{AtomicBool, AtomicPtr, AtomicUsize, Ordering, UnsafeCell, fence, thread_id};

/// Bytes of a chunk; also its alignment, so that a slot's chunk is its
/// address rounded down.
const CHUNK: usize = 4096;

/// How many slots ahead of the one it hands out `alloc` prefetches (160
/// bytes: W1 5 % and W6 8–15 % faster than without, 4 or 8 alike; W5's
/// drain about 1 ms longer, BENCHMARKS.md's timer log).
const PREFETCH_AHEAD: usize = 4;

/// Bytes in front of a chunk's slots.
const CHUNK_HEADER: usize = 16;

/// Slots per chunk (102 of 40 bytes in normal builds).
pub(crate) const SLOTS_PER_CHUNK: usize = (CHUNK - CHUNK_HEADER) / size_of::<Slot>();

#[repr(C, align(4096))]
struct Chunk {
    /// The pool this chunk belongs to (immutable).
    pool: *const Pool,
    /// The pool's owner, as given to `Pool::alloc` (immutable).
    owner: *const (),
    slots: [std::mem::MaybeUninit<Slot>; SLOTS_PER_CHUNK],
}

const _: () = assert!(size_of::<Chunk>() == CHUNK && align_of::<Chunk>() == CHUNK);
const _: () = assert!(CHUNK_HEADER == 2 * size_of::<usize>());

/// Marks the remote free list closed (slot addresses are 8-aligned).
const CLOSED: usize = 1;

/// A producer's supply of slots. The `local` part belongs to the
/// owning thread; `remote` and `balance` are shared.
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
    /// The owning thread (`thread_id`).
    thread: u64,
    /// Set by the worker when it closes its owner's ring: the owner's next
    /// free closes the pool (see `free`).
    retiring: AtomicBool,
    /// Take and drop one reference to the owner (the chunks keep it alive,
    /// since the pool lives inside it).
    hold: unsafe fn(*const ()),
    let_go: unsafe fn(*const ()),
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
    /// An empty pool owned by the thread `thread`; `hold` and `let_go`
    /// take and drop a reference to the owner whose address is given to
    /// `alloc`.
    pub(crate) fn new(
        thread: u64,
        hold: unsafe fn(*const ()),
        let_go: unsafe fn(*const ()),
    ) -> Self {
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
            thread,
            retiring: AtomicBool::new(false),
            hold,
            let_go,
        }
    }

    /// True on the owning thread.
    #[inline]
    pub(crate) fn on_owner_thread(&self) -> bool {
        self.owned_by(thread_id())
    }

    /// Whether the thread with id `thread` (`thread_id`) owns this pool.
    fn owned_by(&self, thread: u64) -> bool {
        self.thread == thread
    }

    /// The worker closed the owner's ring (its timer stopped): once the
    /// owning thread frees a slot, the pool closes, so that its chunks go
    /// back with the last slot instead of staying for reuse.
    pub(crate) fn retire(&self) {
        self.retiring.store(true, Ordering::Release);
    }

    /// A free slot, uninitialised apart from its memory being reserved;
    /// `None` once the pool is closed (its timer is stopped or gone, or
    /// its thread left it: the caller answers `Stopped`). A closed pool
    /// hands out nothing: its counts were settled at the close, and its
    /// remote list holds the `CLOSED` mark, not a slot.
    ///
    /// # Safety
    /// Only the owner's thread may call this, with `owner` its producer,
    /// whose address the chunks record and keep alive (with `hold`).
    pub(crate) unsafe fn alloc(&self, owner: *const ()) -> Option<NonNull<Slot>> {
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
                    (l.block_next, l.block_left) = new_block(self, owner);
                }
                l.bump = l.block_next;
                // SAFETY: within the block (one past its end at most).
                l.block_next = unsafe { l.block_next.add(1) };
                l.block_left -= 1;
                // SAFETY: a fresh chunk of ours.
                unsafe { init_chunk(l.bump, self, owner) };
                l.bump_next = 0;
            }
            let index = l.bump_next;
            l.bump_next += 1;
            if index + PREFETCH_AHEAD < SLOTS_PER_CHUNK {
                // The slot a few allocations on, owned before it is filled
                // (`prefetch.rs`).
                // SAFETY: in bounds of the live chunk.
                prefetch::write(unsafe { slot_at(l.bump, index + PREFETCH_AHEAD) }.as_ptr());
            }
            // SAFETY: `bump` is a live chunk and `index` is in bounds; the
            // pointer keeps the chunk's provenance.
            Some(unsafe { slot_at(l.bump, index) })
        })
    }

    /// Returns `slot` (dead: no references, task gone) to the pool `this`.
    ///
    /// This and the other functions that may free the pool's last chunk
    /// take the pool as a raw pointer: the last chunk's release lets go of
    /// the owner, which may free the pool itself, so no reference to it
    /// may be alive (let alone be an argument) across that.
    ///
    /// # Safety
    /// `this` is a live pool; `slot` must come from it, be dead, and
    /// `on_owner` must be true only on the owner's thread.
    pub(crate) unsafe fn put_back(this: *const Pool, slot: NonNull<Slot>, on_owner: bool) {
        if on_owner {
            // SAFETY: live (see above); the reference ends with the closure.
            let done = unsafe { &(*this).local }.with_mut(|l| {
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
        unsafe { Pool::free_chain(this, slot, slot, 1) };
    }

    /// Returns `n` dead slots of this pool, linked from `first` to `last`
    /// through their task areas, from a thread other than the owner's
    /// (or after the close): one compare-and-swap and one subtraction.
    ///
    /// # Safety
    /// `this` is a live pool; the slots are dead, come from it, and the
    /// chain is ours.
    pub(crate) unsafe fn free_chain(
        this: *const Pool,
        first: NonNull<Slot>,
        last: NonNull<Slot>,
        n: usize,
    ) {
        // SAFETY: live until the balance below says otherwise.
        let remote = unsafe { &(*this).remote };
        let mut head = remote.load(Ordering::Relaxed);
        while head.addr() & CLOSED == 0 {
            // SAFETY: the chain is ours until the swap publishes it.
            unsafe { set_link(last, head) };
            match remote.compare_exchange_weak(
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
        unsafe { Pool::add_balance(this, n.wrapping_neg()) };
    }

    /// Closes the pool (its owner thread is leaving it for good, or its
    /// timer is gone): no slot is reused any more, and the last one freed
    /// releases the chunks and the pool's reference to its producer. A
    /// second call does nothing.
    ///
    /// # Safety
    /// `this` is a live pool; its owner's thread only.
    pub(crate) unsafe fn close(this: *const Pool) {
        // SAFETY: live until the balance below says otherwise.
        let pool = unsafe { &*this };
        let live = pool.local.with_mut(|l| {
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
        pool.remote.swap(closed, Ordering::AcqRel);
        let chunks = pool.chunks.with(|c| {
            // SAFETY: `chunks` is only written by the owner (here).
            unsafe { (*c).len() }
        });
        if chunks == 0 {
            return;
        }
        // SAFETY: the Release of this add publishes `chunks`.
        unsafe { Pool::add_balance(this, live) };
    }

    /// Adds `n` (mod 2^64) to `balance` and releases everything if that
    /// brings it to zero.
    ///
    /// # Safety
    /// `this` is a live pool.
    unsafe fn add_balance(this: *const Pool, n: usize) {
        // SAFETY: live; the reference ends with the call.
        let before = unsafe { &(*this).balance }.fetch_add(n, Ordering::AcqRel);
        if before.wrapping_add(n) == 0 {
            // SAFETY: nobody else can reach the chunks any more.
            unsafe { Pool::release_chunks(this) };
        }
    }

    /// Frees every chunk and drops the chunks' reference to the owner,
    /// which may free the pool: nothing refers to it after that.
    ///
    /// # Safety
    /// `this` is a live pool whose balance just reached zero.
    unsafe fn release_chunks(this: *const Pool) {
        fence(Ordering::Acquire);
        // SAFETY: live until `let_go` below; the last user (`add_balance`).
        let (chunks, let_go) = unsafe {
            let pool = &*this;
            (
                pool.chunks.with_mut(|c| std::mem::take(&mut *c)),
                pool.let_go,
            )
        };
        let owner = chunks.first().map(|(c, _)| {
            // SAFETY: the chunk is live until freed below.
            unsafe { (*c.as_ptr()).owner }
        });
        for (c, n) in chunks {
            // SAFETY: taken by `new_block` with this layout; nothing refers
            // to its slots any more.
            unsafe { blocks::give_back(c.cast(), block_layout(n), CHUNK) };
        }
        if let Some(owner) = owner {
            // SAFETY: the chunks held one reference to the owner, taken in
            // `new_block`; this may free it (and this pool: nothing after).
            unsafe { let_go(owner) };
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
fn new_block(pool: &Pool, owner: *const ()) -> (*mut Chunk, usize) {
    let blocks = pool.chunks.with(|c| {
        // SAFETY: owner thread only (the caller, `alloc`).
        unsafe { (*c).len() }
    });
    let n = (1usize << blocks.min(4)).min(MAX_BLOCK);
    let block = blocks::take(block_layout(n), CHUNK).cast::<Chunk>();
    pool.chunks.with_mut(|c| {
        // SAFETY: owner thread only (the caller, `alloc`).
        unsafe { (*c).push((block, n)) };
    });
    if blocks == 0 {
        // SAFETY: `owner` is live (see `alloc`).
        unsafe { (pool.hold)(owner) };
    }
    (block.as_ptr(), n)
}

/// Writes a fresh chunk's header.
///
/// # Safety
/// `chunk` is an unused chunk of one of `pool`'s blocks.
unsafe fn init_chunk(chunk: *mut Chunk, pool: &Pool, owner: *const ()) {
    // SAFETY: allocated and suitably aligned; ours.
    unsafe {
        ptr::addr_of_mut!((*chunk).pool).write(pool);
        ptr::addr_of_mut!((*chunk).owner).write(owner);
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

/// The header of the chunk `slot` lives in.
fn chunk_of(slot: NonNull<Slot>) -> *const Chunk {
    slot.as_ptr().map_addr(|a| a & !(CHUNK - 1)).cast::<Chunk>()
}

/// The owner of the pool `slot` came from (as given to [`Pool::alloc`]).
pub(crate) fn owner_of(slot: NonNull<Slot>) -> *const () {
    // SAFETY: every slot lives in a chunk whose header was written at its
    // allocation and never changes; the pointer keeps the chunk's
    // provenance (slots are derived from it by `slot_at`).
    unsafe { (*chunk_of(slot)).owner }
}

/// The pool `slot` came from.
fn pool_of<'a>(slot: NonNull<Slot>) -> &'a Pool {
    // SAFETY: as in `owner_of`; the pool lives in its owner, which its
    // chunks keep alive, hence as long as this slot.
    unsafe { &*(*chunk_of(slot)).pool }
}

/// Drops one reference to `slot`; the last one frees it (into its pool's
/// local list on the owning thread, else its remote list).
#[inline]
pub(crate) fn release(slot: SlotRef) {
    if slot.drop_ref() {
        // SAFETY: that was the last reference.
        unsafe { free(slot) };
    }
}

/// Drops one reference, as [`release`], but a slot freed on another thread
/// than its pool's goes into `frees`, which returns runs of slots of one
/// pool with one compare-and-swap (the worker releases whole buckets this
/// way).
#[inline]
pub(crate) fn release_into(slot: SlotRef, frees: &mut Frees) {
    if !slot.drop_ref() {
        return;
    }
    let pool = pool_of(slot.0);
    if pool.owned_by(frees.thread) {
        // SAFETY: that was the last reference.
        unsafe { free(slot) };
        return;
    }
    // SAFETY: the last reference: the task, if still here, is ours.
    let dropped = unsafe { slot.drop_unclaimed_task() };
    frees.push(pool, slot.0);
    if let Err(panic) = dropped {
        std::panic::resume_unwind(panic);
    }
}

/// Frees a slot nobody references any more.
///
/// # Safety
/// No references remain.
unsafe fn free(slot: SlotRef) {
    // SAFETY: no references remain.
    let dropped = unsafe { slot.drop_unclaimed_task() };
    let pool = pool_of(slot.0);
    let on_owner = pool.on_owner_thread();
    if on_owner && pool.retiring.load(Ordering::Acquire) {
        // The timer is stopped or gone: stop reusing its slots, so that its
        // chunks go back to the allocator with the last of them (here, not
        // in the first `new_timeout` of the next timer).
        // SAFETY: this is the owning thread; the pool is live (this slot).
        unsafe { Pool::close(pool) };
    }
    // SAFETY: the slot is dead and comes from the pool, which it keeps
    // alive until this returns it (`pool` is not used after).
    unsafe { Pool::put_back(pool, slot.0, on_owner) };
    if let Err(panic) = dropped {
        std::panic::resume_unwind(panic);
    }
}

/// A run of dead slots of one pool, being returned together (see
/// [`release_into`]). Flushed when a slot of another pool comes, and
/// on drop.
pub(crate) struct Frees {
    pool: *const Pool,
    first: *mut Slot,
    last: *mut Slot,
    n: usize,
    /// The thread this runs on (`thread_id`, read once: a `Frees` stays on
    /// the thread that made it, being neither `Send` nor `Sync`).
    thread: u64,
}

impl Frees {
    pub(crate) fn new() -> Self {
        Frees {
            pool: ptr::null(),
            first: ptr::null_mut(),
            last: ptr::null_mut(),
            n: 0,
            thread: thread_id(),
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
            // its owner) alive until this returns them.
            unsafe { Pool::free_chain(self.pool, first, last, self.n) };
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
