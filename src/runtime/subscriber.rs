//! The subscriber: one pub/sub connection for every channel the runtime's
//! users listen to (wake-ups announcing earlier deadlines, unlock
//! notices), reconnected with backoff and resubscribed. After each
//! (re)subscribe, every channel's `on_subscribed` runs: whatever was
//! published while the subscription was not in effect was missed.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use parking_lot::RwLock;

use super::backoff::Backoff;
use super::pool::Endpoint;
use crate::error::{Error, ErrorKind};

/// A callback given each message's payload.
pub(crate) type OnMessage = Box<dyn Fn(&[u8]) + Send + Sync>;

/// What to do with one channel's messages.
pub(crate) struct Subscription {
    /// Called with each message's payload, on the subscriber thread: keep
    /// it short (schedule, do not wait).
    pub on_message: OnMessage,
    /// Called once the subscription is in effect (after the first
    /// subscribe and after every resubscribe): a message published before
    /// that was missed.
    pub on_subscribed: Box<dyn Fn() + Send + Sync>,
}

/// How long the subscriber blocks on its socket before it looks for new
/// channels and for shutdown again.
const POLL: Duration = Duration::from_millis(100);

/// The channel registry, shared with the subscriber thread.
pub(crate) struct Subscriber {
    channels: RwLock<HashMap<String, Arc<Subscription>>>,
    generation: AtomicU64,
    stopping: AtomicBool,
}

impl Subscriber {
    /// Starts the subscriber thread.
    pub(crate) fn start(
        endpoint: Arc<Endpoint>,
        reconnect: Backoff,
        command_timeout: Duration,
    ) -> Result<(Arc<Subscriber>, JoinHandle<()>), Error> {
        let sub = Arc::new(Subscriber {
            channels: RwLock::new(HashMap::new()),
            generation: AtomicU64::new(0),
            stopping: AtomicBool::new(false),
        });
        let s = Arc::clone(&sub);
        let handle = thread::Builder::new()
            .name("redwheel-subscriber".to_owned())
            .spawn(move || run(&s, &endpoint, reconnect, command_timeout))
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

    /// Asks the thread to end (within [`POLL`]).
    pub(crate) fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
    }

    fn stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }
}

fn run(sub: &Subscriber, endpoint: &Endpoint, mut backoff: Backoff, command_timeout: Duration) {
    let mut failing = false;
    while !sub.stopping() {
        let result = endpoint
            .open_raw(command_timeout, POLL)
            .and_then(|mut con| {
                listen(sub, &mut con, command_timeout, &mut || {
                    backoff.reset();
                    if failing {
                        failing = false;
                        tracing::info!(target: "redwheel::runtime", "subscriber reconnected");
                    }
                })
                .map_err(|e| Error::from_redis(e, crate::error::Access::Read))
            });
        if let Err(e) = result {
            let wait = backoff.step();
            if failing {
                tracing::debug!(target: "redwheel::runtime", error = %e, retry_in_ms = wait.as_millis() as u64, "subscriber: still cannot reach redis");
            } else {
                failing = true;
                tracing::warn!(target: "redwheel::runtime", error = %e, retry_in_ms = wait.as_millis() as u64, "subscriber connection lost; reconnecting");
            }
            if !sub.stopping() {
                thread::sleep(wait);
            }
        }
    }
    tracing::debug!(target: "redwheel::runtime", "subscriber thread ends");
}

/// Subscribes to every registered channel and dispatches messages until
/// the connection fails (`Err`) or shutdown (`Ok`). `connected` runs once
/// the first subscriptions are in effect.
fn listen(
    sub: &Subscriber,
    con: &mut redis::Connection,
    command_timeout: Duration,
    connected: &mut dyn FnMut(),
) -> redis::RedisResult<()> {
    con.set_write_timeout(Some(command_timeout))?;
    let mut ps = con.as_pubsub();
    let mut handlers: HashMap<String, Arc<Subscription>> = HashMap::new();
    let mut subscribed: HashSet<String> = HashSet::new();
    let mut seen = u64::MAX;
    let mut announced = false;
    loop {
        if sub.stopping() {
            return Ok(());
        }
        let generation = sub.generation.load(Ordering::SeqCst);
        if generation != seen {
            seen = generation;
            let current: Vec<(String, Arc<Subscription>)> = sub
                .channels
                .read()
                .iter()
                .map(|(k, v)| (k.clone(), Arc::clone(v)))
                .collect();
            let mut new = Vec::new();
            for (channel, s) in current {
                if subscribed.insert(channel.clone()) {
                    new.push(channel.clone());
                }
                handlers.insert(channel, s);
            }
            for chunk in new.chunks(1_000) {
                ps.subscribe(chunk)?;
                for channel in chunk {
                    if let Some(h) = handlers.get(channel) {
                        (h.on_subscribed)();
                    }
                }
            }
        }
        if !announced {
            announced = true;
            connected();
        }
        match ps.get_message() {
            Ok(msg) => {
                if let Some(h) = handlers.get(msg.get_channel_name()) {
                    (h.on_message)(msg.get_payload_bytes());
                }
            }
            Err(e) if e.is_timeout() => {}
            Err(e) => return Err(e),
        }
    }
}
