//! Benchmarks of redwheel's [`HashedWheelTimer`] on the timer workloads of
//! `shared/BENCHMARKS.md` (W1–W6, plus W5b and Idle, and M5 for the worker's
//! own costs), written to match the
//! Netty harness `shared/peers/netty/NettyTimerBench.java` line for line:
//! the same SplitMix64 delay sequences, the same nearest-rank percentiles,
//! the same metric names and the same one-JSON-line-per-workload output
//! (`"impl":"redwheel"` instead of `"netty-hwt"`).
//!
//! ```text
//! cargo run --release --example bench_timer -- [options] W1 [W2 ... Idle]
//!   --n N          timeouts for W1/W2/W3/W5/W6        (default 1000000)
//!   --n4 N         timeouts for W4                    (default 100000)
//!   --reps R       measured repetitions per workload  (default 3)
//!   --warmup W     unmeasured runs before them        (default 1; Idle has none)
//!   --tick-ms T    tick duration in ms                (default 1)
//!   --wheel B      ticks per wheel                    (default 512)
//!   --seed S       seed of the delay generator        (default 42)
//!   --threads P    producer threads for W6            (default 2)
//!   --dump FILE    W4: write "deadline_ms lateness_us" per timeout of the last repetition
//!   --idle-secs S  length of one Idle window          (default 10)
//!   --task M       shared (default) or closure: how the timeouts of
//!                  W1/W2/W3/W5/W5b/W6/M5 refer to their task (below)
//!   --impl I       redwheel (default), or another Rust timer on W1, W2
//!                  and W4: tokio-delay-queue (tokio-util's DelayQueue on
//!                  a current-thread tokio runtime, one owner) or hhwt
//!                  (hierarchical_hash_wheel_timer's TimerWithThread)
//! ```
//!
//! Every run builds a fresh timer (tick 1 ms, 512 buckets, tasks on the
//! worker thread) and starts it outside the timed region.
//!
//! The task. Netty's harness makes one task object per run and gives it to
//! every `newTimeout`, and so does `--task shared` (the default, so that the
//! figures and Netty's are the same workload): one `Arc` of the task's state
//! per run, each timeout's task a closure holding a clone of it (dropped when
//! the task runs or is cancelled), as each Netty timeout holds a reference to
//! the one task. `--task closure` (the mode of the figures published before
//! issue 32) gives each timeout a closure capturing a `&'static` to the run's
//! state, leaked: no reference is counted. W4's tasks record their own
//! timeout's firing, so they are one closure each in both harnesses and both
//! modes. W3's task captures 16 bytes in closure mode, the size the memory
//! target is stated for, and one `Arc` (8 bytes) in shared mode. "Accepted" means a barrier returned: a
//! zero-delay timeout scheduled after all the others, whose firing proves
//! (the pending queue being FIFO) that the worker has moved every earlier
//! timeout into a bucket.
//!
//! Profiling: run under `perf record -D -1 --control=fifo:CTL[,ACK] ...` with
//! `BENCH_PERF_CTL=CTL` (and `BENCH_PERF_ACK=ACK`) in the environment, and
//! recording is switched on only around the timed regions (W1/W2/W6: the
//! schedule loop and the barrier; W4/W5: schedule loop to last expiry).
//! Instruction counts: `valgrind --tool=callgrind
//! --toggle-collect='*schedule_loop*' bench_timer --n 200000 --reps 1
//! --warmup 0 W1` counts W1's (or W2's) producer loop only.
//!
//! W3 counts live heap bytes with the counting global allocator below; its
//! counter only runs inside W3's measurement window (the window's allocations
//! minus its frees are exactly the growth of live bytes), so that the other
//! workloads do not pay for a shared atomic on every allocation.

use std::alloc::{GlobalAlloc, Layout, System};
use std::error::Error;
use std::fmt::Write as _;
use std::io::Write as _;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use redwheel::timer::{HashedWheelTimer, ManualClock, Timeout};

#[path = "../../examples/support/splitmix.rs"]
mod splitmix;
use splitmix::delays_ms;

type BoxResult<T> = Result<T, Box<dyn Error>>;

// ---------------------------------------------------------------- allocator

/// Wraps the system allocator and, while [`COUNTING`] is set, adds up the
/// bytes allocated minus the bytes freed in [`LIVE_BYTES`].
struct CountingAlloc;

static COUNTING: AtomicBool = AtomicBool::new(false);
static LIVE_BYTES: AtomicI64 = AtomicI64::new(0);

fn count(delta: i64) {
    if COUNTING.load(Ordering::Relaxed) {
        LIVE_BYTES.fetch_add(delta, Ordering::Relaxed);
    }
}

// SAFETY: every method forwards its arguments unchanged to `System`, which
// implements `GlobalAlloc` correctly; the counting only reads the layout and
// the returned pointer's nullness.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: our caller upholds `GlobalAlloc::alloc`'s contract
        // (non-zero size), which is all `System.alloc` requires.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            count(layout.size() as i64);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same contract as `alloc`, forwarded unchanged.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            count(layout.size() as i64);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by this allocator, i.e. by `System`,
        // with `layout`, as our caller guarantees.
        unsafe { System.dealloc(ptr, layout) };
        count(-(layout.size() as i64));
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr`/`layout` come from this allocator (so from `System`)
        // and `new_size` is valid for `layout`'s alignment, as our caller
        // guarantees.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            count(new_size as i64 - layout.size() as i64);
        }
        p
    }
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

// ---------------------------------------------------------------- config

#[derive(Clone, Debug)]
struct Config {
    n: usize,
    n4: usize,
    reps: usize,
    warmup: usize,
    tick_ms: u64,
    wheel: usize,
    seed: u64,
    threads: usize,
    dump: Option<String>,
    idle_secs: f64,
    imp: String,
    /// Run W3 here and now (in the cold child process `w3_cold` starts).
    cold: bool,
    task: TaskMode,
}

/// How each timeout's task refers to its run's task state (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TaskMode {
    /// One `Arc` per run, a clone in each timeout's task (Netty's shared task).
    Shared,
    /// A closure per timeout capturing a `&'static` to the run's state.
    Closure,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            n: 1_000_000,
            n4: 100_000,
            reps: 3,
            warmup: 1,
            tick_ms: 1,
            wheel: 512,
            seed: 42,
            threads: 2,
            dump: None,
            idle_secs: 10.0,
            imp: "redwheel".to_owned(),
            cold: false,
            task: TaskMode::Shared,
        }
    }
}

