//! Every public call that takes a `Duration`, over durations up to
//! `Duration::MAX`: none panics (on the caller's thread or a background
//! one) or hangs. A huge duration either saturates, as its docs say (a wait
//! that long waits until it is satisfied, a shutdown that long waits for
//! every thread), or is refused with `ErrorKind::InvalidOption`.
//!
//! Calls that wait are made where they are satisfied at once (a message is
//! ready, the lock is free), so a saturated wait returns; what is checked
//! is the arithmetic on the duration, not the waiting.

mod support;

use std::time::{Duration, SystemTime};

use proptest::prelude::*;
use redwheel::schedule::Schedule;
use redwheel::timer::HashedWheelTimer;
use redwheel::{
    ConsumerOptions, Error, ErrorKind, OfferOptions, QueueOptions, Redwheel, RedwheelOptions,
};
use support::RedisServer;

/// Durations from zero to `Duration::MAX`, weighted towards the edges
/// (the largest ones, and values near what the library adds to them).
fn any_duration() -> impl Strategy<Value = Duration> {
    prop_oneof![
        3 => Just(Duration::MAX),
        1 => Just(Duration::from_secs(u64::MAX)),
        1 => Just(Duration::ZERO),
        3 => (any::<u64>(), 0u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n)),
        2 => (u64::MAX - 100_000..=u64::MAX).prop_map(Duration::from_secs),
        2 => (0u64..=(1 << 53)).prop_map(Duration::from_millis),
        2 => (0u64..120_000).prop_map(Duration::from_millis),
    ]
}

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Accepted, or refused as invalid input (`InvalidOption`; for a delay,
/// `DelayOverflow`, the offers' own kind for a due time past 2^53 ms);
/// anything else is a failure.
fn accepted_or_invalid<T>(what: &str, r: Result<T, Error>) -> Result<Option<T>, TestCaseError> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(e)
            if matches!(
                e.kind(),
                ErrorKind::InvalidOption | ErrorKind::DelayOverflow
            ) =>
        {
            Ok(None)
        }
        Err(e) => Err(TestCaseError::fail(format!(
            "{what}: neither accepted nor InvalidOption: {e:?}"
        ))),
    }
}

/// A `Redwheel` that connected must work: a message offered now is taken.
fn works(rw: &Redwheel) -> Result<(), TestCaseError> {
    let q = rw
        .queue::<String>("works")
        .map_err(|e| TestCaseError::fail(format!("{e:?}")))?;
    q.offer(&"x".to_string(), Duration::ZERO)
        .map_err(|e| TestCaseError::fail(format!("offer: {e:?}")))?;
    let got = q
        .poll(Duration::from_secs(10))
        .map_err(|e| TestCaseError::fail(format!("poll: {e:?}")))?;
    prop_assert!(got.is_some(), "the message offered was taken");
    Ok(())
}

