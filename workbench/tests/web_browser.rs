//! The dashboard in a real browser: headless Chromium (Debian's package)
//! driven over the DevTools protocol, against a private redis-server.
//! The run saves the README's screenshots to docs/.

mod support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use redwheel::web::{Dashboard, Server};
use redwheel::{ConsumerOptions, Delivery, QueueOptions, Redwheel, RedwheelOptions};
use serde_json::Value;
use support::RedisServer;
use support::browser::{Browser, Page};
use support::dashboard::{http, queue_with_dead, wait_fresh_snapshot, wait_stats};

const HOUR: Duration = Duration::from_secs(3_600);

fn options() -> RedwheelOptions {
    RedwheelOptions::default()
        .connect_timeout(Duration::from_secs(1))
        .command_timeout(Duration::from_secs(2))
}

/// A dashboard on its own `Redwheel`, refreshing every 200 ms.
fn dashboard(
    redis: &RedisServer,
    configure: impl FnOnce(Dashboard) -> Dashboard,
) -> (Redwheel, Server) {
    let rw = Redwheel::connect_with(&redis.url(), options()).unwrap();
    let d = Dashboard::new(&rw)
        .refresh_interval(Duration::from_millis(200))
        .rescan_interval(Duration::from_secs(1))
        .overdue_alert(Duration::from_secs(1));
    let server = configure(d).serve("127.0.0.1:0").unwrap();
    (rw, server)
}

/// Waits until the page shows a snapshot at least `generation`.
fn wait_page_snapshot(page: &Page, generation: u64) {
    page.wait_for(
        "the page to show a fresh snapshot",
        &format!(
            "Number(document.getElementById('live').getAttribute('data-snapshot')) >= {generation}"
        ),
    );
}

/// The overview's rows as the page shows them.
const ROWS: &str = r#"[...document.querySelectorAll('tr[data-queue]')].map(tr => {
    const v = f => { const c = tr.querySelector('[data-field=' + f + ']'); return c ? Number(c.getAttribute('data-value')) : null; };
    return { name: tr.getAttribute('data-queue'), status: tr.querySelector('.badge').textContent,
             delayed: v('delayed'), ready: v('ready'), in_flight: v('in_flight'), dead: v('dead') };
})"#;

/// A queue page's count cards.
const CARDS: &str = r#"Object.fromEntries([...document.querySelectorAll('.card[data-field]')].map(c =>
    [c.getAttribute('data-field'), Number(c.querySelector('.value').getAttribute('data-value'))]))"#;

/// Where a screenshot goes: the README's pictures in `docs/` only when
/// `REDWHEEL_UPDATE_SCREENSHOTS=1` is set (so an ordinary test run leaves
/// the tree as it was), else the test's own scratch directory.
fn docs(name: &str) -> PathBuf {
    if std::env::var_os("REDWHEEL_UPDATE_SCREENSHOTS").is_some_and(|v| v == "1") {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../docs")
            .join(name)
    } else {
        Path::new(env!("CARGO_TARGET_TMPDIR")).join(name)
    }
}

fn counts(s: &redwheel::QueueStats) -> Value {
    serde_json::json!({ "delayed": s.delayed, "ready": s.ready, "in_flight": s.in_flight, "dead": s.dead })
}

fn row_counts(row: &Value) -> Value {
    serde_json::json!({ "delayed": row["delayed"], "ready": row["ready"], "in_flight": row["in_flight"], "dead": row["dead"] })
}

