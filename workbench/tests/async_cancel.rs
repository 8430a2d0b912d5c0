//! Cancellation of the async API (feature `async`): every future dropped
//! at each of its await points, driven by hand (no executor) so the point
//! is exact: before its first poll, while waiting, with its command on the
//! wire (the reply held back by the fault proxy), and with its reply
//! arrived but not yet read. Nothing is lost, nothing is held:
//!
//! * a dropped take never loses a message: one it was handed goes back
//!   to the head of the ready list;
//! * a dropped claim gives what it claimed back;
//! * a dropped `lock_async` that was granted the lock releases it;
//! * dropping a guard unlocks without waiting on Redis in the dropping
//!   thread; a dropped `unlock_async` still unlocks;
//! * a dropped offer, retried with its id, writes the message once;
//! * a dropped stream of deliveries gives back what it had not handed out.

mod async_common;
#[path = "async_common/faults.rs"]
mod async_faults;
#[path = "../../tests/faults_common/mod.rs"]
mod faults_common;
mod support;

use std::pin::Pin;
use std::time::Duration;

use async_common::{Manual, wait_for};
use async_faults::{LostTake, ready, take_with_its_reply_lost, two_ready, warm_up};
use faults_common::{Env, HANG, scripts, sha, string, strings};
use redwheel::{MessageId, Queue};
use support::proxy::{Fault, Rule};

/// The same for the lock scripts.
fn warm_up_locks(env: &Env) {
    let g = Manual::new(env.rw.lock("warm-up").lock_async())
        .finish()
        .unwrap();
    Manual::new(g.unlock_async()).finish().unwrap();
}

#[test]
fn a_take_dropped_before_its_first_poll_sends_nothing() {
    let env = Env::start();
    let q: Queue<String> = env.rw.queue("t0").unwrap();
    let (a, _) = two_ready(&env, &q);
    let seen = env
        .proxy
        .inject(Rule::new(Fault::Forward).matching(sha(scripts::TAKE)));
    drop(q.take_async());
    assert_eq!(seen.matched(), 0);
    assert_eq!(ready(&env, "t0")[0], a.as_str());
}

#[test]
fn a_take_dropped_while_waiting_takes_nothing() {
    let env = Env::start();
    let q: Queue<String> = env.rw.queue("t1").unwrap();
    warm_up(&q);
    let seen = env
        .proxy
        .inject(Rule::new(Fault::Forward).matching(sha(scripts::TAKE)));
    let mut take = Manual::new(q.take_async());
    assert!(take.poll().is_pending());
    // Its first attempt found nothing; it now waits for the ready list.
    seen.wait_fired(1, HANG);
    take.wait_woken();
    assert!(take.poll().is_pending());
    drop(take);
    let id = q.offer(&"later".to_string(), Duration::ZERO).unwrap();
    env.wait_ready("t1", 1);
    assert_eq!(seen.fired(), 1, "no take after the drop");
    let m = Manual::new(q.take_async()).finish().unwrap();
    assert_eq!(m.id(), &id);
}

#[test]
fn a_take_dropped_with_its_script_on_the_wire_puts_the_message_back_at_the_head() {
    let env = Env::start();
    let q: Queue<String> = env.rw.queue("t2").unwrap();
    warm_up(&q);
    let (a, b) = two_ready(&env, &q);
    let held = env.proxy.inject(
        Rule::new(Fault::Delay(Duration::from_millis(200)))
            .matching(sha(scripts::TAKE))
            .times(1),
    );
    let mut take = Manual::new(q.take_async());
    assert!(take.poll().is_pending());
    assert!(held.wait_matched(1, HANG), "the take reached the server");
    drop(take); // its reply is still held back by the proxy
    // The script ran (its reply passed the proxy): `a` left the ready list;
    // once the reply comes back to nobody, redwheel puts it back in front
    // of `b`.
    assert!(held.wait_fired(1, HANG), "the take ran on the server");
    wait_for("the message to come back", || {
        ready(&env, "t2") == [a.as_str(), b.as_str()]
    });
    let m = Manual::new(q.take_async()).finish().unwrap();
    assert_eq!((m.id(), m.payload().as_str()), (&a, "first"));
}

#[test]
fn a_take_dropped_after_its_reply_came_but_before_it_was_read_puts_the_message_back() {
    let env = Env::start();
    let q: Queue<String> = env.rw.queue("t3").unwrap();
    warm_up(&q);
    let (a, b) = two_ready(&env, &q);
    let mut take = Manual::new(q.take_async());
    assert!(take.poll().is_pending());
    take.wait_woken(); // the reply (with `a`) is in; never read
    drop(take);
    wait_for("the message to come back", || {
        ready(&env, "t3") == [a.as_str(), b.as_str()]
    });
    let m = Manual::new(q.take_async()).finish().unwrap();
    assert_eq!(m.id(), &a);
}

