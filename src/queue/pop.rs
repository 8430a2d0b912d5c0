//! The blocking pop shared by `take` and `claim`: run the pop script, and
//! if it found nothing, block on the ready list (server-side, at most
//! `max_block` a round) and run it again; while the queue's controls hold
//! the caller back, wait at the queue's gate instead (in this process, woken
//! by the driver or the wake channel, see `gate.rs`); wait out Redis being
//! unreachable and a moving cluster slot. The script is one request
//! (`queue/request.rs`): a round lost with its connection is sent again
//! until an answer comes, which is what the lost one did.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::codec::Codec;
use super::handle::Queue;
use super::request::RESOLVE_WITHIN;
use crate::error::{Access, Error, ErrorKind};
use crate::runtime::{Backoff, Blocking, Conn, Deadline, random_u64, shut_down};
use crate::telemetry;

/// Whether a request whose attempt may have run has been answered since;
/// from when it has not.
#[derive(Debug, Default)]
pub(crate) struct Unresolved(Option<Instant>);

impl Unresolved {
    /// An attempt may have run and its answer was lost.
    pub(crate) fn lost(&mut self) {
        self.0.get_or_insert_with(Instant::now);
    }

    /// An answer came.
    pub(crate) fn resolved(&mut self) {
        self.0 = None;
    }

    /// True while an attempt may have run unanswered.
    pub(crate) fn pending(&self) -> bool {
        self.0.is_some()
    }

    /// True once resending has gone on for too long to trust the reply
    /// record to still be there ([`RESOLVE_WITHIN`]).
    pub(crate) fn too_old(&self) -> bool {
        self.0.is_some_and(|t| t.elapsed() >= RESOLVE_WITHIN)
    }

    /// The caller's error when it stops resending `what` while unresolved.
    pub(crate) fn outcome_unknown(&self, what: &str, cause: Option<Error>) -> Error {
        let e = Error::new(
            ErrorKind::OutcomeUnknown,
            format!("{what} may have run on redis, and redis could not be asked what it did"),
        );
        match cause {
            Some(c) => e.with_cause(c),
            None => e,
        }
    }
}

/// 64 random bits per process, then a counter: a prefix no two pop script
/// calls share (claim tokens, entries of the rate limit's log).
pub(crate) fn call_prefix() -> String {
    use std::sync::OnceLock;
    static SEED: OnceLock<u64> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let seed = *SEED.get_or_init(random_u64);
    format!("{seed:x}.{:x}", COUNTER.fetch_add(1, Ordering::Relaxed))
}

/// The gate `take.lua` and `claim.lua` answer when they were sent the
/// short key list of a queue without controls and find the controls hash:
/// they did nothing, and the same request goes again with every key.
pub(crate) const NEEDS_ALL_KEYS: i64 = -3;