#[test]
fn the_overview_shows_every_queue_as_stats_reports_it_worst_first() {
    let redis = RedisServer::start();
    let rw = Redwheel::connect(&redis.url()).unwrap();
    let (_web_rw, web) = dashboard(&redis, |d| d);

    // emails: delivered steadily (the chart), then 5 waiting for later.
    let emails = rw.queue::<String>("emails").unwrap();
    // webhooks: a message in every state.
    let webhooks = rw
        .queue_with::<String>(
            "webhooks",
            QueueOptions::default().max_deliveries(1).visibility(HOUR),
        )
        .unwrap();
    // invoices: a ready backlog nobody takes (overdue).
    let invoices = rw.queue::<String>("invoices").unwrap();

    for (round, n) in [3u32, 8, 5, 12, 9, 4, 14, 7, 10, 6, 11, 8]
        .into_iter()
        .enumerate()
    {
        for i in 0..n {
            emails
                .offer(
                    &format!("{{\"to\":\"user{round}-{i}@example.com\",\"template\":\"welcome\"}}"),
                    Duration::ZERO,
                )
                .unwrap();
            emails.take().unwrap();
        }
        for _ in 0..(n % 4) {
            webhooks
                .offer(&"{\"event\":\"ping\"}".to_owned(), Duration::ZERO)
                .unwrap();
            let d = webhooks
                .claim(Duration::from_secs(30))
                .unwrap()
                .expect("a claim");
            d.ack().unwrap();
        }
        wait_fresh_snapshot(web.local_addr());
    }
    for i in 0..5u64 {
        emails
            .offer(
                &format!("{{\"to\":\"later{i}@example.com\",\"template\":\"digest\"}}"),
                HOUR * (i as u32 + 1),
            )
            .unwrap();
    }
    for i in 0..40 {
        invoices
            .offer(
                &format!(
                    "{{\"invoice\":\"INV-{:05}\",\"amount_cents\":{}}}",
                    1000 + i,
                    1999 + i * 100
                ),
                Duration::ZERO,
            )
            .unwrap();
    }
    wait_stats(&invoices, |s| s.ready >= 40);
    let failing = webhooks
        .consume(
            ConsumerOptions::default().concurrency(1),
            |_: &Delivery<String>| Err("hooks.example.com answered 503"),
        )
        .unwrap();
    for i in 0..3 {
        webhooks
            .offer(
                &format!("{{\"event\":\"order.paid\",\"order\":\"A-{}\"}}", 7310 + i),
                Duration::ZERO,
            )
            .unwrap();
    }
    wait_stats(&webhooks, |s| s.dead >= 3);
    failing.shutdown(Duration::from_secs(10)).unwrap();
    for i in 0..2 {
        webhooks
            .offer(
                &format!(
                    "{{\"event\":\"order.shipped\",\"order\":\"A-{}\"}}",
                    7400 + i
                ),
                Duration::ZERO,
            )
            .unwrap();
    }
    wait_stats(&webhooks, |s| s.ready >= 2);
    let claimed: Vec<Delivery<String>> = (0..2)
        .map(|_| {
            webhooks
                .claim(Duration::from_secs(30))
                .unwrap()
                .expect("a claim")
        })
        .collect();
    let binary = rw.queue::<Vec<u8>>("webhooks").unwrap();
    binary
        .offer(
            &vec![
                0x89, b'P', b'N', b'G', 0x0d, 0x0a, 0x1a, 0x0a, 0, 0, 0, 0x0d,
            ],
            HOUR * 2,
        )
        .unwrap();
    webhooks
        .offer(&"{\"event\":\"subscription.renew\"}".to_owned(), HOUR)
        .unwrap();
    // invoices' backlog has waited past the alert threshold.
    wait_stats(&invoices, |s| {
        s.oldest_overdue >= Some(Duration::from_secs(1))
    });

    let browser = Browser::launch();
    let page = browser.open(&web.url());
    let fresh = wait_fresh_snapshot(web.local_addr());
    wait_page_snapshot(&page, fresh);
    let rows = page.eval(ROWS);
    let rows = rows.as_array().unwrap();
    let names: Vec<&str> = rows.iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        ["invoices", "webhooks", "emails"],
        "worst first: {rows:?}"
    );
    let statuses: Vec<&str> = rows.iter().map(|r| r["status"].as_str().unwrap()).collect();
    assert_eq!(statuses, ["overdue", "dead", "ok"]);
    for (row, q) in rows.iter().zip([&invoices, &webhooks, &emails]) {
        assert_eq!(row_counts(row), counts(&q.stats().unwrap()), "{}", q.name());
    }
    assert_eq!(
        row_counts(&rows[1]),
        serde_json::json!({"delayed": 2, "ready": 0, "in_flight": 2, "dead": 3})
    );
    // The JSON says the same.
    let api = http(web.local_addr(), "GET", "/api/queues", &[]).json();
    let api_names: Vec<&str> = api
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(api_names, names);
    page.screenshot(&docs("dashboard-overview.png"));

    page.click("tr[data-queue=webhooks] a");
    page.wait_for(
        "the queue page",
        "document.querySelector('section#dead') !== null",
    );
    assert_eq!(page.eval(CARDS), counts(&webhooks.stats().unwrap()));
    let dead_reasons =
        page.eval("[...document.querySelectorAll('#dead td.reason')].map(td => td.textContent)");
    assert_eq!(dead_reasons.as_array().unwrap().len(), 3);
    assert!(
        dead_reasons[0]
            .as_str()
            .unwrap()
            .ends_with("hooks.example.com answered 503")
    );
    let hex =
        page.eval("[...document.querySelectorAll('#delayed pre.hex')].map(p => p.textContent)");
    assert_eq!(
        hex,
        serde_json::json!(["89 50 4e 47 0d 0a 1a 0a 00 00 00 0d"])
    );
    page.screenshot(&docs("dashboard-queue.png"));
    drop(claimed);
}

