//! The controls' metrics (feature `metrics`): messages past their ttl are
//! counted in `redwheel_messages_expired_total` and
//! `redwheel_messages_dead_lettered_total`, whether the transfer job or a
//! consumer found them, as `QueueStats::expired` counts them in Redis.
#![cfg(feature = "metrics")]

mod support;

use std::time::Duration;

use redwheel::{OfferOptions, QueueOptions};
use support::metrics::{Scrape, delta, endpoint, recorder, scrape_when, until};
use support::{RedisServer, within};

#[test]
fn expired_messages_are_counted_by_whoever_found_them() {
    within(Duration::from_secs(120), || {
        recorder();
        let server = RedisServer::start();
        let rw = server.connect();
        let http = endpoint();
        // No guard sweep for a day: the transfer job runs when woken only.
        let q = rw
            .queue_with::<String>(
                "m-ttl",
                QueueOptions::default().guard_interval(Duration::from_secs(86_400)),
            )
            .unwrap();
        let label = [("queue", "m-ttl")];
        let start = Scrape::of(&http);
        // Found by the transfer job: its ttl runs out while nobody takes it.
        q.pause().unwrap();
        q.offer_with(
            &"a".into(),
            OfferOptions::default()
                .id("a")
                .ttl(Duration::from_millis(50)),
        )
        .unwrap();
        let after_job = scrape_when(
            &http,
            &start,
            "redwheel_messages_expired_total",
            &label,
            1.0,
        );
        q.resume().unwrap();
        // Found by a consumer: its deadline moved into the past behind the
        // job's back.
        q.offer_with(
            &"b".into(),
            OfferOptions::default()
                .id("b")
                .ttl(Duration::from_secs(3600)),
        )
        .unwrap();
        until("b moved to ready", || {
            (q.stats().unwrap().delayed == 0).then_some(())
        });
        let past = (server.time_ms() - 10).to_string();
        server.cmd(&["ZADD", "redwheel:{m-ttl}:expires", "XX", &past, "b"]);
        assert!(q.poll(Duration::from_millis(100)).unwrap().is_none());
        let end = scrape_when(
            &http,
            &after_job,
            "redwheel_messages_expired_total",
            &label,
            1.0,
        );
        assert_eq!(
            delta(
                &start,
                &end,
                "redwheel_messages_dead_lettered_total",
                &label
            ),
            2.0
        );
        assert_eq!(q.stats().unwrap().expired, 2);
    });
}
