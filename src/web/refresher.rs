//! The overview's data: a background thread reads every queue each refresh
//! interval (see `gather.rs`) and keeps the last snapshot, each queue's
//! delivery counter over the last minutes (for the rates and the charts),
//! and whether Redis answers. Requests read the snapshot and never wait on
//! Redis; an action asks for a fresh round and waits for it, bounded.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use parking_lot::{Condvar, Mutex};

use super::Config;
use super::gather::{Gatherer, Reading};
use crate::error::{Error, ErrorKind};
use crate::runtime::Redwheel;

/// How far back the delivery counter is kept.
const HISTORY: Duration = Duration::from_secs(300);
/// Most samples kept per queue.
const HISTORY_MAX: usize = 600;
/// The window of the current delivery rate.
const RATE_WINDOW: Duration = Duration::from_secs(60);
/// Most points of a rate chart.
pub(crate) const CHART_POINTS: usize = 60;
/// A round running longer than this shows Redis as slow.
const SLOW_AFTER: Duration = Duration::from_millis(1_500);

/// How a queue is doing, worst first (the overview's order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Status {
    /// It could not be read.
    Error,
    /// A message has been due longer than the alert threshold.
    Overdue,
    /// It has dead letters.
    Dead,
    Ok,
}

impl Status {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Status::Error => "error",
            Status::Overdue => "overdue",
            Status::Dead => "dead",
            Status::Ok => "ok",
        }
    }

    pub(crate) fn of(reading: &Reading, overdue_alert: Duration) -> Status {
        if reading
            .oldest_overdue_ms
            .is_some_and(|ms| u128::from(ms) >= overdue_alert.as_millis())
        {
            Status::Overdue
        } else if reading.dead > 0 {
            Status::Dead
        } else {
            Status::Ok
        }
    }
}

/// One queue in the overview.
#[derive(Debug, Clone)]
pub(crate) struct Row {
    pub name: String,
    pub reading: Result<Reading, String>,
    pub status: Status,
    /// Deliveries per second over the last minute (`None` before two
    /// readings).
    pub rate: Option<f64>,
    /// Deliveries per second over the last minutes, oldest first.
    pub history: Vec<f64>,
}

/// What the last refresh cost.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Cost {
    pub round_trips: u64,
    pub commands: u64,
    pub took: Duration,
}

/// The result of one successful round.
#[derive(Debug)]
pub(crate) struct Snapshot {
    /// Successful rounds so far, this one included.
    pub generation: u64,
    pub at: Instant,
    pub rows: Vec<Row>,
    pub cost: Cost,
}

impl Snapshot {
    pub(crate) fn row(&self, name: &str) -> Option<&Row> {
        self.rows.iter().find(|r| r.name == name)
    }
}

/// Whether Redis answers, as the refresher sees it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Redis {
    /// No round has ended yet.
    Starting,
    Up,
    /// The round in progress has been waiting this long.
    Slow(Duration),
    /// The last round failed; down for this long.
    Down {
        down_for: Duration,
        error: String,
    },
}

impl Redis {
    pub(crate) fn as_str(&self) -> &'static str {
        match self {
            Redis::Starting => "starting",
            Redis::Up => "up",
            Redis::Slow(_) => "slow",
            Redis::Down { .. } => "down",
        }
    }
}

/// What a request sees.
#[derive(Debug, Clone)]
pub(crate) struct View {
    pub snapshot: Option<Arc<Snapshot>>,
    pub redis: Redis,
    /// How old the snapshot is.
    pub age: Option<Duration>,
}

enum Msg {
    Poke,
    Stop,
}

#[derive(Default)]
struct State {
    snapshot: Option<Arc<Snapshot>>,
    /// The last round failed: since when, and why.
    down: Option<(Instant, String)>,
    /// The round in progress, if any: when it started.
    running_since: Option<Instant>,
    started: u64,
    finished: u64,
    /// `stop` was called.
    stopped: bool,
}

struct Shared {
    state: Mutex<State>,
    finished: Condvar,
}

/// The handle on the refresher thread.
pub(crate) struct Refresher {
    shared: Arc<Shared>,
    tx: Sender<Msg>,
}

