//! The cron grammar, form by form and error by error (Vixie cron's
//! meaning; DESIGN.md "Schedules"), Vixie's day rule, time zone names and
//! what `validate` refuses.

mod schedule_support;

use std::time::Duration;

use redwheel::ErrorKind;
use redwheel::schedule::{CatchUp, MAX_CATCH_UP, Schedule};
use schedule_support::{at, runs};

/// The first `n` runs of a UTC expression after `from`, as UTC wall clock.
fn utc(expr: &str, from: &str, n: usize) -> Vec<String> {
    let s = Schedule::cron(expr).unwrap_or_else(|e| panic!("{expr}: {e}"));
    runs(&s, "UTC", from, n)
        .into_iter()
        .map(|r| r.trim_end_matches("+00:00").to_owned())
        .collect()
}

const JAN1: &str = "2026-01-01T00:00:00Z"; // a Thursday

#[test]
fn every_form_of_a_field_means_what_it_means_to_vixie_cron() {
    // `*` and a single value
    assert_eq!(
        utc("* * * * *", JAN1, 2),
        ["2026-01-01T00:01:00", "2026-01-01T00:02:00"]
    );
    assert_eq!(
        utc("7 * * * *", JAN1, 2),
        ["2026-01-01T00:07:00", "2026-01-01T01:07:00"]
    );
    // `a-b`
    assert_eq!(
        utc("58-59 * * * *", JAN1, 3),
        [
            "2026-01-01T00:58:00",
            "2026-01-01T00:59:00",
            "2026-01-01T01:58:00"
        ]
    );
    // `*/k`
    assert_eq!(
        utc("*/20 * * * *", JAN1, 3),
        [
            "2026-01-01T00:20:00",
            "2026-01-01T00:40:00",
            "2026-01-01T01:00:00"
        ]
    );
    // `a/k`: from a to the end of the field
    assert_eq!(
        utc("10/20 * * * *", JAN1, 4),
        [
            "2026-01-01T00:10:00",
            "2026-01-01T00:30:00",
            "2026-01-01T00:50:00",
            "2026-01-01T01:10:00",
        ]
    );
    // `a-b/k`
    assert_eq!(
        utc("5-25/10 3 * * *", JAN1, 4),
        [
            "2026-01-01T03:05:00",
            "2026-01-01T03:15:00",
            "2026-01-01T03:25:00",
            "2026-01-02T03:05:00",
        ]
    );
    // lists of any of these
    assert_eq!(
        utc("0 1,5-6,*/12 * * *", JAN1, 5),
        [
            "2026-01-01T01:00:00",
            "2026-01-01T05:00:00",
            "2026-01-01T06:00:00",
            "2026-01-01T12:00:00",
            "2026-01-02T00:00:00",
        ]
    );
    // month names, day names, any case, in ranges and lists
    assert_eq!(
        utc("0 0 1 FEB,Apr-may *", JAN1, 3),
        [
            "2026-02-01T00:00:00",
            "2026-04-01T00:00:00",
            "2026-05-01T00:00:00"
        ]
    );
    assert_eq!(
        utc("0 12 * * Mon-wed", JAN1, 3),
        [
            "2026-01-05T12:00:00",
            "2026-01-06T12:00:00",
            "2026-01-07T12:00:00"
        ]
    );
    assert_eq!(
        utc("0 12 * * FRI,Sat", JAN1, 3),
        [
            "2026-01-02T12:00:00",
            "2026-01-03T12:00:00",
            "2026-01-09T12:00:00"
        ]
    );
    // `sat/1` runs to the end of the field, 7: Saturday and Sunday.
    assert_eq!(
        utc("0 12 * * sat/1", JAN1, 3),
        [
            "2026-01-03T12:00:00",
            "2026-01-04T12:00:00",
            "2026-01-10T12:00:00"
        ]
    );
    // Sunday is 0 and 7 (and `sun`); 5-7 is Friday to Sunday
    for sunday in ["0", "7", "sun", "SUN"] {
        assert_eq!(
            utc(&format!("0 0 * * {sunday}"), JAN1, 1),
            ["2026-01-04T00:00:00"],
            "{sunday}"
        );
    }
    assert_eq!(
        utc("0 0 * * 5-7", JAN1, 3),
        [
            "2026-01-02T00:00:00",
            "2026-01-03T00:00:00",
            "2026-01-04T00:00:00"
        ]
    );
    // six fields put seconds first
    assert_eq!(
        utc("*/20 * * * * *", JAN1, 3),
        [
            "2026-01-01T00:00:20",
            "2026-01-01T00:00:40",
            "2026-01-01T00:01:00"
        ]
    );
    assert_eq!(utc("30 15 10 * * *", JAN1, 1), ["2026-01-01T10:15:30"]);
    // the shorthands
    assert_eq!(utc("@hourly", JAN1, 1), ["2026-01-01T01:00:00"]);
    assert_eq!(utc("@daily", JAN1, 1), ["2026-01-02T00:00:00"]);
    assert_eq!(utc("@midnight", JAN1, 1), ["2026-01-02T00:00:00"]);
    assert_eq!(utc("@weekly", JAN1, 1), ["2026-01-04T00:00:00"]);
    assert_eq!(utc("@monthly", JAN1, 1), ["2026-02-01T00:00:00"]);
    assert_eq!(utc("@YEARLY", JAN1, 1), ["2027-01-01T00:00:00"]);
    assert_eq!(utc("@annually", JAN1, 1), ["2027-01-01T00:00:00"]);
    // 29 February fires in leap years only
    assert_eq!(
        utc("0 0 29 2 *", JAN1, 2),
        ["2028-02-29T00:00:00", "2032-02-29T00:00:00"]
    );
    // whitespace between fields is free; leading zeros are numbers
    assert_eq!(utc(" 05\t3  * * * ", JAN1, 1), ["2026-01-01T03:05:00"]);
}

