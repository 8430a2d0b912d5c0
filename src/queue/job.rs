//! A queue's driver job ([`QueueJob`]): its transfer, the firing of its
//! recurring schedules, and the cheap probe a guard sweep sends instead of
//! both.
//!
//! A full run sends, in one round: the schedules' part (a read of the
//! definitions that changed, or `schedule_fire.lua` for the schedules due
//! by this process's copy, or an `HGET` of the schedules' version to see
//! whether the copy is current), then `transfer.lua`. Schedules fire
//! [`AHEAD_MS`] before their next occurrence (the script accepts up to
//! [`LEAD_MS`], by the server's clock): each occurrence is written
//! ahead as a delayed message due at it, and the transfer's reply arms the
//! job at the queue's earliest due time, so at the occurrence only the
//! transfer stands between it and the consumers. (An occurrence fired late,
//! at or after its time, is moved by the transfer right behind the firing,
//! in the same round trip.) Many due schedules are fired in calls of 250,
//! each followed by a transfer, so consumers get the first occurrences
//! while the later ones are being fired.
//!
//! A guard sweep sends instead one `HMGET` of the queue's `head` hash:
//! `due` (a lower bound of every due time and visibility deadline) and
//! `schedules` (the schedules' version and earliest next occurrence), and
//! runs the full job only when one of them is due or the copy is out of
//! date; otherwise it arms the job at the earliest of them (the schedules'
//! [`AHEAD_MS`] before their next occurrence). So an idle
//! queue costs one `HMGET` per guard interval, while a lost wake-up or a
//! dead process still never strands work for longer than the interval:
//! every script that adds a due time, a deadline or a schedule lowers
//! those fields in the same step.
//!
//! [`AheadKeys`] is here too: the pools claiming ahead
//! (`queue/consumer/ahead/`) that the job (and the `wake` listener) tell
//! of due times a window early. Layer: the queue's due-time plumbing,
//! below the state (`state.rs`) and the handle; it imports only the
//! lowest layer (keys, the transfer, the schedules' copy and replies).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use redis::Value;

use super::keys::Keys;
use super::schedules::mirror::{AHEAD_MS, Group, LEAD_MS, Mirror};
use super::schedules::stored::{FireReply, parse_fire, parse_head, parse_queue_head, parse_read};
use super::transfer::TransferJob;
use crate::error::{Error, ErrorKind};
use crate::runtime::driver::Driver;
use crate::runtime::{Commands, Deadline, Job, Next, Runtime, slot};
use crate::scripts::{self, FIRE_GROUPS_MAX};
use crate::telemetry::ScheduleMetrics;

/// The driver keys of this process's pools that claim ahead from one
/// queue, with their windows: announcements of the queue's next due time
/// reach them a window early.
#[derive(Default)]
pub(crate) struct AheadKeys(Mutex<Vec<(Arc<str>, Duration)>>);

impl AheadKeys {
    /// Adds the pool whose driver key is `key`, claiming `window` ahead.
    pub(crate) fn add(&self, key: &Arc<str>, window: Duration) {
        self.0.lock().push((Arc::clone(key), window));
    }

    /// Removes the pool whose driver key is `key`.
    pub(crate) fn remove(&self, key: &str) {
        self.0.lock().retain(|(k, _)| &**k != key);
    }

