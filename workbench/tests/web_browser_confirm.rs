//! The dashboard's confirmations in a real browser (headless Chromium,
//! Debian's package): with the page's script disabled, and in a browser
//! without `SubmitEvent.submitter`, one click on a destructive action's
//! button only asks; and a message due past JavaScript's date range does
//! not stop the page's refresh.

mod support;

use std::time::Duration;

use redwheel::Redwheel;
use redwheel::web::{Dashboard, Server};
use serde_json::Value;
use support::RedisServer;
use support::browser::{Browser, Page};
use support::dashboard::queue_with_dead;

const HOUR: Duration = Duration::from_secs(3_600);

fn dashboard(redis: &RedisServer) -> (Redwheel, Server) {
    let rw = Redwheel::connect(&redis.url()).unwrap();
    let server = Dashboard::new(&rw)
        .refresh_interval(Duration::from_millis(200))
        .rescan_interval(Duration::from_secs(1))
        .serve("127.0.0.1:0")
        .unwrap();
    (rw, server)
}

/// Waits for the confirmation page the server answers a first step with,
/// and returns its question.
fn wait_confirmation_page(page: &Page) -> String {
    page.wait_for(
        "the confirmation page",
        "document.querySelector('form[data-confirmed] button[type=submit]') !== null",
    );
    page.text("[data-question]")
}

/// Clicks the confirmation page's "Yes" and waits for the page that says
/// what was done.
fn confirm(page: &Page, done: &str) {
    page.click("form[data-confirmed] button[type=submit]");
    page.wait_for(
        "the action's result page",
        &format!(
            "(document.querySelector('[data-outcome]') || {{textContent: ''}}).textContent.includes({})",
            Value::from(done)
        ),
    );
}

#[test]
fn without_script_a_destructive_action_needs_a_second_confirming_step() {
    let redis = RedisServer::start();
    let rw = Redwheel::connect(&redis.url()).unwrap();
    let q = queue_with_dead(&rw, "notifications", &["push-1", "push-2"]);
    let later = q.offer(&"digest".to_owned(), HOUR).unwrap();
    let lock = rw.lock("inventory:42");
    let guard = lock.lock().unwrap();
    let (_web_rw, web) = dashboard(&redis);
    let browser = Browser::launch();
    let queue_url = format!("{}queues/notifications", web.url());

    // Force-unlock: the first click asks, on a page of its own.
    let page = browser.open_without_script(&format!("{}locks", web.url()));
    assert_eq!(
        page.eval("document.body.hasAttribute('data-generation')"),
        Value::from(false),
        "the page's script does not run"
    );
    page.click("tr[data-lock='inventory:42'] button[data-step=ask]");
    let question = wait_confirmation_page(&page);
    assert!(question.contains("inventory:42"), "{question}");
    assert!(
        question.contains(&guard.fencing_token().to_string()),
        "the token shown: {question}"
    );
    assert!(
        lock.is_locked().unwrap() && !guard.is_lost(),
        "one click released the lock"
    );
    confirm(&page, "force-unlocked inventory:42");
    assert!(!lock.is_locked().unwrap());

    // Remove a message.
    page.go(&queue_url);
    let row = format!("#delayed tr[data-id='{}']", later.as_str());
    page.click(&format!("{row} button[data-step=ask]"));
    let question = wait_confirmation_page(&page);
    assert!(question.contains(later.as_str()), "{question}");
    assert_eq!(
        q.stats().unwrap().delayed,
        1,
        "one click removed the message"
    );
    confirm(&page, "removed");
    assert_eq!(q.stats().unwrap().delayed, 0);

    // Requeue all dead letters.
    page.go(&queue_url);
    page.click("#dead form:not([action*='count']) button[data-step=ask]");
    wait_confirmation_page(&page);
    assert_eq!(q.stats().unwrap().dead, 2, "one click requeued them");
    confirm(&page, "requeued 2 dead letters");
    assert_eq!(q.stats().unwrap().dead, 0);

    // Pause asks too (the server would take it unasked from a tool).
    page.go(&queue_url);
    page.click("#controls button[data-step=ask]");
    wait_confirmation_page(&page);
    assert!(!q.is_paused().unwrap(), "one click paused the queue");
    // "Cancel" goes back and changes nothing.
    page.click("[data-cancel]");
    page.wait_for(
        "the queue page again",
        "document.querySelector('#controls') !== null",
    );
    assert!(!q.is_paused().unwrap());
    drop(guard);
}

#[test]
fn without_submit_event_submitter_the_first_click_only_asks() {
    let redis = RedisServer::start();
    let rw = Redwheel::connect(&redis.url()).unwrap();
    let lock = rw.lock("inventory:42");
    let guard = lock.lock().unwrap();
    let (_web_rw, web) = dashboard(&redis);
    let browser = Browser::launch();
    // A browser that does not know SubmitEvent.submitter.
    let page = browser.open_after(
        "Object.defineProperty(SubmitEvent.prototype, 'submitter', { get() { return undefined; } });",
        &format!("{}locks", web.url()),
    );
    assert_eq!(
        page.eval(
            "(() => { const e = new SubmitEvent('submit'); return e.submitter === undefined; })()"
        ),
        Value::from(true)
    );
    let row = "tr[data-lock='inventory:42']";
    page.click(&format!("{row} button[data-step=ask]"));
    page.wait_for(
        "the confirmation",
        &format!("!document.querySelector(\"{row} .confirm\").hidden"),
    );
    assert!(
        lock.is_locked().unwrap() && !guard.is_lost(),
        "one click released the lock"
    );
    page.click(&format!("{row} button[data-step=yes]"));
    page.wait_for(
        "the release",
        "document.getElementById('flash').textContent.includes('force-unlocked inventory:42')",
    );
    assert!(!lock.is_locked().unwrap());
    drop(guard);
}

#[test]
fn a_message_due_past_javascripts_date_range_does_not_stop_the_refresh() {
    let redis = RedisServer::start();
    let rw = Redwheel::connect(&redis.url()).unwrap();
    let q = rw.queue::<String>("far").unwrap();
    // 8.8e15 ms from now: past the 8.64e15 ms a JavaScript Date holds.
    let id = q
        .offer(&"later".to_owned(), Duration::from_secs(8_800_000_000_000))
        .unwrap();
    let (_web_rw, web) = dashboard(&redis);
    let browser = Browser::launch();
    let page = browser.open(&format!("{}queues/far", web.url()));
    page.wait_for(
        "the far message",
        &format!(
            "document.querySelector(\"#delayed tr[data-id='{}']\") !== null",
            id.as_str()
        ),
    );
    page.wait_refreshed();
    page.wait_refreshed();
    assert_eq!(
        page.eval("document.getElementById('unreachable').hidden"),
        Value::from(true)
    );
}
