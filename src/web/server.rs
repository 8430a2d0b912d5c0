//! The HTTP side: `tiny_http` (a small synchronous server: an accept
//! thread and a thread per connection, no async runtime), a few worker
//! threads that take requests from it, and the dispatch of each request to
//! a page, a document or an action, with the security headers.

use std::io::Read as _;
use std::net::{SocketAddr, TcpListener};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use parking_lot::{Condvar, Mutex};
use serde_json::Value;
use tiny_http::{Header, Request, Response};

use super::actions::{self, Outcome};
use super::bounded::Bounded;
use super::config::Config;
use super::detail::{self, QueueDetail};
use super::guard::{self, Headers};
use super::html::{self, Nav};
use super::refresher::{Refresher, View};
use super::router::{self, Read, Route};
use super::{model, pages};
use crate::error::{Error, ErrorKind};
use crate::runtime::Redwheel;

const STYLE: &str = include_str!("assets/dashboard.css");
const SCRIPT: &str = include_str!("assets/dashboard.js");

/// Only the dashboard's own script and style; no inline script, no frame,
/// nothing from elsewhere.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
                   connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// Helper threads a page may leave waiting on a slow Redis before new
/// reads are refused at once.
const MAX_WAITING: usize = 8;

/// A running dashboard. A cheap `Clone` handle; dropping it leaves the
/// dashboard running ([`stop`](Server::stop) ends it).
#[derive(Clone)]
pub struct Server {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("addr", &self.inner.addr)
            .field("stopped", &self.is_stopped())
            .finish()
    }
}

struct Inner {
    addr: SocketAddr,
    app: Arc<App>,
    http: Mutex<Option<Arc<tiny_http::Server>>>,
    workers: Mutex<Vec<JoinHandle<()>>>,
    stopped: AtomicBool,
    done: Mutex<bool>,
    done_cv: Condvar,
}

impl Server {
    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.inner.addr
    }

    /// Its overview's URL (`http://127.0.0.1:7780/`).
    pub fn url(&self) -> String {
        format!("http://{}/", self.inner.addr)
    }

    /// True once [`stop`](Server::stop) was called.
    pub fn is_stopped(&self) -> bool {
        self.inner.stopped.load(Ordering::SeqCst)
    }

    /// Stops serving: requests in progress finish, the worker threads
    /// end, and the listening socket is closed (by the HTTP server's
    /// accept thread, moments after this returns); the refresher stops
    /// after its round in progress. Idempotent; blocks until the first
    /// call has finished.
    pub fn stop(&self) {
        let inner = &self.inner;
        if inner.stopped.swap(true, Ordering::SeqCst) {
            self.wait();
            return;
        }
        inner.app.refresher.stop();
        let http = inner.http.lock().clone();
        let workers = std::mem::take(&mut *inner.workers.lock());
        if let Some(http) = &http {
            for _ in &workers {
                http.unblock();
            }
        }
        for w in workers {
            let _ = w.join();
        }
        // The last handle on the tiny_http server: dropping it closes the
        // listening socket.
        drop(http);
        inner.http.lock().take();
        *inner.done.lock() = true;
        inner.done_cv.notify_all();
        tracing::info!(target: "redwheel::web", addr = %inner.addr, "dashboard stopped");
    }

    /// Blocks until the dashboard is stopped.
    pub fn wait(&self) {
        let mut done = self.inner.done.lock();
        while !*done {
            self.inner.done_cv.wait(&mut done);
        }
    }
}

/// What every request needs.
struct App {
    rw: Redwheel,
    config: Arc<Config>,
    refresher: Refresher,
    bounded: Bounded,
    loopback: bool,
}