const WORKLOADS: [&str; 9] = ["W1", "W2", "W3", "W4", "W5", "W5b", "W6", "Idle", "M5"];

fn parse_args() -> BoxResult<(Config, Vec<String>)> {
    let mut cfg = Config::default();
    let mut ws = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = |name: &str| -> BoxResult<String> {
            args.next()
                .ok_or_else(|| format!("{name} needs a value").into())
        };
        match a.as_str() {
            "--n" => cfg.n = value(&a)?.parse()?,
            "--n4" => cfg.n4 = value(&a)?.parse()?,
            "--reps" => cfg.reps = value(&a)?.parse()?,
            "--warmup" => cfg.warmup = value(&a)?.parse()?,
            "--tick-ms" => cfg.tick_ms = value(&a)?.parse()?,
            "--wheel" => cfg.wheel = value(&a)?.parse()?,
            // Java parses a signed long; keep its bits.
            "--seed" => cfg.seed = value(&a)?.parse::<i64>()? as u64,
            "--threads" => cfg.threads = value(&a)?.parse()?,
            "--dump" => cfg.dump = Some(value(&a)?),
            "--idle-secs" => cfg.idle_secs = value(&a)?.parse()?,
            "--cold" => cfg.cold = true,
            "--impl" => cfg.imp = value(&a)?,
            "--task" => {
                cfg.task = match value(&a)?.as_str() {
                    "shared" => TaskMode::Shared,
                    "closure" => TaskMode::Closure,
                    other => return Err(format!("unknown --task {other:?}").into()),
                }
            }
            "-h" | "--help" => {
                println!("usage: bench_timer [options] {}", WORKLOADS.join(" "));
                std::process::exit(0);
            }
            w if WORKLOADS.contains(&w) => ws.push(w.to_owned()),
            other => return Err(format!("unknown argument or workload {other:?}").into()),
        }
    }
    if cfg.reps == 0 || cfg.n == 0 || cfg.n4 == 0 || cfg.threads == 0 {
        return Err("--reps, --n, --n4 and --threads must be positive".into());
    }
    let peer_workloads = ["W1", "W2", "W4"];
    match cfg.imp.as_str() {
        "redwheel" => {}
        "tokio-delay-queue" | "hhwt" => {
            if let Some(w) = ws.iter().find(|w| !peer_workloads.contains(&w.as_str())) {
                return Err(format!("--impl {} runs W1, W2 and W4 only, not {w}", cfg.imp).into());
            }
        }
        other => return Err(format!("unknown --impl {other:?}").into()),
    }
    Ok((cfg, ws))
}

// ---------------------------------------------------------------- helpers

fn new_timer(cfg: &Config) -> BoxResult<HashedWheelTimer> {
    let timer = HashedWheelTimer::builder()
        .tick_duration(Duration::from_millis(cfg.tick_ms))
        .ticks_per_wheel(cfg.wheel)
        .thread_name("hwt-worker")
        .build()?;
    timer.start()?; // start the worker outside of any timed region
    Ok(timer)
}

/// Schedules a zero-delay sentinel and waits for it: the pending queue is
/// FIFO, so once it fires every earlier timeout has been put into a bucket.
fn barrier(timer: &HashedWheelTimer) -> BoxResult<()> {
    let (tx, rx) = mpsc::channel();
    timer.new_timeout(Duration::ZERO, move |_: &Timeout| {
        let _ = tx.send(());
    })?;
    rx.recv()?;
    Ok(())
}

/// A fresh counter for one run's shared no-op task.
fn leak_counter() -> &'static AtomicU64 {
    Box::leak(Box::new(AtomicU64::new(0)))
}

/// The no-op task's body. Only the worker thread runs tasks, so a plain
/// load + store counts exactly, like the Java harness's `count++`.
#[inline]
fn bump(counter: &AtomicU64) {
    counter.store(counter.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
}

/// How a timeout's task reaches its run's task state `S`: an `Arc` clone
/// (`TaskMode::Shared`) or a `&'static` (`TaskMode::Closure`).
trait TaskRef<S>: Clone + Send + 'static {
    fn state(&self) -> &S;
}

impl<S: Send + Sync + 'static> TaskRef<S> for Arc<S> {
    #[inline(always)]
    fn state(&self) -> &S {
        self
    }
}

impl<S: Sync + 'static> TaskRef<S> for &'static S {
    #[inline(always)]
    fn state(&self) -> &S {
        self
    }
}

/// The task of one timeout: runs `body` (a function item, so the closure
/// holds the reference alone) on the state `r` refers to.
#[inline(always)]
fn task_of<S: 'static, R: TaskRef<S>, B: Fn(&S) + Copy + Send + 'static>(
    r: &R,
    body: B,
) -> impl FnOnce(&Timeout) + Send + 'static {
    let r = r.clone();
    move |_: &Timeout| body(r.state())
}

/// Calls `f` with a reference of `mode`'s kind to `state` (an `Arc`, or the
/// state leaked). Each workload is generic over the kind, so that each mode
/// runs its own monomorphic loop.
macro_rules! with_task_ref {
    ($mode:expr, $state:expr, |$r:ident| $body:expr) => {
        match $mode {
            TaskMode::Shared => {
                let $r = Arc::new($state);
                $body
            }
            TaskMode::Closure => {
                let $r: &'static _ = Box::leak(Box::new($state));
                $body
            }
        }
    };
}

