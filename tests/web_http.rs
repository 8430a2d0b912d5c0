//! The dashboard's HTTP layer under hostile clients, against a real
//! `redwheel web` process (the CLI binary) over raw sockets: a huge
//! `Content-Length` whose sender closes, stalled clients, a smuggled
//! action, a POST that no browser marks, a 64 MiB header, more
//! connections than it serves at once, a process out of descriptors, and
//! a `Host` it does not answer to.

mod support;
mod web_common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use redwheel::Redwheel;
use support::RedisServer;
use support::dashboard::http;
use web_common::{
    Web, head, read_all, sixteen_stalled, stalled, status_of, timed_get, wait_answering,
};

const HOUR: Duration = Duration::from_secs(3_600);

/// The bound the issue sets on a page's answer while clients stall.
const PAGE_BOUND: Duration = Duration::from_secs(2);

/// A Redis with queue `q1` (one delayed message) and a dashboard process
/// on it, answering, its first scan of the queues in (`/api/queues`
/// answers 503 before it).
fn setup(extra: &[&str]) -> (RedisServer, Redwheel, Web) {
    let redis = RedisServer::start();
    let rw = Redwheel::connect(&redis.url()).unwrap();
    rw.queue::<String>("q1")
        .unwrap()
        .offer(&"m".to_owned(), HOUR)
        .unwrap();
    let web = Web::start(&redis.url(), extra);
    wait_answering(web.addr, "/api/queues", Duration::from_secs(60));
    (redis, rw, web)
}

fn paused(rw: &Redwheel, queue: &str) -> bool {
    rw.queue::<String>(queue).unwrap().is_paused().unwrap()
}

#[test]
fn a_huge_content_length_whose_sender_closes_kills_neither_the_process_nor_its_workers() {
    let (_redis, rw, mut web) = setup(&[]);
    let addr = web.addr;
    // 2^62 (an allocation that aborts the process) and 2^64 - 1 (a
    // panic in the thread that drops the body), each sent more times
    // than the server has threads.
    for length in ["18446744073709551615", "4611686018427387904"] {
        for _ in 0..40 {
            let req = head(
                "POST",
                "/api/queues/q1/pause",
                addr,
                &[
                    ("Content-Length", length),
                    ("Origin", &format!("http://{addr}")),
                ],
            );
            let mut s = stalled(addr, req.as_bytes());
            s.shutdown(std::net::Shutdown::Write).unwrap();
            let reply = read_all(&mut s, Duration::from_secs(10));
            if let Some(status) = status_of(&reply) {
                assert_eq!(status, 413, "Content-Length {length}: {reply}");
            }
        }
        for _ in 0..8 {
            let (status, took) = timed_get(addr, "/api/status", Duration::from_secs(10));
            assert_eq!(
                status,
                Some(200),
                "after Content-Length {length}: no answer in {took:?}"
            );
        }
        web.assert_running();
    }
    assert!(!paused(&rw, "q1"), "no body, no action");
}

#[test]
fn sixteen_stalled_clients_leave_the_page_answering_within_2_s() {
    let (_redis, _rw, web) = setup(&[]);
    let addr = web.addr;
    let held = sixteen_stalled(addr);
    // Timed from here, with the stalled clients connected: each page on
    // its own connection must answer within the bound.
    for path in ["/", "/api/status", "/api/queues", "/assets/dashboard.js"] {
        let (status, took) = timed_get(addr, path, Duration::from_secs(10));
        assert_eq!(status, Some(200), "{path}: no answer in {took:?}");
        assert!(
            took < PAGE_BOUND,
            "{path} took {took:?} with 16 stalled clients"
        );
    }
    drop(held);
}

