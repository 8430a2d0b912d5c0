//! `claim_async` and `claim_batch_async`, and what happens to the claims
//! a dropped claim was handed: given back at once.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::Value;

use super::Popped;
use super::lost::orphan_of;
use crate::error::{Access, Error, ErrorKind};
use crate::queue::claim::{claim_args, claim_keys};
use crate::queue::codec::Codec;
use crate::queue::delivery::{Delivery, nack_keys};
use crate::queue::handle::Queue;
use crate::queue::keys::Keys;
use crate::queue::request::Request;
use crate::runtime::{Command, Runtime, detach};
use crate::scripts::{self, CLAIM_BATCH_MAX};

impl<T: Codec> Queue<T> {
    /// [`claim`](Queue::claim) as a future: waits up to `wait` for a due
    /// message and claims it (at-least-once delivery). Same errors as
    /// `claim`. Waits as [`poll_async`](Queue::poll_async) does, holding no
    /// connection, and returns within `wait` plus one `command_timeout`.
    ///
    /// **Cancellation**: dropping the future never loses a message.
    /// Dropped while waiting, nothing was claimed. Dropped with a claim on
    /// the wire, what it claims is given back at once (`nack.lua` with no
    /// delay, on redwheel's threads; the delivery counts as an attempt, as
    /// a claim whose visibility ends does), or, if even that fails, comes
    /// back when its visibility ends. If a claim's reply was lost, the same
    /// request is sent again (answered from its reply record) to learn
    /// what it claimed, and that is given back, also when the future is
    /// dropped before the resend went out (during the backoff, or with
    /// Redis unreachable). Dropped while it parks an undecodable message
    /// (`claim_batch_async`), it gives the decoded ones back at once.
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), redwheel::Error> {
    /// use std::time::Duration;
    /// use redwheel::Redwheel;
    ///
    /// let rw = Redwheel::connect("redis://127.0.0.1:6379")?;
    /// let q = rw.queue::<String>("emails")?;
    /// if let Some(d) = q.claim_async(Duration::from_secs(1)).await? {
    ///     // … send the email …
    ///     d.ack_async().await?;
    /// }
    /// # Ok(()) }
    /// ```
    pub fn claim_async(
        &self,
        wait: Duration,
    ) -> impl Future<Output = Result<Option<Delivery<T>>, Error>> + Send + 'static {
        let q = self.clone();
        async move {
            let mut batch = q.claim_some_async(1, wait).await?;
            match batch.pop() {
                Some(Ok(d)) => Ok(Some(d)),
                Some(Err(e)) => Err(e),
                None => Ok(None),
            }
        }
    }

    /// [`claim_batch`](Queue::claim_batch) as a future: up to `n` messages
    /// (1 ..= 1,000) in one script call, waiting up to `wait` for the
    /// first. Same errors as `claim_batch`.
    ///
    /// **Cancellation**: as [`claim_async`](Queue::claim_async).
    pub fn claim_batch_async(
        &self,
        n: usize,
        wait: Duration,
    ) -> impl Future<Output = Result<Vec<Delivery<T>>, Error>> + Send + 'static {
        let q = self.clone();
        async move {
            if n == 0 || n > CLAIM_BATCH_MAX {
                return Err(q.tag(Error::new(
                    ErrorKind::InvalidOption,
                    format!("claim_batch of {n}: not in 1..={CLAIM_BATCH_MAX}"),
                )));
            }
            Ok(q.claim_some_async(n, wait)
                .await?
                .into_iter()
                .filter_map(Result::ok)
                .collect())
        }
    }

    /// Claims up to `n`, waiting up to `wait` for the first (the
    /// undecodable ones parked and returned as errors). Dropped before it
    /// returns (while it parks one), it gives back the decoded ones at once.
    pub(crate) async fn claim_some_async(
        &self,
        n: usize,
        wait: Duration,
    ) -> Result<Vec<Result<Delivery<T>, Error>>, Error> {
        let keys = &self.state.keys;
        // One request for every round of this call (as the synchronous
        // claim): a round whose reply was lost is answered again.
        let req = Arc::new(Request::new(keys));
        let (vis, count) = (self.claim_visibility(), n.to_string());
        let command = Command::script(
            &scripts::CLAIM,
            &claim_keys(keys, &req.key),
            &claim_args(&vis, &req, &count),
        );
        let nack = Arc::new((keys.clone(), self.max_deliveries));
        let orphan = || {
            let nack = Arc::clone(&nack);
            Some(orphan_of(
                self.rt(),
                &keys.ready,
                &req,
                &command,
                (
                    "claim",
                    "what it claimed comes back when its visibility ends",
                ),
                move |rt, values| give_back_claims(&rt, &nack.0, nack.1, values),
            ))
        };
        let popped = self
            .pop_async(
                "claim",
                Instant::now().checked_add(wait),
                command.clone(),
                5,
                orphan,
            )
            .await?;
        drop(req);
        let Popped::Found(reply) = popped else {
            return Ok(Vec::new());
        };
        let raw = self.read_claims_raw(reply)?;
        // Every decoded delivery is in `out` before the first park is
        // awaited: dropped there, the future gives them back.
        let mut out = Unreturned(Vec::with_capacity(raw.deliveries.len()));
        let mut undecodable = Vec::new();
        for (i, c) in raw.deliveries.into_iter().enumerate() {
            match c {
                Ok(d) => out.0.push(Some(Ok(d))),
                Err(u) => {
                    out.0.push(None);
                    undecodable.push((i, u));
                }
            }
        }
        for (i, u) in undecodable {
            let reason = u.cause.to_string();
            let parked = self
                .park_async(&u.id, &u.stored, Some(&u.token), &reason)
                .await;
            out.0[i] = Some(Err(self.decode_failed(
                &u.id,
                Some(&u.token),
                parked,
                u.cause,
            )));
        }
        Ok(std::mem::take(&mut out.0).into_iter().flatten().collect())
    }
}

