//! One server's multiplexed connection ([`Mux`]): a pipelined connection
//! served by one I/O thread, and the [`ReplySlot`] each request's replies
//! are delivered to.
//!
//! The I/O thread writes every request waiting on its channel in one
//! write, then reads one reply, hands it to the oldest request on the
//! wire, and writes whatever arrived meanwhile before reading the next:
//! the commands of many tasks go out together and Redis always has the
//! next ones while it answers the last, as in redis-rs's multiplexed
//! connection, with a thread instead of a runtime. Replies come back in
//! the order the commands were written (Redis answers one connection in
//! order), so the requests on the wire are a FIFO.
//!
//! The connection is opened by the I/O thread on demand, through the
//! node's [`Endpoint`] (TLS, credentials, database: the one place
//! connections are made). When it fails, every request on the wire fails
//! as [`TryRunError::Failed`] (it may have been applied: a write becomes
//! `OutcomeUnknown`), nothing is resent, and the next request opens a new
//! one; connects are paced by the reconnect backoff, and a request that
//! arrives while the last connect failed within the backoff fails at once
//! as [`TryRunError::NotSent`] (nothing was written). A connection that
//! sat idle for [`CHECK_IDLE_AFTER`] is checked with a `PING` before it
//! carries a request (as the synchronous pool's are): one that died
//! meanwhile (a restart, the server's idle timeout) is replaced before
//! anything is written, rather than failing a write as of unknown outcome.
//!
//! Every request's slot is completed exactly once, whatever happens: a
//! request still in the channel when the I/O thread ends (sent just as the
//! mux closed) fails as not sent when the channel drops it, and user code
//! run on the I/O thread (a waker, a dropped future's [`Orphan`] and the
//! background work it starts) is caught if it panics, so it cannot end the
//! node's I/O for every other future.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Waker};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, TryRecvError};
use parking_lot::Mutex;
use redis::Value;

use crate::error::{Error, ErrorKind};
use crate::runtime::backoff::Backoff;
use crate::runtime::endpoint::Endpoint;
use crate::runtime::pool::{CHECK_IDLE_AFTER, TryRunError, shut_down};

/// What happens to the replies of a request whose future was dropped
/// before it read them, on the thread that learns of them: called with
/// the replies if they came (error replies included), or with `None` if
/// the connection failed after the request was sent (it may have run).
/// Not called for a request that was never sent, unless the request asks
/// for it ([`Abandoned::unsent_too`]).
pub(crate) type Orphan = Box<dyn FnOnce(Option<Vec<Value>>) + Send>;

/// What a dropped future leaves its request's slot: the orphan, and
/// whether it is called (with `None`) if the request is never sent too (a
/// resend of a request whose earlier attempt may have run: that attempt
/// still needs an answer).
pub(crate) struct Abandoned {
    pub(crate) orphan: Option<Orphan>,
    pub(crate) unsent_too: bool,
}

impl Abandoned {
    /// Hands `result` to the orphan as [`Orphan`] says.
    fn settle(self, result: Result<Vec<Value>, TryRunError>) {
        let Some(f) = self.orphan else { return };
        match result {
            Ok(values) => contained("a dropped future's orphan", || f(Some(values))),
            Err(TryRunError::Failed(_)) => contained("a dropped future's orphan", || f(None)),
            Err(TryRunError::NotSent(_)) if self.unsent_too => {
                contained("a dropped future's orphan", || f(None));
            }
            Err(TryRunError::NotSent(_)) => {}
        }
    }
}

/// Runs `f`, user code or work it started (a waker, an [`Orphan`]) on
/// redwheel's I/O thread, catching and logging a panic (`who` names it),
/// so that the thread goes on serving every other future.
pub(crate) fn contained(who: &str, f: impl FnOnce()) {
    if let Err(panic) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a non-string panic payload".to_owned());
        tracing::error!(target: "redwheel::runtime", "{who} panicked on a redwheel thread: {what}");
    }
}

/// Where one request's replies go: the I/O thread fills it, the request's
/// future reads it.
#[derive(Default)]
pub(crate) struct ReplySlot {
    state: Mutex<SlotState>,
}

#[derive(Default)]
struct SlotState {
    result: Option<Result<Vec<Value>, TryRunError>>,
    waker: Option<Waker>,
    /// The future is gone: deliver the replies here instead (or drop them).
    abandoned: Option<Abandoned>,
    /// Completed (the result may have been read since): later completions
    /// are ignored.
    done: bool,
}

