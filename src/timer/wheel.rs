//! The wheel as a pure data structure, in integer ticks.
//!
//! No clock, no threads, no locks: the worker (`worker.rs`) owns one
//! [`Wheel`] and is the only thing that touches it. Everything here is
//! tested single-threaded at the bottom of this file.
//!
//! # Representation
//!
//! * `buckets.len()` is a power of two, so the bucket of tick `t` is
//!   `t & mask` (Netty's `tick & mask`).
//! * Each bucket holds two lists, each a vector of entries in the order
//!   they were placed. `NOW` holds entries due at the bucket's next visit,
//!   `LATER` those due on a later turn. A visit fires all of `NOW` without
//!   looking at `LATER`, then moves the `LATER` entries due at the following
//!   visit to `NOW` (and skips even that walk when `LATER`'s `min_due` says
//!   none is). Netty walks a single list and decrements every entry's
//!   `remainingRounds`; here the due entries fire first, and entries a turn
//!   or more ahead cost nothing until their last turn. FIFO order is kept:
//!   an entry moved to `NOW` was placed before any entry placed in `NOW`
//!   directly for the same tick (which happens less than one turn ahead).
//!   When the worker skipped the visit that would have moved an entry, the
//!   entry is still in `LATER` at its due tick; it was placed before
//!   everything in `NOW`, and fires first.
//! * Every entry records where it is ([`Placed::pos`]): its list and its
//!   index there. The bucket follows from the entry's due tick (`due &
//!   mask`), except for an entry that was already overdue when it was
//!   placed: it goes into the current tick's bucket, fires while that tick
//!   is processed, and its position says so (`OVERDUE`). Removal by
//!   position is O(1): the vector keeps a hole (`None`) in its place, so the
//!   order of the others does not change; a list whose holes outnumber its
//!   entries is compacted (and the positions of the entries that moved are
//!   rewritten). A removed or fired entry's position is [`NOT_PLACED`].
//! * Vectors rather than linked nodes: an entry costs one pointer in its
//!   list and nothing else, and a visit reads its list front to back, so
//!   the loads of the entries it fires are independent of each other and
//!   can overlap.
//! * An entry's *due tick* is the tick during whose processing it fires.
//!   Netty stores `remainingRounds = (due - tick) / len` and decrements it on
//!   every visit of the bucket; we derive the due tick from the entry (the
//!   caller's `due_of` function), which carries the same information, makes a
//!   visit read-only for entries that are not yet due, and lets the worker
//!   skip runs of ticks in which nothing can be due. [`remaining_rounds`]
//!   gives Netty's number for any entry.
//! * Each list keeps `min_due`, a lower bound of the due ticks in it: it is
//!   lowered on insert, recomputed exactly when the list is walked, and left
//!   alone on removal (where it stays a valid lower bound). An occupancy
//!   bitmap (a bit per bucket with either list non-empty) lets
//!   [`Wheel::next_due`] skip empty buckets a word at a time.

/// The list of entries due at the bucket's next visit.
const NOW: usize = 0;

/// The list of entries due on a later turn of the wheel.
const LATER: usize = 1;

/// Position kinds, in the top two bits of a position.
const KIND_SHIFT: u32 = 30;
const KIND_NOW: u32 = 0;
const KIND_LATER: u32 = 1;
/// In the `NOW` list of the bucket of the tick being processed when it was
/// placed (it was overdue then).
const KIND_OVERDUE: u32 = 2;

/// The position of an entry that is in no list.
pub(crate) const NOT_PLACED: u32 = u32::MAX;

/// Largest number of entries in one list: an index and its kind must fit
/// a position, and the all-ones position means "not placed".
pub(crate) const MAX_LIST: usize = (1 << KIND_SHIFT) - 1;

/// Largest number of buckets.
pub(crate) const MAX_BUCKETS: usize = 1 << 30;

/// Lists shorter than this are never compacted (their holes go at the next
/// visit or walk).
const COMPACT_MIN: usize = 32;

/// A list's vector capacity above which a visit that empties it releases
/// it, so that a burst's memory does not stay with the wheel.
const KEEP_CAPACITY: usize = 4096;

/// What the wheel needs from an entry: a place to record its position.
/// Only the wheel writes it; `same` tells two entries apart.
pub(crate) trait Placed {
    /// The position recorded by [`Placed::set_pos`]; [`NOT_PLACED`] before.
    fn pos(&self) -> u32;
    /// Records the entry's position.
    fn set_pos(&self, pos: u32);
    /// True if both are the same entry.
    fn same(&self, other: &Self) -> bool;
    /// A hint that the entry is about to be looked at (a visit calls it a
    /// few entries ahead, so that entries living elsewhere in memory are
    /// fetched while earlier ones fire). Does nothing by default.
    fn prefetch(&self) {}
}