#[test]
fn the_day_rule_fires_on_either_day_field_when_both_are_restricted() {
    // The 1st of each month, and every Monday.
    assert_eq!(
        utc("0 0 1 * mon", "2026-01-30T00:00:00Z", 4),
        [
            "2026-02-01T00:00:00",
            "2026-02-02T00:00:00",
            "2026-02-09T00:00:00",
            "2026-02-16T00:00:00",
        ]
    );
    // 13th or Friday.
    assert_eq!(
        utc("0 0 13 * 5", "2026-02-01T00:00:00Z", 4),
        [
            "2026-02-06T00:00:00",
            "2026-02-13T00:00:00",
            "2026-02-20T00:00:00",
            "2026-02-27T00:00:00",
        ]
    );
}

#[test]
fn a_day_field_beginning_with_a_star_counts_as_unrestricted() {
    // `*/10` in the day of month begins with `*`: both fields must match, so
    // only Mondays that are the 1st, 11th, 21st or 31st.
    assert_eq!(
        utc("0 0 */10 * mon", JAN1, 3),
        [
            "2026-05-11T00:00:00",
            "2026-06-01T00:00:00",
            "2026-08-31T00:00:00"
        ]
    );
    // `*/2` in the day of week: the 15th, when it is a Sunday, Tuesday, Thursday or Saturday.
    assert_eq!(
        utc("0 0 15 * */2", JAN1, 3),
        [
            "2026-01-15T00:00:00",
            "2026-02-15T00:00:00",
            "2026-03-15T00:00:00"
        ]
    );
    // Only one field restricted: that one decides.
    assert_eq!(utc("0 0 * * mon", JAN1, 1), ["2026-01-05T00:00:00"]);
    assert_eq!(utc("0 0 20 * *", JAN1, 1), ["2026-01-20T00:00:00"]);
}

/// The error for `expr`, checked to be a typed invalid-input error.
fn error(expr: &str) -> String {
    let err = Schedule::cron(expr).expect_err(expr);
    assert_eq!(err.kind(), ErrorKind::InvalidOption, "{expr}");
    assert!(err.is_invalid_input() && !err.is_transient(), "{expr}");
    let text = err.to_string();
    assert!(
        text.contains(&format!("{expr:?}")),
        "{text} quotes the expression"
    );
    text
}