#[test]
fn a_chunked_body_behind_a_get_smuggles_no_action() {
    let (_redis, rw, web) = setup(&[]);
    let addr = web.addr;
    let own = format!("http://{addr}");
    let smuggled = head(
        "POST",
        "/api/queues/q1/pause",
        addr,
        &[
            ("Origin", &own),
            ("X-Redwheel-Action", "1"),
            ("Content-Length", "0"),
        ],
    );
    // One GET, as a proxy would see it: a chunked body of 64 KiB of
    // padding and then the text of a POST, in one chunk.
    let mut data = vec![b'a'; 64 * 1024];
    data.extend_from_slice(smuggled.as_bytes());
    let mut req = head("GET", "/", addr, &[("Transfer-Encoding", "chunked")]).into_bytes();
    req.extend_from_slice(format!("{:x}\r\n", data.len()).as_bytes());
    req.extend_from_slice(&data);
    req.extend_from_slice(b"\r\n0\r\n\r\n");
    let mut s = TcpStream::connect(addr).unwrap();
    // The server may refuse and close before all of it is sent.
    let _ = s.write_all(&req);
    let replies = read_all(&mut s, Duration::from_secs(10));
    let statuses = replies.matches("HTTP/1.1 ").count();
    assert!(
        statuses <= 1,
        "one request sent, {statuses} answered:\n{replies}"
    );
    assert!(
        !paused(&rw, "q1"),
        "the POST inside the body ran:\n{replies}"
    );
    wait_answering(addr, "/api/status", Duration::from_secs(60));
}

#[test]
fn a_post_with_neither_origin_nor_referer_nor_token_is_refused() {
    let (redis, rw, web) = setup(&[]);
    let addr = web.addr;
    let path = "/api/queues/q1/pause";
    let bare = http(addr, "POST", path, &[]);
    assert_eq!(bare.status, 403, "{}", bare.body);
    assert!(!paused(&rw, "q1"));
    // A header no form can send and no other site can send without a
    // CORS preflight lets a script or a tool through.
    let marked = http(addr, "POST", path, &[("X-Redwheel-Action", "1")]);
    assert_eq!(marked.status, 200, "{}", marked.body);
    assert!(paused(&rw, "q1"));
    let own = http(
        addr,
        "POST",
        "/api/queues/q1/resume",
        &[("Origin", &format!("http://{addr}"))],
    );
    assert_eq!(own.status, 200, "{}", own.body);
    assert!(!paused(&rw, "q1"));

    // With a token: no token and no mark is a 401, the token alone passes.
    let web = Web::start(&redis.url(), &["--token", "t0ken"]);
    let addr = web.addr;
    wait_answering(addr, "/api/status", Duration::from_secs(60));
    assert_eq!(http(addr, "POST", path, &[]).status, 401);
    assert_eq!(
        http(addr, "POST", path, &[("X-Redwheel-Action", "1")]).status,
        401
    );
    assert!(!paused(&rw, "q1"));
    let r = http(addr, "POST", path, &[("Authorization", "Bearer t0ken")]);
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(paused(&rw, "q1"));
}

#[test]
fn a_64_mib_header_is_refused_without_the_process_growing_or_dying() {
    let (_redis, _rw, mut web) = setup(&[]);
    let addr = web.addr;
    let before = web.peak_rss_kib();
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(format!("GET / HTTP/1.1\r\nHost: {addr}\r\nX-Big: ").as_bytes())
        .unwrap();
    let chunk = vec![b'a'; 1 << 20];
    let mut sent = 0usize;
    for _ in 0..64 {
        if s.write_all(&chunk).is_err() {
            break;
        }
        sent += chunk.len();
    }
    let _ = s.write_all(b"\r\n\r\n");
    let reply = read_all(&mut s, Duration::from_secs(10));
    if let Some(status) = status_of(&reply) {
        assert_eq!(status, 431, "{reply}");
    }
    web.assert_running();
    let (status, took) = timed_get(addr, "/api/status", Duration::from_secs(10));
    assert_eq!(status, Some(200), "no answer in {took:?}");
    let grew = web.peak_rss_kib().saturating_sub(before);
    assert!(
        grew < 16 * 1024,
        "the peak resident size grew by {grew} KiB on a 64 MiB header"
    );
    assert!(
        sent < 64 << 20,
        "the whole 64 MiB header was taken in ({sent} bytes)"
    );
}

