//! The driver job of one consumer pool: extends the visibility of every
//! running handler's message in one round, or gives a message back when
//! its handler ran past its timeout.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use parking_lot::Mutex;
use redis::Value;

use super::running::{Inner, Running, retry_delay};
use crate::error::Error;
use crate::queue::delivery::{count_nack, extend_keys, nack_keys};
use crate::queue::state::QueueState;
use crate::runtime::{Commands, Job, Next};
use crate::scripts::{self, MAX_DUE_MS};

/// The driver job of one consumer pool: extends the visibility of every
/// running handler's message, or gives it back if the handler ran past its
/// timeout.
pub(super) struct ExtendJob {
    pub(super) inner: Arc<Inner>,
    pub(super) state: Arc<QueueState>,
    pub(super) slot: u16,
    pub(super) visibility_ms: u64,
    pub(super) period: Duration,
    pub(super) handler_timeout: Option<Duration>,
    pub(super) retry_min: Duration,
    pub(super) retry_max: Duration,
    pub(super) max_deliveries: u32,
    /// What the last `commands` sent, for `on_reply`.
    pub(super) sent: Mutex<Vec<(Running, bool)>>,
}

impl Job for ExtendJob {
    fn describe(&self) -> String {
        format!(
            "visibility extension of queue {:?}'s consumer",
            self.state.name
        )
    }

    fn commands(&self, out: &mut Commands) {
        let running: Vec<Running> = self.inner.running.lock().values().cloned().collect();
        let mut sent = self.sent.lock();
        sent.clear();
        for r in running {
            if r.released.load(Ordering::SeqCst) {
                continue;
            }
            let timed_out = self
                .handler_timeout
                .is_some_and(|limit| r.started.elapsed() >= limit);
            let packed = if timed_out {
                let delay = retry_delay(self.retry_min, self.retry_max, r.attempt);
                // Far below MAX_DUE_MS - now for ages: nack.lua adds it to now.
                let delay_ms = u64::try_from(delay.as_millis())
                    .unwrap_or(u64::MAX)
                    .min(MAX_DUE_MS / 2);
                redis::cmd("EVALSHA")
                    .arg(scripts::NACK.get_hash())
                    .arg(nack_keys(&self.state.keys).len())
                    .arg(&nack_keys(&self.state.keys)[..])
                    .arg(&r.id)
                    .arg(&r.token)
                    .arg(delay_ms)
                    .arg(self.max_deliveries)
                    .arg("the handler timed out")
                    .get_packed_command()
            } else {
                redis::cmd("EVALSHA")
                    .arg(scripts::EXTEND.get_hash())
                    .arg(3)
                    .arg(&extend_keys(&self.state.keys)[..])
                    .arg(&r.id)
                    .arg(&r.token)
                    .arg(self.visibility_ms)
                    .get_packed_command()
            };
            out.push(self.slot, &packed);
            sent.push((r, timed_out));
        }
    }

    fn scripts(&self) -> &[&'static redis::Script] {
        static SCRIPTS: std::sync::LazyLock<[&'static redis::Script; 2]> =
            std::sync::LazyLock::new(|| [&*scripts::EXTEND, &*scripts::NACK]);
        &*SCRIPTS
    }

    fn on_reply(&self, replies: &[Value]) -> Result<Next, Error> {
        let sent = self.sent.lock();
        for ((r, timed_out), reply) in sent.iter().zip(replies) {
            let n = match reply {
                Value::Int(n) => *n,
                _ => continue,
            };
            if *timed_out {
                r.released.store(true, Ordering::SeqCst);
                self.inner.failed.fetch_add(1, Ordering::Relaxed);
                count_nack(&self.state.metrics, n);
                tracing::warn!(target: "redwheel::queue", queue = %self.state.name, id = %r.id, "consumer: a handler ran past its timeout; its message was given back");
            } else if n < 0 {
                // The claim expired before we could extend it (a stalled
                // process): the message is another consumer's now.
                r.released.store(true, Ordering::SeqCst);
                tracing::warn!(target: "redwheel::queue", queue = %self.state.name, id = %r.id, "consumer: a running handler's claim expired before it was extended; its result will be dropped");
            }
        }
        Ok(Next::After(self.period))
    }
}
