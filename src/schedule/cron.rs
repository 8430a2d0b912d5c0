//! The cron grammar (Vixie cron's) and matching in civil time.
//!
//! Civil time here is wall-clock time written as a count of seconds since
//! `1970-01-01T00:00:00` *on the wall clock* (an instant plus the zone's
//! offset at it), so every day is 86,400 seconds long and a day number
//! gives the date by the proleptic Gregorian calendar. This file knows
//! nothing of zones: [`super::zone`] maps civil seconds to instants.
//!
//! A parsed expression is a set per field, kept as a bit mask (bit `v` set
//! when value `v` matches), plus the three flags Vixie cron derives from
//! the text: whether the day-of-month and day-of-week fields begin with `*`
//! (the day rule) and whether the minute or hour field does (Debian's DST
//! rule: a job is *fixed-time* when neither does).

use self::fields::{
    DAY_OF_MONTH, DAY_OF_WEEK, Field, HOUR, MACROS, MINUTE, MONTH, SECOND, parse_field,
};
use super::invalid;
use crate::Error;

mod fields;

/// Seconds in a civil day.
pub(super) const DAY: i64 = 86_400;

/// A parsed cron expression.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct CronSpec {
    /// The expression as written, lower-cased, fields one space apart.
    text: String,
    seconds: u64,
    minutes: u64,
    hours: u64,
    /// Bits 1..=31.
    days: u64,
    /// Bits 1..=12.
    months: u64,
    /// Bits 0..=6, Sunday = 0.
    weekdays: u64,
    /// The day-of-month field begins with `*`.
    dom_star: bool,
    /// The day-of-week field begins with `*`.
    dow_star: bool,
    /// Neither the minute nor the hour field begins with `*`.
    fixed: bool,
    /// Matching times of day in one matching day.
    per_day: u64,
}

impl CronSpec {
    /// Parses `expr`: 5 fields, or 6 with seconds first, or an `@` shorthand.
    pub(super) fn parse(expr: &str) -> Result<CronSpec, Error> {
        let fail = |reason: String| invalid(format!("invalid cron expression {expr:?}: {reason}"));
        let lowered = expr.trim().to_ascii_lowercase();
        let (text, expanded) = if lowered.starts_with('@') {
            match MACROS.iter().find(|(name, _)| *name == lowered) {
                Some((_, expansion)) => (lowered.clone(), (*expansion).to_owned()),
                None => {
                    return Err(fail(format!(
                        "unknown shorthand {lowered:?} (known: @yearly, @annually, @monthly, \
                         @weekly, @daily, @midnight, @hourly)"
                    )));
                }
            }
        } else {
            let text = lowered
                .split_ascii_whitespace()
                .collect::<Vec<_>>()
                .join(" ");
            (text.clone(), text)
        };
        let fields: Vec<&str> = expanded.split(' ').filter(|f| !f.is_empty()).collect();
        let (sec, rest) = match fields.len() {
            5 => ("0", &fields[..]),
            6 => (fields[0], &fields[1..]),
            n => {
                return Err(fail(format!(
                    "expected 5 fields (minute hour day-of-month month day-of-week) \
                     or 6 (second first), found {n}"
                )));
            }
        };
        let field = |f: &Field, text: &str| {
            parse_field(f, text)
                .map_err(|reason| fail(format!("{} field {text:?}: {reason}", f.name)))
        };
        let seconds = field(&SECOND, sec)?;
        let minutes = field(&MINUTE, rest[0])?;
        let hours = field(&HOUR, rest[1])?;
        let days = field(&DAY_OF_MONTH, rest[2])?;
        let months = field(&MONTH, rest[3])?;
        let mut weekdays = field(&DAY_OF_WEEK, rest[4])?;
        if weekdays & (1 << 7) != 0 {
            weekdays = (weekdays & !(1 << 7)) | 1;
        }
        let spec = CronSpec {
            text,
            seconds,
            minutes,
            hours,
            days,
            months,
            weekdays,
            dom_star: rest[2].starts_with('*'),
            dow_star: rest[4].starts_with('*'),
            fixed: !rest[0].starts_with('*') && !rest[1].starts_with('*'),
            per_day: u64::from(seconds.count_ones() * minutes.count_ones() * hours.count_ones()),
        };
        if spec.never_fires() {
            return Err(fail(format!(
                "the day-of-month field {:?} names no day that the months of the month field \
                 {:?} have, so it would never fire",
                rest[2], rest[3]
            )));
        }
        Ok(spec)
    }

