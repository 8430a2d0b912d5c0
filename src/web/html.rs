//! The page frame (head, navigation, the Redis banner) and the small
//! pieces every page uses: escaping, links, numbers, durations and times.
//!
//! Every text that comes from Redis or from the request goes through
//! [`escape`] (element text and quoted attribute values alike) or, in a
//! URL, through `router::segment`.

use std::fmt::Write as _;

use super::config::Config;
use super::refresher::{Redis, View};
use super::router::segment;

/// `s` with `& < > " '` replaced by character references: safe as element
/// text and inside a quoted attribute value.
pub(crate) fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The page of queue `name`.
pub(crate) fn queue_href(name: &str) -> String {
    format!("/queues/{}", segment(name))
}

/// `1234567` as `1,234,567`.
pub(crate) fn count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A length of time for people: `850 ms`, `12.3 s`, `5 min 03 s`,
/// `2 h 05 min`, `3 d 04 h`.
pub(crate) fn duration_text(ms: u64) -> String {
    let s = ms / 1_000;
    match ms {
        0..1_000 => format!("{ms} ms"),
        1_000..60_000 => format!("{}.{} s", s, (ms % 1_000) / 100),
        60_000..3_600_000 => format!("{} min {:02} s", s / 60, s % 60),
        3_600_000..86_400_000 => format!("{} h {:02} min", s / 3_600, (s % 3_600) / 60),
        _ => format!("{} d {:02} h", s / 86_400, (s % 86_400) / 3_600),
    }
}

/// An instant (epoch ms) relative to `now_ms`, in a `<time>` element whose
/// `data-ms` the page's script turns into an absolute time on hover.
pub(crate) fn when(at_ms: u64, now_ms: u64) -> String {
    let text = if at_ms >= now_ms {
        format!("in {}", duration_text(at_ms - now_ms))
    } else {
        format!("{} ago", duration_text(now_ms - at_ms))
    };
    format!(r#"<time data-ms="{at_ms}">{text}</time>"#)
}

/// Deliveries per second.
pub(crate) fn rate_text(r: f64) -> String {
    format!("{r:.1}/s")
}

/// Which navigation link is the current page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Nav {
    Queues,
    Locks,
}

/// A whole page: `title` (text), the live part (`live`, HTML that the
/// page's script replaces on each refresh) under the Redis banner.
pub(crate) fn page(title: &str, nav: Nav, config: &Config, view: &View, live: &str) -> String {
    frame(title, nav, config, view, live, config.refresh.as_millis())
}

/// As [`page`], for a page the script does not refresh (the answer to a
/// form: a confirmation, an action's outcome).
pub(crate) fn page_static(
    title: &str,
    nav: Nav,
    config: &Config,
    view: &View,
    live: &str,
) -> String {
    frame(title, nav, config, view, live, 0)
}

fn frame(
    title: &str,
    nav: Nav,
    config: &Config,
    view: &View,
    live: &str,
    refresh_ms: u128,
) -> String {
    let mut out = String::with_capacity(live.len() + 2_048);
    let _ = write!(
        out,
        r#"<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>redwheel · {title}</title>
<link rel="stylesheet" href="/assets/dashboard.css">
<script src="/assets/dashboard.js" defer></script>
</head>
<body data-refresh-ms="{refresh}" data-token-required="{token}" data-read-only="{ro}">
<header class="top">
<a class="brand" href="/">redwheel</a>
<nav><a href="/"{q}>Queues</a><a href="/locks"{l}>Locks</a></nav>
<span class="mode">{mode}</span>
</header>
<form id="token-form" class="token-bar" hidden>
<label>Token for actions <input type="password" name="token" autocomplete="off" required></label>
<button type="submit">Use token</button>
<span class="token-note"></span>
</form>
<div id="flash" class="flash" role="status" hidden></div>
<div id="unreachable" class="banner down" hidden>The dashboard itself does not answer: showing the last page it sent.</div>
<main id="live" data-snapshot="{generation}">
{banner}{live}</main>
</body>
</html>
"#,
        title = escape(title),
        refresh = refresh_ms,
        token = u8::from(config.token.is_some()),
        ro = u8::from(config.read_only),
        q = if nav == Nav::Queues {
            r#" aria-current="page""#
        } else {
            ""
        },
        l = if nav == Nav::Locks {
            r#" aria-current="page""#
        } else {
            ""
        },
        mode = if config.read_only { "read-only" } else { "" },
        generation = view.snapshot.as_ref().map_or(0, |s| s.generation),
        banner = banner(view),
    );
    out
}

/// What the page says about Redis: nothing while it answers.
fn banner(view: &View) -> String {
    let data = match view.age {
        Some(age) => format!(
            " Showing the data read {} ago.",
            duration_text(age.as_millis() as u64)
        ),
        None => " No data read yet.".to_owned(),
    };
    match &view.redis {
        Redis::Up => String::new(),
        Redis::Starting => {
            r#"<div class="banner wait" data-redis="starting">Reading Redis…</div>"#.to_owned()
                + "\n"
        }
        Redis::Slow(waiting) => format!(
            r#"<div class="banner down" data-redis="slow">Redis is not answering (waiting for {}).{data}</div>
"#,
            duration_text(waiting.as_millis() as u64)
        ),
        Redis::Down { down_for, error } => format!(
            r#"<div class="banner down" data-redis="down">Redis is down (for {}): {}.{data}</div>
"#,
            duration_text(down_for.as_millis() as u64),
            escape(error)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_leaves_no_markup() {
        assert_eq!(
            escape(r#"<script>alert("x" & 'y')</script>"#),
            "&lt;script&gt;alert(&quot;x&quot; &amp; &#39;y&#39;)&lt;/script&gt;"
        );
    }

    #[test]
    fn numbers_and_durations_read_well() {
        assert_eq!(count(0), "0");
        assert_eq!(count(1_234_567), "1,234,567");
        assert_eq!(count(100), "100");
        assert_eq!(duration_text(850), "850 ms");
        assert_eq!(duration_text(12_345), "12.3 s");
        assert_eq!(duration_text(303_000), "5 min 03 s");
        assert_eq!(duration_text(7_500_000), "2 h 05 min");
        assert_eq!(duration_text(277_200_000), "3 d 05 h");
        assert!(when(10_500, 1_000).contains(">in 9.5 s<"));
        assert!(when(1_000, 4_200).contains(">3.2 s ago<"));
    }
}
