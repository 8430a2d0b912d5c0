//! Eight threads in two processes contend for one lock, writing to a
//! downstream store that checks fencing tokens: on one Redis the critical
//! sections never overlap; on a Redis Cluster whose master is killed
//! mid-run, tokens still only increase, and a holder the failover made
//! overlap with another is told its lease was lost.

mod support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use redwheel::{ErrorKind, Redwheel};
use support::RedisServer;
use support::cluster::RedisCluster;

/// The downstream store the critical sections write to, on a Redis of its
/// own. `enter` refuses a token not greater than the last one it accepted
/// (a stale holder); a newer token entering while another holder is still
/// inside is an overlap: in `strict` mode refused, otherwise counted and
/// let in (the fenced store now follows the newer holder). `exit` replies 1
/// when the leaving holder had been overtaken that way, else 0.
const STORE: &str = r"
local inside, last_key, sections, overlaps = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local step, token, who, strict = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4] == '1'
if step == 'enter' then
  local last = tonumber(redis.call('GET', last_key) or '0')
  if token <= last then
    return redis.error_reply('stale token ' .. ARGV[2] .. ' after ' .. last)
  end
  local prev = redis.call('GET', inside)
  if prev then
    if strict then
      return redis.error_reply('overlap: ' .. prev .. ' is inside')
    end
    redis.call('INCR', overlaps)
  end
  redis.call('SET', inside, who)
  redis.call('SET', last_key, ARGV[2])
  return redis.call('INCR', sections)
end
if redis.call('GET', inside) == who then
  redis.call('DEL', inside)
  return 0
end
if strict then
  return redis.error_reply('overlap: ' .. who .. ' left, but it was not inside')
end
return 1
";

const THREADS: usize = 4;

/// Where the lock lives.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// One Redis: no overlap is acceptable.
    Node,
    /// A cluster that fails over: an overlap must be signalled.
    Cluster,
}

fn seconds(default: u64) -> u64 {
    std::env::var("REDWHEEL_LOCK_CONTENTION_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn connect(mode: Mode, target: &str) -> Redwheel {
    match mode {
        Mode::Node => Redwheel::connect(target).unwrap(),
        Mode::Cluster => {
            let seeds: Vec<&str> = target.split(',').collect();
            Redwheel::connect_cluster(&seeds).unwrap()
        }
    }
}

/// What one process saw.
#[derive(Debug, Default)]
struct Tally {
    sections: u64,
    /// Holds that ended lost (`is_lost`, or an unlock saying so).
    lost: u64,
    /// Holds that the store says were overtaken by a newer token.
    overtaken: u64,
}

/// One process's share: `THREADS` threads locking and writing until the
/// deadline.
fn contend(mode: Mode, target: &str, store_url: &str, who: &str, secs: u64) -> Tally {
    let rw = connect(mode, target);
    let strict = if mode == Mode::Node { "1" } else { "0" };
    let deadline = Instant::now() + Duration::from_secs(secs);
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let rw = rw.clone();
            let (store_url, who) = (store_url.to_owned(), format!("{who}-{t}"));
            std::thread::spawn(move || {
                let mut con = redis::Client::open(store_url)
                    .unwrap()
                    .get_connection()
                    .unwrap();
                let store = redis::Script::new(STORE);
                let lock = rw.lock("contended").watchdog_lease(Duration::from_secs(1));
                let mut tally = Tally::default();
                let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ t as u64;
                while Instant::now() < deadline {
                    let g = lock.lock().unwrap();
                    let token = g.fencing_token();
                    let call = |con: &mut redis::Connection, step: &str| -> i64 {
                        store
                            .key("test:inside")
                            .key("test:last-token")
                            .key("test:sections")
                            .key("test:overlaps")
                            .arg(step)
                            .arg(token)
                            .arg(&who)
                            .arg(strict)
                            .invoke(con)
                            .unwrap_or_else(|e| panic!("{who}: {e}"))
                    };
                    call(&mut con, "enter");
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    if t == 0 && tally.sections == 20 {
                        // Once per process: longer than the lease, so only
                        // the watchdog keeps it.
                        std::thread::sleep(Duration::from_millis(1_500));
                    } else {
                        std::thread::sleep(Duration::from_micros(x % 2_000));
                    }
                    let lost_inside = g.is_lost();
                    if mode == Mode::Node {
                        assert!(!lost_inside, "{who}: lease lost in a critical section");
                    }
                    let overtaken = call(&mut con, "exit") == 1;
                    let unlocked = g.unlock();
                    let lost = match &unlocked {
                        Ok(()) => false,
                        Err(e) if e.kind() == ErrorKind::LockLost => true,
                        Err(e) => panic!("{who}: unlock failed: {e}"),
                    };
                    assert!(
                        !lost_inside || lost,
                        "{who}: is_lost() was true, yet unlock() succeeded"
                    );
                    if mode == Mode::Node {
                        assert!(!lost, "{who}: lease lost on one server: {unlocked:?}");
                    }
                    // The promise under failover: a holder someone else
                    // overtook is told so.
                    assert!(
                        !overtaken || lost,
                        "{who}: overtaken by a newer token, but never told the lease was lost"
                    );
                    tally.sections += 1;
                    tally.lost += u64::from(lost);
                    tally.overtaken += u64::from(overtaken);
                }
                tally
            })
        })
        .collect();
    let mut total = Tally::default();
    for t in threads {
        let t = t.join().unwrap();
        total.sections += t.sections;
        total.lost += t.lost;
        total.overtaken += t.overtaken;
    }
    rw.shutdown(Duration::from_secs(10)).unwrap();
    total
}

