//! Criterion benches for the queue's hot paths (BENCHMARKS.md Q1, Q2 and a
//! take round trip) against a private `redis-server` on loopback (or the
//! Redis at `REDIS_URL`). The full workloads with their peers' figures are
//! in `examples/bench_queue.rs`.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use redwheel::Redwheel;

struct Server {
    child: Child,
    dir: std::path::PathBuf,
    port: u16,
}

impl Server {
    fn start() -> Server {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dir = std::env::temp_dir().join(format!("redwheel-crit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let child = Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .arg("--dir")
            .arg(&dir)
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server");
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        Server { child, dir, port }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn queue_benches(c: &mut Criterion) {
    let (url, _server) = match std::env::var("REDIS_URL") {
        Ok(url) => (url, None),
        Err(_) => {
            let s = Server::start();
            (format!("redis://127.0.0.1:{}/", s.port), Some(s))
        }
    };
    let rw = Redwheel::connect(&url).unwrap();
    let payload = "p".repeat(64);
    let mut g = c.benchmark_group("queue");

    let q = rw.queue::<String>("crit-offer").unwrap();
    g.throughput(Throughput::Elements(1));
    g.bench_function("q1_offer", |b| {
        b.iter(|| q.offer(&payload, Duration::from_secs(30)).unwrap())
    });
    q.clear().unwrap();

    let q = rw.queue::<String>("crit-batch").unwrap();
    let batch: Vec<(String, Duration)> = (0..1_000)
        .map(|i| (payload.clone(), Duration::from_millis(1_000 + i)))
        .collect();
    g.throughput(Throughput::Elements(1_000));
    g.bench_function("q2_offer_batch_1000", |b| {
        b.iter(|| q.offer_batch(&batch).unwrap())
    });
    q.clear().unwrap();

    let q = rw.queue::<String>("crit-take").unwrap();
    g.throughput(Throughput::Elements(1));
    g.bench_function("offer_due_now_then_take", |b| {
        b.iter(|| {
            q.offer(&payload, Duration::ZERO).unwrap();
            q.take().unwrap()
        })
    });
    g.finish();
    rw.shutdown(Duration::from_secs(10)).unwrap();
}

criterion_group!(benches, queue_benches);
criterion_main!(benches);
