//! The dashboard over plain HTTP: the JSON documents, who may act (token,
//! read-only, same origin, loopback host names), escaping, a Redis that
//! stops answering, stopping, and what one refresh costs Redis.

mod support;

use std::net::{TcpListener, TcpStream};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redwheel::schedule::Schedule;
use redwheel::web::{Dashboard, Server};
use redwheel::{ErrorKind, QueueOptions, Redwheel, RedwheelOptions};
use serde_json::{Value, json};
use support::RedisServer;
use support::cluster::RedisCluster;
use support::dashboard::{
    dashboard_status, http, queue_with_dead, wait_fresh_snapshot, wait_stats,
};

const HOUR: Duration = Duration::from_secs(3_600);

fn ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

fn options() -> RedwheelOptions {
    RedwheelOptions::default()
        .connect_timeout(Duration::from_secs(1))
        .command_timeout(Duration::from_secs(2))
}

fn serve(rw: &Redwheel, configure: impl FnOnce(Dashboard) -> Dashboard) -> Server {
    configure(
        Dashboard::new(rw)
            .refresh_interval(Duration::from_millis(100))
            .rescan_interval(Duration::from_secs(1)),
    )
    .serve("127.0.0.1:0")
    .unwrap()
}

fn get(web: &Server, path: &str) -> support::dashboard::HttpReply {
    http(web.local_addr(), "GET", path, &[])
}

fn status(web: &Server) -> Value {
    dashboard_status(web.local_addr())
}

/// Waits until a refresh that started after this call has ended.
fn wait_fresh(web: &Server) {
    wait_fresh_snapshot(web.local_addr());
}

#[test]
fn the_documents_have_the_documented_shapes() {
    let redis = RedisServer::start();
    let rw = Redwheel::connect_with(&redis.url(), options()).unwrap();
    let q = queue_with_dead(&rw, "orders/eu", &["gone-1"]);
    let long = "x".repeat(1_000);
    let later = q.offer(&long, HOUR).unwrap();
    rw.queue::<Vec<u8>>("orders/eu")
        .unwrap()
        .offer(&vec![0xff, 0x00], Duration::ZERO)
        .unwrap();
    wait_stats(&q, |s| s.ready >= 1);
    let guard = rw.lock("inventory:42").lock().unwrap();
    let web = serve(&rw, |d| d);
    wait_fresh(&web);

    let list = get(&web, "/api/queues");
    assert_eq!(list.status, 200);
    assert_eq!(list.header("X-Redwheel-Redis"), Some("up"));
    assert!(list.header("X-Redwheel-Snapshot-Age-Ms").is_some());
    let list = list.json();
    let row = &list.as_array().unwrap()[0];
    let s = q.stats().unwrap();
    assert_eq!(
        (
            &row["name"],
            &row["delayed"],
            &row["ready"],
            &row["in_flight"],
            &row["dead"],
            &row["status"]
        ),
        (
            &json!("orders/eu"),
            &json!(s.delayed),
            &json!(s.ready),
            &json!(s.in_flight),
            &json!(s.dead),
            &json!("dead")
        )
    );
    for key in [
        "oldest_overdue_ms",
        "next_due_ms",
        "server_time_ms",
        "delivered",
        "delivered_per_sec",
        "rate_history",
        "error",
    ] {
        assert!(row.get(key).is_some(), "{key} missing from {row}");
    }

    let one = get(&web, "/api/queues/orders%2Feu").json();
    assert_eq!(one["stats"]["dead"], 1);
    let dead = &one["messages"]["dead"][0];
    assert_eq!(
        (&dead["payload_text"], &dead["attempts"]),
        (&json!("gone-1"), &json!(1))
    );
    assert!(
        dead["reason"].as_str().unwrap().ends_with("nacked"),
        "{dead}"
    );
    assert!(dead["died_ms"].is_u64());
    assert_eq!(one["messages"]["ready"][0]["payload_hex"], "ff 00");
    let delayed = &one["messages"]["delayed"][0];
    assert_eq!(
        (&delayed["payload_bytes"], &delayed["payload_truncated"]),
        (&json!(1_000), &json!(true))
    );
    assert!(delayed["payload_text"].as_str().unwrap().len() < 1_000);
    let full = get(
        &web,
        &format!("/api/queues/orders%2Feu?show={}", later.as_str()),
    )
    .json();
    assert_eq!(full["messages"]["delayed"][0]["payload_text"], json!(long));
    assert_eq!(full["messages"]["delayed"][0]["payload_truncated"], false);
    assert_eq!(get(&web, "/api/queues/nothing-here").status, 404);
    assert_eq!(get(&web, "/queues/nothing-here").status, 404);

    let locks = get(&web, "/api/locks").json();
    assert_eq!(locks[0]["name"], "inventory:42");
    assert_eq!(locks[0]["token"], json!(guard.fencing_token()));
    assert!(locks[0]["ttl_ms"].as_u64().unwrap() > 0);

    let st = status(&web);
    assert_eq!(
        (&st["redis"], &st["queues"], &st["read_only"]),
        (&json!("up"), &json!(1), &json!(false))
    );
    assert!(st["last_refresh"]["round_trips"].as_u64().unwrap() >= 1);
}

