//! The `redwheel` command-line tool run as a process against a private
//! `redis-server` (and once against a local 3+3 cluster): every
//! subcommand's tables and `--json` documents, and its exit codes.

mod support;

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use redwheel::{MessageId, QueueOptions};
use serde_json::Value;
use support::RedisServer;
use support::cluster::RedisCluster;

/// Runs `redwheel --url <url> <args…>` (with `REDIS_URL` unset).
fn redwheel(url: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_redwheel"))
        .arg("--url")
        .arg(url)
        .args(args)
        .env_remove("REDIS_URL")
        .stdin(Stdio::null())
        .output()
        .expect("run the redwheel binary")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Runs it, expects exit 0, returns stdout.
fn ok(url: &str, args: &[&str]) -> String {
    let o = redwheel(url, args);
    assert_eq!(
        o.status.code(),
        Some(0),
        "redwheel {args:?} failed: {}",
        stderr(&o)
    );
    stdout(&o)
}

/// Runs it with `--json`, expects exit 0, parses the one document.
fn ok_json(url: &str, args: &[&str]) -> Value {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let text = ok(url, &all);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("not one JSON document ({e}): {text}"))
}

/// Expects exit `code` and exactly one line on stderr, `redwheel: …`,
/// with no trace of a panic; returns that line.
fn fails_with(o: &Output, code: i32) -> String {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(code), "stderr: {err}");
    assert_eq!(err.lines().count(), 1, "not one line: {err:?}");
    assert!(err.starts_with("redwheel: "), "{err:?}");
    assert!(
        !err.contains("panicked") && !err.contains("backtrace"),
        "{err:?}"
    );
    err
}

/// The table row whose first cell is `first`, split into cells.
fn row<'a>(table: &'a str, first: &str) -> Vec<&'a str> {
    table
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|cells| cells.first() == Some(&first))
        .unwrap_or_else(|| panic!("no row {first:?} in:\n{table}"))
}

