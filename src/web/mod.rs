//! The web dashboard (feature `web`): every queue, its messages and dead
//! letters, its controls and schedules, and the held locks, in a browser;
//! the same data as JSON; and the operator's actions (requeue dead letters,
//! remove a message, pause or resume a queue, trigger a schedule now,
//! force-unlock a lock).
//!
//! ```no_run
//! use redwheel::Redwheel;
//! use redwheel::web::Dashboard;
//!
//! let rw = Redwheel::connect("redis://127.0.0.1:6379")?;
//! let server = Dashboard::new(&rw).token("s3cret").serve("127.0.0.1:7780")?;
//! println!("dashboard on {}", server.url());
//! // … the service goes on; at shutdown:
//! server.stop();
//! # Ok::<(), redwheel::Error>(())
//! ```
//!
//! The command-line tool serves the same: `redwheel web --url redis://…
//! [--cluster …] [--listen 127.0.0.1:7780] [--token T] [--read-only]
//! [--allow-host NAME]…`.
//!
//! # Routes
//!
//! | route | what |
//! | --- | --- |
//! | `GET /` | every queue (as [`Redwheel::find_queues`] finds them), the queue in trouble on top |
//! | `GET /queues/{name}` | one queue: counts, controls (paused, limits), the first messages of each state, dead letters, schedules |
//! | `GET /locks` | held locks |
//! | `GET /api/queues` | a JSON array, one object per queue, in the overview's order |
//! | `GET /api/queues/{name}` | one queue as JSON (404 if it has no key in Redis) |
//! | `GET /api/locks` | a JSON array of held locks |
//! | `GET /api/status` | Redis reachable or not, the age of the overview's data, the last refresh's cost |
//! | `POST /api/queues/{name}/requeue-dead` | [`Queue::requeue_dead`]: `?count=N` oldest dead letters (1 to 1,000,000), or all (the default; needs `confirm=yes`) |
//! | `POST /api/queues/{name}/messages/{id}/remove` | [`Queue::remove`] (needs `confirm=yes`) |
//! | `POST /api/queues/{name}/pause` | [`Queue::pause`] |
//! | `POST /api/queues/{name}/resume` | [`Queue::resume`] |
//! | `POST /api/queues/{name}/schedules/{schedule}/trigger` | [`Queue::trigger_schedule`]: one message with the schedule's payload, due now |
//! | `POST /api/locks/{name}/force-unlock` | [`Lock::force_unlock`], of the acquisition shown only: needs `confirm=yes`, `holder` and `fencing_token` (as `GET /api/locks` lists them); 409 if the lock has changed hands since |
//!
//! An action's fields come as a form body
//! (`application/x-www-form-urlencoded`, as the page sends them) or in
//! the query: `confirm=yes` confirms a destructive action (force-unlock,
//! remove, requeue all), which is refused without it (400, kind
//! `confirmation needed`); `step=ask` (the first button of the page's
//! two-step actions) does nothing and answers the question (JSON
//! `{"ok": false, "confirm": "…?"}`, or to a browser's form, the
//! confirmation page with the confirming button). A request that accepts
//! `text/html` (a browser's form, no script) gets its answer as a page.
//!
//! Names and ids in a path are percent-encoded (`%2F` for a `/` in a
//! name). `/queues/{name}` and `/api/queues/{name}` take `?limit=N`
//! (messages listed per state, default 20, at most 500) and `?show=ID`
//! (that message's whole payload, up to 1 MiB, instead of a preview).
//!
//! ## JSON
//!
//! `GET /api/queues`: `[{"name", "status", "delayed", "ready", "in_flight",
//! "dead", "oldest_overdue_ms", "next_due_ms", "server_time_ms",
//! "delivered", "paused", "delivered_per_sec", "rate_history", "error"}]`: `status`
//! is `error` (the queue could not be read), `overdue` (a message has been
//! due longer than [`Dashboard::overdue_alert`]), `dead` (it has dead
//! letters) or `ok`; `delivered` is the queue's delivery counter,
//! `delivered_per_sec` its rate over the last minute and `rate_history`
//! the rates of the last minutes, oldest first, at most 60 points; times
//! are epoch ms on the Redis clock, durations ms; `paused` is true while
//! the queue is paused ([`Queue::pause`]); an unknown value is
//! `null`. The headers `X-Redwheel-Redis` (`up`, `slow`, `down`,
//! `starting`) and `X-Redwheel-Snapshot-Age-Ms` say how fresh it is; with
//! no data yet it is a 503.
//!
//! `GET /api/queues/{name}`: `{"name", "server_time_ms", "stats": {"delayed",
//! "ready", "in_flight", "dead", "oldest_overdue_ms", "next_due_ms"},
//! "paused", "controls": {"paused", "rate_limit": {"max", "per_ms"} or null,
//! "max_in_flight", "max_len"}, "schedules": [{"name", "definition",
//! "next_ms", "last_fired_ms", "paused"}], "delivered_per_sec",
//! "rate_history", "limit", "messages": {"delayed": [..], "ready": [..],
//! "in_flight": [..], "dead": [..]}}` (the controls as [`Queue::limits`]
//! reads them, `null` for a limit not set; the schedules as
//! [`Queue::schedules`] lists them, by name, `next_ms` null while one is
//! paused), each message
//! `{"id", "due_ms", "attempts", "payload_bytes", "payload_text" (UTF-8) or
//! "payload_hex", "payload_truncated"}`, plus `"visible_until_ms"` in
//! flight, `"died_ms"` and `"reason"` for dead letters.
//!
//! `GET /api/locks`: `[{"name", "holders": [{"owner", "holds"}], "token",
//! "ttl_ms", "last_token"}]`. Waiters are not listed: a waiting process
//! keeps its waiters in its own memory, not in Redis.
//!
//! An action answers `{"ok": true, "message", …}` (`"requeued"`,
//! `"removed"`, `"paused"`, `"id"` of a triggered schedule's message,
//! `"released"`), and every error `{"ok": false, "error":
//! {"kind", "message"}}` with a status: 400 bad input (a destructive
//! action without `confirm=yes`, a malformed request), 401 no or a wrong
//! token, 403 read-only, a cross-site request or an unmarked one (see
//! Safety), 404 unknown queue, id or lock, 405 wrong method (an action is
//! never reachable by `GET`), 409 a force-unlock of a lock held by
//! another holder or acquisition than the one given, 421 a `Host` that
//! is not this server's, 503 Redis down or not answering in time (for an
//! action: it may still take effect) or more connections than it takes.
//! The HTTP layer's own refusals: 408 a request not sent within 10 s,
//! 411 a body sent chunked (`Transfer-Encoding`), 413 a body over
//! 16 KiB, 414 a request line over 16 KiB, 431 headers over 64 KiB or
//! 100 lines, 505 not HTTP/1.x.
//!
//! # Safety
//!
//! * The command-line tool listens on loopback unless `--listen` says
//!   otherwise. A request's `Host` must name the listener (else 421): its
//!   address (any address when it listens on all of them), a loopback
//!   name when it takes loopback, or a name given to
//!   [`Dashboard::allow_host`] (`--allow-host`). A web page whose own
//!   host name was rebound to this machine (DNS rebinding) is refused,
//!   reads too.
//! * Actions are `POST`s only. A token ([`Dashboard::token`]) makes each
//!   one need `Authorization: Bearer <token>` (the page asks for it once
//!   and keeps it in the tab's session storage); read-only
//!   ([`Dashboard::read_only`]) refuses them all and hides their buttons.
//!   A request that a browser marks as coming from another site (its
//!   `Origin`, else its `Referer`, names another host) is refused (403),
//!   token or not; one with neither header fails closed: it needs the
//!   token, or with no token set the header `X-Redwheel-Action` (no form
//!   can send it, no other site can without a CORS preflight, which is
//!   never granted), else 403. Reads need no token: whoever reaches the
//!   port sees the payloads, so keep it on loopback or behind a proxy
//!   that authenticates.
//! * A destructive action takes two steps, script or not: the first
//!   button only asks (the page's script opens the question beside it;
//!   without script the server answers a confirmation page), and the
//!   server refuses it without `confirm=yes`. A force-unlock releases
//!   only the holder and fencing token the page showed.
//! * Its HTTP server is its own and bounded: one request per connection
//!   (`Connection: close`), sizes and times as listed above, 32
//!   connections served at once and 64 more waiting, past which a
//!   connection is answered 503 at once; an accept that fails (out of
//!   descriptors) is retried, never the end of the listener. No async
//!   runtime: threads of its own.
//! * Every queue name, id, payload and reason is escaped; payloads that are
//!   not UTF-8 show as hex. Pages carry a `Content-Security-Policy` that
//!   allows only the dashboard's own script and style, so even a missed
//!   escape could not run a script. Nothing is fetched from elsewhere: the
//!   style and script are compiled in.
//! * Nothing waits on Redis longer than [`Dashboard::page_timeout`]: the
//!   overview is served from a snapshot that a background thread refreshes
//!   ([`Dashboard::refresh_interval`]), with its age and whether Redis is
//!   down or slow; the other pages read Redis on a helper thread and, past
//!   the timeout, say that Redis did not answer. Once Redis is back, the
//!   next refresh shows it, without a reload.
//!
//! # What it costs Redis
//!
//! One refresh reads every known queue in **one pipelined round trip per
//! master**: the stats script, the delivery counter and the paused flag
//! of each queue (three commands per queue). Queues are found by `SCAN` over every master
//! at start and then every [`Dashboard::rescan_interval`] (default 30 s).
//! The page's own live refresh reads nothing from Redis on the overview;
//! a queue page reads that queue (about 12 round trips) each time it
//! refreshes; the locks page runs a `SCAN` and one round trip per held lock.
//! The guide's [dashboard](crate::guide::dashboard) chapter has the
//! measured figures.
//!
//! # Actions open the queue
//!
//! Every queue action (requeue, remove, pause, resume, trigger) goes
//! through [`Queue`], so the first action on a
//! queue opens it in the dashboard's [`Redwheel`] with default
//! [`QueueOptions`](crate::QueueOptions) (as the command-line tool's
//! `requeue-dead` and `remove` do): from then on this process also runs
//! that queue's transfer job, and applies its `max_deliveries` (10 by
//! default) to expired claims it finds. A service that serves the
//! dashboard on its own `Redwheel` has its queues open already with its
//! own options, which are the ones kept.
//!
//! [`Queue`]: crate::Queue
//! [`Queue::requeue_dead`]: crate::Queue::requeue_dead
//! [`Queue::remove`]: crate::Queue::remove
//! [`Queue::pause`]: crate::Queue::pause
//! [`Queue::resume`]: crate::Queue::resume
//! [`Queue::limits`]: crate::Queue::limits
//! [`Queue::schedules`]: crate::Queue::schedules
//! [`Queue::trigger_schedule`]: crate::Queue::trigger_schedule
//! [`Lock::force_unlock`]: crate::Lock::force_unlock

