//! Every Lua script of redwheel, built once.
//!
//! Each script lives in `lua/` with a header naming its KEYS, ARGV, reply and
//! the invariant it keeps. [`redis::Script`] hashes the source once; `invoke`
//! runs EVALSHA and, on `NOSCRIPT` (a restarted or flushed server), loads
//! the script and retries.

use std::sync::LazyLock;

use redis::Script;

/// `lua/offer.lua`: one delayed message (after `lua/head.lua`, as every
/// script that adds a due time or a deadline, and `lua/offer_lib.lua`, as
/// every offer).
pub(crate) static OFFER: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("../lua/head.lua"),
        include_str!("../lua/offer_lib.lua"),
        include_str!("../lua/offer.lua")
    ))
});

/// `lua/offer_with.lua`: one message with options (dedup, priority, ttl;
/// after `lua/head.lua` and `lua/offer_lib.lua`).
pub(crate) static OFFER_WITH: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("../lua/head.lua"),
        include_str!("../lua/offer_lib.lua"),
        include_str!("../lua/offer_with.lua")
    ))
});

/// `lua/controls.lua`: sets or lifts a queue's controls.
pub(crate) static CONTROLS: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/controls.lua")));

/// `lua/offer_batch.lua`: up to [`BATCH_OFFER_MAX`] delayed messages
/// (after `lua/head.lua` and `lua/offer_lib.lua`).
pub(crate) static OFFER_BATCH: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("../lua/head.lua"),
        include_str!("../lua/offer_lib.lua"),
        include_str!("../lua/offer_batch.lua")
    ))
});

/// `lua/transfer.lua`: moves due ids from `delayed` to `ready` (after
/// `lua/lifecycle.lua`).
pub(crate) static TRANSFER: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("../lua/lifecycle.lua"),
        include_str!("../lua/transfer.lua")
    ))
});

/// `lua/remove.lua`: cancels a message by id.
pub(crate) static REMOVE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/remove.lua")));

/// `lua/clear.lua`: deletes every message of a queue.
pub(crate) static CLEAR: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/clear.lua")));

/// `lua/take.lua`: hands the first ready message to one consumer (after
/// `lua/lifecycle.lua` and `lua/ready_pop.lua`, which it shares with claim).
pub(crate) static TAKE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("../lua/lifecycle.lua"),
        include_str!("../lua/ready_pop.lua"),
        include_str!("../lua/take.lua")
    ))
});

/// `lua/give_back.lua`: puts a message a dropped async take was handed back
/// at the head of the ready list.
#[cfg(feature = "async")]
pub(crate) static GIVE_BACK: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/give_back.lua")));

/// `lua/park.lua`: parks an undecodable message as a dead letter.
pub(crate) static PARK: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/park.lua")));

/// `lua/claim.lua`: claims ready messages under a visibility deadline
/// (after `lua/head.lua`, `lua/lifecycle.lua` and `lua/ready_pop.lua`,
/// which it shares with take).
pub(crate) static CLAIM: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("../lua/head.lua"),
        include_str!("../lua/lifecycle.lua"),
        include_str!("../lua/ready_pop.lua"),
        include_str!("../lua/claim.lua")
    ))
});

/// `lua/claim_ahead.lua`: claims delayed messages shortly before they fall
/// due, checks the server's clock and the controls before a hand-out, or
/// gives such claims back (after `lua/head.lua`, `lua/lifecycle.lua`, for
/// the freed in-flight slot, and `lua/ready_pop.lua`, for its reply
/// records).
pub(crate) static CLAIM_AHEAD: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("../lua/head.lua"),
        include_str!("../lua/lifecycle.lua"),
        include_str!("../lua/ready_pop.lua"),
        include_str!("../lua/claim_ahead.lua")
    ))
});

/// `lua/ack.lua`: deletes a claimed message (after `lua/lifecycle.lua`).
pub(crate) static ACK: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("../lua/lifecycle.lua"),
        include_str!("../lua/ack.lua")
    ))
});

