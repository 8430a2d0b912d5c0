//! Core behaviour of a delayed queue against a real redis-server: offer,
//! offer_at, offer_batch, remove, len, clear, take, poll, codecs.

mod support;

use std::collections::HashSet;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redwheel::{Message, MessageId, Queue, QueueOptions, Redwheel};
use support::{RedisServer, within};

const HANG: Duration = Duration::from_secs(60);

fn setup() -> (RedisServer, Redwheel) {
    let server = RedisServer::start();
    let rw = Redwheel::connect(&server.url()).expect("connect");
    (server, rw)
}

#[test]
fn handles_are_clone_send_sync() {
    fn assert_all<T: Clone + Send + Sync + 'static>() {}
    assert_all::<Redwheel>();
    assert_all::<Queue<String>>();
    assert_all::<Queue<Vec<u8>>>();
    assert_all::<MessageId>();
}

#[test]
fn no_message_is_delivered_before_its_due_time_by_the_server_clock() {
    let (server, rw) = setup();
    let q = rw.queue::<String>("early").unwrap();
    let delays = [0u64, 5, 20, 50, 120, 250, 400];
    let before = server.time_ms();
    for (i, d) in delays.iter().enumerate() {
        q.offer(&format!("m{i}"), Duration::from_millis(*d))
            .unwrap();
    }
    let q2 = q.clone();
    let got: Vec<(Message<String>, u64)> = within(HANG, move || {
        (0..delays.len())
            .map(|_| {
                let m = q2.take().unwrap();
                (m, server.time_ms())
            })
            .collect()
    });
    for (m, taken_at) in &got {
        let i: usize = m.payload()[1..].parse().unwrap();
        assert!(
            m.due_ms() >= before + delays[i],
            "due {} computed from the server clock (offered after {before} + {} ms)",
            m.due_ms(),
            delays[i]
        );
        assert!(
            *taken_at >= m.due_ms(),
            "{} taken at {taken_at}, before its due time {}",
            m.payload(),
            m.due_ms()
        );
        assert_eq!(
            m.due(),
            UNIX_EPOCH + Duration::from_millis(m.due_ms()),
            "due() is the Redis clock's due time"
        );
    }
}

#[test]
fn messages_are_delivered_in_due_order() {
    let (_server, rw) = setup();
    let q = rw.queue::<String>("order").unwrap();
    // Offered latest-first, with distinct due times 15 ms apart.
    let n = 20u64;
    for i in (0..n).rev() {
        q.offer(&format!("{i:02}"), Duration::from_millis(100 + i * 15))
            .unwrap();
    }
    let got: Vec<String> = within(HANG, move || {
        (0..n).map(|_| q.take().unwrap().into_payload()).collect()
    });
    let want: Vec<String> = (0..n).map(|i| format!("{i:02}")).collect();
    assert_eq!(got, want);
}

#[test]
fn a_removed_message_is_never_delivered_and_remove_after_delivery_is_false() {
    let (_server, rw) = setup();
    let q = rw.queue::<String>("remove").unwrap();
    let keep = q
        .offer(&"keep".to_string(), Duration::from_millis(150))
        .unwrap();
    let gone = q
        .offer(&"gone".to_string(), Duration::from_millis(50))
        .unwrap();
    assert!(q.remove(&gone).unwrap(), "a waiting message is removed");
    assert!(!q.remove(&gone).unwrap(), "a second remove finds nothing");
    assert!(!q.remove(&MessageId::from("no-such-id")).unwrap());
    let m = within(HANG, {
        let q = q.clone();
        move || q.take().unwrap()
    });
    assert_eq!(m.id(), &keep);
    assert_eq!(m.payload(), "keep");
    assert!(!q.remove(&keep).unwrap(), "remove after delivery is false");
    assert!(
        q.poll(Duration::from_millis(300)).unwrap().is_none(),
        "the removed one never comes"
    );
    assert_eq!(q.len().unwrap(), 0);
}

#[test]
fn remove_of_a_due_message_not_yet_taken_prevents_its_delivery() {
    let (server, rw) = setup();
    let q = rw.queue::<String>("remove-ready").unwrap();
    let id = q.offer(&"due".to_string(), Duration::ZERO).unwrap();
    // Block until the transfer has put it on the ready list (a blocking
    // peek that leaves the list as it was).
    let peeked = server.cmd(&[
        "BLMOVE",
        "redwheel:{remove-ready}:ready",
        "redwheel:{remove-ready}:ready",
        "LEFT",
        "LEFT",
        "30",
    ]);
    assert!(peeked.contains(id.as_str()), "transferred: {peeked:?}");
    assert!(q.remove(&id).unwrap());
    let after = q.offer(&"after".to_string(), Duration::ZERO).unwrap();
    let m = within(HANG, move || q.take().unwrap());
    assert_eq!(m.id(), &after, "the removed id is skipped by take");
}

