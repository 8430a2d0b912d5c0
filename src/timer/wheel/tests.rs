//! The wheel's own tests: single-threaded, on integer ticks, against
//! hand-computed expectations (and Netty's `remainingRounds` arithmetic).

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
    w.expire(t, due_of, |e| e.due <= t, |e| out.push(e.id));
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
    let is_due = |v: &E| due_of(v) <= 3;
    w.expire(3, due_of, is_due, |e| out.push(e.id));
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
