//! The ring: how new timeouts and cancellations travel from one thread to
//! the worker, without a lock and without a read-modify-write per push.
//!
//! A [`Ring`] has one producing thread and one consuming thread (the
//! worker). An entry is a slot pointer (`entry.rs`), its two low bits
//! saying what for: a new timeout (its deadline resolved, or *deferred*:
//! waiting for a reading, see `entry.rs`) or a cancellation; or, with
//! no slot, a *time mark*: a clock reading the producing thread took after
//! every entry before it, which resolves the deferred deadlines among them.
//! Entries go into the cells of segments of [`SEG`] linked front to back;
//! the producing thread writes at the back, the worker reads at the front
//! and hands emptied segments back for reuse. Two words order them, each
//! written by one side only:
//!
//! ```text
//!   prod  P: entries published (wrapping u32)            producer only
//!   cons  bits  0..32  claims that took something (wrapping)  worker only
//!         bit  32      DOZE: the worker sleeps and must be woken by a push
//!         bit  33      CLOSED: the worker is gone; nothing more is read
//!         bits 34..64  dozes (wrapping), so that each doze gets one wake-up
//! ```
//!
//! * **push** (producer): write the entry into its cell, store `P + 1`,
//!   then (past a light fence) load `cons`: `DOZE` means wake the worker,
//!   `CLOSED` that the entry may be refused. No read-modify-write.
//! * **claim** (worker): load `P`; the cells up to it are the worker's. It
//!   reads them with plain loads, except the last one, which it swaps out
//!   (for `CLAIMED`): the one cell a take-back may race for.
//! * **take back** (producer, cancelling the timeout it pushed last): a
//!   compare-and-swap of that cell from the entry to `TAKEN`. It fails if
//!   the worker swapped it out first, so an entry is either claimed by the
//!   worker or taken back, never both. The worker counts a `TAKEN` cell out
//!   when it reaches it, at its next claim, like any cancellation.
//! * **arm** (worker, before dozing): sets `DOZE` in every ring's `cons`,
//!   then runs the heavy side of the fence once, then checks every `P`:
//!   anything unclaimed and it stays up. Of a push and the arming, at least
//!   one sees the other's store (`sync::light_fence`, `heavy_fence`: a
//!   compiler fence against Linux's `membarrier`, or two full fences): no
//!   wake-up is missed, and a push pays no fence instruction.
//! * **close** (worker, at exit): sets `CLOSED`, fences (heavy), loads
//!   `P`: the last entry the worker reads (swapping the last cell out). A
//!   push that sees `CLOSED` tries to swap its entry out of its cell for
//!   `REFUSED`: if it does, the worker never had it and the entry is the
//!   caller's; if not, the closing worker took it.
//!
//! # Ground rules
//!
//! * `local` belongs to the producing thread, `side` to the worker thread;
//!   everything they share goes through `prod` (release on push, acquire on
//!   claim), the last cell of a claim, `cons`, or the segment hand-back
//!   (`spare`). A cell before the last of a claim cannot be taken back any
//!   more (only the producer's latest entry can): the push that followed
//!   it, published to the worker, orders any take-back of it before the
//!   claim's reads.
//! * Every entry but a time mark holds one reference to its slot; whoever
//!   takes the entry (the worker, or the producer that takes it back) takes
//!   the reference.
//! * The producing thread tells from `cons`'s claim count whether the
//!   worker claimed since its own last look: the first
//!   [`PRECISE_PER_CLAIM`] new timeouts after each claim read the clock
//!   themselves, later ones may be deferred, with a time mark after every
//!   [`MARK_EVERY`] of them ([`Ring::may_defer`], [`Ring::mark_due`]).
//! * Timeouts are counted twice: `added` by the producing thread (before
//!   the push that publishes them, so `pending_timeouts` never misses one),
//!   and `accepted` by the worker as it claims them (exact once the ring is
//!   closed, when `added` may still hold the passing count of a push about
//!   to be refused).

use std::ptr;

