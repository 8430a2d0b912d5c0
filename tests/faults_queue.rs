//! Every queue write (offer, offer_with_id, offer_batch with and without
//! ids, take, remove, requeue_dead) with its reply lost, cut midway or
//! delayed past the command timeout by the proxy, after the server ran
//! it. What the server holds afterwards (read directly, not through the
//! proxy) must match what the caller was told: done once, not done, or
//! `OutcomeUnknown`. Never a silent loss, never a silent duplicate.
//!
//! The offers are also run with the client's connection held open after
//! the lost reply while another process takes the message, and only then
//! reset: a resend of the offer at that point writes the message again
//! (issue 18, item 5).

mod faults_common;
mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use faults_common::{Cut, Env, HANG, ids_with_payload, scripts, sha, strings, under_every_cut};
use redwheel::{Error, Message, MessageId, Queue, QueueOptions};
use support::within;

const HOUR: Duration = Duration::from_secs(3600);

/// One of the four offers, as a single message: the id it went under,
/// and whether the caller was told it was added (`false`: "this id was
/// already known, nothing changed").
#[derive(Debug, Clone, Copy)]
enum Offer {
    Single,
    WithId,
    Batch,
    BatchWithIds,
}

impl Offer {
    fn script(self) -> &'static str {
        match self {
            Offer::Single | Offer::WithId => scripts::OFFER,
            Offer::Batch | Offer::BatchWithIds => scripts::OFFER_BATCH,
        }
    }

    fn run(
        self,
        q: &Queue<String>,
        payload: &str,
        delay: Duration,
    ) -> Result<(String, bool), Error> {
        let p = payload.to_owned();
        let id = MessageId::from(format!("id-{payload}"));
        match self {
            Offer::Single => q.offer(&p, delay).map(|id| (id.into_string(), true)),
            Offer::WithId => q
                .offer_with_id(&id, &p, delay)
                .map(|added| (id.into_string(), added)),
            Offer::Batch => q
                .offer_batch(&[(p, delay)])
                .map(|ids| (ids[0].as_str().to_owned(), true)),
            Offer::BatchWithIds => q
                .offer_batch_with_ids(&[(id.clone(), p, delay)])
                .map(|added| (id.into_string(), added[0])),
        }
    }
}

/// `offer` runs under `cut`: the queue must hold the message once if
/// the caller was told it was added, not at all if it was told it was not.
fn offer_under(offer: Offer, cut: Cut) {
    let env = Env::start();
    let q = env.rw.queue::<String>("q").unwrap();
    offer.run(&q, "warm", HOUR).unwrap();
    let rule = env.proxy.inject(cut.rule(&sha(offer.script())));
    let r = within(HANG, move || offer.run(&q, "m", HOUR));
    assert!(
        rule.wait_fired(1, HANG),
        "the fault fired: the server ran the offer"
    );
    let stored = ids_with_payload(&env.server, "q", "m");
    match r {
        Ok((id, true)) => assert_eq!(
            stored,
            std::slice::from_ref(&id),
            "{offer:?} returned Ok({id}, added): stored once"
        ),
        Ok((id, false)) => panic!(
            "{offer:?} said id {id} was already known and nothing changed, but no message had that id \
             before this call: the call wrote it (stored: {stored:?}) and a resend after the lost reply hid that"
        ),
        Err(e) if e.is_outcome_unknown() => assert!(stored.len() <= 1, "{e}: {stored:?}"),
        Err(e) => assert!(
            stored.is_empty(),
            "{offer:?} failed with {e}, yet wrote {stored:?}"
        ),
    }
}

/// The offer ran; its reply was lost and, before the client's connection
/// was reset, another process took the message. The message was handed
/// out once: whatever the offer reports, it must not be in the queue
/// again.
fn offered_then_taken(offer: Offer) {
    let env = Env::start();
    let q = env.rw.queue::<String>("q").unwrap();
    let other = env.direct();
    let elsewhere = other.queue::<String>("q").unwrap();
    offer.run(&q, "warm", HOUR).unwrap();
    let rule = env
        .proxy
        .inject(Cut::LoseReply.rule(&sha(offer.script())).hold());
    let running = std::thread::spawn(move || offer.run(&q, "m", Duration::ZERO));
    assert!(rule.wait_fired(1, HANG), "the server ran the offer");
    let taken = elsewhere
        .poll(HANG)
        .unwrap()
        .expect("the message, taken by another process");
    assert_eq!(taken.payload(), "m");
    rule.release();
    let r = running.join().unwrap();
    let again = ids_with_payload(&env.server, "q", "m");
    assert!(
        again.is_empty(),
        "{offer:?} (told {r:?}): message {} was taken once and is in the queue again as {again:?}: \
         the offer was resent after its reply was lost and wrote it a second time",
        taken.id()
    );
    match r {
        Ok((id, _)) => assert_eq!(id, taken.id().as_str()),
        Err(e) => assert!(e.is_outcome_unknown(), "the offer ran, yet failed with {e}"),
    }
}

