//! A fault-injecting TCP proxy between a Redis client and a real
//! `redis-server`, for the fault tests (`tests/faults_*.rs`) and the chaos
//! run (`examples/chaos.rs`, which includes this file by `#[path]`).
//!
//! Plain threads and std sockets, two threads per connection. The proxy
//! reads RESP well enough to find where each command and each reply ends,
//! so a pipeline (several commands in one write, several replies in one
//! read) is handled command by command: a fault applies to the reply of
//! the one command that matched, the replies before it pass unchanged.
//!
//! ```ignore
//! let proxy = Proxy::start(server.port());
//! let rw = Redwheel::connect(&proxy.url())?;
//! // The next EVALSHA of the take script runs on the server; its reply is
//! // thrown away and the client's connection reset.
//! let cut = proxy.inject(Rule::new(Fault::LoseReply).matching(take_sha).times(1));
//! let r = q.take();
//! assert_eq!(cut.fired(), 1); // the server ran it
//! ```
//!
//! Faults ([`Fault`]): forward; lose the reply (the command reached the
//! server and ran, the reply is read and discarded, then the client's
//! connection is reset with an RST: `SO_LINGER` 0); delay the reply; pass
//! half the reply on and reset. A [`Rule`] picks which commands a fault
//! applies to: those whose bytes contain every given pattern (a script's
//! SHA, a key, a command name), the next `n` of them or all. Rules are
//! tried in the order they were injected; the first with matches left
//! wins. [`Proxy::set_down`] makes the server unreachable through the
//! proxy (new connections refused, live ones reset) until restored.
//! [`Proxy::partition`] cuts the network without closing anything: no
//! byte passes either way (a command sent meanwhile does not reach the
//! server, a reply does not reach the client) until it is healed.
//!
//! Each rule counts the commands it matched and the replies it
//! [fired](RuleHandle::fired) on (the server's reply reached the proxy and
//! the fault was applied to it: for [`Fault::LoseReply`] the reply was
//! discarded, so the command certainly ran), and a test can wait for
//! those counts instead of sleeping. A rule made with
//! [`hold`](Rule::hold) keeps the client's connection open after the
//! reply was discarded until [`RuleHandle::release`], so a test can act
//! in between (another client takes the message) and decide exactly when
//! the client learns of the failure.
//!
//! Connections that switch to pub/sub or `MONITOR` (whose replies do not
//! answer one command each) are passed through from then on, untouched
//! by rules. A replica's link to its master (a cluster node announcing
//! the proxy's port is reached through it by its replica too) is known by
//! its `REPLCONF` and left alone: no rule applies to it, neither
//! [`Proxy::cut_all`] nor [`Proxy::set_down`] cuts it (new connections
//! are refused while down), and [`Proxy::partition`] does not stop it,
//! since the faults stand for what a client of the server sees.
#![allow(dead_code)] // each user takes a different part

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

/// What happens to the reply of a command that a rule matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The reply passes unchanged (a rule that only counts matches).
    Forward,
    /// The command reaches the server and runs; its reply is read and
    /// thrown away, and the client's connection is reset (RST), as when a
    /// connection drops after a command was executed.
    LoseReply,
    /// The reply is passed on after this delay (replies after it on the
    /// same connection wait behind it, as they would on a slow network).
    /// The command itself runs at once.
    Delay(Duration),
    /// Half the reply's bytes (at least one, never all) are passed on,
    /// then the client's connection is reset.
    DropMidReply,
}

/// Which commands a fault applies to, and how many times.
#[derive(Debug, Clone)]
pub struct Rule {
    fault: Fault,
    patterns: Vec<Vec<u8>>,
    times: Option<u64>,
    hold: bool,
}

impl Rule {
    /// A rule applying `fault` to every command (narrow it with
    /// [`matching`](Rule::matching) and [`times`](Rule::times)).
    pub fn new(fault: Fault) -> Rule {
        Rule {
            fault,
            patterns: Vec::new(),
            times: None,
            hold: false,
        }
    }

