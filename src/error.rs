//! Error types, one per layer.
//!
//! Every fallible public operation returns one of these; nothing in the
//! public API panics on bad input.

use std::io;

/// Why a timer operation failed.
///
/// [`TooManyPending`](TimerError::TooManyPending) is transient: it clears as
/// pending timeouts fire or are cancelled. The others are final for the call
/// that got them.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TimerError {
    /// A builder argument is out of range.
    #[error("invalid argument `{name}`: {reason}")]
    InvalidArgument {
        /// The builder method whose value was rejected.
        name: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The timer was stopped (or its last handle dropped); it takes no new
    /// timeouts.
    #[error("the timer is stopped")]
    Stopped,
    /// The number of pending timeouts would exceed `max_pending`.
    #[error("too many pending timeouts: {pending} pending, the limit is {max}")]
    TooManyPending {
        /// Timeouts pending when the call was rejected.
        pending: usize,
        /// The configured limit.
        max: usize,
    },
    /// `stop()` was called by a task running on the timer's own worker
    /// thread, which cannot wait for itself to finish.
    #[error("stop() cannot be called from a task running on the timer's worker thread")]
    StopFromTask,
    /// The operating system refused to start the worker thread.
    #[error("could not start the timer's worker thread")]
    Spawn(#[source] io::Error),
}

impl TimerError {
    /// True for errors that may go away if the call is retried later.
    pub fn is_transient(&self) -> bool {
        matches!(self, TimerError::TooManyPending { .. })
    }
}

/// A boxed error from a [`Codec`](crate::queue::Codec).
pub type CodecError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why a queue (or [`Redwheel`](crate::Redwheel)) operation failed.
///
/// [`Unavailable`](QueueError::Unavailable) is transient (Redis is
/// unreachable, restarting or loading its data): retry later;
/// [`is_transient`](QueueError::is_transient) says so. Bad input
/// (`InvalidName`, `InvalidId`, `InvalidOption`, `DelayOverflow`,
/// `PayloadTooLarge`, `Encode`) is final and nothing was written.
/// [`Decode`](QueueError::Decode) names the message that could not be
/// decoded; it was parked, not lost.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum QueueError {
    /// A queue name is empty, too long, or holds a character that would
    /// break its Redis hash tag (`{`, `}`) or a control character.
    #[error("invalid queue name {name:?}: {reason}")]
    InvalidName {
        /// The rejected name.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A message id given to `remove` cannot be one redwheel made.
    #[error("invalid message id {id:?}: {reason}")]
    InvalidId {
        /// The rejected id.
        id: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A [`QueueOptions`](crate::QueueOptions) or
    /// [`RedwheelOptions`](crate::RedwheelOptions) value is out of range.
    #[error("invalid option `{name}`: {reason}")]
    InvalidOption {
        /// The option's name.
        name: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The due time would be beyond 2^53 ms since the epoch (the last
    /// integer a Redis score holds exactly), about year 287,396.
    #[error("the due time overflows: {reason}")]
    DelayOverflow {
        /// Which delay or time.
        reason: String,
    },
    /// An encoded payload is larger than the queue's `max_payload_bytes`.
    #[error("payload of {size} bytes exceeds the limit of {max} bytes")]
    PayloadTooLarge {
        /// Encoded size.
        size: usize,
        /// The configured limit.
        max: usize,
    },
    /// The codec could not encode a payload; nothing was written.
    #[error("could not encode a payload")]
    Encode(#[source] CodecError),
    /// A taken message's payload could not be decoded. The message was not
    /// lost: it is parked as a dead letter (its id on `redwheel:{N}:dead`,
    /// its stored value back in `redwheel:{N}:msg`).
    #[error("could not decode message {id} of queue {queue:?} (parked as a dead letter)")]
    Decode {
        /// The queue's name.
        queue: String,
        /// The message's id.
        id: String,
        /// The codec's error.
        #[source]
        source: CodecError,
    },
    /// Redis cannot be reached (connection refused, reset or timed out) or
    /// is not ready (loading its data). Transient.
    #[error("redis is unavailable")]
    Unavailable(#[source] redis::RedisError),
    /// Redis answered with an error that retrying will not fix (a bad URL,
    /// authentication, a wrong key type…).
    #[error("redis error")]
    Redis(#[source] redis::RedisError),
    /// Redis replied with something redwheel's scripts never return (for
    /// example, a key of the queue was overwritten by another program).
    #[error("unexpected reply from redis: {0}")]
    Protocol(String),
    /// The [`Redwheel`](crate::Redwheel) was shut down.
    #[error("redwheel is shut down")]
    Shutdown,
    /// `shutdown` gave up waiting for its threads.
    #[error("shutdown timed out; {threads} thread(s) still running")]
    ShutdownTimeout {
        /// Threads that had not ended.
        threads: usize,
    },
    /// The timer could not be built or started.
    #[error("timer error")]
    Timer(#[from] TimerError),
    /// A thread could not be started.
    #[error("could not start a thread")]
    Spawn(#[source] io::Error),
}

impl QueueError {
    /// True for errors that may go away if the call is retried later
    /// (Redis unreachable or loading).
    pub fn is_transient(&self) -> bool {
        matches!(self, QueueError::Unavailable(_))
    }

    /// True for errors caused by the caller's input (name, id, option,
    /// delay, payload size or encoding): retrying the same call fails again.
    pub fn is_invalid_input(&self) -> bool {
        matches!(
            self,
            QueueError::InvalidName { .. }
                | QueueError::InvalidId { .. }
                | QueueError::InvalidOption { .. }
                | QueueError::DelayOverflow { .. }
                | QueueError::PayloadTooLarge { .. }
                | QueueError::Encode(_)
        )
    }
}

impl From<redis::RedisError> for QueueError {
    fn from(e: redis::RedisError) -> Self {
        if is_unavailable(&e) {
            QueueError::Unavailable(e)
        } else if e
            .detail()
            .is_some_and(|d| d.contains("redwheel: due overflows"))
        {
            QueueError::DelayOverflow {
                reason: "the due time computed by the server exceeds 2^53 ms".to_owned(),
            }
        } else {
            QueueError::Redis(e)
        }
    }
}

/// Connection-level failures and a server not ready yet.
pub(crate) fn is_unavailable(e: &redis::RedisError) -> bool {
    use redis::{ErrorKind, ServerErrorKind};
    e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || matches!(
            e.kind(),
            ErrorKind::Server(
                ServerErrorKind::BusyLoading
                    | ServerErrorKind::TryAgain
                    | ServerErrorKind::MasterDown
                    | ServerErrorKind::ClusterDown
            )
        )
}
