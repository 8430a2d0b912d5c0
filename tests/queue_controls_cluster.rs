//! Every queue control through a master failover on the local 3+3 Redis
//! Cluster: queues using each control all live on one master; their state
//! is set up (a rate-limit consumer running, its window full), the replica
//! is seen to have every write, the master is killed with SIGKILL, and
//! after the replica takes over each control must still hold: the pause,
//! max_len, each dedup mode's memory (kept, throttled, debounced), the
//! priority order, a ttl (the message still expires, never delivered),
//! max_in_flight, and the rate limit's window (no burst right after the
//! failover: nothing above the limit, and the failover lost nothing).

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use redwheel::{Dedup, ErrorKind, MessageId, OfferOptions, Offered, Queue, QueueOptions};
use support::cluster::RedisCluster;
use support::within;

const HANG: Duration = Duration::from_secs(120);

/// A queue name `<prefix>-<i>` whose slot the master on `port` serves.
fn name_on(cluster: &RedisCluster, prefix: &str, port: u16) -> String {
    (0..10_000)
        .map(|i| format!("{prefix}-{i}"))
        .find(|n| cluster.master_of_slot(cluster.keyslot(n)) == port)
        .expect("a name on that master")
}

/// Waits until the replica of the master on `port` has every write the
/// master has made (their replication offsets agree).
fn wait_replicated(cluster: &RedisCluster, port: u16) {
    let offset = |info: &str, key: &str| -> Option<u64> {
        info.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().parse().ok())
    };
    let give_up = std::time::Instant::now() + HANG;
    loop {
        let info = cluster.node(port).info("replication");
        let master = offset(&info, "master_repl_offset:").unwrap();
        let replica = info
            .lines()
            .find(|l| l.starts_with("slave0:"))
            .and_then(|l| l.split(',').find_map(|f| f.strip_prefix("offset=")))
            .and_then(|v| v.parse::<u64>().ok());
        if replica == Some(master) {
            return;
        }
        assert!(
            std::time::Instant::now() < give_up,
            "replica behind: {info}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn wait_until(what: &str, mut check: impl FnMut() -> bool) {
    let give_up = std::time::Instant::now() + HANG;
    while !check() {
        assert!(
            std::time::Instant::now() < give_up,
            "not within {HANG:?}: {what}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Retries a call while the cluster fails over (transient errors).
fn retry<R>(mut f: impl FnMut() -> Result<R, redwheel::Error>) -> R {
    let give_up = std::time::Instant::now() + HANG;
    loop {
        match f() {
            Ok(r) => return r,
            Err(e) if e.is_transient() && std::time::Instant::now() < give_up => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("{e}"),
        }
    }
}

#[test]
fn every_control_holds_through_a_master_failover() {
    let mut cluster = RedisCluster::start();
    let rw = cluster.connect();
    let owner = cluster.master_of_slot(cluster.keyslot("c-rate"));
    let queue = |prefix: &str, o: QueueOptions| -> Queue<String> {
        rw.queue_with::<String>(&name_on(&cluster, prefix, owner), o)
            .unwrap()
    };
    let visibility = Duration::from_secs(120);

    // Pause: paused, with messages ready.
    let paused = queue("c-pause", QueueOptions::default());
    paused.pause().unwrap();
    for i in 0..3 {
        paused.offer(&format!("p{i}"), Duration::ZERO).unwrap();
    }
    // max_len: full.
    let bounded = queue("c-len", QueueOptions::default().max_len(20));
    for i in 0..20 {
        bounded
            .offer(&format!("l{i}"), Duration::from_secs(3600))
            .unwrap();
    }
    // Dedup: a kept key waiting, a throttled key already consumed, a
    // debounced key waiting.
    let dedup = queue("c-dedup", QueueOptions::default());
    let later = || OfferOptions::after(Duration::from_secs(3600));
    dedup.offer_with(&"k1".into(), later().id("k1")).unwrap();
    let throttle = || {
        OfferOptions::default()
            .id("k2")
            .dedup(Dedup::Throttle(Duration::from_secs(600)))
    };
    assert!(
        dedup
            .offer_with(&"k2".into(), throttle())
            .unwrap()
            .is_written()
    );
    assert_eq!(dedup.take().unwrap().payload(), "k2");
    let debounce = || later().id("k3").dedup(Dedup::Debounce);
    dedup.offer_with(&"v1".into(), debounce()).unwrap();
    // Priorities: 30 ready, priorities 0..9.
    let prio = queue("c-prio", QueueOptions::default().visibility(visibility));
    for i in 0..30u8 {
        prio.offer_with(
            &format!("{i}"),
            OfferOptions::default()
                .id(format!("r{i:02}"))
                .priority(i % 10),
        )
        .unwrap();
    }
    // A ttl that runs out after the failover.
    let ttl = queue("c-ttl", QueueOptions::default());
    ttl.offer_with(
        &"t".into(),
        OfferOptions::default().id("t").ttl(Duration::from_secs(8)),
    )
    .unwrap();
    // max_in_flight: 3 held of 6.
    let slots = queue(
        "c-mif",
        QueueOptions::default()
            .max_in_flight(3)
            .visibility(visibility),
    );
    for i in 0..6 {
        slots.offer(&format!("s{i}"), Duration::ZERO).unwrap();
    }
    let held: Vec<_> = (0..3)
        .map(|_| slots.claim(Duration::from_secs(10)).unwrap().unwrap())
        .collect();
    assert!(slots.claim(Duration::from_millis(100)).unwrap().is_none());
    // Rate limit: 5 per 10 s, a consumer claiming throughout.
    let (max, per) = (5usize, Duration::from_secs(10));
    let rate = queue(
        "c-rate",
        QueueOptions::default()
            .rate_limit(max as u32, per)
            .visibility(visibility),
    );
    for i in 0..30 {
        rate.offer(&format!("x{i}"), Duration::ZERO).unwrap();
    }
    let times = Arc::new(Mutex::new(Vec::<u64>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let consumer = {
        let (rate, times, stop) = (rate.clone(), Arc::clone(&times), Arc::clone(&stop));
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                match rate.claim(Duration::from_millis(200)) {
                    Ok(Some(d)) => {
                        let until = d.visible_until().duration_since(UNIX_EPOCH).unwrap();
                        times
                            .lock()
                            .unwrap()
                            .push((until - visibility).as_millis() as u64);
                        // Acked or not, it stays counted in the window.
                        let _ = d.ack();
                    }
                    Ok(None) => {}
                    Err(e) => assert!(e.is_transient(), "{e}"),
                }
            }
        })
    };
    wait_until("the first window to fill", || {
        times.lock().unwrap().len() == max
    });
    wait_until("every message ready", || {
        paused.stats().unwrap().ready == 3 && prio.stats().unwrap().ready == 30
    });

    // The replica has every write; the window is full, so nothing is
    // handed out (or written) until the master is gone.
    wait_replicated(&cluster, owner);
    cluster.kill(owner);
    cluster.wait_failover(owner, HANG);
    assert_ne!(cluster.master_of_slot(cluster.keyslot("c-rate")), owner);

    // Pause: still paused; resume works on the new master.
    assert!(retry(|| paused.is_paused()));
    assert!(retry(|| paused.poll(Duration::from_millis(300))).is_none());
    retry(|| paused.resume());
    for _ in 0..3 {
        assert!(retry(|| paused.take()).payload().starts_with('p'));
    }
    // max_len: still full.
    let e = bounded
        .offer(&"more".into(), Duration::from_secs(3600))
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::QueueFull);
    assert_eq!(retry(|| bounded.len()), 20);
    // Dedup: each key remembered.
    assert_eq!(
        retry(|| dedup.offer_with(&"k1'".into(), later().id("k1"))),
        Offered::Kept(MessageId::from("k1"))
    );
    assert_eq!(
        retry(|| dedup.offer_with(&"k2'".into(), throttle())),
        Offered::Throttled(MessageId::from("k2"))
    );
    assert_eq!(
        retry(|| dedup.offer_with(&"v2".into(), debounce())),
        Offered::Replaced(MessageId::from("k3"))
    );
    // Priorities: highest first, then id order.
    let order: Vec<String> = (0..30)
        .map(|_| {
            let d = retry(|| prio.claim(Duration::from_secs(5))).unwrap();
            d.ack().unwrap();
            d.id().to_string()
        })
        .collect();
    let mut want: Vec<(u8, String)> = (0..30u8).map(|i| (i % 10, format!("r{i:02}"))).collect();
    want.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    let want: Vec<String> = want.into_iter().map(|(_, id)| id).collect();
    assert_eq!(order, want);
    // ttl: expires on the new master, never delivered.
    wait_until("the ttl to run out", || {
        ttl.stats().map(|s| s.expired == 1).unwrap_or(false)
    });
    assert!(retry(|| ttl.poll(Duration::from_millis(200))).is_none());
    assert_eq!(ttl.dead_letters(1).unwrap()[0].reason(), "expired");
    // max_in_flight: still three held, so nothing more until one is acked.
    assert!(retry(|| slots.claim(Duration::from_millis(300))).is_none());
    let mut held = held.into_iter();
    held.next().unwrap().ack().unwrap();
    assert!(retry(|| slots.claim(Duration::from_secs(10))).is_some());
    // Rate: the next window opens only 10 s after the first (the new
    // master knew the first window's deliveries).
    wait_until("the second window", || {
        times.lock().unwrap().len() >= 2 * max
    });
    stop.store(true, Ordering::SeqCst);
    within(HANG, move || consumer.join().unwrap());
    let mut times = times.lock().unwrap().clone();
    times.sort_unstable();
    let per_ms = per.as_millis() as u64;
    for w in times.windows(max + 1) {
        assert!(
            w[max] - w[0] >= per_ms,
            "{} deliveries within {} ms across the failover: {times:?}",
            max + 1,
            w[max] - w[0]
        );
    }
}
