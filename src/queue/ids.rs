//! Ids made by this process: message ids, claim tokens, and the names of
//! the reply records of take and claim (`queue/request.rs`).
//!
//! Every one starts with the process's **prefix**: 10 base-62 characters
//! (59.5 bits) that no other process shares. It comes from 64 random bits
//! drawn once per program mixed with 32 random bits and the pid drawn again
//! whenever the pid changes, so a `fork()`ed child, which starts with a copy of its
//! parent's memory, never reuses its parent's prefix (and a later process
//! that happens to get a dead one's pid draws fresh bits too). The pid is
//! read once per call that makes ids (`std::process::id()`: a system call
//! on glibc, about 170 ns on the test machine, under 0.5 % of an offer's
//! round trip; a batch reads it once).
//!
//! A message id is the prefix and a per-process counter, written as its
//! number of base-62 digits (one character) followed by the digits, so ids
//! sort as bytes in the order they were made: shorter numbers first, then
//! digit by digit (the base-62 alphabet is in ASCII order). Redis breaks
//! ties between equal due times by the member's bytes, so messages one
//! process offers with the same due time come out in offer order.
//!
//! Length matters: an id is stored twice per waiting message, and Redis
//! spends 32 bytes more per message once ids reach 15 bytes (its
//! allocation size classes: 267 B per waiting 64-byte message below, 298 B
//! from 15 bytes on, measured with `bench_queue -- mem`). With a
//! 10-character prefix, the first 238,327 ids of a process are at most 14
//! bytes, as they were with the earlier 11-character prefix and unmarked
//! counter. A collision of two prefixes (about 2^-59 per pair of
//! processes) is caught by the offer scripts, which refuse an id already
//! known: an error, never a lost or overwritten message.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::runtime::random_u64;

/// 64 random bits drawn once per program image (a forked child keeps its
/// parent's; the per-pid part below tells them apart). 0: not drawn yet.
static BASE: AtomicU64 = AtomicU64::new(0);

/// `(32 random bits << 32) | pid`, drawn again when the pid changes. 0:
/// not drawn yet (no process has pid 0).
static PER_PID: AtomicU64 = AtomicU64::new(0);

/// Counts message ids, claim tokens and request numbers alike.
static COUNTER: AtomicU64 = AtomicU64::new(0);

const BASE62: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/// Characters of the prefix: 62^10 ≈ 2^59.5.
const PREFIX_LEN: usize = 10;

/// Most base-62 digits a `u64` takes.
const MAX_DIGITS: usize = 11;

fn base() -> u64 {
    let b = BASE.load(Ordering::Acquire);
    if b != 0 {
        return b;
    }
    let drawn = random_u64() | 1;
    match BASE.compare_exchange(0, drawn, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => drawn,
        Err(first) => first,
    }
}

/// This process's per-pid bits, drawn again if the pid changed (a fork).
/// Threads racing to draw agree on one value: the draw is a
/// compare-and-swap from the value every one of them saw.
fn per_pid() -> u64 {
    let pid = std::process::id();
    let mut seen = PER_PID.load(Ordering::Acquire);
    loop {
        if seen as u32 == pid {
            return seen;
        }
        let drawn = (random_u64() << 32) | u64::from(pid);
        match PER_PID.compare_exchange(seen, drawn, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return drawn,
            Err(now) => seen = now,
        }
    }
}

/// The 64 bits of this process's prefix.
fn prefix_bits() -> u64 {
    base() ^ per_pid()
}

/// Draws new per-pid bits: a generated id was found in use, so another
/// process may share this prefix. Ids made from now on have a new one.
pub(crate) fn reseed() {
    let pid = std::process::id();
    let seen = PER_PID.load(Ordering::Acquire);
    let drawn = (random_u64() << 32) | u64::from(pid);
    let _ = PER_PID.compare_exchange(seen, drawn, Ordering::AcqRel, Ordering::Acquire);
}

fn push_prefix(out: &mut String, bits: u64) {
    let mut x = bits;
    for _ in 0..PREFIX_LEN {
        out.push(BASE62[(x % 62) as usize] as char);
        x /= 62;
    }
}

