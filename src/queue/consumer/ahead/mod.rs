//! Claiming ahead (`ConsumerOptions::claim_ahead`): a driver job of the
//! pool claims delayed messages up to a window before they fall due
//! (`claim_ahead.lua`), keeps them in memory, and at each one's due time
//! hands it to the pool's workers. The workers' acks come back to the job,
//! which sends them (with `claim.lua`, claiming nothing) in its next round.
//!
//! When the job runs: when its own reply says the next message falls into
//! the window; when a wake-up of the queue announces a new head (the
//! queue's `AheadKeys` (`queue/job.rs`), told by the `wake` listener and, after each
//! transfer, by the queue's own job, since occurrences fired ahead are not
//! published) or a change of its controls, shifted earlier by the window;
//! when a worker finishes (acks to send, room to claim more); at a due time
//! (`hand.rs`).
//!
//! What is held never outlives its claim, nor starts before its time or
//! against the queue's controls (`hand.rs`): shortly before a due time one
//! check (`claim_ahead.lua` 'h', one O(1) call for every message due then)
//! reads the server's `TIME` and whether the queue has controls; the
//! hand-out is armed from that `TIME`, so it never comes before the due
//! time by the server's clock, whatever this process's estimate of it, and
//! no round trip stands between the due time and the handlers; with
//! controls, what is held goes back to `delayed` (uncounted), for the
//! claims of free workers to apply them. A message not started by half its visibility before its
//! claim ends goes back too (the job's next round, or the worker that
//! finds it so), so no held message is started on a claim the transfer may
//! already have redelivered.
//!
//! A claim-ahead request whose reply is lost is sent again as the same
//! request and answered from its reply record, as every claim is. At
//! shutdown the messages not yet started go back to `delayed` at their due
//! time (`claim_ahead.lua`'s give-back), uncounted.
//!
//! Files: this one (the job: claims, acks, give-backs, shutdown),
//! `hand.rs` (from claimed to started: waiting for the due time, the check,
//! the workers' side), `script.rs` (its commands and their replies),
//! `pace.rs` (waking workers for due messages, paced).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use crossbeam_channel::Sender;
use parking_lot::Mutex;
use redis::Value;

use super::running::{Ack, Inner};
use crate::error::{Error, ErrorKind};
use crate::queue::claim::Undecodable;
use crate::queue::codec::Codec;
use crate::queue::delivery::Delivery;
use crate::queue::handle::Queue;
use crate::queue::request::Request;
use crate::runtime::{Commands, Deadline, Job, Next, slot};
use crate::scripts::{self, CLAIM_BATCH_MAX};
use crate::timer::Timeout;

mod hand;
mod pace;
mod script;

use self::pace::Pacer;

/// How long a finished handler's ack waits for others to go out with it.
const ACK_GATHER: Duration = Duration::from_millis(2);

/// A message claimed ahead.
pub(super) struct Claimed<T> {
    /// Its score in `delayed`: when its handler may start (after a nack,
    /// later than the due time its delivery reports).
    due: i64,
    /// Its claim's visibility deadline (epoch ms, server clock).
    deadline: i64,
    /// The delivery, or the message that did not decode.
    m: Result<Delivery<T>, Undecodable>,
}

/// A due message waiting for a worker, with the latest instant (the
/// driver's clock) it may start at.
pub(super) type Due<T> = (Claimed<T>, Duration);

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
    /// How long before its claim ends a held message is no longer started
    /// (half the visibility: the visibility job, which extends it once it
    /// runs, comes every third of it).
    margin_ms: i64,
    st: Mutex<State<T>>,
    /// Messages whose due time has come, for the workers.
    pace: Arc<Pacer<Due<T>>>,
}