pub(crate) fn start(
    rw: Redwheel,
    config: Arc<Config>,
    listener: TcpListener,
    addr: SocketAddr,
) -> Result<Server, Error> {
    let http = tiny_http::Server::from_listener(listener, None).map_err(|e| {
        Error::new(
            ErrorKind::InvalidOption,
            "the dashboard cannot serve on that listener",
        )
        .with_cause(e)
    })?;
    let http = Arc::new(http);
    let (refresher, _thread) = Refresher::start(rw.clone(), &config)?;
    let app = Arc::new(App {
        bounded: Bounded::new(config.page_timeout, MAX_WAITING),
        loopback: addr.ip().is_loopback(),
        rw,
        refresher,
        config: Arc::clone(&config),
    });
    let inner = Arc::new(Inner {
        addr,
        app: Arc::clone(&app),
        http: Mutex::new(Some(Arc::clone(&http))),
        workers: Mutex::new(Vec::new()),
        stopped: AtomicBool::new(false),
        done: Mutex::new(false),
        done_cv: Condvar::new(),
    });
    let server = Server { inner };
    for i in 0..config.workers {
        let (http, app, inner) = (
            Arc::clone(&http),
            Arc::clone(&app),
            Arc::clone(&server.inner),
        );
        let spawned = std::thread::Builder::new()
            .name(format!("redwheel-web-{i}"))
            .spawn(move || work(&http, &app, &inner.stopped));
        match spawned {
            Ok(h) => server.inner.workers.lock().push(h),
            Err(e) => {
                server.stop();
                return Err(
                    Error::new(ErrorKind::Spawn, "cannot start the dashboard's threads")
                        .with_cause(e),
                );
            }
        }
    }
    if !app.loopback {
        tracing::warn!(target: "redwheel::web", %addr, token = config.token.is_some(), "the dashboard listens beyond loopback");
    }
    tracing::info!(target: "redwheel::web", %addr, read_only = config.read_only, "dashboard serving");
    Ok(server)
}

fn work(http: &tiny_http::Server, app: &App, stopped: &AtomicBool) {
    loop {
        match http.recv() {
            Ok(req) => serve(app, req),
            Err(e) => {
                if stopped.load(Ordering::SeqCst) {
                    return;
                }
                tracing::warn!(target: "redwheel::web", error = %e, "the dashboard could not accept a connection");
            }
        }
    }
}

/// A response before its security headers.
struct Reply {
    status: u16,
    content_type: &'static str,
    body: Vec<u8>,
    extra: Vec<(&'static str, String)>,
}

impl Reply {
    fn html(status: u16, body: String) -> Reply {
        Reply {
            status,
            content_type: "text/html; charset=utf-8",
            body: body.into_bytes(),
            extra: Vec::new(),
        }
    }

    fn json(status: u16, v: &Value) -> Reply {
        Reply {
            status,
            content_type: "application/json",
            body: serde_json::to_vec(v).unwrap_or_default(),
            extra: Vec::new(),
        }
    }
}

fn serve(app: &App, mut req: Request) {
    // A body is never needed; read a little of it so that the connection
    // can be reused.
    let _ = req.as_reader().take(64 * 1024).read_to_end(&mut Vec::new());
    let reply = catch_unwind(AssertUnwindSafe(|| app.handle(&req))).unwrap_or_else(|_| {
        tracing::error!(target: "redwheel::web", url = %req.url(), "a dashboard request panicked");
        Reply::json(500, &model::error("internal", "internal error"))
    });
    tracing::debug!(target: "redwheel::web", method = %req.method(), url = %req.url(), status = reply.status, "request");
    // The length is known: `Content-Length`, never chunked.
    let mut resp = Response::from_data(reply.body)
        .with_status_code(reply.status)
        .with_chunked_threshold(usize::MAX);
    let headers = [
        ("Content-Type", reply.content_type.to_owned()),
        ("Cache-Control", "no-store".to_owned()),
        ("X-Content-Type-Options", "nosniff".to_owned()),
        ("X-Frame-Options", "DENY".to_owned()),
        ("Referrer-Policy", "same-origin".to_owned()),
        ("Content-Security-Policy", CSP.to_owned()),
    ];
    for (name, value) in headers.into_iter().chain(reply.extra) {
        if let Ok(h) = Header::from_bytes(name.as_bytes(), value.as_bytes()) {
            resp.add_header(h);
        }
    }
    let _ = req.respond(resp);
}

fn header<'a>(req: &'a Request, name: &str) -> Option<&'a str> {
    req.headers()
        .iter()
        .find(|h| h.field.as_str().as_str().eq_ignore_ascii_case(name))
        .map(|h| h.value.as_str())
}