#[test]
fn a_take_whose_reply_is_lost_is_answered_by_its_reply_record() {
    let env = Env::start();
    let q: Queue<String> = env.rw.queue("t4").unwrap();
    warm_up(&q);
    let (a, b) = two_ready(&env, &q);
    let lost = env.proxy.inject(
        Rule::new(Fault::LoseReply)
            .matching(sha(scripts::TAKE))
            .times(1),
    );
    let m = Manual::new(q.take_async()).finish().unwrap();
    assert_eq!(lost.fired(), 1);
    // The lost attempt took `a`; the request sent again got `a` from its
    // reply record, and took nothing more.
    assert_eq!(m.id(), &a);
    assert_eq!(ready(&env, "t4"), [b.as_str()]);
}

#[test]
fn a_take_dropped_with_its_reply_lost_still_gives_the_message_back() {
    let env = Env::start();
    let q: Queue<String> = env.rw.queue("t5").unwrap();
    let LostTake { a, b, take, lost } = take_with_its_reply_lost(&env, &q);
    drop(take);
    lost.release(); // the connection fails now, with nobody waiting
    // Asked again (the same request), Redis answers `a` from the reply
    // record, and redwheel puts it back in front of `b`.
    wait_for("the message to come back", || {
        ready(&env, "t5") == [a.as_str(), b.as_str()]
    });
}

#[test]
fn a_claim_dropped_with_its_script_on_the_wire_gives_the_message_back() {
    let env = Env::start();
    let q: Queue<String> = env.rw.queue("c1").unwrap();
    warm_up(&q);
    let (a, _) = two_ready(&env, &q);
    let held = env.proxy.inject(
        Rule::new(Fault::Delay(Duration::from_millis(200)))
            .matching(sha(scripts::CLAIM))
            .times(1),
    );
    let mut claim = Manual::new(q.claim_async(Duration::from_secs(5)));
    assert!(claim.poll().is_pending());
    assert!(held.wait_matched(1, HANG));
    drop(claim);
    let inflight = "redwheel:{c1}:inflight";
    wait_for("the claim to be given back", || {
        held.fired() == 1 && env.server.int(&["ZCARD", inflight]) == 0
    });
    // Nothing lost: both are there to be claimed, `a` as its second delivery.
    let mut got = Vec::new();
    while got.len() < 2 {
        let d = Manual::new(q.claim_async(Duration::from_secs(5)))
            .finish()
            .unwrap()
            .expect("a message");
        got.push((d.id().clone(), d.attempt()));
        Manual::new(d.ack_async()).finish().unwrap();
    }
    got.sort();
    assert!(got.contains(&(a, 2)), "{got:?}");
}

#[test]
fn a_claim_dropped_after_its_reply_came_gives_the_message_back() {
    let env = Env::start();
    let q: Queue<String> = env.rw.queue("c2").unwrap();
    warm_up(&q);
    two_ready(&env, &q);
    let mut claim = Manual::new(q.claim_async(Duration::from_secs(5)));
    assert!(claim.poll().is_pending());
    claim.wait_woken();
    drop(claim);
    wait_for("the claim to be given back", || {
        env.server.int(&["ZCARD", "redwheel:{c2}:inflight"]) == 0
    });
    let stored = strings(&env.server, &["HKEYS", "redwheel:{c2}:msg"]);
    assert_eq!(stored.len(), 2, "nothing lost");
}

#[test]
fn a_lock_async_dropped_with_its_acquire_on_the_wire_releases_what_it_was_granted() {
    let env = Env::start();
    let lock = env.rw.lock("l1");
    warm_up_locks(&env);
    let held = env.proxy.inject(
        Rule::new(Fault::Delay(Duration::from_millis(200)))
            .matching(sha(scripts::LOCK_ACQUIRE))
            .times(1),
    );
    let mut acquire = Manual::new(lock.lock_async());
    assert!(acquire.poll().is_pending());
    assert!(held.wait_matched(1, HANG));
    drop(acquire);
    wait_for("the granted lock to be released", || {
        held.fired() == 1 && env.server.int(&["EXISTS", "redwheel:lock:{l1}"]) == 0
    });
    // Free for the next one at once.
    let g = Manual::new(lock.try_lock_async(Duration::ZERO))
        .finish()
        .unwrap();
    assert!(g.is_some());
}

#[test]
fn a_lock_async_dropped_after_its_reply_came_releases_the_lock() {
    let env = Env::start();
    let lock = env.rw.lock("l2");
    warm_up_locks(&env);
    let mut acquire = Manual::new(lock.lock_async());
    assert!(acquire.poll().is_pending());
    acquire.wait_woken();
    drop(acquire);
    wait_for("the lock to be released", || {
        env.server.int(&["EXISTS", "redwheel:lock:{l2}"]) == 0
    });
    assert_eq!(
        env.rw.lock_stats().watchdog_holds,
        0,
        "no hold left renewing"
    );
}

