//! The chaos run: queues and locks under every fault at once, with exact
//! accounting at the end.
//!
//! ```sh
//! cargo run --release --example chaos -- --minutes 3             # one node
//! cargo run --release --example chaos -- --minutes 3 --cluster   # a local 3+3 cluster
//! ```
//!
//! For `--minutes N` (`--seed S` repeats a run's choices), while
//!
//! * two producers offer messages under ids of their own (`p<k>-<n>`,
//!   single offers and batches, delays of 0 to 3 s), retrying an offer
//!   that failed with a transient error under the same ids until its
//!   outcome is known;
//! * three consumer processes (this example re-executed with
//!   `--role consumer`) claim and ack, logging each message they handle
//!   before they ack it;
//! * three lock holders take one lock in turn and write under its fencing
//!   token to a store that refuses stale tokens
//!   (`examples/support/fenced_store.rs`);
//!
//! it injects, at random moments (seeded): the proxy's faults
//! (`tests/support/proxy.rs`, between every client and Redis: replies
//! lost after the command ran, replies cut midway, replies delayed past
//! the command timeout, Redis unreachable for a while, every connection
//! reset); Redis killed with SIGKILL and restarted (one node, append-only
//! file with `appendfsync always`); consumer processes killed with
//! SIGKILL and started again (half of them pools claiming up to 2 s ahead,
//! so claims made ahead are lost with their process); and with `--cluster`, a master failover
//! (the master of the queue's or the lock's slot killed, its replica
//! promoted, the old master restarted as a replica; offers wait for one
//! replica with `wait_replicas`).
//!
//! Then the faults stop, producers stop, the consumers drain the queue,
//! and it prints:
//!
//! * offered: ids whose offer returned `Ok` (after any retries);
//! * acknowledged: offered ids whose ack returned `Ok` (logged by the
//!   consumers that claim by hand; every other consumer process is a
//!   `consume` pool with `claim_ahead`, whose acks are its own);
//! * lost (must be 0): offered ids no consumer ever handled and that are
//!   no longer in Redis (not delayed, ready, in flight or dead);
//! * delivered early (must be 0): handlings before the message's due
//!   time (the producer's clock before the offer plus the delay; the
//!   server runs on this machine, so this is a lower bound of the due
//!   time Redis computed);
//! * duplicates (allowed by at-least-once, counted): handlings beyond the
//!   first of each id;
//! * overlapping critical sections accepted by the store (must be 0).
//!
//! * unlocks answered `Ok` although another holder had taken the lock
//!   from under its holder (must be 0; counted at the fenced store: a
//!   holder holds from its section's opening until its unlock answered,
//!   and another holder opening a section before that unlock began means
//!   the lock changed hands under it, so its unlock must say `LockLost`).
//!
//! It exits with status 1 if a must-be-0 count is not 0.
//!
//! `--unlocks` is the mode for the unlock's promise: locks only (no
//! producers or consumers), Redis **without persistence**, restarted
//! every 5 to 15 s (one node: SIGKILL and restart, empty; a cluster: the
//! lock's master killed and either restarted at once, empty, before its
//! replica takes over, or failed over), and the proxy's faults aimed
//! mostly at the lock's release, whose reply is lost after it ran. So the
//! lock changes hands under its holders, and their unlocks are resent
//! after lost replies. Built with `--features async`, two of the holders
//! are futures (`try_lock_async`, `unlock_async`). Every unlock that
//! answered `Ok` must have released its own hold:
//!
//! ```sh
//! cargo run --release --features async --example chaos -- --minutes 3 --unlocks
//! cargo run --release --features async --example chaos -- --minutes 3 --unlocks --cluster
//! ```