impl Refresher {
    /// Starts the thread; its first round runs at once.
    pub(crate) fn start(
        rw: Redwheel,
        config: &Arc<Config>,
    ) -> Result<(Refresher, JoinHandle<()>), Error> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            finished: Condvar::new(),
        });
        let (tx, rx) = crossbeam_channel::unbounded();
        let thread = {
            let shared = Arc::clone(&shared);
            let config = Arc::clone(config);
            std::thread::Builder::new()
                .name("redwheel-web-refresh".to_owned())
                .spawn(move || run(rw, &config, &shared, &rx))
                .map_err(|e| {
                    Error::new(ErrorKind::Spawn, "cannot start the dashboard's refresher")
                        .with_cause(e)
                })?
        };
        Ok((Refresher { shared, tx }, thread))
    }

    pub(crate) fn view(&self) -> View {
        let st = self.shared.state.lock();
        let now = Instant::now();
        let redis = match (&st.down, st.running_since, &st.snapshot) {
            (_, Some(since), _) if now.duration_since(since) >= SLOW_AFTER => {
                Redis::Slow(now.duration_since(since))
            }
            (Some((since, error)), _, _) => Redis::Down {
                down_for: now.duration_since(*since),
                error: error.clone(),
            },
            (None, _, None) => Redis::Starting,
            (None, _, Some(_)) => Redis::Up,
        };
        View {
            age: st.snapshot.as_ref().map(|s| now.duration_since(s.at)),
            snapshot: st.snapshot.clone(),
            redis,
        }
    }

    /// Asks for a round at once and waits, at most `limit`, until one that
    /// started after this call has ended.
    pub(crate) fn refresh_now(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        let mut st = self.shared.state.lock();
        let target = st.started + 1;
        if self.tx.send(Msg::Poke).is_err() {
            return;
        }
        while st.finished < target && !st.stopped {
            if self
                .shared
                .finished
                .wait_until(&mut st, deadline)
                .timed_out()
            {
                return;
            }
        }
    }

    /// Stops the thread after its round in progress; a `refresh_now`
    /// waiting returns at once.
    pub(crate) fn stop(&self) {
        let _ = self.tx.send(Msg::Stop);
        self.shared.state.lock().stopped = true;
        self.shared.finished.notify_all();
    }
}

