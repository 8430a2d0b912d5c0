//! Serves redwheel's metrics for Prometheus while a small workload runs.
//!
//! Installs the `metrics-exporter-prometheus` recorder (before connecting:
//! redwheel looks its metric handles up when a queue is opened), serves
//! `GET /metrics` on `127.0.0.1:<port>` from a tiny std HTTP responder,
//! and keeps two queues and a lock busy so that every series moves:
//!
//! * `emails`: offers with delays of 0-2 s, consumed by a pool whose
//!   handler fails one message in ten (nacked, retried, dead after three
//!   deliveries);
//! * `invoices`: claimed one at a time with a 1 s visibility; one claim in
//!   five is never acked, so it comes back when its visibility ends (a
//!   redelivery) and dies after three deliveries;
//! * a lock with a 3 s watchdog lease, held for 2 s at a time (renewals).
//!
//! The backlog gauges (`redwheel_queue_messages`,
//! `redwheel_queue_oldest_overdue_seconds`) are set by `Queue::stats()`,
//! which this program calls for each queue every second.
//!
//! ```text
//! cargo run --example prometheus --features metrics -- [--port 9898] [--seconds N]
//! curl -s http://127.0.0.1:9898/metrics | grep '^redwheel_'
//! ```
//!
//! The port comes from `--port`, else `METRICS_PORT`, else 9898; 0 lets the
//! OS pick one (the URL printed says which). It uses the Redis at
//! `REDIS_URL` if set; otherwise it starts a throwaway `redis-server` on a
//! free loopback port. It runs until killed, or for `--seconds N`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use redwheel::{ConsumerOptions, QueueOptions, Redwheel};

use redwheel_testkit::ThrowawayRedis;

#[path = "support/metrics_http.rs"]
mod metrics_http;
use metrics_http::MetricsServer;

#[path = "../../examples/support/splitmix.rs"]
mod splitmix;
use splitmix::SplitMix64;

/// Histogram buckets (seconds) for the latency-like series: 100 µs to 10 s.
const SECONDS_BUCKETS: &[f64] = &[
    0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (port, seconds) = parse_args()?;

    // 1. The recorder first: handles looked up before it is installed are
    //    no-ops. Seconds histograms get buckets (else they render as
    //    summaries).
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".to_owned()), SECONDS_BUCKETS)?
        .install_recorder()?;

    // 2. Redis.
    let (url, _server) = match std::env::var("REDIS_URL") {
        Ok(url) => (url, None),
        Err(_) => {
            let server = ThrowawayRedis::start("prometheus")?;
            (server.url(), Some(server))
        }
    };
    println!("using {url}");
    let rw = Redwheel::connect(&url)?;

    // 3. The scrape endpoint. Upkeep drains the histograms' buffers; once
    //    per scrape is enough for this example.
    let http = MetricsServer::start(&format!("127.0.0.1:{port}"), move || {
        handle.run_upkeep();
        handle.render()
    })?;
    println!("serving metrics at http://{}/metrics", http.addr());

    // 4. The workload.
    let stop = Arc::new(AtomicBool::new(false));
    let opts = QueueOptions::default().max_deliveries(3);
    let emails =
        rw.queue_with::<String>("emails", opts.clone().visibility(Duration::from_secs(5)))?;
    let invoices = rw.queue_with::<String>("invoices", opts.visibility(Duration::from_secs(1)))?;
    let mut threads = Vec::new();

    // Producers.
    for (q, every) in [
        (emails.clone(), Duration::from_millis(50)),
        (invoices.clone(), Duration::from_millis(200)),
    ] {
        let stop = Arc::clone(&stop);
        threads.push(thread::spawn(move || {
            let mut rng = SplitMix64(q.name().len() as u64);
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let delay = Duration::from_millis(rng.range(0, 2_000));
                if let Err(e) = q.offer(&format!("{} #{n}", q.name()), delay) {
                    eprintln!("offer to {}: {e}", q.name());
                }
                thread::sleep(every);
            }
        }));
    }

    // `emails`: a consumer pool; one message in ten fails.
    let failing = Arc::new(std::sync::Mutex::new(SplitMix64(7)));
    let consumer = emails.consume(
        ConsumerOptions::default()
            .concurrency(4)
            .retry_backoff(Duration::from_millis(100), Duration::from_millis(500)),
        move |d| {
            thread::sleep(Duration::from_millis(5));
            if failing.lock().unwrap().range(0, 9) == 0 {
                Err(format!("could not send {}", d.payload()))
            } else {
                Ok(())
            }
        },
    )?;

    // `invoices`: claims; one in five is left to expire.
    {
        let (q, stop) = (invoices.clone(), Arc::clone(&stop));
        threads.push(thread::spawn(move || {
            let mut rng = SplitMix64(11);
            while !stop.load(Ordering::Relaxed) {
                match q.claim(Duration::from_millis(500)) {
                    Ok(Some(d)) if rng.range(0, 4) == 0 => drop(d), // expires
                    Ok(Some(d)) => {
                        if let Err(e) = d.ack() {
                            eprintln!("ack: {e}");
                        }
                    }
                    Ok(None) => {}
                    Err(e) => eprintln!("claim: {e}"),
                }
            }
        }));
    }

    // A lock held for 2 s at a time under a 3 s watchdog lease.
    {
        let (lock, stop) = (
            rw.lock("reports").watchdog_lease(Duration::from_secs(3)),
            Arc::clone(&stop),
        );
        threads.push(thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                match lock.lock() {
                    Ok(guard) => {
                        thread::sleep(Duration::from_secs(2));
                        drop(guard);
                    }
                    Err(e) => eprintln!("lock: {e}"),
                }
                thread::sleep(Duration::from_millis(100));
            }
        }));
    }

    // The backlog gauges: `stats()` every second.
    let started = Instant::now();
    while seconds.is_none_or(|s| started.elapsed() < Duration::from_secs(s)) {
        for q in [&emails, &invoices] {
            if let Err(e) = q.stats() {
                eprintln!("stats of {}: {e}", q.name());
            }
        }
        thread::sleep(Duration::from_secs(1));
    }

    stop.store(true, Ordering::Relaxed);
    consumer.shutdown(Duration::from_secs(5))?;
    for t in threads {
        let _ = t.join();
    }
    drop(http);
    rw.shutdown(Duration::from_secs(5))?;
    Ok(())
}

/// `--port N` (else `METRICS_PORT`, else 9898) and `--seconds N`.
fn parse_args() -> Result<(u16, Option<u64>), Box<dyn std::error::Error>> {
    let mut port = match std::env::var("METRICS_PORT") {
        Ok(p) => p.parse()?,
        Err(_) => 9898,
    };
    let mut seconds = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--port" => port = value()?.parse()?,
            "--seconds" => seconds = Some(value()?.parse()?),
            other => {
                return Err(format!("unknown argument {other:?} (--port N, --seconds N)").into());
            }
        }
    }
    Ok((port, seconds))
}
