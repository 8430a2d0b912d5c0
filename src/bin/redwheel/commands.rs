//! The subcommands: which module runs each. Reads go through
//! `redwheel::queue::inspect` and `redwheel::lock::inspect` (which do not
//! open a queue, so no transfer job runs in this process); changes go
//! through the queue API.

use redwheel::Redwheel;

use crate::Failure;
use crate::args::{Cli, Command};
use crate::queues::{dead, limits, offer, pause, peek, remove, requeue_dead, state_of, stats};
use crate::{locks, schedules, watch};

pub fn run(rw: &Redwheel, cli: &Cli) -> Result<(), Failure> {
    let json = cli.json;
    match &cli.command {
        Command::Stats { queues } => stats(rw, queues, json),
        Command::Peek { queue, state, n } => peek(rw, queue, state_of(state), *n, json),
        Command::Dead { queue, n } => dead(rw, queue, *n, json),
        Command::RequeueDead { queue, n } => requeue_dead(rw, queue, *n, json),
        Command::Remove { queue, ids } => remove(rw, queue, ids, json),
        Command::Offer {
            queue,
            payload,
            delay,
        } => offer(rw, queue, payload, *delay, json),
        Command::Watch {
            queues,
            interval,
            once,
        } => watch::watch(rw, queues, *interval, *once, json),
        Command::Limits {
            queue,
            rate,
            max_in_flight,
            max_len,
            lift,
        } => limits(rw, queue, (*rate, *max_in_flight, *max_len), lift, json),
        Command::Pause { queue } => pause(rw, queue, true, json),
        Command::Resume { queue } => pause(rw, queue, false, json),
        Command::Locks { pattern } => locks::locks(rw, pattern, json),
        Command::Web(args) => crate::web::serve(rw, args, json),
        Command::Schedules { queue, next } => schedules::list(rw, queue, *next, json),
        Command::Schedule(c) => schedules::change(rw, c, json),
    }
}