impl<T: Codec> Queue<T> {
    /// The keys to send a pop script: `all` once this process has seen the
    /// queue's controls, else the first `plain` (what a queue without
    /// controls needs: Redis then builds fewer key strings per call).
    pub(crate) fn pop_keys<'k>(&self, all: &'k [&'k str], plain: usize) -> &'k [&'k str] {
        if self.state.controls_seen.load(Ordering::Relaxed) {
            all
        } else {
            &all[..plain.min(all.len())]
        }
    }

    /// Reads a pop script's gate: true (and every later call sends all
    /// keys) if it was [`NEEDS_ALL_KEYS`].
    pub(crate) fn needs_all_keys(&self, gate: i64) -> bool {
        if gate == NEEDS_ALL_KEYS {
            self.state.controls_seen.store(true, Ordering::Relaxed);
            return true;
        }
        false
    }
}

/// What one round of a pop script gave.
enum Popped {
    /// A reply with something in it, for the caller to read.
    Found(redis::Value),
    /// Nothing was ready (or the wait ran out).
    Nothing,
    /// The controls held it back: -1 paused, -2 no in-flight slot, or µs
    /// until the rate limit lets the next delivery through.
    Gated(i64),
    /// It was sent the short key list and found the queue's controls: it
    /// did nothing; send it again (the next round sends every key).
    Resend,
}

impl<T: Codec> Queue<T> {
    /// Runs `script` (which pops from the ready list and replies with an
    /// array whose first `header` elements are a header: the gate, then the
    /// messages it found past their ttl, then its own; more elements only
    /// when it found something) until it finds something or `deadline`
    /// passes, waiting on the ready list in between (blocking server-side,
    /// at most `max_block` a round), or at the queue's gate while the
    /// controls hold it back. The gate opens at every run of this process's
    /// transfer job (announced for the instant a rate window lets the next
    /// delivery through, and at each guard sweep) and on every message of
    /// the wake channel; a held-back caller also looks again after
    /// `max_block`, so shutdown is noticed. Waits out Redis being
    /// unreachable and a moving cluster slot.
    ///
    /// The script call is one request (its keys and arguments carry its
    /// reply record and number): a round whose connection was lost after
    /// sending (reset, cut reply, timeout) is sent again, on a new
    /// connection, until Redis answers, and the answer is what the lost
    /// round did. Past `deadline` (and `command_timeout` more to get that
    /// answer), at shutdown, or after [`RESOLVE_WITHIN`], a round that may
    /// have run unanswered makes this fail with
    /// [`ErrorKind::OutcomeUnknown`] rather than return nothing.
    ///
    /// `stop`, when given (a consumer pool's flag), ends the wait with
    /// nothing once it is set: within `max_block`, however long `deadline`.
    pub(crate) fn wait_pop(
        &self,
        (deadline, stop): (Option<Instant>, Option<&AtomicBool>),
        op: (&'static str, usize),
        script: &redis::Script,
        (keys, plain): (&[&str], usize),
        args: &[&[u8]],
        header: usize,
    ) -> Result<Option<redis::Value>, Error> {
        let rt = self.rt();
        let max_block = rt.options.max_block;
        let mut backoff = Backoff::new(rt.options.reconnect_min, rt.options.reconnect_max);
        let pop = Pop {
            op,
            script,
            keys,
            plain,
            args,
            header,
        };
        let gate = &self.state.gate;
        let mut unresolved = Unresolved::default();
        let answer_within = rt.options.command_timeout;
        let give_up = |unresolved: &Unresolved, e: Error| -> Error {
            if unresolved.pending() {
                self.tag(unresolved.outcome_unknown(op.0, Some(e)))
            } else {
                e
            }
        };
        // The latest a call with a deadline returns, whatever Redis does:
        // `command_timeout` past its deadline. Every read, connect and
        // wait below ends by then (a frozen server accepts connections and
        // never answers), so a round lost late has what is left of it to
        // be answered, not a whole `command_timeout` more.
        let hard = deadline.and_then(|d| d.checked_add(answer_within));
        // While a lost round is unanswered, wait for its answer (until
        // `hard`), not for messages (no blocking).
        let until = |unresolved: &Unresolved| match (deadline, unresolved.0) {
            (Some(_), Some(_)) => hard,
            _ => deadline,
        };
        loop {
            if rt.is_shut_down() {
                return Err(give_up(&unresolved, self.tag(shut_down())));
            }
            if unresolved.too_old() {
                return Err(self.tag(unresolved.outcome_unknown(op.0, None)));
            }
            // The caller (a consumer pool) stops: nothing more to wait for,
            // once no round is left unanswered (at most `max_block` after
            // the flag is set, the longest one round blocks in Redis).
            if !unresolved.pending() && stop.is_some_and(|s| s.load(Ordering::SeqCst)) {
                return Ok(None);
            }
            // Read before the script runs, so an opening of the gate between
            // its reply and the wait below is not missed.
            let seen = gate.generation();
            let mut con = match rt.blocking(&self.state.keys.ready, hard) {
                Ok(c) => c,
                Err(e) if e.is_transient() => {
                    rt.topology_may_have_changed();
                    if !wait_backoff(until(&unresolved), &mut backoff, max_block) {
                        return Err(give_up(&unresolved, self.tag(e)));
                    }
                    continue;
                }
                Err(e) => return Err(give_up(&unresolved, self.tag(e))),
            };
            let round_deadline = if unresolved.pending() {
                Some(Instant::now())
            } else {
                deadline
            };
            match self.pop_round(&mut con, (round_deadline, hard), max_block, &pop) {
                Ok(Popped::Found(value)) => {
                    rt.put_blocking(con);
                    return Ok(Some(value));
                }
                Ok(Popped::Nothing) => {
                    rt.put_blocking(con);
                    unresolved.resolved();
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        return Ok(None);
                    }
                    backoff.reset();
                }
                Ok(Popped::Resend) => {
                    rt.put_blocking(con);
                    unresolved.resolved();
                }
                Ok(Popped::Gated(g)) => {
                    rt.put_blocking(con);
                    unresolved.resolved();
                    let now = Instant::now();
                    if deadline.is_some_and(|d| now >= d) {
                        return Ok(None);
                    }
                    let mut until = now + max_block;
                    if let Some(d) = deadline {
                        until = until.min(d);
                    }
                    if g > 0 {
                        // The rate window lets the next one through in `g`
                        // µs (measured from the script's TIME, so never
                        // early): the driver runs the queue's job then,
                        // which opens the gate.
                        rt.driver.announce(
                            &self.state.job_key,
                            Deadline::After(Duration::from_micros(g as u64)),
                        );
                    }
                    gate.wait(seen, until, g == -2);
                    backoff.reset();
                }
                Err(e) if slot_is_moving(&e) => {
                    // A cluster slot being migrated or failed over (an
                    // error reply: the script did not run): the queue is
                    // reachable again once the move completes.
                    drop(con);
                    rt.topology_may_have_changed();
                    if !wait_backoff(until(&unresolved), &mut backoff, max_block) {
                        if unresolved.pending() {
                            return Err(self.tag(unresolved.outcome_unknown(op.0, None)));
                        }
                        return Ok(None);
                    }
                }
                Err(e) => {
                    drop(con);
                    if may_have_run(&e) {
                        unresolved.lost();
                    }
                    let e = self.tag(Error::from_redis(e, Access::Write));
                    if !e.is_transient() {
                        return Err(give_up(&unresolved, e));
                    }
                    rt.topology_may_have_changed();
                    // A connection lost while blocked, or with the
                    // script's reply: the next round is the same request,
                    // answered with what the lost one did.
                    tracing::debug!(target: "redwheel::queue", queue = %self.state.name, error = %e, "redis unavailable while waiting; retrying");
                    if !wait_backoff(until(&unresolved), &mut backoff, max_block) {
                        return Err(give_up(&unresolved, e));
                    }
                }
            }
        }
    }

