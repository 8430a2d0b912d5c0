//! At-least-once consumption through real faults: consumer processes
//! killed with SIGKILL mid-run, Redis killed and restarted, a cluster
//! master failing over. Nothing offered (and acknowledged) is lost;
//! duplicates are counted.

mod support;

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redwheel::{ConsumerOptions, MessageId, QueueOptions, Redwheel};
use support::cluster::RedisCluster;
use support::{RedisServer, within};

const HANG: Duration = Duration::from_secs(300);

/// Where a consumer records each message it handled: `HINCRBY` of the
/// message id in this hash (outside redwheel's keys).
const SEEN: &str = "test:seen";

/// Handles one message: records it, then lingers a little, so a kill can
/// land before the claim, inside the handler, or between handler and ack.
fn record(con: &mut redis::Connection, id: &MessageId) -> Result<(), String> {
    redis::cmd("HINCRBY")
        .arg(SEEN)
        .arg(id.as_str())
        .arg(1)
        .query::<i64>(con)
        .map_err(|e| e.to_string())?;
    let spin = (id.as_str().len() % 3) as u64;
    std::thread::sleep(Duration::from_micros(200 * spin));
    Ok(())
}

/// Not a test of its own: the consumer process the kill test starts (this
/// test binary, running only this function). Consumes until the queue is
/// empty, recording what it handles. Run directly, it does nothing.
#[test]
fn child_process_consumer() {
    let Ok(url) = std::env::var("REDWHEEL_CHILD_CONSUMER_URL") else {
        return;
    };
    let rw = Redwheel::connect(&url).unwrap();
    let q = rw
        .queue_with::<String>(
            "kill",
            QueueOptions::default().visibility(Duration::from_millis(500)),
        )
        .unwrap();
    let client = redis::Client::open(url.as_str()).unwrap();
    let consumer = q
        .consume(
            // Two claimers, each feeding three worker threads.
            ConsumerOptions::default()
                .concurrency(6)
                .claimers(2)
                .retry_backoff(Duration::from_millis(10), Duration::from_millis(50)),
            move |d| {
                let mut con = client.get_connection().map_err(|e| e.to_string())?;
                record(&mut con, d.id())
            },
        )
        .unwrap();
    while q.len().unwrap() > 0 {
        std::thread::sleep(Duration::from_millis(20));
    }
    consumer.shutdown(Duration::from_secs(10)).unwrap();
}

fn spawn_consumer(url: &str) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_process_consumer",
            "--test-threads=1",
            "--quiet",
        ])
        .env("REDWHEEL_CHILD_CONSUMER_URL", url)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

fn seen(url: &str) -> HashMap<String, u64> {
    let mut con = redis::Client::open(url).unwrap().get_connection().unwrap();
    redis::cmd("HGETALL").arg(SEEN).query(&mut con).unwrap()
}

#[test]
fn consumers_killed_at_random_points_lose_no_message() {
    let server = RedisServer::start();
    let url = server.url();
    let rw = Redwheel::connect(&url).unwrap();
    let q = rw.queue::<String>("kill").unwrap();
    let n = 20_000;
    let batch: Vec<(String, Duration)> =
        (0..n).map(|i| (format!("k{i}"), Duration::ZERO)).collect();
    let offered: Vec<MessageId> = q.offer_batch(&batch).unwrap();
    // Kill consumer processes at pseudo-random moments (SplitMix-like
    // sequence, fixed seed), then let the last one finish.
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut kills = 0;
    let started = Instant::now();
    while kills < 12 && started.elapsed() < Duration::from_secs(120) {
        let mut child = spawn_consumer(&url);
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        std::thread::sleep(Duration::from_millis(150 + x % 400));
        if child.try_wait().unwrap().is_some() {
            break; // it finished the queue
        }
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        kills += 1;
    }
    let mut last = spawn_consumer(&url);
    let status = within(HANG, move || last.wait().unwrap());
    assert!(status.success(), "the last consumer failed");
    assert_eq!(q.len().unwrap(), 0, "every message acked");
    let s = q.stats().unwrap();
    assert_eq!((s.in_flight, s.dead, s.ready, s.delayed), (0, 0, 0, 0));
    let seen = seen(&url);
    let missing = offered
        .iter()
        .filter(|id| !seen.contains_key(id.as_str()))
        .count();
    let duplicates = seen.values().filter(|&&c| c > 1).count();
    eprintln!(
        "{n} messages, {kills} consumer processes killed with SIGKILL: {} handled, {duplicates} \
         handled more than once (at-least-once), {missing} lost",
        seen.len()
    );
    assert_eq!(missing, 0, "a message was lost");
    assert_eq!(seen.len(), n, "nothing but the offered messages");
}