#[test]
fn len_counts_waiting_messages_and_clear_deletes_them() {
    let (server, rw) = setup();
    let q = rw.queue::<String>("len").unwrap();
    assert_eq!(q.len().unwrap(), 0);
    assert!(q.is_empty().unwrap());
    for i in 0..5 {
        q.offer(&i.to_string(), Duration::from_secs(600)).unwrap();
    }
    q.offer(&"now".to_string(), Duration::ZERO).unwrap();
    assert_eq!(q.len().unwrap(), 6);
    let m = within(HANG, {
        let q = q.clone();
        move || q.take().unwrap()
    });
    assert_eq!(m.payload(), "now");
    assert_eq!(q.len().unwrap(), 5);
    assert_eq!(q.delayed_len().unwrap(), 5);
    assert_eq!(q.clear().unwrap(), 5);
    assert_eq!(q.len().unwrap(), 0);
    for key in ["delayed", "msg", "ready", "dead"] {
        assert_eq!(
            server.int(&["EXISTS", &format!("redwheel:{{len}}:{key}")]),
            0,
            "{key} deleted"
        );
    }
}

#[test]
fn poll_returns_none_after_the_timeout() {
    let (_server, rw) = setup();
    let q = rw.queue::<String>("poll").unwrap();
    q.offer(&"later".to_string(), Duration::from_secs(600))
        .unwrap();
    let got = within(HANG, move || q.poll(Duration::from_millis(200)).unwrap());
    assert!(got.is_none());
}

#[test]
fn poll_returns_a_message_that_falls_due_while_it_waits() {
    let (_server, rw) = setup();
    let q = rw.queue::<String>("poll-due").unwrap();
    q.offer(&"soon".to_string(), Duration::from_millis(100))
        .unwrap();
    let got = within(HANG, move || q.poll(Duration::from_secs(30)).unwrap());
    assert_eq!(got.unwrap().payload(), "soon");
}

#[test]
fn offer_at_in_the_past_is_due_at_once_and_in_the_future_waits() {
    let (server, rw) = setup();
    let q = rw.queue::<String>("at").unwrap();
    let now = SystemTime::now();
    q.offer_at(&"future".to_string(), now + Duration::from_millis(200))
        .unwrap();
    q.offer_at(&"past".to_string(), now - Duration::from_secs(3600))
        .unwrap();
    q.offer_at(&"epoch".to_string(), UNIX_EPOCH).unwrap();
    let got: Vec<(Message<String>, u64)> = within(HANG, move || {
        (0..3)
            .map(|_| {
                let m = q.take().unwrap();
                (m, server.time_ms())
            })
            .collect()
    });
    let names: HashSet<&str> = got[..2].iter().map(|(m, _)| m.payload().as_str()).collect();
    assert_eq!(names, HashSet::from(["past", "epoch"]));
    assert_eq!(got[2].0.payload(), "future");
    for (m, taken) in &got {
        assert!(*taken >= m.due_ms());
    }
    // A past due time is clamped to the server's now, not kept in the past.
    let past_due = got
        .iter()
        .find(|(m, _)| m.payload() == "epoch")
        .unwrap()
        .0
        .due_ms();
    assert!(past_due > 1_600_000_000_000, "clamped to now: {past_due}");
}

#[test]
fn offer_batch_delivers_every_message_with_its_own_delay() {
    let (_server, rw) = setup();
    let q = rw.queue::<String>("batch").unwrap();
    // More than one script chunk (1,000 per call).
    let msgs: Vec<(String, Duration)> = (0..2_500)
        .map(|i| (format!("b{i}"), Duration::from_millis((i % 50) as u64)))
        .collect();
    let ids = q.offer_batch(&msgs).unwrap();
    assert_eq!(ids.len(), msgs.len());
    assert_eq!(
        ids.iter().collect::<HashSet<_>>().len(),
        ids.len(),
        "ids are distinct"
    );
    assert_eq!(q.len().unwrap(), 2_500);
    let got: Vec<Message<String>> = within(HANG, move || {
        (0..2_500).map(|_| q.take().unwrap()).collect()
    });
    let payloads: HashSet<String> = got.iter().map(|m| m.payload().clone()).collect();
    assert_eq!(payloads.len(), 2_500);
    let dues: Vec<u64> = got.iter().map(|m| m.due_ms()).collect();
    assert!(dues.windows(2).all(|w| w[0] <= w[1]), "taken in due order");
    assert!(q_is_empty_after(&rw, "batch"));
}

