//! The dashboard's actions over plain HTTP, in process: the confirmation
//! a destructive action needs, a force-unlock that releases only the
//! acquisition the page showed, the bound on `?count=`, and `stop()` with
//! clients still connected.

mod support;
mod web_common;

use std::time::{Duration, Instant};

use redwheel::web::{Dashboard, Server};
use redwheel::{Redwheel, RedwheelOptions};
use serde_json::Value;
use support::RedisServer;
use support::dashboard::{http, post_form, queue_with_dead};
use web_common::{read_to_close, sixteen_stalled, stalled, timed_get};

const HOUR: Duration = Duration::from_secs(3_600);

/// What a script or a tool sends with an action (see `web_http.rs`).
const MARK: (&str, &str) = ("X-Redwheel-Action", "1");

fn options() -> RedwheelOptions {
    RedwheelOptions::default()
        .connect_timeout(Duration::from_secs(1))
        .command_timeout(Duration::from_secs(2))
}

fn serve(rw: &Redwheel) -> Server {
    Dashboard::new(rw)
        .refresh_interval(Duration::from_millis(100))
        .serve("127.0.0.1:0")
        .unwrap()
}

#[test]
fn destructive_actions_need_the_confirmation_field() {
    let redis = RedisServer::start();
    let rw = Redwheel::connect_with(&redis.url(), options()).unwrap();
    let q = queue_with_dead(&rw, "payments", &["p-1", "p-2", "p-3"]);
    let id = q.offer(&"later".to_owned(), HOUR).unwrap();
    let guard = rw.lock("inventory:42").lock().unwrap();
    let web = serve(&rw);
    let addr = web.local_addr();
    let locks = http(addr, "GET", "/api/locks", &[]).json();
    let holder = locks[0]["holders"][0]["owner"].as_str().unwrap().to_owned();
    let unlock = format!("holder={holder}&fencing_token={}", guard.fencing_token());
    let remove = format!("/api/queues/payments/messages/{}/remove", id.as_str());
    let destructive = [
        (remove.as_str(), String::new()),
        ("/api/queues/payments/requeue-dead", String::new()),
        ("/api/locks/inventory%3A42/force-unlock", unlock.clone()),
    ];
    for (path, fields) in &destructive {
        let r = post_form(addr, path, &[MARK], fields);
        assert_eq!(r.status, 400, "{path} without confirm: {}", r.body);
        assert_eq!(
            r.json()["error"]["kind"],
            "confirmation needed",
            "{}",
            r.body
        );
        // The first step of the page's button asks, and does nothing.
        let ask = format!("step=ask&{fields}");
        let r = post_form(addr, path, &[MARK], &ask);
        assert_eq!(r.status, 200, "{path} step=ask: {}", r.body);
        let doc = r.json();
        assert_eq!(doc["ok"], false);
        assert!(doc["confirm"].as_str().unwrap().contains('?'), "{doc}");
    }
    let s = q.stats().unwrap();
    assert_eq!(
        (s.dead, s.delayed),
        (3, 1),
        "nothing was removed or requeued"
    );
    assert!(!guard.is_lost() && rw.lock("inventory:42").is_locked().unwrap());

    // Requeue the oldest and pause are not destructive: no confirmation.
    let r = post_form(
        addr,
        "/api/queues/payments/requeue-dead?count=1",
        &[MARK],
        "",
    );
    assert_eq!(
        (r.status, &r.json()["requeued"]),
        (200, &Value::from(1)),
        "{}",
        r.body
    );
    let r = post_form(addr, "/api/queues/payments/pause", &[MARK], "step=ask");
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(!q.is_paused().unwrap(), "asking pauses nothing");
    let r = post_form(addr, "/api/queues/payments/pause", &[MARK], "");
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(q.is_paused().unwrap());

    // Confirmed, each acts; the fields may come in the query too.
    for (path, fields) in &destructive {
        let r = post_form(addr, path, &[MARK], &format!("confirm=yes&{fields}"));
        assert_eq!(r.status, 200, "{path} confirmed: {}", r.body);
    }
    let s = q.stats().unwrap();
    assert_eq!((s.dead, s.delayed), (0, 0));
    assert!(!rw.lock("inventory:42").is_locked().unwrap());
    let id = q.offer(&"again".to_owned(), HOUR).unwrap();
    let r = post_form(
        addr,
        &format!(
            "/api/queues/payments/messages/{}/remove?confirm=yes",
            id.as_str()
        ),
        &[MARK],
        "",
    );
    assert_eq!(r.status, 200, "{}", r.body);
    drop(guard);
}

