//! Unit tests of the ring (`ring.rs`), on fake entries.

use super::*;

/// A fake entry (never dereferenced by the ring).
fn entry(i: usize) -> Entry {
    ptr::without_provenance_mut(8 * (i + 1))
}

fn ring() -> Ring {
    Ring::new()
}

/// Claims and returns (entries, unseen).
fn claim(p: &Ring) -> (Vec<usize>, u32) {
    let mut got = Vec::new();
    // SAFETY: the test thread plays the worker.
    let unseen = unsafe { p.claim(|e| got.push(e.addr() / 8 - 1)) };
    (got, unseen)
}

#[test]
fn entries_arrive_in_order_across_segments_and_segments_are_reused() {
    let p = ring();
    let mut next = 0;
    for round in 0..3 {
        let n = SEG * 2 + 7;
        for i in next..next + n {
            // SAFETY: the test thread plays the producer.
            assert_eq!(unsafe { p.push(entry(i), true) }, Pushed::Queued);
        }
        let (got, unseen) = claim(&p);
        assert_eq!(got, (next..next + n).collect::<Vec<_>>(), "round {round}");
        assert_eq!(unseen, 0);
        next += n;
    }
    assert_eq!(p.added(), next as u64);
    assert_eq!(claim(&p), (vec![], 0), "nothing twice");
}

#[test]
fn the_last_entry_can_be_taken_back_until_the_worker_claims_it() {
    let p = ring();
    unsafe {
        assert_eq!(p.push(entry(0), true), Pushed::Queued);
        assert_eq!(p.push(entry(1), true), Pushed::Queued);
        assert!(!p.unpublish(entry(0)), "only the last one");
        assert!(p.pushed_last(entry(1)));
        assert!(p.unpublish(entry(1)));
        assert!(!p.unpublish(entry(1)), "not twice");
        assert_eq!(p.push(entry(2), true), Pushed::Queued);
    }
    assert_eq!(claim(&p), (vec![0, 2], 1), "taken back, counted once");
    unsafe {
        assert_eq!(p.push(entry(3), true), Pushed::Queued);
    }
    assert_eq!(claim(&p), (vec![3], 0));
    unsafe {
        assert!(!p.unpublish(entry(3)), "claimed: too late");
    }
    assert_eq!(p.added(), 4, "a timeout taken back was still accepted");
}

/// Issue 32: `P` counts pushes modulo 2^32. Past the wrap, the word a
/// push leaves (and the one unpublish computes from it) must wrap too,
/// not overflow: with overflow checks on, `cancel()` panicked there
/// after it had already cancelled the timeout.
#[test]
fn pushes_and_take_backs_go_on_past_the_counts_wrap() {
    let p = Ring::counted_from(u32::MAX - 2);
    let mut expected = Vec::new();
    let mut unseen = 0;
    for i in 0..8 {
        // SAFETY: the test thread plays the producer.
        unsafe {
            assert_eq!(p.push(entry(i), true), Pushed::Queued, "push {i}");
            if i % 2 == 1 {
                assert!(p.unpublish(entry(i)), "take back {i}");
                unseen += 1;
            } else {
                expected.push(i);
            }
        }
        // A claim after every other push flips EPOCH, so that the word
        // left by the push that wraps `P` to 0 is not 0.
        if i % 4 == 2 {
            let (got, u) = claim(&p);
            assert_eq!(got, expected, "claim after push {i}");
            assert_eq!(u, unseen);
            expected.clear();
            unseen = 0;
        }
    }
    assert_eq!(claim(&p), (expected, unseen));
    // SAFETY: as above.
    unsafe { assert_eq!(p.accepted(), 8) };
    assert_eq!(p.added(), 8);
}

#[test]
fn a_push_into_an_armed_ring_asks_for_a_wake_up_once() {
    let p = ring();
    unsafe {
        assert!(p.arm());
        assert_eq!(p.push(entry(0), true), Pushed::QueuedWake);
        assert_eq!(p.push(entry(1), true), Pushed::Queued);
        assert!(!p.arm(), "unclaimed entries: no doze");
        assert!(p.has_input());
    }
    assert_eq!(claim(&p).0, vec![0, 1]);
    unsafe {
        assert!(!p.has_input());
        assert!(p.arm());
    }
    unsafe { p.disarm() };
    unsafe {
        assert_eq!(p.push(entry(2), true), Pushed::Queued);
    }
}

#[test]
fn a_closed_ring_hands_over_what_it_holds_and_refuses_the_rest() {
    let p = ring();
    let mut got = Vec::new();
    unsafe {
        assert_eq!(p.push(entry(0), true), Pushed::Queued);
        assert_eq!(p.push(entry(1), true), Pushed::Queued);
        assert!(p.unpublish(entry(1)));
        let unseen = p.close(|e| got.push(e.addr() / 8 - 1));
        assert_eq!((got.clone(), unseen), (vec![0], 1));
        assert_eq!(p.accepted(), 2, "one handed over, one taken back");
        assert!(p.is_closed());
        assert_eq!(p.push(entry(2), true), Pushed::Closed);
        assert!(!p.unpublish(entry(2)));
        assert_eq!(p.accepted(), 2);
    }
    assert_eq!(p.added(), 2, "a refused timeout is not counted");
}
