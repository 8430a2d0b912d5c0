//! The definition: the canonical, versioned text a schedule is stored as
//! and compared by, byte for byte; `from_definition` accepts exactly those
//! texts; `Display` is the human form.

mod schedule_support;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use proptest::prelude::*;
use redwheel::ErrorKind;
use redwheel::schedule::{CatchUp, Schedule};
use schedule_support::{at, cron};

#[test]
fn definitions_are_written_out_in_full() {
    let cases = [
        (
            Schedule::cron("0 3 * * *").unwrap(),
            "v1;cron=0 3 * * *;tz=UTC;start=-;until=-;catch_up=latest",
        ),
        (
            cron("*/15  9-17 * * MON-fri", "europe/berlin")
                .starting_at(at("2026-01-01T00:00:00Z"))
                .until(at("2026-12-31T23:00:00Z"))
                .catch_up(CatchUp::Skip),
            "v1;cron=*/15 9-17 * * mon-fri;tz=Europe/Berlin;start=1767225600000;until=1798758000000;catch_up=skip",
        ),
        (
            Schedule::every(Duration::from_secs(30)),
            "v1;every=30000ms;start=-;until=-;catch_up=latest",
        ),
        (
            Schedule::every(Duration::from_millis(1500))
                .starting_at(UNIX_EPOCH - Duration::from_millis(5))
                .catch_up(CatchUp::All { max: 5 }),
            "v1;every=1500ms;start=-5;until=-;catch_up=all:5",
        ),
        (
            Schedule::cron("@Daily").unwrap(),
            "v1;cron=@daily;tz=UTC;start=-;until=-;catch_up=latest",
        ),
        (
            cron("0 30 2 * * *", "America/New_York"),
            "v1;cron=0 30 2 * * *;tz=America/New_York;start=-;until=-;catch_up=latest",
        ),
    ];
    for (s, def) in cases {
        assert_eq!(s.definition(), def);
        let back = Schedule::from_definition(def).unwrap_or_else(|e| panic!("{def}: {e}"));
        assert_eq!(back, s, "{def}");
        assert_eq!(back.definition(), def);
    }
}

#[test]
fn bounds_are_kept_to_the_millisecond_start_up_and_end_down() {
    let t = UNIX_EPOCH + Duration::from_nanos(1_000_000_001);
    let s = Schedule::every(Duration::from_secs(1))
        .starting_at(t)
        .until(t);
    assert_eq!(
        s.definition(),
        "v1;every=1000ms;start=1001;until=1000;catch_up=latest"
    );
}

#[test]
fn equal_schedules_have_equal_definitions_however_they_were_spelled() {
    let a = cron("0 3 * * MON", "Europe/Berlin");
    let b = cron(" 0\t3  *  * mon ", "EUROPE/BERLIN");
    assert_eq!(a, b);
    assert_eq!(a.definition(), b.definition());
    // Built again, as another process would: the same bytes.
    assert_eq!(
        cron("0 3 * * mon", "Europe/Berlin").definition(),
        a.definition()
    );
    // Different meaning, different bytes.
    assert_ne!(
        a.definition(),
        a.clone().catch_up(CatchUp::Skip).definition()
    );
    assert_ne!(
        a.definition(),
        cron("0 3 * * mon", "Europe/Paris").definition()
    );
}

#[test]
fn display_is_the_human_form() {
    assert_eq!(
        cron("0 3 * * *", "Europe/Berlin").to_string(),
        r#"cron "0 3 * * *" Europe/Berlin"#
    );
    assert_eq!(
        Schedule::cron("0 3 * * *").unwrap().to_string(),
        r#"cron "0 3 * * *" UTC"#
    );
    assert_eq!(
        Schedule::every(Duration::from_secs(30)).to_string(),
        "every 30s"
    );
    assert_eq!(
        Schedule::every(Duration::from_secs(90))
            .starting_at(at("2026-01-01T00:00:00Z"))
            .until(at("2026-02-01T00:00:00.5Z"))
            .catch_up(CatchUp::All { max: 3 })
            .to_string(),
        "every 1m30s from 2026-01-01T00:00:00Z until 2026-02-01T00:00:00.5Z catch-up all (max 3)"
    );
    assert_eq!(
        Schedule::cron("@hourly")
            .unwrap()
            .catch_up(CatchUp::Skip)
            .to_string(),
        r#"cron "@hourly" UTC catch-up skip"#
    );
}

