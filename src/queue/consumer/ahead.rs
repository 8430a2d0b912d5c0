//! Claiming ahead (`ConsumerOptions::claim_ahead`): a driver job of the
//! pool claims delayed messages up to a window before they fall due
//! (`claim_ahead.lua`), keeps them in memory, and at each one's due time
//! this process's wheel hands it to the pool's workers, with no round trip
//! in between. The workers' acks come back to the job, which sends them
//! (with `claim.lua`, claiming nothing) in its next round.
//!
//! When the job runs: when its own reply says the next message falls into
//! the window; when a wake-up of the queue announces a new head (the
//! queue's [`AheadKeys`], read by the `wake` listener and by the queue's
//! own job after it fired schedules ahead), shifted earlier by the window;
//! when a worker finishes (acks to send, room to claim more).
//!
//! A claim-ahead request whose reply is lost is sent again as the same
//! request and answered from its reply record, as every claim is. At
//! shutdown the messages not yet started go back to `delayed` at their due
//! time (`claim_ahead.lua`'s give-back), uncounted.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use crossbeam_channel::Sender;
use parking_lot::Mutex;
use redis::Value;

use super::running::{Ack, Inner, RunHandler};
use crate::error::{Access, Error, ErrorKind};
use crate::queue::claim::{Undecodable, claim_keys};
use crate::queue::codec::Codec;
use crate::queue::delivery::Delivery;
use crate::queue::handle::Queue;
use crate::queue::request::Request;
use crate::runtime::{Commands, Deadline, Job, Next, slot};
use crate::scripts::{self, CLAIM_BATCH_MAX};
use crate::timer::Timeout;

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

