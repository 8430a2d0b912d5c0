//! Queue controls on the producing side, against real redis-server
//! processes: `offer_with` and its options, each dedup mode (one process
//! for the exact semantics, then 8 producer processes offering the same
//! keys at once), `max_len` (one process, then 8 producer processes: the
//! length never passes the bound), priorities (a burst handed out highest
//! first, equal priorities in due and offer order), and ttl expiry (by the
//! transfer job, and by a consumer that meets an expired message first;
//! never delivered late).

mod queue_controls_common;
mod support;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use queue_controls_common::{Fleet, connection, ready_and_wait, report, results, role, wait_until};
use redwheel::{Dedup, ErrorKind, MessageId, OfferOptions, Offered, QueueOptions, Redwheel};
use support::{RedisServer, within};

const HANG: Duration = Duration::from_secs(120);

/// Keys every producer of the fleet tests offers under.
const KEYS: usize = 200;

fn setup() -> (RedisServer, Redwheel) {
    let server = RedisServer::start();
    let rw = server.connect();
    (server, rw)
}

fn key(i: usize) -> MessageId {
    MessageId::from(format!("key-{i:04}"))
}

// ------------------------------------------------------------ offer_with

#[test]
fn offer_with_without_options_is_an_offer_and_checks_its_options() {
    let (_server, rw) = setup();
    let q = rw.queue::<String>("plain").unwrap();
    let r = q
        .offer_with(&"a".to_string(), OfferOptions::default())
        .unwrap();
    assert!(matches!(r, Offered::Written(_)), "{r:?}");
    assert_eq!(q.take().unwrap().id(), r.id());

    let at = SystemTime::now() + Duration::from_secs(3600);
    let r = q
        .offer_with(&"b".to_string(), OfferOptions::at(at))
        .unwrap();
    assert_eq!(q.stats().unwrap().delayed, 1);
    assert!(q.remove(r.id()).unwrap());

    let bad = [
        OfferOptions::default().priority(10),
        OfferOptions::default().ttl(Duration::ZERO),
        OfferOptions::default().dedup(Dedup::Keep),
        OfferOptions::default()
            .id("k")
            .dedup(Dedup::Throttle(Duration::ZERO)),
        OfferOptions::default().id(""),
    ];
    for o in bad {
        let e = q.offer_with(&"x".to_string(), o.clone()).unwrap_err();
        assert!(e.is_invalid_input(), "{o:?}: {e}");
    }
    assert_eq!(q.len().unwrap(), 0, "nothing written by a refused offer");
}

// ------------------------------------------------------------ dedup: one process

#[test]
fn keep_drops_offers_while_the_key_is_known_and_frees_it_once_consumed() {
    let (_server, rw) = setup();
    let q = rw.queue::<String>("keep").unwrap();
    let o = || OfferOptions::after(Duration::from_secs(3600)).id("k");
    assert_eq!(
        q.offer_with(&"first".into(), o()).unwrap(),
        Offered::Written(MessageId::from("k"))
    );
    assert_eq!(
        q.offer_with(&"second".into(), o().dedup(Dedup::Keep))
            .unwrap(),
        Offered::Kept(MessageId::from("k"))
    );
    // offer_with_id is the same mode.
    assert!(
        !q.offer_with_id(&MessageId::from("k"), &"third".into(), Duration::ZERO)
            .unwrap()
    );
    // In flight counts as known.
    let q2 = rw.queue::<String>("keep2").unwrap();
    q2.offer_with(&"a".into(), OfferOptions::default().id("f"))
        .unwrap();
    let d = within(HANG, {
        let q2 = q2.clone();
        move || q2.claim(Duration::from_secs(30)).unwrap().unwrap()
    });
    assert_eq!(
        q2.offer_with(&"b".into(), OfferOptions::default().id("f"))
            .unwrap(),
        Offered::Kept(MessageId::from("f"))
    );
    d.ack().unwrap();
    // Consumed: the key is free again (what Throttle is for).
    assert_eq!(
        q2.offer_with(&"c".into(), OfferOptions::default().id("f"))
            .unwrap(),
        Offered::Written(MessageId::from("f"))
    );
    let m = within(HANG, move || q2.take().unwrap());
    assert_eq!(m.payload(), "c");
    // The kept message still has its first payload.
    let held = rw
        .inspect_queue("keep")
        .unwrap()
        .peek(redwheel::queue::inspect::MessageState::Delayed, 10)
        .unwrap();
    assert_eq!(held.len(), 1);
    assert_eq!(held[0].payload.as_deref(), Some(&b"first"[..]));
}