/// W3's task in closure mode: a no-op closure capturing 16 bytes (the
/// counter and a tag).
fn w3_task(counter: &'static AtomicU64, tag: u64) -> impl FnOnce(&Timeout) + Send + 'static {
    move |_: &Timeout| {
        std::hint::black_box(tag);
        bump(counter);
    }
}

/// Nearest-rank percentile index: `ceil(p·n) − 1`, clamped.
fn rank(n: usize, p: f64) -> usize {
    let r = (p * n as f64).ceil() as i64 - 1;
    r.clamp(0, n as i64 - 1) as usize
}

fn nanos_since(base: Instant) -> u64 {
    base.elapsed().as_nanos() as u64
}

/// Resident set size in bytes, from `/proc/self/statm` (pages) times the page
/// size the kernel passed in the auxiliary vector.
fn rss_bytes() -> u64 {
    let pages = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .unwrap_or(0);
    pages * page_size()
}

fn page_size() -> u64 {
    const AT_PAGESZ: u64 = 6;
    if let Ok(aux) = std::fs::read("/proc/self/auxv") {
        for pair in aux.chunks_exact(16) {
            let key = u64::from_ne_bytes(pair[..8].try_into().unwrap_or([0; 8]));
            let val = u64::from_ne_bytes(pair[8..].try_into().unwrap_or([0; 8]));
            if key == AT_PAGESZ {
                return val;
            }
        }
    }
    4096
}

/// CPU time (user + system) the process has used, in seconds, from
/// `/proc/self/stat` (fields 14 and 15, in `USER_HZ` = 100 ticks per second).
fn process_cpu_secs() -> BoxResult<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    let rest = &stat[stat.rfind(')').ok_or("malformed /proc/self/stat")? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state): utime is field 14, stime field 15.
    let utime: u64 = f.get(11).ok_or("no utime")?.parse()?;
    let stime: u64 = f.get(12).ok_or("no stime")?.parse()?;
    Ok((utime + stime) as f64 / 100.0)
}

