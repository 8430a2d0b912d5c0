//! The wheel as a pure data structure, in integer ticks.
//!
//! No clock, no threads, no locks, no atomics: the worker (`worker.rs`) owns
//! one [`Wheel`] and is the only thing that touches it. Everything here is
//! tested single-threaded at the bottom of this file.
//!
//! # Representation
//!
//! * `buckets.len()` is a power of two, so the bucket of tick `t` is
//!   `t & mask` (Netty's `tick & mask`).
//! * Entries live in a [`Slab`]. Each bucket holds two FIFO doubly-linked
//!   lists of slab indices (`prev` / `next`), so unlinking an entry is O(1)
//!   in safe code. The two ends of a list do not hold a bare "nil": the
//!   head's `prev` and the tail's `next` hold `END | bucket << 1 | list`,
//!   so a node that is removed at an end knows which list's head or tail to
//!   update without a search and without spending memory on a field.
//! * The two lists of a bucket: `NOW` holds entries due at the bucket's next
//!   visit, `LATER` those due on a later turn. A visit fires all of `NOW`
//!   without looking at `LATER`, then moves the `LATER` entries due at the
//!   following visit to `NOW` (and skips even that walk when `LATER`'s
//!   `min_due` says none is). Netty walks a single list and decrements
//!   every entry's `remainingRounds`; here the due entries fire first, and
//!   entries a turn or more ahead cost nothing until their last turn. FIFO
//!   order is kept: an entry moved to `NOW` was placed before any entry
//!   placed in `NOW` directly for the same tick (which happens less than one
//!   turn ahead). When the worker skipped the visit that would have moved an
//!   entry, the entry is still in `LATER` at its due tick; it was placed
//!   before everything in `NOW`, and fires first.
//! * A [`Key`] is a slab index. A key can outlive its entry (the entry
//!   fired or was removed, and the index was reused), so removal by key
//!   takes a check of the value found there: the caller's identity test
//!   (for timeouts, pointer equality) tells a stale key from a live one.
//! * An entry's *due tick* is the tick during whose processing it fires.
//!   Netty stores `remainingRounds = (due - tick) / len` and decrements it on
//!   every visit of the bucket; we store the due tick itself (derived from the
//!   entry by the caller's `due_of` function), which carries the same
//!   information, makes a visit read-only for entries that are not yet due,
//!   and lets the worker skip runs of ticks in which nothing can be due.
//!   [`remaining_rounds`] gives Netty's number for any entry.
//! * Each list keeps `min_due`, a lower bound of the due ticks in it: it is
//!   lowered on insert, recomputed exactly when the list is walked, and left
//!   alone on removal (where it stays a valid lower bound). An occupancy
//!   bitmap (a bit per bucket with either list non-empty) lets
//!   [`Wheel::next_due`] skip empty buckets a word at a time.

use slab::Slab;

/// Marks a link as a list end; the low bits then hold `bucket << 1 | list`.
const END: u32 = 1 << 31;

/// The list of entries due at the bucket's next visit.
const NOW: usize = 0;

/// The list of entries due on a later turn of the wheel.
const LATER: usize = 1;

/// "No node": an empty bucket's head and tail, and the index of no key.
const NIL: u32 = u32::MAX;

fn is_end(link: u32) -> bool {
    link & END != 0
}

fn end_of(bucket: usize, list: usize) -> u32 {
    debug_assert!(bucket < MAX_BUCKETS && list <= LATER);
    END | ((bucket as u32) << 1) | list as u32
}

/// The bucket and list an end link names.
fn end_target(link: u32) -> (usize, usize) {
    let bits = link & !END;
    ((bits >> 1) as usize, (bits & 1) as usize)
}

/// Largest number of entries a wheel can hold: a link's top bit is the
/// [`END`] tag, so slab indices stay below `2^31`.
pub(crate) const MAX_ENTRIES: usize = (END - 1) as usize;

