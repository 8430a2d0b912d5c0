//! How a failure of the `redis` crate becomes a redwheel [`Error`]: the
//! kind it is (a timeout after a write is `OutcomeUnknown`, after a read
//! `Unavailable`), and what a failed connect means.

use std::io;

use std::borrow::Cow;

use super::kind::ErrorKind;
use super::redwheel_error::Error;
use super::reply::Reply;

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

/// The error text redwheel's offer scripts raise when a message would take
/// a queue past its `max_len` (followed by the counts).
pub(crate) const QUEUE_FULL_TEXT: &str = "redwheel: queue full";

/// What to do about a missing permission, at the end of each message that
/// reports one.
const GRANT: &str =
    "give the user the rules of the README's least-privilege `ACL SETUSER redwheel …` line";

impl Error {
    /// Classifies an error of a command sent to Redis.
    ///
    /// `access` says whether the command may write: a timeout or a
    /// connection lost after sending a write is
    /// [`ErrorKind::OutcomeUnknown`], after a read
    /// [`ErrorKind::Unavailable`].
    ///
    /// The message says what the failure means and what to do; Redis's
    /// reply, if there is one, follows it in words
    /// ([`Reply`]), or not at all where the message says all it said (a
    /// full queue, a due time out of range).
    pub(crate) fn from_redis(e: redis::RedisError, access: Access) -> Error {
        use redis::{ErrorKind as K, ServerErrorKind as S};
        let reply = Reply::of(&e);
        if let Some(kind) = connect_failure_kind(&e) {
            let what = match kind {
                ErrorKind::Authentication => "redis refused the credentials",
                ErrorKind::Tls => "the TLS connection to redis failed",
                ErrorKind::InvalidUrl => "the redis connection settings are invalid",
                _ => "redis is unavailable",
            };
            return Error::new(kind, what).with_cause(e).with_any_reply(reply);
        }
        let code = reply.as_ref().map(|r| r.code.as_str());
        let text = server_text(&e);
        let (kind, what): (ErrorKind, Cow<'static, str>) = if text.contains(DUE_OVERFLOW_TEXT) {
            let what = "the due time, on the redis server's clock, would be past 2^53 ms since \
                        the epoch (about year 287,396), the last a score holds exactly: nothing \
                        was written; use a shorter delay or an earlier due time";
            let e = Error::new(ErrorKind::DelayOverflow, what).with_cause(e);
            return match reply {
                Some(r) => e.with_reply(r, true),
                None => e,
            };
        } else if text.contains(QUEUE_FULL_TEXT) {
            let e = Error::new(ErrorKind::QueueFull, queue_full_text(&text)).with_cause(e);
            return match reply {
                Some(r) => e.with_reply(r, true),
                None => e,
            };
        } else if is_script_permission_error(&e) {
            (
                ErrorKind::PermissionDenied,
                format!(
                    "the redis user lacks a permission redwheel needs: a command the script runs is \
                     not in its ACL rules (`ACL LOG` on the server names it); {GRANT}"
                )
                .into(),
            )
        } else if e.is_timeout() {
            match access {
                Access::Write => (
                    ErrorKind::OutcomeUnknown,
                    "redis did not answer in time; the write may or may not have happened".into(),
                ),
                Access::Read => (
                    ErrorKind::Unavailable,
                    "redis did not answer in time".into(),
                ),
            }
        } else if e.is_connection_refusal() {
            (
                ErrorKind::Unavailable,
                "redis refused the connection".into(),
            )
        } else if e.is_io_error() || e.is_connection_dropped() {
            match access {
                Access::Write => (
                    ErrorKind::OutcomeUnknown,
                    "the connection to redis failed during a write; it may or may not have happened"
                        .into(),
                ),
                Access::Read => (ErrorKind::Unavailable, "the connection to redis failed".into()),
            }
        } else {
            match e.kind() {
                K::Server(S::BusyLoading) => (
                    ErrorKind::Unavailable,
                    "redis is loading its data (after a restart); retry shortly".into(),
                ),
                K::Server(S::TryAgain | S::MasterDown | S::ClusterDown | S::ReadOnly) => (
                    ErrorKind::Unavailable,
                    "redis is failing over; retry shortly".into(),
                ),
                K::Server(S::Moved | S::Ask) => (
                    ErrorKind::Unavailable,
                    "the slot moved to another node of the cluster; retry".into(),
                ),
                K::Server(S::NoPerm) => (ErrorKind::PermissionDenied, no_perm_text(reply.as_ref())),
                K::Server(S::NoScript) => (
                    ErrorKind::Server,
                    "redis does not know one of redwheel's scripts, and it was not loaded again \
                     (the script cache was flushed during the call?); retry the call"
                        .into(),
                ),
                _ if e.code() == Some("WRONGTYPE") || code == Some("WRONGTYPE") => {
                    let e = Error::new(ErrorKind::Protocol, "").with_cause(e);
                    return e.with_any_reply(reply).with_foreign_key();
                }
                _ if code == Some("OOM") => (
                    ErrorKind::Server,
                    "redis is out of memory: its `maxmemory` is reached, and the write was refused; \
                     free memory or raise `maxmemory` (keep `maxmemory-policy noeviction`: an \
                     eviction policy would drop redwheel's keys)"
                        .into(),
                ),
                K::Parse | K::UnexpectedReturnType => {
                    (ErrorKind::Protocol, "unexpected reply from redis".into())
                }
                K::InvalidClientConfig => (
                    ErrorKind::InvalidUrl,
                    "the redis connection settings are invalid".into(),
                ),
                _ if reply.is_some() => (
                    ErrorKind::Server,
                    "redis refused the command with an error redwheel does not expect".into(),
                ),
                _ => (ErrorKind::Server, "redis answered with an error".into()),
            }
        };
        Error::new(kind, what).with_cause(e).with_any_reply(reply)
    }

