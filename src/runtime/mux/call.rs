//! [`Call`]: one command (or a short pipeline) sent through a node's
//! multiplexed connection, as a future: routed to the master serving its
//! slot on a cluster (following `MOVED` and `ASK`, waiting out `TRYAGAIN`
//! and a failover on the wheel, by the same table as the synchronous
//! calls: [`step_after`]), its script loaded after `NOSCRIPT`, and never
//! sent again once it may have been applied.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use redis::Value;

use super::io::{Abandoned, Mux, Orphan, ReplySlot, Request};
use crate::error::{Access, Error, ErrorKind};
use crate::runtime::backoff::Backoff;
use crate::runtime::cluster::{Step, redirect_target, step_after};
use crate::runtime::keyslot::slot;
use crate::runtime::pool::TryRunError;
use crate::runtime::shared::{Backend, Runtime};
use crate::runtime::wait::{Cell, Wait};

/// Most redirects one call follows (as the synchronous calls).
const MAX_REDIRECTS: usize = 16;

/// Packed commands for a [`Call`]: the first is the one that matters (a
/// script by `EVALSHA`, say); the others ride along (`WAIT`).
#[derive(Clone)]
pub(crate) struct Command {
    packed: Arc<[u8]>,
    count: usize,
    script: Option<&'static redis::Script>,
}

impl Command {
    /// `EVALSHA` of `script` with `keys` and `args`.
    pub(crate) fn script(script: &'static redis::Script, keys: &[&str], args: &[&[u8]]) -> Command {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(script.get_hash()).arg(keys.len()).arg(keys);
        for a in args {
            cmd.arg(*a);
        }
        Command {
            packed: cmd.get_packed_command().into(),
            count: 1,
            script: Some(script),
        }
    }

    /// The packed commands, how many, and the script of the first (for a
    /// caller that sends them on a connection of its own:
    /// `runtime/replicas.rs`).
    pub(crate) fn packed(&self) -> (&[u8], usize, Option<&'static redis::Script>) {
        (&self.packed, self.count, self.script)
    }

    /// This command followed by `then`, sent together.
    pub(crate) fn then(mut self, then: &redis::Cmd) -> Command {
        let mut packed = self.packed.to_vec();
        packed.extend(then.get_packed_command());
        self.packed = packed.into();
        self.count += 1;
        self
    }
}

impl Runtime {
    /// Sends `command`, whose keys share `route`'s slot, through the
    /// multiplexed connection of the node serving it. The future gives one
    /// reply per command (an error reply as a [`Value::ServerError`] in
    /// its place, after the redirects and waits above), or the error of
    /// the connection, classified by `access` as the synchronous calls do.
    /// `orphan` gets the replies (error replies included) if the future is
    /// dropped after sending and they come (see
    /// [`resend_of_unresolved`](Call::resend_of_unresolved)).
    pub(crate) fn call(
        self: &Arc<Self>,
        route: &str,
        access: Access,
        command: Command,
        orphan: Option<Orphan>,
    ) -> Call {
        let rt = Arc::clone(self);
        let backoff = Backoff::new(rt.options.reconnect_min, rt.options.reconnect_max);
        Call {
            rt,
            route: route.to_owned(),
            access,
            command,
            started: Instant::now(),
            backoff,
            redirects: 0,
            state: State::Send { ask: None },
            orphan,
            unsent_too: false,
            asked: None,
            pause: None,
        }
    }

    /// A wait for `cell` to fire, for `at_most` at most (a timeout on the
    /// driver's wheel), ended early by shutdown.
    pub(crate) fn wait_for(&self, cell: &Arc<Cell>, at_most: Option<Duration>) -> Wait {
        Wait::new(cell, at_most, self.driver.wheel(), &self.asynk.shutdown)
    }