/// `n` in base 62, after one character giving its number of digits, so
/// that the encodings sort as bytes in numeric order.
fn push_ordered(out: &mut String, n: u64) {
    let mut digits = [0u8; MAX_DIGITS];
    let mut len = 0;
    let mut x = n;
    loop {
        digits[len] = BASE62[(x % 62) as usize];
        len += 1;
        x /= 62;
        if x == 0 {
            break;
        }
    }
    out.push(BASE62[len] as char);
    for &d in digits[..len].iter().rev() {
        out.push(d as char);
    }
}

fn message_id(prefix: u64, n: u64) -> String {
    let mut id = String::with_capacity(PREFIX_LEN + 1 + MAX_DIGITS);
    push_prefix(&mut id, prefix);
    push_ordered(&mut id, n);
    id
}

/// A fresh message id.
pub(crate) fn new_message_id() -> String {
    let prefix = prefix_bits();
    message_id(prefix, COUNTER.fetch_add(1, Ordering::Relaxed))
}

/// `n` fresh message ids, in increasing order.
pub(crate) fn new_message_ids(n: usize) -> Vec<String> {
    let prefix = prefix_bits();
    let first = COUNTER.fetch_add(n as u64, Ordering::Relaxed);
    (0..n as u64)
        .map(|i| message_id(prefix, first + i))
        .collect()
}

/// A token no other call of any process shares (claim tokens).
pub(crate) fn new_token() -> String {
    let prefix = prefix_bits();
    let mut t = String::with_capacity(PREFIX_LEN + 1 + MAX_DIGITS + 1);
    push_prefix(&mut t, prefix);
    t.push('.');
    push_ordered(&mut t, COUNTER.fetch_add(1, Ordering::Relaxed));
    t
}

/// This process's prefix, for names that must differ between processes
/// (the reply records of take and claim).
pub(crate) fn process_prefix() -> String {
    let mut p = String::with_capacity(PREFIX_LEN);
    push_prefix(&mut p, prefix_bits());
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_ids_are_short_and_distinct() {
        let ids: std::collections::HashSet<String> =
            (0..10_000).map(|_| new_message_id()).collect();
        assert_eq!(ids.len(), 10_000);
        assert!(ids.iter().all(|id| id.len() <= PREFIX_LEN + 1 + MAX_DIGITS));
    }

    #[test]
    fn a_process_first_238_327_ids_stay_under_redis_15_byte_step() {
        assert_eq!(message_id(u64::MAX, 0).len(), 12);
        assert_eq!(message_id(u64::MAX, 62 * 62 * 62 - 1).len(), 14);
        assert_eq!(message_id(u64::MAX, 62 * 62 * 62).len(), 15);
    }

    #[test]
    fn ids_sort_as_bytes_in_the_order_they_were_made() {
        // Around every change in the number of digits, and at the ends.
        let mut ns = vec![0, 1, u64::MAX - 1, u64::MAX];
        let mut p = 1u64;
        for _ in 0..MAX_DIGITS {
            ns.extend([p.saturating_sub(2), p - 1, p, p + 1]);
            p = p.saturating_mul(62);
            if p == u64::MAX {
                break;
            }
        }
        ns.sort_unstable();
        ns.dedup();
        let ids: Vec<String> = ns.iter().map(|&n| message_id(0xfeed, n)).collect();
        for (w, n) in ids.windows(2).zip(ns.windows(2)) {
            assert!(w[0] < w[1], "{} ({}) !< {} ({})", w[0], n[0], w[1], n[1]);
        }
        // A batch made in one call is in order, and its counter part
        // follows the ids made before it (the prefix may change meanwhile:
        // another test reseeds).
        let before = new_message_id();
        let batch = new_message_ids(5_000);
        assert!(before[PREFIX_LEN..] < batch[0][PREFIX_LEN..]);
        assert!(batch.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn a_reseed_changes_the_prefix_and_keeps_the_order_of_the_counter() {
        let a = new_message_id();
        reseed();
        let b = new_message_id();
        assert_ne!(a[..PREFIX_LEN], b[..PREFIX_LEN]);
        assert!(a[PREFIX_LEN..] < b[PREFIX_LEN..]);
    }

    #[test]
    fn tokens_differ_from_each_other() {
        let t: std::collections::HashSet<String> = (0..1_000).map(|_| new_token()).collect();
        assert_eq!(t.len(), 1_000);
    }
}
