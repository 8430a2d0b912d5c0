//! What a ring's cells hold: entries (a slot pointer with its kind in the
//! two low bits, or a time mark carrying a clock reading) and the values a
//! cell takes once its entry is gone.

use std::ptr::{self, NonNull};

use crate::timer::entry::{Slot, SlotRef};

/// The kinds of entry, in an entry's two low bits (slot addresses are
/// 8-aligned).
pub(super) const KIND_MASK: usize = 3;
pub(super) const NEW: usize = 0;
pub(super) const CANCEL: usize = 1;
pub(super) const TIME: usize = 2;
pub(super) const NEW_DEFERRED: usize = 3;

/// What a cell holds once its entry is gone: swapped out by the worker's
/// claim, taken back by the producer, or refused at the close. (No slot
/// lives at these addresses, and no time mark has kind 0.)
pub(super) const CLAIMED: usize = usize::MAX & !KIND_MASK;
pub(super) const TAKEN: usize = CLAIMED - 4;
pub(super) const REFUSED: usize = CLAIMED - 8;

/// Largest reading a time mark carries (in the entry's upper bits: 2^62
/// ns on 64-bit targets; a later reading makes no mark, and the worker's
/// reading resolves the deferred deadlines instead).
pub(crate) const MAX_MARK: u64 = (usize::MAX >> 2) as u64;

/// A ring entry: a slot pointer with its kind in the low bits, or a time
/// mark (a pointer, so that a slot's keeps its provenance).
pub(crate) type Entry = *mut Slot;

/// A cell value that is no entry.
pub(super) fn sentinel(addr: usize) -> Entry {
    ptr::without_provenance_mut(addr)
}

/// Whether `last` is the new-timeout entry `entry` (deferred or not).
pub(super) fn same_new(last: Entry, entry: Entry) -> bool {
    let kind = last.addr() & KIND_MASK;
    (kind == NEW || kind == NEW_DEFERRED) && last.addr() & !KIND_MASK == entry.addr() & !KIND_MASK
}

/// What a ring entry carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Item {
    /// A new timeout, its deadline deferred (`true`) or resolved.
    New(SlotRef, bool),
    /// A cancellation.
    Cancel(SlotRef),
    /// A time mark: a clock reading taken after every entry before it.
    Time(u64),
}

/// A slot reference carried as a ring entry: a cancellation, or a new
/// timeout whose deadline is `deferred` or not.
pub(crate) fn entry_of(slot: SlotRef, cancel: bool, deferred: bool) -> Entry {
    let kind = match (cancel, deferred) {
        (true, _) => CANCEL,
        (false, true) => NEW_DEFERRED,
        (false, false) => NEW,
    };
    slot.0.as_ptr().map_addr(|a| a | kind)
}

/// A time mark carrying `reading` (at most [`MAX_MARK`]).
pub(crate) fn time_entry(reading: u64) -> Entry {
    debug_assert!(reading <= MAX_MARK);
    ptr::without_provenance_mut((reading as usize) << 2 | TIME)
}

/// What a ring entry carries.
pub(crate) fn item_of(entry: Entry) -> Item {
    let kind = entry.addr() & KIND_MASK;
    if kind == TIME {
        return Item::Time((entry.addr() >> 2) as u64);
    }
    let ptr = entry.map_addr(|a| a & !KIND_MASK);
    // SAFETY: slot entries are made by `entry_of` from live slots.
    let slot = SlotRef(unsafe { NonNull::new_unchecked(ptr) });
    match kind {
        CANCEL => Item::Cancel(slot),
        _ => Item::New(slot, kind == NEW_DEFERRED),
    }
}
