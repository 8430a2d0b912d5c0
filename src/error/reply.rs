//! What Redis replied, as a user reads it: the error code and text of a
//! server error (the first one of a failed pipeline), without the location
//! Redis appends to an error raised inside a script (`script: <sha1>, on
//! @user_script:<line>.`), whose SHA1 is kept apart: the queue layer names
//! the script from it ([`Error::in_script`](super::Error::in_script)).

use std::fmt;

/// One error reply of Redis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Reply {
    /// The error code: `ERR`, `WRONGTYPE`, `NOPERM`, `OOM`…
    pub code: String,
    /// The text after the code, without the script location.
    pub text: String,
    /// The SHA1 of the script that raised it, when a script did.
    pub script_sha: Option<String>,
}

impl Reply {
    /// The reply behind `e`: its own server error, or the first of a
    /// failed pipeline's; `None` for an error that is no reply (I/O, a
    /// parse error, a client-side failure).
    pub(crate) fn of(e: &redis::RedisError) -> Option<Reply> {
        let errors = e.clone().into_server_errors()?;
        let (_, first) = errors.first()?;
        let (text, script_sha) = split_location(first.details().unwrap_or_default());
        Some(Reply {
            code: first.code().to_owned(),
            text: text.to_owned(),
            script_sha: script_sha.map(str::to_owned),
        })
    }

    /// True when the code or the text is `pattern`'s (case-sensitive).
    pub(crate) fn says(&self, pattern: &str) -> bool {
        self.code == pattern || self.text.contains(pattern)
    }
}

impl fmt::Display for Reply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.text.is_empty() {
            write!(f, "redis replied \"{}\"", self.code)
        } else {
            write!(f, "redis replied \"{} {}\"", self.code, self.text)
        }
    }
}

/// Splits `detail` into its text and the SHA1 of the script Redis says it
/// came from (`… script: <40 hex digits>, on @user_script:<line>.`).
fn split_location(detail: &str) -> (&str, Option<&str>) {
    const MARK: &str = " script: ";
    let Some(at) = detail.rfind(MARK) else {
        return (detail, None);
    };
    let rest = &detail[at + MARK.len()..];
    let sha = rest.split(',').next().unwrap_or_default();
    let is_sha = sha.len() == 40 && sha.bytes().all(|b| b.is_ascii_hexdigit());
    if !is_sha || !rest.contains("@user_script") {
        return (detail, None);
    }
    (detail[..at].trim_end(), Some(sha))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHA: &str = "b6678e2d9e2078daa7a7bd9571dfd47ef31f814b";

    #[test]
    fn the_script_location_is_split_off_and_its_sha_kept() {
        let detail = format!(
            "Operation against a key holding the wrong kind of value script: {SHA}, on @user_script:105."
        );
        assert_eq!(
            split_location(&detail),
            (
                "Operation against a key holding the wrong kind of value",
                Some(SHA)
            )
        );
        // Text that only looks like it is kept whole.
        let plain = "no permission script: yes, on @user_script:1.";
        assert_eq!(split_location(plain), (plain, None));
        assert_eq!(split_location("queue full"), ("queue full", None));
    }

    #[test]
    fn a_reply_is_read_from_a_server_error_but_not_from_an_io_error() {
        let err = redis::make_extension_error(
            "WRONGTYPE".into(),
            Some(format!(
                "Operation against a key holding the wrong kind of value script: {SHA}, on @user_script:7."
            )),
        );
        let reply = Reply::of(&err).unwrap();
        assert_eq!(reply.code, "WRONGTYPE");
        assert_eq!(reply.script_sha.as_deref(), Some(SHA));
        assert_eq!(
            reply.to_string(),
            "redis replied \"WRONGTYPE Operation against a key holding the wrong kind of value\""
        );
        let io = redis::RedisError::from(std::io::Error::other("reset"));
        assert_eq!(Reply::of(&io), None);
    }
}
