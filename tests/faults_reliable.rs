//! The writes of at-least-once consumption (claim, ack, nack, extend, and
//! a consumer pool's ack sent with its next claim) with their replies
//! lost, cut midway or delayed past the command timeout by the proxy,
//! after the server ran them. What the server holds afterwards (read
//! directly) must match what the caller was told: done once, not done,
//! or `OutcomeUnknown`.

mod faults_common;
mod support;

use std::sync::mpsc;
use std::time::{Duration, Instant};

use faults_common::{Cut, Env, HANG, ids_with_payload, scripts, sha, string, under_every_cut};
use redwheel::{
    ConsumerOptions, Delivery, Error, ErrorKind, Queue, QueueOptions, Redwheel, RedwheelOptions,
};
use support::proxy::{Fault, Rule};
use support::within;

const HOUR: Duration = Duration::from_secs(3600);

/// A queue whose claims stay hidden for an hour (nothing comes back by
/// itself during a test).
fn queue(env: &Env) -> Queue<String> {
    env.rw
        .queue_with::<String>("q", QueueOptions::default().visibility(HOUR))
        .unwrap()
}

/// Offers `payload`, due at once, and waits until it is ready; returns
/// its id.
fn ready(env: &Env, q: &Queue<String>, payload: &str) -> String {
    let id = q.offer(&payload.to_owned(), Duration::ZERO).unwrap();
    env.wait_ready("q", 1);
    id.into_string()
}

/// Claims, acks: the claim and ack scripts are loaded, and connections
/// sit idle in the pools.
fn warm_up(env: &Env, q: &Queue<String>) {
    ready(env, q, "warm");
    q.claim(HANG)
        .unwrap()
        .expect("the warm-up message")
        .ack()
        .unwrap();
}

/// Where message `id` is, read from the server.
#[derive(Debug, PartialEq)]
struct Where {
    in_flight: bool,
    delayed: bool,
    stored: bool,
    lease: Option<String>,
    attempts: Option<String>,
}

fn where_is(env: &Env, id: &str) -> Where {
    let s = &env.server;
    Where {
        in_flight: string(s, &["ZSCORE", "redwheel:{q}:inflight", id]).is_some(),
        delayed: string(s, &["ZSCORE", "redwheel:{q}:delayed", id]).is_some(),
        stored: string(s, &["HGET", "redwheel:{q}:msg", id]).is_some(),
        lease: string(s, &["HGET", "redwheel:{q}:lease", id]),
        attempts: string(s, &["HGET", "redwheel:{q}:attempts", id]),
    }
}

/// One message "m" is ready (the claim script loaded, connections idle);
/// a `claim` runs under `cut`, and the fault fired (the server ran the
/// claim). The environment, the message's id and the claim's result.
fn claim_under(cut: Cut) -> (Env, String, Result<Option<Delivery<String>>, Error>) {
    let env = Env::start();
    let q = queue(&env);
    warm_up(&env, &q);
    let id = ready(&env, &q, "m");
    let rule = env.proxy.inject(cut.rule(&sha(scripts::CLAIM)));
    let r = within(HANG, move || q.claim(Duration::from_secs(2)));
    assert!(
        rule.wait_fired(1, HANG),
        "the fault fired: the server ran the claim"
    );
    (env, id, r)
}

/// One message is ready; `claim` runs under `cut`. If it says it claimed
/// nothing, nothing may be claimed (hidden from every consumer for the
/// visibility, an attempt counted towards `max_deliveries`); if it
/// returns a delivery, that is the claim Redis holds.
fn claim(cut: Cut) {
    let (env, id, r) = claim_under(cut);
    let w = where_is(&env, &id);
    match r {
        Ok(Some(d)) => {
            assert_eq!(d.id().as_str(), id);
            assert!(w.in_flight, "{w:?}");
            assert_eq!(
                w.lease.as_deref(),
                Some(d.token()),
                "the claim Redis holds is this delivery's"
            );
            assert_eq!(w.attempts, Some(d.attempt().to_string()));
            assert_eq!(d.attempt(), 1, "one claim, one attempt");
        }
        Ok(None) => assert!(
            !w.in_flight && w.attempts.is_none(),
            "claim said no message was claimed, but {id} is in flight (attempt {:?}, lease {:?}): hidden from \
             every consumer until its visibility ends, with an attempt counted towards max_deliveries",
            w.attempts,
            w.lease
        ),
        Err(e) if e.is_outcome_unknown() => {
            assert!(w.attempts.as_deref().is_none_or(|a| a == "1"), "{e}: {w:?}")
        }
        Err(e) => assert!(
            !w.in_flight && w.attempts.is_none(),
            "claim failed with {e}, yet claimed: {w:?}"
        ),
    }
}

