//! [`TimerError`]: the timer's own error, which knows nothing of Redis.

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
