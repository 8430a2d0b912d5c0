//! Running one command (or script) on the master that serves its slot:
//! following `MOVED` (to the master it names, at once) and `ASK`, waiting
//! out `TRYAGAIN`, `CLUSTERDOWN` and a failover within the command
//! timeout, never resending a command that may have been applied.

use std::time::{Duration, Instant};

use super::slot_map::{Cluster, Node};
use crate::error::{Access, Error};
use crate::runtime::backoff::Backoff;
use crate::runtime::conn::Conn;
use crate::runtime::keyslot::slot;
use crate::runtime::pool::TryRunError;

/// Most redirects one command follows.
const MAX_REDIRECTS: usize = 16;
impl Cluster {
    /// Runs `f` on a connection to the master serving `route`'s slot,
    /// following `MOVED` (to the master it names, which serves the slot
    /// from then on; the rest of the map is refreshed in the background)
    /// and `ASK` (with `ASKING`), and waiting out `TRYAGAIN`, `CLUSTERDOWN`
    /// and an unreachable master (a failover) on the reconnect backoff,
    /// within `command_timeout` in all. A command that may have been
    /// applied is never retried.
    pub(crate) fn run<R>(
        &self,
        route: &[u8],
        access: Access,
        mut f: impl FnMut(&mut Conn) -> redis::RedisResult<R>,
    ) -> Result<R, Error> {
        let started = Instant::now();
        let budget = self.options.command_timeout;
        let mut backoff = Backoff::new(self.options.reconnect_min, self.options.reconnect_max);
        let mut ask: Option<String> = None;
        let mut redirects = 0;
        loop {
            let asking = ask.take();
            let node = match &asking {
                Some(addr) => self.node(addr)?,
                None => match self.node_for(route) {
                    Ok(n) => n,
                    Err(e) if e.is_transient() && wait(&mut backoff, started, budget) => {
                        self.request_refresh();
                        continue;
                    }
                    Err(e) => return Err(e),
                },
            };
            let result = if asking.is_some() {
                node.commands.try_run(|con| {
                    redis::cmd("ASKING").query::<()>(con)?;
                    f(con)
                })
            } else {
                // A read is sent again once when its pooled connection
                // turns out to have died while idle (the server closed it:
                // CLIENT KILL, its `timeout`): the node answers, it is not
                // down.
                node.commands.try_run_as(access, &mut f)
            };
            let e = match result {
                Ok(r) => {
                    node.mark_up();
                    return Ok(r);
                }
                Err(TryRunError::NotSent(e)) => {
                    // The master cannot be reached: maybe failing over.
                    if e.is_transient() {
                        node.mark_down(&e);
                    }
                    self.request_refresh();
                    if e.is_transient() && wait(&mut backoff, started, budget) {
                        continue;
                    }
                    return Err(e);
                }
                Err(TryRunError::Failed(e)) => e,
            };
            match step_after(&e) {
                Step::Ask(addr) if redirects < MAX_REDIRECTS => {
                    redirects += 1;
                    ask = Some(node.redirected_to(&addr));
                    continue;
                }
                Step::Moved(addr) if redirects < MAX_REDIRECTS => {
                    redirects += 1;
                    self.moved(slot(route), &node.redirected_to(&addr));
                    continue;
                }
                Step::Wait { refresh } if wait(&mut backoff, started, budget) => {
                    if refresh {
                        self.request_refresh();
                    }
                    continue;
                }
                _ => {}
            }
            let unreachable = e.is_io_error() || e.is_connection_dropped() || e.is_timeout();
            let e = Error::from_redis(e, access);
            if unreachable {
                node.mark_down(&e);
                self.request_refresh();
            }
            return Err(e);
        }
    }
}

/// What a command that failed with an error on a cluster calls for next.
/// The one table of it: the synchronous [`Cluster::run`] and the async
/// calls (`runtime/mux/call.rs`) both follow it.
pub(crate) enum Step {
    /// Ask this node once (after `ASKING`): the slot is migrating.
    Ask(String),
    /// The slot moved for good, to the master at this address (as the
    /// reply names it: see [`redirect_target`]): route it there from now
    /// on and refresh the rest of the map meanwhile.
    Moved(String),
    /// The slot or its master is busy (`TRYAGAIN`, `CLUSTERDOWN`,
    /// `MASTERDOWN`, `LOADING`): wait on the backoff and send again (it
    /// was not applied); `refresh`: the map may have changed too.
    Wait { refresh: bool },
    /// Final for this call.
    Fail,
}

/// What to do after `e` (an error reply or a failed connection).
pub(crate) fn step_after(e: &redis::RedisError) -> Step {
    use redis::ServerErrorKind as S;
    if let Some(to) = redirect(e) {
        return match to {
            Redirect::Ask(addr) => Step::Ask(addr),
            Redirect::Moved(addr) => Step::Moved(addr),
        };
    }
    match e.kind() {
        redis::ErrorKind::Server(S::TryAgain) => Step::Wait { refresh: false },
        redis::ErrorKind::Server(S::ClusterDown | S::MasterDown | S::BusyLoading) => {
            Step::Wait { refresh: true }
        }
        _ => Step::Fail,
    }
}

/// Sleeps for the backoff's next wait if the budget allows; false if not.
fn wait(backoff: &mut Backoff, started: Instant, budget: Duration) -> bool {
    let left = budget.saturating_sub(started.elapsed());
    if left.is_zero() {
        return false;
    }
    std::thread::sleep(backoff.step().min(left));
    true
}

impl Node {
    /// The `host:port` a redirect from this node names.
    pub(super) fn redirected_to(&self, addr: &str) -> String {
        redirect_target(&self.addr, addr)
    }
}

/// The `host:port` a redirect from the node at `from` names: `to`, with
/// `from`'s host when the reply names none (`:port`, from a node that does
/// not know its own address).
pub(crate) fn redirect_target(from: &str, to: &str) -> String {
    match to.strip_prefix(':') {
        Some(port) => {
            let host = from.rsplit_once(':').map_or(from, |(h, _)| h);
            format!("{host}:{port}")
        }
        None => to.to_owned(),
    }
}

/// Where a `MOVED` or `ASK` error sends a command.
pub(super) enum Redirect {
    /// The slot moved for good, to the master at this address: route it
    /// there from now on (and refresh the rest of the map meanwhile).
    Moved(String),
    /// Ask this node once (after `ASKING`): the slot is migrating.
    Ask(String),
}

/// The redirect in `e`, if it is one (the `redis` crate parses it, for
/// direct calls and pipelined replies alike).
pub(super) fn redirect(e: &redis::RedisError) -> Option<Redirect> {
    let (addr, _) = e.redirect_node()?;
    Some(
        if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::Ask) {
            Redirect::Ask(addr.to_owned())
        } else {
            Redirect::Moved(addr.to_owned())
        },
    )
}
