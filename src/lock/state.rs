//! One lock name as every handle of it in one `Redwheel` sees it: its keys,
//! the current hold of each thread of this process, its waiters.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use parking_lot::Mutex;

use super::ctx::{LockCtx, OnLost};
use super::hold::{HELD, Hold};
use super::keys::Keys;
use super::waiters::Waiters;

/// One lock name, as every handle of it in one `Redwheel` sees it.
pub(crate) struct LockState {
    pub name: Arc<str>,
    pub keys: Keys,
    pub route: Arc<str>,
    /// The cluster slot of its keys.
    pub slot: u16,
    /// The current hold of each thread of this process (by thread number).
    pub holds: Mutex<HashMap<u64, Arc<Hold>>>,
    pub waiters: Waiters,
    /// The unlock channel is subscribed (or being subscribed).
    pub subscribed: AtomicBool,
}

impl LockState {
    pub(crate) fn new(name: &str) -> LockState {
        let keys = Keys::new(name);
        LockState {
            name: Arc::from(name),
            route: Arc::from(keys.lock.as_str()),
            slot: crate::runtime::slot(keys.lock.as_bytes()),
            keys,
            holds: Mutex::new(HashMap::new()),
            waiters: Waiters::new(),
            subscribed: AtomicBool::new(false),
        }
    }

    /// A new hold of this lock by `owner`, still acquiring.
    pub(crate) fn new_hold(
        &self,
        owner: String,
        on_lost: Option<OnLost>,
        ctx: Arc<LockCtx>,
    ) -> Hold {
        Hold::new(&self.name, &self.route, self.slot, owner, on_lost, ctx)
    }

    /// The calling thread's current hold, if it has one that is held.
    pub(crate) fn current_hold(&self, tid: u64) -> Option<Arc<Hold>> {
        let hold = self.holds.lock().get(&tid).cloned()?;
        (!hold.check_lost() && hold.state() == HELD).then_some(hold)
    }

    /// Forgets `hold` as `tid`'s current hold, if it still is.
    pub(crate) fn forget(&self, tid: u64, hold: &Arc<Hold>) {
        let mut holds = self.holds.lock();
        if holds.get(&tid).is_some_and(|h| Arc::ptr_eq(h, hold)) {
            holds.remove(&tid);
        }
    }
}