/// Offers a message due now and waits until it is ready, so that a wait
/// of any length finds it at once.
fn one_ready(q: &redwheel::Queue<String>) -> Result<(), TestCaseError> {
    let fail = |e: Error| TestCaseError::fail(format!("{e:?}"));
    let before = q.stats().map_err(fail)?.ready;
    q.offer(&"p".to_string(), Duration::ZERO).map_err(fail)?;
    let give_up = std::time::Instant::now() + Duration::from_secs(30);
    while q.stats().map_err(fail)?.ready <= before {
        prop_assert!(
            std::time::Instant::now() < give_up,
            "hang guard: the message became ready"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    Ok(())
}

fn shutdown(rw: &Redwheel) -> Result<(), TestCaseError> {
    rw.shutdown(Duration::from_secs(10))
        .map_err(|e| TestCaseError::fail(format!("shutdown: {e:?}")))
}

#[test]
fn redwheel_options_accept_or_refuse_every_duration() {
    let server = RedisServer::start();
    let url = server.url();
    proptest!(config(24), |(
        connect in any_duration(),
        command in any_duration(),
        max_block in any_duration(),
        clock in any_duration(),
        min in any_duration(),
        max in any_duration(),
    )| {
      for which in 0..6 {
        // One option huge at a time (the others default), then all at once.
        let d = RedwheelOptions::default();
        let options = match which {
            0 => d.connect_timeout(connect),
            1 => d.command_timeout(command),
            2 => d.max_block(max_block),
            3 => d.clock_refresh(clock),
            4 => d.reconnect_backoff(Duration::from_millis(10), max),
            _ => d
                .connect_timeout(connect)
                .command_timeout(command)
                .max_block(max_block)
                .clock_refresh(clock)
                .reconnect_backoff(min.min(max), max),
        };
        if let Some(rw) = accepted_or_invalid("connect_with", Redwheel::connect_with(&url, options))? {
            works(&rw)?;
            shutdown(&rw)?;
        }
      }
    });
}

#[test]
fn queue_and_consumer_options_accept_or_refuse_every_duration() {
    let server = RedisServer::start();
    let rw = server.connect();
    proptest!(config(16), |(a in any_duration(), b in any_duration())| {
      for which in 0..10 {
        let name = format!("q{which}");
        let q = QueueOptions::default();
        let queue = match which {
            0 => q.guard_interval(a),
            1 => q.visibility(a),
            2 => q.rate_limit(10, a),
            3 => q.wait_replicas(0, a),
            _ => q,
        };
        let Some(queue) = accepted_or_invalid("queue_with", rw.queue_with::<String>(&name, queue))? else {
            continue;
        };
        let c = ConsumerOptions::default();
        let consumer = match which {
            4 => c.handler_timeout(a),
            5 => c.retry_backoff(a.min(b), b),
            6 => c.poll(a),
            7 => c.shutdown_grace(a),
            8 => c.claim_ahead(a),
            _ => c,
        };
        if let Some(pool) = accepted_or_invalid("consume", queue.consume(consumer, |_d| Ok::<(), String>(())))? {
            if which == 7 {
                // Dropped: shut down with its `shutdown_grace`.
                drop(pool);
            } else {
                prop_assert!(pool.shutdown(Duration::from_secs(10)).is_ok());
            }
        }
        if which == 9 {
            // The pool's own shutdown, with every duration.
            let pool = queue
                .consume(ConsumerOptions::default(), |_d| Ok::<(), String>(()))
                .map_err(|e| TestCaseError::fail(format!("{e:?}")))?;
            let r = pool.shutdown(a);
            prop_assert!(
                r.is_ok() || r.as_ref().is_err_and(|e| e.kind() == ErrorKind::ShutdownTimeout),
                "{r:?}"
            );
        }
      }
    });
}

#[test]
fn offers_and_their_delays_accept_or_refuse_every_duration() {
    let server = RedisServer::start();
    let rw = server.connect();
    let q = rw.queue::<String>("offers").unwrap();
    let p = "p".to_string();
    proptest!(config(16), |(a in any_duration())| {
      for which in 0..8 {
        let r = match which {
            0 => q.offer(&p, a).map(drop),
            1 => q.offer_batch(&[(p.clone(), a), (p.clone(), Duration::ZERO)]).map(drop),
            2 => q.offer_with_id(&redwheel::MessageId::from(format!("id{}", a.as_nanos())), &p, a).map(drop),
            3 => q.offer_batch_with_ids(&[(redwheel::MessageId::from(format!("b{}", a.as_nanos())), p.clone(), a)]).map(drop),
            4 => q.offer_with(&p, OfferOptions::after(a)).map(drop),
            5 => q.offer_with(&p, OfferOptions::after(Duration::ZERO).ttl(a)).map(drop),
            6 => q.offer_at(&p, SystemTime::UNIX_EPOCH.checked_add(a).unwrap_or(SystemTime::UNIX_EPOCH)).map(drop),
            _ => q.schedule("s", &Schedule::every(a), &p).map(drop),
        };
        accepted_or_invalid(&format!("offer #{which}"), r)?;
      }
    });
}

#[test]
fn waits_nacks_and_extends_take_every_duration() {
    let server = RedisServer::start();
    let rw = server.connect();
    let q = rw.queue::<String>("waits").unwrap();
    proptest!(config(16), |(a in any_duration())| {
      for which in 0..5 {
        one_ready(&q)?;
        match which {
            0 => {
                let m = q.poll(a).map_err(|e| TestCaseError::fail(format!("poll: {e:?}")))?;
                prop_assert!(m.is_some());
            }
            1 => {
                let d = q.claim(a).map_err(|e| TestCaseError::fail(format!("claim: {e:?}")))?;
                prop_assert!(d.is_some());
                d.unwrap().ack().map_err(|e| TestCaseError::fail(format!("{e:?}")))?;
            }
            2 => {
                let b = q.claim_batch(5, a).map_err(|e| TestCaseError::fail(format!("claim_batch: {e:?}")))?;
                prop_assert!(!b.is_empty());
                for d in b {
                    d.ack().map_err(|e| TestCaseError::fail(format!("{e:?}")))?;
                }
            }
            3 => {
                let d = q.claim(Duration::from_secs(10)).map_err(|e| TestCaseError::fail(format!("{e:?}")))?.unwrap();
                accepted_or_invalid("nack", d.nack(a))?;
                q.remove(d.id()).map_err(|e| TestCaseError::fail(format!("{e:?}")))?;
            }
            _ => {
                let d = q.claim(Duration::from_secs(10)).map_err(|e| TestCaseError::fail(format!("{e:?}")))?.unwrap();
                accepted_or_invalid("extend", d.extend(a))?;
                d.ack().map_err(|e| TestCaseError::fail(format!("{e:?}")))?;
            }
        }
      }
    });
}

#[test]
fn locks_take_every_lease_and_wait() {
    let server = RedisServer::start();
    let rw = server.connect();
    proptest!(config(16), |(a in any_duration(), b in any_duration())| {
      for which in 0..5 {
        let lock = rw.lock(&format!("l{which}"));
        let guard = match which {
            0 => accepted_or_invalid("try_lock", lock.try_lock(a).map(Option::unwrap))?,
            1 => accepted_or_invalid("lock_with_lease", lock.lock_with_lease(a))?,
            2 => accepted_or_invalid("try_lock_with_lease", lock.try_lock_with_lease(a, b).map(Option::unwrap))?,
            3 => accepted_or_invalid("watchdog_lease", lock.watchdog_lease(a).lock())?,
            _ => accepted_or_invalid("wait_replicas", lock.wait_replicas(0, a).lock())?,
        };
        if let Some(g) = guard {
            g.unlock().map_err(|e| TestCaseError::fail(format!("unlock: {e:?}")))?;
        }
      }
    });
}

#[test]
fn a_redwheel_shuts_down_with_every_timeout_and_stays_shut_down() {
    let server = RedisServer::start();
    proptest!(config(12), |(a in any_duration())| {
        let rw = server.connect();
        // A blocked consumer, so there is a thread to wait for.
        let q = rw.queue::<String>("shut").unwrap();
        let waiter = std::thread::spawn(move || q.take().map(drop));
        let r = rw.shutdown(a);
        prop_assert!(
            r.is_ok() || r.as_ref().is_err_and(|e| e.kind() == ErrorKind::ShutdownTimeout),
            "{r:?}"
        );
        prop_assert!(rw.is_shut_down());
        let e = support::within(Duration::from_secs(30), move || waiter.join().unwrap())
            .expect_err("a take ends at shutdown");
        prop_assert!(e.kind() == ErrorKind::Shutdown || e.is_transient(), "{e:?}");
        // A second shutdown returns at once, and the drop too.
        prop_assert!(rw.shutdown(a).is_ok());
    });
}

#[test]
fn the_timer_takes_every_duration() {
    proptest!(config(32), |(a in any_duration(), b in any_duration())| {
        match HashedWheelTimer::builder().tick_duration(a).build() {
            Ok(t) => {
                let timeout = t.new_timeout(b, |_| {});
                prop_assert!(timeout.is_ok(), "{timeout:?}");
                prop_assert!(t.stop().is_ok());
            }
            Err(e) => prop_assert!(e.to_string().contains("tick"), "{e}"),
        }
        let t = HashedWheelTimer::builder().build().unwrap();
        let timeout = t.new_timeout(a, |_| {});
        prop_assert!(timeout.is_ok(), "{timeout:?}");
        prop_assert!(t.stop().is_ok());
    });
}

#[cfg(feature = "async")]
#[test]
fn the_async_calls_take_every_duration() {
    let server = RedisServer::start();
    let rw = server.connect();
    let q = rw.queue::<String>("async").unwrap();
    let p = "p".to_string();
    let timer = HashedWheelTimer::builder().build().unwrap();
    proptest!(config(16), |(a in any_duration())| {
      for which in 0..7 {
        one_ready(&q)?;
        redwheel_testkit::block_on(async {
            match which {
                0 => {
                    let m = q.poll_async(a).await.map_err(|e| TestCaseError::fail(format!("poll_async: {e:?}")))?;
                    prop_assert!(m.is_some());
                }
                1 => {
                    let d = q.claim_async(a).await.map_err(|e| TestCaseError::fail(format!("claim_async: {e:?}")))?;
                    prop_assert!(d.is_some());
                }
                2 => {
                    let b = q.claim_batch_async(3, a).await.map_err(|e| TestCaseError::fail(format!("claim_batch_async: {e:?}")))?;
                    prop_assert!(!b.is_empty());
                }
                3 => {
                    accepted_or_invalid("offer_async", q.offer_async(&p, a).await)?;
                }
                4 => {
                    let g = accepted_or_invalid("try_lock_async", rw.lock("al").try_lock_async(a).await)?;
                    if let Some(Some(g)) = g {
                        g.unlock_async().await.map_err(|e| TestCaseError::fail(format!("{e:?}")))?;
                    }
                }
                5 => {
                    // A huge sleep is dropped unfired; a zero one fires.
                    drop(timer.sleep(a));
                    let fired = timer.sleep(Duration::ZERO).await;
                    prop_assert!(fired.is_ok(), "{fired:?}");
                }
                _ => {
                    accepted_or_invalid("offer_batch_async", q.offer_batch_async(&[(p.clone(), a)]).await)?;
                }
            }
            Ok(())
        })?;
      }
    });
}
