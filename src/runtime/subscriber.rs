//! The subscriber: sharded pub/sub (`SSUBSCRIBE`) for every channel the
//! runtime's users listen to (wake-ups announcing earlier deadlines, unlock
//! notices), one connection per node that serves channels: the one server,
//! or each master of a cluster, listening to the channels of its slots.
//!
//! Sharded pub/sub, not classic: in a cluster a classic `PUBLISH` is copied
//! to every node over the cluster bus, while `SPUBLISH` stays in the shard
//! that owns the channel's slot, so announcements cost the same however
//! many masters there are; on one server the two behave alike. (It needs
//! Redis 7.0.)
//!
//! A supervisor thread keeps one listener thread per node. Each listener
//! subscribes to the channels whose slot its node serves, re-reads that
//! assignment when channels are added or the slot map changes, reconnects
//! with backoff and resubscribes. When a subscription takes effect (first
//! time, or again after a reconnect or a move), the channel's
//! `on_subscribed` runs: whatever was published meanwhile was missed. When
//! Redis drops a subscription because its slot moved away, the slot map is
//! refreshed and the channel is subscribed where it went.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use parking_lot::RwLock;
use redis::{PushInfo, PushKind, Value};

use super::backoff::Backoff;
use super::cluster::{Cluster, redirect_target};
use super::endpoint::Endpoint;
use super::keyslot::slot;
use crate::error::{Access, Error, ErrorKind};
use crate::telemetry;

/// A callback given each message's payload.
pub(crate) type OnMessage = Box<dyn Fn(&[u8]) + Send + Sync>;

/// What to do with one channel's messages.
pub(crate) struct Subscription {
    /// Called with each message's payload, on a subscriber thread: keep it
    /// short (schedule, do not wait).
    pub on_message: OnMessage,
    /// Called each time the subscription takes effect (the first
    /// subscribe, and every resubscribe): a message published before that
    /// was missed.
    pub on_subscribed: Box<dyn Fn() + Send + Sync>,
}

/// Where channels live.
pub(crate) trait Locator: Send + Sync + 'static {
    /// The nodes to listen on now: (`host:port`, endpoint).
    fn nodes(&self) -> Vec<(String, Arc<Endpoint>)>;
    /// The node (`host:port`) serving `channel`'s slot, if known.
    fn owner(&self, channel: &str) -> Option<String>;
    /// Changes whenever `nodes` or `owner` may answer differently.
    fn generation(&self) -> u64;
    /// Asks for a fresh slot map (a subscription moved away).
    fn refresh(&self);
    /// The node at `from` answered `MOVED slot to`: the slot is served at
    /// `to` now.
    fn moved(&self, from: &str, slot: u16, to: &str);
}

/// One server serves every channel.
pub(crate) struct SingleNode(pub(crate) Arc<Endpoint>);

impl Locator for SingleNode {
    fn nodes(&self) -> Vec<(String, Arc<Endpoint>)> {
        vec![(self.0.host_port().to_owned(), Arc::clone(&self.0))]
    }

    fn owner(&self, _channel: &str) -> Option<String> {
        Some(self.0.host_port().to_owned())
    }

    fn generation(&self) -> u64 {
        0
    }

    fn refresh(&self) {}

    fn moved(&self, _from: &str, _slot: u16, _to: &str) {}
}

/// A cluster: each channel lives on the master serving its slot.
impl Locator for Cluster {
    fn nodes(&self) -> Vec<(String, Arc<Endpoint>)> {
        self.masters()
            .iter()
            .map(|n| (n.addr.clone(), Arc::clone(&n.endpoint)))
            .collect()
    }

    fn owner(&self, channel: &str) -> Option<String> {
        self.owner_addr(channel.as_bytes())
    }

    fn generation(&self) -> u64 {
        Cluster::generation(self)
    }

    fn refresh(&self) {
        self.request_refresh();
    }

    fn moved(&self, from: &str, slot: u16, to: &str) {
        Cluster::moved(self, slot, &redirect_target(from, to));
    }
}

/// How long a listener blocks on its socket before it looks for new
/// channels, a new slot map and shutdown again.
const POLL: Duration = Duration::from_millis(100);

/// The channel registry, shared with the subscriber threads.
pub(crate) struct Subscriber {
    channels: RwLock<HashMap<String, Arc<Subscription>>>,
    generation: AtomicU64,
    stopping: AtomicBool,
    locator: Arc<dyn Locator>,
    reconnect: (Duration, Duration),
    command_timeout: Duration,
    /// `redwheel_reconnects_total{connection="subscriber"}`.
    reconnects: telemetry::Counter,
}