#[test]
fn throttle_drops_offers_for_the_window_even_after_delivery() {
    let (server, rw) = setup();
    let q = rw.queue::<String>("throttle").unwrap();
    let window = Duration::from_millis(800);
    let o = || {
        OfferOptions::default()
            .id("t")
            .dedup(Dedup::Throttle(window))
    };
    assert!(q.offer_with(&"1".into(), o()).unwrap().is_written());
    let m = within(HANG, {
        let q = q.clone();
        move || q.take().unwrap()
    });
    assert_eq!(m.payload(), "1");
    assert_eq!(q.len().unwrap(), 0, "delivered and gone");
    // Within the window: dropped although the message is gone.
    assert_eq!(
        q.offer_with(&"2".into(), o()).unwrap(),
        Offered::Throttled(MessageId::from("t"))
    );
    // The window lives in Redis with the window as its TTL.
    let ttl = server.int(&["PTTL", "redwheel:{throttle}:throttle:t"]);
    assert!(ttl > 0 && ttl <= 800, "PTTL {ttl}");
    // Past the window (the server expires the marker): written again.
    wait_until(HANG, "the throttle window to end", || {
        server.int(&["EXISTS", "redwheel:{throttle}:throttle:t"]) == 0
    });
    assert!(q.offer_with(&"3".into(), o()).unwrap().is_written());
    // A message still waiting past the window is kept, as with Keep.
    let q = rw.queue::<String>("throttle-wait").unwrap();
    let o = || {
        OfferOptions::after(Duration::from_secs(3600))
            .id("w")
            .dedup(Dedup::Throttle(Duration::from_millis(1)))
    };
    assert!(q.offer_with(&"1".into(), o()).unwrap().is_written());
    wait_until(HANG, "the 1 ms window to end", || {
        server.int(&["EXISTS", "redwheel:{throttle-wait}:throttle:w"]) == 0
    });
    assert_eq!(
        q.offer_with(&"2".into(), o()).unwrap(),
        Offered::Kept(MessageId::from("w"))
    );
}

#[test]
fn a_producer_retrying_under_throttle_writes_once_even_after_a_fast_consumer() {
    // The chaos run's finding: a retry after OutcomeUnknown, when a consumer
    // already took and acked the first attempt's message. With Keep the
    // retry writes it again; with Throttle it does not.
    let (_server, rw) = setup();
    for (mode, expect_second) in [
        (Dedup::Keep, true),
        (Dedup::Throttle(Duration::from_secs(60)), false),
    ] {
        let q = rw
            .queue::<String>(&format!("retry-{expect_second}"))
            .unwrap();
        let o = OfferOptions::default().id("order-7").dedup(mode);
        assert!(q.offer_with(&"x".into(), o.clone()).unwrap().is_written());
        let d = within(HANG, {
            let q = q.clone();
            move || q.claim(Duration::from_secs(30)).unwrap().unwrap()
        });
        d.ack().unwrap();
        // The producer never saw the first reply, and retries.
        let again = q.offer_with(&"x".into(), o).unwrap();
        assert_eq!(again.is_written(), expect_second, "{mode:?}: {again:?}");
    }
}

#[test]
fn debounce_replaces_a_waiting_message_and_follows_one_already_delivered() {
    let (_server, rw) = setup();
    let q = rw
        .queue_with::<String>(
            "debounce",
            QueueOptions::default().visibility(Duration::from_secs(60)),
        )
        .unwrap();
    let o = |d: u64| {
        OfferOptions::after(Duration::from_millis(d))
            .id("doc-1")
            .dedup(Dedup::Debounce)
    };
    let k = MessageId::from("doc-1");
    assert_eq!(
        q.offer_with(&"v1".into(), o(3_600_000)).unwrap(),
        Offered::Written(k.clone())
    );
    assert_eq!(
        q.offer_with(&"v2".into(), o(3_600_000)).unwrap(),
        Offered::Replaced(k.clone())
    );
    // The new due time applies: now due at once.
    assert_eq!(
        q.offer_with(&"v3".into(), o(0)).unwrap(),
        Offered::Replaced(k.clone())
    );
    assert_eq!(q.len().unwrap(), 1);
    let d = within(HANG, {
        let q = q.clone();
        move || q.claim(Duration::from_secs(30)).unwrap().unwrap()
    });
    assert_eq!((d.id(), d.payload().as_str()), (&k, "v3"));
    // In flight: a new message beside it, under a fresh id.
    let after = q.offer_with(&"v4".into(), o(3_600_000)).unwrap();
    let Offered::WrittenAfter {
        id: next,
        after: before,
    } = after.clone()
    else {
        panic!("{after:?}");
    };
    assert_eq!(before, k);
    assert_ne!(next, k);
    // The key now leads to the successor, which is debounced in turn.
    assert_eq!(
        q.offer_with(&"v5".into(), o(0)).unwrap(),
        Offered::Replaced(next.clone())
    );
    d.ack().unwrap();
    let d = within(HANG, {
        let q = q.clone();
        move || q.claim(Duration::from_secs(30)).unwrap().unwrap()
    });
    assert_eq!((d.id(), d.payload().as_str()), (&next, "v5"));
    d.ack().unwrap();
    assert_eq!(q.len().unwrap(), 0);
    // Everything consumed: the key writes a message of its own again.
    assert_eq!(
        q.offer_with(&"v6".into(), o(3_600_000)).unwrap(),
        Offered::Written(k)
    );
}

