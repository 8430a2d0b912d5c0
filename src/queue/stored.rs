//! The stored value of a message, `"<due ms>:<payload>"` in the `msg`
//! hash: the one reader of that layout.

use super::codec::{Codec, CodecError};

/// A stored value, `"<due ms>:<payload>"`, decoded: (due, payload).
pub(crate) fn parse_stored<T: Codec>(value: &[u8]) -> Result<(u64, T), CodecError> {
    match split_stored(value) {
        (Some(due), bytes) => T::decode(bytes).map(|p| (due, p)),
        (None, _) => Err("stored value is not \"<due ms>:<payload>\"".into()),
    }
}

/// A stored value `"<due ms>:<payload>"` split into its due time (`None`
/// if malformed) and payload bytes (the whole value if malformed): the one
/// reader of the `msg` layout.
pub(crate) fn split_stored(value: &[u8]) -> (Option<u64>, &[u8]) {
    value
        .iter()
        .position(|&b| b == b':')
        .and_then(|i| {
            let due = std::str::from_utf8(&value[..i]).ok()?.parse::<u64>().ok()?;
            Some((Some(due), &value[i + 1..]))
        })
        .unwrap_or((None, value))
}