mod actions;
mod bounded;
mod chart;
mod config;
mod confirm;
mod detail;
mod gather;
mod guard;
mod html;
mod listener;
mod model;
mod pages;
mod payload;
mod refresher;
mod request;
mod response;
mod router;
mod server;

use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use crate::error::{Error, ErrorKind};
use crate::runtime::Redwheel;

use self::config::Config;
pub use self::server::Server;

/// A web dashboard on a [`Redwheel`]: configure it, then
/// [`serve`](Dashboard::serve) it. See the [module docs](self).
#[derive(Debug, Clone)]
pub struct Dashboard {
    rw: Redwheel,
    config: Config,
}

impl Dashboard {
    /// A dashboard over what `rw` is connected to (one server or a
    /// cluster), with no token, actions allowed.
    pub fn new(rw: &Redwheel) -> Dashboard {
        Dashboard {
            rw: rw.clone(),
            config: Config::default(),
        }
    }

    /// Actions need `Authorization: Bearer <token>` (else 401). 1 to 256
    /// visible ASCII characters.
    pub fn token(mut self, token: impl Into<String>) -> Dashboard {
        self.config.token = Some(token.into());
        self
    }

    /// One more host name a request's `Host` may give (`dash.example.com`:
    /// the name of a proxy in front, or of this machine), besides the
    /// listening address (and, on loopback, the loopback names); any other
    /// `Host` is refused (421), so that no page whose own name was rebound
    /// to this machine's address reads or acts (DNS rebinding). Call it
    /// once per name; a port in `name` is ignored.
    pub fn allow_host(mut self, name: impl Into<String>) -> Dashboard {
        let name = name.into();
        let name = name.trim();
        let bare = if name.parse::<std::net::IpAddr>().is_ok() {
            name
        } else {
            guard::host_name(name)
        };
        let bare = bare.trim_end_matches('.').to_ascii_lowercase();
        self.config.allow_hosts.push(bare);
        self
    }

