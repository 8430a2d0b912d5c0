//! A queue's names: the limits on queue names and message ids, and the
//! Redis keys of a queue, all under its `{hash tag}`.

use crate::error::Error;
use crate::runtime::{MAX_TAG_NAME_LEN, validate_tag_name};

/// Longest queue name, in bytes.
pub const MAX_NAME_LEN: usize = MAX_TAG_NAME_LEN;

/// Longest message id `remove` accepts, in bytes (redwheel's own are
/// about 14).
pub const MAX_ID_LEN: usize = 128;

/// Checks a queue name: non-empty, at most [`MAX_NAME_LEN`] bytes, no `{`
/// or `}` (they would break the `{hash tag}`), no control characters.
pub(crate) fn validate_name(name: &str) -> Result<(), Error> {
    validate_tag_name("queue", name)
}

/// The Redis keys of one queue; all share the hash tag `{N}`.
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    pub delayed: String,
    pub msg: String,
    pub ready: String,
    pub dead: String,
    pub wake: String,
    pub inflight: String,
    pub lease: String,
    pub attempts: String,
    pub reason: String,
    /// HASH: `delivered` → messages handed out by take and claim so far.
    pub counts: String,
    /// HASH: id → entries of `ready` left by a removed message (skipped,
    /// not delivered, by take and claim).
    pub stale: String,
    /// `redwheel:{N}:reply:`, the start of the reply records of take and
    /// claim requests (`queue/request.rs`).
    reply_prefix: String,
}

impl Keys {
    pub(crate) fn new(name: &str) -> Keys {
        let k = |suffix: &str| format!("redwheel:{{{name}}}:{suffix}");
        Keys {
            delayed: k("delayed"),
            msg: k("msg"),
            ready: k("ready"),
            dead: k("dead"),
            wake: k("wake"),
            inflight: k("inflight"),
            lease: k("lease"),
            attempts: k("attempts"),
            reason: k("reason"),
            counts: k("counts"),
            stale: k("stale"),
            reply_prefix: k("reply:"),
        }
    }

    /// The reply record of request slot `slot` of process `process`
    /// (HASH, with a TTL): `redwheel:{N}:reply:<process>.<slot>`.
    pub(crate) fn reply(&self, process: &str, slot: u64) -> String {
        format!("{}{process}.{slot}", self.reply_prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_would_break_the_hash_tag_are_rejected() {
        assert!(validate_name("orders").is_ok());
        assert!(validate_name("").is_err());
        assert!(validate_name("a{b").is_err());
        assert!(validate_name("a}b").is_err());
        assert!(validate_name("a\nb").is_err());
        assert!(validate_name(&"x".repeat(MAX_NAME_LEN + 1)).is_err());
        assert!(validate_name(&"x".repeat(MAX_NAME_LEN)).is_ok());
    }

    #[test]
    fn keys_share_the_queue_hash_tag() {
        let k = Keys::new("orders");
        assert_eq!(k.delayed, "redwheel:{orders}:delayed");
        assert_eq!(k.msg, "redwheel:{orders}:msg");
        assert_eq!(k.ready, "redwheel:{orders}:ready");
        assert_eq!(k.wake, "redwheel:{orders}:wake");
        assert_eq!(k.reply("p", 7), "redwheel:{orders}:reply:p.7");
    }
}
