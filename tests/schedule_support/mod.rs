//! Helpers shared by the `schedule_*` tests: instants written as RFC 3339
//! text, occurrences shown on a zone's wall clock.

#![allow(dead_code)] // each test file uses its own part

use std::time::SystemTime;

use jiff::Timestamp;
use jiff::tz::{TimeZone, TimeZoneDatabase};
use redwheel::schedule::Schedule;

/// The instant written `text` ("2026-03-29T03:00:00+02:00").
pub fn at(text: &str) -> SystemTime {
    let ts: Timestamp = text.parse().unwrap_or_else(|e| panic!("{text:?}: {e}"));
    SystemTime::try_from(ts).unwrap()
}

/// A zone of the same bundled database the library uses.
pub fn zone(name: &str) -> TimeZone {
    TimeZoneDatabase::bundled().get(name).unwrap()
}

/// `t` on `zone`'s wall clock, with its offset: "2026-03-29T03:00:00+02:00".
pub fn wall(zone: &TimeZone, t: SystemTime) -> String {
    let ts = Timestamp::try_from(t).unwrap();
    let offset = zone.to_offset(ts);
    let secs = offset.seconds();
    let sign = if secs < 0 { '-' } else { '+' };
    let (h, m) = (secs.abs() / 3600, secs.abs() / 60 % 60);
    format!(
        "{}{sign}{h:02}:{m:02}",
        offset.to_datetime(ts).strftime("%Y-%m-%dT%H:%M:%S")
    )
}

/// The first `n` occurrences of `s` after `from`, on `zone_name`'s wall clock.
pub fn runs(s: &Schedule, zone_name: &str, from: &str, n: usize) -> Vec<String> {
    let z = zone(zone_name);
    s.occurrences_after(at(from))
        .take(n)
        .map(|t| wall(&z, t))
        .collect()
}

/// A cron schedule in a zone.
pub fn cron(expr: &str, zone_name: &str) -> Schedule {
    Schedule::cron(expr).unwrap().time_zone(zone_name).unwrap()
}

/// Takes `n` messages of `q`, each with the Redis server's clock (`TIME`,
/// epoch ms, on a connection to `url`) read right after it was taken.
pub fn take_timed(
    q: &redwheel::Queue<String>,
    url: &str,
    n: usize,
) -> Vec<(redwheel::Message<String>, u64)> {
    let mut con = redis::Client::open(url).unwrap().get_connection().unwrap();
    (0..n)
        .map(|_| {
            let m = q.take().unwrap();
            let (s, us): (u64, u64) = redis::cmd("TIME").query(&mut con).unwrap();
            (m, s * 1000 + us / 1000)
        })
        .collect()
}