impl Subscriber {
    /// Starts the supervisor thread (which starts the listeners).
    pub(crate) fn start(
        locator: Arc<dyn Locator>,
        reconnect: (Duration, Duration),
        command_timeout: Duration,
    ) -> Result<(Arc<Subscriber>, JoinHandle<()>), Error> {
        let sub = Arc::new(Subscriber {
            channels: RwLock::new(HashMap::new()),
            generation: AtomicU64::new(0),
            stopping: AtomicBool::new(false),
            locator,
            reconnect,
            command_timeout,
            reconnects: telemetry::reconnects("subscriber"),
        });
        let s = Arc::clone(&sub);
        let handle = thread::Builder::new()
            .name("redwheel-subscriber".to_owned())
            .spawn(move || supervise(&s))
            .map_err(|e| {
                Error::new(ErrorKind::Spawn, "could not start the subscriber thread").with_cause(e)
            })?;
        Ok((sub, handle))
    }

    /// Listens to `channel` from now on (replacing an earlier subscription
    /// of the same channel).
    pub(crate) fn subscribe(&self, channel: &str, subscription: Subscription) {
        self.channels
            .write()
            .insert(channel.to_owned(), Arc::new(subscription));
        self.generation.fetch_add(1, Ordering::SeqCst);
    }

    /// Asks every thread to end (within [`POLL`]).
    pub(crate) fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
    }

    fn stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// Sleeps `d` (a backoff's wait, however long its maximum), waking
    /// every [`POLL`] to end early at shutdown.
    fn nap(&self, d: Duration) {
        let until = Instant::now().checked_add(d);
        while !self.stopping() {
            let left = until.map_or(POLL, |u| u.saturating_duration_since(Instant::now()));
            if left.is_zero() {
                return;
            }
            thread::sleep(left.min(POLL));
        }
    }
}

/// Keeps one listener per node until shutdown, then joins them.
fn supervise(sub: &Arc<Subscriber>) {
    let mut listeners: HashMap<String, JoinHandle<()>> = HashMap::new();
    while !sub.stopping() {
        for (addr, endpoint) in sub.locator.nodes() {
            let running = listeners.get(&addr).is_some_and(|h| !h.is_finished());
            if running {
                continue;
            }
            if let Some(h) = listeners.remove(&addr) {
                let _ = h.join();
            }
            let s = Arc::clone(sub);
            let a = addr.clone();
            match thread::Builder::new()
                .name("redwheel-listener".to_owned())
                .spawn(move || listen_to(&s, &a, &endpoint))
            {
                Ok(h) => {
                    listeners.insert(addr, h);
                }
                Err(e) => {
                    tracing::error!(target: "redwheel::runtime", error = %e, "could not start a subscriber thread; retrying");
                }
            }
        }
        thread::sleep(POLL);
    }
    for (_, h) in listeners {
        let _ = h.join();
    }
    tracing::debug!(target: "redwheel::runtime", "subscriber threads end");
}

/// One node's listener: connects, subscribes, dispatches; reconnects with
/// backoff; ends when the node no longer serves channels, or at shutdown.
fn listen_to(sub: &Subscriber, addr: &str, endpoint: &Endpoint) {
    let mut backoff = Backoff::new(sub.reconnect.0, sub.reconnect.1);
    let mut failing = false;
    while !sub.stopping() {
        if !sub.locator.nodes().iter().any(|(a, _)| a == addr) {
            return;
        }
        let result = endpoint
            .open_resp3(sub.command_timeout, POLL)
            .and_then(|mut con| {
                listen(sub, addr, &mut con, &mut || {
                    backoff.reset();
                    if failing {
                        failing = false;
                        sub.reconnects.add(1);
                        tracing::info!(target: "redwheel::runtime", node = addr, "subscriber reconnected");
                    }
                })
                .map_err(|e| Error::from_redis(e, Access::Read))
            });
        match result {
            Ok(()) => return,
            Err(e) => {
                let wait = backoff.step();
                if failing {
                    tracing::debug!(target: "redwheel::runtime", node = addr, error = %e, retry_in_ms = wait.as_millis() as u64, "subscriber: still cannot reach redis");
                } else {
                    failing = true;
                    tracing::warn!(target: "redwheel::runtime", node = addr, error = %e, retry_in_ms = wait.as_millis() as u64, "subscriber connection lost; reconnecting");
                }
                sub.locator.refresh();
                sub.nap(wait);
            }
        }
    }
}

