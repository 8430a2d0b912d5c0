//! A store that checks fencing tokens, as a database behind a lock
//! would, and watches for critical sections that overlap. Used by
//! `examples/chaos.rs`.
//!
//! A holder opens a section with the token of its acquisition, writes
//! under it, and closes it. A write whose token is lower than the
//! greatest token accepted so far is refused (a holder whose lease was
//! lost, writing late). The store also counts what fencing is for:
//! sections open at the same time (two holders each believing they hold
//! the lock), and, what must never happen, an overlap the store
//! *accepted*: a write of one section accepted after a write of another
//! section that began later was accepted, interleaving the two.
//!
//! It also checks what an unlock's `Ok` promises: that it released the
//! holder's own hold. A holder is *holding* from `open` until its unlock
//! answered (`unlocked`); another holder opening a section while it is
//! holding and has not begun its unlock (`unlocking`) means the lock
//! changed hands under it, and an unlock that then answers `Ok` (rather
//! than `LockLost`) is counted: two holders, neither told.
#![allow(dead_code)]

use std::collections::HashMap;

/// What the store saw; see the module docs.
#[derive(Debug, Default, Clone)]
pub struct StoreReport {
    /// Sections opened.
    pub sections: u64,
    /// Writes accepted.
    pub accepted: u64,
    /// Writes refused for a stale token.
    pub rejected: u64,
    /// Sections that were open while another one was.
    pub overlapping_in_time: u64,
    /// Writes accepted although another section's write had been
    /// accepted since this section's own last accepted write (the
    /// interleaving fencing prevents).
    pub overlaps_accepted: u64,
    /// Sections opened with a token not greater than an earlier
    /// section's.
    pub tokens_not_increasing: u64,
    /// Unlocks that answered `Ok`.
    pub unlocks_ok: u64,
    /// Unlocks that answered `Ok` although another holder had opened a
    /// section while this one held the lock, before its unlock began (it
    /// released nothing of its own: must be 0).
    pub unlocks_ok_not_own: u64,
}

/// A holder from its section's opening until its unlock answered.
#[derive(Debug)]
struct Holding {
    /// Its unlock began.
    unlocking: bool,
    /// Another holder opened a section while it held, before its unlock.
    taken_over: bool,
}

#[derive(Debug)]
struct Section {
    token: u64,
    /// Another section's write was accepted after this one's last.
    interleaved: bool,
    /// This section had a write accepted.
    wrote: bool,
}

/// The store: one per run, shared by every holder (behind a mutex).
#[derive(Debug, Default)]
pub struct FencedStore {
    last_token: u64,
    last_opened: u64,
    open: HashMap<u64, Section>,
    holding: HashMap<u64, Holding>,
    report: StoreReport,
}

impl FencedStore {
    /// Holder `holder` begins a critical section under `token`.
    pub fn open(&mut self, holder: u64, token: u64) {
        self.report.sections += 1;
        if token <= self.last_opened {
            self.report.tokens_not_increasing += 1;
        }
        self.last_opened = self.last_opened.max(token);
        if !self.open.is_empty() {
            self.report.overlapping_in_time += 1;
        }
        for (h, held) in self.holding.iter_mut() {
            if *h != holder && !held.unlocking {
                held.taken_over = true;
            }
        }
        self.holding.insert(
            holder,
            Holding {
                unlocking: false,
                taken_over: false,
            },
        );
        self.open.insert(
            holder,
            Section {
                token,
                interleaved: false,
                wrote: false,
            },
        );
    }

    /// A write of `holder`'s open section: `true` if accepted.
    pub fn write(&mut self, holder: u64) -> bool {
        let Some(token) = self.open.get(&holder).map(|s| s.token) else {
            return false;
        };
        if token < self.last_token {
            self.report.rejected += 1;
            return false;
        }
        self.last_token = token;
        self.report.accepted += 1;
        for (h, s) in self.open.iter_mut() {
            if *h != holder && s.wrote {
                s.interleaved = true;
            }
        }
        let s = self.open.get_mut(&holder).expect("open above");
        if s.interleaved {
            self.report.overlaps_accepted += 1;
        }
        s.wrote = true;
        s.interleaved = false;
        true
    }

    /// Holder `holder` ends its section.
    pub fn close(&mut self, holder: u64) {
        self.open.remove(&holder);
    }

    /// Holder `holder` begins its unlock.
    pub fn unlocking(&mut self, holder: u64) {
        if let Some(h) = self.holding.get_mut(&holder) {
            h.unlocking = true;
        }
    }

    /// Holder `holder`'s unlock answered (`ok`: with `Ok`).
    pub fn unlocked(&mut self, holder: u64, ok: bool) {
        let Some(h) = self.holding.remove(&holder) else {
            return;
        };
        if ok {
            self.report.unlocks_ok += 1;
            if h.taken_over {
                self.report.unlocks_ok_not_own += 1;
            }
        }
    }

    /// What the store saw so far.
    pub fn report(&self) -> StoreReport {
        self.report.clone()
    }
}
