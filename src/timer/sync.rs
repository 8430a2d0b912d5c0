//! The synchronisation primitives the timer's concurrent parts use: std
//! and parking_lot in normal builds, loom's model-checked twins under
//! `--cfg redwheel_loom` (as tokio and crossbeam do under `--cfg loom`; a
//! name of our own, because dependencies of the async tests, such as
//! `event-listener`, switch to loom under `cfg(loom)` too), so that the loom tests
//! (`loom.rs`) check the very code that runs; and the calling thread's id
//! (a thread-local, so loom's under loom too).

#[cfg(not(redwheel_loom))]
pub(crate) use std::sync::atomic::{
    AtomicBool, AtomicPtr, AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering, fence,
};

#[cfg(redwheel_loom)]
pub(crate) use loom::sync::atomic::{
    AtomicBool, AtomicPtr, AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering, fence,
};

/// The reference count of the producers (`producer.rs`), which loom must see
/// to order a producer's last drop after the worker's last use.
#[cfg(not(redwheel_loom))]
pub(crate) use std::sync::Arc;

#[cfg(redwheel_loom)]
pub(crate) use loom::sync::Arc;

/// A mutex whose `lock` returns the guard (parking_lot's in normal builds).
#[cfg(not(redwheel_loom))]
pub(crate) use parking_lot::Mutex;

/// A mutex whose `lock` returns the guard (loom's, unwrapped: a model
/// thread that panics fails the model anyway).
#[cfg(redwheel_loom)]
#[derive(Debug)]
pub(crate) struct Mutex<T>(loom::sync::Mutex<T>);

#[cfg(redwheel_loom)]
impl<T> Mutex<T> {
    pub(crate) fn new(value: T) -> Self {
        Mutex(loom::sync::Mutex::new(value))
    }

    pub(crate) fn lock(&self) -> loom::sync::MutexGuard<'_, T> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// An `UnsafeCell` with loom's access API: every access goes through
/// `with` / `with_mut`, which loom checks for data races.
#[cfg(not(redwheel_loom))]
#[derive(Debug)]
pub(crate) struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

#[cfg(not(redwheel_loom))]
impl<T> UnsafeCell<T> {
    pub(crate) const fn new(value: T) -> Self {
        UnsafeCell(std::cell::UnsafeCell::new(value))
    }

    /// Reads through a raw pointer; the caller upholds the aliasing rules.
    #[inline(always)]
    pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
        f(self.0.get())
    }

    /// Writes through a raw pointer; the caller upholds the aliasing rules.
    #[inline(always)]
    pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}

#[cfg(redwheel_loom)]
pub(crate) use loom::cell::UnsafeCell;

/// The two sides of the rings' asymmetric fence (`ring.rs`): a push
/// stores the published count, runs [`light_fence`] and loads the worker's
/// word; the worker's arming (and closing) stores its word, runs
/// [`heavy_fence`] and loads the published count. Of two such racing
/// sequences at least one load sees the other's store. On Linux, once
/// [`init_fences`] has registered the process for `membarrier`'s private
/// expedited command, the light side is a compiler fence (a push costs no
/// fence instruction) and the heavy side that system call, which runs a
/// full barrier on every CPU that runs one of the process's threads (and a
/// thread that is not running has passed one in its context switch).
/// Elsewhere, and under Miri and loom, both sides are `SeqCst` fences.
#[cfg(all(target_os = "linux", not(miri), not(redwheel_loom)))]
static MEMBARRIER: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Settles, once per process and before any timer exists (every builder
/// calls it first), which fences [`light_fence`] and [`heavy_fence`] are:
/// both sides must agree for as long as any timer runs, so the choice is
/// made before the first timer's threads can read it (they start after
/// its `build`, hence after this).
pub(crate) fn init_fences() {
    #[cfg(all(target_os = "linux", not(miri), not(redwheel_loom)))]
    {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            // SAFETY: `membarrier` takes a command and flags and touches no
            // memory of ours.
            let registered = unsafe {
                libc::syscall(
                    libc::SYS_membarrier,
                    libc::MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED,
                    0,
                    0,
                )
            } == 0;
            MEMBARRIER.store(registered, std::sync::atomic::Ordering::Relaxed);
        });
    }
}

