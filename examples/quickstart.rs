//! The redwheel demo: schedule a handful of timeouts on a hashed wheel
//! timer, cancel one, and print how late each one fired.
//!
//! Run with `cargo run --example quickstart`.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use redwheel::timer::{HashedWheelTimer, Timeout};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let timer = HashedWheelTimer::builder()
        .tick_duration(Duration::from_millis(1))
        .ticks_per_wheel(512)
        .build()?;

    let (tx, rx) = mpsc::channel();
    let delays_ms = [250u64, 50, 400, 100, 10];
    for (i, &ms) in delays_ms.iter().enumerate() {
        let tx = tx.clone();
        let scheduled = Instant::now();
        let delay = Duration::from_millis(ms);
        timer.new_timeout(delay, move |_: &Timeout| {
            let late = scheduled.elapsed().saturating_sub(delay);
            let _ = tx.send((i, ms, late));
        })?;
    }
    let cancelled = timer.new_timeout(Duration::from_millis(200), |_: &Timeout| {
        unreachable!("a cancelled timeout never runs")
    })?;
    println!("cancelled the 200 ms timeout: {}", cancelled.cancel());
    drop(tx);

    for (i, ms, late) in rx.iter().take(delays_ms.len()) {
        println!("timeout #{i} ({ms:>3} ms) fired {late:?} after its deadline");
    }
    let never_ran = timer.stop()?;
    println!("stopped; {} timeouts never ran", never_ran.len());
    Ok(())
}