use std::collections::{HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redwheel::{ConsumerOptions, ErrorKind, MessageId, QueueOptions, Redwheel, RedwheelOptions};

#[path = "support/chaos_locks.rs"]
mod chaos_locks;
#[path = "support/fenced_store.rs"]
mod fenced_store;
#[path = "../tests/support/proxy.rs"]
mod proxy;
#[path = "support/splitmix.rs"]
mod splitmix;
#[path = "support/throwaway_cluster.rs"]
mod throwaway_cluster;
#[path = "support/throwaway_redis.rs"]
mod throwaway_redis;

use chaos_locks::{Holders, LOCK, LockCounters};
use fenced_store::{FencedStore, StoreReport};
use proxy::{Fault, Proxy, Rule};
use splitmix::SplitMix64;
use throwaway_cluster::ThrowawayCluster;
use throwaway_redis::ThrowawayRedis;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const QUEUE: &str = "chaos";
const PRODUCERS: u64 = 2;
const CONSUMERS: usize = 3;
const LOCK_HOLDERS: u64 = 3;
/// With the `async` feature, holders that take the lock with
/// `try_lock_async` and unlock with `unlock_async`.
#[cfg(feature = "async")]
const ASYNC_LOCK_HOLDERS: u64 = 2;
const MAX_DELAY_MS: u64 = 3_000;
/// A killed consumer's claims come back after this.
const VISIBILITY: Duration = Duration::from_secs(2);
const COMMAND_TIMEOUT: Duration = Duration::from_secs(1);

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = if arg(&args, "--role").as_deref() == Some("consumer") {
        consumer(&args)
    } else {
        run(&args)
    };
    match result {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("chaos: {e}");
            std::process::exit(2);
        }
    }
}

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn options() -> RedwheelOptions {
    RedwheelOptions::default()
        .command_timeout(COMMAND_TIMEOUT)
        .connect_timeout(Duration::from_millis(500))
        .max_block(Duration::from_millis(200))
}

fn connect(urls: &[String], cluster: bool) -> Result<Redwheel, redwheel::Error> {
    if cluster {
        let seeds: Vec<&str> = urls.iter().map(String::as_str).collect();
        Redwheel::connect_cluster_with(&seeds, options())
    } else {
        Redwheel::connect_with(&urls[0], options())
    }
}

/// Connects, retrying while Redis is unreachable (a fault may be on).
fn connect_retrying(urls: &[String], cluster: bool) -> Result<Redwheel, BoxError> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match connect(urls, cluster) {
            Ok(rw) => return Ok(rw),
            Err(e) if e.is_transient() && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50))
            }
            Err(e) => return Err(e.into()),
        }
    }
}

fn queue_options(cluster: bool) -> QueueOptions {
    let o = QueueOptions::default()
        .visibility(VISIBILITY)
        .max_deliveries(1_000_000);
    if cluster {
        o.wait_replicas(1, Duration::from_millis(500))
    } else {
        o
    }
}

// ---------------------------------------------------------------------
// The consumer process.

