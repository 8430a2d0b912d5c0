//! What the async layer promises under faults, each promise checked with a
//! real `redis-server` (through the fault proxy where a fault is needed):
//!
//! * a stale ack gathered with the current one is refused as stale, as it
//!   is alone;
//! * a take or claim whose reply was lost and that is dropped before the
//!   resend is on the wire (in the backoff, during an outage, under a
//!   timeout) gives its message back; a claim dropped while it parks an
//!   undecodable message gives its decoded deliveries back at once;
//! * a waker that panics on the I/O thread ends neither that thread nor
//!   the queue's gathered acks;
//! * a connection that sat idle is checked before it carries a write, so a
//!   restart meanwhile costs no `OutcomeUnknown`;
//! * the waits (`poll_async`, `claim_async`, `claim_batch_async`) return
//!   within their timeout plus a command timeout when Redis goes away
//!   mid-wait;
//! * a huge `command_timeout` or `reconnect_backoff` neither panics nor
//!   leaves a future pending.

mod async_common;
#[path = "async_common/faults.rs"]
mod async_faults;
#[path = "../../tests/faults_common/mod.rs"]
mod faults_common;
mod support;

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Wake, Waker};
use std::time::{Duration, Instant};

use async_common::{Manual, tokio_current, wait_for};
use async_faults::{LostTake, ready, take_with_its_reply_lost, two_ready, warm_up};
use faults_common::{Env, HANG, scripts, sha};
use redwheel::{ConsumerOptions, ErrorKind, QueueOptions, Redwheel, RedwheelOptions};
use support::RedisServer;
use support::proxy::{Fault, Proxy, Rule};

/// The scripts these tests aim at beyond `faults_common::scripts`.
const PARK: &str = "park";

/// Longer than any test here: a message that comes back only when its
/// visibility ends never comes back within the test.
const FOREVER: Duration = Duration::from_secs(3600);

fn inflight(env: &Env, q: &str) -> i64 {
    env.server
        .int(&["ZCARD", &format!("redwheel:{{{q}}}:inflight")])
}

// ---- Issue 28, finding 5: a stale ack gathered with the current one ----

#[test]
fn a_stale_ack_gathered_with_the_current_one_is_refused_as_stale() {
    let env = Env::start();
    let short = env
        .rw
        .queue_with::<String>(
            "gathered-stale",
            QueueOptions::default().visibility(Duration::from_millis(200)),
        )
        .unwrap();
    let q = env
        .rw
        .queue_with::<String>(
            "gathered-stale",
            QueueOptions::default().visibility(FOREVER),
        )
        .unwrap();
    warm_up(&q);
    let m = q.offer(&"m".to_string(), Duration::ZERO).unwrap();
    let stale = Manual::new(short.claim_async(HANG))
        .finish()
        .unwrap()
        .expect("the first delivery");
    // Its visibility ends; the message comes back and is claimed again.
    let current = Manual::new(q.claim_async(HANG))
        .finish()
        .unwrap()
        .expect("the second delivery");
    assert_eq!((stale.id(), current.id()), (&m, &m));
    assert_eq!(current.attempt(), 2);
    let o = q.offer(&"other".to_string(), Duration::ZERO).unwrap();
    let other = Manual::new(q.claim_async(HANG))
        .finish()
        .unwrap()
        .expect("the other message");
    assert_eq!(other.id(), &o);
    // The other ack goes first, alone, its reply held back a moment: the
    // two acks of `m` gather behind it into one call.
    let held = env.proxy.inject(
        Rule::new(Fault::Delay(Duration::from_millis(300)))
            .matching(sha(scripts::CLAIM))
            .matching(o.as_str())
            .times(1),
    );
    let mut first = Manual::new(other.ack_async());
    assert!(first.poll().is_pending());
    let mut stale_ack = Manual::new(stale.ack_async());
    assert!(stale_ack.poll().is_pending());
    let mut current_ack = Manual::new(current.ack_async());
    assert!(current_ack.poll().is_pending());
    assert!(held.wait_matched(1, HANG));
    first.finish().unwrap();
    let stale_answer = stale_ack.finish();
    current_ack.finish().unwrap();
    assert_eq!(
        stale_answer.map_err(|e| e.kind()),
        Err(ErrorKind::StaleDelivery),
        "the stale ack is refused, as it is when sent alone"
    );
    assert_eq!(Manual::new(q.stats_async()).finish().unwrap().in_flight, 0);
    assert_eq!(q.len().unwrap(), 0, "the current ack deleted it");
}