/// What a claim returned.
struct ClaimReply<T> {
    /// 0, or -1: the queue has controls (nothing claimed).
    gate: i64,
    /// The server's time (ms).
    now: i64,
    /// The due time left first in `delayed` (ms), or -1.
    next: i64,
    claims: Vec<Ahead<T>>,
}

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
    /// Messages whose due time has come, for the workers, and how many
    /// workers are woken for them (see [`AheadJob::hand_out`]).
    due: Mutex<VecDeque<Ahead<T>>>,
    wake: Sender<()>,
    woken: AtomicUsize,
    checking: AtomicBool,
    /// The pool's workers, and how many to wake at first.
    workers: usize,
    first_wave: usize,
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
        let cores = std::thread::available_parallelism().map_or(2, usize::from);
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
            due: Mutex::new(VecDeque::new()),
            wake,
            woken: AtomicUsize::new(0),
            checking: AtomicBool::new(false),
            workers,
            first_wave: cores.min(workers),
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
        back.extend(self.due.lock().drain(..));
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

    /// Sends a claim request (packed) again and reads what it claimed.
    fn replay(&self, packed: &[u8]) -> Result<Vec<Ahead<T>>, Error> {
        let reply = self
            .q
            .rt()
            .run(&self.q.state.keys.delayed, Access::Write, |con| {
                redis::ConnectionLike::req_packed_command(con, packed)
            })?;
        Ok(self.parse_claims(&reply)?.claims)
    }

    /// Puts messages claimed ahead and never started back in `delayed` at
    /// their due time.
    fn give_back(&self, back: &[Ahead<T>]) -> Result<(), Error> {
        if back.is_empty() {
            return Ok(());
        }
        let keys = &self.q.state.keys;
        let record = self.st.lock().claim_req.key.clone();
        let key_list = ahead_keys(keys, &record);
        self.q
            .rt()
            .run(&keys.delayed, Access::Write, |con| {
                let mut inv = scripts::CLAIM_AHEAD.prepare_invoke();
                for k in key_list {
                    inv.key(k);
                }
                inv.arg("r");
                for (due, m) in back {
                    let (id, token) = match m {
                        Ok(d) => (d.id.as_str(), d.token.as_str()),
                        Err(u) => (u.id.as_str(), u.token.as_str()),
                    };
                    inv.arg(id).arg(token).arg(*due);
                }
                let n: u64 = inv.invoke(con)?;
                Ok(n)
            })
            .map(|n| {
                tracing::debug!(target: "redwheel::queue", queue = %self.q.state.name, given_back = n, "consumer: messages claimed ahead given back at shutdown");
            })
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
    /// workers.
    ///
    /// Not every idle worker is woken at once: a burst (a thousand
    /// occurrences in one millisecond) is handled fastest by as many
    /// threads as there are cores, since a thread that took a message and
    /// lost its core waits a whole time slice before it starts it. So as
    /// many workers as cores are woken first, and as long as messages are
    /// still waiting a tick later (slow handlers), the number woken doubles
    /// each tick, up to the whole pool.
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
        let n = ms.len();
        // Read under the lock that a worker finding none takes to count
        // itself out: a worker that missed these is not counted.
        let woken = {
            let mut due = self.due.lock();
            due.extend(ms);
            self.woken.load(Ordering::Acquire)
        };
        if woken < self.first_wave {
            self.wake_more((self.first_wave - woken).min(n));
        }
        self.check_later();
    }

    /// Wakes `n` more workers for the due messages.
    fn wake_more(&self, n: usize) {
        self.woken.fetch_add(n, Ordering::AcqRel);
        for _ in 0..n {
            let _ = self.wake.send(());
        }
    }

    /// A tick from now: more workers if messages are still waiting.
    fn check_later(&self) {
        if self.checking.swap(true, Ordering::AcqRel) {
            return;
        }
        let me = Weak::clone(&self.me);
        let armed = self.q.rt().driver.after(Duration::from_millis(1), move || {
            let Some(job) = me.upgrade() else { return };
            job.checking.store(false, Ordering::Release);
            if job.due.lock().is_empty() {
                return;
            }
            let woken = job.woken.load(Ordering::Acquire);
            let more = woken.max(1).min(job.workers.saturating_sub(woken));
            if more > 0 {
                job.wake_more(more);
            }
            job.check_later();
        });
        if armed.is_none() {
            self.checking.store(false, Ordering::Release);
        }
    }

    /// Whether the pool is stopping.
    pub(super) fn stopping(&self) -> bool {
        self.inner.stop.load(Ordering::Relaxed)
    }

    /// The next due message for a woken worker; `None` (and the worker
    /// goes back to sleep) when there is none.
    pub(super) fn next_due(&self) -> Option<Ahead<T>> {
        let mut due = self.due.lock();
        let m = due.pop_front();
        if m.is_none() {
            self.woken.fetch_sub(1, Ordering::AcqRel);
        }
        m
    }

    fn claim_command(&self, st: &mut State<T>, count: usize) -> Vec<u8> {
        let keys = &self.q.state.keys;
        st.claim_req.next();
        let req = &st.claim_req;
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(scripts::CLAIM_AHEAD.get_hash()).arg(10);
        for k in ahead_keys(keys, &req.key) {
            cmd.arg(k);
        }
        cmd.arg("c")
            .arg(self.vis_ms)
            .arg(&req.token)
            .arg(count)
            .arg(&req.seq_arg)
            .arg(&req.ttl_arg)
            .arg(self.window_ms);
        cmd.get_packed_command()
    }

    fn acks_command(&self, st: &mut State<T>) -> Vec<u8> {
        let keys = &self.q.state.keys;
        st.ack_req.next();
        let req = &st.ack_req;
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(scripts::CLAIM.get_hash()).arg(17);
        for k in claim_keys(keys, &req.key) {
            cmd.arg(k);
        }
        cmd.arg(self.vis_ms)
            .arg(&req.token)
            .arg(0)
            .arg(&req.seq_arg)
            .arg(&req.ttl_arg)
            .arg(st.acks.len());
        for (id, token) in &st.acks {
            cmd.arg(id).arg(token);
        }
        cmd.get_packed_command()
    }

    /// Reads a claim's reply into held messages; when to run next.
    /// Reads a claim's reply.
    fn parse_claims(&self, reply: &Value) -> Result<ClaimReply<T>, Error> {
        let protocol = |what: &str| {
            self.q.tag(Error::new(
                ErrorKind::Protocol,
                format!("unexpected reply to claim_ahead.lua: {what}"),
            ))
        };
        let Value::Array(items) = reply else {
            return Err(protocol("not an array"));
        };
        let int = |v: Option<&Value>, what: &str| -> Result<i64, Error> {
            v.and_then(|v| redis::from_redis_value::<i64>(v.clone()).ok())
                .ok_or_else(|| protocol(what))
        };
        let gate = int(items.first(), "no gate")?;
        let now = int(items.get(1), "no time")?;
        let next = int(items.get(2), "no next due time")?;
        let rest = items.get(3..).unwrap_or_default();
        if rest.len() % 5 != 0 {
            return Err(protocol("a truncated entry"));
        }
        let mut claims = Vec::with_capacity(rest.len() / 5);
        for e in rest.chunks(5) {
            let text = |v: &Value, what: &str| -> Result<String, Error> {
                redis::from_redis_value(v.clone()).map_err(|_| protocol(what))
            };
            let id = text(&e[0], "an id")?;
            let stored: Vec<u8> =
                redis::from_redis_value(e[1].clone()).map_err(|_| protocol("a value"))?;
            let attempt = u32::try_from(int(Some(&e[2]), "an attempt")?)
                .map_err(|_| protocol("an attempt"))?;
            let token = text(&e[3], "a token")?;
            let due = int(Some(&e[4]), "a due time")?;
            let deadline = due.max(now) as u64 + self.vis_ms;
            let m = self.q.claimed(id, stored, attempt, token, deadline);
            claims.push((due, m));
        }
        Ok(ClaimReply {
            gate,
            now,
            next,
            claims,
        })
    }

    /// Reads a claim's reply into held messages; when to run next.
    fn on_claims(&self, st: &mut State<T>, reply: &Value, count: usize) -> Result<Next, Error> {
        let ClaimReply {
            gate,
            now,
            next,
            claims,
        } = self.parse_claims(reply)?;
        let claimed = claims.len();
        if claimed > 0 {
            // This process's transfer job looks at the in-flight set when
            // the last of these visibilities could end.
            let last = claims.iter().map(|(d, _)| *d).max().unwrap_or(now);
            self.q.announce_deadline(Duration::from_millis(
                (last.max(now) - now) as u64 + self.vis_ms,
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

/// `claim_ahead.lua`'s keys, in its order, with the request's reply record.
fn ahead_keys<'a>(keys: &'a crate::queue::keys::Keys, record: &'a str) -> [&'a str; 10] {
    [
        &keys.delayed,
        &keys.msg,
        &keys.inflight,
        &keys.lease,
        &keys.attempts,
        &keys.counts,
        record,
        &keys.head,
        &keys.controls,
        &keys.wake,
    ]
}
