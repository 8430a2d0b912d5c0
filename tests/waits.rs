//! Every synchronous call that waits returns within its timeout plus at
//! most one `command_timeout` when Redis goes away mid-wait: killed (the
//! connection closes) or frozen (`SIGSTOP`: connections are accepted and
//! never answered, the worse case). Each test stops a real `redis-server`
//! while the call is blocked in it and bounds how long the call took.
//!
//! The bounds are deliberately generous (timeout + `command_timeout` + 2 s
//! of slack for a loaded machine): they catch a wait that runs a whole
//! `command_timeout` (or a connect timeout) over, not milliseconds.

mod support;

use std::sync::mpsc;
use std::time::{Duration, Instant};

use redwheel::{ConsumerOptions, ErrorKind, Queue, Redwheel, RedwheelOptions};
use support::RedisServer;
use support::cluster::wait_until;

/// The command timeout of these tests: short, so a wait that outlives its
/// bound by one is told from the slack.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(1);
/// What the machine's load may add to a bound.
const SLACK: Duration = Duration::from_secs(2);
const HANG: Duration = Duration::from_secs(60);

/// How Redis goes away.
#[derive(Clone, Copy, Debug)]
enum Gone {
    /// SIGKILL: the connections close, new ones are refused.
    Killed,
    /// SIGSTOP: the connections stay open and silent, new ones are
    /// accepted by the kernel and never answered.
    Frozen,
}

fn connect(server: &RedisServer) -> Redwheel {
    connect_with_timeout(server, COMMAND_TIMEOUT)
}

fn connect_with_timeout(server: &RedisServer, command_timeout: Duration) -> Redwheel {
    Redwheel::connect_with(
        &server.url(),
        RedwheelOptions::default().command_timeout(command_timeout),
    )
    .unwrap()
}

/// Clients blocked in Redis (`BLMOVE`).
fn blocked_clients(server: &RedisServer) -> u64 {
    server
        .info("clients")
        .lines()
        .find_map(|l| l.strip_prefix("blocked_clients:"))
        .map(|n| n.trim().parse().unwrap())
        .unwrap_or(0)
}

fn go_away(server: &mut RedisServer, how: Gone) {
    match how {
        Gone::Killed => server.kill(),
        Gone::Frozen => server.signal("STOP"),
    }
}

/// Runs `call` (which waits up to `timeout` on an empty queue) on a
/// thread, makes Redis go away once the call is blocked in it, and returns
/// the call's outcome (`Ok(true)`: something came, `Ok(false)`: nothing)
/// and how long it took from its start.
fn stop_mid_wait(
    how: Gone,
    timeout: Duration,
    call: impl FnOnce(&Queue<String>, Duration) -> Result<bool, redwheel::Error> + Send + 'static,
) -> (Result<bool, redwheel::Error>, Duration) {
    let mut server = RedisServer::start();
    let rw = connect(&server);
    let q = rw.queue::<String>("waits").unwrap();
    let (tx, rx) = mpsc::channel();
    let waiter = {
        let q = q.clone();
        std::thread::spawn(move || {
            let started = Instant::now();
            let r = call(&q, timeout);
            tx.send(started.elapsed()).unwrap();
            r
        })
    };
    wait_until("the call blocks in redis", HANG, || {
        blocked_clients(&server) > 0
    });
    go_away(&mut server, how);
    let took = rx
        .recv_timeout(HANG)
        .expect("hang guard: the call returned");
    let r = waiter.join().unwrap();
    if matches!(how, Gone::Frozen) {
        server.signal("CONT");
    }
    eprintln!("{how:?} mid-wait ({timeout:?}): {r:?} after {took:?}");
    (r, took)
}

/// The outcome the docs promise: nothing (`Ok(None)`, never a message
/// here), or a transient error.
fn assert_documented(r: &Result<bool, redwheel::Error>) {
    match r {
        Ok(got) => assert!(!got, "the queue was empty"),
        Err(e) => assert!(
            e.is_transient(),
            "a wait cut by Redis going away fails with a transient error: {e:?}"
        ),
    }
}

fn assert_within(took: Duration, timeout: Duration) {
    assert_within_of(took, timeout, COMMAND_TIMEOUT);
}

fn assert_within_of(took: Duration, timeout: Duration, command_timeout: Duration) {
    let bound = timeout + command_timeout + SLACK;
    assert!(
        took <= bound,
        "returned after {took:?}, more than {timeout:?} + command_timeout {command_timeout:?} + {SLACK:?} of slack"
    );
}

