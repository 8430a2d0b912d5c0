//! The fault-injecting proxy itself (`tests/support/proxy.rs`), with raw
//! RESP clients and a real `redis-server`: what passes, what each fault
//! does to a reply and to the connection, and that the server ran what it
//! was sent.

mod support;

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use support::RedisServer;
use support::proxy::{Fault, Proxy, Rule, command_len, is_timeout, reply_len};

/// A hang guard: nothing here should take this long.
const HANG: Duration = Duration::from_secs(30);

fn encode(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
    }
    out
}

/// Sends every command in one write (a pipeline).
fn send(s: &mut TcpStream, commands: &[&[&str]]) {
    let bytes: Vec<u8> = commands.iter().flat_map(|c| encode(c)).collect();
    s.write_all(&bytes).unwrap();
}

/// A client of the proxy whose reads give up after `timeout`.
fn client(proxy: &Proxy, timeout: Duration) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", proxy.port())).unwrap();
    s.set_read_timeout(Some(timeout)).unwrap();
    s
}

/// What a client read: the complete replies, the bytes of an incomplete
/// one, and how reading ended if it did not get `n` replies.
#[derive(Debug)]
struct Got {
    replies: Vec<String>,
    partial: Vec<u8>,
    error: Option<io::Error>,
}

/// Reads until `n` replies came, or the connection failed or timed out.
fn read_replies(s: &mut TcpStream, n: usize) -> Got {
    let mut buf = Vec::new();
    let mut replies = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        while let Some(len) = reply_len(&buf) {
            replies.push(String::from_utf8_lossy(&buf[..len]).into_owned());
            buf.drain(..len);
        }
        if replies.len() >= n {
            return Got {
                replies,
                partial: buf,
                error: None,
            };
        }
        match s.read(&mut chunk) {
            Ok(0) => {
                return Got {
                    replies,
                    partial: buf,
                    error: Some(io::Error::new(io::ErrorKind::UnexpectedEof, "closed")),
                };
            }
            Ok(k) => buf.extend_from_slice(&chunk[..k]),
            Err(e) => {
                return Got {
                    replies,
                    partial: buf,
                    error: Some(e),
                };
            }
        }
    }
}

fn is_reset(e: &Option<io::Error>) -> bool {
    e.as_ref()
        .is_some_and(|e| e.kind() == io::ErrorKind::ConnectionReset)
}

#[test]
fn the_parser_finds_where_each_resp2_and_resp3_value_ends() {
    let cases: [&[u8]; 14] = [
        b"+OK\r\n",
        b"-ERR x\r\n",
        b":42\r\n",
        b"$3\r\nabc\r\n",
        b"$-1\r\n",
        b"*2\r\n$1\r\na\r\n:1\r\n",
        b"*-1\r\n",
        b"_\r\n",
        b"#t\r\n",
        b",1.5\r\n",
        b"%1\r\n+k\r\n*1\r\n:1\r\n",
        b"~2\r\n:1\r\n:2\r\n",
        b">3\r\n$7\r\nmessage\r\n$1\r\nc\r\n$1\r\nm\r\n",
        b"|1\r\n+a\r\n+b\r\n:7\r\n",
    ];
    for case in cases {
        let mut two = case.to_vec();
        two.extend_from_slice(b":1\r\n");
        assert_eq!(
            reply_len(&two),
            Some(case.len()),
            "{:?}",
            String::from_utf8_lossy(case)
        );
        for cut in 0..case.len() {
            assert_eq!(
                reply_len(&case[..cut]),
                None,
                "{:?} cut at {cut}",
                String::from_utf8_lossy(case)
            );
        }
    }
    // A bulk string holding CRLF is read by its length, not its lines.
    assert_eq!(reply_len(b"$4\r\n\r\n\r\n\r\n"), Some(10));
    assert_eq!(command_len(b"PING\r\n*1\r\n"), Some(6));
    assert_eq!(
        command_len(&encode(&["GET", "k"])),
        Some(encode(&["GET", "k"]).len())
    );
}

