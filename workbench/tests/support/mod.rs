//! Test support of the workbench's tests: the library's own
//! (`tests/support/` at the repository root: private servers, clusters,
//! the fault proxy), and what only tests here need: headless Chromium
//! (`browser.rs`) and a Prometheus scrape (`metrics.rs`).
#![allow(dead_code)]

#[path = "../../../tests/support/mod.rs"]
mod shared;
pub use shared::*;

pub mod browser;
#[cfg(feature = "metrics")]
pub mod metrics;
