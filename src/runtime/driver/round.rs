//! The driver thread: waits for due work (or the backstop), takes a
//! round, sends it through the transport in one pipelined round trip per
//! connection, and applies each job's outcome (its next deadline, or a
//! retry after backoff).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use redis::{Script, Value};

use super::deadlines::{DriverShared, mark_due};
use super::job::{Commands, Job, Next, Replies, Transport, is_noscript};
use super::stats::WheelGauges;
use super::wake::Msg;
use crate::error::{Error, ErrorKind};
use crate::runtime::backoff::Backoff;
use crate::runtime::server_clock::MAX_AHEAD;

/// The driver's settings.
#[derive(Debug, Clone)]
pub(crate) struct DriverConfig {
    /// Backoff of a job whose commands failed: first wait.
    pub job_backoff_min: Duration,
    /// Backoff of a job whose commands failed: longest wait.
    pub job_backoff_max: Duration,
    /// Backoff of rounds while Redis is unreachable: first wait.
    pub reconnect_min: Duration,
    /// Backoff of rounds while Redis is unreachable: longest wait.
    pub reconnect_max: Duration,
    /// How often the server clock estimate is refreshed (`None`: never).
    pub clock_refresh: Option<Duration>,
    /// How long after an armed deadline the driver stops waiting for the
    /// wheel to fire it and runs the job itself.
    pub backstop_grace: Duration,
}

impl Default for DriverConfig {
    fn default() -> Self {
        DriverConfig {
            job_backoff_min: Duration::from_millis(100),
            job_backoff_max: Duration::from_secs(5),
            reconnect_min: Duration::from_millis(10),
            reconnect_max: Duration::from_millis(50),
            clock_refresh: Some(Duration::from_secs(30)),
            backstop_grace: Duration::from_millis(5),
        }
    }
}

/// Most jobs in one round.
pub(crate) const MAX_ROUND: usize = 16_384;

/// The driver thread's state.
pub(super) struct Runner<T: Transport> {
    shared: Arc<DriverShared>,
    transport: T,
    rx: Receiver<Msg>,
    config: DriverConfig,
    reconnect: Backoff,
    /// Rounds refused for a reason retrying fast will not mend
    /// (credentials, TLS, ACL): a slower schedule, reset by a success.
    refused: Backoff,
    seen_connects: u64,
    commands: Commands,
    /// The round being run (kept to reuse its allocation).
    round: Vec<RoundJob>,
    /// Each job's outcome in that round, and whether a script of it was
    /// missing.
    outcomes: Vec<(Result<Next, Error>, Missing)>,
    /// When the current outage began (for one log line per outage).
    unavailable_since: Option<Duration>,
    /// The wheel gauges, set after rounds.
    gauges: WheelGauges,
}

/// Whether a job found a script missing on the server (`NOSCRIPT`) in a
/// round, and what loading it again did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Missing {
    /// No script was missing.
    No,
    /// Missing, and loaded again.
    Reloaded,
    /// Missing, and it could not be loaded (an ACL without `script|load`,
    /// the node gone).
    LoadFailed,
}

/// The error of a script that could not be loaded after `NOSCRIPT`: for a
/// refused load, which permission is missing.
fn script_load_error(e: Error) -> Error {
    if e.kind() == ErrorKind::PermissionDenied {
        Error::new(
            ErrorKind::PermissionDenied,
            "redis does not have a script of redwheel's (flushed, or restarted) and the redis user may not load it: it lacks the permission `script|load` (add `+script|load` to its ACL rules)",
        )
        .with_cause(e)
    } else {
        Error::new(
            e.kind(),
            "redis does not have a script of redwheel's (flushed, or restarted) and it could not be loaded",
        )
        .with_cause(e)
    }
}

/// One job of a round: its key and registration, and where its commands
/// sit among the round's.
struct RoundJob {
    /// Its entry's slab index, and the registration it was taken from.
    index: usize,
    epoch: u64,
    job: Arc<dyn Job>,
    /// Where its commands sit among the round's: the first, and how many.
    first: usize,
    count: usize,
}

