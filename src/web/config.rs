//! A dashboard's settings (what `Dashboard`'s builder methods set), read by
//! the server, the pages and the documents: the lowest layer of `web/`.

use std::time::Duration;

/// Settings of a dashboard, checked by `serve`.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub token: Option<String>,
    pub read_only: bool,
    pub refresh: Duration,
    pub rescan: Duration,
    pub page_timeout: Duration,
    pub overdue_alert: Duration,
    /// Host names a request's `Host` may name besides the listening
    /// address (`Dashboard::allow_host`), lowercase.
    pub allow_hosts: Vec<String>,
    /// Connection threads: connections served at once.
    pub workers: usize,
    /// Accepted connections waiting for a thread; past them, 503.
    pub backlog: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            token: None,
            read_only: false,
            refresh: Duration::from_secs(2),
            rescan: Duration::from_secs(30),
            page_timeout: Duration::from_secs(2),
            overdue_alert: Duration::from_secs(60),
            allow_hosts: Vec::new(),
            workers: 32,
            backlog: 64,
        }
    }
}