#[test]
fn actions_need_the_token_and_the_same_origin() {
    let redis = RedisServer::start();
    let rw = Redwheel::connect_with(&redis.url(), options()).unwrap();
    let q = queue_with_dead(&rw, "payments", &["p-1", "p-2", "p-3"]);
    let web = serve(&rw, |d| d.token("t0ken"));
    let addr = web.local_addr();
    let path = "/api/queues/payments/requeue-dead?count=1";
    let auth = ("Authorization", "Bearer t0ken");
    let own = format!("http://{addr}");

    assert_eq!(http(addr, "POST", path, &[]).status, 401);
    assert_eq!(
        http(addr, "POST", path, &[("Authorization", "Bearer nope")]).status,
        401
    );
    for forged in [
        vec![auth, ("Origin", "http://evil.example")],
        vec![auth, ("Origin", "null")],
        vec![auth, ("Referer", "http://evil.example/page")],
        vec![auth, ("Origin", "http://127.0.0.1:1")],
    ] {
        let r = http(addr, "POST", path, &forged);
        assert_eq!(r.status, 403, "{forged:?}: {}", r.body);
    }
    // A page on a host name rebound to 127.0.0.1 is refused, reads too.
    let rebound = format!("evil.example:{}", addr.port());
    assert_eq!(
        http(
            addr,
            "POST",
            path,
            &[
                auth,
                ("Host", &rebound),
                ("Origin", &format!("http://{rebound}"))
            ]
        )
        .status,
        421
    );
    assert_eq!(
        http(addr, "GET", "/api/queues", &[("Host", &rebound)]).status,
        421
    );
    assert_eq!(q.stats().unwrap().dead, 3, "nothing was requeued");

    let ok = http(addr, "POST", path, &[auth, ("Origin", &own)]);
    assert_eq!(ok.status, 200, "{}", ok.body);
    assert_eq!(ok.json()["requeued"], 1);
    let ok = http(
        addr,
        "POST",
        "/api/queues/payments/requeue-dead?confirm=yes",
        &[auth, ("Referer", &format!("{own}/queues/payments"))],
    );
    assert_eq!(ok.json()["requeued"], 2);
    assert_eq!(q.stats().unwrap().dead, 0);
    let bad = http(
        addr,
        "POST",
        "/api/queues/payments/requeue-dead?count=0",
        &[auth],
    );
    assert_eq!(bad.status, 400);
}

#[test]
fn read_only_refuses_every_action_even_with_the_token() {
    let redis = RedisServer::start();
    let rw = Redwheel::connect_with(&redis.url(), options()).unwrap();
    let q = queue_with_dead(&rw, "payments", &["p-1"]);
    let id = q.offer(&"later".to_owned(), HOUR).unwrap();
    let guard = rw.lock("inventory:42").lock().unwrap();
    let web = serve(&rw, |d| d.read_only(true).token("t0ken"));
    for path in [
        "/api/queues/payments/requeue-dead".to_owned(),
        format!("/api/queues/payments/messages/{}/remove", id.as_str()),
        "/api/locks/inventory%3A42/force-unlock".to_owned(),
    ] {
        let r = http(
            web.local_addr(),
            "POST",
            &path,
            &[("Authorization", "Bearer t0ken")],
        );
        assert_eq!(r.status, 403, "{path}: {}", r.body);
    }
    assert_eq!(q.stats().unwrap().dead, 1);
    assert_eq!(q.stats().unwrap().delayed, 1);
    assert!(!guard.is_lost() && rw.lock("inventory:42").is_locked().unwrap());
    assert_eq!(status(&web)["read_only"], true);
}

