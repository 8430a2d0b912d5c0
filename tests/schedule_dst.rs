//! Daylight saving time, as DESIGN.md "Schedules" spells it out (Debian's
//! cron): a fixed-time job whose time a jump skips fires once at the first
//! instant after the jump, one whose time occurs twice fires once at the
//! first occurrence; a wildcard job follows the wall clock; `every`
//! ignores it. Europe/Berlin 2026 (29 March, 25 October) first, then New
//! York, Lord Howe (a 30-minute shift) and two zones that change at
//! midnight (Santiago, Beirut).

mod schedule_support;

use std::time::Duration;

use redwheel::schedule::Schedule;
use schedule_support::{at, cron, runs};

const BERLIN: &str = "Europe/Berlin";

#[test]
fn berlin_fixed_time_job_skipped_by_the_spring_jump_fires_once_at_the_jump() {
    let s = cron("30 2 * * *", BERLIN);
    assert_eq!(
        runs(&s, BERLIN, "2026-03-27T12:00:00Z", 4),
        [
            "2026-03-28T02:30:00+01:00",
            "2026-03-29T03:00:00+02:00", // 02:30 does not exist: the first instant after the jump
            "2026-03-30T02:30:00+02:00",
            "2026-03-31T02:30:00+02:00",
        ]
    );
}

#[test]
fn berlin_fixed_time_job_repeated_by_the_autumn_jump_fires_once_at_its_first_occurrence() {
    let s = cron("30 2 * * *", BERLIN);
    assert_eq!(
        runs(&s, BERLIN, "2026-10-24T12:00:00Z", 3),
        [
            "2026-10-25T02:30:00+02:00",
            "2026-10-26T02:30:00+01:00",
            "2026-10-27T02:30:00+01:00"
        ]
    );
    // Asked from inside the second pass, it does not fire there either.
    assert_eq!(
        runs(&s, BERLIN, "2026-10-25T02:10:00+01:00", 1),
        ["2026-10-26T02:30:00+01:00"]
    );
}

#[test]
fn berlin_wildcard_job_has_no_run_in_the_skipped_hour() {
    let s = cron("30 * * * *", BERLIN);
    assert_eq!(
        runs(&s, BERLIN, "2026-03-29T00:00:00+01:00", 4),
        [
            "2026-03-29T00:30:00+01:00",
            "2026-03-29T01:30:00+01:00",
            "2026-03-29T03:30:00+02:00",
            "2026-03-29T04:30:00+02:00",
        ]
    );
    let quarter = cron("*/15 * * * *", BERLIN);
    assert_eq!(
        runs(&quarter, BERLIN, "2026-03-29T01:40:00+01:00", 3),
        [
            "2026-03-29T01:45:00+01:00",
            "2026-03-29T03:00:00+02:00",
            "2026-03-29T03:15:00+02:00"
        ]
    );
}

#[test]
fn berlin_wildcard_job_runs_in_both_passes_of_the_repeated_hour() {
    let s = cron("30 * * * *", BERLIN);
    assert_eq!(
        runs(&s, BERLIN, "2026-10-25T01:00:00+02:00", 4),
        [
            "2026-10-25T01:30:00+02:00",
            "2026-10-25T02:30:00+02:00",
            "2026-10-25T02:30:00+01:00",
            "2026-10-25T03:30:00+01:00",
        ]
    );
    let quarter = cron("*/15 * * * *", BERLIN);
    assert_eq!(
        runs(&quarter, BERLIN, "2026-10-25T02:40:00+02:00", 6),
        [
            "2026-10-25T02:45:00+02:00",
            "2026-10-25T02:00:00+01:00",
            "2026-10-25T02:15:00+01:00",
            "2026-10-25T02:30:00+01:00",
            "2026-10-25T02:45:00+01:00",
            "2026-10-25T03:00:00+01:00",
        ]
    );
    // A step in the hour field makes a wildcard job too (`15 */2 * * *`).
    let two_hourly = cron("15 */2 * * *", BERLIN);
    assert_eq!(
        runs(&two_hourly, BERLIN, "2026-10-25T00:00:00+02:00", 4),
        [
            "2026-10-25T00:15:00+02:00",
            "2026-10-25T02:15:00+02:00",
            "2026-10-25T02:15:00+01:00",
            "2026-10-25T04:15:00+01:00",
        ]
    );
    assert_eq!(
        runs(&two_hourly, BERLIN, "2026-03-29T00:00:00+01:00", 2),
        ["2026-03-29T00:15:00+01:00", "2026-03-29T04:15:00+02:00"]
    );
}