/// On-CPU nanoseconds of all the process's threads, from
/// `/proc/self/task/*/schedstat` (finer than `/proc/self/stat`'s 10 ms
/// ticks); `None` where the kernel does not provide it.
fn schedstat_cpu_ns() -> Option<u64> {
    let mut total = 0;
    for entry in std::fs::read_dir("/proc/self/task").ok()? {
        let path = entry.ok()?.path().join("schedstat");
        let s = std::fs::read_to_string(path).ok()?;
        total += s.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(total)
}

/// Sends `cmd` ("enable" / "disable") to perf's control fifo, if
/// `BENCH_PERF_CTL` names one, and waits for perf's ack if `BENCH_PERF_ACK`
/// names the ack fifo. A no-op otherwise.
fn perf_ctl(cmd: &str) {
    let Some(ctl) = std::env::var_os("BENCH_PERF_CTL") else {
        return;
    };
    if let Ok(mut f) = std::fs::OpenOptions::new().write(true).open(ctl) {
        let _ = f.write_all(format!("{cmd}\n").as_bytes());
    }
    if let Some(ack) = std::env::var_os("BENCH_PERF_ACK")
        && let Ok(mut f) = std::fs::File::open(ack)
    {
        let mut buf = [0u8; 5];
        let _ = std::io::Read::read_exact(&mut f, &mut buf);
    }
}

type Metrics = Vec<(&'static str, f64)>;

// ---------------------------------------------------------------- workloads

fn w1(cfg: &Config, d: &[u64]) -> BoxResult<Metrics> {
    let run = schedule_all(cfg, d, false)?;
    Ok(vec![
        ("ns_per_schedule", run.loop_ns),
        ("ns_per_schedule_until_accepted", run.accepted_ns),
        ("pending_after", run.pending),
        ("fired_during_run", run.fired),
    ])
}

fn w2(cfg: &Config, d: &[u64]) -> BoxResult<Metrics> {
    let run = schedule_all(cfg, d, true)?;
    Ok(vec![
        ("ns_per_schedule_cancel", run.loop_ns),
        ("ns_per_pair_until_accepted", run.accepted_ns),
        ("pending_after", run.pending),
        ("fired_during_run", run.fired),
    ])
}

/// What W1 and W2 measure.
struct ScheduleRun {
    /// The timed loop, per timeout.
    loop_ns: f64,
    /// Until the worker has taken every timeout in, per timeout.
    accepted_ns: f64,
    pending: f64,
    fired: f64,
}

/// W1 and W2: schedules a timeout per delay (W2 cancels each at once), then
/// waits until the worker has taken them all in.
fn schedule_all(cfg: &Config, d: &[u64], cancel: bool) -> BoxResult<ScheduleRun> {
    with_task_ref!(cfg.task, AtomicU64::new(0), |r| schedule_all_with(
        cfg, d, cancel, r
    ))
}

fn schedule_all_with<R: TaskRef<AtomicU64>>(
    cfg: &Config,
    d: &[u64],
    cancel: bool,
    task: R,
) -> BoxResult<ScheduleRun> {
    let timer = new_timer(cfg)?;
    let counter = task.state();
    let n = d.len() as f64;
    perf_ctl("enable");
    let t0 = Instant::now();
    schedule_loop(&timer, d, cancel, &task)?;
    let t1 = Instant::now();
    barrier(&timer)?;
    let t2 = Instant::now();
    perf_ctl("disable");
    if cancel {
        thread::sleep(Duration::from_millis(5)); // one more tick of cancellation processing
    }
    let pending = timer.pending_timeouts() as f64;
    let fired = counter.load(Ordering::Relaxed) as f64;
    timer.stop()?;
    Ok(ScheduleRun {
        loop_ns: (t1 - t0).as_nanos() as f64 / n,
        accepted_ns: (t2 - t0).as_nanos() as f64 / n,
        pending,
        fired,
    })
}

/// The timed loop of W1 and W2, in a function of its own so that
/// `valgrind --tool=callgrind --toggle-collect='*schedule_loop*'` counts the
/// instructions of exactly this loop (per timeout: divide by `--n`).
#[inline(never)]
fn schedule_loop<R: TaskRef<AtomicU64>>(
    timer: &HashedWheelTimer,
    d: &[u64],
    cancel: bool,
    task: &R,
) -> BoxResult<()> {
    for &ms in d {
        let t = timer.new_timeout(Duration::from_millis(ms), task_of(task, bump))?;
        if cancel {
            t.cancel();
        }
    }
    Ok(())
}

/// The names of W3's metrics, as `w3` returns them.
const W3_METRICS: [&str; 5] = [
    "bytes_per_timeout",
    "pending_at_measure",
    "fired_during_run",
    "rss_bytes_per_timeout",
    "task_closure_bytes",
];

/// W3 in a child process of its own (this binary with `--cold`), so that it
/// starts cold: the timer keeps freed slot blocks for reuse process-wide
/// (up to 64 MiB), and a run that reused the blocks of an earlier one would
/// allocate none, and count none, for its slots. Each repetition is one
/// child, with no warm-up (memory, not speed, is measured).
fn w3_cold(cfg: &Config) -> BoxResult<Metrics> {
    let task = match cfg.task {
        TaskMode::Shared => "shared",
        TaskMode::Closure => "closure",
    };
    let out = std::process::Command::new(std::env::current_exe()?)
        .args(["--cold", "--reps", "1", "--warmup", "0", "--task", task])
        .args([
            "--n",
            &cfg.n.to_string(),
            "--seed",
            &(cfg.seed as i64).to_string(),
        ])
        .args([
            "--tick-ms",
            &cfg.tick_ms.to_string(),
            "--wheel",
            &cfg.wheel.to_string(),
        ])
        .arg("W3")
        .output()?;
    if !out.status.success() {
        return Err(format!(
            "the W3 child failed: {}",
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    let line: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    W3_METRICS
        .iter()
        .map(|&name| {
            line["metrics"][name]["runs"][0]
                .as_f64()
                .map(|v| (name, v))
                .ok_or_else(|| format!("the W3 child gave no {name}").into())
        })
        .collect()
}

fn w3(cfg: &Config, d: &[u64]) -> BoxResult<Metrics> {
    let timer = new_timer(cfg)?;
    let counter = leak_counter();
    let shared = Arc::new(AtomicU64::new(0));
    let closure_bytes = match cfg.task {
        TaskMode::Shared => std::mem::size_of_val(&task_of(&shared, bump)),
        TaskMode::Closure => std::mem::size_of_val(&w3_task(counter, 0)),
    };
    if cfg.task == TaskMode::Closure {
        assert_eq!(closure_bytes, 16, "W3's task closure must capture 16 bytes");
    }
    barrier(&timer)?;
    let n = d.len();
    let rss_before = rss_bytes();
    LIVE_BYTES.store(0, Ordering::SeqCst);
    COUNTING.store(true, Ordering::SeqCst);
    for (i, &ms) in d.iter().enumerate() {
        let delay = Duration::from_millis(ms);
        match cfg.task {
            TaskMode::Shared => timer.new_timeout(delay, task_of(&shared, bump))?,
            TaskMode::Closure => timer.new_timeout(delay, w3_task(counter, i as u64))?,
        };
    }
    barrier(&timer)?;
    let live = LIVE_BYTES.load(Ordering::SeqCst);
    COUNTING.store(false, Ordering::SeqCst);
    let rss_after = rss_bytes();
    let pending = timer.pending_timeouts();
    let fired = counter.load(Ordering::Relaxed) + shared.load(Ordering::Relaxed);
    timer.stop()?;
    Ok(vec![
        ("bytes_per_timeout", live as f64 / n as f64),
        ("pending_at_measure", pending as f64),
        ("fired_during_run", fired as f64),
        (
            "rss_bytes_per_timeout",
            (rss_after as f64 - rss_before as f64) / n as f64,
        ),
        ("task_closure_bytes", closure_bytes as f64),
    ])
}

/// What W4's tasks share: when each fired, and a countdown to "all done".
struct Lateness {
    base: Instant,
    fired: Vec<AtomicU64>,
    remaining: AtomicUsize,
    done: mpsc::Sender<()>,
}

fn w4(cfg: &Config, d: &[u64]) -> BoxResult<Metrics> {
    let timer = new_timer(cfg)?;
    let n = d.len();
    let (tx, rx) = mpsc::channel();
    let base = Instant::now();
    let st = Arc::new(Lateness {
        base,
        fired: (0..n).map(|_| AtomicU64::new(0)).collect(),
        remaining: AtomicUsize::new(n),
        done: tx,
    });
    let mut deadline = vec![0i64; n];
    perf_ctl("enable");
    let t0 = Instant::now();
    for (i, &ms) in d.iter().enumerate() {
        let s = Arc::clone(&st);
        let now = nanos_since(base) as i64;
        deadline[i] = now + ms as i64 * 1_000_000;
        timer.new_timeout(Duration::from_millis(ms), move |_: &Timeout| {
            s.fired[i].store(nanos_since(s.base), Ordering::Relaxed);
            if s.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
                let _ = s.done.send(());
            }
        })?;
    }
    let t1 = Instant::now();
    rx.recv()?;
    perf_ctl("disable");
    timer.stop()?;
    let fired: Vec<i64> = st
        .fired
        .iter()
        .map(|f| f.load(Ordering::Relaxed) as i64)
        .collect();
    let mut m = lateness_stats(&deadline, &fired, d);
    m.push(("schedule_loop_ms", (t1 - t0).as_nanos() as f64 / 1e6));
    if let Some(path) = &cfg.dump {
        // Per timeout: "deadline_ms_since_loop_start lateness_us" (last rep wins).
        let t0_ns = (t0 - base).as_nanos() as i64;
        let mut out = String::with_capacity(n * 24);
        for i in 0..n {
            let _ = writeln!(
                out,
                "{:.3} {:.3}",
                (deadline[i] - t0_ns) as f64 / 1e6,
                (fired[i] - deadline[i]) as f64 / 1e3
            );
        }
        std::fs::write(path, out)?;
    }
    Ok(m)
}

/// Lateness percentiles over all timeouts, plus the same over the "steady"
/// subset (delay >= 1000 ms), exactly as the Netty harness computes them.
fn lateness_stats(deadline: &[i64], fired: &[i64], delay_ms: &[u64]) -> Metrics {
    let n = deadline.len();
    let mut late: Vec<i64> = Vec::with_capacity(n);
    let mut steady: Vec<i64> = Vec::new();
    let mut early = 0u64;
    let mut sum = 0i64;
    for i in 0..n {
        let l = fired[i] - deadline[i];
        late.push(l);
        if l < 0 {
            early += 1;
        }
        sum += l;
        if delay_ms[i] >= 1000 {
            steady.push(l);
        }
    }
    late.sort_unstable();
    steady.sort_unstable();
    let ns = steady.len();
    let us = |v: i64| v as f64 / 1e3;
    let steady_at = |p: f64| {
        if ns == 0 {
            f64::NAN
        } else {
            us(steady[rank(ns, p)])
        }
    };
    vec![
        ("p50_us", us(late[rank(n, 0.50)])),
        ("p99_us", us(late[rank(n, 0.99)])),
        ("p999_us", us(late[rank(n, 0.999)])),
        ("max_us", us(late[n - 1])),
        ("min_us", us(late[0])),
        ("mean_us", sum as f64 / n as f64 / 1e3),
        ("early_count", early as f64),
        ("steady_count", ns as f64),
        ("steady_p50_us", steady_at(0.50)),
        ("steady_p99_us", steady_at(0.99)),
        ("steady_p999_us", steady_at(0.999)),
        (
            "steady_max_us",
            if ns == 0 {
                f64::NAN
            } else {
                us(steady[ns - 1])
            },
        ),
    ]
}

/// W5's shared task state: counts and timestamps the first and last expiry.
struct Burst {
    n: usize,
    base: Instant,
    count: AtomicUsize,
    first: AtomicU64,
    last: AtomicU64,
    done: mpsc::Sender<()>,
}

fn burst_fire(b: &Burst) {
    // Only the worker thread runs tasks: load + store counts exactly.
    let c = b.count.load(Ordering::Relaxed) + 1;
    b.count.store(c, Ordering::Relaxed);
    if c == 1 {
        b.first.store(nanos_since(b.base), Ordering::Relaxed);
    }
    if c == b.n {
        b.last.store(nanos_since(b.base), Ordering::Relaxed);
        let _ = b.done.send(());
    }
}

/// A fresh burst task state for one run, and the receiver of its "done".
fn new_burst(n: usize, base: Instant) -> (Burst, mpsc::Receiver<()>) {
    let (tx, rx) = mpsc::channel();
    let b = Burst {
        n,
        base,
        count: AtomicUsize::new(0),
        first: AtomicU64::new(0),
        last: AtomicU64::new(0),
        done: tx,
    };
    (b, rx)
}

/// W5, or W5b if `literal`: a burst of `n` timeouts due together.
fn w5(cfg: &Config, n: usize, literal: bool) -> BoxResult<Metrics> {
    let timer = new_timer(cfg)?;
    perf_ctl("enable");
    let t0 = Instant::now();
    let (burst, rx) = new_burst(n, t0);
    with_task_ref!(cfg.task, burst, |task| w5_with(
        &timer, n, t0, task, rx, literal
    ))
}

/// W5: every timeout has the same absolute deadline D = t0 + 500 ms
/// (`delay = D − now`). W5b (`literal`): every timeout gets delay 500 ms
/// relative to its own schedule call.
fn w5_with<R: TaskRef<Burst>>(
    timer: &HashedWheelTimer,
    n: usize,
    t0: Instant,
    task: R,
    rx: mpsc::Receiver<()>,
    literal: bool,
) -> BoxResult<Metrics> {
    let half_second = Duration::from_millis(500);
    let mut last_start = 0;
    if literal {
        for _ in 0..n - 1 {
            timer.new_timeout(half_second, task_of(&task, burst_fire))?;
        }
        last_start = nanos_since(t0) as i64;
        timer.new_timeout(half_second, task_of(&task, burst_fire))?;
    } else {
        let dl = t0 + half_second;
        for _ in 0..n {
            let delay = dl.saturating_duration_since(Instant::now());
            timer.new_timeout(delay, task_of(&task, burst_fire))?;
        }
    }
    let t1 = Instant::now();
    rx.recv()?;
    perf_ctl("disable");
    timer.stop()?;
    let task = task.state();
    let first = task.first.load(Ordering::Relaxed) as i64;
    let last = task.last.load(Ordering::Relaxed) as i64;
    let schedule_loop_ms = (t1 - t0).as_nanos() as f64 / 1e6;
    // The first deadline is D (W5), or t0 + 500 ms (W5b).
    let d_ns = 500_000_000i64;
    let early = if first < d_ns { 1.0 } else { 0.0 };
    if literal {
        let last_deadline = last_start + d_ns;
        return Ok(vec![
            (
                "drain_after_last_deadline_ms",
                (last - last_deadline) as f64 / 1e6,
            ),
            (
                "first_fire_after_first_deadline_ms",
                (first - d_ns) as f64 / 1e6,
            ),
            ("schedule_loop_ms", schedule_loop_ms),
            ("early_count", early),
        ]);
    }
    Ok(vec![
        ("drain_ms", (last - d_ns) as f64 / 1e6),
        ("first_fire_after_deadline_ms", (first - d_ns) as f64 / 1e6),
        ("first_to_last_ms", (last - first) as f64 / 1e6),
        ("ns_per_expiry", (last - first) as f64 / n as f64),
        ("schedule_loop_ms", schedule_loop_ms),
        ("early_count", early),
    ])
}

/// M5 (ours only, no Netty counterpart): W5's burst on a manual clock, so
/// that the worker's two costs are measured apart and free of sleeps: the
/// `advance` that moves the burst into the wheel (ns per transfer) and the
/// one that fires it (ns per expiry). Deterministic, hence also the
/// workload for callgrind: `valgrind --tool=callgrind bench_timer --n
/// 200000 --reps 1 --warmup 0 M5`, then the inclusive cost of
/// `Worker::transfer` and `Worker::expire` over `--n`.
fn m5(cfg: &Config, n: usize) -> BoxResult<Metrics> {
    let clock = ManualClock::new();
    let timer = HashedWheelTimer::builder()
        .tick_duration(Duration::from_millis(cfg.tick_ms))
        .ticks_per_wheel(cfg.wheel)
        .thread_name("hwt-worker")
        .clock(clock.clone())
        .build()?;
    timer.start()?;
    let t0 = Instant::now();
    let (burst, rx) = new_burst(n, t0);
    with_task_ref!(cfg.task, burst, |task| m5_with(
        cfg, &timer, &clock, n, task, rx
    ))
}

fn m5_with<R: TaskRef<Burst>>(
    cfg: &Config,
    timer: &HashedWheelTimer,
    clock: &ManualClock,
    n: usize,
    task: R,
    rx: mpsc::Receiver<()>,
) -> BoxResult<Metrics> {
    let tick = Duration::from_millis(cfg.tick_ms);
    let deadline = Duration::from_millis(500);
    let s0 = Instant::now();
    for _ in 0..n {
        let delay = deadline.saturating_sub(timer.now());
        timer.new_timeout(delay, task_of(&task, burst_fire))?;
    }
    let s1 = Instant::now();
    // Enough ticks for the transfer cap (100,000 per tick).
    let transfer_ticks = n.div_ceil(100_000) as u32 + 1;
    clock.advance(tick * transfer_ticks);
    let s2 = Instant::now();
    clock.advance(deadline);
    let s3 = Instant::now();
    rx.recv()?;
    let pending = timer.pending_timeouts();
    timer.stop()?;
    let per = |a: Instant, b: Instant| (b - a).as_nanos() as f64 / n as f64;
    Ok(vec![
        ("ns_per_expiry", per(s2, s3)),
        ("ns_per_transfer", per(s1, s2)),
        ("ns_per_schedule", per(s0, s1)),
        ("pending_after", pending as f64),
    ])
}

fn w6(cfg: &Config, d: &[u64]) -> BoxResult<Metrics> {
    with_task_ref!(cfg.task, AtomicU64::new(0), |r| w6_with(cfg, d, r))
}

fn w6_with<R: TaskRef<AtomicU64> + Sync>(cfg: &Config, d: &[u64], task: R) -> BoxResult<Metrics> {
    let timer = new_timer(cfg)?;
    let n = d.len();
    let threads = cfg.threads;
    let per = n / threads;
    let ready = Barrier::new(threads + 1);
    let go = Barrier::new(threads + 1);
    let (t0, t1) = thread::scope(|s| -> BoxResult<(Instant, Instant)> {
        let mut handles = Vec::with_capacity(threads);
        for k in 0..threads {
            let from = k * per;
            let to = if k == threads - 1 { n } else { from + per };
            let (timer, ready, go, task) = (&timer, &ready, &go, &task);
            let slice = &d[from..to];
            let h = thread::Builder::new()
                .name(format!("producer-{k}"))
                .spawn_scoped(s, move || {
                    ready.wait();
                    go.wait();
                    for &ms in slice {
                        timer
                            .new_timeout(Duration::from_millis(ms), task_of(task, bump))
                            .expect("new_timeout failed");
                    }
                })?;
            handles.push(h);
        }
        ready.wait();
        perf_ctl("enable");
        let t0 = Instant::now();
        go.wait();
        for h in handles {
            h.join().map_err(|_| "a producer thread panicked")?;
        }
        Ok((t0, Instant::now()))
    })?;
    barrier(&timer)?;
    let t2 = Instant::now();
    perf_ctl("disable");
    let pending = timer.pending_timeouts();
    timer.stop()?;
    Ok(vec![
        ("ns_per_schedule", (t1 - t0).as_nanos() as f64 / n as f64),
        (
            "ns_per_schedule_until_accepted",
            (t2 - t0).as_nanos() as f64 / n as f64,
        ),
        ("pending_after", pending as f64),
    ])
}

/// Idle: a started timer with nothing pending; the CPU the whole process
/// uses over the window, as a percentage of one core.
fn idle(cfg: &Config) -> BoxResult<Metrics> {
    let timer = new_timer(cfg)?;
    barrier(&timer)?; // the worker has run a tick and gone back to sleep
    thread::sleep(Duration::from_millis(50));
    let pending = timer.pending_timeouts();
    let cpu0 = process_cpu_secs()?;
    let sched0 = schedstat_cpu_ns();
    let w0 = Instant::now();
    thread::sleep(Duration::from_secs_f64(cfg.idle_secs));
    let cpu1 = process_cpu_secs()?;
    let sched1 = schedstat_cpu_ns();
    let wall = w0.elapsed().as_secs_f64();
    timer.stop()?;
    let cpu = cpu1 - cpu0;
    let sched_ms = match (sched0, sched1) {
        (Some(a), Some(b)) => b.saturating_sub(a) as f64 / 1e6,
        _ => f64::NAN,
    };
    Ok(vec![
        ("cpu_pct_of_core", cpu / wall * 100.0),
        ("cpu_s", cpu),
        ("schedstat_cpu_ms", sched_ms),
        ("wall_s", wall),
        ("pending_during", pending as f64),
    ])
}

// ---------------------------------------------------------------- driver

fn primary_of(w: &str) -> &'static str {
    match w {
        "W1" | "W6" => "ns_per_schedule",
        "W2" => "ns_per_schedule_cancel",
        "W3" => "bytes_per_timeout",
        "W4" => "p99_us",
        "W5" => "drain_ms",
        "W5b" => "drain_after_last_deadline_ms",
        "M5" => "ns_per_expiry",
        _ => "cpu_pct_of_core",
    }
}

type Run<'a> = Box<dyn Fn() -> BoxResult<Metrics> + 'a>;

fn runner<'a>(w: &str, cfg: &'a Config) -> Run<'a> {
    let seed = cfg.seed;
    if cfg.imp != "redwheel" {
        return peers::runner(w, cfg);
    }
    match w {
        "W1" => {
            let d = delays_ms(cfg.n, 1000, 60000, seed);
            Box::new(move || w1(cfg, &d))
        }
        "W2" => {
            let d = delays_ms(cfg.n, 1000, 60000, seed);
            Box::new(move || w2(cfg, &d))
        }
        "W3" if !cfg.cold => Box::new(move || w3_cold(cfg)),
        "W3" => {
            let d = delays_ms(cfg.n, 60000, 120000, seed.wrapping_add(3));
            Box::new(move || w3(cfg, &d))
        }
        "W4" => {
            let d = delays_ms(cfg.n4, 0, 2000, seed.wrapping_add(4));
            Box::new(move || w4(cfg, &d))
        }
        "W5" => Box::new(move || w5(cfg, cfg.n, false)),
        "W5b" => Box::new(move || w5(cfg, cfg.n, true)),
        "M5" => Box::new(move || m5(cfg, cfg.n)),
        "W6" => {
            let d = delays_ms(cfg.n, 1000, 60000, seed.wrapping_add(6));
            Box::new(move || w6(cfg, &d))
        }
        _ => Box::new(move || idle(cfg)),
    }
}

/// The Java harness's number format: integers bare, others with 3 decimals.
fn num(v: f64) -> String {
    if v == v.round_ties_even() && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else if v.is_nan() {
        "NaN".to_owned()
    } else {
        format!("{v:.3}")
    }
}

fn runtime() -> String {
    let rustc = std::process::Command::new("rustc")
        .arg("-V")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "rustc".to_owned());
    let profile = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    format!("{rustc} {profile}")
}