    /// The expression, normalised (lower case, single spaces).
    pub(super) fn text(&self) -> &str {
        &self.text
    }

    /// True for a fixed-time job (neither minute nor hour field begins with `*`).
    pub(super) fn is_fixed(&self) -> bool {
        self.fixed
    }

    /// Only the day-of-month field restricts the day (the day-of-week field
    /// begins with `*`), and no month of the month field has any of its days.
    fn never_fires(&self) -> bool {
        if self.dom_star || !self.dow_star {
            return false;
        }
        !(1..=12u32)
            .any(|m| bit(self.months, m) && (1..=days_in_month(2000, m)).any(|d| bit(self.days, d)))
    }

    /// Whether civil day `day` (days since 1970-01-01) matches month and
    /// day fields, with Vixie cron's rule: when both day fields are
    /// restricted (neither begins with `*`) a day matching either fires.
    fn day_matches(&self, day: i64) -> bool {
        let (_, m, d) = civil_from_days(day);
        bit(self.months, m) && self.day_fields_match(d, weekday(day))
    }

    fn day_fields_match(&self, d: u32, wd: u32) -> bool {
        let dom = bit(self.days, d);
        let dow = bit(self.weekdays, wd);
        if self.dom_star || self.dow_star {
            dom && dow
        } else {
            dom || dow
        }
    }

    /// Whether civil second `c` matches.
    pub(super) fn matches(&self, c: i64) -> bool {
        self.next_match(c, c + 1).is_some()
    }

    /// The smallest matching civil second in `[lo, hi)`.
    pub(super) fn next_match(&self, lo: i64, hi: i64) -> Option<i64> {
        if lo >= hi {
            return None;
        }
        let last_day = (hi - 1).div_euclid(DAY);
        let mut day = lo.div_euclid(DAY);
        let mut tod = lo.rem_euclid(DAY) as u32;
        while day <= last_day {
            let (y, m, d) = civil_from_days(day);
            if !bit(self.months, m) {
                day += i64::from(days_in_month(y, m) - d + 1); // the 1st of the next month
                tod = 0;
                continue;
            }
            if self.day_fields_match(d, weekday(day))
                && let Some(t) = self.next_time_of_day(tod)
            {
                let c = day * DAY + i64::from(t);
                return (c < hi).then_some(c);
            }
            day += 1;
            tod = 0;
        }
        None
    }

    /// The greatest matching civil second in `[lo, hi)`.
    pub(super) fn prev_match(&self, lo: i64, hi: i64) -> Option<i64> {
        if lo >= hi {
            return None;
        }
        let first_day = lo.div_euclid(DAY);
        let mut day = (hi - 1).div_euclid(DAY);
        let mut tod = (hi - 1).rem_euclid(DAY) as u32;
        while day >= first_day {
            let (_, m, d) = civil_from_days(day);
            if !bit(self.months, m) {
                day -= i64::from(d); // the last day of the previous month
                tod = (DAY - 1) as u32;
                continue;
            }
            if self.day_fields_match(d, weekday(day))
                && let Some(t) = self.prev_time_of_day(tod)
            {
                let c = day * DAY + i64::from(t);
                return (c >= lo).then_some(c);
            }
            day -= 1;
            tod = (DAY - 1) as u32;
        }
        None
    }

    /// How many civil seconds in `[lo, hi)` match.
    pub(super) fn count(&self, lo: i64, hi: i64) -> u64 {
        if lo >= hi {
            return 0;
        }
        let (first, last) = (lo.div_euclid(DAY), (hi - 1).div_euclid(DAY));
        let (from, to) = (
            lo.rem_euclid(DAY) as u32,
            ((hi - 1).rem_euclid(DAY) + 1) as u32,
        );
        let in_day = |day: i64, a: u32, b: u32| {
            if self.day_matches(day) {
                self.times_below(b) - self.times_below(a)
            } else {
                0
            }
        };
        if first == last {
            return in_day(first, from, to);
        }
        let mut n = in_day(first, from, DAY as u32) + in_day(last, 0, to);
        let mut day = first + 1;
        while day < last {
            let (y, m, d) = civil_from_days(day);
            if !bit(self.months, m) {
                day += i64::from(days_in_month(y, m) - d + 1);
                continue;
            }
            if self.day_fields_match(d, weekday(day)) {
                n += self.per_day;
            }
            day += 1;
        }
        n
    }

