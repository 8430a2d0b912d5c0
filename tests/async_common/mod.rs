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
