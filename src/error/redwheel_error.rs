//! [`Error`]: the one error of everything Redis-backed, with its kind, the
//! queue and message it concerns, and its cause.

use std::fmt;

use super::kind::ErrorKind;
use super::timer::TimerError;

/// A boxed error from a [`Codec`](crate::queue::Codec).
pub type CodecError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why a Redis-backed operation failed: connecting, a queue operation, or
/// a lock.
///
/// [`kind`](Error::kind) says what happened; [`is_transient`] and
/// [`is_invalid_input`] say what to do about it; [`queue`](Error::queue)
/// and [`message_id`](Error::message_id) name what it concerns where that
/// applies.
///
/// `Display` gives the whole story in one line, cause included ("cannot
/// connect to redis at 127.0.0.1:6379: Connection refused (os error 111)"),
/// so [`source`](std::error::Error::source) returns nothing, and the cause
/// is not printed twice by error reporters that walk the chain; the
/// underlying error is still reachable through [`get_ref`](Error::get_ref)
/// (a `redis::RedisError`, a codec's error, a [`TimerError`] or an
/// `io::Error`), for downcasting.
///
/// ```no_run
/// use std::time::Duration;
/// use redwheel::{ErrorKind, Redwheel};
///
/// let rw = Redwheel::connect("redis://127.0.0.1:6379")?;
/// let q = rw.queue::<String>("orders")?;
/// match q.offer(&"order-42".to_string(), Duration::from_secs(60)) {
///     Ok(id) => println!("queued as {id}"),
///     // Nothing was written: safe to retry as is.
///     Err(e) if e.kind() == ErrorKind::Unavailable => { /* retry later */ }
///     // It may have been written: retry with offer_with_id to write it once.
///     Err(e) if e.is_outcome_unknown() => { /* … */ }
///     // The call was wrong (too large, a bad delay): fix the input.
///     Err(e) if e.is_invalid_input() => eprintln!("{e}"),
///     Err(e) => return Err(e),
/// }
/// # Ok::<(), redwheel::Error>(())
/// ```
///
/// [`is_transient`]: Error::is_transient
/// [`is_invalid_input`]: Error::is_invalid_input
pub struct Error {
    inner: Box<Inner>,
}

struct Inner {
    kind: ErrorKind,
    message: String,
    queue: Option<String>,
    id: Option<String>,
    cause: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

impl Error {
    /// An error of `kind` saying `message`.
    pub(crate) fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error {
            inner: Box::new(Inner {
                kind,
                message: message.into(),
                queue: None,
                id: None,
                cause: None,
            }),
        }
    }

    /// Adds the underlying error (printed after the message).
    pub(crate) fn with_cause(
        mut self,
        cause: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
    ) -> Error {
        self.inner.cause = Some(cause.into());
        self
    }

    /// Names the queue the error concerns (kept if already set).
    pub(crate) fn in_queue(mut self, name: &str) -> Error {
        if self.inner.queue.is_none() {
            self.inner.queue = Some(name.to_owned());
        }
        self
    }

    /// Names the message the error concerns.
    pub(crate) fn for_message(mut self, id: &str) -> Error {
        self.inner.id = Some(id.to_owned());
        self
    }

    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        self.inner.kind
    }

    /// True when the same call may succeed later: Redis unreachable, timed
    /// out, loading or failing over ([`ErrorKind::Unavailable`],
    /// [`ErrorKind::OutcomeUnknown`] and [`ErrorKind::NotReplicated`]). For `OutcomeUnknown` the write may
    /// have happened: retry offers with an id
    /// ([`Queue::offer_with_id`](crate::Queue::offer_with_id)).
    pub fn is_transient(&self) -> bool {
        matches!(
            self.inner.kind,
            ErrorKind::Unavailable | ErrorKind::OutcomeUnknown | ErrorKind::NotReplicated
        )
    }

    /// True when the caller's input is at fault (a name, id, option, URL,
    /// delay, payload size or encoding): retrying the same call fails
    /// again, and nothing was written.
    pub fn is_invalid_input(&self) -> bool {
        matches!(
            self.inner.kind,
            ErrorKind::InvalidName
                | ErrorKind::InvalidId
                | ErrorKind::InvalidOption
                | ErrorKind::InvalidUrl
                | ErrorKind::DelayOverflow
                | ErrorKind::PayloadTooLarge
                | ErrorKind::Encode
        )
    }

    /// True when a write may have taken effect although the call failed
    /// ([`ErrorKind::OutcomeUnknown`]).
    pub fn is_outcome_unknown(&self) -> bool {
        self.inner.kind == ErrorKind::OutcomeUnknown
    }

    /// The queue this error concerns, if any.
    pub fn queue(&self) -> Option<&str> {
        self.inner.queue.as_deref()
    }

    /// The message this error concerns, if any (for example the message
    /// that could not be decoded).
    pub fn message_id(&self) -> Option<&str> {
        self.inner.id.as_deref()
    }

    /// The underlying error, if any: a `redis::RedisError`, a codec's
    /// error, a [`TimerError`] or an `io::Error`. Its text is already part
    /// of this error's `Display`.
    pub fn get_ref(&self) -> Option<&(dyn std::error::Error + Send + Sync + 'static)> {
        self.inner.cause.as_deref()
    }

    /// The underlying Redis error, if this error came from one.
    pub fn redis_error(&self) -> Option<&redis::RedisError> {
        self.get_ref()?.downcast_ref()
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(q) = &self.inner.queue {
            write!(f, "queue {q:?}: ")?;
        }
        f.write_str(&self.inner.message)?;
        if let Some(id) = &self.inner.id {
            write!(f, " (message {id})")?;
        }
        if let Some(cause) = &self.inner.cause {
            write!(f, ": {cause}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Error");
        d.field("kind", &self.inner.kind)
            .field("message", &self.inner.message);
        if let Some(q) = &self.inner.queue {
            d.field("queue", q);
        }
        if let Some(id) = &self.inner.id {
            d.field("id", id);
        }
        if let Some(c) = &self.inner.cause {
            d.field("cause", c);
        }
        d.finish()
    }
}

impl std::error::Error for Error {}

impl From<TimerError> for Error {
    fn from(e: TimerError) -> Error {
        Error::new(ErrorKind::Timer, "the timer failed").with_cause(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_gives_queue_message_id_and_cause_once() {
        let cause: CodecError = "bad utf-8".into();
        let e = Error::new(ErrorKind::Decode, "could not decode a message")
            .with_cause(cause)
            .in_queue("orders")
            .for_message("abc");
        assert_eq!(
            e.to_string(),
            "queue \"orders\": could not decode a message (message abc): bad utf-8"
        );
        assert!(std::error::Error::source(&e).is_none());
        assert_eq!(e.get_ref().unwrap().to_string(), "bad utf-8");
        assert_eq!(e.queue(), Some("orders"));
        assert_eq!(e.message_id(), Some("abc"));
    }
}