impl App {
    fn handle(&self, req: &Request) -> Reply {
        let h = Headers {
            host: header(req, "Host"),
            origin: header(req, "Origin"),
            referer: header(req, "Referer"),
            authorization: header(req, "Authorization"),
        };
        let (path, query) = req.url().split_once('?').unwrap_or((req.url(), ""));
        let api = path.starts_with("/api/");
        if let Err(refusal) = guard::check_host(&h, self.loopback) {
            return Reply::json(
                refusal.status(),
                &model::error("refused", refusal.message()),
            );
        }
        match router::route(req.method().as_str(), path) {
            Route::Read(r) => self.read(r, query),
            Route::Action(a) => {
                if let Err(refusal) =
                    guard::check_action(&h, self.config.read_only, self.config.token.as_deref())
                {
                    tracing::info!(target: "redwheel::web", url = %req.url(), why = refusal.message(), "action refused");
                    return Reply::json(
                        refusal.status(),
                        &model::error("refused", refusal.message()),
                    );
                }
                self.act(a, query)
            }
            Route::WrongMethod(allow) => {
                let mut r = Reply::json(
                    405,
                    &model::error(
                        "method not allowed",
                        &format!("use {allow} here; actions are POSTs and change nothing on a GET"),
                    ),
                );
                r.extra.push(("Allow", allow.to_owned()));
                r
            }
            Route::NotFound if api => Reply::json(404, &model::error("not found", "no such route")),
            Route::NotFound => self.framed(
                404,
                "not found",
                Nav::Queues,
                &pages::not_found("There is no such page."),
            ),
        }
    }

    fn framed(&self, status: u16, title: &str, nav: Nav, live: &str) -> Reply {
        let view = self.refresher.view();
        Reply::html(status, html::page(title, nav, &self.config, &view, live))
    }

    fn read(&self, r: Read, query: &str) -> Reply {
        let config = &self.config;
        match r {
            Read::Overview => {
                let view = self.refresher.view();
                let live = pages::overview(&view, config);
                Reply::html(200, html::page("queues", Nav::Queues, config, &view, &live))
            }
            Read::ApiQueues => {
                let view = self.refresher.view();
                let mut reply = match view.snapshot.as_deref() {
                    Some(s) => {
                        Reply::json(200, &Value::Array(s.rows.iter().map(model::row).collect()))
                    }
                    None => Reply::json(
                        503,
                        &model::error("unavailable", "no data read from Redis yet"),
                    ),
                };
                freshness(&mut reply, &view);
                reply
            }
            Read::ApiStatus => Reply::json(200, &model::status(&self.refresher.view(), config)),
            Read::Queue(name) => self.queue(name, query, false),
            Read::ApiQueue(name) => self.queue(name, query, true),
            Read::Locks | Read::ApiLocks => {
                let api = r == Read::ApiLocks;
                let rw = self.rw.clone();
                let found = self.bounded.run(move || rw.find_locks("*"));
                let (status, list, problem) = match found {
                    Ok(Ok(list)) => (200, Some(list), None),
                    Ok(Err(e)) => (Outcome::from_error(&e).status, None, Some(e.to_string())),
                    Err(late) => (503, None, Some(late.message(self.bounded.limit()))),
                };
                if api {
                    return match (list, problem) {
                        (Some(l), _) => {
                            Reply::json(200, &Value::Array(l.iter().map(model::lock).collect()))
                        }
                        (None, p) => Reply::json(
                            status,
                            &model::error("unavailable", &p.unwrap_or_default()),
                        ),
                    };
                }
                let live = pages::locks(list.as_deref(), problem.as_deref(), config);
                self.framed(status, "locks", Nav::Locks, &live)
            }
            Read::Style => asset("text/css; charset=utf-8", STYLE),
            Read::Script => asset("text/javascript; charset=utf-8", SCRIPT),
        }
    }

