//! What a consumer is handed by `take` and `poll`: a [`Message`], named by
//! its [`MessageId`].

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The id of a message, unique across processes; returned by `offer`,
/// accepted by [`Queue::remove`], or chosen by the caller with
/// [`Queue::offer_with_id`].
///
/// ```
/// use redwheel::MessageId;
///
/// let id = MessageId::from("order-42");      // an id of yours, for offer_with_id
/// assert_eq!(id.as_str(), "order-42");
/// let stored: String = id.into_string();     // keep it to remove the message later
/// # let _ = stored;
/// ```
///
/// [`Queue::offer_with_id`]: crate::Queue::offer_with_id
/// [`Queue::remove`]: crate::Queue::remove
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MessageId(pub(crate) String);

impl MessageId {
    /// The id as stored in Redis.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The id as an owned string.
    pub fn into_string(self) -> String {
        self.0
    }
}

impl fmt::Display for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<String> for MessageId {
    /// Wraps an id kept elsewhere (a database row); `remove` and
    /// `offer_with_id` check it.
    fn from(s: String) -> Self {
        MessageId(s)
    }
}

impl From<&str> for MessageId {
    fn from(s: &str) -> Self {
        MessageId(s.to_owned())
    }
}

impl AsRef<str> for MessageId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// A message handed to a consumer by [`Queue::take`] or [`Queue::poll`].
///
/// [`Queue::poll`]: crate::Queue::poll
/// [`Queue::take`]: crate::Queue::take
#[derive(Debug, Clone)]
pub struct Message<T> {
    pub(super) id: MessageId,
    pub(super) payload: T,
    pub(super) due_ms: u64,
}

impl<T> Message<T> {
    /// The message's id (as returned by `offer`).
    pub fn id(&self) -> &MessageId {
        &self.id
    }

    /// The payload.
    pub fn payload(&self) -> &T {
        &self.payload
    }

    /// The payload, by value.
    pub fn into_payload(self) -> T {
        self.payload
    }

    /// When the message fell due, on the Redis server's clock.
    pub fn due(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(self.due_ms)
    }

    /// When the message fell due, in ms since the Unix epoch (Redis clock).
    pub fn due_ms(&self) -> u64 {
        self.due_ms
    }
}
