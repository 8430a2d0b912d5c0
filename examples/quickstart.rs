//! The redwheel quickstart: a Redis-persisted delayed queue.
//!
//! Offers a handful of messages with different delays, consumes them as
//! they fall due, and prints how late each one arrived.
//!
//! Run with `cargo run --example quickstart`. It uses the Redis at
//! `REDIS_URL` if set; otherwise it starts a throwaway `redis-server` on a
//! free loopback port (and stops it at the end).

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use redwheel::Redwheel;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (url, _server) = match std::env::var("REDIS_URL") {
        Ok(url) => (url, None),
        Err(_) => {
            let server = ThrowawayRedis::start()?;
            (server.url(), Some(server))
        }
    };
    println!("using {url}");

    let rw = Redwheel::connect(&url)?;
    let q = rw.queue::<String>("quickstart")?;
    q.clear()?;

    let delays_ms = [400u64, 50, 800, 200, 10];
    for ms in delays_ms {
        let id = q.offer(&format!("due in {ms} ms"), Duration::from_millis(ms))?;
        println!("offered {id} ({ms:>3} ms)");
    }
    // A cancelled one is never delivered.
    let cancelled = q.offer(&"never".to_string(), Duration::from_millis(300))?;
    println!("removed {cancelled}: {}", q.remove(&cancelled)?);

    for _ in 0..delays_ms.len() {
        let m = q.take()?;
        let late = SystemTime::now()
            .duration_since(m.due())
            .unwrap_or(Duration::ZERO);
        println!(
            "took {:<16} {:<14} {:>6.2} ms after its due time",
            m.id(),
            m.payload(),
            late.as_secs_f64() * 1e3
        );
    }
    match q.poll(Duration::from_millis(100))? {
        None => println!("nothing else is due"),
        Some(m) => println!("unexpected: {}", m.payload()),
    }
    rw.shutdown(Duration::from_secs(5))?;
    Ok(())
}

/// A private redis-server on a free loopback port, stopped on drop.
struct ThrowawayRedis {
    port: u16,
    child: Child,
    dir: std::path::PathBuf,
}

impl ThrowawayRedis {
    fn start() -> Result<ThrowawayRedis, Box<dyn std::error::Error>> {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let dir = std::env::temp_dir().join(format!("redwheel-quickstart-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&dir)
            .stdout(Stdio::null())
            .spawn()
            .map_err(|e| {
                format!("could not start redis-server (set REDIS_URL to use another Redis): {e}")
            })?;
        let server = ThrowawayRedis { port, child, dir };
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > deadline {
                return Err("redis-server did not start".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(server)
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }
}

impl Drop for ThrowawayRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
