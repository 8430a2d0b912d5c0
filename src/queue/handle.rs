//! [`Queue`]: the handle on one queue, how it is opened (registering the
//! queue's transfer job and wake channel with the runtime the first time),
//! and what every operation on it shares: its name on errors, encoding
//! and size checks, delays in ms.
//!
//! Layer 4 of `queue/` (see `ARCHITECTURE.md`): above the state and the
//! job; the operations (`impl Queue` blocks in their own files) are above
//! it.

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::codec::Codec;
use super::job::QueueJob;
use super::keys::{MAX_ID_LEN, validate_name};
use super::limits::{option_fields, write_controls};
use super::message::MessageId;
use super::options::QueueOptions;
use super::state::QueueState;
use crate::error::{Error, ErrorKind};
use crate::runtime::{Deadline, Redwheel, Runtime, Subscription, shut_down};
use crate::scripts::{self, MAX_DUE_MS};

/// A handle on one delayed queue carrying payloads of type `T`.
///
/// Cheap to `Clone`, `Send + Sync`: share it between producer and consumer
/// threads. Keeps its [`Redwheel`] alive.
pub struct Queue<T> {
    pub(super) rw: Redwheel,
    pub(super) state: Arc<QueueState>,
    pub(super) max_payload: usize,
    pub(super) wait_replicas: Option<(u32, Duration)>,
    pub(super) visibility: Duration,
    pub(super) max_deliveries: u32,
    pub(super) _payload: PhantomData<fn(T) -> T>,
}

impl<T> Clone for Queue<T> {
    fn clone(&self) -> Self {
        Queue {
            rw: self.rw.clone(),
            state: Arc::clone(&self.state),
            max_payload: self.max_payload,
            wait_replicas: self.wait_replicas,
            visibility: self.visibility,
            max_deliveries: self.max_deliveries,
            _payload: PhantomData,
        }
    }
}

impl<T> fmt::Debug for Queue<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Queue")
            .field("name", &self.state.name)
            .field("max_payload", &self.max_payload)
            .finish_non_exhaustive()
    }
}

impl Redwheel {
    /// Opens queue `name` carrying payloads of type `T`, with default
    /// options. See [`queue_with`](Redwheel::queue_with).
    pub fn queue<T: Codec>(&self, name: &str) -> Result<Queue<T>, Error> {
        self.queue_with(name, QueueOptions::default())
    }

    /// Opens queue `name` (keys `redwheel:{name}:…`) carrying payloads of
    /// type `T`.
    ///
    /// The first open of a name in this `Redwheel` registers its transfer
    /// job (one per queue per `Redwheel`), which runs at once, so messages
    /// that fell due while no process was running move right away. Later
    /// opens share that job; their `transfer_batch` and `guard_interval`
    /// are ignored, their `max_payload_bytes` applies to their handle.
    ///
    /// Options that are the queue's controls (`rate_limit`,
    /// `max_in_flight`, `max_len`) are written to Redis, for every process:
    /// only then does this talk to Redis, and it fails as a write does
    /// ([`ErrorKind::Unavailable`], [`ErrorKind::OutcomeUnknown`]) when
    /// Redis cannot be reached.
    ///
    /// Fails with [`ErrorKind::InvalidName`] for an empty name, one over
    /// 200 bytes, or one holding `{`, `}` or control characters, and
    /// [`ErrorKind::InvalidOption`] for an option out of range.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use redwheel::{QueueOptions, Redwheel};
    ///
    /// let rw = Redwheel::connect("redis://127.0.0.1:6379")?;
    /// let q = rw.queue_with::<Vec<u8>>("thumbnails", QueueOptions::default()
    ///     .max_payload_bytes(8 << 20)
    ///     .visibility(Duration::from_secs(300)))?;
    /// # let _ = q;
    /// # Ok::<(), redwheel::Error>(())
    /// ```
    pub fn queue_with<T: Codec>(
        &self,
        name: &str,
        options: QueueOptions,
    ) -> Result<Queue<T>, Error> {
        validate_name(name)?;
        options.validate()?;
        let rt = self.runtime();
        if rt.is_shut_down() {
            return Err(shut_down());
        }
        let (state, created) = rt
            .state(&format!("queue {name}"), || {
                QueueState::new(name, options.transfer_batch, options.max_deliveries)
            })
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::InvalidName,
                    "the name is in use by another kind of object",
                )
                .in_queue(name)
            })?;
        if let Some((_, timeout)) = options.wait_replicas
            && timeout + Duration::from_millis(100) > rt.options.command_timeout
        {
            return Err(Error::new(
                ErrorKind::InvalidOption,
                format!(
                    "invalid option `wait_replicas`: a timeout of {timeout:?} leaves no room within the command timeout of {:?}",
                    rt.options.command_timeout
                ),
            )
            .in_queue(name));
        }
        let controls = option_fields(&options);
        if !controls.is_empty() {
            write_controls(rt, &state.keys, &controls).map_err(|e| e.in_queue(name))?;
        }
        if created {
            open_transfer(rt, &state, &options);
        }
        Ok(Queue {
            rw: self.clone(),
            state,
            max_payload: options.max_payload_bytes,
            wait_replicas: options.wait_replicas,
            visibility: options.visibility,
            max_deliveries: options.max_deliveries,
            _payload: PhantomData,
        })
    }
}

