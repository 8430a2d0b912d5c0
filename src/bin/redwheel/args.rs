//! The command line: global options, subcommands, and the duration syntax.

use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// Inspect and operate redwheel queues and locks in Redis.
#[derive(Debug, Parser)]
#[command(name = "redwheel", version, color = clap::ColorChoice::Never)]
pub struct Cli {
    /// Redis URL (default: $REDIS_URL, else redis://127.0.0.1:6379).
    #[arg(long, global = true, value_name = "URL")]
    pub url: Option<String>,

    /// Redis Cluster seed URLs, comma-separated or repeated (instead of --url).
    #[arg(long, global = true, value_name = "URL,…", value_delimiter = ',')]
    pub cluster: Vec<String>,

    /// Print one JSON document instead of tables.
    #[arg(long, global = true)]
    pub json: bool,

    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    /// The single-server URL: `--url`, else `$REDIS_URL`, else the local default.
    pub fn server_url(&self) -> String {
        self.url
            .clone()
            .or_else(|| std::env::var("REDIS_URL").ok().filter(|u| !u.is_empty()))
            .unwrap_or_else(|| "redis://127.0.0.1:6379".to_owned())
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Counts per state of the named queues, or of every queue found by SCAN.
    Stats {
        /// Queue names (default: every queue in Redis).
        #[arg(value_parser = queue_name)]
        queues: Vec<String>,
    },
    /// The first messages of one state of a queue, with their payloads.
    Peek {
        /// The queue.
        #[arg(value_parser = queue_name)]
        queue: String,
        #[command(flatten)]
        state: StateArg,
        /// How many messages.
        #[arg(short = 'n', long = "count", default_value_t = 10, value_name = "N")]
        n: usize,
    },
    /// Dead letters: why they died, after how many attempts, and when.
    Dead {
        /// The queue.
        #[arg(value_parser = queue_name)]
        queue: String,
        /// How many dead letters (oldest first).
        #[arg(short = 'n', long = "count", default_value_t = 10, value_name = "N")]
        n: usize,
    },
    /// Makes the oldest dead letters ready again, with a fresh attempt count.
    RequeueDead {
        /// The queue.
        #[arg(value_parser = queue_name)]
        queue: String,
        /// How many dead letters (oldest first).
        #[arg(short = 'n', long = "count", default_value_t = 10, value_name = "N")]
        n: usize,
    },
    /// Deletes messages by id, wherever they are (delayed, ready, in flight, dead).
    Remove {
        /// The queue.
        #[arg(value_parser = queue_name)]
        queue: String,
        /// Message ids.
        #[arg(required = true)]
        ids: Vec<String>,
    },
    /// Offers one message (the payload's bytes as given) after a delay.
    Offer {
        /// The queue.
        #[arg(value_parser = queue_name)]
        queue: String,
        /// The payload.
        payload: String,
        /// Delay: 500ms, 10s, 5m, 1h, or a bare number of seconds.
        #[arg(long, default_value = "0", value_parser = parse_duration, value_name = "DURATION")]
        delay: Duration,
    },
    /// A live view: backlog per state, delivery rate, ready-age p50/p99.
    Watch {
        /// Queue names (default: every queue in Redis).
        #[arg(value_parser = queue_name)]
        queues: Vec<String>,
        /// Time between two frames (and the rate's window).
        #[arg(long, default_value = "1s", value_parser = parse_interval, value_name = "DURATION")]
        interval: Duration,
        /// Print one frame (after one interval, for the rate) and exit.
        #[arg(long)]
        once: bool,
    },
    /// A queue's controls (pause, rate limit, max in flight, max length); with options, changes them for every process first.
    Limits {
        /// The queue.
        #[arg(value_parser = queue_name)]
        queue: String,
        /// Sets the rate limit: at most MAX deliveries in any window of DURATION (e.g. 100/1s).
        #[arg(long, value_parser = parse_rate, value_name = "MAX/DURATION")]
        rate: Option<(u32, Duration)>,
        /// Sets the most claims in flight (claimed, not yet acked) across all consumers.
        #[arg(long = "max-in-flight", value_name = "N")]
        max_in_flight: Option<u64>,
        /// Sets the most messages the queue holds (delayed, ready, in flight); offers beyond fail.
        #[arg(long = "max-len", value_name = "N")]
        max_len: Option<u64>,
        /// Lifts a limit (repeat for more).
        #[arg(long, value_enum, value_name = "LIMIT")]
        lift: Vec<LiftArg>,
    },
    /// Pauses a queue: offers and transfers go on, nothing is handed out until resume.
    Pause {
        /// The queue.
        #[arg(value_parser = queue_name)]
        queue: String,
    },
    /// Resumes a paused queue; waiting consumers are woken.
    Resume {
        /// The queue.
        #[arg(value_parser = queue_name)]
        queue: String,
    },
    /// Held locks: holder, hold count, lease left, fencing token.
    Locks {
        /// A Redis glob over lock names (default: every lock).
        #[arg(default_value = "*")]
        pattern: String,
    },
    /// Serves the web dashboard until interrupted (the guide's "The dashboard").
    Web(WebArgs),
    /// The recurring schedules of a queue: definition, next runs, last fired, paused.
    Schedules {
        /// The queue.
        #[arg(value_parser = queue_name)]
        queue: String,
        /// How many next runs to show per schedule.
        #[arg(short = 'n', long = "next", default_value_t = 3, value_name = "N")]
        next: usize,
    },
    /// Changes a recurring schedule of a queue: set, remove (unschedule), pause, resume.
    #[command(subcommand)]
    Schedule(ScheduleCommand),
}

/// `redwheel schedule …`.
#[derive(Debug, Subcommand)]
pub enum ScheduleCommand {
    /// Creates or replaces a schedule (the same definition and payload change nothing).
    Set {
        /// The queue.
        #[arg(value_parser = queue_name)]
        queue: String,
        /// The schedule's name within the queue.
        name: String,
        /// The payload each occurrence carries (its bytes as given).
        payload: String,
        /// A fixed period: 500ms, 10s, 5m, 1h, or a bare number of seconds.
        #[arg(long, value_parser = parse_duration, value_name = "DURATION", conflicts_with = "cron", required_unless_present = "cron")]
        every: Option<Duration>,
        /// A cron expression (5 fields, or 6 with seconds first), e.g. '0 3 * * *'.
        #[arg(long, value_parser = cron_expr, value_name = "EXPR")]
        cron: Option<String>,
        /// The IANA time zone the cron expression is read in (default UTC).
        #[arg(long = "tz", value_parser = time_zone, value_name = "ZONE", requires = "cron")]
        tz: Option<String>,
        /// What to fire for occurrences missed while nothing ran: skip, latest, or all:N.
        #[arg(long = "catch-up", value_parser = catch_up, value_name = "POLICY", default_value = "latest")]
        catch_up: redwheel::schedule::CatchUp,
    },
    /// Deletes a schedule (occurrences already offered stay in the queue).
    #[command(visible_alias = "unschedule")]
    Remove {
        /// The queue.
        #[arg(value_parser = queue_name)]
        queue: String,
        /// The schedule's name.
        name: String,
    },
    /// Pauses a schedule (what falls while it is paused is not owed).
    Pause {
        /// The queue.
        #[arg(value_parser = queue_name)]
        queue: String,
        /// The schedule's name.
        name: String,
    },
    /// Resumes a paused schedule from its next occurrence.
    Resume {
        /// The queue.
        #[arg(value_parser = queue_name)]
        queue: String,
        /// The schedule's name.
        name: String,
    },
}

/// A cron expression, checked as the library checks it.
fn cron_expr(s: &str) -> Result<String, String> {
    redwheel::schedule::Schedule::cron(s)
        .map(|_| s.to_owned())
        .map_err(|e| e.to_string())
}

/// An IANA time zone the bundled database knows.
fn time_zone(s: &str) -> Result<String, String> {
    redwheel::schedule::Schedule::cron("* * * * *")
        .and_then(|c| c.time_zone(s))
        .map(|_| s.to_owned())
        .map_err(|e| e.to_string())
}

/// `skip`, `latest` or `all:N`.
fn catch_up(s: &str) -> Result<redwheel::schedule::CatchUp, String> {
    use redwheel::schedule::{CatchUp, MAX_CATCH_UP};
    match s {
        "skip" => Ok(CatchUp::Skip),
        "latest" => Ok(CatchUp::Latest),
        _ => s
            .strip_prefix("all:")
            .and_then(|n| n.parse::<u32>().ok())
            .filter(|n| (1..=MAX_CATCH_UP).contains(n))
            .map(|max| CatchUp::All { max })
            .ok_or_else(|| {
                format!("`{s}` is not a catch-up policy: use skip, latest or all:N (N from 1 to {MAX_CATCH_UP})")
            }),
    }
}

/// `redwheel web`'s options.
#[derive(Debug, Args)]
pub struct WebArgs {
    /// Address to listen on (loopback unless told otherwise).
    #[arg(long, default_value = "127.0.0.1:7780", value_name = "HOST:PORT")]
    pub listen: String,
    /// Actions need `Authorization: Bearer <TOKEN>` (the page asks for it).
    #[arg(
        long,
        env = "REDWHEEL_WEB_TOKEN",
        value_name = "TOKEN",
        hide_env_values = true
    )]
    pub token: Option<String>,
    /// Refuse every action and show no action button.
    #[arg(long)]
    pub read_only: bool,
    /// A host name requests may give in `Host` besides the listening
    /// address (a proxy's name, this machine's); any other is refused
    /// (DNS rebinding). Repeatable.
    #[arg(long = "allow-host", value_name = "NAME")]
    pub allow_hosts: Vec<String>,
}

