//! What the write-under-faults tests (`tests/faults_queue.rs`,
//! `faults_reliable.rs`, `faults_lock.rs`) share: a server, a proxy in
//! front of it and a `Redwheel` through the proxy; the faults each write
//! is put through; the scripts' SHAs the faults match on; and reads of
//! what the server really holds, over a direct connection.
//!
//! Each test follows one pattern: the operation runs once without a
//! fault (so its script is loaded and a pooled connection sits idle, the
//! case in which a resend could hide), then again with one fault on its
//! script's reply; the test checks that the fault fired (the server ran
//! the command), reads the truth from the server directly, and asserts
//! the contract: the write took effect exactly once and the caller was
//! told so, or it did not and the caller was told so, or the caller got
//! `ErrorKind::OutcomeUnknown`.
#![allow(dead_code)] // each test binary uses a different part

use std::collections::BTreeSet;
use std::time::Duration;

use redwheel::{Redwheel, RedwheelOptions};

use crate::support::RedisServer;
use crate::support::proxy::{Fault, Proxy, Rule};

/// A hang guard: no test expects anything to take this long.
pub const HANG: Duration = Duration::from_secs(60);

/// The command timeout of the `Redwheel` under test: short, so a reply
/// delayed past it is told apart from a slow one without a long wait.
pub const COMMAND_TIMEOUT: Duration = Duration::from_millis(500);

/// A reply delayed far past [`COMMAND_TIMEOUT`] (the proxy releases it
/// when the test ends).
pub const LATE: Duration = Duration::from_secs(3600);

/// The faults every write is put through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cut {
    /// The command ran; its reply is lost and the connection reset.
    LoseReply,
    /// The command ran; half its reply arrives, then the connection is
    /// reset.
    DropMidReply,
    /// The command ran; its reply comes after the command timeout.
    DelayPastTimeout,
}

impl Cut {
    /// One match of `sha` (and every other pattern given) gets this
    /// fault.
    pub fn rule(self, sha: &str) -> Rule {
        let fault = match self {
            Cut::LoseReply => Fault::LoseReply,
            Cut::DropMidReply => Fault::DropMidReply,
            Cut::DelayPastTimeout => Fault::Delay(LATE),
        };
        Rule::new(fault).matching(sha).times(1)
    }
}

/// A server, the proxy in front of it, and a `Redwheel` through the
/// proxy (short command timeout and blocking rounds).
pub struct Env {
    pub rw: Redwheel,
    pub proxy: Proxy,
    pub server: RedisServer,
}

impl Env {
    pub fn start() -> Env {
        let server = RedisServer::start();
        let proxy = Proxy::start(server.port());
        let rw =
            Redwheel::connect_with(&proxy.url(), options()).expect("connect through the proxy");
        Env { rw, proxy, server }
    }

    /// Another `Redwheel`, straight to the server (another process's view).
    pub fn direct(&self) -> Redwheel {
        Redwheel::connect_with(&self.server.url(), options()).expect("connect to the server")
    }

    /// Loads redwheel's script `name` (as redwheel composes it) into the
    /// server, for a test that runs it by hand; its SHA1.
    pub fn load_script(&self, name: &str) -> String {
        let mut con = redis::Client::open(self.server.url())
            .unwrap()
            .get_connection()
            .unwrap();
        redwheel::test_support::load_script(&mut con, name)
            .unwrap_or_else(|| panic!("no script {name}"))
    }

    /// Waits until the ready list of queue `q` holds `n` entries.
    pub fn wait_ready(&self, q: &str, n: i64) {
        let key = format!("redwheel:{{{q}}}:ready");
        let deadline = std::time::Instant::now() + HANG;
        while self.server.int(&["LLEN", &key]) < n {
            assert!(
                std::time::Instant::now() < deadline,
                "hang guard: {n} ready in {q}"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

/// Ids of every message stored in queue `q` (its `msg` hash: delayed,
/// ready, in flight or dead).
pub fn stored_ids(server: &RedisServer, q: &str) -> BTreeSet<String> {
    strings(server, &["HKEYS", &format!("redwheel:{{{q}}}:msg")])
        .into_iter()
        .collect()
}

/// Ids of the messages of queue `q` whose payload is `payload`.
pub fn ids_with_payload(server: &RedisServer, q: &str, payload: &str) -> Vec<String> {
    let all = strings(server, &["HGETALL", &format!("redwheel:{{{q}}}:msg")]);
    all.chunks(2)
        .filter(|kv| kv[1].split_once(':').is_some_and(|(_, p)| p == payload))
        .map(|kv| kv[0].clone())
        .collect()
}

/// A reply of bulk strings (one, or an array of them) as strings.
pub fn strings(server: &RedisServer, args: &[&str]) -> Vec<String> {
    parse_strings(&server.cmd(args))
}

/// A bulk string reply; `None` for nil.
pub fn string(server: &RedisServer, args: &[&str]) -> Option<String> {
    strings(server, args).into_iter().next()
}

/// Runs `$scenario` (a function of a [`Cut`]) as one test per fault in
/// a module `$name`: `lost_reply`, `reply_dropped_midway`,
/// `reply_delayed_past_the_command_timeout`.
#[allow(unused_macros)] // not every test binary runs scenarios
macro_rules! under_every_cut {
    ($name:ident, $scenario:expr) => {
        mod $name {
            use super::*;

            #[test]
            fn lost_reply() {
                ($scenario)(Cut::LoseReply)
            }

            #[test]
            fn reply_dropped_midway() {
                ($scenario)(Cut::DropMidReply)
            }

            #[test]
            fn reply_delayed_past_the_command_timeout() {
                ($scenario)(Cut::DelayPastTimeout)
            }
        }
    };
}
#[allow(unused_imports)]
pub(crate) use under_every_cut;

pub fn options() -> RedwheelOptions {
    RedwheelOptions::default()
        .command_timeout(COMMAND_TIMEOUT)
        .max_block(Duration::from_millis(200))
}

/// The strings of a RESP reply: a bulk string, or an array of them (nil
/// entries left out).
pub fn parse_strings(resp: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut lines = resp.split("\r\n");
    while let Some(line) = lines.next() {
        if let Some(n) = line.strip_prefix('$')
            && n.parse::<i64>().is_ok_and(|n| n >= 0)
            && let Some(s) = lines.next()
        {
            out.push(s.to_owned());
        }
    }
    out
}

/// The SHA1 of a script as redwheel builds and sends it (what its
/// EVALSHA carries), by name (see [`scripts`]).
pub fn sha(name: &str) -> String {
    redwheel::test_support::script_sha(name).unwrap_or_else(|| panic!("no script {name}"))
}

/// The names of the scripts the fault tests aim at, for [`sha`] (the
/// library composes each from `lua/`, see `src/scripts.rs`).
pub mod scripts {
    pub const OFFER: &str = "offer";
    pub const OFFER_BATCH: &str = "offer_batch";
    pub const REMOVE: &str = "remove";
    pub const TAKE: &str = "take";
    pub const CLAIM: &str = "claim";
    pub const ACK: &str = "ack";
    pub const NACK: &str = "nack";
    pub const EXTEND: &str = "extend";
    pub const REQUEUE_DEAD: &str = "requeue_dead";
    pub const LOCK_ACQUIRE: &str = "lock_acquire";
    pub const LOCK_RELEASE: &str = "lock_release";
    pub const LOCK_RENEW: &str = "lock_renew";
}