impl<T: Transport> Runner<T> {
    /// The driver thread's state, before its first round.
    pub(super) fn new(
        shared: Arc<DriverShared>,
        transport: T,
        rx: Receiver<Msg>,
        config: DriverConfig,
    ) -> Runner<T> {
        Runner {
            shared,
            transport,
            rx,
            reconnect: Backoff::new(config.reconnect_min, config.reconnect_max),
            refused: Backoff::new(config.job_backoff_min, config.job_backoff_max),
            config,
            seen_connects: 0,
            commands: Commands::default(),
            round: Vec::new(),
            outcomes: Vec::new(),
            unavailable_since: None,
            gauges: WheelGauges::default(),
        }
    }

    /// Runs rounds until told to stop.
    pub(super) fn run(&mut self) {
        let mut barriers: Vec<Sender<()>> = Vec::new();
        loop {
            // Wait for work unless some is marked already.
            let idle = {
                let st = self.shared.state.lock();
                st.due.is_empty()
            } && !self.shared.clock_due.load(Ordering::Acquire);
            if idle && barriers.is_empty() {
                let grace = self.config.backstop_grace;
                let msg = match self.shared.earliest_armed() {
                    None => self.rx.recv().map_err(|_| ()),
                    Some(at) => {
                        let wait = at
                            .saturating_sub(self.shared.timer.now())
                            .saturating_add(grace);
                        match self.rx.recv_timeout(wait) {
                            Ok(msg) => Ok(msg),
                            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                                let now = self.shared.timer.now();
                                self.shared.backstop(now, grace);
                                Ok(Msg::Ready)
                            }
                            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => Err(()),
                        }
                    }
                };
                match msg {
                    Ok(msg) => {
                        if self.handle(msg, &mut barriers) {
                            break;
                        }
                    }
                    Err(()) => break,
                }
            }
            let mut stop = false;
            while let Ok(msg) = self.rx.try_recv() {
                stop |= self.handle(msg, &mut barriers);
            }
            if stop || self.shared.stopping.load(Ordering::SeqCst) {
                break;
            }
            self.shared
                .notifier
                .notified
                .store(false, Ordering::Release);
            if self.shared.clock_due.swap(false, Ordering::AcqRel) {
                self.refresh_clock();
            }
            let mut round = std::mem::take(&mut self.round);
            self.take_round(&mut round);
            if !round.is_empty() {
                self.run_round(&mut round);
            }
            round.clear();
            if round.capacity() > MAX_ROUND {
                round = Vec::new();
            }
            self.round = round;
            for b in barriers.drain(..) {
                let _ = b.send(());
            }
        }
        for b in barriers.drain(..) {
            let _ = b.send(());
        }
        tracing::debug!(target: "redwheel::runtime", "driver thread ends");
    }

    /// True on `Stop`.
    fn handle(&mut self, msg: Msg, barriers: &mut Vec<Sender<()>>) -> bool {
        match msg {
            Msg::Ready => false,
            Msg::Barrier(tx) => {
                barriers.push(tx);
                false
            }
            Msg::Stop => true,
        }
    }

    fn refresh_clock(&mut self) {
        let timer = self.shared.timer.clone();
        if let Some(sample) = self.transport.measure_clock(&|| timer.now()) {
            self.shared.server_clock.set(sample);
        }
    }

    /// Takes up to [`MAX_ROUND`] marked keys, in the order they were
    /// marked.
    fn take_round(&mut self, round: &mut Vec<RoundJob>) {
        let mut st = self.shared.state.lock();
        let st = &mut *st;
        while round.len() < MAX_ROUND {
            let Some(index) = st.due.pop_front() else {
                break;
            };
            let Some(entry) = st.entries.get_mut(index) else {
                continue;
            };
            if !entry.marked {
                continue; // an index reused after an unregister
            }
            entry.marked = false;
            round.push(RoundJob {
                index,
                epoch: entry.epoch,
                job: Arc::clone(&entry.job),
                first: 0,
                count: 0,
            });
        }
    }

    fn run_round(&mut self, round: &mut [RoundJob]) {
        self.commands.clear();
        for rj in round.iter_mut() {
            rj.first = self.commands.len();
            rj.job.commands(&mut self.commands);
            rj.count = self.commands.len() - rj.first;
        }
        let span = tracing::debug_span!(
            target: "redwheel::runtime",
            "round",
            jobs = round.len(),
            commands = self.commands.len(),
            elapsed_us = tracing::field::Empty
        );
        // A round whose jobs had nothing to send this time (a group job
        // with no member ready) is no round trip: the redis crate refuses
        // an empty pipeline, and the connection would be dropped for it.
        let empty = self.commands.len() == 0;
        let result = if empty {
            Ok(Vec::new())
        } else {
            // Timed only if someone looks (the feature, or the span).
            let sent = (cfg!(feature = "metrics") || !span.is_disabled()).then(Instant::now);
            let result = span.in_scope(|| self.transport.round_trip(&self.commands));
            if let Some(sent) = sent {
                let took = sent.elapsed();
                self.shared
                    .metrics
                    .round_duration
                    .record(took.as_secs_f64());
                span.record("elapsed_us", took.as_micros() as u64);
            }
            result
        };
        let now = self.shared.timer.now();
        let shared = Arc::clone(&self.shared);
        let stats = &shared.stats;
        if !empty {
            stats.rounds.fetch_add(1, Ordering::Relaxed);
        }
        self.gauges
            .update(now, &self.shared.timer, &self.shared.metrics);
        stats
            .commands
            .fetch_add(self.commands.len() as u64, Ordering::Relaxed);
        stats
            .round_trips
            .store(self.transport.round_trips(), Ordering::Relaxed);
        let connects = self.transport.connects();
        let reconnected = connects > self.seen_connects && self.seen_connects > 0;
        self.seen_connects = connects;
        match result {
            Err(e) => self.round_failed(round, &e, now),
            Ok(replies) => {
                if let Some(since) = self.unavailable_since.take() {
                    tracing::info!(
                        target: "redwheel::runtime",
                        down_ms = now.saturating_sub(since).as_millis() as u64,
                        "redis is reachable again"
                    );
                }
                self.reconnect.reset();
                self.refused.reset();
                self.apply_replies(round, &replies, now);
            }
        }
        if reconnected {
            stats.reconnects.fetch_add(1, Ordering::Relaxed);
            shared.metrics.reconnects.add(1);
            tracing::info!(target: "redwheel::runtime", "reconnected to redis; running every job");
            self.shared.mark_all_due();
        }
    }

    fn round_failed(&mut self, round: &[RoundJob], e: &Error, now: Duration) {
        self.shared
            .stats
            .failed_rounds
            .fetch_add(1, Ordering::Relaxed);
        self.shared.metrics.rounds_failed.add(1);
        let wait = if e.is_transient() {
            self.reconnect.step()
        } else {
            // Credentials, TLS, ACL: retrying fast will not help.
            self.refused.step()
        };
        if self.unavailable_since.is_none() {
            self.unavailable_since = Some(now);
            tracing::warn!(
                target: "redwheel::runtime",
                error = %e,
                jobs = round.len(),
                retry_in_ms = wait.as_millis() as u64,
                "a round of due work failed; retrying until redis answers"
            );
        } else {
            tracing::debug!(
                target: "redwheel::runtime",
                error = %e,
                jobs = round.len(),
                retry_in_ms = wait.as_millis() as u64,
                "a round of due work failed again"
            );
        }
        let mut st = self.shared.state.lock();
        for rj in round {
            if st.live(rj.index, rj.epoch).is_some() {
                self.shared
                    .arm_earlier(&mut st, rj.index, now.saturating_add(wait), now);
            }
        }
    }

    fn apply_replies(&mut self, round: &[RoundJob], replies: &[Value], now: Duration) {
        // Scripts loaded this round, by (script, server): each is loaded
        // once per server however many jobs found it missing there.
        let mut loads: Vec<(*const Script, usize, Result<(), Error>)> = Vec::new();
        let reloaded = Error::new(
            ErrorKind::Unavailable,
            "redis did not have a script of this job (flushed, restarted, or a node that never had it); it was loaded again",
        );
        let mut outcomes = std::mem::take(&mut self.outcomes);
        for rj in round {
            let Some(mine) = replies.get(rj.first..rj.first + rj.count) else {
                outcomes.push((
                    Err(Error::new(
                        ErrorKind::Protocol,
                        "redis sent fewer replies than commands",
                    )),
                    Missing::No,
                ));
                continue;
            };
            let mut missing = Missing::No;
            let mut failed_load = None;
            for (k, v) in mine.iter().enumerate() {
                let Value::ServerError(e) = v else { continue };
                if !is_noscript(e) {
                    continue;
                }
                missing = Missing::Reloaded;
                let Some(server) = self.transport.server_of(rj.first + k) else {
                    continue;
                };
                for &script in rj.job.scripts() {
                    let ptr = script as *const Script;
                    let at = match loads.iter().position(|(p, s, _)| *p == ptr && *s == server) {
                        Some(at) => at,
                        None => {
                            let r = self
                                .transport
                                .load_script(script, server)
                                .map_err(script_load_error);
                            loads.push((ptr, server, r));
                            loads.len() - 1
                        }
                    };
                    if loads[at].2.is_err() {
                        failed_load.get_or_insert(at);
                    }
                }
            }
            let noscript = match failed_load {
                Some(at) => {
                    missing = Missing::LoadFailed;
                    loads[at].2.as_ref().err()
                }
                None => (missing == Missing::Reloaded).then_some(&reloaded),
            };
            let outcome = rj.job.on_replies(&Replies::new(mine, noscript));
            // A script that could not be loaded is what the job's failure
            // is about, whatever else its commands got.
            let outcome = match (missing, noscript) {
                (Missing::LoadFailed, Some(e)) => Err(Error::new(e.kind(), e.to_string())),
                _ => outcome,
            };
            outcomes.push((outcome, missing));
        }
        let mut st = self.shared.state.lock();
        for (rj, (outcome, missing)) in round.iter().zip(outcomes.drain(..)) {
            let Some(entry) = st.live(rj.index, rj.epoch) else {
                continue;
            };
            // A script found missing and loaded again: the job runs again
            // in the next round, once; missing again right after that (a
            // node that keeps losing it), it backs off like any failure.
            let again = missing == Missing::Reloaded && !entry.reloaded;
            let repeated = missing == Missing::Reloaded && entry.reloaded;
            entry.reloaded = missing == Missing::Reloaded;
            let outcome = if again { Ok(Next::Again) } else { outcome };
            match outcome {
                Ok(next) => {
                    if !again {
                        entry.failures = 0;
                    }
                    match next {
                        Next::Again => {
                            mark_due(&mut st, rj.index);
                        }
                        Next::Idle => {}
                        Next::After(d) => {
                            self.shared.arm_earlier(
                                &mut st,
                                rj.index,
                                now.saturating_add(d.min(MAX_AHEAD)),
                                now,
                            );
                        }
                    }
                }
                Err(e) => {
                    entry.failures = entry.failures.saturating_add(1);
                    let failures = entry.failures;
                    // Redis unreachable for this job (a node failing over, a
                    // slot moving): retry on the reconnect schedule. Anything
                    // else will not mend itself soon (a script that cannot
                    // be loaded, or that keeps going missing): back off
                    // further.
                    let wait = if e.is_transient() && !repeated {
                        Backoff::nth(
                            self.config.reconnect_min,
                            self.config.reconnect_max,
                            failures,
                        )
                    } else {
                        Backoff::nth(
                            self.config.job_backoff_min,
                            self.config.job_backoff_max,
                            failures,
                        )
                    };
                    self.shared
                        .stats
                        .job_failures
                        .fetch_add(1, Ordering::Relaxed);
                    self.shared.metrics.job_failures.add(1);
                    if e.is_transient() && failures > 1 && !repeated {
                        tracing::debug!(
                            target: "redwheel::runtime",
                            job = %rj.job.describe(),
                            error = %e,
                            failures,
                            retry_in_ms = wait.as_millis() as u64,
                            "due work failed again; will retry"
                        );
                    } else {
                        tracing::warn!(
                            target: "redwheel::runtime",
                            job = %rj.job.describe(),
                            error = %e,
                            failures,
                            retry_in_ms = wait.as_millis() as u64,
                            "due work failed; will retry"
                        );
                    }
                    self.shared
                        .arm_earlier(&mut st, rj.index, now.saturating_add(wait), now);
                }
            }
        }
        drop(st);
        self.outcomes = outcomes;
    }
}
