//! Bounded waits on Redis: a page's reads (and an action) run on a helper
//! thread, and the request waits for them at most the page timeout. A call
//! that outlives it finishes in the background; while too many of those
//! are still running, new ones are refused at once instead of piling up.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};
use parking_lot::Mutex;

/// Why a bounded call gave no result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Late {
    /// It did not finish within the limit (it goes on in the background).
    TimedOut,
    /// Too many earlier calls are still running (Redis is not answering).
    Busy,
    /// No thread could be started.
    Spawn,
    /// The dashboard is stopping (the call goes on in the background).
    Stopping,
}

impl Late {
    pub(crate) fn message(self, limit: Duration) -> String {
        match self {
            Late::TimedOut => format!("Redis did not answer within {} ms", limit.as_millis()),
            Late::Busy => "Redis is not answering: earlier requests are still waiting".to_owned(),
            Late::Spawn => "the dashboard could not start a thread".to_owned(),
            Late::Stopping => "the dashboard is stopping".to_owned(),
        }
    }
}

/// Runs calls on helper threads and waits for each at most `limit`, or
/// until [`cancel`](Bounded::cancel).
#[derive(Debug)]
pub(crate) struct Bounded {
    limit: Duration,
    max_running: usize,
    running: Arc<AtomicUsize>,
    /// Disconnected by `cancel`: every wait ends.
    cancelled: Receiver<()>,
    cancel: Mutex<Option<Sender<()>>>,
}

/// Decrements the count of running calls when the helper thread ends,
/// however it ends.
struct Running(Arc<AtomicUsize>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Bounded {
    pub(crate) fn new(limit: Duration, max_running: usize) -> Bounded {
        let (tx, rx) = crossbeam_channel::bounded(0);
        Bounded {
            limit,
            max_running,
            running: Arc::new(AtomicUsize::new(0)),
            cancelled: rx,
            cancel: Mutex::new(Some(tx)),
        }
    }

    /// Ends every wait, now and later, with [`Late::Stopping`].
    pub(crate) fn cancel(&self) {
        self.cancel.lock().take();
    }

    pub(crate) fn limit(&self) -> Duration {
        self.limit
    }

    /// `f`'s result, if it comes within the limit.
    pub(crate) fn run<R: Send + 'static>(
        &self,
        f: impl FnOnce() -> R + Send + 'static,
    ) -> Result<R, Late> {
        if self.running.fetch_add(1, Ordering::AcqRel) >= self.max_running {
            self.running.fetch_sub(1, Ordering::AcqRel);
            return Err(Late::Busy);
        }
        let guard = Running(Arc::clone(&self.running));
        let (tx, rx) = crossbeam_channel::bounded(1);
        let spawned = std::thread::Builder::new()
            .name("redwheel-web-io".to_owned())
            .spawn(move || {
                let _guard = guard;
                let _ = tx.send(f());
            });
        if let Err(e) = spawned {
            tracing::warn!(target: "redwheel::web", error = %e, "could not start a helper thread");
            return Err(Late::Spawn);
        }
        crossbeam_channel::select! {
            recv(rx) -> r => r.map_err(|_| Late::TimedOut),
            recv(self.cancelled) -> _ => Err(Late::Stopping),
            default(self.limit) => Err(Late::TimedOut),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_past_the_limit_is_late_and_refuses_later_calls_up_to_the_cap() {
        let patient = Bounded::new(Duration::from_secs(60), 1);
        assert_eq!(patient.run(|| 7), Ok(7));

        let b = Bounded::new(Duration::from_millis(1), 1);
        let (release, held) = crossbeam_channel::bounded::<()>(0);
        assert_eq!(
            b.run(move || {
                let _ = held.recv();
            }),
            Err(Late::TimedOut)
        );
        // The first call still runs: the cap of 1 refuses the next at once.
        assert_eq!(b.run(|| 1), Err(Late::Busy));
        release.send(()).unwrap();
        // Once it has ended, calls run again.
        loop {
            match b.run(|| 2) {
                Ok(v) => break assert_eq!(v, 2),
                Err(Late::Busy | Late::TimedOut) => std::thread::yield_now(),
                Err(e) => panic!("{e:?}"),
            }
        }
    }

    #[test]
    fn cancel_ends_a_wait_at_once_and_every_later_one() {
        let b = Arc::new(Bounded::new(Duration::from_secs(3_600), 4));
        let (release, held) = crossbeam_channel::bounded::<()>(0);
        let waiting = {
            let b = Arc::clone(&b);
            std::thread::spawn(move || {
                b.run(move || {
                    let _ = held.recv();
                })
            })
        };
        b.cancel();
        assert_eq!(waiting.join().unwrap(), Err(Late::Stopping));
        assert_eq!(
            b.run(|| std::thread::sleep(Duration::from_millis(50))),
            Err(Late::Stopping)
        );
        drop(release);
    }
}
