//! The canonical, versioned text of a schedule (see "Definitions" in the
//! module documentation).

use std::fmt::Write;

use super::cron::CronSpec;
use super::zone::Zone;
use super::{CatchUp, Kind, Schedule, invalid};
use crate::Error;

/// The version tag this build writes and reads.
const VERSION: &str = "v1";

impl Schedule {
    /// The canonical text of this schedule, to store and to compare byte
    /// for byte: equal schedules give equal strings, in every process and
    /// every later version of redwheel (see "Definitions" in the
    /// [module documentation](super)).
    pub fn definition(&self) -> String {
        let mut out = String::with_capacity(64);
        out.push_str(VERSION);
        // Writing to a String cannot fail.
        let _ = match &self.kind {
            Kind::Every { period_ms } => write!(out, ";every={period_ms}ms"),
            Kind::Cron { spec, zone } => write!(out, ";cron={};tz={}", spec.text(), zone.name()),
        };
        let _ = write!(
            out,
            ";start={};until={};catch_up=",
            Ms(self.start_ms),
            Ms(self.until_ms)
        );
        let _ = match self.catch_up {
            CatchUp::Skip => write!(out, "skip"),
            CatchUp::Latest => write!(out, "latest"),
            CatchUp::All { max } => write!(out, "all:{max}"),
        };
        out
    }

    /// Decodes a [`definition`](Schedule::definition).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidOption`](crate::ErrorKind::InvalidOption) for
    /// anything but the canonical text of a valid schedule: another
    /// version, a field out of place, a non-canonical spelling, a zone the
    /// bundled database does not know, or a schedule that
    /// [`validate`](Schedule::validate) refuses.
    pub fn from_definition(definition: &str) -> Result<Schedule, Error> {
        let bad = |why: &str| invalid(format!("invalid schedule definition {definition:?}: {why}"));
        let mut parts = definition.split(';');
        let version = parts.next().unwrap_or_default();
        if version != VERSION {
            let numbered = version.len() > 1
                && version.starts_with('v')
                && version[1..].bytes().all(|b| b.is_ascii_digit());
            return Err(if numbered {
                bad(&format!(
                    "version {version} is not one this build of redwheel reads ({VERSION})"
                ))
            } else {
                bad(&format!("it does not begin with a version tag ({VERSION})"))
            });
        }
        let mut field = |key: &str| {
            parts
                .next()
                .and_then(|part| part.strip_prefix(key)?.strip_prefix('='))
                .ok_or_else(|| bad(&format!("expected the field {key:?} next")))
        };
        let kind = if let Ok(expr) = field("cron") {
            let spec = CronSpec::parse(expr).map_err(|e| bad(&e.to_string()))?;
            let zone = Zone::lookup(field("tz")?).map_err(|e| bad(&e.to_string()))?;
            Kind::Cron { spec, zone }
        } else {
            // The field just read was not `cron=…`: it must be `every=…`.
            let body = definition.split(';').nth(1).unwrap_or_default();
            let period_ms = body
                .strip_prefix("every=")
                .and_then(|p| p.strip_suffix("ms"))
                .and_then(|p| p.parse::<u64>().ok())
                .ok_or_else(|| bad("expected cron=<expression> or every=<milliseconds>ms"))?;
            Kind::Every { period_ms }
        };
        let start =
            parse_ms(field("start")?).ok_or_else(|| bad("start is neither - nor a number"))?;
        let until =
            parse_ms(field("until")?).ok_or_else(|| bad("until is neither - nor a number"))?;
        let catch_up = match field("catch_up")? {
            "skip" => CatchUp::Skip,
            "latest" => CatchUp::Latest,
            other => other
                .strip_prefix("all:")
                .and_then(|max| max.parse().ok())
                .map(|max| CatchUp::All { max })
                .ok_or_else(|| bad("catch_up is none of skip, latest, all:<max>"))?,
        };
        if parts.next().is_some() {
            return Err(bad("unexpected fields after catch_up"));
        }
        let schedule = Schedule {
            kind,
            start_ms: start,
            until_ms: until,
            catch_up,
        };
        schedule.validate().map_err(|e| bad(&e.to_string()))?;
        let canonical = schedule.definition();
        if canonical != definition {
            return Err(bad(&format!(
                "not in canonical form, which is {canonical:?}"
            )));
        }
        Ok(schedule)
    }
}

/// An optional instant in ms, as written in a definition.
struct Ms(Option<i64>);

impl std::fmt::Display for Ms {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(ms) => write!(f, "{ms}"),
            None => f.write_str("-"),
        }
    }
}

fn parse_ms(text: &str) -> Option<Option<i64>> {
    if text == "-" {
        Some(None)
    } else {
        text.parse().ok().map(Some)
    }
}