// ---- Issue 28, finding 8: a dropped take or claim with a lost reply ----

/// As `take_with_its_reply_lost`, then Redis unreachable: the lost
/// reply's connection is reset, and the take learns of it.
fn lost_take_with_redis_down<'q>(env: &Env, q: &'q redwheel::Queue<String>) -> LostTake<'q> {
    let lost = take_with_its_reply_lost(env, q);
    env.proxy.set_down(true);
    lost.lost.release();
    lost.take.wait_woken();
    lost
}

#[test]
fn a_take_dropped_in_its_backoff_after_a_lost_reply_gives_the_message_back() {
    let env = Env::start();
    let q = env.rw.queue::<String>("lost-backoff").unwrap();
    let LostTake { a, b, mut take, .. } = lost_take_with_redis_down(&env, &q);
    // It learnt of the loss and waits on its backoff to send again.
    assert!(take.poll().is_pending());
    drop(take);
    env.proxy.set_down(false);
    wait_for("the message to come back", || {
        ready(&env, "lost-backoff") == [a.as_str(), b.as_str()]
    });
}

#[test]
fn a_take_dropped_while_its_resend_cannot_connect_gives_the_message_back() {
    let env = Env::start();
    let q = env.rw.queue::<String>("lost-connect").unwrap();
    let LostTake { a, b, mut take, .. } = lost_take_with_redis_down(&env, &q);
    assert!(take.poll().is_pending()); // in its backoff
    take.wait_woken(); // the backoff ended
    // The resend goes to the I/O thread, whose connect is refused: it
    // fails as never sent, and the take is dropped before it reads that.
    assert!(take.poll().is_pending());
    take.wait_woken();
    drop(take);
    env.proxy.set_down(false);
    wait_for("the message to come back", || {
        ready(&env, "lost-connect") == [a.as_str(), b.as_str()]
    });
}

#[test]
fn a_poll_cancelled_by_a_timeout_during_an_outage_after_a_lost_reply_loses_nothing() {
    let env = Env::start();
    let q = env.rw.queue::<String>("lost-outage").unwrap();
    warm_up(&q);
    let (a, b) = two_ready(&env, &q);
    let lost = env.proxy.inject(
        Rule::new(Fault::LoseReply)
            .matching(sha(scripts::TAKE))
            .times(1)
            .hold(),
    );
    let proxy = &env.proxy;
    std::thread::scope(|s| {
        s.spawn(|| {
            assert!(lost.wait_fired(1, HANG));
            // An outage of 1.5 s from the loss on: the task is cancelled
            // by its timeout in the middle of it.
            proxy.set_down(true);
            lost.release();
            std::thread::sleep(Duration::from_millis(1500));
            proxy.set_down(false);
        });
        let r = tokio_current(async {
            tokio::time::timeout(Duration::from_millis(700), q.poll_async(HANG)).await
        });
        assert!(r.is_err(), "cancelled by its timeout: {r:?}");
    });
    wait_for("the message to come back", || {
        ready(&env, "lost-outage") == [a.as_str(), b.as_str()]
    });
}

#[test]
fn a_claim_dropped_in_its_backoff_after_a_lost_reply_gives_the_claim_back() {
    let env = Env::start();
    let q = env
        .rw
        .queue_with::<String>("lost-claim", QueueOptions::default().visibility(FOREVER))
        .unwrap();
    warm_up(&q);
    two_ready(&env, &q);
    let lost = env.proxy.inject(
        Rule::new(Fault::LoseReply)
            .matching(sha(scripts::CLAIM))
            .times(1)
            .hold(),
    );
    let mut claim = Manual::new(q.claim_async(HANG));
    assert!(claim.poll().is_pending());
    assert!(lost.wait_fired(1, HANG));
    assert_eq!(inflight(&env, "lost-claim"), 1, "it claimed one");
    env.proxy.set_down(true);
    lost.release();
    claim.wait_woken();
    assert!(claim.poll().is_pending()); // in its backoff
    drop(claim);
    env.proxy.set_down(false);
    // Given back at once, not when its visibility (an hour) ends.
    wait_for("the claim to be given back", || {
        inflight(&env, "lost-claim") == 0 && ready(&env, "lost-claim").len() == 2
    });
}