/// How many entries ahead of the one firing a visit prefetches (16: W5's
/// drain 3–4 % shorter than with 8, on the project's VM).
const PREFETCH_AHEAD: usize = 16;

fn pack(kind: u32, index: usize) -> u32 {
    debug_assert!(index < MAX_LIST);
    (kind << KIND_SHIFT) | index as u32
}

fn unpack(pos: u32) -> (u32, usize) {
    (pos >> KIND_SHIFT, (pos & ((1 << KIND_SHIFT) - 1)) as usize)
}

/// Netty's `remainingRounds` for an entry due at tick `due`, seen at tick
/// `tick` on a wheel of `len` buckets: the number of further full turns of
/// the wheel before it fires. Zero when it is due this turn (or overdue).
#[cfg(test)]
pub(crate) fn remaining_rounds(due: u64, tick: u64, len: u64) -> u64 {
    debug_assert!(
        len.is_power_of_two(),
        "wheel length {len} is not a power of two"
    );
    due.saturating_sub(tick) / len
}

/// The bucket an entry due at `due` goes into when it is placed at `tick`:
/// never a bucket in the past (an overdue entry goes into the current one).
pub(crate) fn bucket_index(due: u64, tick: u64, mask: u64) -> usize {
    (due.max(tick) & mask) as usize
}

/// Smallest power of two `>= n`, or `None` when there is none within `max`.
pub(crate) fn wheel_length(n: usize, max: usize) -> Option<usize> {
    if n == 0 {
        return None;
    }
    n.checked_next_power_of_two().filter(|&len| len <= max)
}

#[derive(Debug)]
struct List<T> {
    /// Entries in placement order; `None` is a hole left by a removal.
    items: Vec<Option<T>>,
    holes: usize,
    /// Lower bound of the due ticks of the entries in this list
    /// (`u64::MAX` when empty).
    min_due: u64,
}

impl<T> List<T> {
    const fn new() -> Self {
        List {
            items: Vec::new(),
            holes: 0,
            min_due: u64::MAX,
        }
    }

    fn is_empty(&self) -> bool {
        self.items.len() == self.holes
    }

    /// Forgets every entry (they were all taken out) and, after a burst,
    /// the memory too.
    fn reset(&mut self) {
        self.items.clear();
        if self.items.capacity() > KEEP_CAPACITY {
            self.items = Vec::new();
        }
        self.holes = 0;
        self.min_due = u64::MAX;
    }
}

/// A bucket: its `NOW` and `LATER` lists.
type Bucket<T> = [List<T>; 2];

/// A hashed timing wheel of `T`s, in ticks.
#[derive(Debug)]
pub(crate) struct Wheel<T> {
    mask: u64,
    buckets: Box<[Bucket<T>]>,
    occupied: Box<[u64]>,
    len: usize,
}

impl<T: Placed> Wheel<T> {
    /// A wheel of `len` buckets. `len` must be a power of two (the timer's
    /// builder guarantees it).
    pub(crate) fn new(len: usize) -> Self {
        assert!(
            len.is_power_of_two() && len <= MAX_BUCKETS,
            "wheel length {len} is not a power of two up to {MAX_BUCKETS}"
        );
        Wheel {
            mask: len as u64 - 1,
            buckets: (0..len).map(|_| [List::new(), List::new()]).collect(),
            occupied: vec![0; len.div_ceil(64)].into_boxed_slice(),
            len: 0,
        }
    }

    /// Number of entries.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// True when the wheel holds no entry.
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Places `value`, due at tick `due`, while the wheel is at tick `tick`.
    /// It goes at the end of bucket `max(due, tick) & mask`; its effective
    /// due tick is `max(due, tick)`, so an overdue entry fires during the
    /// processing of `tick`. Fails (handing `value` back) only when that
    /// list already holds [`MAX_LIST`] entries.
    pub(crate) fn insert(&mut self, value: T, due: u64, tick: u64) -> Result<(), T> {
        let b = bucket_index(due, tick, self.mask);
        let (list, kind) = if due < tick {
            (NOW, KIND_OVERDUE)
        } else if due - tick <= self.mask {
            (NOW, KIND_NOW)
        } else {
            (LATER, KIND_LATER)
        };
        if self.buckets[b][list].items.len() >= MAX_LIST {
            return Err(value);
        }
        self.append(b, list, kind, value, due.max(tick));
        Ok(())
    }