/// Largest number of buckets: a bucket index and a list bit must fit beside
/// the tag. (The end link of bucket `2^30 - 1`'s `LATER` list equals `NIL`;
/// that is harmless, since `NIL` is only ever stored as a list's head or
/// tail and end links only in nodes.)
pub(crate) const MAX_BUCKETS: usize = 1 << 30;

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

/// Handle on one entry of a [`Wheel`]: its slab index.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct Key {
    index: u32,
}

impl Key {
    /// Packs the key into a `u32` that is never zero: zero packs "no key".
    pub(crate) fn pack(self) -> u32 {
        self.index + 1
    }

    /// Inverse of [`Key::pack`]; `None` for zero.
    pub(crate) fn unpack(word: u32) -> Option<Key> {
        word.checked_sub(1).map(|index| Key { index })
    }
}

#[derive(Clone, Copy, Debug)]
struct List {
    head: u32,
    tail: u32,
    /// Lower bound of the due ticks of the entries in this list
    /// (`u64::MAX` when empty).
    min_due: u64,
}

const EMPTY_LIST: List = List {
    head: NIL,
    tail: NIL,
    min_due: u64::MAX,
};

/// A bucket: its `NOW` and `LATER` lists.
type Bucket = [List; 2];

const EMPTY_BUCKET: Bucket = [EMPTY_LIST; 2];

#[derive(Debug)]
struct Node<T> {
    value: T,
    prev: u32,
    next: u32,
}

/// A hashed timing wheel of `T`s, in ticks.
#[derive(Debug)]
pub(crate) struct Wheel<T> {
    mask: u64,
    buckets: Box<[Bucket]>,
    occupied: Box<[u64]>,
    nodes: Slab<Node<T>>,
}

impl<T> Wheel<T> {
    /// A wheel of `len` buckets. `len` must be a power of two (the timer's
    /// builder guarantees it).
    pub(crate) fn new(len: usize) -> Self {
        assert!(
            len.is_power_of_two() && len <= MAX_BUCKETS,
            "wheel length {len} is not a power of two up to {MAX_BUCKETS}"
        );
        Wheel {
            mask: len as u64 - 1,
            buckets: vec![EMPTY_BUCKET; len].into_boxed_slice(),
            occupied: vec![0; len.div_ceil(64)].into_boxed_slice(),
            nodes: Slab::new(),
        }
    }

