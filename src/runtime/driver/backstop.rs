//! The backstop heap: every armed deadline, earliest first, so the driver
//! thread can wait for the earliest one on its own and run what the wheel
//! did not fire in time (a wheel thread held up by a slow task, or
//! descheduled).
//!
//! A pure data structure: items are `(at, index, epoch)` and the caller
//! says which are still live. Items go stale when their deadline is
//! replaced, fires or is dropped; they are skipped when they come up, and
//! the heap is rebuilt from the live ones when stale ones pile up.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Duration;

/// One armed deadline: when, the entry's slab index, its registration
/// epoch.
pub(super) type Item = (Duration, usize, u64);

/// Armed deadlines, earliest first.
#[derive(Default)]
pub(super) struct Backstop {
    heap: BinaryHeap<Reverse<Item>>,
}

impl Backstop {
    /// True when `at` is earlier than every deadline in the heap: a driver
    /// thread waiting for the earliest must look again.
    pub(super) fn is_earliest(&self, at: Duration) -> bool {
        self.heap
            .peek()
            .is_none_or(|Reverse((first, ..))| at < *first)
    }

    /// Adds an armed deadline.
    pub(super) fn push(&mut self, item: Item) {
        self.heap.push(Reverse(item));
    }

    /// Items held, stale ones included.
    pub(super) fn len(&self) -> usize {
        self.heap.len()
    }

    /// The earliest item, stale or not.
    pub(super) fn peek(&self) -> Option<Item> {
        self.heap.peek().map(|&Reverse(item)| item)
    }

    /// Drops the earliest item.
    pub(super) fn pop(&mut self) {
        self.heap.pop();
    }

    /// Replaces the contents by `live` (the deadlines armed now).
    pub(super) fn rebuild(&mut self, live: impl IntoIterator<Item = Item>) {
        self.heap = live.into_iter().map(Reverse).collect();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn the_earliest_deadline_comes_first_and_a_rebuild_keeps_only_the_live_ones() {
        let mut b = Backstop::default();
        assert!(b.is_earliest(ms(5)));
        b.push((ms(5), 0, 1));
        b.push((ms(3), 1, 1));
        assert!(!b.is_earliest(ms(4)));
        assert!(b.is_earliest(ms(2)));
        assert_eq!(b.peek(), Some((ms(3), 1, 1)));
        b.pop();
        assert_eq!(b.peek(), Some((ms(5), 0, 1)));
        b.rebuild([(ms(9), 2, 4)]);
        assert_eq!((b.len(), b.peek()), (1, Some((ms(9), 2, 4))));
    }
}