use crossbeam_utils::CachePadded;

use self::entries::{
    CLAIMED, KIND_MASK, NEW, NEW_DEFERRED, REFUSED, TAKEN, TIME, same_new, sentinel,
};
pub(crate) use self::entries::{Entry, Item, MAX_MARK, entry_of, item_of, time_entry};
use super::entry::Slot;
use super::sync::{AtomicPtr, AtomicU64, Ordering, UnsafeCell, heavy_fence, light_fence};

mod entries;

/// Entries per ring segment.
#[cfg(not(redwheel_loom))]
pub(crate) const SEG: usize = 512;
/// Entries per ring segment (small under loom, to cross segments).
#[cfg(redwheel_loom)]
pub(crate) const SEG: usize = 2;

const CLAIMS: u64 = 0xFFFF_FFFF;
const DOZE: u64 = 1 << 32;
const CLOSED: u64 = 1 << 33;
const DOZE_ONE: u64 = 1 << 34;

/// New timeouts after each claim that read the clock themselves (see the
/// ground rules): a thread scheduling fewer per tick never defers one.
#[cfg(not(redwheel_loom))]
pub(crate) const PRECISE_PER_CLAIM: u32 = 64;
/// (Small under loom, so that the models defer.)
#[cfg(redwheel_loom)]
pub(crate) const PRECISE_PER_CLAIM: u32 = 1;

/// Deferred new timeouts between two time marks.
#[cfg(not(redwheel_loom))]
pub(crate) const MARK_EVERY: u32 = 16;
/// (Small under loom.)
#[cfg(redwheel_loom)]
pub(crate) const MARK_EVERY: u32 = 1;

/// One entry's place in a segment.
type Cell = AtomicPtr<Slot>;

struct Segment {
    entries: [Cell; SEG],
    next: UnsafeCell<*mut Segment>,
}

impl Segment {
    fn alloc() -> *mut Segment {
        Box::into_raw(Box::new(Segment {
            entries: std::array::from_fn(|_| AtomicPtr::new(ptr::null_mut())),
            next: UnsafeCell::new(ptr::null_mut()),
        }))
    }

    /// # Safety
    /// `seg` came from `alloc` and nobody uses it any more.
    unsafe fn free(seg: *mut Segment) {
        // SAFETY: forwarded.
        drop(unsafe { Box::from_raw(seg) });
    }
}

/// What a push found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pushed {
    /// Queued for the worker, which is awake or will look before it sleeps.
    Queued,
    /// Queued, and the worker was dozing: the caller must wake it.
    QueuedWake,
    /// The worker is gone: nothing was queued; the entry is the caller's.
    Closed,
}

/// A single-producer, single-consumer ring of entries: see the module docs.
pub(crate) struct Ring {
    /// Entries published (the producer's only shared write).
    prod: CachePadded<AtomicU64>,
    /// The worker's word (see the module docs).
    cons: CachePadded<AtomicU64>,
    /// Timeouts accepted through this producer (written by its thread
    /// only, before the push that publishes them).
    added: AtomicU64,
    /// Emptied segments handed back by the worker: a stack linked through
    /// `next`.
    spare: AtomicPtr<Segment>,
    local: UnsafeCell<Local>,
    side: UnsafeCell<Side>,
}

/// The producer's thread's part.
struct Local {
    tail: *mut Segment,
    /// Entry number of `tail`'s first entry.
    tail_base: u32,
    /// Entries pushed (`P`).
    pushed: u32,
    /// The entry pushed last and its cell, while it can still be taken back
    /// (null: none).
    last_entry: Entry,
    last_cell: *const Cell,
    /// `cons`'s claim count as last seen.
    claims: u64,
    /// `cons` when this thread last asked for a wake-up (one per doze).
    woke: u64,
    /// New timeouts pushed since the worker's last claim (as far as this
    /// thread has seen it).
    news_since_claim: u32,
    /// Deferred new timeouts pushed since the last time mark (and not taken
    /// back), and whether the last push was one of them.
    unmarked: u32,
    last_deferred: bool,
    /// Segments taken from `spare`, linked through `next`.
    spares: *mut Segment,
}

