//! Claiming ahead (`ConsumerOptions::claim_ahead`): a driver job of the
//! pool claims delayed messages up to a window before they fall due
//! (`claim_ahead.lua`), keeps them in memory, and at each one's due time
//! this process's wheel hands it to the pool's workers, with no round trip
//! in between. The workers' acks come back to the job, which sends them
//! (with `claim.lua`, claiming nothing) in its next round.
//!
//! When the job runs: when its own reply says the next message falls into
//! the window; when a wake-up of the queue announces a new head (the
//! queue's [`AheadKeys`], told by the `wake` listener and, after each
//! transfer, by the queue's own job, since occurrences fired ahead are not
//! published), shifted earlier by the window; when a worker finishes (acks
//! to send, room to claim more).
//!
//! A claim-ahead request whose reply is lost is sent again as the same
//! request and answered from its reply record, as every claim is. At
//! shutdown the messages not yet started go back to `delayed` at their due
//! time (`claim_ahead.lua`'s give-back), uncounted.
//!
//! Files: this one (the job: when it claims, holding messages until their
//! due time, acks, shutdown), `script.rs` (its commands and their
//! replies), `pace.rs` (waking workers for due messages, paced).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use crossbeam_channel::Sender;
use parking_lot::Mutex;
use redis::Value;

use super::running::{Ack, Inner, RunHandler};
use crate::error::{Error, ErrorKind};
use crate::queue::claim::Undecodable;
use crate::queue::codec::Codec;
use crate::queue::delivery::Delivery;
use crate::queue::handle::Queue;
use crate::queue::request::Request;
use crate::runtime::{Commands, Deadline, Job, Next, slot};
use crate::scripts::{self, CLAIM_BATCH_MAX};
use crate::timer::Timeout;

mod pace;
mod script;

use self::pace::Pacer;

/// How long a finished handler's ack waits for others to go out with it.
const ACK_GATHER: Duration = Duration::from_millis(2);

/// The driver keys of this process's pools that claim ahead from one
/// queue, with their windows: announcements of the queue's next due time
/// reach them a window early.
#[derive(Default)]
pub(crate) struct AheadKeys(Mutex<Vec<(Arc<str>, Duration)>>);

impl AheadKeys {
    fn add(&self, key: &Arc<str>, window: Duration) {
        self.0.lock().push((Arc::clone(key), window));
    }

    fn remove(&self, key: &str) {
        self.0.lock().retain(|(k, _)| &**k != key);
    }

    /// Tells each pool claiming ahead that a message falls due `at`: it
    /// runs a window before.
    pub(crate) fn announce(&self, driver: &crate::runtime::driver::Driver, at: Deadline) {
        let list = self.0.lock();
        for (key, window) in list.iter() {
            let at = match at {
                Deadline::Now => Deadline::Now,
                Deadline::After(d) => Deadline::After(d.saturating_sub(*window)),
                Deadline::ServerMs(ms) => {
                    Deadline::ServerMs(ms.saturating_sub(window.as_millis() as i64))
                }
            };
            driver.announce(key, at);
        }
    }
}

/// A message claimed ahead, as the workers get it: its due time (its score
/// in `delayed`, when its handler may start; after a nack, later than the
/// due time its delivery reports) and the delivery, or the message that
/// did not decode.
pub(super) type Ahead<T> = (i64, Result<Delivery<T>, Undecodable>);

/// The job: see the [module documentation](self).
pub(super) struct AheadJob<T: Codec> {
    me: Weak<AheadJob<T>>,
    q: Queue<T>,
    inner: Arc<Inner>,
    key: Arc<str>,
    slot: u16,
    window_ms: u64,
    max: usize,
    vis_ms: u64,
    st: Mutex<State<T>>,
    /// Messages whose due time has come, for the workers.
    pace: Arc<Pacer<Ahead<T>>>,
}

