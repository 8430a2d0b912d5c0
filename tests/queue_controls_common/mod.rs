//! What the queue controls tests share: fleets of child processes (this
//! test binary run again with an environment variable naming a role), a
//! start barrier in Redis so they begin together, and result lists they
//! leave in Redis (keys `test:*`, outside redwheel's).
#![allow(dead_code)]

use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The environment variable that names a child's role.
pub const ROLE: &str = "REDWHEEL_CONTROLS_ROLE";
/// The Redis URL a child connects to.
pub const URL: &str = "REDWHEEL_CONTROLS_URL";
/// A child's index in its fleet (0-based).
pub const INDEX: &str = "REDWHEEL_CONTROLS_INDEX";

/// Child processes of one role, killed on drop unless waited for.
pub struct Fleet {
    children: Vec<Child>,
    con: redis::Connection,
}

/// A plain connection for the tests' own bookkeeping.
pub fn connection(url: &str) -> redis::Connection {
    redis::Client::open(url).unwrap().get_connection().unwrap()
}

impl Fleet {
    /// Starts `n` copies of this test binary running only `test_name`,
    /// as role `role`, with `env` besides. They connect, report ready and
    /// wait at the barrier until [`go`](Fleet::go).
    pub fn spawn(
        test_name: &str,
        role: &str,
        url: &str,
        n: usize,
        env: &[(&str, String)],
    ) -> Fleet {
        let mut con = connection(url);
        let _: () = redis::cmd("DEL")
            .arg("test:ready")
            .arg("test:go")
            .query(&mut con)
            .unwrap();
        let children = (0..n)
            .map(|i| {
                let mut cmd = Command::new(std::env::current_exe().unwrap());
                cmd.args(["--exact", test_name, "--test-threads=1", "--quiet"])
                    .env(ROLE, role)
                    .env(URL, url)
                    .env(INDEX, i.to_string())
                    .stdout(Stdio::null())
                    .stderr(Stdio::inherit());
                for (k, v) in env {
                    cmd.env(k, v);
                }
                cmd.spawn().unwrap()
            })
            .collect();
        Fleet { children, con }
    }

    /// Waits until every child is ready, then lets them all go at once.
    pub fn go(&mut self) {
        for _ in 0..self.children.len() {
            let got: Option<(String, String)> = redis::cmd("BLPOP")
                .arg("test:ready")
                .arg(120)
                .query(&mut self.con)
                .unwrap();
            assert!(got.is_some(), "a child did not get ready within 120 s");
        }
        let tokens = vec!["go"; self.children.len()];
        let _: () = redis::cmd("RPUSH")
            .arg("test:go")
            .arg(&tokens)
            .query(&mut self.con)
            .unwrap();
    }

    /// Waits for every child to exit; panics unless all succeeded.
    pub fn wait(mut self) {
        for c in &mut self.children {
            let status = c.wait().unwrap();
            assert!(status.success(), "a child process failed: {status}");
        }
        self.children.clear();
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// In a child: the role and URL it was given, or `None` when this is not
/// a child of that role (the test then does nothing).
pub fn role(name: &str) -> Option<(String, usize)> {
    let role = std::env::var(ROLE).ok()?;
    if role != name {
        return None;
    }
    let url = std::env::var(URL).unwrap();
    let index = std::env::var(INDEX).unwrap().parse().unwrap();
    Some((url, index))
}

/// In a child: a value the parent passed in the environment.
pub fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"))
}

/// In a child: reports ready and waits at the barrier.
pub fn ready_and_wait(con: &mut redis::Connection) {
    let _: () = redis::cmd("RPUSH")
        .arg("test:ready")
        .arg(1)
        .query(con)
        .unwrap();
    let got: Option<(String, String)> = redis::cmd("BLPOP")
        .arg("test:go")
        .arg(120)
        .query(con)
        .unwrap();
    assert!(got.is_some(), "no go within 120 s");
}

/// Appends `lines` to the list `key`.
pub fn report(con: &mut redis::Connection, key: &str, lines: &[String]) {
    for chunk in lines.chunks(1_000) {
        let _: () = redis::cmd("RPUSH").arg(key).arg(chunk).query(con).unwrap();
    }
}

/// The whole list `key`.
pub fn results(con: &mut redis::Connection, key: &str) -> Vec<String> {
    redis::cmd("LRANGE")
        .arg(key)
        .arg(0)
        .arg(-1)
        .query(con)
        .unwrap()
}

/// Polls `check` (a cheap read) until it holds; panics after `limit`. For
/// states that only the server's clock or another process brings about.
pub fn wait_until(limit: Duration, what: &str, mut check: impl FnMut() -> bool) {
    let give_up = std::time::Instant::now() + limit;
    while !check() {
        assert!(
            std::time::Instant::now() < give_up,
            "not within {limit:?}: {what}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}