#[test]
fn anything_but_a_canonical_definition_is_refused() {
    let good = "v1;cron=0 3 * * *;tz=Europe/Berlin;start=-;until=-;catch_up=latest";
    Schedule::from_definition(good).unwrap();
    let cases: &[(&str, &str)] = &[
        ("", "does not begin with a version tag (v1)"),
        ("cron=0 3 * * *", "does not begin with a version tag"),
        (
            "v2;cron=0 3 * * *;tz=UTC;start=-;until=-;catch_up=latest",
            "version v2 is not one this build",
        ),
        (
            "V1;cron=0 3 * * *;tz=UTC;start=-;until=-;catch_up=latest",
            "does not begin with a version tag",
        ),
        ("v1", "expected cron=<expression> or every=<milliseconds>ms"),
        ("v1;cron=0 3 * * *", "expected the field \"tz\" next"),
        (
            "v1;cron=0 3 * * *;tz=UTC;until=-;start=-;catch_up=latest",
            "expected the field \"start\" next",
        ),
        (
            "v1;cron=0 3 * * *;tz=UTC;start=-;until=-",
            "expected the field \"catch_up\" next",
        ),
        (
            "v1;cron=0 3 * * *;tz=UTC;start=-;until=-;catch_up=latest;",
            "unexpected fields after catch_up",
        ),
        (
            "v1;cron=0 3 * * *;tz=UTC;start=-;until=-;catch_up=latest;x=1",
            "unexpected fields after catch_up",
        ),
        // Not canonical: each of these means a valid schedule, spelled otherwise.
        (
            "v1;cron=0  3 * * *;tz=UTC;start=-;until=-;catch_up=latest",
            "not in canonical form",
        ),
        (
            "v1;cron=0 3 * * MON;tz=UTC;start=-;until=-;catch_up=latest",
            "not in canonical form",
        ),
        (
            "v1;cron=0 3 * * *;tz=europe/berlin;start=-;until=-;catch_up=latest",
            "not in canonical form",
        ),
        (
            "v1;cron=0 3 * * *;tz=UTC;start=+5;until=-;catch_up=latest",
            "not in canonical form",
        ),
        (
            "v1;cron=0 3 * * *;tz=UTC;start=05;until=-;catch_up=latest",
            "not in canonical form",
        ),
        (
            "v1;every=030000ms;start=-;until=-;catch_up=latest",
            "not in canonical form",
        ),
        // Not valid.
        (
            "v1;cron=0 25 * * *;tz=UTC;start=-;until=-;catch_up=latest",
            "hour field \"25\"",
        ),
        (
            "v1;cron=0 3 * * *;tz=Mars/Olympus;start=-;until=-;catch_up=latest",
            "unknown time zone \"Mars/Olympus\"",
        ),
        (
            "v1;cron=0 3 * * *;start=-;until=-;catch_up=latest",
            "expected the field \"tz\" next",
        ),
        (
            "v1;every=0ms;start=-;until=-;catch_up=latest",
            "at least 1 ms",
        ),
        (
            "v1;every=30s;start=-;until=-;catch_up=latest",
            "expected cron=<expression> or every",
        ),
        (
            "v1;every=30000ms;tz=UTC;start=-;until=-;catch_up=latest",
            "expected the field \"start\" next",
        ),
        (
            "v1;every=30000ms;start=now;until=-;catch_up=latest",
            "start is neither - nor a number",
        ),
        (
            "v1;every=30000ms;start=-;until=;catch_up=latest",
            "until is neither - nor a number",
        ),
        (
            "v1;every=30000ms;start=-;until=-;catch_up=all:0",
            "max must be 1 to 10000",
        ),
        (
            "v1;every=30000ms;start=-;until=-;catch_up=all:10001",
            "max must be 1 to 10000",
        ),
        (
            "v1;every=30000ms;start=-;until=-;catch_up=ALL:5",
            "catch_up is none of skip, latest, all:<max>",
        ),
        (
            "v1;every=30000ms;start=-;until=-;catch_up=all",
            "catch_up is none of",
        ),
        (
            "v1;every=30000ms;start=10;until=5;catch_up=latest",
            "before it starts",
        ),
    ];
    for (def, expected) in cases {
        let err = Schedule::from_definition(def).expect_err(def);
        assert_eq!(err.kind(), ErrorKind::InvalidOption, "{def}");
        let text = err.to_string();
        assert!(
            text.contains(&format!("invalid schedule definition {def:?}")),
            "{text}"
        );
        assert!(
            text.contains(expected),
            "{def:?}: {text:?} should say {expected:?}"
        );
    }
}

