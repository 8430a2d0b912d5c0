//! Take and claim as requests that are safe to send again.
//!
//! A take or claim whose reply is lost (the connection reset, the reply cut
//! midway or later than the command timeout) may have run: sent again
//! blindly, it would pop a second message and lose the first (take), or
//! claim one for nobody and count an attempt twice (claim). So every call
//! is a *request*: a reply-record key of its own slot and a request number.
//! The script (`take.lua`, `claim.lua`, with their shared part in
//! `ready_pop.lua`) records what it handed out under that key (a STRING,
//! for [`REPLY_TTL`]); the same request sent again finds the
//! record and answers what the first one did (a claim's visibility starting
//! again from the replay), so the caller resends it until it gets an
//! answer, and learns the truth.
//!
//! Slots are reused: a process needs as many as it has takes and claims in
//! progress at once, and each record is overwritten by the slot's next
//! request, so Redis holds one small record per slot (plus, for a take, a
//! copy of the payload it handed out) and no more. Request numbers only
//! grow within a slot, and a script that finds a record of a later number
//! does nothing: an attempt of an earlier call that reaches Redis late can
//! never hand out a message.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

use super::ids::{new_token, process_prefix};
use super::keys::Keys;

/// How long Redis keeps a reply record.
pub(crate) const REPLY_TTL: Duration = Duration::from_secs(600);

/// How long a caller goes on sending a request whose first attempt may
/// have run, to learn what it did; after that it reports
/// `OutcomeUnknown`. Half of [`REPLY_TTL`], so the record is always still
/// there when the last attempt runs.
pub(crate) const RESOLVE_WITHIN: Duration = Duration::from_secs(300);

/// Free slots, each with the last request number used in it.
static FREE: Mutex<Vec<(u64, u64)>> = Mutex::new(Vec::new());

/// The next slot never used.
static NEXT_SLOT: AtomicU64 = AtomicU64::new(0);

/// One take or claim call (and its resends), holding a slot until dropped.
pub(crate) struct Request {
    slot: u64,
    seq: u64,
    /// The slot's reply record: `redwheel:{N}:reply:<process>.<slot>`.
    pub(crate) key: String,
    /// The request number, as sent to the script.
    pub(crate) seq_arg: String,
    /// The token prefix of the claims this request makes.
    pub(crate) token: String,
    /// [`REPLY_TTL`] in ms, as sent to the script.
    pub(crate) ttl_arg: String,
}

impl Request {
    /// A new request on queue `keys`, in a free slot.
    pub(crate) fn new(keys: &Keys) -> Request {
        let (slot, last) = FREE
            .lock()
            .pop()
            .unwrap_or_else(|| (NEXT_SLOT.fetch_add(1, Ordering::Relaxed), 0));
        let seq = last + 1;
        Request {
            slot,
            seq,
            key: keys.reply(&process_prefix(), slot),
            seq_arg: seq.to_string(),
            token: new_token(),
            ttl_arg: REPLY_TTL.as_millis().to_string(),
        }
    }

    /// Makes this the next request of the same slot: a new call, whose
    /// resends must not replay the previous one's reply.
    pub(crate) fn next(&mut self) {
        self.seq += 1;
        self.seq_arg = self.seq.to_string();
        self.token = new_token();
    }
}

impl Drop for Request {
    fn drop(&mut self) {
        FREE.lock().push((self.slot, self.seq));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reused_slot_gets_a_higher_request_number() {
        let keys = Keys::new("req-test");
        let a = Request::new(&keys);
        let (slot, seq) = (a.slot, a.seq);
        assert!(a.key.starts_with("redwheel:{req-test}:reply:"), "{}", a.key);
        drop(a);
        // Other tests take slots too: look for ours among the free ones.
        let mut held = Vec::new();
        let mut again = None;
        for _ in 0..1_000 {
            let r = Request::new(&keys);
            if r.slot == slot {
                again = Some(r);
                break;
            }
            held.push(r);
        }
        let mut again = again.expect("the slot is reused");
        assert!(again.seq > seq);
        assert!(again.key.ends_with(&format!(".{slot}")), "{}", again.key);
        let before = again.seq;
        again.next();
        assert_eq!(again.seq, before + 1);
        assert_eq!(again.seq_arg, again.seq.to_string());
    }
}