    /// Only commands whose bytes (the whole RESP array: name, keys,
    /// arguments) contain `pattern`; several calls: all of them.
    pub fn matching(mut self, pattern: impl AsRef<[u8]>) -> Rule {
        self.patterns.push(pattern.as_ref().to_vec());
        self
    }

    /// Only the next `n` matching commands.
    pub fn times(mut self, n: u64) -> Rule {
        self.times = Some(n);
        self
    }

    /// For [`Fault::LoseReply`] and [`Fault::DropMidReply`]: once the
    /// reply was discarded (the rule [fired](RuleHandle::fired)), keep the
    /// client's connection open until [`RuleHandle::release`]. For
    /// [`Fault::Forward`]: hold the reply back until then (a delay the
    /// test ends when it chooses).
    pub fn hold(mut self) -> Rule {
        self.hold = true;
        self
    }

    fn matches(&self, command: &[u8]) -> bool {
        self.patterns.iter().all(|p| contains(command, p))
    }
}

/// A rule injected into a proxy: its counts, and its release.
pub struct RuleHandle {
    shared: Arc<Shared>,
    id: usize,
}

impl RuleHandle {
    /// Commands this rule matched so far (sent on to the server).
    pub fn matched(&self) -> u64 {
        self.shared.lock().rules[self.id].matched
    }

    /// Replies this rule's fault was applied to so far: the server had
    /// answered the command, so it ran.
    pub fn fired(&self) -> u64 {
        self.shared.lock().rules[self.id].fired
    }

    /// Waits until [`fired`](RuleHandle::fired) reaches `n`; false if it
    /// did not within `limit` (a hang guard, not a timing claim).
    pub fn wait_fired(&self, n: u64, limit: Duration) -> bool {
        self.shared
            .wait_until(limit, |s| s.rules[self.id].fired >= n)
    }

    /// Waits until [`matched`](RuleHandle::matched) reaches `n`; false if
    /// it did not within `limit`.
    pub fn wait_matched(&self, n: u64, limit: Duration) -> bool {
        self.shared
            .wait_until(limit, |s| s.rules[self.id].matched >= n)
    }

    /// Lets the connections held by a [`hold`](Rule::hold) rule be cut
    /// (now, and at once for later matches).
    pub fn release(&self) {
        self.shared.lock().rules[self.id].released = true;
        self.shared.changed.notify_all();
    }

    /// Takes the rule out: later commands are no longer matched by it
    /// (its counts stay readable). Releases what it holds.
    pub fn remove(&self) {
        let mut s = self.shared.lock();
        s.rules[self.id].removed = true;
        s.rules[self.id].released = true;
        drop(s);
        self.shared.changed.notify_all();
    }
}

/// The proxy: listens on a loopback port of its own and connects each
/// client to the target server. Dropped, it resets every connection and
/// stops.
pub struct Proxy {
    shared: Arc<Shared>,
    port: u16,
}

impl Proxy {
    /// A proxy to the server on `127.0.0.1:target`.
    pub fn start(target: u16) -> Proxy {
        Proxy::start_to(SocketAddr::from(([127, 0, 0, 1], target)))
    }

    /// A proxy to the server at `target`.
    pub fn start_to(target: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let port = listener.local_addr().expect("the proxy's address").port();
        let shared = Arc::new(Shared {
            target,
            port,
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
        });
        shared.lock().listening = true;
        let s = Arc::clone(&shared);
        std::thread::Builder::new()
            .name(format!("proxy-{port}"))
            .spawn(move || accept_loop(&s, listener))
            .expect("spawn the proxy's thread");
        Proxy { shared, port }
    }

    /// `redis://127.0.0.1:<port>/`: the server, through the proxy.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The proxy's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Adds a rule (after those already there).
    pub fn inject(&self, rule: Rule) -> RuleHandle {
        let mut s = self.shared.lock();
        s.rules.push(RuleState {
            rule,
            matched: 0,
            fired: 0,
            released: false,
            removed: false,
        });
        RuleHandle {
            shared: Arc::clone(&self.shared),
            id: s.rules.len() - 1,
        }
    }

