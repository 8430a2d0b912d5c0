//! redwheel's workbench (not published): the benches (`benches/`,
//! criterion), the peer comparisons (`examples/bench_timer.rs` beside
//! tokio-util's `DelayQueue` and `hierarchical_hash_wheel_timer`,
//! `examples/bench_async.rs` beside redis-rs's async connection), the
//! Prometheus example, the async example under tokio, and the tests that
//! need what the library's own tests do not: a browser
//! (`tests/web_browser*.rs`), real executors (`tests/async_*.rs`, tokio
//! and smol), a certificate generator (`tests/runtime_tls.rs`) and a
//! Prometheus exporter (`tests/metrics.rs`). Kept apart so that the
//! library's own dev-dependencies, which every example builds, stay small.
//!
//! Nothing here is code: the package exists for its test, example and
//! bench targets.
