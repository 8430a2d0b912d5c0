//! The three pages (rendered on the server): the overview, a queue, the
//! locks. Each returns the live part that `html::page` frames.

use std::fmt::Write as _;

use super::actions::Shown;
use super::chart;
use super::config::Config;
use super::confirm::action_button;
use super::detail::{QueueDetail, SECTIONS, epoch_ms};
use super::html::{count, duration_text, escape, queue_href, rate_text, when};
use super::payload::show;
use super::refresher::{Row, Snapshot, Status, View};
use super::router::{Action, segment};
use crate::lock::inspect::LockInfo;
use crate::queue::inspect::{MessageState, PeekedMessage};

/// The line under a page's heading: how fresh the overview's data is.
fn meta(view: &View, config: &Config) -> String {
    let Some(s) = view.snapshot.as_deref() else {
        return String::new();
    };
    let age = view.age.map_or(0, |a| a.as_millis() as u64);
    format!(
        r#"<p class="meta">{} queues · read {} ago · every {} · last read: {} round trip{}, {} commands, {}</p>"#,
        count(s.rows.len() as u64),
        duration_text(age),
        duration_text(config.refresh.as_millis() as u64),
        s.cost.round_trips,
        if s.cost.round_trips == 1 { "" } else { "s" },
        count(s.cost.commands),
        duration_text(s.cost.took.as_millis() as u64),
    )
}

