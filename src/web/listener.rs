//! The dashboard's own HTTP/1.1 server on std: an accept thread, a bounded
//! queue of accepted connections, and a fixed pool of connection threads
//! that each read one request ([`request`](super::request): every size
//! bounded, a deadline on the whole request), answer it and close.
//!
//! What is bounded, and how:
//! * size: request line, head and body (`request.rs`);
//! * time: [`READ_DEADLINE`] to read a request, [`WRITE_DEADLINE`] to
//!   write its answer, then a bounded gentle close (`response.rs`);
//! * connections: [`Config::workers`] threads serve one connection each;
//!   up to [`Config::backlog`] more wait in the queue; past that, the
//!   accept thread answers 503 at once and closes;
//! * failure: an accept that fails (out of descriptors, say) is retried
//!   after a pause that grows to 1 s, never the end of the listener; a
//!   handler that panics answers 500 and its thread goes on;
//! * stop: [`Http::stop`] wakes the accept thread, shuts down every live
//!   connection (a blocked read or write returns at once), drops the
//!   queued ones and joins every thread.
//!
//! Why not a crate: `tiny_http` bounds none of this; `hyper` bounds the
//! head (size, count, read timeout) but leaves the body, the connection
//! count, the write time and the shutdown of live connections to the
//! caller, and needs an async runtime (tokio) plus an adapter for the
//! dashboard's blocking handlers. ARCHITECTURE.md has the weighing.
//!
//! [`Config::workers`]: super::config::Config
//! [`Config::backlog`]: super::config::Config

use std::collections::HashMap;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, TrySendError};
use parking_lot::Mutex;

use super::model;
use super::request::{self, Request, Unread};
use super::response::{self, Reply};

/// The longest a client may take to send one whole request.
pub(crate) const READ_DEADLINE: Duration = Duration::from_secs(10);
/// The longest a client may take to read one answer.
pub(crate) const WRITE_DEADLINE: Duration = Duration::from_secs(30);
/// The longest pause between two accepts that failed.
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// What answers a request.
pub(crate) type Handler = dyn Fn(&Request) -> Reply + Send + Sync;

/// The connections being served, so that `stop` can shut them down.
#[derive(Default)]
struct Live {
    conns: Mutex<HashMap<u64, Arc<TcpStream>>>,
    next: AtomicU64,
}

/// A running server.
pub(crate) struct Http {
    addr: SocketAddr,
    stopping: Arc<AtomicBool>,
    live: Arc<Live>,
    /// Dropped by `stop`: wakes the accept thread out of a pause.
    wake: Mutex<Option<Sender<()>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    accept: Mutex<Option<JoinHandle<()>>>,
}

impl Http {
    /// Serves `listener` with `workers` connection threads and a queue of
    /// `backlog`.
    pub(crate) fn start(
        listener: TcpListener,
        addr: SocketAddr,
        workers: usize,
        backlog: usize,
        handler: Arc<Handler>,
    ) -> std::io::Result<Http> {
        let (tx, rx) = crossbeam_channel::bounded::<TcpStream>(backlog);
        let (wake_tx, wake_rx) = crossbeam_channel::bounded::<()>(0);
        let http = Http {
            addr,
            stopping: Arc::new(AtomicBool::new(false)),
            live: Arc::new(Live::default()),
            wake: Mutex::new(Some(wake_tx)),
            threads: Mutex::new(Vec::new()),
            accept: Mutex::new(None),
        };
        for i in 0..workers {
            let (rx, stop, handler) = (rx.clone(), wake_rx.clone(), Arc::clone(&handler));
            let (live, stopping) = (Arc::clone(&http.live), Arc::clone(&http.stopping));
            let spawned = std::thread::Builder::new()
                .name(format!("redwheel-web-{i}"))
                .spawn(move || work(&rx, &stop, &*handler, &live, &stopping));
            match spawned {
                Ok(h) => http.threads.lock().push(h),
                Err(e) => {
                    drop(tx);
                    http.stop();
                    return Err(e);
                }
            }
        }
        drop(rx);
        let stopping = Arc::clone(&http.stopping);
        let spawned = std::thread::Builder::new()
            .name("redwheel-web-accept".to_owned())
            .spawn(move || accept(&listener, &tx, &wake_rx, &stopping));
        match spawned {
            Ok(h) => *http.accept.lock() = Some(h),
            Err(e) => {
                http.stop();
                return Err(e);
            }
        }
        Ok(http)
    }

