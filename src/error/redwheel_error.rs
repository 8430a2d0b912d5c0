//! [`Error`]: the one error of everything Redis-backed, with its kind, the
//! queue and message it concerns, and its cause.

use std::fmt;

use super::kind::ErrorKind;
use super::reply::Reply;
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
/// connect to redis at 127.0.0.1:6379: Connection refused (os error 111)"):
/// the queue, what redwheel was doing (for a Redis reply, the script it
/// ran), what the failure means and what to do, then Redis's reply in
/// words ("queue \"orders\": while running offer.lua: one of the queue's
/// keys (`redwheel:{orders}:*`) holds a value of another type, which
/// redwheel did not write: … : redis replied \"WRONGTYPE Operation against
/// a key holding the wrong kind of value\""), or no reply where the message
/// says all of it (a full queue). So [`source`](std::error::Error::source)
/// returns nothing, and the cause is not printed twice by error reporters
/// that walk the chain; the underlying error is still reachable through
/// [`get_ref`](Error::get_ref) (a `redis::RedisError`, a codec's error, a
/// [`TimerError`] or an `io::Error`), for downcasting.
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
    /// How `Display` shows the cause.
    shown: Shown,
    /// The SHA1 of the script whose Redis error this is, until
    /// [`in_script`](Error::in_script) names it.
    script_sha: Option<String>,
    /// The script's name (`offer`, `take`…), shown as what redwheel was
    /// doing.
    script: Option<&'static str>,
    /// A key of redwheel's held a value of another type: the message says
    /// so with the queue's key names once the queue is known.
    foreign_key: bool,
}

/// How an [`Error`]'s `Display` ends.
enum Shown {
    /// With the cause's own `Display` (an I/O error, a codec's error…).
    Cause,
    /// With Redis's reply, in words ([`Reply`]'s `Display`).
    Reply(String),
    /// With nothing more: the message says in words what the reply said.
    Nothing,
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
                shown: Shown::Cause,
                script_sha: None,
                script: None,
                foreign_key: false,
            }),
        }
    }

    /// Keeps what Redis replied (shown in words in place of the cause,
    /// unless `in_words`: the message already says it) and the script it
    /// came from.
    pub(crate) fn with_reply(mut self, reply: Reply, in_words: bool) -> Error {
        self.inner.shown = if in_words {
            Shown::Nothing
        } else {
            Shown::Reply(reply.to_string())
        };
        self.inner.script_sha = reply.script_sha;
        self
    }

    /// Marks a reply saying a key of redwheel's holds another program's
    /// value (`WRONGTYPE`): the message names the queue's keys once
    /// [`in_queue`](Error::in_queue) names the queue.
    pub(crate) fn with_foreign_key(mut self) -> Error {
        self.inner.foreign_key = true;
        self.inner.message = foreign_key_text(None);
        self
    }

    /// Names the script the reply came from, as `name_of` finds it from
    /// its SHA1 (the error module knows no scripts: `scripts.rs` does).
    pub(crate) fn in_script(mut self, name_of: impl FnOnce(&str) -> Option<&'static str>) -> Error {
        if let Some(sha) = self.inner.script_sha.take() {
            self.inner.script = name_of(&sha);
        }
        self
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
            if self.inner.foreign_key {
                self.inner.message = foreign_key_text(Some(name));
            }
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

/// The message of a key of redwheel's that holds another program's value
/// (`WRONGTYPE`), with the queue's key names once the queue is known.
fn foreign_key_text(queue: Option<&str>) -> String {
    match queue {
        Some(q) => format!(
            "one of the queue's keys (`redwheel:{{{q}}}:*`) holds a value of another type, which \
             redwheel did not write: another program uses that key name; move that program's data \
             elsewhere, or use another queue name"
        ),
        None => {
            "a key of this queue or lock holds a value of another type, which redwheel did not \
                 write (a queue's keys match `redwheel:{<queue>}:*`, a lock's \
                 `redwheel:lock:{<lock>}*`): another program uses that key name; move that \
                 program's data elsewhere, or use another queue or lock name"
                .to_owned()
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(q) = &self.inner.queue {
            write!(f, "queue {q:?}: ")?;
        }
        if let Some(script) = self.inner.script {
            write!(f, "while running {script}.lua: ")?;
        }
        f.write_str(&self.inner.message)?;
        if let Some(id) = &self.inner.id {
            write!(f, " (message {id})")?;
        }
        match (&self.inner.shown, &self.inner.cause) {
            (Shown::Reply(reply), _) => write!(f, ": {reply}")?,
            (Shown::Cause, Some(cause)) => write!(f, ": {cause}")?,
            (Shown::Cause | Shown::Nothing, _) => {}
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
        if let Some(script) = self.inner.script {
            d.field("script", &script);
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