fn badge(status: Status) -> String {
    format!(r#"<span class="badge {s}">{s}</span>"#, s = status.as_str())
}

/// No holder or token: every action's button but a force-unlock's.
const NOTHING_SHOWN: Shown = Shown {
    holder: None,
    fencing_token: None,
};

/// The mark of a paused queue (or schedule).
const PAUSED_MARK: &str = r#"<span class="badge paused" data-paused>paused</span>"#;

fn opt_ms(ms: Option<u64>) -> String {
    ms.map_or_else(|| "–".to_owned(), duration_text)
}

/// `GET /`.
pub(crate) fn overview(view: &View, config: &Config) -> String {
    let mut out = format!("<h1>Queues</h1>\n{}\n", meta(view, config));
    let Some(snap) = view.snapshot.as_deref() else {
        return out;
    };
    if snap.rows.is_empty() {
        out.push_str(r#"<p class="empty">No queues found in Redis.</p>"#);
        return out;
    }
    out.push_str(
        r#"<table class="queues"><thead><tr><th>Queue</th><th>Status</th><th class="num">Delayed</th><th class="num">Ready</th><th class="num">In flight</th><th class="num">Dead</th><th class="num">Oldest overdue</th><th class="num">Next due</th><th>Deliveries per second</th></tr></thead><tbody>
"#,
    );
    for r in &snap.rows {
        let _ = write!(
            out,
            r#"<tr data-queue="{n}" class="row-{s}"><td class="name"><a href="{href}">{n}</a></td><td>{badge}{paused}</td>"#,
            n = escape(&r.name),
            s = r.status.as_str(),
            href = escape(&queue_href(&r.name)),
            badge = badge(r.status),
            paused = if r.reading.as_ref().is_ok_and(|x| x.paused) {
                format!(" {PAUSED_MARK}")
            } else {
                String::new()
            },
        );
        match &r.reading {
            Ok(x) => {
                for (field, v) in [
                    ("delayed", x.delayed),
                    ("ready", x.ready),
                    ("in_flight", x.in_flight),
                    ("dead", x.dead),
                ] {
                    let _ = write!(
                        out,
                        r#"<td class="num" data-field="{field}" data-value="{v}">{}</td>"#,
                        count(v)
                    );
                }
                let _ = write!(
                    out,
                    r#"<td class="num" data-field="oldest_overdue">{}</td><td class="num" data-field="next_due">{}</td>"#,
                    opt_ms(x.oldest_overdue_ms),
                    x.next_due_ms
                        .map_or_else(|| "–".to_owned(), |t| when(t, x.server_ms)),
                );
            }
            Err(e) => {
                let _ = write!(out, r#"<td colspan="6" class="error">{}</td>"#, escape(e));
            }
        }
        let _ = writeln!(
            out,
            r#"<td class="rate">{}<span class="rate-now">{}</span></td></tr>"#,
            chart::bars(&r.history, 120, 24),
            r.rate.map_or_else(|| "–".to_owned(), rate_text),
        );
    }
    out.push_str("</tbody></table>\n");
    out
}

/// `GET /queues/{name}`: `detail` when it could be read, else `problem`
/// (and the overview's line for the queue, if any, with its age).
pub(crate) fn queue(
    name: &str,
    detail: Option<&QueueDetail>,
    problem: Option<&str>,
    snapshot: Option<&Snapshot>,
    config: &Config,
) -> String {
    let row = snapshot.and_then(|s| s.row(name));
    let mut out = format!(
        r#"<nav class="crumbs"><a href="/">Queues</a> / <span>{n}</span></nav>
<h1 class="queue-name">{n} {badge}{paused}</h1>
"#,
        n = escape(name),
        badge = row.map(|r| badge(r.status)).unwrap_or_default(),
        paused = if detail.is_some_and(|d| d.limits.paused) {
            format!(" {PAUSED_MARK}")
        } else {
            String::new()
        },
    );
    if let Some(p) = problem {
        let _ = writeln!(
            out,
            r#"<div class="banner down" data-problem>{}</div>"#,
            escape(p)
        );
    }
    let cards = match (detail, row) {
        (Some(d), _) => Some(cards_of(
            d.stats.delayed,
            d.stats.ready,
            d.stats.in_flight,
            d.stats.dead,
        )),
        (None, Some(Row { reading: Ok(x), .. })) => {
            Some(cards_of(x.delayed, x.ready, x.in_flight, x.dead))
        }
        _ => None,
    };
    if let Some(cards) = cards {
        out.push_str(r#"<div class="cards">"#);
        for (field, label, v) in cards {
            let _ = write!(
                out,
                r#"<div class="card" data-field="{field}"><span class="label">{label}</span><span class="value" data-value="{v}">{}</span></div>"#,
                count(v)
            );
        }
        if let Some(d) = detail {
            let _ = write!(
                out,
                r#"<div class="card"><span class="label">Oldest overdue</span><span class="value">{}</span></div><div class="card"><span class="label">Next due</span><span class="value">{}</span></div>"#,
                opt_ms(d.stats.oldest_overdue.map(|x| x.as_millis() as u64)),
                d.stats
                    .next_due
                    .map_or_else(|| "–".to_owned(), |t| when(epoch_ms(t), d.server_ms)),
            );
        }
        out.push_str("</div>\n");
    }
    if let Some(r) = row {
        let _ = writeln!(
            out,
            r#"<div class="chart-box"><span class="label">Deliveries per second, last minutes</span>{}<span class="rate-now">{} now</span></div>"#,
            chart::bars(&r.history, 600, 60),
            r.rate.map_or_else(|| "–".to_owned(), rate_text),
        );
    }
    if let Some(d) = detail {
        controls(&mut out, d, config);
        for ((state, key, title), list) in SECTIONS.iter().zip(&d.messages) {
            section(&mut out, d, *state, key, title, list, config);
        }
        schedules(&mut out, d, config);
    }
    out
}

/// The queue's controls: paused or not (with the button that changes
/// it), rate limit, max in flight, max length.
fn controls(out: &mut String, d: &QueueDetail, config: &Config) {
    let l = &d.limits;
    let _ = write!(
        out,
        r#"<section class="controls" id="controls" data-paused-state="{}"><h2>Controls</h2><div class="section-actions">"#,
        l.paused
    );
    let queue = d.name.clone();
    let action = if l.paused {
        Action::Resume { queue }
    } else {
        Action::Pause { queue }
    };
    let button = action_button(config, &action, None, &NOTHING_SHOWN);
    out.push_str(&button.unwrap_or_default());
    out.push_str("</div>");
    let unlimited = || "none".to_owned();
    let _ = writeln!(
        out,
        r#"<table class="limits"><tbody><tr><th>State</th><td data-field="paused">{}</td></tr><tr><th>Rate limit</th><td data-field="rate_limit">{}</td></tr><tr><th>Max in flight</th><td data-field="max_in_flight">{}</td></tr><tr><th>Max length</th><td data-field="max_len">{}</td></tr></tbody></table></section>"#,
        if l.paused {
            "paused: nothing is handed out"
        } else {
            "running"
        },
        l.rate_limit.map_or_else(unlimited, |(max, per)| format!(
            "{} per {}",
            count(u64::from(max)),
            duration_text(per.as_millis() as u64)
        )),
        l.max_in_flight.map_or_else(unlimited, count),
        l.max_len.map_or_else(unlimited, count),
    );
}

/// The queue's recurring schedules, each with a button that fires it now.
fn schedules(out: &mut String, d: &QueueDetail, config: &Config) {
    let _ = write!(
        out,
        r#"<section class="schedules" id="schedules"><h2>Schedules <span class="count">{}</span></h2>"#,
        count(d.schedules.len() as u64)
    );
    if d.schedules.is_empty() {
        out.push_str(r#"<p class="empty">None.</p></section>"#);
        out.push('\n');
        return;
    }
    out.push_str(r#"<table class="scheds"><thead><tr><th>Name</th><th>Definition</th><th>Next run</th><th>Last fired</th><th></th></tr></thead><tbody>"#);
    let at = |t: Option<std::time::SystemTime>| {
        t.map_or_else(|| "–".to_owned(), |t| when(epoch_ms(t), d.server_ms))
    };
    for s in &d.schedules {
        let trigger = Action::TriggerSchedule {
            queue: d.name.clone(),
            schedule: s.name.clone(),
        };
        let _ = write!(
            out,
            r#"<tr data-schedule="{n}"><td class="name">{n}{paused}</td><td class="id">{def}</td><td>{next}</td><td>{last}</td><td>{button}</td></tr>"#,
            n = escape(&s.name),
            paused = if s.paused {
                format!(" {PAUSED_MARK}")
            } else {
                String::new()
            },
            def = escape(&s.definition),
            next = at(s.next),
            last = at(s.last_fired),
            button = action_button(config, &trigger, None, &NOTHING_SHOWN).unwrap_or_default(),
        );
    }
    out.push_str("</tbody></table></section>\n");
}

/// The count cards: field, label, value.
fn cards_of(
    delayed: u64,
    ready: u64,
    in_flight: u64,
    dead: u64,
) -> [(&'static str, &'static str, u64); 4] {
    [
        ("delayed", "Delayed", delayed),
        ("ready", "Ready", ready),
        ("in_flight", "In flight", in_flight),
        ("dead", "Dead", dead),
    ]
}

fn total(d: &QueueDetail, state: MessageState) -> u64 {
    match state {
        MessageState::Delayed => d.stats.delayed,
        MessageState::Ready => d.stats.ready,
        MessageState::InFlight => d.stats.in_flight,
        _ => d.stats.dead,
    }
}

fn section(
    out: &mut String,
    d: &QueueDetail,
    state: MessageState,
    key: &str,
    title: &str,
    list: &[PeekedMessage],
    config: &Config,
) {
    let all = total(d, state);
    let _ = write!(
        out,
        r#"<section class="messages" id="{key}" data-state="{key}"><h2>{title} <span class="count">{}</span></h2>"#,
        count(all)
    );
    if state == MessageState::Dead && all > 0 {
        let requeue = Action::RequeueDead {
            queue: d.name.clone(),
        };
        out.push_str(r#"<div class="section-actions">"#);
        for count in [Some(1), None] {
            if let Some(b) = action_button(config, &requeue, count, &NOTHING_SHOWN) {
                out.push_str(&b);
            }
        }
        out.push_str("</div>");
    }
    if list.is_empty() {
        out.push_str(r#"<p class="empty">None.</p></section>"#);
        out.push('\n');
        return;
    }
    let head = match state {
        MessageState::Dead => {
            "<th>ID</th><th>Died</th><th class=\"num\">Attempts</th><th>Reason</th>"
        }
        MessageState::InFlight => {
            "<th>ID</th><th class=\"num\">Attempt</th><th>Visible until</th><th>Due</th>"
        }
        MessageState::Ready => "<th>ID</th><th>Due</th><th class=\"num\">Attempts</th>",
        _ => "<th>ID</th><th>Due</th>",
    };
    let _ = write!(
        out,
        r#"<table class="msgs"><thead><tr>{head}<th>Payload</th><th></th></tr></thead><tbody>"#
    );
    let now = d.server_ms;
    let at = |ms: Option<u64>| ms.map_or_else(|| "–".to_owned(), |t| when(t, now));
    for m in list {
        let _ = write!(
            out,
            r#"<tr data-id="{id}"><td class="id">{id}</td>"#,
            id = escape(&m.id)
        );
        let _ = match state {
            MessageState::Dead => write!(
                out,
                r#"<td>{}</td><td class="num">{}</td><td class="reason">{}</td>"#,
                at(m.since_ms),
                m.attempts,
                escape(m.reason.as_deref().unwrap_or(""))
            ),
            MessageState::InFlight => write!(
                out,
                r#"<td class="num">{}</td><td>{}</td><td>{}</td>"#,
                m.attempts,
                at(m.since_ms),
                at(m.due_ms)
            ),
            MessageState::Ready => write!(
                out,
                r#"<td>{}</td><td class="num">{}</td>"#,
                at(m.due_ms),
                m.attempts
            ),
            _ => write!(out, "<td>{}</td>", at(m.due_ms)),
        };
        payload_cell(out, d, m);
        let remove = Action::Remove {
            queue: d.name.clone(),
            id: m.id.clone(),
        };
        let _ = write!(
            out,
            "<td>{}</td></tr>",
            action_button(config, &remove, None, &NOTHING_SHOWN).unwrap_or_default()
        );
    }
    out.push_str("</tbody></table>");
    if (list.len() as u64) < all {
        let more = (d.limit * 5).min(super::detail::MAX_LIMIT);
        let _ = write!(
            out,
            r#"<p class="more">The first {} of {}.{}</p>"#,
            list.len(),
            count(all),
            if more > d.limit {
                format!(r#" <a href="?limit={more}#{key}">Show {more}</a>"#)
            } else {
                String::new()
            }
        );
    }
    out.push_str("</section>\n");
}

fn payload_cell(out: &mut String, d: &QueueDetail, m: &PeekedMessage) {
    let Some(payload) = m.payload.as_deref() else {
        out.push_str(r#"<td class="payload gone">(gone)</td>"#);
        return;
    };
    let full = d.show.as_deref() == Some(m.id.as_str());
    let p = show(payload, full);
    let _ = write!(
        out,
        r#"<td class="payload"><pre class="{}">{}</pre>"#,
        if p.is_text { "text" } else { "hex" },
        escape(&p.body)
    );
    let limit = if d.limit == super::detail::DEFAULT_LIMIT {
        String::new()
    } else {
        format!("limit={}&", d.limit)
    };
    if full {
        let _ = write!(
            out,
            r#"<a class="toggle" href="?{}">show less</a>"#,
            limit.trim_end_matches('&')
        );
        if p.truncated {
            let _ = write!(
                out,
                r#" <span class="note">the first {} of {} bytes</span>"#,
                count(super::payload::FULL_BYTES as u64),
                count(p.bytes as u64)
            );
        }
    } else if p.truncated {
        let _ = write!(
            out,
            r#"<a class="toggle" href="?{limit}show={}">show all {} bytes</a>"#,
            escape(&segment(&m.id)),
            count(p.bytes as u64)
        );
    }
    if !p.is_text {
        out.push_str(r#" <span class="note">hex: not UTF-8</span>"#);
    }
    out.push_str("</td>");
}

/// `GET /locks`.
pub(crate) fn locks(found: Option<&[LockInfo]>, problem: Option<&str>, config: &Config) -> String {
    let mut out = String::from("<h1>Locks</h1>\n");
    if let Some(p) = problem {
        let _ = writeln!(
            out,
            r#"<div class="banner down" data-problem>{}</div>"#,
            escape(p)
        );
    }
    let Some(found) = found else {
        return out;
    };
    if found.is_empty() {
        out.push_str(r#"<p class="empty">No lock is held.</p>"#);
    } else {
        out.push_str(r#"<table class="locks"><thead><tr><th>Lock</th><th>Holder</th><th class="num">Holds</th><th class="num">Lease left</th><th class="num">Fencing token</th><th></th></tr></thead><tbody>"#);
        for l in found {
            let (owner, holds) = l
                .holders
                .first()
                .map_or(("–".to_owned(), "–".to_owned()), |(o, c)| {
                    (escape(o), c.to_string())
                });
            let shown = Shown {
                holder: l.holders.first().map(|(o, _)| o.clone()),
                fencing_token: l.token.map(|t| t.to_string()),
            };
            let button = action_button(
                config,
                &Action::ForceUnlock {
                    lock: l.name.clone(),
                },
                None,
                &shown,
            );
            let _ = writeln!(
                out,
                r#"<tr data-lock="{n}"><td class="name">{n}</td><td class="id">{owner}</td><td class="num">{holds}</td><td class="num">{ttl}</td><td class="num" data-field="token">{token}</td><td>{button}</td></tr>"#,
                n = escape(&l.name),
                ttl = l
                    .ttl_ms
                    .map_or_else(|| "no expiry".to_owned(), duration_text),
                token = l.token.map_or_else(|| "–".to_owned(), |t| t.to_string()),
                button = button.unwrap_or_default(),
            );
        }
        out.push_str("</tbody></table>\n");
    }
    out.push_str(r#"<p class="note">Waiters are not listed: a waiting process keeps its waiters in its own memory, not in Redis.</p>"#);
    out
}

/// A page for a path that is not one.
pub(crate) fn not_found(what: &str) -> String {
    format!(
        r#"<h1>Not found</h1><p class="empty">{}</p><p><a href="/">All queues</a></p>"#,
        escape(what)
    )
}