struct State<T> {
    /// Claimed and not yet finished (waiting, queued for a worker, or
    /// running).
    held: usize,
    /// Acks of finished handlers, the first `acks_sent` of them on the wire.
    acks: Vec<Ack>,
    acks_sent: usize,
    /// The acks' request (claim.lua claiming nothing) and the claims'.
    ack_req: Request,
    claim_req: Request,
    /// The claim request on the wire (or whose reply never came: sent
    /// again as is), with its count.
    pending: Option<(Vec<u8>, usize)>,
    /// What the last `commands` sent: acks, a claim.
    sent: (bool, bool),
    /// Claimed messages waiting for their due time, by due ms, with the
    /// wheel timeout of each due time.
    waiting: BTreeMap<i64, Vec<Ahead<T>>>,
    timeouts: HashMap<i64, Timeout>,
    stopped: bool,
}

impl<T: Codec> AheadJob<T> {
    /// Registers the job of a pool of `workers` on `q` (window, most held,
    /// the channel that wakes workers) and returns it.
    pub(super) fn start(
        q: &Queue<T>,
        inner: &Arc<Inner>,
        (window, max, workers): (Duration, usize, usize),
        wake: Sender<()>,
        n: u64,
    ) -> Arc<AheadJob<T>> {
        let key: Arc<str> = Arc::from(format!("ahead {} {n}", q.state.name));
        let job = Arc::new_cyclic(|me| AheadJob {
            me: Weak::clone(me),
            q: q.clone(),
            inner: Arc::clone(inner),
            key: Arc::clone(&key),
            slot: slot(q.state.keys.delayed.as_bytes()),
            window_ms: window.as_millis() as u64,
            max,
            vis_ms: q.visibility.as_millis().clamp(1, u128::from(u32::MAX)) as u64,
            pace: Pacer::new(wake, workers, q.rt()),
            st: Mutex::new(State {
                held: 0,
                acks: Vec::new(),
                acks_sent: 0,
                ack_req: Request::new(&q.state.keys),
                claim_req: Request::new(&q.state.keys),
                pending: None,
                sent: (false, false),
                waiting: BTreeMap::new(),
                timeouts: HashMap::new(),
                stopped: false,
            }),
        });
        q.state.ahead.add(&key, window);
        q.rt()
            .driver
            .register(&key, Arc::clone(&job) as Arc<dyn Job>, Deadline::Now, None);
        job
    }

    /// Runs a message claimed ahead on a worker (a message that did not
    /// decode becomes a dead letter instead).
    pub(super) fn run(&self, worker: usize, (_, m): Ahead<T>, run: &RunHandler<Delivery<T>>) {
        let ack = match m {
            Ok(d) => run(worker, &d),
            Err(u) => {
                let e = self
                    .q
                    .dead_on_arrival(&u.id, &u.stored, Some(&u.token), u.cause);
                tracing::warn!(target: "redwheel::queue", queue = %self.q.state.name, id = %u.id, error = %e, "consumer: a message could not be decoded; it is a dead letter now");
                None
            }
        };
        self.finished(ack);
    }

    /// A worker finished a message claimed ahead: its ack (if it
    /// succeeded) goes out with the job's next round, and there is room
    /// for one more.
    fn finished(&self, ack: Option<Ack>) {
        let mut st = self.st.lock();
        st.held = st.held.saturating_sub(1);
        // The first ack since the last round arms the job; the others
        // find it armed.
        let first = st.acks.len() == st.acks_sent;
        if let Some(a) = ack {
            st.acks.push(a);
        }
        drop(st);
        if first {
            self.q
                .rt()
                .driver
                .announce(&self.key, Deadline::After(ACK_GATHER));
        }
    }