    /// Number of entries.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.nodes.len()
    }

    /// True when the wheel holds no entry.
    pub(crate) fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Places `value`, due at tick `due`, while the wheel is at tick `tick`.
    /// It goes at the tail of bucket `max(due, tick) & mask`; its effective
    /// due tick is `max(due, tick)`, so an overdue entry fires during the
    /// processing of `tick`. Returns the key and the placed value. Fails
    /// (handing `value` back) only when the wheel already holds
    /// [`MAX_ENTRIES`] entries.
    pub(crate) fn insert(&mut self, value: T, due: u64, tick: u64) -> Result<(Key, &T), T> {
        if self.nodes.len() >= MAX_ENTRIES {
            return Err(value);
        }
        let index = self.nodes.insert(Node {
            value,
            prev: NIL,
            next: NIL,
        });
        self.place(index as u32, due, tick);
        Ok((
            Key {
                index: index as u32,
            },
            &self.nodes[index].value,
        ))
    }

    /// Links node `index` (in the slab, in no list) into the list where an
    /// entry due at `due` belongs while the wheel is at `tick`.
    fn place(&mut self, index: u32, due: u64, tick: u64) {
        let due = due.max(tick);
        let b = bucket_index(due, tick, self.mask);
        let list = if due - tick <= self.mask { NOW } else { LATER };
        self.append(b, list, index, due);
    }

    /// Links node `index` (in the slab, in no list) at the tail of `list`
    /// of bucket `b`, with due tick `due`.
    fn append(&mut self, b: usize, list: usize, index: u32, due: u64) {
        let tail = self.buckets[b][list].tail;
        let node = &mut self.nodes[index as usize];
        node.prev = if tail == NIL { end_of(b, list) } else { tail };
        node.next = end_of(b, list);
        if tail == NIL {
            self.buckets[b][list].head = index;
            self.occupied[b / 64] |= 1 << (b % 64);
        } else {
            self.nodes[tail as usize].next = index;
        }
        let l = &mut self.buckets[b][list];
        l.tail = index;
        l.min_due = l.min_due.min(due);
    }

    /// Removes the entry `key` names, if `is_it` recognises the value
    /// found there. `None` when the key is stale (its entry already left the
    /// wheel, and the index is free or holds another entry).
    pub(crate) fn remove(&mut self, key: Key, is_it: impl FnOnce(&T) -> bool) -> Option<T> {
        let index = key.index as usize;
        if !self.nodes.get(index).is_some_and(|node| is_it(&node.value)) {
            return None;
        }
        Some(self.unlink(index))
    }

    /// Unlinks slab entry `index` from the bucket it is in.
    fn unlink(&mut self, index: usize) -> T {
        let node = self.nodes.remove(index);
        self.link_around(node.prev, node.next);
        node.value
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
            self.walk_later(b, tick, None, &due_of, &mut fire);
        }
        loop {
            let head = self.buckets[b][NOW].head;
            if head == NIL {
                break;
            }
            // Reading the entry before unlinking it also lets its cache miss
            // overlap with the unlinking.
            let due = due_of(&self.nodes[head as usize].value);
            if due <= tick {
                fire(self.unlink(head as usize));
            } else {
                // Cannot happen; never fire early if it does.
                debug_assert!(false, "bucket {b}'s NOW list holds an entry due at {due}");
                let node = &self.nodes[head as usize];
                let (prev, next) = (node.prev, node.next);
                self.link_around(prev, next);
                // `LATER` is walked by min_due, so it fires at its tick.
                self.append((due & self.mask) as usize, LATER, head, due);
            }
        }
        // Move what falls due at the next visit (`tick + len`) to `NOW`.
        let next_visit = tick.saturating_add(self.mask + 1);
        if self.buckets[b][LATER].min_due <= next_visit {
            self.walk_later(b, next_visit, Some(next_visit), &due_of, &mut fire);
        }
    }

    /// Walks the `LATER` list of bucket `b` in order. Each entry due at or
    /// before `upto` is moved to the `NOW` list if `promote` is given (with
    /// that due tick), or else unlinked and handed to `fire`. Recomputes
    /// the list's `min_due` from the entries that stay.
    fn walk_later(
        &mut self,
        b: usize,
        upto: u64,
        promote: Option<u64>,
        due_of: &impl Fn(&T) -> u64,
        fire: &mut impl FnMut(T),
    ) {
        let mut cursor = self.buckets[b][LATER].head;
        let mut min_due = u64::MAX;
        while cursor != NIL && !is_end(cursor) {
            let index = cursor as usize;
            let node = &self.nodes[index];
            cursor = node.next;
            let due = due_of(&node.value);
            if due <= upto {
                match promote {
                    Some(due) => {
                        let (prev, next) = (node.prev, node.next);
                        self.link_around(prev, next);
                        self.append(b, NOW, index as u32, due);
                    }
                    None => fire(self.unlink(index)),
                }
            } else {
                debug_assert_eq!(
                    due & self.mask,
                    b as u64,
                    "entry due at {due} sits in bucket {b}"
                );
                min_due = min_due.min(due);
            }
        }
        let later = &mut self.buckets[b][LATER];
        if later.head != NIL {
            later.min_due = min_due;
        }
    }

    /// Joins `prev` and `next` around a node just taken out of its list.
    /// An end link names the list whose head or tail changes; a list left
    /// empty is reset, and a bucket left empty is cleared from the bitmap.
    fn link_around(&mut self, prev: u32, next: u32) {
        if is_end(prev) {
            let (b, list) = end_target(prev);
            self.buckets[b][list].head = if is_end(next) { NIL } else { next };
        } else {
            self.nodes[prev as usize].next = next;
        }
        if is_end(next) {
            let (b, list) = end_target(next);
            let l = &mut self.buckets[b][list];
            l.tail = if is_end(prev) { NIL } else { prev };
            if l.head == NIL {
                *l = EMPTY_LIST;
                if self.buckets[b].iter().all(|l| l.head == NIL) {
                    self.occupied[b / 64] &= !(1 << (b % 64));
                }
            }
        } else {
            self.nodes[next as usize].prev = prev;
        }
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
                    debug_assert!(
                        min_due >= visit,
                        "bucket {b} has min_due {min_due} before its next visit {visit} (tick {tick})"
                    );
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
    pub(crate) fn drain(&mut self) -> impl Iterator<Item = T> + '_ {
        self.buckets.fill(EMPTY_BUCKET);
        self.occupied.fill(0);
        self.nodes.drain().map(|n| n.value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn due_of(v: &(u64, u32)) -> u64 {
        v.0
    }

    /// Expires tick `t` and returns the ids that fired.
    fn fire(w: &mut Wheel<(u64, u32)>, t: u64) -> Vec<u32> {
        let mut out = Vec::new();
        w.expire(t, due_of, |(_, id)| out.push(id));
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
    fn key_packs_and_unpacks() {
        for index in [0u32, 7, END - 2] {
            let k = Key { index };
            assert_ne!(k.pack(), 0, "zero means no key");
            assert_eq!(Key::unpack(k.pack()), Some(k));
        }
        assert_eq!(Key::unpack(0), None);
    }

    #[test]
    fn entries_fire_at_their_due_tick_in_fifo_order() {
        let mut w = Wheel::new(8);
        w.insert((3, 1), 3, 0).unwrap();
        w.insert((3, 2), 3, 0).unwrap();
        w.insert((11, 3), 11, 0).unwrap(); // same bucket, one round later
        w.insert((3, 4), 3, 0).unwrap();
        for t in 0..3 {
            assert!(fire(&mut w, t).is_empty());
        }
        assert_eq!(fire(&mut w, 3), vec![1, 2, 4]);
        assert_eq!(w.len(), 1);
        for t in 4..11 {
            assert!(fire(&mut w, t).is_empty(), "tick {t}");
        }
        assert_eq!(fire(&mut w, 11), vec![3]);
        assert!(w.is_empty());
    }

    #[test]
    fn an_entry_moved_to_now_fires_before_later_placed_entries_of_its_tick() {
        let mut w = Wheel::new(8);
        w.insert((11, 1), 11, 0).unwrap(); // a turn ahead: LATER
        assert!(fire(&mut w, 3).is_empty()); // the visit moves it to NOW
        w.insert((11, 2), 11, 4).unwrap(); // less than a turn ahead: NOW
        assert_eq!(fire(&mut w, 11), vec![1, 2]);
        assert!(w.is_empty());
    }

    #[test]
    fn an_entry_whose_move_was_skipped_fires_first_at_its_tick() {
        let mut w = Wheel::new(8);
        w.insert((11, 1), 11, 0).unwrap(); // LATER; tick 3 is never visited
        w.insert((11, 2), 11, 4).unwrap(); // NOW
        w.insert((19, 3), 19, 4).unwrap(); // LATER, stays
        assert_eq!(fire(&mut w, 11), vec![1, 2]);
        assert_eq!(w.len(), 1);
        assert_eq!(w.next_due(12), Some(19));
        assert_eq!(fire(&mut w, 19), vec![3]);
    }

    #[test]
    fn a_visit_does_not_look_at_entries_due_on_later_turns() {
        let looked = std::cell::Cell::new(0);
        let due_of = |v: &(u64, u32)| {
            looked.set(looked.get() + 1);
            v.0
        };
        let mut w = Wheel::new(8);
        for i in 0..5 {
            w.insert((3 + 8 * 10, i), 3 + 8 * 10, 0).unwrap();
        }
        w.insert((3, 9), 3, 0).unwrap();
        let mut out = Vec::new();
        w.expire(3, due_of, |(_, id)| out.push(id));
        assert_eq!(out, vec![9]);
        // Only the due entry may be looked at (by a debug assertion).
        assert!(looked.get() <= 1, "looked at {} entries", looked.get());
        assert_eq!(w.len(), 5);
    }

    #[test]
    fn overdue_entries_fire_in_the_current_tick() {
        let mut w = Wheel::new(4);
        w.insert((2, 1), 2, 9).unwrap();
        assert_eq!(fire(&mut w, 9), vec![1]);
    }

    #[test]
    fn stale_keys_are_ignored_after_index_reuse() {
        let mut w = Wheel::new(4);
        let a = w.insert((1, 1), 1, 0).unwrap().0;
        assert_eq!(w.remove(a, |v| v.1 == 1), Some((1, 1)));
        let b = w.insert((2, 2), 2, 0).unwrap().0;
        assert_eq!(a, b, "the slab reuses the index");
        assert_eq!(
            w.remove(a, |v| v.1 == 1),
            None,
            "the stale key must not remove the new entry"
        );
        assert_eq!(w.len(), 1);
        assert_eq!(w.remove(b, |v| v.1 == 2), Some((2, 2)));
        assert_eq!(w.remove(b, |v| v.1 == 2), None, "nor a freed index");
    }

    #[test]
    fn remove_unlinks_head_middle_and_tail() {
        for victim in 0..3usize {
            let mut w = Wheel::new(4);
            let keys: Vec<Key> = (0..3u32)
                .map(|i| w.insert((1, i), 1, 0).unwrap().0)
                .collect();
            assert_eq!(w.remove(keys[victim], |_| true), Some((1, victim as u32)));
            let expect: Vec<u32> = (0..3u32).filter(|&i| i as usize != victim).collect();
            assert_eq!(fire(&mut w, 1), expect);
            assert!(w.is_empty());
            assert_eq!(w.next_due(2), None);
        }
    }

    #[test]
    fn next_due_finds_the_earliest_possible_tick() {
        let mut w: Wheel<(u64, u32)> = Wheel::new(8);
        assert_eq!(w.next_due(0), None);
        w.insert((21, 1), 21, 0).unwrap(); // bucket 5, two rounds ahead
        assert_eq!(w.next_due(0), Some(21));
        let k = w.insert((6, 2), 6, 0).unwrap().0;
        assert_eq!(w.next_due(0), Some(6));
        assert_eq!(w.next_due(6), Some(6));
        w.remove(k, |_| true);
        // After a removal the bound may be early, never late.
        assert!(w.next_due(0).unwrap() <= 21);
        assert!(fire(&mut w, 6).is_empty());
        assert_eq!(w.next_due(7), Some(21));
        w.insert((7, 3), 7, 7).unwrap();
        assert_eq!(w.next_due(7), Some(7));
    }

    #[test]
    fn next_due_scans_large_sparse_wheels() {
        let mut w: Wheel<(u64, u32)> = Wheel::new(1 << 12);
        w.insert((4000, 1), 4000, 100).unwrap();
        w.insert((70, 2), 70 + 3 * 4096, 60).unwrap();
        assert_eq!(w.next_due(100), Some(4000));
        assert_eq!(fire(&mut w, 4000), vec![1]);
        assert_eq!(w.next_due(4001), Some(70 + 3 * 4096));
    }

    #[test]
    fn drain_returns_everything_and_empties_the_wheel() {
        let mut w = Wheel::new(4);
        for i in 0..10u32 {
            w.insert((u64::from(i), i), u64::from(i), 0).unwrap();
        }
        let mut all: Vec<u32> = w.drain().map(|v| v.1).collect();
        all.sort();
        assert_eq!(all, (0..10).collect::<Vec<_>>());
        assert!(w.is_empty());
        assert_eq!(w.next_due(0), None);
        w.insert((1, 99), 1, 0).unwrap();
        assert_eq!(fire(&mut w, 1), vec![99]);
    }
}