    /// One round: run the pop script; if it found nothing, block until the
    /// ready list is non-empty (or the round's timeout), then run it once
    /// more.
    ///
    /// Each read ends by `hard` at the latest (the call's deadline plus
    /// `command_timeout`, if it has one).
    fn pop_round(
        &self,
        b: &mut Blocking,
        (deadline, hard): (Option<Instant>, Option<Instant>),
        max_block: Duration,
        pop: &Pop<'_>,
    ) -> redis::RedisResult<Popped> {
        let Pop {
            op,
            script,
            keys,
            plain,
            args,
            header,
        } = *pop;
        let keys = self.pop_keys(keys, plain);
        let _span = telemetry::queue_op(op.0, &self.state.name, op.1);
        let invoke = |con: &mut Conn| -> redis::RedisResult<redis::Value> {
            let mut inv = script.prepare_invoke();
            for k in keys {
                inv.key(*k);
            }
            for a in args {
                inv.arg(*a);
            }
            inv.invoke(con)
        };
        let read = |v: redis::Value| -> Popped {
            let redis::Value::Array(items) = &v else {
                return Popped::Found(v);
            };
            self.count_expired(&v);
            match header_int(items, 0) {
                0 if items.len() > header => Popped::Found(v),
                0 => Popped::Nothing,
                g if self.needs_all_keys(g) => Popped::Resend,
                g => Popped::Gated(g),
            }
        };
        b.end_io_by(hard)?;
        match read(invoke(&mut b.con)?) {
            Popped::Nothing => {}
            other => return Ok(other),
        }
        let block = match deadline {
            None => max_block,
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left < Duration::from_millis(1) {
                    return Ok(Popped::Nothing);
                }
                left.min(max_block)
            }
        };
        // A blocking peek (BLMOVE from the list to itself: it waits until the
        // list is non-empty without consuming anything), pipelined with the
        // script: Redis runs the script as soon as the peek returns, with no
        // round trip back to us in between. If the peek timed out the script
        // usually finds nothing; if it finds a message, that is just as good.
        let ready = &self.state.keys.ready;
        let mut p = redis::pipe();
        p.cmd("BLMOVE")
            .arg(ready)
            .arg(ready)
            .arg("LEFT")
            .arg("LEFT")
            .arg(format!("{:.3}", block.as_secs_f64()))
            .ignore();
        let evalsha = p
            .cmd("EVALSHA")
            .arg(script.get_hash())
            .arg(keys.len())
            .arg(keys);
        for a in args {
            evalsha.arg(*a);
        }
        let packed = p.get_packed_pipeline();
        let reply = match peek_and_run(b, &packed, hard) {
            Err(e) if is_noscript(&e) => {
                // Pipelined EVALSHA is not reloaded by `redis::Script`:
                // load it and run the round again.
                b.end_io_by(hard)?;
                script.load(&mut b.con)?;
                peek_and_run(b, &packed, hard)?
            }
            other => other?,
        };
        Ok(read(reply))
    }
}
impl<T: Codec> Queue<T> {
    /// Counts the messages a pop script's reply says it found past their
    /// ttl (the header's second element) in the queue's metrics.
    pub(super) fn count_expired(&self, reply: &redis::Value) {
        if let redis::Value::Array(items) = reply {
            let expired = header_int(items, 1);
            if expired > 0 {
                self.state.metrics.expired.add(expired as u64);
                self.state.metrics.dead_lettered.add(expired as u64);
            }
        }
    }
}