    /// Stops the job: no more claims or hand-outs; the messages not yet
    /// handed to a worker (waiting, or still in `queued`, the workers'
    /// channel) go back to the queue at their due time, and the acks not
    /// yet sent are sent. Called once the workers have ended.
    pub(super) fn stop(&self) {
        let rt = self.q.rt();
        rt.driver.unregister(&self.key);
        self.q.state.ahead.remove(&self.key);
        let (mut back, acks, pending) = {
            let mut st = self.st.lock();
            st.stopped = true;
            for (_, t) in st.timeouts.drain() {
                t.cancel();
            }
            let back: Vec<Ahead<T>> = std::mem::take(&mut st.waiting)
                .into_values()
                .flatten()
                .collect();
            (back, std::mem::take(&mut st.acks), st.pending.take())
        };
        back.extend(self.pace.drain());
        // A claim whose reply never came (lost, or the round was in flight
        // as the job was unregistered): the same request again is answered
        // with what it claimed, which goes back too.
        if let Some((packed, _)) = pending {
            match self.replay(&packed) {
                Ok(claims) => back.extend(claims),
                Err(e) => {
                    tracing::warn!(target: "redwheel::queue", queue = %self.q.state.name, error = %e, "consumer: could not learn what a claim ahead did at shutdown; its messages come back when their visibility ends");
                }
            }
        }
        if !acks.is_empty() {
            match self.q.claim_acking(&acks, 0, Duration::ZERO) {
                Ok(got) => {
                    self.inner.handled.fetch_add(got.acked, Ordering::Relaxed);
                }
                Err(e) => {
                    tracing::warn!(target: "redwheel::queue", queue = %self.q.state.name, error = %e, "consumer: could not ack messages claimed ahead at shutdown; they come back when their visibility ends");
                }
            }
        }
        if let Err(e) = self.give_back(&back) {
            tracing::warn!(target: "redwheel::queue", queue = %self.q.state.name, error = %e, "consumer: could not give back messages claimed ahead at shutdown; they come back when their visibility ends");
        }
    }

    /// Keeps the claimed messages until their due time: one wheel timeout
    /// per due time hands them to the workers.
    fn hold(&self, st: &mut State<T>, claims: Vec<Ahead<T>>) {
        let rt = self.q.rt();
        for (due, m) in claims {
            st.held += 1;
            st.waiting.entry(due).or_default().push((due, m));
            if st.timeouts.contains_key(&due) {
                continue;
            }
            let delay = rt.driver.until_server_ms(due).unwrap_or_else(|| {
                let now = rt.server_now_ms() as i64;
                Duration::from_millis(due.saturating_sub(now).max(0) as u64)
            });
            let me = Weak::clone(&self.me);
            if let Some(t) = rt
                .driver
                .after(delay.max(Duration::from_micros(1)), move || {
                    if let Some(job) = me.upgrade() {
                        job.hand_out(due);
                    }
                })
            {
                st.timeouts.insert(due, t);
            }
        }
    }

    /// The wheel's task at a due time: the messages due then go to the
    /// workers (paced: `pace.rs`).
    fn hand_out(&self, due: i64) {
        let mut st = self.st.lock();
        st.timeouts.remove(&due);
        if st.stopped {
            return;
        }
        let Some(ms) = st.waiting.remove(&due) else {
            return;
        };
        drop(st);
        let rt = self.q.rt();
        self.q.state.metrics.delivered(
            ms.iter()
                .filter_map(|(_, m)| m.as_ref().ok())
                .map(|d| (d.attempt, d.due_ms)),
            || rt.server_now_ms(),
        );
        self.pace.push(ms);
    }

    /// The next due message for a woken worker; `None` (and the worker
    /// goes back to sleep) when there is none.
    pub(super) fn next_due(&self) -> Option<Ahead<T>> {
        self.pace.next()
    }

    /// Whether the pool is stopping.
    pub(super) fn stopping(&self) -> bool {
        self.inner.stop.load(Ordering::Relaxed)
    }

