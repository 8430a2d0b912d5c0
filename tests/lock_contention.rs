//! Eight threads in two processes contend for one lock: critical sections
//! never overlap, and each one's fencing token is greater than the last
//! one a shared store saw.

mod support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use redwheel::Redwheel;
use support::RedisServer;

/// The shared store the critical sections write to: `enter` refuses a
/// second writer while one is inside and a token not greater than the last
/// one it accepted; `exit` refuses a writer that is not the one inside.
const STORE: &str = r"
if ARGV[1] == 'enter' then
  if redis.call('EXISTS', KEYS[1]) == 1 then
    return redis.error_reply('overlap: ' .. redis.call('GET', KEYS[1]) .. ' is inside')
  end
  local last = tonumber(redis.call('GET', KEYS[2]) or '0')
  if tonumber(ARGV[2]) <= last then
    return redis.error_reply('stale token ' .. ARGV[2] .. ' after ' .. last)
  end
  redis.call('SET', KEYS[1], ARGV[3])
  redis.call('SET', KEYS[2], ARGV[2])
  return redis.call('INCR', KEYS[3])
end
if redis.call('GET', KEYS[1]) ~= ARGV[3] then
  return redis.error_reply('overlap: ' .. ARGV[3] .. ' left, but it was not inside')
end
redis.call('DEL', KEYS[1])
return 0
";

const THREADS: usize = 4;

fn seconds() -> u64 {
    std::env::var("REDWHEEL_LOCK_CONTENTION_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30)
}

/// One process's share: `THREADS` threads locking and writing until the
/// deadline. Returns the number of critical sections.
fn contend(url: &str, who: &str, secs: u64) -> u64 {
    let rw = Redwheel::connect(url).unwrap();
    let deadline = Instant::now() + Duration::from_secs(secs);
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let (rw, url, who) = (rw.clone(), url.to_owned(), format!("{who}-{t}"));
            std::thread::spawn(move || {
                let mut con = redis::Client::open(url).unwrap().get_connection().unwrap();
                let store = redis::Script::new(STORE);
                let lock = rw.lock("contended").watchdog_lease(Duration::from_secs(1));
                let mut sections = 0u64;
                let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ t as u64;
                while Instant::now() < deadline {
                    let g = lock.lock().unwrap();
                    let token = g.fencing_token();
                    let call = |con: &mut redis::Connection, step: &str| -> i64 {
                        store
                            .key("test:inside")
                            .key("test:last-token")
                            .key("test:sections")
                            .arg(step)
                            .arg(token)
                            .arg(&who)
                            .invoke(con)
                            .unwrap_or_else(|e| panic!("{who}: {e}"))
                    };
                    call(&mut con, "enter");
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    if t == 0 && sections == 20 {
                        // Once per process: longer than the lease, so only
                        // the watchdog keeps it.
                        std::thread::sleep(Duration::from_millis(1_500));
                    } else {
                        std::thread::sleep(Duration::from_micros(x % 2_000));
                    }
                    assert!(!g.is_lost(), "{who}: lease lost in a critical section");
                    call(&mut con, "exit");
                    g.unlock().unwrap();
                    sections += 1;
                }
                sections
            })
        })
        .collect();
    let total = threads.into_iter().map(|t| t.join().unwrap()).sum();
    rw.shutdown(Duration::from_secs(10)).unwrap();
    total
}

/// When run as the child of `eight_threads_in_two_processes_never_overlap`
/// (the env var names the server), contends and prints its count. Run
/// normally, it does nothing.
#[test]
fn child_process_contender() {
    let Ok(url) = std::env::var("REDWHEEL_LOCK_CONTENDER_URL") else {
        return;
    };
    println!("sections {}", contend(&url, "child", seconds()));
}

#[test]
fn eight_threads_in_two_processes_never_overlap_and_tokens_increase() {
    let server = RedisServer::start();
    let child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_process_contender",
            "--test-threads=1",
            "--quiet",
            "--nocapture",
        ])
        .env("REDWHEEL_LOCK_CONTENDER_URL", server.url())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mine = contend(&server.url(), "parent", seconds());
    let out = child.wait_with_output().unwrap();
    // (A panic above leaves the child to finish its own, bounded run.)
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "the child failed:\n{text}");
    let theirs: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("sections "))
        .expect("the child's count")
        .trim()
        .parse()
        .unwrap();
    let mut con = redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let counted: u64 = redis::cmd("GET")
        .arg("test:sections")
        .query(&mut con)
        .unwrap();
    eprintln!("{mine} + {theirs} critical sections in {} s", seconds());
    assert_eq!(counted, mine + theirs, "every section counted once");
    assert!(mine > 0 && theirs > 0, "both processes got the lock");
    assert_eq!(server.int(&["EXISTS", "test:inside"]), 0);
}
