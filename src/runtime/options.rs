//! [`RedwheelOptions`]: the connection settings of a `Redwheel`, checked
//! before anything connects.

use std::fmt;
use std::time::Duration;

use crate::error::{Error, ErrorKind};

/// The longest duration any of these options takes: 24 hours. Longer
/// (up to `Duration::MAX`) is refused with `ErrorKind::InvalidOption`
/// when connecting, never taken as "forever" or left to overflow.
const MAX_OPTION_DURATION: Duration = Duration::from_secs(24 * 3600);

/// Connection settings of a [`Redwheel`].
///
/// Every duration here is at most 24 hours; a longer one (up to
/// `Duration::MAX`) makes the connect fail with
/// [`ErrorKind::InvalidOption`](crate::ErrorKind::InvalidOption).
///
/// ```
/// use std::time::Duration;
/// use redwheel::RedwheelOptions;
///
/// let options = RedwheelOptions::default()
///     .connect_timeout(Duration::from_secs(1))
///     .command_timeout(Duration::from_secs(3))
///     .max_block(Duration::from_millis(500));
/// // Checked when connecting: an out-of-range value is ErrorKind::InvalidOption.
/// # let _ = options;
/// ```
///
/// [`Redwheel`]: crate::Redwheel
#[derive(Clone)]
pub struct RedwheelOptions {
    pub(crate) connect_timeout: Duration,
    pub(crate) command_timeout: Duration,
    pub(crate) max_block: Duration,
    pub(crate) max_idle_connections: usize,
    pub(crate) clock_refresh: Duration,
    pub(crate) reconnect_min: Duration,
    pub(crate) reconnect_max: Duration,
    #[cfg(feature = "tls")]
    pub(crate) tls: Option<TlsSettings>,
}

/// Certificates for `rediss://` connections.
#[cfg(feature = "tls")]
#[derive(Clone)]
pub(crate) struct TlsSettings {
    pub(crate) root_cert: Option<Vec<u8>>,
    pub(crate) client: Option<(Vec<u8>, Vec<u8>)>,
}

impl fmt::Debug for RedwheelOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("RedwheelOptions");
        d.field("connect_timeout", &self.connect_timeout)
            .field("command_timeout", &self.command_timeout)
            .field("max_block", &self.max_block)
            .field("max_idle_connections", &self.max_idle_connections)
            .field("clock_refresh", &self.clock_refresh)
            .field(
                "reconnect_backoff",
                &(self.reconnect_min, self.reconnect_max),
            );
        #[cfg(feature = "tls")]
        d.field("tls", &self.tls.as_ref().map(|_| "<certificates>"));
        d.finish()
    }
}

impl Default for RedwheelOptions {
    fn default() -> Self {
        RedwheelOptions {
            connect_timeout: Duration::from_secs(2),
            command_timeout: Duration::from_secs(5),
            max_block: Duration::from_secs(1),
            max_idle_connections: 16,
            clock_refresh: Duration::from_secs(30),
            reconnect_min: Duration::from_millis(10),
            reconnect_max: Duration::from_millis(50),
            #[cfg(feature = "tls")]
            tls: None,
        }
    }
}

impl RedwheelOptions {
    /// How long opening a connection may take, the handshake (`AUTH`,
    /// `SELECT`, `CLIENT SETINFO`) included. Up to 24 h; default 2 s.
    pub fn connect_timeout(mut self, d: Duration) -> Self {
        self.connect_timeout = d;
        self
    }

    /// The longest a command may take, all attempts included: a call that
    /// gets no answer in this time fails with
    /// [`ErrorKind::OutcomeUnknown`] (a write that may have happened) or
    /// [`ErrorKind::Unavailable`] (a read, or nothing sent). 1 ms ..= 24 h;
    /// default 5 s.
    pub fn command_timeout(mut self, d: Duration) -> Self {
        self.command_timeout = d;
        self
    }

    /// Longest server-side block of one round of a blocking read (a
    /// consumer waiting for a message); a blocked call waits in rounds of
    /// this length, so it notices shutdown within it. 1 ms ..= 1 s; default
    /// 1 s.
    pub fn max_block(mut self, d: Duration) -> Self {
        self.max_block = d;
        self
    }

    /// Idle connections kept per pool (commands, blocking reads). Default
    /// 16.
    pub fn max_idle_connections(mut self, n: usize) -> Self {
        self.max_idle_connections = n;
        self
    }

    /// How often the `server − local` clock offset is re-estimated.
    /// Up to 24 h; default 30 s.
    pub fn clock_refresh(mut self, d: Duration) -> Self {
        self.clock_refresh = d;
        self
    }

    /// Waits between attempts to reach Redis again while it is down: from
    /// `min`, doubling up to `max`. Every background thread and blocked
    /// consumer retries on this schedule, so work resumes within about
    /// `max` of Redis being back. 1 ms <= `min` <= `max` <= 24 h; default
    /// 10 ms to 50 ms.
    pub fn reconnect_backoff(mut self, min: Duration, max: Duration) -> Self {
        self.reconnect_min = min;
        self.reconnect_max = max;
        self
    }

    /// Trusts the CA certificate(s) in `pem` (instead of the system's
    /// roots) for `rediss://` URLs.
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub fn tls_root_certificate(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls.get_or_insert_with(empty_tls).root_cert = Some(pem.into());
        self
    }

    /// Presents a client certificate (mutual TLS) on `rediss://` URLs:
    /// the certificate chain and its private key, both PEM.
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub fn tls_client_certificate(
        mut self,
        cert_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.tls.get_or_insert_with(empty_tls).client = Some((cert_pem.into(), key_pem.into()));
        self
    }

    pub(super) fn validate(&self) -> Result<(), Error> {
        let bad = |name: &str, reason: &str| {
            Err(Error::new(
                ErrorKind::InvalidOption,
                format!("invalid option `{name}`: {reason}"),
            ))
        };
        if self.connect_timeout.is_zero() || self.connect_timeout > MAX_OPTION_DURATION {
            return bad("connect_timeout", "must be within 1 ns ..= 24 h");
        }
        if self.command_timeout < Duration::from_millis(1)
            || self.command_timeout > MAX_OPTION_DURATION
        {
            return bad("command_timeout", "must be within 1 ms ..= 24 h");
        }
        if self.max_block < Duration::from_millis(1) || self.max_block > Duration::from_secs(1) {
            return bad("max_block", "must be within 1 ms ..= 1 s");
        }
        if self.clock_refresh.is_zero() || self.clock_refresh > MAX_OPTION_DURATION {
            return bad("clock_refresh", "must be within 1 ns ..= 24 h");
        }
        if self.reconnect_min < Duration::from_millis(1)
            || self.reconnect_max < self.reconnect_min
            || self.reconnect_max > MAX_OPTION_DURATION
        {
            return bad(
                "reconnect_backoff",
                "needs 1 ms <= min <= max <= 24 h (for example 10 ms, 50 ms)",
            );
        }
        Ok(())
    }
}

#[cfg(feature = "tls")]
fn empty_tls() -> TlsSettings {
    TlsSettings {
        root_cert: None,
        client: None,
    }
}