/// The first element of a pop script's reply (its gate), 0 if none.
pub(crate) fn header_int_of(reply: &redis::Value) -> i64 {
    match reply {
        redis::Value::Array(items) => header_int(items, 0),
        _ => 0,
    }
}

/// Element `i` of a pop script's reply header, as an integer (0 if absent).
fn header_int(items: &[redis::Value], i: usize) -> i64 {
    match items.get(i) {
        Some(redis::Value::Int(n)) => *n,
        _ => 0,
    }
}

/// Sends the blocking peek and the script pipelined (`packed`) and reads
/// their replies, the script's last: the first that fails ends the read,
/// so a server that stopped answering costs one read timeout, not one per
/// reply (the `redis` crate's pipelines read every reply even after a
/// timeout). Each read ends by `hard`.
fn peek_and_run(
    b: &mut Blocking,
    packed: &[u8],
    hard: Option<Instant>,
) -> redis::RedisResult<redis::Value> {
    b.end_io_by(hard)?;
    b.con.send_pipeline(packed)?;
    let mut replies = b.con.recv_pipeline(2)?;
    if let Some(e) = replies.iter().find_map(|v| match v {
        redis::Value::ServerError(e) => Some(e.clone()),
        _ => None,
    }) {
        return Err(e.into());
    }
    Ok(replies.pop().unwrap_or(redis::Value::Nil))
}

/// Sleeps for the backoff's next wait (not past `deadline`, and with no
/// deadline for at most `max_block`, so that shutdown is noticed however
/// long the backoff's maximum); false if the deadline has passed.
fn wait_backoff(deadline: Option<Instant>, backoff: &mut Backoff, max_block: Duration) -> bool {
    let mut wait = backoff.step();
    match deadline {
        Some(d) => {
            let left = d.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            wait = wait.min(left);
        }
        None => wait = wait.min(max_block),
    }
    std::thread::sleep(wait);
    true
}

/// A failure after which the command may have run: the connection was
/// lost or timed out once it was sent (an error reply means it did not
/// run: our scripts fail before they write).
pub(crate) fn may_have_run(e: &redis::RedisError) -> bool {
    e.is_io_error() || e.is_connection_dropped() || e.is_timeout()
}

/// A redirect or a refusal while a cluster slot moves (`MOVED`, `ASK`,
/// `TRYAGAIN`, `CLUSTERDOWN`), also inside a pipeline's error.
fn slot_is_moving(e: &redis::RedisError) -> bool {
    use redis::ServerErrorKind as S;
    matches!(
        e.kind(),
        redis::ErrorKind::Server(S::Moved | S::Ask | S::TryAgain | S::ClusterDown)
    )
}

/// A script the server does not know (flushed, or a restarted server).
fn is_noscript(e: &redis::RedisError) -> bool {
    e.code() == Some("NOSCRIPT") || e.to_string().contains("NOSCRIPT")
}

/// A pop script with its keys and arguments, for [`Queue::wait_pop`]: the
/// script replies an array of `header` elements (the gate, the messages it
/// found past their ttl, then its own) when it found nothing, more when it
/// found something.
#[derive(Clone, Copy)]
struct Pop<'a> {
    /// What it is and the most messages it pops, for the round trip's
    /// span (`take`, `claim`).
    op: (&'static str, usize),
    script: &'a redis::Script,
    /// Every key of the script, of which the first `plain` do for a queue
    /// without controls.
    keys: &'a [&'a str],
    plain: usize,
    args: &'a [&'a [u8]],
    header: usize,
}
