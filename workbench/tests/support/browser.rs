//! Test support for the dashboard: headless Chromium from the system's
//! packages (`/usr/bin/chromium`, or `$CHROMIUM_BIN`) driven over the
//! DevTools protocol (`headless_chrome`, which never downloads a browser
//! here). The bare HTTP/1.1 client and the waits on the dashboard's state
//! are the root's `tests/support/dashboard.rs`.
//!
//! Chromium runs with a fresh profile in a private directory and with its
//! background connections off (this machine's network refuses them).
//! Waits poll a condition in the page (a DOM state the dashboard's own
//! script produces), up to a generous limit that only guards against a
//! hang.

use std::ffi::OsStr;
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

use super::dashboard::WAIT_LIMIT;

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
