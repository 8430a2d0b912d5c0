//! Property tests of `next_after` and its kin against a brute-force model.
//!
//! The model knows nothing of the library's search: it generates a cron
//! expression together with the set of values each field means (computed
//! from the generated items, not by parsing), then walks a window of time
//! instant by instant (every minute for 5 fields, every second for 6),
//! asks jiff for the wall clock at each, and applies DESIGN.md's rules
//! literally: a wildcard job fires whenever the wall clock matches; a
//! fixed-time job fires when it matches at the first instant showing that
//! wall-clock time, or at a jump forward that skipped a matching time.
//! Windows are placed around the DST transitions of zones chosen for
//! their oddities, over years 1995-2060.

mod schedule_support;

use std::collections::BTreeSet;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jiff::Timestamp;
use jiff::civil::DateTime;
use jiff::tz::TimeZone;
use proptest::prelude::*;
use redwheel::schedule::{CatchUp, MAX_CATCH_UP, Schedule};
use schedule_support::zone;

const ZONES: &[&str] = &[
    "Europe/Berlin",
    "America/New_York",
    "Australia/Lord_Howe", // 30-minute shifts
    "America/Santiago",    // changes at midnight
    "Asia/Beirut",         // changes at midnight
    "Pacific/Chatham",     // +12:45 / +13:45
    "Asia/Kolkata",        // +05:30, no DST
    "UTC",
];

/// One field: its text and the values it means.
#[derive(Debug, Clone)]
struct Field {
    text: String,
    values: BTreeSet<u32>,
}

const MONTHS: [&str; 12] = [
    "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
];
const DAYS: [&str; 7] = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"];

/// One list element over `min..=max`, with its values.
fn item(min: u32, max: u32, names: &'static [&'static str], base: u32) -> BoxedStrategy<Field> {
    let span = move |text: String, lo: u32, hi: u32, step: u32| Field {
        text,
        values: (lo..=hi).step_by(step as usize).collect(),
    };
    let name = move |v: u32, upper: bool| {
        let n = names[(v - base) as usize];
        if upper {
            n.to_uppercase()
        } else {
            n.to_owned()
        }
    };
    let mut forms = vec![
        Just(())
            .prop_map(move |_| span("*".into(), min, max, 1))
            .boxed(),
        (1..=max)
            .prop_map(move |k| span(format!("*/{k}"), min, max, k))
            .boxed(),
        (min..=max)
            .prop_map(move |a| span(a.to_string(), a, a, 1))
            .boxed(),
        (min..=max, min..=max)
            .prop_map(move |(a, b)| {
                let (a, b) = (a.min(b), a.max(b));
                span(format!("{a}-{b}"), a, b, 1)
            })
            .boxed(),
        (min..=max, 1..=max)
            .prop_map(move |(a, k)| span(format!("{a}/{k}"), a, max, k))
            .boxed(),
        (min..=max, min..=max, 1..=max)
            .prop_map(move |(a, b, k)| {
                let (a, b) = (a.min(b), a.max(b));
                span(format!("{a}-{b}/{k}"), a, b, k)
            })
            .boxed(),
    ];
    if !names.is_empty() {
        let last = base + names.len() as u32 - 1;
        forms.push(
            (base..=last, any::<bool>())
                .prop_map(move |(v, up)| span(name(v, up), v, v, 1))
                .boxed(),
        );
        forms.push(
            (base..=last, base..=last, any::<bool>())
                .prop_map(move |(a, b, up)| {
                    let (a, b) = (a.min(b), a.max(b));
                    span(format!("{}-{}", name(a, up), name(b, !up)), a, b, 1)
                })
                .boxed(),
        );
    }
    proptest::strategy::Union::new(forms).boxed()
}

/// A field: `*` (weight `star_weight`), one of the `usual` values (the
/// times at which zones change their clocks, weight 5), or a list of 1-3
/// items (weight 10).
fn field(
    min: u32,
    max: u32,
    names: &'static [&'static str],
    base: u32,
    star_weight: u32,
    usual: &'static [u32],
) -> BoxedStrategy<Field> {
    let list =
        proptest::collection::vec(item(min, max, names, base), 1..=3).prop_map(|items| Field {
            text: items
                .iter()
                .map(|i| i.text.as_str())
                .collect::<Vec<_>>()
                .join(","),
            values: items
                .iter()
                .flat_map(|i| i.values.iter().copied())
                .collect(),
        });
    let star = Just(Field {
        text: "*".into(),
        values: (min..=max).collect(),
    });
    let usual_weight = if usual.is_empty() { 0 } else { 5 };
    let one =
        proptest::sample::select(if usual.is_empty() { &[0][..] } else { usual }).prop_map(|v| {
            Field {
                text: v.to_string(),
                values: [v].into(),
            }
        });
    prop_oneof![star_weight => star, usual_weight => one, 10 => list].boxed()
}