/// The worker's part.
struct Side {
    head: *mut Segment,
    head_base: u32,
    /// Entries claimed and read.
    claimed: u32,
    /// Timeouts the worker has seen accepted here: new-timeout entries
    /// claimed, plus those taken back (`TAKEN` cells). Once the ring is
    /// closed, or its thread left it and everything was claimed, this is the
    /// producer's final `added`, read coherently with the close (`added`
    /// itself may still hold the passing count of a push that is about to
    /// find the ring closed and take it back).
    accepted: u64,
}

// SAFETY: `local` is only touched by the producing thread and `side` only
// by the worker (the ground rules in the module docs); the rest is atomic.
unsafe impl Send for Ring {}
// SAFETY: as for `Send`.
unsafe impl Sync for Ring {}

impl Ring {
    pub(crate) fn new() -> Self {
        Ring::counted_from(0)
    }

    /// A ring whose entry counts start at `n`, as if `n` entries had been
    /// pushed and claimed (tests start near the counts' wrap).
    fn counted_from(n: u32) -> Self {
        let seg = Segment::alloc();
        Ring {
            prod: CachePadded::new(AtomicU64::new(u64::from(n))),
            cons: CachePadded::new(AtomicU64::new(0)),
            added: AtomicU64::new(0),
            spare: AtomicPtr::new(ptr::null_mut()),
            local: UnsafeCell::new(Local {
                tail: seg,
                tail_base: n,
                pushed: n,
                last_entry: ptr::null_mut(),
                last_cell: ptr::null(),
                claims: 0,
                woke: u64::MAX,
                news_since_claim: 0,
                unmarked: 0,
                last_deferred: false,
                spares: ptr::null_mut(),
            }),
            side: UnsafeCell::new(Side {
                head: seg,
                head_base: n,
                claimed: n,
                accepted: 0,
            }),
        }
    }

    /// Timeouts accepted through this ring (by its producing thread's
    /// count).
    pub(crate) fn added(&self) -> u64 {
        self.added.load(Ordering::Acquire)
    }

    /// Producer: queues `entry`; `counted` for a new timeout (it counts as
    /// pending from now on), not for a cancellation or a time mark. On
    /// `Closed` the entry (and its reference) stays the caller's.
    ///
    /// # Safety
    /// The producer's thread only.
    pub(crate) unsafe fn push(&self, entry: Entry, counted: bool) -> Pushed {
        self.local.with_mut(|l| {
            // SAFETY: the producer's thread only, no other borrow is live.
            let l = unsafe { &mut *l };
            if l.pushed.wrapping_sub(l.tail_base) as usize == SEG {
                let seg = self.take_segment(l);
                // SAFETY: `tail` is ours to link from; the worker reads
                // `next` only after it claimed an entry of the new segment.
                unsafe { (*l.tail).next.with_mut(|n| *n = seg) };
                l.tail = seg;
                l.tail_base = l.pushed;
            }
            let offset = l.pushed.wrapping_sub(l.tail_base) as usize;
            // SAFETY: `tail` is a live segment of ours.
            let cell: &Cell = unsafe { &(*l.tail).entries[offset] };
            // The cell at `pushed` is unpublished, so ours.
            cell.store(entry, Ordering::Relaxed);
            if counted {
                let added = self.added.load(Ordering::Relaxed);
                self.added.store(added + 1, Ordering::Relaxed);
            }
            l.pushed = l.pushed.wrapping_add(1);
            self.prod.store(u64::from(l.pushed), Ordering::Release);
            light_fence();
            let c = self.cons.load(Ordering::Acquire);
            if c & CLOSED != 0
                && cell
                    .compare_exchange(
                        entry,
                        sentinel(REFUSED),
                        Ordering::AcqRel,
                        Ordering::Relaxed,
                    )
                    .is_ok()
            {
                // The closing worker did not take it: it never will.
                if counted {
                    let added = self.added.load(Ordering::Relaxed);
                    self.added.store(added - 1, Ordering::Relaxed);
                }
                l.last_entry = ptr::null_mut();
                return Pushed::Closed;
            }
            let kind = entry.addr() & KIND_MASK;
            if c & CLAIMS != l.claims {
                l.claims = c & CLAIMS;
                l.news_since_claim = 0;
            }
            l.news_since_claim = l.news_since_claim.saturating_add(u32::from(counted));
            l.last_deferred = kind == NEW_DEFERRED;
            match kind {
                NEW_DEFERRED => l.unmarked = l.unmarked.saturating_add(1),
                TIME => l.unmarked = 0,
                _ => {}
            }
            l.last_entry = entry;
            l.last_cell = cell;
            if c & (DOZE | CLOSED) == DOZE && c != l.woke {
                l.woke = c;
                return Pushed::QueuedWake;
            }
            Pushed::Queued
        })
    }