#[test]
fn debounce_of_a_ready_message_moves_it_back_and_it_is_delivered_once() {
    let (_server, rw) = setup();
    let q = rw.queue::<String>("debounce-ready").unwrap();
    let o = |d: u64| {
        OfferOptions::after(Duration::from_millis(d))
            .id("r")
            .dedup(Dedup::Debounce)
    };
    q.offer_with(&"old".into(), o(0)).unwrap();
    wait_until(HANG, "the message to be ready", || {
        q.stats().unwrap().ready == 1
    });
    assert_eq!(
        q.offer_with(&"new".into(), o(300)).unwrap(),
        Offered::Replaced(MessageId::from("r"))
    );
    let s = q.stats().unwrap();
    assert_eq!(s.delayed, 1, "back in the delayed set: {s:?}");
    let m = within(HANG, {
        let q = q.clone();
        move || q.take().unwrap()
    });
    assert_eq!(m.payload(), "new");
    assert_eq!(q.len().unwrap(), 0);
    // The old ready entry was skipped, not delivered.
    assert!(q.poll(Duration::from_millis(300)).unwrap().is_none());
}

// ------------------------------------------------------------ dedup: 8 processes

/// The producer processes of the dedup fleet tests: offer every key
/// `rounds` times in the mode named by `DEDUP_MODE`, and report each
/// outcome as `key kind id payload`.
#[test]
fn child_role() {
    if let Some((url, index)) = role("dedup-producer") {
        let rw = Redwheel::connect(&url).unwrap();
        let q = rw.queue::<String>("fleet").unwrap();
        let mode = match queue_controls_common::env("DEDUP_MODE").as_str() {
            "keep" => Dedup::Keep,
            "throttle" => Dedup::Throttle(Duration::from_secs(600)),
            _ => Dedup::Debounce,
        };
        let delay: u64 = queue_controls_common::env("DEDUP_DELAY_MS")
            .parse()
            .unwrap();
        let rounds: usize = queue_controls_common::env("DEDUP_ROUNDS").parse().unwrap();
        let mut con = connection(&url);
        ready_and_wait(&mut con);
        let mut lines = Vec::new();
        for round in 0..rounds {
            for k in 0..KEYS {
                // Each producer walks the keys from its own starting point.
                let k = (k + index * 7) % KEYS;
                let payload = format!("p{index}-r{round}");
                let r = q
                    .offer_with(
                        &payload,
                        OfferOptions::after(Duration::from_millis(delay))
                            .id(key(k))
                            .dedup(mode),
                    )
                    .unwrap();
                let kind = match &r {
                    Offered::Written(_) => "written",
                    Offered::WrittenAfter { .. } => "after",
                    Offered::Replaced(_) => "replaced",
                    Offered::Kept(_) => "kept",
                    Offered::Throttled(_) => "throttled",
                    _ => "other",
                };
                lines.push(format!("{} {kind} {} {payload}", key(k), r.id()));
            }
        }
        report(&mut con, "test:offers", &lines);
    }
    if let Some((url, _)) = role("len-producer") {
        let rw = Redwheel::connect(&url).unwrap();
        let q = rw.queue::<String>("bounded").unwrap();
        let mut con = connection(&url);
        ready_and_wait(&mut con);
        let (mut ok, mut full) = (0u64, 0u64);
        for i in 0..200 {
            match q.offer(&format!("m{i}"), Duration::from_secs(3600)) {
                Ok(_) => ok += 1,
                Err(e) if e.kind() == ErrorKind::QueueFull => full += 1,
                Err(e) => panic!("{e}"),
            }
        }
        report(&mut con, "test:len", &[format!("{ok} {full}")]);
    }
}

struct OfferLine {
    key: String,
    kind: String,
    id: String,
    payload: String,
}

fn fleet_offers(con: &mut redis::Connection) -> Vec<OfferLine> {
    results(con, "test:offers")
        .into_iter()
        .map(|l| {
            let mut p = l.split(' ');
            OfferLine {
                key: p.next().unwrap().to_owned(),
                kind: p.next().unwrap().to_owned(),
                id: p.next().unwrap().to_owned(),
                payload: p.next().unwrap().to_owned(),
            }
        })
        .collect()
}