#[test]
fn force_unlock_releases_only_the_holder_and_token_the_page_showed() {
    let redis = RedisServer::start();
    let rw = Redwheel::connect_with(&redis.url(), options()).unwrap();
    let web = serve(&rw);
    let addr = web.local_addr();
    let path = "/api/locks/inventory%3A42/force-unlock";

    // What the page showed: the first acquisition, its holder and token.
    let first = rw.lock("inventory:42").lock().unwrap();
    let shown = http(addr, "GET", "/api/locks", &[]).json();
    let (holder, token) = (
        shown[0]["holders"][0]["owner"].as_str().unwrap().to_owned(),
        shown[0]["token"].as_u64().unwrap(),
    );
    assert_eq!(token, first.fencing_token());
    first.unlock().unwrap();
    // Meanwhile another thread took the lock: a new holder, a new token.
    let rw2 = rw.clone();
    let (taken, release) = (
        crossbeam_channel::bounded::<u64>(1),
        crossbeam_channel::bounded::<()>(1),
    );
    let other = std::thread::spawn(move || {
        let g = rw2.lock("inventory:42").lock().unwrap();
        taken.0.send(g.fencing_token()).unwrap();
        release.1.recv().unwrap();
        let lost = g.is_lost();
        drop(g);
        lost
    });
    let second = taken.1.recv().unwrap();
    assert!(second > token);

    let fields = format!("confirm=yes&holder={holder}&fencing_token={token}");
    let r = post_form(addr, path, &[MARK], &fields);
    assert_eq!(r.status, 409, "{}", r.body);
    assert_eq!(r.json()["released"], false);
    assert!(
        rw.lock("inventory:42").is_locked().unwrap(),
        "the other hold stays"
    );
    // The right holder with a wrong token, or no token, is refused too.
    let now = http(addr, "GET", "/api/locks", &[]).json();
    let holder2 = now[0]["holders"][0]["owner"].as_str().unwrap().to_owned();
    assert_ne!(holder2, holder);
    let r = post_form(
        addr,
        path,
        &[MARK],
        &format!("confirm=yes&holder={holder2}&fencing_token={token}"),
    );
    assert_eq!(r.status, 409, "{}", r.body);
    let r = post_form(
        addr,
        path,
        &[MARK],
        &format!("confirm=yes&holder={holder2}"),
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(rw.lock("inventory:42").is_locked().unwrap());

    let r = post_form(
        addr,
        path,
        &[MARK],
        &format!("confirm=yes&holder={holder2}&fencing_token={second}"),
    );
    assert_eq!(
        (r.status, &r.json()["released"]),
        (200, &Value::from(true)),
        "{}",
        r.body
    );
    assert!(!rw.lock("inventory:42").is_locked().unwrap());
    release.0.send(()).unwrap();
    let _ = other.join().unwrap();
    let r = post_form(
        addr,
        path,
        &[MARK],
        &format!("confirm=yes&holder={holder2}&fencing_token={second}"),
    );
    assert_eq!(r.status, 404, "{}", r.body);
}

#[test]
fn the_requeue_count_has_an_upper_bound() {
    let redis = RedisServer::start();
    let rw = Redwheel::connect_with(&redis.url(), options()).unwrap();
    let q = queue_with_dead(&rw, "payments", &["p-1", "p-2"]);
    let web = serve(&rw);
    let addr = web.local_addr();
    for count in ["1000001", "18446744073709551615", "99999999999999999999999"] {
        let r = post_form(
            addr,
            &format!("/api/queues/payments/requeue-dead?count={count}"),
            &[MARK],
            "confirm=yes",
        );
        assert_eq!(r.status, 400, "count={count}: {}", r.body);
    }
    assert_eq!(q.stats().unwrap().dead, 2, "nothing was requeued");
    let r = post_form(
        addr,
        "/api/queues/payments/requeue-dead?count=1000000",
        &[MARK],
        "",
    );
    assert_eq!(
        (r.status, &r.json()["requeued"]),
        (200, &Value::from(2)),
        "{}",
        r.body
    );
}

#[test]
fn stop_returns_promptly_with_clients_connected() {
    let redis = RedisServer::start();
    let rw = Redwheel::connect_with(&redis.url(), options()).unwrap();
    let web = serve(&rw);
    let addr = web.local_addr();
    assert_eq!(http(addr, "GET", "/api/status", &[]).status, 200);
    let mut held = sixteen_stalled(addr);
    // A page asked for meanwhile (it also gives the server the time to
    // read the heads it was sent), then silent connections.
    let _ = timed_get(addr, "/api/status", Duration::from_secs(5));
    for _ in 0..8 {
        held.push(stalled(addr, b""));
    }
    let start = Instant::now();
    let stopping = web.clone();
    support::within(Duration::from_secs(30), move || stopping.stop());
    let took = start.elapsed();
    // Promptly: well under the 10 s a stalled request may take to time out.
    assert!(took < Duration::from_secs(5), "stop took {took:?}");
    assert!(web.is_stopped());
    // Every connection was closed, and the listener with them.
    for mut s in held {
        let left = read_to_close(&mut s, Duration::from_secs(10));
        assert!(
            left.is_some(),
            "a connection is still open after stop (which took {took:?})"
        );
    }
    assert!(
        std::net::TcpStream::connect(addr).is_err(),
        "the listener is closed"
    );
}