under_every_cut!(offer_once, |cut| offer_under(Offer::Single, cut));
under_every_cut!(offer_with_id_once, |cut| offer_under(Offer::WithId, cut));
under_every_cut!(offer_batch_once, |cut| offer_under(Offer::Batch, cut));
under_every_cut!(offer_batch_with_ids_once, |cut| offer_under(
    Offer::BatchWithIds,
    cut
));

#[test]
fn offer_whose_reply_was_lost_is_not_written_again_after_another_process_took_it() {
    offered_then_taken(Offer::Single)
}

#[test]
fn offer_with_id_whose_reply_was_lost_is_not_written_again_after_another_process_took_it() {
    offered_then_taken(Offer::WithId)
}

#[test]
fn offer_batch_whose_reply_was_lost_is_not_written_again_after_another_process_took_it() {
    offered_then_taken(Offer::Batch)
}

#[test]
fn offer_batch_with_ids_whose_reply_was_lost_is_not_written_again_after_another_process_took_it() {
    offered_then_taken(Offer::BatchWithIds)
}

/// Two messages, "a" then "b", are ready (the take script loaded, a
/// connection idle); a `poll` runs under `cut`, and the fault fired (the
/// server ran the take). Its result, and the environment to read from.
fn take_under(cut: Cut) -> (Env, Result<Option<Message<String>>, Error>) {
    let env = Env::start();
    let q = env.rw.queue::<String>("q").unwrap();
    q.offer(&"warm".to_string(), Duration::ZERO).unwrap();
    assert_eq!(q.poll(HANG).unwrap().unwrap().payload(), "warm");
    q.offer_batch(&[
        ("a".to_string(), Duration::ZERO),
        ("b".to_string(), Duration::ZERO),
    ])
    .unwrap();
    env.wait_ready("q", 2);
    let rule = env.proxy.inject(cut.rule(&sha(scripts::TAKE)));
    let r = within(HANG, move || q.poll(Duration::from_secs(2)));
    assert!(
        rule.wait_fired(1, HANG),
        "the fault fired: the server ran the take"
    );
    (env, r)
}

/// Two messages are ready; a take runs under `cut`. Exactly the message
/// it returns may have left Redis; with `OutcomeUnknown`, at most one.
fn take(cut: Cut) {
    let (env, r) = take_under(cut);
    let gone: BTreeSet<&str> = ["a", "b"]
        .into_iter()
        .filter(|p| ids_with_payload(&env.server, "q", p).is_empty())
        .collect();
    match r {
        Ok(Some(m)) => assert_eq!(
            gone,
            BTreeSet::from([m.payload().as_str()]),
            "take handed over {:?} only, and {:?} left Redis: a message lost without a word",
            m.payload(),
            gone
        ),
        Ok(None) => assert!(
            gone.is_empty(),
            "poll said no message, and {gone:?} left Redis"
        ),
        Err(e) if e.is_outcome_unknown() => assert!(gone.len() <= 1, "{e}: {gone:?} gone"),
        Err(e) => assert!(
            gone.is_empty(),
            "take failed with {e}, and {gone:?} left Redis"
        ),
    }
}

under_every_cut!(take_with_two_ready, take);

/// A delayed message is removed under `cut`: `true` iff this call
/// removed it, `false` iff it is still there (it was known before).
fn remove(cut: Cut) {
    let env = Env::start();
    let q = env.rw.queue::<String>("q").unwrap();
    let warm = q.offer(&"warm".to_string(), HOUR).unwrap();
    assert!(q.remove(&warm).unwrap());
    let id = q.offer(&"m".to_string(), HOUR).unwrap();
    let rule = env.proxy.inject(cut.rule(&sha(scripts::REMOVE)));
    let r = within(HANG, {
        let id = id.clone();
        move || q.remove(&id)
    });
    assert!(
        rule.wait_fired(1, HANG),
        "the fault fired: the server ran the remove"
    );
    let still_there = !ids_with_payload(&env.server, "q", "m").is_empty();
    match r {
        Ok(true) => assert!(
            !still_there,
            "remove said it removed {id}, and it is still there"
        ),
        Ok(false) => assert!(
            still_there,
            "remove said {id} was unknown (already gone), but it was there before the call and this call \
             removed it: the remove was resent after its reply was lost"
        ),
        Err(e) if e.is_outcome_unknown() => {}
        Err(e) => assert!(still_there, "remove failed with {e}, yet removed {id}"),
    }
}