    /// Refuses every action (403) and shows no action button.
    pub fn read_only(mut self, read_only: bool) -> Dashboard {
        self.config.read_only = read_only;
        self
    }

    /// How often the background thread reads every queue's counts for the
    /// overview, and how often an open page refreshes itself. 100 ms ..=
    /// 1 h; default 2 s.
    pub fn refresh_interval(mut self, d: Duration) -> Dashboard {
        self.config.refresh = d;
        self
    }

    /// How often the queues are looked for again (`SCAN` over the whole
    /// keyspace of every master). 1 s ..= 1 day; default 30 s.
    pub fn rescan_interval(mut self, d: Duration) -> Dashboard {
        self.config.rescan = d;
        self
    }

    /// The longest a request waits for Redis before the page says that
    /// Redis did not answer. 100 ms ..= 60 s; default 2 s.
    pub fn page_timeout(mut self, d: Duration) -> Dashboard {
        self.config.page_timeout = d;
        self
    }

    /// A queue whose oldest due message has waited this long is marked
    /// `overdue` and listed first. Default 60 s; at least 1 ms.
    pub fn overdue_alert(mut self, d: Duration) -> Dashboard {
        self.config.overdue_alert = d;
        self
    }

    /// Binds `addr` and serves the dashboard on threads of its own; returns
    /// at once. Fails with [`ErrorKind::InvalidOption`] for an option out
    /// of range or an address that cannot be bound. Bind a loopback address
    /// unless the dashboard must be reached from elsewhere (see "Safety" in
    /// the [module docs](self)).
    pub fn serve(self, addr: impl ToSocketAddrs) -> Result<Server, Error> {
        self.validate()?;
        let listener = TcpListener::bind(addr).map_err(|e| {
            Error::new(
                ErrorKind::InvalidOption,
                "the dashboard cannot listen on that address",
            )
            .with_cause(e)
        })?;
        self.serve_on(listener)
    }

