//! `redwheel watch`: every queue's counts, delivery rate and ready-age
//! quantiles, sampled every interval.

use std::io::IsTerminal as _;
use std::time::{Duration, Instant, SystemTime};

use redwheel::queue::inspect::QueueInspector;
use redwheel::{QueueStats, Redwheel};
use serde_json::{Value, json};

use crate::Failure;
use crate::out::{self, Table, emit, emit_json, epoch_ms, or_dash};
use crate::queues::inspectors;

/// Ready messages sampled per queue for `watch`'s ready-age quantiles.
const AGE_SAMPLE: usize = 1_000;

/// How often `watch` with no queue named looks for new queues.
const RESCAN_EVERY: Duration = Duration::from_secs(30);

/// One queue's reading at one instant.
struct Sample {
    stats: QueueStats,
    delivered: u64,
    at: Instant,
    /// Ready-age p50 and p99 (ms) and how many ready messages they cover.
    ages: (Option<u64>, Option<u64>, usize),
}

fn sample(q: &QueueInspector) -> Result<Sample, Failure> {
    let stats = q.stats()?;
    let delivered = q.counters()?.delivered;
    let at = Instant::now();
    let mut ages = q.ready_ages(AGE_SAMPLE)?.ages_ms;
    ages.sort_unstable();
    Ok(Sample {
        stats,
        delivered,
        at,
        ages: (
            out::quantile(&ages, 0.5),
            out::quantile(&ages, 0.99),
            ages.len(),
        ),
    })
}

/// Deliveries per second between two samples.
fn rate(before: &Sample, after: &Sample) -> f64 {
    let secs = after.at.duration_since(before.at).as_secs_f64();
    if secs <= 0.0 {
        return 0.0;
    }
    after.delivered.saturating_sub(before.delivered) as f64 / secs
}

pub fn watch(
    rw: &Redwheel,
    names: &[String],
    interval: Duration,
    once: bool,
    json: bool,
) -> Result<(), Failure> {
    let tty = std::io::stdout().is_terminal() && !json && !once;
    let mut queues = inspectors(rw, names)?;
    let mut scanned = Instant::now();
    let mut before: Vec<Sample> = queues.iter().map(sample).collect::<Result<_, _>>()?;
    loop {
        std::thread::sleep(interval);
        let after: Vec<Sample> = queues.iter().map(sample).collect::<Result<_, _>>()?;
        let now_ms = epoch_ms(SystemTime::now());
        let frame: Vec<(&str, f64, &Sample)> = queues
            .iter()
            .zip(before.iter().zip(&after))
            .map(|(q, (b, a))| (q.name(), rate(b, a), a))
            .collect();
        if json {
            let list: Vec<Value> = frame
                .iter()
                .map(|(name, r, s)| {
                    json!({
                        "queue": name,
                        "delayed": s.stats.delayed,
                        "ready": s.stats.ready,
                        "in_flight": s.stats.in_flight,
                        "dead": s.stats.dead,
                        "delivered": s.delivered,
                        "delivered_per_sec": (r * 10.0).round() / 10.0,
                        "ready_age_p50_ms": s.ages.0,
                        "ready_age_p99_ms": s.ages.1,
                        "ready_age_sampled": s.ages.2,
                    })
                })
                .collect();
            let doc = json!({
                "time_ms": now_ms,
                "interval_ms": interval.as_millis() as u64,
                "queues": list,
            });
            if once {
                emit_json(&doc);
            } else {
                emit(&format!("{doc}\n"));
            }
        } else {
            let text = watch_frame(&frame, interval, now_ms);
            if tty {
                emit(&format!("\x1b[H\x1b[2J{text}"));
            } else if once {
                emit(&text);
            } else {
                emit(&format!("{text}\n"));
            }
        }
        if once {
            return Ok(());
        }
        if names.is_empty() && scanned.elapsed() >= RESCAN_EVERY {
            queues = inspectors(rw, names)?;
            scanned = Instant::now();
            before = queues.iter().map(sample).collect::<Result<_, _>>()?;
        } else {
            before = after;
        }
    }
}

fn watch_frame(frame: &[(&str, f64, &Sample)], interval: Duration, now_ms: u64) -> String {
    let mut text = format!(
        "redwheel watch  {}  (every {}; ready-age: how long the first {} ready messages have been due)\n\n",
        out::utc(now_ms),
        out::human_ms(interval.as_millis() as u64),
        AGE_SAMPLE
    );
    if frame.is_empty() {
        text.push_str("no queues found\n");
        return text;
    }
    let mut t = Table::new(&[
        "QUEUE",
        "DELAYED",
        "READY",
        "IN-FLIGHT",
        "DEAD",
        "DELIVERED/S",
        "READY-AGE-P50",
        "READY-AGE-P99",
    ]);
    for (name, r, s) in frame {
        t.row(vec![
            (*name).to_owned(),
            s.stats.delayed.to_string(),
            s.stats.ready.to_string(),
            s.stats.in_flight.to_string(),
            s.stats.dead.to_string(),
            format!("{r:.1}"),
            or_dash(s.ages.0.map(out::human_ms)),
            or_dash(s.ages.1.map(out::human_ms)),
        ]);
    }
    text.push_str(&t.render());
    text
}
