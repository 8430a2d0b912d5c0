//! The calling thread's producers: one per timer it used, found through a
//! thread-local list, with the one used last cached for the fast path.
//!
//! # The cache
//!
//! The cache owns a strong reference of its own to its producer. A
//! producer holds a `Weak` of its timer, which keeps the timer's
//! allocation, hence its address (the key), from being reused: while the
//! cache names a producer, no other timer can have its key. Every lookup
//! that misses empties the cache before anything else and fills it with
//! its own outcome last, after everything that may run user code (the
//! drop of the last reference to a timer runs its executor's drop, which
//! may look up producers again).

use std::cell::{Cell, RefCell};
use std::ptr::{self, NonNull};

use super::producer::Producer;
use super::sync::Arc;

#[cfg(not(redwheel_loom))]
thread_local! {
    static MINE: Mine = const { Mine::new() };
}

// Under loom, threads are the model's: so must their producers be.
#[cfg(redwheel_loom)]
loom::thread_local! {
    static MINE: Mine = Mine::new();
}

/// This thread's producers, one per timer it used, and the one it used
/// last (the cache: see the module docs).
struct Mine {
    /// The key of the cached producer's timer; 0 when `last` is null.
    last_key: Cell<usize>,
    /// The cached producer (from `Arc::into_raw`), or null.
    last: Cell<*const Producer>,
    list: RefCell<Vec<Arc<Producer>>>,
}

impl Mine {
    const fn new() -> Self {
        Mine {
            last_key: Cell::new(0),
            last: Cell::new(ptr::null()),
            list: RefCell::new(Vec::new()),
        }
    }

    /// The cached producer, if it is the one for `key`.
    #[inline(always)]
    fn cached(&self, key: usize) -> Option<NonNull<Producer>> {
        if self.last_key.get() == key {
            NonNull::new(self.last.get().cast_mut())
        } else {
            None
        }
    }

    /// Empties the cache and returns the reference it held.
    fn take_cache(&self) -> Option<Arc<Producer>> {
        self.last_key.set(0);
        let last = self.last.replace(ptr::null());
        // SAFETY: a non-null `last` came from `Arc::into_raw` in
        // `set_cache`, and its reference is given back once, here.
        (!last.is_null()).then(|| unsafe { Arc::from_raw(last) })
    }

    /// Caches `p` (the producer for timer `key`), with its reference, in
    /// place of what a lookup made meanwhile (by user code) cached. Returns
    /// the producer's address.
    fn set_cache(&self, key: usize, p: Arc<Producer>) -> NonNull<Producer> {
        drop(self.take_cache());
        let raw = Arc::into_raw(p);
        self.last.set(raw);
        self.last_key.set(key);
        // SAFETY: from `Arc::into_raw`, so not null.
        unsafe { NonNull::new_unchecked(raw.cast_mut()) }
    }

    /// The lookup that missed the cache (see [`mine`]).
    #[cold]
    #[inline(never)]
    fn lookup(
        &self,
        key: usize,
        register: impl FnOnce() -> Option<Arc<Producer>>,
    ) -> Option<NonNull<Producer>> {
        let old = self.take_cache();
        // Producers of timers that are gone or closed: let them go.
        let mut gone = Vec::new();
        let mut found = {
            let mut list = self.list.borrow_mut();
            list.retain(|p| {
                let keep = p.timer_alive() && !p.ring.is_closed();
                if !keep {
                    gone.push(Arc::clone(p));
                }
                keep
            });
            list.iter().find(|p| p.timer_key() == key).cloned()
        };
        if found.is_none() {
            // With no borrow held: it may drop the last reference to a
            // timer (see the module docs).
            found = register();
            if let Some(p) = &found {
                self.list.borrow_mut().push(Arc::clone(p));
            }
        }
        for p in &gone {
            // SAFETY: this is their thread, letting go of them.
            unsafe { p.orphan() };
        }
        drop((old, gone));
        found.map(|p| self.set_cache(key, p))
    }
}

impl Mine {
    /// The thread leaves its producers for good (it is exiting).
    fn leave(&self) {
        drop(self.take_cache());
        let list = std::mem::take(&mut *self.list.borrow_mut());
        for p in list {
            // SAFETY: this is the producer's thread, leaving.
            unsafe { p.orphan() };
        }
    }
}

impl Drop for Mine {
    fn drop(&mut self) {
        self.leave();
    }
}

/// What the calling thread's exit does to its producers, now (loom models
/// only: a model thread's join returns before its thread-locals are
/// dropped).
#[cfg(all(test, redwheel_loom))]
pub(crate) fn leave_thread() {
    MINE.with(Mine::leave);
}

/// The calling thread's producer for one timer. Valid until the thread
/// next looks up a producer (or exits); use it and let it go.
pub(crate) enum Mineref {
    /// The thread's cached producer.
    Cached(NonNull<Producer>),
    /// Made for one use, because the thread's list is gone (the thread is
    /// exiting); orphaned when dropped.
    Once(Arc<Producer>),
}

impl Mineref {
    /// The producer as `Arc::as_ptr` gives it (for the pool's chunks).
    pub(crate) fn as_ptr(&self) -> *const Producer {
        match self {
            Mineref::Cached(p) => p.as_ptr(),
            Mineref::Once(p) => Arc::as_ptr(p),
        }
    }
}

impl std::ops::Deref for Mineref {
    type Target = Producer;

    fn deref(&self) -> &Producer {
        match self {
            // SAFETY: the thread's cache holds a reference to the producer
            // until the thread's next lookup or exit, after this use.
            Mineref::Cached(p) => unsafe { p.as_ref() },
            Mineref::Once(p) => p,
        }
    }
}

impl Drop for Mineref {
    fn drop(&mut self) {
        if let Mineref::Once(p) = self {
            // SAFETY: made for this thread and this one use.
            unsafe { p.orphan() };
        }
    }
}

/// The calling thread's producer for the timer whose address is `key`,
/// registering one (with `register()`) on first use. `None` if the timer is
/// gone or closed.
#[inline]
pub(crate) fn mine(
    key: usize,
    register: impl FnOnce() -> Option<Arc<Producer>>,
) -> Option<Mineref> {
    let mut register = Some(register);
    let found = MINE.try_with(|m| {
        m.cached(key)
            .or_else(|| register.take().and_then(|f| m.lookup(key, f)))
    });
    match found {
        Ok(found) => found.map(Mineref::Cached),
        // The thread-local list is gone: a producer for this one use.
        Err(_) => register.take().and_then(|f| f()).map(Mineref::Once),
    }
}

/// The calling thread's cached producer (its address, 0 for none) and the
/// addresses of the producers its list holds (tests only).
#[cfg(all(test, not(redwheel_loom)))]
pub(crate) fn cache_state() -> (usize, Vec<usize>) {
    MINE.with(|m| {
        let listed = m
            .list
            .borrow()
            .iter()
            .map(|p| Arc::as_ptr(p).addr())
            .collect();
        (m.last.get().addr(), listed)
    })
}
