//! A server that lost redwheel's scripts (`SCRIPT FLUSH`, a restart) and a
//! user that may not load them again: the watchdog backs off instead of
//! spinning, and the error says which permission is missing.
//!
//! One test in this file: it installs a process-wide `tracing` subscriber
//! to read what the driver thread logs.

mod support;

use std::io;
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use redwheel::{ErrorKind, LostCause, Redwheel};
use support::{RedisServer, add_acl_user, readme_acl_rules};

const HANG: Duration = Duration::from_secs(120);

/// Captured log output.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<u8>>>);

impl io::Write for Log {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// `rejected_calls` of `command` (as `INFO commandstats` names it, e.g.
/// `script|load`): calls the ACL refused.
fn rejected(server: &RedisServer, command: &str) -> u64 {
    let prefix = format!("cmdstat_{command}:");
    server
        .info("commandstats")
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|rest| {
            rest.split(',')
                .find_map(|kv| kv.strip_prefix("rejected_calls="))
                .map(|n| n.parse().unwrap())
        })
        .unwrap_or(0)
}

/// Issue 18, item 9. `NOSCRIPT` made the driver load the script and run
/// the job again at once; when the load failed it did so again and again
/// (thousands of rounds a second). Now a refused load backs off on the job
/// schedule (100 ms, doubling), so over the lease that the hold has left
/// the server sees a handful of attempts; the hold is lost when its lease
/// runs out, and the error, logged by the driver and returned by a direct
/// call, is `PermissionDenied` naming `script|load`.
#[test]
fn a_user_who_may_not_load_scripts_gets_a_clear_error_and_no_spin_after_a_script_flush() {
    let log = Log::default();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .with_writer({
            let log = log.clone();
            move || log.clone()
        })
        .finish();
    tracing::subscriber::set_global_default(subscriber).unwrap();

    let server = RedisServer::start();
    let rules = readme_acl_rules().replace(" +script|load", "");
    assert!(!rules.contains("script"), "{rules}");
    add_acl_user(&server, "app", "s3cret", &rules);
    // The scripts are there at first (loaded by someone allowed to).
    for source in [
        include_str!("../lua/lock_acquire.lua"),
        include_str!("../lua/lock_renew.lua"),
        include_str!("../lua/lock_release.lua"),
    ] {
        server.cmd(&["SCRIPT", "LOAD", source]);
    }
    let url = format!("redis://app:s3cret@127.0.0.1:{}/", server.port());
    let rw = Redwheel::connect(&url).unwrap();
    let (lost_tx, lost_rx) = mpsc::channel();
    let lease = Duration::from_secs(1);
    let g = rw
        .lock("flushed")
        .watchdog_lease(lease)
        .on_lost(move |l| {
            let _ = lost_tx.send(l.cause());
        })
        .lock()
        .unwrap();
    let renewals = rw.lock_stats().renewals;
    support::within(HANG, {
        let rw = rw.clone();
        move || {
            while rw.lock_stats().renewals <= renewals {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    });
    assert_eq!(rejected(&server, "script|load"), 0);

    server.cmd(&["SCRIPT", "FLUSH"]);
    // The next renewal finds the script gone and may not load it: the
    // hold runs out its lease unrenewed.
    let cause = lost_rx.recv_timeout(HANG).expect("the hold is lost");
    assert_eq!(cause, LostCause::Expired);
    assert!(g.is_lost());
    let attempts = rejected(&server, "script|load");
    // At most about one lease of 100, 200, 400 ms… waits.
    assert!(
        (1..=8).contains(&attempts),
        "{attempts} refused loads within one lease"
    );

    let logged = String::from_utf8_lossy(&log.0.lock().unwrap()).into_owned();
    let line = logged
        .lines()
        .find(|l| l.contains("due work failed") && l.contains("renewal"))
        .unwrap_or_else(|| panic!("no driver warning in:\n{logged}"));
    assert!(
        line.contains("lacks the permission `script|load`"),
        "{line}"
    );

    // A direct call after the flush: the same missing permission, final.
    let err = rw.lock("other").try_lock(Duration::ZERO).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::PermissionDenied, "{err}");
    assert!(!err.is_transient());
    assert!(err.to_string().contains("script|load"), "{err}");
    drop(g);
    rw.shutdown(Duration::from_secs(10)).unwrap();
}
