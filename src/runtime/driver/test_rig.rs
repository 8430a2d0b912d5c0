//! The driver's test rig: a fake transport that records each round on a
//! `Wire`, fake jobs whose outcomes a test scripts, and a `Rig` that runs a
//! driver on a manual clock. No Redis, no sleeps.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use redis::{Script, Value};

use super::{Commands, Deadline, Driver, DriverConfig, Job, Next, Transport};
use crate::error::{Error, ErrorKind};
use crate::runtime::server_clock::{ClockSample, ServerClock};
use crate::timer::ManualClock;

pub(super) const MS: Duration = Duration::from_millis(1);

pub(super) fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// What the fake transport saw: one entry per round, with the clock
/// reading and the routes (= job keys) of its commands.
#[derive(Default)]
pub(super) struct Wire {
    pub(super) rounds: Mutex<Vec<(Duration, Vec<String>)>>,
    pub(super) down: AtomicBool,
    pub(super) connects: AtomicU64,
    /// Routes whose next command gets a `NOSCRIPT` error reply.
    pub(super) noscript: Mutex<Vec<String>>,
    /// Every command gets a `NOSCRIPT` error reply (a server that never
    /// keeps the script).
    pub(super) always_noscript: AtomicBool,
    /// Loading a script fails with this error kind.
    pub(super) load_fails: Mutex<Option<ErrorKind>>,
    pub(super) loaded: AtomicU64,
    /// Told after each round, if set.
    pub(super) rounds_tx: Mutex<Option<crossbeam_channel::Sender<()>>>,
    /// While set, a round says so on the first channel, then waits until
    /// the second one's sender is dropped.
    pub(super) hold: Mutex<
        Option<(
            crossbeam_channel::Sender<()>,
            crossbeam_channel::Receiver<()>,
        )>,
    >,
}

impl Wire {
    pub(super) fn rounds(&self) -> Vec<(Duration, Vec<String>)> {
        self.rounds.lock().clone()
    }

    /// The clock readings of the rounds that ran `key`.
    pub(super) fn runs_of(&self, key: &str) -> Vec<Duration> {
        self.rounds
            .lock()
            .iter()
            .filter(|(_, keys)| keys.iter().any(|k| k == key))
            .map(|(t, _)| *t)
            .collect()
    }
}

pub(super) struct FakeTransport {
    pub(super) wire: Arc<Wire>,
    pub(super) clock: Arc<dyn crate::timer::Clock>,
    pub(super) connected: bool,
}

impl Transport for FakeTransport {
    fn round_trip(&mut self, commands: &Commands) -> Result<Vec<Value>, Error> {
        let hold = self.wire.hold.lock().clone();
        if let Some((entered, release)) = hold {
            let _ = entered.send(());
            let _ = release.recv();
        }
        if self.wire.down.load(Ordering::SeqCst) {
            self.connected = false;
            return Err(Error::new(ErrorKind::Unavailable, "fake: down"));
        }
        if !self.connected {
            self.connected = true;
            self.wire.connects.fetch_add(1, Ordering::SeqCst);
        }
        // A fake job's command is its key.
        let routes: Vec<String> = (0..commands.len())
            .map(|i| String::from_utf8_lossy(commands.command(i)).into_owned())
            .collect();
        self.wire
            .rounds
            .lock()
            .push((self.clock.now(), routes.clone()));
        if let Some(tx) = self.wire.rounds_tx.lock().as_ref() {
            let _ = tx.send(());
        }
        let mut noscript = self.wire.noscript.lock();
        Ok(routes
            .iter()
            .map(|r| {
                let listed = noscript.iter().position(|n| n == r);
                if let Some(i) = listed {
                    noscript.remove(i);
                }
                if listed.is_some() || self.wire.always_noscript.load(Ordering::SeqCst) {
                    redis::parse_redis_value(b"-NOSCRIPT No matching script.\r\n")
                        .expect("an error reply parses")
                } else {
                    Value::Okay
                }
            })
            .collect())
    }

    fn server_of(&self, _command: usize) -> Option<usize> {
        Some(0)
    }

    fn load_script(&mut self, _script: &Script, _server: usize) -> Result<(), Error> {
        self.wire.loaded.fetch_add(1, Ordering::SeqCst);
        match *self.wire.load_fails.lock() {
            Some(kind) => Err(Error::new(kind, "fake: the load was refused")),
            None => Ok(()),
        }
    }

