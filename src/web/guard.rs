//! Who may do what: the `Host` check (DNS rebinding), the same-origin
//! check of actions (cross-site requests, failing closed) and the token.
//! Pure functions of the request's headers.

use std::net::IpAddr;

/// The header a script or a tool sends with an action that carries
/// neither `Origin` nor `Referer` (and no token): no form can send it, and
/// no page of another site can without a CORS preflight, which the
/// dashboard never grants.
pub(crate) const ACTION_HEADER: &str = "X-Redwheel-Action";

/// The headers the checks read.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Headers<'a> {
    pub host: Option<&'a str>,
    pub origin: Option<&'a str>,
    pub referer: Option<&'a str>,
    pub authorization: Option<&'a str>,
    /// [`ACTION_HEADER`]'s value.
    pub action: Option<&'a str>,
}

/// Why a request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// A `Host` that is neither the listening address nor an allowed name
    /// (421).
    ForeignHost,
    /// An action that a browser marks as coming from another site (403).
    CrossSite,
    /// An action with neither `Origin` nor `Referer`, nor the token, nor
    /// [`ACTION_HEADER`] (403).
    Unmarked,
    /// The dashboard is read-only (403).
    ReadOnly,
    /// No token, or a wrong one (401).
    Token,
}

impl Refusal {
    pub(crate) fn status(self) -> u16 {
        match self {
            Refusal::ForeignHost => 421,
            Refusal::CrossSite | Refusal::Unmarked | Refusal::ReadOnly => 403,
            Refusal::Token => 401,
        }
    }

    pub(crate) fn message(self) -> &'static str {
        match self {
            Refusal::ForeignHost => {
                "this dashboard does not answer to that Host: only to its listening address, \
                 loopback names on loopback, and the names allowed with --allow-host"
            }
            Refusal::CrossSite => "refused: the request comes from another site",
            Refusal::Unmarked => {
                "refused: an action with neither Origin nor Referer needs the token or the \
                 X-Redwheel-Action header"
            }
            Refusal::ReadOnly => "refused: the dashboard is read-only",
            Refusal::Token => "a token is needed: send Authorization: Bearer <token>",
        }
    }
}

/// The host names a listener answers to.
#[derive(Debug, Clone)]
pub(crate) struct Hosts {
    /// The listening address.
    pub listen: IpAddr,
    /// More names (lowercase, no trailing dot).
    pub allowed: Vec<String>,
}

impl Hosts {
    /// True if `Host: host` names this listener: an allowed name; the
    /// listening address (any address, listening on all of them; any
    /// loopback address, on loopback); a loopback name (`localhost`,
    /// `*.localhost`) on a listener that takes loopback. A name of
    /// someone else's rebound to this machine is none of these.
    fn answers(&self, host: &str) -> bool {
        let name = host_name(host).trim_end_matches('.').to_ascii_lowercase();
        if self.allowed.contains(&name) {
            return true;
        }
        let on_loopback = self.listen.is_loopback() || self.listen.is_unspecified();
        match name.parse::<IpAddr>() {
            Ok(ip) => {
                self.listen.is_unspecified()
                    || ip == self.listen
                    || (self.listen.is_loopback() && ip.is_loopback())
            }
            Err(_) => on_loopback && is_loopback_name(&name),
        }
    }
}

/// Every request: `Host` must name this listener ([`Hosts::answers`]), so
/// that a page whose own host name was rebound to this machine cannot
/// read or act. No `Host` (HTTP/1.0, no browser) is let through.
pub(crate) fn check_host(h: &Headers<'_>, hosts: &Hosts) -> Result<(), Refusal> {
    match h.host {
        Some(host) if !hosts.answers(host) => Err(Refusal::ForeignHost),
        _ => Ok(()),
    }
}

/// Every action, in this order: not from another site, not read-only,
/// the token; with no token set, a request that no browser marked as
/// same-origin must carry [`ACTION_HEADER`].
pub(crate) fn check_action(
    h: &Headers<'_>,
    read_only: bool,
    token: Option<&str>,
) -> Result<(), Refusal> {
    let same_origin = match claimed_origin(h) {
        Some(claimed) if !names_host(claimed, h.host) => return Err(Refusal::CrossSite),
        Some(_) => true,
        None => false,
    };
    if read_only {
        return Err(Refusal::ReadOnly);
    }
    match token {
        Some(expected) if !bearer_matches(h.authorization, expected) => Err(Refusal::Token),
        Some(_) => Ok(()),
        None if same_origin || h.action.is_some_and(|v| !v.is_empty()) => Ok(()),
        None => Err(Refusal::Unmarked),
    }
}

/// What the browser says the request comes from: `Origin`, else
/// `Referer`.
fn claimed_origin<'a>(h: &Headers<'a>) -> Option<&'a str> {
    h.origin.or(h.referer)
}