    /// As [`serve`](Dashboard::serve), on a listener the caller bound.
    pub fn serve_on(self, listener: TcpListener) -> Result<Server, Error> {
        self.validate()?;
        let addr: SocketAddr = listener.local_addr().map_err(|e| {
            Error::new(ErrorKind::InvalidOption, "the listener has no address").with_cause(e)
        })?;
        server::start(self.rw, Arc::new(self.config), listener, addr)
    }

    fn validate(&self) -> Result<(), Error> {
        let c = &self.config;
        let bad = |name: &str, reason: &str| {
            Err(Error::new(
                ErrorKind::InvalidOption,
                format!("invalid option `{name}`: {reason}"),
            ))
        };
        if let Some(t) = &c.token
            && (t.is_empty() || t.len() > 256 || !t.bytes().all(|b| b.is_ascii_graphic()))
        {
            return bad("token", "must be 1 to 256 visible ASCII characters");
        }
        if c.refresh < Duration::from_millis(100) || c.refresh > Duration::from_secs(3_600) {
            return bad("refresh_interval", "must be within 100 ms ..= 1 h");
        }
        if c.rescan < Duration::from_secs(1) || c.rescan > Duration::from_secs(86_400) {
            return bad("rescan_interval", "must be within 1 s ..= 1 day");
        }
        if c.page_timeout < Duration::from_millis(100) || c.page_timeout > Duration::from_secs(60) {
            return bad("page_timeout", "must be within 100 ms ..= 60 s");
        }
        if c.overdue_alert < Duration::from_millis(1) {
            return bad("overdue_alert", "must be at least 1 ms");
        }
        if let Some(h) = c.allow_hosts.iter().find(|h| !guard::is_host_name(h)) {
            return bad(
                "allow_host",
                &format!("{h:?} is not a host name (letters, digits, `-`, `.`, or an address)"),
            );
        }
        Ok(())
    }
}