/// Packs `SSUBSCRIBE`/`SUNSUBSCRIBE` of `channels`, one command per slot
/// (a cluster refuses channels of several slots in one command).
fn pack_by_slot(command: &str, channels: &[&String]) -> (Vec<u8>, usize) {
    let mut by_slot: HashMap<u16, Vec<&String>> = HashMap::new();
    for ch in channels {
        by_slot.entry(slot(ch.as_bytes())).or_default().push(ch);
    }
    let mut packed = Vec::new();
    let n = by_slot.len();
    for (_, group) in by_slot {
        packed.extend(redis::cmd(command).arg(group).get_packed_command());
    }
    (packed, n)
}

/// Subscribes to this node's channels and dispatches messages until the
/// connection fails (`Err`), or shutdown or the node stops serving channels
/// (`Ok`). `connected` runs once the connection works.
///
/// The connection speaks RESP3, so confirmations and messages are pushes;
/// the `redis` crate hands every push to the connection's push sender as it
/// reads it, so they are taken from there, whatever the read returns.
///
/// Two kinds of read, because the crate counts every response read that
/// times out as a reply still owed, and skips that many later non-push
/// replies: after one idle poll, the error replying to a subscription
/// (`MOVED`, a refusal) would be skipped and never seen. So the idle
/// waits for pushes ([`read_pushes`]) are reads the crate does not count,
/// and a change of subscriptions is followed by a `PING` and read through
/// to its `PONG` within the command timeout (no timeout counted: one is a
/// failed connection), so every error reply to it is seen.
fn listen(
    sub: &Subscriber,
    addr: &str,
    con: &mut redis::Connection,
    connected: &mut dyn FnMut(),
) -> redis::RedisResult<()> {
    con.set_write_timeout(Some(sub.command_timeout))?;
    let (push_tx, pushes) = std::sync::mpsc::channel::<PushInfo>();
    con.set_push_sender(push_tx);
    let mut handlers: HashMap<String, Arc<Subscription>> = HashMap::new();
    // Channels subscribed, and asked for but not yet confirmed.
    let mut subscribed: HashSet<String> = HashSet::new();
    let mut pending: HashSet<String> = HashSet::new();
    let mut seen = (u64::MAX, u64::MAX);
    let mut announced = false;
    // Paces resubscribes after `MOVED` (nodes that disagree during a slot
    // move would otherwise bounce a subscription back and forth at once).
    let mut moved = Backoff::new(sub.reconnect.0, sub.reconnect.1);
    loop {
        if sub.stopping() {
            return Ok(());
        }
        let now = (
            sub.generation.load(Ordering::SeqCst),
            sub.locator.generation(),
        );
        if now != seen {
            seen = now;
            if !sub.locator.nodes().iter().any(|(a, _)| a == addr) {
                return Ok(());
            }
            handlers = sub
                .channels
                .read()
                .iter()
                .filter(|(ch, _)| sub.locator.owner(ch).as_deref() == Some(addr))
                .map(|(ch, s)| (ch.clone(), Arc::clone(s)))
                .collect();
            let add: Vec<&String> = handlers
                .keys()
                .filter(|ch| !subscribed.contains(*ch) && !pending.contains(*ch))
                .collect();
            let drop_: Vec<&String> = subscribed
                .iter()
                .chain(pending.iter())
                .filter(|ch| !handlers.contains_key(*ch))
                .collect();
            let mut packed = Vec::new();
            if !add.is_empty() {
                packed.extend(pack_by_slot("SSUBSCRIBE", &add).0);
            }
            if !drop_.is_empty() {
                packed.extend(pack_by_slot("SUNSUBSCRIBE", &drop_).0);
            }
            if !packed.is_empty() {
                pending.extend(add.into_iter().cloned());
                if let Some(Redirect { slot, to }) = change_subscriptions(sub, con, &packed)? {
                    // The slot map is stale: the channel is served where
                    // the reply says (the rest of the map is refreshed
                    // meanwhile); subscribe again there.
                    match to {
                        Some(to) => sub.locator.moved(addr, slot, &to),
                        None => sub.locator.refresh(),
                    }
                    pending.clear();
                    seen = (u64::MAX, u64::MAX);
                    sub.nap(moved.step());
                }
            }
        }
        // What arrived meanwhile (the confirmations read with a change of
        // subscriptions among it) first, then wait for more.
        while let Ok(push) = pushes.try_recv() {
            // Borrowed: a wake-up message allocates nothing here.
            let channel = match push.data.first() {
                Some(Value::BulkString(b)) => std::str::from_utf8(b).ok(),
                Some(Value::SimpleString(s)) => Some(s.as_str()),
                _ => None,
            };
            match (push.kind, channel) {
                (PushKind::SMessage | PushKind::Message, Some(channel)) => {
                    tracing::trace!(target: "redwheel::runtime", node = addr, channel, "subscriber: message");
                    if let (Some(h), Some(Value::BulkString(payload))) =
                        (handlers.get(channel), push.data.get(1))
                    {
                        (h.on_message)(payload);
                    }
                }
                (PushKind::SSubscribe, Some(channel)) => {
                    tracing::debug!(target: "redwheel::runtime", node = addr, channel, "subscriber: subscribed");
                    moved.reset();
                    pending.remove(channel);
                    subscribed.insert(channel.to_owned());
                    if let Some(h) = handlers.get(channel) {
                        (h.on_subscribed)();
                    }
                }
                (PushKind::SUnsubscribe, Some(channel)) => {
                    tracing::debug!(target: "redwheel::runtime", node = addr, channel, "subscriber: unsubscribed");
                    subscribed.remove(channel);
                    pending.remove(channel);
                    if handlers.contains_key(channel) {
                        // Not asked for: its slot moved to another node.
                        sub.locator.refresh();
                        seen = (u64::MAX, u64::MAX);
                    }
                }
                (PushKind::Disconnection, _) => {
                    return Err(redis::RedisError::from(std::io::Error::new(
                        std::io::ErrorKind::ConnectionAborted,
                        "the subscriber connection closed",
                    )));
                }
                _ => {}
            }
        }
        // Connected once every subscription asked for is confirmed (a
        // refused one never is: the connection fails, so the caller's
        // backoff keeps growing).
        if !announced && pending.is_empty() {
            announced = true;
            connected();
        }
        match read_pushes(con) {
            Ok(()) => {}
            Err(e) if e.is_timeout() => {}
            Err(e) => return Err(e),
        }
    }
}

