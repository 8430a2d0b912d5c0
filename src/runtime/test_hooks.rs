//! Hooks for redwheel's own tests: faults that cannot be injected from
//! outside the process. Reached through `redwheel::test_support`, a module
//! hidden from the docs; not part of the API, and free to change in any
//! release.

use std::time::Duration;

use super::redwheel::Redwheel;

/// Shifts `rw`'s `server − local` clock estimate by `ms` (positive:
/// believe the server clock is further ahead), so that announced deadlines
/// fire early (or late) on the wheel.
pub fn skew_clock_estimate(rw: &Redwheel, ms: i64) {
    rw.runtime().server_clock.skew(ms);
}

/// Holds `rw`'s wheel thread up for `stall` with a deliberately slow wheel
/// task, and returns once that task has begun (or after 10 s). Work due
/// meanwhile must not wait for it: the driver's backstop runs it.
pub fn stall_wheel(rw: &Redwheel, stall: Duration) {
    let (tx, rx) = crossbeam_channel::bounded(1);
    let task = move || {
        let _ = tx.send(());
        std::thread::sleep(stall);
    };
    if rw
        .runtime()
        .driver
        .run_on_wheel_for_tests(Duration::from_millis(1), task)
        .is_ok()
    {
        let _ = rx.recv_timeout(Duration::from_secs(10));
    }
}
