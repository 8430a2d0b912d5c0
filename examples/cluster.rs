//! Delayed queues on a Redis Cluster.
//!
//! Spreads 100 queues over the masters (each queue lives in the slot of its
//! `{hash tag}`), offers 20 messages to each with delays of 100 ms to 2 s,
//! takes them all, and prints how many queues and messages each master
//! served and how late delivery ran.
//!
//! Run with `cargo run --example cluster`. It uses the cluster whose node
//! URLs are in `REDIS_CLUSTER_URLS` (comma-separated) if set; otherwise it
//! starts a throwaway local cluster of six `redis-server`s (three masters,
//! three replicas) and stops it at the end.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redwheel::Redwheel;

#[path = "support/splitmix.rs"]
mod splitmix;
#[path = "support/throwaway_cluster.rs"]
mod throwaway_cluster;
use splitmix::SplitMix64;
use throwaway_cluster::ThrowawayCluster;

/// First slot, last slot, and the master (`host:port`) serving them.
type SlotRange = (u16, u16, String);

/// The master (`host:port`) serving each slot range, from `CLUSTER SLOTS`
/// (each entry: first slot, last slot, [host, port, id], replicas…).
fn slot_owners(seed: &str) -> Result<Vec<SlotRange>, Box<dyn std::error::Error>> {
    let mut con = redis::Client::open(seed)?.get_connection()?;
    let raw: Vec<redis::Value> = redis::cmd("CLUSTER").arg("SLOTS").query(&mut con)?;
    let mut owners = Vec::new();
    for range in raw {
        let redis::Value::Array(items) = range else {
            continue;
        };
        let (Some(first), Some(last), Some(redis::Value::Array(master))) =
            (items.first(), items.get(1), items.get(2))
        else {
            continue;
        };
        let first: u16 = redis::from_redis_value(first.clone())?;
        let last: u16 = redis::from_redis_value(last.clone())?;
        let host: String = redis::from_redis_value(master[0].clone())?;
        let port: u16 = redis::from_redis_value(master[1].clone())?;
        owners.push((first, last, format!("{host}:{port}")));
    }
    Ok(owners)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (urls, _cluster) = match std::env::var("REDIS_CLUSTER_URLS") {
        Ok(list) => (
            list.split(',')
                .map(|s| s.trim().to_owned())
                .collect::<Vec<_>>(),
            None,
        ),
        Err(_) => {
            println!("starting a throwaway local cluster (3 masters, 3 replicas)");
            let c = ThrowawayCluster::start("cluster-example")?;
            (c.urls(), Some(c))
        }
    };
    let seeds: Vec<&str> = urls.iter().map(String::as_str).collect();
    let rw = Redwheel::connect_cluster(&seeds)?;
    println!("connected: {rw:?}");

    let owners = slot_owners(seeds[0])?;
    let mut seed_con = redis::Client::open(seeds[0])?.get_connection()?;
    let mut per_master: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    let mut consumers = Vec::new();
    let mut rng = SplitMix64(7);
    for i in 0..100 {
        let name = format!("example-{i}");
        let slot: u16 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(&name)
            .query(&mut seed_con)?;
        let master = owners
            .iter()
            .find(|(a, b, _)| *a <= slot && slot <= *b)
            .map(|(_, _, m)| m.clone())
            .unwrap_or_else(|| "?".to_owned());
        let q = rw.queue::<String>(&name)?;
        q.clear()?;
        let batch: Vec<(String, Duration)> = (0..20)
            .map(|j| {
                (
                    format!("{name}/{j}"),
                    Duration::from_millis(rng.range(100, 2_000)),
                )
            })
            .collect();
        q.offer_batch(&batch)?;
        let entry = per_master.entry(master).or_default();
        entry.0 += 1;
        entry.1 += batch.len();
        consumers.push(std::thread::spawn(
            move || -> Result<Vec<f64>, redwheel::Error> {
                let mut late = Vec::new();
                for _ in 0..20 {
                    let m = q.take()?;
                    let now = SystemTime::now()
                        .duration_since(UNIX_EPOCH)
                        .unwrap_or_default();
                    late.push(now.as_secs_f64() * 1e3 - m.due_ms() as f64);
                }
                Ok(late)
            },
        ));
    }
    let mut late = Vec::new();
    for c in consumers {
        late.extend(c.join().map_err(|_| "a consumer panicked")??);
    }
    late.sort_by(f64::total_cmp);
    println!("{:<22} {:>7} {:>9}", "master", "queues", "messages");
    for (master, (queues, messages)) in &per_master {
        println!("{master:<22} {queues:>7} {messages:>9}");
    }
    let pct = |p: f64| late[((p * late.len() as f64).ceil() as usize).max(1) - 1];
    println!(
        "{} messages delivered; lateness p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms; {} early",
        late.len(),
        pct(0.5),
        pct(0.99),
        late[late.len() - 1],
        late.iter().filter(|&&l| l < 0.0).count()
    );
    rw.shutdown(Duration::from_secs(10))?;
    Ok(())
}