    /// Producer: whether a new timeout pushed next may defer its deadline:
    /// the worker is awake, or this thread already asked it to wake up from
    /// this doze, and this thread pushed [`PRECISE_PER_CLAIM`] new timeouts
    /// since the worker's last claim. One load of `cons`. A stale load only
    /// defers a timeout that might have read the clock: the deadline is
    /// later, never earlier.
    ///
    /// # Safety
    /// The producer's thread only.
    #[inline]
    pub(crate) unsafe fn may_defer(&self) -> bool {
        let c = self.cons.load(Ordering::Relaxed);
        self.local.with_mut(|l| {
            // SAFETY: the producer's thread only, no other borrow is live.
            let l = unsafe { &mut *l };
            if c & CLAIMS != l.claims {
                l.claims = c & CLAIMS;
                l.news_since_claim = 0;
            }
            let awake = c & (DOZE | CLOSED) == 0 || c == l.woke;
            awake && l.news_since_claim >= PRECISE_PER_CLAIM
        })
    }

    /// Producer: whether [`MARK_EVERY`] deferred timeouts wait for a time
    /// mark (the caller then reads the clock and pushes one).
    ///
    /// # Safety
    /// The producer's thread only.
    #[inline]
    pub(crate) unsafe fn mark_due(&self) -> bool {
        // SAFETY: the producer's thread only.
        self.local.with(|l| unsafe { (*l).unmarked >= MARK_EVERY })
    }

    /// A segment to append: a spare one, or a new one.
    fn take_segment(&self, l: &mut Local) -> *mut Segment {
        if l.spares.is_null() {
            l.spares = self.spare.swap(ptr::null_mut(), Ordering::Acquire);
        }
        let seg = if l.spares.is_null() {
            Segment::alloc()
        } else {
            let seg = l.spares;
            // SAFETY: the worker handed the segment back (acquire above);
            // it is ours.
            l.spares = unsafe { (*seg).next.with(|n| *n) };
            seg
        };
        // SAFETY: the segment is ours.
        unsafe { (*seg).next.with_mut(|n| *n = ptr::null_mut()) };
        seg
    }

    /// Producer: whether `entry` is the last one pushed and may still be
    /// taken back.
    ///
    /// # Safety
    /// The producer's thread only.
    pub(crate) unsafe fn pushed_last(&self, entry: Entry) -> bool {
        // SAFETY: the producer's thread only.
        self.local
            .with(|l| unsafe { same_new((*l).last_entry, entry) })
    }

    /// Producer: takes the last pushed entry back, if the worker has not
    /// claimed it: the worker counts it out when it reaches its cell. True
    /// if it was taken back (with its reference).
    ///
    /// # Safety
    /// The producer's thread only.
    pub(crate) unsafe fn unpublish(&self, entry: Entry) -> bool {
        self.local.with_mut(|l| {
            // SAFETY: the producer's thread only.
            let l = unsafe { &mut *l };
            if !same_new(l.last_entry, entry) {
                return false;
            }
            let last = std::mem::replace(&mut l.last_entry, ptr::null_mut());
            // SAFETY: the cell of the last push lives in the tail segment,
            // which the worker never hands back while it is the tail.
            let cell = unsafe { &*l.last_cell };
            let taken = cell
                .compare_exchange(last, sentinel(TAKEN), Ordering::AcqRel, Ordering::Relaxed)
                .is_ok();
            if taken && l.last_deferred {
                l.unmarked = l.unmarked.saturating_sub(1);
                l.last_deferred = false;
            }
            taken
        })
    }