#[test]
fn every_malformed_expression_is_a_typed_error_naming_the_field() {
    let cases: &[(&str, &str)] = &[
        // field count
        ("", "found 0"),
        ("* * * *", "found 4"),
        ("* * * * * * *", "found 7"),
        // out of range, one per field
        ("60 * * * * *", "second field \"60\": 60 is outside 0-59"),
        ("60 * * * *", "minute field \"60\": 60 is outside 0-59"),
        ("0 24 * * *", "hour field \"24\": 24 is outside 0-23"),
        ("0 0 0 * *", "day-of-month field \"0\": 0 is outside 1-31"),
        (
            "0 0 32 * *",
            "day-of-month field \"32\": 32 is outside 1-31",
        ),
        ("0 0 * 0 *", "month field \"0\": 0 is outside 1-12"),
        ("0 0 * 13 *", "month field \"13\": 13 is outside 1-12"),
        ("0 0 * * 8", "day-of-week field \"8\": 8 is outside 0-7"),
        ("99999999999 * * * *", "minute field \"99999999999\""),
        // names
        (
            "0 0 * * monday",
            "day-of-week field \"monday\": \"monday\" is neither a number nor a name",
        ),
        ("0 0 * foo *", "month field \"foo\""),
        ("0 0 * mon *", "month field \"mon\""),
        ("0 0 * * jan", "day-of-week field \"jan\""),
        ("0 jan * * *", "hour field \"jan\": \"jan\" is not a number"),
        // ranges
        (
            "30-10 * * * *",
            "minute field \"30-10\": the range \"30-10\" runs backwards",
        ),
        ("0 0 * * fri-mon", "the range \"fri-mon\" runs backwards"),
        ("-5 * * * *", "minute field \"-5\": a value is missing"),
        ("5- * * * *", "minute field \"5-\": a value is missing"),
        ("1-2-3 * * * *", "minute field \"1-2-3\""),
        // steps
        (
            "*/0 * * * *",
            "minute field \"*/0\": the step 0 is outside 1-59",
        ),
        ("*/60 * * * *", "the step 60 is outside 1-59"),
        (
            "0 0 * * */8",
            "day-of-week field \"*/8\": the step 8 is outside 1-7",
        ),
        ("*/x * * * *", "the step \"x\" is not a number"),
        ("*/ * * * *", "the step \"\" is not a number"),
        ("1/2/3 * * * *", "minute field \"1/2/3\""),
        // lists
        (
            "1,,2 * * * *",
            "minute field \"1,,2\": empty element in the list",
        ),
        ("1, * * * *", "empty element in the list"),
        (",1 * * * *", "empty element in the list"),
        // other crons' extensions, and stray characters
        ("0 0 ? * *", "day-of-month field \"?\""),
        ("0 0 L * *", "day-of-month field \"l\""),
        ("0 0 15W * *", "day-of-month field \"15w\""),
        ("0 0 * * 5#2", "day-of-week field \"5#2\""),
        ("0 0 * * 5L", "day-of-week field \"5l\""),
        ("0 0 * * 1;2", "day-of-week field \"1;2\""),
        ("0 0 * * *;", "day-of-week field \"*;\""),
        ("H * * * *", "minute field \"h\""),
        // shorthands
        ("@reboot", "unknown shorthand \"@reboot\""),
        ("@every 5m", "unknown shorthand"),
        // never fires: the date does not exist
        ("0 0 30 2 *", "would never fire"),
        ("0 0 31 4,6,9,11 *", "would never fire"),
        ("0 0 30-31 feb *", "would never fire"),
        // (with the day of week beginning with `*`, both must match: never either)
        ("0 0 30 2 */1", "would never fire"),
    ];
    for (expr, expected) in cases {
        let text = error(expr);
        assert!(
            text.contains(expected),
            "{expr:?}: {text:?} should contain {expected:?}"
        );
    }
}

#[test]
fn dates_that_exist_in_some_month_or_year_are_accepted() {
    for expr in [
        "0 0 29 2 *",
        "0 0 30 2 mon",
        "0 0 31 * *",
        "0 0 31 1-2 *",
        "0 0 */15 2 *",
    ] {
        Schedule::cron(expr).unwrap_or_else(|e| panic!("{expr}: {e}"));
    }
}