/// `--role consumer --urls U,U… --log PATH [--cluster]`: claims and acks
/// until killed, appending to its log `H <id> <ms>` when it handles a
/// message (before the ack), `A <id> <ms>` once the ack returned `Ok`,
/// `S <id>` when the ack found the delivery stale.
fn consumer(args: &[String]) -> Result<bool, BoxError> {
    let urls: Vec<String> = arg(args, "--urls")
        .ok_or("--urls")?
        .split(',')
        .map(str::to_owned)
        .collect();
    let cluster = args.iter().any(|a| a == "--cluster");
    let mut log = OpenOptions::new()
        .create(true)
        .append(true)
        .open(arg(args, "--log").ok_or("--log")?)?;
    let rw = connect_retrying(&urls, cluster)?;
    let q = rw.queue_with::<String>(QUEUE, queue_options(cluster))?;
    if args.iter().any(|a| a == "--ahead") {
        return consume_ahead(&q, log);
    }
    loop {
        let batch = match q.claim_batch(8, Duration::from_millis(500)) {
            Ok(b) => b,
            Err(e) => {
                log.write_all(format!("E claim {}\n", e.kind()).as_bytes())?;
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
        };
        for d in batch {
            // One write per line (O_APPEND): a kill never tears a line.
            log.write_all(format!("H {} {}\n", d.id(), now_ms()).as_bytes())?;
            let started = Instant::now();
            loop {
                match d.ack() {
                    Ok(()) => {
                        log.write_all(format!("A {} {}\n", d.id(), now_ms()).as_bytes())?;
                        break;
                    }
                    Err(e) if e.kind() == ErrorKind::StaleDelivery => {
                        log.write_all(format!("S {}\n", d.id()).as_bytes())?;
                        break;
                    }
                    // An ack is idempotent: retry until its outcome is known.
                    Err(e) if e.is_transient() && started.elapsed() < Duration::from_secs(30) => {
                        std::thread::sleep(Duration::from_millis(20))
                    }
                    Err(e) => {
                        log.write_all(format!("E ack {}\n", e.kind()).as_bytes())?;
                        break;
                    }
                }
            }
        }
    }
}

/// `--ahead`: a consumer pool that claims up to 2 s ahead
/// (`ConsumerOptions::claim_ahead`) and logs `H <id> <ms>` as each handler
/// starts; the pool acks by itself (no `A` lines). Runs until killed.
fn consume_ahead(q: &redwheel::Queue<String>, log: File) -> Result<bool, BoxError> {
    let log = Mutex::new(log);
    let _pool = q.consume(
        ConsumerOptions::default()
            .concurrency(4)
            .claim_ahead(Duration::from_secs(2)),
        move |d| {
            let line = format!("H {} {}\n", d.id(), now_ms());
            log.lock()
                .map_err(|_| "the log's lock was poisoned")?
                .write_all(line.as_bytes())
                .map_err(|_| "could not write the log")
        },
    )?;
    loop {
        std::thread::sleep(Duration::from_secs(60));
    }
}

// ---------------------------------------------------------------------
// The run.

/// Redis as the run sees it: one node or a cluster, a proxy in front of
/// each node.
enum Target {
    Node {
        server: ThrowawayRedis,
        proxy: Proxy,
    },
    Cluster {
        cluster: ThrowawayCluster,
        /// (node's own port, its proxy).
        proxies: Vec<(u16, Proxy)>,
    },
}

impl Target {
    /// One node (`persistent`: with an append-only file, `appendfsync
    /// always`) or a 3+3 cluster (never persistent: a failover keeps what
    /// the replica had).
    fn start(cluster: bool, persistent: bool) -> Result<Target, BoxError> {
        if !cluster {
            let aof: &[&str] = if persistent {
                &["--appendonly", "yes", "--appendfsync", "always"]
            } else {
                &["--appendonly", "no"]
            };
            let server = ThrowawayRedis::start_with("redis-server", "chaos", aof)
                .map_err(|e| e.to_string())?;
            let proxy = Proxy::start(server.port());
            return Ok(Target::Node { server, proxy });
        }
        let cluster = ThrowawayCluster::start("chaos").map_err(|e| e.to_string())?;
        let mut proxies = Vec::new();
        for url in cluster.urls() {
            let port: u16 = url
                .trim_start_matches("redis://127.0.0.1:")
                .trim_end_matches('/')
                .parse()?;
            proxies.push((port, Proxy::start(port)));
        }
        let t = Target::Cluster { cluster, proxies };
        t.announce_proxies()?;
        Ok(t)
    }

    /// Every node announces its proxy's port, so clients (following
    /// `CLUSTER SLOTS` and redirects) reach it only through the proxy.
    fn announce_proxies(&self) -> Result<(), BoxError> {
        if let Target::Cluster { proxies, .. } = self {
            for (port, proxy) in proxies {
                announce(*port, proxy.port())?;
            }
        }
        Ok(())
    }

    /// The clients' seeds (through the proxies).
    fn urls(&self) -> Vec<String> {
        match self {
            Target::Node { proxy, .. } => vec![proxy.url()],
            Target::Cluster { proxies, .. } => proxies.iter().map(|(_, p)| p.url()).collect(),
        }
    }

    /// Straight to the servers (the accounting's view).
    fn direct_urls(&self) -> Vec<String> {
        match self {
            Target::Node { server, .. } => vec![server.url()],
            Target::Cluster { cluster, .. } => cluster.urls(),
        }
    }

    fn proxies(&self) -> Vec<&Proxy> {
        match self {
            Target::Node { proxy, .. } => vec![proxy],
            Target::Cluster { proxies, .. } => proxies.iter().map(|(_, p)| p).collect(),
        }
    }
}

/// What the proxy's faults match: the SHA of each script a write of the
/// run sends (so each gets its share), a blocking read, any script, or
/// anything.
fn fault_patterns() -> Vec<Vec<u8>> {
    let sha = |name: &str| {
        redwheel::test_support::script_sha(name)
            .expect("a script of redwheel")
            .into_bytes()
    };
    vec![
        sha("offer"),
        sha("offer_batch"),
        sha("claim"),
        sha("ack"),
        sha("transfer"),
        sha("lock_acquire"),
        sha("lock_release"),
        sha("lock_renew"),
        b"BLMOVE".to_vec(),
        b"EVALSHA".to_vec(),
        Vec::new(),
    ]
}

/// `--unlocks`: the faults go mostly to the lock's scripts, the release
/// above all (its reply lost after it ran, its resend then answered).
fn lock_fault_patterns() -> Vec<Vec<u8>> {
    let sha = |name: &str| {
        redwheel::test_support::script_sha(name)
            .expect("a script of redwheel")
            .into_bytes()
    };
    vec![
        sha("lock_release"),
        sha("lock_release"),
        sha("lock_release"),
        sha("lock_acquire"),
        sha("lock_renew"),
        b"EVALSHA".to_vec(),
        Vec::new(),
    ]
}

/// `CONFIG SET cluster-announce-port` on the node at `port`; its
/// replicas then reach it through the proxy too (the proxy leaves
/// replication links alone), and a full resync starts at once instead of
/// after the default 5 s wait for more replicas.
fn announce(port: u16, proxy_port: u16) -> Result<(), BoxError> {
    let mut con = redis::Client::open(format!("redis://127.0.0.1:{port}/"))?
        .get_connection_with_timeout(Duration::from_secs(2))?;
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("repl-diskless-sync-delay")
        .arg(0)
        .arg("cluster-announce-port")
        .arg(proxy_port)
        .query::<()>(&mut con)?;
    Ok(())
}

/// What the producers confirmed: id → the earliest time (local epoch ms)
/// it may be handled, and whether its offer was retried after an
/// `OutcomeUnknown` (a retry that may write it again if it was consumed
/// meanwhile: the id is free again once a message is acked).
type Offered = Arc<Mutex<HashMap<String, (u64, bool)>>>;

#[derive(Default)]
struct Counters {
    offer_retries_unknown: AtomicU64,
    offer_retries_unavailable: AtomicU64,
    offer_retries_other: AtomicU64,
    offers_given_up: AtomicU64,
    offers_known_already: AtomicU64,
}

fn producer(
    k: u64,
    rw: Redwheel,
    cluster: bool,
    seed: u64,
    stop: Arc<AtomicBool>,
    offered: Offered,
    counters: Arc<Counters>,
) -> Result<(), BoxError> {
    let q = rw.queue_with::<String>(QUEUE, queue_options(cluster))?;
    let mut rng = SplitMix64(seed ^ (k + 1).wrapping_mul(0x9E37_79B9));
    let mut seq = 0u64;
    while !stop.load(Ordering::SeqCst) {
        let n = if rng.range(0, 3) == 0 {
            1
        } else {
            rng.range(2, 20)
        };
        let start = now_ms();
        let batch: Vec<(MessageId, String, Duration)> = (0..n)
            .map(|_| {
                seq += 1;
                let delay = rng.range(0, MAX_DELAY_MS);
                let id = MessageId::from(format!("p{k}-{seq}"));
                (
                    id,
                    format!("{}", start + delay),
                    Duration::from_millis(delay),
                )
            })
            .collect();
        let started = Instant::now();
        let mut retried_unknown = false;
        loop {
            let r = if n == 1 {
                let (id, p, d) = &batch[0];
                q.offer_with_id(id, p, *d).map(|added| vec![added])
            } else {
                q.offer_batch_with_ids(&batch)
            };
            match r {
                Ok(added) => {
                    let known = added.iter().filter(|a| !**a).count() as u64;
                    counters
                        .offers_known_already
                        .fetch_add(known, Ordering::Relaxed);
                    let mut o = offered.lock().unwrap();
                    for (id, p, _) in &batch {
                        o.insert(id.to_string(), (p.parse().unwrap_or(0), retried_unknown));
                    }
                    break;
                }
                Err(e) if e.is_transient() && started.elapsed() < Duration::from_secs(120) => {
                    retried_unknown |= e.is_outcome_unknown();
                    let c = match e.kind() {
                        ErrorKind::OutcomeUnknown => &counters.offer_retries_unknown,
                        ErrorKind::Unavailable => &counters.offer_retries_unavailable,
                        _ => &counters.offer_retries_other,
                    };
                    c.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => {
                    eprintln!("chaos: producer {k} gave up an offer: {e}");
                    counters
                        .offers_given_up
                        .fetch_add(batch.len() as u64, Ordering::Relaxed);
                    break;
                }
            }
        }
        std::thread::sleep(Duration::from_millis(rng.range(5, 30)));
    }
    rw.shutdown(Duration::from_secs(10))?;
    Ok(())
}

/// The consumer processes, each logging to a file of its own.
struct Consumers {
    exe: PathBuf,
    urls: String,
    cluster: bool,
    dir: PathBuf,
    children: Vec<Child>,
    started: usize,
}

impl Consumers {
    fn spawn(&mut self) -> Result<Child, BoxError> {
        let log = self.dir.join(format!("consumer-{}.log", self.started));
        // Every other consumer process is a pool claiming ahead.
        let ahead = self.started % 2 == 1;
        self.started += 1;
        let mut cmd = Command::new(&self.exe);
        cmd.args(["--role", "consumer", "--urls", &self.urls, "--log"])
            .arg(&log);
        if ahead {
            cmd.arg("--ahead");
        }
        if self.cluster {
            cmd.arg("--cluster");
        }
        Ok(cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?)
    }

    fn kill(&mut self, i: usize) -> Result<(), BoxError> {
        let fresh = self.spawn()?;
        let mut c = std::mem::replace(&mut self.children[i], fresh);
        let _ = c.kill();
        let _ = c.wait();
        Ok(())
    }

    fn kill_all(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[derive(Default, Debug)]
struct Faults {
    lose_reply: u64,
    drop_mid_reply: u64,
    delay: u64,
    proxy_down: u64,
    cut_all: u64,
    redis_kills: u64,
    failovers: u64,
    quick_restarts: u64,
    consumer_kills: u64,
}

fn run(args: &[String]) -> Result<bool, BoxError> {
    let minutes: f64 = arg(args, "--minutes").map_or(Ok(1.0), |m| m.parse())?;
    let cluster = args.iter().any(|a| a == "--cluster");
    // Locks only, Redis without persistence: see the module docs.
    let unlocks = args.iter().any(|a| a == "--unlocks");
    let seed: u64 = arg(args, "--seed").map_or(Ok(now_ms()), |s| s.parse())?;
    let chaos_for = Duration::from_secs_f64(minutes * 60.0);
    let where_ = if cluster { "a 3+3 cluster" } else { "one node" };
    let mode = if unlocks {
        ", --unlocks: locks only, redis without persistence"
    } else {
        ""
    };
    println!("chaos: {minutes} min on {where_}{mode}, seed {seed}");

    let mut target = Target::start(cluster, !unlocks)?;
    let urls = target.urls();
    let dir = std::env::temp_dir().join(format!("redwheel-chaos-logs-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;

    let offered: Offered = Arc::default();
    let counters = Arc::new(Counters::default());
    let store = Arc::new(Mutex::new(FencedStore::default()));
    let stop_producers = Arc::new(AtomicBool::new(false));
    let stop_locks = Arc::new(AtomicBool::new(false));

    let mut producers = Vec::new();
    for k in 0..if unlocks { 0 } else { PRODUCERS } {
        let rw = connect_retrying(&urls, cluster)?;
        let (stop, offered, counters) = (
            Arc::clone(&stop_producers),
            Arc::clone(&offered),
            Arc::clone(&counters),
        );
        producers.push(std::thread::spawn(move || {
            producer(k, rw, cluster, seed, stop, offered, counters)
        }));
    }
    let lock_counters = Arc::new(LockCounters::default());
    let shared = Holders {
        seed,
        stop: Arc::clone(&stop_locks),
        store: Arc::clone(&store),
        counters: Arc::clone(&lock_counters),
        pause_ms: if unlocks { 300 } else { 15 },
    };
    let mut holders = Vec::new();
    for k in 0..LOCK_HOLDERS {
        let (rw, h) = (connect_retrying(&urls, cluster)?, shared.clone());
        holders.push(std::thread::spawn(move || {
            chaos_locks::lock_holder(k, rw, h)
        }));
    }
    #[cfg(feature = "async")]
    for k in LOCK_HOLDERS..LOCK_HOLDERS + ASYNC_LOCK_HOLDERS {
        let (rw, h) = (connect_retrying(&urls, cluster)?, shared.clone());
        holders.push(std::thread::spawn(move || {
            chaos_locks::async_lock_holder(k, rw, h)
        }));
    }
    let mut consumers = Consumers {
        exe: std::env::current_exe()?,
        urls: urls.join(","),
        cluster,
        dir: dir.clone(),
        children: Vec::new(),
        started: 0,
    };
    for _ in 0..if unlocks { 0 } else { CONSUMERS } {
        let c = consumers.spawn()?;
        consumers.children.push(c);
    }

    // The faults.
    let mut rng = SplitMix64(seed);
    let mut faults = Faults::default();
    let started = Instant::now();
    let mut next_redis_kill = started + Duration::from_secs(rng.range(15, 30));
    let mut next_consumer_kill = started + Duration::from_millis(rng.range(2_000, 6_000));
    if unlocks {
        // Restarts without persistence: the lock changes hands under its
        // holders.
        next_redis_kill = started + Duration::from_secs(rng.range(5, 15));
    }
    let mut rules = Vec::new();
    let patterns = if unlocks {
        lock_fault_patterns()
    } else {
        fault_patterns()
    };
    while started.elapsed() < chaos_for {
        std::thread::sleep(Duration::from_millis(rng.range(300, 1_500)));
        let now = Instant::now();
        if now >= next_consumer_kill && !unlocks {
            let i = rng.range(0, CONSUMERS as u64 - 1) as usize;
            consumers.kill(i)?;
            faults.consumer_kills += 1;
            next_consumer_kill = now + Duration::from_millis(rng.range(2_000, 6_000));
        }
        if now >= next_redis_kill {
            kill_redis(&mut target, unlocks, &mut rng, &mut faults)?;
            let (lo, hi) = if unlocks { (5, 15) } else { (20, 40) };
            next_redis_kill = Instant::now() + Duration::from_secs(rng.range(lo, hi));
            continue;
        }
        let proxies = target.proxies();
        let proxy = proxies[rng.range(0, proxies.len() as u64 - 1) as usize];
        match rng.range(0, 9) {
            0..=6 => {
                // A fault on the next few commands: one of redwheel's
                // writes, a blocking read, or anything.
                let pattern = patterns[rng.range(0, patterns.len() as u64 - 1) as usize].clone();
                let fault = match rng.range(0, 2) {
                    0 => {
                        faults.lose_reply += 1;
                        Fault::LoseReply
                    }
                    1 => {
                        faults.drop_mid_reply += 1;
                        Fault::DropMidReply
                    }
                    _ => {
                        faults.delay += 1;
                        Fault::Delay(Duration::from_millis(rng.range(100, 1_500)))
                    }
                };
                rules.push(proxy.inject(Rule::new(fault).matching(pattern).times(rng.range(1, 3))));
                if rules.len() > 8 {
                    rules.remove(0).remove();
                }
            }
            7 | 8 => {
                proxy.set_down(true);
                std::thread::sleep(Duration::from_millis(rng.range(200, 1_500)));
                proxy.set_down(false);
                faults.proxy_down += 1;
            }
            _ => {
                proxy.cut_all();
                faults.cut_all += 1;
            }
        }
    }
    for p in target.proxies() {
        p.clear();
    }
    println!(
        "chaos: faults stopped after {:.0?}; producers stop, consumers drain",
        started.elapsed()
    );
    stop_producers.store(true, Ordering::SeqCst);
    for p in producers {
        p.join().map_err(|_| "a producer panicked")??;
    }
    stop_locks.store(true, Ordering::SeqCst);
    for h in holders {
        h.join().map_err(|_| "a lock holder panicked")?;
    }
    let locks = store.lock().unwrap().report();
    if unlocks {
        print_faults(&faults, started.elapsed());
        print_locks(&locks, &lock_counters);
        let _ = std::fs::remove_dir_all(&dir);
        drop(target);
        return Ok(locks.overlaps_accepted == 0 && locks.unlocks_ok_not_own == 0);
    }

    // Drain: every message due and handled, none in flight.
    let direct = connect_retrying(&target.direct_urls(), cluster)?;
    let q = direct.queue_with::<String>(QUEUE, queue_options(cluster))?;
    let drain_started = Instant::now();
    let drained = loop {
        match q.stats() {
            Ok(s) if s.delayed + s.ready + s.in_flight == 0 => break true,
            _ if drain_started.elapsed() > Duration::from_secs(180) => break false,
            _ => std::thread::sleep(Duration::from_millis(200)),
        }
    };
    consumers.kill_all();
    let dead = q.stats().map(|s| s.dead).unwrap_or(u64::MAX);
    let stored: HashSet<String> = stored_ids(&target.direct_urls(), cluster)?;
    direct.shutdown(Duration::from_secs(10))?;

    let offered = offered.lock().unwrap().clone();
    let report = account(&offered, &dir, &stored)?;
    print_faults(&faults, started.elapsed());
    print_report(&counters, &report, dead, drained);
    print_locks(&locks, &lock_counters);
    let _ = std::fs::remove_dir_all(&dir);
    drop(target);
    Ok(report.lost == 0
        && report.early == 0
        && locks.overlaps_accepted == 0
        && locks.unlocks_ok_not_own == 0
        && drained)
}

/// One node: SIGKILL, down a moment, restart (its append-only file
/// reloads). A cluster: the master of the queue's or the lock's slot
/// killed, its replica promoted, the old master back as a replica.
fn kill_redis(
    target: &mut Target,
    unlocks: bool,
    rng: &mut SplitMix64,
    faults: &mut Faults,
) -> Result<(), BoxError> {
    match target {
        Target::Node { server, .. } => {
            server.kill();
            std::thread::sleep(Duration::from_millis(rng.range(200, 1_000)));
            server.restart().map_err(|e| e.to_string())?;
            faults.redis_kills += 1;
        }
        Target::Cluster { cluster, proxies } => {
            let key = if rng.range(0, 1) == 0 && !unlocks {
                format!("redwheel:{{{QUEUE}}}:delayed")
            } else {
                format!("redwheel:lock:{{{LOCK}}}")
            };
            let slot = cluster.keyslot(&key).map_err(|e| e.to_string())?;
            let announced = cluster.master_of(slot).map_err(|e| e.to_string())?;
            let port = proxies
                .iter()
                .find(|(_, p)| p.port() == announced)
                .map_or(announced, |(port, _)| *port);
            cluster.kill(port);
            // `--unlocks`: half the time the master comes back at once,
            // empty (no persistence), before its replica takes over; its
            // replica then resyncs to nothing.
            let quick = unlocks && rng.range(0, 1) == 0;
            let deadline = Instant::now() + Duration::from_secs(30);
            while !quick && cluster.master_of(slot).map_or(true, |p| p == announced) {
                if Instant::now() > deadline {
                    return Err("no replica took over".into());
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            cluster.restart(port).map_err(|e| e.to_string())?;
            let proxy_port = proxies
                .iter()
                .find(|(p, _)| *p == port)
                .map(|(_, proxy)| proxy.port())
                .ok_or("no proxy for the node")?;
            announce(port, proxy_port)?;
            if quick {
                faults.quick_restarts += 1;
            } else {
                faults.failovers += 1;
            }
        }
    }
    Ok(())
}

/// Every id in the queue's message hash (delayed, ready, in flight or
/// dead), read straight from the servers.
fn stored_ids(urls: &[String], cluster: bool) -> Result<HashSet<String>, BoxError> {
    let key = format!("redwheel:{{{QUEUE}}}:msg");
    let mut out = HashSet::new();
    for url in urls {
        let mut con = redis::Client::open(url.as_str())?.get_connection()?;
        let is_master = !cluster || {
            let role: Vec<redis::Value> = redis::cmd("ROLE").query(&mut con)?;
            matches!(role.first(), Some(redis::Value::BulkString(r)) if r == b"master")
        };
        if !is_master {
            continue;
        }
        let ids: redis::RedisResult<Vec<String>> = redis::cmd("HKEYS").arg(&key).query(&mut con);
        // On a cluster only one master serves the key; the others answer MOVED.
        if let Ok(ids) = ids {
            out.extend(ids);
        }
    }
    Ok(out)
}

#[derive(Debug, Default)]
struct Report {
    offered: u64,
    acknowledged: u64,
    lost: u64,
    lost_ids: Vec<String>,
    early: u64,
    duplicates: u64,
    handled: u64,
    stale_acks: u64,
    consumer_errors: u64,
    unknown_handled: u64,
    still_stored: u64,
    /// Handlings after an ack of the same id had returned `Ok`: the
    /// message was in Redis again after it was deleted (written again).
    handled_after_ack: u64,
    /// Of those, the ones whose offer the producer retried after an
    /// `OutcomeUnknown` (the rest were written again by redwheel itself).
    handled_after_ack_retried: u64,
}

fn account(
    offered: &HashMap<String, (u64, bool)>,
    dir: &Path,
    stored: &HashSet<String>,
) -> Result<Report, BoxError> {
    let mut handled: HashMap<String, u64> = HashMap::new();
    // id → when its first ack returned Ok, and its handlings' times.
    let mut acked: HashMap<String, u64> = HashMap::new();
    let mut handled_at: Vec<(String, u64)> = Vec::new();
    let mut r = Report::default();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.extension().is_none_or(|e| e != "log") {
            continue;
        }
        let f = BufReader::new(File::open(path)?);
        for line in f.lines() {
            let line = line?;
            let mut words = line.split(' ');
            match (words.next(), words.next(), words.next()) {
                (Some("H"), Some(id), Some(ms)) => {
                    r.handled += 1;
                    *handled.entry(id.to_owned()).or_default() += 1;
                    let ms: u64 = ms.parse().unwrap_or(0);
                    if offered.get(id).is_some_and(|&(earliest, _)| ms < earliest) {
                        r.early += 1;
                    }
                    handled_at.push((id.to_owned(), ms));
                }
                (Some("A"), Some(id), Some(ms)) => {
                    let ms: u64 = ms.parse().unwrap_or(0);
                    let first = acked.entry(id.to_owned()).or_insert(ms);
                    *first = (*first).min(ms);
                }
                (Some("S"), _, _) => r.stale_acks += 1,
                (Some("E"), _, _) => r.consumer_errors += 1,
                // A line torn by a kill mid-write: none expected (one
                // write per line), counted as an error if seen.
                _ => r.consumer_errors += 1,
            }
        }
    }
    r.offered = offered.len() as u64;
    r.acknowledged = offered.keys().filter(|id| acked.contains_key(*id)).count() as u64;
    for (id, ms) in &handled_at {
        if acked.get(id).is_some_and(|a| ms > a) {
            r.handled_after_ack += 1;
            if offered.get(id).is_some_and(|&(_, retried)| retried) {
                r.handled_after_ack_retried += 1;
            }
        }
    }
    for id in offered.keys() {
        if handled.contains_key(id) {
            continue;
        }
        if stored.contains(id) {
            r.still_stored += 1;
        } else {
            r.lost += 1;
            r.lost_ids.push(id.clone());
        }
    }
    r.duplicates = handled.values().map(|n| n - 1).sum();
    r.unknown_handled = handled
        .keys()
        .filter(|id| !offered.contains_key(*id))
        .count() as u64;
    Ok(r)
}

fn print_faults(faults: &Faults, took: Duration) {
    println!("chaos: done in {took:.0?}");
    println!(
        "faults: proxy rules {} (lose reply {}, drop mid-reply {}, delay {}), proxy down {}, connections cut {}, \
         redis SIGKILL+restart {}, master failovers {}, master restarts without persistence {}, consumers SIGKILLed {}",
        faults.lose_reply + faults.drop_mid_reply + faults.delay,
        faults.lose_reply,
        faults.drop_mid_reply,
        faults.delay,
        faults.proxy_down,
        faults.cut_all,
        faults.redis_kills,
        faults.failovers,
        faults.quick_restarts,
        faults.consumer_kills
    );
}

fn print_report(c: &Counters, r: &Report, dead: u64, drained: bool) {
    let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
    println!(
        "offers: retried after OutcomeUnknown {}, after Unavailable {}, after another transient error {}; \
         answered \"id already known\" {}; given up {}",
        get(&c.offer_retries_unknown),
        get(&c.offer_retries_unavailable),
        get(&c.offer_retries_other),
        get(&c.offers_known_already),
        get(&c.offers_given_up)
    );
    println!("offered: {}", r.offered);
    println!("acknowledged: {}", r.acknowledged);
    println!("lost (must be 0): {}", r.lost);
    if !r.lost_ids.is_empty() {
        let mut ids = r.lost_ids.clone();
        ids.sort();
        ids.truncate(20);
        println!("  lost ids (first 20): {}", ids.join(" "));
    }
    println!("delivered early (must be 0): {}", r.early);
    println!("duplicates (at-least-once, counted): {}", r.duplicates);
    println!(
        "  of which handled again after an ack of the same id had returned Ok (the message was written again \
         after it was consumed): {} ({} of them offered with a retry after OutcomeUnknown, {} without)",
        r.handled_after_ack,
        r.handled_after_ack_retried,
        r.handled_after_ack - r.handled_after_ack_retried
    );
    println!(
        "  handlings {}, stale acks {}, consumer errors {}, handled but never confirmed offered {}, \
         dead letters {}, offered and unhandled but still in redis {}, drained {}",
        r.handled,
        r.stale_acks,
        r.consumer_errors,
        r.unknown_handled,
        dead,
        r.still_stored,
        drained
    );
}

fn print_locks(locks: &StoreReport, c: &LockCounters) {
    let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
    println!(
        "locks: critical sections {}, writes accepted {}, refused as stale {}, sections overlapping in time {}, \
         tokens not increasing {}, leases lost {}, unlocks told LockLost {}, lock errors {}",
        locks.sections,
        locks.accepted,
        locks.rejected,
        locks.overlapping_in_time,
        locks.tokens_not_increasing,
        get(&c.leases_lost),
        get(&c.unlock_lock_lost),
        get(&c.lock_errors)
    );
    println!(
        "overlapping critical sections accepted by the store (must be 0): {}",
        locks.overlaps_accepted
    );
    println!(
        "unlocks answered Ok {}, of which after another holder had taken the lock from under its holder (must be 0): {}",
        locks.unlocks_ok, locks.unlocks_ok_not_own
    );
}
