//! Helpers shared by the timer test binaries (`mod timer_common;`).

#![allow(dead_code)] // each test binary uses a different subset

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use redwheel::timer::{HashedWheelTimer, ManualClock, Timeout};

pub type TestResult = Result<(), Box<dyn std::error::Error>>;

pub type Counter = Arc<AtomicUsize>;

/// How long a test waits on a channel before declaring a hang. A guard only:
/// no test expects anything to take this long.
pub const HANG_GUARD: Duration = Duration::from_secs(10);

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

pub fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

pub fn counter() -> Counter {
    Arc::new(AtomicUsize::new(0))
}

pub fn get(c: &Counter) -> usize {
    c.load(Ordering::SeqCst)
}

/// A timer on a fresh manual clock that reads zero; its worker's start time
/// is therefore zero, and tick `t` ends at `(t + 1) * tick`.
pub fn manual_timer(tick: Duration, ticks_per_wheel: usize) -> (HashedWheelTimer, ManualClock) {
    let clock = ManualClock::new();
    let timer = HashedWheelTimer::builder()
        .tick_duration(tick)
        .ticks_per_wheel(ticks_per_wheel)
        .clock(clock.clone())
        .build()
        .expect("valid timer arguments");
    (timer, clock)
}

/// Increments its counter when dropped: shows that a task was dropped.
pub struct DropCount(pub Counter);

impl Drop for DropCount {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// A task that counts its runs in `ran`, and its drop (run or not) in
/// `dropped`.
pub fn tracked(ran: &Counter, dropped: &Counter) -> impl FnOnce(&Timeout) + Send + 'static {
    let ran = ran.clone();
    let guard = DropCount(dropped.clone());
    move |_| {
        let _guard = guard;
        ran.fetch_add(1, Ordering::SeqCst);
    }
}

/// A task that only counts its runs.
pub fn counting(ran: &Counter) -> impl FnOnce(&Timeout) + Send + 'static {
    let ran = ran.clone();
    move |_| {
        ran.fetch_add(1, Ordering::SeqCst);
    }
}

/// Log output captured from a `tracing_subscriber::fmt` subscriber.
#[derive(Clone, Default)]
pub struct LogBuf(pub Arc<Mutex<Vec<u8>>>);

impl io::Write for LogBuf {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl LogBuf {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }

    /// The captured lines that contain `needle`.
    pub fn lines_with(&self, needle: &str) -> Vec<String> {
        self.text()
            .lines()
            .filter(|l| l.contains(needle))
            .map(str::to_owned)
            .collect()
    }
}

/// A `tracing` subscriber that writes into `buf`.
pub fn subscriber_into(buf: &LogBuf) -> impl tracing::Subscriber + Send + Sync + 'static {
    let buf = buf.clone();
    tracing_subscriber::fmt()
        .with_writer(move || buf.clone())
        .with_ansi(false)
        .finish()
}

/// The process-wide log, for events logged on worker threads. Installed once
/// per test binary; tests share it, so they look for text only they produce.
pub fn global_log() -> &'static LogBuf {
    static LOG: OnceLock<LogBuf> = OnceLock::new();
    LOG.get_or_init(|| {
        let buf = LogBuf::default();
        tracing::subscriber::set_global_default(subscriber_into(&buf))
            .expect("nothing else sets the global subscriber");
        buf
    })
}