fn run_dedup_fleet(server: &RedisServer, mode: &str, delay_ms: u64, rounds: usize) -> Fleet {
    let env = [
        ("DEDUP_MODE", mode.to_owned()),
        ("DEDUP_DELAY_MS", delay_ms.to_string()),
        ("DEDUP_ROUNDS", rounds.to_string()),
    ];
    let mut fleet = Fleet::spawn("child_role", "dedup-producer", &server.url(), 8, &env);
    fleet.go();
    fleet
}

#[test]
fn keep_under_8_producer_processes_writes_each_key_once() {
    let (server, rw) = setup();
    let q = rw.queue::<String>("fleet").unwrap();
    run_dedup_fleet(&server, "keep", 3_600_000, 1).wait();
    let offers = fleet_offers(&mut connection(&server.url()));
    assert_eq!(offers.len(), 8 * KEYS);
    let mut writer: HashMap<&str, &str> = HashMap::new();
    for o in &offers {
        assert_eq!(o.id, o.key, "keep never changes the id");
        match o.kind.as_str() {
            "written" => assert!(
                writer.insert(&o.key, &o.payload).is_none(),
                "{} written twice",
                o.key
            ),
            "kept" => {}
            k => panic!("keep answered {k}"),
        }
    }
    assert_eq!(writer.len(), KEYS, "every key written once");
    assert_eq!(q.len().unwrap(), KEYS as u64);
    // Each message holds the payload of the offer that wrote it.
    let inspector = rw.inspect_queue("fleet").unwrap();
    for m in inspector
        .peek(redwheel::queue::inspect::MessageState::Delayed, KEYS)
        .unwrap()
    {
        let payload = String::from_utf8(m.payload.unwrap()).unwrap();
        assert_eq!(writer[m.id.as_str()], payload, "{}", m.id);
    }
}

#[test]
fn throttle_under_8_producer_processes_writes_each_key_once_per_window_while_consumed() {
    let (server, rw) = setup();
    let q = rw.queue::<String>("fleet").unwrap();
    // A consumer takes everything as it falls due, while the producers
    // offer each key three times: most later offers come after delivery.
    let stop = Arc::new(AtomicBool::new(false));
    let taken = Arc::new(parking_lot_free::Bag::default());
    let consumer = {
        let (q, stop, taken) = (q.clone(), Arc::clone(&stop), Arc::clone(&taken));
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                if let Some(m) = q.poll(Duration::from_millis(100)).unwrap() {
                    taken.push(m.id().to_string());
                }
            }
        })
    };
    run_dedup_fleet(&server, "throttle", 0, 3).wait();
    let offers = fleet_offers(&mut connection(&server.url()));
    assert_eq!(offers.len(), 8 * KEYS * 3);
    let written: Vec<&OfferLine> = offers.iter().filter(|o| o.kind == "written").collect();
    let keys: HashSet<&str> = written.iter().map(|o| o.key.as_str()).collect();
    assert_eq!(written.len(), KEYS, "one write per key in the window");
    assert_eq!(keys.len(), KEYS);
    assert!(
        offers
            .iter()
            .all(|o| o.kind == "written" || o.kind == "throttled"),
        "every other offer throttled"
    );
    wait_until(HANG, "every written message to be taken", || {
        taken.len() == KEYS
    });
    stop.store(true, Ordering::SeqCst);
    consumer.join().unwrap();
    let taken = taken.take();
    let distinct: HashSet<&String> = taken.iter().collect();
    assert_eq!(
        (taken.len(), distinct.len()),
        (KEYS, KEYS),
        "each key delivered once"
    );
    assert_eq!(q.len().unwrap(), 0);
}

#[test]
fn debounce_under_8_producer_processes_delivers_each_written_message_once_with_a_payload_offered_to_it()
 {
    let (server, rw) = setup();
    let q = rw
        .queue_with::<String>(
            "fleet",
            QueueOptions::default().visibility(Duration::from_secs(60)),
        )
        .unwrap();
    // A consumer claims, holds each message a moment (so offers meet
    // messages in flight too) and acks.
    let stop = Arc::new(AtomicBool::new(false));
    let delivered = Arc::new(parking_lot_free::Bag::default());
    let consumer = {
        let (q, stop, delivered) = (q.clone(), Arc::clone(&stop), Arc::clone(&delivered));
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                for d in q.claim_batch(20, Duration::from_millis(100)).unwrap() {
                    delivered.push(format!("{} {}", d.id(), d.payload()));
                    std::thread::sleep(Duration::from_micros(300));
                    d.ack().unwrap();
                }
            }
        })
    };
    run_dedup_fleet(&server, "debounce", 20, 4).wait();
    let offers = fleet_offers(&mut connection(&server.url()));
    assert_eq!(offers.len(), 8 * KEYS * 4);
    assert!(
        offers
            .iter()
            .all(|o| matches!(o.kind.as_str(), "written" | "after" | "replaced")),
        "debounce never drops an offer"
    );
    // Messages written under each id (an id is written again once its
    // message was consumed), and the payloads offered to it.
    let mut writes: HashMap<&str, usize> = HashMap::new();
    let mut offered_to: HashMap<&str, HashSet<&str>> = HashMap::new();
    for o in &offers {
        if o.kind != "replaced" {
            *writes.entry(&o.id).or_default() += 1;
        }
        offered_to.entry(&o.id).or_default().insert(&o.payload);
    }
    let created: usize = writes.values().sum();
    wait_until(HANG, "every written message to be delivered", || {
        delivered.len() >= created && q.len().unwrap() == 0
    });
    stop.store(true, Ordering::SeqCst);
    consumer.join().unwrap();
    let delivered = delivered.take();
    let mut deliveries: HashMap<String, usize> = HashMap::new();
    for line in &delivered {
        let (id, payload) = line.split_once(' ').unwrap();
        *deliveries.entry(id.to_owned()).or_default() += 1;
        assert!(
            offered_to.get(id).is_some_and(|p| p.contains(payload)),
            "{id} delivered with {payload}, never offered to it"
        );
    }
    for (id, n) in &writes {
        assert_eq!(
            deliveries.get(*id).copied().unwrap_or(0),
            *n,
            "{id}: each message written is delivered once"
        );
    }
    assert_eq!(delivered.len(), created);
    // Replacements happened: far fewer messages than offers.
    assert!(
        created < offers.len(),
        "{created} messages of {} offers",
        offers.len()
    );
}