/// Registers a new queue's driver job (its transfer and its schedules'
/// firing) and wake channel.
fn open_transfer(rt: &Arc<Runtime>, state: &Arc<QueueState>, options: &QueueOptions) {
    let weak: Weak<Runtime> = Arc::downgrade(rt);
    let key = state.job_key.clone();
    let on_message = {
        let (weak, key) = (weak.clone(), key.clone());
        let gate = Arc::clone(&state.gate);
        let ahead = Arc::clone(&state.ahead);
        move |payload: &[u8]| {
            // A resume, a changed limit or a freed in-flight slot: consumers
            // held back by the controls look again.
            gate.open();
            let Some(rt) = weak.upgrade() else { return };
            let due = std::str::from_utf8(payload)
                .ok()
                .and_then(|s| s.parse::<i64>().ok());
            let at = match due {
                Some(ms) => Deadline::ServerMs(ms),
                None => Deadline::Now,
            };
            rt.driver.announce(&key, at);
            ahead.announce(&rt.driver, at);
        }
    };
    let on_subscribed = {
        let (weak, key) = (weak, key);
        let ahead = Arc::clone(&state.ahead);
        move || {
            if let Some(rt) = weak.upgrade() {
                rt.driver.announce(&key, Deadline::Now);
                ahead.announce(&rt.driver, Deadline::Now);
            }
        }
    };
    let job = QueueJob::new(
        &state.name,
        &state.keys,
        Arc::clone(&state.transfer),
        Arc::clone(&state.ahead),
        Arc::downgrade(rt),
    );
    rt.driver.register(
        &state.job_key,
        Arc::new(job) as Arc<dyn crate::runtime::Job>,
        Deadline::Now,
        Some(options.guard_interval),
    );
    rt.subscriber.subscribe(
        &state.keys.wake,
        Subscription {
            on_message: Box::new(on_message),
            on_subscribed: Box::new(on_subscribed),
        },
    );
}

/// `at` in epoch ms, rounded up; before the epoch is 0 (clamped to now by
/// the script); past 2^53 ms is an error.
pub(super) fn epoch_ms(at: SystemTime) -> Result<u64, Error> {
    let ms = match at.duration_since(UNIX_EPOCH) {
        Ok(d) => ceil_ms(d),
        Err(_) => 0,
    };
    if ms > u128::from(MAX_DUE_MS) {
        return Err(Error::new(
            ErrorKind::DelayOverflow,
            format!("the due time {at:?} is past 2^53 ms since the epoch"),
        ));
    }
    Ok(ms as u64)
}