under_every_cut!(remove_a_delayed_message, remove);

/// Four dead letters; `requeue_dead(2)` runs under `cut`. It must requeue
/// at most two, and say how many it did.
fn requeue_dead(cut: Cut) {
    let env = Env::start();
    let q = env
        .rw
        .queue_with::<String>(
            "q",
            QueueOptions::default().max_deliveries(1).visibility(HOUR),
        )
        .unwrap();
    let batch: Vec<(String, Duration)> =
        (0..5).map(|i| (format!("d{i}"), Duration::ZERO)).collect();
    q.offer_batch(&batch).unwrap();
    for _ in 0..5 {
        let d = q.claim(HANG).unwrap().expect("a due message");
        d.nack(Duration::ZERO).unwrap();
    }
    let dead_key = "redwheel:{q}:dead";
    assert_eq!(env.server.int(&["ZCARD", dead_key]), 5);
    assert_eq!(q.requeue_dead(1).unwrap(), 1);
    let rule = env.proxy.inject(cut.rule(&sha(scripts::REQUEUE_DEAD)));
    let r = within(HANG, move || q.requeue_dead(2));
    assert!(
        rule.wait_fired(1, HANG),
        "the fault fired: the server ran the requeue"
    );
    let requeued = 4 - env.server.int(&["ZCARD", dead_key]);
    let ready = strings(&env.server, &["LRANGE", "redwheel:{q}:ready", "0", "-1"]);
    match r {
        Ok(n) => {
            assert!(
                requeued <= 2,
                "requeue_dead(2) returned {n}, but {requeued} dead letters went back to ready ({ready:?}): \
                 more than its limit, because it was resent after its reply was lost"
            );
            assert_eq!(n as i64, requeued, "it says how many it requeued");
        }
        Err(e) if e.is_outcome_unknown() => assert!(requeued <= 2, "{e}: {requeued} requeued"),
        Err(e) => assert_eq!(
            requeued, 0,
            "requeue_dead failed with {e}, yet requeued {requeued}"
        ),
    }
}

under_every_cut!(requeue_dead_with_a_limit, requeue_dead);

/// Two messages are ready; a take runs under `cut`. A take is resent
/// after a lost reply and answered from its reply record: it returns the
/// message its first attempt took (the head), and the other one stays.
fn take_returns_what_it_took(cut: Cut) {
    let (env, r) = take_under(cut);
    let m = r
        .expect("the resent take is answered")
        .expect("with the message");
    assert_eq!(m.payload(), "a", "the message the first attempt took");
    assert!(ids_with_payload(&env.server, "q", "a").is_empty());
    assert_eq!(ids_with_payload(&env.server, "q", "b").len(), 1);
}

under_every_cut!(take_resent_after_a_lost_reply, take_returns_what_it_took);

/// `take.lua` run by hand with one reply record: the request that took a
/// message gets it again when it runs again, and an attempt of an earlier
/// request (a lower number) that reaches Redis late takes nothing.
#[test]
fn an_old_attempt_of_an_earlier_take_takes_nothing_and_a_resend_takes_nothing_more() {
    let env = Env::start();
    let q = env.rw.queue::<String>("q").unwrap();
    q.offer_batch(&[
        ("a".to_string(), Duration::ZERO),
        ("b".to_string(), Duration::ZERO),
    ])
    .unwrap();
    env.wait_ready("q", 2);
    let sha = env.load_script(scripts::TAKE);
    let k = |suffix: &str| format!("redwheel:{{q}}:{suffix}");
    let keys = [
        "ready",
        "msg",
        "attempts",
        "counts",
        "stale",
        "reply:test.0",
        "controls",
        "prioritized",
        "priority",
        "expires",
        "rate",
        "dead",
        "reason",
    ]
    .map(k);
    // Its reply's strings (the header's integers, the controls' gate and
    // the count of messages found past their ttl, are not strings):
    // `{id, value}`, or nothing.
    let take = |seq: &str| {
        let mut cmd = vec!["EVALSHA", sha.as_str(), "13"];
        cmd.extend(keys.iter().map(String::as_str));
        cmd.extend([seq, "60000", "test"]);
        strings(&env.server, &cmd)
    };
    let first = take("5");
    assert_eq!(first.len(), 2, "{first:?}");
    assert!(first[1].ends_with(":a"), "{first:?}");
    assert_eq!(take("5"), first, "the same request: the same answer");
    assert!(
        take("4").is_empty(),
        "an earlier request's attempt: nothing"
    );
    assert_eq!(
        ids_with_payload(&env.server, "q", "b").len(),
        1,
        "b is still there"
    );
    let next = take("6");
    assert!(
        next[1].ends_with(":b"),
        "the next request takes b: {next:?}"
    );
}
