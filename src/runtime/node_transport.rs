//! The driver's transport on one server: one connection, opened lazily,
//! dropped when it fails, re-opened by the next round (the driver paces the
//! retries).

use std::time::{Duration, Instant};

use redis::{ConnectionLike, Value};

use super::conn::{Conn, Linger};
use super::driver::{Commands, Transport};
use super::endpoint::Endpoint;
use super::server_clock::{ClockSample, measure};
use crate::error::{Access, Error};

/// The driver's connection to one server: opened lazily, dropped when it
/// fails, re-opened by the next round (the driver paces the retries).
pub(crate) struct NodeTransport {
    endpoint: std::sync::Arc<Endpoint>,
    io_timeout: Duration,
    con: Option<Conn>,
    connects: u64,
    round_trips: u64,
    linger: Linger,
}

impl NodeTransport {
    pub(crate) fn new(endpoint: std::sync::Arc<Endpoint>, io_timeout: Duration) -> NodeTransport {
        NodeTransport {
            endpoint,
            io_timeout,
            con: None,
            connects: 0,
            round_trips: 0,
            linger: Linger::default(),
        }
    }

    fn con(&mut self) -> Result<&mut Conn, Error> {
        if self.con.is_none() {
            self.con = Some(self.endpoint.open(self.io_timeout)?);
            self.connects += 1;
        }
        Ok(self.con.as_mut().expect("just opened"))
    }
}

impl Transport for NodeTransport {
    fn round_trip(&mut self, commands: &Commands) -> Result<Vec<Value>, Error> {
        self.round_trips += 1;
        self.con()?;
        let con = self.con.as_mut().expect("opened above");
        let n = commands.len();
        let result = con.send_pipeline(commands.bytes()).and_then(|()| {
            let sent = Instant::now();
            self.linger.before_reading(n);
            let replies = con.recv_pipeline(n)?;
            self.linger.answered(n, sent);
            Ok(replies)
        });
        match result {
            Ok(replies) => Ok(replies),
            Err(e) => {
                self.con = None;
                Err(Error::from_redis(e, Access::Write))
            }
        }
    }

    fn server_of(&self, _command: usize) -> Option<usize> {
        Some(0)
    }

    fn load_script(&mut self, script: &redis::Script, _server: usize) -> Result<(), Error> {
        let con = self.con()?;
        match script.load(con) {
            Ok(_) => Ok(()),
            Err(e) => {
                if !con.is_open() {
                    self.con = None;
                }
                Err(Error::from_redis(e, Access::Read))
            }
        }
    }

    fn connects(&self) -> u64 {
        self.connects
    }

    fn round_trips(&self) -> u64 {
        self.round_trips
    }

    fn measure_clock(&mut self, now: &dyn Fn() -> Duration) -> Option<ClockSample> {
        let con = self.con.as_mut()?;
        match measure(con, now) {
            Ok(sample) => Some(sample),
            Err(e) => {
                tracing::debug!(target: "redwheel::runtime", error = %e, "could not measure the server clock");
                self.con = None;
                None
            }
        }
    }
}