    /// Appends `value`, due at `due`, to `list` of bucket `b`.
    fn append(&mut self, b: usize, list: usize, kind: u32, value: T, due: u64) {
        let l = &mut self.buckets[b][list];
        value.set_pos(pack(kind, l.items.len()));
        l.items.push(Some(value));
        l.min_due = l.min_due.min(due);
        self.occupied[b / 64] |= 1 << (b % 64);
        self.len += 1;
    }

    /// Takes `value` out of the wheel, if it is in it: `None` when its
    /// position says it is not placed (fired, removed, or never placed).
    /// `tick` is the tick being processed, `due_of` gives its due tick.
    pub(crate) fn remove(&mut self, value: &T, tick: u64, due_of: impl Fn(&T) -> u64) -> Option<T> {
        let pos = value.pos();
        if pos == NOT_PLACED {
            return None;
        }
        let (kind, index) = unpack(pos);
        let (b, list) = match kind {
            KIND_NOW => ((due_of(value) & self.mask) as usize, NOW),
            KIND_LATER => ((due_of(value) & self.mask) as usize, LATER),
            _ => ((tick & self.mask) as usize, NOW),
        };
        let l = &mut self.buckets[b][list];
        let slot = l.items.get_mut(index)?;
        if !slot.as_ref().is_some_and(|v| v.same(value)) {
            debug_assert!(false, "position {pos:#x} of bucket {b} holds another entry");
            return None;
        }
        let taken = slot.take()?;
        taken.set_pos(NOT_PLACED);
        l.holes += 1;
        self.len -= 1;
        if l.is_empty() {
            l.reset();
            self.clear_bit_if_empty(b);
        } else if l.holes * 2 > l.items.len() && l.items.len() >= COMPACT_MIN {
            Self::compact(l, list_kind(list));
        }
        Some(taken)
    }

    /// Squeezes the holes out of a list, rewriting the positions of the
    /// entries that move.
    fn compact(l: &mut List<T>, kind: u32) {
        let mut next = 0;
        for i in 0..l.items.len() {
            if let Some(v) = l.items[i].take() {
                if next != i {
                    v.set_pos(pack(kind, next));
                }
                l.items[next] = Some(v);
                next += 1;
            }
        }
        l.items.truncate(next);
        l.holes = 0;
    }

    fn clear_bit_if_empty(&mut self, b: usize) {
        if self.buckets[b].iter().all(List::is_empty) {
            self.occupied[b / 64] &= !(1 << (b % 64));
        }
    }

    /// Takes out of the bucket of `tick` every entry due at or before `tick`
    /// (in FIFO order) and hands each to `fire`; then moves the entries due
    /// at the bucket's next visit to its `NOW` list. `due_of` gives an
    /// entry's due tick as it was given to [`Wheel::insert`] (or any value
    /// between that and the tick it was inserted at); `is_due(v)` must equal
    /// `due_of(v) <= tick`, and is what the `NOW` list, which holds nothing
    /// else, is checked with (the worker answers it with one comparison
    /// where `due_of` takes a division).
    pub(crate) fn expire(
        &mut self,
        tick: u64,
        due_of: impl Fn(&T) -> u64,
        is_due: impl Fn(&T) -> bool,
        mut fire: impl FnMut(T),
    ) {
        let b = (tick & self.mask) as usize;
        // Entries the visit one turn ago did not move (the worker skipped
        // it): placed before anything in `NOW`, so they fire first.
        if self.buckets[b][LATER].min_due <= tick {
            self.walk_later(b, tick, false, &due_of, &mut fire);
        }
        let mut now = std::mem::replace(&mut self.buckets[b][NOW], List::new());
        let mut strays = Vec::new();
        let count = now.items.len() - now.holes;
        for v in now.items.iter().take(PREFETCH_AHEAD).flatten() {
            v.prefetch();
        }
        // Drained, not taken one by one: the vector keeps its capacity and
        // no hole is written back.
        let mut items = now.items.drain(..);
        while let Some(item) = items.next() {
            if let Some(Some(ahead)) = items.as_slice().get(PREFETCH_AHEAD - 1) {
                ahead.prefetch();
            }
            let Some(value) = item else {
                continue;
            };
            if is_due(&value) {
                value.set_pos(NOT_PLACED);
                fire(value);
            } else {
                // Cannot happen; never fire early if it does.
                let due = due_of(&value);
                debug_assert!(false, "bucket {b}'s NOW list holds an entry due at {due}");
                strays.push((value, due));
            }
        }
        drop(items);
        self.len -= count;
        // Keep the (emptied) vector's capacity for the next turn.
        now.reset();
        self.buckets[b][NOW] = now;
        for (value, due) in strays {
            // `LATER` is walked by min_due, so it fires at its tick.
            let home = (due & self.mask) as usize;
            self.append(home, LATER, KIND_LATER, value, due);
        }
        // Move what falls due at the next visit (`tick + len`) to `NOW`.
        let next_visit = tick.saturating_add(self.mask + 1);
        if self.buckets[b][LATER].min_due <= next_visit {
            self.walk_later(b, next_visit, true, &due_of, &mut fire);
        }
        self.clear_bit_if_empty(b);
    }

