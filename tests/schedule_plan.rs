//! `Schedule::plan`: what fires at a given moment under each catch-up
//! policy, with times as arguments (no clock), and that applying plans one
//! after another fires no occurrence twice and accounts for every one.

mod schedule_support;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use proptest::prelude::*;
use redwheel::schedule::{CatchUp, MAX_CATCH_UP, MISFIRE_GRACE, Plan, Schedule};
use schedule_support::{at, cron};

fn t(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs)
}

fn summary(p: &Plan) -> (Vec<SystemTime>, u64, SystemTime, Option<SystemTime>) {
    (p.fire.clone(), p.skipped, p.settled, p.next)
}

const POLICIES: [CatchUp; 3] = [CatchUp::Skip, CatchUp::Latest, CatchUp::All { max: 5 }];

#[test]
fn an_occurrence_planned_on_time_fires_under_every_policy() {
    for policy in POLICIES {
        let s = Schedule::every(Duration::from_secs(10)).catch_up(policy);
        let p = s.plan(t(995), t(1000) + Duration::from_millis(3));
        assert_eq!(
            summary(&p),
            (vec![t(1000)], 0, t(1000), Some(t(1010))),
            "{policy:?}"
        );
        // Exactly at the occurrence counts as due.
        let p = s.plan(t(995), t(1000));
        assert_eq!(p.fire, [t(1000)], "{policy:?}");
    }
}

#[test]
fn nothing_due_fires_nothing_and_names_the_next() {
    for policy in POLICIES {
        let s = Schedule::every(Duration::from_secs(10)).catch_up(policy);
        let p = s.plan(t(1000), t(1009));
        assert_eq!(
            summary(&p),
            (vec![], 0, t(1000), Some(t(1010))),
            "{policy:?}"
        );
    }
}

#[test]
fn a_clock_that_went_back_fires_nothing_and_waits_past_what_was_settled() {
    let s = Schedule::every(Duration::from_secs(10));
    let p = s.plan(t(1000), t(970));
    assert_eq!(summary(&p), (vec![], 0, t(1000), Some(t(1010))));
}

#[test]
fn after_downtime_skip_fires_only_an_occurrence_within_the_grace() {
    let s = Schedule::every(Duration::from_secs(600)).catch_up(CatchUp::Skip);
    // Down from 0 to 2 h 5 min: 12 occurrences due, the latest 5 minutes old.
    let p = s.plan(t(0), t(7200 + 300));
    assert_eq!(summary(&p), (vec![], 12, t(7200), Some(t(7800))));
    // Back 30 s after the latest: it is on time.
    let p = s.plan(t(0), t(7200 + 30));
    assert_eq!(summary(&p), (vec![t(7200)], 11, t(7200), Some(t(7800))));
    // The grace is inclusive.
    let p = s.plan(t(0), t(7200) + MISFIRE_GRACE);
    assert_eq!(p.fire, [t(7200)]);
    let p = s.plan(t(0), t(7200) + MISFIRE_GRACE + Duration::from_millis(1));
    assert!(p.fire.is_empty());
}

#[test]
fn after_downtime_latest_fires_the_most_recent_however_old() {
    let s = Schedule::every(Duration::from_secs(600)); // Latest is the default
    assert_eq!(s.catch_up_policy(), CatchUp::Latest);
    let p = s.plan(t(0), t(7200 + 599));
    assert_eq!(summary(&p), (vec![t(7200)], 11, t(7200), Some(t(7800))));
}

#[test]
fn after_downtime_all_fires_up_to_max_of_the_most_recent_oldest_first() {
    let s = Schedule::every(Duration::from_secs(600)).catch_up(CatchUp::All { max: 3 });
    let p = s.plan(t(0), t(7200 + 10));
    assert_eq!(
        summary(&p),
        (vec![t(6000), t(6600), t(7200)], 9, t(7200), Some(t(7800)))
    );
    let s = s.catch_up(CatchUp::All { max: 100 });
    let p = s.plan(t(0), t(7200 + 10));
    assert_eq!(p.fire, (1..=12).map(|k| t(600 * k)).collect::<Vec<_>>());
    assert_eq!(p.skipped, 0);
    // More than MAX_CATCH_UP due: at most MAX_CATCH_UP fire, the rest are counted.
    let s = Schedule::every(Duration::from_millis(1)).catch_up(CatchUp::All { max: MAX_CATCH_UP });
    let p = s.plan(t(0), t(100));
    assert_eq!(p.fire.len(), MAX_CATCH_UP as usize);
    assert_eq!(p.skipped, 100_000 - u64::from(MAX_CATCH_UP));
    assert_eq!(p.fire.last(), Some(&t(100)));
}

#[test]
fn a_long_outage_is_counted_without_walking_it() {
    // Every second for ten years, and a cron every second of one hour a day:
    // the count is arithmetic (and per day), the plan still one occurrence.
    let every = Schedule::every(Duration::from_secs(1));
    let p = every.plan(at("2016-01-01T00:00:00Z"), at("2026-01-01T00:00:00Z"));
    assert_eq!((p.fire.len(), p.skipped), (1, 3653 * 86_400 - 1));
    let hourly = cron("* * 3 * * *", "Europe/Berlin");
    let p = hourly.plan(at("2016-01-01T00:00:00Z"), at("2026-01-01T00:00:00Z"));
    // 3653 days of 3,600 seconds: Berlin's jumps never touch 03:00-03:59
    // (02:00 becomes 03:00 in spring, 03:00 becomes 02:00 in autumn).
    assert_eq!(p.skipped + 1, 3653 * 3600);
    assert_eq!(p.fire, [at("2025-12-31T03:59:59+01:00")]);
}