/// Queue `name` read as text, with a good, an undecodable and a good
/// message ready, in that order; claims stay visible for an hour.
fn good_bad_good(env: &Env, name: &str) -> redwheel::Queue<String> {
    let raw = env.rw.queue::<Vec<u8>>(name).unwrap();
    let text = env
        .rw
        .queue_with::<String>(name, QueueOptions::default().visibility(FOREVER))
        .unwrap();
    warm_up(&text);
    // Loads park.lua with a first undecodable message.
    raw.offer(&vec![0xff], Duration::ZERO).unwrap();
    env.wait_ready(name, 1);
    let parked = Manual::new(text.claim_async(HANG)).finish().unwrap_err();
    assert_eq!(parked.kind(), ErrorKind::Decode);
    raw.offer(&b"x".to_vec(), Duration::ZERO).unwrap();
    raw.offer(&vec![0xff, 0xfe], Duration::ZERO).unwrap();
    raw.offer(&b"y".to_vec(), Duration::ZERO).unwrap();
    env.wait_ready(name, 3);
    text
}

#[test]
fn a_claim_batch_dropped_while_parking_an_undecodable_message_gives_the_others_back() {
    let env = Env::start();
    let q = good_bad_good(&env, "park-drop");
    let held = env.proxy.inject(
        Rule::new(Fault::Delay(Duration::from_millis(300)))
            .matching(sha(PARK))
            .times(1),
    );
    let mut claim = Manual::new(q.claim_batch_async(3, HANG));
    assert!(claim.poll().is_pending());
    claim.wait_woken(); // the claim's reply
    assert!(claim.poll().is_pending()); // parking the second
    assert!(held.wait_matched(1, HANG), "the park is on the wire");
    drop(claim);
    wait_for("the decoded two to be given back", || {
        inflight(&env, "park-drop") == 0 && ready(&env, "park-drop").len() == 2
    });
    assert_eq!(Manual::new(q.stats_async()).finish().unwrap().dead, 2);
}

#[test]
fn a_stream_dropped_while_parking_an_undecodable_message_gives_the_others_back() {
    let env = Env::start();
    let q = good_bad_good(&env, "park-stream");
    let held = env.proxy.inject(
        Rule::new(Fault::Delay(Duration::from_millis(300)))
            .matching(sha(PARK))
            .times(1),
    );
    let mut s = q.deliveries(ConsumerOptions::default().concurrency(3));
    let mut next = Manual::new(std::future::poll_fn(move |cx| {
        use futures_core::Stream;
        Pin::new(&mut s).poll_next(cx).map(|item| item.map(drop))
    }));
    assert!(next.poll().is_pending());
    next.wait_woken();
    assert!(next.poll().is_pending()); // parking the second
    assert!(held.wait_matched(1, HANG), "the park is on the wire");
    drop(next); // and the stream with it
    wait_for("the decoded two to be given back", || {
        inflight(&env, "park-stream") == 0 && ready(&env, "park-stream").len() == 2
    });
}

// ---- Issue 28, finding 8: panics on the I/O thread ----

/// A waker that records that it was woken, then panics.
#[derive(Default)]
struct Boom(AtomicBool);

impl Wake for Boom {
    fn wake(self: Arc<Self>) {
        self.0.store(true, Ordering::SeqCst);
        panic!("a waker that panics (on purpose, in a test)");
    }
}

#[test]
fn a_waker_that_panics_on_the_io_thread_does_not_end_it() {
    let (_server, rw) = async_common::setup();
    let q = rw.queue::<String>("boom").unwrap();
    warm_up(&q);
    let boom = Arc::new(Boom::default());
    let mut stats = Manual::new(q.stats_async());
    assert!(
        stats
            .poll_with(&Waker::from(Arc::clone(&boom)))
            .is_pending()
    );
    wait_for("the panicking waker to be woken", || {
        boom.0.load(Ordering::SeqCst)
    });
    drop(stats);
    // The node's I/O goes on for every other future.
    let s = Manual::new(q.stats_async()).finish();
    assert!(s.is_ok(), "{s:?}");
    Manual::new(q.offer_async(&"after".to_string(), Duration::ZERO))
        .finish()
        .unwrap();
}

