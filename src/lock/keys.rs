//! A lock's names: the limit on lock names, and the Redis keys of a lock,
//! all under its `{hash tag}`.

use crate::error::Error;
use crate::runtime::{MAX_TAG_NAME_LEN, validate_tag_name};

/// Longest lock name, in bytes.
pub const MAX_NAME_LEN: usize = MAX_TAG_NAME_LEN;

/// Checks a lock name: non-empty, at most [`MAX_NAME_LEN`] bytes, no `{`
/// or `}` (they would break the `{hash tag}`), no control characters.
pub(crate) fn validate_name(name: &str) -> Result<(), Error> {
    validate_tag_name("lock", name)
}

/// The Redis keys of lock `L`; all share the hash tag `{L}`.
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    /// `redwheel:lock:{L}`: HASH owner → count, `token` → fencing token.
    pub lock: String,
    /// `redwheel:lock:{L}:fence`: the last token handed out.
    pub fence: String,
    /// `redwheel:lock:{L}:unlock`: channel, the released token.
    pub channel: String,
}

impl Keys {
    /// `redwheel:lock:{L}:released:<owner>:<token>`: the short-lived
    /// record, written by `lock_release.lua`, that `owner` released its
    /// hold `token`, so that a resent release can tell "an earlier attempt
    /// of mine released it" from "it was gone or another owner's".
    pub(crate) fn release_record(&self, owner: &str, token: u64) -> String {
        format!("{}:released:{owner}:{token}", self.lock)
    }

    pub(crate) fn new(name: &str) -> Keys {
        let lock = format!("redwheel:lock:{{{name}}}");
        Keys {
            fence: format!("{lock}:fence"),
            channel: format!("{lock}:unlock"),
            lock,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    #[test]
    fn names_that_would_break_the_hash_tag_are_rejected() {
        assert!(validate_name("inventory:42").is_ok());
        for bad in ["", "a{b", "a}b", "a\nb"] {
            let e = validate_name(bad).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidName, "{bad:?}");
            assert!(e.is_invalid_input());
        }
        assert!(validate_name(&"x".repeat(MAX_NAME_LEN + 1)).is_err());
        assert!(validate_name(&"x".repeat(MAX_NAME_LEN)).is_ok());
    }

    #[test]
    fn keys_share_the_lock_hash_tag() {
        let k = Keys::new("inventory:42");
        assert_eq!(k.lock, "redwheel:lock:{inventory:42}");
        assert_eq!(k.fence, "redwheel:lock:{inventory:42}:fence");
        assert_eq!(k.channel, "redwheel:lock:{inventory:42}:unlock");
        assert_eq!(
            k.release_record("ab:3", 17),
            "redwheel:lock:{inventory:42}:released:ab:3:17"
        );
    }
}
