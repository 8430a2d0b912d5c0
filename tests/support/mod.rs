//! Test support: a private `redis-server` per test.
//!
//! The server listens on loopback only, on a port the OS picked (bind
//! `127.0.0.1:0`, read the port, release it, start the server on it; retried
//! if another process grabbed the port in between), with its working
//! directory and log in a private temporary directory. By default nothing is
//! persisted (`--save '' --appendonly no`); [`RedisServer::with_appendonly`]
//! turns the append-only file on (`appendfsync always`) for restart tests.
//! Drop kills the server, waits for it and removes the directory; if the
//! test is panicking, the server log is printed first.
#![allow(dead_code)]

pub mod cluster;
#[cfg(feature = "web")]
pub mod dashboard;
pub mod proxy;

use std::fs;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A `redis-server` owned by one test.
pub struct RedisServer {
    port: u16,
    dir: PathBuf,
    appendonly: bool,
    /// More `redis-server` arguments (TLS, …).
    extra: Vec<String>,
    /// The port `{port2}` in `extra` stands for (a cluster node's bus, a
    /// TLS port), picked with the client port at each start attempt and
    /// kept across restarts.
    port2: u16,
    child: Option<Child>,
}

static COUNTER: AtomicU64 = AtomicU64::new(0);

fn redis_server_bin() -> String {
    std::env::var("REDIS_SERVER_BIN").unwrap_or_else(|_| "redis-server".to_owned())
}

impl RedisServer {
    /// Starts a server with no persistence.
    pub fn start() -> RedisServer {
        RedisServer::start_with(false, Vec::new())
    }

    /// Starts a server that keeps an append-only file (fsync on every
    /// write), so a killed server restarts with every acknowledged write.
    pub fn with_appendonly() -> RedisServer {
        RedisServer::start_with(true, Vec::new())
    }

    /// Starts a server with more command-line arguments. `{dir}` in an
    /// argument becomes the server's private directory, `{port2}` a second
    /// port of its own ([`RedisServer::port2`]; picked anew if a start
    /// attempt fails, kept by `restart`).
    pub fn with_args(args: &[&str]) -> RedisServer {
        RedisServer::start_with(false, args.iter().map(|a| a.to_string()).collect())
    }