#[test]
fn a_lock_async_dropped_while_waiting_holds_nothing() {
    let env = Env::start();
    let lock = env.rw.lock("l3");
    let holder = lock.lock().unwrap();
    let mut waiting = Manual::new(lock.lock_async());
    assert!(waiting.poll().is_pending());
    waiting.wait_woken(); // its attempt found the lock busy
    assert!(waiting.poll().is_pending()); // now waiting for a release
    drop(waiting);
    holder.unlock().unwrap();
    assert_eq!(env.server.int(&["EXISTS", "redwheel:lock:{l3}"]), 0);
    assert_eq!(env.rw.lock_stats().waiting, 0);
}

#[test]
fn dropping_a_guard_unlocks_without_waiting_on_redis_in_the_dropping_thread() {
    // A proxy that can partition every connection (nothing passes either
    // way, nothing is closed), and a command timeout longer than the hang
    // guard: a drop that waited for Redis's reply would wait for the
    // partition to heal, which comes only after the drop returned.
    let server = support::RedisServer::start();
    let proxy = support::proxy::Proxy::start(server.port());
    let rw = redwheel::Redwheel::connect_with(
        &proxy.url(),
        redwheel::RedwheelOptions::default().command_timeout(HANG * 60),
    )
    .unwrap();
    let lock = rw.lock("l4");
    let g = Manual::new(lock.lock_async()).finish().unwrap();
    proxy.partition(true); // Redis cannot hear or answer now
    let (dropped_tx, dropped_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        drop(g);
        let _ = dropped_tx.send(());
    });
    dropped_rx
        .recv_timeout(HANG)
        .expect("hang guard: the drop waited for a reply that could not come");
    assert_eq!(
        server.int(&["EXISTS", "redwheel:lock:{l4}"]),
        1,
        "the unlock has not reached Redis"
    );
    proxy.partition(false);
    wait_for("the background unlock", || {
        server.int(&["EXISTS", "redwheel:lock:{l4}"]) == 0
    });
}

#[test]
fn a_dropped_unlock_async_still_unlocks() {
    let env = Env::start();
    let lock = env.rw.lock("l5");
    let g = Manual::new(lock.lock_async()).finish().unwrap();
    let mut unlock = Manual::new(g.unlock_async());
    let _ = unlock.poll();
    drop(unlock);
    wait_for("the unlock", || {
        env.server.int(&["EXISTS", "redwheel:lock:{l5}"]) == 0
    });
}

#[test]
fn an_offer_dropped_on_the_wire_and_offered_again_with_its_id_is_written_once() {
    let env = Env::start();
    let q: Queue<String> = env.rw.queue("o1").unwrap();
    warm_up(&q);
    // Loads offer.lua (on another queue).
    let other: Queue<String> = env.rw.queue("o-warm").unwrap();
    Manual::new(other.offer_async(&"w".to_string(), Duration::ZERO))
        .finish()
        .unwrap();
    let id = MessageId::from("order-1");
    drop(q.offer_with_id_async(&id, &"x".to_string(), Duration::from_secs(60)));
    assert!(
        string(&env.server, &["HGET", "redwheel:{o1}:msg", "order-1"]).is_none(),
        "not sent before its first poll"
    );
    let held = env.proxy.inject(
        Rule::new(Fault::Delay(Duration::from_millis(200)))
            .matching(sha(scripts::OFFER))
            .times(1),
    );
    let mut offer =
        Manual::new(q.offer_with_id_async(&id, &"x".to_string(), Duration::from_secs(60)));
    assert!(offer.poll().is_pending());
    assert!(held.wait_matched(1, HANG));
    drop(offer);
    let again = Manual::new(q.offer_with_id_async(&id, &"x".to_string(), Duration::from_secs(60)))
        .finish()
        .unwrap();
    assert!(!again, "the dropped offer had written it");
    assert_eq!(env.server.int(&["ZCARD", "redwheel:{o1}:delayed"]), 1);
}

#[test]
fn a_dropped_stream_gives_back_what_it_had_not_handed_out() {
    let env = Env::start();
    let q: Queue<String> = env.rw.queue("s1").unwrap();
    warm_up(&q);
    for i in 0..3 {
        q.offer(&format!("m{i}"), Duration::ZERO).unwrap();
    }
    env.wait_ready("s1", 3);
    let mut s = q.deliveries(redwheel::ConsumerOptions::default().concurrency(3));
    let first = Manual::new(std::future::poll_fn(|cx| {
        use futures_core::Stream;
        Pin::new(&mut s).poll_next(cx)
    }))
    .finish()
    .unwrap()
    .unwrap();
    // One handed out (held), two claimed with it and not handed out.
    assert_eq!(env.server.int(&["ZCARD", "redwheel:{s1}:inflight"]), 3);
    drop(s);
    wait_for("the two to be given back", || {
        env.server.int(&["ZCARD", "redwheel:{s1}:inflight"]) == 1
    });
    Manual::new(first.ack_async()).finish().unwrap();
    assert_eq!(q.len().unwrap(), 2);
}
