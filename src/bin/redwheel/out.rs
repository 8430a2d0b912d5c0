//! Output: writing to stdout (a closed pipe ends the program quietly),
//! aligned tables, payload previews, times and durations.

use std::fmt::Write as _;
use std::io::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::Value;

use crate::code;

/// Longest payload preview in a table, in characters (the full payload is
/// in `--json`).
const PREVIEW_CHARS: usize = 60;

/// A table printed with columns padded to their widest cell.
pub struct Table {
    header: Vec<&'static str>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(header: &[&'static str]) -> Table {
        Table {
            header: header.to_vec(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn render(&self) -> String {
        let mut widths: Vec<usize> = self.header.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let mut out = String::new();
        let line = |out: &mut String, cells: &mut dyn Iterator<Item = &str>| {
            let mut text = String::new();
            for (i, (cell, w)) in cells.zip(&widths).enumerate() {
                if i > 0 {
                    text.push_str("  ");
                }
                let _ = write!(text, "{cell:<w$}");
            }
            out.push_str(text.trim_end());
            out.push('\n');
        };
        line(&mut out, &mut self.header.iter().copied());
        for row in &self.rows {
            line(&mut out, &mut row.iter().map(String::as_str));
        }
        out
    }
}

/// A payload as a table shows it, losslessly up to the preview length:
/// printable UTF-8 as it is; anything else (invalid UTF-8, control
/// characters, or text that itself starts with `b"`) as `b"…"` with Rust
/// escapes (`\n`, `\t`, `\\`, `\"`, `\xNN` for a byte that is not UTF-8).
/// Longer than the preview: cut, with `… (N bytes)` after it.
pub fn preview(payload: &[u8]) -> String {
    let text = std::str::from_utf8(payload)
        .ok()
        .filter(|s| !s.chars().any(char::is_control) && !s.starts_with("b\""));
    let full = match text {
        Some(s) => s.to_owned(),
        None => escape_bytes(payload),
    };
    if full.chars().count() <= PREVIEW_CHARS {
        full
    } else {
        let cut: String = full.chars().take(PREVIEW_CHARS).collect();
        format!("{cut}… ({} bytes)", payload.len())
    }
}

/// `b"…"`: valid UTF-8 runs escaped as Rust strings, other bytes as `\xNN`.
pub fn escape_bytes(bytes: &[u8]) -> String {
    let mut out = String::from("b\"");
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                c if c.is_control() => out.extend(c.escape_default()),
                c => out.push(c),
            }
        }
        for b in chunk.invalid() {
            let _ = write!(out, "\\x{b:02x}");
        }
    }
    out.push('"');
    out
}

/// Standard base64 with padding (RFC 4648), for payloads in JSON.
pub fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// A length of time for people: `850ms`, `12.3s`, `5m03s`, `2h05m`, `3d04h`.
pub fn human_ms(ms: u64) -> String {
    let s = ms / 1_000;
    match ms {
        0..1_000 => format!("{ms}ms"),
        1_000..60_000 => format!("{}.{}s", s, (ms % 1_000) / 100),
        60_000..3_600_000 => format!("{}m{:02}s", s / 60, s % 60),
        3_600_000..86_400_000 => format!("{}h{:02}m", s / 3_600, (s % 3_600) / 60),
        _ => format!("{}d{:02}h", s / 86_400, (s % 86_400) / 3_600),
    }
}

/// An instant (epoch ms) as UTC, ISO 8601 with ms: `2026-11-24T04:10:05.123Z`.
pub fn utc(epoch_ms: u64) -> String {
    match jiff::Timestamp::from_millisecond(i64::try_from(epoch_ms).unwrap_or(i64::MAX)) {
        Ok(t) => t.strftime("%Y-%m-%dT%H:%M:%S%.3fZ").to_string(),
        Err(_) => format!("{epoch_ms} ms after the epoch"),
    }
}

/// An instant relative to `now` (both epoch ms): `in 9.5s` or `3.2s ago`.
pub fn relative(at_ms: u64, now_ms: u64) -> String {
    if at_ms >= now_ms {
        format!("in {}", human_ms(at_ms - now_ms))
    } else {
        format!("{} ago", human_ms(now_ms - at_ms))
    }
}

/// The `q`-quantile (0..=1) of `sorted` by nearest rank; `None` if empty.
pub fn quantile(sorted: &[u64], q: f64) -> Option<u64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

/// Writes to stdout; a closed pipe (`| head`) ends the program quietly.
pub fn emit(text: &str) {
    let mut stdout = std::io::stdout().lock();
    let written = stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush());
    if let Err(e) = written {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        let _ = writeln!(std::io::stderr(), "redwheel: cannot write the output: {e}");
        std::process::exit(i32::from(code::FAILURE));
    }
}

/// Writes `v` to stdout as pretty JSON, one document.
pub fn emit_json(v: &Value) {
    let text = serde_json::to_string_pretty(v).unwrap_or_else(|_| "null".to_owned());
    emit(&format!("{text}\n"));
}

/// Milliseconds since the Unix epoch (0 before it).
pub fn epoch_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The value, or `-` when there is none (a table cell).
pub fn or_dash(v: Option<String>) -> String {
    v.unwrap_or_else(|| "-".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn previews_show_text_as_is_and_escape_everything_else() {
        assert_eq!(preview(b"order-42"), "order-42");
        assert_eq!(preview(b"a\nb"), "b\"a\\nb\"");
        assert_eq!(preview(b"\xff\x00ok\""), "b\"\\xff\\u{0}ok\\\"\"");
        assert_eq!(preview(b"b\"x"), "b\"b\\\"x\"");
        let long = "x".repeat(100);
        assert_eq!(
            preview(long.as_bytes()),
            format!("{}… (100 bytes)", "x".repeat(60))
        );
    }

    #[test]
    fn base64_matches_rfc_4648_vectors() {
        for (raw, enc) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(raw.as_bytes()), enc);
        }
    }

    #[test]
    fn times_and_lengths_read_as_documented() {
        assert_eq!(utc(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(utc(1_795_493_405_123), "2026-11-24T04:10:05.123Z");
        assert_eq!(utc(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(human_ms(850), "850ms");
        assert_eq!(human_ms(12_345), "12.3s");
        assert_eq!(human_ms(303_000), "5m03s");
        assert_eq!(human_ms(7_500_000), "2h05m");
        assert_eq!(relative(10_500, 1_000), "in 9.5s");
        assert_eq!(relative(1_000, 4_200), "3.2s ago");
    }

    #[test]
    fn quantiles_use_the_nearest_rank() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(quantile(&v, 0.5), Some(50));
        assert_eq!(quantile(&v, 0.99), Some(99));
        assert_eq!(quantile(&[7], 0.99), Some(7));
        assert_eq!(quantile(&[], 0.5), None);
    }
}
