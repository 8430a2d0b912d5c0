//! Error types: [`TimerError`] for the timer alone, and one [`Error`] (with
//! its [`ErrorKind`]) for everything Redis-backed.
//!
//! Every fallible public operation returns one of these; nothing in the
//! public API panics on bad input.

use std::fmt;
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

/// What kind of failure an [`Error`] is.
///
/// Three groups matter to a caller:
///
/// * **invalid input** ([`Error::is_invalid_input`]): the call can never
///   succeed as made, and nothing was written;
/// * **transient** ([`Error::is_transient`]): Redis could not be reached,
///   timed out, is loading or failing over; the same call may succeed
///   later. [`Unavailable`](ErrorKind::Unavailable) means the command did
///   not take effect; [`OutcomeUnknown`](ErrorKind::OutcomeUnknown) means
///   it may have;
/// * everything else is final for the call that got it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A queue (or lock) name is empty, too long, or holds a character that
    /// would break its Redis hash tag (`{`, `}`) or a control character.
    InvalidName,
    /// A message id is empty or too long.
    InvalidId,
    /// An option is out of range.
    InvalidOption,
    /// The Redis URL cannot be parsed or names an unsupported scheme.
    InvalidUrl,
    /// A due time would be beyond 2^53 ms since the epoch (the last
    /// integer a Redis score holds exactly), about year 287,396.
    DelayOverflow,
    /// An encoded payload is larger than the queue's `max_payload_bytes`.
    PayloadTooLarge,
    /// The codec could not encode a payload; nothing was written.
    Encode,
    /// A message's payload could not be decoded. The message was not lost:
    /// it is kept as a dead letter. [`Error::message_id`] names it.
    Decode,
    /// A lock's lease was lost while it was held: it lapsed (the holder
    /// could not renew it in time) or the lock was taken from it
    /// (`force_unlock`, another owner after the lapse). What the holder did
    /// under it may have overlapped with another holder; its fencing token
    /// lets a store reject the stale writes. Not transient.
    LockLost,
    /// Redis cannot be reached (connection refused or reset before the
    /// command was sent) or is not ready (loading, failing over). The
    /// command did not take effect. Transient.
    Unavailable,
    /// The connection failed or timed out after a command that writes was
    /// sent: it may or may not have taken effect, and the caller cannot
    /// know which. Transient, but a blind retry of a write can apply it
    /// twice: retry offers with [`Queue::offer_with_id`], which is
    /// idempotent.
    ///
    /// [`Queue::offer_with_id`]: crate::Queue::offer_with_id
    OutcomeUnknown,
    /// The write reached the master, but fewer replicas than
    /// `QueueOptions::wait_replicas` asked for confirmed it in time: a
    /// failover now could lose it. Transient; retry with an id of your own
    /// ([`Queue::offer_with_id`](crate::Queue::offer_with_id)).
    NotReplicated,
    /// An ack, nack or extend of a claimed message whose visibility ended
    /// first: the message was (or will be) delivered again, and the call
    /// did not touch that new delivery.
    StaleDelivery,
    /// Redis refused the credentials (wrong user or password, or none
    /// given to a server that requires them). Not transient.
    Authentication,
    /// The ACL user may not run a command or touch a key or channel that
    /// redwheel needs (`NOPERM`). Not transient.
    PermissionDenied,
    /// The TLS handshake failed: an untrusted or invalid certificate, a
    /// name mismatch, or a server that does not speak TLS. Not transient.
    Tls,
    /// The server's reply is not what Redis or redwheel's scripts send:
    /// the peer is not a Redis server, or a key of a queue was overwritten
    /// by another program with a value of another type.
    Protocol,
    /// Redis answered with an error that retrying will not fix.
    Server,
    /// The [`Redwheel`](crate::Redwheel) was shut down.
    Shutdown,
    /// `shutdown` gave up waiting for its threads.
    ShutdownTimeout,
    /// The timer could not be built or started.
    Timer,
    /// A thread could not be started.
    Spawn,
}

impl ErrorKind {
    /// A short description of the kind, lowercase.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::InvalidName => "invalid name",
            ErrorKind::InvalidId => "invalid message id",
            ErrorKind::InvalidOption => "invalid option",
            ErrorKind::InvalidUrl => "invalid url",
            ErrorKind::DelayOverflow => "due time overflows",
            ErrorKind::PayloadTooLarge => "payload too large",
            ErrorKind::Encode => "encoding failed",
            ErrorKind::Decode => "decoding failed",
            ErrorKind::LockLost => "lock lost",
            ErrorKind::Unavailable => "redis unavailable",
            ErrorKind::OutcomeUnknown => "outcome unknown",
            ErrorKind::NotReplicated => "not replicated",
            ErrorKind::StaleDelivery => "stale delivery",
            ErrorKind::Authentication => "authentication failed",
            ErrorKind::PermissionDenied => "permission denied",
            ErrorKind::Tls => "tls failure",
            ErrorKind::Protocol => "unexpected reply",
            ErrorKind::Server => "redis error",
            ErrorKind::Shutdown => "shut down",
            ErrorKind::ShutdownTimeout => "shutdown timed out",
            ErrorKind::Timer => "timer error",
            ErrorKind::Spawn => "thread spawn failed",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

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

/// Whether a command can change what Redis holds: decides how an error
/// after it was sent is reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    /// Reads only: a failure after sending it is [`ErrorKind::Unavailable`].
    Read,
    /// May write: a failure after sending it is [`ErrorKind::OutcomeUnknown`].
    Write,
}