under_every_cut!(claim_one_ready, claim);

/// A claimed message is acked under `cut`: `Ok` iff it is gone for good.
fn ack(cut: Cut) {
    let env = Env::start();
    let q = queue(&env);
    warm_up(&env, &q);
    let id = ready(&env, &q, "m");
    let d = q.claim(HANG).unwrap().expect("the message");
    let rule = env.proxy.inject(cut.rule(&sha(scripts::ACK)));
    let r = within(HANG, move || d.ack());
    assert!(
        rule.wait_fired(1, HANG),
        "the fault fired: the server ran the ack"
    );
    let w = where_is(&env, &id);
    let gone = !w.stored && !w.in_flight;
    match r {
        Ok(()) => assert!(gone, "ack said done, but {w:?}"),
        Err(e) if e.is_outcome_unknown() => {}
        Err(e) => assert!(!gone, "ack failed with {e}, yet acked: {w:?}"),
    }
}

under_every_cut!(ack_a_claim, ack);

/// A claimed message is nacked under `cut`: `Ok` iff it is back in the
/// delayed set, `StaleDelivery` iff this call did not touch it.
fn nack(cut: Cut) {
    let env = Env::start();
    let q = queue(&env);
    warm_up(&env, &q);
    ready(&env, &q, "w2");
    q.claim(HANG).unwrap().unwrap().nack(HOUR).unwrap(); // loads nack.lua
    let id = ready(&env, &q, "m");
    let d = q.claim(HANG).unwrap().expect("the message");
    let rule = env.proxy.inject(cut.rule(&sha(scripts::NACK)));
    let r = within(HANG, move || d.nack(HOUR));
    assert!(
        rule.wait_fired(1, HANG),
        "the fault fired: the server ran the nack"
    );
    let w = where_is(&env, &id);
    let nacked = w.delayed && !w.in_flight && w.lease.is_none();
    match r {
        Ok(how) => assert!(nacked, "nack said {how:?}, but {w:?}"),
        Err(e) if e.is_outcome_unknown() => {}
        Err(e) if e.kind() == ErrorKind::StaleDelivery => assert!(
            !nacked,
            "nack was told its delivery was stale and the message untouched, but this very nack gave it back \
             ({w:?}): the nack was resent after its reply was lost and the resend found its own work"
        ),
        Err(e) => assert!(!nacked, "nack failed with {e}, yet nacked: {w:?}"),
    }
}

under_every_cut!(nack_a_claim, nack);

/// A claim's visibility is extended under `cut`: `Ok` iff the deadline
/// in Redis moved.
fn extend(cut: Cut) {
    let env = Env::start();
    let q = queue(&env);
    warm_up(&env, &q);
    let id = ready(&env, &q, "m");
    let d = q.claim(HANG).unwrap().expect("the message");
    d.extend(HOUR).unwrap(); // loads extend.lua
    let score = |env: &Env| -> u64 {
        string(&env.server, &["ZSCORE", "redwheel:{q}:inflight", &id])
            .expect("in flight")
            .parse()
            .unwrap()
    };
    let before = score(&env);
    let rule = env.proxy.inject(cut.rule(&sha(scripts::EXTEND)));
    let r = within(HANG, move || d.extend(10 * HOUR).map(|()| d));
    assert!(
        rule.wait_fired(1, HANG),
        "the fault fired: the server ran the extend"
    );
    let after = score(&env);
    let moved = after > before + 8 * 3_600_000;
    match r {
        Ok(d) => {
            assert!(moved, "extend said done, the deadline is still {after}");
            let told = d
                .visible_until()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis() as u64;
            assert_eq!(told, after, "the delivery's deadline is Redis's");
        }
        Err(e) if e.is_outcome_unknown() => {}
        Err(e) => assert!(!moved, "extend failed with {e}, yet moved the deadline"),
    }
}

under_every_cut!(extend_a_claim, extend);