/// Which state `peek` lists (one of; ready by default).
#[derive(Debug, Args)]
#[group(multiple = false)]
pub struct StateArg {
    /// Due messages waiting for a consumer (the default).
    #[arg(long)]
    pub ready: bool,
    /// Messages not yet due.
    #[arg(long)]
    pub delayed: bool,
    /// Claimed messages not yet acked.
    #[arg(long)]
    pub inflight: bool,
    /// Dead letters.
    #[arg(long)]
    pub dead: bool,
}

/// A limit `limits --lift` removes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LiftArg {
    /// The rate limit.
    Rate,
    /// The bound on claims in flight.
    MaxInFlight,
    /// The bound on the queue's length.
    MaxLen,
}

/// A rate limit, `MAX/DURATION` (`100/1s`, `5/500ms`).
fn parse_rate(s: &str) -> Result<(u32, Duration), String> {
    let bad = || format!("`{s}` is not a rate: use MAX/DURATION, e.g. 100/1s");
    let (max, per) = s.split_once('/').ok_or_else(bad)?;
    let max: u32 = max.trim().parse().map_err(|_| bad())?;
    let per = parse_duration(per)?;
    if max == 0 || per.is_zero() {
        return Err(format!("`{s}`: the rate needs MAX and DURATION above 0"));
    }
    Ok((max, per))
}