fn q_is_empty_after(rw: &Redwheel, name: &str) -> bool {
    rw.queue::<String>(name).unwrap().len().unwrap() == 0
}

#[test]
fn empty_batch_is_accepted() {
    let (_server, rw) = setup();
    let q = rw.queue::<String>("empty-batch").unwrap();
    assert!(q.offer_batch(&[]).unwrap().is_empty());
}

#[test]
fn bytes_payloads_round_trip_unchanged() {
    let (_server, rw) = setup();
    let q = rw.queue::<Vec<u8>>("bytes").unwrap();
    let payload: Vec<u8> = (0..=255u8).chain([b':', 0, b':']).collect();
    q.offer(&payload, Duration::ZERO).unwrap();
    q.offer(&Vec::new(), Duration::from_millis(1)).unwrap();
    let (a, b) = within(HANG, move || (q.take().unwrap(), q.take().unwrap()));
    assert_eq!(a.into_payload(), payload);
    assert!(b.into_payload().is_empty());
}

#[cfg(feature = "serde")]
#[test]
fn json_payloads_round_trip_through_serde() {
    use redwheel::queue::Json;
    let (_server, rw) = setup();
    let q = rw.queue::<Json<serde_json::Value>>("json").unwrap();
    let v = serde_json::json!({"order": 42, "items": ["a", "b"]});
    q.offer(&Json(v.clone()), Duration::from_millis(10))
        .unwrap();
    let m = within(HANG, move || q.take().unwrap());
    assert_eq!(m.into_payload().0, v);
}

#[test]
fn a_consumer_blocked_in_take_is_woken_by_the_wheel_not_the_guard_sweep() {
    let (_server, rw) = setup();
    // A guard sweep far beyond the hang guard: only the wake-up path (wake
    // channel -> wheel timeout -> transfer -> BLMOVE wakes the consumer) can
    // deliver this message before the test gives up.
    let q = rw
        .queue_with::<String>(
            "wheel",
            QueueOptions::default().guard_interval(Duration::from_secs(3600)),
        )
        .unwrap();
    let consumer = {
        let q = q.clone();
        std::thread::spawn(move || q.take().unwrap())
    };
    q.offer(&"x".to_string(), Duration::from_millis(150))
        .unwrap();
    let m = within(HANG, move || consumer.join().unwrap());
    assert_eq!(m.payload(), "x");
}