/// The producer's side of the asymmetric fence (see [`MEMBARRIER`]).
#[inline(always)]
pub(crate) fn light_fence() {
    #[cfg(all(target_os = "linux", not(miri), not(redwheel_loom)))]
    if MEMBARRIER.load(std::sync::atomic::Ordering::Relaxed) {
        std::sync::atomic::compiler_fence(Ordering::SeqCst);
        return;
    }
    fence(Ordering::SeqCst);
}

/// The worker's side of the asymmetric fence (see [`MEMBARRIER`]).
pub(crate) fn heavy_fence() {
    #[cfg(all(target_os = "linux", not(miri), not(redwheel_loom)))]
    if MEMBARRIER.load(std::sync::atomic::Ordering::Relaxed) {
        // SAFETY: as in `init_fences`.
        let done = unsafe {
            libc::syscall(
                libc::SYS_membarrier,
                libc::MEMBARRIER_CMD_PRIVATE_EXPEDITED,
                0,
                0,
            )
        } == 0;
        // The kernel refuses the command only if the registration above did
        // not happen, which `MEMBARRIER` rules out. Producers already rely
        // on it, so a failure could only lose a wake-up or a timeout racing
        // `stop()`: rather stop the process than go on so.
        if !done {
            std::process::abort();
        }
        return;
    }
    fence(Ordering::SeqCst);
}

static NEXT_THREAD_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

#[cfg(not(redwheel_loom))]
thread_local! {
    static THREAD_ID: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

// Under loom, threads are the model's: their ids must be too.
#[cfg(redwheel_loom)]
loom::thread_local! {
    static THREAD_ID: std::cell::Cell<u64> = std::cell::Cell::new(0);
}

/// A unique id of the calling thread (never reused), cheaper to compare
/// than `std::thread::ThreadId`. While the thread's locals are being
/// destroyed, a fresh id at every call (see [`id_without_locals`]).
#[inline]
pub(crate) fn thread_id() -> u64 {
    let id = |id: &std::cell::Cell<u64>| {
        let mut v = id.get();
        if v == 0 {
            v = NEXT_THREAD_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            id.set(v);
        }
        v
    };
    #[cfg(not(redwheel_loom))]
    return THREAD_ID
        .try_with(id)
        .unwrap_or_else(|_| id_without_locals());
    #[cfg(redwheel_loom)]
    return THREAD_ID.with(id);
}

/// The id of a thread whose `THREAD_ID` is already destroyed (it is
/// exiting, on a target whose thread-locals live under OS keys): a fresh
/// one at every call, so that no two such calls, and no pool made with
/// one of them, share an id. A pool made in that state therefore has no
/// owner thread at all: every slot freed into it takes the remote path,
/// which any thread may take (the thread that made it still allocates
/// from it and closes it, as its one user).
#[cfg(not(redwheel_loom))]
#[cold]
fn id_without_locals() -> u64 {
    NEXT_THREAD_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

#[cfg(all(test, not(redwheel_loom)))]
mod tests {
    use super::*;

    /// Issue 32: two threads whose locals are gone must not share an id,
    /// nor have one a pool was made with (the pool's owner-only free list
    /// would be theirs, both at once). On targets whose thread-locals of
    /// this kind are never destroyed (Linux's native TLS) the fallback
    /// cannot be reached through `thread_id`, so it is called here itself.
    #[test]
    fn threads_without_their_locals_never_share_an_id() {
        let pool_made_then = id_without_locals();
        let (a, b) = (id_without_locals(), id_without_locals());
        assert_ne!(a, b, "two exiting threads");
        assert_ne!(
            a, pool_made_then,
            "an exiting thread and a pool made by one"
        );
        assert_ne!(b, pool_made_then);
        assert_ne!(thread_id(), pool_made_then, "a live thread and that pool");
    }
}
