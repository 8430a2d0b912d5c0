//! Serves redwheel's metrics for Prometheus (placeholder).
fn main() {}