    /// Stops: no new connection, every live one shut down, every thread
    /// joined, the listener closed. Idempotent.
    pub(crate) fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        drop(self.wake.lock().take());
        if let Some(accept) = self.accept.lock().take() {
            // A blocked accept returns on a connection: make one.
            let mut to = self.addr;
            if to.ip().is_unspecified() {
                to.set_ip(match to {
                    SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
                    SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
                });
            }
            match TcpStream::connect_timeout(&to, Duration::from_secs(1)) {
                Ok(_) => {
                    let _ = accept.join();
                }
                // The accept thread ends at its next connection or failed
                // accept; it is not waited for.
                Err(e) => {
                    tracing::warn!(target: "redwheel::web", error = %e, "cannot wake the dashboard's accept thread; the listener closes at its next connection")
                }
            }
        }
        for s in self.live.conns.lock().values() {
            let _ = s.shutdown(Shutdown::Both);
        }
        let threads = std::mem::take(&mut *self.threads.lock());
        for t in threads {
            let _ = t.join();
        }
    }
}

fn accept(
    listener: &TcpListener,
    tx: &Sender<TcpStream>,
    wake: &Receiver<()>,
    stopping: &AtomicBool,
) {
    let mut backoff = Duration::from_millis(10);
    let mut failing = false;
    loop {
        let accepted = listener.accept();
        if stopping.load(Ordering::SeqCst) {
            return;
        }
        match accepted {
            Ok((s, _)) => {
                failing = false;
                backoff = Duration::from_millis(10);
                match tx.try_send(s) {
                    Ok(()) => {}
                    Err(TrySendError::Full(s)) => refuse_busy(s),
                    Err(TrySendError::Disconnected(_)) => return,
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::Interrupted | std::io::ErrorKind::ConnectionAborted
                ) => {}
            Err(e) => {
                // Out of descriptors or memory: the connection stays in the
                // kernel's backlog until one is free again.
                if failing {
                    tracing::debug!(target: "redwheel::web", error = %e, "the dashboard still cannot accept a connection");
                } else {
                    tracing::warn!(target: "redwheel::web", error = %e, "the dashboard cannot accept a connection; retrying");
                    failing = true;
                }
                if wake.recv_timeout(backoff).is_err() && stopping.load(Ordering::SeqCst) {
                    return;
                }
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
}

/// A 503 for a connection past the queue, sent without waiting.
fn refuse_busy(s: TcpStream) {
    let reply = Reply::json(
        503,
        &model::error(
            "unavailable",
            "the dashboard is serving as many connections as it takes; try again",
        ),
    );
    let mut r = reply;
    r.extra.push(("Retry-After", "1".to_owned()));
    if s.set_nonblocking(true).is_ok() {
        let mut w = &s;
        let _ = std::io::Write::write(&mut w, &r.encode());
    }
    let _ = s.shutdown(Shutdown::Write);
}

/// A connection thread: serves the queue's connections one by one until
/// the server stops (`stop` disconnects).
fn work(
    rx: &Receiver<TcpStream>,
    stop: &Receiver<()>,
    handler: &Handler,
    live: &Live,
    stopping: &AtomicBool,
) {
    loop {
        let s = crossbeam_channel::select! {
            recv(rx) -> s => match s {
                Ok(s) => s,
                Err(_) => return,
            },
            recv(stop) -> _ => return,
        };
        if stopping.load(Ordering::SeqCst) {
            return; // `s` dropped: closed
        }
        let s = Arc::new(s);
        let id = live.next.fetch_add(1, Ordering::Relaxed);
        live.conns.lock().insert(id, Arc::clone(&s));
        // `stop` may have swept the live connections just before.
        if stopping.load(Ordering::SeqCst) {
            let _ = s.shutdown(Shutdown::Both);
        }
        serve(&s, handler);
        live.conns.lock().remove(&id);
    }
}

/// One connection: one request, its answer, the close.
fn serve(s: &TcpStream, handler: &Handler) {
    let reply = match request::read(s, Instant::now() + READ_DEADLINE) {
        Ok(req) => catch_unwind(AssertUnwindSafe(|| handler(&req))).unwrap_or_else(|_| {
            tracing::error!(target: "redwheel::web", target_url = %req.target, "a dashboard request panicked");
            Reply::json(500, &model::error("internal", "internal error"))
        }),
        Err(Unread::Closed) => return,
        Err(Unread::Refused(status, why)) => {
            tracing::debug!(target: "redwheel::web", status, why, "request refused");
            Reply::json(status, &model::error("bad request", why))
        }
    };
    if response::write_all(s, &reply.encode(), Instant::now() + WRITE_DEADLINE).is_ok() {
        response::close(s);
    }
}