/// A tiny thread-safe list (std only).
mod parking_lot_free {
    use std::sync::Mutex;

    #[derive(Default)]
    pub struct Bag(Mutex<Vec<String>>);

    impl Bag {
        pub fn push(&self, s: String) {
            self.0.lock().unwrap().push(s);
        }
        pub fn len(&self) -> usize {
            self.0.lock().unwrap().len()
        }
        pub fn take(&self) -> Vec<String> {
            std::mem::take(&mut *self.0.lock().unwrap())
        }
    }
}

// ------------------------------------------------------------ max_len

#[test]
fn max_len_refuses_an_offer_beyond_it_and_writes_nothing() {
    let (_server, rw) = setup();
    let q = rw
        .queue_with::<String>("len", QueueOptions::default().max_len(3))
        .unwrap();
    for i in 0..3 {
        q.offer(&format!("m{i}"), Duration::from_secs(3600))
            .unwrap();
    }
    let e = q
        .offer(&"m3".into(), Duration::from_secs(3600))
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::QueueFull, "{e}");
    assert!(!e.is_transient() && !e.is_invalid_input());
    assert_eq!(q.len().unwrap(), 3);
    for o in [
        OfferOptions::default(),
        OfferOptions::default().id("new"),
        OfferOptions::default().id("new2").dedup(Dedup::Debounce),
    ] {
        let e = q.offer_with(&"x".into(), o).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::QueueFull);
    }
    let e = q
        .offer_with_id(&MessageId::from("new"), &"x".into(), Duration::ZERO)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::QueueFull);
    assert_eq!(q.len().unwrap(), 3, "nothing written by the refused offers");
    // Batches: all or nothing.
    let q = rw
        .queue_with::<String>("len-batch", QueueOptions::default().max_len(5))
        .unwrap();
    let batch = |n: usize| vec![("m".to_string(), Duration::from_secs(3600)); n];
    q.offer_batch(&batch(3)).unwrap();
    let e = q.offer_batch(&batch(3)).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::QueueFull);
    assert_eq!(q.len().unwrap(), 3, "nothing of the refused batch written");
    q.offer_batch(&batch(2)).unwrap();
    assert_eq!(q.len().unwrap(), 5);
    // Keyed: a known id does not count.
    let ids = [MessageId::from("k1"), MessageId::from("k2")];
    let q = rw
        .queue_with::<String>("len-keyed", QueueOptions::default().max_len(2))
        .unwrap();
    let batch: Vec<(MessageId, String, Duration)> = ids
        .iter()
        .map(|id| (id.clone(), "v".to_owned(), Duration::from_secs(3600)))
        .collect();
    assert_eq!(q.offer_batch_with_ids(&batch).unwrap(), vec![true, true]);
    // Full, but known ids add nothing: kept, not refused.
    assert_eq!(q.offer_batch_with_ids(&batch).unwrap(), vec![false, false]);
    assert!(
        !q.offer_with_id(&ids[0], &"v".into(), Duration::ZERO)
            .unwrap()
    );
    // Debounce of a waiting message replaces it: no room needed.
    let r = q
        .offer_with(
            &"w".into(),
            OfferOptions::default().id("k1").dedup(Dedup::Debounce),
        )
        .unwrap();
    assert_eq!(r, Offered::Replaced(MessageId::from("k1")));
    // Taking one makes room.
    let _ = within(HANG, {
        let q = q.clone();
        move || q.take().unwrap()
    });
    q.offer(&"again".into(), Duration::from_secs(3600)).unwrap();
}