const POLL: Duration = Duration::from_secs(3);

fn poll(q: &Queue<String>, t: Duration) -> Result<bool, redwheel::Error> {
    q.poll(t).map(|m| m.is_some())
}

fn claim(q: &Queue<String>, t: Duration) -> Result<bool, redwheel::Error> {
    q.claim(t).map(|d| d.is_some())
}

fn claim_batch(q: &Queue<String>, t: Duration) -> Result<bool, redwheel::Error> {
    q.claim_batch(10, t).map(|b| !b.is_empty())
}

// The port of Redisson's `testPollWithBrokenConnection`: a 5 s poll whose
// Redis is stopped after a second. Here with the default command timeout
// (5 s), as the report measured it: 10 s.
#[test]
fn a_poll_whose_redis_is_killed_mid_wait_returns_within_its_timeout_and_one_command_timeout() {
    let mut server = RedisServer::start();
    let rw = server.connect();
    let q = rw.queue::<String>("broken").unwrap();
    let waiter = {
        let q = q.clone();
        std::thread::spawn(move || {
            let started = Instant::now();
            (q.poll(Duration::from_secs(5)), started.elapsed())
        })
    };
    wait_until("the poll blocks in redis", HANG, || {
        blocked_clients(&server) > 0
    });
    server.kill();
    let (r, took) = support::within(HANG, move || waiter.join().unwrap());
    eprintln!("killed mid-poll: {r:?} after {took:?}");
    assert_documented(&r.map(|m| m.is_some()));
    let bound = Duration::from_secs(5) + Duration::from_secs(5) + SLACK;
    assert!(took <= bound, "returned after {took:?}");
}

#[test]
fn a_poll_whose_redis_is_killed_mid_wait_returns_in_time() {
    let (r, took) = stop_mid_wait(Gone::Killed, POLL, poll);
    assert_documented(&r);
    assert_within(took, POLL);
}

#[test]
fn a_poll_whose_redis_freezes_mid_wait_returns_in_time() {
    let (r, took) = stop_mid_wait(Gone::Frozen, POLL, poll);
    assert_documented(&r);
    assert_within(took, POLL);
}

#[test]
fn a_claim_whose_redis_is_killed_mid_wait_returns_in_time() {
    let (r, took) = stop_mid_wait(Gone::Killed, POLL, claim);
    assert_documented(&r);
    assert_within(took, POLL);
}

#[test]
fn a_claim_whose_redis_freezes_mid_wait_returns_in_time() {
    let (r, took) = stop_mid_wait(Gone::Frozen, POLL, claim);
    assert_documented(&r);
    assert_within(took, POLL);
}

#[test]
fn a_claim_batch_whose_redis_is_killed_mid_wait_returns_in_time() {
    let (r, took) = stop_mid_wait(Gone::Killed, POLL, claim_batch);
    assert_documented(&r);
    assert_within(took, POLL);
}

#[test]
fn a_claim_batch_whose_redis_freezes_mid_wait_returns_in_time() {
    let (r, took) = stop_mid_wait(Gone::Frozen, POLL, claim_batch);
    assert_documented(&r);
    assert_within(took, POLL);
}

/// A pool of `workers` whose handlers all hold their message until the
/// test lets them go, with Redis gone (`how`) while they run: its
/// shutdown(grace) gives up on the handlers after `grace` and tries to
/// give their messages back, which Redis cannot take.
fn consumer_shutdown_with_redis_gone(how: Gone) {
    const WORKERS: usize = 6;
    let grace = Duration::from_secs(1);
    let mut server = RedisServer::start();
    let rw = connect(&server);
    let q = rw.queue::<String>("pool").unwrap();
    for i in 0..WORKERS {
        q.offer(&format!("m{i}"), Duration::ZERO).unwrap();
    }
    let (started_tx, started) = mpsc::channel::<()>();
    let (release_tx, release) = crossbeam_channel::unbounded::<()>();
    let consumer = q
        .consume(
            ConsumerOptions::default().concurrency(WORKERS),
            move |_d| -> Result<(), String> {
                let _ = started_tx.send(());
                let _ = release.recv_timeout(HANG);
                Ok(())
            },
        )
        .unwrap();
    for _ in 0..WORKERS {
        started.recv_timeout(HANG).expect("every handler runs");
    }
    go_away(&mut server, how);
    let begun = Instant::now();
    let r = support::within(HANG, move || consumer.shutdown(grace));
    let took = begun.elapsed();
    eprintln!("{how:?}: consumer shutdown({grace:?}) gave {r:?} after {took:?}");
    drop(release_tx);
    if matches!(how, Gone::Frozen) {
        server.signal("CONT");
    }
    let e = r.expect_err("handlers were still running");
    assert_eq!(e.kind(), ErrorKind::ShutdownTimeout, "{e:?}");
    assert_within(took, grace);
}