fn json(w: &str, cfg: &Config, runtime: &str, runs: &[Metrics]) -> String {
    let mut s = String::new();
    let _ = write!(s, "{{\"impl\":\"{}\"", cfg.imp);
    let version = match cfg.imp.as_str() {
        "tokio-delay-queue" => "tokio-util 0.7",
        "hhwt" => "hierarchical_hash_wheel_timer 1",
        _ => concat!("redwheel ", env!("CARGO_PKG_VERSION")),
    };
    let _ = write!(s, ",\"lib_version\":\"{version}\"");
    let _ = write!(s, ",\"runtime\":\"{runtime}\"");
    let _ = write!(s, ",\"workload\":\"{w}\"");
    let n = match w {
        "W4" => cfg.n4,
        "Idle" => 0,
        _ => cfg.n,
    };
    let _ = write!(
        s,
        ",\"params\":{{\"n\":{n},\"tick_ms\":{},\"ticks_per_wheel\":{},\"reps\":{},\"warmup\":{},\"seed\":{}",
        cfg.tick_ms,
        cfg.wheel,
        cfg.reps,
        if w == "Idle" || w == "W3" {
            0
        } else {
            cfg.warmup
        },
        cfg.seed as i64
    );
    if w == "W6" {
        let _ = write!(s, ",\"threads\":{}", cfg.threads);
    }
    if cfg.imp == "redwheel" && !matches!(w, "W4" | "Idle") {
        let mode = match cfg.task {
            TaskMode::Shared => "shared",
            TaskMode::Closure => "closure",
        };
        let _ = write!(s, ",\"task\":\"{mode}\"");
    }
    if w == "Idle" {
        let _ = write!(s, ",\"idle_s\":{}", num(cfg.idle_secs));
    }
    s.push('}');
    let _ = write!(s, ",\"primary\":\"{}\"", primary_of(w));
    s.push_str(",\"metrics\":{");
    for (k, (name, _)) in runs[0].iter().enumerate() {
        let v: Vec<f64> = runs.iter().map(|r| r[k].1).collect();
        let mut sorted = v.clone();
        sorted.sort_by(f64::total_cmp);
        let len = sorted.len();
        let median = if len % 2 == 1 {
            sorted[len / 2]
        } else {
            (sorted[len / 2 - 1] + sorted[len / 2]) / 2.0
        };
        if k > 0 {
            s.push(',');
        }
        let runs_list: Vec<String> = v.iter().map(|&x| num(x)).collect();
        let _ = write!(
            s,
            "\"{name}\":{{\"median\":{},\"min\":{},\"max\":{},\"runs\":[{}]}}",
            num(median),
            num(sorted[0]),
            num(sorted[len - 1]),
            runs_list.join(",")
        );
    }
    s.push_str("}}");
    s
}