#[test]
fn without_rules_a_pipeline_passes_in_order() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let mut c = client(&proxy, HANG);
    send(
        &mut c,
        &[&["SET", "k", "v"], &["GET", "k"], &["PING"], &["INCR", "n"]],
    );
    let r = read_replies(&mut c, 4);
    assert_eq!(r.replies, ["+OK\r\n", "$1\r\nv\r\n", "+PONG\r\n", ":1\r\n"]);
    assert_eq!(proxy.connections(), 1);
}

#[test]
fn a_lost_reply_ran_on_the_server_and_the_client_is_reset_after_the_replies_before_it() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let rule = proxy.inject(Rule::new(Fault::LoseReply).matching("INCR").times(1));
    let mut c = client(&proxy, HANG);
    send(&mut c, &[&["PING"], &["INCR", "n"], &["PING"]]);
    let r = read_replies(&mut c, 3);
    assert_eq!(
        r.replies,
        ["+PONG\r\n"],
        "only the reply before the lost one"
    );
    assert!(
        is_reset(&r.error),
        "an RST, not a clean close: {:?}",
        r.error
    );
    assert_eq!((rule.matched(), rule.fired()), (1, 1));
    assert_eq!(server.int(&["INCRBY", "n", "0"]), 1, "the command ran");
    // The rule was for one match only: the next connection is untouched.
    let mut c = client(&proxy, HANG);
    send(&mut c, &[&["INCR", "n"]]);
    assert_eq!(read_replies(&mut c, 1).replies, [":2\r\n"]);
    assert_eq!(rule.matched(), 1);
}

#[test]
fn a_rule_matches_only_commands_holding_every_pattern_and_only_n_times() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let counted = proxy.inject(
        Rule::new(Fault::Forward)
            .matching("SET")
            .matching("{a}")
            .times(2),
    );
    let mut c = client(&proxy, HANG);
    send(
        &mut c,
        &[
            &["SET", "{b}x", "1"],
            &["SET", "{a}x", "1"],
            &["GET", "{a}x"],
            &["SET", "{a}y", "1"],
            &["SET", "{a}z", "1"],
        ],
    );
    assert_eq!(read_replies(&mut c, 5).replies.len(), 5);
    assert_eq!((counted.matched(), counted.fired()), (2, 2));
}

#[test]
fn the_first_rule_with_matches_left_wins() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let shield = proxy.inject(Rule::new(Fault::Forward).matching("INCR").times(1));
    let cut = proxy.inject(Rule::new(Fault::LoseReply).matching("INCR"));
    let mut c = client(&proxy, HANG);
    send(&mut c, &[&["INCR", "n"], &["INCR", "n"]]);
    let r = read_replies(&mut c, 2);
    assert_eq!(r.replies, [":1\r\n"]);
    assert!(is_reset(&r.error), "{:?}", r.error);
    assert_eq!((shield.fired(), cut.fired()), (1, 1));
    assert_eq!(server.int(&["INCRBY", "n", "0"]), 2);
}

#[test]
fn a_reply_dropped_midway_reaches_the_client_in_part_then_the_connection_is_reset() {
    let server = RedisServer::start();
    let value = "x".repeat(100);
    server.cmd(&["SET", "big", &value]);
    let proxy = Proxy::start(server.port());
    let rule = proxy.inject(Rule::new(Fault::DropMidReply).matching("GET"));
    let mut c = client(&proxy, HANG);
    send(&mut c, &[&["GET", "big"]]);
    let r = read_replies(&mut c, 1);
    assert!(r.replies.is_empty());
    let whole = format!("$100\r\n{value}\r\n");
    assert!(
        !r.partial.is_empty() && r.partial.len() < whole.len(),
        "{} bytes",
        r.partial.len()
    );
    assert!(whole.as_bytes().starts_with(&r.partial));
    assert!(is_reset(&r.error), "{:?}", r.error);
    assert_eq!(rule.fired(), 1);
}

