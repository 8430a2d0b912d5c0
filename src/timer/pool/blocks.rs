//! Where a pool's blocks of chunks come from and go back to: the allocator,
//! through a process-wide cache of freed blocks.
//!
//! A fresh page costs a page fault the first time it is written (2–3.5 µs
//! on the project's VM: 20–35 ns per 40-byte slot, as much as the rest of
//! `new_timeout`), and the system allocator hands a large freed run back to
//! the system, so every new timer (or thread) faulted its slots' pages in
//! again. Freed blocks are kept instead, up to [`CACHE_BYTES`] in all, for
//! the next pools to take: the memory a timer once needed stays resident,
//! as a garbage-collected heap's does. (Not under loom, whose models run
//! many executions in one process; the blocks are plain memory either way.)

use std::alloc::{Layout, alloc, dealloc, handle_alloc_error};
use std::ptr::NonNull;

/// Most bytes of freed blocks kept for reuse (1.6 million slots' worth).
pub(crate) const CACHE_BYTES: usize = 64 << 20;

/// Block sizes the cache keeps, in chunks: 1, 2, 4, 8, 16 (`pool.rs`).
#[cfg(not(redwheel_loom))]
const SIZES: usize = 5;

#[cfg(not(redwheel_loom))]
struct Cache {
    /// Freed blocks by size (index: log2 of their chunks).
    free: [Vec<NonNull<u8>>; SIZES],
    bytes: usize,
}

// SAFETY: a cached block is memory nobody else refers to; the mutex hands
// it to one pool at a time.
#[cfg(not(redwheel_loom))]
unsafe impl Send for Cache {}

#[cfg(not(redwheel_loom))]
static CACHE: parking_lot::Mutex<Cache> = parking_lot::Mutex::new(Cache {
    free: [const { Vec::new() }; SIZES],
    bytes: 0,
});

/// The cache's list for blocks of `layout` (`layout.size()` a power-of-two
/// number of chunks up to 16), if it keeps them.
#[cfg(not(redwheel_loom))]
fn size_index(layout: Layout, chunk: usize) -> Option<usize> {
    let chunks = layout.size() / chunk;
    (chunks.is_power_of_two() && chunks.trailing_zeros() < SIZES as u32)
        .then_some(chunks.trailing_zeros() as usize)
}

/// A block of `layout` (its size a multiple of `chunk`, aligned to it): a
/// cached one, or a new one from the allocator. Its contents are
/// unspecified (a cached block holds what its last pool left).
pub(super) fn take(layout: Layout, chunk: usize) -> NonNull<u8> {
    #[cfg(not(redwheel_loom))]
    if let Some(i) = size_index(layout, chunk) {
        let mut cache = CACHE.lock();
        if let Some(block) = cache.free[i].pop() {
            cache.bytes -= layout.size();
            return block;
        }
    }
    #[cfg(redwheel_loom)]
    let _ = chunk;
    // SAFETY: the layout has a non-zero size (a whole chunk at least).
    let block = unsafe { alloc(layout) };
    NonNull::new(block).unwrap_or_else(|| handle_alloc_error(layout))
}

/// Gives back a block that [`take`] handed out with the same `layout`:
/// into the cache while it holds less than [`CACHE_BYTES`], else to the
/// allocator.
///
/// # Safety
/// `block` came from `take(layout, chunk)` and nothing refers to it any more.
pub(super) unsafe fn give_back(block: NonNull<u8>, layout: Layout, chunk: usize) {
    #[cfg(not(redwheel_loom))]
    if let Some(i) = size_index(layout, chunk) {
        let mut cache = CACHE.lock();
        if cache.bytes + layout.size() <= CACHE_BYTES {
            cache.bytes += layout.size();
            cache.free[i].push(block);
            return;
        }
    }
    #[cfg(redwheel_loom)]
    let _ = chunk;
    // SAFETY: allocated by `take` with this layout (the cache's blocks too).
    unsafe { dealloc(block.as_ptr(), layout) };
}

/// Bytes the cache holds now (tests).
#[cfg(all(test, not(redwheel_loom)))]
pub(crate) fn cached_bytes() -> usize {
    CACHE.lock().bytes
}