/// `lua/nack.lua`: gives a claimed message back (or to the dead letters;
/// after `lua/head.lua` and `lua/lifecycle.lua`).
pub(crate) static NACK: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("../lua/head.lua"),
        include_str!("../lua/lifecycle.lua"),
        include_str!("../lua/nack.lua")
    ))
});

/// `lua/extend.lua`: moves a claim's visibility deadline (after
/// `lua/head.lua`).
pub(crate) static EXTEND: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("../lua/head.lua"),
        include_str!("../lua/extend.lua")
    ))
});

/// `lua/dead.lua`: reads dead letters.
pub(crate) static DEAD: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/dead.lua")));

/// `lua/requeue_dead.lua`: gives dead letters a fresh start.
pub(crate) static REQUEUE_DEAD: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/requeue_dead.lua")));

/// `lua/stats.lua`: a queue's counts in one atomic read (after
/// `lua/lifecycle.lua`, for the priority bands).
pub(crate) static STATS: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("../lua/lifecycle.lua"),
        include_str!("../lua/stats.lua")
    ))
});

/// `lua/len.lua`: counts the waiting messages.
pub(crate) static LEN: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/len.lua")));

/// `lua/lock_acquire.lua`: takes or re-enters a lock, with a fencing token.
pub(crate) static LOCK_ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/lock_acquire.lua")));

/// `lua/lock_release.lua`: one unlock by the owner of one hold.
pub(crate) static LOCK_RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/lock_release.lua")));

/// `lua/lock_renew.lua`: the watchdog's renewal of one hold.
pub(crate) static LOCK_RENEW: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/lock_renew.lua")));

/// `lua/lock_force_release.lua`: releases a lock whoever holds it.
pub(crate) static LOCK_FORCE_RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/lock_force_release.lua")));

/// `lua/schedule_set.lua`: creates or replaces a schedule (after
/// `lua/schedule_lib.lua`, as every schedule script).
pub(crate) static SCHEDULE_SET: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("../lua/schedule_lib.lua"),
        include_str!("../lua/schedule_set.lua")
    ))
});

/// `lua/schedule_remove.lua`: deletes a schedule.
pub(crate) static SCHEDULE_REMOVE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("../lua/schedule_lib.lua"),
        include_str!("../lua/schedule_remove.lua")
    ))
});

/// `lua/schedule_pause.lua`: pauses or resumes a schedule.
pub(crate) static SCHEDULE_PAUSE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("../lua/schedule_lib.lua"),
        include_str!("../lua/schedule_pause.lua")
    ))
});

/// `lua/schedule_read.lua`: reads the schedules, or those changed since a
/// version.
pub(crate) static SCHEDULE_READ: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("../lua/schedule_lib.lua"),
        include_str!("../lua/schedule_read.lua")
    ))
});

/// `lua/schedule_fire.lua`: offers due occurrences and advances their
/// schedules (after `lua/head.lua` and `lua/schedule_lib.lua`).
pub(crate) static SCHEDULE_FIRE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("../lua/head.lua"),
        include_str!("../lua/schedule_lib.lua"),
        include_str!("../lua/schedule_fire.lua")
    ))
});

/// Most schedules one `schedule_fire.lua` call advances.
pub(crate) const FIRE_GROUPS_MAX: usize = 1_000;

/// The SHA1 of the script named `name` (its file's name without `.lua`:
/// `"offer"`, `"claim"`, `"lock_acquire"`…), as redwheel builds and sends
/// it (with the functions put in front of it), for redwheel's own fault
/// tests and chaos run, which aim faults at one script's `EVALSHA`.
pub fn script_sha(name: &str) -> Option<String> {
    by_name(name).map(|s| s.get_hash().to_owned())
}

/// Loads the script named `name` (as [`script_sha`] names it) into the
/// server behind `con` (`SCRIPT LOAD`), for tests that run a script by
/// hand with `EVALSHA`; its SHA1, or `None` for an unknown name.
pub fn load_script(con: &mut dyn redis::ConnectionLike, name: &str) -> Option<String> {
    by_name(name)?.load(con).ok()
}