    /// Takes every rule out (releasing what they hold): everything is
    /// forwarded again.
    pub fn clear(&self) {
        let mut s = self.shared.lock();
        for r in &mut s.rules {
            r.removed = true;
            r.released = true;
        }
        drop(s);
        self.shared.changed.notify_all();
    }

    /// `true`: the server is unreachable through the proxy, as if it were
    /// down: connections are refused (the port is closed) and every live
    /// one is reset. `false`: reachable again (returns once the proxy
    /// listens).
    pub fn set_down(&self, down: bool) {
        let mut s = self.shared.lock();
        s.down = down;
        drop(s);
        self.shared.changed.notify_all();
        if down {
            self.cut_all();
            // Wakes the accepting thread, which closes the port.
            let _ = TcpStream::connect(("127.0.0.1", self.port));
            self.shared
                .wait_until(Duration::from_secs(10), |s| !s.listening);
        } else {
            assert!(
                self.shared
                    .wait_until(Duration::from_secs(10), |s| s.listening),
                "the proxy could not listen on port {} again",
                self.port
            );
        }
    }

    /// `true`: a network partition between the clients and the server:
    /// no connection is closed, but nothing passes either way. A command
    /// sent meanwhile waits in the proxy (it does not reach the server,
    /// so it does not run) and a reply waits too (the client hears
    /// nothing until its own timeout); new connections are accepted (the
    /// handshake is the proxy's) and pass nothing either. `false`: healed:
    /// what waited passes on in order, and so does everything after it.
    pub fn partition(&self, partitioned: bool) {
        self.shared.lock().partitioned = partitioned;
        self.shared.changed.notify_all();
    }

    /// Resets every live client connection (RST); new ones are accepted.
    pub fn cut_all(&self) {
        self.reset(false);
    }

