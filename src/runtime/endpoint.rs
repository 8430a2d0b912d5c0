//! Where connections go: an [`Endpoint`] is one server's URL, parsed once,
//! with its TLS settings, and opens connections to it (RESP2 for commands,
//! RESP3 for pub/sub) within the connect timeout.

use std::time::Duration;

use redis::Client;

use super::conn::{Conn, MIN_WAIT, set_timeouts};
use super::options::RedwheelOptions;
use crate::error::{Error, ErrorKind};

/// Where connections go, and how they are opened.
pub(crate) struct Endpoint {
    client: Client,
    /// The same, speaking RESP3 (pub/sub messages arrive as pushes).
    resp3: Client,
    /// `host:port`, with " (TLS)" for TLS (never the password), for messages.
    addr: String,
    /// `host:port`.
    host_port: String,
    connect_timeout: Duration,
    /// How many replies the `redis` crate reads while it sets up a
    /// connection of `client` and of `resp3` (see [`setup_reads`]).
    setup_reads: (u32, u32),
}

/// How many replies the `redis` crate's connect reads after the TCP
/// connect (`HELLO` or `AUTH`, `SELECT`, two `CLIENT SETINFO`): it reads
/// every one of them, each within what is left of the connect timeout,
/// even after one timed out, so a server that accepts connections and
/// never answers (a frozen one) holds a connect up for this many times
/// that. Dividing the timeout by it makes the connect end within it.
fn setup_reads(info: &redis::RedisConnectionInfo) -> u32 {
    let auth = info.protocol() != redis::ProtocolVersion::RESP2 || info.password().is_some();
    let select = info.db() != 0;
    let setinfo = if info.skip_set_lib_name() { 0 } else { 2 };
    (u32::from(auth) + u32::from(select) + setinfo).max(1)
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

/// `url` with any password replaced by `***`, for messages.
pub(crate) fn redact(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return url.to_owned();
    };
    let Some(at) = url[scheme_end..].rfind('@').map(|i| i + scheme_end) else {
        return url.to_owned();
    };
    let userinfo = &url[scheme_end..at];
    let user = userinfo.split(':').next().unwrap_or("");
    let hidden = if userinfo.contains(':') {
        format!("{user}:***")
    } else {
        "***".to_owned()
    };
    format!("{}{hidden}{}", &url[..scheme_end], &url[at..])
}

impl Endpoint {
    /// Parses `url` (`redis://[user:password@]host:port[/db]`, or
    /// `rediss://…` with the `tls` feature).
    pub(crate) fn new(url: &str, options: &RedwheelOptions) -> Result<Endpoint, Error> {
        let invalid = |e: redis::RedisError| {
            Error::new(
                ErrorKind::InvalidUrl,
                format!("invalid redis URL {:?}", redact(url)),
            )
            .with_cause(e)
        };
        let is_tls = url.starts_with("rediss://");
        if is_tls && !cfg!(feature = "tls") {
            return Err(Error::new(
                ErrorKind::InvalidUrl,
                format!(
                    "{:?} asks for TLS, which needs redwheel's `tls` feature",
                    redact(url)
                ),
            ));
        }
        let client = if is_tls {
            tls_client(url, options).map_err(invalid)?
        } else {
            Client::open(url).map_err(invalid)?
        };
        let (host_port, addr) = match client.get_connection_info().addr() {
            redis::ConnectionAddr::Tcp(host, port) => {
                (format!("{host}:{port}"), format!("{host}:{port}"))
            }
            redis::ConnectionAddr::TcpTls { host, port, .. } => {
                (format!("{host}:{port}"), format!("{host}:{port} (TLS)"))
            }
            redis::ConnectionAddr::Unix(path) => {
                (path.display().to_string(), path.display().to_string())
            }
            other => (format!("{other:?}"), format!("{other:?}")),
        };
        let info = client.get_connection_info().clone();
        let settings = info
            .redis_settings()
            .clone()
            .set_protocol(redis::ProtocolVersion::RESP3);
        let resp3 = Client::open(info.set_redis_settings(settings)).map_err(invalid)?;
        let setup_reads = (
            setup_reads(client.get_connection_info().redis_settings()),
            setup_reads(resp3.get_connection_info().redis_settings()),
        );
        Ok(Endpoint {
            client,
            resp3,
            addr,
            host_port,
            connect_timeout: options.connect_timeout,
            setup_reads,
        })
    }