    /// The first matching second of the day at or after `tod`.
    fn next_time_of_day(&self, tod: u32) -> Option<u32> {
        let (h, m, s) = (tod / 3600, tod / 60 % 60, tod % 60);
        if bit(self.hours, h) {
            if bit(self.minutes, m)
                && let Some(s) = next_bit(self.seconds, s)
            {
                return Some(h * 3600 + m * 60 + s);
            }
            if let Some(m) = next_bit(self.minutes, m + 1) {
                return Some(h * 3600 + m * 60 + first_bit(self.seconds));
            }
        }
        let h = next_bit(self.hours, h + 1)?;
        Some(h * 3600 + first_bit(self.minutes) * 60 + first_bit(self.seconds))
    }

    /// The last matching second of the day at or before `tod`.
    fn prev_time_of_day(&self, tod: u32) -> Option<u32> {
        let (h, m, s) = (tod / 3600, tod / 60 % 60, tod % 60);
        if bit(self.hours, h) {
            if bit(self.minutes, m)
                && let Some(s) = prev_bit(self.seconds, s)
            {
                return Some(h * 3600 + m * 60 + s);
            }
            if let Some(m) = m.checked_sub(1).and_then(|m| prev_bit(self.minutes, m)) {
                return Some(h * 3600 + m * 60 + last_bit(self.seconds));
            }
        }
        let h = h.checked_sub(1).and_then(|h| prev_bit(self.hours, h))?;
        Some(h * 3600 + last_bit(self.minutes) * 60 + last_bit(self.seconds))
    }

    /// How many matching times of day are below `tod` (`0..=86_400`).
    fn times_below(&self, tod: u32) -> u64 {
        let (h, m, s) = (tod / 3600, tod / 60 % 60, tod % 60);
        let below = |mask: u64, v: u32| u64::from((mask & low_bits(v)).count_ones());
        let (mins, secs) = (
            u64::from(self.minutes.count_ones()),
            u64::from(self.seconds.count_ones()),
        );
        let mut n = below(self.hours, h) * mins * secs;
        if bit(self.hours, h) {
            n += below(self.minutes, m) * secs;
            if bit(self.minutes, m) {
                n += below(self.seconds, s);
            }
        }
        n
    }
}

fn bit(mask: u64, v: u32) -> bool {
    v < 64 && mask & (1 << v) != 0
}

/// Bits below `v` (all when `v >= 64`).
fn low_bits(v: u32) -> u64 {
    if v >= 64 { !0 } else { (1 << v) - 1 }
}

fn next_bit(mask: u64, from: u32) -> Option<u32> {
    let m = mask & !low_bits(from);
    (m != 0).then(|| m.trailing_zeros())
}

fn prev_bit(mask: u64, upto: u32) -> Option<u32> {
    let m = mask & low_bits(upto + 1);
    (m != 0).then(|| 63 - m.leading_zeros())
}

fn first_bit(mask: u64) -> u32 {
    mask.trailing_zeros()
}

fn last_bit(mask: u64) -> u32 {
    63 - mask.leading_zeros()
}

/// Day of the week of civil day `day`, Sunday = 0 (1970-01-01 was a Thursday).
pub(super) fn weekday(day: i64) -> u32 {
    (day + 4).rem_euclid(7) as u32
}

pub(super) fn is_leap(y: i64) -> bool {
    y % 4 == 0 && (y % 100 != 0 || y % 400 == 0)
}