    /// A new private directory for files a server needs before it starts
    /// (certificates); removed when the returned guard is dropped.
    pub fn scratch_dir(name: &str) -> ScratchDir {
        let dir = std::env::temp_dir().join(format!(
            "redwheel-test-{}-{}-{name}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("create a scratch directory");
        ScratchDir(dir)
    }

    fn start_with(appendonly: bool, extra: Vec<String>) -> RedisServer {
        let dir = std::env::temp_dir().join(format!(
            "redwheel-test-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("create the server's directory");
        let mut last_log = String::new();
        for _attempt in 0..5 {
            let port = free_port();
            // A new second port with every attempt too: the one an attempt
            // found taken stays taken.
            let port2 = if extra.iter().any(|a| a.contains("{port2}")) {
                free_port()
            } else {
                0
            };
            let mut server = RedisServer {
                port,
                dir: dir.clone(),
                appendonly,
                extra: extra.clone(),
                port2,
                child: None,
            };
            if server.spawn_and_wait() {
                return server;
            }
            server.kill();
            last_log = server.log();
            let _ = fs::remove_file(server.log_path());
            std::mem::forget(server); // keep the directory for the next attempt
        }
        panic!("redis-server did not start after 5 attempts; last log:\n{last_log}");
    }

    /// The server's URL.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// A `Redwheel` connected to it with default options.
    pub fn connect(&self) -> redwheel::Redwheel {
        redwheel::Redwheel::connect(&self.url()).unwrap()
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The port `{port2}` stood for in [`RedisServer::with_args`] (0 if
    /// none did).
    pub fn port2(&self) -> u16 {
        self.port2
    }

    fn log_path(&self) -> PathBuf {
        self.dir.join("redis.log")
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    fn spawn_and_wait(&mut self) -> bool {
        let mut cmd = Command::new(redis_server_bin());
        cmd.arg("--port")
            .arg(self.port.to_string())
            .arg("--bind")
            .arg("127.0.0.1")
            .arg("--dir")
            .arg(&self.dir)
            .arg("--logfile")
            .arg(self.log_path())
            .arg("--save")
            .arg("")
            .arg("--daemonize")
            .arg("no");
        if self.appendonly {
            cmd.args(["--appendonly", "yes", "--appendfsync", "always"]);
        } else {
            cmd.args(["--appendonly", "no"]);
        }
        let dir = self.dir.display().to_string();
        let port2 = self.port2.to_string();
        cmd.args(
            self.extra
                .iter()
                .map(|a| a.replace("{dir}", &dir).replace("{port2}", &port2)),
        );
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = cmd.spawn().expect("spawn redis-server (is it installed?)");
        self.child = Some(child);
        self.wait_ready()
    }

    /// Waits until the server answers PING; false if it exited (e.g. the
    /// port was taken). Retries while the connection is refused or reset
    /// or the server is still loading.
    fn wait_ready(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(_status)) = child.try_wait()
            {
                return false;
            }
            match ping(self.port) {
                // Make sure it is our server that answers, not another
                // test's that took the same port first.
                Ok(true) => return self.answering_pid() == self.child.as_ref().map(Child::id),
                Ok(false) => {}
                // Refused, or reset while the server is still starting.
                Err(_) => {}
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("redis-server did not become ready; log:\n{}", self.log());
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("the server runs").id()
    }

    /// Sends `signal` (`"STOP"`, `"CONT"`, …) to the server process.
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.pid().to_string())
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{signal} failed");
    }

    /// Kills the server (SIGKILL) and waits for it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port and directory (its
    /// append-only file, if any, is reloaded).
    pub fn restart(&mut self) {
        self.kill();
        assert!(
            self.spawn_and_wait(),
            "redis-server did not restart on port {}; log:\n{}",
            self.port,
            self.log()
        );
    }

    /// Runs one command on a fresh connection and returns the whole reply
    /// as raw RESP text. Panics if the server cannot be reached.
    pub fn cmd(&self, args: &[&str]) -> String {
        self.try_cmd(args)
            .unwrap_or_else(|| panic!("redis-server on port {} did not answer {args:?}", self.port))
    }

    /// As [`cmd`](RedisServer::cmd), `None` if the server cannot be reached.
    pub fn try_cmd(&self, args: &[&str]) -> Option<String> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
        let mut req = format!("*{}\r\n", args.len());
        for a in args {
            req.push_str(&format!("${}\r\n{}\r\n", a.len(), a));
        }
        s.write_all(req.as_bytes()).ok()?;
        let mut buf = Vec::new();
        let mut chunk = [0u8; 8192];
        loop {
            if resp_len(&buf).is_some() {
                return Some(String::from_utf8_lossy(&buf).into_owned());
            }
            let n = s.read(&mut chunk).ok()?;
            if n == 0 {
                return None;
            }
            buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// True while the server process runs.
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// `INFO section`, whole.
    pub fn info(&self, section: &str) -> String {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let req = format!("*2\r\n$4\r\nINFO\r\n${}\r\n{section}\r\n", section.len());
        s.write_all(req.as_bytes()).unwrap();
        let mut text = Vec::new();
        let mut buf = [0u8; 8192];
        loop {
            let n = s.read(&mut buf).unwrap();
            assert!(n > 0, "the server closed the connection");
            text.extend_from_slice(&buf[..n]);
            // `$<len>\r\n<len bytes>\r\n`
            if let Some(eol) = text.windows(2).position(|w| w == b"\r\n") {
                let len: usize = std::str::from_utf8(&text[1..eol]).unwrap().parse().unwrap();
                if text.len() >= eol + 2 + len + 2 {
                    return String::from_utf8_lossy(&text[eol + 2..eol + 2 + len]).into_owned();
                }
            }
        }
    }

    /// How many times command `name` (lowercase) ran, from `INFO
    /// commandstats` (0 if never).
    pub fn calls(&self, name: &str) -> u64 {
        let info = self.info("commandstats");
        let prefix = format!("cmdstat_{name}:calls=");
        info.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|rest| rest.split(',').next())
            .map(|n| n.parse().unwrap())
            .unwrap_or(0)
    }

    fn answering_pid(&self) -> Option<u32> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        s.write_all(b"*2\r\n$4\r\nINFO\r\n$6\r\nserver\r\n").ok()?;
        let mut text = String::new();
        let mut buf = [0u8; 8192];
        while !text.contains("process_id:") || !text[text.find("process_id:")?..].contains("\r\n") {
            let n = s.read(&mut buf).ok()?;
            if n == 0 {
                return None;
            }
            text.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
        let rest = &text[text.find("process_id:")? + "process_id:".len()..];
        rest[..rest.find("\r\n")?].trim().parse().ok()
    }

    /// The server's clock (`TIME`) in epoch ms.
    pub fn time_ms(&self) -> u64 {
        let reply = self.cmd(&["TIME"]);
        let parts: Vec<&str> = reply.split("\r\n").collect();
        // *2 $n secs $n micros
        let secs: u64 = parts[2].parse().expect("TIME seconds");
        let micros: u64 = parts[4].parse().expect("TIME micros");
        secs * 1000 + micros / 1000
    }

    /// An integer reply (`:n`) of one command.
    pub fn int(&self, args: &[&str]) -> i64 {
        let reply = self.cmd(args);
        reply
            .trim()
            .strip_prefix(':')
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("not an integer reply to {args:?}: {reply:?}"))
    }

    /// The directory holding the log (and any persistence files).
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// A private directory, removed with everything in it on drop.
pub struct ScratchDir(PathBuf);

impl std::ops::Deref for ScratchDir {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if self.child.is_some() {
            // A stopped server would not die of SIGKILL until continued.
            let _ = Command::new("kill")
                .arg("-CONT")
                .arg(self.pid().to_string())
                .status();
        }
        if std::thread::panicking() {
            eprintln!(
                "---- redis-server log (port {}) ----\n{}\n---- end of log ----",
                self.port,
                self.log()
            );
        }
        self.kill();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// The length of the first complete RESP value in `buf`, if complete.
fn resp_len(buf: &[u8]) -> Option<usize> {
    let eol = buf.windows(2).position(|w| w == b"\r\n")?;
    let head = std::str::from_utf8(&buf[1..eol]).ok()?;
    match buf.first()? {
        b'+' | b'-' | b':' => Some(eol + 2),
        b'$' => {
            let n: i64 = head.parse().ok()?;
            if n < 0 {
                return Some(eol + 2);
            }
            let end = eol + 2 + n as usize + 2;
            (buf.len() >= end).then_some(end)
        }
        b'*' => {
            let n: i64 = head.parse().ok()?;
            let mut at = eol + 2;
            for _ in 0..n.max(0) {
                at += resp_len(&buf[at..])?;
            }
            Some(at)
        }
        _ => None,
    }
}

/// A port nobody listens on right now.
pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().unwrap().port()
}

/// One PING: Ok(true) on PONG, Ok(false) on another reply (e.g. LOADING).
fn ping(port: u16) -> std::io::Result<bool> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    s.write_all(b"*1\r\n$4\r\nPING\r\n")?;
    let mut buf = [0u8; 64];
    let n = s.read(&mut buf)?;
    Ok(buf[..n].starts_with(b"+PONG"))
}

/// Fails the test (instead of hanging it) if `f` has not returned within
/// `limit`: a generous hang guard, not a timing assertion.
pub fn within<R: Send + 'static>(limit: Duration, f: impl FnOnce() -> R + Send + 'static) -> R {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(limit) {
        Ok(r) => r,
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            panic!("hang guard: not done within {limit:?}")
        }
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            panic!("the guarded test body panicked (see above)")
        }
    }
}

/// Adds ACL user `name` with password `password` and `rules` (dropping
/// `+client|setinfo` on servers older than 7.2, which do not know it).
pub fn add_acl_user(server: &RedisServer, name: &str, password: &str, rules: &str) {
    let known = server.cmd(&["COMMAND", "INFO", "client|setinfo"]);
    let rules = if known.contains("setinfo") {
        rules.to_owned()
    } else {
        rules.replace(" +client|setinfo", "")
    };
    let pass = format!(">{password}");
    let mut args = vec!["ACL", "SETUSER", name, "on", pass.as_str()];
    args.extend(rules.split_whitespace());
    let reply = server.cmd(&args);
    assert_eq!(reply.trim(), "+OK", "ACL SETUSER {rules}: {reply}");
}

/// The least-privilege ACL rules of the guide's "In production" line
/// (what follows `>PASSWORD`), read from the guide itself
/// (`src/guide/production.md`, which the README links to) so the
/// documented line is the one tested.
pub fn readme_acl_rules() -> String {
    let guide = include_str!("../../src/guide/production.md");
    let line = guide
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("ACL SETUSER redwheel on >PASSWORD "))
        .expect("the guide's ACL line");
    line["ACL SETUSER redwheel on >PASSWORD ".len()..].to_owned()
}
