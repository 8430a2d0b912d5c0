//! Names that become a Redis hash tag (`redwheel:{name}:…`): one rule for
//! every kind of object the runtime carries (queues, locks); and the random
//! seed behind the ids a process hands out (message ids, claim tokens, lock
//! owners).

use crate::error::{Error, ErrorKind};

/// Longest name, in bytes.
pub(crate) const MAX_TAG_NAME_LEN: usize = 200;

/// Checks a name that will sit between `{` and `}` in every key of its
/// object: non-empty, at most [`MAX_TAG_NAME_LEN`] bytes, no `{` or `}`
/// (they would end the hash tag early and scatter the keys over slots),
/// no control characters. `kind` names the object in the error ("queue",
/// "lock").
pub(crate) fn validate_tag_name(kind: &str, name: &str) -> Result<(), Error> {
    let reason = if name.is_empty() {
        "must not be empty".to_owned()
    } else if name.len() > MAX_TAG_NAME_LEN {
        format!("longer than {MAX_TAG_NAME_LEN} bytes")
    } else if name.contains(['{', '}']) {
        "must not contain `{` or `}` (they delimit the Redis hash tag)".to_owned()
    } else if name.chars().any(char::is_control) {
        "must not contain control characters".to_owned()
    } else {
        return Ok(());
    };
    Err(Error::new(
        ErrorKind::InvalidName,
        format!("invalid {kind} name {name:?}: {reason}"),
    ))
}

/// 64 random bits from the OS; without OS randomness, time and pid (still
/// distinct between processes started at different instants).
pub(crate) fn random_u64() -> u64 {
    getrandom::u64().unwrap_or_else(|_| {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        t ^ (u64::from(std::process::id()) << 32)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_would_break_the_hash_tag_are_refused_with_their_kind() {
        assert!(validate_tag_name("queue", "orders:eu").is_ok());
        assert!(validate_tag_name("queue", &"x".repeat(MAX_TAG_NAME_LEN)).is_ok());
        for bad in ["", "a{b", "a}b", "a\nb", &"x".repeat(MAX_TAG_NAME_LEN + 1)] {
            let e = validate_tag_name("lock", bad).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidName);
            assert!(e.to_string().contains("invalid lock name"), "{e}");
        }
    }
}