pub(super) fn days_in_month(y: i64, m: u32) -> u32 {
    match m {
        2 if is_leap(y) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// (year, month, day) of civil day `z` (days since 1970-01-01), by the
/// proleptic Gregorian calendar (H. Hinnant's `civil_from_days`).
pub(super) fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// Days since 1970-01-01 of a civil date (H. Hinnant's `days_from_civil`).
#[cfg(test)]
pub(super) fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(expr: &str) -> CronSpec {
        CronSpec::parse(expr).unwrap()
    }

    /// Civil seconds of a wall-clock date and time.
    fn at(y: i64, mo: u32, d: u32, h: i64, mi: i64, s: i64) -> i64 {
        days_from_civil(y, mo, d) * DAY + h * 3600 + mi * 60 + s
    }

    #[test]
    fn civil_days_round_trip_over_eight_centuries() {
        for z in -146_097 * 2..146_097 * 2 {
            let (y, m, d) = civil_from_days(z);
            assert_eq!(days_from_civil(y, m, d), z, "day {z} = {y}-{m}-{d}");
            assert!((1..=days_in_month(y, m)).contains(&d));
        }
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(weekday(0), 4);
        assert_eq!(civil_from_days(days_from_civil(2000, 2, 29)), (2000, 2, 29));
        assert_eq!(weekday(days_from_civil(2026, 3, 29)), 0); // a Sunday
    }

    #[test]
    fn fields_become_the_sets_vixie_cron_gives_them() {
        let s = spec("*/15 1-5/2 10/7 jan-mar,dec mon-fri");
        assert_eq!(s.minutes, 1 | 1 << 15 | 1 << 30 | 1 << 45);
        assert_eq!(s.hours, 1 << 1 | 1 << 3 | 1 << 5);
        assert_eq!(s.days, 1 << 10 | 1 << 17 | 1 << 24 | 1 << 31);
        assert_eq!(s.months, 1 << 1 | 1 << 2 | 1 << 3 | 1 << 12);
        assert_eq!(s.weekdays, 0b0111110);
        assert_eq!(s.seconds, 1);
        assert!(!s.dow_star && !s.dom_star && !s.fixed);
        assert_eq!(spec("0 0 * * 7").weekdays, 1);
        assert_eq!(spec("0 0 * * 5-7").weekdays, 1 | 1 << 5 | 1 << 6);
        assert_eq!(spec("0 0 * * 0-7").weekdays, 0x7f);
        assert!(spec("0,30 2 * * *").fixed);
        assert!(!spec("0 */2 * * *").fixed);
        assert_eq!(spec("  0   3 * *  MON ").text(), "0 3 * * mon");
    }

    #[test]
    fn the_day_rule_is_either_when_both_day_fields_are_restricted() {
        // 1 March 2026 was a Sunday; 2 March a Monday.
        let either = spec("0 0 1 * mon");
        assert!(either.day_matches(days_from_civil(2026, 3, 1)));
        assert!(either.day_matches(days_from_civil(2026, 3, 2)));
        assert!(!either.day_matches(days_from_civil(2026, 3, 3)));
        let both = spec("0 0 */3 * mon"); // `*/3` counts as unrestricted: both must match
        assert!(!both.day_matches(days_from_civil(2026, 3, 2)));
        assert!(!both.day_matches(days_from_civil(2026, 3, 4)));
        assert!(both.day_matches(days_from_civil(2026, 3, 16)));
    }

    #[test]
    fn next_prev_and_count_agree_with_a_scan_of_every_second() {
        let exprs = [
            "*/20 * 3 * * *",
            "0 59 23 28-31 2 *",
            "30 */7 1 2 1",
            "15 10,40 1-2 * * sat,sun",
        ];
        for expr in exprs {
            let s = spec(expr);
            let lo = at(2024, 2, 27, 22, 0, 0);
            let hi = at(2024, 3, 3, 4, 0, 0);
            let all: Vec<i64> = (lo..hi).filter(|&c| s.matches_by_scan(c)).collect();
            assert_eq!(s.count(lo, hi), all.len() as u64, "{expr}");
            for probe in (lo..hi).step_by(997) {
                let next = all.iter().copied().find(|&c| c >= probe);
                assert_eq!(s.next_match(probe, hi), next, "{expr} next from {probe}");
                let prev = all.iter().copied().rev().find(|&c| c < probe);
                assert_eq!(s.prev_match(lo, probe), prev, "{expr} prev before {probe}");
                let upto = all.iter().filter(|&&c| c < probe).count() as u64;
                assert_eq!(s.count(lo, probe), upto, "{expr} count below {probe}");
            }
        }
    }

    impl CronSpec {
        /// The slow, obvious definition of a match.
        fn matches_by_scan(&self, c: i64) -> bool {
            let (day, tod) = (c.div_euclid(DAY), c.rem_euclid(DAY) as u32);
            self.day_matches(day)
                && bit(self.hours, tod / 3600)
                && bit(self.minutes, tod / 60 % 60)
                && bit(self.seconds, tod % 60)
        }
    }
}