    /// Worker: claims what was published since the last claim and hands
    /// each entry to `f`; returns the number of timeouts taken back unseen.
    ///
    /// # Safety
    /// The worker thread only.
    pub(crate) unsafe fn claim(&self, f: impl FnMut(Entry)) -> u32 {
        let upto = self.prod.load(Ordering::Acquire) as u32;
        // SAFETY: the worker thread only.
        let claimed = self.side.with(|s| unsafe { (*s).claimed });
        if upto == claimed {
            return 0;
        }
        // SAFETY: the worker thread only; the entries up to `upto` were
        // published by the release of the pushes we acquired.
        let unseen = unsafe { self.read_upto(upto, f) };
        // One more claim that took something: the producer's first timeouts
        // after it read the clock again (`may_defer`).
        let c = self.cons.load(Ordering::Relaxed);
        let next = (c & !CLAIMS) | (c.wrapping_add(1) & CLAIMS);
        self.cons.store(next, Ordering::Release);
        unseen
    }

    /// Worker: reads the entries up to number `upto` (swapping the last one
    /// out of its cell) and hands them to `f`, counting them and the
    /// taken-back ones in `accepted`; returns the taken-back count.
    ///
    /// # Safety
    /// The worker thread only; `upto` was acquired from `prod`.
    unsafe fn read_upto(&self, upto: u32, mut f: impl FnMut(Entry)) -> u32 {
        self.side.with_mut(|s| {
            // SAFETY: the worker thread only.
            let s = unsafe { &mut *s };
            let mut unseen = 0;
            while s.claimed != upto {
                if s.claimed.wrapping_sub(s.head_base) as usize == SEG {
                    // SAFETY: the producer linked `next` before publishing
                    // the entry we are about to read.
                    let next = unsafe { (*s.head).next.with(|n| *n) };
                    let done = s.head;
                    s.head = next;
                    s.head_base = s.claimed;
                    self.hand_back(done);
                }
                let offset = s.claimed.wrapping_sub(s.head_base) as usize;
                // SAFETY: published, and not yet handed back.
                let cell: &Cell = unsafe { &(*s.head).entries[offset] };
                s.claimed = s.claimed.wrapping_add(1);
                // The last cell may race a take-back (or a refusal at the
                // close): swap the entry out; the others are ours to read.
                let entry = if s.claimed == upto {
                    cell.swap(sentinel(CLAIMED), Ordering::AcqRel)
                } else {
                    cell.load(Ordering::Relaxed)
                };
                match entry.addr() {
                    TAKEN => {
                        unseen += 1;
                        s.accepted += 1;
                    }
                    REFUSED => {}
                    addr => {
                        let kind = addr & KIND_MASK;
                        s.accepted += u64::from(kind == NEW || kind == NEW_DEFERRED);
                        f(entry);
                    }
                }
            }
            unseen
        })
    }

    /// Worker: gives an emptied segment back to the producer.
    fn hand_back(&self, seg: *mut Segment) {
        let mut head = self.spare.load(Ordering::Relaxed);
        loop {
            // SAFETY: the segment is ours until the swap publishes it.
            unsafe { (*seg).next.with_mut(|n| *n = head) };
            match self
                .spare
                .compare_exchange_weak(head, seg, Ordering::Release, Ordering::Relaxed)
            {
                Ok(_) => return,
                Err(h) => head = h,
            }
        }
    }

