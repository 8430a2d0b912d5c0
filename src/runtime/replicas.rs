//! Waiting for replicas: a write is confirmed by `WAIT replicas timeout`
//! on the connection that made it, so a failover to one of those replicas
//! keeps it. The option's limits, the command and what its answer means.

use std::time::Duration;

use super::conn::Conn;
use crate::error::{Error, ErrorKind};

/// Longest `WAIT` an option may ask for.
const MAX_WAIT: Duration = Duration::from_secs(60);

/// Room the command timeout must leave beside the `WAIT` for the write
/// itself.
const ROOM: Duration = Duration::from_millis(100);

/// Confirm writes on `replicas` replicas within `timeout`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WaitReplicas {
    pub(crate) replicas: u32,
    pub(crate) timeout: Duration,
}

impl WaitReplicas {
    /// Checks the option (`name` in messages): at least one replica, a
    /// timeout of 1 ms ..= 60 s that leaves room within `command_timeout`.
    pub(crate) fn check(&self, name: &str, command_timeout: Duration) -> Result<(), Error> {
        let bad = |why: String| {
            Err(Error::new(
                ErrorKind::InvalidOption,
                format!("invalid option `{name}`: {why}"),
            ))
        };
        if self.replicas == 0 || self.timeout < Duration::from_millis(1) || self.timeout > MAX_WAIT
        {
            return bad(format!(
                "{} replicas within {:?}: needs at least 1 replica and 1 ms ..= 60 s",
                self.replicas, self.timeout
            ));
        }
        if self.timeout + ROOM > command_timeout {
            return bad(format!(
                "a timeout of {:?} leaves no room within the command timeout of {command_timeout:?}",
                self.timeout
            ));
        }
        Ok(())
    }

    /// `WAIT`s on `con`, after a write on it: how many replicas have
    /// everything this connection wrote.
    pub(crate) fn wait(&self, con: &mut Conn) -> redis::RedisResult<i64> {
        self.command().query(con)
    }

    /// The `WAIT` command itself (sent after the write, on its connection).
    pub(crate) fn command(&self) -> redis::Cmd {
        let ms = u64::try_from(self.timeout.as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        let mut cmd = redis::cmd("WAIT");
        cmd.arg(self.replicas).arg(ms);
        cmd
    }

    /// [`confirmed`](WaitReplicas::confirmed) of `WAIT`'s reply, or its
    /// error (which confirms nothing).
    pub(crate) fn confirmed_reply(
        &self,
        acked: redis::RedisResult<i64>,
        what: &str,
    ) -> Result<(), Error> {
        acked
            .map_err(|e| Error::from_redis(e, crate::error::Access::Read))
            .and_then(|n| self.confirmed(n, what))
    }

    /// `Ok` if `acked` replicas are enough; else
    /// [`ErrorKind::NotReplicated`] saying how many confirmed `what`.
    pub(crate) fn confirmed(&self, acked: i64, what: &str) -> Result<(), Error> {
        if acked >= i64::from(self.replicas) {
            return Ok(());
        }
        Err(Error::new(
            ErrorKind::NotReplicated,
            format!(
                "{what} on the master, but only {acked} of the {} replicas asked for confirmed it within {:?}",
                self.replicas, self.timeout
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_and_answers() {
        let five = Duration::from_secs(5);
        let w = |replicas, ms| WaitReplicas {
            replicas,
            timeout: Duration::from_millis(ms),
        };
        assert!(w(1, 500).check("x", five).is_ok());
        for bad in [w(0, 500), w(1, 0), w(1, 61_000), w(1, 4_950)] {
            let e = bad.check("x", five).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidOption, "{bad:?}");
        }
        assert!(w(2, 10).confirmed(2, "written").is_ok());
        let e = w(2, 10).confirmed(1, "written").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotReplicated);
        assert!(e.to_string().contains("only 1 of the 2 replicas"), "{e}");
    }
}