    /// Reads a claim's reply into held messages; when to run next.
    fn on_claims(&self, st: &mut State<T>, reply: &Value, count: usize) -> Result<Next, Error> {
        let reply = self.parse_claims(reply)?;
        let (gate, now, next, claims) = (reply.gate, reply.now, reply.next, reply.claims);
        let claimed = claims.len();
        if claimed > 0 {
            // This process's transfer job looks at the in-flight set when
            // the first of these visibilities could end (its reply then
            // arms it for the next).
            let first = claims.iter().map(|(d, _)| *d).min().unwrap_or(now);
            self.q.announce_deadline(Duration::from_millis(
                (first.max(now) - now) as u64 + self.vis_ms,
            ));
            self.hold(st, claims);
        }
        if gate != 0 || st.held >= self.max {
            // Controls on the queue, or full: a wake-up or a finished
            // handler brings the job back.
            return Ok(Next::Idle);
        }
        if claimed >= count {
            return Ok(Next::Again);
        }
        if next < 0 {
            return Ok(Next::Idle);
        }
        let at = next - self.window_ms as i64;
        Ok(if at <= now {
            Next::Again
        } else {
            Next::After(Duration::from_millis((at - now) as u64))
        })
    }
}

impl<T: Codec> Job for AheadJob<T> {
    fn describe(&self) -> String {
        format!("claims ahead of queue {:?}", self.q.state.name)
    }

    fn scripts(&self) -> &[&'static redis::Script] {
        static SCRIPTS: std::sync::LazyLock<[&'static redis::Script; 2]> =
            std::sync::LazyLock::new(|| [&*scripts::CLAIM_AHEAD, &*scripts::CLAIM]);
        &*SCRIPTS
    }

    fn commands(&self, out: &mut Commands) {
        let mut st = self.st.lock();
        let st = &mut *st;
        st.sent = (false, false);
        if st.stopped {
            return;
        }
        if !st.acks.is_empty() {
            let packed = self.acks_command(st);
            out.push(self.slot, &packed);
            st.acks_sent = st.acks.len();
            st.sent.0 = true;
        }
        let stopping = self.inner.stop.load(Ordering::SeqCst);
        if st.pending.is_none() && !stopping && st.held < self.max {
            let count = (self.max - st.held).min(CLAIM_BATCH_MAX);
            let packed = self.claim_command(st, count);
            st.pending = Some((packed, count));
        }
        if let Some((packed, _)) = &st.pending {
            out.push(self.slot, packed);
            st.sent.1 = true;
        }
    }

    fn on_reply(&self, replies: &[Value]) -> Result<Next, Error> {
        let mut st = self.st.lock();
        let st = &mut *st;
        if st.stopped {
            // `stop` took the pending claim and settles it itself.
            return Ok(Next::Idle);
        }
        let (acks, claim) = std::mem::take(&mut st.sent);
        let mut replies = replies.iter();
        if acks {
            let reply = replies.next().cloned().unwrap_or(Value::Nil);
            let got = self.q.read_claims_raw(reply)?;
            let sent = st.acks_sent.min(st.acks.len());
            st.acks.drain(..sent);
            st.acks_sent = 0;
            self.inner.handled.fetch_add(got.acked, Ordering::Relaxed);
            self.q.state.metrics.acked.add(got.acked);
            if got.refused > 0 {
                tracing::warn!(target: "redwheel::queue", queue = %self.q.state.name, refused = got.refused, "consumer: a message claimed ahead was delivered again before its handler's ack; that result is dropped");
            }
        }
        if !claim {
            return Ok(Next::Idle);
        }
        let Some((_, count)) = st.pending else {
            return Ok(Next::Idle);
        };
        let reply = replies.next().ok_or_else(|| {
            self.q.tag(Error::new(
                ErrorKind::Protocol,
                "no reply to claim_ahead.lua",
            ))
        })?;
        let next = self.on_claims(st, reply, count)?;
        st.pending = None;
        Ok(next)
    }
}
