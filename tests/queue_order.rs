//! Messages with equal due times, offered by one process, come out in
//! offer order (issue 18, item 4).
//!
//! Redis breaks ties between equal due times in the delayed set by the
//! message id's bytes, so the ids one process makes must sort in the order
//! it made them. They used to end in an unpadded base-62 counter, which
//! sorts out of order wherever a run of ids crosses 62, 3,844, 238,328…
//! ids. This test binary is its own process, so its first ids start at 0
//! and the batch of 10,000 crosses the first two of those points; the
//! batches after it, each with its own chunks, run on from there.

mod support;

use std::time::{Duration, SystemTime};

use redwheel::{MessageId, Queue, Redwheel};
use support::RedisServer;

const HANG: Duration = Duration::from_secs(120);

/// A due time shared by every message of a test, far enough ahead that
/// every offer lands before it (each is then due at exactly this ms).
fn shared_due() -> SystemTime {
    SystemTime::now() + Duration::from_secs(2)
}

/// Takes `n` messages, one `take` after another.
fn take_all(q: &Queue<String>, n: usize) -> Vec<(MessageId, String)> {
    (0..n)
        .map(|_| {
            let m = q.poll(HANG).unwrap().expect("a due message");
            (m.id().clone(), m.into_payload())
        })
        .collect()
}

/// Where the taken order first differs from the offered one.
fn first_difference(offered: &[(MessageId, String)], taken: &[(MessageId, String)]) -> String {
    match offered.iter().zip(taken).position(|(o, t)| o != t) {
        Some(i) => format!(
            "message {i}: offered {:?}, taken {:?}",
            offered[i], taken[i]
        ),
        None => format!("{} offered, {} taken", offered.len(), taken.len()),
    }
}

#[test]
fn messages_with_one_due_time_come_out_in_offer_order() {
    let server = RedisServer::start();
    let rw: Redwheel = server.connect();

    // 10,000 in one batch (written in chunks of 1,000, one script call
    // each), all due at the same instant.
    let q = rw.queue::<String>("one-batch").unwrap();
    let due = shared_due();
    let batch: Vec<(String, SystemTime)> = (0..10_000).map(|i| (format!("m{i}"), due)).collect();
    let ids = q.offer_batch_at(&batch).unwrap();
    let offered: Vec<(MessageId, String)> = ids
        .into_iter()
        .zip(batch.into_iter().map(|(p, _)| p))
        .collect();
    let taken = take_all(&q, offered.len());
    assert!(
        taken == offered,
        "one batch: {}",
        first_difference(&offered, &taken)
    );

    // Several batches and single offers, interleaved, all due at the same
    // instant.
    let q = rw.queue::<String>("many-batches").unwrap();
    let due = shared_due();
    let mut offered = Vec::new();
    for b in 0..8 {
        let batch: Vec<(String, SystemTime)> =
            (0..700).map(|i| (format!("b{b}-{i}"), due)).collect();
        let ids = q.offer_batch_at(&batch).unwrap();
        offered.extend(ids.into_iter().zip(batch.into_iter().map(|(p, _)| p)));
        let single = format!("s{b}");
        offered.push((q.offer_at(&single, due).unwrap(), single));
    }
    let taken = take_all(&q, offered.len());
    assert!(
        taken == offered,
        "several batches: {}",
        first_difference(&offered, &taken)
    );
}