#[test]
fn requeue_and_remove_by_clicking_change_the_counts() {
    let redis = RedisServer::start();
    let rw = Redwheel::connect(&redis.url()).unwrap();
    let q = queue_with_dead(&rw, "notifications", &["push-1", "push-2", "push-3"]);
    let later = q.offer(&"digest".to_owned(), HOUR).unwrap();
    let (_web_rw, web) = dashboard(&redis, |d| d);
    let browser = Browser::launch();
    let page = browser.open(&format!("{}queues/notifications", web.url()));
    assert_eq!(page.eval(CARDS)["dead"], 3);

    page.click("#dead form[action$='count=1'] button");
    page.wait_for(
        "the requeue's message",
        "document.getElementById('flash').textContent.includes('requeued 1 dead letter')",
    );
    page.wait_for("the dead count to drop", "document.querySelector('.card[data-field=dead] .value').getAttribute('data-value') === '2'");
    assert_eq!(q.stats().unwrap().dead, 2);

    // "Requeue all" asks first; nothing happens before "Yes".
    page.click("#dead form:not([action*='count']) button[data-step=ask]");
    page.wait_for(
        "the confirmation",
        "!document.querySelector('#dead .confirm').hidden",
    );
    assert_eq!(q.stats().unwrap().dead, 2);
    page.click("#dead .confirm button[data-step=yes]");
    page.wait_for("the dead letters to be gone", "document.querySelector('.card[data-field=dead] .value').getAttribute('data-value') === '0'");
    assert_eq!(q.stats().unwrap().dead, 0);

    let row = format!("#delayed tr[data-id='{}']", later.as_str());
    page.click(&format!("{row} button[data-step=ask]"));
    page.click(&format!("{row} button[data-step=yes]"));
    page.wait_for(
        "the removed message to go",
        &format!("document.querySelector(\"{row}\") === null"),
    );
    assert_eq!(q.stats().unwrap().delayed, 0);
    assert!(!q.remove(&later).unwrap(), "it was removed already");
}

#[test]
fn pause_by_clicking_marks_the_queue_paused_and_resume_clears_it() {
    let redis = RedisServer::start();
    let rw = Redwheel::connect(&redis.url()).unwrap();
    let q = rw.queue::<String>("emails").unwrap();
    q.offer(&"hello".to_owned(), HOUR).unwrap();
    let (_web_rw, web) = dashboard(&redis, |d| d);
    let browser = Browser::launch();
    let page = browser.open(&format!("{}queues/emails", web.url()));
    assert_eq!(
        page.eval("document.querySelector('[data-paused]') === null"),
        true
    );

    // "Pause" asks first; nothing happens before "Yes".
    page.click("#controls button[data-step=ask]");
    page.wait_for(
        "the confirmation",
        "!document.querySelector('#controls .confirm').hidden",
    );
    assert!(!q.is_paused().unwrap(), "asking changes nothing");
    page.click("#controls button[data-step=yes]");
    page.wait_for(
        "the pause's message",
        "document.getElementById('flash').textContent.includes('paused emails')",
    );
    page.wait_for(
        "the paused mark",
        "document.querySelector('h1 [data-paused]') !== null",
    );
    assert!(q.is_paused().unwrap());

    // The overview marks the row too.
    page.go(&web.url());
    page.wait_for(
        "the paused mark in the overview",
        "document.querySelector('tr[data-queue=emails] [data-paused]') !== null",
    );

    page.go(&format!("{}queues/emails", web.url()));
    page.click("#controls form[action$='/resume'] button");
    page.wait_for(
        "the paused mark to go",
        "document.querySelector('h1 [data-paused]') === null",
    );
    assert!(!q.is_paused().unwrap());
}

