//! Every Redis round trip of a queue or lock operation runs in a `debug`
//! span `redis` with its op, queue or lock, batch size and duration.

mod support;

use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::{RedisServer, within};
use tracing_subscriber::fmt::format::FmtSpan;

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

impl Log {
    /// The closed `redis` spans (one line each).
    fn closed_round_trips(&self) -> Vec<String> {
        String::from_utf8_lossy(&self.0.lock().unwrap())
            .lines()
            .filter(|l| l.contains("redis{") && l.contains("close"))
            .map(str::to_owned)
            .collect()
    }
}

#[test]
fn each_round_trip_closes_a_debug_span_with_op_target_batch_and_duration() {
    within(HANG, || {
        let server = RedisServer::start();
        let rw = server.connect();
        let log = Log::default();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_span_events(FmtSpan::CLOSE)
            .with_ansi(false)
            .with_writer({
                let log = log.clone();
                move || log.clone()
            })
            .finish();
        // Spans of calls made on this thread only.
        tracing::subscriber::with_default(subscriber, || {
            let q = rw.queue::<String>("spans").unwrap();
            q.offer_batch(&[
                ("a".to_string(), Duration::ZERO),
                ("b".to_string(), Duration::ZERO),
            ])
            .unwrap();
            q.poll(Duration::from_secs(30)).unwrap().unwrap();
            let lock = rw.lock("spans-lock");
            drop(lock.lock().unwrap());
        });
        let spans = log.closed_round_trips();
        let find = |needle: &str| {
            spans
                .iter()
                .find(|l| l.contains(needle))
                .unwrap_or_else(|| panic!("no span with {needle} in {spans:#?}"))
                .clone()
        };
        let offer = find(r#"op="offer_batch""#);
        assert!(
            offer.contains(r#"queue="spans""#) && offer.contains("batch=2"),
            "{offer}"
        );
        assert!(offer.contains("elapsed_us="), "{offer}");
        let take = find(r#"op="take""#);
        assert!(
            take.contains(r#"queue="spans""#) && take.contains("elapsed_us="),
            "{take}"
        );
        for op in ["lock_acquire", "lock_release"] {
            let span = find(&format!(r#"op="{op}""#));
            assert!(
                span.contains(r#"lock="spans-lock""#) && span.contains("elapsed_us="),
                "{span}"
            );
        }
    });
}