    fn queue(&self, name: String, query: &str, api: bool) -> Reply {
        let limit = detail::limit_of(router::query_param(query, "limit").as_deref());
        let show = router::query_param(query, "show");
        let loaded: Result<Option<QueueDetail>, (u16, String)> =
            if let Err(e) = crate::queue::validate_name(&name) {
                Err((404, e.to_string()))
            } else {
                let (rw, n) = (self.rw.clone(), name.clone());
                match self
                    .bounded
                    .run(move || detail::load_queue(&rw, &n, limit, show))
                {
                    Ok(Ok(d)) => Ok(d),
                    Ok(Err(e)) => Err((Outcome::from_error(&e).status, e.to_string())),
                    Err(late) => Err((503, late.message(self.bounded.limit()))),
                }
            };
        let view = self.refresher.view();
        let snapshot = view.snapshot.as_deref();
        let row = snapshot.and_then(|s| s.row(&name));
        match (loaded, api) {
            (Ok(Some(d)), true) => Reply::json(200, &model::queue(&d, row)),
            (Ok(None), true) => Reply::json(
                404,
                &model::error("not found", &format!("no queue {name:?} in Redis")),
            ),
            (Err((status, p)), true) => Reply::json(status, &model::error("unavailable", &p)),
            (loaded, false) => {
                let (status, d, problem) = match loaded {
                    Ok(Some(d)) => (200, Some(d), None),
                    Ok(None) => (
                        404,
                        None,
                        Some(format!("No queue {name:?} in Redis: it has no key.")),
                    ),
                    Err((status, p)) => (status, None, Some(p)),
                };
                let live = pages::queue(
                    &name,
                    d.as_ref(),
                    problem.as_deref(),
                    snapshot,
                    &self.config,
                );
                Reply::html(
                    status,
                    html::page(&name, Nav::Queues, &self.config, &view, &live),
                )
            }
        }
    }

    fn act(&self, action: router::Action, query: &str) -> Reply {
        let count = match actions::requeue_count(router::query_param(query, "count").as_deref()) {
            Ok(c) => c,
            Err(why) => return Reply::json(400, &model::error("invalid input", &why)),
        };
        let rw = self.rw.clone();
        let done = self
            .bounded
            .run(move || actions::perform(&rw, &action, count));
        match done {
            Ok(outcome) => {
                if outcome.status == 200 {
                    // The overview shows the change on its next load.
                    self.refresher.refresh_now(self.bounded.limit());
                }
                Reply::json(outcome.status, &outcome.body)
            }
            Err(late) => Reply::json(
                503,
                &model::error(
                    "unavailable",
                    &format!(
                        "{}; the action goes on and may still take effect",
                        late.message(self.bounded.limit())
                    ),
                ),
            ),
        }
    }
}

/// How fresh a document from the snapshot is, in headers.
fn freshness(reply: &mut Reply, view: &View) {
    reply
        .extra
        .push(("X-Redwheel-Redis", view.redis.as_str().to_owned()));
    if let Some(age) = view.age {
        reply
            .extra
            .push(("X-Redwheel-Snapshot-Age-Ms", age.as_millis().to_string()));
    }
}

fn asset(content_type: &'static str, text: &'static str) -> Reply {
    Reply {
        status: 200,
        content_type,
        body: text.as_bytes().to_vec(),
        extra: Vec::new(),
    }
}