#[test]
fn a_batch_past_max_len_is_written_chunk_by_chunk_and_says_how_far_it_got() {
    let (_server, rw) = setup();
    let q = rw
        .queue_with::<String>("len-chunks", QueueOptions::default().max_len(1_500))
        .unwrap();
    let batch: Vec<(String, Duration)> = (0..2_500)
        .map(|i| (format!("m{i}"), Duration::from_secs(3600)))
        .collect();
    let e = q.offer_batch(&batch).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::QueueFull);
    assert!(
        e.to_string().contains("first 1000 of the batch's 2500"),
        "{e}"
    );
    assert_eq!(
        q.len().unwrap(),
        1_000,
        "the first chunk stays, the second is refused whole"
    );
}

#[test]
fn max_len_under_8_producer_processes_is_never_passed() {
    let (server, rw) = setup();
    let n = 500u64;
    let q = rw
        .queue_with::<String>("bounded", QueueOptions::default().max_len(n))
        .unwrap();
    let mut fleet = Fleet::spawn("child_role", "len-producer", &server.url(), 8, &[]);
    // Sample the length while they race.
    let stop = Arc::new(AtomicBool::new(false));
    let max_seen = Arc::new(AtomicU64::new(0));
    let sampler = {
        let (q, stop, max_seen) = (q.clone(), Arc::clone(&stop), Arc::clone(&max_seen));
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                max_seen.fetch_max(q.len().unwrap(), Ordering::SeqCst);
            }
        })
    };
    fleet.go();
    fleet.wait();
    stop.store(true, Ordering::SeqCst);
    sampler.join().unwrap();
    let (mut ok, mut full) = (0, 0);
    for line in results(&mut connection(&server.url()), "test:len") {
        let (a, b) = line.split_once(' ').unwrap();
        ok += a.parse::<u64>().unwrap();
        full += b.parse::<u64>().unwrap();
    }
    assert_eq!(ok + full, 8 * 200);
    assert_eq!(ok, n, "exactly max_len accepted");
    assert_eq!(q.len().unwrap(), n);
    assert!(max_seen.load(Ordering::SeqCst) <= n);
}

// ------------------------------------------------------------ priorities

#[test]
fn a_burst_is_handed_out_highest_priority_first_then_in_due_and_offer_order() {
    let (_server, rw) = setup();
    let q = rw.queue::<String>("burst").unwrap();
    let n = 3_000;
    // Everything due at one instant, priorities in a scrambled order; ids
    // fixed-width so that offer order is id order.
    let at = SystemTime::now() + Duration::from_millis(500);
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    let mut offered = Vec::with_capacity(n);
    // A few with earlier due times at a low priority: they wait behind
    // every higher one although they fell due first. (Offered first: offering
    // the burst may take longer than its 500 ms on a loaded machine, and these
    // must fall due before it.)
    for i in 0..10 {
        q.offer_with(
            &"0".to_string(),
            OfferOptions::default().id(format!("early{i}")).priority(0),
        )
        .unwrap();
        offered.push((0, format!("early{i}")));
    }
    for i in 0..n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let p = (x % 10) as u8;
        let id = format!("m{i:05}");
        q.offer_with(
            &format!("{p}"),
            OfferOptions::at(at).id(id.as_str()).priority(p),
        )
        .unwrap();
        offered.push((p, id));
    }
    wait_until(HANG, "the burst to be ready", || {
        q.stats().unwrap().ready == offered.len() as u64
    });
    // The expected order: priority descending; within one, the earlier due
    // first (the "early" ones at priority 0), then offer order.
    let mut expected = offered.clone();
    expected.sort_by(|a, b| {
        b.0.cmp(&a.0)
            .then_with(|| b.1.starts_with("early").cmp(&a.1.starts_with("early")))
            .then_with(|| a.1.cmp(&b.1))
    });
    let got: Vec<String> = within(HANG, {
        let q = q.clone();
        let total = offered.len();
        move || {
            let mut got = Vec::new();
            while got.len() < total {
                // Half by take, half by claim: both pop the same way.
                if got.len() % 2 == 0 {
                    got.push(q.take().unwrap().id().to_string());
                } else {
                    let batch = q.claim_batch(7, Duration::from_secs(10)).unwrap();
                    for d in batch {
                        got.push(d.id().to_string());
                        d.ack().unwrap();
                    }
                }
            }
            got
        }
    });
    let want: Vec<String> = expected.into_iter().map(|(_, id)| id).collect();
    assert_eq!(got, want);
}