    fn connects(&self) -> u64 {
        self.wire.connects.load(Ordering::SeqCst)
    }

    fn round_trips(&self) -> u64 {
        self.wire.rounds.lock().len() as u64
    }

    fn measure_clock(&mut self, _now: &dyn Fn() -> Duration) -> Option<ClockSample> {
        None
    }
}

/// A job whose outcomes the test scripts; once the script is used up it
/// answers `otherwise`.
pub(super) struct FakeJob {
    pub(super) key: Arc<str>,
    pub(super) script: Mutex<VecDeque<Result<Next, Error>>>,
    pub(super) otherwise: Next,
}

pub(super) static FAKE_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new("return 1"));

impl Job for FakeJob {
    fn describe(&self) -> String {
        format!("fake job {}", self.key)
    }

    fn commands(&self, out: &mut Commands) {
        out.push(0, self.key.as_bytes());
    }

    fn scripts(&self) -> &[&'static Script] {
        static S: LazyLock<[&'static Script; 1]> = LazyLock::new(|| [&*FAKE_SCRIPT]);
        &*S
    }

    fn on_reply(&self, replies: &[Value]) -> Result<Next, Error> {
        assert_eq!(replies, [Value::Okay]);
        self.script.lock().pop_front().unwrap_or(Ok(self.otherwise))
    }
}

pub(super) fn job(key: &str, otherwise: Next) -> Arc<FakeJob> {
    scripted(key, otherwise, vec![])
}

pub(super) fn scripted(
    key: &str,
    otherwise: Next,
    script: Vec<Result<Next, Error>>,
) -> Arc<FakeJob> {
    Arc::new(FakeJob {
        key: Arc::from(key),
        script: Mutex::new(script.into()),
        otherwise,
    })
}

pub(super) struct Rig {
    pub(super) clock: ManualClock,
    pub(super) wire: Arc<Wire>,
    pub(super) driver: Driver,
}

impl Rig {
    pub(super) fn new() -> Rig {
        Rig::with(Rig::config())
    }

    pub(super) fn config() -> DriverConfig {
        DriverConfig {
            job_backoff_min: ms(100),
            job_backoff_max: ms(300),
            reconnect_min: ms(10),
            reconnect_max: ms(40),
            clock_refresh: None,
            backstop_grace: ms(5),
        }
    }

    pub(super) fn with(config: DriverConfig) -> Rig {
        let clock = ManualClock::new();
        let wire = Arc::new(Wire::default());
        // The server's clock reads what the manual clock reads, in ms.
        let server_clock = Arc::new(ServerClock::default());
        server_clock.set(ClockSample {
            local: Duration::ZERO,
            server_us: 0,
            rtt: Duration::ZERO,
        });
        let driver = Driver::start(
            config,
            FakeTransport {
                wire: Arc::clone(&wire),
                clock: Arc::new(clock.clone()),
                connected: false,
            },
            clock.clone(),
            server_clock,
            "driver-test",
        )
        .expect("driver starts");
        Rig {
            clock,
            wire,
            driver,
        }
    }

    /// Moves time forward and waits until the wheel and the driver have
    /// done everything that fell due.
    pub(super) fn advance(&self, by: Duration) {
        self.clock.advance(by);
        self.driver.settle();
        // A round may have armed timeouts that are due already.
        self.clock.settle();
        self.driver.settle();
    }

    pub(super) fn register(&self, job: Arc<FakeJob>, first: Deadline, guard: Option<Duration>) {
        let key = job.key.to_string();
        assert!(self.driver.register(&key, job, first, guard));
        self.clock.settle();
        self.driver.settle();
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        // Release a held round, if any, so the thread can end.
        self.wire.hold.lock().take();
        let _ = self
            .driver
            .shutdown(Some(Instant::now() + Duration::from_secs(10)));
    }
}

/// A job with nothing to send this time (a group job whose members are
/// not ready yet).
pub(super) struct EmptyJob {
    pub(super) replies: AtomicU64,
}

impl Job for EmptyJob {
    fn describe(&self) -> String {
        "empty job".to_owned()
    }

    fn commands(&self, _out: &mut Commands) {}

    fn on_reply(&self, replies: &[Value]) -> Result<Next, Error> {
        assert!(replies.is_empty());
        self.replies.fetch_add(1, Ordering::SeqCst);
        Ok(Next::After(ms(100)))
    }
}
