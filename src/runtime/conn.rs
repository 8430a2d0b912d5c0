//! What one connection is: [`Conn`], the one connection type the rest of
//! the crate uses. It implements [`redis::ConnectionLike`], so scripts and
//! pipelines run on it whatever it is connected to, and sends and reads
//! the driver's packed pipelines ([`Linger`] paces the reads of big ones).

use std::time::{Duration, Instant};

use redis::{ConnectionLike, Value};

/// Shortest wait handed to a socket (zero means "no timeout" there).
pub(super) const MIN_WAIT: Duration = Duration::from_millis(1);

pub(super) fn set_timeouts(
    con: &redis::Connection,
    io_timeout: Duration,
) -> redis::RedisResult<()> {
    let d = Some(io_timeout.max(MIN_WAIT));
    con.set_read_timeout(d)?;
    con.set_write_timeout(d)
}
/// A connection to Redis.
pub(crate) enum Conn {
    /// To one server.
    Node(redis::Connection),
}

impl Conn {
    /// Sets the read and write timeouts.
    pub(crate) fn set_io_timeout(&self, d: Duration) -> redis::RedisResult<()> {
        match self {
            Conn::Node(c) => set_timeouts(c, d),
        }
    }
}

impl Conn {
    /// Sends a pipeline of packed commands without reading the replies.
    pub(crate) fn send_pipeline(&mut self, bytes: &[u8]) -> redis::RedisResult<()> {
        match self {
            Conn::Node(c) => c.send_packed_command(bytes),
        }
    }

    /// Reads the `count` replies of a pipeline sent with
    /// [`send_pipeline`](Conn::send_pipeline): error replies as
    /// `Value::ServerError`, push messages skipped.
    pub(crate) fn recv_pipeline(&mut self, count: usize) -> redis::RedisResult<Vec<Value>> {
        let Conn::Node(c) = self;
        let mut out = Vec::with_capacity(count);
        while out.len() < count {
            match c.recv_response()? {
                Value::Push { .. } => {}
                v => out.push(v),
            }
        }
        Ok(out)
    }
}

/// Reads the replies of big pipelines in a few large reads instead of
/// hundreds of small ones.
///
/// Redis reads a pipeline 16 KiB at a time and answers each chunk as it
/// goes, so a reader blocked on the socket is woken for every few dozen
/// replies: for a sweep of 10,000 queues, a couple of hundred wake-ups,
/// which cost more CPU than parsing the replies. Before reading a big
/// pipeline's replies we sleep for most of the time the previous one took
/// Redis to answer; the last reply comes no later for it (every reply of
/// a round is handled once the last is in), but it comes with the others.
/// When the replies were all in by the time the sleep ended (we slept too
/// long: Redis got faster), the estimate is halved, so one slow round
/// does not keep later rounds waiting.
#[derive(Debug, Default)]
pub(crate) struct Linger {
    /// How long the last big pipeline took Redis to answer (an estimate).
    last: Duration,
    /// The sleep before reading the current pipeline, and when it ended.
    woke: Option<(Duration, Instant)>,
}

impl Linger {
    /// Pipelines shorter than this are read at once.
    const MIN_COMMANDS: usize = 512;
    /// The longest sleep before reading.
    const MAX: Duration = Duration::from_millis(250);

    /// Call after sending pipelines of at most `count` commands, before
    /// reading their replies: sleeps if they are big.
    pub(crate) fn before_reading(&mut self, count: usize) {
        self.woke = None;
        if count >= Self::MIN_COMMANDS {
            let nap = (self.last * 3 / 4).min(Self::MAX);
            if !nap.is_zero() {
                std::thread::sleep(nap);
                self.woke = Some((nap, Instant::now()));
            }
        }
    }

    /// Call once the replies of pipelines of at most `count` commands,
    /// sent at `sent`, are all in.
    pub(crate) fn answered(&mut self, count: usize, sent: Instant) {
        if count < Self::MIN_COMMANDS {
            return;
        }
        self.last = match self.woke.take() {
            // Reading took a small part of the sleep: the replies were in
            // when we woke, so the answer time is below the sleep, by how
            // much is unknown.
            Some((nap, woke)) if woke.elapsed() < nap / 4 => self.last / 2,
            _ => sent.elapsed(),
        };
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command(&mut self, cmd: &[u8]) -> redis::RedisResult<Value> {
        match self {
            Conn::Node(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands(
        &mut self,
        cmd: &[u8],
        offset: usize,
        count: usize,
    ) -> redis::RedisResult<Vec<Value>> {
        match self {
            Conn::Node(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Node(c) => c.get_db(),
        }
    }

    fn check_connection(&mut self) -> bool {
        match self {
            Conn::Node(c) => c.check_connection(),
        }
    }

    fn is_open(&self) -> bool {
        match self {
            Conn::Node(c) => c.is_open(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slow_round_does_not_keep_later_rounds_sleeping() {
        let mut l = Linger {
            last: Duration::from_secs(1),
            woke: None,
        };
        // Redis now answers at once: each round finds every reply in
        // when it wakes, so the sleep halves round after round.
        let mut naps = Vec::new();
        for _ in 0..6 {
            let sent = Instant::now();
            l.before_reading(Linger::MIN_COMMANDS);
            naps.push(l.woke.map(|(nap, _)| nap).unwrap_or_default());
            l.answered(Linger::MIN_COMMANDS, sent);
        }
        assert_eq!(naps[0], Linger::MAX);
        assert!(naps.windows(2).skip(2).all(|w| w[1] < w[0]), "{naps:?}");
        assert!(naps[5] < Duration::from_millis(100), "{naps:?}");
    }

    #[test]
    fn small_pipelines_are_read_at_once() {
        let mut l = Linger {
            last: Duration::from_secs(1),
            woke: None,
        };
        let sent = Instant::now();
        l.before_reading(Linger::MIN_COMMANDS - 1);
        assert!(l.woke.is_none());
        l.answered(Linger::MIN_COMMANDS - 1, sent);
        assert_eq!(l.last, Duration::from_secs(1));
    }
}
