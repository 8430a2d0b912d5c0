//! An action from its request to its answer: its fields (form body, else
//! query), the confirmation the destructive ones need (`confirm=yes`, or
//! a 400), the first step of a page's button (`step=ask`: the question,
//! nothing done), and the answer as JSON or, to a browser's form (no
//! script), as a page: the confirmation page with its second, confirming
//! button, or what was done.
//!
//! Destructive, so refused without `confirm=yes`: force-unlock, remove,
//! requeue all dead letters. Pause and trigger are asked about by the page
//! too (`step=ask` on their first button) but taken without a
//! confirmation from a tool.

use std::fmt::Write as _;

use serde_json::{Value, json};

use super::actions::{self, Shown};
use super::bounded::Bounded;
use super::config::Config;
use super::html::{self, Nav, escape, queue_href};
use super::model;
use super::refresher::Refresher;
use super::request::Request;
use super::response::Reply;
use super::router::{Action, action_path, query_param};
use crate::runtime::Redwheel;

/// What answering an action needs of the running dashboard.
pub(crate) struct Ctx<'a> {
    pub rw: &'a Redwheel,
    pub config: &'a Config,
    pub bounded: &'a Bounded,
    pub refresher: &'a Refresher,
}

/// An action's fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Fields {
    /// `confirm=yes`: the second step.
    pub confirm: bool,
    /// `step=ask`: the first step of a page's button: ask, do nothing.
    pub ask: bool,
    /// `count=` of a requeue.
    pub count: Option<String>,
    pub shown: Shown,
}

/// The fields of a request: each from the form body if it has it, else
/// from the query.
pub(crate) fn fields(query: &str, body: &[u8]) -> Fields {
    let body = String::from_utf8_lossy(body);
    let get = |key: &str| query_param(&body, key).or_else(|| query_param(query, key));
    Fields {
        confirm: get("confirm").is_some_and(|v| v == "yes"),
        ask: get("step").is_some_and(|v| v == "ask"),
        count: get("count"),
        shown: Shown {
            holder: get("holder"),
            fencing_token: get("fencing_token"),
        },
    }
}

/// True for a browser's form (it asks for HTML); the page's script and
/// tools get JSON.
pub(crate) fn wants_html(req: &Request) -> bool {
    req.header("Accept")
        .is_some_and(|a| a.to_ascii_lowercase().contains("text/html"))
}

/// True for the actions refused without `confirm=yes`.
pub(crate) fn must_confirm(action: &Action, count: Option<usize>) -> bool {
    matches!(action, Action::Remove { .. } | Action::ForceUnlock { .. })
        || matches!(action, Action::RequeueDead { .. } if count.is_none())
}

/// True for the actions whose button on a page asks first.
pub(crate) fn asks_first(action: &Action, count: Option<usize>) -> bool {
    must_confirm(action, count)
        || matches!(
            action,
            Action::Pause { .. } | Action::TriggerSchedule { .. }
        )
}

/// The button's text.
pub(crate) fn label(action: &Action, count: Option<usize>) -> &'static str {
    match action {
        Action::RequeueDead { .. } if count == Some(1) => "Requeue oldest",
        Action::RequeueDead { .. } if count.is_some() => "Requeue",
        Action::RequeueDead { .. } => "Requeue all",
        Action::Remove { .. } => "Remove",
        Action::Pause { .. } => "Pause",
        Action::Resume { .. } => "Resume",
        Action::TriggerSchedule { .. } => "Trigger now",
        Action::ForceUnlock { .. } => "Force unlock",
    }
}

/// What the confirmation asks.
pub(crate) fn question(action: &Action, count: Option<usize>, shown: &Shown) -> String {
    match action {
        Action::RequeueDead { queue } => match count {
            None => format!("Requeue all dead letters of {queue}? They become ready at once."),
            Some(n) => format!(
                "Requeue the {n} oldest dead letter{} of {queue}? They become ready at once.",
                if n == 1 { "" } else { "s" }
            ),
        },
        Action::Remove { queue, id } => {
            format!("Remove message {id} from {queue}? It is deleted for good.")
        }
        Action::Pause { queue } => format!(
            "Pause {queue}? Offers are still taken, but no process hands out a message until it is resumed."
        ),
        Action::Resume { queue } => format!("Resume {queue}?"),
        Action::TriggerSchedule { queue, schedule } => format!(
            "Trigger {schedule} now? One more message with its payload is offered to {queue}, due at once; its next run stays as it is."
        ),
        Action::ForceUnlock { lock } => format!(
            "Force-unlock {lock}, held by {} with fencing token {}? Its holder is not asked: its hold is lost, and another process may take the lock at once.",
            shown.holder.as_deref().unwrap_or("?"),
            shown.fencing_token.as_deref().unwrap_or("?"),
        ),
    }
}