    /// `host:port` of the server, for messages.
    pub(crate) fn addr(&self) -> &str {
        &self.addr
    }

    /// `host:port` of the server.
    pub(crate) fn host_port(&self) -> &str {
        &self.host_port
    }

    /// The timeout to give the `redis` crate's connect so that the whole
    /// of it, handshake included, takes at most `within` (and the
    /// option's connect timeout).
    fn connect_within(&self, within: Duration, setup_reads: u32) -> Duration {
        (within.min(self.connect_timeout) / setup_reads).max(MIN_WAIT)
    }

    /// Opens a raw connection whose reads and writes time out after
    /// `io_timeout`; the connect itself, handshake included, takes at most
    /// `connect_timeout`.
    pub(crate) fn open_raw(
        &self,
        connect_timeout: Duration,
        io_timeout: Duration,
    ) -> Result<redis::Connection, Error> {
        let con = self
            .client
            .get_connection_with_timeout(self.connect_within(connect_timeout, self.setup_reads.0))
            .map_err(|e| Error::connect(e, &self.addr))?;
        set_timeouts(&con, io_timeout).map_err(|e| Error::connect(e, &self.addr))?;
        Ok(con)
    }

    /// Opens a RESP3 connection for pub/sub (messages arrive as pushes),
    /// whose reads and writes time out after `io_timeout`.
    pub(crate) fn open_resp3(
        &self,
        connect_timeout: Duration,
        io_timeout: Duration,
    ) -> Result<redis::Connection, Error> {
        let con = self
            .resp3
            .get_connection_with_timeout(self.connect_within(connect_timeout, self.setup_reads.1))
            .map_err(|e| Error::connect(e, &self.addr))?;
        set_timeouts(&con, io_timeout).map_err(|e| Error::connect(e, &self.addr))?;
        Ok(con)
    }

    /// Opens a connection whose reads and writes time out after
    /// `io_timeout`.
    pub(crate) fn open(&self, io_timeout: Duration) -> Result<Conn, Error> {
        self.open_raw(self.connect_timeout, io_timeout)
            .map(Conn::Node)
    }
}

#[cfg(feature = "tls")]
fn tls_client(url: &str, options: &RedwheelOptions) -> redis::RedisResult<Client> {
    // rustls needs a process-wide crypto provider; install ring's unless the
    // application installed one already.
    let _ = rustls::crypto::ring::default_provider().install_default();
    match &options.tls {
        Some(tls) => Client::build_with_tls(
            url,
            redis::TlsCertificates {
                client_tls: tls.client.clone().map(|(client_cert, client_key)| {
                    redis::ClientTlsConfig {
                        client_cert,
                        client_key,
                    }
                }),
                root_cert: tls.root_cert.clone(),
            },
        ),
        None => Client::open(url),
    }
}

#[cfg(not(feature = "tls"))]
fn tls_client(url: &str, _options: &RedwheelOptions) -> redis::RedisResult<Client> {
    Client::open(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_reach_messages() {
        assert_eq!(
            redact("redis://app:s3cret@db:6379/0"),
            "redis://app:***@db:6379/0"
        );
        assert_eq!(redact("redis://:s3cret@db"), "redis://:***@db");
        assert_eq!(redact("redis://db:6379"), "redis://db:6379");
        assert_eq!(redact("not a url"), "not a url");
    }

    #[test]
    fn a_bad_url_is_invalid_input_naming_the_url_without_its_password() {
        let e =
            Endpoint::new("redis://u:pw@host:notaport", &RedwheelOptions::default()).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidUrl);
        assert!(e.is_invalid_input());
        let text = e.to_string();
        assert!(text.contains("invalid redis URL"), "{text}");
        assert!(!text.contains("pw"), "{text}");
    }
}
