//! Recurring schedules on a queue.
//!
//! Previews a nightly cron schedule in Berlin across the spring-forward
//! night of daylight saving time (02:30 does not exist that night: the
//! run moves to 03:00), then declares two schedules on a queue, an
//! `every 1 s` heartbeat and a cron expression with seconds that fires
//! every second, consumes five occurrences as messages (each is one
//! message due at its occurrence, offered exactly once however many
//! processes declare the schedule), prints how late each was taken, lists
//! the schedules, pauses one and removes both.
//!
//! Run with `cargo run --example schedules`. It uses the Redis at
//! `REDIS_URL` if set; otherwise it starts a throwaway `redis-server` on a
//! free loopback port (and stops it at the end).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redwheel::Redwheel;
use redwheel::schedule::{CatchUp, Schedule, parse_occurrence_id};
use redwheel_testkit::ThrowawayRedis;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // A pure value: no clock, no Redis. 2026-03-28T12:00Z, the day before
    // Europe/Berlin moves from 02:00 CET to 03:00 CEST.
    let nightly = Schedule::cron("30 2 * * *")?.time_zone("Europe/Berlin")?;
    let from = UNIX_EPOCH + Duration::from_secs(1_774_699_200);
    println!("{} runs at (UTC):", nightly.definition());
    for at in nightly.occurrences_after(from).take(3) {
        println!(
            "  {} s after the epoch",
            at.duration_since(UNIX_EPOCH)?.as_secs()
        );
    }
    // 2026-03-29: 02:30 does not exist in Berlin; it runs at 03:00 CEST.
    assert_eq!(
        nightly.next_after(from + Duration::from_secs(43_200)),
        Some(UNIX_EPOCH + Duration::from_secs(1_774_746_000))
    );

    // REDIS_URL, or a throwaway redis-server kept until the end of main.
    let (url, _server) = ThrowawayRedis::unless_redis_url("schedules")?;
    println!("using {url}");
    let rw = Redwheel::connect(&url)?;
    let q = rw.queue::<String>("example-jobs")?;
    q.clear()?;

    // Declared at start-up, in every process: the same definition and
    // payload again change nothing.
    let heartbeat = Schedule::every(Duration::from_secs(1)).catch_up(CatchUp::Skip);
    q.schedule("heartbeat", &heartbeat, &"ping".to_string())?;
    let each_second = Schedule::cron("* * * * * *")?.time_zone("Europe/Berlin")?;
    q.schedule("tick", &each_second, &"tick".to_string())?;

    for _ in 0..5 {
        let m = q.take()?; // blocks until the next occurrence is due
        let (name, at) = parse_occurrence_id(m.id().as_str()).ok_or("not an occurrence")?;
        let late = SystemTime::now().duration_since(at).unwrap_or_default();
        println!(
            "took {:<32} ({name}: {}) {:>6.2} ms after its occurrence",
            m.id(),
            m.payload(),
            late.as_secs_f64() * 1e3
        );
    }

    for s in q.schedules()? {
        println!("{} {} paused: {}", s.name, s.definition, s.paused);
    }
    q.pause_schedule("tick")?; // nothing fires while paused, nothing is owed
    assert!(q.schedules()?.iter().any(|s| s.name == "tick" && s.paused));
    assert!(q.unschedule("heartbeat")?);
    assert!(q.unschedule("tick")?);
    assert!(q.schedules()?.is_empty());
    q.clear()?;
    rw.shutdown(Duration::from_secs(5))?;
    Ok(())
}