#[test]
fn a_cron_schedule_catches_up_across_a_dst_jump() {
    let s = cron("30 2 * * *", "Europe/Berlin").catch_up(CatchUp::All { max: 10 });
    let p = s.plan(
        at("2026-03-28T02:30:00+01:00"),
        at("2026-03-31T12:00:00+02:00"),
    );
    assert_eq!(
        p.fire,
        [
            at("2026-03-29T03:00:00+02:00"),
            at("2026-03-30T02:30:00+02:00"),
            at("2026-03-31T02:30:00+02:00")
        ]
    );
    assert_eq!(p.next, Some(at("2026-04-01T02:30:00+02:00")));
    let s = cron("30 2 * * *", "Europe/Berlin").catch_up(CatchUp::All { max: 10 });
    let p = s.plan(
        at("2026-10-24T12:00:00+02:00"),
        at("2026-10-25T12:00:00+01:00"),
    );
    assert_eq!(
        p.fire,
        [at("2026-10-25T02:30:00+02:00")],
        "once, in the first pass"
    );
}

#[test]
fn a_schedule_past_its_end_has_no_next() {
    let s = Schedule::every(Duration::from_secs(10))
        .starting_at(t(1000))
        .until(t(1030));
    assert_eq!(
        s.occurrences_after(t(0)).collect::<Vec<_>>(),
        [t(1000), t(1010), t(1020), t(1030)]
    );
    let p = s.plan(t(1020), t(1035));
    assert_eq!(summary(&p), (vec![t(1030)], 0, t(1030), None));
    let p = s.plan(t(1030), t(5000));
    assert_eq!(summary(&p), (vec![], 0, t(1030), None));
    // Nothing before the start either.
    let p = s.plan(t(0), t(999));
    assert_eq!(summary(&p), (vec![], 0, t(0), Some(t(1000))));
}

/// Plans applied one after another, as a driver would, each from the
/// `settled` of the one before.
fn drive(
    s: &Schedule,
    start: SystemTime,
    nows: &[SystemTime],
) -> (Vec<SystemTime>, u64, Vec<Plan>) {
    let (mut after, mut fired, mut skipped, mut plans) = (start, Vec::new(), 0, Vec::new());
    for &now in nows {
        let p = s.plan(after, now);
        fired.extend(p.fire.iter().copied());
        skipped += p.skipped;
        after = p.settled;
        plans.push(p);
    }
    (fired, skipped, plans)
}

fn schedules() -> impl Strategy<Value = Schedule> {
    let every = (1u64..=120, 0u64..120).prop_map(|(p, a)| {
        Schedule::every(Duration::from_secs(p)).starting_at(t(1_774_000_000 + a))
    });
    let crons = proptest::sample::select(vec![
        ("*/7 * * * * *", "UTC"),
        ("0 */5 * * * *", "Europe/Berlin"),
        ("30 2 * * *", "Europe/Berlin"),
        ("*/10 * * * *", "Australia/Lord_Howe"),
    ])
    .prop_map(|(e, z)| cron(e, z));
    let policy = prop_oneof![
        Just(CatchUp::Skip),
        Just(CatchUp::Latest),
        (1u32..=20).prop_map(|max| CatchUp::All { max }),
    ];
    (prop_oneof![every, crons], policy).prop_map(|(s, p)| s.catch_up(p))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// Whatever the gaps between plans (on time, late, after downtime),
    /// no occurrence fires twice, each fired one is an occurrence, and every
    /// occurrence is either fired or counted as skipped.
    #[test]
    fn plans_applied_in_turn_fire_each_occurrence_at_most_once_and_account_for_all(
        s in schedules(),
        steps in proptest::collection::vec(prop_oneof![3 => 0u64..5_000, 1 => 0u64..40_000_000], 1..30),
    ) {
        let start = t(1_774_000_000);
        let mut now = start;
        let nows: Vec<SystemTime> = steps.iter().map(|&ms| { now += Duration::from_millis(ms); now }).collect();
        let (fired, skipped, plans) = drive(&s, start, &nows);
        prop_assert!(fired.windows(2).all(|w| w[0] < w[1]), "fired twice or out of order: {fired:?}");
        let all: Vec<SystemTime> = s.occurrences_after(start).take_while(|&x| x <= now).collect();
        for x in &fired {
            prop_assert!(all.binary_search(x).is_ok(), "{x:?} is no occurrence");
        }
        prop_assert_eq!(fired.len() as u64 + skipped, all.len() as u64);
        for (p, &n) in plans.iter().zip(&nows) {
            prop_assert!(p.fire.len() <= 20);
            prop_assert!(p.next.is_none_or(|x| x > n && x > p.settled));
            if let CatchUp::All { max } = s.catch_up_policy() {
                // Nothing is dropped while the bound is not reached.
                prop_assert!(p.skipped == 0 || p.fire.len() == max as usize);
            }
            if s.catch_up_policy() == CatchUp::Latest {
                // Whenever anything is due, exactly one fires.
                let due = p.fire.len() as u64 + p.skipped;
                prop_assert_eq!(p.fire.len() as u64, due.min(1));
            }
        }
    }
}
