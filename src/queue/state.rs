//! Per-queue state shared by handles and the queue's transfer job; queue
//! names, keys and message ids.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use crate::error::{Error, ErrorKind};
use crate::runtime::{Commands, Job, MAX_TAG_NAME_LEN, Next, random_u64, slot, validate_tag_name};
use crate::scripts;
use crate::telemetry::{Counter, QueueMetrics};

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
        }
    }
}

/// One open queue, as its handles see it.
pub(crate) struct QueueState {
    pub name: String,
    pub keys: Keys,
    /// The driver's key for this queue's transfer job.
    pub job_key: String,
    /// Its transfer job (registered with the driver by the first open).
    pub transfer: Arc<TransferJob>,
    /// Its metric handles (no-ops without the `metrics` feature).
    pub metrics: QueueMetrics,
}

impl QueueState {
    /// A queue's state, its transfer moving up to `batch` ids per call
    /// and sending claims delivered `max_deliveries` times to the dead
    /// letters.
    pub(crate) fn new(name: &str, batch: usize, max_deliveries: u32) -> QueueState {
        let keys = Keys::new(name);
        QueueState {
            name: name.to_owned(),
            job_key: keys.delayed.clone(),
            transfer: Arc::new(TransferJob::new(name, &keys, batch, max_deliveries)),
            metrics: QueueMetrics::new(name),
            keys,
        }
    }
}

/// A queue's due work: `transfer.lua`, which moves up to a batch of due
/// ids to the ready list, redelivers (or kills) claims whose visibility
/// expired, and says how long until the next due time or deadline.
///
/// Everything a sweep touches per queue is in this one allocation (the
/// packed command, the counters), so sweeping thousands of queues reads few
/// cache lines.
pub(crate) struct TransferJob {
    batch: usize,
    slot: u16,
    /// Transfers run and messages moved (for `transfer_stats`).
    pub runs: AtomicU64,
    pub moved: AtomicU64,
    /// `redwheel_messages_transferred_total` of this queue.
    transferred: Counter,
    /// `redwheel_messages_dead_lettered_total`: expired claims at the limit.
    died: Counter,
    /// `EVALSHA <transfer> 8 <keys…> <batch> <max_deliveries>`, packed once.
    packed: Box<[u8]>,
    name: String,
}

impl TransferJob {
    fn new(name: &str, keys: &Keys, batch: usize, max_deliveries: u32) -> TransferJob {
        let packed = redis::cmd("EVALSHA")
            .arg(scripts::TRANSFER.get_hash())
            .arg(8)
            .arg(&keys.delayed)
            .arg(&keys.ready)
            .arg(&keys.inflight)
            .arg(&keys.lease)
            .arg(&keys.msg)
            .arg(&keys.attempts)
            .arg(&keys.dead)
            .arg(&keys.reason)
            .arg(batch)
            .arg(max_deliveries)
            .get_packed_command()
            .into_boxed_slice();
        TransferJob {
            batch,
            slot: slot(keys.delayed.as_bytes()),
            runs: AtomicU64::new(0),
            moved: AtomicU64::new(0),
            transferred: QueueMetrics::transferred(name),
            died: QueueMetrics::dead_lettered(name),
            packed,
            name: name.to_owned(),
        }
    }
}

impl Job for TransferJob {
    fn describe(&self) -> String {
        format!("transfer of queue {:?}", self.name)
    }

    fn commands(&self, out: &mut Commands) {
        out.push(self.slot, &self.packed);
    }