#[test]
fn stats_counts_every_state_of_named_and_scanned_queues() {
    let server = RedisServer::start();
    let url = server.url();
    let rw = server.connect();
    let orders = rw
        .queue_with::<Vec<u8>>("orders", QueueOptions::default().max_deliveries(1))
        .unwrap();
    orders
        .offer(&b"later".to_vec(), Duration::from_secs(3600))
        .unwrap();
    for p in [b"a", b"b", b"c"] {
        orders.offer(&p.to_vec(), Duration::ZERO).unwrap();
    }
    let claimed = orders.claim(Duration::from_secs(10)).unwrap().unwrap();
    let died = orders.claim(Duration::from_secs(10)).unwrap().unwrap();
    died.nack(Duration::ZERO).unwrap(); // max_deliveries 1: a dead letter
    let emails = rw.queue::<Vec<u8>>("emails").unwrap();
    emails
        .offer(&b"x".to_vec(), Duration::from_secs(60))
        .unwrap();

    let table = ok(&url, &["stats"]);
    assert_eq!(
        table
            .lines()
            .next()
            .unwrap()
            .split_whitespace()
            .collect::<Vec<_>>(),
        [
            "QUEUE",
            "DELAYED",
            "READY",
            "IN-FLIGHT",
            "DEAD",
            "OLDEST-OVERDUE",
            "NEXT-DUE"
        ]
    );
    let o = row(&table, "orders");
    assert_eq!(&o[1..5], ["1", "1", "1", "1"], "{table}");
    assert!(o[6] == "in", "next due is relative: {table}");
    assert_eq!(&row(&table, "emails")[1..5], ["1", "0", "0", "0"]);

    let doc = ok_json(&url, &["stats", "orders"]);
    let queues = doc["queues"].as_array().unwrap();
    assert_eq!(queues.len(), 1, "only the named queue: {doc}");
    let q = &queues[0];
    assert_eq!(q["queue"], "orders");
    assert_eq!(
        (&q["delayed"], &q["ready"], &q["in_flight"], &q["dead"]),
        (
            &Value::from(1),
            &Value::from(1),
            &Value::from(1),
            &Value::from(1)
        )
    );
    assert!(q["oldest_overdue_ms"].is_u64(), "{doc}");
    assert!(q["next_due_ms"].as_u64().unwrap() > q["server_time_ms"].as_u64().unwrap());

    let all = ok_json(&url, &["stats"]);
    let names: Vec<&str> = all["queues"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| q["queue"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["emails", "orders"]);
    claimed.ack().unwrap();
}

#[test]
fn an_unknown_queue_exits_4_with_one_line() {
    let server = RedisServer::start();
    let url = server.url();
    for args in [
        &["stats", "nope"][..],
        &["peek", "nope"],
        &["dead", "nope"],
        &["requeue-dead", "nope"],
        &["remove", "nope", "some-id"],
        &["watch", "nope", "--once", "--interval", "10ms"],
    ] {
        let err = fails_with(&redwheel(&url, args), 4);
        assert!(err.contains("unknown queue \"nope\""), "{args:?}: {err}");
    }
}

#[test]
fn peek_shows_each_state_with_lossless_payloads() {
    let server = RedisServer::start();
    let url = server.url();
    let rw = server.connect();
    let q = rw
        .queue_with::<Vec<u8>>("jobs", QueueOptions::default().max_deliveries(5))
        .unwrap();
    let binary = b"\xff\x00line\nend".to_vec();
    let ready_text = q.offer(&b"hello world".to_vec(), Duration::ZERO).unwrap();
    let ready_bin = q.offer(&binary, Duration::ZERO).unwrap();
    let later = q
        .offer(&b"tomorrow".to_vec(), Duration::from_secs(86_400))
        .unwrap();
    // Wait for both to be ready (the transfer runs at once on open).
    while q.stats().unwrap().ready < 2 {
        std::thread::yield_now();
    }

    let table = ok(&url, &["peek", "jobs"]);
    assert_eq!(
        table
            .lines()
            .next()
            .unwrap()
            .split_whitespace()
            .collect::<Vec<_>>(),
        ["ID", "DUE", "ATTEMPTS", "PAYLOAD"]
    );
    let text_row = table
        .lines()
        .find(|l| l.starts_with(ready_text.as_str()))
        .unwrap();
    assert!(text_row.ends_with("hello world"), "{table}");
    assert!(text_row.contains(" ago "), "{table}");
    let bin_row = table
        .lines()
        .find(|l| l.starts_with(ready_bin.as_str()))
        .unwrap();
    assert!(bin_row.ends_with(r#"b"\xff\u{0}line\nend""#), "{table}");

    let doc = ok_json(&url, &["peek", "jobs", "--ready", "-n", "1"]);
    assert_eq!(doc["state"], "ready");
    let msgs = doc["messages"].as_array().unwrap();
    assert_eq!(msgs.len(), 1, "-n 1: {doc}");
    assert_eq!(msgs[0]["id"], ready_text.as_str());
    assert_eq!(msgs[0]["payload_text"], "hello world");
    assert_eq!(msgs[0]["payload_base64"], "aGVsbG8gd29ybGQ=");

    let doc = ok_json(&url, &["peek", "jobs", "--ready"]);
    let bin = &doc["messages"][1];
    assert_eq!(bin["payload_text"], Value::Null, "not UTF-8: {doc}");
    assert_eq!(bin["payload_base64"], "/wBsaW5lCmVuZA==");
    assert_eq!(bin["payload_bytes"], binary.len());

    let doc = ok_json(&url, &["peek", "jobs", "--delayed"]);
    assert_eq!(doc["messages"][0]["id"], later.as_str());
    assert!(
        doc["messages"][0]["due_ms"].as_u64().unwrap() > doc["server_time_ms"].as_u64().unwrap()
    );

    let d = q.claim(Duration::from_secs(10)).unwrap().unwrap();
    let table = ok(&url, &["peek", "jobs", "--inflight"]);
    let r = row(&table, d.id().as_str());
    assert_eq!(r[3], "1", "attempt 1: {table}");
    assert!(table.contains("VISIBLE-UNTIL") && table.contains("hello world"));
    let doc = ok_json(&url, &["peek", "jobs", "--inflight"]);
    assert!(
        doc["messages"][0]["visible_until_ms"].as_u64().unwrap()
            > doc["server_time_ms"].as_u64().unwrap()
    );

    let o = redwheel(&url, &["peek", "jobs", "--ready", "--dead"]);
    fails_with(&o, 2);
}

#[test]
fn dead_lists_reason_attempts_and_death_and_requeue_dead_revives_them() {
    let server = RedisServer::start();
    let url = server.url();
    let rw = server.connect();
    let q = rw
        .queue_with::<Vec<u8>>("mail", QueueOptions::default().max_deliveries(1))
        .unwrap();
    let id = q.offer(&b"to: ada".to_vec(), Duration::ZERO).unwrap();
    let d = q.claim(Duration::from_secs(10)).unwrap().unwrap();
    d.nack(Duration::ZERO).unwrap();

    let table = ok(&url, &["dead", "mail"]);
    assert_eq!(
        table
            .lines()
            .next()
            .unwrap()
            .split_whitespace()
            .collect::<Vec<_>>(),
        ["ID", "DIED", "ATTEMPTS", "REASON", "PAYLOAD"]
    );
    let line = table.lines().find(|l| l.starts_with(id.as_str())).unwrap();
    assert!(
        line.contains(" ago ") && line.ends_with("to: ada"),
        "{table}"
    );
    assert_eq!(row(&table, id.as_str())[3], "1");

    let doc = ok_json(&url, &["dead", "mail"]);
    let m = &doc["messages"][0];
    assert_eq!(m["id"], id.as_str());
    assert_eq!(m["attempts"], 1);
    assert!(!m["reason"].as_str().unwrap().is_empty(), "{doc}");
    assert!(m["died_ms"].as_u64().unwrap() <= doc["server_time_ms"].as_u64().unwrap());
    assert_eq!(m["payload_text"], "to: ada");

    let doc = ok_json(&url, &["requeue-dead", "mail", "-n", "5"]);
    assert_eq!(doc["requeued"], 1);
    let s = q.stats().unwrap();
    assert_eq!((s.dead, s.ready), (0, 1));
    assert_eq!(
        ok(&url, &["requeue-dead", "mail"]),
        "requeued 0 dead letters of mail\n"
    );
    assert_eq!(ok(&url, &["dead", "mail"]), "no dead letters\n");
}

#[test]
fn remove_deletes_by_id_and_exits_4_for_an_id_not_found() {
    let server = RedisServer::start();
    let url = server.url();
    let rw = server.connect();
    let q = rw.queue::<String>("tasks").unwrap();
    let a = q.offer(&"a".to_string(), Duration::from_secs(600)).unwrap();
    let b = q.offer(&"b".to_string(), Duration::from_secs(600)).unwrap();
    let c = q.offer(&"c".to_string(), Duration::from_secs(600)).unwrap();

    assert_eq!(
        ok(&url, &["remove", "tasks", a.as_str()]),
        format!("removed {a}\n")
    );
    assert_eq!(q.len().unwrap(), 2);

    let doc = ok_json(&url, &["remove", "tasks", b.as_str()]);
    assert_eq!(doc["removed"], serde_json::json!([b.as_str()]));

    let o = redwheel(&url, &["remove", "tasks", c.as_str(), "no-such-id"]);
    let err = fails_with(&o, 4);
    assert!(
        err.contains("1 of 2 ids not found") && err.contains("no-such-id"),
        "{err}"
    );
    assert_eq!(
        stdout(&o),
        format!("removed {c}\n"),
        "the found one is removed"
    );
    assert_eq!(q.len().unwrap(), 0);
    assert!(!q.remove(&MessageId::from(c.as_str())).unwrap());
}

#[test]
fn offer_takes_a_delay_and_rejects_a_bad_duration_with_exit_2() {
    let server = RedisServer::start();
    let url = server.url();
    let id = ok(&url, &["offer", "reminders", "call ada", "--delay", "5m"]);
    let id = id.trim();
    let doc = ok_json(&url, &["peek", "reminders", "--delayed"]);
    let m = &doc["messages"][0];
    assert_eq!(m["id"], id);
    assert_eq!(m["payload_text"], "call ada");
    let ahead = m["due_ms"].as_u64().unwrap() - doc["server_time_ms"].as_u64().unwrap();
    assert!(ahead > 240_000 && ahead <= 300_000, "due in {ahead} ms");

    let doc = ok_json(&url, &["offer", "reminders", "x", "--delay", "1500ms"]);
    assert_eq!(doc["delay_ms"], 1500);
    assert_eq!(doc["queue"], "reminders");

    for bad in ["10x", "1.5s", "-1", "soon", ""] {
        let arg = format!("--delay={bad}");
        let err = fails_with(&redwheel(&url, &["offer", "reminders", "x", &arg]), 2);
        assert!(err.contains("not a duration"), "{err}");
    }
    fails_with(
        &redwheel(&url, &["watch", "--interval", "fast", "--once"]),
        2,
    );
    fails_with(&redwheel(&url, &["frobnicate"]), 2);
    let err = fails_with(&redwheel(&url, &["stats", "bad{name}"]), 2);
    assert!(err.contains("invalid queue name"), "{err}");
}

#[test]
fn take_and_claim_count_deliveries_that_watch_reports() {
    let server = RedisServer::start();
    let url = server.url();
    let rw = server.connect();
    let q = rw.queue::<Vec<u8>>("counted").unwrap();
    let batch: Vec<(Vec<u8>, Duration)> = (0..6).map(|i| (vec![i], Duration::ZERO)).collect();
    q.offer_batch(&batch).unwrap();
    q.take().unwrap();
    q.take().unwrap();
    let claims = q.claim_batch(3, Duration::from_secs(10)).unwrap();
    assert_eq!(claims.len(), 3);
    // One HINCRBY per script call: 1 per take, 3 for the batch claim.
    assert_eq!(
        server.cmd(&["HGET", "redwheel:{counted}:counts", "delivered"]),
        "$1\r\n5\r\n"
    );

    let doc = ok_json(&url, &["watch", "counted", "--once", "--interval", "10ms"]);
    let w = &doc["queues"][0];
    assert_eq!(w["queue"], "counted");
    assert_eq!(w["delivered"], 5);
    assert_eq!(
        (&w["ready"], &w["in_flight"]),
        (&Value::from(1), &Value::from(3))
    );
    assert_eq!(w["ready_age_sampled"], 1);
    assert!(
        w["ready_age_p50_ms"].is_u64() && w["ready_age_p99_ms"].is_u64(),
        "{doc}"
    );
}

#[test]
fn watch_once_prints_one_frame_with_backlog_and_delivery_rate() {
    let server = RedisServer::start();
    let url = server.url();
    let rw = server.connect();
    let q = rw.queue::<Vec<u8>>("busy").unwrap();
    let refill: Vec<(Vec<u8>, Duration)> = (0..1_000u32)
        .map(|i| (i.to_be_bytes().to_vec(), Duration::ZERO))
        .collect();
    q.offer_batch(&refill).unwrap();
    q.offer(&b"later".to_vec(), Duration::from_secs(3600))
        .unwrap();

    // Deliver for as long as the watch runs (its rate is measured over its
    // interval, between its two readings), offering more than is taken so
    // the ready list never runs dry.
    let mut child = Command::new(env!("CARGO_BIN_EXE_redwheel"))
        .args([
            "--url",
            &url,
            "--json",
            "watch",
            "busy",
            "--once",
            "--interval",
            "300ms",
        ])
        .env_remove("REDIS_URL")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut taken = 0u64;
    while child.try_wait().unwrap().is_none() {
        if q.poll(Duration::from_millis(5)).unwrap().is_some() {
            taken += 1;
            if taken.is_multiple_of(100) {
                q.offer_batch(&refill[..200]).unwrap();
            }
        }
    }
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let doc: Value = serde_json::from_slice(&o.stdout).expect("one JSON document");
    assert_eq!(doc["interval_ms"], 300);
    let w = &doc["queues"][0];
    assert_eq!(w["queue"], "busy");
    assert!(w["delayed"].as_u64().unwrap() >= 1, "{doc}");
    assert!(w["ready"].as_u64().unwrap() > 0, "{doc}");
    assert!(
        w["delivered_per_sec"].as_f64().unwrap() > 0.0,
        "{doc} ({taken} taken)"
    );
    assert!(w["delivered"].as_u64().unwrap() <= taken);
    assert!(w["ready_age_p50_ms"].as_u64().unwrap() <= w["ready_age_p99_ms"].as_u64().unwrap());

    // The human frame: a header and one row per queue.
    let frame = ok(&url, &["watch", "--once", "--interval", "10ms"]);
    assert!(frame.starts_with("redwheel watch "), "{frame}");
    assert!(
        frame.contains("READY-AGE-P50") && frame.contains("DELIVERED/S"),
        "{frame}"
    );
    let r = row(&frame, "busy");
    assert_eq!(r.len(), 8, "{frame}");
    assert!(r[1].parse::<u64>().unwrap() >= 1, "{frame}");
    assert!(
        !frame.contains('\x1b'),
        "no redraw codes when not a terminal"
    );
}

#[test]
fn locks_lists_holder_hold_count_lease_and_token() {
    let server = RedisServer::start();
    let url = server.url();
    let rw = server.connect();
    let lock = rw.lock("inventory:42");
    let guard = lock.lock().unwrap();
    let again = lock.lock().unwrap();
    let _other = rw.lock("payments").lock().unwrap();

    let doc = ok_json(&url, &["locks"]);
    let locks = doc["locks"].as_array().unwrap();
    assert_eq!(locks.len(), 2, "{doc}");
    let l = &locks[0];
    assert_eq!(l["lock"], "inventory:42");
    assert_eq!(l["token"], guard.fencing_token());
    assert_eq!(l["last_token"], guard.fencing_token());
    assert_eq!(l["holders"].as_array().unwrap().len(), 1);
    assert_eq!(l["holders"][0]["holds"], 2);
    let ttl = l["ttl_ms"].as_u64().unwrap();
    assert!(ttl > 0 && ttl <= 30_000, "{doc}");

    let table = ok(&url, &["locks", "inv*"]);
    assert_eq!(
        table
            .lines()
            .next()
            .unwrap()
            .split_whitespace()
            .collect::<Vec<_>>(),
        ["LOCK", "HOLDER", "HOLDS", "TTL", "TOKEN"]
    );
    let r = row(&table, "inventory:42");
    assert_eq!(r[2], "2");
    assert_eq!(r[4], guard.fencing_token().to_string());
    assert!(!table.contains("payments"), "{table}");

    drop((again, guard));
    assert_eq!(ok(&url, &["locks", "inv*"]), "no locks held\n");
}

#[test]
fn unreachable_or_bad_urls_exit_3_with_one_line() {
    let port = support::free_port();
    let nothing = format!("redis://127.0.0.1:{port}");
    let err = fails_with(&redwheel(&nothing, &["stats"]), 3);
    assert!(err.contains(&format!("127.0.0.1:{port}")), "{err}");
    fails_with(&redwheel("not a url", &["stats"]), 3);
    let err = fails_with(&redwheel("redis://:secret@127.0.0.1:1/", &["locks"]), 3);
    assert!(!err.contains("secret"), "{err}");

    // REDIS_URL is the default.
    let o = Command::new(env!("CARGO_BIN_EXE_redwheel"))
        .args(["stats"])
        .env("REDIS_URL", &nothing)
        .output()
        .unwrap();
    fails_with(&o, 3);
}

#[test]
fn stats_on_a_cluster_scans_every_master() {
    let cluster = RedisCluster::start();
    let urls = cluster.urls();
    let rw = cluster.connect();
    let names: Vec<String> = (0..12).map(|i| format!("q{i:02}")).collect();
    let mut masters = std::collections::HashSet::new();
    for name in &names {
        let q = rw.queue::<Vec<u8>>(name).unwrap();
        q.offer(&b"x".to_vec(), Duration::from_secs(600)).unwrap();
        masters
            .insert(cluster.master_of_slot(cluster.keyslot(&format!("redwheel:{{{name}}}:msg"))));
    }
    assert!(masters.len() > 1, "the queues spread over several masters");

    let o = Command::new(env!("CARGO_BIN_EXE_redwheel"))
        .args(["--cluster", &urls.join(","), "--json", "stats"])
        .env_remove("REDIS_URL")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let doc: Value = serde_json::from_slice(&o.stdout).unwrap();
    let found: Vec<&str> = doc["queues"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| {
            assert_eq!(q["delayed"], 1);
            q["queue"].as_str().unwrap()
        })
        .collect();
    assert_eq!(found, names);
}

#[test]
fn usage_errors_exit_2_before_connecting_even_with_redis_down() {
    let nothing = format!("redis://127.0.0.1:{}", support::free_port());
    for args in [
        &["peek", "a{b"][..],
        &["stats", "ok", "bad}name"],
        &["watch", "--interval", "0", "--once"],
        &["offer", "q", "x", "--delay", "soon"],
        &[],
    ] {
        let err = fails_with(&redwheel(&nothing, args), 2);
        assert!(!err.contains("connect"), "{args:?}: {err}");
    }
    let err = fails_with(&redwheel(&nothing, &[]), 2);
    assert!(err.contains("a command is needed"), "{err}");
}

#[test]
fn schedules_are_set_listed_paused_resumed_and_removed_with_their_next_runs() {
    let server = RedisServer::start();
    let url = server.url();
    let nightly = [
        "schedule",
        "set",
        "reports",
        "nightly",
        "build",
        "--cron",
        "0 3 * * *",
        "--tz",
        "Europe/Berlin",
    ];
    let set = ok(&url, &nightly);
    assert!(
        set.starts_with("created schedule nightly of reports: cron \"0 3 * * *\" Europe/Berlin"),
        "{set}"
    );
    let again = ok_json(&url, &nightly);
    assert_eq!(again["result"], "unchanged");
    ok(
        &url,
        &[
            "schedule",
            "set",
            "reports",
            "tick",
            "t",
            "--every",
            "1h",
            "--catch-up",
            "all:5",
        ],
    );
    ok(&url, &["schedule", "pause", "reports", "tick"]);
    let table = ok(&url, &["schedules", "reports", "-n", "2"]);
    let nightly = row(&table, "nightly");
    assert_eq!(nightly[nightly.len() - 3], "no", "{table}");
    assert!(
        nightly.last().unwrap().ends_with("T02:00:00.000Z"),
        "{table}"
    );
    let tick = row(&table, "tick");
    assert_eq!(&tick[tick.len() - 2..], ["yes", "-"], "{table}");
    let doc = ok_json(&url, &["schedules", "reports", "-n", "2"]);
    let list = doc["schedules"].as_array().unwrap();
    assert_eq!(list.len(), 2);
    assert_eq!(list[0]["name"], "nightly");
    assert_eq!(
        list[0]["definition"],
        "v1;cron=0 3 * * *;tz=Europe/Berlin;start=-;until=-;catch_up=latest"
    );
    let runs = list[0]["next_runs_ms"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    assert_eq!(
        runs[1].as_u64().unwrap() - runs[0].as_u64().unwrap(),
        86_400_000
    );
    assert_eq!(list[1]["paused"], true);
    assert!(list[1]["next_ms"].is_null());
    assert!(doc["server_time_ms"].as_u64().is_some());
    ok(&url, &["schedule", "resume", "reports", "tick"]);
    assert_eq!(
        ok_json(&url, &["schedules", "reports"])["schedules"][1]["paused"],
        false
    );
    ok(&url, &["schedule", "unschedule", "reports", "tick"]);
    let gone = fails_with(
        &redwheel(&url, &["schedule", "remove", "reports", "tick"]),
        4,
    );
    assert!(gone.contains("no schedule \"tick\""), "{gone}");
    fails_with(
        &redwheel(&url, &["schedule", "pause", "reports", "nope"]),
        4,
    );
    // Bad input is a usage error, before anything is written.
    let set_x = |more: &[&str]| {
        let mut args = vec!["schedule", "set", "reports", "x", "y"];
        args.extend_from_slice(more);
        fails_with(&redwheel(&url, &args), 2)
    };
    let bad = set_x(&["--cron", "0 25 * * *"]);
    assert!(bad.contains("hour field \"25\""), "{bad}");
    set_x(&[]);
    set_x(&["--every", "1s", "--catch-up", "all:0"]);
    assert_eq!(ok(&url, &["schedules", "empty"]), "no schedules in empty\n");
    assert_eq!(
        ok_json(&url, &["schedules", "reports"])["schedules"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
}