struct State<T> {
    /// Claimed and not yet finished or given back (waiting, queued for a
    /// worker, or running).
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
    /// What the last `commands` sent.
    sent: Sent,
    /// Claimed messages waiting for the check before their due time, by
    /// due ms, with the wheel timeout that asks for it.
    waiting: BTreeMap<i64, Vec<Claimed<T>>>,
    timeouts: HashMap<i64, Timeout>,
    /// Due times whose check is asked for: their messages (still in
    /// `waiting`) wait for it.
    due: BTreeSet<i64>,
    /// Checked messages, each with its latest start, waiting for their due
    /// time (a wheel timeout armed from the check's `TIME` hands them out).
    checked: BTreeMap<i64, Vec<Due<T>>>,
    /// Claimed messages not to be started, to give back in the next round.
    back: Vec<Claimed<T>>,
    stopped: bool,
}

/// What one round of the job sent, in its order.
#[derive(Default)]
struct Sent {
    acks: bool,
    /// How many of `back` went back.
    back: usize,
    /// The check, with the driver's clock when it was sent and the due
    /// times it is for.
    check: Option<(Duration, Vec<i64>)>,
    claim: bool,
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
        let vis_ms = q.visibility.as_millis().clamp(1, u128::from(u32::MAX)) as u64;
        let job = Arc::new_cyclic(|me| AheadJob {
            me: Weak::clone(me),
            q: q.clone(),
            inner: Arc::clone(inner),
            key: Arc::clone(&key),
            slot: slot(q.state.keys.delayed.as_bytes()),
            window_ms: window.as_millis() as u64,
            max,
            vis_ms,
            margin_ms: (vis_ms / 2) as i64,
            pace: Pacer::new(wake, workers, q.rt()),
            st: Mutex::new(State {
                held: 0,
                acks: Vec::new(),
                acks_sent: 0,
                ack_req: Request::new(&q.state.keys),
                claim_req: Request::new(&q.state.keys),
                pending: None,
                sent: Sent::default(),
                waiting: BTreeMap::new(),
                timeouts: HashMap::new(),
                due: BTreeSet::new(),
                checked: BTreeMap::new(),
                back: Vec::new(),
                stopped: false,
            }),
        });
        q.state.ahead.add(&key, window);
        q.rt()
            .driver
            .register(&key, Arc::clone(&job) as Arc<dyn Job>, Deadline::Now, None);
        job
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
    /// handed to a worker (waiting, being checked, queued for a worker, or
    /// to give back) go back to the queue at their due time, and the acks
    /// not yet sent are sent. Called once the workers have ended.
    pub(super) fn stop(&self) {
        let rt = self.q.rt();
        rt.driver.unregister(&self.key);
        self.q.state.ahead.remove(&self.key);
        let (mut back, acks, pending) = {
            let mut st = self.st.lock();
            st.stopped = true;
            let mut back = std::mem::take(&mut st.back);
            back.extend(Self::unscheduled(&mut st));
            (back, std::mem::take(&mut st.acks), st.pending.take())
        };
        // Hand-outs (and workers that find a message too late) push to the
        // workers' queue only with the state locked and not stopped: all
        // of it is here now.
        back.extend(self.pace.drain().into_iter().map(|(c, _)| c));
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
            match self.q.claim_acking(&acks, 0, (Duration::ZERO, None)) {
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

    /// Every held message not yet handed out (waiting for the check or,
    /// checked, for its due time), their wheel timeouts cancelled (a
    /// hand-out's finds nothing).
    fn unscheduled(st: &mut State<T>) -> Vec<Claimed<T>> {
        for (_, t) in st.timeouts.drain() {
            t.cancel();
        }
        st.due.clear();
        let mut out: Vec<Claimed<T>> = std::mem::take(&mut st.waiting)
            .into_values()
            .flatten()
            .collect();
        out.extend(
            std::mem::take(&mut st.checked)
                .into_values()
                .flatten()
                .map(|(c, _)| c),
        );
        out
    }

    /// The queue has controls: what is held and not started goes back in
    /// the next round (the claims of free workers apply the controls).
    fn take_back_all(&self, st: &mut State<T>) {
        let mut back = Self::unscheduled(st);
        back.extend(self.pace.drain().into_iter().map(|(c, _)| c));
        if !back.is_empty() {
            tracing::debug!(target: "redwheel::queue", queue = %self.q.state.name, n = back.len(), "consumer: the queue has controls; messages claimed ahead go back");
        }
        st.held = st.held.saturating_sub(back.len());
        st.back.extend(back);
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
            let first = claims.iter().map(|c| c.due).min().unwrap_or(now);
            self.q.announce_deadline(Duration::from_millis(
                (first.max(now) - now) as u64 + self.vis_ms,
            ));
            self.hold(st, claims);
        }
        if gate != 0 {
            // Controls on the queue: what is held goes back; a wake-up
            // (a control lifted) brings the job back.
            self.take_back_all(st);
            return Ok(Next::Idle);
        }
        if st.held >= self.max {
            // Full: a finished handler brings the job back.
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
        st.sent = Sent::default();
        if st.stopped {
            return;
        }
        if !st.acks.is_empty() {
            let packed = self.acks_command(st);
            out.push(self.slot, &packed);
            st.acks_sent = st.acks.len();
            st.sent.acks = true;
        }
        if !st.back.is_empty() {
            out.push(self.slot, &self.give_back_command(st));
            st.sent.back = st.back.len();
        }
        if !st.due.is_empty() {
            out.push(self.slot, &self.check_command(st));
            st.sent.check = Some((self.q.rt().driver.now(), st.due.iter().copied().collect()));
        }
        let stopping = self.inner.stop.load(Ordering::SeqCst);
        if st.pending.is_none() && !stopping && st.held < self.max {
            let count = (self.max - st.held).min(CLAIM_BATCH_MAX);
            let packed = self.claim_command(st, count);
            st.pending = Some((packed, count));
        }
        if let Some((packed, _)) = &st.pending {
            out.push(self.slot, packed);
            st.sent.claim = true;
        }
    }

    fn on_reply(&self, replies: &[Value]) -> Result<Next, Error> {
        let mut st = self.st.lock();
        let st = &mut *st;
        if st.stopped {
            // `stop` took the pending claim and what is held, and settles
            // them itself.
            return Ok(Next::Idle);
        }
        let sent = std::mem::take(&mut st.sent);
        let mut replies = replies.iter();
        let mut reply = |what: &str| {
            replies.next().ok_or_else(|| {
                self.q.tag(Error::new(
                    ErrorKind::Protocol,
                    format!("no reply to {what}"),
                ))
            })
        };
        if sent.acks {
            let got = self.q.read_claims_raw(reply("the acks")?.clone())?;
            let done = st.acks_sent.min(st.acks.len());
            st.acks.drain(..done);
            st.acks_sent = 0;
            self.inner.handled.fetch_add(got.acked, Ordering::Relaxed);
            self.q.state.metrics.acked.add(got.acked);
            if got.refused > 0 {
                tracing::warn!(target: "redwheel::queue", queue = %self.q.state.name, refused = got.refused, "consumer: a message claimed ahead was delivered again before its handler's ack; that result is dropped");
            }
        }
        if sent.back > 0 {
            let n = self.gave_back(reply("the give-back")?)?;
            let done = sent.back.min(st.back.len());
            st.back.drain(..done);
            tracing::debug!(target: "redwheel::queue", queue = %self.q.state.name, given_back = n, "consumer: messages claimed ahead and not started given back");
        }
        if let Some((at, dues)) = sent.check {
            self.on_check(st, reply("the hand-out check")?, at, &dues)?;
        }
        let mut next = Next::Idle;
        if sent.claim
            && let Some((_, count)) = st.pending
        {
            next = self.on_claims(st, reply("claim_ahead.lua")?, count)?;
            st.pending = None;
        }
        // Messages to give back go in the next round.
        Ok(if st.back.is_empty() {
            next
        } else {
            Next::Again
        })
    }
}
