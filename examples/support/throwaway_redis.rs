//! A throwaway `redis-server` for the examples: a private one on a free
//! loopback port, in a temporary directory, stopped on drop. Included with
//! `#[path = "support/throwaway_redis.rs"] mod throwaway_redis;`.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A private redis-server on a free loopback port, stopped on drop.
pub struct ThrowawayRedis {
    port: u16,
    child: Child,
    dir: std::path::PathBuf,
}

impl ThrowawayRedis {
    /// Starts one; `name` goes into its directory's name.
    pub fn start(name: &str) -> Result<ThrowawayRedis, Box<dyn std::error::Error>> {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let dir = std::env::temp_dir().join(format!("redwheel-{name}-{}", std::process::id()));
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

    /// Its `redis://` URL.
    pub fn url(&self) -> String {
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
