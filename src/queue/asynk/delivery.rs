//! `Delivery::{ack_async, nack_async, extend_async}`.

use std::sync::Arc;
use std::time::Duration;

use super::offer::reply_as;
use crate::error::{Access, Error};
use crate::queue::codec::Codec;
use crate::queue::delivery::{Delivery, Nacked, count_nack, extend_keys, extend_ms, nack_keys};
use crate::runtime::Command;
use crate::scripts;
use crate::telemetry;

impl<T: Codec + Sync> Delivery<T> {
    /// [`ack`](Delivery::ack) as a future: deletes the message for good.
    /// Idempotent; same errors as `ack`
    /// ([`StaleDelivery`](crate::ErrorKind::StaleDelivery) if the
    /// visibility ended first). (`T: Sync` so that the future, which
    /// borrows the delivery, is `Send`.)
    ///
    /// **Cancellation**: dropped after its first poll, the ack may or may
    /// not have been applied; the delivery is still yours: ack it again
    /// (an ack applied twice is one ack).
    ///
    /// Acks that come while an earlier one of the same queue is on the
    /// wire go out together, in one script call (`claim.lua` claiming
    /// nothing), so Redis spends a fraction of a call per ack when many
    /// tasks ack at once; each still gets its own answer.
    pub async fn ack_async(&self) -> Result<(), Error> {
        let q = &self.queue;
        let _span = telemetry::queue_op_async("ack", &q.state.name, 1);
        let answer = super::acks::ack(
            q.rt(),
            &q.state,
            q.claim_visibility(),
            self.id.as_str(),
            &self.token,
        );
        let n = answer
            .wait("an ack")
            .await
            .map_err(|e| q.tag(e).for_message(self.id.as_str()))?;
        self.acked(n)
    }

    /// [`nack`](Delivery::nack) as a future: gives the message back, due
    /// again `retry_delay` from now, or to the dead letters at
    /// `max_deliveries`. Same errors as `nack`.
    ///
    /// **Cancellation**: dropped after its first poll, the nack may or may
    /// not have been applied (if not, the message comes back when its
    /// visibility ends).
    pub async fn nack_async(&self, retry_delay: Duration) -> Result<Nacked, Error> {
        let delay_ms = self.nack_delay_ms(retry_delay).to_string();
        let max = self.queue.max_deliveries.to_string();
        let command = Command::script(
            &scripts::NACK,
            &nack_keys(&self.queue.state.keys),
            &[
                self.id.as_str().as_bytes(),
                self.token.as_bytes(),
                delay_ms.as_bytes(),
                max.as_bytes(),
                b"nacked",
            ],
        );
        let _span = telemetry::queue_op_async("nack", &self.queue.state.name, 1);
        let n: i64 = self.send(command).await?;
        self.nacked(count_nack(&self.queue.state.metrics, n))
    }

    /// [`extend`](Delivery::extend) as a future: no other consumer gets the
    /// message for `visibility` from now. Same errors as `extend`.
    ///
    /// **Cancellation**: dropped after its first poll, the visibility may
    /// or may not have been extended; extending again is harmless.
    pub async fn extend_async(&self, visibility: Duration) -> Result<(), Error> {
        let keys = &self.queue.state.keys;
        let ms = extend_ms(visibility).to_string();
        let command = Command::script(
            &scripts::EXTEND,
            &extend_keys(keys),
            &[
                self.id.as_str().as_bytes(),
                self.token.as_bytes(),
                ms.as_bytes(),
            ],
        );
        let _span = telemetry::queue_op_async("extend", &self.queue.state.name, 1);
        let deadline: i64 = self.send(command).await?;
        self.extended(deadline, visibility)
    }

    /// Sends one of this delivery's scripts; its reply as `R`.
    async fn send<R: redis::FromRedisValue>(&self, command: Command) -> Result<R, Error> {
        let tag = |e: Error| self.queue.tag(e).for_message(self.id.as_str());
        let replies = Arc::clone(self.queue.rt())
            .call(
                &self.queue.state.keys.inflight,
                Access::Write,
                command,
                None,
            )
            .await
            .map_err(tag)?;
        reply_as(replies.into_iter().next(), Access::Write).map_err(tag)
    }
}