/// True if `claimed` (an origin or a URL) names the host and port of
/// `Host`; `Origin: null` (a sandboxed frame, a file) never does.
fn names_host(claimed: &str, host: Option<&str>) -> bool {
    let (Some(from), Some(host)) = (authority(claimed), host) else {
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
pub(crate) fn host_name(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    host.rsplit_once(':').map_or(host, |(name, _)| name)
}

/// True for a name `allow_host` takes: a DNS name (letters, digits, `-`
/// and `.`, not empty) or an address.
pub(crate) fn is_host_name(name: &str) -> bool {
    name.parse::<IpAddr>().is_ok()
        || (!name.is_empty()
            && name.len() <= 253
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.'))
}

fn is_loopback_name(name: &str) -> bool {
    name.eq_ignore_ascii_case("localhost") || name.to_ascii_lowercase().ends_with(".localhost")
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
            ..Headers::default()
        }
    }

    fn hosts(listen: &str, allowed: &[&str]) -> Hosts {
        Hosts {
            listen: listen.parse().unwrap(),
            allowed: allowed.iter().map(|a| (*a).to_owned()).collect(),
        }
    }

    #[test]
    fn a_loopback_listener_answers_loopback_host_names_only() {
        let lo = hosts("127.0.0.1", &[]);
        for host in [
            "127.0.0.1:7780",
            "localhost:1",
            "LOCALHOST",
            "dash.localhost.",
            "[::1]:80",
            "127.1.2.3",
        ] {
            assert_eq!(check_host(&with(host, None, None), &lo), Ok(()), "{host}");
        }
        for host in [
            "evil.example:7780",
            "10.0.0.1:7780",
            "[2001:db8::1]:1",
            "localhost.evil.example",
        ] {
            assert_eq!(
                check_host(&with(host, None, None), &lo),
                Err(Refusal::ForeignHost),
                "{host}"
            );
        }
        assert_eq!(check_host(&Headers::default(), &lo), Ok(()));
        let named = hosts("127.0.0.1", &["dash.example"]);
        assert_eq!(
            check_host(&with("Dash.Example:443", None, None), &named),
            Ok(())
        );
    }

    #[test]
    fn a_listener_beyond_loopback_answers_its_address_and_the_allowed_names() {
        let one = hosts("10.0.0.5", &["dash.example"]);
        for ok in ["10.0.0.5:7780", "dash.example", "DASH.example.:7780"] {
            assert_eq!(check_host(&with(ok, None, None), &one), Ok(()), "{ok}");
        }
        for bad in [
            "evil.example:7780",
            "10.0.0.6",
            "localhost",
            "127.0.0.1",
            "dash.example.evil.example",
        ] {
            assert_eq!(
                check_host(&with(bad, None, None), &one),
                Err(Refusal::ForeignHost),
                "{bad}"
            );
        }
        let all = hosts("0.0.0.0", &[]);
        for ok in ["10.0.0.6:1", "[2001:db8::1]:1", "127.0.0.1", "localhost"] {
            assert_eq!(check_host(&with(ok, None, None), &all), Ok(()), "{ok}");
        }
        assert_eq!(
            check_host(&with("evil.example", None, None), &all),
            Err(Refusal::ForeignHost)
        );
    }

    #[test]
    fn actions_from_another_origin_are_refused() {
        let host = "127.0.0.1:7780";
        let ok = [
            (Some("http://127.0.0.1:7780"), None),
            (None, Some("http://127.0.0.1:7780/queues/x?y=1")),
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
            let mut h = with(host, origin, referer);
            assert_eq!(
                check_action(&h, false, None),
                Err(Refusal::CrossSite),
                "{origin:?} {referer:?}"
            );
            // Neither the mark nor the token makes a cross-site request pass.
            h.action = Some("1");
            h.authorization = Some("Bearer t0k");
            assert_eq!(
                check_action(&h, false, Some("t0k")),
                Err(Refusal::CrossSite)
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
    fn an_action_no_browser_marked_needs_the_header_or_the_token() {
        let mut h = with("127.0.0.1:7780", None, None);
        assert_eq!(check_action(&h, false, None), Err(Refusal::Unmarked));
        h.action = Some("");
        assert_eq!(check_action(&h, false, None), Err(Refusal::Unmarked));
        h.action = Some("1");
        assert_eq!(check_action(&h, false, None), Ok(()));
        // With a token set, the token is what counts.
        assert_eq!(check_action(&h, false, Some("t0k")), Err(Refusal::Token));
        h.action = None;
        h.authorization = Some("Bearer t0k");
        assert_eq!(check_action(&h, false, Some("t0k")), Ok(()));
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
