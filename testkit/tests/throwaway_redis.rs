//! The throwaway `redis-server`s of the examples and doc tests: what they
//! leave behind (nothing), however the process that started them ends.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use redwheel_testkit::ThrowawayRedis;

/// Sends `PING` over a raw connection; true if the server answered `+PONG`.
fn pings(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let mut reply = [0u8; 7];
    s.write_all(b"PING\r\n").is_ok() && s.read_exact(&mut reply).is_ok() && &reply == b"+PONG\r\n"
}

/// Polls `cond` until it holds or 20 s pass (a generous bound: the
/// machine is shared).
fn eventually(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(
            Instant::now() < deadline,
            "still not true after 20 s: {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

// A user ran the quickstart without redis-server installed and found
// `/tmp/redwheel-quickstart-<pid>` left behind.
#[test]
fn a_missing_redis_server_leaves_no_directory_behind() {
    let name = "missing-binary";
    let err = ThrowawayRedis::start_with("/nonexistent/redis-server", name, &[])
        .err()
        .expect("there is no such binary");
    assert!(err.to_string().contains("could not start"), "{err}");
    assert!(!ThrowawayRedis::dir_for(name).exists());
}

#[test]
fn a_started_server_answers_and_its_directory_goes_with_it() {
    let name = "started";
    let server = ThrowawayRedis::start(name).expect("redis-server starts");
    assert!(pings(server.port()));
    assert!(ThrowawayRedis::dir_for(name).exists());
    let port = server.port();
    drop(server);
    assert!(!ThrowawayRedis::dir_for(name).exists());
    assert!(!pings(port));
}

/// Starts `hold_redis`, to end as `how` once it reads a line; its child
/// and the URL it printed.
fn hold(how: &str, redis_url: Option<&str>) -> (Child, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hold_redis"));
    cmd.arg(how).stdin(Stdio::piped()).stdout(Stdio::piped());
    match redis_url {
        Some(url) => cmd.env("REDIS_URL", url),
        None => cmd.env_remove("REDIS_URL"),
    };
    let mut child = cmd.spawn().expect("hold_redis starts");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    (child, line.trim().to_owned())
}

fn port_of(url: &str) -> u16 {
    url.trim_start_matches("redis://127.0.0.1:")
        .trim_end_matches('/')
        .parse()
        .unwrap_or_else(|_| panic!("not a throwaway URL: {url}"))
}

fn dir_of(child: &Child) -> PathBuf {
    std::env::temp_dir().join(format!("redwheel-doctest-{}", child.id()))
}

/// The process-wide server (what the doc tests use) is gone, with its
/// directory, once its process has ended in the way `how` says.
fn goes_with_its_process(how: &str) {
    let (mut child, url) = hold(how, None);
    let port = port_of(&url);
    let dir = dir_of(&child);
    assert!(pings(port), "the process's server answers while it runs");
    assert!(dir.exists());
    writeln!(child.stdin.as_mut().unwrap()).unwrap(); // end now
    if how == "park" {
        child.kill().unwrap(); // SIGKILL: no destructor, no atexit
    }
    child.wait().unwrap();
    eventually("the server stops answering", || !pings(port));
    eventually("its directory is removed", || !dir.exists());
}

#[test]
fn the_process_wide_server_goes_when_its_process_returns() {
    goes_with_its_process("exit");
}

#[test]
fn the_process_wide_server_goes_when_its_process_aborts() {
    goes_with_its_process("abort");
}

#[test]
fn the_process_wide_server_goes_when_its_process_is_killed() {
    goes_with_its_process("park");
}

#[test]
fn redis_url_is_redis_url_when_it_is_set() {
    let (mut child, url) = hold("exit", Some("redis://10.0.0.5:6380/2"));
    drop(child.stdin.take()); // end now
    assert!(child.wait().unwrap().success());
    assert_eq!(url, "redis://10.0.0.5:6380/2");
    assert!(!dir_of(&child).exists(), "no server was started");
}

#[test]
fn block_on_completes_a_future_woken_from_another_thread() {
    use std::sync::mpsc;
    use std::task::Poll;
    let (tx, rx) = mpsc::channel::<()>();
    let mut waker_tx = Some(tx);
    let mut polls = 0;
    let rx = std::sync::Mutex::new(rx);
    let out = redwheel_testkit::block_on(std::future::poll_fn(|cx| {
        polls += 1;
        if rx.lock().unwrap().try_recv().is_ok() {
            return Poll::Ready(polls);
        }
        if let Some(tx) = waker_tx.take() {
            let waker = cx.waker().clone();
            std::thread::spawn(move || {
                tx.send(()).unwrap();
                waker.wake();
            });
        }
        Poll::Pending
    }));
    assert!(out >= 2, "polled again after the wake: {out}");
}