#[test]
fn payloads_names_and_reasons_show_as_text_and_run_no_script() {
    let redis = RedisServer::start();
    let rw = Redwheel::connect(&redis.url()).unwrap();
    let name = r#"<img src=x onerror="window.__pwned='name'">"#;
    let payload = "<script>window.__pwned='payload';document.title='pwned'</script>";
    let reason = r#"<img src=x onerror="window.__pwned='reason'">"#;
    let q = rw
        .queue_with::<String>(name, QueueOptions::default().max_deliveries(1))
        .unwrap();
    let failing = q
        .consume(
            ConsumerOptions::default().concurrency(1),
            move |_: &Delivery<String>| Err(reason),
        )
        .unwrap();
    q.offer(&payload.to_owned(), Duration::ZERO).unwrap();
    wait_stats(&q, |s| s.dead >= 1);
    failing.shutdown(Duration::from_secs(10)).unwrap();
    q.offer(&payload.to_owned(), HOUR).unwrap();

    let (_web_rw, web) = dashboard(&redis, |d| d);
    let browser = Browser::launch();
    let page = browser.open(&web.url());
    page.wait_for(
        "the queue's row",
        "document.querySelector('tr[data-queue]') !== null",
    );
    page.wait_refreshed();
    let names = page
        .eval("[...document.querySelectorAll('tr[data-queue] td.name')].map(td => td.textContent)");
    assert_eq!(names, serde_json::json!([name]));

    page.click("tr[data-queue] td.name a");
    page.wait_for(
        "the queue page",
        "document.querySelector('section#dead tr[data-id]') !== null",
    );
    page.wait_refreshed();
    let shown_reason = page.eval("document.querySelector('#dead td.reason').textContent");
    assert!(
        shown_reason.as_str().unwrap().ends_with(reason),
        "{shown_reason}"
    );
    let shown =
        page.eval("[...document.querySelectorAll('td.payload pre')].map(p => p.textContent)");
    assert!(
        shown.as_array().unwrap().iter().all(|p| p == payload),
        "{shown}"
    );
    assert!(!shown.as_array().unwrap().is_empty());
    assert_eq!(
        page.eval("document.querySelector('h1.queue-name').firstChild.textContent.trim()"),
        Value::from(name)
    );
    // Nothing ran: no global set, the title is the dashboard's, no element
    // came from the strings.
    assert_eq!(page.eval("typeof window.__pwned"), Value::from("undefined"));
    assert!(
        page.eval("document.title")
            .as_str()
            .unwrap()
            .starts_with("redwheel · ")
    );
    assert_ne!(page.eval("document.title"), Value::from("pwned"));
    assert_eq!(
        page.eval("document.querySelectorAll('img').length"),
        Value::from(0)
    );
    assert_eq!(page.eval("document.scripts.length"), Value::from(1));
}

#[test]
fn an_action_needs_the_token_and_the_page_asks_for_it() {
    let redis = RedisServer::start();
    let rw = Redwheel::connect(&redis.url()).unwrap();
    let q = queue_with_dead(&rw, "payments", &["pay-1", "pay-2"]);
    let (_web_rw, web) = dashboard(&redis, |d| d.token("s3cret-token"));
    let browser = Browser::launch();
    let page = browser.open(&format!("{}queues/payments", web.url()));

    // A POST without the token, or with a wrong one, is refused.
    let post = "(t) => fetch('/api/queues/payments/requeue-dead?count=1', {method: 'POST', headers: t ? {Authorization: 'Bearer ' + t} : {}}).then(r => r.status)";
    assert_eq!(page.eval(&format!("({post})(null)")), Value::from(401));
    assert_eq!(page.eval(&format!("({post})('wrong')")), Value::from(401));
    assert_eq!(q.stats().unwrap().dead, 2);

    // A click asks for the token first, then acts with it.
    page.click("#dead form[action$='count=1'] button");
    page.wait_for(
        "the token bar",
        "!document.getElementById('token-form').hidden",
    );
    assert_eq!(q.stats().unwrap().dead, 2);
    page.eval("document.querySelector('#token-form input').value = 's3cret-token'");
    page.click("#token-form button");
    page.wait_for(
        "the requeue's message",
        "document.getElementById('flash').textContent.includes('requeued 1 dead letter')",
    );
    assert_eq!(q.stats().unwrap().dead, 1);
}

#[test]
fn a_read_only_dashboard_shows_no_action_and_refuses_posts() {
    let redis = RedisServer::start();
    let rw = Redwheel::connect(&redis.url()).unwrap();
    let q = queue_with_dead(&rw, "payments", &["pay-1"]);
    let (_web_rw, web) = dashboard(&redis, |d| d.read_only(true));
    let browser = Browser::launch();
    let page = browser.open(&format!("{}queues/payments", web.url()));
    page.wait_for(
        "the dead letter",
        "document.querySelector('#dead tr[data-id]') !== null",
    );
    assert_eq!(page.eval("document.querySelectorAll('form[data-action], button').length - document.querySelectorAll('#token-form button').length"), Value::from(0));
    assert_eq!(page.text("header .mode"), "READ-ONLY");
    let status = page
        .eval("fetch('/api/queues/payments/requeue-dead', {method: 'POST'}).then(r => r.status)");
    assert_eq!(status, Value::from(403));
    assert_eq!(q.stats().unwrap().dead, 1);
}