#[test]
fn many_consumers_share_messages_without_duplicates() {
    let (_server, rw) = setup();
    let q = rw.queue::<String>("consumers").unwrap();
    let msgs: Vec<(String, Duration)> = (0..400)
        .map(|i| (i.to_string(), Duration::from_millis(i % 40)))
        .collect();
    q.offer_batch(&msgs).unwrap();
    let taken = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let q = q.clone();
            let taken = taken.clone();
            std::thread::spawn(move || {
                let mut got = Vec::new();
                while taken.load(std::sync::atomic::Ordering::SeqCst) < 400 {
                    if let Some(m) = q.poll(Duration::from_millis(100)).unwrap() {
                        taken.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        got.push(m.into_payload());
                    }
                }
                got
            })
        })
        .collect();
    let all: Vec<String> = within(HANG, move || {
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    assert_eq!(all.len(), 400);
    assert_eq!(all.iter().collect::<HashSet<_>>().len(), 400);
}

#[test]
fn offer_batch_at_uses_absolute_due_times() {
    let (server, rw) = setup();
    let q = rw.queue::<String>("batch-at").unwrap();
    let now = SystemTime::now();
    let msgs = vec![
        ("later".to_string(), now + Duration::from_millis(150)),
        ("past".to_string(), now - Duration::from_secs(60)),
    ];
    let ids = q.offer_batch_at(&msgs).unwrap();
    let got: Vec<(Message<String>, u64)> = within(HANG, move || {
        (0..2)
            .map(|_| {
                let m = q.take().unwrap();
                (m, server.time_ms())
            })
            .collect()
    });
    assert_eq!(
        got[0].0.id(),
        &ids[1],
        "the past one first (clamped to now)"
    );
    assert_eq!(got[1].0.id(), &ids[0]);
    for (m, taken) in &got {
        assert!(*taken >= m.due_ms(), "not early");
    }
}

#[test]
fn dropping_the_last_handle_closes_every_connection() {
    let (server, rw) = setup();
    let q = rw.queue::<String>("drop").unwrap();
    q.offer(&"x".to_string(), Duration::ZERO).unwrap();
    within(HANG, {
        let q = q.clone();
        move || q.take().unwrap()
    });
    drop(q);
    // Dropping the last handle shuts down: the transfer, subscriber, pooled
    // and consumer connections all close. The server notices the closed
    // sockets asynchronously, so look until only our own probe remains.
    drop(rw);
    let clients = within(HANG, move || {
        loop {
            let info = server.cmd(&["INFO", "clients"]);
            let n: u64 = info
                .lines()
                .find_map(|l| l.strip_prefix("connected_clients:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap();
            if n == 1 {
                return n;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    });
    assert_eq!(clients, 1);
}

#[test]
fn scripts_are_reloaded_after_the_server_forgets_them() {
    let (server, rw) = setup();
    let q = rw.queue::<String>("noscript").unwrap();
    q.offer(&"before".to_string(), Duration::ZERO).unwrap();
    let first = within(HANG, {
        let q = q.clone();
        move || q.take().unwrap()
    });
    assert_eq!(first.payload(), "before");
    // As after a restart without persistence of the script cache: every
    // EVALSHA now gets NOSCRIPT, and redwheel loads the script again.
    assert!(server.cmd(&["SCRIPT", "FLUSH"]).starts_with("+OK"));
    q.offer(&"after".to_string(), Duration::from_millis(20))
        .unwrap();
    assert!(q.remove(&MessageId::from("nothing")).is_ok());
    assert_eq!(q.len().unwrap(), 1);
    let m = within(HANG, move || q.take().unwrap());
    assert_eq!(m.payload(), "after");
}

#[test]
fn a_blocked_consumer_survives_the_server_forgetting_its_scripts() {
    let (server, rw) = setup();
    let q = rw.queue::<String>("noscript-blocked").unwrap();
    let consumer = {
        let q = q.clone();
        std::thread::spawn(move || q.take().unwrap())
    };
    // Wait until the consumer is blocked in Redis (another process's state:
    // look at it until it shows), then make Redis forget every script.
    let server = within(HANG, move || {
        while !server
            .cmd(&["INFO", "clients"])
            .contains("blocked_clients:1")
        {
            std::thread::sleep(Duration::from_millis(5));
        }
        server
    });
    assert!(server.cmd(&["SCRIPT", "FLUSH"]).starts_with("+OK"));
    q.offer(&"m".to_string(), Duration::ZERO).unwrap();
    let m = within(HANG, move || consumer.join().unwrap());
    assert_eq!(m.payload(), "m");
}

#[test]
fn offer_with_id_adds_an_id_once_and_frees_it_once_taken() {
    let (_server, rw) = setup();
    let q = rw.queue::<String>("with-id").unwrap();
    let id = MessageId::from("invoice-1");
    assert!(
        q.offer_with_id(&id, &"first".to_string(), Duration::ZERO)
            .unwrap()
    );
    // A second offer of a waiting id changes nothing: payload and due stay.
    assert!(
        !q.offer_with_id(&id, &"second".to_string(), Duration::from_secs(60))
            .unwrap()
    );
    assert_eq!(q.len().unwrap(), 1);
    let m = within(HANG, {
        let q = q.clone();
        move || q.take().unwrap()
    });
    assert_eq!((m.id(), m.payload().as_str()), (&id, "first"));
    // Taken: the id is free again.
    assert!(
        q.offer_with_id(&id, &"again".to_string(), Duration::from_secs(60))
            .unwrap()
    );
    // Bad ids are typed errors.
    let err = q
        .offer_with_id(&MessageId::from(""), &"x".to_string(), Duration::ZERO)
        .unwrap_err();
    assert_eq!(err.kind(), redwheel::ErrorKind::InvalidId);
}

#[test]
fn offer_batch_with_ids_reports_which_ids_were_added() {
    let (_server, rw) = setup();
    let q = rw.queue::<String>("batch-ids").unwrap();
    let a = MessageId::from("a");
    assert!(
        q.offer_with_id(&a, &"a0".to_string(), Duration::from_secs(60))
            .unwrap()
    );
    let batch = vec![
        (a.clone(), "a1".to_string(), Duration::ZERO),
        (
            MessageId::from("b"),
            "b".to_string(),
            Duration::from_secs(60),
        ),
        (MessageId::from("b"), "b again".to_string(), Duration::ZERO),
        (
            MessageId::from("c"),
            "c".to_string(),
            Duration::from_secs(60),
        ),
    ];
    assert_eq!(
        q.offer_batch_with_ids(&batch).unwrap(),
        vec![false, true, false, true]
    );
    assert_eq!(q.len().unwrap(), 3);
    // Retrying the whole batch adds nothing.
    assert_eq!(
        q.offer_batch_with_ids(&batch).unwrap(),
        vec![false, false, false, false]
    );
    assert_eq!(q.delayed_len().unwrap(), 3, "a0 kept its 60 s delay");
}