/// The claims of a call not yet returned to its caller (`None`: an
/// undecodable one, being parked): given back at once if the call's
/// future is dropped first.
struct Unreturned<T: Codec>(Vec<Option<Result<Delivery<T>, Error>>>);

impl<T: Codec> Drop for Unreturned<T> {
    fn drop(&mut self) {
        for d in self.0.drain(..).flatten().flatten() {
            d.give_back_now("its claim was dropped");
        }
    }
}

impl<T: Codec> Delivery<T> {
    /// Gives this claim back at once, for `reason` (see
    /// [`give_back_claim`]).
    pub(crate) fn give_back_now(&self, reason: &'static str) {
        let q = &self.queue;
        give_back_claim(
            q.rt(),
            &q.state.keys,
            q.max_deliveries,
            (self.id.as_str().as_bytes(), self.token.as_bytes()),
            reason,
        );
    }
}

/// A claim's answer after its future was dropped (its replies, or, after
/// a lost reply, those of the same request sent again: `lost.rs`): every
/// message it claimed is given back at once, on redwheel's threads.
fn give_back_claims(rt: &Arc<Runtime>, keys: &Keys, max_deliveries: u32, values: Vec<Value>) {
    let Some(Value::Array(items)) = values.into_iter().next() else {
        return;
    };
    // [gate, expired, deadline, refused, acked, (id, value, attempt, token)…]
    for entry in items.get(5..).unwrap_or_default().chunks(4) {
        let [Value::BulkString(id), _, _, Value::BulkString(token)] = entry else {
            continue;
        };
        give_back_claim(
            rt,
            keys,
            max_deliveries,
            (id, token),
            "its claim was dropped",
        );
    }
}

/// Gives the claim `(id, token)` back at once (`nack.lua` with no delay,
/// on redwheel's threads; the delivery counts as an attempt), for
/// `reason`; if that fails, the message comes back when its visibility
/// ends.
fn give_back_claim(
    rt: &Arc<Runtime>,
    keys: &Keys,
    max_deliveries: u32,
    (id, token): (&[u8], &[u8]),
    reason: &'static str,
) {
    let max = max_deliveries.to_string();
    let command = Command::script(
        &scripts::NACK,
        &nack_keys(keys),
        &[id, token, b"0", max.as_bytes(), reason.as_bytes()],
    );
    let (rt, route) = (Arc::clone(rt), keys.inflight.clone());
    let id = String::from_utf8_lossy(id).into_owned();
    detach(async move {
        if let Err(e) = rt.call(&route, Access::Write, command, None).await {
            tracing::warn!(target: "redwheel::queue", key = %route, id, error = %e, "a claimed message could not be given back; it comes back when its visibility ends");
        }
    });
}