/// The error text redwheel's scripts raise for a due time past 2^53 ms.
pub(crate) const DUE_OVERFLOW_TEXT: &str = "redwheel: due overflows";

impl Error {
    /// Classifies an error of a command sent to Redis.
    ///
    /// `access` says whether the command may write: a timeout or a
    /// connection lost after sending a write is
    /// [`ErrorKind::OutcomeUnknown`], after a read
    /// [`ErrorKind::Unavailable`].
    pub(crate) fn from_redis(e: redis::RedisError, access: Access) -> Error {
        use redis::{ErrorKind as K, ServerErrorKind as S};
        if let Some(kind) = connect_failure_kind(&e) {
            let what = match kind {
                ErrorKind::Authentication => "redis refused the credentials",
                ErrorKind::Tls => "the TLS connection to redis failed",
                ErrorKind::InvalidUrl => "the redis connection settings are invalid",
                _ => "redis is unavailable",
            };
            return Error::new(kind, what).with_cause(e);
        }
        let (kind, what) = if server_text(&e).contains(DUE_OVERFLOW_TEXT) {
            (
                ErrorKind::DelayOverflow,
                "the due time computed by the server exceeds 2^53 ms",
            )
        } else if is_script_permission_error(&e) {
            (
                ErrorKind::PermissionDenied,
                "the redis user lacks a permission redwheel needs",
            )
        } else if e.is_timeout() {
            match access {
                Access::Write => (
                    ErrorKind::OutcomeUnknown,
                    "redis did not answer in time; the write may or may not have happened",
                ),
                Access::Read => (ErrorKind::Unavailable, "redis did not answer in time"),
            }
        } else if e.is_connection_refusal() {
            (ErrorKind::Unavailable, "redis refused the connection")
        } else if e.is_io_error() || e.is_connection_dropped() {
            match access {
                Access::Write => (
                    ErrorKind::OutcomeUnknown,
                    "the connection to redis failed during a write; it may or may not have happened",
                ),
                Access::Read => (ErrorKind::Unavailable, "the connection to redis failed"),
            }
        } else {
            match e.kind() {
                K::Server(S::BusyLoading) => (ErrorKind::Unavailable, "redis is loading its data"),
                K::Server(S::TryAgain | S::MasterDown | S::ClusterDown | S::ReadOnly) => {
                    (ErrorKind::Unavailable, "redis is failing over")
                }
                K::Server(S::Moved | S::Ask) => (
                    ErrorKind::Unavailable,
                    "the slot moved to another node of the cluster",
                ),
                K::Server(S::NoPerm) => (
                    ErrorKind::PermissionDenied,
                    "the redis user lacks a permission redwheel needs",
                ),
                K::Server(S::NoScript) => (ErrorKind::Server, "redis does not know the script"),
                _ if e.code() == Some("WRONGTYPE") => (
                    ErrorKind::Protocol,
                    "a key holds a value of the wrong type (overwritten by another program?)",
                ),
                K::Parse | K::UnexpectedReturnType => {
                    (ErrorKind::Protocol, "unexpected reply from redis")
                }
                K::InvalidClientConfig => (
                    ErrorKind::InvalidUrl,
                    "the redis connection settings are invalid",
                ),
                _ => (ErrorKind::Server, "redis answered with an error"),
            }
        };
        Error::new(kind, what).with_cause(e)
    }

    /// The error of a failed connection attempt to `addr`.
    pub(crate) fn connect(e: redis::RedisError, addr: &str) -> Error {
        let kind = connect_failure_kind(&e).unwrap_or_else(|| {
            use redis::ErrorKind as K;
            match e.kind() {
                K::Parse | K::UnexpectedReturnType => ErrorKind::Protocol,
                K::Server(redis::ServerErrorKind::NoPerm) => ErrorKind::PermissionDenied,
                K::InvalidClientConfig => ErrorKind::InvalidUrl,
                _ if e.is_io_error() || e.is_connection_dropped() || e.is_timeout() => {
                    ErrorKind::Unavailable
                }
                K::Server(redis::ServerErrorKind::BusyLoading) => ErrorKind::Unavailable,
                _ => ErrorKind::Server,
            }
        });
        let tls_timeout =
            kind == ErrorKind::Unavailable && e.is_timeout() && addr.ends_with("(TLS)");
        let message = match kind {
            _ if tls_timeout => format!(
                "cannot connect to redis at {addr}: no TLS handshake in time (does the port serve TLS?)"
            ),
            ErrorKind::Authentication => format!("redis at {addr} refused the credentials"),
            ErrorKind::PermissionDenied => {
                format!("the redis user at {addr} lacks a permission redwheel needs")
            }
            ErrorKind::Tls => format!("the TLS handshake with redis at {addr} failed"),
            ErrorKind::Protocol => format!("the server at {addr} did not answer as redis does"),
            ErrorKind::InvalidUrl => format!("cannot connect to {addr}"),
            _ => format!("cannot connect to redis at {addr}"),
        };
        Error::new(kind, message).with_cause(e)
    }
}