#[test]
fn several_skipped_times_of_one_fixed_time_job_are_one_occurrence() {
    for expr in [
        "0,30 2 * * *",
        "0 2,3 * * *",
        "0-59 2 * * *",
        "15 30 2 * * *",
        "*/10 30 2 * * *",
    ] {
        let s = cron(expr, BERLIN);
        let first = runs(&s, BERLIN, "2026-03-29T01:59:00+01:00", 2);
        assert_eq!(first[0], "2026-03-29T03:00:00+02:00", "{expr}");
        assert!(
            first[1].starts_with("2026-03-30T02:"),
            "{expr}: once on 29 March, {first:?}"
        );
    }
    // `0 2,3`: the skipped 02:00 and the real 03:00 are the same instant, once.
    assert_eq!(
        runs(
            &cron("0 2,3 * * *", BERLIN),
            BERLIN,
            "2026-03-29T00:00:00+01:00",
            2
        ),
        ["2026-03-29T03:00:00+02:00", "2026-03-30T02:00:00+02:00"]
    );
    // Every minute of a fixed hour (`0-59 2`): one run for the whole skipped
    // hour, and only the first pass of the repeated one.
    let hour = cron("0-59 2 * * *", BERLIN);
    assert_eq!(
        runs(&hour, BERLIN, "2026-10-25T02:58:00+02:00", 2),
        ["2026-10-25T02:59:00+02:00", "2026-10-26T02:00:00+01:00"]
    );
}

#[test]
fn every_ignores_the_wall_clock_across_both_jumps() {
    let s = Schedule::every(Duration::from_secs(3600));
    for from in ["2026-03-28T22:00:00Z", "2026-10-24T22:00:00Z"] {
        let times: Vec<_> = s.occurrences_after(at(from)).take(8).collect();
        for pair in times.windows(2) {
            assert_eq!(
                pair[1].duration_since(pair[0]).unwrap(),
                Duration::from_secs(3600)
            );
        }
        assert_eq!(times[0], at(from) + Duration::from_secs(3600));
    }
}

#[test]
fn new_york_fixed_and_wildcard_jobs_at_both_2026_changes() {
    const NY: &str = "America/New_York";
    assert_eq!(
        runs(&cron("30 2 * * *", NY), NY, "2026-03-07T12:00:00-05:00", 3),
        [
            "2026-03-08T03:00:00-04:00",
            "2026-03-09T02:30:00-04:00",
            "2026-03-10T02:30:00-04:00"
        ]
    );
    assert_eq!(
        runs(&cron("30 1 * * *", NY), NY, "2026-10-31T12:00:00-04:00", 2),
        ["2026-11-01T01:30:00-04:00", "2026-11-02T01:30:00-05:00"]
    );
    assert_eq!(
        runs(
            &cron("*/30 1 * * *", NY),
            NY,
            "2026-11-01T00:00:00-04:00",
            5
        ),
        [
            "2026-11-01T01:00:00-04:00",
            "2026-11-01T01:30:00-04:00",
            "2026-11-01T01:00:00-05:00",
            "2026-11-01T01:30:00-05:00",
            "2026-11-02T01:00:00-05:00",
        ]
    );
    assert_eq!(
        runs(
            &cron("*/30 2 * * *", NY),
            NY,
            "2026-03-08T00:00:00-05:00",
            1
        ),
        ["2026-03-09T02:00:00-04:00"] // the only 02:xx of 8 March was skipped
    );
}