/// When run as the child of a contention test (the env vars name the lock's
/// Redis and the store), contends and prints what it saw. Run normally, it
/// does nothing.
#[test]
fn child_process_contender() {
    let Ok(spec) = std::env::var("REDWHEEL_LOCK_CONTENDER") else {
        return;
    };
    let mut parts = spec.splitn(4, '|');
    let (mode, target, store, secs) = (
        parts.next().unwrap(),
        parts.next().unwrap(),
        parts.next().unwrap(),
        parts.next().unwrap().parse().unwrap(),
    );
    let mode = if mode == "cluster" {
        Mode::Cluster
    } else {
        Mode::Node
    };
    let t = contend(mode, target, store, "child", secs);
    println!("tally {} {} {}", t.sections, t.lost, t.overtaken);
}

/// Starts the child contender; `finish` waits for it and parses its tally.
fn spawn_child(mode: Mode, target: &str, store: &str, secs: u64) -> std::process::Child {
    let mode = if mode == Mode::Cluster {
        "cluster"
    } else {
        "node"
    };
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_process_contender",
            "--test-threads=1",
            "--quiet",
            "--nocapture",
        ])
        .env(
            "REDWHEEL_LOCK_CONTENDER",
            format!("{mode}|{target}|{store}|{secs}"),
        )
        .stdout(Stdio::piped())
        .spawn()
        .unwrap()
}

fn finish(child: std::process::Child) -> Tally {
    let out = child.wait_with_output().unwrap();
    // (A panic in the parent leaves the child to finish its own, bounded run.)
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "the child failed:\n{text}");
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("tally "))
        .expect("the child's tally");
    let n: Vec<u64> = line
        .split_whitespace()
        .map(|s| s.parse().unwrap())
        .collect();
    Tally {
        sections: n[0],
        lost: n[1],
        overtaken: n[2],
    }
}

fn store_int(store: &RedisServer, key: &str) -> u64 {
    let mut con = redis::Client::open(store.url())
        .unwrap()
        .get_connection()
        .unwrap();
    redis::cmd("GET")
        .arg(key)
        .query::<Option<u64>>(&mut con)
        .unwrap()
        .unwrap_or(0)
}

#[test]
fn eight_threads_in_two_processes_never_overlap_and_tokens_increase() {
    let server = RedisServer::start();
    let store = RedisServer::start();
    let secs = seconds(30);
    let child = spawn_child(Mode::Node, &server.url(), &store.url(), secs);
    let mine = contend(Mode::Node, &server.url(), &store.url(), "parent", secs);
    let theirs = finish(child);
    let counted = store_int(&store, "test:sections");
    eprintln!(
        "{} + {} critical sections in {secs} s",
        mine.sections, theirs.sections
    );
    assert_eq!(
        counted,
        mine.sections + theirs.sections,
        "every section counted once"
    );
    assert!(
        mine.sections > 0 && theirs.sections > 0,
        "both processes got the lock"
    );
    assert_eq!(store.int(&["EXISTS", "test:inside"]), 0);
    assert_eq!(store.int(&["EXISTS", "test:overlaps"]), 0);
}

/// The same contention on a 3+3 Redis Cluster, killing the lock's master
/// a third of the way in. What a failover can do to a lock: replication is
/// asynchronous, so the promoted replica may miss the latest acquisition
/// and grant the lock again while its first holder still works; and the
/// lock's lease stops being renewed while its master is unreachable, so a
/// holder inside then loses it. What the test holds us to: fencing tokens
/// never go backwards (the store refuses no token as stale, across the
/// failover); every holder the store saw overtaken is told its lease was
/// lost; the lock keeps working on the promoted master, for both processes.
#[test]
fn eight_threads_on_a_cluster_through_a_master_failover_keep_tokens_increasing() {
    let mut cluster = RedisCluster::start();
    let store = RedisServer::start();
    let seeds = cluster.urls().join(",");
    let secs = seconds(20).max(9);
    let owner = cluster.master_of_slot(cluster.keyslot("contended"));
    let child = spawn_child(Mode::Cluster, &seeds, &store.url(), secs);
    let parent = {
        let (seeds, store_url) = (seeds.clone(), store.url());
        std::thread::spawn(move || contend(Mode::Cluster, &seeds, &store_url, "parent", secs))
    };
    std::thread::sleep(Duration::from_secs(secs / 3));
    let before = store_int(&store, "test:sections");
    cluster.kill(owner);
    let killed = Instant::now();
    cluster.wait_failover(owner, Duration::from_secs(60));
    let promoted = killed.elapsed();
    let at_promotion = store_int(&store, "test:sections");
    let mine = parent.join().unwrap();
    let theirs = finish(child);
    cluster.restart(owner);
    let counted = store_int(&store, "test:sections");
    eprintln!(
        "cluster: {} + {} sections in {secs} s; {before} before the kill, {at_promotion} at promotion \
         ({promoted:?} after the kill); lost holds {} + {}, overtaken {} + {}, overlaps {}",
        mine.sections,
        theirs.sections,
        mine.lost,
        theirs.lost,
        mine.overtaken,
        theirs.overtaken,
        store_int(&store, "test:overlaps"),
    );
    assert_eq!(
        counted,
        mine.sections + theirs.sections,
        "every section counted once"
    );
    assert!(before > 0, "sections ran before the kill");
    assert!(
        counted > at_promotion,
        "the lock kept working on the promoted master"
    );
    assert!(
        mine.sections > 0 && theirs.sections > 0,
        "both processes got the lock"
    );
    assert_eq!(store.int(&["EXISTS", "test:inside"]), 0);
}
