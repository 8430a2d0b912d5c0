//! The running dashboard: its handle ([`Server`]), the HTTP server it
//! runs on (`listener.rs`: a bounded HTTP/1.1 server of its own on std
//! threads, no async runtime), and the dispatch of each request to a
//! page, a document or an action.

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::{Condvar, Mutex};
use serde_json::Value;

use super::actions::Outcome;
use super::bounded::Bounded;
use super::config::Config;
use super::detail::{self, QueueDetail};
use super::guard::{self, ACTION_HEADER, Headers, Hosts};
use super::html::{self, Nav};
use super::listener::Http;
use super::refresher::{Refresher, View};
use super::request::Request;
use super::response::Reply;
use super::router::{self, Read, Route};
use super::{confirm, model, pages};
use crate::error::{Error, ErrorKind};
use crate::runtime::Redwheel;

const STYLE: &str = include_str!("assets/dashboard.css");
const SCRIPT: &str = include_str!("assets/dashboard.js");

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
    http: Mutex<Option<Http>>,
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

    /// Stops serving, promptly even with clients connected: the listening
    /// socket is closed, every open connection is shut down (a request
    /// still arriving or an answer still being sent is cut off), a
    /// request waiting on Redis is answered 503 at once (its Redis call
    /// finishes in the background), every thread of the dashboard's HTTP
    /// server is joined, and the refresher stops after its round in
    /// progress. Idempotent; blocks until the first call has finished.
    pub fn stop(&self) {
        let inner = &self.inner;
        if inner.stopped.swap(true, Ordering::SeqCst) {
            self.wait();
            return;
        }
        inner.app.refresher.stop();
        inner.app.bounded.cancel();
        if let Some(http) = inner.http.lock().take() {
            http.stop();
        }
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
    hosts: Hosts,
}

pub(crate) fn start(
    rw: Redwheel,
    config: Arc<Config>,
    listener: TcpListener,
    addr: SocketAddr,
) -> Result<Server, Error> {
    let (refresher, _thread) = Refresher::start(rw.clone(), &config)?;
    let app = Arc::new(App {
        bounded: Bounded::new(config.page_timeout, MAX_WAITING),
        hosts: Hosts {
            listen: addr.ip(),
            allowed: config.allow_hosts.clone(),
        },
        rw,
        refresher,
        config: Arc::clone(&config),
    });
    let handler = {
        let app = Arc::clone(&app);
        Arc::new(move |req: &Request| app.handle(req))
    };
    let http =
        Http::start(listener, addr, config.workers, config.backlog, handler).map_err(|e| {
            app.refresher.stop();
            Error::new(ErrorKind::Spawn, "cannot start the dashboard's threads").with_cause(e)
        })?;
    let server = Server {
        inner: Arc::new(Inner {
            addr,
            app: Arc::clone(&app),
            http: Mutex::new(Some(http)),
            stopped: AtomicBool::new(false),
            done: Mutex::new(false),
            done_cv: Condvar::new(),
        }),
    };
    if !addr.ip().is_loopback() {
        tracing::warn!(target: "redwheel::web", %addr, token = config.token.is_some(), "the dashboard listens beyond loopback");
    }
    tracing::info!(target: "redwheel::web", %addr, read_only = config.read_only, "dashboard serving");
    Ok(server)
}

impl App {
    fn ctx(&self) -> confirm::Ctx<'_> {
        confirm::Ctx {
            rw: &self.rw,
            config: &self.config,
            bounded: &self.bounded,
            refresher: &self.refresher,
        }
    }

    fn handle(&self, req: &Request) -> Reply {
        let reply = self.route(req);
        tracing::debug!(target: "redwheel::web", method = %req.method, url = %req.target, status = reply.status, "request");
        reply
    }

    fn route(&self, req: &Request) -> Reply {
        let h = Headers {
            host: req.header("Host"),
            origin: req.header("Origin"),
            referer: req.header("Referer"),
            authorization: req.header("Authorization"),
            action: req.header(ACTION_HEADER),
        };
        let (path, query) = req.target.split_once('?').unwrap_or((&req.target, ""));
        let api = path.starts_with("/api/");
        if let Err(refusal) = guard::check_host(&h, &self.hosts) {
            return Reply::json(
                refusal.status(),
                &model::error("refused", refusal.message()),
            );
        }
        match router::route(&req.method, path) {
            Route::Read(r) => self.read(r, query),
            Route::Action(a) => {
                let html = confirm::wants_html(req);
                if let Err(refusal) =
                    guard::check_action(&h, self.config.read_only, self.config.token.as_deref())
                {
                    tracing::info!(target: "redwheel::web", url = %req.target, why = refusal.message(), "action refused");
                    let doc = model::error("refused", refusal.message());
                    return if html {
                        confirm::outcome_page(&self.ctx(), &a, refusal.status(), &doc)
                    } else {
                        Reply::json(refusal.status(), &doc)
                    };
                }
                confirm::act(&self.ctx(), a, query, &req.body, html)
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
