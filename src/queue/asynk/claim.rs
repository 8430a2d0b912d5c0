//! `claim_async` and `claim_batch_async`, and what happens to the claims
//! a dropped claim was handed: given back at once.

use std::future::Future;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use redis::Value;

use super::Popped;
use crate::error::{Access, Error, ErrorKind};
use crate::queue::claim::{claim_args, claim_keys};
use crate::queue::codec::Codec;
use crate::queue::delivery::{Delivery, nack_keys};
use crate::queue::handle::Queue;
use crate::queue::keys::Keys;
use crate::queue::request::Request;
use crate::runtime::{Command, Orphan, Runtime, detach};
use crate::scripts::{self, CLAIM_BATCH_MAX};

impl<T: Codec> Queue<T> {
    /// [`claim`](Queue::claim) as a future: waits up to `wait` for a due
    /// message and claims it (at-least-once delivery). Same errors as
    /// `claim`. Waits as [`take_async`](Queue::take_async) does, holding no
    /// connection.
    ///
    /// **Cancellation**: dropping the future never loses a message.
    /// Dropped while waiting, nothing was claimed. Dropped with a claim on
    /// the wire, what it claims is given back at once (`nack.lua` with no
    /// delay, on redwheel's threads; the delivery counts as an attempt, as
    /// a claim whose visibility ends does), or, if even that fails, comes
    /// back when its visibility ends.
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
    /// undecodable ones parked and returned as errors).
    pub(crate) async fn claim_some_async(
        &self,
        n: usize,
        wait: Duration,
    ) -> Result<Vec<Result<Delivery<T>, Error>>, Error> {
        let keys = &self.state.keys;
        // One request for every round of this call (as the synchronous
        // claim): a round whose reply was lost is answered again.
        let req = Request::new(keys);
        let (vis, count) = (self.claim_visibility(), n.to_string());
        let command = Command::script(
            &scripts::CLAIM,
            &claim_keys(keys, &req.key),
            &claim_args(&vis, &req, &count),
        );
        let rt = Arc::downgrade(self.rt());
        let nack = Arc::new((keys.clone(), self.max_deliveries));
        let orphan = || -> Option<Orphan> {
            let (rt, nack) = (Weak::clone(&rt), Arc::clone(&nack));
            Some(Box::new(move |values: Option<Vec<Value>>| {
                // A lost reply: what it claimed comes back when its
                // visibility ends.
                if let (Some(rt), Some(values)) = (rt.upgrade(), values) {
                    give_back_claims(rt, &nack.0, nack.1, values);
                }
            }))
        };
        let popped = self
            .pop_async(
                "claim",
                Instant::now().checked_add(wait),
                command,
                5,
                orphan,
            )
            .await?;
        drop(req);
        let Popped::Found(reply) = popped else {
            return Ok(Vec::new());
        };
        let raw = self.read_claims_raw(reply)?;
        let mut out = Vec::with_capacity(raw.deliveries.len());
        for c in raw.deliveries {
            out.push(match c {
                Ok(d) => Ok(d),
                Err(u) => {
                    let reason = u.cause.to_string();
                    let parked = self
                        .park_async(&u.id, &u.stored, Some(&u.token), &reason)
                        .await;
                    Err(self.decode_failed(&u.id, Some(&u.token), parked, u.cause))
                }
            });
        }
        Ok(out)
    }
}

/// A claim's replies arrived after its future was dropped: every message
/// it claimed is given back at once, on redwheel's threads.
fn give_back_claims(rt: Arc<Runtime>, keys: &Keys, max_deliveries: u32, values: Vec<Value>) {
    let Some(Value::Array(items)) = values.into_iter().next() else {
        return;
    };
    // [gate, expired, deadline, refused, acked, (id, value, attempt, token)…]
    for entry in items.get(5..).unwrap_or_default().chunks(4) {
        let [Value::BulkString(id), _, _, Value::BulkString(token)] = entry else {
            continue;
        };
        let max = max_deliveries.to_string();
        let command = Command::script(
            &scripts::NACK,
            &nack_keys(keys),
            &[id, token, b"0", max.as_bytes(), b"its claim was dropped"],
        );
        let (rt, route) = (Arc::clone(&rt), keys.inflight.clone());
        let id = String::from_utf8_lossy(id).into_owned();
        detach(async move {
            if let Err(e) = rt.call(&route, Access::Write, command, None).await {
                tracing::warn!(target: "redwheel::queue", key = %route, id, error = %e, "a dropped claim's message could not be given back; it comes back when its visibility ends");
            }
        });
    }
}