    /// The mux to send to, and on a cluster its node's `host:port`: the
    /// one server's, or, on a cluster, the one of the node at `ask`, or of
    /// the master serving `route` (`Ok(None)`: none is known; a refresh was
    /// asked for).
    fn mux_for(&self, route: &str, ask: Option<&str>) -> Result<Option<Target>, Error> {
        let asy = &self.asynk;
        match &self.backend {
            Backend::Node { .. } => asy
                .single()
                .expect("a single-node mux")
                .map(|m| Some((m, None))),
            Backend::Cluster(c) => {
                let addr = match ask {
                    Some(a) => a.to_owned(),
                    None => match c.owner_addr(route.as_bytes()) {
                        Some(a) => a,
                        None => {
                            asy.refresh_soon(c);
                            return Ok(None);
                        }
                    },
                };
                let node = c.node(&addr)?;
                asy.node(&addr, &node.endpoint)
                    .map(|m| Some((m, Some(addr))))
            }
        }
    }
}

/// A node's mux, and on a cluster its `host:port`.
type Target = (Arc<Mux>, Option<String>);

/// The future of [`Runtime::call`].
pub(crate) struct Call {
    rt: Arc<Runtime>,
    route: String,
    access: Access,
    command: Command,
    started: Instant,
    backoff: Backoff,
    redirects: usize,
    state: State,
    orphan: Option<Orphan>,
    /// Dropped before its command is on the wire (or with it never
    /// sent), the orphan is still called, with `None`.
    unsent_too: bool,
    /// The node the attempt in flight was sent to after `ASK` (sent there
    /// again after its script is loaded there).
    asked: Option<String>,
    /// Fired by the wheel when a pause ends (made on the first pause).
    pause: Option<Arc<Cell>>,
}

enum State {
    /// To send (to the node at `ask`, after `ASKING`, if given).
    Send {
        ask: Option<String>,
    },
    /// On the wire.
    Sent {
        slot: Arc<ReplySlot>,
        mux: Arc<Mux>,
        /// The node's `host:port` (cluster), against which a redirect
        /// naming only a port is read.
        node: Option<String>,
        asking: bool,
        /// The slot holds `SCRIPT LOAD`'s reply, not the command's.
        loading: bool,
    },
    /// Waiting on the backoff before sending again.
    Paused(Wait),
    Done,
}

impl Call {
    /// Marks this call as a resend of a request whose earlier attempt may
    /// have run unanswered: should the future be dropped before this
    /// attempt is on the wire (or with it never sent), its orphan is
    /// called with `None` all the same, so that it asks Redis what the
    /// earlier one did.
    pub(crate) fn resend_of_unresolved(mut self, unresolved: bool) -> Call {
        self.unsent_too = unresolved;
        self
    }

    /// The budget's end: `command_timeout` after the call began.
    fn budget_left(&self) -> Duration {
        self.rt
            .options
            .command_timeout
            .saturating_sub(self.started.elapsed())
    }

    /// Pauses for the backoff's next wait, if the budget allows.
    fn pause(&mut self) -> bool {
        let left = self.budget_left();
        if left.is_zero() {
            return false;
        }
        let d = self.backoff.step().min(left);
        let cell = self.pause.get_or_insert_with(Arc::default);
        cell.reset();
        self.state = State::Paused(self.rt.wait_for(cell, Some(d)));
        true
    }

    fn send(
        &mut self,
        (mux, node): Target,
        packed: Arc<[u8]>,
        count: usize,
        asking: bool,
        loading: bool,
    ) {
        let slot = Arc::new(ReplySlot::default());
        mux.send(Request {
            packed,
            count,
            slot: Arc::clone(&slot),
            send_by: self.started.checked_add(self.rt.options.command_timeout),
        });
        self.state = State::Sent {
            slot,
            mux,
            node,
            asking,
            loading,
        };
    }

    fn is_cluster(&self) -> bool {
        matches!(self.rt.backend, Backend::Cluster(_))
    }

    fn refresh_soon(&self) {
        if let Backend::Cluster(c) = &self.rt.backend {
            self.rt.asynk.refresh_soon(c);
        }
    }