impl ReplySlot {
    /// Delivers the result (on the I/O thread), once: a slot already
    /// completed keeps its first result.
    pub(crate) fn complete(&self, result: Result<Vec<Value>, TryRunError>) {
        let mut st = self.state.lock();
        if st.done {
            return;
        }
        st.done = true;
        if let Some(abandoned) = st.abandoned.take() {
            drop(st);
            abandoned.settle(result);
            return;
        }
        st.result = Some(result);
        let waker = st.waker.take();
        drop(st);
        if let Some(w) = waker {
            contained("a future's waker", || w.wake());
        }
    }

    /// The result, once it came.
    pub(crate) fn poll_result(
        &self,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Vec<Value>, TryRunError>> {
        let mut st = self.state.lock();
        match st.result.take() {
            Some(r) => Poll::Ready(r),
            None => {
                match &mut st.waker {
                    Some(w) if w.will_wake(cx.waker()) => {}
                    slot => *slot = Some(cx.waker().clone()),
                }
                Poll::Pending
            }
        }
    }

    /// The future reading this slot is dropped: replies that came (or
    /// come) go to its orphan, as `abandoned` says.
    pub(crate) fn abandon(&self, abandoned: Abandoned) {
        let mut st = self.state.lock();
        match st.result.take() {
            Some(result) => {
                drop(st);
                abandoned.settle(result);
            }
            None if st.done => {} // read already: nothing is left to hand on
            None => {
                st.waker = None;
                st.abandoned = Some(abandoned);
            }
        }
    }
}

/// One request: packed commands and where their replies go.
pub(crate) struct Request {
    pub(crate) packed: Arc<[u8]>,
    /// Replies expected (one per command).
    pub(crate) count: usize,
    pub(crate) slot: Arc<ReplySlot>,
    /// Past this instant it is not sent any more (the caller's budget is
    /// spent): it fails as not sent. `None`: no limit (a budget too long
    /// for an `Instant`).
    pub(crate) send_by: Option<Instant>,
}

impl Drop for Request {
    /// A request dropped before its slot was completed was never written
    /// (those written are completed by the I/O thread, and by
    /// [`Io`]'s drop if it unwinds): the channel dropped it as the mux
    /// closed. Its future learns so instead of waiting forever.
    fn drop(&mut self) {
        self.slot.complete(Err(TryRunError::NotSent(shut_down())));
    }
}

enum Msg {
    Request(Request),
    Close,
}

/// How a `Mux` connects and paces itself.
#[derive(Clone)]
pub(crate) struct MuxConfig {
    pub(crate) io_timeout: Duration,
    pub(crate) reconnect: (Duration, Duration),
}

/// One server's multiplexed connection and its I/O thread (started on
/// first use, ended by [`close`](Mux::close) or drop).
pub(crate) struct Mux {
    tx: Sender<Msg>,
    closed: Arc<AtomicBool>,
}

impl Mux {
    /// Starts the I/O thread for `endpoint`.
    pub(crate) fn start(endpoint: Arc<Endpoint>, config: MuxConfig) -> Result<Mux, Error> {
        let (tx, rx) = crossbeam_channel::unbounded();
        let closed = Arc::new(AtomicBool::new(false));
        let c = Arc::clone(&closed);
        thread::Builder::new()
            .name("redwheel-mux".to_owned())
            .spawn(move || Io::new(endpoint, config, rx, c).run())
            .map_err(|e| {
                Error::new(ErrorKind::Spawn, "could not start the mux I/O thread").with_cause(e)
            })?;
        Ok(Mux { tx, closed })
    }

    /// Queues `request`; its slot gets the replies (or a shutdown error).
    pub(crate) fn send(&self, request: Request) {
        if self.closed.load(Ordering::Acquire) {
            request
                .slot
                .complete(Err(TryRunError::NotSent(shut_down())));
            return;
        }
        if let Err(e) = self.tx.send(Msg::Request(request)) {
            let Msg::Request(r) = e.0 else { return };
            r.slot.complete(Err(TryRunError::NotSent(shut_down())));
        }
    }

    /// Refuses new requests; those queued fail as not sent, those on the
    /// wire get their replies (within the I/O timeout), then the thread
    /// ends.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
        let _ = self.tx.send(Msg::Close);
    }
}

impl Drop for Mux {
    fn drop(&mut self) {
        self.close();
    }
}

/// The I/O thread's state.
struct Io {
    endpoint: Arc<Endpoint>,
    config: MuxConfig,
    rx: Receiver<Msg>,
    closed: Arc<AtomicBool>,
    con: Option<redis::Connection>,
    /// On the wire, oldest first, with the replies read so far.
    wire: VecDeque<(Request, Vec<Value>)>,
    backoff: Backoff,
    /// After a failed connect: no new attempt before this (`None`: none
    /// at all, the backoff being longer than an `Instant` reaches), and
    /// its error.
    down: Option<(Option<Instant>, Error)>,
    buf: Vec<u8>,
    closing: bool,
    /// When the connection last answered (or was opened): idle since.
    used: Instant,
}

