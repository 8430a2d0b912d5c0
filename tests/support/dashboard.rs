//! Test support for the dashboard without a browser: a bare HTTP/1.1
//! client for its pages and API (and for requests a browser would not
//! make: a forged `Origin`, a foreign `Host`), a queue with dead letters to
//! show, and waits on the dashboard's refreshes. The browser tests
//! (`workbench/tests/support/browser.rs`) use it too.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use serde_json::Value;

/// The longest a wait for a dashboard or page state may take before the
/// test fails.
pub const WAIT_LIMIT: Duration = Duration::from_secs(60);

/// Queue `name` (opened with `max_deliveries(1)`) with one dead letter
/// per payload: each offered, claimed and nacked once.
pub fn queue_with_dead(
    rw: &redwheel::Redwheel,
    name: &str,
    payloads: &[&str],
) -> redwheel::Queue<String> {
    let q = rw
        .queue_with::<String>(name, redwheel::QueueOptions::default().max_deliveries(1))
        .unwrap();
    for p in payloads {
        q.offer(&(*p).to_owned(), Duration::ZERO).unwrap();
        let d = q.claim(Duration::from_secs(30)).unwrap().expect("a claim");
        assert_eq!(d.nack(Duration::ZERO).unwrap(), redwheel::Nacked::Dead);
    }
    q
}

/// Waits until `q`'s stats satisfy `done` (its transfer, a consumer or
/// the dashboard moved its messages).
pub fn wait_stats<T: redwheel::Codec>(
    q: &redwheel::Queue<T>,
    done: impl Fn(&redwheel::QueueStats) -> bool + Send + 'static,
) {
    let q = q.clone();
    super::within(WAIT_LIMIT, move || {
        while !done(&q.stats().unwrap()) {
            std::thread::sleep(Duration::from_millis(5));
        }
    })
}

/// `GET /api/status` of the dashboard at `addr`.
pub fn dashboard_status(addr: SocketAddr) -> Value {
    http(addr, "GET", "/api/status", &[]).json()
}

/// Waits until the dashboard at `addr` has ended a refresh that started
/// after this call (two more successful rounds than now); returns that
/// snapshot's number.
pub fn wait_fresh_snapshot(addr: SocketAddr) -> u64 {
    let target = dashboard_status(addr)["snapshot"].as_u64().unwrap() + 2;
    super::within(WAIT_LIMIT, move || {
        while dashboard_status(addr)["snapshot"].as_u64().unwrap() < target {
            std::thread::sleep(Duration::from_millis(10));
        }
        target
    })
}

/// A reply to [`http`].
#[derive(Debug)]
pub struct HttpReply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl HttpReply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
}

/// One HTTP/1.1 request to `addr` (`Host` is `addr` unless `headers` gives
/// one), read to the end (`Connection: close`).
pub fn http(addr: SocketAddr, method: &str, target: &str, headers: &[(&str, &str)]) -> HttpReply {
    http_body(addr, method, target, headers, "")
}

/// A form's `POST` (`application/x-www-form-urlencoded`, `body` as given:
/// `confirm=yes&token=7`), as [`http`].
pub fn post_form(
    addr: SocketAddr,
    target: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> HttpReply {
    let mut all = vec![("Content-Type", "application/x-www-form-urlencoded")];
    all.extend_from_slice(headers);
    http_body(addr, "POST", target, &all, body)
}

/// As [`http`], with `body` (its `Content-Length` set).
pub fn http_body(
    addr: SocketAddr,
    method: &str,
    target: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> HttpReply {
    let mut s = TcpStream::connect(addr).expect("connect to the dashboard");
    s.set_read_timeout(Some(WAIT_LIMIT)).unwrap();
    let mut req = format!(
        "{method} {target} HTTP/1.1\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if !headers.iter().any(|(n, _)| n.eq_ignore_ascii_case("host")) {
        req.push_str(&format!("Host: {addr}\r\n"));
    }
    for (n, v) in headers {
        req.push_str(&format!("{n}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("read the reply");
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {head:?}"));
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_owned(), v.trim().to_owned()))
        .collect();
    HttpReply {
        status,
        headers,
        body: body.to_owned(),
    }
}