    /// Reads the replies of the command: done, or what to do next.
    fn on_replies(
        &mut self,
        (mux, node): Target,
        mut values: Vec<Value>,
        asking: bool,
    ) -> Option<Vec<Value>> {
        if asking && !values.is_empty() {
            values.remove(0); // ASKING's +OK
        }
        let Some(Value::ServerError(err)) = values.first() else {
            return Some(values);
        };
        let e: redis::RedisError = err.clone().into();
        if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
            && let Some(script) = self.command.script
            && self.budget_left() > Duration::ZERO
        {
            // Not run: load it where it was sent, then send again.
            self.send((mux, node), load_command(script).into(), 1, false, true);
            return None;
        }
        if !self.is_cluster() {
            return Some(values);
        }
        // A redirect naming only a port (`:7001`, from a node that does
        // not know its own host) is to the redirecting node's host.
        let target = |addr: &str| match &node {
            Some(from) => redirect_target(from, addr),
            None => addr.to_owned(),
        };
        match step_after(&e) {
            Step::Ask(addr) if self.redirects < MAX_REDIRECTS => {
                self.redirects += 1;
                self.state = State::Send {
                    ask: Some(target(&addr)),
                };
                None
            }
            Step::Moved(addr) if self.redirects < MAX_REDIRECTS => {
                self.redirects += 1;
                if let Backend::Cluster(c) = &self.rt.backend {
                    // Route it where the reply says at once (as the
                    // synchronous call does); the refresh fixes the rest.
                    c.moved(slot(self.route.as_bytes()), &target(&addr));
                }
                self.refresh_soon();
                self.state = State::Send { ask: None };
                None
            }
            Step::Wait { refresh } => {
                if refresh {
                    self.refresh_soon();
                }
                if self.pause() { None } else { Some(values) }
            }
            _ => Some(values),
        }
    }
}

