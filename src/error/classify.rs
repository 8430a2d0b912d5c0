//! How a failure of the `redis` crate becomes a redwheel [`Error`]: the
//! kind it is (a timeout after a write is `OutcomeUnknown`, after a read
//! `Unavailable`), and what a failed connect means.

use std::io;

use super::kind::ErrorKind;
use super::redwheel_error::Error;

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
        } else if server_text(&e).contains(QUEUE_FULL_TEXT) {
            (
                ErrorKind::QueueFull,
                "the queue is full (max_len); nothing was written",
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