#[test]
fn lord_howe_half_hour_shift() {
    const LH: &str = "Australia/Lord_Howe";
    // 4 October 2026: 02:00 +10:30 becomes 02:30 +11:00.
    assert_eq!(
        runs(&cron("15 2 * * *", LH), LH, "2026-10-03T12:00:00+10:30", 2),
        ["2026-10-04T02:30:00+11:00", "2026-10-05T02:15:00+11:00"]
    );
    assert_eq!(
        runs(
            &cron("*/20 * * * *", LH),
            LH,
            "2026-10-04T01:30:00+10:30",
            3
        ),
        [
            "2026-10-04T01:40:00+10:30",
            "2026-10-04T02:40:00+11:00",
            "2026-10-04T03:00:00+11:00"
        ]
    );
    // 5 April 2026: 02:00 +11:00 becomes 01:30 +10:30; 01:30-01:59 occurs twice.
    assert_eq!(
        runs(&cron("45 1 * * *", LH), LH, "2026-04-04T12:00:00+11:00", 2),
        ["2026-04-05T01:45:00+11:00", "2026-04-06T01:45:00+10:30"]
    );
    assert_eq!(
        runs(
            &cron("*/20 * * * *", LH),
            LH,
            "2026-04-05T01:30:00+11:00",
            4
        ),
        [
            "2026-04-05T01:40:00+11:00",
            "2026-04-05T01:40:00+10:30",
            "2026-04-05T02:00:00+10:30",
            "2026-04-05T02:20:00+10:30",
        ]
    );
}

#[test]
fn santiago_changes_at_midnight() {
    const SCL: &str = "America/Santiago";
    // 6 September 2026: 00:00 -04 becomes 01:00 -03; midnight does not exist.
    assert_eq!(
        runs(&cron("0 0 * * *", SCL), SCL, "2026-09-05T12:00:00-04:00", 2),
        ["2026-09-06T01:00:00-03:00", "2026-09-07T00:00:00-03:00"]
    );
    // It is a Sunday, and a Sunday job still runs on it, at 01:00.
    assert_eq!(
        runs(
            &cron("30 0 * * sun", SCL),
            SCL,
            "2026-09-01T00:00:00-04:00",
            2
        ),
        ["2026-09-06T01:00:00-03:00", "2026-09-13T00:30:00-03:00"]
    );
    assert_eq!(
        runs(&cron("0 * * * *", SCL), SCL, "2026-09-05T22:30:00-04:00", 3),
        [
            "2026-09-05T23:00:00-04:00",
            "2026-09-06T01:00:00-03:00",
            "2026-09-06T02:00:00-03:00"
        ]
    );
    // 4/5 April 2026: 24:00 -03 becomes 23:00 -04; 23:00-23:59 of 4 April twice.
    assert_eq!(
        runs(
            &cron("30 23 * * *", SCL),
            SCL,
            "2026-04-04T12:00:00-03:00",
            2
        ),
        ["2026-04-04T23:30:00-03:00", "2026-04-05T23:30:00-04:00"]
    );
    assert_eq!(
        runs(
            &cron("30 * * * *", SCL),
            SCL,
            "2026-04-04T22:45:00-03:00",
            3
        ),
        [
            "2026-04-04T23:30:00-03:00",
            "2026-04-04T23:30:00-04:00",
            "2026-04-05T00:30:00-04:00"
        ]
    );
}