const MINUTES_USUAL: &[u32] = &[0, 15, 30, 45, 59];
const HOURS_USUAL: &[u32] = &[0, 1, 2, 3, 23];

/// A cron expression and the model of what it means.
#[derive(Debug, Clone)]
struct Model {
    text: String,
    seconds: BTreeSet<u32>,
    minutes: BTreeSet<u32>,
    hours: BTreeSet<u32>,
    days: BTreeSet<u32>,
    months: BTreeSet<u32>,
    weekdays: BTreeSet<u32>,
    dom_star: bool,
    dow_star: bool,
    fixed: bool,
}

impl Model {
    fn new(sec: Option<Field>, f: [Field; 5]) -> Model {
        let text = match &sec {
            Some(s) => format!(
                "{} {}",
                s.text,
                f.iter()
                    .map(|x| x.text.as_str())
                    .collect::<Vec<_>>()
                    .join(" ")
            ),
            None => f
                .iter()
                .map(|x| x.text.as_str())
                .collect::<Vec<_>>()
                .join(" "),
        };
        Model {
            text,
            seconds: sec.map_or_else(|| [0].into(), |s| s.values),
            fixed: !f[0].text.starts_with('*') && !f[1].text.starts_with('*'),
            dom_star: f[2].text.starts_with('*'),
            dow_star: f[4].text.starts_with('*'),
            minutes: f[0].values.clone(),
            hours: f[1].values.clone(),
            days: f[2].values.clone(),
            months: f[3].values.clone(),
            weekdays: f[4].values.iter().map(|&d| d % 7).collect(),
        }
    }

    /// Whether the wall-clock time `dt` matches (Vixie's day rule).
    fn matches(&self, dt: DateTime) -> bool {
        let dom = self.days.contains(&(dt.day() as u32));
        let dow = self
            .weekdays
            .contains(&(dt.weekday().to_sunday_zero_offset() as u32));
        let day = if self.dom_star || self.dow_star {
            dom && dow
        } else {
            dom || dow
        };
        day && self.months.contains(&(dt.month() as u32))
            && self.hours.contains(&(dt.hour() as u32))
            && self.minutes.contains(&(dt.minute() as u32))
            && self.seconds.contains(&(dt.second() as u32))
    }

    /// Whether no date can ever match (the library refuses these).
    fn never_fires(&self) -> bool {
        let max_day = |m: u32| [31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31][m as usize - 1];
        !self.dom_star
            && self.dow_star
            && !self
                .months
                .iter()
                .any(|&m| self.days.iter().any(|&d| d <= max_day(m)))
    }

    /// Every occurrence in `(from, to]` (seconds), by scanning.
    fn scan(&self, tz: &TimeZone, from: i64, to: i64) -> Vec<i64> {
        let step = if self.seconds == BTreeSet::from([0]) {
            60
        } else {
            1
        };
        let first = (from.div_euclid(step) + 1) * step;
        let wall = |i: i64| {
            let ts = Timestamp::from_second(i).unwrap();
            tz.to_offset(ts).to_datetime(ts)
        };
        let mut out = Vec::new();
        for i in (first..=to).step_by(step as usize) {
            let dt = wall(i);
            let hit = if !self.fixed {
                self.matches(dt)
            } else {
                // Matching, at the first instant that shows this wall clock…
                let first_pass =
                    || tz.to_ambiguous_timestamp(dt).earlier().unwrap().as_second() == i;
                // …or a jump forward just happened over a matching time.
                let skipped_match = || {
                    let before = wall(i - 1);
                    let jump = dt.duration_since(before).as_secs() - 1;
                    (1..=jump).any(|k| {
                        self.matches(
                            before
                                .checked_add(jiff::SignedDuration::from_secs(k))
                                .unwrap(),
                        )
                    })
                };
                (self.matches(dt) && first_pass()) || skipped_match()
            };
            if hit {
                out.push(i);
            }
        }
        out
    }
}