    /// Worker: whether anything waits to be claimed.
    ///
    /// # Safety
    /// The worker thread only.
    pub(crate) unsafe fn has_input(&self) -> bool {
        let upto = self.prod.load(Ordering::Acquire) as u32;
        // SAFETY: the worker thread only.
        let claimed = self.side.with(|s| unsafe { (*s).claimed });
        upto != claimed
    }

    /// Worker, before dozing: marks the ring so that a push from now on
    /// asks for a wake-up. Then [`heavy_fence`] once for every ring, and
    /// [`has_input`](Self::has_input) on each: a push before the mark shows
    /// there, one after it sees the mark.
    ///
    /// # Safety
    /// The worker thread only.
    pub(crate) unsafe fn set_doze(&self) {
        let c = self.cons.load(Ordering::Relaxed);
        self.cons
            .store((c | DOZE).wrapping_add(DOZE_ONE), Ordering::Relaxed);
    }

    /// Worker, one ring alone (tests and models): marks it, fences, and
    /// checks it; false (and no mark) if something is unclaimed.
    ///
    /// # Safety
    /// The worker thread only.
    #[cfg(test)]
    pub(crate) unsafe fn arm(&self) -> bool {
        // SAFETY: forwarded.
        unsafe { self.set_doze() };
        heavy_fence();
        // SAFETY: as above.
        if unsafe { self.has_input() } {
            // SAFETY: as above.
            unsafe { self.disarm() };
            return false;
        }
        true
    }

    /// Worker, after dozing: clears the mark.
    ///
    /// # Safety
    /// The worker thread only.
    pub(crate) unsafe fn disarm(&self) {
        let c = self.cons.load(Ordering::Relaxed);
        self.cons.store(c & !DOZE, Ordering::Relaxed);
    }

    /// Worker, at exit: closes the ring and hands every entry still in it
    /// to `f`; returns the unseen count.
    ///
    /// # Safety
    /// The worker thread only, once.
    pub(crate) unsafe fn close(&self, f: impl FnMut(Entry)) -> u32 {
        let c = self.cons.load(Ordering::Relaxed);
        self.cons.store(c | CLOSED, Ordering::Relaxed);
        heavy_fence();
        let upto = self.prod.load(Ordering::Acquire) as u32;
        // SAFETY: forwarded; the entries up to `upto` were published before
        // the load; a push after it sees `CLOSED` and refuses its entry
        // unless this swapped it out.
        unsafe { self.read_upto(upto, f) }
    }

    /// Worker: the timeouts it has seen accepted through this ring
    /// (see `Side::accepted`): its final count once the ring is closed, or
    /// orphaned and claimed to the end.
    ///
    /// # Safety
    /// The worker thread only.
    pub(crate) unsafe fn accepted(&self) -> u64 {
        // SAFETY: the worker thread only.
        self.side.with(|s| unsafe { (*s).accepted })
    }

    /// Whether the worker closed this ring.
    pub(crate) fn is_closed(&self) -> bool {
        self.cons.load(Ordering::Acquire) & CLOSED != 0
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // Every entry was claimed by the worker or taken back by the
        // producing thread: the segments own nothing.
        let mut seg = self.side.with(|s| {
            // SAFETY: nobody else can reach the ring any more.
            unsafe { (*s).head }
        });
        while !seg.is_null() {
            // SAFETY: as above; segments linked from `head` to `tail`.
            let next = unsafe { (*seg).next.with(|n| *n) };
            // SAFETY: allocated by `Segment::alloc`.
            unsafe { Segment::free(seg) };
            seg = next;
        }
        for stack in [
            self.local.with(|l| {
                // SAFETY: as above.
                unsafe { (*l).spares }
            }),
            self.spare.load(Ordering::Acquire),
        ] {
            let mut seg = stack;
            while !seg.is_null() {
                // SAFETY: as above.
                let next = unsafe { (*seg).next.with(|n| *n) };
                // SAFETY: as above.
                unsafe { Segment::free(seg) };
                seg = next;
            }
        }
    }
}

#[cfg(all(test, not(redwheel_loom)))]
mod tests;