#[test]
fn beirut_changes_at_midnight() {
    const BEY: &str = "Asia/Beirut";
    // 29 March 2026 (a Sunday): 00:00 +02 becomes 01:00 +03.
    assert_eq!(
        runs(
            &cron("0 0 * * sun", BEY),
            BEY,
            "2026-03-28T12:00:00+02:00",
            2
        ),
        ["2026-03-29T01:00:00+03:00", "2026-04-05T00:00:00+03:00"]
    );
    assert_eq!(
        runs(
            &cron("20 */1 * * *", BEY),
            BEY,
            "2026-03-28T23:00:00+02:00",
            2
        ),
        ["2026-03-28T23:20:00+02:00", "2026-03-29T01:20:00+03:00"]
    );
    // 24 October 2026 (a Saturday): 24:00 +03 becomes 23:00 +02.
    assert_eq!(
        runs(
            &cron("30 23 * * sat", BEY),
            BEY,
            "2026-10-24T12:00:00+03:00",
            2
        ),
        ["2026-10-24T23:30:00+03:00", "2026-10-31T23:30:00+02:00"]
    );
    assert_eq!(
        runs(
            &cron("*/30 23 * * *", BEY),
            BEY,
            "2026-10-24T22:50:00+03:00",
            5
        ),
        [
            "2026-10-24T23:00:00+03:00",
            "2026-10-24T23:30:00+03:00",
            "2026-10-24T23:00:00+02:00",
            "2026-10-24T23:30:00+02:00",
            "2026-10-25T23:00:00+02:00",
        ]
    );
}

#[test]
fn the_dst_rules_hold_in_berlin_in_every_year_from_2000_to_2040() {
    let z = schedule_support::zone(BERLIN);
    let fixed = cron("30 2 * * *", BERLIN);
    let wild = cron("30 * * * *", BERLIN);
    let start: jiff::Timestamp = "2000-01-01T00:00:00Z".parse().unwrap();
    for tr in z.following(start).take(82) {
        let jump = std::time::SystemTime::try_from(tr.timestamp()).unwrap();
        let before = jump - Duration::from_secs(4 * 3600);
        let spring = tr.offset().seconds() == 7200;
        let fixed_runs: Vec<_> = fixed.occurrences_after(before).take(2).collect();
        let wild_runs: Vec<_> = wild
            .occurrences_after(jump - Duration::from_secs(3600))
            .take(3)
            .collect();
        let hour = Duration::from_secs(3600);
        if spring {
            assert_eq!(fixed_runs[0], jump, "fires at the jump {}", tr.timestamp());
            // 01:30 CET, then 03:30 CEST: two hours of wall clock, one real hour.
            assert_eq!(wild_runs[1] - hour, wild_runs[0]);
            assert_eq!(wild_runs[1], jump + hour / 2);
        } else {
            assert_eq!(
                fixed_runs[0],
                jump - hour / 2,
                "02:30 CEST {}",
                tr.timestamp()
            );
            assert_eq!(
                fixed_runs[1],
                jump - hour / 2 + 24 * hour + hour,
                "the next day"
            );
            assert_eq!(
                wild_runs,
                [jump - hour / 2, jump + hour / 2, jump + 3 * hour / 2]
            );
        }
    }
}

#[test]
fn apia_skipping_a_whole_day_runs_a_fixed_time_job_once_at_the_jump() {
    // 29 December 2011 23:59:59 -10:00 was followed by 31 December 00:00 +14:00.
    const APIA: &str = "Pacific/Apia";
    assert_eq!(
        runs(
            &cron("0 3 * * *", APIA),
            APIA,
            "2011-12-29T00:00:00-10:00",
            3
        ),
        [
            "2011-12-29T03:00:00-10:00",
            "2011-12-31T00:00:00+14:00",
            "2011-12-31T03:00:00+14:00"
        ]
    );
    assert_eq!(
        runs(
            &cron("0 */12 * * *", APIA),
            APIA,
            "2011-12-29T06:00:00-10:00",
            3
        ),
        [
            "2011-12-29T12:00:00-10:00",
            "2011-12-31T00:00:00+14:00",
            "2011-12-31T12:00:00+14:00"
        ]
    );
}