#[test]
fn a_delayed_reply_keeps_its_place_and_the_command_ran_before_the_client_gave_up() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    // Delayed for longer than any test: the client gives up first.
    let slow = proxy.inject(
        Rule::new(Fault::Delay(Duration::from_secs(3600)))
            .matching("INCR")
            .times(1),
    );
    let mut c = client(&proxy, Duration::from_millis(200));
    send(&mut c, &[&["PING"], &["INCR", "n"], &["PING"]]);
    let r = read_replies(&mut c, 3);
    assert_eq!(r.replies, ["+PONG\r\n"]);
    assert!(r.error.as_ref().is_some_and(is_timeout), "{:?}", r.error);
    assert!(slow.wait_fired(1, HANG));
    assert_eq!(
        server.int(&["INCRBY", "n", "0"]),
        1,
        "the command ran at once"
    );
    // A short delay: the replies all come, in order.
    let _short = proxy.inject(Rule::new(Fault::Delay(Duration::from_millis(20))).matching("INCR"));
    let mut c = client(&proxy, HANG);
    send(&mut c, &[&["INCR", "n"], &["PING"], &["INCR", "n"]]);
    assert_eq!(
        read_replies(&mut c, 3).replies,
        [":2\r\n", "+PONG\r\n", ":3\r\n"]
    );
}

#[test]
fn a_held_cut_waits_for_its_release() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let rule = proxy.inject(Rule::new(Fault::LoseReply).matching("INCR").hold());
    let mut c = client(&proxy, Duration::from_millis(200));
    send(&mut c, &[&["INCR", "n"]]);
    assert!(rule.wait_fired(1, HANG));
    // The reply is gone and the server ran the command, but the client's
    // connection is still open: it hears nothing yet.
    assert_eq!(server.int(&["INCRBY", "n", "0"]), 1);
    let r = read_replies(&mut c, 1);
    assert!(r.error.as_ref().is_some_and(is_timeout), "{:?}", r.error);
    rule.release();
    c.set_read_timeout(Some(HANG)).unwrap();
    let r = read_replies(&mut c, 1);
    assert!(is_reset(&r.error), "{:?}", r.error);
}

#[test]
fn a_server_down_through_the_proxy_refuses_connections_and_resets_live_ones_until_restored() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let mut live = client(&proxy, HANG);
    send(&mut live, &[&["PING"]]);
    assert_eq!(read_replies(&mut live, 1).replies, ["+PONG\r\n"]);
    proxy.set_down(true);
    let r = read_replies(&mut live, 1);
    assert!(is_reset(&r.error), "{:?}", r.error);
    let refused = TcpStream::connect(("127.0.0.1", proxy.port())).unwrap_err();
    assert_eq!(refused.kind(), io::ErrorKind::ConnectionRefused);
    proxy.set_down(false);
    let mut c = client(&proxy, HANG);
    send(&mut c, &[&["PING"]]);
    assert_eq!(read_replies(&mut c, 1).replies, ["+PONG\r\n"]);
}

#[test]
fn cut_all_resets_every_live_connection() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let mut a = client(&proxy, HANG);
    let mut b = client(&proxy, HANG);
    send(&mut a, &[&["PING"]]);
    send(&mut b, &[&["PING"]]);
    assert_eq!(read_replies(&mut a, 1).replies.len(), 1);
    assert_eq!(read_replies(&mut b, 1).replies.len(), 1);
    proxy.cut_all();
    assert!(is_reset(&read_replies(&mut a, 1).error));
    assert!(is_reset(&read_replies(&mut b, 1).error));
}