#[test]
fn a_higher_priority_overtakes_a_lower_one_that_fell_due_earlier() {
    let (server, rw) = setup();
    let q = rw.queue::<String>("overtake").unwrap();
    q.offer_with(&"low".into(), OfferOptions::default().priority(0))
        .unwrap();
    q.offer_with(&"mid".into(), OfferOptions::default().priority(4))
        .unwrap();
    let later = server.time_ms() + 200;
    q.offer_with(
        &"high".into(),
        OfferOptions::at(std::time::UNIX_EPOCH + Duration::from_millis(later)).priority(9),
    )
    .unwrap();
    wait_until(HANG, "all three ready", || q.stats().unwrap().ready == 3);
    let order: Vec<String> = (0..3).map(|_| q.take().unwrap().into_payload()).collect();
    assert_eq!(order, ["high", "mid", "low"]);
}

#[test]
fn a_prioritized_message_on_an_empty_ready_list_leaves_a_wake_marker_that_is_not_counted() {
    let (server, rw) = setup();
    let q = rw.queue::<String>("marker").unwrap();
    q.offer_with(&"urgent".into(), OfferOptions::default().priority(7))
        .unwrap();
    wait_until(HANG, "it to be ready", || q.stats().unwrap().ready == 1);
    // Consumers blocked on `ready` (a blocking read of that list) need
    // something there to wake: the transfer left '' (never an id).
    assert_eq!(
        server.cmd(&["LRANGE", "redwheel:{marker}:ready", "0", "-1"]),
        "*1\r\n$0\r\n\r\n"
    );
    assert_eq!(q.take().unwrap().payload(), "urgent");
    let s = q.stats().unwrap();
    assert_eq!((s.ready, s.delayed), (0, 0), "{s:?}");
    // A consumer blocked on the empty queue gets the next one.
    let consumer = {
        let q = q.clone();
        std::thread::spawn(move || q.take().unwrap().into_payload())
    };
    q.offer_with(
        &"urgent too".into(),
        OfferOptions::after(Duration::from_millis(100)).priority(7),
    )
    .unwrap();
    assert_eq!(within(HANG, move || consumer.join().unwrap()), "urgent too");
    assert!(q.poll(Duration::from_millis(100)).unwrap().is_none());
}

#[test]
fn priorities_survive_a_redelivery_and_remove_clears_them() {
    let (_server, rw) = setup();
    let q = rw
        .queue_with::<String>(
            "redeliver",
            QueueOptions::default().visibility(Duration::from_millis(200)),
        )
        .unwrap();
    let high = q
        .offer_with(&"high".into(), OfferOptions::default().priority(8))
        .unwrap();
    let d = within(HANG, {
        let q = q.clone();
        move || q.claim(Duration::from_secs(10)).unwrap().unwrap()
    });
    assert_eq!(d.payload(), "high");
    // Not acked: it comes back, and a low one offered meanwhile waits behind it.
    q.offer(&"low".into(), Duration::ZERO).unwrap();
    wait_until(HANG, "the claim to expire and come back", || {
        let s = q.stats().unwrap();
        s.in_flight == 0 && s.ready == 2
    });
    let d = q.claim(Duration::from_secs(10)).unwrap().unwrap();
    assert_eq!((d.payload().as_str(), d.attempt()), ("high", 2));
    d.ack().unwrap();
    let low = q.claim(Duration::from_secs(10)).unwrap().unwrap();
    assert_eq!(low.payload(), "low");
    low.ack().unwrap();
    // A prioritized ready message removed, then its id offered again, is
    // delivered once, after the new due time.
    let id = q
        .offer_with(&"a".into(), OfferOptions::default().id("again").priority(5))
        .unwrap();
    wait_until(HANG, "ready", || q.stats().unwrap().ready == 1);
    assert!(q.remove(id.id()).unwrap());
    assert_eq!(q.stats().unwrap().ready, 0);
    q.offer_with(&"b".into(), OfferOptions::default().id("again").priority(5))
        .unwrap();
    let m = within(HANG, {
        let q = q.clone();
        move || q.take().unwrap()
    });
    assert_eq!(m.payload(), "b");
    assert!(q.poll(Duration::from_millis(200)).unwrap().is_none());
    let _ = high;
}

// ------------------------------------------------------------ ttl

#[test]
fn a_message_past_its_ttl_becomes_a_dead_letter_and_is_never_delivered() {
    let (_server, rw) = setup();
    let q = rw.queue::<String>("ttl").unwrap();
    // Paused: nobody could take it; the transfer job still expires it.
    q.pause().unwrap();
    q.offer_with(
        &"stale soon".into(),
        OfferOptions::default()
            .id("t1")
            .ttl(Duration::from_millis(100)),
    )
    .unwrap();
    q.offer_with(
        &"keeps".into(),
        OfferOptions::default()
            .id("t2")
            .ttl(Duration::from_secs(3600)),
    )
    .unwrap();
    wait_until(HANG, "the ttl to run out", || {
        q.stats().unwrap().expired == 1
    });
    let dead = q.dead_letters(10).unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!((dead[0].id().as_str(), dead[0].reason()), ("t1", "expired"));
    q.resume().unwrap();
    let m = within(HANG, {
        let q = q.clone();
        move || q.take().unwrap()
    });
    assert_eq!(m.payload(), "keeps");
    assert!(q.poll(Duration::from_millis(200)).unwrap().is_none());
    let s = q.stats().unwrap();
    assert_eq!((s.dead, s.expired, s.ready), (1, 1, 0), "{s:?}");
    // Requeued, it is a fresh start: delivered, its ttl gone.
    assert_eq!(q.requeue_dead(10).unwrap(), 1);
    assert_eq!(q.take().unwrap().payload(), "stale soon");
}

