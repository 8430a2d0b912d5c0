//! The claim-ahead job's Redis side: the `claim_ahead.lua` claim, check
//! and give-back and their replies, the acks (`claim.lua` claiming
//! nothing), and, at shutdown, a claim sent again and the give-back.

use redis::Value;

use super::{AheadJob, Claimed, State};
use crate::error::{Access, Error, ErrorKind};
use crate::queue::claim::claim_keys;
use crate::queue::codec::Codec;
use crate::queue::keys::Keys;
use crate::scripts;

/// What a claim returned.
pub(super) struct ClaimReply<T> {
    /// 0, or -1: the queue has controls (nothing claimed).
    pub(super) gate: i64,
    /// The server's time (ms).
    pub(super) now: i64,
    /// The earliest due time after `now` left in `delayed` (ms), or -1.
    pub(super) next: i64,
    pub(super) claims: Vec<Claimed<T>>,
}

impl<T: Codec> AheadJob<T> {
    /// `EVALSHA` of `claim_ahead.lua` with `mode`, its keys (with the
    /// claims' reply record), and no arguments yet.
    fn ahead_cmd(&self, record: &str, mode: &str) -> redis::Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(scripts::CLAIM_AHEAD.get_hash()).arg(10);
        for k in ahead_keys(&self.q.state.keys, record) {
            cmd.arg(k);
        }
        cmd.arg(mode);
        cmd
    }

    pub(super) fn claim_command(&self, st: &mut State<T>, count: usize) -> Vec<u8> {
        st.claim_req.next();
        let req = &st.claim_req;
        let mut cmd = self.ahead_cmd(&req.key, "c");
        cmd.arg(self.vis_ms)
            .arg(&req.token)
            .arg(count)
            .arg(&req.seq_arg)
            .arg(&req.ttl_arg)
            .arg(self.window_ms);
        cmd.get_packed_command()
    }

    /// The check before a hand-out (reads only).
    pub(super) fn check_command(&self, st: &State<T>) -> Vec<u8> {
        self.ahead_cmd(&st.claim_req.key, "h").get_packed_command()
    }

    /// Gives `st.back` back.
    pub(super) fn give_back_command(&self, st: &State<T>) -> Vec<u8> {
        let mut cmd = self.ahead_cmd(&st.claim_req.key, "r");
        for c in &st.back {
            let (id, token) = id_token(c);
            cmd.arg(id).arg(token).arg(c.due);
        }
        cmd.get_packed_command()
    }

    pub(super) fn acks_command(&self, st: &mut State<T>) -> Vec<u8> {
        let keys = &self.q.state.keys;
        st.ack_req.next();
        let req = &st.ack_req;
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(scripts::CLAIM.get_hash()).arg(17);
        for k in claim_keys(keys, &req.key) {
            cmd.arg(k);
        }
        cmd.arg(self.vis_ms)
            .arg(&req.token)
            .arg(0)
            .arg(&req.seq_arg)
            .arg(&req.ttl_arg)
            .arg(st.acks.len());
        for (id, token) in &st.acks {
            cmd.arg(id).arg(token);
        }
        cmd.get_packed_command()
    }

    fn protocol(&self, what: &str) -> Error {
        self.q.tag(Error::new(
            ErrorKind::Protocol,
            format!("unexpected reply to claim_ahead.lua: {what}"),
        ))
    }

    /// Reads a check's reply: the server's time (µs), and whether the
    /// queue has controls (1) or not (0).
    pub(super) fn parse_check(&self, reply: &Value) -> Result<(i64, i64), Error> {
        redis::from_redis_value::<(i64, i64)>(reply.clone())
            .map_err(|_| self.protocol("not a check's { now, controls }"))
    }

    /// Reads a give-back's reply: how many went back. The slots they freed
    /// let this process's claims waiting on `max_in_flight` look again,
    /// and the transfer moves those already due.
    pub(super) fn gave_back(&self, reply: &Value) -> Result<u64, Error> {
        let n = redis::from_redis_value::<u64>(reply.clone())
            .map_err(|_| self.protocol("not a give-back's count"))?;
        if n > 0 {
            self.q.state.gate.slot_freed();
            self.q.announce_deadline(std::time::Duration::ZERO);
        }
        Ok(n)
    }

    /// Reads a claim's reply.
    pub(super) fn parse_claims(&self, reply: &Value) -> Result<ClaimReply<T>, Error> {
        let protocol = |what: &str| self.protocol(what);
        let Value::Array(items) = reply else {
            return Err(protocol("not an array"));
        };
        let int = |v: Option<&Value>, what: &str| -> Result<i64, Error> {
            v.and_then(|v| redis::from_redis_value::<i64>(v.clone()).ok())
                .ok_or_else(|| protocol(what))
        };
        let gate = int(items.first(), "no gate")?;
        let now = int(items.get(1), "no time")?;
        let next = int(items.get(2), "no next due time")?;
        let rest = items.get(3..).unwrap_or_default();
        if rest.len() % 5 != 0 {
            return Err(protocol("a truncated entry"));
        }
        let mut claims = Vec::with_capacity(rest.len() / 5);
        for e in rest.chunks(5) {
            let text = |v: &Value, what: &str| -> Result<String, Error> {
                redis::from_redis_value(v.clone()).map_err(|_| protocol(what))
            };
            let id = text(&e[0], "an id")?;
            let stored: Vec<u8> =
                redis::from_redis_value(e[1].clone()).map_err(|_| protocol("a value"))?;
            let attempt = u32::try_from(int(Some(&e[2]), "an attempt")?)
                .map_err(|_| protocol("an attempt"))?;
            let token = text(&e[3], "a token")?;
            let due = int(Some(&e[4]), "a due time")?;
            let deadline = due.max(now) + self.vis_ms as i64;
            let m = self.q.claimed(id, stored, attempt, token, deadline as u64);
            claims.push(Claimed { due, deadline, m });
        }
        Ok(ClaimReply {
            gate,
            now,
            next,
            claims,
        })
    }

    /// Sends a claim request (packed) again and reads what it claimed.
    pub(super) fn replay(&self, packed: &[u8]) -> Result<Vec<Claimed<T>>, Error> {
        let reply = self
            .q
            .rt()
            .run(&self.q.state.keys.delayed, Access::Write, |con| {
                redis::ConnectionLike::req_packed_command(con, packed)
            })?;
        Ok(self.parse_claims(&reply)?.claims)
    }

    /// Puts messages claimed ahead and never started back in `delayed` at
    /// their due time, now (shutdown).
    pub(super) fn give_back(&self, back: &[Claimed<T>]) -> Result<(), Error> {
        if back.is_empty() {
            return Ok(());
        }
        let keys = &self.q.state.keys;
        let record = self.st.lock().claim_req.key.clone();
        let key_list = ahead_keys(keys, &record);
        let n = self.q.rt().run(&keys.delayed, Access::Write, |con| {
            let mut inv = scripts::CLAIM_AHEAD.prepare_invoke();
            for k in key_list {
                inv.key(k);
            }
            inv.arg("r");
            for c in back {
                let (id, token) = id_token(c);
                inv.arg(id).arg(token).arg(c.due);
            }
            inv.invoke::<Value>(con)
        })?;
        let n = self.gave_back(&n)?;
        tracing::debug!(target: "redwheel::queue", queue = %self.q.state.name, given_back = n, "consumer: messages claimed ahead given back at shutdown");
        Ok(())
    }
}

/// A claimed message's id and the token of its claim.
fn id_token<T>(c: &Claimed<T>) -> (&str, &str) {
    match &c.m {
        Ok(d) => (d.id.as_str(), d.token.as_str()),
        Err(u) => (u.id.as_str(), u.token.as_str()),
    }
}

/// `claim_ahead.lua`'s keys, in its order, with the request's reply record.
fn ahead_keys<'a>(keys: &'a Keys, record: &'a str) -> [&'a str; 10] {
    [
        &keys.delayed,
        &keys.msg,
        &keys.inflight,
        &keys.lease,
        &keys.attempts,
        &keys.counts,
        record,
        &keys.head,
        &keys.controls,
        &keys.wake,
    ]
}