#[test]
fn redis_killed_and_restarted_during_consumption_loses_nothing() {
    let mut server = RedisServer::with_appendonly();
    let url = server.url();
    let rw = Redwheel::connect(&url).unwrap();
    let q = rw
        .queue_with::<String>(
            "restart-claims",
            QueueOptions::default().visibility(Duration::from_millis(500)),
        )
        .unwrap();
    let n = 3_000;
    let batch: Vec<(String, Duration)> = (0..n)
        .map(|i| (format!("r{i}"), Duration::from_millis(i % 2_000)))
        .collect();
    let offered = q.offer_batch(&batch).unwrap();
    let client = redis::Client::open(url.as_str()).unwrap();
    let consumer = q
        .consume(
            // Two claimers, each feeding three worker threads.
            ConsumerOptions::default()
                .concurrency(6)
                .claimers(2)
                .retry_backoff(Duration::from_millis(10), Duration::from_millis(50)),
            move |d| {
                let mut con = client.get_connection().map_err(|e| e.to_string())?;
                record(&mut con, d.id())
            },
        )
        .unwrap();
    // Mid-run: SIGKILL the server, and start it again from its append-only
    // file (fsync always: every acknowledged write survives).
    std::thread::sleep(Duration::from_millis(700));
    server.kill();
    std::thread::sleep(Duration::from_millis(300));
    server.restart();
    within(HANG, {
        let q = q.clone();
        move || loop {
            match q.len() {
                Ok(0) => return,
                _ => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    });
    consumer.shutdown(Duration::from_secs(10)).unwrap();
    let seen = seen(&url);
    let missing = offered
        .iter()
        .filter(|id| !seen.contains_key(id.as_str()))
        .count();
    let duplicates = seen.values().filter(|&&c| c > 1).count();
    eprintln!(
        "{n} messages through a Redis restart: {duplicates} handled more than once, {missing} lost"
    );
    assert_eq!(missing, 0, "a message was lost");
}

#[test]
fn a_cluster_master_failover_during_consumption_loses_no_confirmed_offer() {
    let mut cluster = RedisCluster::start();
    let rw = cluster.connect();
    let name = "failover-claims";
    let q = rw
        .queue_with::<String>(
            name,
            QueueOptions::default()
                .visibility(Duration::from_millis(500))
                .wait_replicas(1, Duration::from_millis(500)),
        )
        .unwrap();
    // The consumer is in this process: it records what it handled here.
    let handled: Arc<Mutex<HashMap<String, u64>>> = Arc::default();
    let owner = cluster.master_of_slot(cluster.keyslot(name));
    let consumer = q
        .consume(
            ConsumerOptions::default()
                .concurrency(4)
                .retry_backoff(Duration::from_millis(10), Duration::from_millis(50)),
            {
                let handled = Arc::clone(&handled);
                move |d| {
                    *handled
                        .lock()
                        .unwrap()
                        .entry(d.id().to_string())
                        .or_default() += 1;
                    Ok::<(), String>(())
                }
            },
        )
        .unwrap();
    // Offer while the master dies and its replica takes over; keep only
    // the offers a replica confirmed.
    let mut confirmed = Vec::new();
    let mut i = 0u64;
    let t0 = Instant::now();
    let mut killed = false;
    while t0.elapsed() < Duration::from_secs(8) {
        if !killed && t0.elapsed() > Duration::from_secs(2) {
            cluster.kill(owner);
            killed = true;
        }
        let id = MessageId::from(format!("c{i}"));
        match q.offer_with_id(&id, &format!("m{i}"), Duration::from_millis(10)) {
            Ok(_) => confirmed.push(id),
            // Refused, or not confirmed by a replica, while the master is
            // down or has no replica yet: not counted.
            Err(e) => assert!(e.is_transient(), "{e}"),
        }
        i += 1;
        std::thread::sleep(Duration::from_millis(5));
    }
    cluster.wait_failover(owner, HANG);
    cluster.restart(owner);
    let seen = within(HANG, {
        let handled = Arc::clone(&handled);
        move || loop {
            let seen = handled.lock().unwrap().clone();
            if confirmed.iter().all(|id| seen.contains_key(id.as_str())) {
                return (seen, confirmed);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    });
    let (seen, confirmed) = seen;
    consumer.shutdown(Duration::from_secs(10)).unwrap();
    let duplicates = seen.values().filter(|&&c| c > 1).count();
    eprintln!(
        "cluster failover: {} offers confirmed by a replica, all handled; {duplicates} handled more than once",
        confirmed.len()
    );
    rw.shutdown(Duration::from_secs(10)).unwrap();
}