#[test]
fn remove_and_force_unlock_go_through_the_library() {
    let redis = RedisServer::start();
    let rw = Redwheel::connect_with(&redis.url(), options()).unwrap();
    let q = rw.queue::<String>("jobs").unwrap();
    let id = q.offer(&"later".to_owned(), HOUR).unwrap();
    q.offer(&"stays".to_owned(), HOUR).unwrap();
    let lock = rw.lock("inventory:42");
    let guard = lock.lock().unwrap();
    let web = serve(&rw, |d| d);
    let addr = web.local_addr();
    // A tool marks its actions (no Origin) and confirms the destructive
    // ones (tests/web_actions.rs has the rules).
    let mark = ("X-Redwheel-Action", "1");
    let remove = format!(
        "/api/queues/jobs/messages/{}/remove?confirm=yes",
        id.as_str()
    );
    let r = http(addr, "POST", &remove, &[mark]);
    assert_eq!((r.status, &r.json()["removed"]), (200, &json!(true)));
    let again = http(addr, "POST", &remove, &[mark]);
    assert_eq!(
        (again.status, &again.json()["removed"]),
        (404, &json!(false))
    );
    assert_eq!(
        http(
            addr,
            "POST",
            "/api/queues/never-seen/requeue-dead?confirm=yes",
            &[mark]
        )
        .status,
        404
    );
    assert_eq!(q.stats().unwrap().delayed, 1);

    let shown = &get(&web, "/api/locks").json()[0];
    let unlock = format!(
        "/api/locks/inventory%3A42/force-unlock?confirm=yes&holder={}&fencing_token={}",
        shown["holders"][0]["owner"].as_str().unwrap(),
        shown["token"]
    );
    let r = http(addr, "POST", &unlock, &[mark]);
    assert_eq!((r.status, &r.json()["released"]), (200, &json!(true)));
    assert!(!lock.is_locked().unwrap());
    assert!(guard.is_lost());
    assert_eq!(http(addr, "POST", &unlock, &[mark]).status, 404);
    drop(guard);
}

#[test]
fn pause_and_resume_need_the_token_and_go_through_the_library() {
    let redis = RedisServer::start();
    let rw = Redwheel::connect_with(&redis.url(), options()).unwrap();
    let q = rw.queue::<String>("emails").unwrap();
    q.offer(&"hello".to_owned(), HOUR).unwrap();
    let auth = ("Authorization", "Bearer t0ken");
    let read_only = serve(&rw, |d| d.read_only(true).token("t0ken"));
    let web = serve(&rw, |d| d.token("t0ken"));
    let addr = web.local_addr();

    for path in ["/api/queues/emails/pause", "/api/queues/emails/resume"] {
        assert_eq!(http(addr, "POST", path, &[]).status, 401, "{path}");
        let r = http(read_only.local_addr(), "POST", path, &[auth]);
        assert_eq!(r.status, 403, "{path}: {}", r.body);
        assert_eq!(http(addr, "GET", path, &[auth]).status, 405, "{path}");
    }
    assert!(!q.is_paused().unwrap(), "nothing was paused");

    let r = http(addr, "POST", "/api/queues/emails/pause", &[auth]);
    assert_eq!(
        (r.status, &r.json()["paused"]),
        (200, &json!(true)),
        "{}",
        r.body
    );
    assert!(q.is_paused().unwrap());
    // The overview's row and the queue's document show it.
    wait_fresh(&web);
    let rows = get(&web, "/api/queues").json();
    assert_eq!(rows[0]["name"], "emails");
    assert_eq!(rows[0]["paused"], true);
    let doc = get(&web, "/api/queues/emails").json();
    assert_eq!(
        (&doc["paused"], &doc["controls"]["paused"]),
        (&json!(true), &json!(true))
    );
    let page = get(&web, "/queues/emails");
    assert!(page.body.contains("data-paused"), "{}", page.body);
    assert!(page.body.contains("/api/queues/emails/resume"));

    let r = http(addr, "POST", "/api/queues/emails/resume", &[auth]);
    assert_eq!(
        (r.status, &r.json()["paused"]),
        (200, &json!(false)),
        "{}",
        r.body
    );
    assert!(!q.is_paused().unwrap());
    wait_fresh(&web);
    assert_eq!(get(&web, "/api/queues").json()[0]["paused"], false);
    assert_eq!(get(&web, "/api/queues/emails").json()["paused"], false);
    assert!(
        get(&web, "/queues/emails")
            .body
            .contains("/api/queues/emails/pause")
    );

    // An unknown queue is not created by a pause.
    let r = http(addr, "POST", "/api/queues/never-seen/pause", &[auth]);
    assert_eq!(r.status, 404, "{}", r.body);
    assert!(!rw.inspect_queue("never-seen").unwrap().exists().unwrap());
}