#[test]
fn an_ack_whose_waker_panics_does_not_stop_the_queues_later_acks() {
    let (server, rw) = async_common::setup();
    let q = rw.queue::<String>("boom-ack").unwrap();
    warm_up(&q);
    for p in ["a", "b"] {
        q.offer(&p.to_string(), Duration::ZERO).unwrap();
    }
    let d = Manual::new(q.claim_batch_async(2, HANG)).finish().unwrap();
    assert_eq!(d.len(), 2);
    let boom = Arc::new(Boom::default());
    let mut first = Manual::new(d[0].ack_async());
    // Frozen, the server cannot answer before the first poll returns, so
    // the answer comes through the waker.
    server.signal("STOP");
    let pending = first
        .poll_with(&Waker::from(Arc::clone(&boom)))
        .is_pending();
    server.signal("CONT");
    assert!(pending);
    wait_for("the panicking waker to be woken", || {
        boom.0.load(Ordering::SeqCst)
    });
    drop(first);
    // The gathering of the queue's acks goes on.
    Manual::new(d[1].ack_async()).finish().unwrap();
    assert_eq!(Manual::new(q.stats_async()).finish().unwrap().in_flight, 0);
}

// ---- Issue 29, finding 3: the idle connection ----

#[test]
fn an_offer_on_a_connection_idle_across_a_restart_is_written_not_unknown() {
    let (mut server, rw) = async_common::setup();
    let q = rw.queue::<String>("idle").unwrap();
    Manual::new(q.offer_async(&"before".to_string(), Duration::ZERO))
        .finish()
        .unwrap();
    server.restart(); // closes the mux's connection; nothing persisted
    // The scenario itself (not a synchronisation): the connection sits
    // idle past the second after which a connection is checked.
    std::thread::sleep(Duration::from_millis(1500));
    let r = Manual::new(q.offer_async(&"after".to_string(), Duration::ZERO)).finish();
    assert!(r.is_ok(), "nothing was written before: {r:?}");
    assert_eq!(q.len().unwrap(), 1, "written once");
}

// ---- Issue 28, finding 7: the async waits when Redis goes away ----

/// The command timeout of the waits' tests.
const WAIT_COMMAND_TIMEOUT: Duration = Duration::from_secs(1);
/// How long each wait waits.
const WAIT: Duration = Duration::from_secs(2);
/// Slack for a loaded machine (not a timing claim: the bound asserted is
/// the wait plus a command timeout plus this).
const SLACK: Duration = Duration::from_secs(3);

#[derive(Clone, Copy, Debug)]
enum Away {
    /// SIGSTOP: the server hears and answers nothing.
    Stopped,
    /// SIGKILL: connections reset, new ones refused.
    Killed,
}

#[derive(Clone, Copy, Debug)]
enum WaitCall {
    Poll,
    Claim,
    ClaimBatch,
}

/// Starts `call` on an empty queue, makes Redis go `away` once its first
/// attempt ran, and checks that it returns `Ok` with nothing or a
/// transient error within its wait plus a command timeout (and slack).
fn returns_in_time_when_redis_goes_away(call: WaitCall, away: Away) {
    let mut server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let rw = Redwheel::connect_with(
        &proxy.url(),
        RedwheelOptions::default()
            .command_timeout(WAIT_COMMAND_TIMEOUT)
            .max_block(Duration::from_millis(200)),
    )
    .unwrap();
    let q = rw.queue::<String>("away").unwrap();
    warm_up(&q);
    let script = match call {
        WaitCall::Poll => scripts::TAKE,
        WaitCall::Claim | WaitCall::ClaimBatch => scripts::CLAIM,
    };
    let seen = proxy.inject(Rule::new(Fault::Forward).matching(sha(script)));
    let started = Instant::now();
    let waiting = {
        let q = q.clone();
        std::thread::spawn(move || {
            let r = tokio_current(async move {
                match call {
                    WaitCall::Poll => q.poll_async(WAIT).await.map(|m| m.is_some()),
                    WaitCall::Claim => q.claim_async(WAIT).await.map(|d| d.is_some()),
                    WaitCall::ClaimBatch => {
                        q.claim_batch_async(4, WAIT).await.map(|d| !d.is_empty())
                    }
                }
            });
            (r, started.elapsed())
        })
    };
    assert!(seen.wait_fired(1, HANG), "its first attempt ran");
    match away {
        Away::Stopped => server.signal("STOP"),
        Away::Killed => server.kill(),
    }
    let (r, took) = waiting.join().unwrap();
    if let Away::Stopped = away {
        server.signal("CONT");
    }
    match r {
        Ok(found) => assert!(!found, "nothing was offered"),
        Err(e) => assert!(e.is_transient(), "{call:?}/{away:?}: {e:?}"),
    }
    let bound = WAIT + WAIT_COMMAND_TIMEOUT + SLACK;
    assert!(
        took <= bound,
        "{call:?} with Redis {away:?}: returned after {took:?} (bound {bound:?})"
    );
}