fn five_fields() -> impl Strategy<Value = Model> {
    (
        field(0, 59, &[], 0, 2, MINUTES_USUAL),
        field(0, 23, &[], 0, 5, HOURS_USUAL),
        field(1, 31, &[], 0, 30, &[]),
        field(1, 12, &MONTHS, 1, 30, &[]),
        field(0, 7, &DAYS, 0, 15, &[]),
    )
        .prop_map(|(mi, h, dom, mo, dow)| Model::new(None, [mi, h, dom, mo, dow]))
}

fn six_fields() -> impl Strategy<Value = Model> {
    (
        field(0, 59, &[], 0, 1, &[0, 30, 59]),
        field(0, 59, &[], 0, 5, MINUTES_USUAL),
        field(0, 23, &[], 0, 10, HOURS_USUAL),
        Just(Field {
            text: "*".into(),
            values: (1..=31).collect(),
        }),
        Just(Field {
            text: "*".into(),
            values: (1..=12).collect(),
        }),
        field(0, 7, &DAYS, 0, 30, &[]),
    )
        .prop_map(|(s, mi, h, dom, mo, dow)| Model::new(Some(s), [mi, h, dom, mo, dow]))
}

/// A zone and an instant (seconds) from `before` seconds before to `after`
/// seconds after one of its transitions, 1995-2060 (in a zone without any,
/// a day of the year).
fn near_transition(before: i64, after: i64) -> impl Strategy<Value = (&'static str, i64)> {
    (
        proptest::sample::select(ZONES),
        1995i16..=2060,
        0usize..2,
        -before..=after,
    )
        .prop_map(|(name, year, which, shift)| {
            let new_year = TimeZone::UTC
                .to_timestamp(jiff::civil::date(year, 1, 1).at(0, 0, 0, 0))
                .unwrap();
            let t = zone(name)
                .following(new_year)
                .nth(which)
                .map_or(new_year.as_second() + 86_400 * 100, |tr| {
                    tr.timestamp().as_second()
                });
            (name, t + shift)
        })
}

fn secs(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH).unwrap().as_secs() as i64
}

fn instant(s: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(s as u64)
}

/// The library's occurrences in `(from, to]`, through `next_after`.
fn walk(s: &Schedule, from: i64, to: i64) -> Vec<i64> {
    s.occurrences_after(instant(from))
        .map(secs)
        .take_while(|&x| x <= to)
        .collect()
}

