//! [`AsyncRuntime`]: what the futures of one `Redwheel` share: one
//! multiplexed connection per node (started on first use), the list of
//! waits to end at shutdown, and the cluster's slot-map refreshes asked for
//! by futures (run on a thread of their own, never in a `poll`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use crossbeam_channel::Sender;
use parking_lot::Mutex;

use super::io::{Mux, MuxConfig};
use crate::error::Error;
use crate::runtime::cluster::Cluster;
use crate::runtime::endpoint::Endpoint;
use crate::runtime::pool::shut_down;
use crate::runtime::wait::ShutdownList;

/// What the futures of one `Redwheel` share.
pub(crate) struct AsyncRuntime {
    config: MuxConfig,
    /// The one server's mux (single-node backend), started on first use.
    single: Option<(Arc<Endpoint>, OnceLock<Arc<Mux>>)>,
    /// The masters' muxes (cluster), by `host:port`.
    by_node: Mutex<HashMap<String, Arc<Mux>>>,
    pub(crate) shutdown: Arc<ShutdownList>,
    closed: AtomicBool,
    refresher: OnceLock<Option<Sender<()>>>,
}

impl AsyncRuntime {
    /// For one server at `endpoint` (`Some`), or a cluster (`None`).
    pub(crate) fn new(endpoint: Option<Arc<Endpoint>>, config: MuxConfig) -> AsyncRuntime {
        AsyncRuntime {
            config,
            single: endpoint.map(|e| (e, OnceLock::new())),
            by_node: Mutex::new(HashMap::new()),
            shutdown: Arc::new(ShutdownList::default()),
            closed: AtomicBool::new(false),
            refresher: OnceLock::new(),
        }
    }

    /// The one server's mux.
    pub(super) fn single(&self) -> Option<Result<Arc<Mux>, Error>> {
        let (endpoint, mux) = self.single.as_ref()?;
        if self.closed.load(Ordering::Acquire) {
            return Some(Err(shut_down()));
        }
        if let Some(m) = mux.get() {
            return Some(Ok(Arc::clone(m)));
        }
        // Two callers may race to start it; the loser's thread ends when
        // its `Mux` is dropped.
        Some(
            Mux::start(Arc::clone(endpoint), self.config.clone())
                .map(|m| Arc::clone(mux.get_or_init(|| Arc::new(m)))),
        )
    }

    /// The mux of the node at `addr` (`host:port`) reached through
    /// `endpoint`.
    pub(super) fn node(&self, addr: &str, endpoint: &Arc<Endpoint>) -> Result<Arc<Mux>, Error> {
        if self.closed.load(Ordering::Acquire) {
            return Err(shut_down());
        }
        let mut by_node = self.by_node.lock();
        if let Some(m) = by_node.get(addr) {
            return Ok(Arc::clone(m));
        }
        let m = Arc::new(Mux::start(Arc::clone(endpoint), self.config.clone())?);
        by_node.insert(addr.to_owned(), Arc::clone(&m));
        Ok(m)
    }

    /// Asks for a fresh slot map, on the refresher thread (started on
    /// first use); a request while one is pending is merged with it.
    pub(super) fn refresh_soon(&self, cluster: &Arc<Cluster>) {
        let tx = self.refresher.get_or_init(|| {
            let (tx, rx) = crossbeam_channel::bounded::<()>(1);
            let cluster = Arc::downgrade(cluster);
            let spawned = std::thread::Builder::new()
                .name("redwheel-mux-refresh".to_owned())
                .spawn(move || {
                    while rx.recv().is_ok() {
                        match cluster.upgrade() {
                            Some(c) => c.request_refresh(),
                            None => return,
                        }
                    }
                });
            match spawned {
                Ok(_) => Some(tx),
                Err(e) => {
                    tracing::warn!(target: "redwheel::runtime", error = %e, "could not start the slot-map refresher thread");
                    None
                }
            }
        });
        if let Some(tx) = tx {
            let _ = tx.try_send(());
        }
    }

    /// Closes every mux and ends every wait (shutdown).
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
        if let Some((_, m)) = &self.single
            && let Some(m) = m.get()
        {
            m.close();
        }
        for m in self.by_node.lock().values() {
            m.close();
        }
        self.shutdown.close();
    }
}