/// An ACL refusal of a command run from a script (Redis reports those as
/// plain errors, not `NOPERM`).
fn is_script_permission_error(e: &redis::RedisError) -> bool {
    let text = server_text(e);
    text.contains("user executing the script can't") || text.contains("No permissions to access")
}

/// What the server said: the error's detail, or for a failed pipeline (no
/// detail of its own) its whole text, which holds each command's error.
fn server_text(e: &redis::RedisError) -> std::borrow::Cow<'_, str> {
    match e.detail() {
        Some(d) => std::borrow::Cow::Borrowed(d),
        None => std::borrow::Cow::Owned(e.to_string()),
    }
}

/// Failures of the connection itself that no retry will fix (credentials,
/// TLS, configuration), or `None`.
fn connect_failure_kind(e: &redis::RedisError) -> Option<ErrorKind> {
    use redis::ErrorKind as K;
    match e.kind() {
        K::AuthenticationFailed => return Some(ErrorKind::Authentication),
        K::InvalidClientConfig => return Some(ErrorKind::InvalidUrl),
        _ => {}
    }
    if matches!(e.code(), Some("WRONGPASS" | "NOAUTH")) {
        return Some(ErrorKind::Authentication);
    }
    if is_tls_failure(e) {
        return Some(ErrorKind::Tls);
    }
    None
}

/// A TLS failure: rustls's errors reach us inside an `io::Error`
/// (`InvalidData`) inside the redis error, or as a redis error of their
/// own.
fn is_tls_failure(e: &redis::RedisError) -> bool {
    use std::error::Error as _;
    type Shared = std::sync::Arc<dyn std::error::Error + Send + Sync>;
    let Some(inner) = e.source() else {
        return false;
    };
    // The redis error keeps its cause behind an `Arc`.
    let inner: &(dyn std::error::Error + 'static) = match inner.downcast_ref::<Shared>() {
        Some(arc) => &**arc,
        None => inner,
    };
    if is_rustls_error(inner) {
        return true;
    }
    inner
        .downcast_ref::<io::Error>()
        .and_then(|io| io.get_ref())
        .is_some_and(|cause| is_rustls_error(cause))
}

#[cfg(feature = "tls")]
fn is_rustls_error(e: &(dyn std::error::Error + 'static)) -> bool {
    e.downcast_ref::<rustls::Error>().is_some()
}

#[cfg(not(feature = "tls"))]
fn is_rustls_error(_: &(dyn std::error::Error + 'static)) -> bool {
    false
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

    #[test]
    fn a_timeout_after_a_write_is_outcome_unknown_and_after_a_read_unavailable() {
        let timeout =
            || redis::RedisError::from(io::Error::new(io::ErrorKind::TimedOut, "timed out"));
        let w = Error::from_redis(timeout(), Access::Write);
        assert_eq!(w.kind(), ErrorKind::OutcomeUnknown);
        assert!(w.is_transient() && w.is_outcome_unknown());
        let r = Error::from_redis(timeout(), Access::Read);
        assert_eq!(r.kind(), ErrorKind::Unavailable);
        assert!(r.is_transient() && !r.is_outcome_unknown());
    }

    #[test]
    fn a_refused_connection_is_unavailable_even_for_a_write() {
        let e =
            redis::RedisError::from(io::Error::new(io::ErrorKind::ConnectionRefused, "refused"));
        assert_eq!(
            Error::from_redis(e, Access::Write).kind(),
            ErrorKind::Unavailable
        );
    }

    #[test]
    fn invalid_input_kinds_are_not_transient() {
        for kind in [
            ErrorKind::InvalidName,
            ErrorKind::InvalidId,
            ErrorKind::InvalidOption,
            ErrorKind::InvalidUrl,
            ErrorKind::DelayOverflow,
            ErrorKind::PayloadTooLarge,
            ErrorKind::Encode,
        ] {
            let e = Error::new(kind, "x");
            assert!(e.is_invalid_input() && !e.is_transient(), "{kind}");
        }
        for kind in [
            ErrorKind::Authentication,
            ErrorKind::Tls,
            ErrorKind::Shutdown,
        ] {
            let e = Error::new(kind, "x");
            assert!(!e.is_invalid_input() && !e.is_transient(), "{kind}");
        }
    }
}
