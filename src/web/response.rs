//! A response as the dashboard sends it: a status, a body of known length
//! (`Content-Length`, never chunked), the security headers every answer
//! carries, and `Connection: close` (one request per connection). Written
//! within a deadline; the connection is then closed gently (its sending
//! half first, the client's last bytes read and dropped, for a bounded
//! time) so that a client still sending does not lose its answer to a
//! reset.

use std::io::{ErrorKind, Read as _, Write as _};
use std::net::{Shutdown, TcpStream};
use std::time::{Duration, Instant};

use serde_json::Value;

/// Only the dashboard's own script and style; no inline script, no frame,
/// nothing from elsewhere.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
                   connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// How long a closing connection is read from, and how much of it, at
/// most.
const LINGER: Duration = Duration::from_secs(1);
const LINGER_BYTES: usize = 64 * 1024;

/// A response before it is encoded.
#[derive(Debug, Clone)]
pub(crate) struct Reply {
    pub status: u16,
    pub content_type: &'static str,
    pub body: Vec<u8>,
    pub extra: Vec<(&'static str, String)>,
}

impl Reply {
    pub(crate) fn html(status: u16, body: String) -> Reply {
        Reply {
            status,
            content_type: "text/html; charset=utf-8",
            body: body.into_bytes(),
            extra: Vec::new(),
        }
    }

    pub(crate) fn json(status: u16, v: &Value) -> Reply {
        Reply {
            status,
            content_type: "application/json",
            body: serde_json::to_vec(v).unwrap_or_default(),
            extra: Vec::new(),
        }
    }

    /// The status line, the headers and the body, as sent.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut head = format!(
            "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\
             Cache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\nX-Frame-Options: DENY\r\n\
             Referrer-Policy: same-origin\r\nContent-Security-Policy: {CSP}\r\n",
            self.status,
            reason(self.status),
            self.content_type,
            self.body.len(),
        );
        for (name, value) in &self.extra {
            // A value is ours; one with a line break would split the head.
            if !value.contains(['\r', '\n']) {
                head.push_str(&format!("{name}: {value}\r\n"));
            }
        }
        head.push_str("\r\n");
        let mut out = head.into_bytes();
        out.extend_from_slice(&self.body);
        out
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        303 => "See Other",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        411 => "Length Required",
        413 => "Content Too Large",
        414 => "URI Too Long",
        421 => "Misdirected Request",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        505 => "HTTP Version Not Supported",
        _ => "",
    }
}

/// Writes `bytes` to `stream`, giving up at `deadline`.
pub(crate) fn write_all(
    stream: &TcpStream,
    bytes: &[u8],
    deadline: Instant,
) -> std::io::Result<()> {
    let mut s = stream;
    let mut rest = bytes;
    while !rest.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ErrorKind::TimedOut.into());
        }
        s.set_write_timeout(Some(left))?;
        match s.write(&rest[..rest.len().min(64 * 1024)]) {
            Ok(0) => return Err(ErrorKind::WriteZero.into()),
            Ok(n) => rest = &rest[n..],
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                ) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Ends the connection: no more from this side, then what the client
/// still sends is read and dropped until it closes, for at most
/// [`LINGER`] and [`LINGER_BYTES`].
pub(crate) fn close(stream: &TcpStream) {
    let _ = stream.shutdown(Shutdown::Write);
    let deadline = Instant::now() + LINGER;
    let mut s = stream;
    let mut buf = [0u8; 4096];
    let mut drained = 0;
    while drained < LINGER_BYTES {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || s.set_read_timeout(Some(left)).is_err() {
            break;
        }
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => drained += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_has_its_length_the_security_headers_and_closes() {
        let mut r = Reply::json(421, &serde_json::json!({"ok": false}));
        r.extra.push(("Allow", "GET".to_owned()));
        r.extra.push(("X-Split", "a\r\nSet-Cookie: x".to_owned()));
        let text = String::from_utf8(r.encode()).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(
            head.starts_with("HTTP/1.1 421 Misdirected Request\r\n"),
            "{head}"
        );
        for h in [
            "Content-Length: 12",
            "Connection: close",
            "Content-Type: application/json",
            "X-Content-Type-Options: nosniff",
            "Allow: GET",
            "Content-Security-Policy: default-src 'none'",
        ] {
            assert!(head.contains(h), "{h} missing in {head}");
        }
        assert!(!head.contains("Set-Cookie"));
        assert_eq!(body, r#"{"ok":false}"#);
    }
}