#[test]
fn poll_async_returns_in_time_when_redis_is_stopped_mid_wait() {
    returns_in_time_when_redis_goes_away(WaitCall::Poll, Away::Stopped);
}

#[test]
fn poll_async_returns_in_time_when_redis_is_killed_mid_wait() {
    returns_in_time_when_redis_goes_away(WaitCall::Poll, Away::Killed);
}

#[test]
fn claim_async_returns_in_time_when_redis_is_stopped_mid_wait() {
    returns_in_time_when_redis_goes_away(WaitCall::Claim, Away::Stopped);
}

#[test]
fn claim_async_returns_in_time_when_redis_is_killed_mid_wait() {
    returns_in_time_when_redis_goes_away(WaitCall::Claim, Away::Killed);
}

#[test]
fn claim_batch_async_returns_in_time_when_redis_is_stopped_mid_wait() {
    returns_in_time_when_redis_goes_away(WaitCall::ClaimBatch, Away::Stopped);
}

#[test]
fn claim_batch_async_returns_in_time_when_redis_is_killed_mid_wait() {
    returns_in_time_when_redis_goes_away(WaitCall::ClaimBatch, Away::Killed);
}

// ---- Issue 29, finding 4: huge durations ----

/// A `Redwheel` with `options` on `server`, or `None` if the options are
/// refused, which must then be as `InvalidOption`.
fn connect_or_refused(server: &str, options: RedwheelOptions) -> Option<Redwheel> {
    match Redwheel::connect_with(server, options) {
        Ok(rw) => Some(rw),
        Err(e) => {
            assert_eq!(e.kind(), ErrorKind::InvalidOption, "{e:?}");
            None
        }
    }
}

#[test]
fn a_huge_command_timeout_neither_panics_nor_pends_an_async_call() {
    let server = RedisServer::start();
    // Too long for an `Instant` (any deadline past it overflows), short
    // enough for the synchronous connect to add a second to it.
    let options = RedwheelOptions::default().command_timeout(Duration::from_secs(u64::MAX / 2));
    let Some(rw) = connect_or_refused(&server.url(), options) else {
        return;
    };
    let q = rw.queue::<String>("huge-timeout").unwrap();
    Manual::new(q.stats_async()).finish().unwrap();
    Manual::new(q.offer_async(&"m".to_string(), Duration::ZERO))
        .finish()
        .unwrap();
    let m = Manual::new(q.poll_async(Duration::MAX)).finish().unwrap();
    assert_eq!(m.map(|m| m.into_payload()).as_deref(), Some("m"));
}

#[test]
fn a_huge_reconnect_backoff_neither_panics_nor_pends_the_async_io_thread() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let options = RedwheelOptions::default()
        .command_timeout(Duration::from_millis(500))
        .reconnect_backoff(Duration::MAX, Duration::MAX);
    let Some(rw) = connect_or_refused(&proxy.url(), options) else {
        return;
    };
    let q = rw.queue::<String>("huge-backoff").unwrap();
    Manual::new(q.stats_async()).finish().unwrap();
    proxy.set_down(true);
    // The connect fails: the next attempt waits "forever" (saturated),
    // and every call fails at once meanwhile, none pends.
    for _ in 0..3 {
        let r = Manual::new(q.stats_async()).finish();
        assert_eq!(r.map_err(|e| e.kind()).err(), Some(ErrorKind::Unavailable));
    }
    let r = Manual::new(q.poll_async(Duration::from_millis(200))).finish();
    assert!(
        r.as_ref().is_ok_and(Option::is_none) || r.as_ref().is_err_and(|e| e.is_transient()),
        "{r:?}"
    );
}

#[test]
fn async_waits_of_duration_max_neither_panic_nor_overflow() {
    let (_server, rw) = async_common::setup();
    let q = rw.queue::<String>("max-waits").unwrap();
    for p in ["a", "b", "c", "d"] {
        q.offer(&p.to_string(), Duration::ZERO).unwrap();
    }
    let m = Manual::new(q.poll_async(Duration::MAX)).finish().unwrap();
    assert!(m.is_some());
    let d = Manual::new(q.claim_async(Duration::MAX)).finish().unwrap();
    assert!(d.is_some());
    let ds = Manual::new(q.claim_batch_async(2, Duration::MAX))
        .finish()
        .unwrap();
    assert_eq!(ds.len(), 2);
}