    /// Tells each pool claiming ahead that a message falls due `at`: it
    /// runs a window before.
    pub(crate) fn announce(&self, driver: &Driver, at: Deadline) {
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

/// Schedules per `schedule_fire.lua` call in a round; each call is
/// followed by a transfer, so the first occurrences are ready (and
/// consumers are served: Redis reads a pipeline 16 KB at a time) while
/// the later ones are still being fired.
const FIRE_CHUNK: usize = 250;

/// Most schedules fired in one round (more due schedules run in the next
/// round).
const FIRE_PER_ROUND: usize = 8 * FIRE_GROUPS_MAX;

/// `version` before the copy was first read.
const UNREAD: u64 = u64::MAX;

/// A queue's due work: see the [module documentation](self).
///
/// A sweep of 10,000 queues touches each job once per interval, so what a
/// sweep needs sits together at the start (atomics, no lock); the rest,
/// which only full runs touch, is behind one pointer.
pub(crate) struct QueueJob {
    /// Set by a guard sweep: the next run is a probe.
    probe_next: AtomicBool,
    /// The last `commands` sent the probe.
    probing: AtomicBool,
    /// The copy is out of date: read what changed before firing.
    stale: AtomicBool,
    slot: u16,
    /// The version the copy was read at (`UNREAD` before the first read).
    version: AtomicU64,
    rt: Weak<Runtime>,
    /// `HMGET head due schedules`, packed once.
    probe: Box<[u8]>,
    full: Box<Full>,
}

/// What only a full run touches.
struct Full {
    name: String,
    transfer: Arc<TransferJob>,
    /// This process's pools claiming ahead from the queue: told of the due
    /// time the transfer reports (occurrences fired ahead are not
    /// announced on `wake`).
    ahead: Arc<AheadKeys>,
    keys: Keys,
    /// `HGET head schedules`, packed once.
    head: Box<[u8]>,
    state: Mutex<State>,
    metrics: ScheduleMetrics,
}

#[derive(Default)]
struct State {
    mirror: Mirror,
    /// What the last full `commands` sent: the schedules' part, each of
    /// its commands followed by a transfer.
    sent: Option<Part>,
}

enum Part {
    Read,
    Head,
    /// One list of groups per `schedule_fire.lua` call.
    Fire(Vec<Vec<Group>>),
}

impl QueueJob {
    pub(crate) fn new(
        name: &str,
        keys: &Keys,
        transfer: Arc<TransferJob>,
        ahead: Arc<AheadKeys>,
        rt: Weak<Runtime>,
    ) -> QueueJob {
        let probe = redis::cmd("HMGET")
            .arg(&keys.head)
            .arg("due")
            .arg("schedules")
            .get_packed_command()
            .into_boxed_slice();
        let head = redis::cmd("HGET")
            .arg(&keys.head)
            .arg("schedules")
            .get_packed_command()
            .into_boxed_slice();
        QueueJob {
            probe_next: AtomicBool::new(false),
            probing: AtomicBool::new(false),
            stale: AtomicBool::new(false),
            slot: slot(keys.delayed.as_bytes()),
            version: AtomicU64::new(UNREAD),
            rt,
            probe,
            full: Box::new(Full {
                name: name.to_owned(),
                transfer,
                ahead,
                keys: keys.clone(),
                head,
                state: Mutex::new(State::default()),
                metrics: ScheduleMetrics::new(name),
            }),
        }
    }

    /// The server's clock now, by this process's estimate (epoch ms).
    fn server_now(&self) -> Option<i64> {
        let rt = self.rt.upgrade()?;
        i64::try_from(rt.server_now_ms()).ok()
    }

    fn read_command(&self, known: Option<u64>) -> Vec<u8> {
        let k = &self.full.keys;
        let known = known.map_or(-1, |v| i64::try_from(v).unwrap_or(-1));
        redis::cmd("EVALSHA")
            .arg(scripts::SCHEDULE_READ.get_hash())
            .arg(6)
            .arg(&k.schedules)
            .arg(&k.schedules_next)
            .arg(&k.schedules_last)
            .arg(&k.schedules_changes)
            .arg(&k.head)
            .arg(&k.schedules_payload)
            .arg(known)
            .arg("")
            .get_packed_command()
    }

    fn fire_command(&self, version: u64, groups: &[Group]) -> Vec<u8> {
        let k = &self.full.keys;
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(scripts::SCHEDULE_FIRE.get_hash())
            .arg(7)
            .arg(&k.schedules_next)
            .arg(&k.schedules_payload)
            .arg(&k.schedules_last)
            .arg(&k.head)
            .arg(&k.delayed)
            .arg(&k.msg)
            .arg(&k.schedules_ahead)
            .arg(version)
            .arg(LEAD_MS);
        for g in groups {
            cmd.arg(&g.name)
                .arg(g.expected)
                .arg(g.settled.map(|n| n.to_string()).unwrap_or_default())
                .arg(g.next_ms.map(|n| n.to_string()).unwrap_or_default())
                .arg(g.fire.len());
            for at in &g.fire {
                cmd.arg(*at);
            }
        }
        cmd.get_packed_command()
    }

    /// Reads the schedules' replies into the copy; when the schedules
    /// want to run next.
    fn on_schedules(&self, st: &mut State, part: Part, replies: &[&Value]) -> Result<Next, Error> {
        let protocol = |what: &str| {
            Error::new(
                ErrorKind::Protocol,
                format!("unexpected reply to {what}: {replies:?}"),
            )
            .in_queue(&self.full.name)
        };
        let mut server_now = None;
        match part {
            Part::Read => {
                let read = replies
                    .first()
                    .and_then(|v| parse_read(v, false))
                    .ok_or_else(|| protocol("schedule_read.lua"))?;
                server_now = Some(read.now_ms);
                let unreadable = st.mirror.apply(read);
                self.version
                    .store(st.mirror.version().unwrap_or(UNREAD), Ordering::Release);
                self.stale.store(false, Ordering::Release);
                if !unreadable.is_empty() {
                    tracing::warn!(
                        target: "redwheel::queue",
                        queue = %self.full.name,
                        schedules = ?unreadable,
                        "schedules with a definition this build of redwheel cannot read; other processes must fire them"
                    );
                }
            }
            Part::Head => {
                let (version, _) = replies
                    .first()
                    .and_then(|v| parse_head(v))
                    .ok_or_else(|| protocol("HGET head schedules"))?;
                if st.mirror.version() != Some(version) {
                    self.stale.store(true, Ordering::Release);
                }
            }
            Part::Fire(calls) => {
                for (groups, v) in calls.into_iter().zip(replies.iter().copied()) {
                    match parse_fire(v).ok_or_else(|| protocol("schedule_fire.lua"))? {
                        FireReply::Stale { now_ms, .. } => {
                            server_now = Some(now_ms);
                            self.stale.store(true, Ordering::Release);
                        }
                        FireReply::Applied {
                            now_ms,
                            fired,
                            written,
                            refused,
                        } => {
                            server_now = Some(now_ms);
                            self.applied(st, groups, now_ms, &refused);
                            tracing::debug!(
                                target: "redwheel::queue",
                                queue = %self.full.name,
                                fired,
                                written,
                                refused = refused.len(),
                                "schedules fired"
                            );
                        }
                    }
                }
            }
        }
        if self.stale.load(Ordering::Acquire) {
            return Ok(Next::Again);
        }
        let Some(at) = st.mirror.earliest().map(|n| n.saturating_sub(AHEAD_MS)) else {
            return Ok(Next::Idle);
        };
        // A script's TIME was read before its reply arrived, so a wait
        // counted from it is never early; without one, the estimate.
        let Some(now) = server_now.or_else(|| self.server_now()) else {
            return Ok(Next::Idle);
        };
        Ok(if at <= now {
            Next::Again
        } else {
            Next::After(Duration::from_millis((at - now) as u64))
        })
    }

    /// Brings the copy up to date after a firing call: the groups not
    /// refused moved on as planned; the refused ones are where Redis says.
    fn applied(
        &self,
        st: &mut State,
        groups: Vec<Group>,
        now_ms: i64,
        refused: &[(String, Option<i64>)],
    ) {
        // Refused groups are many when processes race for the same firing.
        let refused: HashMap<&str, Option<i64>> =
            refused.iter().map(|(n, at)| (n.as_str(), *at)).collect();
        for g in groups {
            if let Some(stored) = refused.get(g.name.as_str()) {
                st.mirror.advance(&g.name, *stored);
                continue;
            }
            st.mirror.advance(&g.name, g.next_ms);
            self.full.metrics.fired.add(g.fire.len() as u64);
            self.full.metrics.skipped.add(g.skipped);
            // How late each was written: 0 for those written ahead.
            for at in &g.fire {
                self.full
                    .metrics
                    .lateness
                    .record((now_ms - at).max(0) as f64 / 1000.0);
            }
        }
    }

    /// Reads a probe's reply: the full job runs now, later, or never.
    fn on_probe(&self, replies: &[Value]) -> Result<Next, Error> {
        let pair = match replies.first() {
            Some(Value::Array(items)) if items.len() == 2 => {
                parse_queue_head(&items[0]).zip(parse_head(&items[1]))
            }
            _ => None,
        };
        let Some((head, (version, next))) = pair else {
            return Err(Error::new(
                ErrorKind::Protocol,
                format!("unexpected reply to the guard sweep's HMGET: {replies:?}"),
            )
            .in_queue(&self.full.name));
        };
        if self.version.load(Ordering::Acquire) != version {
            self.stale.store(true, Ordering::Release);
            return Ok(Next::Again);
        }
        let next = next.map(|n| n.saturating_sub(AHEAD_MS));
        let earliest = match (head, next) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => match a.or(b) {
                Some(t) => t,
                None => return Ok(Next::Idle),
            },
        };
        let Some(now) = self.server_now() else {
            return Ok(Next::Idle);
        };
        Ok(if earliest <= now {
            Next::Again
        } else {
            Next::After(Duration::from_millis((earliest - now) as u64))
        })
    }
}

/// The sooner of two wishes.
fn sooner(a: Next, b: Next) -> Next {
    match (a, b) {
        (Next::Again, _) | (_, Next::Again) => Next::Again,
        (Next::After(x), Next::After(y)) => Next::After(x.min(y)),
        (Next::After(x), Next::Idle) | (Next::Idle, Next::After(x)) => Next::After(x),
        (Next::Idle, Next::Idle) => Next::Idle,
    }
}

impl Job for QueueJob {
    fn describe(&self) -> String {
        format!("due work of queue {:?}", self.full.name)
    }