/// A consumer pool sends a handler's ack with its next claim, in one
/// script call through the command pool. That call's reply is lost
/// under `cut` after Redis acked the message and claimed the next one.
/// With `max_deliveries(1)`, a message claimed by a call whose reply
/// never arrived would go to the dead letters when its visibility ends,
/// delivered once to no handler at all. Every message must reach a
/// handler; none may die.
fn consumer_ack_with_next_claim(cut: Cut) {
    let env = Env::start();
    let q = env
        .rw
        .queue_with::<String>(
            "q",
            QueueOptions::default()
                .max_deliveries(1)
                .visibility(Duration::from_millis(500)),
        )
        .unwrap();
    warm_up(&env, &q);
    let payloads = ["a", "b", "c"];
    q.offer_batch(&payloads.map(|p| (p.to_owned(), Duration::ZERO)))
        .unwrap();
    env.wait_ready("q", 3);
    let (seen_tx, seen_rx) = mpsc::channel::<String>();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let go_rx = std::sync::Mutex::new(go_rx);
    let consumer = q
        .consume(
            ConsumerOptions::default().concurrency(1).claimers(1),
            move |d| {
                let _ = seen_tx.send(d.id().as_str().to_owned());
                // The first handler waits until the fault is in place.
                if let Ok(go) = go_rx.try_lock() {
                    let _ = go.recv_timeout(HANG);
                }
                Ok::<(), String>(())
            },
        )
        .unwrap();
    let first = seen_rx.recv_timeout(HANG).expect("a first delivery");
    // The call that acks the first message (its id is among the script's
    // arguments) gets the fault.
    let rule = env
        .proxy
        .inject(cut.rule(&sha(scripts::CLAIM)).matching(&first));
    // Closed: the first handler returns, later ones do not wait.
    drop(go_tx);
    assert!(
        rule.wait_fired(1, HANG),
        "the fault fired: the server ran the ack and claim"
    );
    // Wait until every message is handled or dead.
    let deadline = Instant::now() + HANG;
    let mut seen = vec![first];
    loop {
        while let Ok(id) = seen_rx.try_recv() {
            seen.push(id);
        }
        let stats = q.stats().unwrap();
        let left = stats.delayed + stats.ready + stats.in_flight;
        if left == 0 || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    consumer.shutdown(Duration::from_secs(10)).unwrap();
    while let Ok(id) = seen_rx.try_recv() {
        seen.push(id);
    }
    let dead: Vec<String> = q
        .dead_letters(10)
        .unwrap()
        .into_iter()
        .map(|d| format!("{} ({})", d.id(), d.reason()))
        .collect();
    let unseen: Vec<&str> = payloads
        .iter()
        .copied()
        .filter(|p| !ids_with_payload(&env.server, "q", p).is_empty())
        .collect();
    assert!(
        dead.is_empty(),
        "dead letters {dead:?}: a message went to the dead letters without ever reaching a handler (handlers saw \
         {seen:?}); the ack+claim call ran again after its reply was lost (resent by the pool, or retried by the \
         consumer although its outcome was unknown), and claimed a message for nobody"
    );
    assert!(unseen.is_empty(), "messages never handled: {unseen:?}");
}

under_every_cut!(
    consumer_acks_with_its_next_claim,
    consumer_ack_with_next_claim
);

/// One message is ready; a claim runs under `cut`. A claim is resent after
/// a lost reply and answered from its reply record: it returns the claim
/// its first attempt made, attempt 1, holding the lease Redis has.
fn claim_returns_what_it_claimed(cut: Cut) {
    let (env, id, r) = claim_under(cut);
    let d = r
        .expect("the resent claim is answered")
        .expect("with the claim");
    let w = where_is(&env, &id);
    assert_eq!(d.id().as_str(), id);
    assert_eq!((d.attempt(), w.attempts.as_deref()), (1, Some("1")));
    assert_eq!(w.lease.as_deref(), Some(d.token()));
    d.ack().unwrap();
    assert!(!where_is(&env, &id).stored, "acked with the replayed token");
}

under_every_cut!(
    claim_resent_after_a_lost_reply,
    claim_returns_what_it_claimed
);

/// `claim.lua` run by hand with one reply record: the request that claimed
/// a message gets the same claim again (its visibility restarted, its
/// attempt not counted again), and an attempt of an earlier request that
/// reaches Redis late claims nothing.
#[test]
fn an_old_attempt_of_an_earlier_claim_claims_nothing_and_a_resend_counts_no_attempt() {
    let env = Env::start();
    let q = queue(&env);
    q.offer_batch(&[
        ("a".to_string(), Duration::ZERO),
        ("b".to_string(), Duration::ZERO),
    ])
    .unwrap();
    env.wait_ready("q", 2);
    let sha = env.load_script(scripts::CLAIM);
    let keys = [
        "ready",
        "msg",
        "inflight",
        "lease",
        "attempts",
        "counts",
        "stale",
        "reply:test.0",
        "head",
        "controls",
        "prioritized",
        "priority",
        "expires",
        "rate",
        "dead",
        "reason",
        "wake",
    ]
    .map(|k| format!("redwheel:{{q}}:{k}"));
    let claim = |seq: &str, vis: &str| {
        let mut cmd = vec!["EVALSHA", sha.as_str(), "17"];
        cmd.extend(keys.iter().map(String::as_str));
        cmd.extend([vis, "tok", "1", seq, "60000", "0"]);
        let resp = env.server.cmd(&cmd);
        // { gate, expired, deadline, refused, acked, id, value, attempt,
        // token }: the header's gate and expired count left out.
        let ints: Vec<i64> = resp
            .split("\r\n")
            .filter_map(|l| l.strip_prefix(':'))
            .map(|n| n.parse().unwrap())
            .skip(2)
            .collect();
        (ints, faults_common::parse_strings(&resp))
    };
    let (ints, strs) = claim("5", "60000");
    assert_eq!(ints[1..], [0, 0, 1], "refused, acked, attempt: {ints:?}");
    let id = strs[0].clone();
    assert!(strs[1].ends_with(":a"), "{strs:?}");
    assert_eq!(strs[2], "tok:1");
    let first_deadline = ints[0];
    let (again, again_strs) = claim("5", "3600000");
    assert_eq!(again_strs, strs, "the same request: the same claim");
    assert_eq!(again[3], 1, "no attempt counted again: {again:?}");
    assert!(
        again[0] > first_deadline,
        "its visibility restarts from the resend"
    );
    let w = where_is(&env, &id);
    assert_eq!(
        (w.attempts.as_deref(), w.lease.as_deref()),
        (Some("1"), Some("tok:1"))
    );
    let (old, old_strs) = claim("4", "60000");
    assert!(
        old_strs.is_empty() && old[1..] == [0, 0],
        "an earlier request's attempt: nothing: {old:?}"
    );
    assert_eq!(
        env.server.int(&["LLEN", "redwheel:{q}:ready"]),
        1,
        "b is still ready"
    );
}

/// A consumer whose claim reply is slow (held back by the proxy) cannot
/// decode the message; meanwhile its visibility ended and another
/// consumer claimed it. The late consumer must not park it as a dead
/// letter: it is the other one's now, and that one's ack must work.
#[test]
fn an_undecodable_claim_is_not_parked_once_another_consumer_holds_it() {
    let env = Env::start();
    // The slow consumer: `String` payloads, a short visibility, and a
    // command timeout long enough to wait for its held reply.
    let slow_rw = Redwheel::connect_with(
        &env.proxy.url(),
        RedwheelOptions::default().command_timeout(Duration::from_secs(30)),
    )
    .unwrap();
    let slow = slow_rw
        .queue_with::<String>(
            "q",
            QueueOptions::default().visibility(Duration::from_millis(200)),
        )
        .unwrap();
    // The other consumer: any bytes, straight to the server.
    let direct = env.direct();
    let other = direct.queue::<Vec<u8>>("q").unwrap();
    // Warm up (the claim script is loaded and matched by its SHA).
    other.offer(&b"warm".to_vec(), Duration::ZERO).unwrap();
    slow.claim(HANG).unwrap().expect("warm").ack().unwrap();
    let id = other.offer(&vec![0xff, 0xfe], Duration::ZERO).unwrap();
    env.wait_ready("q", 1);
    let held = env.proxy.inject(
        Rule::new(Fault::Forward)
            .matching(sha(scripts::CLAIM))
            .hold()
            .times(1),
    );
    let late = std::thread::spawn(move || slow.claim(HANG));
    assert!(held.wait_fired(1, HANG), "the slow consumer claimed it");
    // Its visibility ends; the message is delivered again, to the other.
    let d = other.claim(HANG).unwrap().expect("delivered again");
    assert_eq!((d.id(), d.attempt()), (&id, 2));
    held.release();
    let e = late
        .join()
        .unwrap()
        .expect_err("the payload does not decode");
    assert_eq!(e.kind(), ErrorKind::Decode, "{e}");
    let w = where_is(&env, id.as_str());
    assert!(
        w.in_flight && w.lease.as_deref() == Some(d.token()),
        "the late consumer took the message from the one holding it: {w:?}"
    );
    d.ack().expect("the current claim acks");
    assert!(!where_is(&env, id.as_str()).stored);
    assert!(other.dead_letters(10).unwrap().is_empty());
}
