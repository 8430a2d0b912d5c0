//! A queue's transfer job: the driver job that runs `transfer.lua`, which
//! moves due ids to the ready list, redelivers (or kills) claims whose
//! visibility expired, makes messages past their ttl dead letters, and says
//! how long until the next due time. Each run opens the queue's gate, so
//! consumers held back by its controls look again.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use super::gate::Gate;
use super::keys::Keys;
use crate::error::{Error, ErrorKind};
use crate::runtime::{Commands, Job, Next, slot};
use crate::scripts;
use crate::telemetry::{Counter, QueueMetrics};

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
    /// `redwheel_messages_dead_lettered_total`: expired claims at the
    /// limit, and messages past their ttl.
    died: Counter,
    /// `redwheel_messages_expired_total`: messages past their ttl.
    expired: Counter,
    /// `EVALSHA <transfer> 16 <keys…> <batch> <max_deliveries>`, packed once.
    packed: Box<[u8]>,
    name: String,
    /// Opened after every run: held-back consumers look again.
    gate: Arc<Gate>,
    /// This process's async takers and claimers waiting for the ready list
    /// (feature `async`): woken after each transfer.
    #[cfg(feature = "async")]
    pub(crate) ready: Arc<crate::runtime::WaitList>,
}

impl TransferJob {
    pub(super) fn new(
        name: &str,
        keys: &Keys,
        batch: usize,
        max_deliveries: u32,
        gate: Arc<Gate>,
    ) -> TransferJob {
        let packed = redis::cmd("EVALSHA")
            .arg(scripts::TRANSFER.get_hash())
            .arg(16)
            .arg(&keys.delayed)
            .arg(&keys.ready)
            .arg(&keys.inflight)
            .arg(&keys.lease)
            .arg(&keys.msg)
            .arg(&keys.attempts)
            .arg(&keys.dead)
            .arg(&keys.reason)
            .arg(&keys.controls)
            .arg(&keys.prioritized)
            .arg(&keys.priority)
            .arg(&keys.expires)
            .arg(&keys.stale)
            .arg(&keys.counts)
            .arg(&keys.wake)
            .arg(&keys.head)
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
            expired: QueueMetrics::expired(name),
            packed,
            name: name.to_owned(),
            gate,
            #[cfg(feature = "async")]
            ready: Arc::default(),
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
        let Reply {
            moved,
            wait_us,
            died,
            expired,
        } = parse_transfer_reply(replies).ok_or_else(|| {
            Error::new(
                ErrorKind::Protocol,
                format!("unexpected reply to transfer.lua: {replies:?}"),
            )
            .in_queue(&self.name)
        })?;
        self.runs.fetch_add(1, Ordering::Relaxed);
        self.gate.open();
        if expired > 0 {
            self.expired.add(expired);
            self.died.add(expired);
            tracing::debug!(
                target: "redwheel::queue",
                queue = %self.name,
                expired,
                "messages past their ttl became dead letters"
            );
        }
        // A transfer ran (this process's, at a due time, a sweep): what it
        // moved, or what another process moved just before, is on the ready
        // list. Each waiter that gets a message wakes the next.
        #[cfg(feature = "async")]
        self.ready.wake(moved.max(1) as usize);
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

/// What one transfer.lua run did.
#[derive(Debug, PartialEq, Eq)]
struct Reply {
    /// Ids made ready (moved, or expired claims back) plus claims that died.
    moved: u64,
    /// µs until the next due time, deadline or ttl; -1 when none is left.
    wait_us: i64,
    /// Expired claims sent to the dead letters (at `max_deliveries`).
    died: u64,
    /// Messages past their ttl sent to the dead letters.
    expired: u64,
}

/// transfer.lua's reply, `moved + 8192 * wait_us` or `-(moved + 1)`, or
/// `[that, died, expired]` when messages died.
fn parse_transfer_reply(replies: &[redis::Value]) -> Option<Reply> {
    let (packed, died, expired) = match replies.first()? {
        redis::Value::Int(packed) => (*packed, 0, 0),
        redis::Value::Array(items) => match items.as_slice() {
            [
                redis::Value::Int(packed),
                redis::Value::Int(died),
                redis::Value::Int(expired),
            ] => (
                *packed,
                u64::try_from(*died).ok()?,
                u64::try_from(*expired).ok()?,
            ),
            _ => return None,
        },
        _ => return None,
    };
    let (moved, wait_us) = if packed < 0 {
        (u64::try_from(packed.checked_neg()? - 1).ok()?, -1)
    } else {
        ((packed % 8192) as u64, packed / 8192)
    };
    Some(Reply {
        moved,
        wait_us,
        died,
        expired,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(moved: u64, wait_us: i64, died: u64, expired: u64) -> Option<Reply> {
        Some(Reply {
            moved,
            wait_us,
            died,
            expired,
        })
    }

    #[test]
    fn transfer_replies_unpack_and_anything_else_is_refused() {
        let int = |i: i64| [redis::Value::Int(i)];
        assert_eq!(
            parse_transfer_reply(&int(3 + 8192 * 1_234_567)),
            reply(3, 1_234_567, 0, 0)
        );
        assert_eq!(parse_transfer_reply(&int(8192)), reply(0, 1, 0, 0));
        assert_eq!(
            parse_transfer_reply(&int(4_000 + 8192 * 3_600_000_000)),
            reply(4_000, 3_600_000_000, 0, 0)
        );
        assert_eq!(parse_transfer_reply(&int(-1)), reply(0, -1, 0, 0));
        assert_eq!(parse_transfer_reply(&int(-4_001)), reply(4_000, -1, 0, 0));
        assert_eq!(parse_transfer_reply(&int(i64::MIN)), None);
        assert_eq!(
            parse_transfer_reply(&[redis::Value::BulkString(b"1 2".to_vec())]),
            None
        );
        assert_eq!(parse_transfer_reply(&[]), None);
        // Messages that died come as [packed, died, expired].
        let triple = |packed: i64, died: i64, expired: i64| {
            [redis::Value::Array(vec![
                redis::Value::Int(packed),
                redis::Value::Int(died),
                redis::Value::Int(expired),
            ])]
        };
        assert_eq!(
            parse_transfer_reply(&triple(5 + 8192 * 7, 2, 0)),
            reply(5, 7, 2, 0)
        );
        assert_eq!(parse_transfer_reply(&triple(-4, 3, 9)), reply(3, -1, 3, 9));
        assert_eq!(parse_transfer_reply(&triple(5, -1, 0)), None);
        assert_eq!(parse_transfer_reply(&triple(5, 0, -1)), None);
        assert_eq!(
            parse_transfer_reply(&[redis::Value::Array(vec![
                redis::Value::Int(5),
                redis::Value::Int(1)
            ])]),
            None
        );
    }
}