impl Drop for Io {
    /// The thread is ending, unwinding from a panic if anything is still
    /// on the wire: those requests may have run.
    fn drop(&mut self) {
        for (req, _) in self.wire.drain(..) {
            req.slot
                .complete(Err(TryRunError::Failed(redis::RedisError::from(
                    std::io::Error::new(
                        std::io::ErrorKind::ConnectionAborted,
                        "the mux I/O thread ended with the command on the wire",
                    ),
                ))));
        }
    }
}

impl Io {
    fn new(
        endpoint: Arc<Endpoint>,
        config: MuxConfig,
        rx: Receiver<Msg>,
        closed: Arc<AtomicBool>,
    ) -> Io {
        let backoff = Backoff::new(config.reconnect.0, config.reconnect.1);
        Io {
            endpoint,
            config,
            rx,
            closed,
            con: None,
            wire: VecDeque::new(),
            backoff,
            down: None,
            buf: Vec::new(),
            closing: false,
            used: Instant::now(),
        }
    }

    fn run(mut self) {
        let mut batch: Vec<Request> = Vec::new();
        loop {
            // Take what is waiting; block for it only with nothing on the
            // wire.
            if self.wire.is_empty() && !self.closing {
                match self.rx.recv() {
                    Ok(m) => self.take(m, &mut batch),
                    Err(_) => self.closing = true,
                }
            }
            loop {
                match self.rx.try_recv() {
                    Ok(m) => self.take(m, &mut batch),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        self.closing = true;
                        break;
                    }
                }
            }
            if self.closing {
                for r in batch.drain(..) {
                    r.slot.complete(Err(TryRunError::NotSent(shut_down())));
                }
                if self.wire.is_empty() {
                    break;
                }
            }
            if !batch.is_empty() {
                self.write(&mut batch);
            }
            if !self.wire.is_empty() {
                self.read_one();
            }
        }
        tracing::debug!(target: "redwheel::runtime", node = self.endpoint.addr(), "mux I/O thread ends");
    }

    fn take(&mut self, m: Msg, batch: &mut Vec<Request>) {
        match m {
            Msg::Request(r) => batch.push(r),
            Msg::Close => self.closing = true,
        }
    }

    /// Writes `batch` in one write (connecting first if need be).
    fn write(&mut self, batch: &mut Vec<Request>) {
        let now = Instant::now();
        self.buf.clear();
        let mut sending = Vec::with_capacity(batch.len());
        for r in batch.drain(..) {
            if r.send_by.is_some_and(|by| now > by) {
                r.slot.complete(Err(TryRunError::NotSent(Error::new(
                    ErrorKind::Unavailable,
                    format!(
                        "no connection to redis at {} in time to send the command",
                        self.endpoint.addr()
                    ),
                ))));
                continue;
            }
            sending.push(r);
        }
        if sending.is_empty() {
            return;
        }
        if let Err(e) = self.connect() {
            for r in sending {
                r.slot.complete(Err(TryRunError::NotSent(copy(&e))));
            }
            return;
        }
        for r in &sending {
            self.buf.extend_from_slice(&r.packed);
        }
        let con = self.con.as_mut().expect("connected above");
        let written = con.send_packed_command(&self.buf);
        self.wire
            .extend(sending.into_iter().map(|r| (r, Vec::new())));
        if let Err(e) = written {
            // Part of it may have reached Redis.
            self.broken(&e);
        }
    }

    /// Opens the connection if there is none, unless the last attempt
    /// failed within the backoff.
    fn connect(&mut self) -> Result<(), Error> {
        self.check_idle();
        if self.con.is_some() {
            return Ok(());
        }
        if let Some((retry_at, e)) = &self.down
            && retry_at.is_none_or(|at| Instant::now() < at)
        {
            return Err(copy(e));
        }
        match self
            .endpoint
            .open_raw(self.config.io_timeout, self.config.io_timeout)
        {
            Ok(con) => {
                if self.down.take().is_some() {
                    tracing::info!(target: "redwheel::runtime", node = self.endpoint.addr(), "mux connection re-established");
                }
                self.backoff.reset();
                self.con = Some(con);
                self.used = Instant::now();
                Ok(())
            }
            Err(e) => {
                let wait = self.backoff.step();
                tracing::debug!(target: "redwheel::runtime", node = self.endpoint.addr(), error = %e, retry_in_ms = wait.as_millis() as u64, "mux: cannot connect");
                // A backoff too long for an `Instant`: no new attempt.
                self.down = Some((Instant::now().checked_add(wait), copy(&e)));
                Err(e)
            }
        }
    }

    /// Drops the connection if it sat idle for [`CHECK_IDLE_AFTER`] and
    /// does not answer a `PING` now (nothing of the next requests is
    /// written yet, so they go on a new one instead).
    fn check_idle(&mut self) {
        if !self.wire.is_empty() || self.used.elapsed() < CHECK_IDLE_AFTER {
            return;
        }
        let Some(con) = self.con.as_mut() else {
            return;
        };
        match redis::cmd("PING").query::<()>(con) {
            Ok(()) => self.used = Instant::now(),
            Err(e) => {
                tracing::debug!(target: "redwheel::runtime", node = self.endpoint.addr(), error = %e, "mux: the idle connection died; opening a new one");
                self.con = None;
            }
        }
    }

    /// Reads one reply and hands it to the oldest request on the wire.
    fn read_one(&mut self) {
        let Some(con) = self.con.as_mut() else {
            return;
        };
        match con.recv_response() {
            Ok(Value::Push { .. }) => {}
            Ok(v) => {
                self.used = Instant::now();
                let (req, got) = self.wire.front_mut().expect("a request on the wire");
                got.push(v);
                if got.len() == req.count {
                    let (req, got) = self.wire.pop_front().expect("just looked");
                    req.slot.complete(Ok(got));
                }
            }
            Err(e) => self.broken(&e),
        }
    }

    /// The connection failed: every request on the wire fails (it may
    /// have been applied), the connection is dropped.
    fn broken(&mut self, e: &redis::RedisError) {
        tracing::debug!(target: "redwheel::runtime", node = self.endpoint.addr(), error = %e, on_the_wire = self.wire.len(), "mux connection failed");
        self.con = None;
        for (req, _) in self.wire.drain(..) {
            req.slot.complete(Err(TryRunError::Failed(same_error(e))));
        }
        if self.closed.load(Ordering::Acquire) {
            self.closing = true;
        }
    }
}