    fn scripts(&self) -> &[&'static redis::Script] {
        static SCRIPTS: LazyLock<[&'static redis::Script; 1]> =
            LazyLock::new(|| [&*scripts::TRANSFER]);
        &*SCRIPTS
    }

    fn on_reply(&self, replies: &[redis::Value]) -> Result<Next, Error> {
        let (moved, wait_us, died) = parse_transfer_reply(replies).ok_or_else(|| {
            Error::new(
                ErrorKind::Protocol,
                format!("unexpected reply to transfer.lua: {replies:?}"),
            )
            .in_queue(&self.name)
        })?;
        self.runs.fetch_add(1, Ordering::Relaxed);
        if moved > 0 {
            self.moved.fetch_add(moved, Ordering::Relaxed);
            self.transferred.add(moved - died.min(moved));
            self.died.add(died);
            tracing::trace!(
                target: "redwheel::queue",
                queue = %self.name,
                moved,
                wait_us,
                "transfer"
            );
        }
        Ok(if moved as usize >= self.batch {
            // A full batch: more may be due. The driver runs it again in its
            // next round, beside whatever else fell due.
            Next::Again
        } else if wait_us >= 0 {
            // Measured from the server's own "now" in this round: never
            // early, and no clock offset involved.
            Next::After(Duration::from_micros(wait_us.max(1) as u64))
        } else {
            Next::Idle
        })
    }
}

/// transfer.lua's reply, `moved + 8192 * wait_us` or `-(moved + 1)`, or
/// `[that, died]` when expired claims died: (moved, wait in µs or -1 when
/// nothing is left, died).
fn parse_transfer_reply(replies: &[redis::Value]) -> Option<(u64, i64, u64)> {
    let (packed, died) = match replies.first()? {
        redis::Value::Int(packed) => (*packed, 0),
        redis::Value::Array(pair) => match pair.as_slice() {
            [redis::Value::Int(packed), redis::Value::Int(died)] => {
                (*packed, u64::try_from(*died).ok()?)
            }
            _ => return None,
        },
        _ => return None,
    };
    if packed < 0 {
        let moved = packed.checked_neg()? - 1;
        return Some((u64::try_from(moved).ok()?, -1, died));
    }
    Some(((packed % 8192) as u64, packed / 8192, died))
}

/// Message ids: a per-process random prefix of 11 base-62 characters (64
/// random bits) followed by a per-process counter in base 62. Unique across
/// processes with overwhelming probability, and short: they are stored in
/// Redis three times per message.
pub(crate) fn new_message_id() -> String {
    use std::sync::OnceLock;
    static PREFIX: OnceLock<String> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let prefix = PREFIX.get_or_init(|| {
        let seed = random_u64();
        let mut s = String::with_capacity(11);
        let mut x = seed;
        for _ in 0..11 {
            s.push(BASE62[(x % 62) as usize] as char);
            x /= 62;
        }
        s
    });
    let mut n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut id = String::with_capacity(prefix.len() + 11);
    id.push_str(prefix);
    let mut digits = [0u8; 11];
    let mut len = 0;
    loop {
        digits[len] = BASE62[(n % 62) as usize];
        len += 1;
        n /= 62;
        if n == 0 {
            break;
        }
    }
    for &d in digits[..len].iter().rev() {
        id.push(d as char);
    }
    id
}

const BASE62: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

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
    }

    #[test]
    fn transfer_replies_unpack_and_anything_else_is_refused() {
        let int = |i: i64| [redis::Value::Int(i)];
        assert_eq!(
            parse_transfer_reply(&int(3 + 8192 * 1_234_567)),
            Some((3, 1_234_567, 0))
        );
        assert_eq!(parse_transfer_reply(&int(8192)), Some((0, 1, 0)));
        assert_eq!(
            parse_transfer_reply(&int(4_000 + 8192 * 3_600_000_000)),
            Some((4_000, 3_600_000_000, 0))
        );
        assert_eq!(parse_transfer_reply(&int(-1)), Some((0, -1, 0)));
        assert_eq!(parse_transfer_reply(&int(-4_001)), Some((4_000, -1, 0)));
        assert_eq!(parse_transfer_reply(&int(i64::MIN)), None);
        assert_eq!(
            parse_transfer_reply(&[redis::Value::BulkString(b"1 2".to_vec())]),
            None
        );
        assert_eq!(parse_transfer_reply(&[]), None);
        // Expired claims that died come as [packed, died].
        let pair = |packed: i64, died: i64| {
            [redis::Value::Array(vec![
                redis::Value::Int(packed),
                redis::Value::Int(died),
            ])]
        };
        assert_eq!(
            parse_transfer_reply(&pair(5 + 8192 * 7, 2)),
            Some((5, 7, 2))
        );
        assert_eq!(parse_transfer_reply(&pair(-4, 3)), Some((3, -1, 3)));
        assert_eq!(parse_transfer_reply(&pair(5, -1)), None);
        assert_eq!(
            parse_transfer_reply(&[redis::Value::Array(vec![redis::Value::Int(5)])]),
            None
        );
    }

    #[test]
    fn message_ids_are_short_and_distinct() {
        let ids: std::collections::HashSet<String> =
            (0..10_000).map(|_| new_message_id()).collect();
        assert_eq!(ids.len(), 10_000);
        assert!(ids.iter().all(|id| id.len() <= 22));
    }
}