#[test]
fn a_consumer_pool_shuts_down_in_time_when_redis_was_killed() {
    consumer_shutdown_with_redis_gone(Gone::Killed);
}

#[test]
fn a_consumer_pool_shuts_down_in_time_when_redis_froze() {
    consumer_shutdown_with_redis_gone(Gone::Frozen);
}

/// A `Redwheel` with a `take` blocked in Redis, a queue whose transfer
/// is due every few milliseconds and a lock held (its renewals on the
/// driver), shut down with Redis gone. The shutdown returns within its
/// timeout, and the blocked take within `max_block` (1 s) plus one
/// `command_timeout` (3 s here, so that a take that waits two reads of
/// that long is told from one that waits one).
fn redwheel_shutdown_with_redis_gone(how: Gone) {
    let timeout = Duration::from_secs(1);
    let command_timeout = Duration::from_secs(3);
    let max_block = Duration::from_secs(1);
    let mut server = RedisServer::start();
    let rw = connect_with_timeout(&server, command_timeout);
    let q = rw.queue::<String>("busy").unwrap();
    for i in 0..50u64 {
        q.offer(&format!("m{i}"), Duration::from_millis(200 + i * 20))
            .unwrap();
    }
    let _guard = rw.lock("held").lock().unwrap();
    let other = rw.queue::<String>("idle").unwrap();
    let waiter = std::thread::spawn(move || other.take().map(|_| ()));
    wait_until("the take blocks in redis", HANG, || {
        blocked_clients(&server) > 0
    });
    go_away(&mut server, how);
    let begun = Instant::now();
    let r = {
        let rw = rw.clone();
        support::within(HANG, move || rw.shutdown(timeout))
    };
    let took = begun.elapsed();
    eprintln!("{how:?}: Redwheel::shutdown({timeout:?}) gave {r:?} after {took:?}");
    if let Err(e) = &r {
        assert_eq!(e.kind(), ErrorKind::ShutdownTimeout, "{e:?}");
    }
    assert_within_of(took, timeout, command_timeout);
    let (r, took) = support::within(HANG, move || {
        let r = waiter.join().unwrap();
        (r, begun.elapsed())
    });
    if matches!(how, Gone::Frozen) {
        server.signal("CONT");
    }
    eprintln!("{how:?}: the blocked take gave {r:?} after {took:?}");
    let e = r.expect_err("a take ends at shutdown");
    assert!(e.is_transient() || e.kind() == ErrorKind::Shutdown, "{e:?}");
    assert_within_of(took, max_block, command_timeout);
}

#[test]
fn a_redwheel_shuts_down_in_time_when_redis_was_killed() {
    redwheel_shutdown_with_redis_gone(Gone::Killed);
}

#[test]
fn a_redwheel_shuts_down_in_time_when_redis_froze() {
    redwheel_shutdown_with_redis_gone(Gone::Frozen);
}

/// An idle pool whose claim waits a long `poll` (60 s) in Redis, asked to
/// shut down with a 5 s grace: the wait ends within `max_block` (1 s by
/// default), so the shutdown is clean. It waited out the poll before (a
/// `ShutdownTimeout` after the grace, the claimer still blocked).
#[test]
fn an_idle_pool_with_a_long_poll_shuts_down_without_waiting_it_out() {
    let server = RedisServer::start();
    let rw = connect(&server);
    let q = rw.queue::<String>("idle-pool").unwrap();
    let consumer = q
        .consume(
            ConsumerOptions::default().poll(Duration::from_secs(60)),
            |_d| Ok::<(), String>(()),
        )
        .unwrap();
    wait_until("the pool's claim blocks in Redis", HANG, || {
        blocked_clients(&server) > 0
    });
    let grace = Duration::from_secs(5);
    let begun = Instant::now();
    let r = support::within(HANG, move || consumer.shutdown(grace));
    eprintln!(
        "shutdown({grace:?}) of an idle pool polling 60 s: {r:?} after {:?}",
        begun.elapsed()
    );
    r.expect("the idle claim ends at the shutdown, not after its poll");
}