/// A copy of `e` for another request (an `Error` is not `Clone`).
fn copy(e: &Error) -> Error {
    Error::new(e.kind(), e.to_string())
}

/// A copy of a connection error for another request: same kind, so it is
/// classified the same way (a timeout stays a timeout).
fn same_error(e: &redis::RedisError) -> redis::RedisError {
    let kind = if e.is_timeout() {
        std::io::ErrorKind::TimedOut
    } else if e.is_connection_refusal() {
        std::io::ErrorKind::ConnectionRefused
    } else {
        std::io::ErrorKind::ConnectionReset
    };
    redis::RedisError::from(std::io::Error::new(kind, e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn noop_cx() -> Context<'static> {
        Context::from_waker(Waker::noop())
    }

    /// A request sent as the mux closes (it passed the closed check just
    /// before `close`, or came after the I/O thread's last look at the
    /// channel) is still in the channel when the thread ends, and is
    /// dropped with it: its future learns of the shutdown.
    #[test]
    fn a_request_the_channel_drops_at_shutdown_completes_its_slot() {
        let (tx, rx) = crossbeam_channel::unbounded();
        let slot = Arc::new(ReplySlot::default());
        let request = Request {
            packed: Arc::from(&b"*1\r\n$4\r\nPING\r\n"[..]),
            count: 1,
            slot: Arc::clone(&slot),
            send_by: None,
        };
        assert!(tx.send(Msg::Request(request)).is_ok());
        drop(rx); // the I/O thread ends, its channel with it
        match slot.poll_result(&mut noop_cx()) {
            Poll::Ready(Err(TryRunError::NotSent(e))) => assert_eq!(e.kind(), ErrorKind::Shutdown),
            Poll::Ready(_) => panic!("another result"),
            Poll::Pending => panic!("its future would wait forever"),
        }
    }

    /// A slot completes once: a request dropped after its reply came keeps
    /// the reply.
    #[test]
    fn a_completed_slot_keeps_its_first_result() {
        let slot = Arc::new(ReplySlot::default());
        drop(Request {
            packed: Arc::from(&b""[..]),
            count: 1,
            slot: Arc::clone(&slot),
            send_by: None,
        });
        slot.complete(Ok(vec![Value::Okay]));
        assert!(matches!(
            slot.poll_result(&mut noop_cx()),
            Poll::Ready(Err(TryRunError::NotSent(_)))
        ));
        let slot = Arc::new(ReplySlot::default());
        slot.complete(Ok(vec![Value::Okay]));
        drop(Request {
            packed: Arc::from(&b""[..]),
            count: 1,
            slot: Arc::clone(&slot),
            send_by: None,
        });
        assert!(matches!(
            slot.poll_result(&mut noop_cx()),
            Poll::Ready(Ok(v)) if v == [Value::Okay]
        ));
    }
}