/// The fields the page's form sends besides the steps: a force-unlock's
/// holder and fencing token.
fn shown_fields(shown: &Shown) -> Vec<(&'static str, String)> {
    [
        ("holder", shown.holder.as_ref()),
        ("fencing_token", shown.fencing_token.as_ref()),
    ]
    .into_iter()
    .filter_map(|(n, v)| v.map(|v| (n, v.clone())))
    .collect()
}

/// `shown`'s fields as the hidden inputs of a form.
fn hidden_fields(out: &mut String, shown: &Shown) {
    for (name, value) in shown_fields(shown) {
        let _ = write!(
            out,
            r#"<input type="hidden" name="{name}" value="{}">"#,
            escape(&value)
        );
    }
}

/// The URL an action's form posts to (a requeue's count in its query).
pub(crate) fn form_action(action: &Action, count: Option<usize>) -> String {
    match count {
        Some(n) => format!("{}?count={n}", action_path(action)),
        None => action_path(action),
    }
}

/// The form of an action's button on a page; `None` in read-only mode.
/// One that asks first has two steps: its button posts `step=ask` (the
/// server answers a confirmation page and does nothing: a browser without
/// script, or before the script runs), and the page's script instead
/// opens the question beside it, whose "Yes" (a plain button the script
/// handles) sends `confirm=yes`.
pub(crate) fn action_button(
    config: &Config,
    action: &Action,
    count: Option<usize>,
    shown: &Shown,
) -> Option<String> {
    if config.read_only {
        return None;
    }
    let label = label(action, count);
    let mut out = format!(
        r#"<form class="act" method="post" action="{}" data-action>"#,
        escape(&form_action(action, count))
    );
    hidden_fields(&mut out, shown);
    if asks_first(action, count) {
        let _ = write!(
            out,
            r#"<input type="hidden" name="step" value="ask"><button type="submit" data-step="ask">{label}</button><span class="confirm" hidden><span class="question">{question}</span> <button type="button" class="danger" data-step="yes">Yes, {lower}</button> <button type="button" data-step="cancel">Cancel</button></span>"#,
            label = escape(label),
            question = escape(&question(action, count, shown)),
            lower = escape(&label.to_lowercase()),
        );
    } else {
        let _ = write!(out, r#"<button type="submit">{}</button>"#, escape(label));
    }
    out.push_str("</form>");
    Some(out)
}

/// An action that passed the checks of who may act.
pub(crate) fn act(app: &Ctx<'_>, action: Action, query: &str, body: &[u8], html: bool) -> Reply {
    let f = fields(query, body);
    let count = match actions::requeue_count(f.count.as_deref()) {
        Ok(c) => c,
        Err(why) => {
            let doc = model::error("invalid input", &why);
            return answer(app, &action, 400, &doc, html);
        }
    };
    if f.ask || (must_confirm(&action, count) && !f.confirm) {
        let status = if f.ask { 200 } else { 400 };
        let q = question(&action, count, &f.shown);
        if html {
            return confirmation_page(app, &action, count, &f.shown, &q, status);
        }
        let doc = if f.ask {
            json!({"ok": false, "confirm": q, "message": q})
        } else {
            let mut d = model::error(
                "confirmation needed",
                "this action needs confirm=yes (the page's second button sends it)",
            );
            d["confirm"] = json!(q);
            d
        };
        return Reply::json(status, &doc);
    }
    let (rw, shown) = (app.rw.clone(), f.shown);
    let todo = action.clone();
    let done = app
        .bounded
        .run(move || actions::perform(&rw, &todo, count, &shown));
    match done {
        Ok(outcome) => {
            if outcome.status == 200 {
                // The overview shows the change on its next load.
                app.refresher.refresh_now(app.bounded.limit());
            }
            answer(app, &action, outcome.status, &outcome.body, html)
        }
        Err(late) => {
            let doc = model::error(
                "unavailable",
                &format!(
                    "{}; the action goes on and may still take effect",
                    late.message(app.bounded.limit())
                ),
            );
            answer(app, &action, 503, &doc, html)
        }
    }
}

fn answer(app: &Ctx<'_>, action: &Action, status: u16, doc: &Value, html: bool) -> Reply {
    if html {
        outcome_page(app, action, status, doc)
    } else {
        Reply::json(status, doc)
    }
}

/// Where a page about `action` links back to.
fn back(action: &Action) -> (String, Nav) {
    match action {
        Action::ForceUnlock { .. } => ("/locks".to_owned(), Nav::Locks),
        Action::RequeueDead { queue }
        | Action::Remove { queue, .. }
        | Action::Pause { queue }
        | Action::Resume { queue }
        | Action::TriggerSchedule { queue, .. } => (queue_href(queue), Nav::Queues),
    }
}

/// The page that says what an action did (or why not), for a form.
pub(crate) fn outcome_page(app: &Ctx<'_>, action: &Action, status: u16, doc: &Value) -> Reply {
    let ok = doc["ok"] == json!(true);
    let text = doc["message"]
        .as_str()
        .or(doc["error"]["message"].as_str())
        .unwrap_or_default();
    let (href, nav) = back(action);
    let live = format!(
        r#"<h1>{title}</h1><p class="flash {class}" data-outcome>{text}</p><p><a href="{href}">Back</a></p>"#,
        title = if ok { "Done" } else { "Not done" },
        class = if ok { "ok" } else { "error" },
        text = escape(text),
        href = escape(&href),
    );
    let view = app.refresher.view();
    Reply::html(
        status,
        html::page_static(
            if ok { "done" } else { "not done" },
            nav,
            app.config,
            &view,
            &live,
        ),
    )
}

/// The second step for a browser without script: the question, a form
/// that sends the same action with `confirm=yes`, and a way back.
fn confirmation_page(
    app: &Ctx<'_>,
    action: &Action,
    count: Option<usize>,
    shown: &Shown,
    question: &str,
    status: u16,
) -> Reply {
    let (href, nav) = back(action);
    let mut live = format!(
        r#"<h1>Confirm</h1><p class="question" data-question>{}</p><form class="act confirm-step" method="post" action="{}" data-confirmed>"#,
        escape(question),
        escape(&form_action(action, count)),
    );
    hidden_fields(&mut live, shown);
    let _ = write!(
        live,
        r#"<input type="hidden" name="confirm" value="yes"><button type="submit" class="danger">Yes, {}</button> <a href="{}" data-cancel>Cancel</a></form>"#,
        escape(&label(action, count).to_lowercase()),
        escape(&href),
    );
    let view = app.refresher.view();
    Reply::html(
        status,
        html::page_static("confirm", nav, app.config, &view, &live),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_come_from_the_body_else_the_query() {
        let f = fields(
            "confirm=no&count=3&holder=q",
            b"confirm=yes&holder=a%3A1&fencing_token=7",
        );
        assert!(f.confirm && !f.ask);
        assert_eq!(f.count.as_deref(), Some("3"));
        assert_eq!(
            f.shown,
            Shown {
                holder: Some("a:1".to_owned()),
                fencing_token: Some("7".to_owned())
            }
        );
        let f = fields("", b"step=ask&confirm=YES");
        assert!(f.ask && !f.confirm);
    }

    #[test]
    fn destructive_actions_must_be_confirmed_and_pause_and_trigger_ask() {
        let q = || "q".to_owned();
        let requeue = Action::RequeueDead { queue: q() };
        assert!(must_confirm(&requeue, None) && !must_confirm(&requeue, Some(1)));
        assert!(must_confirm(
            &Action::Remove {
                queue: q(),
                id: q()
            },
            None
        ));
        assert!(must_confirm(&Action::ForceUnlock { lock: q() }, None));
        let pause = Action::Pause { queue: q() };
        assert!(!must_confirm(&pause, None) && asks_first(&pause, None));
        assert!(asks_first(
            &Action::TriggerSchedule {
                queue: q(),
                schedule: q()
            },
            None
        ));
        assert!(!asks_first(&Action::Resume { queue: q() }, None));
        assert!(!asks_first(&requeue, Some(1)));
        assert_eq!(
            form_action(&requeue, Some(1)),
            "/api/queues/q/requeue-dead?count=1"
        );
    }

    #[test]
    fn a_button_that_asks_first_posts_only_the_question_and_read_only_has_none() {
        let mut config = Config::default();
        let shown = Shown {
            holder: Some("<h>".to_owned()),
            fencing_token: Some("7".to_owned()),
        };
        let unlock = Action::ForceUnlock {
            lock: "a<b".to_owned(),
        };
        let b = action_button(&config, &unlock, None, &shown).unwrap();
        assert!(
            b.contains(r#"action="/api/locks/a%3Cb/force-unlock""#),
            "{b}"
        );
        assert!(b.contains(r#"name="step" value="ask""#), "{b}");
        assert!(
            b.contains(r#"<button type="submit" data-step="ask">"#),
            "{b}"
        );
        // The confirming button cannot submit the form by itself.
        assert!(
            b.contains(r#"<button type="button" class="danger" data-step="yes">"#),
            "{b}"
        );
        assert!(!b.contains("confirm=yes") && !b.contains(r#"name="confirm""#));
        assert!(b.contains(r#"name="holder" value="&lt;h&gt;""#) && !b.contains("<h>"));
        assert!(b.contains(r#"name="fencing_token" value="7""#));
        let resume = Action::Resume {
            queue: "q".to_owned(),
        };
        let none = Shown {
            holder: None,
            fencing_token: None,
        };
        let b = action_button(&config, &resume, None, &none).unwrap();
        assert!(
            !b.contains("step") && b.contains(r#"<button type="submit">Resume</button>"#),
            "{b}"
        );
        config.read_only = true;
        assert_eq!(action_button(&config, &resume, None, &none), None);
    }
}