#[test]
fn a_get_on_an_action_route_changes_nothing() {
    let redis = RedisServer::start();
    let rw = Redwheel::connect(&redis.url()).unwrap();
    let q = queue_with_dead(&rw, "payments", &["pay-1"]);
    let id = q.offer(&"later".to_owned(), HOUR).unwrap();
    let lock = rw.lock("inventory:42");
    let guard = lock.lock().unwrap();
    let (_web_rw, web) = dashboard(&redis, |d| d);
    let browser = Browser::launch();
    let page = browser.open(&web.url());
    for path in [
        "/api/queues/payments/requeue-dead".to_owned(),
        format!("/api/queues/payments/messages/{}/remove", id.as_str()),
        "/api/locks/inventory%3A42/force-unlock".to_owned(),
    ] {
        page.go(&format!("http://{}{path}", web.local_addr()));
        let status = page.eval(&format!("fetch('{path}').then(r => r.status)"));
        assert_eq!(status, Value::from(405), "{path}");
        let reply = http(web.local_addr(), "GET", &path, &[]);
        assert_eq!(
            (reply.status, reply.header("Allow")),
            (405, Some("POST")),
            "{path}"
        );
    }
    let s = q.stats().unwrap();
    assert_eq!((s.dead, s.delayed), (1, 1));
    assert!(lock.is_locked().unwrap());
    assert!(!guard.is_lost());
}

#[test]
fn force_unlock_asks_for_confirmation_then_releases_the_lock() {
    let redis = RedisServer::start();
    let rw = Redwheel::connect(&redis.url()).unwrap();
    let lock = rw.lock("inventory:42");
    let guard = lock.lock().unwrap();
    let (_web_rw, web) = dashboard(&redis, |d| d);
    let browser = Browser::launch();
    let page = browser.open(&format!("{}locks", web.url()));
    let row = "tr[data-lock='inventory:42']";
    assert_eq!(
        page.text(&format!("{row} [data-field=token]")),
        guard.fencing_token().to_string()
    );
    page.click(&format!("{row} button[data-step=ask]"));
    page.wait_for(
        "the confirmation",
        &format!("!document.querySelector(\"{row} .confirm\").hidden"),
    );
    assert!(lock.is_locked().unwrap(), "asking changes nothing");
    page.click(&format!("{row} button[data-step=yes]"));
    page.wait_for(
        "the release",
        "document.getElementById('flash').textContent.includes('force-unlocked inventory:42')",
    );
    assert!(!lock.is_locked().unwrap());
    page.wait_for(
        "the lock to leave the page",
        &format!("document.querySelector(\"{row}\") === null"),
    );
    drop(guard);
}

#[test]
fn the_page_says_redis_is_down_and_recovers_when_it_is_back() {
    let mut redis = RedisServer::with_appendonly();
    let rw = Redwheel::connect_with(&redis.url(), options()).unwrap();
    let q = rw.queue::<String>("orders").unwrap();
    for i in 0..4 {
        q.offer(&format!("order-{i}"), HOUR).unwrap();
    }
    let (_web_rw, web) = dashboard(&redis, |d| d);
    let browser = Browser::launch();
    let page = browser.open(&web.url());
    page.wait_for(
        "the queue's row",
        "document.querySelector('tr[data-queue=orders] [data-field=delayed]') !== null",
    );
    assert_eq!(page.eval(ROWS)[0]["delayed"], 4);

    redis.kill();
    page.wait_for(
        "the page to say Redis is down",
        "document.querySelector('[data-redis=down]') !== null",
    );
    assert!(page.text("[data-redis=down]").starts_with("Redis is down"));
    // The last data stays on the page, and the other pages answer too.
    assert_eq!(page.eval(ROWS)[0]["delayed"], 4);
    let queue_page = http(web.local_addr(), "GET", "/queues/orders", &[]);
    assert_eq!(queue_page.status, 503, "{}", queue_page.body);
    assert_eq!(
        http(web.local_addr(), "GET", "/api/status", &[]).json()["redis"],
        "down"
    );

    redis.restart();
    page.wait_for("the banner to go", "document.querySelector('[data-redis]') === null && document.querySelector('tr[data-queue=orders]') !== null");
    let fresh = wait_fresh_snapshot(web.local_addr());
    wait_page_snapshot(&page, fresh);
    assert_eq!(row_counts(&page.eval(ROWS)[0]), counts(&q.stats().unwrap()));
    assert_eq!(
        http(web.local_addr(), "GET", "/queues/orders", &[]).status,
        200
    );
}