    /// Resets every live connection, replication links too if `all`.
    fn reset(&self, all: bool) {
        let conns: Vec<Arc<Conn>> = self
            .shared
            .lock()
            .conns
            .iter()
            .filter_map(Weak::upgrade)
            .filter(|c| all || !c.replication.load(Ordering::SeqCst))
            .collect();
        for c in conns {
            c.reset();
        }
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> u64 {
        self.shared.lock().accepted
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.changed.notify_all();
        self.reset(true);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

struct RuleState {
    rule: Rule,
    matched: u64,
    fired: u64,
    released: bool,
    removed: bool,
}

#[derive(Default)]
struct State {
    rules: Vec<RuleState>,
    conns: Vec<Weak<Conn>>,
    accepted: u64,
    down: bool,
    /// See [`Proxy::partition`].
    partitioned: bool,
    listening: bool,
    stop: bool,
}

struct Shared {
    target: SocketAddr,
    port: u16,
    state: Mutex<State>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until `done` holds; false after `limit`.
    fn wait_until(&self, limit: Duration, mut done: impl FnMut(&State) -> bool) -> bool {
        let deadline = Instant::now() + limit;
        let mut s = self.lock();
        while !done(&s) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            s = self
                .changed
                .wait_timeout(s, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        true
    }

    /// What to do with the reply to `command`, sent on `conn`.
    fn classify(&self, conn: &Conn, command: &[u8]) -> Action {
        if starts_passthrough(command) {
            return Action::Passthrough;
        }
        if conn.replication.load(Ordering::SeqCst)
            || command_name(command).is_some_and(|n| n.eq_ignore_ascii_case(b"REPLCONF"))
        {
            conn.replication.store(true, Ordering::SeqCst);
            return Action::Forward;
        }
        let mut s = self.lock();
        for (id, r) in s.rules.iter_mut().enumerate() {
            if r.removed || r.rule.times == Some(0) || !r.rule.matches(command) {
                continue;
            }
            if let Some(n) = &mut r.rule.times {
                *n -= 1;
            }
            r.matched += 1;
            let action = Action::Fault(id, r.rule.fault);
            drop(s);
            self.changed.notify_all();
            return action;
        }
        Action::Forward
    }

    /// Counts a firing of rule `id`; if the rule holds, waits for its
    /// release (or the proxy's end, or `conn` being cut meanwhile).
    fn fire(&self, id: usize, conn: &Conn) {
        let mut s = self.lock();
        s.rules[id].fired += 1;
        self.changed.notify_all();
        if !s.rules[id].rule.hold {
            return;
        }
        while !s.rules[id].released && !s.stop && !conn.is_cut() {
            s = self
                .changed
                .wait_timeout(s, Duration::from_millis(50))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Waits while the proxy is [partitioned](Proxy::partition) (a
    /// replication link never waits); false if the proxy stopped or
    /// `conn` was cut meanwhile, so nothing may pass.
    fn pass(&self, conn: &Conn) -> bool {
        let mut s = self.lock();
        while s.partitioned && !conn.replication.load(Ordering::SeqCst) {
            if s.stop || conn.is_cut() {
                return false;
            }
            s = self
                .changed
                .wait_timeout(s, Duration::from_millis(50))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        !s.stop && !conn.is_cut()
    }

    /// Sleeps `d`, or less if the proxy stops or `conn` is cut.
    fn delay(&self, d: Duration, conn: &Conn) {
        let deadline = Instant::now() + d;
        let mut s = self.lock();
        while !s.stop && !conn.is_cut() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            s = self
                .changed
                .wait_timeout(s, left.min(Duration::from_millis(50)))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

/// What the reply to one command gets.
#[derive(Debug, Clone, Copy)]
enum Action {
    Forward,
    /// The fault of rule `.0`.
    Fault(usize, Fault),
    /// The connection enters pub/sub (or MONITOR): pass everything from
    /// this reply on.
    Passthrough,
}

/// One proxied connection. The client socket is shared by both pumps
/// (no duplicated descriptor), so when the last of them lets go of it,
/// it closes with `SO_LINGER` 0 if it was cut: an RST.
struct Conn {
    client: TcpStream,
    server: TcpStream,
    pending: Mutex<VecDeque<Action>>,
    cut: AtomicBool,
    /// A replica's link to its master: no fault applies to it.
    replication: AtomicBool,
}

impl Conn {
    fn is_cut(&self) -> bool {
        self.cut.load(Ordering::SeqCst)
    }

    /// Resets the client's connection: `SO_LINGER` 0, so closing the
    /// socket sends an RST (and drops anything unsent); the pumps are
    /// woken without a FIN (`shutdown(Read)` sends nothing) and the
    /// socket closes when both have let go of it.
    fn reset(&self) {
        if self.cut.swap(true, Ordering::SeqCst) {
            return;
        }
        let _ = socket2::SockRef::from(&self.client).set_linger(Some(Duration::ZERO));
        let _ = self.client.shutdown(Shutdown::Read);
        let _ = self.server.shutdown(Shutdown::Both);
    }
}

fn accept_loop(shared: &Arc<Shared>, first: TcpListener) {
    let mut listener = Some(first);
    loop {
        let Some(l) = &listener else {
            // Down: wait to come back up, then listen on the same port.
            let up = shared.wait_until(Duration::from_secs(3600), |s| !s.down || s.stop);
            if shared.lock().stop {
                return;
            }
            if up {
                listener = bind_again(shared.port);
                if listener.is_some() {
                    shared.lock().listening = true;
                    shared.changed.notify_all();
                }
            }
            continue;
        };
        let Ok((client, _)) = l.accept() else {
            std::thread::sleep(Duration::from_millis(1));
            continue;
        };
        let (stop, down) = {
            let s = shared.lock();
            (s.stop, s.down)
        };
        if stop {
            return;
        }
        if down {
            reset_now(client);
            listener = None;
            shared.lock().listening = false;
            shared.changed.notify_all();
            continue;
        }
        open(shared, client);
    }
}

/// Binds `127.0.0.1:port` again (retrying while the port is in use).
fn bind_again(port: u16) -> Option<TcpListener> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match TcpListener::bind(("127.0.0.1", port)) {
            Ok(l) => return Some(l),
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            Err(_) => return None,
        }
    }
}

/// Closes an accepted connection with an RST.
fn reset_now(s: TcpStream) {
    let _ = socket2::SockRef::from(&s).set_linger(Some(Duration::ZERO));
    drop(s);
}

fn open(shared: &Arc<Shared>, client: TcpStream) {
    let Ok(server) = TcpStream::connect_timeout(&shared.target, Duration::from_secs(2)) else {
        // The server is down: so is the connection.
        reset_now(client);
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let conn = Arc::new(Conn {
        client,
        server,
        pending: Mutex::new(VecDeque::new()),
        cut: AtomicBool::new(false),
        replication: AtomicBool::new(false),
    });
    {
        let mut s = shared.lock();
        s.accepted += 1;
        s.conns.retain(|w| w.strong_count() > 0);
        s.conns.push(Arc::downgrade(&conn));
    }
    let (s1, c1) = (Arc::clone(shared), Arc::clone(&conn));
    let (s2, c2) = (Arc::clone(shared), conn);
    let up = std::thread::Builder::new()
        .name("proxy-up".into())
        .spawn(move || pump_commands(&s1, &c1));
    let down = std::thread::Builder::new()
        .name("proxy-down".into())
        .spawn(move || pump_replies(&s2, &c2));
    if up.is_err() || down.is_err() {
        panic!("could not start the proxy's connection threads");
    }
}

/// Client → server: each complete command is classified (its reply's
/// fate queued) before its bytes go on.
fn pump_commands(shared: &Shared, conn: &Conn) {
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        let n = match (&conn.client).read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if !shared.pass(conn) {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
        let mut at = 0;
        while let Some(len) = command_len(&buf[at..]) {
            let action = shared.classify(conn, &buf[at..at + len]);
            lock_pending(conn).push_back(action);
            at += len;
        }
        if at > 0 {
            if (&conn.server).write_all(&buf[..at]).is_err() {
                break;
            }
            buf.drain(..at);
        }
    }
    // The client went away (or was cut): so does the server side.
    let _ = conn.server.shutdown(Shutdown::Both);
}

fn lock_pending(conn: &Conn) -> MutexGuard<'_, VecDeque<Action>> {
    conn.pending.lock().unwrap_or_else(|e| e.into_inner())
}

/// Server → client: each complete reply gets what its command's action
/// says (pushes pass unchanged).
fn pump_replies(shared: &Shared, conn: &Conn) {
    let mut buf: Vec<u8> = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    let mut passthrough = false;
    loop {
        let n = match (&conn.server).read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if !shared.pass(conn) {
            break;
        }
        if passthrough {
            if (&conn.client).write_all(&chunk[..n]).is_err() {
                break;
            }
            continue;
        }
        buf.extend_from_slice(&chunk[..n]);
        // buf[..sent] went to the client already; buf[..at] is parsed.
        let mut sent = 0;
        let mut at = 0;
        let mut failed = false;
        while !passthrough && let Some(len) = reply_len(&buf[at..]) {
            if buf[at] == b'>' {
                at += len; // a push: answers no command
                continue;
            }
            let action = lock_pending(conn).pop_front().unwrap_or(Action::Forward);
            match action {
                Action::Forward | Action::Fault(_, Fault::Forward) => {
                    if let Action::Fault(id, _) = action {
                        shared.fire(id, conn);
                    }
                    at += len;
                }
                Action::Passthrough => {
                    passthrough = true;
                    at += len;
                }
                Action::Fault(id, Fault::Delay(d)) => {
                    failed |= (&conn.client).write_all(&buf[sent..at]).is_err();
                    sent = at;
                    shared.fire(id, conn);
                    shared.delay(d, conn);
                    at += len;
                }
                Action::Fault(id, Fault::LoseReply) => {
                    let _ = (&conn.client).write_all(&buf[sent..at]);
                    shared.fire(id, conn);
                    conn.reset();
                    return;
                }
                Action::Fault(id, Fault::DropMidReply) => {
                    let keep = (len / 2).clamp(1, len - 1);
                    let _ = (&conn.client).write_all(&buf[sent..at + keep]);
                    shared.fire(id, conn);
                    conn.reset();
                    return;
                }
            }
            if failed {
                break;
            }
        }
        if passthrough {
            // Whatever follows the switch is not parsed.
            at = buf.len();
        }
        if failed || (&conn.client).write_all(&buf[sent..at]).is_err() {
            break;
        }
        buf.drain(..at);
    }
    if !conn.is_cut() {
        // The server closed: tell the client the same way (FIN).
        let _ = conn.client.shutdown(Shutdown::Write);
    }
    let _ = conn.server.shutdown(Shutdown::Both);
}

/// True for a command after which the connection's replies no longer
/// answer one command each (pub/sub, MONITOR, replication).
fn starts_passthrough(command: &[u8]) -> bool {
    let Some(name) = command_name(command) else {
        return false;
    };
    const PASSTHROUGH: [&[u8]; 6] = [
        b"SUBSCRIBE",
        b"SSUBSCRIBE",
        b"PSUBSCRIBE",
        b"MONITOR",
        b"SYNC",
        b"PSYNC",
    ];
    PASSTHROUGH.iter().any(|p| name.eq_ignore_ascii_case(p))
}

/// The first word of a command (an array's first bulk string, or an
/// inline command's first word).
fn command_name(command: &[u8]) -> Option<&[u8]> {
    if command.first() == Some(&b'*') {
        let eol = find_crlf(command)?;
        let rest = &command[eol + 2..];
        let len_end = find_crlf(rest)?;
        let n: usize = std::str::from_utf8(rest.get(1..len_end)?)
            .ok()?
            .parse()
            .ok()?;
        rest.get(len_end + 2..len_end + 2 + n)
    } else {
        command
            .split(|b| b.is_ascii_whitespace())
            .find(|w| !w.is_empty())
    }
}

/// The length of the first complete command in `buf` (a RESP array, or
/// an inline command ending in `\n`), or `None` if it is not complete.
pub fn command_len(buf: &[u8]) -> Option<usize> {
    match buf.first()? {
        b'*' => reply_len(buf),
        _ => buf.iter().position(|&b| b == b'\n').map(|i| i + 1),
    }
}

/// The length of the first complete RESP2 or RESP3 value in `buf`, or
/// `None` if it is not complete (or not RESP). An attribute (`|`) counts
/// with the value it annotates.
pub fn reply_len(buf: &[u8]) -> Option<usize> {
    let eol = find_crlf(buf)?;
    let head = || -> Option<i64> { std::str::from_utf8(&buf[1..eol]).ok()?.parse().ok() };
    let line = eol + 2;
    match buf.first()? {
        // Simple string, error, integer, null, boolean, double, big number.
        b'+' | b'-' | b':' | b'_' | b'#' | b',' | b'(' => Some(line),
        // Bulk string, blob error, verbatim string.
        b'$' | b'!' | b'=' => {
            let n = head()?;
            if n < 0 {
                return Some(line);
            }
            let end = line + n as usize + 2;
            (buf.len() >= end).then_some(end)
        }
        // Array, set, push; map and attribute hold pairs.
        b'*' | b'~' | b'>' | b'%' | b'|' => {
            let n = head()?;
            let items = match buf[0] {
                b'%' | b'|' => n.max(0) * 2,
                _ => n.max(0),
            };
            let mut at = line;
            for _ in 0..items {
                at += reply_len(&buf[at..])?;
            }
            if buf[0] == b'|' {
                at += reply_len(&buf[at..])?;
            }
            Some(at)
        }
        _ => None,
    }
}

fn find_crlf(buf: &[u8]) -> Option<usize> {
    buf.windows(2).position(|w| w == b"\r\n")
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    needle.is_empty() || haystack.windows(needle.len()).any(|w| w == needle)
}

/// A read timeout error (`WouldBlock` or `TimedOut`, depending on the
/// platform).
pub fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}