fn main() -> BoxResult<()> {
    let (cfg, ws) = parse_args()?;
    if ws.is_empty() {
        return Err(format!("name at least one workload: {}", WORKLOADS.join(" ")).into());
    }
    let runtime = runtime();
    let stdout = std::io::stdout();
    for w in &ws {
        let run = runner(w, &cfg);
        let warmup = if w == "Idle" || w == "W3" {
            0
        } else {
            cfg.warmup
        };
        for _ in 0..warmup {
            run()?;
        }
        let mut runs = Vec::with_capacity(cfg.reps);
        for _ in 0..cfg.reps {
            runs.push(run()?);
        }
        let mut out = stdout.lock();
        writeln!(out, "{}", json(w, &cfg, &runtime, &runs))?;
        out.flush()?;
    }
    Ok(())
}

// ---------------------------------------------------------------- other Rust timers

/// W1, W2 and W4 on other Rust timers, measured exactly as ours: the same
/// delays, the same timed loops (handles dropped at once in W1, cancelled
/// at once in W2), the same lateness statistics.
mod peers {
    use std::future::poll_fn;
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
    use std::sync::{Arc, mpsc};
    use std::time::{Duration, Instant};

    use hierarchical_hash_wheel_timer::thread_timer::TimerWithThread;
    use hierarchical_hash_wheel_timer::{
        ClosureTimer, OneShotClosureState, PeriodicClosureState, Timer,
    };
    use tokio_util::time::DelayQueue;

