//! The cron grammar's fields: each field's range and names, Vixie cron's
//! `@` shorthands, and the parser of one field (a list of values, ranges
//! and steps) into a bit mask.

/// One field of an expression: its name in messages, range and names.
pub(super) struct Field {
    pub(super) name: &'static str,
    min: u32,
    max: u32,
    /// Names for the values `name_base`, `name_base + 1`, …
    names: &'static [&'static str],
    name_base: u32,
}

pub(super) const SECOND: Field = Field {
    name: "second",
    min: 0,
    max: 59,
    names: &[],
    name_base: 0,
};
pub(super) const MINUTE: Field = Field {
    name: "minute",
    min: 0,
    max: 59,
    names: &[],
    name_base: 0,
};
pub(super) const HOUR: Field = Field {
    name: "hour",
    min: 0,
    max: 23,
    names: &[],
    name_base: 0,
};
pub(super) const DAY_OF_MONTH: Field = Field {
    name: "day-of-month",
    min: 1,
    max: 31,
    names: &[],
    name_base: 0,
};
pub(super) const MONTH: Field = Field {
    name: "month",
    min: 1,
    max: 12,
    names: &[
        "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
    ],
    name_base: 1,
};
/// 0 and 7 are both Sunday; 7 is folded onto 0 after parsing.
pub(super) const DAY_OF_WEEK: Field = Field {
    name: "day-of-week",
    min: 0,
    max: 7,
    names: &["sun", "mon", "tue", "wed", "thu", "fri", "sat"],
    name_base: 0,
};

/// Vixie cron's `@` shorthands, as the expressions they stand for.
pub(super) const MACROS: &[(&str, &str)] = &[
    ("@yearly", "0 0 1 1 *"),
    ("@annually", "0 0 1 1 *"),
    ("@monthly", "0 0 1 * *"),
    ("@weekly", "0 0 * * 0"),
    ("@daily", "0 0 * * *"),
    ("@midnight", "0 0 * * *"),
    ("@hourly", "0 * * * *"),
];

/// Parses one field into a bit mask; the error is the reason, without the field.
pub(super) fn parse_field(f: &Field, text: &str) -> Result<u64, String> {
    if text.is_empty() {
        return Err("empty field".into());
    }
    let mut mask = 0u64;
    for item in text.split(',') {
        if item.is_empty() {
            return Err("empty element in the list".into());
        }
        let (range, step) = match item.split_once('/') {
            Some((range, step)) => (range, Some(parse_step(f, step)?)),
            None => (item, None),
        };
        let (lo, hi) = if range == "*" {
            (f.min, f.max)
        } else if let Some((a, b)) = range.split_once('-') {
            let (a, b) = (parse_value(f, a)?, parse_value(f, b)?);
            if a > b {
                return Err(format!("the range {range:?} runs backwards"));
            }
            (a, b)
        } else {
            let a = parse_value(f, range)?;
            // `a/k` runs from a to the end of the field.
            (a, if step.is_some() { f.max } else { a })
        };
        for v in (lo..=hi).step_by(step.unwrap_or(1) as usize) {
            mask |= 1 << v;
        }
    }
    Ok(mask)
}

fn parse_step(f: &Field, text: &str) -> Result<u32, String> {
    let step = parse_number(text).ok_or_else(|| format!("the step {text:?} is not a number"))?;
    if step == 0 || step > f.max {
        return Err(format!("the step {step} is outside 1-{}", f.max));
    }
    Ok(step)
}

fn parse_value(f: &Field, text: &str) -> Result<u32, String> {
    if let Some(v) = parse_number(text) {
        if v < f.min || v > f.max {
            return Err(format!("{v} is outside {}-{}", f.min, f.max));
        }
        return Ok(v);
    }
    if let Some(i) = f.names.iter().position(|n| *n == text) {
        return Ok(f.name_base + i as u32);
    }
    if text.is_empty() {
        return Err("a value is missing".into());
    }
    if f.names.is_empty() {
        Err(format!("{text:?} is not a number"))
    } else {
        Err(format!(
            "{text:?} is neither a number nor a name ({})",
            f.names.join(", ")
        ))
    }
}

/// A decimal number of at most 9 digits (nothing longer is in range anyway).
fn parse_number(text: &str) -> Option<u32> {
    if text.is_empty() || text.len() > 9 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}
