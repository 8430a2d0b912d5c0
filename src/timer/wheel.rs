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
}

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
    /// between that and the tick it was inserted at).
    pub(crate) fn expire(
        &mut self,
        tick: u64,
        due_of: impl Fn(&T) -> u64,
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
        for value in now.items.drain(..).flatten() {
            let due = due_of(&value);
            if due <= tick {
                value.set_pos(NOT_PLACED);
                fire(value);
            } else {
                // Cannot happen; never fire early if it does.
                debug_assert!(false, "bucket {b}'s NOW list holds an entry due at {due}");
                strays.push((value, due));
            }
        }
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
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::rc::Rc;

    /// A test entry: its due tick, an id, and a shared position cell.
    #[derive(Clone, Debug)]
    struct E {
        due: u64,
        id: u32,
        pos: Rc<Cell<u32>>,
    }

    impl E {
        fn new(due: u64, id: u32) -> E {
            E {
                due,
                id,
                pos: Rc::new(Cell::new(NOT_PLACED)),
            }
        }
    }

    impl Placed for E {
        fn pos(&self) -> u32 {
            self.pos.get()
        }
        fn set_pos(&self, pos: u32) {
            self.pos.set(pos);
        }
        fn same(&self, other: &Self) -> bool {
            Rc::ptr_eq(&self.pos, &other.pos)
        }
    }

    fn due_of(v: &E) -> u64 {
        v.due
    }

    /// Inserts a new entry and returns a clone of it (to remove it by).
    fn put(w: &mut Wheel<E>, due: u64, id: u32, tick: u64) -> E {
        let e = E::new(due, id);
        w.insert(e.clone(), due, tick).unwrap();
        e
    }

    /// Expires tick `t` and returns the ids that fired.
    fn fire(w: &mut Wheel<E>, t: u64) -> Vec<u32> {
        let mut out = Vec::new();
        w.expire(t, due_of, |e| out.push(e.id));
        out
    }

    #[test]
    fn remaining_rounds_matches_netty_for_every_small_case() {
        // Netty: calculated = due; rounds = (calculated - tick) / len, truncating toward
        // zero, so overdue entries get 0 (or a negative that behaves as 0).
        for len in [1u64, 2, 4, 8, 512] {
            for tick in 0..40u64 {
                for due in 0..(tick + 5 * len) {
                    let netty = (due as i64 - tick as i64) / len as i64;
                    let ours = remaining_rounds(due, tick, len);
                    assert_eq!(ours as i64, netty.max(0), "due {due} tick {tick} len {len}");
                }
            }
        }
    }

    #[test]
    fn bucket_index_is_never_in_the_past() {
        for mask in [0u64, 1, 3, 511] {
            for tick in 0..1100u64 {
                for due in tick.saturating_sub(3)..tick + 3 {
                    let b = bucket_index(due, tick, mask) as u64;
                    if due < tick {
                        assert_eq!(b, tick & mask, "overdue goes to the current bucket");
                    } else {
                        assert_eq!(b, due & mask);
                    }
                }
            }
        }
    }

    #[test]
    fn wheel_length_rounds_up_to_powers_of_two() {
        let max = 1 << 30;
        let cases = [
            (1, 1),
            (2, 2),
            (3, 4),
            (5, 8),
            (512, 512),
            (513, 1024),
            (max, max),
        ];
        for (n, len) in cases {
            assert_eq!(wheel_length(n, max), Some(len), "ticks_per_wheel {n}");
        }
        assert_eq!(wheel_length(0, max), None);
        assert_eq!(wheel_length(max + 1, max), None);
        assert_eq!(wheel_length(usize::MAX, max), None);
    }

    #[test]
    fn positions_pack_and_unpack() {
        for kind in [KIND_NOW, KIND_LATER, KIND_OVERDUE] {
            for index in [0usize, 7, MAX_LIST - 1] {
                let pos = pack(kind, index);
                assert_ne!(pos, NOT_PLACED);
                assert_eq!(unpack(pos), (kind, index));
            }
        }
    }

    #[test]
    fn entries_fire_at_their_due_tick_in_fifo_order() {
        let mut w = Wheel::new(8);
        put(&mut w, 3, 1, 0);
        put(&mut w, 3, 2, 0);
        let later = put(&mut w, 11, 3, 0); // same bucket, one round later
        put(&mut w, 3, 4, 0);
        for t in 0..3 {
            assert!(fire(&mut w, t).is_empty());
        }
        assert_eq!(fire(&mut w, 3), vec![1, 2, 4]);
        assert_eq!(w.len(), 1);
        assert_ne!(later.pos(), NOT_PLACED);
        for t in 4..11 {
            assert!(fire(&mut w, t).is_empty(), "tick {t}");
        }
        assert_eq!(fire(&mut w, 11), vec![3]);
        assert!(w.is_empty());
        assert_eq!(later.pos(), NOT_PLACED, "a fired entry is no longer placed");
    }

    #[test]
    fn an_entry_moved_to_now_fires_before_later_placed_entries_of_its_tick() {
        let mut w = Wheel::new(8);
        put(&mut w, 11, 1, 0); // a turn ahead: LATER
        assert!(fire(&mut w, 3).is_empty()); // the visit moves it to NOW
        put(&mut w, 11, 2, 4); // less than a turn ahead: NOW
        assert_eq!(fire(&mut w, 11), vec![1, 2]);
        assert!(w.is_empty());
    }

    #[test]
    fn an_entry_whose_move_was_skipped_fires_first_at_its_tick() {
        let mut w = Wheel::new(8);
        put(&mut w, 11, 1, 0); // LATER; tick 3 is never visited
        put(&mut w, 11, 2, 4); // NOW
        put(&mut w, 19, 3, 4); // LATER, stays
        assert_eq!(fire(&mut w, 11), vec![1, 2]);
        assert_eq!(w.len(), 1);
        assert_eq!(w.next_due(12), Some(19));
        assert_eq!(fire(&mut w, 19), vec![3]);
    }

    #[test]
    fn a_visit_does_not_look_at_entries_due_on_later_turns() {
        let looked = Cell::new(0);
        let due_of = |v: &E| {
            looked.set(looked.get() + 1);
            v.due
        };
        let mut w = Wheel::new(8);
        for i in 0..5 {
            put(&mut w, 3 + 8 * 10, i, 0);
        }
        put(&mut w, 3, 9, 0);
        let mut out = Vec::new();
        w.expire(3, due_of, |e| out.push(e.id));
        assert_eq!(out, vec![9]);
        assert_eq!(looked.get(), 1, "only the due entry is looked at");
        assert_eq!(w.len(), 5);
    }

    #[test]
    fn overdue_entries_fire_in_the_current_tick_after_those_placed_before() {
        let mut w = Wheel::new(4);
        put(&mut w, 9, 1, 5); // due at 9, placed at 5: NOW of bucket 1
        put(&mut w, 2, 2, 9); // overdue at 9: the same bucket, after it
        put(&mut w, 9, 3, 9);
        assert_eq!(fire(&mut w, 9), vec![1, 2, 3]);
        assert!(w.is_empty());
    }

    #[test]
    fn an_overdue_entry_can_be_removed_before_its_tick_is_processed() {
        let mut w = Wheel::new(4);
        let a = put(&mut w, 2, 1, 9);
        put(&mut w, 9, 2, 9);
        assert_eq!(w.remove(&a, 9, due_of).map(|e| e.id), Some(1));
        assert_eq!(a.pos(), NOT_PLACED);
        assert_eq!(fire(&mut w, 9), vec![2]);
    }

    #[test]
    fn removal_leaves_the_others_in_order_and_a_second_removal_finds_nothing() {
        for victim in 0..3usize {
            let mut w = Wheel::new(4);
            let es: Vec<E> = (0..3u32).map(|i| put(&mut w, 1, i, 0)).collect();
            let removed = w.remove(&es[victim], 0, due_of);
            assert_eq!(removed.map(|e| e.id), Some(victim as u32));
            assert!(w.remove(&es[victim], 0, due_of).is_none(), "not twice");
            let expect: Vec<u32> = (0..3u32).filter(|&i| i as usize != victim).collect();
            assert_eq!(fire(&mut w, 1), expect);
            assert!(w.is_empty());
            assert_eq!(w.next_due(2), None);
        }
    }

    #[test]
    fn removals_compact_a_list_and_keep_positions_right() {
        let mut w = Wheel::new(4);
        // All in bucket 1's LATER list (due 5 turns ahead).
        let es: Vec<E> = (0..100u32).map(|i| put(&mut w, 21, i, 0)).collect();
        for e in es.iter().filter(|e| e.id % 3 != 0) {
            assert_eq!(w.remove(e, 0, due_of).map(|x| x.id), Some(e.id));
        }
        // Compaction moved the survivors: each must still be removable.
        for e in es.iter().filter(|e| e.id % 3 == 0 && e.id % 2 == 0) {
            assert_eq!(w.remove(e, 0, due_of).map(|x| x.id), Some(e.id));
        }
        let expect: Vec<u32> = (0..100u32).filter(|i| i % 3 == 0 && i % 2 == 1).collect();
        let mut got = Vec::new();
        for t in 1..=21 {
            got.extend(fire(&mut w, t));
        }
        assert_eq!(got, expect);
        assert!(w.is_empty());
    }

    #[test]
    fn removing_the_last_entry_of_a_bucket_clears_its_bit() {
        let mut w = Wheel::new(128);
        let a = put(&mut w, 70, 1, 0);
        assert_eq!(w.next_due(0), Some(70));
        w.remove(&a, 0, due_of);
        assert_eq!(w.next_due(0), None);
        assert!(w.occupied.iter().all(|&word| word == 0));
    }

    #[test]
    fn next_due_finds_the_earliest_possible_tick() {
        let mut w: Wheel<E> = Wheel::new(8);
        assert_eq!(w.next_due(0), None);
        put(&mut w, 21, 1, 0); // bucket 5, two rounds ahead
        assert_eq!(w.next_due(0), Some(21));
        let k = put(&mut w, 6, 2, 0);
        assert_eq!(w.next_due(0), Some(6));
        assert_eq!(w.next_due(6), Some(6));
        w.remove(&k, 0, due_of);
        // After a removal the bound may be early, never late.
        assert!(w.next_due(0).unwrap() <= 21);
        assert!(fire(&mut w, 6).is_empty());
        assert_eq!(w.next_due(7), Some(21));
        put(&mut w, 7, 3, 7);
        assert_eq!(w.next_due(7), Some(7));
    }

    #[test]
    fn next_due_scans_large_sparse_wheels() {
        let mut w: Wheel<E> = Wheel::new(1 << 12);
        put(&mut w, 4000, 1, 100);
        put(&mut w, 70 + 3 * 4096, 2, 60);
        assert_eq!(w.next_due(100), Some(4000));
        assert_eq!(fire(&mut w, 4000), vec![1]);
        assert_eq!(w.next_due(4001), Some(70 + 3 * 4096));
    }

    #[test]
    fn drain_returns_everything_and_empties_the_wheel() {
        let mut w = Wheel::new(4);
        let es: Vec<E> = (0..10u32)
            .map(|i| put(&mut w, u64::from(i), i, 0))
            .collect();
        w.remove(&es[4], 0, due_of);
        let mut all: Vec<u32> = w.drain().into_iter().map(|v| v.id).collect();
        all.sort();
        assert_eq!(all, [0, 1, 2, 3, 5, 6, 7, 8, 9]);
        assert!(es.iter().all(|e| e.pos() == NOT_PLACED));
        assert!(w.is_empty());
        assert_eq!(w.next_due(0), None);
        put(&mut w, 1, 99, 0);
        assert_eq!(fire(&mut w, 1), vec![99]);
    }
}