    use super::{BoxResult, Config, Metrics, Run, bump, delays_ms, lateness_stats, leak_counter};

    type Hhwt = TimerWithThread<u64, OneShotClosureState<u64>, PeriodicClosureState<u64>>;

    pub(super) fn runner<'a>(w: &str, cfg: &'a Config) -> Run<'a> {
        let seed = cfg.seed;
        let tokio = cfg.imp == "tokio-delay-queue";
        match w {
            "W4" => {
                let d = delays_ms(cfg.n4, 0, 2000, seed.wrapping_add(4));
                if tokio {
                    Box::new(move || tokio_w4(&d))
                } else {
                    Box::new(move || hhwt_w4(&d))
                }
            }
            _ => {
                let cancel = w == "W2";
                let d = delays_ms(cfg.n, 1000, 60000, seed);
                if tokio {
                    Box::new(move || tokio_schedule(&d, cancel))
                } else {
                    Box::new(move || hhwt_schedule(&d, cancel))
                }
            }
        }
    }

    fn schedule_metrics(loop_ns: f64, cancel: bool) -> Metrics {
        let name = if cancel {
            "ns_per_schedule_cancel"
        } else {
            "ns_per_schedule"
        };
        vec![(name, loop_ns)]
    }

    fn runtime() -> BoxResult<tokio::runtime::Runtime> {
        Ok(tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()?)
    }

    /// W1/W2 on a DelayQueue (its owner inserts; a no-op value).
    fn tokio_schedule(d: &[u64], cancel: bool) -> BoxResult<Metrics> {
        let rt = runtime()?;
        let ns = rt.block_on(async {
            let mut q: DelayQueue<u64> = DelayQueue::new();
            let t0 = Instant::now();
            for (i, &ms) in d.iter().enumerate() {
                let key = q.insert(i as u64, Duration::from_millis(ms));
                if cancel {
                    std::hint::black_box(q.remove(&key));
                }
            }
            let ns = t0.elapsed().as_nanos() as f64 / d.len() as f64;
            drop(q);
            ns
        });
        Ok(schedule_metrics(ns, cancel))
    }

    /// W4 on a DelayQueue: its owner inserts back to back, then polls it;
    /// a timeout fires when the queue yields it.
    fn tokio_w4(d: &[u64]) -> BoxResult<Metrics> {
        let rt = runtime()?;
        let n = d.len();
        let base = Instant::now();
        let (deadline, fired) = rt.block_on(async {
            let mut q: DelayQueue<usize> = DelayQueue::with_capacity(n);
            let mut deadline = vec![0i64; n];
            for (i, &ms) in d.iter().enumerate() {
                deadline[i] = base.elapsed().as_nanos() as i64 + ms as i64 * 1_000_000;
                q.insert(i, Duration::from_millis(ms));
            }
            let mut fired = vec![0i64; n];
            while let Some(expired) = poll_fn(|cx| q.poll_expired(cx)).await {
                fired[expired.into_inner()] = base.elapsed().as_nanos() as i64;
            }
            (deadline, fired)
        });
        Ok(lateness_stats(&deadline, &fired, d))
    }

    fn hhwt_timer() -> BoxResult<Hhwt> {
        Ok(Hhwt::new()?)
    }

    /// W1/W2 on hierarchical_hash_wheel_timer's thread timer (a closure
    /// bumping the shared counter, as ours).
    fn hhwt_schedule(d: &[u64], cancel: bool) -> BoxResult<Metrics> {
        let timer = hhwt_timer()?;
        let mut r = timer.timer_ref();
        let counter = leak_counter();
        let t0 = Instant::now();
        for (i, &ms) in d.iter().enumerate() {
            let id = i as u64;
            r.schedule_action_once(id, Duration::from_millis(ms), move |_| bump(counter));
            if cancel {
                r.cancel(&id);
            }
        }
        let ns = t0.elapsed().as_nanos() as f64 / d.len() as f64;
        timer
            .shutdown()
            .map_err(|e| format!("hhwt shutdown: {e:?}"))?;
        Ok(schedule_metrics(ns, cancel))
    }

    fn hhwt_w4(d: &[u64]) -> BoxResult<Metrics> {
        let timer = hhwt_timer()?;
        let mut r = timer.timer_ref();
        let n = d.len();
        let base = Instant::now();
        let fired: Arc<Vec<AtomicU64>> = Arc::new((0..n).map(|_| AtomicU64::new(0)).collect());
        let remaining = Arc::new(AtomicUsize::new(n));
        let (tx, rx) = mpsc::channel();
        let mut deadline = vec![0i64; n];
        for (i, &ms) in d.iter().enumerate() {
            let (fired, remaining, tx) = (Arc::clone(&fired), Arc::clone(&remaining), tx.clone());
            deadline[i] = base.elapsed().as_nanos() as i64 + ms as i64 * 1_000_000;
            r.schedule_action_once(i as u64, Duration::from_millis(ms), move |_| {
                fired[i].store(base.elapsed().as_nanos() as u64, Ordering::Relaxed);
                if remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
                    let _ = tx.send(());
                }
            });
        }
        rx.recv()?;
        timer
            .shutdown()
            .map_err(|e| format!("hhwt shutdown: {e:?}"))?;
        let fired: Vec<i64> = fired
            .iter()
            .map(|f| f.load(Ordering::Relaxed) as i64)
            .collect();
        Ok(lateness_stats(&deadline, &fired, d))
    }
}