impl Future for Call {
    type Output = Result<Vec<Value>, Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        loop {
            match &mut this.state {
                State::Done => {
                    return Poll::Ready(Err(Error::new(
                        ErrorKind::Protocol,
                        "a redis call was polled after it completed",
                    )));
                }
                State::Paused(wait) => {
                    if Pin::new(wait).poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                    if this.rt.is_shut_down() {
                        this.state = State::Done;
                        return Poll::Ready(Err(crate::runtime::pool::shut_down()));
                    }
                    this.state = State::Send { ask: None };
                }
                State::Send { ask } => {
                    let ask = ask.take();
                    this.asked.clone_from(&ask);
                    match this.rt.mux_for(&this.route, ask.as_deref()) {
                        Ok(Some(to)) => {
                            let (packed, count) = match &ask {
                                Some(_) => {
                                    let mut p = b"*1\r\n$6\r\nASKING\r\n".to_vec();
                                    p.extend_from_slice(&this.command.packed);
                                    (p.into(), this.command.count + 1)
                                }
                                None => (Arc::clone(&this.command.packed), this.command.count),
                            };
                            this.send(to, packed, count, ask.is_some(), false);
                        }
                        Ok(None) => {
                            if !this.pause() {
                                this.state = State::Done;
                                return Poll::Ready(Err(Error::new(
                                    ErrorKind::Unavailable,
                                    "no master of the cluster serves the slot right now",
                                )));
                            }
                        }
                        Err(e) => {
                            this.state = State::Done;
                            return Poll::Ready(Err(e));
                        }
                    }
                }
                State::Sent {
                    slot,
                    mux,
                    node,
                    asking,
                    loading,
                } => {
                    let result = match slot.poll_result(cx) {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(r) => r,
                    };
                    let (to, asking, loading) = ((Arc::clone(mux), node.take()), *asking, *loading);
                    this.state = State::Done;
                    match result {
                        Ok(values) if loading => match values.first() {
                            Some(Value::ServerError(err)) => {
                                let e: redis::RedisError = err.clone().into();
                                return Poll::Ready(Err(Error::from_redis(e, Access::Read)));
                            }
                            // Loaded where it was sent: sent there again.
                            _ => {
                                this.state = State::Send {
                                    ask: this.asked.take(),
                                }
                            }
                        },
                        Ok(values) => {
                            if let Some(done) = this.on_replies(to, values, asking) {
                                this.state = State::Done;
                                return Poll::Ready(Ok(done));
                            }
                        }
                        Err(TryRunError::NotSent(e)) => {
                            // Nothing was written: on a cluster, the master may
                            // be failing over; wait and try again.
                            if this.is_cluster() && e.is_transient() {
                                this.refresh_soon();
                                if this.pause() {
                                    continue;
                                }
                            }
                            return Poll::Ready(Err(e));
                        }
                        Err(TryRunError::Failed(e)) => {
                            // It may have been applied: never sent again.
                            this.refresh_soon();
                            let access = if loading { Access::Read } else { this.access };
                            return Poll::Ready(Err(Error::from_redis(e, access)));
                        }
                    }
                }
            }
        }
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        let State::Sent {
            slot,
            asking,
            loading: false,
            ..
        } = &self.state
        else {
            // The command is not on the wire (to send, paused, or behind
            // its script's `SCRIPT LOAD`), or the call completed.
            let unsent = !matches!(self.state, State::Done | State::Sent { .. });
            let loading = matches!(self.state, State::Sent { loading: true, .. });
            if self.unsent_too
                && (unsent || loading)
                && let Some(f) = self.orphan.take()
            {
                super::io::contained("a dropped future's orphan", || f(None));
            }
            if let State::Sent { slot, .. } = &self.state {
                slot.abandon(Abandoned {
                    orphan: None,
                    unsent_too: false,
                });
            }
            return;
        };
        {
            let orphan = self.orphan.take();
            let orphan = match (orphan, *asking) {
                (Some(f), true) => Some(Box::new(move |mut v: Option<Vec<Value>>| {
                    if let Some(v) = &mut v
                        && !v.is_empty()
                    {
                        v.remove(0);
                    }
                    f(v)
                }) as Orphan),
                (f, _) => f,
            };
            slot.abandon(Abandoned {
                orphan,
                unsent_too: self.unsent_too,
            });
        }
    }
}

/// `SCRIPT LOAD` of `script`, packed: recorded from the `redis` crate's
/// own loading (the one that knows the script's source), without I/O.
fn load_command(script: &redis::Script) -> Vec<u8> {
    struct Record(Vec<u8>, Value);
    impl redis::ConnectionLike for Record {
        fn req_packed_command(&mut self, cmd: &[u8]) -> redis::RedisResult<Value> {
            self.0.extend_from_slice(cmd);
            Ok(self.1.clone())
        }
        fn req_packed_commands(
            &mut self,
            cmd: &[u8],
            _offset: usize,
            _count: usize,
        ) -> redis::RedisResult<Vec<Value>> {
            self.0.extend_from_slice(cmd);
            Ok(Vec::new())
        }
        fn get_db(&self) -> i64 {
            0
        }
        fn check_connection(&mut self) -> bool {
            true
        }
        fn is_open(&self) -> bool {
            true
        }
    }
    let hash = Value::BulkString(script.get_hash().as_bytes().to_vec());
    let mut record = Record(Vec::new(), hash);
    let _ = script.load(&mut record);
    record.0
}

/// The first reply of `values`, with an error reply as the caller's
/// [`Error`] (classified by `access`).
pub(crate) fn first_reply(values: Vec<Value>, access: Access) -> Result<Value, Error> {
    match values.into_iter().next() {
        Some(Value::ServerError(err)) => Err(Error::from_redis(err.into(), access)),
        Some(v) => Ok(v),
        None => Err(Error::new(ErrorKind::Protocol, "redis sent no reply")),
    }
}