#[test]
fn time_zone_names_are_iana_names_in_any_case() {
    let s = Schedule::cron("0 3 * * *").unwrap();
    let berlin = s.clone().time_zone("europe/BERLIN").unwrap();
    assert_eq!(berlin, s.clone().time_zone("Europe/Berlin").unwrap());
    assert_eq!(berlin.to_string(), "cron \"0 3 * * *\" Europe/Berlin");
    assert_eq!(s.clone().time_zone("utc").unwrap(), s, "UTC is the default");
    for bad in [
        "Mars/Olympus_Mons",
        "",
        "Europe/Berlin ",
        "Etc/Unknown",
        "+01:00",
        "CET;x",
    ] {
        let err = s.clone().time_zone(bad).expect_err(bad);
        assert_eq!(err.kind(), ErrorKind::InvalidOption, "{bad}");
        assert!(
            err.to_string()
                .contains(&format!("unknown time zone {bad:?}")),
            "{err}"
        );
    }
    let err = Schedule::every(Duration::from_secs(30))
        .time_zone("Europe/Berlin")
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidOption);
    assert!(err.to_string().contains("takes no time zone"), "{err}");
}

#[test]
fn validate_refuses_what_the_builders_cannot() {
    let invalid = |s: Schedule, why: &str| {
        let err = s.validate().expect_err(why);
        assert_eq!(err.kind(), ErrorKind::InvalidOption);
        assert!(err.to_string().contains(why), "{err} should say {why:?}");
        assert_eq!(
            s.next_after(at(JAN1)),
            None,
            "an invalid schedule never fires: {s}"
        );
    };
    invalid(Schedule::every(Duration::ZERO), "at least 1 ms");
    invalid(Schedule::every(Duration::from_micros(499)), "at least 1 ms");
    let every = Schedule::every(Duration::from_secs(1));
    let bad_all = every.clone().catch_up(CatchUp::All { max: 0 });
    assert!(
        bad_all
            .validate()
            .unwrap_err()
            .to_string()
            .contains("max must be 1 to 10000")
    );
    let too_many = every.clone().catch_up(CatchUp::All {
        max: MAX_CATCH_UP + 1,
    });
    assert!(too_many.validate().is_err());
    let ends_first = every
        .clone()
        .starting_at(at("2026-02-01T00:00:00Z"))
        .until(at(JAN1));
    invalid(
        ends_first,
        "ends (2026-01-01T00:00:00Z) before it starts (2026-02-01T00:00:00Z)",
    );

    Schedule::every(Duration::from_micros(500))
        .validate()
        .unwrap(); // rounds to 1 ms
    every
        .clone()
        .catch_up(CatchUp::All { max: MAX_CATCH_UP })
        .validate()
        .unwrap();
    every
        .clone()
        .starting_at(at(JAN1))
        .until(at(JAN1))
        .validate()
        .unwrap();
    Schedule::cron("0 3 * * *").unwrap().validate().unwrap();
}

#[test]
fn every_periods_are_whole_milliseconds_rounded_to_the_nearest() {
    let s = Schedule::every(Duration::from_micros(1_499));
    assert_eq!(s.to_string(), "every 1ms");
    let s = Schedule::every(Duration::from_micros(1_500));
    assert_eq!(s.to_string(), "every 2ms");
    assert_eq!(
        Schedule::every(Duration::from_secs(5400)).to_string(),
        "every 1h30m"
    );
    assert_eq!(
        Schedule::every(Duration::from_millis(86_400_250)).to_string(),
        "every 1d250ms"
    );
}

#[test]
fn schedules_are_plain_values_shared_across_threads() {
    fn shareable<T: Send + Sync + Clone + 'static>() {}
    shareable::<Schedule>();
    let s = Schedule::cron("0 3 * * *")
        .unwrap()
        .time_zone("Europe/Berlin")
        .unwrap();
    let debug = format!("{s:?}");
    assert!(
        debug.contains("Zone(\"Europe/Berlin\")") && debug.len() < 600,
        "{debug}"
    );
    let copy = s.clone();
    let t = at(JAN1);
    let from_thread = std::thread::spawn(move || copy.next_after(t))
        .join()
        .unwrap();
    assert_eq!(from_thread, s.next_after(t));
}
