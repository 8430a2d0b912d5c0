//! `redwheel web`: the command serves the library's dashboard.

mod support;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use redwheel::Redwheel;
use support::RedisServer;
use support::browser::http;

/// The dashboard process, killed on drop.
struct Web(Child);

impl Drop for Web {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `redwheel --json web …` on a free loopback port and reads the
/// URL it prints.
fn start(url: &str, extra: &[&str]) -> (Web, SocketAddr) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_redwheel"))
        .args(["--url", url, "--json", "web", "--listen", "127.0.0.1:0"])
        .args(extra)
        .env_remove("REDWHEEL_WEB_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("run the redwheel binary");
    let out = child.stdout.take().unwrap();
    let web = Web(child);
    let line = support::within(Duration::from_secs(60), move || {
        let mut line = String::new();
        BufReader::new(out).read_line(&mut line).unwrap();
        line
    });
    let doc: serde_json::Value = serde_json::from_str(&line).expect("one JSON line");
    let addr = doc["url"]
        .as_str()
        .unwrap()
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .parse()
        .unwrap();
    (web, addr)
}

#[test]
fn the_web_command_serves_the_dashboard_with_its_token_and_read_only_switch() {
    let redis = RedisServer::start();
    let rw = Redwheel::connect(&redis.url()).unwrap();
    rw.queue::<String>("orders")
        .unwrap()
        .offer(&"o".to_owned(), Duration::from_secs(3_600))
        .unwrap();

    let (_web, addr) = start(&redis.url(), &["--token", "t0ken"]);
    assert!(addr.ip().is_loopback());
    let status = http(addr, "GET", "/api/status", &[]).json();
    assert_eq!(
        (&status["token_required"], &status["read_only"]),
        (&true.into(), &false.into())
    );
    let path = "/api/queues/orders/requeue-dead";
    assert_eq!(http(addr, "POST", path, &[]).status, 401);
    assert_eq!(
        http(addr, "POST", path, &[("Authorization", "Bearer t0ken")]).status,
        200
    );

    let (_ro, addr) = start(&redis.url(), &["--read-only"]);
    assert_eq!(http(addr, "POST", path, &[]).status, 403);
    assert_eq!(
        http(addr, "GET", "/api/status", &[]).json()["read_only"],
        true
    );
}