/// A queue name, checked as the library checks it (before connecting, so
/// a bad name is a usage error whether Redis is up or not).
fn queue_name(s: &str) -> Result<String, String> {
    redwheel::queue::validate_name(s)
        .map(|()| s.to_owned())
        .map_err(|e| e.to_string())
}

/// `watch`'s interval: a duration, not zero.
fn parse_interval(s: &str) -> Result<Duration, String> {
    match parse_duration(s)? {
        d if d.is_zero() => Err("the interval must be more than 0".to_owned()),
        d => Ok(d),
    }
}

/// `500ms`, `10s`, `5m`, `1h`, or a bare number of seconds (`30`); whole
/// numbers only.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let digits = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(digits);
    let bad = || format!("`{s}` is not a duration: use 500ms, 10s, 5m, 1h or a number of seconds");
    let n: u64 = num.parse().map_err(|_| bad())?;
    let ms_per = match unit {
        "ms" => 1,
        "" | "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => return Err(bad()),
    };
    n.checked_mul(ms_per)
        .map(Duration::from_millis)
        .ok_or_else(|| format!("`{s}` is too long a duration"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_the_documented_units() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("10"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        for bad in [
            "",
            "s",
            "1.5s",
            "-1s",
            "10x",
            "1 d",
            "99999999999999999999h",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn rates_are_max_over_a_duration() {
        assert_eq!(parse_rate("100/1s"), Ok((100, Duration::from_secs(1))));
        assert_eq!(parse_rate("5/500ms"), Ok((5, Duration::from_millis(500))));
        for bad in ["", "100", "/1s", "0/1s", "5/0s", "5/1x", "-1/1s"] {
            assert!(parse_rate(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn catch_up_policies_are_skip_latest_or_all_n() {
        use redwheel::schedule::CatchUp;
        assert_eq!(catch_up("skip"), Ok(CatchUp::Skip));
        assert_eq!(catch_up("latest"), Ok(CatchUp::Latest));
        assert_eq!(catch_up("all:3"), Ok(CatchUp::All { max: 3 }));
        for bad in ["", "all", "all:0", "all:x", "all:10001", "Latest"] {
            assert!(catch_up(bad).is_err(), "{bad:?} was accepted");
        }
        assert!(cron_expr("0 3 * * *").is_ok());
        assert!(cron_expr("0 25 * * *").is_err());
        assert!(time_zone("Europe/Berlin").is_ok());
        assert!(time_zone("Mars/Olympus").is_err());
    }

    #[test]
    fn the_command_line_is_well_formed() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