fn ms(v: i64) -> SystemTime {
    if v >= 0 {
        UNIX_EPOCH + Duration::from_millis(v as u64)
    } else {
        UNIX_EPOCH - Duration::from_millis(v.unsigned_abs())
    }
}

/// Any valid schedule: varied spellings of cron expressions in varied
/// zones, or periods; with or without bounds; any policy.
fn schedules() -> impl Strategy<Value = Schedule> {
    let expr = proptest::sample::select(vec![
        "0 3 * * *",
        "*/15 * * * *",
        "0,30 9-17/2 1,15 JAN-jun MON-Fri",
        "5/10 */3 * * 0,7",
        "*/20 * * * * *",
        "0 0 29 2 *",
        "@weekly",
        "30 2 */2 * sun",
    ]);
    let zone = proptest::sample::select(vec![
        "UTC",
        "Europe/Berlin",
        "america/new_york",
        "Australia/Lord_Howe",
        "Asia/Kolkata",
    ]);
    let cron_schedule = (expr, zone, any::<bool>()).prop_map(|(e, z, spaced)| {
        let e = if spaced {
            e.replace(' ', " \t ")
        } else {
            e.to_uppercase()
        };
        cron(&e, z)
    });
    let every =
        (1u64..=u64::from(u32::MAX)).prop_map(|p| Schedule::every(Duration::from_millis(p)));
    let bound = proptest::option::of(-10_000_000_000_000i64..10_000_000_000_000);
    let policy = prop_oneof![
        Just(CatchUp::Skip),
        Just(CatchUp::Latest),
        (1u32..=10_000).prop_map(|max| CatchUp::All { max }),
    ];
    (
        prop_oneof![cron_schedule, every],
        bound.clone(),
        bound,
        policy,
    )
        .prop_map(|(s, start, until, p)| {
            let (start, until) = match (start, until) {
                (Some(a), Some(b)) => (Some(a.min(b)), Some(a.max(b))),
                other => other,
            };
            let s = match start {
                Some(v) => s.starting_at(ms(v)),
                None => s,
            };
            let s = match until {
                Some(v) => s.until(ms(v)),
                None => s,
            };
            s.catch_up(p)
        })
}

proptest! {
    #[test]
    fn a_definition_decodes_to_the_same_schedule_and_the_same_bytes(
        s in schedules(),
        probe in -1_000_000_000_000i64..5_000_000_000_000,
    ) {
        let def = s.definition();
        let back = Schedule::from_definition(&def).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(&back, &s);
        prop_assert_eq!(back.definition(), def);
        // And so it means the same: same next occurrence, same plan.
        let t = ms(probe);
        prop_assert_eq!(back.next_after(t), s.next_after(t));
        prop_assert_eq!(back.plan(t, t + Duration::from_secs(86_400)), s.plan(t, t + Duration::from_secs(86_400)));
    }
}
