//! One request read off a connection, within the dashboard's bounds: the
//! request line, the headers and the body each have a size limit, and
//! the whole request a deadline; a body comes with `Content-Length` only
//! (`Transfer-Encoding` is refused: no page or form of the dashboard
//! sends one, and not parsing it leaves no framing for a proxy and this
//! server to disagree on). Strict about the rest: CRLF line ends, no
//! folded header, one `Content-Length`. The parsing is pure
//! ([`parse_head`]); [`read`] adds the socket and the clock.

use std::io::{ErrorKind, Read as _, Write as _};
use std::net::TcpStream;
use std::time::Instant;

/// The longest request line (method, target, version).
pub(crate) const MAX_LINE: usize = 16 * 1024;
/// The longest head (request line and headers, with the blank line):
/// room for a browser's cookies for `localhost`, which every local
/// service shares.
pub(crate) const MAX_HEAD: usize = 64 * 1024;
/// The most header lines.
pub(crate) const MAX_HEADERS: usize = 100;
/// The longest body: an action's form fields are a few dozen bytes.
pub(crate) const MAX_BODY: u64 = 16 * 1024;

/// A request, read whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Request {
    pub method: String,
    /// The request target as sent (`/queues/a%2Fb?limit=5`).
    pub target: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Request {
    /// The first header called `name` (any case).
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Why no request came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unread {
    /// The client closed (or reset) the connection: nobody to answer.
    Closed,
    /// Refused with this status and reason; the connection is closed
    /// after the answer.
    Refused(u16, &'static str),
}

/// What the head says, before the body is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Head {
    pub method: String,
    pub target: String,
    pub headers: Vec<(String, String)>,
    pub content_length: u64,
    pub expects_continue: bool,
}

/// Where the head in `buf` ends (just past its blank line), if it is
/// all there.
fn head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4)
}

/// Reads one request from `stream`, giving up at `deadline` (408).
pub(crate) fn read(stream: &TcpStream, deadline: Instant) -> Result<Request, Unread> {
    let mut buf: Vec<u8> = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    let end = loop {
        // Where the terminator may start: the 3 bytes before the new ones
        // are searched again.
        if let Some(end) = head_end(&buf) {
            break end;
        }
        if !buf[..buf.len().min(MAX_LINE + 1)].contains(&b'\n') && buf.len() > MAX_LINE {
            return Err(Unread::Refused(414, "the request line is too long"));
        }
        if buf.len() >= MAX_HEAD {
            return Err(Unread::Refused(431, "the request's headers are too large"));
        }
        let want = chunk.len().min(MAX_HEAD - buf.len());
        let n = read_some(stream, &mut chunk[..want], deadline)?;
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = parse_head(&buf[..end])?;
    let mut body = buf.split_off(end);
    // Bytes past the announced body (a pipelined request) are dropped:
    // one request per connection.
    body.truncate(head.content_length as usize);
    let length = head.content_length as usize;
    if body.len() < length && head.expects_continue {
        let mut s = stream;
        let _ = s.write_all(b"HTTP/1.1 100 Continue\r\n\r\n");
    }
    while body.len() < length {
        let want = chunk.len().min(length - body.len());
        let n = read_some(stream, &mut chunk[..want], deadline)?;
        body.extend_from_slice(&chunk[..n]);
    }
    Ok(Request {
        method: head.method,
        target: head.target,
        headers: head.headers,
        body,
    })
}

/// At least one byte into `buf`, waiting at most until `deadline`.
fn read_some(stream: &TcpStream, buf: &mut [u8], deadline: Instant) -> Result<usize, Unread> {
    let mut s = stream;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Unread::Refused(408, "the request took too long to arrive"));
        }
        if s.set_read_timeout(Some(left)).is_err() {
            return Err(Unread::Closed);
        }
        match s.read(buf) {
            Ok(0) => return Err(Unread::Closed),
            Ok(n) => return Ok(n),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return Err(Unread::Closed),
        }
    }
}