/// Checks every view of the library against the scan of one window.
fn check_window(model: &Model, zone_name: &str, from: i64, to: i64) -> Result<(), TestCaseError> {
    let built = Schedule::cron(&model.text).and_then(|s| s.time_zone(zone_name));
    if model.never_fires() {
        prop_assert!(
            built.is_err(),
            "{} never fires, yet was accepted",
            model.text
        );
        return Ok(());
    }
    let s = built.map_err(|e| TestCaseError::fail(format!("{}: {e}", model.text)))?;
    let tz = zone(zone_name);
    let expected = model.scan(&tz, from, to);
    // next_after: strictly after, in order, skipping none.
    prop_assert_eq!(
        &walk(&s, from, to),
        &expected,
        "{} in {} after {}",
        model.text,
        zone_name,
        from
    );
    if expected.is_empty() {
        prop_assert!(s.next_after(instant(from)).is_none_or(|x| secs(x) > to));
    }
    // last_at_or_before: the last one of the window.
    let last = s
        .last_at_or_before(instant(to))
        .map(secs)
        .filter(|&x| x > from);
    prop_assert_eq!(
        last,
        expected.last().copied(),
        "last of {} in {}",
        model.text,
        zone_name
    );
    // plan: the count of due occurrences, and the latest ones to fire.
    let all = s.clone().catch_up(CatchUp::All { max: MAX_CATCH_UP });
    let plan = all.plan(instant(from), instant(to));
    let fired: Vec<i64> = plan.fire.iter().map(|&t| secs(t)).collect();
    prop_assert_eq!(
        plan.skipped + fired.len() as u64,
        expected.len() as u64,
        "count"
    );
    prop_assert_eq!(&fired[..], &expected[expected.len() - fired.len()..]);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 192, ..ProptestConfig::default() })]

    #[test]
    fn five_field_runs_match_a_minute_by_minute_scan_around_transitions(
        model in five_fields(),
        (zone_name, t) in near_transition(30 * 3600, 6 * 3600),
        len_hours in 1i64..=48,
    ) {
        check_window(&model, zone_name, t, t + len_hours * 3600)?;
    }

    #[test]
    fn six_field_runs_match_a_second_by_second_scan_around_transitions(
        model in six_fields(),
        (zone_name, t) in near_transition(2 * 3600, 3600),
        len_minutes in 1i64..=150,
    ) {
        check_window(&model, zone_name, t, t + len_minutes * 60)?;
    }

    #[test]
    fn jobs_at_the_hour_of_a_clock_change_follow_the_dst_rules_in_every_zone_and_year(
        minute in field(0, 59, &[], 0, 2, MINUTES_USUAL),
        hour_form in 0u8..3,
        dom in field(1, 31, &[], 0, 40, &[]),
        month in field(1, 12, &MONTHS, 1, 40, &[]),
        dow in field(0, 7, &DAYS, 0, 40, &[]),
        (zone_name, t) in near_transition(0, 0),
    ) {
        // The hour on the wall clock where the skipped or repeated times begin.
        let tz = zone(zone_name);
        let wall = |i: i64| {
            let ts = Timestamp::from_second(i).unwrap();
            tz.to_offset(ts).to_datetime(ts)
        };
        let h = (if wall(t) > wall(t - 1) { wall(t - 1) } else { wall(t) }).hour() as u32;
        let hour = match hour_form {
            0 => Field { text: h.to_string(), values: [h].into() },
            1 => Field { text: format!("{h},{}", (h + 1) % 24), values: [h, (h + 1) % 24].into() },
            _ => Field { text: "*".into(), values: (0..24).collect() },
        };
        let model = Model::new(None, [minute, hour, dom, month, dow]);
        check_window(&model, zone_name, t - 3 * 3600, t + 3 * 3600)?;
    }

    #[test]
    fn next_after_is_strictly_after_and_monotone(
        model in five_fields(),
        zone_name in proptest::sample::select(ZONES),
        t1 in 0i64..4_102_444_800, // 1970-2100
        gap in 0i64..40 * 86_400,
        nanos in 0u32..1_000_000_000,
    ) {
        let Ok(s) = Schedule::cron(&model.text).and_then(|s| s.time_zone(zone_name)) else {
            return Err(TestCaseError::reject("never fires"));
        };
        let a = instant(t1) + Duration::from_nanos(u64::from(nanos));
        let b = instant(t1 + gap);
        let (na, nb) = (s.next_after(a), s.next_after(b));
        if let Some(x) = na { prop_assert!(x > a); }
        if let Some(y) = nb { prop_assert!(y > b); }
        if let (Some(x), Some(y)) = (na, nb) { prop_assert!(x <= y, "monotone"); }
        // The occurrence found is one: the last at or before it is itself.
        if let Some(x) = na { prop_assert_eq!(s.last_at_or_before(x), Some(x)); }
    }

    #[test]
    fn every_is_anchored_whatever_instant_it_is_asked_from(
        period_ms in 1u64..=10 * 86_400_000,
        anchor_ms in proptest::option::of(-1_000_000_000_000i64..4_000_000_000_000),
        t1_ms in -1_000_000_000_000i64..4_000_000_000_000,
        later in 0u64..1_000_000_000,
    ) {
        let mut s = Schedule::every(Duration::from_millis(period_ms));
        if let Some(a) = anchor_ms {
            s = s.starting_at(ms(a));
        }
        let anchor = anchor_ms.unwrap_or(0);
        let t1 = ms(t1_ms);
        let t2 = t1 + Duration::from_millis(later);
        let from_t1: Vec<SystemTime> = s.occurrences_after(t1).take(200).collect();
        let n2 = s.next_after(t2).unwrap();
        // The same occurrences from either instant: what t2 sees, t1 sees too.
        if from_t1.last().is_some_and(|&l| l > t2) {
            prop_assert_eq!(Some(&n2), from_t1.iter().find(|&&x| x > t2));
        }
        for x in &from_t1 {
            let x_ms = x.duration_since(UNIX_EPOCH).map_or_else(|e| -(e.duration().as_millis() as i64), |d| d.as_millis() as i64);
            prop_assert_eq!((x_ms - anchor).rem_euclid(period_ms as i64), 0, "on the grid");
            if anchor_ms.is_some() { prop_assert!(x_ms >= anchor, "none before the start"); }
        }
        for pair in from_t1.windows(2) {
            prop_assert_eq!(pair[1].duration_since(pair[0]).unwrap(), Duration::from_millis(period_ms));
        }
    }
}

fn ms(v: i64) -> SystemTime {
    if v >= 0 {
        UNIX_EPOCH + Duration::from_millis(v as u64)
    } else {
        UNIX_EPOCH - Duration::from_millis(v.unsigned_abs())
    }
}
