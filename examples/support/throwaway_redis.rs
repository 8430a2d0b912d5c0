//! A throwaway `redis-server` for the examples: a private one on a free
//! loopback port, in a temporary directory, stopped (and the directory
//! removed) on drop. Included with
//! `#[path = "support/throwaway_redis.rs"] mod throwaway_redis;`.
#![allow(dead_code)] // each example uses a different part

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A private redis-server on a free loopback port, stopped on drop.
pub struct ThrowawayRedis {
    port: u16,
    child: Option<Child>,
    dir: PathBuf,
    binary: String,
    extra: Vec<String>,
}

impl ThrowawayRedis {
    /// Starts one with no persistence; `name` goes into its directory's
    /// name.
    pub fn start(name: &str) -> Result<ThrowawayRedis, Box<dyn std::error::Error>> {
        ThrowawayRedis::start_with("redis-server", name, &["--appendonly", "no"])
    }

    /// Starts `binary` with `extra` arguments (after port, bind, `--save ''`
    /// and the directory). Nothing is left behind if it does not start.
    pub fn start_with(
        binary: &str,
        name: &str,
        extra: &[&str],
    ) -> Result<ThrowawayRedis, Box<dyn std::error::Error>> {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let dir = Self::dir_for(name);
        std::fs::create_dir_all(&dir)?;
        let mut server = ThrowawayRedis {
            port,
            child: None,
            dir,
            binary: binary.to_owned(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        // On an error `server` is dropped, which removes the directory.
        server.spawn()?;
        Ok(server)
    }

    /// The directory a server named `name` uses (in this process).
    pub fn dir_for(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("redwheel-{name}-{}", std::process::id()))
    }

    fn spawn(&mut self) -> Result<(), Box<dyn std::error::Error>> {
        let child = Command::new(&self.binary)
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", ""])
            .arg("--dir")
            .arg(&self.dir)
            .args(&self.extra)
            .stdout(Stdio::null())
            .spawn()
            .map_err(|e| {
                format!(
                    "could not start {} (install redis-server, or set REDIS_URL to use another Redis): {e}",
                    self.binary
                )
            })?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                return Err(format!("redis-server exited at start: {status}").into());
            }
            if Instant::now() > deadline {
                return Err("redis-server did not start".into());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(())
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its `redis://` URL.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Kills it with SIGKILL.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port and directory; returns once it
    /// accepts connections.
    pub fn restart(&mut self) -> Result<(), Box<dyn std::error::Error>> {
        self.kill();
        self.spawn()
    }
}

impl Drop for ThrowawayRedis {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
