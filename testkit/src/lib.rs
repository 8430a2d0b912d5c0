//! What redwheel's examples and doc tests share (not published):
//!
//! * [`ThrowawayRedis`]: a private `redis-server` on a free loopback port,
//!   stopped on drop, for the examples;
//! * [`redis_url`]: the Redis a doc test runs against, `REDIS_URL` if set,
//!   else a throwaway server kept for the process and gone with it;
//! * [`block_on`]: runs a future to completion on the calling thread, so
//!   the async chapters of the guide run without an executor crate.
//!
//! std only, so that `cargo run --example quickstart` compiles it in an
//! instant.

#![deny(missing_docs)]

use std::future::Future;
use std::pin::pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::{self, Thread};

mod throwaway_redis;
pub use throwaway_redis::ThrowawayRedis;

/// The URL of the Redis to use: `REDIS_URL` if it is set, otherwise that
/// of a throwaway `redis-server` started on the first call and shared by
/// every later call of the process ([`ThrowawayRedis::for_process`]: it
/// goes with the process, however the process ends).
///
/// # Panics
///
/// If there is no `REDIS_URL` and `redis-server` cannot be started; the
/// message says why (for a doc test, a failure to set up).
pub fn redis_url() -> String {
    if let Ok(url) = std::env::var("REDIS_URL") {
        return url;
    }
    static SHARED: OnceLock<Result<ThrowawayRedis, String>> = OnceLock::new();
    match SHARED.get_or_init(|| ThrowawayRedis::for_process("doctest").map_err(|e| e.to_string())) {
        Ok(server) => server.url(),
        Err(e) => panic!("{e}"),
    }
}

/// Runs `future` to completion on the calling thread, parking it while the
/// future is pending; any executor's `block_on` does the same
/// (`tokio::runtime::Runtime::block_on`, `smol::block_on`,
/// `futures::executor::block_on`).
pub fn block_on<F: Future>(future: F) -> F::Output {
    /// Wakes the blocked thread.
    struct Unpark(Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
        fn wake_by_ref(self: &Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut future = pin!(future);
    loop {
        match future.as_mut().poll(&mut cx) {
            Poll::Ready(out) => return out,
            // A wake before the park makes the park return at once.
            Poll::Pending => thread::park(),
        }
    }
}