#[test]
fn a_server_that_is_gone_resets_the_client() {
    let mut server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    server.kill();
    let mut c = client(&proxy, HANG);
    let _ = c.write_all(&encode(&["PING"]));
    let r = read_replies(&mut c, 1);
    assert!(r.replies.is_empty());
    assert!(r.error.is_some());
}

#[test]
fn pub_sub_connections_pass_through_untouched_by_rules() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let every = proxy.inject(Rule::new(Fault::LoseReply));
    let mut sub = client(&proxy, HANG);
    send(&mut sub, &[&["SUBSCRIBE", "ch"]]);
    assert_eq!(read_replies(&mut sub, 1).replies.len(), 1);
    assert_eq!(server.int(&["PUBLISH", "ch", "hello"]), 1);
    let r = read_replies(&mut sub, 1);
    assert!(r.replies[0].contains("hello"), "{r:?}");
    assert_eq!(every.matched(), 0);
}

#[test]
fn resp3_replies_and_pushes_keep_replies_and_commands_paired() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let mut c = client(&proxy, HANG);
    // HELLO 3 answers with a map; CLIENT TRACKING makes the server push
    // invalidations that answer no command.
    send(
        &mut c,
        &[
            &["HELLO", "3"],
            &["CLIENT", "TRACKING", "on"],
            &["GET", "k"],
        ],
    );
    let r = read_replies(&mut c, 3);
    assert!(r.replies[0].starts_with('%'), "{r:?}");
    server.cmd(&["SET", "k", "changed"]);
    let push = read_replies(&mut c, 1);
    assert!(push.replies[0].starts_with('>'), "{push:?}");
    let rule = proxy.inject(Rule::new(Fault::LoseReply).matching("INCR").times(1));
    send(&mut c, &[&["PING"], &["INCR", "n"]]);
    let r = read_replies(&mut c, 2);
    assert_eq!(r.replies.len(), 1, "{r:?}");
    assert!(is_reset(&r.error), "{r:?}");
    assert_eq!(rule.fired(), 1);
}

#[test]
fn a_partition_holds_commands_and_replies_without_closing_anything_until_healed() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let counted = proxy.inject(Rule::new(Fault::Forward).matching("INCR"));
    let mut c = client(&proxy, Duration::from_millis(200));
    // A command whose reply comes while partitioned: BLPOP, blocked on the
    // server before the partition starts.
    send(&mut c, &[&["BLPOP", "l", "0"]]);
    let deadline = std::time::Instant::now() + HANG;
    while !server.info("clients").contains("blocked_clients:1\r\n") {
        assert!(std::time::Instant::now() < deadline, "hang guard: BLPOP");
        std::thread::sleep(Duration::from_millis(2));
    }
    proxy.partition(true);
    assert_eq!(server.int(&["LPUSH", "l", "x"]), 1);
    assert_eq!(server.int(&["LLEN", "l"]), 0, "the BLPOP ran on the server");
    // A command sent during the partition.
    send(&mut c, &[&["INCR", "n"]]);
    let r = read_replies(&mut c, 1);
    assert!(r.replies.is_empty(), "{r:?}");
    assert!(
        r.error.as_ref().is_some_and(is_timeout),
        "no reply, and the connection stays open: {:?}",
        r.error
    );
    assert_eq!(counted.matched(), 0, "the INCR did not reach the server");
    assert_eq!(server.int(&["INCRBY", "n", "0"]), 0, "and did not run");
    // Healed: what waited passes on, in order, and later commands too.
    proxy.partition(false);
    c.set_read_timeout(Some(HANG)).unwrap();
    send(&mut c, &[&["INCR", "n"]]);
    assert_eq!(
        read_replies(&mut c, 3).replies,
        ["*2\r\n$1\r\nl\r\n$1\r\nx\r\n", ":1\r\n", ":2\r\n"]
    );
    assert_eq!(counted.matched(), 2);
    assert_eq!(proxy.connections(), 1, "nothing was closed");
}