/// `tchar` of RFC 9110: what a method or a header name is made of.
fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// The request line and headers of `head` (it ends with the blank line).
pub(crate) fn parse_head(head: &[u8]) -> Result<Head, Unread> {
    let bad = |why| Err(Unread::Refused(400, why));
    let text = head.strip_suffix(b"\r\n\r\n").unwrap_or(head);
    // A CR or LF anywhere but in a CRLF pair is refused (no bare LF line
    // ends for a proxy to read otherwise).
    let mut lines = Vec::new();
    let mut rest = text;
    loop {
        match rest.iter().position(|&b| b == b'\r' || b == b'\n') {
            None => {
                lines.push(rest);
                break;
            }
            Some(i) if rest[i] == b'\r' && rest.get(i + 1) == Some(&b'\n') => {
                lines.push(&rest[..i]);
                rest = &rest[i + 2..];
            }
            Some(_) => return bad("a bare CR or LF in the request's head"),
        }
    }
    let Some((line, fields)) = lines.split_first() else {
        return bad("no request line");
    };
    if line.len() > MAX_LINE {
        return Err(Unread::Refused(414, "the request line is too long"));
    }
    let Ok(line) = std::str::from_utf8(line) else {
        return bad("the request line is not text");
    };
    let parts: Vec<&str> = line.split(' ').collect();
    let [method, target, version] = parts.as_slice() else {
        return bad("the request line is not `METHOD TARGET HTTP/1.1`");
    };
    if !is_token(method) {
        return bad("the method is not a token");
    }
    if !target.starts_with('/') || !target.bytes().all(|b| b.is_ascii_graphic()) {
        return bad("the target must be a path (`/…`) of visible characters");
    }
    match *version {
        "HTTP/1.1" | "HTTP/1.0" => {}
        v if v.starts_with("HTTP/") => {
            return Err(Unread::Refused(
                505,
                "only HTTP/1.1 and HTTP/1.0 are spoken",
            ));
        }
        _ => return bad("the request line does not end with the HTTP version"),
    }
    if fields.len() > MAX_HEADERS {
        return Err(Unread::Refused(431, "too many headers"));
    }
    let mut headers = Vec::with_capacity(fields.len());
    for field in fields {
        if field.first().is_some_and(|b| *b == b' ' || *b == b'\t') {
            return bad("a folded header line");
        }
        let Some(colon) = field.iter().position(|&b| b == b':') else {
            return bad("a header line without a colon");
        };
        let Ok(name) = std::str::from_utf8(&field[..colon]) else {
            return bad("a header name is not text");
        };
        if !is_token(name) {
            return bad("a header name is not a token (no space before the colon)");
        }
        let value = &field[colon + 1..];
        if value.iter().any(|&b| (b < 0x20 && b != b'\t') || b == 0x7f) {
            return bad("a control character in a header value");
        }
        let value = String::from_utf8_lossy(value);
        headers.push((name.to_owned(), value.trim_matches([' ', '\t']).to_owned()));
    }
    fn named<'h>(
        headers: &'h [(String, String)],
        name: &'static str,
    ) -> impl Iterator<Item = &'h (String, String)> {
        headers
            .iter()
            .filter(move |(h, _)| h.eq_ignore_ascii_case(name))
    }
    if named(&headers, "Transfer-Encoding").next().is_some() {
        return Err(Unread::Refused(
            411,
            "a body must come with Content-Length (Transfer-Encoding is not taken)",
        ));
    }
    let lengths: Vec<&str> = named(&headers, "Content-Length")
        .map(|(_, v)| v.as_str())
        .collect();
    let content_length = match lengths.as_slice() {
        [] => 0,
        [one] if !one.is_empty() && one.bytes().all(|b| b.is_ascii_digit()) => {
            match one.parse::<u64>() {
                Ok(n) if n <= MAX_BODY => n,
                _ => return Err(Unread::Refused(413, "the body is too large")),
            }
        }
        [_] => return bad("Content-Length is not a number"),
        _ => return bad("more than one Content-Length"),
    };
    let expects_continue =
        named(&headers, "Expect").any(|(_, v)| v.eq_ignore_ascii_case("100-continue"));
    Ok(Head {
        method: (*method).to_owned(),
        target: (*target).to_owned(),
        headers,
        content_length,
        expects_continue,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(head: &str) -> u16 {
        match parse_head(head.as_bytes()) {
            Err(Unread::Refused(status, _)) => status,
            other => panic!("{head:?} was not refused: {other:?}"),
        }
    }

    #[test]
    fn a_plain_request_is_read_as_sent() {
        let h = parse_head(
            b"POST /api/queues/q/pause?x=1 HTTP/1.1\r\nHost: a:1\r\nContent-Length:  12 \r\nX-Empty:\r\n\r\n",
        )
        .unwrap();
        assert_eq!(
            (h.method.as_str(), h.target.as_str()),
            ("POST", "/api/queues/q/pause?x=1")
        );
        assert_eq!(h.content_length, 12);
        assert_eq!(
            h.headers,
            [
                ("Host".to_owned(), "a:1".to_owned()),
                ("Content-Length".to_owned(), "12".to_owned()),
                ("X-Empty".to_owned(), String::new()),
            ]
        );
        assert!(!h.expects_continue);
        let h = parse_head(b"GET / HTTP/1.0\r\n\r\n").unwrap();
        assert_eq!((h.content_length, h.headers.len()), (0, 0));
    }

    #[test]
    fn framing_that_two_parsers_could_read_differently_is_refused() {
        assert_eq!(
            refused("GET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"),
            411
        );
        assert_eq!(
            refused("GET / HTTP/1.1\r\ntransfer-encoding: identity\r\n\r\n"),
            411
        );
        assert_eq!(
            refused("POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n"),
            400
        );
        assert_eq!(
            refused("POST / HTTP/1.1\r\nContent-Length: +1\r\n\r\n"),
            400
        );
        assert_eq!(
            refused("POST / HTTP/1.1\r\nContent-Length: 1,1\r\n\r\n"),
            400
        );
        assert_eq!(refused("POST / HTTP/1.1\r\nContent-Length:\r\n\r\n"), 400);
        assert_eq!(refused("GET / HTTP/1.1\nHost: a\r\n\r\n"), 400);
        assert_eq!(refused("GET / HTTP/1.1\r\nHost: a\rX: b\r\n\r\n"), 400);
        assert_eq!(refused("GET / HTTP/1.1\r\nHost: a\r\n folded\r\n\r\n"), 400);
        assert_eq!(refused("GET / HTTP/1.1\r\nHost : a\r\n\r\n"), 400);
        assert_eq!(refused("GET / HTTP/1.1\r\nX: a\0b\r\n\r\n"), 400);
        assert_eq!(refused("GET /  HTTP/1.1\r\n\r\n"), 400);
        assert_eq!(refused("GET http://a/ HTTP/1.1\r\n\r\n"), 400);
        assert_eq!(refused("GET / HTTP/2.0\r\n\r\n"), 505);
    }

    #[test]
    fn sizes_past_the_bounds_are_refused() {
        for length in [
            "16385",
            "4611686018427387904",
            "18446744073709551615",
            "99999999999999999999999",
        ] {
            assert_eq!(
                refused(&format!(
                    "POST / HTTP/1.1\r\nContent-Length: {length}\r\n\r\n"
                )),
                413
            );
        }
        assert_eq!(
            parse_head(b"POST / HTTP/1.1\r\nContent-Length: 16384\r\n\r\n")
                .unwrap()
                .content_length,
            MAX_BODY
        );
        let many: String = (0..=MAX_HEADERS).map(|i| format!("X-{i}: v\r\n")).collect();
        assert_eq!(refused(&format!("GET / HTTP/1.1\r\n{many}\r\n")), 431);
        assert_eq!(
            refused(&format!("GET /{} HTTP/1.1\r\n\r\n", "a".repeat(MAX_LINE))),
            414
        );
    }

    proptest::proptest! {
        /// Whatever the bytes, parsing answers (a head or a refusal) and
        /// never panics; a head it takes has a body within the bound.
        #[test]
        fn any_bytes_are_parsed_or_refused(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
            if let Ok(h) = parse_head(&bytes) {
                proptest::prop_assert!(h.content_length <= MAX_BODY);
                proptest::prop_assert!(h.target.starts_with('/'));
            }
        }
    }
}