    /// Walks the `LATER` list of bucket `b` in order. Each entry due at or
    /// before `upto` is moved to the `NOW` list if `promote`, or else handed
    /// to `fire`. Squeezes out the holes and recomputes the list's `min_due`
    /// from the entries that stay.
    fn walk_later(
        &mut self,
        b: usize,
        upto: u64,
        promote: bool,
        due_of: &impl Fn(&T) -> u64,
        fire: &mut impl FnMut(T),
    ) {
        let mut later = std::mem::replace(&mut self.buckets[b][LATER], List::new());
        let mut min_due = u64::MAX;
        let mut kept = 0;
        for i in 0..later.items.len() {
            let Some(value) = later.items[i].take() else {
                continue;
            };
            let due = due_of(&value);
            if due <= upto {
                if promote {
                    self.len -= 1;
                    self.append(b, NOW, KIND_NOW, value, upto);
                } else {
                    self.len -= 1;
                    value.set_pos(NOT_PLACED);
                    fire(value);
                }
            } else {
                debug_assert_eq!(
                    due & self.mask,
                    b as u64,
                    "entry due at {due} sits in bucket {b}"
                );
                min_due = min_due.min(due);
                if kept != i {
                    value.set_pos(pack(KIND_LATER, kept));
                }
                later.items[kept] = Some(value);
                kept += 1;
            }
        }
        later.items.truncate(kept);
        later.holes = 0;
        later.min_due = min_due;
        if kept == 0 {
            later.reset();
        }
        self.buckets[b][LATER] = later;
    }

    /// The earliest tick `>= tick` at which some entry can be due, or `None`
    /// when the wheel is empty. It is a lower bound: the worker may wake up
    /// at that tick and find nothing due (after removals), never later than
    /// an entry's due tick.
    pub(crate) fn next_due(&self, tick: u64) -> Option<u64> {
        if self.is_empty() {
            return None;
        }
        let len = self.buckets.len();
        let start = (tick & self.mask) as usize;
        let mut best = u64::MAX;
        let mut distance = 0usize;
        while distance < len {
            let b = (start + distance) & self.mask as usize;
            match self.next_occupied_from(b, len - distance) {
                None => break,
                Some(step) => {
                    distance += step;
                    let b = (start + distance) & self.mask as usize;
                    let visit = tick + distance as u64;
                    let min_due = self.buckets[b][NOW]
                        .min_due
                        .min(self.buckets[b][LATER].min_due);
                    if min_due <= visit {
                        return Some(visit);
                    }
                    best = best.min(min_due);
                    distance += 1;
                }
            }
        }
        Some(best)
    }

    /// Distance from bucket `from` to the first occupied bucket at or after
    /// it (cyclically), looking at most `limit` buckets ahead.
    fn next_occupied_from(&self, from: usize, limit: usize) -> Option<usize> {
        let len = self.buckets.len();
        let mut distance = 0usize;
        while distance < limit {
            let b = (from + distance) & (len - 1);
            let bit = b % 64;
            // The bits of this word for buckets b.. up to the word's end or
            // the wheel's end, whichever comes first (then we wrap to 0).
            let span = (64 - bit).min(len - b);
            let mut word = self.occupied[b / 64] >> bit;
            if span < 64 {
                word &= (1u64 << span) - 1;
            }
            if word != 0 {
                let found = distance + word.trailing_zeros() as usize;
                return (found < limit).then_some(found);
            }
            distance += span;
        }
        None
    }

    /// Takes every entry out of the wheel, in no particular order.
    pub(crate) fn drain(&mut self) -> Vec<T> {
        let mut all = Vec::with_capacity(self.len);
        for bucket in self.buckets.iter_mut() {
            for list in bucket.iter_mut() {
                for value in list.items.drain(..).flatten() {
                    value.set_pos(NOT_PLACED);
                    all.push(value);
                }
                list.reset();
            }
        }
        self.occupied.fill(0);
        self.len = 0;
        all
    }
}

fn list_kind(list: usize) -> u32 {
    if list == NOW { KIND_NOW } else { KIND_LATER }
}

#[cfg(test)]
mod tests;