/// Where a `MOVED` reply to a subscription sends its slot (`to`: `None` if
/// the reply names no node).
struct Redirect {
    slot: u16,
    to: Option<String>,
}

/// Sends `packed` (`SSUBSCRIBE` and `SUNSUBSCRIBE` commands) and a `PING`,
/// and reads every reply through to the `PONG` within the command timeout:
/// the confirmations are pushes (handled by the caller from the push
/// sender), an error reply is the server's answer to one of the commands.
/// A refusal fails the connection (retried on the backoff, not in a tight
/// loop); a `MOVED` is returned. A read that times out fails the connection
/// too: the crate would skip a later reply for it.
fn change_subscriptions(
    sub: &Subscriber,
    con: &mut redis::Connection,
    packed: &[u8],
) -> redis::RedisResult<Option<Redirect>> {
    let mut bytes = packed.to_vec();
    bytes.extend(redis::cmd("PING").get_packed_command());
    con.set_read_timeout(Some(sub.command_timeout))?;
    con.send_packed_command(&bytes)?;
    let mut redirect = None;
    loop {
        match con.recv_response()? {
            Value::Push { .. } => {}
            Value::ServerError(e) if e.code() == "MOVED" => {
                tracing::debug!(target: "redwheel::runtime", error = ?e, "subscriber: a subscription moved");
                let e = redis::RedisError::from(e);
                redirect = Some(match e.redirect_node() {
                    Some((to, slot)) => Redirect {
                        slot,
                        to: Some(to.to_owned()),
                    },
                    None => Redirect { slot: 0, to: None },
                });
            }
            // Refused for good (an ACL without the channels, say).
            Value::ServerError(e) => return Err(e.into()),
            // The fence's `PONG`: every reply before it was read.
            _ => break,
        }
    }
    con.set_read_timeout(Some(POLL))?;
    Ok(redirect)
}

/// Waits up to the connection's read timeout ([`POLL`]) for pushes (each
/// handed to the push sender as it is read). Not a response read, so a
/// timeout here is not counted as a reply still owed (the `redis` crate
/// would skip a later reply for it); a non-push value here answers nothing
/// we are waiting for, and is dropped. A message ends the read at once;
/// other pushes read here (an unsubscribe when a slot moved away) are
/// handled when it ends, within [`POLL`].
fn read_pushes(con: &mut redis::Connection) -> redis::RedisResult<()> {
    let mut pubsub = con.as_pubsub();
    let read = pubsub.get_message().map(drop);
    // Dropping a `PubSub` would unsubscribe every classic channel and wait
    // for the replies; it owns nothing but an empty queue, so it is
    // forgotten instead.
    std::mem::forget(pubsub);
    read
}