    fn commands(&self, out: &mut Commands) {
        if self.probe_next.swap(false, Ordering::AcqRel) {
            out.push(self.slot, &self.probe);
            self.probing.store(true, Ordering::Release);
            return;
        }
        self.probing.store(false, Ordering::Release);
        let full = &*self.full;
        let mut st = full.state.lock();
        // The schedules' part, then the transfer: [read or HGET,
        // transfer], or [fire, transfer] per chunk of due schedules.
        let part = match st.mirror.version() {
            Some(version) if !self.stale.load(Ordering::Acquire) => {
                let now = self.server_now().unwrap_or(i64::MIN);
                let due = st.mirror.due(now, FIRE_PER_ROUND);
                if due.is_empty() {
                    out.push(self.slot, &full.head);
                    Part::Head
                } else {
                    let mut calls = Vec::new();
                    let mut due = due.into_iter().peekable();
                    while due.peek().is_some() {
                        let groups: Vec<Group> = due.by_ref().take(FIRE_CHUNK).collect();
                        out.push(self.slot, &self.fire_command(version, &groups));
                        calls.push(groups);
                        if due.peek().is_some() {
                            full.transfer.commands(out);
                        }
                    }
                    Part::Fire(calls)
                }
            }
            known => {
                out.push(self.slot, &self.read_command(known));
                Part::Read
            }
        };
        full.transfer.commands(out);
        st.sent = Some(part);
    }