#[test]
fn the_queue_document_lists_its_controls_and_schedules() {
    let redis = RedisServer::start();
    let rw = Redwheel::connect_with(&redis.url(), options()).unwrap();
    let q = rw
        .queue_with::<String>(
            "reports",
            QueueOptions::default()
                .rate_limit(5, Duration::from_secs(2))
                .max_in_flight(7)
                .max_len(1_000),
        )
        .unwrap();
    let nightly = Schedule::cron("0 3 * * *")
        .unwrap()
        .time_zone("Europe/Berlin")
        .unwrap();
    q.schedule("nightly", &nightly, &"build".to_owned())
        .unwrap();
    q.schedule("<hourly>", &Schedule::every(HOUR), &"tick".to_owned())
        .unwrap();
    assert!(q.pause_schedule("<hourly>").unwrap());
    let web = serve(&rw, |d| d);

    let doc = get(&web, "/api/queues/reports").json();
    assert_eq!(
        doc["controls"],
        json!({
            "paused": false,
            "rate_limit": {"max": 5, "per_ms": 2_000},
            "max_in_flight": 7,
            "max_len": 1_000,
        })
    );
    let listed = q.schedules().unwrap();
    let expected: Vec<Value> = listed
        .iter()
        .map(|s| {
            json!({
                "name": s.name,
                "definition": s.definition,
                "next_ms": s.next.map(ms),
                "last_fired_ms": s.last_fired.map(ms),
                "paused": s.paused,
            })
        })
        .collect();
    assert_eq!(doc["schedules"], Value::Array(expected));
    assert_eq!(doc["schedules"][0]["name"], "<hourly>");
    assert_eq!(doc["schedules"][0]["paused"], true);
    assert_eq!(doc["schedules"][1]["definition"], nightly.definition());

    let page = get(&web, "/queues/reports").body;
    assert!(page.contains("&lt;hourly&gt;") && !page.contains("<hourly>"));
    assert!(page.contains(&nightly.definition()));
    assert!(page.contains("/api/queues/reports/schedules/nightly/trigger"));
    assert!(page.contains("/api/queues/reports/schedules/%3Chourly%3E/trigger"));
}

#[test]
fn trigger_offers_the_schedules_payload_now() {
    let redis = RedisServer::start();
    let rw = Redwheel::connect_with(&redis.url(), options()).unwrap();
    let q = rw.queue::<String>("reports").unwrap();
    q.schedule(
        "nightly",
        &Schedule::cron("0 3 * * *").unwrap(),
        &"build".to_owned(),
    )
    .unwrap();
    let auth = ("Authorization", "Bearer t0ken");
    let read_only = serve(&rw, |d| d.read_only(true));
    let web = serve(&rw, |d| d.token("t0ken"));
    let addr = web.local_addr();
    let path = "/api/queues/reports/schedules/nightly/trigger";

    assert_eq!(http(addr, "POST", path, &[]).status, 401);
    assert_eq!(http(read_only.local_addr(), "POST", path, &[]).status, 403);
    assert_eq!(q.len().unwrap(), 0, "nothing was offered");

    let r = http(addr, "POST", path, &[auth]);
    assert_eq!(r.status, 200, "{}", r.body);
    let id = r.json()["id"].as_str().unwrap().to_owned();
    let m = q
        .poll(Duration::from_secs(60))
        .unwrap()
        .expect("offered, due now");
    assert_eq!(
        (m.id().as_str(), m.payload().as_str()),
        (id.as_str(), "build")
    );

    let none = http(
        addr,
        "POST",
        "/api/queues/reports/schedules/nope/trigger",
        &[auth],
    );
    assert_eq!(none.status, 404, "{}", none.body);
    let bad = http(
        addr,
        "POST",
        "/api/queues/reports/schedules/a%7Bb/trigger",
        &[auth],
    );
    assert_eq!(bad.status, 400, "{}", bad.body);
    assert_eq!(q.len().unwrap(), 0);
}