    /// Shows `reply`, if any, in place of the cause.
    fn with_any_reply(self, reply: Option<Reply>) -> Error {
        match reply {
            Some(r) => self.with_reply(r, false),
            None => self,
        }
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
                format!("the redis user at {addr} lacks a permission redwheel needs; {GRANT}")
            }
            ErrorKind::Tls => format!("the TLS handshake with redis at {addr} failed"),
            ErrorKind::Protocol => format!("the server at {addr} did not answer as redis does"),
            ErrorKind::InvalidUrl => format!("cannot connect to {addr}"),
            _ => format!("cannot connect to redis at {addr}"),
        };
        let reply = Reply::of(&e);
        Error::new(kind, message)
            .with_cause(e)
            .with_any_reply(reply)
    }
}

/// The message of a full queue, from the offer script's reply
/// (`redwheel: queue full (<len> of max_len <n>, <k> to add)`).
fn queue_full_text(reply: &str) -> String {
    let counts = reply
        .split_once("queue full (")
        .and_then(|(_, rest)| rest.split_once(')'))
        .and_then(|(inside, _)| {
            let (len, rest) = inside.split_once(" of max_len ")?;
            let (max, rest) = rest.split_once(", ")?;
            let adding = rest.strip_suffix(" to add")?;
            Some((len, max, adding))
        });
    let how_full = match counts {
        Some((len, max, adding)) => {
            format!(
                "the queue holds {len} of its max_len of {max} messages, and {adding} more would not fit"
            )
        }
        None => "the queue holds its max_len of messages".to_owned(),
    };
    format!(
        "the offer was refused: {how_full}; nothing was written: offer again once consumers have \
         caught up, or raise QueueOptions::max_len"
    )
}

/// The message of a `NOPERM` reply: a key or channel outside the user's
/// patterns, or a command outside its rules.
fn no_perm_text(reply: Option<&Reply>) -> Cow<'static, str> {
    let keys = reply.is_some_and(|r| r.says("key") || r.says("channel"));
    if keys {
        format!(
            "the redis user lacks a permission redwheel needs: it may not touch redwheel's keys or \
             channels (its rules need `~redwheel:*` and `&redwheel:*`; `ACL LOG` on the server \
             names what was refused); {GRANT}"
        )
        .into()
    } else {
        format!(
            "the redis user lacks a permission redwheel needs: a command redwheel sends is not in \
             its ACL rules (the reply names it); {GRANT}"
        )
        .into()
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
fn server_text(e: &redis::RedisError) -> Cow<'_, str> {
    match e.detail() {
        Some(d) => Cow::Borrowed(d),
        None => Cow::Owned(e.to_string()),
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
    fn the_scripts_own_replies_become_words_and_are_not_shown() {
        let reply = |text: &str| redis::make_extension_error("ERR".into(), Some(text.into()));
        let full = Error::from_redis(
            reply("redwheel: queue full (3 of max_len 3, 2 to add)"),
            Access::Write,
        );
        assert_eq!(full.kind(), ErrorKind::QueueFull);
        assert_eq!(
            full.to_string(),
            "the offer was refused: the queue holds 3 of its max_len of 3 messages, and 2 more \
             would not fit; nothing was written: offer again once consumers have caught up, or \
             raise QueueOptions::max_len"
        );
        assert!(full.redis_error().is_some(), "the reply stays reachable");
        // A reply of another shape still says what it means.
        let odd = Error::from_redis(reply("redwheel: queue full"), Access::Write);
        assert!(odd.to_string().contains("holds its max_len"), "{odd}");
        let overflow = Error::from_redis(reply("redwheel: due overflows"), Access::Write);
        assert_eq!(overflow.kind(), ErrorKind::DelayOverflow);
        assert!(!overflow.to_string().contains("redwheel:"), "{overflow}");
        assert!(overflow.to_string().contains("shorter delay"), "{overflow}");
    }

    #[test]
    fn a_reply_redwheel_does_not_expect_is_shown_in_words_after_the_message() {
        let e = Error::from_redis(
            redis::make_extension_error("WEIRD".into(), Some("something odd".into())),
            Access::Read,
        );
        assert_eq!(e.kind(), ErrorKind::Server);
        assert_eq!(
            e.to_string(),
            "redis refused the command with an error redwheel does not expect: redis replied \"WEIRD something odd\""
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