    fn scripts(&self) -> &[&'static redis::Script] {
        static SCRIPTS: LazyLock<[&'static redis::Script; 3]> = LazyLock::new(|| {
            [
                &*scripts::TRANSFER,
                &*scripts::SCHEDULE_FIRE,
                &*scripts::SCHEDULE_READ,
            ]
        });
        &*SCRIPTS
    }

    fn on_reply(&self, replies: &[Value]) -> Result<Next, Error> {
        if self.probing.load(Ordering::Acquire) {
            return self.on_probe(replies);
        }
        let full = &*self.full;
        let mut st = full.state.lock();
        let Some(part) = st.sent.take() else {
            return Ok(Next::Idle);
        };
        // [schedules' command, transfer] pairs.
        let mut transfer = Next::Idle;
        let mut mine = Vec::with_capacity(replies.len() / 2);
        for pair in replies.chunks(2) {
            mine.push(&pair[0]);
            transfer = sooner(transfer, full.transfer.on_reply(&pair[1..])?);
        }
        if let Some(rt) = self.rt.upgrade() {
            match transfer {
                Next::After(wait) => full.ahead.announce(&rt.driver, Deadline::After(wait)),
                Next::Again => full.ahead.announce(&rt.driver, Deadline::Now),
                Next::Idle => {}
            }
        }
        // A reply of the schedules' part that cannot be read must not hold
        // up the queue's transfer: read them again in a while.
        let schedules = self
            .on_schedules(&mut st, part, &mine)
            .unwrap_or_else(|e| {
                tracing::warn!(target: "redwheel::queue", queue = %full.name, error = %e, "could not read the schedules' reply; reading them again in a second");
                self.stale.store(true, Ordering::Release);
                Next::After(Duration::from_secs(1))
            });
        Ok(sooner(transfer, schedules))
    }

    fn sweep(&self) {
        self.probe_next.store(true, Ordering::Release);
    }

    fn run_in_full(&self) {
        self.probe_next.store(false, Ordering::Release);
    }
}