fn run(rw: Redwheel, config: &Config, shared: &Shared, rx: &Receiver<Msg>) {
    let mut gatherer = Gatherer::new(rw, config.rescan);
    let mut history: HashMap<String, VecDeque<(Instant, u64)>> = HashMap::new();
    let mut generation = 0u64;
    loop {
        let started = Instant::now();
        {
            let mut st = shared.state.lock();
            st.started += 1;
            st.running_since = Some(started);
        }
        let result = gatherer.round();
        let mut st = shared.state.lock();
        st.running_since = None;
        match result {
            Ok(round) => {
                generation += 1;
                let rows = rows(round.readings, &mut history, started, config);
                if st.down.take().is_some() {
                    tracing::info!(target: "redwheel::web", "redis answers again");
                }
                st.snapshot = Some(Arc::new(Snapshot {
                    generation,
                    at: Instant::now(),
                    rows,
                    cost: Cost {
                        round_trips: round.round_trips,
                        commands: round.commands,
                        took: started.elapsed(),
                    },
                }));
            }
            Err(e) => {
                if st.down.is_none() {
                    tracing::warn!(target: "redwheel::web", error = %e, "cannot read the queues; the dashboard shows the last data it has");
                    st.down = Some((started, e.to_string()));
                } else if let Some((_, why)) = st.down.as_mut() {
                    *why = e.to_string();
                }
            }
        }
        st.finished += 1;
        drop(st);
        shared.finished.notify_all();
        match rx.recv_timeout(config.refresh) {
            Ok(Msg::Stop) | Err(RecvTimeoutError::Disconnected) => return,
            Ok(Msg::Poke) => {
                // Several pokes while the round ran need one round.
                while let Ok(m) = rx.try_recv() {
                    if matches!(m, Msg::Stop) {
                        return;
                    }
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
        }
    }
}

/// The rows of a round, worst first, with each queue's delivery history
/// brought up to date (queues no longer found are forgotten).
fn rows(
    readings: Vec<(String, Result<Reading, Error>)>,
    history: &mut HashMap<String, VecDeque<(Instant, u64)>>,
    at: Instant,
    config: &Config,
) -> Vec<Row> {
    let found: std::collections::HashSet<&str> = readings.iter().map(|(n, _)| n.as_str()).collect();
    history.retain(|name, _| found.contains(name.as_str()));
    let mut rows: Vec<Row> = readings
        .into_iter()
        .map(|(name, reading)| {
            let samples = history.entry(name.clone()).or_default();
            if let Ok(r) = &reading {
                samples.push_back((at, r.delivered));
                while samples.len() > HISTORY_MAX
                    || samples
                        .front()
                        .is_some_and(|(t, _)| at.duration_since(*t) > HISTORY)
                {
                    samples.pop_front();
                }
            }
            let status = match &reading {
                Ok(r) => Status::of(r, config.overdue_alert),
                Err(_) => Status::Error,
            };
            Row {
                rate: rate(samples, RATE_WINDOW),
                history: chart_rates(samples, CHART_POINTS),
                reading: reading.map_err(|e| e.to_string()),
                status,
                name,
            }
        })
        .collect();
    rows.sort_by(|a, b| order_key(a).cmp(&order_key(b)));
    rows
}

/// Worst status first; then the longest overdue, the most dead letters,
/// the most ready; then by name.
fn order_key(r: &Row) -> (Status, std::cmp::Reverse<(u64, u64, u64)>, &str) {
    let (overdue, dead, ready) = match &r.reading {
        Ok(x) => (x.oldest_overdue_ms.unwrap_or(0), x.dead, x.ready),
        Err(_) => (0, 0, 0),
    };
    (
        r.status,
        std::cmp::Reverse((overdue, dead, ready)),
        r.name.as_str(),
    )
}

/// Deliveries per second between the oldest sample within `window` of the
/// newest and the newest; a counter that went down (a Redis restart
/// without persistence) counts as no deliveries.
fn rate(samples: &VecDeque<(Instant, u64)>, window: Duration) -> Option<f64> {
    let &(last_t, last_n) = samples.back()?;
    let &(first_t, first_n) = samples
        .iter()
        .find(|(t, _)| last_t.duration_since(*t) <= window)?;
    let secs = last_t.duration_since(first_t).as_secs_f64();
    (secs > 0.0).then(|| last_n.saturating_sub(first_n) as f64 / secs)
}

/// The rates between consecutive samples, merged into at most `points`
/// buckets of equal sample counts (oldest first).
fn chart_rates(samples: &VecDeque<(Instant, u64)>, points: usize) -> Vec<f64> {
    let steps: Vec<(f64, u64)> = samples
        .iter()
        .zip(samples.iter().skip(1))
        .map(|((t0, n0), (t1, n1))| (t1.duration_since(*t0).as_secs_f64(), n1.saturating_sub(*n0)))
        .collect();
    if steps.is_empty() || points == 0 {
        return Vec::new();
    }
    let per = steps.len().div_ceil(points);
    steps
        .chunks(per)
        .map(|c| {
            let secs: f64 = c.iter().map(|(s, _)| s).sum();
            let n: u64 = c.iter().map(|(_, n)| n).sum();
            if secs > 0.0 { n as f64 / secs } else { 0.0 }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples(points: &[(u64, u64)]) -> VecDeque<(Instant, u64)> {
        let t0 = Instant::now();
        points
            .iter()
            .map(|&(ms, n)| (t0 + Duration::from_millis(ms), n))
            .collect()
    }

    #[test]
    fn the_rate_covers_the_window_and_ignores_a_counter_reset() {
        let s = samples(&[(0, 0), (30_000, 100), (90_000, 400)]);
        // The last minute: from the sample at 30 s to the one at 90 s.
        assert_eq!(rate(&s, RATE_WINDOW), Some(5.0));
        assert_eq!(rate(&samples(&[(0, 10)]), RATE_WINDOW), None);
        assert_eq!(
            rate(&samples(&[(0, 500), (1_000, 20)]), RATE_WINDOW),
            Some(0.0)
        );
    }

    #[test]
    fn chart_rates_merge_steps_into_at_most_the_points_asked() {
        let s = samples(&[(0, 0), (1_000, 2), (2_000, 6), (3_000, 6), (4_000, 10)]);
        assert_eq!(chart_rates(&s, 60), vec![2.0, 4.0, 0.0, 4.0]);
        assert_eq!(chart_rates(&s, 2), vec![3.0, 2.0]);
        assert!(chart_rates(&samples(&[(0, 1)]), 60).is_empty());
    }

    #[test]
    fn the_queue_in_trouble_comes_first() {
        let reading = |overdue: Option<u64>, dead: u64, ready: u64| Reading {
            delayed: 0,
            ready,
            in_flight: 0,
            dead,
            oldest_overdue_ms: overdue,
            next_due_ms: None,
            server_ms: 0,
            delivered: 0,
            paused: false,
        };
        let config = Config::default();
        let readings = vec![
            ("calm".to_owned(), Ok(reading(None, 0, 0))),
            ("busy".to_owned(), Ok(reading(Some(5), 0, 9))),
            ("dead".to_owned(), Ok(reading(None, 3, 0))),
            ("late".to_owned(), Ok(reading(Some(120_000), 0, 1))),
            ("later".to_owned(), Ok(reading(Some(300_000), 0, 1))),
            (
                "broken".to_owned(),
                Err(Error::new(ErrorKind::Protocol, "wrong type")),
            ),
        ];
        let rows = rows(readings, &mut HashMap::new(), Instant::now(), &config);
        let names: Vec<&str> = rows.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["broken", "later", "late", "dead", "busy", "calm"]);
        assert_eq!(rows[1].status, Status::Overdue);
        assert_eq!(rows[4].status, Status::Ok);
    }
}
