//! Test support for the dashboard: headless Chromium from the system's
//! packages (`/usr/bin/chromium`, or `$CHROMIUM_BIN`) driven over the
//! DevTools protocol (`headless_chrome`, which never downloads a browser
//! here), and a bare HTTP/1.1 client for requests a browser would not
//! make (a forged `Origin`, a foreign `Host`).
//!
//! Chromium runs with a fresh profile in a private directory and with its
//! background connections off (this machine's network refuses them).
//! Waits poll a condition in the page (a DOM state the dashboard's own
//! script produces), up to a generous limit that only guards against a
//! hang.

use std::ffi::OsStr;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use headless_chrome::browser::tab::point::Point;
use headless_chrome::protocol::cdp::Emulation;
use headless_chrome::protocol::cdp::Page as PageDomain;
use headless_chrome::protocol::cdp::Page::CaptureScreenshotFormatOption;
use headless_chrome::{Browser as Chrome, LaunchOptions, Tab};
use serde_json::Value;

use super::{RedisServer, ScratchDir};

/// The longest a wait for a page state may take before the test fails.
const WAIT_LIMIT: Duration = Duration::from_secs(60);

/// The browser binary.
pub fn chromium_path() -> PathBuf {
    std::env::var_os("CHROMIUM_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"))
}

/// One headless Chromium, killed on drop.
pub struct Browser {
    chrome: Chrome,
    _profile: ScratchDir,
}

impl Browser {
    pub fn launch() -> Browser {
        let profile = RedisServer::scratch_dir("chromium-profile");
        let args: Vec<&OsStr> = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            "--force-device-scale-factor=1",
        ]
        .iter()
        .map(OsStr::new)
        .collect();
        let options = LaunchOptions::default_builder()
            .path(Some(chromium_path()))
            .headless(true)
            .sandbox(false)
            .window_size(Some((1360, 1000)))
            .user_data_dir(Some(profile.to_path_buf()))
            .idle_browser_timeout(Duration::from_secs(600))
            .args(args)
            .build()
            .expect("chromium launch options");
        let chrome = Chrome::new(options).unwrap_or_else(|e| {
            panic!(
                "cannot start {} (is Debian's `chromium` installed? .ci/run installs it): {e}",
                chromium_path().display()
            )
        });
        Browser {
            chrome,
            _profile: profile,
        }
    }

    /// A new tab on `url`, loaded.
    pub fn open(&self, url: &str) -> Page {
        let page = self.tab();
        page.go(url);
        page
    }

    /// A new tab on `url` with the page's own scripts disabled (as in a
    /// browser with JavaScript off): the test's `eval` still runs.
    pub fn open_without_script(&self, url: &str) -> Page {
        let page = self.tab();
        page.tab
            .call_method(Emulation::SetScriptExecutionDisabled { value: true })
            .expect("disable the page's scripts");
        page.go(url);
        page
    }

    /// A new tab on `url` where `js` runs in every document before the
    /// page's own scripts (to take a browser feature away, say).
    pub fn open_after(&self, js: &str, url: &str) -> Page {
        let page = self.tab();
        page.tab
            .call_method(PageDomain::AddScriptToEvaluateOnNewDocument {
                source: js.to_owned(),
                world_name: None,
                include_command_line_api: None,
                run_immediately: None,
            })
            .expect("a script for every new document");
        page.go(url);
        page
    }

    fn tab(&self) -> Page {
        let tab = self.chrome.new_tab().expect("a new tab");
        tab.set_default_timeout(WAIT_LIMIT);
        Page { tab }
    }
}

/// One tab.
pub struct Page {
    tab: Arc<Tab>,
}

impl Page {
    /// Loads `url` and waits until it is loaded.
    pub fn go(&self, url: &str) {
        self.tab
            .navigate_to(url)
            .and_then(|t| t.wait_until_navigated())
            .unwrap_or_else(|e| panic!("cannot load {url}: {e}"));
    }

    /// The value of the JavaScript expression `js` (awaited if it is a
    /// promise), through JSON.
    pub fn eval(&self, js: &str) -> Value {
        self.try_eval(js)
            .unwrap_or_else(|e| panic!("evaluating {js}: {e}"))
    }

    /// As [`Page::eval`], with the error of an evaluation that failed (a
    /// page that is being replaced, say).
    pub fn try_eval(&self, js: &str) -> Result<Value, String> {
        let wrapped = format!("(async () => JSON.stringify(await ({js})))()");
        let obj = self
            .tab
            .evaluate(&wrapped, true)
            .map_err(|e| e.to_string())?;
        Ok(match obj.value {
            Some(Value::String(s)) => serde_json::from_str(&s).unwrap_or(Value::Null),
            _ => Value::Null,
        })
    }