#[test]
fn pages_escape_what_redis_holds_and_fetch_nothing_from_elsewhere() {
    let redis = RedisServer::start();
    let rw = Redwheel::connect_with(&redis.url(), options()).unwrap();
    let name = "<b>q</b>";
    let q = rw.queue::<String>(name).unwrap();
    q.offer(&"<script>alert(1)</script>".to_owned(), HOUR)
        .unwrap();
    let web = serve(&rw, |d| d);
    wait_fresh(&web);
    let overview = get(&web, "/");
    let queue = get(&web, "/queues/%3Cb%3Eq%3C%2Fb%3E");
    assert_eq!((overview.status, queue.status), (200, 200));
    assert!(overview.body.contains("&lt;b&gt;q&lt;/b&gt;") && !overview.body.contains("<b>q</b>"));
    assert!(queue.body.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
    assert!(!queue.body.contains("<script>alert"));
    let csp = overview.header("Content-Security-Policy").unwrap();
    assert!(
        csp.contains("script-src 'self'") && csp.contains("default-src 'none'"),
        "{csp}"
    );
    for doc in [
        &overview,
        &queue,
        &get(&web, "/assets/dashboard.css"),
        &get(&web, "/assets/dashboard.js"),
    ] {
        assert_eq!(doc.status, 200);
        assert!(
            !doc.body.contains("http://")
                && !doc.body.contains("https://")
                && !doc.body.contains("//cdn"),
            "an outside URL in:\n{}",
            doc.body
        );
    }
}

#[test]
fn a_redis_that_stops_answering_does_not_block_the_pages() {
    let redis = RedisServer::start();
    let rw = Redwheel::connect_with(&redis.url(), options()).unwrap();
    rw.queue::<String>("orders")
        .unwrap()
        .offer(&"o".to_owned(), HOUR)
        .unwrap();
    // The dashboard's own commands may wait a minute; its pages may not.
    let web_rw = Redwheel::connect_with(
        &redis.url(),
        RedwheelOptions::default().command_timeout(Duration::from_secs(60)),
    )
    .unwrap();
    let web = serve(&web_rw, |d| d.page_timeout(Duration::from_millis(300)));
    wait_fresh(&web);

    redis.signal("STOP");
    let page = get(&web, "/queues/orders");
    let locks = get(&web, "/api/locks");
    let overview = get(&web, "/api/queues");
    let web2 = web.clone();
    support::within(Duration::from_secs(60), move || {
        while status(&web2)["redis"] != "slow" {
            std::thread::sleep(Duration::from_millis(10));
        }
    });
    let slow = get(&web, "/");
    redis.signal("CONT");

    assert_eq!(page.status, 503);
    assert!(
        page.body.contains("Redis did not answer within 300 ms"),
        "{}",
        page.body
    );
    assert_eq!(locks.status, 503);
    assert_eq!(
        overview.status, 200,
        "the overview is served from the last snapshot"
    );
    assert_eq!(overview.json()[0]["delayed"], 1);
    assert!(
        slow.body.contains(r#"data-redis="slow""#) && slow.body.contains("Redis is not answering")
    );

    let web2 = web.clone();
    support::within(Duration::from_secs(120), move || {
        while status(&web2)["redis"] != "up" {
            std::thread::sleep(Duration::from_millis(10));
        }
    });
    assert_eq!(get(&web, "/queues/orders").status, 200);
}

#[test]
fn serve_on_a_bound_listener_then_stop_closes_it() {
    let redis = RedisServer::start();
    let rw = Redwheel::connect_with(&redis.url(), options()).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let web = Dashboard::new(&rw).serve_on(listener).unwrap();
    assert_eq!(web.local_addr(), addr);
    assert_eq!(get(&web, "/api/status").status, 200);
    let waiter = {
        let web = web.clone();
        std::thread::spawn(move || web.wait())
    };
    web.stop();
    waiter.join().unwrap();
    assert!(web.is_stopped());
    // The listening socket is closed by the time `stop` returns.
    assert!(TcpStream::connect(addr).is_err(), "still listening");
    web.stop();
}

#[test]
fn bad_options_and_a_busy_address_are_errors() {
    let redis = RedisServer::start();
    let rw = Redwheel::connect_with(&redis.url(), options()).unwrap();
    let kind = |d: Dashboard| d.serve("127.0.0.1:0").unwrap_err().kind();
    assert_eq!(
        kind(Dashboard::new(&rw).token("a b")),
        ErrorKind::InvalidOption
    );
    assert_eq!(
        kind(Dashboard::new(&rw).token("")),
        ErrorKind::InvalidOption
    );
    assert_eq!(
        kind(Dashboard::new(&rw).refresh_interval(Duration::ZERO)),
        ErrorKind::InvalidOption
    );
    assert_eq!(
        kind(Dashboard::new(&rw).page_timeout(Duration::from_secs(600))),
        ErrorKind::InvalidOption
    );
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let err = Dashboard::new(&rw)
        .serve(taken.local_addr().unwrap())
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidOption, "{err}");
}

/// Counts of the dashboard's commands (nothing else talks to the server
/// while they are read): every refresh is one pipeline of three commands
/// per queue (stats, delivery counter, paused flag) per master.
#[test]
fn one_refresh_of_100_queues_is_one_pipelined_round_trip() {
    let redis = RedisServer::start();
    {
        let rw = Redwheel::connect(&redis.url()).unwrap();
        for i in 0..100 {
            rw.queue::<String>(&format!("q{i:03}"))
                .unwrap()
                .offer(&"m".to_owned(), HOUR)
                .unwrap();
        }
        rw.shutdown(Duration::from_secs(5)).unwrap();
    }
    let rw = Redwheel::connect_with(&redis.url(), options()).unwrap();
    let web = serve(&rw, |d| d.rescan_interval(Duration::from_secs(3_600)));
    wait_fresh(&web);
    let last = &status(&web)["last_refresh"];
    assert_eq!(
        (&last["round_trips"], &last["commands"]),
        (&json!(1), &json!(300))
    );
    assert_eq!(
        get(&web, "/api/queues").json().as_array().unwrap().len(),
        100
    );
    // Redis's own count agrees: about 100 EVALSHA and 300 HGET per
    // refresh (the delivery counter, the paused flag, and stats.lua's own
    // read of the expired counter), a round may be half done when the
    // counts are read.
    let (evalsha, hget) = (redis.calls("evalsha"), redis.calls("hget"));
    let before = status(&web)["snapshot"].as_u64().unwrap();
    for _ in 0..4 {
        wait_fresh(&web);
    }
    let (evalsha2, hget2) = (redis.calls("evalsha"), redis.calls("hget"));
    let rounds = status(&web)["snapshot"].as_u64().unwrap() - before;
    for (what, delta, per_queue) in [
        ("evalsha", evalsha2 - evalsha, 1.0),
        ("hget", hget2 - hget, 3.0),
    ] {
        let per = delta as f64 / rounds as f64 / per_queue;
        assert!(
            (80.0..=120.0).contains(&per),
            "{what}: {delta} in {rounds} rounds"
        );
    }
}

#[test]
fn a_cluster_is_read_in_one_round_trip_per_master() {
    let cluster = RedisCluster::start();
    let urls = cluster.urls();
    let seeds: Vec<&str> = urls.iter().map(String::as_str).collect();
    let rw = Redwheel::connect_cluster_with(&seeds, options()).unwrap();
    let mut queues = Vec::new();
    for i in 0..30 {
        let q = rw.queue::<String>(&format!("c{i}")).unwrap();
        for _ in 0..(i % 4) {
            q.offer(&"m".to_owned(), HOUR).unwrap();
        }
        if i % 4 == 0 {
            q.offer(&"n".to_owned(), HOUR).unwrap();
        }
        queues.push(q);
    }
    let masters = cluster.master_ports().len();
    let web = serve(&rw, |d| d.rescan_interval(Duration::from_secs(3_600)));
    wait_fresh(&web);
    let last = &status(&web)["last_refresh"];
    assert_eq!(last["round_trips"], json!(masters), "{last}");
    let list = get(&web, "/api/queues").json();
    assert_eq!(list.as_array().unwrap().len(), 30);
    for q in &queues {
        let row = list
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == q.name())
            .unwrap();
        assert_eq!(
            row["delayed"],
            json!(q.stats().unwrap().delayed),
            "{}",
            q.name()
        );
    }
}
