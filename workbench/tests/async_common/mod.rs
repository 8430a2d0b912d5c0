//! What the async tests (`tests/async_*.rs`) share: a server and a
//! `Redwheel`, and the executors they run on, each future bounded by a
//! hang guard.
#![allow(dead_code)] // each test binary uses a different part

use std::future::Future;
use std::time::Duration;

use redwheel::Redwheel;

use crate::support::RedisServer;

/// Fails a test rather than hanging it (not a timing claim).
pub const HANG: Duration = Duration::from_secs(60);

/// A private server and a `Redwheel` on it.
pub fn setup() -> (RedisServer, Redwheel) {
    let server = RedisServer::start();
    let rw = Redwheel::connect(&server.url()).expect("connect");
    (server, rw)
}

/// Runs `f` on tokio's current-thread executor.
pub fn tokio_current<F: Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap()
        .block_on(async { tokio::time::timeout(HANG, f).await.expect("hung") })
}

/// Runs `f` on tokio's multi-thread executor (two workers).
pub fn tokio_multi<F: Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap()
        .block_on(async { tokio::time::timeout(HANG, f).await.expect("hung") })
}

/// A waker that records that it was woken.
#[derive(Default)]
pub struct Probe(std::sync::atomic::AtomicBool);

impl std::task::Wake for Probe {
    fn wake(self: std::sync::Arc<Self>) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Probe {
    /// True once woken (since the last poll).
    pub fn woken(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// A future polled by hand (no executor), so a test drops it exactly
/// where it means to.
pub struct Manual<F: Future> {
    fut: std::pin::Pin<Box<F>>,
    probe: std::sync::Arc<Probe>,
}

impl<F: Future> Manual<F> {
    pub fn new(fut: F) -> Manual<F> {
        Manual {
            fut: Box::pin(fut),
            probe: std::sync::Arc::default(),
        }
    }

    /// Polls it once with the probe's waker.
    pub fn poll(&mut self) -> std::task::Poll<F::Output> {
        self.probe
            .0
            .store(false, std::sync::atomic::Ordering::SeqCst);
        let waker = std::task::Waker::from(std::sync::Arc::clone(&self.probe));
        self.fut
            .as_mut()
            .poll(&mut std::task::Context::from_waker(&waker))
    }

    /// Polls it once with `waker` instead of the probe's.
    pub fn poll_with(&mut self, waker: &std::task::Waker) -> std::task::Poll<F::Output> {
        self.fut
            .as_mut()
            .poll(&mut std::task::Context::from_waker(waker))
    }

    /// Waits until the future was woken (its reply came).
    pub fn wait_woken(&self) {
        wait_for("the future to be woken", || self.probe.woken());
    }

    /// Polls until it is ready.
    pub fn finish(mut self) -> F::Output {
        let deadline = std::time::Instant::now() + HANG;
        loop {
            if let std::task::Poll::Ready(v) = self.poll() {
                return v;
            }
            while !self.probe.woken() {
                assert!(std::time::Instant::now() < deadline, "hang guard");
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
}

/// Waits for `cond` (an event: a state in Redis, a flag), with a hang
/// guard.
pub fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + HANG;
    while !cond() {
        assert!(std::time::Instant::now() < deadline, "hang guard: {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}