    /// Waits until `js` is truthy, and returns its value; fails the test
    /// (with the page's text) if it is not within the wait limit. An
    /// evaluation that fails (while a page loads) counts as not yet.
    pub fn wait_for(&self, what: &str, js: &str) -> Value {
        let start = Instant::now();
        loop {
            let v = self.try_eval(js).unwrap_or(Value::Null);
            let truthy = !matches!(v, Value::Null | Value::Bool(false)) && v != 0 && v != "";
            if truthy {
                return v;
            }
            if start.elapsed() > WAIT_LIMIT {
                panic!(
                    "waited in vain for {what} ({js}); the page says:\n{}",
                    self.text("body")
                );
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    /// How many live refreshes the page's script has made.
    pub fn generation(&self) -> u64 {
        self.eval("Number(document.body.getAttribute('data-generation') || 0)")
            .as_u64()
            .unwrap_or(0)
    }

    /// Waits for two more live refreshes than now: the later one was
    /// requested after this call.
    pub fn wait_refreshed(&self) {
        let target = self.generation() + 2;
        self.wait_for(
            "two live refreshes",
            &format!("Number(document.body.getAttribute('data-generation') || 0) >= {target}"),
        );
    }

    /// The visible text of the first element matching `selector`.
    pub fn text(&self, selector: &str) -> String {
        let js = format!(
            "(document.querySelector({sel}) || {{innerText: ''}}).innerText",
            sel = Value::from(selector)
        );
        self.eval(&js).as_str().unwrap_or_default().to_owned()
    }

    /// Clicks the element matching `selector` with the mouse, at its
    /// middle, as a person would: the point is read in the page, then the
    /// mouse is pressed and released there (the live refresh may replace
    /// the element meanwhile with an identical one at the same place; the
    /// page's script does not swap while the button is down).
    pub fn click(&self, selector: &str) {
        let js = format!(
            "(() => {{ const e = document.querySelector({sel}); if (!e) return null; e.scrollIntoView({{block: 'center'}}); const r = e.getBoundingClientRect(); return r.width > 0 ? [r.left + r.width / 2, r.top + r.height / 2] : null; }})()",
            sel = Value::from(selector)
        );
        let at = self.wait_for(&format!("{selector} to be clickable"), &js);
        let point = Point {
            x: at[0].as_f64().unwrap(),
            y: at[1].as_f64().unwrap(),
        };
        self.tab
            .click_point(point)
            .unwrap_or_else(|e| panic!("cannot click {selector}: {e}"));
    }

    /// Saves a PNG of the viewport to `path`.
    pub fn screenshot(&self, path: &Path) {
        let png = self
            .tab
            .capture_screenshot(CaptureScreenshotFormatOption::Png, None, None, true)
            .expect("a screenshot");
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).expect("the screenshot's directory");
        }
        std::fs::write(path, png).expect("write the screenshot");
    }
}

/// Queue `name` (opened with `max_deliveries(1)`) with one dead letter
/// per payload: each offered, claimed and nacked once.
pub fn queue_with_dead(
    rw: &redwheel::Redwheel,
    name: &str,
    payloads: &[&str],
) -> redwheel::Queue<String> {
    let q = rw
        .queue_with::<String>(name, redwheel::QueueOptions::default().max_deliveries(1))
        .unwrap();
    for p in payloads {
        q.offer(&(*p).to_owned(), Duration::ZERO).unwrap();
        let d = q.claim(Duration::from_secs(30)).unwrap().expect("a claim");
        assert_eq!(d.nack(Duration::ZERO).unwrap(), redwheel::Nacked::Dead);
    }
    q
}

/// Waits until `q`'s stats satisfy `done` (its transfer, a consumer or
/// the dashboard moved its messages).
pub fn wait_stats<T: redwheel::Codec>(
    q: &redwheel::Queue<T>,
    done: impl Fn(&redwheel::QueueStats) -> bool + Send + 'static,
) {
    let q = q.clone();
    super::within(WAIT_LIMIT, move || {
        while !done(&q.stats().unwrap()) {
            std::thread::sleep(Duration::from_millis(5));
        }
    })
}

/// `GET /api/status` of the dashboard at `addr`.
pub fn dashboard_status(addr: SocketAddr) -> Value {
    http(addr, "GET", "/api/status", &[]).json()
}

/// Waits until the dashboard at `addr` has ended a refresh that started
/// after this call (two more successful rounds than now); returns that
/// snapshot's number.
pub fn wait_fresh_snapshot(addr: SocketAddr) -> u64 {
    let target = dashboard_status(addr)["snapshot"].as_u64().unwrap() + 2;
    super::within(WAIT_LIMIT, move || {
        while dashboard_status(addr)["snapshot"].as_u64().unwrap() < target {
            std::thread::sleep(Duration::from_millis(10));
        }
        target
    })
}

/// A reply to [`http`].
#[derive(Debug)]
pub struct HttpReply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl HttpReply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
}

/// One HTTP/1.1 request to `addr` (`Host` is `addr` unless `headers` gives
/// one), read to the end (`Connection: close`).
pub fn http(addr: SocketAddr, method: &str, target: &str, headers: &[(&str, &str)]) -> HttpReply {
    http_body(addr, method, target, headers, "")
}

/// A form's `POST` (`application/x-www-form-urlencoded`, `body` as given:
/// `confirm=yes&token=7`), as [`http`].
pub fn post_form(
    addr: SocketAddr,
    target: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> HttpReply {
    let mut all = vec![("Content-Type", "application/x-www-form-urlencoded")];
    all.extend_from_slice(headers);
    http_body(addr, "POST", target, &all, body)
}

/// As [`http`], with `body` (its `Content-Length` set).
pub fn http_body(
    addr: SocketAddr,
    method: &str,
    target: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> HttpReply {
    let mut s = TcpStream::connect(addr).expect("connect to the dashboard");
    s.set_read_timeout(Some(WAIT_LIMIT)).unwrap();
    let mut req = format!(
        "{method} {target} HTTP/1.1\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if !headers.iter().any(|(n, _)| n.eq_ignore_ascii_case("host")) {
        req.push_str(&format!("Host: {addr}\r\n"));
    }
    for (n, v) in headers {
        req.push_str(&format!("{n}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("read the reply");
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {head:?}"));
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_owned(), v.trim().to_owned()))
        .collect();
    HttpReply {
        status,
        headers,
        body: body.to_owned(),
    }
}