/// Reads, without blocking, whatever each connection has received; marks
/// those that got a reply (or were closed).
fn poll_replies(conns: &mut [TcpStream], replies: &mut [Option<String>]) {
    for (s, reply) in conns.iter_mut().zip(replies.iter_mut()) {
        if reply.is_some() {
            continue;
        }
        s.set_nonblocking(true).unwrap();
        let mut buf = [0u8; 4096];
        match s.read(&mut buf) {
            Ok(0) => *reply = Some(String::new()),
            Ok(n) => *reply = Some(String::from_utf8_lossy(&buf[..n]).into_owned()),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => *reply = Some(format!("error: {e}")),
        }
    }
}

#[test]
fn connections_past_the_cap_get_a_503_and_the_listener_stays_open() {
    let (_redis, _rw, mut web) = setup(&[]);
    let addr = web.addr;
    // Many more silent connections than the server takes at once.
    let mut conns: Vec<TcpStream> = (0..200)
        .map(|_| TcpStream::connect(addr).expect("connect"))
        .collect();
    let mut replies: Vec<Option<String>> = vec![None; conns.len()];
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline && !replies.iter().flatten().any(|r| status_of(r) == Some(503))
    {
        poll_replies(&mut conns, &mut replies);
        std::thread::sleep(Duration::from_millis(20));
    }
    let refused = replies
        .iter()
        .flatten()
        .filter(|r| status_of(r) == Some(503))
        .count();
    assert!(
        refused >= 1,
        "no connection past the cap was refused: {:?}",
        replies.iter().flatten().take(3).collect::<Vec<_>>()
    );
    assert!(
        refused < conns.len(),
        "every connection was refused: the server took none"
    );
    drop(conns);
    web.assert_running();
    wait_answering(addr, "/api/status", Duration::from_secs(60));
}

#[test]
fn running_out_of_descriptors_does_not_close_the_listener_for_good() {
    let redis = RedisServer::start();
    let files = 64;
    let mut web = Web::start_with_file_limit(&redis.url(), files, &[]);
    let addr: SocketAddr = web.addr;
    wait_answering(addr, "/api/status", Duration::from_secs(60));
    // More connections than the process has descriptors left: they wait
    // in the listener's backlog while its accept fails.
    let conns: Vec<TcpStream> = (0..100)
        .map(|_| TcpStream::connect(addr).expect("connect"))
        .collect();
    let full = files as usize - 2;
    let start = Instant::now();
    while web.open_files() < full {
        web.assert_running();
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the process never ran out of descriptors: {} open",
            web.open_files()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(conns);
    web.assert_running();
    wait_answering(addr, "/api/status", Duration::from_secs(60));
    let (status, _) = timed_get(addr, "/", Duration::from_secs(10));
    assert_eq!(status, Some(200));
}

#[test]
fn a_listener_beyond_loopback_answers_only_the_hosts_it_is_given() {
    let redis = RedisServer::start();
    // Bound on every address, reached on loopback only; read-only, so no
    // action is offered to anyone else meanwhile.
    let web = Web::start_listening(&redis.url(), "0.0.0.0:0", &["--read-only"]);
    let addr = web.addr;
    let port = addr.port();
    // /api/queues answers 503 until the first scan of the queues is in.
    wait_answering(addr, "/api/queues", Duration::from_secs(60));
    let host = |h: &str| http(addr, "GET", "/api/queues", &[("Host", h)]).status;
    // A name rebound to this machine is refused; an address is no
    // rebinding (the page's origin would be that address).
    assert_eq!(host(&format!("evil.example:{port}")), 421);
    assert_eq!(host(&format!("127.0.0.1:{port}")), 200);
    drop(web);

    let web = Web::start_listening(
        &redis.url(),
        "0.0.0.0:0",
        &[
            "--read-only",
            "--allow-host",
            "dash.example.internal",
            "--allow-host",
            "ops.example.internal",
        ],
    );
    let addr = web.addr;
    let port = addr.port();
    wait_answering(addr, "/api/status", Duration::from_secs(60));
    let host = |h: &str| http(addr, "GET", "/", &[("Host", h)]).status;
    assert_eq!(host(&format!("dash.example.internal:{port}")), 200);
    assert_eq!(host("OPS.example.internal"), 200);
    assert_eq!(host(&format!("evil.example:{port}")), 421);
    assert_eq!(
        host(&format!("dash.example.internal.evil.example:{port}")),
        421
    );
}
