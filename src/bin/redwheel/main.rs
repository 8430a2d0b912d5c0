//! The `redwheel` command-line tool: inspect and operate redwheel queues and
//! locks in Redis (the guide's "Operating it", `redwheel::guide::operating`).
//!
//! Exit codes: 0 done; 1 any other failure; 2 a usage error (arguments,
//! durations, names; checked before connecting); 3 Redis could not be
//! reached or refused us, or its URL is invalid; 4 not
//! found (a queue with no keys at all, an id `remove` did not find). Every
//! error is one line on stderr, `redwheel: <message>`.

mod args;
mod commands;
mod locks;
mod out;
mod queues;
mod schedules;
mod watch;
mod web;

use std::io::Write as _;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use redwheel::{ErrorKind, Redwheel, RedwheelOptions};

use crate::args::Cli;

/// Exit codes.
pub mod code {
    /// Any failure without a code of its own.
    pub const FAILURE: u8 = 1;
    /// Bad arguments (clap's own code for usage errors).
    pub const USAGE: u8 = 2;
    /// Redis could not be reached, or refused the connection.
    pub const CONNECTION: u8 = 3;
    /// The queue (no key at all) or a message id does not exist.
    pub const NOT_FOUND: u8 = 4;
}

/// Why the command failed: an exit code and one line for stderr.
#[derive(Debug)]
pub struct Failure {
    pub code: u8,
    pub message: String,
}

impl Failure {
    pub fn new(code: u8, message: impl Into<String>) -> Failure {
        Failure {
            code,
            message: message.into(),
        }
    }
}

impl From<redwheel::Error> for Failure {
    fn from(e: redwheel::Error) -> Failure {
        let code = match e.kind() {
            ErrorKind::Unavailable
            | ErrorKind::OutcomeUnknown
            | ErrorKind::Authentication
            | ErrorKind::Tls => code::CONNECTION,
            _ if e.is_invalid_input() => code::USAGE,
            _ => code::FAILURE,
        };
        Failure::new(code, e.to_string())
    }
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => {
            // --help, --version: clap prints them (exit 0).
            e.exit()
        }
        Err(e) => return fail(&Failure::new(code::USAGE, clap_message(&e))),
    };
    match run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => fail(&f),
    }
}

fn run(cli: &Cli) -> Result<(), Failure> {
    let rw = connect(cli)?;
    let result = commands::run(&rw, cli);
    // Background threads stop promptly; nothing of ours is pending.
    let _ = rw.shutdown(Duration::from_secs(2));
    result
}

/// Connects to `--cluster` seeds, or to the one server of `--url`.
fn connect(cli: &Cli) -> Result<Redwheel, Failure> {
    let options = RedwheelOptions::default().connect_timeout(Duration::from_secs(3));
    let result = if cli.cluster.is_empty() {
        Redwheel::connect_with(&cli.server_url(), options)
    } else {
        let seeds: Vec<&str> = cli.cluster.iter().map(String::as_str).collect();
        Redwheel::connect_cluster_with(&seeds, options)
    };
    // The library's message names the address (never the password).
    result.map_err(|e| Failure::new(code::CONNECTION, e.to_string()))
}

/// A clap error as one line: what was wrong, without the usage block.
fn clap_message(e: &clap::Error) -> String {
    use clap::error::ErrorKind as K;
    if matches!(
        e.kind(),
        K::DisplayHelpOnMissingArgumentOrSubcommand | K::MissingSubcommand
    ) {
        return "a command is needed: stats, peek, dead, requeue-dead, remove, offer, watch, limits, pause, resume, locks, schedules, schedule or web (see --help)".to_owned();
    }
    let text = e.to_string();
    let mut parts = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with("Usage:") || line.starts_with("For more information") {
            break;
        }
        if !line.is_empty() {
            parts.push(line.strip_prefix("error: ").unwrap_or(line).to_owned());
        }
    }
    format!("{} (see --help)", parts.join(" "))
}

fn fail(f: &Failure) -> ExitCode {
    let line = f.message.replace(['\n', '\r'], " ");
    let _ = writeln!(std::io::stderr(), "redwheel: {line}");
    ExitCode::from(f.code)
}
