//! Metrics scraped over HTTP (placeholder).
