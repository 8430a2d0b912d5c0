//! What the dashboard's process tests share: a real `redwheel web` process
//! (the CLI binary) on a loopback port, and raw sockets for the requests
//! no well-behaved client sends (a huge `Content-Length`, a stalled
//! request, a chunked body, a 64 MiB header).
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The `redwheel web` process, killed on drop.
pub struct Web {
    child: Child,
    pub addr: SocketAddr,
}

impl Drop for Web {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Web {
    /// Starts `redwheel --json web --listen 127.0.0.1:0 …` and reads the
    /// URL it prints.
    pub fn start(url: &str, extra: &[&str]) -> Web {
        Web::start_listening(url, "127.0.0.1:0", extra)
    }

    /// As [`Web::start`], on `listen`; the address returned is reached on
    /// loopback (an unspecified `0.0.0.0` becomes `127.0.0.1`).
    pub fn start_listening(url: &str, listen: &str, extra: &[&str]) -> Web {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_redwheel"));
        cmd.args(["--url", url, "--json", "web", "--listen", listen])
            .args(extra);
        Web::spawn(cmd)
    }

    /// As [`Web::start`], with the process allowed `files` descriptors at
    /// most (`ulimit -n`, through the shell).
    pub fn start_with_file_limit(url: &str, files: u32, extra: &[&str]) -> Web {
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(format!("ulimit -n {files} && exec \"$0\" \"$@\""))
            .arg(env!("CARGO_BIN_EXE_redwheel"))
            .args(["--url", url, "--json", "web", "--listen", "127.0.0.1:0"])
            .args(extra);
        Web::spawn(cmd)
    }

    fn spawn(mut cmd: Command) -> Web {
        let mut child = cmd
            .env_remove("REDWHEEL_WEB_TOKEN")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("run the redwheel binary");
        let out = child.stdout.take().unwrap();
        let mut web = Web {
            child,
            addr: "127.0.0.1:1".parse().unwrap(),
        };
        let line = super::support::within(Duration::from_secs(60), move || {
            let mut line = String::new();
            BufReader::new(out).read_line(&mut line).unwrap();
            line
        });
        let doc: serde_json::Value = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("one JSON line, not {line:?}: {e}"));
        let mut addr: SocketAddr = doc["url"]
            .as_str()
            .unwrap()
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .parse()
            .unwrap();
        if addr.ip().is_unspecified() {
            addr.set_ip([127, 0, 0, 1].into());
        }
        web.addr = addr;
        web
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// True while the process runs; panics with its exit status if it
    /// ended.
    pub fn assert_running(&mut self) {
        if let Some(status) = self.child.try_wait().unwrap() {
            panic!("the dashboard process ended: {status}");
        }
    }

    /// The process's peak resident memory (`VmHWM`), in KiB.
    pub fn peak_rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()))
            .expect("the process's /proc status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmHWM in /proc status")
    }

    /// How many descriptors the process has open.
    pub fn open_files(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .map(|d| d.count())
            .unwrap_or(0)
    }
}

/// A connection to `addr` that has sent `bytes` and then nothing more.
pub fn stalled(addr: SocketAddr, bytes: &[u8]) -> TcpStream {
    let mut s = TcpStream::connect(addr).expect("connect to the dashboard");
    s.write_all(bytes).unwrap();
    s
}

/// Sixteen clients that stall: eight send a whole head that announces a
/// body (too large for a server to read along with the head) and never
/// send it, then eight stop in the middle of their headers.
pub fn sixteen_stalled(addr: SocketAddr) -> Vec<TcpStream> {
    let mut held = Vec::new();
    for _ in 0..8 {
        let req = head(
            "POST",
            "/api/queues/q1/pause",
            addr,
            &[
                ("Content-Length", "100000"),
                ("Origin", &format!("http://{addr}")),
            ],
        );
        held.push(stalled(addr, req.as_bytes()));
    }
    for i in 0..8 {
        held.push(stalled(
            addr,
            format!("GET / HTTP/1.1\r\nHost: {addr}\r\nX-Slow-{i}: half a hea").as_bytes(),
        ));
    }
    held
}

/// The head of a request, up to and including the blank line.
pub fn head(method: &str, target: &str, addr: SocketAddr, headers: &[(&str, &str)]) -> String {
    let mut out = format!("{method} {target} HTTP/1.1\r\nHost: {addr}\r\n");
    for (n, v) in headers {
        out.push_str(&format!("{n}: {v}\r\n"));
    }
    out.push_str("\r\n");
    out
}

/// Everything `s` sends until it closes (or until `limit` passes: the
/// bytes so far), as text.
pub fn read_all(s: &mut TcpStream, limit: Duration) -> String {
    read_until_closed(s, limit).0
}

/// What `s` sends until it closes (or is reset), if it does within
/// `limit`.
pub fn read_to_close(s: &mut TcpStream, limit: Duration) -> Option<String> {
    let (text, closed) = read_until_closed(s, limit);
    closed.then_some(text)
}

fn read_until_closed(s: &mut TcpStream, limit: Duration) -> (String, bool) {
    let deadline = Instant::now() + limit;
    let mut raw = Vec::new();
    let mut buf = [0u8; 8192];
    let closed = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break false;
        }
        s.set_read_timeout(Some(left)).unwrap();
        match s.read(&mut buf) {
            Ok(0) => break true,
            Ok(n) => raw.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => break true,
        }
    };
    (String::from_utf8_lossy(&raw).into_owned(), closed)
}

/// The status code of a reply's text, if it has a status line.
pub fn status_of(reply: &str) -> Option<u16> {
    reply
        .strip_prefix("HTTP/1.")?
        .get(2..)?
        .split(' ')
        .next()?
        .parse()
        .ok()
}

/// One `GET path` on a new connection; the status and how long it took,
/// or `None` if no status came within `limit`.
pub fn timed_get(addr: SocketAddr, path: &str, limit: Duration) -> (Option<u16>, Duration) {
    let start = Instant::now();
    let Ok(mut s) = TcpStream::connect_timeout(&addr, limit) else {
        return (None, start.elapsed());
    };
    let req = head("GET", path, addr, &[("Connection", "close")]);
    if s.write_all(req.as_bytes()).is_err() {
        return (None, start.elapsed());
    }
    let reply = read_all(&mut s, limit);
    (status_of(&reply), start.elapsed())
}

/// Polls `GET path` until it answers `200`, up to `limit`; panics with
/// the last answer if it never does.
pub fn wait_answering(addr: SocketAddr, path: &str, limit: Duration) {
    let start = Instant::now();
    loop {
        let (status, _) = timed_get(addr, path, Duration::from_secs(10));
        if status == Some(200) {
            return;
        }
        if start.elapsed() > limit {
            panic!("the dashboard does not answer {path} within {limit:?}: last {status:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
