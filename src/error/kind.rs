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
/// Each kind below says the situation that produces it and what to do.
/// The error's `Display` says the rest: the queue or lock, what redwheel was
/// doing (for a Redis reply, the script it ran: `while running offer.lua`),
/// what Redis replied, in words, and what to change.
///
/// [`Error`]: crate::Error
/// [`Error::is_invalid_input`]: crate::Error::is_invalid_input
/// [`Error::is_transient`]: crate::Error::is_transient
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A queue, lock or schedule name is empty, too long (over 200 bytes;
    /// a schedule's over its own limit), or holds `{`, `}` (they would end
    /// the Redis hash tag `redwheel:{name}:…` that keeps an object's keys
    /// in one cluster slot) or a control character; or the name is in use
    /// by another kind of object in this [`Redwheel`](crate::Redwheel).
    /// Nothing was sent. What to do: use another name; the message says
    /// which rule the name broke.
    InvalidName,
    /// A message id (one of yours, [`MessageId`](crate::MessageId)) is
    /// empty or longer than the limit. Nothing was sent. What to do: use a
    /// shorter id, for example a hash of the long one.
    InvalidId,
    /// An option or argument is out of range: a queue, consumer, lock,
    /// connection or dashboard option, a batch size, a `wait_replicas`
    /// timeout that leaves no room within the command timeout, a schedule
    /// that is not valid. Nothing was sent. What to do: change the value
    /// the message names (it says the allowed range).
    InvalidOption,
    /// The Redis URL cannot be parsed, names an unsupported scheme, asks
    /// for TLS (`rediss://`) without the `tls` feature, or a cluster was
    /// given no seed URL. What to do: fix the URL
    /// (`redis://[user:password@]host:port[/db]`) or enable the feature.
    InvalidUrl,
    /// A due time would be beyond 2^53 ms since the epoch (the last
    /// integer a Redis score holds exactly), about year 287,396: a delay
    /// that large, or an absolute due time past it. Nothing was written.
    /// What to do: use a shorter delay.
    DelayOverflow,
    /// An encoded payload is larger than the queue's
    /// `QueueOptions::max_payload_bytes` (1 MiB by default). Nothing was
    /// written. What to do: send a smaller payload (or a reference to
    /// where the data is), or raise `max_payload_bytes` for the queue.
    PayloadTooLarge,
    /// The queue's [`Codec`](crate::Codec) could not encode a payload (the
    /// codec's error is the cause). Nothing was written. What to do: fix
    /// the value or the codec.
    Encode,
    /// A message's payload could not be decoded with the queue's codec
    /// (written by another version of the program, or with another type).
    /// The message was not lost: it is kept as a dead letter, with the
    /// decode error as its reason (the message says so, or why it could
    /// not be parked); [`Error::message_id`] names it. What to do: read it
    /// with [`Queue::dead_letters`], fix the codec or the producer, then
    /// requeue the dead letters ([`Queue::requeue_dead`]) or remove the
    /// message ([`Queue::remove`]).
    ///
    /// [`Error::message_id`]: crate::Error::message_id
    /// [`Queue::dead_letters`]: crate::Queue::dead_letters
    /// [`Queue::requeue_dead`]: crate::Queue::requeue_dead
    /// [`Queue::remove`]: crate::Queue::remove
    Decode,
    /// A lock's lease was lost while it was held: it lapsed (the holder
    /// could not renew it in time) or the lock was taken from it
    /// (`force_unlock`, another owner after the lapse). What the holder did
    /// under it may have overlapped with another holder; its fencing token
    /// lets a store reject the stale writes. Not transient. What to do:
    /// treat the work done under the lock as possibly concurrent (check it
    /// against the fencing token), and acquire the lock again to go on.
    LockLost,
    /// Redis cannot be reached (connection refused or reset before the
    /// command was sent, no answer to a read in time) or is not ready
    /// (loading its data after a restart, failing over, a cluster slot
    /// moving). The command did not take effect. Transient. What to do:
    /// retry the same call later; if it persists, check that Redis runs at
    /// the address the message names and that this host can reach it.
    Unavailable,
    /// The connection failed or timed out after a command that writes was
    /// sent: it may or may not have taken effect, and the caller cannot
    /// know which. Transient, but a blind retry of a write can apply it
    /// twice. What to do: retry offers with [`Queue::offer_with_id`]
    /// (idempotent: the id is written at most once); for other writes,
    /// read the state back before retrying.
    ///
    /// [`Queue::offer_with_id`]: crate::Queue::offer_with_id
    OutcomeUnknown,
    /// The write reached the master, but fewer replicas than
    /// `QueueOptions::wait_replicas` asked for confirmed it in time: a
    /// failover now could lose it. Transient. What to do: retry with an id
    /// of your own ([`Queue::offer_with_id`](crate::Queue::offer_with_id)),
    /// and check the replicas' health and lag. For a lock with
    /// [`Lock::wait_replicas`](crate::Lock::wait_replicas): the grant was
    /// refused and the lock released; try again.
    NotReplicated,
    /// The queue holds `QueueOptions::max_len` messages already (delayed,
    /// ready or in flight: [`Queue::len`]): the offer wrote nothing. Not
    /// transient in the sense of [`Error::is_transient`] (Redis is fine): it
    /// is back-pressure. What to do: offer again once consumers have caught
    /// up (the message says how full the queue is), add consumers, or raise
    /// `max_len`. A batch offer is refused per chunk of up to 1,000 (see
    /// [`Queue::offer_batch`]).
    ///
    /// [`Queue::len`]: crate::Queue::len
    /// [`Queue::offer_batch`]: crate::Queue::offer_batch
    /// [`Error::is_transient`]: crate::Error::is_transient
    QueueFull,
    /// An ack, nack or extend of a claimed message whose visibility ended
    /// first: the message was (or will be) delivered again, and the call
    /// did not touch that new delivery. What to do: nothing for this
    /// delivery (its result is dropped); if it happens often, raise
    /// `QueueOptions::visibility` above the handler's run time, or extend
    /// the delivery while working on it.
    StaleDelivery,
    /// Redis refused the credentials (wrong user or password, or none
    /// given to a server that requires them). Not transient. What to do:
    /// fix the user and password in the URL (`redis://user:password@…`).
    Authentication,
    /// The Redis ACL user may not run a command, or touch a key or channel,
    /// that redwheel needs (`NOPERM`, or a script's command refused). Not
    /// transient. What to do: give the user the README's least-privilege
    /// rules (`ACL SETUSER redwheel …`); the server's `ACL LOG` names the
    /// command or key it refused.
    PermissionDenied,
    /// The TLS handshake failed: an untrusted or invalid certificate, a
    /// name mismatch, or a server that does not speak TLS. Not transient.
    /// What to do: trust the server's CA
    /// (`RedwheelOptions::tls_root_certificate`), connect by the name its
    /// certificate carries, or use `redis://` for a port without TLS.
    Tls,
    /// The server's reply is not what Redis or redwheel's scripts send:
    /// the peer is not a Redis server, or a key of a queue or lock holds a
    /// value of another type, written by another program (`WRONGTYPE`).
    /// What to do: check that the URL points at Redis (7.0 or newer); for
    /// a key of another program, move that program's data off redwheel's
    /// key names (`redwheel:{<name>}:*`, named in the message) or use
    /// another queue or lock name.
    Protocol,
    /// Redis answered with an error that retrying will not fix: it is out
    /// of memory (`OOM`: `maxmemory` reached), an id this process made is
    /// already in use, a schedule's state kept changing under the call, or
    /// a reply redwheel does not expect. What to do: the message says what
    /// the reply means; for `OOM`, free memory or raise `maxmemory`.
    Server,
    /// The [`Redwheel`](crate::Redwheel) was shut down (by
    /// [`shutdown`](crate::Redwheel::shutdown), or all its handles
    /// dropped): it takes no more calls, and blocked reads return this.
    /// What to do: stop using its queues and locks, or connect a new one.
    Shutdown,
    /// `shutdown` (or a consumer pool's shutdown) gave up waiting for its
    /// threads within the timeout: the driver or subscriber is still
    /// running a round, or handlers still run after the grace period
    /// (their messages were given back). What to do: allow a longer
    /// timeout, or shorter handlers; nothing stored is lost.
    ShutdownTimeout,
    /// The runtime's timing wheel could not be built or started while
    /// connecting (the [`TimerError`](crate::TimerError) is the cause).
    /// What to do: check the `RedwheelOptions` the message names; a failed
    /// thread start is the system's (see [`Spawn`](ErrorKind::Spawn)).
    Timer,
    /// A thread (the driver, the subscriber, the I/O thread of the async
    /// connection, a cluster refresher, the dashboard's) could not be
    /// started: the operating system refused it (the `io::Error` is the
    /// cause). What to do: raise the process's thread or memory limits.
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
