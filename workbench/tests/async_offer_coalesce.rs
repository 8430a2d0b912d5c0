//! `offer_async` and `offer_with_id_async` (feature `async`) send the
//! offers of a queue that come while one is on the wire together, in one
//! `offer_batch.lua` call, against a real redis-server behind the fault
//! proxy (which holds the first offer's reply back, so the others gather
//! behind it): each still gets its own answer, a call that `max_len`
//! refuses whole is sent again offer by offer, and a call whose reply is
//! lost answers `OutcomeUnknown` to each and is never sent again.

#[path = "../../tests/faults_common/mod.rs"]
mod faults_common;
mod support;

use std::time::Duration;

use faults_common::{COMMAND_TIMEOUT, Env, HANG, scripts, sha};
use redwheel::{ErrorKind, MessageId, Queue, QueueOptions};
use support::proxy::{Fault, Rule};

const LATER: Duration = Duration::from_secs(600);

/// Holds the reply of the queue's next `offer.lua` call back for half the
/// command timeout; returns once that call has reached the server.
fn hold_next_offer(env: &Env, q: &Queue<String>) -> std::thread::JoinHandle<()> {
    let held = env.proxy.inject(
        Rule::new(Fault::Delay(COMMAND_TIMEOUT / 2))
            .matching(sha(scripts::OFFER))
            .times(1),
    );
    let first = std::thread::spawn({
        let q = q.clone();
        move || {
            smol::block_on(q.offer_async(&"first".to_string(), LATER)).unwrap();
        }
    });
    assert!(held.wait_matched(1, HANG), "the first offer reached redis");
    first
}

/// Loads `offer.lua` and `offer_batch.lua` (a NOSCRIPT round would be
/// counted as a call) with one message each.
fn warm_up(q: &Queue<String>) {
    smol::block_on(q.offer_async(&"warm".to_string(), LATER)).unwrap();
    smol::block_on(q.offer_batch_async(&[("warm too".to_string(), LATER)])).unwrap();
}

/// Offers `m0`..`m{n-1}` from a task each, all at once; their answers in
/// order.
fn offer_all(q: &Queue<String>, n: usize) -> Vec<Result<MessageId, redwheel::Error>> {
    smol::block_on(async {
        let tasks: Vec<_> = (0..n)
            .map(|i| smol::spawn(q.offer_async(&format!("m{i}"), LATER)))
            .collect();
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await);
        }
        out
    })
}

#[test]
fn offers_that_come_while_one_is_on_the_wire_go_out_in_one_call_each_with_its_own_answer() {
    let env = Env::start();
    let q: Queue<String> = env.rw.queue("gather").unwrap();
    warm_up(&q);
    let batches = env
        .proxy
        .inject(Rule::new(Fault::Forward).matching(sha(scripts::OFFER_BATCH)));
    let first = hold_next_offer(&env, &q);
    // 98 fresh offers and two with one id of the caller's, while the first
    // one's reply is held back.
    let mine = MessageId::from("mine");
    let (fresh, with_id) = smol::block_on(async {
        let fresh: Vec<_> = (0..98)
            .map(|i| smol::spawn(q.offer_async(&format!("m{i}"), LATER)))
            .collect();
        let with_id: Vec<_> = ["a", "b"]
            .iter()
            .map(|p| smol::spawn(q.offer_with_id_async(&mine, &p.to_string(), LATER)))
            .collect();
        let mut out = (Vec::new(), Vec::new());
        for t in fresh {
            out.0.push(t.await.unwrap());
        }
        for t in with_id {
            out.1.push(t.await.unwrap());
        }
        out
    });
    first.join().unwrap();
    assert_eq!(batches.matched(), 1, "the 100 gathered into one call");
    let mut ids: Vec<&str> = fresh.iter().map(MessageId::as_str).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 98, "each offer has an id of its own");
    for id in &ids {
        let there = env.server.cmd(&["HEXISTS", "redwheel:{gather}:msg", id]);
        assert_eq!(there.trim(), ":1", "{id} was written");
    }
    // The id offered twice in one call is written once: one true, one
    // false.
    let mut answers = with_id.clone();
    answers.sort_unstable();
    assert_eq!(answers, [false, true], "{with_id:?}");
    assert_eq!(q.len().unwrap(), 2 + 1 + 98 + 1);
}

#[test]
fn a_call_that_max_len_refuses_whole_is_sent_again_offer_by_offer() {
    let env = Env::start();
    let q: Queue<String> = env
        .rw
        .queue_with("bounded", QueueOptions::default().max_len(4))
        .unwrap();
    warm_up(&q);
    let first = hold_next_offer(&env, &q);
    // Three messages wait (the first is written; its reply is held back):
    // of five offers gathered behind it, the call of all five does not
    // fit, but one of them does.
    let results = offer_all(&q, 5);
    first.join().unwrap();
    let written = results.iter().filter(|r| r.is_ok()).count();
    let full = results
        .iter()
        .filter(|r| matches!(r, Err(e) if e.kind() == ErrorKind::QueueFull))
        .count();
    assert_eq!((written, full), (1, 4), "{results:?}");
    assert_eq!(q.len().unwrap(), 4);
}

#[test]
fn a_gathered_call_whose_reply_is_lost_answers_outcome_unknown_to_each_and_is_not_sent_again() {
    let env = Env::start();
    let q: Queue<String> = env.rw.queue("lost").unwrap();
    warm_up(&q);
    // The gathered call runs on the server; its reply is lost with the
    // connection.
    let lost = env.proxy.inject(
        Rule::new(Fault::LoseReply)
            .matching(sha(scripts::OFFER_BATCH))
            .times(1),
    );
    let first = hold_next_offer(&env, &q);
    let results = offer_all(&q, 10);
    first.join().unwrap();
    assert_eq!(
        lost.fired(),
        1,
        "the gathered call ran and its reply was lost"
    );
    for r in &results {
        let e = r.as_ref().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::OutcomeUnknown, "{e}");
    }
    assert_eq!(lost.matched(), 1, "never sent again");
    // It ran whole: all ten are written, once.
    assert_eq!(q.len().unwrap(), 2 + 1 + 10);
}
