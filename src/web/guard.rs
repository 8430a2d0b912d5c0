//! Who may do what: the `Host` check (DNS rebinding), the same-origin
//! check of actions (cross-site requests) and the token. Pure functions of
//! the request's headers.

/// The headers the checks read.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Headers<'a> {
    pub host: Option<&'a str>,
    pub origin: Option<&'a str>,
    pub referer: Option<&'a str>,
    pub authorization: Option<&'a str>,
}

/// Why a request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// A `Host` that is not a loopback name, on a loopback listener (421).
    ForeignHost,
    /// An action that a browser marks as coming from another site (403).
    CrossSite,
    /// The dashboard is read-only (403).
    ReadOnly,
    /// No token, or a wrong one (401).
    Token,
}

impl Refusal {
    pub(crate) fn status(self) -> u16 {
        match self {
            Refusal::ForeignHost => 421,
            Refusal::CrossSite | Refusal::ReadOnly => 403,
            Refusal::Token => 401,
        }
    }

    pub(crate) fn message(self) -> &'static str {
        match self {
            Refusal::ForeignHost => {
                "this dashboard listens on loopback and answers only to a loopback host name"
            }
            Refusal::CrossSite => "refused: the request comes from another site",
            Refusal::ReadOnly => "refused: the dashboard is read-only",
            Refusal::Token => "a token is needed: send Authorization: Bearer <token>",
        }
    }
}

/// Every request: on a loopback listener, `Host` must name loopback
/// (`localhost`, `127.x.y.z`, `[::1]`), so that a page whose own host name
/// was rebound to 127.0.0.1 cannot read or act. No `Host` (HTTP/1.0, no
/// browser) is let through.
pub(crate) fn check_host(h: &Headers<'_>, loopback: bool) -> Result<(), Refusal> {
    match h.host {
        Some(host) if loopback && !is_loopback_name(host_name(host)) => Err(Refusal::ForeignHost),
        _ => Ok(()),
    }
}

/// Every action, in this order: same origin, not read-only, the token.
pub(crate) fn check_action(
    h: &Headers<'_>,
    read_only: bool,
    token: Option<&str>,
) -> Result<(), Refusal> {
    if !same_origin(h) {
        return Err(Refusal::CrossSite);
    }
    if read_only {
        return Err(Refusal::ReadOnly);
    }
    match token {
        Some(expected) if !bearer_matches(h.authorization, expected) => Err(Refusal::Token),
        _ => Ok(()),
    }
}

/// True unless the browser says the request comes from another origin:
/// `Origin` (else `Referer`) must name the host and port of `Host`.
/// Neither header (a client that is not a browser) passes; `Origin: null`
/// (a sandboxed frame, a file) does not.
fn same_origin(h: &Headers<'_>) -> bool {
    let claimed = match (h.origin, h.referer) {
        (Some(origin), _) => origin,
        (None, Some(referer)) => referer,
        (None, None) => return true,
    };
    let (Some(from), Some(host)) = (authority(claimed), h.host) else {
        return false;
    };
    from.eq_ignore_ascii_case(&strip_default_port(host, "http"))
        || from.eq_ignore_ascii_case(&strip_default_port(host, "https"))
}

/// `host[:port]` of an absolute URL, the scheme's default port left out.
fn authority(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let auth = &rest[..end];
    if auth.is_empty() || auth.contains('@') {
        return None;
    }
    Some(strip_default_port(auth, &scheme.to_ascii_lowercase()))
}

fn strip_default_port(auth: &str, scheme: &str) -> String {
    let default = match scheme {
        "http" => ":80",
        "https" => ":443",
        _ => "",
    };
    match auth.strip_suffix(default) {
        Some(bare) if !default.is_empty() => bare.to_owned(),
        _ => auth.to_owned(),
    }
}

/// The host name of a `Host` value (`name`, `name:port`, `[v6]:port`).
fn host_name(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    host.rsplit_once(':').map_or(host, |(name, _)| name)
}

fn is_loopback_name(name: &str) -> bool {
    if name.eq_ignore_ascii_case("localhost") || name.to_ascii_lowercase().ends_with(".localhost") {
        return true;
    }
    name.parse::<std::net::IpAddr>()
        .is_ok_and(|ip| ip.is_loopback())
}

/// `Authorization: Bearer <expected>`, compared in time independent of
/// where the first difference is.
fn bearer_matches(authorization: Option<&str>, expected: &str) -> bool {
    let Some(value) = authorization else {
        return false;
    };
    let Some((scheme, given)) = value.trim().split_once(' ') else {
        return false;
    };
    if !scheme.eq_ignore_ascii_case("bearer") {
        return false;
    }
    let (a, b) = (given.trim().as_bytes(), expected.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with<'a>(host: &'a str, origin: Option<&'a str>, referer: Option<&'a str>) -> Headers<'a> {
        Headers {
            host: Some(host),
            origin,
            referer,
            authorization: None,
        }
    }

    #[test]
    fn a_loopback_listener_answers_loopback_host_names_only() {
        for host in [
            "127.0.0.1:7780",
            "localhost:1",
            "LOCALHOST",
            "[::1]:80",
            "127.1.2.3",
        ] {
            assert_eq!(check_host(&with(host, None, None), true), Ok(()), "{host}");
        }
        for host in ["evil.example:7780", "10.0.0.1:7780", "[2001:db8::1]:1"] {
            assert_eq!(
                check_host(&with(host, None, None), true),
                Err(Refusal::ForeignHost),
                "{host}"
            );
            assert_eq!(check_host(&with(host, None, None), false), Ok(()));
        }
        assert_eq!(check_host(&Headers::default(), true), Ok(()));
    }

    #[test]
    fn actions_from_another_origin_are_refused() {
        let host = "127.0.0.1:7780";
        let ok = [
            (Some("http://127.0.0.1:7780"), None),
            (None, Some("http://127.0.0.1:7780/queues/x?y=1")),
            (None, None),
        ];
        for (origin, referer) in ok {
            assert_eq!(
                check_action(&with(host, origin, referer), false, None),
                Ok(())
            );
        }
        let bad = [
            (Some("http://evil.example"), None),
            (Some("http://127.0.0.1:9999"), None),
            (Some("null"), None),
            (None, Some("http://evil.example/x")),
            (Some("http://evil.example"), Some("http://127.0.0.1:7780/")),
        ];
        for (origin, referer) in bad {
            assert_eq!(
                check_action(&with(host, origin, referer), false, None),
                Err(Refusal::CrossSite),
                "{origin:?} {referer:?}"
            );
        }
        assert_eq!(
            check_action(
                &with("localhost", Some("http://localhost:80"), None),
                false,
                None
            ),
            Ok(())
        );
    }

    #[test]
    fn read_only_comes_before_the_token_and_the_token_must_match() {
        let mut h = with("localhost:1", None, None);
        assert_eq!(check_action(&h, true, None), Err(Refusal::ReadOnly));
        assert_eq!(check_action(&h, false, Some("t0k")), Err(Refusal::Token));
        for wrong in ["Bearer t0", "Bearer t0kk", "Basic t0k", "t0k", "Bearer"] {
            h.authorization = Some(wrong);
            assert_eq!(
                check_action(&h, false, Some("t0k")),
                Err(Refusal::Token),
                "{wrong}"
            );
        }
        h.authorization = Some("bearer t0k");
        assert_eq!(check_action(&h, false, Some("t0k")), Ok(()));
    }
}