/// Milliseconds in `d`, rounded up (a delay is never shortened).
fn ceil_ms(d: Duration) -> u128 {
    d.as_nanos().div_ceil(1_000_000)
}

impl<T: Codec> Queue<T> {
    /// The queue's name.
    pub fn name(&self) -> &str {
        &self.state.name
    }

    pub(super) fn rt(&self) -> &Arc<Runtime> {
        self.rw.runtime()
    }

    /// Tags an error with this queue's name, and the script Redis failed
    /// in, if it did.
    pub(super) fn tag(&self, e: Error) -> Error {
        e.in_queue(&self.state.name).in_script(scripts::name_of)
    }

    pub(super) fn encode<'a>(&self, payload: &'a T) -> Result<Cow<'a, [u8]>, Error> {
        let bytes = payload.encode().map_err(|e| {
            self.tag(Error::new(ErrorKind::Encode, "could not encode a payload").with_cause(e))
        })?;
        if bytes.len() > self.max_payload {
            return Err(self.tag(Error::new(
                ErrorKind::PayloadTooLarge,
                format!(
                    "payload of {} bytes exceeds the limit of {} bytes (QueueOptions::max_payload_bytes); nothing was written",
                    bytes.len(),
                    self.max_payload
                ),
            )));
        }
        Ok(bytes)
    }

    /// The delay in ms, checked against the 2^53 ms limit of a score.
    pub(super) fn delay_ms(&self, delay: Duration) -> Result<u64, Error> {
        self.delay_ms_within(delay, self.delay_limit())
    }

    /// The longest delay (ms) whose due time stays within 2^53 ms.
    pub(super) fn delay_limit(&self) -> u64 {
        MAX_DUE_MS.saturating_sub(self.rt().server_now_ms())
    }

    pub(super) fn delay_ms_within(&self, delay: Duration, limit: u64) -> Result<u64, Error> {
        let ms = ceil_ms(delay);
        if ms > u128::from(limit) {
            return Err(self.tag(Error::new(
                ErrorKind::DelayOverflow,
                format!("a delay of {delay:?} puts the due time past 2^53 ms"),
            )));
        }
        Ok(ms as u64)
    }

    /// Transfer script runs and messages moved by this process's transfer
    /// job for this queue so far (diagnostics).
    pub fn transfer_stats(&self) -> TransferStats {
        use std::sync::atomic::Ordering;
        let rt = self.rt();
        let next_wakeup = rt.driver.scheduled_at(&self.state.job_key).map(|at| {
            let now = rt.local_now();
            Instant::now() + at.saturating_sub(now)
        });
        TransferStats {
            runs: self.state.transfer.runs.load(Ordering::Relaxed),
            moved: self.state.transfer.moved.load(Ordering::Relaxed),
            next_wakeup,
        }
    }

    /// Makes this process's transfer job look at the queue after `d`.
    pub(crate) fn announce_deadline(&self, d: Duration) {
        self.rt().driver.announce(
            &self.state.job_key,
            Deadline::After(d.saturating_add(Duration::from_millis(1))),
        );
    }
}

/// What this process's transfer job did for one queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct TransferStats {
    /// Transfer script calls that succeeded.
    pub runs: u64,
    /// Messages they moved to the ready list.
    pub moved: u64,
    /// When the pending wheel timeout fires, if one is pending.
    pub next_wakeup: Option<Instant>,
}

pub(super) fn check_id(id: &MessageId) -> Result<(), Error> {
    let reason = if id.0.is_empty() {
        "must not be empty"
    } else if id.0.len() > MAX_ID_LEN {
        "longer than 128 bytes"
    } else {
        return Ok(());
    };
    Err(Error::new(
        ErrorKind::InvalidId,
        format!("invalid message id {:?}: {reason}", id.0),
    ))
}
