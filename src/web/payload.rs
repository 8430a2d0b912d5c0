//! How a payload is shown: UTF-8 text as text (escaped where it is
//! rendered), anything else as hex; cut to a preview unless the whole of
//! it was asked for.

use std::fmt::Write as _;

/// Characters of text in a preview.
const PREVIEW_CHARS: usize = 160;
/// Bytes of a binary payload in a preview.
const PREVIEW_HEX_BYTES: usize = 48;
/// The most bytes shown when the whole payload is asked for.
pub(crate) const FULL_BYTES: usize = 1 << 20;

/// A payload as a page or the JSON shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Shown {
    /// The text (if the payload is UTF-8) or its bytes as hex pairs.
    pub body: String,
    pub is_text: bool,
    /// Its size in bytes.
    pub bytes: usize,
    /// `body` is not all of it.
    pub truncated: bool,
}

/// `payload` as a preview, or (`full`) up to [`FULL_BYTES`] of it.
pub(crate) fn show(payload: &[u8], full: bool) -> Shown {
    let limit = if full { FULL_BYTES } else { usize::MAX };
    let head = &payload[..payload.len().min(limit)];
    // A cut inside a character still counts as text.
    let text = match std::str::from_utf8(head) {
        Ok(s) => Some(s),
        Err(e) if head.len() < payload.len() && e.error_len().is_none() => {
            std::str::from_utf8(&head[..e.valid_up_to()]).ok()
        }
        Err(_) => None,
    };
    match text {
        Some(s) if full => Shown {
            truncated: s.len() < payload.len(),
            body: s.to_owned(),
            is_text: true,
            bytes: payload.len(),
        },
        Some(s) => {
            let cut: String = s.chars().take(PREVIEW_CHARS).collect();
            Shown {
                truncated: cut.len() < payload.len(),
                body: cut,
                is_text: true,
                bytes: payload.len(),
            }
        }
        None => {
            let n = if full {
                head.len()
            } else {
                head.len().min(PREVIEW_HEX_BYTES)
            };
            Shown {
                body: hex(&payload[..n]),
                is_text: false,
                bytes: payload.len(),
                truncated: n < payload.len(),
            }
        }
    }
}

/// Bytes as lowercase hex pairs separated by spaces.
fn hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 3);
    for (i, b) in bytes.iter().enumerate() {
        if i > 0 {
            out.push(' ');
        }
        let _ = write!(out, "{b:02x}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_stays_text_and_binary_becomes_hex() {
        let s = show(b"<script>alert(1)</script>", false);
        assert_eq!(
            (s.body.as_str(), s.is_text, s.truncated),
            ("<script>alert(1)</script>", true, false)
        );
        let b = show(&[0xff, 0x00, 0x41], false);
        assert_eq!(
            (b.body.as_str(), b.is_text, b.bytes),
            ("ff 00 41", false, 3)
        );
    }

    #[test]
    fn previews_are_cut_and_the_full_view_is_not() {
        let long = "é".repeat(500);
        let p = show(long.as_bytes(), false);
        assert_eq!(p.body.chars().count(), PREVIEW_CHARS);
        assert!(p.truncated && p.is_text);
        let f = show(long.as_bytes(), true);
        assert_eq!((f.body.len(), f.truncated), (1_000, false));
        let bin = vec![0xffu8; 100];
        let p = show(&bin, false);
        assert_eq!(
            (p.body.len(), p.truncated),
            (PREVIEW_HEX_BYTES * 3 - 1, true)
        );
        assert!(!show(&bin, true).truncated);
    }

    #[test]
    fn the_full_view_stops_at_its_limit_even_inside_a_character() {
        let mut big = vec![b'a'; FULL_BYTES - 1];
        big.extend_from_slice("é and more".as_bytes());
        let f = show(&big, true);
        assert!(f.is_text && f.truncated);
        assert_eq!(f.body.len(), FULL_BYTES - 1);
    }
}
