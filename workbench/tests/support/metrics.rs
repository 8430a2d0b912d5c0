//! Test support: metrics scraped over HTTP (feature `metrics`).
//!
//! One `metrics-exporter-prometheus` recorder per test binary, installed
//! before any `Redwheel` connects; a `/metrics` endpoint on an OS-picked
//! port, served by the examples' tiny HTTP responder
//! (`examples/support/metrics_http.rs`); and a reader of the text format
//! that compares scrapes.

#[path = "../../examples/support/metrics_http.rs"]
pub mod metrics_http;

use std::collections::{BTreeMap, HashMap};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use metrics_http::MetricsServer;

/// How long a polled condition may take to hold.
pub const WAIT: Duration = Duration::from_secs(30);

/// The process's recorder, installed once.
pub fn recorder() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        PrometheusBuilder::new()
            .set_buckets_for_metric(
                Matcher::Suffix("_seconds".to_owned()),
                &[0.001, 0.01, 0.1, 1.0, 10.0],
            )
            .unwrap()
            .install_recorder()
            .expect("the only recorder of this test binary")
    })
}

/// A `/metrics` endpoint on an OS-picked port, serving the recorder.
pub fn endpoint() -> MetricsServer {
    let handle = recorder().clone();
    MetricsServer::start("127.0.0.1:0", move || {
        handle.run_upkeep();
        handle.render()
    })
    .unwrap()
}

/// One scrape: series (name and sorted labels) → value.
#[derive(Debug)]
pub struct Scrape(HashMap<String, f64>);

impl Scrape {
    pub fn of(server: &MetricsServer) -> Scrape {
        let (status, body) = metrics_http::get(server.addr(), "/metrics").unwrap();
        assert_eq!(status, 200, "{body}");
        Scrape::parse(&body)
    }

    /// The text format: `name{k="v",…} value` lines; `#` lines are help
    /// and type.
    pub fn parse(text: &str) -> Scrape {
        let mut series = HashMap::new();
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (metric, value) = line.rsplit_once(' ').expect("`series value`");
            let value: f64 = value.parse().unwrap_or_else(|_| panic!("a value: {line}"));
            let (name, labels) = match metric.split_once('{') {
                Some((name, rest)) => (name, rest.trim_end_matches('}')),
                None => (metric, ""),
            };
            let labels: Vec<(&str, &str)> = labels
                .split(',')
                .filter(|l| !l.is_empty())
                .map(|l| {
                    let (k, v) = l.split_once('=').expect("k=\"v\"");
                    (k, v.trim_matches('"'))
                })
                .collect();
            series.insert(key(name, &labels), value);
        }
        Scrape(series)
    }

    /// The value of a series, if exported.
    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.0.get(&key(name, labels)).copied()
    }

    /// The value of a series that must be exported.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.get(name, labels)
            .unwrap_or_else(|| panic!("no series {}", key(name, labels)))
    }
}

pub fn key(name: &str, labels: &[(&str, &str)]) -> String {
    let sorted: BTreeMap<&str, &str> = labels.iter().copied().collect();
    let labels: Vec<String> = sorted.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!("{name}{{{}}}", labels.join(","))
}

/// How much a series grew between two scrapes (absent before: from 0).
pub fn delta(before: &Scrape, after: &Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
    after.value(name, labels) - before.get(name, labels).unwrap_or(0.0)
}

/// Polls `f` until it gives `Some`, failing after [`WAIT`].
pub fn until<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Scrapes until series `name` has grown by `by` since `before` (a
/// driver-side count may lag what a consumer already saw), then returns
/// that scrape; fails if it grows past `by` or not within [`WAIT`].
pub fn scrape_when(
    http: &MetricsServer,
    before: &Scrape,
    name: &str,
    labels: &[(&str, &str)],
    by: f64,
) -> Scrape {
    until(&format!("{name} to grow by {by}"), || {
        let s = Scrape::of(http);
        let grown = s.get(name, labels).unwrap_or(0.0) - before.get(name, labels).unwrap_or(0.0);
        assert!(grown <= by, "{name} grew by {grown}, more than {by}");
        (grown == by).then_some(s)
    })
}