/// The name of the script whose SHA1 is `sha` (as [`script_sha`] names
/// it), for errors that say which script Redis failed in.
pub(crate) fn name_of(sha: &str) -> Option<&'static str> {
    NAMES
        .iter()
        .copied()
        .find(|n| by_name(n).is_some_and(|s| s.get_hash() == sha))
}

/// Every script's name, as [`by_name`] knows it.
const NAMES: &[&str] = &[
    "offer",
    "offer_with",
    "offer_batch",
    "controls",
    "transfer",
    "remove",
    "clear",
    "take",
    "park",
    "claim",
    "claim_ahead",
    "ack",
    "nack",
    "extend",
    "dead",
    "requeue_dead",
    "give_back",
    "stats",
    "len",
    "lock_acquire",
    "lock_release",
    "lock_renew",
    "lock_force_release",
    "schedule_set",
    "schedule_remove",
    "schedule_pause",
    "schedule_read",
    "schedule_fire",
];

fn by_name(name: &str) -> Option<&'static Script> {
    Some(match name {
        "offer" => &OFFER,
        "offer_with" => &OFFER_WITH,
        "offer_batch" => &OFFER_BATCH,
        "controls" => &CONTROLS,
        "transfer" => &TRANSFER,
        "remove" => &REMOVE,
        "clear" => &CLEAR,
        "take" => &TAKE,
        "park" => &PARK,
        "claim" => &CLAIM,
        "claim_ahead" => &CLAIM_AHEAD,
        "ack" => &ACK,
        "nack" => &NACK,
        "extend" => &EXTEND,
        "dead" => &DEAD,
        "requeue_dead" => &REQUEUE_DEAD,
        #[cfg(feature = "async")]
        "give_back" => &GIVE_BACK,
        "stats" => &STATS,
        "len" => &LEN,
        "lock_acquire" => &LOCK_ACQUIRE,
        "lock_release" => &LOCK_RELEASE,
        "lock_renew" => &LOCK_RENEW,
        "lock_force_release" => &LOCK_FORCE_RELEASE,
        "schedule_set" => &SCHEDULE_SET,
        "schedule_remove" => &SCHEDULE_REMOVE,
        "schedule_pause" => &SCHEDULE_PAUSE,
        "schedule_read" => &SCHEDULE_READ,
        "schedule_fire" => &SCHEDULE_FIRE,
        _ => return None,
    })
}

/// Most messages one `offer_batch.lua` call carries (3 ARGV each; Lua's
/// `unpack` stops at 8,000 values).
pub(crate) const BATCH_OFFER_MAX: usize = 1_000;

/// Largest transfer batch (`transfer.lua` unpacks the ids it moves).
pub(crate) const TRANSFER_BATCH_MAX: usize = 4_000;

/// Most messages one `claim.lua` call claims.
pub(crate) const CLAIM_BATCH_MAX: usize = 1_000;

/// Largest due time a script accepts: 2^53 ms, the last integer a Redis
/// sorted-set score (a double) holds exactly.
pub(crate) const MAX_DUE_MS: u64 = 1 << 53;

#[cfg(test)]
mod tests {
    use super::*;

    /// `NAMES` lists every script of this file (a new one left out would
    /// show in errors as no script at all), and each name resolves.
    #[test]
    fn every_script_is_named_and_found_by_its_sha() {
        let source = include_str!("scripts.rs");
        let statics: Vec<String> = source
            .lines()
            .filter_map(|l| l.strip_prefix("pub(crate) static "))
            .filter(|l| l.contains("LazyLock<Script>"))
            .map(|l| l.split(':').next().unwrap().to_lowercase())
            .collect();
        assert!(statics.len() >= 20, "{statics:?}");
        for s in &statics {
            assert!(NAMES.contains(&s.as_str()), "{s} is not in NAMES");
        }
        assert_eq!(statics.len(), NAMES.len(), "NAMES has a name of no script");
        for name in NAMES {
            match by_name(name) {
                Some(script) => assert_eq!(name_of(script.get_hash()), Some(*name)),
                None => assert!(*name == "give_back" && !cfg!(feature = "async"), "{name}"),
            }
        }
        assert_eq!(name_of("0000000000000000000000000000000000000000"), None);
    }
}
