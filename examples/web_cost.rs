//! What the dashboard costs Redis with its page open (the guide's "The dashboard").
//!
//! ```text
//! cargo run --release --example web_cost --features web -- redis://127.0.0.1:6379 1000 60
//! ```
//!
//! Against a Redis that nothing else uses (it writes `N` queues named
//! `web-cost-*`, and deletes them at the end), in one sitting:
//! 1. **idle**: no client for `SECS` seconds;
//! 2. **dashboard**: `redwheel::web::Dashboard` (default 2 s refresh) with a
//!    page open: a client that loads `/` every 2 s, as the page's live
//!    refresh does;
//! 3. **per queue**: the same counts read as a tool would with the public
//!    inspector, one queue after the other (`stats_at` and `counters`: two
//!    round trips per queue), every 2 s.
//!
//! For each: Redis's CPU (`INFO cpu`, used_cpu_sys + used_cpu_user) per
//! second of wall time, and per refresh the commands Redis ran
//! (`total_commands_processed`, which counts the calls made inside the
//! stats script too: about 9 per queue either way) and its read events
//! (`total_reads_processed`: how many times it read a socket, about one
//! per round trip for small requests, one per 16 KiB for a big pipeline);
//! for the dashboard, the round trips and commands it sent by its own count
//! (`/api/status`).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use redwheel::web::Dashboard;
use redwheel::{Nacked, QueueOptions, Redwheel};

const REFRESH: Duration = Duration::from_secs(2);

fn info(con: &mut redis::Connection) -> (f64, u64, u64) {
    let text: String = redis::cmd("INFO").arg("everything").query(con).unwrap();
    let field = |name: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}:")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0)
    };
    (
        field("used_cpu_sys") + field("used_cpu_user"),
        field("total_commands_processed") as u64,
        field("total_reads_processed") as u64,
    )
}

fn get(addr: SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out.split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default()
}

struct Sample {
    cpu_ms_per_s: f64,
    commands: u64,
    reads: u64,
    refreshes: u64,
}

/// Runs `during` for `secs` seconds and measures Redis meanwhile.
fn measure(con: &mut redis::Connection, mut during: impl FnMut() -> u64) -> Sample {
    let (cpu0, cmd0, reads0) = info(con);
    let start = Instant::now();
    let refreshes = during();
    let wall = start.elapsed().as_secs_f64();
    let (cpu1, cmd1, reads1) = info(con);
    Sample {
        cpu_ms_per_s: (cpu1 - cpu0) * 1_000.0 / wall,
        // The INFO call itself is one command and one read.
        commands: cmd1 - cmd0 - 1,
        reads: reads1 - reads0 - 1,
        refreshes,
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .unwrap_or_else(|| "redis://127.0.0.1:6379".to_owned());
    let n: usize = args.next().map_or(1_000, |s| s.parse().unwrap());
    let secs: u64 = args.next().map_or(60, |s| s.parse().unwrap());
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut con = client.get_connection().unwrap();

    let names: Vec<String> = (0..n).map(|i| format!("web-cost-{i:05}")).collect();
    {
        let rw = Redwheel::connect(&url).unwrap();
        for (i, name) in names.iter().enumerate() {
            let q = rw
                .queue_with::<String>(name, QueueOptions::default().max_deliveries(1))
                .unwrap();
            q.offer(&format!("job {i}"), Duration::from_secs(3_600))
                .unwrap();
            if i % 10 == 0 {
                q.offer(&"bad".to_owned(), Duration::ZERO).unwrap();
                let d = loop {
                    if let Some(d) = q.claim(Duration::from_secs(1)).unwrap() {
                        break d;
                    }
                };
                assert_eq!(d.nack(Duration::ZERO).unwrap(), Nacked::Dead);
            }
        }
        rw.shutdown(Duration::from_secs(5)).unwrap();
    }
    let deadline = |start: Instant| start + Duration::from_secs(secs);

    let idle = measure(&mut con, || {
        std::thread::sleep(Duration::from_secs(secs));
        0
    });

    let rw = Redwheel::connect(&url).unwrap();
    let web = Dashboard::new(&rw).serve("127.0.0.1:0").unwrap();
    let addr = web.local_addr();
    // Let the first round (with its SCAN) pass before measuring.
    while !get(addr, "/api/status").contains("\"redis\":\"up\"") {
        std::thread::sleep(Duration::from_millis(50));
    }
    let snapshot = |addr| -> u64 {
        let s = get(addr, "/api/status");
        let v: serde_json::Value = serde_json::from_str(&s).unwrap();
        v["snapshot"].as_u64().unwrap()
    };
    let page = measure(&mut con, || {
        let (start, first) = (Instant::now(), snapshot(addr));
        while Instant::now() < deadline(start) {
            let _ = get(addr, "/");
            std::thread::sleep(REFRESH);
        }
        snapshot(addr) - first
    });
    let status: serde_json::Value = serde_json::from_str(&get(addr, "/api/status")).unwrap();
    web.stop();

    let inspectors: Vec<_> = names.iter().map(|q| rw.inspect_queue(q).unwrap()).collect();
    let naive = measure(&mut con, || {
        let (start, mut rounds) = (Instant::now(), 0);
        while Instant::now() < deadline(start) {
            let began = Instant::now();
            for q in &inspectors {
                q.stats_at().unwrap();
                q.counters().unwrap();
            }
            rounds += 1;
            std::thread::sleep(REFRESH.saturating_sub(began.elapsed()));
        }
        rounds
    });
    rw.shutdown(Duration::from_secs(5)).unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("redwheel:{web-cost-*")
        .query(&mut con)
        .unwrap();
    for chunk in keys.chunks(1_000) {
        let _: () = redis::cmd("DEL").arg(chunk).query(&mut con).unwrap();
    }

    let last = &status["last_refresh"];
    println!(
        "queues: {n}; {secs} s per phase; refresh every {} s",
        REFRESH.as_secs()
    );
    println!(
        "dashboard's own count per refresh: {} round trip(s), {} commands, {} ms",
        last["round_trips"], last["commands"], last["took_ms"]
    );
    println!("phase        redis cpu ms/s  refreshes  commands run/refresh  read events/refresh");
    for (name, s) in [("idle", &idle), ("dashboard", &page), ("per queue", &naive)] {
        let per = |x: u64| {
            if s.refreshes == 0 {
                "-".to_owned()
            } else {
                format!("{:.0}", x as f64 / s.refreshes as f64)
            }
        };
        println!(
            "{name:<12} {:>14.2}  {:>9}  {:>20}  {:>19}",
            s.cpu_ms_per_s,
            s.refreshes,
            per(s.commands),
            per(s.reads)
        );
    }
}
