//! [`ErrorKind`]: what kind of failure a Redis-backed [`Error`] is, and
//! which kinds are transient or the caller's mistake.
//!
//! [`Error`]: crate::Error

use std::fmt;

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
///
/// [`Error`]: crate::Error
/// [`Error::is_invalid_input`]: crate::Error::is_invalid_input
/// [`Error::is_transient`]: crate::Error::is_transient
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
    ///
    /// [`Error::message_id`]: crate::Error::message_id
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
    /// ([`Queue::offer_with_id`](crate::Queue::offer_with_id)). For a lock
    /// with [`Lock::wait_replicas`](crate::Lock::wait_replicas): the grant
    /// was refused and the lock released; try again.
    NotReplicated,
    /// The queue holds `QueueOptions::max_len` messages already (delayed,
    /// ready or in flight: [`Queue::len`]): the offer wrote nothing. Not
    /// transient in the sense of [`Error::is_transient`] (Redis is fine): it
    /// is back-pressure; offer again once consumers have caught up. A batch
    /// offer is refused per chunk of up to 1,000 (see
    /// [`Queue::offer_batch`]).
    ///
    /// [`Queue::len`]: crate::Queue::len
    /// [`Queue::offer_batch`]: crate::Queue::offer_batch
    /// [`Error::is_transient`]: crate::Error::is_transient
    QueueFull,
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
            ErrorKind::QueueFull => "queue full",
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