#[test]
fn a_consumer_that_meets_an_expired_message_first_kills_it_instead_of_taking_it() {
    let (server, rw) = setup();
    // A run of the transfer job during the poll (a wake-up of the offer,
    // or the run after the queue's channel was subscribed, processed late
    // on a loaded machine) would expire the message before the consumer
    // meets it: that attempt shows nothing about the consumer, so it is
    // made again, on a queue of its own. Two things keep such runs out of
    // the poll. The offer waits for the queue's subscription to be in
    // place: the run it brings (`on_subscribed`) came up to the
    // listener's poll interval (100 ms) after the queue was opened, so
    // under load, when the first run of the job was late enough to move
    // the message to ready itself, it fell in a 100 ms poll every time.
    // And the poll takes no time (one script call, no blocking): a run
    // after the consumer met the message harms nothing, and is not
    // mistaken for one that came first.
    for attempt in 0..10 {
        let name = format!("ttl-handout-{attempt}");
        // No guard sweep for a day: after its first runs the transfer job
        // only runs when woken, so the consumer meets the message first.
        let q = rw
            .queue_with::<String>(
                &name,
                QueueOptions::default().guard_interval(Duration::from_secs(86_400)),
            )
            .unwrap();
        let wake = format!("redwheel:{{{name}}}:wake");
        wait_until(HANG, "the queue's wake channel is subscribed", || {
            server
                .cmd(&["PUBSUB", "SHARDNUMSUB", &wake])
                .trim_end()
                .ends_with(":1")
        });
        q.offer_with(
            &"x".into(),
            OfferOptions::default()
                .id("e")
                .ttl(Duration::from_secs(3600)),
        )
        .unwrap();
        wait_until(HANG, "ready", || q.stats().unwrap().ready == 1);
        // Its hand-out deadline moves into the past behind the transfer
        // job's back (as if the job were late).
        let past = (server.time_ms() - 10).to_string();
        let expires = format!("redwheel:{{{name}}}:expires");
        assert_eq!(server.int(&["ZADD", &expires, "XX", "CH", &past, "e"]), 1);
        let runs = q.transfer_stats().runs;
        assert!(q.poll(Duration::ZERO).unwrap().is_none());
        if q.transfer_stats().runs != runs {
            eprintln!("attempt {attempt}: a transfer ran during the poll; again");
            continue;
        }
        let s = q.stats().unwrap();
        assert_eq!((s.dead, s.expired, s.ready), (1, 1, 0), "{s:?}");
        assert_eq!(q.dead_letters(1).unwrap()[0].reason(), "expired");
        return;
    }
    panic!("a transfer ran during the poll in every attempt");
}

#[test]
fn messages_with_a_ttl_are_delivered_within_it_or_not_at_all() {
    let (_server, rw) = setup();
    let visibility = Duration::from_secs(30);
    let q = rw
        .queue_with::<String>("ttl-slow", QueueOptions::default().visibility(visibility))
        .unwrap();
    let n = 300;
    let ttl = Duration::from_millis(60);
    for i in 0..n {
        q.offer_with(&format!("m{i}"), OfferOptions::default().ttl(ttl))
            .unwrap();
    }
    // A slow consumer: some messages wait past their ttl.
    let delivered: Vec<(u64, u64)> = within(HANG, {
        let q = q.clone();
        move || {
            let mut out = Vec::new();
            while let Some(d) = q.claim(Duration::from_millis(300)).unwrap() {
                let claimed_at = d
                    .visible_until()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_millis() as u64
                    - visibility.as_millis() as u64;
                out.push((claimed_at, d.due_ms()));
                d.ack().unwrap();
                std::thread::sleep(Duration::from_millis(1));
            }
            out
        }
    });
    let s = q.stats().unwrap();
    assert_eq!(delivered.len() as u64 + s.expired, n, "{s:?}");
    assert!(s.expired > 0, "the consumer was slow enough to miss some");
    for (claimed_at, due) in &delivered {
        assert!(
            *claimed_at <= due + ttl.as_millis() as u64,
            "claimed at {claimed_at}, past due {due} + ttl"
        );
    }
}
