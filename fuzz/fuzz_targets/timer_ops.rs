//! Replays an arbitrary sequence of timer operations (schedule with edge
//! delays, cancel, advance a manual clock by sub-tick steps, whole wheel
//! turns or years, tasks that re-arm, cancel, panic or call `stop()`, stop
//! in the middle) against the model in `redwheel_fuzz::timer_model`, which
//! panics on the first broken invariant.
//!
//! `cargo +nightly fuzz run timer_ops`; see "Fuzzing" in the guide's
//! "Checking the timer" (`redwheel::guide::verification`).

#![no_main]

use libfuzzer_sys::fuzz_target;
use redwheel_fuzz::Case;
use redwheel_fuzz::timer_model::{Harness, silence_task_panics};

fuzz_target!(
    // libFuzzer's panic hook aborts on every panic, including the ones the
    // model's tasks raise on purpose (and the timer catches): filter those.
    init: silence_task_panics(),
    |case: Case| {
        Harness::run(case.config, &case.ops);
    }
);
