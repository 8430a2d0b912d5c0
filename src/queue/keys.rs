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
    /// HASH: the queue's controls (pause, rate limit, max in flight, max
    /// length) and the flags the scripts keep (priorities or ttls in use,
    /// a claim waiting for an in-flight slot).
    pub controls: String,
    /// ZSET: due messages of priority 1 ..= 9, by band and due time.
    pub prioritized: String,
    /// HASH: id → priority (1 ..= 9; absent for 0).
    pub priority: String,
    /// ZSET: id → the time by which it must be handed out (due + ttl),
    /// for messages with a ttl not yet handed out.
    pub expires: String,
    /// HASH: dedup key → id of the message now offered under it, where
    /// the id is not the key itself (a debounced message's successor).
    pub dedup: String,
    /// ZSET: the deliveries of the last rate-limit window (the sliding log).
    pub rate: String,
    /// `redwheel:{N}:throttle:`, followed by a dedup key: a STRING that
    /// lives for a throttle window after an offer under that key.
    throttle_prefix: String,
    /// `redwheel:{N}:reply:`, the start of the reply records of take and
    /// claim requests (`queue/request.rs`).
    reply_prefix: String,
    /// HASH: `due`, a lower bound of every score in `delayed` and
    /// `inflight` (`lua/head.lua`); `schedules`, the schedules' version and
    /// earliest next occurrence (`lua/schedule_lib.lua`). The guard
    /// sweep's probe reads both.
    pub head: String,
    /// The queue's recurring schedules (`lua/schedule_lib.lua` says what
    /// each holds): definitions, payloads, next occurrences, last fired,
    /// changes by version, occurrences offered ahead.
    pub schedules: String,
    pub schedules_payload: String,
    pub schedules_next: String,
    pub schedules_last: String,
    pub schedules_changes: String,
    pub schedules_ahead: String,
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
            controls: k("controls"),
            prioritized: k("prioritized"),
            priority: k("priority"),
            expires: k("expires"),
            dedup: k("dedup"),
            rate: k("rate"),
            throttle_prefix: k("throttle:"),
            reply_prefix: k("reply:"),
            head: k("head"),
            schedules: k("schedules"),
            schedules_payload: k("schedules:payload"),
            schedules_next: k("schedules:next"),
            schedules_last: k("schedules:last"),
            schedules_changes: k("schedules:changes"),
            schedules_ahead: k("schedules:ahead"),
        }
    }

    /// The throttle marker of dedup key `key`.
    pub(crate) fn throttle(&self, key: &str) -> String {
        let mut s = String::with_capacity(self.throttle_prefix.len() + key.len());
        s.push_str(&self.throttle_prefix);
        s.push_str(key);
        s
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
        assert_eq!(k.controls, "redwheel:{orders}:controls");
        assert_eq!(k.throttle("a:b"), "redwheel:{orders}:throttle:a:b");
        assert_eq!(k.reply("p", 7), "redwheel:{orders}:reply:p.7");
    }
}
